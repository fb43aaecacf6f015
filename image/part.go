package image

// A process's part of an image being written: what a restore of that one
// process needs, sealed as soon as its buffers are stored, before the image
// itself is committed.
//
// One CRIU dump writes the GPU memory of every process of a tree into one
// image, committed when the whole dump has succeeded. In between, each
// process has given up its GPU memory (the driver's checkpoint requires it),
// which then lives only in the helper and in the image's chunk files. Should
// the helper die then, a new helper gives such a process its memory back from
// its part (DIR/gpucr/parts/PID.pb), instead of losing it for want of a
// committed manifest. A part is a manifest of the image's id holding only that
// process and its buffers; commit (the whole image supersedes them) and abort
// remove the parts.

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

const partsName = "parts"

func partName(pid int) string { return strconv.Itoa(pid) + ".pb" }

// parts are the parts a Writer sealed: removed (only those files, never
// one put there since) at commit and abort.
type parts struct {
	dir     *fsDir // DIR/gpucr/parts, open once the first part is sealed
	created bool   // this write made dir: removed with its last part
	written map[string]fileID
}

// SealProcess writes the part of process pid: its buffers, every one closed
// and written with WriteChunk (which stores each chunk before it returns, so
// a closed buffer's chunks are all on disk), and the process itself. It may
// be called once pid's buffers are written, while other processes are still
// to come.
func (w *Writer) SealProcess(pid int) error {
	w.mu.RLock()
	if w.state != stateOpen {
		err := w.stateErrLocked()
		w.mu.RUnlock()
		return err
	}
	m := w.header()
	var st WriteStats
	for _, b := range w.buffers {
		if b.info.Pid != pid {
			continue
		}
		if !b.closed || b.mode.Load() != modeChunks {
			w.mu.RUnlock()
			return fmt.Errorf("image %s: part of pid %d: buffer %d (0x%x) is not closed, or not written with WriteChunk",
				w.dir, pid, b.index, b.info.Address)
		}
		m.Buffers = append(m.Buffers, w.bufferPB(b, &st))
		st.Buffers++
	}
	rec, listed := w.procs[pid]
	w.mu.RUnlock()
	ns := rec.ns
	if !listed && len(m.Buffers) > 0 {
		ns = int(m.Buffers[0].GetNsPid())
	}
	m.Processes = []*imagepb.Process{{Pid: int64(pid), NsPid: int64(ns), Gpus: rec.gpus, Imports: importsPB(rec.imports),
		StartTime: rec.start, Served: rec.served}}
	m.Stats = statsToPB(st)
	data, err := encodeManifest(m)
	if err != nil {
		return err
	}
	w.partsMu.Lock()
	defer w.partsMu.Unlock()
	if w.parts.dir == nil {
		d, created, err := w.g.mkdir(partsName, w.opts.Owner)
		if err != nil {
			return fmt.Errorf("image %s: part of pid %d: %w", w.dir, pid, err)
		}
		w.parts.dir, w.parts.created, w.parts.written = d, created, map[string]fileID{}
	}
	id, renamed, err := writeFileAtomicID(w.parts.dir, partName(pid), data, w.opts.Owner)
	if renamed {
		w.parts.written[partName(pid)] = id
	}
	if err != nil {
		return fmt.Errorf("image %s: part of pid %d: %w", w.dir, pid, err)
	}
	return nil
}

// removeParts removes the parts this write sealed, and the parts directory
// if this write made it (should anything else be in it, it stays).
func (w *Writer) removeParts() {
	w.partsMu.Lock()
	defer w.partsMu.Unlock()
	if w.parts.dir == nil {
		return
	}
	for name, id := range w.parts.written {
		_ = w.parts.dir.removeOwn(name, id)
	}
	w.parts.dir.close()
	if w.parts.created {
		_ = unix.Unlinkat(w.g.fd(), partsName, unix.AT_REMOVEDIR)
	}
	w.parts = parts{}
}

// OpenProcessPart opens the part of process pid that a write into dir sealed
// and has not committed (nor aborted) yet. Its chunks are read as an
// image's; what it holds is checked like a manifest. Like Open, it follows
// symlinks on the path to dir and none beneath it. own, if set, must own
// the image and its chain (ErrOwner).
func OpenProcessPart(dir string, pid int, own *Owner) (*Image, error) {
	rel := partsName + "/" + partName(pid)
	real, err := realDir(dir)
	if err != nil {
		return nil, &ManifestError{File: dir, Err: err}
	}
	top, err := openDirPath(real)
	if err != nil {
		return nil, &ManifestError{File: real, Err: err}
	}
	g, err := openSubDir(top, own)
	top.close()
	if err != nil {
		return nil, err
	}
	m, err := loadManifestFile(g, rel, own)
	if err != nil {
		g.close()
		if errors.Is(err, fs.ErrNotExist) {
			err = &ManifestError{File: g.join(rel), Err: fmt.Errorf("no part of pid %d: %w", pid, fs.ErrNotExist)}
		}
		return nil, err
	}
	if ps := m.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != int64(pid) {
		g.close()
		return nil, &ManifestError{File: g.join(rel), Err: corruptf("a part of pid %d that is not that process's alone", pid)}
	}
	return imageFrom(real, g, dir, m, ReadOptions{Owner: own}, own)
}

// RemoveProcessPart removes the part of process pid that a write into dir
// sealed, if it is still the part of the image id (another write's is
// left), and parts/ with it if that leaves it empty. A new helper that gave
// the process its memory back from it calls it: nobody waits for it any
// more, and an unfinished image whose parts are gone is one gc removes.
// Everything is reached beneath dir, no symlink followed; own, if set,
// must own it.
func RemoveProcessPart(dir string, pid int, id []byte, own *Owner) error {
	real, err := realDir(dir)
	if err != nil {
		return err
	}
	top, err := openDirPath(real)
	if err != nil {
		return err
	}
	defer top.close()
	g, err := openSubDir(top, own)
	if err != nil {
		return err
	}
	defer g.close()
	pd, err := g.openDir(partsName, own)
	if err != nil {
		return err
	}
	defer pd.close()
	name := partName(pid)
	f, err := pd.openFile(name, unix.O_RDONLY, own)
	if err != nil {
		return err
	}
	fid, err := idOf(f)
	f.Close()
	if err != nil {
		return err
	}
	m, err := loadManifestFile(pd, name, own)
	if err != nil {
		return err
	}
	if string(m.GetImageId()) != string(id) {
		return fmt.Errorf("%s: the part of another image", pd.join(name))
	}
	if err := pd.removeOwn(name, fid); err != nil {
		return err
	}
	_ = unix.Unlinkat(g.fd(), partsName, unix.AT_REMOVEDIR) // only if empty
	return g.sync()
}

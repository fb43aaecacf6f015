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
	"os"
	"path/filepath"
	"strconv"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

const partsName = "parts"

func partsDir(dir string) string { return filepath.Join(dir, SubDir, partsName) }
func partPath(dir string, pid int) string {
	return filepath.Join(partsDir(dir), strconv.Itoa(pid)+".pb")
}

func removeParts(dir string) { _ = os.RemoveAll(partsDir(dir)) }

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
	ns, listed := w.procs[pid]
	w.mu.RUnlock()
	if !listed && len(m.Buffers) > 0 {
		ns = int(m.Buffers[0].GetNsPid())
	}
	m.Processes = []*imagepb.Process{{Pid: int64(pid), NsPid: int64(ns)}}
	m.Stats = statsToPB(st)
	data, err := encodeManifest(m)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(partsDir(w.dir), 0o700); err != nil {
		return fmt.Errorf("image %s: part of pid %d: %w", w.dir, pid, err)
	}
	if _, err := writeFileAtomic(partPath(w.dir, pid), data); err != nil {
		return fmt.Errorf("image %s: part of pid %d: %w", w.dir, pid, err)
	}
	return nil
}

// OpenProcessPart opens the part of process pid that a write into dir sealed
// and has not committed (nor aborted) yet. Its chunks are read as an
// image's; what it holds is checked like a manifest.
func OpenProcessPart(dir string, pid int) (*Image, error) {
	real, err := realDir(dir)
	if err != nil {
		return nil, &ManifestError{File: partPath(dir, pid), Err: err}
	}
	path := partPath(real, pid)
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("no part of pid %d: %w", pid, fs.ErrNotExist)
		}
		return nil, &ManifestError{File: path, Err: err}
	}
	m, err := decodeManifest(data)
	if err != nil {
		return nil, &ManifestError{File: path, Err: err}
	}
	if ps := m.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != int64(pid) {
		return nil, &ManifestError{File: path, Err: corruptf("a part of pid %d that is not that process's alone", pid)}
	}
	return newImage(dir, real, m, ReadOptions{})
}

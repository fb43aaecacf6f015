package image

// Salvage: the chunk files of a write that is dropped although each of them
// is sound, kept for the write that follows into the same directory.
//
// A concurrent checkpoint whose copy-on-write window found memory changed
// behind its back makes no image (it would not be one moment of the
// process), and is taken again at once with the process stopped. Every
// chunk that window did save holds exactly the bytes its name (their hash)
// says. The write that is dropped keeps those files (AbortSalvage), and
// the next write into the same directory reuses them where the memory
// still hashes the same (Options.Salvage): the checkpoint taken again
// copies only what changed. The files it does not reuse are removed when
// it commits or aborts; a salvage no write takes is removed by Discard.

import (
	"encoding/hex"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// Salvage is the chunk files a dropped write left for the next write into
// its directory. Hand it to exactly one Create (which takes it over), or
// Discard it.
type Salvage struct {
	top    fileID // DIR
	chunks *fsDir // DIR/gpucr/chunks, open
	uid    int    // the files' owner: Options.Owner's UID, -1 without one
	files  map[chunkHash]salvaged
	bytes  int64
}

type salvaged struct {
	meta  storedChunk
	id    fileID
	ctime unix.Timespec // with id: the very file (an inode number is reused once a file is removed)
}

// Dir is the identity of the image directory DIR the salvage is of (its
// device and inode), for a caller that keeps salvages by directory.
func (s *Salvage) Dir() (dev, ino uint64) { return s.top.dev, s.top.ino }

// Chunks is how many chunk files the salvage holds, and Bytes their size.
func (s *Salvage) Chunks() int  { return len(s.files) }
func (s *Salvage) Bytes() int64 { return s.bytes }

// Discard removes the salvage's files (those still the files it kept).
func (s *Salvage) Discard() error {
	if s == nil || s.chunks == nil {
		return nil
	}
	defer s.close()
	var errs []error
	for h, f := range s.files {
		sub, err := s.chunks.openDir(hex.EncodeToString(h[:1]), nil)
		if err != nil {
			if !errors.Is(err, unix.ENOENT) {
				errs = append(errs, err)
			}
			continue
		}
		if err := sub.removeOwn(h.String(), f.id); err != nil {
			errs = append(errs, err)
		}
		sub.close()
	}
	return errors.Join(errs...)
}

func (s *Salvage) close() {
	s.chunks.close()
	s.chunks = nil
	s.files = nil
}

// AbortSalvage drops the write as Abort does, except that the chunk files
// it wrote stay, returned as a Salvage for the next write into DIR. Only a
// write that has not failed can be salvaged (a failed write's files may be
// short: a full disk); one that has is aborted, and the salvage is nil.
// Every chunk written must have been complete, as for Commit: the caller
// has stopped writing.
func (w *Writer) AbortSalvage() (*Salvage, error) {
	w.mu.Lock()
	if w.state != stateOpen {
		w.mu.Unlock()
		return nil, w.Abort()
	}
	w.state = stateAborted
	w.mu.Unlock()
	w.budget.fail(errAborted)
	w.closeJobs()
	defer w.release()
	w.mu.RLock()
	ferr := w.err // a worker's failure (the state says aborted already)
	w.mu.RUnlock()
	if ferr != nil {
		return nil, w.cleanup()
	}
	sv := &Salvage{uid: -1, files: map[chunkHash]salvaged{}}
	if w.opts.Owner != nil {
		sv.uid = w.opts.Owner.UID
	}
	var err error
	if sv.top, err = idOf(w.top.f); err == nil {
		sv.chunks, err = w.g.openDir(chunksName, w.opts.Owner)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("image %s: keep the chunks written: %w", w.dir, err), w.cleanup())
	}
	// A file this write created is kept if it is indexed (a local chunk)
	// and still the very file made.
	s := w.store
	s.mu.Lock()
	for _, c := range s.created {
		h, ok := parseHashName(c.name)
		lc := s.local[h]
		st, err := c.dir.lstat(c.name)
		if !ok || lc == nil || lc.meta.loc != imagepb.Location_LOCATION_LOCAL || err != nil ||
			(fileID{uint64(st.Dev), st.Ino}) != c.id {
			_ = c.dir.removeOwn(c.name, c.id) // not indexed (none should be), or gone already
			continue
		}
		sv.files[h] = salvaged{meta: lc.meta, id: c.id, ctime: st.Ctim}
		sv.bytes += int64(lc.meta.storedSize)
	}
	s.created = nil
	s.mu.Unlock()
	w.removeParts()
	return sv, nil
}

// adopt takes sv over for the write s is the store of: each file that is
// still the one kept (same file, size and owner) may be reused, and is
// this write's own from now on (its abort removes it; its commit removes
// those it did not use). A salvage of another directory is discarded.
func (s *chunkStore) adopt(sv *Salvage) error {
	if sv == nil || sv.chunks == nil {
		return nil
	}
	mine, err := idOf(s.chunks.f)
	if err != nil {
		return errors.Join(err, sv.Discard())
	}
	theirs, err := idOf(sv.chunks.f)
	uid := -1
	if s.own != nil {
		uid = s.own.UID
	}
	if err != nil || mine != theirs || uid != sv.uid {
		return errors.Join(err, sv.Discard())
	}
	defer sv.close()
	s.salvage = map[chunkHash]storedChunk{}
	for h, f := range sv.files {
		sub, err := s.subdir(h)
		if err != nil {
			return err
		}
		name := h.String()
		st, err := sub.lstat(name)
		if err != nil || (fileID{uint64(st.Dev), st.Ino}) != f.id || st.Ctim != f.ctime || st.Mode&unix.S_IFMT != unix.S_IFREG ||
			st.Size != int64(f.meta.storedSize) || (uid >= 0 && int(st.Uid) != uid) {
			continue // gone or replaced since: not ours any more
		}
		s.salvage[h] = f.meta
		s.mu.Lock()
		s.created = append(s.created, ownFile{dir: sub, name: name, id: f.id})
		s.touched[h[0]] = true // never synced: its directory entry is at Commit
		s.mu.Unlock()
	}
	return nil
}

// removeUnusedSalvage removes, after Commit, the adopted files the image
// did not use.
func (s *chunkStore) removeUnusedSalvage() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, c := range s.created {
		h, ok := parseHashName(c.name)
		if !ok {
			continue
		}
		if _, adopted := s.salvage[h]; !adopted {
			continue
		}
		if lc, used := s.local[h]; used && lc.meta.loc == imagepb.Location_LOCATION_LOCAL {
			continue
		}
		if err := c.dir.removeOwn(c.name, c.id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

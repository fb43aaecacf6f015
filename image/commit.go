package image

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// Commit waits for every chunk, makes all files and directories durable and
// renames the manifest into place, last. Only then is the image visible; a
// crash at any earlier point leaves DIR showing the image it held before.
// Once it is, the chunk files of the image it replaced (and of writes that
// died) that the new one does not name are removed.
// Every buffer must be closed. If Commit fails, the write is dropped as by
// Abort and the previous image stays.
func (w *Writer) Commit() error {
	w.mu.Lock()
	if w.state != stateOpen {
		err, failed := w.stateErrLocked(), w.state == stateFailed
		w.mu.Unlock()
		if failed {
			w.abortAfter()
		}
		return err
	}
	for _, b := range w.buffers {
		if !b.closed {
			w.mu.Unlock()
			_, written := b.complete()
			w.fail(fmt.Errorf("image %s: buffer %d (0x%x): %w: not closed (%d of %d bytes written)",
				w.dir, b.index, b.info.Address, ErrIncomplete, written, b.info.Size))
			w.abortAfter()
			return w.failedErr()
		}
	}
	w.mu.Unlock()

	w.closeJobs()
	if err := w.failed(); err != nil {
		w.abortAfter()
		return err
	}
	m := w.manifest()
	renamed := false
	err := w.store.sync(w.top)
	if err == nil {
		renamed, err = storeManifest(w.g, m, w.opts.Owner)
	}
	if err != nil && !renamed {
		w.fail(fmt.Errorf("image %s: commit: %w", w.dir, err))
		w.abortAfter()
		return w.failedErr()
	}
	// Renamed: the new image is the visible one, and its chunk files stay
	// even if the last directory fsync failed (then said in err). The
	// processes' parts are superseded by it.
	w.removeParts()
	// Salvaged files the image did not use (the chunks changed since) are
	// no image's: gc would find them otherwise.
	_ = w.store.removeUnusedSalvage()
	if w.store.replaces && err == nil {
		// The image DIR held before is gone with its manifest: the chunk
		// files of it the new one does not use are nobody's (and so are
		// those of writes that died). Only once the new manifest is known
		// to be durable: until then, the old one may come back.
		_ = w.store.sweepUnnamed(m)
	}
	w.mu.Lock()
	w.state = stateCommitted
	w.mu.Unlock()
	w.release()
	if err != nil {
		return fmt.Errorf("image %s: committed, but not known to be durable: %w", w.dir, err)
	}
	return nil
}

func (w *Writer) failedErr() error {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.err
}

// abortAfter drops a write that failed; the error to report is the failure,
// so a cleanup error is only added to it.
func (w *Writer) abortAfter() {
	w.mu.Lock()
	if w.state == stateAborted || w.state == stateCommitted {
		w.mu.Unlock()
		return
	}
	w.state = stateAborted
	w.mu.Unlock()
	w.closeJobs()
	if err := w.cleanup(); err != nil {
		w.mu.Lock()
		w.err = fmt.Errorf("%w (and %v)", w.err, err)
		w.mu.Unlock()
	}
	w.release()
}

// header is the manifest without buffers and processes.
func (w *Writer) header() *imagepb.Manifest {
	t := w.origin.Time
	if t.IsZero() {
		t = time.Now()
	}
	origin := w.origin
	origin.Time = t
	return &imagepb.Manifest{
		FormatVersion: FormatVersion,
		ImageId:       w.id,
		Origin:        originToPB(origin),
		ChunkSize:     uint32(w.opts.ChunkSize),
		Compression:   imagepb.Compression(w.opts.Compression),
		Parent:        w.parent,
	}
}

// bufferPB is b's manifest entry; its chunks are all stored.
func (w *Writer) bufferPB(b *BufferWriter, st *WriteStats) *imagepb.Buffer {
	pb := &imagepb.Buffer{Pid: int64(b.info.Pid), NsPid: int64(b.info.NsPid), Device: int32(b.info.Device), GpuUuid: b.info.GPUUUID,
		Address: b.info.Address, Size: b.info.Size, Kind: imagepb.AllocKind(b.info.Kind), AllocFlags: uint32(b.info.Flags),
		TouchRank: b.info.TouchRank,
		Chunks:    make([]*imagepb.Chunk, len(b.chunks))}
	for i := range b.chunks {
		pb.Chunks[i] = chunkPB(&b.chunks[i], chunkLen(b.info.Size, uint32(w.opts.ChunkSize), i))
		countChunk(st, &b.chunks[i])
	}
	return pb
}

// manifest builds the manifest from the chunk records; all workers are done.
func (w *Writer) manifest() *imagepb.Manifest {
	m := w.header()
	var st WriteStats
	st.Buffers = len(w.buffers)
	st.BytesIn = w.bytesIn.Load()
	st.BytesStored = w.store.stored.Load()
	for _, b := range w.buffers {
		m.Buffers = append(m.Buffers, w.bufferPB(b, &st))
	}
	procs := maps.Clone(w.procs)
	if procs == nil {
		procs = map[int]procRec{}
	}
	for _, b := range w.buffers {
		if r := procs[b.info.Pid]; b.info.Pid > 0 && r.ns == 0 { // pid 0: unknown (tests, tools)
			r.ns = b.info.NsPid
			procs[b.info.Pid] = r
		}
	}
	for _, pid := range slices.Sorted(maps.Keys(procs)) {
		m.Processes = append(m.Processes, &imagepb.Process{Pid: int64(pid), NsPid: int64(procs[pid].ns), Gpus: procs[pid].gpus,
			Imports: importsPB(procs[pid].imports), StartTime: procs[pid].start, Served: procs[pid].served,
			Template: procs[pid].script.pb()})
	}
	m.Stats = statsToPB(st)
	return m
}

func chunkPB(r *chunkRecord, size uint32) *imagepb.Chunk {
	if r.zero {
		return &imagepb.Chunk{Size: size, Location: imagepb.Location_LOCATION_ZERO}
	}
	mt := r.local.meta
	if mt.comp == imagepb.Compression_COMPRESSION_NONE {
		mt.crc = 0 // format 2; a reused or parent file may come from a format 1 image
	}
	return &imagepb.Chunk{Size: size, Location: mt.loc, Ancestor: mt.ancestor, Hash: append([]byte(nil), r.hash[:]...),
		Crc32C: mt.crc, Compression: mt.comp, StoredSize: mt.storedSize, Linked: mt.linked}
}

func countChunk(s *WriteStats, r *chunkRecord) {
	switch {
	case r.zero:
		s.ChunksZero++
	case r.local.meta.loc == imagepb.Location_LOCATION_PARENT || r.local.meta.linked:
		s.ChunksParent++
	case r.owner && r.local.written:
		s.ChunksNew++
	default:
		s.ChunksDedup++
	}
}

// sweepUnnamed removes the chunk files in chunks/ that m (just committed)
// does not name as its own: those of the image it replaced, and of writes
// that died. Only names this package writes (chunks/HH/HASH) that are
// regular files are candidates, reached beneath chunks/ without following
// a symlink; the writer's exclusive lock keeps every other writer and gc
// out meanwhile. Temporary files are left to gc (a writer removes only its
// own). What cannot be removed is left for gc too.
func (s *chunkStore) sweepUnnamed(m *imagepb.Manifest) error {
	named := map[chunkHash]bool{}
	for _, b := range m.GetBuffers() {
		for _, c := range b.GetChunks() {
			if c.GetLocation() == imagepb.Location_LOCATION_LOCAL {
				h, _ := hashFromBytes(c.GetHash())
				named[h] = true
			}
		}
	}
	subs, err := readDir(s.chunks)
	if err != nil {
		return err
	}
	var errs []error
	for _, sub := range subs {
		if !sub.IsDir() || len(sub.Name()) != 2 {
			continue
		}
		d, err := s.chunks.openDir(sub.Name(), s.own)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ents, err := readDir(d)
		removed := false
		for _, e := range ents {
			h, ok := parseHashName(e.Name())
			if !ok || e.Name()[:2] != sub.Name() || !e.Type().IsRegular() || named[h] {
				continue
			}
			if err := unix.Unlinkat(d.fd(), e.Name(), 0); err != nil && err != unix.ENOENT {
				errs = append(errs, &fs.PathError{Op: "remove", Path: d.join(e.Name()), Err: err})
				continue
			}
			removed = true
		}
		if removed {
			if err := d.sync(); err != nil {
				errs = append(errs, err)
			}
		}
		d.close()
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

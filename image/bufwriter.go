package image

import (
	"fmt"
	"sync/atomic"
)

// BufferWriter takes the bytes of one buffer, in order. One goroutine per
// BufferWriter; different BufferWriters of a Writer may be used concurrently.
type BufferWriter struct {
	w      *Writer
	index  int
	info   BufferInfo
	chunks []chunkRecord // filled by the workers, one slot per chunk

	written uint64  // bytes taken so far
	cur     *[]byte // chunk being filled; nil between chunks
	curLen  int     // bytes in cur
	curCap  int     // bytes this chunk will hold
	charge  int64   // budget taken for cur
	pooled  bool    // cur came from the pool
	closed  bool

	// WriteChunk state. mode is fixed by the first Write or WriteChunk.
	mode       atomic.Int32  // modeUnset, modeStream or modeChunks
	taken      []atomic.Bool // chunk i was handed to WriteChunk
	chunksDone atomic.Int64  // WriteChunk calls that stored their chunk
}

const (
	modeUnset int32 = iota
	modeStream
	modeChunks
)

// chunkRecord is what the workers learned about one chunk.
type chunkRecord struct {
	zero  bool
	hash  chunkHash
	local *localChunk // where the bytes live (shared by equal chunks)
	owner bool        // this chunk decided local's location
}

// smallChunk: a chunk this much smaller than ChunkSize (the tail of a small
// buffer) gets an exact allocation instead of a pooled chunk buffer, so that
// many small buffers do not each hold a whole chunk of the budget.
func (b *BufferWriter) smallChunk(n int) bool { return n < b.w.opts.ChunkSize/4 }

// Write copies p into the buffer's chunks and hands every full chunk to the
// workers; it blocks while MaxBuffered bytes are in flight. Writing past
// the buffer's size is an error, and so is any earlier failure of the
// Writer (then naming the chunk that failed).
func (b *BufferWriter) Write(p []byte) (int, error) {
	if b.closed {
		return 0, fmt.Errorf("buffer %d (0x%x): write after Close", b.index, b.info.Address)
	}
	if err := b.w.failed(); err != nil {
		return 0, err
	}
	if !b.setMode(modeStream) {
		return 0, fmt.Errorf("buffer %d (0x%x): Write after WriteChunk: use one or the other per buffer", b.index, b.info.Address)
	}
	if uint64(len(p)) > b.info.Size-b.written {
		return 0, fmt.Errorf("buffer %d (0x%x): write of %d bytes at offset %d passes its size %d",
			b.index, b.info.Address, len(p), b.written, b.info.Size)
	}
	n := 0
	for n < len(p) {
		if b.cur == nil {
			if err := b.startChunk(); err != nil {
				return n, err
			}
		}
		k := copy((*b.cur)[b.curLen:b.curCap], p[n:])
		b.curLen += k
		n += k
		b.written += uint64(k)
		if b.curLen == b.curCap {
			if err := b.submit(); err != nil {
				return n, err
			}
		}
	}
	b.w.bytesIn.Add(int64(n))
	return n, nil
}

func (b *BufferWriter) startChunk() error {
	idx := int(b.written / uint64(b.w.opts.ChunkSize))
	size := int(chunkLen(b.info.Size, uint32(b.w.opts.ChunkSize), idx))
	charge, pooled := int64(b.w.opts.ChunkSize), true
	if b.smallChunk(size) {
		charge, pooled = int64(size), false
	}
	if err := b.w.budget.acquire(charge); err != nil {
		return err // the Writer's failure, which names its own chunk
	}
	if pooled {
		b.cur = b.w.pool.Get().(*[]byte)
	} else {
		buf := make([]byte, size)
		b.cur = &buf
	}
	b.curLen, b.curCap, b.charge, b.pooled = 0, size, charge, pooled
	return nil
}

func (b *BufferWriter) submit() error {
	j := job{bw: b, index: int((b.written - 1) / uint64(b.w.opts.ChunkSize)),
		buf: b.cur, n: b.curLen, charge: b.charge, pooled: b.pooled}
	b.cur = nil
	if err := b.w.send(j); err != nil {
		b.w.recycle(j.buf, j.charge, j.pooled, false)
		return err
	}
	return nil
}

// setMode fixes how the buffer is written; false if the other way was
// used already.
func (b *BufferWriter) setMode(m int32) bool {
	return b.mode.CompareAndSwap(modeUnset, m) || b.mode.Load() == m
}

// WriteChunk stores chunk i of the buffer from p, which must hold exactly
// that chunk's bytes (ChunkSize, less for the last chunk). It works in the
// calling goroutine and returns when the chunk is stored, so p may be
// reused at once: there is no copy, no queue and no memory held in between,
// which is what a copy engine with its own staging buffers wants. Chunks of
// one buffer may be written in any order and from several goroutines at
// once; each exactly once. A buffer is written either with Write or with
// WriteChunk, not both.
func (b *BufferWriter) WriteChunk(i int, p []byte) error { return b.writeChunk(i, p, nil) }

// WriteChunkHashed is WriteChunk of a chunk whose content hash h (format 3:
// ptx.ChunkHash of p) the caller computed, on the GPU where p came from:
// the Writer trusts it and hashes nothing. A wrong h makes a chunk that
// fails every later check (a restore's on the GPU, Verify's here).
func (b *BufferWriter) WriteChunkHashed(i int, p []byte, h [16]byte) error {
	return b.writeChunk(i, p, (*chunkHash)(&h))
}

// RecordChunk records chunk i by its content hash h alone (format 3:
// ptx.ChunkHash, computed on the GPU) if the image needs no bytes for it:
// it is all zero, or equal to a chunk this write has met already (any
// buffer, any process), or one the parent chain holds, or one the image
// DIR held before left a file for. Then it returns true and the chunk is
// written. Otherwise it returns false and the caller must copy the chunk
// and write it (WriteChunkHashed, same h), or the write fails: equal
// chunks recorded meanwhile refer to this one. Like WriteChunk, it works in
// the calling goroutine and may be called from several at once.
func (b *BufferWriter) RecordChunk(i int, h [16]byte) (bool, error) {
	n, err := b.checkChunk(i, -1)
	if err != nil {
		return false, err
	}
	if b.taken[i].Load() {
		return false, fmt.Errorf("buffer %d (0x%x): chunk %d written twice", b.index, b.info.Address, i)
	}
	w := b.w
	w.sendMu.RLock()
	defer w.sendMu.RUnlock()
	if err := w.writable(b); err != nil {
		return false, err
	}
	rec := &b.chunks[i]
	var lc *localChunk
	owner, zero := false, chunkHash(h) == ZeroChunkHash(n)
	if !zero {
		var ok bool
		if lc, owner, ok = w.store.claimKnown(h); !ok {
			// New content: the caller copies it. It is claimed for this
			// chunk now, so that an equal chunk recorded meanwhile refers
			// to it instead of being copied too.
			if lc, owner = w.store.claim(h); owner {
				rec.hash, rec.local, rec.owner = h, lc, true
				return false, nil
			}
		}
	}
	if b.taken[i].Swap(true) {
		return false, fmt.Errorf("buffer %d (0x%x): chunk %d written twice", b.index, b.info.Address, i)
	}
	rec.zero, rec.hash, rec.local, rec.owner = zero, h, lc, owner
	w.bytesIn.Add(int64(n))
	b.chunksDone.Add(1)
	return true, nil
}

// checkChunk checks that chunk i exists and, with size >= 0, that it has
// size bytes; it returns the chunk's size.
func (b *BufferWriter) checkChunk(i, size int) (int, error) {
	if !b.setMode(modeChunks) {
		return 0, fmt.Errorf("buffer %d (0x%x): WriteChunk after Write: use one or the other per buffer", b.index, b.info.Address)
	}
	n := len(b.chunks)
	if i < 0 || i >= n {
		return 0, fmt.Errorf("buffer %d (0x%x): no chunk %d (has %d)", b.index, b.info.Address, i, n)
	}
	want := int(chunkLen(b.info.Size, uint32(b.w.opts.ChunkSize), i))
	if size >= 0 && size != want {
		return 0, fmt.Errorf("buffer %d (0x%x): chunk %d has %d bytes, WriteChunk got %d", b.index, b.info.Address, i, want, size)
	}
	return want, nil
}

// writable says whether chunks may still be stored (sendMu read-held).
func (w *Writer) writable(b *BufferWriter) error {
	if err := w.failed(); err != nil {
		return err
	}
	if w.jobsClosed {
		return fmt.Errorf("image %s: buffer %d (0x%x): write after Commit", w.dir, b.index, b.info.Address)
	}
	return nil
}

func (b *BufferWriter) writeChunk(i int, p []byte, h *chunkHash) error {
	if _, err := b.checkChunk(i, len(p)); err != nil {
		return err
	}
	if b.taken[i].Load() {
		return fmt.Errorf("buffer %d (0x%x): chunk %d written twice", b.index, b.info.Address, i)
	}
	if rec := &b.chunks[i]; rec.owner && (h == nil || *h != rec.hash) {
		// RecordChunk claimed the chunk for its hash: equal chunks refer to
		// the bytes written for it, so they must be the bytes of that hash.
		return fmt.Errorf("buffer %d (0x%x): chunk %d recorded with hash %s is written without it", b.index,
			b.info.Address, i, rec.hash)
	}
	if b.taken[i].Swap(true) {
		return fmt.Errorf("buffer %d (0x%x): chunk %d written twice", b.index, b.info.Address, i)
	}
	// Read-holding sendMu keeps Commit and Abort (closeJobs) waiting until
	// this chunk is stored, so nothing is created behind Abort's cleanup.
	w := b.w
	w.sendMu.RLock()
	defer w.sendMu.RUnlock()
	if err := w.writable(b); err != nil {
		return err
	}
	var scratch *[]byte
	if w.store.enc != nil {
		scratch = w.scratch.Get().(*[]byte)
		defer w.scratch.Put(scratch)
	}
	var err error
	switch {
	case h == nil:
		err = w.storeChunk(b, i, p, scratch)
	case *h == ZeroChunkHash(len(p)):
		b.chunks[i].zero = true
	default:
		err = w.storeHashed(b, i, p, *h, scratch)
	}
	if err != nil {
		return err
	}
	w.bytesIn.Add(int64(len(p)))
	b.chunksDone.Add(1)
	return nil
}

// complete reports whether every byte of the buffer has been stored or
// handed to the workers, and how many bytes that is.
func (b *BufferWriter) complete() (bool, uint64) {
	if b.mode.Load() == modeChunks {
		done := b.chunksDone.Load()
		if done == int64(len(b.chunks)) {
			return true, b.info.Size
		}
		return false, uint64(done) * uint64(b.w.opts.ChunkSize) // about: the last chunk may be short
	}
	return b.written == b.info.Size, b.written
}

// Close ends the buffer; all Size bytes must have been written (and every
// WriteChunk call returned).
func (b *BufferWriter) Close() error {
	if b.closed {
		return nil
	}
	if ok, written := b.complete(); !ok {
		return fmt.Errorf("buffer %d (0x%x): %w: %d of %d bytes written", b.index, b.info.Address,
			ErrIncomplete, written, b.info.Size)
	}
	if err := b.w.failed(); err != nil {
		return err
	}
	b.w.mu.Lock()
	b.closed = true
	b.w.mu.Unlock()
	return nil
}

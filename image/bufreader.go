package image

import (
	"fmt"
	"io"
	"sync"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// BufferReader reads one buffer of an Image. Read (and WriteTo) go
// sequentially, with the next chunks loaded ahead in parallel; ReadAt reads
// any range and may be called from several goroutines.
type BufferReader struct {
	im    *Image
	index int
	b     *imagepb.Buffer

	off     uint64     // next byte Read returns
	ahead   []*pending // chunks requested, in order; ahead[0] holds off
	nextReq int        // next chunk to request
	closed  bool
}

// pending is a chunk being loaded by a prefetch goroutine.
type pending struct {
	ci   int
	done chan struct{}
	buf  *[]byte
	err  error
}

// Size is the buffer's size in bytes.
func (r *BufferReader) Size() int64 { return int64(r.b.GetSize()) }

func (r *BufferReader) chunkSize() uint64 { return uint64(r.im.m.GetChunkSize()) }

// start begins loading chunk ci in the background.
func (r *BufferReader) start(ci int) *pending {
	pd := &pending{ci: ci, done: make(chan struct{})}
	size := r.b.GetChunks()[ci].GetSize()
	go func() {
		pd.buf = r.im.getBuf()
		pd.err = r.im.load(r.index, ci, (*pd.buf)[:size])
		close(pd.done)
	}()
	return pd
}

// chunk returns the loaded chunk holding r.off, keeping Prefetch more
// chunks in flight behind it.
func (r *BufferReader) chunk() (*pending, error) {
	ci := int(r.off / r.chunkSize())
	if len(r.ahead) == 0 || r.ahead[0].ci != ci {
		r.drop()
		r.nextReq = ci
	}
	for len(r.ahead) < 1+max(r.im.opts.Prefetch, 0) && r.nextReq < len(r.b.GetChunks()) {
		r.ahead = append(r.ahead, r.start(r.nextReq))
		r.nextReq++
	}
	pd := r.ahead[0]
	<-pd.done
	return pd, pd.err
}

// advance moves past k bytes of the front chunk, releasing it when done.
func (r *BufferReader) advance(pd *pending, k int) {
	r.off += uint64(k)
	if r.off == uint64(pd.ci)*r.chunkSize()+uint64(r.b.GetChunks()[pd.ci].GetSize()) {
		r.im.putBuf(pd.buf)
		r.ahead[0] = nil
		r.ahead = r.ahead[1:]
	}
}

// drop waits for and releases every requested chunk.
func (r *BufferReader) drop() {
	for _, pd := range r.ahead {
		<-pd.done
		r.im.putBuf(pd.buf)
	}
	r.ahead = r.ahead[:0]
}

// Read reads the buffer's bytes in order; every chunk is checked before any
// of its bytes is returned. A damaged chunk gives a *ChunkError (and the
// same error again on the next Read).
func (r *BufferReader) Read(p []byte) (int, error) {
	if r.closed {
		return 0, fmt.Errorf("buffer %d: read after Close", r.index)
	}
	n := 0
	for n < len(p) {
		if r.off >= r.b.GetSize() {
			if n == 0 {
				return 0, io.EOF
			}
			break
		}
		pd, err := r.chunk()
		if err != nil {
			return n, err
		}
		within := r.off - uint64(pd.ci)*r.chunkSize()
		k := copy(p[n:], (*pd.buf)[within:r.b.GetChunks()[pd.ci].GetSize()])
		n += k
		r.advance(pd, k)
	}
	return n, nil
}

// WriteTo writes the rest of the buffer to w without an intermediate copy
// (io.Copy uses it).
func (r *BufferReader) WriteTo(w io.Writer) (int64, error) {
	if r.closed {
		return 0, fmt.Errorf("buffer %d: read after Close", r.index)
	}
	var total int64
	for r.off < r.b.GetSize() {
		pd, err := r.chunk()
		if err != nil {
			return total, err
		}
		within := r.off - uint64(pd.ci)*r.chunkSize()
		k, err := w.Write((*pd.buf)[within:r.b.GetChunks()[pd.ci].GetSize()])
		total += int64(k)
		r.advance(pd, k)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// Close releases the chunks loaded ahead.
func (r *BufferReader) Close() error {
	if !r.closed {
		r.closed = true
		r.drop()
	}
	return nil
}

// ReadAt reads len(p) bytes at off, loading the chunks involved in parallel;
// a whole chunk that p covers is loaded straight into p. As io.ReaderAt: n <
// len(p) comes with an error (io.EOF past the end of the buffer).
func (r *BufferReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("buffer %d: negative offset %d", r.index, off)
	}
	size := r.b.GetSize()
	if uint64(off) >= size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	end := min(uint64(off)+uint64(len(p)), size)
	cs := r.chunkSize()
	first, last := int(uint64(off)/cs), int((end-1)/cs)
	errs := make([]error, last-first+1)
	read := func(ci int) {
		errs[ci-first] = r.readChunkAt(p, uint64(off), end, ci)
	}
	if first == last {
		read(first)
	} else {
		var wg sync.WaitGroup
		for ci := first; ci <= last; ci++ {
			wg.Add(1)
			go func() { defer wg.Done(); read(ci) }()
		}
		wg.Wait()
	}
	for i, err := range errs {
		if err != nil {
			n := max(int64(uint64(first+i)*cs)-off, 0)
			return int(n), err
		}
	}
	n := int(end - uint64(off))
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// readChunkAt puts the part of chunk ci within [off, end) at its place in p.
func (r *BufferReader) readChunkAt(p []byte, off, end uint64, ci int) error {
	cs := r.chunkSize()
	cstart := uint64(ci) * cs
	clen := uint64(r.b.GetChunks()[ci].GetSize())
	lo, hi := max(off, cstart), min(end, cstart+clen)
	dst := p[lo-off : hi-off]
	if lo == cstart && hi == cstart+clen {
		return r.im.load(r.index, ci, dst)
	}
	buf := r.im.getBuf()
	defer r.im.putBuf(buf)
	if err := r.im.load(r.index, ci, (*buf)[:clen]); err != nil {
		return err
	}
	copy(dst, (*buf)[lo-cstart:hi-cstart])
	return nil
}

var _ io.ReaderAt = (*BufferReader)(nil)
var _ io.WriterTo = (*BufferReader)(nil)

// ChunkHashes returns the content hash of each chunk of the buffer, in
// order, as the manifest records it (a zero chunk: the hash of its zero
// bytes), for a caller that checks loaded chunks itself
// (ReadOptions.HashCheckedByCaller). Only images that HashesOnGPU have such
// hashes: for others it returns nil.
func (r *BufferReader) ChunkHashes() [][16]byte {
	if !r.im.HashesOnGPU() {
		return nil
	}
	cs := r.b.GetChunks()
	out := make([][16]byte, len(cs))
	for i, c := range cs {
		if c.GetLocation() == imagepb.Location_LOCATION_ZERO {
			out[i] = ZeroChunkHash(int(c.GetSize()))
		} else {
			copy(out[i][:], c.GetHash())
		}
	}
	return out
}

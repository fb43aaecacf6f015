package benchio

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/ptx"
)

// ImageWrite stores data as one image in dir: nbuf buffers, each a contiguous
// part of data, written concurrently (as the helper copies several buffers off
// the GPU at once), each in block-sized Writes (a staging buffer's worth), then
// committed. It returns the writer's statistics.
func ImageWrite(dir string, data []byte, nbuf, block int, opts image.Options) (image.WriteStats, error) {
	w, err := create(dir, opts)
	if err != nil {
		return image.WriteStats{}, fmt.Errorf("create image in %s: %w", dir, err)
	}
	err = eachPart(SplitAligned(len(data), nbuf, chunkSizeOf(opts)), func(i, lo, hi int) error {
		return writeBuffer(w, i, data[lo:hi], block)
	})
	if err != nil {
		_ = w.Abort()
		return image.WriteStats{}, err
	}
	if err := w.Commit(); err != nil {
		return image.WriteStats{}, fmt.Errorf("commit image in %s: %w", dir, err)
	}
	return w.Stats(), nil
}

// ImageWriteChunks stores data as ImageWrite does (same buffers, same
// image), but through BufferWriter.WriteChunk: writers goroutines take one
// chunk at a time, of any buffer, and store it from data itself, without a
// copy, as a copy engine stores its staging buffers. The mirror of
// ImageRead.
// With hashes (ChunkHashes of the same data, buffers and chunk size) each
// chunk is written with its hash given (WriteChunkHashed), as the copy
// engine does with the GPU's: the writer hashes nothing.
func ImageWriteChunks(dir string, data []byte, nbuf, writers int, opts image.Options, hashes [][16]byte) (image.WriteStats, error) {
	w, err := create(dir, opts)
	if err != nil {
		return image.WriteStats{}, fmt.Errorf("create image in %s: %w", dir, err)
	}
	chunk := chunkSizeOf(opts)
	type piece struct {
		bw         *image.BufferWriter
		buf, index int
		data       []byte
	}
	var pieces []piece
	var bws []*image.BufferWriter
	var hashOf map[*byte][16]byte // a chunk's first byte -> its hash
	for i, p := range SplitAligned(len(data), nbuf, chunk) {
		bw, err := w.AddBuffer(image.BufferInfo{
			Pid:     os.Getpid(),
			Address: benchBase + uint64(i)<<40,
			Size:    uint64(p[1] - p[0]),
			Kind:    image.AllocMemAlloc,
		})
		if err != nil {
			_ = w.Abort()
			return image.WriteStats{}, fmt.Errorf("add buffer %d: %w", i, err)
		}
		bws = append(bws, bw)
		for off := p[0]; off < p[1]; off += chunk {
			pieces = append(pieces, piece{bw, i, (off - p[0]) / chunk, data[off:min(off+chunk, p[1])]})
		}
	}
	if hashes != nil {
		if len(hashes) != len(pieces) {
			_ = w.Abort()
			return image.WriteStats{}, fmt.Errorf("%d hashes for %d chunks", len(hashes), len(pieces))
		}
		hashOf = make(map[*byte][16]byte, len(pieces))
		for k, p := range pieces {
			hashOf[&p.data[0]] = hashes[k]
		}
	}
	// Interleave the buffers' chunks, as several copy streams deliver them.
	slices.SortStableFunc(pieces, func(a, b piece) int { return cmp.Compare(a.index, b.index) })
	work := make(chan piece)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				if errs[g] == nil {
					var err error
					if hashOf != nil {
						err = p.bw.WriteChunkHashed(p.index, p.data, hashOf[&p.data[0]])
					} else {
						err = p.bw.WriteChunk(p.index, p.data)
					}
					if err != nil {
						errs[g] = fmt.Errorf("buffer %d chunk %d: %w", p.buf, p.index, err)
					}
				}
			}
		}()
	}
	for _, p := range pieces {
		work <- p
	}
	close(work)
	wg.Wait()
	for i, bw := range bws {
		if err := bw.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close buffer %d: %w", i, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		_ = w.Abort()
		return image.WriteStats{}, err
	}
	if err := w.Commit(); err != nil {
		return image.WriteStats{}, fmt.Errorf("commit image in %s: %w", dir, err)
	}
	return w.Stats(), nil
}

// create starts a benchmark image in dir.
func create(dir string, opts image.Options) (*image.Writer, error) {
	return image.Create(dir, image.Origin{
		Host:     "imagebench",
		GPUModel: "none (host memory)",
		Pid:      os.Getpid(),
		Time:     time.Now(),
	}, opts)
}

// benchBase is where the benchmark's buffers pretend to live on the GPU: a
// typical device address, each buffer 1 TiB apart so they never overlap.
const benchBase = 0x7f0000000000

func writeBuffer(w *image.Writer, i int, b []byte, block int) error {
	bw, err := w.AddBuffer(image.BufferInfo{
		Pid:     os.Getpid(),
		Address: benchBase + uint64(i)<<40,
		Size:    uint64(len(b)),
		Kind:    image.AllocMemAlloc,
	})
	if err != nil {
		return fmt.Errorf("add buffer %d: %w", i, err)
	}
	for len(b) > 0 {
		n := min(len(b), block)
		if _, err := bw.Write(b[:n]); err != nil {
			return fmt.Errorf("write buffer %d: %w", i, err)
		}
		b = b[n:]
	}
	if err := bw.Close(); err != nil {
		return fmt.Errorf("close buffer %d: %w", i, err)
	}
	return nil
}

// ImageRead opens the image in dir and reads every buffer back into dst (laid
// out as ImageWrite split it) with readers goroutines, each taking one chunk
// at a time with ReadAt on a BufferReader of its own. Chunk-sized parallel
// reads are how a restore fills the GPU, and they keep every core busy even
// when the image holds a single large buffer. gpuChecks: the reader leaves
// the hash check to the caller, as a restore does that checks on the GPU
// (image.ReadOptions.HashCheckedByCaller).
func ImageRead(dir string, dst []byte, readers int, gpuChecks bool) error {
	im, err := image.OpenWith(dir, image.ReadOptions{HashCheckedByCaller: gpuChecks})
	if err != nil {
		return fmt.Errorf("open image in %s: %w", dir, err)
	}
	bufs := im.Buffers()
	chunk := int(im.Manifest().GetChunkSize())
	if chunk <= 0 {
		chunk = image.DefaultChunkSize
	}
	// Buffers were added concurrently, so the manifest holds them in any
	// order; their addresses, which grow with the part of data each holds,
	// give the layout back.
	order := make([]int, len(bufs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(bufs[a].Address, bufs[b].Address) })
	type piece struct{ buf, off, dst, n int }
	var pieces []piece
	pos := 0
	for _, i := range order {
		b := bufs[i]
		for off := 0; off < int(b.Size); off += chunk {
			n := min(chunk, int(b.Size)-off)
			pieces = append(pieces, piece{i, off, pos + off, n})
		}
		pos += int(b.Size)
	}
	if pos != len(dst) {
		return fmt.Errorf("image in %s holds %d bytes, expected %d", dir, pos, len(dst))
	}
	work := make(chan piece)
	errs := make([]error, readers)
	var wg sync.WaitGroup
	for g := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			open := map[int]*image.BufferReader{}
			defer func() {
				for _, r := range open {
					_ = r.Close()
				}
			}()
			for p := range work {
				if errs[g] != nil {
					continue // drain so the sender never blocks
				}
				r := open[p.buf]
				if r == nil {
					if r, errs[g] = im.OpenBuffer(p.buf); errs[g] != nil {
						errs[g] = fmt.Errorf("open buffer %d: %w", p.buf, errs[g])
						continue
					}
					open[p.buf] = r
				}
				if _, err := r.ReadAt(dst[p.dst:p.dst+p.n], int64(p.off)); err != nil {
					errs[g] = fmt.Errorf("read buffer %d at %d: %w", p.buf, p.off, err)
				}
			}
		}()
	}
	for _, p := range pieces {
		work <- p
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

func chunkSizeOf(opts image.Options) int {
	if opts.ChunkSize > 0 {
		return opts.ChunkSize
	}
	return image.DefaultChunkSize
}

// SplitAligned cuts n bytes into at most parts contiguous [start, end)
// ranges whose boundaries are multiples of align. Image buffers are cut on
// chunk boundaries, so splitting the data into buffers changes neither which
// chunks are duplicates or zero nor how many chunks there are; raw files on
// block boundaries, so every write but the last is whole.
func SplitAligned(n, parts, align int) [][2]int {
	units := (n + align - 1) / align
	parts = max(1, min(parts, units))
	var out [][2]int
	for i := range parts {
		start := min(n, units*i/parts*align)
		end := min(n, units*(i+1)/parts*align)
		if end > start {
			out = append(out, [2]int{start, end})
		}
	}
	return out
}

// ChunkHashes is the content hash (ptx.ChunkHash) of every chunk
// ImageWriteChunks writes of data in nbuf buffers, in its order before
// interleaving: what the GPU computes before a dump copies anything.
func ChunkHashes(data []byte, nbuf, chunk int) [][16]byte {
	var out [][16]byte
	for _, p := range SplitAligned(len(data), nbuf, chunk) {
		for off := p[0]; off < p[1]; off += chunk {
			out = append(out, ptx.ChunkHash(data[off:min(off+chunk, p[1])]))
		}
	}
	return out
}

// Package engine moves GPU memory between helper-owned allocations and an
// image (package image): the copy engines of checkpoint and restore.
//
// A dump first hashes every chunk on the GPU where it lies (gpucr's own
// kernel, helper/cuda.HashRanges): a chunk the image has already (zero,
// equal to another, or in the parent chain) is recorded by its hash and
// never crosses PCIe. Each device gets several lanes (helper/cuda.Lane: a
// thread, a stream and pinned staging for two chunks). A lane copies one
// new chunk device-to-host into one half of its staging while its thread
// hands the chunk before it, in the other half, with its hash, to
// image.BufferWriter.WriteChunkHashed, which writes it to the image: the
// lane's DMA and its file I/O overlap, and no byte is copied in host memory
// twice. Restore is the mirror: image.BufferReader.ReadAt straight into one
// half while the other goes host-to-device; once every chunk is on the GPU
// it is hashed there and compared with the image (for images whose hash the
// GPU computes; older ones are checked by the reader). The helper reaches
// the memory through its own view of each allocation, kept from the first
// copy until the allocation is released.
package engine

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpucr/gpucr/image"
)

// Region is one helper-owned allocation as the application sees it.
type Region struct {
	Device  GPU
	Handle  uint64
	Size    uint64 // the allocation's size (a multiple of the granularity)
	Pid     int
	NsPid   int    // Pid in the process's own pid namespace (0: unknown)
	Address uint64 // where the application maps it
	Kind    image.AllocKind
	Flags   image.AllocFlags // how the memory was created
	// TouchRank: the order its process first touched it in after its
	// last restore (image.BufferInfo.TouchRank).
	TouchRank uint32
}

// TotalSize is the bytes of all regions.
func TotalSize(regions []Region) uint64 {
	var n uint64
	for _, r := range regions {
		n += r.Size
	}
	return n
}

// Options tune the engines.
type Options struct {
	// Lanes per device; 0: GOMAXPROCS (the image writer's hashing and
	// writing, not the DMA, is what needs the threads).
	Lanes int
	// Progress, if set, is called with the bytes done so far (from several
	// goroutines; keep it cheap).
	Progress func(done int64)
	// Copied, if set, is called with the bytes of each chunk a dump copies
	// over PCIe (those its image lacks); from several goroutines.
	Copied func(n int64)

	// PieceDelay holds each chunk of a load back this long before it goes
	// to the GPU: a slow disk on purpose (the helper's fault
	// GPUCR_FAULT=slow-load), so that tests see a restore that loads on
	// demand run before its data is all in.
	PieceDelay time.Duration

	// stagingFault, in tests, damages a chunk in host memory between the
	// image and the GPU (region index, chunk index, its staged bytes).
	stagingFault func(r, chunk int, buf []byte)
}

// LaneStaging is the pinned staging a copy lane needs for chunks of chunk
// bytes: two chunks, one crossing PCIe while the lane's thread works on the
// other (run). The helper starts its lanes with this much, so that the
// first checkpoint finds them ready.
func LaneStaging(chunk int) int { return 2 * chunk }

func (o Options) lanes() int {
	if o.Lanes > 0 {
		return o.Lanes
	}
	return runtime.GOMAXPROCS(0)
}

// piece is one chunk of one region.
type piece struct {
	r     int    // region index
	index int    // chunk index
	off   uint64 // byte offset in the region
	n     int
}

func pieces(regions []Region, chunk int) map[GPU][]piece {
	byDev := map[GPU][]piece{}
	// Chunk-major order: every region makes progress at once, as a restore
	// that starts with any buffer wants.
	for ci := 0; ; ci++ {
		any := false
		for ri, r := range regions {
			off := uint64(ci) * uint64(chunk)
			if off >= r.Size {
				continue
			}
			any = true
			n := int(min(uint64(chunk), r.Size-off))
			byDev[r.Device] = append(byDev[r.Device], piece{ri, ci, off, n})
		}
		if !any {
			return byDev
		}
	}
}

// steps are what run does around the copies; exactly one of fromGPU and
// toGPU is set.
type steps struct {
	before func(vas []uint64) error    // once every region is mapped
	skip   func(p piece) (bool, error) // before a piece goes to a lane: true if it needs no copy
	// fromGPU (a dump) gets each piece's bytes once they are in host
	// memory; toGPU (a load) fills buf with them before they go to the GPU.
	// Both run on a lane's thread; buf is pinned staging memory.
	fromGPU func(p piece, buf []byte) error
	toGPU   func(p piece, buf []byte) error
	after   func(vas []uint64) error // once every piece is done, the regions still mapped
	// next, if set, hands out each device's pieces in the order it decides
	// at the time (an on-demand load moves what a process waits for to the
	// front); false once it has none left. Without it, pieces go in
	// chunk-major order.
	next func(dev GPU) (piece, bool)
	// doneHook, if set, is told of each piece once it is done (on a lane's
	// thread: keep it cheap).
	doneHook func(p piece)
}

// run maps every region (the helper's own view), runs st.before with the
// mappings, starts the lanes of each device and moves every piece through
// some lane of its device (unless st.skip says it needs none: that runs on
// the goroutine that hands pieces to the lanes, without a thread hop), then
// st.after, the regions still mapped.
//
// A lane's staging buffer holds two chunks, so that its copy engine and its
// thread work at once: while one chunk crosses PCIe, the thread writes the
// previous one to the image (a dump) or reads the next one from it (a
// load). Without that, each lane waited for its DMA before touching a file,
// and the file system, the slower of the two, stood idle meanwhile.
func run(regions []Region, chunk int, opts Options, st steps) error {
	// The helper's views (GPU.Map) stay until each allocation is
	// released: the next checkpoint of the same buffers maps nothing.
	vas := make([]uint64, len(regions))
	for i, r := range regions {
		va, err := r.Device.Map(r.Handle, r.Size)
		if err != nil {
			return fmt.Errorf("region %d (pid %d, 0x%x, %d bytes): %w", i, r.Pid, r.Address, r.Size, err)
		}
		vas[i] = va
	}
	if st.before != nil {
		if err := st.before(vas); err != nil {
			return err
		}
	}
	var moved atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	failPiece := func(p piece, err error) {
		r := regions[p.r]
		mu.Lock()
		errs = append(errs, fmt.Errorf("region %d (pid %d, 0x%x) chunk %d: %w", p.r, r.Pid, r.Address, p.index, err))
		mu.Unlock()
	}
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(errs) > 0
	}
	done := func(p piece) {
		if opts.Progress != nil {
			opts.Progress(moved.Add(int64(p.n)))
		}
		if st.doneHook != nil {
			st.doneHook(p)
		}
	}
	for dev, ps := range pieces(regions, chunk) {
		work := make(chan piece)
		for range min(opts.lanes(), len(ps)) {
			l, err := dev.AcquireLane(LaneStaging(chunk))
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("device %s: %w", dev.UUID(), err))
				mu.Unlock()
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				lane := &laneRun{l: l, bufs: [2][]byte{l.Staging()[:chunk], l.Staging()[chunk : 2*chunk]}, vas: vas,
					st: st, fail: failPiece, failed: failed, done: done}
				lane.loop(work)
				if lane.broken {
					l.Close()
				} else {
					dev.ReleaseLane(l)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(work)
			if st.next != nil {
				for p, ok := st.next(dev); ok; p, ok = st.next(dev) {
					if failed() {
						return
					}
					work <- p
				}
				return
			}
			for _, p := range ps {
				if failed() {
					return
				}
				if st.skip != nil {
					skipped, err := st.skip(p)
					if err != nil {
						failPiece(p, err)
						return
					}
					if skipped {
						done(p)
						continue
					}
				}
				work <- p
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil || st.after == nil {
		return err
	}
	return st.after(vas)
}

// laneRun is one lane's share of a run: the pieces it takes from the work
// channel, two at a time in flight (one in its copy engine, one in its
// thread's hands).
type laneRun struct {
	l      Lane
	bufs   [2][]byte
	vas    []uint64
	st     steps
	fail   func(piece, error)
	failed func() bool
	done   func(piece)
	// broken: a driver call failed (the lane's stream may be unusable) or
	// the lane's thread is gone; the lane is closed, not kept.
	broken bool
}

// gpuErr reports a driver error of piece p.
func (lr *laneRun) gpuErr(p piece, err error) {
	if IsDeviceError(err) {
		lr.broken = true
	}
	lr.fail(p, err)
}

// on runs f on the lane's thread.
func (lr *laneRun) on(f func()) bool {
	if err := lr.l.Do(f); err != nil {
		lr.broken = true
		return false
	}
	return true
}

// loop moves every piece it receives; after the first error anywhere it
// only drains the channel. Piece i uses staging half i%2.
func (lr *laneRun) loop(work <-chan piece) {
	var prev piece
	var have bool // prev is in flight (dump: its bytes are coming; load: they are going)
	k := 0
	for p := range work {
		if lr.broken || lr.failed() {
			continue // drain: the first error ends the job
		}
		buf := lr.bufs[k][:p.n]
		ok := lr.on(func() {
			if lr.st.fromGPU != nil {
				// Queue p's copy, write prev meanwhile, then wait for p.
				if err := lr.l.StartDtoH(buf, lr.vas[p.r]+p.off); err != nil {
					lr.gpuErr(p, err)
					return
				}
				if have {
					if err := lr.st.fromGPU(prev, lr.bufs[1-k][:prev.n]); err != nil {
						lr.fail(prev, err)
					} else {
						lr.done(prev)
					}
				}
				if err := lr.l.Sync(); err != nil {
					lr.gpuErr(p, err)
				}
				return
			}
			// Read p while prev's copy runs (its half is the other), wait
			// for prev, then queue p's copy.
			if err := lr.st.toGPU(p, buf); err != nil {
				lr.fail(p, err)
				return
			}
			if have {
				if err := lr.l.Sync(); err != nil {
					lr.gpuErr(prev, err)
					return
				}
				lr.done(prev)
			}
			if err := lr.l.StartHtoD(lr.vas[p.r]+p.off, buf); err != nil {
				lr.gpuErr(p, err)
			}
		})
		if !ok {
			// Keep draining (broken is set): the feeder must not block on
			// a channel no lane reads.
			lr.fail(p, errors.New("the copy lane's thread is gone"))
			continue
		}
		prev, have, k = p, true, 1-k
	}
	if !have || lr.broken || lr.failed() {
		if have && !lr.broken {
			lr.on(func() { _ = lr.l.Sync() }) // nothing may still read or write its staging
		}
		return
	}
	lr.on(func() {
		if lr.st.fromGPU != nil {
			if err := lr.st.fromGPU(prev, lr.bufs[1-k][:prev.n]); err != nil {
				lr.fail(prev, err)
				return
			}
		} else if err := lr.l.Sync(); err != nil {
			lr.gpuErr(prev, err)
			return
		}
		lr.done(prev)
	})
}

// hashAll hashes every region's chunks on its GPU (helper/cuda.HashRanges),
// each device's regions in one go, the devices at once.
func hashAll(regions []Region, vas []uint64, chunk int) ([][][16]byte, error) {
	byDev := map[GPU][]int{}
	for i, r := range regions {
		byDev[r.Device] = append(byDev[r.Device], i)
	}
	out := make([][][16]byte, len(regions))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for dev, idx := range byDev {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ranges := make([]Range, len(idx))
			for k, i := range idx {
				ranges[k] = Range{VA: vas[i], Size: regions[i].Size}
			}
			hs, err := dev.HashRanges(ranges, chunk)
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("device %s: hash on the GPU: %w", dev.UUID(), err))
				mu.Unlock()
				return
			}
			for k, i := range idx {
				out[i] = hs[k]
			}
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// DumpStats says what a Dump did.
type DumpStats struct {
	Chunks      int           // chunks of all regions
	Copied      int           // chunks copied to the host: those the image did not have yet
	BytesCopied uint64        // their bytes
	Hash        time.Duration // hashing every chunk on the GPUs
}

// Dump puts every region into w, one image buffer each (added in region
// order), and closes those buffers; the caller commits or aborts w. Every
// chunk is hashed on its GPU first, and only the chunks w does not have
// (image.BufferWriter.RecordChunk) are copied to the host and written.
func Dump(regions []Region, w *image.Writer, chunk int, opts Options) (DumpStats, error) {
	var st DumpStats
	bws := make([]*image.BufferWriter, len(regions))
	for i, r := range regions {
		bw, err := w.AddBuffer(image.BufferInfo{Pid: r.Pid, NsPid: r.NsPid, Device: r.Device.Ordinal(), GPUUUID: r.Device.UUID(),
			Address: r.Address, Size: r.Size, Kind: r.Kind, Flags: r.Flags, TouchRank: r.TouchRank})
		if err != nil {
			return st, fmt.Errorf("region %d: %w", i, err)
		}
		bws[i] = bw
	}
	// Every chunk is hashed on the GPU first; only those the image does not
	// have yet (not zero, not met earlier in this write, not in the parent
	// chain) cross PCIe.
	var hashes [][][16]byte
	hash := func(vas []uint64) (err error) {
		t := time.Now()
		hashes, err = hashAll(regions, vas, chunk)
		st.Hash = time.Since(t)
		return err
	}
	var copied atomic.Int64
	var copiedBytes atomic.Uint64
	record := func(p piece) (bool, error) { return bws[p.r].RecordChunk(p.index, hashes[p.r][p.index]) }
	err := run(regions, chunk, opts, steps{before: hash, skip: record, fromGPU: func(p piece, buf []byte) error {
		copied.Add(1)
		copiedBytes.Add(uint64(p.n))
		if opts.Copied != nil {
			opts.Copied(int64(p.n))
		}
		return bws[p.r].WriteChunkHashed(p.index, buf, hashes[p.r][p.index])
	}})
	for _, hs := range hashes {
		st.Chunks += len(hs)
	}
	st.Copied, st.BytesCopied = int(copied.Load()), copiedBytes.Load()
	if err != nil {
		return st, err
	}
	for i, bw := range bws {
		if err := bw.Close(); err != nil {
			return st, fmt.Errorf("region %d: %w", i, err)
		}
	}
	return st, nil
}

// Load fills every region from the image buffer bufs[i] of im (same size),
// each chunk checked: on the GPU once all are loaded where the image leaves
// the check to its caller (image.Image.HashCheckedByCaller), else by the
// image reader before it reaches the GPU.
func Load(regions []Region, im *image.Image, bufs []int, opts Options) error {
	readers, closeAll, err := openReaders(regions, im, bufs)
	if err != nil {
		return err
	}
	defer closeAll()
	chunk := int(im.Manifest().GetChunkSize())
	var check func(vas []uint64) error
	if im.HashCheckedByCaller() {
		// Every chunk, once on the GPU, is hashed there and compared with
		// the image: one check that covers storage, host memory and PCIe.
		check = func(vas []uint64) error {
			hashes, err := hashAll(regions, vas, chunk)
			if err != nil {
				return err
			}
			for i, r := range regions {
				if err := compareHashes(r, hashes[i], readers[i], im, bufs[i]); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return run(regions, chunk, opts, steps{after: check, toGPU: fromImage(readers, opts)})
}

// openReaders opens the image buffer bufs[i] of im for each region i, of
// its size; closeAll closes them. On an error nothing stays open.
func openReaders(regions []Region, im *image.Image, bufs []int) (readers []*image.BufferReader, closeAll func(), err error) {
	if len(bufs) != len(regions) {
		return nil, nil, fmt.Errorf("%d regions but %d image buffers", len(regions), len(bufs))
	}
	readers = make([]*image.BufferReader, len(regions))
	closeAll = func() {
		for _, br := range readers {
			if br != nil {
				br.Close()
			}
		}
	}
	for i, bi := range bufs {
		br, err := im.OpenBuffer(bi)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		readers[i] = br
		if uint64(br.Size()) != regions[i].Size {
			closeAll()
			return nil, nil, fmt.Errorf("region %d (0x%x): %d bytes, image buffer %d has %d", i, regions[i].Address,
				regions[i].Size, bi, br.Size())
		}
	}
	return readers, closeAll, nil
}

// fromImage is a load's toGPU step: each piece's bytes from its region's
// image buffer (with the injected faults of opts).
func fromImage(readers []*image.BufferReader, opts Options) func(p piece, buf []byte) error {
	return func(p piece, buf []byte) error {
		if _, err := readers[p.r].ReadAt(buf, int64(p.off)); err != nil {
			return err
		}
		if opts.stagingFault != nil {
			opts.stagingFault(p.r, p.index, buf)
		}
		if opts.PieceDelay > 0 {
			time.Sleep(opts.PieceDelay)
		}
		return nil
	}
}

// compareHashes compares region r's chunk hashes, as the GPU computed them
// after loading, with those of its image buffer buf: the first that differs
// is an image.ChunkError wrapping image.ErrCorrupt.
func compareHashes(r Region, got [][16]byte, br *image.BufferReader, im *image.Image, buf int) error {
	want := br.ChunkHashes()
	for ci, h := range got {
		if h != want[ci] {
			return &image.ChunkError{Image: im.Dir(), Buffer: buf, Address: r.Address, Chunk: ci, File: im.ChunkFile(buf, ci),
				Err: fmt.Errorf("%w: the chunk hashes to %x on the GPU after loading, the image says %x", image.ErrCorrupt, h, want[ci])}
		}
	}
	return nil
}

package engine

// Copy-on-write windows: the other way a concurrent checkpoint lets the
// application run on while its memory is saved, for the buffers a snapshot
// has no room for. At the quiesce point every chunk is hashed on its GPU;
// the chunks the image already has (zero, met earlier, in the parent chain)
// are recorded at once, and the rest are "pending". The application then
// runs, and its interposer, before each call that may write into a pending
// chunk (its write set: the buffers a launch's parameters point into, a
// copy's or memset's destination), asks the helper to save those chunks
// first (Guard.Save) and waits. Meanwhile Guard.Run saves every other
// pending chunk, in the background.
//
// A write the interposer cannot see (a kernel storing through a pointer it
// loaded from memory) would put later bytes into the image. So every chunk
// is saved through device staging: copied device-to-device, hashed there,
// compared with its hash from the quiesce point, and only then copied to
// the host from that staging. The bytes written are the bytes hashed; a
// chunk whose hash changed is not written, and the window ends with a
// ChangedError once every other chunk is saved: the image is exact or it
// is not made, never silently wrong. What was saved is kept for the
// checkpoint taken again (image.Writer.AbortSalvage): it copies only the
// chunks that changed.

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpucr/gpucr/image"
)

// ChangedError is a window's chunks that no longer held what they held at
// the quiesce point when they were saved, though no call the interposer saw
// wrote them: something wrote them behind the window's back. Pid, Address,
// Chunk and Offset name the first one found.
type ChangedError struct {
	Pid     int
	Address uint64 // the region's, as the application sees it
	Chunk   int
	Offset  uint64
	// Chunks and Bytes are all the window's changed chunks.
	Chunks int
	Bytes  uint64
}

func (e *ChangedError) Error() string {
	all := ""
	if e.Chunks > 1 {
		all = fmt.Sprintf(" (%d chunks, %d bytes, in all)", e.Chunks, e.Bytes)
	}
	return fmt.Sprintf("pid %d: chunk %d (offset %d) of the buffer at 0x%x changed while it was saved%s, by a write "+
		"the interposer did not see (a kernel storing through a pointer it read from memory?)", e.Pid, e.Chunk,
		e.Offset, e.Address, all)
}

// ErrGuardClosed is Save's answer once the window has ended (all saved, or
// failed): the caller may write.
var ErrGuardClosed = errors.New("the copy-on-write window is closed")

// guardLanes is how many batches of one device a guard saves at once, and
// guardBatch the chunks of a batch (hashed in one launch): each lane needs
// a batch of device staging and of pinned host memory.
const (
	guardLanes = 8
	guardBatch = 4
)

// gjob is one chunk to save: region r, chunk ci.
type gjob struct{ r, ci int }

// stagingGranule rounds a staging's size: device memory is made in
// multiples of the device's granularity, 2 MiB on every GPU gpucr supports
// and on the simulated driver.
const stagingGranule = 2 << 20

const (
	chunkPending = iota
	chunkSaving
	chunkDone
)

// Guard is one copy-on-write window over regions whose memory stays where
// it is, in use by the application.
type Guard struct {
	regions []Region
	chunk   int
	vas     []uint64
	hashes  [][][16]byte
	bws     []*image.BufferWriter

	mu       sync.Mutex
	cond     *sync.Cond
	state    [][]uint8
	pending  int           // chunks not done
	changed  *ChangedError // chunks found changed (done, not written), nil: none
	err      error         // the first failure; the window is over
	closed   bool          // every chunk saved, or failed
	inflight int           // batches being saved

	// Hash is the time hashing took at the quiesce point; Pending the
	// bytes left to save when the window opened.
	Hash    time.Duration
	Pending uint64

	saved                atomic.Int64 // chunks saved through Save, ahead of the background
	copied, copiedBytes  atomic.Int64
	done                 atomic.Int64 // bytes recorded or saved, for progress
	progress, copiedHook func(int64)

	stMu     sync.Mutex
	released bool                  // Release ran: no staging is handed out any more
	stagings map[GPU]chan *staging // idle ones
	made     map[GPU]int
	all      []*staging
}

// GuardStats says what a window did.
type GuardStats struct {
	Chunks      int    // chunks of all regions
	Copied      int    // chunks copied to the host
	BytesCopied uint64 // their bytes
	Asked       int    // of those, the chunks saved ahead of the background because a call was about to write them
	Changed     int    // chunks not written: changed behind the window's back
}

// OpenGuard adds every region to w as a buffer (in order), hashes every
// chunk on its GPU and records those w needs no bytes for. The regions must
// not change meanwhile: the application is quiesced and drained. Run saves
// the rest; Save saves some first.
func OpenGuard(regions []Region, w *image.Writer, chunk int, opts Options) (*Guard, error) {
	g := &Guard{regions: regions, chunk: chunk, vas: make([]uint64, len(regions)),
		bws: make([]*image.BufferWriter, len(regions)), state: make([][]uint8, len(regions)),
		progress: opts.Progress, copiedHook: opts.Copied}
	g.cond = sync.NewCond(&g.mu)
	for i, r := range regions {
		bw, err := w.AddBuffer(image.BufferInfo{Pid: r.Pid, NsPid: r.NsPid, Device: r.Device.Ordinal(), GPUUUID: r.Device.UUID(),
			Address: r.Address, Size: r.Size, Kind: r.Kind, Flags: r.Flags})
		if err != nil {
			return nil, fmt.Errorf("region %d: %w", i, err)
		}
		g.bws[i] = bw
		if g.vas[i], err = r.Device.Map(r.Handle, r.Size); err != nil {
			return nil, fmt.Errorf("region 0x%x (pid %d): %w", r.Address, r.Pid, err)
		}
	}
	t := time.Now()
	hashes, err := hashAll(regions, g.vas, chunk)
	g.Hash = time.Since(t)
	if err != nil {
		return nil, err
	}
	g.hashes = hashes
	var done int64
	for i, r := range regions {
		g.state[i] = make([]uint8, len(hashes[i]))
		for ci, h := range hashes[i] {
			known, err := g.bws[i].RecordChunk(ci, h)
			if err != nil {
				return nil, fmt.Errorf("region 0x%x: %w", r.Address, err)
			}
			if known {
				g.state[i][ci] = chunkDone
				done += int64(g.chunkLen(i, ci))
				continue
			}
			g.pending++
			g.Pending += uint64(g.chunkLen(i, ci))
		}
	}
	g.done.Store(done)
	if g.progress != nil {
		g.progress(done)
	}
	g.stagings, g.made = map[GPU]chan *staging{}, map[GPU]int{}
	return g, nil
}

func (g *Guard) chunkLen(r, ci int) int {
	off := uint64(ci) * uint64(g.chunk)
	return int(min(uint64(g.chunk), g.regions[r].Size-off))
}

// PendingChunks is, for each region, one flag per chunk: true while the
// chunk still has to be saved (what the interposer must guard).
func (g *Guard) PendingChunks() [][]bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([][]bool, len(g.state))
	for i, st := range g.state {
		out[i] = make([]bool, len(st))
		for ci, s := range st {
			out[i][ci] = s != chunkDone
		}
	}
	return out
}

// PendingBytes is what the window still has to save.
func (g *Guard) PendingBytes() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var n uint64
	for i, st := range g.state {
		for ci, c := range st {
			if c != chunkDone {
				n += uint64(g.chunkLen(i, ci))
			}
		}
	}
	return n
}

// Regions are the guarded regions, in the order of PendingChunks.
func (g *Guard) Regions() []Region { return g.regions }

// ChunkSize is the chunk the window tracks.
func (g *Guard) ChunkSize() int { return g.chunk }

// AddrRange is a range of the application's addresses.
type AddrRange struct{ Addr, Size uint64 }

// Save saves the pending chunks of pid's regions that overlap ranges (the
// application's addresses) before it returns, waiting for those already
// being saved. It returns nil once they are in the image, or
// ErrGuardClosed, or the window's failure: either way the caller's write
// may go ahead (a failed window's image is not committed).
func (g *Guard) Save(pid int, ranges []AddrRange) error {
	// The chunks the ranges overlap: those pending are ours to save, the
	// rest may be on their way (Run, another Save) and are waited for.
	var mine, touched []gjob
	g.mu.Lock()
	for _, ar := range ranges {
		for i, r := range g.regions {
			if r.Pid != pid || ar.Size == 0 || ar.Addr >= r.Address+r.Size || ar.Addr+ar.Size <= r.Address {
				continue
			}
			lo := max(ar.Addr, r.Address) - r.Address
			hi := min(ar.Addr+ar.Size, r.Address+r.Size) - r.Address
			for ci := int(lo / uint64(g.chunk)); uint64(ci)*uint64(g.chunk) < hi; ci++ {
				touched = append(touched, gjob{i, ci})
				if g.state[i][ci] == chunkPending {
					g.state[i][ci] = chunkSaving
					mine = append(mine, gjob{i, ci})
				}
			}
		}
	}
	g.mu.Unlock()
	// Ours, in batches of a device's chunks, several batches at once (one
	// chunk at a time left the copy engines idle while each was hashed and
	// written: about 0.5 GB/s for a 256 MB tensor on an H200).
	var batches [][]gjob
	byDev := map[GPU][]gjob{}
	for _, j := range mine {
		d := g.regions[j.r].Device
		byDev[d] = append(byDev[d], j)
	}
	for _, js := range byDev {
		for len(js) > 0 {
			n := min(len(js), guardBatch)
			batches = append(batches, js[:n])
			js = js[n:]
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, min(len(batches), guardLanes))
	for w := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1)) - 1
				if k >= len(batches) {
					return
				}
				changed, err := g.saveBatch(batches[k])
				g.finishBatch(batches[k], changed, err)
				if err == nil {
					g.saved.Add(int64(len(batches[k]) - len(changed)))
				} else if errs[w] == nil {
					errs[w] = err
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Then wait for the others being saved.
	g.mu.Lock()
	defer g.mu.Unlock()
	for k := 0; k < len(touched); {
		switch {
		case g.err != nil:
			return g.err
		case g.state[touched[k].r][touched[k].ci] == chunkDone:
			k++
		default:
			g.cond.Wait()
		}
	}
	if g.closed {
		return ErrGuardClosed
	}
	return nil
}

// finishBatch marks each chunk of js done (saved, or changed: js[k] for
// each k of changed), or the window failed.
func (g *Guard) finishBatch(js []gjob, changed []int, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.failLocked(err) // chunks no one will save: nobody waits for them any longer
		return
	}
	for _, k := range changed {
		j := js[k]
		reg := g.regions[j.r]
		if g.changed == nil {
			g.changed = &ChangedError{Pid: reg.Pid, Address: reg.Address, Chunk: j.ci, Offset: uint64(j.ci) * uint64(g.chunk)}
		}
		g.changed.Chunks++
		g.changed.Bytes += uint64(g.chunkLen(j.r, j.ci))
	}
	for _, j := range js {
		g.state[j.r][j.ci] = chunkDone
		g.pending--
	}
	if g.pending == 0 {
		g.closed = true
	}
	g.cond.Broadcast()
}

// staging is one lane and one chunk of device memory of its device.
type staging struct {
	dev  GPU
	lane Lane
	h    uint64 // scratch handle
	va   uint64
}

// saveBatch saves chunks of one device (at most guardBatch) through a
// staging of that device: device-to-device, hashed there in one launch,
// compared with their hashes from the stop, then to the host and the image.
// changed are the chunks (indices into js) not written because their hash
// is no longer the stop's.
func (g *Guard) saveBatch(js []gjob) (changed []int, err error) {
	// Counted in flight: Run returns, and Release frees the stagings, only
	// once none is (a failed window ends while others still copy).
	g.mu.Lock()
	g.inflight++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inflight--
		g.cond.Broadcast()
		g.mu.Unlock()
	}()
	dev := g.regions[js[0].r].Device
	st, err := g.takeStaging(dev)
	if err != nil {
		return nil, err
	}
	copyErr := st.each(js, func(k int, j gjob) error {
		off := uint64(j.ci) * uint64(g.chunk)
		return st.lane.StartDtoD(st.va+uint64(k)*uint64(g.chunk), g.vas[j.r]+off, uint64(g.chunkLen(j.r, j.ci)))
	})
	if copyErr != nil {
		g.dropStaging(st)
		return nil, fmt.Errorf("device %s: copy to staging: %w", dev.UUID(), copyErr)
	}
	ranges := make([]Range, len(js))
	for k, j := range js {
		ranges[k] = Range{VA: st.va + uint64(k)*uint64(g.chunk), Size: uint64(g.chunkLen(j.r, j.ci))}
	}
	hs, err := dev.HashRanges(ranges, g.chunk)
	if err != nil {
		g.dropStaging(st)
		return nil, fmt.Errorf("device %s: hash on the GPU: %w", dev.UUID(), err)
	}
	for k, j := range js {
		if hs[k][0] != g.hashes[j.r][j.ci] {
			changed = append(changed, k)
		}
	}
	if len(changed) == len(js) {
		g.giveStaging(st)
		return changed, nil
	}
	buf := st.lane.Staging()
	copyErr = st.each(js, func(k int, j gjob) error {
		return st.lane.StartDtoH(buf[k*g.chunk:k*g.chunk+g.chunkLen(j.r, j.ci)], st.va+uint64(k)*uint64(g.chunk))
	})
	if copyErr != nil {
		g.dropStaging(st)
		return nil, fmt.Errorf("device %s: copy to the host: %w", dev.UUID(), copyErr)
	}
	var werr error
	for k, j := range js {
		if slices.Contains(changed, k) {
			continue
		}
		n := g.chunkLen(j.r, j.ci)
		if werr = g.bws[j.r].WriteChunkHashed(j.ci, buf[k*g.chunk:k*g.chunk+n], g.hashes[j.r][j.ci]); werr != nil {
			break
		}
		g.copied.Add(1)
		g.copiedBytes.Add(int64(n))
		if g.copiedHook != nil {
			g.copiedHook(int64(n))
		}
		if done := g.done.Add(int64(n)); g.progress != nil {
			g.progress(done)
		}
	}
	g.giveStaging(st)
	return changed, werr
}

// each queues start(k, js[k]) for every chunk of a batch on the staging's
// lane, then waits for them all.
func (st *staging) each(js []gjob, start func(k int, j gjob) error) error {
	var err error
	if derr := st.lane.Do(func() {
		for k, j := range js {
			if err = start(k, j); err != nil {
				return
			}
		}
		err = st.lane.Sync()
	}); derr != nil {
		return derr
	}
	return err
}

// takeStaging returns an idle staging of dev, making one while dev has
// fewer than guardLanes, else waiting for one.
func (g *Guard) takeStaging(dev GPU) (*staging, error) {
	g.stMu.Lock()
	if g.released {
		g.stMu.Unlock()
		return nil, ErrGuardClosed
	}
	ch := g.stagings[dev]
	if ch == nil {
		// Room for every staging and for the nils dropStaging sends.
		ch = make(chan *staging, 4*guardLanes)
		g.stagings[dev] = ch
	}
	select {
	case st := <-ch:
		if st != nil {
			g.stMu.Unlock()
			return st, nil
		}
	default:
	}
	if g.made[dev] >= guardLanes {
		g.stMu.Unlock()
		if st := <-ch; st != nil {
			return st, nil
		}
		return g.takeStaging(dev) // one was dropped: make its successor
	}
	g.made[dev]++
	g.stMu.Unlock()
	st, err := newStaging(dev, g.chunk)
	if err != nil {
		g.stMu.Lock()
		g.made[dev]--
		g.stMu.Unlock()
		return nil, err
	}
	g.stMu.Lock()
	g.all = append(g.all, st)
	g.stMu.Unlock()
	return st, nil
}

func newStaging(dev GPU, chunk int) (*staging, error) {
	l, err := dev.AcquireLane(guardBatch * chunk)
	if err != nil {
		return nil, err
	}
	// Device memory comes in granules (2 MiB on the GPUs gpucr runs on).
	size := (uint64(guardBatch*chunk) + stagingGranule - 1) / stagingGranule * stagingGranule
	h, err := dev.CreateScratch(size)
	if err != nil {
		dev.ReleaseLane(l)
		return nil, fmt.Errorf("device %s: staging for a copy-on-write window: %w", dev.UUID(), err)
	}
	va, err := dev.Map(h, size)
	if err != nil {
		_ = dev.ReleaseScratch(h)
		dev.ReleaseLane(l)
		return nil, fmt.Errorf("device %s: staging view: %w", dev.UUID(), err)
	}
	return &staging{dev: dev, lane: l, h: h, va: va}, nil
}

func (g *Guard) giveStaging(st *staging) { g.stagings[st.dev] <- st }

// dropStaging gives back a staging whose lane failed: its lane is closed,
// and a new one is made in its place next time.
func (g *Guard) dropStaging(st *staging) {
	st.lane.Close()
	st.lane = nil
	g.stMu.Lock()
	g.made[st.dev]--
	ch := g.stagings[st.dev]
	g.stMu.Unlock()
	// A caller waiting for an idle staging would wait for this one forever:
	// it is told to make a new one (unless some other is idle for it).
	select {
	case ch <- nil:
	default:
	}
}

// Run saves every pending chunk (a few at once per device), then closes
// the buffers; it returns the window's first failure. Save calls made
// meanwhile are served too. Release afterwards.
func (g *Guard) Run() (GuardStats, error) {
	byDev := map[GPU][]gjob{}
	g.mu.Lock()
	for i, r := range g.regions {
		for ci := range g.state[i] {
			if g.state[i][ci] == chunkPending {
				byDev[r.Device] = append(byDev[r.Device], gjob{i, ci})
			}
		}
	}
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, jobs := range byDev {
		var mu sync.Mutex // the next of jobs
		next := 0
		for range guardLanes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					// Claim the next pending chunks, up to a batch (a Save
					// may have taken some already).
					var batch []gjob
					mu.Lock()
					g.mu.Lock()
					for next < len(jobs) && len(batch) < guardBatch && g.err == nil {
						j := jobs[next]
						next++
						if g.state[j.r][j.ci] == chunkPending {
							g.state[j.r][j.ci] = chunkSaving
							batch = append(batch, j)
						}
					}
					g.mu.Unlock()
					mu.Unlock()
					if len(batch) == 0 {
						return
					}
					changed, err := g.saveBatch(batch)
					g.finishBatch(batch, changed, err)
				}
			}()
		}
	}
	wg.Wait()
	// Chunks a Save claimed may still be in flight.
	g.mu.Lock()
	for (g.err == nil && g.pending > 0) || g.inflight > 0 {
		g.cond.Wait()
	}
	err := g.err
	if err == nil && g.changed != nil {
		err = g.changed
	}
	g.closed = true
	g.cond.Broadcast()
	g.mu.Unlock()
	st := g.stats()
	if err != nil {
		return st, err
	}
	for i, bw := range g.bws {
		if err := bw.Close(); err != nil {
			return st, fmt.Errorf("region %d: %w", i, err)
		}
	}
	return st, nil
}

// Fail ends the window with err (the checkpoint was given up): Save calls
// return at once and Run stops.
func (g *Guard) Fail(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failLocked(err)
}

func (g *Guard) failLocked(err error) {
	if g.err == nil {
		g.err = err
	}
	g.closed = true
	g.cond.Broadcast()
}

func (g *Guard) stats() GuardStats {
	st := GuardStats{Copied: int(g.copied.Load()), BytesCopied: uint64(g.copiedBytes.Load()), Asked: int(g.saved.Load())}
	g.mu.Lock()
	if g.changed != nil {
		st.Changed = g.changed.Chunks
	}
	g.mu.Unlock()
	for _, hs := range g.hashes {
		st.Chunks += len(hs)
	}
	return st
}

// Release frees the window's device staging and lanes (after Run).
func (g *Guard) Release() {
	g.mu.Lock()
	for g.inflight > 0 {
		g.cond.Wait() // a Save's batch that began before the window failed
	}
	g.mu.Unlock()
	g.stMu.Lock()
	g.released = true
	all := g.all
	g.all = nil
	g.stMu.Unlock()
	for _, st := range all {
		if st.lane != nil {
			st.dev.ReleaseLane(st.lane)
		}
		_ = st.dev.ReleaseScratch(st.h)
	}
}

package engine

// Snapshots: the copy a concurrent checkpoint takes of the application's
// memory while it is stopped. Device-to-device, each region into scratch
// memory of its own device, at the device's memory bandwidth (about 1.5
// TB/s on an H100: a few milliseconds for 8 GB instead of a second over
// PCIe); the application then runs on while Dump copies the snapshot into
// the image. A snapshot needs as much free device memory as the regions it
// holds: a region there is no room for (beyond the reserve the application
// keeps) is left to the caller, who copies it the stop-the-world way.

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/gpucr/gpucr/helper/cuda"
	"github.com/gpucr/gpucr/image"
)

// SnapshotOptions tune TakeSnapshot.
type SnapshotOptions struct {
	// Reserve is the device memory a snapshot leaves free on each device:
	// the application runs on while the snapshot exists and may allocate.
	Reserve uint64
	// Scratch, if set, is memory made for the snapshot ahead of the stop
	// (PrepareScratch): a region finds its own there, and only the rest is
	// made at the stop. What the snapshot takes is no longer Scratch's.
	Scratch *Scratch
}

// Scratch is snapshot memory made while the application still runs, so
// that the stop does not pay for making it (about 0.2 ms per buffer on an
// H200, 25-30 ms for 32 GB in 129 buffers), keyed by the allocation each
// piece is for.
type Scratch struct {
	mu    sync.Mutex
	by    map[scratchKey]uint64 // scratch handle
	Bytes uint64
}

type scratchKey struct {
	dev    GPU
	handle uint64
	size   uint64
}

// PrepareScratch makes scratch memory for as many of regions (only Device,
// Handle and Size matter) as fit beyond opts.Reserve, with the helper's
// views of both; Release frees what a snapshot did not take. A region
// that cannot have scratch now is left to TakeSnapshot.
func PrepareScratch(regions []Region, opts SnapshotOptions) (*Scratch, error) {
	s := &Scratch{by: map[scratchKey]uint64{}}
	rooms := map[GPU]*room{}
	for _, r := range regions {
		rm := rooms[r.Device]
		if rm == nil {
			rm = &room{dev: r.Device, reserve: opts.Reserve}
			rooms[r.Device] = rm
		}
		h, ok, err := rm.make(r.Size)
		if err != nil {
			s.Release()
			return nil, err
		}
		if !ok {
			continue
		}
		s.by[scratchKey{r.Device, r.Handle, r.Size}] = h
		s.Bytes += r.Size
		// both views now: the stop maps nothing
		if _, err := r.Device.Map(h, r.Size); err != nil {
			s.Release()
			return nil, fmt.Errorf("device %s: snapshot view: %w", r.Device.UUID(), err)
		}
		if _, err := r.Device.Map(r.Handle, r.Size); err != nil {
			s.Release()
			return nil, fmt.Errorf("region 0x%x (pid %d): %w", r.Address, r.Pid, err)
		}
	}
	return s, nil
}

// room makes scratch memory on one device within what was free there,
// less a reserve, when it was first asked.
type room struct {
	dev     GPU
	reserve uint64
	left    uint64
	known   bool // left is set
}

// make returns new scratch memory of size bytes, or false where there is no
// room for it (after the driver once finds the device full, for nothing
// more).
func (m *room) make(size uint64) (uint64, bool, error) {
	if !m.known {
		free, _, err := m.dev.MemInfo()
		if err != nil {
			return 0, false, fmt.Errorf("device %s: free memory: %w", m.dev.UUID(), err)
		}
		if free > m.reserve {
			m.left = free - m.reserve
		}
		m.known = true
	}
	if size > m.left {
		return 0, false, nil
	}
	h, err := m.dev.CreateScratch(size)
	if IsOutOfMemory(err) {
		m.left = 0 // the driver knows better than MemInfo did
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("device %s: scratch memory for a snapshot (%d bytes): %w", m.dev.UUID(), size, err)
	}
	m.left -= size
	return h, true, nil
}

// take hands the scratch made for r over to a snapshot (0, false: none).
func (s *Scratch) take(r Region) (uint64, bool) {
	if s == nil {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := scratchKey{r.Device, r.Handle, r.Size}
	h, ok := s.by[k]
	if ok {
		delete(s.by, k)
		s.Bytes -= r.Size
	}
	return h, ok
}

// Release frees the scratch no snapshot took.
func (s *Scratch) Release() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, h := range s.by {
		_ = k.dev.ReleaseScratch(h)
	}
	s.by, s.Bytes = map[scratchKey]uint64{}, 0
}

// Snapshot is a copy of regions made device-to-device at one moment.
type Snapshot struct {
	// Copies are the snapshotted regions: each as the application sees it
	// (address, size, kind, pid), with Handle the scratch memory that holds
	// the copy. Dump them into the image; then Release.
	Copies []Region
	// Rest are the regions there was no room for, unchanged: the caller
	// copies them before the application runs on.
	Rest []Region
	// Bytes is the scratch memory the copies hold.
	Bytes uint64
	// Alloc is the time spent making the scratch memory and its views,
	// Copy the device-to-device copies (the slowest device's).
	Alloc, Copy time.Duration
}

// snapshotStreams is how many streams (copy lanes) of a device share its
// snapshot's copies: one stream leaves a device's copy bandwidth unused.
const snapshotStreams = 4

// TakeSnapshot copies as many regions as fit (each device's free memory
// less opts.Reserve, regions in order) into new scratch memory of their
// device, the devices at once, and waits for the copies. The regions must
// not change meanwhile (the application is quiesced and drained). On error
// nothing is held.
func TakeSnapshot(regions []Region, opts SnapshotOptions) (*Snapshot, error) {
	byDev := map[GPU][]int{}
	var devs []GPU
	for i, r := range regions {
		if byDev[r.Device] == nil {
			devs = append(devs, r.Device)
		}
		byDev[r.Device] = append(byDev[r.Device], i)
	}
	snapped := make([]uint64, len(regions)) // scratch handle + 1; 0: not snapshotted
	var wg sync.WaitGroup
	errs := make([]error, len(devs))
	times := make([][2]time.Duration, len(devs))
	for k, dev := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			times[k], errs[k] = snapshotDevice(dev, regions, byDev[dev], opts, snapped)
		}()
	}
	wg.Wait()
	s := &Snapshot{}
	for _, t := range times {
		s.Alloc, s.Copy = max(s.Alloc, t[0]), max(s.Copy, t[1])
	}
	for i, r := range regions {
		if snapped[i] == 0 {
			s.Rest = append(s.Rest, r)
			continue
		}
		c := r
		c.Handle = snapped[i] - 1
		s.Copies = append(s.Copies, c)
		s.Bytes += r.Size
	}
	if err := errors.Join(errs...); err != nil {
		s.Release()
		return nil, err
	}
	return s, nil
}

// snapshotDevice snapshots the regions idx of one device (all on dev),
// recording each scratch handle (+1) in snapped[i]; it returns the time its
// allocations and its copies took.
func snapshotDevice(dev GPU, regions []Region, idx []int, opts SnapshotOptions, snapped []uint64) ([2]time.Duration, error) {
	var took [2]time.Duration
	t0 := time.Now()
	rm := &room{dev: dev, reserve: opts.Reserve} // for regions without scratch made ahead
	type pair struct{ src, dst uint64 }
	var copies []pair
	var sizes []uint64
	for _, i := range idx {
		r := regions[i]
		h, ok := opts.Scratch.take(r)
		if !ok {
			var err error
			if h, ok, err = rm.make(r.Size); err != nil {
				return took, err
			}
			if !ok {
				continue
			}
		}
		snapped[i] = h + 1
		src, err := dev.Map(r.Handle, r.Size)
		if err != nil {
			return took, fmt.Errorf("region 0x%x (pid %d): %w", r.Address, r.Pid, err)
		}
		dst, err := dev.Map(h, r.Size)
		if err != nil {
			return took, fmt.Errorf("device %s: snapshot view: %w", dev.UUID(), err)
		}
		copies = append(copies, pair{src, dst})
		sizes = append(sizes, r.Size)
	}
	took[0] = time.Since(t0)
	if len(copies) == 0 {
		return took, nil
	}
	t1 := time.Now()
	// The copies go to a few streams at once, each its share by bytes
	// (largest first, to the least loaded stream).
	n := min(snapshotStreams, len(copies))
	share := make([][]int, n)
	load := make([]uint64, n)
	order := make([]int, len(copies))
	for k := range order {
		order[k] = k
	}
	sort.Slice(order, func(a, b int) bool { return sizes[order[a]] > sizes[order[b]] })
	for _, k := range order {
		j := 0
		for x := 1; x < n; x++ {
			if load[x] < load[j] {
				j = x
			}
		}
		share[j] = append(share[j], k)
		load[j] += sizes[k]
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for j := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := dev.AcquireLane(LaneStaging(image.DefaultChunkSize))
			if err != nil {
				errs[j] = err
				return
			}
			var copyErr error
			if err := l.Do(func() {
				for _, k := range share[j] {
					if copyErr = l.StartDtoD(copies[k].dst, copies[k].src, sizes[k]); copyErr != nil {
						return
					}
				}
				copyErr = l.Sync()
			}); err != nil {
				copyErr = err
			}
			if copyErr != nil {
				l.Close()
				errs[j] = copyErr
				return
			}
			dev.ReleaseLane(l)
		}()
	}
	wg.Wait()
	took[1] = time.Since(t1)
	if err := errors.Join(errs...); err != nil {
		return took, fmt.Errorf("device %s: snapshot copy: %w", dev.UUID(), err)
	}
	return took, nil
}

// Release frees the scratch memory; the first error is returned, every copy
// released all the same.
func (s *Snapshot) Release() error {
	var first error
	for _, c := range s.Copies {
		if err := c.Device.ReleaseScratch(c.Handle); err != nil && first == nil {
			first = fmt.Errorf("device %s: release snapshot memory: %w", c.Device.UUID(), err)
		}
	}
	s.Copies, s.Bytes = nil, 0
	return first
}

// OutOfMemory marks a device's out-of-memory error.
type OutOfMemory interface{ OutOfMemory() bool }

// IsOutOfMemory says whether err is the device's CUDA_ERROR_OUT_OF_MEMORY.
func IsOutOfMemory(err error) bool {
	if err == nil {
		return false
	}
	var oom OutOfMemory
	return cuda.IsOutOfMemory(err) || errors.As(err, &oom) && oom.OutOfMemory()
}

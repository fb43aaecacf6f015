package engine

// An on-demand load: the restored process runs while its memory loads, and
// what it waits for goes first.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gpucr/gpucr/image"
)

// Loading is a load of regions from an image that runs in the background
// and can be asked for some regions first (Need). A region counts as loaded
// once every chunk of it is on the GPU and checked (hashed there and
// compared with the image, or checked by the image reader): nothing of a
// region is handed out before all of it is, since a kernel given a pointer
// into a region may read any of it.
type Loading struct {
	regions []Region
	chunk   uint64        // the image's chunk size
	done    chan struct{} // closed when the load has ended
	err     error         // its result; read after done

	mu     sync.Mutex
	queue  map[GPU][]int   // per device, the regions still to hand out, in order
	next   map[GPU]int     // per device, the next chunk of its queue's head
	left   []int           // per region, chunks not done yet
	ready  []chan struct{} // per region, closed once it is loaded
	handed []int           // per region, chunks handed to a lane
	total  []int           // per region, its chunks
	gone   []bool          // per region, abandoned: nothing more of it is handed out
}

// LoadOrder is the order an on-demand load takes the regions in: those
// with a touch rank (the order their process first touched them after its
// previous restore) by rank, then the rest smallest first, which unblocks
// the most launches per byte.
func LoadOrder(regions []Region, rank []uint32) []int {
	idx := make([]int, len(regions))
	for i := range idx {
		idx[i] = i
	}
	rk := func(i int) uint32 {
		if i < len(rank) && rank[i] > 0 {
			return rank[i]
		}
		return ^uint32(0)
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		return cmp.Or(cmp.Compare(rk(a), rk(b)), cmp.Compare(regions[a].Size, regions[b].Size))
	})
	return idx
}

// StartLoad starts filling every region from the image buffer bufs[i] of im
// in the background, in order (region indices; LoadOrder), each region
// checked once all of it is on the GPU. im stays open until Done.
func StartLoad(regions []Region, im *image.Image, bufs []int, order []int, opts Options) (*Loading, error) {
	if len(order) != len(regions) {
		return nil, fmt.Errorf("%d regions but an order of %d", len(regions), len(order))
	}
	readers, closeAll, err := openReaders(regions, im, bufs)
	if err != nil {
		return nil, err
	}
	chunk := int(im.Manifest().GetChunkSize())
	l := &Loading{regions: regions, chunk: uint64(chunk), done: make(chan struct{}), queue: map[GPU][]int{}, next: map[GPU]int{},
		left: make([]int, len(regions)), ready: make([]chan struct{}, len(regions)), handed: make([]int, len(regions)),
		total: make([]int, len(regions)), gone: make([]bool, len(regions))}
	for _, i := range order {
		r := regions[i]
		l.queue[r.Device] = append(l.queue[r.Device], i)
		l.left[i] = int((r.Size + uint64(chunk) - 1) / uint64(chunk))
		l.total[i] = l.left[i]
		l.ready[i] = make(chan struct{})
	}
	// Regions with nothing to load (size 0) are loaded now.
	for i := range regions {
		if l.left[i] == 0 {
			close(l.ready[i])
		}
	}
	var vas []uint64
	verify := make(chan int, len(regions))
	var verr error
	var vwg sync.WaitGroup
	vwg.Add(1)
	// One goroutine checks each region once its last chunk is in: hashed
	// on the GPU, where the image leaves the check to its reader's caller.
	go func() {
		defer vwg.Done()
		for i := range verify {
			if verr != nil {
				continue
			}
			if im.HashCheckedByCaller() {
				if err := checkRegion(regions[i], vas[i], readers[i], im, bufs[i], i, chunk); err != nil {
					verr = err
					continue
				}
			}
			close(l.ready[i])
		}
	}()
	st := steps{
		before: func(v []uint64) error { vas = v; return nil },
		next:   l.nextPiece(chunk),
		toGPU:  fromImage(readers, opts),
		doneHook: func(p piece) {
			l.mu.Lock()
			l.left[p.r]--
			last := l.left[p.r] == 0
			l.mu.Unlock()
			if last {
				verify <- p.r
			}
		},
	}
	go func() {
		err := run(regions, chunk, opts, st)
		close(verify)
		vwg.Wait()
		closeAll()
		l.err = errors.Join(err, verr)
		close(l.done)
	}()
	return l, nil
}

// checkRegion hashes region i's chunks on its GPU and compares them with
// the image.
func checkRegion(r Region, va uint64, br *image.BufferReader, im *image.Image, buf, i, chunk int) error {
	hs, err := r.Device.HashRanges([]Range{{VA: va, Size: r.Size}}, chunk)
	if err != nil {
		return fmt.Errorf("region %d (0x%x): hash on the GPU: %w", i, r.Address, err)
	}
	return compareHashes(r, hs[0], br, im, buf)
}

// nextPiece hands out dev's pieces: the chunks of the region at the head
// of its queue, one after the other, then the next region's.
func (l *Loading) nextPiece(chunk int) func(dev GPU) (piece, bool) {
	return func(dev GPU) (piece, bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		for len(l.queue[dev]) > 0 {
			ri := l.queue[dev][0]
			ci := l.next[dev]
			off := uint64(ci) * uint64(chunk)
			if off < l.regions[ri].Size && !l.gone[ri] {
				l.next[dev] = ci + 1
				l.handed[ri]++
				return piece{r: ri, index: ci, off: off, n: int(min(uint64(chunk), l.regions[ri].Size-off))}, true
			}
			l.queue[dev] = l.queue[dev][1:]
			l.next[dev] = 0
		}
		return piece{}, false
	}
}

// Need waits until the regions idx are loaded, having moved those not yet
// handed out to the front of their device's queue (in the order given). It
// returns the load's error if it failed before they were all loaded.
func (l *Loading) Need(idx []int) error {
	l.mu.Lock()
	for k := len(idx) - 1; k >= 0; k-- {
		i := idx[k]
		if i < 0 || i >= len(l.regions) {
			continue
		}
		// The head may be partly handed out already: then it stays first.
		dev := l.regions[i].Device
		q := l.queue[dev]
		at := 1
		if l.next[dev] == 0 {
			at = 0
		}
		if p := slices.Index(q, i); p > at {
			copy(q[at+1:p+1], q[at:p])
			q[at] = i
		}
	}
	l.mu.Unlock()
	for _, i := range idx {
		if i < 0 || i >= len(l.regions) {
			continue
		}
		select {
		case <-l.ready[i]:
		case <-l.done:
			select {
			case <-l.ready[i]:
			default:
				if l.err != nil {
					return l.err
				}
				return fmt.Errorf("region %d (0x%x) was never loaded", i, l.regions[i].Address)
			}
		}
	}
	return nil
}

// Region is region i of the load; ChunkSize the image's chunk size (what
// a process's loading window counts its pending chunks in).
func (l *Loading) Region(i int) Region { return l.regions[i] }
func (l *Loading) ChunkSize() uint64   { return l.chunk }

// Loaded says whether region i is loaded.
func (l *Loading) Loaded(i int) bool {
	select {
	case <-l.ready[i]:
		return true
	default:
		return false
	}
}

// Abandon stops loading the regions idx (their process is gone) and
// returns once nothing of the load touches their memory any more: no chunk
// of theirs on its way to the GPU, none being checked. The other regions
// load on (a process tree's other processes).
func (l *Loading) Abandon(idx []int) {
	l.mu.Lock()
	for _, i := range idx {
		if i >= 0 && i < len(l.regions) {
			l.gone[i] = true
		}
	}
	l.mu.Unlock()
	for {
		busy := false
		l.mu.Lock()
		for _, i := range idx {
			if i < 0 || i >= len(l.regions) || l.handed[i] == 0 {
				continue
			}
			done := l.total[i] - l.left[i]
			// chunks still on their way, or all in and the check to come
			if done < l.handed[i] || (done == l.total[i] && !l.Loaded(i)) {
				busy = true
			}
		}
		l.mu.Unlock()
		if !busy {
			return
		}
		select {
		case <-l.done:
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Done is closed when the load has ended; Err is then its result.
func (l *Loading) Done() <-chan struct{} { return l.done }

// Err is the load's result, once Done is closed.
func (l *Loading) Err() error {
	<-l.done
	return l.err
}

package daemon

// The background half of concurrent checkpoints: the copy of a snapshot
// (engine.TakeSnapshot) into its image, which goes on after the process
// runs again, and the commit that must wait for it.
//
// An image's copies run one at a time, in the order their checkpoints
// queued them. Each seals its process's part of the image when it ends: a
// chunk a later process recorded by reference to an equal chunk of an
// earlier one is on disk by the time the later part is sealed.
//
// What a concurrent checkpoint gives up: between the process's drop and the
// end of its background copy, its memory lives only in this helper (the
// original, and the snapshot). Should the helper die then, its part of the
// image is not sealed yet, and the next helper tells the process that its
// GPU state is lost (adopt.go), where a stop-the-world checkpoint would give
// it back. Once the process has its memory back (leave-running), a helper
// that dies costs only the image being written; the previous image is not
// touched.

import (
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/image"
)

// background is the copies of one image still running.
type background struct {
	mu       sync.Mutex
	tail     chan struct{} // closed when the copy queued last has ended
	err      error         // the copies' errors so far
	trs      []*transfer   // their transfers: finished with the image's outcome
	settling chan struct{} // closed when the image is dropped: copies wait no longer
	once     sync.Once
}

// settle tells the copies that the image is being dropped.
func (b *background) settle() { b.once.Do(func() { close(b.settling) }) }

// backgrounds are the concurrent checkpoints' copies still running, by
// image. It has its own lock: nothing else is read or written with it.
type backgrounds struct {
	mu      sync.Mutex
	byImage map[*image.Writer]*background
}

// of returns w's background copies, made on first use.
func (bs *backgrounds) of(w *image.Writer) *background {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.byImage == nil {
		bs.byImage = map[*image.Writer]*background{}
	}
	b := bs.byImage[w]
	if b == nil {
		b = &background{settling: make(chan struct{})}
		bs.byImage[w] = b
	}
	return b
}

// take removes and returns w's background copies (nil: none).
func (bs *backgrounds) take(w *image.Writer) *background {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.byImage[w]
	delete(bs.byImage, w)
	return b
}

// has says whether w has background copies.
func (bs *backgrounds) has(w *image.Writer) bool {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.byImage[w] != nil
}

// add queues job after the copies queued before it; tr is its transfer.
func (b *background) add(tr *transfer, job func() error) {
	b.mu.Lock()
	prev := b.tail
	done := make(chan struct{})
	b.tail = done
	b.trs = append(b.trs, tr)
	b.mu.Unlock()
	go func() {
		defer close(done)
		if prev != nil {
			<-prev
		}
		err := job()
		b.mu.Lock()
		b.err = errors.Join(b.err, err)
		b.mu.Unlock()
	}()
}

// wait waits for every copy queued so far and returns their errors.
func (b *background) wait() error {
	b.mu.Lock()
	tail := b.tail
	b.mu.Unlock()
	if tail != nil {
		<-tail
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// finish ends the copies' transfers with the image's outcome.
func (b *background) finish(err error) {
	b.mu.Lock()
	trs := b.trs
	b.mu.Unlock()
	for _, tr := range trs {
		tr.finish(err)
	}
}

// settle ends the writing of w once its background copies have ended:
// commits it (an error of a copy aborts it instead), or, with abort, drops
// it at once (the copies still running then fail fast and end). The
// transfers of the copies finish with the outcome.
func (bs *backgrounds) settle(w *image.Writer, abort bool, salvage *salvages) error {
	b := bs.take(w)
	if abort {
		err := w.Abort()
		if b != nil {
			b.settle() // copies still waiting for their process need not
			_ = b.wait()
			b.finish(errors.New("the checkpoint failed: its GPU image is dropped"))
		}
		return err
	}
	var err error
	if b != nil {
		err = b.wait()
	}
	switch {
	case err == nil:
		err = w.Commit()
	case isChangedWindow(err):
		salvage.keep(w) // for the checkpoint taken again
	default:
		_ = w.Abort()
	}
	if b != nil {
		b.finish(err)
	}
	return err
}

// commitLater commits a deferred image whose copies still run once they
// end (CommitImage replies at once: the plugin's reply holds up CRIU, and
// CRIU the process).
func (s *Server) commitLater(w *image.Writer) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.Now()
		if err := s.bg.settle(w, false, s.salvage); err != nil {
			s.log.Error("the GPU image of a concurrent checkpoint could not be completed; it is dropped",
				zap.String("image", w.Dir()), zap.Error(err))
			return
		}
		s.log.Info("GPU image committed after its background copy", zap.String("image", w.Dir()),
			zap.Duration("waited", time.Since(t)))
	}()
}

// resumeWaitLimit bounds how long a background copy waits for its process
// to run again before it starts all the same.
const resumeWaitLimit = time.Minute

// untilRunning returns once cl runs again (or is gone), the image is
// dropped, the helper stops, or resumeWaitLimit has passed: a background
// copy starts then, so that it does not compete for PCIe, host memory and
// CPU with the driver's checkpoint and CRIU's dump, which the process waits
// for. (Its memory is no safer for an earlier start: it lives in the helper
// until it runs again either way.)
func (cl *client) untilRunning(settling, stopping <-chan struct{}) time.Duration {
	t := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(resumeWaitLimit)
	for {
		switch cl.lifeState() {
		case lifeRegistered, lifeUp, lifeGone:
			return time.Since(t)
		}
		select {
		case <-settling:
			return time.Since(t)
		case <-stopping:
			return time.Since(t)
		case <-limit:
			return time.Since(t)
		case <-tick.C:
		}
	}
}

// snapshotOOMWait bounds how long an allocation that finds its device full
// waits for concurrent checkpoints' snapshots on it to be written and freed.
const snapshotOOMWait = time.Minute

// snapshotHolds is the device memory concurrent checkpoints' snapshots hold,
// by device, so that an allocation that finds its device full waits for
// them (a snapshot lives until its background copy ends) instead of failing
// the application.
type snapshotHolds struct {
	mu      sync.Mutex
	bytes   map[engine.GPU]uint64
	changed chan struct{} // closed (and replaced) whenever a hold ends
}

// hold records the snapshot s; the returned function ends the hold.
func (h *snapshotHolds) hold(s *engine.Snapshot) func() {
	held := map[engine.GPU]uint64{}
	for _, c := range s.Copies {
		held[c.Device] += c.Size
	}
	h.mu.Lock()
	if h.bytes == nil {
		h.bytes = map[engine.GPU]uint64{}
	}
	for g, n := range held {
		h.bytes[g] += n
	}
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			for g, n := range held {
				if h.bytes[g] -= n; h.bytes[g] == 0 {
					delete(h.bytes, g)
				}
			}
			if h.changed != nil {
				close(h.changed)
				h.changed = nil
			}
		})
	}
}

// held is the memory snapshots hold on g.
func (h *snapshotHolds) held(g engine.GPU) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bytes[g]
}

// waitRelease waits (up to limit, or until stop) until a snapshot on g ends
// its hold: true if one did, false if none is held there or none ended.
func (h *snapshotHolds) waitRelease(g engine.GPU, limit time.Duration, stop <-chan struct{}) bool {
	h.mu.Lock()
	if g == nil || h.bytes[g] == 0 {
		h.mu.Unlock()
		return false
	}
	if h.changed == nil {
		h.changed = make(chan struct{})
	}
	ch := h.changed
	h.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-time.After(limit):
	case <-stop:
	}
	return false
}

package image

import "sync"

// budget bounds the bytes of chunk data a Writer holds (Options.MaxBuffered):
// BufferWriter.Write takes a chunk's worth before filling it, the worker that
// wrote the chunk gives it back. Write blocks while the budget is used up, so
// a producer faster than the storage waits instead of filling memory.
//
// It never blocks when nothing is queued for the workers: then the whole
// budget sits in partly filled chunks of open BufferWriters, which only their
// own Write or Close can submit, and waiting would deadlock a caller that
// interleaves more buffers than fit. Memory then exceeds MaxBuffered by at
// most one chunk per open BufferWriter.
type budget struct {
	mu     sync.Mutex
	cond   sync.Cond
	max    int64
	used   int64 // taken, not yet given back
	queued int64 // part of used that is submitted to the workers
	err    error // set once the write failed or was aborted: waiters give up
}

func newBudget(max int64) *budget {
	b := &budget{max: max}
	b.cond.L = &b.mu
	return b
}

// acquire takes n bytes, waiting while that would exceed the budget and
// workers still hold chunks that will come back.
func (b *budget) acquire(n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.err == nil && b.used+n > b.max && b.queued > 0 {
		b.cond.Wait()
	}
	if b.err != nil {
		return b.err
	}
	b.used += n
	return nil
}

// submit marks n taken bytes as handed to the workers.
func (b *budget) submit(n int64) {
	b.mu.Lock()
	b.queued += n
	b.mu.Unlock()
}

// release gives back n bytes; queued says whether they had been submitted.
func (b *budget) release(n int64, queued bool) {
	b.mu.Lock()
	b.used -= n
	if queued {
		b.queued -= n
	}
	b.mu.Unlock()
	b.cond.Broadcast()
}

// fail wakes every waiter with err; later acquires fail too.
func (b *budget) fail(err error) {
	b.mu.Lock()
	if b.err == nil {
		b.err = err
	}
	b.mu.Unlock()
	b.cond.Broadcast()
}

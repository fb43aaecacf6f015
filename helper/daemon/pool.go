package daemon

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/image"
)

// PoolConfig sizes the pool of allocations made ahead of time (pool).
// Budget 0 means no pool: every Alloc creates and exports on the spot.
// Other zero fields take the defaults.
type PoolConfig struct {
	Budget  uint64        // bytes the pool may hold per device
	MaxSize uint64        // the largest allocation it keeps ready (default DefaultPoolMaxSize)
	Depth   int           // allocations it keeps ready per size (default 2)
	Idle    time.Duration // a size not asked for this long loses its ready ones (default 10 s)
}

const DefaultPoolMaxSize = 64 << 20

// poolKey is what makes two allocations interchangeable.
type poolKey struct {
	dev   Device
	size  uint64
	flags image.AllocFlags
}

type pooled struct {
	h  uint64
	fd int
}

// pool keeps allocations created and exported ahead of time, so that an
// Alloc of a size a process keeps asking for is answered without the
// driver's cuMemCreate and export (tens of microseconds each on an H200 once
// the export keeper is there, keeper.go; off by default). A size becomes pooled once it is
// asked for twice within Idle; its ready allocations are refilled in the
// background after each one is taken, and released when the size has not
// been asked for within Idle, when a device runs out of memory (an
// allocation's or a restore's own creation always comes first: Server.create),
// and at Shutdown. The pool's
// memory is the helper's: a process's limit counts what it takes, not what
// waits here.
type pool struct {
	cfg PoolConfig
	log *zap.Logger

	mu      sync.Mutex
	ready   map[poolKey][]pooled
	filling map[poolKey]int // refills under way
	asked   map[poolKey][]time.Time
	bytes   map[Device]uint64 // ready and being made, per device
	closed  bool
	wg      sync.WaitGroup
}

func newPool(cfg PoolConfig, log *zap.Logger) *pool {
	if cfg.MaxSize == 0 {
		cfg.MaxSize = DefaultPoolMaxSize
	}
	if cfg.Depth <= 0 {
		cfg.Depth = 2
	}
	if cfg.Idle <= 0 {
		cfg.Idle = 10 * time.Second
	}
	return &pool{cfg: cfg, log: log, ready: map[poolKey][]pooled{}, filling: map[poolKey]int{},
		asked: map[poolKey][]time.Time{}, bytes: map[Device]uint64{}}
}

// take hands out a ready allocation of k, if there is one, and notes that k
// was asked for; the refill starts in the background.
func (p *pool) take(k poolKey) (h uint64, fd int, ok bool) {
	if p.cfg.Budget == 0 || k.size > p.cfg.MaxSize {
		return 0, -1, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	asked := append(p.asked[k], now)
	if len(asked) > 2 {
		asked = asked[len(asked)-2:]
	}
	p.asked[k] = asked
	if r := p.ready[k]; len(r) > 0 {
		e := r[len(r)-1]
		p.ready[k] = r[:len(r)-1]
		p.bytes[k.dev] -= k.size
		h, fd, ok = e.h, e.fd, true
	}
	if len(asked) == 2 && now.Sub(asked[0]) <= p.cfg.Idle {
		p.refillLocked(k)
	}
	return h, fd, ok
}

// refillLocked starts making allocations of k until Depth are ready or being
// made, within the device's budget.
func (p *pool) refillLocked(k poolKey) {
	for !p.closed && len(p.ready[k])+p.filling[k] < p.cfg.Depth && p.bytes[k.dev]+k.size <= p.cfg.Budget {
		p.filling[k]++
		p.bytes[k.dev] += k.size
		p.wg.Add(1)
		go p.make(k)
	}
}

func (p *pool) make(k poolKey) {
	defer p.wg.Done()
	h, err := k.dev.Create(k.size, k.flags)
	fd := -1
	if err == nil {
		if fd, err = k.dev.Export(h); err != nil {
			p.release(k.dev, h)
		}
	}
	p.mu.Lock()
	p.filling[k]--
	if err != nil || p.closed {
		p.bytes[k.dev] -= k.size
		p.mu.Unlock()
		if err != nil {
			p.log.Debug("allocation pool: could not make one ahead", zap.Uint64("size", k.size), zap.Error(err))
		} else {
			p.drop(k.dev, pooled{h, fd})
		}
		return
	}
	p.ready[k] = append(p.ready[k], pooled{h, fd})
	p.mu.Unlock()
}

func (p *pool) release(dev Device, h uint64) {
	if err := dev.Release(h); err != nil {
		p.log.Warn("allocation pool: release failed", zap.Error(err))
	}
}

func (p *pool) drop(dev Device, e pooled) {
	unix.Close(e.fd)
	p.release(dev, e.h)
}

// takeAll removes the ready allocations that match keep from the pool and
// returns them; called with mu held.
func (p *pool) takeAllLocked(keep func(poolKey) bool) map[poolKey][]pooled {
	out := map[poolKey][]pooled{}
	for k, r := range p.ready {
		if len(r) == 0 || !keep(k) {
			continue
		}
		out[k] = r
		delete(p.ready, k)
		p.bytes[k.dev] -= k.size * uint64(len(r))
	}
	return out
}

func (p *pool) dropAll(m map[poolKey][]pooled) (freed uint64) {
	for k, r := range m {
		for _, e := range r {
			p.drop(k.dev, e)
			freed += k.size
		}
	}
	return freed
}

// drain releases every ready allocation of dev (it ran out of memory);
// returns the bytes given back.
func (p *pool) drain(dev Device) uint64 {
	p.mu.Lock()
	m := p.takeAllLocked(func(k poolKey) bool { return k.dev == dev })
	p.mu.Unlock()
	freed := p.dropAll(m)
	if freed > 0 {
		p.log.Info("allocation pool: gave its memory back for an allocation that did not fit", zap.Uint64("bytes", freed))
	}
	return freed
}

// sweep releases the ready allocations of sizes not asked for within Idle.
func (p *pool) sweep(now time.Time) {
	p.mu.Lock()
	stale := func(k poolKey) bool {
		a := p.asked[k]
		return len(a) == 0 || now.Sub(a[len(a)-1]) > p.cfg.Idle
	}
	m := p.takeAllLocked(stale)
	for k := range p.asked {
		if stale(k) && len(p.ready[k]) == 0 && p.filling[k] == 0 {
			delete(p.asked, k)
		}
	}
	p.mu.Unlock()
	p.dropAll(m)
}

// run sweeps until stop is closed.
func (p *pool) run(stop <-chan struct{}) {
	t := time.NewTicker(p.cfg.Idle / 2)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			p.sweep(now)
		}
	}
}

// close waits for the refills under way and releases everything.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	m := p.takeAllLocked(func(poolKey) bool { return true })
	p.mu.Unlock()
	p.dropAll(m)
}

// readyBytes is what the pool holds ready on dev (tests, Status).
func (p *pool) readyBytes(dev Device) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n uint64
	for k, r := range p.ready {
		if k.dev == dev {
			n += k.size * uint64(len(r))
		}
	}
	return n
}

package daemon

import (
	"sync"
	"testing"
	"time"

	"github.com/gpucr/gpucr/image"
)

// stallDev is a Device whose Create waits while stalled: an allocation that
// completes meanwhile cannot have been made on the spot.
type stallDev struct {
	Device
	mu    sync.Mutex
	stall chan struct{} // nil: no stall
}

func (d *stallDev) Create(size uint64, f image.AllocFlags) (uint64, error) {
	d.mu.Lock()
	c := d.stall
	d.mu.Unlock()
	if c != nil {
		<-c
	}
	return d.Device.Create(size, f)
}

func (d *stallDev) setStall(on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if on {
		d.stall = make(chan struct{})
	} else if d.stall != nil {
		close(d.stall)
		d.stall = nil
	}
}

// A size asked for twice is kept ready: the next allocation of it is served
// while the driver could not make one, with an fd of the right size.
func TestPoolServesRepeatedSizes(t *testing.T) {
	fake := newFake()
	dev := &stallDev{Device: fake}
	s, sock := startServerConfig(t, Config{Pool: PoolConfig{Budget: 16 << 20, Idle: time.Minute}}, dev)
	c := dial(t, sock)
	c.register()
	uuid := fake.Info().Uuid
	c.alloc(uuid, 2<<20)
	if got := s.pool.readyBytes(dev); got != 0 {
		t.Fatalf("%d bytes ready after the first allocation of a size, want none", got)
	}
	c.alloc(uuid, 2<<20)
	waitFor(t, func() bool { return s.pool.readyBytes(dev) == 4<<20 })
	if got := status(t, sock).Devices[0].PoolMemory; got != 4<<20 {
		t.Fatalf("Status says the pool holds %d bytes, want %d", got, 4<<20)
	}
	dev.setStall(true)
	done := make(chan uint64, 1)
	go func() { id, _ := c.alloc(uuid, 2<<20); done <- id }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		dev.setStall(false)
		t.Fatal("the allocation waited for the driver although the pool had it ready")
	}
	dev.setStall(false)
	// the refill brings it back to two ready; a size asked for once is not pooled
	waitFor(t, func() bool { return s.pool.readyBytes(dev) == 4<<20 })
	c.alloc(uuid, 6<<20)
	time.Sleep(50 * time.Millisecond)
	if got := s.pool.readyBytes(dev); got != 4<<20 {
		t.Fatalf("%d bytes ready; a size asked for once must not be kept", got)
	}
}

// The pool's memory goes back when an allocation does not fit without it,
// when its size is not asked for any more, and at shutdown.
func TestPoolGivesMemoryBack(t *testing.T) {
	fake := newFakeTotal(16 << 20)
	s, sock := startServerConfig(t, Config{Pool: PoolConfig{Budget: 8 << 20, Idle: 300 * time.Millisecond}}, fake)
	c := dial(t, sock)
	c.register()
	uuid := fake.Info().Uuid
	id1, _ := c.alloc(uuid, 2<<20)
	id2, _ := c.alloc(uuid, 2<<20)
	waitFor(t, func() bool { return s.pool.readyBytes(fake) == 4<<20 })
	// 4 MiB in use, 4 MiB ready: 12 MiB fit only with the pool's given back
	id3, _ := c.alloc(uuid, 12<<20)
	if got := s.pool.readyBytes(fake); got != 0 {
		t.Fatalf("%d bytes still ready after an allocation needed them", got)
	}
	for _, id := range []uint64{id1, id2, id3} {
		if e := c.simple(freeReq(id)); e != nil {
			t.Fatal(e)
		}
	}
	c.alloc(uuid, 2<<20)
	c.alloc(uuid, 2<<20)
	waitFor(t, func() bool { return s.pool.readyBytes(fake) > 0 })
	// not asked for within Idle: released by the sweep
	waitFor(t, func() bool { return s.pool.readyBytes(fake) == 0 })
	c.w.Close()
	waitFor(t, func() bool { b, _ := fake.Used(); return b == 0 })
	c2 := dial(t, sock)
	c2.register()
	c2.alloc(uuid, 2<<20)
	c2.alloc(uuid, 2<<20)
	waitFor(t, func() bool { return s.pool.readyBytes(fake) > 0 })
	c2.w.Close()
	s.Shutdown()
	if b, n := fake.Used(); b != 0 || n != 0 {
		t.Fatalf("after Shutdown the device still holds %d bytes in %d allocations", b, n)
	}
}

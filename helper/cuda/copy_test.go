package cuda

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestLanesCopyThroughHelperView: an allocation the helper created is seen
// through the helper's own mapping; lanes copy into it and back out of it,
// concurrently, chunk by chunk, bit for bit.
func TestLanesCopyThroughHelperView(t *testing.T) {
	d := loadSim(t)
	dev := d.Devices[0]
	size := 4 * dev.Granularity
	h, va := mappedAlloc(t, dev, size)

	const chunk = 1 << 20
	want := make([]byte, size)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(r.Uint32())
	}
	lanes := make([]*Lane, 3)
	for i := range lanes {
		var err error
		if lanes[i], err = dev.NewLane(chunk); err != nil {
			t.Fatal(err)
		}
		defer lanes[i].Close()
	}
	each := func(f func(l *Lane, off uint64) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, size/chunk)
		for i, l := range lanes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for off := uint64(i) * chunk; off < size; off += uint64(len(lanes)) * chunk {
					if err := l.Do(func() { errs <- f(l, off) }); err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	each(func(l *Lane, off uint64) error {
		copy(l.Staging, want[off:off+chunk])
		return l.HtoD(va+off, l.Staging[:chunk])
	})
	got := make([]byte, size)
	each(func(l *Lane, off uint64) error {
		if err := l.DtoH(l.Staging[:chunk], va+off); err != nil {
			return err
		}
		copy(got[off:], l.Staging[:chunk])
		return nil
	})
	if !bytes.Equal(got, want) {
		t.Fatal("bytes read back through the lanes differ from those written")
	}
	// The helper's view is the allocation itself: a new view, made after
	// the first was dropped, sees the same bytes.
	if err := dev.Unmap(h); err != nil {
		t.Fatal(err)
	}
	va2, err := dev.Map(h, size)
	if err != nil {
		t.Fatal(err)
	}
	var probe []byte
	if err := lanes[0].Do(func() {
		if e := lanes[0].DtoH(lanes[0].Staging[:chunk], va2+chunk); e == nil {
			probe = append(probe, lanes[0].Staging[:chunk]...)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(probe, want[chunk:2*chunk]) {
		t.Fatal("a second view of the allocation sees other bytes")
	}
}

// TestViewKeptUntilRelease: the helper maps an allocation once, however
// many copies go through it, and Release drops the view with the handle,
// so the memory is freed (a view left behind would keep it alive).
func TestViewKeptUntilRelease(t *testing.T) {
	d := loadSim(t)
	dev := d.Devices[0]
	size := 8 * dev.Granularity
	free0, _, err := dev.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	h, err := dev.Create(size, false)
	if err != nil {
		t.Fatal(err)
	}
	va, err := dev.Map(h, size)
	if err != nil {
		t.Fatal(err)
	}
	again, err := dev.Map(h, size)
	if err != nil || again != va {
		t.Fatalf("second Map: %#x, %v; want the first view %#x", again, err, va)
	}
	if n := dev.Views(); n != 1 {
		t.Fatalf("%d views after mapping one allocation twice", n)
	}
	if _, err := dev.Map(h, size/2); err == nil {
		t.Fatal("Map with another size than the view's: no error")
	}
	if err := dev.Release(h); err != nil {
		t.Fatal(err)
	}
	if n := dev.Views(); n != 0 {
		t.Fatalf("%d views after Release", n)
	}
	if free, _, err := dev.MemInfo(); err != nil || free != free0 {
		t.Fatalf("free memory after Release: %d (%v), before Create %d: the view kept the allocation alive", free, err, free0)
	}
}

// TestCheckpointAPIOnUnknownPid: the checkpoint API wrappers name the call
// and the driver's error for a process that does not exist.
func TestCheckpointAPIOnUnknownPid(t *testing.T) {
	loadSim(t) // the checkpoint API needs an initialized driver
	if _, err := CheckpointState(1 << 30); err == nil {
		t.Fatal("state of a pid that cannot exist: no error")
	} else if e, ok := err.(*Error); !ok || e.Call != "cuCheckpointProcessGetState" {
		t.Fatalf("error %v does not name the call", err)
	}
}

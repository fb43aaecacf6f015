package daemon

import (
	"testing"
)

// With the export keeper, each device holds one allocation of its
// granularity while the helper serves and none after it stops; allocations
// are served beside it.
func TestExportKeeperHoldsOneExportPerDevice(t *testing.T) {
	d0, d1 := newFake(), newFake()
	s, sock := startServerConfig(t, Config{ExportKeeper: true}, d0, d1)
	c := dial(t, sock)
	c.register()
	// the keeper is made before the first connection is accepted
	for i, d := range []interface{ Used() (uint64, int) }{d0, d1} {
		if b, n := d.Used(); b != 2<<20 || n != 1 {
			t.Fatalf("device %d holds %d bytes in %d allocations while serving, want the keeper's 2 MiB in one", i, b, n)
		}
	}
	id, _ := c.alloc(d0.Info().Uuid, 4<<20)
	if b, n := d0.Used(); b != 6<<20 || n != 2 {
		t.Fatalf("device 0 holds %d bytes in %d allocations, want 6 MiB in 2", b, n)
	}
	if e := c.simple(freeReq(id)); e != nil {
		t.Fatal(e)
	}
	c.w.Close()
	s.Shutdown()
	waitFor(t, func() bool {
		b0, n0 := d0.Used()
		b1, n1 := d1.Used()
		return b0+b1 == 0 && n0+n1 == 0
	})
}

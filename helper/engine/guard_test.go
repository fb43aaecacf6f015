package engine_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/helper/internal/fakegpu"
	"github.com/gpucr/gpucr/image"
)

// guardFixture is two regions of random bytes (one zero chunk) on one
// in-process device, and an image writer for them.
func guardFixture(t *testing.T) (*fakegpu.Device, []engine.Region, [][]byte, *image.Writer, string) {
	t.Helper()
	d := fakegpu.New(0, 64<<20)
	regions := []engine.Region{region(t, d, 2, 0x7f0000000000), region(t, d, 3, 0x7f0000800000)}
	want := fillRandom(t, []*fakegpu.Device{d}, regions, 9)
	clear(want[0][:chunk])
	write(t, d, regions[0], want[0])
	dir := t.TempDir()
	w, err := image.Create(dir, image.Origin{Host: "test", Pid: 7, Time: time.Now()}, image.Options{ChunkSize: chunk})
	if err != nil {
		t.Fatal(err)
	}
	return d, regions, want, w, dir
}

// TestGuardSavesBeforeWrites: a window opened at the quiesce point lets the
// application write a chunk once Save has returned for it; the image holds
// every byte as it was at the quiesce point, the written chunks included,
// and the zero chunk was never pending.
func TestGuardSavesBeforeWrites(t *testing.T) {
	d, regions, want, w, dir := guardFixture(t)
	g, err := engine.OpenGuard(regions, w, chunk, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	if g.Pending != 9*chunk {
		t.Errorf("pending %d bytes, want 9 chunks (the zero one needs no copy)", g.Pending)
	}
	// The application is about to write chunk 1 of region 1 and all of region 0.
	target := engine.AddrRange{Addr: regions[1].Address + chunk + 100, Size: 10}
	if err := g.Save(7, []engine.AddrRange{target, {Addr: regions[0].Address, Size: regions[0].Size}}); err != nil {
		t.Fatal(err)
	}
	pend := g.PendingChunks()
	if pend[1][1] || pend[0][1] || !pend[1][0] || !pend[1][2] {
		t.Errorf("pending after Save: %v", pend)
	}
	later := bytes.Repeat([]byte{0xee}, int(regions[1].Size))
	copy(later[chunk:2*chunk], bytes.Repeat([]byte{0x11}, chunk))
	copy(later, want[1][:chunk])
	copy(later[2*chunk:], want[1][2*chunk:])
	write(t, d, regions[1], later) // only chunk 1 differs from the quiesce point
	write(t, d, regions[0], bytes.Repeat([]byte{0x22}, int(regions[0].Size)))
	st, err := g.Run()
	if err != nil {
		t.Fatal(err)
	}
	if st.Copied != 9 || st.Asked != 4 {
		t.Errorf("stats %+v, want 9 copied, 4 of them asked for (3 of region 0, 1 of region 1)", st)
	}
	if err := w.SealProcess(7); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := g.Save(7, []engine.AddrRange{target}); !errors.Is(err, engine.ErrGuardClosed) {
		t.Errorf("Save after the window: %v, want ErrGuardClosed", err)
	}
	checkImage(t, d, dir, regions, want, "the quiesce point's bytes")
}

// checkImage loads the image in dir into fresh regions at the addresses of
// regions (guardFixture's) and compares them with want.
func checkImage(t *testing.T, d *fakegpu.Device, dir string, regions []engine.Region, want [][]byte, what string) {
	t.Helper()
	im, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	fresh := []engine.Region{region(t, d, 2, regions[0].Address), region(t, d, 3, regions[1].Address)}
	if err := engine.Load(fresh, im, []int{0, 1}, engine.Options{}); err != nil {
		t.Fatal(err)
	}
	for i, r := range fresh {
		if !bytes.Equal(read(t, d, r), want[i]) {
			t.Errorf("region %d: the image does not hold %s", i, what)
		}
	}
}

// TestGuardCatchesWritesBehindItsBack: a chunk written without a Save (as a
// kernel storing through a pointer it loaded would) fails the window with
// a ChangedError naming it, once every other chunk is saved; the image is
// then not committed. Its chunk files are salvaged, and the stop-the-world
// checkpoint taken again copies only the changed chunk.
func TestGuardCatchesWritesBehindItsBack(t *testing.T) {
	d, regions, want, w, dir := guardFixture(t)
	g, err := engine.OpenGuard(regions, w, chunk, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	changed := append([]byte(nil), want[1]...)
	changed[2*chunk+5] ^= 1
	write(t, d, regions[1], changed)
	st, err := g.Run()
	var ce *engine.ChangedError
	if !errors.As(err, &ce) || ce.Address != regions[1].Address || ce.Chunk != 2 || ce.Chunks != 1 || ce.Bytes != chunk {
		t.Fatalf("Run: %v, want a ChangedError for chunk 2 of region 1 alone", err)
	}
	if st.Changed != 1 || st.Copied != 8 {
		t.Errorf("stats %+v, want 1 changed and the 8 other pending chunks copied", st)
	}
	if err := g.Save(7, []engine.AddrRange{{Addr: regions[1].Address, Size: 1}}); err == nil {
		t.Error("Save after a failed window: nil, want its failure")
	}
	sv, err := w.AbortSalvage()
	if err != nil || sv == nil || sv.Chunks() != 8 {
		t.Fatalf("AbortSalvage: %d chunks, %v; want the 8 saved", sv.Chunks(), err)
	}

	// Taken again, stop-the-world, into the same directory.
	w2, err := image.Create(dir, image.Origin{Host: "test", Pid: 7, Time: time.Now()}, image.Options{ChunkSize: chunk, Salvage: sv})
	if err != nil {
		t.Fatal(err)
	}
	dst, err := engine.Dump(regions, w2, chunk, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if dst.Copied != 1 {
		t.Errorf("the checkpoint taken again copied %d chunks, want 1 (the changed one)", dst.Copied)
	}
	if err := w2.Commit(); err != nil {
		t.Fatal(err)
	}
	checkImage(t, d, dir, regions, [][]byte{want[0], changed}, "the memory at the stop of the checkpoint taken again")
}

// TestGuardFailsWithSavesInFlight: writes held back on every region while
// the background finds a changed chunk: every Save returns, Run reports the
// change, and Release (which frees the stagings) waits for the batches still
// copying instead of freeing memory under them.
func TestGuardFailsWithSavesInFlight(t *testing.T) {
	d, regions, want, w, _ := guardFixture(t)
	g, err := engine.OpenGuard(regions, w, chunk, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	changed := append([]byte(nil), want[1]...)
	changed[5*chunk+1] ^= 1
	write(t, d, regions[1], changed)
	done := make(chan error, 8)
	for i := range 8 {
		go func() {
			r := regions[i%2]
			done <- g.Save(7, []engine.AddrRange{{Addr: r.Address, Size: r.Size}})
		}()
	}
	_, err = g.Run()
	var ce *engine.ChangedError
	if !errors.As(err, &ce) {
		t.Fatalf("Run: %v, want a ChangedError", err)
	}
	for range 8 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("a Save did not return after the window failed")
		}
	}
	released := make(chan struct{})
	go func() { g.Release(); close(released) }()
	select {
	case <-released:
	case <-time.After(30 * time.Second):
		t.Fatal("Release did not return")
	}
	_ = w.Abort()
}

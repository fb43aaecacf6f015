package engine_test

// The engines on the in-process GPU (helper/internal/fakegpu): the same
// copies, hashes and checks as on the driver, with device memory in memfds.
// This proves the GPU seam: nothing in the engine depends on CUDA.

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/helper/internal/fakegpu"
	"github.com/gpucr/gpucr/image"
)

const chunk = 1 << 20

func region(t *testing.T, d *fakegpu.Device, granules uint64, addr uint64) engine.Region {
	t.Helper()
	size := granules * d.Info().Granularity
	h, err := d.Create(size, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Release(h) })
	return engine.Region{Device: d.GPU(), Handle: h, Size: size, Pid: 7, Address: addr, Kind: image.AllocMemAlloc}
}

// fillRandom writes seeded random bytes into each region (devs[i]: region
// i's device; one device: all of them) and returns them.
func fillRandom(t *testing.T, devs []*fakegpu.Device, regions []engine.Region, seed uint64) [][]byte {
	t.Helper()
	want := make([][]byte, len(regions))
	rng := rand.New(rand.NewPCG(seed, seed+1))
	for i, r := range regions {
		want[i] = make([]byte, r.Size)
		for k := range want[i] {
			want[i][k] = byte(rng.Uint32())
		}
		write(t, devs[min(i, len(devs)-1)], r, want[i])
	}
	return want
}

// write puts data into r's memory, as an application would.
func write(t *testing.T, d *fakegpu.Device, r engine.Region, data []byte) {
	t.Helper()
	va, err := d.Map(r.Handle, r.Size)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := d.AcquireLane(0)
	if err := l.StartHtoD(va, data); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, d *fakegpu.Device, r engine.Region) []byte {
	t.Helper()
	va, err := d.Map(r.Handle, r.Size)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, r.Size)
	l, _ := d.AcquireLane(0)
	if err := l.StartDtoH(out, va); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestInProcessDumpLoad: regions on two in-process devices are dumped with
// several lanes (equal and zero chunks recorded by their hash, not copied),
// the image verifies, and a load into fresh allocations brings back every
// byte; a second dump with the first as parent copies only what changed.
func TestInProcessDumpLoad(t *testing.T) {
	devs := []*fakegpu.Device{fakegpu.New(0, 64<<20), fakegpu.New(1, 64<<20)}
	regions := []engine.Region{region(t, devs[0], 2, 0x7f0000000000), region(t, devs[1], 3, 0x7f0000800000)}
	want := fillRandom(t, devs, regions, 5)
	for i, r := range regions {
		clear(want[i][:chunk]) // a zero chunk
		write(t, devs[i], r, want[i])
	}
	dump := func(dir, parent string) engine.DumpStats {
		t.Helper()
		w, err := image.Create(dir, image.Origin{Host: "test", Pid: 7, Time: time.Now()}, image.Options{ChunkSize: chunk, Parent: parent})
		if err != nil {
			t.Fatal(err)
		}
		st, err := engine.Dump(regions, w, chunk, engine.Options{Lanes: 3})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		return st
	}
	first := t.TempDir()
	st := dump(first, "")
	if st.Chunks != 10 || st.Copied != 8 {
		t.Errorf("first dump: %+v, want 10 chunks and 8 copied (the zero ones are not)", st)
	}
	im, err := image.Open(first)
	if err != nil {
		t.Fatal(err)
	}
	if err := im.Verify(); err != nil {
		t.Fatal(err)
	}
	fresh := []engine.Region{region(t, devs[0], 2, regions[0].Address), region(t, devs[1], 3, regions[1].Address)}
	if err := engine.Load(fresh, im, []int{0, 1}, engine.Options{Lanes: 2}); err != nil {
		t.Fatal(err)
	}
	for i, r := range fresh {
		if !bytes.Equal(read(t, devs[i], r), want[i]) {
			t.Errorf("region %d: loaded bytes differ", i)
		}
	}
	// one chunk changes: the incremental dump copies it alone
	want[1][3*chunk] ^= 0xff
	write(t, devs[1], regions[1], want[1])
	st = dump(t.TempDir(), first)
	if st.Copied != 1 || st.BytesCopied != chunk {
		t.Errorf("incremental dump: %+v, want the changed chunk alone", st)
	}
}

// TestSnapshotThenDump: a snapshot taken before the application writes on is
// what the image gets (dumped from the snapshot while the originals change);
// a region beyond the budget is left for the caller, untouched; releasing
// frees the scratch memory.
func TestSnapshotThenDump(t *testing.T) {
	d := fakegpu.New(0, 24<<20) // 12 granules
	regions := []engine.Region{region(t, d, 2, 0x7f0000000000), region(t, d, 3, 0x7f0000800000), region(t, d, 4, 0x7f0001000000)}
	want := fillRandom(t, []*fakegpu.Device{d}, regions, 7)
	usedBefore, _ := d.Used() // 9 granules: 3 free
	// Room for 3 granules beyond a 0-byte reserve: the first region (2)
	// fits, the second (3) no longer does, the third (4) neither.
	s, err := engine.TakeSnapshot(regions, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Copies) != 1 || len(s.Rest) != 2 || s.Bytes != regions[0].Size {
		t.Fatalf("snapshot: %d copies, %d left, %d bytes; want the first region alone", len(s.Copies), len(s.Rest), s.Bytes)
	}
	if s.Copies[0].Address != regions[0].Address || s.Copies[0].Handle == regions[0].Handle {
		t.Fatalf("the copy must keep the region's address and hold its own memory: %+v", s.Copies[0])
	}
	// the application writes on
	write(t, d, regions[0], make([]byte, regions[0].Size))
	dir := t.TempDir()
	w, err := image.Create(dir, image.Origin{Host: "test", Pid: 7, Time: time.Now()}, image.Options{ChunkSize: chunk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Dump(s.Copies, w, chunk, engine.Options{Lanes: 2}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	if used, _ := d.Used(); used != usedBefore {
		t.Errorf("%d bytes in use after the release, %d before the snapshot", used, usedBefore)
	}
	im, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	fresh := []engine.Region{region(t, d, 2, regions[0].Address)}
	if err := engine.Load(fresh, im, []int{0}, engine.Options{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read(t, d, fresh[0]), want[0]) {
		t.Error("the image holds the region as it is now, not as it was at the snapshot")
	}
	// a reserve larger than the free memory: nothing is snapshotted
	s, err = engine.TakeSnapshot(regions, engine.SnapshotOptions{Reserve: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Copies) != 0 || len(s.Rest) != 3 {
		t.Errorf("with no room: %d copies, %d left; want none and all", len(s.Copies), len(s.Rest))
	}
}

// TestSnapshotPreparedScratch: scratch made ahead of the stop is what the
// snapshot of the same allocations takes, even where the device has no
// room left at the stop; an allocation made since finds none (here no room
// either: it is left to the caller), and what no region took is freed; the
// copies hold the data.
func TestSnapshotPreparedScratch(t *testing.T) {
	d := fakegpu.New(0, 64<<20)
	regions := []engine.Region{region(t, d, 1, 0x7f0000000000), region(t, d, 2, 0x7f0000800000), region(t, d, 1, 0x7f0001000000)}
	for i, r := range regions {
		write(t, d, r, bytes.Repeat([]byte{byte(i + 1)}, int(r.Size)))
	}
	sc, err := engine.PrepareScratch(regions, engine.SnapshotOptions{})
	if err != nil || sc.Bytes != 4*d.Info().Granularity {
		t.Fatalf("prepare: %v, %d bytes", err, sc.Bytes)
	}
	// by the stop, the last allocation was replaced by another
	late := region(t, d, 1, 0x7f0002000000)
	now := []engine.Region{regions[0], regions[1], late}
	noRoom := engine.SnapshotOptions{Scratch: sc, Reserve: 1 << 40}
	s, err := engine.TakeSnapshot(now, noRoom)
	if err != nil || len(s.Copies) != 2 || len(s.Rest) != 1 || s.Rest[0].Address != late.Address {
		t.Fatalf("snapshot: %v, %d copies, rest %+v; want the two prepared ones copied and the late one left", err, len(s.Copies), s.Rest)
	}
	_, live := d.Used()
	sc.Release() // the third piece, for the allocation that went
	if _, after := d.Used(); after != live-1 || sc.Bytes != 0 {
		t.Errorf("releasing the unused scratch: %d handles live, was %d; %d bytes left", after, live, sc.Bytes)
	}
	for i, c := range s.Copies {
		if got := read(t, d, c); got[0] != byte(i+1) || got[len(got)-1] != byte(i+1) {
			t.Errorf("copy %d holds %d, want %d", i, got[0], i+1)
		}
	}
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestCopyOnDevice: regions on two devices are copied into others on the
// same devices, every byte, the progress reaching the total; a pair on two
// devices or of two sizes is refused before anything is copied.
func TestCopyOnDevice(t *testing.T) {
	devs := []*fakegpu.Device{fakegpu.New(0, 64<<20), fakegpu.New(1, 64<<20)}
	src := []engine.Region{region(t, devs[0], 2, 0x100000), region(t, devs[1], 3, 0x200000)}
	dst := []engine.Region{region(t, devs[0], 2, 0x100000), region(t, devs[1], 3, 0x200000)}
	want := fillRandom(t, devs, src, 11)
	var last int64
	if err := engine.CopyOnDevice(dst, src, engine.Options{Progress: func(n int64) { last = n }}); err != nil {
		t.Fatal(err)
	}
	for i, r := range dst {
		if !bytes.Equal(read(t, devs[i], r), want[i]) {
			t.Errorf("region %d differs after the copy", i)
		}
	}
	if last != int64(engine.TotalSize(src)) {
		t.Errorf("progress ended at %d of %d bytes", last, engine.TotalSize(src))
	}
	for _, bad := range [][]engine.Region{{dst[1], dst[0]}, {dst[0]}} {
		if err := engine.CopyOnDevice(bad, src, engine.Options{}); err == nil {
			t.Errorf("a copy into %d mismatched regions was accepted", len(bad))
		}
	}
}

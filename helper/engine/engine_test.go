package engine

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/cuda"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/internal/testroot"
)

func simDriver(t *testing.T) *cuda.Driver {
	t.Helper()
	p := filepath.Join(testroot.Dir(t), "build/sim/libcuda.so.1")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("simulated driver missing (%v): run make sim", err)
		}
		t.Skipf("simulated driver missing (%v): run make sim", err)
	}
	t.Setenv("GPUCR_SIM_DEVICES", "2") // read once per process, at cuInit
	t.Setenv("GPUCR_SIM_MEM_MIB", "256")
	d, err := cuda.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// fill writes data into a region through a lane (test setup).
func fill(t *testing.T, r Region, data []byte) {
	t.Helper()
	if err := run([]Region{r}, 1<<20, Options{Lanes: 2}, func(l *cuda.Lane, va uint64, p piece) error {
		copy(l.Staging, data[p.off:p.off+uint64(p.n)])
		return l.HtoD(va+p.off, l.Staging[:p.n])
	}); err != nil {
		t.Fatal(err)
	}
}

func readBack(t *testing.T, r Region) []byte {
	t.Helper()
	out := make([]byte, r.Size)
	if err := run([]Region{r}, 1<<20, Options{Lanes: 2}, func(l *cuda.Lane, va uint64, p piece) error {
		if err := l.DtoH(l.Staging[:p.n], va+p.off); err != nil {
			return err
		}
		copy(out[p.off:], l.Staging[:p.n])
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func newRegion(t *testing.T, dev *cuda.Device, granules uint64, addr uint64) Region {
	t.Helper()
	size := granules * dev.Granularity
	h, err := dev.Create(size, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Release(h) })
	return Region{Device: dev, Handle: h, Size: size, Pid: 77, Address: addr, Kind: image.AllocMemAlloc}
}

// TestDumpLoadRoundTrip: regions on two devices, dumped into an image with
// several lanes and loaded into fresh allocations: every byte comes back, and
// the image says where each buffer lived.
func TestDumpLoadRoundTrip(t *testing.T) {
	d := simDriver(t)
	regions := []Region{
		newRegion(t, d.Devices[0], 3, 0x7f0000000000),
		newRegion(t, d.Devices[0], 1, 0x7f0000800000),
		newRegion(t, d.Devices[1], 5, 0x7f0000000000),
	}
	regions[2].Pid = 78
	want := make([][]byte, len(regions))
	rng := rand.New(rand.NewPCG(3, 4))
	for i, r := range regions {
		want[i] = make([]byte, r.Size)
		for k := range want[i] {
			want[i][k] = byte(rng.Uint32())
		}
		if i == 1 {
			clear(want[i][:r.Size/2]) // zero chunks too
		}
		fill(t, r, want[i])
	}
	dir := t.TempDir()
	w, err := image.Create(dir, image.Origin{Host: "test", Pid: 77, Time: time.Now()}, image.Options{ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var last int64
	progress := func(n int64) { mu.Lock(); last = max(last, n); mu.Unlock() }
	if err := Dump(regions, w, 1<<20, Options{Lanes: 3, Progress: progress}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	total := int64(0)
	for _, r := range regions {
		total += int64(r.Size)
	}
	if last != total {
		t.Errorf("progress reported %d bytes, moved %d", last, total)
	}
	// The lanes stay for the next copy (and the next copy reuses them).
	if n := d.Devices[0].IdleLanes(); n < 3 {
		t.Errorf("device 0 keeps %d lanes after a 3-lane dump", n)
	}
	im, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := im.Verify(); err != nil {
		t.Fatal(err)
	}
	infos := im.Buffers()
	fresh := make([]Region, len(regions))
	bufs := make([]int, len(regions))
	for i, r := range regions {
		if infos[i].Address != r.Address || infos[i].Pid != r.Pid || infos[i].GPUUUID != r.Device.UUID {
			t.Errorf("buffer %d: %+v, want address 0x%x pid %d on %s", i, infos[i], r.Address, r.Pid, r.Device.UUID)
		}
		fresh[i] = newRegion(t, r.Device, r.Size/r.Device.Granularity, r.Address)
		bufs[i] = i
	}
	if err := Load(fresh, im, bufs, Options{Lanes: 4}); err != nil {
		t.Fatal(err)
	}
	if n := d.Devices[0].IdleLanes(); n < 4 {
		t.Errorf("device 0 keeps %d lanes after a 4-lane load", n)
	}
	for i, r := range fresh {
		if !bytes.Equal(readBack(t, r), want[i]) {
			t.Errorf("region %d: restored bytes differ", i)
		}
	}
}

// TestLoadRefusesDamage: a damaged chunk stops the load with an error that
// names the region and chunk, and a size mismatch is refused up front.
func TestLoadRefusesDamage(t *testing.T) {
	d := simDriver(t)
	r := newRegion(t, d.Devices[0], 2, 0x7f0000000000)
	data := bytes.Repeat([]byte("gpucr!"), int(r.Size)/6+1)[:r.Size]
	fill(t, r, data)
	dir := t.TempDir()
	w, err := image.Create(dir, image.Origin{Host: "test"}, image.Options{ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := Dump([]Region{r}, w, 1<<20, Options{}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	im, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	small := newRegion(t, d.Devices[0], 1, r.Address)
	if err := Load([]Region{small}, im, []int{0}, Options{}); err == nil {
		t.Error("a region smaller than the image buffer was loaded")
	}
	f := im.ChunkFile(0, 1)
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 0x40
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := newRegion(t, d.Devices[0], 2, r.Address)
	err = Load([]Region{fresh}, im, []int{0}, Options{})
	if !errors.Is(err, image.ErrCorrupt) {
		t.Fatalf("load of a damaged image: %v, want ErrCorrupt", err)
	}
	var ce *image.ChunkError
	if !errors.As(err, &ce) || ce.Chunk != 1 {
		t.Errorf("error %v does not name chunk 1", err)
	}
}

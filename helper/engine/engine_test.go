package engine

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
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
	if err := run([]Region{r}, 1<<20, Options{Lanes: 2}, steps{toGPU: func(p piece, buf []byte) error {
		copy(buf, data[p.off:p.off+uint64(p.n)])
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
}

func readBack(t *testing.T, r Region) []byte {
	t.Helper()
	out := make([]byte, r.Size)
	if err := run([]Region{r}, 1<<20, Options{Lanes: 2}, steps{fromGPU: func(p piece, buf []byte) error {
		copy(out[p.off:], buf)
		return nil
	}}); err != nil {
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
	return Region{Device: CUDA(dev), Handle: uint64(h), Size: size, Pid: 77, Address: addr, Kind: image.AllocMemAlloc}
}

// cudaOf is the driver device of a region made by newRegion.
func cudaOf(r Region) *cuda.Device {
	return r.Device.(cudaGPU).d
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
	if _, err := Dump(regions, w, 1<<20, Options{Lanes: 3, Progress: progress}); err != nil {
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
		if infos[i].Address != r.Address || infos[i].Pid != r.Pid || infos[i].GPUUUID != r.Device.UUID() {
			t.Errorf("buffer %d: %+v, want address 0x%x pid %d on %s", i, infos[i], r.Address, r.Pid, r.Device.UUID())
		}
		fresh[i] = newRegion(t, cudaOf(r), r.Size/cudaOf(r).Granularity, r.Address)
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
	if _, err := Dump([]Region{r}, w, 1<<20, Options{}); err != nil {
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

// dumpTo dumps regions into a new image in dir (with parent, if set) and
// commits it.
func dumpTo(t *testing.T, dir, parent string, regions []Region) DumpStats {
	t.Helper()
	w, err := image.Create(dir, image.Origin{Host: "test"}, image.Options{ChunkSize: 1 << 20, Parent: parent})
	if err != nil {
		t.Fatal(err)
	}
	st, err := Dump(regions, w, 1<<20, Options{Lanes: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	return st
}

// loadInto loads every buffer of the image in dir into fresh regions like
// regions, the chunks checked on the GPU, and returns their bytes.
func loadInto(t *testing.T, dir string, regions []Region) ([][]byte, error) {
	t.Helper()
	im, err := image.OpenWith(dir, image.ReadOptions{HashCheckedByCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	fresh := make([]Region, len(regions))
	bufs := make([]int, len(regions))
	for i, r := range regions {
		fresh[i] = newRegion(t, cudaOf(r), r.Size/cudaOf(r).Granularity, r.Address)
		bufs[i] = i
	}
	if err := Load(fresh, im, bufs, Options{Lanes: 2}); err != nil {
		return nil, err
	}
	out := make([][]byte, len(fresh))
	for i, r := range fresh {
		out[i] = readBack(t, r)
	}
	return out, nil
}

// Checkpoints in a series: the second of unchanged memory copies nothing
// to the host, a changed chunk is the only one copied, zero chunks and
// chunks equal to another are never copied, and each image restores its
// own bytes, checked on the GPU.
func TestDumpCopiesOnlyWhatTheImageLacks(t *testing.T) {
	d := simDriver(t)
	regions := []Region{newRegion(t, d.Devices[0], 4, 0x7f0000000000), newRegion(t, d.Devices[1], 2, 0x7f0000800000)}
	data := [][]byte{make([]byte, regions[0].Size), make([]byte, regions[1].Size)}
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range data {
		for k := range data[i] {
			data[i][k] = byte(rng.Uint32())
		}
	}
	clear(data[0][1<<20 : 2<<20])          // a zero chunk
	copy(data[1][1<<20:], data[0][3<<20:]) // region 1's chunk 1 equals region 0's chunk 3
	for i, r := range regions {
		fill(t, r, data[i])
	}
	root := t.TempDir()
	first, second, third := filepath.Join(root, "1"), filepath.Join(root, "2"), filepath.Join(root, "3")

	st := dumpTo(t, first, "", regions)
	const chunks = 8 + 4 // 2 MiB granules, 1 MiB chunks
	// One zero chunk; region 1's chunks 1-3 are region 0's 3-5.
	if st.Chunks != chunks || st.Copied != chunks-4 || st.BytesCopied != uint64(chunks-4)<<20 {
		t.Errorf("first dump: %+v, want %d chunks, %d copied", st, chunks, chunks-4)
	}
	st = dumpTo(t, second, first, regions)
	if st.Copied != 0 || st.BytesCopied != 0 {
		t.Errorf("unchanged memory: %+v, want nothing copied", st)
	}
	data[1][5] ^= 1
	fill(t, regions[1], data[1])
	st = dumpTo(t, third, second, regions)
	if st.Copied != 1 || st.BytesCopied != 1<<20 {
		t.Errorf("one changed byte: %+v, want one chunk copied", st)
	}
	got, err := loadInto(t, third, regions)
	if err != nil {
		t.Fatal(err)
	}
	for i := range data {
		if !bytes.Equal(got[i], data[i]) {
			t.Errorf("region %d: restored bytes differ", i)
		}
	}
}

// An image of another process as the parent: only equal content is
// shared, never a chunk at the same place with other bytes.
func TestDumpAgainstAnotherProcessParent(t *testing.T) {
	d := simDriver(t)
	a := newRegion(t, d.Devices[0], 2, 0x7f0000000000)
	b := newRegion(t, d.Devices[0], 2, 0x7f0000000000)
	b.Pid = 99
	da := bytes.Repeat([]byte("process a "), int(a.Size)/10+1)[:a.Size]
	db := bytes.Repeat([]byte("process b!"), int(b.Size)/10+1)[:b.Size]
	copy(db[3<<20:], da[3<<20:]) // the last chunk is the same in both
	fill(t, a, da)
	fill(t, b, db)
	root := t.TempDir()
	dumpTo(t, filepath.Join(root, "a"), "", []Region{a})
	st := dumpTo(t, filepath.Join(root, "b"), filepath.Join(root, "a"), []Region{b})
	// Every chunk of each is distinct (the pattern's phase moves from chunk
	// to chunk); b's chunk 3 is a's chunk 3.
	if st.Copied != 3 {
		t.Errorf("dump of b against a: %+v, want the 3 chunks a lacks copied", st)
	}
	got, err := loadInto(t, filepath.Join(root, "b"), []Region{b})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[0], db) {
		t.Error("b restored with bytes other than its own")
	}
}

// A chunk damaged in storage, with the reader's own check left to the GPU:
// the check after loading refuses it and names the buffer and the chunk.
func TestLoadChecksChunksOnTheGPU(t *testing.T) {
	d := simDriver(t)
	r := newRegion(t, d.Devices[0], 2, 0x7f0000000000)
	data := bytes.Repeat([]byte("gpucr!"), int(r.Size)/6+1)[:r.Size]
	for i := range data {
		data[i] += byte(i >> 20) // every chunk different
	}
	fill(t, r, data)
	dir := t.TempDir()
	dumpTo(t, dir, "", []Region{r})
	im, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	f := im.ChunkFile(0, 2)
	im.Close()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	b[4242] ^= 0x08
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = loadInto(t, dir, []Region{r})
	var ce *image.ChunkError
	if !errors.Is(err, image.ErrCorrupt) || !errors.As(err, &ce) || ce.Chunk != 2 || ce.Buffer != 0 {
		t.Fatalf("load of a damaged chunk: %v, want ErrCorrupt naming buffer 0 chunk 2", err)
	}
	if !strings.Contains(err.Error(), "on the GPU") {
		t.Errorf("the damage was not found by the GPU's check: %v", err)
	}
}

// TestRunUsesWarmLanes: lanes started ahead with LaneStaging (as the helper
// does at start) are the ones a copy takes: it starts none of its own, so
// the first checkpoint pays for no thread, stream or pinned buffer.
func TestRunUsesWarmLanes(t *testing.T) {
	d := simDriver(t)
	dev := d.Devices[0]
	const chunk = 1 << 20
	if err := dev.WarmLanes(3, LaneStaging(chunk)); err != nil {
		t.Fatal(err)
	}
	idle := dev.IdleLanes()
	r := newRegion(t, dev, 4, 0x7000000000)
	data := make([]byte, r.Size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := run([]Region{r}, chunk, Options{Lanes: 3}, steps{toGPU: func(p piece, buf []byte) error {
		copy(buf, data[p.off:p.off+uint64(p.n)])
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	if got := dev.IdleLanes(); got != idle {
		t.Fatalf("%d idle lanes after a copy, %d before: the copy started lanes of its own", got, idle)
	}
	if !bytes.Equal(readBack(t, r), data) {
		t.Fatal("bytes read back differ")
	}
}

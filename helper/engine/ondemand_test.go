package engine

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/cuda"
	"github.com/gpucr/gpucr/image"
)

// onDemandImage dumps n regions of granules granules each, every byte
// known, into a new image and returns the regions, their bytes and the
// image directory.
func onDemandImage(t *testing.T, n int, granules uint64) ([]Region, [][]byte, string) {
	t.Helper()
	d := simDriver(t)
	var regions []Region
	var data [][]byte
	for i := range n {
		r := newRegion(t, d.Devices[0], granules, 0x7f0000000000+uint64(i)<<32)
		b := bytes.Repeat([]byte{byte(i + 1), 0x5a, byte(i * 7)}, int(r.Size)/3+1)[:r.Size]
		for k := range b {
			b[k] += byte(k >> 20)
		}
		fill(t, r, b)
		regions = append(regions, r)
		data = append(data, b)
	}
	dir := t.TempDir()
	dumpTo(t, dir, "", regions)
	return regions, data, dir
}

// freshLike makes new regions like regions, to load into.
func freshLike(t *testing.T, regions []Region) []Region {
	out := make([]Region, len(regions))
	for i, r := range regions {
		out[i] = newRegion(t, cudaOf(r), r.Size/cudaOf(r).Granularity, r.Address)
	}
	return out
}

// An on-demand load hands out what Need asks for first: with one lane and
// every chunk slowed down, the last region of the order is loaded (and
// exact) while most of the others are still to come; then everything
// loads, byte for byte.
func TestOnDemandLoadServesNeedFirst(t *testing.T) {
	regions, data, dir := onDemandImage(t, 6, 2)
	im, err := image.OpenWith(dir, image.ReadOptions{HashCheckedByCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	fresh := freshLike(t, regions)
	bufs := []int{0, 1, 2, 3, 4, 5}
	slow := func(r, chunk int, buf []byte) { time.Sleep(30 * time.Millisecond) }
	l, err := StartLoad(fresh, im, bufs, LoadOrder(fresh, nil), Options{Lanes: 1, stagingFault: slow})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Need([]int{5}); err != nil {
		t.Fatal(err)
	}
	if !l.Loaded(5) {
		t.Fatal("Need returned before its region was loaded")
	}
	behind := 0
	for i := range 5 {
		if !l.Loaded(i) {
			behind++
		}
	}
	if behind < 3 {
		t.Errorf("only %d of the 5 other regions were still loading when the one asked for was in: it did not go first", behind)
	}
	if !bytes.Equal(readBack(t, fresh[5]), data[5]) {
		t.Error("the region asked for first differs from the image")
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	for i, r := range fresh {
		if !l.Loaded(i) || !bytes.Equal(readBack(t, r), data[i]) {
			t.Errorf("region %d: loaded %v, or differs from the image", i, l.Loaded(i))
		}
	}
}

// A damaged chunk fails the load: Need of its region returns the damage
// (the caller must not let the process run on), and so does Err; regions
// loaded before it stay loaded and exact.
func TestOnDemandLoadRefusesDamage(t *testing.T) {
	regions, data, dir := onDemandImage(t, 3, 2)
	im, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	f := im.ChunkFile(2, 1)
	im.Close()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	b[77] ^= 0x10
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	im, err = image.OpenWith(dir, image.ReadOptions{HashCheckedByCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	fresh := freshLike(t, regions)
	l, err := StartLoad(fresh, im, []int{0, 1, 2}, []int{0, 1, 2}, Options{Lanes: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Need([]int{0}); err != nil {
		t.Fatalf("region 0 is intact: %v", err)
	}
	err = l.Need([]int{2})
	var ce *image.ChunkError
	if !errors.Is(err, image.ErrCorrupt) || !errors.As(err, &ce) || ce.Buffer != 2 || ce.Chunk != 1 {
		t.Fatalf("Need of the damaged region: %v, want ErrCorrupt naming buffer 2 chunk 1", err)
	}
	if l.Loaded(2) {
		t.Error("the damaged region counts as loaded")
	}
	if !errors.Is(l.Err(), image.ErrCorrupt) {
		t.Errorf("the load's result: %v", l.Err())
	}
	if !bytes.Equal(readBack(t, fresh[0]), data[0]) {
		t.Error("region 0 differs from the image")
	}
}

// The order: touched regions by their rank, then the rest smallest first.
func TestLoadOrder(t *testing.T) {
	rs := []Region{{Size: 8}, {Size: 2}, {Size: 4}, {Size: 1}, {Size: 16}}
	got := LoadOrder(rs, []uint32{0, 0, 2, 0, 1})
	want := []int{4, 2, 3, 1, 0}
	if !slices.Equal(got, want) {
		t.Errorf("LoadOrder = %v, want %v", got, want)
	}
}

// Abandon stops a region's load (its process is gone) once nothing of it
// is on its way: its memory can be released while the others load on, and
// the load still ends well.
func TestOnDemandLoadAbandon(t *testing.T) {
	regions, data, dir := onDemandImage(t, 4, 4)
	im, err := image.OpenWith(dir, image.ReadOptions{HashCheckedByCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	fresh := freshLike(t, regions)
	slow := func(r, chunk int, buf []byte) { time.Sleep(20 * time.Millisecond) }
	l, err := StartLoad(fresh, im, []int{0, 1, 2, 3}, []int{0, 1, 2, 3}, Options{Lanes: 1, stagingFault: slow})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond) // region 0 is on its way
	l.Abandon([]int{0, 2})
	// Released now: nothing of the load may write there any more.
	for _, i := range []int{0, 2} {
		if err := cudaOf(fresh[i]).Release(cuda.Handle(fresh[i].Handle)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Err(); err != nil {
		t.Fatalf("the load of the others: %v", err)
	}
	if l.Loaded(0) || l.Loaded(2) {
		t.Error("an abandoned region counts as loaded")
	}
	for _, i := range []int{1, 3} {
		if !l.Loaded(i) || !bytes.Equal(readBack(t, fresh[i]), data[i]) {
			t.Errorf("region %d: loaded %v, or differs from the image", i, l.Loaded(i))
		}
	}
}

package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/gpucr/gpucr/ptx"
)

// The helper's GPU hashing, on the simulated driver: gpucr's PTX module
// loads, and every chunk's hash equals ptx.ChunkHash of the same bytes,
// whole chunks, short last chunks and a size that ends mid-word alike.
func TestHashChunksMatchesDefinition(t *testing.T) {
	d := loadSim(t)
	dev := d.Devices[1]
	size := 4 * dev.Granularity
	_, va := mappedAlloc(t, dev, size)
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	// Two zero chunks: equal content, equal hashes.
	clear(data[1<<20 : 3<<20])
	l, err := dev.NewLane(int(size))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var copyErr error
	if err := l.Do(func() {
		copy(l.Staging, data)
		copyErr = l.HtoD(va, l.Staging[:size])
	}); err != nil || copyErr != nil {
		t.Fatal(err, copyErr)
	}

	for _, tc := range []struct {
		off, n uint64
		chunk  int
	}{
		{0, size, 1 << 20},
		{0, size, 4 << 20},
		{0, size, 3 << 20},               // a short last chunk
		{16, size - 16 - 5, 1 << 20},     // ends mid-word
		{1 << 20, 2 << 20, 1 << 20},      // the zero chunks
		{0, 4096, 4 << 20},               // one short chunk
		{0, 16 * ptx.HashLanes * 3, 256}, // many chunks of one word per lane or none
	} {
		got, err := dev.HashChunks(va+tc.off, tc.n, tc.chunk)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		want := int((tc.n + uint64(tc.chunk) - 1) / uint64(tc.chunk))
		if len(got) != want {
			t.Fatalf("%+v: %d hashes, want %d", tc, len(got), want)
		}
		for i, g := range got {
			lo := tc.off + uint64(i*tc.chunk)
			hi := min(lo+uint64(tc.chunk), tc.off+tc.n)
			if w := ptx.ChunkHash(data[lo:hi]); g != w {
				t.Errorf("%+v chunk %d: GPU %x, ptx.ChunkHash %x", tc, i, g, w)
			}
		}
	}
	if _, err := dev.HashChunks(va+8, 1<<20, 1<<20); err == nil {
		t.Error("a misaligned address was hashed")
	}
	if _, err := dev.HashChunks(va, 1<<20, 1000); err == nil {
		t.Error("a chunk size of 1000 was hashed")
	}
	// The device still works after the refusals (no sticky error).
	if _, err := dev.HashChunks(va, 1<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
}

// The kernels load on the simulated driver, and the device says so.
func TestKernelsLoad(t *testing.T) {
	d := loadSim(t)
	for _, dev := range d.Devices {
		if err := dev.LoadKernels(); err != nil {
			t.Fatalf("device %d: %v", dev.Ordinal, err)
		}
		if err := dev.KernelsError(); err != nil {
			t.Fatalf("device %d: %v", dev.Ordinal, err)
		}
	}
}

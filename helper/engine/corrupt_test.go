package engine

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/gpucr/gpucr/image"
)

// No silent wrong restore: 1,000 loads of one image, each with one
// damage: a flipped bit or a truncation of a chunk file in storage, or a
// flipped bit in host memory between the image and the GPU (a staging
// buffer). Every load must fail, and name the damaged chunk; none may
// give the GPU other bytes without an error.
func TestNoSilentWrongRestore(t *testing.T) {
	d := simDriver(t)
	dev := d.Devices[0]
	const chunk = 64 << 10
	r := newRegion(t, dev, 1, 0x7f0000000000)
	data := make([]byte, r.Size)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	clear(data[3*chunk : 5*chunk]) // zero chunks: no file, still checked on the GPU
	fill(t, r, data)
	dir := t.TempDir()
	w, err := image.Create(dir, image.Origin{Host: "test"}, image.Options{ChunkSize: chunk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Dump([]Region{r}, w, chunk, Options{Lanes: 2}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	im, err := image.OpenWith(dir, image.ReadOptions{HashCheckedByCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	nchunks := int(r.Size / chunk)
	dst := newRegion(t, dev, 1, r.Address)
	load := func(opts Options) ([]byte, error) {
		opts.Lanes = 2
		if err := Load([]Region{dst}, im, []int{0}, opts); err != nil {
			return nil, err
		}
		return readBack(t, dst), nil
	}
	if got, err := load(Options{}); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("undamaged load: %v", err)
	}

	trials := 1000
	if testing.Short() {
		trials = 100
	}

	kinds := map[string]int{}
	for trial := range trials {
		ci := rng.IntN(nchunks)
		var opts Options
		var kind string
		var undo func()
		file := im.ChunkFile(0, ci)
		switch k := rng.IntN(3); {
		case k == 0 || file == "": // a bit in host memory (zero chunks have no file)
			kind = "staging bit"
			bit := rng.IntN(chunk * 8)
			opts.stagingFault = func(_, c int, buf []byte) {
				if c == ci {
					buf[bit/8] ^= 1 << (bit % 8)
				}
			}
		default:
			orig, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			damaged := bytes.Clone(orig)
			if k == 1 {
				kind = "storage bit"
				bit := rng.IntN(len(orig) * 8)
				damaged[bit/8] ^= 1 << (bit % 8)
			} else {
				kind = "truncation"
				damaged = damaged[:rng.IntN(len(orig))]
			}
			if err := os.WriteFile(file, damaged, 0o600); err != nil {
				t.Fatal(err)
			}
			undo = func() {
				if err := os.WriteFile(file, orig, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
		kinds[kind]++
		got, err := load(opts)
		if undo != nil {
			undo()
		}
		var ce *image.ChunkError
		switch {
		case err == nil && bytes.Equal(got, data):
			t.Fatalf("trial %d (%s in chunk %d): the damage did not reach the GPU, or was undone", trial, kind, ci)
		case err == nil:
			t.Fatalf("trial %d (%s in chunk %d): SILENT WRONG RESTORE", trial, kind, ci)
		case !errors.Is(err, image.ErrCorrupt) || !errors.As(err, &ce) || ce.Chunk != ci:
			t.Fatalf("trial %d (%s in chunk %d): %v, want ErrCorrupt naming chunk %d", trial, kind, ci, err, ci)
		}
	}
	t.Logf("%d damaged loads refused: %v", trials, kinds)
}

package image

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// fxWrapManifest wraps body as a manifest file with a valid checksum, so the
// fuzzer reaches the validator instead of stopping at the CRC.
func fxWrapManifest(body []byte) []byte {
	data, _ := proto.Marshal(&imagepb.ManifestFile{FormatVersion: FormatVersion, Manifest: body,
		ManifestCrc32C: crc32.Checksum(body, castagnoli)})
	return data
}

// FuzzManifest feeds arbitrary bytes to the manifest decoder, both as a
// whole manifest.pb and as the checksummed body. It must never panic, and a
// manifest it accepts must re-encode to an equal one.
func FuzzManifest(f *testing.F) {
	dirs, _ := fxDamageImages(f, f.TempDir())
	for _, d := range dirs {
		data, err := os.ReadFile(ManifestPath(d))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, in := range [][]byte{data, fxWrapManifest(data)} {
			m, err := decodeManifest(in)
			if err != nil {
				continue
			}
			again, err := encodeManifest(m)
			if err != nil {
				t.Fatalf("accepted manifest does not encode: %v", err)
			}
			m2, err := decodeManifest(again)
			if err != nil || !proto.Equal(m, m2) {
				t.Fatalf("accepted manifest does not round-trip: %v", err)
			}
			// What readers compute from an accepted manifest stays in range.
			for _, b := range m.GetBuffers() {
				for ci, c := range b.GetChunks() {
					if uint64(ci)*uint64(m.GetChunkSize())+uint64(c.GetSize()) > b.GetSize() {
						t.Fatalf("chunk %d ends past its buffer", ci)
					}
				}
			}
		}
	})
}

// FuzzReader damages one file of real images (which picks it; mode: 0
// overwrite at off with data, 1 truncate to off, 2 append data, 3 replace
// with data, 4 replace a manifest's body with data under a valid checksum)
// and reads everything. Modes 0-3 must never read wrong bytes; mode 4
// (a different but well-formed manifest) must only not panic or hang.
func FuzzReader(f *testing.F) {
	pristine := f.TempDir()
	dirs, want := fxDamageImages(f, pristine)
	files := fxFiles(f, dirs)
	f.Add(uint16(0), uint8(0), uint32(10), []byte{0xff})
	f.Add(uint16(1), uint8(1), uint32(3), []byte{})
	f.Add(uint16(len(files)-1), uint8(2), uint32(0), []byte("x"))
	f.Add(uint16(len(files)-2), uint8(3), uint32(0), []byte("gpucr"))
	f.Add(uint16(0), uint8(4), uint32(0), []byte{0x08, 0x01})
	f.Fuzz(func(t *testing.T, which uint16, mode uint8, off uint32, data []byte) {
		root := t.TempDir()
		fxCopyTree(t, pristine, root)
		rel, _ := filepath.Rel(pristine, files[int(which)%len(files)])
		file := filepath.Join(root, rel)
		orig, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var bad []byte
		switch mode % 5 {
		case 0:
			bad = append([]byte(nil), orig...)
			for i, b := range data {
				if k := int(off%uint32(len(bad)+1)) + i; k < len(bad) {
					bad[k] = b
				}
			}
		case 1:
			bad = orig[:int(off)%(len(orig)+1)]
		case 2:
			bad = append(append([]byte(nil), orig...), data...)
		case 3:
			bad = data
		case 4:
			bad = fxWrapManifest(data)
			file = ManifestPath(filepath.Join(root, filepath.Base(dirs[int(which)%len(dirs)])))
		}
		if err := os.WriteFile(file, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		var rdirs []string
		for _, d := range dirs {
			rdirs = append(rdirs, filepath.Join(root, filepath.Base(d)))
		}
		if mode%5 == 4 {
			for _, d := range rdirs {
				if im, err := Open(d); err == nil {
					im.Verify()
					fxReadAll(d)
				}
			}
			return
		}
		fxNoSilentWrongRead(t, rdirs, want, rand.New(rand.NewPCG(uint64(off), uint64(which))), fmt.Sprintf("mode %d %s", mode%5, rel))
	})
}

// loadManifest reads and validates DIR/gpucr/manifest.pb as a reader does,
// for the seed corpora.
func loadManifest(dir string) (*imagepb.Manifest, error) {
	d, err := openDirPath(dir)
	if err != nil {
		return nil, &ManifestError{File: ManifestPath(dir), Err: err}
	}
	defer d.close()
	g, err := openSubDir(d, nil)
	if err != nil {
		return nil, err
	}
	defer g.close()
	return loadManifestAt(g, nil)
}

// TestWriteFuzzSeeds regenerates the committed seed corpora under
// testdata/fuzz when GPUCR_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("GPUCR_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set GPUCR_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	dirs, _ := fxDamageImages(t, t.TempDir())
	write := func(target, name string, lines ...string) {
		dir := filepath.Join("testdata", "fuzz", target)
		os.MkdirAll(dir, 0o755)
		text := "go test fuzz v1\n"
		for _, l := range lines {
			text += l + "\n"
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bytesLit := func(b []byte) string { return "[]byte(" + strconv.Quote(string(b)) + ")" }
	for i, d := range dirs {
		data, _ := os.ReadFile(ManifestPath(d))
		write("FuzzManifest", fmt.Sprintf("image-%d", i), bytesLit(data))
		m, _ := loadManifest(d)
		body, _ := proto.Marshal(m)
		write("FuzzManifest", fmt.Sprintf("body-%d", i), bytesLit(body))
		write("FuzzReader", fmt.Sprintf("manifest-body-%d", i), "uint16("+strconv.Itoa(i)+")", "uint8(4)", "uint32(0)", bytesLit(body))
	}
	write("FuzzManifest", "empty", bytesLit(nil))
	write("FuzzManifest", "version-2", bytesLit([]byte{0x08, 0x02, 0x12, 0x01, 0x00}))
	rng := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 6; i++ {
		write("FuzzReader", fmt.Sprintf("damage-%d", i), fmt.Sprintf("uint16(%d)", rng.IntN(40)),
			fmt.Sprintf("uint8(%d)", i%4), fmt.Sprintf("uint32(%d)", rng.IntN(3000)), bytesLit([]byte{byte(rng.IntN(256)), 0}))
	}
}

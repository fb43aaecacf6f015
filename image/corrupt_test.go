package image

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// fxDamageImages writes the images the corruption tests damage: a full
// image with zstd (two processes, two devices, dedup, zero chunks,
// compressible and incompressible data) and an incremental child without
// compression. It returns the root, the image dirs and their data.
func fxDamageImages(t testing.TB, root string) (dirs []string, want [][][]byte) {
	p, c := filepath.Join(root, "p"), filepath.Join(root, "c")
	rnd := fxRand(90, 6*1024)
	text := bytes.Repeat([]byte("checkpoint "), 600)
	mixed := append(append(append([]byte(nil), rnd[:2048]...), make([]byte, 2048)...), text[:3000]...)
	bufsP := []fxBuf{
		{BufferInfo{Pid: 10, Device: 0, GPUUUID: "GPU-0", Address: 0x7f0000000000, Size: uint64(len(rnd)), Kind: AllocVMM}, rnd},
		{BufferInfo{Pid: 10, Device: 1, GPUUUID: "GPU-1", Address: 0x7f1000000000, Size: uint64(len(mixed))}, mixed},
		{BufferInfo{Pid: 11, Device: 0, GPUUUID: "GPU-0", Address: 0x7f0000000000, Size: uint64(len(text))}, text},
		{BufferInfo{Pid: 11, Device: 0, GPUUUID: "GPU-0", Address: 0x7f2000000000, Size: 3000}, rnd[1024 : 1024+3000]}, // dedup
	}
	fxWrite(t, p, Options{ChunkSize: 1024, Compression: CompressionZstd}, bufsP)
	bufsC := append([]fxBuf(nil), bufsP...)
	changed := append([]byte(nil), rnd...)
	copy(changed[3000:], fxRand(91, 1500))
	bufsC[0].data = changed
	bufsC = append(bufsC, fxBuf{BufferInfo{Pid: 12, Address: 0x1000, Size: 5000}, fxRand(92, 5000)})
	fxWrite(t, c, Options{ChunkSize: 1024, Parent: p}, bufsC)
	for _, bufs := range [][]fxBuf{bufsP, bufsC} {
		var d [][]byte
		for _, b := range bufs {
			d = append(d, b.data)
		}
		want = append(want, d)
	}
	return []string{p, c}, want
}

// fxFiles lists the regular files of the image dirs (manifests, chunks).
func fxFiles(t testing.TB, dirs []string) []string {
	var files []string
	for _, d := range dirs {
		filepath.Walk(filepath.Join(d, SubDir), func(p string, info os.FileInfo, err error) error {
			if err == nil && info.Mode().IsRegular() && filepath.Base(p) != lockName {
				files = append(files, p)
			}
			return nil
		})
	}
	sort.Strings(files)
	return files
}

// fxNoSilentWrongRead reads every image fully (Read, ReadAt, random
// ReadAt ranges) and Verifies it: each either fails or returns exactly the
// original bytes. It returns how many images failed to read.
func fxNoSilentWrongRead(t testing.TB, dirs []string, want [][][]byte, rng *rand.Rand, what string) int {
	t.Helper()
	failed := 0
	for i, dir := range dirs {
		got, err := fxReadAll(dir)
		if err != nil {
			failed++
		} else {
			if len(got) != len(want[i]) {
				t.Fatalf("%s: %s read %d buffers, want %d", what, dir, len(got), len(want[i]))
			}
			for b := range got {
				if !bytes.Equal(got[b], want[i][b]) {
					t.Fatalf("%s: SILENT WRONG READ of %s buffer %d", what, dir, b)
				}
			}
		}
		im, oerr := Open(dir)
		if oerr != nil {
			if err == nil {
				t.Fatalf("%s: %s reads but does not open: %v", what, dir, oerr)
			}
			continue
		}
		// Verify covers exactly what a full read checks.
		if verr := im.Verify(); (verr == nil) != (err == nil) {
			t.Fatalf("%s: %s: Verify says %v, full read says %v", what, dir, verr, err)
		}
		for k := 0; k < 8 && rng != nil; k++ {
			bi := rng.IntN(len(want[i]))
			data := want[i][bi]
			r, _ := im.OpenBuffer(bi)
			off := rng.IntN(len(data) + 1)
			p := make([]byte, rng.IntN(len(data)-off+1))
			n, err := r.ReadAt(p, int64(off))
			if err == nil || errors.Is(err, io.EOF) {
				if !bytes.Equal(p[:n], data[off:off+n]) {
					t.Fatalf("%s: SILENT WRONG ReadAt(%d, %d) of %s buffer %d", what, len(p), off, dir, bi)
				}
			} else if !bytes.Equal(p[:n], data[off:off+n]) {
				t.Fatalf("%s: ReadAt(%d, %d) of %s buffer %d: the %d bytes before the error are wrong", what, len(p), off, dir, bi, n)
			}
		}
	}
	return failed
}

// TestCorruptionNeverReadsWrong flips random bits in, truncates, extends
// or deletes random files of real images, many times, and checks that no
// read returns anything but the original bytes or an error.
func TestCorruptionNeverReadsWrong(t *testing.T) {
	root := t.TempDir()
	dirs, want := fxDamageImages(t, root)
	if fxNoSilentWrongRead(t, dirs, want, nil, "pristine") != 0 {
		t.Fatal("pristine images do not read")
	}
	files := fxFiles(t, dirs)
	iters := 400
	if testing.Short() {
		iters = 100
	}
	rng := rand.New(rand.NewPCG(2026, 3))
	detected := 0
	for it := 0; it < iters; it++ {
		file := files[rng.IntN(len(files))]
		orig, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		bad := append([]byte(nil), orig...)
		var what string
		switch mode := rng.IntN(10); {
		case mode < 6 && len(bad) > 0: // flip 1 to 4 bits
			for k := rng.IntN(4) + 1; k > 0; k-- {
				bad[rng.IntN(len(bad))] ^= 1 << rng.IntN(8)
			}
			what = "flip"
		case mode < 8: // truncate
			bad = bad[:rng.IntN(len(bad)+1)]
			what = "truncate"
		case mode < 9: // extend
			bad = append(bad, byte(rng.IntN(256)))
			what = "extend"
		default:
			bad = nil
			what = "delete"
		}
		if what == "delete" {
			os.Remove(file)
		} else {
			os.WriteFile(file, bad, 0o644)
		}
		label := what + " " + file
		if fxNoSilentWrongRead(t, dirs, want, rng, label) > 0 {
			detected++
		}
		if err := os.WriteFile(file, orig, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d damaged files, %d detected (the rest were harmless: e.g. a truncation to the same length)", iters, detected)
	if detected < iters*9/10 {
		t.Errorf("only %d of %d damages detected", detected, iters)
	}
	if fxNoSilentWrongRead(t, dirs, want, rng, "restored") != 0 {
		t.Fatal("restored images do not read")
	}
}

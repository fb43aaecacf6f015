package image

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fxChain writes a -> b -> c, each changing one chunk of the one before,
// plus the chunk files of a write into a that died (orphans: a write that
// commits removes those of the image it replaces itself) and a leftover
// temporary file in b. It returns the dirs and c's buffers.
func fxChain(t *testing.T) (a, b, c string, bufsA, bufsC []fxBuf) {
	root := t.TempDir()
	a, b, c = filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "c")
	mk := func(seed uint64, base []byte, change int) []fxBuf {
		d := append([]byte(nil), base...)
		if change >= 0 {
			copy(d[change*4096:], fxRand(seed, 4096))
		}
		return []fxBuf{{BufferInfo{Pid: 9, Address: 0x4000000, Size: uint64(len(d))}, d}}
	}
	dead := filepath.Join(root, "dead")
	fxWrite(t, dead, Options{ChunkSize: 4096}, mk(0, fxRand(70, 8*4096), -1))
	bufsA = mk(0, fxRand(71, 8*4096), -1)
	fxWrite(t, a, Options{ChunkSize: 4096}, bufsA)
	fxCopyTree(t, filepath.Join(dead, SubDir, chunksName), filepath.Join(a, SubDir, chunksName))
	bufsB := mk(72, bufsA[0].data, 2)
	fxWrite(t, b, Options{ChunkSize: 4096, Parent: a}, bufsB)
	bufsC = mk(73, bufsB[0].data, 5)
	fxWrite(t, c, Options{ChunkSize: 4096, Parent: b}, bufsC)
	os.WriteFile(filepath.Join(b, SubDir, tmpPrefix+"c-dead"), []byte("x"), 0o644)
	return a, b, c, bufsA, bufsC
}

func TestGCKeepsChainOfKeptImage(t *testing.T) {
	a, b, c, _, bufsC := fxChain(t)
	filesA, filesB := fxChunkFiles(t, a), fxChunkFiles(t, b)

	rep, err := GC([]string{c}, true)
	if err != nil {
		t.Fatal(err)
	}
	// a: 8 current chunk files + 8 orphans of the overwritten image; c
	// needs 6 of them (chunks 2 and 5 changed since). b has one file
	// (chunk 2), which c needs; c's chunk 5 is its own.
	if rep.ChunksDeleted != 10 || len(rep.Pruned) != 2 || len(rep.Dirs) != 3 || !rep.Dirs[0].Kept {
		t.Fatalf("dry run report %+v", rep)
	}
	if fxChunkFiles(t, a) != filesA || fxChunkFiles(t, b) != filesB || len(fxTemps(t, b)) != 1 {
		t.Fatal("dry run deleted files")
	}
	if _, err := Open(a); err != nil {
		t.Fatalf("dry run pruned a: %v", err)
	}

	rep, err = GC([]string{c}, false)
	if err != nil {
		t.Fatal(err)
	}
	if rep.ChunksDeleted != 10 || fxChunkFiles(t, a) != 6 || fxChunkFiles(t, b) != 1 || len(fxTemps(t, b)) != 0 {
		t.Fatalf("report %+v; files a %d b %d", rep, fxChunkFiles(t, a), fxChunkFiles(t, b))
	}
	fxCheck(t, c, bufsC)
	im, err := Open(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := im.Verify(); err != nil {
		t.Fatalf("kept image after gc: %v", err)
	}
	for _, d := range []string{a, b} {
		_, err := Open(d)
		if !errors.Is(err, ErrPruned) || !strings.Contains(err.Error(), "pruned by gc: not restorable by itself") {
			t.Errorf("Open(%s) after gc: %v, want ErrPruned", d, err)
		}
	}
	// Idempotent: nothing more to do.
	if rep, err := GC([]string{c}, false); err != nil || rep.ChunksDeleted != 0 || len(rep.Pruned) != 0 {
		t.Fatalf("second gc: %+v, %v", rep, err)
	}
}

func TestGCKeptAncestorStaysWhole(t *testing.T) {
	a, b, c, bufsA, bufsC := fxChain(t)
	rep, err := GC([]string{c, a}, false)
	if err != nil {
		t.Fatal(err)
	}
	// b needs a's chunks (kept with a) and its own chunk 2 (kept for c).
	if len(rep.Pruned) != 0 || rep.ChunksDeleted != 8 {
		t.Fatalf("report %+v, want a's 8 orphans deleted and nothing pruned", rep)
	}
	fxCheck(t, a, bufsA)
	fxCheck(t, c, bufsC)
	if fxChunkFiles(t, a) != 8 {
		t.Errorf("a has %d chunk files, want its 8", fxChunkFiles(t, a))
	}
	if im, err := Open(b); err != nil || im.Verify() != nil {
		t.Errorf("b after gc: %v", err)
	}
	// Keeping only a: b and c are not in a's chain; a's orphans are gone.
	if rep, err := GC([]string{a}, false); err != nil || len(rep.Dirs) != 1 || rep.ChunksDeleted != 0 {
		t.Fatalf("gc of a alone: %+v, %v", rep, err)
	}
}

func TestGCRefusesBrokenKeep(t *testing.T) {
	_, b, c, _, _ := fxChain(t)
	if _, err := GC([]string{filepath.Join(c, "nothing")}, false); err == nil {
		t.Error("gc of a missing image succeeded")
	}
	os.RemoveAll(b)
	if _, err := GC([]string{c}, false); !errors.Is(err, ErrMissingParent) {
		t.Errorf("gc with c's parent gone: %v", err)
	}
}

func TestGCWaitsForWriterOfChild(t *testing.T) {
	a, b, c, _, bufsC := fxChain(t)
	w, err := Create(filepath.Join(filepath.Dir(c), "d"), fxOrigin(), Options{ChunkSize: 4096, Parent: c})
	if err != nil {
		t.Fatal(err)
	}
	// d's chunks may refer to files in a, b and c: gc must not run on them.
	for _, keep := range []string{c, b, a} {
		if _, err := GC([]string{keep}, false); !errors.Is(err, ErrBusy) {
			t.Errorf("gc of %s during a write that uses it: %v, want ErrBusy", keep, err)
		}
	}
	if _, err := GC([]string{c}, true); err != nil {
		t.Errorf("dry run during a write: %v", err)
	}
	w.Abort()
	if _, err := GC([]string{c}, false); err != nil {
		t.Fatal(err)
	}
	fxCheck(t, c, bufsC)
}

// An ancestor beyond what the kept image needs that now holds another image
// is not part of the chain: gc leaves it alone.
func TestGCLeavesReplacedFarAncestor(t *testing.T) {
	root := t.TempDir()
	a, b, c := filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "c")
	info := BufferInfo{Address: 0x10000, Size: 4 * 4096}
	fxWrite(t, a, Options{ChunkSize: 4096}, []fxBuf{{info, fxRand(1, 4*4096)}})
	y := []fxBuf{{info, fxRand(2, 4*4096)}}
	fxWrite(t, b, Options{ChunkSize: 4096, Parent: a}, y)
	fxWrite(t, c, Options{ChunkSize: 4096, Parent: b}, y) // needs b only
	other := []fxBuf{{info, fxRand(3, 4*4096)}}
	fxWrite(t, a, Options{ChunkSize: 4096}, other) // a replaced
	files := fxChunkFiles(t, a)
	rep, err := GC([]string{c}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Dirs) != 2 || fxChunkFiles(t, a) != files {
		t.Fatalf("gc touched the replaced ancestor: %+v", rep)
	}
	fxCheck(t, a, other)
	fxCheck(t, c, y)
}

// gc walks a kept image's chain only as far as its chunks reach; an
// ancestor it sweeps that refers further up itself is still marked pruned
// when it loses a chunk of its own.
func TestGCPrunesAncestorThatReadsFurther(t *testing.T) {
	root := t.TempDir()
	a, b, c := filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "c")
	info := BufferInfo{Address: 0x10000, Size: 6 * 4096}
	dataA := fxRand(1, 6*4096)
	fxWrite(t, a, Options{ChunkSize: 4096}, []fxBuf{{info, dataA}})
	dataB := append([]byte(nil), dataA...)
	copy(dataB[2*4096:], fxRand(2, 2*4096)) // b's own chunks 2 and 3
	fxWrite(t, b, Options{ChunkSize: 4096, Parent: a}, []fxBuf{{info, dataB}})
	dataC := fxRand(3, 6*4096)
	copy(dataC[2*4096:3*4096], dataB[2*4096:3*4096]) // c reads b's chunk 2 alone
	fxWrite(t, c, Options{ChunkSize: 4096, Parent: b}, []fxBuf{{info, dataC}})
	rep, err := GC([]string{c}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Dirs) != 2 || len(rep.Pruned) != 1 || rep.Pruned[0] != b {
		t.Fatalf("report %+v: want b swept and marked pruned, a left alone", rep)
	}
	if _, err := Open(b); !errors.Is(err, ErrPruned) {
		t.Errorf("b lost its chunk 3 but opens: %v", err)
	}
	fxCheck(t, a, []fxBuf{{info, dataA}})
	fxCheck(t, c, []fxBuf{{info, dataC}})
}

package image

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/protocol/imagepb"
	"github.com/gpucr/gpucr/ptx"
)

// fxSeries writes n self-contained images base/1..n, each changing one
// chunk of the one before (chunk i-1 of image i); it returns their dirs and
// buffers.
func fxSeries(t *testing.T, base string, n int, opts Options) ([]string, [][]fxBuf) {
	t.Helper()
	data := fxRand(100, 8*4096)
	var dirs []string
	var bufs [][]fxBuf
	for i := 1; i <= n; i++ {
		d := bytes.Clone(data)
		if i > 1 {
			copy(d[(i-2)*4096:], fxRand(uint64(100+i), 4096))
		}
		data = d
		dir := filepath.Join(base, string(rune('0'+i)))
		o := opts
		o.ChunkSize, o.SelfContained = 4096, true
		if i > 1 {
			o.Parent = dirs[i-2]
		}
		b := []fxBuf{{BufferInfo{Pid: 9, Address: 0x4000000, Size: uint64(len(d))}, d}}
		st := fxWrite(t, dir, o, b)
		if i > 1 && (st.ChunksParent != 7 || st.ChunksNew != 1) {
			t.Fatalf("image %d: stats %+v, want 7 chunks from the parent and 1 new", i, st)
		}
		dirs, bufs = append(dirs, dir), append(bufs, b)
	}
	return dirs, bufs
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// A self-contained series stores each unchanged chunk once (its file hard
// linked into every image that has it), and any image of it may be
// deleted, with rm -rf, without costing the others anything.
func TestSelfContainedSeriesSurvivesDeletes(t *testing.T) {
	base := t.TempDir()
	dirs, bufs := fxSeries(t, base, 5, Options{})
	im, err := Open(dirs[4])
	if err != nil {
		t.Fatal(err)
	}
	linked := 0
	for ci, c := range im.Manifest().GetBuffers()[0].GetChunks() {
		if c.GetLocation() != imagepb.Location_LOCATION_LOCAL {
			t.Fatalf("chunk %d of the last image: %v, want a local file", ci, c.GetLocation())
		}
		if c.GetLinked() {
			linked++
		}
	}
	if linked != 7 || len(im.Chain()) != 1 {
		t.Fatalf("%d linked chunks, chain %v: want 7 and the image alone", linked, im.Chain())
	}
	// Chunk 7 never changed: one file for all five images.
	f := im.ChunkFile(0, 7)
	first := strings.Replace(f, dirs[4], dirs[0], 1)
	if inode(t, f) != inode(t, first) {
		t.Errorf("%s and %s are not one file", f, first)
	}
	im.Close()

	// Delete the first three and the middle one's directory while a
	// later one is still there.
	for _, d := range dirs[:3] {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
	for i := 3; i < 5; i++ {
		fxCheck(t, dirs[i], bufs[i])
		if err := verifyDir(dirs[i]); err != nil {
			t.Fatalf("image %d after its ancestors were deleted: %v", i+1, err)
		}
	}
	// The series goes on from the newest.
	next := filepath.Join(base, "6")
	st := fxWrite(t, next, Options{ChunkSize: 4096, SelfContained: true, Parent: dirs[4]}, bufs[4])
	if st.ChunksParent != 8 || st.BytesStored != 0 {
		t.Fatalf("unchanged image after deletes: %+v", st)
	}
	os.RemoveAll(dirs[4])
	os.RemoveAll(dirs[3])
	fxCheck(t, next, bufs[4])
}

// gc of a self-contained image leaves the images it was written against
// whole: it reads nothing from them (before, gc pruned every ancestor of
// the image kept).
func TestGCOfSelfContainedLeavesAncestors(t *testing.T) {
	dirs, bufs := fxSeries(t, t.TempDir(), 3, Options{})
	rep, err := GC([]string{dirs[2]}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Dirs) != 1 || len(rep.Pruned) != 0 || rep.ChunksDeleted != 0 {
		t.Fatalf("gc of the newest: %+v", rep)
	}
	for i, d := range dirs {
		fxCheck(t, d, bufs[i])
	}
}

// A chunk that cannot be linked (its file gone from the ancestor since the
// write began) is stored again: the image never depends on its parent.
// Through the GPU's path, RecordChunk asks for its bytes.
func TestSelfContainedStoresWhatCannotBeLinked(t *testing.T) {
	const cs = 4096
	root := t.TempDir()
	parent := filepath.Join(root, "p")
	data := fxRand(7, 4*cs)
	info := BufferInfo{Pid: 3, Address: 0x10000, Size: uint64(len(data))}
	fxWrite(t, parent, Options{ChunkSize: cs}, []fxBuf{{info, data}})
	pim, err := Open(parent)
	if err != nil {
		t.Fatal(err)
	}
	gone := pim.ChunkFile(0, 2)
	pim.Close()

	child := filepath.Join(root, "c")
	w, err := Create(child, fxOrigin(), Options{ChunkSize: cs, Parent: parent, SelfContained: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(gone); err != nil { // after Create indexed the parent
		t.Fatal(err)
	}
	bw, err := w.AddBuffer(info)
	if err != nil {
		t.Fatal(err)
	}
	var copied []int
	for ci := 0; ci < 4; ci++ {
		raw := data[ci*cs : (ci+1)*cs]
		h := ptx.ChunkHash(raw)
		done, err := bw.RecordChunk(ci, h)
		if err != nil {
			t.Fatal(err)
		}
		if !done {
			copied = append(copied, ci)
			if err := bw.WriteChunkHashed(ci, raw, h); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := bw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	if !equalInts(copied, []int{2}) {
		t.Errorf("copied %v, want the chunk whose file is gone alone", copied)
	}
	if err := os.RemoveAll(parent); err != nil {
		t.Fatal(err)
	}
	fxCheck(t, child, []fxBuf{{info, data}})
}

// An ancestor inside the image's own directory (a pre-copy's rounds) is
// referred to, not linked: it goes wherever the directory goes (a
// migration sends it first, and the rest after).
func TestSelfContainedRefersToAncestorsInside(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "img")
	round := filepath.Join(dir, "gpucr-pre-copy", "1-9")
	data := fxRand(8, 4*4096)
	info := BufferInfo{Pid: 9, Address: 0x10000, Size: uint64(len(data))}
	fxWrite(t, round, Options{ChunkSize: 4096, SelfContained: true}, []fxBuf{{info, data}})
	fxWrite(t, dir, Options{ChunkSize: 4096, SelfContained: true, Parent: round}, []fxBuf{{info, data}})
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	for ci, c := range im.Manifest().GetBuffers()[0].GetChunks() {
		if c.GetLocation() != imagepb.Location_LOCATION_PARENT {
			t.Errorf("chunk %d: %v, want a reference to the round", ci, c.GetLocation())
		}
	}
}

// --auto-parent's choice: the newest image that can be read by itself. An
// image whose ancestor was deleted (written referring to it) is passed
// over, and so is one with a chunk file missing.
func TestLatestTakesNewestRestorable(t *testing.T) {
	base := t.TempDir()
	d := func(n string) string { return filepath.Join(base, n) }
	data := fxRand(9, 4*4096)
	info := BufferInfo{Pid: 9, Address: 0x10000, Size: uint64(len(data))}
	bufs := []fxBuf{{info, data}}
	fxWrite(t, d("1"), Options{ChunkSize: 4096}, bufs)
	fxWrite(t, d("2"), Options{ChunkSize: 4096, SelfContained: true, Parent: d("1")}, bufs)
	fxWrite(t, d("3"), Options{ChunkSize: 4096, Parent: d("2")}, bufs) // refers to 2's files
	o := fxOrigin()
	for _, n := range []string{"1", "2", "3"} {
		m, err := loadManifest(d(n))
		if err != nil {
			t.Fatal(err)
		}
		o.Time = o.Time.Add(1e9)
		m.Origin = originToPB(o)
		writeManifestForTest(t, d(n), m)
	}
	if got, err := Latest(base, d("4")); err != nil || got != d("3") {
		t.Fatalf("Latest = %q, %v; want 3", got, err)
	}
	os.RemoveAll(d("2"))
	if got, err := Latest(base, d("4")); err != nil || got != d("1") {
		t.Fatalf("with 2 deleted: Latest = %q, %v; want 1 (3 reads its chunks from 2)", got, err)
	}
	im, _ := Open(d("1"))
	os.Remove(im.ChunkFile(0, 1))
	im.Close()
	if got, err := Latest(base, d("4")); err != nil || got != "" {
		t.Fatalf("with a chunk of 1 gone: Latest = %q, %v; want none", got, err)
	}
}

// Remove removes an image directory whole, counting what it frees, and
// refuses what would cost another image or an operation in progress.
func TestRemoveImage(t *testing.T) {
	base := t.TempDir()
	dirs, bufs := fxSeries(t, base, 3, Options{})
	os.WriteFile(filepath.Join(dirs[0], "pages-1.img"), []byte("cpu"), 0o600)
	rep, err := Remove(dirs[0], RemoveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// 8 chunk files: the one of chunk 0 only image 1 has; the other 7 are
	// linked by image 2 (and 3).
	if rep.BytesFreed < 4096 || rep.BytesShared != 7*4096 {
		t.Errorf("report %+v", rep)
	}
	if _, err := os.Stat(dirs[0]); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is still there: %v", dirs[0], err)
	}
	fxCheck(t, dirs[1], bufs[1])
	fxCheck(t, dirs[2], bufs[2])

	// Not while a write reads it as its parent.
	w, err := Create(filepath.Join(base, "4"), fxOrigin(), Options{ChunkSize: 4096, SelfContained: true, Parent: dirs[2]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Remove(dirs[2], RemoveOptions{}); !errors.Is(err, ErrBusy) {
		t.Errorf("removed an image a write reads: %v", err)
	}
	w.Abort()
	// Not while it is restored.
	f, err := os.Open(dirs[2])
	if err != nil {
		t.Fatal(err)
	}
	if err := LockImage(f, dirs[2]); err != nil {
		t.Fatal(err)
	}
	var iu *InUseError
	if _, err := Remove(dirs[2], RemoveOptions{}); !errors.As(err, &iu) {
		t.Errorf("removed an image being restored: %v", err)
	}
	f.Close()
	// Not while an image of its series reads chunks from it.
	legacy := filepath.Join(base, "5")
	fxWrite(t, legacy, Options{ChunkSize: 4096, Parent: dirs[2]}, bufs[2])
	var de *DependentError
	if _, err := Remove(dirs[2], RemoveOptions{}); !errors.As(err, &de) || de.Dependent != legacy {
		t.Errorf("removed an image another one reads: %v", err)
	}
	fxCheck(t, legacy, bufs[2])
	// Not a directory that is no image.
	plain := filepath.Join(base, "plain")
	os.MkdirAll(filepath.Join(plain, "x"), 0o700)
	if _, err := Remove(plain, RemoveOptions{}); err == nil || !strings.Contains(err.Error(), "not an image directory") {
		t.Errorf("removed a directory that is no image: %v", err)
	}
	// A symlink in the image is removed, not followed.
	victim := filepath.Join(base, "victim")
	os.WriteFile(victim, []byte("x"), 0o600)
	os.Symlink(victim, filepath.Join(dirs[1], "link"))
	if _, err := Remove(dirs[1], RemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("the symlink's target went: %v", err)
	}
}

// FoldParents makes an image read nothing from its ancestors: a pre-copy's
// rounds inside its directory can then be removed, and so can the images
// of an old series it read from. The parent it keeps is where the chain
// leaves its directory.
func TestFoldParents(t *testing.T) {
	root := t.TempDir()
	base := filepath.Join(root, "base")
	dir := filepath.Join(root, "img")
	r1, r2 := filepath.Join(dir, "gpucr-pre-copy", "1-9"), filepath.Join(dir, "gpucr-pre-copy", "2-9")
	data := fxRand(11, 6*4096)
	info := BufferInfo{Pid: 9, Address: 0x10000, Size: uint64(len(data))}
	step := func(seed uint64, ci int) []fxBuf {
		copy(data[ci*4096:], fxRand(seed, 4096))
		return []fxBuf{{info, bytes.Clone(data)}}
	}
	fxWrite(t, base, Options{ChunkSize: 4096}, step(1, 0))
	fxWrite(t, r1, Options{ChunkSize: 4096, Parent: base}, step(2, 1)) // refers to base, as images did before
	fxWrite(t, r2, Options{ChunkSize: 4096, SelfContained: true, Parent: r1}, step(3, 2))
	last := step(4, 3)
	fxWrite(t, dir, Options{ChunkSize: 4096, SelfContained: true, Parent: r2}, last)
	rep, err := FoldParents(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Linked != 5 || rep.Copied != 0 {
		t.Errorf("fold report %+v, want the 5 chunks of the rounds (and base) linked", rep)
	}
	if err := os.RemoveAll(filepath.Join(dir, "gpucr-pre-copy")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(base); err != nil {
		t.Fatal(err)
	}
	fxCheck(t, dir, last)
	if err := verifyDir(dir); err != nil {
		t.Fatal(err)
	}
	m, err := loadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.GetParent().GetPath(); got != "../base" {
		t.Errorf("parent after the fold: %q, want ../base", got)
	}
	// Again: nothing to do.
	if rep, err := FoldParents(dir, nil); err != nil || rep.Linked+rep.Copied != 0 {
		t.Errorf("second fold: %+v, %v", rep, err)
	}
}

// An image written over another in the same directory reuses the files
// they share and, once committed, removes the rest of the old one's (and
// any a dead write left): DIR holds the new image alone.
func TestReplaceLeavesNoOrphans(t *testing.T) {
	root := t.TempDir()
	dir, dead := filepath.Join(root, "img"), filepath.Join(root, "dead")
	info := BufferInfo{Pid: 9, Address: 0x10000, Size: 4 * 4096}
	old := fxRand(20, 4*4096)
	fxWrite(t, dir, Options{ChunkSize: 4096}, []fxBuf{{info, old}})
	fxWrite(t, dead, Options{ChunkSize: 4096}, []fxBuf{{info, fxRand(21, 4*4096)}})
	fxCopyTree(t, filepath.Join(dead, SubDir, chunksName), filepath.Join(dir, SubDir, chunksName))
	nu := bytes.Clone(old)
	copy(nu[4096:], fxRand(22, 3*4096)) // chunk 0 stays
	st := fxWrite(t, dir, Options{ChunkSize: 4096}, []fxBuf{{info, nu}})
	if st.ChunksDedup != 1 || st.ChunksNew != 3 {
		t.Errorf("stats %+v: want the old chunk 0 reused", st)
	}
	if n := fxChunkFiles(t, dir); n != 4 {
		t.Errorf("%d chunk files after the replace, want the new image's 4", n)
	}
	fxCheck(t, dir, []fxBuf{{info, nu}})
}

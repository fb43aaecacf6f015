package image

// Images written for another user (Options.Owner, what the helper does for
// the process that asked), images written beneath a directory descriptor
// (CreateAt, OpenAt), and the opening rules without openat2.

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Two users that are not this process; the tests that give files away need
// root (CAP_CHOWN).
var (
	ownerA = &Owner{UID: 61001, GID: 61001}
	ownerB = &Owner{UID: 61002, GID: 61002}
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("giving files to another user needs root")
	}
}

// fxOwners lists every entry under dir/gpucr whose owner or mode is not
// own's 0700/0600.
func fxOwners(t *testing.T, dir string, own *Owner) []string {
	t.Helper()
	var bad []string
	filepath.Walk(filepath.Join(dir, SubDir), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			bad = append(bad, err.Error())
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		want := os.FileMode(fileMode)
		if fi.IsDir() {
			want = dirMode
		}
		if int(st.Uid) != own.UID || int(st.Gid) != own.GID || fi.Mode().Perm() != want {
			bad = append(bad, p+" "+fi.Mode().String())
		}
		return nil
	})
	return bad
}

func TestOwnerGetsTheImage(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "img")
	bufs := []fxBuf{{BufferInfo{Address: 0x100000, Size: 3 * 4096}, fxRand(91, 3*4096)}}
	fxWrite(t, dir, Options{ChunkSize: 4096, Owner: ownerA}, bufs)
	if bad := fxOwners(t, dir, ownerA); len(bad) > 0 {
		t.Errorf("not the owner's (uid %d, 0700/0600): %v", ownerA.UID, bad)
	}
	fxCheck(t, dir, bufs)
	// The owner writes again over its own image: its chunks are reused.
	st := fxWrite(t, dir, Options{ChunkSize: 4096, Owner: ownerA}, bufs)
	if st.ChunksDedup != 3 {
		t.Errorf("second write by the same owner: %+v, want its 3 chunks reused", st)
	}
	// Another user may not write into it, nor may root's own writer when
	// it acts for someone else; nothing changes.
	before := fxTree(t, dir)
	for _, own := range []*Owner{ownerB, {UID: 0, GID: 0}} {
		w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096, Owner: own})
		if err == nil {
			w.Abort()
		}
		var oe *OwnerError
		if !errors.Is(err, ErrOwner) || !errors.As(err, &oe) || oe.UID != ownerA.UID || oe.Want != own.UID ||
			!strings.Contains(err.Error(), filepath.Join(dir, SubDir)) {
			t.Errorf("write for uid %d into uid %d's image: %v", own.UID, ownerA.UID, err)
		}
	}
	if after := fxTree(t, dir); after != before {
		t.Errorf("refused writers changed the image:\n%s\nnow:\n%s", before, after)
	}
}

// An incremental image refers to its parents' chunk files: they must be
// its owner's too. Dedup across the owner's own parents works.
func TestOwnerParents(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	base, child := filepath.Join(root, "base"), filepath.Join(root, "child")
	data := fxRand(92, 4*4096)
	fxWrite(t, base, Options{ChunkSize: 4096, Owner: ownerA}, []fxBuf{{BufferInfo{Address: 0x1000, Size: 4 * 4096}, data}})
	next := append(append([]byte(nil), data[:3*4096]...), fxRand(93, 4096)...)
	bufs := []fxBuf{{BufferInfo{Address: 0x1000, Size: 4 * 4096}, next}}

	st := fxWrite(t, child, Options{ChunkSize: 4096, Owner: ownerA, Parent: base}, bufs)
	if st.ChunksParent != 3 || st.ChunksNew != 1 {
		t.Errorf("child of the owner's own parent: %+v, want 3 chunks from the parent", st)
	}
	fxCheck(t, child, bufs)
	if bad := fxOwners(t, child, ownerA); len(bad) > 0 {
		t.Errorf("not the owner's: %v", bad)
	}

	other := filepath.Join(root, "other")
	w, err := Create(other, fxOrigin(), Options{ChunkSize: 4096, Owner: ownerB, Parent: base})
	if err == nil {
		w.Abort()
	}
	if !errors.Is(err, ErrOwner) || !strings.Contains(err.Error(), filepath.Join(base, SubDir)) {
		t.Errorf("a child of another user's parent: %v", err)
	}
	// Nor a parent of its own whose chain reaches another user's image
	// further up (made here by root, which checks nothing for itself, and
	// given to B).
	mixed := filepath.Join(root, "mixed")
	fxWrite(t, mixed, Options{ChunkSize: 4096, Parent: base}, bufs)
	filepath.Walk(mixed, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, ownerB.UID, ownerB.GID) })
	w, err = Create(other, fxOrigin(), Options{ChunkSize: 4096, Owner: ownerB, Parent: mixed})
	if err == nil {
		w.Abort()
	}
	if !errors.Is(err, ErrOwner) || !strings.Contains(err.Error(), filepath.Join(base, SubDir)) {
		t.Errorf("a child of a parent whose own parent is another user's: %v", err)
	}
	if _, err := os.Stat(filepath.Join(other, SubDir, manifestName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused child was committed: %v", err)
	}
}

// With SubDirMustExist the writer makes nothing in DIR itself.
func TestSubDirMustExist(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096, SubDirMustExist: true})
	if err == nil {
		w.Abort()
		t.Fatal("Create made DIR/gpucr though it had to exist")
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error %v, want ErrNotExist", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("%d entries made in DIR", len(ents))
	}
	if err := os.Mkdir(filepath.Join(dir, SubDir), 0o700); err != nil {
		t.Fatal(err)
	}
	bufs := []fxBuf{{BufferInfo{Address: 0x1000, Size: 4096}, fxRand(94, 4096)}}
	fxWrite(t, dir, Options{ChunkSize: 4096, SubDirMustExist: true}, bufs)
	fxCheck(t, dir, bufs)
}

// CreateAt and OpenAt work beneath the directory the descriptor is open on,
// whatever its path names later.
func TestCreateAtOpenAt(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "img")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// The path now leads elsewhere: a symlink to another directory.
	moved, decoy := filepath.Join(root, "moved"), filepath.Join(root, "decoy")
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(decoy, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(decoy, dir); err != nil {
		t.Fatal(err)
	}
	w, err := CreateAt(d, fxOrigin(), Options{ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if w.Dir() != moved {
		t.Errorf("Dir %s, want %s", w.Dir(), moved)
	}
	data := fxRand(95, 2*4096)
	bw, _ := w.AddBuffer(BufferInfo{Address: 0x1000, Size: uint64(len(data))})
	bw.Write(data)
	bw.Close()
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(decoy); len(ents) != 0 {
		t.Errorf("written into the directory the path names now: %d entries", len(ents))
	}
	fxCheck(t, moved, []fxBuf{{BufferInfo{}, data}})
	im, err := OpenAt(d, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if im.Dir() != moved || len(im.Buffers()) != 1 {
		t.Errorf("OpenAt: dir %s, %d buffers", im.Dir(), len(im.Buffers()))
	}
	if err := im.Verify(); err != nil {
		t.Error(err)
	}
	// Not a directory: refused.
	f, err := os.Open(filepath.Join(moved, SubDir, manifestName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if w, err := CreateAt(f, fxOrigin(), Options{}); err == nil {
		w.Abort()
		t.Error("CreateAt of a regular file")
	}
}

// The opening rules hold where the kernel has no openat2 (the components
// are walked one by one).
func TestHostileWithoutOpenat2(t *testing.T) {
	noOpenat2.Store(true)
	defer noOpenat2.Store(false)
	t.Run("fifo manifest", testFIFOManifest)
	t.Run("fifo chunk", testFIFOChunk)
	t.Run("fifo lock", testFIFOLock)
	t.Run("symlinks", testSymlinksInImage)
	dir, bufs := fxImage(t)
	fxCheck(t, dir, bufs)
}

// gc run by root on a user's images leaves them the user's: a manifest it
// rewrites (marked pruned) and a lock file it makes belong to the image's
// owner, and the owner's writer still accepts the image.
func TestGCKeepsOwner(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	data := fxRand(96, 4*4096)
	fxWrite(t, a, Options{ChunkSize: 4096, Owner: ownerA}, []fxBuf{{BufferInfo{Address: 0x1000, Size: 4 * 4096}, data}})
	next := append(append([]byte(nil), data[:3*4096]...), fxRand(97, 4096)...)
	bufs := []fxBuf{{BufferInfo{Address: 0x1000, Size: 4 * 4096}, next}}
	fxWrite(t, b, Options{ChunkSize: 4096, Owner: ownerA, Parent: a}, bufs)
	os.Remove(filepath.Join(a, SubDir, lockName))
	rep, err := GC([]string{b}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Pruned) != 1 {
		t.Fatalf("gc pruned %v, want a", rep.Pruned)
	}
	for _, d := range []string{a, b} {
		if bad := fxOwners(t, d, ownerA); len(bad) > 0 {
			t.Errorf("after gc, not the owner's: %v", bad)
		}
	}
	fxCheck(t, b, bufs)
	// The owner writes a new image into a: what gc left there is its own.
	fxWrite(t, a, Options{ChunkSize: 4096, Owner: ownerA}, bufs)
	fxCheck(t, a, bufs)
}

// fxOwnedChain writes own's a -> b (b changes one chunk of a) under root and
// returns their directories; root itself belongs to own too.
func fxOwnedChain(t *testing.T, root string, own *Owner) (a, b string, bufs []fxBuf) {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(root, own.UID, own.GID); err != nil {
		t.Fatal(err)
	}
	a, b = filepath.Join(root, "a"), filepath.Join(root, "b")
	data := fxRand(uint64(own.UID), 4*4096)
	fxWrite(t, a, Options{ChunkSize: 4096, Owner: own}, []fxBuf{{BufferInfo{Address: 0x1000, Size: 4 * 4096}, data}})
	next := append(append([]byte(nil), data[:3*4096]...), fxRand(98, 4096)...)
	bufs = []fxBuf{{BufferInfo{Address: 0x1000, Size: 4 * 4096}, next}}
	fxWrite(t, b, Options{ChunkSize: 4096, Owner: own, Parent: a}, bufs)
	for _, d := range []string{a, b} {
		os.Remove(filepath.Join(d, SubDir, lockName))
		if err := os.Chown(d, own.UID, own.GID); err != nil {
			t.Fatal(err)
		}
	}
	return a, b, bufs
}

// A confined gc run by root on a user's path acts only on that user's
// images: a symlink of user B to user A's newest incremental image, or B's
// image whose manifest names A's as its parent, is refused (ErrOwner), and
// A's parent is neither pruned nor loses a chunk. B's own chain is gc'd.
func TestGCConfinedToThePathsOwner(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	victimA, victimB, _ := fxOwnedChain(t, filepath.Join(root, "victim"), ownerA)
	filesA := fxChunkFiles(t, victimA)

	attacker := filepath.Join(root, "attacker")
	_, ownB, bufsB := fxOwnedChain(t, attacker, ownerB)
	link := filepath.Join(attacker, "img")
	if err := os.Symlink(victimB, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, ownerB.UID, ownerB.GID); err != nil {
		t.Fatal(err)
	}
	// B's own image re-pointed at A's parent: its manifest is B's to write.
	forged := filepath.Join(attacker, "forged")
	fxCopyTree(t, victimB, forged)
	for _, p := range []string{forged, filepath.Join(forged, SubDir)} {
		if err := os.Chown(p, ownerB.UID, ownerB.GID); err != nil {
			t.Fatal(err)
		}
	}
	filepath.Walk(filepath.Join(forged, SubDir), func(p string, _ os.FileInfo, _ error) error {
		return os.Lchown(p, ownerB.UID, ownerB.GID)
	})
	m, err := loadManifest(forged)
	if err != nil {
		t.Fatal(err)
	}
	m.Parent.Path = "../../victim/a"
	g, err := openDirPath(filepath.Join(forged, SubDir))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := storeManifest(g, m, ownerB); err != nil {
		t.Fatal(err)
	}
	g.close()

	for _, keep := range []string{link, forged} {
		rep, err := GCWith([]string{keep}, GCOptions{Confined: true})
		if !errors.Is(err, ErrOwner) {
			t.Errorf("confined gc of %s: %+v, %v; want ErrOwner", keep, rep, err)
		}
	}
	if _, err := Open(victimA); err != nil {
		t.Errorf("A's parent image after B's gc: %v", err)
	}
	if n := fxChunkFiles(t, victimA); n != filesA {
		t.Errorf("A's parent image has %d chunk files, %d before", n, filesA)
	}
	// Unconfined, as before (a user gc'ing as themselves: the kernel's
	// permissions are the rule), the symlink is followed.
	if _, err := GCWith([]string{ownB}, GCOptions{Confined: true}); err != nil {
		t.Fatalf("confined gc of B's own image: %v", err)
	}
	fxCheck(t, ownB, bufsB)
}

// In a shared series directory (1777, root's), root's --auto-parent takes
// root's newest image, not another user's newer one; a user's takes their own.
func TestLatestOwned(t *testing.T) {
	needRoot(t)
	base := filepath.Join(t.TempDir(), "series")
	if err := os.Mkdir(base, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, own *Owner) string {
		dir := filepath.Join(base, name)
		fxWrite(t, dir, Options{ChunkSize: 4096, Owner: own}, []fxBuf{{BufferInfo{Address: 0x1000, Size: 4096}, fxRand(5, 4096)}})
		if own != nil {
			if err := os.Chown(dir, own.UID, own.GID); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	mine := mk("1", nil)
	time.Sleep(10 * time.Millisecond)
	mk("2", ownerA)
	if got, err := Latest(base, filepath.Join(base, "3")); err != nil || got != filepath.Join(base, "2") {
		t.Fatalf("Latest = %q, %v: want the newest of anyone's", got, err)
	}
	if got, err := LatestOwned(base, filepath.Join(base, "3")); err != nil || got != mine {
		t.Errorf("LatestOwned = %q, %v; want root's own %s", got, err, mine)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(base, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, ownerA.UID, ownerA.GID); err != nil {
		t.Fatal(err)
	}
	// Through A's symlink the path is A's: A's newest.
	if got, err := LatestOwned(link, filepath.Join(link, "3")); err != nil || got != filepath.Join(base, "2") {
		t.Errorf("LatestOwned through A's link = %q, %v", got, err)
	}
}

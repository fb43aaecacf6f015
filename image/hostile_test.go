package image

// What a hostile image directory holds must neither hang a reader or writer
// (a FIFO where a file should be), nor send it elsewhere (a symlink where a
// file or directory should be), nor lose files it did not write.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fxQuick runs f and fails the test if it has not returned within 5 s, as
// an open waiting on the FIFO fifo would not; the FIFO is then opened both
// ways, which lets such an open return.
func fxQuick(t *testing.T, what, fifo string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		if fd, err := syscall.Open(fifo, syscall.O_RDWR|syscall.O_NONBLOCK, 0); err == nil {
			time.Sleep(100 * time.Millisecond)
			syscall.Close(fd)
		}
		t.Fatalf("%s hung on the FIFO %s", what, fifo)
		return nil
	}
}

// fxMkfifo replaces path with a FIFO.
func fxMkfifo(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o666); err != nil {
		t.Fatal(err)
	}
}

// fxImage writes a small committed image of 3 distinct chunks into a new
// directory and returns it.
func fxImage(t *testing.T) (string, []fxBuf) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "img")
	bufs := []fxBuf{{BufferInfo{Address: 0x100000, Size: 3 * 4096}, fxRand(71, 3*4096)}}
	fxWrite(t, dir, Options{ChunkSize: 4096}, bufs)
	return dir, bufs
}

// fxWantType checks that err says path is a kind, as a damaged image.
func fxWantType(t *testing.T, what string, err error, path, kind string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error with a %s at %s", what, kind, path)
	}
	t.Logf("%s: %v", what, err)
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "is a "+kind+", not a ") || !errors.Is(err, ErrCorrupt) {
		t.Errorf("%s: %v; want an error naming %s as a %s (errors.Is ErrCorrupt)", what, err, path, kind)
	}
}

func TestFIFOManifest(t *testing.T) { testFIFOManifest(t) }

func testFIFOManifest(t *testing.T) {
	dir, bufs := fxImage(t)
	mf := ManifestPath(dir)
	fxMkfifo(t, mf)
	err := fxQuick(t, "Open", mf, func() error { _, err := Open(dir); return err })
	fxWantType(t, "Open", err, mf, "FIFO")
	if !strings.Contains(err.Error(), "is a FIFO, not a regular file") {
		t.Errorf("Open: %v", err)
	}
	// A writer looks at the manifest it replaces (to reuse its chunks): a
	// FIFO there is no image to reuse, and the new one is committed.
	err = fxQuick(t, "Create over it", mf, func() error {
		w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096})
		if err != nil {
			return err
		}
		return w.Abort()
	})
	if err != nil {
		t.Fatalf("Create over a FIFO manifest: %v", err)
	}
	fxWrite(t, dir, Options{ChunkSize: 4096}, bufs)
	fxCheck(t, dir, bufs)
}

func TestFIFOChunk(t *testing.T) { testFIFOChunk(t) }

func testFIFOChunk(t *testing.T) {
	dir, _ := fxImage(t)
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	file := im.ChunkFile(0, 1)
	fxMkfifo(t, file)
	err = fxQuick(t, "CheckFiles", file, im.CheckFiles)
	fxWantType(t, "CheckFiles", err, file, "FIFO")
	err = fxQuick(t, "Verify", file, im.Verify)
	fxWantType(t, "Verify", err, file, "FIFO")
	err = fxQuick(t, "Read", file, func() error {
		r, err := im.OpenBuffer(0)
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.ReadAll(r)
		return err
	})
	fxWantType(t, "Read", err, file, "FIFO")
	var ce *ChunkError
	if !errors.As(err, &ce) || ce.Chunk != 1 || ce.File != file {
		t.Errorf("Read: %v; want a ChunkError for chunk 1 (%s)", err, file)
	}
}

func TestSymlinksInImage(t *testing.T) { testSymlinksInImage(t) }

func testSymlinksInImage(t *testing.T) {
	t.Run("manifest", func(t *testing.T) {
		// A symlink to another valid manifest is not followed.
		a, _ := fxImage(t)
		b, _ := fxImage(t)
		mf := ManifestPath(b)
		os.Remove(mf)
		if err := os.Symlink(ManifestPath(a), mf); err != nil {
			t.Fatal(err)
		}
		_, err := Open(b)
		fxWantType(t, "Open", err, mf, "symlink")
	})
	t.Run("chunk directory", func(t *testing.T) {
		// chunks/HH moved away and a symlink to it put in its place: the
		// chunks are not read through it.
		dir, _ := fxImage(t)
		im, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		sub := filepath.Dir(im.ChunkFile(0, 0))
		moved := filepath.Join(t.TempDir(), "moved")
		if err := os.Rename(sub, moved); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(moved, sub); err != nil {
			t.Fatal(err)
		}
		fxWantType(t, "CheckFiles", im.CheckFiles(), sub, "symlink")
		if _, err := fxReadAll(dir); err == nil || !strings.Contains(err.Error(), sub+" is a symlink") {
			t.Errorf("read through a symlinked chunk directory: %v", err)
		}
	})
	t.Run("gpucr directory", func(t *testing.T) {
		// DIR/gpucr a symlink to a directory elsewhere: neither read nor
		// written through.
		dir := filepath.Join(t.TempDir(), "img")
		elsewhere, _ := fxImage(t)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(elsewhere, SubDir), filepath.Join(dir, SubDir)); err != nil {
			t.Fatal(err)
		}
		_, err := Open(dir)
		fxWantType(t, "Open", err, filepath.Join(dir, SubDir), "symlink")
		before := fxTree(t, elsewhere)
		w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096})
		if err == nil {
			w.Abort()
		}
		fxWantType(t, "Create", err, filepath.Join(dir, SubDir), "symlink")
		if after := fxTree(t, elsewhere); after != before {
			t.Errorf("the directory the symlink points to changed:\n%s\nnow:\n%s", before, after)
		}
	})
	t.Run("chunks written through", func(t *testing.T) {
		// DIR/gpucr/chunks a symlink to a directory elsewhere: no chunk
		// file is written there.
		dir := filepath.Join(t.TempDir(), "img")
		outside := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, SubDir), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(dir, SubDir, chunksName)); err != nil {
			t.Fatal(err)
		}
		w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096})
		if err == nil {
			bw, _ := w.AddBuffer(BufferInfo{Address: 0x1000, Size: 4096})
			err = bw.WriteChunk(0, fxRand(5, 4096))
			if err == nil {
				err = bw.Close()
			}
			if err == nil {
				err = w.Commit()
			} else {
				w.Abort()
			}
		}
		fxWantType(t, "write", err, filepath.Join(dir, SubDir, chunksName), "symlink")
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Errorf("%d entries written through the symlink into %s", len(ents), outside)
		}
	})
	t.Run("lock", func(t *testing.T) {
		// DIR/gpucr/.lock a symlink to a file that does not exist yet: no
		// file is made there.
		dir, _ := fxImage(t)
		target := filepath.Join(t.TempDir(), "made-through-the-lock")
		lock := filepath.Join(dir, SubDir, lockName)
		os.Remove(lock)
		if err := os.Symlink(target, lock); err != nil {
			t.Fatal(err)
		}
		w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096})
		if err == nil {
			w.Abort()
		}
		fxWantType(t, "Create", err, lock, "symlink")
		if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a file was made through the lock symlink: %v", err)
		}
	})
}

func TestFIFOLock(t *testing.T) { testFIFOLock(t) }

func testFIFOLock(t *testing.T) {
	dir, _ := fxImage(t)
	lock := filepath.Join(dir, SubDir, lockName)
	fxMkfifo(t, lock)
	err := fxQuick(t, "Create", lock, func() error {
		w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096})
		if err == nil {
			w.Abort()
		}
		return err
	})
	fxWantType(t, "Create", err, lock, "FIFO")
}

// fxTree describes every entry under dir (name, type, size), to compare.
func fxTree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			b.WriteString(p + " " + fi.Mode().String() + " " + string(rune('0'+fi.Size()%10)) + "\n")
		}
		return nil
	})
	return b.String()
}

// A Writer removes only what it created: temporary files it finds (a dead
// writer's, or anyone's) stay, after a commit and after an abort, and do
// not stop the write (not even one named as the chunks it writes would be
// by a writer that named them by hash and sequence number alone).
func TestWriterKeepsTempsItDidNotMake(t *testing.T) {
	for _, commit := range []bool{true, false} {
		dir, old := fxImage(t)
		bufs := []fxBuf{{old[0].info, fxRand(98, len(old[0].data))}}
		planted := []string{
			filepath.Join(dir, SubDir, tmpPrefix+"c-0123-1"),
			filepath.Join(dir, SubDir, tmpPrefix+"manifest-abcd"),
		}
		for i := 0; i < 3; i++ {
			h := hashOf(bufs[0].data[i*4096 : (i+1)*4096])
			for seq := 1; seq <= 3; seq++ {
				planted = append(planted, filepath.Join(dir, SubDir, fmt.Sprintf("%sc-%s-%d", tmpPrefix, h, seq)))
			}
		}
		for _, p := range planted {
			if err := os.WriteFile(p, []byte("not the writer's"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096})
		if err != nil {
			t.Fatal(err)
		}
		bw, _ := w.AddBuffer(bufs[0].info)
		if _, err := bw.Write(bufs[0].data); err != nil {
			t.Fatalf("write beside planted temporary files: %v", err)
		}
		if err := bw.Close(); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = w.Commit()
		} else {
			err = w.Abort()
		}
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			fxCheck(t, dir, bufs)
		}
		for _, p := range planted {
			if b, err := os.ReadFile(p); err != nil || string(b) != "not the writer's" {
				t.Errorf("commit=%v: %s was removed or changed by a writer that did not make it (%v)", commit, p, err)
			}
		}
	}
}

// Abort removes the chunk files its write created, but not a file that
// took the place of one since.
func TestAbortRemovesOnlyItsOwn(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "img")
	w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	bw, _ := w.AddBuffer(BufferInfo{Address: 0x1000, Size: 2 * 4096})
	a, b := fxRand(81, 4096), fxRand(82, 4096)
	if err := bw.WriteChunk(0, a); err != nil {
		t.Fatal(err)
	}
	if err := bw.WriteChunk(1, b); err != nil {
		t.Fatal(err)
	}
	fa := chunkPath(dir, hashOf(a))
	fb := chunkPath(dir, hashOf(b))
	// Another file, renamed over it (made while the first still existed:
	// another inode).
	if err := os.WriteFile(fb+".new", []byte("someone else's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(fb+".new", fb); err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fa); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Abort left the chunk file it wrote: %v", err)
	}
	if got, err := os.ReadFile(fb); err != nil || string(got) != "someone else's" {
		t.Errorf("Abort removed a file it did not make: %q, %v", got, err)
	}
}

// What the package creates is its owner's alone: directories 0700, files
// 0600, whatever the umask lets through.
func TestImageModes(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir, _ := fxImage(t)
	err := filepath.Walk(filepath.Join(dir, SubDir), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if fi.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

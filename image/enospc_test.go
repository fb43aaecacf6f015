package image

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fxSmallFS mounts a tmpfs of size bytes, or skips the test where mounting
// is not allowed (not root, no CAP_SYS_ADMIN).
func fxSmallFS(t *testing.T, size string) string {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("cannot mount a small tmpfs here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func TestDiskFull(t *testing.T) {
	for _, workers := range []int{1, 4} {
		dir := fxSmallFS(t, "256k")
		old := []fxBuf{{BufferInfo{Address: 0x100000, Size: 8 * 4096}, fxRand(80, 8*4096)}}
		fxWrite(t, dir, Options{ChunkSize: 4096}, old)
		files := fxChunkFiles(t, dir)

		w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096, Workers: workers})
		if err != nil {
			t.Fatal(err)
		}
		bw, err := w.AddBuffer(BufferInfo{Pid: 3, Address: 0x7700000, Size: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		data := fxRand(81, 1<<20)
		var werr error
		for off := 0; off < len(data) && werr == nil; off += 64 << 10 {
			_, werr = bw.Write(data[off : off+64<<10])
		}
		if werr == nil {
			werr = bw.Close()
		}
		cerr := w.Commit()
		var ce *ChunkError
		for _, err := range []error{werr, cerr} {
			if err == nil {
				continue
			}
			if !errors.Is(err, syscall.ENOSPC) || !errors.As(err, &ce) || ce.Buffer != 0 || ce.Address != 0x7700000 {
				t.Fatalf("error %v: want ENOSPC naming buffer 0 and its chunk", err)
			}
		}
		if cerr == nil {
			t.Fatal("Commit succeeded on a full disk")
		}
		t.Logf("workers %d: write: %v; commit: %v", workers, werr, cerr)
		if err := w.Abort(); err != nil {
			t.Fatalf("Abort: %v", err)
		}
		fxCheck(t, dir, old)
		if n := fxChunkFiles(t, dir); n != files {
			t.Errorf("%d chunk files after Abort, want %d", n, files)
		}
		if tmp := fxTemps(t, dir); len(tmp) != 0 {
			t.Errorf("temporary files left: %v", tmp)
		}
		// The space is back: the next write succeeds.
		fxWrite(t, dir, Options{ChunkSize: 4096}, []fxBuf{{BufferInfo{Address: 0x100000, Size: 16 * 4096}, fxRand(82, 16*4096)}})
		os.RemoveAll(dir + "/" + SubDir)
	}
}

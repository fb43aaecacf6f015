package image

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fxChunkFiles counts the chunk files of the image directory dir.
func fxChunkFiles(t testing.TB, dir string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, SubDir, chunksName, "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(files)
}

// fxTemps lists leftover temporary files of dir.
func fxTemps(t testing.TB, dir string) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, SubDir, tmpPrefix+"*"))
	return files
}

func TestRoundTrip(t *testing.T) {
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		t.Run(comp.String(), func(t *testing.T) {
			dir := t.TempDir()
			compressible := bytes.Repeat([]byte("gpucr "), 20000)
			bufs := []fxBuf{
				{BufferInfo{Pid: 1, Device: 0, GPUUUID: "GPU-a", Address: 0x7f0000000000, Size: 100000, Kind: AllocVMM}, fxRand(1, 100000)},
				{BufferInfo{Pid: 1, Device: 1, GPUUUID: "GPU-b", Address: 0x7f0000100000, Size: 16384}, make([]byte, 16384)},
				{BufferInfo{Pid: 2, Device: 0, GPUUUID: "GPU-a", Address: 0x7f0000000000, Size: uint64(len(compressible)), Kind: AllocAsync}, compressible},
				{BufferInfo{Pid: 2, Device: 0, Address: 0x7f0000200000, Size: 7, Kind: AllocPitch}, []byte("1234567")},
				{BufferInfo{Pid: 3, Address: 0x1000, Size: 0, Kind: AllocOther}, nil},
			}
			st := fxWrite(t, dir, Options{ChunkSize: 4096, Compression: comp}, bufs)
			fxCheck(t, dir, bufs)
			if st.ChunksZero != 4 || st.Buffers != len(bufs) || st.BytesIn != int64(100000+16384+len(compressible)+7) {
				t.Errorf("stats %+v", st)
			}
			im, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			for i, b := range im.Buffers() {
				if b != bufs[i].info {
					t.Errorf("buffer %d: info %+v, want %+v", i, b, bufs[i].info)
				}
			}
			o, want := OriginOf(im.Manifest()), fxOrigin()
			if !o.Time.Equal(want.Time) {
				t.Errorf("origin time %v, want %v", o.Time, want.Time)
			}
			o.Time = want.Time
			if o != want {
				t.Errorf("origin %+v, want %+v", o, want)
			}
			if comp == CompressionZstd && st.BytesStored >= int64(len(compressible)) {
				t.Errorf("zstd stored %d bytes", st.BytesStored)
			}
			if err := im.Verify(); err != nil {
				t.Errorf("Verify: %v", err)
			}
		})
	}
}

func TestZeroChunksTakeNoFile(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 10*4096)
	copy(data[3*4096:], "not zero")
	st := fxWrite(t, dir, Options{ChunkSize: 4096}, []fxBuf{{BufferInfo{Address: 1 << 20, Size: uint64(len(data))}, data}})
	if st.ChunksZero != 9 || st.ChunksNew != 1 || fxChunkFiles(t, dir) != 1 {
		t.Fatalf("stats %+v, %d files; want 9 zero chunks and 1 file", st, fxChunkFiles(t, dir))
	}
	fxCheck(t, dir, []fxBuf{{data: data}})
}

func TestDedupWithinImage(t *testing.T) {
	dir := t.TempDir()
	a := fxRand(2, 8*1024)
	same := append(append([]byte(nil), a...), a...) // chunks repeat inside one buffer too
	bufs := []fxBuf{
		{BufferInfo{Pid: 1, Address: 0x1000000, Size: uint64(len(same))}, same},
		{BufferInfo{Pid: 2, Address: 0x1000000, Size: uint64(len(a))}, a},
	}
	st := fxWrite(t, dir, Options{ChunkSize: 1024, Workers: 4}, bufs)
	if st.ChunksNew != 8 || st.ChunksDedup != 16 || fxChunkFiles(t, dir) != 8 {
		t.Fatalf("stats %+v, %d files; want 8 new and 16 dedup", st, fxChunkFiles(t, dir))
	}
	fxCheck(t, dir, bufs)
}

func TestIncrementalUnchangedWritesNothing(t *testing.T) {
	root := t.TempDir()
	full, inc, inc2 := filepath.Join(root, "ckpt-1"), filepath.Join(root, "ckpt-2"), filepath.Join(root, "ckpt-3")
	bufs := []fxBuf{
		{BufferInfo{Pid: 7, Device: 0, Address: 0x7000000000, Size: 64 << 10}, fxRand(3, 64<<10)},
		{BufferInfo{Pid: 7, Device: 1, Address: 0x7100000000, Size: 40 << 10}, fxRand(4, 40<<10)},
	}
	fxWrite(t, full, Options{ChunkSize: 4096}, bufs)
	st := fxWrite(t, inc, Options{ChunkSize: 4096, Parent: full}, bufs)
	if st.ChunksNew != 0 || st.BytesStored != 0 || st.ChunksParent != 26 || fxChunkFiles(t, inc) != 0 {
		t.Fatalf("unchanged incremental: stats %+v, %d files; want nothing stored", st, fxChunkFiles(t, inc))
	}
	fxCheck(t, inc, bufs)

	// One changed chunk: one new file; the rest comes from the grandparent.
	bufs[1].data = append([]byte(nil), bufs[1].data...)
	bufs[1].data[5000] ^= 1
	st = fxWrite(t, inc2, Options{ChunkSize: 4096, Parent: inc}, bufs)
	if st.ChunksNew != 1 || st.ChunksParent != 25 || fxChunkFiles(t, inc2) != 1 {
		t.Fatalf("one chunk changed: stats %+v", st)
	}
	fxCheck(t, inc2, bufs)
	im, err := Open(inc2)
	if err != nil {
		t.Fatal(err)
	}
	if got := im.Manifest().GetParent().GetPath(); got != "../ckpt-2" {
		t.Errorf("parent stored as %q, want ../ckpt-2", got)
	}
	if len(im.Chain()) != 3 {
		t.Errorf("chain %v, want 3 images", im.Chain())
	}
	// The chain still resolves when the whole tree moves.
	moved := filepath.Join(t.TempDir(), "moved")
	if err := os.Rename(root, moved); err != nil {
		t.Fatal(err)
	}
	fxCheck(t, filepath.Join(moved, "ckpt-3"), bufs)
}

func TestConcurrentAddBuffer(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, fxOrigin(), Options{ChunkSize: 2048, Workers: 3, MaxBuffered: 4 * 2048})
	if err != nil {
		t.Fatal(err)
	}
	const n = 48
	bufs := make([]fxBuf, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			size := 1000 + i*777
			data := fxRand(uint64(100+i), size)
			if i%5 == 0 {
				data = make([]byte, size)
			}
			info := BufferInfo{Pid: 100 + i%3, Device: i % 2, Address: 0x10000000 + uint64(i)<<24, Size: uint64(size)}
			bw, err := w.AddBuffer(info)
			if err == nil {
				_, err = bw.Write(data)
			}
			if err == nil {
				err = bw.Close()
			}
			bufs[i] = fxBuf{info, data}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fxReadAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for i, info := range im.Buffers() {
		for _, b := range bufs {
			if b.info == info {
				found++
				if !bytes.Equal(got[i], b.data) {
					t.Errorf("buffer %+v: data differs", info)
				}
			}
		}
	}
	if found != n {
		t.Fatalf("found %d of %d buffers", found, n)
	}
}

// Many open buffers written interleaved from one goroutine with a budget of
// one chunk: must not deadlock.
func TestInterleavedWritesSmallBudget(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096, Workers: 1, MaxBuffered: 4096})
	if err != nil {
		t.Fatal(err)
	}
	var bws []*BufferWriter
	var bufs []fxBuf
	for i := 0; i < 8; i++ {
		info := BufferInfo{Address: uint64(i+1) << 30, Size: 3 * 4096}
		bw, err := w.AddBuffer(info)
		if err != nil {
			t.Fatal(err)
		}
		bws = append(bws, bw)
		bufs = append(bufs, fxBuf{info, fxRand(uint64(i), 3*4096)})
	}
	for off := 0; off < 3*4096; off += 1000 {
		for i, bw := range bws {
			end := min(off+1000, 3*4096)
			if _, err := bw.Write(bufs[i].data[off:end]); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, bw := range bws {
		if err := bw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	fxCheck(t, dir, bufs)
}

func TestBudgetBlocksWhileChunksAreQueued(t *testing.T) {
	b := newBudget(100)
	if err := b.acquire(60); err != nil {
		t.Fatal(err)
	}
	// Nothing queued: exceeding is allowed (the budget is in partial chunks).
	if err := b.acquire(60); err != nil {
		t.Fatal(err)
	}
	b.submit(60)
	done := make(chan error)
	go func() { done <- b.acquire(60) }()
	select {
	case <-done:
		t.Fatal("acquire did not block with a full budget and queued chunks")
	default:
	}
	b.release(60, true)
	b.release(60, false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b.submit(60)
	go func() { done <- b.acquire(60) }()
	b.fail(errAborted)
	if err := <-done; !errors.Is(err, ErrIncomplete) {
		t.Fatalf("acquire after fail: %v", err)
	}
}

func TestWriterMisuse(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	bw, err := w.AddBuffer(BufferInfo{Pid: 1, Address: 0x10000, Size: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range []BufferInfo{
		{Pid: 1, Address: 0x10000, Size: 1},
		{Pid: 1, Address: 0x10000 + 99, Size: 10},
		{Pid: 1, Address: 0x10000 - 1, Size: 2},
		{Pid: 1, Address: ^uint64(0), Size: 2},
		{Pid: 1, Address: 0x90000, Size: 2, Kind: AllocKind(9)},
	} {
		if _, err := w.AddBuffer(info); err == nil {
			t.Errorf("AddBuffer(%+v) accepted", info)
		}
	}
	if _, err := w.AddBuffer(BufferInfo{Pid: 2, Address: 0x10000, Size: 100}); err != nil {
		t.Errorf("same address in another process: %v", err)
	}
	if _, err := bw.Write(make([]byte, 101)); err == nil || !strings.Contains(err.Error(), "passes its size") {
		t.Errorf("write past the end: %v", err)
	}
	bw.Write(make([]byte, 50))
	if err := bw.Close(); !errors.Is(err, ErrIncomplete) {
		t.Errorf("short Close: %v", err)
	}
	err = w.Commit()
	if !errors.Is(err, ErrIncomplete) || !strings.Contains(err.Error(), "buffer 0 (0x10000)") {
		t.Errorf("Commit with an unfinished buffer: %v", err)
	}
	if _, err := Open(dir); !errors.Is(err, ErrIncomplete) {
		t.Errorf("Open after failed first write: %v, want ErrIncomplete", err)
	}
	if err := w.Abort(); err != nil {
		t.Errorf("Abort after failed Commit: %v", err)
	}
	if _, err := Create(dir, fxOrigin(), Options{ChunkSize: -1}); err == nil {
		t.Error("negative chunk size accepted")
	}
	if _, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096, MaxBuffered: 100}); err == nil {
		t.Error("MaxBuffered below one chunk accepted")
	}
}

func TestOneWriterPerDir(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, fxOrigin(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Create(dir, fxOrigin(), Options{}); !errors.Is(err, ErrBusy) {
		t.Errorf("second Create: %v, want ErrBusy", err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	w, err = Create(dir, fxOrigin(), Options{})
	if err != nil {
		t.Fatalf("Create after Abort: %v", err)
	}
	w.Abort()
}

func TestAbortKeepsPreviousImage(t *testing.T) {
	dir := t.TempDir()
	old := []fxBuf{{BufferInfo{Address: 0x100000, Size: 5 * 4096}, fxRand(5, 5*4096)}}
	fxWrite(t, dir, Options{ChunkSize: 4096}, old)
	files := fxChunkFiles(t, dir)

	w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	bw, _ := w.AddBuffer(BufferInfo{Address: 0x100000, Size: 8 * 4096})
	// Half new data, half the old image's chunks (reused, must survive Abort).
	bw.Write(old[0].data[:4*4096])
	bw.Write(fxRand(6, 4*4096))
	bw.Close()
	// Before Commit, DIR still shows the old image.
	fxCheck(t, dir, old)
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	fxCheck(t, dir, old)
	if n := fxChunkFiles(t, dir); n != files {
		t.Errorf("%d chunk files after Abort, want %d", n, files)
	}
	if tmp := fxTemps(t, dir); len(tmp) != 0 {
		t.Errorf("temporary files left: %v", tmp)
	}
	if err := w.Commit(); err == nil {
		t.Error("Commit after Abort succeeded")
	}
}

// A new image written into a DIR that holds one reuses its chunk files and
// replaces it only at the rename.
func TestRewriteSameDir(t *testing.T) {
	dir := t.TempDir()
	v1 := []fxBuf{{BufferInfo{Address: 0x100000, Size: 6 * 4096}, fxRand(7, 6*4096)}}
	fxWrite(t, dir, Options{ChunkSize: 4096, Compression: CompressionZstd}, v1)
	v2 := []fxBuf{{BufferInfo{Address: 0x100000, Size: 6 * 4096}, append(append([]byte(nil), v1[0].data[:3*4096]...), fxRand(8, 3*4096)...)}}
	st := fxWrite(t, dir, Options{ChunkSize: 4096}, v2)
	if st.ChunksDedup != 3 || st.ChunksNew != 3 {
		t.Errorf("stats %+v: want the 3 old chunks reused", st)
	}
	fxCheck(t, dir, v2)
}

// Crash simulation: the directory as a crash would leave it at each step
// of a write (snapshots taken while the Writer works) reads as the previous
// image, or as incomplete when there was none.
func TestCrashLeavesPreviousImage(t *testing.T) {
	for _, withOld := range []bool{false, true} {
		t.Run(fmt.Sprint("previous=", withOld), func(t *testing.T) {
			dir := t.TempDir()
			old := []fxBuf{{BufferInfo{Address: 0x200000, Size: 3 * 4096}, fxRand(9, 3*4096)}}
			if withOld {
				fxWrite(t, dir, Options{ChunkSize: 4096}, old)
			}
			w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096, Workers: 1})
			if err != nil {
				t.Fatal(err)
			}
			bw, _ := w.AddBuffer(BufferInfo{Address: 0x200000, Size: 3 * 4096})
			snap := func(step string) {
				crashed := filepath.Join(t.TempDir(), "crashed")
				fxCopyTree(t, dir, crashed)
				// A temporary manifest a crash left behind must not be read.
				os.WriteFile(filepath.Join(crashed, SubDir, tmpPrefix+"manifest-x"), []byte("partial"), 0o644)
				_, err := fxReadAll(crashed)
				if withOld {
					fxCheck(t, crashed, old)
				} else if !errors.Is(err, ErrIncomplete) {
					t.Errorf("%s: crashed first write reads as %v, want ErrIncomplete", step, err)
				}
			}
			snap("created")
			bw.Write(fxRand(10, 4096))
			snap("one chunk")
			bw.Write(fxRand(11, 2*4096))
			bw.Close()
			snap("all chunks")
			if err := w.Commit(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Regression: a Write blocked handing a chunk to busy workers must not stop
// Close, AddBuffer or the workers (once a lock held across the send
// deadlocked them).
func TestManyWritersNoDeadlock(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for round := 0; round < 8; round++ {
			dir := t.TempDir()
			w, err := Create(dir, fxOrigin(), Options{ChunkSize: 1024, Workers: 2, MaxBuffered: 64 * 1024})
			if err != nil {
				t.Error(err)
				return
			}
			var wg sync.WaitGroup
			for i := 0; i < 6; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for k := 0; k < 5; k++ {
						data := fxRand(uint64(round*100+i*10+k), 16*1024)
						bw, err := w.AddBuffer(BufferInfo{Pid: i, Address: uint64(k+1) << 20, Size: uint64(len(data))})
						if err == nil {
							_, err = bw.Write(data)
						}
						if err == nil {
							err = bw.Close()
						}
						if err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if err := w.Commit(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("writers deadlocked")
	}
}

package image

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpucr/gpucr/ptx"
)

// What a copy engine with GPU hashes does: RecordChunk first, and only the
// chunks it refuses are copied and written with their hash. Zero chunks,
// chunks equal to one met earlier in the write and chunks of the parent
// need no bytes; what is read back equals what was "on the GPU".
func TestRecordChunkNeedsBytesOnlyForNewContent(t *testing.T) {
	const cs = 4096
	root := t.TempDir()
	a := fxRand(1, 8*cs)
	clear(a[2*cs : 3*cs])                       // chunk 2: zero
	copy(a[5*cs:6*cs], a[0:cs])                 // chunk 5 equals chunk 0
	b := append(fxRand(2, 3*cs), a[cs:2*cs]...) // b's chunk 3 equals a's chunk 1
	b = append(b, 7, 7, 7)                      // a short last chunk

	// gpuWrite plays the engine: hashes with ptx.ChunkHash, records, copies
	// what is refused. It returns the chunks it had to copy.
	gpuWrite := func(dir string, opts Options, bufs []fxBuf) ([]int, WriteStats) {
		t.Helper()
		opts.ChunkSize = cs
		w, err := Create(dir, fxOrigin(), opts)
		if err != nil {
			t.Fatal(err)
		}
		var copied []int
		for bi, fb := range bufs {
			bw, err := w.AddBuffer(fb.info)
			if err != nil {
				t.Fatal(err)
			}
			for ci := 0; ci*cs < len(fb.data); ci++ {
				raw := fb.data[ci*cs : min((ci+1)*cs, len(fb.data))]
				h := ptx.ChunkHash(raw)
				done, err := bw.RecordChunk(ci, h)
				if err != nil {
					t.Fatal(err)
				}
				if !done {
					copied = append(copied, bi*100+ci)
					if err := bw.WriteChunkHashed(ci, raw, h); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := bw.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		return copied, w.Stats()
	}
	bufs := []fxBuf{{BufferInfo{Pid: 10, Address: 0x100000, Size: uint64(len(a))}, a},
		{BufferInfo{Pid: 11, Address: 0x100000, Size: uint64(len(b))}, b}}
	full := filepath.Join(root, "full")
	copied, st := gpuWrite(full, Options{}, bufs)
	// a: 0,1,3,4,6,7 new (2 zero, 5 = 0); b: 0,1,2,4 new (3 = a's 1)
	if want := []int{0, 1, 3, 4, 6, 7, 100, 101, 102, 104}; !equalInts(copied, want) {
		t.Errorf("copied %v, want %v", copied, want)
	}
	if st.ChunksNew != 10 || st.ChunksZero != 1 || st.ChunksDedup != 2 || st.ChunksParent != 0 {
		t.Errorf("full image stats %+v", st)
	}
	fxCheck(t, full, bufs)

	// The same memory again, one chunk changed: only that chunk is copied.
	a2 := bytes.Clone(a)
	a2[4*cs+9] ^= 0x40
	bufs2 := []fxBuf{{bufs[0].info, a2}, bufs[1]}
	inc := filepath.Join(root, "inc")
	copied, st = gpuWrite(inc, Options{Parent: full}, bufs2)
	if want := []int{4}; !equalInts(copied, want) {
		t.Errorf("incremental copied %v, want %v", copied, want)
	}
	if st.ChunksNew != 1 || st.ChunksParent != 11 || st.ChunksZero != 1 {
		t.Errorf("incremental stats %+v", st)
	}
	fxCheck(t, inc, bufs2)
	if err := verifyDir(inc); err != nil {
		t.Fatal(err)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A chunk written with a wrong hash is caught by every later check; a
// chunk given the hash of zero bytes is stored as a zero chunk.
func TestWriteChunkHashedTrustsTheHash(t *testing.T) {
	const cs = 4096
	dir := t.TempDir()
	w, err := Create(dir, fxOrigin(), Options{ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	data := fxRand(3, 2*cs)
	bw, err := w.AddBuffer(BufferInfo{Address: 0x200000, Size: 2 * cs})
	if err != nil {
		t.Fatal(err)
	}
	wrong := ptx.ChunkHash(data[cs:])
	if err := bw.WriteChunkHashed(0, data[:cs], wrong); err != nil {
		t.Fatal(err)
	}
	if err := bw.WriteChunkHashed(1, make([]byte, cs), ZeroChunkHash(cs)); err != nil {
		t.Fatal(err)
	}
	if ok, err := bw.RecordChunk(1, ZeroChunkHash(cs)); ok || err == nil {
		t.Fatalf("chunk 1 recorded twice: %v %v", ok, err)
	}
	if err := bw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.ChunksZero != 1 || st.ChunksNew != 1 {
		t.Fatalf("stats %+v", st)
	}
	if err := verifyDir(dir); err == nil {
		t.Fatal("Verify passed a chunk stored under another chunk's hash")
	}
}

// A caller that checks chunks itself (on the GPU) gets each chunk's
// expected hash, and the reader then leaves that check to it: a damaged
// chunk reads without error, and its hash differs from the expected one.
func TestHashCheckedByCaller(t *testing.T) {
	const cs = 4096
	dir := t.TempDir()
	data := fxRand(4, 3*cs)
	clear(data[cs : 2*cs])
	fxWrite(t, dir, Options{ChunkSize: cs}, []fxBuf{{BufferInfo{Address: 0x300000, Size: 3 * cs}, data}})
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	file := im.ChunkFile(0, 2)
	im.Close()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	raw[100] ^= 1
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, caller := range []bool{false, true} {
		im, err := OpenWith(dir, ReadOptions{HashCheckedByCaller: caller})
		if err != nil {
			t.Fatal(err)
		}
		if !im.HashesOnGPU() {
			t.Fatal("a new image's hash is not the GPU's")
		}
		br, err := im.OpenBuffer(0)
		if err != nil {
			t.Fatal(err)
		}
		want := br.ChunkHashes()
		got := make([]byte, 3*cs)
		_, err = br.ReadAt(got, 0)
		switch {
		case !caller && err == nil:
			t.Error("the reader passed a damaged chunk")
		case caller && err != nil:
			t.Errorf("the reader checked what the caller checks: %v", err)
		case caller:
			for ci := range 3 {
				same := ptx.ChunkHash(got[ci*cs:(ci+1)*cs]) == want[ci]
				if same != (ci != 2) {
					t.Errorf("chunk %d: hash as expected %v", ci, same)
				}
			}
		}
		br.Close()
		im.Close()
	}
}

func verifyDir(dir string) error {
	im, err := Open(dir)
	if err != nil {
		return err
	}
	defer im.Close()
	return im.Verify()
}

// A chunk RecordChunk claimed for new bytes must be written with that
// hash: another hash, or WriteChunk's own, is refused (equal chunks of the
// image refer to it).
func TestRecordedChunkKeepsItsHash(t *testing.T) {
	const cs = 4096
	w, err := Create(t.TempDir(), fxOrigin(), Options{ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	data := fxRand(5, 2*cs)
	bw, err := w.AddBuffer(BufferInfo{Address: 0x400000, Size: 2 * cs})
	if err != nil {
		t.Fatal(err)
	}
	h := ptx.ChunkHash(data[:cs])
	if ok, err := bw.RecordChunk(0, h); ok || err != nil {
		t.Fatalf("new content recorded without bytes: %v %v", ok, err)
	}
	// The same content in chunk 1 now refers to chunk 0: no bytes needed.
	if ok, err := bw.RecordChunk(1, h); !ok || err != nil {
		t.Fatalf("a chunk equal to a claimed one: %v %v", ok, err)
	}
	if err := bw.WriteChunkHashed(0, data[:cs], ptx.ChunkHash(data[cs:])); err == nil {
		t.Error("chunk 0 written with another hash than it was recorded with")
	}
	if err := bw.WriteChunk(0, data[:cs]); err == nil {
		t.Error("chunk 0 written without its recorded hash")
	}
	if err := bw.WriteChunkHashed(0, data[:cs], h); err != nil {
		t.Fatal(err)
	}
	if err := bw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.ChunksNew != 1 || st.ChunksDedup != 1 {
		t.Errorf("stats %+v", st)
	}
}

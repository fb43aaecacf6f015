package image

import (
	"os"
	"path/filepath"
	"testing"
)

// salvageFx writes bufs into dir without committing, then drops the write
// keeping its chunk files.
func salvageFx(t *testing.T, dir string, opts Options, bufs []fxBuf) *Salvage {
	t.Helper()
	w, err := Create(dir, fxOrigin(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bufs {
		bw, err := w.AddBuffer(b.info)
		if err != nil {
			t.Fatal(err)
		}
		// Chunk by chunk, as a copy-on-write window saves them, and not
		// closed: a window that found a chunk changed leaves its buffer
		// short of that chunk.
		for i := 0; i*opts.ChunkSize < len(b.data); i++ {
			if err := bw.WriteChunk(i, b.data[i*opts.ChunkSize:min(len(b.data), (i+1)*opts.ChunkSize)]); err != nil {
				t.Fatal(err)
			}
		}
	}
	sv, err := w.AbortSalvage()
	if err != nil || sv == nil {
		t.Fatalf("AbortSalvage: %v, %v", sv, err)
	}
	return sv
}

func salvageBufs(seed uint64) []fxBuf {
	const chunk = 64 << 10
	return []fxBuf{
		{BufferInfo{Pid: 1, Address: 0x10000000, Size: 4 * chunk}, fxRand(seed, 4*chunk)},
		{BufferInfo{Pid: 1, Address: 0x20000000, Size: 3 * chunk}, fxRand(seed+1, 3*chunk)},
	}
}

// TestSalvageReusedByTheNextWrite: the chunk files of a dropped write stay
// where they are, no manifest names them, and the next write into the
// directory reuses those whose bytes are the same: only the changed chunk
// is written again. The files it did not use are gone after its commit.
func TestSalvageReusedByTheNextWrite(t *testing.T) {
	const chunk = 64 << 10
	dir := t.TempDir()
	opts := Options{ChunkSize: chunk, Workers: 2}
	bufs := salvageBufs(1)
	sv := salvageFx(t, dir, opts, bufs)
	if sv.Chunks() != 7 || sv.Bytes() != 7*chunk {
		t.Fatalf("salvage holds %d chunks (%d bytes), want 7 (%d)", sv.Chunks(), sv.Bytes(), 7*chunk)
	}
	if n := fxChunkFiles(t, dir); n != 7 {
		t.Fatalf("%d chunk files after AbortSalvage, want 7", n)
	}
	if _, err := Open(dir); err == nil {
		t.Fatal("a dropped write left an image that opens")
	}
	// The memory moved on in one chunk.
	bufs[1].data = append([]byte(nil), bufs[1].data...)
	bufs[1].data[chunk+3] ^= 0x55
	opts.Salvage = sv
	st := fxWrite(t, dir, opts, bufs)
	if st.ChunksNew != 1 || st.BytesStored != chunk {
		t.Errorf("the write after a salvage stored %d new chunks (%d bytes), want 1 (%d)", st.ChunksNew, st.BytesStored, chunk)
	}
	fxCheck(t, dir, bufs)
	if n := fxChunkFiles(t, dir); n != 7 {
		t.Errorf("%d chunk files after the commit, want 7 (the changed chunk's old file removed)", n)
	}
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if err := im.Verify(); err != nil {
		t.Errorf("Verify: %v", err)
	}
}

// TestSalvageRemovedWhenNotCommitted: an aborted write removes the files
// it adopted; Discard removes a salvage nobody took.
func TestSalvageRemovedWhenNotCommitted(t *testing.T) {
	const chunk = 64 << 10
	opts := Options{ChunkSize: chunk, Workers: 2}
	dir := t.TempDir()
	sv := salvageFx(t, dir, opts, salvageBufs(2))
	opts.Salvage = sv
	w, err := Create(dir, fxOrigin(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if n := fxChunkFiles(t, dir); n != 0 {
		t.Errorf("%d chunk files after the adopting write's abort, want 0", n)
	}

	dir2 := t.TempDir()
	opts.Salvage = nil
	sv = salvageFx(t, dir2, opts, salvageBufs(3))
	if err := sv.Discard(); err != nil {
		t.Fatal(err)
	}
	if n := fxChunkFiles(t, dir2); n != 0 {
		t.Errorf("%d chunk files after Discard, want 0", n)
	}
}

// TestSalvageOfAnotherDirIsNotUsed: a salvage handed to a write into
// another directory is discarded there (its files removed, none
// referenced), and a salvaged file replaced since is written again.
func TestSalvageOfAnotherDirIsNotUsed(t *testing.T) {
	const chunk = 64 << 10
	opts := Options{ChunkSize: chunk, Workers: 2}
	a, b := t.TempDir(), t.TempDir()
	bufs := salvageBufs(4)
	opts.Salvage = salvageFx(t, a, Options{ChunkSize: chunk, Workers: 2}, bufs)
	st := fxWrite(t, b, opts, bufs)
	if st.ChunksNew != 7 {
		t.Errorf("a write into another directory stored %d new chunks, want 7", st.ChunksNew)
	}
	if n := fxChunkFiles(t, a); n != 0 {
		t.Errorf("%d chunk files left in the salvage's directory, want 0", n)
	}
	fxCheck(t, b, bufs)

	c := t.TempDir()
	sv := salvageFx(t, c, Options{ChunkSize: chunk, Workers: 2}, bufs)
	files, _ := filepath.Glob(filepath.Join(c, SubDir, chunksName, "*", "*"))
	victim := files[0]
	if err := os.Remove(victim); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(victim, make([]byte, chunk), 0o600); err != nil { // same size, other bytes, other file
		t.Fatal(err)
	}
	opts.Salvage = sv
	st = fxWrite(t, c, opts, bufs)
	if st.ChunksNew != 1 {
		t.Errorf("%d new chunks with one salvaged file replaced, want 1", st.ChunksNew)
	}
	fxCheck(t, c, bufs)
}

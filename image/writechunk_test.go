package image

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// TestWriteChunkRoundTrip stores several buffers chunk by chunk, in a random
// order, from several goroutines at once, with zero, duplicate and short
// last chunks; the image reads back exactly, with the same chunks as the
// streaming Write gives.
func TestWriteChunkRoundTrip(t *testing.T) {
	const cs = 4096
	mk := func(seed uint64, n int) []byte {
		b := fxRand(seed, n)
		clear(b[cs : 2*cs])              // a zero chunk
		copy(b[3*cs:4*cs], b[4*cs:5*cs]) // a duplicate
		return b
	}
	bufs := []fxBuf{
		{BufferInfo{Pid: 7, Address: 0x100000, Size: 9*cs + 100}, mk(1, 9*cs+100)},
		{BufferInfo{Pid: 7, Address: 0x900000, Size: 6 * cs, Kind: AllocVMM}, mk(2, 6*cs)},
		{BufferInfo{Pid: 8, Address: 0x100000, Size: 77}, fxRand(3, 77)},
	}
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		dir := t.TempDir()
		w, err := Create(dir, fxOrigin(), Options{ChunkSize: cs, Compression: comp})
		if err != nil {
			t.Fatal(err)
		}
		type piece struct {
			bw   *BufferWriter
			i    int
			data []byte
		}
		var pieces []piece
		var bws []*BufferWriter
		for _, b := range bufs {
			bw, err := w.AddBuffer(b.info)
			if err != nil {
				t.Fatal(err)
			}
			bws = append(bws, bw)
			for off, i := 0, 0; off < len(b.data); off, i = off+cs, i+1 {
				pieces = append(pieces, piece{bw, i, b.data[off:min(off+cs, len(b.data))]})
			}
		}
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(pieces), func(a, b int) { pieces[a], pieces[b] = pieces[b], pieces[a] })
		var wg sync.WaitGroup
		errs := make(chan error, len(pieces))
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := g; k < len(pieces); k += 4 {
					// The caller may reuse its buffer once WriteChunk returns:
					// hand in a copy and scribble over it afterwards.
					p := bytes.Clone(pieces[k].data)
					if err := pieces[k].bw.WriteChunk(pieces[k].i, p); err != nil {
						errs <- err
					}
					for j := range p {
						p[j] = 0xa5
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("WriteChunk: %v", err)
		}
		for _, bw := range bws {
			if err := bw.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		}
		if err := w.Commit(); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		st := w.Stats()
		if st.BytesIn != int64(9*cs+100+6*cs+77) {
			t.Errorf("BytesIn %d", st.BytesIn)
		}
		fxCheck(t, dir, bufs)
		if st.ChunksZero != 2 || st.ChunksDedup != 2 {
			t.Errorf("compression %d: stats %+v: want 2 zero and 2 dedup chunks", comp, st)
		}
		im, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := im.Verify(); err != nil {
			t.Errorf("Verify: %v", err)
		}
		// Same chunks as the streaming writer makes of the same bytes.
		dir2 := t.TempDir()
		fxWrite(t, dir2, Options{ChunkSize: cs, Compression: comp}, bufs)
		im2, err := Open(dir2)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Diff(im, im2)
		if err != nil {
			t.Fatal(err)
		}
		if rep.BytesChanged != 0 || len(rep.Changed) != 0 || rep.Unchanged != len(bufs) {
			t.Errorf("WriteChunk and Write images differ: %+v", rep)
		}
	}
}

func TestWriteChunkMisuse(t *testing.T) {
	const cs = 4096
	dir := t.TempDir()
	w, err := Create(dir, fxOrigin(), Options{ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	bw, err := w.AddBuffer(BufferInfo{Pid: 1, Address: 0x10000, Size: 2*cs + 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		i    int
		n    int
		want string
	}{
		{-1, cs, "no chunk -1"},
		{3, cs, "no chunk 3"},
		{0, cs - 1, "chunk 0 has 4096 bytes, WriteChunk got 4095"},
		{2, cs, "chunk 2 has 10 bytes"},
	} {
		if err := bw.WriteChunk(c.i, make([]byte, c.n)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("WriteChunk(%d, %d bytes): %v, want %q", c.i, c.n, err, c.want)
		}
	}
	if err := bw.WriteChunk(1, fxRand(1, cs)); err != nil {
		t.Fatal(err)
	}
	if err := bw.WriteChunk(1, fxRand(1, cs)); err == nil || !strings.Contains(err.Error(), "written twice") {
		t.Errorf("chunk written twice: %v", err)
	}
	if _, err := bw.Write(make([]byte, 10)); err == nil || !strings.Contains(err.Error(), "Write after WriteChunk") {
		t.Errorf("Write after WriteChunk: %v", err)
	}
	if err := bw.Close(); !errors.Is(err, ErrIncomplete) {
		t.Errorf("Close with chunks missing: %v", err)
	}
	bw2, err := w.AddBuffer(BufferInfo{Pid: 1, Address: 0x90000, Size: cs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bw2.Write(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if err := bw2.WriteChunk(0, make([]byte, cs)); err == nil || !strings.Contains(err.Error(), "WriteChunk after Write") {
		t.Errorf("WriteChunk after Write: %v", err)
	}
	if err := w.Commit(); !errors.Is(err, ErrIncomplete) || !strings.Contains(err.Error(), "buffer 0 (0x10000)") {
		t.Errorf("Commit with a buffer missing chunks: %v", err)
	}
	if err := bw.WriteChunk(0, make([]byte, cs)); err == nil {
		t.Error("WriteChunk after a failed Commit accepted")
	}
	if fxChunkFiles(t, dir) != 0 {
		t.Error("the failed write left chunk files behind")
	}
}

// TestWriteChunkAbortWaits: Abort while WriteChunk calls are storing chunks
// leaves no chunk file behind (Abort waits for the calls in progress; later
// ones are refused).
func TestWriteChunkAbortWaits(t *testing.T) {
	const cs = 64 << 10
	dir := t.TempDir()
	w, err := Create(dir, fxOrigin(), Options{ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	bw, err := w.AddBuffer(BufferInfo{Pid: 1, Address: 0x10000, Size: n * cs})
	if err != nil {
		t.Fatal(err)
	}
	data := fxRand(9, n*cs)
	var wg sync.WaitGroup
	started := make(chan struct{})
	var once sync.Once
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 4 {
				once.Do(func() { close(started) })
				if err := bw.WriteChunk(i, data[i*cs:(i+1)*cs]); err != nil {
					if !errors.Is(err, ErrIncomplete) {
						t.Errorf("WriteChunk after Abort: %v, want the abort", err)
					}
					return
				}
			}
		}()
	}
	<-started
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if k := fxChunkFiles(t, dir); k != 0 {
		t.Errorf("%d chunk files left after Abort", k)
	}
	if tmp := fxTemps(t, dir); len(tmp) != 0 {
		t.Errorf("temporary files left after Abort: %v", tmp)
	}
}

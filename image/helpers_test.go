package image

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fxBuf is a buffer to write and what it must read back as.
type fxBuf struct {
	info BufferInfo
	data []byte
}

// fxRand returns n reproducible pseudo-random bytes.
func fxRand(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func fxOrigin() Origin {
	return Origin{Host: "host1", GPUModel: "NVIDIA H100 80GB HBM3", GPUUUID: "GPU-0000", DriverVersion: "580.159.04",
		Pid: 4242, Time: time.Unix(1700000000, 0)}
}

// fxWrite writes bufs into dir through the public API and commits.
func fxWrite(t testing.TB, dir string, opts Options, bufs []fxBuf) WriteStats {
	t.Helper()
	w, err := Create(dir, fxOrigin(), opts)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	for _, b := range bufs {
		bw, err := w.AddBuffer(b.info)
		if err != nil {
			t.Fatalf("AddBuffer: %v", err)
		}
		// Uneven write sizes cross chunk boundaries in every way.
		for off, step := 0, 1000; off < len(b.data); step = step*3 + 7 {
			n := min(step, len(b.data)-off)
			if _, err := bw.Write(b.data[off : off+n]); err != nil {
				t.Fatalf("Write: %v", err)
			}
			off += n
		}
		if err := bw.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	return w.Stats()
}

// readAll reads every buffer of the image at dir, with Read and ReadAt, and
// returns the first error or the data.
func fxReadAll(dir string) ([][]byte, error) {
	im, err := Open(dir)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for i := range im.Buffers() {
		r, err := im.OpenBuffer(i)
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			return nil, err
		}
		at := make([]byte, len(data))
		if n, err := r.ReadAt(at, 0); err != nil && !(errors.Is(err, io.EOF) && n == len(at)) {
			return nil, err
		}
		if !bytes.Equal(at, data) {
			return nil, errors.New("ReadAt and Read disagree")
		}
		out = append(out, data)
	}
	return out, nil
}

func fxCheck(t testing.TB, dir string, bufs []fxBuf) {
	t.Helper()
	got, err := fxReadAll(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	if len(got) != len(bufs) {
		t.Fatalf("%d buffers, want %d", len(got), len(bufs))
	}
	for i := range bufs {
		if !bytes.Equal(got[i], bufs[i].data) {
			t.Fatalf("buffer %d: data differs", i)
		}
	}
}

// fxCopyTree copies the directory tree src to dst (test images are small).
func fxCopyTree(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if errors.Is(err, os.ErrNotExist) {
			return nil // renamed away while a Writer works: a crash snapshot may miss it
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, info.Mode())
	})
	if err != nil {
		t.Fatal(err)
	}
}

package image

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// A process's part is sealed while another process of the same image is
// still to be written; it reads back that process's buffers alone, with the
// image's id; commit and abort remove the parts.
func TestProcessParts(t *testing.T) {
	for _, end := range []string{"commit", "abort"} {
		t.Run(end, func(t *testing.T) {
			dir := t.TempDir()
			w, err := Create(dir, fxOrigin(), Options{ChunkSize: 64 << 10})
			if err != nil {
				t.Fatal(err)
			}
			write := func(info BufferInfo, data []byte) {
				t.Helper()
				bw, err := w.AddBuffer(info)
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i*(64<<10) < len(data); i++ {
					if err := bw.WriteChunk(i, data[i*(64<<10):min((i+1)*(64<<10), len(data))]); err != nil {
						t.Fatal(err)
					}
				}
				if err := bw.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.AddProcess(100, 1); err != nil {
				t.Fatal(err)
			}
			a := fxRand(1, 200<<10)
			write(BufferInfo{Pid: 100, NsPid: 1, Address: 1 << 30, Size: uint64(len(a))}, a)
			if err := w.SealProcess(100); err != nil {
				t.Fatal(err)
			}
			// The other process comes later, and an unclosed buffer keeps a
			// part from being sealed.
			bw, err := w.AddBuffer(BufferInfo{Pid: 200, Address: 1 << 30, Size: 128 << 10})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.SealProcess(200); err == nil {
				t.Error("a part sealed with a buffer still open")
			}
			if _, err := bw.Write(fxRand(2, 128<<10)); err != nil {
				t.Fatal(err)
			}
			if err := bw.Close(); err != nil {
				t.Fatal(err)
			}

			im, err := OpenProcessPart(dir, 100, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(im.Manifest().GetImageId(), w.ID()) || len(im.Buffers()) != 1 || im.Buffers()[0].Pid != 100 ||
				len(im.Processes()) != 1 || im.Processes()[0].NsPid != 1 {
				t.Fatalf("part: id %x (writer %x), buffers %+v, processes %+v", im.Manifest().GetImageId(), w.ID(), im.Buffers(), im.Processes())
			}
			r, err := im.OpenBuffer(0)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(r)
			r.Close()
			if err != nil || !bytes.Equal(got, a) {
				t.Fatalf("part's buffer reads back %d bytes (%v), want the %d written", len(got), err, len(a))
			}
			if _, err := OpenProcessPart(dir, 300, nil); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("part of a process never sealed: %v", err)
			}
			if end == "commit" {
				err = w.Commit()
			} else {
				err = w.Abort()
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, SubDir, partsName)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("after %s the parts are still there: %v", end, err)
			}
		})
	}
}

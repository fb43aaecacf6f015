package image

import (
	"bytes"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		t.Run(comp.String(), func(t *testing.T) {
			dir := t.TempDir()
			compressible := bytes.Repeat([]byte("gpucr "), 20000)
			bufs := []testBuf{
				{BufferInfo{Pid: 1, Device: 0, GPUUUID: "GPU-a", Address: 0x7f0000000000, Size: 100000, Kind: AllocVMM}, randBytes(1, 100000)},
				{BufferInfo{Pid: 1, Device: 1, GPUUUID: "GPU-b", Address: 0x7f0000100000, Size: 16384}, make([]byte, 16384)},
				{BufferInfo{Pid: 2, Device: 0, GPUUUID: "GPU-a", Address: 0x7f0000000000, Size: uint64(len(compressible)), Kind: AllocAsync}, compressible},
				{BufferInfo{Pid: 2, Device: 0, Address: 0x7f0000200000, Size: 7}, []byte("1234567")},
				{BufferInfo{Pid: 3, Address: 0x1000, Size: 0}, nil},
			}
			st := writeImage(t, dir, Options{ChunkSize: 4096, Compression: comp}, bufs)
			checkImage(t, dir, bufs)
			if st.ChunksZero != 4 {
				t.Errorf("zero chunks %d, want 4 (stats %+v)", st.ChunksZero, st)
			}
			t.Logf("%+v", st)
		})
	}
}

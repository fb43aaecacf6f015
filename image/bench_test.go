package image_test

// Throughput benchmarks of the image writer and reader, next to plain file
// writes and reads of the same bytes in the same directory:
//
//	GPUCR_BENCH_DIR=/dev/shm GPUCR_BENCH_MB=1024 go test -run '^$' -bench . ./image/
//
// GPUCR_BENCH_DIR (default: the test's temp dir) lets the GPU machine point
// them at /dev/shm; GPUCR_BENCH_MB (default 64) is the data per operation.
// image/cmd/imagebench prints the same comparison as a table.

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/image/internal/benchio"
)

// benchBuffers is how many buffers (and, for the raw baseline, files) the data
// is split into; they are written and read concurrently, as the helper does.
const benchBuffers = 4

// benchBlock is the size of each Write and of each raw write and read.
const benchBlock = 4 << 20

type benchCase struct {
	name string
	kind string // random, dup50, zero30, compressible
	comp image.Compression
}

var benchCases = []benchCase{
	{"random", "random", image.CompressionNone},
	{"dup50", "dup50", image.CompressionNone},
	{"zero30", "zero30", image.CompressionNone},
	{"zstd-random", "random", image.CompressionZstd},
	{"zstd-compressible", "compressible", image.CompressionZstd},
}

// BenchmarkWrite measures both write APIs: stream (BufferWriter.Write from
// one goroutine per buffer: a copy into chunk buffers, then the workers) and
// chunks (WriteChunk from GOMAXPROCS goroutines, no copy: the copy engine's
// way).
func BenchmarkWrite(b *testing.B) {
	for _, api := range []string{"stream", "chunks"} {
		for _, c := range benchCases {
			b.Run(api+"/"+c.name, func(b *testing.B) {
				data := benchData(b, c.kind)
				root := benchDir(b)
				b.SetBytes(int64(len(data)))
				var st image.WriteStats
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					dir := filepath.Join(root, strconv.Itoa(i))
					st = benchWriteImageAPI(b, api, dir, data, c.comp)
					b.StopTimer()
					if err := os.RemoveAll(dir); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				b.StopTimer()
				if st.BytesStored > 0 {
					b.ReportMetric(float64(len(data))/float64(st.BytesStored), "dedup-ratio")
				}
			})
		}
	}
}

func BenchmarkRead(b *testing.B) {
	for _, c := range benchCases {
		b.Run(c.name, func(b *testing.B) {
			data := benchData(b, c.kind)
			dir := filepath.Join(benchDir(b), "image")
			benchWriteImage(b, dir, data, c.comp)
			dst := make([]byte, len(data))
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				benchReadImage(b, dir, dst)
			}
			b.StopTimer()
			if string(dst) != string(data) {
				b.Fatal("the image read back differs from what was written")
			}
		})
	}
}

// BenchmarkRawFileWrite is the baseline for BenchmarkWrite: the same bytes as
// benchBuffers plain files written concurrently in benchBlock writes, each
// fsynced at the end, then the directory fsynced.
func BenchmarkRawFileWrite(b *testing.B) {
	data := benchData(b, "random")
	root := benchDir(b)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dir := filepath.Join(root, strconv.Itoa(i))
		benchRawWrite(b, dir, data)
		b.StopTimer()
		if err := os.RemoveAll(dir); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkRawFileRead is the baseline for BenchmarkRead: the files
// BenchmarkRawFileWrite writes, read back concurrently in benchBlock reads,
// with nothing dropped from the page cache (as for the image).
func BenchmarkRawFileRead(b *testing.B) {
	data := benchData(b, "random")
	dir := filepath.Join(benchDir(b), "raw")
	benchRawWrite(b, dir, data)
	dst := make([]byte, len(data))
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := benchio.RawRead(dir, dst, benchBuffers); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if string(dst) != string(data) {
		b.Fatal("the files read back differ from what was written")
	}
}

// benchWriteImage writes data as one image of benchBuffers buffers, in
// benchBlock Writes, and commits it (the loop imagebench times too).
func benchWriteImage(b *testing.B, dir string, data []byte, comp image.Compression) image.WriteStats {
	return benchWriteImageAPI(b, "stream", dir, data, comp)
}

// benchWriteImageAPI is benchWriteImage through either write API.
func benchWriteImageAPI(b *testing.B, api, dir string, data []byte, comp image.Compression) image.WriteStats {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	opts := image.Options{Compression: comp}
	var st image.WriteStats
	var err error
	if api == "chunks" {
		st, err = benchio.ImageWriteChunks(dir, data, benchBuffers, runtime.GOMAXPROCS(0), opts, nil)
	} else {
		st, err = benchio.ImageWrite(dir, data, benchBuffers, benchBlock, opts)
	}
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// benchRawWrite writes the plain-file baseline (the loop imagebench times too).
func benchRawWrite(b *testing.B, dir string, data []byte) {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := benchio.RawWrite(dir, data, benchBuffers); err != nil {
		b.Fatal(err)
	}
}

// benchReadImage reads every buffer through its io.Reader, one goroutine per
// buffer, into dst laid out as benchWriteImage split it (imagebench reads
// with ReadAt instead; this measures the io.Reader path).
func benchReadImage(b *testing.B, dir string, dst []byte) {
	b.Helper()
	im, err := image.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	bufs := im.Buffers()
	errs := make([]error, len(bufs))
	var wg sync.WaitGroup
	// Buffers were added concurrently, so the manifest holds them in any
	// order; their addresses grow with the part of the data each holds.
	order := make([]int, len(bufs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(bufs[a].Address, bufs[b].Address) })
	off := 0
	for _, i := range order {
		info := bufs[i]
		part := dst[off : off+int(info.Size)]
		off += int(info.Size)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := im.OpenBuffer(i)
			if err == nil {
				_, err = io.ReadFull(r, part)
				r.Close()
			}
			if err != nil {
				errs[i] = fmt.Errorf("read buffer %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	if off != len(dst) {
		b.Fatalf("image holds %d bytes, wrote %d", off, len(dst))
	}
}

func benchDir(b *testing.B) string {
	b.Helper()
	root := os.Getenv("GPUCR_BENCH_DIR")
	if root == "" {
		return b.TempDir()
	}
	dir, err := os.MkdirTemp(root, "gpucr-bench-")
	if err != nil {
		b.Fatalf("GPUCR_BENCH_DIR: %v", err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// benchData returns GPUCR_BENCH_MB (default 64) MiB of data of one kind,
// chunk by chunk (chunks of image.DefaultChunkSize): random (all unique),
// dup50 (every odd chunk repeats the chunk before it), zero30 (3 chunks in 10
// zero) or compressible (fp32 values with bf16 precision, as model weights
// often are; about 2x under zstd).
func benchData(b *testing.B, kind string) []byte {
	b.Helper()
	mb := 64
	if s := os.Getenv("GPUCR_BENCH_MB"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			b.Fatalf("GPUCR_BENCH_MB=%q: want a positive number of MiB", s)
		}
		mb = v
	}
	const chunk = image.DefaultChunkSize
	data := make([]byte, mb<<20)
	for i := 0; i*chunk < len(data); i++ {
		c := data[i*chunk : min(len(data), (i+1)*chunk)]
		r := rand.New(rand.NewPCG(uint64(i), 42))
		switch {
		case kind == "dup50" && i%2 == 1:
			copy(c, data[(i-1)*chunk:])
		case kind == "zero30" && (i%10 == 1 || i%10 == 4 || i%10 == 7):
			// already zero
		case kind == "compressible":
			for j := 0; j+4 <= len(c); j += 4 {
				v := float32(r.NormFloat64() * 0.02)
				binary.LittleEndian.PutUint32(c[j:], math.Float32bits(v)&0xffff0000)
			}
		default:
			for j := 0; j+8 <= len(c); j += 8 {
				binary.LittleEndian.PutUint64(c[j:], r.Uint64())
			}
		}
	}
	return data
}

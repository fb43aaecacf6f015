package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
)

// A dataKind says what the bytes of a case look like. The kinds are chosen to
// exercise each path of the image writer on its own: plain storing (random),
// content-addressed dedup (dup50), zero-chunk elision (zero30) and compression
// (compressible).
type dataKind string

const (
	kindRandom       dataKind = "random"       // incompressible, every chunk unique
	kindDup50        dataKind = "dup50"        // every other chunk repeats an earlier one
	kindZero30       dataKind = "zero30"       // 3 chunks in 10 are all zero
	kindCompressible dataKind = "compressible" // fp32 values at bf16 precision, like ML weights
)

// genData fills a new slice of n bytes with data of the given kind, chunk by
// chunk. Chunks are generated in parallel, each from its own deterministic
// seed, so that a few GB take seconds on a many-core host and every run sees
// the same bytes.
func genData(kind dataKind, n, chunkSize int) ([]byte, error) {
	switch kind {
	case kindRandom, kindDup50, kindZero30, kindCompressible:
	default:
		return nil, fmt.Errorf("unknown data kind %q", kind)
	}
	buf := make([]byte, n)
	nchunks := (n + chunkSize - 1) / chunkSize
	chunk := func(i int) []byte {
		end := min((i+1)*chunkSize, n)
		return buf[i*chunkSize : end]
	}
	// Unique chunks first, in parallel; duplicates are copied afterwards from
	// chunks that are complete by then.
	parallelFor(nchunks, func(i int) {
		c := chunk(i)
		switch {
		case kind == kindZero30 && isZeroChunk(i):
			clear(c) // make() zeroed it already; explicit for clarity
		case kind == kindDup50 && i%2 == 1:
			// filled below
		case kind == kindCompressible:
			fillBF16(c, uint64(i))
		default:
			fillRandom(c, uint64(i))
		}
	})
	if kind == kindDup50 {
		parallelFor(nchunks, func(i int) {
			if i%2 == 0 {
				return
			}
			// Repeat an earlier even (unique) chunk, picked pseudo-randomly so
			// duplicates are not always adjacent to their original.
			src := 2 * int(mix(uint64(i))%uint64((i+1)/2))
			// An earlier chunk is never the (possibly short) last one, so
			// the copy fills c whole.
			copy(chunk(i), chunk(src))
		})
	}
	return buf, nil
}

// isZeroChunk selects 3 chunks in every 10, spread out rather than in a run.
func isZeroChunk(i int) bool {
	switch i % 10 {
	case 1, 4, 7:
		return true
	}
	return false
}

func fillRandom(p []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	for len(p) >= 8 {
		binary.LittleEndian.PutUint64(p, r.Uint64())
		p = p[8:]
	}
	for i := range p {
		p[i] = byte(r.Uint32())
	}
}

// fillBF16 writes normally distributed float32 values whose low 16 mantissa
// bits are zero: bf16 weights held in fp32, which compress about 2x, as
// model state often does.
func fillBF16(p []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0xbf16bf16bf16bf16))
	for len(p) >= 4 {
		v := math.Float32bits(float32(r.NormFloat64() * 0.02))
		binary.LittleEndian.PutUint32(p, v&0xffff0000)
		p = p[4:]
	}
	clear(p)
}

// mix is splitmix64's finalizer: a cheap, well-spread hash of an index.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// parallelFor runs f(0..n-1) on GOMAXPROCS goroutines.
func parallelFor(n int, f func(i int)) {
	var next sync.Mutex
	i := 0
	take := func() int {
		next.Lock()
		defer next.Unlock()
		j := i
		i++
		return j
	}
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), max(n, 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := take(); j < n; j = take() {
				f(j)
			}
		}()
	}
	wg.Wait()
}

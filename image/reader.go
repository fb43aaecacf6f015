package image

import (
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// ReadOptions control the readers of an Image (an addition to the contract;
// Open uses the zero value).
type ReadOptions struct {
	Workers  int // chunk loads at once, over all readers of the image; 0: GOMAXPROCS
	Prefetch int // chunks a BufferReader loads ahead of Read; 0: Workers; <0: none
}

// Image is a committed image opened for reading. Its methods are safe for
// concurrent use; each BufferReader belongs to one goroutine.
type Image struct {
	dir   string // as given to Open
	chain []string
	m     *imagepb.Manifest
	opts  ReadOptions
	sem   chan struct{} // bounds concurrent chunk loads
	pool  sync.Pool     // *[]byte of chunk size

	decOnce sync.Once
	dec     *zstd.Decoder
	decErr  error
}

// Open opens the image in dir: the manifest is checked (checksum, version,
// every field's range) and the parent chain resolved as far as its chunks
// reach, each ancestor checked to be the image this one was written against.
func Open(dir string) (*Image, error) { return OpenWith(dir, ReadOptions{}) }

// OpenWith is Open with reader options.
func OpenWith(dir string, opts ReadOptions) (*Image, error) {
	return openImage(dir, opts, false)
}

// openImage opens dir; allowPruned lets gc look at pruned images.
func openImage(dir string, opts ReadOptions, allowPruned bool) (*Image, error) {
	real, err := realDir(dir)
	if err != nil {
		return nil, &ManifestError{File: manifestPath(dir), Err: err}
	}
	m, err := loadManifest(real)
	if err != nil {
		return nil, err
	}
	if m.GetPruned() && !allowPruned {
		return nil, &ManifestError{File: manifestPath(real), Err: ErrPruned}
	}
	return newImage(dir, real, m, opts)
}

// newImage is the Image of manifest m of directory dir (real: symlinks
// resolved), its ancestors resolved.
func newImage(dir, real string, m *imagepb.Manifest, opts ReadOptions) (*Image, error) {
	chain, err := resolveChain(real, m, maxAncestor(m))
	if err != nil {
		return nil, err
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	if opts.Prefetch == 0 {
		opts.Prefetch = opts.Workers
	}
	im := &Image{dir: dir, chain: chain, m: m, opts: opts, sem: make(chan struct{}, opts.Workers)}
	cs := int(m.GetChunkSize())
	im.pool.New = func() any { b := make([]byte, cs); return &b }
	return im, nil
}

func maxAncestor(m *imagepb.Manifest) int {
	deepest := uint32(0)
	for _, b := range m.GetBuffers() {
		for _, c := range b.GetChunks() {
			deepest = max(deepest, c.GetAncestor())
		}
	}
	return int(deepest)
}

// resolveChain returns the directories of real and of its first need
// ancestors. Each parent path is joined once to the directory of the image
// that names it; a loop, a missing or replaced ancestor is an error.
func resolveChain(real string, m *imagepb.Manifest, need int) ([]string, error) {
	chain := []string{real}
	infos := []os.FileInfo{}
	if info, err := os.Stat(real); err == nil {
		infos = append(infos, info)
	}
	cur, curM := real, m
	for d := 1; d <= need; d++ {
		mfile := manifestPath(cur)
		p := curM.GetParent()
		if p == nil {
			return nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: chunks refer to ancestor %d, but the chain ends at %d",
				ErrMissingParent, need, d-1)}
		}
		next, err := realDir(filepath.Join(cur, p.GetPath()))
		if err != nil {
			return nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: %w", ErrMissingParent, err)}
		}
		info, err := os.Stat(next)
		if err != nil {
			return nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: %w", ErrMissingParent, err)}
		}
		for _, seen := range infos {
			if os.SameFile(seen, info) {
				return nil, &ManifestError{File: mfile, Err: corruptf("parent chain loops at %s", next)}
			}
		}
		infos = append(infos, info)
		pm, err := loadManifest(next)
		if err != nil {
			return nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: parent %s: %w", ErrMissingParent, next, err)}
		}
		if string(pm.GetImageId()) != string(p.GetImageId()) {
			return nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: %s now holds another image (id %x, want %x)",
				ErrMissingParent, next, pm.GetImageId(), p.GetImageId())}
		}
		chain = append(chain, next)
		cur, curM = next, pm
	}
	return chain, nil
}

// Manifest returns the manifest; callers must not modify it.
func (im *Image) Manifest() *imagepb.Manifest { return im.m }

// Dir returns the image directory as given to Open.
func (im *Image) Dir() string { return im.dir }

// Chain returns the directories of the image and of the ancestors its
// chunks use, nearest first (resolved, absolute).
func (im *Image) Chain() []string { return append([]string(nil), im.chain...) }

// Buffers describes the image's buffers, in manifest order.
func (im *Image) Buffers() []BufferInfo {
	out := make([]BufferInfo, len(im.m.GetBuffers()))
	for i, b := range im.m.GetBuffers() {
		out[i] = bufferInfoOf(b)
	}
	return out
}

// Processes lists the processes the image was taken of, by pid: those the
// manifest records, and the owner of every buffer.
func (im *Image) Processes() []ProcessInfo {
	procs := map[int]int{}
	for _, p := range im.m.GetProcesses() {
		procs[int(p.GetPid())] = int(p.GetNsPid())
	}
	for _, b := range im.m.GetBuffers() {
		if b.GetPid() > 0 && procs[int(b.GetPid())] == 0 {
			procs[int(b.GetPid())] = int(b.GetNsPid())
		}
	}
	out := make([]ProcessInfo, 0, len(procs))
	for _, pid := range slices.Sorted(maps.Keys(procs)) {
		out = append(out, ProcessInfo{Pid: pid, NsPid: procs[pid]})
	}
	return out
}

// ChunkFile returns the path of the file holding chunk ci of buffer bi, ""
// for a zero chunk.
func (im *Image) ChunkFile(bi, ci int) string {
	c := im.m.GetBuffers()[bi].GetChunks()[ci]
	if c.GetLocation() == imagepb.Location_LOCATION_ZERO {
		return ""
	}
	h, _ := hashFromBytes(c.GetHash())
	return chunkPath(im.chain[c.GetAncestor()], h)
}

// ChunkHash returns a chunk's content hash in hex (its file name), "" for a
// zero chunk.
func ChunkHash(c *imagepb.Chunk) string {
	h, err := hashFromBytes(c.GetHash())
	if err != nil {
		return ""
	}
	return h.String()
}

func (im *Image) decoder() (*zstd.Decoder, error) {
	im.decOnce.Do(func() {
		// DecodeAll only: no goroutines, nothing to close.
		im.dec, im.decErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(im.opts.Workers),
			zstd.WithDecoderMaxMemory(MaxChunkSize))
	})
	return im.dec, im.decErr
}

func (im *Image) getBuf() *[]byte  { return im.pool.Get().(*[]byte) }
func (im *Image) putBuf(b *[]byte) { im.pool.Put(b) }

// load fills dst (exactly the chunk's size) with chunk ci of buffer bi,
// checked; at most Workers loads run at once.
func (im *Image) load(bi, ci int, dst []byte) error { return im.loadCheck(bi, ci, dst, false) }

// loadCheck is load; with allCRCs the CRC32C of an uncompressed chunk is
// checked too where the image has one (format 1), which the content hash
// makes redundant when reading (Verify checks it to find damage in either).
func (im *Image) loadCheck(bi, ci int, dst []byte, allCRCs bool) error {
	im.sem <- struct{}{}
	defer func() { <-im.sem }()
	b := im.m.GetBuffers()[bi]
	c := b.GetChunks()[ci]
	if c.GetLocation() == imagepb.Location_LOCATION_ZERO {
		clear(dst)
		return nil
	}
	file := im.ChunkFile(bi, ci)
	if err := im.readChunk(file, c, dst, allCRCs); err != nil {
		return &ChunkError{Image: im.dir, Buffer: bi, Address: b.GetAddress(), Chunk: ci, File: file, Err: err}
	}
	return nil
}

// readChunk reads a chunk file and checks it: the file's size, the CRC32C of
// the stored bytes, the decompressed size and the content hash. dst may hold
// garbage after an error.
//
// The CRC32C of an uncompressed chunk covers the very bytes the content hash
// covers, and the 128-bit hash catches every damage the 32-bit CRC would: so
// reads skip that CRC (it costs more than the hash, and reads must keep up
// with the GPU), unless allCRCs; format 2 images no longer have it. A
// compressed chunk's CRC is always checked, before its bytes reach the
// decoder.
func (im *Image) readChunk(file string, c *imagepb.Chunk, dst []byte, allCRCs bool) error {
	f, err := openChunkFile(file, c)
	if err != nil {
		return err
	}
	defer f.Close()
	stored := dst
	if c.GetCompression() == imagepb.Compression_COMPRESSION_ZSTD {
		sb := im.getBuf()
		defer im.putBuf(sb)
		stored = (*sb)[:c.GetStoredSize()]
	}
	if _, err := io.ReadFull(f, stored); err != nil {
		return corruptf("read: %v", err)
	}
	compressed := c.GetCompression() == imagepb.Compression_COMPRESSION_ZSTD
	if compressed || (allCRCs && im.m.GetFormatVersion() == 1) {
		if got := crc32.Checksum(stored, castagnoli); got != c.GetCrc32C() {
			return corruptf("CRC32C %08x, manifest says %08x: stored bytes damaged", got, c.GetCrc32C())
		}
	}
	if compressed {
		dec, err := im.decoder()
		if err != nil {
			return err
		}
		out, err := dec.DecodeAll(stored, dst[:0:len(dst)])
		if err != nil {
			return corruptf("zstd: %v", err)
		}
		if len(out) != len(dst) || &out[0] != &dst[0] {
			return corruptf("decompressed to %d bytes, want %d", len(out), len(dst))
		}
	}
	if h := hashOf(dst); string(h[:]) != string(c.GetHash()) {
		return corruptf("content hash %s, want %x", h, c.GetHash())
	}
	return nil
}

// OpenBuffer returns a reader of buffer i; buffers can be read in any order
// and at the same time.
func (im *Image) OpenBuffer(i int) (*BufferReader, error) {
	if i < 0 || i >= len(im.m.GetBuffers()) {
		return nil, fmt.Errorf("image %s: no buffer %d (has %d)", im.dir, i, len(im.m.GetBuffers()))
	}
	return &BufferReader{im: im, index: i, b: im.m.GetBuffers()[i]}, nil
}

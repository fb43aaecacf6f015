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
	"syscall"

	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// ReadOptions control the readers of an Image (an addition to the contract;
// Open uses the zero value).
type ReadOptions struct {
	Workers  int // chunk loads at once, over all readers of the image; 0: GOMAXPROCS
	Prefetch int // chunks a BufferReader loads ahead of Read; 0: Workers; <0: none
	// HashCheckedByCaller: the caller checks every chunk it reads against
	// its content hash itself (BufferReader.ChunkHashes), on the GPU after
	// loading it there, so the reader skips that check on the CPU. Only for
	// images whose hash the GPU computes (Image.HashesOnGPU); others are
	// checked here as always. A compressed chunk's CRC32C is checked
	// either way, before its bytes reach the decoder.
	HashCheckedByCaller bool
	// Owner, if set, must own every image of the chain (its gpucr/ and
	// manifest): an image of another user is refused with ErrOwner. nil:
	// any owner (the kernel's permission checks are the rule).
	Owner *Owner
}

// Image is a committed image opened for reading. Its methods are safe for
// concurrent use; each BufferReader belongs to one goroutine.
type Image struct {
	dir   string // as given to Open
	chain []string
	gdirs []*fsDir // DIR/gpucr of each image of chain, open: chunks are opened beneath them
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
// Symlinks on the path to dir (and to each parent) are followed, as for any
// path; nothing under an image's gpucr/ is (a symlink there is damage), and
// every file is checked to be a regular file before it is read.
func Open(dir string) (*Image, error) { return OpenWith(dir, ReadOptions{}) }

// OpenWith is Open with reader options.
func OpenWith(dir string, opts ReadOptions) (*Image, error) {
	return openImage(dir, opts, false, opts.Owner)
}

// OpenAt is Open of the image directory d is open on (a descriptor another
// process passed, which opened it); d stays the caller's. The image's Dir
// is the path the kernel knows d by.
func OpenAt(d *os.File, opts ReadOptions) (*Image, error) {
	top, err := dirOf(d)
	if err != nil {
		return nil, &ManifestError{File: ManifestPath(fdPath(d)), Err: err}
	}
	return openFrom(top, top.path, opts, false, opts.Owner)
}

// openImage opens dir; allowPruned lets gc look at pruned images; own, if
// set, must own every image of the chain (a writer's parents).
func openImage(dir string, opts ReadOptions, allowPruned bool, own *Owner) (*Image, error) {
	real, err := realDir(dir)
	if err != nil {
		return nil, &ManifestError{File: ManifestPath(dir), Err: err}
	}
	top, err := openDirPath(real)
	if err != nil {
		return nil, &ManifestError{File: ManifestPath(real), Err: err}
	}
	return openFrom(top, dir, opts, allowPruned, own)
}

// openFrom opens the image whose DIR is open as top (taken over: closed on
// failure, or with the Image); name is what messages call it.
func openFrom(top *fsDir, name string, opts ReadOptions, allowPruned bool, own *Owner) (*Image, error) {
	defer top.close()
	g, err := openSubDir(top, own)
	if err != nil {
		return nil, err
	}
	m, err := loadManifestAt(g, own)
	if err != nil {
		g.close()
		return nil, err
	}
	if m.GetPruned() && !allowPruned {
		g.close()
		return nil, &ManifestError{File: g.join(manifestName), Err: ErrPruned}
	}
	return imageFrom(top.path, g, name, m, opts, own)
}

// imageFrom is the Image of manifest m, read from the image at real whose
// gpucr/ is open as g (taken over: closed on failure, or with the Image),
// its ancestors resolved; name is what messages call it.
func imageFrom(real string, g *fsDir, name string, m *imagepb.Manifest, opts ReadOptions, own *Owner) (*Image, error) {
	chain, gdirs, err := resolveChain(real, g, m, maxAncestor(m), own)
	if err != nil {
		return nil, err
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	if opts.Prefetch == 0 {
		opts.Prefetch = opts.Workers
	}
	im := &Image{dir: name, chain: chain, gdirs: gdirs, m: m, opts: opts, sem: make(chan struct{}, opts.Workers)}
	cs := int(m.GetChunkSize())
	im.pool.New = func() any { b := make([]byte, cs); return &b }
	return im, nil
}

// OwnerUID is the uid its DIR/gpucr belongs to: whose image it is.
func (im *Image) OwnerUID() (uint32, error) {
	fi, err := im.gdirs[0].f.Stat()
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("%s: no owner known", im.gdirs[0].path)
	}
	return st.Uid, nil
}

// Close releases the directories the image holds open. Readers of it must
// be done; an Image nobody closes is released by the garbage collector.
func (im *Image) Close() error {
	for _, g := range im.gdirs {
		g.close()
	}
	return nil
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

// resolveChain returns the directories of real (whose gpucr/ is open as g,
// taken over) and of its first need ancestors, and their gpucr/ opened.
// Each parent path is joined once to the directory of the image that names
// it; a loop, a missing or replaced ancestor is an error (everything opened
// is closed then).
func resolveChain(real string, g *fsDir, m *imagepb.Manifest, need int, own *Owner) (chain []string, gdirs []*fsDir, err error) {
	chain, gdirs = []string{real}, []*fsDir{g}
	defer func() {
		if err != nil {
			for _, g := range gdirs {
				g.close()
			}
		}
	}()
	infos := []os.FileInfo{}
	if info, err := g.f.Stat(); err == nil {
		infos = append(infos, info)
	}
	cur, curM := real, m
	for d := 1; d <= need; d++ {
		mfile := ManifestPath(cur)
		p := curM.GetParent()
		if p == nil {
			return nil, nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: chunks refer to ancestor %d, but the chain ends at %d",
				ErrMissingParent, need, d-1)}
		}
		next, err := realDir(filepath.Join(cur, p.GetPath()))
		if err != nil {
			return nil, nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: %w", ErrMissingParent, err)}
		}
		top, err := openDirPath(next)
		if err != nil {
			return nil, nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: %w", ErrMissingParent, err)}
		}
		pg, err := openSubDir(top, own)
		top.close()
		if err != nil {
			return nil, nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: parent %s: %w", ErrMissingParent, next, err)}
		}
		gdirs = append(gdirs, pg)
		info, err := pg.f.Stat()
		if err != nil {
			return nil, nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: %w", ErrMissingParent, err)}
		}
		for _, seen := range infos {
			if os.SameFile(seen, info) {
				return nil, nil, &ManifestError{File: mfile, Err: corruptf("parent chain loops at %s", next)}
			}
		}
		infos = append(infos, info)
		pm, err := loadManifestAt(pg, own)
		if err != nil {
			return nil, nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: parent %s: %w", ErrMissingParent, next, err)}
		}
		if string(pm.GetImageId()) != string(p.GetImageId()) {
			return nil, nil, &ManifestError{File: mfile, Err: fmt.Errorf("%w: %s now holds another image (id %x, want %x)",
				ErrMissingParent, next, pm.GetImageId(), p.GetImageId())}
		}
		chain = append(chain, next)
		cur, curM = next, pm
	}
	return chain, gdirs, nil
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
	procs := map[int]ProcessInfo{}
	for _, p := range im.m.GetProcesses() {
		procs[int(p.GetPid())] = ProcessInfo{Pid: int(p.GetPid()), NsPid: int(p.GetNsPid()), GPUs: p.GetGpus(),
			Imports: importsOf(p.GetImports()), StartTime: p.GetStartTime(), Served: p.GetServed(),
			Template: p.GetTemplate() != nil}
	}
	for _, b := range im.m.GetBuffers() {
		if p := procs[int(b.GetPid())]; b.GetPid() > 0 && p.NsPid == 0 {
			p.Pid, p.NsPid = int(b.GetPid()), int(b.GetNsPid())
			procs[int(b.GetPid())] = p
		}
	}
	out := make([]ProcessInfo, 0, len(procs))
	for _, pid := range slices.Sorted(maps.Keys(procs)) {
		out = append(out, procs[pid])
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
	if err := im.readChunk(bi, ci, dst, allCRCs); err != nil {
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
func (im *Image) readChunk(bi, ci int, dst []byte, allCRCs bool) error {
	c := im.m.GetBuffers()[bi].GetChunks()[ci]
	f, err := im.openChunk(bi, ci)
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
	if im.HashCheckedByCaller() {
		return nil
	}
	if h := hashFor(im.m.GetFormatVersion(), dst); string(h[:]) != string(c.GetHash()) {
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

// HashesOnGPU says whether the image's content hash is gpucr's chunk hash
// (format 3 and later), which the GPU computes (helper/cuda.HashChunks):
// then a chunk loaded into device memory can be checked there.
func (im *Image) HashesOnGPU() bool { return im.m.GetFormatVersion() >= 3 }

// HashCheckedByCaller says whether the reader leaves the content hash check
// to the caller (ReadOptions.HashCheckedByCaller on an image that
// HashesOnGPU): the caller must then check every chunk it reads.
func (im *Image) HashCheckedByCaller() bool { return im.opts.HashCheckedByCaller && im.HashesOnGPU() }

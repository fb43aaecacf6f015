package image

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"sort"

	"golang.org/x/sys/unix"

	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// castagnoli is CRC32C, hardware-accelerated (SSE4.2) by hash/crc32.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maxManifestSize bounds what a reader loads: 1 GiB is far beyond a real
// manifest (20k chunks of 4 MiB, 80 GB of GPU memory, is under 1 MiB).
const maxManifestSize = 1 << 30

// encodeManifest serializes m into the bytes of manifest.pb.
func encodeManifest(m *imagepb.Manifest) ([]byte, error) {
	inner, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(&imagepb.ManifestFile{
		FormatVersion:  m.GetFormatVersion(),
		Manifest:       inner,
		ManifestCrc32C: crc32.Checksum(inner, castagnoli),
	})
}

// decodeManifest parses and validates the bytes of manifest.pb. Errors wrap
// ErrCorrupt or ErrVersion.
func decodeManifest(data []byte) (*imagepb.Manifest, error) {
	var file imagepb.ManifestFile
	if err := proto.Unmarshal(data, &file); err != nil {
		return nil, corruptf("not a manifest: %v", err)
	}
	if file.GetFormatVersion() == 0 || len(file.GetManifest()) == 0 {
		return nil, corruptf("not a manifest (%d bytes, no version or no body)", len(data))
	}
	if v := file.GetFormatVersion(); v < MinFormatVersion || v > FormatVersion {
		return nil, fmt.Errorf("%w %d (this build reads %d to %d)", ErrVersion, v, MinFormatVersion, FormatVersion)
	}
	if got := crc32.Checksum(file.GetManifest(), castagnoli); got != file.GetManifestCrc32C() {
		return nil, corruptf("manifest CRC32C %08x, file says %08x", got, file.GetManifestCrc32C())
	}
	m := new(imagepb.Manifest)
	if err := proto.Unmarshal(file.GetManifest(), m); err != nil {
		return nil, corruptf("manifest body: %v", err)
	}
	if m.GetFormatVersion() != file.GetFormatVersion() {
		return nil, corruptf("manifest body has version %d, file %d", m.GetFormatVersion(), file.GetFormatVersion())
	}
	if err := validateManifest(m); err != nil {
		return nil, err
	}
	return m, nil
}

// openSubDir opens DIR/gpucr beneath d for reading (own, if set, must own
// it); a missing one is no GPU image (fs.ErrNotExist), as a ManifestError.
func openSubDir(d *fsDir, own *Owner) (*fsDir, error) {
	g, err := d.openDir(SubDir, own)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("no GPU image in %s: %w", d.path, fs.ErrNotExist)
		}
		return nil, &ManifestError{File: d.join(SubDir + "/" + manifestName), Err: err}
	}
	return g, nil
}

// loadManifestAt reads and validates manifest.pb in the open DIR/gpucr g
// (a regular file, of own's if set).
func loadManifestAt(g *fsDir, own *Owner) (*imagepb.Manifest, error) {
	m, err := loadManifestFile(g, manifestName, own)
	var me *ManifestError
	if errors.Is(err, fs.ErrNotExist) && errors.As(err, &me) {
		me.Err = fmt.Errorf("%w: no committed manifest (write unfinished or aborted)", ErrIncomplete)
	}
	return m, err
}

// loadManifestFile reads and validates the manifest rel beneath g (a
// regular file, of own's if set): manifest.pb or a process's part.
func loadManifestFile(g *fsDir, rel string, own *Owner) (*imagepb.Manifest, error) {
	path := g.join(rel)
	f, err := g.openFile(rel, unix.O_RDONLY, own)
	if err != nil {
		return nil, &ManifestError{File: path, Err: err}
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, &ManifestError{File: path, Err: err}
	}
	if info.Size() > maxManifestSize {
		return nil, &ManifestError{File: path, Err: corruptf("%d bytes, more than a manifest has (%d at most)", info.Size(), maxManifestSize)}
	}
	data := make([]byte, info.Size())
	if _, err := f.ReadAt(data, 0); err != nil {
		return nil, &ManifestError{File: path, Err: err}
	}
	m, err := decodeManifest(data)
	if err != nil {
		return nil, &ManifestError{File: path, Err: err}
	}
	return m, nil
}

// storeManifest commits m as manifest.pb in the open DIR/gpucr g
// atomically (0600, given to own); renamed as for writeFileAtomic.
func storeManifest(g *fsDir, m *imagepb.Manifest, own *Owner) (renamed bool, err error) {
	data, err := encodeManifest(m)
	if err != nil {
		return false, err
	}
	if renamed, err = writeFileAtomic(g, manifestName, data, own); err != nil {
		return renamed, &ManifestError{File: g.join(manifestName), Err: err}
	}
	return true, nil
}

// chunkCount is how many chunks a buffer of size bytes has.
func chunkCount(size uint64, chunkSize uint32) uint64 {
	n := size / uint64(chunkSize)
	if size%uint64(chunkSize) != 0 {
		n++
	}
	return n
}

// chunkLen is the raw size of chunk i of a buffer.
func chunkLen(size uint64, chunkSize uint32, i int) uint32 {
	start := uint64(i) * uint64(chunkSize)
	if size-start < uint64(chunkSize) {
		return uint32(size - start)
	}
	return chunkSize
}

// validateManifest checks everything a reader relies on, so that the rest of
// the package can index and allocate by what the manifest says. Any
// violation is corruption: the writer never produces one.
func validateManifest(m *imagepb.Manifest) error {
	if len(m.GetImageId()) != 16 {
		return corruptf("image id has %d bytes", len(m.GetImageId()))
	}
	cs := m.GetChunkSize()
	if cs == 0 || cs > MaxChunkSize {
		return corruptf("chunk size %d out of range", cs)
	}
	if _, ok := imagepb.Compression_name[int32(m.GetCompression())]; !ok {
		return corruptf("unknown compression %d", m.GetCompression())
	}
	if p := m.GetParent(); p != nil {
		if err := checkParentPath(p.GetPath()); err != nil {
			return corruptf("%v", err)
		}
		if len(p.GetImageId()) != 16 {
			return corruptf("parent image id has %d bytes", len(p.GetImageId()))
		}
	}
	for bi, b := range m.GetBuffers() {
		if err := validateBuffer(m, b); err != nil {
			return fmt.Errorf("buffer %d (0x%x): %w", bi, b.GetAddress(), err)
		}
	}
	var last int64
	for _, p := range m.GetProcesses() {
		if p.GetPid() <= last || p.GetNsPid() < 0 {
			return corruptf("process list: pid %d (ns pid %d) after %d (pids must be positive, unique and sorted)", p.GetPid(), p.GetNsPid(), last)
		}
		last = p.GetPid()
		if len(p.GetGpus()) > maxProcessGPUs {
			return corruptf("process %d: %d GPUs (at most %d)", p.GetPid(), len(p.GetGpus()), maxProcessGPUs)
		}
		for _, im := range p.GetImports() {
			if im.GetSize() == 0 || im.GetAddress() == 0 || im.GetOwnerPid() <= 0 || im.GetAddress()+im.GetSize() < im.GetAddress() {
				return corruptf("process %d: import at 0x%x (%d bytes of pid %d): invalid", p.GetPid(), im.GetAddress(), im.GetSize(), im.GetOwnerPid())
			}
		}
	}
	return checkOverlaps(m.GetBuffers())
}

// maxProcessGPUs bounds a process's GPU list (the driver's device count
// stays far below it).
const maxProcessGPUs = 64

func validateBuffer(m *imagepb.Manifest, b *imagepb.Buffer) error {
	cs := m.GetChunkSize()
	if _, ok := imagepb.AllocKind_name[int32(b.GetKind())]; !ok {
		return corruptf("unknown allocation kind %d", b.GetKind())
	}
	if b.GetAddress()+b.GetSize() < b.GetAddress() {
		return corruptf("address 0x%x + size %d wraps", b.GetAddress(), b.GetSize())
	}
	if n := chunkCount(b.GetSize(), cs); uint64(len(b.GetChunks())) != n {
		return corruptf("%d chunks for %d bytes, want %d", len(b.GetChunks()), b.GetSize(), n)
	}
	for ci, c := range b.GetChunks() {
		if err := validateChunk(m, c, chunkLen(b.GetSize(), cs, ci)); err != nil {
			return fmt.Errorf("chunk %d: %w", ci, err)
		}
	}
	return nil
}

func validateChunk(m *imagepb.Manifest, c *imagepb.Chunk, want uint32) error {
	if c.GetSize() != want {
		return corruptf("size %d, want %d", c.GetSize(), want)
	}
	switch c.GetLocation() {
	case imagepb.Location_LOCATION_ZERO:
		if len(c.GetHash()) != 0 || c.GetAncestor() != 0 || c.GetCrc32C() != 0 || c.GetLinked() ||
			c.GetStoredSize() != 0 || c.GetCompression() != imagepb.Compression_COMPRESSION_NONE {
			return corruptf("zero chunk with stored-chunk fields")
		}
		return nil
	case imagepb.Location_LOCATION_LOCAL:
		if c.GetAncestor() != 0 {
			return corruptf("local chunk with ancestor %d", c.GetAncestor())
		}
	case imagepb.Location_LOCATION_PARENT:
		if m.GetParent() == nil {
			return corruptf("parent chunk in an image without parent")
		}
		if c.GetLinked() {
			return corruptf("parent chunk marked linked (only a local file is a link)")
		}
		if c.GetAncestor() == 0 || c.GetAncestor() > MaxChainDepth {
			return corruptf("ancestor %d out of range 1..%d", c.GetAncestor(), MaxChainDepth)
		}
	default:
		return corruptf("unknown location %d", c.GetLocation())
	}
	if _, err := hashFromBytes(c.GetHash()); err != nil {
		return err
	}
	switch c.GetCompression() {
	case imagepb.Compression_COMPRESSION_NONE:
		if c.GetStoredSize() != c.GetSize() {
			return corruptf("uncompressed chunk stores %d bytes of %d", c.GetStoredSize(), c.GetSize())
		}
	case imagepb.Compression_COMPRESSION_ZSTD:
		// The writer keeps a compressed chunk only if it shrank.
		if c.GetStoredSize() == 0 || c.GetStoredSize() >= c.GetSize() {
			return corruptf("zstd chunk stores %d bytes of %d", c.GetStoredSize(), c.GetSize())
		}
	default:
		return corruptf("unknown compression %d", c.GetCompression())
	}
	return nil
}

// checkOverlaps refuses two buffers of one process that share an address:
// restore maps each at its address, so such an image cannot be right.
func checkOverlaps(bufs []*imagepb.Buffer) error {
	idx := make([]int, len(bufs))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool {
		x, y := bufs[idx[a]], bufs[idx[b]]
		if x.GetPid() != y.GetPid() {
			return x.GetPid() < y.GetPid()
		}
		return x.GetAddress() < y.GetAddress()
	})
	for k := 1; k < len(idx); k++ {
		prev, cur := bufs[idx[k-1]], bufs[idx[k]]
		if prev.GetPid() == cur.GetPid() &&
			(prev.GetAddress() == cur.GetAddress() || prev.GetAddress()+prev.GetSize() > cur.GetAddress()) {
			return corruptf("buffers %d and %d of pid %d overlap (0x%x+%d, 0x%x)", idx[k-1], idx[k],
				cur.GetPid(), prev.GetAddress(), prev.GetSize(), cur.GetAddress())
		}
	}
	return nil
}

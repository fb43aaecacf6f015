package image

import (
	"fmt"
	"time"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// SubDir is the subdirectory of a CRIU image directory that holds the GPU
// image; CRIU and crit open their own files by name and never look into it.
const SubDir = "gpucr"

// DefaultChunkSize is the chunk size when Options.ChunkSize is 0: the unit
// the copy engines move and prioritize, large enough that per-chunk file
// overhead is small next to the copy itself.
const DefaultChunkSize = 4 << 20

// MaxChunkSize bounds Options.ChunkSize, so that readers can trust a chunk size
// from a manifest enough to allocate it.
const MaxChunkSize = 256 << 20

// FormatVersion is the manifest format this package writes. Readers accept
// MinFormatVersion..FormatVersion and refuse the rest.
//
//	1: every stored chunk has a CRC32C.
//	2: only compressed chunks have one (0 otherwise): an uncompressed chunk's
//	   stored bytes are the bytes its xxh3-128 name covers, and computing the
//	   CRC as well cost the writer about a fifth of its throughput.
//	3: the content hash is gpucr's chunk hash (ptx.ChunkHash) instead of
//	   xxh3-128: the GPU computes it, so a checkpoint hashes device memory
//	   where it lies and copies only chunks the image lacks, and a restore
//	   checks each chunk on the GPU after loading it. Chunks of images of
//	   formats 1 and 2 (other hashes) are neither referenced nor reused by it.
const FormatVersion = 3

// MinFormatVersion is the oldest manifest format this package reads.
const MinFormatVersion = 1

// MaxChainDepth bounds how many parent links a chunk reference may follow. A
// chunk unchanged for longer is written again, so that opening an image
// never resolves more than this many ancestors however long the chain grows.
const MaxChainDepth = 64

// Compression is how chunk files are encoded.
type Compression int

const (
	CompressionNone Compression = iota // the default: raw bytes
	CompressionZstd                    // for slow storage; a chunk that does not shrink is stored raw
)

func (c Compression) String() string {
	switch c {
	case CompressionNone:
		return "none"
	case CompressionZstd:
		return "zstd"
	}
	return fmt.Sprintf("Compression(%d)", int(c))
}

// AllocKind is how the process allocated a buffer; restore recreates it so.
type AllocKind int

const (
	AllocMemAlloc AllocKind = iota // cuMemAlloc
	AllocVMM                       // cuMemCreate + cuMemMap
	AllocAsync                     // cuMemAllocAsync / memory pools
	AllocPitch                     // cuMemAllocPitch
	AllocOther
)

func (k AllocKind) String() string {
	switch k {
	case AllocMemAlloc:
		return "memalloc"
	case AllocVMM:
		return "vmm"
	case AllocAsync:
		return "async"
	case AllocPitch:
		return "pitch"
	case AllocOther:
		return "other"
	}
	return fmt.Sprintf("AllocKind(%d)", int(k))
}

// Options control a Writer.
type Options struct {
	ChunkSize   int         // bytes per chunk; 0: DefaultChunkSize
	Compression Compression // CompressionNone by default
	Workers     int         // hashing/compressing/writing goroutines; 0: GOMAXPROCS
	MaxBuffered int64       // bytes of chunk data in flight at most; 0: 2*Workers*ChunkSize
	Parent      string      // parent image dir (incremental), "" for none; stored relative to DIR

	// Owner, for a process that writes an image for another user (the
	// helper, for the process that asked): the directories and files the
	// Writer creates are given to Owner, and every one it finds and uses
	// (gpucr/, chunks/, chunks/HH/, .lock, the manifest it replaces and the
	// chunk files it reuses) and every image of the parent chain must
	// already be Owner's, else ErrOwner. nil: the process's own, with no
	// such checks (the kernel's permission checks are the rule then).
	// Either way directories are made 0700 and files 0600.
	Owner *Owner
	// SubDirMustExist: DIR/gpucr must be there already (made by the user the
	// image is for, so the kernel checked that it may write DIR); the
	// Writer creates nothing directly in DIR.
	SubDirMustExist bool
	// Lookup, if set, runs the opening of the parent chain (Parent, and
	// the ancestors its manifests name: paths the image's owner named, or
	// wrote) with the owner's permissions (package fscred of the helper):
	// the kernel then checks every step as it would for them, and a path
	// they could not reach fails as it would for them, telling them
	// nothing of what lies there. nil: this process's own permissions.
	Lookup func(open func() error) error
	// SelfContained: a chunk the parent chain holds (Parent) is hard-linked
	// into DIR (chunks/HH/HASH, the same file: stored once on disk for
	// every image that links it) instead of being referred to in the
	// ancestor's directory, so the image needs none of its ancestors:
	// any of them may be deleted (rm -rf too) and this one still
	// restores. Where a link cannot be made (another file system, the
	// ancestor deleted meanwhile), the chunk's bytes are stored again
	// (RecordChunk asks for them). An ancestor inside DIR (a pre-copy's
	// rounds, DIR/gpucr-pre-copy/...) is referred to as without it: it
	// goes wherever DIR goes. gpucr's helper writes every image so.
	SelfContained bool
	// Salvage, if set, is the chunk files a dropped write into the same
	// DIR left (Writer.AbortSalvage): reused where a chunk hashes the
	// same. Create takes it over (one of another DIR is discarded).
	Salvage *Salvage
}

// Origin says who made the image.
type Origin struct {
	Host, GPUModel, GPUUUID, DriverVersion string
	Pid                                    int
	Time                                   time.Time
}

// BufferInfo describes one GPU buffer of one process.
type BufferInfo struct {
	Pid     int // process the buffer belongs to (one image: several processes)
	NsPid   int // its pid in its own pid namespace (0: unknown)
	Device  int // device ordinal in that process
	GPUUUID string
	Address uint64 // device virtual address
	Size    uint64
	Kind    AllocKind
	Flags   AllocFlags // properties the memory was created with
	// TouchRank is where the buffer came in the order its process first
	// touched its buffers after its previous restore (1: first; 0: not
	// touched then, or never restored); a restore on demand loads in it.
	TouchRank uint32
}

// AllocFlags are properties a buffer's memory was created with, which a
// restore creates it with again (imagepb.AllocFlag bits).
type AllocFlags uint32

// AllocFlagGPUDirectRDMA: created GPUDirect RDMA capable.
const AllocFlagGPUDirectRDMA = AllocFlags(imagepb.AllocFlag_ALLOC_FLAG_GPU_DIRECT_RDMA)

// AllocFlagHostNUMA: pinned host memory (location HOST_NUMA) on the host
// NUMA node of the buffer's device, not device memory.
const AllocFlagHostNUMA = AllocFlags(imagepb.AllocFlag_ALLOC_FLAG_HOST_NUMA)

// ProcessInfo is one process an image was taken of.
type ProcessInfo struct {
	Pid   int
	NsPid int // 0: unknown
	// GPUs are the GPUs the process could see (UUIDs, by its device
	// ordinal); nil: unknown.
	GPUs []string
	// Imports are the buffers of other processes of the image that this
	// one maps (an NCCL rank's imports of its peers' memory).
	Imports []ImportInfo
	// StartTime is the process's start time (/proc/PID/stat field 22)
	// when it was checkpointed, which tells it apart from a later process
	// with its pid; 0: unknown.
	StartTime uint64
	// Served: it ran in served mode, so it holds no driver state.
	Served bool
	// Template: its checkpoint kept a template script
	// (Image.TemplateScript).
	Template bool
}

// ImportInfo is one buffer of another process that a process maps: at
// Address in it, the buffer of OwnerPid at OwnerAddress there.
type ImportInfo struct {
	Address, Size uint64
	OwnerPid      int
	OwnerAddress  uint64
}

func importsPB(in []ImportInfo) []*imagepb.Import {
	var out []*imagepb.Import
	for _, i := range in {
		out = append(out, &imagepb.Import{Address: i.Address, Size: i.Size, OwnerPid: int64(i.OwnerPid), OwnerAddress: i.OwnerAddress})
	}
	return out
}

func importsOf(in []*imagepb.Import) []ImportInfo {
	var out []ImportInfo
	for _, i := range in {
		out = append(out, ImportInfo{Address: i.GetAddress(), Size: i.GetSize(), OwnerPid: int(i.GetOwnerPid()), OwnerAddress: i.GetOwnerAddress()})
	}
	return out
}

// WriteStats counts what a Writer did. A chunk is exactly one of new (a file
// written now), dedup (same bytes already stored in this image, or a file
// the image previously in DIR had), zero (no file) or parent (a file of an
// ancestor image).
type WriteStats struct {
	Buffers      int
	BytesIn      int64 // bytes given to BufferWriter.Write and WriteChunk
	BytesStored  int64 // bytes written to new chunk files
	ChunksNew    int64
	ChunksDedup  int64
	ChunksZero   int64
	ChunksParent int64
}

func originToPB(o Origin) *imagepb.Origin {
	var t int64
	if !o.Time.IsZero() {
		t = o.Time.UnixNano()
	}
	return &imagepb.Origin{Host: o.Host, GpuModel: o.GPUModel, GpuUuid: o.GPUUUID,
		DriverVersion: o.DriverVersion, Pid: int64(o.Pid), TimeUnixNano: t}
}

// OriginOf returns the manifest's origin in API form.
func OriginOf(m *imagepb.Manifest) Origin {
	o := m.GetOrigin()
	var t time.Time
	if o.GetTimeUnixNano() != 0 {
		t = time.Unix(0, o.GetTimeUnixNano()).UTC()
	}
	return Origin{Host: o.GetHost(), GPUModel: o.GetGpuModel(), GPUUUID: o.GetGpuUuid(),
		DriverVersion: o.GetDriverVersion(), Pid: int(o.GetPid()), Time: t}
}

func bufferInfoOf(b *imagepb.Buffer) BufferInfo {
	return BufferInfo{Pid: int(b.GetPid()), NsPid: int(b.GetNsPid()), Device: int(b.GetDevice()), GPUUUID: b.GetGpuUuid(),
		Address: b.GetAddress(), Size: b.GetSize(), Kind: AllocKind(b.GetKind()), Flags: AllocFlags(b.GetAllocFlags()),
		TouchRank: b.GetTouchRank()}
}

func statsToPB(s WriteStats) *imagepb.Stats {
	return &imagepb.Stats{BytesIn: uint64(s.BytesIn), BytesStored: uint64(s.BytesStored),
		ChunksNew: uint64(s.ChunksNew), ChunksDedup: uint64(s.ChunksDedup),
		ChunksZero: uint64(s.ChunksZero), ChunksParent: uint64(s.ChunksParent)}
}

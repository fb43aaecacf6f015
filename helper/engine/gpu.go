package engine

import (
	"errors"

	"github.com/gpucr/gpucr/helper/cuda"
)

// GPU is a device as the engines use it: a view of the helper's
// allocations, copy lanes, and the chunk hash computed where the memory
// lies. The helper's is the driver's (CUDA); tests use an in-process one
// (helper/internal/fakegpu) that keeps device memory in host memory.
type GPU interface {
	// Ordinal, UUID and Name name the device in the image.
	Ordinal() int
	UUID() string
	Name() string
	// Map returns the helper's view of allocation h (size bytes): the
	// address its lanes copy from and to. The view stays until the
	// allocation is released.
	Map(h uint64, size uint64) (uint64, error)
	// AcquireLane returns a lane whose staging holds at least staging
	// bytes; ReleaseLane gives back one that still works (a broken one is
	// closed instead).
	AcquireLane(staging int) (Lane, error)
	ReleaseLane(Lane)
	// HashRanges hashes each range in chunks of chunk bytes
	// (ptx.ChunkHash of each chunk's bytes).
	HashRanges(ranges []Range, chunk int) ([][][16]byte, error)
	// MemInfo is the device memory free now and in all.
	MemInfo() (free, total uint64, err error)
	// CreateScratch makes size bytes (a multiple of the granularity) of
	// device memory only the helper uses (a snapshot); ReleaseScratch frees
	// it, view and all.
	CreateScratch(size uint64) (uint64, error)
	ReleaseScratch(h uint64) error
}

// Range is one mapped range of device memory to hash.
type Range struct{ VA, Size uint64 }

// Lane copies between its staging memory and the device, in order, on a
// thread of its own.
type Lane interface {
	// Staging is the lane's host memory (pinned, for the driver).
	Staging() []byte
	// Do runs f on the lane's thread.
	Do(f func()) error
	// StartDtoH and StartHtoD queue a copy; Sync waits for the queued ones.
	StartDtoH(dst []byte, src uint64) error
	StartHtoD(dst uint64, src []byte) error
	// StartDtoD queues a copy of n bytes between two device addresses.
	StartDtoD(dst, src, n uint64) error
	Sync() error
	Close()
}

// DeviceError marks an error of the device itself (the lane may be
// unusable afterwards), as opposed to one of the image.
type DeviceError interface{ DeviceError() bool }

// IsDeviceError says whether err is the device's (the driver's), not the
// image's.
func IsDeviceError(err error) bool {
	if de := (*cuda.Error)(nil); errors.As(err, &de) {
		return true
	}
	var d DeviceError
	return errors.As(err, &d) && d.DeviceError()
}

// CUDA is the driver's device d as a GPU.
func CUDA(d *cuda.Device) GPU { return cudaGPU{d} }

// cudaGPU is comparable (a pointer): the engine keys its work by device.
type cudaGPU struct{ d *cuda.Device }

func (g cudaGPU) Ordinal() int                              { return g.d.Ordinal }
func (g cudaGPU) UUID() string                              { return g.d.UUID }
func (g cudaGPU) Name() string                              { return g.d.Name }
func (g cudaGPU) Map(h uint64, size uint64) (uint64, error) { return g.d.Map(cuda.Handle(h), size) }
func (g cudaGPU) AcquireLane(staging int) (Lane, error) {
	l, err := g.d.AcquireLane(staging)
	if err != nil {
		return nil, err
	}
	return cudaLane{l}, nil
}
func (g cudaGPU) ReleaseLane(l Lane)                       { g.d.ReleaseLane(l.(cudaLane).l) }
func (g cudaGPU) MemInfo() (free, total uint64, err error) { return g.d.MemInfo() }
func (g cudaGPU) CreateScratch(size uint64) (uint64, error) {
	h, err := g.d.Create(size, false)
	return uint64(h), err
}
func (g cudaGPU) ReleaseScratch(h uint64) error { return g.d.Release(cuda.Handle(h)) }
func (g cudaGPU) HashRanges(ranges []Range, chunk int) ([][][16]byte, error) {
	rs := make([]cuda.Range, len(ranges))
	for i, r := range ranges {
		rs[i] = cuda.Range{VA: r.VA, Size: r.Size}
	}
	return g.d.HashRanges(rs, chunk)
}

type cudaLane struct{ l *cuda.Lane }

func (l cudaLane) Staging() []byte                        { return l.l.Staging }
func (l cudaLane) Do(f func()) error                      { return l.l.Do(f) }
func (l cudaLane) StartDtoH(dst []byte, src uint64) error { return l.l.StartDtoH(dst, src) }
func (l cudaLane) StartHtoD(dst uint64, src []byte) error { return l.l.StartHtoD(dst, src) }
func (l cudaLane) StartDtoD(dst, src, n uint64) error     { return l.l.StartDtoD(dst, src, n) }
func (l cudaLane) Sync() error                            { return l.l.Sync() }
func (l cudaLane) Close()                                 { l.l.Close() }

package daemon

import (
	"github.com/gpucr/gpucr/helper/cuda"
	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// Device is one GPU the helper allocates on. The production implementation
// is the driver (CUDADevices); tests use a memfd-backed fake.
type Device interface {
	Info() *helperpb.DeviceInfo
	// Create makes size bytes (a multiple of Info().Granularity) of pinned
	// device memory exportable as a POSIX fd, with the properties flags asks
	// for, and returns its handle.
	Create(size uint64, flags image.AllocFlags) (uint64, error)
	// Export returns a new fd for the handle; the caller closes it.
	Export(h uint64) (int, error)
	// Release drops the helper's handle.
	Release(h uint64) error
	// GPU is the device as the copy engines, the checkpoint and the
	// restore reach its memory; nil for a device they cannot copy.
	GPU() engine.GPU
}

// OutOfMemory is implemented by errors that mean the device is full.
type OutOfMemory = engine.OutOfMemory

// isOOM says whether err means the device is full.
func isOOM(err error) bool { return engine.IsOutOfMemory(err) }

type cudaDevice struct{ d *cuda.Device }

// CUDADevices adapts the loaded driver's devices.
func CUDADevices(drv *cuda.Driver) []Device {
	var out []Device
	for _, d := range drv.Devices {
		out = append(out, cudaDevice{d})
	}
	return out
}

func (c cudaDevice) Info() *helperpb.DeviceInfo {
	return &helperpb.DeviceInfo{Uuid: c.d.UUID, Name: c.d.Name, TotalMemory: c.d.TotalMemory,
		Granularity: c.d.Granularity, Ordinal: int32(c.d.Ordinal), PciBusId: c.d.PCIBusID}
}

// FreeMemory is the driver's free memory now: for Status only (cuMemGetInfo
// costs a driver round trip, too much for every allocation).
func (c cudaDevice) FreeMemory() (uint64, error) {
	free, _, err := c.d.MemInfo()
	return free, err
}

func (c cudaDevice) Create(size uint64, flags image.AllocFlags) (uint64, error) {
	if flags&image.AllocFlagHostNUMA != 0 {
		h, err := c.d.CreateHost(size)
		return uint64(h), err
	}
	h, err := c.d.Create(size, flags&image.AllocFlagGPUDirectRDMA != 0)
	if cuda.IsOutOfMemory(err) {
		return 0, oomError{err}
	}
	return uint64(h), err
}

func (c cudaDevice) Export(h uint64) (int, error) { return c.d.Export(cuda.Handle(h)) }
func (c cudaDevice) Release(h uint64) error       { return c.d.Release(cuda.Handle(h)) }

type oomError struct{ error }

func (oomError) OutOfMemory() bool { return true }
func (e oomError) Unwrap() error   { return e.error }

// KernelsError is why gpucr's GPU kernels could not be loaded here.
func (c cudaDevice) KernelsError() error { return c.d.KernelsError() }

// GPU is the driver device behind this one, for the copy engines.
func (c cudaDevice) GPU() engine.GPU { return engine.CUDA(c.d) }

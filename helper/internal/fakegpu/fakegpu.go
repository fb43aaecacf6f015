// Package fakegpu is a memfd-backed daemon.Device for tests: allocations are
// memfds of the rounded size, exports are dups, and it counts what is live.
// It is also an in-process engine.GPU (gpu.go): its "device memory" is the
// memfds, mapped into this process, so the copy engines, the chunk hash and
// a whole checkpoint and restore run without a driver.
package fakegpu

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// Device is a fake GPU.
type Device struct {
	info *helperpb.DeviceInfo

	mu    sync.Mutex
	next  uint64
	live  map[uint64]int // handle -> memfd
	used  uint64
	sizes map[uint64]uint64
	views map[uint64][]byte // handle -> its mapping into this process (gpu.go)
}

// New returns a device with total bytes and 2 MiB granularity.
func New(ordinal int, total uint64) *Device {
	return &Device{
		info: &helperpb.DeviceInfo{Uuid: fmt.Sprintf("GPU-00000000-0000-0000-0000-%012x", ordinal), Name: "fake GPU",
			TotalMemory: total, Granularity: 2 << 20, Ordinal: int32(ordinal)},
		live: map[uint64]int{}, sizes: map[uint64]uint64{}, views: map[uint64][]byte{},
	}
}

// ErrOOM is what Create returns when the device is full.
type ErrOOM struct{}

func (ErrOOM) Error() string     { return "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)" }
func (ErrOOM) OutOfMemory() bool { return true }

func (d *Device) Info() *helperpb.DeviceInfo { return d.info }

func (d *Device) Create(size uint64, _ image.AllocFlags) (uint64, error) {
	if size%d.info.Granularity != 0 {
		return 0, errors.New("cuMemCreate: CUDA_ERROR_INVALID_VALUE (1)")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.used+size > d.info.TotalMemory {
		return 0, ErrOOM{}
	}
	fd, err := unix.MemfdCreate("fakegpu", unix.MFD_CLOEXEC)
	if err != nil {
		return 0, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return 0, err
	}
	d.next++
	d.live[d.next] = fd
	d.sizes[d.next] = size
	d.used += size
	return d.next, nil
}

func (d *Device) Export(h uint64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fd, ok := d.live[h]
	if !ok {
		return -1, errors.New("cuMemExportToShareableHandle: CUDA_ERROR_INVALID_VALUE (1)")
	}
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}

func (d *Device) Release(h uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	fd, ok := d.live[h]
	if !ok {
		return errors.New("cuMemRelease: CUDA_ERROR_INVALID_VALUE (1)")
	}
	if v := d.views[h]; v != nil {
		_ = unix.Munmap(v)
		delete(d.views, h)
	}
	unix.Close(fd)
	delete(d.live, h)
	d.used -= d.sizes[h]
	delete(d.sizes, h)
	return nil
}

// Used returns the bytes and handles live now.
func (d *Device) Used() (bytes uint64, handles int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used, len(d.live)
}

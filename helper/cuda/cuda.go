// Package cuda is the helper's binding to the CUDA driver API. The driver is
// loaded at run time with dlopen ($GPUCR_LIBCUDA, else "libcuda.so.1"), so
// that the gpucr binary runs (and reports why) on hosts without one.
//
// Calls that need a context run on a per-device worker: a goroutine locked to
// its OS thread with that device's primary context current.
package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/../../include -O2
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"
)

// Result is a CUresult.
type Result int

// CUresult values the helper looks at.
const (
	OutOfMemory Result = 2
	NoDevice    Result = 100
)

// Error is a failed driver call: which call, and its CUresult.
type Error struct {
	Call   string
	Result Result
	Name   string // cuGetErrorName, or "CUresult"
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, int(e.Result))
}

// IsOutOfMemory reports whether err is a driver CUDA_ERROR_OUT_OF_MEMORY.
func IsOutOfMemory(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Result == OutOfMemory
}

func check(call string, r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	name := "CUresult"
	if s := C.gs_error_name(r); s != nil {
		name = C.GoString(s)
	}
	return &Error{Call: call, Result: Result(r), Name: name}
}

// LibraryPath is the driver library Load opens: $GPUCR_LIBCUDA, else libcuda.so.1.
func LibraryPath() string {
	if p := os.Getenv("GPUCR_LIBCUDA"); p != "" {
		return p
	}
	return "libcuda.so.1"
}

// Driver is the loaded and initialized driver with one worker per device.
type Driver struct {
	Path    string
	Version int // cuDriverGetVersion, e.g. 13000
	Devices []*Device
}

// Device is one GPU as the helper sees it.
type Device struct {
	Ordinal     int
	Name        string
	UUID        string // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
	TotalMemory uint64
	Granularity uint64 // minimum, pinned device memory, POSIX-fd handles
	PCIBusID    string // "0000:00:06.0", as the driver writes it

	work chan func()
	done chan struct{}
	stop sync.Once
	ctx  C.CUcontext // primary context, retained by the worker while it runs

	// Lanes kept between copies (AcquireLane, ReleaseLane): starting one
	// costs a thread, a stream and a pinned allocation, which added about
	// 20 ms to every checkpoint and restore of the H200 host's 16 lanes.
	laneMu    sync.Mutex
	idleLanes []*Lane
	closing   bool

	// The helper's own view of each allocation it has copied (Map), kept
	// until the allocation is released: making and dropping the views of
	// 128 buffers on every checkpoint took an unchanged 32 GB checkpoint
	// from 25 ms to 40 ms on the H100 host, more than hashing those 32 GB.
	viewMu sync.Mutex
	views  map[Handle]view

	// gpucr's own kernels, loaded on first use; the worker's alone.
	kern kernels
}

// view is where Map put an allocation in the helper's address space.
type view struct{ va, size uint64 }

// Handle is a CUmemGenericAllocationHandle.
type Handle uint64

var (
	loadMu   sync.Mutex
	loaded   string
	loadErr  error
	loadOnce bool
)

// Load opens the driver at path (dlopen; once per process), runs cuInit and
// starts a worker per device, which retains that device's primary context.
// A driver with no devices is an error (*Error with NoDevice).
func Load(path string) (*Driver, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	if !loadOnce {
		loadOnce = true
		loaded = path
		cpath := C.CString(path)
		defer C.free(unsafe.Pointer(cpath))
		var buf [512]C.char
		if C.gs_open(cpath, &buf[0], C.size_t(len(buf))) != 0 {
			loadErr = errors.New(C.GoString(&buf[0]))
		} else if err := check("cuInit", C.gs_cuInit(0)); err != nil {
			loadErr = err
		}
	} else if path != loaded {
		return nil, fmt.Errorf("driver %s already loaded; cannot load %s too", loaded, path)
	}
	if loadErr != nil {
		return nil, loadErr
	}
	d := &Driver{Path: path}
	var v C.int
	if err := check("cuDriverGetVersion", C.gs_cuDriverGetVersion(&v)); err != nil {
		return nil, err
	}
	d.Version = int(v)
	var n C.int
	if err := check("cuDeviceGetCount", C.gs_cuDeviceGetCount(&n)); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, &Error{Call: "cuDeviceGetCount", Result: NoDevice, Name: "no devices"}
	}
	for i := 0; i < int(n); i++ {
		dev, err := startDevice(i)
		if err != nil {
			d.Close()
			return nil, err
		}
		d.Devices = append(d.Devices, dev)
	}
	return d, nil
}

// Close stops the device workers (each releases its primary context).
func (d *Driver) Close() {
	for _, dev := range d.Devices {
		dev.close()
	}
}

// FormatUUID formats 16 UUID bytes as nvidia-smi does.
func FormatUUID(b [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// waitBlocking says how the helper's threads wait for the GPU: the driver's
// default (spin while there are fewer contexts than cores), or with
// GPUCR_HELPER_WAIT=block sleeping in the driver (blocking sync). Measured on
// the H200 host (16 cores, 16 lanes, tests/gpu/bench-criu.sh): spinning copies
// 8.7 GB in 0.44 s and 34.5 GB in 1.48 s, blocking in 0.48 s and 1.73 s: a
// lane's wake-up costs more than the CPU its spinning takes from the writer.
func waitBlocking() bool { return os.Getenv("GPUCR_HELPER_WAIT") == "block" }

func startDevice(ordinal int) (*Device, error) {
	dev := &Device{Ordinal: ordinal, work: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	go dev.worker(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return dev, nil
}

func (dev *Device) worker(ready chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(dev.done)
	var cd C.CUdevice
	if err := check("cuDeviceGet", C.gs_cuDeviceGet(&cd, C.int(dev.Ordinal))); err != nil {
		ready <- err
		return
	}
	var name [256]C.char
	if err := check("cuDeviceGetName", C.gs_cuDeviceGetName(&name[0], C.int(len(name)), cd)); err != nil {
		ready <- err
		return
	}
	dev.Name = C.GoString(&name[0])
	var bus [64]C.char
	if err := check("cuDeviceGetPCIBusId", C.gs_cuDeviceGetPCIBusId(&bus[0], C.int(len(bus)), cd)); err != nil {
		ready <- err
		return
	}
	dev.PCIBusID = C.GoString(&bus[0])
	var u C.CUuuid
	if err := check("cuDeviceGetUuid_v2", C.gs_cuDeviceGetUuid_v2(&u, cd)); err != nil {
		ready <- err
		return
	}
	var ub [16]byte
	for i := range ub {
		ub[i] = byte(u.bytes[i])
	}
	dev.UUID = FormatUUID(ub)
	var total C.size_t
	if err := check("cuDeviceTotalMem_v2", C.gs_cuDeviceTotalMem_v2(&total, cd)); err != nil {
		ready <- err
		return
	}
	dev.TotalMemory = uint64(total)
	if waitBlocking() {
		if err := check("cuDevicePrimaryCtxSetFlags", C.gs_cuDevicePrimaryCtxSetFlags_v2(cd, C.CU_CTX_SCHED_BLOCKING_SYNC)); err != nil {
			ready <- err
			return
		}
	}
	var ctx C.CUcontext
	if err := check("cuDevicePrimaryCtxRetain", C.gs_cuDevicePrimaryCtxRetain(&ctx, cd)); err != nil {
		ready <- err
		return
	}
	defer C.gs_cuDevicePrimaryCtxRelease_v2(cd)
	dev.ctx = ctx
	if err := check("cuCtxSetCurrent", C.gs_cuCtxSetCurrent(ctx)); err != nil {
		ready <- err
		return
	}
	var g C.size_t
	if err := check("cuMemGetAllocationGranularity", C.gs_granularity(&g, C.int(cd))); err != nil {
		ready <- err
		return
	}
	dev.Granularity = uint64(g)
	ready <- nil
	for f := range dev.work {
		f()
	}
	dev.kern.unload() // before the primary context goes
	C.gs_cuCtxSetCurrent(nil)
}

var errClosed = errors.New("device worker stopped")

// do runs f on the device's worker thread.
func (dev *Device) do(f func()) error {
	ran := make(chan struct{})
	select {
	case dev.work <- func() { f(); close(ran) }:
	case <-dev.done:
		return errClosed
	}
	<-ran
	return nil
}

func (dev *Device) close() {
	dev.laneMu.Lock()
	idle := dev.idleLanes
	dev.idleLanes, dev.closing = nil, true
	dev.laneMu.Unlock()
	for _, l := range idle {
		l.Close() // before the primary context goes
	}
	dev.viewMu.Lock()
	for h := range dev.views {
		_ = dev.unmapLocked(h)
	}
	dev.viewMu.Unlock()
	dev.stop.Do(func() { close(dev.work) })
	<-dev.done
}

// Create makes size bytes (a multiple of Granularity) of pinned device memory
// that can be exported as a POSIX fd; gpuDirectRDMA asks for memory a NIC may
// reach (allocFlags.gpuDirectRDMACapable).
func (dev *Device) Create(size uint64, gpuDirectRDMA bool) (Handle, error) {
	return dev.create(size, gpuDirectRDMA, false)
}

// CreateHost makes size bytes of pinned host memory (location HOST_NUMA)
// on the device's host NUMA node, exportable as a POSIX fd; the device
// reaches it, and Map maps it for the device.
func (dev *Device) CreateHost(size uint64) (Handle, error) {
	return dev.create(size, false, true)
}

func (dev *Device) create(size uint64, gpuDirectRDMA, host bool) (Handle, error) {
	var h C.CUmemGenericAllocationHandle
	var err error
	gdr, hst := C.int(0), C.int(0)
	if gpuDirectRDMA {
		gdr = 1
	}
	if host {
		hst = 1
	}
	if e := dev.do(func() {
		err = check("cuMemCreate", C.gs_create(&h, C.size_t(size), C.int(dev.Ordinal), gdr, hst))
	}); e != nil {
		return 0, e
	}
	return Handle(h), err
}

// Export returns a new POSIX fd for h (the caller closes it).
func (dev *Device) Export(h Handle) (int, error) {
	var fd C.int
	var err error
	if e := dev.do(func() {
		err = check("cuMemExportToShareableHandle", C.gs_export_fd(&fd, C.CUmemGenericAllocationHandle(h)))
	}); e != nil {
		return -1, e
	}
	if err != nil {
		return -1, err
	}
	return int(fd), nil
}

// Release drops the helper's view of h (Map), if any, and its handle; the
// memory lives while imports do.
func (dev *Device) Release(h Handle) error {
	if err := dev.Unmap(h); err != nil {
		return err
	}
	var err error
	if e := dev.do(func() { err = check("cuMemRelease", C.gs_cuMemRelease(C.CUmemGenericAllocationHandle(h))) }); e != nil {
		return e
	}
	return err
}

// MemInfo is cuMemGetInfo_v2 on the device's primary context.
func (dev *Device) MemInfo() (free, total uint64, err error) {
	var f, t C.size_t
	if e := dev.do(func() { err = check("cuMemGetInfo_v2", C.gs_cuMemGetInfo_v2(&f, &t)) }); e != nil {
		return 0, 0, e
	}
	return uint64(f), uint64(t), err
}

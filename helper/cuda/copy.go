package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Map returns the helper's own read/write view of allocation h (size
// bytes, a multiple of Granularity), at an address of its choosing in its
// context: the copy engines and the hash kernels reach the application's
// memory through it. The view is made on first use and kept until
// Release(h) or Unmap(h), so repeated checkpoints of the same buffers map
// nothing.
func (dev *Device) Map(h Handle, size uint64) (uint64, error) {
	dev.viewMu.Lock()
	defer dev.viewMu.Unlock()
	if v, ok := dev.views[h]; ok {
		if v.size != size {
			return 0, fmt.Errorf("allocation %#x: mapped with %d bytes, asked for %d", uint64(h), v.size, size)
		}
		return v.va, nil
	}
	var va C.CUdeviceptr
	var err error
	if e := dev.do(func() {
		err = check("cuMemMap (helper view)", C.gs_map(&va, C.CUmemGenericAllocationHandle(h), C.size_t(size),
			C.size_t(dev.Granularity), C.int(dev.Ordinal)))
	}); e != nil {
		return 0, e
	}
	if err != nil {
		return 0, err
	}
	if dev.views == nil {
		dev.views = map[Handle]view{}
	}
	dev.views[h] = view{uint64(va), size}
	return uint64(va), nil
}

// Unmap drops the helper's view of h, if it has one, and frees its
// address range.
func (dev *Device) Unmap(h Handle) error {
	dev.viewMu.Lock()
	defer dev.viewMu.Unlock()
	return dev.unmapLocked(h)
}

func (dev *Device) unmapLocked(h Handle) error {
	v, ok := dev.views[h]
	if !ok {
		return nil
	}
	delete(dev.views, h)
	var err error
	if e := dev.do(func() { err = check("cuMemUnmap", C.gs_unmap(C.CUdeviceptr(v.va), C.size_t(v.size))) }); e != nil {
		return e
	}
	return err
}

// Views is how many allocations the helper holds a view of.
func (dev *Device) Views() int {
	dev.viewMu.Lock()
	defer dev.viewMu.Unlock()
	return len(dev.views)
}

// Lane is one OS thread with the device's primary context current, a stream
// of its own and a pinned staging buffer: copies on different lanes run
// concurrently (several DMA streams), and whatever a lane does with its
// staging buffer between copies (hashing, writing the image) overlaps with
// the copies of the other lanes.
type Lane struct {
	dev     *Device
	Staging []byte // pinned host memory
	stream  C.CUstream
	work    chan func()
	done    chan struct{}
}

// maxIdleLanes bounds the lanes a device keeps between copies.
const maxIdleLanes = 64

// AcquireLane returns an idle lane whose staging buffer holds at least
// staging bytes, or starts a new one.
func (dev *Device) AcquireLane(staging int) (*Lane, error) {
	dev.laneMu.Lock()
	for i, l := range dev.idleLanes {
		if len(l.Staging) >= staging {
			dev.idleLanes = append(dev.idleLanes[:i], dev.idleLanes[i+1:]...)
			dev.laneMu.Unlock()
			return l, nil
		}
	}
	dev.laneMu.Unlock()
	return dev.NewLane(staging)
}

// ReleaseLane keeps l for the next copy. A lane whose copy failed should be
// closed instead (its stream may be in an error state).
func (dev *Device) ReleaseLane(l *Lane) {
	dev.laneMu.Lock()
	if !dev.closing && len(dev.idleLanes) < maxIdleLanes {
		dev.idleLanes = append(dev.idleLanes, l)
		dev.laneMu.Unlock()
		return
	}
	dev.laneMu.Unlock()
	l.Close()
}

// WarmLanes starts n lanes of staging bytes and keeps them idle, so that the
// first copy does not pay for starting them; errors are returned, the lanes
// started so far kept.
func (dev *Device) WarmLanes(n, staging int) error {
	lanes := make([]*Lane, 0, n)
	var err error
	for range n {
		var l *Lane
		if l, err = dev.AcquireLane(staging); err != nil {
			break
		}
		lanes = append(lanes, l)
	}
	for _, l := range lanes {
		dev.ReleaseLane(l)
	}
	return err
}

// IdleLanes is how many lanes the device keeps (for tests).
func (dev *Device) IdleLanes() int {
	dev.laneMu.Lock()
	defer dev.laneMu.Unlock()
	return len(dev.idleLanes)
}

// NewLane starts a lane with a pinned staging buffer of staging bytes.
func (dev *Device) NewLane(staging int) (*Lane, error) {
	l := &Lane{dev: dev, work: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	go l.run(staging, ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Lane) run(staging int, ready chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(l.done)
	if err := check("cuCtxSetCurrent", C.gs_cuCtxSetCurrent(l.dev.ctx)); err != nil {
		ready <- err
		return
	}
	// Last: the stream and the staging buffer are freed in the context
	// (without a current one the driver refuses, and both would leak).
	defer C.gs_cuCtxSetCurrent(nil)
	if err := check("cuStreamCreate", C.gs_stream_create(&l.stream)); err != nil {
		ready <- err
		return
	}
	defer C.gs_stream_destroy(l.stream)
	var p unsafe.Pointer
	if err := check(fmt.Sprintf("cuMemHostAlloc(%d)", staging), C.gs_host_alloc(&p, C.size_t(staging))); err != nil {
		ready <- err
		return
	}
	defer C.gs_host_free(p)
	l.Staging = unsafe.Slice((*byte)(p), staging)
	ready <- nil
	for f := range l.work {
		f()
	}
	l.Staging = nil
}

// Do runs f on the lane's thread; DtoH and HtoD may only be called from f.
func (l *Lane) Do(f func()) error {
	ran := make(chan struct{})
	select {
	case l.work <- func() { f(); close(ran) }:
	case <-l.done:
		return errClosed
	}
	<-ran
	return nil
}

// DtoH copies len(dst) bytes at device address src into dst (pinned memory,
// usually the lane's Staging) on the lane's stream and waits for it.
func (l *Lane) DtoH(dst []byte, src uint64) error {
	if err := l.StartDtoH(dst, src); err != nil {
		return err
	}
	return l.Sync()
}

// HtoD copies src to device address dst on the lane's stream and waits.
func (l *Lane) HtoD(dst uint64, src []byte) error {
	if err := l.StartHtoD(dst, src); err != nil {
		return err
	}
	return l.Sync()
}

// StartDtoH queues a copy of len(dst) bytes at device address src into dst
// (pinned memory) on the lane's stream without waiting: the lane's thread
// can work on other bytes meanwhile. Sync waits for it; dst must not be
// touched before.
func (l *Lane) StartDtoH(dst []byte, src uint64) error {
	if len(dst) == 0 {
		return nil
	}
	return check("cuMemcpyDtoHAsync", C.gs_dtoh_async(unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.size_t(len(dst)), l.stream))
}

// StartHtoD queues a copy of src (pinned memory) to device address dst on
// the lane's stream without waiting; src must not change before Sync.
func (l *Lane) StartHtoD(dst uint64, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return check("cuMemcpyHtoDAsync", C.gs_htod_async(C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)), l.stream))
}

// StartDtoD queues a copy of n bytes from device address src to device
// address dst (both on the lane's device) without waiting.
func (l *Lane) StartDtoD(dst, src, n uint64) error {
	if n == 0 {
		return nil
	}
	return check("cuMemcpyDtoDAsync", C.gs_dtod_async(C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), l.stream))
}

// Sync waits for every copy queued on the lane's stream; an error of a
// queued copy shows here.
func (l *Lane) Sync() error { return check("cuStreamSynchronize", C.gs_stream_sync(l.stream)) }

// Close stops the lane and frees its stream and staging buffer.
func (l *Lane) Close() {
	select {
	case <-l.done:
	default:
		close(l.work)
		<-l.done
	}
}

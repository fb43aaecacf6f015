package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/gpucr/gpucr/ptx"
)

// kernels is gpucr's own module (ptx/kernels.ptx) in a device's primary
// context, and the device memory its launches write their results to. Only
// the device's worker touches it.
type kernels struct {
	loaded bool
	err    error // the load failed: said once, every time it is asked for
	mod    C.CUmodule
	hash   C.CUfunction
	out    C.CUdeviceptr
	outCap uint64
}

// load loads the module on first use (on the worker thread).
func (k *kernels) load() error {
	if k.loaded || k.err != nil {
		return k.err
	}
	text := C.CString(ptx.Kernels)
	defer C.free(unsafe.Pointer(text))
	if err := check("cuModuleLoadData(gpucr kernels)", C.gs_module_load(&k.mod, text)); err != nil {
		k.err = err
		return err
	}
	name := C.CString(ptx.ChunkHashKernel)
	defer C.free(unsafe.Pointer(name))
	if err := check("cuModuleGetFunction("+ptx.ChunkHashKernel+")", C.gs_module_function(&k.hash, k.mod, name)); err != nil {
		C.gs_module_unload(k.mod)
		k.err = err
		return err
	}
	k.loaded = true
	return nil
}

// output returns device memory of at least n bytes for a launch's results.
func (k *kernels) output(n uint64) (C.CUdeviceptr, error) {
	if n <= k.outCap {
		return k.out, nil
	}
	if k.out != 0 {
		C.gs_mem_free(k.out)
		k.out, k.outCap = 0, 0
	}
	n = max(n, 64<<10)
	if err := check("cuMemAlloc", C.gs_mem_alloc(&k.out, C.size_t(n))); err != nil {
		return 0, err
	}
	k.outCap = n
	return k.out, nil
}

func (k *kernels) unload() {
	if k.out != 0 {
		C.gs_mem_free(k.out)
	}
	if k.loaded {
		C.gs_module_unload(k.mod)
	}
	*k = kernels{}
}

// HashChunks returns the chunk hash (ptx.ChunkHash) of each chunk of the
// device memory [va, va+size) that the helper has mapped: chunk bytes each,
// the last one shorter if size is not a multiple. It runs on the GPU, in
// the helper's own context, and reads nothing into host memory but the
// hashes. va and chunk must be multiples of 16.
func (dev *Device) HashChunks(va, size uint64, chunk int) ([][16]byte, error) {
	hs, err := dev.HashRanges([]Range{{va, size}}, chunk)
	if err != nil {
		return nil, err
	}
	return hs[0], nil
}

// Range is device memory the helper has mapped: Size bytes at VA.
type Range struct{ VA, Size uint64 }

// HashRanges is HashChunks of several ranges at once: one table of every
// chunk of every range, one launch (a block per chunk, so even a process
// of many small allocations fills the GPU), one wait and one copy of the
// hashes.
func (dev *Device) HashRanges(ranges []Range, chunk int) ([][][16]byte, error) {
	if chunk <= 0 || chunk%16 != 0 {
		return nil, fmt.Errorf("hash chunks: chunk size %d is not a positive multiple of 16", chunk)
	}
	var table []uint64 // address, length per chunk
	for _, r := range ranges {
		if r.VA%16 != 0 {
			return nil, fmt.Errorf("hash chunks: address 0x%x is not a multiple of 16", r.VA)
		}
		for off := uint64(0); off < r.Size; off += uint64(chunk) {
			table = append(table, r.VA+off, min(uint64(chunk), r.Size-off))
		}
	}
	total := uint64(len(table) / 2)
	out := make([][][16]byte, len(ranges))
	if total == 0 {
		return out, nil
	}
	if total > 1<<31-1 {
		return nil, fmt.Errorf("hash chunks: %d chunks in one launch", total)
	}
	words := make([]uint64, 2*total)
	var err error
	if e := dev.do(func() {
		if err = dev.kern.load(); err != nil {
			return
		}
		// One device buffer: the table, then the hashes (16 bytes per
		// chunk each).
		var buf C.CUdeviceptr
		if buf, err = dev.kern.output(32 * total); err != nil {
			return
		}
		hashes := C.CUdeviceptr(uint64(buf) + 16*total)
		if err = check("cuMemcpyHtoD(chunk table)", C.gs_htod(buf, unsafe.Pointer(&table[0]), C.size_t(16*total), nil)); err != nil {
			return
		}
		err = check("cuLaunchKernel("+ptx.ChunkHashKernel+")", C.gs_launch3(dev.kern.hash, C.uint(total),
			C.uint(ptx.HashLanes), nil, C.uint64_t(buf), C.uint64_t(total), C.uint64_t(hashes)))
		if err != nil {
			return
		}
		// On the legacy stream, after the kernel; waited for.
		err = check("cuMemcpyDtoH(chunk hashes)", C.gs_dtoh(unsafe.Pointer(&words[0]), hashes, C.size_t(16*total), nil))
	}); e != nil {
		return nil, e
	}
	if err != nil {
		return nil, err
	}
	k := 0
	for i, r := range ranges {
		hs := make([][16]byte, (r.Size+uint64(chunk)-1)/uint64(chunk))
		for j := range hs {
			binary.BigEndian.PutUint64(hs[j][:8], words[2*k])
			binary.BigEndian.PutUint64(hs[j][8:], words[2*k+1])
			k++
		}
		out[i] = hs
	}
	return out, nil
}

// KernelsError is why gpucr's kernels could not be loaded on the device, nil
// if they were or no load was tried yet.
func (dev *Device) KernelsError() error {
	var err error
	if e := dev.do(func() { err = dev.kern.err }); e != nil {
		return e
	}
	return err
}

// LoadKernels loads gpucr's kernels into the device's context now (the
// driver compiles the PTX, which takes a while the first time), so that the
// first checkpoint does not wait for it.
func (dev *Device) LoadKernels() error {
	var err error
	if e := dev.do(func() { err = dev.kern.load() }); e != nil {
		return e
	}
	return err
}

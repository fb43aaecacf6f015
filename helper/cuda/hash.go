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
	if chunk <= 0 || chunk%16 != 0 || va%16 != 0 {
		return nil, fmt.Errorf("hash chunks: chunk %d and address 0x%x must be multiples of 16", chunk, va)
	}
	n := (size + uint64(chunk) - 1) / uint64(chunk)
	if n == 0 {
		return nil, nil
	}
	if n > 1<<31-1 {
		return nil, fmt.Errorf("hash chunks: %d chunks in one launch", n)
	}
	words := make([]uint64, 2*n)
	var err error
	if e := dev.do(func() {
		if err = dev.kern.load(); err != nil {
			return
		}
		var out C.CUdeviceptr
		if out, err = dev.kern.output(16 * n); err != nil {
			return
		}
		err = check("cuLaunchKernel("+ptx.ChunkHashKernel+")", C.gs_launch4(dev.kern.hash, C.uint(n), C.uint(ptx.HashLanes), nil,
			C.uint64_t(va), C.uint64_t(size), C.uint64_t(chunk), C.uint64_t(out)))
		if err != nil {
			return
		}
		// On the legacy stream, after the kernel; waited for.
		err = check("cuMemcpyDtoH(chunk hashes)", C.gs_dtoh(unsafe.Pointer(&words[0]), out, C.size_t(16*n), nil))
	}); e != nil {
		return nil, e
	}
	if err != nil {
		return nil, err
	}
	hashes := make([][16]byte, n)
	for i := range hashes {
		binary.BigEndian.PutUint64(hashes[i][:8], words[2*i])
		binary.BigEndian.PutUint64(hashes[i][8:], words[2*i+1])
	}
	return hashes, nil
}

/*
 * Allocations, copies, memsets, host memory, symbols.
 *
 * Pinned host memory in served mode: the process has no driver to pin pages
 * with, and its copies go through the served library's staging, which copies
 * a pageable buffer when the call is made. So cudaHostAlloc hands out plain
 * page-aligned memory there (the copies it is used for are correct and stay
 * asynchronous to the GPU), and cudaHostRegister leaves memory as it is. What
 * needs the device to reach host memory (mapped memory) is refused.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "rt.h"

#define DPTR(p) ((CUdeviceptr)(uintptr_t)(p))

RT_API cudaError_t cudaMalloc(void **devPtr, size_t size) {
    if (!devPtr)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    if (size == 0) { /* the runtime's answer to nothing: a null pointer and success */
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    cudaError_t e = DRV(MemAlloc, (&d, size));
    if (e != cudaSuccess)
        return rt_ret(e);
    *devPtr = (void *)(uintptr_t)d;
    return cudaSuccess;
}

RT_API cudaError_t cudaFree(void *devPtr) {
    CTX(); /* cudaFree(NULL) is how programs make the runtime set up its context */
    if (!devPtr)
        return cudaSuccess;
    cudaError_t e = DRV(MemFree, (DPTR(devPtr)));
    return rt_ret(e == cudaErrorInvalidValue ? cudaErrorInvalidDevicePointer : e);
}

RT_API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream) {
    if (!devPtr)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUdeviceptr d = 0;
    cudaError_t e = DRV(MemAllocAsync, (&d, size, stream));
    if (e == cudaSuccess)
        *devPtr = (void *)(uintptr_t)d;
    return rt_ret(e);
}

RT_API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) {
    CTX();
    return rt_ret(DRV(MemFreeAsync, (DPTR(devPtr), stream)));
}

/* ---- host memory ---- */

/* Served mode's "pinned" allocations, by address, so cudaFreeHost knows them and cudaPointerGetAttributes calls
 * them host memory. */
struct host_block {
    void *p;
    size_t size;
    struct host_block *next;
};
static pthread_mutex_t host_mu = PTHREAD_MUTEX_INITIALIZER;
static struct host_block *host_blocks;

static struct host_block *host_find_locked(const void *p) {
    for (struct host_block *b = host_blocks; b; b = b->next)
        if ((const char *)p >= (const char *)b->p && (const char *)p < (const char *)b->p + b->size)
            return b;
    return NULL;
}

RT_API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    if (!pHost)
        return rt_ret(cudaErrorInvalidValue);
    *pHost = NULL;
    CTX();
    if (!rt_served()) {
        cudaError_t e = DRV(MemHostAlloc, (pHost, size, flags));
        return rt_ret(e);
    }
    if (flags & cudaHostAllocMapped)
        RT_REFUSE("mapped host memory (the device reading the process's memory) is not provided in served mode");
    if (size == 0)
        return cudaSuccess;
    struct host_block *b = malloc(sizeof *b);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!b || p == MAP_FAILED) {
        free(b);
        if (p != MAP_FAILED)
            munmap(p, size);
        return rt_ret(cudaErrorMemoryAllocation);
    }
    b->p = p;
    b->size = size;
    pthread_mutex_lock(&host_mu);
    b->next = host_blocks;
    host_blocks = b;
    pthread_mutex_unlock(&host_mu);
    *pHost = p;
    return cudaSuccess;
}

RT_API cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

RT_API cudaError_t cudaFreeHost(void *ptr) {
    if (!ptr)
        return cudaSuccess;
    pthread_mutex_lock(&host_mu);
    struct host_block **pp = &host_blocks;
    while (*pp && (*pp)->p != ptr)
        pp = &(*pp)->next;
    struct host_block *b = *pp;
    if (b)
        *pp = b->next;
    pthread_mutex_unlock(&host_mu);
    if (b) {
        munmap(b->p, b->size);
        free(b);
        return cudaSuccess;
    }
    if (rt_served())
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(MemFreeHost, (ptr)));
}

RT_API cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
    if (!ptr || !size)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    if (!rt_served())
        return rt_ret(DRV(MemHostRegister, (ptr, size, flags)));
    if (flags & cudaHostRegisterMapped)
        RT_REFUSE("mapped host memory (the device reading the process's memory) is not provided in served mode");
    return cudaSuccess;
}

RT_API cudaError_t cudaHostUnregister(void *ptr) {
    if (!ptr)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    if (!rt_served())
        return rt_ret(DRV(MemHostUnregister, (ptr)));
    return cudaSuccess;
}

/* ---- where a pointer lives ---- */

bool rt_is_device(const void *p) {
    CUdeviceptr base = 0;
    size_t size = 0;
    return rt_drv.MemGetAddressRange && rt_drv.MemGetAddressRange(&base, &size, DPTR(p)) == CUDA_SUCCESS;
}

/* CUpointer_attribute numbers: what cudaPointerGetAttributes asks the driver. */
enum { PA_MEMORY_TYPE = 2, PA_DEVICE_POINTER = 3, PA_HOST_POINTER = 4, PA_IS_MANAGED = 8, PA_DEVICE_ORDINAL = 9 };
/* CUmemorytype: host, device, unified. */
enum { MT_HOST = 1, MT_DEVICE = 2, MT_UNIFIED = 4 };

RT_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
    if (!attributes)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    memset(attributes, 0, sizeof *attributes);
    attributes->device = -2; /* NVIDIA's runtime's answer for memory no device holds */
    pthread_mutex_lock(&host_mu);
    bool host = host_find_locked(ptr) != NULL;
    pthread_mutex_unlock(&host_mu);
    if (host) {
        attributes->type = cudaMemoryTypeHost;
        attributes->device = rt_device();
        attributes->hostPointer = (void *)ptr;
        return cudaSuccess;
    }
    if (rt_drv.PointerGetAttributes) {
        int names[] = {PA_MEMORY_TYPE, PA_DEVICE_POINTER, PA_HOST_POINTER, PA_IS_MANAGED, PA_DEVICE_ORDINAL};
        unsigned mt = 0;
        CUdeviceptr dp = 0;
        void *hp = NULL;
        int managed = 0, ordinal = -2;
        void *data[] = {&mt, &dp, &hp, &managed, &ordinal};
        cudaError_t e = (cudaError_t)rt_drv.PointerGetAttributes(5, names, data, DPTR(ptr));
        if (e != cudaSuccess)
            return rt_ret(e);
        attributes->type = managed           ? cudaMemoryTypeManaged
                           : mt == MT_DEVICE ? cudaMemoryTypeDevice
                           : mt == MT_HOST   ? cudaMemoryTypeHost
                                             : cudaMemoryTypeUnregistered;
        if (attributes->type != cudaMemoryTypeUnregistered) {
            attributes->device = ordinal;
            attributes->devicePointer = (void *)(uintptr_t)dp;
            attributes->hostPointer = hp;
        }
        return cudaSuccess;
    }
    /* a driver without the query: device memory is what it knows a range of */
    if (rt_is_device(ptr)) {
        attributes->type = cudaMemoryTypeDevice;
        attributes->device = rt_device();
        attributes->devicePointer = (void *)ptr;
    }
    return cudaSuccess;
}

/* ---- copies ---- */

/* cudaMemcpyDefault's direction, from where each side lives. */
static enum cudaMemcpyKind direction(void *dst, const void *src, enum cudaMemcpyKind kind) {
    if (kind != cudaMemcpyDefault)
        return kind;
    bool d = rt_is_device(dst), s = rt_is_device(src);
    return d && s ? cudaMemcpyDeviceToDevice
           : d    ? cudaMemcpyHostToDevice
           : s    ? cudaMemcpyDeviceToHost
                  : cudaMemcpyHostToHost;
}

static cudaError_t copy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream,
                        bool async) {
    if (count == 0)
        return cudaSuccess;
    if (!dst || !src)
        return cudaErrorInvalidValue;
    switch (direction(dst, src, kind)) {
    case cudaMemcpyHostToDevice:
        return async ? DRV(MemcpyHtoDAsync, (DPTR(dst), src, count, stream)) : DRV(MemcpyHtoD, (DPTR(dst), src, count));
    case cudaMemcpyDeviceToHost:
        return async ? DRV(MemcpyDtoHAsync, (dst, DPTR(src), count, stream)) : DRV(MemcpyDtoH, (dst, DPTR(src), count));
    case cudaMemcpyDeviceToDevice:
        return async ? DRV(MemcpyDtoDAsync, (DPTR(dst), DPTR(src), count, stream))
                     : DRV(MemcpyDtoD, (DPTR(dst), DPTR(src), count));
    case cudaMemcpyHostToHost: {
        /* ordered after the stream's work, as the runtime's host-to-host copy is */
        cudaError_t e = async ? DRV(StreamSynchronize, (stream)) : DRV(CtxSynchronize, ());
        if (e == cudaSuccess)
            memmove(dst, src, count);
        return e;
    }
    default: return cudaErrorInvalidMemcpyDirection;
    }
}

RT_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    CTX();
    return rt_ret(copy(dst, src, count, kind, NULL, false));
}

RT_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                   cudaStream_t stream) {
    CTX();
    return rt_ret(copy(dst, src, count, kind, stream, true));
}

/* A 2D copy: one copy when both sides are contiguous, else a copy per row. */
static cudaError_t copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                          enum cudaMemcpyKind kind, cudaStream_t stream, bool async) {
    if (width > dpitch || width > spitch)
        return cudaErrorInvalidValue; /* cudaErrorInvalidPitchValue in NVIDIA's runtime; the same cause */
    if (height == 0 || width == 0)
        return cudaSuccess;
    if (width == dpitch && width == spitch)
        return copy(dst, src, width * height, kind, stream, async);
    kind = direction(dst, src, kind);
    for (size_t r = 0; r < height; r++) {
        cudaError_t e = copy((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind, stream, async);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

RT_API cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                                enum cudaMemcpyKind kind) {
    CTX();
    return rt_ret(copy2d(dst, dpitch, src, spitch, width, height, kind, NULL, false));
}

RT_API cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                     size_t height, enum cudaMemcpyKind kind, cudaStream_t stream) {
    CTX();
    return rt_ret(copy2d(dst, dpitch, src, spitch, width, height, kind, stream, true));
}

RT_API cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                                       cudaStream_t stream) {
    CTX();
    if (dstDevice != srcDevice)
        RT_REFUSE("copies between two GPUs are not provided by gpucr's runtime");
    return rt_ret(copy(dst, src, count, cudaMemcpyDeviceToDevice, stream, true));
}

RT_API cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    CTX();
    return rt_ret(count ? DRV(MemsetD8, (DPTR(devPtr), (unsigned char)value, count)) : cudaSuccess);
}

RT_API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    CTX();
    return rt_ret(count ? DRV(MemsetD8Async, (DPTR(devPtr), (unsigned char)value, count, stream)) : cudaSuccess);
}

/* ---- __device__ and __constant__ variables ---- */

static cudaError_t symbol_range(const void *symbol, size_t count, size_t offset, CUdeviceptr *at) {
    CUdeviceptr base;
    size_t size;
    cudaError_t e = rt_symbol(symbol, &base, &size);
    if (e != cudaSuccess)
        return e;
    if (offset > size || count > size - offset)
        return cudaErrorInvalidValue;
    *at = base + offset;
    return cudaSuccess;
}

/* A copy into (to) or out of a variable, at offset: the direction must be the one into or out of device memory, or
 * cudaMemcpyDefault (the variable's side is device memory, so copy() tells the other side's). */
static cudaError_t symbol_copy(const void *symbol, void *other, size_t count, size_t offset, enum cudaMemcpyKind kind,
                               bool to, cudaStream_t stream, bool async) {
    enum cudaMemcpyKind across = to ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    if (kind != across && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    CUdeviceptr at;
    cudaError_t e = symbol_range(symbol, count, offset, &at);
    if (e != cudaSuccess)
        return e;
    void *var = (void *)(uintptr_t)at;
    return to ? copy(var, other, count, kind, stream, async) : copy(other, var, count, kind, stream, async);
}

RT_API cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count, size_t offset,
                                      enum cudaMemcpyKind kind) {
    CTX();
    return rt_ret(symbol_copy(symbol, (void *)src, count, offset, kind, true, NULL, false));
}

RT_API cudaError_t cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count, size_t offset,
                                           enum cudaMemcpyKind kind, cudaStream_t stream) {
    CTX();
    return rt_ret(symbol_copy(symbol, (void *)src, count, offset, kind, true, stream, true));
}

RT_API cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset,
                                        enum cudaMemcpyKind kind) {
    CTX();
    return rt_ret(symbol_copy(symbol, dst, count, offset, kind, false, NULL, false));
}

RT_API cudaError_t cudaGetSymbolAddress(void **devPtr, const void *symbol) {
    if (!devPtr)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUdeviceptr d;
    cudaError_t e = rt_symbol(symbol, &d, NULL);
    if (e == cudaSuccess)
        *devPtr = (void *)(uintptr_t)d;
    return rt_ret(e);
}

RT_API cudaError_t cudaGetSymbolSize(size_t *size, const void *symbol) {
    if (!size)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUdeviceptr d;
    return rt_ret(rt_symbol(symbol, &d, size));
}

RT_API cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);
RT_API cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
    if (!devPtr || !pitch)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUdeviceptr d = 0;
    /* 16: the widest element the driver aligns rows for */
    cudaError_t e = DRV(MemAllocPitch, (&d, pitch, width, height, 16));
    if (e == cudaSuccess)
        *devPtr = (void *)(uintptr_t)d;
    return rt_ret(e);
}

RT_API cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count);
RT_API cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count) {
    CTX();
    if (dstDevice != srcDevice)
        RT_REFUSE("copies between two GPUs are not provided by gpucr's runtime");
    return rt_ret(copy(dst, src, count, cudaMemcpyDeviceToDevice, NULL, false));
}

RT_API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
RT_API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    (void)devPtr;
    (void)size;
    (void)flags;
    RT_REFUSE("unified (managed) memory is not provided by gpucr's runtime");
}

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

#define FNS(X)                                                                                                         \
    X(cuInit, (unsigned int))                                                                                          \
    X(cuDriverGetVersion, (int *))                                                                                     \
    X(cuDeviceGetCount, (int *))                                                                                       \
    X(cuDeviceGet, (CUdevice *, int))                                                                                  \
    X(cuDeviceGetName, (char *, int, CUdevice))                                                                        \
    X(cuDeviceGetPCIBusId, (char *, int, CUdevice))                                                                    \
    X(cuDeviceGetUuid_v2, (CUuuid *, CUdevice))                                                                        \
    X(cuDeviceTotalMem_v2, (size_t *, CUdevice))                                                                       \
    X(cuDeviceGetAttribute, (int *, CUdevice_attribute, CUdevice))                                                     \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                                               \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice))                                                                        \
    X(cuDevicePrimaryCtxSetFlags_v2, (CUdevice, unsigned int))                                                         \
    X(cuCtxSetCurrent, (CUcontext))                                                                                    \
    X(cuMemGetAllocationGranularity, (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))        \
    X(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))          \
    X(cuMemExportToShareableHandle,                                                                                    \
      (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long))                           \
    X(cuMemRelease, (CUmemGenericAllocationHandle))                                                                    \
    X(cuMemGetInfo_v2, (size_t *, size_t *))                                                                           \
    X(cuGetErrorName, (CUresult, const char **))                                                                       \
    X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))                           \
    X(cuMemAddressFree, (CUdeviceptr, size_t))                                                                         \
    X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))                       \
    X(cuMemUnmap, (CUdeviceptr, size_t))                                                                               \
    X(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))                                          \
    X(cuMemHostAlloc, (void **, size_t, unsigned int))                                                                 \
    X(cuMemFreeHost, (void *))                                                                                         \
    X(cuStreamCreate, (CUstream *, unsigned int))                                                                      \
    X(cuStreamDestroy_v2, (CUstream))                                                                                  \
    X(cuStreamSynchronize, (CUstream))                                                                                 \
    X(cuMemcpyDtoHAsync_v2, (void *, CUdeviceptr, size_t, CUstream))                                                   \
    X(cuMemcpyHtoDAsync_v2, (CUdeviceptr, const void *, size_t, CUstream))                                             \
    X(cuMemcpyDtoDAsync_v2, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                                              \
    X(cuCheckpointProcessGetRestoreThreadId, (int, int *))                                                             \
    X(cuCheckpointProcessGetState, (int, CUprocessState *))                                                            \
    X(cuCheckpointProcessLock, (int, CUcheckpointLockArgs *))                                                          \
    X(cuCheckpointProcessCheckpoint, (int, CUcheckpointCheckpointArgs *))                                              \
    X(cuCheckpointProcessRestore, (int, CUcheckpointRestoreArgs *))                                                    \
    X(cuCheckpointProcessUnlock, (int, CUcheckpointUnlockArgs *))                                                      \
    X(cuModuleLoadData, (CUmodule *, const void *))                                                                    \
    X(cuModuleGetFunction, (CUfunction *, CUmodule, const char *))                                                     \
    X(cuModuleUnload, (CUmodule))                                                                                      \
    X(cuLaunchKernel, (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, \
                       unsigned int, CUstream, void **, void **))                                                      \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                                                          \
    X(cuMemFree_v2, (CUdeviceptr))

#define DECL(name, args) static CUresult(*p_##name) args;
FNS(DECL)

int gs_open(const char *path, char *err, size_t errlen) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, errlen, "dlopen %s: %s", path, dlerror());
        return -1;
    }
#define RESOLVE(name, args)                                                                                            \
    *(void **)&p_##name = dlsym(h, #name);                                                                             \
    if (!p_##name) {                                                                                                   \
        snprintf(err, errlen, "%s: no symbol %s", path, #name);                                                        \
        dlclose(h);                                                                                                    \
        return -1;                                                                                                     \
    }
    FNS(RESOLVE)
    return 0;
}

CUresult gs_cuInit(unsigned int flags) { return p_cuInit(flags); }
CUresult gs_cuDriverGetVersion(int *v) { return p_cuDriverGetVersion(v); }
CUresult gs_cuDeviceGetCount(int *n) { return p_cuDeviceGetCount(n); }
CUresult gs_cuDeviceGet(CUdevice *d, int ordinal) { return p_cuDeviceGet(d, ordinal); }
CUresult gs_cuDeviceGetName(char *name, int len, CUdevice d) { return p_cuDeviceGetName(name, len, d); }
CUresult gs_cuDeviceGetPCIBusId(char *bus, int len, CUdevice d) { return p_cuDeviceGetPCIBusId(bus, len, d); }
CUresult gs_cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return p_cuDeviceGetUuid_v2(u, d); }
CUresult gs_cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { return p_cuDeviceTotalMem_v2(bytes, d); }
CUresult gs_cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) { return p_cuDevicePrimaryCtxRetain(ctx, d); }
CUresult gs_cuDevicePrimaryCtxRelease_v2(CUdevice d) { return p_cuDevicePrimaryCtxRelease_v2(d); }
CUresult gs_cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int f) { return p_cuDevicePrimaryCtxSetFlags_v2(d, f); }
CUresult gs_cuCtxSetCurrent(CUcontext ctx) { return p_cuCtxSetCurrent(ctx); }
CUresult gs_cuMemGetInfo_v2(size_t *free_, size_t *total) { return p_cuMemGetInfo_v2(free_, total); }
CUresult gs_cuMemRelease(CUmemGenericAllocationHandle h) { return p_cuMemRelease(h); }

static CUmemAllocationProp prop_for(int dev) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

CUresult gs_granularity(size_t *g, int dev) {
    CUmemAllocationProp p = prop_for(dev);
    return p_cuMemGetAllocationGranularity(g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

CUresult gs_create(CUmemGenericAllocationHandle *h, size_t size, int dev, int gpu_direct_rdma, int host) {
    CUmemAllocationProp p = prop_for(dev);
    p.allocFlags.gpuDirectRDMACapable = gpu_direct_rdma ? 1 : 0;
    if (host) {
        /* pinned host memory on the device's own host NUMA node (as NCCL asks for its host buffers) */
        int node = 0;
        CUresult r = p_cuDeviceGetAttribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
        if (r != CUDA_SUCCESS)
            return r;
        p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        p.location.id = node < 0 ? 0 : node;
    }
    return p_cuMemCreate(h, size, &p, 0);
}

CUresult gs_export_fd(int *fd, CUmemGenericAllocationHandle h) {
    *fd = -1;
    return p_cuMemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
}

const char *gs_error_name(CUresult r) {
    const char *s = NULL;
    if (!p_cuGetErrorName || p_cuGetErrorName(r, &s) != CUDA_SUCCESS)
        return NULL;
    return s;
}

/* Reserve, map and open for read/write: the helper's own view of h. */
CUresult gs_map(CUdeviceptr *va, CUmemGenericAllocationHandle h, size_t size, size_t align, int dev) {
    CUresult r = p_cuMemAddressReserve(va, size, align, 0, 0);
    if (r != CUDA_SUCCESS)
        return r;
    r = p_cuMemMap(*va, size, 0, h, 0);
    if (r == CUDA_SUCCESS) {
        CUmemAccessDesc d;
        memset(&d, 0, sizeof d);
        d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        d.location.id = dev;
        d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = p_cuMemSetAccess(*va, size, &d, 1);
        if (r != CUDA_SUCCESS)
            p_cuMemUnmap(*va, size);
    }
    if (r != CUDA_SUCCESS) {
        p_cuMemAddressFree(*va, size);
        *va = 0;
    }
    return r;
}

CUresult gs_unmap(CUdeviceptr va, size_t size) {
    CUresult r = p_cuMemUnmap(va, size);
    CUresult f = p_cuMemAddressFree(va, size);
    return r != CUDA_SUCCESS ? r : f;
}

CUresult gs_host_alloc(void **p, size_t size) { return p_cuMemHostAlloc(p, size, CU_MEMHOSTALLOC_PORTABLE); }
CUresult gs_host_free(void *p) { return p_cuMemFreeHost(p); }
CUresult gs_stream_create(CUstream *s) { return p_cuStreamCreate(s, CU_STREAM_NON_BLOCKING); }
CUresult gs_stream_destroy(CUstream s) { return p_cuStreamDestroy_v2(s); }

/* One copy on stream s, waited for. */
CUresult gs_dtoh(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    CUresult r = p_cuMemcpyDtoHAsync_v2(dst, src, n, s);
    return r != CUDA_SUCCESS ? r : p_cuStreamSynchronize(s);
}
CUresult gs_htod(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    CUresult r = p_cuMemcpyHtoDAsync_v2(dst, src, n, s);
    return r != CUDA_SUCCESS ? r : p_cuStreamSynchronize(s);
}
CUresult gs_dtoh_async(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    return p_cuMemcpyDtoHAsync_v2(dst, src, n, s);
}
CUresult gs_htod_async(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return p_cuMemcpyHtoDAsync_v2(dst, src, n, s);
}
CUresult gs_dtod_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return p_cuMemcpyDtoDAsync_v2(dst, src, n, s);
}
CUresult gs_stream_sync(CUstream s) { return p_cuStreamSynchronize(s); }

CUresult gs_ckpt_state(int pid, int *state) {
    CUprocessState s = CU_PROCESS_STATE_FAILED;
    CUresult r = p_cuCheckpointProcessGetState(pid, &s);
    *state = (int)s;
    return r;
}
CUresult gs_ckpt_lock(int pid, unsigned timeout_ms) {
    CUcheckpointLockArgs a;
    memset(&a, 0, sizeof a);
    a.timeoutMs = timeout_ms;
    return p_cuCheckpointProcessLock(pid, &a);
}
CUresult gs_ckpt_checkpoint(int pid) {
    CUcheckpointCheckpointArgs a;
    memset(&a, 0, sizeof a);
    return p_cuCheckpointProcessCheckpoint(pid, &a);
}
CUresult gs_ckpt_restore(int pid, const unsigned char *pairs, unsigned npairs) {
    CUcheckpointRestoreArgs a;
    memset(&a, 0, sizeof a);
    CUcheckpointGpuPair gp[GS_MAX_GPU_PAIRS];
    if (npairs > GS_MAX_GPU_PAIRS)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < npairs; i++) {
        memcpy(gp[i].oldUuid.bytes, pairs + 32 * i, 16);
        memcpy(gp[i].newUuid.bytes, pairs + 32 * i + 16, 16);
    }
    if (npairs) {
        a.gpuPairs = gp;
        a.gpuPairsCount = npairs;
    }
    return p_cuCheckpointProcessRestore(pid, &a);
}
CUresult gs_ckpt_unlock(int pid) {
    CUcheckpointUnlockArgs a;
    memset(&a, 0, sizeof a);
    return p_cuCheckpointProcessUnlock(pid, &a);
}

/* ---- gpucr's own kernels (ptx/kernels.ptx) ---- */

CUresult gs_module_load(CUmodule *m, const char *ptx) { return p_cuModuleLoadData(m, ptx); }
CUresult gs_module_unload(CUmodule m) { return p_cuModuleUnload(m); }
CUresult gs_module_function(CUfunction *f, CUmodule m, const char *name) { return p_cuModuleGetFunction(f, m, name); }
CUresult gs_mem_alloc(CUdeviceptr *p, size_t size) { return p_cuMemAlloc_v2(p, size); }
CUresult gs_mem_free(CUdeviceptr p) { return p_cuMemFree_v2(p); }

/* Three u64 parameters, grid x blocks of block threads, on stream s. */
CUresult gs_launch3(CUfunction f, unsigned grid, unsigned block, CUstream s, uint64_t a, uint64_t b, uint64_t c) {
    void *params[3] = {&a, &b, &c};
    return p_cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, params, NULL);
}

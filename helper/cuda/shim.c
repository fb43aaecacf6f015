#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

#define FNS(X)                                                                  \
    X(cuInit, (unsigned int))                                                   \
    X(cuDriverGetVersion, (int *))                                              \
    X(cuDeviceGetCount, (int *))                                                \
    X(cuDeviceGet, (CUdevice *, int))                                           \
    X(cuDeviceGetName, (char *, int, CUdevice))                                 \
    X(cuDeviceGetUuid_v2, (CUuuid *, CUdevice))                                 \
    X(cuDeviceTotalMem_v2, (size_t *, CUdevice))                                \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                        \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice))                                 \
    X(cuCtxSetCurrent, (CUcontext))                                             \
    X(cuMemGetAllocationGranularity,                                            \
      (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags)) \
    X(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
    X(cuMemExportToShareableHandle,                                             \
      (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long)) \
    X(cuMemRelease, (CUmemGenericAllocationHandle))                             \
    X(cuMemGetInfo_v2, (size_t *, size_t *))                                    \
    X(cuGetErrorName, (CUresult, const char **))

#define DECL(name, args) static CUresult(*p_##name) args;
FNS(DECL)

int gs_open(const char *path, char *err, size_t errlen) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, errlen, "dlopen %s: %s", path, dlerror());
        return -1;
    }
#define RESOLVE(name, args)                                                     \
    *(void **)&p_##name = dlsym(h, #name);                                      \
    if (!p_##name) {                                                            \
        snprintf(err, errlen, "%s: no symbol %s", path, #name);                 \
        dlclose(h);                                                             \
        return -1;                                                              \
    }
    FNS(RESOLVE)
    return 0;
}

CUresult gs_cuInit(unsigned int flags) { return p_cuInit(flags); }
CUresult gs_cuDriverGetVersion(int *v) { return p_cuDriverGetVersion(v); }
CUresult gs_cuDeviceGetCount(int *n) { return p_cuDeviceGetCount(n); }
CUresult gs_cuDeviceGet(CUdevice *d, int ordinal) { return p_cuDeviceGet(d, ordinal); }
CUresult gs_cuDeviceGetName(char *name, int len, CUdevice d) { return p_cuDeviceGetName(name, len, d); }
CUresult gs_cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return p_cuDeviceGetUuid_v2(u, d); }
CUresult gs_cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { return p_cuDeviceTotalMem_v2(bytes, d); }
CUresult gs_cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) { return p_cuDevicePrimaryCtxRetain(ctx, d); }
CUresult gs_cuDevicePrimaryCtxRelease_v2(CUdevice d) { return p_cuDevicePrimaryCtxRelease_v2(d); }
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

CUresult gs_create(CUmemGenericAllocationHandle *h, size_t size, int dev) {
    CUmemAllocationProp p = prop_for(dev);
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

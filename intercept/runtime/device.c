/*
 * Devices, versions, properties, the driver's entry points, limits.
 */
#include <stdio.h>
#include <string.h>

#include "rt.h"

RT_API cudaError_t cudaGetDeviceCount(int *count) {
    if (!count)
        return rt_ret(cudaErrorInvalidValue);
    *count = 0;
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_ret(e);
    return rt_ret(DRV(DeviceGetCount, (count)));
}

RT_API cudaError_t cudaGetDevice(int *device) {
    if (!device)
        return rt_ret(cudaErrorInvalidValue);
    *device = rt_device();
    return cudaSuccess;
}

RT_API cudaError_t cudaSetDevice(int device) { return rt_ret(rt_set_device(device)); }

RT_API cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (!value)
        return rt_ret(cudaErrorInvalidValue);
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_ret(e);
    CUdevice d;
    e = DRV(DeviceGet, (&d, device));
    if (e == (cudaError_t)CUDA_ERROR_INVALID_DEVICE || e == cudaErrorInvalidValue)
        return rt_ret(cudaErrorInvalidDevice);
    if (e == cudaSuccess)
        e = DRV(DeviceGetAttribute, (value, (int)attr, d));
    return rt_ret(e);
}

/* One int field of cudaDeviceProp from one device attribute (the same numbers as CUdevice_attribute). */
static void attr(CUdevice d, int *field, int a) {
    int v = 0;
    if (rt_drv.DeviceGetAttribute && rt_drv.DeviceGetAttribute(&v, a, d) == CUDA_SUCCESS)
        *field = v;
}

RT_API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (!prop)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUdevice d;
    cudaError_t e = DRV(DeviceGet, (&d, device));
    if (e != cudaSuccess)
        return rt_ret(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    if ((e = DRV(DeviceGetName, (prop->name, (int)sizeof prop->name, d))) != cudaSuccess)
        return rt_ret(e);
    DRV(DeviceGetUuid, (&prop->uuid, d));
    DRV(DeviceTotalMem, (&prop->totalGlobalMem, d));
    int v;
    static const struct {
        size_t off;
        int attr;
    } ints[] = {
        {offsetof(struct cudaDeviceProp, regsPerBlock), 12},
        {offsetof(struct cudaDeviceProp, warpSize), 10},
        {offsetof(struct cudaDeviceProp, maxThreadsPerBlock), 1},
        {offsetof(struct cudaDeviceProp, maxThreadsDim[0]), 2},
        {offsetof(struct cudaDeviceProp, maxThreadsDim[1]), 3},
        {offsetof(struct cudaDeviceProp, maxThreadsDim[2]), 4},
        {offsetof(struct cudaDeviceProp, maxGridSize[0]), 5},
        {offsetof(struct cudaDeviceProp, maxGridSize[1]), 6},
        {offsetof(struct cudaDeviceProp, maxGridSize[2]), 7},
        {offsetof(struct cudaDeviceProp, major), 75},
        {offsetof(struct cudaDeviceProp, minor), 76},
        {offsetof(struct cudaDeviceProp, multiProcessorCount), 16},
        {offsetof(struct cudaDeviceProp, integrated), 18},
        {offsetof(struct cudaDeviceProp, canMapHostMemory), 19},
        {offsetof(struct cudaDeviceProp, concurrentKernels), 31},
        {offsetof(struct cudaDeviceProp, ECCEnabled), 32},
        {offsetof(struct cudaDeviceProp, pciBusID), 33},
        {offsetof(struct cudaDeviceProp, pciDeviceID), 34},
        {offsetof(struct cudaDeviceProp, pciDomainID), 50},
        {offsetof(struct cudaDeviceProp, tccDriver), 35},
        {offsetof(struct cudaDeviceProp, asyncEngineCount), 40},
        {offsetof(struct cudaDeviceProp, unifiedAddressing), 41},
        {offsetof(struct cudaDeviceProp, memoryBusWidth), 37},
        {offsetof(struct cudaDeviceProp, l2CacheSize), 38},
        {offsetof(struct cudaDeviceProp, persistingL2CacheMaxSize), 108},
        {offsetof(struct cudaDeviceProp, maxThreadsPerMultiProcessor), 39},
        {offsetof(struct cudaDeviceProp, streamPrioritiesSupported), 78},
        {offsetof(struct cudaDeviceProp, globalL1CacheSupported), 79},
        {offsetof(struct cudaDeviceProp, localL1CacheSupported), 80},
        {offsetof(struct cudaDeviceProp, regsPerMultiprocessor), 82},
        {offsetof(struct cudaDeviceProp, managedMemory), 83},
        {offsetof(struct cudaDeviceProp, isMultiGpuBoard), 84},
        {offsetof(struct cudaDeviceProp, multiGpuBoardGroupID), 85},
        {offsetof(struct cudaDeviceProp, hostNativeAtomicSupported), 86},
        {offsetof(struct cudaDeviceProp, pageableMemoryAccess), 88},
        {offsetof(struct cudaDeviceProp, concurrentManagedAccess), 89},
        {offsetof(struct cudaDeviceProp, computePreemptionSupported), 90},
        {offsetof(struct cudaDeviceProp, canUseHostPointerForRegisteredMem), 91},
        {offsetof(struct cudaDeviceProp, cooperativeLaunch), 95},
        {offsetof(struct cudaDeviceProp, pageableMemoryAccessUsesHostPageTables), 100},
        {offsetof(struct cudaDeviceProp, directManagedMemAccessFromHost), 101},
        {offsetof(struct cudaDeviceProp, maxBlocksPerMultiProcessor), 106},
        {offsetof(struct cudaDeviceProp, accessPolicyMaxWindowSize), 109},
        {offsetof(struct cudaDeviceProp, hostRegisterSupported), 99},
        {offsetof(struct cudaDeviceProp, sparseCudaArraySupported), 112},
        {offsetof(struct cudaDeviceProp, hostRegisterReadOnlySupported), 113},
        {offsetof(struct cudaDeviceProp, timelineSemaphoreInteropSupported), 114},
        {offsetof(struct cudaDeviceProp, memoryPoolsSupported), 115},
        {offsetof(struct cudaDeviceProp, gpuDirectRDMASupported), 116},
        {offsetof(struct cudaDeviceProp, gpuDirectRDMAWritesOrdering), 118},
        {offsetof(struct cudaDeviceProp, deferredMappingCudaArraySupported), 121},
        {offsetof(struct cudaDeviceProp, ipcEventSupported), 125},
        {offsetof(struct cudaDeviceProp, clusterLaunch), 120},
        {offsetof(struct cudaDeviceProp, deviceNumaConfig), 130},
        {offsetof(struct cudaDeviceProp, deviceNumaId), 131},
        {offsetof(struct cudaDeviceProp, mpsEnabled), 133},
        {offsetof(struct cudaDeviceProp, hostNumaId), 134},
        {offsetof(struct cudaDeviceProp, hostNumaMultinodeIpcSupported), 143},
        {offsetof(struct cudaDeviceProp, maxTexture1D), 21},
        {offsetof(struct cudaDeviceProp, maxTexture2D[0]), 22},
        {offsetof(struct cudaDeviceProp, maxTexture2D[1]), 23},
        {offsetof(struct cudaDeviceProp, maxTexture3D[0]), 24},
        {offsetof(struct cudaDeviceProp, maxTexture3D[1]), 25},
        {offsetof(struct cudaDeviceProp, maxTexture3D[2]), 26},
        {offsetof(struct cudaDeviceProp, maxSurface1D), 55},
        {offsetof(struct cudaDeviceProp, maxSurface2D[0]), 56},
        {offsetof(struct cudaDeviceProp, maxSurface2D[1]), 57},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        attr(d, (int *)((char *)prop + ints[i].off), ints[i].attr);
    /* the size_t fields, from int attributes */
    static const struct {
        size_t off;
        int attr;
    } sizes[] = {
        {offsetof(struct cudaDeviceProp, sharedMemPerBlock), 8},
        {offsetof(struct cudaDeviceProp, memPitch), 11},
        {offsetof(struct cudaDeviceProp, totalConstMem), 9},
        {offsetof(struct cudaDeviceProp, textureAlignment), 14},
        {offsetof(struct cudaDeviceProp, texturePitchAlignment), 51},
        {offsetof(struct cudaDeviceProp, surfaceAlignment), 30},
        {offsetof(struct cudaDeviceProp, sharedMemPerMultiprocessor), 81},
        {offsetof(struct cudaDeviceProp, sharedMemPerBlockOptin), 97},
        {offsetof(struct cudaDeviceProp, reservedSharedMemPerBlock), 111},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        v = 0;
        attr(d, &v, sizes[i].attr);
        size_t s = (size_t)(unsigned)v;
        memcpy((char *)prop + sizes[i].off, &s, sizeof s);
    }
    v = 0;
    attr(d, &v, 117);
    prop->gpuDirectRDMAFlushWritesOptions = (unsigned)v;
    v = 0;
    attr(d, &v, 119);
    prop->memoryPoolSupportedHandleTypes = (unsigned)v;
    v = 0;
    attr(d, &v, 139);
    prop->gpuPciDeviceID = (unsigned)v;
    v = 0;
    attr(d, &v, 140);
    prop->gpuPciSubsystemID = (unsigned)v;
    return cudaSuccess;
}

/* CUDA 12's name for it, which programs built then still link against. */
RT_API cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device);
RT_API cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device) {
    return cudaGetDeviceProperties(prop, device);
}

RT_API cudaError_t cudaDeviceSynchronize(void) {
    CTX();
    return rt_ret(DRV(CtxSynchronize, ()));
}

RT_API cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    CTX();
    int l = 0, g = 0;
    cudaError_t e = DRV(CtxGetStreamPriorityRange, (&l, &g));
    if (e != cudaSuccess)
        return rt_ret(e);
    if (leastPriority)
        *leastPriority = l;
    if (greatestPriority)
        *greatestPriority = g;
    return cudaSuccess;
}

RT_API cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
    if (!pciBusId || len <= 0)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUdevice d;
    cudaError_t e = DRV(DeviceGet, (&d, device));
    if (e != cudaSuccess)
        return rt_ret(cudaErrorInvalidDevice);
    return rt_ret(DRV(DeviceGetPCIBusId, (pciBusId, len, d)));
}

RT_API cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice) {
    if (!canAccessPeer)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUdevice a, b;
    if (DRV(DeviceGet, (&a, device)) != cudaSuccess || DRV(DeviceGet, (&b, peerDevice)) != cudaSuccess)
        return rt_ret(cudaErrorInvalidDevice);
    if (device == peerDevice) {
        *canAccessPeer = 0;
        return cudaSuccess;
    }
    return rt_ret(DRV(DeviceCanAccessPeer, (canAccessPeer, a, b)));
}

RT_API cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
    (void)peerDevice;
    (void)flags;
    RT_REFUSE("peer access between GPUs is not provided by gpucr's runtime");
}

RT_API cudaError_t cudaDeviceSetLimit(enum cudaLimit limit, size_t value) {
    CTX();
    return rt_ret(DRV(CtxSetLimit, ((int)limit, value)));
}

RT_API cudaError_t cudaDeviceGetLimit(size_t *pValue, enum cudaLimit limit) {
    if (!pValue)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(CtxGetLimit, (pValue, (int)limit)));
}

RT_API cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
    if (!free || !total)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(MemGetInfo, (free, total)));
}

RT_API cudaError_t cudaDriverGetVersion(int *driverVersion) {
    if (!driverVersion)
        return rt_ret(cudaErrorInvalidValue);
    /* answered without a context, as NVIDIA's runtime does: a program asks before it uses the GPU */
    *driverVersion = 0;
    rt_served(); /* the table */
    cudaError_t e = DRV(DriverGetVersion, (driverVersion));
    return rt_ret(e);
}

RT_API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
    if (!runtimeVersion)
        return rt_ret(cudaErrorInvalidValue);
    *runtimeVersion = GPUCR_CUDART_VERSION;
    return cudaSuccess;
}

RT_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                    unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *driverStatus) {
    if (!symbol || !funcPtr)
        return rt_ret(cudaErrorInvalidValue);
    rt_served(); /* the table; cuGetProcAddress needs no cuInit */
    /* the runtime's flags and query results are the driver's numbers */
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = cuGetProcAddress_v2(symbol, funcPtr, (int)cudaVersion, flags, &st);
    if (driverStatus)
        *driverStatus = (enum cudaDriverEntryPointQueryResult)st;
    return rt_ret((cudaError_t)r);
}

RT_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                           enum cudaDriverEntryPointQueryResult *driverStatus) {
    return cudaGetDriverEntryPointByVersion(symbol, funcPtr, GPUCR_CUDART_VERSION, flags, driverStatus);
}

RT_API cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
RT_API cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

RT_API cudaError_t cudaThreadSynchronize(void);
RT_API cudaError_t cudaThreadSynchronize(void) { return cudaDeviceSynchronize(); }

/* The runtime's reset tears the primary context down; here the work is finished and the context kept (what
 * programs call it for at exit), since a served process's context belongs to its worker. */
RT_API cudaError_t cudaDeviceReset(void);
RT_API cudaError_t cudaDeviceReset(void) { return cudaDeviceSynchronize(); }

/* cudaDeviceSchedule* and cudaDeviceMapHost: the primary context's flags (cudaDeviceMapHost is always on). */
#define RT_DEVICE_MAP_HOST 0x08
RT_API cudaError_t cudaSetDeviceFlags(unsigned int flags);
RT_API cudaError_t cudaSetDeviceFlags(unsigned int flags) {
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_ret(e);
    CUdevice d;
    if ((e = DRV(DeviceGet, (&d, rt_device()))) != cudaSuccess)
        return rt_ret(e);
    return rt_ret(DRV(DevicePrimaryCtxSetFlags, (d, flags & ~(unsigned)RT_DEVICE_MAP_HOST)));
}

RT_API cudaError_t cudaGetDeviceFlags(unsigned int *flags);
RT_API cudaError_t cudaGetDeviceFlags(unsigned int *flags) {
    if (!flags)
        return rt_ret(cudaErrorInvalidValue);
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_ret(e);
    CUdevice d;
    unsigned f = 0;
    int active = 0;
    if ((e = DRV(DeviceGet, (&d, rt_device()))) == cudaSuccess)
        e = DRV(DevicePrimaryCtxGetState, (d, &f, &active));
    if (e == cudaSuccess)
        *flags = f | RT_DEVICE_MAP_HOST;
    return rt_ret(e);
}

RT_API cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags);
RT_API cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags) {
    (void)deviceFlags;
    (void)flags;
    int cur = rt_device();
    cudaError_t e = rt_set_device(device);
    if (e == cudaSuccess && cur != device)
        e = rt_set_device(cur);
    return rt_ret(e);
}

/*
 * Served mode's runtime library (libcudart.so.13 of build/lib/served): the CUDA
 * runtime API, made of the documented driver API. In served mode the driver is
 * the served library (build/lib/served/libcuda.so.1), which forwards to the
 * worker; the runtime so needs none of the driver's private export tables,
 * which NVIDIA's runtime reads and a served process cannot answer
 * (docs/served-mode.md). The library runs on any libcuda.so.1: the simulated
 * driver in CI, the real one on the GPU machine.
 *
 *   driver.c    the driver's entry points (through cuGetProcAddress, so the
 *               interposer's wrap what it wraps), the context each thread
 *               uses, the last error, error names
 *   registry.c  what nvcc's host code registers: fat binaries, kernels,
 *               variables; a fat binary is loaded when one of its kernels or
 *               variables is first used
 *   device.c    devices, versions, properties, entry points, limits
 *   memory.c    allocations, copies, memsets, host memory, symbols
 *   exec.c      streams, events, launches, function attributes, graphs
 *   unsupported.c  the functions programs link against that served mode
 *               does not provide: each fails, naming itself, once
 */
#ifndef GPUCR_RT_H
#define GPUCR_RT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpucr/cudart.h"

#define RT_API __attribute__((visibility("default")))
#define RT_HIDDEN __attribute__((visibility("hidden")))

/* ---- driver.c ---- */

/*
 * The driver's entry points the runtime calls, by their base names, resolved as of CUDA 12.0 (driver.c says
 * why), with that version's signatures. One that the driver does not have stays NULL, and a runtime function
 * that needs it fails with cudaErrorNotSupported, naming it.
 */
#define RT_DRIVER(X)                                                                                                   \
    X(Init, "cuInit", (unsigned int))                                                                                  \
    X(DriverGetVersion, "cuDriverGetVersion", (int *))                                                                 \
    X(DeviceGetCount, "cuDeviceGetCount", (int *))                                                                     \
    X(DeviceGet, "cuDeviceGet", (CUdevice *, int))                                                                     \
    X(DeviceGetAttribute, "cuDeviceGetAttribute", (int *, int, CUdevice))                                              \
    X(DeviceGetName, "cuDeviceGetName", (char *, int, CUdevice))                                                       \
    X(DeviceGetUuid, "cuDeviceGetUuid", (CUuuid *, CUdevice))                                                          \
    X(DeviceTotalMem, "cuDeviceTotalMem", (size_t *, CUdevice))                                                        \
    X(DeviceGetPCIBusId, "cuDeviceGetPCIBusId", (char *, int, CUdevice))                                               \
    X(DeviceCanAccessPeer, "cuDeviceCanAccessPeer", (int *, CUdevice, CUdevice))                                       \
    X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext *, CUdevice))                                     \
    X(CtxGetCurrent, "cuCtxGetCurrent", (CUcontext *))                                                                 \
    X(CtxSetCurrent, "cuCtxSetCurrent", (CUcontext))                                                                   \
    X(CtxGetDevice, "cuCtxGetDevice", (CUdevice *))                                                                    \
    X(CtxSynchronize, "cuCtxSynchronize", (void))                                                                      \
    X(CtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange", (int *, int *))                                        \
    X(CtxSetLimit, "cuCtxSetLimit", (int, size_t))                                                                     \
    X(CtxGetLimit, "cuCtxGetLimit", (size_t *, int))                                                                   \
    X(GetErrorName, "cuGetErrorName", (CUresult, const char **))                                                       \
    X(GetErrorString, "cuGetErrorString", (CUresult, const char **))                                                   \
    X(MemAlloc, "cuMemAlloc", (CUdeviceptr *, size_t))                                                                 \
    X(MemFree, "cuMemFree", (CUdeviceptr))                                                                             \
    X(MemAllocAsync, "cuMemAllocAsync", (CUdeviceptr *, size_t, CUstream))                                             \
    X(MemFreeAsync, "cuMemFreeAsync", (CUdeviceptr, CUstream))                                                         \
    X(MemGetInfo, "cuMemGetInfo", (size_t *, size_t *))                                                                \
    X(MemGetAddressRange, "cuMemGetAddressRange", (CUdeviceptr *, size_t *, CUdeviceptr))                              \
    X(MemHostAlloc, "cuMemHostAlloc", (void **, size_t, unsigned int))                                                 \
    X(MemFreeHost, "cuMemFreeHost", (void *))                                                                          \
    X(MemHostRegister, "cuMemHostRegister", (void *, size_t, unsigned int))                                            \
    X(MemHostUnregister, "cuMemHostUnregister", (void *))                                                              \
    X(MemcpyHtoD, "cuMemcpyHtoD", (CUdeviceptr, const void *, size_t))                                                 \
    X(MemcpyDtoH, "cuMemcpyDtoH", (void *, CUdeviceptr, size_t))                                                       \
    X(MemcpyDtoD, "cuMemcpyDtoD", (CUdeviceptr, CUdeviceptr, size_t))                                                  \
    X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync", (CUdeviceptr, const void *, size_t, CUstream))                             \
    X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync", (void *, CUdeviceptr, size_t, CUstream))                                   \
    X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync", (CUdeviceptr, CUdeviceptr, size_t, CUstream))                              \
    X(MemsetD8, "cuMemsetD8", (CUdeviceptr, unsigned char, size_t))                                                    \
    X(MemsetD8Async, "cuMemsetD8Async", (CUdeviceptr, unsigned char, size_t, CUstream))                                \
    X(PointerGetAttributes, "cuPointerGetAttributes", (unsigned int, int *, void **, CUdeviceptr))                     \
    X(StreamCreate, "cuStreamCreate", (CUstream *, unsigned int))                                                      \
    X(StreamCreateWithPriority, "cuStreamCreateWithPriority", (CUstream *, unsigned int, int))                         \
    X(StreamDestroy, "cuStreamDestroy", (CUstream))                                                                    \
    X(StreamSynchronize, "cuStreamSynchronize", (CUstream))                                                            \
    X(StreamQuery, "cuStreamQuery", (CUstream))                                                                        \
    X(StreamWaitEvent, "cuStreamWaitEvent", (CUstream, CUevent, unsigned int))                                         \
    X(StreamGetPriority, "cuStreamGetPriority", (CUstream, int *))                                                     \
    X(StreamGetFlags, "cuStreamGetFlags", (CUstream, unsigned int *))                                                  \
    X(LaunchHostFunc, "cuLaunchHostFunc", (CUstream, CUhostFn, void *))                                                \
    X(EventCreate, "cuEventCreate", (CUevent *, unsigned int))                                                         \
    X(EventDestroy, "cuEventDestroy", (CUevent))                                                                       \
    X(EventRecord, "cuEventRecord", (CUevent, CUstream))                                                               \
    X(EventRecordWithFlags, "cuEventRecordWithFlags", (CUevent, CUstream, unsigned int))                               \
    X(EventQuery, "cuEventQuery", (CUevent))                                                                           \
    X(EventSynchronize, "cuEventSynchronize", (CUevent))                                                               \
    X(EventElapsedTime, "cuEventElapsedTime", (float *, CUevent, CUevent))                                             \
    X(LibraryLoadData, "cuLibraryLoadData",                                                                            \
      (CUlibrary *, const void *, CUjit_option *, void **, unsigned int, CUlibraryOption *, void **, unsigned int))    \
    X(LibraryGetKernel, "cuLibraryGetKernel", (CUkernel *, CUlibrary, const char *))                                   \
    X(LibraryGetGlobal, "cuLibraryGetGlobal", (CUdeviceptr *, size_t *, CUlibrary, const char *))                      \
    X(KernelGetFunction, "cuKernelGetFunction", (CUfunction *, CUkernel))                                              \
    X(FuncGetAttribute, "cuFuncGetAttribute", (int *, int, CUfunction))                                                \
    X(FuncSetAttribute, "cuFuncSetAttribute", (CUfunction, int, int))                                                  \
    X(FuncSetCacheConfig, "cuFuncSetCacheConfig", (CUfunction, int))                                                   \
    X(OccupancyMaxActiveBlocksPerMultiprocessorWithFlags, "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",      \
      (int *, CUfunction, int, size_t, unsigned int))                                                                  \
    X(LaunchKernel, "cuLaunchKernel",                                                                                  \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,   \
       CUstream, void **, void **))                                                                                    \
    X(LaunchKernelEx, "cuLaunchKernelEx", (const CUlaunchConfig *, CUfunction, void **, void **))                      \
    X(StreamBeginCapture, "cuStreamBeginCapture", (CUstream, CUstreamCaptureMode))                                     \
    X(StreamEndCapture, "cuStreamEndCapture", (CUstream, CUgraph *))                                                   \
    X(StreamIsCapturing, "cuStreamIsCapturing", (CUstream, CUstreamCaptureStatus *))                                   \
    X(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", (CUstreamCaptureMode *))                   \
    X(GraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", (CUgraphExec *, CUgraph, unsigned long long))          \
    X(GraphLaunch, "cuGraphLaunch", (CUgraphExec, CUstream))                                                           \
    X(GraphExecDestroy, "cuGraphExecDestroy", (CUgraphExec))                                                           \
    X(GraphDestroy, "cuGraphDestroy", (CUgraph))                                                                       \
    X(GraphGetNodes, "cuGraphGetNodes", (CUgraph, CUgraphNode *, size_t *))                                            \
    X(MemAllocPitch, "cuMemAllocPitch", (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))                       \
    X(DevicePrimaryCtxSetFlags, "cuDevicePrimaryCtxSetFlags", (CUdevice, unsigned int))                                \
    X(DevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", (CUdevice, unsigned int *, int *))

#define RT_FIELD(field, name, params) CUresult(*field) params;
struct rt_driver {
    RT_DRIVER(RT_FIELD)
    /* its _v2, without edge data (which the runtime does not ask for) */
    CUresult (*StreamGetCaptureInfo)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *, const CUgraphNode **,
                                     size_t *);
};
#undef RT_FIELD
RT_HIDDEN extern struct rt_driver rt_drv;

/* The runtime's error for a driver entry point this driver lacks (printed once per name). */
RT_HIDDEN cudaError_t rt_missing(const char *name);
/* A driver call through the table: cudaErrorNotSupported, naming it, if the driver lacks it. The driver's
 * errors keep their numbers in the runtime (cudart.h). */
#define DRV(field, args) (rt_drv.field ? (cudaError_t)rt_drv.field args : rt_missing(#field))

/* The first call's work (the table, cuInit, the devices), once; its result every time after. */
RT_HIDDEN cudaError_t rt_init(void);
/* The first call's work (the table, cuInit), once; then the calling thread's context: the one current on it, or
 * the primary context of its device (cudaSetDevice's, else 0), made current. */
RT_HIDDEN cudaError_t rt_ctx(void);
/* The start of a runtime function that needs the thread's context: made current first, and a failure recorded. */
#define CTX()                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = rt_ctx();                                                                                     \
        if (e_ != cudaSuccess)                                                                                         \
            return rt_ret(e_);                                                                                         \
    } while (0)
/* The device the calling thread uses (its cudaSetDevice, else 0), and setting it. */
RT_HIDDEN int rt_device(void);
RT_HIDDEN cudaError_t rt_set_device(int device);
/* Served mode: the driver is served mode's library (the pinned host memory it refuses is plain memory here). */
RT_HIDDEN bool rt_served(void);

/* The calling thread's last error: every failing runtime call records its error (cudaErrorNotReady is an answer,
 * not a failure), and cudaGetLastError takes it. rt_ret records e and returns it. */
RT_HIDDEN cudaError_t rt_ret(cudaError_t e);
/* A refusal: one line naming the function and why, the first time; then cudaErrorNotSupported, recorded. */
RT_HIDDEN cudaError_t rt_refuse(_Atomic int *once, const char *fn, const char *why);
#define RT_REFUSE(why)                                                                                                 \
    do {                                                                                                               \
        static _Atomic int once_;                                                                                      \
        return rt_refuse(&once_, __func__, why);                                                                       \
    } while (0)

/* ---- registry.c ---- */

/* The kernel a host function (a __global__ function's host stub) or a cudaKernel_t stands for, loaded on first
 * use: cudaErrorInvalidDeviceFunction for a pointer that names neither. */
RT_HIDDEN cudaError_t rt_function(const void *func, CUfunction *out);
/* The kernel a cudaKernel_t of this library's stands for (nvcc's launches: no lookup by host address). */
RT_HIDDEN cudaError_t rt_kernel(cudaKernel_t kernel, CUfunction *out);
/* A __device__ or __constant__ variable's device address and size, by its host shadow's address. */
RT_HIDDEN cudaError_t rt_symbol(const void *symbol, CUdeviceptr *dptr, size_t *size);

/* ---- memory.c ---- */

/* Where a pointer lives, for cudaMemcpyDefault: device memory is what the driver knows a range of. */
RT_HIDDEN bool rt_is_device(const void *p);

#endif

/*
 * What the served library answers itself (client.h): error names and
 * strings, cuGetProcAddress (which hands out this library's own entry
 * points), and the refusals: every entry point of gpucr/cudadrv.h that is
 * not forwarded still exists, fails with CUDA_ERROR_NOT_SUPPORTED and says
 * why once.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

void sv_warn(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpucr: %s\n", buf);
}

void sv_debug(const char *fmt, ...) {
    static int on = -1;
    if (on < 0) {
        const char *l = getenv("GPUCR_LOG");
        on = l && strcmp(l, "debug") == 0;
    }
    if (!on)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpucr: debug: %s\n", buf);
}

CUresult sv_refuse(_Atomic int *once, const char *fn, const char *why) {
    if (!atomic_exchange(once, 1))
        sv_warn("served mode: %s is not supported: %s (CUDA_ERROR_NOT_SUPPORTED)", fn, why);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- errors ---- */

typedef struct {
    CUresult code;
    const char *name, *text;
} err_ent;

#define E(code, text)                                                                                                  \
    { code, #code, text }

static const err_ent errs[] = {
    E(CUDA_SUCCESS, "no error"),
    E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    E(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    E(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable"),
    E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    E(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    E(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
    E(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
    E(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"),
    E(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device"),
    E(CUDA_ERROR_NOT_MAPPED, "resource not mapped"),
    E(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
    E(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid"),
    E(CUDA_ERROR_FILE_NOT_FOUND, "file not found"),
    E(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
    E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    E(CUDA_ERROR_NOT_READY, "device not ready"),
    E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    E(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    E(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped"),
    E(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region"),
    E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
    E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
      "operation would make the legacy stream depend on a capturing blocking stream"),
    E(CUDA_ERROR_TIMEOUT, "the operation timed out"),
    E(CUDA_ERROR_UNKNOWN, "unknown error"),
};

static const err_ent *err_find(CUresult r) {
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
        if (errs[i].code == r)
            return &errs[i];
    return NULL;
}

SV_API CUresult cuGetErrorString(CUresult error, const char **pStr) {
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    const err_ent *e = err_find(error);
    *pStr = e ? e->text : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SV_API CUresult cuGetErrorName(CUresult error, const char **pStr) {
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    const err_ent *e = err_find(error);
    *pStr = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- refused: the driver's private tables and the checkpoint API ---- */

SV_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    if (!ppExportTable || !pExportTableId)
        return CUDA_ERROR_INVALID_VALUE;
    *ppExportTable = NULL;
    SV_REFUSE(
        "the driver's private export tables (the CUDA runtime's) are not forwarded; served mode forwards the "
        "documented driver API");
}

#define CKPT_WHY "the process holds no driver state in served mode: gpucr checkpoints it (gpucr checkpoint)"
SV_API CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
    (void)pid;
    (void)tid;
    SV_REFUSE(CKPT_WHY);
}
SV_API CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state) {
    (void)pid;
    (void)state;
    SV_REFUSE(CKPT_WHY);
}
SV_API CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
    (void)pid;
    (void)args;
    SV_REFUSE(CKPT_WHY);
}
SV_API CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args) {
    (void)pid;
    (void)args;
    SV_REFUSE(CKPT_WHY);
}
SV_API CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args) {
    (void)pid;
    (void)args;
    SV_REFUSE(CKPT_WHY);
}
SV_API CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args) {
    (void)pid;
    (void)args;
    SV_REFUSE(CKPT_WHY);
}

SV_API CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                          const CUgraphNode **deps, size_t *ndeps);
SV_API CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                          const CUgraphNode **deps, size_t *ndeps) {
    (void)h;
    (void)status;
    (void)id;
    (void)graph;
    (void)deps;
    (void)ndeps;
    SV_REFUSE("capture queries are not forwarded yet");
}

/* ---- cuGetProcAddress: this library's own entry points ---- */

#undef cuGetProcAddress
SV_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b);

typedef struct {
    const char *base; /* the name programs ask for */
    int version;      /* the CUDA version from which fn is what base means */
    void *fn;
} proc_ent;

#define P(base, sym, ver)                                                                                              \
    { base, ver, (void *)sym }

static const proc_ent procs[] = {
    P("cuInit", cuInit, 2000),
    P("cuDriverGetVersion", cuDriverGetVersion, 2020),
    P("cuGetErrorString", cuGetErrorString, 6000),
    P("cuGetErrorName", cuGetErrorName, 6000),
    P("cuGetProcAddress", cuGetProcAddress, 11030),
    P("cuGetProcAddress", cuGetProcAddress_v2, 12000),
    P("cuGetExportTable", cuGetExportTable, 3000),
    P("cuDeviceGetCount", cuDeviceGetCount, 2000),
    P("cuDeviceGet", cuDeviceGet, 2000),
    P("cuDeviceGetName", cuDeviceGetName, 2000),
    P("cuDeviceGetAttribute", cuDeviceGetAttribute, 2000),
    P("cuDeviceGetPCIBusId", cuDeviceGetPCIBusId, 4010),
    P("cuDeviceCanAccessPeer", cuDeviceCanAccessPeer, 4000),
    P("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020),
    P("cuDeviceGetUuid", cuDeviceGetUuid, 9020),
    P("cuDeviceGetUuid", cuDeviceGetUuid_v2, 11040),
    P("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, 7000),
    P("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000),
    P("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState, 7000),
    P("cuDevicePrimaryCtxSetFlags", cuDevicePrimaryCtxSetFlags_v2, 11000),
    P("cuCtxGetCurrent", cuCtxGetCurrent, 4000),
    P("cuCtxSetCurrent", cuCtxSetCurrent, 4000),
    P("cuCtxGetDevice", cuCtxGetDevice, 2000),
    P("cuCtxSynchronize", cuCtxSynchronize, 2000),
    P("cuMemAlloc", cuMemAlloc_v2, 3020),
    P("cuMemAllocPitch", cuMemAllocPitch_v2, 3020),
    P("cuMemFree", cuMemFree_v2, 3020),
    P("cuMemGetInfo", cuMemGetInfo_v2, 3020),
    P("cuMemGetAddressRange", cuMemGetAddressRange_v2, 3020),
    P("cuMemAllocAsync", cuMemAllocAsync, 11020),
    P("cuMemFreeAsync", cuMemFreeAsync, 11020),
    P("cuMemAllocHost", cuMemAllocHost_v2, 3020),
    P("cuMemHostAlloc", cuMemHostAlloc, 2020),
    P("cuMemFreeHost", cuMemFreeHost, 2000),
    P("cuMemHostRegister", cuMemHostRegister_v2, 6050),
    P("cuMemHostUnregister", cuMemHostUnregister, 4000),
    P("cuMemcpyHtoD", cuMemcpyHtoD_v2, 3020),
    P("cuMemcpyDtoH", cuMemcpyDtoH_v2, 3020),
    P("cuMemcpyDtoD", cuMemcpyDtoD_v2, 3020),
    P("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2, 3020),
    P("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2, 3020),
    P("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2, 3020),
    P("cuMemcpy", cuMemcpy, 4000),
    P("cuMemcpyAsync", cuMemcpyAsync, 4000),
    P("cuMemsetD8", cuMemsetD8_v2, 3020),
    P("cuMemsetD16", cuMemsetD16_v2, 3020),
    P("cuMemsetD32", cuMemsetD32_v2, 3020),
    P("cuMemsetD8Async", cuMemsetD8Async, 3020),
    P("cuMemsetD16Async", cuMemsetD16Async, 3020),
    P("cuMemsetD32Async", cuMemsetD32Async, 3020),
    P("cuStreamCreate", cuStreamCreate, 2000),
    P("cuStreamBeginCapture", cuStreamBeginCapture_v2, 10010),
    P("cuStreamEndCapture", cuStreamEndCapture, 10000),
    P("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v2, 11030),
    P("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags, 11040),
    P("cuGraphLaunch", cuGraphLaunch, 10000),
    P("cuGraphExecDestroy", cuGraphExecDestroy, 10000),
    P("cuGraphDestroy", cuGraphDestroy, 10000),
    P("cuStreamDestroy", cuStreamDestroy_v2, 4000),
    P("cuStreamSynchronize", cuStreamSynchronize, 2000),
    P("cuStreamQuery", cuStreamQuery, 2000),
    P("cuStreamWriteValue32", cuStreamWriteValue32_v2, 12000),
    P("cuStreamWriteValue64", cuStreamWriteValue64_v2, 12000),
    P("cuStreamWaitValue32", cuStreamWaitValue32_v2, 12000),
    P("cuStreamWaitValue64", cuStreamWaitValue64_v2, 12000),
    P("cuStreamWaitEvent", cuStreamWaitEvent, 3020),
    P("cuLaunchHostFunc", cuLaunchHostFunc, 10000),
    P("cuEventCreate", cuEventCreate, 2000),
    P("cuEventRecord", cuEventRecord, 2000),
    P("cuEventQuery", cuEventQuery, 2000),
    P("cuEventSynchronize", cuEventSynchronize, 2000),
    P("cuEventElapsedTime", cuEventElapsedTime, 2000),
    P("cuEventElapsedTime", cuEventElapsedTime_v2, 12080),
    P("cuEventDestroy", cuEventDestroy_v2, 4000),
    P("cuModuleLoadData", cuModuleLoadData, 2000),
    P("cuModuleGetFunction", cuModuleGetFunction, 2000),
    P("cuModuleUnload", cuModuleUnload, 2000),
    P("cuLibraryLoadData", cuLibraryLoadData, 12000),
    P("cuLibraryGetKernel", cuLibraryGetKernel, 12000),
    P("cuLibraryUnload", cuLibraryUnload, 12000),
    P("cuKernelGetFunction", cuKernelGetFunction, 12000),
    P("cuFuncGetParamInfo", cuFuncGetParamInfo, 12040),
    P("cuKernelGetParamInfo", cuKernelGetParamInfo, 12040),
    P("cuFuncGetModule", cuFuncGetModule, 11000),
    P("cuFuncGetName", cuFuncGetName, 12030),
    P("cuKernelGetName", cuKernelGetName, 12030),
    P("cuKernelGetLibrary", cuKernelGetLibrary, 12050),
    P("cuLaunchKernel", cuLaunchKernel, 4000),
    P("cuLaunchKernelEx", cuLaunchKernelEx, 11060),
    P("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity, 10020),
    P("cuMemCreate", cuMemCreate, 10020),
    P("cuMemRelease", cuMemRelease, 10020),
    P("cuMemAddressReserve", cuMemAddressReserve, 10020),
    P("cuMemAddressFree", cuMemAddressFree, 10020),
    P("cuMemMap", cuMemMap, 10020),
    P("cuMemUnmap", cuMemUnmap, 10020),
    P("cuMemSetAccess", cuMemSetAccess, 10020),
    P("cuMemExportToShareableHandle", cuMemExportToShareableHandle, 10020),
    P("cuMemRetainAllocationHandle", cuMemRetainAllocationHandle, 11000),
    P("cuMemGetAllocationPropertiesFromHandle", cuMemGetAllocationPropertiesFromHandle, 10020),
    P("cuMemImportFromShareableHandle", cuMemImportFromShareableHandle, 10020),
    P("cuCheckpointProcessGetRestoreThreadId", cuCheckpointProcessGetRestoreThreadId, 12080),
    P("cuCheckpointProcessGetState", cuCheckpointProcessGetState, 12080),
    P("cuCheckpointProcessLock", cuCheckpointProcessLock, 12080),
    P("cuCheckpointProcessCheckpoint", cuCheckpointProcessCheckpoint, 12080),
    P("cuCheckpointProcessRestore", cuCheckpointProcessRestore, 12080),
    P("cuCheckpointProcessUnlock", cuCheckpointProcessUnlock, 12080),
};

/* A base name for a CUDA version, as the driver resolves it (only base names; the newest not past the version). */
static CUdriverProcAddressQueryResult resolve(const char *symbol, void **pfn, int cudaVersion) {
    const proc_ent *best = NULL;
    bool known = false;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].base, symbol) != 0)
            continue;
        known = true;
        if (procs[i].version <= cudaVersion && (!best || procs[i].version > best->version))
            best = &procs[i];
    }
    if (!best)
        return known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *pfn = best->fn;
    return CU_GET_PROC_ADDRESS_SUCCESS;
}

/* Both work before cuInit (that is how the runtime finds cuInit). The flags' per-thread variants are the same
 * functions here: a record names its stream, CU_STREAM_PER_THREAD included. */
SV_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *symbolStatus) {
    if (!symbol || !pfn || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    CUdriverProcAddressQueryResult st = resolve(symbol, pfn, cudaVersion);
    if (symbolStatus)
        *symbolStatus = st;
    return CUDA_SUCCESS;
}

SV_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    if (!symbol || !pfn || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    void *fn = NULL;
    if (resolve(symbol, &fn, cudaVersion) != CU_GET_PROC_ADDRESS_SUCCESS)
        return CUDA_ERROR_NOT_FOUND;
    *pfn = fn;
    return CUDA_SUCCESS;
}

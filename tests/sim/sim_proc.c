/* cuGetProcAddress, error names and strings, export tables. */
#include <string.h>

#include "sim.h"
#include "gpucr/procaddr.h"

#undef cuGetProcAddress
#undef cuEventElapsedTime

/* Exported by this library but not declared in cudadrv.h (legacy or newer variants). */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);

typedef struct {
    const char *base; /* the name programs ask for */
    const char *sym;  /* the ABI symbol it resolves to */
    int version;      /* the CUDA version from which `sym` is what `base` means */
    void *fn;
} proc_ent;

#define P(base, sym, ver) {base, #sym, ver, (void *)sym},

static const proc_ent procs[] = {GC_PROC_ADDRESSES(P)};

#define NPROCS (sizeof procs / sizeof procs[0])

/*
 * Resolves a base name ("cuMemAlloc") for a CUDA version, as the driver does
 * (measured on driver 580): only base names resolve, an exact ABI name such as
 * "cuMemAlloc_v2" is unknown. The per-thread-default-stream flag would select
 * _ptsz/_ptds variants on the driver; the simulator has none (its per-thread
 * stream is the legacy one), so every flag value gives the plain entry point.
 * A version older than a function's _v2 gets VERSION_NOT_SUFFICIENT here where
 * the driver would hand out the old v1 function, which the simulator lacks.
 */
static CUdriverProcAddressQueryResult resolve(const char *symbol, void **pfn, int cudaVersion) {
    const proc_ent *best = NULL;
    bool known = false;
    for (size_t i = 0; i < NPROCS; i++) {
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

/*
 * Both work before cuInit: that is how cudart finds cuInit in the first place.
 * Measured on driver 580: the _v2 entry answers an unknown symbol with
 * CUDA_SUCCESS, *pfn = NULL and the reason in symbolStatus; the legacy one
 * answers CUDA_ERROR_NOT_FOUND and leaves *pfn alone.
 */
SIM_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *symbolStatus) {
    if (atomic_load(&sim.forked))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!symbol || !pfn || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    CUdriverProcAddressQueryResult st = resolve(symbol, pfn, cudaVersion);
    if (symbolStatus)
        *symbolStatus = st;
    sim_log("cuGetProcAddress_v2(%s, %d) -> status %d", symbol, cudaVersion, (int)st);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    if (atomic_load(&sim.forked))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!symbol || !pfn || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    void *fn = NULL;
    CUresult r = resolve(symbol, &fn, cudaVersion) == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS)
        *pfn = fn;
    sim_log("cuGetProcAddress(%s, %d) -> %s", symbol, cudaVersion, sim_error_name(r));
    return r;
}

SIM_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    if (!ppExportTable || !pExportTableId)
        return CUDA_ERROR_INVALID_VALUE;
    *ppExportTable = NULL;
    /*
     * The simulator serves no CUDA runtime, so it knows none of the runtime's
     * private tables; the driver answers an unknown table id this way (measured).
     */
    sim_log("cuGetExportTable -> CUDA_ERROR_INVALID_VALUE");
    return CUDA_ERROR_INVALID_VALUE;
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
    E(CUDA_ERROR_TIMEOUT, "the operation timed out"),
    E(CUDA_ERROR_UNKNOWN, "unknown error"),
};

static const err_ent *err_find(CUresult r) {
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
        if (errs[i].code == r)
            return &errs[i];
    return NULL;
}

const char *sim_error_name(CUresult r) {
    const err_ent *e = err_find(r);
    return e ? e->name : "CUDA_ERROR_(unknown code)";
}

SIM_API CUresult cuGetErrorString(CUresult error, const char **pStr) {
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    const err_ent *e = err_find(error);
    *pStr = e ? e->text : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult cuGetErrorName(CUresult error, const char **pStr) {
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    const err_ent *e = err_find(error);
    *pStr = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* cuGetProcAddress, error names and strings, export tables. */
#include <string.h>

#include "sim.h"
#include "gpucr/cuerrors.h"
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

const char *sim_error_name(CUresult r) {
    const gc_error_ent *e = gc_error_find(r);
    return e ? e->name : "CUDA_ERROR_(unknown code)";
}

SIM_API CUresult cuGetErrorString(CUresult error, const char **pStr) { return gc_error_lookup(error, pStr, 0); }

SIM_API CUresult cuGetErrorName(CUresult error, const char **pStr) { return gc_error_lookup(error, pStr, 1); }

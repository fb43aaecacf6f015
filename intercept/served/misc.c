/*
 * What the served library answers itself (client.h): error names and
 * strings, cuGetProcAddress (which hands out this library's own entry
 * points), and the refusals: every entry point of gpucr/cudadrv.h that is
 * not forwarded still exists, fails with CUDA_ERROR_NOT_SUPPORTED and says
 * why once.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "gpucr/cuerrors.h"
#include "gpucr/procaddr.h"

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

SV_API CUresult cuGetErrorString(CUresult error, const char **pStr) { return gc_error_lookup(error, pStr, 0); }

SV_API CUresult cuGetErrorName(CUresult error, const char **pStr) { return gc_error_lookup(error, pStr, 1); }

/* ---- refused: the driver's private tables and the checkpoint API ---- */

/*
 * Asked for by NVIDIA's CUDA runtime, which libraries carry inside them too (cuDNN, CuPy's, programs built with
 * nvcc's default static runtime): the line names the library that asked, once per library, which is what a user
 * can act on (cuBLAS's and the shared runtime's have served mode's own in their place).
 */
SV_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    if (!ppExportTable || !pExportTableId)
        return CUDA_ERROR_INVALID_VALUE;
    *ppExportTable = NULL;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char said[8][256];
    Dl_info di;
    const char *who = dladdr(__builtin_return_address(0), &di) && di.dli_fname ? di.dli_fname : "the program";
    const char *base = strrchr(who, '/') ? strrchr(who, '/') + 1 : who;
    bool first = true;
    pthread_mutex_lock(&mu);
    for (unsigned i = 0; i < 8 && first; i++) {
        if (strcmp(said[i], base) == 0)
            first = false;
        else if (!said[i][0]) {
            snprintf(said[i], sizeof said[i], "%s", base);
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    if (first)
        sv_warn(
            "served mode: %s asked for the driver's private export tables, which a process with no driver "
            "cannot answer: it carries NVIDIA's CUDA runtime inside it (cuDNN, CuPy and programs built with "
            "nvcc's default static runtime do), which served mode does not run yet; run it in-process (gpucr "
            "run without --served) (CUDA_ERROR_NOT_SUPPORTED)",
            base);
    return CUDA_ERROR_NOT_SUPPORTED;
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

/* api.c: answered from the captures this library began, or by the worker during one */
SV_API CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                          const CUgraphNode **deps, size_t *ndeps);

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

#define P(base, sym, ver) {base, ver, (void *)sym},

static const proc_ent procs[] = {GC_PROC_ADDRESSES(P)
                                 /* the capture query: the driver's _v2, which cudadrv.h does not declare */
                                 P("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v2, 11030)};

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

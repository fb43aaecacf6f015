/*
 * Symbol interposition: one table of {name, wrapper, real pointer}; the
 * exported wrappers under the driver's ABI names; dlsym and cuGetProcAddress
 * hand out wrappers in place of the driver's own entry points; the gate.
 */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpucr_int.h"

/* ---- logging ---- */

int gc_log_debug;

static void vlog(const char *fmt, va_list ap) {
    char line[1024];
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    fputs("gpucr: ", stderr);
    fwrite(line, 1, (size_t)n, stderr);
}

void gc_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void gc_debug(const char *fmt, ...) {
    if (!gc_log_debug)
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

/* ---- the symbol table ---- */

typedef struct {
    const char *name;
    void *wrapper; /* NULL for the interposer's internal entries */
    void *real;
} sym_ent;

#define GC_SYM_WRAPPED(n) {#n, (void *)n, NULL},
#define GC_SYM_INTERNAL(n) {#n, NULL, NULL},
static sym_ent syms[SYM_NALL] = {GC_SYMS(GC_SYM_WRAPPED) GC_INTERNAL_SYMS(GC_SYM_INTERNAL)};

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;
static void *libcuda;
static pthread_once_t dlsym_once = PTHREAD_ONCE_INIT;
static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;
static _Atomic int resolved;

static void find_real_dlsym(void) {
    real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym)
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

static dlsym_fn get_real_dlsym(void) {
    pthread_once(&dlsym_once, find_real_dlsym);
    return real_dlsym;
}

static void do_resolve(void) {
    dlsym_fn rd = get_real_dlsym();
    const char *path = getenv("GPUCR_LIBCUDA");
    if (!path || !*path)
        path = "libcuda.so.1";
    libcuda = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!libcuda || !rd) {
        gc_warn("cannot load the driver %s: %s", path, rd ? dlerror() : "no dlsym");
    } else {
        for (int i = 0; i < SYM_NALL; i++)
            syms[i].real = rd(libcuda, syms[i].name);
    }
    gc_scan_set_query((gc_paraminfo_fn)syms[SYM_cuFuncGetParamInfo].real,
                      (gc_paraminfo_fn)syms[SYM_cuKernelGetParamInfo].real);
    atomic_store(&resolved, 1);
}

void gc_resolve(void) {
    if (__builtin_expect(!atomic_load_explicit(&resolved, memory_order_acquire), 0))
        pthread_once(&resolve_once, do_resolve);
}

void *gc_real(int idx) {
    gc_resolve();
    return syms[idx].real;
}

/* A real entry point of a function we wrap -> our wrapper; anything else unchanged. */
static void *to_wrapper(void *p) {
    if (!p)
        return p;
    for (int i = 0; i < SYM_NWRAPPED; i++)
        if (syms[i].real == p)
            return syms[i].wrapper;
    return p;
}

/* RTLD_NEXT relative to our caller, not to us (the real dlsym would see us as the caller). */
static void *dlsym_next(dlsym_fn rd, const void *caller, const char *name) {
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
        return rd(RTLD_NEXT, name);
    for (struct link_map *l = lm->l_next; l; l = l->l_next) {
        void *h = dlopen(l->l_name && *l->l_name ? l->l_name : NULL, RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        void *p = rd(h, name);
        dlclose(h);
        if (!p)
            continue;
        struct link_map *pl = NULL;
        Dl_info pi;
        if (dladdr1(p, &pi, (void **)&pl, RTLD_DL_LINKMAP) && pl == l)
            return p;
    }
    return NULL;
}

GC_EXPORT void *dlsym(void *restrict handle, const char *restrict name) {
    dlsym_fn rd = get_real_dlsym();
    if (!rd)
        return NULL;
    void *p = handle == RTLD_NEXT ? dlsym_next(rd, __builtin_return_address(0), name) : rd(handle, name);
    if (p && name[0] == 'c' && name[1] == 'u') {
        gc_resolve();
        for (int i = 0; i < SYM_NWRAPPED; i++)
            if (strcmp(syms[i].name, name) == 0)
                return syms[i].real == p ? syms[i].wrapper : p;
    }
    return p;
}

/* ---- the gate ---- */

static _Atomic long inflight;
static _Atomic int gate_closed;
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv;
__thread int gc_in_control __attribute__((tls_model("initial-exec")));

static void gate_init_cv(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&gate_cv, &a);
    pthread_condattr_destroy(&a);
}

void gc_gate_leave(void) {
    if (atomic_fetch_sub(&inflight, 1) == 1 && atomic_load(&gate_closed)) {
        pthread_mutex_lock(&gate_mu);
        pthread_cond_broadcast(&gate_cv);
        pthread_mutex_unlock(&gate_mu);
    }
}

void gc_gate_enter(void) {
    for (;;) {
        atomic_fetch_add(&inflight, 1);
        if (__builtin_expect(!atomic_load(&gate_closed), 1) || gc_in_control)
            return;
        gc_gate_leave();
        gc_stat_add(STAT_GATE_WAITS, 1);
        pthread_mutex_lock(&gate_mu);
        while (atomic_load(&gate_closed))
            pthread_cond_wait(&gate_cv, &gate_mu);
        pthread_mutex_unlock(&gate_mu);
    }
}

int gc_gate_close(unsigned timeout_ms) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&gate_mu);
    atomic_store(&gate_closed, 1);
    int rc = 0;
    while (atomic_load(&inflight) > 0 && rc == 0)
        rc = pthread_cond_timedwait(&gate_cv, &gate_mu, &dl);
    if (atomic_load(&inflight) > 0) {
        atomic_store(&gate_closed, 0);
        pthread_cond_broadcast(&gate_cv);
        pthread_mutex_unlock(&gate_mu);
        return -ETIMEDOUT;
    }
    pthread_mutex_unlock(&gate_mu);
    return 0;
}

void gc_gate_open(void) {
    pthread_mutex_lock(&gate_mu);
    atomic_store(&gate_closed, 0);
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

void gc_gate_reset(void) {
    atomic_store(&inflight, 0);
    atomic_store(&gate_closed, 0);
    pthread_mutex_init(&gate_mu, NULL);
    gate_init_cv();
}

/* ---- init, fork ---- */

static void atfork_prepare(void) { gc_client_atfork_prepare(); }
static void atfork_parent(void) { gc_client_atfork_parent(); }
static void atfork_child(void) {
    gc_gate_reset();
    gc_client_atfork_child();
}

/*
 * How launches are scanned for pointers into tracked buffers (GPUCR_SCAN):
 *   all     every launch (what concurrent checkpointing will need while a
 *           copy-on-write window is open)
 *   sample  (default) one launch in SCAN_SAMPLE per thread: the statistics
 *           stay representative while the cost stays out of the step time
 *           (scanning every launch cost ResNet-18 training about 13% of its
 *           step time on the H200 machine: its kernels take kilobytes of
 *           parameters)
 *   0       none; launches are only counted
 */
enum { SCAN_OFF, SCAN_SAMPLE, SCAN_ALL };
#define SCAN_SAMPLE_EVERY 64
static int scan_mode = SCAN_SAMPLE;
static __thread unsigned scan_tick __attribute__((tls_model("initial-exec")));

__attribute__((constructor)) static void gc_init(void) {
    const char *l = getenv("GPUCR_LOG");
    gc_log_debug = l && strcmp(l, "debug") == 0;
    const char *sc = getenv("GPUCR_SCAN");
    if (sc && strcmp(sc, "0") == 0)
        scan_mode = SCAN_OFF;
    else if (sc && strcmp(sc, "all") == 0)
        scan_mode = SCAN_ALL;
    gate_init_cv();
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* ---- wrappers ---- */


/* Counted pass-through. */
#define WRAP_COUNT(name, stat, PARAMS, ARGS)                                                                       \
    GC_EXPORT CUresult name PARAMS {                                                                               \
        __typeof__(&name) fn = GC_REAL(name);                                                                      \
        if (!fn)                                                                                                   \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                       \
        gc_gate_enter();                                                                                           \
        gc_stat_add(stat, 1);                                                                                      \
        CUresult r = fn ARGS;                                                                                      \
        gc_gate_leave();                                                                                           \
        return r;                                                                                                  \
    }

GC_EXPORT CUresult cuInit(unsigned int flags) {
    __typeof__(&cuInit) fn = GC_REAL(cuInit);
    if (!fn)
        return CUDA_ERROR_NOT_INITIALIZED;
    gc_forkscrub_before_init();
    gc_gate_enter();
    CUresult r = fn(flags);
    gc_gate_leave();
    gc_forkscrub_after_init(r == CUDA_SUCCESS);
    if (r == CUDA_SUCCESS)
        gc_client_ensure();
    return r;
}

GC_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
    __typeof__(&cuGetProcAddress_v2) fn = GC_REAL(cuGetProcAddress_v2);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = fn(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = to_wrapper(*pfn);
    return r;
}

GC_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    __typeof__(&cuGetProcAddress) fn = GC_REAL(cuGetProcAddress);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = fn(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = to_wrapper(*pfn);
    return r;
}

/* ---- allocations ---- */

#define ALLOC_BODY(name, kind, ...)                                                                                \
    __typeof__(&name) fn = GC_REAL(name);                                                                          \
    if (!fn)                                                                                                       \
        return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
    gc_gate_enter();                                                                                               \
    bool use_real = false;                                                                                         \
    CUresult r = gc_alloc(dptr, bytesize, kind, &use_real);                                                        \
    if (use_real) {                                                                                                \
        r = fn(__VA_ARGS__);                                                                                       \
        if (r == CUDA_SUCCESS)                                                                                     \
            gc_track_local(*dptr, bytesize, kind);                                                                 \
    }                                                                                                              \
    gc_gate_leave();                                                                                               \
    return r;

GC_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    ALLOC_BODY(cuMemAlloc_v2, GC_KIND_MEM_ALLOC, dptr, bytesize)
}
GC_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ALLOC_BODY(cuMemAllocAsync, GC_KIND_ASYNC, dptr, bytesize, hStream)
}
GC_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ALLOC_BODY(cuMemAllocAsync_ptsz, GC_KIND_ASYNC, dptr, bytesize, hStream)
}
GC_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    ALLOC_BODY(cuMemAllocFromPoolAsync, GC_KIND_ASYNC, dptr, bytesize, pool, hStream)
}
GC_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream hStream) {
    ALLOC_BODY(cuMemAllocFromPoolAsync_ptsz, GC_KIND_ASYNC, dptr, bytesize, pool, hStream)
}

/*
 * Pitch: round_up(width, 512), as the simulator does. The real driver's pitch
 * depends on the device's texture pitch alignment and the element size; any
 * pitch >= width that is a multiple of it is valid for the application, which
 * must use the pitch it is given.
 */
GC_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                      unsigned int ElementSizeBytes) {
    __typeof__(&cuMemAllocPitch_v2) fn = GC_REAL(cuMemAllocPitch_v2);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    bool use_real = true;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) / 512 * 512;
    if (dptr && pPitch && WidthInBytes && Height &&
        (ElementSizeBytes == 4 || ElementSizeBytes == 8 || ElementSizeBytes == 16) && pitch >= WidthInBytes &&
        Height <= SIZE_MAX / pitch) {
        use_real = false;
        r = gc_alloc(dptr, pitch * Height, GC_KIND_PITCH, &use_real);
        if (r == CUDA_SUCCESS && !use_real)
            *pPitch = pitch;
    }
    if (use_real) {
        r = fn(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
        if (r == CUDA_SUCCESS)
            gc_track_local(*dptr, *pPitch * Height, GC_KIND_PITCH);
    }
    gc_gate_leave();
    return r;
}

#define FREE_BODY(name, async, stream, ...)                                                                        \
    __typeof__(&name) fn = GC_REAL(name);                                                                          \
    if (!fn)                                                                                                       \
        return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
    gc_gate_enter();                                                                                               \
    CUresult r;                                                                                                    \
    if (!gc_free(dptr, async, stream, &r))                                                                         \
        r = fn(__VA_ARGS__);                                                                                       \
    gc_gate_leave();                                                                                               \
    return r;

GC_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { FREE_BODY(cuMemFree_v2, false, NULL, dptr) }
GC_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    FREE_BODY(cuMemFreeAsync, true, hStream, dptr, hStream)
}
GC_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    FREE_BODY(cuMemFreeAsync_ptsz, true, hStream, dptr, hStream)
}

GC_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    __typeof__(&cuMemGetAddressRange_v2) fn = GC_REAL(cuMemGetAddressRange_v2);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r = CUDA_SUCCESS;
    if (!gc_addr_range(dptr, pbase, psize))
        r = fn(pbase, psize, dptr);
    gc_gate_leave();
    return r;
}

GC_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    __typeof__(&cuMemAllocManaged) fn = GC_REAL(cuMemAllocManaged);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r = fn(dptr, bytesize, flags);
    if (r == CUDA_SUCCESS)
        gc_note_reason(GC_REASON_MANAGED);
    gc_gate_leave();
    return r;
}

GC_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    __typeof__(&cuIpcGetMemHandle) fn = GC_REAL(cuIpcGetMemHandle);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r;
    if (gc_is_helper_mem(dptr)) {
        gc_warn("cuIpcGetMemHandle on gpucr-managed memory (0x%llx): not supported (VMM memory has no legacy IPC "
                "handle)",
                dptr);
        r = CUDA_ERROR_NOT_SUPPORTED;
    } else {
        r = fn(pHandle, dptr);
    }
    gc_gate_leave();
    return r;
}

/* The application's own VMM calls (cuMemCreate, cuMemMap, ...): vmm.c. */

/* ---- launches ---- */

static inline bool scan_this(void) {
    if (scan_mode == SCAN_ALL)
        return true;
    return scan_mode == SCAN_SAMPLE && scan_tick++ % SCAN_SAMPLE_EVERY == 0;
}

static inline void scan(void *f, void **kernelParams, void **extra) {
    if (scan_this() && gc_client_tracking())
        gc_scan_launch(gc_buffers(), f, kernelParams, extra);
    else
        gc_stat_add(STAT_LAUNCHES, 1);
}

#define LAUNCH(name)                                                                                               \
    GC_EXPORT CUresult name(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,     \
                            unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                \
                            unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {    \
        __typeof__(&name) fn = GC_REAL(name);                                                                      \
        if (!fn)                                                                                                   \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                       \
        gc_gate_enter();                                                                                           \
        scan(f, kernelParams, extra);                                                                              \
        CUresult r = fn(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, \
                        kernelParams, extra);                                                                      \
        gc_gate_leave();                                                                                           \
        return r;                                                                                                  \
    }
LAUNCH(cuLaunchKernel)
LAUNCH(cuLaunchKernel_ptsz)

#define LAUNCH_COOP(name)                                                                                          \
    GC_EXPORT CUresult name(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,     \
                            unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                \
                            unsigned int sharedMemBytes, CUstream hStream, void **kernelParams) {                  \
        __typeof__(&name) fn = GC_REAL(name);                                                                      \
        if (!fn)                                                                                                   \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                       \
        gc_gate_enter();                                                                                           \
        scan(f, kernelParams, NULL);                                                                               \
        CUresult r = fn(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, \
                        kernelParams);                                                                             \
        gc_gate_leave();                                                                                           \
        return r;                                                                                                  \
    }
LAUNCH_COOP(cuLaunchCooperativeKernel)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)

#define LAUNCH_EX(name)                                                                                            \
    GC_EXPORT CUresult name(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {       \
        __typeof__(&name) fn = GC_REAL(name);                                                                      \
        if (!fn)                                                                                                   \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                       \
        gc_gate_enter();                                                                                           \
        scan(f, kernelParams, extra);                                                                              \
        CUresult r = fn(config, f, kernelParams, extra);                                                           \
        gc_gate_leave();                                                                                           \
        return r;                                                                                                  \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

/* ---- copies and memsets ---- */

#define CP_SYNC(name, D, S) WRAP_COUNT(name, STAT_COPIES, (D dst, S src, size_t n), (dst, src, n))
#define CP_ASYNC(name, D, S) WRAP_COUNT(name, STAT_COPIES, (D dst, S src, size_t n, CUstream s), (dst, src, n, s))
CP_SYNC(cuMemcpyHtoD_v2, CUdeviceptr, const void *)
CP_SYNC(cuMemcpyDtoH_v2, void *, CUdeviceptr)
CP_SYNC(cuMemcpyDtoD_v2, CUdeviceptr, CUdeviceptr)
CP_SYNC(cuMemcpy, CUdeviceptr, CUdeviceptr)
CP_SYNC(cuMemcpyHtoD_v2_ptds, CUdeviceptr, const void *)
CP_SYNC(cuMemcpyDtoH_v2_ptds, void *, CUdeviceptr)
CP_SYNC(cuMemcpyDtoD_v2_ptds, CUdeviceptr, CUdeviceptr)
CP_SYNC(cuMemcpy_ptds, CUdeviceptr, CUdeviceptr)
CP_ASYNC(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void *)
CP_ASYNC(cuMemcpyDtoHAsync_v2, void *, CUdeviceptr)
CP_ASYNC(cuMemcpyDtoDAsync_v2, CUdeviceptr, CUdeviceptr)
CP_ASYNC(cuMemcpyAsync, CUdeviceptr, CUdeviceptr)
CP_ASYNC(cuMemcpyHtoDAsync_v2_ptsz, CUdeviceptr, const void *)
CP_ASYNC(cuMemcpyDtoHAsync_v2_ptsz, void *, CUdeviceptr)
CP_ASYNC(cuMemcpyDtoDAsync_v2_ptsz, CUdeviceptr, CUdeviceptr)
CP_ASYNC(cuMemcpyAsync_ptsz, CUdeviceptr, CUdeviceptr)

#define MS_SYNC(name, T) WRAP_COUNT(name, STAT_MEMSETS, (CUdeviceptr d, T v, size_t n), (d, v, n))
#define MS_ASYNC(name, T) WRAP_COUNT(name, STAT_MEMSETS, (CUdeviceptr d, T v, size_t n, CUstream s), (d, v, n, s))
MS_SYNC(cuMemsetD8_v2, unsigned char)
MS_SYNC(cuMemsetD16_v2, unsigned short)
MS_SYNC(cuMemsetD32_v2, unsigned int)
MS_SYNC(cuMemsetD8_v2_ptds, unsigned char)
MS_SYNC(cuMemsetD16_v2_ptds, unsigned short)
MS_SYNC(cuMemsetD32_v2_ptds, unsigned int)
MS_ASYNC(cuMemsetD8Async, unsigned char)
MS_ASYNC(cuMemsetD16Async, unsigned short)
MS_ASYNC(cuMemsetD32Async, unsigned int)
MS_ASYNC(cuMemsetD8Async_ptsz, unsigned char)
MS_ASYNC(cuMemsetD16Async_ptsz, unsigned short)
MS_ASYNC(cuMemsetD32Async_ptsz, unsigned int)

/* ---- modules, libraries ---- */

#define LOAD_BODY(name, NOTE, ...)                                                                                 \
    __typeof__(&name) fn = GC_REAL(name);                                                                          \
    if (!fn)                                                                                                       \
        return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
    gc_gate_enter();                                                                                               \
    CUresult r = fn(__VA_ARGS__);                                                                                  \
    if (r == CUDA_SUCCESS) {                                                                                       \
        gc_stat_add(STAT_MODULES, 1);                                                                              \
        NOTE;                                                                                                      \
    }                                                                                                              \
    gc_gate_leave();                                                                                               \
    return r;

GC_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    LOAD_BODY(cuModuleLoad, gc_note_module_file(fname), module, fname)
}
GC_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    LOAD_BODY(cuModuleLoadData, gc_note_module(image, 0), module, image)
}
GC_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                      CUjit_option *options, void **optionValues) {
    LOAD_BODY(cuModuleLoadDataEx, gc_note_module(image, 0), module, image, numOptions, options, optionValues)
}
GC_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                     void **jitOptionsValues, unsigned int numJitOptions,
                                     CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                     unsigned int numLibraryOptions) {
    LOAD_BODY(cuLibraryLoadData, gc_note_module(code, 0), library, code, jitOptions, jitOptionsValues, numJitOptions,
              libraryOptions, libraryOptionValues, numLibraryOptions)
}
GC_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                                         void **jitOptionsValues, unsigned int numJitOptions,
                                         CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                         unsigned int numLibraryOptions) {
    LOAD_BODY(cuLibraryLoadFromFile, gc_note_module_file(fileName), library, fileName, jitOptions, jitOptionsValues,
              numJitOptions, libraryOptions, libraryOptionValues, numLibraryOptions)
}

/* Unloads free function handles the driver may hand out again: cached layouts become stale. */
GC_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
    __typeof__(&cuModuleUnload) fn = GC_REAL(cuModuleUnload);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r = fn(hmod);
    gc_layout_invalidate();
    gc_gate_leave();
    return r;
}
GC_EXPORT CUresult cuLibraryUnload(CUlibrary library) {
    __typeof__(&cuLibraryUnload) fn = GC_REAL(cuLibraryUnload);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r = fn(library);
    gc_layout_invalidate();
    gc_gate_leave();
    return r;
}

/* ---- streams, events ---- */

#define CREATE_BODY(name, stat, ...)                                                                               \
    __typeof__(&name) fn = GC_REAL(name);                                                                          \
    if (!fn)                                                                                                       \
        return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
    gc_gate_enter();                                                                                               \
    CUresult r = fn(__VA_ARGS__);                                                                                  \
    if (r == CUDA_SUCCESS)                                                                                         \
        gc_stat_add(stat, 1);                                                                                      \
    gc_gate_leave();                                                                                               \
    return r;

GC_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    CREATE_BODY(cuStreamCreate, STAT_STREAMS, phStream, Flags)
}
GC_EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    CREATE_BODY(cuStreamCreateWithPriority, STAT_STREAMS, phStream, flags, priority)
}
GC_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    CREATE_BODY(cuEventCreate, STAT_EVENTS, phEvent, Flags)
}

/*
 * Symbol interposition: one table of {name, wrapper, real pointer} over
 * GC_SYMS and GC_INTERNAL_SYMS, the driver's entry points resolved from
 * GPUCR_LIBCUDA (default libcuda.so.1) on first use; dlsym and
 * cuGetProcAddress hand out the wrappers in place of the driver's own entry
 * points. The wrappers themselves (8_interpose.c, 8_gated.c) are named here
 * only by the driver API's names, as entries of the table.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

#include "1_base.h"

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
/* Served mode's library's own entry point, where the driver is that library (NULL: a driver). */
static int (*served_detach)(void);
static int (*served_attach)(void);
static int (*served_script)(void);
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

/* A kernel's owner and name, for its write set (1_writes.c): a CUfunction's module, a CUkernel's library. */
static CUresult func_owner(void *h, void **owner, const char **name) {
    __typeof__(&cuFuncGetModule) mod = (__typeof__(&cuFuncGetModule))syms[SYM_cuFuncGetModule].real;
    __typeof__(&cuFuncGetName) nm = (__typeof__(&cuFuncGetName))syms[SYM_cuFuncGetName].real;
    if (!mod || !nm)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = mod((CUmodule *)owner, (CUfunction)h);
    return r == CUDA_SUCCESS ? nm(name, (CUfunction)h) : r;
}

static CUresult kern_owner(void *h, void **owner, const char **name) {
    __typeof__(&cuKernelGetLibrary) lib = (__typeof__(&cuKernelGetLibrary))syms[SYM_cuKernelGetLibrary].real;
    __typeof__(&cuKernelGetName) nm = (__typeof__(&cuKernelGetName))syms[SYM_cuKernelGetName].real;
    if (!lib || !nm)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = lib((CUlibrary *)owner, (CUkernel)h);
    return r == CUDA_SUCCESS ? nm(name, (CUkernel)h) : r;
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
        served_detach = (int (*)(void))rd(libcuda, GC_SERVED_DETACH);
        served_attach = (int (*)(void))rd(libcuda, GC_SERVED_ATTACH);
        served_script = (int (*)(void))rd(libcuda, GC_SERVED_SCRIPT);
    }
    gc_scan_set_query((gc_paraminfo_fn)syms[SYM_cuFuncGetParamInfo].real,
                      (gc_paraminfo_fn)syms[SYM_cuKernelGetParamInfo].real);
    gc_scan_set_owner(func_owner, kern_owner);
    atomic_store(&resolved, 1);
}

void gc_resolve(void) {
    if (__builtin_expect(!atomic_load_explicit(&resolved, memory_order_acquire), 0))
        pthread_once(&resolve_once, do_resolve);
}

bool gc_driver_served(void) {
    gc_resolve();
    return served_detach != NULL;
}

/*
 * Served mode's runtime library (libcudart.so.13 of build/lib/served), where the program uses it: the contents of
 * its __device__ variables, which a new worker's load of the program's libraries would start afresh, are saved
 * before the worker goes and put back once the next one has the libraries (intercept/runtime/registry.c). Only
 * the control thread calls these, once per move: runtime_saved keeps a second detach (detached() after
 * do_detach) from reading variables with no worker.
 */
static bool runtime_saved;

int gc_driver_served_detach(void) {
    gc_resolve();
    if (!served_detach)
        return 0;
    if (!runtime_saved) {
        int (*save)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gpucrRuntimeSave");
        if (save && save() != 0)
            gc_warn("served mode: the runtime's __device__ variables were not all saved; those come back as loaded");
        runtime_saved = true;
    }
    return served_detach();
}

int gc_driver_served_script(void) {
    gc_resolve();
    if (!served_script) {
        gc_warn("served mode: the driver library writes no template's script (an older gpucr's?)");
        return -1;
    }
    return served_script();
}

int gc_driver_served_attach(void) {
    gc_resolve();
    if (!served_attach)
        return 0;
    int rc = served_attach();
    if (rc == 0 && runtime_saved) {
        int (*restore)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gpucrRuntimeRestore");
        if (restore && restore() != 0)
            gc_warn("served mode: the runtime's __device__ variables were not all restored");
        runtime_saved = false;
    }
    return rc;
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

/*
 * What nvcc's host code registers when a library or program loads, and the
 * kernels and variables it stands for.
 *
 * A program registers every fat binary it carries at load time (PyTorch: 445
 * of them, 284 MiB, 21,500 kernels) and launches few of their kernels. So a
 * fat binary is only noted at registration; it is loaded (cuLibraryLoadData,
 * which in served mode ships it to the worker) when one of its kernels or
 * variables is first used, and a kernel is looked up then, once.
 *
 * Lookups by host address take no lock: entries are only ever added (at the
 * head of a bucket's list, under the lock) and never freed.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

/* nvcc's wrapper around a fat binary (its magic and version, then the fat binary). */
#define RT_FATBIN_WRAPPER_MAGIC 0x466243b1
struct rt_wrapper {
    int magic;
    int version;
    const void *data;
    const void *filename_or_fatbins;
};

struct rt_var;
struct rt_fatbin {
    const void *image;
    pthread_mutex_t mu;
    bool tried; /* loaded, or failed to: err says which */
    cudaError_t err;
    CUlibrary lib;
    struct rt_var *vars; /* its variables, for a move to another worker */
    struct rt_fatbin *next;
};

#define RT_FUNC_MAGIC 0x67637266u /* "gcrf": a cudaKernel_t this library handed out */
struct rt_func {
    uint32_t magic;
    const void *host;
    struct rt_fatbin *fb;
    const char *name; /* the registering library's string: it lives as long as the library */
    _Atomic(CUfunction) fn;
    struct rt_func *next, *next_by_self;
};

struct rt_var {
    const void *host;
    struct rt_fatbin *fb;
    const char *name;
    size_t size;
    _Atomic(CUdeviceptr) dptr;
    void *saved; /* its contents while the process has no worker (gpucrRuntimeSave) */
    struct rt_var *next, *next_in_fb;
};

#define RT_BUCKETS 65536
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(struct rt_func *) funcs[RT_BUCKETS];   /* by host stub address */
static _Atomic(struct rt_func *) by_self[RT_BUCKETS]; /* by the entry's own address (a cudaKernel_t) */
static _Atomic(struct rt_var *) vars[RT_BUCKETS];
static struct rt_fatbin *fatbins; /* every one registered, under reg_mu */

static size_t bucket(const void *p) {
    uintptr_t v = (uintptr_t)p;
    v ^= v >> 17;
    v *= 0x9E3779B97F4A7C15ull;
    return (size_t)(v >> 48) & (RT_BUCKETS - 1);
}

RT_API void **__cudaRegisterFatBinary(void *fatCubin) {
    struct rt_fatbin *fb = calloc(1, sizeof *fb);
    if (!fb)
        return NULL;
    const struct rt_wrapper *w = fatCubin;
    fb->image = w && w->magic == RT_FATBIN_WRAPPER_MAGIC ? w->data : fatCubin;
    pthread_mutex_init(&fb->mu, NULL);
    pthread_mutex_lock(&reg_mu);
    fb->next = fatbins;
    fatbins = fb;
    pthread_mutex_unlock(&reg_mu);
    /* the handle is opaque to nvcc's code, which hands it back in every later call */
    return (void **)fb;
}

RT_API void __cudaRegisterFatBinaryEnd(void **fatCubinHandle) { (void)fatCubinHandle; }

/* At exit (nvcc's code registers this with atexit) or a library's unload. Its kernels stay in the tables, so a
 * thread that still launches one fails cleanly rather than reading freed memory; nothing is unloaded from the
 * driver, which may already be going at exit. */
RT_API void __cudaUnregisterFatBinary(void **fatCubinHandle) { (void)fatCubinHandle; }

RT_API char __cudaInitModule(void **fatCubinHandle) {
    (void)fatCubinHandle;
    return 1;
}

RT_API void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun, const char *deviceName,
                                   int thread_limit, void *tid, void *bid, dim3 *bDim, dim3 *gDim, int *wSize) {
    (void)deviceFun;
    (void)thread_limit;
    (void)tid;
    (void)bid;
    (void)bDim;
    (void)gDim;
    (void)wSize;
    if (!fatCubinHandle || !hostFun || !deviceName)
        return;
    struct rt_func *f = calloc(1, sizeof *f);
    if (!f)
        return;
    f->magic = RT_FUNC_MAGIC;
    f->host = hostFun;
    f->fb = (struct rt_fatbin *)fatCubinHandle;
    f->name = deviceName;
    pthread_mutex_lock(&reg_mu);
    size_t b = bucket(hostFun), s = bucket(f);
    f->next = atomic_load_explicit(&funcs[b], memory_order_relaxed);
    f->next_by_self = atomic_load_explicit(&by_self[s], memory_order_relaxed);
    atomic_store_explicit(&funcs[b], f, memory_order_release);
    atomic_store_explicit(&by_self[s], f, memory_order_release);
    pthread_mutex_unlock(&reg_mu);
}

RT_API void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress, const char *deviceName,
                              int ext, size_t size, int constant, int global) {
    (void)deviceAddress;
    (void)ext;
    (void)constant;
    (void)global;
    if (!fatCubinHandle || !hostVar || !deviceName)
        return;
    struct rt_var *v = calloc(1, sizeof *v);
    if (!v)
        return;
    v->host = hostVar;
    v->fb = (struct rt_fatbin *)fatCubinHandle;
    v->name = deviceName;
    v->size = size;
    pthread_mutex_lock(&reg_mu);
    size_t b = bucket(hostVar);
    v->next = atomic_load_explicit(&vars[b], memory_order_relaxed);
    v->next_in_fb = v->fb->vars;
    v->fb->vars = v;
    atomic_store_explicit(&vars[b], v, memory_order_release);
    pthread_mutex_unlock(&reg_mu);
}

/* The entry a cudaKernel_t (__cudaGetKernel's, cudaGetKernel's) is. */
static struct rt_func *find_kernel(const void *p) {
    for (struct rt_func *f = atomic_load_explicit(&by_self[bucket(p)], memory_order_acquire); f; f = f->next_by_self)
        if ((const void *)f == p)
            return f;
    return NULL;
}

/* The entry of a host stub, or of a cudaKernel_t passed where a host function goes. */
static struct rt_func *find_func(const void *p) {
    for (struct rt_func *f = atomic_load_explicit(&funcs[bucket(p)], memory_order_acquire); f; f = f->next)
        if (f->host == p)
            return f;
    return find_kernel(p);
}

/* The fat binary's library, loaded on first use (once; a failure is remembered and returned again). */
static cudaError_t load(struct rt_fatbin *fb) {
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return e;
    pthread_mutex_lock(&fb->mu);
    if (!fb->tried) {
        fb->err = DRV(LibraryLoadData, (&fb->lib, fb->image, NULL, NULL, 0, NULL, NULL, 0));
        fb->tried = true;
    }
    e = fb->err;
    pthread_mutex_unlock(&fb->mu);
    return e;
}

static cudaError_t resolve_func(struct rt_func *f, CUfunction *out) {
    CUfunction fn = atomic_load_explicit(&f->fn, memory_order_acquire);
    if (fn) {
        *out = fn;
        return cudaSuccess;
    }
    cudaError_t e = load(f->fb);
    if (e != cudaSuccess)
        return e;
    CUkernel k;
    e = DRV(LibraryGetKernel, (&k, f->fb->lib, f->name));
    if (e == (cudaError_t)CUDA_ERROR_NOT_FOUND)
        return cudaErrorInvalidDeviceFunction;
    if (e == cudaSuccess)
        e = DRV(KernelGetFunction, (&fn, k));
    if (e != cudaSuccess)
        return e;
    /* two threads may both look it up: the same kernel, either answer will do */
    atomic_store_explicit(&f->fn, fn, memory_order_release);
    *out = fn;
    return cudaSuccess;
}

cudaError_t rt_function(const void *func, CUfunction *out) {
    if (!func)
        return cudaErrorInvalidDeviceFunction;
    struct rt_func *f = find_func(func);
    if (!f)
        return cudaErrorInvalidDeviceFunction;
    return resolve_func(f, out);
}

cudaError_t rt_kernel(cudaKernel_t kernel, CUfunction *out) {
    struct rt_func *f = kernel ? find_kernel(kernel) : NULL;
    if (!f)
        return cudaErrorInvalidDeviceFunction;
    return resolve_func(f, out);
}

cudaError_t rt_symbol(const void *symbol, CUdeviceptr *dptr, size_t *size) {
    struct rt_var *v = NULL;
    for (struct rt_var *p = symbol ? atomic_load_explicit(&vars[bucket(symbol)], memory_order_acquire) : NULL; p;
         p = p->next)
        if (p->host == symbol) {
            v = p;
            break;
        }
    if (!v)
        return cudaErrorInvalidSymbol;
    CUdeviceptr d = atomic_load_explicit(&v->dptr, memory_order_acquire);
    if (!d) {
        cudaError_t e = load(v->fb);
        if (e != cudaSuccess)
            return e;
        size_t bytes = 0;
        e = DRV(LibraryGetGlobal, (&d, &bytes, v->fb->lib, v->name));
        if (e == (cudaError_t)CUDA_ERROR_NOT_FOUND)
            return cudaErrorInvalidSymbol;
        if (e != cudaSuccess)
            return e;
        atomic_store_explicit(&v->dptr, d, memory_order_release);
    }
    *dptr = d;
    if (size)
        *size = v->size;
    return cudaSuccess;
}

/*
 * Served mode moves a process to another worker at a checkpoint (and at its restore): the worker loads the
 * process's libraries again, so a __device__ or __constant__ variable comes back at another address with its
 * image's initial value. gpucr's interposer calls these around the move (its gate closed, so no thread of the
 * program runs GPU work meanwhile): the contents of every variable of every library loaded are read back
 * before the worker goes, and after the new worker has the libraries again, each variable is looked up anew
 * and gets them back. Kernels find their variables themselves; a program that kept a variable's address
 * (cudaGetSymbolAddress) has the old one, as it would after any reload. 0, or -1 if a variable could not be
 * saved or restored (each one says why).
 */
/* The interposer's control thread calls these: it needs the context current too. */
static bool move_ctx(const char *what) {
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        fprintf(stderr, "gpucr runtime: no context to %s the move: %s\n", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

RT_API int gpucrRuntimeSave(void);
RT_API int gpucrRuntimeSave(void) {
    if (!move_ctx("save the variables before"))
        return -1;
    int rc = 0;
    pthread_mutex_lock(&reg_mu);
    for (struct rt_fatbin *fb = fatbins; fb; fb = fb->next) {
        if (!fb->tried || fb->err != cudaSuccess)
            continue;
        for (struct rt_var *v = fb->vars; v; v = v->next_in_fb) {
            CUdeviceptr d;
            size_t size;
            cudaError_t e = rt_symbol(v->host, &d, &size);
            free(v->saved);
            v->saved = size ? malloc(size) : NULL;
            if (e == cudaSuccess && size && !v->saved)
                e = cudaErrorMemoryAllocation;
            if (e == cudaSuccess && size)
                e = DRV(MemcpyDtoH, (v->saved, d, size));
            if (e != cudaSuccess) {
                fprintf(stderr, "gpucr runtime: the variable %s could not be saved before the move: %s\n", v->name,
                        cudaGetErrorString(e));
                free(v->saved);
                v->saved = NULL;
                rc = -1;
            }
        }
    }
    pthread_mutex_unlock(&reg_mu);
    return rc;
}

RT_API int gpucrRuntimeRestore(void);
RT_API int gpucrRuntimeRestore(void) {
    if (!move_ctx("restore the variables after"))
        return -1;
    int rc = 0;
    pthread_mutex_lock(&reg_mu);
    for (struct rt_fatbin *fb = fatbins; fb; fb = fb->next) {
        if (!fb->tried || fb->err != cudaSuccess)
            continue;
        for (struct rt_var *v = fb->vars; v; v = v->next_in_fb) {
            atomic_store_explicit(&v->dptr, 0, memory_order_release);
            if (!v->saved)
                continue;
            CUdeviceptr d;
            size_t size;
            cudaError_t e = rt_symbol(v->host, &d, &size);
            if (e == cudaSuccess)
                e = DRV(MemcpyHtoD, (d, v->saved, size));
            if (e != cudaSuccess) {
                fprintf(stderr, "gpucr runtime: the variable %s could not be restored after the move: %s\n", v->name,
                        cudaGetErrorString(e));
                rc = -1;
            }
            free(v->saved);
            v->saved = NULL;
        }
    }
    pthread_mutex_unlock(&reg_mu);
    return rc;
}

RT_API cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun) {
    if (!kernel)
        return rt_ret(cudaErrorInvalidValue);
    struct rt_func *f = hostFun ? find_func(hostFun) : NULL;
    if (!f)
        return rt_ret(cudaErrorInvalidDeviceFunction);
    /* the entry itself: a launch through it needs no lookup */
    *kernel = (cudaKernel_t)(void *)f;
    return cudaSuccess;
}

RT_API cudaError_t cudaGetKernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr) {
    return __cudaGetKernel(kernelPtr, entryFuncAddr);
}

/* ---- the configuration a <<<>>> pushes and the host stub pops ---- */

#define RT_CALL_DEPTH 16
static __thread struct {
    dim3 grid, block;
    size_t shmem;
    void *stream;
} call_stack[RT_CALL_DEPTH];
static __thread unsigned call_depth;

RT_API unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, void *stream) {
    if (call_depth >= RT_CALL_DEPTH)
        return 1;
    call_stack[call_depth].grid = gridDim;
    call_stack[call_depth].block = blockDim;
    call_stack[call_depth].shmem = sharedMem;
    call_stack[call_depth].stream = stream;
    call_depth++;
    return 0;
}

RT_API cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem, void *stream) {
    if (call_depth == 0)
        return rt_ret(cudaErrorMissingConfiguration);
    call_depth--;
    *gridDim = call_stack[call_depth].grid;
    *blockDim = call_stack[call_depth].block;
    *sharedMem = call_stack[call_depth].shmem;
    memcpy(stream, &call_stack[call_depth].stream, sizeof(void *));
    return cudaSuccess;
}

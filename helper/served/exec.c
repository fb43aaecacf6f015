/*
 * The served-mode worker's executor (exec.h): runs the served process's
 * driver calls from the shared ring (protocol/c/served.h) on the one thread
 * whose context sv_prepare made current.
 *
 * The client is another process, running as another user's program: every
 * record is copied out of the shared memory before its fields are checked,
 * every id, slot, offset and length is bounds-checked, and a record that
 * breaks the ring's framing ends the service with an error (the client then
 * sees its worker gone). A well-framed record with bad arguments fails with
 * the CUresult the driver would give.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "blas.h"
#include "exec.h"
#include "gpucr/cudadrv.h"
#include "served.h"

/* ---- the driver, by name ---- */

#define STR_(x) #x
#define STR(x) STR_(x)

/* Every entry point the executor calls; STR() expands cudadrv.h's aliases, so cuMemAlloc is cuMemAlloc_v2. */
#define DRV(X)                                                                                                         \
    X(cuInit)                                                                                                          \
    X(cuDriverGetVersion)                                                                                              \
    X(cuGetErrorName)                                                                                                  \
    X(cuDeviceGet)                                                                                                     \
    X(cuDeviceGetCount)                                                                                                \
    X(cuDeviceGetName)                                                                                                 \
    X(cuDeviceGetAttribute)                                                                                            \
    X(cuDeviceGetPCIBusId)                                                                                             \
    X(cuDeviceTotalMem)                                                                                                \
    X(cuDeviceGetUuid_v2)                                                                                              \
    X(cuDevicePrimaryCtxRetain)                                                                                        \
    X(cuDevicePrimaryCtxGetState)                                                                                      \
    X(cuDevicePrimaryCtxSetFlags)                                                                                      \
    X(cuCtxSetCurrent)                                                                                                 \
    X(cuCtxSynchronize)                                                                                                \
    X(cuMemAlloc)                                                                                                      \
    X(cuMemAllocPitch)                                                                                                 \
    X(cuMemFree)                                                                                                       \
    X(cuMemGetInfo)                                                                                                    \
    X(cuMemGetAddressRange)                                                                                            \
    X(cuMemAllocAsync)                                                                                                 \
    X(cuMemFreeAsync)                                                                                                  \
    X(cuMemcpyHtoD)                                                                                                    \
    X(cuMemcpyDtoH)                                                                                                    \
    X(cuMemcpyDtoD)                                                                                                    \
    X(cuMemcpyHtoDAsync)                                                                                               \
    X(cuMemcpyDtoHAsync)                                                                                               \
    X(cuMemcpyDtoDAsync)                                                                                               \
    X(cuMemsetD8)                                                                                                      \
    X(cuMemsetD16)                                                                                                     \
    X(cuMemsetD32)                                                                                                     \
    X(cuMemsetD8Async)                                                                                                 \
    X(cuMemsetD16Async)                                                                                                \
    X(cuMemsetD32Async)                                                                                                \
    X(cuStreamCreate)                                                                                                  \
    X(cuStreamDestroy)                                                                                                 \
    X(cuStreamSynchronize)                                                                                             \
    X(cuStreamQuery)                                                                                                   \
    X(cuStreamWaitEvent)                                                                                               \
    X(cuStreamBeginCapture_v2)                                                                                         \
    X(cuStreamEndCapture)                                                                                              \
    X(cuStreamWriteValue32)                                                                                            \
    X(cuStreamWriteValue64)                                                                                            \
    X(cuStreamWaitValue32)                                                                                             \
    X(cuStreamWaitValue64)                                                                                             \
    X(cuEventCreate)                                                                                                   \
    X(cuEventDestroy)                                                                                                  \
    X(cuEventRecord)                                                                                                   \
    X(cuEventQuery)                                                                                                    \
    X(cuEventSynchronize)                                                                                              \
    X(cuEventElapsedTime)                                                                                              \
    X(cuModuleLoadData)                                                                                                \
    X(cuModuleUnload)                                                                                                  \
    X(cuModuleGetFunction)                                                                                             \
    X(cuLibraryLoadData)                                                                                               \
    X(cuLibraryUnload)                                                                                                 \
    X(cuLibraryGetKernel)                                                                                              \
    X(cuKernelGetFunction)                                                                                             \
    X(cuFuncGetParamInfo)                                                                                              \
    X(cuKernelGetParamInfo)                                                                                            \
    X(cuLaunchKernel)                                                                                                  \
    X(cuLaunchKernelEx)                                                                                                \
    X(cuGraphInstantiateWithFlags)                                                                                     \
    X(cuGraphGetNodes)                                                                                                 \
    X(cuGraphLaunch)                                                                                                   \
    X(cuGraphExecDestroy)                                                                                              \
    X(cuGraphDestroy)                                                                                                  \
    X(cuMemGetAllocationGranularity)                                                                                   \
    X(cuMemAddressReserve)                                                                                             \
    X(cuMemAddressFree)                                                                                                \
    X(cuMemCreate)                                                                                                     \
    X(cuMemRelease)                                                                                                    \
    X(cuMemMap)                                                                                                        \
    X(cuMemUnmap)                                                                                                      \
    X(cuMemSetAccess)                                                                                                  \
    X(cuMemImportFromShareableHandle)                                                                                  \
    X(cuMemExportToShareableHandle)                                                                                    \
    X(cuMemRetainAllocationHandle)                                                                                     \
    X(cuMemGetAllocationPropertiesFromHandle)                                                                          \
    X(cuFuncGetAttribute)                                                                                              \
    X(cuFuncSetAttribute)                                                                                              \
    X(cuFuncSetCacheConfig)                                                                                            \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags)                                                            \
    X(cuModuleGetGlobal)                                                                                               \
    X(cuLibraryGetGlobal)                                                                                              \
    X(cuStreamCreateWithPriority)                                                                                      \
    X(cuStreamIsCapturing)                                                                                             \
    X(cuStreamGetCaptureInfo_v2)                                                                                       \
    X(cuThreadExchangeStreamCaptureMode)                                                                               \
    X(cuEventRecordWithFlags)                                                                                          \
    X(cuPointerGetAttribute)                                                                                           \
    X(cuPointerGetAttributes)                                                                                          \
    X(cuCtxSetLimit)                                                                                                   \
    X(cuCtxGetLimit)                                                                                                   \
    X(cuCtxGetStreamPriorityRange)

/* The capture query the driver exports under its _v2 name (cudadrv.h does not declare it). */
CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,
                                   CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                   size_t *numDependencies_out);

#define DRV_DECL(f) static __typeof__(&f) p_##f;
DRV(DRV_DECL)

static struct {
    bool prepared;
    int ordinal;
    CUdevice dev;
    CUcontext ctx;
} W;

static const char *errname(CUresult r) {
    const char *s = NULL;
    if (!p_cuGetErrorName || p_cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
        return "an unknown CUresult";
    return s;
}

/*
 * The device addresses a served process reserves come from one window that every worker reserves from the driver
 * as it starts. A process moved to another worker (a checkpoint, a restore) keeps its device addresses, which the
 * new worker must give it again. The driver does not take an address hint (driver 580 on an H200 ignored every
 * one, inside its earlier ranges too: tests/gpu/served/vahint.c), and places small reservations among the
 * process's own mappings, which differ from worker to worker; but a large reservation made first thing after the
 * context lands at the same address in every process (0x10004000000 there, with or without address
 * randomization). So each worker reserves SV_VA_SIZE there and hands out parts of it itself: a reservation is a
 * range of the window (the lowest that fits, so the same calls give the same addresses), cuMemMap maps into it as
 * into any reserved range, and a replay asks for the same ranges again. A worker whose window could not be
 * reserved, or a window full, leaves reservations to the driver (then a moved process may not get them back).
 */
#define SV_VA_SIZE (1ull << 40)
#define SV_VA_ALIGN (2ull << 20)
#define SV_VA_MAX_RANGES 65536
static struct {
    CUdeviceptr base; /* 0: no window */
    struct va_range {
        uint64_t a, size;
    } * used; /* by address */
    size_t n, cap;
} VA;

static bool in_window(uint64_t a, uint64_t size) {
    return VA.base && a >= VA.base && size <= SV_VA_SIZE && a - VA.base <= SV_VA_SIZE - size;
}

static void window_reserve_at_start(void) {
    CUdeviceptr b = 0;
    if (p_cuMemAddressReserve(&b, SV_VA_SIZE, SV_VA_ALIGN, 0, 0) == CUDA_SUCCESS)
        VA.base = b;
}

/* Where [a, a + size) would go among the used ranges: its index, or -1 if it overlaps one. */
static long va_slot(uint64_t a, uint64_t size) {
    size_t i = 0;
    while (i < VA.n && VA.used[i].a + VA.used[i].size <= a)
        i++;
    if (i < VA.n && VA.used[i].a < a + size)
        return -1;
    return (long)i;
}

static bool va_insert(size_t i, uint64_t a, uint64_t size) {
    if (VA.n == VA.cap) {
        size_t c = VA.cap ? VA.cap * 2 : 64;
        if (c > SV_VA_MAX_RANGES)
            return false;
        struct va_range *u = realloc(VA.used, c * sizeof *u);
        if (!u)
            return false;
        VA.used = u;
        VA.cap = c;
    }
    memmove(&VA.used[i + 1], &VA.used[i], (VA.n - i) * sizeof *VA.used);
    VA.used[i] = (struct va_range){a, size};
    VA.n++;
    return true;
}

/* cuMemAddressReserve: a range of the window, at addr if it is one of the window's and free there (a replay),
 * else the lowest that fits; the driver's own choice if there is no window or no room. */
static CUresult window_reserve(CUdeviceptr *p, uint64_t size, uint64_t align, uint64_t addr, uint64_t flags) {
    uint64_t al = align > SV_VA_ALIGN ? align : SV_VA_ALIGN;
    if (!VA.base || flags != 0 || size == 0 || size % SV_VA_ALIGN || (al & (al - 1)))
        return p_cuMemAddressReserve(p, size, align, addr, flags);
    long at = addr && addr % al == 0 && in_window(addr, size) ? va_slot(addr, size) : -1;
    uint64_t a = addr;
    if (at < 0) { /* first fit */
        a = VA.base;
        for (size_t i = 0; i <= VA.n; i++) {
            a = (a + al - 1) & ~(al - 1);
            uint64_t end = i < VA.n ? VA.used[i].a : VA.base + SV_VA_SIZE;
            if (a <= end && end - a >= size) {
                at = (long)i;
                break;
            }
            if (i < VA.n)
                a = VA.used[i].a + VA.used[i].size;
        }
    }
    if (at < 0 || !va_insert((size_t)at, a, size))
        return p_cuMemAddressReserve(p, size, align, addr, flags);
    *p = a;
    return CUDA_SUCCESS;
}

/* cuMemAddressFree: a window range is only given back to the window. */
static CUresult window_free(uint64_t a, uint64_t size) {
    if (!in_window(a, size))
        return p_cuMemAddressFree(a, size);
    for (size_t i = 0; i < VA.n; i++)
        if (VA.used[i].a == a && VA.used[i].size == size) {
            memmove(&VA.used[i], &VA.used[i + 1], (VA.n - i - 1) * sizeof *VA.used);
            VA.n--;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_VALUE; /* not a reservation of the process's: as the driver answers one */
}

int sv_prepare(const char *libpath, int ordinal, char *err, size_t errlen) {
    const char *path = libpath && *libpath ? libpath : "libcuda.so.1";
    if (W.prepared) {
        snprintf(err, errlen, "served worker: sv_prepare called twice");
        return -1;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, errlen, "dlopen %s: %s", path, dlerror());
        return -1;
    }
#define DRV_RESOLVE(f)                                                                                                 \
    p_##f = (__typeof__(p_##f))dlsym(h, STR(f));                                                                       \
    if (!p_##f) {                                                                                                      \
        snprintf(err, errlen, "%s exports no %s", path, STR(f));                                                       \
        return -1;                                                                                                     \
    }
    DRV(DRV_RESOLVE)
#undef DRV_RESOLVE
    CUresult r;
    int count = 0;
#define STEP(call, what)                                                                                               \
    if ((r = (call)) != CUDA_SUCCESS) {                                                                                \
        snprintf(err, errlen, "%s: %s (%d)", what, errname(r), (int)r);                                                \
        return -1;                                                                                                     \
    }
    STEP(p_cuInit(0), "cuInit");
    STEP(p_cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (ordinal < 0 || ordinal >= count) {
        snprintf(err, errlen, "no device %d (the driver has %d)", ordinal, count);
        return -1;
    }
    STEP(p_cuDeviceGet(&W.dev, ordinal), "cuDeviceGet");
    STEP(p_cuDevicePrimaryCtxRetain(&W.ctx, W.dev), "cuDevicePrimaryCtxRetain");
    STEP(p_cuCtxSetCurrent(W.ctx), "cuCtxSetCurrent");
    /* The context's lazy parts (the device's memory state) are made now, not at the served process's first call. */
    size_t fr = 0, tot = 0;
    STEP(p_cuMemGetInfo(&fr, &tot), "cuMemGetInfo");
    window_reserve_at_start(); /* first thing after the context: at the same address in every worker */
#undef STEP
    W.ordinal = ordinal;
    W.prepared = true;
    return 0;
}

/* ---- the service ---- */

struct wlayout {
    uint32_t n, bytes;
    uint32_t *off, *size;
};

struct wfunc {
    CUfunction f;
    struct wlayout l;
};

struct wkern {
    CUkernel k;
    struct wlayout l;
};

typedef struct {
    int sock;
    struct sv_shared *sh;
    void **tab[SV_K_COUNT]; /* real handles by virtual id; SV_K_FUNC and SV_K_KERNEL hold struct wfunc/wkern */
    uint64_t tail;
    uint8_t *image; /* a module or library image being sent, SV_OP_IMAGE_CHUNK */
    uint64_t image_len, image_cap;
    /* The VMM handles this worker holds for its process (made, imported, retained) with their references: what
     * a release may name, and the bound on what the process may make the worker hold (SV_MAX_VMM_HANDLES). An
     * open-addressing table of twice that many slots; key 0 is empty. */
    uint64_t *hkey;
    uint32_t *hrefs;
    uint32_t hcount;
    char *err;
    size_t errlen;
} svc;

static int fail(svc *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(svc *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, s->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* Whether the client's end of the socket is gone (closed, or its process dead). */
static bool hung_up(int sock) {
    struct pollfd p = {.fd = sock, .events = POLLRDHUP};
    int n = poll(&p, 1, 0);
    return n > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL));
}

/* The client's records up to head, once there are some; 0 when the client hung up. */
static int wait_work(svc *s, uint64_t *head) {
    struct sv_header *h = &s->sh->h;
    long long t0 = 0;
    for (unsigned i = 1;; i++) {
        *head = atomic_load_explicit(&h->head, memory_order_acquire);
        if (*head != s->tail)
            return 1;
        sv_cpu_relax();
        if ((i & 63) == 0) {
            long long t = sv_now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > 50000) /* spin 50 us, then park */
                break;
        }
    }
    for (;;) {
        /* Dekker with the client: it publishes head, fences, reads wsleep; we store wsleep, fence, read head. */
        uint32_t seq = atomic_load_explicit(&h->wseq, memory_order_relaxed);
        atomic_store_explicit(&h->wsleep, 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_seq_cst);
        *head = atomic_load_explicit(&h->head, memory_order_acquire);
        if (*head != s->tail) {
            atomic_store_explicit(&h->wsleep, 0, memory_order_relaxed);
            return 1;
        }
        sv_futex_wait(&h->wseq, seq, 100000000L); /* 100 ms: the hang-up is looked for between waits */
        atomic_store_explicit(&h->wsleep, 0, memory_order_relaxed);
        *head = atomic_load_explicit(&h->head, memory_order_acquire);
        if (*head != s->tail)
            return 1;
        if (hung_up(s->sock))
            return 0;
    }
}

static void reply_done(svc *s, uint32_t reply, CUresult r, const void *data, uint32_t len) {
    struct sv_reply *rp = &s->sh->reply[reply - 1]; /* checked by the caller */
    if (len > SV_REPLY_DATA)
        len = SV_REPLY_DATA;
    if (len)
        memcpy(rp->data, data, len);
    rp->len = len;
    rp->result = (int32_t)r;
    atomic_store_explicit(&rp->state, SV_DONE, memory_order_seq_cst);
    if (atomic_load_explicit(&rp->waiting, memory_order_seq_cst))
        sv_futex_wake(&rp->state);
}

static void stage_free(svc *s, uint32_t slot) {
    struct sv_header *h = &s->sh->h;
    atomic_store_explicit(&s->sh->stagehdr[slot].state, SV_FREE, memory_order_seq_cst);
    if (atomic_load_explicit(&h->stage_wait, memory_order_seq_cst) && atomic_exchange(&h->stage_wait, 0)) {
        atomic_fetch_add(&h->stage_seq, 1);
        sv_futex_wake(&h->stage_seq);
    }
}

static void stage_done(svc *s, uint32_t slot, CUresult r, uint32_t len) {
    struct sv_stagehdr *sh = &s->sh->stagehdr[slot];
    sh->result = (int32_t)r;
    sh->len = len;
    atomic_store_explicit(&sh->state, SV_DONE, memory_order_seq_cst);
    if (atomic_load_explicit(&sh->waiting, memory_order_seq_cst))
        sv_futex_wake(&sh->state);
}

/* ---- handles ---- */

static void *get(svc *s, unsigned kind, uint32_t id) { return id < sv_cap(kind) ? s->tab[kind][id] : NULL; }

/* A creation's id: in range and free. */
static bool id_free(svc *s, unsigned kind, uint32_t id) {
    return id > 0 && id < sv_cap(kind) && s->tab[kind][id] == NULL;
}

/* ---- VMM handles ---- */

#define HSLOTS (2u * SV_MAX_VMM_HANDLES)

static uint32_t hslot(uint64_t h) { return (uint32_t)((h * 0x9E3779B97F4A7C15ull) >> 40) & (HSLOTS - 1); }

/* The slot of h, or of the empty slot where it would go. */
static uint32_t hfind(const svc *s, uint64_t h) {
    uint32_t i = hslot(h);
    while (s->hkey[i] && s->hkey[i] != h)
        i = (i + 1) & (HSLOTS - 1);
    return i;
}

static bool hfull(const svc *s) { return s->hcount >= SV_MAX_VMM_HANDLES; }

/* One more reference to h (a creation, an import, a retain); the caller checked hfull for a new one. */
static void hadd(svc *s, uint64_t h) {
    uint32_t i = hfind(s, h);
    if (s->hkey[i] == h) {
        s->hrefs[i]++;
        return;
    }
    s->hkey[i] = h;
    s->hrefs[i] = 1;
    s->hcount++;
}

static bool hhas(const svc *s, uint64_t h) { return h && s->hkey[hfind(s, h)] == h; }

/* One reference less; at none the slot empties (backward shift: no tombstones, probes stay short). */
static void hdrop(svc *s, uint64_t h) {
    uint32_t i = hfind(s, h);
    if (s->hkey[i] != h || --s->hrefs[i] > 0)
        return;
    s->hcount--;
    uint32_t j = i;
    for (;;) {
        s->hkey[i] = 0;
        for (;;) {
            j = (j + 1) & (HSLOTS - 1);
            if (!s->hkey[j])
                return;
            uint32_t home = hslot(s->hkey[j]);
            /* j's entry may move to i when its home is not in (i, j] (cyclically) */
            if (i <= j ? (home <= i || home > j) : (home <= i && home > j))
                break;
        }
        s->hkey[i] = s->hkey[j];
        s->hrefs[i] = s->hrefs[j];
        i = j;
    }
}

static CUresult stream_of(svc *s, uint32_t v, CUstream *out) {
    switch (v) {
    case SV_STREAM_NULL: *out = NULL; return CUDA_SUCCESS;
    case SV_STREAM_LEGACY: *out = CU_STREAM_LEGACY; return CUDA_SUCCESS;
    case SV_STREAM_PER_THREAD: *out = CU_STREAM_PER_THREAD; return CUDA_SUCCESS;
    default: *out = get(s, SV_K_STREAM, v); return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    }
}

/* blas.c's view of the streams. */
static CUresult blas_stream(void *arg, uint32_t v, CUstream *out) { return stream_of(arg, v, out); }

static void layout_free(struct wlayout *l) {
    free(l->off);
    free(l->size);
    memset(l, 0, sizeof *l);
}

/* A function's or kernel's parameters as the driver reports them. */
static CUresult layout_query(struct wlayout *l, CUfunction f, CUkernel k) {
    uint32_t cap = 16;
    memset(l, 0, sizeof *l);
    l->off = malloc(cap * sizeof *l->off);
    l->size = malloc(cap * sizeof *l->size);
    if (!l->off || !l->size) {
        layout_free(l);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0;; i++) {
        size_t off = 0, size = 0;
        CUresult r = f ? p_cuFuncGetParamInfo(f, i, &off, &size) : p_cuKernelGetParamInfo(k, i, &off, &size);
        if (r == CUDA_ERROR_INVALID_VALUE)
            break; /* past the last parameter */
        if (r != CUDA_SUCCESS) {
            layout_free(l);
            return r;
        }
        if (i >= SV_MAX_PARAMS || off + size > SV_MAX_PARAM_BYTES) {
            layout_free(l);
            return CUDA_ERROR_NOT_SUPPORTED; /* more than a layout reply holds */
        }
        if (l->n == cap) {
            cap *= 2;
            uint32_t *o = realloc(l->off, cap * sizeof *o);
            if (o)
                l->off = o;
            uint32_t *z = realloc(l->size, cap * sizeof *z);
            if (z)
                l->size = z;
            if (!o || !z) {
                layout_free(l);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        l->off[l->n] = (uint32_t)off;
        l->size[l->n] = (uint32_t)size;
        l->n++;
        if (off + size > l->bytes)
            l->bytes = (uint32_t)(off + size);
    }
    return CUDA_SUCCESS;
}

static uint32_t layout_reply(const struct wlayout *l, struct sv_layout *out) {
    out->n = l->n;
    out->bytes = l->bytes;
    for (uint32_t i = 0; i < l->n; i++) {
        out->p[i].off = l->off[i];
        out->p[i].size = l->size[i];
    }
    return (uint32_t)(offsetof(struct sv_layout, p) + l->n * sizeof out->p[0]);
}

/* ---- records ---- */

/* The payload of a record, copied: NULL when the record is too short for it. */
#define PAYLOAD(type, var)                                                                                             \
    type var;                                                                                                          \
    if (plen < sizeof var)                                                                                             \
        return fail(s, "record %s at %llu: %u bytes, too short", #type, (unsigned long long)s->tail, (unsigned)plen);  \
    memcpy(&var, pl, sizeof var)

/* A name that follows a payload of hdr bytes: NUL-terminated within the record, else NULL. */
static const char *name_after(const uint8_t *pl, uint32_t plen, size_t hdr, char *buf, size_t cap) {
    if (plen <= hdr)
        return NULL;
    size_t n = plen - hdr < cap ? plen - hdr : cap;
    memcpy(buf, pl + hdr, n);
    const char *z = memchr(buf, 0, n);
    return z ? buf : NULL;
}

static CUresult run_query(svc *s, const struct sv_query_rec *q, uint8_t *out, uint32_t *len) {
    (void)s;
    CUresult r;
    switch (q->what) {
    case SV_Q_NAME:
        r = p_cuDeviceGetName((char *)out, 256, W.dev);
        *len = r == CUDA_SUCCESS ? (uint32_t)strnlen((char *)out, 255) + 1 : 0;
        return r;
    case SV_Q_ATTR: {
        int v = 0;
        r = p_cuDeviceGetAttribute(&v, (CUdevice_attribute)q->arg, W.dev);
        memcpy(out, &v, sizeof v);
        *len = sizeof v;
        return r;
    }
    case SV_Q_BUSID:
        r = p_cuDeviceGetPCIBusId((char *)out, 64, W.dev);
        *len = r == CUDA_SUCCESS ? (uint32_t)strnlen((char *)out, 63) + 1 : 0;
        return r;
    case SV_Q_TOTALMEM: {
        size_t b = 0;
        r = p_cuDeviceTotalMem(&b, W.dev);
        uint64_t v = b;
        memcpy(out, &v, sizeof v);
        *len = sizeof v;
        return r;
    }
    case SV_Q_UUID: {
        CUuuid u;
        r = p_cuDeviceGetUuid_v2(&u, W.dev);
        memcpy(out, &u, sizeof u);
        *len = sizeof u;
        return r;
    }
    case SV_Q_DRIVER_VERSION: {
        int v = 0;
        r = p_cuDriverGetVersion(&v);
        memcpy(out, &v, sizeof v);
        *len = sizeof v;
        return r;
    }
    case SV_Q_MEMINFO: {
        size_t f = 0, t = 0;
        r = p_cuMemGetInfo(&f, &t);
        uint64_t v[2] = {f, t};
        memcpy(out, v, sizeof v);
        *len = sizeof v;
        return r;
    }
    case SV_Q_PRIMARY_STATE: {
        unsigned flags = 0;
        int active = 0;
        r = p_cuDevicePrimaryCtxGetState(W.dev, &flags, &active);
        uint32_t v[2] = {flags, (uint32_t)active};
        memcpy(out, v, sizeof v);
        *len = sizeof v;
        return r;
    }
    case SV_Q_PRIO_RANGE: {
        int v[2] = {0, 0};
        r = p_cuCtxGetStreamPriorityRange(&v[0], &v[1]);
        int32_t w[2] = {v[0], v[1]};
        memcpy(out, w, sizeof w);
        *len = sizeof w;
        return r;
    }
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

/*
 * A module or library image sent ahead of its load, exactly size bytes, NUL-terminated past them (PTX). The
 * driver reads a binary image as far as its headers say, with no length given: an image whose headers claim
 * more than was sent would have it read past the buffer, so it is refused here. A fat binary's wrapper holds a
 * pointer into the client's memory: the client sends the fat binary itself.
 */
static CUresult take_image(svc *s, uint64_t size) {
    if (size == 0 || size != s->image_len)
        return CUDA_ERROR_INVALID_VALUE;
    const uint8_t *p = s->image;
    uint32_t magic = 0;
    if (size >= 4)
        memcpy(&magic, p, 4);
    if (magic == 0x466243B1u)
        return CUDA_ERROR_INVALID_IMAGE;
    if (magic == 0xBA55ED50u) {
        uint16_t hs;
        uint64_t fs;
        if (size < 16)
            return CUDA_ERROR_INVALID_IMAGE;
        memcpy(&hs, p + 6, 2);
        memcpy(&fs, p + 8, 8);
        if (hs < 16 || fs > size || hs > size - fs)
            return CUDA_ERROR_INVALID_IMAGE;
    } else if (size >= 4 && p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F') {
        uint64_t shoff, phoff;
        uint16_t shentsize, shnum, phentsize, phnum;
        if (size < 0x40 || p[4] != 2)
            return CUDA_ERROR_INVALID_IMAGE;
        memcpy(&phoff, p + 0x20, 8);
        memcpy(&shoff, p + 0x28, 8);
        memcpy(&phentsize, p + 0x36, 2);
        memcpy(&phnum, p + 0x38, 2);
        memcpy(&shentsize, p + 0x3a, 2);
        memcpy(&shnum, p + 0x3c, 2);
        if (shoff > size || (uint64_t)shentsize * shnum > size - shoff || phoff > size ||
            (uint64_t)phentsize * phnum > size - phoff)
            return CUDA_ERROR_INVALID_IMAGE;
    }
    return CUDA_SUCCESS;
}

/* The function a record names: a function, or a kernel's function in this context (the driver's attribute and
 * occupancy calls take functions). */
static CUresult func_named(svc *s, uint32_t id, bool kernel, CUfunction *f) {
    if (kernel) {
        struct wkern *k = get(s, SV_K_KERNEL, id);
        return k ? p_cuKernelGetFunction(f, k->k) : CUDA_ERROR_INVALID_HANDLE;
    }
    struct wfunc *fn = get(s, SV_K_FUNC, id);
    if (!fn)
        return CUDA_ERROR_INVALID_HANDLE;
    *f = fn->f;
    return CUDA_SUCCESS;
}

static CUresult run_func_attr(svc *s, const struct sv_func_attr_rec *q, int32_t *out) {
    CUfunction f = NULL;
    CUresult r = func_named(s, q->func, q->kernel != 0, &f);
    if (r != CUDA_SUCCESS)
        return r;
    int v = 0;
    switch (q->what) {
    case SV_FA_GET: r = p_cuFuncGetAttribute(&v, (CUfunction_attribute)q->attr, f); break;
    case SV_FA_SET: r = p_cuFuncSetAttribute(f, (CUfunction_attribute)q->attr, q->value); break;
    case SV_FA_CACHE: r = p_cuFuncSetCacheConfig(f, (CUfunc_cache)q->value); break;
    case SV_FA_OCCUPANCY:
        r = p_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&v, f, q->attr, (size_t)q->dyn, q->flags);
        break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    *out = v;
    return r;
}

/* The bytes the driver writes for a pointer attribute; 0: one the worker does not take (its size unknown here,
 * or more than a reply's slot: P2P tokens). */
static size_t ptr_attr_bytes(uint32_t a) {
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: return 8;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: return 4;
    default: return 0;
    }
}

/* Each attribute into its own zeroed 8-byte slot; the context and device as the application knows them. */
static CUresult run_pointer_attrs(const struct sv_ptr_rec *q, uint8_t *out, uint32_t *len) {
    if (q->n == 0 || q->n > SV_MAX_PTR_ATTRS || (q->single && q->n != 1))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t v[SV_MAX_PTR_ATTRS];
    void *data[SV_MAX_PTR_ATTRS];
    CUpointer_attribute attrs[SV_MAX_PTR_ATTRS];
    memset(v, 0, sizeof v);
    for (uint32_t i = 0; i < q->n; i++) {
        if (!ptr_attr_bytes(q->attr[i]))
            return CUDA_ERROR_INVALID_VALUE;
        attrs[i] = (CUpointer_attribute)q->attr[i];
        data[i] = &v[i];
    }
    CUresult r = q->single ? p_cuPointerGetAttribute(data[0], attrs[0], q->ptr)
                           : p_cuPointerGetAttributes(q->n, attrs, data, q->ptr);
    for (uint32_t i = 0; i < q->n; i++) {
        if (attrs[i] == CU_POINTER_ATTRIBUTE_CONTEXT) {
            CUcontext c;
            memcpy(&c, &v[i], sizeof c);
            v[i] = c && c == W.ctx ? SV_PTR_CTX_OURS : 0; /* never the worker's handle */
        } else if (attrs[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
            int32_t d;
            memcpy(&d, &v[i], sizeof d);
            if (d == (int32_t)W.dev)
                d = 0; /* the application sees the worker's device as 0 */
            v[i] = (uint32_t)d;
        } else if (attrs[i] == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE) {
            v[i] = 0;
        }
    }
    memcpy(out, v, q->n * sizeof v[0]);
    *len = q->n * (uint32_t)sizeof v[0];
    return r;
}

static void drop_image(svc *s) {
    free(s->image);
    s->image = NULL;
    s->image_len = s->image_cap = 0;
}

static CUresult run_launch(svc *s, const uint8_t *pl, uint32_t plen) {
    struct sv_launch_rec L;
    memcpy(&L, pl, sizeof L); /* the caller checked plen */
    if (L.nbytes > SV_MAX_PARAM_BYTES || L.nbytes > plen - sizeof L)
        return CUDA_ERROR_INVALID_VALUE;
    const uint8_t *args = pl + sizeof L;
    CUfunction f;
    const struct wlayout *l;
    if (L.kernel) {
        struct wkern *k = get(s, SV_K_KERNEL, L.func);
        if (!k)
            return CUDA_ERROR_INVALID_HANDLE;
        f = (CUfunction)k->k;
        l = &k->l;
    } else {
        struct wfunc *fn = get(s, SV_K_FUNC, L.func);
        if (!fn)
            return CUDA_ERROR_INVALID_HANDLE;
        f = fn->f;
        l = &fn->l;
    }
    CUstream st;
    CUresult r = stream_of(s, L.stream, &st);
    if (r != CUDA_SUCCESS)
        return r;
    void *kp[SV_MAX_PARAMS + 1];
    size_t nb = L.nbytes;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, (void *)args, CU_LAUNCH_PARAM_BUFFER_SIZE, &nb,
                     CU_LAUNCH_PARAM_END};
    void **kpp = NULL, **ex = NULL;
    if (L.extra) {
        ex = extra;
    } else {
        if (L.nbytes < l->bytes)
            return CUDA_ERROR_INVALID_VALUE;
        for (uint32_t i = 0; i < l->n; i++)
            kp[i] = (void *)(args + l->off[i]); /* off + size <= bytes <= nbytes: inside the record */
        kpp = kp;
    }
    if (L.cooperative) {
        CUlaunchAttribute attr;
        memset(&attr, 0, sizeof attr);
        attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attr.value.cooperative = 1;
        CUlaunchConfig cfg = {L.grid[0],  L.grid[1], L.grid[2], L.block[0], L.block[1],
                              L.block[2], L.shmem,   st,        &attr,      1};
        return p_cuLaunchKernelEx(&cfg, f, kpp, ex);
    }
    return p_cuLaunchKernel(f, L.grid[0], L.grid[1], L.grid[2], L.block[0], L.block[1], L.block[2], L.shmem, st, kpp,
                            ex);
}

/* JIT options whose value the driver writes back, and the log buffers, which the worker provides. */
enum { JIT_WALL_TIME = 2, JIT_INFO_LOG = 3, JIT_INFO_LOG_SIZE = 4, JIT_ERROR_LOG = 5, JIT_ERROR_LOG_SIZE = 6 };
#define JIT_LOG_BYTES 1024u

/* cuLibraryLoadData: reply data is the option values after the call, then the error log and the info log. */
static CUresult run_library_load(svc *s, const struct sv_load_rec *L, uint8_t *out, uint32_t *outlen) {
    if (L->njit > SV_MAX_JIT)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = take_image(s, L->size);
    if (r != CUDA_SUCCESS)
        return r;
    if (!id_free(s, SV_K_LIBRARY, L->id))
        return CUDA_ERROR_INVALID_HANDLE;
    char elog[JIT_LOG_BYTES], ilog[JIT_LOG_BYTES];
    elog[0] = ilog[0] = 0;
    CUjit_option opt[SV_MAX_JIT];
    void *val[SV_MAX_JIT];
    for (uint32_t i = 0; i < L->njit; i++) {
        opt[i] = (CUjit_option)L->jit_opt[i];
        switch (L->jit_opt[i]) {
        case JIT_INFO_LOG: val[i] = ilog; break;
        case JIT_ERROR_LOG: val[i] = elog; break;
        case JIT_INFO_LOG_SIZE:
        case JIT_ERROR_LOG_SIZE: val[i] = (void *)(uintptr_t)JIT_LOG_BYTES; break;
        default: val[i] = (void *)(uintptr_t)L->jit_val[i]; break; /* by value */
        }
    }
    CUlibrary lib = NULL;
    r = p_cuLibraryLoadData(&lib, s->image, L->njit ? opt : NULL, L->njit ? val : NULL, L->njit, NULL, NULL, 0);
    drop_image(s);
    if (r == CUDA_SUCCESS)
        s->tab[SV_K_LIBRARY][L->id] = lib;
    uint64_t vals[SV_MAX_JIT] = {0};
    for (uint32_t i = 0; i < L->njit; i++)
        vals[i] = (uint64_t)(uintptr_t)val[i];
    size_t n = L->njit * sizeof vals[0];
    memcpy(out, vals, n);
    elog[JIT_LOG_BYTES - 1] = ilog[JIT_LOG_BYTES - 1] = 0;
    size_t el = strlen(elog) + 1, il = strlen(ilog) + 1;
    memcpy(out + n, elog, el);
    memcpy(out + n + el, ilog, il);
    *outlen = (uint32_t)(n + el + il);
    return r;
}

static CUresult run_vmm(svc *s, unsigned op, const struct sv_vmm_rec *v, uint8_t *out, uint32_t *len) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = (CUmemLocationType)v->loc_type;
    prop.location.id = v->loc_id;
    prop.requestedHandleTypes = (CUmemAllocationHandleType)v->handle_types;
    /* Memory on the worker's device only: the application sees that one device, as 0. */
    if ((op == SV_OP_VMM_GRANULARITY || op == SV_OP_VMM_CREATE) &&
        (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != 0))
        return CUDA_ERROR_NOT_SUPPORTED;
    prop.location.id = W.dev;
    CUresult r;
    switch (op) {
    case SV_OP_VMM_GRANULARITY: {
        size_t g = 0;
        r = p_cuMemGetAllocationGranularity(&g, &prop, (CUmemAllocationGranularity_flags)v->option);
        uint64_t g64 = g;
        memcpy(out, &g64, sizeof g64);
        *len = sizeof g64;
        return r;
    }
    case SV_OP_VMM_RESERVE: {
        CUdeviceptr p = 0;
        r = window_reserve(&p, v->a, v->b, v->c, v->d);
        uint64_t p64 = p;
        memcpy(out, &p64, sizeof p64);
        *len = sizeof p64;
        return r;
    }
    case SV_OP_VMM_ADDR_FREE: return window_free(v->a, v->b);
    case SV_OP_VMM_CREATE: {
        CUmemGenericAllocationHandle h = 0;
        if (hfull(s))
            return CUDA_ERROR_OUT_OF_MEMORY; /* the process holds SV_MAX_VMM_HANDLES already */
        r = p_cuMemCreate(&h, v->a, &prop, v->b);
        if (r == CUDA_SUCCESS)
            hadd(s, h);
        uint64_t h64 = h;
        memcpy(out, &h64, sizeof h64);
        *len = sizeof h64;
        return r;
    }
    case SV_OP_VMM_RELEASE:
        /* Only a handle this worker gave the process: the driver is not handed values it never made. */
        if (!hhas(s, v->a))
            return CUDA_ERROR_INVALID_VALUE;
        if ((r = p_cuMemRelease(v->a)) == CUDA_SUCCESS)
            hdrop(s, v->a);
        return r;
    case SV_OP_VMM_MAP: return p_cuMemMap(v->a, v->b, v->c, v->d, v->e);
    case SV_OP_VMM_UNMAP: return p_cuMemUnmap(v->a, v->b);
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

/* ---- descriptors over the socket (served.h: VMM handles across processes) ---- */

#define FD_WAIT_MS 10000 /* the client sent the descriptor before it published the record: it is there already */

/*
 * The descriptor of the import record seq: exactly one message, which must name seq and carry exactly one
 * descriptor (any more are closed). 0 with *fd, or -1 (err filled): the socket no longer matches the ring.
 */
static int recv_fd(svc *s, uint64_t seq, int *fd) {
    struct sv_fdmsg m;
    char cbuf[CMSG_SPACE(sizeof(int) * 4)];
    struct iovec iov = {&m, sizeof m};
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    ssize_t n;
    *fd = -1;
    for (;;) {
        struct pollfd p = {.fd = s->sock, .events = POLLIN};
        int pr = poll(&p, 1, FD_WAIT_MS);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return fail(s, "import record %llu: no descriptor on the socket within %d ms", (unsigned long long)seq,
                        FD_WAIT_MS);
        n = recvmsg(s->sock, &h, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        break;
    }
    int got = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int f;
            memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
            if (got++ == 0)
                *fd = f;
            else
                close(f); /* a record makes the worker hold one descriptor, for the length of the import */
        }
    }
    if (n != (ssize_t)sizeof m || m.magic != SV_FD_MAGIC || m.seq != seq || got != 1 || (h.msg_flags & MSG_CTRUNC)) {
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        if (n == 0)
            return fail(s, "import record %llu: the client closed its socket", (unsigned long long)seq);
        return fail(s, "import record %llu: the socket's message (%zd bytes, seq %llu, %d descriptors) is not its own",
                    (unsigned long long)seq, n, n == (ssize_t)sizeof m ? (unsigned long long)m.seq : 0ull, got);
    }
    return 0;
}

/* Sends fd with the message of seq: 0, or -1 (the client is gone or its socket full). */
static int send_fd(svc *s, uint64_t seq, int fd) {
    struct sv_fdmsg m = {SV_FD_MAGIC, 0, seq};
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {&m, sizeof m};
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    ssize_t n;
    do
        n = sendmsg(s->sock, &h, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof m ? 0 : -1;
}

/* SV_OP_VMM_IMPORT, EXPORT, RETAIN, PROPS: 0, or -1 when the socket no longer matches the ring (err filled). */
static int run_share(svc *s, unsigned op, const struct sv_fd_rec *q, uint8_t *out, uint32_t *len, CUresult *res) {
    CUresult r = CUDA_SUCCESS;
    CUmemGenericAllocationHandle h = 0;
    switch (op) {
    case SV_OP_VMM_IMPORT: {
        int fd;
        if (recv_fd(s, q->seq, &fd) != 0)
            return -1;
        if (q->type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
            r = CUDA_ERROR_NOT_SUPPORTED;
        else if (hfull(s))
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else if ((r = p_cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) == CUDA_SUCCESS)
            hadd(s, h);
        close(fd); /* the driver keeps what it needs of it */
        break;
    }
    case SV_OP_VMM_EXPORT: {
        int fd = -1;
        if (q->type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
            r = CUDA_ERROR_NOT_SUPPORTED;
        else if (!hhas(s, q->handle))
            r = CUDA_ERROR_INVALID_VALUE;
        else if ((r = p_cuMemExportToShareableHandle(&fd, q->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) ==
                 CUDA_SUCCESS) {
            if (send_fd(s, q->seq, fd) != 0)
                r = CUDA_ERROR_OPERATING_SYSTEM;
            close(fd); /* sent: the client's copy is the one that counts */
        }
        break;
    }
    case SV_OP_VMM_RETAIN:
        if (hfull(s))
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else if ((r = p_cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)q->handle)) == CUDA_SUCCESS)
            hadd(s, h);
        break;
    case SV_OP_VMM_PROPS: {
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        struct sv_props o;
        memset(&o, 0, sizeof o);
        if (!hhas(s, q->handle)) {
            r = CUDA_ERROR_INVALID_VALUE;
        } else if ((r = p_cuMemGetAllocationPropertiesFromHandle(&p, q->handle)) == CUDA_SUCCESS) {
            o.type = (uint32_t)p.type;
            o.handle_types = (uint32_t)p.requestedHandleTypes;
            o.loc_type = (uint32_t)p.location.type;
            /* the application knows the worker's device as 0 */
            o.loc_id = p.location.type == CU_MEM_LOCATION_TYPE_DEVICE && p.location.id == W.dev ? 0 : p.location.id;
            o.compression = p.allocFlags.compressionType;
            o.rdma = p.allocFlags.gpuDirectRDMACapable;
            o.usage = p.allocFlags.usage;
        }
        memcpy(out, &o, sizeof o);
        *len = sizeof o;
        *res = r;
        return 0;
    }
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t h64 = h;
    memcpy(out, &h64, sizeof h64);
    *len = sizeof h64;
    *res = r;
    return 0;
}

/* One record: 0, or -1 when the ring is broken (err filled). */
static int run_record(svc *s, const struct sv_rec *rec, const uint8_t *pl, uint32_t plen) {
    uint8_t out[SV_REPLY_DATA];
    uint32_t olen = 0;
    CUresult r = CUDA_SUCCESS;
    bool answered = false; /* the reply was posted (or none is due) */
    CUstream st = NULL;
    if (rec->reply > SV_NREPLY)
        return fail(s, "record at %llu: reply slot %u of %u", (unsigned long long)s->tail, rec->reply, SV_NREPLY);

    switch (rec->op) {
    case SV_OP_PAD: return 0;
    case SV_OP_QUERY: {
        PAYLOAD(struct sv_query_rec, q);
        r = run_query(s, &q, out, &olen);
        break;
    }
    case SV_OP_PRIMARY_SET_FLAGS: {
        PAYLOAD(struct sv_id_rec, q);
        r = p_cuDevicePrimaryCtxSetFlags(W.dev, q.flags);
        break;
    }
    case SV_OP_CTX_SYNC: r = p_cuCtxSynchronize(); break;
    case SV_OP_MEM_ALLOC: {
        PAYLOAD(struct sv_u64_rec, q);
        CUdeviceptr p = 0;
        r = p_cuMemAlloc(&p, q.v);
        uint64_t v = p;
        memcpy(out, &v, 8);
        olen = 8;
        break;
    }
    case SV_OP_MEM_ALLOC_PITCH: {
        PAYLOAD(struct sv_pitch_rec, q);
        CUdeviceptr p = 0;
        size_t pitch = 0;
        r = p_cuMemAllocPitch(&p, &pitch, q.width, q.height, q.elem);
        uint64_t v[2] = {p, pitch};
        memcpy(out, v, sizeof v);
        olen = sizeof v;
        break;
    }
    case SV_OP_MEM_FREE: {
        PAYLOAD(struct sv_u64_rec, q);
        r = p_cuMemFree(q.v);
        break;
    }
    case SV_OP_MEM_RANGE: {
        PAYLOAD(struct sv_u64_rec, q);
        CUdeviceptr b = 0;
        size_t sz = 0;
        r = p_cuMemGetAddressRange(&b, &sz, q.v);
        uint64_t v[2] = {b, sz};
        memcpy(out, v, sizeof v);
        olen = sizeof v;
        break;
    }
    case SV_OP_MEM_ALLOC_ASYNC: {
        PAYLOAD(struct sv_mem_async_rec, q);
        CUdeviceptr p = 0;
        if ((r = stream_of(s, q.stream, &st)) == CUDA_SUCCESS)
            r = p_cuMemAllocAsync(&p, q.v, st);
        uint64_t v = p;
        memcpy(out, &v, 8);
        olen = 8;
        break;
    }
    case SV_OP_MEM_FREE_ASYNC: {
        PAYLOAD(struct sv_mem_async_rec, q);
        if ((r = stream_of(s, q.stream, &st)) == CUDA_SUCCESS)
            r = p_cuMemFreeAsync(q.v, st);
        break;
    }
    case SV_OP_HTOD: {
        PAYLOAD(struct sv_copy_rec, q);
        if (q.stage >= SV_NSTAGE || q.len > SV_STAGE_BYTES)
            return fail(s, "HtoD chunk at %llu: staging slot %u, %u bytes", (unsigned long long)s->tail, q.stage,
                        q.len);
        const void *src = s->sh->stage[q.stage];
        /* From pageable memory (the staging area is, to the driver), the async copy returns once the driver
         * took the source: the slot is free again when the call returns, on the simulator and on CUDA. */
        if (q.async) {
            if ((r = stream_of(s, q.stream, &st)) == CUDA_SUCCESS)
                r = p_cuMemcpyHtoDAsync(q.dev, src, q.len, st);
        } else {
            r = p_cuMemcpyHtoD(q.dev, src, q.len);
        }
        stage_free(s, q.stage);
        break;
    }
    case SV_OP_DTOH: {
        PAYLOAD(struct sv_copy_rec, q);
        if (q.stage >= SV_NSTAGE || q.len > SV_STAGE_BYTES)
            return fail(s, "DtoH chunk at %llu: staging slot %u, %u bytes", (unsigned long long)s->tail, q.stage,
                        q.len);
        void *dst = s->sh->stage[q.stage];
        /* Into pageable memory the async copy returns when it is done: the data is there for the client. */
        if (q.async) {
            if ((r = stream_of(s, q.stream, &st)) == CUDA_SUCCESS)
                r = p_cuMemcpyDtoHAsync(dst, q.dev, q.len, st);
        } else {
            r = p_cuMemcpyDtoH(dst, q.dev, q.len);
        }
        stage_done(s, q.stage, r, q.len);
        answered = true;
        break;
    }
    case SV_OP_DTOD: {
        PAYLOAD(struct sv_dtod_rec, q);
        if (q.async) {
            if ((r = stream_of(s, q.stream, &st)) == CUDA_SUCCESS)
                r = p_cuMemcpyDtoDAsync(q.dst, q.src, q.len, st);
        } else {
            r = p_cuMemcpyDtoD(q.dst, q.src, q.len);
        }
        break;
    }
    case SV_OP_MEMSET: {
        PAYLOAD(struct sv_memset_rec, q);
        if (q.async && (r = stream_of(s, q.stream, &st)) != CUDA_SUCCESS)
            break;
        switch (q.elem * 2 + (q.async ? 1 : 0)) {
        case 2: r = p_cuMemsetD8(q.dst, (unsigned char)q.val, q.n); break;
        case 3: r = p_cuMemsetD8Async(q.dst, (unsigned char)q.val, q.n, st); break;
        case 4: r = p_cuMemsetD16(q.dst, (unsigned short)q.val, q.n); break;
        case 5: r = p_cuMemsetD16Async(q.dst, (unsigned short)q.val, q.n, st); break;
        case 8: r = p_cuMemsetD32(q.dst, q.val, q.n); break;
        case 9: r = p_cuMemsetD32Async(q.dst, q.val, q.n, st); break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
        break;
    }
    case SV_OP_STREAM_CREATE: {
        PAYLOAD(struct sv_id_rec, q);
        CUstream h = NULL;
        if (q.id < SV_STREAM_FIRST_ID || !id_free(s, SV_K_STREAM, q.id))
            r = CUDA_ERROR_INVALID_HANDLE;
        else if ((r = p_cuStreamCreate(&h, q.flags)) == CUDA_SUCCESS)
            s->tab[SV_K_STREAM][q.id] = h;
        break;
    }
    case SV_OP_STREAM_DESTROY: {
        PAYLOAD(struct sv_id_rec, q);
        CUstream h = q.id >= SV_STREAM_FIRST_ID ? get(s, SV_K_STREAM, q.id) : NULL;
        if (!h) {
            r = CUDA_ERROR_INVALID_HANDLE;
        } else {
            r = p_cuStreamDestroy(h);
            s->tab[SV_K_STREAM][q.id] = NULL; /* gone either way: the client dropped the id */
        }
        break;
    }
    case SV_OP_STREAM_SYNC:
    case SV_OP_STREAM_QUERY: {
        PAYLOAD(struct sv_id_rec, q);
        if ((r = stream_of(s, q.id, &st)) == CUDA_SUCCESS)
            r = rec->op == SV_OP_STREAM_SYNC ? p_cuStreamSynchronize(st) : p_cuStreamQuery(st);
        break;
    }
    case SV_OP_STREAM_WAIT_EVENT: {
        PAYLOAD(struct sv_pair_rec, q);
        CUevent e = get(s, SV_K_EVENT, q.b);
        if (!e)
            r = CUDA_ERROR_INVALID_HANDLE;
        else if ((r = stream_of(s, q.a, &st)) == CUDA_SUCCESS)
            r = p_cuStreamWaitEvent(st, e, q.flags);
        break;
    }
    case SV_OP_STREAM_BEGIN_CAPTURE: {
        PAYLOAD(struct sv_pair_rec, q);
        if ((r = stream_of(s, q.a, &st)) == CUDA_SUCCESS)
            r = p_cuStreamBeginCapture_v2(st, (CUstreamCaptureMode)q.flags);
        break;
    }
    case SV_OP_STREAM_END_CAPTURE: {
        PAYLOAD(struct sv_pair_rec, q); /* a: the stream, b: the graph's id */
        CUgraph g = NULL;
        if (!id_free(s, SV_K_GRAPH, q.b))
            r = CUDA_ERROR_INVALID_HANDLE;
        else if ((r = stream_of(s, q.a, &st)) == CUDA_SUCCESS && (r = p_cuStreamEndCapture(st, &g)) == CUDA_SUCCESS)
            s->tab[SV_K_GRAPH][q.b] = g;
        break;
    }
    case SV_OP_STREAM_MEMOP: {
        PAYLOAD(struct sv_memop_rec, q);
        if ((r = stream_of(s, q.stream, &st)) != CUDA_SUCCESS)
            break;
        switch (q.kind) {
        case 0: r = p_cuStreamWriteValue32(st, q.addr, (cuuint32_t)q.value, q.flags); break;
        case 1: r = p_cuStreamWriteValue64(st, q.addr, q.value, q.flags); break;
        case 2: r = p_cuStreamWaitValue32(st, q.addr, (cuuint32_t)q.value, q.flags); break;
        case 3: r = p_cuStreamWaitValue64(st, q.addr, q.value, q.flags); break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
        break;
    }
    case SV_OP_EVENT_CREATE: {
        PAYLOAD(struct sv_id_rec, q);
        CUevent e = NULL;
        if (!id_free(s, SV_K_EVENT, q.id))
            r = CUDA_ERROR_INVALID_HANDLE;
        else if ((r = p_cuEventCreate(&e, q.flags)) == CUDA_SUCCESS)
            s->tab[SV_K_EVENT][q.id] = e;
        break;
    }
    case SV_OP_EVENT_DESTROY: {
        PAYLOAD(struct sv_id_rec, q);
        CUevent e = get(s, SV_K_EVENT, q.id);
        if (!e) {
            r = CUDA_ERROR_INVALID_HANDLE;
        } else {
            r = p_cuEventDestroy(e);
            s->tab[SV_K_EVENT][q.id] = NULL;
        }
        break;
    }
    case SV_OP_EVENT_RECORD: {
        PAYLOAD(struct sv_pair_rec, q); /* a: the event, b: the stream */
        CUevent e = get(s, SV_K_EVENT, q.a);
        if (!e)
            r = CUDA_ERROR_INVALID_HANDLE;
        else if ((r = stream_of(s, q.b, &st)) == CUDA_SUCCESS)
            r = q.flags ? p_cuEventRecordWithFlags(e, st, q.flags) : p_cuEventRecord(e, st);
        break;
    }
    case SV_OP_EVENT_QUERY:
    case SV_OP_EVENT_SYNC: {
        PAYLOAD(struct sv_id_rec, q);
        CUevent e = get(s, SV_K_EVENT, q.id);
        if (!e)
            r = CUDA_ERROR_INVALID_HANDLE;
        else
            r = rec->op == SV_OP_EVENT_SYNC ? p_cuEventSynchronize(e) : p_cuEventQuery(e);
        break;
    }
    case SV_OP_EVENT_ELAPSED: {
        PAYLOAD(struct sv_pair_rec, q);
        CUevent a = get(s, SV_K_EVENT, q.a), b = get(s, SV_K_EVENT, q.b);
        float ms = 0;
        r = a && b ? p_cuEventElapsedTime(&ms, a, b) : CUDA_ERROR_INVALID_HANDLE;
        memcpy(out, &ms, sizeof ms);
        olen = sizeof ms;
        break;
    }
    case SV_OP_IMAGE_CHUNK: {
        PAYLOAD(struct sv_image_rec, q);
        if (q.stage >= SV_NSTAGE || q.len > SV_STAGE_BYTES)
            return fail(s, "image chunk at %llu: staging slot %u, %u bytes", (unsigned long long)s->tail, q.stage,
                        q.len);
        if (q.off == 0) { /* a new image */
            drop_image(s);
            if (q.total == 0 || q.total > SV_MAX_IMAGE)
                r = CUDA_ERROR_INVALID_VALUE;
            else if (!(s->image = malloc(q.total + 1)))
                r = CUDA_ERROR_OUT_OF_MEMORY;
            else
                s->image_cap = q.total + 1;
        }
        if (r == CUDA_SUCCESS &&
            (!s->image || s->image_cap != q.total + 1 || q.off != s->image_len || q.len > q.total - q.off))
            r = CUDA_ERROR_INVALID_VALUE; /* out of sequence */
        if (r == CUDA_SUCCESS) {
            memcpy(s->image + q.off, s->sh->stage[q.stage], q.len);
            s->image_len += q.len;
            s->image[s->image_len] = 0; /* PTX is text: the driver reads up to a NUL */
        } else {
            drop_image(s);
        }
        stage_free(s, q.stage);
        break;
    }
    case SV_OP_MODULE_LOAD: {
        PAYLOAD(struct sv_load_rec, q);
        CUmodule m = NULL;
        if (!id_free(s, SV_K_MODULE, q.id))
            r = CUDA_ERROR_INVALID_HANDLE;
        else if ((r = take_image(s, q.size)) == CUDA_SUCCESS && (r = p_cuModuleLoadData(&m, s->image)) == CUDA_SUCCESS)
            s->tab[SV_K_MODULE][q.id] = m;
        drop_image(s);
        break;
    }
    case SV_OP_MODULE_UNLOAD:
    case SV_OP_LIBRARY_UNLOAD: {
        PAYLOAD(struct sv_id_rec, q);
        unsigned k = rec->op == SV_OP_MODULE_UNLOAD ? SV_K_MODULE : SV_K_LIBRARY;
        void *h = get(s, k, q.id);
        if (!h) {
            r = CUDA_ERROR_INVALID_HANDLE;
        } else {
            r = k == SV_K_MODULE ? p_cuModuleUnload(h) : p_cuLibraryUnload(h);
            s->tab[k][q.id] = NULL;
        }
        break;
    }
    case SV_OP_LIBRARY_LOAD: {
        PAYLOAD(struct sv_load_rec, q);
        r = run_library_load(s, &q, out, &olen);
        break;
    }
    case SV_OP_MODULE_GET_FUNCTION:
    case SV_OP_LIBRARY_GET_KERNEL:
    case SV_OP_KERNEL_GET_FUNCTION: {
        PAYLOAD(struct sv_get_rec, q);
        char name[SV_MAX_NAME];
        const char *nm = NULL;
        if (rec->op != SV_OP_KERNEL_GET_FUNCTION && !(nm = name_after(pl, plen, sizeof q, name, sizeof name))) {
            r = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        unsigned k = rec->op == SV_OP_LIBRARY_GET_KERNEL ? SV_K_KERNEL : SV_K_FUNC;
        if (!id_free(s, k, q.id)) {
            r = CUDA_ERROR_INVALID_HANDLE;
            break;
        }
        struct wlayout l;
        if (rec->op == SV_OP_LIBRARY_GET_KERNEL) {
            CUlibrary lib = get(s, SV_K_LIBRARY, q.owner);
            CUkernel kern = NULL;
            if (!lib) {
                r = CUDA_ERROR_INVALID_HANDLE;
                break;
            }
            if ((r = p_cuLibraryGetKernel(&kern, lib, nm)) != CUDA_SUCCESS ||
                (r = layout_query(&l, NULL, kern)) != CUDA_SUCCESS)
                break;
            struct wkern *w = malloc(sizeof *w);
            if (!w) {
                layout_free(&l);
                r = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            w->k = kern;
            w->l = l;
            s->tab[SV_K_KERNEL][q.id] = w;
        } else {
            CUfunction f = NULL;
            if (rec->op == SV_OP_MODULE_GET_FUNCTION) {
                CUmodule m = get(s, SV_K_MODULE, q.owner);
                r = m ? p_cuModuleGetFunction(&f, m, nm) : CUDA_ERROR_INVALID_HANDLE;
            } else {
                struct wkern *kk = get(s, SV_K_KERNEL, q.owner);
                r = kk ? p_cuKernelGetFunction(&f, kk->k) : CUDA_ERROR_INVALID_HANDLE;
            }
            if (r != CUDA_SUCCESS || (r = layout_query(&l, f, NULL)) != CUDA_SUCCESS)
                break;
            struct wfunc *w = malloc(sizeof *w);
            if (!w) {
                layout_free(&l);
                r = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            w->f = f;
            w->l = l;
            s->tab[SV_K_FUNC][q.id] = w;
        }
        olen = layout_reply(&l, (struct sv_layout *)(void *)out);
        break;
    }
    case SV_OP_LAUNCH:
        if (plen < sizeof(struct sv_launch_rec))
            return fail(s, "launch record at %llu: %u bytes, too short", (unsigned long long)s->tail, (unsigned)plen);
        r = run_launch(s, pl, plen);
        break;
    case SV_OP_GRAPH_INSTANTIATE: {
        PAYLOAD(struct sv_graph_rec, q);
        CUgraph g = get(s, SV_K_GRAPH, q.graph);
        CUgraphExec e = NULL;
        if (!g || !id_free(s, SV_K_EXEC, q.exec))
            r = CUDA_ERROR_INVALID_HANDLE;
        else if ((r = p_cuGraphInstantiateWithFlags(&e, g, q.flags)) == CUDA_SUCCESS)
            s->tab[SV_K_EXEC][q.exec] = e;
        break;
    }
    case SV_OP_GRAPH_LAUNCH: {
        PAYLOAD(struct sv_graph_rec, q);
        CUgraphExec e = get(s, SV_K_EXEC, q.exec);
        if (!e)
            r = CUDA_ERROR_INVALID_HANDLE;
        else if ((r = stream_of(s, q.graph, &st)) == CUDA_SUCCESS) /* graph: the stream */
            r = p_cuGraphLaunch(e, st);
        break;
    }
    case SV_OP_GRAPH_NODES: {
        PAYLOAD(struct sv_id_rec, q);
        CUgraph g = get(s, SV_K_GRAPH, q.id);
        size_t n = 0;
        r = g ? p_cuGraphGetNodes(g, NULL, &n) : CUDA_ERROR_INVALID_HANDLE;
        uint64_t n64 = n;
        memcpy(out, &n64, sizeof n64);
        olen = sizeof n64;
        break;
    }
    case SV_OP_GRAPH_EXEC_DESTROY:
    case SV_OP_GRAPH_DESTROY: {
        PAYLOAD(struct sv_id_rec, q);
        unsigned k = rec->op == SV_OP_GRAPH_DESTROY ? SV_K_GRAPH : SV_K_EXEC;
        void *h = get(s, k, q.id);
        if (!h) {
            r = CUDA_ERROR_INVALID_HANDLE;
        } else {
            r = k == SV_K_GRAPH ? p_cuGraphDestroy(h) : p_cuGraphExecDestroy(h);
            s->tab[k][q.id] = NULL;
        }
        break;
    }
    case SV_OP_VMM_GRANULARITY:
    case SV_OP_VMM_RESERVE:
    case SV_OP_VMM_ADDR_FREE:
    case SV_OP_VMM_CREATE:
    case SV_OP_VMM_RELEASE:
    case SV_OP_VMM_MAP:
    case SV_OP_VMM_UNMAP: {
        PAYLOAD(struct sv_vmm_rec, q);
        r = run_vmm(s, rec->op, &q, out, &olen);
        break;
    }
    case SV_OP_VMM_SET_ACCESS: {
        PAYLOAD(struct sv_access_rec, q);
        if (q.count == 0 || q.count > SV_MAX_ACCESS) {
            r = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        CUmemAccessDesc d[SV_MAX_ACCESS];
        for (uint32_t i = 0; i < q.count; i++) {
            if (q.d[i].loc_type != CU_MEM_LOCATION_TYPE_DEVICE || q.d[i].loc_id != 0) {
                r = CUDA_ERROR_NOT_SUPPORTED; /* the one device the application sees */
                break;
            }
            d[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            d[i].location.id = W.dev;
            d[i].flags = (CUmemAccess_flags)q.d[i].flags;
        }
        if (r == CUDA_SUCCESS)
            r = p_cuMemSetAccess(q.ptr, q.size, d, q.count);
        break;
    }
    case SV_OP_VMM_IMPORT:
    case SV_OP_VMM_EXPORT:
    case SV_OP_VMM_RETAIN:
    case SV_OP_VMM_PROPS: {
        PAYLOAD(struct sv_fd_rec, q);
        if (run_share(s, rec->op, &q, out, &olen, &r) != 0)
            return -1;
        break;
    }
    case SV_OP_FUNC_ATTR: {
        PAYLOAD(struct sv_func_attr_rec, q);
        int32_t v = 0;
        r = run_func_attr(s, &q, &v);
        memcpy(out, &v, sizeof v);
        olen = sizeof v;
        break;
    }
    case SV_OP_GET_GLOBAL: {
        PAYLOAD(struct sv_global_rec, q);
        char name[SV_MAX_NAME];
        const char *nm = name_after(pl, plen, sizeof q, name, sizeof name);
        CUdeviceptr p = 0;
        size_t bytes = 0;
        void *h = get(s, q.library ? SV_K_LIBRARY : SV_K_MODULE, q.owner);
        if (!nm)
            r = CUDA_ERROR_INVALID_VALUE;
        else if (!h)
            r = CUDA_ERROR_INVALID_HANDLE;
        else
            r = q.library ? p_cuLibraryGetGlobal(&p, &bytes, h, nm) : p_cuModuleGetGlobal(&p, &bytes, h, nm);
        uint64_t v[2] = {p, bytes};
        memcpy(out, v, sizeof v);
        olen = sizeof v;
        break;
    }
    case SV_OP_STREAM_CREATE_PRIO: {
        PAYLOAD(struct sv_pair_rec, q); /* a: the id, b: the priority */
        CUstream h = NULL;
        if (q.a < SV_STREAM_FIRST_ID || !id_free(s, SV_K_STREAM, q.a))
            r = CUDA_ERROR_INVALID_HANDLE;
        else if ((r = p_cuStreamCreateWithPriority(&h, q.flags, (int32_t)q.b)) == CUDA_SUCCESS)
            s->tab[SV_K_STREAM][q.a] = h;
        break;
    }
    case SV_OP_CAPTURE_INFO: {
        PAYLOAD(struct sv_id_rec, q);
        struct sv_capture_info o;
        memset(&o, 0, sizeof o);
        CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
        cuuint64_t id = 0;
        if ((r = stream_of(s, q.id, &st)) == CUDA_SUCCESS &&
            (r = p_cuStreamGetCaptureInfo_v2(st, &cs, &id, NULL, NULL, NULL)) == CUDA_SUCCESS) {
            o.status = (uint32_t)cs;
            o.id = id;
        }
        memcpy(out, &o, sizeof o);
        olen = sizeof o;
        break;
    }
    case SV_OP_CAPTURE_MODE: {
        PAYLOAD(struct sv_id_rec, q);
        CUstreamCaptureMode m = (CUstreamCaptureMode)q.id;
        r = p_cuThreadExchangeStreamCaptureMode(&m);
        break;
    }
    case SV_OP_POINTER_ATTRS: {
        PAYLOAD(struct sv_ptr_rec, q);
        r = run_pointer_attrs(&q, out, &olen);
        break;
    }
    case SV_OP_CTX_LIMIT: {
        PAYLOAD(struct sv_limit_rec, q);
        size_t v = 0;
        r = q.set ? p_cuCtxSetLimit((CUlimit)q.limit, (size_t)q.value) : p_cuCtxGetLimit(&v, (CUlimit)q.limit);
        uint64_t v64 = v;
        memcpy(out, &v64, sizeof v64);
        olen = sizeof v64;
        break;
    }
    default: {
        if (!wblas_op(rec->op))
            return fail(s, "record at %llu: unknown op %u", (unsigned long long)s->tail, rec->op);
        int bad = 0;
        wblas_env e = {s->tab, blas_stream, s};
        r = wblas_run(&e, rec->op, pl, plen, out, &olen, &bad);
        if (bad)
            return fail(s, "record %u at %llu: %u bytes, malformed", rec->op, (unsigned long long)s->tail,
                        (unsigned)plen);
        break;
    }
    }

    if (answered)
        return 0;
    if (rec->reply) {
        struct sv_reply *rp = &s->sh->reply[rec->reply - 1];
        int32_t prev = rp->result; /* the first failure of the group's earlier records (the client zeroes it) */
        if (rec->flags & SV_F_GROUP) {
            if (r != CUDA_SUCCESS && prev == 0)
                rp->result = (int32_t)r;
            return 0; /* the group's last record answers */
        }
        reply_done(s, rec->reply, prev ? (CUresult)prev : r, out, olen);
    } else if (r != CUDA_SUCCESS) {
        /* An asynchronous call failed: the next synchronizing call says so (served.h). */
        int32_t zero = 0;
        if (atomic_compare_exchange_strong(&s->sh->h.deferred, &zero, (int32_t)r))
            atomic_store(&s->sh->h.deferred_op, rec->op);
    }
    return 0;
}

/* ---- the handshake ---- */

static int recv_hello(svc *s, struct sv_hello *hello, int *memfd) {
    char cbuf[CMSG_SPACE(sizeof(int) * 4)];
    size_t got = 0;
    *memfd = -1;
    while (got < sizeof *hello) {
        struct iovec iov = {(char *)hello + got, sizeof *hello - got};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
        ssize_t n = recvmsg(s->sock, &m, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return fail(s, "reading the client's hello: %s", strerror(errno));
        if (n == 0)
            return got == 0 ? 1 : fail(s, "the client closed its socket in the middle of its hello");
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < nfd; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (*memfd < 0)
                    *memfd = fd;
                else
                    close(fd);
            }
        }
        got += (size_t)n;
    }
    return 0;
}

static void send_welcome(int sock, CUresult r, const char *msg) {
    struct sv_welcome w;
    memset(&w, 0, sizeof w);
    w.magic = SV_MAGIC;
    w.version = SV_VERSION;
    w.result = (int32_t)r;
    w.worker_pid = (int32_t)getpid();
    snprintf(w.err, sizeof w.err, "%s", msg ? msg : "");
    const char *p = (const char *)&w;
    size_t left = sizeof w;
    while (left) {
        ssize_t n = send(sock, p, left, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* the client is gone: the service ends at its first wait */
        p += n;
        left -= (size_t)n;
    }
}

/* Maps the client's shared memory: 0, 1 when the client hung up before its hello, or -1. */
static int handshake(svc *s) {
    struct sv_hello hello;
    int fd = -1;
    int rc = recv_hello(s, &hello, &fd);
    if (rc != 0) {
        if (fd >= 0)
            close(fd);
        return rc;
    }
    char why[200] = "";
    struct stat st;
    int seals;
    if (hello.magic != SV_MAGIC || hello.version != SV_VERSION || hello.total != sizeof(struct sv_shared))
        snprintf(why, sizeof why,
                 "served-mode versions differ: the client speaks %#x version %u with %llu bytes of shared memory, the "
                 "worker version %u with %zu (update both to one gpucr)",
                 hello.magic, hello.version, (unsigned long long)hello.total, SV_VERSION, sizeof(struct sv_shared));
    else if (fd < 0)
        snprintf(why, sizeof why, "the client's hello came without its shared memory");
    else if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < sizeof(struct sv_shared))
        snprintf(why, sizeof why, "the client's shared memory holds %lld bytes, not %zu", (long long)st.st_size,
                 sizeof(struct sv_shared));
    else if ((seals = fcntl(fd, F_GET_SEALS)) < 0 || !(seals & F_SEAL_SHRINK))
        snprintf(why, sizeof why, "the client's shared memory is not sealed against shrinking");
    if (!why[0]) {
        void *p = mmap(NULL, sizeof(struct sv_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            snprintf(why, sizeof why, "mapping the client's shared memory: %s", strerror(errno));
        else
            s->sh = p;
    }
    if (fd >= 0)
        close(fd);
    if (why[0]) {
        send_welcome(s->sock, CUDA_ERROR_INVALID_VALUE, why);
        return fail(s, "%s", why);
    }
    s->tail = atomic_load(&s->sh->h.tail);
    if (s->tail != 0 || atomic_load(&s->sh->h.head) != 0) {
        send_welcome(s->sock, CUDA_ERROR_INVALID_VALUE, "the ring is not new");
        return fail(s, "the client's ring is not new (head %llu, tail %llu)",
                    (unsigned long long)atomic_load(&s->sh->h.head), (unsigned long long)s->tail);
    }
    send_welcome(s->sock, CUDA_SUCCESS, NULL);
    return 0;
}

/* ---- the loop ---- */

static int serve_loop(svc *s) {
    struct sv_header *h = &s->sh->h;
    for (;;) {
        uint64_t head;
        if (!wait_work(s, &head))
            return 0;
        if (head - s->tail > SV_RING_BYTES || (head - s->tail) % SV_REC_ALIGN)
            return fail(s, "ring head %llu is not a record boundary past tail %llu", (unsigned long long)head,
                        (unsigned long long)s->tail);
        while (s->tail != head) {
            uint32_t off = (uint32_t)(s->tail % SV_RING_BYTES);
            struct sv_rec rec;
            memcpy(&rec, s->sh->ring + off, sizeof rec);
            uint64_t avail = head - s->tail;
            if (rec.len < sizeof rec || rec.len % SV_REC_ALIGN || rec.len > SV_RING_BYTES - off || rec.len > avail)
                return fail(s, "record at %llu: length %u (at ring offset %u, %llu bytes published)",
                            (unsigned long long)s->tail, rec.len, off, (unsigned long long)avail);
            /* The payload stays in the ring (the slot is ours until tail moves): launches' parameters are read there. */
            if (run_record(s, &rec, s->sh->ring + off + sizeof rec, rec.len - (uint32_t)sizeof rec) != 0)
                return -1;
            s->tail += rec.len;
            atomic_store_explicit(&h->tail, s->tail, memory_order_seq_cst);
            if (atomic_load_explicit(&h->room_wait, memory_order_seq_cst) && atomic_exchange(&h->room_wait, 0)) {
                atomic_fetch_add(&h->room_seq, 1);
                sv_futex_wake(&h->room_seq);
            }
        }
    }
}

/*
 * The service's state lives as long as the worker: a template's script (sv_play) fills the handle tables that the
 * process it then serves (sv_serve) names its objects by.
 */
static svc S;
static bool S_made, S_played, S_served;

static int svc_make(svc *s) {
    if (S_made)
        return 0;
    for (unsigned k = 0; k < SV_K_COUNT; k++)
        if (!(s->tab[k] = calloc(sv_cap(k), sizeof(void *)))) {
            for (unsigned j = 0; j < k; j++) {
                free(s->tab[j]);
                s->tab[j] = NULL;
            }
            return fail(s, "out of memory for the handle tables");
        }
    s->hkey = calloc(HSLOTS, sizeof *s->hkey);
    s->hrefs = calloc(HSLOTS, sizeof *s->hrefs);
    if (!s->hkey || !s->hrefs) {
        free(s->hkey);
        free(s->hrefs);
        s->hkey = NULL;
        s->hrefs = NULL;
        for (unsigned k = 0; k < SV_K_COUNT; k++) {
            free(s->tab[k]);
            s->tab[k] = NULL;
        }
        return fail(s, "out of memory for the VMM handle table");
    }
    S_made = true;
    return 0;
}

static void svc_free(svc *s) {
    if (!S_made)
        return;
    drop_image(s);
    wblas_env be = {s->tab, blas_stream, s};
    wblas_free(&be);
    for (unsigned k = 0; k < SV_K_COUNT; k++) {
        if (k == SV_K_FUNC || k == SV_K_KERNEL)
            for (uint32_t i = 0; i < sv_cap(k); i++)
                if (s->tab[k][i]) {
                    struct wfunc *f = s->tab[k][i]; /* wkern has the same shape after its handle */
                    layout_free(k == SV_K_FUNC ? &f->l : &((struct wkern *)s->tab[k][i])->l);
                    free(s->tab[k][i]);
                }
        free(s->tab[k]);
        s->tab[k] = NULL;
    }
    free(s->hkey);
    free(s->hrefs);
    s->hkey = NULL;
    s->hrefs = NULL;
    S_made = false;
}

int sv_serve(int sock, char *err, size_t errlen) {
    svc *s = &S;
    s->err = err;
    s->errlen = errlen;
    if (!W.prepared)
        return fail(s, "sv_serve before sv_prepare");
    if (S_served)
        return fail(s, "sv_serve called twice");
    S_served = true;
    if (svc_make(s) != 0)
        return -1;
    s->sock = sock;
    s->sh = NULL;
    s->tail = 0;
    int rc = handshake(s);
    if (rc == 1)
        rc = 0; /* the client left before it said anything */
    else if (rc == 0)
        rc = serve_loop(s);
    /* The worker ends with its client: the driver frees the context's objects at the exit. */
    if (s->sh)
        munmap(s->sh, sizeof(struct sv_shared));
    s->sh = NULL;
    svc_free(s);
    return rc;
}

/* ---- a template's script (served.h: the records a checkpoint kept, run before the restore) ---- */

static const char *const op_names[SV_OP_COUNT] = {
    [SV_OP_PAD] = "PAD",
    [SV_OP_QUERY] = "QUERY",
    [SV_OP_PRIMARY_SET_FLAGS] = "PRIMARY_SET_FLAGS",
    [SV_OP_CTX_SYNC] = "CTX_SYNC",
    [SV_OP_MEM_ALLOC] = "MEM_ALLOC",
    [SV_OP_MEM_ALLOC_PITCH] = "MEM_ALLOC_PITCH",
    [SV_OP_MEM_FREE] = "MEM_FREE",
    [SV_OP_MEM_RANGE] = "MEM_RANGE",
    [SV_OP_MEM_ALLOC_ASYNC] = "MEM_ALLOC_ASYNC",
    [SV_OP_MEM_FREE_ASYNC] = "MEM_FREE_ASYNC",
    [SV_OP_HTOD] = "HTOD",
    [SV_OP_DTOH] = "DTOH",
    [SV_OP_DTOD] = "DTOD",
    [SV_OP_MEMSET] = "MEMSET",
    [SV_OP_STREAM_CREATE] = "STREAM_CREATE",
    [SV_OP_STREAM_DESTROY] = "STREAM_DESTROY",
    [SV_OP_STREAM_SYNC] = "STREAM_SYNC",
    [SV_OP_STREAM_QUERY] = "STREAM_QUERY",
    [SV_OP_STREAM_WAIT_EVENT] = "STREAM_WAIT_EVENT",
    [SV_OP_STREAM_BEGIN_CAPTURE] = "STREAM_BEGIN_CAPTURE",
    [SV_OP_STREAM_END_CAPTURE] = "STREAM_END_CAPTURE",
    [SV_OP_STREAM_MEMOP] = "STREAM_MEMOP",
    [SV_OP_EVENT_CREATE] = "EVENT_CREATE",
    [SV_OP_EVENT_DESTROY] = "EVENT_DESTROY",
    [SV_OP_EVENT_RECORD] = "EVENT_RECORD",
    [SV_OP_EVENT_QUERY] = "EVENT_QUERY",
    [SV_OP_EVENT_SYNC] = "EVENT_SYNC",
    [SV_OP_EVENT_ELAPSED] = "EVENT_ELAPSED",
    [SV_OP_IMAGE_CHUNK] = "IMAGE_CHUNK",
    [SV_OP_MODULE_LOAD] = "MODULE_LOAD",
    [SV_OP_MODULE_UNLOAD] = "MODULE_UNLOAD",
    [SV_OP_MODULE_GET_FUNCTION] = "MODULE_GET_FUNCTION",
    [SV_OP_LIBRARY_LOAD] = "LIBRARY_LOAD",
    [SV_OP_LIBRARY_UNLOAD] = "LIBRARY_UNLOAD",
    [SV_OP_LIBRARY_GET_KERNEL] = "LIBRARY_GET_KERNEL",
    [SV_OP_KERNEL_GET_FUNCTION] = "KERNEL_GET_FUNCTION",
    [SV_OP_LAUNCH] = "LAUNCH",
    [SV_OP_GRAPH_INSTANTIATE] = "GRAPH_INSTANTIATE",
    [SV_OP_GRAPH_LAUNCH] = "GRAPH_LAUNCH",
    [SV_OP_GRAPH_EXEC_DESTROY] = "GRAPH_EXEC_DESTROY",
    [SV_OP_GRAPH_DESTROY] = "GRAPH_DESTROY",
    [SV_OP_VMM_GRANULARITY] = "VMM_GRANULARITY",
    [SV_OP_VMM_RESERVE] = "VMM_RESERVE",
    [SV_OP_VMM_ADDR_FREE] = "VMM_ADDR_FREE",
    [SV_OP_VMM_CREATE] = "VMM_CREATE",
    [SV_OP_VMM_RELEASE] = "VMM_RELEASE",
    [SV_OP_VMM_MAP] = "VMM_MAP",
    [SV_OP_VMM_UNMAP] = "VMM_UNMAP",
    [SV_OP_VMM_SET_ACCESS] = "VMM_SET_ACCESS",
    [SV_OP_VMM_IMPORT] = "VMM_IMPORT",
    [SV_OP_VMM_EXPORT] = "VMM_EXPORT",
    [SV_OP_VMM_RETAIN] = "VMM_RETAIN",
    [SV_OP_VMM_PROPS] = "VMM_PROPS",
    [SV_OP_FUNC_ATTR] = "FUNC_ATTR",
    [SV_OP_GET_GLOBAL] = "GET_GLOBAL",
    [SV_OP_STREAM_CREATE_PRIO] = "STREAM_CREATE_PRIO",
    [SV_OP_CAPTURE_INFO] = "CAPTURE_INFO",
    [SV_OP_CAPTURE_MODE] = "CAPTURE_MODE",
    [SV_OP_POINTER_ATTRS] = "POINTER_ATTRS",
    [SV_OP_CTX_LIMIT] = "CTX_LIMIT",
    [SV_OP_GRAPH_NODES] = "GRAPH_NODES",
    [SV_OP_BLAS_LOAD] = "BLAS_LOAD",
    [SV_OP_BLAS_CREATE] = "BLAS_CREATE",
    [SV_OP_BLAS_DESTROY] = "BLAS_DESTROY",
    [SV_OP_BLAS_SET] = "BLAS_SET",
    [SV_OP_BLAS_GEMM] = "BLAS_GEMM",
    [SV_OP_LT_CREATE] = "LT_CREATE",
    [SV_OP_LT_DESTROY] = "LT_DESTROY",
    [SV_OP_LT_OBJ_CREATE] = "LT_OBJ_CREATE",
    [SV_OP_LT_OBJ_DESTROY] = "LT_OBJ_DESTROY",
    [SV_OP_LT_OBJ_SET] = "LT_OBJ_SET",
    [SV_OP_LT_OBJ_GET] = "LT_OBJ_GET",
    [SV_OP_LT_HEURISTIC] = "LT_HEURISTIC",
    [SV_OP_LT_MATMUL] = "LT_MATMUL",
    [SV_OP_BLAS_GEMV] = "BLAS_GEMV",
    [SV_OP_BLAS_DOT] = "BLAS_DOT",
    [SV_OP_BLAS_CALL] = "BLAS_CALL",
};

/* "record N (op NAME)", or "(op N)" for an op without a name here; "record N" before its op is known (op < 0). */
static const char *rec_name(char *buf, size_t cap, uint64_t idx, long op) {
    if (op < 0)
        snprintf(buf, cap, "record %llu", (unsigned long long)idx);
    else if (op < SV_OP_COUNT && op_names[op])
        snprintf(buf, cap, "record %llu (op %s)", (unsigned long long)idx, op_names[op]);
    else
        snprintf(buf, cap, "record %llu (op %ld)", (unsigned long long)idx, op);
    return buf;
}

/* At most 16 bytes as hex, "..." after when there are more. */
static const char *hex(char *buf, size_t cap, const uint8_t *p, uint32_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < n && i < 16 && at + 3 < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%02x", p[i]);
    if (n > 16 && at + 4 < cap)
        snprintf(buf + at, cap - at, "...");
    if (n == 0)
        snprintf(buf, cap, "nothing");
    return buf;
}

/* The script: the file's size, how far it was read. */
typedef struct {
    int fd;
    uint64_t size, off;
} script;

/*
 * n bytes at the script's offset into buf (NULL: skipped), then past them and their padding to 8 bytes. 0, or -1
 * when the script (as its size said at the start, or as it reads now) ends before.
 */
static int script_take(svc *s, script *sc, void *buf, uint64_t n, const char *who, const char *what) {
    uint64_t padded = sv_pad8(n);
    if (padded > sc->size - sc->off)
        return fail(s, "the script ends inside %s%s%s (%llu bytes at %llu of %llu)", who, *who ? "'s " : "", what,
                    (unsigned long long)n, (unsigned long long)sc->off, (unsigned long long)sc->size);
    uint8_t *p = buf;
    uint64_t got = 0;
    while (p && got < n) {
        size_t want = n - got > (1u << 30) ? (1u << 30) : (size_t)(n - got);
        ssize_t r = pread(sc->fd, p + got, want, (off_t)(sc->off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return fail(s, "reading the script at %llu: %s", (unsigned long long)(sc->off + got), strerror(errno));
        if (r == 0)
            return fail(s, "the script ends inside %s%s%s (it shrank to %llu bytes while it was read)", who,
                        *who ? "'s " : "", what, (unsigned long long)(sc->off + got));
        got += (uint64_t)r;
    }
    sc->off += padded;
    return 0;
}

/*
 * A module's or library's global that this worker placed elsewhere than the checkpointed one did. The driver
 * chooses where globals go, in its own heap, and two workers that loaded the same images in the same order can
 * still differ by a few hundred bytes (measured on an H200: a PyTorch server's library globals all 256 bytes
 * lower). A replay says so and carries on; a template does the same: the script's copies of the global's
 * contents, written for its old address, go to the new one.
 */
typedef struct moved_global {
    uint64_t old, size, now;
} moved_global;

typedef struct moved_set {
    moved_global *v;
    size_t n, cap;
} moved_set;

static int moved_add(moved_set *m, uint64_t old, uint64_t size, uint64_t now) {
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 64;
        moved_global *v = realloc(m->v, cap * sizeof *v);
        if (!v)
            return -1;
        m->v = v;
        m->cap = cap;
    }
    m->v[m->n++] = (moved_global){old, size, now};
    return 0;
}

/* A copy to [dev, dev+len) of a global that moved: 1 and *to its new address; 0 if it is none's; -1 if it
 * crosses a moved global's edge (the old ranges do not overlap: they were the checkpointed worker's globals). */
static int moved_dest(const moved_set *m, uint64_t dev, uint64_t len, uint64_t *to) {
    for (size_t i = 0; i < m->n; i++) {
        const moved_global *g = &m->v[i];
        if (dev + len <= g->old || dev >= g->old + g->size)
            continue;
        if (dev < g->old || dev + len > g->old + g->size)
            return -1;
        *to = g->now + (dev - g->old);
        return 1;
    }
    return 0;
}

/* The records, one by one, on s->sh (private memory): 0, -1 (a malformed script), -2 (a record failed). */
static int play(svc *s, int fd, moved_set *moved) {
    struct stat st;
    if (fstat(fd, &st) != 0)
        return fail(s, "the script: fstat: %s", strerror(errno));
    if (!S_ISREG(st.st_mode))
        return fail(s, "the script is not a file (mode %#o)", (unsigned)st.st_mode);
    if (st.st_size < 0 || (uint64_t)st.st_size > SV_SCRIPT_MAX)
        return fail(s, "the script holds %lld bytes, more than %llu", (long long)st.st_size,
                    (unsigned long long)SV_SCRIPT_MAX);
    script sc = {fd, (uint64_t)st.st_size, 0};
    struct sv_script_hdr hdr;
    if (script_take(s, &sc, &hdr, sizeof hdr, "", "its header") != 0)
        return -1;
    if (hdr.magic != SV_SCRIPT_MAGIC)
        return fail(s, "the script's magic is %#x, not %#x: not a template's script", hdr.magic, SV_SCRIPT_MAGIC);
    if (hdr.version != SV_SCRIPT_VERSION || hdr.sv_version != SV_VERSION)
        return fail(s,
                    "the script is version %u of records of version %u; this worker runs version %u of records of "
                    "version %u (update both to one gpucr)",
                    hdr.version, hdr.sv_version, SV_SCRIPT_VERSION, SV_VERSION);
    struct sv_header *h = &s->sh->h;
    uint8_t expect[SV_REPLY_DATA];
    char who[64], why[512], a[40], b[40];
    uint32_t group = 0; /* the reply of the group the previous record was a member of; 0: none */
    uint64_t i;
    for (i = 0; i < hdr.entries; i++) {
        struct sv_script_ent e;
        struct sv_rec rec;
        uint64_t at;
        rec_name(who, sizeof who, i, -1);
        if (script_take(s, &sc, &e, sizeof e, who, "entry") != 0)
            return -1;
        at = sc.off;
        /* The op first, where the file holds it, so that every complaint below names it. */
        long op = -1;
        if (sc.size - sc.off >= sizeof rec && pread(fd, &rec, sizeof rec, (off_t)sc.off) == (ssize_t)sizeof rec)
            op = rec.op;
        rec_name(who, sizeof who, i, op);
        if (e.rec_len < sizeof(struct sv_rec) || e.rec_len % SV_REC_ALIGN || e.rec_len > SV_RING_BYTES)
            return fail(s, "%s: its length %u is not a record's (at least %zu, a multiple of %u, at most %u)", who,
                        e.rec_len, sizeof(struct sv_rec), SV_REC_ALIGN, SV_RING_BYTES);
        if (e.stage_len > SV_STAGE_BYTES)
            return fail(s, "%s: %u bytes of staging, more than a slot's %u", who, e.stage_len, SV_STAGE_BYTES);
        if (e.stage_len > 0 && e.stage_slot >= SV_NSTAGE)
            return fail(s, "%s: staging slot %u of %u", who, e.stage_slot, SV_NSTAGE);
        if (e.expect_len > SV_REPLY_DATA)
            return fail(s, "%s: %u bytes expected of its reply, more than a reply's %u", who, e.expect_len,
                        SV_REPLY_DATA);
        /* At ring offset 0, as a client would have published it; the payload is read there. */
        if (script_take(s, &sc, s->sh->ring, e.rec_len, who, "record") != 0)
            return -1;
        memcpy(&rec, s->sh->ring, sizeof rec);
        rec_name(who, sizeof who, i, rec.op);
        if (rec.len != e.rec_len)
            return fail(s, "%s: its length %u is not its entry's %u", who, rec.len, e.rec_len);
        if (rec.op == SV_OP_VMM_IMPORT || rec.op == SV_OP_VMM_EXPORT)
            return fail(s, "%s passes a descriptor over the served process's socket: a template runs none", who);
        if (rec.reply > SV_NREPLY)
            return fail(s, "%s: reply slot %u of %u", who, rec.reply, SV_NREPLY);
        bool member = (rec.flags & SV_F_GROUP) != 0;
        if (e.expect_len > 0 && (rec.reply == 0 || member))
            return fail(s, "%s: %u bytes expected of a reply it does not give", who, e.expect_len);
        if (script_take(s, &sc, e.stage_len ? s->sh->stage[e.stage_slot] : NULL, e.stage_len, who, "staging") != 0 ||
            script_take(s, &sc, expect, e.expect_len, who, "expected reply") != 0)
            return -1;
        if (e.stage_len > 0) { /* filled, as the client leaves a slot for the record that reads it */
            struct sv_stagehdr *sg = &s->sh->stagehdr[e.stage_slot];
            sg->result = 0;
            sg->len = 0;
            atomic_store(&sg->state, SV_PENDING);
        }
        struct sv_reply *rp = rec.reply ? &s->sh->reply[rec.reply - 1] : NULL;
        if (rp && group != rec.reply) { /* claimed, as the client claims a slot (a group's once, at its first) */
            rp->result = 0;
            rp->len = 0;
            atomic_store(&rp->state, SV_PENDING);
        }
        group = member ? rec.reply : 0;
        if (rec.op == SV_OP_HTOD && moved->n && rec.len >= sizeof rec + sizeof(struct sv_copy_rec)) {
            struct sv_copy_rec q;
            uint64_t to;
            memcpy(&q, s->sh->ring + sizeof rec, sizeof q);
            int m = moved_dest(moved, q.dev, q.len, &to);
            if (m < 0)
                return fail(s, "%s copies %u bytes to 0x%llx, across the edge of a global this worker placed elsewhere",
                            who, q.len, (unsigned long long)q.dev);
            if (m > 0) {
                q.dev = to;
                memcpy(s->sh->ring + sizeof rec, &q, sizeof q);
            }
        }
        s->tail = at; /* run_record's complaints name the record's offset in the script */
        if (run_record(s, &rec, s->sh->ring + sizeof rec, rec.len - (uint32_t)sizeof rec) != 0) {
            snprintf(why, sizeof why, "%s", s->err);
            return fail(s, "%s is malformed: %s", who, why);
        }
        /* Checked at each record, so that the one that failed is named; the script's last is a synchronizing one
         * in any case, as the restored process would have made after its replay. */
        int32_t deferred = atomic_load(&h->deferred);
        if (deferred != 0) {
            fail(s, "%s failed in the template: %s (asynchronously)",
                 rec_name(who, sizeof who, i, (long)atomic_load(&h->deferred_op)), errname((CUresult)deferred));
            return -2;
        }
        if (!rp || member)
            continue; /* no answer, or the group's last record gives it */
        if (atomic_load(&rp->state) != SV_DONE) {
            fail(s, "%s failed in the template: it gave no answer", who);
            return -2;
        }
        if (rp->result != CUDA_SUCCESS) {
            fail(s, "%s failed in the template: %s", who, errname((CUresult)rp->result));
            return -2;
        }
        uint64_t ga[2], ge;
        if (rec.op == SV_OP_GET_GLOBAL && e.expect_len == sizeof ge && rp->len >= sizeof ga &&
            memcmp(rp->data, expect, sizeof ge) != 0) {
            memcpy(ga, rp->data, sizeof ga);
            memcpy(&ge, expect, sizeof ge);
            if (moved_add(moved, ge, ga[1], ga[0]) != 0) {
                fail(s, "%s: out of memory keeping the globals placed elsewhere", who);
                return -2;
            }
            continue;
        }
        if (rp->len < e.expect_len || memcmp(rp->data, expect, e.expect_len) != 0) {
            /* cuBLAS's load answers with why it failed after its numbers */
            char reason[256] = "";
            uint32_t at_msg = (uint32_t)sizeof(struct sv_blas_loaded);
            if (rec.op == SV_OP_BLAS_LOAD && rp->len > at_msg)
                snprintf(reason, sizeof reason, " (%.*s)", (int)(rp->len - at_msg), (const char *)rp->data + at_msg);
            fail(s, "%s answered differently than at the checkpoint: %s here, %s there%s", who,
                 hex(a, sizeof a, rp->data, rp->len), hex(b, sizeof b, expect, e.expect_len), reason);
            return -2;
        }
    }
    if (group)
        return fail(s, "the script ends inside a group (record %llu is a member, and none answers it)",
                    (unsigned long long)(i - 1));
    if (sc.off != sc.size)
        return fail(s, "%llu bytes follow the script's last entry (record %llu)",
                    (unsigned long long)(sc.size - sc.off), (unsigned long long)(i ? i - 1 : 0));
    uint8_t extra;
    if (pread(fd, &extra, 1, (off_t)sc.off) > 0)
        return fail(s, "the script grew past its last entry while it was read");
    return 0;
}

int sv_play(int fd, uint64_t *took_ns, char *err, size_t errlen) {
    svc *s = &S;
    long long t0 = sv_now_ns();
    s->err = err;
    s->errlen = errlen;
    if (!W.prepared)
        return fail(s, "sv_play before sv_prepare");
    if (S_played || S_served)
        return fail(s, "a worker runs one template's script, before it serves");
    S_played = true;
    if (svc_make(s) != 0)
        return -1;
    void *p = mmap(NULL, sizeof(struct sv_shared), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return fail(s, "mapping the template's shared memory: %s", strerror(errno));
    s->sock = -1; /* none: records that use the socket are refused */
    s->sh = p;
    moved_set moved = {0};
    int rc = play(s, fd, &moved);
    if (rc == 0 && moved.n)
        fprintf(stderr,
                "gpucr: served worker: template: %zu globals placed elsewhere than at the checkpoint (0x%llx now at "
                "0x%llx, the first); their contents went with them\n",
                moved.n, (unsigned long long)moved.v[0].old, (unsigned long long)moved.v[0].now);
    free(moved.v);
    munmap(s->sh, sizeof(struct sv_shared));
    s->sh = NULL; /* sv_serve maps the client's */
    s->tail = 0;
    if (rc == 0 && took_ns)
        *took_ns = (uint64_t)(sv_now_ns() - t0);
    return rc;
}

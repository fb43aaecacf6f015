/*
 * The forwarded entry points (client.h). The application sees one device
 * (ordinal 0: the worker's) and its primary context; every other object is
 * a virtual handle (handles.c). Asynchronous calls are enqueued and return;
 * their failures come back at the next synchronizing call (the
 * synchronizations, queries and synchronous copies and memsets), as a
 * launch's would on the driver.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "gpucr/modfile.h"

/* What a stream capture forwarded (below, before streams and events). */
static void cap_taint(uint32_t stream, const char *why);

/* The primary context, as the application sees it; which thread has it current; its retains. */
#define SV_CTX ((CUcontext)sv_handle(0xcc, 1))
static _Thread_local bool cur;
static _Atomic int retained;

static inline CUresult need_ctx(void) {
    if (__builtin_expect(atomic_load_explicit(&sv_up, memory_order_relaxed) == SV_S_UP && cur, 1))
        return CUDA_SUCCESS;
    CUresult r = sv_ready();
    return r != CUDA_SUCCESS ? r : cur ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* sv_enter for a function's body: the early returns of a call that uses the shared memory. */
#define ENTER()                                                                                                        \
    do {                                                                                                               \
        CUresult r_ = sv_enter();                                                                                      \
        if (r_ != CUDA_SUCCESS)                                                                                        \
            return r_;                                                                                                 \
    } while (0)

#define NEED_CTX()                                                                                                     \
    do {                                                                                                               \
        CUresult r_ = need_ctx();                                                                                      \
        if (r_ != CUDA_SUCCESS)                                                                                        \
            return r_;                                                                                                 \
    } while (0)
#define NEED_INIT()                                                                                                    \
    do {                                                                                                               \
        CUresult r_ = sv_ready();                                                                                      \
        if (r_ != CUDA_SUCCESS)                                                                                        \
            return r_;                                                                                                 \
    } while (0)
#define NEED_DEV(dev)                                                                                                  \
    do {                                                                                                               \
        NEED_INIT();                                                                                                   \
        if ((dev) != 0)                                                                                                \
            return CUDA_ERROR_INVALID_DEVICE;                                                                          \
    } while (0)

CUresult sv_stream_arg(CUstream h, uint32_t *out) {
    if (h == NULL)
        *out = SV_STREAM_NULL;
    else if (h == CU_STREAM_LEGACY)
        *out = SV_STREAM_LEGACY;
    else if (h == CU_STREAM_PER_THREAD)
        *out = SV_STREAM_PER_THREAD;
    else if (!(*out = sv_id(SV_K_STREAM, h)))
        return CUDA_ERROR_INVALID_HANDLE;
    return CUDA_SUCCESS;
}

/*
 * The device's constant answers (name, attributes, bus id, memory, UUID, the driver's version), kept once
 * asked: answered here from then on, and while detached too (no worker then); forgotten when another worker
 * takes the process (sv_api_attached), which may run on another GPU.
 */
#define QC_ATTRS 256
#define QC_BYTES 256
static struct {
    pthread_mutex_t mu;
    bool have[SV_Q_COUNT];
    uint32_t len[SV_Q_COUNT];
    uint8_t v[SV_Q_COUNT][QC_BYTES];
    bool attr_have[QC_ATTRS];
    int32_t attr[QC_ATTRS];
} QC = {.mu = PTHREAD_MUTEX_INITIALIZER};

static bool qc_constant(unsigned what) {
    return what == SV_Q_NAME || what == SV_Q_BUSID || what == SV_Q_TOTALMEM || what == SV_Q_UUID ||
           what == SV_Q_DRIVER_VERSION || what == SV_Q_PRIO_RANGE;
}

static CUresult query(unsigned what, int arg, void *out, uint32_t cap, uint32_t *len) {
    bool attr = what == SV_Q_ATTR && arg >= 0 && arg < QC_ATTRS;
    if (attr || qc_constant(what)) {
        bool hit = false;
        pthread_mutex_lock(&QC.mu);
        if (attr && QC.attr_have[arg] && cap >= sizeof(int32_t)) {
            memcpy(out, &QC.attr[arg], sizeof(int32_t));
            if (len)
                *len = sizeof(int32_t);
            hit = true;
        } else if (!attr && QC.have[what] && QC.len[what] <= cap) {
            memcpy(out, QC.v[what], QC.len[what]);
            if (len)
                *len = QC.len[what];
            hit = true;
        }
        pthread_mutex_unlock(&QC.mu);
        if (hit)
            return CUDA_SUCCESS;
    }
    struct sv_query_rec q = {what, arg};
    uint32_t n = 0;
    CUresult r = sv_sync(SV_OP_QUERY, &q, sizeof q, out, cap, &n, false);
    if (len)
        *len = n;
    if (r == CUDA_SUCCESS && (attr || qc_constant(what)) && n <= QC_BYTES) {
        pthread_mutex_lock(&QC.mu);
        if (attr && n == sizeof(int32_t)) {
            memcpy(&QC.attr[arg], out, sizeof(int32_t));
            QC.attr_have[arg] = true;
        } else if (!attr) {
            memcpy(QC.v[what], out, n);
            QC.len[what] = n;
            QC.have[what] = true;
        }
        pthread_mutex_unlock(&QC.mu);
    }
    return r;
}

/* The capture mode last sent to the worker's thread (cuThreadExchangeStreamCaptureMode, below). */
static _Atomic int worker_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

void sv_api_attached(bool device_changed) {
    (void)device_changed; /* the same GPU may be another model's twin, or not: asked again either way */
    pthread_mutex_lock(&QC.mu);
    memset(QC.have, 0, sizeof QC.have);
    memset(QC.attr_have, 0, sizeof QC.attr_have);
    pthread_mutex_unlock(&QC.mu);
    atomic_store(&worker_mode, CU_STREAM_CAPTURE_MODE_GLOBAL); /* a new worker's thread starts in global mode */
}

/* ---- initialization, devices ---- */

SV_API CUresult cuInit(unsigned int flags) {
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return sv_connect();
}

SV_API CUresult cuDriverGetVersion(int *v) {
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    if (sv_ready() != CUDA_SUCCESS) {
        *v = GPUCR_CUDA_API_VERSION; /* before cuInit: the version this library implements */
        return CUDA_SUCCESS;
    }
    int32_t x = 0;
    CUresult r = query(SV_Q_DRIVER_VERSION, 0, &x, sizeof x, NULL);
    if (r == CUDA_SUCCESS)
        *v = x;
    return r;
}

SV_API CUresult cuDeviceGetCount(int *count) {
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT();
    *count = 1; /* the worker's device */
    return CUDA_SUCCESS;
}

SV_API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_DEV(ordinal);
    *device = 0;
    return CUDA_SUCCESS;
}

static CUresult string_query(unsigned what, char *out, int len, CUdevice dev) {
    if (!out || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_DEV(dev);
    char buf[256];
    uint32_t n = 0;
    CUresult r = query(what, 0, buf, sizeof buf - 1, &n);
    if (r != CUDA_SUCCESS)
        return r;
    buf[n < sizeof buf ? n : sizeof buf - 1] = 0;
    snprintf(out, (size_t)len, "%s", buf);
    return CUDA_SUCCESS;
}

SV_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) { return string_query(SV_Q_NAME, name, len, dev); }
SV_API CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev) {
    return string_query(SV_Q_BUSID, bus, len, dev);
}

SV_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_DEV(dev);
    int32_t v = 0;
    CUresult r = query(SV_Q_ATTR, (int)attrib, &v, sizeof v, NULL);
    if (r == CUDA_SUCCESS)
        *pi = v;
    return r;
}

SV_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_DEV(dev);
    uint64_t v = 0;
    CUresult r = query(SV_Q_TOTALMEM, 0, &v, sizeof v, NULL);
    if (r == CUDA_SUCCESS)
        *bytes = (size_t)v;
    return r;
}

SV_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_DEV(dev);
    return query(SV_Q_UUID, 0, uuid, sizeof *uuid, NULL);
}

SV_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
SV_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

SV_API CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_DEV(dev);
    (void)peer;
    return CUDA_ERROR_INVALID_DEVICE; /* one device: no peer (peer access is not served) */
}

/* ---- contexts: the primary one only ---- */

SV_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_DEV(dev);
    atomic_fetch_add(&retained, 1);
    *pctx = SV_CTX;
    return CUDA_SUCCESS;
}

SV_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    NEED_DEV(dev);
    int n = atomic_load(&retained);
    do {
        if (n <= 0)
            return CUDA_ERROR_INVALID_CONTEXT;
    } while (!atomic_compare_exchange_weak(&retained, &n, n - 1));
    /* The worker keeps its context: the process's objects live on, as they would until the driver reset it. */
    return CUDA_SUCCESS;
}

SV_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_DEV(dev);
    uint32_t v[2] = {0, 0};
    CUresult r = query(SV_Q_PRIMARY_STATE, 0, v, sizeof v, NULL);
    if (r == CUDA_SUCCESS) {
        *flags = v[0];
        *active = atomic_load(&retained) > 0;
    }
    return r;
}

/* The primary context's flags as the process set them: a new worker's context gets them too. */
static _Atomic int64_t primary_flags = -1;

bool sv_primary_flags(unsigned *flags) {
    int64_t f = atomic_load(&primary_flags);
    *flags = f < 0 ? 0 : (unsigned)f;
    return f >= 0;
}

SV_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    NEED_DEV(dev);
    struct sv_id_rec q = {0, flags};
    CUresult r = sv_sync(SV_OP_PRIMARY_SET_FLAGS, &q, sizeof q, NULL, 0, NULL, false);
    if (r == CUDA_SUCCESS)
        atomic_store(&primary_flags, (int64_t)flags);
    return r;
}

SV_API CUresult cuCtxGetCurrent(CUcontext *pctx) {
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT();
    *pctx = cur ? SV_CTX : NULL;
    return CUDA_SUCCESS;
}

SV_API CUresult cuCtxSetCurrent(CUcontext ctx) {
    NEED_INIT();
    if (ctx != NULL && ctx != SV_CTX)
        return CUDA_ERROR_INVALID_CONTEXT; /* no context but the primary one is served */
    cur = ctx != NULL;
    return CUDA_SUCCESS;
}

SV_API CUresult cuCtxGetDevice(CUdevice *device) {
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    *device = 0;
    return CUDA_SUCCESS;
}

SV_API CUresult cuCtxSynchronize(void) {
    NEED_CTX();
    return sv_sync(SV_OP_CTX_SYNC, NULL, 0, NULL, 0, NULL, true);
}

/* The limits the process set: a new worker's context gets them too (replay.c). */
static struct {
    pthread_mutex_t mu;
    uint32_t set;
    uint64_t v[SV_LIMITS];
} LIM = {.mu = PTHREAD_MUTEX_INITIALIZER};

uint32_t sv_limits(uint64_t v[SV_LIMITS]) {
    pthread_mutex_lock(&LIM.mu);
    uint32_t set = LIM.set;
    memcpy(v, LIM.v, sizeof LIM.v);
    pthread_mutex_unlock(&LIM.mu);
    return set;
}

SV_API CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    NEED_CTX();
    struct sv_limit_rec q = {(uint32_t)limit, 1, value};
    CUresult r = sv_sync(SV_OP_CTX_LIMIT, &q, sizeof q, NULL, 0, NULL, false);
    if (r == CUDA_SUCCESS && (unsigned)limit < SV_LIMITS) {
        pthread_mutex_lock(&LIM.mu);
        LIM.set |= 1u << limit;
        LIM.v[limit] = value; /* as asked: the new worker's driver rounds or clamps it as this one did */
        pthread_mutex_unlock(&LIM.mu);
    }
    return r;
}

/* Asked of the worker: its driver may have rounded what was set. */
SV_API CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit) {
    if (!pvalue)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    struct sv_limit_rec q = {(uint32_t)limit, 0, 0};
    uint64_t v = 0;
    CUresult r = sv_sync(SV_OP_CTX_LIMIT, &q, sizeof q, &v, sizeof v, NULL, false);
    if (r == CUDA_SUCCESS)
        *pvalue = (size_t)v;
    return r;
}

/* The device's, asked once (a constant of the GPU, like its name). */
static CUresult prio_range(int *least, int *greatest) {
    int32_t v[2] = {0, 0};
    CUresult r = query(SV_Q_PRIO_RANGE, 0, v, sizeof v, NULL);
    if (r == CUDA_SUCCESS) {
        *least = v[0];
        *greatest = v[1];
    }
    return r;
}

SV_API CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    NEED_CTX();
    int l, g;
    CUresult r = prio_range(&l, &g);
    if (r == CUDA_SUCCESS) {
        if (leastPriority)
            *leastPriority = l;
        if (greatestPriority)
            *greatestPriority = g;
    }
    return r;
}

/* ---- memory ---- */

static CUresult alloc_reply(unsigned op, const void *q, uint32_t qlen, CUdeviceptr *dptr, uint64_t size) {
    uint64_t p = 0;
    CUresult r = sv_sync(op, q, qlen, &p, sizeof p, NULL, false);
    if (r == CUDA_SUCCESS) {
        *dptr = p;
        sv_range_add(p, size);
    }
    return r;
}

SV_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    struct sv_u64_rec q = {bytesize};
    return alloc_reply(SV_OP_MEM_ALLOC, &q, sizeof q, dptr, bytesize);
}

SV_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elem) {
    if (!dptr || !pitch)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    struct sv_pitch_rec q = {width, height, elem, 0};
    uint64_t v[2];
    CUresult r = sv_sync(SV_OP_MEM_ALLOC_PITCH, &q, sizeof q, v, sizeof v, NULL, false);
    if (r == CUDA_SUCCESS) {
        *dptr = v[0];
        *pitch = (size_t)v[1];
        sv_range_add(v[0], v[1] * height);
    }
    return r;
}

SV_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
    NEED_CTX();
    struct sv_u64_rec q = {dptr};
    CUresult r = sv_sync(SV_OP_MEM_FREE, &q, sizeof q, NULL, 0, NULL, false);
    if (r == CUDA_SUCCESS)
        sv_range_del(dptr);
    return r;
}

SV_API CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
    if (!free_ || !total)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    uint64_t v[2];
    CUresult r = query(SV_Q_MEMINFO, 0, v, sizeof v, NULL);
    if (r == CUDA_SUCCESS) {
        *free_ = (size_t)v[0];
        *total = (size_t)v[1];
    }
    return r;
}

SV_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    NEED_CTX();
    struct sv_u64_rec q = {dptr};
    uint64_t v[2];
    CUresult r = sv_sync(SV_OP_MEM_RANGE, &q, sizeof q, v, sizeof v, NULL, false);
    if (r == CUDA_SUCCESS) {
        if (pbase)
            *pbase = v[0];
        if (psize)
            *psize = (size_t)v[1];
    }
    return r;
}

SV_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream h) {
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    struct sv_mem_async_rec q = {bytesize, 0, 0};
    CUresult r = sv_stream_arg(h, &q.stream);
    if (r != CUDA_SUCCESS)
        return r;
    cap_taint(q.stream, "a stream-ordered allocation");
    return alloc_reply(SV_OP_MEM_ALLOC_ASYNC, &q, sizeof q, dptr, bytesize);
}

SV_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream h) {
    NEED_CTX();
    struct sv_mem_async_rec q = {dptr, 0, 0};
    CUresult r = sv_stream_arg(h, &q.stream);
    if (r != CUDA_SUCCESS || (r = sv_async(SV_OP_MEM_FREE_ASYNC, &q, sizeof q)) != CUDA_SUCCESS)
        return r;
    cap_taint(q.stream, "a stream-ordered free");
    sv_range_del(dptr);
    return CUDA_SUCCESS;
}

#define HOST_MEM_WHY                                                                                                   \
    "pinned host memory would have to be shared memory that the worker maps too; served mode does not have it yet"
SV_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
    (void)pp;
    (void)bytesize;
    SV_REFUSE(HOST_MEM_WHY);
}
SV_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
    (void)pp;
    (void)bytesize;
    (void)flags;
    SV_REFUSE(HOST_MEM_WHY);
}
SV_API CUresult cuMemFreeHost(void *p) {
    (void)p;
    SV_REFUSE(HOST_MEM_WHY);
}
SV_API CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags) {
    (void)p;
    (void)bytesize;
    (void)flags;
    SV_REFUSE(HOST_MEM_WHY);
}
SV_API CUresult cuMemHostUnregister(void *p) {
    (void)p;
    SV_REFUSE(HOST_MEM_WHY);
}

/* ---- copies, through the staging slots ---- */

/* Host to device: each chunk is copied into a staging slot here. Async: returns once all are staged. */

static CUresult htod_in(CUdeviceptr dst, const void *src, size_t n, uint32_t stream, bool async) {
    uint32_t reply = 0;
    CUresult r;
    if (async)
        cap_taint(stream, "a copy from host memory (staged: its source would be gone)");
    if (!async && (r = sv_reply_claim(&reply)) != CUDA_SUCCESS)
        return r;
    r = CUDA_SUCCESS;
    for (size_t off = 0; off < n && r == CUDA_SUCCESS;) {
        size_t len = n - off < SV_STAGE_BYTES ? n - off : SV_STAGE_BYTES;
        uint32_t slot;
        if ((r = sv_stage_claim(&slot)) != CUDA_SUCCESS)
            break;
        memcpy(sv_sh->stage[slot], (const char *)src + off, len);
        bool last = off + len == n;
        sv_slot s;
        r = sv_begin(&s, SV_OP_HTOD, sizeof(struct sv_rec) + sizeof(struct sv_copy_rec), async ? 0 : reply + 1,
                     async || last ? 0 : SV_F_GROUP);
        if (r != CUDA_SUCCESS)
            break;
        struct sv_copy_rec q = {dst + off, stream, slot, (uint32_t)len, async};
        memcpy(s.payload, &q, sizeof q);
        sv_commit(&s);
        off += len;
    }
    if (!async) {
        if (r == CUDA_SUCCESS)
            r = sv_reply_wait(reply, NULL, 0, NULL);
        sv_reply_release(reply);
        r = sv_take_deferred(r);
    }
    return r;
}

static CUresult htod(CUdeviceptr dst, const void *src, size_t n, uint32_t stream, bool async) {
    if (n == 0)
        return CUDA_SUCCESS;
    if (!src)
        return CUDA_ERROR_INVALID_VALUE;
    dst = sv_moved_addr(dst, n);
    ENTER();
    CUresult r = htod_in(dst, src, n, stream, async);
    sv_leave();
    return r;
}

#define DTOH_INFLIGHT 4u

/* Device to host (pageable: done when it returns), a few chunks in flight. */
static CUresult dtoh_in(void *dst, CUdeviceptr src, size_t n, uint32_t stream, bool async) {
    if (async)
        cap_taint(stream, "a copy to host memory (staged)");
    struct {
        uint32_t slot;
        size_t off, len;
    } q[DTOH_INFLIGHT];
    unsigned qh = 0, qn = 0;
    size_t off = 0;
    CUresult r = CUDA_SUCCESS;
    while ((off < n && r == CUDA_SUCCESS) || qn) {
        uint32_t slot;
        /* A thread that holds filled slots empties one before it waits for another: no two wait on each other. */
        if (off < n && r == CUDA_SUCCESS && qn < DTOH_INFLIGHT &&
            (sv_stage_try(&slot) || (qn == 0 && (r = sv_stage_claim(&slot)) == CUDA_SUCCESS))) {
            size_t len = n - off < SV_STAGE_BYTES ? n - off : SV_STAGE_BYTES;
            sv_slot s;
            r = sv_begin(&s, SV_OP_DTOH, sizeof(struct sv_rec) + sizeof(struct sv_copy_rec), 0, 0);
            if (r != CUDA_SUCCESS) {
                sv_stage_release(slot);
                continue;
            }
            struct sv_copy_rec c = {src + off, stream, slot, (uint32_t)len, async};
            memcpy(s.payload, &c, sizeof c);
            sv_commit(&s);
            unsigned at = (qh + qn) % DTOH_INFLIGHT;
            q[at].slot = slot;
            q[at].off = off;
            q[at].len = len;
            qn++;
            off += len;
            continue;
        }
        if (!qn)
            break;
        CUresult rr = sv_stage_wait(q[qh].slot);
        if (rr == SV_GONE)
            return rr;
        if (rr == CUDA_SUCCESS && r == CUDA_SUCCESS)
            memcpy((char *)dst + q[qh].off, sv_sh->stage[q[qh].slot], q[qh].len);
        else if (r == CUDA_SUCCESS)
            r = rr;
        sv_stage_release(q[qh].slot);
        qh = (qh + 1) % DTOH_INFLIGHT;
        qn--;
    }
    return sv_take_deferred(r);
}

static CUresult dtoh(void *dst, CUdeviceptr src, size_t n, uint32_t stream, bool async) {
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst)
        return CUDA_ERROR_INVALID_VALUE;
    src = sv_moved_addr(src, n);
    ENTER();
    CUresult r = dtoh_in(dst, src, n, stream, async);
    sv_leave();
    return r;
}

static CUresult dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, uint32_t stream, bool async) {
    struct sv_dtod_rec q = {sv_moved_addr(dst, n), sv_moved_addr(src, n), n, stream, async};
    if (!async)
        return sv_sync(SV_OP_DTOD, &q, sizeof q, NULL, 0, NULL, true);
    CUresult r = sv_async(SV_OP_DTOD, &q, sizeof q);
    if (r == CUDA_SUCCESS)
        sv_cap_note(stream, SV_OP_DTOD, &q, sizeof q);
    return r;
}

SV_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    NEED_CTX();
    return htod(dst, src, n, SV_STREAM_NULL, false);
}

SV_API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    NEED_CTX();
    return dtoh(dst, src, n, SV_STREAM_NULL, false);
}

SV_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    NEED_CTX();
    return dtod(dst, src, n, SV_STREAM_NULL, false);
}

SV_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream h) {
    NEED_CTX();
    uint32_t st;
    CUresult r = sv_stream_arg(h, &st);
    return r != CUDA_SUCCESS ? r : htod(dst, src, n, st, true);
}

SV_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream h) {
    NEED_CTX();
    uint32_t st;
    CUresult r = sv_stream_arg(h, &st);
    return r != CUDA_SUCCESS ? r : dtoh(dst, src, n, st, true);
}

SV_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    NEED_CTX();
    uint32_t st;
    CUresult r = sv_stream_arg(h, &st);
    return r != CUDA_SUCCESS ? r : dtod(dst, src, n, st, true);
}

/* Unified addressing: the side of each pointer is known from the device memory this process has. */
static CUresult copy_any(CUdeviceptr dst, CUdeviceptr src, size_t n, uint32_t st, bool async) {
    dst = sv_moved_addr(dst, n);
    src = sv_moved_addr(src, n);
    bool dd = sv_range_has(dst), sd = sv_range_has(src);
    if (dd && sd)
        return dtod(dst, src, n, st, async);
    if (dd)
        return htod(dst, (const void *)(uintptr_t)src, n, st, async);
    if (sd)
        return dtoh((void *)(uintptr_t)dst, src, n, st, async);
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    /* Host to host: in order with the stream's work, as the driver would run it. */
    struct sv_id_rec q = {st, 0};
    CUresult r = sv_sync(SV_OP_STREAM_SYNC, &q, sizeof q, NULL, 0, NULL, true);
    if (r == CUDA_SUCCESS)
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return r;
}

SV_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    NEED_CTX();
    return copy_any(dst, src, n, SV_STREAM_NULL, false);
}

SV_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    NEED_CTX();
    uint32_t st;
    CUresult r = sv_stream_arg(h, &st);
    return r != CUDA_SUCCESS ? r : copy_any(dst, src, n, st, true);
}

static CUresult memset_any(CUdeviceptr dst, uint32_t val, size_t n, unsigned elem, CUstream h, bool async) {
    NEED_CTX();
    struct sv_memset_rec q = {sv_moved_addr(dst, n * elem), n, val, elem, 0, async};
    CUresult r = async ? sv_stream_arg(h, &q.stream) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
        return r;
    if (!async)
        return sv_sync(SV_OP_MEMSET, &q, sizeof q, NULL, 0, NULL, true);
    if ((r = sv_async(SV_OP_MEMSET, &q, sizeof q)) == CUDA_SUCCESS)
        sv_cap_note(q.stream, SV_OP_MEMSET, &q, sizeof q);
    return r;
}

SV_API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return memset_any(d, v, n, 1, NULL, false); }
SV_API CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) {
    return memset_any(d, v, n, 2, NULL, false);
}
SV_API CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return memset_any(d, v, n, 4, NULL, false); }
SV_API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream h) {
    return memset_any(d, v, n, 1, h, true);
}
SV_API CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream h) {
    return memset_any(d, v, n, 2, h, true);
}
SV_API CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream h) {
    return memset_any(d, v, n, 4, h, true);
}

/* ---- what a stream capture forwards, kept to capture it again (client.h: sv_caplog) ---- */

#define CAP_SESSIONS 8u
#define CAP_EVENTS 64u
static struct {
    pthread_mutex_t mu;
    _Atomic int n; /* sessions: none is the common case, looked at without the lock */
    sv_caplog *s[CAP_SESSIONS];
    struct {
        uint32_t ev;
        sv_caplog *log;
    } ev[CAP_EVENTS]; /* events recorded inside a capture: a stream that waits on one joins it */
    unsigned nev;
} CAP = {.mu = PTHREAD_MUTEX_INITIALIZER};

void sv_caplog_put(sv_caplog *l) {
    if (l && atomic_fetch_sub(&l->refs, 1) == 1) {
        free(l->buf);
        free(l);
    }
}

/* The capture stream belongs to (CAP.mu held), or NULL. */
static sv_caplog *cap_of(uint32_t stream) {
    for (unsigned i = 0; i < CAP_SESSIONS; i++) {
        sv_caplog *l = CAP.s[i];
        for (uint32_t j = 0; l && j < l->nstreams; j++)
            if (l->streams[j] == stream)
                return l;
    }
    return NULL;
}

static void cap_append(sv_caplog *l, unsigned op, const void *pl, uint32_t plen) {
    size_t need = 8 + ((size_t)plen + 7) / 8 * 8;
    if (l->len + need > l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4096;
        while (cap < l->len + need)
            cap *= 2;
        uint8_t *b = realloc(l->buf, cap);
        if (!b) {
            l->bad = "out of memory keeping its records";
            return;
        }
        l->buf = b;
        l->cap = cap;
    }
    uint32_t h[2] = {op, plen};
    memcpy(l->buf + l->len, h, sizeof h);
    memcpy(l->buf + l->len + 8, pl, plen);
    memset(l->buf + l->len + 8 + plen, 0, need - 8 - plen);
    l->len += need;
}

/* A record forwarded on stream: kept if the stream captures. */
void sv_cap_note(uint32_t stream, unsigned op, const void *pl, uint32_t plen) {
    if (__builtin_expect(!atomic_load_explicit(&CAP.n, memory_order_relaxed), 1))
        return;
    pthread_mutex_lock(&CAP.mu);
    sv_caplog *l = cap_of(stream);
    if (l && !l->bad)
        cap_append(l, op, pl, plen);
    if (l && op == SV_OP_EVENT_RECORD && CAP.nev < CAP_EVENTS) {
        const struct sv_pair_rec *q = pl;
        CAP.ev[CAP.nev].ev = q->a;
        CAP.ev[CAP.nev++].log = l;
    }
    pthread_mutex_unlock(&CAP.mu);
}

bool sv_cap_active(uint32_t stream) {
    if (__builtin_expect(!atomic_load_explicit(&CAP.n, memory_order_relaxed), 1))
        return false;
    pthread_mutex_lock(&CAP.mu);
    bool on = cap_of(stream) != NULL;
    pthread_mutex_unlock(&CAP.mu);
    return on;
}

/* Something forwarded on stream that capturing again would not reproduce. */
static void cap_taint(uint32_t stream, const char *why) {
    if (__builtin_expect(!atomic_load_explicit(&CAP.n, memory_order_relaxed), 1))
        return;
    pthread_mutex_lock(&CAP.mu);
    sv_caplog *l = cap_of(stream);
    if (l && !l->bad)
        l->bad = why;
    pthread_mutex_unlock(&CAP.mu);
}

/* cuStreamWaitEvent: a stream that waits on an event recorded in a capture joins that capture. */
static void cap_wait(const struct sv_pair_rec *q) {
    if (__builtin_expect(!atomic_load_explicit(&CAP.n, memory_order_relaxed), 1))
        return;
    pthread_mutex_lock(&CAP.mu);
    sv_caplog *l = cap_of(q->a);
    for (unsigned i = CAP.nev; !l && i-- > 0;)
        if (CAP.ev[i].ev == q->b) {
            l = CAP.ev[i].log;
            if (l->nstreams < SV_CAP_STREAMS)
                l->streams[l->nstreams++] = q->a;
            else
                l->bad = "more than 16 streams";
        }
    if (l && !l->bad)
        cap_append(l, SV_OP_STREAM_WAIT_EVENT, q, sizeof *q);
    pthread_mutex_unlock(&CAP.mu);
}

static void cap_begin(uint32_t stream, uint32_t mode) {
    sv_caplog *l = calloc(1, sizeof *l);
    pthread_mutex_lock(&CAP.mu);
    unsigned i = 0;
    while (i < CAP_SESSIONS && CAP.s[i])
        i++;
    if (l && i < CAP_SESSIONS && !cap_of(stream)) {
        atomic_store(&l->refs, 1);
        l->origin = stream;
        l->mode = mode;
        l->streams[0] = stream;
        l->nstreams = 1;
        CAP.s[i] = l;
        atomic_fetch_add(&CAP.n, 1);
        l = NULL;
    }
    pthread_mutex_unlock(&CAP.mu);
    free(l); /* no room: the graph of this capture cannot be made again in another worker (said then) */
}

/* The capture that began on stream ends: its record, for the graph (NULL: none was kept). */
static sv_caplog *cap_end(uint32_t stream) {
    sv_caplog *l = NULL;
    pthread_mutex_lock(&CAP.mu);
    for (unsigned i = 0; i < CAP_SESSIONS; i++)
        if (CAP.s[i] && CAP.s[i]->origin == stream) {
            l = CAP.s[i];
            CAP.s[i] = NULL;
            atomic_fetch_sub(&CAP.n, 1);
        }
    unsigned k = 0;
    for (unsigned i = 0; i < CAP.nev; i++)
        if (CAP.ev[i].log != l)
            CAP.ev[k++] = CAP.ev[i];
    CAP.nev = k;
    pthread_mutex_unlock(&CAP.mu);
    return l;
}

/* ---- streams and events ---- */

/* A creation with a client-chosen id: asynchronous, the worker fails it later only where the driver would. A
 * stream with a priority (op SV_OP_STREAM_CREATE_PRIO) has it clamped already. */
static CUresult create(unsigned kind, unsigned op, unsigned flags, int priority, void **out) {
    uint32_t id = sv_id_new(kind);
    if (!id)
        return CUDA_ERROR_OUT_OF_MEMORY; /* the worker's table for this kind is full */
    sv_flags *d = calloc(1, sizeof *d);
    if (!d) {
        sv_id_drop(kind, id);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    d->flags = flags;
    d->priority = priority;
    CUresult r;
    if (op == SV_OP_STREAM_CREATE_PRIO) {
        struct sv_pair_rec q = {id, (uint32_t)priority, flags, 0};
        r = sv_async(op, &q, sizeof q);
    } else {
        struct sv_id_rec q = {id, flags};
        r = sv_async(op, &q, sizeof q);
    }
    if (r != CUDA_SUCCESS) {
        free(d);
        sv_id_drop(kind, id);
        return r;
    }
    sv_id_set(kind, id, d);
    *out = sv_handle(kind, id);
    return CUDA_SUCCESS;
}

/* Streams that capture (begun here, not ended): none is the common case, in which a capture query is
 * answered here, without a round trip. */
static _Atomic int capturing;

static void capture_mark(uint32_t stream, bool on) {
    sv_flags *d = stream >= SV_STREAM_FIRST_ID ? sv_id_data(SV_K_STREAM, stream) : NULL;
    if (d && atomic_exchange(&d->capturing, on) != on)
        atomic_fetch_add(&capturing, on ? 1 : -1);
}

static CUresult destroy(unsigned kind, unsigned op, const void *h) {
    NEED_CTX();
    uint32_t id = sv_id(kind, h);
    if (!id)
        return CUDA_ERROR_INVALID_HANDLE;
    if (kind == SV_K_STREAM)
        capture_mark(id, false); /* the driver ends a destroyed stream's capture */
    struct sv_id_rec q = {id, 0};
    CUresult r = sv_async(op, &q, sizeof q);
    if (r == CUDA_SUCCESS)
        sv_id_drop(kind, id); /* its next user comes after this destroy in the ring */
    return r;
}

SV_API CUresult cuStreamCreate(CUstream *ph, unsigned int flags) {
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    return create(SV_K_STREAM, SV_OP_STREAM_CREATE, flags, 0, (void **)ph);
}

/* Clamped here to the device's range, as the driver clamps it, so the priority kept (cuStreamGetPriority, a
 * replay) is the one the stream has. */
SV_API CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority) {
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    int least, greatest;
    CUresult r = prio_range(&least, &greatest);
    if (r != CUDA_SUCCESS)
        return r;
    if (priority > least)
        priority = least;
    if (priority < greatest)
        priority = greatest;
    return create(SV_K_STREAM, SV_OP_STREAM_CREATE_PRIO, flags, priority, (void **)ph);
}

/* A stream's priority and flags, from its record; the NULL, legacy and per-thread streams have 0 and 0. */
static CUresult stream_record(CUstream h, int *priority, unsigned *flags) {
    NEED_CTX();
    uint32_t id;
    CUresult r = sv_stream_arg(h, &id);
    if (r != CUDA_SUCCESS)
        return r;
    const sv_flags *d = id >= SV_STREAM_FIRST_ID ? sv_id_data(SV_K_STREAM, id) : NULL;
    if (priority)
        *priority = d ? d->priority : 0;
    if (flags)
        *flags = d ? d->flags : 0;
    return CUDA_SUCCESS;
}

SV_API CUresult cuStreamGetPriority(CUstream h, int *priority) {
    if (!priority)
        return CUDA_ERROR_INVALID_VALUE;
    return stream_record(h, priority, NULL);
}

SV_API CUresult cuStreamGetFlags(CUstream h, unsigned int *flags) {
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    return stream_record(h, NULL, flags);
}

/*
 * A stream's capture status (and the capture's id). While no stream of the process captures, every stream's
 * status is NONE and the legacy stream is not refused: answered here, as PyTorch's allocator asks on every
 * allocation. During a capture the worker's driver answers (it knows joined and invalidated captures).
 */
static CUresult capture_info(CUstream h, CUstreamCaptureStatus *status, cuuint64_t *id) {
    NEED_CTX();
    uint32_t st;
    CUresult r = sv_stream_arg(h, &st);
    if (r != CUDA_SUCCESS)
        return r;
    if (atomic_load_explicit(&capturing, memory_order_acquire) == 0) {
        *status = CU_STREAM_CAPTURE_STATUS_NONE;
        return CUDA_SUCCESS;
    }
    struct sv_id_rec q = {st, 0};
    struct sv_capture_info o;
    memset(&o, 0, sizeof o);
    r = sv_sync(SV_OP_CAPTURE_INFO, &q, sizeof q, &o, sizeof o, NULL, false);
    if (r == CUDA_SUCCESS) {
        *status = (CUstreamCaptureStatus)o.status;
        if (id && o.status != CU_STREAM_CAPTURE_STATUS_NONE)
            *id = o.id;
    }
    return r;
}

SV_API CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *status) {
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    return capture_info(h, status, NULL);
}

SV_API CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                          const CUgraphNode **deps, size_t *ndeps);
SV_API CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                          const CUgraphNode **deps, size_t *ndeps) {
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = capture_info(h, status, id);
    if (r != CUDA_SUCCESS || *status == CU_STREAM_CAPTURE_STATUS_NONE)
        return r;
    /* The graph being built has no handle of this library's before cuStreamEndCapture, and its nodes none at
     * all (graphs are not built node by node in served mode). */
    if (graph || deps || ndeps)
        SV_REFUSE("the graph a capture builds and its nodes are not handed out during the capture");
    return CUDA_SUCCESS;
}

/* The calling thread's capture mode is the application's; the worker runs every thread's calls on its one
 * thread, whose mode follows the last one set in the process (ring order: calls after the exchange see it). */
static _Thread_local int thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* Any value is passed on, as the driver takes any (measured). */
SV_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT();
    int m = (int)*mode;
    if (atomic_exchange(&worker_mode, m) != m) {
        struct sv_id_rec q = {(uint32_t)m, 0};
        CUresult r = sv_async(SV_OP_CAPTURE_MODE, &q, sizeof q);
        if (r != CUDA_SUCCESS)
            return r;
    }
    *mode = (CUstreamCaptureMode)thread_mode;
    thread_mode = m;
    return CUDA_SUCCESS;
}

SV_API CUresult cuStreamDestroy_v2(CUstream h) { return destroy(SV_K_STREAM, SV_OP_STREAM_DESTROY, h); }

static CUresult stream_sync_op(unsigned op, CUstream h) {
    NEED_CTX();
    struct sv_id_rec q = {0, 0};
    CUresult r = sv_stream_arg(h, &q.id);
    return r != CUDA_SUCCESS ? r : sv_sync(op, &q, sizeof q, NULL, 0, NULL, true);
}

SV_API CUresult cuStreamSynchronize(CUstream h) { return stream_sync_op(SV_OP_STREAM_SYNC, h); }
SV_API CUresult cuStreamQuery(CUstream h) { return stream_sync_op(SV_OP_STREAM_QUERY, h); }

SV_API CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags) {
    NEED_CTX();
    struct sv_pair_rec q = {0, sv_id(SV_K_EVENT, e), flags, 0};
    CUresult r = sv_stream_arg(h, &q.a);
    if (r != CUDA_SUCCESS)
        return r;
    if (!q.b)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((r = sv_async(SV_OP_STREAM_WAIT_EVENT, &q, sizeof q)) == CUDA_SUCCESS)
        cap_wait(&q);
    return r;
}

SV_API CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode) {
    NEED_CTX();
    struct sv_pair_rec q = {0, 0, (uint32_t)mode, 0};
    CUresult r = sv_stream_arg(h, &q.a);
    if (r != CUDA_SUCCESS ||
        (r = sv_sync(SV_OP_STREAM_BEGIN_CAPTURE, &q, sizeof q, NULL, 0, NULL, false)) != CUDA_SUCCESS)
        return r;
    capture_mark(q.a, true);
    if (q.a >= SV_STREAM_FIRST_ID)
        cap_begin(q.a, q.flags);
    return CUDA_SUCCESS;
}

SV_API CUresult cuStreamEndCapture(CUstream h, CUgraph *pg) {
    if (!pg)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    struct sv_pair_rec q = {0, 0, 0, 0};
    CUresult r = sv_stream_arg(h, &q.a);
    if (r != CUDA_SUCCESS)
        return r;
    if (!(q.b = sv_id_new(SV_K_GRAPH)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = sv_sync(SV_OP_STREAM_END_CAPTURE, &q, sizeof q, NULL, 0, NULL, false);
    if (r != CUDA_ERROR_INVALID_HANDLE && r != CUDA_ERROR_ILLEGAL_STATE && r != SV_GONE)
        capture_mark(q.a, false); /* ended, with a graph or invalidated */
    sv_caplog *log = cap_end(q.a);
    if (r != CUDA_SUCCESS) {
        sv_caplog_put(log);
        sv_id_drop(SV_K_GRAPH, q.b);
        return r;
    }
    /* What the capture forwarded: a new worker captures it again (replay.c). */
    sv_id_set(SV_K_GRAPH, q.b, log);
    *pg = sv_handle(SV_K_GRAPH, q.b);
    return CUDA_SUCCESS;
}

SV_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags) {
    if (!pe)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    struct sv_graph_rec q = {0, sv_id(SV_K_GRAPH, g), flags};
    if (!q.graph)
        return CUDA_ERROR_INVALID_HANDLE;
    sv_exec *x = malloc(sizeof *x);
    if (!x)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!(q.exec = sv_id_new(SV_K_EXEC))) {
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = sv_sync(SV_OP_GRAPH_INSTANTIATE, &q, sizeof q, NULL, 0, NULL, false);
    if (r != CUDA_SUCCESS) {
        free(x);
        sv_id_drop(SV_K_EXEC, q.exec);
        return r;
    }
    /* The exec keeps the graph's capture: the graph is often destroyed while its exec lives on. */
    x->log = sv_id_data(SV_K_GRAPH, q.graph);
    if (x->log)
        atomic_fetch_add(&x->log->refs, 1);
    x->flags = flags;
    sv_id_set(SV_K_EXEC, q.exec, x);
    *pe = sv_handle(SV_K_EXEC, q.exec);
    return CUDA_SUCCESS;
}

SV_API CUresult cuGraphLaunch(CUgraphExec e, CUstream h) {
    NEED_CTX();
    struct sv_graph_rec q = {sv_id(SV_K_EXEC, e), 0, 0};
    if (!q.exec)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = sv_stream_arg(h, &q.graph); /* graph: the stream, in a launch */
    if (r != CUDA_SUCCESS)
        return r;
    cap_taint(q.graph, "a graph launched into it");
    return sv_async(SV_OP_GRAPH_LAUNCH, &q, sizeof q);
}

SV_API CUresult cuGraphExecDestroy(CUgraphExec e) { return destroy(SV_K_EXEC, SV_OP_GRAPH_EXEC_DESTROY, e); }
SV_API CUresult cuGraphDestroy(CUgraph g) { return destroy(SV_K_GRAPH, SV_OP_GRAPH_DESTROY, g); }

/* The number of a graph's nodes (PyTorch asks it of every graph it captures); the nodes themselves are the
 * worker's, which no handle of this library's stands for. */
SV_API CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *numNodes) {
    if (!numNodes)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    struct sv_id_rec q = {sv_id(SV_K_GRAPH, g), 0};
    if (!q.id)
        return CUDA_ERROR_INVALID_HANDLE;
    if (nodes && *numNodes)
        SV_REFUSE("a graph's nodes are not forwarded (their number is)");
    uint64_t n = 0;
    CUresult r = sv_sync(SV_OP_GRAPH_NODES, &q, sizeof q, &n, sizeof n, NULL, false);
    if (r == CUDA_SUCCESS)
        *numNodes = (size_t)n;
    return r;
}

SV_API CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *data) {
    (void)h;
    (void)fn;
    (void)data;
    SV_REFUSE("a host function runs in the application's process, where no stream runs in served mode");
}

static CUresult memop(CUstream h, CUdeviceptr addr, uint64_t value, unsigned kind, unsigned flags) {
    NEED_CTX();
    struct sv_memop_rec q = {addr, value, 0, kind, flags, 0};
    CUresult r = sv_stream_arg(h, &q.stream);
    if (r != CUDA_SUCCESS || (r = sv_async(SV_OP_STREAM_MEMOP, &q, sizeof q)) != CUDA_SUCCESS)
        return r;
    sv_cap_note(q.stream, SV_OP_STREAM_MEMOP, &q, sizeof q);
    return CUDA_SUCCESS;
}

SV_API CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f) {
    return memop(s, a, v, 0, f);
}
SV_API CUresult cuStreamWriteValue64_v2(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int f) {
    return memop(s, a, v, 1, f);
}
SV_API CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f) {
    return memop(s, a, v, 2, f);
}
SV_API CUresult cuStreamWaitValue64_v2(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int f) {
    return memop(s, a, v, 3, f);
}

SV_API CUresult cuEventCreate(CUevent *ph, unsigned int flags) {
    if (!ph || (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)))
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & CU_EVENT_INTERPROCESS)
        SV_REFUSE("interprocess events (IPC handles) are not served");
    NEED_CTX();
    return create(SV_K_EVENT, SV_OP_EVENT_CREATE, flags, 0, (void **)ph);
}

SV_API CUresult cuEventDestroy_v2(CUevent e) { return destroy(SV_K_EVENT, SV_OP_EVENT_DESTROY, e); }

static CUresult event_record(CUevent e, CUstream h, unsigned flags) {
    NEED_CTX();
    struct sv_pair_rec q = {sv_id(SV_K_EVENT, e), 0, flags, 0};
    if (!q.a)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = sv_stream_arg(h, &q.b);
    if (r != CUDA_SUCCESS || (r = sv_async(SV_OP_EVENT_RECORD, &q, sizeof q)) != CUDA_SUCCESS)
        return r;
    sv_cap_note(q.b, SV_OP_EVENT_RECORD, &q, sizeof q);
    return CUDA_SUCCESS;
}

SV_API CUresult cuEventRecord(CUevent e, CUstream h) { return event_record(e, h, CU_EVENT_RECORD_DEFAULT); }

/* Asynchronous as cuEventRecord: flags the driver does not know are said now, not at the next synchronization. */
SV_API CUresult cuEventRecordWithFlags(CUevent e, CUstream h, unsigned int flags) {
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    /* An external record is for a capture's event node: outside any, the driver refuses it (measured). */
    if ((flags & CU_EVENT_RECORD_EXTERNAL) && atomic_load(&capturing) == 0) {
        NEED_CTX();
        return sv_id(SV_K_EVENT, e) ? CUDA_ERROR_ILLEGAL_STATE : CUDA_ERROR_INVALID_HANDLE;
    }
    return event_record(e, h, flags);
}

static CUresult event_sync_op(unsigned op, CUevent e) {
    NEED_CTX();
    struct sv_id_rec q = {sv_id(SV_K_EVENT, e), 0};
    if (!q.id)
        return CUDA_ERROR_INVALID_HANDLE;
    return sv_sync(op, &q, sizeof q, NULL, 0, NULL, true);
}

SV_API CUresult cuEventQuery(CUevent e) { return event_sync_op(SV_OP_EVENT_QUERY, e); }
SV_API CUresult cuEventSynchronize(CUevent e) { return event_sync_op(SV_OP_EVENT_SYNC, e); }

SV_API CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    struct sv_pair_rec q = {sv_id(SV_K_EVENT, a), sv_id(SV_K_EVENT, b), 0, 0};
    if (!q.a || !q.b)
        return CUDA_ERROR_INVALID_HANDLE;
    float v = 0;
    CUresult r = sv_sync(SV_OP_EVENT_ELAPSED, &q, sizeof q, &v, sizeof v, NULL, false);
    if (r == CUDA_SUCCESS)
        *ms = v;
    return r;
}

#undef cuEventElapsedTime
SV_API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b);
SV_API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime_v2(ms, a, b); }

/* ---- modules, libraries, kernels ---- */

/*
 * cudart's wrapper around a fat binary ({int32 magic 0x466243B1, int32 version 1 or 2, the fat binary, unused}),
 * which the driver's loaders take too: its fat binary is what the worker gets, since the wrapper's pointer means
 * nothing in another process. 0 with *out, or CUDA_ERROR_INVALID_IMAGE for a wrapper that holds none.
 */
static CUresult image_unwrap(const void *image, const void **out) {
    uint32_t magic;
    memcpy(&magic, image, sizeof magic);
    *out = image;
    if (magic != 0x466243B1u)
        return CUDA_SUCCESS;
    int32_t version;
    const void *data;
    memcpy(&version, (const char *)image + 4, sizeof version);
    memcpy(&data, (const char *)image + 8, sizeof data);
    if ((version != 1 && version != 2) || !data)
        return CUDA_ERROR_INVALID_IMAGE;
    memcpy(&magic, data, sizeof magic);
    if (magic != 0xBA55ED50u)
        return CUDA_ERROR_INVALID_IMAGE;
    *out = data;
    return CUDA_SUCCESS;
}

/* An image's size from its header: an ELF's section and program headers' end, a fat binary's, or PTX text. A
 * wrapper is unwrapped first (image_unwrap). */
static uint64_t image_size(const void *image) {
    const unsigned char *p = image;
    if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F' && p[4] == 2) {
        uint64_t shoff, phoff;
        uint16_t shentsize, shnum, phentsize, phnum;
        memcpy(&phoff, p + 0x20, 8);
        memcpy(&shoff, p + 0x28, 8);
        memcpy(&phentsize, p + 0x36, 2);
        memcpy(&phnum, p + 0x38, 2);
        memcpy(&shentsize, p + 0x3a, 2);
        memcpy(&shnum, p + 0x3c, 2);
        uint64_t a = shoff + (uint64_t)shentsize * shnum, b = phoff + (uint64_t)phentsize * phnum;
        return a > b ? a : b;
    }
    uint32_t magic;
    memcpy(&magic, p, 4);
    if (magic == 0xBA55ED50u) { /* fat binary: magic, version (2), header size (2), payload size (8) */
        uint16_t hs;
        uint64_t fs;
        memcpy(&hs, p + 6, 2);
        memcpy(&fs, p + 8, 8);
        return (uint64_t)hs + fs;
    }
    return strlen(image) + 1; /* PTX text */
}

/*
 * An image through staging (chunks that the reply slot's group collects), then its load record from rec
 * (op, payload of plen bytes), answered in reply; one image sequence at a time. The image is kept for a replay.
 */
CUresult sv_send_image(const void *image, uint64_t size, unsigned op, void *rec, uint32_t plen, void *out, uint32_t cap,
                       uint32_t *outlen) {
    memcpy(rec, &size, sizeof size); /* every load record starts with the size */
    ENTER();
    uint32_t reply;
    CUresult r = sv_reply_claim(&reply);
    if (r != CUDA_SUCCESS) {
        sv_leave();
        return r;
    }
    sv_image_lock();
    for (uint64_t off = 0; off < size && r == CUDA_SUCCESS;) {
        uint32_t len = size - off < SV_STAGE_BYTES ? (uint32_t)(size - off) : SV_STAGE_BYTES, slot;
        if ((r = sv_stage_claim(&slot)) != CUDA_SUCCESS)
            break;
        memcpy(sv_sh->stage[slot], (const char *)image + off, len);
        sv_slot s;
        if ((r = sv_begin(&s, SV_OP_IMAGE_CHUNK, sizeof(struct sv_rec) + sizeof(struct sv_image_rec), reply + 1,
                          SV_F_GROUP)) != CUDA_SUCCESS)
            break;
        struct sv_image_rec q = {off, size, slot, len};
        memcpy(s.payload, &q, sizeof q);
        sv_commit(&s);
        off += len;
    }
    if (r == CUDA_SUCCESS) {
        sv_slot s;
        if ((r = sv_begin(&s, op, (uint32_t)sizeof(struct sv_rec) + plen, reply + 1, 0)) == CUDA_SUCCESS) {
            memcpy(s.payload, rec, plen);
            sv_commit(&s);
        }
    }
    sv_image_unlock();
    if (r == CUDA_SUCCESS)
        r = sv_reply_wait(reply, out, cap, outlen);
    sv_reply_release(reply);
    sv_leave();
    return r;
}

static CUresult load_image(const void *image, unsigned op, void *rec, uint32_t plen, void *out, uint32_t cap,
                           uint32_t *outlen, sv_image **keep) {
    CUresult ur = image_unwrap(image, &image);
    if (ur != CUDA_SUCCESS)
        return ur;
    uint64_t size = image_size(image);
    if (size == 0 || size > SV_MAX_IMAGE)
        return CUDA_ERROR_INVALID_IMAGE;
    sv_image *im = malloc(sizeof *im);
    if (!im || !(im->image = malloc(size))) {
        free(im);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(im->image, image, size);
    im->size = size;
    im->globals = NULL;
    CUresult r = sv_send_image(im->image, size, op, rec, plen, out, cap, outlen);
    /* the load record as sent (its size included), for a replay */
    memset(&im->rec, 0, sizeof im->rec);
    memcpy(&im->rec, rec, plen < sizeof im->rec ? plen : sizeof im->rec);
    if (r != CUDA_SUCCESS) {
        free(im->image);
        free(im);
        return r;
    }
    *keep = im;
    return CUDA_SUCCESS;
}

SV_API CUresult cuModuleLoadData(CUmodule *module, const void *image);
/* The same load: the worker's driver takes a fat binary through cuModuleLoadData. */
/* Read here, where the file is the application's to open (Triton's and PyTorch's compiled kernels come as files),
 * and loaded as its bytes. */
SV_API CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    void *image = NULL;
    CUresult r = gc_read_module_file(fname, SV_MAX_IMAGE, &image);
    if (r != CUDA_SUCCESS)
        return r;
    r = cuModuleLoadData(module, image);
    free(image);
    return r;
}

SV_API CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin) {
    return cuModuleLoadData(module, fatCubin);
}

SV_API CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    struct sv_load_rec q;
    memset(&q, 0, sizeof q);
    if (!(q.id = sv_id_new(SV_K_MODULE)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    sv_image *im = NULL;
    CUresult r = load_image(image, SV_OP_MODULE_LOAD, &q, sizeof q, NULL, 0, NULL, &im);
    if (r != CUDA_SUCCESS) {
        sv_id_drop(SV_K_MODULE, q.id);
        return r;
    }
    sv_id_set(SV_K_MODULE, q.id, im);
    *module = sv_handle(SV_K_MODULE, q.id);
    return CUDA_SUCCESS;
}

SV_API CUresult cuModuleUnload(CUmodule m) { return destroy(SV_K_MODULE, SV_OP_MODULE_UNLOAD, m); }
SV_API CUresult cuLibraryUnload(CUlibrary l) { return destroy(SV_K_LIBRARY, SV_OP_LIBRARY_UNLOAD, l); }

/* JIT options as cuda.h numbers them: those whose value the driver writes back, and the log buffers. */
enum { JIT_WALL_TIME = 2, JIT_INFO_LOG = 3, JIT_INFO_LOG_SIZE = 4, JIT_ERROR_LOG = 5, JIT_ERROR_LOG_SIZE = 6 };

SV_API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                  void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                  void **libraryOptionValues, unsigned int numLibraryOptions) {
    (void)libraryOptions;
    (void)libraryOptionValues;
    if (!library || !code || (numJitOptions && (!jitOptions || !jitOptionsValues)))
        return CUDA_ERROR_INVALID_VALUE;
    if (numLibraryOptions)
        SV_REFUSE("library options are not forwarded to the worker");
    if (numJitOptions > SV_MAX_JIT)
        SV_REFUSE("more than 16 JIT options");
    NEED_CTX();
    struct sv_load_rec q;
    memset(&q, 0, sizeof q);
    q.njit = numJitOptions;
    for (unsigned i = 0; i < numJitOptions; i++) {
        q.jit_opt[i] = (uint32_t)jitOptions[i];
        /* the log buffers are the worker's own; every other option is a value */
        q.jit_val[i] = jitOptions[i] == (CUjit_option)JIT_INFO_LOG || jitOptions[i] == (CUjit_option)JIT_ERROR_LOG
                           ? 0
                           : (uint64_t)(uintptr_t)jitOptionsValues[i];
    }
    if (!(q.id = sv_id_new(SV_K_LIBRARY)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint8_t out[SV_REPLY_DATA];
    uint32_t olen = 0;
    sv_image *im = NULL;
    CUresult r = load_image(code, SV_OP_LIBRARY_LOAD, &q, sizeof q, out, sizeof out, &olen, &im);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_PTX || r == CUDA_ERROR_INVALID_IMAGE ||
        r == CUDA_ERROR_NO_BINARY_FOR_GPU) {
        /* the option values the driver wrote, then the error log and the info log */
        size_t nv = numJitOptions * sizeof(uint64_t);
        if (olen >= nv) {
            const char *elog = (const char *)out + nv;
            const char *end = (const char *)out + olen;
            const char *ez = memchr(elog, 0, (size_t)(end - elog));
            const char *ilog = ez ? ez + 1 : end;
            const char *iz = ilog < end ? memchr(ilog, 0, (size_t)(end - ilog)) : NULL;
            for (unsigned i = 0; i < numJitOptions; i++) {
                uint64_t v;
                memcpy(&v, out + i * sizeof v, sizeof v);
                unsigned o = (unsigned)jitOptions[i];
                const char *log = o == JIT_ERROR_LOG  ? (ez ? elog : NULL)
                                  : o == JIT_INFO_LOG ? (iz ? ilog : NULL)
                                                      : NULL;
                if (o == JIT_WALL_TIME || o == JIT_INFO_LOG_SIZE || o == JIT_ERROR_LOG_SIZE) {
                    jitOptionsValues[i] = (void *)(uintptr_t)v;
                } else if (log && jitOptionsValues[i]) {
                    /* the application's buffer, of the size it gave with the matching size option */
                    size_t cap = 0;
                    unsigned want = o == JIT_ERROR_LOG ? JIT_ERROR_LOG_SIZE : JIT_INFO_LOG_SIZE;
                    for (unsigned j = 0; j < numJitOptions; j++)
                        if ((unsigned)jitOptions[j] == want)
                            cap = (size_t)(uintptr_t)jitOptionsValues[j];
                    if (cap)
                        snprintf(jitOptionsValues[i], cap, "%s", log);
                }
            }
        }
    }
    if (r != CUDA_SUCCESS) {
        sv_id_drop(SV_K_LIBRARY, q.id);
        return r;
    }
    sv_id_set(SV_K_LIBRARY, q.id, im);
    *library = sv_handle(SV_K_LIBRARY, q.id);
    return CUDA_SUCCESS;
}

/* A function's or kernel's id with its layout from the worker's reply. */
static CUresult get_function(unsigned op, unsigned kind, uint32_t owner, unsigned okind, const char *name, void **out) {
    struct sv_get_rec q = {sv_id_new(kind), owner};
    if (!q.id)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sv_layout l;
    uint32_t len = 0;
    CUresult r = name ? sv_sync_named(op, &q, sizeof q, name, &l, sizeof l, &len)
                      : sv_sync(op, &q, sizeof q, &l, sizeof l, &len, false);
    sv_func *f = NULL;
    if (r == CUDA_SUCCESS &&
        (len < offsetof(struct sv_layout, p) || l.n > SV_MAX_PARAMS ||
         len < offsetof(struct sv_layout, p) + l.n * sizeof l.p[0] || l.bytes > SV_MAX_PARAM_BYTES))
        r = CUDA_ERROR_UNKNOWN; /* the worker's answer is not a layout */
    if (r == CUDA_SUCCESS && (!(f = calloc(1, sizeof *f)) || !(f->off = calloc(l.n + 1, sizeof *f->off)) ||
                              !(f->size = calloc(l.n + 1, sizeof *f->size)) || (name && !(f->name = strdup(name)))))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r != CUDA_SUCCESS) {
        if (f) {
            free(f->off);
            free(f->size);
            free(f->name);
            free(f);
        }
        sv_id_drop(kind, q.id); /* the worker made nothing, or the process cannot use what it made */
        return r;
    }
    f->owner = owner;
    f->okind = okind;
    f->cache = -1; /* never set */
    f->n = l.n;
    f->bytes = l.bytes;
    for (uint32_t i = 0; i < l.n; i++) {
        if (l.p[i].off > SV_MAX_PARAM_BYTES || l.p[i].size > SV_MAX_PARAM_BYTES - l.p[i].off) {
            f->n = i; /* never packs past the record */
            break;
        }
        f->off[i] = l.p[i].off;
        f->size[i] = l.p[i].size;
    }
    sv_id_set(kind, q.id, f);
    *out = sv_handle(kind, q.id);
    return CUDA_SUCCESS;
}

SV_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    uint32_t m = sv_id(SV_K_MODULE, hmod);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    return get_function(SV_OP_MODULE_GET_FUNCTION, SV_K_FUNC, m, SV_K_MODULE, name, (void **)hfunc);
}

SV_API CUresult cuLibraryGetKernel(CUkernel *pk, CUlibrary lib, const char *name) {
    if (!pk || !name)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    uint32_t l = sv_id(SV_K_LIBRARY, lib);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    return get_function(SV_OP_LIBRARY_GET_KERNEL, SV_K_KERNEL, l, SV_K_LIBRARY, name, (void **)pk);
}

SV_API CUresult cuKernelGetFunction(CUfunction *pf, CUkernel k) {
    if (!pf)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    uint32_t id = sv_id(SV_K_KERNEL, k);
    if (!id)
        return CUDA_ERROR_INVALID_HANDLE;
    return get_function(SV_OP_KERNEL_GET_FUNCTION, SV_K_FUNC, id, SV_K_KERNEL, NULL, (void **)pf);
}

/* A function (or a kernel launched as one) by its handle: its record, and whether it is a kernel. */
static sv_func *func_of(const void *h, uint32_t *id, bool *kernel) {
    if ((*id = sv_id(SV_K_FUNC, h))) {
        *kernel = false;
        return sv_id_data(SV_K_FUNC, *id);
    }
    if ((*id = sv_id(SV_K_KERNEL, h))) {
        *kernel = true;
        return sv_id_data(SV_K_KERNEL, *id);
    }
    return NULL;
}

static CUresult param_info(const void *h, size_t i, size_t *off, size_t *size) {
    uint32_t id;
    bool k;
    sv_func *f = func_of(h, &id, &k);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (i >= f->n || (!off && !size))
        return CUDA_ERROR_INVALID_VALUE;
    if (off)
        *off = f->off[i];
    if (size)
        *size = f->size[i];
    return CUDA_SUCCESS;
}

SV_API CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size) {
    NEED_INIT();
    return param_info(f, i, off, size);
}
SV_API CUresult cuKernelGetParamInfo(CUkernel k, size_t i, size_t *off, size_t *size) {
    NEED_INIT();
    return param_info(k, i, off, size);
}

/* A function's name: its own, or its kernel's. */
static const char *name_of(const sv_func *f) {
    if (f->name || f->okind != SV_K_KERNEL)
        return f->name;
    const sv_func *k = sv_id_data(SV_K_KERNEL, f->owner);
    return k ? k->name : NULL;
}

SV_API CUresult cuFuncGetName(const char **name, CUfunction h) {
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT();
    uint32_t id;
    bool k;
    sv_func *f = func_of(h, &id, &k);
    if (!f || !name_of(f))
        return CUDA_ERROR_INVALID_HANDLE;
    *name = name_of(f);
    return CUDA_SUCCESS;
}

SV_API CUresult cuKernelGetName(const char **name, CUkernel h) {
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT();
    uint32_t id = sv_id(SV_K_KERNEL, h);
    sv_func *f = id ? sv_id_data(SV_K_KERNEL, id) : NULL;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = f->name;
    return CUDA_SUCCESS;
}

SV_API CUresult cuFuncGetModule(CUmodule *hmod, CUfunction h) {
    if (!hmod)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT();
    uint32_t id = sv_id(SV_K_FUNC, h);
    sv_func *f = id ? sv_id_data(SV_K_FUNC, id) : NULL;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (f->okind != SV_K_MODULE)
        return CUDA_ERROR_NOT_FOUND; /* a library's function belongs to no module */
    *hmod = sv_handle(SV_K_MODULE, f->owner);
    return CUDA_SUCCESS;
}

SV_API CUresult cuKernelGetLibrary(CUlibrary *plib, CUkernel h) {
    if (!plib)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT();
    uint32_t id = sv_id(SV_K_KERNEL, h);
    sv_func *f = id ? sv_id_data(SV_K_KERNEL, id) : NULL;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    *plib = sv_handle(SV_K_LIBRARY, f->owner);
    return CUDA_SUCCESS;
}

/* ---- globals ---- */

pthread_mutex_t sv_func_mu = PTHREAD_MUTEX_INITIALIZER;

/*
 * The old ranges of globals a new worker placed elsewhere, each with where its global is now: a copy, memset or
 * pointer query that names an address in one (the program kept it, or looked it up just before the checkpoint
 * and used it just after) reaches the global where it is. A range stops being one once a global of the worker's
 * takes part of it. Kernels' arguments and pointers stored in device memory are not translated.
 */
typedef struct {
    uint64_t old, size, now;
} moved_range;
static pthread_rwlock_t moved_mu = PTHREAD_RWLOCK_INITIALIZER;
static moved_range *moved_v;
static size_t moved_cap;
static _Atomic size_t moved_n;

/* Ranges whose old addresses [at, at+size) now name a global of the worker's: no longer translated. */
static void moved_drop_overlaps_wr(uint64_t at, uint64_t size) {
    size_t n = atomic_load(&moved_n), k = 0;
    for (size_t i = 0; i < n; i++)
        if (moved_v[i].old + moved_v[i].size <= at || moved_v[i].old >= at + size)
            moved_v[k++] = moved_v[i];
    atomic_store_explicit(&moved_n, k, memory_order_release);
}

/* A global at [at, at+size) now: an old range there names it, not what moved away from it. */
static void moved_taken(uint64_t at, uint64_t size) {
    if (!atomic_load_explicit(&moved_n, memory_order_acquire))
        return;
    pthread_rwlock_wrlock(&moved_mu);
    moved_drop_overlaps_wr(at, size ? size : 1);
    pthread_rwlock_unlock(&moved_mu);
}

/* A global moved from [old, old+size) to now. */
static void moved_add(uint64_t old, uint64_t size, uint64_t now, uint64_t now_size) {
    pthread_rwlock_wrlock(&moved_mu);
    moved_drop_overlaps_wr(now, now_size ? now_size : 1);
    size_t n = atomic_load(&moved_n);
    for (size_t i = 0; i < n; i++)
        if (moved_v[i].now == old) /* moved before: its first address follows it too */
            moved_v[i].now = now;
    if (n == moved_cap) {
        size_t cap = moved_cap ? 2 * moved_cap : 16;
        moved_range *v = realloc(moved_v, cap * sizeof *v);
        if (v) {
            moved_v = v;
            moved_cap = cap;
        }
    }
    if (n < moved_cap) {
        moved_v[n] = (moved_range){old, size ? size : 1, now};
        atomic_store_explicit(&moved_n, n + 1, memory_order_release);
    }
    pthread_rwlock_unlock(&moved_mu);
}

CUdeviceptr sv_moved_addr(CUdeviceptr p, size_t n) {
    if (!atomic_load_explicit(&moved_n, memory_order_acquire))
        return p;
    pthread_rwlock_rdlock(&moved_mu);
    size_t cnt = atomic_load(&moved_n);
    for (size_t i = 0; i < cnt; i++) {
        const moved_range *m = &moved_v[i];
        if (p >= m->old && p - m->old < m->size && n <= m->size - (p - m->old)) {
            p = m->now + (p - m->old);
            break;
        }
    }
    pthread_rwlock_unlock(&moved_mu);
    return p;
}

/* g's record at addr (size bytes) now, and the process's device ranges with it; under sv_func_mu. */
static void global_move_locked(sv_global *g, uint64_t addr, uint64_t size) {
    moved_add(g->addr, g->size, addr, size);
    sv_range_del(g->addr);
    g->addr = addr;
    g->size = size;
    sv_range_add(addr, size);
}

void sv_global_moved(sv_global *g, uint64_t addr, uint64_t size) {
    pthread_mutex_lock(&sv_func_mu);
    global_move_locked(g, addr, size);
    pthread_mutex_unlock(&sv_func_mu);
}

/* A module's or library's global: the worker's address, kept with its image (a replay checks it stays), and known
 * as device memory of the process (cuMemcpy, pointer attributes). */
static CUresult get_global(CUdeviceptr *dptr, size_t *bytes, unsigned kind, const void *h, const char *name) {
    if (!name || (!dptr && !bytes)) /* one output may be left out, not both (measured) */
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    struct sv_global_rec q = {sv_id(kind, h), kind == SV_K_LIBRARY};
    if (!q.owner)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t v[2] = {0, 0};
    CUresult r = sv_sync_named(SV_OP_GET_GLOBAL, &q, sizeof q, name, v, sizeof v, NULL);
    if (r != CUDA_SUCCESS)
        return r;
    sv_image *im = sv_id_data(kind, q.owner);
    pthread_mutex_lock(&sv_func_mu);
    /* By name: an image's globals have one name each, and a worker after a move may have one elsewhere. */
    sv_global *had = NULL;
    for (sv_global *g = im ? im->globals : NULL; g && !had; g = g->next)
        if (strcmp(g->name, name) == 0)
            had = g;
    if (had && (had->addr != v[0] || had->size != v[1]))
        global_move_locked(had, v[0], v[1]);
    bool known = had != NULL;
    sv_global *g = known || !im ? NULL : calloc(1, sizeof *g);
    if (g && (g->name = strdup(name))) {
        g->addr = v[0];
        g->size = v[1];
        g->next = im->globals;
        im->globals = g;
        sv_range_add(v[0], v[1]);
        moved_taken(v[0], v[1]);
    } else if (g) {
        free(g);
        g = NULL;
    }
    pthread_mutex_unlock(&sv_func_mu);
    if (!known && !g)
        sv_warn("served mode: out of memory keeping the global %s: cuMemcpy will not know it for device memory", name);
    if (dptr)
        *dptr = v[0];
    if (bytes)
        *bytes = (size_t)v[1];
    return CUDA_SUCCESS;
}

void sv_globals_save(void) {
    for (unsigned k = SV_K_MODULE; k <= SV_K_LIBRARY; k += SV_K_LIBRARY - SV_K_MODULE)
        for (uint32_t id = 1, end = sv_id_end(k); id < end; id++) {
            sv_image *im = sv_id_live(k, id) ? sv_id_data(k, id) : NULL;
            pthread_mutex_lock(&sv_func_mu);
            sv_global *first = im ? im->globals : NULL;
            pthread_mutex_unlock(&sv_func_mu);
            for (sv_global *g = first; g; g = g->next) {
                free(g->saved);
                g->saved = g->size ? malloc(g->size) : NULL;
                CUresult r = g->saved ? dtoh(g->saved, g->addr, g->size, SV_STREAM_NULL, false) : CUDA_SUCCESS;
                if (r != CUDA_SUCCESS || (g->size && !g->saved)) {
                    sv_warn(
                        "served mode: the global %s (%llu bytes) could not be read at the detach (CUresult %d): "
                        "the new worker's starts from its initial value",
                        g->name, (unsigned long long)g->size, g->saved ? (int)r : (int)CUDA_ERROR_OUT_OF_MEMORY);
                    free(g->saved);
                    g->saved = NULL;
                }
            }
        }
}

CUresult sv_global_restore(sv_global *g) {
    if (!g->saved)
        return CUDA_SUCCESS;
    CUresult r = htod(g->addr, g->saved, g->size, SV_STREAM_NULL, false);
    if (!sv_recording) {
        free(g->saved);
        g->saved = NULL;
    }
    return r;
}

void sv_globals_forget_saved(void) {
    for (unsigned k = SV_K_MODULE; k <= SV_K_LIBRARY; k += SV_K_LIBRARY - SV_K_MODULE)
        for (uint32_t id = 1, end = sv_id_end(k); id < end; id++) {
            sv_image *im = sv_id_live(k, id) ? sv_id_data(k, id) : NULL;
            pthread_mutex_lock(&sv_func_mu);
            for (sv_global *g = im ? im->globals : NULL; g; g = g->next) {
                free(g->saved);
                g->saved = NULL;
            }
            pthread_mutex_unlock(&sv_func_mu);
        }
}

SV_API CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name) {
    return get_global(dptr, bytes, SV_K_MODULE, hmod, name);
}

SV_API CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name) {
    return get_global(dptr, bytes, SV_K_LIBRARY, library, name);
}

/* ---- function attributes, occupancy ---- */

/* A function's attribute, cache preference or occupancy: functions only, as the driver takes no CUkernel for one
 * here (CUDA_ERROR_INVALID_HANDLE, measured). */
static CUresult func_attr(const void *h, unsigned what, int attr, int value, unsigned flags, uint64_t dyn,
                          int32_t *out) {
    uint32_t fid = sv_id(SV_K_FUNC, h);
    sv_func *f = fid ? sv_id_data(SV_K_FUNC, fid) : NULL;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sv_func_attr_rec q = {fid, 0, what, attr, value, flags, dyn};
    int32_t v = 0;
    CUresult r = sv_sync(SV_OP_FUNC_ATTR, &q, sizeof q, &v, sizeof v, NULL, false);
    if (r == CUDA_SUCCESS && out)
        *out = v;
    if (r == CUDA_SUCCESS && (what == SV_FA_SET || what == SV_FA_CACHE)) {
        /* kept for a new worker, whose function is a new one */
        pthread_mutex_lock(&sv_func_mu);
        if (what == SV_FA_CACHE) {
            f->cache = value;
        } else if (attr >= SV_FUNC_ATTR_FIRST && attr < SV_FUNC_ATTR_FIRST + SV_FUNC_ATTRS) {
            f->attr_set |= 1u << (attr - SV_FUNC_ATTR_FIRST);
            f->attr[attr - SV_FUNC_ATTR_FIRST] = value;
        }
        pthread_mutex_unlock(&sv_func_mu);
    }
    return r;
}

SV_API CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc) {
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    int32_t v = 0;
    CUresult r = func_attr(hfunc, SV_FA_GET, (int)attrib, 0, 0, 0, &v);
    if (r == CUDA_SUCCESS)
        *pi = v;
    return r;
}

SV_API CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
    NEED_CTX();
    return func_attr(hfunc, SV_FA_SET, (int)attrib, value, 0, 0, NULL);
}

SV_API CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
    NEED_CTX();
    return func_attr(hfunc, SV_FA_CACHE, 0, (int)config, 0, 0, NULL);
}

SV_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                                     size_t dynamicSMemSize, unsigned int flags) {
    if (!numBlocks)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    int32_t v = 0;
    CUresult r = func_attr(func, SV_FA_OCCUPANCY, blockSize, 0, flags, dynamicSMemSize, &v);
    if (r == CUDA_SUCCESS)
        *numBlocks = v;
    return r;
}

SV_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                            size_t dynamicSMemSize) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize, dynamicSMemSize,
                                                                CU_OCCUPANCY_DEFAULT);
}

/* ---- pointer attributes ---- */

/* The bytes of an attribute's value (the driver's types); 0: not one this library forwards. */
static size_t ptr_attr_size(unsigned a) {
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

/*
 * Forwarded for device memory of the process (its allocations, reservations, globals); anything else is memory
 * the worker's driver cannot know (the process's host memory: pinned host memory is not served), answered here
 * as the driver answers for memory it does not know: cuPointerGetAttribute fails, cuPointerGetAttributes gives
 * zeros (and device -2). A context comes back as the application's, never the worker's; a memory pool handle as NULL (the
 * worker's pools are not the process's objects).
 */
static CUresult pointer_attrs(unsigned n, const CUpointer_attribute *attrs, void **data, CUdeviceptr ptr, bool single) {
    if (n == 0 || !attrs || !data)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT();
    for (unsigned i = 0; i < n; i++) {
        if (!data[i])
            return CUDA_ERROR_INVALID_VALUE;
        if (attrs[i] == CU_POINTER_ATTRIBUTE_P2P_TOKENS)
            SV_REFUSE("P2P tokens (GPUDirect RDMA between peers) are not forwarded");
        if (!ptr_attr_size((unsigned)attrs[i]))
            return CUDA_ERROR_INVALID_VALUE;
    }
    ptr = sv_moved_addr(ptr, 1);
    if (!sv_range_has(ptr)) {
        if (single)
            return CUDA_ERROR_INVALID_VALUE;
        for (unsigned i = 0; i < n; i++) {
            memset(data[i], 0, ptr_attr_size((unsigned)attrs[i]));
            if (attrs[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
                *(int *)data[i] = -2; /* the driver's for memory it does not know (measured) */
        }
        return CUDA_SUCCESS;
    }
    for (unsigned at = 0; at < n;) {
        unsigned k = n - at < SV_MAX_PTR_ATTRS ? n - at : SV_MAX_PTR_ATTRS;
        struct sv_ptr_rec q;
        memset(&q, 0, sizeof q);
        q.ptr = ptr;
        q.n = k;
        q.single = single;
        for (unsigned i = 0; i < k; i++)
            q.attr[i] = (uint32_t)attrs[at + i];
        uint64_t v[SV_MAX_PTR_ATTRS];
        uint32_t len = 0;
        CUresult r = sv_sync(SV_OP_POINTER_ATTRS, &q, sizeof q, v, sizeof v, &len, false);
        if (r != CUDA_SUCCESS)
            return r;
        if (len < k * sizeof v[0])
            return CUDA_ERROR_UNKNOWN; /* the worker's answer is not one value per attribute */
        for (unsigned i = 0; i < k; i++) {
            unsigned a = (unsigned)attrs[at + i];
            if (a == CU_POINTER_ATTRIBUTE_CONTEXT) {
                CUcontext c = v[i] == SV_PTR_CTX_OURS ? SV_CTX : NULL;
                memcpy(data[at + i], &c, sizeof c);
            } else if (a == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE) {
                memset(data[at + i], 0, sizeof(CUmemoryPool));
            } else {
                memcpy(data[at + i], &v[i], ptr_attr_size(a)); /* little-endian: the low bytes */
            }
        }
        at += k;
    }
    return CUDA_SUCCESS;
}

SV_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    void *d[1] = {data};
    return pointer_attrs(1, &attribute, d, ptr, true);
}

SV_API CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                       CUdeviceptr ptr) {
    return pointer_attrs(numAttributes, attributes, data, ptr, false);
}

/* ---- launches: the hot path ---- */

static CUresult launch(const void *fh, const unsigned grid[3], const unsigned block[3], unsigned shmem, CUstream h,
                       void **kp, void **extra, bool coop) {
    NEED_CTX();
    uint32_t fid;
    bool isk;
    sv_func *f = func_of(fh, &fid, &isk);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    uint32_t st;
    CUresult r = sv_stream_arg(h, &st);
    if (r != CUDA_SUCCESS)
        return r;
    const void *buf = NULL;
    size_t nbytes = 0;
    if (kp) {
        nbytes = f->bytes;
    } else if (extra) {
        const size_t *psize = NULL;
        for (unsigned i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
                psize = extra[i + 1];
            else
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (!buf || !psize)
            return CUDA_ERROR_INVALID_VALUE;
        nbytes = *psize;
        if (nbytes > SV_MAX_PARAM_BYTES)
            return CUDA_ERROR_INVALID_VALUE;
    } else if (f->n) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sv_slot s;
    ENTER();
    r = sv_begin(&s, SV_OP_LAUNCH, (uint32_t)(sizeof(struct sv_rec) + sizeof(struct sv_launch_rec) + nbytes), 0, 0);
    if (r != CUDA_SUCCESS) {
        sv_leave();
        return r;
    }
    struct sv_launch_rec *L = (struct sv_launch_rec *)(void *)s.payload;
    L->func = fid;
    L->kernel = isk;
    L->grid[0] = grid[0];
    L->grid[1] = grid[1];
    L->grid[2] = grid[2];
    L->block[0] = block[0];
    L->block[1] = block[1];
    L->block[2] = block[2];
    L->shmem = shmem;
    L->stream = st;
    L->extra = !kp && extra;
    L->cooperative = coop;
    L->nbytes = (uint32_t)nbytes;
    L->pad = 0;
    uint8_t *args = s.payload + sizeof *L;
    if (kp) {
        for (uint32_t i = 0; i < f->n; i++)
            memcpy(args + f->off[i], kp[i], f->size[i]);
    } else if (buf) {
        memcpy(args, buf, nbytes);
    }
    sv_cap_note(st, SV_OP_LAUNCH, s.payload, (uint32_t)(sizeof *L + nbytes));
    sv_commit(&s);
    sv_leave();
    return CUDA_SUCCESS;
}

SV_API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                               unsigned int by, unsigned int bz, unsigned int shmem, CUstream h, void **kp,
                               void **extra) {
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    return launch(f, grid, block, shmem, h, kp, extra, false);
}

SV_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kp, void **extra) {
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    bool coop = false;
    for (unsigned i = 0; i < config->numAttrs; i++) {
        if (!config->attrs)
            return CUDA_ERROR_INVALID_VALUE;
        if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_IGNORE)
            continue;
        if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) {
            coop = config->attrs[i].value.cooperative != 0;
            continue;
        }
        static _Atomic int once;
        if (!atomic_exchange(&once, 1))
            sv_warn(
                "served mode: cuLaunchKernelEx: launch attribute %d is not forwarded (only cooperative is); "
                "such launches fail with CUDA_ERROR_NOT_SUPPORTED",
                (int)config->attrs[i].id);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    const unsigned grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
    const unsigned block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
    return launch(f, grid, block, config->sharedMemBytes, config->hStream, kp, extra, coop);
}

/* ---- virtual memory management: device memory of the one device ---- */

static CUresult prop_rec(const CUmemAllocationProp *prop, struct sv_vmm_rec *q) {
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
        static _Atomic int once;
        return sv_refuse(&once, "cuMemCreate",
                         "VMM memory on the host (pinned host memory) is not served; device memory is");
    }
    if (prop->location.id != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    q->loc_type = (uint32_t)prop->location.type;
    q->loc_id = prop->location.id;
    q->handle_types = (uint32_t)prop->requestedHandleTypes;
    return CUDA_SUCCESS;
}

/* The VMM calls need no current context, as with the driver: the interposer's control thread makes them. */
static CUresult vmm(unsigned op, struct sv_vmm_rec *q, uint64_t *out) {
    NEED_INIT();
    return sv_sync(op, q, sizeof *q, out, out ? sizeof *out : 0, NULL, false);
}

SV_API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option) {
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    struct sv_vmm_rec q;
    memset(&q, 0, sizeof q);
    CUresult r = prop_rec(prop, &q);
    if (r != CUDA_SUCCESS)
        return r;
    q.option = (uint32_t)option;
    uint64_t v = 0;
    if ((r = vmm(SV_OP_VMM_GRANULARITY, &q, &v)) == CUDA_SUCCESS)
        *g = (size_t)v;
    return r;
}

/* The address ranges the process reserved: a new worker reserves them again at the same addresses, before
 * anything else of its takes device addresses (replay.c). */
static struct {
    pthread_mutex_t mu;
    sv_reservation *v;
    size_t n, cap;
} RES = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void res_add(uint64_t base, uint64_t size, uint64_t align) {
    pthread_mutex_lock(&RES.mu);
    if (RES.n == RES.cap) {
        size_t cap = RES.cap ? RES.cap * 2 : 64;
        sv_reservation *v = realloc(RES.v, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&RES.mu);
            sv_warn("served mode: out of memory keeping the reservation at 0x%llx: a restore will not make it again",
                    (unsigned long long)base);
            return;
        }
        RES.v = v;
        RES.cap = cap;
    }
    RES.v[RES.n++] = (sv_reservation){base, size, align};
    pthread_mutex_unlock(&RES.mu);
}

static void res_del(uint64_t base) {
    pthread_mutex_lock(&RES.mu);
    for (size_t i = 0; i < RES.n; i++)
        if (RES.v[i].base == base) {
            RES.v[i] = RES.v[--RES.n];
            break;
        }
    pthread_mutex_unlock(&RES.mu);
}

size_t sv_reservations(sv_reservation *out, size_t max) {
    pthread_mutex_lock(&RES.mu);
    size_t n = RES.n;
    if (out)
        memcpy(out, RES.v, (n < max ? n : max) * sizeof *out);
    pthread_mutex_unlock(&RES.mu);
    return n;
}

SV_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags) {
    if (!ptr)
        return CUDA_ERROR_INVALID_VALUE;
    struct sv_vmm_rec q = {.a = size, .b = alignment, .c = addr, .d = flags};
    uint64_t v = 0;
    CUresult r = vmm(SV_OP_VMM_RESERVE, &q, &v);
    if (r == CUDA_SUCCESS) {
        *ptr = v;
        sv_range_add(v, size); /* device addresses, mapped or not: cuMemcpy asks */
        res_add(v, size, alignment);
    }
    return r;
}

SV_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    struct sv_vmm_rec q = {.a = ptr, .b = size};
    CUresult r = vmm(SV_OP_VMM_ADDR_FREE, &q, NULL);
    if (r == CUDA_SUCCESS) {
        sv_range_del(ptr);
        res_del(ptr);
    }
    return r;
}

SV_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    struct sv_vmm_rec q = {.a = size, .b = flags};
    CUresult r = prop_rec(prop, &q);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t v = 0;
    if ((r = vmm(SV_OP_VMM_CREATE, &q, &v)) == CUDA_SUCCESS)
        *handle = v; /* the driver's own: the worker keeps no table of them */
    return r;
}

SV_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    struct sv_vmm_rec q = {.a = handle};
    return vmm(SV_OP_VMM_RELEASE, &q, NULL);
}

SV_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) {
    struct sv_vmm_rec q = {.a = ptr, .b = size, .c = offset, .d = handle, .e = flags};
    return vmm(SV_OP_VMM_MAP, &q, NULL);
}

SV_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    struct sv_vmm_rec q = {.a = ptr, .b = size};
    return vmm(SV_OP_VMM_UNMAP, &q, NULL);
}

SV_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (count > SV_MAX_ACCESS)
        SV_REFUSE("more than 8 access descriptors");
    NEED_INIT();
    struct sv_access_rec q;
    memset(&q, 0, sizeof q);
    q.ptr = ptr;
    q.size = size;
    q.count = (uint32_t)count;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            SV_REFUSE("access from the host to VMM memory is not served");
        if (desc[i].location.id != 0)
            return CUDA_ERROR_INVALID_DEVICE;
        q.d[i].loc_type = (uint32_t)desc[i].location.type;
        q.d[i].loc_id = desc[i].location.id;
        q.d[i].flags = (uint32_t)desc[i].flags;
    }
    return sv_sync(SV_OP_VMM_SET_ACCESS, &q, sizeof q, NULL, 0, NULL, false);
}

/* VMM handles across processes: POSIX file descriptors, which travel over the worker's socket (served.h). */
#define VMM_TYPE_WHY "only POSIX file descriptors cross into and out of the worker"
SV_API CUresult cuMemExportToShareableHandle(void *sh, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t,
                                             unsigned long long flags) {
    if (!sh || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        SV_REFUSE(VMM_TYPE_WHY);
    NEED_INIT();
    struct sv_fd_rec q = {0, h, (uint32_t)t, 0};
    int fd = -1;
    CUresult r = sv_recv_fd_rec(SV_OP_VMM_EXPORT, &q, NULL, 0, &fd);
    if (r == CUDA_SUCCESS)
        *(int *)sh = fd;
    return r;
}

SV_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, CUmemAllocationHandleType t) {
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        SV_REFUSE(VMM_TYPE_WHY);
    NEED_INIT();
    int fd = (int)(intptr_t)os;
    if (fd < 0 || fcntl(fd, F_GETFD) < 0)
        return CUDA_ERROR_INVALID_VALUE; /* the caller keeps its descriptor, as with the driver */
    struct sv_fd_rec q = {0, 0, (uint32_t)t, 0};
    uint64_t v = 0;
    CUresult r = sv_send_fd_rec(SV_OP_VMM_IMPORT, fd, &q, &v, sizeof v);
    if (r == CUDA_SUCCESS)
        *h = v;
    return r;
}

SV_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT();
    struct sv_fd_rec q = {0, (uint64_t)(uintptr_t)addr, 0, 0};
    uint64_t v = 0;
    CUresult r = sv_sync(SV_OP_VMM_RETAIN, &q, sizeof q, &v, sizeof v, NULL, false);
    if (r == CUDA_SUCCESS)
        *h = v;
    return r;
}

SV_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT();
    struct sv_fd_rec q = {0, h, 0, 0};
    struct sv_props o;
    memset(&o, 0, sizeof o);
    CUresult r = sv_sync(SV_OP_VMM_PROPS, &q, sizeof q, &o, sizeof o, NULL, false);
    if (r == CUDA_SUCCESS) {
        memset(prop, 0, sizeof *prop);
        prop->type = (CUmemAllocationType)o.type;
        prop->requestedHandleTypes = (CUmemAllocationHandleType)o.handle_types;
        prop->location.type = (CUmemLocationType)o.loc_type;
        prop->location.id = o.loc_id;
        prop->allocFlags.compressionType = o.compression;
        prop->allocFlags.gpuDirectRDMACapable = o.rdma;
        prop->allocFlags.usage = o.usage;
    }
    return r;
}

/* ---- a forked child: no context current, none retained (ring.c drops the rest) ---- */

static void api_fork_child(void) {
    cur = false;
    atomic_store(&retained, 0);
    /* the parent's captures, limits and capture mode were its worker's: the child's worker starts without them */
    atomic_store(&capturing, 0);
    atomic_store(&worker_mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
    thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    LIM.set = 0;
    pthread_mutex_init(&LIM.mu, NULL);
}

__attribute__((constructor)) static void api_init(void) { pthread_atfork(NULL, NULL, api_fork_child); }

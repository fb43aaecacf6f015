/*
 * The interposer's side of docs/helper-protocol.md: the calls connection
 * (Hello, Alloc, Mapped, Free), allocations imported from the helper at
 * reserved addresses, slabs for small buffers, deferred stream-ordered frees,
 * and the control thread (Quiesce, Drain, Drop, Reimport, Resume, Snapshot,
 * GetStats, Detach and the reattach after it). All state lives in the one
 * struct G; a forked child resets it.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "gpucr_int.h"
#include "wire.h"

typedef Gpucr__Helper__V1__Request Req;
typedef Gpucr__Helper__V1__Response Resp;

#define MAX_DEV 64
#define MAX_CTX 64
#define DEFAULT_SLAB (2ULL << 20)
#define DEFAULT_THRESHOLD (1ULL << 20)

/* CONN_DETACHED: both connections closed on the helper's Detach, the control thread waits for the wake file. */
enum { CONN_NONE = 0, CONN_UP, CONN_OFF, CONN_DEAD, CONN_DETACHED };
enum { CLIENT_RUNNING = 1, CLIENT_QUIESCED = 2, CLIENT_DROPPED = 3 }; /* the protocol's ClientState */

typedef struct rec {
    uint64_t id, addr, size; /* size: what is reserved and mapped */
    int dev, kind;
    CUmemGenericAllocationHandle h;
    bool mapped;
    gc_slab *slab; /* kind SLAB */
    struct rec *next;
} rec;

typedef struct pend {
    gc_buf b;
    CUevent ev;
    struct pend *next;
} pend;

typedef struct modrec {
    uint64_t size, hash;
} modrec;

static struct {
    pthread_mutex_t init_mu;  /* connecting */
    pthread_mutex_t calls_mu; /* the calls connection, one request at a time */
    pthread_mutex_t mu;       /* everything below; table writers */
    _Atomic int conn;
    int calls_fd, ctl_fd;
    uint64_t token, next_id;
    struct {
        char uuid[48];
        uint64_t gran;
    } hdev[MAX_DEV];
    int nhdev;
    char uuid[MAX_DEV][48];
    bool have_uuid[MAX_DEV];
    rec *recs;
    gc_slab *slabs;
    pend *pending;
    CUcontext ctxs[MAX_CTX];
    int nctx;
    gc_table table;
    _Atomic int reasons;
    _Atomic int state;
    uint64_t live_buffers, live_bytes, helper_bytes;
    bool warned_dead, warned_fallback, warned_oom;
    modrec *mods;
    size_t nmods, capmods;
    uint64_t threshold;
    char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* the helper socket, for the reattach */
    char wake_path[4096];                                         /* Detach's wake file */
} G = {
    .init_mu = PTHREAD_MUTEX_INITIALIZER,
    .calls_mu = PTHREAD_MUTEX_INITIALIZER,
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .calls_fd = -1,
    .ctl_fd = -1,
    .state = CLIENT_RUNNING,
};


static void ensure_table(void) {
    if (!atomic_load(&G.table.cur) && gt_init(&G.table) != 0)
        gc_warn("out of memory for the buffer table");
}

const gc_btab *gc_buffers(void) {
    const gc_btab *s = gt_snap(&G.table);
    static const gc_btab empty = {.lo = UINT64_MAX};
    return s ? s : &empty;
}

bool gc_client_tracking(void) {
    int c = atomic_load_explicit(&G.conn, memory_order_relaxed);
    return c == CONN_UP || c == CONN_DEAD || c == CONN_DETACHED;
}

void gc_note_reason(int reason) { atomic_fetch_or(&G.reasons, reason); }

/* ---- the calls connection ---- */

static int unix_connect(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(a.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* One request, one response on fd. 0 (*out set), or -errno (transport). */
static int roundtrip(int fd, Req *req, Resp **out, int *fds, int maxfds, int *nfds) {
    return wire_roundtrip(fd, req, NULL, 0, out, fds, maxfds, nfds, true);
}

static void mark_dead(int err) {
    /* caller holds calls_mu */
    if (atomic_load(&G.conn) != CONN_UP)
        return;
    atomic_store(&G.conn, CONN_DEAD);
    if (G.calls_fd >= 0)
        close(G.calls_fd);
    G.calls_fd = -1;
    if (!G.warned_dead) {
        G.warned_dead = true;
        gc_warn("lost the helper connection (%s): existing buffers keep working, new allocations use the driver's "
                "allocator; this process is not checkpointable any more",
                strerror(err));
    }
}

/* A request on the calls connection. 0 (*out set) or -errno. */
static int call_helper(Req *req, Resp **out, int *fds, int maxfds, int *nfds) {
    pthread_mutex_lock(&G.calls_mu);
    if (atomic_load(&G.conn) != CONN_UP) {
        pthread_mutex_unlock(&G.calls_mu);
        return -ENOTCONN;
    }
    req->id = ++G.next_id;
    int rc = roundtrip(G.calls_fd, req, out, fds, maxfds, nfds);
    if (rc < 0)
        mark_dead(-rc);
    pthread_mutex_unlock(&G.calls_mu);
    return rc;
}

static void *control_main(void *arg);

static int hello(int fd, int role, uint64_t token, Resp **out) {
    Gpucr__Helper__V1__Hello h = GPUCR__HELPER__V1__HELLO__INIT;
    h.protocol_version = GPUCR__HELPER__V1__VERSION__PROTOCOL_VERSION;
    h.role = role;
    h.client_token = token;
    h.program = program_invocation_name ? program_invocation_name : (char *)"";
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.id = 1;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_HELLO;
    req.hello = &h;
    return roundtrip(fd, &req, out, NULL, 0, NULL);
}

static void set_devices(const Gpucr__Helper__V1__HelloReply *h) {
    G.nhdev = 0;
    for (size_t i = 0; i < h->n_devices && G.nhdev < MAX_DEV; i++) {
        Gpucr__Helper__V1__DeviceInfo *d = h->devices[i];
        snprintf(G.hdev[G.nhdev].uuid, sizeof G.hdev[0].uuid, "%s", d->uuid ? d->uuid : "");
        G.hdev[G.nhdev].gran = d->granularity;
        G.nhdev++;
    }
}

static void connect_helper(void) {
    const char *env = getenv("GPUCR_SOCKET");
    const char *path = env && *env ? env : "/run/gpucr/helper.sock";
    const char *t = getenv("GPUCR_SLAB_THRESHOLD");
    G.threshold = DEFAULT_THRESHOLD;
    if (t && *t) {
        char *end;
        unsigned long long v = strtoull(t, &end, 0);
        if (*end == 0)
            G.threshold = v;
        else
            gc_warn("GPUCR_SLAB_THRESHOLD=%s is not a number; using %llu", t, (unsigned long long)G.threshold);
    }
    int fd = unix_connect(path);
    if (fd < 0) {
        gc_warn("no helper at %s (%s): running without checkpoint support", path, strerror(errno));
        atomic_store(&G.conn, CONN_OFF);
        return;
    }
    Resp *resp = NULL;
    int rc = hello(fd, GPUCR__HELPER__V1__ROLE__ROLE_CLIENT_CALLS, 0, &resp);
    if (rc < 0 || resp->error || resp->body_case != GPUCR__HELPER__V1__RESPONSE__BODY_HELLO ||
        resp->hello->protocol_version != GPUCR__HELPER__V1__VERSION__PROTOCOL_VERSION) {
        if (rc < 0)
            gc_warn("helper at %s: hello failed (%s): running without checkpoint support", path, strerror(-rc));
        else if (resp->error)
            gc_warn("helper at %s refused us (%s): running without checkpoint support", path,
                    resp->error->message ? resp->error->message : "no message");
        else
            gc_warn("helper at %s speaks protocol version %u, we speak %d: running without checkpoint support", path,
                    resp->body_case == GPUCR__HELPER__V1__RESPONSE__BODY_HELLO ? resp->hello->protocol_version : 0,
                    GPUCR__HELPER__V1__VERSION__PROTOCOL_VERSION);
        if (resp)
            gpucr__helper__v1__response__free_unpacked(resp, NULL);
        close(fd);
        atomic_store(&G.conn, CONN_OFF);
        return;
    }
    G.calls_fd = fd;
    G.token = resp->hello->client_token;
    G.next_id = 1;
    snprintf(G.sock_path, sizeof G.sock_path, "%s", path); /* unix_connect took it: it fits */
    set_devices(resp->hello);
    gc_debug("registered with the helper at %s (token %llu, %d devices)", path, (unsigned long long)G.token,
             G.nhdev);
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    ensure_table();
    atomic_store(&G.conn, CONN_UP);

    /* the control connection */
    int cfd = unix_connect(path);
    resp = NULL;
    rc = cfd < 0 ? -errno : hello(cfd, GPUCR__HELPER__V1__ROLE__ROLE_CLIENT_CONTROL, G.token, &resp);
    if (rc < 0 || resp->error) {
        gc_warn("helper control connection failed (%s): this process is not checkpointable",
                rc < 0 ? strerror(-rc) : (resp->error->message ? resp->error->message : "refused"));
        if (resp)
            gpucr__helper__v1__response__free_unpacked(resp, NULL);
        if (cfd >= 0)
            close(cfd);
        gc_note_reason(GC_REASON_CONTROL);
        return;
    }
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    G.ctl_fd = cfd;
    pthread_t th;
    pthread_attr_t a;
    sigset_t all, old;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&th, &a, control_main, (void *)(intptr_t)cfd);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
    if (rc != 0) {
        gc_warn("cannot start the control thread (%s): this process is not checkpointable", strerror(rc));
        close(cfd);
        G.ctl_fd = -1;
        gc_note_reason(GC_REASON_CONTROL);
    }
}

void gc_client_ensure(void) {
    if (atomic_load_explicit(&G.conn, memory_order_acquire) != CONN_NONE || gc_in_control)
        return;
    pthread_mutex_lock(&G.init_mu);
    if (atomic_load(&G.conn) == CONN_NONE)
        connect_helper();
    pthread_mutex_unlock(&G.init_mu);
}

/* ---- devices ---- */

static const char *dev_uuid(int dev) {
    if (dev < 0 || dev >= MAX_DEV)
        return NULL;
    pthread_mutex_lock(&G.mu);
    bool have = G.have_uuid[dev];
    pthread_mutex_unlock(&G.mu);
    if (have)
        return G.uuid[dev];
    CUuuid u;
    __typeof__(&cuDeviceGetUuid_v2) fn = GC_REAL(cuDeviceGetUuid_v2);
    CUresult r = fn ? fn(&u, dev) : CUDA_ERROR_NOT_SUPPORTED;
    if (r != CUDA_SUCCESS) {
        gc_debug("cuDeviceGetUuid_v2(%d): %d", dev, (int)r);
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)u.bytes;
    char s[48];
    snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    pthread_mutex_lock(&G.mu);
    memcpy(G.uuid[dev], s, sizeof s);
    G.have_uuid[dev] = true;
    pthread_mutex_unlock(&G.mu);
    return G.uuid[dev];
}

static uint64_t granularity(int dev, const char *uuid) {
    for (int i = 0; i < G.nhdev; i++)
        if (strcmp(G.hdev[i].uuid, uuid) == 0 && G.hdev[i].gran)
            return G.hdev[i].gran;
    CUmemAllocationProp p = {0};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    size_t g = 0;
    __typeof__(&cuMemGetAllocationGranularity) fn = GC_REAL(cuMemGetAllocationGranularity);
    if (fn && fn(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && g)
        return g;
    return DEFAULT_SLAB;
}

/* Remembers the calling thread's context for Drain. */
static void note_context(void) {
    CUcontext c = NULL;
    __typeof__(&cuCtxGetCurrent) fn = GC_REAL(cuCtxGetCurrent);
    if (!fn || fn(&c) != CUDA_SUCCESS || !c)
        return;
    pthread_mutex_lock(&G.mu);
    bool found = false;
    for (int i = 0; i < G.nctx; i++)
        found |= G.ctxs[i] == c;
    if (!found && G.nctx < MAX_CTX)
        G.ctxs[G.nctx++] = c;
    pthread_mutex_unlock(&G.mu);
}

/* ---- helper allocations ---- */

static void send_free(uint64_t id) {
    Gpucr__Helper__V1__Free f = GPUCR__HELPER__V1__FREE__INIT;
    f.alloc_id = id;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_FREE;
    req.free = &f;
    Resp *resp = NULL;
    if (call_helper(&req, &resp, NULL, 0, NULL) == 0) {
        if (resp->error)
            gc_warn("helper: Free %llu: %s", (unsigned long long)id, resp->error->message);
        gpucr__helper__v1__response__free_unpacked(resp, NULL);
    }
}

static CUresult map_fd(int fd, uint64_t addr, uint64_t size, int dev, CUmemGenericAllocationHandle *h) {
    CUresult r = GC_REAL(cuMemImportFromShareableHandle)(h, (void *)(intptr_t)fd,
                                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
        gc_warn("cuMemImportFromShareableHandle: error %d", (int)r);
        return r;
    }
    r = GC_REAL(cuMemMap)(addr, size, 0, *h, 0);
    if (r != CUDA_SUCCESS) {
        gc_warn("cuMemMap(0x%llx, %llu): error %d", (unsigned long long)addr, (unsigned long long)size, (int)r);
        GC_REAL(cuMemRelease)(*h);
        return r;
    }
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    r = GC_REAL(cuMemSetAccess)(addr, size, &d, 1);
    if (r != CUDA_SUCCESS) {
        gc_warn("cuMemSetAccess(0x%llx): error %d", (unsigned long long)addr, (int)r);
        GC_REAL(cuMemUnmap)(addr, size);
        GC_REAL(cuMemRelease)(*h);
    }
    return r;
}

CUresult gc_helper_alloc(const char *uuid, uint64_t size, int kind, bool gpu_direct_rdma, uint64_t *id, uint64_t *rsize,
                         int *fd) {
    Gpucr__Helper__V1__Alloc al = GPUCR__HELPER__V1__ALLOC__INIT;
    al.device_uuid = (char *)uuid;
    al.size = size;
    al.kind = kind;
    al.gpu_direct_rdma = gpu_direct_rdma;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_ALLOC;
    req.alloc = &al;
    Resp *resp = NULL;
    int fds[4], nfds = 0;
    if (call_helper(&req, &resp, fds, 4, &nfds) < 0)
        return GC_FALLBACK;
    if (resp->error || resp->body_case != GPUCR__HELPER__V1__RESPONSE__BODY_ALLOC || nfds != 1) {
        CUresult err = GC_FALLBACK;
        if (resp->error && resp->error->code == GPUCR__HELPER__V1__ERROR_CODE__ERROR_OUT_OF_MEMORY) {
            /* Once: the reason (the device is full, or this uid's GPU
             * memory limit) is only in the helper's message. */
            err = CUDA_ERROR_OUT_OF_MEMORY;
            pthread_mutex_lock(&G.mu);
            bool w = !G.warned_oom;
            G.warned_oom = true;
            pthread_mutex_unlock(&G.mu);
            if (w)
                gc_warn("helper: out of memory for %llu bytes (%s); the application gets CUDA_ERROR_OUT_OF_MEMORY",
                        (unsigned long long)size, resp->error->message ? resp->error->message : "no message");
        } else {
            pthread_mutex_lock(&G.mu);
            bool w = !G.warned_fallback;
            G.warned_fallback = true;
            pthread_mutex_unlock(&G.mu);
            if (w)
                gc_warn("helper did not allocate (%s): using the driver's allocator; not checkpointable",
                        resp->error ? resp->error->message : "no fd or no reply body");
        }
        if (!resp->error && resp->body_case == GPUCR__HELPER__V1__RESPONSE__BODY_ALLOC)
            send_free(resp->alloc->alloc_id);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        gpucr__helper__v1__response__free_unpacked(resp, NULL);
        return err;
    }
    *id = resp->alloc->alloc_id;
    *rsize = resp->alloc->size;
    *fd = fds[0];
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    return CUDA_SUCCESS;
}

void gc_send_mapped(uint64_t id, uint64_t addr) {
    Gpucr__Helper__V1__Mapped m = GPUCR__HELPER__V1__MAPPED__INIT;
    m.alloc_id = id;
    m.address = addr;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_MAPPED;
    req.mapped = &m;
    Resp *resp = NULL;
    if (call_helper(&req, &resp, NULL, 0, NULL) == 0) {
        if (resp->error)
            gc_warn("helper: Mapped %llu: %s", (unsigned long long)id, resp->error->message);
        gpucr__helper__v1__response__free_unpacked(resp, NULL);
    }
}

void gc_send_free(uint64_t id) { send_free(id); }

static double mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static rec *helper_import(int dev, const char *uuid, uint64_t size, int kind, CUresult *err) {
    uint64_t id = 0, rsize = 0;
    int fds[1] = {-1};
    double t0 = mono_us();
    *err = gc_helper_alloc(uuid, size, kind, false, &id, &rsize, &fds[0]);
    double t1 = mono_us();
    if (*err != CUDA_SUCCESS)
        return NULL;
    uint64_t gran = granularity(dev, uuid);
    if (rsize < size)
        rsize = (size + gran - 1) / gran * gran;
    rec *a = calloc(1, sizeof *a);
    CUdeviceptr addr = 0;
    CUresult r = a ? GC_REAL(cuMemAddressReserve)(&addr, rsize, gran, 0, 0) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        r = map_fd(fds[0], addr, rsize, dev, &a->h);
        if (r != CUDA_SUCCESS)
            GC_REAL(cuMemAddressFree)(addr, rsize);
    } else {
        gc_warn("cuMemAddressReserve(%llu): error %d", (unsigned long long)rsize, (int)r);
    }
    close(fds[0]);
    double t2 = mono_us();
    if (r != CUDA_SUCCESS) {
        free(a);
        send_free(id);
        *err = r;
        return NULL;
    }
    a->id = id;
    a->addr = addr;
    a->size = rsize;
    a->dev = dev;
    a->kind = kind;
    a->mapped = true;

    gc_send_mapped(id, addr);
    double t3 = mono_us();
    gc_debug("alloc %llu: %llu bytes at 0x%llx (%s): helper %.0f us, reserve+import+map+access %.0f us, mapped %.0f us",
             (unsigned long long)id, (unsigned long long)rsize, (unsigned long long)addr, uuid, t1 - t0, t2 - t1,
             t3 - t2);
    *err = CUDA_SUCCESS;
    return a;
}

/* Unmaps, releases, frees the reservation, tells the helper. Not under G.mu. */
static void release_rec(rec *a) {
    if (a->mapped) {
        CUresult r = GC_REAL(cuMemUnmap)(a->addr, a->size);
        if (r != CUDA_SUCCESS)
            gc_warn("cuMemUnmap(0x%llx): error %d", (unsigned long long)a->addr, (int)r);
        r = GC_REAL(cuMemRelease)(a->h);
        if (r != CUDA_SUCCESS)
            gc_warn("cuMemRelease: error %d", (int)r);
    }
    CUresult r = GC_REAL(cuMemAddressFree)(a->addr, a->size);
    if (r != CUDA_SUCCESS)
        gc_warn("cuMemAddressFree(0x%llx): error %d", (unsigned long long)a->addr, (int)r);
    send_free(a->id);
    slab_free(a->slab);
    free(a);
}

static rec *find_rec(uint64_t id) {
    for (rec *a = G.recs; a; a = a->next)
        if (a->id == id)
            return a;
    return NULL;
}

static void unlink_rec(rec *a) {
    for (rec **pp = &G.recs; *pp; pp = &(*pp)->next)
        if (*pp == a) {
            *pp = a->next;
            return;
        }
}

static int insert_buf(const gc_buf *b) {
    int rc = gt_insert(&G.table, b);
    if (rc == 0) {
        G.live_buffers++;
        G.live_bytes += b->size;
    }
    return rc;
}

static void reap_pending(bool all);

/* ---- for vmm.c ---- */

void gc_lock(void) { pthread_mutex_lock(&G.mu); }
void gc_unlock(void) { pthread_mutex_unlock(&G.mu); }
bool gc_client_up(void) {
    gc_client_ensure();
    return atomic_load(&G.conn) == CONN_UP;
}
const char *gc_dev_uuid(int dev) { return dev_uuid(dev); }
void gc_note_context(void) { note_context(); }
int gc_buf_insert(const gc_buf *b) { return insert_buf(b); }
void gc_buf_remove(uint64_t addr) {
    gc_buf b;
    if (gt_remove(&G.table, addr, &b) == 0) {
        G.live_buffers--;
        G.live_bytes -= b.size;
    }
}
void gc_helper_bytes_add(int64_t d) { G.helper_bytes += (uint64_t)d; }

CUresult gc_alloc(CUdeviceptr *dptr, size_t size, int kind, bool *use_real) {
    *use_real = false;
    if (!dptr || size == 0) {
        *use_real = true;
        return CUDA_SUCCESS;
    }
    gc_client_ensure();
    if (atomic_load(&G.conn) != CONN_UP) {
        *use_real = true;
        return CUDA_SUCCESS;
    }
    reap_pending(false);
    CUdevice dev = 0;
    const char *uuid = NULL;
    if (GC_REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS || !(uuid = dev_uuid(dev))) {
        *use_real = true; /* the driver gives the application its own answer (no context, ...) */
        return CUDA_SUCCESS;
    }
    note_context();
    uint64_t slabsize = granularity(dev, uuid);
    if (slabsize < DEFAULT_SLAB)
        slabsize = (DEFAULT_SLAB + slabsize - 1) / slabsize * slabsize;
    CUresult err;
    gc_buf b = {.size = size, .kind = kind, .dev = dev};
    if (size < G.threshold && size <= slabsize / 2) {
        for (int attempt = 0; attempt < 2; attempt++) {
            pthread_mutex_lock(&G.mu);
            for (gc_slab *s = G.slabs; s; s = s->next) {
                rec *o = s->owner;
                if (o->dev != dev)
                    continue;
                int64_t off = slab_take(s, size);
                if (off < 0)
                    continue;
                b.addr = s->base + (uint64_t)off;
                b.alloc_id = o->id;
                if (insert_buf(&b) != 0) {
                    slab_give(s, (uint64_t)off, size);
                    pthread_mutex_unlock(&G.mu);
                    return CUDA_ERROR_OUT_OF_MEMORY;
                }
                pthread_mutex_unlock(&G.mu);
                gc_stat_add(STAT_ALLOCS, 1);
                *dptr = b.addr;
                return CUDA_SUCCESS;
            }
            pthread_mutex_unlock(&G.mu);
            if (attempt == 1)
                break;
            rec *a = helper_import(dev, uuid, slabsize, GC_KIND_SLAB, &err);
            if (!a) {
                if (err == GC_FALLBACK)
                    *use_real = true;
                return err == GC_FALLBACK ? CUDA_SUCCESS : err;
            }
            gc_slab *s = slab_new(a->addr, a->size);
            if (!s) {
                release_rec(a);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            s->owner = a;
            a->slab = s;
            pthread_mutex_lock(&G.mu);
            a->next = G.recs;
            G.recs = a;
            s->next = G.slabs;
            G.slabs = s;
            G.helper_bytes += a->size;
            pthread_mutex_unlock(&G.mu);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rec *a = helper_import(dev, uuid, size, kind, &err);
    if (!a) {
        if (err == GC_FALLBACK)
            *use_real = true;
        return err == GC_FALLBACK ? CUDA_SUCCESS : err;
    }
    b.addr = a->addr;
    b.alloc_id = a->id;
    pthread_mutex_lock(&G.mu);
    int rc = insert_buf(&b);
    if (rc == 0) {
        a->next = G.recs;
        G.recs = a;
        G.helper_bytes += a->size;
    }
    pthread_mutex_unlock(&G.mu);
    if (rc != 0) {
        release_rec(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    gc_stat_add(STAT_ALLOCS, 1);
    *dptr = a->addr;
    return CUDA_SUCCESS;
}

void gc_track_local(CUdeviceptr p, size_t size, int kind) {
    if (!gc_client_tracking())
        return;
    CUdevice dev = 0;
    if (GC_REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS)
        dev = -1;
    gc_buf b = {.addr = p, .size = size, .alloc_id = 0, .kind = kind, .dev = dev};
    pthread_mutex_lock(&G.mu);
    insert_buf(&b);
    pthread_mutex_unlock(&G.mu);
    gc_stat_add(STAT_ALLOCS, 1);
    gc_stat_add(STAT_LOCAL_ALLOCS, 1);
    gc_note_reason(GC_REASON_LOCAL);
}

/* Gives back a buffer that is out of the table already. */
static void release_buf(const gc_buf *b) {
    rec *drop = NULL;
    pthread_mutex_lock(&G.mu);
    G.live_buffers--;
    G.live_bytes -= b->size;
    rec *a = find_rec(b->alloc_id);
    if (a && a->slab) {
        slab_give(a->slab, b->addr - a->slab->base, b->size);
        /*
         * An empty slab goes back to the helper only if the device has
         * another empty one: a program that allocates and frees one small
         * buffer in a loop would otherwise pay a helper round trip (about
         * 1.5 ms on the GPU machine) for every allocation.
         */
        bool spare = false;
        if (a->slab->used == 0)
            for (gc_slab *o = G.slabs; o && !spare; o = o->next)
                spare = o != a->slab && o->used == 0 && ((rec *)o->owner)->dev == a->dev;
        if (a->slab->used == 0 && spare) {
            for (gc_slab **pp = &G.slabs; *pp; pp = &(*pp)->next)
                if (*pp == a->slab) {
                    *pp = a->slab->next;
                    break;
                }
            drop = a;
        }
    } else if (a) {
        drop = a;
    }
    if (drop) {
        unlink_rec(drop);
        G.helper_bytes -= drop->size;
    }
    pthread_mutex_unlock(&G.mu);
    if (drop)
        release_rec(drop);
}

static void reap_pending(bool all) {
    pthread_mutex_lock(&G.mu);
    pend *list = G.pending;
    G.pending = NULL;
    pthread_mutex_unlock(&G.mu);
    pend *keep = NULL;
    while (list) {
        pend *p = list;
        list = p->next;
        CUresult r = GC_REAL(cuEventQuery)(p->ev);
        if (r == CUDA_ERROR_NOT_READY && !all) {
            p->next = keep;
            keep = p;
            continue;
        }
        if (r == CUDA_ERROR_NOT_READY)
            r = GC_REAL(cuEventSynchronize)(p->ev);
        if (r != CUDA_SUCCESS)
            gc_debug("deferred free of 0x%llx: event error %d", (unsigned long long)p->b.addr, (int)r);
        GC_REAL(cuEventDestroy_v2)(p->ev);
        release_buf(&p->b);
        free(p);
    }
    if (keep) {
        pthread_mutex_lock(&G.mu);
        pend *t = keep;
        while (t->next)
            t = t->next;
        t->next = G.pending;
        G.pending = keep;
        pthread_mutex_unlock(&G.mu);
    }
}

int gc_free(CUdeviceptr p, bool async, CUstream stream, CUresult *res) {
    if (!gc_client_tracking() || p == 0)
        return 0;
    const gc_buf *f = gt_find(gc_buffers(), p);
    if (!f || f->addr != p || f->kind == GC_KIND_VMM) /* VMM mappings: cuMemFree is the driver's answer */
        return 0;
    reap_pending(false);
    gc_buf b;
    pthread_mutex_lock(&G.mu);
    int rc = gt_remove(&G.table, p, &b);
    pthread_mutex_unlock(&G.mu);
    if (rc != 0)
        return 0; /* freed meanwhile by another thread: the driver answers */
    gc_stat_add(STAT_FREES, 1);
    if (b.alloc_id == 0) {
        pthread_mutex_lock(&G.mu);
        G.live_buffers--;
        G.live_bytes -= b.size;
        pthread_mutex_unlock(&G.mu);
        return 0; /* local memory: the driver frees it */
    }
    *res = CUDA_SUCCESS;
    if (async) {
        CUevent ev = NULL;
        CUresult r = GC_REAL(cuEventCreate)(&ev, CU_EVENT_DISABLE_TIMING);
        if (r == CUDA_SUCCESS && (r = GC_REAL(cuEventRecord)(ev, stream)) != CUDA_SUCCESS)
            GC_REAL(cuEventDestroy_v2)(ev);
        pend *pd = r == CUDA_SUCCESS ? malloc(sizeof *pd) : NULL;
        if (pd) {
            pd->b = b;
            pd->ev = ev;
            pthread_mutex_lock(&G.mu);
            pd->next = G.pending;
            G.pending = pd;
            pthread_mutex_unlock(&G.mu);
            return 1;
        }
        if (r == CUDA_SUCCESS)
            GC_REAL(cuEventDestroy_v2)(ev);
        r = GC_REAL(cuStreamSynchronize)(stream);
        if (r != CUDA_SUCCESS)
            gc_debug("cuMemFreeAsync: stream sync: error %d", (int)r);
    } else {
        /* cuMemFree synchronizes: work still queued may use the memory */
        CUresult r = GC_REAL(cuCtxSynchronize)();
        if (r != CUDA_SUCCESS)
            gc_debug("cuMemFree: cuCtxSynchronize: error %d", (int)r);
    }
    release_buf(&b);
    return 1;
}

int gc_addr_range(CUdeviceptr p, CUdeviceptr *base, size_t *size) {
    if (!gc_client_tracking())
        return 0;
    const gc_buf *b = gt_find(gc_buffers(), p);
    if (!b || b->alloc_id == 0 || b->kind == GC_KIND_VMM) /* real mappings: the driver knows them */
        return 0;
    if (base)
        *base = b->addr;
    if (size)
        *size = b->size;
    return 1;
}

bool gc_is_helper_mem(CUdeviceptr p) {
    if (!gc_client_tracking())
        return false;
    const gc_buf *b = gt_find(gc_buffers(), p);
    return b && b->alloc_id != 0;
}

/* ---- modules ---- */

static size_t image_size(const void *image) {
    const unsigned char *p = image;
    if (!p)
        return 0;
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
        return (size_t)(a > b ? a : b);
    }
    uint32_t magic;
    memcpy(&magic, p, 4);
    if (magic == 0xBA55ED50u) { /* fatbin: magic, version(2), header size(2), fat size(8) */
        uint16_t hs;
        uint64_t fs;
        memcpy(&hs, p + 6, 2);
        memcpy(&fs, p + 8, 8);
        return (size_t)hs + (size_t)fs;
    }
    return strlen(image) + 1; /* PTX text */
}

static uint64_t fnv1a(const void *d, size_t n) {
    const unsigned char *p = d;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

void gc_note_module(const void *image, size_t len) {
    if (!image)
        return;
    if (len == 0)
        len = image_size(image);
    uint64_t h = fnv1a(image, len);
    pthread_mutex_lock(&G.mu);
    if (G.nmods == G.capmods) {
        size_t nc = G.capmods ? G.capmods * 2 : 16;
        modrec *m = realloc(G.mods, nc * sizeof *m);
        if (m) {
            G.mods = m;
            G.capmods = nc;
        }
    }
    if (G.nmods < G.capmods)
        G.mods[G.nmods++] = (modrec){len, h};
    pthread_mutex_unlock(&G.mu);
    gc_debug("module image: %zu bytes, hash %016llx", len, (unsigned long long)h);
    const char *dir = getenv("GPUCR_RECORD_MODULES");
    if (dir && *dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/module-%016llx.bin", dir, (unsigned long long)h);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            const unsigned char *p = image;
            size_t off = 0;
            while (off < len) {
                ssize_t n = write(fd, p + off, len - off);
                if (n <= 0 && errno != EINTR)
                    break;
                if (n > 0)
                    off += (size_t)n;
            }
            if (off < len)
                gc_warn("writing %s: %s", path, strerror(errno));
            close(fd);
        } else if (errno != EEXIST) {
            gc_warn("cannot record module image to %s: %s", path, strerror(errno));
        }
    }
}

void gc_note_module_file(const char *path) {
    if (!path)
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || st.st_size <= 0) {
        if (fd >= 0)
            close(fd);
        return;
    }
    size_t len = (size_t)st.st_size;
    unsigned char *buf = malloc(len);
    size_t got = 0;
    while (buf && got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (buf && got)
        gc_note_module(buf, got);
    free(buf);
}

/* ---- the control thread ---- */

static Gpucr__Helper__V1__Error resp_err;

static void set_error(Resp *resp, int code, const char *msg) {
    resp_err = (Gpucr__Helper__V1__Error)GPUCR__HELPER__V1__ERROR__INIT;
    resp_err.code = code;
    resp_err.message = (char *)msg;
    resp->error = &resp_err;
    resp->body_case = GPUCR__HELPER__V1__RESPONSE__BODY__NOT_SET;
}

static Gpucr__Helper__V1__Ok ok_msg = GPUCR__HELPER__V1__OK__INIT;

static void set_ok(Resp *resp) {
    resp->body_case = GPUCR__HELPER__V1__RESPONSE__BODY_OK;
    resp->ok = &ok_msg;
}

static char errbuf[512];

static void do_drain(Resp *resp) {
    pthread_mutex_lock(&G.mu);
    int n = G.nctx;
    CUcontext ctxs[MAX_CTX];
    memcpy(ctxs, G.ctxs, sizeof(CUcontext) * (size_t)n);
    pthread_mutex_unlock(&G.mu);
    for (int i = 0; i < n; i++) {
        CUresult r = GC_REAL(cuCtxSetCurrent)(ctxs[i]);
        if (r == CUDA_SUCCESS)
            r = GC_REAL(cuCtxSynchronize)();
        if (r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_INVALID_HANDLE)
            continue; /* destroyed since */
        if (r != CUDA_SUCCESS) {
            snprintf(errbuf, sizeof errbuf, "cuCtxSynchronize: CUresult %d", (int)r);
            set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_DRIVER, errbuf);
            return;
        }
    }
    reap_pending(true);
    set_ok(resp);
}

static bool set_wake_path(const char *w);

/* Drop: unmap and release every import. Its wake path (a checkpoint's) is
 * where to wait should the helper go away before the memory comes back. */
static void do_drop(Req *req, Resp *resp) {
    if (atomic_load(&G.state) != CLIENT_QUIESCED) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "Drop: not quiesced");
        return;
    }
    if (!set_wake_path(req->drop->wake_path) && req->drop->wake_path && *req->drop->wake_path) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST, "Drop: wake path too long");
        return;
    }
    reap_pending(true);
    pthread_mutex_lock(&G.mu);
    CUresult bad = CUDA_SUCCESS;
    for (rec *a = G.recs; a; a = a->next) {
        if (!a->mapped)
            continue;
        CUresult r = GC_REAL(cuMemUnmap)(a->addr, a->size);
        if (r == CUDA_SUCCESS)
            r = GC_REAL(cuMemRelease)(a->h);
        if (r != CUDA_SUCCESS && bad == CUDA_SUCCESS)
            bad = r;
        a->mapped = false;
    }
    gc_vmm_drop(&bad);
    pthread_mutex_unlock(&G.mu);
    atomic_store(&G.state, CLIENT_DROPPED);
    if (bad != CUDA_SUCCESS) {
        snprintf(errbuf, sizeof errbuf, "Drop: cuMemUnmap/cuMemRelease: CUresult %d", (int)bad);
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_DRIVER, errbuf);
        return;
    }
    set_ok(resp);
}

/* Helper allocations sorted by address, for relabel_fn. */
typedef struct {
    uint64_t addr, size, id;
} span;

static int span_cmp(const void *a, const void *b) {
    uint64_t x = ((const span *)a)->addr, y = ((const span *)b)->addr;
    return x < y ? -1 : x > y;
}

typedef struct {
    span *v;
    size_t n;
} spans;

/* The alloc_id the buffer b belongs to now, by its address (G.mu held). */
static uint64_t relabel_fn(const gc_buf *b, void *arg) {
    if (b->alloc_id == 0)
        return 0; /* local memory */
    if (b->kind == GC_KIND_VMM) {
        uint64_t id = gc_vmm_id_at(b->addr);
        return id ? id : b->alloc_id;
    }
    const spans *sp = arg;
    if (sp->v) {
        size_t lo = 0, hi = sp->n; /* last span with addr <= b->addr */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (sp->v[mid].addr <= b->addr)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo > 0 && b->addr - sp->v[lo - 1].addr < sp->v[lo - 1].size)
            return sp->v[lo - 1].id;
        return b->alloc_id;
    }
    for (rec *a = G.recs; a; a = a->next)
        if (b->addr >= a->addr && b->addr - a->addr < a->size)
            return a->id;
    return b->alloc_id;
}

/*
 * The buffers (table, deferred frees) take the alloc_ids their allocations adopted in a Reimport.
 * By address: ids of different allocations may have been swapped between frames. G.mu held.
 */
static void relabel_buffers(void) {
    spans sp = {NULL, 0};
    for (rec *a = G.recs; a; a = a->next)
        sp.n++;
    sp.v = sp.n ? malloc(sp.n * sizeof *sp.v) : NULL; /* NULL: relabel_fn searches the list */
    if (sp.v) {
        size_t i = 0;
        for (rec *a = G.recs; a; a = a->next)
            sp.v[i++] = (span){a->addr, a->size, a->id};
        qsort(sp.v, sp.n, sizeof *sp.v, span_cmp);
    }
    if (gt_relabel(&G.table, relabel_fn, &sp) != 0)
        gc_warn("out of memory relabelling the buffer table after a Reimport: frees may reach the wrong allocation");
    for (pend *p = G.pending; p; p = p->next)
        p->b.alloc_id = relabel_fn(&p->b, &sp);
    free(sp.v);
}

static rec *find_rec_at(uint64_t addr) {
    for (rec *a = G.recs; a; a = a->next)
        if (a->addr == addr)
            return a;
    return NULL;
}

/*
 * Entries are matched by address (helper allocations: where they are mapped; the application's VMM
 * allocations: their announced offset-0 mapping), and each record adopts the entry's alloc_id: after a
 * restore the helper is another process, or has given new ids.
 */
static void do_reimport(Req *req, Resp *resp, int *fds, int nfds) {
    Gpucr__Helper__V1__Reimport *ri = req->reimport;
    if (atomic_load(&G.state) != CLIENT_DROPPED) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "Reimport: nothing dropped");
        return;
    }
    if ((size_t)nfds != ri->n_entries) {
        snprintf(errbuf, sizeof errbuf, "Reimport: %zu entries, %d fds", ri->n_entries, nfds);
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST, errbuf);
        return;
    }
    pthread_mutex_lock(&G.mu);
    bool relabel = false;
    for (size_t i = 0; i < ri->n_entries; i++) {
        Gpucr__Helper__V1__ReimportEntry *e = ri->entries[i];
        rec *a = find_rec_at(e->address);
        if (!a) {
            int v = gc_vmm_reimport(e->alloc_id, e->address, e->size, fds[i], errbuf, sizeof errbuf);
            relabel |= v != 0;
            if (v == 1)
                continue;
            if (v == 0)
                snprintf(errbuf, sizeof errbuf, "Reimport: no allocation of ours at 0x%llx (entry %llu, %llu bytes)",
                         (unsigned long long)e->address, (unsigned long long)e->alloc_id,
                         (unsigned long long)e->size);
            set_error(resp,
                      v == -2 ? GPUCR__HELPER__V1__ERROR_CODE__ERROR_DRIVER
                              : GPUCR__HELPER__V1__ERROR_CODE__ERROR_NOT_FOUND,
                      errbuf);
            break;
        }
        if (a->size != e->size) {
            snprintf(errbuf, sizeof errbuf, "Reimport: the allocation at 0x%llx has %llu bytes here, the entry %llu",
                     (unsigned long long)e->address, (unsigned long long)a->size, (unsigned long long)e->size);
            set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_NOT_FOUND, errbuf);
            break;
        }
        if (a->id != e->alloc_id) {
            a->id = e->alloc_id;
            relabel = true;
        }
        if (a->mapped)
            continue;
        CUresult r = map_fd(fds[i], a->addr, a->size, a->dev, &a->h);
        if (r != CUDA_SUCCESS) {
            snprintf(errbuf, sizeof errbuf, "Reimport %llu at 0x%llx: CUresult %d", (unsigned long long)a->id,
                     (unsigned long long)a->addr, (int)r);
            set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_DRIVER, errbuf);
            break;
        }
        a->mapped = true;
    }
    if (relabel)
        relabel_buffers();
    pthread_mutex_unlock(&G.mu);
    if (!resp->error)
        set_ok(resp);
}

static void do_resume(Resp *resp) {
    int st = atomic_load(&G.state);
    if (st == CLIENT_DROPPED) {
        pthread_mutex_lock(&G.mu);
        bool all = true;
        for (rec *a = G.recs; a; a = a->next)
            all &= a->mapped;
        all &= gc_vmm_all_imported();
        pthread_mutex_unlock(&G.mu);
        if (!all) {
            set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "Resume: allocations not reimported");
            return;
        }
    }
    atomic_store(&G.state, CLIENT_RUNNING);
    G.wake_path[0] = 0; /* the memory is back: nothing to wait for */
    gc_gate_open();
    set_ok(resp);
}

static int n_reasons(const char **out) {
    int r = atomic_load(&G.reasons), n = 0;
    if (r & GC_REASON_CONTROL)
        out[n++] = "control connection down";
    if (r & GC_REASON_LOCAL)
        out[n++] = "allocations that fell back to local memory";
    if (r & GC_REASON_MANAGED)
        out[n++] = "managed memory";
    if (r & GC_REASON_APP_VMM)
        out[n++] = "application VMM allocations";
    if (r & GC_REASON_FOREIGN)
        out[n++] = "imported foreign memory";
    if (r & GC_REASON_EXPORT)
        out[n++] = "application VMM memory exported to a shareable handle";
    if (atomic_load(&G.conn) == CONN_DEAD)
        out[n++] = "helper connection lost";
    return n;
}

static const char *uuid_of(int dev) { return dev >= 0 && dev < MAX_DEV && G.have_uuid[dev] ? G.uuid[dev] : ""; }

/* Builds the table into resp; *cleanup frees it after packing. */
typedef struct {
    Gpucr__Helper__V1__BufferTable t;
    Gpucr__Helper__V1__Allocation *allocs, **pallocs;
    Gpucr__Helper__V1__Buffer *bufs, **pbufs;
    const char *reasons[8];
} snap_mem;

static void do_snapshot(Resp *resp, snap_mem *m) {
    memset(m, 0, sizeof *m);
    m->t = (Gpucr__Helper__V1__BufferTable)GPUCR__HELPER__V1__BUFFER_TABLE__INIT;
    pthread_mutex_lock(&G.mu);
    size_t na = 0;
    for (rec *a = G.recs; a; a = a->next)
        na++;
    size_t nv = gc_vmm_list(NULL, 0);
    gc_vmm_info *vi = calloc(nv + 1, sizeof *vi);
    if (vi)
        nv = gc_vmm_list(vi, nv);
    na += nv;
    const gc_btab *s = gc_buffers();
    m->allocs = calloc(na + 1, sizeof *m->allocs);
    m->pallocs = calloc(na + 1, sizeof *m->pallocs);
    m->bufs = calloc(s->n + 1, sizeof *m->bufs);
    m->pbufs = calloc(s->n + 1, sizeof *m->pbufs);
    if (!vi || !m->allocs || !m->pallocs || !m->bufs || !m->pbufs) {
        free(vi);
        pthread_mutex_unlock(&G.mu);
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "out of memory");
        return;
    }
    size_t i = 0;
    for (rec *a = G.recs; a; a = a->next, i++) {
        Gpucr__Helper__V1__Allocation *x = &m->allocs[i];
        *x = (Gpucr__Helper__V1__Allocation)GPUCR__HELPER__V1__ALLOCATION__INIT;
        x->alloc_id = a->id;
        x->address = a->addr;
        x->size = a->size;
        x->device_uuid = (char *)uuid_of(a->dev);
        x->kind = a->kind;
        m->pallocs[i] = x;
    }
    for (size_t k = 0; k < nv; k++, i++) {
        Gpucr__Helper__V1__Allocation *x = &m->allocs[i];
        *x = (Gpucr__Helper__V1__Allocation)GPUCR__HELPER__V1__ALLOCATION__INIT;
        x->alloc_id = vi[k].id;
        x->address = vi[k].addr;
        x->size = vi[k].size;
        x->device_uuid = (char *)uuid_of(vi[k].dev);
        x->kind = GPUCR__HELPER__V1__ALLOC_KIND__ALLOC_KIND_VMM;
        m->pallocs[i] = x;
    }
    free(vi);
    for (size_t j = 0; j < s->n; j++) {
        Gpucr__Helper__V1__Buffer *x = &m->bufs[j];
        *x = (Gpucr__Helper__V1__Buffer)GPUCR__HELPER__V1__BUFFER__INIT;
        x->address = s->v[j].addr;
        x->size = s->v[j].size;
        x->kind = s->v[j].kind;
        x->alloc_id = s->v[j].alloc_id;
        x->device_uuid = (char *)uuid_of(s->v[j].dev);
        m->pbufs[j] = x;
    }
    m->t.n_allocations = na;
    m->t.allocations = m->pallocs;
    m->t.n_buffers = s->n;
    m->t.buffers = m->pbufs;
    pthread_mutex_unlock(&G.mu);
    m->t.state = atomic_load(&G.state);
    m->t.n_not_checkpointable = (size_t)n_reasons(m->reasons);
    m->t.not_checkpointable = (char **)m->reasons;
    resp->body_case = GPUCR__HELPER__V1__RESPONSE__BODY_TABLE;
    resp->table = &m->t;
}

static void snap_free(snap_mem *m) {
    free(m->allocs);
    free(m->pallocs);
    free(m->bufs);
    free(m->pbufs);
}

static Gpucr__Helper__V1__ClientStats stats_msg;

static void do_stats(Resp *resp) {
    uint64_t c[STAT_N];
    gc_stats_sum(c);
    Gpucr__Helper__V1__ClientStats *s = &stats_msg;
    *s = (Gpucr__Helper__V1__ClientStats)GPUCR__HELPER__V1__CLIENT_STATS__INIT;
    s->allocs = c[STAT_ALLOCS];
    s->frees = c[STAT_FREES];
    pthread_mutex_lock(&G.mu);
    s->live_buffers = G.live_buffers;
    s->live_bytes = G.live_bytes;
    s->helper_bytes = G.helper_bytes;
    pthread_mutex_unlock(&G.mu);
    s->local_allocs = c[STAT_LOCAL_ALLOCS];
    s->launches = c[STAT_LAUNCHES];
    s->launches_with_hits = c[STAT_LAUNCH_HITS];
    s->pointer_words = c[STAT_PTR_WORDS];
    s->param_layouts = gc_layout_count();
    s->launches_no_layout = c[STAT_NO_LAYOUT];
    s->launches_scanned = c[STAT_SCANNED];
    s->copies = c[STAT_COPIES];
    s->memsets = c[STAT_MEMSETS];
    s->modules_loaded = c[STAT_MODULES];
    s->streams_created = c[STAT_STREAMS];
    s->events_created = c[STAT_EVENTS];
    s->gate_waits = c[STAT_GATE_WAITS];
    resp->body_case = GPUCR__HELPER__V1__RESPONSE__BODY_STATS;
    resp->stats = s;
}

/* <socket dir>/NAME into out, in this process's view of the socket directory
 * (a container may mount it elsewhere than the helper sees it); snprintf's
 * result. */
static int sock_dir_file(char *out, size_t n, const char *name) {
    const char *slash = strrchr(G.sock_path, '/');
    int dirlen = slash ? (int)(slash - G.sock_path) : 1;
    return snprintf(out, n, "%.*s/%s", dirlen, slash ? G.sock_path : ".", name);
}

/* G.wake_path = w, a relative w relative to our socket's directory; false
 * (and no wake path) if it is empty or too long. */
static bool set_wake_path(const char *w) {
    G.wake_path[0] = 0;
    if (!w || !*w)
        return false;
    int n = w[0] == '/' ? snprintf(G.wake_path, sizeof G.wake_path, "%s", w)
                        : sock_dir_file(G.wake_path, sizeof G.wake_path, w);
    if (n < 0 || (size_t)n >= sizeof G.wake_path) {
        G.wake_path[0] = 0;
        return false;
    }
    return true;
}

/* Detach: only dropped, with both connections up; *detach tells control_main to go on with detached(). */
static void do_detach(Req *req, Resp *resp, bool *detach) {
    if (atomic_load(&G.state) != CLIENT_DROPPED) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "Detach: not dropped");
    } else if (atomic_load(&G.conn) != CONN_UP) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "Detach: the calls connection is lost");
    } else if (!set_wake_path(req->detach->wake_path)) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST, "Detach: no wake path, or too long");
    } else {
        *detach = true;
        set_ok(resp);
    }
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR)
        ;
}

/* A HelloReply we can use? Else *why says what the helper answered. */
static bool hello_ok(const Resp *resp, char *why, size_t n) {
    if (resp->error) {
        snprintf(why, n, "error %d: %s", (int)resp->error->code,
                 resp->error->message ? resp->error->message : "no message");
        return false;
    }
    if (resp->body_case != GPUCR__HELPER__V1__RESPONSE__BODY_HELLO) {
        snprintf(why, n, "not a HelloReply");
        return false;
    }
    if (resp->hello->protocol_version != GPUCR__HELPER__V1__VERSION__PROTOCOL_VERSION) {
        snprintf(why, n, "protocol version %u, we speak %d", resp->hello->protocol_version,
                 GPUCR__HELPER__V1__VERSION__PROTOCOL_VERSION);
        return false;
    }
    return true;
}

/* Ends the process: its GPU memory is gone (held by a helper that died), and
 * running on would compute on nothing or hang at the gate forever. */
static void gpu_state_lost(const char *why) __attribute__((noreturn));
static void gpu_state_lost(const char *why) {
    fprintf(stderr, "gpucr: this process's GPU state is lost: %s; aborting\n", why);
    abort();
}

/* Watches the helper while detached: it touches helper.alive in the socket
 * directory every second (helper/daemon/orphan.go). Stale or missing for
 * GPUCR_ORPHAN_TIMEOUT_S (default 60) seconds of this process's running time:
 * no helper will bring the memory back. Time the process spent frozen by CRIU
 * (or between a dump and its restore) does not count. */
typedef struct {
    char path[4200];
    long timeout_s;
    struct timespec last;  /* monotonic time of the previous check */
    double stale_s;        /* running time with the file stale or missing */
} helper_watch;

static void watch_init(helper_watch *w) {
    sock_dir_file(w->path, sizeof w->path, "helper.alive");
    const char *e = getenv("GPUCR_ORPHAN_TIMEOUT_S");
    w->timeout_s = e && atol(e) > 0 ? atol(e) : 60;
    clock_gettime(CLOCK_MONOTONIC, &w->last);
    w->stale_s = 0;
}

static void watch_check(helper_watch *w) {
    struct timespec now, real;
    clock_gettime(CLOCK_MONOTONIC, &now);
    clock_gettime(CLOCK_REALTIME, &real);
    double step = (double)(now.tv_sec - w->last.tv_sec) + (double)(now.tv_nsec - w->last.tv_nsec) / 1e9;
    w->last = now;
    struct stat st;
    bool exists = stat(w->path, &st) == 0;
    long age = exists ? (long)(real.tv_sec - st.st_mtim.tv_sec) : -1;
    bool fresh = exists && age < 3; /* touched every second */
    if (fresh || step > 5) { /* alive, or we were frozen: start counting again */
        w->stale_s = 0;
        return;
    }
    w->stale_s += step;
    if (w->stale_s >= (double)w->timeout_s) {
        char why[4400];
        char seen[64] = "missing";
        if (exists)
            snprintf(seen, sizeof seen, "last updated %ld s ago", age);
        snprintf(why, sizeof why,
                 "the gpucr helper that holds its GPU memory has been gone for %ld s while it was detached for a dump "
                 "(%s: %s)",
                 w->timeout_s, w->path, seen);
        gpu_state_lost(why);
    }
}

/* The wake file exists: empty means come back; "lost: why" (from a helper
 * that adopted us after the one we detached from died) that there is nothing
 * to come back to. */
static void check_wake_file(void) {
    char buf[2048];
    int fd = open(G.wake_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return;
    buf[n] = 0;
    if (strncmp(buf, "lost:", 5) == 0) {
        char *nl = strchr(buf, '\n');
        if (nl)
            *nl = 0;
        gpu_state_lost(buf + 5 + (buf[5] == ' '));
    }
}

/*
 * After Detach's Ok: closes both connections, waits for the wake file (stat and sleep, nothing
 * else: CRIU freezes, dumps and maybe restores the process in this loop), then connects again with
 * the old token: calls first (its HelloReply's token names us from then on), then control. Connect
 * failures retry every 100 ms (one warning after 5 s), a helper's error every second (one warning
 * per distinct answer). The gate stays closed throughout. Returns the new control connection.
 */
static int detached(int ctl_fd) {
    gc_debug("detached: waiting for %s", G.wake_path);
    pthread_mutex_lock(&G.calls_mu);
    atomic_store(&G.conn, CONN_DETACHED);
    if (G.calls_fd >= 0)
        close(G.calls_fd);
    G.calls_fd = -1;
    pthread_mutex_unlock(&G.calls_mu);
    G.ctl_fd = -1;
    close(ctl_fd);

    static const struct timespec tick = {0, 2000000};
    struct stat st;
    helper_watch watch;
    watch_init(&watch);
    for (unsigned n = 1; stat(G.wake_path, &st) != 0; n++) {
        nanosleep(&tick, NULL);
        if (n % 250 == 0) /* every 0.5 s */
            watch_check(&watch);
    }
    check_wake_file();

    gc_debug("woken by %s: reattaching to the helper at %s (token %llu)", G.wake_path, G.sock_path,
             (unsigned long long)G.token);
    char why[512], last_why[512] = "";
    bool warned_connect = false;
    long failing_ms = 0;
    int calls = -1;
    uint64_t token = G.token;
    for (;;) {
        long delay = 100;
        Resp *resp = NULL;
        int rc;
        if (calls < 0) {
            calls = unix_connect(G.sock_path);
            rc = calls < 0 ? -errno : hello(calls, GPUCR__HELPER__V1__ROLE__ROLE_CLIENT_CALLS, G.token, &resp);
            if (rc < 0) {
                snprintf(why, sizeof why, "%s", strerror(-rc));
            } else if (!hello_ok(resp, why, sizeof why)) {
                rc = 1;
            } else {
                token = resp->hello->client_token;
                set_devices(resp->hello);
            }
            if (resp)
                gpucr__helper__v1__response__free_unpacked(resp, NULL);
            resp = NULL;
            if (rc != 0 && calls >= 0) {
                close(calls);
                calls = -1;
            }
        } else {
            rc = 0;
        }
        int cfd = -1;
        if (rc == 0) {
            cfd = unix_connect(G.sock_path);
            rc = cfd < 0 ? -errno : hello(cfd, GPUCR__HELPER__V1__ROLE__ROLE_CLIENT_CONTROL, token, &resp);
            if (rc < 0) {
                snprintf(why, sizeof why, "control connection: %s", strerror(-rc));
                close(calls); /* the helper is gone or broke the connection: from the start */
                calls = -1;
            } else if (!hello_ok(resp, why, sizeof why)) {
                rc = 1; /* keep the calls connection, ask again */
            }
            if (resp)
                gpucr__helper__v1__response__free_unpacked(resp, NULL);
            if (rc == 0) {
                pthread_mutex_lock(&G.calls_mu);
                G.calls_fd = calls;
                G.token = token;
                G.next_id = 1;
                atomic_store(&G.conn, CONN_UP);
                pthread_mutex_unlock(&G.calls_mu);
                G.ctl_fd = cfd;
                gc_debug("reattached to the helper (token %llu)", (unsigned long long)token);
                return cfd;
            }
            if (cfd >= 0)
                close(cfd);
        }
        if (rc > 0) { /* the helper answered with an error */
            if (strcmp(why, last_why) != 0) {
                gc_warn("reattach: the helper at %s refused us (%s): retrying every second", G.sock_path, why);
                snprintf(last_why, sizeof last_why, "%s", why);
            }
            delay = 1000;
            failing_ms = 0;
        } else {
            failing_ms += delay;
            if (failing_ms >= 5000 && !warned_connect) {
                warned_connect = true;
                gc_warn("reattach: cannot reach the helper at %s for 5 s (%s): still trying", G.sock_path, why);
            }
        }
        sleep_ms(delay);
    }
}

static void *control_main(void *arg) {
    int fd = (int)(intptr_t)arg;
    gc_in_control = 1;
    int fds[WIRE_MAX_FDS];
serve:
    for (;;) {
        uint8_t *buf;
        size_t len;
        int nfds = 0;
        int rc = wire_recv_frame(fd, &buf, &len, fds, WIRE_MAX_FDS, &nfds);
        if (rc < 0) {
            if (rc != -EPIPE)
                gc_warn("control connection: %s", strerror(-rc));
            break;
        }
        Req *req = gpucr__helper__v1__request__unpack(NULL, len, buf);
        free(buf);
        Resp resp = GPUCR__HELPER__V1__RESPONSE__INIT;
        snap_mem sm;
        bool snapped = false, detach = false;
        static char abort_why[1024];
        abort_why[0] = 0;
        if (!req) {
            set_error(&resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST, "undecodable request");
        } else {
            resp.id = req->id;
            gc_debug("control: request %d", (int)req->body_case);
            switch (req->body_case) {
            case GPUCR__HELPER__V1__REQUEST__BODY_QUIESCE: {
                unsigned t = req->quiesce->timeout_ms ? req->quiesce->timeout_ms : 10000;
                if (atomic_load(&G.state) != CLIENT_RUNNING) {
                    set_ok(&resp);
                } else if (gc_gate_close(t) != 0) {
                    set_error(&resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_TIMEOUT,
                              "Quiesce: calls still in progress at the timeout");
                } else {
                    atomic_store(&G.state, CLIENT_QUIESCED);
                    pthread_mutex_lock(&G.mu);
                    gt_reclaim(&G.table);
                    pthread_mutex_unlock(&G.mu);
                    gc_layout_reclaim();
                    set_ok(&resp);
                }
                break;
            }
            case GPUCR__HELPER__V1__REQUEST__BODY_DRAIN: do_drain(&resp); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_DROP: do_drop(req, &resp); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_REIMPORT: do_reimport(req, &resp, fds, nfds); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_RESUME: do_resume(&resp); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_SNAPSHOT:
                do_snapshot(&resp, &sm);
                snapped = true;
                break;
            case GPUCR__HELPER__V1__REQUEST__BODY_GET_STATS: do_stats(&resp); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_DETACH: do_detach(req, &resp, &detach); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_ABORT:
                /* answered first, so the helper knows it was heard; then this process ends */
                snprintf(abort_why, sizeof abort_why, "%s",
                         req->abort->reason && *req->abort->reason ? req->abort->reason : "the gpucr helper gave it up");
                set_ok(&resp);
                break;
            default:
                set_error(&resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST,
                          "not a request for an interposer's control connection");
            }
        }
        for (int i = 0; i < nfds; i++)
            close(fds[i]); /* Reimport's are imported (the driver keeps its own reference) */
        size_t olen = gpucr__helper__v1__response__get_packed_size(&resp);
        uint8_t *out = malloc(olen ? olen : 1);
        rc = 0;
        if (out && olen) { /* every reply sets a body or an error: never empty */
            gpucr__helper__v1__response__pack(&resp, out);
            rc = wire_send_frame(fd, out, olen, NULL, 0);
        }
        free(out);
        if (abort_why[0])
            gpu_state_lost(abort_why);
        if (snapped)
            snap_free(&sm);
        if (req)
            gpucr__helper__v1__request__free_unpacked(req, NULL);
        if (rc < 0) {
            gc_warn("control connection: send: %s", strerror(-rc));
            break;
        }
        if (detach)
            fd = detached(fd);
    }
    if (atomic_load(&G.state) == CLIENT_DROPPED && G.wake_path[0]) {
        /* A checkpoint recorded us for the next helper (helper/daemon/orphan.go). */
        gc_warn("the helper closed the control connection while this process's device memory was dropped for a "
                "checkpoint (did it die?): waiting for a helper to give it back (%s)",
                G.wake_path);
        fd = detached(fd);
        goto serve;
    }
    gc_note_reason(GC_REASON_CONTROL);
    if (atomic_load(&G.state) == CLIENT_QUIESCED) {
        atomic_store(&G.state, CLIENT_RUNNING);
        gc_gate_open();
        gc_warn("control connection closed while quiesced: resuming");
    } else if (atomic_load(&G.state) == CLIENT_DROPPED) {
        gpu_state_lost("the gpucr helper closed the control connection while this process's device memory was dropped "
                       "for a checkpoint (the helper died?)");
    }
    /* the fd is ours unless a fork happened meanwhile (the child never runs this thread) */
    close(fd);
    return NULL;
}

/* ---- fork ---- */

void gc_client_atfork_prepare(void) {
    pthread_mutex_lock(&G.init_mu);
    pthread_mutex_lock(&G.calls_mu);
    pthread_mutex_lock(&G.mu);
}

void gc_client_atfork_parent(void) {
    pthread_mutex_unlock(&G.mu);
    pthread_mutex_unlock(&G.calls_mu);
    pthread_mutex_unlock(&G.init_mu);
}

/* A forked child's copy of one of the parent's helper connections becomes
 * /dev/null under the same number: the child never uses it, and while it held
 * the socket the helper could not see the parent close it (a parent detached
 * for a dump never looked detached, and CRIU refuses to dump a child holding a
 * socket connected outside the tree). The parent's own fd is untouched. */
static void drop_inherited(int fd) {
    if (fd < 0)
        return;
    int dn = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (dn < 0) {
        close(fd);
        return;
    }
    if (dn != fd && dup3(dn, fd, O_CLOEXEC) < 0)
        close(fd);
    if (dn != fd)
        close(dn);
}

/* The child forgets the parent's connections (drops its copies of them) and its memory. */
void gc_client_atfork_child(void) {
    pthread_mutex_init(&G.init_mu, NULL);
    pthread_mutex_init(&G.calls_mu, NULL);
    pthread_mutex_init(&G.mu, NULL);
    atomic_store(&G.conn, CONN_NONE);
    drop_inherited(G.calls_fd);
    drop_inherited(G.ctl_fd);
    G.calls_fd = G.ctl_fd = -1;
    G.token = G.next_id = 0;
    G.nhdev = 0;
    memset(G.have_uuid, 0, sizeof G.have_uuid);
    G.recs = NULL;
    G.slabs = NULL;
    G.pending = NULL;
    G.nctx = 0;
    atomic_store(&G.table.cur, NULL);
    G.table.retired = NULL;
    G.table.nretired = 0;
    atomic_store(&G.reasons, 0);
    atomic_store(&G.state, CLIENT_RUNNING);
    G.live_buffers = G.live_bytes = G.helper_bytes = 0;
    G.warned_dead = G.warned_fallback = G.warned_oom = false;
    G.mods = NULL;
    G.nmods = G.capmods = 0;
    G.wake_path[0] = 0;
    gc_vmm_atfork_child();
    gc_stats_reset();
    gc_layout_reset();
}

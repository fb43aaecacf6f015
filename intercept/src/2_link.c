/*
 * The helper link (2_link.h): the calls connection (Hello, Alloc, Mapped,
 * Free, Export, ImportPeer, AnalyzeModule: one request at a time), the
 * control connection's Hello, what the helper said of its devices, detach and
 * reattach. docs/helper-protocol.md is the contract.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "1_base.h"
#include "2_link.h"
#include "wire.h"

typedef Gpucr__Helper__V1__Request Req;
typedef Gpucr__Helper__V1__Response Resp;

static struct {
    pthread_mutex_t init_mu;  /* connecting */
    pthread_mutex_t calls_mu; /* the calls connection, one request at a time */
    _Atomic int conn;
    int calls_fd, ctl_fd;
    uint64_t token, next_id;
    struct {
        char uuid[48];
        char bus[32]; /* its PCI bus id, "" if the helper did not say */
        uint64_t gran;
    } hdev[GC_MAX_DEV]; /* the helper's devices (HelloReply) */
    int nhdev;
    bool warned_dead;
    atomic_bool warned_fallback, warned_oom;
    char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* the helper socket, for the reattach */
} G = {
    .init_mu = PTHREAD_MUTEX_INITIALIZER,
    .calls_mu = PTHREAD_MUTEX_INITIALIZER,
    .calls_fd = -1,
    .ctl_fd = -1,
};

int gc_link_state(void) { return atomic_load(&G.conn); }

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
        gc_warn(
            "lost the helper connection (%s): existing buffers keep working, and the process rejoins the next helper "
            "that starts at the same socket, which takes them over; until then new allocations use the driver's "
            "allocator, and such memory keeps this process from being checkpointed",
            strerror(err));
    }
}

/* A request on the calls connection with sfd (-1: none) attached, counted in stat. 0 (*out set) or -errno. */
static int call_helper_fd(enum gc_stat stat, Req *req, int sfd, Resp **out, int *fds, int maxfds, int *nfds) {
    pthread_mutex_lock(&G.calls_mu);
    if (atomic_load(&G.conn) != CONN_UP) {
        pthread_mutex_unlock(&G.calls_mu);
        return -ENOTCONN;
    }
    req->id = ++G.next_id;
    gc_stat_add(stat, 1);
    int rc = wire_roundtrip(G.calls_fd, req, sfd >= 0 ? &sfd : NULL, sfd >= 0 ? 1 : 0, out, fds, maxfds, nfds, true);
    if (rc < 0)
        mark_dead(-rc);
    pthread_mutex_unlock(&G.calls_mu);
    return rc;
}

/* A request on the calls connection, counted in stat. 0 (*out set) or -errno. */
static int call_helper_as(enum gc_stat stat, Req *req, Resp **out, int *fds, int maxfds, int *nfds) {
    return call_helper_fd(stat, req, -1, out, fds, maxfds, nfds);
}

/* The requests of allocations and windows: STAT_HELPER_CALLS. */
static int call_helper(Req *req, Resp **out, int *fds, int maxfds, int *nfds) {
    return call_helper_as(STAT_HELPER_CALLS, req, out, fds, maxfds, nfds);
}

static int hello(int fd, int role, uint64_t token, Resp **out) {
    Gpucr__Helper__V1__Hello h = GPUCR__HELPER__V1__HELLO__INIT;
    h.protocol_version = GPUCR__HELPER__V1__VERSION__PROTOCOL_VERSION;
    h.role = role;
    h.client_token = token;
    h.program = program_invocation_name ? program_invocation_name : (char *)"";
    h.served = gc_driver_served();
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.id = 1;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_HELLO;
    req.hello = &h;
    return roundtrip(fd, &req, out, NULL, 0, NULL);
}

static void set_devices(const Gpucr__Helper__V1__HelloReply *h) {
    G.nhdev = 0;
    for (size_t i = 0; i < h->n_devices && G.nhdev < GC_MAX_DEV; i++) {
        Gpucr__Helper__V1__DeviceInfo *d = h->devices[i];
        snprintf(G.hdev[G.nhdev].uuid, sizeof G.hdev[0].uuid, "%s", d->uuid ? d->uuid : "");
        snprintf(G.hdev[G.nhdev].bus, sizeof G.hdev[0].bus, "%s", d->pci_bus_id ? d->pci_bus_id : "");
        G.hdev[G.nhdev].gran = d->granularity;
        G.nhdev++;
    }
}

bool gc_link_bus_id(const char *uuid, char *out, size_t n) {
    for (int i = 0; i < G.nhdev; i++)
        if (strcmp(G.hdev[i].uuid, uuid) == 0 && G.hdev[i].bus[0] && strlen(G.hdev[i].bus) < n) {
            memcpy(out, G.hdev[i].bus, strlen(G.hdev[i].bus) + 1);
            return true;
        }
    return false;
}

uint64_t gc_link_granularity(const char *uuid) {
    for (int i = 0; i < G.nhdev; i++)
        if (strcmp(G.hdev[i].uuid, uuid) == 0 && G.hdev[i].gran)
            return G.hdev[i].gran;
    return 0;
}

void gc_link_connect_lock(void) { pthread_mutex_lock(&G.init_mu); }
void gc_link_connect_unlock(void) { pthread_mutex_unlock(&G.init_mu); }

/* The calls connection, from GPUCR_SOCKET (registered, not up yet: gc_link_up). */
int gc_link_connect(void) {
    const char *env = getenv("GPUCR_SOCKET");
    const char *path = env && *env ? env : "/run/gpucr/helper.sock";
    int fd = unix_connect(path);
    if (fd < 0) {
        gc_warn("no helper at %s (%s): running without checkpoint support", path, strerror(errno));
        atomic_store(&G.conn, CONN_OFF);
        return -1;
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
        return -1;
    }
    G.calls_fd = fd;
    G.token = resp->hello->client_token;
    G.next_id = 1;
    snprintf(G.sock_path, sizeof G.sock_path, "%s", path); /* unix_connect took it: it fits */
    set_devices(resp->hello);
    gc_debug("registered with the helper at %s (token %llu, %d devices)", path, (unsigned long long)G.token, G.nhdev);
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    return 0;
}

void gc_link_up(void) { atomic_store(&G.conn, CONN_UP); }

/* The control connection: Hello with our token. */
int gc_link_connect_control(void) {
    const char *path = G.sock_path;
    int cfd = unix_connect(path);
    Resp *resp = NULL;
    int rc = cfd < 0 ? -errno : hello(cfd, GPUCR__HELPER__V1__ROLE__ROLE_CLIENT_CONTROL, G.token, &resp);
    if (rc < 0 || !resp || resp->error) {
        const char *why = rc < 0                                          ? strerror(-rc)
                          : !resp                                         ? "no response"
                          : resp->error->message && *resp->error->message ? resp->error->message
                                                                          : "refused";
        gc_warn("helper control connection failed (%s): this process is not checkpointable", why);
        if (resp)
            gpucr__helper__v1__response__free_unpacked(resp, NULL);
        if (cfd >= 0)
            close(cfd);
        return -1;
    }
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    G.ctl_fd = cfd;
    return cfd;
}

void gc_link_control_failed(int fd) {
    close(fd);
    G.ctl_fd = -1;
}

/* ---- requests of allocations ---- */

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

void gc_link_free(uint64_t id) {
    if (id != GC_ORPHAN_ID)
        send_free(id);
}

CUresult gc_link_alloc(const char *uuid, uint64_t size, int kind, unsigned flags, uint64_t addr, uint64_t *id,
                       uint64_t *rsize, int *fd) {
    Gpucr__Helper__V1__Alloc al = GPUCR__HELPER__V1__ALLOC__INIT;
    al.device_uuid = (char *)uuid;
    al.size = size;
    al.address = addr;
    al.kind = kind;
    al.gpu_direct_rdma = (flags & GC_ALLOC_GPU_DIRECT_RDMA) != 0;
    al.host_numa = (flags & GC_ALLOC_HOST_NUMA) != 0;
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
            if (!atomic_exchange(&G.warned_oom, true))
                gc_warn("helper: out of memory for %llu bytes (%s); the application gets CUDA_ERROR_OUT_OF_MEMORY",
                        (unsigned long long)size, resp->error->message ? resp->error->message : "no message");
        } else {
            if (!atomic_exchange(&G.warned_fallback, true))
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

/* A request's ranges (at most GC_SAVE_FIRST_MAX) in the caller's arrays; returns how many. */
typedef struct {
    Gpucr__Helper__V1__AddressRange r[GC_SAVE_FIRST_MAX];
    Gpucr__Helper__V1__AddressRange *p[GC_SAVE_FIRST_MAX];
} wire_ranges;

static size_t pack_ranges(wire_ranges *w, const gc_range *ranges, size_t n) {
    if (n > GC_SAVE_FIRST_MAX)
        n = GC_SAVE_FIRST_MAX;
    for (size_t i = 0; i < n; i++) {
        gpucr__helper__v1__address_range__init(&w->r[i]);
        w->r[i].address = ranges[i].addr;
        w->r[i].size = ranges[i].size;
        w->p[i] = &w->r[i];
    }
    return n;
}

int gc_link_save_first(const gc_range *ranges, size_t n) {
    wire_ranges w;
    Gpucr__Helper__V1__SaveFirst sf = GPUCR__HELPER__V1__SAVE_FIRST__INIT;
    sf.n_ranges = pack_ranges(&w, ranges, n);
    sf.ranges = w.p;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_SAVE_FIRST;
    req.save_first = &sf;
    Resp *resp = NULL;
    int nfds = 0;
    if (call_helper(&req, &resp, NULL, 0, &nfds) < 0)
        return -1;
    int rc = resp->error ? -1 : 0;
    if (resp->error)
        gc_warn("helper: SaveFirst: %s", resp->error->message ? resp->error->message : "refused");
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    return rc;
}

int gc_link_load_first(const gc_range *ranges, size_t n, bool all, char *why, size_t whylen) {
    wire_ranges w;
    Gpucr__Helper__V1__LoadFirst lf = GPUCR__HELPER__V1__LOAD_FIRST__INIT;
    lf.n_ranges = pack_ranges(&w, ranges, n);
    lf.ranges = w.p;
    lf.all = all;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_LOAD_FIRST;
    req.load_first = &lf;
    Resp *resp = NULL;
    int nfds = 0;
    if (call_helper(&req, &resp, NULL, 0, &nfds) < 0) {
        snprintf(why, whylen, "the gpucr helper did not answer while its GPU memory was still loading");
        return -1;
    }
    int rc = resp->error ? -1 : 0;
    if (resp->error)
        snprintf(why, whylen, "%s", resp->error->message ? resp->error->message : "its GPU memory did not load");
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    return rc;
}

/* The seals the helper requires of a module image's memfd: its bytes, size and seals can no longer change. */
#define IMAGE_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/*
 * A sealed memfd holding a copy of image (len bytes), for the helper to read: it reads no process's memory. -1 and
 * errno on failure (the memfd closed).
 */
static int sealed_copy(const void *image, size_t len) {
    int fd = memfd_create("gpucr-module", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    const char *p = image;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            break;
        }
        p += w;
        left -= (size_t)w;
    }
    if (left == 0 && fcntl(fd, F_ADD_SEALS, IMAGE_SEALS) == 0)
        return fd;
    int e = errno;
    if (close(fd) != 0)
        gc_debug("closing a module image's memfd: %s", strerror(errno));
    errno = e;
    return -1;
}

int gc_link_analyze(const void *image, size_t len, gc_kwrite **out, size_t *n) {
    int mfd = sealed_copy(image, len);
    if (mfd < 0) {
        gc_debug("module image not analysed: its copy for the helper: %s", strerror(errno));
        return -1;
    }
    Gpucr__Helper__V1__AnalyzeModule am = GPUCR__HELPER__V1__ANALYZE_MODULE__INIT;
    am.size = len;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_ANALYZE_MODULE;
    req.analyze_module = &am;
    Resp *resp = NULL;
    int nfds = 0;
    int rc = call_helper_fd(STAT_MODULES_ANALYSED, &req, mfd, &resp, NULL, 0, &nfds);
    /* The helper holds its own reference once the request is sent. */
    if (close(mfd) != 0)
        gc_debug("closing a module image's memfd: %s", strerror(errno));
    if (rc < 0)
        return -1;
    rc = -1;
    if (resp->error || resp->body_case != GPUCR__HELPER__V1__RESPONSE__BODY_MODULE_KERNELS) {
        gc_debug("helper: AnalyzeModule: %s", resp->error && resp->error->message ? resp->error->message : "no answer");
    } else {
        const Gpucr__Helper__V1__ModuleKernels *mk = resp->module_kernels;
        gc_kwrite *k = calloc(mk->n_kernels ? mk->n_kernels : 1, sizeof *k);
        size_t m = 0;
        for (size_t i = 0; k && i < mk->n_kernels; i++) {
            if (!mk->kernels[i]->name)
                continue;
            k[m].name = strdup(mk->kernels[i]->name);
            if (!k[m].name)
                break;
            k[m].decided = mk->kernels[i]->decided;
            k[m].reads_decided = mk->kernels[i]->reads_decided;
            k[m++].written = mk->kernels[i]->written;
        }
        if (k) {
            *out = k;
            *n = m;
            rc = 0;
        }
    }
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    return rc;
}

CUresult gc_link_export(uint64_t id, int *fd) {
    Gpucr__Helper__V1__Export e = GPUCR__HELPER__V1__EXPORT__INIT;
    e.alloc_id = id;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_EXPORT;
    req.export = &e;
    Resp *resp = NULL;
    int fds[4], nfds = 0;
    if (call_helper(&req, &resp, fds, 4, &nfds) < 0) {
        gc_warn("helper: Export %llu: no answer; the application's export fails", (unsigned long long)id);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    CUresult r = CUDA_SUCCESS;
    if (resp->error || resp->body_case != GPUCR__HELPER__V1__RESPONSE__BODY_OK || nfds != 1) {
        gc_warn("helper: Export %llu: %s; the application's export fails", (unsigned long long)id,
                resp->error && resp->error->message ? resp->error->message : "no fd in the answer");
        r = resp->error && resp->error->code == GPUCR__HELPER__V1__ERROR_CODE__ERROR_NOT_FOUND
                ? CUDA_ERROR_INVALID_VALUE
                : CUDA_ERROR_OPERATING_SYSTEM;
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
    } else {
        *fd = fds[0];
    }
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    return r;
}

int gc_link_import_peer(int fd, uint64_t *id, uint64_t *size) {
    Gpucr__Helper__V1__ImportPeer ip = GPUCR__HELPER__V1__IMPORT_PEER__INIT;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_IMPORT_PEER;
    req.import_peer = &ip;
    Resp *resp = NULL;
    if (call_helper_fd(STAT_HELPER_CALLS, &req, fd, &resp, NULL, 0, NULL) < 0)
        return -1;
    int ret = -1;
    if (!resp->error && resp->body_case == GPUCR__HELPER__V1__RESPONSE__BODY_ALLOC) {
        *id = resp->alloc->alloc_id;
        *size = resp->alloc->size;
        ret = 0;
    } else if (resp->error && resp->error->code != GPUCR__HELPER__V1__ERROR_CODE__ERROR_NOT_FOUND) {
        gc_warn("helper: ImportPeer: %s", resp->error->message ? resp->error->message : "no message");
    }
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    return ret;
}

void gc_link_mapped(uint64_t id, uint64_t addr) {
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

/* ---- the socket's directory ---- */

const char *gc_link_socket(void) { return G.sock_path; }

uint64_t gc_link_token(void) { return G.token; }

int gc_link_sock_dir_file(char *out, size_t n, const char *name) {
    const char *slash = strrchr(G.sock_path, '/');
    int dirlen = slash ? (int)(slash - G.sock_path) : 1;
    return snprintf(out, n, "%.*s/%s", dirlen, slash ? G.sock_path : ".", name);
}

/* ---- detach, reattach ---- */

void gc_link_detach(int ctl_fd) {
    pthread_mutex_lock(&G.calls_mu);
    atomic_store(&G.conn, CONN_DETACHED);
    if (G.calls_fd >= 0)
        close(G.calls_fd);
    G.calls_fd = -1;
    pthread_mutex_unlock(&G.calls_mu);
    G.ctl_fd = -1;
    close(ctl_fd);
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

/*
 * After Detach and the wake file: connects again with the old token, calls first (its HelloReply's
 * token names us from then on), then control. Connect failures retry every 100 ms (one warning after
 * 5 s), a helper's error every second (one warning per distinct answer). Returns the new control
 * connection.
 */
int gc_link_reattach(void) {
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

/* ---- rejoining a new helper ---- */

int gc_link_dial(void) { return G.sock_path[0] ? unix_connect(G.sock_path) : -1; }

bool gc_link_calls_lost(unsigned wait_ms) {
    pthread_mutex_lock(&G.calls_mu);
    bool lost = atomic_load(&G.conn) == CONN_DEAD;
    if (!lost && atomic_load(&G.conn) == CONN_UP && G.calls_fd >= 0) {
        /* Between requests nothing may come: anything readable is the end of the stream (or garbage). A helper that
         * ended closed its end of each connection in turn: this one may close a moment after the control one. */
        struct pollfd p = {.fd = G.calls_fd, .events = POLLIN | POLLRDHUP};
        int n;
        while ((n = poll(&p, 1, (int)wait_ms)) < 0 && errno == EINTR)
            ;
        if (n == 1 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) {
            mark_dead(EPIPE);
            lost = true;
        }
    }
    pthread_mutex_unlock(&G.calls_mu);
    return lost;
}

int gc_link_rejoin(int fd, char *why, size_t whylen) {
    Resp *resp = NULL;
    int rc = hello(fd, GPUCR__HELPER__V1__ROLE__ROLE_CLIENT_CALLS, 0, &resp);
    if (rc < 0) {
        snprintf(why, whylen, "%s", strerror(-rc));
    } else if (!hello_ok(resp, why, whylen)) {
        rc = -1;
    }
    if (rc < 0) {
        if (resp)
            gpucr__helper__v1__response__free_unpacked(resp, NULL);
        close(fd);
        return -1;
    }
    pthread_mutex_lock(&G.calls_mu);
    if (G.calls_fd >= 0)
        close(G.calls_fd);
    G.calls_fd = fd;
    G.token = resp->hello->client_token;
    G.next_id = 1;
    set_devices(resp->hello);
    G.warned_dead = false; /* a later loss is news again */
    atomic_store(&G.conn, CONN_UP);
    pthread_mutex_unlock(&G.calls_mu);
    gc_debug("rejoined the helper at %s (token %llu)", G.sock_path, (unsigned long long)G.token);
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    return 0;
}

/* ---- fork ---- */

void gc_link_atfork_prepare(void) {
    pthread_mutex_lock(&G.init_mu);
    pthread_mutex_lock(&G.calls_mu);
}

void gc_link_atfork_parent(void) {
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

/* The child forgets the parent's connections (drops its copies of them). */
void gc_link_atfork_child(void) {
    pthread_mutex_init(&G.init_mu, NULL);
    pthread_mutex_init(&G.calls_mu, NULL);
    atomic_store(&G.conn, CONN_NONE);
    drop_inherited(G.calls_fd);
    drop_inherited(G.ctl_fd);
    G.calls_fd = G.ctl_fd = -1;
    G.token = G.next_id = 0;
    G.nhdev = 0;
    G.warned_dead = false;
    atomic_store(&G.warned_fallback, false);
    atomic_store(&G.warned_oom, false);
}

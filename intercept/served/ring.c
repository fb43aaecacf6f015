/*
 * The transport (client.h, ring.c): the helper's Serve, the handshake with
 * the worker, and the shared ring's producer side.
 *
 * The helper connection lives only for Serve: the helper has nothing more to
 * say to a served process (helper/daemon/served.go), and the worker's socket
 * is what tells either side that the other is gone. The client looks at it
 * (poll, POLLRDHUP) whenever a bounded futex wait for the worker times out.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "wire.h"

_Atomic int sv_up; /* SV_S_*: before cuInit (or a forked child's), serving, the worker is gone, detached */
struct sv_shared *sv_sh;

/* Calls that use the shared memory (sv_enter .. sv_leave), nested ones counted once per thread; and the thread
 * that replays the process's objects into a new worker, which alone may enter while detached. */
static _Thread_local unsigned enter_depth;
static _Thread_local bool replaying;

static struct {
    pthread_mutex_t init_mu;
    bool init_done;
    CUresult init_r;
    int sock;
    int worker_pid;
    pthread_mutex_t prod_mu;  /* the producers' turn */
    uint64_t head, next_head; /* published; and once sv_begin reserved */
    uint64_t tail_seen;       /* the worker's tail when last read */
    _Atomic uint64_t reply_bits;
    _Atomic uint32_t stage_next;
    pthread_mutex_t image_mu; /* one image's chunks at a time: the worker assembles one */
    _Atomic int gone_said;
    _Atomic uint32_t inside; /* threads between sv_enter and sv_leave: a detach waits for none */
    pthread_mutex_t fd_mu;   /* descriptors on the socket in the ring's order; one export's answer at a time */
    uint64_t fd_seq;
    unsigned device;       /* what the first Serve asked for */
    char uuid[64];         /* the device served (ServeReply.uuid): what an attach asks for again */
    int32_t deferred_kept; /* an asynchronous failure not yet returned when the ring went away at a detach */
    /* The token of the script written at the last detach (gpucrServedScript): the attach asks for its template. */
    uint8_t token[SV_TOKEN_BYTES];
    bool have_token;
    bool attached_template; /* the last attach found its template: nothing was made again */
} R = {
    .init_mu = PTHREAD_MUTEX_INITIALIZER,
    .prod_mu = PTHREAD_MUTEX_INITIALIZER,
    .image_mu = PTHREAD_MUTEX_INITIALIZER,
    .fd_mu = PTHREAD_MUTEX_INITIALIZER,
    .sock = -1,
};

#define SPIN_NS 20000L    /* a wait polls this long before it parks */
#define PARK_NS 50000000L /* a parked wait looks at the worker's socket this often */
#define WELCOME_MS 60000  /* the worker's answer to the hello */

/* ---- a dead worker ---- */

static void futex_wake_int(_Atomic int *a) { syscall(SYS_futex, (int *)a, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

CUresult sv_gone(const char *why) {
    atomic_store(&sv_up, SV_S_GONE);
    futex_wake_int(&sv_up); /* calls that waited for an attach fail now */
    if (!atomic_exchange(&R.gone_said, 1))
        fprintf(stderr,
                "gpucr: served mode: the worker (pid %d) is gone: %s; every GPU call fails from now on "
                "(CUDA_ERROR_DEVICE_UNAVAILABLE)\n",
                R.worker_pid, why);
    return SV_GONE;
}

/* SV_GONE (and the line) when the worker's end of the socket closed, else CUDA_SUCCESS. */
static CUresult check_worker(void) {
    if (atomic_load(&sv_up) == SV_S_GONE)
        return SV_GONE;
    struct pollfd p = {.fd = R.sock, .events = POLLRDHUP};
    if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)))
        return sv_gone("its socket closed (the worker exited or was killed)");
    return CUDA_SUCCESS;
}

CUresult sv_ready(void) {
    switch (atomic_load_explicit(&sv_up, memory_order_acquire)) {
    case SV_S_UP:
    case SV_S_DETACHED: return CUDA_SUCCESS; /* initialized: a forwarded call waits in sv_enter */
    case SV_S_GONE: return SV_GONE;
    default: return CUDA_ERROR_NOT_INITIALIZED;
    }
}

/* Whether this thread may use the shared memory in state st. */
static inline bool may_enter(int st) { return st == SV_S_UP || (st == SV_S_DETACHED && replaying); }

CUresult sv_enter(void) {
    if (enter_depth) {
        enter_depth++;
        return CUDA_SUCCESS;
    }
    for (;;) {
        int st = atomic_load(&sv_up);
        if (may_enter(st)) {
            /* Dekker with sv_detach: count in, then look at the state again (both seq_cst). */
            atomic_fetch_add(&R.inside, 1);
            if (may_enter(atomic_load(&sv_up))) {
                enter_depth = 1;
                return CUDA_SUCCESS;
            }
            if (atomic_fetch_sub(&R.inside, 1) == 1)
                sv_futex_wake(&R.inside);
            continue;
        }
        if (st != SV_S_DETACHED)
            return st == SV_S_GONE ? SV_GONE : CUDA_ERROR_NOT_INITIALIZED;
        /* Detached (a checkpoint): wait for the attach, which wakes sv_up. Bounded, to look again. */
        struct timespec ts = {0, PARK_NS};
        syscall(SYS_futex, (int *)&sv_up, FUTEX_WAIT, SV_S_DETACHED, &ts, NULL, 0);
    }
}

void sv_leave(void) {
    if (--enter_depth)
        return;
    if (atomic_fetch_sub(&R.inside, 1) == 1 && atomic_load(&sv_up) == SV_S_DETACHED)
        sv_futex_wake(&R.inside);
}

/* Waits until *state is no longer pending (the worker's store), parking on it after a spin. */
static CUresult wait_word(_Atomic uint32_t *state, _Atomic uint32_t *waiting, uint32_t pending) {
    long long t0 = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(state, memory_order_acquire) != pending)
            return CUDA_SUCCESS;
        sv_cpu_relax();
        if ((i & 63) == 0) {
            long long t = sv_now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                break;
        }
    }
    for (;;) {
        atomic_store_explicit(waiting, 1, memory_order_seq_cst);
        if (atomic_load_explicit(state, memory_order_seq_cst) != pending)
            break;
        sv_futex_wait(state, pending, PARK_NS);
        if (atomic_load_explicit(state, memory_order_acquire) != pending)
            break;
        CUresult r = check_worker();
        if (r != CUDA_SUCCESS)
            return r;
    }
    atomic_store_explicit(waiting, 0, memory_order_relaxed);
    return CUDA_SUCCESS;
}

/* ---- the helper's Serve ---- */

static int unix_connect(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
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

typedef Gpucr__Helper__V1__Request Req;
typedef Gpucr__Helper__V1__Response Resp;

/* The worker's socket from the helper at path (-1: the line said why). */
/* The helper's worker for this process: its socket, or -1 after a line that says why. token (may be NULL): the
 * template asked for; *templ says whether the worker is it. */
static int serve_from_helper(const char *path, unsigned device, const char *uuid, const uint8_t *token, bool *templ) {
    *templ = false;
    int fd = unix_connect(path);
    if (fd < 0) {
        fprintf(stderr, "gpucr: served mode: no helper at %s (%s): no GPU for this process\n", path, strerror(errno));
        return -1;
    }
    Gpucr__Helper__V1__Hello h = GPUCR__HELPER__V1__HELLO__INIT;
    h.protocol_version = GPUCR__HELPER__V1__VERSION__PROTOCOL_VERSION;
    h.role = GPUCR__HELPER__V1__ROLE__ROLE_SERVED;
    h.program = program_invocation_short_name ? program_invocation_short_name : (char *)"";
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.id = 1;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_HELLO;
    req.hello = &h;
    Resp *resp = NULL;
    int rc = wire_roundtrip(fd, &req, NULL, 0, &resp, NULL, 0, NULL, true);
    if (rc < 0 || resp->error || resp->body_case != GPUCR__HELPER__V1__RESPONSE__BODY_HELLO) {
        if (rc < 0)
            fprintf(stderr, "gpucr: served mode: the helper at %s: hello failed (%s)\n", path, strerror(-rc));
        else
            fprintf(stderr, "gpucr: served mode: the helper at %s refused this process: %s\n", path,
                    resp->error && resp->error->message ? resp->error->message : "it answered no HelloReply");
        if (resp)
            gpucr__helper__v1__response__free_unpacked(resp, NULL);
        close(fd);
        return -1;
    }
    gpucr__helper__v1__response__free_unpacked(resp, NULL);

    Gpucr__Helper__V1__Serve sv = GPUCR__HELPER__V1__SERVE__INIT;
    sv.device = device;
    sv.uuid = (char *)(uuid ? uuid : "");
    if (token) {
        sv.template_token.data = (uint8_t *)token;
        sv.template_token.len = SV_TOKEN_BYTES;
    }
    req = (Req)GPUCR__HELPER__V1__REQUEST__INIT;
    req.id = 2;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_SERVE;
    req.serve = &sv;
    int fds[1], nfds = 0;
    resp = NULL;
    rc = wire_roundtrip(fd, &req, NULL, 0, &resp, fds, 1, &nfds, true);
    close(fd); /* the helper has nothing more to say to a served process */
    if (rc < 0) {
        fprintf(stderr, "gpucr: served mode: the helper at %s: Serve failed (%s)\n", path, strerror(-rc));
        return -1;
    }
    if (resp->error || resp->body_case != GPUCR__HELPER__V1__RESPONSE__BODY_SERVE || nfds != 1) {
        fprintf(stderr, "gpucr: served mode: the helper at %s gives this process no worker: %s\n", path,
                resp->error && resp->error->message ? resp->error->message
                                                    : "its answer came without the worker's socket");
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        gpucr__helper__v1__response__free_unpacked(resp, NULL);
        return -1;
    }
    R.worker_pid = (int)resp->serve->worker_pid;
    *templ = token && resp->serve->template_;
    snprintf(R.uuid, sizeof R.uuid, "%s", resp->serve->uuid ? resp->serve->uuid : "");
    gpucr__helper__v1__response__free_unpacked(resp, NULL);
    return fds[0];
}

/* ---- the handshake with the worker ---- */

static CUresult handshake(int sock) {
    int mfd = memfd_create("gpucr-served", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (mfd < 0) {
        fprintf(stderr, "gpucr: served mode: memfd_create: %s\n", strerror(errno));
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    /* Sealed against shrinking: the worker maps it and must never meet a SIGBUS for a truncation. */
    if (ftruncate(mfd, sizeof(struct sv_shared)) != 0 || fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
        fprintf(stderr, "gpucr: served mode: the ring's memfd: %s\n", strerror(errno));
        close(mfd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    struct sv_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (sh == MAP_FAILED) {
        fprintf(stderr, "gpucr: served mode: mapping the ring: %s\n", strerror(errno));
        close(mfd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    sh->h.magic = SV_MAGIC;
    sh->h.version = SV_VERSION;
    sh->h.total = sizeof *sh;
    sh->h.client_pid = (int32_t)getpid();

    struct sv_hello hello = {SV_MAGIC, SV_VERSION, sizeof *sh, (int32_t)getpid(), 0};
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {&hello, sizeof hello};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &mfd, sizeof mfd);
    ssize_t n;
    do
        n = sendmsg(sock, &m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    close(mfd);
    if (n != (ssize_t)sizeof hello) {
        munmap(sh, sizeof *sh);
        char why[160];
        snprintf(why, sizeof why, "sending it the ring: %s", n < 0 ? strerror(errno) : "short write");
        return sv_gone(why);
    }

    struct sv_welcome w;
    memset(&w, 0, sizeof w);
    size_t got = 0;
    while (got < sizeof w) {
        struct pollfd p = {.fd = sock, .events = POLLIN};
        int pr = poll(&p, 1, WELCOME_MS);
        if (pr < 0 && errno == EINTR)
            continue;
        n = pr > 0 ? recv(sock, (char *)&w + got, sizeof w - got, 0) : -1;
        if (n < 0 && pr > 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            munmap(sh, sizeof *sh);
            return sv_gone(pr == 0 ? "it did not answer the ring's hello within 60 s"
                                   : "it closed its socket before answering the ring's hello");
        }
        got += (size_t)n;
    }
    if (w.magic != SV_MAGIC || w.version != SV_VERSION || w.result != CUDA_SUCCESS) {
        w.err[sizeof w.err - 1] = 0;
        fprintf(stderr, "gpucr: served mode: the worker (pid %d) refuses this process's ring: %s\n", R.worker_pid,
                w.magic == SV_MAGIC ? w.err : "it speaks another served-mode protocol");
        munmap(sh, sizeof *sh);
        return CUDA_ERROR_NO_DEVICE;
    }
    sv_sh = sh;
    return CUDA_SUCCESS;
}

static void at_fork_child(void);

static void register_fork(void) { pthread_atfork(NULL, NULL, at_fork_child); }

CUresult sv_connect(void) {
    static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
    pthread_mutex_lock(&R.init_mu);
    if (R.init_done) {
        CUresult r = R.init_r;
        pthread_mutex_unlock(&R.init_mu);
        return r;
    }
    pthread_once(&fork_once, register_fork);
    const char *env = getenv("GPUCR_SOCKET");
    const char *path = env && *env ? env : "/run/gpucr/helper.sock";
    const char *dev = getenv("GPUCR_SERVED_DEVICE");
    unsigned device = 0;
    CUresult r = CUDA_SUCCESS;
    if (dev && *dev) {
        char *end = NULL;
        unsigned long v = strtoul(dev, &end, 10);
        if (!end || *end || v > 1024) {
            fprintf(stderr, "gpucr: served mode: GPUCR_SERVED_DEVICE=%s is no device ordinal\n", dev);
            r = CUDA_ERROR_INVALID_DEVICE;
        }
        device = (unsigned)v;
    }
    R.device = device;
    bool templ;
    int sock = r == CUDA_SUCCESS ? serve_from_helper(path, device, NULL, NULL, &templ) : -1;
    if (r == CUDA_SUCCESS && sock < 0)
        r = CUDA_ERROR_NO_DEVICE;
    if (r == CUDA_SUCCESS) {
        R.sock = sock;
        r = handshake(sock);
        if (r == CUDA_SUCCESS) {
            R.head = R.next_head = R.tail_seen = 0;
            atomic_store_explicit(&sv_up, SV_S_UP, memory_order_release);
        }
    }
    R.init_done = true;
    R.init_r = r;
    pthread_mutex_unlock(&R.init_mu);
    return r;
}

/* A forked child holds none of its parent's driver state, as with CUDA: its next cuInit gets its own worker. */
static void at_fork_child(void) {
    if (sv_sh)
        munmap(sv_sh, sizeof *sv_sh);
    sv_sh = NULL;
    if (R.sock >= 0)
        close(R.sock);
    R.sock = -1;
    R.worker_pid = 0;
    atomic_store(&sv_up, SV_S_NONE);
    atomic_store(&R.gone_said, 0);
    atomic_store(&R.reply_bits, 0);
    atomic_store(&R.inside, 0);
    enter_depth = 0;
    R.init_done = false;
    R.head = R.next_head = R.tail_seen = 0;
    R.deferred_kept = 0;
    pthread_mutex_init(&R.init_mu, NULL);
    pthread_mutex_init(&R.prod_mu, NULL);
    pthread_mutex_init(&R.image_mu, NULL);
    pthread_mutex_init(&R.fd_mu, NULL);
    sv_handles_reset();
}

/* ---- producing ---- */

/* Room up to need bytes past the worker's tail (producers' lock held). */
static CUresult wait_room(uint64_t end) {
    struct sv_header *h = &sv_sh->h;
    long long t0 = 0;
    for (unsigned i = 1;; i++) {
        R.tail_seen = atomic_load_explicit(&h->tail, memory_order_acquire);
        if (end - R.tail_seen <= SV_RING_BYTES)
            return CUDA_SUCCESS;
        sv_cpu_relax();
        if ((i & 63) == 0) {
            long long t = sv_now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                break;
        }
    }
    for (;;) {
        uint32_t seq = atomic_load(&h->room_seq);
        atomic_store_explicit(&h->room_wait, 1, memory_order_seq_cst);
        R.tail_seen = atomic_load_explicit(&h->tail, memory_order_seq_cst);
        if (end - R.tail_seen <= SV_RING_BYTES)
            return CUDA_SUCCESS;
        sv_futex_wait(&h->room_seq, seq, PARK_NS);
        R.tail_seen = atomic_load_explicit(&h->tail, memory_order_acquire);
        if (end - R.tail_seen <= SV_RING_BYTES)
            return CUDA_SUCCESS;
        CUresult r = check_worker();
        if (r != CUDA_SUCCESS)
            return r;
    }
}

CUresult sv_begin(sv_slot *s, unsigned op, uint32_t len, uint32_t reply, unsigned flags) {
    CUresult r = CUDA_SUCCESS;
    if (!enter_depth || !sv_sh)
        return sv_ready() == CUDA_SUCCESS ? CUDA_ERROR_ILLEGAL_STATE : sv_ready(); /* a caller outside sv_enter */
    if (atomic_load_explicit(&sv_up, memory_order_relaxed) == SV_S_GONE)
        return SV_GONE;
    uint32_t asked = len;
    len = (len + SV_REC_ALIGN - 1) & ~(SV_REC_ALIGN - 1);
    pthread_mutex_lock(&R.prod_mu);
    uint64_t head = R.head;
    uint32_t off = (uint32_t)(head % SV_RING_BYTES);
    uint32_t pad = off + len > SV_RING_BYTES ? SV_RING_BYTES - off : 0; /* a record never wraps */
    uint64_t end = head + pad + len;
    if (end - R.tail_seen > SV_RING_BYTES && (r = wait_room(end)) != CUDA_SUCCESS) {
        pthread_mutex_unlock(&R.prod_mu);
        return r;
    }
    if (pad) {
        struct sv_rec p = {.op = SV_OP_PAD, .len = pad};
        memcpy(sv_sh->ring + off, &p, sizeof p);
        off = 0;
    }
    s->rec = (struct sv_rec *)(void *)(sv_sh->ring + off);
    s->rec->op = (uint16_t)op;
    s->rec->flags = (uint16_t)flags;
    s->rec->len = len;
    s->rec->reply = reply;
    s->rec->pad = 0;
    s->payload = (uint8_t *)(s->rec + 1);
    /* The padding reads as zeros, not as an older record's bytes: the worker sees the padded length, so a payload
     * of strings (cuBLAS's load) ends with its terminator, and a template's script holds no stale bytes. */
    if (len > asked)
        memset((uint8_t *)s->rec + asked, 0, len - asked);
    R.next_head = end;
    return CUDA_SUCCESS;
}

void sv_commit(sv_slot *s) {
    struct sv_header *h = &sv_sh->h;
    if (sv_recording) {
        /* No worker: the record goes into the script, answered there; the next one is written at the start. */
        sv_script_record(s->rec);
        R.head = R.next_head = R.tail_seen = 0;
        pthread_mutex_unlock(&R.prod_mu);
        return;
    }
    R.head = R.next_head;
    atomic_store_explicit(&h->head, R.head, memory_order_release);
    /* Dekker with the parking worker (exec.c wait_work): publish, fence, then read its flag. */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&h->wsleep, memory_order_relaxed) && atomic_exchange(&h->wsleep, 0)) {
        atomic_fetch_add(&h->wseq, 1);
        sv_futex_wake(&h->wseq);
    }
    pthread_mutex_unlock(&R.prod_mu);
}

CUresult sv_async(unsigned op, const void *payload, uint32_t plen) {
    sv_slot s;
    CUresult r = sv_enter();
    if (r != CUDA_SUCCESS)
        return r;
    r = sv_begin(&s, op, (uint32_t)sizeof(struct sv_rec) + plen, 0, 0);
    if (r == CUDA_SUCCESS) {
        memcpy(s.payload, payload, plen);
        sv_commit(&s);
    }
    sv_leave();
    return r;
}

/* ---- replies ---- */

CUresult sv_reply_claim(uint32_t *slot) {
    for (unsigned spins = 0;; spins++) {
        uint64_t bits = atomic_load(&R.reply_bits);
        if (bits != ~0ull) {
            unsigned i = (unsigned)__builtin_ctzll(~bits);
            if (atomic_compare_exchange_weak(&R.reply_bits, &bits, bits | 1ull << i)) {
                struct sv_reply *rp = &sv_sh->reply[i];
                rp->result = 0;
                rp->len = 0;
                atomic_store(&rp->waiting, 0);
                atomic_store(&rp->state, SV_PENDING);
                *slot = i;
                return CUDA_SUCCESS;
            }
            continue;
        }
        /* 64 synchronous calls in flight: one of them ends soon */
        sched_yield();
        if ((spins & 1023) == 1023) {
            CUresult r = check_worker();
            if (r != CUDA_SUCCESS)
                return r;
        }
    }
}

void sv_reply_release(uint32_t slot) { atomic_fetch_and(&R.reply_bits, ~(1ull << slot)); }

CUresult sv_reply_wait(uint32_t slot, void *out, uint32_t cap, uint32_t *outlen) {
    struct sv_reply *rp = &sv_sh->reply[slot];
    CUresult r = wait_word(&rp->state, &rp->waiting, SV_PENDING);
    if (r != CUDA_SUCCESS)
        return r;
    uint32_t len = rp->len < SV_REPLY_DATA ? rp->len : SV_REPLY_DATA;
    if (len > cap)
        len = cap;
    if (out && len)
        memcpy(out, rp->data, len);
    if (outlen)
        *outlen = len;
    return (CUresult)rp->result;
}

CUresult sv_take_deferred(CUresult r) {
    if (r != CUDA_SUCCESS || !sv_sh)
        return r;
    if (atomic_load_explicit(&sv_sh->h.deferred, memory_order_relaxed) == 0)
        return r;
    int32_t d = atomic_exchange(&sv_sh->h.deferred, 0);
    return d ? (CUresult)d : r;
}

static CUresult sync_call(unsigned op, const void *payload, uint32_t plen, const char *name, void *out, uint32_t cap,
                          uint32_t *outlen, bool syncpoint) {
    uint32_t slot;
    CUresult r = sv_enter();
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = sv_reply_claim(&slot)) != CUDA_SUCCESS) {
        sv_leave();
        return r;
    }
    size_t nl = name ? strlen(name) + 1 : 0;
    sv_slot s;
    r = sv_begin(&s, op, (uint32_t)(sizeof(struct sv_rec) + plen + nl), slot + 1, 0);
    if (r == CUDA_SUCCESS) {
        memcpy(s.payload, payload, plen);
        if (nl)
            memcpy(s.payload + plen, name, nl);
        sv_commit(&s);
        r = sv_reply_wait(slot, out, cap, outlen);
    }
    sv_reply_release(slot);
    r = syncpoint ? sv_take_deferred(r) : r;
    sv_leave();
    return r;
}

CUresult sv_sync(unsigned op, const void *payload, uint32_t plen, void *out, uint32_t cap, uint32_t *outlen,
                 bool syncpoint) {
    return sync_call(op, payload, plen, NULL, out, cap, outlen, syncpoint);
}

CUresult sv_sync_named(unsigned op, const void *payload, uint32_t plen, const char *name, void *out, uint32_t cap,
                       uint32_t *outlen) {
    if (!name || strlen(name) >= SV_MAX_NAME)
        return CUDA_ERROR_INVALID_VALUE;
    return sync_call(op, payload, plen, name, out, cap, outlen, false);
}

/* ---- staging ---- */

bool sv_stage_try(uint32_t *slot) {
    uint32_t start = atomic_fetch_add(&R.stage_next, 1);
    for (uint32_t k = 0; k < SV_NSTAGE; k++) {
        uint32_t i = (start + k) % SV_NSTAGE;
        uint32_t want = SV_FREE;
        if (atomic_load_explicit(&sv_sh->stagehdr[i].state, memory_order_relaxed) == SV_FREE &&
            atomic_compare_exchange_strong(&sv_sh->stagehdr[i].state, &want, SV_PENDING)) {
            atomic_store(&sv_sh->stagehdr[i].waiting, 0);
            *slot = i;
            return true;
        }
    }
    return false;
}

CUresult sv_stage_claim(uint32_t *slot) {
    struct sv_header *h = &sv_sh->h;
    for (unsigned round = 0;; round++) {
        if (sv_stage_try(slot))
            return CUDA_SUCCESS;
        if (round < 64) {
            sv_cpu_relax();
            continue;
        }
        uint32_t seq = atomic_load(&h->stage_seq);
        atomic_store_explicit(&h->stage_wait, 1, memory_order_seq_cst);
        bool any = false;
        for (uint32_t i = 0; i < SV_NSTAGE && !any; i++)
            any = atomic_load_explicit(&sv_sh->stagehdr[i].state, memory_order_seq_cst) == SV_FREE;
        if (any)
            continue;
        sv_futex_wait(&h->stage_seq, seq, PARK_NS);
        CUresult r = check_worker();
        if (r != CUDA_SUCCESS)
            return r;
    }
}

CUresult sv_stage_wait(uint32_t slot) {
    struct sv_stagehdr *sh = &sv_sh->stagehdr[slot];
    CUresult r = wait_word(&sh->state, &sh->waiting, SV_PENDING);
    return r != CUDA_SUCCESS ? r : (CUresult)sh->result;
}

void sv_stage_release(uint32_t slot) {
    struct sv_header *h = &sv_sh->h;
    atomic_store_explicit(&sv_sh->stagehdr[slot].state, SV_FREE, memory_order_seq_cst);
    if (atomic_load_explicit(&h->stage_wait, memory_order_seq_cst) && atomic_exchange(&h->stage_wait, 0)) {
        atomic_fetch_add(&h->stage_seq, 1);
        sv_futex_wake(&h->stage_seq);
    }
}

void sv_image_lock(void) { pthread_mutex_lock(&R.image_mu); }
void sv_image_unlock(void) { pthread_mutex_unlock(&R.image_mu); }

/* ---- descriptors over the socket (served.h: VMM handles across processes) ---- */

CUresult sv_send_fd_rec(unsigned op, int fd, struct sv_fd_rec *q, void *out, uint32_t cap) {
    CUresult r = sv_enter();
    if (r != CUDA_SUCCESS)
        return r;
    uint32_t slot;
    if ((r = sv_reply_claim(&slot)) != CUDA_SUCCESS) {
        sv_leave();
        return r;
    }
    /* The message and its record under one lock: the worker takes messages in the ring's order. */
    pthread_mutex_lock(&R.fd_mu);
    q->seq = ++R.fd_seq;
    struct sv_fdmsg m = {SV_FD_MAGIC, 0, q->seq};
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
        n = sendmsg(R.sock, &h, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof m) {
        pthread_mutex_unlock(&R.fd_mu);
        sv_reply_release(slot);
        sv_leave();
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
            return sv_gone("its socket closed (the worker exited or was killed)");
        sv_warn("served mode: sending a descriptor to the worker: %s", n < 0 ? strerror(errno) : "short write");
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    sv_slot s;
    r = sv_begin(&s, op, (uint32_t)(sizeof(struct sv_rec) + sizeof *q), slot + 1, 0);
    if (r == CUDA_SUCCESS) {
        memcpy(s.payload, q, sizeof *q);
        sv_commit(&s);
    }
    pthread_mutex_unlock(&R.fd_mu);
    if (r == CUDA_SUCCESS)
        r = sv_reply_wait(slot, out, cap, NULL);
    sv_reply_release(slot);
    sv_leave();
    return r;
}

#define FD_WAIT_MS 10000 /* the worker sent the descriptor before it answered */

CUresult sv_recv_fd_rec(unsigned op, struct sv_fd_rec *q, void *out, uint32_t cap, int *fd) {
    CUresult r = sv_enter();
    if (r != CUDA_SUCCESS)
        return r;
    /* One export at a time: the message that follows a successful answer is this call's. */
    pthread_mutex_lock(&R.fd_mu);
    q->seq = ++R.fd_seq;
    r = sv_sync(op, q, sizeof *q, out, cap, NULL, false);
    *fd = -1;
    if (r == CUDA_SUCCESS) {
        struct sv_fdmsg m;
        char cbuf[CMSG_SPACE(sizeof(int) * 4)];
        struct iovec iov = {&m, sizeof m};
        struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
        ssize_t n = -1;
        for (;;) {
            struct pollfd p = {.fd = R.sock, .events = POLLIN};
            int pr = poll(&p, 1, FD_WAIT_MS);
            if (pr < 0 && errno == EINTR)
                continue;
            if (pr > 0)
                n = recvmsg(R.sock, &h, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
            if (pr > 0 && n < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            break;
        }
        int got = 0;
        if (n > 0)
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
                        close(f);
                }
            }
        if (n != (ssize_t)sizeof m || m.magic != SV_FD_MAGIC || m.seq != q->seq || got != 1) {
            if (*fd >= 0)
                close(*fd);
            *fd = -1;
            r = n == 0 ? sv_gone("its socket closed (the worker exited or was killed)") : CUDA_ERROR_OPERATING_SYSTEM;
            if (r != SV_GONE)
                sv_warn("served mode: the worker's exported descriptor did not come with its answer");
        }
    }
    pthread_mutex_unlock(&R.fd_mu);
    sv_leave();
    return r;
}

/* ---- letting the worker go before a dump, taking another after ---- */

#define DETACH_WAIT_NS 30000000000LL /* calls in flight at a detach: the interposer drained the device first */

/* Closes the socket and unmaps the ring (the worker ends when it sees the socket close). */
static void drop_worker(void) {
    if (sv_sh) {
        R.deferred_kept = atomic_load(&sv_sh->h.deferred);
        munmap(sv_sh, sizeof *sv_sh);
    }
    sv_sh = NULL;
    if (R.sock >= 0)
        close(R.sock);
    R.sock = -1;
}

SV_API int gpucrServedDetach(void) {
    pthread_mutex_lock(&R.init_mu);
    int st = atomic_load(&sv_up);
    if (st != SV_S_UP) {
        int rc = 0;
        if (st == SV_S_GONE && (sv_sh || R.sock >= 0)) {
            /* Nothing left to drain; what CRIU must not find goes anyway. */
            drop_worker();
            sv_warn("served mode: detach: the worker (pid %d) was gone already; this process's GPU objects are lost",
                    R.worker_pid);
            rc = -1;
        }
        pthread_mutex_unlock(&R.init_mu);
        return rc; /* never initialized, or detached already */
    }
    atomic_store(&sv_up, SV_S_DETACHED); /* new calls wait in sv_enter */
    long long t0 = sv_now_ns();
    for (;;) {
        uint32_t n = atomic_load(&R.inside);
        if (n == 0)
            break;
        if (sv_now_ns() - t0 > DETACH_WAIT_NS || check_worker() != CUDA_SUCCESS) {
            bool gone = atomic_load(&sv_up) == SV_S_GONE;
            if (!gone) {
                atomic_store(&sv_up, SV_S_UP);
                futex_wake_int(&sv_up);
            }
            pthread_mutex_unlock(&R.init_mu);
            sv_warn("served mode: detach: %s; the worker is kept", gone ? "the worker is gone"
                                                                        : "calls of this process still wait for the "
                                                                          "worker after 30 s");
            return -1;
        }
        struct timespec ts = {0, PARK_NS};
        syscall(SYS_futex, (uint32_t *)&R.inside, FUTEX_WAIT, n, &ts, NULL, 0);
    }
    /* No thread uses the ring now: the worker runs what is in it, and synchronizes its context. */
    replaying = true;
    CUresult r = sv_sync(SV_OP_CTX_SYNC, NULL, 0, NULL, 0, NULL, false);
    replaying = false;
    if (r == SV_GONE) {
        pthread_mutex_unlock(&R.init_mu);
        return -1; /* sv_gone said why */
    }
    if (r != CUDA_SUCCESS && !R.deferred_kept)
        R.deferred_kept = (int32_t)r; /* the next synchronizing call after the attach returns it */
    /* Module and library globals are the worker's memory, not the helper's: what they hold goes with the process. */
    replaying = true;
    sv_globals_save();
    replaying = false;
    /* The worker answers a record before it moves its tail past it: the synchronize's answer came, its tail
     * follows at once. */
    for (long long t1 = sv_now_ns(); atomic_load(&sv_sh->h.tail) != R.head;) {
        if (sv_now_ns() - t1 > PARK_NS * 20 || check_worker() != CUDA_SUCCESS) {
            sv_warn("served mode: detach: the worker did not finish the ring (tail %llu of %llu); it is let go",
                    (unsigned long long)atomic_load(&sv_sh->h.tail), (unsigned long long)R.head);
            drop_worker();
            pthread_mutex_unlock(&R.init_mu);
            return -1;
        }
        sched_yield();
    }
    int pid = R.worker_pid;
    drop_worker();
    pthread_mutex_unlock(&R.init_mu);
    sv_debug("served mode: detached from the worker (pid %d)", pid);
    return 0;
}

SV_API int gpucrServedAttach(void) {
    pthread_mutex_lock(&R.init_mu);
    if (atomic_load(&sv_up) != SV_S_DETACHED) {
        pthread_mutex_unlock(&R.init_mu);
        return 0; /* attached already, or never initialized */
    }
    const char *env = getenv("GPUCR_SOCKET");
    const char *path = env && *env ? env : "/run/gpucr/helper.sock";
    char uuid[sizeof R.uuid];
    memcpy(uuid, R.uuid, sizeof uuid);
    bool templ = false;
    int sock = serve_from_helper(path, R.device, uuid[0] ? uuid : NULL, R.have_token ? R.token : NULL, &templ);
    R.have_token = false; /* one attach per script: the process runs on from here and its objects change */
    R.attached_template = templ;
    CUresult r = sock < 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
        R.sock = sock;
        atomic_store(&R.gone_said, 0);
        atomic_store(&R.reply_bits, 0);
        atomic_store(&R.stage_next, 0);
        R.head = R.next_head = R.tail_seen = 0;
        r = handshake(sock);
    }
    if (r == CUDA_SUCCESS) {
        sv_api_attached(strcmp(uuid, R.uuid) != 0);
        if (templ) {
            /* The worker ran this process's script before the restore: every object is there already, though
             * a global may be elsewhere (sv_globals_refresh). */
            sv_globals_forget_saved();
            replaying = true;
            r = sv_globals_refresh();
            replaying = false;
        } else {
            replaying = true;
            r = sv_replay();
            replaying = false;
        }
    }
    if (r == CUDA_SUCCESS && R.deferred_kept) {
        /* the process's own failure from before the detach, for its next synchronizing call */
        atomic_store(&sv_sh->h.deferred, R.deferred_kept);
        R.deferred_kept = 0;
    }
    if (r != CUDA_SUCCESS) {
        drop_worker();
        sv_gone("no worker could take this process's GPU objects again after the checkpoint");
        pthread_mutex_unlock(&R.init_mu);
        return -1;
    }
    atomic_store(&sv_up, SV_S_UP);
    futex_wake_int(&sv_up);
    pthread_mutex_unlock(&R.init_mu);
    sv_debug("served mode: attached to the worker (pid %d) on %s%s", R.worker_pid, R.uuid,
             templ ? ", a template of this process" : "");
    return 0;
}

/* ---- a template's script ---- */

SV_API int gpucrServedScript(void) {
    pthread_mutex_lock(&R.init_mu);
    if (atomic_load(&sv_up) != SV_S_DETACHED || sv_sh || R.sock >= 0) {
        pthread_mutex_unlock(&R.init_mu);
        sv_warn("served mode: no template's script: the process is not detached from its worker");
        return -1;
    }
    /* The ring the replay writes into: private, with no worker behind it (sv_commit hands each record to the
     * script). Every other thread of the process waits in sv_enter, as for an attach. */
    struct sv_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t token[SV_TOKEN_BYTES];
    bool ok = sh != MAP_FAILED && getentropy(token, sizeof token) == 0 && sv_script_begin();
    const char *why = "no memory for it";
    int fd = -1;
    if (ok) {
        sv_sh = sh;
        R.head = R.next_head = R.tail_seen = 0;
        atomic_store(&R.reply_bits, 0);
        atomic_store(&R.stage_next, 0);
        sv_recording = true;
        replaying = true;
        CUresult r = sv_replay();
        replaying = false;
        sv_recording = false;
        sv_sh = NULL;
        fd = sv_script_end(token, r == CUDA_SUCCESS, &why);
    }
    if (sh != MAP_FAILED)
        munmap(sh, sizeof *sh);
    R.have_token = fd >= 0;
    if (fd >= 0)
        memcpy(R.token, token, sizeof token);
    pthread_mutex_unlock(&R.init_mu);
    if (fd < 0)
        sv_warn("served mode: no template's script for this checkpoint: %s", why);
    return fd;
}

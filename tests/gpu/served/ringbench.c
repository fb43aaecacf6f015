/*
 * ringbench: what it costs to forward kernel launches from the application's
 * process to a worker process that owns the CUDA context (API remoting, the
 * "served mode"), beside the same launches made directly.
 *
 *   ringbench MODE [N]        (N launches, default 200000)
 *
 * Every mode launches one tiny kernel (one thread stores a u32) N times on
 * one stream, then waits for the stream, and prints one line:
 *
 *   mode=ring n=200000 enqueue_ns=.. total_ns=.. worker_cpu_ns=.. ...
 *
 * enqueue_ns: wall time of the launch loop per launch, what the application
 *   sees per asynchronous launch; total_ns: the same loop up to the
 *   completion of the stream's synchronization, per launch.
 *
 *   direct          the process calls cuLaunchKernel itself.
 *   ring            the process makes no CUDA call at all; it writes launch
 *                   records (parameters copied by value) into a shared-memory
 *                   ring and does not wait; a worker process (this binary,
 *                   started before any CUDA call, since a context does not
 *                   survive fork) calls cuLaunchKernel for each.
 *   ring-rtt        as ring, but every launch waits for the worker's
 *                   acknowledgement: what a synchronous forwarded call costs.
 *   ring-nogpu,     the same two with a worker that makes no CUDA call, only
 *   ring-rtt-nogpu  consumes the records: the transport alone (runs anywhere).
 *   graph-direct,   K=64 launches captured into a CUDA graph, N/K graph
 *   graph-ring      launches, directly or as forwarded graph-launch records;
 *                   the numbers are per graph launch.
 *
 * Reading the table that ringbench.sh makes of repeated runs: "added" is ring
 * minus direct (graph-ring minus graph-direct). In ring mode the enqueue loop
 * runs at the slower of the producer and the worker: once the worker (or the
 * GPU's queue behind it) falls behind, the ring fills and the producer waits
 * for room, so the added enqueue time is then what the worker spends per
 * record beyond a direct launch (with N well above the ring's 4096 records;
 * a shorter loop mostly fills the ring and never meets the worker's pace,
 * and graph-ring, N/64 records, does not: its enqueue time is the
 * producer's alone, its total the one to compare). ring-rtt minus direct is the round trip
 * that a call the application must wait for adds. The nogpu rows are the
 * transport's own costs, with no driver in the way. worker_cpu_ns is the
 * worker's CPU time per launch over the timed window (all its threads): the
 * worker polls, so while it has not parked this is close to its wall time;
 * parks counts how often it went to sleep on the futex, wakes how often the
 * producer had to wake it, ring_full how often the producer found no room.
 * check=ok: the value the last kernel stored is the last one sent, and every
 * record reached the worker in order. Each enqueue ends in a full fence (the
 * producer must see the worker's parking flag after publishing), so its cost
 * is about one cache line's trip between the two cores. For the graph rows
 * the ratio of the totals is the slowdown of a graph-driven loop (a decode
 * loop) whose step is one graph launch; with a real model's steps, far longer
 * than these 64 empty kernels, the same added time weighs less.
 *
 * RINGBENCH_CPUS=P,W pins the producer to CPU P and the worker to CPU W.
 *
 * The driver is reached through dlopen("libcuda.so.1") and dlsym of the
 * names it exports (the versioned ones where gpucr/cudadrv.h maps a name to
 * one); every return code is checked.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpucr/cudadrv.h"

#define CAP 4096u /* ring records; a power of two */
#define MAX_PARAMS 8
#define PARAM_BYTES 64
#define SPIN_NS 50000LL              /* polling before a wait parks on a futex */
#define WAIT_LIMIT_NS 100000000000LL /* any one wait for the other side */
#define READY_LIMIT_NS 60000000000LL /* the worker's CUDA start */
#define WARM 1000                    /* launches before the timed loop */
#define GRAPH_WARM 16
#define GRAPH_K 64 /* launches per graph */

static const char ptx[] =
    ".version 8.0\n"
    ".target sm_90\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry ringbench_store(\n"
    "\t.param .u64 ringbench_store_p,\n"
    "\t.param .u32 ringbench_store_v\n"
    ")\n"
    "{\n"
    "\t.reg .b32 %r<2>;\n"
    "\t.reg .b64 %rd<3>;\n"
    "\n"
    "\tld.param.u64 %rd1, [ringbench_store_p];\n"
    "\tld.param.u32 %r1, [ringbench_store_v];\n"
    "\tcvta.to.global.u64 %rd2, %rd1;\n"
    "\tst.global.u32 [%rd2], %r1;\n"
    "\tret;\n"
    "}\n";

/* ---- the driver, resolved by name ---- */

#define STR_(x) #x
#define STR(x) STR_(x)

/*
 * X(name): p_name is the pointer; STR(name) expands the header's alias
 * macros first, so cuMemAlloc is looked up as cuMemAlloc_v2, as exported.
 * The graph entry points are in the header (cuStreamBeginCapture only under
 * its exported name, cuStreamBeginCapture_v2).
 */
#define DRV_FUNCS(X)                                                                                                   \
    X(cuInit)                                                                                                          \
    X(cuGetErrorName)                                                                                                  \
    X(cuGetErrorString)                                                                                                \
    X(cuDeviceGet)                                                                                                     \
    X(cuDevicePrimaryCtxRetain)                                                                                        \
    X(cuCtxSetCurrent)                                                                                                 \
    X(cuModuleLoadData)                                                                                                \
    X(cuModuleGetFunction)                                                                                             \
    X(cuMemAlloc)                                                                                                      \
    X(cuMemcpyDtoH)                                                                                                    \
    X(cuStreamCreate)                                                                                                  \
    X(cuStreamSynchronize)                                                                                             \
    X(cuLaunchKernel)                                                                                                  \
    X(cuStreamBeginCapture_v2)                                                                                         \
    X(cuStreamEndCapture)                                                                                              \
    X(cuGraphInstantiateWithFlags)                                                                                     \
    X(cuGraphLaunch)

#define DRV_DECL(f) static __typeof__(&f) p_##f;
DRV_FUNCS(DRV_DECL)

/* ---- the shared ring ---- */

enum { REC_LAUNCH = 1, REC_GRAPH, REC_MARK, REC_SYNC, REC_EXIT };
#define REC_KIND 0xffu
#define REC_ACK 0x100u /* the worker posts a completion once it is done with it */

struct rec {
    uint32_t kind;
    uint32_t fn; /* function (or graph) id, in the worker's table */
    uint32_t grid[3], block[3];
    uint32_t shmem;
    uint32_t stream; /* stream id, in the worker's table */
    uint32_t nparams;
    uint8_t off[MAX_PARAMS]; /* where each parameter's bytes start in params */
    uint32_t pad;
    _Alignas(8) unsigned char params[PARAM_BYTES];
    uint64_t pad2;
};
_Static_assert(sizeof(struct rec) == 128, "a record is two cache lines");

enum { ST_STARTING = 0, ST_READY = 1, ST_FAILED = 2 };

/*
 * Each index on a cache line of its own, written by one side only, so that
 * the producer's stores and the worker's do not take the same line back and
 * forth. The parking flags sit apart from the indices, which change on every
 * record, because each side reads the other's flag on its hot path.
 */
struct shared {
    _Alignas(64) _Atomic uint64_t head;   /* records published (producer) */
    _Alignas(64) _Atomic uint64_t tail;   /* records consumed (worker) */
    _Alignas(64) _Atomic uint32_t wsleep; /* the worker is parked, or about to */
    _Atomic uint32_t wseq;                /* its futex word */
    _Alignas(64) _Atomic uint32_t done;   /* completions posted (worker) */
    _Atomic uint32_t pwait;               /* the producer is parked, or about to */
    _Alignas(64) _Atomic uint32_t state;  /* ST_* (worker), also a futex word */
    /* written by the worker before it posts a completion, read after it */
    uint64_t dptr;
    uint32_t result; /* the value the kernel stored last */
    uint64_t cpu_ns; /* worker CPU time, MARK to SYNC */
    uint64_t parks;
    uint64_t order_errors;
    char err[512];
    _Alignas(64) struct rec r[CAP];
};

/* ---- process-wide ---- */

static struct shared *g_sh;
static int g_worker;
static pid_t g_child = -1;

static void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

static long futex_wait(_Atomic uint32_t *a, uint32_t val, long long timeout_ns) {
    struct timespec ts = {(time_t)(timeout_ns / 1000000000LL), (long)(timeout_ns % 1000000000LL)};
    /* not FUTEX_PRIVATE_FLAG: the word is shared between two processes */
    return syscall(SYS_futex, (uint32_t *)a, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *a) { syscall(SYS_futex, (uint32_t *)a, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void post_done(struct shared *sh) {
    /* a locked add: a full barrier before the read of pwait, the counterpart
     * of the producer's fence between pwait and its read of done */
    atomic_fetch_add_explicit(&sh->done, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&sh->pwait, memory_order_relaxed) && atomic_exchange(&sh->pwait, 0))
        futex_wake(&sh->done);
}

static void fail(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ringbench%s: %s\n", g_worker ? " worker" : "", msg);
    if (g_worker && g_sh) {
        memcpy(g_sh->err, msg, sizeof g_sh->err);
        g_sh->err[sizeof g_sh->err - 1] = 0;
        atomic_store_explicit(&g_sh->state, ST_FAILED, memory_order_release);
        futex_wake(&g_sh->state);
        post_done(g_sh); /* a producer waiting for a completion looks at state */
    }
    if (!g_worker && g_child > 0)
        kill(g_child, SIGKILL);
    exit(1);
}

static void __attribute__((noinline, noreturn)) cu_fail(CUresult r, const char *fn, int line) {
    const char *name = NULL, *desc = NULL;
    if (p_cuGetErrorName)
        p_cuGetErrorName(r, &name);
    if (p_cuGetErrorString)
        p_cuGetErrorString(r, &desc);
    fail("%s (ringbench.c:%d) returned %d %s: %s", fn, line, (int)r, name ? name : "?", desc ? desc : "?");
}

/* STR(f): the exported name, as resolved, in the message */
#define CU(f, ...)                                                                                                     \
    do {                                                                                                               \
        CUresult cu_r_ = p_##f(__VA_ARGS__);                                                                           \
        if (__builtin_expect(cu_r_ != CUDA_SUCCESS, 0))                                                                \
            cu_fail(cu_r_, STR(f), __LINE__);                                                                          \
    } while (0)

static void drv_load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        fail("dlopen libcuda.so.1: %s", dlerror());
#define DRV_RESOLVE(f)                                                                                                 \
    p_##f = (__typeof__(p_##f))dlsym(h, STR(f));                                                                       \
    if (!p_##f)                                                                                                        \
        fail("dlsym %s: libcuda.so.1 does not export it", STR(f));
    DRV_FUNCS(DRV_RESOLVE)
#undef DRV_RESOLVE
}

/* ---- the GPU side (direct modes, and the worker) ---- */

struct gpu {
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream stream;
    CUdeviceptr dptr;
    CUgraph graph;
    CUgraphExec exec;
};

static inline void gpu_launch(const struct gpu *g, uint32_t v) {
    CUdeviceptr p = g->dptr;
    void *kp[2] = {&p, &v};
    CU(cuLaunchKernel, g->fn, 1, 1, 1, 1, 1, 1, 0, g->stream, kp, NULL);
}

static void gpu_setup(struct gpu *g, int with_graph) {
    CUdevice dev;
    memset(g, 0, sizeof *g);
    drv_load();
    CU(cuInit, 0);
    CU(cuDeviceGet, &dev, 0);
    CU(cuDevicePrimaryCtxRetain, &g->ctx, dev);
    CU(cuCtxSetCurrent, g->ctx);
    CU(cuModuleLoadData, &g->mod, ptx);
    CU(cuModuleGetFunction, &g->fn, g->mod, "ringbench_store");
    CU(cuMemAlloc, &g->dptr, 4);
    /* non-blocking: no implicit ordering with the legacy default stream */
    CU(cuStreamCreate, &g->stream, CU_STREAM_NON_BLOCKING);
    if (with_graph) {
        /* the values are fixed at capture: the last node stores GRAPH_K-1 */
        CU(cuStreamBeginCapture_v2, g->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        for (uint32_t i = 0; i < GRAPH_K; i++)
            gpu_launch(g, i);
        CU(cuStreamEndCapture, g->stream, &g->graph);
        CU(cuGraphInstantiateWithFlags, &g->exec, g->graph, 0);
    }
}

static uint32_t gpu_result(const struct gpu *g) {
    uint32_t v = 0;
    CU(cuStreamSynchronize, g->stream);
    CU(cuMemcpyDtoH, &v, g->dptr, sizeof v);
    return v;
}

/* ---- pinning ---- */

static int env_cpu(int which) {
    const char *s = getenv("RINGBENCH_CPUS");
    int p, w;
    if (!s || !*s)
        return -1;
    if (sscanf(s, "%d,%d", &p, &w) != 2 || p < 0 || w < 0)
        fail("RINGBENCH_CPUS=%s: want P,W (the producer's CPU, the worker's)", s);
    return which ? w : p;
}

static void pin(int cpu) {
    cpu_set_t set;
    if (cpu < 0)
        return;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fail("sched_setaffinity to CPU %d: %s", cpu, strerror(errno));
}

/* ---- the worker ---- */

enum { W_NOGPU = 0, W_GPU = 1, W_GRAPH = 2 };

/* Returns the head once there is a record past tail. */
static uint64_t wait_work(struct shared *sh, uint64_t tail, uint64_t *parks) {
    for (;;) {
        uint64_t head = atomic_load_explicit(&sh->head, memory_order_acquire);
        if (head != tail)
            return head; /* before the clock: that read is not free */
        long long t0 = now_ns();
        for (unsigned i = 1;; i++) {
            head = atomic_load_explicit(&sh->head, memory_order_acquire);
            if (head != tail)
                return head;
            cpu_relax();
            if ((i & 63) == 0 && now_ns() - t0 > SPIN_NS)
                break;
        }
        /*
         * Dekker with the producer: it stores head, fences, reads wsleep; we
         * store wsleep, fence, read head. One of us sees the other's store,
         * so either we see the record or it wakes us; and a wake between our
         * read of wseq and the futex call changes wseq, which the kernel
         * checks, so it is not lost.
         */
        uint32_t seq = atomic_load_explicit(&sh->wseq, memory_order_relaxed);
        atomic_store_explicit(&sh->wsleep, 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_seq_cst);
        head = atomic_load_explicit(&sh->head, memory_order_acquire);
        if (head != tail) {
            atomic_store_explicit(&sh->wsleep, 0, memory_order_relaxed);
            return head;
        }
        (*parks)++;
        /* the timeout only bounds a lost parent; PDEATHSIG ends us anyway */
        futex_wait(&sh->wseq, seq, 1000000000LL);
        atomic_store_explicit(&sh->wsleep, 0, memory_order_relaxed);
    }
}

static int worker_main(int fd, int kind) {
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED)
        fail("mmap of the ring (fd %d): %s", fd, strerror(errno));
    g_sh = sh;
    struct gpu g = {0};
    int gpu = kind != W_NOGPU;
    if (gpu) {
        gpu_setup(&g, kind == W_GRAPH);
        sh->dptr = g.dptr;
    }
    atomic_store_explicit(&sh->state, ST_READY, memory_order_release);
    futex_wake(&sh->state);

    uint64_t tail = 0, parks = 0, order_errors = 0;
    uint32_t last = 0;
    int have_last = 0;
    long long cpu0 = cpu_ns();
    for (;;) {
        uint64_t head = wait_work(sh, tail, &parks);
        while (tail != head) {
            struct rec *r = &sh->r[tail & (CAP - 1)];
            uint32_t k = r->kind;
            int exiting = 0;
            switch (k & REC_KIND) {
            case REC_LAUNCH: {
                void *kp[MAX_PARAMS];
                uint32_t v;
                if (r->fn != 0 || r->stream != 0 || r->nparams != 2)
                    fail("record %" PRIu64 ": function %u, stream %u, %u parameters: not this benchmark's", tail, r->fn,
                         r->stream, r->nparams);
                for (uint32_t i = 0; i < r->nparams; i++)
                    kp[i] = r->params + r->off[i];
                memcpy(&v, r->params + r->off[1], sizeof v);
                if (have_last && v != last + 1)
                    order_errors++;
                last = v;
                have_last = 1;
                /* the ring slot stays ours until tail moves past it: the
                 * driver copies the parameters during the call */
                if (gpu)
                    CU(cuLaunchKernel, g.fn, r->grid[0], r->grid[1], r->grid[2], r->block[0], r->block[1], r->block[2],
                       r->shmem, g.stream, kp, NULL);
                break;
            }
            case REC_GRAPH:
                if (kind != W_GRAPH)
                    fail("record %" PRIu64 ": a graph launch, but this worker has no graph", tail);
                CU(cuGraphLaunch, g.exec, g.stream);
                break;
            case REC_MARK:
                cpu0 = cpu_ns();
                parks = 0;
                break;
            case REC_SYNC:
                if (gpu)
                    CU(cuStreamSynchronize, g.stream);
                sh->cpu_ns = (uint64_t)(cpu_ns() - cpu0);
                sh->parks = parks;
                sh->order_errors = order_errors;
                break;
            case REC_EXIT:
                sh->result = gpu ? gpu_result(&g) : last;
                exiting = 1;
                break;
            default: fail("record %" PRIu64 ": unknown kind %#x", tail, k);
            }
            tail++;
            atomic_store_explicit(&sh->tail, tail, memory_order_release);
            if (k & REC_ACK)
                post_done(sh);
            if (exiting)
                return 0;
        }
    }
}

/* ---- the producer ---- */

struct prod {
    struct shared *sh;
    uint64_t head;
    uint64_t tail_seen; /* the worker's tail when last read: room is known without reading it again */
    uint32_t acks;      /* completions asked for */
    uint32_t val;       /* the next launch's value */
    uint64_t full, wakes;
    int reaped;
    int status;
    struct rusage ru;
};

/* How the benchmark's kernel lays out its parameters, as an interposer
 * would learn it with cuFuncGetParamInfo. */
static const struct layout {
    uint32_t n;
    uint8_t off[MAX_PARAMS], size[MAX_PARAMS];
} store_layout = {2, {0, 8}, {8, 4}};

static void check_worker(struct prod *p) {
    if (atomic_load_explicit(&p->sh->state, memory_order_acquire) == ST_FAILED)
        fail("the worker failed: %s", p->sh->err);
    if (!p->reaped) {
        pid_t r = wait4(g_child, &p->status, WNOHANG, &p->ru);
        if (r == g_child) {
            p->reaped = 1;
            g_child = -1;
            fail("the worker ended (%s %d)%s%s", WIFSIGNALED(p->status) ? "signal" : "status",
                 WIFSIGNALED(p->status) ? WTERMSIG(p->status) : WEXITSTATUS(p->status), p->sh->err[0] ? ": " : "",
                 p->sh->err);
        }
    }
}

static struct rec *ring_slot(struct prod *p) {
    if (p->head - p->tail_seen == CAP) {
        p->tail_seen = atomic_load_explicit(&p->sh->tail, memory_order_acquire);
        if (p->head - p->tail_seen == CAP) {
            long long t0 = now_ns();
            p->full++;
            for (unsigned i = 1; p->head - p->tail_seen == CAP; i++) {
                cpu_relax();
                if ((i & 0xffff) == 0) {
                    check_worker(p);
                    if (now_ns() - t0 > WAIT_LIMIT_NS)
                        fail("the ring stayed full for %lld s", WAIT_LIMIT_NS / 1000000000LL);
                }
                p->tail_seen = atomic_load_explicit(&p->sh->tail, memory_order_acquire);
            }
        }
    }
    return &p->sh->r[p->head & (CAP - 1)];
}

static void ring_publish(struct prod *p, uint32_t kind) {
    struct shared *sh = p->sh;
    if (kind & REC_ACK)
        p->acks++;
    p->head++;
    atomic_store_explicit(&sh->head, p->head, memory_order_release);
    /* the other half of wait_work's Dekker */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&sh->wsleep, memory_order_relaxed) && atomic_exchange(&sh->wsleep, 0)) {
        atomic_fetch_add_explicit(&sh->wseq, 1, memory_order_relaxed);
        futex_wake(&sh->wseq);
        p->wakes++;
    }
}

static inline void ring_launch(struct prod *p, void **kp, const struct layout *L, uint32_t ack) {
    struct rec *r = ring_slot(p);
    r->kind = REC_LAUNCH | ack;
    r->fn = 0;
    r->grid[0] = r->grid[1] = r->grid[2] = 1;
    r->block[0] = r->block[1] = r->block[2] = 1;
    r->shmem = 0;
    r->stream = 0;
    r->nparams = L->n;
    for (uint32_t i = 0; i < L->n; i++) {
        r->off[i] = L->off[i];
        memcpy(r->params + L->off[i], kp[i], L->size[i]);
    }
    ring_publish(p, r->kind);
}

static void ring_simple(struct prod *p, uint32_t kind) {
    struct rec *r = ring_slot(p);
    r->kind = kind;
    r->fn = 0;
    r->stream = 0;
    ring_publish(p, kind);
}

/* Waits for every completion asked for so far. */
static void ring_wait_done(struct prod *p) {
    struct shared *sh = p->sh;
    long long t0 = now_ns();
    for (unsigned i = 1;; i++) {
        if ((int32_t)(atomic_load_explicit(&sh->done, memory_order_acquire) - p->acks) >= 0)
            break;
        cpu_relax();
        if ((i & 63) == 0 && now_ns() - t0 > SPIN_NS) {
            for (;;) {
                uint32_t d = atomic_load_explicit(&sh->done, memory_order_acquire);
                if ((int32_t)(d - p->acks) >= 0)
                    break;
                atomic_store_explicit(&sh->pwait, 1, memory_order_relaxed);
                atomic_thread_fence(memory_order_seq_cst);
                d = atomic_load_explicit(&sh->done, memory_order_acquire);
                if ((int32_t)(d - p->acks) >= 0) {
                    atomic_store_explicit(&sh->pwait, 0, memory_order_relaxed);
                    break;
                }
                futex_wait(&sh->done, d, 100000000LL);
                atomic_store_explicit(&sh->pwait, 0, memory_order_relaxed);
                check_worker(p);
                if (now_ns() - t0 > WAIT_LIMIT_NS)
                    fail("no completion from the worker in %lld s", WAIT_LIMIT_NS / 1000000000LL);
            }
            break;
        }
    }
    /* a failing worker posts a completion too; wait4 would put a system call
     * into every round trip, so only the flag is read here */
    if (atomic_load_explicit(&sh->state, memory_order_acquire) == ST_FAILED)
        check_worker(p);
}

static void ring_start(struct prod *p, const char *self, int wkind) {
    int fd = memfd_create("ringbench", 0); /* no CLOEXEC: the worker gets it through exec */
    if (fd < 0)
        fail("memfd_create: %s", strerror(errno));
    if (ftruncate(fd, sizeof(struct shared)) != 0)
        fail("ftruncate of the ring: %s", strerror(errno));
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED)
        fail("mmap of the ring: %s", strerror(errno));
    if (!atomic_is_lock_free(&sh->head) || !atomic_is_lock_free(&sh->done))
        fail("64- or 32-bit atomics are not lock-free here: they would not work across processes");
    memset(p, 0, sizeof *p);
    p->sh = sh;
    g_sh = sh;

    char fds[16], kinds[16];
    snprintf(fds, sizeof fds, "%d", fd);
    snprintf(kinds, sizeof kinds, "%d", wkind);
    pid_t parent = getpid();
    fflush(NULL);
    pid_t c = fork();
    if (c < 0)
        fail("fork: %s", strerror(errno));
    if (c == 0) {
        g_worker = 1; /* a failure here reaches the parent through the ring's err */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        pin(env_cpu(1));
        char *argv[] = {(char *)self, "worker", fds, kinds, NULL};
        execv("/proc/self/exe", argv);
        fprintf(stderr, "ringbench: exec of the worker: %s\n", strerror(errno));
        _exit(127);
    }
    g_child = c;
    close(fd);

    long long t0 = now_ns();
    while (atomic_load_explicit(&sh->state, memory_order_acquire) == ST_STARTING) {
        futex_wait(&sh->state, ST_STARTING, 100000000LL);
        check_worker(p);
        if (now_ns() - t0 > READY_LIMIT_NS)
            fail("the worker was not ready in %lld s", READY_LIMIT_NS / 1000000000LL);
    }
    check_worker(p);
}

/* Waits for the worker to exit after REC_EXIT, for its rusage. */
static void ring_reap(struct prod *p) {
    long long t0 = now_ns();
    while (!p->reaped) {
        pid_t r = wait4(g_child, &p->status, WNOHANG, &p->ru);
        if (r == g_child) {
            p->reaped = 1;
            break;
        }
        if (r < 0)
            fail("wait4 of the worker: %s", strerror(errno));
        if (now_ns() - t0 > 30000000000LL)
            fail("the worker did not exit in 30 s after its last record");
        usleep(1000);
    }
    g_child = -1;
    if (!WIFEXITED(p->status) || WEXITSTATUS(p->status) != 0)
        fail("the worker ended badly (%s %d)", WIFSIGNALED(p->status) ? "signal" : "status",
             WIFSIGNALED(p->status) ? WTERMSIG(p->status) : WEXITSTATUS(p->status));
}

/* ---- the modes ---- */

struct result {
    const char *mode;
    uint64_t n;
    long long loop_ns, total_ns;
    int worker;
    uint64_t worker_cpu_ns, parks, wakes, full, order_errors;
    double worker_cpu_all_ms;
    int graph;
    uint32_t got, want;
};

static int report(const struct result *r) {
    int ok = r->got == r->want && r->order_errors == 0;
    printf("mode=%s n=%" PRIu64 " enqueue_ns=%.1f total_ns=%.1f", r->mode, r->n, (double)r->loop_ns / (double)r->n,
           (double)r->total_ns / (double)r->n);
    if (r->worker)
        printf(" worker_cpu_ns=%.1f parks=%" PRIu64 " wakes=%" PRIu64 " ring_full=%" PRIu64 " order_errors=%" PRIu64
               " worker_cpu_all_ms=%.1f",
               (double)r->worker_cpu_ns / (double)r->n, r->parks, r->wakes, r->full, r->order_errors,
               r->worker_cpu_all_ms);
    else
        printf(" worker_cpu_ns=-");
    if (r->graph)
        printf(" kernels_per_launch=%d", GRAPH_K);
    if (ok)
        printf(" check=ok\n");
    else
        printf(" check=FAIL(stored %u, want %u)\n", r->got, r->want);
    fflush(stdout);
    return ok ? 0 : 1;
}

static int run_direct(const char *mode, uint64_t n, int graph) {
    struct gpu g;
    struct result res = {.mode = mode, .graph = graph};
    pin(env_cpu(0));
    gpu_setup(&g, graph);
    uint32_t v = 0;
    if (graph) {
        n = n / GRAPH_K ? n / GRAPH_K : 1;
        for (int i = 0; i < GRAPH_WARM; i++)
            CU(cuGraphLaunch, g.exec, g.stream);
    } else {
        for (; v < WARM; v++)
            gpu_launch(&g, v);
    }
    CU(cuStreamSynchronize, g.stream);

    long long t0 = now_ns();
    if (graph)
        for (uint64_t i = 0; i < n; i++)
            CU(cuGraphLaunch, g.exec, g.stream);
    else
        for (uint64_t i = 0; i < n; i++, v++)
            gpu_launch(&g, v);
    long long t1 = now_ns();
    CU(cuStreamSynchronize, g.stream);
    long long t2 = now_ns();

    res.n = n;
    res.loop_ns = t1 - t0;
    res.total_ns = t2 - t0;
    res.got = gpu_result(&g);
    res.want = graph ? GRAPH_K - 1 : v - 1;
    return report(&res);
}

static int run_ring(const char *self, const char *mode, uint64_t n, int rtt, int wkind) {
    struct prod p;
    struct result res = {.mode = mode, .worker = 1, .graph = wkind == W_GRAPH};
    pin(env_cpu(0));
    ring_start(&p, self, wkind);
    CUdeviceptr dptr = p.sh->dptr; /* a handle the worker made, as a served allocation's would be */
    void *kp[2] = {&dptr, &p.val};

    if (wkind == W_GRAPH) {
        n = n / GRAPH_K ? n / GRAPH_K : 1;
        for (int i = 0; i < GRAPH_WARM; i++)
            ring_simple(&p, REC_GRAPH);
    } else {
        for (int i = 0; i < WARM; i++, p.val++)
            ring_launch(&p, kp, &store_layout, 0);
    }
    ring_simple(&p, REC_SYNC | REC_ACK);
    ring_wait_done(&p);
    ring_simple(&p, REC_MARK);
    p.wakes = p.full = 0; /* the timed window's, as the worker's parks */

    long long t0 = now_ns();
    if (wkind == W_GRAPH) {
        for (uint64_t i = 0; i < n; i++)
            ring_simple(&p, REC_GRAPH);
    } else if (rtt) {
        for (uint64_t i = 0; i < n; i++, p.val++) {
            ring_launch(&p, kp, &store_layout, REC_ACK);
            ring_wait_done(&p);
        }
    } else {
        for (uint64_t i = 0; i < n; i++, p.val++)
            ring_launch(&p, kp, &store_layout, 0);
    }
    long long t1 = now_ns();
    ring_simple(&p, REC_SYNC | REC_ACK);
    ring_wait_done(&p);
    long long t2 = now_ns();

    ring_simple(&p, REC_EXIT | REC_ACK);
    ring_wait_done(&p);
    res.got = p.sh->result;
    res.worker_cpu_ns = p.sh->cpu_ns;
    res.parks = p.sh->parks;
    res.order_errors = p.sh->order_errors;
    ring_reap(&p);
    res.n = n;
    res.loop_ns = t1 - t0;
    res.total_ns = t2 - t0;
    res.wakes = p.wakes;
    res.full = p.full;
    res.worker_cpu_all_ms = (double)(p.ru.ru_utime.tv_sec + p.ru.ru_stime.tv_sec) * 1e3 +
                            (double)(p.ru.ru_utime.tv_usec + p.ru.ru_stime.tv_usec) / 1e3;
    res.want = wkind == W_GRAPH ? GRAPH_K - 1 : p.val - 1;
    return report(&res);
}

static void __attribute__((noreturn)) usage(void) {
    fprintf(stderr,
            "usage: ringbench direct|ring|ring-rtt|ring-nogpu|ring-rtt-nogpu|graph-direct|graph-ring [N]\n"
            "  N launches (default 200000; the graph modes make N/%d graph launches of %d kernels)\n"
            "  RINGBENCH_CPUS=P,W pins the producer to CPU P and the worker to CPU W\n",
            GRAPH_K, GRAPH_K);
    exit(2);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "worker") == 0) {
        g_worker = 1;
        return worker_main(atoi(argv[2]), atoi(argv[3]));
    }
    if (argc < 2 || argc > 3)
        usage();
    uint64_t n = 200000;
    if (argc == 3) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(argv[2], &end, 10);
        if (errno || *end || v == 0 || v > 4000000000ULL)
            usage();
        n = v;
    }
    const char *m = argv[1];
    if (strcmp(m, "direct") == 0)
        return run_direct(m, n, 0);
    if (strcmp(m, "graph-direct") == 0)
        return run_direct(m, n, 1);
    if (strcmp(m, "ring") == 0)
        return run_ring(argv[0], m, n, 0, W_GPU);
    if (strcmp(m, "ring-rtt") == 0)
        return run_ring(argv[0], m, n, 1, W_GPU);
    if (strcmp(m, "ring-nogpu") == 0)
        return run_ring(argv[0], m, n, 0, W_NOGPU);
    if (strcmp(m, "ring-rtt-nogpu") == 0)
        return run_ring(argv[0], m, n, 1, W_NOGPU);
    if (strcmp(m, "graph-ring") == 0)
        return run_ring(argv[0], m, n, 0, W_GRAPH);
    usage();
}

/*
 * heartbeat (test application "a"): plain device buffers, two streams.
 *
 * Holds --mib N MiB in --buffers K cuMemAlloc buffers of deliberately varied
 * sizes (gpuapp_split_sizes). Every iteration ITER:
 *
 *   host   waits for the previous iteration's stream-0 work (ev_mix), so the
 *          pageable pattern it copies from can be rewritten
 *   s1     waits for ev_mix (buffer 1 is read by the previous mix)
 *   s[i%2] app_hb_step on every buffer i                   (kernelParams)
 *   s1     cuMemsetD32Async: 1024 words in the middle of buffer 1
 *   s0     cuMemcpyHtoDAsync: 256 words of a host pattern into buffer 0
 *   s1     records ev_s1; s0 waits for it (cross-stream dependency)
 *   s0     app_hb_mix: buffer 0 ^= words of buffer 1 (stream 1's)  (cuLaunchKernelEx)
 *   s0     records ev_mix
 *
 * --still-mib N: N MiB more, written once at the start and only read afterwards
 * (as weights are): every iteration, s0 also runs app_hb_mix with buffer 0 as
 * dst and that memory as src, after the mix above. A concurrent checkpoint's
 * window need not save it ahead of that launch: the kernel reads it.
 *
 * --graph: at the start of every iteration, s0 also replays a CUDA graph
 * captured once (on a stream of its own): app_hb_step on every buffer with a
 * fixed iteration (GRAPH_ITER) and salt; s1 waits for it (ev_graph). As a
 * training step's graph, it rewrites every buffer each time.
 *
 * --attrs: driver state that the CUDA runtime sets, which a checkpoint must keep: s0 and s1 are made with
 * priorities (-3, and one past the greatest, which the driver clamps), app_hb_step may take 64 KiB of dynamic
 * shared memory (cuFuncSetAttribute) and every step launch asks for it, the context's malloc heap is 32 MiB
 * (cuCtxSetLimit), and a module global (hb_count) holds the last iteration. Every iteration checks them all,
 * and what the driver says of buffer 0 (cuPointerGetAttribute); a lost one ends the program with a line that
 * says which. The checksums are those of a run without --attrs.
 *
 * --moved-global (with --attrs): a module with a global of its own is loaded before hb_count's and unloaded after
 * it, leaving a hole that a worker which loads only the live modules (served mode's restore) fills with hb_count:
 * its count must come back there, reached both by its address looked up anew and by the one kept from the start.
 *
 * A heartbeat synchronizes both streams and checksums all buffers in order.
 * All arithmetic is on 32-bit unsigned integers, so the simulated driver and a
 * GPU compute the same bits.
 *
 * --workers W: W CPU worker processes forked after CUDA is initialised and the
 * buffers made, as PyTorch forks its DataLoader workers. They never touch the
 * GPU. Every iteration the parent sends each worker the iteration number and
 * worker w answers its running state s_w = mix32(s_w ^ iter), which starts at
 * (w + 1) * 0x9E3779B9 + seed; the host pattern word j is XORed with the
 * answer of worker j % W. So the checksums depend on every worker's memory,
 * and a worker that lost its state (or its process) shows.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpuapp.h"

/* The kernels: gpuapp_hb_ptx (common/hbptx.c). */

#define PATTERN_WORDS 256u /* host pattern copied into buffer 0 every iteration */
#define MEMSET_WORDS 1024u /* words of buffer 1 set every iteration */
#define MIX_WORDS 65536u   /* words of buffer 0 mixed with buffer 1 */

/* --attrs */
#define ATTRS_SHMEM 65536u       /* dynamic shared memory of each step launch: more than the default 48 KiB */
#define ATTRS_HEAP (32ull << 20) /* CU_LIMIT_MALLOC_HEAP_SIZE */
#define ATTRS_PRIO 8             /* s1 asks for the greatest priority less this: clamped to the greatest */
static const char attrs_ptx[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .global .align 4 .u32 hb_count;\n";
/* --moved-global: a module loaded before hb_count's and unloaded once that is loaded */
static const char hole_ptx[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .global .align 4 .u32 hb_hole[1024];\n";

typedef struct hb_state {
    gpuapp *app;
    unsigned k;
    uint64_t *sizes;
    CUdeviceptr *buf;
    CUstream s[2];
    CUevent ev_s1, ev_mix;
    CUdeviceptr still; /* --still-mib; 0 without */
    uint64_t still_size;
    CUgraphExec graph; /* --graph; NULL without */
    CUevent ev_graph;
    CUmodule mod;
    CUfunction f_init, f_step, f_mix;
    uint32_t *pattern; /* pageable host memory */
    unsigned nworkers;
    pid_t workers[16];
    int req[16], rep[16]; /* the parent's ends of each worker's pipes */
    uint32_t answer[16];
    /* --attrs */
    bool attrs;
    int prio[2];
    CUmodule attrs_mod;
    CUdeviceptr count; /* hb_count (--moved-global: looked up at each use, count_at) */
    bool moved_global; /* --moved-global */
    unsigned lookups;  /* --moved-global: count_at's calls */
    bool counted;      /* hb_count holds the previous iteration */
} hb_state;

static void full_io(int fd, void *buf, size_t n, bool wr) {
    for (size_t done = 0; done < n;) {
        ssize_t k = wr ? write(fd, (char *)buf + done, n - done) : read(fd, (char *)buf + done, n - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (!wr && k == 0 && done == 0)
                _exit(0); /* a worker whose parent is gone */
            gpuapp_die("worker pipe: %s", k < 0 ? strerror(errno) : "closed");
        }
        done += (size_t)k;
    }
}

/* A worker: answers every iteration number with its new state. */
static void worker_main(int rq, int rp, uint32_t state) {
    for (;;) {
        uint32_t iter;
        full_io(rq, &iter, sizeof iter, false);
        state = gpuapp_mix32(state ^ iter);
        full_io(rp, &state, sizeof state, true);
    }
}

static void start_workers(hb_state *st, uint32_t seed) {
    for (unsigned w = 0; w < st->nworkers; w++) {
        int q[2], r[2];
        if (pipe(q) < 0 || pipe(r) < 0)
            gpuapp_die("pipe: %s", strerror(errno));
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0)
            gpuapp_die("fork: %s", strerror(errno));
        if (pid == 0) {
            close(q[1]);
            close(r[0]);
            for (unsigned v = 0; v < w; v++) {
                close(st->req[v]);
                close(st->rep[v]);
            }
            worker_main(q[0], r[1], (w + 1) * 0x9E3779B9u + seed);
        }
        close(q[0]);
        close(r[1]);
        st->workers[w] = pid;
        st->req[w] = q[1];
        st->rep[w] = r[0];
    }
}

static void stop_workers(hb_state *st) {
    for (unsigned w = 0; w < st->nworkers; w++) {
        close(st->req[w]);
        close(st->rep[w]);
        waitpid(st->workers[w], NULL, 0);
    }
}

static uint32_t salt_of(unsigned i) { return (i + 1) * 0x27D4EB2Fu; }

#define GRAPH_ITER 0xC0FFEEu

/* --graph: app_hb_step on every buffer, captured once on a stream of its own. */
static void capture_graph(hb_state *st) {
    CUstream cs;
    CUgraph g;
    CHECK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamBeginCapture_v2(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (unsigned i = 0; i < st->k; i++) {
        CUdeviceptr b = st->buf[i];
        uint32_t n = (uint32_t)(st->sizes[i] / 4), it = GRAPH_ITER, salt = ~salt_of(i);
        void *args[] = {&b, &n, &it, &salt};
        CHECK(cuLaunchKernel(st->f_step, gpuapp_grid(n), 1, 1, GPUAPP_BLOCK, 1, 1, 0, cs, args, NULL));
    }
    CHECK(cuStreamEndCapture(cs, &g));
    CHECK(cuGraphInstantiateWithFlags(&st->graph, g, 0));
    CHECK(cuGraphDestroy(g));
    CHECK(cuStreamDestroy(cs));
    CHECK(cuEventCreate(&st->ev_graph, CU_EVENT_DISABLE_TIMING));
}

/* --attrs: hb_count's address. With --moved-global, every other use asks for it again, as a program that copies
 * to a symbol by name does, and the others use the address found at the start, as a program that kept it does:
 * after a restore that placed hb_count elsewhere both must reach it. */
static CUdeviceptr count_at(hb_state *st) {
    if (st->moved_global && (st->lookups++ & 1)) {
        CUdeviceptr now = 0;
        size_t bytes = 0;
        CHECK(cuModuleGetGlobal(&now, &bytes, st->attrs_mod, "hb_count"));
        return now;
    }
    return st->count;
}

/* --attrs: what was set is what the driver says now (after a restore too). */
static void check_attrs(hb_state *st, uint32_t iter) {
    for (int i = 0; i < 2; i++) {
        int prio = 1;
        CHECK(cuStreamGetPriority(st->s[i], &prio));
        if (prio != st->prio[i])
            gpuapp_die("--attrs: iteration %u: stream s%d has priority %d, not %d", iter, i, prio, st->prio[i]);
    }
    unsigned flags = 0;
    CHECK(cuStreamGetFlags(st->s[1], &flags));
    if (flags != CU_STREAM_NON_BLOCKING)
        gpuapp_die("--attrs: iteration %u: stream s1 has flags %u", iter, flags);
    int shmem = 0;
    CHECK(cuFuncGetAttribute(&shmem, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, st->f_step));
    if (shmem != (int)ATTRS_SHMEM)
        gpuapp_die("--attrs: iteration %u: app_hb_step allows %d bytes of dynamic shared memory", iter, shmem);
    size_t heap = 0;
    CHECK(cuCtxGetLimit(&heap, CU_LIMIT_MALLOC_HEAP_SIZE));
    if (heap != ATTRS_HEAP)
        gpuapp_die("--attrs: iteration %u: the malloc heap limit is %zu", iter, heap);
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    CHECK(cuStreamIsCapturing(st->s[0], &cs));
    if (cs != CU_STREAM_CAPTURE_STATUS_NONE)
        gpuapp_die("--attrs: iteration %u: stream s0 captures (%d)", iter, (int)cs);
    /* Buffer 0 is device memory of the process's context: its own, or none (the memory of a pool or of the
     * virtual memory API belongs to no context), never another. */
    CUcontext ctx = NULL;
    unsigned type = 0;
    int ordinal = -1;
    CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[] = {&ctx, &type, &ordinal};
    CHECK(cuPointerGetAttributes(3, which, data, st->buf[0]));
    if ((ctx && ctx != st->app->ctx) || type != CU_MEMORYTYPE_DEVICE || ordinal != st->app->dev)
        gpuapp_die("--attrs: iteration %u: buffer 0: context %p (the process's: %p), memory type %u, device %d", iter,
                   (void *)ctx, (void *)st->app->ctx, type, ordinal);
    CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, count_at(st)));
    if (type != CU_MEMORYTYPE_DEVICE)
        gpuapp_die("--attrs: iteration %u: hb_count's memory type is %u", iter, type);
    /* hb_count: the previous iteration's, written on s0, which ev_mix covers */
    uint32_t count = 0;
    CHECK(cuMemcpyDtoH(&count, count_at(st), sizeof count));
    if (st->counted && count != iter - 1)
        gpuapp_die("--attrs: iteration %u: hb_count holds %u, not %u", iter, count, iter - 1);
}

/* --attrs: the state, set. */
static void set_attrs(hb_state *st) {
    int least = 0, greatest = 0;
    CHECK(cuCtxGetStreamPriorityRange(&least, &greatest));
    st->prio[0] = -3 < greatest ? greatest : -3;
    st->prio[1] = greatest;
    CHECK(cuStreamCreateWithPriority(&st->s[0], CU_STREAM_DEFAULT, st->prio[0]));
    CHECK(cuStreamCreateWithPriority(&st->s[1], CU_STREAM_NON_BLOCKING, greatest - ATTRS_PRIO));
    CHECK(cuFuncSetAttribute(st->f_step, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)ATTRS_SHMEM));
    CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, ATTRS_HEAP));
    /* --moved-global: the hole's global takes device memory first, and is gone once hb_count's module has its
     * own: a worker that loads the live modules alone (a restore's) puts hb_count where the hole was. */
    CUmodule hole = st->moved_global ? gpuapp_load_ptx(hole_ptx) : NULL;
    CUdeviceptr hole_at = 0;
    size_t bytes = 0;
    if (hole)
        CHECK(cuModuleGetGlobal(&hole_at, &bytes, hole, "hb_hole"));
    st->attrs_mod = gpuapp_load_ptx(attrs_ptx);
    CHECK(cuModuleGetGlobal(&st->count, &bytes, st->attrs_mod, "hb_count"));
    if (bytes != 4)
        gpuapp_die("--attrs: hb_count has %zu bytes", bytes);
    if (hole)
        CHECK(cuModuleUnload(hole));
}

static void step(void *p, uint32_t iter) {
    hb_state *st = p;
    CUstream s0 = st->s[0], s1 = st->s[1];

    /*
     * The previous iteration's stream-0 work (its HtoD copy included) is done:
     * the pattern can be rewritten, and at most one iteration is in flight.
     */
    CHECK(cuEventSynchronize(st->ev_mix));
    if (st->attrs)
        check_attrs(st, iter);
    for (unsigned w = 0; w < st->nworkers; w++)
        full_io(st->req[w], &iter, sizeof iter, true);
    for (unsigned w = 0; w < st->nworkers; w++)
        full_io(st->rep[w], &st->answer[w], sizeof st->answer[w], false);
    for (uint32_t j = 0; j < PATTERN_WORDS; j++)
        st->pattern[j] = gpuapp_mix32(iter * 0x9E3779B1u + j) ^ (st->nworkers ? st->answer[j % st->nworkers] : 0);

    /* Buffer 1 was read by the previous mix on s0: s1 must not write it before. */
    CHECK(cuStreamWaitEvent(s1, st->ev_mix, 0));
    if (st->graph) {
        CHECK(cuGraphLaunch(st->graph, s0));
        CHECK(cuEventRecord(st->ev_graph, s0));
        CHECK(cuStreamWaitEvent(s1, st->ev_graph, 0));
    }

    for (unsigned i = 0; i < st->k; i++) {
        CUdeviceptr b = st->buf[i];
        uint32_t n = (uint32_t)(st->sizes[i] / 4);
        uint32_t it = iter, salt = salt_of(i);
        void *args[] = {&b, &n, &it, &salt};
        CHECK(cuLaunchKernel(st->f_step, gpuapp_grid(n), 1, 1, GPUAPP_BLOCK, 1, 1, st->attrs ? ATTRS_SHMEM : 0,
                             st->s[i % 2], args, NULL));
    }

    uint64_t n0 = st->sizes[0] / 4, n1 = st->sizes[1] / 4;
    CHECK(cuMemsetD32Async(st->buf[1] + (n1 / 2) * 4, iter * 0x01000193u ^ 0xA5A5A5A5u, MEMSET_WORDS, s1));
    CHECK(cuMemcpyHtoDAsync(st->buf[0] + (n0 / 3) * 4, st->pattern, PATTERN_WORDS * 4, s0));

    /* Cross-stream dependency: the mix on s0 reads buffer 1, written on s1. */
    CHECK(cuEventRecord(st->ev_s1, s1));
    CHECK(cuStreamWaitEvent(s0, st->ev_s1, 0));

    CUdeviceptr dst = st->buf[0], src = st->buf[1];
    uint32_t count = n0 < MIX_WORDS ? (uint32_t)n0 : MIX_WORDS, nsrc = (uint32_t)n1, it = iter;
    void *args[] = {&dst, &src, &count, &nsrc, &it};
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.gridDimX = gpuapp_grid(count);
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = GPUAPP_BLOCK;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.sharedMemBytes = 0;
    cfg.hStream = s0;
    cfg.attrs = NULL;
    cfg.numAttrs = 0;
    CHECK(cuLaunchKernelEx(&cfg, st->f_mix, args, NULL));
    if (st->still) {
        CUdeviceptr still = st->still;
        uint32_t nstill = (uint32_t)(st->still_size / 4);
        void *sargs[] = {&dst, &still, &count, &nstill, &it};
        CHECK(cuLaunchKernel(st->f_mix, gpuapp_grid(count), 1, 1, GPUAPP_BLOCK, 1, 1, 0, s0, sargs, NULL));
    }
    if (st->attrs) {
        CHECK(cuMemsetD32Async(count_at(st), iter, 1, s0));
        st->counted = true;
    }
    CHECK(cuEventRecord(st->ev_mix, s0));
}

static uint64_t checksum(void *p) {
    hb_state *st = p;
    CHECK(cuStreamSynchronize(st->s[0]));
    CHECK(cuStreamSynchronize(st->s[1]));
    uint64_t h = GPUAPP_SUM_BASIS;
    for (unsigned i = 0; i < st->k; i++)
        h = gpuapp_sum_device(h, i, st->buf[i], st->sizes[i]);
    if (st->still)
        h = gpuapp_sum_device(h, st->k, st->still, st->still_size);
    return h;
}

int main(int argc, char **argv) {
    gpuapp app;
    hb_state st;
    gpuapp_parse(&app, "heartbeat",
                 GPUAPP_OPT_MIB | GPUAPP_OPT_BUFFERS | GPUAPP_OPT_WORKERS | GPUAPP_OPT_GRAPH | GPUAPP_OPT_STILL |
                     GPUAPP_OPT_ATTRS | GPUAPP_OPT_MOVED_GLOBAL,
                 64, 8, argc, argv);
    memset(&st, 0, sizeof(st));
    st.app = &app;
    st.k = app.buffers;
    st.sizes = calloc(st.k, sizeof(*st.sizes));
    st.buf = calloc(st.k, sizeof(*st.buf));
    st.pattern = calloc(PATTERN_WORDS, sizeof(uint32_t));
    if (!st.sizes || !st.buf || !st.pattern)
        gpuapp_die("out of host memory");
    /* Each buffer must hold the memset and pattern regions (at n/2 and n/3). */
    gpuapp_split_sizes((uint64_t)app.mib << 20, st.k, 4 * 4 * MEMSET_WORDS, st.sizes);

    gpuapp_context(&app);
    st.mod = gpuapp_load_ptx(gpuapp_hb_ptx);
    st.f_init = gpuapp_function(st.mod, "app_hb_init");
    st.f_step = gpuapp_function(st.mod, "app_hb_step");
    st.f_mix = gpuapp_function(st.mod, "app_hb_mix");
    /* One blocking and one non-blocking stream: both kinds get exercised. */
    st.attrs = app.attrs;
    st.moved_global = app.moved_global;
    if (st.moved_global && !st.attrs)
        gpuapp_die("--moved-global needs --attrs");
    if (st.attrs) {
        set_attrs(&st);
    } else {
        CHECK(cuStreamCreate(&st.s[0], CU_STREAM_DEFAULT));
        CHECK(cuStreamCreate(&st.s[1], CU_STREAM_NON_BLOCKING));
    }
    CHECK(cuEventCreate(&st.ev_s1, CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&st.ev_mix, CU_EVENT_DISABLE_TIMING));

    for (unsigned i = 0; i < st.k; i++) {
        CHECK(cuMemAlloc(&st.buf[i], st.sizes[i]));
        CUdeviceptr b = st.buf[i];
        uint32_t n = (uint32_t)(st.sizes[i] / 4), seed = app.seed + i * 0x9E3779B9u;
        void *args[] = {&b, &n, &seed};
        CHECK(cuLaunchKernel(st.f_init, gpuapp_grid(n), 1, 1, GPUAPP_BLOCK, 1, 1, 0, st.s[i % 2], args, NULL));
    }
    if (app.still_mib) {
        st.still_size = (uint64_t)app.still_mib << 20;
        CHECK(cuMemAlloc(&st.still, st.still_size));
        CUdeviceptr b = st.still;
        uint32_t n = (uint32_t)(st.still_size / 4), seed = ~app.seed;
        void *args[] = {&b, &n, &seed};
        CHECK(cuLaunchKernel(st.f_init, gpuapp_grid(n), 1, 1, GPUAPP_BLOCK, 1, 1, 0, st.s[0], args, NULL));
    }
    CHECK(cuEventRecord(st.ev_mix, st.s[0]));
    CHECK(cuCtxSynchronize());
    if (app.graph)
        capture_graph(&st);
    st.nworkers = app.workers;
    start_workers(&st, app.seed);

    gpuapp_ready(&app, app.mib + app.still_mib, st.k);
    gpuapp_loop(&app, &st, step, checksum);
    stop_workers(&st);

    CHECK(cuCtxSynchronize());
    for (unsigned i = 0; i < st.k; i++)
        CHECK(cuMemFree(st.buf[i]));
    if (st.still)
        CHECK(cuMemFree(st.still));
    if (st.graph) {
        CHECK(cuGraphExecDestroy(st.graph));
        CHECK(cuEventDestroy(st.ev_graph));
    }
    CHECK(cuEventDestroy(st.ev_s1));
    CHECK(cuEventDestroy(st.ev_mix));
    CHECK(cuStreamDestroy(st.s[0]));
    CHECK(cuStreamDestroy(st.s[1]));
    CHECK(cuModuleUnload(st.mod));
    if (st.attrs_mod)
        CHECK(cuModuleUnload(st.attrs_mod));
    gpuapp_context_release(&app);
    free(st.sizes);
    free(st.buf);
    free(st.pattern);
    return 0;
}

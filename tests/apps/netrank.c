/*
 * netrank: one rank of a two-rank job whose ranks meet over TCP, the way
 * NCCL's network transport joins ranks on different hosts: the rank's
 * collective kernel hands its data to a proxy thread through host memory
 * and spins on the GPU until the proxy has brought the peer's data back.
 * The two ranks share no memory; they wait for each other all the same.
 *
 *   netrank --rank R --addr A --port P [--lag-ms L] [--xwords X] [--graph] [gpuapp options]
 *
 * Rank 0 listens on A:P (and closes its listener once rank 1 is in), rank 1
 * connects to it. Each holds --mib N MiB of device memory (buf, cuMemAlloc,
 * filled from a seed of the rank), two boxes of pinned host memory (out and
 * in: a u32 flag, then X words; cuMemHostAlloc, reached from the kernel by
 * its unified address) and a proxy thread. Iteration ITER:
 *
 *   kernel  ncclDevKernel_netrank_SendRecv, a C++ name as NCCL's kernels
 *           have, so mangled as the driver gives theirs
 *           (_Z30ncclDevKernel_netrank_SendRecvyjPjyyj): gpucr counts it as
 *           an operation that waits for a peer:
 *           steps every word of buf (k = ITER * 0x9E3779B1;
 *           v = (buf[j] ^ k) * 0x01000193; v ^= v >> 13; buf[j] = v + ((j << 3) ^ k)),
 *           copies buf[0..X) to out, sets out's flag to ITER, spins until
 *           in's flag is ITER, then buf[j] ^= in[(j + ITER) % X] for j < X
 *   proxy   waits for out's flag to be ITER, sends out's X words, reads the
 *           peer's X words into in, sets in's flag to ITER
 *   host    cuStreamSynchronize (as a training loop reads its loss), then,
 *           with --lag-ms L, sleeps L ms: a rank that is slow to launch its
 *           next collective while its peer's waits on the GPU
 *
 * The kernel reads ITER from pinned host memory the host writes before each
 * launch. With --graph, the launch is captured once into a CUDA graph, which
 * each iteration launches: NCCL's launches as a framework replays them.
 *
 * so a rank's checksum after ITER depends on both ranks' whole history, and
 * a lost, repeated or reordered exchange shows in the heartbeats (gpuapp.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gpuapp.h"

#define BOX_DATA 16 /* bytes before a box's words: its flag, padded */

/* The kernel on a GPU: one thread does it all (the simulated driver's is in tests/sim/kernels/apps.c). */
static const char ptx[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry _Z30ncclDevKernel_netrank_SendRecvyjPjyyj(\n"
    "\t.param .u64 nr_param_0,\n"
    "\t.param .u32 nr_param_1,\n"
    "\t.param .u64 nr_param_2,\n"
    "\t.param .u64 nr_param_3,\n"
    "\t.param .u64 nr_param_4,\n"
    "\t.param .u32 nr_param_5\n"
    ")\n"
    "{\n"
    "\t.reg .pred %p<3>;\n"
    "\t.reg .b32 %r<16>;\n"
    "\t.reg .b64 %rd<16>;\n"
    "\n"
    "\tld.param.u64 %rd1, [nr_param_0];\n"
    "\tld.param.u32 %r1, [nr_param_1];\n"
    "\tld.param.u64 %rd11, [nr_param_2];\n"
    "\tld.volatile.global.u32 %r2, [%rd11];\n"
    "\tld.param.u64 %rd2, [nr_param_3];\n"
    "\tld.param.u64 %rd3, [nr_param_4];\n"
    "\tld.param.u32 %r3, [nr_param_5];\n"
    "\tmul.lo.u32 %r4, %r2, 0x9E3779B1;\n"
    "\tmov.u32 %r5, 0;\n"
    "\tsetp.ge.u32 %p1, %r5, %r1;\n"
    "\t@%p1 bra $NR_stepped;\n"
    "$NR_step:\n"
    "\tmul.wide.u32 %rd4, %r5, 4;\n"
    "\tadd.s64 %rd5, %rd1, %rd4;\n"
    "\tld.global.u32 %r6, [%rd5];\n"
    "\txor.b32 %r6, %r6, %r4;\n"
    "\tmul.lo.u32 %r6, %r6, 0x01000193;\n"
    "\tshr.u32 %r7, %r6, 13;\n"
    "\txor.b32 %r6, %r6, %r7;\n"
    "\tshl.b32 %r8, %r5, 3;\n"
    "\txor.b32 %r8, %r8, %r4;\n"
    "\tadd.u32 %r6, %r6, %r8;\n"
    "\tst.global.u32 [%rd5], %r6;\n"
    "\tsetp.ge.u32 %p2, %r5, %r3;\n"
    "\t@%p2 bra $NR_next;\n"
    "\tadd.s64 %rd6, %rd2, 16;\n"
    "\tadd.s64 %rd6, %rd6, %rd4;\n"
    "\tst.global.u32 [%rd6], %r6;\n"
    "$NR_next:\n"
    "\tadd.u32 %r5, %r5, 1;\n"
    "\tsetp.lt.u32 %p1, %r5, %r1;\n"
    "\t@%p1 bra $NR_step;\n"
    "$NR_stepped:\n"
    "\tmembar.sys;\n"
    "\tst.volatile.global.u32 [%rd2], %r2;\n"
    "$NR_wait:\n"
    "\tld.volatile.global.u32 %r9, [%rd3];\n"
    "\tsetp.lt.u32 %p1, %r9, %r2;\n"
    "\t@%p1 bra $NR_wait;\n"
    "\tmembar.sys;\n"
    "\tmov.u32 %r5, 0;\n"
    "\tsetp.ge.u32 %p1, %r5, %r3;\n"
    "\t@%p1 bra $NR_done;\n"
    "$NR_mix:\n"
    "\tadd.u32 %r10, %r5, %r2;\n"
    "\trem.u32 %r10, %r10, %r3;\n"
    "\tmul.wide.u32 %rd7, %r10, 4;\n"
    "\tadd.s64 %rd8, %rd3, 16;\n"
    "\tadd.s64 %rd8, %rd8, %rd7;\n"
    "\tld.volatile.global.u32 %r11, [%rd8];\n"
    "\tmul.wide.u32 %rd9, %r5, 4;\n"
    "\tadd.s64 %rd10, %rd1, %rd9;\n"
    "\tld.global.u32 %r12, [%rd10];\n"
    "\txor.b32 %r12, %r12, %r11;\n"
    "\tst.global.u32 [%rd10], %r12;\n"
    "\tadd.u32 %r5, %r5, 1;\n"
    "\tsetp.lt.u32 %p1, %r5, %r3;\n"
    "\t@%p1 bra $NR_mix;\n"
    "$NR_done:\n"
    "\tret;\n"
    "}\n";

typedef struct {
    gpuapp a;
    CUfunction fn;
    CUstream s;
    CUdeviceptr buf;
    uint32_t words, xwords;
    unsigned char *out, *in; /* the boxes */
    int fd;                  /* the connection to the peer */
    unsigned lag_ms;
    int graph;        /* --graph: the step captured into a CUDA graph, launched each iteration */
    CUgraphExec exec; /* that graph */
    uint32_t *iter;   /* pinned: the iteration, which the kernel reads */
} netrank;

static _Atomic uint32_t *flag(unsigned char *box) { return (_Atomic uint32_t *)(void *)box; }

static void xfer(int fd, void *p, size_t n, int out) {
    char *c = p;
    while (n) {
        ssize_t k = out ? write(fd, c, n) : read(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            gpuapp_die("the connection to the peer: %s", k == 0 ? "closed" : strerror(errno));
        c += k;
        n -= (size_t)k;
    }
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000L, (us % 1000000L) * 1000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* The proxy: NCCL's proxy thread for the network transport, one exchange an iteration. */
static void *proxy(void *arg) {
    netrank *r = arg;
    size_t bytes = (size_t)r->xwords * 4;
    for (uint32_t it = 1;; it++) {
        while (atomic_load_explicit(flag(r->out), memory_order_acquire) < it)
            sleep_us(100);
        xfer(r->fd, r->out + BOX_DATA, bytes, 1);
        xfer(r->fd, r->in + BOX_DATA, bytes, 0);
        atomic_store_explicit(flag(r->in), it, memory_order_release);
    }
    return NULL;
}

static void step(void *state, uint32_t iter) {
    netrank *r = state;
    uint64_t out = (uint64_t)(uintptr_t)r->out, in = (uint64_t)(uintptr_t)r->in, it = (uint64_t)(uintptr_t)r->iter;
    void *params[] = {&r->buf, &r->words, &it, &out, &in, &r->xwords};
    *r->iter = iter; /* the kernel reads it there: a graph replays the same parameters */
    if (r->graph) {
        /* captured once into a graph, which each iteration launches: as a framework replays NCCL's launches */
        if (!r->exec) {
            CUgraph g;
            CHECK(cuStreamBeginCapture_v2(r->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
            CHECK(cuLaunchKernel(r->fn, 1, 1, 1, 1, 1, 1, 0, r->s, params, NULL));
            CHECK(cuStreamEndCapture(r->s, &g));
            CHECK(cuGraphInstantiateWithFlags(&r->exec, g, 0));
            CHECK(cuGraphDestroy(g));
        }
        CHECK(cuGraphLaunch(r->exec, r->s));
        CHECK(cuStreamSynchronize(r->s));
    } else {
        CHECK(cuLaunchKernel(r->fn, 1, 1, 1, 1, 1, 1, 0, r->s, params, NULL));
        CHECK(cuStreamSynchronize(r->s));
    }
    if (r->lag_ms)
        sleep_us((long)r->lag_ms * 1000L);
}

static uint64_t checksum(void *state) {
    netrank *r = state;
    CHECK(cuStreamSynchronize(r->s));
    return gpuapp_sum_device(GPUAPP_SUM_BASIS, 0, r->buf, (size_t)r->words * 4);
}

static int connect_peer(int rank, const char *addr, int port) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        gpuapp_die("--addr %s is no IPv4 address", addr);
    int fd;
    if (rank == 0) {
        int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
        if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
            bind(l, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(l, 1) < 0)
            gpuapp_die("listening on %s:%d: %s", addr, port, strerror(errno));
        fd = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            gpuapp_die("accept: %s", strerror(errno));
        close(l);
    } else {
        for (int i = 0;; i++) {
            fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0)
                gpuapp_die("socket: %s", strerror(errno));
            if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
                break;
            if (i == 600)
                gpuapp_die("connecting to %s:%d: %s", addr, port, strerror(errno));
            close(fd);
            sleep_us(50000);
        }
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int main(int argc, char **argv) {
    static netrank r;
    int rank = -1, port = 0;
    const char *addr = NULL;
    r.xwords = 4096;
    /* this application's options first; the rest are gpuapp's */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0;
    if (!rest)
        gpuapp_die("out of memory");
    rest[nrest++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--rank") == 0)
            rank = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--addr") == 0)
            addr = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--port") == 0)
            port = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--lag-ms") == 0)
            r.lag_ms = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--xwords") == 0)
            r.xwords = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--graph") == 0)
            r.graph = 1;
        else
            rest[nrest++] = argv[i];
    }
    if ((rank != 0 && rank != 1) || !addr || port <= 0 || r.xwords == 0) {
        fprintf(stderr,
                "usage: netrank --rank 0|1 --addr A --port P [--lag-ms L] [--xwords X] [--graph] [gpuapp options]\n");
        return 2;
    }
    gpuapp_parse(&r.a, "netrank", GPUAPP_OPT_MIB, 4, 1, nrest, rest);
    r.words = (uint32_t)(((uint64_t)r.a.mib << 20) / 4);
    if (r.xwords > r.words)
        gpuapp_die("--xwords %u is more than the %u words of --mib %u", r.xwords, r.words, r.a.mib);
    r.fd = connect_peer(rank, addr, port);

    gpuapp_context(&r.a);
    CUmodule mod = gpuapp_load_ptx(ptx);
    r.fn = gpuapp_function(mod, "_Z30ncclDevKernel_netrank_SendRecvyjPjyyj");
    CHECK(cuStreamCreate(&r.s, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAlloc(&r.buf, (size_t)r.words * 4));
    CHECK(cuMemsetD32(r.buf, 0x5bd1e995u * (uint32_t)(rank + 1) + r.a.seed, r.words));
    void *out, *in;
    size_t box = BOX_DATA + (size_t)r.xwords * 4;
    CHECK(cuMemHostAlloc(&out, box, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    CHECK(cuMemHostAlloc(&in, box, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    memset(out, 0, box);
    memset(in, 0, box);
    void *itbox;
    CHECK(cuMemHostAlloc(&itbox, 64, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    r.iter = itbox;
    r.out = out;
    r.in = in;
    pthread_t t;
    if (pthread_create(&t, NULL, proxy, &r) != 0)
        gpuapp_die("pthread_create failed");
    gpuapp_ready(&r.a, r.a.mib, 1);
    gpuapp_loop(&r.a, &r, step, checksum);
    return 0;
}

/*
 * peerapp: processes (ranks, --ranks N, default 2) that share memory the way
 * NCCL does between the ranks of one host, driver API only.
 *
 * Rank 0 is the process started; it starts ranks 1..N-1 as copies of itself
 * (fork + exec, environment inherited, so under `gpucr run` all are
 * interposed, as torchrun's ranks are), each on the next device in turn
 * (device 0 again past the last). The ranks form a ring: rank r's next is
 * rank (r+1) % N, its previous rank (r-1) % N; with 2 ranks each is the
 * other's next and previous. Each rank owns
 *   D  its send buffer: cuMemCreate on its device, POSIX-fd shareable,
 *      GPUDirect RDMA capable where the device supports it (NCCL's
 *      ncclCuMemAlloc), access for its device and its next's;
 *   H  a flag page: cuMemCreate of host memory (location HOST_NUMA, the
 *      device's host node), POSIX-fd shareable, access for its device and the
 *      CPU (NCCL's host buffers for its proxy and shared-memory transport);
 *   R  its receive buffer, cuMemAlloc.
 * At start each rank sends rank 0 the values of its D and H handles, and
 * gets those of its next; it asks the next's proxy thread, over a unix
 * socket, to export that handle as a POSIX fd (SCM_RIGHTS), imports it,
 * maps it and sets access for its own device: NCCL's cuMem P2P path, whose
 * handle values travel between the processes and come back to the owner
 * (proxyGetFd).
 *
 * Iteration ITER, on one stream of each rank r (next n):
 *   wait   H_r[1] >= ITER-1      (cuStreamWaitValue32: r's previous copied the last one)
 *   memset 16 Ki words of D_r, at a slice that moves with ITER, to a value of (ITER, r)
 *   write  H_r[0] = ITER         (cuStreamWriteValue32: ready)
 *   wait   H_n[0] >= ITER        (n's data for this iteration)
 *   copy   D_n -> R_r            (cuMemcpyDtoDAsync, through the peer mapping)
 *   write  H_n[1] = ITER         (ack)
 * so the ranks run in lockstep and every byte is fixed by ITER. D starts with
 * a tag (rank, offset) at every MiB, so that no two chunks are alike. Rank 0 prints
 * the heartbeats (tests/apps/common/gpuapp.h), the checksum over D_0 and R_0
 * (R_0 is rank 1's D); the other ranks' standard output is discarded. All run
 * --iters iterations; rank 0 exits with a rank's failure if one failed.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpuapp.h"

/* A started rank's ends of the sockets, fixed by rank 0 before the exec. */
enum { FD_CTL = 3, FD_ASK = 4, FD_SERVE = 5 };
#define WORDS_PER_ITER 16384u
#define MAX_RANKS 8

typedef struct {
    gpuapp a;
    int rank, nranks, peer_dev, numa;
    size_t dsize, hsize;
    CUmemGenericAllocationHandle d, h, pd, ph; /* ours, and our imports of the next rank's */
    CUdeviceptr dva, hva, pdva, phva, recv;
    volatile uint32_t *flags, *pflags; /* H_r, H_n as the CPU sees them */
    CUstream s;
    /* ctl: rank 0's connection to rank k (ctl[k]), or a rank's to rank 0 (ctl[0]); ask: our requests to the
     * next rank's proxy; serve: the previous rank's requests to ours */
    int ctl[MAX_RANKS], ask, serve;
    pid_t child[MAX_RANKS];
} peer;

static void send_fd(int sock, int fd, int32_t status) {
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {&status, sizeof status};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        m.msg_control = cbuf;
        m.msg_controllen = sizeof cbuf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    if (sendmsg(sock, &m, MSG_NOSIGNAL) != (ssize_t)sizeof status)
        gpuapp_die("sendmsg: %s", strerror(errno));
}

/* An fd and the owner's status (a CUresult); -1 and the status when it sent none. */
static int recv_fd(int sock, int32_t *status) {
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {status, sizeof *status};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    if (recvmsg(sock, &m, MSG_CMSG_CLOEXEC) != (ssize_t)sizeof *status)
        gpuapp_die("recvmsg: %s", strerror(errno));
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    int fd = -1;
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
        memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

static void xwrite(int fd, const void *p, size_t n) {
    if (write(fd, p, n) != (ssize_t)n)
        gpuapp_die("write to the peer: %s", errno ? strerror(errno) : "short");
}

static void xread(int fd, void *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)p + got, n - got);
        if (k <= 0)
            gpuapp_die("read from the peer: %s", k ? strerror(errno) : "it hung up");
        got += (size_t)k;
    }
}

/* The proxy thread: the previous rank names one of our handles by its value; we export it (NCCL's proxyGetFd). */
static void *proxy(void *arg) {
    peer *P = arg;
    CUmemGenericAllocationHandle h;
    for (;;) {
        ssize_t k = read(P->serve, &h, sizeof h);
        if (k != (ssize_t)sizeof h)
            return NULL; /* the peer is done */
        int fd = -1;
        CUresult r = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (r != CUDA_SUCCESS)
            fprintf(stderr, "peerapp rank %d: cuMemExportToShareableHandle(0x%llx): %s\n", P->rank,
                    (unsigned long long)h, gpuapp_err_name(r));
        send_fd(P->serve, r == CUDA_SUCCESS ? fd : -1, (int32_t)r);
        if (fd >= 0)
            close(fd);
    }
}

/* The next rank's allocation named by handle value h: asked for as an fd, imported, mapped, accessible to our
 * device. */
static void import_peer(peer *P, CUmemGenericAllocationHandle h, size_t size, bool host,
                        CUmemGenericAllocationHandle *out, CUdeviceptr *va) {
    xwrite(P->ask, &h, sizeof h);
    int32_t status = 0;
    int fd = recv_fd(P->ask, &status);
    if (fd < 0)
        gpuapp_die("rank %d: the next rank could not export its allocation 0x%llx: %s", P->rank, (unsigned long long)h,
                   gpuapp_err_name((CUresult)status));
    CHECK(cuMemImportFromShareableHandle(out, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CHECK(cuMemAddressReserve(va, size, 0, 0, 0));
    CHECK(cuMemMap(*va, size, 0, *out, 0));
    CUmemAccessDesc d[2] = {
        {.location = {CU_MEM_LOCATION_TYPE_DEVICE, P->a.ordinal}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
        {.location = {CU_MEM_LOCATION_TYPE_HOST_NUMA, P->numa}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
    };
    CHECK(cuMemSetAccess(*va, size, d, host ? 2 : 1));
}

/* Every rank reaches this point before any goes on: rank 0 hears from every other rank, then answers each. */
static void barrier(peer *P) {
    char ok = 1;
    if (P->rank) {
        xwrite(P->ctl[0], &ok, 1);
        xread(P->ctl[0], &ok, 1);
        return;
    }
    for (int k = 1; k < P->nranks; k++)
        xread(P->ctl[k], &ok, 1);
    for (int k = 1; k < P->nranks; k++)
        xwrite(P->ctl[k], &ok, 1);
}

/* Our handle values and size to rank 0; back, the next rank's. Rank 0 gathers them all and hands each rank its
 * next's. */
static void exchange(peer *P, const uint64_t mine[3], uint64_t next[3]) {
    if (P->rank) {
        xwrite(P->ctl[0], mine, 3 * sizeof *mine);
        xread(P->ctl[0], next, 3 * sizeof *next);
        return;
    }
    uint64_t all[MAX_RANKS][3];
    memcpy(all[0], mine, sizeof all[0]);
    for (int k = 1; k < P->nranks; k++)
        xread(P->ctl[k], all[k], sizeof all[k]);
    for (int k = 1; k < P->nranks; k++)
        xwrite(P->ctl[k], all[(k + 1) % P->nranks], sizeof all[k]);
    memcpy(next, all[1], sizeof all[1]);
}

static void setup(peer *P) {
    int n = 0;
    CHECK(cuInit(0));
    CHECK(cuDeviceGetCount(&n));
    P->a.ordinal = (P->a.ordinal + P->rank) % n;
    P->peer_dev = (P->a.ordinal + 1) % n;
    gpuapp_context(&P->a);
    CHECK(cuDeviceGetAttribute(&P->numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, P->a.dev));
    if (P->numa < 0)
        P->numa = 0;
    int rdma = 0;
    CHECK(cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, P->a.dev));

    /* D: device memory, accessible to our device and the peer's (NCCL's allocator does this for its peers) */
    CUmemAllocationProp dp = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                              .location = {CU_MEM_LOCATION_TYPE_DEVICE, P->a.ordinal}};
    dp.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
    size_t g = 0;
    CHECK(cuMemGetAllocationGranularity(&g, &dp, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    P->dsize = ((size_t)P->a.mib << 20) / g * g;
    if (P->dsize < g)
        P->dsize = g;
    CHECK(cuMemCreate(&P->d, P->dsize, &dp, 0));
    CHECK(cuMemAddressReserve(&P->dva, P->dsize, 0, 0, 0));
    CHECK(cuMemMap(P->dva, P->dsize, 0, P->d, 0));
    CUmemAccessDesc acc = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, P->a.ordinal},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(cuMemSetAccess(P->dva, P->dsize, &acc, 1));
    int can = 0;
    if (P->peer_dev != P->a.ordinal && cuDeviceCanAccessPeer(&can, P->a.dev, P->peer_dev) == CUDA_SUCCESS && can) {
        acc.location.id = P->peer_dev;
        CHECK(cuMemSetAccess(P->dva, P->dsize, &acc, 1));
    }
    CHECK(cuMemsetD32(P->dva, 0, P->dsize / 4));
    /* a tag (rank, offset) at every 1 MiB: no two chunks of an image alike, nor zero, as in real data */
    for (size_t off = 0; off < P->dsize; off += 1u << 20) {
        uint64_t tag[2] = {0x7065657261707000ull | (uint64_t)P->rank, off};
        CHECK(cuMemcpyHtoD(P->dva + off, tag, sizeof tag));
    }

    /* H: host memory for the flags, for our device and the CPU, one descriptor at a time as NCCL sets them */
    CUmemAllocationProp hp = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                              .location = {CU_MEM_LOCATION_TYPE_HOST_NUMA, P->numa}};
    CHECK(cuMemGetAllocationGranularity(&g, &hp, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    P->hsize = g;
    CHECK(cuMemCreate(&P->h, P->hsize, &hp, 0));
    CHECK(cuMemAddressReserve(&P->hva, P->hsize, 0, 0, 0));
    CHECK(cuMemMap(P->hva, P->hsize, 0, P->h, 0));
    acc.location.id = P->a.ordinal;
    CHECK(cuMemSetAccess(P->hva, P->hsize, &acc, 1));
    CUmemAccessDesc cpu = {.location = {CU_MEM_LOCATION_TYPE_HOST_NUMA, P->numa},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(cuMemSetAccess(P->hva, P->hsize, &cpu, 1));
    P->flags = (volatile uint32_t *)(uintptr_t)P->hva;
    P->flags[0] = P->flags[1] = 0;

    CHECK(cuMemAlloc(&P->recv, P->dsize));
    CHECK(cuMemsetD32(P->recv, 0, P->dsize / 4));
    CHECK(cuStreamCreate(&P->s, CU_STREAM_NON_BLOCKING));

    pthread_t t;
    if (pthread_create(&t, NULL, proxy, P) != 0)
        gpuapp_die("pthread_create");
    pthread_detach(t);

    /* handle values and sizes through rank 0, then the next rank's memory through its proxy */
    uint64_t mine[3] = {P->d, P->h, P->dsize}, theirs[3];
    exchange(P, mine, theirs);
    if (theirs[2] != P->dsize)
        gpuapp_die("rank %d: the next rank's buffer has %llu bytes, ours %zu", P->rank, (unsigned long long)theirs[2],
                   P->dsize);
    import_peer(P, theirs[0], P->dsize, false, &P->pd, &P->pdva);
    import_peer(P, theirs[1], P->hsize, true, &P->ph, &P->phva);
    P->pflags = (volatile uint32_t *)(uintptr_t)P->phva;
    barrier(P); /* all have mapped everything before any starts */
}

static void step(void *state, uint32_t it) {
    peer *P = state;
    uint32_t off = (it * 7919u * WORDS_PER_ITER) % (uint32_t)(P->dsize / 4 - WORDS_PER_ITER + 1);
    uint32_t v = gpuapp_mix32(it * 0x9E3779B1u + (uint32_t)P->rank * 0x85EBCA6Bu + P->a.seed);
    CHECK(cuStreamWaitValue32(P->s, P->hva + 4, it - 1, CU_STREAM_WAIT_VALUE_GEQ));
    CHECK(cuMemsetD32Async(P->dva + (CUdeviceptr)off * 4, v, WORDS_PER_ITER, P->s));
    CHECK(cuStreamWriteValue32(P->s, P->hva, it, CU_STREAM_WRITE_VALUE_DEFAULT));
    CHECK(cuStreamWaitValue32(P->s, P->phva, it, CU_STREAM_WAIT_VALUE_GEQ));
    CHECK(cuMemcpyDtoDAsync(P->recv, P->pdva, P->dsize, P->s));
    CHECK(cuStreamWriteValue32(P->s, P->phva + 4, it, CU_STREAM_WRITE_VALUE_DEFAULT));
}

static uint64_t checksum(void *state) {
    peer *P = state;
    CHECK(cuStreamSynchronize(P->s));
    uint64_t h = gpuapp_sum_device(GPUAPP_SUM_BASIS, 0, P->dva, P->dsize);
    return gpuapp_sum_device(h, 1, P->recv, P->dsize);
}

static void teardown(peer *P) {
    CHECK(cuStreamSynchronize(P->s));
    barrier(P); /* none unmaps before every other is done with its memory */
    CHECK(cuMemUnmap(P->pdva, P->dsize));
    CHECK(cuMemRelease(P->pd));
    CHECK(cuMemAddressFree(P->pdva, P->dsize));
    CHECK(cuMemUnmap(P->phva, P->hsize));
    CHECK(cuMemRelease(P->ph));
    CHECK(cuMemAddressFree(P->phva, P->hsize));
    CHECK(cuMemUnmap(P->dva, P->dsize));
    CHECK(cuMemRelease(P->d));
    CHECK(cuMemAddressFree(P->dva, P->dsize));
    CHECK(cuMemUnmap(P->hva, P->hsize));
    CHECK(cuMemRelease(P->h));
    CHECK(cuMemAddressFree(P->hva, P->hsize));
    CHECK(cuMemFree(P->recv));
    CHECK(cuStreamDestroy(P->s));
}

/* In a started rank, before its fds are set: fd moved out of the way of 3, 4 and 5 (a dup2 onto one of those
 * could close a source still needed). */
static int lift(int fd) {
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 64);
    if (high < 0)
        _exit(127);
    return high;
}

/* Rank 0 starts ranks 1..N-1: a control socket pair with each, and one pair for each edge of the ring (rank e
 * asks on edge e, its next serves it); rank k's ends at fds 3, 4, 5; its stdout to /dev/null. */
static void start_ranks(peer *P, char **argv) {
    int n = P->nranks, ctl[MAX_RANKS][2], edge[MAX_RANKS][2];
    for (int k = 0; k < n; k++)
        if ((k && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl[k])) ||
            socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, edge[k]))
            gpuapp_die("socketpair: %s", strerror(errno));
    fflush(stdout);
    for (int k = 1; k < n; k++) {
        P->child[k] = fork();
        if (P->child[k] < 0)
            gpuapp_die("fork: %s", strerror(errno));
        if (P->child[k] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            int c = lift(ctl[k][1]), ask = lift(edge[k][0]), serve = lift(edge[k - 1][1]);
            if (dup2(c, FD_CTL) < 0 || dup2(ask, FD_ASK) < 0 || dup2(serve, FD_SERVE) < 0)
                _exit(127);
            FILE *null = freopen("/dev/null", "w", stdout);
            (void)null;
            char r[16];
            snprintf(r, sizeof r, "%d", k);
            setenv("PEERAPP_RANK", r, 1);
            execv("/proc/self/exe", argv);
            _exit(127);
        }
    }
    for (int k = 0; k < n; k++) {
        if (k) {
            close(ctl[k][1]);
            P->ctl[k] = ctl[k][0];
        }
        if (k != 0)
            close(edge[k][0]); /* rank k asks on it */
        if (k != n - 1)
            close(edge[k][1]); /* rank k+1 serves it */
    }
    P->ask = edge[0][0];
    P->serve = edge[n - 1][1];
}

int main(int argc, char **argv) {
    static peer P;
    gpuapp_parse(&P.a, "peerapp", GPUAPP_OPT_MIB | GPUAPP_OPT_RANKS, 4, 1, argc, argv);
    P.nranks = (int)P.a.ranks;
    const char *r = getenv("PEERAPP_RANK");
    P.rank = r ? atoi(r) : 0;
    if (P.rank < 0 || P.rank >= P.nranks)
        gpuapp_die("PEERAPP_RANK=%s, but --ranks %d", r, P.nranks);
    if (P.rank) {
        P.ctl[0] = FD_CTL;
        P.ask = FD_ASK;
        P.serve = FD_SERVE;
    } else {
        start_ranks(&P, argv);
    }
    setup(&P);
    gpuapp_ready(&P.a, P.dsize >> 20, (unsigned)P.nranks);
    gpuapp_loop(&P.a, &P, step, checksum);
    teardown(&P);
    gpuapp_context_release(&P.a);
    if (P.rank)
        return 0;
    close(P.ask);
    int failed = 0;
    for (int k = 1; k < P.nranks; k++) {
        int st = 0;
        close(P.ctl[k]);
        if (waitpid(P.child[k], &st, 0) < 0)
            gpuapp_die("waitpid: %s", strerror(errno));
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "peerapp: rank %d failed: %s %d\n", k, WIFEXITED(st) ? "exit status" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            failed = 1;
        }
    }
    if (failed)
        gpuapp_die("a rank failed");
    return 0;
}

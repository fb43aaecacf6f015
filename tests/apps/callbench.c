/*
 * callbench: the CPU cost of the driver calls a training step makes most
 * often, per call, for the cost table of the interposer (run with and
 * without `gpucr run`, interleaved: tests/gpu/bench-calls.sh).
 *
 *   callbench [--calls N] [--device D]
 *
 * Each case makes N calls (after 1000 to warm up) and prints the wall time
 * per call, synchronization included where the case queues work:
 *
 *   cost launch-1t NS       cuLaunchKernel of an empty kernel, one thread
 *   cost launch-8t NS       the same from 8 threads at once, each on its own
 *                           stream (wall time / all launches)
 *   cost memcpy-async NS    cuMemcpyAsync of 64 bytes, device to device
 *   cost memcpy-async-vmm NS  the same between two VMM allocations the
 *                           program makes itself (cuMemCreate, cuMemMap):
 *                           under gpucr run every allocation is VMM memory,
 *                           so this says what the driver's copy costs on it
 *   cost memset-async NS    cuMemsetD8Async of 64 bytes
 *   cost h2d-32MiB NS       cuMemcpyHtoD of 32 MiB from pageable memory into
 *                           a cuMemAlloc buffer (what loading weights from a
 *                           file does; 50 calls after 5 to warm up)
 *   cost event-record NS    cuEventRecord on an idle stream
 *   cost stream-sync NS     cuStreamSynchronize of an idle stream
 *   cost graph-launch NS    cuGraphLaunch of a captured graph of one empty
 *                           kernel (where the driver has CUDA graphs; the
 *                           simulated one has not: "cost graph-launch -")
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuapp.h"

static const char ptx[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .entry lb_small(.param .u64 lb_a, .param .u64 lb_b, .param .u64 lb_c,"
    " .param .u32 lb_n)\n"
    "{\n"
    "\tret;\n"
    "}\n";

/* CUDA graphs, looked up through cuGetProcAddress: cudadrv.h does not declare them (nothing else uses them). */
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef CUresult (*begin_capture_fn)(CUstream, int mode);
typedef CUresult (*end_capture_fn)(CUstream, CUgraph *);
typedef CUresult (*instantiate_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*graph_launch_fn)(CUgraphExec, CUstream);
enum { CAPTURE_MODE_THREAD_LOCAL = 1 };

static long ncalls = 200000;
static CUcontext ctx;
static CUfunction fn;
static CUdeviceptr buf[3];
static CUdeviceptr vbuf; /* one VMM range of two granules: the memcpy-async-vmm case */
static size_t vgran;
/* What the single-thread cases call on. */
static CUstream s;
static CUevent ev;
static CUgraphExec ge;
static graph_launch_fn glaunch;

static void launch(CUstream s) {
    unsigned n = 1024;
    void *p[] = {&buf[0], &buf[1], &buf[2], &n};
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s, p, NULL));
}

static void *launcher(void *arg) {
    long n = *(long *)arg;
    CHECK(cuCtxSetCurrent(ctx));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (long i = 0; i < n; i++)
        launch(s);
    CHECK(cuStreamSynchronize(s));
    CHECK(cuStreamDestroy(s));
    return NULL;
}

static void report(const char *name, double seconds, long calls) {
    printf("cost %s %.1f\n", name, seconds / (double)calls * 1e9);
    fflush(stdout);
}

static void call_launch(long i) {
    (void)i;
    launch(s);
}
static void call_memcpy(long i) {
    (void)i;
    CHECK(cuMemcpyAsync(buf[1], buf[0], 64, s));
}
static void call_memcpy_vmm(long i) {
    (void)i;
    CHECK(cuMemcpyAsync(vbuf + vgran, vbuf, 64, s));
}
static void call_memset(long i) { CHECK(cuMemsetD8Async(buf[2], (unsigned char)i, 64, s)); }
static void call_event_record(long i) {
    (void)i;
    CHECK(cuEventRecord(ev, s));
}
static void call_stream_sync(long i) {
    (void)i;
    CHECK(cuStreamSynchronize(s));
}
static void call_graph(long i) {
    (void)i;
    CHECK(glaunch(ge, s));
}

/* 1000 calls of call to warm up, then ncalls timed, the stream synchronized after each run. */
static void timed(const char *name, void (*call)(long i)) {
    for (int warm = 1; warm >= 0; warm--) {
        long n = warm ? 1000 : ncalls;
        double t0 = gpuapp_now_s();
        for (long i = 0; i < n; i++)
            call(i);
        CHECK(cuStreamSynchronize(s));
        if (!warm)
            report(name, gpuapp_now_s() - t0, n);
    }
}

static void *getproc(const char *name) {
    void *p = NULL;
    CUdriverProcAddressQueryResult q;
    if (cuGetProcAddress_v2(name, &p, 12000, 0, &q) != CUDA_SUCCESS || q != CU_GET_PROC_ADDRESS_SUCCESS)
        return NULL;
    return p;
}

int main(int argc, char **argv) {
    int ordinal = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--calls") && i + 1 < argc)
            ncalls = atol(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            ordinal = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: callbench [--calls N] [--device D]\n");
            return 2;
        }
    }
    if (ncalls < 1) {
        fprintf(stderr, "callbench: --calls must be positive\n");
        return 2;
    }
    gpuapp a = {.ordinal = ordinal};
    gpuapp_context(&a);
    ctx = a.ctx;
    CUmodule mod = gpuapp_load_ptx(ptx);
    fn = gpuapp_function(mod, "lb_small");
    for (int i = 0; i < 3; i++)
        CHECK(cuMemAlloc(&buf[i], 1 << 20));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));

    timed("launch-1t", call_launch);
    {
        pthread_t t[8];
        long per = ncalls / 8 > 0 ? ncalls / 8 : 1;
        double t0 = gpuapp_now_s();
        for (int i = 0; i < 8; i++)
            if (pthread_create(&t[i], NULL, launcher, &per) != 0)
                gpuapp_die("pthread_create");
        for (int i = 0; i < 8; i++)
            pthread_join(t[i], NULL);
        report("launch-8t", gpuapp_now_s() - t0, per * 8);
    }
    timed("memcpy-async", call_memcpy);
    {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = a.dev}};
        CHECK(cuMemGetAllocationGranularity(&vgran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CUmemGenericAllocationHandle h[2];
        CHECK(cuMemAddressReserve(&vbuf, 2 * vgran, vgran, 0, 0));
        for (int i = 0; i < 2; i++) {
            CHECK(cuMemCreate(&h[i], vgran, &prop, 0));
            CHECK(cuMemMap(vbuf + i * vgran, vgran, 0, h[i], 0));
        }
        CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CHECK(cuMemSetAccess(vbuf, 2 * vgran, &acc, 1));
        timed("memcpy-async-vmm", call_memcpy_vmm);
        CHECK(cuMemUnmap(vbuf, 2 * vgran));
        for (int i = 0; i < 2; i++)
            CHECK(cuMemRelease(h[i]));
        CHECK(cuMemAddressFree(vbuf, 2 * vgran));
    }
    timed("memset-async", call_memset);
    timed("event-record", call_event_record);
    timed("stream-sync", call_stream_sync);
    {
        size_t n = 32u << 20;
        unsigned char *host = malloc(n);
        CUdeviceptr dev;
        if (!host)
            gpuapp_die("out of memory");
        memset(host, 0x5a, n);
        CHECK(cuMemAlloc(&dev, n));
        for (int warm = 1; warm >= 0; warm--) {
            long calls = warm ? 5 : 50;
            double t0 = gpuapp_now_s();
            for (long i = 0; i < calls; i++)
                CHECK(cuMemcpyHtoD(dev, host, n));
            if (!warm)
                report("h2d-32MiB", gpuapp_now_s() - t0, calls);
        }
        unsigned char b = 0;
        CHECK(cuMemcpyDtoH(&b, dev + n - 1, 1));
        if (b != 0x5a)
            gpuapp_die("h2d-32MiB: wrote 0x5a, read 0x%02x", b);
        CHECK(cuMemFree(dev));
        free(host);
    }
    begin_capture_fn begin = (begin_capture_fn)getproc("cuStreamBeginCapture");
    end_capture_fn end = (end_capture_fn)getproc("cuStreamEndCapture");
    instantiate_fn inst = (instantiate_fn)getproc("cuGraphInstantiateWithFlags");
    glaunch = (graph_launch_fn)getproc("cuGraphLaunch");
    if (begin && end && inst && glaunch) {
        CUgraph g;
        CHECK(begin(s, CAPTURE_MODE_THREAD_LOCAL));
        launch(s);
        CHECK(end(s, &g));
        CHECK(inst(&ge, g, 0));
        timed("graph-launch", call_graph);
    } else {
        printf("cost graph-launch -\n");
    }
    CHECK(cuEventDestroy(ev));
    CHECK(cuStreamDestroy(s));
    for (int i = 0; i < 3; i++)
        CHECK(cuMemFree(buf[i]));
    CHECK(cuModuleUnload(mod));
    gpuapp_context_release(&a);
    return 0;
}

/*
 * Streams and events. Ordering is checked with a kernel that is still running
 * when the host looks (dt_delay_write), and with events: never with timing
 * assumptions tighter than a few hundred milliseconds.
 */
#include <dlfcn.h>
#include "drvtest.h"

/* exported by libcuda (CUDA 12.8 on), not declared by cudadrv.h: looked up by name */
typedef CUresult (*elapsed_fn)(float *pMilliseconds, CUevent hStart, CUevent hEnd);

#define MS 1000000ULL

typedef struct {
    CUmodule m;
    CUfunction dw;
    uint32_t *pinned;
} kit;

static kit setup(void) {
    kit k;
    dt_init_ctx();
    k.m = dt_module();
    k.dw = dt_function(k.m, "dt_delay_write");
    OK(cuMemAllocHost((void **)&k.pinned, 4096));
    return k;
}

static uint32_t read_u32(CUdeviceptr p) {
    uint32_t v = 0;
    OK(cuMemcpyDtoH(&v, p, 4));
    return v;
}

static void stream_basic(void) {
    kit k = setup();
    CUstream a, b, c;
    OK(cuStreamCreate(&a, CU_STREAM_DEFAULT));
    OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    EXPECT_RC(cuStreamCreate(&c, 0x10), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuStreamCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuStreamQuery(a), CUDA_SUCCESS);
    EXPECT_RC(cuStreamSynchronize(b), CUDA_SUCCESS);
    EXPECT_RC(cuStreamQuery(NULL), CUDA_SUCCESS);
    EXPECT_RC(cuStreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
    OK(cuStreamDestroy(a));
    /* destroying a stream with queued work: the work still completes */
    CUdeviceptr p = dt_alloc(4);
    OK(cuMemsetD32(p, 0, 1));
    dt_launch_delay_write(k.dw, b, p, 200 * MS, 9);
    OK(cuStreamDestroy(b));
    OK(cuCtxSynchronize());
    EXPECT(read_u32(p) == 9, "work queued on a destroyed stream did not complete");
}

static void legacy_stream_order(void) {
    kit k = setup();
    CUdeviceptr p = dt_alloc(4);
    OK(cuMemsetD32(p, 0, 1));
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_DEFAULT));
    /* the legacy stream waits for earlier work on blocking streams */
    dt_launch_delay_write(k.dw, s, p, 300 * MS, 42);
    uint32_t v = 0;
    OK(cuMemcpyDtoH(&v, p, 4));
    EXPECT(v == 42, "a legacy-stream copy did not wait for a blocking stream (read %u)", v);
    /* and blocking streams wait for earlier legacy-stream work */
    dt_launch_delay_write(k.dw, NULL, p, 300 * MS, 43);
    k.pinned[0] = 0;
    OK(cuMemcpyDtoHAsync(k.pinned, p, 4, s));
    OK(cuStreamSynchronize(s));
    EXPECT(k.pinned[0] == 43, "a blocking stream did not wait for the legacy stream (read %u)", k.pinned[0]);
}

static void nonblocking_stream(void) {
    kit k = setup();
    CUdeviceptr p = dt_alloc(4), q = dt_alloc(4);
    OK(cuMemsetD32(p, 0, 1));
    CUstream n;
    CUevent e;
    OK(cuStreamCreate(&n, CU_STREAM_NON_BLOCKING));
    OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    dt_launch_delay_write(k.dw, n, p, 1000 * MS, 44);
    OK(cuEventRecord(e, n));
    /* legacy-stream work does not wait for a non-blocking stream */
    OK(cuMemsetD32(q, 5, 1));
    uint32_t v = 0;
    OK(cuMemcpyDtoH(&v, q, 4));
    EXPECT(v == 5, "memset on the legacy stream");
    EXPECT_RC(cuEventQuery(e), CUDA_ERROR_NOT_READY);
    OK(cuEventSynchronize(e));
    EXPECT(read_u32(p) == 44, "non-blocking stream result");
}

static void async_is_async(void) {
    kit k = setup();
    CUdeviceptr p = dt_alloc(4);
    OK(cuMemsetD32(p, 0, 1));
    CUstream s;
    CUevent e;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuEventCreate(&e, 0));
    dt_launch_delay_write(k.dw, s, p, 500 * MS, 7);
    OK(cuEventRecord(e, s));
    EXPECT_RC(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    EXPECT_RC(cuEventQuery(e), CUDA_ERROR_NOT_READY);
    OK(cuEventSynchronize(e));
    EXPECT_RC(cuEventQuery(e), CUDA_SUCCESS);
    EXPECT_RC(cuStreamQuery(s), CUDA_SUCCESS);
    EXPECT(read_u32(p) == 7, "delayed write");
}

static void events(void) {
    kit k = setup();
    CUevent a, b, nt, x;
    OK(cuEventCreate(&a, CU_EVENT_DEFAULT));
    OK(cuEventCreate(&b, CU_EVENT_BLOCKING_SYNC));
    OK(cuEventCreate(&nt, CU_EVENT_DISABLE_TIMING));
    EXPECT_RC(cuEventCreate(&x, 0x100), CUDA_ERROR_INVALID_VALUE);
    /* never recorded: complete, but it has no time */
    EXPECT_RC(cuEventQuery(a), CUDA_SUCCESS);
    EXPECT_RC(cuEventSynchronize(a), CUDA_SUCCESS);
    float ms = -1;
    EXPECT_RC(cuEventElapsedTime(&ms, a, b), EXP_ELAPSED_UNRECORDED);
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr p = dt_alloc(4);
    OK(cuEventRecord(a, s));
    dt_launch_delay_write(k.dw, s, p, 300 * MS, 1);
    OK(cuEventRecord(b, s));
    OK(cuEventRecord(nt, s));
    EXPECT_RC(cuEventElapsedTime(&ms, a, b), CUDA_ERROR_NOT_READY);
    OK(cuEventSynchronize(b));
    if (EXPECT_RC(cuEventElapsedTime(&ms, a, b), CUDA_SUCCESS))
        EXPECT(ms >= 250 && ms < 10000, "elapsed %.3f ms around a 300 ms kernel", (double)ms);
    /* cudadrv.h maps cuEventElapsedTime to _v2, as cuda.h does; the legacy
     * unversioned entry that older binaries link must agree with it. */
    float ms2 = -1;
    elapsed_fn elapsed_v1 = (elapsed_fn)dt_sym("cuEventElapsedTime");
    if (EXPECT_RC(elapsed_v1(&ms2, a, b), CUDA_SUCCESS))
        EXPECT(ms2 == ms, "cuEventElapsedTime %.3f != cuEventElapsedTime_v2 %.3f", (double)ms2, (double)ms);
    OK(cuEventSynchronize(nt));
    EXPECT_RC(cuEventElapsedTime(&ms, a, nt), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_RC(cuEventElapsedTime(NULL, a, b), EXP_ELAPSED_NULL);
    OK(cuEventDestroy(a));
    OK(cuEventDestroy(b));
    OK(cuEventDestroy(nt));
}

static void stream_wait_event(void) {
    kit k = setup();
    CUdeviceptr p = dt_alloc(4);
    OK(cuMemsetD32(p, 0, 1));
    CUstream s1, s2;
    CUevent e, never;
    OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    OK(cuEventCreate(&never, CU_EVENT_DISABLE_TIMING));
    dt_launch_delay_write(k.dw, s1, p, 300 * MS, 11);
    OK(cuEventRecord(e, s1));
    OK(cuStreamWaitEvent(s2, e, 0));
    EXPECT_RC(cuStreamWaitEvent(s2, never, 0), CUDA_SUCCESS);
    k.pinned[0] = 0;
    OK(cuMemcpyDtoHAsync(k.pinned, p, 4, s2));
    OK(cuStreamSynchronize(s2));
    EXPECT(k.pinned[0] == 11, "a stream did not wait for the event it was told to (read %u)", k.pinned[0]);
    EXPECT_RC(cuStreamWaitEvent(s2, e, 0x10), CUDA_ERROR_INVALID_VALUE);
}

static void ctx_synchronize(void) {
    kit k = setup();
    CUdeviceptr p = dt_alloc(4), q = dt_alloc(4);
    OK(cuMemsetD32(p, 0, 1));
    OK(cuMemsetD32(q, 0, 1));
    CUstream s1, s2;
    CUevent e1, e2;
    OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    OK(cuEventCreate(&e1, 0));
    OK(cuEventCreate(&e2, 0));
    dt_launch_delay_write(k.dw, s1, p, 300 * MS, 21);
    dt_launch_delay_write(k.dw, s2, q, 400 * MS, 22);
    OK(cuEventRecord(e1, s1));
    OK(cuEventRecord(e2, s2));
    OK(cuCtxSynchronize());
    EXPECT_RC(cuEventQuery(e1), CUDA_SUCCESS);
    EXPECT_RC(cuEventQuery(e2), CUDA_SUCCESS);
    EXPECT_RC(cuStreamQuery(s1), CUDA_SUCCESS);
    EXPECT(read_u32(p) == 21 && read_u32(q) == 22, "results after cuCtxSynchronize");
}

/* Stream capture and graph replay: captured work does not run at capture, the graph replays it with the
 * parameters of the capture, as often as launched, in stream order; what a capture refuses. */
static void graph_capture(void) {
    kit k = setup();
    CUfunction add = dt_function(k.m, "dt_add");
    enum { N = 1024 };
    CUdeviceptr p = dt_alloc(N * 4);
    OK(cuMemsetD32(p, 5, N));
    CUstream cs, s;
    OK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    EXPECT_RC(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CUgraph g;
    EXPECT_RC(cuStreamEndCapture(cs, &g), CUDA_ERROR_ILLEGAL_STATE);
    OK(cuStreamBeginCapture_v2(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT_RC(cuStreamBeginCapture_v2(cs, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
    uint32_t n = N, a = 3;
    void *args[] = {&p, &n, &a};
    OK(cuLaunchKernel(add, N / 256, 1, 1, 256, 1, 1, 0, cs, args, NULL));
    a = 1000; /* the graph keeps the value of the capture */
    OK(cuMemsetD32Async(p + 4 * (N - 1), 77, 1, cs));
    OK(cuStreamEndCapture(cs, &g));
    OK(cuStreamSynchronize(cs));
    EXPECT(read_u32(p) == 5, "captured work ran at capture (p[0] = %u)", read_u32(p));
    /* two nodes: the launch and the memset; an array gets as many as fit, the rest NULL */
    size_t nn = 0;
    EXPECT_RC(cuGraphGetNodes(g, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    OK(cuGraphGetNodes(g, NULL, &nn));
    EXPECT(nn == 2, "the captured graph has %zu nodes, want 2", nn);
    if (!dlsym(RTLD_DEFAULT, "gpucrServedAttach")) { /* served mode gives the number only */
        CUgraphNode nodes[3] = {NULL, NULL, NULL};
        nn = 3;
        OK(cuGraphGetNodes(g, nodes, &nn));
        EXPECT(nn == 2 && nodes[0] && nodes[1] && !nodes[2], "nodes: %zu (%p %p %p)", nn, (void *)nodes[0],
               (void *)nodes[1], (void *)nodes[2]);
    }
    CUgraphExec x;
    OK(cuGraphInstantiateWithFlags(&x, g, 0));
    OK(cuGraphDestroy(g)); /* the executable graph stands alone */
    for (int i = 0; i < 3; i++)
        OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    EXPECT(read_u32(p) == 5 + 3 * 3, "after 3 replays p[0] = %u, want 14", read_u32(p));
    EXPECT(read_u32(p + 4 * (N - 1)) == 77, "the captured memset did not replay (p[N-1] = %u)",
           read_u32(p + 4 * (N - 1)));
    OK(cuGraphExecDestroy(x));
}

const dt_case dt_cases_stream[] = {
    {"stream_basic", stream_basic, 0},
    {"legacy_stream_order", legacy_stream_order, 0},
    {"nonblocking_stream", nonblocking_stream, 0},
    {"async_is_async", async_is_async, 0},
    {"events", events, 0},
    {"stream_wait_event", stream_wait_event, 0},
    {"ctx_synchronize", ctx_synchronize, 0},
    {"graph_capture", graph_capture, 0},
    {NULL, NULL, 0},
};

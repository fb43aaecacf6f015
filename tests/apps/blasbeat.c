/*
 * blasbeat: a test application on cuBLAS and cuBLASLt, as a training step
 * calls them (PyTorch's matmuls): the simulated libraries on the simulated
 * driver (tests/sim/blas), NVIDIA's on a GPU (make gpu-apps).
 *
 * Float matrices, column-major, with --n N (default 64): M = N, K = N + 32,
 * P = N + 16 (64: 64x96 times 96x80). State that every iteration reads and
 * writes: C (M x P), Y (three M x K matrices, leading dimension M + 3, batch
 * stride M*K + 5, so padding lies between columns and batches) and E (M x P);
 * constant: B (K x P), W (three K x P) and bias (M). Every iteration ITER:
 *
 *   host  waits for the previous iteration's s0 work, then makes its input:
 *         column 0 of Y[0] from ITER (cuMemcpyHtoDAsync on s0)
 *   s0    waits for the previous iteration's Lt product (it read Y[1])
 *   s0    cublasSgemm_v2:              C   = (1/K) * Y[0] * B + 0.5 * C
 *   s0    cublasGemmStridedBatchedEx:  Y_b = (1/P) * C * W_b^T + 0.5 * Y_b, b < 3
 *   s0    cublasSgemv_v2:              v   = (1/P) * C * W[0..P) + 0.5 * v
 *   s0    cublasSdot_v2:               dot = v . v (host pointer mode: into host
 *                                      memory, the call waiting for s0's work,
 *                                      then copied to the device on s0)
 *   s1    waits for s0, then cublasLtMatmul with the heuristic's algorithm and
 *         EPILOGUE_BIAS:               E   = (1/K) * Y[1] * B + 0.5 * E + bias
 *
 * So every output feeds the next iteration (a process restored without its
 * state would print other checksums), the values stay bounded, and the
 * cuBLAS handle works on stream s0 while the cuBLASLt one works on s1.
 *
 * --device-scalars: alpha and beta come from device memory (pointer mode
 * DEVICE for both libraries). --lt-per-call: the Lt descriptor, layouts and
 * preference are made, asked for the algorithm and destroyed every
 * iteration, on the cuBLAS handle, as PyTorch does; otherwise once at the
 * start, on a cuBLASLt handle of their own. Neither changes
 * the checksums.
 *
 * The checksum (gpuapp.h) covers C, Y, E, v and dot, read back after both streams
 * are synchronized. The simulated libraries compute every element in a fixed
 * order, so two runs print the same checksums; NVIDIA's pick their own
 * algorithms, and their checksums may change with the library or the GPU.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuapp.h"
#include "gpucr/cublas.h"

#define BATCH 3

/* CHECK for cuBLAS calls: the call, where, and the status's name; exit status 3 as gpuapp's. */
#define BCHECK(call) blas_check((call), #call, __FILE__, __LINE__)
static void blas_check(cublasStatus_t s, const char *call, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS)
        gpuapp_die("%s:%d: %s failed: %d %s: %s", file, line, call, (int)s, cublasGetStatusName(s),
                   cublasGetStatusString(s));
}

typedef struct lt_plan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, e;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

typedef struct bb_state {
    gpuapp *app;
    int m, k, p;  /* M, K, P */
    int ldy;      /* Y's leading dimension */
    long long sy; /* Y's batch stride, elements */
    bool device_scalars, lt_per_call, graph;
    CUgraphExec g0, g1; /* --graph: s0's and s1's products */
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    CUstream s0, s1;
    CUevent ev_s0, ev_lt; /* s0's work of an iteration; the Lt product */
    CUdeviceptr c, y, e, b, w, bias, scalars;
    CUdeviceptr v, dot; /* gemv's vector (M), dot's result (1 float) */
    float dot_host;     /* host pointer mode: dot's result lands here first */
    float *input;       /* pageable: column 0 of Y[0] */
    lt_plan plan;       /* made once unless --lt-per-call */
    /* the scalars on the host; with --device-scalars the same floats at `scalars` */
    float sc[4];
} bb_state;

enum { S_ALPHA_GEMM, S_BETA, S_ALPHA_BATCH, S_ALPHA_LT };

/* Values in [-1, 1) from a seed and an index. */
static float value(uint32_t seed, size_t i) {
    return (float)((double)gpuapp_mix32((uint32_t)i * 0x9E3779B1u + seed) / 2147483648.0 - 1.0);
}

static CUdeviceptr upload_random(size_t n, uint32_t seed) {
    float *h = malloc(n * sizeof *h);
    if (!h)
        gpuapp_die("out of host memory");
    for (size_t i = 0; i < n; i++)
        h[i] = value(seed, i);
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, n * sizeof *h));
    CHECK(cuMemcpyHtoD(d, h, n * sizeof *h));
    free(h);
    return d;
}

/* A scalar argument: the host float, or its copy in device memory. */
static const float *scalar(const bb_state *st, int i) {
    return st->device_scalars ? (const float *)(uintptr_t)(st->scalars + (CUdeviceptr)i * sizeof(float)) : &st->sc[i];
}

static void plan_make(bb_state *st, lt_plan *pl) {
    int32_t op = CUBLAS_OP_N;
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    int32_t pm = st->device_scalars ? CUBLASLT_POINTER_MODE_DEVICE : CUBLASLT_POINTER_MODE_HOST;
    void *bias = (void *)(uintptr_t)st->bias;
    BCHECK(cublasLtMatmulDescCreate(&pl->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    BCHECK(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op));
    BCHECK(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op, sizeof op));
    BCHECK(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    BCHECK(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    BCHECK(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm));
    BCHECK(cublasLtMatrixLayoutCreate(&pl->a, CUDA_R_32F, (uint64_t)st->m, (uint64_t)st->k, st->ldy));
    BCHECK(cublasLtMatrixLayoutCreate(&pl->b, CUDA_R_32F, (uint64_t)st->k, (uint64_t)st->p, st->k));
    BCHECK(cublasLtMatrixLayoutCreate(&pl->e, CUDA_R_32F, (uint64_t)st->m, (uint64_t)st->p, st->m));
    BCHECK(cublasLtMatmulPreferenceCreate(&pl->pref));
    uint64_t ws = 0; /* no workspace: the algorithm must do without */
    BCHECK(cublasLtMatmulPreferenceSetAttribute(pl->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t res;
    int count = 0;
    BCHECK(cublasLtMatmulAlgoGetHeuristic(st->lt, pl->desc, pl->a, pl->b, pl->e, pl->e, pl->pref, 1, &res, &count));
    if (count < 1)
        gpuapp_die("cublasLtMatmulAlgoGetHeuristic: no algorithm for %dx%d times %dx%d", st->m, st->k, st->k, st->p);
    pl->algo = res.algo;
}

static void plan_free(lt_plan *pl) {
    BCHECK(cublasLtMatmulPreferenceDestroy(pl->pref));
    BCHECK(cublasLtMatrixLayoutDestroy(pl->a));
    BCHECK(cublasLtMatrixLayoutDestroy(pl->b));
    BCHECK(cublasLtMatrixLayoutDestroy(pl->e));
    BCHECK(cublasLtMatmulDescDestroy(pl->desc));
    memset(pl, 0, sizeof *pl);
}

/* s0's products of an iteration (captured once with --graph): C, Y, v, and dot(v, v) into device memory with
 * device scalars (a host-mode dot waits for its result: never in a graph; step makes it). */
static void work_s0(bb_state *st) {
    float *Y0 = (float *)(uintptr_t)st->y;
    float *C = (float *)(uintptr_t)st->c, *V = (float *)(uintptr_t)st->v;
    const float *B = (const float *)(uintptr_t)st->b, *W = (const float *)(uintptr_t)st->w;
    BCHECK(cublasSgemm_v2(st->blas, CUBLAS_OP_N, CUBLAS_OP_N, st->m, st->p, st->k, scalar(st, S_ALPHA_GEMM), Y0,
                          st->ldy, B, st->k, scalar(st, S_BETA), C, st->m));
    BCHECK(cublasGemmStridedBatchedEx(st->blas, CUBLAS_OP_N, CUBLAS_OP_T, st->m, st->k, st->p,
                                      scalar(st, S_ALPHA_BATCH), C, CUDA_R_32F, st->m, 0, W, CUDA_R_32F, st->k,
                                      (long long)st->k * st->p, scalar(st, S_BETA), Y0, CUDA_R_32F, st->ldy, st->sy,
                                      BATCH, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    BCHECK(cublasSgemv_v2(st->blas, CUBLAS_OP_N, st->m, st->p, scalar(st, S_ALPHA_BATCH), C, st->m, W, 1,
                          scalar(st, S_BETA), V, 1));
    if (st->device_scalars)
        BCHECK(cublasSdot_v2(st->blas, st->m, V, 1, V, 1, (float *)(uintptr_t)st->dot));
}

/* s1's product (captured once with --graph, its descriptors made and destroyed inside the capture with
 * --lt-per-call, as PyTorch's are). */
static void work_s1(bb_state *st) {
    float *Y1 = (float *)(uintptr_t)(st->y + (CUdeviceptr)st->sy * sizeof(float));
    float *E = (float *)(uintptr_t)st->e;
    const float *B = (const float *)(uintptr_t)st->b;
    if (st->lt_per_call)
        plan_make(st, &st->plan);
    BCHECK(cublasLtMatmul(st->lt, st->plan.desc, scalar(st, S_ALPHA_LT), Y1, st->plan.a, B, st->plan.b,
                          scalar(st, S_BETA), E, st->plan.e, E, st->plan.e, &st->plan.algo, NULL, 0, st->s1));
    if (st->lt_per_call)
        plan_free(&st->plan);
}

/* --graph: s0's and s1's products captured on their streams, once. */
static CUgraphExec capture(bb_state *st, CUstream s, void (*work)(bb_state *)) {
    CUgraph g;
    CUgraphExec x;
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    work(st);
    CHECK(cuStreamEndCapture(s, &g));
    CHECK(cuGraphInstantiateWithFlags(&x, g, 0));
    CHECK(cuGraphDestroy(g));
    return x;
}

static void step(void *p, uint32_t iter) {
    bb_state *st = p;
    /* the previous iteration's copy from st->input is done: it can be rewritten */
    CHECK(cuEventSynchronize(st->ev_s0));
    for (int i = 0; i < st->m; i++)
        st->input[i] = value(iter * 0x85EBCA6Bu ^ st->app->seed, (size_t)i);
    CHECK(cuMemcpyHtoDAsync(st->y, st->input, (size_t)st->m * sizeof(float), st->s0));
    /* Y[1] was read by the previous Lt product on s1 */
    CHECK(cuStreamWaitEvent(st->s0, st->ev_lt, 0));
    if (st->g0)
        CHECK(cuGraphLaunch(st->g0, st->s0));
    else
        work_s0(st);
    if (!st->device_scalars) {
        /* into host memory once s0's work is done (cuBLAS's host-mode dot waits for it), on into device memory */
        BCHECK(
            cublasSdot_v2(st->blas, st->m, (float *)(uintptr_t)st->v, 1, (float *)(uintptr_t)st->v, 1, &st->dot_host));
        CHECK(cuMemcpyHtoDAsync(st->dot, &st->dot_host, sizeof st->dot_host, st->s0));
    }
    CHECK(cuEventRecord(st->ev_s0, st->s0));

    CHECK(cuStreamWaitEvent(st->s1, st->ev_s0, 0));
    if (st->g1)
        CHECK(cuGraphLaunch(st->g1, st->s1));
    else
        work_s1(st);
    CHECK(cuEventRecord(st->ev_lt, st->s1));
}

static uint64_t checksum(void *p) {
    bb_state *st = p;
    CHECK(cuStreamSynchronize(st->s0));
    CHECK(cuStreamSynchronize(st->s1));
    uint64_t h = GPUAPP_SUM_BASIS;
    h = gpuapp_sum_device(h, 0, st->c, (size_t)st->m * st->p * sizeof(float));
    h = gpuapp_sum_device(h, 1, st->y, (size_t)st->sy * BATCH * sizeof(float));
    h = gpuapp_sum_device(h, 2, st->e, (size_t)st->m * st->p * sizeof(float));
    h = gpuapp_sum_device(h, 3, st->v, (size_t)st->m * sizeof(float));
    h = gpuapp_sum_device(h, 4, st->dot, sizeof(float));
    return h;
}

/* blasbeat's own options, taken out of argv before gpuapp_parse sees the rest. */
static void own_options(bb_state *st, int *argc, char **argv) {
    int out = 1, n = 64;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--device-scalars") == 0) {
            st->device_scalars = true;
        } else if (strcmp(argv[i], "--lt-per-call") == 0) {
            st->lt_per_call = true;
        } else if (strcmp(argv[i], "--graph") == 0) {
            st->graph = true;
        } else if (strcmp(argv[i], "--n") == 0 && i + 1 < *argc) {
            char *end = NULL;
            long v = strtol(argv[++i], &end, 10);
            if (!end || *end || v < 1 || v > 4096) {
                fprintf(stderr, "blasbeat: bad value for --n: '%s' (want 1..4096)\n", argv[i]);
                exit(2);
            }
            n = (int)v;
        } else {
            if (strcmp(argv[i], "--help") == 0)
                printf(
                    "blasbeat's own options:\n"
                    "  --n N            matrices of N x N+32 and N+32 x N+16 (default 64)\n"
                    "  --device-scalars alpha and beta in device memory (pointer mode DEVICE)\n"
                    "  --lt-per-call    make and destroy the cuBLASLt descriptors every iteration, on the cuBLAS "
                    "handle\n");
            argv[out++] = argv[i];
        }
    }
    argv[out] = NULL;
    *argc = out;
    st->m = n;
    st->k = n + 32;
    st->p = n + 16;
}

int main(int argc, char **argv) {
    gpuapp app;
    bb_state st;
    memset(&st, 0, sizeof st);
    own_options(&st, &argc, argv);
    gpuapp_parse(&app, "blasbeat", 0, 0, 0, argc, argv);
    st.app = &app;
    st.ldy = st.m + 3;
    st.sy = (long long)st.ldy * st.k + 5;
    st.sc[S_ALPHA_GEMM] = 1.0f / (float)st.k;
    st.sc[S_BETA] = 0.5f;
    st.sc[S_ALPHA_BATCH] = 1.0f / (float)st.p;
    st.sc[S_ALPHA_LT] = 1.0f / (float)st.k;
    st.input = calloc((size_t)st.m, sizeof(float));
    if (!st.input)
        gpuapp_die("out of host memory");

    gpuapp_context(&app);
    CHECK(cuStreamCreate(&st.s0, CU_STREAM_DEFAULT));
    CHECK(cuStreamCreate(&st.s1, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&st.ev_s0, CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&st.ev_lt, CU_EVENT_DISABLE_TIMING));
    uint32_t seed = app.seed;
    st.c = upload_random((size_t)st.m * st.p, seed ^ 0xC0u);
    st.y = upload_random((size_t)st.sy * BATCH, seed ^ 0x10u);
    st.e = upload_random((size_t)st.m * st.p, seed ^ 0xE0u);
    st.b = upload_random((size_t)st.k * st.p, seed ^ 0xB0u);
    st.w = upload_random((size_t)st.k * st.p * BATCH, seed ^ 0x3Du);
    st.bias = upload_random((size_t)st.m, seed ^ 0xB1A5u);
    CHECK(cuMemAlloc(&st.v, (size_t)st.m * sizeof(float)));
    CHECK(cuMemsetD32(st.v, 0, (size_t)st.m));
    CHECK(cuMemAlloc(&st.dot, sizeof(float)));
    CHECK(cuMemsetD32(st.dot, 0, 1));
    CHECK(cuMemAlloc(&st.scalars, sizeof st.sc));
    CHECK(cuMemcpyHtoD(st.scalars, st.sc, sizeof st.sc));

    BCHECK(cublasCreate_v2(&st.blas));
    BCHECK(cublasSetStream_v2(st.blas, st.s0));
    BCHECK(cublasSetPointerMode_v2(st.blas, st.device_scalars ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST));
    /* --lt-per-call: PyTorch's way, its cuBLAS handle as its cuBLASLt handle too (NVIDIA's libraries allow it) */
    if (st.lt_per_call)
        st.lt = (cublasLtHandle_t)st.blas;
    else
        BCHECK(cublasLtCreate(&st.lt));
    if (!st.lt_per_call)
        plan_make(&st, &st.plan);
    CHECK(cuEventRecord(st.ev_s0, st.s0));
    CHECK(cuEventRecord(st.ev_lt, st.s1));
    CHECK(cuCtxSynchronize());
    if (st.graph) {
        st.g0 = capture(&st, st.s0, work_s0);
        st.g1 = capture(&st, st.s1, work_s1);
    }

    size_t bytes = ((size_t)st.m * st.p * 2 + (size_t)st.sy * BATCH + (size_t)st.k * st.p * (1 + BATCH) + st.m) * 4;
    gpuapp_ready(&app, bytes >> 20, 6);
    gpuapp_loop(&app, &st, step, checksum);

    CHECK(cuCtxSynchronize());
    if (st.graph) {
        CHECK(cuGraphExecDestroy(st.g0));
        CHECK(cuGraphExecDestroy(st.g1));
    }
    if (!st.lt_per_call) {
        plan_free(&st.plan);
        BCHECK(cublasLtDestroy(st.lt));
    }
    BCHECK(cublasDestroy_v2(st.blas));
    CUdeviceptr bufs[] = {st.c, st.y, st.e, st.b, st.w, st.bias, st.scalars, st.v, st.dot};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CHECK(cuMemFree(bufs[i]));
    CHECK(cuEventDestroy(st.ev_s0));
    CHECK(cuEventDestroy(st.ev_lt));
    CHECK(cuStreamDestroy(st.s0));
    CHECK(cuStreamDestroy(st.s1));
    gpuapp_context_release(&app);
    free(st.input);
    return 0;
}

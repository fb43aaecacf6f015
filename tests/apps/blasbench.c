/*
 * blasbench: the CPU cost of the cuBLAS and cuBLASLt calls a training step
 * makes, per call, for served mode's cost table (run plain and under
 * `gpucr run --served`, interleaved: tests/gpu/served/served-apps.sh).
 *
 *   blasbench [--calls N]
 *
 * Each case makes N calls (after N/10 to warm up), synchronizes, and prints
 * the wall time per call:
 *
 *   cost gemm NS        cublasSgemm of 16x16 matrices on a stream, after the
 *                       stream, workspace and math mode set again, as
 *                       PyTorch does before every product
 *   cost lt-product NS  a cuBLASLt product as PyTorch makes one: a
 *                       descriptor with its attributes, three layouts, a
 *                       preference, the heuristic, the product on the cuBLAS
 *                       handle, everything destroyed again
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpucr/cublas.h"
#include "gpuapp.h"

static void bcheck(cublasStatus_t st, const char *call, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "blasbench: line %d: %s: cuBLAS status %d\n", line, call, (int)st);
        exit(3);
    }
}
#define BCHECK(call) bcheck((call), #call, __LINE__)

enum { N = 16 };

static void report(const char *name, double s, long n) { printf("cost %s %.0f\n", name, s * 1e9 / (double)n); }

static void gemm(cublasHandle_t h, CUstream s, CUdeviceptr ws, CUdeviceptr a, CUdeviceptr c) {
    const float alpha = 1.0f / N, beta = 0.5f;
    BCHECK(cublasSetStream_v2(h, s));
    BCHECK(cublasSetWorkspace_v2(h, (void *)(uintptr_t)ws, 1 << 20));
    BCHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    BCHECK(cublasSgemm_v2(h, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &alpha, (const float *)(uintptr_t)a, N,
                          (const float *)(uintptr_t)a, N, &beta, (float *)(uintptr_t)c, N));
}

static void lt_product(cublasHandle_t h, CUstream s, CUdeviceptr ws, CUdeviceptr a, CUdeviceptr c, CUdeviceptr bias) {
    cublasLtHandle_t lt = (cublasLtHandle_t)h;
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    int32_t op = CUBLAS_OP_N;
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    void *bp = (void *)(uintptr_t)bias;
    uint64_t wsb = 1 << 20;
    BCHECK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    BCHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op));
    BCHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &op, sizeof op));
    BCHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    BCHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
    BCHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, N, N, N));
    BCHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, N, N, N));
    BCHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, N, N));
    BCHECK(cublasLtMatmulPreferenceCreate(&pref));
    BCHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t res;
    int count = 0;
    BCHECK(cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, lc, lc, pref, 1, &res, &count));
    if (count < 1) {
        fprintf(stderr, "blasbench: no cuBLASLt algorithm\n");
        exit(3);
    }
    const float alpha = 1.0f / N, beta = 0.5f;
    BCHECK(cublasLtMatmul(lt, d, &alpha, (const void *)(uintptr_t)a, la, (const void *)(uintptr_t)a, lb, &beta,
                          (const void *)(uintptr_t)c, lc, (void *)(uintptr_t)c, lc, &res.algo, (void *)(uintptr_t)ws,
                          wsb, s));
    BCHECK(cublasLtMatmulPreferenceDestroy(pref));
    BCHECK(cublasLtMatrixLayoutDestroy(lc));
    BCHECK(cublasLtMatrixLayoutDestroy(lb));
    BCHECK(cublasLtMatrixLayoutDestroy(la));
    BCHECK(cublasLtMatmulDescDestroy(d));
}

int main(int argc, char **argv) {
    long calls = 20000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc) {
            calls = atol(argv[++i]);
        } else {
            fprintf(stderr, "usage: blasbench [--calls N]\n");
            return 2;
        }
    }
    if (calls < 10) {
        fprintf(stderr, "blasbench: --calls must be at least 10\n");
        return 2;
    }
    CHECK(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr ws, a, c, bias;
    CHECK(cuMemAlloc(&ws, 1 << 20));
    CHECK(cuMemAlloc(&a, N * N * sizeof(float)));
    CHECK(cuMemAlloc(&c, N * N * sizeof(float)));
    CHECK(cuMemAlloc(&bias, N * sizeof(float)));
    CHECK(cuMemsetD32(a, 0x3c000000u, N * N)); /* 1/128 */
    CHECK(cuMemsetD32(c, 0, N * N));
    CHECK(cuMemsetD32(bias, 0, N));
    cublasHandle_t h;
    BCHECK(cublasCreate_v2(&h));
    printf("ready pid=%d app=blasbench\n", (int)getpid());
    fflush(stdout);

    for (long i = 0; i < calls / 10; i++)
        gemm(h, s, ws, a, c);
    CHECK(cuStreamSynchronize(s));
    double t0 = gpuapp_now_s();
    for (long i = 0; i < calls; i++)
        gemm(h, s, ws, a, c);
    CHECK(cuStreamSynchronize(s));
    report("gemm", gpuapp_now_s() - t0, calls);

    long lt_calls = calls / 10;
    for (long i = 0; i < lt_calls / 10 + 1; i++)
        lt_product(h, s, ws, a, c, bias);
    CHECK(cuStreamSynchronize(s));
    t0 = gpuapp_now_s();
    for (long i = 0; i < lt_calls; i++)
        lt_product(h, s, ws, a, c, bias);
    CHECK(cuStreamSynchronize(s));
    report("lt-product", gpuapp_now_s() - t0, lt_calls);
    fflush(stdout);

    BCHECK(cublasDestroy_v2(h));
    CUdeviceptr bufs[] = {ws, a, c, bias};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CHECK(cuMemFree(bufs[i]));
    CHECK(cuStreamDestroy(s));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}

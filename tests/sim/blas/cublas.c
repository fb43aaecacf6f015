/*
 * The simulated driver's cuBLAS (libcublas.so.13): handles, their settings,
 * and the general matrix products (gemm, strided batched, Ex) in float and
 * double, as kernels on the handle's stream (simblas.h).
 *
 * Arguments are checked as cuBLAS documents it: a NULL handle is
 * CUBLAS_STATUS_NOT_INITIALIZED; a negative size or count, an operation
 * other than N, T or C, a leading dimension below the rows it must hold (and
 * below 1) or a NULL alpha or beta is CUBLAS_STATUS_INVALID_VALUE; a type
 * combination the library does not compute is CUBLAS_STATUS_NOT_SUPPORTED;
 * a launch the driver refuses is CUBLAS_STATUS_EXECUTION_FAILED. Otherwise
 * the call only enqueues its work and returns.
 */
#include <stdlib.h>

#include "simblas.h"

struct cublasContext {
    sb_kernels k; /* first: the handle is a cuBLASLt handle too (cublaslt.c) */
    CUstream stream;
    cublasPointerMode_t pointer_mode;
    cublasMath_t math_mode;
    cublasAtomicsMode_t atomics_mode;
    void *workspace; /* cublasSetWorkspace's: kept, never needed by these kernels */
    size_t workspace_size;
};

SB_API cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    *handle = NULL;
    cublasHandle_t h = calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    cublasStatus_t st = sb_kernels_load(&h->k);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(h);
        return st;
    }
    h->pointer_mode = CUBLAS_POINTER_MODE_HOST;
    h->math_mode = CUBLAS_DEFAULT_MATH;
    h->atomics_mode = CUBLAS_ATOMICS_NOT_ALLOWED;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    sb_kernels_unload(&handle->k);
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

/* The library's version needs no handle; NVIDIA's takes a NULL one too. */
SB_API cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version) {
    (void)handle;
    if (!version)
        return CUBLAS_STATUS_INVALID_VALUE;
    *version = SB_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value) { return sb_property(type, value); }

SB_API size_t cublasGetCudartVersion(void) { return SB_CUDART_VERSION; }

SB_API const char *cublasGetStatusName(cublasStatus_t status) { return sb_status_name(status); }

SB_API const char *cublasGetStatusString(cublasStatus_t status) { return sb_status_string(status); }

SB_API cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = streamId;
    /* cuBLAS documents that setting the stream drops a workspace the user set */
    handle->workspace = NULL;
    handle->workspace_size = 0;
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!streamId)
        return CUBLAS_STATUS_INVALID_VALUE;
    *streamId = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

/* The workspace must be aligned to 256 bytes, as cuBLAS requires; NULL (size 0) goes back to the default. */
SB_API cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (((uintptr_t)workspace & 255) != 0 || (!workspace && workspaceSizeInBytes))
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->workspace = workspace;
    handle->workspace_size = workspaceSizeInBytes;
    return CUBLAS_STATUS_SUCCESS;
}

/* A math mode is one of the modes, optionally with DISALLOW_REDUCED_PRECISION_REDUCTION. None changes the results
 * here: the kernels compute in the element type (FAST_TF32 and tensor-op modes included). */
SB_API cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    unsigned base = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base > CUBLAS_FP32_EMULATED_BF16X9_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math_mode;
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* Atomics would only change the summation order of split reductions, which these kernels never make. */
SB_API cublasStatus_t cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_ATOMICS_NOT_ALLOWED && mode != CUBLAS_ATOMICS_ALLOWED)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->atomics_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasGetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t *mode) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->atomics_mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- gemm ---------------------------------------------------------------- */

/* op is N, T or C (C is T for real matrices); *t says whether it transposes. */
static int op_ok(cublasOperation_t op, uint32_t *t) {
    switch (op) {
    case CUBLAS_OP_N: *t = 0; return 1;
    case CUBLAS_OP_T:
    case CUBLAS_OP_C: *t = 1; return 1;
    case CUBLAS_OP_CONJG: break;
    }
    return 0;
}

static int max1(int x) { return x > 1 ? x : 1; }

/*
 * Every product of this library: batch products C_b = alpha * op(A_b) *
 * op(B_b) + beta * C_b, X_b at X + b * strideX elements (batch 1: the plain
 * gemm), f64 saying the element type.
 */
static cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                           const void *alpha, const void *A, int lda, long long sa, const void *B, int ldb,
                           long long sb, const void *beta, void *C, int ldc, long long sc, int batch, int f64) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    uint32_t ta, tb;
    if (!op_ok(transa, &ta) || !op_ok(transb, &tb) || m < 0 || n < 0 || k < 0 || batch < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < max1(ta ? k : m) || ldb < max1(tb ? n : k) || ldc < max1(m) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    sb_gemm g = {
        .f64 = f64,
        .device_scalars = h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE,
        .alpha = alpha,
        .beta = beta,
        .a = (CUdeviceptr)(uintptr_t)A,
        .b = (CUdeviceptr)(uintptr_t)B,
        .c = (CUdeviceptr)(uintptr_t)C,
        .d = (CUdeviceptr)(uintptr_t)C,
        .sa = sa,
        .sb = sb,
        .sc = sc,
        .sd = sc,
        .lda = (uint64_t)lda,
        .ldb = (uint64_t)ldb,
        .ldc = (uint64_t)ldc,
        .ldd = (uint64_t)ldc,
        .m = (uint32_t)m,
        .n = (uint32_t)n,
        .k = (uint32_t)k,
        .batch = (uint32_t)batch,
        .flags = (ta ? SBK_TRANSA : 0) | (tb ? SBK_TRANSB : 0),
    };
    return sb_gemm_launch(&h->k, &g, h->stream);
}

SB_API cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                     int n, int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                                     const float *beta, float *C, int ldc) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, 0);
}

SB_API cublasStatus_t cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                     int n, int k, const double *alpha, const double *A, int lda, const double *B,
                                     int ldb, const double *beta, double *C, int ldc) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, 1);
}

SB_API cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                cublasOperation_t transb, int m, int n, int k, const float *alpha,
                                                const float *A, int lda, long long int strideA, const float *B, int ldb,
                                                long long int strideB, const float *beta, float *C, int ldc,
                                                long long int strideC, int batchCount) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                batchCount, 0);
}

SB_API cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                cublasOperation_t transb, int m, int n, int k, const double *alpha,
                                                const double *A, int lda, long long int strideA, const double *B,
                                                int ldb, long long int strideB, const double *beta, double *C, int ldc,
                                                long long int strideC, int batchCount) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                batchCount, 1);
}

/* The algorithms cublasGemmEx names: DEFAULT, ALGO0..23, DEFAULT_TENSOR_OP and ALGO0_TENSOR_OP..ALGO15_TENSOR_OP.
 * Every one computes the same here. */
static int algo_ok(cublasGemmAlgo_t algo) {
    int a = (int)algo;
    return a == CUBLAS_GEMM_DEFAULT || (a >= 0 && a <= 23) || (a >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && a <= 115);
}

/*
 * The Ex products' element type: float for A, B and C all CUDA_R_32F with a
 * 32-bit float compute type (FAST_TF32 computed in full float), double for
 * all CUDA_R_64F with COMPUTE_64F; -1 for what this library does not compute.
 */
static int ex_type(cudaDataType at, cudaDataType bt, cudaDataType ct, cublasComputeType_t compute) {
    if (at == CUDA_R_32F && bt == CUDA_R_32F && ct == CUDA_R_32F &&
        (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_TF32))
        return 0;
    if (at == CUDA_R_64F && bt == CUDA_R_64F && ct == CUDA_R_64F && compute == CUBLAS_COMPUTE_64F)
        return 1;
    return -1;
}

SB_API cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                   int n, int k, const void *alpha, const void *A, cudaDataType Atype, int lda,
                                   const void *B, cudaDataType Btype, int ldb, const void *beta, void *C,
                                   cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                   cublasGemmAlgo_t algo) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int f64 = ex_type(Atype, Btype, Ctype, computeType);
    if (f64 < 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!algo_ok(algo))
        return CUBLAS_STATUS_INVALID_VALUE;
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, f64);
}

SB_API cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                                 cublasOperation_t transb, int m, int n, int k, const void *alpha,
                                                 const void *A, cudaDataType Atype, int lda, long long int strideA,
                                                 const void *B, cudaDataType Btype, int ldb, long long int strideB,
                                                 const void *beta, void *C, cudaDataType Ctype, int ldc,
                                                 long long int strideC, int batchCount, cublasComputeType_t computeType,
                                                 cublasGemmAlgo_t algo) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int f64 = ex_type(Atype, Btype, Ctype, computeType);
    if (f64 < 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!algo_ok(algo))
        return CUBLAS_STATUS_INVALID_VALUE;
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                batchCount, f64);
}

/*
 * The simulated driver's cuBLAS (libcublas.so.13): handles, their settings,
 * the general matrix products (gemm, strided batched, Ex), the matrix-vector
 * product (gemv) and the dot product in float and double, as kernels on the
 * handle's stream (simblas.h).
 *
 * Arguments are checked as NVIDIA's cuBLAS 13 checks them (measured on an
 * H200 with blastest --nvidia and probes): a NULL handle is
 * CUBLAS_STATUS_NOT_INITIALIZED; for the products a negative size or count,
 * an operation other than N, T or C, a leading dimension below the rows it
 * must hold (and below 1) or a NULL alpha or beta is
 * CUBLAS_STATUS_INVALID_VALUE, but for cublasGemmStridedBatchedEx, whose
 * negative batch count reaches a launch that fails (EXECUTION_FAILED); a
 * type combination the library does not compute is
 * CUBLAS_STATUS_NOT_SUPPORTED; a launch the driver refuses is
 * CUBLAS_STATUS_EXECUTION_FAILED. gemv and dot check less (see there): an
 * empty or negative size is a quick return, an increment of 0 a step of 0.
 * Otherwise the call only enqueues its work and returns, but for a dot
 * product into host memory, which waits for it.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "simblas.h"

struct cublasContext {
    sb_kernels k; /* first: the handle is a cuBLASLt handle too (cublaslt.c) */
    CUstream stream;
    cublasPointerMode_t pointer_mode;
    cublasMath_t math_mode;
    cublasAtomicsMode_t atomics_mode;
    /* cublasSetWorkspace's, until cublasSetStream goes back to the default pool (user_workspace false): only the dot
     * product needs room in it (ws_room) */
    bool user_workspace;
    void *workspace;
    size_t workspace_size;
    /* A host-mode dot's result on the device, made at the first one; scratch_mu keeps a second thread's dot on the
     * handle from writing it before the first one's result came back. */
    pthread_mutex_t scratch_mu;
    CUdeviceptr scratch;
};

/*
 * cuBLAS's API log, as NVIDIA's library writes it when its process's environment asks (CUBLAS_LOGINFO_DBG=1, to
 * CUBLAS_LOGDEST_DBG: stdout, stderr or a file), read at each call as the library reads it. Only handle creation
 * is logged here: what tells a test which process's environment the library saw.
 */
static void api_log(const char *fn) {
    const char *on = getenv("CUBLAS_LOGINFO_DBG"), *dest = getenv("CUBLAS_LOGDEST_DBG");
    if (!on || strcmp(on, "1") != 0 || !dest || !*dest)
        return;
    bool std_out = strcmp(dest, "stdout") == 0, std_err = strcmp(dest, "stderr") == 0;
    FILE *f = std_out ? stdout : std_err ? stderr : fopen(dest, "a");
    if (!f)
        return;
    fprintf(f, "I! cuBLAS (v13.0) function %s() called (pid %d)\n", fn, (int)getpid());
    if (std_out || std_err)
        fflush(f);
    else
        fclose(f);
}

SB_API cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    api_log("cublasCreate_v2");
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    *handle = NULL;
    cublasHandle_t h = calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    if (pthread_mutex_init(&h->scratch_mu, NULL) != 0) {
        free(h);
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    cublasStatus_t st = sb_kernels_load(&h->k, true);
    if (st != CUBLAS_STATUS_SUCCESS) {
        /* a mutex nobody locked: destroying it cannot fail */
        (void)pthread_mutex_destroy(&h->scratch_mu);
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
    if (handle->scratch) {
        /* As the module: a failure means the context went first and took the memory with it. */
        CUresult r = cuMemFree(handle->scratch);
        (void)r;
    }
    sb_kernels_unload(&handle->k);
    /* fails only while another thread's dot holds it, a use after destroy that cuBLAS does not define either */
    (void)pthread_mutex_destroy(&handle->scratch_mu);
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
    handle->user_workspace = false;
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

/*
 * NVIDIA's takes any pointer and size (measured: every offset from a 256-byte boundary, sizes of 1 or 3 bytes, and
 * NULL with a size are all SUCCESS); what does not fit shows when a function needs the room (ws_room). NULL with
 * size 0 is a workspace of no room too, not the default pool back: only cublasSetStream gives that.
 */
SB_API cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->user_workspace = true;
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
 * Whether beta, in host pointer mode, is a negative zero that NVIDIA's
 * strided batched products multiply C by: for two or more matrices they read
 * C unless beta's bits are all zero (measured: C of NaN gives NaN with beta
 * -0.0 for every size, operation and element type tried), where a single
 * product's kernels differ from one shape to the next and device pointer
 * mode never reads C for a zero beta. So C is read here then too
 * (SBK_READ_C); everywhere else -0.0 counts as zero.
 */
static int negative_zero_beta(const void *beta, int f64) {
    if (f64) {
        double b;
        memcpy(&b, beta, sizeof b);
        return b == 0 && signbit(b);
    }
    float b;
    memcpy(&b, beta, sizeof b);
    return b == 0 && signbit(b);
}

/*
 * Every product of this library: batch products C_b = alpha * op(A_b) *
 * op(B_b) + beta * C_b, X_b at X + b * strideX elements (batch 1, strided
 * false: the plain gemm), f64 saying the element type. neg_batch is the
 * status of a negative batch count once every other argument passed.
 */
static cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                           const void *alpha, const void *A, int lda, long long sa, const void *B, int ldb,
                           long long sb, const void *beta, void *C, int ldc, long long sc, int batch, int f64,
                           bool strided, cublasStatus_t neg_batch) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    uint32_t ta, tb;
    if (!op_ok(transa, &ta) || !op_ok(transb, &tb) || m < 0 || n < 0 || k < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < max1(ta ? k : m) || ldb < max1(tb ? n : k) || ldc < max1(m) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (batch < 0)
        return neg_batch;
    bool device_scalars = h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE;
    bool read_c = strided && batch >= 2 && !device_scalars && negative_zero_beta(beta, f64);
    sb_gemm g = {
        .f64 = f64,
        .device_scalars = device_scalars,
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
        .flags = (ta ? SBK_TRANSA : 0) | (tb ? SBK_TRANSB : 0) | (read_c ? SBK_READ_C : 0),
    };
    return sb_gemm_launch(&h->k, &g, h->stream);
}

SB_API cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                     int n, int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                                     const float *beta, float *C, int ldc) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, 0, false,
                CUBLAS_STATUS_INVALID_VALUE);
}

SB_API cublasStatus_t cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                     int n, int k, const double *alpha, const double *A, int lda, const double *B,
                                     int ldb, const double *beta, double *C, int ldc) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, 1, false,
                CUBLAS_STATUS_INVALID_VALUE);
}

SB_API cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                cublasOperation_t transb, int m, int n, int k, const float *alpha,
                                                const float *A, int lda, long long int strideA, const float *B, int ldb,
                                                long long int strideB, const float *beta, float *C, int ldc,
                                                long long int strideC, int batchCount) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                batchCount, 0, true, CUBLAS_STATUS_INVALID_VALUE);
}

SB_API cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                cublasOperation_t transb, int m, int n, int k, const double *alpha,
                                                const double *A, int lda, long long int strideA, const double *B,
                                                int ldb, long long int strideB, const double *beta, double *C, int ldc,
                                                long long int strideC, int batchCount) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                batchCount, 1, true, CUBLAS_STATUS_INVALID_VALUE);
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
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, f64, false,
                CUBLAS_STATUS_INVALID_VALUE);
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
    /*
     * NVIDIA's takes a negative batch count to a kernel launch: for the small float products measured (m, n and k up
     * to 16, N and N) the launch fails and the call is EXECUTION_FAILED with C untouched; other kernels (double,
     * larger or transposed products, and with another workspace) return SUCCESS having done nothing. Here: the
     * former, for every shape.
     */
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                batchCount, f64, true, CUBLAS_STATUS_EXECUTION_FAILED);
}

/* ---- gemv and dot ---------------------------------------------------------- */

/*
 * y = alpha * op(A) * x + beta * y, A m x n: the gemv kernel with op(A)'s
 * rows as its rows, as NVIDIA's cuBLAS 13 does it (measured):
 *  - m <= 0 or n <= 0 returns at once, y untouched, before anything is
 *    checked (a negative size is no error, nor is lda then);
 *  - N and CONJG (the conjugate of a real matrix is itself) compute A * x,
 *    T and C A^T * x, both with lda >= max(1, m);
 *  - any other operation computes as T would on an n x m matrix: y has m
 *    elements, x n, element (i, l) of op(A) is A[l + i * lda], and lda must
 *    be at least max(1, n);
 *  - an increment of 0 is a step of 0 (every element of x is x[0]; every
 *    element of y is y[0], which the rows write in an order of their own).
 * A NULL alpha or beta (which NVIDIA's reads without a check) is
 * INVALID_VALUE here.
 */
static cublasStatus_t gemv(cublasHandle_t h, cublasOperation_t trans, int m, int n, const void *alpha, const void *A,
                           int lda, const void *x, int incx, const void *beta, void *y, int incy, int f64) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m <= 0 || n <= 0)
        return CUBLAS_STATUS_SUCCESS;
    uint32_t rows, cols;
    int64_t rs, cs;
    int need;
    switch (trans) {
    case CUBLAS_OP_N:
    case CUBLAS_OP_CONJG: rows = (uint32_t)m, cols = (uint32_t)n, rs = 1, cs = lda, need = m; break;
    case CUBLAS_OP_T:
    case CUBLAS_OP_C: rows = (uint32_t)n, cols = (uint32_t)m, rs = lda, cs = 1, need = m; break;
    default: rows = (uint32_t)m, cols = (uint32_t)n, rs = lda, cs = 1, need = n; break;
    }
    if (lda < max1(need) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    size_t es = f64 ? sizeof(double) : sizeof(float);
    sb_gemv v = {
        .f64 = f64,
        .device_scalars = h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE,
        .alpha = alpha,
        .beta = beta,
        .a = (CUdeviceptr)(uintptr_t)A,
        .x = sb_vec_origin(x, cols, incx, es),
        .y = sb_vec_origin(y, rows, incy, es),
        .rs = rs,
        .cs = cs,
        .incx = incx,
        .incy = incy,
        .rows = rows,
        .cols = cols,
    };
    return sb_gemv_launch(&h->k, &v, h->stream);
}

SB_API cublasStatus_t cublasSgemv_v2(cublasHandle_t handle, cublasOperation_t trans, int m, int n, const float *alpha,
                                     const float *A, int lda, const float *x, int incx, const float *beta, float *y,
                                     int incy) {
    return gemv(handle, trans, m, n, alpha, A, lda, x, incx, beta, y, incy, 0);
}

SB_API cublasStatus_t cublasDgemv_v2(cublasHandle_t handle, cublasOperation_t trans, int m, int n, const double *alpha,
                                     const double *A, int lda, const double *x, int incx, const double *beta, double *y,
                                     int incy) {
    return gemv(handle, trans, m, n, alpha, A, lda, x, incx, beta, y, incy, 1);
}

/*
 * A dot product into host memory: the kernel writes the handle's scratch
 * element, which comes back once the stream has run everything up to it, so
 * the call returns with the result in place as cuBLAS's does. ALLOC_FAILED
 * if there is no scratch (cuBLAS's "the reduction buffer could not be
 * allocated"); EXECUTION_FAILED if the stream's work failed.
 */
static cublasStatus_t dot_to_host(cublasHandle_t h, sb_gemv *v, void *result, size_t es) {
    unsigned char val[sizeof(double)];
    if (pthread_mutex_lock(&h->scratch_mu) != 0)
        return CUBLAS_STATUS_INTERNAL_ERROR;
    /* the scratch goes where the launch goes: the current context, or the handle's */
    cublasStatus_t st = sb_enter(&h->k);
    if (st == CUBLAS_STATUS_SUCCESS && !h->scratch && cuMemAlloc(&h->scratch, sizeof val) != CUDA_SUCCESS) {
        h->scratch = 0;
        st = CUBLAS_STATUS_ALLOC_FAILED;
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        v->y = h->scratch;
        st = sb_gemv_launch(&h->k, v, h->stream);
    }
    if (st == CUBLAS_STATUS_SUCCESS && (cuMemcpyDtoHAsync(val, h->scratch, es, h->stream) != CUDA_SUCCESS ||
                                        cuStreamSynchronize(h->stream) != CUDA_SUCCESS))
        st = CUBLAS_STATUS_EXECUTION_FAILED;
    if (pthread_mutex_unlock(&h->scratch_mu) != 0 && st == CUBLAS_STATUS_SUCCESS)
        st = CUBLAS_STATUS_INTERNAL_ERROR;
    if (st == CUBLAS_STATUS_SUCCESS)
        memcpy(result, val, es);
    return st;
}

/*
 * Whether the handle's workspace has room for a dot product's partial
 * result, one element of es bytes: always in the default pool; in a user's
 * workspace (cublasSetWorkspace) what lies from the first 256-byte boundary
 * at or after its start to its end (measured: 4 bytes at a boundary do for
 * a float sum whatever n, not for a double one; 64 bytes 4 to 192 bytes
 * before a boundary do not, 300 do; no room at all, NULL and 0 included,
 * makes every dot NOT_SUPPORTED, in either pointer mode). A NULL workspace
 * with a size is taken as room here, where NVIDIA's faults (MAPPING_ERROR,
 * and the context is lost).
 */
static bool ws_room(const struct cublasContext *h, size_t es) {
    if (!h->user_workspace)
        return true;
    uintptr_t p = (uintptr_t)h->workspace, pad = (256 - (p & 255)) & 255;
    return h->workspace_size >= pad && h->workspace_size - pad >= es;
}

/*
 * result = sum of x[i] * y[i]: the gemv kernel with one row, x as that row
 * (its step incx), y as the vector, alpha 1 and beta 0 (so the sum is the
 * accumulator's bits), written to result on the device or, in host pointer
 * mode, through dot_to_host. n <= 0 is BLAS's quick return: the result is 0.
 * An increment of 0 is a step of 0, as in NVIDIA's (measured: x[0] times
 * every y). NOT_SUPPORTED, the result untouched, if the user's workspace has
 * no room for it (ws_room).
 */
static cublasStatus_t dot(cublasHandle_t h, int n, const void *x, int incx, const void *y, int incy, void *result,
                          int f64) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!result)
        return CUBLAS_STATUS_INVALID_VALUE;
    static const float one32 = 1, zero32 = 0;
    static const double one64 = 1, zero64 = 0;
    size_t es = f64 ? sizeof(double) : sizeof(float);
    uint32_t len = n > 0 ? (uint32_t)n : 0;
    if (len && !ws_room(h, es))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    sb_gemv v = {
        .f64 = f64,
        .alpha = f64 ? (const void *)&one64 : (const void *)&one32,
        .beta = f64 ? (const void *)&zero64 : (const void *)&zero32,
        .a = sb_vec_origin(x, len, incx, es),
        .x = sb_vec_origin(y, len, incy, es),
        .rs = 0,
        .cs = incx,
        .incx = incy,
        .incy = 1,
        .rows = 1,
        .cols = len,
    };
    if (h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE) {
        /* in stream order, the empty sum included: a later kernel reading the result finds the 0 */
        v.y = (CUdeviceptr)(uintptr_t)result;
        return sb_gemv_launch(&h->k, &v, h->stream);
    }
    if (len == 0) {
        memcpy(result, f64 ? (const void *)&zero64 : (const void *)&zero32, es);
        return CUBLAS_STATUS_SUCCESS;
    }
    return dot_to_host(h, &v, result, es);
}

SB_API cublasStatus_t cublasSdot_v2(cublasHandle_t handle, int n, const float *x, int incx, const float *y, int incy,
                                    float *result) {
    return dot(handle, n, x, incx, y, incy, result, 0);
}

SB_API cublasStatus_t cublasDdot_v2(cublasHandle_t handle, int n, const double *x, int incx, const double *y, int incy,
                                    double *result) {
    return dot(handle, n, x, incx, y, incy, result, 1);
}

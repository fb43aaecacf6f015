/*
 * Served mode's cuBLAS (libcublas.so.13; common.h). A handle is a virtual id
 * whose settings are kept here: PyTorch sets the stream, the workspace and
 * the math mode before every operation, so a setting travels to the worker
 * only when it changes, and the stream travels with each operation. The
 * operations are asynchronous records, as cuBLAS queues them on the stream;
 * arguments NVIDIA's cuBLAS 13 was measured to refuse are refused here, at the
 * call, with its status, and what it was measured to take travels (gemv's and
 * dot's odd arguments); arguments its documentation calls invalid that nobody
 * measured make the record a probe, which NVIDIA's library answers at the call
 * (bl_probe).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define LIB "cuBLAS"

/*
 * A handle's settings (SV_K_BLAS data), what a new worker's handle gets again. The workspace is the process's
 * (ws_set: cublasSetWorkspace's, until cublasSetStream gives the default pool back, as NVIDIA's does) and the
 * worker's handle's as last sent (sent_*): ws_send makes them one before each operation, so PyTorch's
 * cublasSetStream and cublasSetWorkspace of the same workspace before every product send nothing.
 */
typedef struct {
    pthread_mutex_t mu;
    uint32_t stream;
    int32_t ptr_mode, math, atomics;
    uint64_t ws, ws_size, sent_ws, sent_size;
    bool ws_set, sent_set;
    bool math_set, atomics_set; /* set by the process: sent to a new worker's handle */
} bl_handle;

static bl_handle *handle_of(const struct sv_ext *x, cublasHandle_t h, uint32_t *id) {
    *id = x->id_of(SV_K_BLAS, h);
    return *id ? x->id_data(SV_K_BLAS, *id) : NULL;
}

/* The handle for a call, served mode's library and the handle's id with it (NULL: not a live handle). */
#define HANDLE(h, x, id, b)                                                                                            \
    const struct sv_ext *x = bl_ext();                                                                                 \
    uint32_t id = 0;                                                                                                   \
    bl_handle *b = x ? handle_of(x, h, &id) : NULL;                                                                    \
    if (!b)                                                                                                            \
    return CUBLAS_STATUS_NOT_INITIALIZED

static cublasStatus_t send_set(const struct sv_ext *x, uint32_t id, uint32_t what, uint64_t a, uint64_t b) {
    struct sv_blas_set q = {id, what, a, b};
    return bl_async(x, SV_OP_BLAS_SET, &q, sizeof q, SV_EXT_NO_STREAM);
}

/* The process's workspace to the worker's handle, where it differs from what that has. */
static cublasStatus_t ws_send(const struct sv_ext *x, uint32_t id, bl_handle *b) {
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    pthread_mutex_lock(&b->mu);
    if (b->ws_set != b->sent_set || (b->ws_set && (b->ws != b->sent_ws || b->ws_size != b->sent_size))) {
        st = b->ws_set ? send_set(x, id, SV_BS_WORKSPACE, b->ws, b->ws_size)
                       : send_set(x, id, SV_BS_WORKSPACE_DEFAULT, 0, 0);
        if (st == CUBLAS_STATUS_SUCCESS) {
            b->sent_set = b->ws_set;
            b->sent_ws = b->ws;
            b->sent_size = b->ws_size;
        }
    }
    pthread_mutex_unlock(&b->mu);
    return st;
}

static cublasStatus_t create_in_worker(const struct sv_ext *x, uint32_t id) {
    struct sv_id_rec q = {id, 0};
    return bl_sync(x, SV_OP_BLAS_CREATE, &q, sizeof q, NULL, 0, NULL);
}

/* A new worker: the library again, then each live handle with what the process set on it. */
static CUresult replay(void) {
    bool had;
    if (bl_reload(BL_CUBLAS, &had) != CUBLAS_STATUS_SUCCESS)
        return CUDA_ERROR_NOT_INITIALIZED;
    const struct sv_ext *x = bl_ext();
    if (!had || !x)
        return CUDA_SUCCESS;
    for (uint32_t id = 1, end = x->id_end(SV_K_BLAS); id < end; id++) {
        bl_handle *b = x->id_live(SV_K_BLAS, id) ? x->id_data(SV_K_BLAS, id) : NULL;
        if (!b)
            continue;
        cublasStatus_t st = create_in_worker(x, id);
        b->sent_set = false; /* a new handle's: the default pool */
        if (st == CUBLAS_STATUS_SUCCESS)
            st = ws_send(x, id, b);
        if (st == CUBLAS_STATUS_SUCCESS && b->math_set)
            st = send_set(x, id, SV_BS_MATH, (uint64_t)b->math, 0);
        if (st == CUBLAS_STATUS_SUCCESS && b->ptr_mode != CUBLAS_POINTER_MODE_HOST)
            st = send_set(x, id, SV_BS_POINTER, (uint64_t)b->ptr_mode, 0);
        if (st == CUBLAS_STATUS_SUCCESS && b->atomics_set)
            st = send_set(x, id, SV_BS_ATOMICS, (uint64_t)b->atomics, 0);
        if (st != CUBLAS_STATUS_SUCCESS) {
            x->warn("served mode: the new worker could not make cuBLAS handle %u again: %s", id, bl_status_name(st));
            return CUDA_ERROR_UNKNOWN;
        }
    }
    return CUDA_SUCCESS;
}

BL_API cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    const struct sv_ext *x;
    cublasStatus_t st = bl_ready(BL_CUBLAS, &x);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    x->on_replay(replay);
    bl_ctx_current(); /* as the CUDA runtime in NVIDIA's makes the primary context current */
    uint32_t id = x->id_new(SV_K_BLAS);
    bl_handle *b = calloc(1, sizeof *b);
    if (!id || !b) {
        free(b);
        if (id)
            x->id_drop(SV_K_BLAS, id);
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    pthread_mutex_init(&b->mu, NULL);
    b->ptr_mode = CUBLAS_POINTER_MODE_HOST;
    if ((st = create_in_worker(x, id)) != CUBLAS_STATUS_SUCCESS) {
        free(b);
        x->id_drop(SV_K_BLAS, id);
        return st;
    }
    x->id_set(SV_K_BLAS, id, b);
    *handle = (cublasHandle_t)x->handle(SV_K_BLAS, id);
    return CUBLAS_STATUS_SUCCESS;
}

BL_API cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    HANDLE(handle, x, id, b);
    struct sv_id_rec q = {id, 0};
    x->id_drop(SV_K_BLAS, id); /* frees b */
    return bl_async(x, SV_OP_BLAS_DESTROY, &q, sizeof q, SV_EXT_NO_STREAM);
}

/* The stream, and the default workspace pool again (NVIDIA's does that whatever the stream: measured). */
BL_API cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
    HANDLE(handle, x, id, b);
    uint32_t s;
    if (x->stream(streamId, &s) != CUDA_SUCCESS)
        return CUBLAS_STATUS_INVALID_VALUE;
    pthread_mutex_lock(&b->mu);
    b->stream = s;
    b->ws_set = false;
    pthread_mutex_unlock(&b->mu);
    return CUBLAS_STATUS_SUCCESS;
}

BL_API cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId) {
    HANDLE(handle, x, id, b);
    if (!streamId)
        return CUBLAS_STATUS_INVALID_VALUE;
    *streamId = x->stream_handle(b->stream);
    return CUBLAS_STATUS_SUCCESS;
}

/*
 * Any pointer and size, as NVIDIA's takes them (measured: misaligned, a few bytes, NULL with a size; NULL and 0 is
 * a workspace of no room, not the default pool): what does not fit shows where a function needs the room. It
 * reaches the worker's handle with the next operation (ws_send).
 */
BL_API cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes) {
    HANDLE(handle, x, id, b);
    pthread_mutex_lock(&b->mu);
    b->ws = (uint64_t)(uintptr_t)workspace;
    b->ws_size = workspaceSizeInBytes;
    b->ws_set = true;
    pthread_mutex_unlock(&b->mu);
    return CUBLAS_STATUS_SUCCESS;
}

BL_API cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    HANDLE(handle, x, id, b);
    pthread_mutex_lock(&b->mu);
    bool same = b->math == (int32_t)mode;
    b->math = (int32_t)mode;
    b->math_set = true;
    pthread_mutex_unlock(&b->mu);
    return same ? CUBLAS_STATUS_SUCCESS : send_set(x, id, SV_BS_MATH, (uint64_t)mode, 0);
}

BL_API cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
    HANDLE(handle, x, id, b);
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = (cublasMath_t)b->math;
    return CUBLAS_STATUS_SUCCESS;
}

BL_API cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
    HANDLE(handle, x, id, b);
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* Kept here: each operation says how its scalars come, and the worker sets the mode as it needs it. */
    b->ptr_mode = (int32_t)mode;
    return CUBLAS_STATUS_SUCCESS;
}

BL_API cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode) {
    HANDLE(handle, x, id, b);
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = (cublasPointerMode_t)b->ptr_mode;
    return CUBLAS_STATUS_SUCCESS;
}

BL_API cublasStatus_t cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode) {
    HANDLE(handle, x, id, b);
    b->atomics = (int32_t)mode;
    b->atomics_set = true;
    return send_set(x, id, SV_BS_ATOMICS, (uint64_t)mode, 0);
}

BL_API cublasStatus_t cublasGetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t *mode) {
    HANDLE(handle, x, id, b);
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = (cublasAtomicsMode_t)b->atomics;
    return CUBLAS_STATUS_SUCCESS;
}

BL_API cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version) {
    HANDLE(handle, x, id, b);
    if (!version)
        return CUBLAS_STATUS_INVALID_VALUE;
    *version = (int)bl_info_of(BL_CUBLAS)->version;
    return CUBLAS_STATUS_SUCCESS;
}

BL_API cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value) {
    return bl_property(BL_CUBLAS, type, value);
}

BL_API size_t cublasGetCudartVersion(void) {
    const struct sv_ext *x;
    return bl_ready(BL_CUBLAS, &x) == CUBLAS_STATUS_SUCCESS ? (size_t)bl_info_of(BL_CUBLAS)->cudart_version : 0;
}

BL_API const char *cublasGetStatusName(cublasStatus_t status) { return bl_status_name(status); }
BL_API const char *cublasGetStatusString(cublasStatus_t status) { return bl_status_string(status); }

/* ---- the gemm family ---- */

static bool trans_ok(cublasOperation_t t) { return t == CUBLAS_OP_N || t == CUBLAS_OP_T || t == CUBLAS_OP_C; }
static int imax1(int a) { return a > 1 ? a : 1; }

/* alpha and beta into a record: their device addresses (pointer mode device), or scalar bytes of each. */
static void put_scalars(bool dev, const void *alpha, const void *beta, size_t scalar, uint8_t a[16], uint8_t b[16]) {
    if (dev) {
        uint64_t pa = (uint64_t)(uintptr_t)alpha, pb = (uint64_t)(uintptr_t)beta;
        memcpy(a, &pa, sizeof pa);
        memcpy(b, &pb, sizeof pb);
    } else {
        memcpy(a, alpha, scalar);
        memcpy(b, beta, scalar);
    }
}

/*
 * An operation's record on handle id (b), queued past the interposer's gate: the thread given the handle's
 * context where it has none, the process's workspace sent first where the worker's handle has another, then the
 * record, asynchronous or, with probe, synchronous (bl_probe: NVIDIA's answer at the call).
 */
static cublasStatus_t queue(const struct sv_ext *x, uint32_t id, bl_handle *b, unsigned op, const void *q, uint32_t len,
                            uint32_t stream, bool probe) {
    bl_ctx_current();
    bl_gate_enter();
    cublasStatus_t st = ws_send(x, id, b);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = probe ? bl_probe(x, op, q, len, stream) : bl_async(x, op, q, len, stream);
    bl_gate_leave();
    return st;
}

/*
 * Checks the arguments as NVIDIA's cuBLAS 13 does (measured, blastest's gemm_errors): a NULL alpha or beta, a
 * negative size, an operation other than N, T, C (and CONJG, below) or a leading dimension below the rows it holds
 * (and below 1) is INVALID_VALUE, as is a negative count but for cublasGemmStridedBatchedEx's, which NVIDIA takes
 * to a launch once every other argument passed: its answer depends on the kernel (EXECUTION_FAILED for a small
 * float product, SUCCESS having done nothing for others), so the record is sent and the worker's library answers
 * at the call. So does CONJG, which nobody measured in a product (gemv computes it as N). An empty product returns
 * at once. Then the record is queued; scalar bytes each of alpha and beta.
 */
static cublasStatus_t gemm(cublasHandle_t handle, uint32_t fn, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, const void *alpha, const void *A, int atype, int lda, long long sa, const void *B,
                           int btype, int ldb, long long sb, const void *beta, void *C, int ctype, int ldc,
                           long long sc, int batch, int compute, int algo, size_t scalar) {
    HANDLE(handle, x, id, b);
    if (!alpha || !beta || scalar == 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    bool probe = ta == CUBLAS_OP_CONJG || tb == CUBLAS_OP_CONJG;
    if (!probe) {
        if (!trans_ok(ta) || !trans_ok(tb) || m < 0 || n < 0 || k < 0 || lda < imax1(ta == CUBLAS_OP_N ? m : k) ||
            ldb < imax1(tb == CUBLAS_OP_N ? k : n) || ldc < imax1(m))
            return CUBLAS_STATUS_INVALID_VALUE;
        if (batch < 0 && fn != SV_GEMM_EX_STRIDED)
            return CUBLAS_STATUS_INVALID_VALUE;
        probe = batch < 0;
        if (!probe && (m == 0 || n == 0 || batch == 0))
            return CUBLAS_STATUS_SUCCESS; /* nothing to compute: cuBLAS returns at once */
    }
    struct sv_gemm_rec q;
    memset(&q, 0, sizeof q);
    q.handle = id;
    q.stream = b->stream;
    q.fn = fn;
    q.dev_scalars = b->ptr_mode == CUBLAS_POINTER_MODE_DEVICE;
    q.transa = (uint32_t)ta;
    q.transb = (uint32_t)tb;
    q.m = m, q.n = n, q.k = k, q.lda = lda, q.ldb = ldb, q.ldc = ldc, q.batch = batch;
    q.atype = atype, q.btype = btype, q.ctype = ctype, q.compute = compute, q.algo = algo;
    q.a = (uint64_t)(uintptr_t)A, q.b = (uint64_t)(uintptr_t)B, q.c = (uint64_t)(uintptr_t)C;
    q.stride_a = sa, q.stride_b = sb, q.stride_c = sc;
    put_scalars(q.dev_scalars, alpha, beta, scalar, q.alpha, q.beta);
    return queue(x, id, b, SV_OP_BLAS_GEMM, &q, sizeof q, q.stream, probe);
}

BL_API cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                     int n, int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                                     const float *beta, float *C, int ldc) {
    return gemm(handle, SV_GEMM_S, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0, beta,
                C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT, sizeof(float));
}

BL_API cublasStatus_t cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                     int n, int k, const double *alpha, const double *A, int lda, const double *B,
                                     int ldb, const double *beta, double *C, int ldc) {
    return gemm(handle, SV_GEMM_D, transa, transb, m, n, k, alpha, A, CUDA_R_64F, lda, 0, B, CUDA_R_64F, ldb, 0, beta,
                C, CUDA_R_64F, ldc, 0, 1, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT, sizeof(double));
}

BL_API cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                   int n, int k, const void *alpha, const void *A, cudaDataType Atype, int lda,
                                   const void *B, cudaDataType Btype, int ldb, const void *beta, void *C,
                                   cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                   cublasGemmAlgo_t algo) {
    return gemm(handle, SV_GEMM_EX, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C, Ctype,
                ldc, 0, 1, computeType, algo, bl_compute_scalar(computeType, Ctype));
}

BL_API cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                cublasOperation_t transb, int m, int n, int k, const float *alpha,
                                                const float *A, int lda, long long int strideA, const float *B, int ldb,
                                                long long int strideB, const float *beta, float *C, int ldc,
                                                long long int strideC, int batchCount) {
    return gemm(handle, SV_GEMM_S_STRIDED, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, strideA, B, CUDA_R_32F,
                ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC, batchCount, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT,
                sizeof(float));
}

BL_API cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                cublasOperation_t transb, int m, int n, int k, const double *alpha,
                                                const double *A, int lda, long long int strideA, const double *B,
                                                int ldb, long long int strideB, const double *beta, double *C, int ldc,
                                                long long int strideC, int batchCount) {
    return gemm(handle, SV_GEMM_D_STRIDED, transa, transb, m, n, k, alpha, A, CUDA_R_64F, lda, strideA, B, CUDA_R_64F,
                ldb, strideB, beta, C, CUDA_R_64F, ldc, strideC, batchCount, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT,
                sizeof(double));
}

BL_API cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                                 cublasOperation_t transb, int m, int n, int k, const void *alpha,
                                                 const void *A, cudaDataType Atype, int lda, long long int strideA,
                                                 const void *B, cudaDataType Btype, int ldb, long long int strideB,
                                                 const void *beta, void *C, cudaDataType Ctype, int ldc,
                                                 long long int strideC, int batchCount, cublasComputeType_t computeType,
                                                 cublasGemmAlgo_t algo) {
    return gemm(handle, SV_GEMM_EX_STRIDED, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo,
                bl_compute_scalar(computeType, Ctype));
}

/* ---- gemv and dot ---- */

/*
 * gemv's arguments as NVIDIA's cuBLAS 13 checks them (measured, blastest's gemv_errors and gemv_odd_args), not
 * as BLAS would: m or n <= 0 returns at once, before anything else is looked at, and does nothing; then only lda
 * is checked, against m for N, T, C and CONJG and against n for any other operation (which NVIDIA computes as T on
 * an n x m matrix; CONJG as N). An increment of 0 is a step of 0, computed. A NULL alpha or beta, which NVIDIA's
 * reads without a check, is INVALID_VALUE here (its values travel in the record).
 */
static cublasStatus_t gemv(cublasHandle_t handle, uint32_t fn, cublasOperation_t trans, int m, int n, const void *alpha,
                           const void *A, int lda, const void *xv, int incx, const void *beta, void *y, int incy,
                           size_t scalar) {
    HANDLE(handle, x, id, b);
    if (m <= 0 || n <= 0)
        return CUBLAS_STATUS_SUCCESS;
    bool by_m = trans == CUBLAS_OP_N || trans == CUBLAS_OP_T || trans == CUBLAS_OP_C || trans == CUBLAS_OP_CONJG;
    if (lda < imax1(by_m ? m : n) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct sv_gemv_rec q;
    memset(&q, 0, sizeof q);
    q.handle = id;
    q.stream = b->stream;
    q.fn = fn;
    q.dev_scalars = b->ptr_mode == CUBLAS_POINTER_MODE_DEVICE;
    q.trans = (uint32_t)trans;
    q.m = m, q.n = n, q.lda = lda, q.incx = incx, q.incy = incy;
    q.a = (uint64_t)(uintptr_t)A, q.x = (uint64_t)(uintptr_t)xv, q.y = (uint64_t)(uintptr_t)y;
    put_scalars(q.dev_scalars, alpha, beta, scalar, q.alpha, q.beta);
    return queue(x, id, b, SV_OP_BLAS_GEMV, &q, sizeof q, q.stream, false);
}

BL_API cublasStatus_t cublasSgemv_v2(cublasHandle_t handle, cublasOperation_t trans, int m, int n, const float *alpha,
                                     const float *A, int lda, const float *x, int incx, const float *beta, float *y,
                                     int incy) {
    return gemv(handle, SV_GEMM_S, trans, m, n, alpha, A, lda, x, incx, beta, y, incy, sizeof(float));
}

BL_API cublasStatus_t cublasDgemv_v2(cublasHandle_t handle, cublasOperation_t trans, int m, int n, const double *alpha,
                                     const double *A, int lda, const double *x, int incx, const double *beta, double *y,
                                     int incy) {
    return gemv(handle, SV_GEMM_D, trans, m, n, alpha, A, lda, x, incx, beta, y, incy, sizeof(double));
}

/*
 * Whether a workspace the process set has room for the dot product's partial result, one element of es bytes,
 * from its first 256-byte boundary on: NVIDIA's is NOT_SUPPORTED without it (measured, blastest's
 * dot_workspace). The default pool has room.
 */
static bool ws_room(bl_handle *b, size_t es) {
    pthread_mutex_lock(&b->mu);
    uint64_t pad = (256 - (b->ws & 255)) & 255;
    bool room = !b->ws_set || (b->ws_size >= pad && b->ws_size - pad >= es);
    pthread_mutex_unlock(&b->mu);
    return room;
}

/*
 * Into device memory (pointer mode device) an asynchronous record, a probe (bl_probe: NVIDIA's library answers
 * at the call) where the workspace may have no room for it; into host memory a synchronous one, which waits for
 * the stream's work as cuBLAS's does. An increment of 0 is a step of 0 (NVIDIA's, measured): nothing here is
 * refused but a NULL result.
 */
static cublasStatus_t dot(cublasHandle_t handle, uint32_t fn, int n, const void *xv, int incx, const void *yv, int incy,
                          void *result, size_t size) {
    HANDLE(handle, x, id, b);
    if (!result)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct sv_dot_rec q;
    memset(&q, 0, sizeof q);
    q.handle = id;
    q.stream = b->stream;
    q.fn = fn;
    q.dev_result = b->ptr_mode == CUBLAS_POINTER_MODE_DEVICE;
    q.n = n, q.incx = incx, q.incy = incy;
    q.x = (uint64_t)(uintptr_t)xv, q.y = (uint64_t)(uintptr_t)yv, q.result = (uint64_t)(uintptr_t)result;
    bl_ctx_current();
    bl_gate_enter();
    cublasStatus_t st = ws_send(x, id, b); /* the dot product's partial result takes room in it */
    if (st != CUBLAS_STATUS_SUCCESS) {
        /* the transport failed: said as it is */
    } else if (q.dev_result) {
        st = n > 0 && !ws_room(b, size) ? bl_probe(x, SV_OP_BLAS_DOT, &q, sizeof q, q.stream)
                                        : bl_async(x, SV_OP_BLAS_DOT, &q, sizeof q, q.stream);
    } else {
        uint8_t out[4 + 8];
        uint32_t len = 0;
        st = bl_sync(x, SV_OP_BLAS_DOT, &q, sizeof q, out, sizeof out, &len);
        if (st == CUBLAS_STATUS_SUCCESS && len >= 4 + size)
            memcpy(result, out + 4, size);
        else if (st == CUBLAS_STATUS_SUCCESS)
            st = CUBLAS_STATUS_INTERNAL_ERROR;
    }
    bl_gate_leave();
    return st;
}

BL_API cublasStatus_t cublasSdot_v2(cublasHandle_t handle, int n, const float *x, int incx, const float *y, int incy,
                                    float *result) {
    return dot(handle, SV_GEMM_S, n, x, incx, y, incy, result, sizeof(float));
}

BL_API cublasStatus_t cublasDdot_v2(cublasHandle_t handle, int n, const double *x, int incx, const double *y, int incy,
                                    double *result) {
    return dot(handle, SV_GEMM_D, n, x, incx, y, incy, result, sizeof(double));
}

/* ---- level 1, 2 and 3 on real data (served.h: SV_OP_BLAS_CALL) ---- */

/*
 * A call's record, its arguments added in the function's order: integers, pointers, scalars.
 *
 * Nobody measured what NVIDIA's library refuses of these (its gemv refuses far less than BLAS and its
 * documentation say: an increment of 0 is a step of 0 there, a negative size a quick return), so nothing is
 * refused here that can travel: arguments the documentation calls invalid make the record a probe (bl_probe),
 * which NVIDIA's library answers at the call, and the calls PyTorch makes stay asynchronous. A NULL scalar in host
 * memory cannot travel (its value does): INVALID_VALUE, as NVIDIA's gemm answers it; in device memory its address
 * travels, a probe.
 */
typedef struct {
    struct sv_blas_call q;
    bl_handle *b;
    unsigned ni, np, ns; /* integers, pointers, scalar values so far */
    size_t t;            /* bytes of the function's type */
    bool null;           /* a scalar's pointer is NULL, in host memory */
    bool probe;          /* arguments NVIDIA's library may refuse: it answers at the call */
} bl_call;

static void c_begin(bl_call *c, uint32_t id, bl_handle *b, uint32_t fn) {
    memset(c, 0, sizeof *c);
    c->b = b;
    c->q.handle = id;
    c->q.stream = b->stream;
    c->q.fn = fn;
    c->q.dev_scalars = b->ptr_mode == CUBLAS_POINTER_MODE_DEVICE;
    c->t = fn & 1 ? sizeof(double) : sizeof(float);
}
static void c_int(bl_call *c, int v) {
    if (c->ni < SV_BLAS_CALL_INTS)
        c->q.i[c->ni++] = v;
}
static void c_ptr(bl_call *c, const void *p) {
    if (c->np < SV_BLAS_CALL_PTRS)
        c->q.p[c->np++] = (uint64_t)(uintptr_t)p;
}
/* A scalar argument of n values that the function reads: its device address, or its values. */
static void c_in(bl_call *c, const void *p, unsigned n) {
    if (!p) {
        if (c->q.dev_scalars)
            c->probe = true;
        else
            c->null = true;
    } else if (!c->q.dev_scalars && (c->ns + n) * c->t <= SV_BLAS_CALL_SCALARS) {
        memcpy(c->q.s + c->ns * c->t, p, n * c->t);
        c->ns += n;
    }
    c_ptr(c, c->q.dev_scalars ? p : NULL);
}
/* A scalar argument that the function writes (and may read: put its value with c_in): its device address. */
static void c_out(bl_call *c, const void *p) {
    if (!p && c->q.dev_scalars)
        c->probe = true;
    else if (!p)
        c->null = true;
    c_ptr(c, c->q.dev_scalars ? p : NULL);
}

/*
 * Sends the call: asynchronous (a probe synchronous, bl_probe), or, where it writes host memory, synchronous, what
 * it wrote into out (bytes of it). A NULL scalar in host memory is refused here.
 */
static cublasStatus_t c_send(const struct sv_ext *x, const bl_call *c, void *out, size_t bytes) {
    if (c->null)
        return CUBLAS_STATUS_INVALID_VALUE;
    bl_ctx_current();
    bl_gate_enter();
    cublasStatus_t st = ws_send(x, c->q.handle, c->b);
    if (st != CUBLAS_STATUS_SUCCESS) {
        /* the transport failed: said as it is */
    } else if (!sv_blas_call_sync(c->q.fn, c->q.dev_scalars)) {
        st = c->probe ? bl_probe(x, SV_OP_BLAS_CALL, &c->q, sizeof c->q, c->q.stream)
                      : bl_async(x, SV_OP_BLAS_CALL, &c->q, sizeof c->q, c->q.stream);
    } else {
        uint8_t r[8 + SV_BLAS_CALL_OUT];
        uint32_t len = 0;
        st = bl_sync(x, SV_OP_BLAS_CALL, &c->q, sizeof c->q, r, sizeof r, &len);
        if (st == CUBLAS_STATUS_SUCCESS && len >= 8 + bytes && bytes <= SV_BLAS_CALL_OUT)
            memcpy(out, r + 8, bytes);
        else if (st == CUBLAS_STATUS_SUCCESS)
            st = CUBLAS_STATUS_INTERNAL_ERROR;
    }
    bl_gate_leave();
    return st;
}

static bool uplo_ok(cublasFillMode_t u) { return u == CUBLAS_FILL_MODE_LOWER || u == CUBLAS_FILL_MODE_UPPER; }
static bool diag_ok(cublasDiagType_t d) { return d == CUBLAS_DIAG_NON_UNIT || d == CUBLAS_DIAG_UNIT; }
static bool side_ok(cublasSideMode_t s) { return s == CUBLAS_SIDE_LEFT || s == CUBLAS_SIDE_RIGHT; }

/* axpy (alpha), scal (alpha, no y), copy and swap (neither) */
static cublasStatus_t vec(cublasHandle_t handle, uint32_t fn, int n, const void *alpha, const void *xv, int incx,
                          const void *yv, int incy, bool has_alpha, bool has_y) {
    HANDLE(handle, x, id, b);
    bl_call c;
    c_begin(&c, id, b, fn);
    c_int(&c, n);
    if (has_alpha)
        c_in(&c, alpha, 1);
    c_ptr(&c, xv);
    c_int(&c, incx);
    if (has_y) {
        c_ptr(&c, yv);
        c_int(&c, incy);
    }
    return c_send(x, &c, NULL, 0);
}

/* nrm2, asum, amax, amin: bytes of the result */
static cublasStatus_t reduce(cublasHandle_t handle, uint32_t fn, int n, const void *xv, int incx, void *result,
                             size_t bytes) {
    HANDLE(handle, x, id, b);
    bl_call c;
    c_begin(&c, id, b, fn);
    c_int(&c, n);
    c_ptr(&c, xv);
    c_int(&c, incx);
    c_out(&c, result);
    return c_send(x, &c, result, bytes);
}

/* rot (c and s: one value each) and rotm (cv: param, five) */
static cublasStatus_t rot(cublasHandle_t handle, uint32_t fn, int n, void *xv, int incx, void *yv, int incy,
                          const void *cv, const void *sv, bool rotm) {
    HANDLE(handle, x, id, b);
    bl_call c;
    c_begin(&c, id, b, fn);
    c_int(&c, n);
    c_ptr(&c, xv);
    c_int(&c, incx);
    c_ptr(&c, yv);
    c_int(&c, incy);
    if (rotm) {
        c_in(&c, cv, 5);
    } else {
        c_in(&c, cv, 1);
        c_in(&c, sv, 1);
    }
    return c_send(x, &c, NULL, 0);
}

static cublasStatus_t rotg(cublasHandle_t handle, uint32_t fn, void *a, void *bv, void *cv, void *sv) {
    HANDLE(handle, x, id, b);
    bl_call c;
    c_begin(&c, id, b, fn);
    c_in(&c, a, 1);
    c_in(&c, bv, 1);
    c_out(&c, cv);
    c_out(&c, sv);
    uint8_t r[4 * sizeof(double)];
    cublasStatus_t st = c_send(x, &c, r, 4 * c.t);
    if (st == CUBLAS_STATUS_SUCCESS && !c.q.dev_scalars) {
        memcpy(a, r, c.t);
        memcpy(bv, r + c.t, c.t);
        memcpy(cv, r + 2 * c.t, c.t);
        memcpy(sv, r + 3 * c.t, c.t);
    }
    return st;
}

static cublasStatus_t rotmg(cublasHandle_t handle, uint32_t fn, void *d1, void *d2, void *x1, const void *y1,
                            void *param) {
    HANDLE(handle, x, id, b);
    bl_call c;
    c_begin(&c, id, b, fn);
    c_in(&c, d1, 1);
    c_in(&c, d2, 1);
    c_in(&c, x1, 1);
    c_in(&c, y1, 1);
    c_out(&c, param);
    uint8_t r[8 * sizeof(double)];
    cublasStatus_t st = c_send(x, &c, r, 8 * c.t);
    if (st == CUBLAS_STATUS_SUCCESS && !c.q.dev_scalars) {
        memcpy(d1, r, c.t);
        memcpy(d2, r + c.t, c.t);
        memcpy(x1, r + 2 * c.t, c.t);
        memcpy(param, r + 3 * c.t, 5 * c.t);
    }
    return st;
}

/* trmv and trsv */
static cublasStatus_t trxv(cublasHandle_t handle, uint32_t fn, cublasFillMode_t uplo, cublasOperation_t trans,
                           cublasDiagType_t diag, int n, const void *A, int lda, void *xv, int incx) {
    HANDLE(handle, x, id, b);
    bl_call c;
    c_begin(&c, id, b, fn);
    c.probe = !uplo_ok(uplo) || !trans_ok(trans) || !diag_ok(diag) || n < 0 || lda < imax1(n) || incx == 0;
    c_int(&c, uplo);
    c_int(&c, trans);
    c_int(&c, diag);
    c_int(&c, n);
    c_ptr(&c, A);
    c_int(&c, lda);
    c_ptr(&c, xv);
    c_int(&c, incx);
    return c_send(x, &c, NULL, 0);
}

static cublasStatus_t ger(cublasHandle_t handle, uint32_t fn, int m, int n, const void *alpha, const void *xv, int incx,
                          const void *yv, int incy, void *A, int lda) {
    HANDLE(handle, x, id, b);
    bl_call c;
    c_begin(&c, id, b, fn);
    c.probe = m < 0 || n < 0 || incx == 0 || incy == 0 || lda < imax1(m);
    c_int(&c, m);
    c_int(&c, n);
    c_in(&c, alpha, 1);
    c_ptr(&c, xv);
    c_int(&c, incx);
    c_ptr(&c, yv);
    c_int(&c, incy);
    c_ptr(&c, A);
    c_int(&c, lda);
    return c_send(x, &c, NULL, 0);
}

/* syr (no y) and syr2 */
static cublasStatus_t syr(cublasHandle_t handle, uint32_t fn, cublasFillMode_t uplo, int n, const void *alpha,
                          const void *xv, int incx, const void *yv, int incy, void *A, int lda, bool has_y) {
    HANDLE(handle, x, id, b);
    bl_call c;
    c_begin(&c, id, b, fn);
    c.probe = !uplo_ok(uplo) || n < 0 || incx == 0 || (has_y && incy == 0) || lda < imax1(n);
    c_int(&c, uplo);
    c_int(&c, n);
    c_in(&c, alpha, 1);
    c_ptr(&c, xv);
    c_int(&c, incx);
    if (has_y) {
        c_ptr(&c, yv);
        c_int(&c, incy);
    }
    c_ptr(&c, A);
    c_int(&c, lda);
    return c_send(x, &c, NULL, 0);
}

static cublasStatus_t symv(cublasHandle_t handle, uint32_t fn, cublasFillMode_t uplo, int n, const void *alpha,
                           const void *A, int lda, const void *xv, int incx, const void *beta, void *yv, int incy) {
    HANDLE(handle, x, id, b);
    bl_call c;
    c_begin(&c, id, b, fn);
    c.probe = !uplo_ok(uplo) || n < 0 || lda < imax1(n) || incx == 0 || incy == 0;
    c_int(&c, uplo);
    c_int(&c, n);
    c_in(&c, alpha, 1);
    c_ptr(&c, A);
    c_int(&c, lda);
    c_ptr(&c, xv);
    c_int(&c, incx);
    c_in(&c, beta, 1);
    c_ptr(&c, yv);
    c_int(&c, incy);
    return c_send(x, &c, NULL, 0);
}

static cublasStatus_t symm(cublasHandle_t handle, uint32_t fn, cublasSideMode_t side, cublasFillMode_t uplo, int m,
                           int n, const void *alpha, const void *A, int lda, const void *B, int ldb, const void *beta,
                           void *C, int ldc) {
    HANDLE(handle, x, id, b);
    bl_call c;
    c_begin(&c, id, b, fn);
    c.probe = !side_ok(side) || !uplo_ok(uplo) || m < 0 || n < 0 || lda < imax1(side == CUBLAS_SIDE_LEFT ? m : n) ||
              ldb < imax1(m) || ldc < imax1(m);
    c_int(&c, side);
    c_int(&c, uplo);
    c_int(&c, m);
    c_int(&c, n);
    c_in(&c, alpha, 1);
    c_ptr(&c, A);
    c_int(&c, lda);
    c_ptr(&c, B);
    c_int(&c, ldb);
    c_in(&c, beta, 1);
    c_ptr(&c, C);
    c_int(&c, ldc);
    return c_send(x, &c, NULL, 0);
}

/* syrk (no B) and syr2k */
static cublasStatus_t syrk(cublasHandle_t handle, uint32_t fn, cublasFillMode_t uplo, cublasOperation_t trans, int n,
                           int k, const void *alpha, const void *A, int lda, const void *B, int ldb, const void *beta,
                           void *C, int ldc, bool has_b) {
    HANDLE(handle, x, id, b);
    int rows = trans == CUBLAS_OP_N ? n : k;
    bl_call c;
    c_begin(&c, id, b, fn);
    c.probe = !uplo_ok(uplo) || !trans_ok(trans) || n < 0 || k < 0 || lda < imax1(rows) ||
              (has_b && ldb < imax1(rows)) || ldc < imax1(n);
    c_int(&c, uplo);
    c_int(&c, trans);
    c_int(&c, n);
    c_int(&c, k);
    c_in(&c, alpha, 1);
    c_ptr(&c, A);
    c_int(&c, lda);
    if (has_b) {
        c_ptr(&c, B);
        c_int(&c, ldb);
    }
    c_in(&c, beta, 1);
    c_ptr(&c, C);
    c_int(&c, ldc);
    return c_send(x, &c, NULL, 0);
}

static cublasStatus_t trmm(cublasHandle_t handle, uint32_t fn, cublasSideMode_t side, cublasFillMode_t uplo,
                           cublasOperation_t trans, cublasDiagType_t diag, int m, int n, const void *alpha,
                           const void *A, int lda, const void *B, int ldb, void *C, int ldc) {
    HANDLE(handle, x, id, b);
    bl_call c;
    c_begin(&c, id, b, fn);
    c.probe = !side_ok(side) || !uplo_ok(uplo) || !trans_ok(trans) || !diag_ok(diag) || m < 0 || n < 0 ||
              lda < imax1(side == CUBLAS_SIDE_LEFT ? m : n) || ldb < imax1(m) || ldc < imax1(m);
    c_int(&c, side);
    c_int(&c, uplo);
    c_int(&c, trans);
    c_int(&c, diag);
    c_int(&c, m);
    c_int(&c, n);
    c_in(&c, alpha, 1);
    c_ptr(&c, A);
    c_int(&c, lda);
    c_ptr(&c, B);
    c_int(&c, ldb);
    c_ptr(&c, C);
    c_int(&c, ldc);
    return c_send(x, &c, NULL, 0);
}

/* The S and D entry points of each: T the type, F the record's fn of the S one (the D one is F + 1). */
#define BL_SD(X)                                                                                                       \
    X(S, s, float, 0)                                                                                                  \
    X(D, d, double, 1)

#define LEVEL1(P, p, T, D)                                                                                             \
    BL_API cublasStatus_t cublas##P##axpy_v2(cublasHandle_t handle, int n, const T *alpha, const T *x, int incx, T *y, \
                                             int incy) {                                                               \
        return vec(handle, SV_BF_SAXPY + D, n, alpha, x, incx, y, incy, true, true);                                   \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##copy_v2(cublasHandle_t handle, int n, const T *x, int incx, T *y, int incy) {     \
        return vec(handle, SV_BF_SCOPY + D, n, NULL, x, incx, y, incy, false, true);                                   \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##scal_v2(cublasHandle_t handle, int n, const T *alpha, T *x, int incx) {           \
        return vec(handle, SV_BF_SSCAL + D, n, alpha, x, incx, NULL, 0, true, false);                                  \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##swap_v2(cublasHandle_t handle, int n, T *x, int incx, T *y, int incy) {           \
        return vec(handle, SV_BF_SSWAP + D, n, NULL, x, incx, y, incy, false, true);                                   \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##nrm2_v2(cublasHandle_t handle, int n, const T *x, int incx, T *result) {          \
        return reduce(handle, SV_BF_SNRM2 + D, n, x, incx, result, sizeof(T));                                         \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##asum_v2(cublasHandle_t handle, int n, const T *x, int incx, T *result) {          \
        return reduce(handle, SV_BF_SASUM + D, n, x, incx, result, sizeof(T));                                         \
    }                                                                                                                  \
    BL_API cublasStatus_t cublasI##p##amax_v2(cublasHandle_t handle, int n, const T *x, int incx, int *result) {       \
        return reduce(handle, SV_BF_ISAMAX + D, n, x, incx, result, sizeof(int));                                      \
    }                                                                                                                  \
    BL_API cublasStatus_t cublasI##p##amin_v2(cublasHandle_t handle, int n, const T *x, int incx, int *result) {       \
        return reduce(handle, SV_BF_ISAMIN + D, n, x, incx, result, sizeof(int));                                      \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##rot_v2(cublasHandle_t handle, int n, T *x, int incx, T *y, int incy, const T *c,  \
                                            const T *s) {                                                              \
        return rot(handle, SV_BF_SROT + D, n, x, incx, y, incy, c, s, false);                                          \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##rotm_v2(cublasHandle_t handle, int n, T *x, int incx, T *y, int incy,             \
                                             const T *param) {                                                         \
        return rot(handle, SV_BF_SROTM + D, n, x, incx, y, incy, param, NULL, true);                                   \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##rotg_v2(cublasHandle_t handle, T *a, T *b, T *c, T *s) {                          \
        return rotg(handle, SV_BF_SROTG + D, a, b, c, s);                                                              \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##rotmg_v2(cublasHandle_t handle, T *d1, T *d2, T *x1, const T *y1, T *param) {     \
        return rotmg(handle, SV_BF_SROTMG + D, d1, d2, x1, y1, param);                                                 \
    }
BL_SD(LEVEL1)

#define LEVEL2(P, p, T, D)                                                                                             \
    BL_API cublasStatus_t cublas##P##trmv_v2(cublasHandle_t handle, cublasFillMode_t uplo, cublasOperation_t trans,    \
                                             cublasDiagType_t diag, int n, const T *A, int lda, T *x, int incx) {      \
        return trxv(handle, SV_BF_STRMV + D, uplo, trans, diag, n, A, lda, x, incx);                                   \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##trsv_v2(cublasHandle_t handle, cublasFillMode_t uplo, cublasOperation_t trans,    \
                                             cublasDiagType_t diag, int n, const T *A, int lda, T *x, int incx) {      \
        return trxv(handle, SV_BF_STRSV + D, uplo, trans, diag, n, A, lda, x, incx);                                   \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##ger_v2(cublasHandle_t handle, int m, int n, const T *alpha, const T *x, int incx, \
                                            const T *y, int incy, T *A, int lda) {                                     \
        return ger(handle, SV_BF_SGER + D, m, n, alpha, x, incx, y, incy, A, lda);                                     \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##syr_v2(cublasHandle_t handle, cublasFillMode_t uplo, int n, const T *alpha,       \
                                            const T *x, int incx, T *A, int lda) {                                     \
        return syr(handle, SV_BF_SSYR + D, uplo, n, alpha, x, incx, NULL, 0, A, lda, false);                           \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##syr2_v2(cublasHandle_t handle, cublasFillMode_t uplo, int n, const T *alpha,      \
                                             const T *x, int incx, const T *y, int incy, T *A, int lda) {              \
        return syr(handle, SV_BF_SSYR2 + D, uplo, n, alpha, x, incx, y, incy, A, lda, true);                           \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##symv_v2(cublasHandle_t handle, cublasFillMode_t uplo, int n, const T *alpha,      \
                                             const T *A, int lda, const T *x, int incx, const T *beta, T *y,           \
                                             int incy) {                                                               \
        return symv(handle, SV_BF_SSYMV + D, uplo, n, alpha, A, lda, x, incx, beta, y, incy);                          \
    }
BL_SD(LEVEL2)

#define LEVEL3(P, p, T, D)                                                                                             \
    BL_API cublasStatus_t cublas##P##symm_v2(cublasHandle_t handle, cublasSideMode_t side, cublasFillMode_t uplo,      \
                                             int m, int n, const T *alpha, const T *A, int lda, const T *B, int ldb,   \
                                             const T *beta, T *C, int ldc) {                                           \
        return symm(handle, SV_BF_SSYMM + D, side, uplo, m, n, alpha, A, lda, B, ldb, beta, C, ldc);                   \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##syrk_v2(cublasHandle_t handle, cublasFillMode_t uplo, cublasOperation_t trans,    \
                                             int n, int k, const T *alpha, const T *A, int lda, const T *beta, T *C,   \
                                             int ldc) {                                                                \
        return syrk(handle, SV_BF_SSYRK + D, uplo, trans, n, k, alpha, A, lda, NULL, 0, beta, C, ldc, false);          \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##syr2k_v2(cublasHandle_t handle, cublasFillMode_t uplo, cublasOperation_t trans,   \
                                              int n, int k, const T *alpha, const T *A, int lda, const T *B, int ldb,  \
                                              const T *beta, T *C, int ldc) {                                          \
        return syrk(handle, SV_BF_SSYR2K + D, uplo, trans, n, k, alpha, A, lda, B, ldb, beta, C, ldc, true);           \
    }                                                                                                                  \
    BL_API cublasStatus_t cublas##P##trmm_v2(cublasHandle_t handle, cublasSideMode_t side, cublasFillMode_t uplo,      \
                                             cublasOperation_t trans, cublasDiagType_t diag, int m, int n,             \
                                             const T *alpha, const T *A, int lda, const T *B, int ldb, T *C,           \
                                             int ldc) {                                                                \
        return trmm(handle, SV_BF_STRMM + D, side, uplo, trans, diag, m, n, alpha, A, lda, B, ldb, C, ldc);            \
    }
BL_SD(LEVEL3)

/* ---- host memory to and from device memory ---- */

/*
 * cuBLAS's copies are the driver's 2D copies, which served mode's driver does not have: its 1D copies (through
 * the application's libcuda.so.1, on the stream) take a matrix at once where its columns are contiguous in device
 * memory (packed here from host memory) or in both, else a column at a time. A copy from pageable host memory is
 * staged when it returns, one into it done, as the driver's are.
 */
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t, CUstream);
static htod_fn p_htod;
static dtoh_fn p_dtoh;
static pthread_once_t copy_once = PTHREAD_ONCE_INIT;
static void copy_find(void) {
    p_htod = (htod_fn)dlsym(RTLD_DEFAULT, "cuMemcpyHtoDAsync_v2");
    p_dtoh = (dtoh_fn)dlsym(RTLD_DEFAULT, "cuMemcpyDtoHAsync_v2");
}

/* Arguments as cuBLAS checks them; CUBLAS_STATUS_SUCCESS with *none for nothing to copy. */
static cublasStatus_t copy_args(int rows, int cols, int elem, int lda, int ldb, bool *none) {
    *none = false;
    if (rows < 0 || cols < 0 || elem <= 0 || lda <= 0 || ldb <= 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!bl_ext())
        return CUBLAS_STATUS_NOT_INITIALIZED;
    pthread_once(&copy_once, copy_find);
    if (!p_htod || !p_dtoh)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *none = rows == 0 || cols == 0;
    /* a leading dimension shorter than a column: the 2D copy's pitch is less than its width */
    return !*none && (lda < rows || ldb < rows) ? CUBLAS_STATUS_MAPPING_ERROR : CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t copied(CUresult r) {
    return r == CUDA_SUCCESS ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_MAPPING_ERROR;
}

/* rows x cols elements of elem bytes from host memory (leading dimension lda, in elements) to device memory (ldb). */
static cublasStatus_t set_matrix(int rows, int cols, int elem, const void *src, int lda, void *dst, int ldb,
                                 cudaStream_t stream) {
    bool none;
    cublasStatus_t st = copy_args(rows, cols, elem, lda, ldb, &none);
    if (st != CUBLAS_STATUS_SUCCESS || none)
        return st;
    const char *s = src;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst;
    size_t col = (size_t)rows * (size_t)elem, n = col * (size_t)cols;
    if (lda == rows && ldb == rows)
        return copied(p_htod(d, s, n, stream));
    char *buf = ldb == rows ? malloc(n) : NULL;
    if (buf) {
        for (int j = 0; j < cols; j++)
            memcpy(buf + (size_t)j * col, s + (size_t)j * (size_t)lda * (size_t)elem, col);
        CUresult r = p_htod(d, buf, n, stream);
        free(buf);
        return copied(r);
    }
    for (int j = 0; j < cols; j++) {
        CUresult r =
            p_htod(d + (size_t)j * (size_t)ldb * (size_t)elem, s + (size_t)j * (size_t)lda * (size_t)elem, col, stream);
        if (r != CUDA_SUCCESS)
            return copied(r);
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* From device memory (lda) to host memory (ldb): the columns' span at once where it is not much more than they
 * are, else a column at a time. */
static cublasStatus_t get_matrix(int rows, int cols, int elem, const void *src, int lda, void *dst, int ldb,
                                 cudaStream_t stream) {
    bool none;
    cublasStatus_t st = copy_args(rows, cols, elem, lda, ldb, &none);
    if (st != CUBLAS_STATUS_SUCCESS || none)
        return st;
    CUdeviceptr s = (CUdeviceptr)(uintptr_t)src;
    char *d = dst;
    size_t col = (size_t)rows * (size_t)elem, n = col * (size_t)cols;
    if (lda == rows && ldb == rows)
        return copied(p_dtoh(d, s, n, stream));
    size_t span = ((size_t)(cols - 1) * (size_t)lda + (size_t)rows) * (size_t)elem;
    char *buf = span <= 2 * n + 65536 ? malloc(span) : NULL;
    if (buf) {
        CUresult r = p_dtoh(buf, s, span, stream);
        for (int j = 0; j < cols && r == CUDA_SUCCESS; j++)
            memcpy(d + (size_t)j * (size_t)ldb * (size_t)elem, buf + (size_t)j * (size_t)lda * (size_t)elem, col);
        free(buf);
        return copied(r);
    }
    for (int j = 0; j < cols; j++) {
        CUresult r =
            p_dtoh(d + (size_t)j * (size_t)ldb * (size_t)elem, s + (size_t)j * (size_t)lda * (size_t)elem, col, stream);
        if (r != CUDA_SUCCESS)
            return copied(r);
    }
    return CUBLAS_STATUS_SUCCESS;
}

BL_API cublasStatus_t cublasSetMatrixAsync(int rows, int cols, int elemSize, const void *A, int lda, void *B, int ldb,
                                           cudaStream_t stream) {
    return set_matrix(rows, cols, elemSize, A, lda, B, ldb, stream);
}

BL_API cublasStatus_t cublasGetMatrixAsync(int rows, int cols, int elemSize, const void *A, int lda, void *B, int ldb,
                                           cudaStream_t stream) {
    return get_matrix(rows, cols, elemSize, A, lda, B, ldb, stream);
}

/* A vector is a matrix of one row, its increment the leading dimension. */
BL_API cublasStatus_t cublasSetVectorAsync(int n, int elemSize, const void *hostPtr, int incx, void *devicePtr,
                                           int incy, cudaStream_t stream) {
    return set_matrix(1, n, elemSize, hostPtr, incx, devicePtr, incy, stream);
}

BL_API cublasStatus_t cublasGetVectorAsync(int n, int elemSize, const void *devicePtr, int incx, void *hostPtr,
                                           int incy, cudaStream_t stream) {
    return get_matrix(1, n, elemSize, devicePtr, incx, hostPtr, incy, stream);
}

/* ---- what PyTorch binds that is not forwarded yet: each fails, saying so once ---- */

BL_REFUSED(LIB, cublasCgemm_v2)
BL_REFUSED(LIB, cublasZgemm_v2)
BL_REFUSED(LIB, cublasCgemmStridedBatched)
BL_REFUSED(LIB, cublasZgemmStridedBatched)
BL_REFUSED(LIB, cublasSgemmEx)
BL_REFUSED(LIB, cublasGemmBatchedEx)
BL_REFUSED(LIB, cublasCgemv_v2)
BL_REFUSED(LIB, cublasZgemv_v2)
BL_REFUSED(LIB, cublasCdotu_v2)
BL_REFUSED(LIB, cublasZdotu_v2)
BL_REFUSED(LIB, cublasCdotc_v2)
BL_REFUSED(LIB, cublasZdotc_v2)
BL_REFUSED(LIB, cublasDotEx)
BL_REFUSED(LIB, cublasStrsm_v2)
BL_REFUSED(LIB, cublasDtrsm_v2)
BL_REFUSED(LIB, cublasCtrsm_v2)
BL_REFUSED(LIB, cublasZtrsm_v2)
BL_REFUSED(LIB, cublasStrsmBatched)
BL_REFUSED(LIB, cublasDtrsmBatched)
BL_REFUSED(LIB, cublasCtrsmBatched)
BL_REFUSED(LIB, cublasZtrsmBatched)
BL_REFUSED(LIB, cublasSgetrfBatched)
BL_REFUSED(LIB, cublasDgetrfBatched)
BL_REFUSED(LIB, cublasCgetrfBatched)
BL_REFUSED(LIB, cublasZgetrfBatched)
BL_REFUSED(LIB, cublasSgetrsBatched)
BL_REFUSED(LIB, cublasDgetrsBatched)
BL_REFUSED(LIB, cublasCgetrsBatched)
BL_REFUSED(LIB, cublasZgetrsBatched)
BL_REFUSED(LIB, cublasSgeqrfBatched)
BL_REFUSED(LIB, cublasDgeqrfBatched)
BL_REFUSED(LIB, cublasCgeqrfBatched)
BL_REFUSED(LIB, cublasZgeqrfBatched)
BL_REFUSED(LIB, cublasSgelsBatched)
BL_REFUSED(LIB, cublasDgelsBatched)
BL_REFUSED(LIB, cublasCgelsBatched)
BL_REFUSED(LIB, cublasZgelsBatched)
BL_REFUSED(LIB, cublasSgemmBatched)
BL_REFUSED(LIB, cublasDgemmBatched)

/* Complex level 1, 2 and 3 and batched complex gemm, with their own prototypes (P the type's letter, p it in
 * lower case, RP and PR the prefixes of the mixed real and complex ones, T the type, R its real part's). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define REFUSED_COMPLEX(P, p, RP, PR, T, R)                                                                            \
    BL_REFUSED_AS(LIB, cublas##P##axpy_v2,                                                                             \
                  (cublasHandle_t handle, int n, const T *alpha, const T *x, int incx, T *y, int incy))                \
    BL_REFUSED_AS(LIB, cublas##P##copy_v2, (cublasHandle_t handle, int n, const T *x, int incx, T *y, int incy))       \
    BL_REFUSED_AS(LIB, cublas##P##scal_v2, (cublasHandle_t handle, int n, const T *alpha, T *x, int incx))             \
    BL_REFUSED_AS(LIB, cublas##PR##scal_v2, (cublasHandle_t handle, int n, const R *alpha, T *x, int incx))            \
    BL_REFUSED_AS(LIB, cublas##P##swap_v2, (cublasHandle_t handle, int n, T *x, int incx, T *y, int incy))             \
    BL_REFUSED_AS(LIB, cublas##P##rot_v2,                                                                              \
                  (cublasHandle_t handle, int n, T *x, int incx, T *y, int incy, const R *c, const T *s))              \
    BL_REFUSED_AS(LIB, cublas##PR##rot_v2,                                                                             \
                  (cublasHandle_t handle, int n, T *x, int incx, T *y, int incy, const R *c, const R *s))              \
    BL_REFUSED_AS(LIB, cublas##P##rotg_v2, (cublasHandle_t handle, T * a, T * b, R * c, T * s))                        \
    BL_REFUSED_AS(LIB, cublasI##p##amax_v2, (cublasHandle_t handle, int n, const T *x, int incx, int *result))         \
    BL_REFUSED_AS(LIB, cublasI##p##amin_v2, (cublasHandle_t handle, int n, const T *x, int incx, int *result))         \
    BL_REFUSED_AS(LIB, cublas##RP##asum_v2, (cublasHandle_t handle, int n, const T *x, int incx, R *result))           \
    BL_REFUSED_AS(LIB, cublas##RP##nrm2_v2, (cublasHandle_t handle, int n, const T *x, int incx, R *result))           \
    BL_REFUSED_AS(LIB, cublas##P##trmv_v2,                                                                             \
                  (cublasHandle_t handle, cublasFillMode_t uplo, cublasOperation_t trans, cublasDiagType_t diag,       \
                   int n, const T *A, int lda, T *x, int incx))                                                        \
    BL_REFUSED_AS(LIB, cublas##P##trsv_v2,                                                                             \
                  (cublasHandle_t handle, cublasFillMode_t uplo, cublasOperation_t trans, cublasDiagType_t diag,       \
                   int n, const T *A, int lda, T *x, int incx))                                                        \
    BL_REFUSED_AS(LIB, cublas##P##geru_v2,                                                                             \
                  (cublasHandle_t handle, int m, int n, const T *alpha, const T *x, int incx, const T *y, int incy,    \
                   T *A, int lda))                                                                                     \
    BL_REFUSED_AS(LIB, cublas##P##gerc_v2,                                                                             \
                  (cublasHandle_t handle, int m, int n, const T *alpha, const T *x, int incx, const T *y, int incy,    \
                   T *A, int lda))                                                                                     \
    BL_REFUSED_AS(                                                                                                     \
        LIB, cublas##P##syr_v2,                                                                                        \
        (cublasHandle_t handle, cublasFillMode_t uplo, int n, const T *alpha, const T *x, int incx, T *A, int lda))    \
    BL_REFUSED_AS(                                                                                                     \
        LIB, cublas##P##her_v2,                                                                                        \
        (cublasHandle_t handle, cublasFillMode_t uplo, int n, const R *alpha, const T *x, int incx, T *A, int lda))    \
    BL_REFUSED_AS(LIB, cublas##P##syr2_v2,                                                                             \
                  (cublasHandle_t handle, cublasFillMode_t uplo, int n, const T *alpha, const T *x, int incx,          \
                   const T *y, int incy, T *A, int lda))                                                               \
    BL_REFUSED_AS(LIB, cublas##P##her2_v2,                                                                             \
                  (cublasHandle_t handle, cublasFillMode_t uplo, int n, const T *alpha, const T *x, int incx,          \
                   const T *y, int incy, T *A, int lda))                                                               \
    BL_REFUSED_AS(LIB, cublas##P##symv_v2,                                                                             \
                  (cublasHandle_t handle, cublasFillMode_t uplo, int n, const T *alpha, const T *A, int lda,           \
                   const T *x, int incx, const T *beta, T *y, int incy))                                               \
    BL_REFUSED_AS(LIB, cublas##P##hemv_v2,                                                                             \
                  (cublasHandle_t handle, cublasFillMode_t uplo, int n, const T *alpha, const T *A, int lda,           \
                   const T *x, int incx, const T *beta, T *y, int incy))                                               \
    BL_REFUSED_AS(LIB, cublas##P##symm_v2,                                                                             \
                  (cublasHandle_t handle, cublasSideMode_t side, cublasFillMode_t uplo, int m, int n, const T *alpha,  \
                   const T *A, int lda, const T *B, int ldb, const T *beta, T *C, int ldc))                            \
    BL_REFUSED_AS(LIB, cublas##P##hemm_v2,                                                                             \
                  (cublasHandle_t handle, cublasSideMode_t side, cublasFillMode_t uplo, int m, int n, const T *alpha,  \
                   const T *A, int lda, const T *B, int ldb, const T *beta, T *C, int ldc))                            \
    BL_REFUSED_AS(LIB, cublas##P##syrk_v2,                                                                             \
                  (cublasHandle_t handle, cublasFillMode_t uplo, cublasOperation_t trans, int n, int k,                \
                   const T *alpha, const T *A, int lda, const T *beta, T *C, int ldc))                                 \
    BL_REFUSED_AS(LIB, cublas##P##herk_v2,                                                                             \
                  (cublasHandle_t handle, cublasFillMode_t uplo, cublasOperation_t trans, int n, int k,                \
                   const R *alpha, const T *A, int lda, const R *beta, T *C, int ldc))                                 \
    BL_REFUSED_AS(LIB, cublas##P##syr2k_v2,                                                                            \
                  (cublasHandle_t handle, cublasFillMode_t uplo, cublasOperation_t trans, int n, int k,                \
                   const T *alpha, const T *A, int lda, const T *B, int ldb, const T *beta, T *C, int ldc))            \
    BL_REFUSED_AS(LIB, cublas##P##her2k_v2,                                                                            \
                  (cublasHandle_t handle, cublasFillMode_t uplo, cublasOperation_t trans, int n, int k,                \
                   const T *alpha, const T *A, int lda, const T *B, int ldb, const R *beta, T *C, int ldc))            \
    BL_REFUSED_AS(LIB, cublas##P##trmm_v2,                                                                             \
                  (cublasHandle_t handle, cublasSideMode_t side, cublasFillMode_t uplo, cublasOperation_t trans,       \
                   cublasDiagType_t diag, int m, int n, const T *alpha, const T *A, int lda, const T *B, int ldb,      \
                   T *C, int ldc))                                                                                     \
    BL_REFUSED_AS(LIB, cublas##P##gemmBatched,                                                                         \
                  (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,     \
                   const T *alpha, const T *const Aarray[], int lda, const T *const Barray[], int ldb, const T *beta,  \
                   T *const Carray[], int ldc, int batchCount))
REFUSED_COMPLEX(C, c, Sc, Cs, cuComplex, float)
REFUSED_COMPLEX(Z, z, Dz, Zd, cuDoubleComplex, double)
#pragma GCC diagnostic pop

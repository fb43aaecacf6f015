/*
 * blastest: conformance test of the simulated cuBLAS and cuBLASLt
 * (tests/sim/blas) on the simulated driver.
 *
 * Every product is run on small problems (odd sizes, every transpose, leading
 * dimensions beyond the rows, batches with strides, both pointer modes, the
 * bias and ReLU epilogues; for gemv and dot, increments above 1 and
 * negative) and compared with a host reference that computes each element
 * in the order sbkern.h defines: the bits must be equal. The padding between
 * columns and batches, and between a vector's elements, must be left as it
 * was. Argument errors must give the status NVIDIA's cuBLAS 13 gives
 * (measured on an H200: where it differs from what its documentation
 * suggests, the case says so).
 *
 *   blastest             run every case
 *   blastest NAME...     run the named cases
 *   blastest -l          list the cases
 *   blastest --nvidia    against NVIDIA's libraries on a GPU: results within
 *                        a tolerance (their summation order is their own),
 *                        and the checks of the simulation's own limits skipped
 *   blastest --served    under `gpucr run --served`: the calls are forwarded
 *                        to the worker's library, and those whose refusal
 *                        comes back at the next synchronizing call there (an
 *                        asynchronous record's failure, as a launch's:
 *                        docs/served-mode.md) are left out
 * (--nvidia and --served may come together, before the names.)
 *
 * Output: `ok NAME` or `FAIL NAME: what` per case, then `N passed, N failed`;
 * exit status 0 only if every case passed.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucr/cublas.h"

static bool nvidia; /* --nvidia */
static bool served; /* --served */
static bool case_failed;
static CUcontext ctx;

static void fail(int line, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("line %d: %s\n", line, msg);
    fflush(stdout);
    case_failed = true;
}

static const char *st_name(cublasStatus_t s) {
    static __thread char buf[4][64];
    static __thread int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s(%d)", cublasGetStatusName(s), (int)s);
    return b;
}

/* A driver call that must succeed; the case ends if it does not. */
#define CU(call)                                                                                                       \
    do {                                                                                                               \
        CUresult r_ = (call);                                                                                          \
        if (r_ != CUDA_SUCCESS) {                                                                                      \
            fail(__LINE__, "%s: CUresult %d", #call, (int)r_);                                                         \
            return;                                                                                                    \
        }                                                                                                              \
    } while (0)

/* A cuBLAS call that must return want; the case goes on either way. */
#define EXPECT_ST(call, want)                                                                                          \
    do {                                                                                                               \
        cublasStatus_t s_ = (call);                                                                                    \
        if (s_ != (want))                                                                                              \
            fail(__LINE__, "%s: got %s want %s", #call, st_name(s_), st_name(want));                                   \
    } while (0)

/* The same, and the case ends if it did not. */
#define REQUIRE_ST(call, want)                                                                                         \
    do {                                                                                                               \
        cublasStatus_t s_ = (call);                                                                                    \
        if (s_ != (want)) {                                                                                            \
            fail(__LINE__, "%s: got %s want %s", #call, st_name(s_), st_name(want));                                   \
            return;                                                                                                    \
        }                                                                                                              \
    } while (0)

#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond))                                                                                                   \
            fail(__LINE__, __VA_ARGS__);                                                                               \
    } while (0)

/* ---- data ---------------------------------------------------------------- */

static uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return x;
}

/* Values in [-1, 1) with every mantissa bit in use, so a change of rounding shows. */
static double value(uint32_t seed, size_t i) {
    return (double)mix32((uint32_t)i * 0x9E3779B1u + seed) / 2147483648.0 - 1.0;
}

static void fill(void *p, bool f64, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        if (f64)
            ((double *)p)[i] = value(seed, i);
        else
            ((float *)p)[i] = (float)value(seed, i);
    }
}

static void fill_nan(void *p, bool f64, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (f64)
            ((double *)p)[i] = NAN;
        else
            ((float *)p)[i] = NAN;
    }
}

/* ---- the reference: sbkern.h's definition, element by element ------------- */

typedef struct prob {
    bool f64, ta, tb, bias, relu;
    bool read_c; /* C is read even with a zero beta (sbkern.h's READ_C: a beta of -0.0, see run) */
    int m, n, k, batch;
    int64_t lda, ldb, ldc, ldd;
    int64_t sa, sb, sc, sd, sbias; /* elements */
    double alpha, beta;            /* converted to the element type */
} prob;

#define REF(NAME, T, F)                                                                                                \
    static void NAME(const prob *p, const T *a, const T *b, const T *c, const T *bias, T *d) {                         \
        T alpha = (T)p->alpha, beta = (T)p->beta;                                                                      \
        for (int bt = 0; bt < p->batch; bt++) {                                                                        \
            const T *ab = a + bt * p->sa, *bb = b + bt * p->sb, *cb = c + bt * p->sc;                                  \
            T *db = d + bt * p->sd;                                                                                    \
            for (int j = 0; j < p->n; j++) {                                                                           \
                for (int i = 0; i < p->m; i++) {                                                                       \
                    T acc = 0;                                                                                         \
                    for (int l = 0; alpha != 0 && l < p->k; l++) {                                                     \
                        T x = p->ta ? ab[l + i * p->lda] : ab[i + l * p->lda];                                         \
                        T y = p->tb ? bb[j + l * p->ldb] : bb[l + j * p->ldb];                                         \
                        acc = F(x, y, acc);                                                                            \
                    }                                                                                                  \
                    T t = alpha * acc;                                                                                 \
                    if (beta != 0 || p->read_c)                                                                        \
                        t = F(beta, cb[i + j * p->ldc], t);                                                            \
                    if (p->bias)                                                                                       \
                        t = t + bias[bt * p->sbias + i];                                                               \
                    if (p->relu)                                                                                       \
                        t = t > 0 ? t : 0;                                                                             \
                    db[i + j * p->ldd] = t;                                                                            \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
    }
REF(ref32, float, fmaf)
REF(ref64, double, fma)

/* Elements one matrix of the batch needs: (cols - 1) * ld + rows. */
static size_t span(int64_t rows, int64_t cols, int64_t ld) {
    return rows && cols ? (size_t)((cols - 1) * ld + rows) : 0;
}

/* Elements a batch of them needs, strides >= 0. */
static size_t batch_span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int batch) {
    size_t one = span(rows, cols, ld);
    return batch > 1 ? (size_t)(stride * (batch - 1)) + one : one;
}

/* How close a result must be: equal bits on the simulation; against NVIDIA's libraries a relative tolerance. */
static double tolerance = 0;

static bool same(const prob *p, const void *got, const void *want, size_t n, int line) {
    size_t es = p->f64 ? 8 : 4;
    if (!nvidia) {
        if (memcmp(got, want, n * es) == 0)
            return true;
        for (size_t i = 0; i < n; i++) {
            if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0) {
                double g = p->f64 ? ((const double *)got)[i] : ((const float *)got)[i];
                double w = p->f64 ? ((const double *)want)[i] : ((const float *)want)[i];
                fail(line, "element %zu of %zu: got %.17g want %.17g", i, n, g, w);
                return false;
            }
        }
        return true;
    }
    for (size_t i = 0; i < n; i++) {
        double g = p->f64 ? ((const double *)got)[i] : ((const float *)got)[i];
        double w = p->f64 ? ((const double *)want)[i] : ((const float *)want)[i];
        if (!(fabs(g - w) <= tolerance * (1 + fabs(w))) && !(isnan(g) && isnan(w))) {
            fail(line, "element %zu of %zu: got %.17g want %.17g", i, n, g, w);
            return false;
        }
    }
    return true;
}

/* One element as same() compares it, without a failure. */
static bool close1(bool f64, const void *got, const void *want) {
    if (!nvidia)
        return memcmp(got, want, f64 ? 8 : 4) == 0;
    double g = f64 ? *(const double *)got : *(const float *)got, w = f64 ? *(const double *)want : *(const float *)want;
    return fabs(g - w) <= tolerance * (1 + fabs(w)) || (isnan(g) && isnan(w));
}

/* ---- running one product ---------------------------------------------------- */

typedef enum {
    API_GEMM,         /* cublasSgemm_v2 / cublasDgemm_v2 */
    API_GEMM_EX,      /* cublasGemmEx */
    API_BATCHED,      /* cublasSgemmStridedBatched / cublasDgemmStridedBatched */
    API_BATCHED_EX,   /* cublasGemmStridedBatchedEx */
    API_LT,           /* cublasLtMatmul with the heuristic's algorithm */
    API_LT_NULL_ALGO, /* cublasLtMatmul with algo NULL */
} api_t;

typedef struct run_opts {
    api_t api;
    bool device_scalars;
    bool tf32;        /* the Ex products: CUBLAS_COMPUTE_32F_FAST_TF32 (Lt: as the compute type) */
    bool in_place;    /* Lt: D is C */
    CUstream stream;  /* where the work goes (cuBLAS: set on the handle) */
    bool change_host; /* host pointer mode: alpha and beta change right after the call (must not matter) */
} run_opts;

static cublasHandle_t H;
static cublasLtHandle_t LT;

/* Host and device copies of one operand. */
typedef struct buf {
    void *host;
    CUdeviceptr dev;
    size_t n;
} buf;

static bool buf_new(buf *b, const prob *p, size_t n, uint32_t seed) {
    size_t es = p->f64 ? 8 : 4, bytes = (n ? n : 1) * es;
    b->n = n;
    b->host = malloc(bytes);
    b->dev = 0;
    if (!b->host)
        return false;
    fill(b->host, p->f64, n, seed);
    if (cuMemAlloc(&b->dev, bytes) != CUDA_SUCCESS || cuMemcpyHtoD(b->dev, b->host, n * es) != CUDA_SUCCESS) {
        fail(__LINE__, "device buffer of %zu bytes", bytes);
        return false;
    }
    return true;
}

static void buf_free(buf *b) {
    free(b->host);
    /* the buffers of a case are freed at its end; a failure would show in the next case's allocations */
    if (b->dev && cuMemFree(b->dev) != CUDA_SUCCESS)
        fail(__LINE__, "cuMemFree");
    b->host = NULL;
    b->dev = 0;
}

static void *dp(const buf *b) { return (void *)(uintptr_t)b->dev; }

/* Lt: a float layout of rows x cols with ld, batch and stride, or NULL after a failure. */
static cublasLtMatrixLayout_t lt_layout(int64_t rows, int64_t cols, int64_t ld, int batch, int64_t stride) {
    cublasLtMatrixLayout_t l = NULL;
    if (cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, (uint64_t)rows, (uint64_t)cols, ld) != CUBLAS_STATUS_SUCCESS)
        return NULL;
    int32_t bc = batch;
    if (cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride) !=
            CUBLAS_STATUS_SUCCESS) {
        EXPECT(cublasLtMatrixLayoutDestroy(l) == CUBLAS_STATUS_SUCCESS, "layout destroy");
        return NULL;
    }
    return l;
}

/* The Lt product of p: descriptor, layouts, heuristic (API_LT), matmul. */
static cublasStatus_t lt_matmul(const prob *p, const run_opts *o, const void *alpha, const void *beta, const buf *a,
                                const buf *b, const buf *c, const buf *bias, const buf *d) {
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t st =
        cublasLtMatmulDescCreate(&desc, o->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    int32_t ta = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int32_t pm = o->device_scalars ? CUBLASLT_POINTER_MODE_DEVICE : CUBLASLT_POINTER_MODE_HOST;
    uint32_t epi = p->bias ? (p->relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                           : (p->relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
    void *bias_ptr = p->bias ? dp(bias) : NULL;
    int64_t bias_stride = p->sbias;
    if ((st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
        (st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) ||
        (st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm)) ||
        (st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) ||
        (p->bias &&
         ((st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof bias_ptr)) ||
          (st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_stride,
                                               sizeof bias_stride)))))
        goto out;
    la = lt_layout(p->ta ? p->k : p->m, p->ta ? p->m : p->k, p->lda, p->batch, p->sa);
    lb = lt_layout(p->tb ? p->n : p->k, p->tb ? p->k : p->n, p->ldb, p->batch, p->sb);
    lc = lt_layout(p->m, p->n, p->ldc, p->batch, p->sc);
    ld = lt_layout(p->m, p->n, p->ldd, p->batch, p->sd);
    if (!la || !lb || !lc || !ld) {
        st = CUBLAS_STATUS_INTERNAL_ERROR;
        goto out;
    }
    cublasLtMatmulHeuristicResult_t res;
    const cublasLtMatmulAlgo_t *algo = NULL;
    if (o->api == API_LT) {
        int count = -1;
        if ((st = cublasLtMatmulPreferenceCreate(&pref)) ||
            (st = cublasLtMatmulAlgoGetHeuristic(LT, desc, la, lb, lc, ld, pref, 1, &res, &count)))
            goto out;
        if (count != 1 || res.state != CUBLAS_STATUS_SUCCESS || res.workspaceSize != 0) {
            fail(__LINE__, "heuristic: %d results, state %s, workspace %zu", count, st_name(res.state),
                 res.workspaceSize);
            st = CUBLAS_STATUS_INTERNAL_ERROR;
            goto out;
        }
        algo = &res.algo;
    }
    st = cublasLtMatmul(LT, desc, alpha, dp(a), la, dp(b), lb, beta, dp(c), lc, o->in_place ? dp(c) : dp(d), ld, algo,
                        NULL, 0, o->stream);
out:
    EXPECT(cublasLtMatmulDescDestroy(desc) == CUBLAS_STATUS_SUCCESS, "desc destroy");
    EXPECT(!la || cublasLtMatrixLayoutDestroy(la) == CUBLAS_STATUS_SUCCESS, "layout destroy");
    EXPECT(!lb || cublasLtMatrixLayoutDestroy(lb) == CUBLAS_STATUS_SUCCESS, "layout destroy");
    EXPECT(!lc || cublasLtMatrixLayoutDestroy(lc) == CUBLAS_STATUS_SUCCESS, "layout destroy");
    EXPECT(!ld || cublasLtMatrixLayoutDestroy(ld) == CUBLAS_STATUS_SUCCESS, "layout destroy");
    EXPECT(!pref || cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS, "preference destroy");
    return st;
}

/*
 * Runs p through o->api and compares the whole output buffer (padding
 * included) with the reference. Leading dimensions and strides of 0 in p
 * are filled in: the rows (plus the case's padding) and the matrix's span.
 */
static void run(prob p, const run_opts *o, int line) {
    bool lt = o->api == API_LT || o->api == API_LT_NULL_ALGO;
    int64_t ra = p.ta ? p.k : p.m, ca = p.ta ? p.m : p.k, rb = p.tb ? p.n : p.k, cb = p.tb ? p.k : p.n;
    if (!lt && o->api != API_BATCHED && o->api != API_BATCHED_EX)
        p.batch = 1;
    bool out_is_c = !lt || o->in_place; /* cuBLAS writes C; Lt a D of its own unless in place */
    if (out_is_c) {
        p.ldd = p.ldc;
        p.sd = p.sc;
    }
    size_t na = batch_span(ra, ca, p.lda, p.sa, p.batch), nb = batch_span(rb, cb, p.ldb, p.sb, p.batch);
    size_t nc = batch_span(p.m, p.n, p.ldc, p.sc, p.batch), nd = batch_span(p.m, p.n, p.ldd, p.sd, p.batch);
    size_t nbias = p.bias ? batch_span(p.m, 1, p.m, p.sbias, p.batch) : 0;
    size_t es = p.f64 ? 8 : 4;
    /*
     * A beta of -0.0: NVIDIA's strided batched products of two or more
     * matrices in host pointer mode multiply C by it (C's NaNs show), device
     * pointer mode never does, and a single product's kernels differ from one
     * shape to the next (measured). So C holds NaNs for a zero beta only where
     * what becomes of them is known: a beta of +0.0, and -0.0 but in host
     * pointer mode where C may or may not be read.
     */
    p.read_c = (o->api == API_BATCHED || o->api == API_BATCHED_EX) && p.batch >= 2 && !o->device_scalars &&
               p.beta == 0 && signbit(p.beta);
    bool nan_c = p.beta == 0 && (!signbit(p.beta) || p.read_c || o->device_scalars);
    buf a = {0}, b = {0}, c = {0}, d = {0}, bias = {0}, scal = {0};
    void *want = NULL, *got = NULL;
    if (!buf_new(&a, &p, na, 0xA0 + (uint32_t)line) || !buf_new(&b, &p, nb, 0xB0 + (uint32_t)line) ||
        !buf_new(&c, &p, nc, 0xC0 + (uint32_t)line) || !buf_new(&bias, &p, nbias, 0xB1A5 + (uint32_t)line) ||
        !buf_new(&d, &p, out_is_c ? 0 : nd, 0xD0 + (uint32_t)line))
        goto out;
    /* beta +0.0: C is not read, so NaNs there must not show (-0.0 where C is read: they must) */
    if (nan_c) {
        fill_nan(c.host, p.f64, nc);
        if (cuMemcpyHtoD(c.dev, c.host, nc * es) != CUDA_SUCCESS)
            fail(line, "upload");
    }
    buf *out = out_is_c ? &c : &d;
    size_t nout = out->n;
    want = malloc(nout * es + 1);
    got = malloc(nout * es + 1);
    if (!want || !got) {
        fail(line, "out of memory");
        goto out;
    }
    memcpy(want, out->host, nout * es);
    if (p.f64)
        ref64(&p, a.host, b.host, c.host, bias.host, want);
    else
        ref32(&p, a.host, b.host, c.host, bias.host, want);

    /* the scalars: on the host, or in device memory (set on the stream just before the product) */
    float a32 = (float)p.alpha, b32 = (float)p.beta;
    double a64 = p.alpha, b64 = p.beta;
    const void *alpha = p.f64 ? (const void *)&a64 : (const void *)&a32;
    const void *beta = p.f64 ? (const void *)&b64 : (const void *)&b32;
    if (o->device_scalars) {
        if (cuMemAlloc(&scal.dev, 16) != CUDA_SUCCESS || cuMemsetD32(scal.dev, 0xFFFFFFFFu, 4) != CUDA_SUCCESS ||
            cuMemcpyHtoDAsync(scal.dev, alpha, es, o->stream) != CUDA_SUCCESS ||
            cuMemcpyHtoDAsync(scal.dev + 8, beta, es, o->stream) != CUDA_SUCCESS) {
            fail(line, "device scalars");
            goto out;
        }
        alpha = (const void *)(uintptr_t)scal.dev;
        beta = (const void *)(uintptr_t)(scal.dev + 8);
    }
    if (!lt) {
        if (cublasSetStream_v2(H, o->stream) != CUBLAS_STATUS_SUCCESS ||
            cublasSetPointerMode_v2(H, o->device_scalars ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST) !=
                CUBLAS_STATUS_SUCCESS) {
            fail(line, "handle settings");
            goto out;
        }
    }
    cublasOperation_t ta = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType ty = p.f64 ? CUDA_R_64F : CUDA_R_32F;
    cublasComputeType_t ct = p.f64 ? CUBLAS_COMPUTE_64F : o->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    int lda = (int)p.lda, ldb = (int)p.ldb, ldc = (int)p.ldc;
    cublasStatus_t st = CUBLAS_STATUS_INTERNAL_ERROR;
    switch (o->api) {
    case API_GEMM:
        st = p.f64 ? cublasDgemm_v2(H, ta, tb, p.m, p.n, p.k, alpha, dp(&a), lda, dp(&b), ldb, beta, dp(&c), ldc)
                   : cublasSgemm_v2(H, ta, tb, p.m, p.n, p.k, alpha, dp(&a), lda, dp(&b), ldb, beta, dp(&c), ldc);
        break;
    case API_GEMM_EX:
        st = cublasGemmEx(H, ta, tb, p.m, p.n, p.k, alpha, dp(&a), ty, lda, dp(&b), ty, ldb, beta, dp(&c), ty, ldc, ct,
                          CUBLAS_GEMM_DEFAULT);
        break;
    case API_BATCHED:
        st = p.f64 ? cublasDgemmStridedBatched(H, ta, tb, p.m, p.n, p.k, alpha, dp(&a), lda, p.sa, dp(&b), ldb, p.sb,
                                               beta, dp(&c), ldc, p.sc, p.batch)
                   : cublasSgemmStridedBatched(H, ta, tb, p.m, p.n, p.k, alpha, dp(&a), lda, p.sa, dp(&b), ldb, p.sb,
                                               beta, dp(&c), ldc, p.sc, p.batch);
        break;
    case API_BATCHED_EX:
        st = cublasGemmStridedBatchedEx(H, ta, tb, p.m, p.n, p.k, alpha, dp(&a), ty, lda, p.sa, dp(&b), ty, ldb, p.sb,
                                        beta, dp(&c), ty, ldc, p.sc, p.batch, ct, CUBLAS_GEMM_DEFAULT);
        break;
    case API_LT:
    case API_LT_NULL_ALGO: st = lt_matmul(&p, o, alpha, beta, &a, &b, &c, &bias, &d); break;
    }
    if (o->change_host) {
        a32 = b32 = 1e30f;
        a64 = b64 = 1e300;
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        fail(line, "the product: %s", st_name(st));
        goto out;
    }
    if (cuStreamSynchronize(o->stream) != CUDA_SUCCESS || cuMemcpyDtoH(got, out->dev, nout * es) != CUDA_SUCCESS) {
        fail(line, "synchronize and download");
        goto out;
    }
    same(&p, got, want, nout, line);
out:
    free(want);
    free(got);
    buf_free(&a);
    buf_free(&b);
    buf_free(&c);
    buf_free(&d);
    buf_free(&bias);
    buf_free(&scal);
    if (!lt && (cublasSetStream_v2(H, NULL) != CUBLAS_STATUS_SUCCESS ||
                cublasSetPointerMode_v2(H, CUBLAS_POINTER_MODE_HOST) != CUBLAS_STATUS_SUCCESS))
        fail(line, "handle reset");
}

/* A problem with leading dimensions padded by pad over the rows and batch strides extra elements beyond a matrix. */
static prob problem(bool f64, bool ta, bool tb, int m, int n, int k, int pad, int extra, int batch, double alpha,
                    double beta) {
    prob p = {.f64 = f64, .ta = ta, .tb = tb, .m = m, .n = n, .k = k, .batch = batch, .alpha = alpha, .beta = beta};
    int64_t ra = ta ? k : m, rb = tb ? n : k;
    p.lda = (ra > 1 ? ra : 1) + pad;
    p.ldb = (rb > 1 ? rb : 1) + pad;
    p.ldc = (m > 1 ? m : 1) + pad;
    p.ldd = (m > 1 ? m : 1) + 2 * pad;
    p.sa = (int64_t)span(ra, ta ? m : k, p.lda) + extra;
    p.sb = (int64_t)span(rb, tb ? k : n, p.ldb) + extra;
    p.sc = (int64_t)span(m, n, p.ldc) + extra;
    p.sd = (int64_t)span(m, n, p.ldd) + extra;
    p.sbias = m + extra;
    return p;
}

/* ---- cases: cuBLAS ------------------------------------------------------------ */

static CUstream S; /* a non-blocking stream of the context */

/* Every transpose combination on odd sizes, with and without padding, for one API and element type. */
static void products(api_t api, bool f64, bool batched) {
    static const int sizes[][3] = {{7, 5, 3}, {13, 9, 11}, {1, 17, 4}, {16, 1, 19}, {33, 20, 8}};
    static const double scal[][2] = {{1.0, 0.0}, {0.75, -1.25}, {-2.0, 0.5}, {1.0, 1.0}, {0.5, -0.0}};
    int line = 1;
    for (int t = 0; t < 4; t++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            int pad = (int)((s + (size_t)t) % 3) * 2 + (s % 2);
            prob p = problem(f64, t & 1, t & 2, sizes[s][0], sizes[s][1], sizes[s][2], pad, batched ? 5 : 0,
                             batched ? 3 : 1, scal[s][0], scal[s][1]);
            run_opts o = {.api = api, .stream = (s % 2) ? S : NULL, .change_host = s == 2};
            run(p, &o, line++);
        }
    }
}

static void c_sgemm(void) { products(API_GEMM, false, false); }
static void c_dgemm(void) { products(API_GEMM, true, false); }
static void c_gemmex_f32(void) { products(API_GEMM_EX, false, false); }
static void c_gemmex_f64(void) { products(API_GEMM_EX, true, false); }
static void c_sgemm_batched(void) { products(API_BATCHED, false, true); }
static void c_dgemm_batched(void) { products(API_BATCHED, true, true); }
static void c_gemm_batched_ex(void) {
    products(API_BATCHED_EX, false, true);
    products(API_BATCHED_EX, true, true);
}

/* FAST_TF32 is computed in full float here; a GPU rounds the inputs to TF32 (--nvidia loosens the tolerance). */
static void c_gemmex_tf32(void) {
    double tol = tolerance;
    if (nvidia)
        tolerance = 1e-2;
    prob p = problem(false, false, true, 21, 14, 9, 3, 0, 1, 1.5, 0.25);
    run_opts o = {.api = API_GEMM_EX, .tf32 = true};
    run(p, &o, 1);
    p = problem(false, true, false, 12, 7, 30, 1, 4, 3, -1.0, 2.0);
    o.api = API_BATCHED_EX;
    run(p, &o, 2);
    tolerance = tol;
}

/* Batches that share an operand (stride 0) and a batch of one. */
static void c_batched_strides(void) {
    prob p = problem(false, false, false, 9, 6, 5, 2, 3, 4, 1.0, 0.5);
    p.sa = 0; /* every batch multiplies the same A */
    run_opts o = {.api = API_BATCHED};
    run(p, &o, 1);
    p = problem(true, true, true, 9, 6, 5, 0, 0, 3, -0.5, 1.0);
    p.sb = 0;
    run(p, &o, 2);
    p = problem(false, true, false, 11, 3, 7, 1, 0, 1, 2.0, 0.0);
    o.api = API_BATCHED_EX;
    run(p, &o, 3);
    /* a beta of -0.0 multiplies C (of NaNs) for two matrices or more */
    p = problem(false, false, true, 7, 5, 3, 1, 2, 2, 1.0, -0.0);
    o.api = API_BATCHED;
    run(p, &o, 4);
    p = problem(true, true, false, 6, 4, 5, 0, 0, 2, 0.5, -0.0);
    o.api = API_BATCHED_EX;
    run(p, &o, 5);
}

/* Pointer mode DEVICE: alpha and beta are read from device memory when the kernel runs. */
static void c_device_scalars(void) {
    static const api_t apis[] = {API_GEMM, API_GEMM_EX, API_BATCHED, API_BATCHED_EX};
    int line = 1;
    for (size_t i = 0; i < sizeof apis / sizeof apis[0]; i++) {
        for (int f64 = 0; f64 < 2; f64++) {
            prob p = problem(f64, i % 2, f64, 10, 7, 6, 1, 2, 3, 0.625, -1.5);
            run_opts o = {.api = apis[i], .device_scalars = true, .stream = S};
            run(p, &o, line++);
            /* a beta of -0.0 read from the device is zero: C (of NaNs) is not read */
            p = problem(f64, !f64, i % 2, 9, 8, 5, 2, 1, 2, -1.25, -0.0);
            run(p, &o, line++);
        }
    }
}

/* beta == 0: C is not read (NaNs there stay out); alpha == 0 or k == 0: A and B are not. */
static void c_special_scalars(void) {
    for (int f64 = 0; f64 < 2; f64++) {
        prob p = problem(f64, false, false, 8, 5, 4, 1, 0, 1, 1.0, 0.0);
        p.ldd = p.ldc; /* the product writes C */
        run_opts o = {.api = API_GEMM};
        /* C full of NaN before a beta == 0 product */
        size_t es = f64 ? 8 : 4, nc = span(p.m, p.n, p.ldc), na = span(p.m, p.k, p.lda), nb = span(p.k, p.n, p.ldb);
        void *hc = malloc(nc * es), *ha = malloc(na * es), *hb = malloc(nb * es), *hw = malloc(nc * es);
        CUdeviceptr a = 0, b = 0, c = 0;
        if (!hc || !ha || !hb || !hw || cuMemAlloc(&a, na * es) || cuMemAlloc(&b, nb * es) || cuMemAlloc(&c, nc * es)) {
            fail(__LINE__, "buffers");
        } else {
            fill(ha, f64, na, 1);
            fill(hb, f64, nb, 2);
            fill_nan(hc, f64, nc);
            memcpy(hw, hc, nc * es);
            if (f64)
                ref64(&p, ha, hb, hc, NULL, hw);
            else
                ref32(&p, ha, hb, hc, NULL, hw);
            double one = 1, zero = 0;
            float onef = 1, zerof = 0;
            if (cuMemcpyHtoD(a, ha, na * es) || cuMemcpyHtoD(b, hb, nb * es) || cuMemcpyHtoD(c, hc, nc * es))
                fail(__LINE__, "upload");
            cublasStatus_t st = f64 ? cublasDgemm_v2(H, CUBLAS_OP_N, CUBLAS_OP_N, p.m, p.n, p.k, &one,
                                                     (double *)(uintptr_t)a, (int)p.lda, (double *)(uintptr_t)b,
                                                     (int)p.ldb, &zero, (double *)(uintptr_t)c, (int)p.ldc)
                                    : cublasSgemm_v2(H, CUBLAS_OP_N, CUBLAS_OP_N, p.m, p.n, p.k, &onef,
                                                     (float *)(uintptr_t)a, (int)p.lda, (float *)(uintptr_t)b,
                                                     (int)p.ldb, &zerof, (float *)(uintptr_t)c, (int)p.ldc);
            EXPECT(st == CUBLAS_STATUS_SUCCESS, "gemm with C of NaN: %s", st_name(st));
            if (cuCtxSynchronize() || cuMemcpyDtoH(hc, c, nc * es))
                fail(__LINE__, "download");
            for (int j = 0; j < p.n; j++)
                for (int i = 0; i < p.m; i++) {
                    double v = f64 ? ((double *)hc)[i + j * p.ldc] : ((float *)hc)[i + j * p.ldc];
                    EXPECT(!isnan(v), "C[%d,%d] is NaN after a product with beta 0", i, j);
                }
            same(&p, hc, hw, nc, __LINE__);
        }
        free(ha);
        free(hb);
        free(hc);
        free(hw);
        if ((a && cuMemFree(a)) || (b && cuMemFree(b)) || (c && cuMemFree(c)))
            fail(__LINE__, "cuMemFree");
        /* alpha 0 (C = beta * C) and k 0 */
        p = problem(f64, true, false, 6, 9, 5, 2, 0, 1, 0.0, -0.75);
        run(p, &o, 100 + f64);
        p = problem(f64, false, true, 6, 9, 0, 2, 0, 1, 1.0, 0.5);
        run(p, &o, 200 + f64);
    }
}

/* Nothing to compute: success, and C untouched. */
static void c_empty(void) {
    float one = 1, half = 0.5f;
    float host[4] = {1, 2, 3, 4}, back[4];
    CUdeviceptr c;
    CU(cuMemAlloc(&c, sizeof host));
    CU(cuMemcpyHtoD(c, host, sizeof host));
    float *C = (float *)(uintptr_t)c;
    EXPECT_ST(cublasSgemm_v2(H, CUBLAS_OP_N, CUBLAS_OP_N, 0, 2, 2, &one, C, 1, C, 2, &half, C, 1),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSgemm_v2(H, CUBLAS_OP_N, CUBLAS_OP_N, 2, 0, 2, &one, C, 2, C, 2, &half, C, 2),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(
        cublasSgemmStridedBatched(H, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, C, 2, 4, C, 2, 4, &half, C, 2, 4, 0),
        CUBLAS_STATUS_SUCCESS);
    CU(cuCtxSynchronize());
    CU(cuMemcpyDtoH(back, c, sizeof back));
    EXPECT(memcmp(host, back, sizeof host) == 0, "C changed by an empty product");
    CU(cuMemFree(c));
}

/* The documented argument errors. */
static void c_gemm_errors(void) {
    float one = 1;
    double oned = 1;
    CUdeviceptr buf;
    CU(cuMemAlloc(&buf, 4096));
    CU(cuMemsetD32(buf, 0x3F800000u, 1024)); /* 1.0f: what no refused call may change */
    float *P = (float *)(uintptr_t)buf;
    double *PD = (double *)(uintptr_t)buf;
    const cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T;
    /* no handle */
    EXPECT_ST(cublasSgemm_v2(NULL, N, N, 2, 2, 2, &one, P, 2, P, 2, &one, P, 2), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasDgemm_v2(NULL, N, N, 2, 2, 2, &oned, PD, 2, PD, 2, &oned, PD, 2), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasGemmEx(NULL, N, N, 2, 2, 2, &one, P, CUDA_R_32F, 2, P, CUDA_R_32F, 2, &one, P, CUDA_R_32F, 2,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasSgemmStridedBatched(NULL, N, N, 2, 2, 2, &one, P, 2, 4, P, 2, 4, &one, P, 2, 4, 2),
              CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasDgemmStridedBatched(NULL, N, N, 2, 2, 2, &oned, PD, 2, 4, PD, 2, 4, &oned, PD, 2, 4, 2),
              CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasGemmStridedBatchedEx(NULL, N, N, 2, 2, 2, &one, P, CUDA_R_32F, 2, 4, P, CUDA_R_32F, 2, 4, &one, P,
                                         CUDA_R_32F, 2, 4, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_INITIALIZED);
    /* negative sizes and counts */
    EXPECT_ST(cublasSgemm_v2(H, N, N, -1, 2, 2, &one, P, 2, P, 2, &one, P, 2), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemm_v2(H, N, N, 2, -1, 2, &one, P, 2, P, 2, &one, P, 2), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemm_v2(H, N, N, 2, 2, -1, &one, P, 2, P, 2, &one, P, 2), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasDgemm_v2(H, N, N, 2, 2, -3, &oned, PD, 2, PD, 2, &oned, PD, 2), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemmStridedBatched(H, N, N, 2, 2, 2, &one, P, 2, 4, P, 2, 4, &one, P, 2, 4, -1),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasDgemmStridedBatched(H, N, N, 2, 2, 2, &oned, PD, 2, 4, PD, 2, 4, &oned, PD, 2, 4, -2),
              CUBLAS_STATUS_INVALID_VALUE);
    /* cublasGemmStridedBatchedEx checks every other argument first, then takes a negative count to a launch, which
     * fails for this small float product (measured: -1, -2, -100 and INT_MIN; other kernels return SUCCESS) */
    EXPECT_ST(cublasGemmStridedBatchedEx(H, N, N, -1, 2, 2, &one, P, CUDA_R_32F, 2, 4, P, CUDA_R_32F, 2, 4, &one, P,
                                         CUDA_R_32F, 2, 4, -2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasGemmStridedBatchedEx(H, N, N, 2, 2, 2, &one, P, CUDA_R_32F, 2, 4, P, CUDA_R_32F, 2, 4, &one, P,
                                         CUDA_R_32F, 1, 4, -2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasGemmStridedBatchedEx(H, (cublasOperation_t)7, N, 2, 2, 2, &one, P, CUDA_R_32F, 2, 4, P, CUDA_R_32F,
                                         2, 4, &one, P, CUDA_R_32F, 2, 4, -2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasGemmStridedBatchedEx(H, N, N, 2, 2, 2, &one, P, CUDA_R_32F, 2, 4, P, CUDA_R_32F, 2, 4, &one, P,
                                         CUDA_R_32F, 2, 4, -2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_EXECUTION_FAILED);
    EXPECT_ST(cublasGemmStridedBatchedEx(H, N, N, 2, 2, 2, &one, P, CUDA_R_32F, 2, 4, P, CUDA_R_32F, 2, 4, &one, P,
                                         CUDA_R_32F, 2, 4, INT32_MIN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_EXECUTION_FAILED);
    /* nothing of it ran: the buffer is as it was */
    {
        float back[1024];
        CU(cuCtxSynchronize());
        CU(cuMemcpyDtoH(back, buf, sizeof back));
        int changed = 0;
        for (int i = 0; i < 1024; i++)
            changed += back[i] != 1.0f;
        EXPECT(changed == 0, "%d elements changed by refused products", changed);
    }
    /* leading dimensions below the rows: lda (N: m, T: k), ldb (N: k, T: n), ldc (m), and below 1 */
    EXPECT_ST(cublasSgemm_v2(H, N, N, 5, 3, 4, &one, P, 4, P, 4, &one, P, 5), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemm_v2(H, T, N, 5, 3, 4, &one, P, 3, P, 4, &one, P, 5), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemm_v2(H, N, N, 5, 3, 4, &one, P, 5, P, 3, &one, P, 5), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemm_v2(H, N, T, 5, 3, 4, &one, P, 5, P, 2, &one, P, 5), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemm_v2(H, N, N, 5, 3, 4, &one, P, 5, P, 4, &one, P, 4), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemm_v2(H, N, N, 0, 3, 4, &one, P, 0, P, 4, &one, P, 1), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasDgemm_v2(H, T, T, 5, 3, 4, &oned, PD, 4, PD, 3, &oned, PD, 4), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasGemmEx(H, N, N, 5, 3, 4, &one, P, CUDA_R_32F, 4, P, CUDA_R_32F, 4, &one, P, CUDA_R_32F, 5,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE);
    /* operations other than N, T and C */
    EXPECT_ST(cublasSgemm_v2(H, (cublasOperation_t)7, N, 2, 2, 2, &one, P, 2, P, 2, &one, P, 2),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemm_v2(H, N, (cublasOperation_t)-1, 2, 2, 2, &one, P, 2, P, 2, &one, P, 2),
              CUBLAS_STATUS_INVALID_VALUE);
    /* no alpha or beta */
    EXPECT_ST(cublasSgemm_v2(H, N, N, 2, 2, 2, NULL, P, 2, P, 2, &one, P, 2), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemm_v2(H, N, N, 2, 2, 2, &one, P, 2, P, 2, NULL, P, 2), CUBLAS_STATUS_INVALID_VALUE);
    /* C counts as the transpose of a real matrix */
    EXPECT_ST(cublasSgemm_v2(H, CUBLAS_OP_C, CUBLAS_OP_C, 2, 2, 2, &one, P, 2, P, 2, &one, P + 8, 2),
              CUBLAS_STATUS_SUCCESS);
    CU(cuCtxSynchronize());
    CU(cuMemFree(buf));
}

/* The Ex products compute float with a float compute type and double with 64F, nothing else (here). */
static void c_gemmex_types(void) {
    if (nvidia)
        return; /* NVIDIA's computes many more combinations */
    if (served)
        return; /* types that NVIDIA's computes are sent asynchronously: the refusal comes later */
    float one = 1;
    double oned = 1;
    CUdeviceptr buf;
    CU(cuMemAlloc(&buf, 4096));
    void *P = (void *)(uintptr_t)buf;
    const cublasOperation_t N = CUBLAS_OP_N;
    EXPECT_ST(cublasGemmEx(H, N, N, 2, 2, 2, &one, P, CUDA_R_16F, 2, P, CUDA_R_16F, 2, &one, P, CUDA_R_16F, 2,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_ST(cublasGemmEx(H, N, N, 2, 2, 2, &one, P, CUDA_R_32F, 2, P, CUDA_R_64F, 2, &one, P, CUDA_R_32F, 2,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_ST(cublasGemmEx(H, N, N, 2, 2, 2, &oned, P, CUDA_R_32F, 2, P, CUDA_R_32F, 2, &oned, P, CUDA_R_32F, 2,
                           CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_ST(cublasGemmEx(H, N, N, 2, 2, 2, &one, P, CUDA_R_64F, 2, P, CUDA_R_64F, 2, &one, P, CUDA_R_64F, 2,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_ST(cublasGemmEx(H, N, N, 2, 2, 2, &one, P, CUDA_R_32F, 2, P, CUDA_R_32F, 2, &one, P, CUDA_R_32F, 2,
                           CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_ST(cublasGemmStridedBatchedEx(H, N, N, 2, 2, 2, &one, P, CUDA_R_8I, 2, 4, P, CUDA_R_8I, 2, 4, &one, P,
                                         CUDA_R_32I, 2, 4, 2, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_SUPPORTED);
    CU(cuMemFree(buf));
}

/*
 * A launch the driver refuses is EXECUTION_FAILED: work on the legacy stream
 * while a blocking stream captures would join that capture (measured: the
 * driver invalidates the capture, cuStreamEndCapture then says 901, where the
 * simulator refuses the launch alone). A non-blocking stream's capture leaves
 * the legacy stream alone: the product runs, outside the capture.
 */
static void c_execution_failed(void) {
    float one = 1, host[48], back[16];
    CUdeviceptr buf;
    CUstream cs;
    CUgraph g = NULL;
    CUresult r;
    CU(cuMemAlloc(&buf, 4096));
    float *P = (float *)(uintptr_t)buf;
    /* A (at P) = 1..16, B (at P + 16) the identity, C (at P + 32) 0: C = A * B + C = A */
    for (int i = 0; i < 16; i++) {
        host[i] = (float)(i + 1);
        host[16 + i] = i % 5 == 0 ? 1.0f : 0.0f;
        host[32 + i] = 0;
    }
    CU(cuMemcpyHtoD(buf, host, sizeof host));

    CU(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    CU(cuStreamBeginCapture_v2(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT_ST(cublasSgemm_v2(H, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, P, 4, P + 16, 4, &one, P + 32, 4),
              CUBLAS_STATUS_SUCCESS);
    r = cuStreamEndCapture(cs, &g);
    EXPECT(r == CUDA_SUCCESS && g, "cuStreamEndCapture of the non-blocking stream: %d", (int)r);
    if (g)
        CU(cuGraphDestroy(g));
    CU(cuStreamDestroy(cs));
    CU(cuCtxSynchronize());
    CU(cuMemcpyDtoH(back, buf + 128, sizeof back));
    EXPECT(memcmp(back, host, sizeof back) == 0, "the product on the legacy stream did not run (C[0] = %g, want 1)",
           back[0]);

    if (served) {
        /* the product is an asynchronous record whose launch fails in the worker: it says so later */
        CU(cuMemFree(buf));
        return;
    }
    CU(cuStreamCreate(&cs, CU_STREAM_DEFAULT));
    CU(cuStreamBeginCapture_v2(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT_ST(cublasSgemm_v2(H, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, P, 4, P + 16, 4, &one, P + 32, 4),
              CUBLAS_STATUS_EXECUTION_FAILED);
    g = NULL;
    r = cuStreamEndCapture(cs, &g);
    /* the driver invalidated the capture (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 901); the simulator refused the
     * launch without it */
    EXPECT(nvidia ? (int)r == 901 && !g : r == CUDA_SUCCESS, "cuStreamEndCapture of the blocking stream: %d", (int)r);
    if (g)
        CU(cuGraphDestroy(g));
    CU(cuStreamDestroy(cs));
    CU(cuCtxSynchronize());
    CU(cuMemcpyDtoH(back, buf + 128, sizeof back));
    EXPECT(memcmp(back, host, sizeof back) == 0, "the refused product changed C (C[0] = %g, want 1)", back[0]);
    CU(cuMemFree(buf));
}

/* The handle's settings, and a NULL handle for each. */
static void c_handle(void) {
    int v = 0, major = -1, minor = -1, patch = -1;
    EXPECT_ST(cublasGetVersion_v2(H, &v), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasGetProperty(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasGetProperty(MINOR_VERSION, &minor), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasGetProperty(PATCH_LEVEL, &patch), CUBLAS_STATUS_SUCCESS);
    EXPECT(v == major * 10000 + minor * 100 + patch, "version %d, properties %d.%d.%d", v, major, minor, patch);
    EXPECT(major == 13, "major version %d", major);
    EXPECT_ST(cublasGetProperty((libraryPropertyType)3, &v), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasGetProperty(MAJOR_VERSION, NULL), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT(cublasGetCudartVersion() >= 13000, "cudart version %zu", cublasGetCudartVersion());
    static const cublasStatus_t all[] = {CUBLAS_STATUS_SUCCESS,          CUBLAS_STATUS_NOT_INITIALIZED,
                                         CUBLAS_STATUS_ALLOC_FAILED,     CUBLAS_STATUS_INVALID_VALUE,
                                         CUBLAS_STATUS_ARCH_MISMATCH,    CUBLAS_STATUS_MAPPING_ERROR,
                                         CUBLAS_STATUS_EXECUTION_FAILED, CUBLAS_STATUS_INTERNAL_ERROR,
                                         CUBLAS_STATUS_NOT_SUPPORTED,    CUBLAS_STATUS_LICENSE_ERROR};
    static const char *const names[] = {"CUBLAS_STATUS_SUCCESS",          "CUBLAS_STATUS_NOT_INITIALIZED",
                                        "CUBLAS_STATUS_ALLOC_FAILED",     "CUBLAS_STATUS_INVALID_VALUE",
                                        "CUBLAS_STATUS_ARCH_MISMATCH",    "CUBLAS_STATUS_MAPPING_ERROR",
                                        "CUBLAS_STATUS_EXECUTION_FAILED", "CUBLAS_STATUS_INTERNAL_ERROR",
                                        "CUBLAS_STATUS_NOT_SUPPORTED",    "CUBLAS_STATUS_LICENSE_ERROR"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const char *s = cublasGetStatusString(all[i]);
        EXPECT(strcmp(cublasGetStatusName(all[i]), names[i]) == 0, "name of %d: %s", (int)all[i],
               cublasGetStatusName(all[i]));
        EXPECT(s && *s, "no string for %d", (int)all[i]);
    }
    EXPECT(cublasGetStatusName((cublasStatus_t)99) && cublasGetStatusString((cublasStatus_t)99),
           "no text for an unknown status");

    CUstream got = (CUstream)1;
    EXPECT_ST(cublasGetStream_v2(H, &got), CUBLAS_STATUS_SUCCESS);
    EXPECT(got == NULL, "a new handle's stream is %p", (void *)got);
    EXPECT_ST(cublasSetStream_v2(H, S), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasGetStream_v2(H, &got), CUBLAS_STATUS_SUCCESS);
    EXPECT(got == S, "stream %p, set %p", (void *)got, (void *)S);
    EXPECT_ST(cublasSetStream_v2(H, NULL), CUBLAS_STATUS_SUCCESS);

    cublasPointerMode_t pm = (cublasPointerMode_t)9;
    EXPECT_ST(cublasGetPointerMode_v2(H, &pm), CUBLAS_STATUS_SUCCESS);
    EXPECT(pm == CUBLAS_POINTER_MODE_HOST, "pointer mode %d", (int)pm);
    EXPECT_ST(cublasSetPointerMode_v2(H, CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasGetPointerMode_v2(H, &pm), CUBLAS_STATUS_SUCCESS);
    EXPECT(pm == CUBLAS_POINTER_MODE_DEVICE, "pointer mode %d", (int)pm);
    EXPECT_ST(cublasSetPointerMode_v2(H, (cublasPointerMode_t)5), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSetPointerMode_v2(H, CUBLAS_POINTER_MODE_HOST), CUBLAS_STATUS_SUCCESS);

    cublasMath_t mm = (cublasMath_t)77;
    EXPECT_ST(cublasGetMathMode(H, &mm), CUBLAS_STATUS_SUCCESS);
    EXPECT(mm == CUBLAS_DEFAULT_MATH, "math mode %d", (int)mm);
    EXPECT_ST(cublasSetMathMode(H, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasGetMathMode(H, &mm), CUBLAS_STATUS_SUCCESS);
    EXPECT(mm == CUBLAS_TF32_TENSOR_OP_MATH, "math mode %d", (int)mm);
    EXPECT_ST(
        cublasSetMathMode(H, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
        CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSetMathMode(H, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);

    cublasAtomicsMode_t am = (cublasAtomicsMode_t)7;
    EXPECT_ST(cublasGetAtomicsMode(H, &am), CUBLAS_STATUS_SUCCESS);
    EXPECT(am == CUBLAS_ATOMICS_NOT_ALLOWED, "atomics mode %d", (int)am);
    EXPECT_ST(cublasSetAtomicsMode(H, CUBLAS_ATOMICS_ALLOWED), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasGetAtomicsMode(H, &am), CUBLAS_STATUS_SUCCESS);
    EXPECT(am == CUBLAS_ATOMICS_ALLOWED, "atomics mode %d", (int)am);
    EXPECT_ST(cublasSetAtomicsMode(H, CUBLAS_ATOMICS_NOT_ALLOWED), CUBLAS_STATUS_SUCCESS);

    /* NVIDIA's takes any workspace (measured): what does not fit shows in the dot product (c_dot_workspace) */
    CUdeviceptr ws;
    CU(cuMemAlloc(&ws, 1 << 20));
    EXPECT_ST(cublasSetWorkspace_v2(H, (void *)(uintptr_t)ws, 1 << 20), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSetWorkspace_v2(H, (void *)(uintptr_t)(ws + 4), 1 << 19), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSetWorkspace_v2(H, (void *)(uintptr_t)(ws + 1), 3), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSetWorkspace_v2(H, NULL, 0), CUBLAS_STATUS_SUCCESS);
    /* the default pool again */
    EXPECT_ST(cublasSetStream_v2(H, NULL), CUBLAS_STATUS_SUCCESS);
    CU(cuMemFree(ws));

    EXPECT_ST(cublasSetStream_v2(NULL, S), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasGetStream_v2(NULL, &got), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasSetPointerMode_v2(NULL, CUBLAS_POINTER_MODE_HOST), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasGetPointerMode_v2(NULL, &pm), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasSetMathMode(NULL, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasGetMathMode(NULL, &mm), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasSetAtomicsMode(NULL, CUBLAS_ATOMICS_ALLOWED), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasGetAtomicsMode(NULL, &am), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasSetWorkspace_v2(NULL, NULL, 0), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasDestroy_v2(NULL), CUBLAS_STATUS_NOT_INITIALIZED);

    /* a second handle: its own settings, destroyed again */
    cublasHandle_t h2 = NULL;
    REQUIRE_ST(cublasCreate_v2(&h2), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasGetPointerMode_v2(h2, &pm), CUBLAS_STATUS_SUCCESS);
    EXPECT(pm == CUBLAS_POINTER_MODE_HOST, "pointer mode of a new handle %d", (int)pm);
    EXPECT_ST(cublasDestroy_v2(h2), CUBLAS_STATUS_SUCCESS);
}

/*
 * A handle made on a thread with no current context belongs to device 0's
 * primary context. cublasCreate makes it current there (as the runtime
 * does); cublasLtCreate leaves the thread without one (measured). The
 * products of either, on a thread with no current context, make it current
 * and run.
 */
typedef struct no_ctx_result {
    char why[256]; /* empty: every step as expected */
} no_ctx_result;

#define NC_STEP(cond, ...)                                                                                             \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            snprintf(res->why, sizeof res->why, __VA_ARGS__);                                                          \
            return NULL;                                                                                               \
        }                                                                                                              \
    } while (0)

static void *no_context_thread(void *arg) {
    no_ctx_result *res = arg;
    cublasHandle_t h = NULL;
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t lay = NULL;
    CUcontext cur = NULL;
    float one = 1, zero = 0, host[4] = {1, 2, 3, 4}, back[4];
    CUdeviceptr p;
    CUresult r;
    cublasStatus_t st;
    snprintf(res->why, sizeof res->why, "did not finish");
    NC_STEP(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == NULL, "a new thread's current context is %p", (void *)cur);
    st = cublasCreate_v2(&h);
    NC_STEP(st == CUBLAS_STATUS_SUCCESS, "cublasCreate_v2: %s", st_name(st));
    cur = NULL;
    NC_STEP(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx,
            "after cublasCreate_v2 the current context is %p, the primary one %p", (void *)cur, (void *)ctx);
    NC_STEP(cuCtxSetCurrent(NULL) == CUDA_SUCCESS, "cuCtxSetCurrent(NULL)");
    st = cublasLtCreate(&lt);
    NC_STEP(st == CUBLAS_STATUS_SUCCESS, "cublasLtCreate: %s", st_name(st));
    cur = (CUcontext)1;
    NC_STEP(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == NULL,
            "after cublasLtCreate the current context is %p, want none (the primary one is %p)", (void *)cur,
            (void *)ctx);
    r = cuMemAlloc(&p, 64);
    NC_STEP(r != CUDA_SUCCESS, "cuMemAlloc without a current context succeeded");
    NC_STEP(cuCtxSetCurrent(ctx) == CUDA_SUCCESS && cuMemAlloc(&p, 64) == CUDA_SUCCESS &&
                cuMemcpyHtoD(p, host, sizeof host) == CUDA_SUCCESS && cuCtxSetCurrent(NULL) == CUDA_SUCCESS,
            "buffer");
    float *P = (float *)(uintptr_t)p;
    /* C (2x2 at P + 8) = A * A, A the 2x2 at P: column-major [1 3; 2 4] squared is [7 15; 10 22] */
    st = cublasSgemm_v2(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, P, 2, P, 2, &zero, P + 8, 2);
    NC_STEP(st == CUBLAS_STATUS_SUCCESS, "cublasSgemm_v2 without a current context: %s", st_name(st));
    cur = NULL;
    NC_STEP(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx,
            "after cublasSgemm_v2 without a current context the current one is %p, want %p", (void *)cur, (void *)ctx);
    r = cuCtxSynchronize();
    NC_STEP(r == CUDA_SUCCESS && cuMemcpyDtoH(back, p + 32, sizeof back) == CUDA_SUCCESS, "synchronize: %d", (int)r);
    NC_STEP(back[0] == 7 && back[1] == 10 && back[2] == 15 && back[3] == 22, "cublasSgemm_v2 gave %g %g %g %g", back[0],
            back[1], back[2], back[3]);
    /* the same through the Lt handle, its module in the context the thread did not have */
    NC_STEP(cuMemsetD32(p + 32, 0, 4) == CUDA_SUCCESS && cuCtxSetCurrent(NULL) == CUDA_SUCCESS, "reset");
    NC_STEP(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
                cublasLtMatrixLayoutCreate(&lay, CUDA_R_32F, 2, 2, 2) == CUBLAS_STATUS_SUCCESS,
            "Lt descriptors");
    st = cublasLtMatmul(lt, desc, &one, P, lay, P, lay, &zero, P + 8, lay, P + 8, lay, NULL, NULL, 0, NULL);
    NC_STEP(st == CUBLAS_STATUS_SUCCESS, "cublasLtMatmul without a current context: %s", st_name(st));
    cur = NULL;
    NC_STEP(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx,
            "after cublasLtMatmul without a current context the current one is %p, want %p", (void *)cur, (void *)ctx);
    r = cuCtxSynchronize();
    NC_STEP(r == CUDA_SUCCESS && cuMemcpyDtoH(back, p + 32, sizeof back) == CUDA_SUCCESS, "synchronize: %d", (int)r);
    NC_STEP(back[0] == 7 && back[1] == 10 && back[2] == 15 && back[3] == 22, "cublasLtMatmul gave %g %g %g %g", back[0],
            back[1], back[2], back[3]);
    NC_STEP(cublasLtMatmulDescDestroy(desc) == CUBLAS_STATUS_SUCCESS &&
                cublasLtMatrixLayoutDestroy(lay) == CUBLAS_STATUS_SUCCESS,
            "Lt descriptors' destroy");
    NC_STEP(cuMemFree(p) == CUDA_SUCCESS, "cuMemFree");
    st = cublasDestroy_v2(h);
    NC_STEP(st == CUBLAS_STATUS_SUCCESS, "cublasDestroy_v2: %s", st_name(st));
    st = cublasLtDestroy(lt);
    NC_STEP(st == CUBLAS_STATUS_SUCCESS, "cublasLtDestroy: %s", st_name(st));
    res->why[0] = 0;
    return NULL;
}

static void c_no_context(void) {
    pthread_t t;
    no_ctx_result res = {""};
    if (pthread_create(&t, NULL, no_context_thread, &res) != 0 || pthread_join(t, NULL) != 0) {
        fail(__LINE__, "thread");
        return;
    }
    EXPECT(!res.why[0], "a handle made without a current context: %s", res.why);
}

/* ---- cases: gemv and dot ----------------------------------------------------------- */

/* Where element i of a vector of len elements with increment inc lies: BLAS walks it from its end if inc < 0. */
static size_t vidx(int64_t i, int64_t len, int64_t inc) { return (size_t)(inc > 0 ? i * inc : (len - 1 - i) * -inc); }

/* Elements a vector of len with increment inc spans. */
static size_t vspan(int64_t len, int64_t inc) { return len > 0 ? (size_t)((len - 1) * (inc < 0 ? -inc : inc) + 1) : 0; }

typedef struct vprob {
    bool f64;
    cublasOperation_t trans;
    int m, n, lda, incx, incy;
    double alpha, beta;
} vprob;

/*
 * How NVIDIA's gemv reads A for an operation (measured): op(A)'s rows and
 * columns, and where its element (i, l) is, A[i * rs + l * cs]. N and CONJG
 * are A, T and C its transpose, any other operation the transpose of an
 * n x m matrix. *need: the rows lda must cover.
 */
static void gemv_layout(const vprob *p, int *rows, int *cols, size_t *rs, size_t *cs, int *need) {
    switch (p->trans) {
    case CUBLAS_OP_N:
    case CUBLAS_OP_CONJG: *rows = p->m, *cols = p->n, *rs = 1, *cs = (size_t)p->lda, *need = p->m; return;
    case CUBLAS_OP_T:
    case CUBLAS_OP_C: *rows = p->n, *cols = p->m, *rs = (size_t)p->lda, *cs = 1, *need = p->m; return;
    }
    *rows = p->m, *cols = p->n, *rs = (size_t)p->lda, *cs = 1, *need = p->n;
}

/*
 * sbkern.h's gemv, element by element: y = alpha * op(A) * x + beta * y,
 * with BLAS's quick returns; only >= 0: that row alone (incy 0, where every
 * row writes y[0] and one of them stays).
 */
#define GEMV_REF(NAME, T, F)                                                                                           \
    static void NAME(const vprob *p, const T *a, const T *x, T *y, int only) {                                         \
        T alpha = (T)p->alpha, beta = (T)p->beta;                                                                      \
        int rows, cols, need;                                                                                          \
        size_t rs, cs;                                                                                                 \
        gemv_layout(p, &rows, &cols, &rs, &cs, &need);                                                                 \
        if (rows <= 0 || cols <= 0 || (alpha == 0 && beta == 1))                                                       \
            return;                                                                                                    \
        for (int i = only >= 0 ? only : 0; i < (only >= 0 ? only + 1 : rows); i++) {                                   \
            T acc = 0;                                                                                                 \
            for (int l = 0; alpha != 0 && l < cols; l++)                                                               \
                acc = F(a[(size_t)i * rs + (size_t)l * cs], x[vidx(l, cols, p->incx)], acc);                           \
            T r = alpha * acc, *yi = &y[vidx(i, rows, p->incy)];                                                       \
            if (beta != 0)                                                                                             \
                r = F(beta, *yi, r);                                                                                   \
            *yi = r;                                                                                                   \
        }                                                                                                              \
    }
GEMV_REF(gemv_ref32, float, fmaf)
GEMV_REF(gemv_ref64, double, fma)

/* The dot product in order: acc = fma(x_i, y_i, acc) for i = 0 .. n-1 (0 for n <= 0). */
#define DOT_REF(NAME, T, F)                                                                                            \
    static T NAME(int n, const T *x, int incx, const T *y, int incy) {                                                 \
        T acc = 0;                                                                                                     \
        for (int i = 0; i < n; i++)                                                                                    \
            acc = F(x[vidx(i, n, incx)], y[vidx(i, n, incy)], acc);                                                    \
        return acc;                                                                                                    \
    }
DOT_REF(dot_ref32, float, fmaf)
DOT_REF(dot_ref64, double, fma)

/*
 * Against NVIDIA's libraries, whose sums go in an order of their own: a gemv
 * row or a dot of hundreds of elements may differ by more than the gemm
 * cases' tolerance.
 */
static double vec_tolerance(bool f64) { return f64 ? 1e-12 : 1e-4; }

typedef struct vrun_opts {
    bool device_scalars;
    CUstream stream;
    bool change_host; /* host pointer mode: alpha and beta change right after the call (must not matter) */
    bool nan_a;       /* A and x hold NaNs (alpha 0: they must not be read) */
} vrun_opts;

/* Runs p through cublasSgemv_v2 / cublasDgemv_v2 and compares the whole y buffer (the gaps included). */
static void run_gemv(vprob p, const vrun_opts *o, int line) {
    int rows, cols, need;
    size_t rs, cs;
    gemv_layout(&p, &rows, &cols, &rs, &cs, &need);
    prob q = {.f64 = p.f64};
    size_t es = p.f64 ? 8 : 4, na = rows && cols ? (size_t)(rows - 1) * rs + (size_t)(cols - 1) * cs + 1 : 0;
    size_t nx = vspan(cols, p.incx), ny = vspan(rows, p.incy);
    buf a = {0}, x = {0}, y = {0}, scal = {0};
    void *want = NULL, *got = NULL;
    cublasStatus_t st;
    if (!buf_new(&a, &q, na, 0x6A0 + (uint32_t)line) || !buf_new(&x, &q, nx, 0x6B0 + (uint32_t)line) ||
        !buf_new(&y, &q, ny, 0x6C0 + (uint32_t)line))
        goto out;
    /* beta == 0: y is not read, so NaNs there must not show; likewise A and x with alpha == 0 */
    if (p.beta == 0) {
        fill_nan(y.host, p.f64, ny);
        if (cuMemcpyHtoD(y.dev, y.host, ny * es) != CUDA_SUCCESS)
            fail(line, "upload");
    }
    if (o->nan_a) {
        fill_nan(a.host, p.f64, na);
        fill_nan(x.host, p.f64, nx);
        if (cuMemcpyHtoD(a.dev, a.host, na * es) != CUDA_SUCCESS ||
            cuMemcpyHtoD(x.dev, x.host, nx * es) != CUDA_SUCCESS)
            fail(line, "upload");
    }
    want = malloc(ny * es + 1);
    got = malloc(ny * es + 1);
    if (!want || !got) {
        fail(line, "out of memory");
        goto out;
    }
    memcpy(want, y.host, ny * es);
    if (p.f64)
        gemv_ref64(&p, a.host, x.host, want, -1);
    else
        gemv_ref32(&p, a.host, x.host, want, -1);

    float a32 = (float)p.alpha, b32 = (float)p.beta;
    double a64 = p.alpha, b64 = p.beta;
    const void *alpha = p.f64 ? (const void *)&a64 : (const void *)&a32;
    const void *beta = p.f64 ? (const void *)&b64 : (const void *)&b32;
    if (o->device_scalars) {
        if (cuMemAlloc(&scal.dev, 16) != CUDA_SUCCESS || cuMemsetD32(scal.dev, 0xFFFFFFFFu, 4) != CUDA_SUCCESS ||
            cuMemcpyHtoDAsync(scal.dev, alpha, es, o->stream) != CUDA_SUCCESS ||
            cuMemcpyHtoDAsync(scal.dev + 8, beta, es, o->stream) != CUDA_SUCCESS) {
            fail(line, "device scalars");
            goto out;
        }
        alpha = (const void *)(uintptr_t)scal.dev;
        beta = (const void *)(uintptr_t)(scal.dev + 8);
    }
    if (cublasSetStream_v2(H, o->stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetPointerMode_v2(H, o->device_scalars ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST) !=
            CUBLAS_STATUS_SUCCESS) {
        fail(line, "handle settings");
        goto out;
    }
    st = p.f64 ? cublasDgemv_v2(H, p.trans, p.m, p.n, alpha, dp(&a), p.lda, dp(&x), p.incx, beta, dp(&y), p.incy)
               : cublasSgemv_v2(H, p.trans, p.m, p.n, alpha, dp(&a), p.lda, dp(&x), p.incx, beta, dp(&y), p.incy);
    if (o->change_host) {
        a32 = b32 = 1e30f;
        a64 = b64 = 1e300;
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        fail(line, "gemv %dx%d trans %d incx %d incy %d: %s", p.m, p.n, (int)p.trans, p.incx, p.incy, st_name(st));
        goto out;
    }
    if (cuStreamSynchronize(o->stream) != CUDA_SUCCESS || cuMemcpyDtoH(got, y.dev, ny * es) != CUDA_SUCCESS) {
        fail(line, "synchronize and download");
        goto out;
    }
    double tol = tolerance;
    if (nvidia)
        tolerance = vec_tolerance(p.f64);
    if (p.incy == 0 && rows > 1 && !(p.alpha == 0 && p.beta == 1)) {
        /* every row wrote y[0]: one row's value, computed from y[0] as it was, must be what stayed */
        bool found = false;
        for (int r = 0; r < rows && !found; r++) {
            double c64;
            float c32;
            void *cand = p.f64 ? (void *)&c64 : (void *)&c32;
            memcpy(cand, y.host, es);
            if (p.f64)
                gemv_ref64(&p, a.host, x.host, cand, r);
            else
                gemv_ref32(&p, a.host, x.host, cand, r);
            found = close1(p.f64, got, cand);
        }
        if (!found)
            fail(line, "gemv %dx%d trans %d incy 0: y[0] = %.17g is no row's value", p.m, p.n, (int)p.trans,
                 p.f64 ? *(const double *)got : *(const float *)got);
    } else if (!same(&q, got, want, ny, line)) {
        fail(line, "gemv %dx%d trans %d lda %d incx %d incy %d alpha %g beta %g", p.m, p.n, (int)p.trans, p.lda, p.incx,
             p.incy, p.alpha, p.beta);
    }
    tolerance = tol;
out:
    free(want);
    free(got);
    buf_free(&a);
    buf_free(&x);
    buf_free(&y);
    buf_free(&scal);
    if (cublasSetStream_v2(H, NULL) != CUBLAS_STATUS_SUCCESS ||
        cublasSetPointerMode_v2(H, CUBLAS_POINTER_MODE_HOST) != CUBLAS_STATUS_SUCCESS)
        fail(line, "handle reset");
}

static const int vec_incs[][2] = {{1, 1}, {2, 3}, {-1, 1}, {1, -2}, {-3, -1}, {3, 2}};
#define NINCS (sizeof vec_incs / sizeof vec_incs[0])

/* Every operation on odd sizes (and more rows than a block has threads), padded A, increments of either sign. */
static void gemv_cases(bool f64) {
    static const int sizes[][2] = {{7, 5}, {13, 9}, {1, 17}, {16, 1}, {33, 20}, {300, 260}};
    static const double scal[][2] = {{1.0, 0.0}, {0.75, -1.25}, {-2.0, 0.5}, {1.0, 1.0}, {0.5, -0.0}};
    static const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C};
    int line = 1;
    for (size_t t = 0; t < sizeof ops / sizeof ops[0]; t++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            for (size_t inc = 0; inc < NINCS; inc += 1 + (s + t) % 2) {
                size_t k = (s + inc + t) % (sizeof scal / sizeof scal[0]);
                int m = sizes[s][0], pad = (int)((s + inc) % 3) * 2;
                vprob p = {.f64 = f64,
                           .trans = ops[t],
                           .m = m,
                           .n = sizes[s][1],
                           .lda = m + pad,
                           .incx = vec_incs[inc][0],
                           .incy = vec_incs[inc][1],
                           .alpha = scal[k][0],
                           .beta = scal[k][1]};
                vrun_opts o = {.stream = (s + inc) % 2 ? S : NULL, .change_host = inc == 2};
                run_gemv(p, &o, line++);
            }
        }
    }
}

static void c_sgemv(void) { gemv_cases(false); }
static void c_dgemv(void) { gemv_cases(true); }

/* Pointer mode DEVICE: alpha and beta read from device memory when the kernel runs. */
static void c_gemv_device_scalars(void) {
    static const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
    int line = 1;
    for (int f64 = 0; f64 < 2; f64++) {
        for (size_t t = 0; t < 2; t++) {
            for (size_t inc = 0; inc < NINCS; inc += 2) {
                vprob p = {.f64 = f64,
                           .trans = ops[t],
                           .m = 19,
                           .n = 11,
                           .lda = 22,
                           .incx = vec_incs[inc][0],
                           .incy = vec_incs[inc][1],
                           .alpha = 0.625,
                           .beta = inc == 2 ? 0.0 : -1.5};
                vrun_opts o = {.device_scalars = true, .stream = t ? S : NULL};
                run_gemv(p, &o, line++);
            }
        }
        /* the quick return alpha 0, beta 1 is taken where the scalars are read, in the kernel */
        vprob p = {.f64 = f64, .trans = CUBLAS_OP_T, .m = 9, .n = 6, .lda = 9, .incx = -1, .incy = 2, .beta = 1.0};
        vrun_opts o = {.device_scalars = true, .stream = S, .nan_a = true};
        run_gemv(p, &o, line++);
    }
}

/*
 * BLAS's quick returns: an empty A leaves y as it is (even with beta 0);
 * alpha 0 reads neither A nor x (NaNs there stay out), and with beta 1
 * leaves y as it is.
 */
static void c_gemv_special(void) {
    int line = 1;
    for (int f64 = 0; f64 < 2; f64++) {
        vprob p = {.f64 = f64, .trans = CUBLAS_OP_N, .m = 8, .n = 5, .lda = 9, .incx = 1, .incy = -2, .beta = 0.5};
        vrun_opts o = {.nan_a = true};
        run_gemv(p, &o, line++); /* alpha 0: y = beta * y */
        p.beta = 1.0;
        run_gemv(p, &o, line++); /* alpha 0, beta 1: y untouched */
        p.trans = CUBLAS_OP_T;
        p.beta = 0.0;
        run_gemv(p, &o, line++); /* alpha 0, beta 0: y = 0, its NaNs not read */
    }
    /* m or n 0: nothing happens, y's NaNs and all (beta 0 would otherwise write y) */
    float one = 1, zero = 0, host[8], back[8];
    fill_nan(host, false, 8);
    CUdeviceptr yd;
    CU(cuMemAlloc(&yd, sizeof host));
    CU(cuMemcpyHtoD(yd, host, sizeof host));
    float *Y = (float *)(uintptr_t)yd;
    EXPECT_ST(cublasSgemv_v2(H, CUBLAS_OP_N, 0, 4, &one, Y, 1, Y, 1, &zero, Y, 1), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSgemv_v2(H, CUBLAS_OP_N, 4, 0, &one, Y, 4, Y, 1, &zero, Y, 1), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSgemv_v2(H, CUBLAS_OP_T, 4, 0, &one, Y, 4, Y, 1, &zero, Y, 1), CUBLAS_STATUS_SUCCESS);
    CU(cuCtxSynchronize());
    CU(cuMemcpyDtoH(back, yd, sizeof back));
    for (int i = 0; i < 8; i++)
        EXPECT(isnan(back[i]), "y[%d] = %g after an empty gemv", i, back[i]);
    CU(cuMemFree(yd));
}

/*
 * The argument errors of NVIDIA's gemv (measured): an empty or negative size
 * returns at once, before anything is checked; then only lda is, against m
 * (N, CONJG, T and C) or n (any other operation). Increments of 0 and other
 * operations compute (c_gemv_odd_args). Nothing here writes y.
 */
static void c_gemv_errors(void) {
    float one = 1;
    double oned = 1;
    CUdeviceptr buf;
    CU(cuMemAlloc(&buf, 4096));
    CU(cuMemsetD32(buf, 0x3F800000u, 1024)); /* 1.0f */
    float *P = (float *)(uintptr_t)buf;
    double *PD = (double *)(uintptr_t)buf;
    const cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T, O7 = (cublasOperation_t)7;
    EXPECT_ST(cublasSgemv_v2(NULL, N, 2, 2, &one, P, 2, P, 1, &one, P + 8, 1), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasDgemv_v2(NULL, N, 2, 2, &oned, PD, 2, PD, 1, &oned, PD + 8, 1), CUBLAS_STATUS_NOT_INITIALIZED);
    /* negative and empty sizes: the quick return, whatever else is wrong */
    EXPECT_ST(cublasSgemv_v2(H, N, -1, 2, &one, P, 2, P, 1, &one, P + 8, 1), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSgemv_v2(H, N, 2, -1, &one, P, 2, P, 1, &one, P + 8, 1), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasDgemv_v2(H, T, -3, 2, &oned, PD, 2, PD, 1, &oned, PD + 8, 1), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSgemv_v2(H, N, -1, -1, &one, P, 1, P, 1, &one, P + 8, 1), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSgemv_v2(H, N, 0, 3, &one, P, 0, P, 1, &one, P + 64, 1), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSgemv_v2(H, T, 0, 3, &one, P, 0, P, 1, &one, P + 64, 1), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSgemv_v2(H, N, 3, 0, &one, P, 0, P, 1, &one, P + 64, 1), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSgemv_v2(H, N, -1, 2, &one, P, 0, P, 1, &one, P + 8, 1), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSgemv_v2(H, O7, -1, 2, &one, P, 2, P, 1, &one, P + 8, 1), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasSgemv_v2(H, O7, 3, 0, &one, P, 3, P, 1, &one, P + 8, 1), CUBLAS_STATUS_SUCCESS);
    /* lda below max(1, m), whatever the operation of N, T, C and CONJG, and whatever the increments */
    EXPECT_ST(cublasSgemv_v2(H, N, 5, 3, &one, P, 4, P, 1, &one, P + 64, 1), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemv_v2(H, T, 5, 3, &one, P, 3, P, 1, &one, P + 64, 1), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasDgemv_v2(H, T, 5, 3, &oned, PD, 4, PD, 1, &oned, PD + 64, 1), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemv_v2(H, CUBLAS_OP_CONJG, 3, 2, &one, P, 2, P, 1, &one, P + 64, 1), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemv_v2(H, N, 3, 2, &one, P, -1, P, 1, &one, P + 64, 1), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemv_v2(H, N, 3, 2, &one, P, 2, P, 0, &one, P + 64, 1), CUBLAS_STATUS_INVALID_VALUE);
    /* any other operation: lda below max(1, n) */
    EXPECT_ST(cublasSgemv_v2(H, O7, 3, 2, &one, P, 1, P, 1, &one, P + 64, 1), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemv_v2(H, O7, 2, 3, &one, P, 2, P, 1, &one, P + 64, 1), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasSgemv_v2(H, O7, 3, 2, &one, P, 0, P, 1, &one, P + 64, 1), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasDgemv_v2(H, (cublasOperation_t)-1, 2, 3, &oned, PD, 2, PD, 1, &oned, PD + 64, 1),
              CUBLAS_STATUS_INVALID_VALUE);
    if (!nvidia) {
        /* no alpha or beta (NVIDIA's reads them without a check) */
        EXPECT_ST(cublasSgemv_v2(H, N, 2, 2, NULL, P, 2, P, 1, &one, P + 8, 1), CUBLAS_STATUS_INVALID_VALUE);
        EXPECT_ST(cublasSgemv_v2(H, N, 2, 2, &one, P, 2, P, 1, NULL, P + 8, 1), CUBLAS_STATUS_INVALID_VALUE);
    }
    float back[1024];
    CU(cuCtxSynchronize());
    CU(cuMemcpyDtoH(back, buf, sizeof back));
    int changed = 0;
    for (int i = 0; i < 1024; i++)
        changed += back[i] != 1.0f;
    EXPECT(changed == 0, "%d elements changed by gemv calls that return at once or are refused", changed);
    CU(cuMemFree(buf));
}

/*
 * What NVIDIA's gemv computes where BLAS would refuse (measured): an
 * increment of 0 is a step of 0 (x: x[0] for every element; y: every row
 * writes y[0], one row's value stays); CONJG computes as N; any other
 * operation as T would on an n x m matrix (y has m elements, x n, op(A)'s
 * element (i, l) is A[l + i * lda]).
 */
static void c_gemv_odd_args(void) {
    static const struct {
        int trans, m, n, lda, incx, incy;
        double alpha, beta;
    } cases[] = {
        {CUBLAS_OP_N, 7, 5, 9, 0, 1, 1.25, 0.5},
        {CUBLAS_OP_T, 13, 9, 13, 0, -2, -0.75, 1.5},
        {CUBLAS_OP_N, 6, 4, 6, 0, 0, 1.0, 0.0},
        {CUBLAS_OP_T, 5, 8, 7, 2, 0, 0.5, 0.0},
        {CUBLAS_OP_N, 9, 3, 9, -1, 0, 1.5, -2.0},
        {CUBLAS_OP_T, 4, 6, 5, 1, 0, 2.0, 0.25},
        {CUBLAS_OP_CONJG, 11, 7, 13, 1, 1, 0.75, -1.25},
        {CUBLAS_OP_CONJG, 6, 9, 6, -2, 3, -1.0, 0.0},
        {7, 3, 2, 3, 1, 1, 1.0, 2.0},
        {7, 5, 3, 3, 1, 1, 0.5, 0.25},
        {-1, 8, 11, 12, 1, -1, -1.5, 0.5},
        {4, 6, 6, 8, -1, 2, 1.0, 0.0},
        {7, 9, 4, 5, 0, 1, 0.625, 1.0},
    };
    int line = 1;
    for (int f64 = 0; f64 < 2; f64++) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            vprob p = {.f64 = f64,
                       .trans = (cublasOperation_t)cases[i].trans,
                       .m = cases[i].m,
                       .n = cases[i].n,
                       .lda = cases[i].lda,
                       .incx = cases[i].incx,
                       .incy = cases[i].incy,
                       .alpha = cases[i].alpha,
                       .beta = cases[i].beta};
            vrun_opts o = {.stream = i % 2 ? S : NULL, .device_scalars = i == 3};
            run_gemv(p, &o, line++);
        }
    }
}

/*
 * One dot product of n elements with increments incx and incy, in the pointer
 * mode given, on stream s: host mode must return with the result in place
 * (no synchronization before it is read); device mode must write the result
 * and nothing beside it.
 */
static void run_dot(bool f64, int n, int incx, int incy, bool device, CUstream s, int line) {
    prob q = {.f64 = f64};
    size_t es = f64 ? 8 : 4, nx = vspan(n, incx), ny = vspan(n, incy);
    buf x = {0}, y = {0}, r = {0};
    /* the result: element 1 of 3; the host result starts as NaN, so an unwritten one shows */
    double want[3], got[3], host_r64 = NAN;
    float host_r32 = NAN;
    cublasStatus_t st;
    if (!buf_new(&x, &q, nx, 0xD07 + (uint32_t)line) || !buf_new(&y, &q, ny, 0xD08 + (uint32_t)line) ||
        !buf_new(&r, &q, 3, 0xD09 + (uint32_t)line))
        goto out;
    for (int i = 0; i < 3; i++)
        want[i] = f64 ? ((double *)r.host)[i] : ((float *)r.host)[i];
    want[1] = f64 ? dot_ref64(n, x.host, incx, y.host, incy) : dot_ref32(n, x.host, incx, y.host, incy);
    if (cublasSetStream_v2(H, s) != CUBLAS_STATUS_SUCCESS ||
        cublasSetPointerMode_v2(H, device ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST) !=
            CUBLAS_STATUS_SUCCESS) {
        fail(line, "handle settings");
        goto out;
    }
    void *res = device ? (void *)(uintptr_t)(r.dev + es) : f64 ? (void *)&host_r64 : (void *)&host_r32;
    st = f64 ? cublasDdot_v2(H, n, dp(&x), incx, dp(&y), incy, res)
             : cublasSdot_v2(H, n, dp(&x), incx, dp(&y), incy, res);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fail(line, "dot n %d incx %d incy %d: %s", n, incx, incy, st_name(st));
        goto out;
    }
    if (device) {
        unsigned char back[24];
        if (cuStreamSynchronize(s) != CUDA_SUCCESS || cuMemcpyDtoH(back, r.dev, 3 * es) != CUDA_SUCCESS) {
            fail(line, "synchronize and download");
            goto out;
        }
        for (int i = 0; i < 3; i++) {
            float v32;
            double v64;
            memcpy(f64 ? (void *)&v64 : (void *)&v32, back + i * es, es);
            got[i] = f64 ? v64 : v32;
        }
    } else {
        got[0] = want[0];
        got[1] = f64 ? host_r64 : host_r32;
        got[2] = want[2];
    }
    /* compared as doubles: a float converts exactly, so equal bits stay equal */
    double tol = tolerance;
    if (nvidia)
        tolerance = vec_tolerance(f64);
    prob q64 = {.f64 = true};
    if (!same(&q64, got, want, 3, line))
        fail(line, "dot %s n %d incx %d incy %d, %s pointer mode", f64 ? "double" : "float", n, incx, incy,
             device ? "device" : "host");
    tolerance = tol;
out:
    buf_free(&x);
    buf_free(&y);
    buf_free(&r);
    if (cublasSetStream_v2(H, NULL) != CUBLAS_STATUS_SUCCESS ||
        cublasSetPointerMode_v2(H, CUBLAS_POINTER_MODE_HOST) != CUBLAS_STATUS_SUCCESS)
        fail(line, "handle reset");
}

/* Both pointer modes, lengths beyond a block, increments of either sign, n <= 0 (the result is 0). */
static void dot_cases(bool f64) {
    static const int lens[] = {1, 7, 100, 1000, 4097, 0, -3};
    /* an increment of 0 is a step of 0, as in NVIDIA's (measured): x[0] (or y[0]) for every element */
    static const int zero_incs[][2] = {{0, 1}, {1, 0}, {0, 0}, {0, -2}, {-3, 0}};
    int line = 1;
    for (int device = 0; device < 2; device++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            for (size_t inc = 0; inc < NINCS; inc++)
                run_dot(f64, lens[l], vec_incs[inc][0], vec_incs[inc][1], device, (l + inc) % 2 ? S : NULL, line++);
            for (size_t inc = 0; inc < sizeof zero_incs / sizeof zero_incs[0]; inc++)
                run_dot(f64, lens[l], zero_incs[inc][0], zero_incs[inc][1], device, inc % 2 ? S : NULL, line++);
        }
}

static void c_sdot(void) { dot_cases(false); }
static void c_ddot(void) { dot_cases(true); }

/*
 * A host-mode dot waits for the stream's earlier work: x is replaced by a
 * device-to-device copy queued just before on the same non-blocking stream,
 * and the result must be the new x's.
 */
static void c_dot_stream_order(void) {
    for (int f64 = 0; f64 < 2; f64++) {
        prob q = {.f64 = f64};
        const int n = 5000;
        size_t es = f64 ? 8 : 4;
        buf x = {0}, x2 = {0}, y = {0};
        if (buf_new(&x, &q, n, 0x51) && buf_new(&x2, &q, n, 0x52) && buf_new(&y, &q, n, 0x53)) {
            double want = f64 ? dot_ref64(n, x2.host, 1, y.host, 1) : dot_ref32(n, x2.host, 1, y.host, 1);
            double r64 = NAN;
            float r32 = NAN;
            cublasStatus_t st = CUBLAS_STATUS_INTERNAL_ERROR;
            if (cublasSetStream_v2(H, S) != CUBLAS_STATUS_SUCCESS ||
                cuMemcpyDtoDAsync(x.dev, x2.dev, n * es, S) != CUDA_SUCCESS)
                fail(__LINE__, "stream and copy");
            else
                st = f64 ? cublasDdot_v2(H, n, dp(&x), 1, dp(&y), 1, &r64)
                         : cublasSdot_v2(H, n, dp(&x), 1, dp(&y), 1, &r32);
            EXPECT(st == CUBLAS_STATUS_SUCCESS, "dot: %s", st_name(st));
            double got = f64 ? r64 : r32;
            prob q64 = {.f64 = true};
            double tol = tolerance;
            if (nvidia)
                tolerance = vec_tolerance(f64);
            same(&q64, &got, &want, 1, __LINE__);
            tolerance = tol;
            EXPECT(cublasSetStream_v2(H, NULL) == CUBLAS_STATUS_SUCCESS, "stream reset");
        }
        buf_free(&x);
        buf_free(&x2);
        buf_free(&y);
    }
}

/* The documented argument errors; the result is left alone. */
static void c_dot_errors(void) {
    CUdeviceptr buf;
    CU(cuMemAlloc(&buf, 4096));
    float *P = (float *)(uintptr_t)buf, r = 7;
    double *PD = (double *)(uintptr_t)buf, rd = 7;
    EXPECT_ST(cublasSdot_v2(NULL, 4, P, 1, P, 1, &r), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasDdot_v2(NULL, 4, PD, 1, PD, 1, &rd), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT(r == 7 && rd == 7, "results %g %g after refused calls", r, rd);
    if (!nvidia)
        EXPECT_ST(cublasSdot_v2(H, 4, P, 1, P, 1, NULL), CUBLAS_STATUS_INVALID_VALUE);
    CU(cuCtxSynchronize());
    CU(cuMemFree(buf));
}

/*
 * The dot product's partial result goes into the handle's workspace: one
 * a user set (cublasSetWorkspace) must have room for an element from its
 * first 256-byte boundary on, or every dot is NOT_SUPPORTED, its result
 * untouched, in either pointer mode; cublasSetStream gives the default pool
 * back (measured, for n from 1 to 10^6). n <= 0 returns 0 before that.
 */
static void c_dot_workspace(void) {
    static const struct {
        unsigned off;
        size_t size;
        bool s_ok, d_ok; /* sdot, ddot */
    } wss[] = {
        {0, 0, false, false},  {0, 4, true, false},     {0, 8, true, true},
        {4, 64, false, false}, {192, 64, false, false}, {192, 300, true, true},
        {4, 300, true, true},  {256, 64, true, true},   {128, 1 << 20, true, true},
    };
    const int n = 100;
    float hx[100];
    double hxd[100];
    double want32 = 0, want64 = 0;
    for (int i = 0; i < n; i++) {
        hx[i] = (float)(i % 7) - 3;
        hxd[i] = hx[i];
        want32 += (double)hx[i] * hx[i];
    }
    want64 = want32; /* small integers: every sum is exact */
    CUdeviceptr ws, x, xd, res;
    CU(cuMemAlloc(&ws, 1 << 21));
    CU(cuMemAlloc(&x, sizeof hx));
    CU(cuMemAlloc(&xd, sizeof hxd));
    CU(cuMemAlloc(&res, 16));
    EXPECT((ws & 255) == 0, "cuMemAlloc gave %llx, not at a 256-byte boundary", (unsigned long long)ws);
    CU(cuMemcpyHtoD(x, hx, sizeof hx));
    CU(cuMemcpyHtoD(xd, hxd, sizeof hxd));
    float *X = (float *)(uintptr_t)x;
    double *XD = (double *)(uintptr_t)xd;
    for (size_t i = 0; i < sizeof wss / sizeof wss[0]; i++) {
        void *w = wss[i].off || wss[i].size ? (void *)(uintptr_t)(ws + wss[i].off) : NULL;
        EXPECT_ST(cublasSetWorkspace_v2(H, w, wss[i].size), CUBLAS_STATUS_SUCCESS);
        float r = 7;
        double rd = 7;
        cublasStatus_t s = cublasSdot_v2(H, n, X, 1, X, 1, &r), d = cublasDdot_v2(H, n, XD, 1, XD, 1, &rd);
        cublasStatus_t ws_ = wss[i].s_ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
        cublasStatus_t wd = wss[i].d_ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
        EXPECT(s == ws_ && d == wd, "workspace at +%u of %zu bytes: sdot %s ddot %s, want %s %s", wss[i].off,
               wss[i].size, st_name(s), st_name(d), st_name(ws_), st_name(wd));
        EXPECT(r == (wss[i].s_ok ? want32 : 7) && rd == (wss[i].d_ok ? want64 : 7),
               "workspace at +%u of %zu bytes: results %g %g", wss[i].off, wss[i].size, r, rd);
        /* device pointer mode: the same answer, and nothing written where the result would go */
        float minus = -5, back = 0;
        CU(cuMemcpyHtoD(res, &minus, sizeof minus));
        EXPECT_ST(cublasSetPointerMode_v2(H, CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
        s = cublasSdot_v2(H, n, X, 1, X, 1, (float *)(uintptr_t)res);
        EXPECT_ST(cublasSetPointerMode_v2(H, CUBLAS_POINTER_MODE_HOST), CUBLAS_STATUS_SUCCESS);
        CU(cuCtxSynchronize());
        CU(cuMemcpyDtoH(&back, res, sizeof back));
        EXPECT(s == ws_ && back == (wss[i].s_ok ? (float)want32 : minus),
               "workspace at +%u of %zu bytes, device pointer mode: sdot %s, result %g", wss[i].off, wss[i].size,
               st_name(s), back);
        /* an empty sum returns 0 before the workspace is looked at */
        r = 7;
        EXPECT_ST(cublasSdot_v2(H, -2, X, 0, X, 1, &r), CUBLAS_STATUS_SUCCESS);
        EXPECT(r == 0, "an empty sum with the workspace at +%u of %zu bytes: %g", wss[i].off, wss[i].size, r);
        /* the default pool again */
        EXPECT_ST(cublasSetStream_v2(H, NULL), CUBLAS_STATUS_SUCCESS);
        r = 7;
        EXPECT_ST(cublasSdot_v2(H, n, X, 1, X, 1, &r), CUBLAS_STATUS_SUCCESS);
        EXPECT(r == want32, "sdot with the default workspace again: %g", r);
    }
    CU(cuMemFree(ws));
    CU(cuMemFree(x));
    CU(cuMemFree(xd));
    CU(cuMemFree(res));
}

/* ---- cases: cuBLASLt --------------------------------------------------------------- */

static void c_lt_library(void) {
    int major = -1, minor = -1, patch = -1, v = 0;
    EXPECT_ST(cublasLtGetProperty(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasLtGetProperty(MINOR_VERSION, &minor), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasLtGetProperty(PATCH_LEVEL, &patch), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasLtGetProperty(MAJOR_VERSION, NULL), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT(cublasLtGetVersion() == (size_t)(major * 10000 + minor * 100 + patch), "Lt version %zu, properties %d.%d.%d",
           cublasLtGetVersion(), major, minor, patch);
    EXPECT_ST(cublasGetVersion_v2(H, &v), CUBLAS_STATUS_SUCCESS);
    EXPECT(cublasLtGetVersion() == (size_t)v, "Lt version %zu, cuBLAS %d", cublasLtGetVersion(), v);
    EXPECT(cublasLtGetCudartVersion() == cublasGetCudartVersion(), "cudart versions %zu and %zu",
           cublasLtGetCudartVersion(), cublasGetCudartVersion());
    EXPECT(strcmp(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED") == 0,
           "Lt status name %s", cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED));
    EXPECT(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE) != NULL, "no Lt status string");
    /* INVALID_VALUE, where the library's other functions say NOT_INITIALIZED for a NULL handle (measured) */
    EXPECT_ST(cublasLtDestroy(NULL), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasLtCreate(NULL), CUBLAS_STATUS_INVALID_VALUE);
}

/* Attributes: the documented sizes, defaults and size queries. */
static void c_lt_attributes(void) {
    cublasLtMatmulDesc_t d = NULL;
    REQUIRE_ST(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    int32_t i32 = -1;
    uint32_t u32 = 0;
    size_t w = 0;
    EXPECT_ST(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &i32, sizeof i32, &w),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(i32 == CUBLAS_COMPUTE_32F && w == 4, "compute type %d (%zu bytes)", i32, w);
    EXPECT_ST(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &i32, sizeof i32, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(i32 == CUDA_R_32F, "scale type %d", i32);
    EXPECT_ST(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &i32, sizeof i32, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(i32 == CUBLAS_OP_N, "transa %d", i32);
    EXPECT_ST(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_POINTER_MODE, &i32, sizeof i32, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(i32 == CUBLASLT_POINTER_MODE_HOST, "pointer mode %d", i32);
    EXPECT_ST(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &u32, sizeof u32, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(u32 == CUBLASLT_EPILOGUE_DEFAULT, "epilogue %u", u32);
    /* size queries */
    static const struct {
        int attr;
        size_t size;
    } sizes[] = {
        {CUBLASLT_MATMUL_DESC_TRANSB, 4},       {CUBLASLT_MATMUL_DESC_EPILOGUE, 4},
        {CUBLASLT_MATMUL_DESC_BIAS_POINTER, 8}, {CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, 8},
        {CUBLASLT_MATMUL_DESC_FAST_ACCUM, 1},   {CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, 4},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        w = 0;
        EXPECT_ST(cublasLtMatmulDescGetAttribute(d, (cublasLtMatmulDescAttributes_t)sizes[i].attr, NULL, 0, &w),
                  CUBLAS_STATUS_SUCCESS);
        EXPECT(w == sizes[i].size, "attribute %d has %zu bytes, want %zu", sizes[i].attr, w, sizes[i].size);
    }
    EXPECT_ST(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, NULL, 0, NULL),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, NULL, 4, NULL),
              CUBLAS_STATUS_INVALID_VALUE);
    /* set: the size of the attribute's type only */
    int64_t i64 = CUBLAS_OP_T;
    EXPECT_ST(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &i64, sizeof i64),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &i64, sizeof i64, &w),
              CUBLAS_STATUS_INVALID_VALUE);
    i32 = CUBLAS_OP_T;
    EXPECT_ST(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &i32, sizeof i32), CUBLAS_STATUS_SUCCESS);
    i32 = -1;
    EXPECT_ST(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &i32, sizeof i32, &w),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(i32 == CUBLAS_OP_T && w == 4, "transa %d after setting T", i32);
    EXPECT_ST(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, NULL, 4), CUBLAS_STATUS_INVALID_VALUE);
    void *ptr = (void *)(uintptr_t)0x1000;
    EXPECT_ST(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr, 4),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr, sizeof ptr),
              CUBLAS_STATUS_SUCCESS);
    void *back = NULL;
    EXPECT_ST(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &back, sizeof back, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(back == ptr, "bias pointer %p", back);
    EXPECT_ST(cublasLtMatmulDescSetAttribute(d, (cublasLtMatmulDescAttributes_t)9999, &i32, sizeof i32),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasLtMatmulDescGetAttribute(d, (cublasLtMatmulDescAttributes_t)9999, NULL, 0, &w),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasLtMatmulDescDestroy(d), CUBLAS_STATUS_SUCCESS);

    cublasLtMatrixLayout_t l = NULL;
    REQUIRE_ST(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 7, 5, 9), CUBLAS_STATUS_SUCCESS);
    uint64_t u64 = 0;
    EXPECT_ST(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &u64, sizeof u64, &w),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(u64 == 7 && w == 8, "rows %llu", (unsigned long long)u64);
    EXPECT_ST(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &u64, sizeof u64, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(u64 == 5, "cols %llu", (unsigned long long)u64);
    EXPECT_ST(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &i64, sizeof i64, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(i64 == 9, "ld %lld", (long long)i64);
    EXPECT_ST(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_TYPE, &u32, sizeof u32, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(u32 == CUDA_R_32F, "type %u", u32);
    EXPECT_ST(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &i32, sizeof i32, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(i32 == 0, "order %d (want column-major)", i32);
    EXPECT_ST(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &i32, sizeof i32, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(i32 == 1, "batch count %d", i32);
    EXPECT_ST(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &i64, sizeof i64, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(i64 == 0, "batch stride %lld", (long long)i64);
    EXPECT_ST(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, NULL, 0, &w),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(w == 4, "batch count has %zu bytes", w);
    EXPECT_ST(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &i64, sizeof i64),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &i32, sizeof i32),
              CUBLAS_STATUS_INVALID_VALUE);
    i64 = 4096;
    EXPECT_ST(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &i64, sizeof i64),
              CUBLAS_STATUS_SUCCESS);
    i64 = 0;
    EXPECT_ST(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &i64, sizeof i64, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(i64 == 4096, "batch stride %lld after setting 4096", (long long)i64);
    EXPECT_ST(cublasLtMatrixLayoutSetAttribute(l, (cublasLtMatrixLayoutAttribute_t)9999, &i32, sizeof i32),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasLtMatrixLayoutDestroy(l), CUBLAS_STATUS_SUCCESS);

    cublasLtMatmulPreference_t p = NULL;
    REQUIRE_ST(cublasLtMatmulPreferenceCreate(&p), CUBLAS_STATUS_SUCCESS);
    u64 = 1;
    EXPECT_ST(cublasLtMatmulPreferenceGetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &u64, sizeof u64, &w),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(u64 == 0 && w == 8, "max workspace %llu", (unsigned long long)u64);
    u64 = 1 << 22;
    EXPECT_ST(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &u64, sizeof u64),
              CUBLAS_STATUS_SUCCESS);
    u64 = 0;
    EXPECT_ST(cublasLtMatmulPreferenceGetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &u64, sizeof u64, NULL),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(u64 == 1 << 22, "max workspace %llu after setting 4 MiB", (unsigned long long)u64);
    EXPECT_ST(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &u32, sizeof u32),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasLtMatmulPreferenceGetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, NULL, 0, &w),
              CUBLAS_STATUS_SUCCESS);
    EXPECT(w == 4, "min alignment has %zu bytes", w);
    EXPECT_ST(cublasLtMatmulPreferenceDestroy(p), CUBLAS_STATUS_SUCCESS);
}

/* Lt products: every transpose, padding, separate C and D, batches, epilogues, pointer modes, algorithms. */
static void c_lt_matmul(void) {
    static const int sizes[][3] = {{7, 5, 3}, {13, 9, 11}, {1, 17, 4}, {24, 6, 19}};
    int line = 1;
    for (int t = 0; t < 4; t++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            for (int variant = 0; variant < 4; variant++) {
                int batch = variant == 3 ? 3 : 1;
                prob p = problem(false, t & 1, t & 2, sizes[s][0], sizes[s][1], sizes[s][2], (int)(s + (size_t)t) % 3,
                                 batch > 1 ? 2 : 0, batch, variant == 1 ? -0.5 : 1.25, variant == 2 ? 0.0 : 0.75);
                p.bias = variant >= 2;
                p.relu = variant == 1 || variant == 3;
                run_opts o = {.api = s % 2 ? API_LT_NULL_ALGO : API_LT,
                              .device_scalars = variant == 2,
                              .stream = t % 2 ? S : NULL,
                              .change_host = variant == 0};
                run(p, &o, line++);
            }
        }
    }
    /* in place: D is C */
    prob p = problem(false, true, false, 10, 8, 6, 2, 3, 2, 0.5, 1.5);
    p.bias = true;
    run_opts o = {.api = API_LT, .in_place = true, .stream = S};
    run(p, &o, line++);
    /* a bias shared by the batches */
    p = problem(false, false, false, 6, 4, 5, 0, 0, 3, 1.0, 0.0);
    p.bias = true;
    p.sbias = 0;
    o = (run_opts){.api = API_LT};
    run(p, &o, line++);
    /* FAST_TF32 as a compute type */
    double tol = tolerance;
    if (nvidia)
        tolerance = 1e-2;
    p = problem(false, false, true, 9, 9, 9, 1, 0, 1, 1.0, 0.5);
    o = (run_opts){.api = API_LT, .tf32 = true};
    run(p, &o, line++);
    tolerance = tol;
}

/*
 * The heuristic and the product refuse what does not fit together
 * (INVALID_VALUE) and what is not computed (NOT_SUPPORTED); a heuristic
 * that fails leaves the count (and the results) as they were (measured).
 */
static void c_lt_errors(void) {
    cublasLtMatmulDesc_t d = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL, bad = NULL, row = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    REQUIRE_ST(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    REQUIRE_ST(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 8, 4, 8), CUBLAS_STATUS_SUCCESS);
    REQUIRE_ST(cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, 4, 6, 4), CUBLAS_STATUS_SUCCESS);
    REQUIRE_ST(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, 8, 6, 8), CUBLAS_STATUS_SUCCESS);
    REQUIRE_ST(cublasLtMatrixLayoutCreate(&bad, CUDA_R_32F, 5, 6, 5), CUBLAS_STATUS_SUCCESS);
    REQUIRE_ST(cublasLtMatrixLayoutCreate(&row, CUDA_R_32F, 8, 6, 6), CUBLAS_STATUS_SUCCESS);
    int32_t order_row = 1; /* CUBLASLT_ORDER_ROW */
    REQUIRE_ST(cublasLtMatrixLayoutSetAttribute(row, CUBLASLT_MATRIX_LAYOUT_ORDER, &order_row, sizeof order_row),
               CUBLAS_STATUS_SUCCESS);
    REQUIRE_ST(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t res[2];
    int count = -1;
    EXPECT_ST(cublasLtMatmulAlgoGetHeuristic(LT, d, a, b, c, c, pref, 2, res, &count), CUBLAS_STATUS_SUCCESS);
    EXPECT(count >= 1 && res[0].state == CUBLAS_STATUS_SUCCESS, "heuristic: %d results", count);
    if (!nvidia)
        EXPECT(count == 1 && res[0].workspaceSize == 0 && res[0].algo.data[0] != 0,
               "heuristic: %d results, workspace %zu, algorithm %llx", count, res[0].workspaceSize,
               (unsigned long long)res[0].algo.data[0]);
    count = -1;
    EXPECT_ST(cublasLtMatmulAlgoGetHeuristic(NULL, d, a, b, c, c, pref, 1, res, &count), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT(count == -1, "heuristic without a handle: count %d, want it untouched", count);
    EXPECT_ST(cublasLtMatmulAlgoGetHeuristic(LT, d, a, b, c, c, pref, 0, res, &count), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT(count == -1, "heuristic of 0 results: count %d, want it untouched", count);
    EXPECT_ST(cublasLtMatmulAlgoGetHeuristic(LT, d, a, b, c, c, NULL, 1, res, &count), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT(count == -1, "heuristic without a preference: count %d, want it untouched", count);
    EXPECT_ST(cublasLtMatmulAlgoGetHeuristic(LT, d, a, b, bad, bad, pref, 1, res, &count), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT(count == -1, "heuristic of shapes that do not fit: count %d, want it untouched", count);
    EXPECT_ST(cublasLtMatmulAlgoGetHeuristic(LT, d, a, a, c, c, pref, 1, res, &count), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT(count == -1, "heuristic of A times A: count %d, want it untouched", count);
    {
        /* a double A for a float compute type: not computed by either library */
        cublasLtMatrixLayout_t a64 = NULL;
        REQUIRE_ST(cublasLtMatrixLayoutCreate(&a64, CUDA_R_64F, 8, 4, 8), CUBLAS_STATUS_SUCCESS);
        EXPECT_ST(cublasLtMatmulAlgoGetHeuristic(LT, d, a64, b, c, c, pref, 1, res, &count),
                  CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT(count == -1, "heuristic of a double A: count %d, want it untouched", count);
        EXPECT_ST(cublasLtMatrixLayoutDestroy(a64), CUBLAS_STATUS_SUCCESS);
    }

    CUdeviceptr buf;
    CU(cuMemAlloc(&buf, 1 << 12));
    float one = 1, zero = 0;
    void *P = (void *)(uintptr_t)buf, *D = (void *)(uintptr_t)(buf + 2048);
    EXPECT_ST(cublasLtMatmul(NULL, d, &one, P, a, P, b, &zero, D, c, D, c, NULL, NULL, 0, NULL),
              CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_ST(cublasLtMatmul(LT, d, &one, P, a, P, b, &zero, D, bad, D, bad, NULL, NULL, 0, NULL),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasLtMatmul(LT, d, &one, P, a, P, a, &zero, D, c, D, c, NULL, NULL, 0, NULL),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_ST(cublasLtMatmul(LT, d, &one, P, a, P, b, &zero, D, c, D, c, NULL, NULL, 0, NULL), CUBLAS_STATUS_SUCCESS);
    CU(cuCtxSynchronize());

    if (!nvidia) {
        /* what the simulation does not compute: row order, half types, GELU, another algorithm (served, the products
         * that fit are sent asynchronously: their refusals come later) */
        count = -1;
        EXPECT_ST(cublasLtMatmulAlgoGetHeuristic(LT, d, a, b, row, row, pref, 1, res, &count),
                  CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT(count == -1, "heuristic of row-major C: count %d, want it untouched", count);
        if (!served)
            EXPECT_ST(cublasLtMatmul(LT, d, &one, P, a, P, b, &zero, D, row, D, row, NULL, NULL, 0, NULL),
                      CUBLAS_STATUS_NOT_SUPPORTED);
        cublasLtMatrixLayout_t half = NULL;
        REQUIRE_ST(cublasLtMatrixLayoutCreate(&half, CUDA_R_16F, 8, 4, 8), CUBLAS_STATUS_SUCCESS);
        EXPECT_ST(cublasLtMatmulAlgoGetHeuristic(LT, d, half, b, c, c, pref, 1, res, &count),
                  CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT_ST(cublasLtMatrixLayoutDestroy(half), CUBLAS_STATUS_SUCCESS);
        cublasLtMatmulAlgo_t other = {{1, 2, 3, 4, 5, 6, 7, 8}};
        if (!served)
            EXPECT_ST(cublasLtMatmul(LT, d, &one, P, a, P, b, &zero, D, c, D, c, &other, NULL, 0, NULL),
                      CUBLAS_STATUS_INVALID_VALUE);
        uint32_t gelu = CUBLASLT_EPILOGUE_GELU;
        EXPECT_ST(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &gelu, sizeof gelu),
                  CUBLAS_STATUS_SUCCESS);
        EXPECT_ST(cublasLtMatmulAlgoGetHeuristic(LT, d, a, b, c, c, pref, 1, res, &count), CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT(count == -1, "heuristic of GELU: count %d, want it untouched", count);
        /* the bias epilogue without a bias */
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        EXPECT_ST(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
                  CUBLAS_STATUS_SUCCESS);
        if (!served)
            EXPECT_ST(cublasLtMatmul(LT, d, &one, P, a, P, b, &zero, D, c, D, c, NULL, NULL, 0, NULL),
                      CUBLAS_STATUS_INVALID_VALUE);
        cublasLtMatmulDesc_t d64 = NULL;
        REQUIRE_ST(cublasLtMatmulDescCreate(&d64, CUBLAS_COMPUTE_64F, CUDA_R_64F), CUBLAS_STATUS_SUCCESS);
        EXPECT_ST(cublasLtMatmulAlgoGetHeuristic(LT, d64, a, b, c, c, pref, 1, res, &count),
                  CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT_ST(cublasLtMatmulDescDestroy(d64), CUBLAS_STATUS_SUCCESS);
    }
    CU(cuMemFree(buf));
    EXPECT_ST(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasLtMatrixLayoutDestroy(a), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasLtMatrixLayoutDestroy(b), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasLtMatrixLayoutDestroy(c), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasLtMatrixLayoutDestroy(bad), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasLtMatrixLayoutDestroy(row), CUBLAS_STATUS_SUCCESS);
    EXPECT_ST(cublasLtMatmulDescDestroy(d), CUBLAS_STATUS_SUCCESS);
}

/* ---- runner --------------------------------------------------------------------- */

typedef struct bt_case {
    const char *name;
    void (*fn)(void);
} bt_case;

static const bt_case cases[] = {
    {"handle", c_handle},
    {"no_context", c_no_context},
    {"sgemm", c_sgemm},
    {"dgemm", c_dgemm},
    {"gemmex_f32", c_gemmex_f32},
    {"gemmex_f64", c_gemmex_f64},
    {"gemmex_tf32", c_gemmex_tf32},
    {"gemmex_types", c_gemmex_types},
    {"sgemm_strided_batched", c_sgemm_batched},
    {"dgemm_strided_batched", c_dgemm_batched},
    {"gemm_strided_batched_ex", c_gemm_batched_ex},
    {"batched_strides", c_batched_strides},
    {"device_scalars", c_device_scalars},
    {"special_scalars", c_special_scalars},
    {"empty", c_empty},
    {"gemm_errors", c_gemm_errors},
    {"sgemv", c_sgemv},
    {"dgemv", c_dgemv},
    {"gemv_device_scalars", c_gemv_device_scalars},
    {"gemv_special", c_gemv_special},
    {"gemv_errors", c_gemv_errors},
    {"gemv_odd_args", c_gemv_odd_args},
    {"sdot", c_sdot},
    {"ddot", c_ddot},
    {"dot_stream_order", c_dot_stream_order},
    {"dot_errors", c_dot_errors},
    {"dot_workspace", c_dot_workspace},
    {"lt_library", c_lt_library},
    {"lt_attributes", c_lt_attributes},
    {"lt_matmul", c_lt_matmul},
    {"lt_errors", c_lt_errors},
    {"execution_failed", c_execution_failed},
};

static bool wanted(const char *name, int argc, char **argv, int first) {
    if (first >= argc)
        return true;
    for (int i = first; i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return true;
    return false;
}

int main(int argc, char **argv) {
    int first = 1;
    if (argc > 1 && strcmp(argv[1], "-l") == 0) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            printf("%s\n", cases[i].name);
        return 0;
    }
    for (; first < argc && argv[first][0] == '-' && argv[first][1] == '-'; first++) {
        if (strcmp(argv[first], "--nvidia") == 0) {
            nvidia = true;
            tolerance = 1e-5;
        } else if (strcmp(argv[first], "--served") == 0) {
            served = true;
        } else {
            fprintf(stderr, "blastest: unknown option %s\n", argv[first]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUdevice dev;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
        cuStreamCreate(&S, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        fprintf(stderr, "blastest: no CUDA context on device 0\n");
        return 3;
    }
    if (cublasCreate_v2(&H) != CUBLAS_STATUS_SUCCESS || cublasLtCreate(&LT) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "blastest: cublasCreate_v2 or cublasLtCreate failed\n");
        return 3;
    }
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!wanted(cases[i].name, argc, argv, first))
            continue;
        case_failed = false;
        cases[i].fn();
        if (case_failed) {
            printf("FAIL %s: see the lines above\n", cases[i].name);
            failed++;
        } else {
            printf("ok %s\n", cases[i].name);
            passed++;
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    /* the handles go before the context they were made in */
    if (cublasLtDestroy(LT) != CUBLAS_STATUS_SUCCESS || cublasDestroy_v2(H) != CUBLAS_STATUS_SUCCESS ||
        cuStreamDestroy(S) != CUDA_SUCCESS || cuDevicePrimaryCtxRelease(dev) != CUDA_SUCCESS) {
        fprintf(stderr, "blastest: teardown failed\n");
        return 1;
    }
    return failed ? 1 : 0;
}

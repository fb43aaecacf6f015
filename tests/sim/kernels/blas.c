/*
 * The simulated driver's versions of the simulated cuBLAS's kernels
 * (simblas_gemm_f32, simblas_gemm_f64, simblas_gemv_f32, simblas_gemv_f64;
 * their PTX is in tests/sim/blas/simblas.c and what they compute is defined
 * in tests/sim/blas/sbkern.h). Each element
 * is computed in the order the definition gives, with fmaf / fma, so the bits
 * are those of the PTX on a GPU and of blastest's host reference. This file is
 * built with -ffp-contract=off (Makefile): a compiler that fused `alpha * acc`
 * with a following addition would round once where the PTX rounds twice.
 *
 * Every matrix of every batch, and every vector, goes through simk_dev() for
 * the whole range the kernel reads or writes ((cols - 1) * ld + rows
 * elements; for signed steps, from the lowest element to the highest); a
 * range it refuses makes the launch fail with CUDA_ERROR_ILLEGAL_ADDRESS, as
 * a GPU fault would.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../blas/sbkern.h"
#include "simk.h"

typedef struct gemm_args {
    CUdeviceptr a, b, c, d, bias, alpha_ptr, beta_ptr;
    int64_t sa, sb, sc, sd, sbias;
    uint64_t lda, ldb, ldc, ldd;
    uint32_t m, n, k, batch, flags;
} gemm_args;

static gemm_args read_args(const simk_launch *L) {
    gemm_args g;
    g.a = SIMK_PARAM(L, SBK_A, CUdeviceptr);
    g.b = SIMK_PARAM(L, SBK_B, CUdeviceptr);
    g.c = SIMK_PARAM(L, SBK_C, CUdeviceptr);
    g.d = SIMK_PARAM(L, SBK_D, CUdeviceptr);
    g.bias = SIMK_PARAM(L, SBK_BIAS, CUdeviceptr);
    g.alpha_ptr = SIMK_PARAM(L, SBK_ALPHA_PTR, CUdeviceptr);
    g.beta_ptr = SIMK_PARAM(L, SBK_BETA_PTR, CUdeviceptr);
    g.sa = SIMK_PARAM(L, SBK_STRIDE_A, int64_t);
    g.sb = SIMK_PARAM(L, SBK_STRIDE_B, int64_t);
    g.sc = SIMK_PARAM(L, SBK_STRIDE_C, int64_t);
    g.sd = SIMK_PARAM(L, SBK_STRIDE_D, int64_t);
    g.sbias = SIMK_PARAM(L, SBK_STRIDE_BIAS, int64_t);
    g.lda = SIMK_PARAM(L, SBK_LDA, uint64_t);
    g.ldb = SIMK_PARAM(L, SBK_LDB, uint64_t);
    g.ldc = SIMK_PARAM(L, SBK_LDC, uint64_t);
    g.ldd = SIMK_PARAM(L, SBK_LDD, uint64_t);
    g.m = SIMK_PARAM(L, SBK_M, uint32_t);
    g.n = SIMK_PARAM(L, SBK_N, uint32_t);
    g.k = SIMK_PARAM(L, SBK_K, uint32_t);
    g.batch = SIMK_PARAM(L, SBK_BATCH, uint32_t);
    g.flags = SIMK_PARAM(L, SBK_FLAGS, uint32_t);
    return g;
}

/*
 * Host view of one batch's matrix: rows x cols elements of es bytes, leading
 * dimension ld, at base + b * stride elements; NULL if any of it is not device
 * memory (or the range does not fit in 64 bits, which no real buffer does).
 */
static void *matrix(const simk_launch *L, CUdeviceptr base, int64_t stride, uint32_t b, uint64_t rows, uint64_t cols,
                    uint64_t ld, size_t es) {
    uint64_t span, bytes;
    int64_t off;
    if (__builtin_mul_overflow(cols - 1, ld, &span) || __builtin_add_overflow(span, rows, &span) ||
        __builtin_mul_overflow(span, (uint64_t)es, &bytes) || __builtin_mul_overflow(stride, (int64_t)b, &off) ||
        __builtin_mul_overflow(off, (int64_t)es, &off))
        return NULL;
    return simk_dev(L, base + (CUdeviceptr)off, bytes);
}

/* One kernel body per element type T with its fma F; the PTX's is the same per element. */
#define SB_GEMM(NAME, T, F)                                                                                            \
    static CUresult NAME(const simk_launch *L) {                                                                       \
        gemm_args g = read_args(L);                                                                                    \
        T alpha = SIMK_PARAM(L, SBK_ALPHA, T), beta = SIMK_PARAM(L, SBK_BETA, T);                                      \
        if (g.m == 0 || g.n == 0 || g.batch == 0)                                                                      \
            return CUDA_SUCCESS;                                                                                       \
        if (g.flags & SBK_DEVICE_SCALARS) {                                                                            \
            const T *pa = simk_dev(L, g.alpha_ptr, sizeof(T)), *pb = simk_dev(L, g.beta_ptr, sizeof(T));               \
            if (!pa || !pb)                                                                                            \
                return CUDA_ERROR_ILLEGAL_ADDRESS;                                                                     \
            alpha = *pa;                                                                                               \
            beta = *pb;                                                                                                \
        }                                                                                                              \
        int ta = !!(g.flags & SBK_TRANSA), tb = !!(g.flags & SBK_TRANSB);                                              \
        int products = alpha != 0 && g.k != 0, read_c = beta != 0 || (g.flags & SBK_READ_C);                           \
        for (uint32_t b = 0; b < g.batch; b++) {                                                                       \
            const T *a = NULL, *bm = NULL, *c = NULL, *bias = NULL;                                                    \
            if (products) {                                                                                            \
                a = matrix(L, g.a, g.sa, b, ta ? g.k : g.m, ta ? g.m : g.k, g.lda, sizeof(T));                         \
                bm = matrix(L, g.b, g.sb, b, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb, sizeof(T));                        \
                if (!a || !bm)                                                                                         \
                    return CUDA_ERROR_ILLEGAL_ADDRESS;                                                                 \
            }                                                                                                          \
            if (read_c && !(c = matrix(L, g.c, g.sc, b, g.m, g.n, g.ldc, sizeof(T))))                                  \
                return CUDA_ERROR_ILLEGAL_ADDRESS;                                                                     \
            if ((g.flags & SBK_BIAS_ON) && !(bias = matrix(L, g.bias, g.sbias, b, g.m, 1, g.m, sizeof(T))))            \
                return CUDA_ERROR_ILLEGAL_ADDRESS;                                                                     \
            T *d = matrix(L, g.d, g.sd, b, g.m, g.n, g.ldd, sizeof(T));                                                \
            if (!d)                                                                                                    \
                return CUDA_ERROR_ILLEGAL_ADDRESS;                                                                     \
            for (uint64_t j = 0; j < g.n; j++) {                                                                       \
                for (uint64_t i = 0; i < g.m; i++) {                                                                   \
                    T acc = 0;                                                                                         \
                    for (uint64_t l = 0; products && l < g.k; l++) {                                                   \
                        T x = ta ? a[l + i * g.lda] : a[i + l * g.lda];                                                \
                        T y = tb ? bm[j + l * g.ldb] : bm[l + j * g.ldb];                                              \
                        acc = F(x, y, acc);                                                                            \
                    }                                                                                                  \
                    T t = alpha * acc;                                                                                 \
                    if (c)                                                                                             \
                        t = F(beta, c[i + j * g.ldc], t);                                                              \
                    if (bias)                                                                                          \
                        t = t + bias[i];                                                                               \
                    if (g.flags & SBK_RELU)                                                                            \
                        t = t > 0 ? t : 0;                                                                             \
                    d[i + j * g.ldd] = t;                                                                              \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        return CUDA_SUCCESS;                                                                                           \
    }

SB_GEMM(simblas_gemm_f32, float, fmaf)
SB_GEMM(simblas_gemm_f64, double, fma)
SIMK_REGISTER("simblas_gemm_f32", simblas_gemm_f32);
SIMK_REGISTER("simblas_gemm_f64", simblas_gemm_f64);

/*
 * Host address of element 0 of an operand of simblas_gemv_*: rows x cols
 * elements of es bytes, element (i, l) at origin + (i * rs + l * cs) * es
 * with signed steps (a vector: cols 1). NULL if the range from its lowest
 * element to its highest is not all device memory, or does not fit in 64
 * bits (no real operand's does).
 */
static void *strided(const simk_launch *L, CUdeviceptr origin, uint64_t rows, int64_t rs, uint64_t cols, int64_t cs,
                     size_t es) {
    int64_t r, c, lo, hi, span, bytes, below;
    if (rows == 0 || cols == 0 || rows > INT64_MAX || cols > INT64_MAX ||
        __builtin_mul_overflow((int64_t)(rows - 1), rs, &r) || __builtin_mul_overflow((int64_t)(cols - 1), cs, &c) ||
        __builtin_add_overflow(r < 0 ? r : 0, c < 0 ? c : 0, &lo) ||
        __builtin_add_overflow(r > 0 ? r : 0, c > 0 ? c : 0, &hi) || __builtin_sub_overflow(hi, lo, &span) ||
        __builtin_add_overflow(span, 1, &span) || __builtin_mul_overflow(span, (int64_t)es, &bytes) ||
        __builtin_sub_overflow((int64_t)0, lo, &below) || __builtin_mul_overflow(below, (int64_t)es, &below))
        return NULL;
    char *p = simk_dev(L, origin - (CUdeviceptr)below, (size_t)bytes);
    return p ? p + below : NULL;
}

/* One matrix-vector kernel body per element type T with its fma F, in sbkern.h's order. */
#define SB_GEMV(NAME, T, F)                                                                                            \
    static CUresult NAME(const simk_launch *L) {                                                                       \
        CUdeviceptr pa = SIMK_PARAM(L, SBV_A, CUdeviceptr), px = SIMK_PARAM(L, SBV_X, CUdeviceptr);                    \
        CUdeviceptr py = SIMK_PARAM(L, SBV_Y, CUdeviceptr);                                                            \
        int64_t rs = SIMK_PARAM(L, SBV_RS, int64_t), cs = SIMK_PARAM(L, SBV_CS, int64_t);                              \
        int64_t incx = SIMK_PARAM(L, SBV_INCX, int64_t), incy = SIMK_PARAM(L, SBV_INCY, int64_t);                      \
        T alpha = SIMK_PARAM(L, SBV_ALPHA, T), beta = SIMK_PARAM(L, SBV_BETA, T);                                      \
        uint32_t rows = SIMK_PARAM(L, SBV_ROWS, uint32_t), cols = SIMK_PARAM(L, SBV_COLS, uint32_t);                   \
        if (rows == 0)                                                                                                 \
            return CUDA_SUCCESS;                                                                                       \
        if (SIMK_PARAM(L, SBV_FLAGS, uint32_t) & SBK_DEVICE_SCALARS) {                                                 \
            const T *ap = simk_dev(L, SIMK_PARAM(L, SBV_ALPHA_PTR, CUdeviceptr), sizeof(T));                           \
            const T *bp = simk_dev(L, SIMK_PARAM(L, SBV_BETA_PTR, CUdeviceptr), sizeof(T));                            \
            if (!ap || !bp)                                                                                            \
                return CUDA_ERROR_ILLEGAL_ADDRESS;                                                                     \
            alpha = *ap;                                                                                               \
            beta = *bp;                                                                                                \
        }                                                                                                              \
        if (alpha == 0 && beta == 1)                                                                                   \
            return CUDA_SUCCESS;                                                                                       \
        int products = alpha != 0 && cols != 0;                                                                        \
        const T *a = NULL, *x = NULL;                                                                                  \
        if (products) {                                                                                                \
            a = strided(L, pa, rows, rs, cols, cs, sizeof(T));                                                         \
            x = strided(L, px, cols, incx, 1, 0, sizeof(T));                                                           \
            if (!a || !x)                                                                                              \
                return CUDA_ERROR_ILLEGAL_ADDRESS;                                                                     \
        }                                                                                                              \
        T *y = strided(L, py, rows, incy, 1, 0, sizeof(T));                                                            \
        if (!y)                                                                                                        \
            return CUDA_ERROR_ILLEGAL_ADDRESS;                                                                         \
        const T y0 = beta != 0 ? y[0] : 0; /* incy 0: every row reads y[0] as it was, as a GPU's threads do */         \
        for (int64_t i = 0; i < (int64_t)rows; i++) {                                                                  \
            T acc = 0;                                                                                                 \
            for (int64_t l = 0; products && l < (int64_t)cols; l++)                                                    \
                acc = F(a[i * rs + l * cs], x[l * incx], acc);                                                         \
            T t = alpha * acc;                                                                                         \
            if (beta != 0)                                                                                             \
                t = F(beta, incy ? y[i * incy] : y0, t);                                                               \
            y[i * incy] = t;                                                                                           \
        }                                                                                                              \
        return CUDA_SUCCESS;                                                                                           \
    }

SB_GEMV(simblas_gemv_f32, float, fmaf)
SB_GEMV(simblas_gemv_f64, double, fma)
SIMK_REGISTER("simblas_gemv_f32", simblas_gemv_f32);
SIMK_REGISTER("simblas_gemv_f64", simblas_gemv_f64);

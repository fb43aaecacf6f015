/*
 * The simulated driver's versions of the simulated cuBLAS's kernels
 * (simblas_gemm_f32, simblas_gemm_f64; their PTX is in tests/sim/blas/simblas.c
 * and what they compute is defined in tests/sim/blas/sbkern.h). Each element
 * is computed in the order the definition gives, with fmaf / fma, so the bits
 * are those of the PTX on a GPU and of blastest's host reference. This file is
 * built with -ffp-contract=off (Makefile): a compiler that fused `alpha * acc`
 * with a following addition would round once where the PTX rounds twice.
 *
 * Every matrix of every batch goes through simk_dev() for the whole range the
 * kernel reads or writes ((cols - 1) * ld + rows elements); a range it refuses
 * makes the launch fail with CUDA_ERROR_ILLEGAL_ADDRESS, as a GPU fault would.
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
        int products = alpha != 0 && g.k != 0;                                                                         \
        for (uint32_t b = 0; b < g.batch; b++) {                                                                       \
            const T *a = NULL, *bm = NULL, *c = NULL, *bias = NULL;                                                    \
            if (products) {                                                                                            \
                a = matrix(L, g.a, g.sa, b, ta ? g.k : g.m, ta ? g.m : g.k, g.lda, sizeof(T));                         \
                bm = matrix(L, g.b, g.sb, b, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb, sizeof(T));                        \
                if (!a || !bm)                                                                                         \
                    return CUDA_ERROR_ILLEGAL_ADDRESS;                                                                 \
            }                                                                                                          \
            if (beta != 0 && !(c = matrix(L, g.c, g.sc, b, g.m, g.n, g.ldc, sizeof(T))))                               \
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

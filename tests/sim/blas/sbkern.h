/*
 * The simulated cuBLAS's kernels as both sides see them: the libraries
 * (tests/sim/blas, which launch them) and the simulated driver
 * (tests/sim/kernels/blas.c, which runs them). One kernel per element type,
 * simblas_gemm_f32 and simblas_gemm_f64, does every product the libraries
 * offer, batched:
 *
 *   for every batch b < batch, column j < n, row i < m:
 *     acc = 0
 *     if alpha != 0: for l = 0 .. k-1: acc = fma(opA(i, l), opB(l, j), acc)
 *     t = alpha * acc
 *     if beta != 0:  t = fma(beta, C[i + j*ldc], t)     (C is not read otherwise)
 *     if BIAS:       t = t + bias[i]
 *     if RELU:       t = t > 0 ? t : 0
 *     D[i + j*ldd] = t
 *
 * in the element type, each operation rounded to nearest (fma once), with
 * opA(i, l) = A[i + l*lda] (TRANSA: A[l + i*lda]), opB(l, j) = B[l + j*ldb]
 * (TRANSB: B[j + l*ldb]), and every matrix (and the bias) of batch b starting
 * b * its stride elements after the first. So the result does not depend on
 * how the elements are spread over threads: a host loop in the same order
 * (blastest's reference) gets the same bits.
 *
 * Alpha and beta are the parameters' values, or with DEVICE_SCALARS the
 * element that alpha_ptr and beta_ptr point to (cuBLAS's device pointer
 * mode: read when the kernel runs).
 */
#ifndef GPUCR_SIM_BLAS_SBKERN_H
#define GPUCR_SIM_BLAS_SBKERN_H

/* Parameter indices, in the PTX's order (u64 pointers, s64 strides, u64 leading dimensions, the element type's
 * alpha and beta, u32 sizes and flags). */
enum {
    SBK_A,
    SBK_B,
    SBK_C,
    SBK_D,
    SBK_BIAS,
    SBK_ALPHA_PTR,
    SBK_BETA_PTR,
    SBK_STRIDE_A,
    SBK_STRIDE_B,
    SBK_STRIDE_C,
    SBK_STRIDE_D,
    SBK_STRIDE_BIAS,
    SBK_LDA,
    SBK_LDB,
    SBK_LDC,
    SBK_LDD,
    SBK_ALPHA,
    SBK_BETA,
    SBK_M,
    SBK_N,
    SBK_K,
    SBK_BATCH,
    SBK_FLAGS,
    SBK_NPARAMS
};

/* SBK_FLAGS */
#define SBK_TRANSA 0x1u
#define SBK_TRANSB 0x2u
#define SBK_BIAS_ON 0x4u
#define SBK_RELU 0x8u
#define SBK_DEVICE_SCALARS 0x10u

#endif /* GPUCR_SIM_BLAS_SBKERN_H */

/*
 * The simulated cuBLAS's kernels as both sides see them: the libraries
 * (tests/sim/blas, which launch them) and the simulated driver
 * (tests/sim/kernels/blas.c, which runs them). One kernel per element type,
 * simblas_gemm_f32 and simblas_gemm_f64, does every matrix product the
 * libraries offer, batched:
 *
 *   for every batch b < batch, column j < n, row i < m:
 *     acc = 0
 *     if alpha != 0: for l = 0 .. k-1: acc = fma(opA(i, l), opB(l, j), acc)
 *     t = alpha * acc
 *     if beta != 0 or READ_C:  t = fma(beta, C[i + j*ldc], t)     (C is not read otherwise)
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
 * mode: read when the kernel runs). READ_C reads C whatever beta is: the
 * library sets it for a beta of -0.0 where NVIDIA's multiplies C by it
 * (cublas.c).
 *
 * A second kernel per element type, simblas_gemv_f32 and simblas_gemv_f64,
 * does the matrix-vector product (gemv) and the dot product (dot: one row
 * of one, alpha 1, beta 0, y the result):
 *
 *   if alpha == 0 and beta == 1: nothing       (BLAS's quick return: y is not touched)
 *   for every row i < rows:
 *     acc = 0
 *     if alpha != 0: for l = 0 .. cols-1: acc = fma(A[i*rs + l*cs], x[l*incx], acc)
 *     t = alpha * acc
 *     if beta != 0:  t = fma(beta, y[i*incy], t)   (y is not read otherwise)
 *     y[i*incy] = t
 *
 * (with incy 0 every row reads and writes y[0]: which row's value stays is
 * the GPU's order, as it is NVIDIA's; the simulated driver's kernel reads
 * y[0] before any row writes it and leaves the last row's)
 *
 * rounded as the gemm is, every index in elements and signed. A, x and y are
 * the addresses of element 0 in BLAS's order: for a negative increment that
 * is the vector's last element in memory (the library passes it), so the
 * kernel walks every operand the same way whatever the signs. Alpha and beta
 * come as the gemm's do (DEVICE_SCALARS).
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

/* simblas_gemv_*'s parameters, in the PTX's order (u64 pointers, s64 steps, the element type's alpha and beta,
 * u32 sizes and flags: SBK_DEVICE_SCALARS only). */
enum {
    SBV_A,
    SBV_X,
    SBV_Y,
    SBV_ALPHA_PTR,
    SBV_BETA_PTR,
    SBV_RS,
    SBV_CS,
    SBV_INCX,
    SBV_INCY,
    SBV_ALPHA,
    SBV_BETA,
    SBV_ROWS,
    SBV_COLS,
    SBV_FLAGS,
    SBV_NPARAMS
};

/* SBK_FLAGS, SBV_FLAGS */
#define SBK_TRANSA 0x1u
#define SBK_TRANSB 0x2u
#define SBK_BIAS_ON 0x4u
#define SBK_RELU 0x8u
#define SBK_DEVICE_SCALARS 0x10u
#define SBK_READ_C 0x20u

#endif /* GPUCR_SIM_BLAS_SBKERN_H */

/*
 * What the simulated cuBLAS (cublas.c) and cuBLASLt (cublaslt.c) share:
 * compiled into each library, hidden in both (only SB_API functions are
 * exported, under the version node of the library's soname).
 *
 * Both do their arithmetic the way NVIDIA's do: as kernels on the caller's
 * stream, loaded through the driver API as a PTX module (simblas.c) in the
 * context a handle is created in. On the simulated driver the PTX's entries
 * run as the C functions of tests/sim/kernels/blas.c; on a GPU the PTX
 * itself runs. So gpucr's interposer sees an ordinary module load and
 * ordinary launches, as it does under NVIDIA's libraries.
 */
#ifndef GPUCR_SIM_BLAS_SIMBLAS_H
#define GPUCR_SIM_BLAS_SIMBLAS_H

#include <stdbool.h>
#include <stdint.h>

#include "gpucr/cublas.h"
#include "sbkern.h"

#define SB_API __attribute__((visibility("default")))

/* The release both libraries say they are: cuBLAS 13.0.0 of CUDA 13.0, version = major * 10000 + minor * 100 +
 * patch (cublas_api.h's CUBLAS_VERSION), built against the runtime of CUDA 13.0 (CUDART_VERSION). */
#define SB_VER_MAJOR 13
#define SB_VER_MINOR 0
#define SB_VER_PATCH 0
#define SB_VERSION (SB_VER_MAJOR * 10000 + SB_VER_MINOR * 100 + SB_VER_PATCH)
#define SB_CUDART_VERSION 13000

/* The kernels of one handle: its context, and the module loaded in it. */
typedef struct sb_kernels {
    CUcontext ctx;
    CUmodule mod;
    CUfunction f32, f64; /* simblas_gemm_* */
    CUfunction v32, v64; /* simblas_gemv_* */
} sb_kernels;

/*
 * The context a new handle belongs to, as the CUDA runtime picks it for
 * NVIDIA's cuBLAS: the calling thread's current context, or else device 0's
 * primary context, retained once for the process, and left current if
 * make_current (cublasCreate; cublasLtCreate leaves a thread without a
 * context as it was, as NVIDIA's does). The kernels' module is loaded into
 * it. NOT_INITIALIZED if there is no driver or device to do that with.
 */
cublasStatus_t sb_kernels_load(sb_kernels *k, bool make_current);
/* Unloads the module (the context may be gone already: its modules went with it). */
void sb_kernels_unload(sb_kernels *k);

/*
 * Makes the handle's context current on a thread that has none, as the
 * runtime would give it the device's primary context; work of the handle
 * then goes to the current context. EXECUTION_FAILED if the driver refuses.
 */
cublasStatus_t sb_enter(const sb_kernels *k);

/* One launch of simblas_gemm_f32 / _f64 (sbkern.h says what it computes). */
typedef struct sb_gemm {
    int f64;            /* double elements (simblas_gemm_f64) */
    int device_scalars; /* alpha and beta are device addresses, read by the kernel */
    const void *alpha, *beta;
    CUdeviceptr a, b, c, d, bias;
    int64_t sa, sb, sc, sd, sbias; /* batch strides, elements */
    uint64_t lda, ldb, ldc, ldd;
    uint32_t m, n, k, batch, flags; /* flags: SBK_TRANSA ... SBK_RELU (DEVICE_SCALARS is set from device_scalars) */
} sb_gemm;

/*
 * Enqueues g on stream s in the current context (sb_enter). An empty product
 * (m, n or batch 0) launches nothing. EXECUTION_FAILED if the driver refuses
 * the launch.
 */
cublasStatus_t sb_gemm_launch(const sb_kernels *k, const sb_gemm *g, CUstream s);

/* One launch of simblas_gemv_f32 / _f64 (sbkern.h says what it computes). */
typedef struct sb_gemv {
    int f64;            /* double elements (simblas_gemv_f64) */
    int device_scalars; /* alpha and beta are device addresses, read by the kernel */
    const void *alpha, *beta;
    CUdeviceptr a, x, y;        /* each operand's element 0 in BLAS's order (sb_vec_origin) */
    int64_t rs, cs, incx, incy; /* steps, elements, signed */
    uint32_t rows, cols;
} sb_gemv;

/*
 * Where element 0 of a vector of len elements of es bytes at p, increment
 * inc, lies: p itself, or for a negative increment its last element, which
 * BLAS takes first.
 */
CUdeviceptr sb_vec_origin(const void *p, uint32_t len, int64_t inc, size_t es);

/* Enqueues v on stream s as sb_gemm_launch does; no rows launches nothing. */
cublasStatus_t sb_gemv_launch(const sb_kernels *k, const sb_gemv *v, CUstream s);

/* cublasGetStatusName / String and cublasLt's: the same for both libraries. */
const char *sb_status_name(cublasStatus_t s);
const char *sb_status_string(cublasStatus_t s);
/* cublasGetProperty / cublasLtGetProperty. */
cublasStatus_t sb_property(libraryPropertyType type, int *value);

#endif /* GPUCR_SIM_BLAS_SIMBLAS_H */

/*
 * blasextra: a cuBLAS for served mode's worker on the simulated driver. It needs the simulated cuBLAS
 * (build/sim/libcublas.so.13), whose functions the worker finds through it, and adds five of the level-1 and
 * level-2 functions that one lacks, computed on the host from device memory after the handle's stream is done:
 * cublasDaxpy_v2, cublasDnrm2_v2, cublasIdamax_v2, cublasDrotg_v2 and cublasDger_v2, in both pointer modes.
 * cublasDger_v2 refuses what BLAS refuses but an increment of 0, which it takes as a step of 0 (blaslevels'
 * probes: served mode sends both, and this library answers).
 * TestServedBlasLevels (servedblas_test.go) builds it and has the worker load it (GPUCR_CUBLAS_PATH): what
 * gpucr's libcublas.so.13 sends for those functions must reach a cuBLAS as the program called it.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "gpucr/cublas.h"

#define API __attribute__((visibility("default")))

/* The handle's pointer mode, once its stream's work is done (the results below are read and written at once). */
static cublasStatus_t begin(cublasHandle_t h, bool *dev) {
    cudaStream_t s;
    cublasPointerMode_t m;
    cublasStatus_t st = cublasGetStream_v2(h, &s);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasGetPointerMode_v2(h, &m);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    *dev = m == CUBLAS_POINTER_MODE_DEVICE;
    return cuStreamSynchronize(s) == CUDA_SUCCESS ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

static bool get(void *h, const void *d, size_t n) { return cuMemcpyDtoH(h, (CUdeviceptr)(uintptr_t)d, n) == 0; }
static bool put(void *d, const void *h, size_t n) { return cuMemcpyHtoD((CUdeviceptr)(uintptr_t)d, h, n) == 0; }

/* A scalar the function reads or writes: from or to device memory (dev), else host memory. */
static bool scalar_in(bool dev, void *v, const void *p, size_t n) {
    if (dev)
        return get(v, p, n);
    for (size_t i = 0; i < n; i++)
        ((char *)v)[i] = ((const char *)p)[i];
    return true;
}
static bool scalar_out(bool dev, void *p, const void *v, size_t n) {
    if (dev)
        return put(p, v, n);
    for (size_t i = 0; i < n; i++)
        ((char *)p)[i] = ((const char *)v)[i];
    return true;
}

/* n doubles, inc apart, between device memory and v. */
static bool vget(double *v, const double *x, int n, int inc) {
    for (int i = 0; i < n; i++)
        if (!get(&v[i], x + (ptrdiff_t)i * inc, sizeof *v))
            return false;
    return true;
}
static bool vput(double *x, const double *v, int n, int inc) {
    for (int i = 0; i < n; i++)
        if (!put(x + (ptrdiff_t)i * inc, &v[i], sizeof *v))
            return false;
    return true;
}

API cublasStatus_t cublasDaxpy_v2(cublasHandle_t handle, int n, const double *alpha, const double *x, int incx,
                                  double *y, int incy) {
    bool dev;
    cublasStatus_t st = begin(handle, &dev);
    if (st != CUBLAS_STATUS_SUCCESS || n <= 0)
        return st;
    double a, *xv = calloc((size_t)n, sizeof *xv), *yv = calloc((size_t)n, sizeof *yv);
    bool ok = xv && yv && scalar_in(dev, &a, alpha, sizeof a) && vget(xv, x, n, incx) && vget(yv, y, n, incy);
    for (int i = 0; ok && i < n; i++)
        yv[i] += a * xv[i];
    ok = ok && vput(y, yv, n, incy);
    free(xv);
    free(yv);
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

API cublasStatus_t cublasDnrm2_v2(cublasHandle_t handle, int n, const double *x, int incx, double *result) {
    bool dev;
    cublasStatus_t st = begin(handle, &dev);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    double s = 0, *xv = calloc(n > 0 ? (size_t)n : 1, sizeof *xv);
    bool ok = xv && (n <= 0 || incx <= 0 || vget(xv, x, n, incx));
    for (int i = 0; ok && incx > 0 && i < n; i++)
        s += xv[i] * xv[i];
    s = sqrt(s);
    ok = ok && scalar_out(dev, result, &s, sizeof s);
    free(xv);
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

API cublasStatus_t cublasIdamax_v2(cublasHandle_t handle, int n, const double *x, int incx, int *result) {
    bool dev;
    cublasStatus_t st = begin(handle, &dev);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    int best = 0;
    double *xv = calloc(n > 0 ? (size_t)n : 1, sizeof *xv);
    bool ok = xv && (n <= 0 || incx <= 0 || vget(xv, x, n, incx));
    for (int i = 0; ok && incx > 0 && i < n; i++)
        if (best == 0 || fabs(xv[i]) > fabs(xv[best - 1]))
            best = i + 1;
    ok = ok && scalar_out(dev, result, &best, sizeof best);
    free(xv);
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

API cublasStatus_t cublasDrotg_v2(cublasHandle_t handle, double *a, double *b, double *c, double *s) {
    bool dev;
    cublasStatus_t st = begin(handle, &dev);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    double av, bv, cv = 1, sv = 0, r, z;
    if (!scalar_in(dev, &av, a, sizeof av) || !scalar_in(dev, &bv, b, sizeof bv))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    double roe = fabs(av) > fabs(bv) ? av : bv, scale = fabs(av) + fabs(bv);
    if (scale == 0) {
        r = z = 0;
    } else {
        r = copysign(scale * sqrt((av / scale) * (av / scale) + (bv / scale) * (bv / scale)), roe);
        cv = av / r;
        sv = bv / r;
        z = fabs(av) > fabs(bv) ? sv : (cv != 0 ? 1 / cv : 1);
    }
    bool ok = scalar_out(dev, a, &r, sizeof r) && scalar_out(dev, b, &z, sizeof z) &&
              scalar_out(dev, c, &cv, sizeof cv) && scalar_out(dev, s, &sv, sizeof sv);
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

API cublasStatus_t cublasDger_v2(cublasHandle_t handle, int m, int n, const double *alpha, const double *x, int incx,
                                 const double *y, int incy, double *A, int lda) {
    bool dev;
    cublasStatus_t st = begin(handle, &dev);
    /* BLAS's checks but for the increments: 0 is a step of 0 (as NVIDIA's gemv takes it) */
    if (st == CUBLAS_STATUS_SUCCESS && (m < 0 || n < 0 || lda < (m > 1 ? m : 1)))
        st = CUBLAS_STATUS_INVALID_VALUE;
    if (st != CUBLAS_STATUS_SUCCESS || m <= 0 || n <= 0)
        return st;
    double a, *xv = calloc((size_t)m, sizeof *xv), *yv = calloc((size_t)n, sizeof *yv),
              *col = calloc((size_t)m, sizeof *col);
    bool ok = xv && yv && col && scalar_in(dev, &a, alpha, sizeof a) && vget(xv, x, m, incx) && vget(yv, y, n, incy);
    for (int j = 0; ok && j < n; j++) {
        double *c = A + (size_t)j * (size_t)lda;
        ok = get(col, c, (size_t)m * sizeof *col);
        for (int i = 0; ok && i < m; i++)
            col[i] += a * xv[i] * yv[j];
        ok = ok && put(c, col, (size_t)m * sizeof *col);
    }
    free(xv);
    free(yv);
    free(col);
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

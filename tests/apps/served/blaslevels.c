/*
 * blaslevels: cuBLAS's level-1, 2 and 3 functions on real data, its copies between host and device memory, and
 * what served mode refuses, each checked against what is computed here. Run under `gpucr run --served` (gpucr's
 * libcublas.so.13, which forwards them to the worker's cuBLAS), or without it on the GPU machine (NVIDIA's: the
 * checks themselves checked).
 *
 *   blaslevels [--lib LIBRARY] CHECK...
 *
 * LIBRARY: the cuBLAS to open (default libcublas.so.13, as the dynamic linker finds it). CHECK:
 *   levels    every forwarded level-1, 2 and 3 function, in single and double precision
 *   NAME      one of them by its name without cublas and _v2 (Daxpy, Idamax, Strsv, ...)
 *   copies    cublasSetVectorAsync, cublasGetVectorAsync, cublasSetMatrixAsync, cublasGetMatrixAsync: strided on
 *             either side or both, gaps left as they were, and the arguments cuBLAS refuses
 *   refused   complex functions that served mode refuses, each called twice: CUBLAS_STATUS_NOT_SUPPORTED
 *   missing   cublasSnrm2 in a worker whose cuBLAS has none: CUBLAS_STATUS_NOT_SUPPORTED
 *   probes    served, on TestServedBlasLevels's cuBLAS (testdata/blasextra.c): cublasDger with arguments cuBLAS's
 *             documentation calls invalid reaches the worker's library, which answers at the call: an increment
 *             of 0, which that library computes as a step of 0 (as NVIDIA's gemv does), and a leading dimension
 *             below the rows, which it refuses (INVALID_VALUE at the call, nothing left for the next
 *             synchronizing call, A untouched)
 * The functions run on a stream of their own, in both pointer modes (NAME/host, NAME/device). One line a check,
 * "ok NAME" or "FAIL NAME: why", then "done PASS FAIL"; exit status 0 only if none failed.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucr/cublas.h"

static void *lib;
static const char *lib_name = "libcublas.so.13";
static cublasHandle_t handle;
static CUstream stream;
static int passed, failed;

/* What a wrapper answers for a function the library does not have. */
#define NO_FUNCTION ((cublasStatus_t)-1)
/* The library's f, typed as gpucr/cublas.h declares it, or NULL. */
#define FN(f) ((__typeof__(&f))dlsym(lib, #f))
#define CALL(f, ...) (FN(f) ? FN(f)(__VA_ARGS__) : NO_FUNCTION)

static void result(const char *name, const char *mode, const char *why) {
    if (why) {
        printf("FAIL %s%s%s: %s\n", name, mode ? "/" : "", mode ? mode : "", why);
        failed++;
    } else {
        printf("ok %s%s%s\n", name, mode ? "/" : "", mode ? mode : "");
        passed++;
    }
}

static void die(const char *what, int r) {
    fprintf(stderr, "blaslevels: %s: %d\n", what, r);
    exit(3);
}
#define CU(call)                                                                                                       \
    do {                                                                                                               \
        CUresult r_ = (call);                                                                                          \
        if (r_ != CUDA_SUCCESS)                                                                                        \
            die(#call, (int)r_);                                                                                       \
    } while (0)

/* ---- one precision's functions, over void pointers ---- */

typedef struct {
    const char *p; /* "S" or "D" */
    const char *i; /* "Is" or "Id" */
    bool dbl;
    cublasStatus_t (*axpy)(int, const void *, const void *, int, void *, int);
    cublasStatus_t (*copy)(int, const void *, int, void *, int);
    cublasStatus_t (*scal)(int, const void *, void *, int);
    cublasStatus_t (*swap)(int, void *, int, void *, int);
    cublasStatus_t (*nrm2)(int, const void *, int, void *);
    cublasStatus_t (*asum)(int, const void *, int, void *);
    cublasStatus_t (*amax)(int, const void *, int, int *);
    cublasStatus_t (*amin)(int, const void *, int, int *);
    cublasStatus_t (*rot)(int, void *, int, void *, int, const void *, const void *);
    cublasStatus_t (*rotm)(int, void *, int, void *, int, const void *);
    cublasStatus_t (*rotg)(void *, void *, void *, void *);
    cublasStatus_t (*rotmg)(void *, void *, void *, const void *, void *);
    cublasStatus_t (*trmv)(cublasFillMode_t, cublasOperation_t, cublasDiagType_t, int, const void *, int, void *, int);
    cublasStatus_t (*trsv)(cublasFillMode_t, cublasOperation_t, cublasDiagType_t, int, const void *, int, void *, int);
    cublasStatus_t (*ger)(int, int, const void *, const void *, int, const void *, int, void *, int);
    cublasStatus_t (*syr)(cublasFillMode_t, int, const void *, const void *, int, void *, int);
    cublasStatus_t (*syr2)(cublasFillMode_t, int, const void *, const void *, int, const void *, int, void *, int);
    cublasStatus_t (*symv)(cublasFillMode_t, int, const void *, const void *, int, const void *, int, const void *,
                           void *, int);
    cublasStatus_t (*symm)(cublasSideMode_t, cublasFillMode_t, int, int, const void *, const void *, int, const void *,
                           int, const void *, void *, int);
    cublasStatus_t (*syrk)(cublasFillMode_t, cublasOperation_t, int, int, const void *, const void *, int, const void *,
                           void *, int);
    cublasStatus_t (*syr2k)(cublasFillMode_t, cublasOperation_t, int, int, const void *, const void *, int,
                            const void *, int, const void *, void *, int);
    cublasStatus_t (*trmm)(cublasSideMode_t, cublasFillMode_t, cublasOperation_t, cublasDiagType_t, int, int,
                           const void *, const void *, int, const void *, int, void *, int);
} ops;

#define WRAP(P, p, T)                                                                                                  \
    static cublasStatus_t P##_axpy(int n, const void *a, const void *x, int ix, void *y, int iy) {                     \
        return CALL(cublas##P##axpy_v2, handle, n, a, x, ix, y, iy);                                                   \
    }                                                                                                                  \
    static cublasStatus_t P##_copy(int n, const void *x, int ix, void *y, int iy) {                                    \
        return CALL(cublas##P##copy_v2, handle, n, x, ix, y, iy);                                                      \
    }                                                                                                                  \
    static cublasStatus_t P##_scal(int n, const void *a, void *x, int ix) {                                            \
        return CALL(cublas##P##scal_v2, handle, n, a, x, ix);                                                          \
    }                                                                                                                  \
    static cublasStatus_t P##_swap(int n, void *x, int ix, void *y, int iy) {                                          \
        return CALL(cublas##P##swap_v2, handle, n, x, ix, y, iy);                                                      \
    }                                                                                                                  \
    static cublasStatus_t P##_nrm2(int n, const void *x, int ix, void *r) {                                            \
        return CALL(cublas##P##nrm2_v2, handle, n, x, ix, r);                                                          \
    }                                                                                                                  \
    static cublasStatus_t P##_asum(int n, const void *x, int ix, void *r) {                                            \
        return CALL(cublas##P##asum_v2, handle, n, x, ix, r);                                                          \
    }                                                                                                                  \
    static cublasStatus_t P##_amax(int n, const void *x, int ix, int *r) {                                             \
        return CALL(cublasI##p##amax_v2, handle, n, x, ix, r);                                                         \
    }                                                                                                                  \
    static cublasStatus_t P##_amin(int n, const void *x, int ix, int *r) {                                             \
        return CALL(cublasI##p##amin_v2, handle, n, x, ix, r);                                                         \
    }                                                                                                                  \
    static cublasStatus_t P##_rot(int n, void *x, int ix, void *y, int iy, const void *c, const void *s) {             \
        return CALL(cublas##P##rot_v2, handle, n, x, ix, y, iy, c, s);                                                 \
    }                                                                                                                  \
    static cublasStatus_t P##_rotm(int n, void *x, int ix, void *y, int iy, const void *param) {                       \
        return CALL(cublas##P##rotm_v2, handle, n, x, ix, y, iy, param);                                               \
    }                                                                                                                  \
    static cublasStatus_t P##_rotg(void *a, void *b, void *c, void *s) {                                               \
        return CALL(cublas##P##rotg_v2, handle, a, b, c, s);                                                           \
    }                                                                                                                  \
    static cublasStatus_t P##_rotmg(void *d1, void *d2, void *x1, const void *y1, void *param) {                       \
        return CALL(cublas##P##rotmg_v2, handle, d1, d2, x1, y1, param);                                               \
    }                                                                                                                  \
    static cublasStatus_t P##_trmv(cublasFillMode_t u, cublasOperation_t t, cublasDiagType_t d, int n, const void *A,  \
                                   int lda, void *x, int ix) {                                                         \
        return CALL(cublas##P##trmv_v2, handle, u, t, d, n, A, lda, x, ix);                                            \
    }                                                                                                                  \
    static cublasStatus_t P##_trsv(cublasFillMode_t u, cublasOperation_t t, cublasDiagType_t d, int n, const void *A,  \
                                   int lda, void *x, int ix) {                                                         \
        return CALL(cublas##P##trsv_v2, handle, u, t, d, n, A, lda, x, ix);                                            \
    }                                                                                                                  \
    static cublasStatus_t P##_ger(int m, int n, const void *a, const void *x, int ix, const void *y, int iy, void *A,  \
                                  int lda) {                                                                           \
        return CALL(cublas##P##ger_v2, handle, m, n, a, x, ix, y, iy, A, lda);                                         \
    }                                                                                                                  \
    static cublasStatus_t P##_syr(cublasFillMode_t u, int n, const void *a, const void *x, int ix, void *A, int lda) { \
        return CALL(cublas##P##syr_v2, handle, u, n, a, x, ix, A, lda);                                                \
    }                                                                                                                  \
    static cublasStatus_t P##_syr2(cublasFillMode_t u, int n, const void *a, const void *x, int ix, const void *y,     \
                                   int iy, void *A, int lda) {                                                         \
        return CALL(cublas##P##syr2_v2, handle, u, n, a, x, ix, y, iy, A, lda);                                        \
    }                                                                                                                  \
    static cublasStatus_t P##_symv(cublasFillMode_t u, int n, const void *a, const void *A, int lda, const void *x,    \
                                   int ix, const void *b, void *y, int iy) {                                           \
        return CALL(cublas##P##symv_v2, handle, u, n, a, A, lda, x, ix, b, y, iy);                                     \
    }                                                                                                                  \
    static cublasStatus_t P##_symm(cublasSideMode_t s, cublasFillMode_t u, int m, int n, const void *a, const void *A, \
                                   int lda, const void *B, int ldb, const void *b, void *C, int ldc) {                 \
        return CALL(cublas##P##symm_v2, handle, s, u, m, n, a, A, lda, B, ldb, b, C, ldc);                             \
    }                                                                                                                  \
    static cublasStatus_t P##_syrk(cublasFillMode_t u, cublasOperation_t t, int n, int k, const void *a,               \
                                   const void *A, int lda, const void *b, void *C, int ldc) {                          \
        return CALL(cublas##P##syrk_v2, handle, u, t, n, k, a, A, lda, b, C, ldc);                                     \
    }                                                                                                                  \
    static cublasStatus_t P##_syr2k(cublasFillMode_t u, cublasOperation_t t, int n, int k, const void *a,              \
                                    const void *A, int lda, const void *B, int ldb, const void *b, void *C, int ldc) { \
        return CALL(cublas##P##syr2k_v2, handle, u, t, n, k, a, A, lda, B, ldb, b, C, ldc);                            \
    }                                                                                                                  \
    static cublasStatus_t P##_trmm(cublasSideMode_t s, cublasFillMode_t u, cublasOperation_t t, cublasDiagType_t d,    \
                                   int m, int n, const void *a, const void *A, int lda, const void *B, int ldb,        \
                                   void *C, int ldc) {                                                                 \
        return CALL(cublas##P##trmm_v2, handle, s, u, t, d, m, n, a, A, lda, B, ldb, C, ldc);                          \
    }                                                                                                                  \
    static const ops ops_##P = {#P,        "I" #p,   sizeof(T) == 8, P##_axpy, P##_copy, P##_scal, P##_swap,           \
                                P##_nrm2,  P##_asum, P##_amax,       P##_amin, P##_rot,  P##_rotm, P##_rotg,           \
                                P##_rotmg, P##_trmv, P##_trsv,       P##_ger,  P##_syr,  P##_syr2, P##_symv,           \
                                P##_symm,  P##_syrk, P##_syr2k,      P##_trmm};
WRAP(S, s, float)
WRAP(D, d, double)

/* ---- memory ---- */

#define MAX_ALLOCS 16
static CUdeviceptr allocs[MAX_ALLOCS];
static int nallocs;

static size_t tsize(const ops *o) { return o->dbl ? sizeof(double) : sizeof(float); }

/* n values into the precision's bytes at buf, and back. */
static void to_t(const ops *o, const double *v, size_t n, void *buf) {
    for (size_t i = 0; i < n; i++)
        if (o->dbl)
            ((double *)buf)[i] = v[i];
        else
            ((float *)buf)[i] = (float)v[i];
}
static void from_t(const ops *o, const void *buf, size_t n, double *v) {
    for (size_t i = 0; i < n; i++)
        v[i] = o->dbl ? ((const double *)buf)[i] : (double)((const float *)buf)[i];
}

/* Device memory holding n values (n bytes, for raw bytes: o NULL), freed by release. */
static void *dev_alloc(size_t bytes) {
    if (nallocs == MAX_ALLOCS)
        die("too many allocations", nallocs);
    CUdeviceptr d;
    CU(cuMemAlloc(&d, bytes ? bytes : 1));
    allocs[nallocs++] = d;
    return (void *)(uintptr_t)d;
}
static void *up(const ops *o, const double *v, size_t n) {
    void *buf = malloc(n * tsize(o) + 1);
    void *d = dev_alloc(n * tsize(o));
    to_t(o, v, n, buf);
    CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)d, buf, n * tsize(o)));
    free(buf);
    return d;
}
static void down(const ops *o, const void *d, size_t n, double *v) {
    void *buf = malloc(n * tsize(o) + 1);
    CU(cuStreamSynchronize(stream));
    CU(cuMemcpyDtoH(buf, (CUdeviceptr)(uintptr_t)d, n * tsize(o)));
    from_t(o, buf, n, v);
    free(buf);
}
static void release(void) {
    CU(cuStreamSynchronize(stream));
    for (int i = 0; i < nallocs; i++)
        CU(cuMemFree(allocs[i]));
    nallocs = 0;
}

/* Scalars of a call: in host memory (here) or in device memory, as the pointer mode is. */
static bool dev_mode;
static union {
    double d[64];
    float f[64];
} host_scalars;
static int nscalars;

/* n values the function reads (or reads and writes). */
static void *scalars(const ops *o, const double *v, int n) {
    if (dev_mode)
        return up(o, v, (size_t)n);
    if (nscalars + n > 64)
        die("too many scalars", nscalars);
    void *p = o->dbl ? (void *)&host_scalars.d[nscalars] : (void *)&host_scalars.f[nscalars];
    to_t(o, v, (size_t)n, p);
    nscalars += n;
    return p;
}
static void *scalar(const ops *o, double v) { return scalars(o, &v, 1); }
/* Their values after the call. */
static void scalars_back(const ops *o, const void *p, int n, double *v) {
    if (dev_mode)
        down(o, p, (size_t)n, v);
    else
        from_t(o, p, (size_t)n, v);
}
/* An int result, and its value. */
static int *int_result(void) {
    static int host;
    host = -7;
    if (!dev_mode)
        return &host;
    int *d = dev_alloc(sizeof(int));
    CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)d, &host, sizeof host));
    return d;
}
static int int_back(const int *p) {
    if (!dev_mode)
        return *p;
    int v;
    CU(cuStreamSynchronize(stream));
    CU(cuMemcpyDtoH(&v, (CUdeviceptr)(uintptr_t)p, sizeof v));
    return v;
}

/* ---- checks ---- */

/* v[i] for i < n: multiples of 1/8 in [-1.75, 1.75], exact in single precision, distinct for each seed. */
static void fill(double *v, size_t n, int seed) {
    for (size_t i = 0; i < n; i++)
        v[i] = (double)((long)((i * 37 + (size_t)seed * 11) % 29) - 14) / 8.0;
}

/* (No libm: the served test programs link none.) */
static double fabs_(double v) { return v < 0 ? -v : v; }

static double max_abs(const double *v, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabs_(v[i]) > m ? fabs_(v[i]) : m;
    return m;
}

/* The check of a call: its status, then got against want (n values) within tolerance of want's magnitude. */
static void check(const ops *o, const char *fn, const char *variant, cublasStatus_t st, const double *got,
                  const double *want, size_t n) {
    char name[96], why[160];
    snprintf(name, sizeof name, "%s%s%s", fn, variant ? "-" : "", variant ? variant : "");
    const char *mode = dev_mode ? "device" : "host";
    if (st == NO_FUNCTION) {
        snprintf(why, sizeof why, "%s has no such function", lib_name);
        result(name, mode, why);
        return;
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, sizeof why, "status %d", (int)st);
        result(name, mode, why);
        return;
    }
    double tol = (o->dbl ? 1e-11 : 1e-4) * (1 + max_abs(want, n));
    for (size_t i = 0; i < n; i++)
        if (!(fabs_(got[i] - want[i]) <= tol)) {
            snprintf(why, sizeof why, "element %zu is %.9g, want %.9g", i, got[i], want[i]);
            result(name, mode, why);
            return;
        }
    result(name, mode, NULL);
}

static char fname[32];
static const char *nm(const ops *o, const char *f) {
    snprintf(fname, sizeof fname, "%s%s", o->p, f);
    return fname;
}

enum { N = 33, INCX = 2, INCY = 3, LX = 1 + (N - 1) * INCX, LY = 1 + (N - 1) * INCY };

static void t_axpy(const ops *o) {
    double x[LX], y[LY], want[LY], got[LY];
    fill(x, LX, 1), fill(y, LY, 2);
    memcpy(want, y, sizeof y);
    for (int i = 0; i < N; i++)
        want[i * INCY] += 1.25 * x[i * INCX];
    void *dy = up(o, y, LY);
    cublasStatus_t st = o->axpy(N, scalar(o, 1.25), up(o, x, LX), INCX, dy, INCY);
    down(o, dy, LY, got);
    check(o, nm(o, "axpy"), NULL, st, got, want, LY);
}

static void t_copy(const ops *o) {
    double x[LX], y[LY], want[LY], got[LY];
    fill(x, LX, 3), fill(y, LY, 4);
    memcpy(want, y, sizeof y);
    for (int i = 0; i < N; i++)
        want[i * INCY] = x[i * INCX];
    void *dy = up(o, y, LY);
    cublasStatus_t st = o->copy(N, up(o, x, LX), INCX, dy, INCY);
    down(o, dy, LY, got);
    check(o, nm(o, "copy"), NULL, st, got, want, LY);
}

static void t_scal(const ops *o) {
    double x[LX], want[LX], got[LX];
    fill(x, LX, 5);
    memcpy(want, x, sizeof x);
    for (int i = 0; i < N; i++)
        want[i * INCX] *= -0.75;
    void *dx = up(o, x, LX);
    cublasStatus_t st = o->scal(N, scalar(o, -0.75), dx, INCX);
    down(o, dx, LX, got);
    check(o, nm(o, "scal"), NULL, st, got, want, LX);
}

static void t_swap(const ops *o) {
    double xy[LX + LY], want[LX + LY], got[LX + LY];
    fill(xy, LX + LY, 6);
    memcpy(want, xy, sizeof xy);
    for (int i = 0; i < N; i++) {
        want[i * INCX] = xy[LX + i * INCY];
        want[LX + i * INCY] = xy[i * INCX];
    }
    void *dx = up(o, xy, LX), *dy = up(o, xy + LX, LY);
    cublasStatus_t st = o->swap(N, dx, INCX, dy, INCY);
    down(o, dx, LX, got);
    down(o, dy, LY, got + LX);
    check(o, nm(o, "swap"), NULL, st, got, want, LX + LY);
}

/* nrm2 (asum false) and asum */
static void t_norm(const ops *o, bool asum) {
    double x[LX], want = 0, got;
    fill(x, LX, 7);
    for (int i = 0; i < N; i++)
        want += asum ? fabs_(x[i * INCX]) : x[i * INCX] * x[i * INCX];
    void *r = scalar(o, -1);
    cublasStatus_t st = (asum ? o->asum : o->nrm2)(N, up(o, x, LX), INCX, r);
    scalars_back(o, r, 1, &got);
    if (!asum)
        got *= got; /* the norm squared: the sum of the squares */
    check(o, nm(o, asum ? "asum" : "nrm2"), NULL, st, &got, &want, 1);
}

/* amax (min false) and amin: one element stands out, every other a gap's */
static void t_amax(const ops *o, bool min) {
    double x[LX];
    for (int i = 0; i < LX; i++)
        x[i] = 1 + (i % 5) * 0.25;
    x[12 * INCX] = min ? -0.5 : -3;
    x[12 * INCX + 1] = min ? 0 : 9; /* in a gap: not looked at */
    int *r = int_result();
    cublasStatus_t st = (min ? o->amin : o->amax)(N, up(o, x, LX), INCX, r);
    double got = st == CUBLAS_STATUS_SUCCESS ? int_back(r) : 0, want = 13;
    char name[16];
    snprintf(name, sizeof name, "%s%s", o->i, min ? "amin" : "amax");
    check(o, name, NULL, st, &got, &want, 1);
}

/* rot (m false) and rotm (the full matrix: flag -1) */
static void t_rot(const ops *o, bool m) {
    double xy[LX + LY], want[LX + LY], got[LX + LY];
    double c = 0.6, s = 0.8, param[5] = {-1, 0.5, -0.25, 0.75, 1.5};
    fill(xy, LX + LY, 8);
    memcpy(want, xy, sizeof xy);
    for (int i = 0; i < N; i++) {
        double x = xy[i * INCX], y = xy[LX + i * INCY];
        want[i * INCX] = m ? param[1] * x + param[3] * y : c * x + s * y;
        want[LX + i * INCY] = m ? param[2] * x + param[4] * y : c * y - s * x;
    }
    void *dx = up(o, xy, LX), *dy = up(o, xy + LX, LY);
    cublasStatus_t st = m ? o->rotm(N, dx, INCX, dy, INCY, scalars(o, param, 5))
                          : o->rot(N, dx, INCX, dy, INCY, scalar(o, c), scalar(o, s));
    down(o, dx, LX, got);
    down(o, dy, LY, got + LX);
    check(o, nm(o, m ? "rotm" : "rot"), NULL, st, got, want, LX + LY);
}

static void t_rotg(const ops *o) {
    /* a = 3, b = 4: r = 5, c = 0.6, s = 0.8, and z = 1 / c (|a| <= |b|) */
    double ab[2] = {3, 4}, want[4] = {5, 1 / 0.6, 0.6, 0.8}, got[4];
    void *a = scalars(o, ab, 2), *c = scalar(o, 9), *s = scalar(o, 9);
    void *b = (char *)a + tsize(o);
    cublasStatus_t st = o->rotg(a, b, c, s);
    scalars_back(o, a, 2, got);
    scalars_back(o, c, 1, got + 2);
    scalars_back(o, s, 1, got + 3);
    check(o, nm(o, "rotg"), NULL, st, got, want, 4);
}

/* rotmg: H from param must zero the second component of (x1, y1), give x1 as the first, and keep the weighted
 * norm: d1 x1^2 + d2 y1^2 = d1' x1'^2. */
static void t_rotmg(const ops *o) {
    double in[4] = {2, 1, 1.5, 0.75}, out[3], param[5];
    void *d = scalars(o, in, 3), *y1 = scalar(o, in[3]), *p = scalars(o, (double[5]){9, 9, 9, 9, 9}, 5);
    cublasStatus_t st =
        o->rotmg(d, (char *)d + tsize(o), (char *)d + 2 * tsize(o), y1, p); /* d1, d2, x1 side by side */
    scalars_back(o, d, 3, out);
    scalars_back(o, p, 5, param);
    double h11 = param[1], h21 = param[2], h12 = param[3], h22 = param[4];
    if (param[0] == 0)
        h11 = h22 = 1;
    else if (param[0] == 1)
        h21 = -1, h12 = 1;
    else if (param[0] == -2)
        h11 = h22 = 1, h21 = h12 = 0;
    double first = h11 * in[2] + h12 * in[3], second = h21 * in[2] + h22 * in[3];
    double got[3] = {first, second, out[0] * out[2] * out[2]};
    double want[3] = {out[2], 0, in[0] * in[2] * in[2] + in[1] * in[3] * in[3]};
    check(o, nm(o, "rotmg"), NULL, st, got, want, 3);
}

/* ---- level 2 and 3: column-major matrices ---- */

#define AT(a, ld, i, j) (a)[(size_t)(i) + (size_t)(j) * (size_t)(ld)]

/* The triangular matrix in a's uplo triangle (a unit diagonal for diag unit). */
static double tri(const double *a, int lda, cublasFillMode_t u, cublasDiagType_t d, int i, int j) {
    if (i == j)
        return d == CUBLAS_DIAG_UNIT ? 1 : AT(a, lda, i, i);
    return (u == CUBLAS_FILL_MODE_UPPER ? i < j : i > j) ? AT(a, lda, i, j) : 0;
}
/* The symmetric matrix in a's uplo triangle. */
static double sym(const double *a, int lda, cublasFillMode_t u, int i, int j) {
    bool in = u == CUBLAS_FILL_MODE_UPPER ? i <= j : i >= j;
    return in ? AT(a, lda, i, j) : AT(a, lda, j, i);
}
static bool in_tri(cublasFillMode_t u, int i, int j) { return u == CUBLAS_FILL_MODE_UPPER ? i <= j : i >= j; }

static const char *const uplo_s[] = {"L", "U"}, *const trans_s[] = {"N", "T", "C"}, *const diag_s[] = {"N", "U"},
                         *const side_s[] = {"L", "R"};

enum { MN = 11, LDA = 14 };

/* trmv (solve false) and trsv; trsv's matrix has a strong diagonal and small entries off it. */
static void t_trxv(const ops *o, bool solve, cublasFillMode_t u, cublasOperation_t t, cublasDiagType_t d) {
    double a[LDA * MN], x[LX], want[LX], got[LX];
    fill(a, LDA * MN, 9), fill(x, LX, 10);
    if (solve)
        for (int j = 0; j < MN; j++)
            for (int i = 0; i < LDA; i++)
                AT(a, LDA, i, j) = i == j ? 2 + AT(a, LDA, i, j) / 4 : AT(a, LDA, i, j) / 16;
    memcpy(want, x, sizeof x);
    /* op(A)[i][j] */
#define OPA(i, j) (t == CUBLAS_OP_N ? tri(a, LDA, u, d, i, j) : tri(a, LDA, u, d, j, i))
    if (!solve) {
        for (int i = 0; i < MN; i++) {
            double s = 0;
            for (int j = 0; j < MN; j++)
                s += OPA(i, j) * x[j * INCX];
            want[i * INCX] = s;
        }
    } else {
        /* op(A) is lower triangular for (L, N) and (U, T): forward substitution, else backward */
        bool lower = (u == CUBLAS_FILL_MODE_LOWER) == (t == CUBLAS_OP_N);
        for (int k = 0; k < MN; k++) {
            int i = lower ? k : MN - 1 - k;
            double s = x[i * INCX];
            for (int j = 0; j < MN; j++)
                if (j != i && OPA(i, j) != 0)
                    s -= OPA(i, j) * want[j * INCX];
            want[i * INCX] = s / OPA(i, i);
        }
    }
#undef OPA
    void *dx = up(o, x, LX);
    cublasStatus_t st = (solve ? o->trsv : o->trmv)(u, t, d, MN, up(o, a, LDA * MN), LDA, dx, INCX);
    down(o, dx, LX, got);
    char v[16];
    snprintf(v, sizeof v, "%s%s%s", uplo_s[u], trans_s[t], diag_s[d]);
    check(o, nm(o, solve ? "trsv" : "trmv"), v, st, got, want, LX);
}

static void t_ger(const ops *o) {
    enum { M = 13 };
    double a[16 * MN], x[LX], y[LY], want[16 * MN], got[16 * MN];
    fill(a, 16 * MN, 11), fill(x, LX, 12), fill(y, LY, 13);
    memcpy(want, a, sizeof a);
    for (int j = 0; j < MN; j++)
        for (int i = 0; i < M; i++)
            AT(want, 16, i, j) += 0.5 * x[i * INCX] * y[j * INCY];
    void *da = up(o, a, 16 * MN);
    cublasStatus_t st = o->ger(M, MN, scalar(o, 0.5), up(o, x, LX), INCX, up(o, y, LY), INCY, da, 16);
    down(o, da, 16 * MN, got);
    check(o, nm(o, "ger"), NULL, st, got, want, 16 * MN);
}

/* syr (two false) and syr2: only the uplo triangle changes */
static void t_syr(const ops *o, bool two, cublasFillMode_t u) {
    double a[LDA * MN], x[LX], y[LY], want[LDA * MN], got[LDA * MN];
    fill(a, LDA * MN, 14), fill(x, LX, 15), fill(y, LY, 16);
    memcpy(want, a, sizeof a);
    for (int j = 0; j < MN; j++)
        for (int i = 0; i < MN; i++)
            if (in_tri(u, i, j))
                AT(want, LDA, i, j) += two ? -1.5 * (x[i * INCX] * y[j * INCY] + y[i * INCY] * x[j * INCX])
                                           : -1.5 * x[i * INCX] * x[j * INCX];
    void *da = up(o, a, LDA * MN), *dx = up(o, x, LX), *alpha = scalar(o, -1.5);
    cublasStatus_t st =
        two ? o->syr2(u, MN, alpha, dx, INCX, up(o, y, LY), INCY, da, LDA) : o->syr(u, MN, alpha, dx, INCX, da, LDA);
    down(o, da, LDA * MN, got);
    check(o, nm(o, two ? "syr2" : "syr"), uplo_s[u], st, got, want, LDA * MN);
}

static void t_symv(const ops *o, cublasFillMode_t u) {
    double a[LDA * MN], x[LX], y[LY], want[LY], got[LY];
    fill(a, LDA * MN, 17), fill(x, LX, 18), fill(y, LY, 19);
    memcpy(want, y, sizeof y);
    for (int i = 0; i < MN; i++) {
        double s = 0;
        for (int j = 0; j < MN; j++)
            s += sym(a, LDA, u, i, j) * x[j * INCX];
        want[i * INCY] = 0.75 * s - 0.5 * y[i * INCY];
    }
    void *dy = up(o, y, LY);
    cublasStatus_t st =
        o->symv(u, MN, scalar(o, 0.75), up(o, a, LDA * MN), LDA, up(o, x, LX), INCX, scalar(o, -0.5), dy, INCY);
    down(o, dy, LY, got);
    check(o, nm(o, "symv"), uplo_s[u], st, got, want, LY);
}

enum { M3 = 9, N3 = 7, K3 = 5, LD3 = 12 };

static void t_symm(const ops *o, cublasSideMode_t s, cublasFillMode_t u) {
    double a[LD3 * LD3], b[LD3 * N3], c[LD3 * N3], want[LD3 * N3], got[LD3 * N3];
    fill(a, LD3 * LD3, 20), fill(b, LD3 * N3, 21), fill(c, LD3 * N3, 22);
    memcpy(want, c, sizeof c);
    for (int j = 0; j < N3; j++)
        for (int i = 0; i < M3; i++) {
            double sum = 0;
            if (s == CUBLAS_SIDE_LEFT)
                for (int l = 0; l < M3; l++)
                    sum += sym(a, LD3, u, i, l) * AT(b, LD3, l, j);
            else
                for (int l = 0; l < N3; l++)
                    sum += AT(b, LD3, i, l) * sym(a, LD3, u, l, j);
            AT(want, LD3, i, j) = 1.5 * sum + 0.25 * AT(c, LD3, i, j);
        }
    void *dc = up(o, c, LD3 * N3);
    cublasStatus_t st = o->symm(s, u, M3, N3, scalar(o, 1.5), up(o, a, LD3 * LD3), LD3, up(o, b, LD3 * N3), LD3,
                                scalar(o, 0.25), dc, LD3);
    down(o, dc, LD3 * N3, got);
    char v[8];
    snprintf(v, sizeof v, "%s%s", side_s[s], uplo_s[u]);
    check(o, nm(o, "symm"), v, st, got, want, LD3 * N3);
}

/* syrk (two false) and syr2k: C's uplo triangle; op(A) is n x k */
static void t_syrk(const ops *o, bool two, cublasFillMode_t u, cublasOperation_t t) {
    double a[LD3 * LD3], b[LD3 * LD3], c[LD3 * M3], want[LD3 * M3], got[LD3 * M3];
    fill(a, LD3 * LD3, 23), fill(b, LD3 * LD3, 24), fill(c, LD3 * M3, 25);
    memcpy(want, c, sizeof c);
#define OP(m, i, l) (t == CUBLAS_OP_N ? AT(m, LD3, i, l) : AT(m, LD3, l, i))
    for (int j = 0; j < M3; j++)
        for (int i = 0; i < M3; i++) {
            if (!in_tri(u, i, j))
                continue;
            double sum = 0;
            for (int l = 0; l < K3; l++)
                sum += two ? OP(a, i, l) * OP(b, j, l) + OP(b, i, l) * OP(a, j, l) : OP(a, i, l) * OP(a, j, l);
            AT(want, LD3, i, j) = -0.5 * sum + 1.25 * AT(c, LD3, i, j);
        }
#undef OP
    void *dc = up(o, c, LD3 * M3), *da = up(o, a, LD3 * LD3);
    cublasStatus_t st =
        two ? o->syr2k(u, t, M3, K3, scalar(o, -0.5), da, LD3, up(o, b, LD3 * LD3), LD3, scalar(o, 1.25), dc, LD3)
            : o->syrk(u, t, M3, K3, scalar(o, -0.5), da, LD3, scalar(o, 1.25), dc, LD3);
    down(o, dc, LD3 * M3, got);
    char v[8];
    snprintf(v, sizeof v, "%s%s", uplo_s[u], trans_s[t]);
    check(o, nm(o, two ? "syr2k" : "syrk"), v, st, got, want, LD3 * M3);
}

static void t_trmm(const ops *o, cublasSideMode_t s, cublasFillMode_t u, cublasOperation_t t, cublasDiagType_t d) {
    double a[LD3 * LD3], b[LD3 * N3], c[(LD3 + 2) * N3], want[(LD3 + 2) * N3], got[(LD3 + 2) * N3];
    fill(a, LD3 * LD3, 26), fill(b, LD3 * N3, 27), fill(c, (LD3 + 2) * N3, 28);
    memcpy(want, c, sizeof c);
#define OPA(i, j) (t == CUBLAS_OP_N ? tri(a, LD3, u, d, i, j) : tri(a, LD3, u, d, j, i))
    for (int j = 0; j < N3; j++)
        for (int i = 0; i < M3; i++) {
            double sum = 0;
            if (s == CUBLAS_SIDE_LEFT)
                for (int l = 0; l < M3; l++)
                    sum += OPA(i, l) * AT(b, LD3, l, j);
            else
                for (int l = 0; l < N3; l++)
                    sum += AT(b, LD3, i, l) * OPA(l, j);
            AT(want, LD3 + 2, i, j) = 0.5 * sum;
        }
#undef OPA
    void *dc = up(o, c, (LD3 + 2) * N3);
    cublasStatus_t st =
        o->trmm(s, u, t, d, M3, N3, scalar(o, 0.5), up(o, a, LD3 * LD3), LD3, up(o, b, LD3 * N3), LD3, dc, LD3 + 2);
    down(o, dc, (LD3 + 2) * N3, got);
    char v[8];
    snprintf(v, sizeof v, "%s%s%s%s", side_s[s], uplo_s[u], trans_s[t], diag_s[d]);
    check(o, nm(o, "trmm"), v, st, got, want, (LD3 + 2) * N3);
}

/* ---- the checks by name ---- */

static const cublasFillMode_t L = CUBLAS_FILL_MODE_LOWER, U = CUBLAS_FILL_MODE_UPPER;
static const cublasOperation_t OPN = CUBLAS_OP_N, OPT = CUBLAS_OP_T;
static const cublasDiagType_t NU = CUBLAS_DIAG_NON_UNIT, UD = CUBLAS_DIAG_UNIT;

static void c_axpy(const ops *o) { t_axpy(o); }
static void c_copy(const ops *o) { t_copy(o); }
static void c_scal(const ops *o) { t_scal(o); }
static void c_swap(const ops *o) { t_swap(o); }
static void c_nrm2(const ops *o) { t_norm(o, false); }
static void c_asum(const ops *o) { t_norm(o, true); }
static void c_amax(const ops *o) { t_amax(o, false); }
static void c_amin(const ops *o) { t_amax(o, true); }
static void c_rot(const ops *o) { t_rot(o, false); }
static void c_rotm(const ops *o) { t_rot(o, true); }
static void c_rotg(const ops *o) { t_rotg(o); }
static void c_rotmg(const ops *o) { t_rotmg(o); }
static void c_trmv(const ops *o) {
    t_trxv(o, false, U, OPN, NU);
    t_trxv(o, false, L, OPT, UD);
}
static void c_trsv(const ops *o) {
    t_trxv(o, true, L, OPN, NU);
    t_trxv(o, true, U, OPT, UD);
}
static void c_ger(const ops *o) { t_ger(o); }
static void c_syr(const ops *o) {
    t_syr(o, false, U);
    t_syr(o, false, L);
}
static void c_syr2(const ops *o) {
    t_syr(o, true, L);
    t_syr(o, true, U);
}
static void c_symv(const ops *o) {
    t_symv(o, L);
    t_symv(o, U);
}
static void c_symm(const ops *o) {
    t_symm(o, CUBLAS_SIDE_LEFT, U);
    t_symm(o, CUBLAS_SIDE_RIGHT, L);
}
static void c_syrk(const ops *o) {
    t_syrk(o, false, U, OPN);
    t_syrk(o, false, L, OPT);
}
static void c_syr2k(const ops *o) {
    t_syrk(o, true, L, OPN);
    t_syrk(o, true, U, OPT);
}
static void c_trmm(const ops *o) {
    t_trmm(o, CUBLAS_SIDE_LEFT, U, OPN, NU);
    t_trmm(o, CUBLAS_SIDE_RIGHT, L, OPT, UD);
}

static const struct level {
    const char *name; /* after the precision's letter (amax, amin: after Is / Id) */
    void (*run)(const ops *);
} levels[] = {
    {"axpy", c_axpy}, {"copy", c_copy}, {"scal", c_scal},   {"swap", c_swap}, {"nrm2", c_nrm2}, {"asum", c_asum},
    {"amax", c_amax}, {"amin", c_amin}, {"rot", c_rot},     {"rotm", c_rotm}, {"rotg", c_rotg}, {"rotmg", c_rotmg},
    {"trmv", c_trmv}, {"trsv", c_trsv}, {"ger", c_ger},     {"syr", c_syr},   {"syr2", c_syr2}, {"symv", c_symv},
    {"symm", c_symm}, {"syrk", c_syrk}, {"syr2k", c_syr2k}, {"trmm", c_trmm},
};

/* A level function's check, in both pointer modes. */
static void run_level(const ops *o, const struct level *l) {
    for (int d = 0; d < 2; d++) {
        dev_mode = d;
        nscalars = 0;
        cublasStatus_t st =
            CALL(cublasSetPointerMode_v2, handle, d ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST);
        if (st != CUBLAS_STATUS_SUCCESS)
            die("cublasSetPointerMode", (int)st);
        l->run(o);
        release();
    }
    CALL(cublasSetPointerMode_v2, handle, CUBLAS_POINTER_MODE_HOST);
}

/* "levels", or one function: Daxpy, Isamax, ... Whether name was one of them. */
static bool levels_check(const char *name) {
    bool all = strcmp(name, "levels") == 0, found = all;
    for (int p = 0; p < 2; p++) {
        const ops *o = p ? &ops_D : &ops_S;
        for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
            char full[32];
            bool idx = strcmp(levels[i].name, "amax") == 0 || strcmp(levels[i].name, "amin") == 0;
            snprintf(full, sizeof full, "%s%s", idx ? o->i : o->p, levels[i].name);
            if (all || strcmp(full, name) == 0) {
                run_level(o, &levels[i]);
                found = true;
            }
        }
    }
    return found;
}

/* ---- copies ---- */

/* A host-device copy of rows x cols elements of 4 bytes (a vector: rows 1, its increments the leading dimensions),
 * into memory whose other bytes must stay as they were. */
static void copy_case(bool matrix, bool to_dev, int rows, int cols, int lda, int ldb) {
    enum { CAP = 32768 };
    static uint32_t src[CAP], dst[CAP], want[CAP], got[CAP];
    char name[64];
    snprintf(name, sizeof name, "%s%s-%dx%d-%d-%d", to_dev ? "set" : "get", matrix ? "matrix" : "vector", rows, cols,
             lda, ldb);
    size_t ns = (size_t)lda * (size_t)cols, nd = (size_t)ldb * (size_t)cols;
    if (ns > CAP || nd > CAP)
        die("copy case too large", (int)(ns > nd ? ns : nd));
    for (size_t i = 0; i < CAP; i++)
        src[i] = 0x10000000u + (uint32_t)i, dst[i] = 0xdead0000u + (uint32_t)i;
    memcpy(want, dst, sizeof dst);
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < rows; i++)
            want[i + (size_t)j * (size_t)ldb] = src[i + (size_t)j * (size_t)lda];
    void *ds = dev_alloc(ns * 4), *dd = dev_alloc(nd * 4);
    CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)ds, src, ns * 4));
    CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dd, dst, nd * 4));
    cublasStatus_t st;
    if (matrix)
        st = to_dev ? CALL(cublasSetMatrixAsync, rows, cols, 4, src, lda, dd, ldb, stream)
                    : CALL(cublasGetMatrixAsync, rows, cols, 4, ds, lda, dst, ldb, stream);
    else
        st = to_dev ? CALL(cublasSetVectorAsync, cols, 4, src, lda, dd, ldb, stream)
                    : CALL(cublasGetVectorAsync, cols, 4, ds, lda, dst, ldb, stream);
    CU(cuStreamSynchronize(stream));
    if (to_dev)
        CU(cuMemcpyDtoH(got, (CUdeviceptr)(uintptr_t)dd, nd * 4));
    else
        memcpy(got, dst, nd * 4);
    release();
    char why[96];
    if (st != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, sizeof why, "status %d", (int)st);
        result(name, NULL, why);
        return;
    }
    for (size_t i = 0; i < nd; i++)
        if (got[i] != want[i]) {
            snprintf(why, sizeof why, "element %zu is %08x, want %08x", i, got[i], want[i]);
            result(name, NULL, why);
            return;
        }
    result(name, NULL, NULL);
}

static void expect_status(const char *name, cublasStatus_t got, cublasStatus_t want) {
    char why[64];
    snprintf(why, sizeof why, "status %d, want %d", (int)got, (int)want);
    result(name, NULL, got == want ? NULL : why);
}

static void copies(void) {
    static const int shapes[][4] = {
        {5, 4, 5, 5}, {5, 4, 7, 5}, {5, 4, 5, 9}, {5, 4, 6, 8}, {1, 1, 1, 1}, {3, 5, 5000, 3}, {3, 5, 3, 5000},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int to_dev = 0; to_dev < 2; to_dev++)
            copy_case(true, to_dev, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
    static const int vectors[][3] = {{10, 1, 1}, {10, 2, 1}, {10, 1, 3}, {10, 3, 2}, {9, 3000, 1}, {9, 1, 3000}};
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++)
        for (int to_dev = 0; to_dev < 2; to_dev++)
            copy_case(false, to_dev, 1, vectors[i][0], vectors[i][1], vectors[i][2]);
    uint32_t h[4] = {0};
    void *d = dev_alloc(sizeof h);
    expect_status("setmatrix-rows-negative", CALL(cublasSetMatrixAsync, -1, 2, 4, h, 2, d, 2, stream),
                  CUBLAS_STATUS_INVALID_VALUE);
    expect_status("getmatrix-elem-zero", CALL(cublasGetMatrixAsync, 2, 2, 0, d, 2, h, 2, stream),
                  CUBLAS_STATUS_INVALID_VALUE);
    expect_status("setvector-inc-zero", CALL(cublasSetVectorAsync, 2, 4, h, 0, d, 1, stream),
                  CUBLAS_STATUS_INVALID_VALUE);
    expect_status("getvector-none", CALL(cublasGetVectorAsync, 0, 4, d, 1, h, 1, stream), CUBLAS_STATUS_SUCCESS);
    release();
}

/* ---- what served mode refuses, and a function the worker's cuBLAS lacks ---- */

static void refused(void) {
    cuComplex a = {1, 0};
    cuDoubleComplex z = {1, 0};
    void *x = dev_alloc(64), *y = dev_alloc(64);
    for (int i = 0; i < 2; i++) {
        expect_status(i ? "Caxpy-again" : "Caxpy", CALL(cublasCaxpy_v2, handle, 4, &a, x, 1, y, 1),
                      CUBLAS_STATUS_NOT_SUPPORTED);
        float r = 0;
        expect_status(i ? "Scnrm2-again" : "Scnrm2", CALL(cublasScnrm2_v2, handle, 4, x, 1, &r),
                      CUBLAS_STATUS_NOT_SUPPORTED);
        expect_status(
            i ? "ZgemmBatched-again" : "ZgemmBatched",
            CALL(cublasZgemmBatched, handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &z, NULL, 2, NULL, 2, &z, NULL, 2, 0),
            CUBLAS_STATUS_NOT_SUPPORTED);
    }
    release();
}

static void probes(void) {
    enum { M = 13 };
    const ops *o = &ops_D;
    double a[16 * MN], x[LX], y[LY], want[16 * MN], got[16 * MN], alpha = 0.5;
    fill(a, 16 * MN, 21), fill(x, LX, 22), fill(y, LY, 23);
    memcpy(want, a, sizeof a);
    for (int j = 0; j < MN; j++)
        for (int i = 0; i < M; i++)
            AT(want, 16, i, j) += 0.5 * x[0] * y[j * INCY];
    dev_mode = false; /* the handle's pointer mode is host between checks */
    void *da = up(o, a, 16 * MN), *dx = up(o, x, LX), *dy = up(o, y, LY);
    cublasStatus_t st = o->ger(M, MN, &alpha, dx, 0, dy, INCY, da, 16);
    down(o, da, 16 * MN, got);
    check(o, "Dger", "incx-zero", st, got, want, 16 * MN);
    st = o->ger(M, MN, &alpha, dx, INCX, dy, INCY, da, 5);
    CUresult r = cuCtxSynchronize();
    down(o, da, 16 * MN, a);
    char why[96];
    snprintf(why, sizeof why, "status %d (want %d), then cuCtxSynchronize %d", (int)st,
             (int)CUBLAS_STATUS_INVALID_VALUE, (int)r);
    result("Dger-lda-short", NULL, st == CUBLAS_STATUS_INVALID_VALUE && r == CUDA_SUCCESS ? NULL : why);
    result("Dger-lda-short-untouched", NULL, memcmp(a, got, sizeof a) == 0 ? NULL : "A changed");
    release();
}

static void missing(void) {
    double v[4] = {1, 2, 2, 4};
    float r = 0;
    expect_status("Snrm2-missing", CALL(cublasSnrm2_v2, handle, 4, up(&ops_S, v, 4), 1, &r),
                  CUBLAS_STATUS_NOT_SUPPORTED);
    release();
}

int main(int argc, char **argv) {
    int first = 1;
    if (argc > 2 && strcmp(argv[1], "--lib") == 0) {
        lib_name = argv[2];
        first = 3;
    }
    if (first >= argc) {
        fprintf(stderr, "usage: blaslevels [--lib LIBRARY] levels|NAME|copies|refused|missing|probes...\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    if (!(lib = dlopen(lib_name, RTLD_NOW | RTLD_LOCAL))) {
        fprintf(stderr, "blaslevels: %s\n", dlerror());
        return 3;
    }
    cublasStatus_t st = CALL(cublasCreate_v2, &handle);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = CALL(cublasSetStream_v2, handle, stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        die("cublasCreate", (int)st);
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "copies") == 0)
            copies();
        else if (strcmp(argv[i], "refused") == 0)
            refused();
        else if (strcmp(argv[i], "missing") == 0)
            missing();
        else if (strcmp(argv[i], "probes") == 0)
            probes();
        else if (!levels_check(argv[i])) {
            fprintf(stderr, "blaslevels: no check %s\n", argv[i]);
            return 2;
        }
    }
    CALL(cublasDestroy_v2, handle);
    CU(cuStreamDestroy(stream));
    printf("done %d %d\n", passed, failed);
    return failed ? 1 : 0;
}

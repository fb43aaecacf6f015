/*
 * The served-mode worker's cuBLAS and cuBLASLt (blas.h). The client is
 * another user's process: every id is bounds-checked against its kind's cap
 * before use, every size against what its record holds, and the library's
 * path is loaded only after the worker took that user (worker.go), so it
 * runs nothing the process could not run itself.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "gpucr/cublas.h"
#include "served.h"

#define STR_(x) #x
#define STR(x) STR_(x)

#define BLAS_FNS(X)                                                                                                    \
    X(cublasCreate_v2)                                                                                                 \
    X(cublasDestroy_v2)                                                                                                \
    X(cublasSetStream_v2)                                                                                              \
    X(cublasSetWorkspace_v2)                                                                                           \
    X(cublasSetMathMode)                                                                                               \
    X(cublasSetPointerMode_v2)                                                                                         \
    X(cublasSetAtomicsMode)                                                                                            \
    X(cublasSgemm_v2)                                                                                                  \
    X(cublasDgemm_v2)                                                                                                  \
    X(cublasGemmEx)                                                                                                    \
    X(cublasSgemmStridedBatched)                                                                                       \
    X(cublasDgemmStridedBatched)                                                                                       \
    X(cublasGemmStridedBatchedEx)                                                                                      \
    X(cublasGetProperty)                                                                                               \
    X(cublasGetCudartVersion)                                                                                          \
    X(cublasSgemv_v2)                                                                                                  \
    X(cublasDgemv_v2)                                                                                                  \
    X(cublasSdot_v2)                                                                                                   \
    X(cublasDdot_v2)

/* Level 1, 2 and 3 on real data (SV_OP_BLAS_CALL): looked up, not required (a library without one answers
 * CUBLAS_STATUS_NOT_SUPPORTED to its calls). */
#define BLAS_SD(X, f) X(cublasS##f##_v2) X(cublasD##f##_v2)
#define BLAS_OPT_FNS(X)                                                                                                \
    BLAS_SD(X, axpy)                                                                                                   \
    BLAS_SD(X, copy)                                                                                                   \
    BLAS_SD(X, scal)                                                                                                   \
    BLAS_SD(X, swap)                                                                                                   \
    BLAS_SD(X, rot)                                                                                                    \
    BLAS_SD(X, rotm)                                                                                                   \
    BLAS_SD(X, nrm2)                                                                                                   \
    BLAS_SD(X, asum)                                                                                                   \
    X(cublasIsamax_v2)                                                                                                 \
    X(cublasIdamax_v2)                                                                                                 \
    X(cublasIsamin_v2)                                                                                                 \
    X(cublasIdamin_v2)                                                                                                 \
    BLAS_SD(X, rotg)                                                                                                   \
    BLAS_SD(X, rotmg)                                                                                                  \
    BLAS_SD(X, trmv)                                                                                                   \
    BLAS_SD(X, trsv)                                                                                                   \
    BLAS_SD(X, ger)                                                                                                    \
    BLAS_SD(X, syr)                                                                                                    \
    BLAS_SD(X, syr2)                                                                                                   \
    BLAS_SD(X, symv)                                                                                                   \
    BLAS_SD(X, symm)                                                                                                   \
    BLAS_SD(X, syrk)                                                                                                   \
    BLAS_SD(X, syr2k)                                                                                                  \
    BLAS_SD(X, trmm)

#define LT_FNS(X)                                                                                                      \
    X(cublasLtCreate)                                                                                                  \
    X(cublasLtDestroy)                                                                                                 \
    X(cublasLtMatmulDescCreate)                                                                                        \
    X(cublasLtMatmulDescDestroy)                                                                                       \
    X(cublasLtMatmulDescSetAttribute)                                                                                  \
    X(cublasLtMatmulDescGetAttribute)                                                                                  \
    X(cublasLtMatrixLayoutCreate)                                                                                      \
    X(cublasLtMatrixLayoutDestroy)                                                                                     \
    X(cublasLtMatrixLayoutSetAttribute)                                                                                \
    X(cublasLtMatrixLayoutGetAttribute)                                                                                \
    X(cublasLtMatmulPreferenceCreate)                                                                                  \
    X(cublasLtMatmulPreferenceDestroy)                                                                                 \
    X(cublasLtMatmulPreferenceSetAttribute)                                                                            \
    X(cublasLtMatmulPreferenceGetAttribute)                                                                            \
    X(cublasLtMatmulAlgoGetHeuristic)                                                                                  \
    X(cublasLtMatmul)                                                                                                  \
    X(cublasLtGetProperty)                                                                                             \
    X(cublasLtGetVersion)                                                                                              \
    X(cublasLtGetCudartVersion)

#define DECL(f) static __typeof__(&f) p_##f;
BLAS_FNS(DECL)
BLAS_OPT_FNS(DECL)
LT_FNS(DECL)
#undef DECL
static bool have_blas, have_lt;
/* Something was made with the library (0 cuBLAS, 1 cuBLASLt): it stays the one in use. */
static bool made[2];

/* A cuBLAS handle: the stream and pointer mode last set on it, set again only when a call's differ; the process's
 * workspace (ws_set: SV_BS_WORKSPACE's, until SV_BS_WORKSPACE_DEFAULT), set again after the stream. */
struct wbh {
    cublasHandle_t h;
    CUstream stream;
    uint32_t stream_id;
    int ptr_mode;
    bool ws_set;
    uint64_t ws, ws_size;
};

bool wblas_op(unsigned op) { return op >= SV_OP_BLAS_LOAD && op <= SV_OP_BLAS_CALL; }

/* An asynchronous call's status, as the CUresult its deferral reports. */
static CUresult as_cu(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return CUDA_SUCCESS;
    case CUBLAS_STATUS_INVALID_VALUE: return CUDA_ERROR_INVALID_VALUE;
    case CUBLAS_STATUS_NOT_SUPPORTED: return CUDA_ERROR_NOT_SUPPORTED;
    case CUBLAS_STATUS_ALLOC_FAILED: return CUDA_ERROR_OUT_OF_MEMORY;
    case CUBLAS_STATUS_NOT_INITIALIZED: return CUDA_ERROR_NOT_INITIALIZED;
    case CUBLAS_STATUS_EXECUTION_FAILED: return CUDA_ERROR_LAUNCH_FAILED;
    default: return CUDA_ERROR_UNKNOWN;
    }
}

/* A synchronous call's answer: its status first. */
static CUresult answer(uint8_t *out, uint32_t *olen, cublasStatus_t st) {
    int32_t v = (int32_t)st;
    memcpy(out, &v, sizeof v);
    *olen = sizeof v;
    return CUDA_SUCCESS;
}

static void *obj(const wblas_env *e, unsigned kind, uint32_t id) {
    return id > 0 && id < sv_cap(kind) ? e->tab[kind][id] : NULL;
}
static bool slot_free(const wblas_env *e, unsigned kind, uint32_t id) {
    return id > 0 && id < sv_cap(kind) && e->tab[kind][id] == NULL;
}

/* The library loaded for which (0 cuBLAS, 1 cuBLASLt), whose functions the p_ pointers are. */
static void *lib[2];

/*
 * Loads NVIDIA's library (which) from path, its functions into the p_ pointers; msg says why not. The same file
 * again (loaded ahead, wblas_preload) costs nothing; another one replaces it only while nothing was made with it
 * (a process's load comes before its first handle; a later one is a hostile client's).
 */
static void open_lib(unsigned which, const char *path, char *msg, size_t len) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(msg, len, "%s", dlerror());
        return;
    }
    if (h == lib[which]) {
        dlclose(h); /* the reference dlopen took again */
        return;
    }
    if (lib[which] && made[which]) {
        dlclose(h);
        snprintf(msg, len, "another %s is in use already", which == 0 ? "cuBLAS" : "cuBLASLt");
        return;
    }
    if (which == 0) {
#define RES(f)                                                                                                         \
    if (!msg[0] && !(p_##f = (__typeof__(p_##f))dlsym(h, STR(f))))                                                     \
        snprintf(msg, len, "the library exports no %s", STR(f));
        BLAS_FNS(RES)
    } else {
        LT_FNS(RES)
#undef RES
    }
    if (msg[0]) {
        dlclose(h);
        /* the pointers may be half of this library's: another load must resolve them all again */
        if (which == 0)
            have_blas = false, lib[0] = NULL;
        else
            have_lt = false, lib[1] = NULL;
        return;
    }
    if (which == 0) {
#define OPT(f) p_##f = (__typeof__(p_##f))dlsym(h, STR(f));
        BLAS_OPT_FNS(OPT)
#undef OPT
    }
    lib[which] = h;
    if (which == 0)
        have_blas = true;
    else
        have_lt = true;
}

/* A cuBLAS handle made ahead (wblas_preload) with the library it was made with: the process's first handle. Making
 * one loads cuBLAS's own state into the context, which a waiting worker can do before anyone waits for it. */
static cublasHandle_t spare;
static void *spare_lib;

int wblas_preload(const char *dir, char *err, size_t errlen) {
    static const char *const names[2] = {"libcublas.so.13", "libcublasLt.so.13"};
    for (unsigned w = 0; w < 2; w++) {
        char path[SV_BLAS_PATH_MAX], msg[512] = "";
        snprintf(path, sizeof path, "%s/%s", dir, names[w]);
        open_lib(w, path, msg, sizeof msg);
        if (msg[0]) {
            snprintf(err, errlen, "%s: %s", path, msg);
            return -1;
        }
    }
    cublasStatus_t st = p_cublasCreate_v2(&spare);
    if (st != CUBLAS_STATUS_SUCCESS) {
        spare = NULL;
        snprintf(err, errlen, "cublasCreate: status %d", (int)st);
        return -1;
    }
    spare_lib = lib[0];
    return 0;
}

/* Settings were given: the handle made ahead was made without them. */
static bool settings_given;

/* One of the process's settings of cuBLAS (served.h: SV_BLAS_ENV_MAX): only the names cuBLAS reads are taken. */
static void take_setting(const char *kv) {
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv)
        return;
    size_t nl = (size_t)(eq - kv);
    bool ours = strncmp(kv, "CUBLAS", 6) == 0 || (nl == 20 && strncmp(kv, "NVIDIA_TF32_OVERRIDE", 20) == 0);
    if (!ours || nl >= 128)
        return;
    char name[128];
    memcpy(name, kv, nl);
    name[nl] = 0;
    for (size_t i = 0; i < nl; i++)
        if (!((name[i] >= 'A' && name[i] <= 'Z') || (name[i] >= '0' && name[i] <= '9') || name[i] == '_'))
            return;
    setenv(name, eq + 1, 1);
    settings_given = true;
}

/* SV_OP_BLAS_LOAD: NVIDIA's library, from the path the process gave (NUL-terminated in the record), and its
 * version. */
static CUresult load(const uint8_t *pl, uint32_t plen, uint8_t *out, uint32_t *olen) {
    struct sv_blas_load q;
    memcpy(&q, pl, sizeof q);
    struct sv_blas_loaded a;
    memset(&a, 0, sizeof a);
    char buf[SV_BLAS_PATH_MAX + SV_BLAS_ENV_MAX];
    char msg[512] = "";
    uint32_t n = plen - (uint32_t)sizeof q;
    if (n == 0 || n > sizeof buf || q.which > 1) {
        snprintf(msg, sizeof msg, "no library path in the record");
    } else {
        memcpy(buf, pl + sizeof q, n);
        /* checked on the copy: the shared memory may change under the worker. The record's length is padded:
         * the strings end at their terminators, an empty one or the record's end, not at its last byte. */
        size_t plen0 = strnlen(buf, n);
        if (plen0 == n || plen0 >= SV_BLAS_PATH_MAX)
            snprintf(msg, sizeof msg, "the library path is not terminated");
    }
    if (!msg[0]) {
        for (size_t off = strlen(buf) + 1, l; off < n && buf[off]; off += l + 1) {
            l = strnlen(buf + off, n - off);
            if (l == n - off)
                break; /* a setting cut off by the record's end: none */
            take_setting(buf + off);
        }
        open_lib(q.which, buf, msg, sizeof msg);
    }
    if (!msg[0] && q.which == 0) {
        p_cublasGetProperty(MAJOR_VERSION, &a.major);
        p_cublasGetProperty(MINOR_VERSION, &a.minor);
        p_cublasGetProperty(PATCH_LEVEL, &a.patch);
        a.version = (uint64_t)a.major * 10000 + (uint64_t)a.minor * 100 + (uint64_t)a.patch;
        a.cudart_version = p_cublasGetCudartVersion();
    } else if (!msg[0]) {
        p_cublasLtGetProperty(MAJOR_VERSION, &a.major);
        p_cublasLtGetProperty(MINOR_VERSION, &a.minor);
        p_cublasLtGetProperty(PATCH_LEVEL, &a.patch);
        a.version = p_cublasLtGetVersion();
        a.cudart_version = p_cublasLtGetCudartVersion();
    }
    a.status = msg[0] ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_SUCCESS;
    memcpy(out, &a, sizeof a);
    *olen = sizeof a;
    if (msg[0]) {
        size_t ml = strlen(msg) + 1;
        memcpy(out + sizeof a, msg, ml);
        *olen += (uint32_t)ml;
    }
    return CUDA_SUCCESS;
}

/* A scalar argument of a record: the device address its bytes hold (dev), or the bytes themselves (the record is
 * the worker's copy, which outlives the call). */
static const void *scalar_arg(uint32_t dev, const uint8_t bytes[16]) {
    uint64_t p;
    memcpy(&p, bytes, sizeof p);
    return dev ? (const void *)(uintptr_t)p : (const void *)bytes;
}

/* The handle of a call, with the call's stream and pointer mode set on it where they changed. */
static cublasStatus_t handle_for(const wblas_env *e, uint32_t id, uint32_t stream, bool dev, struct wbh **out) {
    struct wbh *b = obj(e, SV_K_BLAS, id);
    if (!b)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    uint32_t sid = stream == SV_STREAM_NULL ? UINT32_MAX : stream;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (sid != b->stream_id) {
        CUstream s;
        if (e->stream(e->arg, stream, &s) != CUDA_SUCCESS)
            return CUBLAS_STATUS_INVALID_VALUE;
        if ((st = p_cublasSetStream_v2(b->h, s)) != CUBLAS_STATUS_SUCCESS)
            return st;
        b->stream = s;
        b->stream_id = sid;
        /* cuBLAS gave its default pool back: the process's cublasSetStream came before its workspace, if any */
        if (b->ws_set &&
            (st = p_cublasSetWorkspace_v2(b->h, (void *)(uintptr_t)b->ws, (size_t)b->ws_size)) != CUBLAS_STATUS_SUCCESS)
            return st;
    }
    int mode = dev ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST;
    if (mode != b->ptr_mode) {
        if ((st = p_cublasSetPointerMode_v2(b->h, (cublasPointerMode_t)mode)) != CUBLAS_STATUS_SUCCESS)
            return st;
        b->ptr_mode = mode;
    }
    *out = b;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t gemv(const wblas_env *e, const struct sv_gemv_rec *q) {
    struct wbh *b;
    cublasStatus_t st = handle_for(e, q->handle, q->stream, q->dev_scalars, &b);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    const void *alpha = scalar_arg(q->dev_scalars, q->alpha), *beta = scalar_arg(q->dev_scalars, q->beta);
    cublasOperation_t t = (cublasOperation_t)q->trans;
    if (q->fn == SV_GEMM_S)
        return p_cublasSgemv_v2(b->h, t, q->m, q->n, alpha, (const float *)(uintptr_t)q->a, q->lda,
                                (const float *)(uintptr_t)q->x, q->incx, beta, (float *)(uintptr_t)q->y, q->incy);
    if (q->fn == SV_GEMM_D)
        return p_cublasDgemv_v2(b->h, t, q->m, q->n, alpha, (const double *)(uintptr_t)q->a, q->lda,
                                (const double *)(uintptr_t)q->x, q->incx, beta, (double *)(uintptr_t)q->y, q->incy);
    return CUBLAS_STATUS_INVALID_VALUE;
}

/* A dot product into device memory (asynchronous), or into out (the call waits for it, as cuBLAS's does). */
static cublasStatus_t dot(const wblas_env *e, const struct sv_dot_rec *q, uint8_t *result) {
    struct wbh *b;
    cublasStatus_t st = handle_for(e, q->handle, q->stream, q->dev_result, &b);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    void *r = q->dev_result ? (void *)(uintptr_t)q->result : (void *)result;
    if (q->fn == SV_GEMM_S)
        return p_cublasSdot_v2(b->h, q->n, (const float *)(uintptr_t)q->x, q->incx, (const float *)(uintptr_t)q->y,
                               q->incy, r);
    if (q->fn == SV_GEMM_D)
        return p_cublasDdot_v2(b->h, q->n, (const double *)(uintptr_t)q->x, q->incx, (const double *)(uintptr_t)q->y,
                               q->incy, r);
    return CUBLAS_STATUS_INVALID_VALUE;
}

/*
 * SV_OP_BLAS_CALL (served.h): the function's arguments taken back from the record. A scalar it reads is device
 * address p[k] (pointer mode device) or the j-th value of s; one it writes is p[k] or the j-th of out, which the
 * reply carries (rotg's and rotmg's in-out scalars start as their values in s).
 */
static cublasStatus_t call(const wblas_env *e, const struct sv_blas_call *q, uint8_t out[SV_BLAS_CALL_OUT]) {
    struct wbh *b;
    cublasStatus_t st = handle_for(e, q->handle, q->stream, q->dev_scalars, &b);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    union {
        float f[SV_BLAS_CALL_SCALARS / sizeof(float)];
        double d[SV_BLAS_CALL_SCALARS / sizeof(double)];
    } sv;
    union {
        float f[SV_BLAS_CALL_OUT / sizeof(float)];
        double d[SV_BLAS_CALL_OUT / sizeof(double)];
        int i;
    } rv;
    memcpy(&sv, q->s, sizeof sv);
    memset(&rv, 0, sizeof rv);
    const bool dev = q->dev_scalars != 0;
    const int32_t *i = q->i;
    cublasHandle_t h = b->h;
#define DP(k) ((void *)(uintptr_t)q->p[k])
#define IN(T, k, j) (dev ? (T *)DP(k) : (T *)(void *)&sv + (j))
#define OUT(T, k, j) (dev ? (T *)DP(k) : (T *)(void *)&rv + (j))
#define RUN(f, ...) (p_##f ? p_##f(__VA_ARGS__) : CUBLAS_STATUS_NOT_SUPPORTED)
#define CASES(X, x, T)                                                                                                 \
    case SV_BF_##X##AXPY: st = RUN(cublas##X##axpy_v2, h, i[0], IN(T, 0, 0), DP(1), i[1], DP(2), i[2]); break;         \
    case SV_BF_##X##COPY: st = RUN(cublas##X##copy_v2, h, i[0], DP(0), i[1], DP(1), i[2]); break;                      \
    case SV_BF_##X##SCAL: st = RUN(cublas##X##scal_v2, h, i[0], IN(T, 0, 0), DP(1), i[1]); break;                      \
    case SV_BF_##X##SWAP: st = RUN(cublas##X##swap_v2, h, i[0], DP(0), i[1], DP(1), i[2]); break;                      \
    case SV_BF_##X##ROT:                                                                                               \
        st = RUN(cublas##X##rot_v2, h, i[0], DP(0), i[1], DP(1), i[2], IN(T, 2, 0), IN(T, 3, 1));                      \
        break;                                                                                                         \
    case SV_BF_##X##ROTM: st = RUN(cublas##X##rotm_v2, h, i[0], DP(0), i[1], DP(1), i[2], IN(T, 2, 0)); break;         \
    case SV_BF_##X##NRM2: st = RUN(cublas##X##nrm2_v2, h, i[0], DP(0), i[1], OUT(T, 1, 0)); break;                     \
    case SV_BF_##X##ASUM: st = RUN(cublas##X##asum_v2, h, i[0], DP(0), i[1], OUT(T, 1, 0)); break;                     \
    case SV_BF_I##X##AMAX: st = RUN(cublasI##x##amax_v2, h, i[0], DP(0), i[1], OUT(int, 1, 0)); break;                 \
    case SV_BF_I##X##AMIN: st = RUN(cublasI##x##amin_v2, h, i[0], DP(0), i[1], OUT(int, 1, 0)); break;                 \
    case SV_BF_##X##ROTG:                                                                                              \
        if (!dev)                                                                                                      \
            memcpy(&rv, &sv, 2 * sizeof(T)); /* a, b */                                                                \
        st = RUN(cublas##X##rotg_v2, h, OUT(T, 0, 0), OUT(T, 1, 1), OUT(T, 2, 2), OUT(T, 3, 3));                       \
        break;                                                                                                         \
    case SV_BF_##X##ROTMG:                                                                                             \
        if (!dev)                                                                                                      \
            memcpy(&rv, &sv, 3 * sizeof(T)); /* d1, d2, x1 */                                                          \
        st = RUN(cublas##X##rotmg_v2, h, OUT(T, 0, 0), OUT(T, 1, 1), OUT(T, 2, 2), IN(T, 3, 3), OUT(T, 4, 3));         \
        break;                                                                                                         \
    case SV_BF_##X##TRMV: st = RUN(cublas##X##trmv_v2, h, i[0], i[1], i[2], i[3], DP(0), i[4], DP(1), i[5]); break;    \
    case SV_BF_##X##TRSV: st = RUN(cublas##X##trsv_v2, h, i[0], i[1], i[2], i[3], DP(0), i[4], DP(1), i[5]); break;    \
    case SV_BF_##X##GER:                                                                                               \
        st = RUN(cublas##X##ger_v2, h, i[0], i[1], IN(T, 0, 0), DP(1), i[2], DP(2), i[3], DP(3), i[4]);                \
        break;                                                                                                         \
    case SV_BF_##X##SYR: st = RUN(cublas##X##syr_v2, h, i[0], i[1], IN(T, 0, 0), DP(1), i[2], DP(2), i[3]); break;     \
    case SV_BF_##X##SYR2:                                                                                              \
        st = RUN(cublas##X##syr2_v2, h, i[0], i[1], IN(T, 0, 0), DP(1), i[2], DP(2), i[3], DP(3), i[4]);               \
        break;                                                                                                         \
    case SV_BF_##X##SYMV:                                                                                              \
        st = RUN(cublas##X##symv_v2, h, i[0], i[1], IN(T, 0, 0), DP(1), i[2], DP(2), i[3], IN(T, 3, 1), DP(4), i[4]);  \
        break;                                                                                                         \
    case SV_BF_##X##SYMM:                                                                                              \
        st = RUN(cublas##X##symm_v2, h, i[0], i[1], i[2], i[3], IN(T, 0, 0), DP(1), i[4], DP(2), i[5], IN(T, 3, 1),    \
                 DP(4), i[6]);                                                                                         \
        break;                                                                                                         \
    case SV_BF_##X##SYRK:                                                                                              \
        st = RUN(cublas##X##syrk_v2, h, i[0], i[1], i[2], i[3], IN(T, 0, 0), DP(1), i[4], IN(T, 2, 1), DP(3), i[5]);   \
        break;                                                                                                         \
    case SV_BF_##X##SYR2K:                                                                                             \
        st = RUN(cublas##X##syr2k_v2, h, i[0], i[1], i[2], i[3], IN(T, 0, 0), DP(1), i[4], DP(2), i[5], IN(T, 3, 1),   \
                 DP(4), i[6]);                                                                                         \
        break;                                                                                                         \
    case SV_BF_##X##TRMM:                                                                                              \
        st = RUN(cublas##X##trmm_v2, h, i[0], i[1], i[2], i[3], i[4], i[5], IN(T, 0, 0), DP(1), i[6], DP(2), i[7],     \
                 DP(3), i[8]);                                                                                         \
        break;
    switch (q->fn) {
        CASES(S, s, float)
        CASES(D, d, double)
    default: st = CUBLAS_STATUS_INVALID_VALUE; break;
    }
#undef CASES
#undef RUN
#undef OUT
#undef IN
#undef DP
    memcpy(out, &rv, sizeof rv);
    return st;
}

static cublasStatus_t gemm(const wblas_env *e, const struct sv_gemm_rec *q) {
    struct wbh *b;
    cublasStatus_t st = handle_for(e, q->handle, q->stream, q->dev_scalars, &b);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    const void *alpha = scalar_arg(q->dev_scalars, q->alpha), *beta = scalar_arg(q->dev_scalars, q->beta);
    cublasOperation_t ta = (cublasOperation_t)q->transa, tb = (cublasOperation_t)q->transb;
    const void *A = (const void *)(uintptr_t)q->a, *B = (const void *)(uintptr_t)q->b;
    void *C = (void *)(uintptr_t)q->c;
    switch (q->fn) {
    case SV_GEMM_S:
        return p_cublasSgemm_v2(b->h, ta, tb, q->m, q->n, q->k, alpha, A, q->lda, B, q->ldb, beta, C, q->ldc);
    case SV_GEMM_D:
        return p_cublasDgemm_v2(b->h, ta, tb, q->m, q->n, q->k, alpha, A, q->lda, B, q->ldb, beta, C, q->ldc);
    case SV_GEMM_EX:
        return p_cublasGemmEx(b->h, ta, tb, q->m, q->n, q->k, alpha, A, (cudaDataType)q->atype, q->lda, B,
                              (cudaDataType)q->btype, q->ldb, beta, C, (cudaDataType)q->ctype, q->ldc,
                              (cublasComputeType_t)q->compute, (cublasGemmAlgo_t)q->algo);
    case SV_GEMM_S_STRIDED:
        return p_cublasSgemmStridedBatched(b->h, ta, tb, q->m, q->n, q->k, alpha, A, q->lda, q->stride_a, B, q->ldb,
                                           q->stride_b, beta, C, q->ldc, q->stride_c, q->batch);
    case SV_GEMM_D_STRIDED:
        return p_cublasDgemmStridedBatched(b->h, ta, tb, q->m, q->n, q->k, alpha, A, q->lda, q->stride_a, B, q->ldb,
                                           q->stride_b, beta, C, q->ldc, q->stride_c, q->batch);
    case SV_GEMM_EX_STRIDED:
        return p_cublasGemmStridedBatchedEx(b->h, ta, tb, q->m, q->n, q->k, alpha, A, (cudaDataType)q->atype, q->lda,
                                            q->stride_a, B, (cudaDataType)q->btype, q->ldb, q->stride_b, beta, C,
                                            (cudaDataType)q->ctype, q->ldc, q->stride_c, q->batch,
                                            (cublasComputeType_t)q->compute, (cublasGemmAlgo_t)q->algo);
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
}

static bool lt_kind(uint32_t k) { return k == SV_K_LT_DESC || k == SV_K_LT_LAYOUT || k == SV_K_LT_PREF; }

/* A cuBLASLt handle as a record names it (served.h: SV_LT_FROM_BLAS). */
static void *lt_handle(const wblas_env *e, uint32_t v) {
    if (v & SV_LT_FROM_BLAS) {
        struct wbh *b = obj(e, SV_K_BLAS, v & ~SV_LT_FROM_BLAS);
        return b ? (void *)b->h : NULL;
    }
    return obj(e, SV_K_LT, v);
}

static cublasStatus_t lt_set(const wblas_env *e, const struct sv_lt_attr *q) {
    void *o = lt_kind(q->kind) ? obj(e, q->kind, q->id) : NULL;
    if (!o || q->size > SV_LT_ATTR_MAX)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (q->kind) {
    case SV_K_LT_DESC:
        return p_cublasLtMatmulDescSetAttribute(o, (cublasLtMatmulDescAttributes_t)q->attr, q->value, q->size);
    case SV_K_LT_LAYOUT:
        return p_cublasLtMatrixLayoutSetAttribute(o, (cublasLtMatrixLayoutAttribute_t)q->attr, q->value, q->size);
    default:
        return p_cublasLtMatmulPreferenceSetAttribute(o, (cublasLtMatmulPreferenceAttributes_t)q->attr, q->value,
                                                      q->size);
    }
}

static cublasStatus_t lt_create(const wblas_env *e, const struct sv_lt_obj *q) {
    if (!lt_kind(q->kind) || !slot_free(e, q->kind, q->id))
        return CUBLAS_STATUS_INVALID_VALUE;
    void *o = NULL;
    cublasStatus_t st;
    switch (q->kind) {
    case SV_K_LT_DESC:
        st = p_cublasLtMatmulDescCreate((cublasLtMatmulDesc_t *)&o, (cublasComputeType_t)q->a, (cudaDataType)q->b);
        break;
    case SV_K_LT_LAYOUT:
        st = p_cublasLtMatrixLayoutCreate((cublasLtMatrixLayout_t *)&o, (cudaDataType)q->a, (uint64_t)q->b,
                                          (uint64_t)q->c, q->d);
        break;
    default: st = p_cublasLtMatmulPreferenceCreate((cublasLtMatmulPreference_t *)&o); break;
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        e->tab[q->kind][q->id] = o;
        made[1] = true;
    }
    return st;
}

static cublasStatus_t lt_destroy(const wblas_env *e, const struct sv_lt_obj *q) {
    void *o = lt_kind(q->kind) ? obj(e, q->kind, q->id) : NULL;
    if (!o)
        return CUBLAS_STATUS_INVALID_VALUE;
    e->tab[q->kind][q->id] = NULL;
    switch (q->kind) {
    case SV_K_LT_DESC: return p_cublasLtMatmulDescDestroy(o);
    case SV_K_LT_LAYOUT: return p_cublasLtMatrixLayoutDestroy(o);
    default: return p_cublasLtMatmulPreferenceDestroy(o);
    }
}

static CUresult lt_get(const wblas_env *e, const struct sv_lt_attr *q, uint8_t *out, uint32_t *olen) {
    struct sv_lt_got g;
    memset(&g, 0, sizeof g);
    void *o = lt_kind(q->kind) ? obj(e, q->kind, q->id) : NULL;
    size_t written = 0;
    cublasStatus_t st;
    if (!o || q->size > SV_LT_ATTR_MAX)
        st = CUBLAS_STATUS_INVALID_VALUE;
    else if (q->kind == SV_K_LT_DESC)
        st = p_cublasLtMatmulDescGetAttribute(o, (cublasLtMatmulDescAttributes_t)q->attr, g.value, q->size, &written);
    else if (q->kind == SV_K_LT_LAYOUT)
        st =
            p_cublasLtMatrixLayoutGetAttribute(o, (cublasLtMatrixLayoutAttribute_t)q->attr, g.value, q->size, &written);
    else
        st = p_cublasLtMatmulPreferenceGetAttribute(o, (cublasLtMatmulPreferenceAttributes_t)q->attr, g.value, q->size,
                                                    &written);
    g.status = (int32_t)st;
    g.written = written;
    memcpy(out, &g, sizeof g);
    *olen = sizeof g;
    return CUDA_SUCCESS;
}

static CUresult lt_heuristic(const wblas_env *e, const struct sv_lt_heur_rec *q, uint8_t *out, uint32_t *olen) {
    struct sv_lt_heur h = {0, 0};
    void *lt = lt_handle(e, q->lt), *d = obj(e, SV_K_LT_DESC, q->desc), *pref = obj(e, SV_K_LT_PREF, q->pref);
    void *la = obj(e, SV_K_LT_LAYOUT, q->adesc), *lb = obj(e, SV_K_LT_LAYOUT, q->bdesc);
    void *lc = obj(e, SV_K_LT_LAYOUT, q->cdesc), *ld = obj(e, SV_K_LT_LAYOUT, q->ddesc);
    cublasLtMatmulHeuristicResult_t res[SV_LT_HEUR_MAX];
    memset(res, 0, sizeof res);
    int n = 0;
    if (!lt)
        h.status = CUBLAS_STATUS_NOT_INITIALIZED;
    else if (!d || !pref || !la || !lb || !lc || !ld || q->requested <= 0)
        h.status = CUBLAS_STATUS_INVALID_VALUE;
    else
        h.status = (int32_t)p_cublasLtMatmulAlgoGetHeuristic(
            lt, d, la, lb, lc, ld, pref, q->requested < (int)SV_LT_HEUR_MAX ? q->requested : (int)SV_LT_HEUR_MAX, res,
            &n);
    if (n < 0 || n > (int)SV_LT_HEUR_MAX)
        n = 0;
    h.count = h.status == CUBLAS_STATUS_SUCCESS ? n : 0;
    memcpy(out, &h, sizeof h);
    memcpy(out + sizeof h, res, (size_t)h.count * sizeof res[0]);
    *olen = (uint32_t)(sizeof h + (size_t)h.count * sizeof res[0]);
    return CUDA_SUCCESS;
}

static cublasStatus_t lt_matmul(const wblas_env *e, const struct sv_lt_matmul *q) {
    void *lt = lt_handle(e, q->lt), *d = obj(e, SV_K_LT_DESC, q->desc);
    void *la = obj(e, SV_K_LT_LAYOUT, q->adesc), *lb = obj(e, SV_K_LT_LAYOUT, q->bdesc);
    void *lc = obj(e, SV_K_LT_LAYOUT, q->cdesc), *ld = obj(e, SV_K_LT_LAYOUT, q->ddesc);
    if (!lt)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!d || !la || !lb || !lc || !ld)
        return CUBLAS_STATUS_INVALID_VALUE;
    CUstream st;
    if (e->stream(e->arg, q->stream, &st) != CUDA_SUCCESS)
        return CUBLAS_STATUS_INVALID_VALUE;
    const void *alpha = scalar_arg(q->alpha_dev, q->alpha), *beta = scalar_arg(q->beta_dev, q->beta);
    cublasLtMatmulAlgo_t algo;
    memcpy(algo.data, q->algo, sizeof algo.data);
    return p_cublasLtMatmul(lt, d, alpha, (const void *)(uintptr_t)q->a, la, (const void *)(uintptr_t)q->b, lb, beta,
                            (const void *)(uintptr_t)q->c, lc, (void *)(uintptr_t)q->d, ld, q->has_algo ? &algo : NULL,
                            (void *)(uintptr_t)q->workspace, (size_t)q->workspace_size, st);
}

/* Whether a SV_OP_BLAS_CALL record of plen bytes at pl waits for its answer. */
static bool call_sync(const uint8_t *pl, uint32_t plen) {
    struct sv_blas_call q;
    if (plen < sizeof q)
        return false;
    memcpy(&q, pl, sizeof q);
    return sv_blas_call_sync(q.fn, q.dev_scalars);
}

#define NEED(type)                                                                                                     \
    if (plen < sizeof(type)) {                                                                                         \
        *bad = -1;                                                                                                     \
        return CUDA_ERROR_INVALID_VALUE;                                                                               \
    }

CUresult wblas_run(const wblas_env *e, unsigned op, const uint8_t *pl, uint32_t plen, uint8_t *out, uint32_t *olen,
                   int *bad) {
    *bad = 0;
    *olen = 0;
    if (op == SV_OP_BLAS_LOAD) {
        NEED(struct sv_blas_load);
        return load(pl, plen, out, olen);
    }
    bool lt_op = op >= SV_OP_LT_CREATE && op <= SV_OP_LT_MATMUL;
    if (lt_op ? !have_lt : !have_blas) {
        /* Before its load: a synchronous call answers, an asynchronous one fails at the next synchronization. */
        if (op == SV_OP_BLAS_CREATE || op == SV_OP_LT_CREATE || op == SV_OP_LT_OBJ_GET || op == SV_OP_LT_HEURISTIC ||
            op == SV_OP_BLAS_DOT || (op == SV_OP_BLAS_CALL && call_sync(pl, plen)))
            return answer(out, olen, CUBLAS_STATUS_NOT_INITIALIZED);
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    switch (op) {
    case SV_OP_BLAS_CREATE: {
        NEED(struct sv_id_rec);
        struct sv_id_rec q;
        memcpy(&q, pl, sizeof q);
        if (!slot_free(e, SV_K_BLAS, q.id))
            return answer(out, olen, CUBLAS_STATUS_INVALID_VALUE);
        struct wbh *b = calloc(1, sizeof *b);
        if (!b)
            return answer(out, olen, CUBLAS_STATUS_ALLOC_FAILED);
        cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
        if (spare && spare_lib == lib[0] && !settings_given) /* made ahead as the process would, never used */
            b->h = spare;
        else
            st = p_cublasCreate_v2(&b->h);
        spare = NULL;
        if (st != CUBLAS_STATUS_SUCCESS) {
            free(b);
            return answer(out, olen, st);
        }
        b->ptr_mode = CUBLAS_POINTER_MODE_HOST;
        e->tab[SV_K_BLAS][q.id] = b;
        made[0] = true;
        return answer(out, olen, st);
    }
    case SV_OP_BLAS_DESTROY: {
        NEED(struct sv_id_rec);
        struct sv_id_rec q;
        memcpy(&q, pl, sizeof q);
        struct wbh *b = obj(e, SV_K_BLAS, q.id);
        if (!b)
            return CUDA_ERROR_INVALID_HANDLE;
        e->tab[SV_K_BLAS][q.id] = NULL;
        cublasStatus_t st = p_cublasDestroy_v2(b->h);
        free(b);
        return as_cu(st);
    }
    case SV_OP_BLAS_SET: {
        NEED(struct sv_blas_set);
        struct sv_blas_set q;
        memcpy(&q, pl, sizeof q);
        struct wbh *b = obj(e, SV_K_BLAS, q.handle);
        if (!b)
            return CUDA_ERROR_INVALID_HANDLE;
        switch (q.what) {
        case SV_BS_WORKSPACE: {
            cublasStatus_t st = p_cublasSetWorkspace_v2(b->h, (void *)(uintptr_t)q.a, (size_t)q.b);
            if (st == CUBLAS_STATUS_SUCCESS)
                b->ws_set = true, b->ws = q.a, b->ws_size = q.b;
            return as_cu(st);
        }
        case SV_BS_WORKSPACE_DEFAULT: {
            /* only cublasSetStream gives the default pool back: the NULL stream, the next call's set again */
            cublasStatus_t st = p_cublasSetStream_v2(b->h, NULL);
            b->stream = NULL;
            b->stream_id = 0;
            if (st == CUBLAS_STATUS_SUCCESS)
                b->ws_set = false;
            return as_cu(st);
        }
        case SV_BS_MATH: return as_cu(p_cublasSetMathMode(b->h, (cublasMath_t)q.a));
        case SV_BS_POINTER: {
            cublasStatus_t st = p_cublasSetPointerMode_v2(b->h, (cublasPointerMode_t)q.a);
            if (st == CUBLAS_STATUS_SUCCESS)
                b->ptr_mode = (int)q.a;
            return as_cu(st);
        }
        case SV_BS_ATOMICS: return as_cu(p_cublasSetAtomicsMode(b->h, (cublasAtomicsMode_t)q.a));
        default: return CUDA_ERROR_INVALID_VALUE;
        }
    }
    case SV_OP_BLAS_GEMM: {
        NEED(struct sv_gemm_rec);
        struct sv_gemm_rec q;
        memcpy(&q, pl, sizeof q);
        return as_cu(gemm(e, &q));
    }
    case SV_OP_BLAS_GEMV: {
        NEED(struct sv_gemv_rec);
        struct sv_gemv_rec q;
        memcpy(&q, pl, sizeof q);
        return as_cu(gemv(e, &q));
    }
    case SV_OP_BLAS_DOT: {
        NEED(struct sv_dot_rec);
        struct sv_dot_rec q;
        memcpy(&q, pl, sizeof q);
        uint8_t r[8] = {0};
        cublasStatus_t st = dot(e, &q, r);
        if (q.dev_result)
            return as_cu(st);
        answer(out, olen, st);
        memcpy(out + *olen, r, sizeof r);
        *olen += sizeof r;
        return CUDA_SUCCESS;
    }
    case SV_OP_BLAS_CALL: {
        NEED(struct sv_blas_call);
        struct sv_blas_call q;
        memcpy(&q, pl, sizeof q);
        uint8_t r[SV_BLAS_CALL_OUT];
        cublasStatus_t st = call(e, &q, r);
        if (!sv_blas_call_sync(q.fn, q.dev_scalars))
            return as_cu(st);
        answer(out, olen, st);
        memset(out + *olen, 0, 4);
        memcpy(out + *olen + 4, r, sizeof r);
        *olen += 4 + (uint32_t)sizeof r;
        return CUDA_SUCCESS;
    }
    case SV_OP_LT_CREATE: {
        NEED(struct sv_id_rec);
        struct sv_id_rec q;
        memcpy(&q, pl, sizeof q);
        if (!slot_free(e, SV_K_LT, q.id))
            return answer(out, olen, CUBLAS_STATUS_INVALID_VALUE);
        cublasLtHandle_t h = NULL;
        cublasStatus_t st = p_cublasLtCreate(&h);
        if (st == CUBLAS_STATUS_SUCCESS) {
            e->tab[SV_K_LT][q.id] = h;
            made[1] = true;
        }
        return answer(out, olen, st);
    }
    case SV_OP_LT_DESTROY: {
        NEED(struct sv_id_rec);
        struct sv_id_rec q;
        memcpy(&q, pl, sizeof q);
        void *h = obj(e, SV_K_LT, q.id);
        if (!h)
            return CUDA_ERROR_INVALID_HANDLE;
        e->tab[SV_K_LT][q.id] = NULL;
        return as_cu(p_cublasLtDestroy(h));
    }
    case SV_OP_LT_OBJ_CREATE: {
        NEED(struct sv_lt_obj);
        struct sv_lt_obj q;
        memcpy(&q, pl, sizeof q);
        return as_cu(lt_create(e, &q));
    }
    case SV_OP_LT_OBJ_DESTROY: {
        NEED(struct sv_lt_obj);
        struct sv_lt_obj q;
        memcpy(&q, pl, sizeof q);
        return as_cu(lt_destroy(e, &q));
    }
    case SV_OP_LT_OBJ_SET: {
        NEED(struct sv_lt_attr);
        struct sv_lt_attr q;
        memcpy(&q, pl, sizeof q);
        return as_cu(lt_set(e, &q));
    }
    case SV_OP_LT_OBJ_GET: {
        NEED(struct sv_lt_attr);
        struct sv_lt_attr q;
        memcpy(&q, pl, sizeof q);
        return lt_get(e, &q, out, olen);
    }
    case SV_OP_LT_HEURISTIC: {
        NEED(struct sv_lt_heur_rec);
        struct sv_lt_heur_rec q;
        memcpy(&q, pl, sizeof q);
        return lt_heuristic(e, &q, out, olen);
    }
    case SV_OP_LT_MATMUL: {
        NEED(struct sv_lt_matmul);
        struct sv_lt_matmul q;
        memcpy(&q, pl, sizeof q);
        return as_cu(lt_matmul(e, &q));
    }
    default: *bad = -1; return CUDA_ERROR_INVALID_VALUE;
    }
}

void wblas_free(const wblas_env *e) {
    for (uint32_t i = 0; i < sv_cap(SV_K_BLAS); i++)
        free(e->tab[SV_K_BLAS][i]);
}

_Static_assert(sizeof(struct sv_reply) - 64 >= sizeof(struct sv_lt_heur) + SV_LT_HEUR_MAX * 96,
               "a heuristic's results fit a reply");
_Static_assert(sizeof(struct sv_lt_got) <= SV_REPLY_DATA, "an attribute's value fits a reply");

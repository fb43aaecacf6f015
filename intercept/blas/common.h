/*
 * Served mode's cuBLAS and cuBLASLt (libcublas.so.13 and libcublasLt.so.13
 * of build/lib/served): the application's copies hold no library state and
 * forward each call to its worker, which runs NVIDIA's libraries
 * (helper/served/blas.c). NVIDIA's carry their own static CUDA runtime, which
 * reaches the driver through its private export tables, so they cannot run
 * over served mode's driver: forwarding happens at their own boundary
 * (docs/served-mode.md). The calls go through served mode's library
 * (intercept/served/ext.h), whose ring and virtual handles they share.
 *
 *   common.c  what both use: served mode's library, NVIDIA's library found
 *             as the dynamic linker would have found it, the interposer's
 *             gate, the sizes of scalars
 *   blas.c    cuBLAS (libcublas.so.13)
 *   lt.c      cuBLASLt (libcublasLt.so.13)
 */
#ifndef GPUCR_BLAS_COMMON_H
#define GPUCR_BLAS_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../served/ext.h"
#include "gpucr/cublas.h"
#include "served.h"

#define BL_API __attribute__((visibility("default")))
#define BL_HIDDEN __attribute__((visibility("hidden")))

enum { BL_CUBLAS = 0, BL_CUBLASLT = 1 };

/* Served mode's library, or NULL (said once: this library then answers CUBLAS_STATUS_NOT_INITIALIZED). */
BL_HIDDEN const struct sv_ext *bl_ext(void);

/* What NVIDIA's library (which) answered at its load in the worker. */
typedef struct {
    uint64_t version;        /* cublasLtGetVersion; cuBLAS: major * 10000 + minor * 100 + patch */
    uint64_t cudart_version; /* the CUDA runtime it was built with */
    int32_t major, minor, patch;
} bl_info;

/*
 * Served mode's library initialized and NVIDIA's library (which) loaded in the current worker: at the first
 * call, and again in each new worker (bl_reload, from the replay). CUBLAS_STATUS_SUCCESS, or NOT_INITIALIZED
 * after a line that says why.
 */
BL_HIDDEN cublasStatus_t bl_ready(unsigned which, const struct sv_ext **x);
BL_HIDDEN const bl_info *bl_info_of(unsigned which);
/* cublasGetProperty / cublasLtGetProperty: the library's version, as the worker's copy answered. */
BL_HIDDEN cublasStatus_t bl_property(unsigned which, libraryPropertyType type, int *value);
/* In a replay: the library loaded in the new worker if the process had it loaded; false: it had not. */
BL_HIDDEN cublasStatus_t bl_reload(unsigned which, bool *had);

/* The interposer's gate (intercept/src: gpucrGateEnter), around calls that queue GPU work; none without it. */
BL_HIDDEN void bl_gate_enter(void);
BL_HIDDEN void bl_gate_leave(void);

/* Bytes of a scalar of type t (0: not one cuBLAS takes). */
BL_HIDDEN size_t bl_type_size(cudaDataType t);
/* Bytes of gemm's alpha and beta for a compute type with C of type ctype. */
BL_HIDDEN size_t bl_compute_scalar(cublasComputeType_t c, cudaDataType ctype);

BL_HIDDEN const char *bl_status_name(cublasStatus_t st);
BL_HIDDEN const char *bl_status_string(cublasStatus_t st);

/* A synchronous record's cublasStatus_t (served.h: the reply's first int32), the transport's failure as one. */
BL_HIDDEN cublasStatus_t bl_sync(const struct sv_ext *x, unsigned op, const void *pl, uint32_t plen, void *out,
                                 uint32_t cap, uint32_t *outlen);
/* An asynchronous record's transport failure as a cublasStatus_t (the call's own failure comes later). */
BL_HIDDEN cublasStatus_t bl_async(const struct sv_ext *x, unsigned op, const void *pl, uint32_t plen, uint32_t stream);
/*
 * An asynchronous record sent as a synchronous one, for arguments whose answer only NVIDIA's library knows (ones
 * its documentation calls invalid but nobody measured it refuse): the worker runs it as ever and its status comes
 * back at the call (the reply's CUresult, served.h), not at the next synchronizing one; noted for the capture of
 * stream as bl_async notes it, if it ran.
 */
BL_HIDDEN cublasStatus_t bl_probe(const struct sv_ext *x, unsigned op, const void *pl, uint32_t plen, uint32_t stream);

/*
 * A thread with no current context gets served mode's (device 0's primary context, retained once), as NVIDIA's
 * cuBLAS gives it the handle's at cublasCreate and at each product (measured: cublasLtCreate does not).
 */
BL_HIDDEN void bl_ctx_current(void);

/* A refused entry point: the one line that says so, and CUBLAS_STATUS_NOT_SUPPORTED. */
BL_HIDDEN cublasStatus_t bl_refuse(_Atomic int *once, const char *lib, const char *fn);
#define BL_REFUSED(lib, name)                                                                                          \
    BL_API cublasStatus_t name(void);                                                                                  \
    BL_API cublasStatus_t name(void) {                                                                                 \
        static _Atomic int once_;                                                                                      \
        return bl_refuse(&once_, lib, #name);                                                                          \
    }
/* The same with the function's own prototype (params: its parameter list, as include/gpucr/cublas.h declares it). */
#define BL_REFUSED_AS(lib, name, params)                                                                               \
    BL_API cublasStatus_t name params {                                                                                \
        static _Atomic int once_;                                                                                      \
        return bl_refuse(&once_, lib, #name);                                                                          \
    }

#endif

/*
 * The served-mode worker's cuBLAS and cuBLASLt (blas.c): runs the records of
 * protocol/c/served.h's SV_OP_BLAS_* and SV_OP_LT_* with NVIDIA's libraries,
 * which the served process names (SV_OP_BLAS_LOAD) and the worker loads as
 * that process's user. The objects live in the executor's handle tables, by
 * virtual id, as the driver's do.
 */
#ifndef GPUCR_HELPER_SERVED_BLAS_H
#define GPUCR_HELPER_SERVED_BLAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpucr/cudadrv.h"

/* What blas.c needs of the executor: its tables (tab[kind][id]) and its streams by id. */
typedef struct {
    void ***tab;
    CUresult (*stream)(void *arg, uint32_t id, CUstream *out);
    void *arg;
} wblas_env;

/* Whether op is one of blas.c's. */
bool wblas_op(unsigned op);

/*
 * Runs one record of op (pl: its payload, copied out of the shared memory already or read once per field).
 * Synchronous ones fill out (SV_REPLY_DATA bytes) and *olen; their CUresult is the transport's. An asynchronous
 * one's CUresult is its failure, deferred. -1 in *bad: the record is malformed (too short), which breaks the
 * ring's framing as any other.
 */
CUresult wblas_run(const wblas_env *e, unsigned op, const uint8_t *pl, uint32_t plen, uint8_t *out, uint32_t *olen,
                   int *bad);

/* Loads NVIDIA's cuBLAS and cuBLASLt from dir ahead of any record (the helper's --served-cublas), and makes the
 * process's first cuBLAS handle: a load record that names the same files then costs nothing, nor does the first
 * creation. On the thread whose context is current. 0, or -1 with err filled. */
int wblas_preload(const char *dir, char *err, size_t errlen);

/* At the service's end: the objects' records (the driver frees what they hold at the exit). */
void wblas_free(const wblas_env *e);

#endif

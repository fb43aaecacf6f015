/*
 * blasattack: a served process that sends its worker the cuBLAS records a
 * hostile program could write into its ring, past gpucr's libcublas.so.13
 * (which checks its callers' arguments before anything is sent), through
 * served mode's library's own interface (intercept/served/ext.h). Run under
 * `gpucr run --served` (tests/e2e: TestServedBlasAttack, as a second user).
 *
 *   blasattack LIBRARY SECRET
 *
 * LIBRARY is a cuBLAS the worker may load (the simulated one), SECRET a file
 * the user cannot read. Each probe prints one line "probe NAME: RESULT"; the
 * worker must answer each (refusing what it must) and keep serving: the last
 * probe loads LIBRARY and makes a handle, which must work. Exit 0 when every
 * probe got the answer it should, 1 otherwise.
 */

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ext.h"
#include "gpucr/cublas.h"
#include "served.h"

static const struct sv_ext *x;
static int failed;

/* A synchronous record; the cublasStatus_t its reply starts with, or -1 when the call itself failed. */
static int sync_status(unsigned op, const void *pl, uint32_t plen, uint8_t *out, uint32_t *len) {
    uint32_t l = 0;
    CUresult r = x->sync(op, pl, plen, out, SV_REPLY_DATA, &l);
    if (len)
        *len = l;
    if (r != CUDA_SUCCESS || l < 4)
        return -1;
    int32_t st;
    memcpy(&st, out, sizeof st);
    return st;
}

static void expect(const char *name, int got, int want) {
    printf("probe %s: %d%s\n", name, got, got == want ? "" : " (unexpected)");
    if (got != want)
        failed = 1;
}

static int load(unsigned which, const char *path, size_t n, uint8_t *out, uint32_t *len) {
    uint8_t rec[sizeof(struct sv_blas_load) + SV_BLAS_PATH_MAX + 16];
    struct sv_blas_load q = {which, 0};
    memcpy(rec, &q, sizeof q);
    memcpy(rec + sizeof q, path, n);
    return sync_status(SV_OP_BLAS_LOAD, rec, (uint32_t)(sizeof q + n), out, len);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: blasattack LIBRARY SECRET\n");
        return 2;
    }
    if (cuInit(0) != CUDA_SUCCESS) {
        fprintf(stderr, "blasattack: cuInit failed\n");
        return 3;
    }
    const struct sv_ext *(*fn)(unsigned) = (const struct sv_ext *(*)(unsigned))dlsym(RTLD_DEFAULT, SV_EXT_SYMBOL);
    x = fn ? fn(SV_EXT_VERSION) : NULL;
    if (!x) {
        fprintf(stderr, "blasattack: not under served mode's library\n");
        return 3;
    }
    uint8_t out[SV_REPLY_DATA];
    uint32_t len = 0;

    /* A file the user cannot read: the worker runs as the user, so its load fails as the user's would. */
    int st = load(0, argv[2], strlen(argv[2]) + 1, out, &len);
    expect("load-secret", st, CUBLAS_STATUS_NOT_INITIALIZED);
    if (len > sizeof(struct sv_blas_loaded)) {
        out[len < sizeof out ? len : sizeof out - 1] = 0;
        printf("probe load-secret says: %s\n", (const char *)out + sizeof(struct sv_blas_loaded));
    }
    /* No terminating NUL, a library that is neither, an empty path. */
    char path[64];
    memset(path, 'a', sizeof path);
    expect("load-unterminated", load(0, path, sizeof path, out, NULL), CUBLAS_STATUS_NOT_INITIALIZED);
    expect("load-which", load(7, argv[1], strlen(argv[1]) + 1, out, NULL), CUBLAS_STATUS_NOT_INITIALIZED);
    expect("load-empty", load(0, "", 0, out, NULL), CUBLAS_STATUS_NOT_INITIALIZED);
    /* Before a load: a handle cannot be made. */
    struct sv_id_rec id = {1, 0};
    expect("create-unloaded", sync_status(SV_OP_BLAS_CREATE, &id, sizeof id, out, NULL), CUBLAS_STATUS_NOT_INITIALIZED);

    expect("load", load(0, argv[1], strlen(argv[1]) + 1, out, NULL), CUBLAS_STATUS_SUCCESS);
    /* Ids out of range, or taken. */
    struct sv_id_rec bad[] = {{0, 0}, {SV_CAP_BLAS, 0}, {UINT32_MAX, 0}};
    for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect("create-bad-id", sync_status(SV_OP_BLAS_CREATE, &bad[i], sizeof bad[i], out, NULL),
               CUBLAS_STATUS_INVALID_VALUE);
    expect("create", sync_status(SV_OP_BLAS_CREATE, &id, sizeof id, out, NULL), CUBLAS_STATUS_SUCCESS);
    expect("create-taken", sync_status(SV_OP_BLAS_CREATE, &id, sizeof id, out, NULL), CUBLAS_STATUS_INVALID_VALUE);
    /* Asynchronous records on handles and objects that do not exist: refused, the worker serves on. */
    struct sv_gemm_rec g;
    memset(&g, 0, sizeof g);
    g.handle = SV_CAP_BLAS + 9;
    g.m = g.n = g.k = 4;
    x->async(SV_OP_BLAS_GEMM, &g, sizeof g, SV_EXT_NO_STREAM);
    g.handle = 1;
    g.stream = 0xfffff; /* no such stream */
    x->async(SV_OP_BLAS_GEMM, &g, sizeof g, SV_EXT_NO_STREAM);
    struct sv_lt_obj lo = {SV_K_STREAM, 1, 0, 0, 0, 0}; /* not a cuBLASLt kind */
    x->async(SV_OP_LT_OBJ_CREATE, &lo, sizeof lo, SV_EXT_NO_STREAM);
    struct sv_lt_attr la;
    memset(&la, 0, sizeof la);
    la.kind = SV_K_LT_DESC;
    la.id = 1;
    la.size = 100000; /* past the value the record holds */
    x->async(SV_OP_LT_OBJ_SET, &la, sizeof la, SV_EXT_NO_STREAM);
    /* cuBLASLt not loaded: its synchronous calls answer so. */
    struct sv_lt_heur_rec h = {SV_LT_FROM_BLAS | 1, 1, 1, 1, 1, 1, 1, 1000000};
    uint8_t hout[SV_REPLY_DATA];
    expect("heuristic-unloaded", sync_status(SV_OP_LT_HEURISTIC, &h, sizeof h, hout, NULL),
           CUBLAS_STATUS_NOT_INITIALIZED);
    /* A gemv on a handle that does not exist; a dot into host memory (synchronous) on one: refused. */
    struct sv_gemv_rec gv;
    memset(&gv, 0, sizeof gv);
    gv.handle = 77;
    gv.m = gv.n = gv.lda = gv.incx = gv.incy = 1;
    x->async(SV_OP_BLAS_GEMV, &gv, sizeof gv, SV_EXT_NO_STREAM);
    struct sv_dot_rec dr;
    memset(&dr, 0, sizeof dr);
    dr.handle = 77;
    dr.n = 4;
    expect("dot-no-handle", sync_status(SV_OP_BLAS_DOT, &dr, sizeof dr, out, NULL), CUBLAS_STATUS_NOT_INITIALIZED);
    /* The worker still serves: another handle, made. */
    struct sv_id_rec id2 = {2, 0};
    expect("create-after", sync_status(SV_OP_BLAS_CREATE, &id2, sizeof id2, out, NULL), CUBLAS_STATUS_SUCCESS);
    /* What NVIDIA's static runtime asks for first: refused, the line naming this program. */
    const void *table = NULL;
    CUuuid uuid;
    memset(&uuid, 0x42, sizeof uuid);
    expect("export-table", (int)cuGetExportTable(&table, &uuid), CUDA_ERROR_NOT_SUPPORTED);
    printf("blasattack: %s\n", failed ? "FAILED" : "ok");
    return failed;
}

/*
 * The served library's interface for the libraries served beside it
 * (intercept/blas: gpucr's libcublas.so.13 and libcublasLt.so.13 in served
 * mode), which forward their calls through its ring and keep their objects
 * under its virtual handles. They find it at run time:
 * gpucrServedExt(SV_EXT_VERSION) is NULL in a process whose libcuda.so.1 is
 * not served mode's (or is of another version).
 */
#ifndef GPUCR_SERVED_EXT_H
#define GPUCR_SERVED_EXT_H

#include <stdbool.h>
#include <stdint.h>

#include "gpucr/cudadrv.h"

#define SV_EXT_VERSION 3u
#define SV_EXT_SYMBOL "gpucrServedExt"
/* A record with no stream to note for a capture. */
#define SV_EXT_NO_STREAM UINT32_MAX

struct sv_ext {
    uint32_t version, size;
    /* cuInit's work, if not done yet: CUDA_SUCCESS while serving (or detached, calls then wait). */
    CUresult (*init)(void);
    /* An asynchronous record (stream: the one it runs on, kept if that stream captures; SV_EXT_NO_STREAM). */
    CUresult (*async)(unsigned op, const void *pl, uint32_t plen, uint32_t stream);
    /* A synchronous record; out gets the reply's data (cap bytes at most), *outlen its length. */
    CUresult (*sync)(unsigned op, const void *pl, uint32_t plen, void *out, uint32_t cap, uint32_t *outlen);
    /* A stream argument as records name it; CUDA_ERROR_INVALID_HANDLE for none of the process's streams. */
    CUresult (*stream)(CUstream h, uint32_t *id);
    CUstream (*stream_handle)(uint32_t id);
    /* Virtual handles (client.h: sv_id_*): data is freed with free() when the id is dropped. */
    uint32_t (*id_new)(unsigned kind);
    void (*id_set)(unsigned kind, uint32_t id, void *data);
    void (*id_drop)(unsigned kind, uint32_t id);
    void *(*id_data)(unsigned kind, uint32_t id);
    uint32_t (*id_of)(unsigned kind, const void *h);
    void *(*handle)(unsigned kind, uint32_t id);
    uint32_t (*id_end)(unsigned kind);
    bool (*id_live)(unsigned kind, uint32_t id);
    /* fn runs at each replay into a new worker, in the order registered; 0, or -1 (no room). */
    int (*on_replay)(CUresult (*fn)(void));
    /* Whether stream captures; a record kept for its capture without being sent (what capturing it again in another
     * worker takes, when that is not the record sent). */
    bool (*capturing)(uint32_t stream);
    void (*cap_note)(uint32_t stream, unsigned op, const void *pl, uint32_t plen);
    void (*warn)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
    void (*debug)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
    /* While a replay writes a template's script: the next synchronous record's answer, which a worker that runs the
     * script must give too (its first n bytes); nothing otherwise. */
    void (*expect)(const void *p, uint32_t n);
};

#endif

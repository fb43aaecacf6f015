/*
 * Served mode's client library (libcuda.so.1 of build/lib/served): the
 * application's driver, which holds no driver state and forwards every call
 * to its worker through the shared ring of protocol/c/served.h.
 *
 *   ring.c    the helper's Serve, the handshake with the worker, the ring:
 *             enqueue, replies, staging, a dead worker, fork
 *   handles.c virtual handles and what is kept of each for a replay
 *   api.c     the forwarded entry points
 *   misc.c    what is answered here: errors, cuGetProcAddress, refusals
 */
#ifndef GPUCR_SERVED_CLIENT_H
#define GPUCR_SERVED_CLIENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpucr/cudadrv.h"
#include "served.h"

#define SV_API __attribute__((visibility("default")))
#define SV_HIDDEN __attribute__((visibility("hidden")))

/* ---- ring.c ---- */

/* The one error a call gets once the worker is gone. */
#define SV_GONE CUDA_ERROR_DEVICE_UNAVAILABLE

/* Up: cuInit succeeded and the worker answers. */
SV_HIDDEN extern _Atomic int sv_up;
SV_HIDDEN extern struct sv_shared *sv_sh;

/* cuInit's work: the helper's Serve, the worker's handshake (once; a later call returns the first one's result). */
SV_HIDDEN CUresult sv_connect(void);
/* CUDA_SUCCESS while the worker serves; CUDA_ERROR_NOT_INITIALIZED before cuInit; SV_GONE after. */
SV_HIDDEN CUresult sv_ready(void);
/* Marks the worker gone (why says how) and prints the one line that says so; returns SV_GONE. */
SV_HIDDEN CUresult sv_gone(const char *why);

/*
 * A record being written: sv_begin reserves len bytes (header included; rounded up to SV_REC_ALIGN) and
 * holds the producers' lock until sv_commit publishes it. The payload starts after the header.
 */
typedef struct {
    struct sv_rec *rec;
    uint8_t *payload;
} sv_slot;
SV_HIDDEN CUresult sv_begin(sv_slot *s, unsigned op, uint32_t len, uint32_t reply, unsigned flags);
SV_HIDDEN void sv_commit(sv_slot *s);

/* An asynchronous call: the record with its payload, no reply. */
SV_HIDDEN CUresult sv_async(unsigned op, const void *payload, uint32_t plen);
/*
 * A synchronous call: the record, then the worker's result; out (cap bytes, may be NULL) gets the reply's data,
 * *outlen (may be NULL) its length. A syncpoint also returns the first failure of an earlier asynchronous call,
 * if there was one and this call succeeded (served.h: deferred).
 */
SV_HIDDEN CUresult sv_sync(unsigned op, const void *payload, uint32_t plen, void *out, uint32_t cap, uint32_t *outlen,
                           bool syncpoint);
SV_HIDDEN CUresult sv_sync_named(unsigned op, const void *payload, uint32_t plen, const char *name, void *out,
                                 uint32_t cap, uint32_t *outlen);

/* Reply slots, for calls that build their own records (sv_begin with reply = slot + 1). */
SV_HIDDEN CUresult sv_reply_claim(uint32_t *slot);
SV_HIDDEN CUresult sv_reply_wait(uint32_t slot, void *out, uint32_t cap, uint32_t *outlen);
SV_HIDDEN void sv_reply_release(uint32_t slot);
SV_HIDDEN CUresult sv_take_deferred(CUresult r);

/* Staging slots: claimed here (SV_PENDING), freed by the worker (HtoD, images) or by sv_stage_release (DtoH). */
SV_HIDDEN CUresult sv_stage_claim(uint32_t *slot);
SV_HIDDEN bool sv_stage_try(uint32_t *slot); /* without waiting */
SV_HIDDEN CUresult sv_stage_wait(uint32_t slot);
SV_HIDDEN void sv_stage_release(uint32_t slot);

/* The image sequence (an image's chunks, then the record that loads it) from one thread at a time. */
SV_HIDDEN void sv_image_lock(void);
SV_HIDDEN void sv_image_unlock(void);

/* ---- handles.c ---- */

/* What the application sees: 0x5e5e << 48 | kind << 40 | id. */
static inline void *sv_handle(unsigned kind, uint32_t id) {
    return (void *)(uintptr_t)(0x5e5e000000000000ull | (uint64_t)kind << 40 | id);
}
/* The id of h if it is a live handle of kind, else 0. */
SV_HIDDEN uint32_t sv_id(unsigned kind, const void *h);
/* A new id of kind (0: none left). */
SV_HIDDEN uint32_t sv_id_new(unsigned kind);
/* Makes id live with its data (may be NULL), or frees it (sv_id_drop: its data is kept for nothing, freed). */
SV_HIDDEN void sv_id_set(unsigned kind, uint32_t id, void *data);
SV_HIDDEN void sv_id_drop(unsigned kind, uint32_t id);
SV_HIDDEN void *sv_id_data(unsigned kind, uint32_t id);
/* Forgets every handle (a forked child: they were its parent's worker's). */
SV_HIDDEN void sv_handles_reset(void);

/* A function's or kernel's record: what a launch packs by, and what a replay would look it up by. */
typedef struct {
    uint32_t owner; /* the module (function of a module), library (kernel) or kernel (function of a kernel) */
    unsigned okind; /* SV_K_MODULE, SV_K_LIBRARY or SV_K_KERNEL */
    char *name;     /* NULL for a kernel's function: the kernel's */
    uint32_t n, bytes;
    uint32_t *off, *size;
} sv_func;

/* A module's or library's record: its image, for a replay. */
typedef struct {
    void *image;
    uint64_t size;
} sv_image;

/* A stream's or event's record: its flags, for a replay. */
typedef struct {
    unsigned flags;
} sv_flags;

/* Device memory the application has (cuMemcpy's unified addressing asks which side a pointer is on). */
SV_HIDDEN void sv_range_add(uint64_t base, uint64_t size);
SV_HIDDEN void sv_range_del(uint64_t base);
SV_HIDDEN bool sv_range_has(uint64_t p);

/* ---- misc.c ---- */

/* The one-time line of a refused entry point. */
SV_HIDDEN CUresult sv_refuse(_Atomic int *once, const char *fn, const char *why);
#define SV_REFUSE(why)                                                                                                 \
    do {                                                                                                               \
        static _Atomic int once_;                                                                                      \
        return sv_refuse(&once_, __func__, why);                                                                       \
    } while (0)
SV_HIDDEN void sv_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif

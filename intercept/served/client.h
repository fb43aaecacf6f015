/*
 * Served mode's client library (libcuda.so.1 of build/lib/served): the
 * application's driver, which holds no driver state and forwards every call
 * to its worker through the shared ring of protocol/c/served.h.
 *
 *   ring.c    the helper's Serve, the handshake with the worker, the ring:
 *             enqueue, replies, staging, a dead worker, fork
 *   handles.c virtual handles and what is kept of each for a replay
 *   api.c     the forwarded entry points; what a capture forwarded
 *   replay.c  a detached process's objects made again in a new worker
 *   misc.c    what is answered here: errors, cuGetProcAddress, refusals
 */
#ifndef GPUCR_SERVED_CLIENT_H
#define GPUCR_SERVED_CLIENT_H

#include <pthread.h>
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

/* sv_up's states: before cuInit; serving; the worker is gone; detached (a checkpoint: no worker, calls wait). */
enum { SV_S_NONE = 0, SV_S_UP = 1, SV_S_GONE = 2, SV_S_DETACHED = 3 };
SV_HIDDEN extern _Atomic int sv_up;
SV_HIDDEN extern struct sv_shared *sv_sh;

/* cuInit's work: the helper's Serve, the worker's handshake (once; a later call returns the first one's result). */
SV_HIDDEN CUresult sv_connect(void);
/* CUDA_SUCCESS after cuInit (serving, or detached); CUDA_ERROR_NOT_INITIALIZED before; SV_GONE once the worker is
 * gone. What the library answers itself needs no more. */
SV_HIDDEN CUresult sv_ready(void);
/*
 * Around everything that uses the shared memory (sv_begin and the reply and staging slots): sv_enter waits
 * while the library is detached (until the attach), and fails as sv_ready does otherwise; sv_leave ends it.
 * They nest on a thread. A detach waits until no thread is between them, so the ring can go away under none.
 */
SV_HIDDEN CUresult sv_enter(void);
SV_HIDDEN void sv_leave(void);
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

/* A record whose descriptor travels on the socket (served.h): import (fd sent, the handle in out) and export
 * (the handle in q, *fd received). Each: the worker's result. */
SV_HIDDEN CUresult sv_send_fd_rec(unsigned op, int fd, struct sv_fd_rec *q, void *out, uint32_t cap);
SV_HIDDEN CUresult sv_recv_fd_rec(unsigned op, struct sv_fd_rec *q, void *out, uint32_t cap, int *fd);

/* Exported for the interposer (intercept/src/1_base.h: GC_SERVED_DETACH, GC_SERVED_ATTACH): 0, or -1 after a
 * line that says why. */
SV_API int gpucrServedDetach(void);
SV_API int gpucrServedAttach(void);

/* A template's script (script.c): while sv_recording, a record committed goes into the script, not to a worker
 * (sv_commit), and a synchronous one is answered at once. sv_script_expect gives the next answer's data: what a
 * worker that runs the script must answer too. sv_script_end: the sealed memfd, or -1 (*why says why). */
SV_HIDDEN extern bool sv_recording;
SV_HIDDEN bool sv_script_begin(void);
SV_HIDDEN void sv_script_record(const struct sv_rec *rec);
SV_HIDDEN void sv_script_expect(const void *p, uint32_t n);
SV_HIDDEN int sv_script_end(const uint8_t token[SV_TOKEN_BYTES], bool keep, const char **why);
/* Exported for the interposer (GC_SERVED_SCRIPT): after a detach, the script of a template of this process (a
 * sealed memfd, the caller's to close), or -1 after a line that says why. A later attach asks for that template. */
SV_API int gpucrServedScript(void);

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
/* For a replay: past the highest id of kind handed out, and whether id is live. */
SV_HIDDEN uint32_t sv_id_end(unsigned kind);
SV_HIDDEN bool sv_id_live(unsigned kind, uint32_t id);

/* A function's or kernel's record: what a launch packs by, and what a replay would look it up by. */
/* The function attributes cuFuncSetAttribute may set (CUfunction_attribute 8 .. 15), kept for a replay. */
#define SV_FUNC_ATTR_FIRST 8
#define SV_FUNC_ATTRS 8
typedef struct {
    uint32_t owner; /* the module (function of a module), library (kernel) or kernel (function of a kernel) */
    unsigned okind; /* SV_K_MODULE, SV_K_LIBRARY or SV_K_KERNEL */
    char *name;     /* NULL for a kernel's function: the kernel's */
    uint32_t n, bytes;
    uint32_t *off, *size;
    /* What the process set (sv_func_mu): bit i of attr_set, attribute SV_FUNC_ATTR_FIRST + i, in attr[i];
     * cache: cuFuncSetCacheConfig's preference, -1 if never set. A new worker gets them again. */
    uint32_t attr_set;
    int32_t attr[SV_FUNC_ATTRS];
    int32_t cache;
} sv_func;
SV_HIDDEN extern pthread_mutex_t sv_func_mu;

/* A module global or library global the process asked for (its device memory): a new worker's must be the same. */
typedef struct sv_global {
    char *name;
    uint64_t addr, size;
    void *saved; /* its contents, read at a detach, for the new worker's copy */
    struct sv_global *next;
} sv_global;
/* At a detach (ring.c), the worker synchronized: every global's contents read into saved (api.c). */
SV_HIDDEN void sv_globals_save(void);
/* At a replay: g's contents written into the new worker's copy (at g->addr, where the replay found it), saved
 * freed (api.c); kept while a script is written (the attach after it may replay). */
SV_HIDDEN CUresult sv_global_restore(sv_global *g);
/* An attach to a template, which has the globals' contents: what was saved for a replay goes. */
SV_HIDDEN void sv_globals_forget_saved(void);
/* g placed by the new worker at addr (size bytes): the process's record of it, and its device range, moved (api.c). */
SV_HIDDEN void sv_global_moved(sv_global *g, uint64_t addr, uint64_t size);
/* p (n bytes from it) where it lies in the old range of a global a new worker placed elsewhere: the address the
 * global's bytes have now; else p (api.c). */
SV_HIDDEN CUdeviceptr sv_moved_addr(CUdeviceptr p, size_t n);
/* After a replay: one line for the globals it found elsewhere, if any (replay.c). */
SV_HIDDEN void sv_globals_moved_say(void);
/* After an attach to a template: each global's address asked of its worker, the process's record moved where it
 * moved, and said (replay.c). */
SV_HIDDEN CUresult sv_globals_refresh(void);

/* A module's or library's record: its image and its load record (a library's JIT options), for a replay. */
typedef struct {
    void *image;
    uint64_t size;
    struct sv_load_rec rec;
    sv_global *globals; /* (sv_func_mu) */
} sv_image;

/*
 * What a stream capture forwarded (api.c), for capturing it again in another worker: the records, each
 * {uint32 op, uint32 payload bytes, payload, padded to 8}, the stream it began on with its mode, and the other
 * streams it took in (through events). A graph holds one, and so does each graph exec made from it (a graph is
 * often destroyed once instantiated). bad: it forwarded something a capture again would not reproduce
 * (staged copies, allocations, graph launches).
 */
#define SV_CAP_STREAMS 16u
typedef struct {
    _Atomic int refs;
    uint8_t *buf;
    size_t len, cap;
    uint32_t origin, mode;
    uint32_t streams[SV_CAP_STREAMS];
    uint32_t nstreams;
    const char *bad; /* why not, or NULL */
} sv_caplog;
SV_HIDDEN void sv_caplog_put(sv_caplog *l);
/* A graph exec's record. */
typedef struct {
    sv_caplog *log;
    uint64_t flags;
} sv_exec;

/* ---- api.c, replay.c: taking a worker again after a detach ---- */

/* The worker changed (device_changed: possibly onto another GPU): what was kept of the old one's answers goes. */
SV_HIDDEN void sv_api_attached(bool device_changed);
/* Makes every object of the process again in the new worker, under the same virtual handles (replay.c). */
SV_HIDDEN CUresult sv_replay(void);
/* An image through staging and its load record (api.c). */
SV_HIDDEN CUresult sv_send_image(const void *image, uint64_t size, unsigned op, void *rec, uint32_t plen, void *out,
                                 uint32_t cap, uint32_t *outlen);
/* What replay.c needs of api.c's state: the primary context's flags (set: they were set), the reservations. */
SV_HIDDEN bool sv_primary_flags(unsigned *flags);
typedef struct {
    uint64_t base, size, align;
} sv_reservation;
/* Copies up to max reservations into out; returns how many there are. */
SV_HIDDEN size_t sv_reservations(sv_reservation *out, size_t max);

/* A stream's or event's record: its flags (and a stream's priority, as clamped), for a replay; whether a
 * stream captures (begun here, not ended yet). */
typedef struct {
    unsigned flags;
    int priority;
    _Atomic int capturing;
} sv_flags;

/* The context limits the process set (cuCtxSetLimit), for a replay: bit i of the mask, limit i in v[i]. */
#define SV_LIMITS 16
SV_HIDDEN uint32_t sv_limits(uint64_t v[SV_LIMITS]);

/* Device memory the application has (cuMemcpy's unified addressing asks which side a pointer is on). */
SV_HIDDEN void sv_range_add(uint64_t base, uint64_t size);
SV_HIDDEN void sv_range_del(uint64_t base);
SV_HIDDEN bool sv_range_has(uint64_t p);

/* A stream argument as a record names it (served.h: SV_STREAM_*, else its id); CUDA_ERROR_INVALID_HANDLE for
 * none of the process's streams. */
SV_HIDDEN CUresult sv_stream_arg(CUstream h, uint32_t *out);
/* A record forwarded on stream: kept if the stream captures (for capturing it again in another worker). */
SV_HIDDEN void sv_cap_note(uint32_t stream, unsigned op, const void *pl, uint32_t plen);
/* Whether stream captures (a capture began on it or took it in). */
SV_HIDDEN bool sv_cap_active(uint32_t stream);

/* ---- ext.c: what the libraries served beside this one (intercept/blas) use of it ---- */

/* Their objects, made again in a new worker: after the streams and events, before the graphs (whose captures
 * may hold their calls). */
SV_HIDDEN CUresult sv_ext_replay(void);

/* ---- misc.c ---- */

/* The one-time line of a refused entry point. */
SV_HIDDEN CUresult sv_refuse(_Atomic int *once, const char *fn, const char *why);
#define SV_REFUSE(why)                                                                                                 \
    do {                                                                                                               \
        static _Atomic int once_;                                                                                      \
        return sv_refuse(&once_, __func__, why);                                                                       \
    } while (0)
SV_HIDDEN void sv_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A line only with GPUCR_LOG=debug, as the interposer's. */
SV_HIDDEN void sv_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif

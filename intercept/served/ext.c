/*
 * The served library's interface for the libraries served beside it (ext.h),
 * and their replay into a new worker (client.h: sv_ext_replay).
 */
#include <pthread.h>
#include <string.h>

#include "client.h"
#include "ext.h"

#define EXT_HOOKS 8
static struct {
    pthread_mutex_t mu;
    CUresult (*fn[EXT_HOOKS])(void);
    unsigned n;
} H = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int on_replay(CUresult (*fn)(void)) {
    int rc = -1;
    pthread_mutex_lock(&H.mu);
    for (unsigned i = 0; i < H.n; i++)
        if (H.fn[i] == fn)
            rc = 0;
    if (rc != 0 && H.n < EXT_HOOKS) {
        H.fn[H.n++] = fn;
        rc = 0;
    }
    pthread_mutex_unlock(&H.mu);
    return rc;
}

CUresult sv_ext_replay(void) {
    pthread_mutex_lock(&H.mu);
    unsigned n = H.n;
    CUresult (*fn[EXT_HOOKS])(void) = {NULL};
    memcpy(fn, H.fn, sizeof fn);
    pthread_mutex_unlock(&H.mu);
    CUresult r = CUDA_SUCCESS;
    for (unsigned i = 0; i < n && r == CUDA_SUCCESS; i++)
        r = fn[i]();
    return r;
}

/* cuInit's work: what an entry point of this library that needs it does first (api.c: NEED_INIT). */
static CUresult ext_init(void) {
    CUresult r = sv_ready();
    if (r == CUDA_ERROR_NOT_INITIALIZED)
        r = cuInit(0);
    return r;
}

static CUresult ext_async(unsigned op, const void *pl, uint32_t plen, uint32_t stream) {
    CUresult r = sv_async(op, pl, plen);
    if (r == CUDA_SUCCESS && stream != SV_EXT_NO_STREAM)
        sv_cap_note(stream, op, pl, plen);
    return r;
}

static CUresult ext_sync(unsigned op, const void *pl, uint32_t plen, void *out, uint32_t cap, uint32_t *outlen) {
    return sv_sync(op, pl, plen, out, cap, outlen, false);
}

static CUstream stream_handle(uint32_t id) {
    switch (id) {
    case SV_STREAM_NULL: return NULL;
    case SV_STREAM_LEGACY: return CU_STREAM_LEGACY;
    case SV_STREAM_PER_THREAD: return CU_STREAM_PER_THREAD;
    default: return (CUstream)sv_handle(SV_K_STREAM, id);
    }
}

static void *handle_of(unsigned kind, uint32_t id) { return sv_handle(kind, id); }

static const struct sv_ext EXT = {
    .version = SV_EXT_VERSION,
    .size = sizeof(struct sv_ext),
    .init = ext_init,
    .async = ext_async,
    .sync = ext_sync,
    .stream = sv_stream_arg,
    .stream_handle = stream_handle,
    .id_new = sv_id_new,
    .id_set = sv_id_set,
    .id_drop = sv_id_drop,
    .id_data = sv_id_data,
    .id_of = sv_id,
    .handle = handle_of,
    .id_end = sv_id_end,
    .id_live = sv_id_live,
    .on_replay = on_replay,
    .capturing = sv_cap_active,
    .cap_note = sv_cap_note,
    .warn = sv_warn,
    .debug = sv_debug,
    .expect = sv_script_expect,
};

SV_API const struct sv_ext *gpucrServedExt(unsigned version) { return version == SV_EXT_VERSION ? &EXT : NULL; }

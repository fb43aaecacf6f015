/*
 * The devices and contexts (3_devices.h): each device's UUID, by which the
 * helper knows it, from the driver once; the granularity allocations of the
 * device come in; the contexts that were current at an allocation, for Drain.
 */
#include <stdio.h>
#include <string.h>

#include "1_base.h"
#include "2_link.h"
#include "3_devices.h"

static struct {
    pthread_mutex_t mu; /* everything below; taken after any other lock, never before one */
    char uuid[GC_MAX_DEV][48];
    bool have_uuid[GC_MAX_DEV];
    char first[GC_MAX_DEV][48]; /* the GPU each ordinal stood for when first asked (never forgotten) */
    bool have_first[GC_MAX_DEV];
    atomic_bool moved; /* a restore put an ordinal onto another GPU */
    CUcontext ctxs[GC_MAX_CTX];
    int nctx;
} G = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
};

const char *gc_dev_uuid(int dev) {
    if (dev < 0 || dev >= GC_MAX_DEV)
        return NULL;
    pthread_mutex_lock(&G.mu);
    bool have = G.have_uuid[dev];
    pthread_mutex_unlock(&G.mu);
    if (have)
        return G.uuid[dev];
    CUuuid u;
    __typeof__(&cuDeviceGetUuid_v2) fn = GC_REAL(cuDeviceGetUuid_v2);
    CUresult r = fn ? fn(&u, dev) : CUDA_ERROR_NOT_SUPPORTED;
    if (r != CUDA_SUCCESS) {
        gc_debug("cuDeviceGetUuid_v2(%d): %d", dev, (int)r);
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)u.bytes;
    char s[48];
    snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    pthread_mutex_lock(&G.mu);
    memcpy(G.uuid[dev], s, sizeof s);
    G.have_uuid[dev] = true;
    if (!G.have_first[dev]) {
        memcpy(G.first[dev], s, sizeof s);
        G.have_first[dev] = true;
    }
    pthread_mutex_unlock(&G.mu);
    return G.uuid[dev];
}

const char *gc_dev_uuid_known(int dev) {
    if (dev < 0 || dev >= GC_MAX_DEV)
        return "";
    pthread_mutex_lock(&G.mu);
    bool have = G.have_uuid[dev];
    pthread_mutex_unlock(&G.mu);
    return have ? G.uuid[dev] : "";
}

uint64_t gc_dev_granularity(int dev, const char *uuid) {
    uint64_t hg = gc_link_granularity(uuid);
    if (hg)
        return hg;
    CUmemAllocationProp p = {0};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    size_t g = 0;
    __typeof__(&cuMemGetAllocationGranularity) fn = GC_REAL(cuMemGetAllocationGranularity);
    if (fn && fn(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && g)
        return g;
    return GC_DEFAULT_SLAB;
}

void gc_note_context(void) {
    CUcontext c = NULL;
    __typeof__(&cuCtxGetCurrent) fn = GC_REAL(cuCtxGetCurrent);
    if (!fn || fn(&c) != CUDA_SUCCESS || !c)
        return;
    pthread_mutex_lock(&G.mu);
    bool found = false;
    for (int i = 0; i < G.nctx; i++)
        found |= G.ctxs[i] == c;
    if (!found && G.nctx < GC_MAX_CTX)
        G.ctxs[G.nctx++] = c;
    pthread_mutex_unlock(&G.mu);
}

int gc_contexts(CUcontext *out) {
    pthread_mutex_lock(&G.mu);
    int n = G.nctx;
    memcpy(out, G.ctxs, sizeof(CUcontext) * (size_t)n);
    pthread_mutex_unlock(&G.mu);
    return n;
}

void gc_dev_atfork_prepare(void) { pthread_mutex_lock(&G.mu); }
void gc_dev_atfork_parent(void) { pthread_mutex_unlock(&G.mu); }

void gc_dev_learn_all(void) {
    int n = 0;
    __typeof__(&cuDeviceGetCount) fn = GC_REAL(cuDeviceGetCount);
    if (fn && fn(&n) == CUDA_SUCCESS)
        for (int d = 0; d < n && d < GC_MAX_DEV; d++)
            (void)gc_dev_uuid(d);
}

size_t gc_dev_visible(char **out) {
    int n = 0;
    __typeof__(&cuDeviceGetCount) fn = GC_REAL(cuDeviceGetCount);
    if (!fn || fn(&n) != CUDA_SUCCESS || n <= 0)
        return 0;
    size_t k = 0;
    pthread_mutex_lock(&G.mu);
    for (int d = 0; d < n && d < GC_MAX_DEV; d++) {
        if (!G.have_uuid[d]) {
            k = 0; /* all or nothing: a restore onto other GPUs needs them all */
            break;
        }
        out[k++] = G.uuid[d];
    }
    pthread_mutex_unlock(&G.mu);
    return k;
}

void gc_dev_forget_uuids(void) {
    pthread_mutex_lock(&G.mu);
    memset(G.have_uuid, 0, sizeof G.have_uuid);
    pthread_mutex_unlock(&G.mu);
    /* asked again now (the driver has restored the context): did an ordinal move? */
    for (int d = 0; d < GC_MAX_DEV; d++) {
        pthread_mutex_lock(&G.mu);
        bool had = G.have_first[d];
        pthread_mutex_unlock(&G.mu);
        const char *u = had ? gc_dev_uuid(d) : NULL;
        if (u && strcmp(u, G.first[d]) != 0) {
            gc_debug("device %d is now %s (was %s)", d, u, G.first[d]);
            atomic_store(&G.moved, true);
        }
    }
}

bool gc_dev_moved_bus_id(int dev, char *out, size_t n) {
    if (!atomic_load_explicit(&G.moved, memory_order_relaxed) || dev < 0 || dev >= GC_MAX_DEV)
        return false;
    const char *u = gc_dev_uuid(dev);
    pthread_mutex_lock(&G.mu);
    bool same = !u || !G.have_first[dev] || strcmp(u, G.first[dev]) == 0;
    pthread_mutex_unlock(&G.mu);
    return !same && gc_link_bus_id(u, out, n);
}

/* The child's devices are asked again; its contexts are none. */
void gc_dev_atfork_child(void) {
    pthread_mutex_init(&G.mu, NULL);
    memset(G.have_uuid, 0, sizeof G.have_uuid);
    G.nctx = 0;
}

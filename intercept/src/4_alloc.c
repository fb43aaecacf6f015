/*
 * Helper allocations (4_alloc.h): memory the helper allocates and exports,
 * imported here at reserved addresses; 2 MiB slabs for small buffers;
 * deferred stream-ordered frees; the buffer table of everything the
 * application was handed. Their part of Drop / Reimport / Resume / Snapshot
 * / GetStats for the control thread. A forked child resets it all.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "1_base.h"
#include "2_link.h"
#include "3_devices.h"
#include "4_alloc.h"

#define DEFAULT_THRESHOLD (1ULL << 20)

typedef struct rec {
    uint64_t id, addr, size; /* size: what is reserved and mapped */
    int dev, kind;
    CUmemGenericAllocationHandle h;
    bool mapped;
    gc_slab *slab; /* kind SLAB */
    struct rec *next;
} rec;

typedef struct pend {
    gc_buf b;
    CUevent ev;
    struct pend *next;
} pend;

static struct {
    pthread_mutex_t mu; /* everything below; table writers; the VMM layer's records */
    rec *recs;
    gc_slab *slabs;
    pend *pending;
    gc_table table;
    uint64_t live_buffers, live_bytes, helper_bytes;
    uint64_t threshold;
} G = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
};

void gc_alloc_lock(void) { pthread_mutex_lock(&G.mu); }
void gc_alloc_unlock(void) { pthread_mutex_unlock(&G.mu); }

void gc_alloc_configure(void) {
    const char *t = getenv("GPUCR_SLAB_THRESHOLD");
    G.threshold = DEFAULT_THRESHOLD;
    if (t && *t) {
        char *end;
        unsigned long long v = strtoull(t, &end, 0);
        if (*end == 0)
            G.threshold = v;
        else
            gc_warn("GPUCR_SLAB_THRESHOLD=%s is not a number; using %llu", t, (unsigned long long)G.threshold);
    }
}

void gc_alloc_init(void) {
    if (!atomic_load(&G.table.cur) && gt_init(&G.table) != 0)
        gc_warn("out of memory for the buffer table");
}

const gc_btab *gc_buffers(void) {
    const gc_btab *s = gt_snap(&G.table);
    static const gc_btab empty = {.lo = UINT64_MAX};
    return s ? s : &empty;
}

bool gc_alloc_tracking(void) {
    int c = gc_link_state();
    return c == CONN_UP || c == CONN_DEAD || c == CONN_DETACHED;
}

/* ---- helper allocations ---- */

static CUresult map_fd(int fd, uint64_t addr, uint64_t size, int dev, CUmemGenericAllocationHandle *h) {
    CUresult r =
        GC_REAL(cuMemImportFromShareableHandle)(h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
        gc_warn("cuMemImportFromShareableHandle: error %d", (int)r);
        return r;
    }
    r = GC_REAL(cuMemMap)(addr, size, 0, *h, 0);
    if (r != CUDA_SUCCESS) {
        gc_warn("cuMemMap(0x%llx, %llu): error %d", (unsigned long long)addr, (unsigned long long)size, (int)r);
        GC_REAL(cuMemRelease)(*h);
        return r;
    }
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    r = GC_REAL(cuMemSetAccess)(addr, size, &d, 1);
    if (r != CUDA_SUCCESS) {
        gc_warn("cuMemSetAccess(0x%llx): error %d", (unsigned long long)addr, (int)r);
        GC_REAL(cuMemUnmap)(addr, size);
        GC_REAL(cuMemRelease)(*h);
    }
    return r;
}

static double mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/*
 * A helper allocation of size bytes, imported and mapped. The range is reserved before the helper is asked, so
 * that Alloc tells it the address and no Mapped round trip follows (one round trip per allocation, not two).
 */
static rec *helper_import(int dev, const char *uuid, uint64_t size, int kind, CUresult *err) {
    uint64_t gran = gc_dev_granularity(dev, uuid);
    uint64_t want = (size + gran - 1) / gran * gran;
    CUdeviceptr addr = 0;
    double t0 = mono_us();
    CUresult r = GC_REAL(cuMemAddressReserve)(&addr, want, gran, 0, 0);
    if (r != CUDA_SUCCESS) {
        gc_warn("cuMemAddressReserve(%llu): error %d", (unsigned long long)want, (int)r);
        *err = r;
        return NULL;
    }
    uint64_t id = 0, rsize = 0;
    int fds[1] = {-1};
    double t1 = mono_us();
    *err = gc_link_alloc(uuid, size, kind, 0, addr, &id, &rsize, &fds[0]);
    double t2 = mono_us();
    if (*err != CUDA_SUCCESS) {
        GC_REAL(cuMemAddressFree)(addr, want);
        return NULL;
    }
    bool moved = false;
    if (rsize < size)
        rsize = want;
    if (rsize != want) {
        /* the helper rounded otherwise: a range of its size, and Mapped says where */
        GC_REAL(cuMemAddressFree)(addr, want);
        addr = 0;
        r = GC_REAL(cuMemAddressReserve)(&addr, rsize, gran, 0, 0);
        if (r != CUDA_SUCCESS)
            gc_warn("cuMemAddressReserve(%llu): error %d", (unsigned long long)rsize, (int)r);
        moved = true;
    }
    rec *a = r == CUDA_SUCCESS ? calloc(1, sizeof *a) : NULL;
    if (r == CUDA_SUCCESS && !a)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        r = map_fd(fds[0], addr, rsize, dev, &a->h);
        if (r != CUDA_SUCCESS)
            GC_REAL(cuMemAddressFree)(addr, rsize);
    } else if (addr) {
        GC_REAL(cuMemAddressFree)(addr, moved ? rsize : want);
    }
    close(fds[0]);
    double t3 = mono_us();
    if (r != CUDA_SUCCESS) {
        free(a);
        gc_link_free(id);
        *err = r;
        return NULL;
    }
    a->id = id;
    a->addr = addr;
    a->size = rsize;
    a->dev = dev;
    a->kind = kind;
    a->mapped = true;
    if (moved)
        gc_link_mapped(id, addr);
    gc_debug("alloc %llu: %llu bytes at 0x%llx (%s): reserve %.0f us, helper %.0f us, import+map+access %.0f us%s",
             (unsigned long long)id, (unsigned long long)rsize, (unsigned long long)addr, uuid, t1 - t0, t2 - t1,
             t3 - t2, moved ? ", then Mapped" : "");
    *err = CUDA_SUCCESS;
    return a;
}

/* Unmaps, releases, frees the reservation, tells the helper. Not under the lock. */
static void release_rec(rec *a) {
    if (a->mapped) {
        CUresult r = GC_REAL(cuMemUnmap)(a->addr, a->size);
        if (r != CUDA_SUCCESS)
            gc_warn("cuMemUnmap(0x%llx): error %d", (unsigned long long)a->addr, (int)r);
        r = GC_REAL(cuMemRelease)(a->h);
        if (r != CUDA_SUCCESS)
            gc_warn("cuMemRelease: error %d", (int)r);
    }
    CUresult r = GC_REAL(cuMemAddressFree)(a->addr, a->size);
    if (r != CUDA_SUCCESS)
        gc_warn("cuMemAddressFree(0x%llx): error %d", (unsigned long long)a->addr, (int)r);
    gc_link_free(a->id);
    slab_free(a->slab);
    free(a);
}

static rec *find_rec(uint64_t id) {
    for (rec *a = G.recs; a; a = a->next)
        if (a->id == id)
            return a;
    return NULL;
}

static void unlink_rec(rec *a) {
    for (rec **pp = &G.recs; *pp; pp = &(*pp)->next)
        if (*pp == a) {
            *pp = a->next;
            return;
        }
}

int gc_buf_insert(const gc_buf *b) {
    int rc = gt_insert(&G.table, b);
    if (rc == 0) {
        G.live_buffers++;
        G.live_bytes += b->size;
    }
    return rc;
}

void gc_buf_remove(uint64_t addr) {
    gc_buf b;
    if (gt_remove(&G.table, addr, &b) == 0) {
        G.live_buffers--;
        G.live_bytes -= b.size;
    }
}

void gc_helper_bytes_add(int64_t d) { G.helper_bytes += (uint64_t)d; }

static void reap_pending(bool all);

CUresult gc_alloc(CUdeviceptr *dptr, size_t size, int kind, bool *use_real) {
    *use_real = false;
    if (!dptr || size == 0) {
        *use_real = true;
        return CUDA_SUCCESS;
    }
    if (gc_link_state() != CONN_UP) {
        *use_real = true;
        return CUDA_SUCCESS;
    }
    reap_pending(false);
    CUdevice dev = 0;
    const char *uuid = NULL;
    if (GC_REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS || !(uuid = gc_dev_uuid(dev))) {
        *use_real = true; /* the driver gives the application its own answer (no context, ...) */
        return CUDA_SUCCESS;
    }
    gc_note_context();
    uint64_t slabsize = gc_dev_granularity(dev, uuid);
    if (slabsize < GC_DEFAULT_SLAB)
        slabsize = (GC_DEFAULT_SLAB + slabsize - 1) / slabsize * slabsize;
    CUresult err;
    gc_buf b = {.size = size, .kind = kind, .dev = dev};
    if (size < G.threshold && size <= slabsize / 2) {
        for (int attempt = 0; attempt < 2; attempt++) {
            pthread_mutex_lock(&G.mu);
            for (gc_slab *s = G.slabs; s; s = s->next) {
                rec *o = s->owner;
                if (o->dev != dev)
                    continue;
                int64_t off = slab_take(s, size);
                if (off < 0)
                    continue;
                b.addr = s->base + (uint64_t)off;
                b.alloc_id = o->id;
                if (gc_buf_insert(&b) != 0) {
                    slab_give(s, (uint64_t)off, size);
                    pthread_mutex_unlock(&G.mu);
                    return CUDA_ERROR_OUT_OF_MEMORY;
                }
                pthread_mutex_unlock(&G.mu);
                gc_stat_add(STAT_ALLOCS, 1);
                *dptr = b.addr;
                return CUDA_SUCCESS;
            }
            pthread_mutex_unlock(&G.mu);
            if (attempt == 1)
                break;
            rec *a = helper_import(dev, uuid, slabsize, GC_KIND_SLAB, &err);
            if (!a) {
                if (err == GC_FALLBACK)
                    *use_real = true;
                return err == GC_FALLBACK ? CUDA_SUCCESS : err;
            }
            gc_slab *s = slab_new(a->addr, a->size);
            if (!s) {
                release_rec(a);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            s->owner = a;
            a->slab = s;
            pthread_mutex_lock(&G.mu);
            a->next = G.recs;
            G.recs = a;
            s->next = G.slabs;
            G.slabs = s;
            G.helper_bytes += a->size;
            pthread_mutex_unlock(&G.mu);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rec *a = helper_import(dev, uuid, size, kind, &err);
    if (!a) {
        if (err == GC_FALLBACK)
            *use_real = true;
        return err == GC_FALLBACK ? CUDA_SUCCESS : err;
    }
    b.addr = a->addr;
    b.alloc_id = a->id;
    pthread_mutex_lock(&G.mu);
    int rc = gc_buf_insert(&b);
    if (rc == 0) {
        a->next = G.recs;
        G.recs = a;
        G.helper_bytes += a->size;
    }
    pthread_mutex_unlock(&G.mu);
    if (rc != 0) {
        release_rec(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    gc_stat_add(STAT_ALLOCS, 1);
    *dptr = a->addr;
    return CUDA_SUCCESS;
}

void gc_track_local(CUdeviceptr p, size_t size, int kind) {
    if (!gc_alloc_tracking())
        return;
    CUdevice dev = 0;
    if (GC_REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS)
        dev = -1;
    gc_buf b = {.addr = p, .size = size, .alloc_id = 0, .kind = kind, .dev = dev};
    pthread_mutex_lock(&G.mu);
    gc_buf_insert(&b);
    pthread_mutex_unlock(&G.mu);
    gc_stat_add(STAT_ALLOCS, 1);
    gc_stat_add(STAT_LOCAL_ALLOCS, 1);
    gc_note_reason(GC_REASON_LOCAL);
}

/* Gives back a buffer that is out of the table already. */
static void release_buf(const gc_buf *b) {
    rec *drop = NULL;
    pthread_mutex_lock(&G.mu);
    G.live_buffers--;
    G.live_bytes -= b->size;
    rec *a = find_rec(b->alloc_id);
    if (a && a->slab) {
        slab_give(a->slab, b->addr - a->slab->base, b->size);
        /*
         * An empty slab goes back to the helper only if the device has
         * another empty one: a program that allocates and frees one small
         * buffer in a loop would otherwise pay a helper round trip (about
         * 1.5 ms on the GPU machine) for every allocation.
         */
        bool spare = false;
        if (a->slab->used == 0)
            for (gc_slab *o = G.slabs; o && !spare; o = o->next)
                spare = o != a->slab && o->used == 0 && ((rec *)o->owner)->dev == a->dev;
        if (a->slab->used == 0 && spare) {
            for (gc_slab **pp = &G.slabs; *pp; pp = &(*pp)->next)
                if (*pp == a->slab) {
                    *pp = a->slab->next;
                    break;
                }
            drop = a;
        }
    } else if (a) {
        drop = a;
    }
    if (drop) {
        unlink_rec(drop);
        G.helper_bytes -= drop->size;
    }
    pthread_mutex_unlock(&G.mu);
    if (drop)
        release_rec(drop);
}

static void reap_pending(bool all) {
    pthread_mutex_lock(&G.mu);
    pend *list = G.pending;
    G.pending = NULL;
    pthread_mutex_unlock(&G.mu);
    pend *keep = NULL;
    while (list) {
        pend *p = list;
        list = p->next;
        CUresult r = GC_REAL(cuEventQuery)(p->ev);
        if (r == CUDA_ERROR_NOT_READY && !all) {
            p->next = keep;
            keep = p;
            continue;
        }
        if (r == CUDA_ERROR_NOT_READY)
            r = GC_REAL(cuEventSynchronize)(p->ev);
        if (r != CUDA_SUCCESS)
            gc_debug("deferred free of 0x%llx: event error %d", (unsigned long long)p->b.addr, (int)r);
        GC_REAL(cuEventDestroy_v2)(p->ev);
        release_buf(&p->b);
        free(p);
    }
    if (keep) {
        pthread_mutex_lock(&G.mu);
        pend *t = keep;
        while (t->next)
            t = t->next;
        t->next = G.pending;
        G.pending = keep;
        pthread_mutex_unlock(&G.mu);
    }
}

void gc_alloc_flush_frees(void) { reap_pending(true); }

int gc_free(CUdeviceptr p, bool async, CUstream stream, CUresult *res) {
    if (!gc_alloc_tracking() || p == 0)
        return 0;
    const gc_buf *f = gt_find(gc_buffers(), p);
    if (!f || f->addr != p || f->kind == GC_KIND_VMM) /* VMM mappings: cuMemFree is the driver's answer */
        return 0;
    reap_pending(false);
    gc_buf b;
    pthread_mutex_lock(&G.mu);
    int rc = gt_remove(&G.table, p, &b);
    pthread_mutex_unlock(&G.mu);
    if (rc != 0)
        return 0; /* freed meanwhile by another thread: the driver answers */
    gc_stat_add(STAT_FREES, 1);
    if (b.alloc_id == 0) {
        pthread_mutex_lock(&G.mu);
        G.live_buffers--;
        G.live_bytes -= b.size;
        pthread_mutex_unlock(&G.mu);
        return 0; /* local memory: the driver frees it */
    }
    *res = CUDA_SUCCESS;
    if (async) {
        CUevent ev = NULL;
        CUresult r = GC_REAL(cuEventCreate)(&ev, CU_EVENT_DISABLE_TIMING);
        if (r == CUDA_SUCCESS && (r = GC_REAL(cuEventRecord)(ev, stream)) != CUDA_SUCCESS)
            GC_REAL(cuEventDestroy_v2)(ev);
        pend *pd = r == CUDA_SUCCESS ? malloc(sizeof *pd) : NULL;
        if (pd) {
            pd->b = b;
            pd->ev = ev;
            pthread_mutex_lock(&G.mu);
            pd->next = G.pending;
            G.pending = pd;
            pthread_mutex_unlock(&G.mu);
            return 1;
        }
        if (r == CUDA_SUCCESS)
            GC_REAL(cuEventDestroy_v2)(ev);
        r = GC_REAL(cuStreamSynchronize)(stream);
        if (r != CUDA_SUCCESS)
            gc_debug("cuMemFreeAsync: stream sync: error %d", (int)r);
    } else {
        /* cuMemFree synchronizes: work still queued may use the memory */
        CUresult r = GC_REAL(cuCtxSynchronize)();
        if (r != CUDA_SUCCESS)
            gc_debug("cuMemFree: cuCtxSynchronize: error %d", (int)r);
    }
    release_buf(&b);
    return 1;
}

int gc_addr_range(CUdeviceptr p, CUdeviceptr *base, size_t *size) {
    if (!gc_alloc_tracking())
        return 0;
    const gc_buf *b = gt_find(gc_buffers(), p);
    if (!b || b->alloc_id == 0 || b->kind == GC_KIND_VMM) /* real mappings: the driver knows them */
        return 0;
    if (base)
        *base = b->addr;
    if (size)
        *size = b->size;
    return 1;
}

bool gc_is_helper_mem(CUdeviceptr p) {
    if (!gc_alloc_tracking())
        return false;
    const gc_buf *b = gt_find(gc_buffers(), p);
    return b && b->alloc_id != 0;
}

/* ---- the control thread's part ---- */

void gc_alloc_reclaim(void) {
    pthread_mutex_lock(&G.mu);
    gt_reclaim(&G.table);
    pthread_mutex_unlock(&G.mu);
}

void gc_alloc_drop(CUresult *bad) {
    for (rec *a = G.recs; a; a = a->next) {
        if (!a->mapped)
            continue;
        CUresult r = GC_REAL(cuMemUnmap)(a->addr, a->size);
        if (r == CUDA_SUCCESS)
            r = GC_REAL(cuMemRelease)(a->h);
        if (r != CUDA_SUCCESS && *bad == CUDA_SUCCESS)
            *bad = r;
        a->mapped = false;
    }
}

static rec *find_rec_at(uint64_t addr) {
    for (rec *a = G.recs; a; a = a->next)
        if (a->addr == addr)
            return a;
    return NULL;
}

int gc_alloc_reimport(uint64_t id, uint64_t addr, uint64_t size, int fd, char *msg, size_t msglen, bool *relabel) {
    rec *a = find_rec_at(addr);
    if (!a)
        return 0;
    if (a->size != size) {
        snprintf(msg, msglen, "Reimport: the allocation at 0x%llx has %llu bytes here, the entry %llu",
                 (unsigned long long)addr, (unsigned long long)a->size, (unsigned long long)size);
        return -1;
    }
    if (a->id != id) {
        a->id = id;
        *relabel = true;
    }
    if (a->mapped)
        return 1;
    CUresult r = map_fd(fd, a->addr, a->size, a->dev, &a->h);
    if (r != CUDA_SUCCESS) {
        snprintf(msg, msglen, "Reimport %llu at 0x%llx: CUresult %d", (unsigned long long)a->id,
                 (unsigned long long)a->addr, (int)r);
        return -2;
    }
    a->mapped = true;
    return 1;
}

/* Helper allocations sorted by address, for relabel_fn. */
typedef struct {
    uint64_t addr, size, id;
} span;

static int span_cmp(const void *a, const void *b) {
    uint64_t x = ((const span *)a)->addr, y = ((const span *)b)->addr;
    return x < y ? -1 : x > y;
}

typedef struct {
    span *v;
    size_t n;
    uint64_t (*vmm_id_at)(uint64_t addr);
} spans;

/* The alloc_id the buffer b belongs to now, by its address (the lock held). */
static uint64_t relabel_fn(const gc_buf *b, void *arg) {
    const spans *sp = arg;
    if (b->alloc_id == 0)
        return 0; /* local memory */
    if (b->kind == GC_KIND_VMM) {
        uint64_t id = sp->vmm_id_at(b->addr);
        return id ? id : b->alloc_id;
    }
    if (sp->v) {
        size_t lo = 0, hi = sp->n; /* last span with addr <= b->addr */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (sp->v[mid].addr <= b->addr)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo > 0 && b->addr - sp->v[lo - 1].addr < sp->v[lo - 1].size)
            return sp->v[lo - 1].id;
        return b->alloc_id;
    }
    for (rec *a = G.recs; a; a = a->next)
        if (b->addr >= a->addr && b->addr - a->addr < a->size)
            return a->id;
    return b->alloc_id;
}

void gc_alloc_relabel(uint64_t (*vmm_id_at)(uint64_t addr)) {
    spans sp = {NULL, 0, vmm_id_at};
    for (rec *a = G.recs; a; a = a->next)
        sp.n++;
    sp.v = sp.n ? malloc(sp.n * sizeof *sp.v) : NULL; /* NULL: relabel_fn searches the list */
    if (sp.v) {
        size_t i = 0;
        for (rec *a = G.recs; a; a = a->next)
            sp.v[i++] = (span){a->addr, a->size, a->id};
        qsort(sp.v, sp.n, sizeof *sp.v, span_cmp);
    }
    if (gt_relabel(&G.table, relabel_fn, &sp) != 0)
        gc_warn("out of memory relabelling the buffer table after a Reimport: frees may reach the wrong allocation");
    for (pend *p = G.pending; p; p = p->next)
        p->b.alloc_id = relabel_fn(&p->b, &sp);
    free(sp.v);
}

bool gc_alloc_all_mapped(void) {
    bool all = true;
    for (rec *a = G.recs; a; a = a->next)
        all &= a->mapped;
    return all;
}

size_t gc_alloc_list(gc_alloc_info *out, size_t max) {
    size_t n = 0;
    for (rec *a = G.recs; a; a = a->next, n++)
        if (out && n < max)
            out[n] = (gc_alloc_info){.id = a->id, .addr = a->addr, .size = a->size, .dev = a->dev, .kind = a->kind};
    return out && n > max ? max : n;
}

void gc_alloc_live(uint64_t *buffers, uint64_t *bytes, uint64_t *helper_bytes) {
    pthread_mutex_lock(&G.mu);
    *buffers = G.live_buffers;
    *bytes = G.live_bytes;
    *helper_bytes = G.helper_bytes;
    pthread_mutex_unlock(&G.mu);
}

/* ---- moving memory into a new helper's ---- */

/* A context on dev current on this thread: one the application made current there (gc_note_context), else the
 * device's primary context (retained: *primary is set, for gc_move_ctx_release). */
static CUresult move_ctx(int dev, bool *primary) {
    CUcontext ctxs[GC_MAX_CTX];
    int n = gc_contexts(ctxs);
    *primary = false;
    for (int i = 0; i < n; i++) {
        CUdevice d = -1;
        if (GC_REAL(cuCtxSetCurrent)(ctxs[i]) == CUDA_SUCCESS && GC_REAL(cuCtxGetDevice)(&d) == CUDA_SUCCESS &&
            d == dev)
            return CUDA_SUCCESS;
    }
    CUcontext c = NULL;
    CUresult r = GC_REAL(cuDevicePrimaryCtxRetain)(&c, dev);
    if (r == CUDA_SUCCESS)
        r = GC_REAL(cuCtxSetCurrent)(c);
    *primary = r == CUDA_SUCCESS;
    return r;
}

int gc_move_new(int dev, int kind, unsigned flags, uint64_t hsize, uint64_t addr, gc_move *m, char *why,
                size_t whylen) {
    *m = (gc_move){.dev = dev, .hsize = hsize};
    const char *uuid = gc_dev_uuid(dev);
    if (!uuid) {
        snprintf(why, whylen, "device %d has no UUID", dev);
        return -1;
    }
    uint64_t rsize = 0;
    int fd = -1;
    CUresult r = gc_link_alloc(uuid, hsize, kind, flags, addr, &m->id, &rsize, &fd);
    if (r != CUDA_SUCCESS) {
        snprintf(why, whylen, "the helper did not allocate %llu bytes (%s)", (unsigned long long)hsize,
                 r == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "refused, or gone");
        return -1;
    }
    if (rsize != hsize) {
        snprintf(why, whylen, "the helper allocated %llu bytes for %llu", (unsigned long long)rsize,
                 (unsigned long long)hsize);
        close(fd);
        gc_link_free(m->id);
        return -1;
    }
    uint64_t gran = gc_dev_granularity(dev, uuid);
    r = GC_REAL(cuMemImportFromShareableHandle)(&m->h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    if (r != CUDA_SUCCESS) {
        snprintf(why, whylen, "cuMemImportFromShareableHandle: CUresult %d", (int)r);
        gc_link_free(m->id);
        return -1;
    }
    CUdeviceptr tmp = 0;
    r = GC_REAL(cuMemAddressReserve)(&tmp, hsize, gran, 0, 0);
    if (r == CUDA_SUCCESS) {
        m->tmp = tmp;
        r = GC_REAL(cuMemMap)(tmp, hsize, 0, m->h, 0);
        if (r == CUDA_SUCCESS) {
            CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
            r = GC_REAL(cuMemSetAccess)(tmp, hsize, &d, 1);
            if (r != CUDA_SUCCESS)
                GC_REAL(cuMemUnmap)(tmp, hsize);
        }
        if (r != CUDA_SUCCESS) {
            GC_REAL(cuMemAddressFree)(tmp, hsize);
            m->tmp = 0;
        }
    }
    if (r != CUDA_SUCCESS) {
        snprintf(why, whylen, "mapping the new memory for its copy: CUresult %d", (int)r);
        GC_REAL(cuMemRelease)(m->h);
        gc_link_free(m->id);
        return -1;
    }
    return 0;
}

int gc_move_copy(const gc_move *m, uint64_t va, uint64_t size, uint64_t off, char *why, size_t whylen) {
    bool primary;
    CUresult r = move_ctx(m->dev, &primary);
    if (r == CUDA_SUCCESS)
        r = GC_REAL(cuMemcpyDtoD_v2)(m->tmp + off, va, size);
    if (primary)
        GC_REAL(cuDevicePrimaryCtxRelease_v2)(m->dev);
    if (r != CUDA_SUCCESS) {
        snprintf(why, whylen, "copying 0x%llx (%llu bytes) on device %d: CUresult %d", (unsigned long long)va,
                 (unsigned long long)size, m->dev, (int)r);
        return -1;
    }
    return 0;
}

int gc_move_sync(const gc_move *m, char *why, size_t whylen) {
    bool primary;
    CUresult r = move_ctx(m->dev, &primary);
    if (r == CUDA_SUCCESS)
        r = GC_REAL(cuCtxSynchronize)();
    if (primary)
        GC_REAL(cuDevicePrimaryCtxRelease_v2)(m->dev);
    if (r != CUDA_SUCCESS) {
        snprintf(why, whylen, "waiting for the copy on device %d: CUresult %d", m->dev, (int)r);
        return -1;
    }
    return 0;
}

void gc_move_done(gc_move *m) {
    if (!m->tmp)
        return;
    CUresult r = GC_REAL(cuMemUnmap)(m->tmp, m->hsize);
    if (r == CUDA_SUCCESS)
        r = GC_REAL(cuMemAddressFree)(m->tmp, m->hsize);
    if (r != CUDA_SUCCESS)
        gc_warn("giving up the range of a copy (0x%llx): error %d", (unsigned long long)m->tmp, (int)r);
    m->tmp = 0;
}

void gc_move_abandon(gc_move *m) {
    gc_move_done(m);
    CUresult r = GC_REAL(cuMemRelease)(m->h);
    if (r != CUDA_SUCCESS)
        gc_warn("releasing new memory not used: error %d", (int)r);
    gc_link_free(m->id);
}

/* Moves a: new memory, the bytes copied, then the old mapping swapped for the new one at the same address. */
static int move_rec(rec *a, char *why, size_t whylen) {
    gc_move m;
    if (gc_move_new(a->dev, a->kind, 0, a->size, a->addr, &m, why, whylen) != 0)
        return -1;
    if (gc_move_copy(&m, a->addr, a->size, 0, why, whylen) != 0 || gc_move_sync(&m, why, whylen) != 0) {
        gc_move_abandon(&m);
        return -1;
    }
    gc_move_done(&m);
    CUresult r = GC_REAL(cuMemUnmap)(a->addr, a->size);
    if (r != CUDA_SUCCESS) {
        snprintf(why, whylen, "cuMemUnmap(0x%llx): CUresult %d", (unsigned long long)a->addr, (int)r);
        gc_move_abandon(&m);
        return -1;
    }
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, a->dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    r = GC_REAL(cuMemMap)(a->addr, a->size, 0, m.h, 0);
    if (r == CUDA_SUCCESS && (r = GC_REAL(cuMemSetAccess)(a->addr, a->size, &d, 1)) != CUDA_SUCCESS)
        GC_REAL(cuMemUnmap)(a->addr, a->size);
    if (r != CUDA_SUCCESS) {
        /* the old memory back where it was: the application must find its bytes */
        snprintf(why, whylen, "cuMemMap of the new memory at 0x%llx: CUresult %d", (unsigned long long)a->addr, (int)r);
        CUresult rb = GC_REAL(cuMemMap)(a->addr, a->size, 0, a->h, 0);
        if (rb == CUDA_SUCCESS)
            rb = GC_REAL(cuMemSetAccess)(a->addr, a->size, &d, 1);
        if (rb != CUDA_SUCCESS) {
            /* nothing mapped where the application's buffers are: its next access would fault, silently wrong */
            fprintf(stderr,
                    "gpucr: this process's GPU memory at 0x%llx is lost (mapping it again: CUresult %d); aborting\n",
                    (unsigned long long)a->addr, (int)rb);
            abort();
        }
        gc_move_abandon(&m);
        return -1;
    }
    r = GC_REAL(cuMemRelease)(a->h);
    if (r != CUDA_SUCCESS)
        gc_warn("releasing the memory of the helper that ended (0x%llx): error %d", (unsigned long long)a->addr,
                (int)r);
    pthread_mutex_lock(&G.mu);
    a->h = m.h;
    a->id = m.id;
    pthread_mutex_unlock(&G.mu);
    return 0;
}

void gc_alloc_move_all(uint64_t *allocs, uint64_t *bytes, uint64_t *left, char *why, size_t whylen) {
    char w[256];
    for (rec *a = G.recs; a; a = a->next) {
        if (!a->mapped)
            continue;
        if (move_rec(a, w, sizeof w) == 0) {
            ++*allocs;
            *bytes += a->size;
        } else {
            if (!*left)
                snprintf(why, whylen, "%s", w);
            ++*left;
            pthread_mutex_lock(&G.mu);
            a->id = GC_ORPHAN_ID;
            pthread_mutex_unlock(&G.mu);
        }
    }
}

uint64_t gc_alloc_orphan_all(void) {
    uint64_t n = 0;
    pthread_mutex_lock(&G.mu);
    for (rec *a = G.recs; a; a = a->next, n++)
        a->id = GC_ORPHAN_ID;
    pthread_mutex_unlock(&G.mu);
    return n;
}

/* ---- fork ---- */

void gc_alloc_atfork_prepare(void) { pthread_mutex_lock(&G.mu); }
void gc_alloc_atfork_parent(void) { pthread_mutex_unlock(&G.mu); }

/* The child forgets the parent's memory. */
void gc_alloc_atfork_child(void) {
    pthread_mutex_init(&G.mu, NULL);
    G.recs = NULL;
    G.slabs = NULL;
    G.pending = NULL;
    atomic_store(&G.table.cur, NULL);
    G.table.retired = NULL;
    G.table.nretired = 0;
    G.live_buffers = G.live_bytes = G.helper_bytes = 0;
}

/*
 * Hot-path bookkeeping: the per-handle parameter layout cache and the scan
 * of a launch's parameters against the buffer table. Nothing here takes a
 * lock or makes a system call on the hot path (a kernel's first launch asks
 * the driver for its layout once).
 */
#include <stdlib.h>
#include <string.h>

#include "1_base.h"

/* ---- parameter layouts: open addressing, keys claimed by CAS, never removed ---- */

#define LCACHE_SLOTS 8192 /* power of two */
#define LCACHE_PROBES 64

typedef struct {
    _Atomic uintptr_t key;
    _Atomic(gc_layout *) val;
} lslot;

typedef struct lretired {
    gc_layout *l;
    struct lretired *next;
} lretired;

static lslot lcache[LCACHE_SLOTS];
static _Atomic uint64_t lgen = 1;
static _Atomic uint64_t lcount;
static _Atomic(lretired *) lretired_head;
static gc_paraminfo_fn q_func, q_kern;
static gc_owner_fn o_func, o_kern;

void gc_scan_set_query(gc_paraminfo_fn func, gc_paraminfo_fn kern) {
    q_func = func;
    q_kern = kern;
}

void gc_scan_set_owner(gc_owner_fn func, gc_owner_fn kern) {
    o_func = func;
    o_kern = kern;
}

/* The parameters the kernel h may write through, if its module's analysis decided it. A process that loaded no
 * PTX (PyTorch's kernels are all SASS) asks the driver nothing more than its layout. */
static void layout_writes(gc_layout *l, void *h, gc_owner_fn owner_of) {
    void *owner = NULL;
    const char *name = NULL;
    gc_kwrite k;
    if (owner_of && gc_writes_any() && owner_of(h, &owner, &name) == CUDA_SUCCESS && gc_writes_find(owner, name, &k)) {
        l->wknown = k.decided;
        l->wmask = k.written;
        l->indirect = !k.decided || !k.reads_decided;
    }
}

/* Whether kernel h is a peer sync operation (one of NCCL's), by its name. */
static int layout_sync(void *h) {
    // cppcheck-suppress uninitvar
    gc_owner_fn owners[2] = {o_func, o_kern};
    for (int k = 0; k < 2; k++) {
        void *owner = NULL;
        const char *name = NULL;
        if (owners[k] && owners[k](h, &owner, &name) == CUDA_SUCCESS)
            return gc_sync_kernel_name(name);
    }
    return 0;
}

static gc_layout *query_layout(void *h, uint64_t gen) {
    /* cppcheck 2.10 takes this array of two function pointers for uninitialized. */
    // cppcheck-suppress uninitvar
    gc_paraminfo_fn fns[2] = {q_func, q_kern};
    // cppcheck-suppress uninitvar
    gc_owner_fn owners[2] = {o_func, o_kern};
    for (int k = 0; k < 2; k++) {
        gc_paraminfo_fn fn = fns[k];
        if (!fn)
            continue;
        size_t cap = 16, n = 0;
        gc_layout *l = malloc(sizeof *l + cap * sizeof(gc_param));
        if (!l)
            return NULL;
        CUresult r = CUDA_SUCCESS;
        for (;;) {
            size_t off = 0, sz = 0;
            r = fn(h, n, &off, &sz);
            if (r != CUDA_SUCCESS)
                break;
            if (n == cap) {
                cap *= 2;
                gc_layout *nl = realloc(l, sizeof *l + cap * sizeof(gc_param));
                if (!nl) {
                    free(l);
                    return NULL;
                }
                l = nl;
            }
            l->p[n].off = (uint32_t)off;
            l->p[n++].size = (uint32_t)sz;
        }
        /* past the last parameter (or none): INVALID_VALUE; a CUkernel given to cuFuncGetParamInfo: INVALID_HANDLE */
        if (r == CUDA_ERROR_INVALID_VALUE) {
            l->gen = gen;
            l->n = (uint32_t)n;
            l->ok = 1;
            l->wknown = 0;
            l->indirect = 0;
            l->wmask = 0;
            l->sync = layout_sync(h);
            layout_writes(l, h, owners[k]);
            return l;
        }
        free(l);
    }
    gc_layout *l = calloc(1, sizeof *l);
    if (l) {
        l->gen = gen; /* no layout: cached as such, so the driver is asked once */
        l->sync = layout_sync(h);
    }
    return l;
}

static void retire_layout(gc_layout *l) {
    lretired *r = malloc(sizeof *r);
    if (!r)
        return; /* leaked rather than freed under a reader */
    r->l = l;
    lretired *head = atomic_load(&lretired_head);
    do
        r->next = head;
    while (!atomic_compare_exchange_weak(&lretired_head, &head, r));
}

const gc_layout *gc_layout_get(void *handle, bool *owned) {
    uintptr_t key = (uintptr_t)handle;
    uint64_t gen = atomic_load_explicit(&lgen, memory_order_acquire);
    *owned = false;
    if (key == 0)
        return NULL;
    size_t h = (size_t)((key >> 4) * 0x9E3779B97F4A7C15ULL) & (LCACHE_SLOTS - 1);
    for (int p = 0; p < LCACHE_PROBES; p++) {
        lslot *s = &lcache[(h + (size_t)p) & (LCACHE_SLOTS - 1)];
        uintptr_t k = atomic_load_explicit(&s->key, memory_order_acquire);
        if (k == 0) {
            uintptr_t zero = 0;
            if (!atomic_compare_exchange_strong(&s->key, &zero, key)) {
                if (zero != key)
                    continue; /* another key took the slot */
            }
            k = key;
        }
        if (k != key)
            continue;
        gc_layout *cur = atomic_load_explicit(&s->val, memory_order_acquire);
        if (cur && cur->gen == gen)
            return cur;
        gc_layout *l = query_layout(handle, gen);
        if (!l)
            return NULL;
        if (atomic_compare_exchange_strong(&s->val, &cur, l)) {
            if (cur)
                retire_layout(cur);
            else if (l->ok)
                atomic_fetch_add(&lcount, 1);
            return l;
        }
        /* someone else stored one meanwhile: use ours for this launch only */
        *owned = true;
        return l;
    }
    /* cache full along this probe sequence: ask each time */
    gc_layout *l = query_layout(handle, gen);
    *owned = l != NULL;
    return l;
}

void gc_layout_invalidate(void) { atomic_fetch_add(&lgen, 1); }

/* Every process counts NCCL's launches, not only one that shares memory: the ranks of a job on different hosts
 * share none and still wait for each other in their collectives (a job checkpoint holds them all at one count). A
 * launch of a kernel seen before costs a lookup in the layout cache. */
bool gc_launch_sync(void *f) {
    bool owned;
    const gc_layout *l = gc_layout_get(f, &owned);
    bool s = l && l->sync;
    if (owned)
        free((void *)l);
    return s;
}

void gc_layout_reclaim(void) {
    lretired *r = atomic_exchange(&lretired_head, NULL);
    while (r) {
        lretired *n = r->next;
        free(r->l);
        free(r);
        r = n;
    }
}

uint64_t gc_layout_count(void) { return atomic_load(&lcount); }

void gc_layout_reset(void) {
    for (size_t i = 0; i < LCACHE_SLOTS; i++) {
        gc_layout *l = atomic_load(&lcache[i].val);
        free(l);
        atomic_store(&lcache[i].val, NULL);
        atomic_store(&lcache[i].key, 0);
    }
    gc_layout_reclaim();
    atomic_store(&lcount, 0);
}

/* ---- scanning ---- */

/* The packed parameter buffer of a launch's `extra` and its size (NULL, 0 if none). */
static void extra_buffer(void **extra, void **buf, size_t *size) {
    for (size_t i = 0; i < 64 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            *buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
            memcpy(size, extra[i + 1], sizeof *size);
    }
}

unsigned gc_scan_words(const gc_btab *s, const void *p, size_t len) {
    unsigned hits = 0;
    if (!p || s->n == 0)
        return 0;
    const unsigned char *b = p;
    /* The pointers of one launch mostly point into a few buffers: the last
     * buffer hit is checked before searching the table. */
    uint64_t last_lo = 1, last_hi = 0;
    for (size_t off = 0; off + 8 <= len; off += 8) {
        uint64_t w;
        memcpy(&w, b + off, 8);
        if (w < s->lo || w >= s->hi)
            continue;
        if (w >= last_lo && w < last_hi) {
            hits++;
            continue;
        }
        const gc_buf *f = gt_find(s, w);
        if (f) {
            hits++;
            last_lo = f->addr;
            last_hi = f->addr + f->size;
        }
    }
    return hits;
}

unsigned gc_scan_launch(const gc_btab *s, void *f, void **kernelParams, void **extra, size_t *words) {
    unsigned hits = 0;
    size_t bytes = 0;
    gc_stat_add(STAT_LAUNCHES, 1);
    gc_stat_add(STAT_SCANNED, 1);
    if (kernelParams) {
        bool owned;
        const gc_layout *l = gc_layout_get(f, &owned);
        if (!l || !l->ok) {
            gc_stat_add(STAT_NO_LAYOUT, 1);
        } else {
            for (uint32_t i = 0; i < l->n; i++) {
                hits += gc_scan_words(s, kernelParams[i], l->p[i].size);
                bytes += l->p[i].size;
            }
        }
        if (owned)
            free((void *)l);
    } else if (extra) {
        void *buf = NULL;
        size_t size = 0;
        extra_buffer(extra, &buf, &size);
        if (buf) {
            hits += gc_scan_words(s, buf, size);
            bytes += size;
        }
    }
    if (words)
        *words = bytes / 8;
    if (hits) {
        gc_stat_add(STAT_LAUNCH_HITS, 1);
        gc_stat_add(STAT_PTR_WORDS, hits);
    }
    return hits;
}

static void each_word(const void *p, size_t len, gc_word_fn fn, void *arg) {
    if (!p)
        return;
    const unsigned char *b = p;
    for (size_t off = 0; off + 8 <= len; off += 8) {
        uint64_t w;
        memcpy(&w, b + off, 8);
        fn(w, arg);
    }
}

/* Whether parameter i of a launch with layout l is to be scanned: only one the kernel may write through, where
 * that is known (otherwise all). */
static bool param_wanted(const gc_layout *l, uint32_t i) { return !l->wknown || i >= 64 || (l->wmask >> i) & 1u; }

bool gc_scan_each(void *f, void **kernelParams, void **extra, bool writes_only, gc_word_fn fn, void *arg,
                  bool *indirect) {
    bool owned;
    const gc_layout *l = gc_layout_get(f, &owned);
    bool ok = l && l->ok;
    if (indirect)
        *indirect = ok && l->indirect;
    bool narrow = writes_only && ok && l->wknown;
    bool read = true; /* no parameters */
    if (kernelParams) {
        if (ok)
            for (uint32_t i = 0; i < l->n; i++)
                if (!writes_only || param_wanted(l, i))
                    each_word(kernelParams[i], l->p[i].size, fn, arg);
        read = ok;
    } else if (extra) {
        void *buf = NULL;
        size_t size = 0;
        extra_buffer(extra, &buf, &size);
        if (buf && narrow) {
            /* The packed buffer lays the parameters out as the layout says: only those written through. */
            for (uint32_t i = 0; i < l->n; i++)
                if (param_wanted(l, i) && (size_t)l->p[i].off + l->p[i].size <= size)
                    each_word((const char *)buf + l->p[i].off, l->p[i].size, fn, arg);
        } else {
            each_word(buf, size, fn, arg);
        }
        read = buf != NULL || size == 0;
    }
    if (owned)
        free((void *)l);
    return read;
}

/* ---- sampling ---- */

__thread uint32_t gc_scan_wait __attribute__((tls_model("initial-exec")));

uint32_t gc_scan_interval(size_t words) {
    if (words > UINT32_MAX / GC_SCAN_LAUNCHES_PER_WORD)
        return UINT32_MAX;
    uint32_t n = (uint32_t)words * GC_SCAN_LAUNCHES_PER_WORD;
    return n > GC_SCAN_SAMPLE_MIN ? n : GC_SCAN_SAMPLE_MIN;
}

unsigned gc_scan_sample(const gc_btab *s, void *f, void **kernelParams, void **extra) {
    size_t words = 0;
    unsigned hits = gc_scan_launch(s, f, kernelParams, extra, &words);
    gc_scan_wait = gc_scan_interval(words) - 1;
    return hits;
}

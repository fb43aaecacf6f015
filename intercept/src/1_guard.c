/*
 * The copy-on-write window's table (1_base.h, "1_guard.c"): the guarded
 * regions the helper sent with Resume, each with one flag per chunk that is
 * still to be saved. Built by the control thread while the gate is closed,
 * read by any thread without a lock while the window is open; a replaced
 * table is freed at the next build (the gate is closed then: no reader).
 */
#include <stdlib.h>
#include <string.h>

#include "1_base.h"

typedef struct {
    uint64_t addr, size;
    uint32_t nchunks;
    bool vmm;
    _Atomic bool touched;
    _Atomic uint8_t *pending; /* 1: not saved yet */
} guard_region;

typedef struct guard_table {
    uint64_t chunk;
    size_t n;
    struct guard_table *retired;
    guard_region r[];
} guard_table;

static _Atomic(guard_table *) cur;
static guard_table *retired;

static void free_table(guard_table *t) {
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        free((void *)t->r[i].pending);
    free(t);
}

static int by_addr(const void *a, const void *b) {
    const guard_region *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* A table no thread may read any more (the gate is closed) or may still (retired): the list of the latter. */
static void retire(guard_table *t) {
    if (t) {
        t->retired = retired;
        retired = t;
    }
}

int gc_guard_build(const gc_guard_region *regs, size_t n, uint64_t chunk) {
    /* Built while the gate is closed: no thread reads the tables replaced before. */
    while (retired) {
        guard_table *next = retired->retired;
        free_table(retired);
        retired = next;
    }
    if (chunk == 0)
        return -1;
    guard_table *t = calloc(1, sizeof *t + n * sizeof(guard_region));
    if (!t)
        return -1;
    t->chunk = chunk;
    for (size_t i = 0; i < n; i++) {
        guard_region *g = &t->r[t->n];
        g->addr = regs[i].addr;
        g->size = regs[i].size;
        g->vmm = regs[i].vmm;
        uint64_t nc = (regs[i].size + chunk - 1) / chunk;
        if (nc == 0 || nc > UINT32_MAX)
            continue;
        g->nchunks = (uint32_t)nc;
        g->pending = calloc(nc, 1);
        if (!g->pending) {
            free_table(t);
            return -1;
        }
        for (uint64_t c = 0; c < nc; c++)
            if (c / 8 < regs[i].nbits && (regs[i].bits[c / 8] >> (c % 8)) & 1)
                atomic_store_explicit(&g->pending[c], 1, memory_order_relaxed);
        t->n++;
    }
    qsort(t->r, t->n, sizeof t->r[0], by_addr);
    retire(atomic_exchange(&cur, t));
    return 0;
}

void gc_guard_drop(void) { retire(atomic_exchange(&cur, NULL)); /* readers may still hold it */ }

/* The region holding addr, or NULL. */
static const guard_region *find(const guard_table *t, uint64_t addr) {
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->r[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    const guard_region *g = &t->r[lo - 1];
    return addr - g->addr < g->size ? g : NULL;
}

bool gc_guard_region_of(uint64_t addr, uint64_t *base, uint64_t *size) {
    const guard_table *t = atomic_load_explicit(&cur, memory_order_acquire);
    if (!t)
        return false;
    const guard_region *g = find(t, addr);
    if (!g)
        return false;
    /* The application's VMM mappings back to back (in one reserved range, as PyTorch's expandable segments
     * make them) are one array to a kernel: a pointer into one may reach them all. (Separate allocations
     * that happen to be adjacent are not: indexing from one into another is undefined.) */
    const guard_region *lo = g, *hi = g;
    while (g->vmm && lo > t->r && (lo - 1)->vmm && (lo - 1)->addr + (lo - 1)->size == lo->addr)
        lo--;
    while (g->vmm && hi + 1 < t->r + t->n && (hi + 1)->vmm && hi->addr + hi->size == (hi + 1)->addr)
        hi++;
    *base = lo->addr;
    *size = hi->addr + hi->size - lo->addr;
    return true;
}

size_t gc_guard_pending(uint64_t lo, uint64_t hi, gc_range *out, size_t max) {
    const guard_table *t = atomic_load_explicit(&cur, memory_order_acquire);
    if (!t || hi <= lo)
        return 0;
    size_t n = 0;
    /* the first region that may overlap: the one holding lo, else the first starting after it */
    size_t i = 0, l = 0, h = t->n;
    while (l < h) {
        size_t mid = (l + h) / 2;
        if (t->r[mid].addr + t->r[mid].size <= lo)
            l = mid + 1;
        else
            h = mid;
    }
    for (i = l; i < t->n && t->r[i].addr < hi; i++) {
        const guard_region *g = &t->r[i];
        uint64_t a = lo > g->addr ? lo - g->addr : 0;
        uint64_t b = hi - g->addr < g->size ? hi - g->addr : g->size;
        for (uint64_t c = a / t->chunk; c * t->chunk < b; c++) {
            if (!atomic_load_explicit(&g->pending[c], memory_order_relaxed))
                continue;
            uint64_t s = g->addr + c * t->chunk;
            uint64_t e = s + t->chunk < g->addr + g->size ? s + t->chunk : g->addr + g->size;
            if (n > 0 && out[n - 1].addr + out[n - 1].size == s) {
                out[n - 1].size = e - out[n - 1].addr;
                continue;
            }
            if (n == max)
                return n + 1; /* more than max: the caller saves the whole span */
            out[n].addr = s;
            out[n].size = e - s;
            n++;
        }
    }
    return n;
}

void gc_guard_saved(uint64_t lo, uint64_t hi) {
    const guard_table *t = atomic_load_explicit(&cur, memory_order_acquire);
    if (!t || hi <= lo)
        return;
    for (size_t i = 0; i < t->n; i++) {
        const guard_region *g = &t->r[i];
        if (g->addr >= hi || g->addr + g->size <= lo)
            continue;
        uint64_t a = lo > g->addr ? lo - g->addr : 0;
        uint64_t b = hi - g->addr < g->size ? hi - g->addr : g->size;
        for (uint64_t c = a / t->chunk; c * t->chunk < b; c++)
            atomic_store_explicit(&g->pending[c], 0, memory_order_relaxed);
    }
}

bool gc_guard_any(uint64_t *lo, uint64_t *hi) {
    const guard_table *t = atomic_load_explicit(&cur, memory_order_acquire);
    if (!t || t->n == 0)
        return false;
    *lo = t->r[0].addr;
    *hi = t->r[t->n - 1].addr + t->r[t->n - 1].size;
    return true;
}

/* The first touch of each region, in order: appended once per region (the flag's exchange), under a mutex. */
#define TOUCH_MAX 65536
static pthread_mutex_t touch_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *touch;
static size_t ntouch;

void gc_guard_touch(uint64_t addr) {
    guard_table *t = atomic_load_explicit(&cur, memory_order_acquire);
    if (!t)
        return;
    guard_region *g = (guard_region *)find(t, addr);
    if (!g || atomic_load_explicit(&g->touched, memory_order_relaxed) || atomic_exchange(&g->touched, true))
        return;
    pthread_mutex_lock(&touch_mu);
    if (!touch)
        touch = calloc(TOUCH_MAX, sizeof *touch);
    if (touch && ntouch < TOUCH_MAX)
        touch[ntouch++] = g->addr;
    pthread_mutex_unlock(&touch_mu);
}

void gc_guard_touch_reset(void) {
    pthread_mutex_lock(&touch_mu);
    ntouch = 0;
    pthread_mutex_unlock(&touch_mu);
}

size_t gc_guard_touch_order(uint64_t *out, size_t max) {
    pthread_mutex_lock(&touch_mu);
    size_t n = ntouch < max ? ntouch : max;
    if (out && n)
        memcpy(out, touch, n * sizeof *out);
    pthread_mutex_unlock(&touch_mu);
    return n;
}

/*
 * The buffer table and the slab bitmap. No driver calls, no I/O: unit-tested
 * by tests/intercept/c/unit.c.
 *
 * The table is an immutable sorted array; a writer (holding its caller's
 * mutex) builds a new array and swaps the pointer with a release store, so
 * readers on the hot path search whatever snapshot they loaded without a lock.
 * Replaced arrays are kept on a retired list until gt_reclaim, which the
 * caller runs only when no reader can hold one (quiesced, or no other call in
 * progress).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "1_base.h"

static gc_btab *btab_alloc(size_t n) {
    gc_btab *s = malloc(sizeof *s + n * sizeof(gc_buf));
    if (!s)
        return NULL;
    s->retired_next = NULL;
    s->n = n;
    s->lo = UINT64_MAX;
    s->hi = 0;
    return s;
}

static void btab_bounds(gc_btab *s) {
    s->lo = UINT64_MAX;
    s->hi = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->v[i].addr < s->lo)
            s->lo = s->v[i].addr;
        if (s->v[i].addr + s->v[i].size > s->hi)
            s->hi = s->v[i].addr + s->v[i].size;
    }
}

int gt_init(gc_table *t) {
    gc_btab *s = btab_alloc(0);
    if (!s)
        return -1;
    atomic_store(&t->cur, s);
    t->retired = NULL;
    t->nretired = 0;
    return 0;
}

static void publish(gc_table *t, gc_btab *old, gc_btab *s) {
    btab_bounds(s);
    atomic_store_explicit(&t->cur, s, memory_order_release);
    old->retired_next = t->retired;
    t->retired = old;
    t->nretired++;
}

/* Index of the first entry with addr >= a. */
static size_t lower(const gc_btab *s, uint64_t a) {
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->v[mid].addr < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int gt_insert(gc_table *t, const gc_buf *b) {
    gc_btab *old = atomic_load(&t->cur);
    size_t i = lower(old, b->addr);
    uint64_t end = b->addr + (b->size ? b->size : 1);
    if (i < old->n && old->v[i].addr < end)
        return -2;
    if (i > 0 && old->v[i - 1].addr + (old->v[i - 1].size ? old->v[i - 1].size : 1) > b->addr)
        return -2;
    gc_btab *s = btab_alloc(old->n + 1);
    if (!s)
        return -1;
    memcpy(s->v, old->v, i * sizeof(gc_buf));
    s->v[i] = *b;
    memcpy(s->v + i + 1, old->v + i, (old->n - i) * sizeof(gc_buf));
    publish(t, old, s);
    return 0;
}

int gt_remove(gc_table *t, uint64_t addr, gc_buf *out) {
    gc_btab *old = atomic_load(&t->cur);
    size_t i = lower(old, addr);
    if (i >= old->n || old->v[i].addr != addr)
        return -1;
    gc_btab *s = btab_alloc(old->n - 1);
    if (!s)
        return -1;
    if (out)
        *out = old->v[i];
    memcpy(s->v, old->v, i * sizeof(gc_buf));
    memcpy(s->v + i, old->v + i + 1, (old->n - i - 1) * sizeof(gc_buf));
    publish(t, old, s);
    return 0;
}

int gt_relabel(gc_table *t, uint64_t (*fn)(const gc_buf *b, void *arg), void *arg) {
    gc_btab *old = atomic_load(&t->cur);
    size_t i = 0;
    while (i < old->n && fn(&old->v[i], arg) == old->v[i].alloc_id)
        i++;
    if (i == old->n)
        return 0;
    gc_btab *s = btab_alloc(old->n);
    if (!s)
        return -1;
    memcpy(s->v, old->v, old->n * sizeof(gc_buf));
    for (; i < s->n; i++)
        s->v[i].alloc_id = fn(&old->v[i], arg);
    publish(t, old, s);
    return 0;
}

void gt_reclaim(gc_table *t) {
    while (t->retired) {
        gc_btab *n = t->retired->retired_next;
        free(t->retired);
        t->retired = n;
    }
    t->nretired = 0;
}

void gt_destroy(gc_table *t) {
    gt_reclaim(t);
    free(atomic_load(&t->cur));
    atomic_store(&t->cur, NULL);
}

const gc_buf *gt_find(const gc_btab *s, uint64_t a) {
    if (a < s->lo || a >= s->hi)
        return NULL;
    /* last entry with addr <= a */
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->v[mid].addr <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    const gc_buf *b = &s->v[lo - 1];
    return a - b->addr < (b->size ? b->size : 1) ? b : NULL;
}

/* ---- slabs ---- */

gc_slab *slab_new(uint64_t base, uint64_t size) {
    if (size < GC_SLAB_UNIT || size / GC_SLAB_UNIT > UINT32_MAX)
        return NULL;
    gc_slab *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->base = base;
    s->size = size;
    s->nunits = (uint32_t)(size / GC_SLAB_UNIT);
    s->bits = calloc((s->nunits + 63) / 64, sizeof(uint64_t));
    if (!s->bits) {
        free(s);
        return NULL;
    }
    return s;
}

void slab_free(gc_slab *s) {
    if (!s)
        return;
    free(s->bits);
    free(s);
}

static bool bit(const gc_slab *s, uint32_t i) { return (s->bits[i / 64] >> (i % 64)) & 1; }

static void set_bits(gc_slab *s, uint32_t from, uint32_t n, bool on) {
    for (uint32_t i = from; i < from + n; i++) {
        if (on)
            s->bits[i / 64] |= 1ULL << (i % 64);
        else
            s->bits[i / 64] &= ~(1ULL << (i % 64));
    }
}

int64_t slab_take(gc_slab *s, uint64_t size) {
    if (size == 0)
        size = 1;
    uint64_t need64 = (size + GC_SLAB_UNIT - 1) / GC_SLAB_UNIT;
    if (need64 > s->nunits - s->used)
        return -1;
    uint32_t need = (uint32_t)need64;
    uint32_t run = 0;
    for (uint32_t i = 0; i < s->nunits; i++) {
        if (run == 0 && i % 64 == 0 && s->bits[i / 64] == ~0ULL) {
            i += 63; /* a full word: skip it */
            continue;
        }
        if (bit(s, i)) {
            run = 0;
            continue;
        }
        if (++run == need) {
            uint32_t start = i + 1 - need;
            set_bits(s, start, need, true);
            s->used += need;
            return (int64_t)start * (int64_t)GC_SLAB_UNIT;
        }
    }
    return -1;
}

void slab_give(gc_slab *s, uint64_t off, uint64_t size) {
    if (size == 0)
        size = 1;
    uint32_t start = (uint32_t)(off / GC_SLAB_UNIT);
    uint32_t n = (uint32_t)((size + GC_SLAB_UNIT - 1) / GC_SLAB_UNIT);
    if (start >= s->nunits || n > s->nunits - start)
        return;
    for (uint32_t i = start; i < start + n; i++)
        if (bit(s, i))
            s->used--;
    set_bits(s, start, n, false);
}

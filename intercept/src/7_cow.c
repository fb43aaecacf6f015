/*
 * Windows (7_cow.h): copy-on-write, and a restore's loading. While a
 * copy-on-write window is open, a call that may write
 * device memory first has the helper save the chunks of its write set that
 * are still pending (SaveFirst on the calls connection), then goes ahead:
 * the image gets every chunk as it was at the quiesce point. The write set
 * of a launch is every guarded region a word of its parameters points into
 * (a pointer anywhere in a region may reach all of it); a kernel that
 * writes through a pointer it loaded from memory escapes this, and the
 * helper's hash check of each saved chunk catches it (the window fails,
 * and with it the checkpoint, never the application).
 *
 * A loading window (a restore that loads on demand) guards the other way
 * round: a call that may read or write memory not loaded yet first has the
 * helper load it (LoadFirst), and waits. A launch's set is then every
 * region its parameters point into, whatever it writes; a kernel whose PTX
 * analysis found it may reach memory in other ways (a pointer it loaded
 * from memory, a call) waits for everything. A kernel without PTX (SASS
 * only) counts as touching what its parameters point into. The first touch
 * of each region is recorded, for the next restore's load order.
 */
#include <stdio.h>

#include "7_cow.h"
#include "2_link.h"
#include "6_modules.h"

/* The window open is a restore's loading (set while the gate is closed, read by calls in the window). */
static _Atomic bool loading;

/* The helper did not answer: the window is over for this process (its checkpoint fails without it). */
static void give_up(void) {
    gc_warn(
        "copy-on-write window: the helper did not answer SaveFirst; writes go ahead unguarded (the "
        "checkpoint being taken fails)");
    gc_gate_window(false);
}

/* The helper could not load what a call waits for: that memory never comes, and the process must not run on. */
static void load_failed(const char *why) {
    char msg[1200];
    snprintf(msg, sizeof msg, "its GPU memory did not load after a restore on demand: %s", why);
    gc_state_lost(msg);
}

/* Saves (or, loading, loads) the pending chunks of [lo, hi), in one request (the whole span if they are too many
 * ranges). */
static void save_span(uint64_t lo, uint64_t hi) {
    gc_range rs[GC_SAVE_FIRST_MAX];
    size_t n = gc_guard_pending(lo, hi, rs, GC_SAVE_FIRST_MAX);
    if (n == 0)
        return;
    if (n > GC_SAVE_FIRST_MAX) {
        rs[0].addr = lo;
        rs[0].size = hi - lo;
        n = 1;
    }
    if (atomic_load_explicit(&loading, memory_order_relaxed)) {
        char why[1024];
        if (gc_link_load_first(rs, n, false, why, sizeof why) < 0)
            load_failed(why);
    } else if (gc_link_save_first(rs, n) < 0) {
        give_up();
        return;
    }
    for (size_t i = 0; i < n; i++)
        gc_guard_saved(rs[i].addr, rs[i].addr + rs[i].size);
}

void gc_cow_write(uint64_t dst, uint64_t n) {
    if (n == 0 || dst + n < dst)
        return;
    if (atomic_load_explicit(&loading, memory_order_relaxed))
        gc_guard_touch(dst);
    save_span(dst, dst + n);
}

void gc_cow_read(uint64_t src, uint64_t n) {
    if (n == 0 || src + n < src || !atomic_load_explicit(&loading, memory_order_relaxed))
        return;
    gc_guard_touch(src);
    save_span(src, src + n);
}

void gc_cow_all(void) {
    uint64_t lo, hi;
    if (!gc_guard_any(&lo, &hi))
        return;
    if (atomic_load_explicit(&loading, memory_order_relaxed)) {
        gc_range none;
        if (gc_guard_pending(lo, hi, &none, 0) == 0)
            return; /* all in */
        char why[1024];
        if (gc_link_load_first(NULL, 0, true, why, sizeof why) < 0)
            load_failed(why);
        gc_guard_saved(lo, hi);
        return;
    }
    save_span(lo, hi);
}

#define LAUNCH_REGIONS 16

typedef struct {
    uint64_t base[LAUNCH_REGIONS], size[LAUNCH_REGIONS];
    int n;
    bool overflow;
} hits;

static void note_word(uint64_t w, void *arg) {
    hits *h = arg;
    uint64_t base, size;
    if (!gc_guard_region_of(w, &base, &size))
        return;
    if (atomic_load_explicit(&loading, memory_order_relaxed))
        gc_guard_touch(w);
    for (int i = 0; i < h->n; i++)
        if (h->base[i] == base)
            return;
    if (h->n == LAUNCH_REGIONS) {
        h->overflow = true;
        return;
    }
    h->base[h->n] = base;
    h->size[h->n] = size;
    h->n++;
}

void gc_cow_launch(void *f, void **kernelParams, void **extra) {
    hits h = {.n = 0};
    /* Loading, a launch waits for what it reads too, and for everything if it may reach memory its parameters do
     * not point into; a copy-on-write window counts only what it may write through (the hash check catches the
     * rest). */
    bool load = atomic_load_explicit(&loading, memory_order_relaxed), indirect = false;
    if (!gc_scan_each(f, kernelParams, extra, !load, note_word, &h, load ? &indirect : NULL) || indirect ||
        h.overflow) {
        gc_cow_all(); /* parameters it cannot read, or too many regions: everything it may reach */
        return;
    }
    for (int i = 0; i < h.n; i++)
        save_span(h.base[i], h.base[i] + h.size[i]);
}

/* The images the helper analyses at most (as it does): a larger one's kernels count as writing everything. */
#define MODULE_MAX (64u << 20)

void gc_cow_module(void *owner, const void *image) {
    if (!owner || !image || gc_link_state() != CONN_UP)
        return;
    size_t len = gc_module_image_size(image);
    if (len == 0 || len > MODULE_MAX || !gc_module_has_ptx(image, len))
        return;
    gc_kwrite *k = NULL;
    size_t n = 0;
    if (gc_link_analyze(image, len, &k, &n) == 0)
        gc_writes_add(owner, k, n);
}

void gc_cow_module_gone(void *owner) { gc_writes_drop(owner); }

int gc_cow_open(const gc_guard_region *regs, size_t n, uint64_t chunk, bool load) {
    if (gc_guard_build(regs, n, chunk) != 0)
        return -1;
    atomic_store(&loading, load);
    if (load)
        gc_guard_touch_reset();
    gc_gate_window(n > 0);
    return 0;
}

void gc_cow_close(void) {
    gc_gate_window(false);
    gc_guard_drop();
}

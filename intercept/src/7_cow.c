/*
 * Copy-on-write windows (7_cow.h). While one is open, a call that may write
 * device memory first has the helper save the chunks of its write set that
 * are still pending (SaveFirst on the calls connection), then goes ahead:
 * the image gets every chunk as it was at the quiesce point. The write set
 * of a launch is every guarded region a word of its parameters points into
 * (a pointer anywhere in a region may reach all of it); a kernel that
 * writes through a pointer it loaded from memory escapes this, and the
 * helper's hash check of each saved chunk catches it (the window fails,
 * and with it the checkpoint, never the application).
 */
#include "7_cow.h"
#include "2_link.h"
#include "6_modules.h"

/* The helper did not answer: the window is over for this process (its checkpoint fails without it). */
static void give_up(void) {
    gc_warn(
        "copy-on-write window: the helper did not answer SaveFirst; writes go ahead unguarded (the "
        "checkpoint being taken fails)");
    gc_gate_window(false);
}

/* Saves the pending chunks of [lo, hi), in one request (the whole span if they are too many ranges). */
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
    if (gc_link_save_first(rs, n) < 0) {
        give_up();
        return;
    }
    for (size_t i = 0; i < n; i++)
        gc_guard_saved(rs[i].addr, rs[i].addr + rs[i].size);
}

void gc_cow_write(uint64_t dst, uint64_t n) {
    if (n == 0 || dst + n < dst)
        return;
    save_span(dst, dst + n);
}

void gc_cow_all(void) {
    uint64_t lo, hi;
    if (gc_guard_any(&lo, &hi))
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
    if (!gc_scan_each(f, kernelParams, extra, note_word, &h) || h.overflow) {
        gc_cow_all(); /* parameters it cannot read, or too many regions: everything it may reach */
        return;
    }
    for (int i = 0; i < h.n; i++)
        save_span(h.base[i], h.base[i] + h.size[i]);
}

/* The images the helper reads at most (as it does): a larger one's kernels count as writing everything. */
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

int gc_cow_open(const gc_guard_region *regs, size_t n, uint64_t chunk) {
    if (gc_guard_build(regs, n, chunk) != 0)
        return -1;
    gc_gate_window(n > 0);
    return 0;
}

void gc_cow_close(void) {
    gc_gate_window(false);
    gc_guard_drop();
}

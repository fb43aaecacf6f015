/*
 * The base layer of libgpucr.so, the LD_PRELOAD interposer: what every layer
 * above uses, calling nothing above it. intercept/README.md has the map of
 * the layers (the number a file's name starts with); a file includes only the
 * headers of its own layer and of the layers below.
 *
 *   1_syms.h     the driver entry points cudadrv.h lacks; GC_SYMS, the hooked entry points
 *   1_log.c      logging (GPUCR_LOG)
 *   1_syms.c     the symbol table: the driver's entry points (GPUCR_LIBCUDA), the dlsym and
 *                cuGetProcAddress hooks that hand out the wrappers
 *   1_gate.c     the gate the wrappers pass and a checkpoint closes
 *   1_guard.c    a copy-on-write window's guarded regions and their pending chunks
 *   1_reasons.c  what makes this process not checkpointable
 *   1_table.c    buffer table (immutable sorted snapshots, swapped atomically) and the
 *                slab bitmap allocator; no driver calls, unit-tested by tests/intercept/c/unit.c
 *   1_scan.c     per-handle parameter layout cache (lock-free), launch parameter scanning,
 *                per-thread counters; driver calls only through function pointers
 *   1_writes.c   the parameters each kernel of a loaded module may write through (the
 *                helper's analysis of its PTX), by module or library handle
 *
 * docs/helper-protocol.md is the contract with the helper.
 */
#ifndef GPUCR_INTERCEPT_BASE_H
#define GPUCR_INTERCEPT_BASE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "1_syms.h"

#define GC_EXPORT __attribute__((visibility("default")))
#define GC_HIDDEN __attribute__((visibility("hidden")))

/* ---- 1_log.c ---- */
GC_HIDDEN void gc_log_init(void); /* GPUCR_LOG, from the constructor */
GC_HIDDEN void gc_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
GC_HIDDEN void gc_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Ends the process: its GPU memory is lost (why says how). */
GC_HIDDEN void gc_state_lost(const char *why) __attribute__((noreturn));
GC_HIDDEN extern int gc_log_debug;

/* ---- 1_syms.c ---- */
GC_HIDDEN void *gc_real(int idx);
GC_HIDDEN void gc_resolve(void);
/*
 * Whether the driver is served mode's library (intercept/served), which
 * exports GC_SERVED_DETACH and GC_SERVED_ATTACH: the process then holds no
 * driver state, and its context is a worker's. gc_driver_served_detach lets
 * the worker go before a dump (the library's calls then wait);
 * gc_driver_served_attach, once the process runs again (restored, or the
 * dump over), has the library take a worker and make its context there
 * again. Each: 0, or -1 where it could not (the library said why); 0 with a
 * driver.
 */
#define GC_SERVED_DETACH "gpucrServedDetach"
#define GC_SERVED_ATTACH "gpucrServedAttach"
#define GC_SERVED_SCRIPT "gpucrServedScript"
GC_HIDDEN bool gc_driver_served(void);
GC_HIDDEN int gc_driver_served_detach(void);
GC_HIDDEN int gc_driver_served_attach(void);
/* After a detach: the served library's template script (a sealed memfd), or -1 (it said why). */
GC_HIDDEN int gc_driver_served_script(void);

/* The driver's entry point, by name (resolved on first use). */
#define GC_REAL(name) ((__typeof__(&name))gc_real(SYM_##name))

/* ---- 1_gate.c: the gate ---- */
GC_HIDDEN void gc_gate_init(void); /* from the constructor */
/* 0; 1 while a copy-on-write window is open (the caller must check what it may write: 7_cow.h). */
GC_HIDDEN int gc_gate_enter(void);
GC_HIDDEN void gc_gate_window(bool open); /* opened while the gate is closed */
GC_HIDDEN void gc_gate_leave(void);
GC_HIDDEN int gc_gate_close(unsigned timeout_ms); /* 0 or -ETIMEDOUT (gate reopened) */
GC_HIDDEN void gc_gate_open(void);
GC_HIDDEN void gc_gate_reset(void);   /* fork child */
GC_HIDDEN size_t gc_gate_slots(void); /* threads' slots made so far (tests: exited threads' are reused) */
/* A condition variable whose timed waits run on CLOCK_MONOTONIC, and the deadline ms from now on that clock. */
GC_HIDDEN void gc_cond_init_monotonic(pthread_cond_t *cv);
GC_HIDDEN struct timespec gc_deadline_ms(unsigned ms);
/* Set in the control thread: the gate lets it through, and it never connects to the helper. */
GC_HIDDEN extern __thread int gc_in_control __attribute__((tls_model("initial-exec")));

/* ---- 1_sync.c: peer synchronization (processes that share memory, as NCCL's ranks) ---- */
/* The process shares memory with another (it exported or imported a helper allocation): its peer sync operations
 * are counted from then on. */
GC_HIDDEN extern _Atomic bool gc_sharing;
/* gc_gate_enter for a call that is a peer sync operation if op: it waits (outside the gate) while a hold keeps
 * such operations back, and counts itself once inside. */
GC_HIDDEN int gc_sync_enter(bool op);
/* gc_sync_enter for n operations at once (a launch of a CUDA graph with n of NCCL's kernels); n 0: gc_gate_enter. */
GC_HIDDEN int gc_sync_enter_n(uint64_t n);
/* A launch of NCCL's kernel was captured into graph: it counts when a graph made from it is launched. */
GC_HIDDEN void gc_sync_captured(const void *graph);
/* cuGraphInstantiate*: exec counts what its graph counted. */
GC_HIDDEN void gc_sync_instantiated(const void *exec, const void *graph);
/* The operations a launch of exec is: the NCCL launches captured into its graph. */
GC_HIDDEN uint64_t gc_sync_graph_ops(const void *exec);
/* cuGraphDestroy, cuGraphExecDestroy (exec): the handle is forgotten. */
GC_HIDDEN void gc_sync_graph_gone(const void *h, bool exec);
/* HoldSync: no operation beyond the count reached passes; returns that count. */
GC_HIDDEN uint64_t gc_sync_hold(void);
/* ReachSync: let operations pass until the count is target, then hold; 0 once there, -ETIMEDOUT, or -ERANGE (past
 * target already). */
GC_HIDDEN int gc_sync_reach(uint64_t target, unsigned timeout_ms);
GC_HIDDEN void gc_sync_release(void);
GC_HIDDEN uint64_t gc_sync_count(void);
GC_HIDDEN void gc_sync_reset(void); /* fork child: nothing shared, nothing held */
/* Whether a kernel named so is one of NCCL's (each launch a step of a collective all its ranks take). */
GC_HIDDEN bool gc_sync_kernel_name(const char *name);

/* ---- 1_reasons.c: why this process is not checkpointable ---- */
enum {
    GC_REASON_MANAGED = 1,
    GC_REASON_APP_VMM = 2, /* cuMemCreate passed through (unsupported prop, or no helper) */
    GC_REASON_LOCAL = 4,
    GC_REASON_CONTROL = 8,
    GC_REASON_FOREIGN = 16, /* the application imported a shareable handle the helper does not know */
    GC_REASON_ORPHAN = 32,  /* memory of a helper that ended, not moved into the next one's */
};
GC_HIDDEN void gc_note_reason(int reason);
GC_HIDDEN void gc_clear_reason(int reason); /* it no longer holds (the control connection is up again) */
/* The noted reasons in words into out (room for 7); returns their count. */
GC_HIDDEN int gc_reason_names(const char **out);
GC_HIDDEN void gc_reasons_reset(void); /* fork child */

/* ---- 1_guard.c: a copy-on-write window's regions and the chunks still to be saved ---- */
typedef struct {
    uint64_t addr, size;
    const uint8_t *bits; /* bit c of byte c/8: chunk c is pending */
    size_t nbits;        /* bytes of bits */
    bool vmm;            /* the application's own VMM mapping (back-to-back ones are one span to a kernel) */
} gc_guard_region;
typedef struct {
    uint64_t addr, size;
} gc_range;
/* The control thread, gate closed: a new table (the old one is freed); 0 or -1 (no memory). */
GC_HIDDEN int gc_guard_build(const gc_guard_region *regs, size_t n, uint64_t chunk);
GC_HIDDEN void gc_guard_drop(void); /* the window is over (freed at the next build) */
/* Lock-free, any thread: */
GC_HIDDEN bool gc_guard_region_of(uint64_t addr, uint64_t *base, uint64_t *size);
/* The pending chunks overlapping [lo, hi), merged into at most max ranges; max + 1 if there are more. */
GC_HIDDEN size_t gc_guard_pending(uint64_t lo, uint64_t hi, gc_range *out, size_t max);
GC_HIDDEN void gc_guard_saved(uint64_t lo, uint64_t hi);
GC_HIDDEN bool gc_guard_any(uint64_t *lo, uint64_t *hi); /* the span of every guarded region */
/* The region holding addr was touched: the first touch of each region is recorded, in order (a restore loading on
 * demand records the order for the next one). */
GC_HIDDEN void gc_guard_touch(uint64_t addr);
GC_HIDDEN void gc_guard_touch_reset(void); /* a new record (the gate is closed) */
/* The record: the touched regions' addresses in order into out (at most max); returns their count. */
GC_HIDDEN size_t gc_guard_touch_order(uint64_t *out, size_t max);

/* ---- 1_table.c: the buffer table ---- */

/* Kinds are the protocol's AllocKind values. */
enum { GC_KIND_MEM_ALLOC = 1, GC_KIND_PITCH = 2, GC_KIND_ASYNC = 3, GC_KIND_VMM = 4, GC_KIND_SLAB = 5 };

typedef struct gc_buf {
    uint64_t addr, size; /* what the application was handed */
    uint64_t alloc_id;   /* the helper allocation holding it; 0: local memory (fallback) */
    int32_t kind, dev;
} gc_buf;

typedef struct gc_btab {
    struct gc_btab *retired_next;
    uint64_t lo, hi; /* lowest start, highest end: a cheap filter for lookups */
    size_t n;
    gc_buf v[];
} gc_btab;

typedef struct gc_table {
    _Atomic(gc_btab *) cur; /* never NULL after gt_init */
    gc_btab *retired;       /* replaced snapshots; freed by gt_reclaim when nobody can read them */
    size_t nretired;
} gc_table;

/* Writers (gt_insert/gt_remove/gt_reclaim) are serialized by the caller's mutex. */
GC_HIDDEN int gt_init(gc_table *t);
GC_HIDDEN int gt_insert(gc_table *t, const gc_buf *b);            /* 0; -1 no memory; -2 overlaps */
GC_HIDDEN int gt_remove(gc_table *t, uint64_t addr, gc_buf *out); /* exact start; 0 or -1 */
/* Sets every entry's alloc_id to fn(entry) (one new snapshot if any changes). 0; -1 no memory. */
GC_HIDDEN int gt_relabel(gc_table *t, uint64_t (*fn)(const gc_buf *b, void *arg), void *arg);
GC_HIDDEN void gt_reclaim(gc_table *t);
GC_HIDDEN void gt_destroy(gc_table *t);
/* Lock-free: the buffer holding addr in snapshot s, or NULL. */
GC_HIDDEN const gc_buf *gt_find(const gc_btab *s, uint64_t addr);
static inline const gc_btab *gt_snap(gc_table *t) { return atomic_load_explicit(&t->cur, memory_order_acquire); }

/* ---- 1_table.c: the slab bitmap (256-byte units) ---- */
#define GC_SLAB_UNIT 256ULL

typedef struct gc_slab {
    uint64_t base, size; /* the slab's helper allocation as mapped here */
    uint32_t nunits, used;
    uint64_t *bits;
    void *owner; /* 4_alloc.c: its allocation record */
    struct gc_slab *next;
} gc_slab;

GC_HIDDEN gc_slab *slab_new(uint64_t base, uint64_t size);
GC_HIDDEN void slab_free(gc_slab *s);
GC_HIDDEN int64_t slab_take(gc_slab *s, uint64_t size); /* offset (256-aligned) or -1 */
GC_HIDDEN void slab_give(gc_slab *s, uint64_t off, uint64_t size);

/* ---- 1_scan.c: counters, layouts, scanning ---- */
enum gc_stat {
    STAT_ALLOCS,
    STAT_FREES,
    STAT_LOCAL_ALLOCS,
    STAT_LAUNCHES,
    STAT_LAUNCH_HITS,
    STAT_PTR_WORDS,
    STAT_NO_LAYOUT,
    STAT_COPIES,
    STAT_MEMSETS,
    STAT_MODULES,
    STAT_STREAMS,
    STAT_EVENTS,
    STAT_GATE_WAITS,
    STAT_SCANNED,
    STAT_HELPER_CALLS,
    STAT_MODULES_ANALYSED,
    STAT_REJOINS, /* reconnections to a new helper after the one before ended */
    STAT_N
};

GC_HIDDEN void gc_stat_add(enum gc_stat s, uint64_t v);
GC_HIDDEN void gc_stats_sum(uint64_t out[STAT_N]);
GC_HIDDEN void gc_stats_reset(void); /* fork child */

typedef CUresult (*gc_paraminfo_fn)(void *h, size_t idx, size_t *off, size_t *size);
/* cuFuncGetParamInfo and cuKernelGetParamInfo (either may be NULL). */
GC_HIDDEN void gc_scan_set_query(gc_paraminfo_fn func, gc_paraminfo_fn kern);

/* A kernel's name and the module or library handle it belongs to (cuFuncGetModule and cuFuncGetName, or
 * cuKernelGetLibrary and cuKernelGetName). */
typedef CUresult (*gc_owner_fn)(void *h, void **owner, const char **name);
GC_HIDDEN void gc_scan_set_owner(gc_owner_fn func, gc_owner_fn kern);

/* ---- 1_writes.c ---- */

/* One kernel the helper's analysis looked at: bit i of written, it may write global memory through parameter i;
 * through no other if decided. reads_decided: it also reads global memory only through its parameters. */
typedef struct {
    char *name;
    uint64_t written;
    bool decided, reads_decided;
} gc_kwrite;
GC_HIDDEN void gc_writes_add(void *owner, gc_kwrite *k, size_t n); /* takes k and its names over */
GC_HIDDEN void gc_writes_drop(void *owner);                        /* its module or library is unloaded */
/* The kernel's entry, copied into *k (its name not): false if its module was not analysed or it is absent. */
GC_HIDDEN bool gc_writes_find(void *owner, const char *name, gc_kwrite *k);
GC_HIDDEN bool gc_writes_any(void); /* some module's analysis is kept (one atomic load) */
GC_HIDDEN void gc_writes_reset(void);

typedef struct {
    uint32_t off, size;
} gc_param;

typedef struct gc_layout {
    uint64_t gen;
    uint32_t n;
    int ok;         /* 0: the driver gave no layout for this handle */
    int wknown;     /* wmask is known (the kernel's module was analysed and it was decided) */
    int indirect;   /* the analysis found it may touch memory not reached through its parameters */
    int sync;       /* a peer sync operation (one of NCCL's kernels: gc_sync_kernel_name) */
    uint64_t wmask; /* bit i: the kernel may write through parameter i */
    gc_param p[];
} gc_layout;

GC_HIDDEN const gc_layout *gc_layout_get(void *handle, bool *owned);
/* Whether a launch of f is a peer sync operation: the process shares memory and f is one of NCCL's kernels. */
GC_HIDDEN bool gc_launch_sync(void *f);
GC_HIDDEN void gc_layout_invalidate(void); /* module/library unloaded: handles may be reused */
GC_HIDDEN void gc_layout_reclaim(void);    /* no launch in progress */
GC_HIDDEN uint64_t gc_layout_count(void);
GC_HIDDEN void gc_layout_reset(void);

/*
 * Scans one launch's parameters against the snapshot; counts. Returns the pointer words found; *words (may be
 * NULL) gets the words scanned.
 */
GC_HIDDEN unsigned gc_scan_launch(const gc_btab *s, void *f, void **kernelParams, void **extra, size_t *words);

/*
 * Sampled scanning (GPUCR_SCAN=sample): a thread scans a launch, then lets gc_scan_interval(words) - 1 of its
 * launches pass unscanned. The interval is at least GC_SCAN_SAMPLE_MIN launches and grows with the words the
 * scan read (GC_SCAN_LAUNCHES_PER_WORD a word), so that a kernel with kilobytes of parameters costs a launch
 * no more on average than a kernel with a few: about a quarter of one word's scan (intercept/README.md).
 */
#define GC_SCAN_SAMPLE_MIN 64u
#define GC_SCAN_LAUNCHES_PER_WORD 4u
GC_HIDDEN uint32_t gc_scan_interval(size_t words);
extern GC_HIDDEN __thread uint32_t gc_scan_wait __attribute__((tls_model("initial-exec")));
/* Whether this launch of the thread is one to scan (counts down the launches still to pass). */
static inline bool gc_scan_due(void) {
    if (__builtin_expect(gc_scan_wait != 0, 1)) {
        gc_scan_wait--;
        return false;
    }
    return true;
}
/* A sampled scan: scans the launch and sets the thread's interval to the next one. */
GC_HIDDEN unsigned gc_scan_sample(const gc_btab *s, void *f, void **kernelParams, void **extra);
/* Calls fn with every 8-byte word of a launch's parameters (a window: every launch); with writes_only (a
 * copy-on-write window) of only the parameters the kernel may write through, where its module's analysis says
 * which. False if the parameters could not be read (no layout from the driver). *indirect (if not NULL): the
 * analysis found that the kernel may touch memory its parameters do not point into. */
typedef void (*gc_word_fn)(uint64_t w, void *arg);
GC_HIDDEN bool gc_scan_each(void *f, void **kernelParams, void **extra, bool writes_only, gc_word_fn fn, void *arg,
                            bool *indirect);
/* Scans a byte range word by word (8-byte aligned words). */
GC_HIDDEN unsigned gc_scan_words(const gc_btab *s, const void *p, size_t len);

#endif

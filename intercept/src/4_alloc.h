/*
 * Layer 4, helper allocations (4_alloc.c): device memory the helper
 * allocates, imported here at reserved addresses; slabs for small buffers;
 * deferred stream-ordered frees; the buffer table of everything the
 * application was handed, its own memory too. Calls the base layer, the link
 * and the devices.
 *
 * The bookkeeping lock (gc_alloc_lock) covers the buffer table, the
 * allocation records and the VMM layer's records; the calls marked "lock
 * held" expect it.
 */
#ifndef GPUCR_INTERCEPT_ALLOC_H
#define GPUCR_INTERCEPT_ALLOC_H

#include "1_base.h"

GC_HIDDEN void gc_alloc_lock(void);
GC_HIDDEN void gc_alloc_unlock(void);

/* Connecting to the helper (the control layer): GPUCR_SLAB_THRESHOLD, read (and warned about) first; the buffer
 * table, made before the calls connection is up. */
GC_HIDDEN void gc_alloc_configure(void);
GC_HIDDEN void gc_alloc_init(void);

/* Registered with the helper once (connection up, lost or detached): allocations are recorded. */
GC_HIDDEN bool gc_alloc_tracking(void);
/* The buffer table's current snapshot (lock-free; an empty one before the first connection). */
GC_HIDDEN const gc_btab *gc_buffers(void);

/*
 * The application's allocation of size bytes (GC_KIND_*), from the helper where it is connected (the caller
 * connected first). *use_real: the caller calls the driver's own allocator, then gc_track_local on success.
 */
GC_HIDDEN CUresult gc_alloc(CUdeviceptr *dptr, size_t size, int kind, bool *use_real);
GC_HIDDEN void gc_track_local(CUdeviceptr p, size_t size, int kind);
GC_HIDDEN int gc_free(CUdeviceptr p, bool async, CUstream stream, CUresult *res); /* 1 handled, 0 not ours */
GC_HIDDEN int gc_addr_range(CUdeviceptr p, CUdeviceptr *base, size_t *size);      /* 1 ours */
GC_HIDDEN bool gc_is_helper_mem(CUdeviceptr p);

/* Lock held: buffer table insert (0; -1 no memory; -2 overlaps) and remove, with the live counters; the bytes the
 * helper holds for this process. */
GC_HIDDEN int gc_buf_insert(const gc_buf *b);
GC_HIDDEN void gc_buf_remove(uint64_t addr);
GC_HIDDEN void gc_helper_bytes_add(int64_t d);

/* ---- for the control thread ---- */

typedef struct gc_alloc_info {
    uint64_t id, addr, size;
    int dev, kind;
} gc_alloc_info;

GC_HIDDEN void gc_alloc_flush_frees(void); /* the deferred frees, their work waited for */
GC_HIDDEN void gc_alloc_reclaim(void);     /* the table's retired snapshots: no reader left (quiesced) */
/* Lock held: Drop unmaps and releases every import; first error in *bad. */
GC_HIDDEN void gc_alloc_drop(CUresult *bad);
/*
 * Lock held: the Reimport entry for the allocation mapped at addr, which adopts id (*relabel set if it changed).
 * 1 done, 0 no allocation of ours there, -1 mismatch (msg), -2 driver error (msg).
 */
GC_HIDDEN int gc_alloc_reimport(uint64_t id, uint64_t addr, uint64_t size, int fd, char *msg, size_t msglen,
                                bool *relabel);
/*
 * Lock held: the buffers (table, deferred frees) take the alloc_ids their allocations adopted in a Reimport, by
 * address: ids of different allocations may have been swapped between frames. The application's VMM mappings
 * ask vmm_id_at (0: keep the id).
 */
GC_HIDDEN void gc_alloc_relabel(uint64_t (*vmm_id_at)(uint64_t addr));
GC_HIDDEN bool gc_alloc_all_mapped(void);                       /* lock held */
GC_HIDDEN size_t gc_alloc_list(gc_alloc_info *out, size_t max); /* lock held; the count; fills up to max */
GC_HIDDEN void gc_alloc_live(uint64_t *buffers, uint64_t *bytes, uint64_t *helper_bytes);

/*
 * Moving memory into a new helper's (7_control.c rejoins a helper after the one before ended). The gate is closed
 * and every context synchronized; no bookkeeping lock is held (these ask the helper).
 *
 * gc_move_new: new memory at the helper for an allocation of hsize bytes of kind on device dev (flags as
 * gc_link_alloc's), which will be mapped at addr, imported (*h) and mapped at a range of its own (*tmp), readable
 * and writable by the device. gc_move_copy: the bytes [va, va + size) copied into it at offset off, on the device.
 * gc_move_done: its range given up (the caller maps *h where the old memory was); gc_move_abandon: the new memory
 * given up altogether (released here, Free at the helper). 0, or -1 with why.
 */
typedef struct gc_move {
    uint64_t id, hsize, tmp;
    int dev;
    CUmemGenericAllocationHandle h;
} gc_move;
GC_HIDDEN int gc_move_new(int dev, int kind, unsigned flags, uint64_t hsize, uint64_t addr, gc_move *m, char *why,
                          size_t whylen);
GC_HIDDEN int gc_move_copy(const gc_move *m, uint64_t va, uint64_t size, uint64_t off, char *why, size_t whylen);
GC_HIDDEN int gc_move_sync(const gc_move *m, char *why, size_t whylen); /* the copies queued, done */
GC_HIDDEN void gc_move_done(gc_move *m);
GC_HIDDEN void gc_move_abandon(gc_move *m);

/*
 * The allocations of the helper that ended (every helper allocation recorded), each moved into the new helper's
 * memory at the same address (gc_move_*), adopting the new id. What was moved is added to *allocs and *bytes,
 * what could not be to *left (it stays where it is; a reason not to checkpoint), the first failure's words in why.
 */
GC_HIDDEN void gc_alloc_move_all(uint64_t *allocs, uint64_t *bytes, uint64_t *left, char *why, size_t whylen);
/* Every helper allocation recorded is the helper's that ended, none moved: its id becomes GC_ORPHAN_ID; the count. */
GC_HIDDEN uint64_t gc_alloc_orphan_all(void);

GC_HIDDEN void gc_alloc_atfork_prepare(void);
GC_HIDDEN void gc_alloc_atfork_parent(void);
GC_HIDDEN void gc_alloc_atfork_child(void);

#endif

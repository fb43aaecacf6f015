/*
 * Layer 7, windows (7_cow.c): what a call may touch while the helper works
 * on the process's memory behind it. In a copy-on-write window (a concurrent
 * checkpoint) the wrappers call these when gc_gate_enter says a window is
 * open, and each returns once the helper has saved the pending chunks the
 * call may write (SaveFirst). In a loading window (a restore on demand) the
 * same calls return once the helper has loaded the chunks the call may read
 * or write (LoadFirst), or end the process if that memory never comes.
 */
#ifndef GPUCR_INTERCEPT_COW_H
#define GPUCR_INTERCEPT_COW_H

#include "1_base.h"

/* A copy's or memset's destination: [dst, dst + n). */
GC_HIDDEN void gc_cow_write(uint64_t dst, uint64_t n);
/* A copy's source: [src, src + n) (only a loading window holds reads). */
GC_HIDDEN void gc_cow_read(uint64_t src, uint64_t n);
/* A launch: every guarded region its parameters point into (all of them if its parameters cannot be read); of
 * a kernel whose module's PTX was analysed, only the parameters it may write through. */
GC_HIDDEN void gc_cow_launch(void *f, void **kernelParams, void **extra);
/* A call whose writes are not known (a CUDA graph, a 2D/3D copy, a batch of memory operations): everything. */
GC_HIDDEN void gc_cow_all(void);
/* A module or library loaded from image (owner: the handle the load returned): if it carries PTX, the helper
 * analyses which parameters each kernel may write through (1_writes.c). Not under the gate: it waits for the
 * helper. */
GC_HIDDEN void gc_cow_module(void *owner, const void *image);
/* Its unload. */
GC_HIDDEN void gc_cow_module_gone(void *owner);
/* The control thread: Resume with a window (load: a restore's loading window), Unguard. */
GC_HIDDEN int gc_cow_open(const gc_guard_region *regs, size_t n, uint64_t chunk, bool load); /* gate closed; 0, -1 */
GC_HIDDEN void gc_cow_close(void);

#endif

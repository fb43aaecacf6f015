/*
 * Layer 7, copy-on-write windows (7_cow.c): what a call may write while a
 * concurrent checkpoint saves the process's memory behind it. The wrappers
 * call these when gc_gate_enter says a window is open; each returns once
 * the helper has saved the pending chunks the call may write (SaveFirst).
 */
#ifndef GPUCR_INTERCEPT_COW_H
#define GPUCR_INTERCEPT_COW_H

#include "1_base.h"

/* A copy's or memset's destination: [dst, dst + n). */
GC_HIDDEN void gc_cow_write(uint64_t dst, uint64_t n);
/* A launch: every guarded region its parameters point into (all of them if its parameters cannot be read). */
GC_HIDDEN void gc_cow_launch(void *f, void **kernelParams, void **extra);
/* A call whose writes are not known (a CUDA graph, a 2D/3D copy, a batch of memory operations): everything. */
GC_HIDDEN void gc_cow_all(void);
/* The control thread: Resume with a window, Unguard. */
GC_HIDDEN int gc_cow_open(const gc_guard_region *regs, size_t n, uint64_t chunk); /* gate closed; 0 or -1 */
GC_HIDDEN void gc_cow_close(void);

#endif

/*
 * Layer 5, the application's own VMM calls (5_vmm.c): cuMemCreate served from
 * the helper behind virtual allocation handles, and every call that takes or
 * gives such a handle; their part of Drop / Reimport / Snapshot. Calls the
 * layers below (base, link, devices, allocations: its records are under the
 * bookkeeping lock, gc_alloc_lock).
 *
 * The wrappers (8_interpose.c) pass the gate, then call these with the
 * driver's entry point fn (NULL where the wrapper goes on without one).
 */
#ifndef GPUCR_INTERCEPT_VMM_H
#define GPUCR_INTERCEPT_VMM_H

#include "1_base.h"
#include "4_alloc.h"

/* cuMemCreate: NULL if the helper can serve it with these arguments, else why not. */
GC_HIDDEN const char *gc_vmm_unservable(size_t size, const CUmemAllocationProp *p, unsigned long long flags);
/* The helper's memory behind a new virtual handle: CUDA_SUCCESS, GC_FALLBACK (the driver's own cuMemCreate
 * answers), or an error for the application. */
GC_HIDDEN CUresult gc_vmm_create(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop);
/* The driver's own cuMemCreate gave handle: not checkpointable (why: the helper could not serve it, said once). */
GC_HIDDEN void gc_vmm_created_by_driver(CUmemGenericAllocationHandle handle, size_t size,
                                        const CUmemAllocationProp *prop, unsigned long long flags, const char *why);
GC_HIDDEN CUresult gc_vmm_release(__typeof__(&cuMemRelease) fn, CUmemGenericAllocationHandle handle);
GC_HIDDEN CUresult gc_vmm_map(__typeof__(&cuMemMap) fn, CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags);
GC_HIDDEN CUresult gc_vmm_unmap(__typeof__(&cuMemUnmap) fn, CUdeviceptr ptr, size_t size);
GC_HIDDEN CUresult gc_vmm_set_access(__typeof__(&cuMemSetAccess) fn, CUdeviceptr ptr, size_t size,
                                     const CUmemAccessDesc *desc, size_t count);
GC_HIDDEN CUresult gc_vmm_retain(__typeof__(&cuMemRetainAllocationHandle) fn, CUmemGenericAllocationHandle *handle,
                                 void *addr);
GC_HIDDEN CUresult gc_vmm_get_props(__typeof__(&cuMemGetAllocationPropertiesFromHandle) fn, CUmemAllocationProp *prop,
                                    CUmemGenericAllocationHandle handle);
GC_HIDDEN CUresult gc_vmm_export(__typeof__(&cuMemExportToShareableHandle) fn, void *shareableHandle,
                                 CUmemGenericAllocationHandle handle, CUmemAllocationHandleType handleType,
                                 unsigned long long flags);
GC_HIDDEN CUresult gc_vmm_import(__typeof__(&cuMemImportFromShareableHandle) fn, CUmemGenericAllocationHandle *handle,
                                 void *osHandle, CUmemAllocationHandleType shHandleType);

/* ---- for the control thread, the bookkeeping lock held ---- */

/* Drop: unmaps and releases every allocation the helper can give back; first error in *bad. */
GC_HIDDEN void gc_vmm_drop(CUresult *bad);
/*
 * Reimport entry, matched by address (the allocation's announced offset-0 mapping); the record adopts id.
 * 1 done, 0 not a VMM allocation of ours, -1 mismatch (msg), -2 driver error (msg).
 */
GC_HIDDEN int gc_vmm_reimport(uint64_t id, uint64_t addr, uint64_t size, int fd, char *msg, size_t msglen);
/* The alloc_id of the VMM allocation mapped at addr (0: none). */
GC_HIDDEN uint64_t gc_vmm_id_at(uint64_t addr);
GC_HIDDEN bool gc_vmm_all_imported(void);
/* Whether addr lies in memory shared with another process (exported, or a peer's import); takes the lock. */
GC_HIDDEN bool gc_vmm_shared(uint64_t addr);
GC_HIDDEN size_t gc_vmm_list(gc_alloc_info *out, size_t max); /* returns the count; fills up to max */
/* The application's VMM allocations of the helper that ended, each moved into the new helper's memory
 * (gc_move_*) and mapped again where it was, with its access; counted as gc_alloc_move_all counts. The gate is
 * closed, the lock not held. */
GC_HIDDEN void gc_vmm_move_all(uint64_t *allocs, uint64_t *bytes, uint64_t *left, char *why, size_t whylen);
/* As gc_alloc_orphan_all, for the VMM records (peers' memory too); the count of the process's own. */
GC_HIDDEN uint64_t gc_vmm_orphan_all(void);
GC_HIDDEN void gc_vmm_atfork_child(void);

#endif

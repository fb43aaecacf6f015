/*
 * Layer 3, the devices (3_devices.c): the devices' UUIDs, by which the helper
 * knows them; the granularity of their allocations; the contexts that were
 * current at an allocation, which Drain synchronizes. Calls the base layer and
 * the link (the granularities the helper announced).
 */
#ifndef GPUCR_INTERCEPT_DEVICES_H
#define GPUCR_INTERCEPT_DEVICES_H

#include "1_base.h"

#define GC_MAX_CTX 64
/* The granularity when neither the helper nor the driver names one; the smallest slab. */
#define GC_DEFAULT_SLAB (2ULL << 20)

/* The device's UUID ("GPU-..."), asked of the driver once; NULL if it gives none. */
GC_HIDDEN const char *gc_dev_uuid(int dev);
/* The UUID asked before, or "". */
GC_HIDDEN const char *gc_dev_uuid_known(int dev);
/* The helper's granularity for the device, else the driver's minimum for exportable memory, else GC_DEFAULT_SLAB. */
GC_HIDDEN uint64_t gc_dev_granularity(int dev, const char *uuid);
/* Remembers the calling thread's context for Drain. */
GC_HIDDEN void gc_note_context(void);
/* The contexts remembered, into out[0..GC_MAX_CTX); their count. */
GC_HIDDEN int gc_contexts(CUcontext *out);

GC_HIDDEN void gc_dev_atfork_prepare(void);
GC_HIDDEN void gc_dev_atfork_parent(void);
GC_HIDDEN void gc_dev_atfork_child(void);
/* The GPUs behind the ordinals may have changed (a restore onto other GPUs): their UUIDs are asked again. */
GC_HIDDEN void gc_dev_forget_uuids(void);
/* After cuInit: every GPU the process sees, asked once now (a checkpointed process's driver answers no query). */
GC_HIDDEN void gc_dev_learn_all(void);
/* The UUIDs of the GPUs the process sees, by ordinal, into out (GC_MAX_DEV); their count, 0 if one is not known.
 * Asks the driver only for the count, which it answers even while the process is checkpointed. */
GC_HIDDEN size_t gc_dev_visible(char **out);
/*
 * After a restore put ordinal dev onto another GPU: that GPU's PCI bus id (from the helper) into out, and true.
 * The driver (580) still answers the bus id of the GPU the ordinal first stood for; NCCL and NVML users look a
 * GPU up by it. False when the ordinal has not moved.
 */
GC_HIDDEN bool gc_dev_moved_bus_id(int dev, char *out, size_t n);

#endif

/*
 * Why this process is not checkpointable: noted by any layer, reported in the
 * control thread's Snapshot (gpucr status).
 */
#include "1_base.h"

static _Atomic int reasons;

void gc_note_reason(int reason) { atomic_fetch_or(&reasons, reason); }

void gc_clear_reason(int reason) { atomic_fetch_and(&reasons, ~reason); }

int gc_reason_names(const char **out) {
    int r = atomic_load(&reasons), n = 0;
    if (r & GC_REASON_CONTROL)
        out[n++] = "control connection down";
    if (r & GC_REASON_LOCAL)
        out[n++] = "allocations that fell back to local memory";
    if (r & GC_REASON_MANAGED)
        out[n++] = "managed memory";
    if (r & GC_REASON_APP_VMM)
        out[n++] = "application VMM allocations";
    if (r & GC_REASON_FOREIGN)
        out[n++] = "imported foreign memory";
    if (r & GC_REASON_ORPHAN)
        out[n++] =
            "memory of a gpucr helper that ended, not moved into this one's (shared with other processes, or no "
            "room for the copy): restart the program to checkpoint it";
    return n;
}

void gc_reasons_reset(void) { atomic_store(&reasons, 0); }

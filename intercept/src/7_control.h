/*
 * Layer 7, the client and fork handling. 7_control.c: connecting to the
 * helper on first need (both connections, then the control thread that
 * serves the helper's requests over the layers below), and the fork handlers
 * that give a forked child a fresh client. 7_forkscrub.c: forked children
 * give up the driver's files (CRIU cannot dump them).
 */
#ifndef GPUCR_INTERCEPT_CONTROL_H
#define GPUCR_INTERCEPT_CONTROL_H

#include "1_base.h"

/* Connects on first need (never in the control thread). */
GC_HIDDEN void gc_client_ensure(void);
/* gc_client_ensure, then: is the calls connection up? */
GC_HIDDEN bool gc_client_up(void);
/* Registers the fork handlers (from the constructor). */
GC_HIDDEN void gc_fork_init(void);

/* 7_forkscrub.c, around the application's cuInit. */
GC_HIDDEN void gc_forkscrub_before_init(void);
GC_HIDDEN void gc_forkscrub_after_init(bool ok);

#endif

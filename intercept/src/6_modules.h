/*
 * Layer 6, modules (6_modules.c): the images of the modules and libraries the
 * application loads, noted (GPUCR_RECORD_MODULES: written out). Calls the
 * base layer only.
 */
#ifndef GPUCR_INTERCEPT_MODULES_H
#define GPUCR_INTERCEPT_MODULES_H

#include "1_base.h"

/* An image in memory (len 0: from its header: ELF, fatbin, or PTX text) or in a file. */
GC_HIDDEN void gc_note_module(const void *image, size_t len);
GC_HIDDEN void gc_note_module_file(const char *path);

GC_HIDDEN void gc_modules_atfork_prepare(void);
GC_HIDDEN void gc_modules_atfork_parent(void);
GC_HIDDEN void gc_modules_atfork_child(void);

#endif

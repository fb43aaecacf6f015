/*
 * Layer 6, modules (6_modules.c): the images of the modules and libraries the
 * application loads, logged (GPUCR_LOG=debug) or written out (GPUCR_RECORD_MODULES). Calls the
 * base layer only.
 */
#ifndef GPUCR_INTERCEPT_MODULES_H
#define GPUCR_INTERCEPT_MODULES_H

#include "1_base.h"

/*
 * An image in memory (len 0: from its header: ELF, fatbin, or PTX text) or in a file; nothing is read unless
 * GPUCR_LOG=debug or GPUCR_RECORD_MODULES asks for it.
 */
GC_HIDDEN void gc_note_module(const void *image, size_t len);
GC_HIDDEN void gc_note_module_file(const char *path);

/* The size of a module image in memory (ELF, fatbin, or PTX text), from its header. */
GC_HIDDEN size_t gc_module_image_size(const void *image);
/* Whether the image carries PTX: PTX text, or a fat binary with a PTX entry (SASS says nothing of what a kernel
 * writes). */
GC_HIDDEN bool gc_module_has_ptx(const void *image, size_t len);

#endif

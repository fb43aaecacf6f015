/* A look at a driver library apart from loading it for use (probe.go). */
#ifndef GPUCR_HELPER_CUDA_PROBE_H
#define GPUCR_HELPER_CUDA_PROBE_H
#include <stddef.h>
#include "gpucr/cudadrv.h"

/* dlopen path (RTLD_LAZY, its own handle, closed again but never unloaded): the file it loaded
 * (from cuDriverGetVersion's address), cuDriverGetVersion's answer (0 if
 * none), and for each of names whether it is defined. 0, or -1 with err
 * filled when the library does not open. */
int gs_probe(const char *path, char *file, size_t filelen, int *version, const char *const *names, int n, int *present,
             char *err, size_t errlen);
#endif

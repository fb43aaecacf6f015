#ifndef GPUCR_UFFD_PROBE_H
#define GPUCR_UFFD_PROBE_H
#include <stddef.h>
/* Touches pages anonymous pages registered with a userfaultfd that a thread serves one UFFDIO_COPY at a time: the
 * microseconds a fault took, on average, into *us_per_fault. 0, or -1 with why. */
int gpucr_uffd_probe(long pages, double *us_per_fault, char *why, size_t whylen);
#endif

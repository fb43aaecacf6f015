/*
 * Logging: lines on stderr, prefixed "gpucr: "; debug lines with GPUCR_LOG=debug;
 * and the end of a process whose GPU state is lost.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "1_base.h"

int gc_log_debug;

static void vlog(const char *fmt, va_list ap) {
    char line[1024];
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    fputs("gpucr: ", stderr);
    fwrite(line, 1, (size_t)n, stderr);
}

void gc_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void gc_debug(const char *fmt, ...) {
    if (!gc_log_debug)
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void gc_log_init(void) {
    const char *l = getenv("GPUCR_LOG");
    gc_log_debug = l && strcmp(l, "debug") == 0;
}

/* Every file that finds the process's GPU memory gone for good (a helper that
 * died while it was detached, a restore whose memory never loads) ends it
 * here: running on would compute on nothing or wait at the gate forever. */
void gc_state_lost(const char *why) {
    fprintf(stderr, "gpucr: this process's GPU state is lost: %s; aborting\n", why);
    abort();
}

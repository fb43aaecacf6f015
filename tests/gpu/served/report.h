/*
 * Where a probe writes its report: the file the environment variable env
 * names, with ".PID" added (the application's children inherit the probe,
 * and one file each keeps them from writing over one another), or stderr
 * when it names none or the file cannot be made.
 */
#ifndef GPUCR_PROBE_REPORT_H
#define GPUCR_PROBE_REPORT_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline FILE *report_open(const char *env) {
    const char *path = getenv(env);
    char file[4096];
    FILE *f = NULL;
    if (path) {
        snprintf(file, sizeof file, "%s.%d", path, (int)getpid());
        f = fopen(file, "w");
    }
    return f ? f : stderr;
}

static inline void report_close(FILE *f) {
    if (f != stderr)
        fclose(f);
}

#endif

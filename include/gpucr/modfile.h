/*
 * A module's image read from its file, for cuModuleLoad: the simulated
 * driver and served mode's library (which reads it in the application's
 * process, with the application's rights) both load it as cuModuleLoadData
 * would. The whole file and a NUL after it (PTX is text), at most max bytes.
 */
#ifndef GPUCR_MODFILE_H
#define GPUCR_MODFILE_H

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpucr/cudadrv.h"

/* CUDA_SUCCESS with *out malloc'd (the caller frees it); CUDA_ERROR_FILE_NOT_FOUND for a path that is not there
 * (the driver's answer), CUDA_ERROR_INVALID_VALUE for one that is no regular file or is larger than max,
 * CUDA_ERROR_OPERATING_SYSTEM for an open or read that fails otherwise, CUDA_ERROR_OUT_OF_MEMORY. */
static inline CUresult gc_read_module_file(const char *path, size_t max, void **out) {
    if (!path || !out)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ENOTDIR ? CUDA_ERROR_FILE_NOT_FOUND : CUDA_ERROR_OPERATING_SYSTEM;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 || (size_t)st.st_size > max) {
        close(fd);
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    if (got != n) { /* shorter than it said, or a read failed */
        free(buf);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    buf[n] = 0;
    *out = buf;
    return CUDA_SUCCESS;
}

#endif

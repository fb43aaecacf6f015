/*
 * Modules (6_modules.h): with GPUCR_LOG=debug every module or library image
 * the application loads is logged (its size and FNV-1a hash), and with
 * GPUCR_RECORD_MODULES=DIR written to DIR/module-<hash>.bin. Otherwise nothing
 * is read: hashing the images cost a start-up time in proportion to them
 * (PyTorch's and cuBLAS's fatbins are hundreds of megabytes), and a load
 * holds the gate while it is noted.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "1_base.h"
#include "6_modules.h"

size_t gc_module_image_size(const void *image) {
    const unsigned char *p = image;
    if (!p)
        return 0;
    if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F' && p[4] == 2) {
        uint64_t shoff, phoff;
        uint16_t shentsize, shnum, phentsize, phnum;
        memcpy(&phoff, p + 0x20, 8);
        memcpy(&shoff, p + 0x28, 8);
        memcpy(&phentsize, p + 0x36, 2);
        memcpy(&phnum, p + 0x38, 2);
        memcpy(&shentsize, p + 0x3a, 2);
        memcpy(&shnum, p + 0x3c, 2);
        uint64_t a = shoff + (uint64_t)shentsize * shnum, b = phoff + (uint64_t)phentsize * phnum;
        return (size_t)(a > b ? a : b);
    }
    uint32_t magic;
    memcpy(&magic, p, 4);
    if (magic == 0xBA55ED50u) { /* fatbin: magic, version(2), header size(2), fat size(8) */
        uint16_t hs;
        uint64_t fs;
        memcpy(&hs, p + 6, 2);
        memcpy(&fs, p + 8, 8);
        return (size_t)hs + (size_t)fs;
    }
    return strlen(image) + 1; /* PTX text */
}

bool gc_module_has_ptx(const void *image, size_t len) {
    const unsigned char *p = image;
    if (!p || len < 4)
        return false;
    uint32_t magic;
    memcpy(&magic, p, 4);
    if (magic != 0xBA55ED50u) { /* PTX text starts with a directive or a comment */
        size_t i = 0;
        while (i < len && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
            i++;
        return i < len && (p[i] == '.' || p[i] == '/');
    }
    /* Fat binary containers (magic, version 2 bytes, header size 2, entries' size 8), each a run of entries
     * (kind 2 bytes, 2 more, header size 4, padded payload size 4 ...): 1 is PTX. */
    size_t off = 0;
    while (off + 16 <= len) {
        memcpy(&magic, p + off, 4);
        if (magic != 0xBA55ED50u)
            break;
        uint16_t hs;
        uint64_t fs;
        memcpy(&hs, p + off + 6, 2);
        memcpy(&fs, p + off + 8, 8);
        if (hs < 16 || fs > len - off - hs)
            break;
        size_t e = off + hs, end = off + hs + (size_t)fs;
        while (e + 64 <= end) {
            uint16_t kind;
            uint32_t ehs, padded;
            memcpy(&kind, p + e, 2);
            memcpy(&ehs, p + e + 4, 4);
            memcpy(&padded, p + e + 8, 4);
            if (kind == 1)
                return true;
            if (ehs < 64 || (uint64_t)ehs + padded > end - e)
                break;
            e += (size_t)ehs + padded;
        }
        off = end;
    }
    return false;
}

static uint64_t fnv1a(const void *d, size_t n) {
    const unsigned char *p = d;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* GPUCR_RECORD_MODULES, read once; NULL: not set */
static const char *record_dir(void) {
    static const char *dir;
    static int read;
    if (!__atomic_load_n(&read, __ATOMIC_ACQUIRE)) {
        const char *d = getenv("GPUCR_RECORD_MODULES");
        dir = d && *d ? d : NULL;
        __atomic_store_n(&read, 1, __ATOMIC_RELEASE);
    }
    return dir;
}

static bool noting(void) { return gc_log_debug || record_dir(); }

void gc_note_module(const void *image, size_t len) {
    if (!image || !noting())
        return;
    if (len == 0)
        len = gc_module_image_size(image);
    uint64_t h = fnv1a(image, len);
    gc_debug("module image: %zu bytes, hash %016llx", len, (unsigned long long)h);
    const char *dir = record_dir();
    if (dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/module-%016llx.bin", dir, (unsigned long long)h);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            const unsigned char *p = image;
            size_t off = 0;
            while (off < len) {
                ssize_t n = write(fd, p + off, len - off);
                if (n <= 0 && errno != EINTR)
                    break;
                if (n > 0)
                    off += (size_t)n;
            }
            if (off < len)
                gc_warn("writing %s: %s", path, strerror(errno));
            close(fd);
        } else if (errno != EEXIST) {
            gc_warn("cannot record module image to %s: %s", path, strerror(errno));
        }
    }
}

void gc_note_module_file(const char *path) {
    if (!path || !noting())
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || st.st_size <= 0) {
        if (fd >= 0)
            close(fd);
        return;
    }
    size_t len = (size_t)st.st_size;
    unsigned char *buf = malloc(len);
    size_t got = 0;
    while (buf && got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (buf && got)
        gc_note_module(buf, got);
    free(buf);
}

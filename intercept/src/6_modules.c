/*
 * Modules (6_modules.h): every module or library image the application loads
 * is noted (its size and FNV-1a hash) and, with GPUCR_RECORD_MODULES=DIR,
 * written to DIR/module-<hash>.bin.
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

typedef struct modrec {
    uint64_t size, hash;
} modrec;

static struct {
    pthread_mutex_t mu;
    modrec *mods;
    size_t nmods, capmods;
} G = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
};

static size_t image_size(const void *image) {
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

static uint64_t fnv1a(const void *d, size_t n) {
    const unsigned char *p = d;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

void gc_note_module(const void *image, size_t len) {
    if (!image)
        return;
    if (len == 0)
        len = image_size(image);
    uint64_t h = fnv1a(image, len);
    pthread_mutex_lock(&G.mu);
    if (G.nmods == G.capmods) {
        size_t nc = G.capmods ? G.capmods * 2 : 16;
        modrec *m = realloc(G.mods, nc * sizeof *m);
        if (m) {
            G.mods = m;
            G.capmods = nc;
        }
    }
    if (G.nmods < G.capmods)
        G.mods[G.nmods++] = (modrec){len, h};
    pthread_mutex_unlock(&G.mu);
    gc_debug("module image: %zu bytes, hash %016llx", len, (unsigned long long)h);
    const char *dir = getenv("GPUCR_RECORD_MODULES");
    if (dir && *dir) {
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
    if (!path)
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

void gc_modules_atfork_prepare(void) { pthread_mutex_lock(&G.mu); }
void gc_modules_atfork_parent(void) { pthread_mutex_unlock(&G.mu); }

/* The child forgets the parent's modules. */
void gc_modules_atfork_child(void) {
    pthread_mutex_init(&G.mu, NULL);
    G.mods = NULL;
    G.nmods = G.capmods = 0;
}

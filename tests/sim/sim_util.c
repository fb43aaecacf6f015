/* Address-range sets and memfd helpers shared by the memory and checkpoint code. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

uint64_t sim_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* First index whose range starts above addr. */
static size_t rs_upper(const sim_rangeset *rs, uint64_t addr) {
    size_t lo = 0, hi = rs->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rs->v[mid].start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

ssize_t rs_find(const sim_rangeset *rs, uint64_t addr) {
    size_t i = rs_upper(rs, addr);
    if (i == 0)
        return -1;
    const sim_range *r = &rs->v[i - 1];
    return addr - r->start < r->len ? (ssize_t)(i - 1) : -1;
}

ssize_t rs_find_start(const sim_rangeset *rs, uint64_t start) {
    ssize_t i = rs_find(rs, start);
    return i >= 0 && rs->v[i].start == start ? i : -1;
}

bool rs_overlaps(const sim_rangeset *rs, uint64_t start, uint64_t len) {
    if (len == 0)
        return false;
    size_t i = rs_upper(rs, start);
    if (i > 0 && start - rs->v[i - 1].start < rs->v[i - 1].len)
        return true;
    return i < rs->n && rs->v[i].start < start + len;
}

int rs_insert(sim_rangeset *rs, sim_range r) {
    if (r.len == 0 || r.start + r.len < r.start || rs_overlaps(rs, r.start, r.len))
        return -1;
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? rs->cap * 2 : 16;
        sim_range *v = realloc(rs->v, cap * sizeof *v);
        if (!v)
            return -1;
        rs->v = v;
        rs->cap = cap;
    }
    size_t i = rs_upper(rs, r.start);
    memmove(&rs->v[i + 1], &rs->v[i], (rs->n - i) * sizeof *rs->v);
    rs->v[i] = r;
    rs->n++;
    return 0;
}

void rs_remove_at(sim_rangeset *rs, size_t i) {
    memmove(&rs->v[i], &rs->v[i + 1], (rs->n - i - 1) * sizeof *rs->v);
    rs->n--;
}

uint64_t rs_fit(const sim_rangeset *rs, uint64_t lo, uint64_t hi, uint64_t from, uint64_t size, uint64_t align) {
    uint64_t cand = sim_align_up(from > lo ? from : lo, align);
    size_t i = rs_upper(rs, cand);
    if (i > 0) {
        const sim_range *p = &rs->v[i - 1];
        if (cand < p->start + p->len)
            cand = sim_align_up(p->start + p->len, align);
    }
    for (; i < rs->n; i++) {
        const sim_range *r = &rs->v[i];
        if (r->start + r->len <= cand)
            continue;
        if (cand + size <= r->start)
            break;
        cand = sim_align_up(r->start + r->len, align);
    }
    if (cand < lo || cand + size > hi || cand + size < cand)
        return 0;
    return cand;
}

void rs_free(sim_rangeset *rs) {
    free(rs->v);
    rs->v = NULL;
    rs->n = rs->cap = 0;
}

int sim_memfd(const char *name, uint64_t size) {
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (ftruncate(fd, (off_t)size) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

int sim_map_exact(uint64_t addr, uint64_t len, int prot, int flags, int fd, off_t off) {
    void *want = (void *)(uintptr_t)addr;
    void *p = mmap(want, len, prot, flags | MAP_FIXED_NOREPLACE, fd, off);
    if (p == MAP_FAILED)
        return -errno;
    if (p != want) { /* kernels before 4.17 treat the flag as a mere hint */
        munmap(p, len);
        return -EEXIST;
    }
    return 0;
}

int sim_map_reserve_fixed(uint64_t addr, uint64_t len) {
    void *p =
        mmap((void *)(uintptr_t)addr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return p == MAP_FAILED ? -errno : 0;
}

static int ext_push(uint64_t **ext, size_t *n, size_t *cap, uint64_t off, uint64_t len) {
    if (*n + 2 > *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        uint64_t *v = realloc(*ext, c * sizeof *v);
        if (!v)
            return -ENOMEM;
        *ext = v;
        *cap = c;
    }
    (*ext)[(*n)++] = off;
    (*ext)[(*n)++] = len;
    return 0;
}

static int pread_full(int fd, unsigned char *buf, uint64_t len, uint64_t off) {
    while (len) {
        ssize_t r = pread(fd, buf, len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -EIO;
        buf += r;
        len -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int pwrite_full(int fd, const unsigned char *buf, uint64_t len, uint64_t off) {
    while (len) {
        ssize_t r = pwrite(fd, buf, len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        buf += r;
        len -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int sim_park_fd(int fd, uint64_t size, sim_parked *out) {
    memset(out, 0, sizeof *out);
    uint64_t *ext = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    off_t pos = 0;
    while ((uint64_t)pos < size) {
        off_t d = lseek(fd, pos, SEEK_DATA);
        if (d < 0) {
            if (errno == ENXIO)
                break; /* only holes from here on */
            free(ext);
            return -errno;
        }
        off_t h = lseek(fd, d, SEEK_HOLE);
        if (h < 0) {
            free(ext);
            return -errno;
        }
        if ((uint64_t)h > size)
            h = (off_t)size;
        int e = ext_push(&ext, &n, &cap, (uint64_t)d, (uint64_t)(h - d));
        if (e) {
            free(ext);
            return e;
        }
        total += (uint64_t)(h - d);
        pos = h;
    }
    unsigned char *buf = NULL;
    if (total) {
        buf = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (buf == MAP_FAILED) {
            free(ext);
            return -errno;
        }
    }
    uint64_t at = 0;
    for (size_t i = 0; i < n; i += 2) {
        int e = pread_full(fd, buf + at, ext[i + 1], ext[i]);
        if (e) {
            munmap(buf, total);
            free(ext);
            return e;
        }
        at += ext[i + 1];
    }
    out->buf = buf;
    out->buflen = total;
    out->ext = ext;
    out->next = n;
    return 0;
}

int sim_unpark_fd(const sim_parked *p, uint64_t size, const char *name, int *fdout) {
    int fd = sim_memfd(name, size);
    if (fd < 0)
        return fd;
    uint64_t at = 0;
    for (size_t i = 0; i < p->next; i += 2) {
        int e = pwrite_full(fd, p->buf + at, p->ext[i + 1], p->ext[i]);
        if (e) {
            close(fd);
            return e;
        }
        at += p->ext[i + 1];
    }
    *fdout = fd;
    return 0;
}

void sim_parked_free(sim_parked *p) {
    if (p->buf && p->buflen)
        munmap(p->buf, p->buflen);
    free(p->ext);
    memset(p, 0, sizeof *p);
}

int sim_start_thread(void *(*fn)(void *), void *arg) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int e = pthread_create(&t, &a, fn, arg);
    pthread_attr_destroy(&a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return e;
}

/*
 * What a page fault served through userfaultfd costs on this host: the round trip CRIU's lazy-pages daemon makes
 * for every page a restored process touches before the daemon has sent it (uffd.go says why gpucr asks).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

typedef struct {
    int fd;
    long pages, served;
    size_t page;
    char *src;
    int err;
} handler;

static void *serve(void *arg) {
    handler *h = arg;
    while (h->served < h->pages) {
        struct pollfd p = {.fd = h->fd, .events = POLLIN};
        int n = poll(&p, 1, 5000);
        if (n <= 0) {
            h->err = n == 0 ? ETIMEDOUT : errno;
            return NULL;
        }
        struct uffd_msg m;
        ssize_t r = read(h->fd, &m, sizeof m);
        if (r != (ssize_t)sizeof m) {
            if (r < 0 && errno == EAGAIN)
                continue;
            h->err = r < 0 ? errno : EIO;
            return NULL;
        }
        if (m.event != UFFD_EVENT_PAGEFAULT)
            continue;
        struct uffdio_copy c = {.dst = m.arg.pagefault.address & ~(uint64_t)(h->page - 1),
                                .src = (uint64_t)(uintptr_t)h->src,
                                .len = h->page};
        if (ioctl(h->fd, UFFDIO_COPY, &c) != 0 && errno != EEXIST) {
            h->err = errno;
            return NULL;
        }
        h->served++;
    }
    return NULL;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

int gpucr_uffd_probe(long pages, double *us_per_fault, char *why, size_t whylen) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    if (fd < 0 && errno == EINVAL)
        fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(why, whylen, "userfaultfd: %s", strerror(errno));
        return -1;
    }
    struct uffdio_api api = {.api = UFFD_API};
    if (ioctl(fd, UFFDIO_API, &api) != 0) {
        snprintf(why, whylen, "UFFDIO_API: %s", strerror(errno));
        close(fd);
        return -1;
    }
    size_t len = (size_t)pages * page;
    char *region = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *src = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED || src == MAP_FAILED) {
        snprintf(why, whylen, "mmap: %s", strerror(errno));
        if (region != MAP_FAILED)
            munmap(region, len);
        if (src != MAP_FAILED)
            munmap(src, page);
        close(fd);
        return -1;
    }
    memset(src, 0x5a, page);
    struct uffdio_register reg = {.range = {.start = (uint64_t)(uintptr_t)region, .len = len},
                                  .mode = UFFDIO_REGISTER_MODE_MISSING};
    int rc = -1;
    if (ioctl(fd, UFFDIO_REGISTER, &reg) != 0) {
        snprintf(why, whylen, "UFFDIO_REGISTER: %s", strerror(errno));
        goto out;
    }
    handler h = {.fd = fd, .pages = pages, .page = page, .src = src};
    pthread_t th;
    int e = pthread_create(&th, NULL, serve, &h);
    if (e != 0) {
        snprintf(why, whylen, "pthread_create: %s", strerror(e));
        goto out;
    }
    volatile char sum = 0;
    double t0 = now_us();
    for (long i = 0; i < pages && !h.err; i++)
        sum += region[(size_t)i * page]; /* each read faults once, served by the thread */
    double t1 = now_us();
    pthread_join(th, NULL);
    (void)sum;
    if (h.err) {
        snprintf(why, whylen, "serving the faults: %s", strerror(h.err));
        goto out;
    }
    *us_per_fault = (t1 - t0) / (double)pages;
    rc = 0;
out:
    munmap(region, len);
    munmap(src, page);
    close(fd);
    return rc;
}

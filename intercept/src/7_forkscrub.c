/*
 * Forked children give up the driver's files.
 *
 * A child forked after CUDA is initialised (PyTorch's DataLoader workers,
 * multiprocessing with fork, a subprocess before its exec) cannot use CUDA:
 * every driver call answers CUDA_ERROR_NOT_INITIALIZED there (measured on
 * driver 580, with and without what follows). Yet it inherits the driver's
 * open files and shared mappings (on an H200 with driver 580: 23 fds and 30
 * mappings of /dev/nvidiactl, /dev/nvidia0 and /dev/nvidia-uvm), and CRIU
 * cannot dump either ("Can't handle non-regular mapping on PID's map
 * 200600000"), so a training job with DataLoader workers could not be
 * checkpointed. The driver's own checkpoint releases those files only in the
 * process it checkpoints, never in its children.
 *
 * So in the child, right after fork, every mapping of a driver file becomes
 * an inaccessible anonymous reservation of the same range (the addresses stay
 * taken, as they were; nothing in the child may touch them anyway), and every
 * driver fd becomes /dev/null under the same number and close-on-exec flag
 * (so the number is not reused for something the driver's exit path might
 * close). Measured on the H200: afterwards the child's driver calls still
 * answer CUDA_ERROR_NOT_INITIALIZED, it exits normally, and the parent's
 * driver checkpoint and restore work as before.
 *
 * Driver files are those under /dev/nvidia, and any fd the driver opened
 * during the first successful cuInit that is a character device or an
 * anonymous inode (noted by device and inode; the simulated driver's
 * "device" is such an inode). The handler is registered after that cuInit,
 * so that it runs after the driver's own fork handler.
 *
 * It runs in the child of a possibly multithreaded parent, so it uses only
 * system calls and fixed buffers: no malloc, no stdio. GPUCR_FORK_SCRUB=0
 * turns it off.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "1_base.h"
#include "7_control.h"

#define DRV_PREFIX "/dev/nvidia"
#define MAX_NOTED 64
#define MAX_FDS 4096
#define MAX_RANGES 1024

typedef struct {
    dev_t dev;
    ino_t ino;
} file_id;

static struct {
    pthread_mutex_t mu;
    int nbefore;
    file_id before[MAX_FDS]; /* fd i open before the first cuInit: its identity; ino 0: closed */
    bool have_before;
    int nnoted;
    file_id noted[MAX_NOTED]; /* files the driver opened during it */
    bool noted_done;          /* the first cuInit succeeded and was looked at */
    bool disabled;
} F = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Parsers for the child: no locale, no allocation. */
static const char *parse_hex(const char *p, uint64_t *v) {
    *v = 0;
    const char *s = p;
    for (;; p++) {
        int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
        if (d < 0)
            return p == s ? NULL : p;
        *v = *v << 4 | (uint64_t)d;
    }
}

static const char *parse_dec(const char *p, uint64_t *v) {
    *v = 0;
    const char *s = p;
    for (; *p >= '0' && *p <= '9'; p++)
        *v = *v * 10 + (uint64_t)(*p - '0');
    return p == s ? NULL : p;
}

/* Like a driver's device file: a character device or an anonymous inode. */
static bool device_like(const struct stat *st) { return S_ISCHR(st->st_mode) || (st->st_mode & S_IFMT) == 0; }

static bool noted(dev_t dev, ino_t ino) {
    for (int i = 0; i < F.nnoted; i++)
        if (F.noted[i].dev == dev && F.noted[i].ino == ino)
            return true;
    return false;
}

/* Calls fn(fd) for every open fd, through getdents64 (no malloc). */
static void each_fd(void (*fn)(int fd, void *arg), void *arg) {
    int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return;
    char buf[4096] __attribute__((aligned(8)));
    for (;;) {
        long n = syscall(SYS_getdents64, dfd, buf, sizeof buf);
        if (n <= 0)
            break;
        for (long off = 0; off < n;) {
            struct {
                uint64_t ino;
                int64_t off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *d = (void *)(buf + off);
            off += d->reclen;
            uint64_t fd;
            const char *end = parse_dec(d->name, &fd);
            if (end && *end == 0 && fd != (uint64_t)dfd && fd < 1u << 30)
                fn((int)fd, arg);
        }
    }
    close(dfd);
}

static void note_before(int fd, void *arg) {
    (void)arg;
    struct stat st;
    if (fd < MAX_FDS && fstat(fd, &st) == 0) {
        F.before[fd] = (file_id){st.st_dev, st.st_ino};
        if (fd >= F.nbefore)
            F.nbefore = fd + 1;
    }
}

static void note_after(int fd, void *arg) {
    (void)arg;
    struct stat st;
    if (fd >= MAX_FDS || fstat(fd, &st) != 0 || !device_like(&st))
        return; /* beyond the table: not known to be new, so not noted */
    if (fd < F.nbefore && F.before[fd].ino == st.st_ino && F.before[fd].dev == st.st_dev)
        return; /* the application's */
    if (F.nnoted < MAX_NOTED && !noted(st.st_dev, st.st_ino))
        F.noted[F.nnoted++] = (file_id){st.st_dev, st.st_ino};
}

static void scrub_child(void);

void gc_forkscrub_before_init(void) {
    pthread_mutex_lock(&F.mu);
    if (!F.have_before) {
        const char *e = getenv("GPUCR_FORK_SCRUB");
        F.disabled = e && strcmp(e, "0") == 0;
        if (!F.disabled) {
            memset(F.before, 0, sizeof F.before);
            F.nbefore = 0;
            each_fd(note_before, NULL);
        }
        F.have_before = true;
    }
    pthread_mutex_unlock(&F.mu);
}

void gc_forkscrub_after_init(bool ok) {
    pthread_mutex_lock(&F.mu);
    if (ok && F.have_before && !F.disabled && !F.noted_done) {
        F.noted_done = true;
        each_fd(note_after, NULL);
        int e = pthread_atfork(NULL, NULL, scrub_child);
        if (e)
            gc_warn("pthread_atfork: %s: forked children keep the driver's files (CRIU cannot dump them)", strerror(e));
    }
    pthread_mutex_unlock(&F.mu);
}

/* ---- in the child ---- */

typedef struct {
    int devnull;
    int fds, maps;
} scrub_ctx;

static void scrub_fd(int fd, void *arg) {
    scrub_ctx *c = arg;
    if (fd == c->devnull)
        return;
    char link[64], target[sizeof DRV_PREFIX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, target, sizeof target - 1);
    bool drv = k == (ssize_t)sizeof DRV_PREFIX - 1 && memcmp(target, DRV_PREFIX, k) == 0;
    if (!drv) {
        struct stat st;
        drv = F.nnoted > 0 && fstat(fd, &st) == 0 && device_like(&st) && noted(st.st_dev, st.st_ino);
    }
    if (!drv)
        return;
    int fl = fcntl(fd, F_GETFD);
    if (dup3(c->devnull, fd, fl >= 0 && (fl & FD_CLOEXEC) ? O_CLOEXEC : 0) == fd)
        c->fds++;
}

/* Parses one /proc/self/maps line ("lo-hi perms offset maj:min inode path"):
 * its range and whether it maps a driver file. */
static bool driver_mapping(const char *line, uint64_t *lo, uint64_t *hi) {
    const char *p = parse_hex(line, lo);
    if (!p || *p != '-' || !(p = parse_hex(p + 1, hi)))
        return false;
    p = strchr(p + 1, ' '); /* after perms */
    if (!p)
        return false;
    p = strchr(p + 1, ' '); /* after offset */
    if (!p)
        return false;
    uint64_t maj, min, ino;
    if (!(p = parse_hex(p + 1, &maj)) || *p != ':' || !(p = parse_hex(p + 1, &min)) || *p != ' ' ||
        !(p = parse_dec(p + 1, &ino)))
        return false;
    while (*p == ' ')
        p++;
    if (strncmp(p, DRV_PREFIX, sizeof DRV_PREFIX - 1) == 0)
        return true;
    return ino != 0 && noted(makedev((unsigned)maj, (unsigned)min), (ino_t)ino);
}

static void scrub_child(void) {
    scrub_ctx c = {.devnull = open("/dev/null", O_RDWR | O_CLOEXEC)};
    /* The ranges first, then the remapping: the maps file is not read while it changes. */
    static uint64_t lo[MAX_RANGES], hi[MAX_RANGES];
    int n = 0;
    int mfd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (mfd >= 0) {
        static char buf[16384];
        static char line[4096 + 64];
        size_t ll = 0;
        for (;;) {
            ssize_t k = read(mfd, buf, sizeof buf);
            if (k <= 0)
                break;
            for (ssize_t i = 0; i < k; i++) {
                if (buf[i] != '\n') {
                    if (ll < sizeof line - 1)
                        line[ll++] = buf[i];
                    continue;
                }
                line[ll] = 0;
                ll = 0;
                if (n < MAX_RANGES && driver_mapping(line, &lo[n], &hi[n]) && hi[n] > lo[n])
                    n++;
            }
        }
        close(mfd);
    }
    for (int i = 0; i < n; i++) {
        void *p = mmap((void *)(uintptr_t)lo[i], hi[i] - lo[i], PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED)
            c.maps++;
    }
    if (c.devnull >= 0) {
        each_fd(scrub_fd, &c);
        close(c.devnull);
    }
    if (gc_log_debug) {
        char msg[160];
        int m = snprintf(msg, sizeof msg, "gpucr: forked child %d: the driver's %d mappings and %d fds dropped\n",
                         (int)getpid(), c.maps, c.fds);
        if (m > 0 && write(2, msg, (size_t)m) < 0) {
        }
    }
}

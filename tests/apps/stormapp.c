/*
 * stormapp: allocation/free storms from several threads, each on its own
 * stream, with every buffer's contents checked before it is freed. It is the
 * test load for the interposer: allocations of every size class (slab
 * sub-allocations and whole helper allocations), frees, async memsets and
 * copies on several streams, all while the helper may quiesce, drop and
 * re-import the process's memory underneath.
 *
 *   stormapp [--threads T] [--rounds R | --seconds S] [--live N] [--seed S]
 *            [--max-kib K] [--forks F] [--device D]
 *
 * Each thread keeps up to N live buffers. A round picks a slot: a live buffer
 * is read back (all of it up to 1 MiB, 64 spread words beyond) and compared
 * with the pattern it was given, then freed; an empty slot gets a new buffer
 * of a random size (log-uniform, 4 bytes .. K KiB) filled with a pattern
 * derived from (thread, round) by cuMemsetD32Async on the thread's stream.
 * Output:
 *
 *   ready pid=PID app=stormapp threads=T
 *   progress ROUNDS_DONE                    about once a second
 *   done rounds=R allocs=A bytes_max=B errors=E
 *
 * --forks F: the main thread forks F children while the workers run, one
 * every 100 ms; each child leaves through exit(0) (running atexit handlers
 * and library destructors) without touching the driver, as a subprocess of
 * a GPU program does. A child exiting nonzero counts as an error.
 *
 * Exit 0 only with errors=0; a wrong byte prints
 *   error thread=T buffer=0xADDR+OFF want=... got=...
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpuapp.h"

typedef struct {
    CUdeviceptr p;
    size_t size;
    uint32_t pattern;
} buf_t;

static struct {
    int threads;
    long rounds;
    double seconds;
    int live;
    uint32_t seed;
    size_t max_bytes;
    CUcontext ctx;
    atomic_long done_rounds;
    atomic_long allocs;
    atomic_long errors;
    atomic_llong bytes_now;
    atomic_llong bytes_max;
    atomic_int stop;
} g;

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static size_t pick_size(uint64_t *rs) {
    /* log-uniform in [4, max_bytes], rounded to 4 */
    double lo = 2.0, hi = 0;
    for (size_t m = g.max_bytes; m > 1; m >>= 1)
        hi += 1;
    double e = lo + (hi - lo) * (double)(rng_next(rs) % 1000000) / 1e6;
    size_t n = (size_t)1 << (size_t)e;
    n += (size_t)(rng_next(rs) % (n + 1));
    n &= ~(size_t)3;
    if (n < 4)
        n = 4;
    if (n > g.max_bytes)
        n = g.max_bytes & ~(size_t)3;
    return n;
}

static void check_buffer(int t, CUstream s, const buf_t *b, uint32_t *host) {
    size_t words = b->size / 4;
    if (b->size <= (1u << 20)) {
        CHECK(cuMemcpyDtoHAsync(host, b->p, b->size, s));
        CHECK(cuStreamSynchronize(s));
        for (size_t i = 0; i < words; i++)
            if (host[i] != b->pattern) {
                printf("error thread=%d buffer=0x%llx+%zu want=%08x got=%08x\n", t, (unsigned long long)b->p, i * 4,
                       b->pattern, host[i]);
                atomic_fetch_add(&g.errors, 1);
                return;
            }
        return;
    }
    for (int k = 0; k < 64; k++) {
        size_t i = (words - 1) * (size_t)k / 63;
        CHECK(cuMemcpyDtoHAsync(&host[k], b->p + i * 4, 4, s));
    }
    CHECK(cuStreamSynchronize(s));
    for (int k = 0; k < 64; k++) {
        size_t i = (words - 1) * (size_t)k / 63;
        if (host[k] != b->pattern) {
            printf("error thread=%d buffer=0x%llx+%zu want=%08x got=%08x\n", t, (unsigned long long)b->p, i * 4,
                   b->pattern, host[k]);
            atomic_fetch_add(&g.errors, 1);
            return;
        }
    }
}

static void *worker(void *arg) {
    int t = (int)(intptr_t)arg;
    CHECK(cuCtxSetCurrent(g.ctx));
    CUstream s;
    CHECK(cuStreamCreate(&s, 0));
    buf_t *live = calloc((size_t)g.live, sizeof *live);
    uint32_t *host = malloc(1u << 20);
    if (!live || !host)
        gpuapp_die("out of host memory");
    uint64_t rs = 0x9e3779b97f4a7c15ull ^ ((uint64_t)g.seed << 20) ^ (uint64_t)(t + 1) * 0xbf58476d1ce4e5b9ull;
    for (long r = 0; !atomic_load(&g.stop) && (g.rounds < 0 || r < g.rounds); r++) {
        buf_t *b = &live[rng_next(&rs) % (uint64_t)g.live];
        if (b->p) {
            check_buffer(t, s, b, host);
            CHECK(cuMemFree(b->p));
            atomic_fetch_sub(&g.bytes_now, (long long)b->size);
            b->p = 0;
        } else {
            b->size = pick_size(&rs);
            b->pattern = gpuapp_mix32((uint32_t)(t * 1000003 + r) ^ g.seed);
            CHECK(cuMemAlloc(&b->p, b->size));
            CHECK(cuMemsetD32Async(b->p, b->pattern, b->size / 4, s));
            atomic_fetch_add(&g.allocs, 1);
            long long now = atomic_fetch_add(&g.bytes_now, (long long)b->size) + (long long)b->size;
            long long max = atomic_load(&g.bytes_max);
            while (now > max && !atomic_compare_exchange_weak(&g.bytes_max, &max, now)) {
            }
        }
        atomic_fetch_add(&g.done_rounds, 1);
    }
    for (int i = 0; i < g.live; i++)
        if (live[i].p) {
            check_buffer(t, s, &live[i], host);
            CHECK(cuMemFree(live[i].p));
        }
    CHECK(cuStreamDestroy(s));
    free(live);
    free(host);
    return NULL;
}

int main(int argc, char **argv) {
    int ordinal = 0, forks = 0;
    g.threads = 4;
    g.rounds = 2000;
    g.seconds = 0;
    g.live = 16;
    g.seed = 1;
    g.max_bytes = (size_t)4096 << 10;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "stormapp: %s needs a value\n", o);
            return 2;
        }
        if (!strcmp(o, "--threads"))
            g.threads = atoi(v);
        else if (!strcmp(o, "--rounds"))
            g.rounds = atol(v);
        else if (!strcmp(o, "--seconds"))
            g.seconds = atof(v), g.rounds = -1;
        else if (!strcmp(o, "--live"))
            g.live = atoi(v);
        else if (!strcmp(o, "--seed"))
            g.seed = (uint32_t)strtoul(v, NULL, 0);
        else if (!strcmp(o, "--max-kib"))
            g.max_bytes = (size_t)atol(v) << 10;
        else if (!strcmp(o, "--device"))
            ordinal = atoi(v);
        else if (!strcmp(o, "--forks"))
            forks = atoi(v);
        else {
            fprintf(stderr,
                    "usage: stormapp [--threads T] [--rounds R | --seconds S] [--live N] [--seed S] [--max-kib K] "
                    "[--forks F] [--device D]\n");
            return 2;
        }
        i++;
    }
    if (g.threads < 1 || g.threads > 64 || g.live < 1 || g.max_bytes < 4 || (g.rounds < 0 && g.seconds <= 0)) {
        fprintf(stderr, "stormapp: bad parameters\n");
        return 2;
    }
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, ordinal));
    CHECK(cuDevicePrimaryCtxRetain(&g.ctx, dev));
    CHECK(cuCtxSetCurrent(g.ctx));
    printf("ready pid=%d app=stormapp threads=%d\n", (int)getpid(), g.threads);
    fflush(stdout);
    pthread_t *th = calloc((size_t)g.threads, sizeof *th);
    if (!th)
        gpuapp_die("out of host memory");
    for (int i = 0; i < g.threads; i++)
        if (pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i))
            gpuapp_die("pthread_create failed");
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double last = 0, last_fork = 0;
    for (;;) {
        usleep(20000);
        clock_gettime(CLOCK_MONOTONIC, &now);
        double el = (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
        if (forks > 0 && el - last_fork >= 0.1) {
            last_fork = el;
            forks--;
            fflush(stdout);
            pid_t c = fork();
            if (c < 0)
                gpuapp_die("fork failed");
            if (c == 0) {
                usleep(10000);
                exit(0);
            }
            int st = 0;
            if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                printf("error child %d ended with status 0x%x\n", (int)c, st);
                atomic_fetch_add(&g.errors, 1);
            }
        }
        if (g.seconds > 0 && el >= g.seconds)
            atomic_store(&g.stop, 1);
        if (el - last >= 1.0) {
            last = el;
            printf("progress %ld\n", atomic_load(&g.done_rounds));
            fflush(stdout);
        }
        if (atomic_load(&g.stop) || (g.rounds >= 0 && atomic_load(&g.done_rounds) >= g.rounds * g.threads))
            break;
    }
    for (int i = 0; i < g.threads; i++)
        pthread_join(th[i], NULL);
    free(th);
    printf("done rounds=%ld allocs=%ld bytes_max=%lld errors=%ld\n", atomic_load(&g.done_rounds),
           atomic_load(&g.allocs), atomic_load(&g.bytes_max), atomic_load(&g.errors));
    fflush(stdout);
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return atomic_load(&g.errors) ? 1 : 0;
}

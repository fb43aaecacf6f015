/*
 * Shared code of gpucr's test applications (tests/apps/NAME.c).
 *
 * The applications use only the CUDA driver API, through gpucr/cudadrv.h, so
 * the same sources run on gpucr's simulated driver (tests/sim) and on a real
 * GPU. Each one holds some device memory, changes it every iteration with
 * kernels, and prints a heartbeat with a checksum of all of it:
 *
 *   ready pid=PID app=NAME mib=N buffers=K      once, after setup
 *   hb ITER CHECKSUM UNIX_TIME.mmm              after every E-th iteration
 *   done ITER CHECKSUM                          after the last one (--iters M)
 *
 * Iterations are numbered from 1. The checksum after iteration ITER depends
 * only on the application, its parameters and ITER (never on timing, streams
 * or scheduling), so the heartbeats of a process that was checkpointed and
 * restored in the middle must equal line by line those of an uninterrupted
 * run. `--iters 0` prints the checksum of the initial state.
 *
 * Every line is flushed at once: stdout is usually a file that tests poll.
 */
#ifndef GPUCR_TESTS_GPUAPP_H
#define GPUCR_TESTS_GPUAPP_H

#include <stddef.h>
#include <stdint.h>

#include "gpucr/cudadrv.h"

/*
 * CHECK(call): every driver call goes through it. On failure it prints the
 * call, where it was made, the CUresult's name and string, and exits with
 * status 3 (usage errors exit 2).
 */
#define CHECK(call) gpuapp_check((call), #call, __FILE__, __LINE__)
void gpuapp_check(CUresult r, const char *call, const char *file, int line);

/* Prints "NAME: message" to stderr and exits with status 3. */
void gpuapp_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* The CUresult's name and description, "?" where the driver knows none. */
const char *gpuapp_err_name(CUresult r);
const char *gpuapp_err_string(CUresult r);

/* Options beyond the common ones that an application accepts. */
#define GPUAPP_OPT_MIB 0x1u     /* --mib N: device memory to hold, MiB */
#define GPUAPP_OPT_BUFFERS 0x2u /* --buffers K: number of buffers */
#define GPUAPP_OPT_WORKERS 0x4u /* --workers W: forked CPU worker processes */
#define GPUAPP_OPT_GRAPH 0x8u   /* --graph: part of each iteration replayed from a captured CUDA graph */
#define GPUAPP_OPT_STILL 0x10u  /* --still-mib N: memory written once, then only read (weights beside state) */
#define GPUAPP_OPT_RANKS 0x20u  /* --ranks N: processes (one per device) */
#define GPUAPP_OPT_ATTRS                                                                                               \
    0x40u /* --attrs: driver state the CUDA runtime sets (priorities, attributes, limits, globals) */
#define GPUAPP_OPT_MOVED_GLOBAL                                                                                        \
    0x80u /* --moved-global: with --attrs, a global that a worker loading only the live modules places elsewhere */

typedef struct gpuapp {
    const char *name;     /* app=NAME in the ready line */
    long long iters;      /* --iters M: stop after iteration M; -1: run forever */
    unsigned interval_ms; /* --interval-ms T: sleep between iterations (default 50) */
    unsigned hb_every;    /* --hb-every E: heartbeat period in iterations (default 10) */
    unsigned mib;         /* --mib N */
    unsigned buffers;     /* --buffers K */
    unsigned workers;     /* --workers W (default 0) */
    int graph;            /* --graph */
    unsigned still_mib;   /* --still-mib N (default 0) */
    unsigned ranks;       /* --ranks N (default 2) */
    int attrs;            /* --attrs */
    int moved_global;     /* --moved-global */
    uint32_t seed;        /* --seed S: initial contents (default 1) */
    int ordinal;          /* --device D: device ordinal (default 0) */
    int show_device;      /* --show-device: each heartbeat names the GPU behind the ordinal (gpu=UUID) */
    CUdevice dev;         /* set by gpuapp_context() */
    CUcontext ctx;
} gpuapp;

/*
 * Parses the command line. `accepted` says which of GPUAPP_OPT_* the
 * application takes; def_mib / def_buffers are its defaults. Exits with a
 * usage message (status 2) on a bad option.
 */
void gpuapp_parse(gpuapp *a, const char *name, unsigned accepted, unsigned def_mib, unsigned def_buffers, int argc,
                  char **argv);

/* CLOCK_MONOTONIC in seconds (benchmarks). */
double gpuapp_now_s(void);
/* The median of v[0..n) (n >= 1); sorts v. */
double gpuapp_median(double *v, int n);

/* cuInit, the device --device, its primary context made current. */
void gpuapp_context(gpuapp *a);
/* Releases the primary context (after everything else was freed). */
void gpuapp_context_release(gpuapp *a);

/*
 * Loads a module from a NUL-terminated PTX string (cuModuleLoadData). If the
 * driver refuses it, the JIT's error log is printed before exiting: on a real
 * GPU that is the only way to learn what is wrong with hand-written PTX.
 */
CUmodule gpuapp_load_ptx(const char *ptx);
CUfunction gpuapp_function(CUmodule mod, const char *name);

/* Threads per block of every launch, and the grid for n elements. */
#define GPUAPP_BLOCK 256u
unsigned gpuapp_grid(uint64_t n);

/* Prints the ready line. */
void gpuapp_ready(const gpuapp *a, unsigned long long mib, unsigned buffers);

/*
 * Sizes of `count` buffers that together hold exactly total_bytes
 * (a multiple of 4): deterministic from (total_bytes, count), deliberately
 * varied (weights 2..8), every size a multiple of 4, some of them not a
 * multiple of 8 (so the checksum's zero-padded last word and kernels' tails
 * are exercised) and none a power of two. Exits if a buffer would be smaller
 * than min_bytes or larger than 4 GiB - 4 (kernels index 32-bit words).
 */
void gpuapp_split_sizes(uint64_t total_bytes, unsigned count, uint64_t min_bytes, uint64_t *sizes);

/* The heartbeat's kernels' PTX (app_hb_init, app_hb_step, app_hb_mix; common/hbptx.c). */
extern const char gpuapp_hb_ptx[];

/* The murmur3 32-bit finalizer, the same as the kernels' (host-side data). */
static inline uint32_t gpuapp_mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return x;
}

/*
 * The checksum (64-bit, integer only, order-dependent):
 *
 *   P = 0x100000001b3                   (the 64-bit FNV prime)
 *   h = 0xcbf29ce484222325              (the 64-bit FNV offset basis)
 *   for each buffer i = 0, 1, ... in the application's order, of B bytes:
 *       h = (h ^ ((i + 1) * 0x9e3779b97f4a7c15)) * P     per-buffer seed
 *       h = (h ^ B) * P                                  its size
 *       for each 8-byte little-endian word w of the buffer, in order
 *       (a last partial word is zero-padded to 8 bytes):
 *           h = (h ^ w) * P
 *   all arithmetic modulo 2^64; printed as 16 lower-case hex digits.
 *
 * Seeding with the index and the size makes it depend on how the bytes are
 * split into buffers, not only on their concatenation.
 */
#define GPUAPP_SUM_BASIS 0xcbf29ce484222325ull
#define GPUAPP_SUM_PRIME 0x100000001b3ull
uint64_t gpuapp_sum_host(uint64_t h, unsigned index, const void *data, size_t bytes);
/* The same over device memory, read back with cuMemcpyDtoH in chunks. */
uint64_t gpuapp_sum_device(uint64_t h, unsigned index, CUdeviceptr p, size_t bytes);
/*
 * The same over one device range read back with cuMemcpyDtoH in chunks that
 * may span several of its buffers (vmmapp: a chunk crosses the boundary of two
 * physical allocations). sizes[0..count) split the range into buffers.
 */
uint64_t gpuapp_sum_device_split(uint64_t h, CUdeviceptr p, const uint64_t *sizes, unsigned count);

/*
 * The main loop: for ITER = 1, 2, ...: step(state, ITER) enqueues the work
 * of one iteration; at heartbeats and at the end, checksum(state) must wait
 * for all of it and return the checksum of all device memory. Sleeps
 * --interval-ms between iterations. Returns after the done line.
 */
typedef void (*gpuapp_step_fn)(void *state, uint32_t iter);
typedef uint64_t (*gpuapp_checksum_fn)(void *state);
void gpuapp_loop(const gpuapp *a, void *state, gpuapp_step_fn step, gpuapp_checksum_fn checksum);

#endif /* GPUCR_TESTS_GPUAPP_H */

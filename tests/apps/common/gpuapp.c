/*
 * Shared code of gpucr's test applications: see gpuapp.h.
 */
#include "gpuapp.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *app_name = "gpuapp";

const char *gpuapp_err_name(CUresult r) {
    const char *s = NULL;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
        return "?";
    return s;
}

const char *gpuapp_err_string(CUresult r) {
    const char *s = NULL;
    if (cuGetErrorString(r, &s) != CUDA_SUCCESS || !s)
        return "?";
    return s;
}

void gpuapp_check(CUresult r, const char *call, const char *file, int line) {
    if (r == CUDA_SUCCESS)
        return;
    fflush(stdout);
    fprintf(stderr, "%s: %s:%d: %s failed: %d %s: %s\n", app_name, file, line, call, (int)r, gpuapp_err_name(r),
            gpuapp_err_string(r));
    exit(3);
}

void gpuapp_die(const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "%s: ", app_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(3);
}

/* ---- options ----------------------------------------------------------- */

static void usage(const gpuapp *a, unsigned accepted, int status) {
    FILE *f = status ? stderr : stdout;
    fprintf(f, "usage: %s [options]\n", a->name);
    if (accepted & GPUAPP_OPT_MIB)
        fprintf(f, "  --mib N          device memory to hold, MiB (default %u)\n", a->mib);
    if (accepted & GPUAPP_OPT_BUFFERS)
        fprintf(f, "  --buffers K      number of device buffers (default %u)\n", a->buffers);
    if (accepted & GPUAPP_OPT_WORKERS)
        fprintf(f, "  --workers W      fork W CPU worker processes after CUDA is initialised (default 0)\n");
    if (accepted & GPUAPP_OPT_GRAPH)
        fprintf(f, "  --graph          also replay a captured CUDA graph every iteration\n");
    if (accepted & GPUAPP_OPT_STILL)
        fprintf(f, "  --still-mib N    also hold N MiB written once and only read afterwards (default 0)\n");
    if (accepted & GPUAPP_OPT_RANKS)
        fprintf(f, "  --ranks N        processes, one per device in turn (default %u)\n", a->ranks);
    if (accepted & GPUAPP_OPT_ATTRS)
        fprintf(f,
                "  --attrs          also set stream priorities, a function attribute, a context limit and a module\n"
                "                   global, and check every iteration that they hold\n");
    if (accepted & GPUAPP_OPT_MOVED_GLOBAL)
        fprintf(
            f,
            "  --moved-global   with --attrs: a module loaded before the global's and unloaded after leaves a hole\n"
            "                   that a new worker fills with it; its address is looked up anew at every other use\n");
    fprintf(f,
            "  --iters M        stop after iteration M with a done line (default: run forever)\n"
            "  --interval-ms T  sleep T ms between iterations (default 50)\n"
            "  --hb-every E     heartbeat every E iterations (default 10)\n"
            "  --seed S         seed of the initial contents (default 1)\n"
            "  --device D       device ordinal (default 0)\n"
            "  --show-device    end each heartbeat with gpu=UUID bus=PCI-BUS-ID, the GPU behind the ordinal now\n");
    exit(status);
}

/* Parses an unsigned decimal number in [lo, hi]; exits with usage otherwise. */
static unsigned long long parse_num(const gpuapp *a, unsigned accepted, const char *opt, const char *s,
                                    unsigned long long lo, unsigned long long hi) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || !end || end == s || *end || s[0] == '-' || v < lo || v > hi) {
        fprintf(stderr, "%s: bad value for --%s: '%s' (want %llu..%llu)\n", a->name, opt, s, lo, hi);
        usage(a, accepted, 2);
    }
    return v;
}

void gpuapp_parse(gpuapp *a, const char *name, unsigned accepted, unsigned def_mib, unsigned def_buffers, int argc,
                  char **argv) {
    enum {
        O_MIB = 1,
        O_BUFFERS,
        O_WORKERS,
        O_GRAPH,
        O_STILL,
        O_RANKS,
        O_ATTRS,
        O_MOVED_GLOBAL,
        O_ITERS,
        O_INTERVAL,
        O_HB,
        O_SEED,
        O_DEVICE,
        O_SHOWDEV,
        O_HELP
    };
    static const struct option longopts[] = {
        {"mib", required_argument, NULL, O_MIB},
        {"buffers", required_argument, NULL, O_BUFFERS},
        {"workers", required_argument, NULL, O_WORKERS},
        {"graph", no_argument, NULL, O_GRAPH},
        {"still-mib", required_argument, NULL, O_STILL},
        {"ranks", required_argument, NULL, O_RANKS},
        {"attrs", no_argument, NULL, O_ATTRS},
        {"moved-global", no_argument, NULL, O_MOVED_GLOBAL},
        {"iters", required_argument, NULL, O_ITERS},
        {"interval-ms", required_argument, NULL, O_INTERVAL},
        {"hb-every", required_argument, NULL, O_HB},
        {"seed", required_argument, NULL, O_SEED},
        {"device", required_argument, NULL, O_DEVICE},
        {"show-device", no_argument, NULL, O_SHOWDEV},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    memset(a, 0, sizeof(*a));
    a->name = name;
    app_name = name;
    a->iters = -1;
    a->interval_ms = 50;
    a->hb_every = 10;
    a->mib = def_mib;
    a->buffers = def_buffers;
    a->seed = 1;
    a->ordinal = 0;
    a->ranks = 2;

    int c, li = -1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, &li)) != -1) {
        switch (c) {
        case O_MIB:
            if (!(accepted & GPUAPP_OPT_MIB))
                goto bad;
            a->mib = (unsigned)parse_num(a, accepted, "mib", optarg, 1, 1u << 20);
            break;
        case O_BUFFERS:
            if (!(accepted & GPUAPP_OPT_BUFFERS))
                goto bad;
            a->buffers = (unsigned)parse_num(a, accepted, "buffers", optarg, 2, 64);
            break;
        case O_WORKERS:
            if (!(accepted & GPUAPP_OPT_WORKERS))
                goto bad;
            a->workers = (unsigned)parse_num(a, accepted, "workers", optarg, 0, 16);
            break;
        case O_GRAPH:
            if (!(accepted & GPUAPP_OPT_GRAPH))
                goto bad;
            a->graph = 1;
            break;
        case O_STILL:
            if (!(accepted & GPUAPP_OPT_STILL))
                goto bad;
            a->still_mib = (unsigned)parse_num(a, accepted, "still-mib", optarg, 0, 1u << 20);
            break;
        case O_RANKS:
            if (!(accepted & GPUAPP_OPT_RANKS))
                goto bad;
            a->ranks = (unsigned)parse_num(a, accepted, "ranks", optarg, 2, 8);
            break;
        case O_ATTRS:
            if (!(accepted & GPUAPP_OPT_ATTRS))
                goto bad;
            a->attrs = 1;
            break;
        case O_MOVED_GLOBAL:
            if (!(accepted & GPUAPP_OPT_MOVED_GLOBAL))
                goto bad;
            a->moved_global = 1;
            break;
        case O_ITERS:
            /* Kernels take the iteration as a 32-bit number. */
            a->iters = (long long)parse_num(a, accepted, "iters", optarg, 0, UINT32_MAX);
            break;
        case O_INTERVAL: a->interval_ms = (unsigned)parse_num(a, accepted, "interval-ms", optarg, 0, 3600000); break;
        case O_HB: a->hb_every = (unsigned)parse_num(a, accepted, "hb-every", optarg, 1, UINT32_MAX); break;
        case O_SEED: a->seed = (uint32_t)parse_num(a, accepted, "seed", optarg, 0, UINT32_MAX); break;
        case O_DEVICE: a->ordinal = (int)parse_num(a, accepted, "device", optarg, 0, 1024); break;
        case O_SHOWDEV: a->show_device = 1; break;
        case O_HELP: usage(a, accepted, 0); break;
        default:
            fprintf(stderr, "%s: unknown or incomplete option '%s'\n", name, argv[optind - 1]);
            usage(a, accepted, 2);
            break;
        bad:
            fprintf(stderr, "%s: %s takes no --%s\n", name, name, longopts[li].name);
            usage(a, accepted, 2);
        }
        li = -1;
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", name, argv[optind]);
        usage(a, accepted, 2);
    }
}

/* ---- context and modules ---------------------------------------------- */

void gpuapp_context(gpuapp *a) {
    int count = 0;
    CHECK(cuInit(0));
    CHECK(cuDeviceGetCount(&count));
    if (a->ordinal >= count)
        gpuapp_die("--device %d, but the driver has %d device(s)", a->ordinal, count);
    CHECK(cuDeviceGet(&a->dev, a->ordinal));
    /* The primary context is what the runtime (and so PyTorch) uses too. */
    CHECK(cuDevicePrimaryCtxRetain(&a->ctx, a->dev));
    CHECK(cuCtxSetCurrent(a->ctx));
}

void gpuapp_context_release(gpuapp *a) {
    CHECK(cuCtxSetCurrent(NULL));
    CHECK(cuDevicePrimaryCtxRelease(a->dev));
    a->ctx = NULL;
}

/* JIT options by their value in cuda.h (cudadrv.h names only the type). */
enum { JIT_ERROR_LOG_BUFFER = 5, JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6 };

CUmodule gpuapp_load_ptx(const char *ptx) {
    CUmodule mod = NULL;
    CUresult r = cuModuleLoadData(&mod, ptx);
    if (r == CUDA_SUCCESS)
        return mod;
    /*
     * cuModuleLoadData gives no log. Load the same PTX again through
     * cuLibraryLoadData with an error-log buffer, only to print the log.
     */
    static char log[8192];
    CUjit_option opts[2] = {(CUjit_option)JIT_ERROR_LOG_BUFFER, (CUjit_option)JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[2] = {log, (void *)(uintptr_t)sizeof(log)};
    CUlibrary lib = NULL;
    log[0] = 0;
    CUresult r2 = cuLibraryLoadData(&lib, ptx, opts, vals, 2, NULL, NULL, 0);
    if (r2 == CUDA_SUCCESS)
        (void)cuLibraryUnload(lib); /* only loaded for its log; nothing to do if this fails */
    log[sizeof(log) - 1] = 0;
    fprintf(stderr, "%s: PTX JIT log (cuLibraryLoadData: %s):\n%s\n", app_name, gpuapp_err_name(r2),
            log[0] ? log : "(empty)");
    gpuapp_check(r, "cuModuleLoadData(PTX)", __FILE__, __LINE__);
    return NULL;
}

CUfunction gpuapp_function(CUmodule mod, const char *name) {
    CUfunction f = NULL;
    char what[160];
    snprintf(what, sizeof(what), "cuModuleGetFunction(%s)", name);
    gpuapp_check(cuModuleGetFunction(&f, mod, name), what, __FILE__, __LINE__);
    return f;
}

unsigned gpuapp_grid(uint64_t n) {
    /*
     * Every kernel is a grid-stride loop, so any grid covers all elements;
     * capping it keeps launches cheap on big buffers while still using
     * many blocks (and several iterations of the loop per thread).
     */
    uint64_t g = (n + GPUAPP_BLOCK - 1) / GPUAPP_BLOCK;
    if (g < 1)
        g = 1;
    if (g > 1024)
        g = 1024;
    return (unsigned)g;
}

void gpuapp_ready(const gpuapp *a, unsigned long long mib, unsigned buffers) {
    printf("ready pid=%d app=%s mib=%llu buffers=%u\n", (int)getpid(), a->name, mib, buffers);
    fflush(stdout);
}

/* ---- buffer sizes ------------------------------------------------------ */

static int is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

void gpuapp_split_sizes(uint64_t total, unsigned count, uint64_t min_bytes, uint64_t *sizes) {
    uint64_t wsum = 0, used = 0;
    if (count < 1 || total % 4)
        gpuapp_die("cannot split %llu bytes into %u buffers", (unsigned long long)total, count);
    for (unsigned i = 0; i < count; i++)
        wsum += 2 + (i * 5 + 3) % 7; /* 5 3 8 6 4 2 7 5 3 8 ... */
    for (unsigned i = 0; i + 1 < count; i++) {
        uint64_t w = 2 + (i * 5 + 3) % 7;
        /* Share of the total, rounded down to 8 bytes, less 4*(i+1): an odd
         * multiple of 4 for even i, so some sizes end in half a word. */
        uint64_t s = (total / wsum * w) & ~(uint64_t)7;
        s = s > 4ull * (i + 1) ? s - 4ull * (i + 1) : 4;
        if (is_pow2(s))
            s -= 4;
        sizes[i] = s;
        used += s;
    }
    if (used >= total)
        gpuapp_die("cannot split %llu bytes into %u buffers", (unsigned long long)total, count);
    sizes[count - 1] = total - used;
    if (count > 1 && is_pow2(sizes[count - 1])) {
        /* Move one word from the last buffer to the first. */
        sizes[count - 1] -= 4;
        sizes[0] += 4;
    }
    for (unsigned i = 0; i < count; i++)
        if (sizes[i] < min_bytes || sizes[i] > 0xFFFFFFFCull)
            gpuapp_die("buffer %u of %u would hold %llu bytes: use more memory or fewer buffers", i, count,
                       (unsigned long long)sizes[i]);
}

/* ---- checksum ---------------------------------------------------------- */

static uint64_t sum_begin(uint64_t h, unsigned index, uint64_t bytes) {
    h = (h ^ ((uint64_t)(index + 1) * 0x9e3779b97f4a7c15ull)) * GPUAPP_SUM_PRIME;
    h = (h ^ bytes) * GPUAPP_SUM_PRIME;
    return h;
}

/* Hashes bytes (a multiple of 8, except in the last call for a buffer). */
static uint64_t sum_words(uint64_t h, const unsigned char *p, size_t bytes) {
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8); /* x86-64 and arm64: little-endian */
        h = (h ^ w) * GPUAPP_SUM_PRIME;
    }
    if (i < bytes) {
        uint64_t w = 0;
        memcpy(&w, p + i, bytes - i);
        h = (h ^ w) * GPUAPP_SUM_PRIME;
    }
    return h;
}

uint64_t gpuapp_sum_host(uint64_t h, unsigned index, const void *data, size_t bytes) {
    return sum_words(sum_begin(h, index, bytes), data, bytes);
}

/* Host staging for read-backs: 4 MiB (a multiple of 8), allocated once. */
#define STAGE_BYTES (4u << 20)
static unsigned char *stage(void) {
    static unsigned char *buf;
    if (!buf && !(buf = malloc(STAGE_BYTES)))
        gpuapp_die("out of host memory");
    return buf;
}

uint64_t gpuapp_sum_device(uint64_t h, unsigned index, CUdeviceptr p, size_t bytes) {
    unsigned char *buf = stage();
    h = sum_begin(h, index, bytes);
    for (size_t off = 0; off < bytes; off += STAGE_BYTES) {
        size_t n = bytes - off < STAGE_BYTES ? bytes - off : STAGE_BYTES;
        CHECK(cuMemcpyDtoH(buf, p + off, n));
        h = sum_words(h, buf, n);
    }
    return h;
}

uint64_t gpuapp_sum_device_split(uint64_t h, CUdeviceptr p, const uint64_t *sizes, unsigned count) {
    unsigned char *buf = stage();
    uint64_t total = 0;
    for (unsigned i = 0; i < count; i++) {
        if (sizes[i] % 8)
            gpuapp_die("gpuapp_sum_device_split: buffer sizes must be multiples of 8");
        total += sizes[i];
    }
    unsigned cur = 0;  /* buffer being hashed */
    uint64_t left = 0; /* its bytes not hashed yet */
    int begun = 0;
    for (uint64_t off = 0; off < total; off += STAGE_BYTES) {
        size_t n = total - off < STAGE_BYTES ? (size_t)(total - off) : STAGE_BYTES;
        CHECK(cuMemcpyDtoH(buf, p + off, n)); /* may span two buffers */
        size_t at = 0;
        while (at < n) {
            if (!begun || left == 0) {
                if (begun)
                    cur++;
                h = sum_begin(h, cur, sizes[cur]);
                left = sizes[cur];
                begun = 1;
                if (left == 0)
                    continue;
            }
            size_t take = n - at < left ? n - at : (size_t)left;
            h = sum_words(h, buf + at, take);
            at += take;
            left -= take;
        }
    }
    return h;
}

/* ---- main loop --------------------------------------------------------- */

static void sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    /* Resume after signals (a CRIU dump or a debugger can interrupt it). */
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void gpuapp_loop(const gpuapp *a, void *state, gpuapp_step_fn step, gpuapp_checksum_fn checksum) {
    uint64_t it = 0;
    if (a->iters == 0) {
        printf("done 0 %016llx\n", (unsigned long long)checksum(state));
        fflush(stdout);
        return;
    }
    for (;;) {
        it++;
        step(state, (uint32_t)it);
        int last = a->iters >= 0 && it == (uint64_t)a->iters;
        int hb = it % a->hb_every == 0;
        if (hb || last) {
            uint64_t h = checksum(state);
            if (hb) {
                struct timespec now;
                clock_gettime(CLOCK_REALTIME, &now);
                printf("hb %llu %016llx %lld.%03ld", (unsigned long long)it, (unsigned long long)h,
                       (long long)now.tv_sec, now.tv_nsec / 1000000L);
                if (a->show_device) {
                    /* asked every time: a restore may have put the ordinal onto another GPU */
                    CUuuid u;
                    CHECK(cuDeviceGetUuid_v2(&u, a->dev));
                    const unsigned char *b = (const unsigned char *)u.bytes;
                    printf(" gpu=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
                    char bus[64];
                    CHECK(cuDeviceGetPCIBusId(bus, (int)sizeof bus, a->dev));
                    printf(" bus=%s", bus);
                }
                printf("\n");
            }
            if (last)
                printf("done %llu %016llx\n", (unsigned long long)it, (unsigned long long)h);
            fflush(stdout);
        }
        if (last)
            return;
        if (a->interval_ms)
            sleep_ms(a->interval_ms);
    }
}

double gpuapp_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double gpuapp_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

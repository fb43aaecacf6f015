/*
 * rtbeat: heartbeat's work (tests/apps/heartbeat.c) on the CUDA runtime API,
 * as an nvcc-compiled program does it, with the same checksums as heartbeat
 * given the same options. It stands in for such a program where there is no
 * nvcc (CI, on the simulated driver): it carries its kernels as a fat binary
 * (the heartbeat's PTX in a fat binary container, in nvcc's wrapper), and does
 * what nvcc's host code does:
 *
 *   at load      __cudaRegisterFatBinary, __cudaRegisterFunction per kernel,
 *                __cudaRegisterVar for a __device__ variable,
 *                __cudaRegisterFatBinaryEnd (and the unregistration at exit)
 *   kern<<<>>>() __cudaPushCallConfiguration, then the kernel's host stub:
 *                __cudaPopCallConfiguration, __cudaGetKernel (once),
 *                __cudaLaunchKernel
 *
 * Beside that it launches with cudaLaunchKernel and cudaLaunchKernelExC,
 * copies through pinned host memory (cudaHostAlloc), captures its --graph with
 * cudaStreamBeginCapture, and reads and writes the __device__ variable
 * (cudaMemcpyToSymbol/FromSymbol) every iteration: its value is printed in the
 * heartbeat line's last field, so a restore that lost it shows. The memset
 * and the checksum use the driver API, as programs that mix the two do.
 *
 * It links against served mode's runtime library (build/lib/served), which
 * runs on the simulated driver (LD_LIBRARY_PATH=build/sim) or, under
 * gpucr run --served, on served mode's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuapp.h"
#include "gpucr/cudart.h"

#define RCHECK(x)                                                                                                      \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess)                                                                                         \
            gpuapp_die("%s:%d: %s failed: %d %s: %s", __FILE__, __LINE__, #x, (int)e_, cudaGetErrorName(e_),           \
                       cudaGetErrorString(e_));                                                                        \
    } while (0)

#define PATTERN_WORDS 256u
#define MEMSET_WORDS 1024u
#define MIX_WORDS 65536u
#define GRAPH_ITER 0xC0FFEEu

/* ---- the fat binary: one PTX entry, in the container nvcc makes ---- */

struct fatbin_header {
    uint32_t magic; /* 0xBA55ED50 */
    uint16_t version, header_size;
    uint64_t fat_size; /* the entries' bytes after this header */
};
struct fatbin_entry {
    uint16_t kind; /* 1: PTX */
    uint16_t version;
    uint32_t header_size; /* from the entry's start to its payload */
    uint64_t payload_size;
    uint32_t compressed_size, reserved0;
    uint16_t minor, major;
    uint32_t arch;
    uint32_t name_offset, name_len;
    uint64_t flags, reserved1, decompressed_size;
};
struct fatbin_wrapper {
    int magic; /* 0x466243B1 */
    int version;
    const void *data;
    const void *filename_or_fatbins;
};

static void *make_fatbin(const char *ptx) {
    size_t n = strlen(ptx) + 1, padded = (n + 7) & ~(size_t)7;
    struct fatbin_header h = {0xBA55ED50u, 1, sizeof h, sizeof(struct fatbin_entry) + padded};
    struct fatbin_entry e;
    memset(&e, 0, sizeof e);
    e.kind = 1;
    e.version = 0x0101;
    e.header_size = sizeof e;
    e.payload_size = padded;
    e.major = 7;
    e.minor = 8;
    e.arch = 75;
    char *f = calloc(1, sizeof h + sizeof e + padded);
    if (!f)
        gpuapp_die("out of host memory");
    memcpy(f, &h, sizeof h);
    memcpy(f + sizeof h, &e, sizeof e);
    memcpy(f + sizeof h + sizeof e, ptx, n);
    return f;
}

/* The heartbeat's PTX, and a __device__ variable of the same module. */
static char *module_ptx(void) {
    static const char var[] = ".visible .global .align 8 .u64 rt_beats;\n";
    const char *body = strstr(gpuapp_hb_ptx, ".address_size 64\n");
    if (!body)
        gpuapp_die("the heartbeat's PTX has no .address_size line");
    body += strlen(".address_size 64\n");
    size_t head = (size_t)(body - gpuapp_hb_ptx);
    char *p = malloc(strlen(gpuapp_hb_ptx) + sizeof var + 1);
    if (!p)
        gpuapp_die("out of host memory");
    memcpy(p, gpuapp_hb_ptx, head);
    strcpy(p + head, var);
    strcat(p, body);
    return p;
}

/* ---- the kernels' host stubs, as nvcc writes them ---- */

static void app_hb_init(unsigned long long buf, uint32_t n, uint32_t seed);
static void app_hb_step(unsigned long long buf, uint32_t n, uint32_t iter, uint32_t salt);
static void app_hb_mix(unsigned long long dst, unsigned long long src, uint32_t count, uint32_t nsrc, uint32_t iter);
static unsigned long long rt_beats; /* the __device__ variable's host shadow */

static void launch_stub(const void *self, void **args) {
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;
    if (__cudaPopCallConfiguration(&grid, &block, &shmem, &stream) != cudaSuccess)
        return;
    cudaKernel_t k = NULL;
    RCHECK(__cudaGetKernel(&k, self));
    RCHECK(__cudaLaunchKernel(k, grid, block, args, shmem, stream));
}

static void app_hb_init(unsigned long long buf, uint32_t n, uint32_t seed) {
    void *args[] = {&buf, &n, &seed};
    launch_stub((const void *)app_hb_init, args);
}
static void app_hb_step(unsigned long long buf, uint32_t n, uint32_t iter, uint32_t salt) {
    void *args[] = {&buf, &n, &iter, &salt};
    launch_stub((const void *)app_hb_step, args);
}
static void app_hb_mix(unsigned long long dst, unsigned long long src, uint32_t count, uint32_t nsrc, uint32_t iter) {
    void *args[] = {&dst, &src, &count, &nsrc, &iter};
    launch_stub((const void *)app_hb_mix, args);
}

/* kern<<<grid, GPUAPP_BLOCK, 0, stream>>>(args...) */
#define LAUNCH(kern, grid, stream, ...)                                                                                \
    do {                                                                                                               \
        if (__cudaPushCallConfiguration((dim3){(grid), 1, 1}, (dim3){GPUAPP_BLOCK, 1, 1}, 0, (stream)) == 0)           \
            kern(__VA_ARGS__);                                                                                         \
        RCHECK(cudaGetLastError());                                                                                    \
    } while (0)

static void **fatbin_handle;
static void unregister(void) { __cudaUnregisterFatBinary(fatbin_handle); }

static void register_module(void) {
    static struct fatbin_wrapper w = {0x466243B1, 1, NULL, NULL};
    w.data = make_fatbin(module_ptx());
    fatbin_handle = __cudaRegisterFatBinary(&w);
    if (!fatbin_handle)
        gpuapp_die("__cudaRegisterFatBinary failed");
    __cudaRegisterFunction(fatbin_handle, (const char *)app_hb_init, (char *)"app_hb_init", "app_hb_init", -1, NULL,
                           NULL, NULL, NULL, NULL);
    __cudaRegisterFunction(fatbin_handle, (const char *)app_hb_step, (char *)"app_hb_step", "app_hb_step", -1, NULL,
                           NULL, NULL, NULL, NULL);
    __cudaRegisterFunction(fatbin_handle, (const char *)app_hb_mix, (char *)"app_hb_mix", "app_hb_mix", -1, NULL, NULL,
                           NULL, NULL, NULL);
    __cudaRegisterVar(fatbin_handle, (char *)&rt_beats, (char *)"rt_beats", "rt_beats", 0, sizeof rt_beats, 0, 0);
    __cudaRegisterFatBinaryEnd(fatbin_handle);
    atexit(unregister);
}

/* ---- heartbeat's iteration ---- */

typedef struct {
    unsigned k;
    uint64_t *sizes;
    void **buf;
    cudaStream_t s[2];
    cudaEvent_t ev_s1, ev_mix, ev_graph;
    cudaGraphExec_t graph;
    uint32_t *pattern; /* pinned (cudaHostAlloc) */
    unsigned long long beats;
} rt_state;

static uint32_t salt_of(unsigned i) { return (i + 1) * 0x27D4EB2Fu; }
static unsigned long long dptr(const void *p) { return (unsigned long long)(uintptr_t)p; }

static void capture_graph(rt_state *st) {
    cudaStream_t cs;
    cudaGraph_t g;
    RCHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    RCHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    for (unsigned i = 0; i < st->k; i++)
        LAUNCH(app_hb_step, gpuapp_grid(st->sizes[i] / 4), cs, dptr(st->buf[i]), (uint32_t)(st->sizes[i] / 4),
               GRAPH_ITER, ~salt_of(i));
    RCHECK(cudaStreamEndCapture(cs, &g));
    RCHECK(cudaGraphInstantiate(&st->graph, g, 0));
    RCHECK(cudaGraphDestroy(g));
    RCHECK(cudaStreamDestroy(cs));
    RCHECK(cudaEventCreateWithFlags(&st->ev_graph, cudaEventDisableTiming));
}

static void step(void *p, uint32_t iter) {
    rt_state *st = p;
    cudaStream_t s0 = st->s[0], s1 = st->s[1];
    RCHECK(cudaEventSynchronize(st->ev_mix));
    for (uint32_t j = 0; j < PATTERN_WORDS; j++)
        st->pattern[j] = gpuapp_mix32(iter * 0x9E3779B1u + j);
    RCHECK(cudaStreamWaitEvent(s1, st->ev_mix, 0));
    if (st->graph) {
        RCHECK(cudaGraphLaunch(st->graph, s0));
        RCHECK(cudaEventRecord(st->ev_graph, s0));
        RCHECK(cudaStreamWaitEvent(s1, st->ev_graph, 0));
    }
    for (unsigned i = 0; i < st->k; i++)
        LAUNCH(app_hb_step, gpuapp_grid(st->sizes[i] / 4), st->s[i % 2], dptr(st->buf[i]), (uint32_t)(st->sizes[i] / 4),
               iter, salt_of(i));
    uint64_t n0 = st->sizes[0] / 4, n1 = st->sizes[1] / 4;
    CHECK(cuMemsetD32Async((CUdeviceptr)dptr(st->buf[1]) + (n1 / 2) * 4, iter * 0x01000193u ^ 0xA5A5A5A5u, MEMSET_WORDS,
                           s1));
    RCHECK(
        cudaMemcpyAsync((char *)st->buf[0] + (n0 / 3) * 4, st->pattern, PATTERN_WORDS * 4, cudaMemcpyHostToDevice, s0));
    RCHECK(cudaEventRecord(st->ev_s1, s1));
    RCHECK(cudaStreamWaitEvent(s0, st->ev_s1, 0));
    unsigned long long dst = dptr(st->buf[0]), src = dptr(st->buf[1]);
    uint32_t count = n0 < MIX_WORDS ? (uint32_t)n0 : MIX_WORDS, nsrc = (uint32_t)n1, it = iter;
    void *args[] = {&dst, &src, &count, &nsrc, &it};
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = (dim3){gpuapp_grid(count), 1, 1};
    cfg.blockDim = (dim3){GPUAPP_BLOCK, 1, 1};
    cfg.stream = s0;
    RCHECK(cudaLaunchKernelExC(&cfg, (const void *)app_hb_mix, args));
    RCHECK(cudaEventRecord(st->ev_mix, s0));
    /* the __device__ variable counts the iterations */
    unsigned long long b = 0;
    RCHECK(cudaMemcpyFromSymbol(&b, &rt_beats, sizeof b, 0, cudaMemcpyDeviceToHost));
    b++;
    RCHECK(cudaMemcpyToSymbol(&rt_beats, &b, sizeof b, 0, cudaMemcpyHostToDevice));
    st->beats = b;
}

static uint64_t checksum(void *p) {
    rt_state *st = p;
    RCHECK(cudaStreamSynchronize(st->s[0]));
    RCHECK(cudaStreamSynchronize(st->s[1]));
    uint64_t h = GPUAPP_SUM_BASIS;
    for (unsigned i = 0; i < st->k; i++)
        h = gpuapp_sum_device(h, i, (CUdeviceptr)dptr(st->buf[i]), st->sizes[i]);
    fprintf(stderr, "rtbeat: beats=%llu\n", st->beats);
    return h;
}

int main(int argc, char **argv) {
    gpuapp app;
    rt_state st;
    gpuapp_parse(&app, "rtbeat", GPUAPP_OPT_MIB | GPUAPP_OPT_BUFFERS | GPUAPP_OPT_GRAPH, 64, 8, argc, argv);
    register_module();
    memset(&st, 0, sizeof st);
    st.k = app.buffers;
    st.sizes = calloc(st.k, sizeof *st.sizes);
    st.buf = calloc(st.k, sizeof *st.buf);
    if (!st.sizes || !st.buf)
        gpuapp_die("out of host memory");
    gpuapp_split_sizes((uint64_t)app.mib << 20, st.k, 4 * 4 * MEMSET_WORDS, st.sizes);

    int count = 0;
    RCHECK(cudaGetDeviceCount(&count));
    if (app.ordinal >= count)
        gpuapp_die("--device %d, but the runtime sees %d device(s)", app.ordinal, count);
    RCHECK(cudaSetDevice(app.ordinal));
    struct cudaDeviceProp prop;
    RCHECK(cudaGetDeviceProperties(&prop, app.ordinal));
    fprintf(stderr, "rtbeat: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    RCHECK(cudaStreamCreate(&st.s[0]));
    RCHECK(cudaStreamCreateWithFlags(&st.s[1], cudaStreamNonBlocking));
    RCHECK(cudaEventCreateWithFlags(&st.ev_s1, cudaEventDisableTiming));
    RCHECK(cudaEventCreateWithFlags(&st.ev_mix, cudaEventDisableTiming));
    RCHECK(cudaHostAlloc((void **)&st.pattern, PATTERN_WORDS * 4, cudaHostAllocDefault));
    for (unsigned i = 0; i < st.k; i++) {
        RCHECK(cudaMalloc(&st.buf[i], st.sizes[i]));
        unsigned long long b = dptr(st.buf[i]);
        uint32_t n = (uint32_t)(st.sizes[i] / 4), seed = app.seed + i * 0x9E3779B9u;
        void *args[] = {&b, &n, &seed};
        RCHECK(cudaLaunchKernel((const void *)app_hb_init, (dim3){gpuapp_grid(n), 1, 1}, (dim3){GPUAPP_BLOCK, 1, 1},
                                args, 0, st.s[i % 2]));
    }
    unsigned long long zero = 0;
    RCHECK(cudaMemcpyToSymbol(&rt_beats, &zero, sizeof zero, 0, cudaMemcpyHostToDevice));
    RCHECK(cudaEventRecord(st.ev_mix, st.s[0]));
    RCHECK(cudaDeviceSynchronize());
    if (app.graph)
        capture_graph(&st);

    gpuapp_ready(&app, app.mib, st.k);
    gpuapp_loop(&app, &st, step, checksum);

    RCHECK(cudaDeviceSynchronize());
    for (unsigned i = 0; i < st.k; i++)
        RCHECK(cudaFree(st.buf[i]));
    if (st.graph) {
        RCHECK(cudaGraphExecDestroy(st.graph));
        RCHECK(cudaEventDestroy(st.ev_graph));
    }
    RCHECK(cudaEventDestroy(st.ev_s1));
    RCHECK(cudaEventDestroy(st.ev_mix));
    RCHECK(cudaStreamDestroy(st.s[0]));
    RCHECK(cudaStreamDestroy(st.s[1]));
    RCHECK(cudaFreeHost(st.pattern));
    free(st.sizes);
    free(st.buf);
    return 0;
}

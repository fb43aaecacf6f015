/*
 * What the CUDA runtime asks of the driver beyond loading and launching:
 * module and library globals, fat binaries, function attributes, occupancy,
 * stream priorities and flags, capture status and mode, event record flags,
 * pointer attributes, context limits.
 */
#include <string.h>

#include "drvtest.h"

/* Module-scope variables in global and constant memory, one with a brace initializer, and an entry. */
static const char globals_ptx[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    ".visible .global .align 4 .u32 dt_counter;\n"
    ".visible .global .align 8 .u64 dt_table[4] = {1, 2, 3, 0x10};\n"
    ".visible .const .align 4 .f32 dt_scale = 0f3F800000;\n"
    ".extern .global .align 4 .u32 dt_elsewhere;\n"
    "\n"
    ".visible .entry dt_globals_noop()\n"
    "{\n"
    "\tret;\n"
    "}\n";

static void check_globals(const char *how, CUresult (*get)(CUdeviceptr *, size_t *, void *, const char *), void *h) {
    CUdeviceptr counter = 0, table = 0, scale = 0;
    size_t n = 0;
    if (EXPECT_RC(get(&counter, &n, h, "dt_counter"), CUDA_SUCCESS))
        EXPECT(counter != 0 && n == 4, "%s: dt_counter at 0x%llx, %zu bytes", how, (unsigned long long)counter, n);
    if (EXPECT_RC(get(&table, &n, h, "dt_table"), CUDA_SUCCESS)) {
        EXPECT(n == 32, "%s: dt_table: %zu bytes", how, n);
        uint64_t v[4] = {0, 0, 0, 0};
        OK(cuMemcpyDtoH(v, table, sizeof v));
        EXPECT(v[0] == 1 && v[1] == 2 && v[2] == 3 && v[3] == 16, "%s: dt_table's initial values: %llu %llu %llu %llu",
               how, (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2],
               (unsigned long long)v[3]);
    }
    if (EXPECT_RC(get(&scale, &n, h, "dt_scale"), CUDA_SUCCESS)) {
        float f = 0;
        OK(cuMemcpyDtoH(&f, scale, sizeof f));
        EXPECT(n == 4 && f == 1.0f, "%s: dt_scale: %zu bytes, %g", how, n, (double)f);
    }
    /* each variable is an address range of its own */
    CUdeviceptr base = 0;
    size_t size = 0;
    if (EXPECT_RC(cuMemGetAddressRange(&base, &size, table + 8), CUDA_SUCCESS))
        EXPECT(base == table && size == 32, "%s: dt_table's range: 0x%llx, %zu bytes (dt_table at 0x%llx)", how,
               (unsigned long long)base, size, (unsigned long long)table);
    /* one output may be left out, not both */
    EXPECT_RC(get(NULL, &n, h, "dt_counter"), CUDA_SUCCESS);
    EXPECT_RC(get(&counter, NULL, h, "dt_counter"), CUDA_SUCCESS);
    EXPECT_RC(get(NULL, NULL, h, "dt_counter"), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(get(&counter, &n, h, "no_such_global"), CUDA_ERROR_NOT_FOUND);
    EXPECT_RC(get(&counter, &n, h, "dt_globals_noop"), CUDA_ERROR_INVALID_VALUE); /* an entry is no variable */
    EXPECT_RC(get(&counter, &n, h, "dt_elsewhere"), CUDA_SUCCESS); /* the JIT gives a declared one storage */
    EXPECT_RC(get(&counter, &n, h, NULL), CUDA_ERROR_INVALID_VALUE);
}

static CUresult module_get(CUdeviceptr *p, size_t *n, void *h, const char *name) {
    return cuModuleGetGlobal(p, n, (CUmodule)h, name);
}
static CUresult library_get(CUdeviceptr *p, size_t *n, void *h, const char *name) {
    return cuLibraryGetGlobal(p, n, (CUlibrary)h, name);
}

static void module_globals(void) {
    dt_init_ctx();
    CUmodule m;
    OK(cuModuleLoadData(&m, globals_ptx));
    check_globals("module", module_get, m);
    /* device memory like any other: kernels and copies use it */
    CUdeviceptr counter;
    OK(cuModuleGetGlobal(&counter, NULL, m, "dt_counter"));
    CUmodule dm = dt_module();
    CUfunction add = dt_function(dm, "dt_add");
    uint32_t v = 40, n = 1, a = 2;
    OK(cuMemcpyHtoD(counter, &v, sizeof v));
    void *args[] = {&counter, &n, &a};
    OK(cuLaunchKernel(add, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    OK(cuMemcpyDtoH(&v, counter, sizeof v));
    EXPECT(v == 42, "dt_counter after dt_add: %u", v);
    unsigned type = 0;
    if (EXPECT_RC(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, counter), CUDA_SUCCESS))
        EXPECT(type == CU_MEMORYTYPE_DEVICE, "a global's memory type: %u", type);
    /* a second load is another copy of the variables */
    CUmodule m2;
    CUdeviceptr counter2;
    OK(cuModuleLoadData(&m2, globals_ptx));
    OK(cuModuleGetGlobal(&counter2, NULL, m2, "dt_counter"));
    EXPECT(counter2 != counter, "two loads share dt_counter at 0x%llx", (unsigned long long)counter);
    OK(cuModuleUnload(m2));
    OK(cuModuleUnload(m));
    OK(cuModuleUnload(dm));

    CUlibrary l;
    OK(cuLibraryLoadData(&l, globals_ptx, NULL, NULL, 0, NULL, NULL, 0));
    check_globals("library", library_get, l);
    CUdeviceptr p1, p2;
    OK(cuLibraryGetGlobal(&p1, NULL, l, "dt_counter"));
    OK(cuLibraryGetGlobal(&p2, NULL, l, "dt_counter"));
    EXPECT(p1 == p2, "a library's global moved: 0x%llx then 0x%llx", (unsigned long long)p1, (unsigned long long)p2);
    OK(cuLibraryUnload(l));
}

/* ---- fat binaries: the container nvcc embeds, with its entries (sim_fatbin.c says the layout) ---- */

typedef struct {
    unsigned char b[16384];
    size_t n;
} fatbin;

static void fb_put(fatbin *f, const void *p, size_t n) {
    if (f->n + n > sizeof f->b) {
        dt_fail(__LINE__, "test fat binary too large");
        dt_stop();
    }
    memcpy(f->b + f->n, p, n);
    f->n += n;
}

static void fb_header(fatbin *f) {
    f->n = 0;
    uint32_t magic = 0xBA55ED50u;
    uint16_t version = 1, hsize = 16;
    uint64_t fsize = 0;
    fb_put(f, &magic, 4);
    fb_put(f, &version, 2);
    fb_put(f, &hsize, 2);
    fb_put(f, &fsize, 8);
}

/* An entry: kind 1 PTX, 2 ELF; payload_size may lie (past the container) when psize_claim is nonzero. */
static void fb_entry(fatbin *f, uint16_t kind, const void *payload, uint64_t n, uint32_t csize, uint64_t flags,
                     uint64_t psize_claim) {
    unsigned char h[64];
    memset(h, 0, sizeof h);
    uint16_t version = 0x101, minor = 8, major = 7;
    uint32_t hsize = sizeof h, arch = 90;
    uint64_t psize = psize_claim ? psize_claim : n;
    memcpy(h, &kind, 2);
    memcpy(h + 2, &version, 2);
    memcpy(h + 4, &hsize, 4);
    memcpy(h + 8, &psize, 8);
    memcpy(h + 16, &csize, 4);
    memcpy(h + 24, &minor, 2);
    memcpy(h + 26, &major, 2);
    memcpy(h + 28, &arch, 4);
    memcpy(h + 40, &flags, 8);
    fb_put(f, h, sizeof h);
    fb_put(f, payload, n);
    uint64_t fsize = f->n - 16;
    memcpy(f->b + 8, &fsize, 8);
}

/* cudart's wrapper around a fat binary (__cudaRegisterFatBinary's argument). */
typedef struct {
    int32_t magic, version;
    const void *data;
    void *unused;
} fatbin_wrapper;

static void module_fatbin(void) {
    dt_init_ctx();
    static const unsigned char elf[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
    static fatbin f;
    /* a cubin first, then the PTX (without its NUL: the payload's size ends it) */
    fb_header(&f);
    fb_entry(&f, 2, elf, sizeof elf, 0, 0, 0);
    fb_entry(&f, 1, dt_ptx, strlen(dt_ptx), 0, 0, 0);
    CUmodule m;
    if (EXPECT_RC(cuModuleLoadData(&m, f.b), CUDA_SUCCESS)) {
        dt_function(m, "dt_fill");
        OK(cuModuleUnload(m));
    }
    if (EXPECT_RC(cuModuleLoadFatBinary(&m, f.b), CUDA_SUCCESS))
        OK(cuModuleUnload(m));
    fatbin_wrapper w = {(int32_t)0x466243B1u, 1, f.b, NULL};
    if (EXPECT_RC(cuModuleLoadFatBinary(&m, &w), CUDA_SUCCESS))
        OK(cuModuleUnload(m));
    if (EXPECT_RC(cuModuleLoadData(&m, &w), CUDA_SUCCESS))
        OK(cuModuleUnload(m));
    CUlibrary l;
    CUkernel k;
    if (EXPECT_RC(cuLibraryLoadData(&l, f.b, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS)) {
        EXPECT_RC(cuLibraryGetKernel(&k, l, "dt_echo"), CUDA_SUCCESS);
        OK(cuLibraryUnload(l));
    }
    w.version = 3;
    EXPECT_RC(cuModuleLoadFatBinary(&m, &w), CUDA_ERROR_INVALID_IMAGE);
    /* nothing the GPU can run: machine code only, or compressed PTX */
    fb_header(&f);
    fb_entry(&f, 2, elf, sizeof elf, 0, 0, 0);
    EXPECT_RC(cuModuleLoadData(&m, f.b), CUDA_ERROR_NO_BINARY_FOR_GPU);
    fb_header(&f);
    fb_entry(&f, 1, dt_ptx, 256, 200, 0x2000, 0);
    EXPECT_RC(cuModuleLoadData(&m, f.b), CUDA_ERROR_NO_BINARY_FOR_GPU);
    /* an entry whose payload runs past the container */
    fb_header(&f);
    fb_entry(&f, 1, dt_ptx, 64, 0, 0, 1ull << 40);
    EXPECT_RC(cuModuleLoadData(&m, f.b), CUDA_ERROR_INVALID_IMAGE);
}

/* ---- function attributes, occupancy ---- */

static void func_attributes(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction f = dt_function(m, "dt_fill");
    int v = -1;
    if (EXPECT_RC(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f), CUDA_SUCCESS))
        EXPECT(v >= 128 && v <= 1024, "MAX_THREADS_PER_BLOCK: %d", v);
    if (EXPECT_RC(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_PTX_VERSION, f), CUDA_SUCCESS))
        EXPECT(v == 75, "PTX_VERSION (the .target's architecture): %d", v);
    if (EXPECT_RC(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_BINARY_VERSION, f), CUDA_SUCCESS))
        EXPECT(v >= 75, "BINARY_VERSION: %d", v);
    if (EXPECT_RC(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f), CUDA_SUCCESS))
        EXPECT(v == 49152, "MAX_DYNAMIC_SHARED_SIZE_BYTES by default: %d", v);
    EXPECT_RC(cuFuncGetAttribute(NULL, CU_FUNC_ATTRIBUTE_NUM_REGS, f), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuFuncGetAttribute(&v, (CUfunction_attribute)99, f), CUDA_ERROR_INVALID_VALUE);
    OK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 65536));
    if (EXPECT_RC(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f), CUDA_SUCCESS))
        EXPECT(v == 65536, "MAX_DYNAMIC_SHARED_SIZE_BYTES after the set: %d", v);
    EXPECT_RC(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1 << 30),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, -1), CUDA_ERROR_INVALID_VALUE);
    OK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 50));
    if (EXPECT_RC(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, f), CUDA_SUCCESS))
        EXPECT(v == 50, "PREFERRED_SHARED_MEMORY_CARVEOUT: %d", v);
    EXPECT_RC(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 101), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_NUM_REGS, 8), CUDA_ERROR_INVALID_VALUE); /* read-only */
    OK(cuFuncSetCacheConfig(f, CU_FUNC_CACHE_PREFER_SHARED));
    OK(cuFuncSetCacheConfig(f, CU_FUNC_CACHE_PREFER_NONE));
    /* the function of another load is another function: its attributes are its own */
    CUmodule m2 = dt_module();
    CUfunction f2 = dt_function(m2, "dt_fill");
    if (EXPECT_RC(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f2), CUDA_SUCCESS))
        EXPECT(v == 49152, "another load's function: MAX_DYNAMIC_SHARED_SIZE_BYTES %d", v);
    OK(cuModuleUnload(m2));
    /* a kernel is not a function here */
    CUlibrary l;
    CUkernel k;
    OK(cuLibraryLoadData(&l, dt_ptx, NULL, NULL, 0, NULL, NULL, 0));
    OK(cuLibraryGetKernel(&k, l, "dt_fill"));
    EXPECT_RC(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, (CUfunction)k),
              CUDA_ERROR_INVALID_HANDLE);
    OK(cuLibraryUnload(l));
    OK(cuModuleUnload(m));
}

/* More dynamic shared memory than a function allows fails its launch, until the function is allowed it. */
static void func_shared_launch(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction f = dt_function(m, "dt_fill");
    CUdeviceptr p = dt_alloc(4096);
    uint32_t val = 7, n = 128;
    void *args[] = {&p, &val, &n};
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 65536, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    OK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 65536));
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 65536, NULL, args, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSynchronize(), CUDA_SUCCESS);
    uint32_t got = 0;
    OK(cuMemcpyDtoH(&got, p + 4 * 127, sizeof got));
    EXPECT(got == 7, "dt_fill with 64 KiB of dynamic shared memory wrote %u", got);
    OK(cuMemFree(p));
    OK(cuModuleUnload(m));
}

/* What only the simulator says so: its refusals and its fixed answers. */
static void func_attributes_sim(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction f = dt_function(m, "dt_fill");
    EXPECT_RC(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, 2), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_RC(cuFuncSetCacheConfig(f, (CUfunc_cache)7), CUDA_ERROR_INVALID_VALUE);
    int n = -1;
    if (EXPECT_RC(cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, 128, 0), CUDA_SUCCESS))
        EXPECT(n == 16, "blocks of 128 threads at 32 registers: %d", n);
    if (EXPECT_RC(cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, 2048, 0), CUDA_SUCCESS))
        EXPECT(n == 0, "blocks larger than a block may be: %d", n);
    if (EXPECT_RC(cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, 128, 100000), CUDA_SUCCESS))
        EXPECT(n == 0, "more dynamic shared memory than the function allows: %d", n);
    OK(cuModuleUnload(m));
}

static void occupancy(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction f = dt_function(m, "dt_fill");
    int n = -1, nf = -1;
    if (EXPECT_RC(cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, 128, 0), CUDA_SUCCESS))
        EXPECT(n >= 1 && n <= 32, "blocks of 128 threads: %d", n);
    if (EXPECT_RC(
            cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&nf, f, 128, 0, CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE),
            CUDA_SUCCESS))
        EXPECT(nf == n, "with DISABLE_CACHING_OVERRIDE: %d, without %d", nf, n);
    int n2 = -1;
    if (EXPECT_RC(cuOccupancyMaxActiveBlocksPerMultiprocessor(&n2, f, 1024, 0), CUDA_SUCCESS))
        EXPECT(n2 >= 1 && n2 <= n, "blocks of 1024 threads: %d (of 128: %d)", n2, n);
    EXPECT_RC(cuOccupancyMaxActiveBlocksPerMultiprocessor(NULL, f, 128, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&n, f, 128, 0, 4), CUDA_ERROR_INVALID_VALUE);
    OK(cuModuleUnload(m));
}

/* ---- streams, capture, events ---- */

static void stream_priority(void) {
    dt_init_ctx();
    int least = 99, greatest = 99;
    OK(cuCtxGetStreamPriorityRange(&least, &greatest));
    EXPECT(least == 0 && greatest == -5, "priority range: least %d, greatest %d", least, greatest);
    OK(cuCtxGetStreamPriorityRange(NULL, &greatest));
    OK(cuCtxGetStreamPriorityRange(&least, NULL));
    static const struct { int ask, get; } cases[] = {{-3, -3}, {0, 0}, {-5, -5}, {-100, -5}, {7, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CUstream s;
        OK(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, cases[i].ask));
        int p = 99;
        unsigned fl = 99;
        if (EXPECT_RC(cuStreamGetPriority(s, &p), CUDA_SUCCESS))
            EXPECT(p == cases[i].get, "priority %d: got %d, want %d", cases[i].ask, p, cases[i].get);
        if (EXPECT_RC(cuStreamGetFlags(s, &fl), CUDA_SUCCESS))
            EXPECT(fl == CU_STREAM_NON_BLOCKING, "flags of a non-blocking stream: %u", fl);
        OK(cuStreamDestroy(s));
    }
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_DEFAULT));
    int p = 99;
    unsigned fl = 99;
    if (EXPECT_RC(cuStreamGetPriority(s, &p), CUDA_SUCCESS))
        EXPECT(p == 0, "cuStreamCreate's priority: %d", p);
    if (EXPECT_RC(cuStreamGetFlags(s, &fl), CUDA_SUCCESS))
        EXPECT(fl == CU_STREAM_DEFAULT, "cuStreamCreate's flags: %u", fl);
    if (EXPECT_RC(cuStreamGetPriority(NULL, &p), CUDA_SUCCESS))
        EXPECT(p == 0, "the NULL stream's priority: %d", p);
    EXPECT_RC(cuStreamGetPriority(s, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuStreamGetFlags(s, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuStreamCreateWithPriority(&s, 0x10, 0), CUDA_ERROR_INVALID_VALUE);
    OK(cuStreamDestroy(s));
}

static void stream_capture_status(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction fill = dt_function(m, "dt_fill");
    CUdeviceptr p = dt_alloc(4096);
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    if (EXPECT_RC(cuStreamIsCapturing(s, &st), CUDA_SUCCESS))
        EXPECT(st == CU_STREAM_CAPTURE_STATUS_NONE, "before the capture: %d", (int)st);
    OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    if (EXPECT_RC(cuStreamIsCapturing(s, &st), CUDA_SUCCESS))
        EXPECT(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "in the capture: %d", (int)st);
    /* a non-blocking stream's capture leaves the legacy stream alone */
    if (EXPECT_RC(cuStreamIsCapturing(NULL, &st), CUDA_SUCCESS))
        EXPECT(st == CU_STREAM_CAPTURE_STATUS_NONE, "the NULL stream during the capture: %d", (int)st);
    dt_launch_fill(fill, s, p, 3, 1024);
    CUgraph g;
    OK(cuStreamEndCapture(s, &g));
    if (EXPECT_RC(cuStreamIsCapturing(s, &st), CUDA_SUCCESS))
        EXPECT(st == CU_STREAM_CAPTURE_STATUS_NONE, "after the capture: %d", (int)st);
    if (EXPECT_RC(cuStreamIsCapturing(NULL, &st), CUDA_SUCCESS))
        EXPECT(st == CU_STREAM_CAPTURE_STATUS_NONE, "the NULL stream: %d", (int)st);
    EXPECT_RC(cuStreamIsCapturing(s, NULL), CUDA_ERROR_INVALID_VALUE);
    OK(cuGraphDestroy(g));

    /* the thread's mode, exchanged */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    OK(cuThreadExchangeStreamCaptureMode(&mode));
    EXPECT(mode == CU_STREAM_CAPTURE_MODE_GLOBAL, "a thread's first mode: %d", (int)mode);
    mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    OK(cuThreadExchangeStreamCaptureMode(&mode));
    EXPECT(mode == CU_STREAM_CAPTURE_MODE_RELAXED, "the mode set before: %d", (int)mode);
    if (dt_is_sim()) /* the driver crashes on it */
        EXPECT_RC(cuThreadExchangeStreamCaptureMode(NULL), CUDA_ERROR_INVALID_VALUE);
    OK(cuStreamDestroy(s));
    OK(cuMemFree(p));
    OK(cuModuleUnload(m));
}

static void event_record_flags(void) {
    dt_init_ctx();
    CUstream s;
    CUevent a, b;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuEventCreate(&a, CU_EVENT_DEFAULT));
    OK(cuEventCreate(&b, CU_EVENT_DEFAULT));
    OK(cuEventRecordWithFlags(a, s, CU_EVENT_RECORD_DEFAULT));
    /* an external record is for a capture's event node */
    EXPECT_RC(cuEventRecordWithFlags(b, s, CU_EVENT_RECORD_EXTERNAL), CUDA_ERROR_ILLEGAL_STATE);
    OK(cuEventRecordWithFlags(b, s, CU_EVENT_RECORD_DEFAULT));
    OK(cuEventSynchronize(b));
    float ms = -1;
    if (EXPECT_RC(cuEventElapsedTime(&ms, a, b), CUDA_SUCCESS))
        EXPECT(ms >= 0, "elapsed between two records: %g", (double)ms);
    EXPECT_RC(cuEventRecordWithFlags(a, s, 2), CUDA_ERROR_INVALID_VALUE);
    OK(cuEventDestroy(a));
    OK(cuEventDestroy(b));
    OK(cuStreamDestroy(s));
}

/* ---- pointer attributes ---- */

static void pointer_attributes(void) {
    CUcontext ctx = dt_init_ctx();
    CUdeviceptr p = dt_alloc(4096);
    CUpointer_attribute which[] = {
        CU_POINTER_ATTRIBUTE_CONTEXT,        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_IS_MANAGED,  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE,     CU_POINTER_ATTRIBUTE_MAPPED,      CU_POINTER_ATTRIBUTE_BUFFER_ID,
        CU_POINTER_ATTRIBUTE_HOST_POINTER,
    };
    CUcontext c = NULL;
    unsigned type = 99;
    CUdeviceptr dp = 1, start = 1;
    int ord = 99, managed = 99, mapped = 99;
    size_t size = 1;
    unsigned long long id = 0;
    void *host = (void *)1;
    void *data[] = {&c, &type, &dp, &ord, &managed, &start, &size, &mapped, &id, &host};
    if (EXPECT_RC(cuPointerGetAttributes(10, which, data, p + 16), CUDA_SUCCESS)) {
        EXPECT(c == ctx, "CONTEXT: %p, want %p", (void *)c, (void *)ctx);
        EXPECT(type == CU_MEMORYTYPE_DEVICE, "MEMORY_TYPE: %u", type);
        EXPECT(dp == p + 16, "DEVICE_POINTER: 0x%llx", (unsigned long long)dp);
        EXPECT(ord == 0 && managed == 0 && mapped == 1, "DEVICE_ORDINAL %d, IS_MANAGED %d, MAPPED %d", ord, managed,
               mapped);
        EXPECT(start == p && size == 4096, "RANGE: 0x%llx, %zu bytes", (unsigned long long)start, size);
        EXPECT(id != 0, "BUFFER_ID: 0");
        EXPECT(host == NULL, "HOST_POINTER of device memory: %p", host);
    }
    if (EXPECT_RC(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), CUDA_SUCCESS))
        EXPECT(type == CU_MEMORYTYPE_DEVICE, "MEMORY_TYPE alone: %u", type);
    if (EXPECT_RC(cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, p), CUDA_SUCCESS))
        EXPECT(c == ctx, "CONTEXT alone: %p", (void *)c);
    EXPECT_RC(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, p), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuPointerGetAttribute(&type, (CUpointer_attribute)99, p), CUDA_ERROR_INVALID_VALUE);

    /* memory the driver does not know: one attribute fails, several are zeros */
    static char plain[64];
    CUdeviceptr hp = (CUdeviceptr)(uintptr_t)plain;
    EXPECT_RC(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, hp), CUDA_ERROR_INVALID_VALUE);
    c = (CUcontext)1;
    type = 99;
    dp = 1;
    ord = 99;
    if (EXPECT_RC(cuPointerGetAttributes(4, which, data, hp), CUDA_SUCCESS))
        EXPECT(type == 0 && c == NULL && dp == 0 && ord == -2,
               "unknown memory: MEMORY_TYPE %u, CONTEXT %p, DEVICE_POINTER 0x%llx, DEVICE_ORDINAL %d", type, (void *)c,
               (unsigned long long)dp, ord);

    /* page-locked host memory: host memory at the same address on both sides */
    void *pinned;
    OK(cuMemAllocHost(&pinned, 4096));
    CUdeviceptr pp = (CUdeviceptr)(uintptr_t)pinned;
    if (EXPECT_RC(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pp), CUDA_SUCCESS))
        EXPECT(type == CU_MEMORYTYPE_HOST, "pinned memory's MEMORY_TYPE: %u", type);
    if (EXPECT_RC(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, pp), CUDA_SUCCESS))
        EXPECT(host == pinned, "pinned memory's HOST_POINTER: %p", host);
    if (EXPECT_RC(cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, pp), CUDA_SUCCESS))
        EXPECT(dp == pp, "pinned memory's DEVICE_POINTER: 0x%llx", (unsigned long long)dp);
    OK(cuMemFreeHost(pinned));
    OK(cuMemFree(p));
}

/* ---- context limits ---- */

static void ctx_limits(void) {
    dt_init_ctx();
    size_t v = 0;
    if (EXPECT_RC(cuCtxGetLimit(&v, CU_LIMIT_STACK_SIZE), CUDA_SUCCESS))
        EXPECT(v > 0, "STACK_SIZE: %zu", v);
    OK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 16u << 20));
    if (EXPECT_RC(cuCtxGetLimit(&v, CU_LIMIT_MALLOC_HEAP_SIZE), CUDA_SUCCESS))
        EXPECT(v == 16u << 20, "MALLOC_HEAP_SIZE after the set: %zu", v);
    OK(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 4u << 20));
    if (EXPECT_RC(cuCtxGetLimit(&v, CU_LIMIT_PRINTF_FIFO_SIZE), CUDA_SUCCESS))
        EXPECT(v == 4u << 20, "PRINTF_FIFO_SIZE after the set: %zu", v);
    OK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096));
    if (EXPECT_RC(cuCtxGetLimit(&v, CU_LIMIT_STACK_SIZE), CUDA_SUCCESS))
        EXPECT(v >= 4096, "STACK_SIZE after the set: %zu", v);
    EXPECT_RC(cuCtxGetLimit(NULL, CU_LIMIT_STACK_SIZE), CUDA_ERROR_INVALID_VALUE);
    if (dt_is_sim()) {
        EXPECT_RC(cuCtxGetLimit(&v, (CUlimit)99), CUDA_ERROR_INVALID_VALUE);
        EXPECT_RC(cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 4), CUDA_ERROR_UNSUPPORTED_LIMIT);
        EXPECT_RC(cuCtxSetLimit(CU_LIMIT_MAX_L2_FETCH_GRANULARITY, 1000), CUDA_ERROR_INVALID_VALUE);
    }
}

const dt_case dt_cases_func[] = {
    {"module_globals", module_globals, 0},
    {"module_fatbin", module_fatbin, DT_SIM_ONLY},
    {"func_attributes", func_attributes, 0},
    {"func_shared_launch", func_shared_launch, 0},
    {"func_attributes_sim", func_attributes_sim, DT_SIM_ONLY},
    {"occupancy", occupancy, 0},
    {"stream_priority", stream_priority, 0},
    {"stream_capture_status", stream_capture_status, 0},
    {"event_record_flags", event_record_flags, 0},
    {"pointer_attributes", pointer_attributes, 0},
    {"ctx_limits", ctx_limits, 0},
    {NULL, NULL, 0},
};

/* Initialization, devices, primary contexts, error strings, cuGetProcAddress. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "drvtest.h"

/* Exported by libcuda but not declared by cudadrv.h (it maps to the _v2 names): looked up by name. */
typedef CUresult (*getproc_v1_fn)(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
typedef CUresult (*uuid_v1_fn)(CUuuid *uuid, CUdevice dev);

static void not_initialized(void) {
    int n = -1;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    CUstream s;
    CUmodule m;
    CUlibrary l;
    size_t g;
    CUprocessState st;
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    const CUresult NI = CUDA_ERROR_NOT_INITIALIZED;
    EXPECT_RC(cuDeviceGetCount(&n), NI);
    EXPECT_RC(cuDeviceGet(&dev, 0), NI);
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), NI);
    EXPECT_RC(cuCtxGetCurrent(&ctx), NI);
    EXPECT_RC(cuMemAlloc(&p, 4096), NI);
    EXPECT_RC(cuStreamCreate(&s, 0), NI);
    EXPECT_RC(cuModuleLoadData(&m, dt_ptx), NI);
    EXPECT_RC(cuLibraryLoadData(&l, dt_ptx, NULL, NULL, 0, NULL, NULL, 0), NI);
    EXPECT_RC(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), NI);
    EXPECT_RC(cuMemCreate(&h, 2 << 20, &prop, 0), NI);
    EXPECT_RC(cuCheckpointProcessGetState((int)getppid(), &st), EXP_CKPT_BEFORE_INIT);
    /* these work before cuInit: programs use them to find and describe the driver */
    int v = 0;
    EXPECT_RC(cuDriverGetVersion(&v), CUDA_SUCCESS);
    const char *str = NULL;
    EXPECT_RC(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &str), CUDA_SUCCESS);
    void *fn = NULL;
    CUdriverProcAddressQueryResult q;
    EXPECT_RC(cuGetProcAddress_v2("cuInit", &fn, 13000, 0, &q), CUDA_SUCCESS);
    EXPECT(fn != NULL, "cuGetProcAddress(cuInit) before cuInit gave NULL");
    REQUIRE_RC(cuInit(0), CUDA_SUCCESS);
    EXPECT_RC(cuDeviceGetCount(&n), CUDA_SUCCESS);
}

static void init(void) {
    EXPECT_RC(cuInit(1), EXP_INIT_BAD_FLAGS);
    EXPECT_RC(cuInit(0), CUDA_SUCCESS);
    EXPECT_RC(cuInit(0), CUDA_SUCCESS);
    int v = 0;
    OK(cuDriverGetVersion(&v));
    EXPECT(v >= 13000, "cuDriverGetVersion gave %d, want >= 13000", v);
    EXPECT_RC(cuDriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE);
}

static void fork_child(void) {
    dt_init_ctx();
    CUdeviceptr p = dt_alloc(1 << 20);
    (void)p;
    int fds[2];
    REQUIRE(pipe(fds) == 0, "pipe");
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        int n;
        CUresult r[2] = {cuInit(0), cuDeviceGetCount(&n)};
        ssize_t w = write(fds[1], r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fds[1]);
    CUresult r[2] = {CUDA_SUCCESS, CUDA_SUCCESS};
    ssize_t got = read(fds[0], r, sizeof r);
    close(fds[0]);
    int st;
    waitpid(pid, &st, 0);
    REQUIRE(got == (ssize_t)sizeof r, "the forked child reported nothing");
    EXPECT(r[0] == EXP_FORK_CHILD_INIT, "cuInit in a fork child (got %s want %s)", dt_err(r[0]),
           dt_err(EXP_FORK_CHILD_INIT));
    EXPECT(r[1] == EXP_FORK_CHILD_CALL, "cuDeviceGetCount in a fork child (got %s want %s)", dt_err(r[1]),
           dt_err(EXP_FORK_CHILD_CALL));
    /* the parent is unaffected */
    CUdeviceptr q;
    EXPECT_RC(cuMemAlloc(&q, 4096), CUDA_SUCCESS);
}

static void device_get(void) {
    OK(cuInit(0));
    int n = 0;
    OK(cuDeviceGetCount(&n));
    REQUIRE(n >= 1, "cuDeviceGetCount gave %d", n);
    CUdevice d;
    EXPECT_RC(cuDeviceGet(&d, 0), CUDA_SUCCESS);
    EXPECT_RC(cuDeviceGet(&d, n), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDeviceGet(&d, -1), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDeviceGetCount(NULL), CUDA_ERROR_INVALID_VALUE);
}

static void device_attributes(void) {
    OK(cuInit(0));
    int v;
#define ATTR_IS(a, want)                                                                                               \
    do {                                                                                                               \
        if (EXPECT_RC(cuDeviceGetAttribute(&v, a, 0), CUDA_SUCCESS))                                                   \
            EXPECT(v == (want), #a " = %d, want %d", v, (want));                                                       \
    } while (0)
    ATTR_IS(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9);
    ATTR_IS(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0);
    ATTR_IS(CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32);
    ATTR_IS(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024);
    ATTR_IS(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64);
    ATTR_IS(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1);
    ATTR_IS(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1);
    ATTR_IS(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1);
    ATTR_IS(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1);
    ATTR_IS(CU_DEVICE_ATTRIBUTE_INTEGRATED, 0);
    if (EXPECT_RC(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0), CUDA_SUCCESS))
        EXPECT(v >= 100, "MULTIPROCESSOR_COUNT = %d", v);
    EXPECT_RC(cuDeviceGetAttribute(&v, (CUdevice_attribute)100000, 0), EXP_ATTR_UNKNOWN);
    EXPECT_RC(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 99), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0), CUDA_ERROR_INVALID_VALUE);
}

static void device_info(void) {
    dt_init_ctx();
    char name[256] = "";
    OK(cuDeviceGetName(name, sizeof name, 0));
    EXPECT(name[0] != 0, "empty device name");
    EXPECT_RC(cuDeviceGetName(name, sizeof name, 99), CUDA_ERROR_INVALID_DEVICE);
    CUuuid a, b, c;
    OK(cuDeviceGetUuid_v2(&a, 0));
    OK(cuDeviceGetUuid_v2(&b, 0));
    uuid_v1_fn uuid_v1 = (uuid_v1_fn)dt_sym("cuDeviceGetUuid");
    OK(uuid_v1(&c, 0));
    EXPECT(memcmp(&a, &b, sizeof a) == 0, "two cuDeviceGetUuid_v2 calls disagree");
    EXPECT(memcmp(&a, &c, sizeof a) == 0, "cuDeviceGetUuid and cuDeviceGetUuid_v2 disagree");
    EXPECT_RC(cuDeviceGetUuid_v2(&a, 99), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDeviceGetUuid_v2(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    size_t total = 0, free_ = 0, total2 = 0;
    OK(cuDeviceTotalMem(&total, 0));
    EXPECT(total >= (1ULL << 30), "cuDeviceTotalMem = %zu", total);
    size_t junk;
    EXPECT_RC(cuDeviceTotalMem(&junk, 99), CUDA_ERROR_INVALID_DEVICE);
    OK(cuMemGetInfo(&free_, &total2));
    EXPECT(total2 == total, "cuMemGetInfo total %zu != cuDeviceTotalMem %zu", total2, total);
    EXPECT(free_ <= total && free_ > 0, "cuMemGetInfo free %zu of %zu", free_, total);
}

static void primary_ctx(void) {
    OK(cuInit(0));
    unsigned flags;
    int active = -1;
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT(active == 0, "primary context active before any retain");
    CUcontext cur = (CUcontext)1;
    OK(cuCtxGetCurrent(&cur));
    EXPECT(cur == NULL, "a current context before any was set");
    CUdeviceptr p;
    CUstream s;
    CUdevice d;
    EXPECT_RC(cuMemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_RC(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_RC(cuCtxGetDevice(&d), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_RC(cuStreamCreate(&s, 0), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext ctx, ctx2;
    OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT(active == 1, "primary context not active after retain");
    /* retaining does not make it current */
    EXPECT_RC(cuMemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
    OK(cuCtxSetCurrent(ctx));
    OK(cuCtxGetCurrent(&cur));
    EXPECT(cur == ctx, "cuCtxGetCurrent is not the context just set");
    d = -1;
    OK(cuCtxGetDevice(&d));
    EXPECT(d == 0, "cuCtxGetDevice = %d", d);
    EXPECT_RC(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
    OK(cuDevicePrimaryCtxRetain(&ctx2, 0));
    EXPECT(ctx2 == ctx, "a second retain gave another context");
    OK(cuDevicePrimaryCtxRelease(0));
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT(active == 1, "released once of twice, yet inactive");
    OK(cuCtxSetCurrent(NULL));
    OK(cuDevicePrimaryCtxRelease(0));
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT(active == 0, "still active after the last release");
    EXPECT_RC(cuDevicePrimaryCtxRelease(0), EXP_PRIMARY_RELEASE_UNRETAINED);
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 99), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDevicePrimaryCtxGetState(99, &flags, &active), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDevicePrimaryCtxRelease(99), CUDA_ERROR_INVALID_DEVICE);
    /* a new retain gives a working context again */
    OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    OK(cuCtxSetCurrent(ctx));
    EXPECT_RC(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
}

/* The helper may ask for CU_CTX_SCHED_BLOCKING_SYNC before its first retain
 * (GPUCR_HELPER_WAIT=block). */
static void primary_flags(void) {
    OK(cuInit(0));
    unsigned flags = 99;
    int active = -1;
    OK(cuDevicePrimaryCtxSetFlags(0, CU_CTX_SCHED_BLOCKING_SYNC));
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT(flags == CU_CTX_SCHED_BLOCKING_SYNC, "flags %#x after setting blocking sync", flags);
    EXPECT(active == 0, "setting flags made the primary context active");
    CUcontext ctx;
    OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT(flags == CU_CTX_SCHED_BLOCKING_SYNC && active == 1, "flags %#x active %d after retain", flags, active);
    /* two scheduling modes at once, and an unknown bit */
    EXPECT_RC(cuDevicePrimaryCtxSetFlags(0, CU_CTX_SCHED_SPIN | CU_CTX_SCHED_YIELD), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDevicePrimaryCtxSetFlags(0, 0x10000), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDevicePrimaryCtxSetFlags(99, 0), CUDA_ERROR_INVALID_DEVICE);
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT(flags == CU_CTX_SCHED_BLOCKING_SYNC, "a refused cuDevicePrimaryCtxSetFlags changed the flags to %#x", flags);
    OK(cuDevicePrimaryCtxRelease(0));
    OK(cuDevicePrimaryCtxSetFlags(0, CU_CTX_SCHED_AUTO));
}

static CUcontext thread_ctx;
static CUresult thread_rc[3];

static void *ctx_thread(void *arg) {
    (void)arg;
    CUcontext cur = (CUcontext)1;
    thread_rc[0] = cuCtxGetCurrent(&cur);
    if (thread_rc[0] == CUDA_SUCCESS && cur != NULL)
        thread_rc[0] = CUDA_ERROR_UNKNOWN; /* another thread's context leaked in */
    CUdeviceptr p;
    thread_rc[1] = cuMemAlloc(&p, 4096);
    thread_rc[2] = cuCtxSetCurrent(thread_ctx);
    if (thread_rc[2] == CUDA_SUCCESS)
        thread_rc[2] = cuMemAlloc(&p, 4096);
    return NULL;
}

static void ctx_per_thread(void) {
    thread_ctx = dt_init_ctx();
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, ctx_thread, NULL) == 0, "pthread_create");
    pthread_join(t, NULL);
    EXPECT(thread_rc[0] == CUDA_SUCCESS, "cuCtxGetCurrent in a new thread: %s (UNKNOWN: not NULL)",
           dt_err(thread_rc[0]));
    EXPECT(thread_rc[1] == CUDA_ERROR_INVALID_CONTEXT, "cuMemAlloc in a thread without context (got %s want %s)",
           dt_err(thread_rc[1]), dt_err(CUDA_ERROR_INVALID_CONTEXT));
    EXPECT(thread_rc[2] == CUDA_SUCCESS, "cuMemAlloc after cuCtxSetCurrent in a thread: %s", dt_err(thread_rc[2]));
}

static void error_strings(void) {
    static const struct {
        CUresult code;
        const char *name;
    } codes[] = {
#define C(x) {x, #x}
        C(CUDA_SUCCESS),
        C(CUDA_ERROR_INVALID_VALUE),
        C(CUDA_ERROR_OUT_OF_MEMORY),
        C(CUDA_ERROR_NOT_INITIALIZED),
        C(CUDA_ERROR_DEINITIALIZED),
        C(CUDA_ERROR_STUB_LIBRARY),
        C(CUDA_ERROR_DEVICE_UNAVAILABLE),
        C(CUDA_ERROR_NO_DEVICE),
        C(CUDA_ERROR_INVALID_DEVICE),
        C(CUDA_ERROR_INVALID_IMAGE),
        C(CUDA_ERROR_INVALID_CONTEXT),
        C(CUDA_ERROR_MAP_FAILED),
        C(CUDA_ERROR_UNMAP_FAILED),
        C(CUDA_ERROR_ALREADY_MAPPED),
        C(CUDA_ERROR_NO_BINARY_FOR_GPU),
        C(CUDA_ERROR_NOT_MAPPED),
        C(CUDA_ERROR_INVALID_PTX),
        C(CUDA_ERROR_INVALID_SOURCE),
        C(CUDA_ERROR_FILE_NOT_FOUND),
        C(CUDA_ERROR_OPERATING_SYSTEM),
        C(CUDA_ERROR_INVALID_HANDLE),
        C(CUDA_ERROR_ILLEGAL_STATE),
        C(CUDA_ERROR_NOT_FOUND),
        C(CUDA_ERROR_NOT_READY),
        C(CUDA_ERROR_ILLEGAL_ADDRESS),
        C(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
        C(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED),
        C(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        C(CUDA_ERROR_LAUNCH_FAILED),
        C(CUDA_ERROR_NOT_PERMITTED),
        C(CUDA_ERROR_NOT_SUPPORTED),
        C(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
        C(CUDA_ERROR_TIMEOUT),
        C(CUDA_ERROR_UNKNOWN),
#undef C
    };
    OK(cuInit(0));
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *n = NULL, *s = NULL;
        if (EXPECT_RC(cuGetErrorName(codes[i].code, &n), CUDA_SUCCESS))
            EXPECT(n && strcmp(n, codes[i].name) == 0, "cuGetErrorName(%d) = %s, want %s", (int)codes[i].code,
                   n ? n : "NULL", codes[i].name);
        if (EXPECT_RC(cuGetErrorString(codes[i].code, &s), CUDA_SUCCESS))
            EXPECT(s && *s, "cuGetErrorString(%d) is empty", (int)codes[i].code);
    }
    const char *s = "x";
    EXPECT_RC(cuGetErrorString((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(s == NULL, "cuGetErrorString(12345) left a string");
    s = "x";
    EXPECT_RC(cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(s == NULL, "cuGetErrorName(12345) left a string");
}

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*version_fn)(int *);

static void getprocaddress(void) {
    dt_init_ctx();
    void *fn = NULL;
    CUdriverProcAddressQueryResult q = (CUdriverProcAddressQueryResult)-1;
    if (EXPECT_RC(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &q), CUDA_SUCCESS)) {
        EXPECT(q == CU_GET_PROC_ADDRESS_SUCCESS, "symbolStatus %d", (int)q);
        REQUIRE(fn != NULL, "cuGetProcAddress(cuMemAlloc) gave NULL");
        CUdeviceptr p = 0;
        alloc_fn a = (alloc_fn)fn;
        if (EXPECT_RC(a(&p, 1 << 20), CUDA_SUCCESS))
            EXPECT_RC(cuMemFree(p), CUDA_SUCCESS);
    }
    fn = NULL;
    if (EXPECT_RC(cuGetProcAddress_v2("cuDriverGetVersion", &fn, 12000, 0, &q), CUDA_SUCCESS) && fn) {
        int v = 0;
        EXPECT_RC(((version_fn)fn)(&v), CUDA_SUCCESS);
        EXPECT(v >= 13000, "version through cuGetProcAddress: %d", v);
    }
    /* the _v2 entry answers "not found" with success, a NULL pointer and the reason (measured) */
    q = CU_GET_PROC_ADDRESS_SUCCESS;
    fn = (void *)1;
    EXPECT_RC(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 13000, 0, &q), CUDA_SUCCESS);
    EXPECT(q == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "unknown symbol: symbolStatus %d", (int)q);
    EXPECT(fn == NULL, "unknown symbol: pfn not cleared");
    q = CU_GET_PROC_ADDRESS_SUCCESS;
    fn = (void *)1;
    EXPECT_RC(cuGetProcAddress_v2("cuLibraryLoadData", &fn, 11000, 0, &q), CUDA_SUCCESS);
    EXPECT(q == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "too old a version: symbolStatus %d", (int)q);
    EXPECT(fn == NULL, "too old a version: pfn not cleared");
    /* only base names resolve: an exact ABI name is unknown */
    q = CU_GET_PROC_ADDRESS_SUCCESS;
    EXPECT_RC(cuGetProcAddress_v2("cuMemAlloc_v2", &fn, 13000, 0, &q), CUDA_SUCCESS);
    EXPECT(q == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && fn == NULL, "cuMemAlloc_v2 by name: status %d", (int)q);
    EXPECT_RC(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 7, &q), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, NULL), CUDA_SUCCESS);
    /* the legacy unversioned entry point */
    getproc_v1_fn getproc_v1 = (getproc_v1_fn)dt_sym("cuGetProcAddress");
    fn = NULL;
    if (EXPECT_RC(getproc_v1("cuMemAlloc", &fn, 13000, 0), CUDA_SUCCESS) && fn) {
        CUdeviceptr p = 0;
        if (EXPECT_RC(((alloc_fn)fn)(&p, 4096), CUDA_SUCCESS))
            EXPECT_RC(cuMemFree(p), CUDA_SUCCESS);
    }
    EXPECT_RC(getproc_v1("cuNoSuchFunction", &fn, 13000, 0), CUDA_ERROR_NOT_FOUND);
}

static void export_table(void) {
    OK(cuInit(0));
    CUuuid id;
    memset(&id, 0x5a, sizeof id);
    const void *t = NULL;
    CUresult r = cuGetExportTable(&t, &id);
    EXPECT(r == CUDA_ERROR_INVALID_VALUE, "cuGetExportTable of a made-up table id (got %s want %s)", dt_err(r),
           dt_err(CUDA_ERROR_INVALID_VALUE));
}

const dt_case dt_cases_basic[] = {
    {"not_initialized", not_initialized, 0},
    {"init", init, 0},
    {"fork_child", fork_child, 0},
    {"device_get", device_get, 0},
    {"device_attributes", device_attributes, 0},
    {"device_info", device_info, 0},
    {"primary_ctx", primary_ctx, 0},
    {"primary_flags", primary_flags, 0},
    {"ctx_per_thread", ctx_per_thread, 0},
    {"error_strings", error_strings, 0},
    {"getprocaddress", getprocaddress, 0},
    {"export_table", export_table, 0},
    {NULL, NULL, 0},
};

const dt_helper dt_helpers_basic[] = {{NULL, NULL}};

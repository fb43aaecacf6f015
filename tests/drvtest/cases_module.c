/* Modules, libraries, parameter layouts, launches, sticky errors. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drvtest.h"

static const char bad_ptx_text[] = "this is not PTX at all\n";
static const char bad_ptx_truncated[] =
    ".version 7.8\n.target sm_75\n.address_size 64\n"
    ".visible .entry broken(\n\t.param .u64 broken_p,\n";
static const char bad_ptx_no_target[] = ".version 7.8\n.address_size 64\n.visible .entry broken() { ret; }\n";
static const char ptx_header_only[] = "// nothing but the header\n.version 7.8\n.target sm_75\n.address_size 64\n";

static void module_load(void) {
    dt_init_ctx();
    CUmodule m;
    OK(cuModuleLoadData(&m, dt_ptx));
    CUfunction f;
    EXPECT_RC(cuModuleGetFunction(&f, m, "dt_fill"), CUDA_SUCCESS);
    EXPECT_RC(cuModuleGetFunction(&f, m, "dt_echo"), CUDA_SUCCESS);
    EXPECT_RC(cuModuleGetFunction(&f, m, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    EXPECT_RC(cuModuleGetFunction(&f, m, NULL), CUDA_ERROR_INVALID_VALUE);
    CUmodule bad;
    EXPECT_RC(cuModuleLoadData(&bad, bad_ptx_text), EXP_NOT_PTX);
    EXPECT_RC(cuModuleLoadData(&bad, bad_ptx_truncated), CUDA_ERROR_INVALID_PTX);
    EXPECT_RC(cuModuleLoadData(&bad, bad_ptx_no_target), CUDA_ERROR_INVALID_PTX);
    CUmodule empty;
    if (EXPECT_RC(cuModuleLoadData(&empty, ptx_header_only), CUDA_SUCCESS))
        EXPECT_RC(cuModuleUnload(empty), CUDA_SUCCESS);
    /*
     * Binary garbage: a fatbin wrapper magic (0x466243B1) and an ELF header. (Not a
     * fatbin header with garbage behind it: that hangs driver 580 in cuModuleLoadData.)
     */
    static const unsigned char wrapper[64] = {0xb1, 0x43, 0x62, 0x46, 0x01};
    static const unsigned char elf[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
    EXPECT_RC(cuModuleLoadData(&bad, wrapper), CUDA_ERROR_INVALID_IMAGE);
    EXPECT_RC(cuModuleLoadData(&bad, elf), CUDA_ERROR_INVALID_IMAGE);
    EXPECT_RC(cuModuleLoadData(&bad, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuModuleUnload(m), CUDA_SUCCESS);
}

static void library_load(void) {
    dt_init_ctx();
    CUlibrary l;
    OK(cuLibraryLoadData(&l, dt_ptx, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k;
    OK(cuLibraryGetKernel(&k, l, "dt_echo"));
    CUkernel k2;
    EXPECT_RC(cuLibraryGetKernel(&k2, l, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    size_t off = 99, size = 99;
    if (EXPECT_RC(cuKernelGetParamInfo(k, 0, &off, &size), CUDA_SUCCESS))
        EXPECT(off == 0 && size == 8, "cuKernelGetParamInfo(0): %zu/%zu", off, size);
    /* a CUkernel is not a CUfunction for cuFuncGetParamInfo, as PyTorch finds out */
    EXPECT_RC(cuFuncGetParamInfo((CUfunction)k, 0, &off, &size), CUDA_ERROR_INVALID_HANDLE);
    CUfunction f;
    OK(cuKernelGetFunction(&f, k));
    if (EXPECT_RC(cuFuncGetParamInfo(f, 6, &off, &size), CUDA_SUCCESS))
        EXPECT(off == 36 && size == 4, "cuFuncGetParamInfo(6) through cuKernelGetFunction: %zu/%zu", off, size);
    /* lazy loading: a bad image loads, and the error comes with the first kernel asked for (measured) */
    CUlibrary bad;
    if (EXPECT_RC(cuLibraryLoadData(&bad, bad_ptx_text, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS)) {
        EXPECT_RC(cuLibraryGetKernel(&k2, bad, "broken"), EXP_NOT_PTX);
        EXPECT_RC(cuLibraryUnload(bad), CUDA_SUCCESS);
    }
    if (EXPECT_RC(cuLibraryLoadData(&bad, bad_ptx_truncated, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS)) {
        EXPECT_RC(cuLibraryGetKernel(&k2, bad, "broken"), CUDA_ERROR_INVALID_PTX);
        EXPECT_RC(cuLibraryUnload(bad), CUDA_SUCCESS);
    }
    OK(cuLibraryUnload(l));
}

/* A kernel's name and owner, which the interposer asks to find a kernel's write set. */
static void kernel_names(void) {
    dt_init_ctx();
    CUmodule m;
    OK(cuModuleLoadData(&m, dt_ptx));
    CUfunction f;
    OK(cuModuleGetFunction(&f, m, "dt_echo"));
    const char *name = NULL;
    if (EXPECT_RC(cuFuncGetName(&name, f), CUDA_SUCCESS))
        EXPECT(name && strcmp(name, "dt_echo") == 0, "cuFuncGetName: %s", name ? name : "(null)");
    EXPECT_RC(cuFuncGetName(NULL, f), CUDA_ERROR_INVALID_VALUE);
    CUmodule owner = NULL;
    if (EXPECT_RC(cuFuncGetModule(&owner, f), CUDA_SUCCESS))
        EXPECT(owner == m, "cuFuncGetModule: %p, want %p", (void *)owner, (void *)m);
    CUlibrary l;
    OK(cuLibraryLoadData(&l, dt_ptx, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k;
    OK(cuLibraryGetKernel(&k, l, "dt_fill"));
    name = NULL;
    if (EXPECT_RC(cuKernelGetName(&name, k), CUDA_SUCCESS))
        EXPECT(name && strcmp(name, "dt_fill") == 0, "cuKernelGetName: %s", name ? name : "(null)");
    CUlibrary lib = NULL;
    if (EXPECT_RC(cuKernelGetLibrary(&lib, k), CUDA_SUCCESS))
        EXPECT(lib == l, "cuKernelGetLibrary: %p, want %p", (void *)lib, (void *)l);
    EXPECT_RC(cuKernelGetLibrary(NULL, k), CUDA_ERROR_INVALID_VALUE);
    CUfunction kf;
    OK(cuKernelGetFunction(&kf, k));
    name = NULL;
    if (EXPECT_RC(cuFuncGetName(&name, kf), CUDA_SUCCESS))
        EXPECT(name && strcmp(name, "dt_fill") == 0, "cuFuncGetName of a kernel's function: %s",
               name ? name : "(null)");
    OK(cuLibraryUnload(l));
    OK(cuModuleUnload(m));
}

static void param_info(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction f = dt_function(m, "dt_params");
    static const size_t want[][2] = {{0, 1}, {8, 8}, {16, 2}, {32, 20}, {52, 4}, {56, 8}};
    for (size_t i = 0; i < 6; i++) {
        size_t off = 99, size = 99;
        if (EXPECT_RC(cuFuncGetParamInfo(f, i, &off, &size), CUDA_SUCCESS))
            EXPECT(off == want[i][0] && size == want[i][1],
                   "dt_params parameter %zu: offset %zu size %zu, want %zu %zu", i, off, size, want[i][0], want[i][1]);
    }
    size_t off, size;
    EXPECT_RC(cuFuncGetParamInfo(f, 6, &off, &size), CUDA_ERROR_INVALID_VALUE);
    CUfunction e = dt_function(m, "dt_echo");
    static const size_t ewant[][2] = {{0, 8}, {8, 1}, {10, 2}, {12, 4}, {16, 8}, {24, 12}, {36, 4}};
    for (size_t i = 0; i < 7; i++) {
        off = size = 99;
        if (EXPECT_RC(cuFuncGetParamInfo(e, i, &off, &size), CUDA_SUCCESS))
            EXPECT(off == ewant[i][0] && size == ewant[i][1],
                   "dt_echo parameter %zu: offset %zu size %zu, want %zu %zu", i, off, size, ewant[i][0], ewant[i][1]);
    }
    EXPECT_RC(cuFuncGetParamInfo(e, 7, &off, &size), CUDA_ERROR_INVALID_VALUE);
}

/* The echo kernel's parameters, the values it must write back, and checks. */
typedef struct {
    uint8_t a;
    uint16_t b;
    uint32_t c;
    uint64_t d;
    unsigned char arr[12];
    float e;
} echo_vals;

static const echo_vals EV = {0x11, 0x2233, 0x44556677, 0x8899aabbccddeeffULL, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12},
                             1.5f};

static void check_echo(CUdeviceptr out, const char *how) {
    unsigned char o[32];
    OK(cuMemcpyDtoH(o, out, sizeof o));
    uint64_t d;
    uint32_t c;
    uint16_t b;
    float e;
    memcpy(&d, o, 8);
    memcpy(&c, o + 8, 4);
    memcpy(&b, o + 12, 2);
    memcpy(&e, o + 28, 4);
    EXPECT(d == EV.d && c == EV.c && b == EV.b && o[14] == EV.a && memcmp(o + 16, EV.arr, 12) == 0 && e == EV.e,
           "%s: the kernel saw other parameter values (d=%llx c=%x b=%x a=%x e=%g)", how, (unsigned long long)d, c, b,
           o[14], (double)e);
}

static void launch_params(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction f = dt_function(m, "dt_echo");
    CUdeviceptr out = dt_alloc(32);
    OK(cuMemsetD8(out, 0, 32));
    echo_vals v = EV;
    void *args[] = {&out, &v.a, &v.b, &v.c, &v.d, v.arr, &v.e};
    OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
    OK(cuCtxSynchronize());
    check_echo(out, "kernelParams");
}

static void launch_extra(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction f = dt_function(m, "dt_echo");
    CUdeviceptr out = dt_alloc(32);
    OK(cuMemsetD8(out, 0, 32));
    _Alignas(8) unsigned char buf[40];
    memset(buf, 0, sizeof buf);
    memcpy(buf + 0, &out, 8);
    memcpy(buf + 8, &EV.a, 1);
    memcpy(buf + 10, &EV.b, 2);
    memcpy(buf + 12, &EV.c, 4);
    memcpy(buf + 16, &EV.d, 8);
    memcpy(buf + 24, EV.arr, 12);
    memcpy(buf + 36, &EV.e, 4);
    size_t size = sizeof buf;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra));
    OK(cuCtxSynchronize());
    check_echo(out, "extra");
    /* measured: a longer buffer is refused, a shorter one is not, an empty one is */
    size_t big = sizeof buf + 8, zero = 0;
    void *extra_big[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &big, CU_LAUNCH_PARAM_END};
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra_big), EXP_EXTRA_TOO_LONG);
    void *extra_zero[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &zero, CU_LAUNCH_PARAM_END};
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra_zero), CUDA_ERROR_INVALID_VALUE);
    void *extra_nosize[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_END};
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra_nosize), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    echo_vals v = EV;
    void *args[] = {&out, &v.a, &v.b, &v.c, &v.d, v.arr, &v.e};
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, extra), CUDA_ERROR_INVALID_VALUE);
    OK(cuCtxSynchronize());
}

static void check_fill(CUdeviceptr p, uint32_t n, uint32_t v, const char *how) {
    uint32_t h[1024];
    OK(cuMemcpyDtoH(h, p, n * 4));
    int bad = 0;
    for (uint32_t i = 0; i < n; i++)
        bad += h[i] != v;
    EXPECT(!bad, "%s: %d of %u words wrong", how, bad, n);
}

static void launch_kernel_handle(void) {
    dt_init_ctx();
    CUlibrary l;
    OK(cuLibraryLoadData(&l, dt_ptx, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k;
    OK(cuLibraryGetKernel(&k, l, "dt_fill"));
    CUdeviceptr p = dt_alloc(1024 * 4);
    /* PyTorch launches a CUkernel cast to CUfunction */
    dt_launch_fill((CUfunction)k, NULL, p, 31, 1024);
    OK(cuCtxSynchronize());
    check_fill(p, 1024, 31, "launch of a CUkernel cast to CUfunction");
    CUfunction f;
    OK(cuKernelGetFunction(&f, k));
    dt_launch_fill(f, NULL, p, 32, 1024);
    OK(cuCtxSynchronize());
    check_fill(p, 1024, 32, "launch through cuKernelGetFunction");
}

static void launch_ex(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction f = dt_function(m, "dt_fill");
    CUdeviceptr p = dt_alloc(1024 * 4);
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr.value.cooperative = 1;
    CUlaunchConfig cfg = {.gridDimX = 8,
                          .gridDimY = 1,
                          .gridDimZ = 1,
                          .blockDimX = 128,
                          .blockDimY = 1,
                          .blockDimZ = 1,
                          .sharedMemBytes = 0,
                          .hStream = s,
                          .attrs = &attr,
                          .numAttrs = 1};
    uint32_t v = 77, n = 1024;
    void *args[] = {&p, &v, &n};
    OK(cuLaunchKernelEx(&cfg, f, args, NULL));
    OK(cuStreamSynchronize(s));
    check_fill(p, 1024, 77, "cuLaunchKernelEx, cooperative");
    cfg.blockDimX = 0;
    EXPECT_RC(cuLaunchKernelEx(&cfg, f, args, NULL), CUDA_ERROR_INVALID_VALUE);
}

static void launch_bad_dims(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction f = dt_function(m, "dt_fill");
    CUdeviceptr p = dt_alloc(4096);
    uint32_t v = 1, n = 16;
    void *args[] = {&p, &v, &n};
    EXPECT_RC(cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 0, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 32, 32, 2, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 65, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuLaunchKernel(f, 1, 65536, 1, 32, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    /* more than 48 KiB of dynamic shared memory needs an opt-in first */
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 49153, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    /* the context is not harmed by launches that were refused */
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSynchronize(), CUDA_SUCCESS);
}

static void launch_no_impl(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction f = dt_function(m, "dt_noimpl");
    CUdeviceptr p = dt_alloc(4);
    void *args[] = {&p};
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_RC(cuCtxSynchronize(), CUDA_SUCCESS);
}

static void sticky_error(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction f = dt_function(m, "dt_store");
    CUdeviceptr bad = 16;
    void *args[] = {&bad};
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    /* from now on the context is unusable, for every call that uses it */
    CUdeviceptr p;
    EXPECT_RC(cuMemAlloc(&p, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_RC(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    CUstream s;
    EXPECT_RC(cuStreamCreate(&s, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    /* calls that need no context still work */
    int n;
    EXPECT_RC(cuDeviceGetCount(&n), CUDA_SUCCESS);
}

/* cuModuleLoad: the same PTX from a file; a path that is not there. */
static void module_load_file(void) {
    dt_init_ctx();
    char path[] = "/tmp/drvtest-module-XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0, "mkstemp: %s", strerror(errno));
    if (fd < 0)
        return;
    size_t n = strlen(dt_ptx);
    EXPECT(write(fd, dt_ptx, n) == (ssize_t)n, "write %s", path);
    close(fd);
    CUmodule m;
    if (EXPECT_RC(cuModuleLoad(&m, path), CUDA_SUCCESS)) {
        CUfunction f;
        EXPECT_RC(cuModuleGetFunction(&f, m, "dt_fill"), CUDA_SUCCESS);
        EXPECT_RC(cuModuleUnload(m), CUDA_SUCCESS);
    }
    unlink(path);
    EXPECT_RC(cuModuleLoad(&m, path), CUDA_ERROR_FILE_NOT_FOUND);
    EXPECT_RC(cuModuleLoad(&m, NULL), CUDA_ERROR_INVALID_VALUE);
}

const dt_case dt_cases_module[] = {
    {"module_load", module_load, 0},
    {"module_load_file", module_load_file, 0},
    {"library_load", library_load, 0},
    {"param_info", param_info, 0},
    {"kernel_names", kernel_names, 0},
    {"launch_params", launch_params, 0},
    {"launch_extra", launch_extra, 0},
    {"launch_kernel_handle", launch_kernel_handle, 0},
    {"launch_ex", launch_ex, 0},
    {"launch_bad_dims", launch_bad_dims, 0},
    {"launch_no_impl", launch_no_impl, DT_SIM_ONLY},
    {"sticky_error", sticky_error, 0},
    {NULL, NULL, 0},
};

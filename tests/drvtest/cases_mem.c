/* Device and host memory, copies and memsets. */
#include <stdlib.h>
#include <string.h>

#include "drvtest.h"

static void pattern(void *buf, size_t n, uint32_t seed) {
    uint32_t *w = buf;
    for (size_t i = 0; i < n / 4; i++)
        w[i] = seed * 2654435761u + (uint32_t)i * 40503u;
}

static void mem_alloc_free(void) {
    dt_init_ctx();
    CUdeviceptr p, base = 0;
    size_t size = 0;
    OK(cuMemAlloc(&p, 1 << 20));
    EXPECT(p % 256 == 0, "cuMemAlloc result 0x%llx not 256-byte aligned", p);
    EXPECT_RC(cuMemGetAddressRange(&base, &size, p + 100), CUDA_SUCCESS);
    EXPECT(base == p && size == (1 << 20), "address range of p+100: 0x%llx+%zu, want 0x%llx+%d", base, size, p,
           1 << 20);
    EXPECT_RC(cuMemFree(p + 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemFree(p), CUDA_SUCCESS);
    EXPECT_RC(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemGetAddressRange(&base, &size, p), CUDA_ERROR_NOT_FOUND);
    int local;
    EXPECT_RC(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)&local), CUDA_ERROR_NOT_FOUND);
    EXPECT_RC(cuMemFree(0), EXP_MEMFREE_NULL);
    EXPECT_RC(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemAlloc(NULL, 4096), CUDA_ERROR_INVALID_VALUE);
    size_t f0, f1, t;
    OK(cuMemGetInfo(&f0, &t));
    CUdeviceptr big;
    OK(cuMemAlloc(&big, 1ULL << 30));
    OK(cuMemGetInfo(&f1, &t));
    EXPECT(f0 > f1 && f0 - f1 >= (512ULL << 20), "free memory went from %zu to %zu after a 1 GiB allocation", f0, f1);
    OK(cuMemFree(big));
}

static void mem_oom(void) {
    dt_init_ctx();
    size_t total;
    OK(cuDeviceTotalMem(&total, 0));
    CUdeviceptr p;
    EXPECT_RC(cuMemAlloc(&p, total + (1ULL << 30)), CUDA_ERROR_OUT_OF_MEMORY);
    /* not sticky: the context goes on working */
    EXPECT_RC(cuMemAlloc(&p, 1 << 20), CUDA_SUCCESS);
    size_t f, t;
    EXPECT_RC(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
}

static void mem_pitch(void) {
    dt_init_ctx();
    CUdeviceptr p, base;
    size_t pitch = 0, size;
    OK(cuMemAllocPitch(&p, &pitch, 1000, 10, 4));
    EXPECT(pitch >= 1000 && pitch % 128 == 0, "pitch %zu for width 1000", pitch);
    if (EXPECT_RC(cuMemGetAddressRange(&base, &size, p), CUDA_SUCCESS))
        EXPECT(size >= pitch * 10, "pitched allocation of %zu bytes, want at least %zu", size, pitch * 10);
    EXPECT_RC(cuMemAllocPitch(&p, &pitch, 1000, 10, 3), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemAllocPitch(&p, &pitch, 0, 10, 4), CUDA_ERROR_INVALID_VALUE);
}

static void memcpy_sync(void) {
    dt_init_ctx();
    const size_t n = 1 << 20;
    unsigned char *h = malloc(n), *back = malloc(n);
    REQUIRE(h && back, "malloc");
    pattern(h, n, 1);
    CUdeviceptr a = dt_alloc(n), b = dt_alloc(n);
    OK(cuMemcpyHtoD(a, h, n));
    OK(cuMemcpyDtoD(b, a, n));
    memset(back, 0, n);
    OK(cuMemcpyDtoH(back, b, n));
    EXPECT(memcmp(h, back, n) == 0, "HtoD, DtoD, DtoH round trip differs");
    /* unified addressing: cuMemcpy works out the direction */
    pattern(h, n, 2);
    OK(cuMemcpy(a, (CUdeviceptr)(uintptr_t)h, n));
    OK(cuMemcpy(b, a, n));
    memset(back, 0, n);
    OK(cuMemcpy((CUdeviceptr)(uintptr_t)back, b, n));
    EXPECT(memcmp(h, back, n) == 0, "cuMemcpy round trip differs");
    /* a copy inside an allocation, at an offset */
    OK(cuMemcpyHtoD(a + 4096, h, 1000));
    memset(back, 0, n);
    OK(cuMemcpyDtoH(back, a + 4096, 1000));
    EXPECT(memcmp(h, back, 1000) == 0, "copy at an offset differs");
    EXPECT_RC(cuMemcpyHtoD(a, h, 0), CUDA_SUCCESS);
    free(h);
    free(back);
}

static void memcpy_bad_range(void) {
    dt_init_ctx();
    unsigned char h[8192], back[4096];
    pattern(h, sizeof h, 3);
    CUdeviceptr a = dt_alloc(4096), gone = dt_alloc(4096);
    OK(cuMemcpyHtoD(a, h, 4096));
    OK(cuMemFree(gone));
    EXPECT_RC(cuMemcpyHtoD(a + 4000, h, 200), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyHtoD(a, h, 8192), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyHtoD(gone, h, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyDtoH(back, gone, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyDtoH(back, a + 4090, 100), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyDtoD(a, gone, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyDtoD(gone, a, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyDtoD(a + 4000, a, 200), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpy(a + 4090, (CUdeviceptr)(uintptr_t)h, 100), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemsetD32(a + 4000, 0, 100), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemsetD8(gone, 0, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemsetD8Async(gone, 0, 16, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyHtoDAsync(a + 4000, h, 200, NULL), CUDA_ERROR_INVALID_VALUE);
    /* nothing was written by the calls that failed */
    OK(cuMemcpyDtoH(back, a, 4096));
    EXPECT(memcmp(back, h, 4096) == 0, "a failed copy or memset changed device memory");
}

static void memset_sync(void) {
    dt_init_ctx();
    CUdeviceptr a = dt_alloc(4096);
    unsigned char b8[4096];
    OK(cuMemsetD8(a, 0xab, 4096));
    OK(cuMemcpyDtoH(b8, a, 4096));
    int bad = 0;
    for (int i = 0; i < 4096; i++)
        bad += b8[i] != 0xab;
    EXPECT(!bad, "cuMemsetD8: %d bytes wrong", bad);
    uint16_t b16[1024];
    OK(cuMemsetD16(a + 2, 0xbeef, 1000));
    OK(cuMemcpyDtoH(b16, a, sizeof b16));
    EXPECT(b16[0] == 0xabab && b16[1] == 0xbeef && b16[1000] == 0xbeef && b16[1001] == 0xabab,
           "cuMemsetD16 wrote the wrong range: %04x %04x %04x %04x", b16[0], b16[1], b16[1000], b16[1001]);
    uint32_t b32[1024];
    OK(cuMemsetD32(a + 4, 0xdeadbeef, 10));
    OK(cuMemcpyDtoH(b32, a, sizeof b32));
    EXPECT(b32[1] == 0xdeadbeef && b32[10] == 0xdeadbeef && b32[11] != 0xdeadbeef, "cuMemsetD32 wrote the wrong range");
    EXPECT_RC(cuMemsetD32(a + 1, 0, 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemsetD16(a + 1, 0, 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemsetD8(a, 0, 0), CUDA_SUCCESS);
}

static void memcpy_async(void) {
    dt_init_ctx();
    CUmodule m = dt_module();
    CUfunction add = dt_function(m, "dt_add");
    const uint32_t n = 1 << 16;
    uint32_t *h;
    OK(cuMemAllocHost((void **)&h, n * 4));
    for (uint32_t i = 0; i < n; i++)
        h[i] = i;
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr a = dt_alloc(n * 4), b = dt_alloc(n * 4);
    OK(cuMemcpyHtoDAsync(a, h, n * 4, s));
    uint32_t k = 7, nn = n;
    void *args[] = {&a, &nn, &k};
    OK(cuLaunchKernel(add, n / 128, 1, 1, 128, 1, 1, 0, s, args, NULL));
    OK(cuMemcpyDtoDAsync(b, a, n * 4, s));
    OK(cuMemsetD32Async(a, 0, n, s));
    OK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)h, b, n * 4, s));
    OK(cuStreamSynchronize(s));
    int bad = 0;
    for (uint32_t i = 0; i < n; i++)
        bad += h[i] != i + 7;
    EXPECT(!bad, "async HtoD, kernel, DtoD, DtoH: %d words wrong", bad);
    OK(cuMemcpyDtoHAsync(h, a, n * 4, s));
    OK(cuStreamSynchronize(s));
    bad = 0;
    for (uint32_t i = 0; i < n; i++)
        bad += h[i] != 0;
    EXPECT(!bad, "cuMemsetD32Async: %d words wrong", bad);
    /* pageable host memory: the source may change as soon as the call returns */
    uint32_t *pg = malloc(n * 4);
    REQUIRE(pg != NULL, "malloc");
    for (uint32_t i = 0; i < n; i++)
        pg[i] = 5;
    OK(cuMemcpyHtoDAsync(b, pg, n * 4, s));
    for (uint32_t i = 0; i < n; i++)
        pg[i] = 6;
    OK(cuMemcpyDtoHAsync(pg, b, n * 4, s));
    OK(cuStreamSynchronize(s));
    bad = 0;
    for (uint32_t i = 0; i < n; i++)
        bad += pg[i] != 5;
    EXPECT(!bad, "async copy from pageable memory: %d words wrong", bad);
    free(pg);
    OK(cuMemFreeHost(h));
    OK(cuStreamDestroy(s));
}

static void host_mem(void) {
    dt_init_ctx();
    void *h = NULL;
    OK(cuMemHostAlloc(&h, 1 << 20, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    memset(h, 1, 1 << 20);
    OK(cuMemFreeHost(h));
    EXPECT_RC(cuMemHostAlloc(&h, 4096, 0x100), CUDA_ERROR_INVALID_VALUE);
    void *m = NULL;
    REQUIRE(posix_memalign(&m, 4096, 1 << 20) == 0, "posix_memalign");
    EXPECT_RC(cuMemFreeHost(m), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemHostRegister(m, 1 << 20, 0));
    EXPECT_RC(cuMemHostRegister(m, 1 << 20, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CUdeviceptr d = dt_alloc(1 << 20);
    memset(m, 0x42, 1 << 20);
    OK(cuMemcpyHtoDAsync(d, m, 1 << 20, NULL));
    OK(cuMemsetD8Async(d, 0x43, 16, NULL));
    OK(cuMemcpyDtoHAsync(m, d, 1 << 20, NULL));
    OK(cuStreamSynchronize(NULL));
    unsigned char *c = m;
    EXPECT(c[0] == 0x43 && c[16] == 0x42 && c[(1 << 20) - 1] == 0x42, "copies through registered memory");
    OK(cuMemHostUnregister(m));
    EXPECT_RC(cuMemHostUnregister(m), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    free(m);
}

static void mem_async_alloc(void) {
    dt_init_ctx();
    CUstream s;
    OK(cuStreamCreate(&s, 0));
    CUdeviceptr p;
    OK(cuMemAllocAsync(&p, 1 << 20, s));
    OK(cuMemsetD32Async(p, 0x01020304, (1 << 20) / 4, s));
    uint32_t *h;
    OK(cuMemAllocHost((void **)&h, 1 << 20));
    OK(cuMemcpyDtoHAsync(h, p, 1 << 20, s));
    OK(cuMemFreeAsync(p, s));
    OK(cuStreamSynchronize(s));
    EXPECT(h[0] == 0x01020304 && h[(1 << 18) - 1] == 0x01020304, "stream-ordered allocation contents");
    int local;
    EXPECT_RC(cuMemFreeAsync((CUdeviceptr)(uintptr_t)&local, s), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemFreeHost(h));
}

const dt_case dt_cases_mem[] = {
    {"mem_alloc_free", mem_alloc_free, 0},
    {"mem_oom", mem_oom, 0},
    {"mem_pitch", mem_pitch, 0},
    {"memcpy_sync", memcpy_sync, 0},
    {"memcpy_bad_range", memcpy_bad_range, 0},
    {"memset_sync", memset_sync, 0},
    {"memcpy_async", memcpy_async, 0},
    {"host_mem", host_mem, 0},
    {"mem_async_alloc", mem_async_alloc, 0},
    {NULL, NULL, 0},
};

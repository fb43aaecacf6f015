/*
 * What a collective library (NCCL) does with memory between GPUs and
 * processes: host memory through cuMem (location HOST_NUMA) that both the CPU
 * and the GPU use, allocations exported as POSIX fds and imported by a peer
 * process (and an imported allocation exported again), one allocation made
 * accessible to two devices, and stream memory operations (flags written and
 * waited for by the GPU) on device and on host memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drvtest.h"

#define MIB (1ULL << 20)

/* The host NUMA node of device 0 (NCCL asks the same way); -1 where the driver has none. */
static int host_numa_id(void) {
    int numa = -1;
    CUresult r = cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0);
    return r == CUDA_SUCCESS ? numa : -1;
}

/* dt_vmm_prop's allocation, placed at loc instead. */
static CUmemAllocationProp prop_at(CUmemLocationType type, int id) {
    CUmemAllocationProp p = dt_vmm_prop(true);
    p.location.type = type;
    p.location.id = id;
    return p;
}

static CUmemAllocationProp host_prop(int numa) { return prop_at(CU_MEM_LOCATION_TYPE_HOST_NUMA, numa); }

/* Host memory mapped with access for device 0 and the CPU, as NCCL maps it. */
static CUdeviceptr map_host(CUmemGenericAllocationHandle h, size_t size, int numa) {
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, size, 0, 0, 0));
    OK(cuMemMap(va, size, 0, h, 0));
    CUmemAccessDesc d[2] = {
        {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
        {.location = {CU_MEM_LOCATION_TYPE_HOST_NUMA, numa}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
    };
    OK(cuMemSetAccess(va, size, &d[0], 1));
    OK(cuMemSetAccess(va, size, &d[1], 1));
    return va;
}

static void host_numa(void) {
    dt_init_ctx();
    int numa = host_numa_id();
    if (numa < 0)
        dt_skip("the driver reports no host NUMA node for device 0");
    CUmemAllocationProp prop = host_prop(numa);
    size_t g = 0;
    OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    EXPECT(g == EXP_HOST_NUMA_GRANULARITY, "host NUMA minimum granularity %zu, want %llu", g,
           (unsigned long long)EXP_HOST_NUMA_GRANULARITY);
    CUmemAllocationProp bad = prop;
    bad.location.id = 4096;
    EXPECT_RC(cuMemGetAllocationGranularity(&g, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM), EXP_HOST_NUMA_BAD_NODE);
    CUmemGenericAllocationHandle h;
    OK(cuMemCreate(&h, 2 * MIB, &prop, 0));
    /* device memory cannot be opened to the CPU this way */
    CUmemAllocationProp dprop = dt_vmm_prop(true);
    CUmemGenericAllocationHandle hd;
    OK(cuMemCreate(&hd, 2 * MIB, &dprop, 0));
    CUdeviceptr dva;
    OK(cuMemAddressReserve(&dva, 2 * MIB, 0, 0, 0));
    OK(cuMemMap(dva, 2 * MIB, 0, hd, 0));
    CUmemAccessDesc hostacc = {.location = {CU_MEM_LOCATION_TYPE_HOST_NUMA, numa},
                               .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    EXPECT_RC(cuMemSetAccess(dva, 2 * MIB, &hostacc, 1), EXP_HOST_ACCESS_TO_DEVICE_MEM);
    OK(cuMemUnmap(dva, 2 * MIB));
    OK(cuMemRelease(hd));
    OK(cuMemAddressFree(dva, 2 * MIB));
    CUdeviceptr va = map_host(h, 2 * MIB, numa);
    /* the CPU writes through the address, the GPU reads it, and the other way round */
    volatile uint32_t *w = (volatile uint32_t *)(uintptr_t)va;
    for (uint32_t i = 0; i < 1024; i++)
        w[i] = 0xabc00000u | i;
    uint32_t back[1024];
    OK(cuMemcpyDtoH(back, va, sizeof back));
    int bad_words = 0;
    for (uint32_t i = 0; i < 1024; i++)
        bad_words += back[i] != (0xabc00000u | i);
    EXPECT(!bad_words, "the GPU reads %d of 1024 words the CPU wrote wrong", bad_words);
    CUmodule m = dt_module();
    dt_launch_fill(dt_function(m, "dt_fill"), NULL, va + 4096, 0x600d, 256);
    OK(cuCtxSynchronize());
    bad_words = 0;
    for (uint32_t i = 0; i < 256; i++)
        bad_words += w[1024 + i] != 0x600d;
    EXPECT(!bad_words, "the CPU reads %d of 256 words a kernel wrote wrong", bad_words);
    /* exported to a peer process, which sees and changes the same pages */
    int fd = -1;
    OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    dt_child c;
    char numa_arg[16];
    snprintf(numa_arg, sizeof numa_arg, "%d", numa);
    const char *args[] = {numa_arg, NULL};
    REQUIRE(dt_spawn(&c, true, "host_numa_import", args), "spawn the importing child");
    REQUIRE(dt_send_fd(c.sock, fd), "SCM_RIGHTS");
    close(fd);
    char line[256] = "";
    bool ok = dt_read_line(c.from, line, sizeof line, 60000);
    EXPECT(ok && strcmp(line, "ok") == 0, "importing child: %s", ok ? line : "no answer");
    EXPECT(w[4096] == 0xfeedu, "what the importing child wrote is not here: 0x%x", w[4096]);
    dt_send_line(c.to, "exit");
    EXPECT(dt_reap(&c, 30000) == 0, "importing child failed");
    OK(cuMemUnmap(va, 2 * MIB));
    OK(cuMemRelease(h));
    OK(cuMemAddressFree(va, 2 * MIB));
}

/* drvtest --helper host_numa_import NUMA: imports host memory (fd 4), reads the parent's words, writes one. */
static int helper_host_numa_import(int argc, char **argv) {
    int numa = argc > 0 ? atoi(argv[0]) : 0;
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    CUresult r;
    if (!dt_helper_import(&h))
        return 1;
    CUmemAccessDesc d[2] = {
        {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
        {.location = {CU_MEM_LOCATION_TYPE_HOST_NUMA, numa}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
    };
    if ((r = cuMemAddressReserve(&va, 2 * MIB, 0, 0, 0)) || (r = cuMemMap(va, 2 * MIB, 0, h, 0)) ||
        (r = cuMemSetAccess(va, 2 * MIB, d, 2))) {
        dt_say("map: %s", dt_err(r));
        return 1;
    }
    volatile uint32_t *w = (volatile uint32_t *)(uintptr_t)va;
    for (uint32_t i = 0; i < 1024; i++)
        if (w[i] != (0xabc00000u | i)) {
            dt_say("word %u is 0x%x, want 0x%x", i, w[i], 0xabc00000u | i);
            return 1;
        }
    w[4096] = 0xfeed;
    dt_say("ok");
    char line[64];
    while (dt_hear(line, sizeof line) && strcmp(line, "exit") != 0) {
    }
    return 0;
}

/*
 * An allocation this process imported (another process's export) exported
 * again: what gpucr does when an application exports memory the helper owns.
 * The child imports the parent's fd, exports what it imported and sends that
 * fd back; the parent imports it and must see its own pages.
 */
static void reexport_imported(void) {
    dt_init_ctx();
    CUmemAllocationProp prop = dt_vmm_prop(true);
    CUmemGenericAllocationHandle h;
    OK(cuMemCreate(&h, 2 * MIB, &prop, 0));
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, 4 * MIB, 0, 0, 0));
    OK(cuMemMap(va, 2 * MIB, 0, h, 0));
    CUmemAccessDesc d = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    OK(cuMemSetAccess(va, 2 * MIB, &d, 1));
    OK(cuMemsetD32(va, 0x51515151, 2 * MIB / 4));
    OK(cuCtxSynchronize());
    int fd = -1;
    OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    /* in this very process: an import of one's own export, exported again */
    CUmemGenericAllocationHandle self;
    if (EXPECT_RC(cuMemImportFromShareableHandle(&self, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                  CUDA_SUCCESS)) {
        int fd2 = -1;
        EXPECT_RC(cuMemExportToShareableHandle(&fd2, self, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                  EXP_VMM_REEXPORT_IMPORTED);
        if (fd2 >= 0)
            close(fd2);
        EXPECT_RC(cuMemRelease(self), CUDA_SUCCESS);
    }
    dt_child c;
    REQUIRE(dt_spawn(&c, true, "reexport", NULL), "spawn the re-exporting child");
    REQUIRE(dt_send_fd(c.sock, fd), "SCM_RIGHTS");
    close(fd);
    char line[256] = "";
    bool ok = dt_read_line(c.from, line, sizeof line, 60000);
    REQUIRE(ok && strncmp(line, "rc ", 3) == 0, "re-exporting child: %s", ok ? line : "no answer");
    CUresult rc = (CUresult)atoi(line + 3);
    EXPECT_RC(rc, EXP_VMM_REEXPORT_IMPORTED);
    if (rc == CUDA_SUCCESS) {
        int back = dt_recv_fd(c.sock);
        REQUIRE(back >= 0, "no fd back from the child");
        CUmemGenericAllocationHandle h2;
        OK(cuMemImportFromShareableHandle(&h2, (void *)(intptr_t)back, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        close(back);
        OK(cuMemMap(va + 2 * MIB, 2 * MIB, 0, h2, 0));
        OK(cuMemSetAccess(va + 2 * MIB, 2 * MIB, &d, 1));
        uint32_t word = 0;
        OK(cuMemcpyDtoH(&word, va + 2 * MIB + 4096, 4));
        EXPECT(word == 0x51515151, "the re-exported fd maps other memory: 0x%x", word);
        OK(cuMemsetD32(va + 2 * MIB, 0x7a7a7a7a, 1));
        OK(cuMemcpyDtoH(&word, va, 4));
        EXPECT(word == 0x7a7a7a7a, "a write through the re-exported fd is not seen in the allocation: 0x%x", word);
        OK(cuMemUnmap(va + 2 * MIB, 2 * MIB));
        OK(cuMemRelease(h2));
    }
    dt_send_line(c.to, "exit");
    EXPECT(dt_reap(&c, 30000) == 0, "re-exporting child failed");
    OK(cuMemUnmap(va, 2 * MIB));
    OK(cuMemRelease(h));
    OK(cuMemAddressFree(va, 4 * MIB));
}

/* drvtest --helper reexport: imports fd 4, exports the import, says "rc N" and sends that fd back. */
static int helper_reexport(int argc, char **argv) {
    (void)argc;
    (void)argv;
    CUmemGenericAllocationHandle h;
    CUresult r;
    if (!dt_helper_import(&h))
        return 1;
    int out = -1;
    r = cuMemExportToShareableHandle(&out, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    dt_say("rc %d", (int)r);
    if (r == CUDA_SUCCESS && !dt_send_fd(DT_HELPER_SOCK, out))
        return 1;
    char line[64];
    while (dt_hear(line, sizeof line) && strcmp(line, "exit") != 0) {
    }
    return 0;
}

/* One allocation on device 1, accessible to device 0 and 1: written from one, read from the other. */
static void peer_access(void) {
    CUdevice d0, d1;
    CUcontext c0, c1;
    int n = 0;
    OK(cuInit(0));
    OK(cuDeviceGetCount(&n));
    if (n < 2)
        dt_skip("one device");
    OK(cuDeviceGet(&d0, 0));
    OK(cuDeviceGet(&d1, 1));
    int can = 0;
    OK(cuDeviceCanAccessPeer(&can, d0, d1));
    if (!can)
        dt_skip("device 0 cannot access device 1");
    OK(cuDevicePrimaryCtxRetain(&c0, d0));
    OK(cuDevicePrimaryCtxRetain(&c1, d1));
    OK(cuCtxSetCurrent(c1));
    CUmemAllocationProp prop = prop_at(CU_MEM_LOCATION_TYPE_DEVICE, 1);
    CUmemGenericAllocationHandle h;
    OK(cuMemCreate(&h, 2 * MIB, &prop, 0));
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, 2 * MIB, 0, 0, 0));
    OK(cuMemMap(va, 2 * MIB, 0, h, 0));
    CUmemAccessDesc d[2] = {
        {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 1}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
        {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
    };
    OK(cuMemSetAccess(va, 2 * MIB, d, 2));
    OK(cuMemsetD32(va, 0, 2 * MIB / 4));
    OK(cuCtxSynchronize());
    /* a kernel on device 0 writes device 1's memory */
    OK(cuCtxSetCurrent(c0));
    CUmodule m = dt_module();
    dt_launch_fill(dt_function(m, "dt_fill"), NULL, va, 0x9e9e, 1024);
    OK(cuCtxSynchronize());
    OK(cuCtxSetCurrent(c1));
    uint32_t back[1024];
    OK(cuMemcpyDtoH(back, va, sizeof back));
    int bad = 0;
    for (int i = 0; i < 1024; i++)
        bad += back[i] != 0x9e9e;
    EXPECT(!bad, "device 1 reads %d of 1024 words device 0 wrote wrong", bad);
    OK(cuMemUnmap(va, 2 * MIB));
    OK(cuMemRelease(h));
    OK(cuMemAddressFree(va, 2 * MIB));
    OK(cuModuleUnload(m));
}

/* A stream that waits for a flag, released by a write of another stream (device flag) or of the CPU (host flag). */
static void memops_on(CUdeviceptr flag, volatile uint32_t *cpu) {
    CUstream a, b;
    OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    OK(cuStreamWriteValue32(a, flag, 5, CU_STREAM_WRITE_VALUE_DEFAULT));
    OK(cuStreamSynchronize(a));
    uint32_t v = 0;
    OK(cuMemcpyDtoH(&v, flag, 4));
    EXPECT(v == 5, "cuStreamWriteValue32 wrote %u, want 5", v);
    OK(cuStreamWaitValue32(a, flag, 5, CU_STREAM_WAIT_VALUE_GEQ));
    OK(cuStreamSynchronize(a));
    OK(cuStreamWaitValue32(a, flag, 7, CU_STREAM_WAIT_VALUE_EQ));
    OK(cuStreamWriteValue32(a, flag + 4, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
    dt_sleep_ms(50);
    EXPECT_RC(cuStreamQuery(a), CUDA_ERROR_NOT_READY);
    if (cpu)
        *cpu = 7;
    else
        OK(cuStreamWriteValue32(b, flag, 7, CU_STREAM_WRITE_VALUE_DEFAULT));
    uint64_t t0 = dt_now_ms();
    CUresult q;
    while ((q = cuStreamQuery(a)) == CUDA_ERROR_NOT_READY && dt_now_ms() - t0 < 10000)
        dt_sleep_ms(1);
    EXPECT_RC(q, CUDA_SUCCESS);
    OK(cuMemcpyDtoH(&v, flag + 4, 4));
    EXPECT(v == 1, "the write after the wait gave %u, want 1", v);
    OK(cuStreamWriteValue64(b, flag + 8, 0x123456789abcull, CU_STREAM_WRITE_VALUE_DEFAULT));
    OK(cuStreamWaitValue64(b, flag + 8, 0x123456789abcull, CU_STREAM_WAIT_VALUE_EQ));
    OK(cuStreamSynchronize(b));
    uint64_t v64 = 0;
    OK(cuMemcpyDtoH(&v64, flag + 8, 8));
    EXPECT(v64 == 0x123456789abcull, "cuStreamWriteValue64 wrote 0x%llx", (unsigned long long)v64);
    OK(cuStreamDestroy(a));
    OK(cuStreamDestroy(b));
}

static void stream_memops(void) {
    dt_init_ctx();
    CUdeviceptr dflag = dt_alloc(4096);
    OK(cuMemsetD32(dflag, 0, 1024));
    memops_on(dflag, NULL);
    OK(cuMemFree(dflag));
    int numa = host_numa_id();
    if (numa < 0)
        return;
    CUmemAllocationProp prop = host_prop(numa);
    CUmemGenericAllocationHandle h;
    OK(cuMemCreate(&h, 2 * MIB, &prop, 0));
    CUdeviceptr va = map_host(h, 2 * MIB, numa);
    memset((void *)(uintptr_t)va, 0, 4096);
    memops_on(va, (volatile uint32_t *)(uintptr_t)va);
    OK(cuMemUnmap(va, 2 * MIB));
    OK(cuMemRelease(h));
    OK(cuMemAddressFree(va, 2 * MIB));
}

/*
 * cuGetProcAddress hands out the very entry point that the library exports
 * under the ABI name (the interposer recognizes its wrappers' targets by
 * that pointer), for every version a collective library asks with.
 */
static void getproc_is_dlsym(void) {
    static const struct {
        const char *name, *abi;
        int since;
    } syms[] = {
        {"cuMemCreate", "cuMemCreate", 10020},
        {"cuMemRelease", "cuMemRelease", 10020},
        {"cuMemMap", "cuMemMap", 10020},
        {"cuMemUnmap", "cuMemUnmap", 10020},
        {"cuMemSetAccess", "cuMemSetAccess", 10020},
        {"cuMemExportToShareableHandle", "cuMemExportToShareableHandle", 10020},
        {"cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle", 10020},
        {"cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", 11000},
        {"cuMemGetAllocationPropertiesFromHandle", "cuMemGetAllocationPropertiesFromHandle", 10020},
        {"cuStreamWriteValue32", "cuStreamWriteValue32_v2", 12000},
        {"cuStreamWaitValue32", "cuStreamWaitValue32_v2", 12000},
        {"cuStreamWriteValue64", "cuStreamWriteValue64_v2", 12000},
        {"cuStreamWaitValue64", "cuStreamWaitValue64_v2", 12000},
        {"cuMemAlloc", "cuMemAlloc_v2", 3020},
        {"cuLaunchKernel", "cuLaunchKernel", 4000},
    };
    static const int versions[] = {0, 11030, 12000, 12080, 13000};
    dt_init_ctx();
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *want = dt_sym(syms[i].abi);
        for (size_t k = 0; k < sizeof versions / sizeof versions[0]; k++) {
            int v = versions[k] ? versions[k] : syms[i].since;
            if (v < syms[i].since)
                continue;
            void *fn = NULL;
            CUdriverProcAddressQueryResult q;
            if (!EXPECT_RC(cuGetProcAddress_v2(syms[i].name, &fn, v, 0, &q), CUDA_SUCCESS))
                continue;
            EXPECT(fn == want, "cuGetProcAddress(%s, %d) is not dlsym(%s) (status %d)", syms[i].name, v, syms[i].abi,
                   (int)q);
        }
    }
}

const dt_case dt_cases_share[] = {
    {"share_getproc_is_dlsym", getproc_is_dlsym, 0},   {"share_host_numa", host_numa, 0},
    {"share_reexport_imported", reexport_imported, 0}, {"share_peer_access", peer_access, 0},
    {"share_stream_memops", stream_memops, 0},         {NULL, NULL, 0},
};

const dt_helper dt_helpers_share[] = {
    {"host_numa_import", helper_host_numa_import},
    {"reexport", helper_reexport},
    {NULL, NULL},
};

/* Virtual memory management, and sharing it with another process through a POSIX fd. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drvtest.h"

#define MIB (1ULL << 20)

CUmemAllocationProp dt_vmm_prop(bool posix_fd) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

static CUmemAccessDesc rw(void) {
    CUmemAccessDesc d = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    return d;
}

static void fill_words(uint32_t *w, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++)
        w[i] = seed ^ (uint32_t)(i * 2654435761u);
}

static size_t count_bad(const uint32_t *w, size_t n, uint32_t seed) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += w[i] != (seed ^ (uint32_t)(i * 2654435761u));
    return bad;
}

static void vmm_basic(void) {
    dt_init_ctx();
    CUmemAllocationProp prop = dt_vmm_prop(true);
    size_t g = 0;
    OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    EXPECT(g == 2 * MIB, "minimum granularity %zu", g);
    OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    EXPECT(g == 2 * MIB, "recommended granularity %zu", g);
    EXPECT_RC(cuMemGetAllocationGranularity(&g, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_ERROR_INVALID_VALUE);
    CUmemGenericAllocationHandle h, h2;
    EXPECT_RC(cuMemCreate(&h, MIB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemCreate(&h, 4 * MIB, &prop, 0));
    OK(cuMemCreate(&h2, 2 * MIB, &prop, 0));
    CUdeviceptr va, tmp;
    OK(cuMemAddressReserve(&va, 8 * MIB, 0, 0, 0));
    EXPECT(va % (2 * MIB) == 0, "reservation 0x%llx not aligned to the granularity", va);
    EXPECT_RC(cuMemAddressReserve(&tmp, 4096, 0, 0, 0), EXP_VMM_RESERVE_UNALIGNED);
    OK(cuMemMap(va, 4 * MIB, 0, h, 0));
    EXPECT_RC(cuMemMap(va, 2 * MIB, 0, h2, 0), EXP_VMM_MAP_TWICE);
    EXPECT_RC(cuMemMap(va + 4 * MIB, 4 * MIB, 0, h2, 0), EXP_VMM_MAP_PAST_HANDLE);
    EXPECT_RC(cuMemMap(va + 4 * MIB, 2 * MIB, 2 * MIB, h2, 0), EXP_VMM_MAP_PAST_HANDLE);
    EXPECT_RC(cuMemMap(va + 4 * MIB, 2 * MIB, 0, h, 0), EXP_VMM_MAP_PAST_HANDLE);   /* part of h */
    EXPECT_RC(cuMemMap(va + 8 * MIB, 2 * MIB, 0, h2, 0), CUDA_ERROR_INVALID_VALUE); /* past the reservation */
    OK(cuMemMap(va + 4 * MIB, 2 * MIB, 0, h2, 0));
    CUmemAccessDesc d = rw();
    /* access is set on whole mappings, over mapped memory only */
    EXPECT_RC(cuMemSetAccess(va, 2 * MIB, &d, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemSetAccess(va, 8 * MIB, &d, 1), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemSetAccess(va, 6 * MIB, &d, 1));
    /* a copy and a kernel on mapped memory, across the two mappings */
    uint32_t *buf = malloc(6 * MIB), *back = malloc(6 * MIB);
    REQUIRE(buf && back, "malloc");
    fill_words(buf, 6 * MIB / 4, 1);
    OK(cuMemcpyHtoD(va, buf, 6 * MIB));
    OK(cuMemcpyDtoH(back, va, 6 * MIB));
    EXPECT(count_bad(back, 6 * MIB / 4, 1) == 0, "data across two mappings");
    CUmodule m = dt_module();
    CUfunction fill = dt_function(m, "dt_fill");
    dt_launch_fill(fill, NULL, va + 4 * MIB - 512, 0x5eed, 256);
    OK(cuCtxSynchronize());
    OK(cuMemcpyDtoH(back, va + 4 * MIB - 512, 1024));
    int bad = 0;
    for (int i = 0; i < 256; i++)
        bad += back[i] != 0x5eed;
    EXPECT(!bad, "a kernel writing across two mappings: %d words wrong", bad);
    CUdeviceptr base = 0;
    size_t size = 0;
    if (EXPECT_RC(cuMemGetAddressRange(&base, &size, va + 100), CUDA_SUCCESS))
        EXPECT(base == va && size == 4 * MIB, "address range of a mapping: 0x%llx+%zu", base, size);
    /* read-only access: reads work, writes are refused */
    CUmemAccessDesc ro = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READ};
    OK(cuMemSetAccess(va, 4 * MIB, &ro, 1));
    EXPECT_RC(cuMemcpyHtoD(va, buf, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyDtoH(back, va, 16), CUDA_SUCCESS);
    OK(cuMemSetAccess(va, 4 * MIB, &d, 1));
    /* released while mapped: the memory lives until it is unmapped */
    OK(cuMemRelease(h2));
    EXPECT_RC(cuMemRelease(h2), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemcpyDtoH(back, va + 4 * MIB, 4096));
    EXPECT(back[0] == 0x5eed, "memory released while mapped: read 0x%x, want 0x5eed", back[0]);
    /* a handle released while still mapped can be mapped once more */
    if (EXPECT_RC(cuMemMap(va + 6 * MIB, 2 * MIB, 0, h2, 0), CUDA_SUCCESS)) {
        OK(cuMemSetAccess(va + 6 * MIB, 2 * MIB, &d, 1));
        OK(cuMemcpyDtoH(back + 1024, va + 6 * MIB, 4096));
        EXPECT(back[1024] == 0x5eed, "second mapping of one allocation reads 0x%x, want 0x5eed", back[1024]);
        OK(cuMemUnmap(va + 6 * MIB, 2 * MIB));
    }
    EXPECT_RC(cuMemUnmap(va, 2 * MIB), CUDA_ERROR_INVALID_VALUE);       /* part of a mapping */
    EXPECT_RC(cuMemAddressFree(va, 8 * MIB), CUDA_ERROR_INVALID_VALUE); /* still mapped */
    OK(cuMemUnmap(va, 4 * MIB));
    OK(cuMemUnmap(va + 4 * MIB, 2 * MIB));
    EXPECT_RC(cuMemUnmap(va, 4 * MIB), CUDA_SUCCESS); /* nothing mapped there any more: a no-op */
    EXPECT_RC(cuMemcpyHtoD(va, buf, 16), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemRelease(h));
    EXPECT_RC(cuMemAddressFree(va, 4 * MIB), CUDA_ERROR_INVALID_VALUE); /* not the reserved size */
    OK(cuMemAddressFree(va, 8 * MIB));
    /* an fd that is not exported device memory */
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    CUmemGenericAllocationHandle hn;
    EXPECT_RC(cuMemImportFromShareableHandle(&hn, (void *)(intptr_t)devnull, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              EXP_VMM_IMPORT_FOREIGN_FD);
    close(devnull);
    /* an address hint is accepted, but is no promise: driver 580 reserves where it chooses */
    CUdeviceptr again;
    OK(cuMemAddressReserve(&again, 8 * MIB, 0, va, 0));
    OK(cuMemAddressFree(again, 8 * MIB));
    free(buf);
    free(back);
}

static void vmm_no_access(void) {
    dt_init_ctx();
    CUmemAllocationProp prop = dt_vmm_prop(false);
    CUmemGenericAllocationHandle h;
    OK(cuMemCreate(&h, 2 * MIB, &prop, 0));
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, 2 * MIB, 0, 0, 0));
    OK(cuMemMap(va, 2 * MIB, 0, h, 0));
    char buf[64] = {0};
    EXPECT_RC(cuMemcpyHtoD(va, buf, sizeof buf), EXP_VMM_COPY_NO_ACCESS);
    CUmemAccessDesc d = rw();
    OK(cuMemSetAccess(va, 2 * MIB, &d, 1));
    EXPECT_RC(cuMemcpyHtoD(va, buf, sizeof buf), CUDA_SUCCESS);
    int fd = -1;
    EXPECT_RC(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              EXP_VMM_EXPORT_NOT_REQUESTED);
    OK(cuMemUnmap(va, 2 * MIB));
    OK(cuMemRelease(h));
    OK(cuMemAddressFree(va, 2 * MIB));
}

static void vmm_export_import(void) {
    dt_init_ctx();
    CUmemAllocationProp prop = dt_vmm_prop(true);
    CUmemGenericAllocationHandle h;
    OK(cuMemCreate(&h, 4 * MIB, &prop, 0));
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, 4 * MIB, 0, 0, 0));
    OK(cuMemMap(va, 4 * MIB, 0, h, 0));
    CUmemAccessDesc d = rw();
    OK(cuMemSetAccess(va, 4 * MIB, &d, 1));
    uint32_t *buf = malloc(4 * MIB);
    REQUIRE(buf != NULL, "malloc");
    fill_words(buf, MIB / 2, 7); /* the first 2 MiB: ours */
    OK(cuMemcpyHtoD(va, buf, 2 * MIB));
    OK(cuCtxSynchronize());
    int fd = -1;
    OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    REQUIRE(fd >= 0, "exported fd %d", fd);
    dt_child c;
    REQUIRE(dt_spawn(&c, true, "vmm_import", NULL), "spawn the importing child");
    REQUIRE(dt_send_fd(c.sock, fd), "SCM_RIGHTS");
    close(fd);
    char line[256] = "";
    bool got = dt_read_line(c.from, line, sizeof line, 60000);
    EXPECT(got && strcmp(line, "ok") == 0, "importing child: %s", got ? line : "no answer");
    /* the child wrote the second 2 MiB */
    OK(cuMemcpyDtoH(buf, va + 2 * MIB, 2 * MIB));
    EXPECT(count_bad(buf, MIB / 2, 8) == 0, "what the importing child wrote is not visible here");
    dt_send_line(c.to, "exit");
    int st = dt_reap(&c, 30000);
    EXPECT(st == 0, "importing child exit status %d", st);
    OK(cuMemUnmap(va, 4 * MIB));
    OK(cuMemRelease(h));
    OK(cuMemAddressFree(va, 4 * MIB));
    free(buf);
}

/* drvtest --helper vmm_import: imports the fd on fd 4, checks the first half, writes the second. */
static int helper_vmm_import(int argc, char **argv) {
    (void)argc;
    (void)argv;
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    CUresult r;
    if (!dt_helper_import(&h))
        return 1;
    CUmemAccessDesc d = rw();
    if ((r = cuMemAddressReserve(&va, 4 * MIB, 0, 0, 0)) || (r = cuMemMap(va, 4 * MIB, 0, h, 0)) ||
        (r = cuMemSetAccess(va, 4 * MIB, &d, 1))) {
        dt_say("map: %s", dt_err(r));
        return 1;
    }
    uint32_t *buf = malloc(2 * MIB);
    if (!buf || (r = cuMemcpyDtoH(buf, va, 2 * MIB))) {
        dt_say("read: %s", dt_err(r));
        return 1;
    }
    size_t bad = count_bad(buf, MIB / 2, 7);
    if (bad) {
        dt_say("%zu words of the parent's data differ", bad);
        return 1;
    }
    fill_words(buf, MIB / 2, 8);
    if ((r = cuMemcpyHtoD(va + 2 * MIB, buf, 2 * MIB)) || (r = cuCtxSynchronize())) {
        dt_say("write: %s", dt_err(r));
        return 1;
    }
    dt_say("ok");
    char line[64];
    while (dt_hear(line, sizeof line) && strcmp(line, "exit") != 0) {
    }
    cuMemUnmap(va, 4 * MIB);
    cuMemRelease(h);
    cuMemAddressFree(va, 4 * MIB);
    free(buf);
    return 0;
}

const dt_case dt_cases_vmm[] = {
    {"vmm_basic", vmm_basic, 0},
    {"vmm_no_access", vmm_no_access, 0},
    {"vmm_export_import", vmm_export_import, 0},
    {NULL, NULL, 0},
};

const dt_helper dt_helpers_vmm[] = {
    {"vmm_import", helper_vmm_import},
    {NULL, NULL},
};

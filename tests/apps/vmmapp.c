/*
 * vmmapp (test application "c"): device memory through the VMM API.
 *
 * Two physical allocations (cuMemCreate, POSIX-fd shareable, on the device,
 * the second GPUDirect RDMA capable where the device supports it)
 * mapped back to back into one reserved range (cuMemAddressReserve, cuMemMap
 * twice, one cuMemSetAccess read-write over both), used as one array of
 * 32-bit words. The kernels, a memset and a device-to-device copy all work
 * across the boundary between the two allocations; the read-back for the
 * checksum too (chunks that span it). At exit: unmap, release, free the range.
 *
 * Sizes: --mib N rounded up to a multiple of 2 units, unit = 2 MiB (the H100's
 * granularity; the allocation granularity where that is larger); the first
 * allocation holds 3/8 of the units (at least one), the second the rest, so
 * the two differ and the split does not depend on the driver when the
 * granularity divides 2 MiB. Checksummed as two buffers: 0 and 1.
 *
 * Every iteration ITER, on one stream:
 *   app_vm_step over the whole range              (kernelParams)
 *   cuMemsetD32Async: 1024 words across the boundary
 *   app_vm_fold: words [0, 16384) from the 16384 words centred on the
 *     boundary                                      (packed `extra`)
 *   cuMemcpyDtoDAsync: the 8192 words centred on the boundary to the last
 *     8192 words of the range
 * The initial contents come from app_vm_init, launched with cuLaunchKernelEx.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuapp.h"

/*
 * app_vm_init(u32 *p, u32 n, u32 seed):        p[j] = mix32(j * 0x9E3779B1 + seed)
 * app_vm_step(u32 *p, u32 n, u32 iter, u32 salt):
 *   k = iter * 0x9E3779B1 + salt;
 *   v = (p[j] ^ k) * 0x01000193; v ^= v >> 13; p[j] = v + ((j << 3) ^ k)
 * app_vm_fold(u32 *dst, u32 *src, u32 count, u32 iter), j < count:
 *   dst[j] = dst[j] + (src[j] ^ (iter * 0x9E3779B1)) * 0x2545F491
 * (the same functions as heartbeat's init and step; src and dst of the fold
 * never overlap).
 */
static const char ptx[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry app_vm_init(\n"
    "\t.param .u64 app_vm_init_param_0,\n"
    "\t.param .u32 app_vm_init_param_1,\n"
    "\t.param .u32 app_vm_init_param_2\n"
    ")\n"
    "{\n"
    "\t.reg .pred %p<2>;\n"
    "\t.reg .b32 %r<12>;\n"
    "\t.reg .b64 %rd<6>;\n"
    "\n"
    "\tld.param.u64 %rd1, [app_vm_init_param_0];\n"
    "\tld.param.u32 %r1, [app_vm_init_param_1];\n"
    "\tld.param.u32 %r2, [app_vm_init_param_2];\n"
    "\tcvta.to.global.u64 %rd2, %rd1;\n"
    "\tmov.u32 %r3, %ctaid.x;\n"
    "\tmov.u32 %r4, %ntid.x;\n"
    "\tmov.u32 %r5, %tid.x;\n"
    "\tmad.lo.u32 %r6, %r3, %r4, %r5;\n"
    "\tmov.u32 %r7, %nctaid.x;\n"
    "\tmul.lo.u32 %r7, %r7, %r4;\n"
    "\tsetp.ge.u32 %p1, %r6, %r1;\n"
    "\t@%p1 bra $VI_done;\n"
    "$VI_loop:\n"
    "\tmad.lo.u32 %r8, %r6, 0x9E3779B1, %r2;\n"
    "\tshr.u32 %r9, %r8, 16;\n"
    "\txor.b32 %r8, %r8, %r9;\n"
    "\tmul.lo.u32 %r8, %r8, 0x85EBCA6B;\n"
    "\tshr.u32 %r9, %r8, 13;\n"
    "\txor.b32 %r8, %r8, %r9;\n"
    "\tmul.lo.u32 %r8, %r8, 0xC2B2AE35;\n"
    "\tshr.u32 %r9, %r8, 16;\n"
    "\txor.b32 %r8, %r8, %r9;\n"
    "\tmul.wide.u32 %rd3, %r6, 4;\n"
    "\tadd.s64 %rd4, %rd2, %rd3;\n"
    "\tst.global.u32 [%rd4], %r8;\n"
    "\tadd.u32 %r6, %r6, %r7;\n"
    "\tsetp.lt.u32 %p1, %r6, %r1;\n"
    "\t@%p1 bra $VI_loop;\n"
    "$VI_done:\n"
    "\tret;\n"
    "}\n"
    "\n"
    ".visible .entry app_vm_step(\n"
    "\t.param .u64 app_vm_step_param_0,\n"
    "\t.param .u32 app_vm_step_param_1,\n"
    "\t.param .u32 app_vm_step_param_2,\n"
    "\t.param .u32 app_vm_step_param_3\n"
    ")\n"
    "{\n"
    "\t.reg .pred %p<2>;\n"
    "\t.reg .b32 %r<14>;\n"
    "\t.reg .b64 %rd<6>;\n"
    "\n"
    "\tld.param.u64 %rd1, [app_vm_step_param_0];\n"
    "\tld.param.u32 %r1, [app_vm_step_param_1];\n"
    "\tld.param.u32 %r2, [app_vm_step_param_2];\n"
    "\tld.param.u32 %r3, [app_vm_step_param_3];\n"
    "\tcvta.to.global.u64 %rd2, %rd1;\n"
    "\tmad.lo.u32 %r10, %r2, 0x9E3779B1, %r3;\n"
    "\tmov.u32 %r4, %ctaid.x;\n"
    "\tmov.u32 %r5, %ntid.x;\n"
    "\tmov.u32 %r6, %tid.x;\n"
    "\tmad.lo.u32 %r7, %r4, %r5, %r6;\n"
    "\tmov.u32 %r8, %nctaid.x;\n"
    "\tmul.lo.u32 %r8, %r8, %r5;\n"
    "\tsetp.ge.u32 %p1, %r7, %r1;\n"
    "\t@%p1 bra $VS_done;\n"
    "$VS_loop:\n"
    "\tmul.wide.u32 %rd3, %r7, 4;\n"
    "\tadd.s64 %rd4, %rd2, %rd3;\n"
    "\tld.global.u32 %r9, [%rd4];\n"
    "\txor.b32 %r9, %r9, %r10;\n"
    "\tmul.lo.u32 %r9, %r9, 0x01000193;\n"
    "\tshr.u32 %r11, %r9, 13;\n"
    "\txor.b32 %r9, %r9, %r11;\n"
    "\tshl.b32 %r11, %r7, 3;\n"
    "\txor.b32 %r11, %r11, %r10;\n"
    "\tadd.u32 %r9, %r9, %r11;\n"
    "\tst.global.u32 [%rd4], %r9;\n"
    "\tadd.u32 %r7, %r7, %r8;\n"
    "\tsetp.lt.u32 %p1, %r7, %r1;\n"
    "\t@%p1 bra $VS_loop;\n"
    "$VS_done:\n"
    "\tret;\n"
    "}\n"
    "\n"
    ".visible .entry app_vm_fold(\n"
    "\t.param .u64 app_vm_fold_param_0,\n"
    "\t.param .u64 app_vm_fold_param_1,\n"
    "\t.param .u32 app_vm_fold_param_2,\n"
    "\t.param .u32 app_vm_fold_param_3\n"
    ")\n"
    "{\n"
    "\t.reg .pred %p<2>;\n"
    "\t.reg .b32 %r<14>;\n"
    "\t.reg .b64 %rd<10>;\n"
    "\n"
    "\tld.param.u64 %rd1, [app_vm_fold_param_0];\n"
    "\tld.param.u64 %rd2, [app_vm_fold_param_1];\n"
    "\tld.param.u32 %r1, [app_vm_fold_param_2];\n" /* count */
    "\tld.param.u32 %r2, [app_vm_fold_param_3];\n" /* iter */
    "\tcvta.to.global.u64 %rd3, %rd1;\n"
    "\tcvta.to.global.u64 %rd4, %rd2;\n"
    "\tmul.lo.u32 %r3, %r2, 0x9E3779B1;\n"
    "\tmov.u32 %r4, %ctaid.x;\n"
    "\tmov.u32 %r5, %ntid.x;\n"
    "\tmov.u32 %r6, %tid.x;\n"
    "\tmad.lo.u32 %r7, %r4, %r5, %r6;\n"
    "\tmov.u32 %r8, %nctaid.x;\n"
    "\tmul.lo.u32 %r8, %r8, %r5;\n"
    "\tsetp.ge.u32 %p1, %r7, %r1;\n"
    "\t@%p1 bra $VF_done;\n"
    "$VF_loop:\n"
    "\tmul.wide.u32 %rd5, %r7, 4;\n"
    "\tadd.s64 %rd6, %rd4, %rd5;\n"
    "\tld.global.u32 %r9, [%rd6];\n" /* src */
    "\txor.b32 %r9, %r9, %r3;\n"
    "\tmul.lo.u32 %r9, %r9, 0x2545F491;\n"
    "\tadd.s64 %rd7, %rd3, %rd5;\n"
    "\tld.global.u32 %r10, [%rd7];\n" /* dst */
    "\tadd.u32 %r10, %r10, %r9;\n"
    "\tst.global.u32 [%rd7], %r10;\n"
    "\tadd.u32 %r7, %r7, %r8;\n"
    "\tsetp.lt.u32 %p1, %r7, %r1;\n"
    "\t@%p1 bra $VF_loop;\n"
    "$VF_done:\n"
    "\tret;\n"
    "}\n";

/* app_vm_fold's parameters packed as the PTX lays them out, for `extra`. */
typedef struct vm_fold_params {
    uint64_t dst;   /* offset 0 */
    uint64_t src;   /* offset 8 */
    uint32_t count; /* offset 16 */
    uint32_t iter;  /* offset 20 */
} vm_fold_params;
_Static_assert(sizeof(vm_fold_params) == 24, "packed parameter layout");

#define UNIT (2ull << 20)
#define FOLD_WORDS 16384u
#define MEMSET_WORDS 1024u
#define COPY_WORDS 8192u
#define VM_SALT 0x5851F42Du

typedef struct vm_state {
    CUdeviceptr base;
    uint64_t total, size[2];
    CUmemGenericAllocationHandle h[2];
    CUstream s;
    CUmodule mod;
    CUfunction f_init, f_step, f_fold;
} vm_state;

static void step(void *p, uint32_t iter) {
    vm_state *st = p;
    CUdeviceptr base = st->base, boundary = st->base + st->size[0];
    uint32_t n = (uint32_t)(st->total / 4), it = iter, salt = VM_SALT;

    void *args[] = {&base, &n, &it, &salt};
    CHECK(cuLaunchKernel(st->f_step, gpuapp_grid(n), 1, 1, GPUAPP_BLOCK, 1, 1, 0, st->s, args, NULL));

    CHECK(cuMemsetD32Async(boundary - MEMSET_WORDS / 2 * 4, iter * 0x2C1B3C6Du ^ 0x297A2D39u, MEMSET_WORDS, st->s));

    vm_fold_params prm = {base, boundary - FOLD_WORDS / 2 * 4, FOLD_WORDS, iter};
    size_t prm_size = sizeof(prm);
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &prm, CU_LAUNCH_PARAM_BUFFER_SIZE, &prm_size, CU_LAUNCH_PARAM_END};
    CHECK(cuLaunchKernel(st->f_fold, gpuapp_grid(FOLD_WORDS), 1, 1, GPUAPP_BLOCK, 1, 1, 0, st->s, NULL, extra));

    CHECK(cuMemcpyDtoDAsync(base + st->total - COPY_WORDS * 4, boundary - COPY_WORDS / 2 * 4, COPY_WORDS * 4, st->s));
}

static uint64_t checksum(void *p) {
    vm_state *st = p;
    CHECK(cuStreamSynchronize(st->s));
    return gpuapp_sum_device_split(GPUAPP_SUM_BASIS, st->base, st->size, 2);
}

int main(int argc, char **argv) {
    gpuapp app;
    vm_state st;
    gpuapp_parse(&app, "vmmapp", GPUAPP_OPT_MIB, 64, 2, argc, argv);
    memset(&st, 0, sizeof(st));
    gpuapp_context(&app);

    int vmm = 0, posix = 0;
    CHECK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, app.dev));
    CHECK(cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, app.dev));
    if (!vmm || !posix)
        gpuapp_die("device %d: VMM supported %d, POSIX fd handles supported %d", app.ordinal, vmm, posix);

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = app.dev;
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (gran == 0)
        gpuapp_die("allocation granularity 0");
    uint64_t unit = UNIT % gran == 0 ? UNIT : (uint64_t)gran * ((UNIT + gran - 1) / gran);
    uint64_t units = (((uint64_t)app.mib << 20) + unit - 1) / unit;
    if (units < 2)
        units = 2;
    uint64_t u0 = units * 3 / 8 ? units * 3 / 8 : 1;
    st.size[0] = u0 * unit;
    st.size[1] = (units - u0) * unit;
    st.total = st.size[0] + st.size[1];
    if (st.total / 4 > 0xFFFFFFFFull - (1u << 20))
        gpuapp_die("--mib %u is too large (kernels index 32-bit words)", app.mib);

    /* One virtual range, two physical allocations mapped into it contiguously;
     * the second GPUDirect RDMA capable where the device supports that with
     * VMM, as PyTorch's expandable segments ask for it. */
    int gdr = 0;
    CHECK(cuDeviceGetAttribute(&gdr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, app.dev));
    CHECK(cuMemAddressReserve(&st.base, st.total, 0, 0, 0));
    for (int i = 0; i < 2; i++) {
        prop.allocFlags.gpuDirectRDMACapable = i == 1 && gdr;
        CHECK(cuMemCreate(&st.h[i], st.size[i], &prop, 0));
    }
    CHECK(cuMemMap(st.base, st.size[0], 0, st.h[0], 0));
    CHECK(cuMemMap(st.base + st.size[0], st.size[1], 0, st.h[1], 0));
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = app.dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemSetAccess(st.base, st.total, &acc, 1));

    st.mod = gpuapp_load_ptx(ptx);
    st.f_init = gpuapp_function(st.mod, "app_vm_init");
    st.f_step = gpuapp_function(st.mod, "app_vm_step");
    st.f_fold = gpuapp_function(st.mod, "app_vm_fold");
    CHECK(cuStreamCreate(&st.s, CU_STREAM_NON_BLOCKING));

    CUdeviceptr base = st.base;
    uint32_t n = (uint32_t)(st.total / 4), seed = app.seed;
    void *args[] = {&base, &n, &seed};
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.gridDimX = gpuapp_grid(n);
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = GPUAPP_BLOCK;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = st.s;
    CHECK(cuLaunchKernelEx(&cfg, st.f_init, args, NULL));
    CHECK(cuStreamSynchronize(st.s));

    gpuapp_ready(&app, (unsigned long long)(st.total >> 20), 2);
    gpuapp_loop(&app, &st, step, checksum);

    CHECK(cuStreamSynchronize(st.s));
    CHECK(cuStreamDestroy(st.s));
    CHECK(cuModuleUnload(st.mod));
    /* Unmap before releasing the handles and freeing the range. */
    CHECK(cuMemUnmap(st.base, st.size[0]));
    CHECK(cuMemUnmap(st.base + st.size[0], st.size[1]));
    CHECK(cuMemRelease(st.h[0]));
    CHECK(cuMemRelease(st.h[1]));
    CHECK(cuMemAddressFree(st.base, st.total));
    gpuapp_context_release(&app);
    return 0;
}

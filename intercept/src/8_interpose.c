/*
 * The wrappers (layer 8): the exported entry points under the driver's ABI
 * names (GC_SYMS), each passing the gate, connecting to the helper where it
 * needs it, counting, and calling on the layers below; the constructor.
 * 8_gated.c has those that need nothing but the gate.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "1_base.h"
#include "2_link.h"
#include "3_devices.h"
#include "4_alloc.h"
#include "5_vmm.h"
#include "6_modules.h"
#include "7_control.h"
#include "7_cow.h"

/* ---- init ---- */

/*
 * How launches are scanned for pointers into tracked buffers (GPUCR_SCAN):
 *   all     every launch (what concurrent checkpointing will need while a
 *           copy-on-write window is open)
 *   sample  (default) a sample of each thread's launches, one in 64 or
 *           fewer for kernels with big parameter blocks (gc_scan_due, 1_base.h):
 *           the statistics stay representative while the cost stays out of
 *           the step time (scanning every launch cost ResNet-18 training
 *           about 13% of its step time on the H200 machine: its kernels take
 *           kilobytes of parameters)
 *   0       none; launches are only counted
 */
enum { SCAN_OFF, SCAN_SAMPLE, SCAN_ALL };
static int scan_mode = SCAN_SAMPLE;

__attribute__((constructor)) static void gc_init(void) {
    gc_log_init();
    const char *sc = getenv("GPUCR_SCAN");
    if (sc && strcmp(sc, "0") == 0)
        scan_mode = SCAN_OFF;
    else if (sc && strcmp(sc, "all") == 0)
        scan_mode = SCAN_ALL;
    gc_gate_init();
    gc_fork_init();
}

/* ---- wrappers ---- */

/* Counted pass-through; WRITE runs first while a copy-on-write window is open (7_cow.h). */
#define WRAP_COUNT(name, stat, PARAMS, ARGS, WRITE)                                                                    \
    GC_EXPORT CUresult name PARAMS {                                                                                   \
        __typeof__(&name) fn = GC_REAL(name);                                                                          \
        if (!fn)                                                                                                       \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
        if (gc_gate_enter()) {                                                                                         \
            WRITE;                                                                                                     \
        }                                                                                                              \
        gc_stat_add(stat, 1);                                                                                          \
        CUresult r = fn ARGS;                                                                                          \
        gc_gate_leave();                                                                                               \
        return r;                                                                                                      \
    }

GC_EXPORT CUresult cuInit(unsigned int flags) {
    __typeof__(&cuInit) fn = GC_REAL(cuInit);
    if (!fn)
        return CUDA_ERROR_NOT_INITIALIZED;
    gc_forkscrub_before_init();
    gc_gate_enter();
    CUresult r = fn(flags);
    gc_gate_leave();
    gc_forkscrub_after_init(r == CUDA_SUCCESS);
    if (r == CUDA_SUCCESS) {
        gc_dev_learn_all();
        gc_client_ensure();
    }
    return r;
}

/* ---- allocations ---- */

/* An allocation connects to the helper on first need (not for arguments the driver refuses anyway). */
static CUresult alloc(CUdeviceptr *dptr, size_t size, int kind, bool *use_real) {
    if (dptr && size)
        gc_client_ensure();
    return gc_alloc(dptr, size, kind, use_real);
}

#define ALLOC_BODY(name, kind, ...)                                                                                    \
    __typeof__(&name) fn = GC_REAL(name);                                                                              \
    if (!fn)                                                                                                           \
        return CUDA_ERROR_NOT_SUPPORTED;                                                                               \
    gc_gate_enter();                                                                                                   \
    bool use_real = false;                                                                                             \
    CUresult r = alloc(dptr, bytesize, kind, &use_real);                                                               \
    if (use_real) {                                                                                                    \
        r = fn(__VA_ARGS__);                                                                                           \
        if (r == CUDA_SUCCESS)                                                                                         \
            gc_track_local(*dptr, bytesize, kind);                                                                     \
    }                                                                                                                  \
    gc_gate_leave();                                                                                                   \
    return r;

GC_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize){
    ALLOC_BODY(cuMemAlloc_v2, GC_KIND_MEM_ALLOC, dptr, bytesize)} GC_EXPORT CUresult
    cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream){
        ALLOC_BODY(cuMemAllocAsync, GC_KIND_ASYNC, dptr, bytesize, hStream)} GC_EXPORT CUresult
    cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream){
        ALLOC_BODY(cuMemAllocAsync_ptsz, GC_KIND_ASYNC, dptr, bytesize, hStream)} GC_EXPORT CUresult
    cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream){
        ALLOC_BODY(cuMemAllocFromPoolAsync, GC_KIND_ASYNC, dptr, bytesize, pool, hStream)} GC_EXPORT CUresult
    cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream){
        ALLOC_BODY(cuMemAllocFromPoolAsync_ptsz, GC_KIND_ASYNC, dptr, bytesize, pool, hStream)}

/*
 * Pitch: round_up(width, 512), as the simulator does. The real driver's pitch
 * depends on the device's texture pitch alignment and the element size; any
 * pitch >= width that is a multiple of it is valid for the application, which
 * must use the pitch it is given.
 */
GC_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                      unsigned int ElementSizeBytes) {
    __typeof__(&cuMemAllocPitch_v2) fn = GC_REAL(cuMemAllocPitch_v2);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    bool use_real = true;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) / 512 * 512;
    if (dptr && pPitch && WidthInBytes && Height &&
        (ElementSizeBytes == 4 || ElementSizeBytes == 8 || ElementSizeBytes == 16) && pitch >= WidthInBytes &&
        Height <= SIZE_MAX / pitch) {
        use_real = false;
        r = alloc(dptr, pitch * Height, GC_KIND_PITCH, &use_real);
        if (r == CUDA_SUCCESS && !use_real)
            *pPitch = pitch;
    }
    if (use_real) {
        r = fn(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
        if (r == CUDA_SUCCESS)
            gc_track_local(*dptr, *pPitch * Height, GC_KIND_PITCH);
    }
    gc_gate_leave();
    return r;
}

#define FREE_BODY(name, async, stream, ...)                                                                            \
    __typeof__(&name) fn = GC_REAL(name);                                                                              \
    if (!fn)                                                                                                           \
        return CUDA_ERROR_NOT_SUPPORTED;                                                                               \
    gc_gate_enter();                                                                                                   \
    CUresult r;                                                                                                        \
    if (!gc_free(dptr, async, stream, &r))                                                                             \
        r = fn(__VA_ARGS__);                                                                                           \
    gc_gate_leave();                                                                                                   \
    return r;

GC_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr){FREE_BODY(cuMemFree_v2, false, NULL, dptr)} GC_EXPORT CUresult
    cuMemFreeAsync(CUdeviceptr dptr,
                   CUstream hStream){FREE_BODY(cuMemFreeAsync, true, hStream, dptr, hStream)} GC_EXPORT CUresult
    cuMemFreeAsync_ptsz(CUdeviceptr dptr,
                        CUstream hStream){FREE_BODY(cuMemFreeAsync_ptsz, true, hStream, dptr, hStream)}

/*
 * A process restored onto another GPU: the driver still answers the old GPU's PCI bus id for the ordinal (measured,
 * driver 580), while its UUID is the new GPU's; the helper's bus id of the new GPU makes the two agree (NCCL and
 * NVML users find a GPU by its bus id). Until a restore moves an ordinal, both pass straight through.
 */
GC_EXPORT CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
    __typeof__(&cuDeviceGetPCIBusId) fn = GC_REAL(cuDeviceGetPCIBusId);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    char bus[32];
    if (pciBusId && len > 0 && gc_dev_moved_bus_id(dev, bus, sizeof bus) && strlen(bus) < (size_t)len) {
        memcpy(pciBusId, bus, strlen(bus) + 1);
        return CUDA_SUCCESS;
    }
    return fn(pciBusId, len, dev);
}

GC_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    __typeof__(&cuDeviceGetAttribute) fn = GC_REAL(cuDeviceGetAttribute);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = fn(pi, attrib, dev);
    if (r != CUDA_SUCCESS || !pi ||
        (attrib != CU_DEVICE_ATTRIBUTE_PCI_BUS_ID && attrib != CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID &&
         attrib != CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID))
        return r;
    char bus[32];
    unsigned dom, b, d, f;
    if (gc_dev_moved_bus_id(dev, bus, sizeof bus) && sscanf(bus, "%x:%x:%x.%x", &dom, &b, &d, &f) == 4)
        *pi = (int)(attrib == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID      ? b
                    : attrib == CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID ? d
                                                                  : dom);
    return r;
}

GC_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    __typeof__(&cuMemGetAddressRange_v2) fn = GC_REAL(cuMemGetAddressRange_v2);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r = CUDA_SUCCESS;
    if (!gc_addr_range(dptr, pbase, psize))
        r = fn(pbase, psize, dptr);
    gc_gate_leave();
    return r;
}

/* Pointer queries wait at the gate: between a checkpoint's drop of the process's memory and its return (or the
 * freeze), the memory is unmapped, and the driver would answer for it as for memory it does not know. */
GC_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    __typeof__(&cuPointerGetAttribute) fn = GC_REAL(cuPointerGetAttribute);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r = fn(data, attribute, ptr);
    gc_gate_leave();
    return r;
}

GC_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                          CUdeviceptr ptr) {
    __typeof__(&cuPointerGetAttributes) fn = GC_REAL(cuPointerGetAttributes);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r = fn(numAttributes, attributes, data, ptr);
    gc_gate_leave();
    return r;
}

GC_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    __typeof__(&cuMemAllocManaged) fn = GC_REAL(cuMemAllocManaged);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r = fn(dptr, bytesize, flags);
    if (r == CUDA_SUCCESS)
        gc_note_reason(GC_REASON_MANAGED);
    gc_gate_leave();
    return r;
}

GC_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    __typeof__(&cuIpcGetMemHandle) fn = GC_REAL(cuIpcGetMemHandle);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r;
    if (gc_is_helper_mem(dptr)) {
        gc_warn(
            "cuIpcGetMemHandle on gpucr-managed memory (0x%llx): not supported (VMM memory has no legacy IPC "
            "handle)",
            dptr);
        r = CUDA_ERROR_NOT_SUPPORTED;
    } else {
        r = fn(pHandle, dptr);
    }
    gc_gate_leave();
    return r;
}

/* ---- the application's own VMM calls (5_vmm.c) ---- */

GC_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
    __typeof__(&cuMemCreate) fn = GC_REAL(cuMemCreate);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r = GC_FALLBACK;
    const char *why = gc_vmm_unservable(size, prop, flags);
    if (handle && !why && gc_client_up())
        r = gc_vmm_create(handle, size, prop);
    if (r == GC_FALLBACK) {
        r = fn(handle, size, prop, flags);
        if (r == CUDA_SUCCESS)
            gc_vmm_created_by_driver(*handle, size, prop, flags, why);
    }
    gc_gate_leave();
    return r;
}

/* The driver's entry point fn (NULL: not supported), the gate, the VMM layer. */
#define VMM_BODY(name, call)                                                                                           \
    __typeof__(&name) fn = GC_REAL(name);                                                                              \
    if (!fn)                                                                                                           \
        return CUDA_ERROR_NOT_SUPPORTED;                                                                               \
    gc_gate_enter();                                                                                                   \
    CUresult r = call;                                                                                                 \
    gc_gate_leave();                                                                                                   \
    return r;

GC_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle){
    VMM_BODY(cuMemRelease, gc_vmm_release(fn, handle))} GC_EXPORT CUresult
    cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
             unsigned long long flags){
        VMM_BODY(cuMemMap, gc_vmm_map(fn, ptr, size, offset, handle, flags))} GC_EXPORT CUresult
    cuMemUnmap(CUdeviceptr ptr, size_t size){VMM_BODY(cuMemUnmap, gc_vmm_unmap(fn, ptr, size))} GC_EXPORT CUresult
    cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count){
        VMM_BODY(cuMemSetAccess, gc_vmm_set_access(fn, ptr, size, desc, count))} GC_EXPORT CUresult
    cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                 CUmemAllocationHandleType handleType, unsigned long long flags){
        VMM_BODY(cuMemExportToShareableHandle,
                 gc_vmm_export(fn, shareableHandle, handle, handleType, flags))} GC_EXPORT CUresult
    cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                   CUmemAllocationHandleType shHandleType){
        VMM_BODY(cuMemImportFromShareableHandle, gc_vmm_import(fn, handle, osHandle, shHandleType))}

/* These two answer for virtual handles without the driver's entry point. */
GC_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    __typeof__(&cuMemRetainAllocationHandle) fn = GC_REAL(cuMemRetainAllocationHandle);
    gc_gate_enter();
    CUresult r = gc_vmm_retain(fn, handle, addr);
    gc_gate_leave();
    return r;
}
GC_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                          CUmemGenericAllocationHandle handle) {
    __typeof__(&cuMemGetAllocationPropertiesFromHandle) fn = GC_REAL(cuMemGetAllocationPropertiesFromHandle);
    gc_gate_enter();
    CUresult r = gc_vmm_get_props(fn, prop, handle);
    gc_gate_leave();
    return r;
}

/* ---- launches ---- */

static inline void scan(void *f, void **kernelParams, void **extra) {
    if (scan_mode == SCAN_SAMPLE) {
        if (gc_scan_due()) {
            if (gc_alloc_tracking()) {
                gc_scan_sample(gc_buffers(), f, kernelParams, extra);
                return;
            }
            gc_scan_wait = GC_SCAN_SAMPLE_MIN - 1;
        }
    } else if (scan_mode == SCAN_ALL && gc_alloc_tracking()) {
        gc_scan_launch(gc_buffers(), f, kernelParams, extra, NULL);
        return;
    }
    gc_stat_add(STAT_LAUNCHES, 1);
}

/* A launch of one of NCCL's kernels into stream while it captures: counted into the graph it captures (1_sync.c),
 * and no operation now. A _ptsz launch on stream 0 (the thread's own stream) is taken for the legacy stream,
 * which cannot capture: NCCL launches on streams of its own. */
static bool captured(CUstream stream) {
    __typeof__(&cuStreamGetCaptureInfo_v2) info = GC_REAL(cuStreamGetCaptureInfo_v2);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    CUgraph g = NULL;
    if (!info || info(stream, &st, &id, &g, NULL, NULL) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_ACTIVE || !g)
        return false;
    gc_sync_captured(g);
    return true;
}

#define LAUNCH(name)                                                                                                   \
    GC_EXPORT CUresult name(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,         \
                            unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                    \
                            unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {        \
        __typeof__(&name) fn = GC_REAL(name);                                                                          \
        if (!fn)                                                                                                       \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
        if (gc_sync_enter(gc_launch_sync(f) && !captured(hStream)))                                                    \
            gc_cow_launch(f, kernelParams, extra);                                                                     \
        scan(f, kernelParams, extra);                                                                                  \
        CUresult r = fn(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,     \
                        kernelParams, extra);                                                                          \
        gc_gate_leave();                                                                                               \
        return r;                                                                                                      \
    }
LAUNCH(cuLaunchKernel)
LAUNCH(cuLaunchKernel_ptsz)

#define LAUNCH_COOP(name)                                                                                              \
    GC_EXPORT CUresult name(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,         \
                            unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                    \
                            unsigned int sharedMemBytes, CUstream hStream, void **kernelParams) {                      \
        __typeof__(&name) fn = GC_REAL(name);                                                                          \
        if (!fn)                                                                                                       \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
        if (gc_sync_enter(gc_launch_sync(f) && !captured(hStream)))                                                    \
            gc_cow_launch(f, kernelParams, NULL);                                                                      \
        scan(f, kernelParams, NULL);                                                                                   \
        CUresult r = fn(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,     \
                        kernelParams);                                                                                 \
        gc_gate_leave();                                                                                               \
        return r;                                                                                                      \
    }
LAUNCH_COOP(cuLaunchCooperativeKernel)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)

#define LAUNCH_EX(name)                                                                                                \
    GC_EXPORT CUresult name(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {           \
        __typeof__(&name) fn = GC_REAL(name);                                                                          \
        if (!fn)                                                                                                       \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
        if (gc_sync_enter(gc_launch_sync(f) && !captured(config ? config->hStream : NULL)))                            \
            gc_cow_launch(f, kernelParams, extra);                                                                     \
        scan(f, kernelParams, extra);                                                                                  \
        CUresult r = fn(config, f, kernelParams, extra);                                                               \
        gc_gate_leave();                                                                                               \
        return r;                                                                                                      \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

/* ---- CUDA graphs ----
 * A graph's launch is as many peer sync operations as NCCL launches were captured into its graph (1_sync.c): the
 * launches into a capturing stream above count there, not as they are made. */

#define GRAPH_LAUNCH(name)                                                                                             \
    GC_EXPORT CUresult name(CUgraphExec hGraphExec, CUstream hStream) {                                                \
        __typeof__(&name) fn = GC_REAL(name);                                                                          \
        if (!fn)                                                                                                       \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
        if (gc_sync_enter_n(gc_sync_graph_ops(hGraphExec)))                                                            \
            gc_cow_all();                                                                                              \
        gc_stat_add(STAT_LAUNCHES, 1);                                                                                 \
        CUresult r = fn(hGraphExec, hStream);                                                                          \
        gc_gate_leave();                                                                                               \
        return r;                                                                                                      \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)

/* An executable graph counts what its graph counted. */
#define INSTANTIATE(name, T3, p3)                                                                                      \
    GC_EXPORT CUresult name(CUgraphExec *phGraphExec, CUgraph hGraph, T3 p3) {                                         \
        __typeof__(&name) fn = GC_REAL(name);                                                                          \
        if (!fn)                                                                                                       \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
        CUresult r = fn(phGraphExec, hGraph, p3);                                                                      \
        if (r == CUDA_SUCCESS && phGraphExec)                                                                          \
            gc_sync_instantiated(*phGraphExec, hGraph);                                                                \
        return r;                                                                                                      \
    }
INSTANTIATE(cuGraphInstantiateWithFlags, unsigned long long, flags)
INSTANTIATE(cuGraphInstantiateWithParams, CUDA_GRAPH_INSTANTIATE_PARAMS *, params)
INSTANTIATE(cuGraphInstantiateWithParams_ptsz, CUDA_GRAPH_INSTANTIATE_PARAMS *, params)

GC_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    __typeof__(&cuGraphExecDestroy) fn = GC_REAL(cuGraphExecDestroy);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_sync_graph_gone(hGraphExec, true); /* first: the driver may hand the handle out again at once */
    return fn(hGraphExec);
}

GC_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
    __typeof__(&cuGraphDestroy) fn = GC_REAL(cuGraphDestroy);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_sync_graph_gone(hGraph, false);
    return fn(hGraph);
}

/* ---- copies and memsets ---- */

/* A copy writes its destination (a host destination is never guarded) and reads its source (only a restore's
 * loading window holds reads). */
#define CP_SYNC(name, D, S, W) WRAP_COUNT(name, STAT_COPIES, (D dst, S src, size_t n), (dst, src, n), W)
#define CP_ASYNC(name, D, S, W) WRAP_COUNT(name, STAT_COPIES, (D dst, S src, size_t n, CUstream s), (dst, src, n, s), W)
#define TO_DEV gc_cow_write((uint64_t)dst, n)
#define FROM_DEV gc_cow_read((uint64_t)src, n)
#define DEV_DEV (gc_cow_read((uint64_t)src, n), gc_cow_write((uint64_t)dst, n))
CP_SYNC(cuMemcpyHtoD_v2, CUdeviceptr, const void *, TO_DEV)
CP_SYNC(cuMemcpyDtoH_v2, void *, CUdeviceptr, FROM_DEV)
CP_SYNC(cuMemcpyDtoD_v2, CUdeviceptr, CUdeviceptr, DEV_DEV)
CP_SYNC(cuMemcpy, CUdeviceptr, CUdeviceptr, DEV_DEV)
CP_SYNC(cuMemcpyHtoD_v2_ptds, CUdeviceptr, const void *, TO_DEV)
CP_SYNC(cuMemcpyDtoH_v2_ptds, void *, CUdeviceptr, FROM_DEV)
CP_SYNC(cuMemcpyDtoD_v2_ptds, CUdeviceptr, CUdeviceptr, DEV_DEV)
CP_SYNC(cuMemcpy_ptds, CUdeviceptr, CUdeviceptr, DEV_DEV)
CP_ASYNC(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void *, TO_DEV)
CP_ASYNC(cuMemcpyDtoHAsync_v2, void *, CUdeviceptr, FROM_DEV)
CP_ASYNC(cuMemcpyDtoDAsync_v2, CUdeviceptr, CUdeviceptr, DEV_DEV)
CP_ASYNC(cuMemcpyAsync, CUdeviceptr, CUdeviceptr, DEV_DEV)
CP_ASYNC(cuMemcpyHtoDAsync_v2_ptsz, CUdeviceptr, const void *, TO_DEV)
CP_ASYNC(cuMemcpyDtoHAsync_v2_ptsz, void *, CUdeviceptr, FROM_DEV)
CP_ASYNC(cuMemcpyDtoDAsync_v2_ptsz, CUdeviceptr, CUdeviceptr, DEV_DEV)
CP_ASYNC(cuMemcpyAsync_ptsz, CUdeviceptr, CUdeviceptr, DEV_DEV)

/* A memset writes n elements of sizeof(T) from d. */
#define MS_SYNC(name, T)                                                                                               \
    WRAP_COUNT(name, STAT_MEMSETS, (CUdeviceptr d, T v, size_t n), (d, v, n), gc_cow_write(d, (uint64_t)n * sizeof(T)))
#define MS_ASYNC(name, T)                                                                                              \
    WRAP_COUNT(name, STAT_MEMSETS, (CUdeviceptr d, T v, size_t n, CUstream s), (d, v, n, s),                           \
               gc_cow_write(d, (uint64_t)n * sizeof(T)))
MS_SYNC(cuMemsetD8_v2, unsigned char)
MS_SYNC(cuMemsetD16_v2, unsigned short)
MS_SYNC(cuMemsetD32_v2, unsigned int)
MS_SYNC(cuMemsetD8_v2_ptds, unsigned char)
MS_SYNC(cuMemsetD16_v2_ptds, unsigned short)
MS_SYNC(cuMemsetD32_v2_ptds, unsigned int)
MS_ASYNC(cuMemsetD8Async, unsigned char)
MS_ASYNC(cuMemsetD16Async, unsigned short)
MS_ASYNC(cuMemsetD32Async, unsigned int)
MS_ASYNC(cuMemsetD8Async_ptsz, unsigned char)
MS_ASYNC(cuMemsetD16Async_ptsz, unsigned short)
MS_ASYNC(cuMemsetD32Async_ptsz, unsigned int)

/* ---- modules, libraries ---- */

/* AFTER runs once the gate is left: it may wait for the helper (gc_cow_module). */
#define LOAD_BODY(name, NOTE, AFTER, ...)                                                                              \
    __typeof__(&name) fn = GC_REAL(name);                                                                              \
    if (!fn)                                                                                                           \
        return CUDA_ERROR_NOT_SUPPORTED;                                                                               \
    gc_gate_enter();                                                                                                   \
    CUresult r = fn(__VA_ARGS__);                                                                                      \
    if (r == CUDA_SUCCESS) {                                                                                           \
        gc_stat_add(STAT_MODULES, 1);                                                                                  \
        NOTE;                                                                                                          \
    }                                                                                                                  \
    gc_gate_leave();                                                                                                   \
    if (r == CUDA_SUCCESS) {                                                                                           \
        AFTER;                                                                                                         \
    }                                                                                                                  \
    return r;

GC_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname){
    LOAD_BODY(cuModuleLoad, gc_note_module_file(fname), (void)0, module, fname)} GC_EXPORT CUresult
    cuModuleLoadData(CUmodule *module,
                     const void *image){LOAD_BODY(cuModuleLoadData, gc_note_module(image, 0),
                                                  gc_cow_module(*module, image), module, image)} GC_EXPORT CUresult
    cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
                       void **optionValues){LOAD_BODY(cuModuleLoadDataEx, gc_note_module(image, 0),
                                                      gc_cow_module(*module, image), module, image, numOptions, options,
                                                      optionValues)} GC_EXPORT CUresult
    cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues,
                      unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues,
                      unsigned int numLibraryOptions){
        LOAD_BODY(cuLibraryLoadData, gc_note_module(code, 0), gc_cow_module(*library, code), library, code, jitOptions,
                  jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues,
                  numLibraryOptions)} GC_EXPORT CUresult
    cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions, void **jitOptionsValues,
                          unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues,
                          unsigned int numLibraryOptions){
        LOAD_BODY(cuLibraryLoadFromFile, gc_note_module_file(fileName), (void)0, library, fileName, jitOptions,
                  jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues, numLibraryOptions)}

/* Unloads free function handles the driver may hand out again: cached layouts become stale. */
GC_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
    __typeof__(&cuModuleUnload) fn = GC_REAL(cuModuleUnload);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r = fn(hmod);
    gc_layout_invalidate();
    if (r == CUDA_SUCCESS)
        gc_cow_module_gone(hmod);
    gc_gate_leave();
    return r;
}
GC_EXPORT CUresult cuLibraryUnload(CUlibrary library) {
    __typeof__(&cuLibraryUnload) fn = GC_REAL(cuLibraryUnload);
    if (!fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    gc_gate_enter();
    CUresult r = fn(library);
    gc_layout_invalidate();
    if (r == CUDA_SUCCESS)
        gc_cow_module_gone(library);
    gc_gate_leave();
    return r;
}

/* ---- streams, events ---- */

#define CREATE_BODY(name, stat, ...)                                                                                   \
    __typeof__(&name) fn = GC_REAL(name);                                                                              \
    if (!fn)                                                                                                           \
        return CUDA_ERROR_NOT_SUPPORTED;                                                                               \
    gc_gate_enter();                                                                                                   \
    CUresult r = fn(__VA_ARGS__);                                                                                      \
    if (r == CUDA_SUCCESS)                                                                                             \
        gc_stat_add(stat, 1);                                                                                          \
    gc_gate_leave();                                                                                                   \
    return r;

GC_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags){
    CREATE_BODY(cuStreamCreate, STAT_STREAMS, phStream, Flags)} GC_EXPORT CUresult
    cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority){
        CREATE_BODY(cuStreamCreateWithPriority, STAT_STREAMS, phStream, flags, priority)} GC_EXPORT CUresult
    cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    CREATE_BODY(cuEventCreate, STAT_EVENTS, phEvent, Flags)
}

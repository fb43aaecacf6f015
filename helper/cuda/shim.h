/* Glue between Go and the CUDA driver, loaded with dlopen (helper/cuda). */
#ifndef GPUCR_HELPER_CUDA_SHIM_H
#define GPUCR_HELPER_CUDA_SHIM_H
#include <stddef.h>
#include <stdint.h>
#include "gpucr/cudadrv.h"

/* Loads the driver and resolves every entry point; 0, or -1 with err filled. */
int gs_open(const char *path, char *err, size_t errlen);

CUresult gs_cuInit(unsigned int flags);
CUresult gs_cuDriverGetVersion(int *v);
CUresult gs_cuDeviceGetCount(int *n);
CUresult gs_cuDeviceGet(CUdevice *d, int ordinal);
CUresult gs_cuDeviceGetName(char *name, int len, CUdevice d);
CUresult gs_cuDeviceGetPCIBusId(char *bus, int len, CUdevice d);
CUresult gs_cuDeviceGetUuid_v2(CUuuid *u, CUdevice d);
CUresult gs_cuDeviceTotalMem_v2(size_t *bytes, CUdevice d);
CUresult gs_cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d);
CUresult gs_cuDevicePrimaryCtxRelease_v2(CUdevice d);
CUresult gs_cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int f);
CUresult gs_cuCtxSetCurrent(CUcontext ctx);
CUresult gs_cuMemGetInfo_v2(size_t *free_, size_t *total);
/* With a pinned device-memory property for dev, POSIX-fd handles. */
CUresult gs_granularity(size_t *g, int dev);
CUresult gs_create(CUmemGenericAllocationHandle *h, size_t size, int dev, int gpu_direct_rdma, int host);
CUresult gs_export_fd(int *fd, CUmemGenericAllocationHandle h);
CUresult gs_cuMemRelease(CUmemGenericAllocationHandle h);
/* The helper's own mapping of h: reserve (align), map, read/write for dev. */
CUresult gs_map(CUdeviceptr *va, CUmemGenericAllocationHandle h, size_t size, size_t align, int dev);
CUresult gs_unmap(CUdeviceptr va, size_t size);
/* Pinned (page-locked, portable) host memory for staging. */
CUresult gs_host_alloc(void **p, size_t size);
CUresult gs_host_free(void *p);
CUresult gs_stream_create(CUstream *s);
CUresult gs_stream_destroy(CUstream s);
/* A copy on stream s, then waited for. */
CUresult gs_dtoh(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult gs_htod(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult gs_dtoh_async(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult gs_htod_async(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult gs_dtod_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult gs_stream_sync(CUstream s);
/* The driver's checkpoint API on another process. */
CUresult gs_ckpt_state(int pid, int *state);
CUresult gs_ckpt_lock(int pid, unsigned timeout_ms);
CUresult gs_ckpt_checkpoint(int pid);
/* pairs: npairs entries of 16 bytes of old GPU UUID then 16 of new (none: the same GPUs) */
#define GS_MAX_GPU_PAIRS 64
CUresult gs_ckpt_restore(int pid, const unsigned char *pairs, unsigned npairs);
CUresult gs_ckpt_unlock(int pid);
/* gpucr's own kernels (ptx/kernels.ptx), in the current context. */
CUresult gs_module_load(CUmodule *m, const char *ptx);
CUresult gs_module_unload(CUmodule m);
CUresult gs_module_function(CUfunction *f, CUmodule m, const char *name);
CUresult gs_mem_alloc(CUdeviceptr *p, size_t size);
CUresult gs_mem_free(CUdeviceptr p);
CUresult gs_launch3(CUfunction f, unsigned grid, unsigned block, CUstream s, uint64_t a, uint64_t b, uint64_t c);
/* The CUresult's name, or NULL. */
const char *gs_error_name(CUresult r);
#endif

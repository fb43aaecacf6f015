/* Glue between Go and the CUDA driver, loaded with dlopen (helper/cuda). */
#ifndef GPUCR_HELPER_CUDA_SHIM_H
#define GPUCR_HELPER_CUDA_SHIM_H
#include <stddef.h>
#include "gpucr/cudadrv.h"

/* Loads the driver and resolves every entry point; 0, or -1 with err filled. */
int gs_open(const char *path, char *err, size_t errlen);

CUresult gs_cuInit(unsigned int flags);
CUresult gs_cuDriverGetVersion(int *v);
CUresult gs_cuDeviceGetCount(int *n);
CUresult gs_cuDeviceGet(CUdevice *d, int ordinal);
CUresult gs_cuDeviceGetName(char *name, int len, CUdevice d);
CUresult gs_cuDeviceGetUuid_v2(CUuuid *u, CUdevice d);
CUresult gs_cuDeviceTotalMem_v2(size_t *bytes, CUdevice d);
CUresult gs_cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d);
CUresult gs_cuDevicePrimaryCtxRelease_v2(CUdevice d);
CUresult gs_cuCtxSetCurrent(CUcontext ctx);
CUresult gs_cuMemGetInfo_v2(size_t *free_, size_t *total);
/* With a pinned device-memory property for dev, POSIX-fd handles. */
CUresult gs_granularity(size_t *g, int dev);
CUresult gs_create(CUmemGenericAllocationHandle *h, size_t size, int dev);
CUresult gs_export_fd(int *fd, CUmemGenericAllocationHandle h);
CUresult gs_cuMemRelease(CUmemGenericAllocationHandle h);
/* The CUresult's name, or NULL. */
const char *gs_error_name(CUresult r);
#endif

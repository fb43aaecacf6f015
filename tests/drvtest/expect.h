/*
 * What drvtest expects where the driver's documentation is silent or wrong.
 * "Measured" entries were observed on an H100, driver 580.159.04 (CUDA 13.0);
 * the others are still the simulator's guesses, to be confirmed on a GPU. The
 * simulator keeps its own copies next to the code that returns them (e.g.
 * sim_ckpt.c CK_ERR_*, the gate table in sim_core.c): keep both in step.
 */
#ifndef GPUCR_DRVTEST_EXPECT_H
#define GPUCR_DRVTEST_EXPECT_H

/* Measured: cuInit and cuDeviceGetCount in a fork() child of a process that had called cuInit. */
#define EXP_FORK_CHILD_INIT CUDA_ERROR_NOT_INITIALIZED
#define EXP_FORK_CHILD_CALL CUDA_ERROR_NOT_INITIALIZED

/* Measured: cuInit with flags != 0. */
#define EXP_INIT_BAD_FLAGS CUDA_ERROR_INVALID_VALUE

/* Measured: cuDeviceGetAttribute with an attribute number the driver does not know (0, >= 148). */
#define EXP_ATTR_UNKNOWN CUDA_ERROR_INVALID_VALUE

/* Measured: cuDevicePrimaryCtxRelease of a primary context that is not retained. */
#define EXP_PRIMARY_RELEASE_UNRETAINED CUDA_ERROR_INVALID_CONTEXT

/* Measured: cuMemFree(0) succeeds. */
#define EXP_MEMFREE_NULL CUDA_SUCCESS

/* Measured: cuEventElapsedTime with an event that was never recorded, or a NULL result pointer. */
#define EXP_ELAPSED_UNRECORDED CUDA_ERROR_INVALID_HANDLE
#define EXP_ELAPSED_NULL CUDA_ERROR_INVALID_HANDLE

/* Measured: cuModuleLoadData of text that does not start with .version (it is not PTX at all). */
#define EXP_NOT_PTX CUDA_ERROR_INVALID_IMAGE

/* Measured: a packed `extra` parameter buffer longer than the PTX layout (shorter is accepted). */
#define EXP_EXTRA_TOO_LONG CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES

/* Measured, VMM: cuMemMap over a range that is already mapped. */
#define EXP_VMM_MAP_TWICE CUDA_ERROR_INVALID_VALUE
/* Measured, VMM: cuMemMap of anything but a whole allocation (offset 0, its full size). */
#define EXP_VMM_MAP_PAST_HANDLE CUDA_ERROR_NOT_SUPPORTED
/* Measured, VMM: cuMemExportToShareableHandle(POSIX fd) of a handle created without that type. */
#define EXP_VMM_EXPORT_NOT_REQUESTED CUDA_ERROR_INVALID_VALUE
/* Measured, VMM: a copy into memory that is mapped but has no access set yet. */
#define EXP_VMM_COPY_NO_ACCESS CUDA_ERROR_INVALID_VALUE
/* Measured, VMM: cuMemAddressReserve of a size that is not a multiple of the granularity. */
#define EXP_VMM_RESERVE_UNALIGNED CUDA_ERROR_INVALID_VALUE
/* Measured, VMM: cuMemImportFromShareableHandle of an fd that is not exported memory (/dev/null). */
#define EXP_VMM_IMPORT_FOREIGN_FD CUDA_ERROR_UNKNOWN

/* Measured (H200, 580.159.04), VMM: the minimum granularity of host memory (location HOST_NUMA). */
#define EXP_HOST_NUMA_GRANULARITY (2ULL << 20)
/* Measured, VMM: cuMemGetAllocationGranularity does not check the host NUMA node (4096 is accepted). */
#define EXP_HOST_NUMA_BAD_NODE CUDA_SUCCESS
/* Measured, VMM: cuMemSetAccess for a host NUMA node on device memory. */
#define EXP_HOST_ACCESS_TO_DEVICE_MEM CUDA_ERROR_NOT_SUPPORTED
/* Measured, VMM: cuMemExportToShareableHandle(POSIX fd) of an allocation the process imported, in the importing
 * process and in the exporting one: what gpucr's interposer holds of the helper's memory is such an import. */
#define EXP_VMM_REEXPORT_IMPORTED CUDA_ERROR_INVALID_VALUE

/* Measured: the checkpoint API on a pid that does not exist, and on a live process without CUDA. */
#define EXP_CKPT_NO_PROCESS CUDA_ERROR_OPERATING_SYSTEM
#define EXP_CKPT_NO_CUDA CUDA_ERROR_NOT_INITIALIZED
/* Measured: the checkpoint API called, before the caller's own cuInit, on a
 * process that has no CUDA (the runner). The API itself works without cuInit:
 * cudackpt and the anchor's drvckpt never call it, on the GPU too. */
#define EXP_CKPT_BEFORE_INIT CUDA_ERROR_NOT_INITIALIZED
/* Measured: a restore after a failed one (cuda-checkpoint issue #44 reports the same). */
#define EXP_CKPT_RESTORE_AFTER_FAILED CUDA_ERROR_OPERATING_SYSTEM
/* Measured: cuMemGetInfo in a checkpointed process (it does not block, unlike cuMemAlloc). */
#define EXP_CKPT_MEMINFO_CHECKPOINTED CUDA_ERROR_OPERATING_SYSTEM

#endif /* GPUCR_DRVTEST_EXPECT_H */

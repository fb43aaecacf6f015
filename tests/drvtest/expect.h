/*
 * What drvtest expects where the driver's documentation does not say: each of
 * these is the simulator's guess at the real driver's behaviour, to be
 * confirmed (or corrected, here and in tests/sim) by running drvtest on a GPU.
 * The simulator keeps its own copies next to the code that returns them
 * (sim_ckpt.c CK_ERR_*, and the other sources); keep both in step.
 */
#ifndef GPUCR_DRVTEST_EXPECT_H
#define GPUCR_DRVTEST_EXPECT_H

/* cuInit and cuDeviceGetCount in a fork() child of a process that had called cuInit. */
#define EXP_FORK_CHILD_INIT CUDA_ERROR_NOT_INITIALIZED
#define EXP_FORK_CHILD_CALL CUDA_ERROR_NOT_INITIALIZED

/* cuInit with flags != 0. */
#define EXP_INIT_BAD_FLAGS CUDA_ERROR_INVALID_VALUE

/* cuDeviceGetAttribute with an attribute number the driver does not know. */
#define EXP_ATTR_UNKNOWN CUDA_ERROR_INVALID_VALUE

/* cuDevicePrimaryCtxRelease of a primary context that is not retained. */
#define EXP_PRIMARY_RELEASE_UNRETAINED CUDA_ERROR_INVALID_CONTEXT

/* cuMemFree(0). */
#define EXP_MEMFREE_NULL CUDA_ERROR_INVALID_VALUE

/* cuModuleLoadData of a fatbin header followed by garbage. */
#define EXP_FATBIN_GARBAGE CUDA_ERROR_INVALID_IMAGE

/* cuGetProcAddress of an exact versioned ABI name ("cuMemAlloc_v2"). */
#define EXP_GETPROC_VERSIONED_NAME CUDA_SUCCESS

/* cuEventElapsedTime with an event that was never recorded. */
#define EXP_ELAPSED_UNRECORDED CUDA_ERROR_INVALID_HANDLE

/* VMM: cuMemMap over a range that is already mapped. */
#define EXP_VMM_MAP_TWICE CUDA_ERROR_INVALID_VALUE
/* VMM: cuMemExportToShareableHandle(POSIX fd) of a handle created without that type requested. */
#define EXP_VMM_EXPORT_NOT_REQUESTED CUDA_ERROR_INVALID_VALUE
/* VMM: a copy into memory that is mapped but has no access set yet. */
#define EXP_VMM_COPY_NO_ACCESS CUDA_ERROR_INVALID_VALUE
/* VMM: cuMemAddressReserve of a size that is not a multiple of the granularity. */
#define EXP_VMM_RESERVE_UNALIGNED CUDA_ERROR_INVALID_VALUE

/* Checkpoint API on a pid that does not exist, and on a live process without CUDA. */
#define EXP_CKPT_NO_PROCESS CUDA_ERROR_INVALID_VALUE
#define EXP_CKPT_NO_CUDA CUDA_ERROR_INVALID_VALUE
/* Checkpoint API called before the calling process called cuInit. */
#define EXP_CKPT_BEFORE_INIT CUDA_ERROR_NOT_INITIALIZED

#endif /* GPUCR_DRVTEST_EXPECT_H */

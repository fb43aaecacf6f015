/*
 * The CUresult codes' names and texts, as cuGetErrorName and
 * cuGetErrorString answer them: facts of the driver API, shared by the
 * simulated driver (tests/sim) and served mode's library
 * (intercept/served), which both answer these two calls themselves.
 */
#ifndef GPUCR_CUERRORS_H
#define GPUCR_CUERRORS_H

#include <stddef.h>

#include "gpucr/cudadrv.h"

typedef struct {
    CUresult code;
    const char *name, *text;
} gc_error_ent;

/* The entry of r, or NULL for a code the table does not know. */
static inline const gc_error_ent *gc_error_find(CUresult r) {
#define GC_E(code, text)                                                                                               \
    { code, #code, text }
    static const gc_error_ent errs[] = {
        GC_E(CUDA_SUCCESS, "no error"),
        GC_E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
        GC_E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
        GC_E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
        GC_E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
        GC_E(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
        GC_E(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable"),
        GC_E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
        GC_E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
        GC_E(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
        GC_E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
        GC_E(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
        GC_E(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
        GC_E(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"),
        GC_E(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device"),
        GC_E(CUDA_ERROR_NOT_MAPPED, "resource not mapped"),
        GC_E(CUDA_ERROR_UNSUPPORTED_LIMIT, "limit is not supported on this architecture"),
        GC_E(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
        GC_E(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid"),
        GC_E(CUDA_ERROR_FILE_NOT_FOUND, "file not found"),
        GC_E(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
        GC_E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
        GC_E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
        GC_E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
        GC_E(CUDA_ERROR_NOT_READY, "device not ready"),
        GC_E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
        GC_E(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
        GC_E(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped"),
        GC_E(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region"),
        GC_E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
        GC_E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
        GC_E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
        GC_E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
        GC_E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
             "operation would make the legacy stream depend on a capturing blocking stream"),
        GC_E(CUDA_ERROR_TIMEOUT, "the operation timed out"),
        GC_E(CUDA_ERROR_UNKNOWN, "unknown error"),
    };
#undef GC_E
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
        if (errs[i].code == r)
            return &errs[i];
    return NULL;
}

/* cuGetErrorName (name true) or cuGetErrorString: *p is r's name or text; for a code the table does not
 * know, NULL and CUDA_ERROR_INVALID_VALUE, as the driver answers. */
static inline CUresult gc_error_lookup(CUresult r, const char **p, int name) {
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    const gc_error_ent *e = gc_error_find(r);
    *p = e ? (name ? e->name : e->text) : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

#endif

/*
 * Copies and memsets, synchronous and asynchronous.
 *
 * Device ranges are checked when the call is made (the driver's
 * CUDA_ERROR_INVALID_VALUE) and again when the operation runs, since memory can
 * be freed or unmapped in between (then the context faults, as a GPU would).
 *
 * Host memory follows the driver's rules for pageable memory: an async copy
 * from pageable memory takes a snapshot of the source before returning, an
 * async copy into pageable memory returns only when it is done. Page-locked
 * memory (cuMemAllocHost, cuMemHostAlloc, cuMemHostRegister) is read and
 * written when the operation runs, so missing synchronization shows.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sim.h"

enum side { SIDE_DEV, SIDE_HOST, SIDE_ANY };

typedef struct {
    uint64_t dst, src;
    size_t n;
    bool dst_dev, src_dev;
    void *staging;
} copy_pay;

static CUresult run_copy(sim_op *op) {
    copy_pay *c = op->arg;
    pthread_rwlock_rdlock(&sim.memlock);
    bool ok =
        (!c->dst_dev || sim_dev_range_ok(c->dst, c->n, true)) && (!c->src_dev || sim_dev_range_ok(c->src, c->n, false));
    if (ok)
        memmove((void *)(uintptr_t)c->dst, c->staging ? c->staging : (const void *)(uintptr_t)c->src, c->n);
    pthread_rwlock_unlock(&sim.memlock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_ADDRESS;
}

static void fini_copy(sim_op *op) { free(((copy_pay *)op->arg)->staging); }

/* Classifies and checks one side of a copy; memlock held. */
static CUresult check_side(uint64_t p, size_t n, enum side want, bool write, bool *is_dev) {
    bool dev = want == SIDE_DEV || sim_is_device_va(p);
    *is_dev = dev;
    if (dev)
        return sim_dev_range_ok(p, n, write) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult do_copy(sim_call *c, uint64_t dst, enum side dside, uint64_t src, enum side sside, size_t n, CUstream h,
                        bool async) {
    if (n == 0)
        return CUDA_SUCCESS;
    copy_pay pay = {.dst = dst, .src = src, .n = n};
    pthread_rwlock_rdlock(&sim.memlock);
    CUresult r = check_side(dst, n, dside, true, &pay.dst_dev);
    if (r == CUDA_SUCCESS)
        r = check_side(src, n, sside, false, &pay.src_dev);
    bool src_pageable = !pay.src_dev && !sim_host_is_pinned((void *)(uintptr_t)src, n);
    bool dst_pageable = !pay.dst_dev && !sim_host_is_pinned((void *)(uintptr_t)dst, n);
    pthread_rwlock_unlock(&sim.memlock);
    if (r != CUDA_SUCCESS)
        return r;
    sim_op *op = sim_op_new(sizeof pay, run_copy);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->fini = fini_copy;
    if (async && src_pageable) {
        pay.staging = malloc(n);
        if (!pay.staging) {
            sim_op_put(op);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(pay.staging, (const void *)(uintptr_t)src, n);
    }
    memcpy(op->arg, &pay, sizeof pay);
    r = sim_submit(c->ctx, async ? h : NULL, op);
    if (r == CUDA_SUCCESS && (!async || dst_pageable))
        r = sim_op_wait(op);
    sim_op_put(op);
    return r;
}

#define COPY_ENTRY(NAME, DST, DSIDE, SRC, SSIDE, ASYNC, STREAM, ...)                                                   \
    SIM_API CUresult NAME(__VA_ARGS__) {                                                                               \
        sim_call c;                                                                                                    \
        CUresult r = sim_enter(&c, #NAME, SIM_NEED_CTX);                                                               \
        if (r == CUDA_SUCCESS)                                                                                         \
            r = do_copy(&c, (uint64_t)(uintptr_t)(DST), DSIDE, (uint64_t)(uintptr_t)(SRC), SSIDE, ByteCount, STREAM,   \
                        ASYNC);                                                                                        \
        return sim_leave(&c, r);                                                                                       \
    }

COPY_ENTRY(cuMemcpyHtoD_v2, dstDevice, SIDE_DEV, srcHost, SIDE_HOST, false, NULL, CUdeviceptr dstDevice,
           const void *srcHost, size_t ByteCount)
COPY_ENTRY(cuMemcpyDtoH_v2, dstHost, SIDE_HOST, srcDevice, SIDE_DEV, false, NULL, void *dstHost, CUdeviceptr srcDevice,
           size_t ByteCount)
COPY_ENTRY(cuMemcpyDtoD_v2, dstDevice, SIDE_DEV, srcDevice, SIDE_DEV, false, NULL, CUdeviceptr dstDevice,
           CUdeviceptr srcDevice, size_t ByteCount)
COPY_ENTRY(cuMemcpyHtoDAsync_v2, dstDevice, SIDE_DEV, srcHost, SIDE_HOST, true, hStream, CUdeviceptr dstDevice,
           const void *srcHost, size_t ByteCount, CUstream hStream)
COPY_ENTRY(cuMemcpyDtoHAsync_v2, dstHost, SIDE_HOST, srcDevice, SIDE_DEV, true, hStream, void *dstHost,
           CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
COPY_ENTRY(cuMemcpyDtoDAsync_v2, dstDevice, SIDE_DEV, srcDevice, SIDE_DEV, true, hStream, CUdeviceptr dstDevice,
           CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
/* unified addressing: the direction follows from where the pointers are */
COPY_ENTRY(cuMemcpy, dst, SIDE_ANY, src, SIDE_ANY, false, NULL, CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
COPY_ENTRY(cuMemcpyAsync, dst, SIDE_ANY, src, SIDE_ANY, true, hStream, CUdeviceptr dst, CUdeviceptr src,
           size_t ByteCount, CUstream hStream)

/* ---- memsets ---- */

typedef struct {
    uint64_t dst;
    size_t n; /* elements */
    unsigned elem;
    uint32_t val;
} set_pay;

static CUresult run_set(sim_op *op) {
    set_pay *s = op->arg;
    pthread_rwlock_rdlock(&sim.memlock);
    bool ok = sim_dev_range_ok(s->dst, (uint64_t)s->n * s->elem, true);
    if (ok) {
        if (s->elem == 1) {
            memset((void *)(uintptr_t)s->dst, (int)s->val, s->n);
        } else if (s->elem == 2) {
            uint16_t *p = (uint16_t *)(uintptr_t)s->dst;
            for (size_t i = 0; i < s->n; i++)
                p[i] = (uint16_t)s->val;
        } else {
            uint32_t *p = (uint32_t *)(uintptr_t)s->dst;
            for (size_t i = 0; i < s->n; i++)
                p[i] = s->val;
        }
    }
    pthread_rwlock_unlock(&sim.memlock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_ADDRESS;
}

static CUresult do_set(sim_call *c, CUdeviceptr dst, uint32_t val, size_t n, unsigned elem, CUstream h, bool async) {
    if (dst % elem)
        return CUDA_ERROR_INVALID_VALUE;
    if (n == 0)
        return CUDA_SUCCESS;
    if (n > SIZE_MAX / elem)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&sim.memlock);
    bool ok = sim_dev_range_ok(dst, (uint64_t)n * elem, true);
    pthread_rwlock_unlock(&sim.memlock);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    sim_op *op = sim_op_new(sizeof(set_pay), run_set);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(set_pay *)op->arg = (set_pay){dst, n, elem, val};
    CUresult r = sim_submit(c->ctx, async ? h : NULL, op);
    if (r == CUDA_SUCCESS && !async)
        r = sim_op_wait(op);
    sim_op_put(op);
    return r;
}

#define SET_ENTRY(NAME, T, ELEM, ASYNC, STREAM, ...)                                                                   \
    SIM_API CUresult NAME(__VA_ARGS__) {                                                                               \
        sim_call c;                                                                                                    \
        CUresult r = sim_enter(&c, #NAME, SIM_NEED_CTX);                                                               \
        if (r == CUDA_SUCCESS)                                                                                         \
            r = do_set(&c, dstDevice, (uint32_t)(T)v, N, ELEM, STREAM, ASYNC);                                         \
        return sim_leave(&c, r);                                                                                       \
    }

SET_ENTRY(cuMemsetD8_v2, unsigned char, 1, false, NULL, CUdeviceptr dstDevice, unsigned char v, size_t N)
SET_ENTRY(cuMemsetD16_v2, unsigned short, 2, false, NULL, CUdeviceptr dstDevice, unsigned short v, size_t N)
SET_ENTRY(cuMemsetD32_v2, unsigned int, 4, false, NULL, CUdeviceptr dstDevice, unsigned int v, size_t N)
SET_ENTRY(cuMemsetD8Async, unsigned char, 1, true, hStream, CUdeviceptr dstDevice, unsigned char v, size_t N,
          CUstream hStream)
SET_ENTRY(cuMemsetD16Async, unsigned short, 2, true, hStream, CUdeviceptr dstDevice, unsigned short v, size_t N,
          CUstream hStream)
SET_ENTRY(cuMemsetD32Async, unsigned int, 4, true, hStream, CUdeviceptr dstDevice, unsigned int v, size_t N,
          CUstream hStream)

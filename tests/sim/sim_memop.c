/*
 * Stream memory operations: a 32- or 64-bit value written, or waited for, by
 * the GPU in stream order (NCCL's proxy flags). Their address is device
 * memory or host memory that the devices may access (cuMem host allocations,
 * page-locked host memory registered for the device); the range is checked
 * when the call is made and again when the operation runs.
 *
 * A wait polls the value on the stream's worker, so the operations after it
 * on that stream wait too, and a stream blocked by a wait that is never
 * satisfied blocks a checkpoint's drain, as on a GPU. It gives up only when
 * its context goes away.
 */
#include <time.h>

#include "sim.h"

typedef struct {
    uint64_t addr, value;
    unsigned flags;
    int bits; /* 32 or 64 */
    bool wait;
    sim_ctx *ctx;
} memop_pay;

static uint64_t load(const memop_pay *m) {
    if (m->bits == 32)
        return __atomic_load_n((const uint32_t *)(uintptr_t)m->addr, __ATOMIC_ACQUIRE);
    return __atomic_load_n((const uint64_t *)(uintptr_t)m->addr, __ATOMIC_ACQUIRE);
}

static bool satisfied(const memop_pay *m, uint64_t v) {
    uint64_t want = m->value;
    if (m->bits == 32) {
        v = (uint32_t)v;
        want = (uint32_t)want;
    }
    switch (m->flags & 0x3u) {
    case CU_STREAM_WAIT_VALUE_GEQ:
        /* compared as a cyclic difference, as the driver documents for GEQ */
        return m->bits == 32 ? (int32_t)((uint32_t)v - (uint32_t)want) >= 0 : (int64_t)(v - want) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return v == want;
    case CU_STREAM_WAIT_VALUE_AND: return (v & want) != 0;
    default: return m->bits == 32 ? (uint32_t) ~(v | want) != 0 : ~(v | want) != 0; /* NOR */
    }
}

/* The value's range may be accessed: device memory the caller may use, or host memory of any kind. */
static bool range_ok(uint64_t addr, int bits, bool write) {
    pthread_rwlock_rdlock(&sim.memlock);
    bool ok = sim_is_device_va(addr) ? sim_dev_range_ok(addr, (uint64_t)bits / 8, write) : addr != 0;
    pthread_rwlock_unlock(&sim.memlock);
    return ok;
}

static CUresult run_memop(sim_op *op) {
    memop_pay *m = op->arg;
    if (!m->wait) {
        pthread_rwlock_rdlock(&sim.memlock);
        bool ok = !sim_is_device_va(m->addr) || sim_dev_range_ok(m->addr, (uint64_t)m->bits / 8, true);
        if (ok) {
            if (m->bits == 32)
                __atomic_store_n((uint32_t *)(uintptr_t)m->addr, (uint32_t)m->value, __ATOMIC_RELEASE);
            else
                __atomic_store_n((uint64_t *)(uintptr_t)m->addr, m->value, __ATOMIC_RELEASE);
        }
        pthread_rwlock_unlock(&sim.memlock);
        return ok ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    struct timespec nap = {0, 20000};
    while (atomic_load(&m->ctx->alive) && !atomic_load(&m->ctx->sticky)) {
        pthread_rwlock_rdlock(&sim.memlock);
        bool ok = !sim_is_device_va(m->addr) || sim_dev_range_ok(m->addr, (uint64_t)m->bits / 8, false);
        bool done = ok && satisfied(m, load(m));
        pthread_rwlock_unlock(&sim.memlock);
        if (!ok)
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        if (done)
            return CUDA_SUCCESS;
        nanosleep(&nap, NULL);
        if (nap.tv_nsec < 1000000)
            nap.tv_nsec *= 2;
    }
    return CUDA_SUCCESS;
}

static CUresult memop(const char *name, CUstream stream, CUdeviceptr addr, uint64_t value, unsigned flags, int bits,
                      bool wait) {
    sim_call c;
    CUresult r = sim_enter(&c, name, SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    unsigned known = wait ? 0x3u | CU_STREAM_WAIT_VALUE_FLUSH : CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER;
    if (addr % (unsigned)(bits / 8) || (flags & ~known) || !range_ok(addr, bits, !wait))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_op *op = sim_op_new(sizeof(memop_pay), run_memop);
    if (!op)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    *(memop_pay *)op->arg = (memop_pay){addr, value, flags, bits, wait, c.ctx};
    r = sim_submit(c.ctx, stream, op);
    sim_op_put(op);
    return sim_leave(&c, r);
}

SIM_API CUresult cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
    return memop("cuStreamWriteValue32_v2", stream, addr, value, flags, 32, false);
}

SIM_API CUresult cuStreamWriteValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
    return memop("cuStreamWriteValue64_v2", stream, addr, value, flags, 64, false);
}

SIM_API CUresult cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
    return memop("cuStreamWaitValue32_v2", stream, addr, value, flags, 32, true);
}

SIM_API CUresult cuStreamWaitValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
    return memop("cuStreamWaitValue64_v2", stream, addr, value, flags, 64, true);
}

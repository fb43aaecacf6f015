/*
 * Simulated versions of drvtest's kernels (their PTX is in tests/drvtest/ptx.c).
 * dt_noimpl deliberately has none: drvtest checks what a launch of it does.
 */
#include <string.h>
#include <time.h>

#include "simk.h"

static CUresult dt_fill(const simk_launch *L) {
    CUdeviceptr p = SIMK_PARAM(L, 0, CUdeviceptr);
    uint32_t v = SIMK_PARAM(L, 1, uint32_t);
    uint32_t n = SIMK_PARAM(L, 2, uint32_t);
    uint64_t m = simk_threads(L) < n ? simk_threads(L) : n;
    uint32_t *d = simk_dev(L, p, m * 4);
    if (!d)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (uint64_t i = 0; i < m; i++)
        d[i] = v;
    return CUDA_SUCCESS;
}
SIMK_REGISTER("dt_fill", dt_fill);

static CUresult dt_add(const simk_launch *L) {
    CUdeviceptr p = SIMK_PARAM(L, 0, CUdeviceptr);
    uint32_t n = SIMK_PARAM(L, 1, uint32_t);
    uint32_t add = SIMK_PARAM(L, 2, uint32_t);
    uint64_t m = simk_threads(L) < n ? simk_threads(L) : n;
    uint32_t *d = simk_dev(L, p, m * 4);
    if (!d)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (uint64_t i = 0; i < m; i++)
        d[i] += add;
    return CUDA_SUCCESS;
}
SIMK_REGISTER("dt_add", dt_add);

/* Waits delay_ns, then thread 0 stores value: a kernel that is still running when the host looks. */
static CUresult dt_delay_write(const simk_launch *L) {
    CUdeviceptr p = SIMK_PARAM(L, 0, CUdeviceptr);
    uint64_t ns = SIMK_PARAM(L, 1, uint64_t);
    uint32_t v = SIMK_PARAM(L, 2, uint32_t);
    uint32_t *d = simk_dev(L, p, 4);
    if (!d)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    *d = v;
    return CUDA_SUCCESS;
}
SIMK_REGISTER("dt_delay_write", dt_delay_write);

static CUresult dt_echo(const simk_launch *L) {
    unsigned char *o = simk_dev(L, SIMK_PARAM(L, 0, CUdeviceptr), 32);
    if (!o)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    uint64_t d = SIMK_PARAM(L, 4, uint64_t);
    uint32_t c = SIMK_PARAM(L, 3, uint32_t);
    uint16_t b = SIMK_PARAM(L, 2, uint16_t);
    uint8_t a = SIMK_PARAM(L, 1, uint8_t);
    float e = SIMK_PARAM(L, 6, float);
    memcpy(o, &d, 8);
    memcpy(o + 8, &c, 4);
    memcpy(o + 12, &b, 2);
    o[14] = a;
    memcpy(o + 16, L->params + L->param_offset[5], 12);
    memcpy(o + 28, &e, 4);
    return CUDA_SUCCESS;
}
SIMK_REGISTER("dt_echo", dt_echo);

/* Stores through whatever pointer it is given: a bad one is the GPU's illegal address. */
static CUresult dt_store(const simk_launch *L) {
    uint32_t *d = simk_dev(L, SIMK_PARAM(L, 0, CUdeviceptr), 4);
    if (!d)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    *d = 1;
    return CUDA_SUCCESS;
}
SIMK_REGISTER("dt_store", dt_store);

static CUresult dt_params(const simk_launch *L) {
    (void)L;
    return CUDA_SUCCESS;
}
SIMK_REGISTER("dt_params", dt_params);

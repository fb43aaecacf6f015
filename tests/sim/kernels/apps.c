/*
 * The simulated driver's versions of the test applications' kernels
 * (tests/apps/heartbeat.c, ptrchase.c, vmmapp.c). Each computes exactly what
 * the PTX of the same entry computes, for the whole grid: the PTX kernels are
 * grid-stride loops in which every element is read and written by one thread
 * only, so looping over the elements here gives the same bits whatever the
 * grid. All arithmetic is on uint32_t, wrapping as the GPU's u32 does.
 *
 * Parameters are read at the offsets the PTX declares (SIMK_PARAM); every
 * device range goes through simk_dev(), and a range it refuses makes the
 * launch fail with CUDA_ERROR_ILLEGAL_ADDRESS, as a GPU fault would.
 */
#include <stdint.h>
#include <time.h>

#include "../../apps/common/gpuapp.h" /* gpuapp_mix32: the finalizer the PTX spells out */
#include "simk.h"

#define mix32 gpuapp_mix32

/* init: p[j] = mix32(j * 0x9E3779B1 + seed) */
static inline void fill_init(uint32_t *p, uint32_t n, uint32_t seed) {
    for (uint32_t j = 0; j < n; j++)
        p[j] = mix32(j * 0x9E3779B1u + seed);
}

/* step: k = iter * 0x9E3779B1 + salt; v = (p[j] ^ k) * 0x01000193; v ^= v >> 13; p[j] = v + ((j << 3) ^ k) */
static inline void fill_step(uint32_t *p, uint32_t n, uint32_t iter, uint32_t salt) {
    uint32_t k = iter * 0x9E3779B1u + salt;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t v = (p[j] ^ k) * 0x01000193u;
        v ^= v >> 13;
        p[j] = v + ((j << 3) ^ k);
    }
}

/* A u32 array of n words at device address a, or NULL (n == 0 touches nothing). */
static uint32_t *words(const simk_launch *L, CUdeviceptr a, uint32_t n, int *bad) {
    static uint32_t none;
    if (n == 0)
        return &none;
    uint32_t *p = simk_dev(L, a, (size_t)n * 4);
    if (!p)
        *bad = 1;
    return p;
}

/* ---- heartbeat --------------------------------------------------------- */

/* app_hb_init(u64 buf, u32 n, u32 seed) */
static CUresult app_hb_init(const simk_launch *L) {
    CUdeviceptr a = SIMK_PARAM(L, 0, CUdeviceptr);
    uint32_t n = SIMK_PARAM(L, 1, uint32_t), seed = SIMK_PARAM(L, 2, uint32_t);
    int bad = 0;
    uint32_t *p = words(L, a, n, &bad);
    if (bad)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    fill_init(p, n, seed);
    return CUDA_SUCCESS;
}
SIMK_REGISTER("app_hb_init", app_hb_init);

/* app_hb_step(u64 buf, u32 n, u32 iter, u32 salt) */
static CUresult app_hb_step(const simk_launch *L) {
    CUdeviceptr a = SIMK_PARAM(L, 0, CUdeviceptr);
    uint32_t n = SIMK_PARAM(L, 1, uint32_t), iter = SIMK_PARAM(L, 2, uint32_t);
    uint32_t salt = SIMK_PARAM(L, 3, uint32_t);
    int bad = 0;
    uint32_t *p = words(L, a, n, &bad);
    if (bad)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    fill_step(p, n, iter, salt);
    return CUDA_SUCCESS;
}
SIMK_REGISTER("app_hb_step", app_hb_step);

/*
 * app_hb_mix(u64 dst, u64 src, u32 count, u32 nsrc, u32 iter), j < count:
 *   dst[j] = (dst[j] ^ src[(j * 13 + iter) % nsrc]) + (j ^ iter)
 * The PTX reads only the src words it indexes; the whole src range [0, nsrc)
 * is checked here, which is what the application passes.
 */
static CUresult app_hb_mix(const simk_launch *L) {
    CUdeviceptr da = SIMK_PARAM(L, 0, CUdeviceptr), sa = SIMK_PARAM(L, 1, CUdeviceptr);
    uint32_t count = SIMK_PARAM(L, 2, uint32_t), nsrc = SIMK_PARAM(L, 3, uint32_t);
    uint32_t iter = SIMK_PARAM(L, 4, uint32_t);
    if (count == 0)
        return CUDA_SUCCESS;
    if (nsrc == 0)
        return CUDA_ERROR_INVALID_VALUE; /* rem.u32 by zero: undefined on the GPU */
    int bad = 0;
    uint32_t *dst = words(L, da, count, &bad), *src = words(L, sa, nsrc, &bad);
    if (bad)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (uint32_t j = 0; j < count; j++)
        dst[j] = (dst[j] ^ src[(j * 13u + iter) % nsrc]) + (j ^ iter);
    return CUDA_SUCCESS;
}
SIMK_REGISTER("app_hb_mix", app_hb_mix);

/* ---- ptrchase ---------------------------------------------------------- */

/* A table entry as the kernels read it: u64 ptr, u32 nwords, u32 salt. */
typedef struct pc_entry {
    uint64_t ptr;
    uint32_t nwords;
    uint32_t salt;
} pc_entry;

/*
 * Walks the table like the PTX does: for each entry b < nent, the pointer is
 * loaded from device memory and the nwords words it points to are updated.
 * init: p[j] = mix32(j * 0x9E3779B1 + (x ^ salt)); otherwise the step with
 * iteration x.
 */
static CUresult pc_walk(const simk_launch *L, int init) {
    CUdeviceptr ta = SIMK_PARAM(L, 0, CUdeviceptr);
    uint32_t nent = SIMK_PARAM(L, 1, uint32_t), x = SIMK_PARAM(L, 2, uint32_t);
    if (nent == 0)
        return CUDA_SUCCESS;
    const pc_entry *t = simk_dev(L, ta, (size_t)nent * sizeof(pc_entry));
    if (!t)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (uint32_t b = 0; b < nent; b++) {
        pc_entry e = t[b];
        int bad = 0;
        uint32_t *p = words(L, (CUdeviceptr)e.ptr, e.nwords, &bad);
        if (bad)
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        if (init)
            fill_init(p, e.nwords, x ^ e.salt);
        else
            fill_step(p, e.nwords, x, e.salt);
    }
    return CUDA_SUCCESS;
}

/* app_pc_init(u64 table, u32 nent, u32 seed) */
static CUresult app_pc_init(const simk_launch *L) { return pc_walk(L, 1); }
SIMK_REGISTER("app_pc_init", app_pc_init);

/* app_pc_step(u64 table, u32 nent, u32 iter) */
static CUresult app_pc_step(const simk_launch *L) { return pc_walk(L, 0); }
SIMK_REGISTER("app_pc_step", app_pc_step);

/* ---- vmmapp ------------------------------------------------------------ */

/* app_vm_init(u64 p, u32 n, u32 seed): as app_hb_init. */
static CUresult app_vm_init(const simk_launch *L) { return app_hb_init(L); }
SIMK_REGISTER("app_vm_init", app_vm_init);

/* app_vm_step(u64 p, u32 n, u32 iter, u32 salt): as app_hb_step. */
static CUresult app_vm_step(const simk_launch *L) { return app_hb_step(L); }
SIMK_REGISTER("app_vm_step", app_vm_step);

/*
 * app_vm_fold(u64 dst, u64 src, u32 count, u32 iter), j < count:
 *   dst[j] = dst[j] + (src[j] ^ (iter * 0x9E3779B1)) * 0x2545F491
 */
static CUresult app_vm_fold(const simk_launch *L) {
    CUdeviceptr da = SIMK_PARAM(L, 0, CUdeviceptr), sa = SIMK_PARAM(L, 1, CUdeviceptr);
    uint32_t count = SIMK_PARAM(L, 2, uint32_t), iter = SIMK_PARAM(L, 3, uint32_t);
    int bad = 0;
    uint32_t *dst = words(L, da, count, &bad), *src = words(L, sa, count, &bad);
    if (bad)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    uint32_t k = iter * 0x9E3779B1u;
    for (uint32_t j = 0; j < count; j++)
        dst[j] = dst[j] + (src[j] ^ k) * 0x2545F491u;
    return CUDA_SUCCESS;
}
SIMK_REGISTER("app_vm_fold", app_vm_fold);

/* ---- launchbench: empty kernels, only the launch is measured ---------- */

static CUresult app_lb_nothing(const simk_launch *L) {
    (void)L;
    return CUDA_SUCCESS;
}
SIMK_REGISTER("lb_small", app_lb_nothing);
SIMK_REGISTER("lb_big", app_lb_nothing);

/* ---- gaterace: gr_add(p, n): p[i] += 1 ---------------------------------- */

static CUresult app_gr_add(const simk_launch *L) {
    CUdeviceptr p = SIMK_PARAM(L, 0, CUdeviceptr);
    uint32_t n = SIMK_PARAM(L, 1, uint32_t);
    uint64_t m = simk_threads(L) < n ? simk_threads(L) : n;
    uint32_t *d = simk_dev(L, p, m * 4);
    if (!d)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (uint64_t i = 0; i < m; i++)
        d[i] += 1;
    return CUDA_SUCCESS;
}
SIMK_REGISTER("gr_add", app_gr_add);

/* ---- netrank ----------------------------------------------------------- */

/* ncclDevKernel_netrank_SendRecv(u64 buf, u32 n, u32 *iter, u64 out, u64 in, u32 x): iter, out and in are host
 * memory reached by their unified addresses, as NCCL's kernels reach its proxy's: the iteration, and two boxes (a
 * u32 flag, 16 bytes, then x words). It spins, as NCCL's kernels do, until the proxy has brought the peer's
 * words. */
static CUresult app_nr_sendrecv(const simk_launch *L) {
    CUdeviceptr a = SIMK_PARAM(L, 0, CUdeviceptr);
    uint32_t n = SIMK_PARAM(L, 1, uint32_t);
    const uint32_t *iterp = (const uint32_t *)(uintptr_t)SIMK_PARAM(L, 2, uint64_t);
    unsigned char *out = (unsigned char *)(uintptr_t)SIMK_PARAM(L, 3, uint64_t);
    unsigned char *in = (unsigned char *)(uintptr_t)SIMK_PARAM(L, 4, uint64_t);
    uint32_t x = SIMK_PARAM(L, 5, uint32_t);
    int bad = 0;
    uint32_t *p = words(L, a, n, &bad);
    if (bad || x > n || !out || !in || !iterp)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    uint32_t iter = __atomic_load_n(iterp, __ATOMIC_ACQUIRE);
    fill_step(p, n, iter, 0);
    uint32_t *od = (uint32_t *)(void *)(out + 16), *id = (uint32_t *)(void *)(in + 16);
    for (uint32_t j = 0; j < x; j++)
        od[j] = p[j];
    __atomic_store_n((uint32_t *)(void *)out, iter, __ATOMIC_RELEASE);
    while (__atomic_load_n((uint32_t *)(void *)in, __ATOMIC_ACQUIRE) < iter) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    for (uint32_t j = 0; j < x; j++)
        p[j] ^= id[(j + iter) % x];
    return CUDA_SUCCESS;
}
SIMK_REGISTER("_Z30ncclDevKernel_netrank_SendRecvyjPjyyj", app_nr_sendrecv);

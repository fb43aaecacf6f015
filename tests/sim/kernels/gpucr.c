/*
 * The simulated driver's versions of gpucr's own kernels (ptx/kernels.ptx):
 * gpucr_chunk_hash and gpucr_compare, computing the same bits as the PTX.
 * The chunk hash is defined in ptx/chunkhash.go; this is a third spelling
 * of it, checked against the Go one in CI (ptx and helper/cuda tests) and
 * the PTX against both on a GPU (tests/gpu/ptx-check.py).
 *
 * A launch the PTX would trap on (a block of other than 256 threads,
 * misaligned addresses) fails the same way here:
 * CUDA_ERROR_LAUNCH_FAILED, which the simulator makes sticky as the driver
 * does.
 */
#include <stdint.h>
#include <string.h>

#include "simk.h"

enum { LANES = 256 };

#define K1 0x9E3779B185EBCA87ull
#define K2 0xC2B2AE3D27D4EB4Full
#define K3 0x165667B19E3779F9ull
#define K4 0x85EBCA77C2B2AE63ull
#define K5 0x27D4EB2F165667C5ull
#define M1 0xFF51AFD7ED558CCDull
#define M2 0xC4CEB9FE1A85EC53ull

static inline uint64_t rotl(uint64_t x, unsigned r) { return (x << r) | (x >> (64 - r)); }

typedef struct {
    uint64_t a, b;
} lane;

static inline void lane_in(lane *s, uint64_t v) {
    s->a = rotl(s->a + v * K2, 31) * K1;
    s->b = rotl(s->b ^ v * K4, 27) * K3;
}

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the words are read as little-endian u64, as on the GPU");

static inline uint64_t le64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t fmix(uint64_t x) {
    x ^= x >> 33;
    x *= M1;
    x ^= x >> 33;
    x *= M2;
    x ^= x >> 33;
    return x;
}

/* The chunk hash of p[0..n): out[0] the high half, out[1] the low. */
static void chunk_hash(const unsigned char *p, uint64_t n, uint64_t out[2]) {
    lane s[LANES];
    for (uint64_t l = 0; l < LANES; l++) {
        s[l].a = K5 + l * K1;
        s[l].b = K4 ^ l * K2;
    }
    uint64_t full = n / 16;
    /* a row of LANES words at a time: word j goes to lane j % LANES */
    for (uint64_t row = 0; row < full; row += LANES) {
        uint64_t m = full - row < LANES ? full - row : LANES;
        const unsigned char *w = p + 16 * row;
        for (uint64_t l = 0; l < m; l++) {
            lane_in(&s[l], le64(w + 16 * l));
            lane_in(&s[l], le64(w + 16 * l + 8));
        }
    }
    if (n % 16) {
        unsigned char pad[16] = {0};
        memcpy(pad, p + 16 * full, n % 16);
        lane *t = &s[full % LANES];
        lane_in(t, le64(pad));
        lane_in(t, le64(pad + 8));
    }
    lane h = {K3, K5};
    for (int l = 0; l < LANES; l++) {
        h.a = rotl(h.a + s[l].a * K2, 31) * K1;
        h.b = rotl(h.b ^ s[l].b * K4, 27) * K3;
    }
    lane_in(&h, n);
    out[0] = fmix(h.a + rotl(h.b, 32));
    out[1] = fmix(h.b ^ rotl(h.a, 23) ^ n);
}

/* gpucr_chunk_hash(u64 table, u64 count, u64 out): table holds count
 * {address, length} pairs of u64, one per chunk. */
static CUresult k_chunk_hash(const simk_launch *L) {
    CUdeviceptr table = SIMK_PARAM(L, 0, uint64_t);
    uint64_t count = SIMK_PARAM(L, 1, uint64_t);
    CUdeviceptr out = SIMK_PARAM(L, 2, uint64_t);
    if (L->block.x != LANES || L->block.y != 1 || L->block.z != 1 || (table | out) % 8)
        return CUDA_ERROR_LAUNCH_FAILED;
    /* blockIdx.x only: the PTX reads %ctaid.x, so blocks with y or z beyond
     * 0 redo (and rewrite) the same chunks */
    uint64_t blocks = L->grid.x;
    for (uint64_t i = 0; i < blocks && i < count; i++) {
        const uint64_t *e = simk_dev(L, table + 16 * i, 16);
        if (!e)
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        uint64_t addr = e[0], n = e[1];
        if (addr % 16)
            return CUDA_ERROR_LAUNCH_FAILED;
        const unsigned char *p = simk_dev(L, addr, n);
        uint64_t *o = simk_dev(L, out + 16 * i, 16);
        if (!p || !o)
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        chunk_hash(p, n, o);
    }
    return CUDA_SUCCESS;
}
SIMK_REGISTER("gpucr_chunk_hash", k_chunk_hash);

/* gpucr_compare(u64 a, u64 b, u64 n, u64 out) */
static CUresult k_compare(const simk_launch *L) {
    CUdeviceptr a = SIMK_PARAM(L, 0, uint64_t);
    CUdeviceptr b = SIMK_PARAM(L, 1, uint64_t);
    uint64_t n = SIMK_PARAM(L, 2, uint64_t);
    CUdeviceptr out = SIMK_PARAM(L, 3, uint64_t);
    if ((a | b) % 16 || out % 4)
        return CUDA_ERROR_LAUNCH_FAILED;
    const void *pa = simk_dev(L, a, n), *pb = simk_dev(L, b, n);
    if (!pa || !pb)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (memcmp(pa, pb, n) != 0) {
        uint32_t *o = simk_dev(L, out, 4);
        if (!o)
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        *o = 1;
    }
    return CUDA_SUCCESS;
}
SIMK_REGISTER("gpucr_compare", k_compare);

/*
 * How kernels are written for gpucr's simulated CUDA driver.
 *
 * On a real GPU a kernel is PTX; in the simulation the same entry name maps to
 * a C function that does what the PTX does, for the whole grid, on the host.
 * The PTX handed to cuModuleLoadData / cuLibraryLoadData is still parsed: it
 * decides which entries a module has and the layout of their parameters, so
 * cuFuncGetParamInfo and packed (`extra`) launches behave as on the driver.
 *
 * A kernel file lives in tests/sim/kernels/ and registers its functions:
 *
 *   static CUresult add_one(const simk_launch *L) {
 *       CUdeviceptr p = SIMK_PARAM(L, 0, CUdeviceptr);
 *       uint32_t n = SIMK_PARAM(L, 1, uint32_t);
 *       uint32_t *d = simk_dev(L, p, (size_t)n * 4);
 *       if (!d) return CUDA_ERROR_ILLEGAL_ADDRESS;
 *       for (uint64_t i = 0; i < simk_threads(L) && i < n; i++) d[i] += 1;
 *       return CUDA_SUCCESS;
 *   }
 *   SIMK_REGISTER("add_one", add_one);
 *
 * Device pointers in the simulation are host addresses of memfd-backed
 * mappings, but kernels must go through simk_dev(): it checks that the whole
 * range is mapped, accessible device memory, which is how an out-of-bounds
 * kernel access becomes CUDA_ERROR_ILLEGAL_ADDRESS instead of a crash or a
 * silent write into unrelated memory.
 */
#ifndef GPUCR_SIMK_H
#define GPUCR_SIMK_H

#include <stddef.h>
#include <stdint.h>

#include "gpucr/cudadrv.h"

typedef struct simk_dim3 {
    unsigned int x, y, z;
} simk_dim3;

typedef struct simk_launch {
    simk_dim3 grid;  /* gridDim */
    simk_dim3 block; /* blockDim */
    unsigned int shared_bytes;
    const unsigned char *params; /* packed, in the PTX parameter layout */
    size_t params_size;
    const size_t *param_offset; /* per parameter, from the PTX */
    const size_t *param_size;
    unsigned int nparams;
    void *priv; /* the simulator's launch state; kernels leave it alone */
} simk_launch;

typedef CUresult (*simk_fn)(const simk_launch *L);

/* Parameter i of the launch, read as type T (T's size should equal the PTX's). */
#define SIMK_PARAM(L, i, T) (*(const T *)(const void *)((L)->params + (L)->param_offset[(i)]))

/* Total threads of the launch: grid * block. */
static inline uint64_t simk_threads(const simk_launch *L) {
    return (uint64_t)L->grid.x * L->grid.y * L->grid.z * L->block.x * L->block.y * L->block.z;
}

/*
 * Host view of device memory [p, p+bytes) for a kernel, or NULL if any part of
 * it is not device memory mapped with read-write access in the launching
 * context (the kernel then returns CUDA_ERROR_ILLEGAL_ADDRESS).
 */
void *simk_dev(const simk_launch *L, CUdeviceptr p, size_t bytes);

/* Registers a kernel implementation under its PTX entry name. */
void simk_register(const char *name, simk_fn fn);

#define SIMK_CONCAT_(a, b) a##b
#define SIMK_CONCAT(a, b) SIMK_CONCAT_(a, b)
#define SIMK_REGISTER(name, fn)                                                                                        \
    __attribute__((constructor)) static void SIMK_CONCAT(simk_register_, __LINE__)(void) {                             \
        simk_register((name), (fn));                                                                                   \
    }

#endif /* GPUCR_SIMK_H */

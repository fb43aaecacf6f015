/*
 * Does the driver reserve device addresses where it is asked to? The answer
 * served mode's address window rests on (helper/served/exec.c):
 * cuMemAddressReserve with an address hint, in a range that was free, and
 * in one that a placeholder mapping held until just before.
 *
 *   gcc -O2 -Iinclude -o vahint tests/gpu/served/vahint.c -ldl && ./vahint
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

#include "gpucr/cudadrv.h"

typedef CUresult (*res_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*free_t)(CUdeviceptr, size_t);

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h)
        return 1;
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    CUresult (*get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))dlsym(h, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(CUcontext) = (CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
    res_t reserve = (res_t)dlsym(h, "cuMemAddressReserve");
    free_t afree = (free_t)dlsym(h, "cuMemAddressFree");
    CUdevice d;
    CUcontext c;
    if (init(0) || get(&d, 0) || retain(&c, d) || setcur(c))
        return 2;
    uint64_t hints[] = {0x100000000000ull, 0x100000200000ull, 0x200000000000ull, 0x7e0000000000ull, 0x10000000000ull};
    for (int placeholder = 0; placeholder < 2; placeholder++)
        for (unsigned i = 0; i < sizeof hints / sizeof hints[0]; i++) {
            uint64_t a = hints[i] + (placeholder ? 0x1000000000ull : 0);
            if (placeholder) {
                void *p = mmap((void *)(uintptr_t)a, 2 << 20, PROT_NONE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
                printf("placeholder at %#lx: %p\n", (unsigned long)a, p);
                munmap((void *)(uintptr_t)a, 2 << 20);
            }
            CUdeviceptr got = 0;
            CUresult r = reserve(&got, 2 << 20, 0, a, 0);
            printf("hint %#lx%s: %d got %#llx%s\n", (unsigned long)a, placeholder ? " (after a placeholder)" : "", r,
                   (unsigned long long)got, got == a ? " (honoured)" : "");
            if (r == CUDA_SUCCESS)
                afree(got, 2 << 20);
        }
    /* The driver's own choice, then hints inside what it chose: a big range, freed, then parts of it. */
    CUdeviceptr big = 0;
    CUresult r = reserve(&big, 1ull << 40, 0, 0, 0);
    printf("1 TiB, no hint: %d at %#llx\n", r, (unsigned long long)big);
    if (r == CUDA_SUCCESS) {
        afree(big, 1ull << 40);
        uint64_t offs[] = {0, 1ull << 30, 512ull << 30};
        for (unsigned i = 0; i < 3; i++) {
            CUdeviceptr got = 0, a = big + offs[i];
            r = reserve(&got, 2 << 20, 0, a, 0);
            printf("hint %#llx (inside the 1 TiB the driver gave): %d got %#llx%s\n", (unsigned long long)a, r,
                   (unsigned long long)got, got == a ? " (honoured)" : "");
            if (r == CUDA_SUCCESS)
                afree(got, 2 << 20);
        }
    }
    return 0;
}

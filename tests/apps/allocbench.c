/*
 * allocbench: latency of cuMemAlloc_v2 + cuMemFree_v2, the call pair the
 * interposer turns into helper-owned memory. Run it with and without
 * `gpucr run` in the same call to compare (tests/gpu/bench-interposer.sh).
 *
 *   allocbench [--reps N] [--device D]
 *
 * For each size (4 KiB, 64 KiB, 1 MiB, 2 MiB, 64 MiB, 1 GiB) it allocates and
 * frees N times (first a warm-up pair) and prints
 *
 *   alloc SIZE_BYTES median_alloc_us median_free_us
 *
 * then `live` rounds: N allocations of 4 KiB held at once, then freed
 * (small-allocation slabs), printed as `alloc-live 4096 ALLOC_US FREE_US`.
 * Every allocation is written (cuMemsetD8) and read back once, so an address
 * that does not work fails here rather than later.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuapp.h"

static void touch(CUdeviceptr p, size_t size) {
    unsigned char b = 0;
    CHECK(cuMemsetD8(p, 0x5a, size));
    CHECK(cuMemcpyDtoH(&b, p + size - 1, 1));
    if (b != 0x5a)
        gpuapp_die("allocation 0x%llx+%zu: wrote 0x5a, read 0x%02x", (unsigned long long)p, size, b);
}

int main(int argc, char **argv) {
    int reps = 50, ordinal = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            ordinal = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: allocbench [--reps N] [--device D]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 100000) {
        fprintf(stderr, "allocbench: --reps must be 1..100000\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, ordinal));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    double *ta = calloc((size_t)reps, sizeof(double)), *tf = calloc((size_t)reps, sizeof(double));
    CUdeviceptr *live = calloc((size_t)reps, sizeof(CUdeviceptr));
    if (!ta || !tf || !live)
        gpuapp_die("out of host memory");
    static const size_t sizes[] = {4096, 65536, 1 << 20, 2 << 20, 64 << 20, (size_t)1 << 30};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc(&p, sizes[s])); /* warm-up */
        touch(p, sizes[s]);
        CHECK(cuMemFree(p));
        for (int r = 0; r < reps; r++) {
            double t0 = gpuapp_now_s() * 1e6;
            CHECK(cuMemAlloc(&p, sizes[s]));
            double t1 = gpuapp_now_s() * 1e6;
            if (r == 0)
                touch(p, sizes[s]);
            double t2 = gpuapp_now_s() * 1e6;
            CHECK(cuMemFree(p));
            double t3 = gpuapp_now_s() * 1e6;
            ta[r] = t1 - t0;
            tf[r] = t3 - t2;
        }
        printf("alloc %zu %.1f %.1f\n", sizes[s], gpuapp_median(ta, reps), gpuapp_median(tf, reps));
        fflush(stdout);
    }
    double a0 = gpuapp_now_s() * 1e6;
    for (int r = 0; r < reps; r++)
        CHECK(cuMemAlloc(&live[r], 4096));
    double a1 = gpuapp_now_s() * 1e6;
    for (int r = 0; r < reps; r++)
        touch(live[r], 4096);
    double f0 = gpuapp_now_s() * 1e6;
    for (int r = 0; r < reps; r++)
        CHECK(cuMemFree(live[r]));
    double f1 = gpuapp_now_s() * 1e6;
    printf("alloc-live 4096 %.1f %.1f\n", (a1 - a0) / reps, (f1 - f0) / reps);
    free(ta);
    free(tf);
    free(live);
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}

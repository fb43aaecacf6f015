/*
 * launchbench: CPU cost of a kernel launch, the number the interposer adds
 * to (it looks up the kernel's parameter layout and checks every 8-byte
 * parameter word against its buffer table). Run it with and without
 * `gpucr run` in the same call (tests/gpu/bench-interposer.sh).
 *
 *   launchbench [--launches N] [--device D]
 *
 * Kernels do nothing; what is timed is N asynchronous launches on the
 * legacy stream plus one final synchronize, divided by N:
 *
 *   launch small N US    4 parameters, 3 of them pointers into buffers
 *   launch big N US      one 2 KiB parameter, every word a buffer pointer
 *   launch extra N US    the small kernel, parameters packed in `extra`
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuapp.h"

static const char ptx[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .entry lb_small(.param .u64 lb_a, .param .u64 lb_b, .param .u64 lb_c,"
    " .param .u32 lb_n)\n"
    "{\n"
    "\tret;\n"
    "}\n"
    ".visible .entry lb_big(.param .align 8 .b8 lb_blob[2048])\n"
    "{\n"
    "\tret;\n"
    "}\n";

int main(int argc, char **argv) {
    long n = 20000;
    int ordinal = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--launches") && i + 1 < argc)
            n = atol(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            ordinal = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: launchbench [--launches N] [--device D]\n");
            return 2;
        }
    }
    if (n < 1) {
        fprintf(stderr, "launchbench: --launches must be positive\n");
        return 2;
    }
    gpuapp a = {.ordinal = ordinal};
    gpuapp_context(&a);
    CUmodule mod = gpuapp_load_ptx(ptx);
    CUfunction small = gpuapp_function(mod, "lb_small"), big = gpuapp_function(mod, "lb_big");
    CUdeviceptr buf[3];
    for (int i = 0; i < 3; i++)
        CHECK(cuMemAlloc(&buf[i], (size_t)(4u << 20)));
    unsigned int count = 1024;
    void *sp[] = {&buf[0], &buf[1], &buf[2], &count};
    uint64_t blob[256];
    for (int i = 0; i < 256; i++)
        blob[i] = buf[i % 3] + (uint64_t)i * 64;
    void *bp[] = {blob};
    struct {
        uint64_t a, b, c;
        uint32_t n, pad;
    } packed = {buf[0], buf[1], buf[2], count, 0};
    size_t psize = 28; /* the last parameter ends at 24 + 4 */
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &psize, CU_LAUNCH_PARAM_END};
    const char *names[] = {"small", "big", "extra"};
    for (int k = 0; k < 3; k++) {
        for (int warm = 1; warm >= 0; warm--) {
            long reps = warm ? 100 : n;
            double t0 = gpuapp_now_s();
            for (long r = 0; r < reps; r++) {
                if (k == 0)
                    CHECK(cuLaunchKernel(small, 1, 1, 1, 32, 1, 1, 0, NULL, sp, NULL));
                else if (k == 1)
                    CHECK(cuLaunchKernel(big, 1, 1, 1, 32, 1, 1, 0, NULL, bp, NULL));
                else
                    CHECK(cuLaunchKernel(small, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, extra));
            }
            CHECK(cuCtxSynchronize());
            double t = gpuapp_now_s() - t0;
            if (!warm)
                printf("launch %s %ld %.3f\n", names[k], reps, t / (double)reps * 1e6);
        }
    }
    for (int i = 0; i < 3; i++)
        CHECK(cuMemFree(buf[i]));
    CHECK(cuModuleUnload(mod));
    gpuapp_context_release(&a);
    return 0;
}

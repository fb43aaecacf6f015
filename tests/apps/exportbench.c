/*
 * exportbench: what a POSIX-fd export and import of one cuMemCreate allocation
 * cost, and whether that depends on what else the process holds. The helper
 * pays an export on every allocation it serves; with its allocation pool
 * running (which holds exported fds) the export measured ~60 us, without it
 * ~700 us, also for sizes the pool did not serve. This separates the causes.
 *
 *   exportbench [--reps N] [--device D] [--mib M]
 *
 * Each round allocates, exports, imports (in this process), maps, writes and
 * reads back, then undoes all of it, N times, and prints the medians:
 *
 *   export MODE create_us export_us import_us map_us teardown_us
 *
 * MODE is what the process holds besides, for the whole round:
 *   alone        nothing
 *   keep-alloc   one more allocation, never exported
 *   keep-fd      one more allocation, exported, its fd left open
 *   keep-import  one more allocation, exported and imported, the fd closed
 * The rounds run alone, keep-fd, alone, keep-alloc, keep-import, alone, so a
 * warm-up shows as a difference between the three `alone` rounds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpuapp.h"

typedef struct {
    CUdevice dev;
    CUmemAllocationProp prop;
    size_t size;
} bench;

static CUmemGenericAllocationHandle create(const bench *b) {
    CUmemGenericAllocationHandle h;
    CHECK(cuMemCreate(&h, b->size, &b->prop, 0));
    return h;
}

static int export_fd(CUmemGenericAllocationHandle h) {
    int fd = -1;
    CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    return fd;
}

static CUmemGenericAllocationHandle import_fd(int fd) {
    CUmemGenericAllocationHandle h;
    CHECK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    return h;
}

static void round_of(const bench *b, const char *mode, int reps) {
    CUmemGenericAllocationHandle keep = 0, keep_imp = 0;
    int keep_fd = -1;
    if (strcmp(mode, "alone")) {
        keep = create(b);
        if (strcmp(mode, "keep-alloc"))
            keep_fd = export_fd(keep);
        if (!strcmp(mode, "keep-import")) {
            keep_imp = import_fd(keep_fd);
            close(keep_fd);
            keep_fd = -1;
        }
    }
    double *t = calloc((size_t)reps * 5, sizeof *t);
    if (!t)
        gpuapp_die("out of memory");
    CUmemAccessDesc acc = {.location = b->prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    for (int i = 0; i < reps; i++) {
        double t0 = gpuapp_now_s() * 1e6;
        CUmemGenericAllocationHandle h = create(b);
        double t1 = gpuapp_now_s() * 1e6;
        int fd = export_fd(h);
        double t2 = gpuapp_now_s() * 1e6;
        CUmemGenericAllocationHandle imp = import_fd(fd);
        close(fd);
        double t3 = gpuapp_now_s() * 1e6;
        CUdeviceptr p = 0;
        CHECK(cuMemAddressReserve(&p, b->size, b->size, 0, 0));
        CHECK(cuMemMap(p, b->size, 0, imp, 0));
        CHECK(cuMemSetAccess(p, b->size, &acc, 1));
        double t4 = gpuapp_now_s() * 1e6;
        unsigned char v = 0;
        CHECK(cuMemsetD8(p, (unsigned char)i, b->size));
        CHECK(cuMemcpyDtoH(&v, p + b->size - 1, 1));
        if (v != (unsigned char)i)
            gpuapp_die("round %s rep %d: wrote 0x%02x, read 0x%02x", mode, i, (unsigned char)i, v);
        double t5 = gpuapp_now_s() * 1e6;
        CHECK(cuMemUnmap(p, b->size));
        CHECK(cuMemRelease(imp));
        CHECK(cuMemRelease(h));
        CHECK(cuMemAddressFree(p, b->size));
        double t6 = gpuapp_now_s() * 1e6;
        t[i] = t1 - t0;
        t[reps + i] = t2 - t1;
        t[2 * reps + i] = t3 - t2;
        t[3 * reps + i] = t4 - t3;
        t[4 * reps + i] = t6 - t5;
    }
    printf("export %s %.1f %.1f %.1f %.1f %.1f\n", mode, gpuapp_median(t, reps), gpuapp_median(t + reps, reps),
           gpuapp_median(t + 2 * reps, reps), gpuapp_median(t + 3 * reps, reps), gpuapp_median(t + 4 * reps, reps));
    fflush(stdout);
    free(t);
    if (keep_imp)
        CHECK(cuMemRelease(keep_imp));
    if (keep_fd >= 0)
        close(keep_fd);
    if (keep)
        CHECK(cuMemRelease(keep));
}

int main(int argc, char **argv) {
    int reps = 30, mib = 2;
    gpuapp a = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            a.ordinal = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: exportbench [--reps N] [--device D] [--mib M]\n");
            return 2;
        }
    }
    if (reps < 1 || mib < 1) {
        fprintf(stderr, "exportbench: --reps and --mib must be at least 1\n");
        return 2;
    }
    gpuapp_context(&a);
    bench b = {.dev = a.dev};
    b.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    b.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    b.prop.location.id = a.dev;
    b.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &b.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    b.size = ((size_t)mib << 20) / gran * gran;
    if (b.size < gran)
        b.size = gran;
    static const char *const modes[] = {"alone", "keep-fd", "alone", "keep-alloc", "keep-import", "alone"};
    printf("# exportbench: %zu bytes, %d reps, medians in us: create export import map teardown\n", b.size, reps);
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++)
        round_of(&b, modes[m], reps);
    gpuapp_context_release(&a);
    return 0;
}

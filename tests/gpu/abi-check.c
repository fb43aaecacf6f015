/*
 * ABI check of gpucr's driver API header (include/gpucr/cudadrv.h)
 * against the real cuda.h and libcuda.so.1. Driven by tests/gpu/abi-check.py,
 * which parses cudadrv.h and writes abi-items.h: one item a line, every
 * struct and typedef, struct member, enum constant, #define and function that
 * cudadrv.h declares. This file is compiled twice with the same items:
 *
 *   -DREAL_CUDA_H -I/usr/local/cuda/include    against NVIDIA's cuda.h
 *   -Iinclude                                   against gpucr's header
 *
 * and each binary prints one `kind name value` line per item:
 *
 *   sizeof T N              sizeof(T)
 *   member T.m OFFSET SIZE  offsetof(T, m) and sizeof of the member
 *   value NAME V            an enum constant or #define, as a signed integer
 *   alias NAME EXPANSION    a name that is a macro (cuMemAlloc -> cuMemAlloc_v2);
 *                           printed for every declared function too, so that a
 *                           function the real header renames shows up
 *
 * The script diffs the two outputs. With --symbols [LIB] the binary instead
 * dlopens LIB (default libcuda.so.1) and looks up every function cudadrv.h
 * declares (by its ABI name, e.g. cuMemAlloc_v2), printing `symbol NAME ok`
 * or `symbol NAME MISSING`; exit status 1 if any is missing.
 */
#ifdef REAL_CUDA_H
#include <cuda.h>
#else
#include "gpucr/cudadrv.h"
#endif

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define ABI_STR_(x) #x
#define ABI_STR(x) ABI_STR_(x)

static int symbols_mode;
static void *lib;
static int missing;

static void symbol(const char *name) {
    if (!symbols_mode)
        return;
    /* dlerror() clears any earlier error; a NULL symbol value is legal in
     * principle, so the error, not the value, says it is missing. */
    (void)dlerror();
    void *p = dlsym(lib, name);
    const char *err = dlerror();
    if (err || !p) {
        printf("symbol %s MISSING\n", name);
        missing++;
    } else {
        printf("symbol %s ok\n", name);
    }
}

#define ABI_SIZEOF(T)                                                                                                  \
    if (!symbols_mode)                                                                                                 \
        printf("sizeof %s %zu\n", #T, sizeof(T));
#define ABI_MEMBER(T, m)                                                                                               \
    if (!symbols_mode)                                                                                                 \
        printf("member %s.%s %zu %zu\n", #T, #m, offsetof(T, m), sizeof(((T *)0)->m));
#define ABI_VALUE(N)                                                                                                   \
    if (!symbols_mode)                                                                                                 \
        printf("value %s %lld\n", #N, (long long)(intptr_t)(N));
#define ABI_ALIAS(N)                                                                                                   \
    if (!symbols_mode)                                                                                                 \
        printf("alias %s %s\n", #N, ABI_STR(N));
/* Not through ABI_ALIAS: N would be expanded before it is stringified. */
#define ABI_FUNC(N, abiname)                                                                                           \
    if (!symbols_mode)                                                                                                 \
        printf("alias %s %s\n", #N, ABI_STR(N));                                                                       \
    symbol(abiname);

static void items(void) {
#include "abi-items.h"
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--symbols")) {
        const char *path = argc >= 3 ? argv[2] : "libcuda.so.1";
        symbols_mode = 1;
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            printf("cannot load %s: %s\n", path, dlerror());
            return 2;
        }
        items();
        /* The driver's own version, for the log. */
        CUresult (*get_version)(int *) = (CUresult(*)(int *))dlsym(lib, "cuDriverGetVersion");
        int v = 0;
        if (get_version && get_version(&v) == CUDA_SUCCESS)
            printf("info driver-version %d\n", v);
        return missing ? 1 : 0;
    }
#ifdef REAL_CUDA_H
    printf("info CUDA_VERSION %d\n", CUDA_VERSION);
#else
    printf("info GPUCR_CUDA_API_VERSION %d\n", GPUCR_CUDA_API_VERSION);
#endif
    items();
    return 0;
}

/* A look at a driver library apart from loading it for use (probe.go). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "probe.h"

int gs_probe(const char *path, char *file, size_t filelen, int *version, const char *const *names, int n, int *present,
             char *err, size_t errlen) {
    file[0] = 0;
    *version = 0;
    /* NODELETE: never unloaded under a driver that started threads or registered handlers */
    void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        snprintf(err, errlen, "dlopen %s: %s", path, dlerror());
        return -1;
    }
    void *get_version = dlsym(h, "cuDriverGetVersion");
    if (get_version) {
        Dl_info info;
        if (dladdr(get_version, &info) && info.dli_fname)
            snprintf(file, filelen, "%s", info.dli_fname);
        int v = 0;
        /* Callable before cuInit. */
        if (((CUresult(*)(int *))get_version)(&v) == CUDA_SUCCESS)
            *version = v;
    }
    for (int i = 0; i < n; i++)
        present[i] = dlsym(h, names[i]) != NULL;
    dlclose(h);
    return 0;
}

/*
 * nvmlprobe: what PyTorch's c10/cuda/driver_api.cpp does with NVML, against the libnvidia-ml.so.1 that the
 * dynamic linker finds. It dlopens that soname (RTLD_LAZY), looks up every function of the file it is given
 * (testdata/nvml-torch-driver-api.txt: PyTorch's table), calls nvmlInit_v2 and then each other function with
 * valid arguments, and prints one line per call, "NAME=N", N being what it returned. Served mode's NVML is not
 * available: nvmlInit_v2 says the driver is not loaded (9) and every other function that NVML is not
 * initialized (1), and none of them writes to what it was given. It exits 1 on any other answer, a name the
 * library lacks or a descriptor of the driver's (/dev/nvidia*) left open; "nvmlprobe: ok" otherwise.
 * TestServedNVMLNotAvailable (servednvml_test.go) builds it and runs it under `gpucr run --served`.
 *
 *   nvmlprobe NAMES_FILE
 */
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* NVML's numbers. */
enum { NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_DRIVER_NOT_LOADED = 9 };

/* Every argument is a pointer or an unsigned int: the out structures are buffers of this many bytes, filled
 * with a byte that each call must leave there. */
#define OUT_BYTES 4096
#define FILL 0x5a

typedef int (*init_fn)(void);
typedef int (*ptr_fn)(void *);
typedef int (*str_ptr_fn)(const char *, void *);
typedef int (*dev_ptr_fn)(void *, void *);
typedef int (*dev_uint_ptr_fn)(void *, unsigned int, void *);
typedef int (*dev_ptr_ptr_fn)(void *, void *, void *);
typedef const char *(*errstr_fn)(int);

static unsigned char out1[OUT_BYTES], out2[OUT_BYTES];

static void fill(void) {
    memset(out1, FILL, sizeof out1);
    memset(out2, FILL, sizeof out2);
}

static int untouched(void) {
    for (size_t i = 0; i < OUT_BYTES; i++)
        if (out1[i] != FILL || out2[i] != FILL)
            return 0;
    return 1;
}

/* Calls name's function (at f) as PyTorch calls it, on a made-up device; -1000 for a name it does not know. */
static int call(const char *name, void *f) {
    void *dev = (void *)0x1000; /* no handle NVML gave: one that is not available must not look at it */
    fill();
    if (strcmp(name, "nvmlInit_v2") == 0)
        return ((init_fn)f)();
    if (strcmp(name, "nvmlDeviceGetHandleByPciBusId_v2") == 0)
        return ((str_ptr_fn)f)("00000000:19:00.0", out1);
    if (strcmp(name, "nvmlDeviceGetNvLinkRemoteDeviceType") == 0 ||
        strcmp(name, "nvmlDeviceGetNvLinkRemotePciInfo_v2") == 0)
        return ((dev_uint_ptr_fn)f)(dev, 0, out1);
    if (strcmp(name, "nvmlDeviceGetComputeRunningProcesses") == 0) {
        unsigned int count = 8;
        int r = ((dev_ptr_ptr_fn)f)(dev, &count, out1);
        if (count != 8)
            out2[0] = 0; /* the count was written */
        return r;
    }
    if (strcmp(name, "nvmlSystemGetCudaDriverVersion_v2") == 0)
        return ((ptr_fn)f)(out1);
    if (strcmp(name, "nvmlDeviceGetGpuFabricInfoV") == 0) {
        out1[0] = 0x02; /* the structure's version, as PyTorch sets it */
        int r = ((dev_ptr_fn)f)(dev, out1);
        out1[0] = FILL;
        return r;
    }
    return -1000;
}

/* A descriptor of this process that names a driver file (/dev/nvidia*), or 0. */
static int driver_fd(char *path, size_t len) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int found = 0;
    if (d == NULL)
        return 0;
    while (!found && (e = readdir(d)) != NULL) {
        ssize_t n;
        if (e->d_name[0] == '.')
            continue;
        n = readlinkat(dirfd(d), e->d_name, path, len - 1);
        if (n > 0) {
            path[n] = '\0';
            found = strncmp(path, "/dev/nvidia", 11) == 0;
        }
    }
    closedir(d);
    return found;
}

int main(int argc, char **argv) {
    char line[256], fdpath[4096];
    struct link_map *map = NULL;
    int bad = 0, names = 0;
    if (argc != 2) {
        fprintf(stderr, "usage: nvmlprobe NAMES_FILE\n");
        return 2;
    }
    void *h = dlopen("libnvidia-ml.so.1", RTLD_LAZY);
    if (h == NULL) {
        fprintf(stderr, "nvmlprobe: dlopen libnvidia-ml.so.1: %s\n", dlerror());
        return 1;
    }
    FILE *list = fopen(argv[1], "r");
    if (list == NULL) {
        perror(argv[1]);
        return 2;
    }
    if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map != NULL) {
        char *real = realpath(map->l_name, NULL);
        printf("nvmlprobe: loaded %s\n", real != NULL ? real : map->l_name);
        free(real);
    }
    errstr_fn errstr = (errstr_fn)dlsym(h, "nvmlErrorString");
    while (fgets(line, sizeof line, list) != NULL) {
        line[strcspn(line, " \t\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#')
            continue;
        names++;
        dlerror();
        void *f = dlsym(h, line);
        if (f == NULL) {
            printf("nvmlprobe: can't find %s: %s\n", line, dlerror());
            bad = 1;
            continue;
        }
        int r = call(line, f);
        int want = strcmp(line, "nvmlInit_v2") == 0 ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_ERROR_UNINITIALIZED;
        printf("%s=%d (%s)\n", line, r, errstr != NULL && r != -1000 ? errstr(r) : "?");
        if (r == -1000) {
            printf("nvmlprobe: %s is not one nvmlprobe knows how to call\n", line);
            bad = 1;
        } else if (r != want) {
            printf("nvmlprobe: %s returned %d, want %d\n", line, r, want);
            bad = 1;
        } else if (!untouched()) {
            printf("nvmlprobe: %s wrote to its arguments\n", line);
            bad = 1;
        }
    }
    fclose(list);
    if (names == 0) {
        printf("nvmlprobe: %s names no function\n", argv[1]);
        bad = 1;
    }
    if (driver_fd(fdpath, sizeof fdpath)) {
        printf("nvmlprobe: a driver file is open: %s\n", fdpath);
        bad = 1;
    }
    if (bad)
        return 1;
    printf("nvmlprobe: ok (%d functions)\n", names);
    return 0;
}

/*
 * What served mode's cuBLAS and cuBLASLt share (common.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <elf.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

extern char **environ;

static const char *const sonames[2] = {"libcublas.so.13", "libcublasLt.so.13"};
static const char *const env_names[2] = {"GPUCR_CUBLAS_PATH", "GPUCR_CUBLASLT_PATH"};

/* ---- served mode's library ---- */

static const struct sv_ext *ext;
static pthread_once_t ext_once = PTHREAD_ONCE_INIT;

static void ext_find(void) {
    const struct sv_ext *(*fn)(unsigned) = (const struct sv_ext *(*)(unsigned))dlsym(RTLD_DEFAULT, SV_EXT_SYMBOL);
    ext = fn ? fn(SV_EXT_VERSION) : NULL;
    if (ext && ext->size < sizeof(struct sv_ext))
        ext = NULL;
    if (!ext)
        fprintf(stderr,
                "gpucr: served mode's cuBLAS runs only under served mode's driver library (gpucr run "
                "--served), which this process has not loaded, or of another version: cuBLAS calls fail "
                "with CUBLAS_STATUS_NOT_INITIALIZED\n");
}

const struct sv_ext *bl_ext(void) {
    pthread_once(&ext_once, ext_find);
    return ext;
}

/* ---- NVIDIA's library, where the dynamic linker would have found it ---- */

/* st describes this library's own file (a candidate that is this file is not NVIDIA's). */
static bool self_stat(struct stat *st) {
    Dl_info di;
    return dladdr((void *)self_stat, &di) && di.dli_fname && stat(di.dli_fname, st) == 0;
}

static bool usable(const char *path, const struct stat *self) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return false;
    return !(self && st.st_dev == self->st_dev && st.st_ino == self->st_ino);
}

/* dir/name into out if that file exists and is not this library; $ORIGIN expanded to origin. */
static bool try_dir(const char *dir, size_t dlen, const char *origin, const char *name, const struct stat *self,
                    char *out, size_t cap) {
    char d[PATH_MAX];
    size_t n = 0;
    for (size_t i = 0; i < dlen && n < sizeof d - 1;) {
        size_t skip = 0;
        if (strncmp(dir + i, "$ORIGIN", 7) == 0)
            skip = 7;
        else if (strncmp(dir + i, "${ORIGIN}", 9) == 0)
            skip = 9;
        if (skip && origin) {
            int w = snprintf(d + n, sizeof d - n, "%s", origin);
            if (w < 0 || (size_t)w >= sizeof d - n)
                return false;
            n += (size_t)w;
            i += skip;
        } else {
            d[n++] = dir[i++];
        }
    }
    d[n] = 0;
    int w = snprintf(out, cap, "%s/%s", d, name);
    return w > 0 && (size_t)w < cap && usable(out, self);
}

/* A colon-separated search path: the first directory that holds name. */
static bool try_path(const char *list, const char *origin, const char *name, const struct stat *self, char *out,
                     size_t cap) {
    for (const char *p = list; p && *p;) {
        const char *c = strchr(p, ':');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len && try_dir(p, len, origin, name, self, out, cap))
            return true;
        p = c ? c + 1 : NULL;
    }
    return false;
}

struct search {
    const char *name;
    const struct stat *self;
    char *out;
    size_t cap;
    bool found;
};

/* Each loaded object that needs name: its DT_RUNPATH (or DT_RPATH), as the dynamic linker searched it. */
static int search_object(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    struct search *s = arg;
    if (s->found)
        return 1;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn)
        return 0;
    const char *strtab = NULL;
    ElfW(Xword) runpath = 0, rpath = 0;
    bool has_runpath = false, has_rpath = false, needs = false;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++)
        if (d->d_tag == DT_STRTAB)
            strtab = (const char *)d->d_un.d_ptr; /* relocated by the dynamic linker in a loaded object */
    if (!strtab)
        return 0;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_NEEDED && strcmp(strtab + d->d_un.d_val, s->name) == 0)
            needs = true;
        else if (d->d_tag == DT_RUNPATH)
            runpath = d->d_un.d_val, has_runpath = true;
        else if (d->d_tag == DT_RPATH)
            rpath = d->d_un.d_val, has_rpath = true;
    }
    if (!needs || (!has_runpath && !has_rpath))
        return 0;
    char origin[PATH_MAX];
    const char *obj = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "/proc/self/exe";
    char real[PATH_MAX];
    if (!realpath(obj, real))
        return 0;
    snprintf(origin, sizeof origin, "%s", real);
    char *slash = strrchr(origin, '/');
    if (slash)
        *slash = 0;
    const char *list = strtab + (has_runpath ? runpath : rpath);
    if (try_path(list, origin, s->name, s->self, s->out, s->cap))
        s->found = true;
    return s->found;
}

/*
 * A loaded object that is NVIDIA's library itself (its file named name, not this library: PyTorch loads the CUDA
 * wheels' libraries by path before its own, which then bind to the preloaded stub), or one that sits beside it
 * (another of the CUDA wheels' libraries, loaded by path: NVIDIA's libcudart.so.13, say).
 */
static int search_sibling(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    struct search *s = arg;
    const char *path = info->dlpi_name;
    const char *slash = path ? strrchr(path, '/') : NULL;
    if (s->found || !slash || !strstr(path, "/nvidia/"))
        return s->found;
    int w = snprintf(s->out, s->cap, "%.*s/%s", (int)(slash - path), path, s->name);
    s->found = w > 0 && (size_t)w < s->cap && usable(s->out, s->self);
    return s->found;
}

/*
 * NVIDIA's library (which): $GPUCR_CUBLAS_PATH / $GPUCR_CUBLASLT_PATH; else where the objects that need it
 * would have found it (their run paths: PyTorch's name the CUDA wheels' directories); else beside the CUDA
 * wheels' libraries loaded by path; else on LD_LIBRARY_PATH; else its soname, for the worker's own search (the
 * system's library directories).
 */
static void find_real(unsigned which, char *out, size_t cap) {
    const char *name = sonames[which];
    const char *env = getenv(env_names[which]);
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return;
    }
    struct stat self_st;
    const struct stat *self = self_stat(&self_st) ? &self_st : NULL;
    struct search s = {name, self, out, cap, false};
    dl_iterate_phdr(search_object, &s);
    if (s.found)
        return;
    /* cuBLAS needs cuBLASLt: NVIDIA's libcublas.so.13 sits beside NVIDIA's libcublasLt.so.13 */
    if (which == BL_CUBLASLT) {
        struct search t = {sonames[BL_CUBLAS], self, out, cap, false};
        dl_iterate_phdr(search_object, &t);
        if (t.found) {
            char *slash = strrchr(out, '/');
            if (slash && (size_t)(slash - out) + 1 + strlen(name) < cap) {
                strcpy(slash + 1, name);
                if (usable(out, self))
                    return;
            }
        }
    }
    struct search sb = {name, self, out, cap, false};
    dl_iterate_phdr(search_sibling, &sb);
    if (sb.found)
        return;
    if (try_path(getenv("LD_LIBRARY_PATH"), NULL, name, self, out, cap))
        return;
    snprintf(out, cap, "%s", name);
}

/* ---- loading it in the worker ---- */

static struct {
    pthread_mutex_t mu;
    bool loaded[2]; /* in the current worker */
    bool wanted[2]; /* the process used it: a new worker loads it too */
    bl_info info[2];
    char path[2][SV_BLAS_PATH_MAX];
} L = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* A forked child's worker is a new one, which has loaded nothing. */
static void forked_child(void) {
    pthread_mutex_init(&L.mu, NULL);
    L.loaded[0] = L.loaded[1] = false;
}
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void atfork_init(void) { pthread_atfork(NULL, NULL, forked_child); }

/* L.mu held. */
static cublasStatus_t load_locked(const struct sv_ext *x, unsigned which) {
    if (!L.path[which][0])
        find_real(which, L.path[which], sizeof L.path[which]);
    uint8_t rec[sizeof(struct sv_blas_load) + SV_BLAS_PATH_MAX + SV_BLAS_ENV_MAX];
    struct sv_blas_load q = {which, 0};
    size_t n = strlen(L.path[which]) + 1;
    memcpy(rec, &q, sizeof q);
    memcpy(rec + sizeof q, L.path[which], n);
    n += sizeof q;
    /* cuBLAS's settings from this process's environment, which the worker's cuBLAS would not see otherwise */
    size_t env = 0;
    for (char **e = environ; e && *e; e++) {
        bool ours = strncmp(*e, "CUBLAS", 6) == 0 || strncmp(*e, "NVIDIA_TF32_OVERRIDE=", 21) == 0;
        size_t l = strlen(*e) + 1;
        if (!ours || env + l > SV_BLAS_ENV_MAX)
            continue;
        memcpy(rec + n, *e, l);
        n += l;
        env += l;
    }
    uint8_t out[sizeof(struct sv_blas_loaded) + 600];
    uint32_t len = 0;
    if (L.info[which].version) {
        /* Loaded before (a replay): a template's worker must load the same library. */
        struct sv_blas_loaded was;
        memset(&was, 0, sizeof was);
        was.version = L.info[which].version;
        was.cudart_version = L.info[which].cudart_version;
        was.major = L.info[which].major;
        was.minor = L.info[which].minor;
        was.patch = L.info[which].patch;
        x->expect(&was, sizeof was);
    }
    CUresult r = x->sync(SV_OP_BLAS_LOAD, rec, (uint32_t)n, out, sizeof out - 1, &len);
    if (r != CUDA_SUCCESS) {
        x->warn("served mode: %s: no answer from the worker: CUresult %d", sonames[which], (int)r);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    struct sv_blas_loaded a;
    if (len < sizeof a)
        return CUBLAS_STATUS_INTERNAL_ERROR;
    memcpy(&a, out, sizeof a);
    if (a.status != CUBLAS_STATUS_SUCCESS) {
        out[len] = 0;
        x->warn("served mode: the worker could not load NVIDIA's %s from %s: %s (set %s to its path)", sonames[which],
                L.path[which], len > sizeof a ? (const char *)out + sizeof a : "no reason given", env_names[which]);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    L.info[which] = (bl_info){a.version, a.cudart_version, a.major, a.minor, a.patch};
    L.loaded[which] = true;
    L.wanted[which] = true;
    x->debug("served mode: the worker loaded %s from %s (version %llu)", sonames[which], L.path[which],
             (unsigned long long)a.version);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t bl_ready(unsigned which, const struct sv_ext **xp) {
    const struct sv_ext *x = bl_ext();
    *xp = x;
    if (!x)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    pthread_once(&atfork_once, atfork_init);
    if (x->init() != CUDA_SUCCESS)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    pthread_mutex_lock(&L.mu);
    cublasStatus_t st = L.loaded[which] ? CUBLAS_STATUS_SUCCESS : load_locked(x, which);
    pthread_mutex_unlock(&L.mu);
    return st;
}

const bl_info *bl_info_of(unsigned which) { return &L.info[which]; }

cublasStatus_t bl_property(unsigned which, libraryPropertyType type, int *value) {
    const struct sv_ext *x;
    if (!value)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = bl_ready(which, &x);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    switch (type) {
    case MAJOR_VERSION: *value = L.info[which].major; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = L.info[which].minor; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = L.info[which].patch; return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
}

cublasStatus_t bl_reload(unsigned which, bool *had) {
    const struct sv_ext *x = bl_ext();
    pthread_mutex_lock(&L.mu);
    L.loaded[which] = false;
    *had = L.wanted[which];
    cublasStatus_t st = *had && x ? load_locked(x, which) : CUBLAS_STATUS_SUCCESS;
    pthread_mutex_unlock(&L.mu);
    return st;
}

/* ---- the interposer's gate ---- */

static void (*gate_enter)(void), (*gate_leave)(void);
static pthread_once_t gate_once = PTHREAD_ONCE_INIT;
static void gate_find(void) {
    gate_enter = (void (*)(void))dlsym(RTLD_DEFAULT, "gpucrGateEnter");
    gate_leave = (void (*)(void))dlsym(RTLD_DEFAULT, "gpucrGateLeave");
    if (!gate_enter || !gate_leave)
        gate_enter = gate_leave = NULL;
}
void bl_gate_enter(void) {
    pthread_once(&gate_once, gate_find);
    if (gate_enter)
        gate_enter();
}
void bl_gate_leave(void) {
    if (gate_leave)
        gate_leave();
}

/* ---- records ---- */

static cublasStatus_t from_cu(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return CUBLAS_STATUS_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE: return CUBLAS_STATUS_INVALID_VALUE;
    case CUDA_ERROR_OUT_OF_MEMORY: return CUBLAS_STATUS_ALLOC_FAILED;
    case CUDA_ERROR_NOT_SUPPORTED: return CUBLAS_STATUS_NOT_SUPPORTED;
    case CUDA_ERROR_NOT_INITIALIZED: return CUBLAS_STATUS_NOT_INITIALIZED;
    default: return CUBLAS_STATUS_EXECUTION_FAILED; /* the worker is gone, or the GPU failed */
    }
}

cublasStatus_t bl_sync(const struct sv_ext *x, unsigned op, const void *pl, uint32_t plen, void *out, uint32_t cap,
                       uint32_t *outlen) {
    uint8_t buf[SV_REPLY_DATA];
    uint32_t len = 0;
    static const int32_t ok = CUBLAS_STATUS_SUCCESS; /* what a template's worker must answer too */
    x->expect(&ok, sizeof ok);
    CUresult r = x->sync(op, pl, plen, buf, sizeof buf, &len);
    if (r != CUDA_SUCCESS)
        return from_cu(r);
    int32_t st;
    if (len < sizeof st)
        return CUBLAS_STATUS_INTERNAL_ERROR;
    memcpy(&st, buf, sizeof st);
    if (out)
        memcpy(out, buf, len < cap ? len : cap);
    if (outlen)
        *outlen = len;
    return (cublasStatus_t)st;
}

cublasStatus_t bl_async(const struct sv_ext *x, unsigned op, const void *pl, uint32_t plen, uint32_t stream) {
    return from_cu(x->async(op, pl, plen, stream));
}

cublasStatus_t bl_probe(const struct sv_ext *x, unsigned op, const void *pl, uint32_t plen, uint32_t stream) {
    uint8_t out[8];
    uint32_t len = 0;
    /* the worker's status as its CUresult (helper/served/blas.c: as_cu), which from_cu takes back */
    CUresult r = x->sync(op, pl, plen, out, sizeof out, &len);
    if (r == CUDA_SUCCESS && stream != SV_EXT_NO_STREAM)
        x->cap_note(stream, op, pl, plen);
    return from_cu(r);
}

/* ---- the thread's current context ---- */

static CUresult (*ctx_get)(CUcontext *), (*ctx_set)(CUcontext);
static CUcontext primary;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT, primary_once = PTHREAD_ONCE_INIT;
static void ctx_find(void) {
    ctx_get = (CUresult(*)(CUcontext *))dlsym(RTLD_DEFAULT, "cuCtxGetCurrent");
    ctx_set = (CUresult(*)(CUcontext))dlsym(RTLD_DEFAULT, "cuCtxSetCurrent");
}
static void primary_retain(void) {
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))dlsym(RTLD_DEFAULT, "cuDevicePrimaryCtxRetain");
    CUcontext c = NULL;
    if (retain && retain(&c, 0) == CUDA_SUCCESS)
        primary = c;
}

void bl_ctx_current(void) {
    pthread_once(&ctx_once, ctx_find);
    CUcontext c = NULL;
    if (!ctx_get || !ctx_set || ctx_get(&c) != CUDA_SUCCESS || c)
        return;
    pthread_once(&primary_once, primary_retain);
    if (primary)
        ctx_set(primary);
}

/* ---- sizes, names ---- */

size_t bl_type_size(cudaDataType t) {
    switch (t) {
    case CUDA_R_8I:
    case CUDA_R_8U:
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: return 1;
    case CUDA_R_16F:
    case CUDA_R_16BF:
    case CUDA_C_8I:
    case CUDA_C_8U: return 2;
    case CUDA_R_32F:
    case CUDA_R_32I:
    case CUDA_R_32U:
    case CUDA_C_16F:
    case CUDA_C_16BF: return 4;
    case CUDA_R_64F:
    case CUDA_C_32F:
    case CUDA_C_32I:
    case CUDA_C_32U: return 8;
    case CUDA_C_64F: return 16;
    default: return 0;
    }
}

size_t bl_compute_scalar(cublasComputeType_t c, cudaDataType ctype) {
    bool complex = ctype == CUDA_C_32F || ctype == CUDA_C_64F || ctype == CUDA_C_16F || ctype == CUDA_C_16BF ||
                   ctype == CUDA_C_8I || ctype == CUDA_C_32I;
    size_t n;
    switch (c) {
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC: n = 2; break;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC: n = 8; break;
    case CUBLAS_COMPUTE_32I:
    case CUBLAS_COMPUTE_32I_PEDANTIC:
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32: n = 4; break;
    default: return 0;
    }
    return complex ? 2 * n : n;
}

const char *bl_status_name(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

const char *bl_status_string(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the current licensing";
    default: return "an unknown internal error has occurred";
    }
}

cublasStatus_t bl_refuse(_Atomic int *once, const char *lib, const char *fn) {
    if (!atomic_exchange(once, 1))
        fprintf(stderr,
                "gpucr: served mode: %s's %s is not forwarded to the worker yet (CUBLAS_STATUS_NOT_SUPPORTED)\n", lib,
                fn);
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

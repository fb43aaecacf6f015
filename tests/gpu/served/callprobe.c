/*
 * callprobe: what a CUDA application asks of the driver library, by the
 * library that asks. LD_PRELOAD it into a plain run (no gpucr):
 *
 *   LD_PRELOAD=callprobe.so CALLPROBE_OUT=FILE python3 app.py
 *
 * A served mode forwards the application's driver calls to a worker
 * process; it must answer every entry point the application resolves, and
 * every export table (cuGetExportTable: undocumented tables of internal
 * driver functions that cudart fetches and checks) as well. This counts,
 * for each caller library (the object that made the request, by dladdr of
 * the return address):
 *   - the driver symbols it resolved, through dlsym or cuGetProcAddress;
 *   - the export tables it fetched, by UUID, and how many entries of each
 *     it could reach (unknown: the table's first word is its size in
 *     bytes for most of them, printed as found);
 * and, for every entry point handed out, the calls made through it: the
 * caller gets a counting thunk (thunk.h) in place of the driver's function
 * (the export tables' entries are left alone: cudart checks them).
 * At exit each process that recorded anything writes its report to
 * CALLPROBE_OUT.PID (default stderr): the application's children (compile
 * workers, find_library's ldconfig) inherit the preload, and one file
 * each keeps them from writing over one another.
 *
 * The driver is reached only through the real dlsym (RTLD_NEXT), and every
 * request is passed through unchanged: the probe only watches.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucr/cudadrv.h"
#include "report.h"
#include "thunk.h"

/* The header maps the name to its _v2; the probe answers both. */
#undef cuGetProcAddress

typedef void *(*dlsym_fn)(void *, const char *);
typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*export_fn)(const void **, const CUuuid *);

static dlsym_fn real_dlsym;
static gpa_v1_fn real_gpa_v1;
static gpa_v2_fn real_gpa_v2;
static export_fn real_export;

#define MAX_ROWS 4096
struct row {
    char caller[160];
    char what[96]; /* a symbol, or "export:UUID" */
    unsigned long count;
    unsigned long first_word; /* an export table's first word */
};
static struct row rows[MAX_ROWS];
static int nrows;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* The entry points handed out through a thunk, by name (one thunk each). */
#define MAX_COUNTED 4096
struct counted {
    char name[96];
    void *real, *thunk;
    struct thunk_data *d;
};
static struct counted counted[MAX_COUNTED];
static int ncounted;
static struct thunk_block thunks;

static void *counting(const char *name, void *real) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < ncounted; i++)
        if (counted[i].real == real && !strcmp(counted[i].name, name)) {
            pthread_mutex_unlock(&mu);
            return counted[i].thunk;
        }
    void *out = real;
    if (ncounted < MAX_COUNTED) {
        struct thunk_data *d;
        void *th = thunk_make(&thunks, real, &d);
        if (d) {
            struct counted *c = &counted[ncounted++];
            snprintf(c->name, sizeof c->name, "%s", name);
            c->real = real;
            c->thunk = th;
            c->d = d;
            out = th;
        }
    }
    pthread_mutex_unlock(&mu);
    return out;
}

static void caller_of(const void *ret, char *out, size_t n) {
    Dl_info di;
    if (ret && dladdr(ret, &di) && di.dli_fname) {
        const char *b = strrchr(di.dli_fname, '/');
        snprintf(out, n, "%s", b ? b + 1 : di.dli_fname);
    } else
        snprintf(out, n, "?");
}

static void note(const void *ret, const char *what, unsigned long first_word) {
    char caller[160];
    caller_of(ret, caller, sizeof caller);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nrows; i++)
        if (!strcmp(rows[i].caller, caller) && !strcmp(rows[i].what, what)) {
            rows[i].count++;
            pthread_mutex_unlock(&mu);
            return;
        }
    if (nrows < MAX_ROWS) {
        struct row *r = &rows[nrows++];
        snprintf(r->caller, sizeof r->caller, "%s", caller);
        snprintf(r->what, sizeof r->what, "%s", what);
        r->count = 1;
        r->first_word = first_word;
    }
    pthread_mutex_unlock(&mu);
}

static void find_real_dlsym(void) {
    real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym)
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}
static pthread_once_t once = PTHREAD_ONCE_INIT;

static CUresult export_from(const void *ret, const void **table, const CUuuid *id) {
    CUresult r = real_export ? real_export(table, id) : CUDA_ERROR_NOT_FOUND;
    char what[96];
    int k = snprintf(what, sizeof what, "export:");
    for (int i = 0; i < 16 && id; i++)
        k += snprintf(what + k, sizeof what - (size_t)k, "%02x", (unsigned char)id->bytes[i]);
    unsigned long first = (r == CUDA_SUCCESS && table && *table) ? (unsigned long)*(const uint64_t *)*table : 0;
    note(ret, what, first);
    return r;
}

static CUresult probe_export(const void **table, const CUuuid *id) {
    return export_from(__builtin_return_address(0), table, id);
}

/* The entry points that hand out other entry points are watched too. */
static void *swap_in(const char *name, void *real) {
    if (!real)
        return real;
    if (!strcmp(name, "cuGetExportTable")) {
        real_export = (export_fn)real;
        return (void *)probe_export;
    }
    return counting(name, real);
}

static CUresult probe_gpa_v1(const char *sym, void **pfn, int ver, cuuint64_t flags);
static CUresult probe_gpa_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);

static void *swap_gpa(const char *name, void *real) {
    if (!real)
        return real;
    if (!strcmp(name, "cuGetProcAddress")) {
        real_gpa_v1 = (gpa_v1_fn)real;
        return (void *)probe_gpa_v1;
    }
    if (!strcmp(name, "cuGetProcAddress_v2")) {
        real_gpa_v2 = (gpa_v2_fn)real;
        return (void *)probe_gpa_v2;
    }
    return swap_in(name, real);
}

static CUresult gpa_v1_from(const void *ret, const char *sym, void **pfn, int ver, cuuint64_t flags) {
    CUresult r = real_gpa_v1 ? real_gpa_v1(sym, pfn, ver, flags) : CUDA_ERROR_NOT_FOUND;
    if (sym) {
        note(ret, sym, 0);
        if (r == CUDA_SUCCESS && pfn)
            *pfn = swap_gpa(sym, *pfn);
    }
    return r;
}

static CUresult gpa_v2_from(const void *ret, const char *sym, void **pfn, int ver, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status) {
    CUresult r = real_gpa_v2 ? real_gpa_v2(sym, pfn, ver, flags, status) : CUDA_ERROR_NOT_FOUND;
    if (sym) {
        note(ret, sym, 0);
        if (r == CUDA_SUCCESS && pfn)
            *pfn = swap_gpa(sym, *pfn);
    }
    return r;
}

static CUresult probe_gpa_v1(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    return gpa_v1_from(__builtin_return_address(0), sym, pfn, ver, flags);
}

static CUresult probe_gpa_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    return gpa_v2_from(__builtin_return_address(0), sym, pfn, ver, flags, status);
}

/* A library linked against libcuda.so.1 (not through dlopen) calls these
 * by name: the preload's definitions come first. */
static void *next_driver_sym(const char *name) {
    pthread_once(&once, find_real_dlsym);
    return real_dlsym ? real_dlsym(RTLD_NEXT, name) : NULL;
}

__attribute__((visibility("default"))) CUresult cuGetProcAddress(const char *sym, void **pfn, int ver,
                                                                 cuuint64_t flags) {
    if (!real_gpa_v1)
        real_gpa_v1 = (gpa_v1_fn)next_driver_sym("cuGetProcAddress");
    return gpa_v1_from(__builtin_return_address(0), sym, pfn, ver, flags);
}

__attribute__((visibility("default"))) CUresult
cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
    if (!real_gpa_v2)
        real_gpa_v2 = (gpa_v2_fn)next_driver_sym("cuGetProcAddress_v2");
    return gpa_v2_from(__builtin_return_address(0), sym, pfn, ver, flags, status);
}

__attribute__((visibility("default"))) CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    if (!real_export)
        real_export = (export_fn)next_driver_sym("cuGetExportTable");
    return export_from(__builtin_return_address(0), table, id);
}

void *dlsym(void *handle, const char *name) {
    pthread_once(&once, find_real_dlsym);
    if (!real_dlsym)
        return NULL;
    void *p = real_dlsym(handle, name);
    if (name[0] == 'c' && name[1] == 'u' && p) {
        note(__builtin_return_address(0), name, 0);
        p = swap_gpa(name, p);
    }
    return p;
}

static void report(void) {
    static _Atomic int done;
    if (done++)
        return;
    pthread_mutex_lock(&mu);
    if (nrows == 0 && ncounted == 0) {
        pthread_mutex_unlock(&mu);
        return;
    }
    FILE *f = report_open("CALLPROBE_OUT");
    fprintf(f, "# caller\twhat\tcount\tfirst_word\n");
    for (int i = 0; i < nrows; i++)
        fprintf(f, "%s\t%s\t%lu\t%lu\n", rows[i].caller, rows[i].what, rows[i].count, rows[i].first_word);
    for (int i = 0; i < ncounted; i++)
        fprintf(f, "(calls)\t%s\t%lu\t0\n", counted[i].name, (unsigned long)atomic_load(&counted[i].d->count));
    pthread_mutex_unlock(&mu);
    report_close(f);
}

/* Both: a process that ends through exit() runs the atexit handler before
 * libraries are unloaded; the destructor covers a library unloaded first. */
__attribute__((constructor)) static void arm(void) { atexit(report); }
__attribute__((destructor)) static void disarm(void) { report(); }

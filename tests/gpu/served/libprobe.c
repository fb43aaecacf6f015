/*
 * libprobe: which functions of the CUDA libraries (cudart, cuBLAS, cuBLASLt,
 * cuDNN, NCCL, NVRTC, cuFFT, cuRAND, cuSPARSE, cuSOLVER) an application
 * binds and how often it calls each, through the dynamic linker's audit
 * interface:
 *
 *   LD_AUDIT=libprobe.so LIBPROBE_OUT=FILE python3 app.py
 *
 * A served mode that forwards calls at these libraries' boundary (the
 * worker loads the real libraries; the application only stubs) has to
 * answer exactly this set. la_symbind64 sees every binding of a function
 * the libraries define to a caller outside them, and binds the caller to a
 * counting thunk (thunk.h) in its place: every call through that binding
 * is counted, lazy or BIND_NOW. (A pointer taken with dlsym is not seen.)
 * At exit each process that bound anything writes FILE.PID: the defining
 * library, the function, the calls counted, and the callers' libraries.
 */
#define _GNU_SOURCE
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "report.h"
#include "thunk.h"

#define NSLOTS 16384 /* a power of two */
struct slot {
    const char *name; /* the dynamic linker's string for the symbol: stable */
    const char *lib;  /* the defining library's base name */
    char callers[192];
    _Atomic unsigned long calls; /* counted at the PLT (lazy binding) */
    struct thunk_data *counted;  /* counted by the thunk bound in its place */
};
static struct thunk_block thunks;
static struct slot slots[NSLOTS];
static _Atomic int nbound;

static const char *base(const char *p) {
    if (!p || !*p)
        return "(program)";
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

/* The libraries a served mode would stand in for. */
static int served_lib(const char *b) {
    static const char *const prefixes[] = {"libcudart.so",   "libcublas.so",   "libcublasLt.so",  "libcudnn",
                                           "libnccl.so",     "libnvrtc.so",    "libcufft.so",     "libcurand.so",
                                           "libcusparse.so", "libcusolver.so", "libnvJitLink.so", NULL};
    for (int i = 0; prefixes[i]; i++)
        if (!strncmp(b, prefixes[i], strlen(prefixes[i])))
            return 1;
    return 0;
}

static struct slot *slot_of(const char *name, int make) {
    uintptr_t h = ((uintptr_t)name >> 3) * 0x9E3779B97F4A7C15ull;
    for (unsigned i = 0; i < NSLOTS; i++) {
        struct slot *s = &slots[(h + i) & (NSLOTS - 1)];
        if (s->name == name)
            return s;
        if (!s->name) {
            if (!make)
                return NULL;
            s->name = name;
            atomic_fetch_add(&nbound, 1);
            return s;
        }
    }
    return NULL;
}

unsigned int la_version(unsigned int v) { return v < LAV_CURRENT ? v : LAV_CURRENT; }

unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie) {
    (void)lmid;
    *cookie = (uintptr_t)map;
    return LA_FLG_BINDTO | LA_FLG_BINDFROM;
}

/* The fat binaries the application registers with cudart: what a worker
 * would have to load too. The wrapper's and the fat binary's headers are
 * CUDA's (fatbinary_section.h): a wrapper {magic 0x466243b1, version, data,
 * ...} whose data starts {magic 0xba55ed50, u16 version, u16 header size,
 * u64 size}. */
typedef void **(*register_fatbin_fn)(void *);
static register_fatbin_fn real_register_fatbin;
static _Atomic unsigned long fatbins, fatbin_bytes;
static struct slot *register_fatbin_slot;

static void **probe_register_fatbin(void *wrapper) {
    const struct {
        int magic, version;
        const uint8_t *data;
    } *w = wrapper;
    atomic_fetch_add(&fatbins, 1);
    if (register_fatbin_slot)
        atomic_fetch_add(&register_fatbin_slot->calls, 1);
    if (w && w->magic == 0x466243b1 && w->data) {
        uint32_t magic;
        uint16_t hsize;
        uint64_t size;
        memcpy(&magic, w->data, 4);
        memcpy(&hsize, w->data + 6, 2);
        memcpy(&size, w->data + 8, 8);
        if (magic == 0xba55ed50)
            atomic_fetch_add(&fatbin_bytes, hsize + size);
    }
    return real_register_fatbin(wrapper);
}

uintptr_t la_symbind64(Elf64_Sym *sym, unsigned int ndx, uintptr_t *refcook, uintptr_t *defcook, unsigned int *flags,
                       const char *symname) {
    (void)ndx;
    const char *def = base(((struct link_map *)*defcook)->l_name);
    const char *ref = base(((struct link_map *)*refcook)->l_name);
    if (!served_lib(def) || served_lib(ref)) {
        *flags |= LA_SYMB_NOPLTENTER | LA_SYMB_NOPLTEXIT;
        return sym->st_value;
    }
    /* Bindings happen under the loader's lock: one writer at a time. */
    struct slot *s = slot_of(symname, 1);
    if (!strcmp(symname, "__cudaRegisterFatBinary") && !strncmp(def, "libcudart.so", 12)) {
        if (s && !s->lib)
            s->lib = def;
        register_fatbin_slot = s;
        real_register_fatbin = (register_fatbin_fn)sym->st_value;
        *flags |= LA_SYMB_NOPLTENTER | LA_SYMB_NOPLTEXIT;
        return (uintptr_t)probe_register_fatbin;
    }
    if (s) {
        s->lib = def;
        if (!strstr(s->callers, ref) && strlen(s->callers) + strlen(ref) + 2 < sizeof s->callers) {
            if (s->callers[0])
                strcat(s->callers, ",");
            strcat(s->callers, ref);
        }
    }
    *flags |= LA_SYMB_NOPLTEXIT;
    /* A function, not a variable: the caller is bound to a thunk that
     * counts its calls (with BIND_NOW too, where the PLT hook never runs). */
    if (s && ELF64_ST_TYPE(sym->st_info) == STT_FUNC) {
        if (!s->counted) {
            struct thunk_data *d;
            void *t = thunk_make(&thunks, (void *)sym->st_value, &d);
            if (d) {
                s->counted = d;
                *flags |= LA_SYMB_NOPLTENTER; /* the thunk counts it */
                return (uintptr_t)t;
            }
        } else if (s->counted->target == (void *)sym->st_value) {
            *flags |= LA_SYMB_NOPLTENTER;
            return (uintptr_t)((uint8_t *)thunks.code + 16 * (s->counted - thunks.data));
        }
    }
    return sym->st_value;
}

Elf64_Addr la_x86_64_gnu_pltenter(Elf64_Sym *sym, unsigned int ndx, uintptr_t *refcook, uintptr_t *defcook,
                                  La_x86_64_regs *regs, unsigned int *flags, const char *symname,
                                  long int *framesizep) {
    (void)ndx;
    (void)refcook;
    (void)defcook;
    (void)regs;
    (void)flags;
    (void)framesizep;
    struct slot *s = slot_of(symname, 0);
    if (s)
        atomic_fetch_add_explicit(&s->calls, 1, memory_order_relaxed);
    return sym->st_value;
}

__attribute__((destructor)) static void report(void) {
    if (atomic_load(&nbound) == 0)
        return;
    FILE *f = report_open("LIBPROBE_OUT");
    fprintf(f, "# library\tfunction\tcalls\tcallers\n");
    for (int i = 0; i < NSLOTS; i++)
        if (slots[i].name)
            fprintf(f, "%s\t%s\t%lu\t%s\n", slots[i].lib ? slots[i].lib : "?", slots[i].name,
                    atomic_load(&slots[i].calls) + (slots[i].counted ? atomic_load(&slots[i].counted->count) : 0),
                    slots[i].callers);
    fprintf(f, "(fatbins)\tregistered\t%lu\t\n(fatbins)\tbytes\t%lu\t\n", atomic_load(&fatbins),
            atomic_load(&fatbin_bytes));
    report_close(f);
}

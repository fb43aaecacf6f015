/*
 * Modules, libraries and kernel launches.
 *
 * PTX is parsed only as far as the driver's observable behaviour needs: which
 * entries a module has and how their parameters are laid out (offsets with
 * natural alignment), which is what cuFuncGetParamInfo reports and what a
 * packed `extra` parameter buffer must match. Instruction bodies are skipped;
 * each entry runs as the C function registered under its name (simk.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

/* ---- kernel registry, filled by SIMK_REGISTER constructors when the library loads ---- */

typedef struct {
    char *name;
    simk_fn fn;
} reg_ent;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static reg_ent *reg;
static size_t nreg, capreg;

SIM_API void simk_register(const char *name, simk_fn fn) {
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < nreg; i++) {
        if (strcmp(reg[i].name, name) == 0) {
            sim_warn("simk_register: kernel '%s' registered twice; the later one wins", name);
            reg[i].fn = fn;
            pthread_mutex_unlock(&reg_mu);
            return;
        }
    }
    if (nreg == capreg) {
        size_t c = capreg ? capreg * 2 : 64;
        reg_ent *v = realloc(reg, c * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&reg_mu);
            sim_warn("simk_register: out of memory registering '%s'", name);
            return;
        }
        reg = v;
        capreg = c;
    }
    char *dup = strdup(name);
    if (dup) {
        reg[nreg].name = dup;
        reg[nreg].fn = fn;
        nreg++;
    }
    pthread_mutex_unlock(&reg_mu);
}

static simk_fn reg_lookup(const char *name) {
    simk_fn fn = NULL;
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < nreg && !fn; i++)
        if (strcmp(reg[i].name, name) == 0)
            fn = reg[i].fn;
    pthread_mutex_unlock(&reg_mu);
    return fn;
}

/* ---- PTX ---- */

typedef struct sim_entry {
    char *name;
    unsigned nparams;
    size_t *off, *size;
    size_t psize; /* bytes of the packed parameter buffer */
    simk_fn fn;
} sim_entry;

typedef struct sim_image {
    sim_entry *e;
    unsigned n;
} sim_image;

enum { T_END, T_WORD, T_STR, T_PUNCT, T_ERR };

typedef struct lexer {
    const char *p;
    int kind;
    char tok[256];
} lexer;

static bool is_word_char(int ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' ||
           ch == '$' || ch == '%';
}

static int lex(lexer *L) {
    const char *p = L->p;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\f' || *p == '\v')
            p++;
        if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n')
                p++;
        } else if (p[0] == '/' && p[1] == '*') {
            const char *e = strstr(p + 2, "*/");
            if (!e) {
                L->p = p;
                return L->kind = T_ERR;
            }
            p = e + 2;
        } else {
            break;
        }
    }
    L->tok[0] = 0;
    if (!*p) {
        L->p = p;
        return L->kind = T_END;
    }
    unsigned char ch = (unsigned char)*p;
    if (ch >= 0x7f || ch < 0x20) {
        L->p = p;
        return L->kind = T_ERR; /* PTX is printable ASCII */
    }
    if (is_word_char(ch)) {
        size_t n = 0;
        while (is_word_char((unsigned char)*p)) {
            if (n + 1 >= sizeof L->tok) {
                L->p = p;
                return L->kind = T_ERR;
            }
            L->tok[n++] = *p++;
        }
        L->tok[n] = 0;
        L->p = p;
        return L->kind = T_WORD;
    }
    if (ch == '"') {
        p++;
        while (*p && *p != '"' && *p != '\n')
            p++;
        if (*p != '"') {
            L->p = p;
            return L->kind = T_ERR;
        }
        L->p = p + 1;
        return L->kind = T_STR;
    }
    L->tok[0] = (char)ch;
    L->tok[1] = 0;
    L->p = p + 1;
    return L->kind = T_PUNCT;
}

static bool punct(const lexer *L, char c) { return L->kind == T_PUNCT && L->tok[0] == c; }

static size_t type_size(const char *t) {
    static const struct {
        const char *name;
        size_t size;
    } types[] = {
        {".b8", 1},   {".u8", 1},  {".s8", 1},  {".b16", 2}, {".u16", 2},   {".s16", 2},   {".f16", 2},
        {".bf16", 2}, {".b32", 4}, {".u32", 4}, {".s32", 4}, {".f32", 4},   {".f16x2", 4}, {".bf16x2", 4},
        {".b64", 8},  {".u64", 8}, {".s64", 8}, {".f64", 8}, {".b128", 16},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(t, types[i].name) == 0)
            return types[i].size;
    return 0;
}

static bool parse_uint(const char *s, size_t *out) {
    if (!*s)
        return false;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (*end || v > (1ULL << 32))
        return false;
    *out = (size_t)v;
    return true;
}

static bool ends_with_align(const char *w) {
    size_t n = strlen(w);
    return n >= 6 && strcmp(w + n - 6, ".align") == 0;
}

/* After "(": the parameter list of an entry, up to and including ")". */
static bool parse_params(lexer *L, sim_entry *e) {
    size_t cap = 0, cur = 0;
    lex(L);
    if (punct(L, ')'))
        return true;
    for (;;) {
        if (L->kind != T_WORD || strcmp(L->tok, ".param") != 0)
            return false;
        size_t align = 0, elem = 0, count = 1;
        bool ptr = false;
        for (;;) {
            if (lex(L) != T_WORD)
                return false;
            if (L->tok[0] != '.')
                break; /* the parameter's name */
            size_t ts = type_size(L->tok);
            bool is_ptr = strncmp(L->tok, ".ptr", 4) == 0;
            if (ts) {
                if (elem)
                    return false;
                elem = ts;
            } else if (is_ptr || strcmp(L->tok, ".align") == 0) {
                /* .align before the type aligns the parameter; after .ptr it describes the pointee */
                bool param_align = !is_ptr && !ptr && !elem;
                ptr = ptr || is_ptr;
                if (ends_with_align(L->tok)) {
                    size_t a;
                    if (lex(L) != T_WORD || !parse_uint(L->tok, &a) || a == 0 || (a & (a - 1)))
                        return false;
                    if (param_align)
                        align = a;
                }
            } else if (strcmp(L->tok, ".global") != 0 && strcmp(L->tok, ".const") != 0 &&
                       strcmp(L->tok, ".local") != 0 && strcmp(L->tok, ".shared") != 0) {
                return false;
            }
        }
        if (!elem)
            return false;
        lex(L);
        if (punct(L, '[')) {
            if (lex(L) != T_WORD || !parse_uint(L->tok, &count) || count == 0)
                return false;
            if (lex(L) != T_PUNCT || !punct(L, ']'))
                return false;
            lex(L);
        }
        size_t a = align ? align : elem;
        size_t off = sim_align_up(cur, a);
        size_t size = elem * count;
        if (e->nparams == cap) {
            cap = cap ? cap * 2 : 8;
            size_t *o = realloc(e->off, cap * sizeof *o);
            if (!o)
                return false;
            e->off = o;
            size_t *s = realloc(e->size, cap * sizeof *s);
            if (!s)
                return false;
            e->size = s;
        }
        e->off[e->nparams] = off;
        e->size[e->nparams] = size;
        e->nparams++;
        cur = off + size;
        e->psize = cur;
        if (punct(L, ')'))
            return true;
        if (!punct(L, ','))
            return false;
        lex(L);
    }
}

static void image_free(sim_image *img) {
    for (unsigned i = 0; i < img->n; i++) {
        free(img->e[i].name);
        free(img->e[i].off);
        free(img->e[i].size);
    }
    free(img->e);
    img->e = NULL;
    img->n = 0;
}

static CUresult ptx_parse(const char *text, sim_image *img) {
    memset(img, 0, sizeof *img);
    lexer L = {.p = text};
    /* text that does not start with .version is not taken for PTX at all (measured) */
    if (lex(&L) != T_WORD || strcmp(L.tok, ".version") != 0)
        return CUDA_ERROR_INVALID_IMAGE;
    if (lex(&L) != T_WORD)
        return CUDA_ERROR_INVALID_PTX;
    bool target = false;
    int depth = 0;
    unsigned cap = 0;
    for (;;) {
        lex(&L);
        if (L.kind == T_END)
            break;
        if (L.kind == T_ERR)
            goto bad;
        if (punct(&L, '{')) {
            depth++;
        } else if (punct(&L, '}')) {
            if (--depth < 0)
                goto bad;
        } else if (depth == 0 && L.kind == T_WORD && strcmp(L.tok, ".target") == 0) {
            target = true;
        } else if (depth == 0 && L.kind == T_WORD && strcmp(L.tok, ".entry") == 0) {
            if (lex(&L) != T_WORD || L.tok[0] == '.')
                goto bad;
            if (img->n == cap) {
                cap = cap ? cap * 2 : 8;
                sim_entry *v = realloc(img->e, cap * sizeof *v);
                if (!v)
                    goto bad;
                img->e = v;
            }
            sim_entry *e = &img->e[img->n];
            memset(e, 0, sizeof *e);
            e->name = strdup(L.tok);
            img->n++;
            if (!e->name)
                goto bad;
            for (unsigned i = 0; i + 1 < img->n; i++)
                if (strcmp(img->e[i].name, e->name) == 0)
                    goto bad;
            lex(&L);
            if (punct(&L, '(')) {
                if (!parse_params(&L, e))
                    goto bad;
            } else if (punct(&L, '{')) {
                depth++;
            } else if (L.kind != T_WORD) {
                goto bad;
            }
        }
    }
    if (depth != 0 || !target)
        goto bad;
    return CUDA_SUCCESS;
bad:
    image_free(img);
    return CUDA_ERROR_INVALID_PTX;
}

/* Anything that is not PTX text is a binary image the simulator cannot run. */
static CUresult image_load(const void *image, sim_image *img) {
    if (!image)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t magic;
    memcpy(&magic, image, sizeof magic);
    const unsigned char *b = image;
    if (magic == 0xBA55ED50u /* fatbin */ || magic == 0x466243B1u /* fatbin wrapper */ ||
        (b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F') /* cubin */)
        return CUDA_ERROR_INVALID_IMAGE;
    CUresult r = ptx_parse(image, img);
    if (r != CUDA_SUCCESS)
        return r;
    for (unsigned i = 0; i < img->n; i++)
        img->e[i].fn = reg_lookup(img->e[i].name);
    return CUDA_SUCCESS;
}

/* ---- modules ---- */

struct sim_module;

typedef struct sim_func {
    uint32_t magic;
    const sim_entry *entry;
    struct sim_module *mod; /* cuFuncGetModule; NULL for a library kernel's function (see there) */
} sim_func;

typedef struct sim_module {
    uint32_t magic;
    sim_ctx *ctx;
    sim_image img;
    sim_func *funcs;
    struct sim_module *next;
} sim_module;

struct sim_library;

typedef struct sim_kernel {
    uint32_t magic;
    const sim_entry *entry;
    struct sim_library *lib; /* cuKernelGetLibrary */
    sim_func func;           /* what cuKernelGetFunction hands out */
} sim_kernel;

typedef struct sim_library {
    uint32_t magic;
    CUresult err; /* a lazily loaded image that failed: reported by cuLibraryGetKernel */
    sim_image img;
    sim_kernel *kernels;
} sim_library;

static sim_module *modules; /* mu */

static void module_free_locked(sim_module *m) {
    for (sim_module **pp = &modules; *pp; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    }
    sim_handle_del(m);
    for (unsigned i = 0; i < m->img.n; i++)
        sim_handle_del(&m->funcs[i]);
    image_free(&m->img);
    free(m->funcs);
    free(m);
}

void sim_modules_free_ctx(sim_ctx *ctx) {
    sim_module *m = modules;
    while (m) {
        sim_module *next = m->next;
        if (m->ctx == ctx)
            module_free_locked(m);
        m = next;
    }
}

SIM_API CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuModuleLoadData", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!module)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_module *m = calloc(1, sizeof *m);
    if (!m)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    r = image_load(image, &m->img);
    if (r != CUDA_SUCCESS) {
        free(m);
        return sim_leave(&c, r);
    }
    m->magic = 0x4d4f4455u;
    m->ctx = c.ctx;
    m->funcs = calloc(m->img.n ? m->img.n : 1, sizeof *m->funcs);
    pthread_mutex_lock(&sim.mu);
    bool ok = m->funcs && sim_handle_add(m, SIM_H_MODULE) == 0;
    for (unsigned i = 0; ok && i < m->img.n; i++) {
        m->funcs[i].magic = 0x46554e43u;
        m->funcs[i].entry = &m->img.e[i];
        m->funcs[i].mod = m;
        ok = sim_handle_add(&m->funcs[i], SIM_H_FUNC) == 0;
    }
    m->next = modules;
    modules = m;
    if (!ok) {
        module_free_locked(m);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        *module = (CUmodule)m;
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuModuleGetFunction", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!hfunc || !name)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    sim_module *m = (sim_module *)hmod;
    if (!sim_handle_is(m, SIM_H_MODULE)) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        r = CUDA_ERROR_NOT_FOUND;
        for (unsigned i = 0; i < m->img.n; i++) {
            if (strcmp(m->img.e[i].name, name) == 0) {
                *hfunc = (CUfunction)&m->funcs[i];
                r = CUDA_SUCCESS;
                break;
            }
        }
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuModuleUnload(CUmodule hmod) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuModuleUnload", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(hmod, SIM_H_MODULE))
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        module_free_locked((sim_module *)hmod);
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

/* ---- libraries: context-independent, as on the driver ---- */

static void library_free_locked(sim_library *l) {
    sim_handle_del(l);
    for (unsigned i = 0; i < l->img.n; i++) {
        sim_handle_del(&l->kernels[i]);
        sim_handle_del(&l->kernels[i].func);
    }
    image_free(&l->img);
    free(l->kernels);
    free(l);
}

SIM_API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                   void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                   void **libraryOptionValues, unsigned int numLibraryOptions) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuLibraryLoadData", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!library || (numJitOptions && (!jitOptions || !jitOptionsValues)) ||
        (numLibraryOptions && (!libraryOptions || !libraryOptionValues)))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    if (!code)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_library *l = calloc(1, sizeof *l);
    if (!l)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    r = image_load(code, &l->img);
    if (r != CUDA_SUCCESS) {
        /*
         * With lazy loading (CUDA_MODULE_LOADING, LAZY by default) the driver
         * accepts any image here and reports what is wrong with it when a kernel
         * is asked for (measured); EAGER reports it now.
         */
        const char *mode = getenv("CUDA_MODULE_LOADING");
        if (r == CUDA_ERROR_OUT_OF_MEMORY || (mode && strcmp(mode, "EAGER") == 0)) {
            free(l);
            return sim_leave(&c, r);
        }
        l->err = r;
        r = CUDA_SUCCESS;
    }
    l->magic = 0x4c494252u;
    l->kernels = calloc(l->img.n ? l->img.n : 1, sizeof *l->kernels);
    pthread_mutex_lock(&sim.mu);
    bool ok = l->kernels && sim_handle_add(l, SIM_H_LIBRARY) == 0;
    for (unsigned i = 0; ok && i < l->img.n; i++) {
        sim_kernel *k = &l->kernels[i];
        k->magic = 0x4b45524eu;
        k->entry = &l->img.e[i];
        k->lib = l;
        k->func.magic = 0x46554e43u;
        k->func.entry = k->entry;
        ok = sim_handle_add(k, SIM_H_KERNEL) == 0 && sim_handle_add(&k->func, SIM_H_FUNC) == 0;
    }
    if (!ok) {
        library_free_locked(l);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        *library = (CUlibrary)l;
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuLibraryGetKernel", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!pKernel || !name)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    sim_library *l = (sim_library *)library;
    if (!sim_handle_is(l, SIM_H_LIBRARY)) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (l->err) {
        r = l->err;
    } else {
        r = CUDA_ERROR_NOT_FOUND;
        for (unsigned i = 0; i < l->img.n; i++) {
            if (strcmp(l->img.e[i].name, name) == 0) {
                *pKernel = (CUkernel)&l->kernels[i];
                r = CUDA_SUCCESS;
                break;
            }
        }
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuLibraryUnload(CUlibrary library) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuLibraryUnload", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(library, SIM_H_LIBRARY))
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        library_free_locked((sim_library *)library);
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuKernelGetFunction", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!pFunc)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(kernel, SIM_H_KERNEL))
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        *pFunc = (CUfunction) & ((sim_kernel *)kernel)->func;
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

/* The name of a function's or a kernel's entry (kind: SIM_H_FUNC or SIM_H_KERNEL), for cuFuncGetName and
 * cuKernelGetName. */
static CUresult entry_name(const char *api, const char **name, void *h, sim_htype kind) {
    sim_call c;
    CUresult r = sim_enter(&c, api, SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!name || !h)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(h, kind))
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        *name = (kind == SIM_H_FUNC ? ((sim_func *)h)->entry : ((sim_kernel *)h)->entry)->name;
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuFuncGetName(const char **name, CUfunction hfunc) {
    return entry_name("cuFuncGetName", name, hfunc, SIM_H_FUNC);
}

SIM_API CUresult cuFuncGetModule(CUmodule *hmod, CUfunction hfunc) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuFuncGetModule", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!hmod)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(hfunc, SIM_H_FUNC))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!((sim_func *)hfunc)->mod)
        /* The driver answers with the context's module of the library (cuLibraryGetModule), which the simulator
         * does not model: it says so instead of making one up. */
        r = CUDA_ERROR_NOT_SUPPORTED;
    else
        *hmod = (CUmodule)((sim_func *)hfunc)->mod;
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuKernelGetName(const char **name, CUkernel hfunc) {
    return entry_name("cuKernelGetName", name, hfunc, SIM_H_KERNEL);
}

SIM_API CUresult cuKernelGetLibrary(CUlibrary *pLib, CUkernel kernel) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuKernelGetLibrary", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!pLib)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(kernel, SIM_H_KERNEL))
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        *pLib = (CUlibrary)((sim_kernel *)kernel)->lib;
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

static CUresult param_info(const sim_entry *e, size_t idx, size_t *off, size_t *size) {
    if (idx >= e->nparams || (!off && !size))
        return CUDA_ERROR_INVALID_VALUE;
    if (off)
        *off = e->off[idx];
    if (size)
        *size = e->size[idx];
    return CUDA_SUCCESS;
}

SIM_API CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset, size_t *paramSize) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuFuncGetParamInfo", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    pthread_mutex_lock(&sim.mu);
    /* a CUkernel cast to CUfunction is not a function here, as on the driver */
    if (!sim_handle_is(func, SIM_H_FUNC))
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        r = param_info(((sim_func *)func)->entry, paramIndex, paramOffset, paramSize);
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset, size_t *paramSize) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuKernelGetParamInfo", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(kernel, SIM_H_KERNEL))
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        r = param_info(((sim_kernel *)kernel)->entry, paramIndex, paramOffset, paramSize);
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

/* ---- launches ---- */

typedef struct {
    simk_fn fn;
    simk_launch L;
    const char *name;
} kpay;

SIM_API void *simk_dev(const simk_launch *L, CUdeviceptr p, size_t bytes) {
    static unsigned char empty;
    (void)L;
    if (bytes == 0)
        return p ? (void *)(uintptr_t)p : &empty;
    /* the worker holds memlock for reading while the kernel runs */
    return sim_dev_range_ok(p, bytes, true) ? (void *)(uintptr_t)p : NULL;
}

static CUresult run_kernel(sim_op *op) {
    const kpay *k = op->arg;
    simk_launch L = k->L; /* a graph's replays share the payload: the op is this run's own */
    L.priv = op;
    pthread_rwlock_rdlock(&sim.memlock);
    CUresult e = k->fn(&L);
    pthread_rwlock_unlock(&sim.memlock);
    if (e != CUDA_SUCCESS) {
        char what[300];
        snprintf(what, sizeof what, "kernel %s", k->name);
        sim_stream_mark_fault(op->ctx, e, what);
    }
    return e;
}

static CUresult launch(sim_call *c, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, unsigned shared, CUstream h, void **kp, void **extra) {
    if (gx == 0 || gy == 0 || gz == 0 || gy > 65535 || gz > 65535 || bx == 0 || by == 0 || bz == 0 || bx > 1024 ||
        by > 1024 || bz > 64 || (uint64_t)bx * by * bz > 1024 || shared > 49152)
        return CUDA_ERROR_INVALID_VALUE;
    if (kp && extra)
        return CUDA_ERROR_INVALID_VALUE;
    const void *xbuf = NULL;
    size_t xsize = 0;
    bool have_buf = false, have_size = false;
    if (extra) {
        for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
                xbuf = extra[i + 1];
                have_buf = true;
            } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
                if (!extra[i + 1])
                    return CUDA_ERROR_INVALID_VALUE;
                xsize = *(const size_t *)extra[i + 1];
                have_size = true;
            } else {
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
        if (!have_buf || !have_size)
            return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim.mu);
    int t = sim_handle_type(f);
    const sim_entry *e = t == SIM_H_FUNC ? ((sim_func *)f)->entry : t == SIM_H_KERNEL ? ((sim_kernel *)f)->entry : NULL;
    if (!e) {
        pthread_mutex_unlock(&sim.mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    /*
     * Measured on the driver: a packed buffer may be shorter than the PTX
     * layout (the rest reads as whatever is there; zeros here), not longer.
     */
    CUresult r = CUDA_SUCCESS;
    if (extra && (xsize == 0 || !xbuf))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (extra && xsize > e->psize)
        r = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    else if (!extra && e->nparams && !kp)
        r = CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; r == CUDA_SUCCESS && kp && i < e->nparams; i++)
        if (!kp[i])
            r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && !e->fn) {
        sim_warn("kernel '%s' has no simulated implementation: add SIMK_REGISTER(\"%s\", ...) in tests/sim/kernels/",
                 e->name, e->name);
        r = CUDA_ERROR_NOT_SUPPORTED;
    }
    if (r != CUDA_SUCCESS) {
        pthread_mutex_unlock(&sim.mu);
        return r;
    }
    /* Everything the launch needs is copied: the module may be unloaded before it runs. */
    size_t np = e->nparams, namelen = strlen(e->name) + 1;
    size_t psz = e->psize ? e->psize : 1;
    sim_op *op = sim_op_new(sizeof(kpay) + 2 * np * sizeof(size_t) + psz + namelen, run_kernel);
    if (!op) {
        pthread_mutex_unlock(&sim.mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    kpay *k = op->arg;
    size_t *offs = (size_t *)(k + 1);
    size_t *sizes = offs + np;
    unsigned char *params = (unsigned char *)(sizes + np);
    char *name = (char *)params + psz;
    memcpy(offs, e->off, np * sizeof(size_t));
    memcpy(sizes, e->size, np * sizeof(size_t));
    memcpy(name, e->name, namelen);
    if (extra)
        memcpy(params, xbuf, xsize);
    for (unsigned i = 0; kp && i < np; i++)
        memcpy(params + offs[i], kp[i], sizes[i]);
    k->fn = e->fn;
    k->name = name;
    k->L = (simk_launch){
        .grid = {gx, gy, gz},
        .block = {bx, by, bz},
        .shared_bytes = shared,
        .params = params,
        .params_size = e->psize,
        .param_offset = offs,
        .param_size = sizes,
        .nparams = (unsigned)np,
    };
    pthread_mutex_unlock(&sim.mu);
    r = sim_submit(c->ctx, h, op);
    sim_op_put(op);
    return r;
}

SIM_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuLaunchKernel", SIM_NEED_CTX);
    if (r == CUDA_SUCCESS)
        r = launch(&c, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                   kernelParams, extra);
    return sim_leave(&c, r);
}

SIM_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuLaunchKernelEx", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!config || (config->numAttrs && !config->attrs))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    /* Attributes (cooperative, cluster shape, priorities...) change scheduling, not results here. */
    r = launch(&c, f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
               config->blockDimZ, config->sharedMemBytes, config->hStream, kernelParams, extra);
    return sim_leave(&c, r);
}

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

#include "gpucr/modfile.h"
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

/* A module-scope variable in global or constant memory: device memory of its module's (sim_image.gsize). */
typedef struct sim_global {
    char *name;
    size_t off, size;    /* in the module's block of globals */
    unsigned char *init; /* its initializer's bytes, or NULL (zeros) */
    bool is_const;
} sim_global;

typedef struct sim_image {
    sim_entry *e;
    unsigned n;
    sim_global *g;
    unsigned ng;
    size_t gsize;      /* the globals' block */
    size_t const_size; /* of which .const: CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES */
    int ptx_version;   /* .target sm_XY as XY */
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
    for (unsigned i = 0; i < img->ng; i++) {
        free(img->g[i].name);
        free(img->g[i].init);
    }
    free(img->g);
    img->g = NULL;
    img->ng = 0;
}

static bool is_float_type(const char *t) { return t[1] == 'f'; }

/* One initializer value of elem bytes into out: integers (decimal, 0x, 0b, octal), PTX's exact floats
 * (0fXXXXXXXX, 0dXXXXXXXXXXXXXXXX), decimal floats. */
static bool init_value(const char *tok, bool neg, const char *type, size_t elem, unsigned char *out) {
    char *end;
    if ((tok[0] == '0') && (tok[1] == 'f' || tok[1] == 'F' || tok[1] == 'd' || tok[1] == 'D') && tok[2]) {
        unsigned long long bits = strtoull(tok + 2, &end, 16);
        if (*end)
            return false;
        if (neg)
            bits ^= (tok[1] == 'f' || tok[1] == 'F') ? 0x80000000ull : 0x8000000000000000ull;
        if ((tok[1] == 'f' || tok[1] == 'F') && elem == 4) {
            uint32_t b = (uint32_t)bits;
            memcpy(out, &b, 4);
            return true;
        }
        if ((tok[1] == 'd' || tok[1] == 'D') && elem == 8) {
            memcpy(out, &bits, 8);
            return true;
        }
        return false;
    }
    if (is_float_type(type)) {
        double d = strtod(tok, &end);
        if (*end)
            return false;
        if (neg)
            d = -d;
        if (elem == 4) {
            float f = (float)d;
            memcpy(out, &f, 4);
        } else if (elem == 8) {
            memcpy(out, &d, 8);
        } else {
            return false; /* half precision initializers: not parsed */
        }
        return true;
    }
    const char *t = tok;
    int base = 0;
    if (t[0] == '0' && (t[1] == 'b' || t[1] == 'B')) {
        base = 2;
        t += 2;
    }
    unsigned long long v = strtoull(t, &end, base);
    if (*end == 'U' || *end == 'u')
        end++;
    if (*end || end == t)
        return false;
    if (neg)
        v = (unsigned long long)(-(long long)v);
    memcpy(out, &v, elem); /* little-endian: the low elem bytes */
    return true;
}

/*
 * After "=": an initializer, a value or a brace list (nested for arrays of arrays, flattened), up to the
 * ';'. Values go into buf (cap bytes) at elem bytes each; *count says how many. false: not understood.
 */
static bool parse_init(lexer *L, const char *type, size_t elem, unsigned char *buf, size_t cap, size_t *count) {
    int depth = 0;
    *count = 0;
    for (;;) {
        lex(L);
        if (punct(L, '{')) {
            depth++;
        } else if (punct(L, '}')) {
            if (--depth < 0)
                return false;
        } else if (punct(L, ',')) {
        } else if (punct(L, ';')) {
            return depth == 0;
        } else {
            bool neg = false;
            if (punct(L, '-')) {
                neg = true;
                lex(L);
            }
            if (L->kind != T_WORD)
                return false;
            if (buf) {
                if ((*count + 1) * elem > cap || !init_value(L->tok, neg, type, elem, buf + *count * elem))
                    return false;
            }
            (*count)++;
        }
    }
}

/* After .global or .const at module scope: a variable. Its storage is laid out in the module's block. */
static bool parse_global(lexer *L, sim_image *img, bool is_const, bool external, unsigned *gcap) {
    size_t align = 0, elem = 0, vec = 1;
    char type[sizeof L->tok] = "";
    for (;;) {
        if (lex(L) != T_WORD)
            return false;
        if (L->tok[0] != '.')
            break; /* the variable's name */
        size_t ts = type_size(L->tok);
        if (ts) {
            elem = ts;
            snprintf(type, sizeof type, "%s", L->tok);
        } else if (strcmp(L->tok, ".align") == 0) {
            if (lex(L) != T_WORD || !parse_uint(L->tok, &align) || align == 0 || (align & (align - 1)))
                return false;
        } else if (strcmp(L->tok, ".v2") == 0 || strcmp(L->tok, ".v4") == 0) {
            vec = L->tok[2] - '0';
        } else {
            /* texture, surface and sampler references, and anything else: no storage the simulator gives */
            elem = 0;
            type[0] = 0;
            while (L->kind != T_END && L->kind != T_ERR && !punct(L, ';'))
                lex(L);
            return L->kind != T_ERR;
        }
    }
    if (!elem)
        return false;
    char name[sizeof L->tok];
    memcpy(name, L->tok, sizeof name);
    elem *= vec;
    size_t count = 1;
    bool open = false;
    lex(L);
    while (punct(L, '[')) {
        size_t dim = 0;
        lex(L);
        if (punct(L, ']')) {
            open = true; /* its size is its initializer's */
        } else {
            if (L->kind != T_WORD || !parse_uint(L->tok, &dim) || dim == 0 || (count * dim) / dim != count)
                return false;
            count *= dim;
            if (lex(L) != T_PUNCT || !punct(L, ']'))
                return false;
        }
        lex(L);
    }
    unsigned char *init = NULL;
    if (punct(L, '=')) {
        lexer save = *L;
        size_t n = 0;
        if (!parse_init(L, type, elem, NULL, 0, &n))
            return false;
        if (open)
            count = n ? n : 1;
        if (n > count || (elem && count > SIZE_MAX / elem))
            return false;
        init = calloc(count, elem);
        if (!init)
            return false;
        *L = save;
        if (!parse_init(L, type, elem, init, count * elem, &n)) {
            /* valid PTX the simulator's initializer parser does not take (addresses of other variables...) */
            sim_warn("PTX variable %s: its initializer is not understood by the simulator; it starts as zeros", name);
            memset(init, 0, count * elem);
        }
    } else if (!punct(L, ';')) {
        return false;
    }
    /* .extern: the driver gives a module's undefined variable storage of its own (measured) */
    (void)external;
    if (open && !init)
        return true; /* no size: nothing to give storage */
    if (count > SIZE_MAX / elem) {
        free(init);
        return false;
    }
    if (img->ng == *gcap) {
        unsigned c = *gcap ? *gcap * 2 : 8;
        sim_global *v = realloc(img->g, c * sizeof *v);
        if (!v) {
            free(init);
            return false;
        }
        img->g = v;
        *gcap = c;
    }
    sim_global *g = &img->g[img->ng];
    size_t a = align > elem ? align : elem;
    g->off = sim_align_up(img->gsize, a);
    g->size = elem * count;
    g->init = init;
    g->is_const = is_const;
    g->name = strdup(name);
    if (!g->name) {
        free(init);
        return false;
    }
    img->ng++;
    img->gsize = g->off + g->size;
    if (is_const)
        img->const_size += g->size;
    return true;
}

static CUresult ptx_parse(const char *text, sim_image *img) {
    memset(img, 0, sizeof *img);
    lexer L = {.p = text};
    /* text that does not start with .version is not taken for PTX at all (measured) */
    if (lex(&L) != T_WORD || strcmp(L.tok, ".version") != 0)
        return CUDA_ERROR_INVALID_IMAGE;
    if (lex(&L) != T_WORD)
        return CUDA_ERROR_INVALID_PTX;
    bool target = false, external = false;
    int depth = 0;
    unsigned cap = 0, gcap = 0;
    for (;;) {
        lex(&L);
        if (L.kind == T_END)
            break;
        if (L.kind == T_ERR)
            goto bad;
        if (depth == 0 && L.kind == T_WORD && strcmp(L.tok, ".extern") == 0) {
            external = true;
            continue;
        }
        if (depth == 0 && L.kind == T_WORD && (strcmp(L.tok, ".global") == 0 || strcmp(L.tok, ".const") == 0)) {
            if (!parse_global(&L, img, L.tok[1] == 'c', external, &gcap))
                goto bad;
            external = false;
            continue;
        }
        if (L.kind == T_WORD && L.tok[0] == '.' && strcmp(L.tok, ".visible") != 0 && strcmp(L.tok, ".weak") != 0)
            external = false; /* .extern qualifies only the declaration it begins */
        if (punct(&L, '{')) {
            depth++;
        } else if (punct(&L, '}')) {
            if (--depth < 0)
                goto bad;
        } else if (depth == 0 && L.kind == T_WORD && strcmp(L.tok, ".target") == 0) {
            target = true;
            /* CU_FUNC_ATTRIBUTE_PTX_VERSION is the virtual architecture compiled for (measured: sm_75 gives 75) */
            if (lex(&L) == T_WORD && strncmp(L.tok, "sm_", 3) == 0)
                img->ptx_version = (int)strtol(L.tok + 3, NULL, 10);
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

/* PTX text, or a fat binary's PTX (sim_fatbin.c); machine code is an image the simulator cannot run. */
static CUresult image_load(const void *image, sim_image *img) {
    if (!image)
        return CUDA_ERROR_INVALID_VALUE;
    const char *text;
    char *owned;
    CUresult r = sim_image_text(image, &text, &owned);
    if (r != CUDA_SUCCESS)
        return r;
    r = ptx_parse(text, img);
    free(owned);
    if (r != CUDA_SUCCESS)
        return r;
    for (unsigned i = 0; i < img->n; i++)
        img->e[i].fn = reg_lookup(img->e[i].name);
    return CUDA_SUCCESS;
}

/* ---- modules ---- */

struct sim_module;

/* Dynamic shared memory: what a launch may ask for by default, and the most a function may be set to allow
 * (an H100's CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN). */
#define SIM_SHMEM_DEFAULT 49152
#define SIM_SHMEM_OPTIN 232448

typedef struct sim_func {
    uint32_t magic;
    const sim_entry *entry;
    struct sim_module *mod; /* cuFuncGetModule; NULL for a library kernel's function (see there) */
    const sim_image *img;   /* its module's or library's image */
    int max_dyn_shmem;      /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (mu) */
    int carveout;           /* CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT (mu) */
    CUfunc_cache cache;     /* cuFuncSetCacheConfig (mu) */
} sim_func;

static void func_init(sim_func *f, const sim_entry *e, struct sim_module *mod, const sim_image *img) {
    f->magic = 0x46554e43u;
    f->entry = e;
    f->mod = mod;
    f->img = img;
    f->max_dyn_shmem = SIM_SHMEM_DEFAULT;
    f->carveout = -1;
    f->cache = CU_FUNC_CACHE_PREFER_NONE;
}

typedef struct sim_module {
    uint32_t magic;
    sim_ctx *ctx;
    sim_image img;
    sim_func *funcs;
    uint64_t *gaddr, *gid; /* each global's memory in ctx and its allocation's id (NULL: no globals) */
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
    /* Each global's memory per device, made in the context that first asks (cuLibraryGetGlobal), with its
     * allocation's id: memory whose context died since is made again. */
    uint64_t *gaddr[SIM_MAX_DEVICES], *gid[SIM_MAX_DEVICES];
} sim_library;

/* Frees globals' memory made by globals_make (not under mu: memlock comes first). */
static void globals_free(unsigned ng, uint64_t *addr, uint64_t *id) {
    for (unsigned i = 0; addr && i < ng; i++)
        if (id[i])
            sim_mem_free_if(addr[i], id[i]); /* a context that died took it already */
    free(addr);
    free(id);
}

/*
 * Device memory in ctx for each of img's globals, with their initial values: one allocation each, as the driver
 * gives each variable its own address range (measured: cuMemGetAddressRange of a global is that variable).
 */
static CUresult globals_make(sim_ctx *ctx, const sim_image *img, uint64_t **addr, uint64_t **id) {
    *addr = *id = NULL;
    if (!img->ng)
        return CUDA_SUCCESS;
    uint64_t *a = calloc(img->ng, sizeof *a), *d = calloc(img->ng, sizeof *d);
    if (!a || !d) {
        free(a);
        free(d);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (unsigned i = 0; i < img->ng; i++) {
        CUdeviceptr p = 0;
        CUresult r = sim_mem_alloc_impl(ctx, &p, img->g[i].size ? img->g[i].size : 1);
        if (r != CUDA_SUCCESS) {
            globals_free(i, a, d);
            return r;
        }
        /* a new allocation reads as zeros; its pages are the process's own mapping of the device's memfd */
        if (img->g[i].init)
            memcpy((void *)(uintptr_t)p, img->g[i].init, img->g[i].size);
        a[i] = p;
        d[i] = sim_mem_alloc_id(p);
    }
    *addr = a;
    *id = d;
    return CUDA_SUCCESS;
}

/* Whether globals made by globals_make are still there (their context lived on). */
static bool globals_live(unsigned ng, const uint64_t *addr, const uint64_t *id) {
    return ng == 0 || (addr && sim_mem_alloc_id(addr[0]) == id[0]);
}

/* A global by name; an entry's name is an invalid value to the driver, not a missing global (measured). */
static CUresult global_find(const sim_image *img, const uint64_t *addr, const char *name, CUdeviceptr *dptr,
                            size_t *bytes) {
    for (unsigned i = 0; i < img->ng; i++)
        if (strcmp(img->g[i].name, name) == 0) {
            if (dptr)
                *dptr = addr ? addr[i] : 0;
            if (bytes)
                *bytes = img->g[i].size;
            return CUDA_SUCCESS;
        }
    for (unsigned i = 0; i < img->n; i++)
        if (strcmp(img->e[i].name, name) == 0)
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_FOUND;
}

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
        if (m->ctx == ctx) {
            free(m->gaddr); /* the memory itself goes with the context's */
            free(m->gid);
            module_free_locked(m);
        }
        m = next;
    }
}

static CUresult module_load(const char *name, CUmodule *module, const void *image) {
    sim_call c;
    CUresult r = sim_enter(&c, name, SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!module)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_module *m = calloc(1, sizeof *m);
    if (!m)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    r = image_load(image, &m->img);
    if (r == CUDA_SUCCESS && (r = globals_make(c.ctx, &m->img, &m->gaddr, &m->gid)) != CUDA_SUCCESS)
        image_free(&m->img);
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
        func_init(&m->funcs[i], &m->img.e[i], m, &m->img);
        ok = sim_handle_add(&m->funcs[i], SIM_H_FUNC) == 0;
    }
    m->next = modules;
    modules = m;
    uint64_t *gaddr = m->gaddr, *gid = m->gid;
    unsigned ng = m->img.ng;
    if (!ok) {
        module_free_locked(m);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        *module = (CUmodule)m;
    }
    pthread_mutex_unlock(&sim.mu);
    if (!ok)
        globals_free(ng, gaddr, gid);
    return sim_leave(&c, r);
}

SIM_API CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    return module_load("cuModuleLoadData", module, image);
}

/* The largest module file the simulator reads: a driver loads larger ones, but no test has one. */
#define SIM_MAX_MODULE_FILE (256u << 20)

SIM_API CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    void *image = NULL;
    CUresult r = gc_read_module_file(fname, SIM_MAX_MODULE_FILE, &image);
    if (r != CUDA_SUCCESS)
        return r;
    r = module_load("cuModuleLoad", module, image);
    free(image);
    return r;
}

SIM_API CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin) {
    return module_load("cuModuleLoadFatBinary", module, fatCubin);
}

SIM_API CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuModuleGetGlobal_v2", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!name || (!dptr && !bytes))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    sim_module *m = (sim_module *)hmod;
    if (!sim_handle_is(m, SIM_H_MODULE))
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        r = global_find(&m->img, m->gaddr, name, dptr, bytes);
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
    uint64_t *gaddr = NULL, *gid = NULL;
    unsigned ng = 0;
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(hmod, SIM_H_MODULE)) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        gaddr = ((sim_module *)hmod)->gaddr;
        gid = ((sim_module *)hmod)->gid;
        ng = ((sim_module *)hmod)->img.ng;
        module_free_locked((sim_module *)hmod);
    }
    pthread_mutex_unlock(&sim.mu);
    globals_free(ng, gaddr, gid); /* after mu: memlock comes first */
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
        func_init(&k->func, k->entry, NULL, &l->img);
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
    uint64_t *gaddr[SIM_MAX_DEVICES], *gid[SIM_MAX_DEVICES];
    unsigned ng = 0;
    memset(gaddr, 0, sizeof gaddr);
    memset(gid, 0, sizeof gid);
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(library, SIM_H_LIBRARY)) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        memcpy(gaddr, ((sim_library *)library)->gaddr, sizeof gaddr);
        memcpy(gid, ((sim_library *)library)->gid, sizeof gid);
        ng = ((sim_library *)library)->img.ng;
        library_free_locked((sim_library *)library);
    }
    pthread_mutex_unlock(&sim.mu);
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        globals_free(ng, gaddr[d], gid[d]);
    return sim_leave(&c, r);
}

/* A library's global in the current context's memory, made there at the first ask (libraries belong to no
 * context; their globals do, one copy per device, as on the driver). */
SIM_API CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuLibraryGetGlobal", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!name || (!dptr && !bytes))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    int dev = c.ctx->dev;
    pthread_mutex_lock(&sim.mu);
    sim_library *l = (sim_library *)library;
    if (!sim_handle_is(l, SIM_H_LIBRARY))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (l->err)
        r = l->err;
    else
        r = global_find(&l->img, NULL, name, NULL, NULL);
    unsigned ng = r == CUDA_SUCCESS ? l->img.ng : 0;
    uint64_t *addr = r == CUDA_SUCCESS ? l->gaddr[dev] : NULL, *id = r == CUDA_SUCCESS ? l->gid[dev] : NULL;
    bool live = r == CUDA_SUCCESS && addr && globals_live(ng, addr, id);
    pthread_mutex_unlock(&sim.mu);
    if (r == CUDA_SUCCESS && !live) {
        /* made outside mu (memory first) */
        uint64_t *na, *nid;
        r = globals_make(c.ctx, &l->img, &na, &nid);
        if (r == CUDA_SUCCESS) {
            uint64_t *olda = NULL, *oldid = NULL;
            pthread_mutex_lock(&sim.mu);
            if (!sim_handle_is(l, SIM_H_LIBRARY)) {
                r = CUDA_ERROR_INVALID_HANDLE; /* unloaded meanwhile */
            } else if (l->gaddr[dev] != addr) {
                olda = na; /* another thread made them first: these go */
                oldid = nid;
            } else {
                olda = l->gaddr[dev]; /* of a context that died: only the arrays are left */
                oldid = l->gid[dev];
                l->gaddr[dev] = na;
                l->gid[dev] = nid;
                na = nid = NULL;
            }
            pthread_mutex_unlock(&sim.mu);
            if (r != CUDA_SUCCESS)
                globals_free(ng, na, nid);
            else
                globals_free(ng, olda, oldid);
        }
    }
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&sim.mu);
        if (sim_handle_is(l, SIM_H_LIBRARY))
            r = global_find(&l->img, l->gaddr[dev], name, dptr, bytes);
        else
            r = CUDA_ERROR_INVALID_HANDLE;
        pthread_mutex_unlock(&sim.mu);
    }
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

/* ---- function attributes and occupancy ---- */

/* A function, or a kernel launched as one (its function): mu held. */
static sim_func *func_locked(const void *h) {
    int t = sim_handle_type(h);
    return t == SIM_H_FUNC ? (sim_func *)h : t == SIM_H_KERNEL ? &((sim_kernel *)h)->func : NULL;
}

/* A function for the attribute and occupancy calls, which take no CUkernel for one (measured:
 * CUDA_ERROR_INVALID_HANDLE): mu held. */
static sim_func *func_only_locked(const void *h) { return sim_handle_is(h, SIM_H_FUNC) ? (sim_func *)h : NULL; }

/* What the simulator says of a function's code, which it does not compile: no static shared or local memory,
 * a fixed register count; the binary is the device's (compute capability 9.0), as a JIT-compiled PTX's is. */
#define SIM_FUNC_REGS 32 /* what occupancy is computed with: 16 blocks of 128 threads, as a small kernel's */
#define SIM_BINARY_VERSION 90

SIM_API CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuFuncGetAttribute", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!pi)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    const sim_func *f = func_only_locked(hfunc);
    int v = 0;
    if (!f) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        switch (attrib) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
        case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: v = 0; break;
        case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: v = (int)f->img->const_size; break;
        case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: v = 0; break;
        case CU_FUNC_ATTRIBUTE_NUM_REGS: v = SIM_FUNC_REGS; break;
        case CU_FUNC_ATTRIBUTE_PTX_VERSION: v = f->img->ptx_version; break;
        case CU_FUNC_ATTRIBUTE_BINARY_VERSION: v = SIM_BINARY_VERSION; break;
        case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: v = 0; break;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: v = f->max_dyn_shmem; break;
        case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: v = f->carveout; break;
        case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
        case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: v = 0; break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&sim.mu);
    if (r == CUDA_SUCCESS)
        *pi = v;
    return sim_leave(&c, r);
}

SIM_API CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuFuncSetAttribute", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    pthread_mutex_lock(&sim.mu);
    sim_func *f = func_only_locked(hfunc);
    if (!f) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        switch (attrib) {
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            if (value < 0 || value > SIM_SHMEM_OPTIN)
                r = CUDA_ERROR_INVALID_VALUE;
            else
                f->max_dyn_shmem = value;
            break;
        case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
            if (value < -1 || value > 100)
                r = CUDA_ERROR_INVALID_VALUE;
            else
                f->carveout = value;
            break;
        case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
        case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
            /* thread block clusters are not simulated */
            r = CUDA_ERROR_NOT_SUPPORTED;
            break;
        default: r = CUDA_ERROR_INVALID_VALUE; /* read-only, or no attribute */
        }
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuFuncSetCacheConfig", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if ((unsigned)config > CU_FUNC_CACHE_PREFER_EQUAL)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    sim_func *f = func_only_locked(hfunc);
    if (!f)
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        f->cache = config; /* a preference: nothing the simulator's kernels do changes with it */
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

/* An H100's streaming multiprocessor: blocks, threads (warps), registers and shared memory it holds at once. */
#define SM_BLOCKS 32
#define SM_WARPS 64
#define SM_REGS 65536
#define SM_SHMEM 233472
#define SM_SHMEM_RESERVED 1024 /* per block, CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK */

static CUresult occupancy(const char *name, int *numBlocks, CUfunction func, int blockSize, size_t dyn,
                          unsigned flags) {
    sim_call c;
    CUresult r = sim_enter(&c, name, SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!numBlocks || blockSize <= 0 || (flags & ~(unsigned)CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    const sim_func *f = func_only_locked(func);
    int maxdyn = f ? f->max_dyn_shmem : 0;
    pthread_mutex_unlock(&sim.mu);
    if (!f)
        return sim_leave(&c, CUDA_ERROR_INVALID_HANDLE);
    int n = 0;
    if (blockSize <= 1024 && dyn <= (size_t)maxdyn) {
        int warps = (blockSize + 31) / 32;
        n = SM_BLOCKS;
        if (SM_WARPS / warps < n)
            n = SM_WARPS / warps;
        if (SM_REGS / (SIM_FUNC_REGS * warps * 32) < n)
            n = SM_REGS / (SIM_FUNC_REGS * warps * 32);
        if (dyn && (int)(SM_SHMEM / (dyn + SM_SHMEM_RESERVED)) < n)
            n = (int)(SM_SHMEM / (dyn + SM_SHMEM_RESERVED));
    }
    *numBlocks = n; /* a block the function cannot run: 0 blocks fit */
    return sim_leave(&c, CUDA_SUCCESS);
}

SIM_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                             size_t dynamicSMemSize) {
    return occupancy("cuOccupancyMaxActiveBlocksPerMultiprocessor", numBlocks, func, blockSize, dynamicSMemSize, 0);
}

SIM_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                                      size_t dynamicSMemSize, unsigned int flags) {
    return occupancy("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", numBlocks, func, blockSize,
                     dynamicSMemSize, flags);
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
        by > 1024 || bz > 64 || (uint64_t)bx * by * bz > 1024 || shared > SIM_SHMEM_OPTIN)
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
    const sim_func *sf = func_locked(f);
    const sim_entry *e = sf ? sf->entry : NULL;
    if (!e) {
        pthread_mutex_unlock(&sim.mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    /* more dynamic shared memory than the function allows (48 KiB unless cuFuncSetAttribute raised it) */
    if ((int)shared > sf->max_dyn_shmem) {
        pthread_mutex_unlock(&sim.mu);
        return CUDA_ERROR_INVALID_VALUE;
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

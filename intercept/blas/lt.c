/*
 * Served mode's cuBLASLt (libcublasLt.so.13; common.h). Descriptors, layouts
 * and preferences are virtual ids made asynchronously (PyTorch makes and
 * drops them around every matrix product), each keeping the attributes set
 * on it for a new worker; the heuristic is the one synchronous call of a
 * product. A cuBLAS handle is a cuBLASLt handle too, as PyTorch uses it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define LIB "cuBLASLt"

#define LT_ATTRS 16
typedef struct {
    uint32_t attr, size;
    uint8_t v[SV_LT_ATTR_MAX];
} lt_attr;

/* A descriptor's, layout's or preference's record (its kind's data): its creation's arguments, its attributes. */
typedef struct {
    pthread_mutex_t mu;
    int64_t a, b, c, d;
    uint32_t n;
    lt_attr at[LT_ATTRS];
} lt_obj;

/* A handle argument as a record names it: a cuBLASLt handle's id, or a cuBLAS handle's with SV_LT_FROM_BLAS. */
static bool handle_arg(const struct sv_ext *x, const void *h, uint32_t *v) {
    uint32_t id = x->id_of(SV_K_LT, h);
    if (id) {
        *v = id;
        return true;
    }
    id = x->id_of(SV_K_BLAS, h);
    *v = id | SV_LT_FROM_BLAS;
    return id != 0;
}

static lt_obj *obj_of(const struct sv_ext *x, unsigned kind, const void *h, uint32_t *id) {
    *id = x->id_of(kind, h);
    return *id ? x->id_data(kind, *id) : NULL;
}

/* The attribute's value as set (its bytes into out, up to cap), or false: never set. */
static bool attr_get(lt_obj *o, uint32_t attr, void *out, size_t cap) {
    bool got = false;
    pthread_mutex_lock(&o->mu);
    for (uint32_t i = 0; i < o->n; i++)
        if (o->at[i].attr == attr) {
            memcpy(out, o->at[i].v, o->at[i].size < cap ? o->at[i].size : cap);
            got = true;
        }
    pthread_mutex_unlock(&o->mu);
    return got;
}

static cublasStatus_t create_in_worker(const struct sv_ext *x, unsigned kind, uint32_t id, const lt_obj *o) {
    struct sv_lt_obj q = {kind, id, o->a, o->b, o->c, o->d};
    return bl_async(x, SV_OP_LT_OBJ_CREATE, &q, sizeof q, SV_EXT_NO_STREAM);
}

static cublasStatus_t set_in_worker(const struct sv_ext *x, unsigned kind, uint32_t id, const lt_attr *a) {
    struct sv_lt_attr q;
    memset(&q, 0, sizeof q);
    q.kind = kind, q.id = id, q.attr = a->attr, q.size = a->size;
    memcpy(q.value, a->v, a->size);
    return bl_async(x, SV_OP_LT_OBJ_SET, &q, sizeof q, SV_EXT_NO_STREAM);
}

static cublasStatus_t lt_create_in_worker(const struct sv_ext *x, uint32_t id) {
    struct sv_id_rec q = {id, 0};
    return bl_sync(x, SV_OP_LT_CREATE, &q, sizeof q, NULL, 0, NULL);
}

/* A new worker: the library again, its handles, then each descriptor, layout and preference with its attributes. */
static void heur_forget(void);

static CUresult replay(void) {
    heur_forget(); /* the new worker may run on another GPU */
    bool had;
    if (bl_reload(BL_CUBLASLT, &had) != CUBLAS_STATUS_SUCCESS)
        return CUDA_ERROR_NOT_INITIALIZED;
    const struct sv_ext *x = bl_ext();
    if (!had || !x)
        return CUDA_SUCCESS;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (uint32_t id = 1, end = x->id_end(SV_K_LT); id < end && st == CUBLAS_STATUS_SUCCESS; id++)
        if (x->id_live(SV_K_LT, id))
            st = lt_create_in_worker(x, id);
    static const unsigned kinds[] = {SV_K_LT_DESC, SV_K_LT_LAYOUT, SV_K_LT_PREF};
    for (unsigned k = 0; k < 3 && st == CUBLAS_STATUS_SUCCESS; k++)
        for (uint32_t id = 1, end = x->id_end(kinds[k]); id < end && st == CUBLAS_STATUS_SUCCESS; id++) {
            lt_obj *o = x->id_live(kinds[k], id) ? x->id_data(kinds[k], id) : NULL;
            if (!o)
                continue;
            st = create_in_worker(x, kinds[k], id, o);
            pthread_mutex_lock(&o->mu);
            for (uint32_t i = 0; i < o->n && st == CUBLAS_STATUS_SUCCESS; i++)
                st = set_in_worker(x, kinds[k], id, &o->at[i]);
            pthread_mutex_unlock(&o->mu);
        }
    if (st != CUBLAS_STATUS_SUCCESS) {
        x->warn("served mode: the new worker could not make the process's cuBLASLt objects again: %s",
                bl_status_name(st));
        return CUDA_ERROR_UNKNOWN;
    }
    return CUDA_SUCCESS;
}

static cublasStatus_t ready(const struct sv_ext **x) {
    cublasStatus_t st = bl_ready(BL_CUBLASLT, x);
    if (st == CUBLAS_STATUS_SUCCESS)
        (*x)->on_replay(replay);
    return st;
}

BL_API cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (!lightHandle)
        return CUBLAS_STATUS_INVALID_VALUE;
    const struct sv_ext *x;
    cublasStatus_t st = ready(&x);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    uint32_t id = x->id_new(SV_K_LT);
    if (!id)
        return CUBLAS_STATUS_ALLOC_FAILED;
    if ((st = lt_create_in_worker(x, id)) != CUBLAS_STATUS_SUCCESS) {
        x->id_drop(SV_K_LT, id);
        return st;
    }
    x->id_set(SV_K_LT, id, NULL);
    *lightHandle = (cublasLtHandle_t)x->handle(SV_K_LT, id);
    return CUBLAS_STATUS_SUCCESS;
}

/* A NULL handle is INVALID_VALUE here, where NVIDIA's other functions say NOT_INITIALIZED (measured); so is any
 * other that is not a live one. */
BL_API cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    const struct sv_ext *x = bl_ext();
    uint32_t id = x ? x->id_of(SV_K_LT, lightHandle) : 0;
    if (!id)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct sv_id_rec q = {id, 0};
    x->id_drop(SV_K_LT, id);
    return bl_async(x, SV_OP_LT_DESTROY, &q, sizeof q, SV_EXT_NO_STREAM);
}

BL_API size_t cublasLtGetVersion(void) {
    const struct sv_ext *x;
    return ready(&x) == CUBLAS_STATUS_SUCCESS ? (size_t)bl_info_of(BL_CUBLASLT)->version : 0;
}

BL_API size_t cublasLtGetCudartVersion(void) {
    const struct sv_ext *x;
    return ready(&x) == CUBLAS_STATUS_SUCCESS ? (size_t)bl_info_of(BL_CUBLASLT)->cudart_version : 0;
}

BL_API cublasStatus_t cublasLtGetProperty(libraryPropertyType type, int *value) {
    const struct sv_ext *x;
    if (!value)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = ready(&x);
    return st == CUBLAS_STATUS_SUCCESS ? bl_property(BL_CUBLASLT, type, value) : st;
}

BL_API const char *cublasLtGetStatusName(cublasStatus_t status) { return bl_status_name(status); }
BL_API const char *cublasLtGetStatusString(cublasStatus_t status) { return bl_status_string(status); }

/* ---- descriptors, layouts, preferences ---- */

static cublasStatus_t obj_create(unsigned kind, void **out, int64_t a, int64_t b, int64_t c, int64_t d) {
    if (!out)
        return CUBLAS_STATUS_INVALID_VALUE;
    const struct sv_ext *x;
    cublasStatus_t st = ready(&x);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    uint32_t id = x->id_new(kind);
    lt_obj *o = calloc(1, sizeof *o);
    if (!id || !o) {
        free(o);
        if (id)
            x->id_drop(kind, id);
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    pthread_mutex_init(&o->mu, NULL);
    o->a = a, o->b = b, o->c = c, o->d = d;
    if ((st = create_in_worker(x, kind, id, o)) != CUBLAS_STATUS_SUCCESS) {
        free(o);
        x->id_drop(kind, id);
        return st;
    }
    x->id_set(kind, id, o);
    *out = x->handle(kind, id);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t obj_destroy(unsigned kind, const void *h) {
    const struct sv_ext *x = bl_ext();
    uint32_t id = x ? x->id_of(kind, h) : 0;
    if (!id)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct sv_lt_obj q = {kind, id, 0, 0, 0, 0};
    x->id_drop(kind, id);
    return bl_async(x, SV_OP_LT_OBJ_DESTROY, &q, sizeof q, SV_EXT_NO_STREAM);
}

/*
 * The attributes of each kind, by size, that NVIDIA's library took: NVIDIA's refuses an attribute it does not have
 * and a size other than its type's (measured, blastest's lt_attributes), which only it knows. The first setting of
 * each is a probe (bl_probe), which it answers at the call; those it took are sent asynchronously from then on
 * (PyTorch sets a few of them around every product).
 */
#define LT_TOOK 256
static struct {
    pthread_mutex_t mu;
    uint32_t n;
    uint64_t key[LT_TOOK];
} TOOK = {.mu = PTHREAD_MUTEX_INITIALIZER};

static uint64_t took_key(unsigned kind, uint32_t attr, size_t size) {
    return (uint64_t)kind << 48 | (uint64_t)attr << 8 | (uint64_t)size; /* size <= SV_LT_ATTR_MAX */
}

static bool took(uint64_t key) {
    bool found = false;
    pthread_mutex_lock(&TOOK.mu);
    for (uint32_t i = 0; i < TOOK.n && !found; i++)
        found = TOOK.key[i] == key;
    pthread_mutex_unlock(&TOOK.mu);
    return found;
}

static void took_add(uint64_t key) {
    pthread_mutex_lock(&TOOK.mu);
    if (TOOK.n < LT_TOOK)
        TOOK.key[TOOK.n++] = key; /* past that many, each one a probe */
    pthread_mutex_unlock(&TOOK.mu);
}

/* An attribute's slot in o (index o->n: a new one), or LT_ATTRS: no room. o->mu held. */
static uint32_t attr_slot(const lt_obj *o, uint32_t attr) {
    uint32_t i = 0;
    while (i < o->n && o->at[i].attr != attr)
        i++;
    return i < LT_ATTRS ? i : LT_ATTRS;
}

/* A setting NVIDIA's library refuses is not kept (nor made again in a new worker). */
static cublasStatus_t obj_set(unsigned kind, const void *h, uint32_t attr, const void *buf, size_t size) {
    const struct sv_ext *x = bl_ext();
    uint32_t id = 0;
    lt_obj *o = x ? obj_of(x, kind, h, &id) : NULL;
    if (!o || !buf || size == 0 || size > SV_LT_ATTR_MAX)
        return CUBLAS_STATUS_INVALID_VALUE;
    lt_attr a = {attr, (uint32_t)size, {0}};
    memcpy(a.v, buf, size);
    pthread_mutex_lock(&o->mu);
    bool room = attr_slot(o, attr) < LT_ATTRS;
    pthread_mutex_unlock(&o->mu);
    if (!room) {
        static _Atomic int once;
        return bl_refuse(&once, LIB, "an attribute past the 16th of one object");
    }
    uint64_t key = took_key(kind, attr, size);
    cublasStatus_t st;
    if (took(key)) {
        st = set_in_worker(x, kind, id, &a);
    } else {
        struct sv_lt_attr q;
        memset(&q, 0, sizeof q);
        q.kind = kind, q.id = id, q.attr = a.attr, q.size = a.size;
        memcpy(q.value, a.v, a.size);
        st = bl_probe(x, SV_OP_LT_OBJ_SET, &q, sizeof q, SV_EXT_NO_STREAM);
        if (st != CUBLAS_STATUS_SUCCESS)
            return st;
        took_add(key);
    }
    pthread_mutex_lock(&o->mu);
    uint32_t i = attr_slot(o, attr);
    if (i < LT_ATTRS) {
        o->at[i] = a;
        if (i == o->n)
            o->n++;
    }
    pthread_mutex_unlock(&o->mu);
    return st;
}

static cublasStatus_t obj_get(unsigned kind, const void *h, uint32_t attr, void *buf, size_t size, size_t *written) {
    const struct sv_ext *x = bl_ext();
    uint32_t id = 0;
    lt_obj *o = x ? obj_of(x, kind, h, &id) : NULL;
    if (!o || size > SV_LT_ATTR_MAX || (size && !buf) || (!size && !written))
        return CUBLAS_STATUS_INVALID_VALUE;
    struct sv_lt_attr q;
    memset(&q, 0, sizeof q);
    q.kind = kind, q.id = id, q.attr = attr, q.size = (uint32_t)size;
    struct sv_lt_got g;
    memset(&g, 0, sizeof g);
    uint32_t len = 0;
    cublasStatus_t st = bl_sync(x, SV_OP_LT_OBJ_GET, &q, sizeof q, &g, sizeof g, &len);
    if (len < sizeof g)
        return st == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_INTERNAL_ERROR : st;
    if (written)
        *written = (size_t)g.written;
    if (st == CUBLAS_STATUS_SUCCESS && size)
        memcpy(buf, g.value, g.written < size ? (size_t)g.written : size);
    return st;
}

BL_API cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                               cudaDataType scaleType) {
    return obj_create(SV_K_LT_DESC, (void **)matmulDesc, computeType, scaleType, 0, 0);
}
BL_API cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    return obj_destroy(SV_K_LT_DESC, matmulDesc);
}
BL_API cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                     cublasLtMatmulDescAttributes_t attr, const void *buf,
                                                     size_t sizeInBytes) {
    return obj_set(SV_K_LT_DESC, matmulDesc, attr, buf, sizeInBytes);
}
BL_API cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                     cublasLtMatmulDescAttributes_t attr, void *buf, size_t sizeInBytes,
                                                     size_t *sizeWritten) {
    return obj_get(SV_K_LT_DESC, matmulDesc, attr, buf, sizeInBytes, sizeWritten);
}

BL_API cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
    return obj_create(SV_K_LT_LAYOUT, (void **)matLayout, type, (int64_t)rows, (int64_t)cols, ld);
}
BL_API cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    return obj_destroy(SV_K_LT_LAYOUT, matLayout);
}
BL_API cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                       cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                       size_t sizeInBytes) {
    return obj_set(SV_K_LT_LAYOUT, matLayout, attr, buf, sizeInBytes);
}
BL_API cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                       cublasLtMatrixLayoutAttribute_t attr, void *buf,
                                                       size_t sizeInBytes, size_t *sizeWritten) {
    return obj_get(SV_K_LT_LAYOUT, matLayout, attr, buf, sizeInBytes, sizeWritten);
}

BL_API cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    return obj_create(SV_K_LT_PREF, (void **)pref, 0, 0, 0, 0);
}
BL_API cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    return obj_destroy(SV_K_LT_PREF, pref);
}
BL_API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                           cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                           size_t sizeInBytes) {
    return obj_set(SV_K_LT_PREF, pref, attr, buf, sizeInBytes);
}
BL_API cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                           cublasLtMatmulPreferenceAttributes_t attr, void *buf,
                                                           size_t sizeInBytes, size_t *sizeWritten) {
    return obj_get(SV_K_LT_PREF, pref, attr, buf, sizeInBytes, sizeWritten);
}

/* ---- the heuristic and the product ---- */

/*
 * The heuristic's answers, kept: PyTorch asks it before every product, with descriptors made afresh, and a round
 * trip to the worker per product is the one synchronous call of a step's products. NVIDIA's heuristic answers the
 * same question the same way on the same library and GPU, so the question is the key: the descriptor's, layouts'
 * and preference's creation arguments and attributes, a device address among them by its alignment alone (the
 * bias's changes from call to call; its alignment may matter). A new worker (maybe on another GPU) forgets them.
 */
#define HEUR_SLOTS 256
#define HEUR_KEEP 4 /* results kept per question: PyTorch asks for 1 */
typedef struct {
    uint64_t hash;
    uint8_t *key;
    size_t key_len;
    int count;
    cublasLtMatmulHeuristicResult_t res[HEUR_KEEP];
} heur_entry;
static struct {
    pthread_mutex_t mu;
    heur_entry e[HEUR_SLOTS];
} HC = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void heur_forget(void) {
    pthread_mutex_lock(&HC.mu);
    for (unsigned i = 0; i < HEUR_SLOTS; i++) {
        free(HC.e[i].key);
        memset(&HC.e[i], 0, sizeof HC.e[i]);
    }
    pthread_mutex_unlock(&HC.mu);
}

typedef struct {
    uint8_t buf[4 * (sizeof(lt_obj) + 16)];
    size_t len;
    bool full;
} keybuf;

static void key_put(keybuf *k, const void *p, size_t n) {
    if (k->len + n > sizeof k->buf) {
        k->full = true;
        return;
    }
    memcpy(k->buf + k->len, p, n);
    k->len += n;
}

/* Whether a descriptor's attribute holds a device address. */
static bool pointer_attr(uint32_t a) {
    return a == CUBLASLT_MATMUL_DESC_BIAS_POINTER || a == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER ||
           (a >= CUBLASLT_MATMUL_DESC_A_SCALE_POINTER && a <= CUBLASLT_MATMUL_DESC_AMAX_D_POINTER) || a == 23 ||
           a == 24;
}

static void key_obj(keybuf *k, lt_obj *o, bool desc) {
    pthread_mutex_lock(&o->mu);
    int64_t args[4] = {o->a, o->b, o->c, o->d};
    key_put(k, args, sizeof args);
    key_put(k, &o->n, sizeof o->n);
    for (uint32_t i = 0; i < o->n; i++) {
        lt_attr a = o->at[i];
        if (desc && pointer_attr(a.attr) && a.size == sizeof(uint64_t)) {
            uint64_t p;
            memcpy(&p, a.v, sizeof p);
            uint64_t align = p ? (uint64_t)__builtin_ctzll(p) : 64;
            memcpy(a.v, &align, sizeof align);
        }
        key_put(k, &a.attr, sizeof a.attr);
        key_put(k, &a.size, sizeof a.size);
        key_put(k, a.v, a.size);
    }
    pthread_mutex_unlock(&o->mu);
}

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The kept answer to k (count results into out), or false. */
static bool heur_get(const keybuf *k, uint64_t h, int requested, cublasLtMatmulHeuristicResult_t *out, int *count) {
    bool hit = false;
    pthread_mutex_lock(&HC.mu);
    heur_entry *e = &HC.e[h % HEUR_SLOTS];
    if (e->key && e->hash == h && e->key_len == k->len && memcmp(e->key, k->buf, k->len) == 0) {
        *count = e->count < requested ? e->count : requested; /* requested is part of the key: e->count */
        memcpy(out, e->res, (size_t)*count * sizeof *out);
        hit = true;
    }
    pthread_mutex_unlock(&HC.mu);
    return hit;
}

static void heur_put(const keybuf *k, uint64_t h, const cublasLtMatmulHeuristicResult_t *res, int count) {
    if (count > HEUR_KEEP)
        return; /* more than is kept: asked again each time */
    uint8_t *key = malloc(k->len);
    if (!key)
        return;
    memcpy(key, k->buf, k->len);
    pthread_mutex_lock(&HC.mu);
    heur_entry *e = &HC.e[h % HEUR_SLOTS];
    free(e->key);
    e->hash = h;
    e->key = key;
    e->key_len = k->len;
    e->count = count;
    memcpy(e->res, res, (size_t)e->count * sizeof *res);
    pthread_mutex_unlock(&HC.mu);
}

BL_API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                                     cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                     cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                     cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                                     cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                     int *returnAlgoCount) {
    const struct sv_ext *x;
    cublasStatus_t st = ready(&x);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    struct sv_lt_heur_rec q;
    if (!handle_arg(x, lightHandle, &q.lt))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    q.desc = x->id_of(SV_K_LT_DESC, operationDesc);
    q.adesc = x->id_of(SV_K_LT_LAYOUT, Adesc);
    q.bdesc = x->id_of(SV_K_LT_LAYOUT, Bdesc);
    q.cdesc = x->id_of(SV_K_LT_LAYOUT, Cdesc);
    q.ddesc = x->id_of(SV_K_LT_LAYOUT, Ddesc);
    q.pref = x->id_of(SV_K_LT_PREF, preference);
    q.requested = requestedAlgoCount < (int)SV_LT_HEUR_MAX ? requestedAlgoCount : (int)SV_LT_HEUR_MAX;
    if (!q.desc || !q.adesc || !q.bdesc || !q.cdesc || !q.ddesc || !q.pref || requestedAlgoCount <= 0 ||
        !heuristicResultsArray || !returnAlgoCount)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* The question, as the key of the kept answers. */
    keybuf k;
    k.len = 0;
    k.full = false;
    key_put(&k, &q.requested, sizeof q.requested);
    lt_obj *objs[6] = {x->id_data(SV_K_LT_DESC, q.desc),    x->id_data(SV_K_LT_LAYOUT, q.adesc),
                       x->id_data(SV_K_LT_LAYOUT, q.bdesc), x->id_data(SV_K_LT_LAYOUT, q.cdesc),
                       x->id_data(SV_K_LT_LAYOUT, q.ddesc), x->id_data(SV_K_LT_PREF, q.pref)};
    for (unsigned i = 0; i < 6; i++)
        if (objs[i])
            key_obj(&k, objs[i], i == 0);
        else
            k.full = true; /* destroyed meanwhile: ask the worker, which says so */
    uint64_t hash = k.full ? 0 : fnv1a(k.buf, k.len);
    /* NVIDIA's leaves the count and the results as they were when it fails (measured) */
    int kept = 0;
    if (!k.full && heur_get(&k, hash, requestedAlgoCount, heuristicResultsArray, &kept)) {
        if (kept)
            *returnAlgoCount = kept;
        return kept ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    }
    uint8_t out[SV_REPLY_DATA];
    uint32_t len = 0;
    st = bl_sync(x, SV_OP_LT_HEURISTIC, &q, sizeof q, out, sizeof out, &len);
    struct sv_lt_heur h = {0, 0};
    if (len >= sizeof h)
        memcpy(&h, out, sizeof h);
    if (st != CUBLAS_STATUS_SUCCESS || h.count < 0 || h.count > q.requested ||
        len < sizeof h + (size_t)h.count * sizeof heuristicResultsArray[0])
        h.count = 0;
    memcpy(heuristicResultsArray, out + sizeof h, (size_t)h.count * sizeof heuristicResultsArray[0]);
    if (st == CUBLAS_STATUS_SUCCESS)
        *returnAlgoCount = h.count;
    if (!k.full && (st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_SUPPORTED))
        heur_put(&k, hash, heuristicResultsArray, h.count);
    return st;
}

/* The scalars' bytes and where they are, by the descriptor's scale type and pointer mode. */
static cublasStatus_t scalars(lt_obj *d, const void *alpha, const void *beta, struct sv_lt_matmul *q) {
    int32_t scale = (int32_t)d->b, mode = CUBLASLT_POINTER_MODE_HOST;
    attr_get(d, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &scale, sizeof scale);
    attr_get(d, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof mode);
    size_t n = bl_type_size((cudaDataType)scale);
    if (!n)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    switch (mode) {
    case CUBLASLT_POINTER_MODE_HOST: q->alpha_dev = 0, q->beta_dev = 0; break;
    case CUBLASLT_POINTER_MODE_DEVICE:
    case CUBLASLT_POINTER_MODE_DEVICE_VECTOR: q->alpha_dev = 1, q->beta_dev = 1; break;
    case CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO: q->alpha_dev = 1, q->beta_dev = 1; break;
    case CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST: q->alpha_dev = 1, q->beta_dev = 0; break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    uint64_t pa = (uint64_t)(uintptr_t)alpha, pb = (uint64_t)(uintptr_t)beta;
    if (q->alpha_dev)
        memcpy(q->alpha, &pa, sizeof pa);
    else if (alpha)
        memcpy(q->alpha, alpha, n);
    else
        return CUBLAS_STATUS_INVALID_VALUE;
    if (q->beta_dev)
        memcpy(q->beta, &pb, sizeof pb);
    else if (beta)
        memcpy(q->beta, beta, n);
    else
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

/* An object's creation and attributes as records under scratch id (served.h: SV_LT_SCRATCH), kept for the
 * capture of stream. */
static void note_object(const struct sv_ext *x, uint32_t stream, unsigned kind, uint32_t id, uint32_t scratch) {
    lt_obj *o = x->id_data(kind, id);
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    struct sv_lt_obj c = {kind, scratch, o->a, o->b, o->c, o->d};
    x->cap_note(stream, SV_OP_LT_OBJ_CREATE, &c, sizeof c);
    for (uint32_t i = 0; i < o->n; i++) {
        struct sv_lt_attr a;
        memset(&a, 0, sizeof a);
        a.kind = kind, a.id = scratch, a.attr = o->at[i].attr, a.size = o->at[i].size;
        memcpy(a.value, o->at[i].v, o->at[i].size);
        x->cap_note(stream, SV_OP_LT_OBJ_SET, &a, sizeof a);
    }
    pthread_mutex_unlock(&o->mu);
}

/*
 * A product made while its stream captures: what capturing it again in another worker takes is kept, not the
 * record sent, which names the application's descriptor and layouts (PyTorch destroys them right after the
 * product, and their ids are reused): the descriptor and layouts made under scratch ids, the product on those,
 * and their destruction.
 */
static void note_for_capture(const struct sv_ext *x, const struct sv_lt_matmul *q) {
    uint32_t dscr = sv_cap(SV_K_LT_DESC) - 1;
    uint32_t lay[4] = {q->adesc, q->bdesc, q->cdesc, q->ddesc}, scr[4];
    unsigned n = 0;
    note_object(x, q->stream, SV_K_LT_DESC, q->desc, dscr);
    for (unsigned i = 0; i < 4; i++) {
        unsigned j = 0;
        while (j < i && lay[j] != lay[i])
            j++;
        if (j < i) {
            scr[i] = scr[j]; /* the same layout twice (C and D, often): one object */
        } else {
            scr[i] = sv_cap(SV_K_LT_LAYOUT) - 1 - n++;
            note_object(x, q->stream, SV_K_LT_LAYOUT, lay[i], scr[i]);
        }
    }
    struct sv_lt_matmul m = *q;
    m.desc = dscr;
    m.adesc = scr[0], m.bdesc = scr[1], m.cdesc = scr[2], m.ddesc = scr[3];
    x->cap_note(q->stream, SV_OP_LT_MATMUL, &m, sizeof m);
    struct sv_lt_obj d = {SV_K_LT_DESC, dscr, 0, 0, 0, 0};
    x->cap_note(q->stream, SV_OP_LT_OBJ_DESTROY, &d, sizeof d);
    for (unsigned k = 0; k < n; k++) {
        struct sv_lt_obj l = {SV_K_LT_LAYOUT, sv_cap(SV_K_LT_LAYOUT) - 1 - k, 0, 0, 0, 0};
        x->cap_note(q->stream, SV_OP_LT_OBJ_DESTROY, &l, sizeof l);
    }
}

/* A layout's rows and columns, as made or set since. */
static void layout_dims(lt_obj *l, uint64_t *rows, uint64_t *cols) {
    *rows = (uint64_t)l->b;
    *cols = (uint64_t)l->c;
    attr_get(l, CUBLASLT_MATRIX_LAYOUT_ROWS, rows, sizeof *rows);
    attr_get(l, CUBLASLT_MATRIX_LAYOUT_COLS, cols, sizeof *cols);
}

/* Whether op(A) (m x k), op(B) (k x n), C and D (m x n) fit together, with operations N, T or C. */
static bool shapes_fit(lt_obj *d, lt_obj *a, lt_obj *b, lt_obj *c, lt_obj *dd) {
    int32_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    attr_get(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    attr_get(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T && ta != CUBLAS_OP_C) ||
        (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T && tb != CUBLAS_OP_C))
        return false;
    uint64_t ar, ac, br, bc, cr, cc, m, n;
    layout_dims(a, &ar, &ac);
    layout_dims(b, &br, &bc);
    layout_dims(c, &cr, &cc);
    layout_dims(dd, &m, &n);
    bool at = ta != CUBLAS_OP_N, bt = tb != CUBLAS_OP_N;
    uint64_t k = at ? ar : ac;
    return (at ? ac : ar) == m && (bt ? bc : br) == k && (bt ? br : bc) == n && cr == m && cc == n;
}

/*
 * The product, asynchronous: its failure comes back at the next synchronizing call. Shapes that do not fit,
 * which NVIDIA's refuses (INVALID_VALUE, measured), make it a probe (bl_probe) that NVIDIA's library answers at
 * the call.
 */
BL_API cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                                     const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                                     cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                                     cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                                     const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSizeInBytes,
                                     cudaStream_t stream) {
    const struct sv_ext *x;
    cublasStatus_t st = ready(&x);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    struct sv_lt_matmul q;
    memset(&q, 0, sizeof q);
    if (!handle_arg(x, lightHandle, &q.lt))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    lt_obj *d = obj_of(x, SV_K_LT_DESC, computeDesc, &q.desc);
    q.adesc = x->id_of(SV_K_LT_LAYOUT, Adesc);
    q.bdesc = x->id_of(SV_K_LT_LAYOUT, Bdesc);
    q.cdesc = x->id_of(SV_K_LT_LAYOUT, Cdesc);
    q.ddesc = x->id_of(SV_K_LT_LAYOUT, Ddesc);
    if (!d || !q.adesc || !q.bdesc || !q.cdesc || !q.ddesc || x->stream(stream, &q.stream) != CUDA_SUCCESS)
        return CUBLAS_STATUS_INVALID_VALUE;
    if ((st = scalars(d, alpha, beta, &q)) != CUBLAS_STATUS_SUCCESS)
        return st;
    q.a = (uint64_t)(uintptr_t)A, q.b = (uint64_t)(uintptr_t)B, q.c = (uint64_t)(uintptr_t)C;
    q.d = (uint64_t)(uintptr_t)D;
    q.workspace = (uint64_t)(uintptr_t)workspace;
    q.workspace_size = workspaceSizeInBytes;
    if (algo) {
        q.has_algo = 1;
        memcpy(q.algo, algo->data, sizeof q.algo);
    }
    lt_obj *la = x->id_data(SV_K_LT_LAYOUT, q.adesc), *lb = x->id_data(SV_K_LT_LAYOUT, q.bdesc);
    lt_obj *lc = x->id_data(SV_K_LT_LAYOUT, q.cdesc), *ld = x->id_data(SV_K_LT_LAYOUT, q.ddesc);
    bool probe = !la || !lb || !lc || !ld || !shapes_fit(d, la, lb, lc, ld);
    bl_ctx_current();
    bl_gate_enter();
    st = probe ? bl_probe(x, SV_OP_LT_MATMUL, &q, sizeof q, SV_EXT_NO_STREAM)
               : bl_async(x, SV_OP_LT_MATMUL, &q, sizeof q, SV_EXT_NO_STREAM);
    if (st == CUBLAS_STATUS_SUCCESS && x->capturing(q.stream))
        note_for_capture(x, &q);
    bl_gate_leave();
    return st;
}

/* ---- what is not forwarded yet ---- */

BL_REFUSED(LIB, cublasLtMatmulAlgoCheck)
BL_REFUSED(LIB, cublasLtMatmulAlgoInit)
BL_REFUSED(LIB, cublasLtMatmulAlgoGetIds)
BL_REFUSED(LIB, cublasLtMatmulAlgoConfigSetAttribute)
BL_REFUSED(LIB, cublasLtMatmulAlgoConfigGetAttribute)
BL_REFUSED(LIB, cublasLtMatmulAlgoCapGetAttribute)
BL_REFUSED(LIB, cublasLtMatmulDescInit_internal)
BL_REFUSED(LIB, cublasLtMatrixLayoutInit_internal)
BL_REFUSED(LIB, cublasLtMatmulPreferenceInit_internal)
BL_REFUSED(LIB, cublasLtMatrixTransform)
BL_REFUSED(LIB, cublasLtMatrixTransformDescCreate)
BL_REFUSED(LIB, cublasLtMatrixTransformDescDestroy)
BL_REFUSED(LIB, cublasLtMatrixTransformDescSetAttribute)
BL_REFUSED(LIB, cublasLtGroupedMatrixLayoutCreate)

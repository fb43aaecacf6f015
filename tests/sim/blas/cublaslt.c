/*
 * The simulated driver's cuBLASLt (libcublasLt.so.13): handles, matmul
 * descriptors, matrix layouts, preferences, the algorithm heuristic and
 * cublasLtMatmul, D = alpha * op(A) * op(B) + beta * C with the DEFAULT,
 * RELU, BIAS and RELU_BIAS epilogues, on float column-major matrices, in
 * batches, as a kernel on the caller's stream (simblas.h).
 *
 * Attributes are stored as the bytes of their documented type: a set or get
 * whose size is not that type's is CUBLAS_STATUS_INVALID_VALUE, and a get of
 * size 0 reports the size through sizeWritten, as cuBLASLt does. What the
 * library cannot compute (other types, orders, epilogues, pointer modes) is
 * CUBLAS_STATUS_NOT_SUPPORTED from the heuristic and from the matmul; shapes
 * that do not fit together are CUBLAS_STATUS_INVALID_VALUE.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "simblas.h"

/* Values of cublasLt.h that gpucr/cublas.h does not name. */
enum { ORDER_COL = 0 };      /* cublasLtOrder_t CUBLASLT_ORDER_COL */
enum { FILL_MODE_FULL = 2 }; /* cublasFillMode_t CUBLAS_FILL_MODE_FULL */
enum {
    DESC_EPILOGUE_AUX_SCALE_POINTER = 23, /* cublasLtMatmulDescAttributes_t, void * */
    DESC_EPILOGUE_AUX_AMAX_POINTER = 24,  /* void * */
};

/* The algorithm of every heuristic result: algo.data[0], the rest zero. */
#define SB_ALGO_ID 0x53494d424c41534cull /* "SIMBLASL" */

/* ---- attribute storage ----------------------------------------------------- */

#define SB_MAX_ATTRS 32

/* An object's attributes: each one the bytes of its type, sizes[attr] long (0: no such attribute). */
typedef struct sb_attrs {
    const unsigned char *sizes;
    size_t n;
    unsigned char v[SB_MAX_ATTRS][8];
} sb_attrs;

static cublasStatus_t attr_set(sb_attrs *a, int attr, const void *buf, size_t size) {
    if (attr < 0 || (size_t)attr >= a->n || !a->sizes[attr] || !buf || size != a->sizes[attr])
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(a->v[attr], buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t attr_get(const sb_attrs *a, int attr, void *buf, size_t size, size_t *written) {
    if (attr < 0 || (size_t)attr >= a->n || !a->sizes[attr])
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size == 0) {
        if (!written)
            return CUBLAS_STATUS_INVALID_VALUE;
        *written = a->sizes[attr];
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || size != a->sizes[attr])
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, a->v[attr], size);
    if (written)
        *written = size;
    return CUBLAS_STATUS_SUCCESS;
}

/* Typed access for the library itself (the attribute exists and has that size). */
static int32_t get_i32(const sb_attrs *a, int attr) {
    int32_t x;
    memcpy(&x, a->v[attr], sizeof x);
    return x;
}
static uint64_t get_u64(const sb_attrs *a, int attr) {
    uint64_t x;
    memcpy(&x, a->v[attr], sizeof x);
    return x;
}
static int64_t get_i64(const sb_attrs *a, int attr) {
    int64_t x;
    memcpy(&x, a->v[attr], sizeof x);
    return x;
}
static void put(sb_attrs *a, int attr, const void *x) { memcpy(a->v[attr], x, a->sizes[attr]); }
static void put_i32(sb_attrs *a, int attr, int32_t x) { put(a, attr, &x); }
static void put_u64(sb_attrs *a, int attr, uint64_t x) { put(a, attr, &x); }
static void put_i64(sb_attrs *a, int attr, int64_t x) { put(a, attr, &x); }

/* The types of cublasLt.h: int32_t / uint32_t enums, pointers and 64-bit values, FAST_ACCUM's int8_t. */
static const unsigned char desc_sizes[] = {
    [CUBLASLT_MATMUL_DESC_COMPUTE_TYPE] = 4,
    [CUBLASLT_MATMUL_DESC_SCALE_TYPE] = 4,
    [CUBLASLT_MATMUL_DESC_POINTER_MODE] = 4,
    [CUBLASLT_MATMUL_DESC_TRANSA] = 4,
    [CUBLASLT_MATMUL_DESC_TRANSB] = 4,
    [CUBLASLT_MATMUL_DESC_TRANSC] = 4,
    [CUBLASLT_MATMUL_DESC_FILL_MODE] = 4,
    [CUBLASLT_MATMUL_DESC_EPILOGUE] = 4,
    [CUBLASLT_MATMUL_DESC_BIAS_POINTER] = 8,
    [CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE] = 8,
    [CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER] = 8,
    [CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD] = 8,
    [CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE] = 8,
    [CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE] = 8,
    [CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET] = 4,
    [CUBLASLT_MATMUL_DESC_A_SCALE_POINTER] = 8,
    [CUBLASLT_MATMUL_DESC_B_SCALE_POINTER] = 8,
    [CUBLASLT_MATMUL_DESC_C_SCALE_POINTER] = 8,
    [CUBLASLT_MATMUL_DESC_D_SCALE_POINTER] = 8,
    [CUBLASLT_MATMUL_DESC_AMAX_D_POINTER] = 8,
    [CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE] = 4,
    [DESC_EPILOGUE_AUX_SCALE_POINTER] = 8,
    [DESC_EPILOGUE_AUX_AMAX_POINTER] = 8,
    [CUBLASLT_MATMUL_DESC_FAST_ACCUM] = 1,
    [CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE] = 4,
};

static const unsigned char layout_sizes[] = {
    [CUBLASLT_MATRIX_LAYOUT_TYPE] = 4,
    [CUBLASLT_MATRIX_LAYOUT_ORDER] = 4,
    [CUBLASLT_MATRIX_LAYOUT_ROWS] = 8,
    [CUBLASLT_MATRIX_LAYOUT_COLS] = 8,
    [CUBLASLT_MATRIX_LAYOUT_LD] = 8,
    [CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT] = 4,
    [CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET] = 8,
    [CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET] = 8,
};

/* MAX_WAVES_COUNT is a float; the rest uint32_t or uint64_t. */
static const unsigned char pref_sizes[] = {
    [CUBLASLT_MATMUL_PREF_SEARCH_MODE] = 4,
    [CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES] = 8,
    [CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK] = 4,
    [CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = 4,
    [CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES] = 4,
    [CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES] = 4,
    [CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES] = 4,
    [CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT] = 4,
    [CUBLASLT_MATMUL_PREF_IMPL_MASK] = 8,
};

_Static_assert(sizeof desc_sizes <= SB_MAX_ATTRS && sizeof layout_sizes <= SB_MAX_ATTRS &&
                   sizeof pref_sizes <= SB_MAX_ATTRS,
               "attribute tables fit sb_attrs");

static void attrs_init(sb_attrs *a, const unsigned char *sizes, size_t n) {
    memset(a, 0, sizeof *a);
    a->sizes = sizes;
    a->n = n;
}

/* A cuBLAS handle is a cuBLASLt handle too (PyTorch passes its cuBLAS handle as its cuBLASLt one, as NVIDIA's
 * libraries allow): both begin with their kernels, all that this library uses of a handle (cublas.c). */
struct cublasLtContext {
    sb_kernels k;
};
struct cublasLtMatmulDescOpaque_t {
    sb_attrs a;
};
struct cublasLtMatrixLayoutOpaque_t {
    sb_attrs a;
};
struct cublasLtMatmulPreferenceOpaque_t {
    sb_attrs a;
};

/* ---- library and handles ------------------------------------------------------ */

SB_API cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (!lightHandle)
        return CUBLAS_STATUS_INVALID_VALUE;
    *lightHandle = NULL;
    cublasLtHandle_t h = calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    /* A thread with no current context keeps none (measured): the handle's products make it current (sb_enter). */
    cublasStatus_t st = sb_kernels_load(&h->k, false);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(h);
        return st;
    }
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

/* NVIDIA's takes a NULL handle for an invalid value here (measured), where every other function of the library
 * says NOT_INITIALIZED. */
SB_API cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!lightHandle)
        return CUBLAS_STATUS_INVALID_VALUE;
    sb_kernels_unload(&lightHandle->k);
    free(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

SB_API size_t cublasLtGetVersion(void) { return SB_VERSION; }

SB_API size_t cublasLtGetCudartVersion(void) { return SB_CUDART_VERSION; }

SB_API cublasStatus_t cublasLtGetProperty(libraryPropertyType type, int *value) { return sb_property(type, value); }

SB_API const char *cublasLtGetStatusName(cublasStatus_t status) { return sb_status_name(status); }

SB_API const char *cublasLtGetStatusString(cublasStatus_t status) { return sb_status_string(status); }

/* ---- matmul descriptors ------------------------------------------------------ */

SB_API cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                               cudaDataType scaleType) {
    if (!matmulDesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulDesc_t d = malloc(sizeof *d);
    if (!d)
        return CUBLAS_STATUS_ALLOC_FAILED;
    attrs_init(&d->a, desc_sizes, sizeof desc_sizes);
    put_i32(&d->a, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, computeType);
    put_i32(&d->a, CUBLASLT_MATMUL_DESC_SCALE_TYPE, scaleType);
    put_i32(&d->a, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_HOST);
    put_i32(&d->a, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_N);
    put_i32(&d->a, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    put_i32(&d->a, CUBLASLT_MATMUL_DESC_TRANSC, CUBLAS_OP_N);
    put_i32(&d->a, CUBLASLT_MATMUL_DESC_FILL_MODE, FILL_MODE_FULL);
    put_i32(&d->a, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
    /* -1: the type of D (cuBLASLt's default for both) */
    put_i32(&d->a, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, -1);
    put_i32(&d->a, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, -1);
    *matmulDesc = d;
    return CUBLAS_STATUS_SUCCESS;
}

/* Destroying NULL does nothing, as free() does. */
SB_API cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    free(matmulDesc);
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                     cublasLtMatmulDescAttributes_t attr, const void *buf,
                                                     size_t sizeInBytes) {
    if (!matmulDesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    return attr_set(&matmulDesc->a, (int)attr, buf, sizeInBytes);
}

SB_API cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                     cublasLtMatmulDescAttributes_t attr, void *buf, size_t sizeInBytes,
                                                     size_t *sizeWritten) {
    if (!matmulDesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    return attr_get(&matmulDesc->a, (int)attr, buf, sizeInBytes, sizeWritten);
}

/* ---- matrix layouts ------------------------------------------------------------- */

SB_API cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
    if (!matLayout)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatrixLayout_t l = malloc(sizeof *l);
    if (!l)
        return CUBLAS_STATUS_ALLOC_FAILED;
    attrs_init(&l->a, layout_sizes, sizeof layout_sizes);
    put_i32(&l->a, CUBLASLT_MATRIX_LAYOUT_TYPE, type);
    put_i32(&l->a, CUBLASLT_MATRIX_LAYOUT_ORDER, ORDER_COL);
    put_u64(&l->a, CUBLASLT_MATRIX_LAYOUT_ROWS, rows);
    put_u64(&l->a, CUBLASLT_MATRIX_LAYOUT_COLS, cols);
    put_i64(&l->a, CUBLASLT_MATRIX_LAYOUT_LD, ld);
    put_i32(&l->a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 1);
    *matLayout = l;
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    free(matLayout);
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                       cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                       size_t sizeInBytes) {
    if (!matLayout)
        return CUBLAS_STATUS_INVALID_VALUE;
    return attr_set(&matLayout->a, (int)attr, buf, sizeInBytes);
}

SB_API cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                       cublasLtMatrixLayoutAttribute_t attr, void *buf,
                                                       size_t sizeInBytes, size_t *sizeWritten) {
    if (!matLayout)
        return CUBLAS_STATUS_INVALID_VALUE;
    return attr_get(&matLayout->a, (int)attr, buf, sizeInBytes, sizeWritten);
}

/* ---- preferences --------------------------------------------------------------- */

SB_API cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulPreference_t p = malloc(sizeof *p);
    if (!p)
        return CUBLAS_STATUS_ALLOC_FAILED;
    attrs_init(&p->a, pref_sizes, sizeof pref_sizes);
    /* cuBLASLt's defaults: every reduction scheme and implementation allowed, 256-byte alignment assumed */
    uint32_t all_schemes = 0x7, align = 256;
    uint64_t all_impls = UINT64_MAX;
    put(&p->a, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &all_schemes);
    put(&p->a, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align);
    put(&p->a, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align);
    put(&p->a, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align);
    put(&p->a, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align);
    put(&p->a, CUBLASLT_MATMUL_PREF_IMPL_MASK, &all_impls);
    *pref = p;
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    free(pref);
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                           cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                           size_t sizeInBytes) {
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    return attr_set(&pref->a, (int)attr, buf, sizeInBytes);
}

SB_API cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                           cublasLtMatmulPreferenceAttributes_t attr, void *buf,
                                                           size_t sizeInBytes, size_t *sizeWritten) {
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    return attr_get(&pref->a, (int)attr, buf, sizeInBytes, sizeWritten);
}

/* ---- the product ------------------------------------------------------------------- */

/* One operand's layout as the kernel needs it. */
typedef struct operand {
    uint64_t rows, cols;
    int64_t ld, stride;
    int32_t batch;
} operand;

/* A float column-major layout, or NOT_SUPPORTED. */
static cublasStatus_t operand_of(cublasLtMatrixLayout_t l, operand *o) {
    if (get_i32(&l->a, CUBLASLT_MATRIX_LAYOUT_TYPE) != CUDA_R_32F ||
        get_i32(&l->a, CUBLASLT_MATRIX_LAYOUT_ORDER) != ORDER_COL ||
        get_i64(&l->a, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET) != 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    o->rows = get_u64(&l->a, CUBLASLT_MATRIX_LAYOUT_ROWS);
    o->cols = get_u64(&l->a, CUBLASLT_MATRIX_LAYOUT_COLS);
    o->ld = get_i64(&l->a, CUBLASLT_MATRIX_LAYOUT_LD);
    o->stride = get_i64(&l->a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
    o->batch = get_i32(&l->a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
    return CUBLAS_STATUS_SUCCESS;
}

/* The leading dimension holds a column (at least 1). */
static bool ld_ok(const operand *o) { return o->ld >= 1 && (uint64_t)o->ld >= o->rows; }

/* What a problem comes to: the kernel's launch less its pointers and scalars. */
typedef struct plan {
    sb_gemm g;
    bool bias;
    operand c, d;
} plan;

/*
 * The problem the descriptor and layouts describe, checked: NOT_SUPPORTED
 * for what this library does not compute, INVALID_VALUE for shapes that do
 * not fit together.
 */
static cublasStatus_t plan_of(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t al, cublasLtMatrixLayout_t bl,
                              cublasLtMatrixLayout_t cl, cublasLtMatrixLayout_t dl, plan *p) {
    if (!desc || !al || !bl || !cl || !dl)
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    const sb_attrs *a = &desc->a;
    int32_t compute = get_i32(a, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE);
    if ((compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) ||
        get_i32(a, CUBLASLT_MATMUL_DESC_SCALE_TYPE) != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int32_t pm = get_i32(a, CUBLASLT_MATMUL_DESC_POINTER_MODE);
    if (pm != CUBLASLT_POINTER_MODE_HOST && pm != CUBLASLT_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int32_t ops[2] = {get_i32(a, CUBLASLT_MATMUL_DESC_TRANSA), get_i32(a, CUBLASLT_MATMUL_DESC_TRANSB)};
    for (int i = 0; i < 2; i++)
        if (ops[i] != CUBLAS_OP_N && ops[i] != CUBLAS_OP_T && ops[i] != CUBLAS_OP_C)
            return CUBLAS_STATUS_INVALID_VALUE;
    if (get_i32(a, CUBLASLT_MATMUL_DESC_TRANSC) != CUBLAS_OP_N ||
        get_i32(a, CUBLASLT_MATMUL_DESC_FILL_MODE) != FILL_MODE_FULL)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    uint32_t epi = (uint32_t)get_i32(a, CUBLASLT_MATMUL_DESC_EPILOGUE);
    if (epi != CUBLASLT_EPILOGUE_DEFAULT && epi != CUBLASLT_EPILOGUE_RELU && epi != CUBLASLT_EPILOGUE_BIAS &&
        epi != CUBLASLT_EPILOGUE_RELU_BIAS)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int32_t bias_type = get_i32(a, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
    if (bias_type != -1 && bias_type != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* the pointers of scaled, FP8 and auxiliary-output epilogues: none of them is computed here */
    static const int unsupported[] = {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                      CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,      CUBLASLT_MATMUL_DESC_C_SCALE_POINTER,
                                      CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,      CUBLASLT_MATMUL_DESC_AMAX_D_POINTER,
                                      DESC_EPILOGUE_AUX_SCALE_POINTER,           DESC_EPILOGUE_AUX_AMAX_POINTER};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (get_u64(a, unsupported[i]) != 0)
            return CUBLAS_STATUS_NOT_SUPPORTED;

    operand A, B;
    cublasStatus_t st;
    if ((st = operand_of(al, &A)) != CUBLAS_STATUS_SUCCESS || (st = operand_of(bl, &B)) != CUBLAS_STATUS_SUCCESS ||
        (st = operand_of(cl, &p->c)) != CUBLAS_STATUS_SUCCESS || (st = operand_of(dl, &p->d)) != CUBLAS_STATUS_SUCCESS)
        return st;
    const operand *C = &p->c, *D = &p->d;
    bool ta = ops[0] != CUBLAS_OP_N, tb = ops[1] != CUBLAS_OP_N;
    uint64_t m = D->rows, n = D->cols, k = ta ? A.rows : A.cols;
    if ((ta ? A.cols : A.rows) != m || (tb ? B.cols : B.rows) != k || (tb ? B.rows : B.cols) != n || C->rows != m ||
        C->cols != n)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!ld_ok(&A) || !ld_ok(&B) || !ld_ok(C) || !ld_ok(D))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (D->batch < 1 || A.batch != D->batch || B.batch != D->batch || C->batch != D->batch)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
        return CUBLAS_STATUS_NOT_SUPPORTED;

    p->bias = epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_RELU_BIAS;
    p->g = (sb_gemm){
        .device_scalars = pm == CUBLASLT_POINTER_MODE_DEVICE,
        .bias = (CUdeviceptr)get_u64(a, CUBLASLT_MATMUL_DESC_BIAS_POINTER),
        .sa = A.stride,
        .sb = B.stride,
        .sc = C->stride,
        .sd = D->stride,
        .sbias = get_i64(a, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE),
        .lda = (uint64_t)A.ld,
        .ldb = (uint64_t)B.ld,
        .ldc = (uint64_t)C->ld,
        .ldd = (uint64_t)D->ld,
        .m = (uint32_t)m,
        .n = (uint32_t)n,
        .k = (uint32_t)k,
        .batch = (uint32_t)D->batch,
        .flags = (ta ? SBK_TRANSA : 0) | (tb ? SBK_TRANSB : 0) | (p->bias ? SBK_BIAS_ON : 0) |
                 (epi == CUBLASLT_EPILOGUE_RELU || epi == CUBLASLT_EPILOGUE_RELU_BIAS ? SBK_RELU : 0),
    };
    return CUBLAS_STATUS_SUCCESS;
}

/*
 * One algorithm for every problem this library computes: no workspace, its
 * identifier in data[0]. A problem it does not compute gets no result and
 * the reason (NOT_SUPPORTED, or INVALID_VALUE for shapes that do not fit);
 * *returnAlgoCount is written on success only, as NVIDIA's leaves it (and
 * the results) alone on every error measured.
 */
SB_API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                                     cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                     cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                     cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                                     cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                     int *returnAlgoCount) {
    if (!lightHandle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!preference || requestedAlgoCount < 1 || !heuristicResultsArray || !returnAlgoCount)
        return CUBLAS_STATUS_INVALID_VALUE;
    plan p;
    cublasStatus_t st = plan_of(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[0];
    memset(r, 0, sizeof *r);
    r->algo.data[0] = SB_ALGO_ID;
    r->workspaceSize = 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

SB_API cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                                     const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                                     cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                                     cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                                     const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSizeInBytes,
                                     cudaStream_t stream) {
    (void)workspace; /* the algorithm needs none */
    (void)workspaceSizeInBytes;
    if (!lightHandle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    plan p;
    cublasStatus_t st = plan_of(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (algo && algo->data[0] != SB_ALGO_ID)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!alpha || !beta || (p.bias && !p.g.bias))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* In place (C == D), the two layouts must be the same, as cuBLASLt requires. */
    if (C == D && (p.c.ld != p.d.ld || p.c.stride != p.d.stride))
        return CUBLAS_STATUS_INVALID_VALUE;
    p.g.alpha = alpha;
    p.g.beta = beta;
    p.g.a = (CUdeviceptr)(uintptr_t)A;
    p.g.b = (CUdeviceptr)(uintptr_t)B;
    p.g.c = (CUdeviceptr)(uintptr_t)C;
    p.g.d = (CUdeviceptr)(uintptr_t)D;
    return sb_gemm_launch(&lightHandle->k, &p.g, stream);
}

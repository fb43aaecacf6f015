/*
 * The simulated cuBLAS's kernels and what both libraries share: see simblas.h.
 */
#include "simblas.h"

#include <pthread.h>
#include <string.h>

/*
 * The kernels: one template, made into simblas_gemm_f32 and simblas_gemm_f64
 * by putting in the entry's name ({N}), the element type ({T}), log2 of its
 * size ({S}) and its zero ({Z}). Each thread takes elements e = ((b * n) + j) * m + i in a grid-stride loop
 * and computes D's element as sbkern.h defines it; elements are independent,
 * so any grid gives the same bits. Every rounding is spelled out (fma.rn,
 * mul.rn, add.rn): ptxas does not fuse instructions with an explicit rounding
 * mode, so the GPU rounds where the definition does.
 *
 * Global memory is reached only through addresses made by adding an offset to
 * a pointer parameter (the steps are shifted, so they carry no parameter), so
 * gpucr's PTX analysis (ptx/analyze.go) finds that D is the only parameter
 * written through and A, B, C, bias, alpha_ptr and beta_ptr those read.
 */
static const char gemm_template[] =
    ".visible .entry {N}(\n"
    "\t.param .u64 {N}_param_0,\n"  /* A */
    "\t.param .u64 {N}_param_1,\n"  /* B */
    "\t.param .u64 {N}_param_2,\n"  /* C */
    "\t.param .u64 {N}_param_3,\n"  /* D */
    "\t.param .u64 {N}_param_4,\n"  /* bias */
    "\t.param .u64 {N}_param_5,\n"  /* alpha_ptr */
    "\t.param .u64 {N}_param_6,\n"  /* beta_ptr */
    "\t.param .s64 {N}_param_7,\n"  /* strides: A */
    "\t.param .s64 {N}_param_8,\n"  /* B */
    "\t.param .s64 {N}_param_9,\n"  /* C */
    "\t.param .s64 {N}_param_10,\n" /* D */
    "\t.param .s64 {N}_param_11,\n" /* bias */
    "\t.param .u64 {N}_param_12,\n" /* lda */
    "\t.param .u64 {N}_param_13,\n" /* ldb */
    "\t.param .u64 {N}_param_14,\n" /* ldc */
    "\t.param .u64 {N}_param_15,\n" /* ldd */
    "\t.param {T} {N}_param_16,\n"  /* alpha */
    "\t.param {T} {N}_param_17,\n"  /* beta */
    "\t.param .u32 {N}_param_18,\n" /* m */
    "\t.param .u32 {N}_param_19,\n" /* n */
    "\t.param .u32 {N}_param_20,\n" /* k */
    "\t.param .u32 {N}_param_21,\n" /* batch */
    "\t.param .u32 {N}_param_22\n"  /* flags */
    ")\n"
    "{\n"
    "\t.reg .pred %p<8>;\n"
    "\t.reg .b32 %r<16>;\n"
    "\t.reg .b64 %rd<48>;\n"
    "\t.reg {T} %f<8>;\n"
    "\n"
    "\tld.param.u64 %rd1, [{N}_param_0];\n"
    "\tld.param.u64 %rd2, [{N}_param_1];\n"
    "\tld.param.u64 %rd3, [{N}_param_2];\n"
    "\tld.param.u64 %rd4, [{N}_param_3];\n"
    "\tld.param.u64 %rd5, [{N}_param_4];\n"
    "\tld.param.u64 %rd6, [{N}_param_5];\n"
    "\tld.param.u64 %rd7, [{N}_param_6];\n"
    "\tld.param.s64 %rd8, [{N}_param_7];\n"
    "\tld.param.s64 %rd9, [{N}_param_8];\n"
    "\tld.param.s64 %rd10, [{N}_param_9];\n"
    "\tld.param.s64 %rd11, [{N}_param_10];\n"
    "\tld.param.s64 %rd12, [{N}_param_11];\n"
    "\tld.param.u64 %rd13, [{N}_param_12];\n"
    "\tld.param.u64 %rd14, [{N}_param_13];\n"
    "\tld.param.u64 %rd15, [{N}_param_14];\n"
    "\tld.param.u64 %rd16, [{N}_param_15];\n"
    "\tld.param{T} %f1, [{N}_param_16];\n"
    "\tld.param{T} %f2, [{N}_param_17];\n"
    "\tld.param.u32 %r1, [{N}_param_18];\n"
    "\tld.param.u32 %r2, [{N}_param_19];\n"
    "\tld.param.u32 %r3, [{N}_param_20];\n"
    "\tld.param.u32 %r4, [{N}_param_21];\n"
    "\tld.param.u32 %r5, [{N}_param_22];\n"
    "\tcvta.to.global.u64 %rd1, %rd1;\n"
    "\tcvta.to.global.u64 %rd2, %rd2;\n"
    "\tcvta.to.global.u64 %rd3, %rd3;\n"
    "\tcvta.to.global.u64 %rd4, %rd4;\n"
    "\tcvta.to.global.u64 %rd5, %rd5;\n"
    "\tcvta.to.global.u64 %rd6, %rd6;\n"
    "\tcvta.to.global.u64 %rd7, %rd7;\n"
    "\tand.b32 %r6, %r5, 16;\n" /* device pointer mode: alpha and beta from memory */
    "\tsetp.eq.u32 %p1, %r6, 0;\n"
    "\t@%p1 bra $SB_scalars;\n"
    "\tld.global{T} %f1, [%rd6];\n"
    "\tld.global{T} %f2, [%rd7];\n"
    "$SB_scalars:\n"
    "\tand.b32 %r7, %r5, 1;\n"
    "\tsetp.ne.u32 %p2, %r7, 0;\n" /* TRANSA */
    "\tand.b32 %r8, %r5, 2;\n"
    "\tsetp.ne.u32 %p3, %r8, 0;\n"         /* TRANSB */
    "\tsetp.eq{T} %p4, %f1, {Z};\n"        /* no products: alpha == 0 */
    "\tsetp.eq.or.u32 %p4, %r3, 0, %p4;\n" /* or k == 0 */
    "\tsetp.eq{T} %p5, %f2, {Z};\n"        /* C not read: beta == 0 */
    "\tand.b32 %r15, %r5, 32;\n"
    "\tsetp.eq.and.u32 %p5, %r15, 0, %p5;\n" /* and not READ_C */
    "\tmul.wide.u32 %rd17, %r1, %r2;\n"      /* m * n */
    "\tcvt.u64.u32 %rd18, %r4;\n"
    "\tmul.lo.u64 %rd19, %rd17, %rd18;\n" /* elements */
    "\tcvt.u64.u32 %rd20, %r1;\n"
    "\tmov.u32 %r9, %ctaid.x;\n"
    "\tmov.u32 %r10, %ntid.x;\n"
    "\tmov.u32 %r11, %tid.x;\n"
    "\tmov.u32 %r12, %nctaid.x;\n"
    "\tmul.wide.u32 %rd21, %r9, %r10;\n"
    "\tcvt.u64.u32 %rd22, %r11;\n"
    "\tadd.u64 %rd21, %rd21, %rd22;\n"    /* e */
    "\tmul.wide.u32 %rd23, %r12, %r10;\n" /* grid stride */
    "\tsetp.ge.u64 %p6, %rd21, %rd19;\n"
    "\t@%p6 bra $SB_done;\n"
    "$SB_elem:\n"
    "\tdiv.u64 %rd24, %rd21, %rd17;\n" /* b */
    "\trem.u64 %rd25, %rd21, %rd17;\n"
    "\tdiv.u64 %rd26, %rd25, %rd20;\n" /* j */
    "\trem.u64 %rd27, %rd25, %rd20;\n" /* i */
    "\tmov{T} %f3, {Z};\n"             /* acc */
    "\t@%p4 bra $SB_scale;\n"
    "\tmul.lo.s64 %rd28, %rd24, %rd8;\n"  /* A: b * strideA */
    "\tmul.lo.s64 %rd29, %rd27, %rd13;\n" /* i * lda */
    "\tselp.b64 %rd30, %rd29, %rd27, %p2;\n"
    "\tadd.s64 %rd30, %rd30, %rd28;\n"
    "\tshl.b64 %rd30, %rd30, {S};\n"
    "\tadd.s64 %rd31, %rd1, %rd30;\n" /* &opA(i, 0) */
    "\tselp.b64 %rd32, 1, %rd13, %p2;\n"
    "\tshl.b64 %rd43, %rd32, {S};\n"      /* to opA(i, l + 1), bytes */
    "\tmul.lo.s64 %rd33, %rd24, %rd9;\n"  /* B: b * strideB */
    "\tmul.lo.s64 %rd34, %rd26, %rd14;\n" /* j * ldb */
    "\tselp.b64 %rd35, %rd26, %rd34, %p3;\n"
    "\tadd.s64 %rd35, %rd35, %rd33;\n"
    "\tshl.b64 %rd35, %rd35, {S};\n"
    "\tadd.s64 %rd36, %rd2, %rd35;\n" /* &opB(0, j) */
    "\tselp.b64 %rd37, %rd14, 1, %p3;\n"
    "\tshl.b64 %rd44, %rd37, {S};\n" /* to opB(l + 1, j), bytes */
    "\tmov.u32 %r13, %r3;\n"
    "$SB_k:\n"
    "\tld.global{T} %f4, [%rd31];\n"
    "\tld.global{T} %f5, [%rd36];\n"
    "\tfma.rn{T} %f3, %f4, %f5, %f3;\n"
    "\tadd.s64 %rd31, %rd31, %rd43;\n"
    "\tadd.s64 %rd36, %rd36, %rd44;\n"
    "\tsub.u32 %r13, %r13, 1;\n"
    "\tsetp.ne.u32 %p7, %r13, 0;\n"
    "\t@%p7 bra $SB_k;\n"
    "$SB_scale:\n"
    "\tmul.rn{T} %f6, %f1, %f3;\n" /* alpha * acc */
    "\t@%p5 bra $SB_bias;\n"
    "\tmul.lo.s64 %rd38, %rd24, %rd10;\n" /* C: b * strideC */
    "\tmul.lo.s64 %rd39, %rd26, %rd15;\n" /* j * ldc */
    "\tadd.s64 %rd38, %rd38, %rd39;\n"
    "\tadd.s64 %rd38, %rd38, %rd27;\n"
    "\tshl.b64 %rd38, %rd38, {S};\n"
    "\tadd.s64 %rd38, %rd3, %rd38;\n"
    "\tld.global{T} %f7, [%rd38];\n"
    "\tfma.rn{T} %f6, %f2, %f7, %f6;\n" /* + beta * C */
    "$SB_bias:\n"
    "\tand.b32 %r14, %r5, 4;\n"
    "\tsetp.eq.u32 %p7, %r14, 0;\n"
    "\t@%p7 bra $SB_relu;\n"
    "\tmul.lo.s64 %rd40, %rd24, %rd12;\n" /* bias: b * strideBias */
    "\tadd.s64 %rd40, %rd40, %rd27;\n"
    "\tshl.b64 %rd40, %rd40, {S};\n"
    "\tadd.s64 %rd40, %rd5, %rd40;\n"
    "\tld.global{T} %f7, [%rd40];\n"
    "\tadd.rn{T} %f6, %f6, %f7;\n"
    "$SB_relu:\n"
    "\tand.b32 %r14, %r5, 8;\n"
    "\tsetp.eq.u32 %p7, %r14, 0;\n"
    "\t@%p7 bra $SB_store;\n"
    "\tsetp.gt{T} %p7, %f6, {Z};\n"
    "\tselp{T} %f6, %f6, {Z}, %p7;\n" /* t > 0 ? t : 0 (NaN: 0) */
    "$SB_store:\n"
    "\tmul.lo.s64 %rd41, %rd24, %rd11;\n" /* D: b * strideD */
    "\tmul.lo.s64 %rd42, %rd26, %rd16;\n" /* j * ldd */
    "\tadd.s64 %rd41, %rd41, %rd42;\n"
    "\tadd.s64 %rd41, %rd41, %rd27;\n"
    "\tshl.b64 %rd41, %rd41, {S};\n"
    "\tadd.s64 %rd41, %rd4, %rd41;\n"
    "\tst.global{T} [%rd41], %f6;\n"
    "\tadd.u64 %rd21, %rd21, %rd23;\n"
    "\tsetp.lt.u64 %p6, %rd21, %rd19;\n"
    "\t@%p6 bra $SB_elem;\n"
    "$SB_done:\n"
    "\tret;\n"
    "}\n";

/*
 * The matrix-vector kernels, simblas_gemv_f32 and simblas_gemv_f64, from a
 * second template with the same placeholders and one more, the element
 * type's one ({O}). Each thread takes rows i in a grid-stride loop and
 * computes y's element as sbkern.h defines it; rows are independent, so any
 * grid gives the same bits. The steps are signed element counts (sbkern.h):
 * multiplied and shifted before they are added to an operand's address, so
 * here too only y is found written through, and A, x, y, alpha_ptr and
 * beta_ptr read.
 */
static const char gemv_template[] =
    ".visible .entry {N}(\n"
    "\t.param .u64 {N}_param_0,\n"  /* A */
    "\t.param .u64 {N}_param_1,\n"  /* x */
    "\t.param .u64 {N}_param_2,\n"  /* y */
    "\t.param .u64 {N}_param_3,\n"  /* alpha_ptr */
    "\t.param .u64 {N}_param_4,\n"  /* beta_ptr */
    "\t.param .s64 {N}_param_5,\n"  /* rs: A's step from row i to i + 1 */
    "\t.param .s64 {N}_param_6,\n"  /* cs: from column l to l + 1 */
    "\t.param .s64 {N}_param_7,\n"  /* incx */
    "\t.param .s64 {N}_param_8,\n"  /* incy */
    "\t.param {T} {N}_param_9,\n"   /* alpha */
    "\t.param {T} {N}_param_10,\n"  /* beta */
    "\t.param .u32 {N}_param_11,\n" /* rows */
    "\t.param .u32 {N}_param_12,\n" /* cols */
    "\t.param .u32 {N}_param_13\n"  /* flags */
    ")\n"
    "{\n"
    "\t.reg .pred %p<8>;\n"
    "\t.reg .b32 %r<16>;\n"
    "\t.reg .b64 %rd<24>;\n"
    "\t.reg {T} %f<8>;\n"
    "\n"
    "\tld.param.u64 %rd1, [{N}_param_0];\n"
    "\tld.param.u64 %rd2, [{N}_param_1];\n"
    "\tld.param.u64 %rd3, [{N}_param_2];\n"
    "\tld.param.u64 %rd4, [{N}_param_3];\n"
    "\tld.param.u64 %rd5, [{N}_param_4];\n"
    "\tld.param.s64 %rd6, [{N}_param_5];\n"
    "\tld.param.s64 %rd7, [{N}_param_6];\n"
    "\tld.param.s64 %rd8, [{N}_param_7];\n"
    "\tld.param.s64 %rd9, [{N}_param_8];\n"
    "\tld.param{T} %f1, [{N}_param_9];\n"
    "\tld.param{T} %f2, [{N}_param_10];\n"
    "\tld.param.u32 %r1, [{N}_param_11];\n"
    "\tld.param.u32 %r2, [{N}_param_12];\n"
    "\tld.param.u32 %r3, [{N}_param_13];\n"
    "\tcvta.to.global.u64 %rd1, %rd1;\n"
    "\tcvta.to.global.u64 %rd2, %rd2;\n"
    "\tcvta.to.global.u64 %rd3, %rd3;\n"
    "\tcvta.to.global.u64 %rd4, %rd4;\n"
    "\tcvta.to.global.u64 %rd5, %rd5;\n"
    "\tand.b32 %r4, %r3, 16;\n" /* device pointer mode: alpha and beta from memory */
    "\tsetp.eq.u32 %p1, %r4, 0;\n"
    "\t@%p1 bra $SV_scalars;\n"
    "\tld.global{T} %f1, [%rd4];\n"
    "\tld.global{T} %f2, [%rd5];\n"
    "$SV_scalars:\n"
    "\tsetp.eq{T} %p2, %f1, {Z};\n" /* alpha == 0 */
    "\tsetp.eq{T} %p3, %f2, {O};\n"
    "\tand.pred %p3, %p2, %p3;\n" /* and beta == 1: y stays as it is */
    "\t@%p3 bra $SV_done;\n"
    "\tsetp.eq.or.u32 %p2, %r2, 0, %p2;\n" /* no products: alpha == 0 or cols == 0 */
    "\tsetp.eq{T} %p4, %f2, {Z};\n"        /* y not read: beta == 0 */
    "\tshl.b64 %rd10, %rd7, {S};\n"        /* to A(i, l + 1), bytes */
    "\tshl.b64 %rd11, %rd8, {S};\n"        /* to x(l + 1), bytes */
    "\tcvt.u64.u32 %rd12, %r1;\n"          /* rows */
    "\tmov.u32 %r5, %ctaid.x;\n"
    "\tmov.u32 %r6, %ntid.x;\n"
    "\tmov.u32 %r7, %tid.x;\n"
    "\tmov.u32 %r8, %nctaid.x;\n"
    "\tmul.wide.u32 %rd13, %r5, %r6;\n"
    "\tcvt.u64.u32 %rd14, %r7;\n"
    "\tadd.u64 %rd13, %rd13, %rd14;\n"  /* i */
    "\tmul.wide.u32 %rd15, %r8, %r6;\n" /* grid stride */
    "\tsetp.ge.u64 %p5, %rd13, %rd12;\n"
    "\t@%p5 bra $SV_done;\n"
    "$SV_row:\n"
    "\tmov{T} %f3, {Z};\n" /* acc */
    "\t@%p2 bra $SV_scale;\n"
    "\tmul.lo.s64 %rd16, %rd13, %rd6;\n" /* i * rs */
    "\tshl.b64 %rd16, %rd16, {S};\n"
    "\tadd.s64 %rd17, %rd1, %rd16;\n" /* &A(i, 0) */
    "\tmov.u64 %rd18, %rd2;\n"        /* &x(0) */
    "\tmov.u32 %r9, %r2;\n"
    "$SV_l:\n"
    "\tld.global{T} %f4, [%rd17];\n"
    "\tld.global{T} %f5, [%rd18];\n"
    "\tfma.rn{T} %f3, %f4, %f5, %f3;\n"
    "\tadd.s64 %rd17, %rd17, %rd10;\n"
    "\tadd.s64 %rd18, %rd18, %rd11;\n"
    "\tsub.u32 %r9, %r9, 1;\n"
    "\tsetp.ne.u32 %p6, %r9, 0;\n"
    "\t@%p6 bra $SV_l;\n"
    "$SV_scale:\n"
    "\tmul.rn{T} %f6, %f1, %f3;\n"       /* alpha * acc */
    "\tmul.lo.s64 %rd19, %rd13, %rd9;\n" /* i * incy */
    "\tshl.b64 %rd19, %rd19, {S};\n"
    "\tadd.s64 %rd19, %rd3, %rd19;\n" /* &y(i) */
    "\t@%p4 bra $SV_store;\n"
    "\tld.global{T} %f7, [%rd19];\n"
    "\tfma.rn{T} %f6, %f2, %f7, %f6;\n" /* + beta * y */
    "$SV_store:\n"
    "\tst.global{T} [%rd19], %f6;\n"
    "\tadd.u64 %rd13, %rd13, %rd15;\n"
    "\tsetp.lt.u64 %p5, %rd13, %rd12;\n"
    "\t@%p5 bra $SV_row;\n"
    "$SV_done:\n"
    "\tret;\n"
    "}\n";

static const char ptx_header[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n";

/* The module's text: the header, then each template for float and for double, made once. Room for three copies
 * of each template: the placeholders put in make a copy a little longer (make_ptx fails rather than overflow). */
static char sb_ptx[3 * (sizeof gemm_template + sizeof gemv_template) + sizeof ptx_header];
static pthread_once_t ptx_once = PTHREAD_ONCE_INIT;
static int ptx_ok;

/* What a template's placeholders become for one element type. */
typedef struct elem_type {
    const char *type, *shift, *zero, *one;
} elem_type;

static const elem_type ty_f32 = {".f32", "2", "0f00000000", "0f3F800000"};
static const elem_type ty_f64 = {".f64", "3", "0d0000000000000000", "0d3FF0000000000000"};

/* Appends template tpl as entry name with its placeholders put in at *len; 0 if sb_ptx is too small (it is not). */
static int expand(size_t *len, const char *tpl, const char *name, const elem_type *ty) {
    for (const char *t = tpl; *t;) {
        const char *put = NULL;
        if (t[0] == '{' && t[1] && t[2] == '}') {
            switch (t[1]) {
            case 'N': put = name; break;
            case 'T': put = ty->type; break;
            case 'S': put = ty->shift; break;
            case 'Z': put = ty->zero; break;
            case 'O': put = ty->one; break;
            }
        }
        size_t n = put ? strlen(put) : 1;
        if (*len + n + 1 > sizeof sb_ptx)
            return 0;
        memcpy(sb_ptx + *len, put ? put : t, n);
        *len += n;
        t += put ? 3 : 1;
    }
    sb_ptx[*len] = 0;
    return 1;
}

static void make_ptx(void) {
    size_t len = strlen(ptx_header);
    memcpy(sb_ptx, ptx_header, len);
    ptx_ok = expand(&len, gemm_template, "simblas_gemm_f32", &ty_f32) &&
             expand(&len, gemm_template, "simblas_gemm_f64", &ty_f64) &&
             expand(&len, gemv_template, "simblas_gemv_f32", &ty_f32) &&
             expand(&len, gemv_template, "simblas_gemv_f64", &ty_f64);
}

/* ---- contexts and the module ------------------------------------------- */

/* Device 0's primary context, retained once for the process (as the runtime keeps it) the first time a handle is
 * made on a thread with no current context. */
static pthread_mutex_t primary_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary;

static cublasStatus_t primary_context(CUcontext *out) {
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    pthread_mutex_lock(&primary_mu);
    if (!primary) {
        CUdevice dev;
        if (cuDeviceGet(&dev, 0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&primary, dev) != CUDA_SUCCESS) {
            primary = NULL;
            st = CUBLAS_STATUS_NOT_INITIALIZED;
        }
    }
    *out = primary;
    pthread_mutex_unlock(&primary_mu);
    return st;
}

/* The module, loaded into the current context. */
static cublasStatus_t load_module(sb_kernels *k) {
    if (pthread_once(&ptx_once, make_ptx) != 0 || !ptx_ok)
        return CUBLAS_STATUS_INTERNAL_ERROR;
    if (cuModuleLoadData(&k->mod, sb_ptx) != CUDA_SUCCESS) {
        k->mod = NULL;
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (cuModuleGetFunction(&k->f32, k->mod, "simblas_gemm_f32") != CUDA_SUCCESS ||
        cuModuleGetFunction(&k->f64, k->mod, "simblas_gemm_f64") != CUDA_SUCCESS ||
        cuModuleGetFunction(&k->v32, k->mod, "simblas_gemv_f32") != CUDA_SUCCESS ||
        cuModuleGetFunction(&k->v64, k->mod, "simblas_gemv_f64") != CUDA_SUCCESS) {
        sb_kernels_unload(k);
        return CUBLAS_STATUS_INTERNAL_ERROR;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t sb_kernels_load(sb_kernels *k, bool make_current) {
    memset(k, 0, sizeof *k);
    /* cuInit is idempotent; the runtime calls it before anything else too. */
    if (cuInit(0) != CUDA_SUCCESS || cuCtxGetCurrent(&k->ctx) != CUDA_SUCCESS)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (k->ctx)
        return load_module(k);
    cublasStatus_t st = primary_context(&k->ctx);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (cuCtxSetCurrent(k->ctx) != CUDA_SUCCESS)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    st = load_module(k);
    /* the thread had no context: without make_current it has none again (the module stays in the primary one) */
    if (!make_current && cuCtxSetCurrent(NULL) != CUDA_SUCCESS && st == CUBLAS_STATUS_SUCCESS) {
        sb_kernels_unload(k);
        st = CUBLAS_STATUS_INTERNAL_ERROR;
    }
    return st;
}

void sb_kernels_unload(sb_kernels *k) {
    /*
     * A failure is not the caller's to handle: it means the context, and so
     * the module with it, is gone already (the application released the
     * primary context before destroying the handle), which NVIDIA's library
     * tolerates too.
     */
    if (k->mod) {
        CUresult r = cuModuleUnload(k->mod);
        (void)r;
    }
    k->mod = NULL;
    k->f32 = k->f64 = k->v32 = k->v64 = NULL;
}

/* ---- launches ------------------------------------------------------------ */

/* Threads per block, and the most blocks a launch asks for (the rest is the grid-stride loop's). */
enum { SB_BLOCK = 256, SB_MAX_BLOCKS = 4096 };

/* The launch's grid: a thread per element, at most SB_MAX_BLOCKS blocks. */
static unsigned grid_for(uint64_t elems) {
    uint64_t blocks = (elems + SB_BLOCK - 1) / SB_BLOCK;
    return (unsigned)(blocks > SB_MAX_BLOCKS ? SB_MAX_BLOCKS : blocks);
}

cublasStatus_t sb_enter(const sb_kernels *k) {
    CUcontext cur = NULL;
    if (cuCtxGetCurrent(&cur) != CUDA_SUCCESS)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    /* A thread that made none current gets the handle's, as the runtime gives it the device's primary context. */
    if (!cur && cuCtxSetCurrent(k->ctx) != CUDA_SUCCESS)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t sb_gemm_launch(const sb_kernels *k, const sb_gemm *g, CUstream s) {
    if (g->m == 0 || g->n == 0 || g->batch == 0)
        return CUBLAS_STATUS_SUCCESS;
    cublasStatus_t st = sb_enter(k);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;

    CUdeviceptr a = g->a, b = g->b, c = g->c, d = g->d, bias = g->bias, alpha_ptr = 0, beta_ptr = 0;
    int64_t sa = g->sa, sb = g->sb, sc = g->sc, sd = g->sd, sbias = g->sbias;
    uint64_t lda = g->lda, ldb = g->ldb, ldc = g->ldc, ldd = g->ldd;
    uint32_t m = g->m, n = g->n, kk = g->k, batch = g->batch, flags = g->flags & ~SBK_DEVICE_SCALARS;
    float alpha32 = 0, beta32 = 0;
    double alpha64 = 0, beta64 = 0;
    if (g->device_scalars) {
        flags |= SBK_DEVICE_SCALARS;
        alpha_ptr = (CUdeviceptr)(uintptr_t)g->alpha;
        beta_ptr = (CUdeviceptr)(uintptr_t)g->beta;
    } else if (g->f64) {
        memcpy(&alpha64, g->alpha, sizeof alpha64);
        memcpy(&beta64, g->beta, sizeof beta64);
    } else {
        memcpy(&alpha32, g->alpha, sizeof alpha32);
        memcpy(&beta32, g->beta, sizeof beta32);
    }
    void *args[SBK_NPARAMS] = {
        [SBK_A] = &a,
        [SBK_B] = &b,
        [SBK_C] = &c,
        [SBK_D] = &d,
        [SBK_BIAS] = &bias,
        [SBK_ALPHA_PTR] = &alpha_ptr,
        [SBK_BETA_PTR] = &beta_ptr,
        [SBK_STRIDE_A] = &sa,
        [SBK_STRIDE_B] = &sb,
        [SBK_STRIDE_C] = &sc,
        [SBK_STRIDE_D] = &sd,
        [SBK_STRIDE_BIAS] = &sbias,
        [SBK_LDA] = &lda,
        [SBK_LDB] = &ldb,
        [SBK_LDC] = &ldc,
        [SBK_LDD] = &ldd,
        [SBK_ALPHA] = g->f64 ? (void *)&alpha64 : (void *)&alpha32,
        [SBK_BETA] = g->f64 ? (void *)&beta64 : (void *)&beta32,
        [SBK_M] = &m,
        [SBK_N] = &n,
        [SBK_K] = &kk,
        [SBK_BATCH] = &batch,
        [SBK_FLAGS] = &flags,
    };
    CUresult r = cuLaunchKernel(g->f64 ? k->f64 : k->f32, grid_for((uint64_t)m * n * batch), 1, 1, SB_BLOCK, 1, 1, 0, s,
                                args, NULL);
    return r == CUDA_SUCCESS ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

CUdeviceptr sb_vec_origin(const void *p, uint32_t len, int64_t inc, size_t es) {
    CUdeviceptr base = (CUdeviceptr)(uintptr_t)p;
    /* (len - 1) * -inc fits: both came from ints */
    return inc < 0 && len > 0 ? base + (CUdeviceptr)((int64_t)(len - 1) * -inc * (int64_t)es) : base;
}

cublasStatus_t sb_gemv_launch(const sb_kernels *k, const sb_gemv *v, CUstream s) {
    if (v->rows == 0)
        return CUBLAS_STATUS_SUCCESS;
    cublasStatus_t st = sb_enter(k);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    CUdeviceptr a = v->a, x = v->x, y = v->y, alpha_ptr = 0, beta_ptr = 0;
    int64_t rs = v->rs, cs = v->cs, incx = v->incx, incy = v->incy;
    uint32_t rows = v->rows, cols = v->cols, flags = 0;
    float alpha32 = 0, beta32 = 0;
    double alpha64 = 0, beta64 = 0;
    if (v->device_scalars) {
        flags |= SBK_DEVICE_SCALARS;
        alpha_ptr = (CUdeviceptr)(uintptr_t)v->alpha;
        beta_ptr = (CUdeviceptr)(uintptr_t)v->beta;
    } else if (v->f64) {
        memcpy(&alpha64, v->alpha, sizeof alpha64);
        memcpy(&beta64, v->beta, sizeof beta64);
    } else {
        memcpy(&alpha32, v->alpha, sizeof alpha32);
        memcpy(&beta32, v->beta, sizeof beta32);
    }
    void *args[SBV_NPARAMS] = {
        [SBV_A] = &a,
        [SBV_X] = &x,
        [SBV_Y] = &y,
        [SBV_ALPHA_PTR] = &alpha_ptr,
        [SBV_BETA_PTR] = &beta_ptr,
        [SBV_RS] = &rs,
        [SBV_CS] = &cs,
        [SBV_INCX] = &incx,
        [SBV_INCY] = &incy,
        [SBV_ALPHA] = v->f64 ? (void *)&alpha64 : (void *)&alpha32,
        [SBV_BETA] = v->f64 ? (void *)&beta64 : (void *)&beta32,
        [SBV_ROWS] = &rows,
        [SBV_COLS] = &cols,
        [SBV_FLAGS] = &flags,
    };
    CUresult r = cuLaunchKernel(v->f64 ? k->v64 : k->v32, grid_for(rows), 1, 1, SB_BLOCK, 1, 1, 0, s, args, NULL);
    return r == CUDA_SUCCESS ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* ---- statuses and properties --------------------------------------------- */

const char *sb_status_name(cublasStatus_t s) {
    switch (s) {
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
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *sb_status_string(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library or the handle is not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "a resource could not be allocated";
    case CUBLAS_STATUS_INVALID_VALUE: return "an argument has an invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "the device lacks a feature the operation needs";
    case CUBLAS_STATUS_MAPPING_ERROR: return "GPU memory could not be accessed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program could not be launched or failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the operation is not supported with these arguments";
    case CUBLAS_STATUS_LICENSE_ERROR: return "a license check failed";
    }
    return "unknown status";
}

cublasStatus_t sb_property(libraryPropertyType type, int *value) {
    if (!value)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (type) {
    case MAJOR_VERSION: *value = SB_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = SB_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = SB_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

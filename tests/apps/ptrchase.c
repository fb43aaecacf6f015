/*
 * ptrchase (test application "b"): a kernel that writes through pointers it
 * loads from device memory.
 *
 * --buffers K data buffers (cuMemAlloc, varied sizes, --mib N MiB together)
 * and one device table of K 16-byte entries:
 *
 *   struct entry { u64 ptr; u32 nwords; u32 salt; }
 *
 * Entry b points into data buffer b: at its start for even b, 16 words in
 * (an interior pointer) for odd b; nwords counts the words from there to the
 * buffer's end. The kernels get only the table's address, the number of
 * entries and the iteration (or seed): the data buffers they write appear in
 * no launch parameter. That is the case that speculating a kernel's write set
 * from its arguments misses, which gpucr must detect (and the checksums
 * catch).
 *
 * The table is written once with cuMemcpyHtoD. Launches: app_pc_init with
 * kernelParams, app_pc_step with the packed `extra` form (the parameter
 * buffer laid out as the PTX declares it), one stream.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuapp.h"

/*
 * app_pc_init(entry *table, u32 nent, u32 seed), for every entry b < nent and
 * j < table[b].nwords, with p = table[b].ptr, s = table[b].salt:
 *   p[j] = mix32(j * 0x9E3779B1 + (seed ^ s))
 * app_pc_step(entry *table, u32 nent, u32 iter), same traversal:
 *   k = iter * 0x9E3779B1 + s;
 *   v = (p[j] ^ k) * 0x01000193; v ^= v >> 13; p[j] = v + ((j << 3) ^ k)
 *
 * Entries are spread over the grid's y dimension (loop b from %ctaid.y by
 * %nctaid.y), words over x (grid-stride). Entries never overlap, so every
 * word is read and written by one thread only; the table is only read.
 */
static const char ptx[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry app_pc_init(\n"
    "\t.param .u64 app_pc_init_param_0,\n"
    "\t.param .u32 app_pc_init_param_1,\n"
    "\t.param .u32 app_pc_init_param_2\n"
    ")\n"
    "{\n"
    "\t.reg .pred %p<3>;\n"
    "\t.reg .b32 %r<20>;\n"
    "\t.reg .b64 %rd<10>;\n"
    "\n"
    "\tld.param.u64 %rd1, [app_pc_init_param_0];\n"
    "\tld.param.u32 %r1, [app_pc_init_param_1];\n" /* nent */
    "\tld.param.u32 %r2, [app_pc_init_param_2];\n" /* seed */
    "\tcvta.to.global.u64 %rd2, %rd1;\n"
    "\tmov.u32 %r3, %ctaid.y;\n" /* b */
    "\tsetp.ge.u32 %p1, %r3, %r1;\n"
    "\t@%p1 bra $PI_done;\n"
    "\tmov.u32 %r4, %nctaid.y;\n"
    "\tmov.u32 %r5, %ctaid.x;\n"
    "\tmov.u32 %r6, %ntid.x;\n"
    "\tmov.u32 %r7, %tid.x;\n"
    "\tmad.lo.u32 %r8, %r5, %r6, %r7;\n" /* first j */
    "\tmov.u32 %r9, %nctaid.x;\n"
    "\tmul.lo.u32 %r9, %r9, %r6;\n" /* grid stride */
    "$PI_entry:\n"
    "\tmul.wide.u32 %rd3, %r3, 16;\n"
    "\tadd.s64 %rd4, %rd2, %rd3;\n"
    "\tld.global.u64 %rd5, [%rd4];\n"    /* ptr, loaded from device memory */
    "\tld.global.u32 %r10, [%rd4+8];\n"  /* nwords */
    "\tld.global.u32 %r11, [%rd4+12];\n" /* salt */
    "\tcvta.to.global.u64 %rd6, %rd5;\n"
    "\txor.b32 %r12, %r2, %r11;\n"
    "\tmov.u32 %r13, %r8;\n"
    "\tsetp.ge.u32 %p2, %r13, %r10;\n"
    "\t@%p2 bra $PI_next;\n"
    "$PI_loop:\n"
    "\tmad.lo.u32 %r14, %r13, 0x9E3779B1, %r12;\n"
    "\tshr.u32 %r15, %r14, 16;\n"
    "\txor.b32 %r14, %r14, %r15;\n"
    "\tmul.lo.u32 %r14, %r14, 0x85EBCA6B;\n"
    "\tshr.u32 %r15, %r14, 13;\n"
    "\txor.b32 %r14, %r14, %r15;\n"
    "\tmul.lo.u32 %r14, %r14, 0xC2B2AE35;\n"
    "\tshr.u32 %r15, %r14, 16;\n"
    "\txor.b32 %r14, %r14, %r15;\n"
    "\tmul.wide.u32 %rd7, %r13, 4;\n"
    "\tadd.s64 %rd8, %rd6, %rd7;\n"
    "\tst.global.u32 [%rd8], %r14;\n"
    "\tadd.u32 %r13, %r13, %r9;\n"
    "\tsetp.lt.u32 %p2, %r13, %r10;\n"
    "\t@%p2 bra $PI_loop;\n"
    "$PI_next:\n"
    "\tadd.u32 %r3, %r3, %r4;\n"
    "\tsetp.lt.u32 %p1, %r3, %r1;\n"
    "\t@%p1 bra $PI_entry;\n"
    "$PI_done:\n"
    "\tret;\n"
    "}\n"
    "\n"
    ".visible .entry app_pc_step(\n"
    "\t.param .u64 app_pc_step_param_0,\n"
    "\t.param .u32 app_pc_step_param_1,\n"
    "\t.param .u32 app_pc_step_param_2\n"
    ")\n"
    "{\n"
    "\t.reg .pred %p<3>;\n"
    "\t.reg .b32 %r<20>;\n"
    "\t.reg .b64 %rd<10>;\n"
    "\n"
    "\tld.param.u64 %rd1, [app_pc_step_param_0];\n"
    "\tld.param.u32 %r1, [app_pc_step_param_1];\n" /* nent */
    "\tld.param.u32 %r2, [app_pc_step_param_2];\n" /* iter */
    "\tcvta.to.global.u64 %rd2, %rd1;\n"
    "\tmov.u32 %r3, %ctaid.y;\n" /* b */
    "\tsetp.ge.u32 %p1, %r3, %r1;\n"
    "\t@%p1 bra $PS_done;\n"
    "\tmov.u32 %r4, %nctaid.y;\n"
    "\tmov.u32 %r5, %ctaid.x;\n"
    "\tmov.u32 %r6, %ntid.x;\n"
    "\tmov.u32 %r7, %tid.x;\n"
    "\tmad.lo.u32 %r8, %r5, %r6, %r7;\n" /* first j */
    "\tmov.u32 %r9, %nctaid.x;\n"
    "\tmul.lo.u32 %r9, %r9, %r6;\n" /* grid stride */
    "$PS_entry:\n"
    "\tmul.wide.u32 %rd3, %r3, 16;\n"
    "\tadd.s64 %rd4, %rd2, %rd3;\n"
    "\tld.global.u64 %rd5, [%rd4];\n"    /* ptr, loaded from device memory */
    "\tld.global.u32 %r10, [%rd4+8];\n"  /* nwords */
    "\tld.global.u32 %r11, [%rd4+12];\n" /* salt */
    "\tcvta.to.global.u64 %rd6, %rd5;\n"
    "\tmad.lo.u32 %r12, %r2, 0x9E3779B1, %r11;\n" /* k */
    "\tmov.u32 %r13, %r8;\n"
    "\tsetp.ge.u32 %p2, %r13, %r10;\n"
    "\t@%p2 bra $PS_next;\n"
    "$PS_loop:\n"
    "\tmul.wide.u32 %rd7, %r13, 4;\n"
    "\tadd.s64 %rd8, %rd6, %rd7;\n"
    "\tld.global.u32 %r14, [%rd8];\n"
    "\txor.b32 %r14, %r14, %r12;\n"
    "\tmul.lo.u32 %r14, %r14, 0x01000193;\n"
    "\tshr.u32 %r15, %r14, 13;\n"
    "\txor.b32 %r14, %r14, %r15;\n"
    "\tshl.b32 %r15, %r13, 3;\n"
    "\txor.b32 %r15, %r15, %r12;\n"
    "\tadd.u32 %r14, %r14, %r15;\n"
    "\tst.global.u32 [%rd8], %r14;\n"
    "\tadd.u32 %r13, %r13, %r9;\n"
    "\tsetp.lt.u32 %p2, %r13, %r10;\n"
    "\t@%p2 bra $PS_loop;\n"
    "$PS_next:\n"
    "\tadd.u32 %r3, %r3, %r4;\n"
    "\tsetp.lt.u32 %p1, %r3, %r1;\n"
    "\t@%p1 bra $PS_entry;\n"
    "$PS_done:\n"
    "\tret;\n"
    "}\n";

/* One table entry, as the kernels read it (16 bytes, little-endian). */
typedef struct pc_entry {
    uint64_t ptr;
    uint32_t nwords;
    uint32_t salt;
} pc_entry;
_Static_assert(sizeof(pc_entry) == 16, "table entry layout");

/* app_pc_step's parameters packed as the PTX lays them out, for `extra`. */
typedef struct pc_step_params {
    uint64_t table; /* offset 0 */
    uint32_t nent;  /* offset 8 */
    uint32_t iter;  /* offset 12 */
} pc_step_params;
_Static_assert(sizeof(pc_step_params) == 16, "packed parameter layout");

#define INTERIOR_WORDS 16u /* odd entries point this many words into their buffer */

typedef struct pc_state {
    unsigned k;
    uint64_t *sizes;
    CUdeviceptr *buf;
    CUdeviceptr table;
    CUstream s;
    CUmodule mod;
    CUfunction f_init, f_step;
    unsigned grid_x;
    CUdeviceptr still; /* --still-mib: written once, never again (0: none) */
    size_t still_size;
} pc_state;

static void step(void *p, uint32_t iter) {
    pc_state *st = p;
    pc_step_params prm = {st->table, st->k, iter};
    size_t prm_size = sizeof(prm);
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &prm, CU_LAUNCH_PARAM_BUFFER_SIZE, &prm_size, CU_LAUNCH_PARAM_END};
    CHECK(cuLaunchKernel(st->f_step, st->grid_x, st->k, 1, GPUAPP_BLOCK, 1, 1, 0, st->s, NULL, extra));
}

static uint64_t checksum(void *p) {
    pc_state *st = p;
    CHECK(cuStreamSynchronize(st->s));
    uint64_t h = GPUAPP_SUM_BASIS;
    for (unsigned i = 0; i < st->k; i++)
        h = gpuapp_sum_device(h, i, st->buf[i], st->sizes[i]);
    if (st->still)
        h = gpuapp_sum_device(h, st->k, st->still, st->still_size);
    return h;
}

int main(int argc, char **argv) {
    gpuapp app;
    pc_state st;
    gpuapp_parse(&app, "ptrchase", GPUAPP_OPT_MIB | GPUAPP_OPT_BUFFERS | GPUAPP_OPT_STILL, 16, 6, argc, argv);
    memset(&st, 0, sizeof(st));
    st.k = app.buffers;
    st.sizes = calloc(st.k, sizeof(*st.sizes));
    st.buf = calloc(st.k, sizeof(*st.buf));
    pc_entry *table = calloc(st.k, sizeof(*table));
    if (!st.sizes || !st.buf || !table)
        gpuapp_die("out of host memory");
    gpuapp_split_sizes((uint64_t)app.mib << 20, st.k, 4096, st.sizes);

    gpuapp_context(&app);
    st.mod = gpuapp_load_ptx(ptx);
    st.f_init = gpuapp_function(st.mod, "app_pc_init");
    st.f_step = gpuapp_function(st.mod, "app_pc_step");
    CHECK(cuStreamCreate(&st.s, CU_STREAM_NON_BLOCKING));

    uint64_t maxn = 0;
    for (unsigned i = 0; i < st.k; i++) {
        CHECK(cuMemAlloc(&st.buf[i], st.sizes[i]));
        uint32_t lead = i % 2 ? INTERIOR_WORDS : 0;
        table[i].ptr = st.buf[i] + 4ull * lead;
        table[i].nwords = (uint32_t)(st.sizes[i] / 4) - lead;
        table[i].salt = (i + 1) * 0x165667B1u;
        if (table[i].nwords > maxn)
            maxn = table[i].nwords;
    }
    CHECK(cuMemAlloc(&st.table, st.k * sizeof(pc_entry)));
    CHECK(cuMemcpyHtoD(st.table, table, st.k * sizeof(pc_entry)));
    /* The interior words before odd entries' pointers are never written:
     * zero them so that the checksum covers defined contents. */
    for (unsigned i = 1; i < st.k; i += 2)
        CHECK(cuMemsetD32Async(st.buf[i], 0, INTERIOR_WORDS, st.s));

    if (app.still_mib) {
        /* Memory the kernels never write (as weights beside training
         * state): a checkpoint finds it unchanged, whatever they do. */
        st.still_size = (size_t)app.still_mib << 20;
        uint32_t *host = malloc(st.still_size);
        if (!host)
            gpuapp_die("out of host memory");
        for (size_t j = 0; j < st.still_size / 4; j++)
            host[j] = gpuapp_mix32((uint32_t)j * 0x9E3779B1u + app.seed);
        CHECK(cuMemAlloc(&st.still, st.still_size));
        CHECK(cuMemcpyHtoD(st.still, host, st.still_size));
        free(host);
    }

    /* Grid: x covers the largest buffer (capped), y one row per entry. */
    st.grid_x = gpuapp_grid(maxn);
    CUdeviceptr t = st.table;
    uint32_t nent = st.k, seed = app.seed;
    void *args[] = {&t, &nent, &seed};
    CHECK(cuLaunchKernel(st.f_init, st.grid_x, st.k, 1, GPUAPP_BLOCK, 1, 1, 0, st.s, args, NULL));
    CHECK(cuStreamSynchronize(st.s));

    gpuapp_ready(&app, app.mib + app.still_mib, st.k);
    gpuapp_loop(&app, &st, step, checksum);

    CHECK(cuStreamSynchronize(st.s));
    for (unsigned i = 0; i < st.k; i++)
        CHECK(cuMemFree(st.buf[i]));
    CHECK(cuMemFree(st.table));
    if (st.still)
        CHECK(cuMemFree(st.still));
    CHECK(cuStreamDestroy(st.s));
    CHECK(cuModuleUnload(st.mod));
    gpuapp_context_release(&app);
    free(st.sizes);
    free(st.buf);
    free(table);
    return 0;
}

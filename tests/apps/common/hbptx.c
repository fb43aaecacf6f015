/*
 * The heartbeat's kernels, shared by heartbeat (on the driver API) and rtbeat
 * (the same work on the CUDA runtime, with the same checksums).
 */
#include "gpuapp.h"

/*
 * The kernels (the simulator's C versions are in tests/sim/kernels/apps.c and
 * must compute exactly the same):
 *
 * app_hb_init(u32 *buf, u32 n, u32 seed):
 *   buf[j] = mix32(j * 0x9E3779B1 + seed), mix32 = murmur3's finalizer:
 *   x ^= x >> 16; x *= 0x85EBCA6B; x ^= x >> 13; x *= 0xC2B2AE35; x ^= x >> 16
 * app_hb_step(u32 *buf, u32 n, u32 iter, u32 salt):
 *   k = iter * 0x9E3779B1 + salt;
 *   v = (buf[j] ^ k) * 0x01000193; v ^= v >> 13; buf[j] = v + ((j << 3) ^ k)
 * app_hb_mix(u32 *dst, u32 *src, u32 count, u32 nsrc, u32 iter), j < count:
 *   dst[j] = (dst[j] ^ src[(j * 13 + iter) % nsrc]) + (j ^ iter)
 *
 * Each is a grid-stride loop over j; every element is read and written by
 * one thread only, and app_hb_mix's src never overlaps dst.
 */
const char gpuapp_hb_ptx[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry app_hb_init(\n"
    "\t.param .u64 app_hb_init_param_0,\n"
    "\t.param .u32 app_hb_init_param_1,\n"
    "\t.param .u32 app_hb_init_param_2\n"
    ")\n"
    "{\n"
    "\t.reg .pred %p<2>;\n"
    "\t.reg .b32 %r<12>;\n"
    "\t.reg .b64 %rd<6>;\n"
    "\n"
    "\tld.param.u64 %rd1, [app_hb_init_param_0];\n"
    "\tld.param.u32 %r1, [app_hb_init_param_1];\n"
    "\tld.param.u32 %r2, [app_hb_init_param_2];\n"
    "\tcvta.to.global.u64 %rd2, %rd1;\n"
    "\tmov.u32 %r3, %ctaid.x;\n"
    "\tmov.u32 %r4, %ntid.x;\n"
    "\tmov.u32 %r5, %tid.x;\n"
    "\tmad.lo.u32 %r6, %r3, %r4, %r5;\n" /* j */
    "\tmov.u32 %r7, %nctaid.x;\n"
    "\tmul.lo.u32 %r7, %r7, %r4;\n" /* grid stride */
    "\tsetp.ge.u32 %p1, %r6, %r1;\n"
    "\t@%p1 bra $HI_done;\n"
    "$HI_loop:\n"
    "\tmad.lo.u32 %r8, %r6, 0x9E3779B1, %r2;\n"
    "\tshr.u32 %r9, %r8, 16;\n"
    "\txor.b32 %r8, %r8, %r9;\n"
    "\tmul.lo.u32 %r8, %r8, 0x85EBCA6B;\n"
    "\tshr.u32 %r9, %r8, 13;\n"
    "\txor.b32 %r8, %r8, %r9;\n"
    "\tmul.lo.u32 %r8, %r8, 0xC2B2AE35;\n"
    "\tshr.u32 %r9, %r8, 16;\n"
    "\txor.b32 %r8, %r8, %r9;\n"
    "\tmul.wide.u32 %rd3, %r6, 4;\n"
    "\tadd.s64 %rd4, %rd2, %rd3;\n"
    "\tst.global.u32 [%rd4], %r8;\n"
    "\tadd.u32 %r6, %r6, %r7;\n"
    "\tsetp.lt.u32 %p1, %r6, %r1;\n"
    "\t@%p1 bra $HI_loop;\n"
    "$HI_done:\n"
    "\tret;\n"
    "}\n"
    "\n"
    ".visible .entry app_hb_step(\n"
    "\t.param .u64 app_hb_step_param_0,\n"
    "\t.param .u32 app_hb_step_param_1,\n"
    "\t.param .u32 app_hb_step_param_2,\n"
    "\t.param .u32 app_hb_step_param_3\n"
    ")\n"
    "{\n"
    "\t.reg .pred %p<2>;\n"
    "\t.reg .b32 %r<14>;\n"
    "\t.reg .b64 %rd<6>;\n"
    "\n"
    "\tld.param.u64 %rd1, [app_hb_step_param_0];\n"
    "\tld.param.u32 %r1, [app_hb_step_param_1];\n"
    "\tld.param.u32 %r2, [app_hb_step_param_2];\n"
    "\tld.param.u32 %r3, [app_hb_step_param_3];\n"
    "\tcvta.to.global.u64 %rd2, %rd1;\n"
    "\tmad.lo.u32 %r10, %r2, 0x9E3779B1, %r3;\n" /* k */
    "\tmov.u32 %r4, %ctaid.x;\n"
    "\tmov.u32 %r5, %ntid.x;\n"
    "\tmov.u32 %r6, %tid.x;\n"
    "\tmad.lo.u32 %r7, %r4, %r5, %r6;\n" /* j */
    "\tmov.u32 %r8, %nctaid.x;\n"
    "\tmul.lo.u32 %r8, %r8, %r5;\n" /* grid stride */
    "\tsetp.ge.u32 %p1, %r7, %r1;\n"
    "\t@%p1 bra $HS_done;\n"
    "$HS_loop:\n"
    "\tmul.wide.u32 %rd3, %r7, 4;\n"
    "\tadd.s64 %rd4, %rd2, %rd3;\n"
    "\tld.global.u32 %r9, [%rd4];\n"
    "\txor.b32 %r9, %r9, %r10;\n"
    "\tmul.lo.u32 %r9, %r9, 0x01000193;\n"
    "\tshr.u32 %r11, %r9, 13;\n"
    "\txor.b32 %r9, %r9, %r11;\n"
    "\tshl.b32 %r11, %r7, 3;\n"
    "\txor.b32 %r11, %r11, %r10;\n"
    "\tadd.u32 %r9, %r9, %r11;\n"
    "\tst.global.u32 [%rd4], %r9;\n"
    "\tadd.u32 %r7, %r7, %r8;\n"
    "\tsetp.lt.u32 %p1, %r7, %r1;\n"
    "\t@%p1 bra $HS_loop;\n"
    "$HS_done:\n"
    "\tret;\n"
    "}\n"
    "\n"
    ".visible .entry app_hb_mix(\n"
    "\t.param .u64 app_hb_mix_param_0,\n"
    "\t.param .u64 app_hb_mix_param_1,\n"
    "\t.param .u32 app_hb_mix_param_2,\n"
    "\t.param .u32 app_hb_mix_param_3,\n"
    "\t.param .u32 app_hb_mix_param_4\n"
    ")\n"
    "{\n"
    "\t.reg .pred %p<2>;\n"
    "\t.reg .b32 %r<16>;\n"
    "\t.reg .b64 %rd<10>;\n"
    "\n"
    "\tld.param.u64 %rd1, [app_hb_mix_param_0];\n"
    "\tld.param.u64 %rd2, [app_hb_mix_param_1];\n"
    "\tld.param.u32 %r1, [app_hb_mix_param_2];\n" /* count */
    "\tld.param.u32 %r2, [app_hb_mix_param_3];\n" /* nsrc */
    "\tld.param.u32 %r3, [app_hb_mix_param_4];\n" /* iter */
    "\tcvta.to.global.u64 %rd3, %rd1;\n"
    "\tcvta.to.global.u64 %rd4, %rd2;\n"
    "\tmov.u32 %r4, %ctaid.x;\n"
    "\tmov.u32 %r5, %ntid.x;\n"
    "\tmov.u32 %r6, %tid.x;\n"
    "\tmad.lo.u32 %r7, %r4, %r5, %r6;\n" /* j */
    "\tmov.u32 %r8, %nctaid.x;\n"
    "\tmul.lo.u32 %r8, %r8, %r5;\n" /* grid stride */
    "\tsetp.ge.u32 %p1, %r7, %r1;\n"
    "\t@%p1 bra $HM_done;\n"
    "$HM_loop:\n"
    "\tmad.lo.u32 %r9, %r7, 13, %r3;\n"
    "\trem.u32 %r9, %r9, %r2;\n"
    "\tmul.wide.u32 %rd5, %r9, 4;\n"
    "\tadd.s64 %rd6, %rd4, %rd5;\n"
    "\tld.global.u32 %r10, [%rd6];\n" /* src word */
    "\tmul.wide.u32 %rd7, %r7, 4;\n"
    "\tadd.s64 %rd8, %rd3, %rd7;\n"
    "\tld.global.u32 %r11, [%rd8];\n" /* dst word */
    "\txor.b32 %r11, %r11, %r10;\n"
    "\txor.b32 %r12, %r7, %r3;\n"
    "\tadd.u32 %r11, %r11, %r12;\n"
    "\tst.global.u32 [%rd8], %r11;\n"
    "\tadd.u32 %r7, %r7, %r8;\n"
    "\tsetp.lt.u32 %p1, %r7, %r1;\n"
    "\t@%p1 bra $HM_loop;\n"
    "$HM_done:\n"
    "\tret;\n"
    "}\n";

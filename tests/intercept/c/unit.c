/*
 * Unit tests of libgpucr.so's driver-free parts: the buffer table, the slab
 * bitmap, the parameter layout cache, launch parameter scanning, the gate, a
 * copy-on-write window's table and the hold on peer sync operations.
 * Built by make as build/bin/intercept-unit; exits 1 on any failure.
 *
 * intercept-unit --bench prints what the hot path's parts cost on this CPU
 * (ns per operation; nothing is asserted): a gate pass from 1 and 8 threads,
 * a counter, and a launch's parameter scan (4 parameters, and one 2 KiB
 * parameter) against a table of 1000 buffers, which the default sampling
 * does for 1 launch in 64.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "1_base.h"

static int failures;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                   \
            failures++;                                                                                                \
        }                                                                                                              \
    } while (0)

static void test_table(void) {
    gc_table t = {0};
    CHECK(gt_init(&t) == 0);
    CHECK(gt_find(gt_snap(&t), 0x1000) == NULL);
    /* insert in scrambled order: 100 buffers of 0x100 bytes with 0x100 gaps */
    for (int k = 0; k < 100; k++) {
        int i = (k * 37) % 100;
        gc_buf b = {.addr = 0x10000 + (uint64_t)i * 0x200, .size = 0x100, .alloc_id = (uint64_t)i + 1, .kind = 1};
        CHECK(gt_insert(&t, &b) == 0);
    }
    const gc_btab *s = gt_snap(&t);
    CHECK(s->n == 100);
    for (size_t i = 1; i < s->n; i++)
        CHECK(s->v[i - 1].addr < s->v[i].addr);
    for (int i = 0; i < 100; i++) {
        uint64_t a = 0x10000 + (uint64_t)i * 0x200;
        const gc_buf *b = gt_find(s, a);
        CHECK(b && b->alloc_id == (uint64_t)i + 1);
        b = gt_find(s, a + 0xff);
        CHECK(b && b->alloc_id == (uint64_t)i + 1);
        CHECK(gt_find(s, a + 0x100) == NULL); /* the gap */
        CHECK(gt_find(s, a - 1) == NULL);
    }
    CHECK(gt_find(s, 0) == NULL);
    CHECK(gt_find(s, UINT64_MAX) == NULL);
    /* overlaps are refused */
    gc_buf ov = {.addr = 0x10080, .size = 0x10};
    CHECK(gt_insert(&t, &ov) == -2);
    ov.addr = 0x100f0;
    ov.size = 0x20;
    CHECK(gt_insert(&t, &ov) == -2);
    ov.addr = 0x10100; /* exactly in the gap */
    ov.size = 0x100;
    CHECK(gt_insert(&t, &ov) == 0);
    /* a snapshot stays valid after later changes (until reclaimed) */
    const gc_btab *old = gt_snap(&t);
    gc_buf out;
    CHECK(gt_remove(&t, 0x10000, &out) == 0 && out.alloc_id == 1);
    CHECK(gt_remove(&t, 0x10000, &out) == -1);
    CHECK(gt_remove(&t, 0x10201, &out) == -1); /* not a start */
    CHECK(gt_find(old, 0x10000) != NULL);
    CHECK(gt_find(gt_snap(&t), 0x10000) == NULL);
    CHECK(t.nretired > 0);
    gt_reclaim(&t);
    CHECK(t.retired == NULL && t.nretired == 0);
    CHECK(gt_snap(&t)->n == 100);
    gt_destroy(&t);
}

static void test_slab(void) {
    gc_slab *s = slab_new(0x700000000000ULL, 2ULL << 20);
    CHECK(s && s->nunits == 8192);
    if (!s)
        return;
    int64_t a = slab_take(s, 1);
    int64_t b = slab_take(s, 256);
    int64_t c = slab_take(s, 257);
    int64_t d = slab_take(s, 1000);
    CHECK(a == 0 && b == 256 && c == 512 && d == 1024);
    CHECK(s->used == 1 + 1 + 2 + 4);
    slab_give(s, (uint64_t)c, 257);
    CHECK(slab_take(s, 300) == 512); /* first fit reuses the hole */
    CHECK(slab_take(s, 600) == 2048);
    /* fill it up with 1 MiB - 4 KiB, then nothing larger than what is left fits */
    int64_t big = slab_take(s, (1ULL << 20));
    CHECK(big >= 0 && big % 256 == 0);
    CHECK(slab_take(s, (1ULL << 20)) == -1);
    /* all offsets 256-aligned, no overlaps: take many small ones until full */
    uint64_t total = 0;
    int64_t o;
    while ((o = slab_take(s, 4000)) >= 0) {
        CHECK(o % 256 == 0);
        CHECK((uint64_t)o + 4000 <= s->size);
        total += 4096;
    }
    CHECK(total > 0);
    /* give everything back: empty again */
    slab_give(s, 0, s->size);
    CHECK(s->used == 0);
    CHECK(slab_take(s, s->size) == 0);
    CHECK(slab_take(s, 1) == -1);
    slab_give(s, 0, s->size);
    slab_free(s);
}

/*
 * fake driver: handle 0x100 is a function with params (8, 4, 16); 0x200 a CUkernel (4, 8); 0x300 unknown; 0x400 a
 * function with one 2 KiB parameter
 */
static int func_calls, kern_calls;

static CUresult fake_func(void *h, size_t i, size_t *off, size_t *size) {
    func_calls++;
    static const size_t sz[] = {8, 4, 16}, of[] = {0, 8, 16};
    if ((uintptr_t)h == 0x400) {
        if (i >= 1)
            return CUDA_ERROR_INVALID_VALUE;
        *off = 0;
        *size = 2048;
        return CUDA_SUCCESS;
    }
    if ((uintptr_t)h != 0x100)
        return CUDA_ERROR_INVALID_HANDLE;
    if (i >= 3)
        return CUDA_ERROR_INVALID_VALUE;
    *off = of[i];
    *size = sz[i];
    return CUDA_SUCCESS;
}

static CUresult fake_kern(void *h, size_t i, size_t *off, size_t *size) {
    kern_calls++;
    static const size_t sz[] = {4, 8}, of[] = {0, 8};
    if ((uintptr_t)h != 0x200)
        return CUDA_ERROR_INVALID_HANDLE;
    if (i >= 2)
        return CUDA_ERROR_INVALID_VALUE;
    *off = of[i];
    *size = sz[i];
    return CUDA_SUCCESS;
}

static void test_scan(void) {
    gc_table t = {0};
    CHECK(gt_init(&t) == 0);
    gc_buf b1 = {.addr = 0x500000000000ULL, .size = 1 << 20, .alloc_id = 7};
    gc_buf b2 = {.addr = 0x500000200000ULL, .size = 4096, .alloc_id = 8};
    CHECK(gt_insert(&t, &b1) == 0 && gt_insert(&t, &b2) == 0);
    const gc_btab *s = gt_snap(&t);
    gc_scan_set_query(fake_func, fake_kern);

    uint64_t p0 = b1.addr + 64;                               /* a pointer */
    uint32_t p1 = 42;                                         /* an int */
    uint64_t p2[2] = {b2.addr + 4095, 0x500000100000ULL + 5}; /* struct of two words: in b2, past b1 */
    void *params[] = {&p0, &p1, p2};
    uint64_t before[STAT_N], after[STAT_N];
    gc_stats_sum(before);
    CHECK(gc_scan_launch(s, (void *)0x100, params, NULL, NULL) == 2);
    CHECK(gc_scan_launch(s, (void *)0x100, params, NULL, NULL) == 2);
    CHECK(func_calls == 4); /* 3 params + the end, asked once */
    CHECK(gc_layout_count() == 1);

    /* a CUkernel: cuFuncGetParamInfo says INVALID_HANDLE, cuKernelGetParamInfo answers */
    uint32_t k0 = 1;
    uint64_t k1 = b2.addr;
    void *kparams[] = {&k0, &k1};
    int fc = func_calls;
    CHECK(gc_scan_launch(s, (void *)0x200, kparams, NULL, NULL) == 1);
    CHECK(gc_scan_launch(s, (void *)0x200, kparams, NULL, NULL) == 1);
    CHECK(func_calls == fc + 1 && kern_calls == 3);
    CHECK(gc_layout_count() == 2);

    /* unknown handle: no layout, asked once */
    int kc = kern_calls;
    CHECK(gc_scan_launch(s, (void *)0x300, kparams, NULL, NULL) == 0);
    CHECK(gc_scan_launch(s, (void *)0x300, kparams, NULL, NULL) == 0);
    CHECK(kern_calls == kc + 1);

    /* extra: a packed buffer */
    uint64_t packed[4] = {7, b1.addr, b1.addr + b1.size /* one past: not inside */, b2.addr + 8};
    size_t psize = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &psize, CU_LAUNCH_PARAM_END};
    CHECK(gc_scan_launch(s, (void *)0x300, NULL, extra, NULL) == 2);
    /* unaligned tail bytes are not a word */
    CHECK(gc_scan_words(s, packed, 15) == 0);
    CHECK(gc_scan_words(s, packed, 16) == 1);

    gc_stats_sum(after);
    CHECK(after[STAT_LAUNCHES] - before[STAT_LAUNCHES] == 7);
    CHECK(after[STAT_LAUNCH_HITS] - before[STAT_LAUNCH_HITS] == 5);
    CHECK(after[STAT_PTR_WORDS] - before[STAT_PTR_WORDS] == 2 + 2 + 1 + 1 + 2);
    CHECK(after[STAT_NO_LAYOUT] - before[STAT_NO_LAYOUT] == 2);

    /* sampling: the interval grows with the words a scan read, from at least 64 launches */
    CHECK(gc_scan_interval(0) == GC_SCAN_SAMPLE_MIN && gc_scan_interval(3) == GC_SCAN_SAMPLE_MIN);
    CHECK(gc_scan_interval(256) == 256 * GC_SCAN_LAUNCHES_PER_WORD);
    CHECK(gc_scan_interval((size_t)1 << 40) == UINT32_MAX);
    uint64_t blob[256] = {b1.addr};
    void *bparams[] = {blob};
    gc_scan_wait = 0;
    CHECK(gc_scan_due());
    CHECK(gc_scan_sample(s, (void *)0x400, bparams, NULL) == 1);
    int passed = 0;
    while (!gc_scan_due())
        passed++;
    CHECK(passed == 256 * GC_SCAN_LAUNCHES_PER_WORD - 1);
    CHECK(gc_scan_sample(s, (void *)0x100, params, NULL) == 2);
    CHECK(gc_scan_wait == GC_SCAN_SAMPLE_MIN - 1);

    /* after an unload, layouts are asked again */
    gc_layout_invalidate();
    fc = func_calls;
    CHECK(gc_scan_launch(s, (void *)0x100, params, NULL, NULL) == 2);
    CHECK(func_calls == fc + 4);
    gc_layout_reclaim();
    gt_destroy(&t);
}

/* ---- the gate ---- */

static _Atomic int gate_step;

static void *one_call(void *arg) {
    (void)arg;
    gc_gate_enter();
    gc_gate_leave();
    return NULL;
}

/* Enters and stays in the call until gate_step is 1, then leaves. */
static void *long_call(void *arg) {
    (void)arg;
    gc_gate_enter();
    atomic_store(&gate_step, 2);
    while (atomic_load(&gate_step) != 1) {
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
    }
    gc_gate_leave();
    return NULL;
}

/* Enters once the gate lets it; records that it did. */
static void *late_call(void *arg) {
    gc_gate_enter();
    atomic_store((_Atomic int *)arg, 1);
    gc_gate_leave();
    return NULL;
}

static void test_gate(void) {
    gc_gate_init();
    one_call(NULL);
    size_t base = gc_gate_slots();
    CHECK(base == 1);
    /* a thread's slot goes back at its exit, and the next thread takes it */
    for (int i = 0; i < 5; i++) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, one_call, NULL) == 0);
        pthread_join(t, NULL);
    }
    CHECK(gc_gate_slots() == base + 1);
    /* a call in progress keeps the gate from closing; closing waits for it */
    pthread_t lc;
    atomic_store(&gate_step, 0);
    CHECK(pthread_create(&lc, NULL, long_call, NULL) == 0);
    while (atomic_load(&gate_step) != 2)
        sched_yield();
    CHECK(gc_gate_close(50) == -ETIMEDOUT);
    atomic_store(&gate_step, 1);
    pthread_join(lc, NULL);
    CHECK(gc_gate_close(1000) == 0);
    /* a call made while closed waits for the gate to open */
    _Atomic int entered = 0;
    pthread_t late;
    CHECK(pthread_create(&late, NULL, late_call, (void *)&entered) == 0);
    struct timespec t = {0, 50000000};
    nanosleep(&t, NULL);
    CHECK(atomic_load(&entered) == 0);
    gc_gate_open();
    pthread_join(late, NULL);
    CHECK(atomic_load(&entered) == 1);
}

/* ---- peer sync operations ---- */

static _Atomic int sync_done;

/* (intptr_t)arg peer sync operations, each through the gate */
static void *sync_ops(void *arg) {
    for (intptr_t i = 0; i < (intptr_t)arg; i++) {
        gc_sync_enter(true);
        gc_gate_leave();
        atomic_fetch_add(&sync_done, 1);
    }
    return NULL;
}

static void wait_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void test_sync(void) {
    CHECK(gc_sync_kernel_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
    CHECK(gc_sync_kernel_name("ncclKernel_AllReduce_RING_LL_Sum_float"));
    CHECK(!gc_sync_kernel_name("nccl"));
    CHECK(!gc_sync_kernel_name("my_ncclDevKernel"));
    /* as the driver names NCCL's kernels: C++ names, mangled */
    CHECK(gc_sync_kernel_name("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL19ncclDevKernelArgs4K"));
    CHECK(gc_sync_kernel_name("_Z21ncclDevKernel_Generic19ncclDevKernelArgs4K"));
    CHECK(gc_sync_kernel_name("_Z43ncclSymkDevKernel_AllReduce_AGxLL_R_sum_f3220ncclSymkDevWorkArgs4K"));
    CHECK(!gc_sync_kernel_name("_Z16my_ncclDevKernelv"));
    CHECK(!gc_sync_kernel_name("_Z13oneRankReducePvS_mmii"));
    CHECK(!gc_sync_kernel_name("_Z"));
    CHECK(!gc_sync_kernel_name("_Z0ncclDevKernel"));
    CHECK(!gc_sync_kernel_name(NULL));
    gc_sync_reset();
    /* no hold: operations pass and are counted; other calls are not */
    sync_ops((void *)3);
    gc_sync_enter(false);
    gc_gate_leave();
    CHECK(gc_sync_count() == 3);
    /* a hold stops the next operation, outside the gate: the gate closes meanwhile */
    CHECK(gc_sync_hold() == 3);
    atomic_store(&sync_done, 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, sync_ops, (void *)4) == 0);
    wait_ms(50);
    CHECK(atomic_load(&sync_done) == 0);
    CHECK(gc_gate_close(200) == 0);
    gc_gate_open();
    /* reach: it runs on to the target and is held there */
    CHECK(gc_sync_reach(5, 2000) == 0);
    CHECK(gc_sync_count() == 5);
    wait_ms(50);
    CHECK(atomic_load(&sync_done) == 2);
    CHECK(gc_sync_reach(4, 100) == -ERANGE);
    /* a target it cannot reach times out */
    CHECK(gc_sync_reach(8, 100) == -ETIMEDOUT);
    CHECK(gc_sync_count() == 7);
    /* release: the rest goes */
    gc_sync_release();
    pthread_join(t, NULL);
    CHECK(atomic_load(&sync_done) == 4);
    CHECK(gc_sync_count() == 7);
    gc_sync_reset();
    CHECK(gc_sync_count() == 0);
}

static void *graph_launch(void *arg) {
    gc_sync_enter_n(gc_sync_graph_ops(arg));
    gc_gate_leave();
    atomic_fetch_add(&sync_done, 1);
    return NULL;
}

/* NCCL launches captured into a graph count when an executable graph made from it is launched, all at once */
static void test_sync_graphs(void) {
    gc_sync_reset();
    void *g = (void *)0x6000, *other = (void *)0x7000, *x = (void *)0x8000, *y = (void *)0x9000;
    gc_sync_captured(g);
    gc_sync_captured(g);
    gc_sync_captured(g);
    CHECK(gc_sync_count() == 0); /* captured, not run */
    gc_sync_instantiated(x, g);
    gc_sync_instantiated(y, other); /* a graph without NCCL's launches */
    CHECK(gc_sync_graph_ops(x) == 3);
    CHECK(gc_sync_graph_ops(y) == 0);
    gc_sync_enter_n(gc_sync_graph_ops(x));
    gc_gate_leave();
    CHECK(gc_sync_count() == 3);
    /* held at 4: a launch of 3 would pass it, so it waits whole; a reach to 6 lets it go */
    sync_ops((void *)1);
    CHECK(gc_sync_hold() == 4);
    atomic_store(&sync_done, 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, graph_launch, x) == 0);
    wait_ms(50);
    CHECK(atomic_load(&sync_done) == 0);
    CHECK(gc_sync_count() == 4);
    CHECK(gc_sync_reach(7, 2000) == 0);
    pthread_join(t, NULL);
    CHECK(gc_sync_count() == 7);
    gc_sync_release();
    /* destroyed: the handle counts nothing any more (the driver may hand it out again) */
    gc_sync_graph_gone(x, true);
    CHECK(gc_sync_graph_ops(x) == 0);
    gc_sync_graph_gone(g, false);
    gc_sync_instantiated(x, g);
    CHECK(gc_sync_graph_ops(x) == 0);
    gc_sync_reset();
}

/* ---- --bench ---- */

static double bench_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

#define BENCH_N 10000000L

static void *gate_loop(void *arg) {
    long n = *(long *)arg;
    for (long i = 0; i < n; i++) {
        gc_gate_enter();
        gc_gate_leave();
    }
    return NULL;
}

static void bench(void) {
    gc_gate_init();
    long n = BENCH_N;
    double t0 = bench_now();
    gate_loop(&n);
    printf("gate enter+leave, 1 thread      %6.1f ns\n", (bench_now() - t0) / (double)n);
    pthread_t th[8];
    t0 = bench_now();
    for (int i = 0; i < 8; i++)
        pthread_create(&th[i], NULL, gate_loop, &n);
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    printf("gate enter+leave, 8 threads     %6.1f ns (wall per pass per thread)\n", (bench_now() - t0) / (double)n);
    t0 = bench_now();
    for (long i = 0; i < n; i++)
        gc_stat_add(STAT_LAUNCHES, 1);
    printf("counter                         %6.1f ns\n", (bench_now() - t0) / (double)n);

    gc_table t = {0};
    gt_init(&t);
    for (uint64_t i = 0; i < 1000; i++) {
        gc_buf b = {.addr = 0x500000000000ULL + i * (4 << 20), .size = 1 << 20, .alloc_id = i + 1};
        gt_insert(&t, &b);
    }
    const gc_btab *s = gt_snap(&t);
    gc_scan_set_query(fake_func, fake_kern);
    uint64_t p0 = 0x500000000000ULL + 64;
    uint32_t p1 = 42;
    uint64_t p2[2] = {0x500000400000ULL + 8, 0x7f0000000000ULL};
    void *params[] = {&p0, &p1, p2};
    long m = 1000000;
    gc_scan_launch(s, (void *)0x100, params, NULL, NULL); /* the layout, once */
    t0 = bench_now();
    for (long i = 0; i < m; i++)
        gc_scan_launch(s, (void *)0x100, params, NULL, NULL);
    double small = (bench_now() - t0) / (double)m;
    uint64_t blob[256];
    for (int i = 0; i < 256; i++)
        blob[i] = 0x500000000000ULL + (uint64_t)(i % 1000) * (4 << 20) + 8;
    t0 = bench_now();
    for (long i = 0; i < m; i++)
        gc_scan_words(s, blob, sizeof blob);
    double big = (bench_now() - t0) / (double)m;
    void *bparams[] = {blob};
    gc_scan_launch(s, (void *)0x400, bparams, NULL, NULL); /* the layout, once */
    gc_scan_wait = 0;
    long n_big = 16 * 1000 * 1000;
    t0 = bench_now();
    for (long i = 0; i < n_big; i++)
        if (gc_scan_due())
            gc_scan_sample(s, (void *)0x400, bparams, NULL);
    double sampled_big = (bench_now() - t0) / (double)n_big;
    gc_scan_wait = 0;
    t0 = bench_now();
    for (long i = 0; i < n_big; i++)
        if (gc_scan_due())
            gc_scan_sample(s, (void *)0x100, params, NULL);
    double sampled_small = (bench_now() - t0) / (double)n_big;
    printf("scan, 4 parameters              %6.1f ns (sampled: %.1f ns a launch)\n", small, sampled_small);
    printf("scan, one 2 KiB parameter       %6.1f ns (sampled: %.1f ns a launch, 1 in %u)\n", big, sampled_big,
           gc_scan_interval(256));
    gt_destroy(&t);

    /* a process that shares memory (an NCCL rank): every launch asks whether it is a peer sync operation (the
     * layout cache), and one that is (NCCL's kernels) counts itself under the hold's mutex */
    gc_sync_reset();
    atomic_store(&gc_sharing, true);
    gc_launch_sync((void *)0x100); /* the layout, once */
    t0 = bench_now();
    for (long i = 0; i < m; i++) {
        gc_sync_enter(gc_launch_sync((void *)0x100));
        gc_gate_leave();
    }
    double plain_launch = (bench_now() - t0) / (double)m;
    t0 = bench_now();
    for (long i = 0; i < m; i++) {
        gc_sync_enter(true);
        gc_gate_leave();
    }
    double sync_op = (bench_now() - t0) / (double)m;
    printf("launch, sharing memory          %6.1f ns (the gate and the layout lookup); an NCCL kernel's: %.1f ns\n",
           plain_launch, sync_op);
    gc_sync_reset();
}

/* A copy-on-write window's table: pending chunks found and merged by range, marked saved; a pointer into one
 * of the application's VMM mappings placed back to back reaches the whole span, one into a plain allocation
 * only that allocation; the gate's window bit. */
static void test_guard(void) {
    const uint64_t C = 1 << 20; /* chunk */
    uint8_t all[1] = {0x0f};    /* 4 chunks pending */
    uint8_t some[1] = {0x05};   /* chunks 0 and 2 */
    gc_guard_region regs[] = {
        {.addr = 0x100000000, .size = 4 * C, .bits = all, .nbits = 1},              /* plain */
        {.addr = 0x100400000, .size = 4 * C, .bits = some, .nbits = 1},             /* plain, adjacent */
        {.addr = 0x200000000, .size = 2 * C, .bits = all, .nbits = 1, .vmm = true}, /* VMM, back to back */
        {.addr = 0x200200000, .size = 2 * C, .bits = all, .nbits = 1, .vmm = true},
    };
    CHECK(gc_guard_build(regs, 4, C) == 0);
    gc_range r[8];
    CHECK(gc_guard_pending(0x100000000 + 10, 0x100000000 + 2 * C, r, 8) == 1);
    CHECK(r[0].addr == 0x100000000 && r[0].size == 2 * C); /* chunks 0 and 1, merged */
    size_t n = gc_guard_pending(0x100400000, 0x100800000, r, 8);
    CHECK(n == 2 && r[0].addr == 0x100400000 && r[0].size == C && r[1].addr == 0x100400000 + 2 * C);
    CHECK(gc_guard_pending(0x100000000, 0x100800000, r, 1) == 2); /* more than max */
    gc_guard_saved(0x100000000, 0x100000000 + C);
    CHECK(gc_guard_pending(0x100000000, 0x100000000 + 4 * C, r, 8) == 1 && r[0].addr == 0x100000000 + C);
    uint64_t base, size;
    CHECK(gc_guard_region_of(0x100400000 + 5, &base, &size) && base == 0x100400000 && size == 4 * C);
    CHECK(gc_guard_region_of(0x200300000, &base, &size) && base == 0x200000000 && size == 4 * C);
    CHECK(!gc_guard_region_of(0x300000000, &base, &size));
    uint64_t lo, hi;
    CHECK(gc_guard_any(&lo, &hi) && lo == 0x100000000 && hi == 0x200400000);
    /* the gate: a window makes gc_gate_enter say so, and no call waits */
    gc_gate_window(true);
    CHECK(gc_gate_enter() == 1);
    gc_gate_leave();
    gc_gate_window(false);
    CHECK(gc_gate_enter() == 0);
    gc_gate_leave();
    gc_guard_drop();
    CHECK(!gc_guard_any(&lo, &hi));
    CHECK(gc_guard_pending(0x100000000, 0x100800000, r, 8) == 0);
}

/* ---- write sets ---- */

/* Handle 0x100 (fake_func's three parameters) is kernel "k3" of module 0xa0; 0x200 (fake_kern's two) is
 * "k2" of library 0xb0. */
static CUresult fake_func_owner(void *h, void **owner, const char **name) {
    if ((uintptr_t)h != 0x100)
        return CUDA_ERROR_INVALID_HANDLE;
    *owner = (void *)0xa0;
    *name = "k3";
    return CUDA_SUCCESS;
}

static CUresult fake_kern_owner(void *h, void **owner, const char **name) {
    if ((uintptr_t)h != 0x200)
        return CUDA_ERROR_INVALID_HANDLE;
    *owner = (void *)0xb0;
    *name = "k2";
    return CUDA_SUCCESS;
}

static void count_word(uint64_t w, void *arg) {
    if (w >= 0x500000000000ULL)
        (*(int *)arg)++;
}

static gc_kwrite *kwrites(const char *name, uint64_t written) {
    gc_kwrite *k = calloc(1, sizeof *k);
    k->name = strdup(name);
    k->written = written;
    k->decided = true;
    k->reads_decided = true;
    return k;
}

static void test_writes(void) {
    gc_scan_set_query(fake_func, fake_kern);
    gc_scan_set_owner(fake_func_owner, fake_kern_owner);
    gc_layout_invalidate();
    uint64_t p0 = 0x500000000000ULL;
    uint32_t p1 = 42;
    uint64_t p2[2] = {0x500000200000ULL, 0x500000300000ULL};
    void *params[] = {&p0, &p1, p2};
    int words = 0;
    /* not analysed: every pointer word */
    CHECK(gc_scan_each((void *)0x100, params, NULL, true, count_word, &words, NULL) && words == 3);
    /* module 0xa0's k3 writes through parameter 2 only; once its layout is asked again */
    CHECK(!gc_writes_any());
    gc_writes_add((void *)0xa0, kwrites("k3", 1u << 2), 1);
    CHECK(gc_writes_any());
    gc_kwrite w = {0};
    CHECK(gc_writes_find((void *)0xa0, "k3", &w) && w.written == 4 && w.decided);
    CHECK(!gc_writes_find((void *)0xa0, "k4", &w) && !gc_writes_find((void *)0xb0, "k3", &w));
    gc_layout_invalidate();
    words = 0;
    CHECK(gc_scan_each((void *)0x100, params, NULL, true, count_word, &words, NULL) && words == 2);
    /* the packed form: the parameters at their offsets */
    uint64_t packed[4] = {p0, p1, p2[0], p2[1]};
    size_t psize = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &psize, CU_LAUNCH_PARAM_END};
    words = 0;
    CHECK(gc_scan_each((void *)0x100, NULL, extra, true, count_word, &words, NULL) && words == 2);
    /* a CUkernel of library 0xb0 that writes through nothing it is given */
    gc_writes_add((void *)0xb0, kwrites("k2", 0), 1);
    uint32_t k0 = 1;
    uint64_t k1 = 0x500000000000ULL;
    void *kparams[] = {&k0, &k1};
    words = 0;
    CHECK(gc_scan_each((void *)0x200, kparams, NULL, true, count_word, &words, NULL) && words == 0);
    /* unloaded: the layouts are asked again, and write everything again */
    gc_writes_drop((void *)0xa0);
    gc_layout_invalidate();
    words = 0;
    CHECK(gc_scan_each((void *)0x100, params, NULL, true, count_word, &words, NULL) && words == 3);
    gc_writes_reset();
    CHECK(!gc_writes_find((void *)0xb0, "k2", &w) && !gc_writes_any());
    gc_scan_set_owner(NULL, NULL);
    gc_layout_invalidate();
    gc_layout_reclaim();
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench();
        return 0;
    }
    test_gate();
    test_table();
    test_slab();
    test_scan();
    test_guard();
    test_writes();
    test_sync();
    test_sync_graphs();
    if (failures) {
        fprintf(stderr, "intercept-unit: %d failures\n", failures);
        return 1;
    }
    printf("intercept-unit: ok\n");
    return 0;
}

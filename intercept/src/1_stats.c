/*
 * The counters GetStats reports (enum gc_stat): one block per thread, which
 * that thread alone writes, so that counting costs a call no lock and no
 * write to a cache line another thread writes; a thread's first count
 * registers its block once. The sum is read rarely (a stats request).
 * This file calls nothing of the interposer: every file may count.
 */
#include <stdlib.h>
#include <string.h>

#include "1_base.h"

typedef struct tstats {
    _Atomic uint64_t c[STAT_N];
    struct tstats *next;
} tstats;

static _Atomic(tstats *) all_stats;
static __thread tstats *my_stats __attribute__((tls_model("initial-exec")));
static tstats overflow_stats; /* if a thread's block cannot be allocated */

static tstats *stats_block(void) {
    tstats *t = my_stats;
    if (__builtin_expect(t != NULL, 1))
        return t;
    t = calloc(1, sizeof *t);
    if (!t)
        return &overflow_stats;
    tstats *head = atomic_load(&all_stats);
    do
        t->next = head;
    while (!atomic_compare_exchange_weak(&all_stats, &head, t));
    my_stats = t;
    return t;
}

void gc_stat_add(enum gc_stat s, uint64_t v) {
    /* one writer per block: a relaxed add, no lock prefix contention */
    tstats *t = stats_block();
    if (t == &overflow_stats)
        atomic_fetch_add_explicit(&t->c[s], v, memory_order_relaxed);
    else
        atomic_store_explicit(&t->c[s], atomic_load_explicit(&t->c[s], memory_order_relaxed) + v, memory_order_relaxed);
}

void gc_stats_sum(uint64_t out[STAT_N]) {
    memset(out, 0, sizeof(uint64_t) * STAT_N);
    for (tstats *t = atomic_load(&all_stats); t; t = t->next)
        for (int i = 0; i < STAT_N; i++)
            out[i] += atomic_load_explicit(&t->c[i], memory_order_relaxed);
    for (int i = 0; i < STAT_N; i++)
        out[i] += atomic_load_explicit(&overflow_stats.c[i], memory_order_relaxed);
}

void gc_stats_reset(void) {
    for (tstats *t = atomic_load(&all_stats); t; t = t->next)
        for (int i = 0; i < STAT_N; i++)
            atomic_store(&t->c[i], 0);
    for (int i = 0; i < STAT_N; i++)
        atomic_store(&overflow_stats.c[i], 0);
}

/*
 * hostfn: GPU work that is only host functions (cuLaunchHostFunc), one per
 * iteration on one stream, each adding its iteration to a counter. The
 * checksum is that counter: a host function that did not run, ran twice or
 * out of order shows. No device memory: what the tests watch is the gate (a
 * quiesced process queues no work, whatever entry point it uses).
 */
#include <stdatomic.h>
#include <string.h>

#include "gpuapp.h"

typedef struct {
    CUstream s;
    _Atomic uint64_t sum;
    uint32_t expect_next;
    _Atomic uint32_t order_errors;
} hf_state;

typedef struct {
    hf_state *st;
    uint32_t iter;
} hf_call;

static hf_call calls[1024];

static void add_iter(void *p) {
    hf_call *c = p;
    hf_state *st = c->st;
    if (c->iter != st->expect_next)
        atomic_fetch_add(&st->order_errors, 1);
    st->expect_next = c->iter + 1;
    atomic_fetch_add(&st->sum, (uint64_t)gpuapp_mix32(c->iter));
}

static void step(void *p, uint32_t iter) {
    hf_state *st = p;
    hf_call *c = &calls[iter % 1024];
    /* the slot's previous call (1024 iterations ago) has run: at most one is in flight */
    CHECK(cuStreamSynchronize(st->s));
    c->st = st;
    c->iter = iter;
    CHECK(cuLaunchHostFunc(st->s, add_iter, c));
}

static uint64_t checksum(void *p) {
    hf_state *st = p;
    CHECK(cuStreamSynchronize(st->s));
    if (atomic_load(&st->order_errors))
        gpuapp_die("%u host functions ran out of order", atomic_load(&st->order_errors));
    return atomic_load(&st->sum);
}

int main(int argc, char **argv) {
    gpuapp app;
    static hf_state st;
    gpuapp_parse(&app, "hostfn", 0, 0, 0, argc, argv);
    gpuapp_context(&app);
    CHECK(cuStreamCreate(&st.s, CU_STREAM_NON_BLOCKING));
    st.expect_next = 1;
    gpuapp_ready(&app, 0, 0);
    gpuapp_loop(&app, &st, step, checksum);
    CHECK(cuStreamDestroy(st.s));
    gpuapp_context_release(&app);
    return 0;
}

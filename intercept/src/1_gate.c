/*
 * The gate: every wrapper that queues work or touches memory passes it
 * (gc_gate_enter / gc_gate_leave); the control thread closes it for a
 * checkpoint once no call is in progress (Quiesce) and opens it again
 * (Resume). The control thread itself passes a closed gate.
 */
#include <errno.h>
#include <time.h>

#include "1_base.h"

static _Atomic long inflight;
static _Atomic int gate_closed;
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv;
__thread int gc_in_control __attribute__((tls_model("initial-exec")));

static void gate_init_cv(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&gate_cv, &a);
    pthread_condattr_destroy(&a);
}

void gc_gate_leave(void) {
    if (atomic_fetch_sub(&inflight, 1) == 1 && atomic_load(&gate_closed)) {
        pthread_mutex_lock(&gate_mu);
        pthread_cond_broadcast(&gate_cv);
        pthread_mutex_unlock(&gate_mu);
    }
}

void gc_gate_enter(void) {
    for (;;) {
        atomic_fetch_add(&inflight, 1);
        if (__builtin_expect(!atomic_load(&gate_closed), 1) || gc_in_control)
            return;
        gc_gate_leave();
        gc_stat_add(STAT_GATE_WAITS, 1);
        pthread_mutex_lock(&gate_mu);
        while (atomic_load(&gate_closed))
            pthread_cond_wait(&gate_cv, &gate_mu);
        pthread_mutex_unlock(&gate_mu);
    }
}

int gc_gate_close(unsigned timeout_ms) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&gate_mu);
    atomic_store(&gate_closed, 1);
    int rc = 0;
    while (atomic_load(&inflight) > 0 && rc == 0)
        rc = pthread_cond_timedwait(&gate_cv, &gate_mu, &dl);
    if (atomic_load(&inflight) > 0) {
        atomic_store(&gate_closed, 0);
        pthread_cond_broadcast(&gate_cv);
        pthread_mutex_unlock(&gate_mu);
        return -ETIMEDOUT;
    }
    pthread_mutex_unlock(&gate_mu);
    return 0;
}

void gc_gate_open(void) {
    pthread_mutex_lock(&gate_mu);
    atomic_store(&gate_closed, 0);
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

void gc_gate_reset(void) {
    atomic_store(&inflight, 0);
    atomic_store(&gate_closed, 0);
    pthread_mutex_init(&gate_mu, NULL);
    gate_init_cv();
}

void gc_gate_init(void) { gate_init_cv(); }

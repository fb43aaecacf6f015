/*
 * The gate: every wrapper that queues work or touches memory passes it
 * (gc_gate_enter / gc_gate_leave); the control thread closes it for a
 * checkpoint once no call is in progress (Quiesce) and opens it again
 * (Resume). The control thread itself passes a closed gate.
 *
 * The open gate costs a call no system call, no lock and no write to a cache
 * line another thread writes: each thread counts its calls in progress in a
 * slot of its own (a cache line), and reads the gate's flag. Closing is the
 * expensive side, as it is rare: the closer sets the flag, then makes every
 * thread of the process pass a full memory barrier (membarrier, private
 * expedited), then waits until every slot reads 0. A thread that counted
 * itself in before its barrier is seen by the closer; one that did not reads
 * the flag after its barrier, sees the gate closed, counts itself out and
 * waits. Where membarrier is not available (an old kernel, a seccomp filter),
 * each call pays a full fence instead, still without a shared write.
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "1_base.h"

typedef struct gate_slot {
    _Atomic long busy; /* this thread's calls in progress; written by it alone */
    _Atomic int taken; /* a live thread owns it; a thread's exit gives it back for the next new thread */
    struct gate_slot *next;
} __attribute__((aligned(64))) gate_slot;

static _Atomic(gate_slot *) slots;
static __thread gate_slot *my_slot __attribute__((tls_model("initial-exec")));
static pthread_key_t slot_key; /* its destructor gives an exiting thread's slot back */
static pthread_once_t slot_key_once = PTHREAD_ONCE_INIT;
static int slot_key_ok;
/* For threads whose slot could not be allocated: shared, so counted with atomic read-modify-writes. */
static gate_slot overflow_slot;
/* GATE_CLOSED: a checkpoint holds the process; GATE_WINDOW: a copy-on-write window is open (the wrappers check
 * their writes). 0, the steady state, is all a call reads. */
enum { GATE_CLOSED = 1, GATE_WINDOW = 2 };
static _Atomic int gate_closed;
/* no membarrier: every call fences. Read by every call, set by the closer: atomic, relaxed (a plain load on x86). */
static _Atomic int fence_each_call;
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv;
__thread int gc_in_control __attribute__((tls_model("initial-exec")));

static long membarrier(int cmd) { return syscall(SYS_membarrier, cmd, 0, 0); }

void gc_cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

struct timespec gc_deadline_ms(unsigned ms) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

static void gate_setup(void) {
    gc_cond_init_monotonic(&gate_cv);
    atomic_store(&fence_each_call, membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0);
    if (atomic_load(&fence_each_call))
        gc_debug("membarrier unavailable (%s): the gate fences every call", strerror(errno));
}

static void slot_give_back(void *p) { atomic_store((_Atomic int *)&((gate_slot *)p)->taken, 0); }
static void slot_key_make(void) { slot_key_ok = pthread_key_create(&slot_key, slot_give_back) == 0; }

/* The calling thread's slot: one given back by a thread that exited, else a new one. */
static gate_slot *slot(void) {
    gate_slot *s = my_slot;
    if (__builtin_expect(s != NULL, 1))
        return s;
    pthread_once(&slot_key_once, slot_key_make);
    for (s = atomic_load(&slots); s; s = s->next) {
        int free_ = 0;
        if (slot_key_ok && atomic_compare_exchange_strong(&s->taken, &free_, 1))
            break;
    }
    if (!s) {
        s = aligned_alloc(sizeof(gate_slot), sizeof(gate_slot));
        if (!s) {
            my_slot = &overflow_slot;
            return my_slot;
        }
        atomic_init(&s->busy, 0);
        atomic_init(&s->taken, 1);
        gate_slot *head = atomic_load(&slots);
        do
            s->next = head;
        while (!atomic_compare_exchange_weak(&slots, &head, s));
    }
    if (slot_key_ok)
        pthread_setspecific(slot_key, s);
    my_slot = s;
    return s;
}

static inline void count_in(gate_slot *s) {
    if (__builtin_expect(s == &overflow_slot, 0))
        atomic_fetch_add(&s->busy, 1);
    else
        atomic_store_explicit(&s->busy, atomic_load_explicit(&s->busy, memory_order_relaxed) + 1, memory_order_relaxed);
}

static inline void count_out(gate_slot *s) {
    if (__builtin_expect(s == &overflow_slot, 0))
        atomic_fetch_sub(&s->busy, 1);
    else /* release: the closer that reads 0 sees the call finished */
        atomic_store_explicit(&s->busy, atomic_load_explicit(&s->busy, memory_order_relaxed) - 1, memory_order_release);
}

void gc_gate_leave(void) { count_out(my_slot); }

int gc_gate_enter(void) {
    gate_slot *s = slot();
    for (;;) {
        count_in(s);
        if (__builtin_expect(atomic_load_explicit(&fence_each_call, memory_order_relaxed), 0))
            atomic_thread_fence(memory_order_seq_cst);
        else
            atomic_signal_fence(memory_order_seq_cst); /* the closer's membarrier orders it for the CPU */
        int g = atomic_load_explicit(&gate_closed, memory_order_relaxed);
        if (__builtin_expect(g == 0, 1) || gc_in_control)
            return 0;
        if (!(g & GATE_CLOSED))
            return 1; /* a window: the caller checks what it writes */
        count_out(s);
        gc_stat_add(STAT_GATE_WAITS, 1);
        pthread_mutex_lock(&gate_mu);
        while (atomic_load(&gate_closed) & GATE_CLOSED)
            pthread_cond_wait(&gate_cv, &gate_mu);
        pthread_mutex_unlock(&gate_mu);
    }
}

/* A window opens only while the gate is closed (Resume) and is read after a call counted itself in: a call
 * that passed the gate before it opened finished before the gate closed. Closing it needs no barrier: a call
 * that still sees it only asks the helper about chunks it has saved already. */
void gc_gate_window(bool open) {
    if (open)
        atomic_fetch_or(&gate_closed, GATE_WINDOW);
    else
        atomic_fetch_and(&gate_closed, ~GATE_WINDOW);
}

static long busy_calls(void) {
    long n = atomic_load_explicit(&overflow_slot.busy, memory_order_acquire);
    for (gate_slot *s = atomic_load(&slots); s; s = s->next)
        n += atomic_load_explicit(&s->busy, memory_order_acquire);
    return n;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

int gc_gate_close(unsigned timeout_ms) {
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ull;
    atomic_fetch_or(&gate_closed, GATE_CLOSED);
    if (atomic_load(&fence_each_call) || membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) {
        /* every call fences (or registration was lost, e.g. across fork): a fence here pairs with theirs */
        atomic_store(&fence_each_call, 1);
        atomic_thread_fence(memory_order_seq_cst);
    }
    /* Calls in progress end on their own; poll them out, from 20 us up to 1 ms between looks. */
    long wait_ns = 20000;
    while (busy_calls() > 0) {
        if (now_ns() >= deadline) {
            gc_gate_open();
            return -ETIMEDOUT;
        }
        struct timespec nap = {0, wait_ns};
        nanosleep(&nap, NULL);
        if (wait_ns < 1000000)
            wait_ns *= 2;
    }
    return 0;
}

void gc_gate_open(void) {
    pthread_mutex_lock(&gate_mu);
    atomic_fetch_and(&gate_closed, ~GATE_CLOSED);
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* The fork child: only the forking thread exists, and it is in no call; the other threads' slots are free. */
void gc_gate_reset(void) {
    for (gate_slot *s = atomic_load(&slots); s; s = s->next) {
        atomic_store(&s->busy, 0);
        if (s != my_slot)
            atomic_store(&s->taken, 0);
    }
    atomic_store(&overflow_slot.busy, 0);
    atomic_store(&gate_closed, 0);
    pthread_mutex_init(&gate_mu, NULL);
    gate_setup();
}

void gc_gate_init(void) { gate_setup(); }

size_t gc_gate_slots(void) {
    size_t n = 0;
    for (gate_slot *s = atomic_load(&slots); s; s = s->next)
        n++;
    return n;
}

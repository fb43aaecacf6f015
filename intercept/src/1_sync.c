/*
 * Peer synchronization: processes that share memory (the ranks of an NCCL
 * job) wait for each other on the GPU. A rank's collective kernel spins until
 * its peers' kernels of the same collective have run; a checkpoint that
 * closed one rank's gate before it launched its part, while its peer had
 * launched, would wait forever for the peer's GPU to drain. So each process
 * counts the operations that may wait for a peer (launches of NCCL's
 * kernels, stream waits on shared memory), and a checkpoint of the group
 * first brings every member to the same count (HoldSync, ReachSync): every
 * operation any member waits for is then queued, and every gate can close
 * and every GPU drain.
 *
 * The ranks of a job on different hosts share no memory but wait for each
 * other just the same (NCCL over the network): every process counts NCCL's
 * kernel launches, and a job checkpoint holds every host's ranks at one
 * count. Stream waits count only on shared memory.
 *
 * An operation counts itself once it is inside the gate, so that a counted
 * operation is queued before the gate can close. One that finds the hold's
 * limit reached leaves the gate and waits outside it, where it keeps no
 * gate from closing. Only such operations take the lock.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "1_base.h"

_Atomic bool gc_sharing;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv; /* the count or the limit changed */
static pthread_once_t cv_once = PTHREAD_ONCE_INIT;
static uint64_t count, limit = UINT64_MAX;

static void cv_setup(void) { gc_cond_init_monotonic(&cv); }

static void lock(void) {
    pthread_once(&cv_once, cv_setup);
    pthread_mutex_lock(&mu);
}

int gc_sync_enter_n(uint64_t n) {
    if (!n)
        return gc_gate_enter();
    for (;;) {
        lock();
        while (count + n > limit)
            pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
        int w = gc_gate_enter();
        lock();
        if (count + n <= limit) {
            count += n;
            pthread_cond_broadcast(&cv);
            pthread_mutex_unlock(&mu);
            return w;
        }
        pthread_mutex_unlock(&mu);
        gc_gate_leave(); /* held meanwhile: wait outside the gate */
    }
}

int gc_sync_enter(bool op) { return gc_sync_enter_n(op ? 1 : 0); }

uint64_t gc_sync_hold(void) {
    lock();
    limit = count;
    uint64_t n = count;
    pthread_mutex_unlock(&mu);
    return n;
}

int gc_sync_reach(uint64_t target, unsigned timeout_ms) {
    struct timespec dl = gc_deadline_ms(timeout_ms);
    lock();
    int rc = 0;
    if (count > target) {
        rc = -ERANGE;
    } else {
        limit = target;
        pthread_cond_broadcast(&cv);
        while (count < target && rc == 0)
            if (pthread_cond_timedwait(&cv, &mu, &dl) == ETIMEDOUT)
                rc = count < target ? -ETIMEDOUT : 0;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

void gc_sync_release(void) {
    lock();
    limit = UINT64_MAX;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

uint64_t gc_sync_count(void) {
    lock();
    uint64_t n = count;
    pthread_mutex_unlock(&mu);
    return n;
}

/* ---- CUDA graphs ----
 *
 * An NCCL kernel launched into a capturing stream runs only when a graph made
 * from that capture is launched, as often as it is. So it counts then: each
 * graph keeps the count of NCCL launches captured into it, each executable
 * graph instantiated from it the same, and a launch of an executable graph is
 * that many operations at once (a hold lets it pass whole or not at all). Only
 * graphs with such launches are kept, forgotten when destroyed; graphs built
 * node by node, cloned or nested are not seen. */

typedef struct {
    const void *h;
    uint64_t ops;
} gcount;

typedef struct {
    gcount *v;
    size_t n, cap;
} gtable;

/* At most this many graphs, and as many executable graphs, with NCCL's launches: past it a graph is not counted,
 * and a warning says so once. */
#define GRAPHS_MAX 65536

static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static gtable graphs, execs;
static _Atomic size_t nexecs; /* execs.n, read without the lock: most processes have none */
static bool gwarned;

static gcount *gfind(gtable *t, const void *h) {
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].h == h)
            return &t->v[i];
    return NULL;
}

static void gadd(gtable *t, const void *h, uint64_t ops) {
    gcount *e = gfind(t, h);
    if (e) {
        e->ops += ops;
        return;
    }
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 16;
        gcount *v = c <= GRAPHS_MAX ? realloc(t->v, c * sizeof *v) : NULL;
        if (!v) {
            if (!gwarned)
                gc_warn("more than %d CUDA graphs with NCCL's launches: the ones past it are not counted", GRAPHS_MAX);
            gwarned = true;
            return;
        }
        t->v = v;
        t->cap = c;
    }
    t->v[t->n++] = (gcount){h, ops};
}

static void gdel(gtable *t, const void *h) {
    gcount *e = gfind(t, h);
    if (e)
        *e = t->v[--t->n];
}

void gc_sync_captured(const void *graph) {
    pthread_mutex_lock(&gmu);
    gadd(&graphs, graph, 1);
    pthread_mutex_unlock(&gmu);
}

void gc_sync_instantiated(const void *exec, const void *graph) {
    pthread_mutex_lock(&gmu);
    gcount *e = gfind(&graphs, graph);
    if (e) {
        gadd(&execs, exec, e->ops);
        atomic_store(&nexecs, execs.n);
    }
    pthread_mutex_unlock(&gmu);
}

uint64_t gc_sync_graph_ops(const void *exec) {
    if (!atomic_load_explicit(&nexecs, memory_order_relaxed))
        return 0;
    pthread_mutex_lock(&gmu);
    gcount *e = gfind(&execs, exec);
    uint64_t n = e ? e->ops : 0;
    pthread_mutex_unlock(&gmu);
    return n;
}

void gc_sync_graph_gone(const void *h, bool exec) {
    pthread_mutex_lock(&gmu);
    gdel(exec ? &execs : &graphs, h);
    atomic_store(&nexecs, execs.n);
    pthread_mutex_unlock(&gmu);
}

void gc_sync_reset(void) {
    pthread_mutex_init(&mu, NULL);
    count = 0;
    limit = UINT64_MAX;
    atomic_store(&gc_sharing, false);
    /* the parent's graphs are not the child's */
    pthread_mutex_init(&gmu, NULL);
    free(graphs.v);
    free(execs.v);
    graphs = execs = (gtable){0};
    atomic_store(&nexecs, 0);
}

/* NCCL's device kernels, by the names the driver gives them (cuFuncGetName, cuKernelGetName): C++ names, mangled as
 * the Itanium ABI does a function at namespace scope, "_Z" then the name's length then the name then the parameter
 * types (_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL19ncclDevKernelArgs4K). The names: ncclDevKernel_<coll>_...
 * (NCCL 2.19 on), ncclSymkDevKernel_... (its symmetric-memory kernels, 2.27 on), ncclKernel_... before 2.19. A name
 * given unmangled (extern "C", or a driver that gave it so) counts too. */
bool gc_sync_kernel_name(const char *name) {
    if (!name)
        return false;
    if (name[0] == '_' && name[1] == 'Z' && name[2] >= '1' && name[2] <= '9') {
        name += 2;
        while (*name >= '0' && *name <= '9')
            name++;
    }
    static const char *const prefixes[] = {"ncclDevKernel", "ncclSymkDevKernel", "ncclKernel"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0)
            return true;
    return false;
}

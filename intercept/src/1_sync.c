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

int gc_sync_enter(bool op) {
    if (!op)
        return gc_gate_enter();
    for (;;) {
        lock();
        while (count >= limit)
            pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
        int w = gc_gate_enter();
        lock();
        if (count < limit) {
            count++;
            pthread_cond_broadcast(&cv);
            pthread_mutex_unlock(&mu);
            return w;
        }
        pthread_mutex_unlock(&mu);
        gc_gate_leave(); /* held meanwhile: wait outside the gate */
    }
}

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

void gc_sync_reset(void) {
    pthread_mutex_init(&mu, NULL);
    count = 0;
    limit = UINT64_MAX;
    atomic_store(&gc_sharing, false);
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

/* cuInit, the environment, logging, the API gate, fork handling, the handle table. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

sim_state sim = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
    .init_mu = PTHREAD_MUTEX_INITIALIZER,
    .gate_mu = PTHREAD_MUTEX_INITIALIZER,
    .gate_cv = PTHREAD_COND_INITIALIZER,
};

static __thread sim_ctx *tls_ctx;

static void vlogf(const char *kind, const char *fmt, va_list ap) {
    char buf[512];
    int n = snprintf(buf, sizeof buf, "gpucr-sim[%d/%ld] %s", (int)getpid(), (long)syscall(SYS_gettid), kind);
    if (n < 0 || (size_t)n >= sizeof buf)
        return;
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    if (m < 0)
        return;
    size_t len = strlen(buf);
    buf[len++] = '\n';
    /* one write per line so that lines of concurrent threads do not interleave */
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

void sim_log(const char *fmt, ...) {
    if (!sim.log)
        return;
    va_list ap;
    va_start(ap, fmt);
    vlogf("", fmt, ap);
    va_end(ap);
}

void sim_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlogf("warning: ", fmt, ap);
    va_end(ap);
}

/* ---- handle table: lets every entry point reject stale or foreign handles without crashing ---- */

typedef struct {
    uintptr_t p;
    int type;
} hent;
static hent *htab;
static size_t hn, hcap;

static size_t hlower(uintptr_t p) {
    size_t lo = 0, hi = hn;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (htab[mid].p < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int sim_handle_add(const void *p, sim_htype t) {
    uintptr_t u = (uintptr_t)p;
    size_t i = hlower(u);
    if (i < hn && htab[i].p == u) {
        htab[i].type = (int)t;
        return 0;
    }
    if (hn == hcap) {
        size_t c = hcap ? hcap * 2 : 64;
        hent *v = realloc(htab, c * sizeof *v);
        if (!v)
            return -1;
        htab = v;
        hcap = c;
    }
    memmove(&htab[i + 1], &htab[i], (hn - i) * sizeof *htab);
    htab[i] = (hent){u, (int)t};
    hn++;
    return 0;
}

int sim_handle_type(const void *p) {
    uintptr_t u = (uintptr_t)p;
    size_t i = hlower(u);
    return i < hn && htab[i].p == u ? htab[i].type : 0;
}

bool sim_handle_is(const void *p, sim_htype t) { return p && sim_handle_type(p) == (int)t; }

void sim_handle_del(const void *p) {
    uintptr_t u = (uintptr_t)p;
    size_t i = hlower(u);
    if (i < hn && htab[i].p == u) {
        memmove(&htab[i], &htab[i + 1], (hn - i - 1) * sizeof *htab);
        hn--;
    }
}

/* ---- environment ---- */

static long env_long(const char *name, long def, long lo, long hi) {
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        sim_warn("ignoring %s=%s: want an integer in [%ld, %ld]; using %ld", name, s, lo, hi, def);
        return def;
    }
    return v;
}

/* ---- fork: a child of an initialized process has no usable driver, as with libcuda ---- */

/* The child inherits the device file (sim_devfile.c), as it inherits the
 * driver's; its device memory is out of its reach, as device memory is out of
 * the CPU's: each mapping becomes an inaccessible reservation of the same
 * range, and the memory's own fds are dropped. */
static void atfork_child(void) {
    if (atomic_load(&sim.initialized) || sim.init_err) {
        atomic_store(&sim.forked, 1);
        sim_ckpt_atfork_child();
        sim_mem_atfork_child();
        sim_vmm_atfork_child();
    }
}

__attribute__((constructor)) static void sim_ctor(void) {
    const char *l = getenv("GPUCR_SIM_LOG");
    sim.log = l && *l && strcmp(l, "0") != 0;
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    /* Workers take the read side continuously; without this a cuMemFree could starve. */
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&sim.memlock, &a);
    pthread_rwlockattr_destroy(&a);
    int e = pthread_atfork(NULL, NULL, atfork_child);
    if (e)
        sim_warn("pthread_atfork: %s", strerror(e));
}

SIM_API CUresult cuInit(unsigned int flags) {
    if (atomic_load(&sim.forked)) {
        sim_log("cuInit -> CUDA_ERROR_NOT_INITIALIZED (forked child of an initialized process)");
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (flags != 0) {
        sim_log("cuInit(flags=%u) -> CUDA_ERROR_INVALID_VALUE", flags);
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim.init_mu);
    CUresult r = CUDA_SUCCESS;
    if (atomic_load(&sim.initialized) || sim.init_err) {
        r = sim.init_err;
        goto out;
    }
    sim.owner_pid = getpid();
    sim.ndev = (int)env_long("GPUCR_SIM_DEVICES", 1, 0, SIM_MAX_DEVICES);
    /* one device's pool must fit its VA stride */
    long mib = env_long("GPUCR_SIM_MEM_MIB", 81920, 2, (long)(SIM_POOL_STRIDE >> 20) / 2);
    if (sim.ndev == 0) {
        r = sim.init_err = CUDA_ERROR_NO_DEVICE;
        goto out;
    }
    for (int i = 0; i < sim.ndev; i++) {
        sim.dev[i].ordinal = i;
        sim.dev[i].phys = i;
        sim.dev[i].total = sim_align_up((uint64_t)mib << 20, SIM_GRANULARITY);
    }
    r = sim_mem_init();
    if (r != CUDA_SUCCESS) {
        sim.init_err = r;
        goto out;
    }
    sim_devfile_open();
    sim_ckpt_start();
    atomic_store(&sim.initialized, 1);
out:
    pthread_mutex_unlock(&sim.init_mu);
    sim_log("cuInit -> %s", sim_error_name(r));
    return r;
}

SIM_API CUresult cuDriverGetVersion(int *driverVersion) {
    /* Works before cuInit on the driver too: it is how programs probe for one. */
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = SIM_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

/* ---- the gate ---- */

sim_ctx *sim_current_ctx(void) { return tls_ctx; }
void sim_set_current_ctx(sim_ctx *ctx) { tls_ctx = ctx; }

/*
 * What a call does while the process is locked or checkpointed by the
 * checkpoint API. Measured on an H100 with driver 580 (drvtest ckpt_gate and
 * one-off probes): the driver does not block every call. Calls that only look
 * at state or wait for work pass a locked process; once it is checkpointed only
 * a few still pass and cuMemGetInfo fails. Everything not listed blocks until
 * the process is unlocked.
 */
enum gate_class { GATE_BLOCK = 0, GATE_QUERY, GATE_FREE, GATE_MEMINFO };

static const struct {
    const char *name;
    enum gate_class cls;
} gate_table[] = {
    /* sorted by name (strcmp), for bsearch */
    {"cuCtxGetCurrent", GATE_FREE},        {"cuCtxGetDevice", GATE_QUERY},
    {"cuCtxSetCurrent", GATE_QUERY},       {"cuCtxSynchronize", GATE_QUERY},
    {"cuDeviceGet", GATE_QUERY},           {"cuDeviceGetAttribute", GATE_QUERY},
    {"cuDeviceGetCount", GATE_FREE},       {"cuDeviceGetName", GATE_QUERY},
    {"cuDeviceGetPCIBusId", GATE_QUERY},   {"cuDeviceGetUuid", GATE_QUERY},
    {"cuDeviceGetUuid_v2", GATE_QUERY},    {"cuDevicePrimaryCtxGetState", GATE_QUERY},
    {"cuDeviceTotalMem_v2", GATE_QUERY},   {"cuEventElapsedTime", GATE_QUERY},
    {"cuEventElapsedTime_v2", GATE_QUERY}, {"cuEventQuery", GATE_QUERY},
    {"cuEventSynchronize", GATE_QUERY},    {"cuFuncGetParamInfo", GATE_QUERY},
    {"cuKernelGetParamInfo", GATE_QUERY},  {"cuMemGetAddressRange_v2", GATE_QUERY},
    {"cuMemGetInfo_v2", GATE_MEMINFO},     {"cuStreamQuery", GATE_QUERY},
    {"cuStreamSynchronize", GATE_QUERY},
};

static int gate_cmp(const void *key, const void *ent) { return strcmp(key, *(const char *const *)ent); }

static enum gate_class gate_class_of(const char *name) {
    const void *e = bsearch(name, gate_table, sizeof gate_table / sizeof gate_table[0], sizeof gate_table[0], gate_cmp);
    return e ? ((const __typeof__(gate_table[0]) *)e)->cls : GATE_BLOCK;
}

CUresult sim_enter(sim_call *c, const char *name, enum sim_need need) {
    c->name = name;
    c->ctx = NULL;
    c->entered = 0;
    if (atomic_load(&sim.forked) || !atomic_load(&sim.initialized))
        return CUDA_ERROR_NOT_INITIALIZED;
    enum gate_class cls = gate_class_of(name);
    pthread_mutex_lock(&sim.gate_mu);
    for (;;) {
        if (!sim.gate_closed || cls == GATE_FREE)
            break;
        bool parked = sim.ckpt_state == SIM_CK_CHECKPOINTED || sim.ckpt_state == SIM_CK_FAILED;
        if (parked && cls == GATE_MEMINFO) {
            pthread_mutex_unlock(&sim.gate_mu);
            return CUDA_ERROR_OPERATING_SYSTEM;
        }
        if (!parked && cls != GATE_BLOCK)
            break;
        pthread_cond_wait(&sim.gate_cv, &sim.gate_mu);
    }
    /* only calls that change state are waited for by a lock; the others pass it anyway */
    if (cls == GATE_BLOCK) {
        sim.in_api++;
        c->entered = 1;
    } else {
        c->entered = 2;
    }
    pthread_mutex_unlock(&sim.gate_mu);
    sim_ctx *ctx = tls_ctx;
    if (ctx && !atomic_load(&ctx->alive))
        ctx = NULL;
    c->ctx = ctx;
    if (need == SIM_NEED_INIT)
        return CUDA_SUCCESS;
    if (!ctx)
        return need == SIM_NEED_CTX ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
    int st = atomic_load(&ctx->sticky);
    return st ? (CUresult)st : CUDA_SUCCESS;
}

CUresult sim_leave(sim_call *c, CUresult r) {
    if (c->entered == 1) {
        pthread_mutex_lock(&sim.gate_mu);
        if (--sim.in_api == 0)
            pthread_cond_broadcast(&sim.gate_cv);
        pthread_mutex_unlock(&sim.gate_mu);
    }
    sim_log("%s -> %s", c->name, sim_error_name(r));
    return r;
}

void sim_gate_close(void) {
    pthread_mutex_lock(&sim.gate_mu);
    sim.gate_closed = 1;
    pthread_mutex_unlock(&sim.gate_mu);
}

void sim_gate_set_state(int st) {
    pthread_mutex_lock(&sim.gate_mu);
    sim.ckpt_state = st;
    pthread_cond_broadcast(&sim.gate_cv);
    pthread_mutex_unlock(&sim.gate_mu);
}

void sim_gate_open(void) {
    pthread_mutex_lock(&sim.gate_mu);
    sim.gate_closed = 0;
    pthread_cond_broadcast(&sim.gate_cv);
    pthread_mutex_unlock(&sim.gate_mu);
}

static int cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns) {
    if (!deadline_ns) {
        pthread_cond_wait(cv, mu);
        return 0;
    }
    /* condition variables here use the default CLOCK_REALTIME; convert the monotonic deadline */
    uint64_t now = sim_now_ns();
    if (now >= deadline_ns)
        return -1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t wait = deadline_ns - now;
    if (wait > 100000000ULL)
        wait = 100000000ULL; /* re-check at least every 100 ms */
    ts.tv_sec += (time_t)(wait / 1000000000ULL);
    ts.tv_nsec += (long)(wait % 1000000000ULL);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
    return 0;
}

int sim_gate_wait_idle(uint64_t deadline_ns) {
    int rc = 0;
    pthread_mutex_lock(&sim.gate_mu);
    while (sim.in_api > 0) {
        if (cond_wait_until(&sim.gate_cv, &sim.gate_mu, deadline_ns) < 0) {
            rc = -1;
            break;
        }
    }
    pthread_mutex_unlock(&sim.gate_mu);
    return rc;
}

int sim_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns) {
    return cond_wait_until(cv, mu, deadline_ns);
}

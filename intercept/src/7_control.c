/*
 * The client (7_control.h): connecting to the helper on first need (both
 * connections, then the control thread); the control thread, which serves
 * the helper's requests (Quiesce, Drain, Drop, Reimport, Resume, Snapshot,
 * GetStats, Detach and the wait and reattach after it, Abort) over the layers
 * below; the fork handlers, which give a forked child a fresh client.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "1_base.h"
#include "2_link.h"
#include "3_devices.h"
#include "4_alloc.h"
#include "5_vmm.h"
#include "6_modules.h"
#include "7_control.h"
#include "7_cow.h"
#include "wire.h"

typedef Gpucr__Helper__V1__Request Req;
typedef Gpucr__Helper__V1__Response Resp;

enum { CLIENT_RUNNING = 1, CLIENT_QUIESCED = 2, CLIENT_DROPPED = 3 }; /* the protocol's ClientState */

static struct {
    _Atomic int state;
    char wake_path[4096]; /* Detach's wake file */
    /* The last rejoin's move of the memory (GetStats): allocations and bytes moved, allocations left, gate time. */
    uint64_t rejoin_allocs, rejoin_bytes, rejoin_left, rejoin_us;
} G = {
    .state = CLIENT_RUNNING,
};

/* ---- connecting ---- */

static void *control_main(void *arg);

static void connect_helper(void) {
    gc_alloc_configure();
    if (gc_link_connect() != 0)
        return;
    gc_alloc_init();
    gc_link_up();
    int cfd = gc_link_connect_control();
    if (cfd < 0) {
        gc_note_reason(GC_REASON_CONTROL);
        return;
    }
    int rc;
    pthread_t th;
    pthread_attr_t a;
    sigset_t all, old;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&th, &a, control_main, (void *)(intptr_t)cfd);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
    if (rc != 0) {
        gc_warn("cannot start the control thread (%s): this process is not checkpointable", strerror(rc));
        gc_link_control_failed(cfd);
        gc_note_reason(GC_REASON_CONTROL);
    }
}

void gc_client_ensure(void) {
    if (gc_link_state() != CONN_NONE || gc_in_control)
        return;
    gc_link_connect_lock();
    if (gc_link_state() == CONN_NONE)
        connect_helper();
    gc_link_connect_unlock();
}

bool gc_client_up(void) {
    gc_client_ensure();
    return gc_link_state() == CONN_UP;
}

/* ---- the control thread ---- */

static Gpucr__Helper__V1__Error resp_err;

static void set_error(Resp *resp, int code, const char *msg) {
    resp_err = (Gpucr__Helper__V1__Error)GPUCR__HELPER__V1__ERROR__INIT;
    resp_err.code = code;
    resp_err.message = (char *)msg;
    resp->error = &resp_err;
    resp->body_case = GPUCR__HELPER__V1__RESPONSE__BODY__NOT_SET;
}

static Gpucr__Helper__V1__Ok ok_msg = GPUCR__HELPER__V1__OK__INIT;

static void set_ok(Resp *resp) {
    resp->body_case = GPUCR__HELPER__V1__RESPONSE__BODY_OK;
    resp->ok = &ok_msg;
}

static char errbuf[512];

/*
 * Drain: synchronize every context the application made current. The syncs run on a thread of their own, and
 * Drain answers after at most the last Quiesce's timeout: work that never ends (a kernel waiting for a peer
 * process that is held) must not keep this thread, which the Resume after the failed checkpoint needs, from
 * answering. The syncs go on; the next Drain waits for them.
 */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool running; /* a drain thread is syncing */
    CUresult r;   /* the last drain's result */
    unsigned timeout_ms;
} D = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, CUDA_SUCCESS, 10000};
static pthread_once_t drain_once = PTHREAD_ONCE_INIT;
static void drain_setup(void) { gc_cond_init_monotonic(&D.cv); }

static CUresult sync_contexts(void) {
    CUcontext ctxs[GC_MAX_CTX];
    int n = gc_contexts(ctxs);
    for (int i = 0; i < n; i++) {
        CUresult r = GC_REAL(cuCtxSetCurrent)(ctxs[i]);
        if (r == CUDA_SUCCESS)
            r = GC_REAL(cuCtxSynchronize)();
        if (r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_INVALID_HANDLE)
            continue; /* destroyed since */
        if (r != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}

static void *drain_main(void *arg) {
    (void)arg;
    gc_in_control = 1;
    CUresult r = sync_contexts();
    pthread_mutex_lock(&D.mu);
    D.r = r;
    D.running = false;
    pthread_cond_broadcast(&D.cv);
    pthread_mutex_unlock(&D.mu);
    return NULL;
}

static void do_drain(Resp *resp) {
    pthread_once(&drain_once, drain_setup);
    struct timespec dl = gc_deadline_ms(D.timeout_ms);
    pthread_mutex_lock(&D.mu);
    if (!D.running) {
        pthread_t th;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        D.running = pthread_create(&th, &a, drain_main, NULL) == 0;
        pthread_attr_destroy(&a);
        if (!D.running)
            D.r = sync_contexts(); /* no thread: here, unbounded */
    }
    int rc = 0;
    while (D.running && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&D.cv, &D.mu, &dl);
    bool timed_out = D.running;
    CUresult r = D.r;
    pthread_mutex_unlock(&D.mu);
    if (timed_out) {
        snprintf(errbuf, sizeof errbuf,
                 "Drain: the GPU work queued did not finish within %u ms (a kernel waiting for another process that "
                 "is held?)",
                 D.timeout_ms);
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_TIMEOUT, errbuf);
        return;
    }
    if (r != CUDA_SUCCESS) {
        snprintf(errbuf, sizeof errbuf, "cuCtxSynchronize: CUresult %d", (int)r);
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_DRIVER, errbuf);
        return;
    }
    gc_alloc_flush_frees();
    set_ok(resp);
}

static bool set_wake_path(const char *w);

/* Drop: unmap and release every import. Its wake path (a checkpoint's) is
 * where to wait should the helper go away before the memory comes back. */
static void do_drop(Req *req, Resp *resp) {
    if (atomic_load(&G.state) != CLIENT_QUIESCED) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "Drop: not quiesced");
        return;
    }
    if (!set_wake_path(req->drop->wake_path) && req->drop->wake_path && *req->drop->wake_path) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST, "Drop: wake path too long");
        return;
    }
    gc_alloc_flush_frees();
    gc_alloc_lock();
    CUresult bad = CUDA_SUCCESS;
    gc_alloc_drop(&bad);
    gc_vmm_drop(&bad);
    gc_alloc_unlock();
    atomic_store(&G.state, CLIENT_DROPPED);
    if (bad != CUDA_SUCCESS) {
        snprintf(errbuf, sizeof errbuf, "Drop: cuMemUnmap/cuMemRelease: CUresult %d", (int)bad);
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_DRIVER, errbuf);
        return;
    }
    set_ok(resp);
}

/*
 * Entries are matched by address (helper allocations: where they are mapped; the application's VMM
 * allocations: their announced offset-0 mapping), and each record adopts the entry's alloc_id: after a
 * restore the helper is another process, or has given new ids.
 */
static void do_reimport(Req *req, Resp *resp, int *fds, int nfds) {
    Gpucr__Helper__V1__Reimport *ri = req->reimport;
    if (atomic_load(&G.state) != CLIENT_DROPPED) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "Reimport: nothing dropped");
        return;
    }
    if ((size_t)nfds != ri->n_entries) {
        snprintf(errbuf, sizeof errbuf, "Reimport: %zu entries, %d fds", ri->n_entries, nfds);
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST, errbuf);
        return;
    }
    /* after a restore, an ordinal may stand for another GPU (the helper names GPUs by UUID) */
    gc_dev_forget_uuids();
    gc_alloc_lock();
    bool relabel = false;
    for (size_t i = 0; i < ri->n_entries; i++) {
        Gpucr__Helper__V1__ReimportEntry *e = ri->entries[i];
        int v = gc_alloc_reimport(e->alloc_id, e->address, e->size, fds[i], errbuf, sizeof errbuf, &relabel);
        if (v == 0) {
            v = gc_vmm_reimport(e->alloc_id, e->address, e->size, fds[i], errbuf, sizeof errbuf);
            relabel |= v != 0;
            if (v == 0)
                snprintf(errbuf, sizeof errbuf, "Reimport: no allocation of ours at 0x%llx (entry %llu, %llu bytes)",
                         (unsigned long long)e->address, (unsigned long long)e->alloc_id, (unsigned long long)e->size);
        }
        if (v == 1)
            continue;
        set_error(resp,
                  v == -2 ? GPUCR__HELPER__V1__ERROR_CODE__ERROR_DRIVER
                          : GPUCR__HELPER__V1__ERROR_CODE__ERROR_NOT_FOUND,
                  errbuf);
        break;
    }
    if (relabel)
        gc_alloc_relabel(gc_vmm_id_at);
    gc_alloc_unlock();
    if (!resp->error)
        set_ok(resp);
}

/* A Resume's copy-on-write window, opened while the gate is still closed. */
static int open_window(const Gpucr__Helper__V1__Resume *r) {
    gc_cow_close(); /* a window still open (a loading one whose Unguard had not come yet) ends with the stop */
    if (!r || r->n_guard == 0)
        return 0;
    gc_guard_region *regs = calloc(r->n_guard, sizeof *regs);
    if (!regs)
        return -1;
    for (size_t i = 0; i < r->n_guard; i++) {
        regs[i].addr = r->guard[i]->address;
        regs[i].size = r->guard[i]->size;
        regs[i].bits = r->guard[i]->pending.data;
        regs[i].nbits = r->guard[i]->pending.len;
        regs[i].vmm = r->guard[i]->vmm;
    }
    int rc = gc_cow_open(regs, r->n_guard, r->guard_chunk, r->loading);
    free(regs);
    if (rc == 0)
        gc_debug("%s window open: %zu regions", r->loading ? "loading" : "copy-on-write", r->n_guard);
    return rc;
}

static void do_resume(const Req *req, Resp *resp) {
    int st = atomic_load(&G.state);
    if (st == CLIENT_DROPPED) {
        gc_alloc_lock();
        bool all = gc_alloc_all_mapped();
        all &= gc_vmm_all_imported();
        gc_alloc_unlock();
        if (!all) {
            set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "Resume: allocations not reimported");
            return;
        }
    }
    if (open_window(req->resume) != 0) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_OUT_OF_MEMORY, "Resume: no memory for the window");
        return;
    }
    atomic_store(&G.state, CLIENT_RUNNING);
    G.wake_path[0] = 0; /* the memory is back: nothing to wait for */
    gc_gate_open();
    set_ok(resp);
}

static int n_reasons(const char **out) {
    int n = gc_reason_names(out);
    if (gc_link_state() == CONN_DEAD)
        out[n++] = "helper connection lost";
    return n;
}

/* Builds the table into resp; *cleanup frees it after packing. */
typedef struct {
    Gpucr__Helper__V1__BufferTable t;
    Gpucr__Helper__V1__Allocation *allocs, **pallocs;
    Gpucr__Helper__V1__Buffer *bufs, **pbufs;
    const char *reasons[8];
    char *gpus[GC_MAX_DEV];
    uint64_t *touch;
} snap_mem;

static void do_snapshot(Resp *resp, snap_mem *m) {
    memset(m, 0, sizeof *m);
    m->t = (Gpucr__Helper__V1__BufferTable)GPUCR__HELPER__V1__BUFFER_TABLE__INIT;
    gc_alloc_lock();
    size_t na = gc_alloc_list(NULL, 0), nv = gc_vmm_list(NULL, 0);
    gc_alloc_info *vi = calloc(na + nv + 1, sizeof *vi);
    if (vi) {
        na = gc_alloc_list(vi, na);
        nv = gc_vmm_list(vi + na, nv);
    }
    na += nv;
    const gc_btab *s = gc_buffers();
    m->allocs = calloc(na + 1, sizeof *m->allocs);
    m->pallocs = calloc(na + 1, sizeof *m->pallocs);
    m->bufs = calloc(s->n + 1, sizeof *m->bufs);
    m->pbufs = calloc(s->n + 1, sizeof *m->pbufs);
    if (!vi || !m->allocs || !m->pallocs || !m->bufs || !m->pbufs) {
        free(vi);
        gc_alloc_unlock();
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "out of memory");
        return;
    }
    for (size_t i = 0; i < na; i++) { /* the helper's allocations, then the application's VMM */
        Gpucr__Helper__V1__Allocation *x = &m->allocs[i];
        *x = (Gpucr__Helper__V1__Allocation)GPUCR__HELPER__V1__ALLOCATION__INIT;
        x->alloc_id = vi[i].id;
        x->address = vi[i].addr;
        x->size = vi[i].size;
        x->device_uuid = (char *)gc_dev_uuid_known(vi[i].dev);
        x->kind = vi[i].kind;
        m->pallocs[i] = x;
    }
    free(vi);
    for (size_t j = 0; j < s->n; j++) {
        Gpucr__Helper__V1__Buffer *x = &m->bufs[j];
        *x = (Gpucr__Helper__V1__Buffer)GPUCR__HELPER__V1__BUFFER__INIT;
        x->address = s->v[j].addr;
        x->size = s->v[j].size;
        x->kind = s->v[j].kind;
        x->alloc_id = s->v[j].alloc_id;
        x->device_uuid = (char *)gc_dev_uuid_known(s->v[j].dev);
        m->pbufs[j] = x;
    }
    m->t.n_allocations = na;
    m->t.allocations = m->pallocs;
    m->t.n_buffers = s->n;
    m->t.buffers = m->pbufs;
    gc_alloc_unlock();
    m->t.state = atomic_load(&G.state);
    m->t.n_not_checkpointable = (size_t)n_reasons(m->reasons);
    m->t.not_checkpointable = (char **)m->reasons;
    m->t.n_gpus = gc_dev_visible(m->gpus);
    m->t.gpus = m->gpus;
    size_t nt = gc_guard_touch_order(NULL, SIZE_MAX);
    m->touch = nt ? calloc(nt, sizeof *m->touch) : NULL;
    if (m->touch) {
        m->t.n_touch_order = gc_guard_touch_order(m->touch, nt);
        m->t.touch_order = m->touch;
    }
    resp->body_case = GPUCR__HELPER__V1__RESPONSE__BODY_TABLE;
    resp->table = &m->t;
}

static void snap_free(snap_mem *m) {
    free(m->touch);
    free(m->allocs);
    free(m->pallocs);
    free(m->bufs);
    free(m->pbufs);
}

static Gpucr__Helper__V1__ClientStats stats_msg;

static void do_stats(Resp *resp) {
    uint64_t c[STAT_N];
    gc_stats_sum(c);
    Gpucr__Helper__V1__ClientStats *s = &stats_msg;
    *s = (Gpucr__Helper__V1__ClientStats)GPUCR__HELPER__V1__CLIENT_STATS__INIT;
    s->allocs = c[STAT_ALLOCS];
    s->helper_calls = c[STAT_HELPER_CALLS];
    s->modules_analysed = c[STAT_MODULES_ANALYSED];
    s->frees = c[STAT_FREES];
    gc_alloc_live(&s->live_buffers, &s->live_bytes, &s->helper_bytes);
    s->local_allocs = c[STAT_LOCAL_ALLOCS];
    s->launches = c[STAT_LAUNCHES];
    s->launches_with_hits = c[STAT_LAUNCH_HITS];
    s->pointer_words = c[STAT_PTR_WORDS];
    s->param_layouts = gc_layout_count();
    s->launches_no_layout = c[STAT_NO_LAYOUT];
    s->launches_scanned = c[STAT_SCANNED];
    s->copies = c[STAT_COPIES];
    s->memsets = c[STAT_MEMSETS];
    s->modules_loaded = c[STAT_MODULES];
    s->streams_created = c[STAT_STREAMS];
    s->events_created = c[STAT_EVENTS];
    s->gate_waits = c[STAT_GATE_WAITS];
    s->rejoins = c[STAT_REJOINS];
    s->rejoin_allocations = G.rejoin_allocs;
    s->rejoin_bytes = G.rejoin_bytes;
    s->sync_ops = gc_sync_count();
    s->rejoin_left = G.rejoin_left;
    s->rejoin_us = G.rejoin_us;
    resp->body_case = GPUCR__HELPER__V1__RESPONSE__BODY_STATS;
    resp->stats = s;
}

/* G.wake_path = w, a relative w relative to our socket's directory; false
 * (and no wake path) if it is empty or too long. */
static bool set_wake_path(const char *w) {
    G.wake_path[0] = 0;
    if (!w || !*w)
        return false;
    int n = w[0] == '/' ? snprintf(G.wake_path, sizeof G.wake_path, "%s", w)
                        : gc_link_sock_dir_file(G.wake_path, sizeof G.wake_path, w);
    if (n < 0 || (size_t)n >= sizeof G.wake_path) {
        G.wake_path[0] = 0;
        return false;
    }
    return true;
}

/* Detach: only dropped, with both connections up; *detach tells control_main to go on with detached(). */
static void do_detach(Req *req, Resp *resp, bool *detach, int *out_fd) {
    if (atomic_load(&G.state) != CLIENT_DROPPED) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "Detach: not dropped");
    } else if (gc_link_state() != CONN_UP) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE, "Detach: the calls connection is lost");
    } else if (!set_wake_path(req->detach->wake_path)) {
        set_error(resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST, "Detach: no wake path, or too long");
    } else {
        /* Served mode: the worker's socket and ring go before the Ok, since the helper lets CRIU dump the process
         * once it has the answer (it hangs up itself, without waiting for detached()); detached() then finds
         * the worker let go already. */
        int served = gc_driver_served_detach();
        if (served != 0)
            gc_warn("served mode: the worker was not let go before the dump; the dump will refuse its socket");
        /* A template's script: the replay a new worker would get, written now, while the process is as the dump
         * keeps it; the Ok carries it. Without one the checkpoint goes on (the restore replays as always). */
        if (served == 0 && req->detach->template_ && gc_driver_served())
            *out_fd = gc_driver_served_script();
        *detach = true;
        set_ok(resp);
    }
}

/* Watches the helper while detached: it touches helper.alive in the socket
 * directory every second (helper/daemon/adopt.go). Stale or missing for
 * GPUCR_ORPHAN_TIMEOUT_S (default 60) seconds of this process's running time:
 * no helper will bring the memory back. Time the process spent frozen by CRIU
 * (or between a dump and its restore) does not count. */
typedef struct {
    char path[4200];
    long timeout_s;
    struct timespec last; /* monotonic time of the previous check */
    double stale_s;       /* running time with the file stale or missing */
} helper_watch;

static void watch_init(helper_watch *w) {
    gc_link_sock_dir_file(w->path, sizeof w->path, "helper.alive");
    const char *e = getenv("GPUCR_ORPHAN_TIMEOUT_S");
    w->timeout_s = e && atol(e) > 0 ? atol(e) : 60;
    clock_gettime(CLOCK_MONOTONIC, &w->last);
    w->stale_s = 0;
}

static void watch_check(helper_watch *w) {
    struct timespec now, real;
    clock_gettime(CLOCK_MONOTONIC, &now);
    clock_gettime(CLOCK_REALTIME, &real);
    double step = (double)(now.tv_sec - w->last.tv_sec) + (double)(now.tv_nsec - w->last.tv_nsec) / 1e9;
    w->last = now;
    struct stat st;
    bool exists = stat(w->path, &st) == 0;
    long age = exists ? (long)(real.tv_sec - st.st_mtim.tv_sec) : -1;
    bool fresh = exists && age < 3; /* touched every second */
    if (fresh || step > 5) {        /* alive, or we were frozen: start counting again */
        w->stale_s = 0;
        return;
    }
    w->stale_s += step;
    if (w->stale_s >= (double)w->timeout_s) {
        char why[4400];
        char seen[64] = "missing";
        if (exists)
            snprintf(seen, sizeof seen, "last updated %ld s ago", age);
        snprintf(why, sizeof why,
                 "the gpucr helper that holds its GPU memory has been gone for %ld s while it was detached for a dump "
                 "(%s: %s)",
                 w->timeout_s, w->path, seen);
        gc_state_lost(why);
    }
}

/* The wake file exists: empty means come back; "lost: why" (from a helper
 * that adopted us after the one we detached from died) that there is nothing
 * to come back to. */
static void check_wake_file(void) {
    char buf[2048];
    int fd = open(G.wake_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return;
    buf[n] = 0;
    if (strncmp(buf, "lost:", 5) == 0) {
        char *nl = strchr(buf, '\n');
        if (nl)
            *nl = 0;
        gc_state_lost(buf + 5 + (buf[5] == ' '));
    }
}

/*
 * After Detach's Ok: closes both connections, waits for the wake file (stat and sleep, nothing
 * else: CRIU freezes, dumps and maybe restores the process in this loop), then connects again with
 * the old token: calls first (its HelloReply's token names us from then on), then control. Connect
 * failures retry every 100 ms (one warning after 5 s), a helper's error every second (one warning
 * per distinct answer). The gate stays closed throughout. Returns the new control connection.
 */
static int detached(int ctl_fd) {
    gc_debug("detached: waiting for %s", G.wake_path);
    /* Served mode: the worker's socket and ring go before the helper's connections (do_detach let it go
     * already; here for a helper that closed the control connection while this process was dropped): a process
     * that keeps them cannot be dumped. */
    if (gc_driver_served_detach() != 0)
        gc_warn("served mode: the worker was not let go before the dump; the dump will refuse its socket");
    gc_link_detach(ctl_fd);

    static const struct timespec tick = {0, 2000000};
    struct stat st;
    helper_watch watch;
    watch_init(&watch);
    for (unsigned n = 1; stat(G.wake_path, &st) != 0; n++) {
        nanosleep(&tick, NULL);
        if (n % 250 == 0) /* every 0.5 s */
            watch_check(&watch);
    }
    check_wake_file();

    gc_debug("woken by %s: reattaching to the helper at %s (token %llu)", G.wake_path, gc_link_socket(),
             (unsigned long long)gc_link_token());
    int fd = gc_link_reattach();
    /* Served mode: a worker, with the context made again, before the helper's memory comes back into it (its
     * Reimport waits on the control connection until this thread reads it). After the reattach, so that the
     * helper knows this process again and gives it a worker on the GPU that holds its memory (another one after
     * a restore with a device map). */
    if (gc_driver_served_attach() != 0)
        gc_warn("served mode: no worker after the dump; the GPU memory cannot come back");
    return fd;
}

/* HoldSync: peer sync operations stop at the count reached, which the reply says. */
static void do_hold_sync(Resp *resp) {
    static Gpucr__Helper__V1__SyncCount sc;
    gpucr__helper__v1__sync_count__init(&sc);
    sc.count = gc_sync_hold();
    resp->body_case = GPUCR__HELPER__V1__RESPONSE__BODY_SYNC_COUNT;
    resp->sync_count = &sc;
}

/* ReachSync: run on until the count is the target, then hold there. */
static void do_reach_sync(Req *req, Resp *resp) {
    unsigned t = req->reach_sync->timeout_ms ? req->reach_sync->timeout_ms : 10000;
    uint64_t target = req->reach_sync->target;
    int rc = gc_sync_reach(target, t);
    if (rc == 0) {
        set_ok(resp);
        return;
    }
    static char msg[160]; /* sent after this returns */
    snprintf(msg, sizeof msg, "ReachSync: at %llu of %llu peer sync operations %s", (unsigned long long)gc_sync_count(),
             (unsigned long long)target, rc == -ERANGE ? "(past it already)" : "at the timeout");
    set_error(resp,
              rc == -ERANGE ? GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE : GPUCR__HELPER__V1__ERROR_CODE__ERROR_TIMEOUT,
              msg);
}

/* ---- rejoining a new helper ---- */

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR)
        ;
}

/*
 * The helper ended while this process ran: its memory is still ours (our imports keep it), but no helper holds it,
 * and no helper would checkpoint us. Waits for the next helper on the same socket (GPUCR_REJOIN_INTERVAL_MS, default
 * 1000: a connect a second), registers with it as a new client with the gate closed and the device idle, moves every
 * allocation of the helper that ended into the new helper's memory (copied on the device, mapped again at the same
 * addresses: pointers stay valid), and opens the control connection. Memory shared with other processes stays where
 * it is (their copies would part), and so does what cannot be moved: not checkpointable (GC_REASON_ORPHAN).
 * Returns the new control connection, or -1 (the helper lives and closed only our control connection, or the new
 * one refused a control connection).
 */
static int rejoin(void) {
    /* The helper may have closed only our control connection (a frame it refused): then it lives, and keeps our
     * calls connection open. */
    if (!gc_link_calls_lost(2000))
        return -1;
    const char *e = getenv("GPUCR_REJOIN_INTERVAL_MS");
    long every = e && atol(e) > 0 ? atol(e) : 1000;
    gc_debug("the gpucr helper ended: rejoining the next one at %s", gc_link_socket()); /* mark_dead warned */
    char why[256], last[256] = "";
    for (;;) {
        sleep_ms(every);
        int fd = gc_link_dial();
        if (fd < 0)
            continue;
        /* A helper listens. Nothing may reach it before the memory is its: the gate first. */
        if (gc_gate_close(10000) != 0) {
            close(fd);
            continue;
        }
        double t0 = mono_s();
        if (gc_link_rejoin(fd, why, sizeof why) != 0) {
            gc_gate_open();
            if (strcmp(why, last) != 0)
                gc_warn("rejoining the helper at %s: %s; trying again", gc_link_socket(), why);
            snprintf(last, sizeof last, "%s", why);
            continue;
        }
        CUresult r = sync_contexts();
        if (r != CUDA_SUCCESS)
            gc_warn("rejoining: waiting for the GPU work queued: CUresult %d", (int)r);
        gc_alloc_flush_frees();
        uint64_t allocs = 0, bytes = 0, left = 0;
        why[0] = 0;
        if (atomic_load(&gc_sharing)) {
            left = gc_alloc_orphan_all() + gc_vmm_orphan_all();
            snprintf(why, sizeof why, "it shares GPU memory with other processes, whose copies would part");
        } else {
            gc_alloc_move_all(&allocs, &bytes, &left, why, sizeof why);
            gc_vmm_move_all(&allocs, &bytes, &left, why, sizeof why);
        }
        gc_alloc_lock();
        gc_alloc_relabel(gc_vmm_id_at);
        gc_alloc_unlock();
        if (left)
            gc_note_reason(GC_REASON_ORPHAN);
        else
            gc_clear_reason(GC_REASON_ORPHAN);
        int cfd = gc_link_connect_control();
        if (cfd >= 0)
            gc_clear_reason(GC_REASON_CONTROL);
        G.rejoin_allocs = allocs;
        G.rejoin_bytes = bytes;
        G.rejoin_left = left;
        G.rejoin_us = (uint64_t)((mono_s() - t0) * 1e6);
        gc_stat_add(STAT_REJOINS, 1);
        gc_gate_open();
        if (left)
            gc_warn(
                "rejoined the helper at %s; %llu allocations of the helper that ended stay where they are (%s): "
                "not checkpointable until the program restarts",
                gc_link_socket(), (unsigned long long)left, why);
        else
            gc_warn("rejoined the helper at %s: %llu allocations (%llu bytes) moved into its memory in %.3f s",
                    gc_link_socket(), (unsigned long long)allocs, (unsigned long long)bytes, (double)G.rejoin_us / 1e6);
        return cfd;
    }
}

static void *control_main(void *arg) {
    int fd = (int)(intptr_t)arg;
    gc_in_control = 1;
    int fds[WIRE_MAX_FDS];
serve:
    for (;;) {
        uint8_t *buf;
        size_t len;
        int nfds = 0;
        int rc = wire_recv_frame(fd, &buf, &len, fds, WIRE_MAX_FDS, &nfds);
        if (rc < 0) {
            if (rc != -EPIPE)
                gc_warn("control connection: %s", strerror(-rc));
            break;
        }
        Req *req = gpucr__helper__v1__request__unpack(NULL, len, buf);
        free(buf);
        Resp resp = GPUCR__HELPER__V1__RESPONSE__INIT;
        snap_mem sm;
        bool snapped = false, detach = false;
        int out_fd = -1; /* a descriptor the reply carries (Detach: a template's script) */
        static char abort_why[1024];
        abort_why[0] = 0;
        if (!req) {
            set_error(&resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST, "undecodable request");
        } else {
            resp.id = req->id;
            gc_debug("control: request %d", (int)req->body_case);
            switch (req->body_case) {
            case GPUCR__HELPER__V1__REQUEST__BODY_QUIESCE: {
                unsigned t = req->quiesce->timeout_ms ? req->quiesce->timeout_ms : 10000;
                D.timeout_ms = t; /* the drain after it waits as long */
                if (atomic_load(&G.state) != CLIENT_RUNNING) {
                    set_ok(&resp);
                } else if (gc_gate_close(t) != 0) {
                    set_error(&resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_TIMEOUT,
                              "Quiesce: calls still in progress at the timeout");
                } else {
                    atomic_store(&G.state, CLIENT_QUIESCED);
                    gc_alloc_reclaim();
                    gc_layout_reclaim();
                    set_ok(&resp);
                }
                break;
            }
            case GPUCR__HELPER__V1__REQUEST__BODY_HOLD_SYNC: do_hold_sync(&resp); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_REACH_SYNC: do_reach_sync(req, &resp); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_RELEASE_SYNC:
                gc_sync_release();
                set_ok(&resp);
                break;
            case GPUCR__HELPER__V1__REQUEST__BODY_DRAIN: do_drain(&resp); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_DROP: do_drop(req, &resp); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_REIMPORT: do_reimport(req, &resp, fds, nfds); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_RESUME: do_resume(req, &resp); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_UNGUARD:
                gc_cow_close();
                gc_debug("copy-on-write window closed");
                set_ok(&resp);
                break;
            case GPUCR__HELPER__V1__REQUEST__BODY_SNAPSHOT:
                do_snapshot(&resp, &sm);
                snapped = true;
                break;
            case GPUCR__HELPER__V1__REQUEST__BODY_GET_STATS: do_stats(&resp); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_DETACH: do_detach(req, &resp, &detach, &out_fd); break;
            case GPUCR__HELPER__V1__REQUEST__BODY_ABORT:
                /* answered first, so the helper knows it was heard; then this process ends */
                snprintf(abort_why, sizeof abort_why, "%s",
                         req->abort->reason && *req->abort->reason ? req->abort->reason
                                                                   : "the gpucr helper gave it up");
                set_ok(&resp);
                break;
            default:
                set_error(&resp, GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST,
                          "not a request for an interposer's control connection");
            }
        }
        for (int i = 0; i < nfds; i++)
            close(fds[i]); /* Reimport's are imported (the driver keeps its own reference) */
        size_t olen = gpucr__helper__v1__response__get_packed_size(&resp);
        uint8_t *out = malloc(olen ? olen : 1);
        rc = 0;
        if (out && olen) { /* every reply sets a body or an error: never empty */
            gpucr__helper__v1__response__pack(&resp, out);
            rc = wire_send_frame(fd, out, olen, out_fd >= 0 ? &out_fd : NULL, out_fd >= 0 ? 1 : 0);
        }
        free(out);
        if (out_fd >= 0)
            close(out_fd);
        out_fd = -1;
        if (abort_why[0])
            gc_state_lost(abort_why);
        if (snapped)
            snap_free(&sm);
        if (req)
            gpucr__helper__v1__request__free_unpacked(req, NULL);
        if (rc < 0) {
            gc_warn("control connection: send: %s", strerror(-rc));
            break;
        }
        if (detach) {
            fd = detached(fd);
            gc_sync_release(); /* back after a dump or a restore: the group's checkpoint is over */
        }
    }
    if (atomic_load(&G.state) == CLIENT_DROPPED && G.wake_path[0]) {
        /* A checkpoint recorded us for the next helper (helper/daemon/adopt.go). */
        gc_warn(
            "the helper closed the control connection while this process's device memory was dropped for a "
            "checkpoint (did it die?): waiting for a helper to give it back (%s)",
            G.wake_path);
        fd = detached(fd);
        goto serve;
    }
    gc_note_reason(GC_REASON_CONTROL);
    gc_cow_close();    /* no helper to save anything any more */
    gc_sync_release(); /* nor to end a hold */
    if (atomic_load(&G.state) == CLIENT_QUIESCED) {
        atomic_store(&G.state, CLIENT_RUNNING);
        gc_gate_open();
        gc_warn("control connection closed while quiesced: resuming");
    } else if (atomic_load(&G.state) == CLIENT_DROPPED) {
        gc_state_lost(
            "the gpucr helper closed the control connection while this process's device memory was dropped "
            "for a checkpoint (the helper died?)");
    }
    /* the fd is ours unless a fork happened meanwhile (the child never runs this thread) */
    close(fd);
    if (atomic_load(&G.state) == CLIENT_RUNNING && (fd = rejoin()) >= 0)
        goto serve;
    return NULL;
}

/* ---- fork ---- */

/* The locks in their order, so that the child's copies are consistent. */
static void atfork_prepare(void) {
    gc_link_atfork_prepare();
    gc_alloc_atfork_prepare();
    gc_dev_atfork_prepare();
}

static void atfork_parent(void) {
    gc_dev_atfork_parent();
    gc_alloc_atfork_parent();
    gc_link_atfork_parent();
}

/* The child forgets the parent's connections (drops its copies of them), its memory and its state. */
static void atfork_child(void) {
    gc_gate_reset();
    gc_link_atfork_child();
    gc_alloc_atfork_child();
    gc_dev_atfork_child();
    gc_reasons_reset();
    gc_sync_reset();
    pthread_mutex_init(&D.mu, NULL);
    gc_cond_init_monotonic(&D.cv);
    D.running = false; /* the parent's drain thread is not the child's */
    atomic_store(&G.state, CLIENT_RUNNING);
    G.wake_path[0] = 0;
    gc_vmm_atfork_child();
    gc_stats_reset();
    gc_layout_reset();
}

void gc_fork_init(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/*
 * Streams, stream operations and events.
 *
 * Every stream, the legacy stream included, has a worker thread that runs its
 * operations in order, really concurrently with the caller: a program that
 * forgets to synchronize reads stale data here as it would on a GPU.
 *
 * Ordering between streams is expressed as dependencies on earlier operations,
 * captured when an operation is queued: an op on the legacy stream depends on
 * the last op of every blocking stream of its context, an op on a blocking
 * stream on the last op of the legacy stream, cuStreamWaitEvent on the event's
 * record. Dependencies always point to ops queued earlier, so no cycle can form.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "sim.h"

typedef struct sim_event {
    uint32_t magic;
    sim_ctx *ctx;
    unsigned flags;
    sim_op *rec; /* the latest record, a reference; NULL before the first */
    struct sim_event *next;
} sim_event;

sim_op *sim_op_new(size_t payload, sim_op_fn run) {
    sim_op *op = calloc(1, sizeof *op + payload);
    if (!op)
        return NULL;
    op->refs = 1;
    op->run = run;
    op->arg = op->payload;
    return op;
}

void sim_op_put_locked(sim_op *op) {
    if (--op->refs > 0)
        return;
    for (int i = 0; i < op->ndeps; i++)
        sim_op_put_locked(op->deps[i]);
    free(op->deps);
    if (op->fini)
        op->fini(op);
    free(op);
}

void sim_op_put(sim_op *op) {
    if (!op)
        return;
    pthread_mutex_lock(&sim.mu);
    sim_op_put_locked(op);
    pthread_mutex_unlock(&sim.mu);
}

CUresult sim_op_wait(sim_op *op) {
    pthread_mutex_lock(&sim.mu);
    while (!op->done)
        pthread_cond_wait(&sim.cv, &sim.mu);
    CUresult e = op->err;
    pthread_mutex_unlock(&sim.mu);
    return e;
}

void sim_stream_mark_fault(sim_ctx *ctx, CUresult r, const char *what) {
    int zero = 0;
    if (atomic_compare_exchange_strong(&ctx->sticky, &zero, (int)r))
        sim_warn("%s failed with %s; the context is now unusable (sticky error, as on the driver)", what,
                 sim_error_name(r));
}

static bool deps_done(const sim_op *op) {
    for (int i = 0; i < op->ndeps; i++)
        if (!op->deps[i]->done)
            return false;
    return true;
}

static void *worker(void *arg) {
    sim_stream *s = arg;
    prctl(PR_SET_NAME, s->legacy ? "sim-legacy" : "sim-stream", 0, 0, 0);
    pthread_mutex_lock(&sim.mu);
    for (;;) {
        while (!s->head && !s->dying)
            pthread_cond_wait(&sim.cv, &sim.mu);
        sim_op *op = s->head;
        if (!op)
            break;
        while (!deps_done(op))
            pthread_cond_wait(&sim.cv, &sim.mu);
        for (int i = 0; i < op->ndeps; i++)
            sim_op_put_locked(op->deps[i]);
        free(op->deps);
        op->deps = NULL;
        op->ndeps = 0;
        /* after a fault the context runs nothing more, as a dead GPU context doesn't */
        CUresult e = (CUresult)atomic_load(&s->ctx->sticky);
        pthread_mutex_unlock(&sim.mu);
        if (!e && op->run) {
            e = op->run(op);
            if (e)
                sim_stream_mark_fault(s->ctx, e, "a stream operation");
        }
        uint64_t ts = sim_now_ns();
        pthread_mutex_lock(&sim.mu);
        op->err = e;
        op->ts_ns = ts;
        op->done = 1;
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        sim_op_put_locked(op);
        pthread_cond_broadcast(&sim.cv);
    }
    sim_ctx *ctx = s->ctx;
    for (sim_stream **pp = &ctx->streams; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    ctx->nstreams--;
    if (s->last)
        sim_op_put_locked(s->last);
    pthread_cond_broadcast(&sim.cv);
    pthread_mutex_unlock(&sim.mu);
    free(s);
    return NULL;
}

CUresult sim_stream_create_locked(sim_ctx *ctx, unsigned flags, int legacy, sim_stream **out) {
    sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = SIM_STREAM_MAGIC;
    s->ctx = ctx;
    s->flags = flags;
    s->legacy = legacy;
    if (!legacy && sim_handle_add(s, SIM_H_STREAM) < 0) {
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    int e = sim_start_thread(worker, s);
    if (e) {
        sim_warn("cannot start a stream worker thread: %s", strerror(e));
        if (!legacy)
            sim_handle_del(s);
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->next = ctx->streams;
    ctx->streams = s;
    ctx->nstreams++;
    *out = s;
    return CUDA_SUCCESS;
}

static CUresult resolve_locked(sim_ctx *ctx, CUstream h, sim_stream **out) {
    /* The per-thread default stream is served by the legacy stream: stricter ordering, same results. */
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        if (!ctx->legacy)
            return CUDA_ERROR_INVALID_CONTEXT;
        *out = ctx->legacy;
        return CUDA_SUCCESS;
    }
    sim_stream *s = (sim_stream *)h;
    if (!sim_handle_is(s, SIM_H_STREAM) || s->dying || !atomic_load(&s->ctx->alive))
        return CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    return CUDA_SUCCESS;
}

/* resolve_locked for calls the simulator does not record into a capture (synchronizing, events): the driver
 * records events as graph dependencies across streams; this simulator captures one stream's work only. */
static CUresult resolve_uncaptured_locked(sim_ctx *ctx, CUstream h, sim_stream **out) {
    CUresult r = resolve_locked(ctx, h, out);
    if (r == CUDA_SUCCESS && (*out)->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return r;
}

static int dep_add(sim_op *op, int *cap, sim_op *d) {
    if (!d || d->done)
        return 0;
    if (op->ndeps == *cap) {
        int c = *cap ? *cap * 2 : 4;
        sim_op **v = realloc(op->deps, (size_t)c * sizeof *v);
        if (!v)
            return -1;
        op->deps = v;
        *cap = c;
    }
    d->refs++;
    op->deps[op->ndeps++] = d;
    return 0;
}

static CUresult enqueue_locked(sim_stream *s, sim_op *op, sim_op *extra_dep) {
    int cap = 0;
    int bad = dep_add(op, &cap, extra_dep);
    if (s->legacy) {
        for (sim_stream *t = s->ctx->streams; t && !bad; t = t->next)
            if (t != s && !(t->flags & CU_STREAM_NON_BLOCKING))
                bad = dep_add(op, &cap, t->last);
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING) && s->ctx->legacy) {
        bad = dep_add(op, &cap, s->ctx->legacy->last);
    }
    if (bad) {
        for (int i = 0; i < op->ndeps; i++)
            op->deps[i]->refs--; /* still referenced elsewhere: none can reach zero here */
        free(op->deps);
        op->deps = NULL;
        op->ndeps = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->stream = s;
    op->ctx = s->ctx;
    op->refs += 2; /* the queue's and s->last's */
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    if (s->last)
        sim_op_put_locked(s->last);
    s->last = op;
    pthread_cond_broadcast(&sim.cv);
    return CUDA_SUCCESS;
}

CUresult sim_submit(sim_ctx *ctx, CUstream h, sim_op *op) {
    sim_stream *s;
    pthread_mutex_lock(&sim.mu);
    CUresult r = resolve_locked(ctx, h, &s);
    if (r == CUDA_SUCCESS && s->legacy && sim_ctx_blocking_capture_locked(ctx))
        r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; /* the driver: the legacy stream would join the capture */
    else if (r == CUDA_SUCCESS && s->capture)
        sim_graph_record_locked(s->capture, op);
    else if (r == CUDA_SUCCESS)
        r = enqueue_locked(s, op, NULL);
    pthread_mutex_unlock(&sim.mu);
    return r;
}

/* Waits for every op queued so far on the given streams; NULL list: all of ctx. */
static CUresult wait_last(sim_ctx *ctx, sim_stream *only) {
    sim_op *snap[64];
    sim_op **v = snap;
    size_t n = 0, cap = 64;
    pthread_mutex_lock(&sim.mu);
    for (sim_stream *s = only ? only : ctx->streams; s; s = only ? NULL : s->next) {
        if (!s->last || s->last->done)
            continue;
        if (n == cap) {
            sim_op **nv = malloc(cap * 2 * sizeof *nv);
            if (!nv) {
                /* fall back to waiting for what we have first; correctness only needs patience */
                while (n) {
                    sim_op *o = v[--n];
                    while (!o->done)
                        pthread_cond_wait(&sim.cv, &sim.mu);
                    sim_op_put_locked(o);
                }
                continue;
            }
            memcpy(nv, v, n * sizeof *nv);
            if (v != snap)
                free(v);
            v = nv;
            cap *= 2;
        }
        s->last->refs++;
        v[n++] = s->last;
    }
    for (size_t i = 0; i < n; i++) {
        while (!v[i]->done)
            pthread_cond_wait(&sim.cv, &sim.mu);
        sim_op_put_locked(v[i]);
    }
    pthread_mutex_unlock(&sim.mu);
    if (v != snap)
        free(v);
    return (CUresult)atomic_load(&ctx->sticky);
}

CUresult sim_ctx_sync(sim_ctx *ctx) { return wait_last(ctx, NULL); }

void sim_ctx_streams_stop(sim_ctx *ctx) {
    for (sim_stream *s = ctx->streams; s; s = s->next) {
        if (!s->dying) {
            s->dying = 1;
            if (!s->legacy)
                sim_handle_del(s);
        }
    }
    pthread_cond_broadcast(&sim.cv);
    while (ctx->nstreams > 0)
        pthread_cond_wait(&sim.cv, &sim.mu);
    while (ctx->events) {
        sim_event *e = ctx->events;
        ctx->events = e->next;
        sim_handle_del(e);
        if (e->rec)
            sim_op_put_locked(e->rec);
        free(e);
    }
}

int sim_streams_drain(uint64_t deadline_ns) {
    int rc = 0;
    pthread_mutex_lock(&sim.mu);
    for (;;) {
        bool busy = false;
        for (int d = 0; d < sim.ndev && !busy; d++) {
            sim_ctx *ctx = sim.dev[d].primary;
            if (!ctx)
                continue;
            for (sim_stream *s = ctx->streams; s && !busy; s = s->next)
                busy = s->head != NULL;
        }
        if (!busy)
            break;
        if (sim_cond_wait_until(&sim.cv, &sim.mu, deadline_ns) < 0) {
            rc = -1;
            break;
        }
    }
    pthread_mutex_unlock(&sim.mu);
    return rc;
}

/* ---- stream API ---- */

static CUresult stream_create(const char *name, CUstream *phStream, unsigned flags, int priority) {
    sim_call c;
    CUresult r = sim_enter(&c, name, SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!phStream || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    /* A priority outside the context's range is clamped to it, as the driver does; the simulator's streams
     * run concurrently whatever their priority, so it is only kept. */
    if (priority > SIM_PRIO_LEAST)
        priority = SIM_PRIO_LEAST;
    if (priority < SIM_PRIO_GREATEST)
        priority = SIM_PRIO_GREATEST;
    sim_stream *s;
    pthread_mutex_lock(&sim.mu);
    r = sim_stream_create_locked(c.ctx, flags, 0, &s);
    if (r == CUDA_SUCCESS)
        s->priority = priority;
    pthread_mutex_unlock(&sim.mu);
    if (r == CUDA_SUCCESS)
        *phStream = (CUstream)s;
    return sim_leave(&c, r);
}

SIM_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    return stream_create("cuStreamCreate", phStream, Flags, 0);
}

SIM_API CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    return stream_create("cuStreamCreateWithPriority", phStream, flags, priority);
}

/* A stream's priority or flags; the NULL, legacy and per-thread streams have priority 0 and no flags. */
static CUresult stream_get(const char *name, CUstream h, int *priority, unsigned *flags) {
    sim_call c;
    CUresult r = sim_enter(&c, name, SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!priority && !flags)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_stream *s;
    pthread_mutex_lock(&sim.mu);
    r = resolve_locked(c.ctx, h, &s);
    if (r == CUDA_SUCCESS && priority)
        *priority = s->priority;
    if (r == CUDA_SUCCESS && flags)
        *flags = s->flags;
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuStreamGetPriority(CUstream hStream, int *priority) {
    return stream_get("cuStreamGetPriority", hStream, priority, NULL);
}

SIM_API CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags) {
    return stream_get("cuStreamGetFlags", hStream, NULL, flags);
}

SIM_API CUresult cuStreamDestroy_v2(CUstream hStream) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuStreamDestroy_v2", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    sim_stream *s = (sim_stream *)hStream;
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(s, SIM_H_STREAM) || s->dying) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        /* queued work still runs; the worker frees the stream when it is done */
        s->dying = 1;
        sim_handle_del(s);
        pthread_cond_broadcast(&sim.cv);
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuStreamSynchronize(CUstream hStream) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuStreamSynchronize", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    sim_stream *s;
    sim_op *last = NULL;
    pthread_mutex_lock(&sim.mu);
    r = resolve_uncaptured_locked(c.ctx, hStream, &s);
    if (r == CUDA_SUCCESS && s->last) {
        last = s->last;
        last->refs++;
    }
    pthread_mutex_unlock(&sim.mu);
    if (last) {
        sim_op_wait(last);
        sim_op_put(last);
    }
    if (r == CUDA_SUCCESS)
        r = (CUresult)atomic_load(&c.ctx->sticky);
    return sim_leave(&c, r);
}

SIM_API CUresult cuStreamQuery(CUstream hStream) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuStreamQuery", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    sim_stream *s;
    pthread_mutex_lock(&sim.mu);
    r = resolve_locked(c.ctx, hStream, &s);
    if (r == CUDA_SUCCESS && s->last && !s->last->done)
        r = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

/* A host function runs on the stream's worker in stream order; like the
 * driver's, it must not call the driver itself (not checked here). */
typedef struct {
    CUhostFn fn;
    void *data;
} hostfn_pay;

static CUresult run_hostfn(sim_op *op) {
    hostfn_pay *h = op->arg;
    h->fn(h->data);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuLaunchHostFunc", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!fn)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_op *op = sim_op_new(sizeof(hostfn_pay), run_hostfn);
    if (!op)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    *(hostfn_pay *)op->arg = (hostfn_pay){fn, userData};
    r = sim_submit(c.ctx, hStream, op);
    sim_op_put(op);
    return sim_leave(&c, r);
}

SIM_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuStreamWaitEvent", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (Flags & ~1u) /* CU_EVENT_WAIT_DEFAULT, CU_EVENT_WAIT_EXTERNAL */
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_op *op = sim_op_new(0, NULL);
    if (!op)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    sim_event *e = (sim_event *)hEvent;
    sim_stream *s;
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(e, SIM_H_EVENT))
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        r = resolve_uncaptured_locked(c.ctx, hStream, &s);
    /* waiting for an event that was never recorded is a no-op on the driver */
    if (r == CUDA_SUCCESS && e->rec && !e->rec->done)
        r = enqueue_locked(s, op, e->rec);
    sim_op_put_locked(op);
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

/* ---- events ---- */

static CUresult event_check_locked(CUevent h, sim_event **out) {
    sim_event *e = (sim_event *)h;
    if (!sim_handle_is(e, SIM_H_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    *out = e;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuEventCreate", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (!phEvent || (Flags & ~known) || ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_event *e = calloc(1, sizeof *e);
    if (!e)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    e->magic = 0x45564e54u;
    e->ctx = c.ctx;
    e->flags = Flags;
    pthread_mutex_lock(&sim.mu);
    if (sim_handle_add(e, SIM_H_EVENT) < 0) {
        pthread_mutex_unlock(&sim.mu);
        free(e);
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    }
    e->next = c.ctx->events;
    c.ctx->events = e;
    pthread_mutex_unlock(&sim.mu);
    *phEvent = (CUevent)e;
    return sim_leave(&c, CUDA_SUCCESS);
}

static CUresult event_record(const char *name, CUevent hEvent, CUstream hStream, unsigned flags) {
    sim_call c;
    CUresult r = sim_enter(&c, name, SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    /* CU_EVENT_RECORD_EXTERNAL is for captures (an event node), and the simulator refuses records on capturing
     * streams; outside a capture the driver refuses it (measured: CUDA_ERROR_ILLEGAL_STATE). */
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_op *op = sim_op_new(0, NULL);
    if (!op)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    sim_event *e;
    sim_stream *s;
    pthread_mutex_lock(&sim.mu);
    r = event_check_locked(hEvent, &e);
    if (r == CUDA_SUCCESS)
        r = resolve_uncaptured_locked(c.ctx, hStream, &s);
    if (r == CUDA_SUCCESS && (flags & CU_EVENT_RECORD_EXTERNAL))
        r = CUDA_ERROR_ILLEGAL_STATE;
    if (r == CUDA_SUCCESS)
        r = enqueue_locked(s, op, NULL);
    if (r == CUDA_SUCCESS) {
        if (e->rec)
            sim_op_put_locked(e->rec);
        e->rec = op; /* takes over the caller's reference */
    } else {
        sim_op_put_locked(op);
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    return event_record("cuEventRecord", hEvent, hStream, CU_EVENT_RECORD_DEFAULT);
}

SIM_API CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
    return event_record("cuEventRecordWithFlags", hEvent, hStream, flags);
}

SIM_API CUresult cuEventQuery(CUevent hEvent) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuEventQuery", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    sim_event *e;
    pthread_mutex_lock(&sim.mu);
    r = event_check_locked(hEvent, &e);
    if (r == CUDA_SUCCESS && e->rec && !e->rec->done)
        r = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuEventSynchronize(CUevent hEvent) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuEventSynchronize", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    sim_event *e;
    pthread_mutex_lock(&sim.mu);
    r = event_check_locked(hEvent, &e);
    if (r == CUDA_SUCCESS && e->rec) {
        sim_op *op = e->rec;
        op->refs++;
        while (!op->done)
            pthread_cond_wait(&sim.cv, &sim.mu);
        sim_op_put_locked(op);
    }
    pthread_mutex_unlock(&sim.mu);
    if (r == CUDA_SUCCESS)
        r = (CUresult)atomic_load(&c.ctx->sticky);
    return sim_leave(&c, r);
}

static CUresult elapsed(const char *name, float *ms, CUevent hStart, CUevent hEnd) {
    sim_call c;
    CUresult r = sim_enter(&c, name, SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!ms) /* sic: measured on the driver */
        return sim_leave(&c, CUDA_ERROR_INVALID_HANDLE);
    sim_event *a, *b;
    pthread_mutex_lock(&sim.mu);
    r = event_check_locked(hStart, &a);
    if (r == CUDA_SUCCESS)
        r = event_check_locked(hEnd, &b);
    if (r == CUDA_SUCCESS) {
        if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
            r = CUDA_ERROR_INVALID_HANDLE;
        else if (!a->rec || !b->rec)
            r = CUDA_ERROR_INVALID_HANDLE; /* never recorded */
        else if (!a->rec->done || !b->rec->done)
            r = CUDA_ERROR_NOT_READY;
        else
            *ms = (float)((double)((int64_t)(b->rec->ts_ns - a->rec->ts_ns)) / 1e6);
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

#undef cuEventElapsedTime
SIM_API CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
SIM_API CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    return elapsed("cuEventElapsedTime", pMilliseconds, hStart, hEnd);
}

SIM_API CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    return elapsed("cuEventElapsedTime_v2", pMilliseconds, hStart, hEnd);
}

SIM_API CUresult cuEventDestroy_v2(CUevent hEvent) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuEventDestroy_v2", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    sim_event *e;
    pthread_mutex_lock(&sim.mu);
    r = event_check_locked(hEvent, &e);
    if (r == CUDA_SUCCESS) {
        sim_handle_del(e);
        for (sim_event **pp = &e->ctx->events; *pp; pp = &(*pp)->next) {
            if (*pp == e) {
                *pp = e->next;
                break;
            }
        }
        if (e->rec)
            sim_op_put_locked(e->rec);
        free(e);
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

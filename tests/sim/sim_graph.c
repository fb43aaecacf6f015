/*
 * CUDA graphs made by stream capture (cuStreamBeginCapture_v2 ..
 * cuStreamEndCapture, cuGraphInstantiateWithFlags, cuGraphLaunch): the
 * subset programs use to replay a step's work with one call.
 *
 * While a stream captures, every operation submitted to it (launches,
 * copies, memsets) is recorded into the graph instead of being queued, and
 * counts as done for anyone who waits on it. A graph launch queues, on the
 * launching stream and in capture order, a fresh op per recorded one that
 * runs with the recorded op's arguments: parameters as they were at capture,
 * as the driver's kernel nodes keep them. What this simulator does not do:
 * events recorded or waited for on a capturing stream (the driver turns them
 * into dependencies between streams; here they are refused with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), synchronizing a capturing stream
 * (the same), and graphs built node by node. cuStreamGetCaptureInfo_v2 says
 * whether a stream captures, with the capture's id and the graph it makes (the
 * one cuStreamEndCapture hands out); it lists no dependencies.
 */
#include <stdlib.h>

#include "sim.h"

/* A captured graph (SIM_H_GRAPH), and an executable one (SIM_H_GRAPH_EXEC): its own references to the same ops. */
typedef struct sim_graph {
    uint32_t magic;
    sim_ctx *ctx;
    CUstreamCaptureMode mode;
    sim_op **ops; /* references, in capture order */
    size_t n, cap;
    int oom;     /* a record failed: EndCapture says so */
    uint64_t id; /* the capture's, from 1 */
} sim_graph;

static uint64_t capture_ids; /* under sim.mu */

void sim_graph_record_locked(sim_graph *g, sim_op *op) {
    if (g->n == g->cap) {
        size_t c = g->cap ? g->cap * 2 : 16;
        sim_op **v = realloc(g->ops, c * sizeof *v);
        if (!v) {
            g->oom = 1;
            op->done = 1;
            return;
        }
        g->ops = v;
        g->cap = c;
    }
    op->refs++;
    op->done = 1; /* recorded, never run itself: nobody may wait for it forever */
    g->ops[g->n++] = op;
    pthread_cond_broadcast(&sim.cv);
}

/*
 * Work on the legacy stream, which synchronizes with blocking streams, would join a blocking stream's capture,
 * whatever its mode: the driver refuses the launch (measured on an H200, driver 580: cuBLAS's product on the
 * legacy stream is EXECUTION_FAILED under global and relaxed mode alike, and the capture is invalidated). A
 * non-blocking stream's capture leaves the legacy stream alone (measured: the product runs, outside the capture).
 * mu held.
 */
bool sim_ctx_blocking_capture_locked(sim_ctx *ctx) {
    for (sim_stream *s = ctx->streams; s; s = s->next)
        if (s->capture && !(s->flags & CU_STREAM_NON_BLOCKING))
            return true;
    return false;
}

/* A blocking stream of ctx captures in global mode: the legacy stream, which synchronizes with blocking streams,
 * would join its capture (a non-blocking stream's capture leaves it alone: measured); mu held. */
static bool legacy_joins_capture_locked(sim_ctx *ctx) {
    for (sim_stream *s = ctx->streams; s; s = s->next)
        if (s->capture && s->capture->mode == CU_STREAM_CAPTURE_MODE_GLOBAL && !(s->flags & CU_STREAM_NON_BLOCKING))
            return true;
    return false;
}

static void put_ops_locked(sim_op **ops, size_t n) {
    for (size_t i = 0; i < n; i++)
        sim_op_put_locked(ops[i]);
    free(ops);
}

/* A capturing stream of the caller's context (not the legacy one), or an error. */
static CUresult capture_stream_locked(sim_ctx *ctx, CUstream h, sim_stream **out) {
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    sim_stream *s = (sim_stream *)h;
    if (!sim_handle_is(s, SIM_H_STREAM) || s->dying || s->ctx != ctx)
        return CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuStreamBeginCapture_v2", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_stream *s;
    pthread_mutex_lock(&sim.mu);
    r = capture_stream_locked(c.ctx, hStream, &s);
    if (r == CUDA_SUCCESS && s->capture)
        r = CUDA_ERROR_ILLEGAL_STATE;
    if (r == CUDA_SUCCESS) {
        /* the stream holds it until cuStreamEndCapture hands it out */
        s->capture = calloc(1, sizeof *s->capture);
        if (!s->capture) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            s->capture->magic = 0x47524150u;
            s->capture->ctx = c.ctx;
            s->capture->mode = mode;
            s->capture->id = ++capture_ids;
        }
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                           cuuint64_t *id_out, CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                           size_t *numDependencies_out) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuStreamGetCaptureInfo_v2", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!captureStatus_out)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    sim_stream *s = NULL; /* the legacy and per-thread streams never capture */
    if (hStream != NULL && hStream != CU_STREAM_LEGACY && hStream != CU_STREAM_PER_THREAD)
        r = capture_stream_locked(c.ctx, hStream, &s);
    else if (legacy_joins_capture_locked(c.ctx))
        r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; /* as cuStreamIsCapturing: the legacy stream would join it */
    sim_graph *g = s ? s->capture : NULL;
    if (r == CUDA_SUCCESS) {
        *captureStatus_out = g ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
        if (g && id_out)
            *id_out = g->id;
        if (g && graph_out)
            *graph_out = (CUgraph)g;
        if (g && dependencies_out)
            *dependencies_out = NULL;
        if (g && numDependencies_out)
            *numDependencies_out = 0;
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

/*
 * Whether a stream captures. The legacy stream never does itself, but while a blocking stream of its context
 * captures in global mode the driver refuses to look at it (the question would join it to the capture). The simulator refuses what would invalidate a capture instead of invalidating it, so
 * CU_STREAM_CAPTURE_STATUS_INVALIDATED is never the answer here.
 */
SIM_API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuStreamIsCapturing", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!captureStatus)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD) {
        if (legacy_joins_capture_locked(c.ctx))
            r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        else
            *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
    } else {
        sim_stream *s;
        r = capture_stream_locked(c.ctx, hStream, &s);
        if (r == CUDA_SUCCESS)
            *captureStatus = s->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

/* The calling thread's capture mode. The simulator keeps it for the caller to exchange; what the driver
 * refuses under it (potentially unsafe calls during another thread's capture) the simulator does not check.
 * The driver takes any value (measured: 7 succeeds) and crashes on NULL, which the simulator refuses. */
static _Thread_local CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

SIM_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuThreadExchangeStreamCaptureMode", SIM_NEED_INIT);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!mode)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    CUstreamCaptureMode old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return sim_leave(&c, CUDA_SUCCESS);
}

SIM_API CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuStreamEndCapture", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!phGraph)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_stream *s;
    pthread_mutex_lock(&sim.mu);
    r = capture_stream_locked(c.ctx, hStream, &s);
    if (r == CUDA_SUCCESS && !s->capture)
        r = CUDA_ERROR_ILLEGAL_STATE;
    if (r == CUDA_SUCCESS) {
        sim_graph *g = s->capture;
        s->capture = NULL;
        if (g->oom || sim_handle_add(g, SIM_H_GRAPH) < 0) {
            put_ops_locked(g->ops, g->n);
            free(g);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *phGraph = (CUgraph)g;
        }
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuGraphInstantiateWithFlags", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!phGraphExec || flags != 0) /* auto-free-on-launch, upload, device launch: not simulated */
        return sim_leave(&c, !phGraphExec ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED);
    sim_graph *g = (sim_graph *)hGraph;
    pthread_mutex_lock(&sim.mu);
    sim_graph *x = NULL;
    if (!sim_handle_is(g, SIM_H_GRAPH))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!(x = calloc(1, sizeof *x)) || (g->n && !(x->ops = malloc(g->n * sizeof *x->ops))))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        x->magic = 0x47455843u;
        x->ctx = g->ctx;
        for (size_t i = 0; i < g->n; i++) {
            g->ops[i]->refs++;
            x->ops[x->n++] = g->ops[i];
        }
        x->cap = x->n;
        if (sim_handle_add(x, SIM_H_GRAPH_EXEC) < 0) {
            put_ops_locked(x->ops, x->n);
            x->ops = NULL;
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *phGraphExec = (CUgraphExec)x;
            x = NULL;
        }
    }
    if (x) {
        free(x->ops);
        free(x);
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

/* A replay of a recorded op: its run and arguments; the payload holds the recorded op, kept while this runs. */
static void fini_replay(sim_op *op) { sim_op_put_locked(*(sim_op **)(void *)op->payload); }

SIM_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuGraphLaunch", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    sim_graph *x = (sim_graph *)hGraphExec;
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(x, SIM_H_GRAPH_EXEC) || x->ctx != c.ctx)
        r = CUDA_ERROR_INVALID_HANDLE;
    size_t n = r == CUDA_SUCCESS ? x->n : 0;
    sim_op **rec = n ? malloc(n * sizeof *rec) : NULL;
    if (n && !rec)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n && rec; i++) {
        rec[i] = x->ops[i];
        rec[i]->refs++; /* kept through the submissions below (the exec may be destroyed meanwhile) */
    }
    pthread_mutex_unlock(&sim.mu);
    for (size_t i = 0; rec && i < n; i++) {
        if (r == CUDA_SUCCESS && rec[i]->run) {
            sim_op *op = sim_op_new(sizeof(sim_op *), rec[i]->run);
            if (!op) {
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                *(sim_op **)(void *)op->payload = rec[i];
                op->arg = rec[i]->arg;
                pthread_mutex_lock(&sim.mu);
                rec[i]->refs++; /* the replay's, dropped by fini_replay */
                pthread_mutex_unlock(&sim.mu);
                op->fini = fini_replay;
                r = sim_submit(c.ctx, hStream, op);
                sim_op_put(op);
            }
        }
        sim_op_put(rec[i]);
    }
    free(rec);
    return sim_leave(&c, r);
}

/* cuGraphExecDestroy and cuGraphDestroy: h, a handle of type t, and its references go (queued replays hold their
 * own). */
static CUresult destroy(const char *name, void *h, sim_htype t) {
    sim_call c;
    CUresult r = sim_enter(&c, name, SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    sim_graph *g = h;
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(g, t)) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        sim_handle_del(g);
        put_ops_locked(g->ops, g->n);
        free(g);
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    return destroy("cuGraphExecDestroy", hGraphExec, SIM_H_GRAPH_EXEC);
}

SIM_API CUresult cuGraphDestroy(CUgraph hGraph) { return destroy("cuGraphDestroy", hGraph, SIM_H_GRAPH); }

/* The nodes are the captured operations, in capture order; a node's handle is its operation's. As the driver: with
 * no array, the count; with one of *numNodes entries, as many nodes as fit, the rest NULL, and *numNodes the number
 * written. */
SIM_API CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuGraphGetNodes", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!numNodes)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_graph *g = (sim_graph *)hGraph;
    pthread_mutex_lock(&sim.mu);
    if (!sim_handle_is(g, SIM_H_GRAPH)) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (!nodes) {
        *numNodes = g->n;
    } else {
        size_t k = *numNodes < g->n ? *numNodes : g->n;
        for (size_t i = 0; i < *numNodes; i++)
            nodes[i] = i < k ? (CUgraphNode)(void *)g->ops[i] : NULL;
        *numNodes = k;
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

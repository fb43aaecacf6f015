/*
 * A detached process's objects made again in a new worker (client.h:
 * sv_replay), under the same virtual handles, so that nothing the process
 * holds changes: after a checkpoint's detach the process runs again (it was
 * restored, or the dump is over) and gpucrServedAttach has a worker with a
 * new ring; this runs first on it, while every other thread of the process
 * still waits in sv_enter.
 *
 * In the order that later objects need earlier ones:
 *   1. the primary context's flags, if the process set them, and the
 *      context's limits it set;
 *   2. the address ranges the process reserved, at the same addresses, before
 *      anything else of the worker's takes device addresses (the interposer
 *      maps the helper's memory into them again once this returns; the
 *      memory itself was unmapped and released before the detach);
 *   3. modules and libraries, from the images kept at their loads;
 *   4. kernels and functions, by name (a kernel's function by its kernel),
 *      with the attributes and cache preference the process set on them;
 *      the globals the process asked for, with what they held at the
 *      detach (where the new worker placed them: see globals_check);
 *   5. streams and events, with their flags and priorities, then the objects
 *      of the libraries served beside this one (cuBLAS's handles, cuBLASLt's
 *      descriptors: ext.c), which name streams and are named by captures;
 *   6. graphs, by capturing again what their capture forwarded (launches,
 *      memsets, device copies, event records and waits, stream memory
 *      operations: records that name virtual ids and device addresses, which
 *      are the same now), and graph execs, instantiated again from the
 *      capture they were made from (their graph is often destroyed).
 * Objects the process had destroyed are not made; ids past them stay as they
 * were. What cannot be made again (a capture with staged copies in it) is
 * said once, and fails at its use, not here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

/* A synchronous record of the replay: its result, the line that says which object it was when it failed. */
static CUresult step(CUresult r, const char *what, uint32_t id) {
    if (r != CUDA_SUCCESS && r != SV_GONE)
        sv_warn("served mode: the new worker could not make %s %u again: CUresult %d", what, id, (int)r);
    return r;
}

static CUresult reservations(void) {
    size_t n = sv_reservations(NULL, 0);
    if (!n)
        return CUDA_SUCCESS;
    sv_reservation *v = calloc(n, sizeof *v);
    if (!v)
        return CUDA_ERROR_OUT_OF_MEMORY;
    n = sv_reservations(v, n);
    CUresult r = CUDA_SUCCESS;
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
        struct sv_vmm_rec q = {.a = v[i].size, .b = v[i].align, .c = v[i].base};
        uint64_t got = 0;
        sv_script_expect(&v[i].base, sizeof v[i].base); /* a template's worker must reserve it there too */
        r = sv_sync(SV_OP_VMM_RESERVE, &q, sizeof q, &got, sizeof got, NULL, false);
        if (r == CUDA_SUCCESS && got != v[i].base) {
            struct sv_vmm_rec f = {.a = got, .b = v[i].size};
            (void)sv_sync(SV_OP_VMM_ADDR_FREE, &f, sizeof f, NULL, 0, NULL, false);
            sv_warn(
                "served mode: the new worker reserves 0x%llx (%llu bytes) at 0x%llx instead: the process's "
                "device addresses cannot be kept",
                (unsigned long long)v[i].base, (unsigned long long)v[i].size, (unsigned long long)got);
            r = CUDA_ERROR_ALREADY_MAPPED;
        } else if (r != CUDA_SUCCESS && r != SV_GONE) {
            sv_warn("served mode: the new worker cannot reserve 0x%llx (%llu bytes) again: CUresult %d",
                    (unsigned long long)v[i].base, (unsigned long long)v[i].size, (int)r);
        }
    }
    free(v);
    return r;
}

static CUresult images(void) {
    CUresult r = CUDA_SUCCESS;
    for (uint32_t id = 1, end = sv_id_end(SV_K_MODULE); id < end && r == CUDA_SUCCESS; id++) {
        sv_image *im = sv_id_live(SV_K_MODULE, id) ? sv_id_data(SV_K_MODULE, id) : NULL;
        if (!im)
            continue;
        struct sv_load_rec q = im->rec;
        q.id = id;
        r = step(sv_send_image(im->image, im->size, SV_OP_MODULE_LOAD, &q, sizeof q, NULL, 0, NULL), "module", id);
    }
    for (uint32_t id = 1, end = sv_id_end(SV_K_LIBRARY); id < end && r == CUDA_SUCCESS; id++) {
        sv_image *im = sv_id_live(SV_K_LIBRARY, id) ? sv_id_data(SV_K_LIBRARY, id) : NULL;
        if (!im)
            continue;
        struct sv_load_rec q = im->rec;
        q.id = id;
        static uint8_t out[SV_REPLY_DATA]; /* the JIT's logs: the first load said them already */
        uint32_t olen = 0;
        r = step(sv_send_image(im->image, im->size, SV_OP_LIBRARY_LOAD, &q, sizeof q, out, sizeof out, &olen),
                 "library", id);
    }
    return r;
}

/* Whether a function's owner (a module, or a kernel whose library) is live: else it was not made again. */
static bool owner_live(const sv_func *f) {
    if (f->okind == SV_K_MODULE || f->okind == SV_K_LIBRARY)
        return sv_id_live(f->okind, f->owner);
    const sv_func *k = sv_id_live(SV_K_KERNEL, f->owner) ? sv_id_data(SV_K_KERNEL, f->owner) : NULL;
    return k && sv_id_live(SV_K_LIBRARY, k->owner);
}

static CUresult functions(void) {
    static struct sv_layout l; /* the worker's answer: the same image gives the same layout */
    CUresult r = CUDA_SUCCESS;
    for (uint32_t id = 1, end = sv_id_end(SV_K_KERNEL); id < end && r == CUDA_SUCCESS; id++) {
        sv_func *f = sv_id_live(SV_K_KERNEL, id) ? sv_id_data(SV_K_KERNEL, id) : NULL;
        if (!f || !f->name || !owner_live(f))
            continue;
        struct sv_get_rec q = {id, f->owner};
        r = step(sv_sync_named(SV_OP_LIBRARY_GET_KERNEL, &q, sizeof q, f->name, &l, sizeof l, NULL), "kernel", id);
    }
    for (uint32_t id = 1, end = sv_id_end(SV_K_FUNC); id < end && r == CUDA_SUCCESS; id++) {
        sv_func *f = sv_id_live(SV_K_FUNC, id) ? sv_id_data(SV_K_FUNC, id) : NULL;
        if (!f || !owner_live(f))
            continue;
        struct sv_get_rec q = {id, f->owner};
        if (f->okind == SV_K_MODULE && f->name)
            r = sv_sync_named(SV_OP_MODULE_GET_FUNCTION, &q, sizeof q, f->name, &l, sizeof l, NULL);
        else if (f->okind == SV_K_KERNEL)
            r = sv_sync(SV_OP_KERNEL_GET_FUNCTION, &q, sizeof q, &l, sizeof l, NULL, false);
        r = step(r, "function", id);
    }
    return r;
}

/* The attributes and cache preference set on a function or kernel (kernel: id names one), set again. */
static CUresult func_attrs(const sv_func *f, uint32_t id, bool kernel) {
    pthread_mutex_lock(&sv_func_mu);
    uint32_t set = f->attr_set;
    int32_t attr[SV_FUNC_ATTRS], cache = f->cache;
    memcpy(attr, f->attr, sizeof attr);
    pthread_mutex_unlock(&sv_func_mu);
    CUresult r = CUDA_SUCCESS;
    int32_t v;
    for (unsigned i = 0; i < SV_FUNC_ATTRS && r == CUDA_SUCCESS; i++)
        if (set & (1u << i)) {
            struct sv_func_attr_rec q = {id, kernel, SV_FA_SET, (int32_t)(SV_FUNC_ATTR_FIRST + i), attr[i], 0, 0};
            r = sv_sync(SV_OP_FUNC_ATTR, &q, sizeof q, &v, sizeof v, NULL, false);
        }
    if (r == CUDA_SUCCESS && cache >= 0) {
        struct sv_func_attr_rec q = {id, kernel, SV_FA_CACHE, 0, cache, 0, 0};
        r = sv_sync(SV_OP_FUNC_ATTR, &q, sizeof q, &v, sizeof v, NULL, false);
    }
    return step(r, kernel ? "the attributes of kernel" : "the attributes of function", id);
}

/*
 * The globals the process holds addresses of, asked of the new worker, and given what they held at the detach
 * (sv_globals_save). The same images loaded in the same order give them the same addresses on the simulator, not
 * on the driver, which places globals in a heap of its own (measured on an H200: a PyTorch server's library
 * globals came back 256 bytes lower). One that moved gets its contents at its new address, and the process's
 * record of it the new address (its later lookups, copies and saves); a copy, memset or pointer query through its
 * old address is translated (sv_moved_addr), but a kernel argument or a pointer stored in device memory that holds
 * one is stale, which is said once for them all (sv_globals_moved_say).
 */
static struct {
    unsigned n, total;
    char first[96];
    uint64_t old, now;
} moved;

static void moved_note(const sv_global *g, uint64_t now) {
    if (!moved.n++) {
        snprintf(moved.first, sizeof moved.first, "%s", g->name);
        moved.old = g->addr;
        moved.now = now;
    }
}

void sv_globals_moved_say(void) {
    if (moved.n)
        sv_warn(
            "served mode: the new worker placed %u of the process's %u module globals elsewhere (%s%s at 0x%llx, "
            "not 0x%llx): their contents went with them, and copies through an old address reach them, but a kernel "
            "argument or a pointer in device memory that holds one is stale",
            moved.n, moved.total, moved.first, moved.n > 1 ? ", the first," : "", (unsigned long long)moved.now,
            (unsigned long long)moved.old);
    memset(&moved, 0, sizeof moved);
}

/* g where the worker has it now (v: its address and size): a move noted, the process's record moved. */
static void global_now(sv_global *g, const uint64_t v[2]) {
    moved.total++;
    if (v[0] != g->addr) {
        moved_note(g, v[0]);
        sv_global_moved(g, v[0], v[1]);
    }
}

static CUresult globals_check(unsigned kind, uint32_t id, const sv_image *im) {
    pthread_mutex_lock(&sv_func_mu);
    sv_global *first = im->globals;
    pthread_mutex_unlock(&sv_func_mu);
    CUresult r = CUDA_SUCCESS;
    for (sv_global *g = first; g && r == CUDA_SUCCESS; g = g->next) {
        struct sv_global_rec q = {id, kind == SV_K_LIBRARY};
        uint64_t v[2] = {0, 0};
        /* where the process's pointers to it point; a template's worker that has it elsewhere moves the copy below */
        sv_script_expect(&g->addr, sizeof g->addr);
        r = step(sv_sync_named(SV_OP_GET_GLOBAL, &q, sizeof q, g->name, v, sizeof v, NULL), "a global of", id);
        if (r == CUDA_SUCCESS) {
            global_now(g, v);
            r = step(sv_global_restore(g), "the contents of a global of", id);
        }
    }
    return r;
}

/* After an attach to a template: where its worker placed each global, which the script could not say. */
CUresult sv_globals_refresh(void) {
    CUresult r = CUDA_SUCCESS;
    for (unsigned k = SV_K_MODULE; k <= SV_K_LIBRARY && r == CUDA_SUCCESS; k += SV_K_LIBRARY - SV_K_MODULE)
        for (uint32_t id = 1, end = sv_id_end(k); id < end && r == CUDA_SUCCESS; id++) {
            const sv_image *im = sv_id_live(k, id) ? sv_id_data(k, id) : NULL;
            pthread_mutex_lock(&sv_func_mu);
            sv_global *first = im ? im->globals : NULL;
            pthread_mutex_unlock(&sv_func_mu);
            for (sv_global *g = first; g && r == CUDA_SUCCESS; g = g->next) {
                struct sv_global_rec q = {id, k == SV_K_LIBRARY};
                uint64_t v[2] = {0, 0};
                r = step(sv_sync_named(SV_OP_GET_GLOBAL, &q, sizeof q, g->name, v, sizeof v, NULL), "a global of", id);
                if (r == CUDA_SUCCESS)
                    global_now(g, v);
            }
        }
    sv_globals_moved_say();
    return r;
}

static CUresult attributes(void) {
    CUresult r = CUDA_SUCCESS;
    for (uint32_t id = 1, end = sv_id_end(SV_K_KERNEL); id < end && r == CUDA_SUCCESS; id++) {
        const sv_func *f = sv_id_live(SV_K_KERNEL, id) ? sv_id_data(SV_K_KERNEL, id) : NULL;
        if (f && f->name && owner_live(f) && (f->attr_set || f->cache >= 0))
            r = func_attrs(f, id, true);
    }
    for (uint32_t id = 1, end = sv_id_end(SV_K_FUNC); id < end && r == CUDA_SUCCESS; id++) {
        const sv_func *f = sv_id_live(SV_K_FUNC, id) ? sv_id_data(SV_K_FUNC, id) : NULL;
        if (f && owner_live(f) && (f->attr_set || f->cache >= 0))
            r = func_attrs(f, id, false);
    }
    for (unsigned k = SV_K_MODULE; k <= SV_K_LIBRARY && r == CUDA_SUCCESS; k += SV_K_LIBRARY - SV_K_MODULE)
        for (uint32_t id = 1, end = sv_id_end(k); id < end && r == CUDA_SUCCESS; id++) {
            const sv_image *im = sv_id_live(k, id) ? sv_id_data(k, id) : NULL;
            if (im)
                r = globals_check(k, id, im);
        }
    return r;
}

static CUresult flagged(unsigned kind, unsigned op, uint32_t first) {
    CUresult r = CUDA_SUCCESS;
    for (uint32_t id = first, end = sv_id_end(kind); id < end && r == CUDA_SUCCESS; id++) {
        sv_flags *d = sv_id_live(kind, id) ? sv_id_data(kind, id) : NULL;
        if (!d)
            continue;
        if (op == SV_OP_STREAM_CREATE_PRIO) {
            struct sv_pair_rec q = {id, (uint32_t)d->priority, d->flags, 0};
            r = sv_async(op, &q, sizeof q);
        } else {
            struct sv_id_rec q = {id, d->flags};
            r = sv_async(op, &q, sizeof q);
        }
    }
    return r;
}

static CUresult limits(void) {
    uint64_t v[SV_LIMITS];
    uint32_t set = sv_limits(v);
    CUresult r = CUDA_SUCCESS;
    for (unsigned i = 0; i < SV_LIMITS && r == CUDA_SUCCESS; i++)
        if (set & (1u << i)) {
            struct sv_limit_rec q = {i, 1, v[i]};
            r = step(sv_sync(SV_OP_CTX_LIMIT, &q, sizeof q, NULL, 0, NULL, false), "the context limit", i);
        }
    return r;
}

/* ---- graphs: captured again ---- */

#define TEMP_MAX 64u

typedef struct {
    unsigned kind[TEMP_MAX];
    uint32_t id[TEMP_MAX];
    unsigned n;
} temps;

/* A stream or event the capture names that the process destroyed since: made for the capture, then destroyed. */
static CUresult need(temps *t, unsigned kind, uint32_t id) {
    if (kind == SV_K_STREAM && id < SV_STREAM_FIRST_ID)
        return CUDA_SUCCESS;
    if (sv_id_live(kind, id))
        return CUDA_SUCCESS;
    for (unsigned i = 0; i < t->n; i++)
        if (t->kind[i] == kind && t->id[i] == id)
            return CUDA_SUCCESS;
    if (t->n == TEMP_MAX)
        return CUDA_ERROR_NOT_SUPPORTED;
    struct sv_id_rec q = {id,
                          kind == SV_K_STREAM ? (unsigned)CU_STREAM_NON_BLOCKING : (unsigned)CU_EVENT_DISABLE_TIMING};
    CUresult r = sv_async(kind == SV_K_STREAM ? SV_OP_STREAM_CREATE : SV_OP_EVENT_CREATE, &q, sizeof q);
    if (r == CUDA_SUCCESS) {
        t->kind[t->n] = kind;
        t->id[t->n++] = id;
    }
    return r;
}

static void drop_temps(temps *t) {
    for (unsigned i = 0; i < t->n; i++) {
        struct sv_id_rec q = {t->id[i], 0};
        (void)sv_async(t->kind[i] == SV_K_STREAM ? SV_OP_STREAM_DESTROY : SV_OP_EVENT_DESTROY, &q, sizeof q);
    }
    t->n = 0;
}

/* The streams and events the capture's records name, made where the process no longer has them. */
static CUresult capture_needs(const sv_caplog *l, temps *t) {
    CUresult r = CUDA_SUCCESS;
    for (uint32_t i = 0; i < l->nstreams && r == CUDA_SUCCESS; i++)
        r = need(t, SV_K_STREAM, l->streams[i]);
    for (size_t off = 0; off + 8 <= l->len && r == CUDA_SUCCESS;) {
        uint32_t h[2];
        memcpy(h, l->buf + off, sizeof h);
        const uint8_t *pl = l->buf + off + 8;
        if (h[0] == SV_OP_EVENT_RECORD || h[0] == SV_OP_STREAM_WAIT_EVENT) {
            struct sv_pair_rec q;
            memcpy(&q, pl, sizeof q);
            /* record: a event, b stream; wait: a stream, b event */
            r = need(t, SV_K_EVENT, h[0] == SV_OP_EVENT_RECORD ? q.a : q.b);
        }
        off += 8 + ((size_t)h[1] + 7) / 8 * 8;
    }
    return r;
}

/* The capture l again, into the graph id. */
static CUresult capture_again(const sv_caplog *l, uint32_t graph) {
    temps t = {.n = 0};
    CUresult r = capture_needs(l, &t);
    struct sv_pair_rec b = {l->origin, 0, l->mode, 0};
    if (r == CUDA_SUCCESS)
        r = sv_sync(SV_OP_STREAM_BEGIN_CAPTURE, &b, sizeof b, NULL, 0, NULL, false);
    if (r == CUDA_SUCCESS) {
        for (size_t off = 0; off + 8 <= l->len && r == CUDA_SUCCESS;) {
            uint32_t h[2];
            memcpy(h, l->buf + off, sizeof h);
            r = sv_async(h[0], l->buf + off + 8, h[1]);
            off += 8 + ((size_t)h[1] + 7) / 8 * 8;
        }
        /* Ends the capture whatever came of the records, so the stream does not stay capturing. */
        struct sv_pair_rec e = {l->origin, graph, 0, 0};
        CUresult re = sv_sync(SV_OP_STREAM_END_CAPTURE, &e, sizeof e, NULL, 0, NULL, false);
        if (r == CUDA_SUCCESS)
            r = re;
    }
    drop_temps(&t);
    return r;
}

static bool capturable(const sv_caplog *l, const char *what, uint32_t id) {
    if (l && !l->bad)
        return true;
    sv_warn(
        "served mode: %s %u cannot be made again in the new worker: %s; its use fails "
        "(CUDA_ERROR_INVALID_HANDLE)",
        what, id, l ? l->bad : "its capture was not kept (more than 8 captures at once)");
    return false;
}

static CUresult graphs(void) {
    CUresult r = CUDA_SUCCESS;
    for (uint32_t id = 1, end = sv_id_end(SV_K_GRAPH); id < end && r == CUDA_SUCCESS; id++) {
        if (!sv_id_live(SV_K_GRAPH, id))
            continue;
        const sv_caplog *l = sv_id_data(SV_K_GRAPH, id);
        if (capturable(l, "graph", id))
            r = step(capture_again(l, id), "graph", id);
    }
    for (uint32_t id = 1, end = sv_id_end(SV_K_EXEC); id < end && r == CUDA_SUCCESS; id++) {
        const sv_exec *x = sv_id_live(SV_K_EXEC, id) ? sv_id_data(SV_K_EXEC, id) : NULL;
        if (!x || !capturable(x->log, "graph exec", id))
            continue;
        /* A graph of the replay's own, instantiated, then destroyed: the exec does not need it. */
        uint32_t g = sv_id_new(SV_K_GRAPH);
        if (!g)
            return step(CUDA_ERROR_OUT_OF_MEMORY, "graph exec", id);
        r = capture_again(x->log, g);
        if (r == CUDA_SUCCESS) {
            struct sv_graph_rec q = {id, g, x->flags};
            r = sv_sync(SV_OP_GRAPH_INSTANTIATE, &q, sizeof q, NULL, 0, NULL, false);
            struct sv_id_rec d = {g, 0};
            (void)sv_async(SV_OP_GRAPH_DESTROY, &d, sizeof d);
        }
        sv_id_drop(SV_K_GRAPH, g);
        r = step(r, "graph exec", id);
    }
    return r;
}

CUresult sv_replay(void) {
    unsigned flags;
    CUresult r = CUDA_SUCCESS;
    if (sv_primary_flags(&flags)) {
        struct sv_id_rec q = {0, flags};
        r = step(sv_sync(SV_OP_PRIMARY_SET_FLAGS, &q, sizeof q, NULL, 0, NULL, false), "the primary context", 0);
    }
    if (r == CUDA_SUCCESS)
        r = limits();
    if (r == CUDA_SUCCESS)
        r = reservations();
    if (r == CUDA_SUCCESS)
        r = images();
    if (r == CUDA_SUCCESS)
        r = functions();
    if (r == CUDA_SUCCESS)
        r = attributes();
    if (r == CUDA_SUCCESS)
        r = flagged(SV_K_STREAM, SV_OP_STREAM_CREATE_PRIO, SV_STREAM_FIRST_ID);
    if (r == CUDA_SUCCESS)
        r = flagged(SV_K_EVENT, SV_OP_EVENT_CREATE, 1);
    if (r == CUDA_SUCCESS)
        r = sv_ext_replay();
    if (r == CUDA_SUCCESS)
        r = graphs();
    /* The creations above that were asynchronous: their failures come back here. */
    if (r == CUDA_SUCCESS)
        r = step(sv_sync(SV_OP_CTX_SYNC, NULL, 0, NULL, 0, NULL, true), "the context's streams and events", 0);
    sv_globals_moved_say();
    return r;
}

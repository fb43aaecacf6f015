/*
 * Virtual handles (client.h): ids this library chooses, which the worker maps
 * to the driver's handles. A creation can then be asynchronous, and a later
 * restore into a fresh worker can make the same ids again from what is kept
 * here (images, names, flags). Device memory ranges, for cuMemcpy's unified
 * addressing.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

typedef struct {
    pthread_mutex_t mu;
    uint32_t next;  /* never handed out yet: next .. cap-1 */
    uint32_t *free; /* ids given back, a stack */
    uint32_t nfree;
    _Atomic(void *) *data; /* per id; live ids have live[id] set */
    _Atomic uint8_t *live;
} table;

static table T[SV_K_COUNT];

static struct {
    pthread_rwlock_t mu;
    struct {
        uint64_t base, size;
    } * v;
    size_t n, cap;
} M = {.mu = PTHREAD_RWLOCK_INITIALIZER};
static pthread_once_t T_once = PTHREAD_ONCE_INIT;
static bool T_ok;

static void T_init(void) {
    T_ok = true;
    for (unsigned k = 0; k < SV_K_COUNT; k++) {
        pthread_mutex_init(&T[k].mu, NULL);
        /* stream ids start past the special streams, every other kind at 1: no handle's id is 0 */
        T[k].next = k == SV_K_STREAM ? SV_STREAM_FIRST_ID : 1;
        T[k].free = calloc(sv_cap(k), sizeof(uint32_t));
        T[k].data = calloc(sv_cap(k), sizeof(T[k].data[0]));
        T[k].live = calloc(sv_cap(k), 1);
        if (!T[k].free || !T[k].data || !T[k].live)
            T_ok = false;
    }
}

uint32_t sv_id(unsigned kind, const void *h) {
    uint64_t v = (uint64_t)(uintptr_t)h;
    if (v >> 48 != 0x5e5e || ((v >> 40) & 0xff) != kind)
        return 0;
    uint64_t id = v & 0xffffffffffull;
    pthread_once(&T_once, T_init);
    if (!T_ok || id == 0 || id >= sv_cap(kind) || !atomic_load_explicit(&T[kind].live[id], memory_order_acquire))
        return 0;
    return (uint32_t)id;
}

uint32_t sv_id_new(unsigned kind) {
    pthread_once(&T_once, T_init);
    if (!T_ok)
        return 0;
    table *t = &T[kind];
    uint32_t id = 0;
    pthread_mutex_lock(&t->mu);
    if (t->nfree)
        id = t->free[--t->nfree];
    else if (t->next < sv_cap_client(kind))
        id = t->next++;
    pthread_mutex_unlock(&t->mu);
    return id;
}

void sv_id_set(unsigned kind, uint32_t id, void *data) {
    atomic_store_explicit(&T[kind].data[id], data, memory_order_relaxed);
    atomic_store_explicit(&T[kind].live[id], 1, memory_order_release);
}

void *sv_id_data(unsigned kind, uint32_t id) { return atomic_load_explicit(&T[kind].data[id], memory_order_relaxed); }

static void free_data(unsigned kind, void *d) {
    if (!d)
        return;
    if (kind == SV_K_FUNC || kind == SV_K_KERNEL) {
        sv_func *f = d;
        free(f->name);
        free(f->off);
        free(f->size);
    } else if (kind == SV_K_MODULE || kind == SV_K_LIBRARY) {
        sv_image *im = d;
        free(im->image);
        for (sv_global *g = im->globals, *next; g; g = next) {
            next = g->next;
            sv_range_del(g->addr); /* the unload frees it in the worker */
            free(g->name);
            free(g->saved);
            free(g);
        }
    } else if (kind == SV_K_GRAPH) {
        sv_caplog_put(d);
        return;
    } else if (kind == SV_K_EXEC) {
        sv_caplog_put(((sv_exec *)d)->log);
    }
    free(d);
}

/*
 * The id goes back for reuse. Functions and kernels are never dropped (their module's unload makes them
 * invalid in the driver, not here): a launch reads their layout without a lock.
 */
void sv_id_drop(unsigned kind, uint32_t id) {
    table *t = &T[kind];
    atomic_store(&t->live[id], 0);
    void *d = atomic_exchange(&t->data[id], NULL);
    free_data(kind, d);
    pthread_mutex_lock(&t->mu);
    t->free[t->nfree++] = id;
    pthread_mutex_unlock(&t->mu);
}

void sv_handles_reset(void) {
    pthread_rwlock_init(&M.mu, NULL);
    if (!T_ok)
        return;
    for (unsigned k = 0; k < SV_K_COUNT; k++) {
        pthread_mutex_init(&T[k].mu, NULL);
        /* The parent's data stays allocated in the child: its functions' layouts may be read by a thread of
         * the parent's that no longer exists here, and a child is usually short-lived. */
        memset((void *)T[k].live, 0, sv_cap(k));
        memset((void *)T[k].data, 0, sv_cap(k) * sizeof(T[k].data[0]));
        T[k].next = k == SV_K_STREAM ? SV_STREAM_FIRST_ID : 1;
        T[k].nfree = 0;
    }
    M.n = 0; /* the parent's device memory is not the child's */
}

/* ---- device memory ranges ---- */

/* The first range whose base is > p. */
static size_t upper(uint64_t p) {
    size_t lo = 0, hi = M.n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (M.v[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void sv_range_add(uint64_t base, uint64_t size) {
    pthread_rwlock_wrlock(&M.mu);
    if (M.n == M.cap) {
        size_t cap = M.cap ? M.cap * 2 : 256;
        void *v = realloc(M.v, cap * sizeof M.v[0]);
        if (!v) {
            /* Without the entry, cuMemcpy takes this memory for host memory and fails on it: said then. */
            pthread_rwlock_unlock(&M.mu);
            return;
        }
        M.v = v;
        M.cap = cap;
    }
    size_t i = upper(base);
    memmove(&M.v[i + 1], &M.v[i], (M.n - i) * sizeof M.v[0]);
    M.v[i].base = base;
    M.v[i].size = size;
    M.n++;
    pthread_rwlock_unlock(&M.mu);
}

void sv_range_del(uint64_t base) {
    pthread_rwlock_wrlock(&M.mu);
    size_t i = upper(base);
    if (i > 0 && M.v[i - 1].base == base) {
        memmove(&M.v[i - 1], &M.v[i], (M.n - i) * sizeof M.v[0]);
        M.n--;
    }
    pthread_rwlock_unlock(&M.mu);
}

bool sv_range_has(uint64_t p) {
    pthread_rwlock_rdlock(&M.mu);
    size_t i = upper(p);
    bool in = i > 0 && p - M.v[i - 1].base < M.v[i - 1].size;
    pthread_rwlock_unlock(&M.mu);
    return in;
}

uint32_t sv_id_end(unsigned kind) {
    pthread_once(&T_once, T_init);
    if (!T_ok)
        return 0;
    pthread_mutex_lock(&T[kind].mu);
    uint32_t n = T[kind].next;
    pthread_mutex_unlock(&T[kind].mu);
    return n;
}

bool sv_id_live(unsigned kind, uint32_t id) {
    return T_ok && id > 0 && id < sv_cap(kind) && atomic_load_explicit(&T[kind].live[id], memory_order_acquire);
}

/*
 * Kernels' write sets (1_base.h, "1_writes.c"): for each module or library
 * the application loaded with PTX, the kernels the helper's analysis of that
 * PTX decided, each with the parameters it may write global memory through.
 * Kept by the handle the load returned, until its unload. Filled at loads
 * and read at a kernel's first launch (its layout query), both rare: one
 * mutex.
 */
#include <stdlib.h>
#include <string.h>

#include "1_base.h"

typedef struct owner_writes {
    void *owner;
    size_t n;
    gc_kwrite *k; /* sorted by name */
    struct owner_writes *next;
} owner_writes;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static owner_writes *all;
static _Atomic size_t owners; /* entries of all: read without mu by gc_writes_any */

static int by_name(const void *a, const void *b) {
    return strcmp(((const gc_kwrite *)a)->name, ((const gc_kwrite *)b)->name);
}

static void free_writes(owner_writes *w) {
    for (size_t i = 0; i < w->n; i++)
        free(w->k[i].name);
    free(w->k);
    free(w);
}

/* Unlinks owner's entry (mu held); NULL if none. */
static owner_writes *unlink_owner(void *owner) {
    for (owner_writes **pp = &all; *pp; pp = &(*pp)->next) {
        if ((*pp)->owner == owner) {
            owner_writes *w = *pp;
            *pp = w->next;
            return w;
        }
    }
    return NULL;
}

void gc_writes_add(void *owner, gc_kwrite *k, size_t n) {
    owner_writes *w = calloc(1, sizeof *w);
    if (!w) {
        for (size_t i = 0; i < n; i++)
            free(k[i].name);
        free(k);
        return; /* its kernels count as writing everything */
    }
    qsort(k, n, sizeof *k, by_name);
    w->owner = owner;
    w->n = n;
    w->k = k;
    pthread_mutex_lock(&mu);
    owner_writes *old = unlink_owner(owner); /* a handle the driver handed out again */
    w->next = all;
    all = w;
    if (!old)
        atomic_fetch_add(&owners, 1);
    pthread_mutex_unlock(&mu);
    if (old)
        free_writes(old);
}

void gc_writes_drop(void *owner) {
    pthread_mutex_lock(&mu);
    owner_writes *w = unlink_owner(owner);
    if (w)
        atomic_fetch_sub(&owners, 1);
    pthread_mutex_unlock(&mu);
    if (w)
        free_writes(w);
}

bool gc_writes_any(void) { return atomic_load_explicit(&owners, memory_order_acquire) != 0; }

bool gc_writes_find(void *owner, const char *name, gc_kwrite *out) {
    if (!owner || !name)
        return false;
    bool found = false;
    pthread_mutex_lock(&mu);
    for (owner_writes *w = all; w; w = w->next) {
        if (w->owner != owner)
            continue;
        gc_kwrite key = {.name = (char *)name};
        const gc_kwrite *k = bsearch(&key, w->k, w->n, sizeof key, by_name);
        if (k) {
            *out = *k;
            out->name = NULL;
            found = true;
        }
        break;
    }
    pthread_mutex_unlock(&mu);
    return found;
}

void gc_writes_reset(void) {
    pthread_mutex_lock(&mu);
    owner_writes *w = all;
    all = NULL;
    atomic_store(&owners, 0);
    pthread_mutex_unlock(&mu);
    while (w) {
        owner_writes *next = w->next;
        free_writes(w);
        w = next;
    }
}

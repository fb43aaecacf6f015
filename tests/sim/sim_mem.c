/*
 * Device memory (cuMemAlloc and friends) and page-locked host memory.
 *
 * Each device has one memfd, as large as the device, mapped once at a fixed
 * address and inaccessible; an allocation makes its part read-write and a free
 * makes it inaccessible again and punches the pages out of the memfd. So a
 * process holds one fd per device however much it allocates, the addresses are
 * reproducible, and a stray pointer into freed device memory faults instead of
 * reading stale data.
 *
 * Memory is accounted per process against the device's size
 * (GPUCR_SIM_MEM_MIB): two processes can each allocate the whole device.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sim.h"

#define HOST_ALLOCATED 1
#define HOST_REGISTERED 2

static void pool_name(int dev, char *buf, size_t n) { snprintf(buf, n, "gpucr-sim-dev%d", dev); }

CUresult sim_mem_init(void) {
    for (int d = 0; d < sim.ndev; d++) {
        sim_pool *p = &sim.dev[d].pool;
        char name[32];
        pool_name(d, name, sizeof name);
        int fd = sim_memfd(name, sim.dev[d].total);
        if (fd < 0) {
            sim_warn("cuInit: memfd_create/ftruncate for device %d (%llu MiB): %s", d,
                     (unsigned long long)(sim.dev[d].total >> 20), strerror(-fd));
            return CUDA_ERROR_OPERATING_SYSTEM;
        }
        uint64_t slot = SIM_POOL_BASE + (uint64_t)d * SIM_POOL_STRIDE;
        uint64_t step = sim_align_up(sim.dev[d].total, 1ULL << 36);
        int e = -EEXIST;
        uint64_t base = slot;
        /* skip forward inside the device's slot if something already lives at its start */
        for (; base + sim.dev[d].total <= slot + SIM_POOL_STRIDE; base += step) {
            e = sim_map_exact(base, sim.dev[d].total, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
            if (e != -EEXIST)
                break;
        }
        if (e) {
            sim_warn("cuInit: cannot map device %d memory at 0x%llx: %s", d, (unsigned long long)slot, strerror(-e));
            close(fd);
            return CUDA_ERROR_OPERATING_SYSTEM;
        }
        p->base = base;
        p->size = sim.dev[d].total;
        p->fd = fd;
    }
    return CUDA_SUCCESS;
}

bool sim_dev_range_ok(uint64_t p, uint64_t n, bool write) {
    if (n == 0)
        return true;
    uint64_t end = p + n;
    if (end < p)
        return false;
    ssize_t i = rs_find(&sim.dmap, p);
    if (i < 0)
        return false;
    for (;;) {
        const sim_range *r = &sim.dmap.v[i];
        if (write && !(r->prot & PROT_WRITE))
            return false;
        uint64_t rend = r->start + r->len;
        if (end <= rend)
            return true;
        /* an access may run on into the next range only if that one starts right here */
        if ((size_t)++i >= sim.dmap.n || sim.dmap.v[i].start != rend)
            return false;
    }
}

bool sim_is_device_va(uint64_t p) {
    for (int d = 0; d < sim.ndev; d++)
        if (p - sim.dev[d].pool.base < sim.dev[d].pool.size)
            return true;
    return rs_find(&sim.vres, p) >= 0;
}

bool sim_host_is_pinned(const void *p, size_t n) {
    uint64_t a = (uint64_t)(uintptr_t)p;
    ssize_t i = rs_find(&sim.host, a);
    return i >= 0 && a + n <= sim.host.v[i].start + sim.host.v[i].len;
}

static sim_alloc *find_alloc_start(uint64_t addr) {
    for (int d = 0; d < sim.ndev; d++) {
        ssize_t i = rs_find_start(&sim.dev[d].pool.allocs, addr);
        if (i >= 0)
            return sim.dev[d].pool.allocs.v[i].obj;
    }
    return NULL;
}

static sim_alloc *find_alloc_containing(uint64_t addr) {
    for (int d = 0; d < sim.ndev; d++) {
        ssize_t i = rs_find(&sim.dev[d].pool.allocs, addr);
        if (i >= 0) {
            sim_alloc *a = sim.dev[d].pool.allocs.v[i].obj;
            if (addr - a->addr < a->size)
                return a;
        }
    }
    return NULL;
}

CUresult sim_mem_alloc_impl(sim_ctx *ctx, CUdeviceptr *dptr, size_t size) {
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t align = size >= SIM_GRANULARITY ? SIM_GRANULARITY : SIM_PAGE;
    uint64_t mapped = sim_align_up(size, align);
    if (mapped < size)
        return CUDA_ERROR_OUT_OF_MEMORY;
    sim_alloc *a = calloc(1, sizeof *a);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_rwlock_wrlock(&sim.memlock);
    sim_device *dev = &sim.dev[ctx->dev];
    sim_pool *p = &dev->pool;
    CUresult r = CUDA_SUCCESS;
    uint64_t addr = 0;
    if (mapped > dev->total - dev->used ||
        !(addr = rs_fit(&p->allocs, p->base, p->base + p->size, p->base, mapped, align))) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    if (mprotect((void *)(uintptr_t)addr, mapped, PROT_READ | PROT_WRITE) < 0) {
        sim_warn("cuMemAlloc: mprotect(0x%llx, %llu): %s", (unsigned long long)addr, (unsigned long long)mapped,
                 strerror(errno));
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    *a = (sim_alloc){
        .addr = addr, .size = size, .id = sim_buffer_id_next(), .mapped = mapped, .dev = ctx->dev, .ctx = ctx};
    if (rs_insert(&p->allocs, (sim_range){addr, mapped, a, SIM_R_ALLOC, 0}) < 0) {
        mprotect((void *)(uintptr_t)addr, mapped, PROT_NONE);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    /* only the bytes asked for are device memory: copies past them fail as on the driver */
    if (rs_insert(&sim.dmap, (sim_range){addr, size, a, SIM_R_ALLOC, PROT_READ | PROT_WRITE}) < 0) {
        rs_remove_at(&p->allocs, (size_t)rs_find_start(&p->allocs, addr));
        mprotect((void *)(uintptr_t)addr, mapped, PROT_NONE);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    dev->used += mapped;
    pthread_rwlock_unlock(&sim.memlock);
    *dptr = addr;
    return CUDA_SUCCESS;
fail:
    pthread_rwlock_unlock(&sim.memlock);
    free(a);
    return r;
}

CUresult sim_mem_free_locked(sim_alloc *a) {
    sim_device *dev = &sim.dev[a->dev];
    sim_pool *p = &dev->pool;
    ssize_t i = rs_find_start(&p->allocs, a->addr);
    ssize_t j = rs_find_start(&sim.dmap, a->addr);
    if (i < 0 || j < 0)
        return CUDA_ERROR_INVALID_VALUE;
    rs_remove_at(&p->allocs, (size_t)i);
    rs_remove_at(&sim.dmap, (size_t)j);
    if (p->fd >= 0) {
        if (mprotect((void *)(uintptr_t)a->addr, a->mapped, PROT_NONE) < 0)
            sim_warn("cuMemFree: mprotect: %s", strerror(errno));
        /* give the pages back, and let the next allocation here start zeroed */
        if (fallocate(p->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(a->addr - p->base), (off_t)a->mapped) <
            0)
            sim_warn("cuMemFree: fallocate(PUNCH_HOLE): %s", strerror(errno));
    }
    dev->used -= a->mapped;
    free(a);
    return CUDA_SUCCESS;
}

uint64_t sim_buffer_id_next(void) {
    static _Atomic uint64_t next = 1;
    return atomic_fetch_add(&next, 1);
}

void sim_mem_free_if(uint64_t addr, uint64_t id) {
    pthread_rwlock_wrlock(&sim.memlock);
    sim_alloc *a = find_alloc_start(addr);
    if (a && a->id == id)
        sim_mem_free_locked(a);
    pthread_rwlock_unlock(&sim.memlock);
}

uint64_t sim_mem_alloc_id(uint64_t addr) {
    pthread_rwlock_rdlock(&sim.memlock);
    sim_alloc *a = find_alloc_start(addr);
    uint64_t id = a ? a->id : 0;
    pthread_rwlock_unlock(&sim.memlock);
    return id;
}

void sim_mem_free_ctx(sim_ctx *ctx) {
    pthread_rwlock_wrlock(&sim.memlock);
    sim_pool *p = &sim.dev[ctx->dev].pool;
    for (size_t i = p->allocs.n; i-- > 0;) {
        sim_alloc *a = p->allocs.v[i].obj;
        if (a->ctx == ctx)
            sim_mem_free_locked(a);
    }
    pthread_rwlock_unlock(&sim.memlock);
}

SIM_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemAlloc_v2", SIM_NEED_CTX);
    if (r == CUDA_SUCCESS)
        r = sim_mem_alloc_impl(c.ctx, dptr, bytesize);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                    unsigned int ElementSizeBytes) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemAllocPitch_v2", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    size_t pitch = sim_align_up(WidthInBytes, 512);
    if (pitch < WidthInBytes || Height > SIZE_MAX / pitch)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    r = sim_mem_alloc_impl(c.ctx, dptr, pitch * Height);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemFree_v2", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    /* cuMemFree synchronizes, as on the driver: queued work may still use the memory */
    if (dptr == 0)
        return sim_leave(&c, CUDA_SUCCESS); /* as on the driver (measured) */
    r = sim_ctx_sync(c.ctx);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    pthread_rwlock_wrlock(&sim.memlock);
    sim_alloc *a = find_alloc_start(dptr);
    if (!a || a->free_pending)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        r = sim_mem_free_locked(a);
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemGetInfo_v2", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!free_ || !total)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_rwlock_rdlock(&sim.memlock);
    sim_device *d = &sim.dev[c.ctx->dev];
    *free_ = d->total - d->used;
    *total = d->total;
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, CUDA_SUCCESS);
}

SIM_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemGetAddressRange_v2", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    uint64_t base = 0, size = 0;
    pthread_rwlock_rdlock(&sim.memlock);
    sim_alloc *a = find_alloc_containing(dptr);
    if (a) {
        base = a->addr;
        size = a->size;
    } else {
        ssize_t i = rs_find(&sim.vmaps, dptr);
        if (i >= 0) {
            base = sim.vmaps.v[i].start;
            size = sim.vmaps.v[i].len;
        } else {
            r = CUDA_ERROR_NOT_FOUND;
        }
    }
    pthread_rwlock_unlock(&sim.memlock);
    if (r == CUDA_SUCCESS) {
        if (pbase)
            *pbase = base;
        if (psize)
            *psize = size;
    }
    return sim_leave(&c, r);
}

/* ---- stream-ordered allocation: the memory exists at once, the free happens in stream order ---- */

SIM_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemAllocAsync", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    sim_op *op = sim_op_new(0, NULL);
    if (!op)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    r = sim_submit(c.ctx, hStream, op); /* validates the stream */
    sim_op_put(op);
    if (r == CUDA_SUCCESS)
        r = sim_mem_alloc_impl(c.ctx, dptr, bytesize);
    if (r == CUDA_SUCCESS) {
        pthread_rwlock_wrlock(&sim.memlock);
        sim_alloc *a = find_alloc_start(*dptr);
        if (a)
            a->pooled = 1;
        pthread_rwlock_unlock(&sim.memlock);
    }
    return sim_leave(&c, r);
}

typedef struct {
    uint64_t addr;
} free_pay;

static CUresult run_free(sim_op *op) {
    free_pay *f = op->arg;
    pthread_rwlock_wrlock(&sim.memlock);
    sim_alloc *a = find_alloc_start(f->addr);
    if (a && a->free_pending)
        sim_mem_free_locked(a);
    pthread_rwlock_unlock(&sim.memlock);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemFreeAsync", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    sim_op *op = sim_op_new(sizeof(free_pay), run_free);
    if (!op)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    ((free_pay *)op->arg)->addr = dptr;
    pthread_rwlock_wrlock(&sim.memlock);
    sim_alloc *a = find_alloc_start(dptr);
    if (!a || a->free_pending) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        a->free_pending = 1;
    }
    pthread_rwlock_unlock(&sim.memlock);
    if (r == CUDA_SUCCESS) {
        r = sim_submit(c.ctx, hStream, op);
        if (r != CUDA_SUCCESS) {
            pthread_rwlock_wrlock(&sim.memlock);
            if ((a = find_alloc_start(dptr)))
                a->free_pending = 0;
            pthread_rwlock_unlock(&sim.memlock);
        }
    }
    sim_op_put(op);
    return sim_leave(&c, r);
}

/* ---- page-locked host memory: ordinary memory here, tracked so copies know it is pinned ---- */

static CUresult host_alloc(sim_call *c, void **pp, size_t size, unsigned flags) {
    const unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    if (!pp || (flags & ~known))
        return CUDA_ERROR_INVALID_VALUE;
    (void)c;
    if (size == 0) { /* the driver answers NULL and success (measured) */
        *pp = NULL;
        return CUDA_SUCCESS;
    }
    uint64_t len = sim_align_up(size, SIM_PAGE);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_rwlock_wrlock(&sim.memlock);
    int e = rs_insert(&sim.host, (sim_range){(uint64_t)(uintptr_t)p, len, NULL, SIM_R_HOST, HOST_ALLOCATED});
    pthread_rwlock_unlock(&sim.memlock);
    if (e < 0) {
        munmap(p, len);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemAllocHost_v2", SIM_NEED_CTX);
    if (r == CUDA_SUCCESS)
        r = host_alloc(&c, pp, bytesize, 0);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemHostAlloc", SIM_NEED_CTX);
    if (r == CUDA_SUCCESS)
        r = host_alloc(&c, pp, bytesize, Flags);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemFreeHost(void *p) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemFreeHost", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!p)
        return sim_leave(&c, CUDA_SUCCESS);
    r = sim_ctx_sync(c.ctx); /* async copies may still read or write it */
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    pthread_rwlock_wrlock(&sim.memlock);
    ssize_t i = rs_find_start(&sim.host, (uint64_t)(uintptr_t)p);
    if (i < 0 || sim.host.v[i].prot != HOST_ALLOCATED) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        uint64_t len = sim.host.v[i].len;
        rs_remove_at(&sim.host, (size_t)i);
        if (munmap(p, len) < 0)
            sim_warn("cuMemFreeHost: munmap: %s", strerror(errno));
    }
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemHostRegister_v2", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    /* PORTABLE, DEVICEMAP, IOMEMORY, READ_ONLY */
    if (!p || bytesize == 0 || (Flags & ~0xfu))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_rwlock_wrlock(&sim.memlock);
    uint64_t a = (uint64_t)(uintptr_t)p;
    if (rs_overlaps(&sim.host, a, bytesize))
        r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    else if (rs_insert(&sim.host, (sim_range){a, bytesize, NULL, SIM_R_HOST, HOST_REGISTERED}) < 0)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemHostUnregister(void *p) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemHostUnregister", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!p)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    r = sim_ctx_sync(c.ctx);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    pthread_rwlock_wrlock(&sim.memlock);
    ssize_t i = rs_find_start(&sim.host, (uint64_t)(uintptr_t)p);
    if (i < 0 || sim.host.v[i].prot != HOST_REGISTERED)
        r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    else
        rs_remove_at(&sim.host, (size_t)i);
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

void sim_mem_atfork_child(void) {
    for (int d = 0; d < sim.ndev; d++) {
        sim_pool *p = &sim.dev[d].pool;
        if (p->fd < 0)
            continue;
        (void)sim_map_reserve_fixed(p->base, p->size);
        close(p->fd);
        p->fd = -1;
    }
}

/* ---- checkpoint: device memory into ordinary process memory and back ---- */

int sim_mem_park_all(void) {
    for (int d = 0; d < sim.ndev; d++) {
        sim_pool *p = &sim.dev[d].pool;
        if (p->fd < 0)
            continue;
        int e = sim_park_fd(p->fd, p->size, &p->parked);
        if (e) {
            sim_warn("checkpoint: copying device %d memory out: %s", d, strerror(-e));
            return e;
        }
        e = sim_map_reserve_fixed(p->base, p->size);
        if (e) {
            sim_warn("checkpoint: replacing device %d mapping: %s", d, strerror(-e));
            sim_parked_free(&p->parked);
            return e;
        }
        close(p->fd);
        p->fd = -1;
    }
    return 0;
}

int sim_mem_unpark_all(void) {
    for (int d = 0; d < sim.ndev; d++) {
        sim_pool *p = &sim.dev[d].pool;
        if (p->fd >= 0)
            continue;
        char name[32];
        pool_name(d, name, sizeof name);
        int fd;
        int e = sim_unpark_fd(&p->parked, p->size, name, &fd);
        if (e) {
            sim_warn("restore: recreating device %d memory: %s", d, strerror(-e));
            return e;
        }
        void *m = mmap((void *)(uintptr_t)p->base, p->size, PROT_NONE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0);
        if (m == MAP_FAILED) {
            e = -errno;
            sim_warn("restore: mapping device %d memory: %s", d, strerror(-e));
            close(fd);
            return e;
        }
        for (size_t i = 0; i < p->allocs.n; i++) {
            sim_alloc *a = p->allocs.v[i].obj;
            if (mprotect((void *)(uintptr_t)a->addr, a->mapped, PROT_READ | PROT_WRITE) < 0) {
                e = -errno;
                sim_warn("restore: mprotect: %s", strerror(-e));
                close(fd);
                return e;
            }
        }
        p->fd = fd;
        sim_parked_free(&p->parked);
    }
    return 0;
}

/* ---- pointer attributes ---- */

/* What the driver knows of p (memlock held); cur: the caller's context (its device's access), or NULL. */
static void ptr_info(uint64_t p, const sim_ctx *cur, sim_ptrinfo *o) {
    memset(o, 0, sizeof *o);
    o->dev = -1;
    sim_alloc *a = find_alloc_containing(p);
    if (a) {
        o->type = CU_MEMORYTYPE_DEVICE;
        /* a memory pool's memory (stream-ordered allocation) belongs to the pool, not to a context */
        o->ctx = a->pooled ? NULL : a->ctx;
        o->dev = a->dev;
        o->base = o->map_base = a->addr;
        o->size = o->map_size = a->size;
        o->buffer_id = a->id;
        o->legacy_ipc = !a->pooled; /* cuMemAlloc memory can take cuIpcGetMemHandle */
        o->access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        return;
    }
    if (sim_vmm_ptr_info(p, cur ? cur->dev : 0, o))
        return;
    ssize_t i = rs_find(&sim.host, p);
    if (i >= 0) {
        /* page-locked host memory: the same address on both sides (unified addressing) */
        o->type = CU_MEMORYTYPE_HOST;
        o->ctx = cur ? (sim_ctx *)cur : NULL;
        o->dev = cur ? cur->dev : 0;
        o->base = o->map_base = sim.host.v[i].start;
        o->size = o->map_size = sim.host.v[i].len;
        o->access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
}

/*
 * One attribute of o into data. unknown: the address is not the driver's, which makes cuPointerGetAttribute
 * fail and cuPointerGetAttributes write zeros, and -2 for the device (measured on the driver).
 */
static CUresult put_attr(void *data, CUpointer_attribute a, const sim_ptrinfo *o, CUdeviceptr ptr, bool single) {
    bool known = o->type != 0;
    if (single && !known)
        return CUDA_ERROR_INVALID_VALUE;
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = (CUcontext)o->ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = o->type; break;
    /* unified addressing: page-locked host memory has the same address on the device */
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = known ? ptr : 0; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        /* device memory has no host address: only host memory answers */
        if (single && o->type != CU_MEMORYTYPE_HOST)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = o->type == CU_MEMORYTYPE_HOST ? (void *)(uintptr_t)ptr : NULL;
        break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = o->buffer_id; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = 0; break; /* no managed memory in the simulator */
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = known ? o->dev : -2; break; /* measured */
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = o->legacy_ipc; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = o->base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = o->size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = known; break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data = o->htypes; break;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: *(int *)data = o->rdma; break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: *(unsigned *)data = o->access; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(CUmemoryPool *)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t *)data = o->map_size; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(void **)data = (void *)(uintptr_t)o->map_base; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(unsigned long long *)data = o->buffer_id; break;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
        /* tokens for GPUDirect RDMA between peers, which the simulator has not */
        return CUDA_ERROR_NOT_SUPPORTED;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult pointer_attrs(const char *name, unsigned n, const CUpointer_attribute *attrs, void **data,
                              CUdeviceptr ptr, bool single) {
    sim_call c;
    CUresult r = sim_enter(&c, name, SIM_NEED_INIT);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (n == 0 || !attrs || !data)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    for (unsigned i = 0; i < n; i++)
        if (!data[i])
            return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_ptrinfo o;
    pthread_rwlock_rdlock(&sim.memlock);
    ptr_info(ptr, c.ctx, &o);
    pthread_rwlock_unlock(&sim.memlock);
    for (unsigned i = 0; i < n && r == CUDA_SUCCESS; i++)
        r = put_attr(data[i], attrs[i], &o, ptr, single);
    return sim_leave(&c, r);
}

SIM_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    void *d[1] = {data};
    return pointer_attrs("cuPointerGetAttribute", 1, &attribute, d, ptr, true);
}

SIM_API CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                        CUdeviceptr ptr) {
    return pointer_attrs("cuPointerGetAttributes", numAttributes, attributes, data, ptr, false);
}

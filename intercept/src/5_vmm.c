/*
 * The application's own VMM calls, served from the helper.
 *
 * cuMemCreate of pinned device memory (requested handle types none or POSIX
 * fd, no allocation flags but GPUDirect RDMA capability, size a multiple of
 * the granularity) becomes
 * Alloc{kind VMM} at the helper; the fd is imported here, and the application
 * gets a VIRTUAL handle that names a record {alloc_id, real (imported) handle,
 * sizes, device, prop, reference count, mappings, access}. Every entry point
 * taking or returning a generic allocation handle translates it, so that
 * Drop / Reimport can swap the real handle underneath while every handle value
 * and every address the application holds stays valid. Anything else (other
 * props, no helper, helper refused) is passed through and stays a
 * not-checkpointable reason, as before.
 *
 * Choices, where they refine the design brief:
 * - Virtual handles are 0xC0DA in the top 16 bits | a counter. The driver's
 *   handles are pointers (the simulator's, and the driver's as observed), whose
 *   top 16 bits are 0 on x86-64/aarch64 user space; a pass-through handle with
 *   the tag is warned about (it could not be told apart). A tagged value that
 *   is not a live record is refused with CUDA_ERROR_INVALID_VALUE instead of
 *   reaching the driver (which may crash on garbage handles).
 * - Reference count: 1 at create, +1 per cuMemRetainAllocationHandle, -1 per
 *   cuMemRelease. When it reaches 0 our import reference is released (once);
 *   the mappings keep the memory alive, as the driver's do. The helper is told
 *   Free when the count is 0 and no mapping remains; the handle is then dead.
 * - Mapped{alloc_id, ptr} is sent for the first offset-0 mapping (the driver
 *   only maps whole allocations at offset 0), and again if that mapping is
 *   gone and another offset-0 mapping appears. The helper re-sends only
 *   allocations it has an address for, so Drop drops only those: one created
 *   but never mapped keeps its import across the cycle (it is not mapped, so
 *   nothing of it is visible to the device anyway).
 * - Access: per mapping, the part of each cuMemSetAccess range inside it with
 *   its descriptors (merged per location for the same range), re-applied in
 *   order after re-import. Unmapping part of a mapping keeps the rest (and the
 *   rest of its access).
 * - Pinned host memory (location HOST_NUMA: NCCL's host buffers) is served
 *   the same way: the helper creates it on the host node of the device whose
 *   context is current, and copies it through that device.
 * - Exported handles (cuMemExportToShareableHandle): the application gets an
 *   fd of the helper's physical memory, the same pages it sees, which the
 *   helper exports (Export): the driver refuses to export an allocation the
 *   process imported (measured: CUDA_ERROR_INVALID_VALUE), and NCCL exports
 *   its buffers for its peer ranks. The fd stays valid across Drop/Reimport
 *   (the helper holds the memory throughout).
 * - Imports (cuMemImportFromShareableHandle of a POSIX fd): the helper is
 *   shown the fd (ImportPeer); one it exported (a peer rank's memory) becomes
 *   a record like our own allocations, marked peer, with the driver's import
 *   of the application's fd as its real handle: dropped and reimported with
 *   ours, restored at the same address, its data in its owner's image. An fd
 *   the helper does not know stays the driver's, and the process is then not
 *   checkpointable ("imported foreign memory").
 * - cuMemMapArrayAsync (sparse arrays) is not wrapped: cudadrv.h has no
 *   CUarrayMapInfo; an application mapping helper-backed memory into a sparse
 *   array would hand the driver a virtual handle. No test application does.
 *
 * Bookkeeping is under the bookkeeping lock (gc_alloc_lock), as is the buffer
 * table; the driver calls of these entry points run under it too (VMM calls
 * are not a hot path), helper requests never do. The wrappers
 * (8_interpose.c) pass the gate and connect to the helper; they call the
 * functions here with the driver's entry point.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "1_base.h"
#include "2_link.h"
#include "3_devices.h"
#include "4_alloc.h"
#include "5_vmm.h"

#define VH_TAG 0xC0DA000000000000ULL
#define VH_MASK 0xFFFF000000000000ULL

typedef struct vacc {
    uint64_t ptr, size; /* inside its mapping */
    size_t n;
    CUmemAccessDesc *d;
} vacc;

typedef struct vrec vrec;

typedef struct vmap {
    uint64_t ptr, size, off;
    vrec *r;
    vacc *acc;
    size_t nacc;
    struct vmap *next;
} vmap;

struct vrec {
    CUmemGenericAllocationHandle vh, real;
    uint64_t id, size, hsize; /* size: the application's; hsize: the helper's */
    uint64_t announced;       /* the address the helper has (Mapped); 0: none */
    int dev, refs, nmaps;
    bool real_released; /* our import reference released (the application released its last) */
    bool imported;      /* false between Drop and Reimport */
    bool peer;          /* another client's memory this process imports (ImportPeer); its bytes are not ours */
    bool exported;      /* exported to a shareable handle (a peer may map it) */
    CUmemAllocationProp prop;
    vrec *next;
};

static struct {
    vrec *recs;
    vmap *maps;
    uint64_t counter;
} V;

static bool is_virtual(CUmemGenericAllocationHandle h) { return (h & VH_MASK) == VH_TAG; }

static vrec *find_vh(CUmemGenericAllocationHandle h) {
    if (!is_virtual(h))
        return NULL;
    for (vrec *r = V.recs; r; r = r->next)
        if (r->vh == h)
            return r;
    return NULL;
}

static vmap *map_at(uint64_t addr) {
    for (vmap *m = V.maps; m; m = m->next)
        if (addr >= m->ptr && addr - m->ptr < m->size)
            return m;
    return NULL;
}

static void map_free(vmap *m) {
    for (size_t i = 0; i < m->nacc; i++)
        free(m->acc[i].d);
    free(m->acc);
    free(m);
}

/* Forgets a record with no reference and no mapping; returns its alloc_id for Free. */
static uint64_t rec_forget(vrec *v) {
    for (vrec **pp = &V.recs; *pp; pp = &(*pp)->next)
        if (*pp == v) {
            *pp = v->next;
            break;
        }
    uint64_t id = v->id;
    if (!v->peer)
        gc_helper_bytes_add(-(int64_t)v->hsize);
    free(v);
    return id;
}

static void buf_add(const vmap *m) {
    gc_buf b = {.addr = m->ptr, .size = m->size, .alloc_id = m->r->id, .kind = GC_KIND_VMM, .dev = m->r->dev};
    int rc = gc_buf_insert(&b);
    if (rc != 0)
        gc_warn("buffer table: cannot add the mapping at 0x%llx (%s)", (unsigned long long)m->ptr,
                rc == -1 ? "out of memory" : "overlaps");
}

static bool announced_alive(const vrec *v) {
    if (!v->announced)
        return false;
    for (const vmap *m = V.maps; m; m = m->next)
        if (m->r == v && m->off == 0 && m->ptr == v->announced)
            return true;
    return false;
}

/* [a, b) of m as a new mapping record, its access clipped; NULL when out of memory. */
static vmap *piece(const vmap *m, uint64_t a, uint64_t b) {
    vmap *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->ptr = a;
    p->size = b - a;
    p->off = m->off + (a - m->ptr);
    p->r = m->r;
    p->acc = m->nacc ? calloc(m->nacc, sizeof *p->acc) : NULL;
    if (m->nacc && !p->acc) {
        free(p);
        return NULL;
    }
    for (size_t i = 0; i < m->nacc; i++) {
        const vacc *x = &m->acc[i];
        uint64_t lo = x->ptr > a ? x->ptr : a, hi = x->ptr + x->size < b ? x->ptr + x->size : b;
        if (lo >= hi)
            continue;
        vacc *y = &p->acc[p->nacc];
        y->d = malloc(x->n * sizeof *y->d);
        if (!y->d) {
            map_free(p);
            return NULL;
        }
        memcpy(y->d, x->d, x->n * sizeof *y->d);
        y->n = x->n;
        y->ptr = lo;
        y->size = hi - lo;
        p->nacc++;
    }
    return p;
}

/* The driver unmapped [lo, hi): forget those parts. Records left with nothing go, their ids to *ids (malloc'ed). */
static void cut_range(uint64_t lo, uint64_t hi, uint64_t **ids, size_t *nids) {
    for (vmap **pp = &V.maps; *pp;) {
        vmap *m = *pp;
        uint64_t end = m->ptr + m->size;
        if (m->ptr >= hi || end <= lo) {
            pp = &m->next;
            continue;
        }
        vrec *v = m->r;
        gc_buf_remove(m->ptr);
        *pp = m->next;
        v->nmaps--;
        vmap *parts[2] = {m->ptr < lo ? piece(m, m->ptr, lo) : NULL, hi < end ? piece(m, hi, end) : NULL};
        if ((m->ptr < lo && !parts[0]) || (hi < end && !parts[1]))
            gc_warn("out of memory: lost track of part of the mapping at 0x%llx", (unsigned long long)m->ptr);
        map_free(m);
        for (int k = 0; k < 2; k++) {
            if (!parts[k])
                continue;
            parts[k]->next = *pp;
            *pp = parts[k];
            pp = &parts[k]->next;
            v->nmaps++;
            buf_add(parts[k]);
        }
        if (v->nmaps == 0 && v->refs == 0) {
            uint64_t *n = realloc(*ids, (*nids + 1) * sizeof *n);
            uint64_t id = rec_forget(v);
            if (!n) {
                gc_warn("out of memory: the helper keeps allocation %llu until this process exits",
                        (unsigned long long)id);
                continue;
            }
            *ids = n;
            n[(*nids)++] = id;
        }
    }
}

/* Records a successful cuMemSetAccess over [lo, hi) of m. */
static void note_access(vmap *m, uint64_t lo, uint64_t hi, const CUmemAccessDesc *desc, size_t count) {
    vacc *x = NULL;
    for (size_t i = 0; i < m->nacc; i++)
        if (m->acc[i].ptr == lo && m->acc[i].size == hi - lo)
            x = &m->acc[i];
    if (!x) {
        vacc *na = realloc(m->acc, (m->nacc + 1) * sizeof *na);
        if (!na)
            goto oom;
        m->acc = na;
        x = &m->acc[m->nacc];
        *x = (vacc){.ptr = lo, .size = hi - lo};
        m->nacc++;
    }
    for (size_t k = 0; k < count; k++) {
        size_t j = 0;
        while (j < x->n &&
               (x->d[j].location.type != desc[k].location.type || x->d[j].location.id != desc[k].location.id))
            j++;
        if (j == x->n) {
            CUmemAccessDesc *nd = realloc(x->d, (x->n + 1) * sizeof *nd);
            if (!nd)
                goto oom;
            x->d = nd;
            x->n++;
        }
        x->d[j] = desc[k];
    }
    return;
oom:
    gc_warn("out of memory recording the access of 0x%llx: it may not be restored after a checkpoint",
            (unsigned long long)lo);
}

/* ---- the application's calls ---- */

const char *gc_vmm_unservable(size_t size, const CUmemAllocationProp *p, unsigned long long flags) {
    if (!p)
        return "no allocation properties";
    if (flags != 0)
        return "flags other than 0";
    if (size == 0)
        return "size 0";
    if (p->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return "allocation type other than pinned";
    if (p->location.type != CU_MEM_LOCATION_TYPE_DEVICE && p->location.type != CU_MEM_LOCATION_TYPE_HOST_NUMA)
        return "location other than a device or a host NUMA node";
    if (p->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return "requested handle types other than POSIX fd";
    if (p->allocFlags.compressionType)
        return "compressible memory";
    if (p->allocFlags.usage)
        return "allocation usage flags";
    return NULL;
}

/* Says once why an application's cuMemCreate went to the driver: the process
 * is then not checkpointable, and this is what to change. */
static void warn_unserved(size_t size, const CUmemAllocationProp *p, unsigned long long flags, const char *why) {
    static atomic_bool warned;
    if (atomic_exchange(&warned, true))
        return;
    gc_warn(
        "cuMemCreate of %zu bytes (type %d, location %d/%d, handle types 0x%x, compression %u, gpuDirectRDMA %u, "
        "usage 0x%x, flags 0x%llx) is not served by the helper: %s; this process is not checkpointable",
        size, p ? (int)p->type : -1, p ? (int)p->location.type : -1, p ? p->location.id : -1,
        p ? (unsigned)p->requestedHandleTypes : 0u, p ? p->allocFlags.compressionType : 0u,
        p ? p->allocFlags.gpuDirectRDMACapable : 0u, p ? p->allocFlags.usage : 0u, flags, why);
}

CUresult gc_vmm_create(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop) {
    bool host = prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
    int dev = prop->location.id;
    if (host) {
        /* host memory: the helper reaches it through the device whose context is current */
        CUdevice cur = 0;
        __typeof__(&cuCtxGetDevice) cfn = GC_REAL(cuCtxGetDevice);
        if (!cfn || cfn(&cur) != CUDA_SUCCESS)
            return GC_FALLBACK;
        dev = (int)cur;
    }
    const char *uuid = gc_dev_uuid(dev);
    if (!uuid)
        return GC_FALLBACK;
    size_t gran = 0;
    __typeof__(&cuMemGetAllocationGranularity) gfn = GC_REAL(cuMemGetAllocationGranularity);
    CUresult r = gfn ? gfn(&gran, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) : CUDA_ERROR_NOT_SUPPORTED;
    if (r != CUDA_SUCCESS || gran == 0 || size % gran)
        return GC_FALLBACK; /* the driver gives the application its own answer */
    gc_note_context();
    uint64_t id = 0, hsize = 0;
    int fd = -1;
    /* GPUDirect RDMA capable (PyTorch's expandable segments ask for it where
     * the device supports it): the helper creates it so, and a restore too */
    unsigned flags = host ? GC_ALLOC_HOST_NUMA : prop->allocFlags.gpuDirectRDMACapable ? GC_ALLOC_GPU_DIRECT_RDMA : 0;
    r = gc_link_alloc(uuid, size, GC_KIND_VMM, flags, 0, &id, &hsize, &fd);
    if (r != CUDA_SUCCESS)
        return r;
    vrec *v = NULL;
    CUmemGenericAllocationHandle real = 0;
    if (hsize != size) {
        /* the helper's granularity is coarser: only whole allocations map */
        gc_warn("helper allocation of %zu bytes came as %llu: using the driver's cuMemCreate; not checkpointable", size,
                (unsigned long long)hsize);
        r = GC_FALLBACK;
    } else if (!(v = calloc(1, sizeof *v))) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        r = GC_REAL(cuMemImportFromShareableHandle)(&real, (void *)(intptr_t)fd,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r != CUDA_SUCCESS) {
            gc_warn("cuMemImportFromShareableHandle: error %d: using the driver's cuMemCreate; not checkpointable",
                    (int)r);
            r = GC_FALLBACK;
        }
    }
    if (close(fd) != 0)
        gc_debug("close of the allocation fd failed");
    if (r != CUDA_SUCCESS) {
        free(v);
        gc_link_free(id);
        /* cppcheck 2.10 takes this CUresult for a pointer to the local
         * `real` (the handle is copied into the record below instead). */
        // cppcheck-suppress returnDanglingLifetime
        return r;
    }
    v->real = real;
    v->id = id;
    v->size = size;
    v->hsize = hsize;
    v->dev = dev;
    v->prop = *prop;
    v->refs = 1;
    v->imported = true;
    gc_alloc_lock();
    v->vh = VH_TAG | (++V.counter & ~VH_MASK);
    v->next = V.recs;
    V.recs = v;
    gc_helper_bytes_add((int64_t)hsize);
    gc_alloc_unlock();
    gc_stat_add(STAT_ALLOCS, 1);
    gc_debug("cuMemCreate: helper allocation %llu, %zu bytes, handle 0x%llx", (unsigned long long)id, size,
             (unsigned long long)v->vh);
    *handle = v->vh;
    return CUDA_SUCCESS;
}

void gc_vmm_created_by_driver(CUmemGenericAllocationHandle handle, size_t size, const CUmemAllocationProp *prop,
                              unsigned long long flags, const char *why) {
    if (why)
        warn_unserved(size, prop, flags, why);
    gc_note_reason(GC_REASON_APP_VMM);
    if (is_virtual(handle))
        gc_warn("the driver's allocation handle 0x%llx looks like one of gpucr's", (unsigned long long)handle);
}

CUresult gc_vmm_release(__typeof__(&cuMemRelease) fn, CUmemGenericAllocationHandle handle) {
    CUresult r = CUDA_SUCCESS;
    uint64_t free_id = 0;
    gc_alloc_lock();
    vrec *v = find_vh(handle);
    if (!v) {
        gc_alloc_unlock();
        r = is_virtual(handle) ? CUDA_ERROR_INVALID_VALUE : fn(handle);
    } else {
        if (v->refs == 0) {
            r = CUDA_ERROR_INVALID_VALUE; /* released already, alive only through its mappings */
        } else if (v->refs == 1 && !v->real_released) {
            r = fn(v->real);
            if (r == CUDA_SUCCESS)
                v->real_released = true;
        }
        if (r == CUDA_SUCCESS && --v->refs == 0 && v->nmaps == 0)
            free_id = rec_forget(v);
        gc_alloc_unlock();
    }
    if (free_id) {
        gc_link_free(free_id);
        gc_stat_add(STAT_FREES, 1);
    }
    return r;
}

CUresult gc_vmm_map(__typeof__(&cuMemMap) fn, CUdeviceptr ptr, size_t size, size_t offset,
                    CUmemGenericAllocationHandle handle, unsigned long long flags) {
    CUresult r;
    uint64_t announce = 0;
    gc_alloc_lock();
    vrec *v = find_vh(handle);
    if (!v) {
        gc_alloc_unlock();
        r = is_virtual(handle) ? CUDA_ERROR_INVALID_VALUE : fn(ptr, size, offset, handle, flags);
    } else {
        vmap *m = calloc(1, sizeof *m);
        /* a released handle still maps while a mapping keeps its memory: the driver decides */
        r = m ? fn(ptr, size, offset, v->real, flags) : CUDA_ERROR_OUT_OF_MEMORY;
        if (r == CUDA_SUCCESS) {
            m->ptr = ptr;
            m->size = size;
            m->off = offset;
            m->r = v;
            m->next = V.maps;
            V.maps = m;
            v->nmaps++;
            buf_add(m);
            if (offset == 0 && !announced_alive(v)) {
                v->announced = ptr;
                announce = v->id;
            }
        } else {
            free(m);
        }
        gc_alloc_unlock();
    }
    if (announce)
        gc_link_mapped(announce, ptr);
    return r;
}

CUresult gc_vmm_unmap(__typeof__(&cuMemUnmap) fn, CUdeviceptr ptr, size_t size) {
    uint64_t *ids = NULL;
    size_t nids = 0;
    gc_alloc_lock();
    CUresult r = fn(ptr, size);
    if (r == CUDA_SUCCESS && size && ptr + size > ptr)
        cut_range(ptr, ptr + size, &ids, &nids);
    gc_alloc_unlock();
    for (size_t i = 0; i < nids; i++)
        gc_link_free(ids[i]);
    free(ids);
    if (nids)
        gc_stat_add(STAT_FREES, nids);
    return r;
}

CUresult gc_vmm_set_access(__typeof__(&cuMemSetAccess) fn, CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                           size_t count) {
    gc_alloc_lock();
    CUresult r = fn(ptr, size, desc, count);
    if (r == CUDA_SUCCESS && desc && count) {
        uint64_t end = ptr + size;
        for (vmap *m = V.maps; m; m = m->next) {
            uint64_t mend = m->ptr + m->size;
            if (m->ptr >= end || mend <= ptr)
                continue;
            note_access(m, m->ptr > ptr ? m->ptr : ptr, mend < end ? mend : end, desc, count);
        }
    }
    gc_alloc_unlock();
    return r;
}

CUresult gc_vmm_retain(__typeof__(&cuMemRetainAllocationHandle) fn, CUmemGenericAllocationHandle *handle, void *addr) {
    CUresult r;
    gc_alloc_lock();
    vmap *m = handle ? map_at((uint64_t)(uintptr_t)addr) : NULL;
    if (m) {
        m->r->refs++; /* one more cuMemRelease to come; our import reference is not retained again */
        *handle = m->r->vh;
        gc_alloc_unlock();
        r = CUDA_SUCCESS;
    } else {
        gc_alloc_unlock();
        r = fn ? fn(handle, addr) : CUDA_ERROR_NOT_SUPPORTED;
    }
    return r;
}

CUresult gc_vmm_get_props(__typeof__(&cuMemGetAllocationPropertiesFromHandle) fn, CUmemAllocationProp *prop,
                          CUmemGenericAllocationHandle handle) {
    CUresult r;
    gc_alloc_lock();
    vrec *v = find_vh(handle);
    if (v) {
        if (prop)
            *prop = v->prop; /* what the application asked for, not what the import says */
        gc_alloc_unlock();
        r = prop ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    } else {
        gc_alloc_unlock();
        r = is_virtual(handle) ? CUDA_ERROR_INVALID_VALUE : fn ? fn(prop, handle) : CUDA_ERROR_NOT_SUPPORTED;
    }
    return r;
}

CUresult gc_vmm_export(__typeof__(&cuMemExportToShareableHandle) fn, void *shareableHandle,
                       CUmemGenericAllocationHandle handle, CUmemAllocationHandleType handleType,
                       unsigned long long flags) {
    gc_alloc_lock();
    vrec *v = find_vh(handle);
    if (!v) {
        gc_alloc_unlock();
        return is_virtual(handle) ? CUDA_ERROR_INVALID_VALUE : fn(shareableHandle, handle, handleType, flags);
    }
    /* only the types requested at creation export, as with the driver; the helper serves POSIX fds only; an
     * import is not exported again (the driver's answer: INVALID_VALUE) */
    bool ok = !v->peer && shareableHandle && flags == 0 && handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
              (v->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    uint64_t id = v->id;
    gc_alloc_unlock();
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    /* What we hold is an import, which the driver does not export again: the helper, which created the
     * memory, exports it (the same pages the application maps). */
    int fd = -1;
    CUresult r = gc_link_export(id, &fd);
    if (r != CUDA_SUCCESS)
        return r;
    gc_alloc_lock();
    if ((v = find_vh(handle)) != NULL)
        v->exported = true;
    gc_alloc_unlock();
    atomic_store(&gc_sharing, true);
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

/*
 * An import: the driver imports the application's fd; if the helper knows the fd (another client's memory it
 * exported), the import becomes a peer record with a virtual handle. Else it is foreign memory: the driver's
 * handle, not checkpointable.
 */
CUresult gc_vmm_import(__typeof__(&cuMemImportFromShareableHandle) fn, CUmemGenericAllocationHandle *handle,
                       void *osHandle, CUmemAllocationHandleType shHandleType) {
    CUresult r = fn(handle, osHandle, shHandleType);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t id = 0, size = 0;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    __typeof__(&cuMemGetAllocationPropertiesFromHandle) pfn = GC_REAL(cuMemGetAllocationPropertiesFromHandle);
    vrec *v = NULL;
    if (shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
        gc_link_import_peer((int)(intptr_t)osHandle, &id, &size) == 0) {
        if (!pfn || pfn(&prop, *handle) != CUDA_SUCCESS)
            gc_warn("peer import %llu: no properties from the driver", (unsigned long long)id);
        else if (!(v = calloc(1, sizeof *v)))
            gc_warn("peer import %llu: out of memory", (unsigned long long)id);
        if (!v)
            gc_link_free(id);
    }
    if (!v) {
        gc_note_reason(GC_REASON_FOREIGN);
        if (is_virtual(*handle))
            gc_warn("the driver's allocation handle 0x%llx looks like one of gpucr's", (unsigned long long)*handle);
        return CUDA_SUCCESS;
    }
    v->real = *handle;
    v->id = id;
    v->size = size;
    v->hsize = size;
    v->dev = prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop.location.id : -1;
    v->prop = prop;
    v->refs = 1;
    v->imported = true;
    v->peer = true;
    gc_alloc_lock();
    v->vh = VH_TAG | (++V.counter & ~VH_MASK);
    v->next = V.recs;
    V.recs = v;
    gc_alloc_unlock();
    atomic_store(&gc_sharing, true);
    gc_debug("peer import: helper allocation %llu, %llu bytes, handle 0x%llx", (unsigned long long)id,
             (unsigned long long)size, (unsigned long long)v->vh);
    *handle = v->vh;
    return CUDA_SUCCESS;
}

/* ---- the control thread's part (the bookkeeping lock held) ---- */

void gc_vmm_drop(CUresult *bad) {
    for (vrec *v = V.recs; v; v = v->next) {
        if (!v->imported || !v->announced)
            continue; /* never mapped: the helper would not send it back; it keeps its import */
        for (vmap *m = V.maps; m; m = m->next) {
            if (m->r != v)
                continue;
            CUresult r = GC_REAL(cuMemUnmap)(m->ptr, m->size);
            if (r != CUDA_SUCCESS && *bad == CUDA_SUCCESS)
                *bad = r;
        }
        if (!v->real_released) {
            CUresult r = GC_REAL(cuMemRelease)(v->real);
            if (r != CUDA_SUCCESS && *bad == CUDA_SUCCESS)
                *bad = r;
        }
        v->imported = false;
    }
}

/* Undoes the first n mappings of v at h (a failed re-import). */
static void unmap_first(const vrec *v, size_t n) {
    for (vmap *m = V.maps; m && n; m = m->next) {
        if (m->r != v)
            continue;
        CUresult r = GC_REAL(cuMemUnmap)(m->ptr, m->size);
        if (r != CUDA_SUCCESS)
            gc_warn("Reimport: undoing the mapping at 0x%llx: error %d", (unsigned long long)m->ptr, (int)r);
        n--;
    }
}

/*
 * The record the helper knows at addr (its announced offset-0 mapping). A record whose announced
 * mapping is gone may still carry the address another record has announced since: the one still
 * waiting for its memory wins, then the one whose mapping is alive.
 */
static vrec *find_announced(uint64_t addr) {
    vrec *best = NULL;
    int bestscore = -1;
    if (!addr)
        return NULL;
    for (vrec *r = V.recs; r; r = r->next) {
        if (r->announced != addr)
            continue;
        int score = (!r->imported ? 2 : 0) + (announced_alive(r) ? 1 : 0);
        if (score > bestscore) {
            best = r;
            bestscore = score;
        }
    }
    return best;
}

int gc_vmm_reimport(uint64_t id, uint64_t addr, uint64_t size, int fd, char *msg, size_t msglen) {
    vrec *v = find_announced(addr);
    if (!v)
        return 0;
    if (v->hsize != size) {
        snprintf(msg, msglen, "Reimport: VMM allocation at 0x%llx has %llu bytes here, the entry %llu",
                 (unsigned long long)addr, (unsigned long long)v->hsize, (unsigned long long)size);
        return -1;
    }
    v->id = id; /* after a restore the helper is another process, or has new ids */
    if (v->imported)
        return 1;
    CUmemGenericAllocationHandle h = 0;
    CUresult r =
        GC_REAL(cuMemImportFromShareableHandle)(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
        snprintf(msg, msglen, "Reimport %llu: cuMemImportFromShareableHandle: CUresult %d", (unsigned long long)id,
                 (int)r);
        return -2;
    }
    size_t done = 0;
    for (vmap *m = V.maps; m && r == CUDA_SUCCESS; m = m->next) {
        if (m->r != v)
            continue;
        r = GC_REAL(cuMemMap)(m->ptr, m->size, m->off, h, 0);
        if (r != CUDA_SUCCESS) {
            snprintf(msg, msglen, "Reimport %llu: cuMemMap(0x%llx): CUresult %d", (unsigned long long)id,
                     (unsigned long long)m->ptr, (int)r);
            break;
        }
        done++;
        for (size_t i = 0; i < m->nacc && r == CUDA_SUCCESS; i++) {
            r = GC_REAL(cuMemSetAccess)(m->acc[i].ptr, m->acc[i].size, m->acc[i].d, m->acc[i].n);
            if (r != CUDA_SUCCESS)
                snprintf(msg, msglen, "Reimport %llu: cuMemSetAccess(0x%llx): CUresult %d", (unsigned long long)id,
                         (unsigned long long)m->acc[i].ptr, (int)r);
        }
    }
    if (r != CUDA_SUCCESS) {
        unmap_first(v, done);
        CUresult rr = GC_REAL(cuMemRelease)(h);
        if (rr != CUDA_SUCCESS)
            gc_warn("Reimport %llu: releasing the import: error %d", (unsigned long long)id, (int)rr);
        return -2;
    }
    if (v->real_released) {
        /* the application had released its handle: again only the mappings hold the memory */
        r = GC_REAL(cuMemRelease)(h);
        if (r != CUDA_SUCCESS)
            gc_warn("Reimport %llu: cuMemRelease: error %d", (unsigned long long)id, (int)r);
    }
    v->real = h;
    v->imported = true;
    return 1;
}

uint64_t gc_vmm_id_at(uint64_t addr) {
    vmap *m = map_at(addr);
    return m ? m->r->id : 0;
}

bool gc_vmm_shared(uint64_t addr) {
    gc_alloc_lock();
    vmap *m = map_at(addr);
    bool shared = m && (m->r->peer || m->r->exported);
    gc_alloc_unlock();
    return shared;
}

bool gc_vmm_all_imported(void) {
    for (vrec *v = V.recs; v; v = v->next)
        if (!v->imported)
            return false;
    return true;
}

size_t gc_vmm_list(gc_alloc_info *out, size_t max) {
    size_t n = 0;
    for (vrec *v = V.recs; v; v = v->next) {
        if (v->peer)
            continue; /* a peer's memory: its owner lists it */
        if (out && n < max)
            out[n] = (gc_alloc_info){
                .id = v->id, .addr = v->announced, .size = v->hsize, .dev = v->dev, .kind = GC_KIND_VMM};
        n++;
    }
    return out && n > max ? max : n;
}

/* ---- moving into a new helper's memory (the gate closed, the lock not held) ---- */

/* Copies v's bytes into m: through each of its mappings, or, mapped nowhere, through a range of its own. */
static int vmm_copy(const vrec *v, const gc_move *m, char *why, size_t whylen) {
    bool any = false;
    for (vmap *mp = V.maps; mp; mp = mp->next) {
        if (mp->r != v)
            continue;
        any = true;
        if (gc_move_copy(m, mp->ptr, mp->size, mp->off, why, whylen) != 0)
            return -1;
    }
    if (any)
        return gc_move_sync(m, why, whylen);
    if (v->real_released)
        return 0; /* neither mapped nor held: no byte of it can be read any more */
    CUdeviceptr tmp = 0;
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, m->dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUresult r = GC_REAL(cuMemAddressReserve)(&tmp, v->hsize, 0, 0, 0);
    if (r == CUDA_SUCCESS && (r = GC_REAL(cuMemMap)(tmp, v->hsize, 0, v->real, 0)) == CUDA_SUCCESS) {
        r = GC_REAL(cuMemSetAccess)(tmp, v->hsize, &d, 1);
        int rc = r == CUDA_SUCCESS ? gc_move_copy(m, tmp, v->hsize, 0, why, whylen) : -1;
        if (rc == 0)
            rc = gc_move_sync(m, why, whylen);
        GC_REAL(cuMemUnmap)(tmp, v->hsize);
        GC_REAL(cuMemAddressFree)(tmp, v->hsize);
        if (r == CUDA_SUCCESS)
            return rc;
    } else if (tmp) {
        GC_REAL(cuMemAddressFree)(tmp, v->hsize);
    }
    snprintf(why, whylen, "mapping VMM allocation %llu for its copy: CUresult %d", (unsigned long long)v->id, (int)r);
    return -1;
}

/* Maps each of v's mappings onto h with its access; the first error, the mappings done in *done. */
static CUresult vmm_map_all(const vrec *v, CUmemGenericAllocationHandle h, size_t *done) {
    CUresult r = CUDA_SUCCESS;
    *done = 0;
    for (vmap *mp = V.maps; mp && r == CUDA_SUCCESS; mp = mp->next) {
        if (mp->r != v)
            continue;
        r = GC_REAL(cuMemMap)(mp->ptr, mp->size, mp->off, h, 0);
        if (r != CUDA_SUCCESS)
            break;
        ++*done;
        for (size_t i = 0; i < mp->nacc && r == CUDA_SUCCESS; i++)
            r = GC_REAL(cuMemSetAccess)(mp->acc[i].ptr, mp->acc[i].size, mp->acc[i].d, mp->acc[i].n);
    }
    return r;
}

static int vmm_move(vrec *v, char *why, size_t whylen) {
    bool host = v->prop.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
    unsigned flags = host ? GC_ALLOC_HOST_NUMA : v->prop.allocFlags.gpuDirectRDMACapable ? GC_ALLOC_GPU_DIRECT_RDMA : 0;
    gc_move m;
    if (gc_move_new(v->dev, GC_KIND_VMM, flags, v->hsize, v->announced, &m, why, whylen) != 0)
        return -1;
    if (vmm_copy(v, &m, why, whylen) != 0) {
        gc_move_abandon(&m);
        return -1;
    }
    gc_move_done(&m);
    /* every mapping onto the new memory, at its address, with its access */
    for (vmap *mp = V.maps; mp; mp = mp->next)
        if (mp->r == v && GC_REAL(cuMemUnmap)(mp->ptr, mp->size) != CUDA_SUCCESS)
            gc_warn("moving VMM allocation %llu: cuMemUnmap(0x%llx) failed", (unsigned long long)v->id,
                    (unsigned long long)mp->ptr);
    size_t done = 0;
    CUresult r = vmm_map_all(v, m.h, &done);
    if (r != CUDA_SUCCESS) {
        snprintf(why, whylen, "mapping VMM allocation %llu again: CUresult %d", (unsigned long long)v->id, (int)r);
        unmap_first(v, done);
        size_t back = 0;
        CUresult rb = v->real_released ? CUDA_ERROR_INVALID_HANDLE : vmm_map_all(v, v->real, &back);
        if (rb != CUDA_SUCCESS) {
            /* nothing mapped where the application's memory is: its next access would fault */
            fprintf(stderr,
                    "gpucr: this process's VMM allocation %llu is lost (mapping it again: CUresult %d); aborting\n",
                    (unsigned long long)v->id, (int)rb);
            abort();
        }
        gc_move_abandon(&m);
        return -1;
    }
    if (!v->real_released && GC_REAL(cuMemRelease)(v->real) != CUDA_SUCCESS)
        gc_warn("releasing VMM allocation %llu of the helper that ended failed", (unsigned long long)v->id);
    if (v->real_released && GC_REAL(cuMemRelease)(m.h) != CUDA_SUCCESS)
        gc_warn("VMM allocation %llu: releasing the new import failed",
                (unsigned long long)m.id); /* mappings hold it */
    gc_alloc_lock();
    v->real = m.h;
    v->id = m.id;
    gc_alloc_unlock();
    return 0;
}

void gc_vmm_move_all(uint64_t *allocs, uint64_t *bytes, uint64_t *left, char *why, size_t whylen) {
    char w[256];
    for (vrec *v = V.recs; v; v = v->next) {
        if (v->peer || !v->imported)
            continue;
        if (v->real_released && v->nmaps == 0)
            continue; /* gone for the application: the helper that ended held its last reference */
        if (vmm_move(v, w, sizeof w) == 0) {
            ++*allocs;
            *bytes += v->hsize;
        } else {
            if (!*left)
                snprintf(why, whylen, "%s", w);
            ++*left;
            gc_alloc_lock();
            v->id = GC_ORPHAN_ID;
            gc_alloc_unlock();
        }
    }
}

uint64_t gc_vmm_orphan_all(void) {
    uint64_t n = 0;
    gc_alloc_lock();
    for (vrec *v = V.recs; v; v = v->next) {
        v->id = GC_ORPHAN_ID;
        n += !v->peer;
    }
    gc_alloc_unlock();
    return n;
}

/* The child forgets the parent's records (its handles mean nothing to the child's driver state). */
void gc_vmm_atfork_child(void) {
    V.recs = NULL;
    V.maps = NULL;
}

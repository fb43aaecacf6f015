/*
 * Virtual memory management: physical allocations (one memfd each), address
 * reservations, mappings, access, and export/import as POSIX file descriptors.
 *
 * Physical memory lives on a device or on the host (location HOST_NUMA, the
 * simulated host's one node, 0: pinned host memory that devices and the CPU
 * share, as NCCL allocates it). Host memory is charged to no device.
 *
 * Exporting hands out a duplicate of the memfd, so a process that imports it
 * (after SCM_RIGHTS) maps the very same pages: writes are visible both ways, as
 * with real GPU memory shared between processes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim.h"

#define VMM_NAME_PREFIX "gpucr-vmm-dev"
#define VMM_HOST_NAME "gpucr-vmm-host"
/* The host NUMA node every device reports (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID). */
#define SIM_HOST_NUMA 0

typedef struct sim_phys {
    int fd; /* -1 while checkpointed */
    uint64_t size;
    int dev;
    unsigned htypes; /* requestedHandleTypes */
    int host;        /* host memory (HOST_NUMA); dev is then -1 */
    int imported;
    int refs;     /* handle references: cuMemCreate or import 1, each cuMemRetainAllocationHandle 1 more */
    int released; /* no reference left (cuMemRelease as often); lives on while mapped */
    int nmaps;
    sim_parked parked;
    struct sim_phys *next;
} sim_phys;

typedef struct sim_vmap {
    uint64_t addr, size, off;
    uint64_t id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
    sim_phys *phys;
    int prot;                   /* what the host mapping allows: the union of the locations' access */
    int dprot[SIM_MAX_DEVICES]; /* each device's access (cuMemSetAccess sets only the locations it names) */
    int hprot;                  /* the CPU's (location HOST_NUMA), host memory only */
} sim_vmap;

/* A handle the caller may still use; with `mapped_ok`, also one released but still mapped. */
static sim_phys *phys_find_any(CUmemGenericAllocationHandle h, bool mapped_ok) {
    for (sim_phys *p = sim.phys; p; p = p->next)
        if ((uintptr_t)p == (uintptr_t)h && (!p->released || mapped_ok))
            return p;
    return NULL;
}

static sim_phys *phys_find(CUmemGenericAllocationHandle h) { return phys_find_any(h, false); }

static void phys_destroy(sim_phys *p) {
    for (sim_phys **pp = &sim.phys; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    if (p->fd >= 0)
        close(p->fd);
    sim_parked_free(&p->parked);
    if (!p->imported && !p->host)
        sim.dev[p->dev].used -= p->size;
    free(p);
}

/* The granularity query does not check the host node (measured: node 4096 is accepted); cuMemCreate does. */
static CUresult check_prop(const CUmemAllocationProp *prop, bool node_checked) {
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
        return !node_checked || prop->location.id == SIM_HOST_NUMA ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_device_check(prop->location.id);
}

SIM_API CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemGetAllocationGranularity", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    r = check_prop(prop, false);
    if (r == CUDA_SUCCESS)
        *granularity = SIM_GRANULARITY;
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemCreate", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!handle || flags != 0 || size == 0 || size % SIM_GRANULARITY)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    if ((r = check_prop(prop, true)) != CUDA_SUCCESS)
        return sim_leave(&c, r);
    /* fabric handles need IMEX, which a plain H100 host lacks: NOT_PERMITTED there (measured) */
    if (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC)
        return sim_leave(&c, CUDA_ERROR_NOT_PERMITTED);
    if (prop->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return sim_leave(&c, CUDA_ERROR_NOT_SUPPORTED); /* no Windows handles on Linux */
    bool host = prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
    int dev = host ? -1 : prop->location.id;
    sim_phys *p = calloc(1, sizeof *p);
    if (!p)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    pthread_rwlock_wrlock(&sim.memlock);
    if (!host && size > sim.dev[dev].total - sim.dev[dev].used) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        char name[32];
        if (host)
            snprintf(name, sizeof name, VMM_HOST_NAME);
        else
            snprintf(name, sizeof name, VMM_NAME_PREFIX "%d", sim.dev[dev].phys);
        int fd = sim_memfd(name, size);
        if (fd < 0) {
            sim_warn("cuMemCreate: memfd of %zu bytes: %s", size, strerror(-fd));
            r = fd == -EMFILE || fd == -ENFILE ? CUDA_ERROR_OPERATING_SYSTEM : CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            p->fd = fd;
            p->size = size;
            p->dev = dev;
            p->host = host;
            p->refs = 1;
            p->htypes = (unsigned)prop->requestedHandleTypes;
            p->next = sim.phys;
            sim.phys = p;
            if (!host)
                sim.dev[dev].used += size;
            *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
        }
    }
    pthread_rwlock_unlock(&sim.memlock);
    if (r != CUDA_SUCCESS)
        free(p);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemRelease", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    pthread_rwlock_wrlock(&sim.memlock);
    sim_phys *p = phys_find(handle);
    if (!p) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        if (--p->refs == 0) {
            p->released = 1;
            if (p->nmaps == 0)
                phys_destroy(p);
        }
    }
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemAddressReserve", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!ptr || flags != 0 || size == 0 || size % SIM_GRANULARITY || (alignment & (alignment - 1)))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    uint64_t align = alignment > SIM_GRANULARITY ? alignment : SIM_GRANULARITY;
    const int flg = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    pthread_rwlock_wrlock(&sim.memlock);
    uint64_t got = 0;
    /* The address asked for is not taken, free or not: driver 580 on an H200 honoured none of the hints it was
     * given, free ranges and ranges it had handed out just before among them (tests/gpu/served/vahint.c), so
     * nothing gpucr does may rely on one. */
    (void)addr;
    uint64_t from = SIM_VMM_BASE;
    for (int tries = 0; !got && tries < 4096; tries++) {
        uint64_t cand = rs_fit(&sim.vres, SIM_VMM_BASE, SIM_VMM_BASE + SIM_VMM_SIZE, from, size, align);
        if (!cand)
            break;
        int e = sim_map_exact(cand, size, PROT_NONE, flg, -1, 0);
        if (e == 0)
            got = cand;
        else if (e == -EEXIST) /* something of the host's lives there: look further up */
            from = cand + align;
        else
            break;
    }
    if (!got) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (rs_insert(&sim.vres, (sim_range){got, size, NULL, SIM_R_VRES, 0}) < 0) {
        munmap((void *)(uintptr_t)got, size);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        *ptr = got;
    }
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemAddressFree", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    pthread_rwlock_wrlock(&sim.memlock);
    ssize_t i = rs_find_start(&sim.vres, ptr);
    if (i < 0 || sim.vres.v[i].len != size || rs_overlaps(&sim.vmaps, ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        if (munmap((void *)(uintptr_t)ptr, size) < 0)
            sim_warn("cuMemAddressFree: munmap: %s", strerror(errno));
        rs_remove_at(&sim.vres, (size_t)i);
    }
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemMap", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (flags != 0 || size == 0 || size % SIM_GRANULARITY || offset % SIM_GRANULARITY || ptr % SIM_GRANULARITY)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_vmap *m = calloc(1, sizeof *m);
    if (!m)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    pthread_rwlock_wrlock(&sim.memlock);
    /* a released handle can still be mapped again while some mapping keeps it alive (measured) */
    sim_phys *p = phys_find_any(handle, true);
    ssize_t i = rs_find(&sim.vres, ptr);
    if (i < 0 || ptr + size > sim.vres.v[i].start + sim.vres.v[i].len || rs_overlaps(&sim.vmaps, ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (!p || offset != 0 || size != p->size) {
        /*
         * Measured: only whole allocations map (offset 0, the full size), as the
         * documentation's "offset must currently be zero" says. The driver
         * crashes on garbage handles; here they get the same answer.
         */
        r = CUDA_ERROR_NOT_SUPPORTED;
    } else {
        /* mapped but inaccessible until cuMemSetAccess, as on the driver */
        void *got = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset);
        if (got == MAP_FAILED) {
            sim_warn("cuMemMap: mmap: %s", strerror(errno));
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *m = (sim_vmap){
                .addr = ptr, .size = size, .off = offset, .id = sim_buffer_id_next(), .phys = p, .prot = PROT_NONE};
            if (rs_insert(&sim.vmaps, (sim_range){ptr, size, m, SIM_R_VMAP, PROT_NONE}) < 0) {
                sim_map_reserve_fixed(ptr, size);
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                p->nmaps++;
                /* cppcheck-suppress memleak ; sim.vmaps holds m now */
                m = NULL;
            }
        }
    }
    pthread_rwlock_unlock(&sim.memlock);
    free(m);
    return sim_leave(&c, r);
}

/* Index of the first mapping of [ptr, ptr+size) if the range is exactly whole, adjacent mappings. */
static ssize_t whole_maps(uint64_t ptr, uint64_t size, size_t *count) {
    ssize_t i = rs_find_start(&sim.vmaps, ptr);
    if (i < 0 || size == 0)
        return -1;
    uint64_t at = ptr, end = ptr + size;
    size_t j = (size_t)i;
    while (at < end) {
        if (j >= sim.vmaps.n || sim.vmaps.v[j].start != at)
            return -1;
        at += sim.vmaps.v[j].len;
        j++;
    }
    if (at != end)
        return -1;
    *count = j - (size_t)i;
    return i;
}

static void dmap_drop(uint64_t addr) {
    ssize_t k = rs_find_start(&sim.dmap, addr);
    if (k >= 0)
        rs_remove_at(&sim.dmap, (size_t)k);
}

SIM_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemUnmap", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    pthread_rwlock_wrlock(&sim.memlock);
    size_t n;
    ssize_t i = whole_maps(ptr, size, &n);
    ssize_t res = rs_find(&sim.vres, ptr);
    if (i < 0 && size && res >= 0 && ptr + size <= sim.vres.v[res].start + sim.vres.v[res].len &&
        !rs_overlaps(&sim.vmaps, ptr, size)) {
        r = CUDA_SUCCESS; /* nothing mapped there: a no-op on the driver (measured) */
    } else if (i < 0) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        while (n--) {
            sim_vmap *m = sim.vmaps.v[i].obj;
            dmap_drop(m->addr);
            int e = sim_map_reserve_fixed(m->addr, m->size);
            if (e)
                sim_warn("cuMemUnmap: mmap: %s", strerror(-e));
            rs_remove_at(&sim.vmaps, (size_t)i);
            sim_phys *p = m->phys;
            free(m);
            if (--p->nmaps == 0 && p->released)
                phys_destroy(p);
        }
    }
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

static int access_prot(CUmemAccess_flags f) {
    switch (f) {
    case CU_MEM_ACCESS_FLAGS_PROT_NONE: return PROT_NONE;
    case CU_MEM_ACCESS_FLAGS_PROT_READ: return PROT_READ;
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: return PROT_READ | PROT_WRITE;
    default: return -1;
    }
}

/*
 * Access is per location (each device, the host node); a call changes only the
 * locations it names. Memory is one host mapping here, so the most any device
 * or the CPU may do is what the union of them allows.
 */
SIM_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemSetAccess", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!desc || count == 0)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    bool to_host = false;
    for (size_t k = 0; k < count; k++) {
        if (access_prot(desc[k].flags) < 0)
            return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
        if (desc[k].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
            if (desc[k].location.id != SIM_HOST_NUMA)
                return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
            to_host = true;
        } else if (desc[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
            return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
        } else if ((r = sim_device_check(desc[k].location.id)) != CUDA_SUCCESS) {
            return sim_leave(&c, r);
        }
    }
    pthread_rwlock_wrlock(&sim.memlock);
    size_t n;
    ssize_t i = whole_maps(ptr, size, &n);
    if (i < 0)
        r = CUDA_ERROR_INVALID_VALUE;
    /* the CPU's access to device memory (measured: NOT_SUPPORTED) */
    for (size_t j = (size_t)i; r == CUDA_SUCCESS && to_host && j < (size_t)i + n; j++)
        if (!((sim_vmap *)sim.vmaps.v[j].obj)->phys->host)
            r = CUDA_ERROR_NOT_SUPPORTED;
    for (size_t j = (size_t)i; r == CUDA_SUCCESS && j < (size_t)i + n; j++) {
        sim_vmap *m = sim.vmaps.v[j].obj;
        for (size_t k = 0; k < count; k++) {
            if (desc[k].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
                m->hprot = access_prot(desc[k].flags);
            else
                m->dprot[desc[k].location.id] = access_prot(desc[k].flags);
        }
        int prot = m->hprot;
        for (int d = 0; d < SIM_MAX_DEVICES; d++)
            prot |= m->dprot[d];
        if (mprotect((void *)(uintptr_t)m->addr, m->size, prot) < 0) {
            sim_warn("cuMemSetAccess: mprotect: %s", strerror(errno));
            r = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        m->prot = prot;
        sim.vmaps.v[j].prot = prot;
        dmap_drop(m->addr);
        if (prot != PROT_NONE && rs_insert(&sim.dmap, (sim_range){m->addr, m->size, m, SIM_R_VMAP, prot}) < 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
    }
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType, unsigned long long flags) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemExportToShareableHandle", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!shareableHandle || flags != 0 || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_rwlock_rdlock(&sim.memlock);
    sim_phys *p = phys_find(handle);
    /* an allocation this process imported is not exported again (measured, in the importing process and in the
     * exporting one) */
    if (!p || !(p->htypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) || p->imported) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) {
            sim_warn("cuMemExportToShareableHandle: dup: %s", strerror(errno));
            r = CUDA_ERROR_OPERATING_SYSTEM;
        } else {
            *(int *)shareableHandle = fd;
        }
    }
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

/* The device an exported fd belongs to, from the memfd's name; -2 for host memory, -1 if it is not one of ours. */
static int fd_vmm_dev(int fd) {
    char path[64], target[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0)
        return -1;
    target[n] = 0;
    if (strncmp(target, "/memfd:" VMM_HOST_NAME, strlen("/memfd:" VMM_HOST_NAME)) == 0)
        return -2;
    const char *pre = "/memfd:" VMM_NAME_PREFIX;
    if (strncmp(target, pre, strlen(pre)) != 0)
        return -1;
    return atoi(target + strlen(pre));
}

SIM_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                CUmemAllocationHandleType shHandleType) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemImportFromShareableHandle", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    int fd = (int)(intptr_t)osHandle;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    int dev = fd_vmm_dev(fd);
    bool host = dev == -2;
    /* an fd that is not exported memory: the driver says UNKNOWN (measured with /dev/null) */
    if (dev == -1 || st.st_size <= 0 || (uint64_t)st.st_size % SIM_GRANULARITY)
        return sim_leave(&c, CUDA_ERROR_UNKNOWN);
    if (dev >= 0) {
        /* the name says which GPU; this process may see it behind another ordinal */
        int o = sim_ordinal_of_phys(dev);
        dev = o >= 0 ? o : 0; /* exported by a process that sees more devices */
    }
    sim_phys *p = calloc(1, sizeof *p);
    if (!p)
        return sim_leave(&c, CUDA_ERROR_OUT_OF_MEMORY);
    /* the caller keeps its fd, as with the driver */
    p->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (p->fd < 0) {
        sim_warn("cuMemImportFromShareableHandle: dup: %s", strerror(errno));
        free(p);
        return sim_leave(&c, CUDA_ERROR_OPERATING_SYSTEM);
    }
    p->size = (uint64_t)st.st_size;
    p->dev = host ? -1 : dev;
    p->host = host;
    p->refs = 1;
    p->htypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p->imported = 1;
    pthread_rwlock_wrlock(&sim.memlock);
    p->next = sim.phys;
    sim.phys = p;
    pthread_rwlock_unlock(&sim.memlock);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    return sim_leave(&c, CUDA_SUCCESS);
}

/* The allocation mapped at addr, one more reference to it (also to one released but still mapped). */
SIM_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemRetainAllocationHandle", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!handle)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_rwlock_wrlock(&sim.memlock);
    ssize_t i = rs_find(&sim.vmaps, (uint64_t)(uintptr_t)addr);
    if (i < 0) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        sim_phys *p = ((sim_vmap *)sim.vmaps.v[i].obj)->phys;
        p->refs++;
        p->released = 0;
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    }
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

SIM_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                        CUmemGenericAllocationHandle handle) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuMemGetAllocationPropertiesFromHandle", SIM_CTX_OPTIONAL);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!prop)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_rwlock_rdlock(&sim.memlock);
    sim_phys *p = phys_find(handle);
    if (!p) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        memset(prop, 0, sizeof *prop);
        prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->requestedHandleTypes = (CUmemAllocationHandleType)p->htypes;
        prop->location.type = p->host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = p->host ? SIM_HOST_NUMA : p->dev;
    }
    pthread_rwlock_unlock(&sim.memlock);
    return sim_leave(&c, r);
}

void sim_vmm_atfork_child(void) {
    for (size_t i = 0; i < sim.vmaps.n; i++) {
        sim_vmap *m = sim.vmaps.v[i].obj;
        (void)sim_map_reserve_fixed(m->addr, m->size);
    }
    for (sim_phys *p = sim.phys; p; p = p->next) {
        if (p->fd >= 0)
            close(p->fd);
        p->fd = -1;
    }
}

/* ---- checkpoint support (memlock held for writing) ---- */

bool sim_vmm_has_imported(void) {
    for (sim_phys *p = sim.phys; p; p = p->next)
        if (p->imported)
            return true;
    return false;
}

int sim_vmm_park_all(void) {
    for (sim_phys *p = sim.phys; p; p = p->next) {
        if (p->fd < 0)
            continue;
        int e = sim_park_fd(p->fd, p->size, &p->parked);
        if (e) {
            sim_warn("checkpoint: copying a VMM allocation out: %s", strerror(-e));
            return e;
        }
    }
    for (size_t i = 0; i < sim.vmaps.n; i++) {
        sim_vmap *m = sim.vmaps.v[i].obj;
        int e = sim_map_reserve_fixed(m->addr, m->size);
        if (e) {
            sim_warn("checkpoint: unmapping a VMM mapping: %s", strerror(-e));
            return e;
        }
    }
    for (sim_phys *p = sim.phys; p; p = p->next) {
        if (p->fd >= 0) {
            close(p->fd);
            p->fd = -1;
        }
    }
    return 0;
}

int sim_vmm_unpark_all(void) {
    for (sim_phys *p = sim.phys; p; p = p->next) {
        if (p->fd >= 0) { /* never closed: a checkpoint that failed half-way */
            sim_parked_free(&p->parked);
            continue;
        }
        char name[32];
        if (p->host)
            snprintf(name, sizeof name, VMM_HOST_NAME);
        else
            snprintf(name, sizeof name, VMM_NAME_PREFIX "%d", sim.dev[p->dev].phys);
        int e = sim_unpark_fd(&p->parked, p->size, name, &p->fd);
        if (e) {
            sim_warn("restore: recreating a VMM allocation: %s", strerror(-e));
            return e;
        }
        sim_parked_free(&p->parked);
    }
    for (size_t i = 0; i < sim.vmaps.n; i++) {
        sim_vmap *m = sim.vmaps.v[i].obj;
        void *got =
            mmap((void *)(uintptr_t)m->addr, m->size, m->prot, MAP_SHARED | MAP_FIXED, m->phys->fd, (off_t)m->off);
        if (got == MAP_FAILED) {
            int e = -errno;
            sim_warn("restore: remapping a VMM mapping: %s", strerror(-e));
            return e;
        }
    }
    return 0;
}

/* A VMM mapping's pointer attributes (memlock held): no context owns VMM memory; the range is the mapping. */
bool sim_vmm_ptr_info(uint64_t p, int dev, sim_ptrinfo *o) {
    ssize_t i = rs_find(&sim.vmaps, p);
    if (i < 0)
        return false;
    const sim_vmap *m = sim.vmaps.v[i].obj;
    o->type = m->phys->host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
    o->ctx = NULL;
    o->dev = m->phys->host ? -1 : m->phys->dev;
    o->base = o->map_base = m->addr;
    o->size = o->map_size = m->size;
    o->buffer_id = m->id;
    o->vmm = 1;
    o->htypes = m->phys->htypes;
    int prot = dev >= 0 && dev < SIM_MAX_DEVICES ? m->dprot[dev] : 0;
    o->access = (prot & PROT_WRITE)  ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                : (prot & PROT_READ) ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                     : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return true;
}

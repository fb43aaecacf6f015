/* Devices (H100-like), their attributes and UUIDs, and primary contexts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define SIM_DEVICE_NAME "gpucr simulated GPU"

/* Attribute numbers at or above this are unknown to the driver (measured: 1..147 valid on driver 580). */
#define SIM_ATTR_MAX 148

static sim_ctx ctxs[SIM_MAX_DEVICES];

CUresult sim_device_check(CUdevice dev) {
    return dev >= 0 && dev < sim.ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

bool sim_ctx_valid(sim_ctx *ctx) {
    uintptr_t p = (uintptr_t)ctx, b = (uintptr_t)ctxs;
    return p >= b && p < b + sizeof ctxs && (p - b) % sizeof ctxs[0] == 0;
}

/* H100 SXM values where they are known; attributes not listed read 0, as unsupported ones do. */
static int attr_value(int a, int dev) {
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    /* the ordinal's first GPU's, even after a restore moved the ordinal onto another GPU: measured on
     * driver 580 (2 H200s, tests/gpu/other-gpu.sh), cuDeviceGetPCIBusId then still names the old GPU */
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x18 + dev;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 52428800;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case 51: return 32; /* TEXTURE_PITCH_ALIGNMENT */
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case 78: return 1;      /* STREAM_PRIORITIES_SUPPORTED */
    case 79: return 1;      /* GLOBAL_L1_CACHE_SUPPORTED */
    case 80: return 1;      /* LOCAL_L1_CACHE_SUPPORTED */
    case 81: return 233472; /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 82: return 65536;  /* MAX_REGISTERS_PER_MULTIPROCESSOR */
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
    case 90: return 1;      /* COMPUTE_PREEMPTION_SUPPORTED */
    case 91: return 1;      /* CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM */
    case 95: return 1;      /* COOPERATIVE_LAUNCH */
    case 97: return 232448; /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 99: return 1;      /* HOST_REGISTER_SUPPORTED */
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return 1;
    case 106: return 32;                                                        /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: return 1; /* H100, H200 */
    case 111: return 1024;                                                      /* RESERVED_SHARED_MEMORY_PER_BLOCK */
    case 113: return 1;                                                         /* READ_ONLY_HOST_REGISTER_SUPPORTED */
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case 119: return 1; /* MEMPOOL_SUPPORTED_HANDLE_TYPES: POSIX fd */
    case 120: return 1; /* CLUSTER_LAUNCH */
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: return 0;
    default: return 0;
    }
}

SIM_API CUresult cuDeviceGetCount(int *count) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuDeviceGetCount", SIM_NEED_INIT);
    if (r == CUDA_SUCCESS) {
        if (!count)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            *count = sim.ndev;
    }
    return sim_leave(&c, r);
}

SIM_API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuDeviceGet", SIM_NEED_INIT);
    if (r == CUDA_SUCCESS) {
        if (!device)
            r = CUDA_ERROR_INVALID_VALUE;
        else if ((r = sim_device_check(ordinal)) == CUDA_SUCCESS)
            *device = ordinal;
    }
    return sim_leave(&c, r);
}

SIM_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuDeviceGetName", SIM_NEED_INIT);
    if (r == CUDA_SUCCESS && (r = sim_device_check(dev)) == CUDA_SUCCESS) {
        if (!name || len <= 0) {
            r = CUDA_ERROR_INVALID_VALUE;
        } else {
            strncpy(name, SIM_DEVICE_NAME, (size_t)len - 1);
            name[len - 1] = 0;
        }
    }
    return sim_leave(&c, r);
}

SIM_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuDeviceGetAttribute", SIM_NEED_INIT);
    if (r == CUDA_SUCCESS) {
        if (!pi || (int)attrib <= 0 || (int)attrib >= SIM_ATTR_MAX)
            r = CUDA_ERROR_INVALID_VALUE;
        else if ((r = sim_device_check(dev)) == CUDA_SUCCESS)
            *pi = attr_value((int)attrib, dev);
    }
    return sim_leave(&c, r);
}

/* "0000:BB:00.0", the bus the attribute says (which stays the ordinal's first GPU's, as measured) */
SIM_API CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuDeviceGetPCIBusId", SIM_NEED_INIT);
    if (r == CUDA_SUCCESS && (r = sim_device_check(dev)) == CUDA_SUCCESS) {
        char s[16];
        int n = snprintf(s, sizeof s, "0000:%02x:00.0", attr_value(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev));
        if (!pciBusId || len <= n)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            memcpy(pciBusId, s, (size_t)n + 1);
    }
    return sim_leave(&c, r);
}

SIM_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuDeviceTotalMem_v2", SIM_NEED_INIT);
    if (r == CUDA_SUCCESS && (r = sim_device_check(dev)) == CUDA_SUCCESS) {
        if (!bytes)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            *bytes = sim.dev[dev].total;
    }
    return sim_leave(&c, r);
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Deterministic, so that tests can tell GPUs and seeds apart reproducibly. */
void sim_phys_uuid(int phys, CUuuid *uuid) {
    uint64_t h = 0xcbf29ce484222325ULL;
    const char *seed = getenv("GPUCR_SIM_UUID_SEED");
    for (const char *p = seed ? seed : ""; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
    uint64_t s = h ^ ((uint64_t)phys * 0x9e3779b97f4a7c15ULL);
    uint64_t a = splitmix64(&s), b = splitmix64(&s);
    memcpy(uuid->bytes, &a, 8);
    memcpy(uuid->bytes + 8, &b, 8);
}

int sim_ordinal_of_phys(int phys) {
    for (int i = 0; i < sim.ndev; i++)
        if (sim.dev[i].phys == phys)
            return i;
    return -1;
}

static CUresult get_uuid(const char *name, CUuuid *uuid, CUdevice dev) {
    sim_call c;
    CUresult r = sim_enter(&c, name, SIM_NEED_INIT);
    if (r == CUDA_SUCCESS && (r = sim_device_check(dev)) == CUDA_SUCCESS) {
        if (!uuid)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            sim_phys_uuid(sim.dev[dev].phys, uuid);
    }
    return sim_leave(&c, r);
}

SIM_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return get_uuid("cuDeviceGetUuid_v2", uuid, dev); }

SIM_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
SIM_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return get_uuid("cuDeviceGetUuid", uuid, dev); }

/* Every simulated device reaches every other one (one host's memory underneath), as NVLinked H100s do. */
SIM_API CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuDeviceCanAccessPeer", SIM_NEED_INIT);
    if (r != CUDA_SUCCESS || (r = sim_device_check(dev)) != CUDA_SUCCESS ||
        (r = sim_device_check(peerDev)) != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!canAccessPeer)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    *canAccessPeer = dev != peerDev;
    return sim_leave(&c, CUDA_SUCCESS);
}

/* ---- primary contexts ---- */

/* A new context's limits: an H200's defaults under driver 580 (measured). */
static void sim_ctx_limits_default(sim_ctx *ctx) {
    static const size_t defaults[SIM_NLIMITS] = {
        [CU_LIMIT_STACK_SIZE] = 1024,
        [CU_LIMIT_PRINTF_FIFO_SIZE] = 8650752,
        [CU_LIMIT_MALLOC_HEAP_SIZE] = 8388608,
        [CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2,
        [CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048,
        [CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = 64,
        [CU_LIMIT_PERSISTING_L2_CACHE_SIZE] = 11796480,
    };
    memcpy(ctx->limits, defaults, sizeof defaults);
}

SIM_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuDevicePrimaryCtxRetain", SIM_NEED_INIT);
    if (r != CUDA_SUCCESS || (r = sim_device_check(dev)) != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!pctx)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    sim_ctx *ctx = &ctxs[dev];
    pthread_mutex_lock(&sim.mu);
    if (ctx->refs == 0) {
        ctx->magic = SIM_CTX_MAGIC;
        ctx->dev = dev;
        atomic_store(&ctx->sticky, 0);
        ctx->streams = NULL;
        ctx->nstreams = 0;
        sim_ctx_limits_default(ctx);
        r = sim_stream_create_locked(ctx, CU_STREAM_DEFAULT, 1, &ctx->legacy);
        if (r == CUDA_SUCCESS) {
            sim.dev[dev].primary = ctx;
            atomic_store(&ctx->alive, 1);
        }
    }
    if (r == CUDA_SUCCESS) {
        ctx->refs++;
        *pctx = (CUcontext)ctx;
    }
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, r);
}

SIM_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuDevicePrimaryCtxRelease_v2", SIM_NEED_INIT);
    if (r != CUDA_SUCCESS || (r = sim_device_check(dev)) != CUDA_SUCCESS)
        return sim_leave(&c, r);
    sim_ctx *ctx = &ctxs[dev];
    pthread_mutex_lock(&sim.mu);
    if (ctx->refs == 0) {
        pthread_mutex_unlock(&sim.mu);
        return sim_leave(&c, CUDA_ERROR_INVALID_CONTEXT);
    }
    if (--ctx->refs > 0) {
        pthread_mutex_unlock(&sim.mu);
        return sim_leave(&c, CUDA_SUCCESS);
    }
    /* The last release destroys the context and everything it owns, as on the driver. */
    atomic_store(&ctx->alive, 0);
    sim_ctx_streams_stop(ctx);
    sim_modules_free_ctx(ctx);
    ctx->legacy = NULL;
    pthread_mutex_unlock(&sim.mu);
    sim_mem_free_ctx(ctx);
    atomic_store(&ctx->sticky, 0);
    return sim_leave(&c, CUDA_SUCCESS);
}

SIM_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuDevicePrimaryCtxGetState", SIM_NEED_INIT);
    if (r != CUDA_SUCCESS || (r = sim_device_check(dev)) != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!flags || !active)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    *flags = sim.dev[dev].primary_flags;
    *active = ctxs[dev].refs > 0;
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, CUDA_SUCCESS);
}

/* The scheduling flags only change how the driver waits (spin, yield, sleep);
 * the simulator always sleeps on a condition variable, so it only keeps and
 * validates them. One scheduling mode at most; other known bits are kept. */
SIM_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuDevicePrimaryCtxSetFlags_v2", SIM_NEED_INIT);
    if (r != CUDA_SUCCESS || (r = sim_device_check(dev)) != CUDA_SUCCESS)
        return sim_leave(&c, r);
    unsigned sched = flags & CU_CTX_SCHED_MASK;
    if ((flags & ~(CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX)) != 0 ||
        (sched != CU_CTX_SCHED_AUTO && sched != CU_CTX_SCHED_SPIN && sched != CU_CTX_SCHED_YIELD &&
         sched != CU_CTX_SCHED_BLOCKING_SYNC))
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&sim.mu);
    sim.dev[dev].primary_flags = flags;
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, CUDA_SUCCESS);
}

SIM_API CUresult cuCtxGetCurrent(CUcontext *pctx) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuCtxGetCurrent", SIM_NEED_INIT);
    if (r == CUDA_SUCCESS) {
        if (!pctx)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            *pctx = (CUcontext)c.ctx;
    }
    return sim_leave(&c, r);
}

SIM_API CUresult cuCtxSetCurrent(CUcontext ctx) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuCtxSetCurrent", SIM_NEED_INIT);
    if (r == CUDA_SUCCESS) {
        sim_ctx *x = (sim_ctx *)ctx;
        if (x && (!sim_ctx_valid(x) || !atomic_load(&x->alive)))
            r = CUDA_ERROR_INVALID_CONTEXT;
        else
            sim_set_current_ctx(x);
    }
    return sim_leave(&c, r);
}

SIM_API CUresult cuCtxGetDevice(CUdevice *device) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuCtxGetDevice", SIM_NEED_CTX);
    if (r == CUDA_SUCCESS) {
        if (!device)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            *device = c.ctx->dev;
    }
    return sim_leave(&c, r);
}

SIM_API CUresult cuCtxSynchronize(void) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuCtxSynchronize", SIM_NEED_CTX);
    if (r == CUDA_SUCCESS)
        r = sim_ctx_sync(c.ctx);
    return sim_leave(&c, r);
}

/* ---- limits and stream priorities of the current context ---- */

/* The most of the L2 that may be set aside for persisting accesses: not measured (a set of 1 TiB fails on an
 * H200); the H100's documented maximum is taken. */
#define SIM_MAX_PERSISTING_L2 (82ull << 20)

SIM_API CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuCtxSetLimit", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    switch (limit) {
    case CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH:
        /* device-side synchronization does not exist from compute capability 9.0 on */
        return sim_leave(&c, CUDA_ERROR_UNSUPPORTED_LIMIT);
    case CU_LIMIT_MAX_L2_FETCH_GRANULARITY:
        if (value > 128)
            return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
        break;
    case CU_LIMIT_PERSISTING_L2_CACHE_SIZE:
        if (value > SIM_MAX_PERSISTING_L2)
            return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
        break;
    case CU_LIMIT_STACK_SIZE:
        value = (value + 15) / 16 * 16; /* measured: 1000 reads back as 1008 */
        break;
    case CU_LIMIT_PRINTF_FIFO_SIZE:
    case CU_LIMIT_MALLOC_HEAP_SIZE:
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: break;
    default: return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    }
    pthread_mutex_lock(&sim.mu);
    c.ctx->limits[limit] = value;
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, CUDA_SUCCESS);
}

SIM_API CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuCtxGetLimit", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!pvalue || (unsigned)limit >= SIM_NLIMITS)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    if (limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH)
        return sim_leave(&c, CUDA_ERROR_UNSUPPORTED_LIMIT);
    pthread_mutex_lock(&sim.mu);
    *pvalue = c.ctx->limits[limit];
    pthread_mutex_unlock(&sim.mu);
    return sim_leave(&c, CUDA_SUCCESS);
}

/* Either pointer may be NULL. */
SIM_API CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    sim_call c;
    CUresult r = sim_enter(&c, "cuCtxGetStreamPriorityRange", SIM_NEED_CTX);
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (leastPriority)
        *leastPriority = SIM_PRIO_LEAST;
    if (greatestPriority)
        *greatestPriority = SIM_PRIO_GREATEST;
    return sim_leave(&c, CUDA_SUCCESS);
}

/*
 * Private declarations of libgpucr.so, the LD_PRELOAD interposer.
 *
 *   table.c      buffer table (immutable sorted snapshots, swapped atomically) and the
 *                slab bitmap allocator; no driver calls, unit-tested by tests/intercept/unit.c
 *   scan.c       per-handle parameter layout cache (lock-free), launch parameter scanning,
 *                per-thread counters; driver calls only through function pointers
 *   client.c     the helper connections, allocations through the helper, the control thread
 *   vmm.c        the application's own VMM calls (cuMemCreate ...) served from the helper behind
 *                virtual allocation handles; their part of Drop / Reimport / Snapshot
 *   interpose.c  the symbol table, dlsym / cuGetProcAddress hooks, wrappers, the gate
 *
 * docs/helper-protocol.md is the contract with the helper.
 */
#ifndef GPUCR_INTERCEPT_INT_H
#define GPUCR_INTERCEPT_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpucr/cudadrv.h"

#define GC_EXPORT __attribute__((visibility("default")))
#define GC_HIDDEN __attribute__((visibility("hidden")))

/* ---- driver entry points cudadrv.h does not declare (signatures of the public driver API) ---- */
#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

typedef struct CUipcMemHandle_st {
    char reserved[64];
} CUipcMemHandle;

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                   CUstream hStream);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N);
CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
CUresult cuModuleLoad(CUmodule *module, const char *fname);
CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
                            void **optionValues);
CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                               void **libraryOptionValues, unsigned int numLibraryOptions);
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr);
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle);

/*
 * Other calls that queue GPU work, passed through behind the gate only (so
 * that no work is queued while a checkpoint holds the process, or between the
 * driver's restore and the reimport of its memory: a CUDA graph replayed in
 * that window faults on memory not mapped yet). Their structures are only
 * passed through, so they stay incomplete here.
 */
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUDA_MEMCPY2D_st CUDA_MEMCPY2D;
typedef struct CUDA_MEMCPY3D_st CUDA_MEMCPY3D;
typedef struct CUDA_MEMCPY3D_PEER_st CUDA_MEMCPY3D_PEER;
typedef union CUstreamBatchMemOpParams_union CUstreamBatchMemOpParams;
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData);
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream);
CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *pCopy, CUstream hStream);
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *pCopy);
CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *pCopy);
CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *pCopy, CUstream hStream);
CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *pCopy, CUstream hStream);
CUresult cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER *pCopy);
CUresult cuMemcpy3DPeer_ptds(const CUDA_MEMCPY3D_PEER *pCopy);
CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream);
CUresult cuMemcpy3DPeerAsync_ptsz(const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream);
CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                      size_t ByteCount);
CUresult cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                           size_t ByteCount);
CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                           size_t ByteCount, CUstream hStream);
CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                CUcontext srcContext, size_t ByteCount, CUstream hStream);
CUresult cuMemsetD2D8_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height);
CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height);
CUresult cuMemsetD2D16_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height);
CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
                               size_t Height);
CUresult cuMemsetD2D32_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height);
CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height);
CUresult cuMemsetD2D8Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height,
                           CUstream hStream);
CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width,
                                size_t Height, CUstream hStream);
CUresult cuMemsetD2D16Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height,
                            CUstream hStream);
CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
                                 size_t Height, CUstream hStream);
CUresult cuMemsetD2D32Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height,
                            CUstream hStream);
CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width,
                                 size_t Height, CUstream hStream);
CUresult cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
CUresult cuStreamWriteValue32_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
CUresult cuStreamWriteValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags);
CUresult cuStreamWriteValue64_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags);
CUresult cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
CUresult cuStreamWaitValue32_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
CUresult cuStreamWaitValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags);
CUresult cuStreamWaitValue64_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags);
CUresult cuStreamBatchMemOp_v2(CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray,
                               unsigned int flags);
CUresult cuStreamBatchMemOp_v2_ptsz(CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray,
                                    unsigned int flags);

/* ---- logging ---- */
GC_HIDDEN void gc_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
GC_HIDDEN void gc_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
GC_HIDDEN extern int gc_log_debug;

/* ---- table.c: buffer table ---- */

/* Kinds are the protocol's AllocKind values. */
enum { GC_KIND_MEM_ALLOC = 1, GC_KIND_PITCH = 2, GC_KIND_ASYNC = 3, GC_KIND_VMM = 4, GC_KIND_SLAB = 5 };

typedef struct gc_buf {
    uint64_t addr, size; /* what the application was handed */
    uint64_t alloc_id;   /* the helper allocation holding it; 0: local memory (fallback) */
    int32_t kind, dev;
} gc_buf;

typedef struct gc_btab {
    struct gc_btab *retired_next;
    uint64_t lo, hi; /* lowest start, highest end: a cheap filter for lookups */
    size_t n;
    gc_buf v[];
} gc_btab;

typedef struct gc_table {
    _Atomic(gc_btab *) cur; /* never NULL after gt_init */
    gc_btab *retired;       /* replaced snapshots; freed by gt_reclaim when nobody can read them */
    size_t nretired;
} gc_table;

/* Writers (gt_insert/gt_remove/gt_reclaim) are serialized by the caller's mutex. */
GC_HIDDEN int gt_init(gc_table *t);
GC_HIDDEN int gt_insert(gc_table *t, const gc_buf *b); /* 0; -1 no memory; -2 overlaps */
GC_HIDDEN int gt_remove(gc_table *t, uint64_t addr, gc_buf *out); /* exact start; 0 or -1 */
/* Sets every entry's alloc_id to fn(entry) (one new snapshot if any changes). 0; -1 no memory. */
GC_HIDDEN int gt_relabel(gc_table *t, uint64_t (*fn)(const gc_buf *b, void *arg), void *arg);
GC_HIDDEN void gt_reclaim(gc_table *t);
GC_HIDDEN void gt_destroy(gc_table *t);
/* Lock-free: the buffer holding addr in snapshot s, or NULL. */
GC_HIDDEN const gc_buf *gt_find(const gc_btab *s, uint64_t addr);
static inline const gc_btab *gt_snap(gc_table *t) { return atomic_load_explicit(&t->cur, memory_order_acquire); }

/* ---- table.c: slab bitmap (256-byte units) ---- */
#define GC_SLAB_UNIT 256ULL

typedef struct gc_slab {
    uint64_t base, size; /* the slab's helper allocation as mapped here */
    uint32_t nunits, used;
    uint64_t *bits;
    void *owner; /* client.c: its allocation record */
    struct gc_slab *next;
} gc_slab;

GC_HIDDEN gc_slab *slab_new(uint64_t base, uint64_t size);
GC_HIDDEN void slab_free(gc_slab *s);
GC_HIDDEN int64_t slab_take(gc_slab *s, uint64_t size); /* offset (256-aligned) or -1 */
GC_HIDDEN void slab_give(gc_slab *s, uint64_t off, uint64_t size);

/* ---- scan.c: counters, layouts, scanning ---- */
enum gc_stat {
    STAT_ALLOCS,
    STAT_FREES,
    STAT_LOCAL_ALLOCS,
    STAT_LAUNCHES,
    STAT_LAUNCH_HITS,
    STAT_PTR_WORDS,
    STAT_NO_LAYOUT,
    STAT_COPIES,
    STAT_MEMSETS,
    STAT_MODULES,
    STAT_STREAMS,
    STAT_EVENTS,
    STAT_GATE_WAITS,
    STAT_SCANNED,
    STAT_N
};

GC_HIDDEN void gc_stat_add(enum gc_stat s, uint64_t v);
GC_HIDDEN void gc_stats_sum(uint64_t out[STAT_N]);
GC_HIDDEN void gc_stats_reset(void); /* fork child */

typedef CUresult (*gc_paraminfo_fn)(void *h, size_t idx, size_t *off, size_t *size);
/* cuFuncGetParamInfo and cuKernelGetParamInfo (either may be NULL). */
GC_HIDDEN void gc_scan_set_query(gc_paraminfo_fn func, gc_paraminfo_fn kern);

typedef struct gc_layout {
    uint64_t gen;
    uint32_t n;
    int ok; /* 0: the driver gave no layout for this handle */
    uint32_t size[];
} gc_layout;

GC_HIDDEN const gc_layout *gc_layout_get(void *handle, bool *owned);
GC_HIDDEN void gc_layout_invalidate(void); /* module/library unloaded: handles may be reused */
GC_HIDDEN void gc_layout_reclaim(void);    /* no launch in progress */
GC_HIDDEN uint64_t gc_layout_count(void);
GC_HIDDEN void gc_layout_reset(void);

/* Scans one launch's parameters against the snapshot; counts. Returns the pointer words found. */
GC_HIDDEN unsigned gc_scan_launch(const gc_btab *s, void *f, void **kernelParams, void **extra);
/* Scans a byte range word by word (8-byte aligned words). */
GC_HIDDEN unsigned gc_scan_words(const gc_btab *s, const void *p, size_t len);

/* ---- client.c ---- */
GC_HIDDEN void gc_client_ensure(void); /* connect on first need */
GC_HIDDEN bool gc_client_tracking(void);
/* *use_real: the caller calls the driver's own allocator (then gc_track_local on success). */
GC_HIDDEN CUresult gc_alloc(CUdeviceptr *dptr, size_t size, int kind, bool *use_real);
GC_HIDDEN void gc_track_local(CUdeviceptr p, size_t size, int kind);
GC_HIDDEN int gc_free(CUdeviceptr p, bool async, CUstream stream, CUresult *res); /* 1 handled, 0 not ours */
GC_HIDDEN int gc_addr_range(CUdeviceptr p, CUdeviceptr *base, size_t *size);     /* 1 ours */
GC_HIDDEN bool gc_is_helper_mem(CUdeviceptr p);
GC_HIDDEN void gc_note_reason(int reason);
GC_HIDDEN void gc_note_module(const void *image, size_t len);
GC_HIDDEN void gc_note_module_file(const char *path);
GC_HIDDEN void gc_client_atfork_prepare(void);
GC_HIDDEN void gc_client_atfork_parent(void);
GC_HIDDEN void gc_client_atfork_child(void);
GC_HIDDEN const gc_btab *gc_buffers(void);
enum {
    GC_REASON_MANAGED = 1,
    GC_REASON_APP_VMM = 2, /* cuMemCreate passed through (unsupported prop, or no helper) */
    GC_REASON_LOCAL = 4,
    GC_REASON_CONTROL = 8,
    GC_REASON_FOREIGN = 16, /* the application imported a shareable handle */
    GC_REASON_EXPORT = 32,  /* the application exported helper-backed VMM memory */
};

/* client.c, for vmm.c. */
#define GC_FALLBACK ((CUresult)-1)
GC_HIDDEN void gc_lock(void); /* the client mutex: bookkeeping, the buffer table */
GC_HIDDEN void gc_unlock(void);
GC_HIDDEN bool gc_client_up(void);
GC_HIDDEN const char *gc_dev_uuid(int dev);
GC_HIDDEN void gc_note_context(void);
/* Alloc on the calls connection: CUDA_SUCCESS (*fd to close), GC_FALLBACK, or an error for the app. */
/* forkscrub.c: forked children give up the driver's files (CRIU cannot dump
 * them); around the application's cuInit. */
GC_HIDDEN void gc_forkscrub_before_init(void);
GC_HIDDEN void gc_forkscrub_after_init(bool ok);

GC_HIDDEN CUresult gc_helper_alloc(const char *uuid, uint64_t size, int kind, bool gpu_direct_rdma, uint64_t *id,
                                   uint64_t *rsize, int *fd);
GC_HIDDEN void gc_send_mapped(uint64_t id, uint64_t addr);
GC_HIDDEN void gc_send_free(uint64_t id);
/* With gc_lock held: buffer table insert/remove with the live counters; helper bytes. */
GC_HIDDEN int gc_buf_insert(const gc_buf *b);
GC_HIDDEN void gc_buf_remove(uint64_t addr);
GC_HIDDEN void gc_helper_bytes_add(int64_t d);

/* ---- vmm.c (the gc_vmm_* calls with gc_lock held) ---- */
typedef struct gc_vmm_info {
    uint64_t id, addr, size;
    int dev;
} gc_vmm_info;
/* Drop: unmaps and releases every allocation the helper can give back; first error in *bad. */
GC_HIDDEN void gc_vmm_drop(CUresult *bad);
/*
 * Reimport entry, matched by address (the allocation's announced offset-0 mapping); the record adopts id.
 * 1 done, 0 not a VMM allocation of ours, -1 mismatch (msg), -2 driver error (msg).
 */
GC_HIDDEN int gc_vmm_reimport(uint64_t id, uint64_t addr, uint64_t size, int fd, char *msg, size_t msglen);
/* The alloc_id of the VMM allocation mapped at addr (0: none). */
GC_HIDDEN uint64_t gc_vmm_id_at(uint64_t addr);
GC_HIDDEN bool gc_vmm_all_imported(void);
GC_HIDDEN size_t gc_vmm_list(gc_vmm_info *out, size_t max); /* returns the count; fills up to max */
GC_HIDDEN void gc_vmm_atfork_child(void);

/* ---- interpose.c ---- */
GC_HIDDEN void *gc_real(int idx);
GC_HIDDEN void gc_resolve(void);
/* The gate. */
GC_HIDDEN void gc_gate_enter(void);
GC_HIDDEN void gc_gate_leave(void);
GC_HIDDEN int gc_gate_close(unsigned timeout_ms); /* 0 or -ETIMEDOUT (gate reopened) */
GC_HIDDEN void gc_gate_open(void);
GC_HIDDEN void gc_gate_reset(void);
GC_HIDDEN extern __thread int gc_in_control __attribute__((tls_model("initial-exec")));

/* The driver's entry point, by name (resolved on first use). */
#define GC_REAL(name) ((__typeof__(&name))gc_real(SYM_##name))

/* Passed through behind the gate only (interpose.c). */
#define GC_GATED_SYMS(X)                                                                                              \
    X(cuGraphLaunch)                                                                                                  \
    X(cuGraphLaunch_ptsz)                                                                                             \
    X(cuLaunchHostFunc)                                                                                               \
    X(cuLaunchHostFunc_ptsz)                                                                                          \
    X(cuMemcpy2D_v2)                                                                                                  \
    X(cuMemcpy2D_v2_ptds)                                                                                             \
    X(cuMemcpy2DUnaligned_v2)                                                                                         \
    X(cuMemcpy2DUnaligned_v2_ptds)                                                                                    \
    X(cuMemcpy2DAsync_v2)                                                                                             \
    X(cuMemcpy2DAsync_v2_ptsz)                                                                                        \
    X(cuMemcpy3D_v2)                                                                                                  \
    X(cuMemcpy3D_v2_ptds)                                                                                             \
    X(cuMemcpy3DAsync_v2)                                                                                             \
    X(cuMemcpy3DAsync_v2_ptsz)                                                                                        \
    X(cuMemcpy3DPeer)                                                                                                 \
    X(cuMemcpy3DPeer_ptds)                                                                                            \
    X(cuMemcpy3DPeerAsync)                                                                                            \
    X(cuMemcpy3DPeerAsync_ptsz)                                                                                       \
    X(cuMemcpyPeer)                                                                                                   \
    X(cuMemcpyPeer_ptds)                                                                                              \
    X(cuMemcpyPeerAsync)                                                                                              \
    X(cuMemcpyPeerAsync_ptsz)                                                                                         \
    X(cuMemsetD2D8_v2)                                                                                                \
    X(cuMemsetD2D8_v2_ptds)                                                                                           \
    X(cuMemsetD2D16_v2)                                                                                               \
    X(cuMemsetD2D16_v2_ptds)                                                                                          \
    X(cuMemsetD2D32_v2)                                                                                               \
    X(cuMemsetD2D32_v2_ptds)                                                                                          \
    X(cuMemsetD2D8Async)                                                                                              \
    X(cuMemsetD2D8Async_ptsz)                                                                                         \
    X(cuMemsetD2D16Async)                                                                                             \
    X(cuMemsetD2D16Async_ptsz)                                                                                        \
    X(cuMemsetD2D32Async)                                                                                             \
    X(cuMemsetD2D32Async_ptsz)                                                                                        \
    X(cuStreamWriteValue32_v2)                                                                                        \
    X(cuStreamWriteValue32_v2_ptsz)                                                                                   \
    X(cuStreamWriteValue64_v2)                                                                                        \
    X(cuStreamWriteValue64_v2_ptsz)                                                                                   \
    X(cuStreamWaitValue32_v2)                                                                                         \
    X(cuStreamWaitValue32_v2_ptsz)                                                                                    \
    X(cuStreamWaitValue64_v2)                                                                                         \
    X(cuStreamWaitValue64_v2_ptsz)                                                                                    \
    X(cuStreamBatchMemOp_v2)                                                                                          \
    X(cuStreamBatchMemOp_v2_ptsz)

#define GC_SYMS(X)                                                                                                 \
    X(cuInit)                                                                                                      \
    X(cuGetProcAddress)                                                                                            \
    X(cuGetProcAddress_v2)                                                                                         \
    X(cuMemAlloc_v2)                                                                                               \
    X(cuMemAllocPitch_v2)                                                                                          \
    X(cuMemFree_v2)                                                                                                \
    X(cuMemAllocAsync)                                                                                             \
    X(cuMemAllocAsync_ptsz)                                                                                        \
    X(cuMemFreeAsync)                                                                                              \
    X(cuMemFreeAsync_ptsz)                                                                                         \
    X(cuMemAllocFromPoolAsync)                                                                                     \
    X(cuMemAllocFromPoolAsync_ptsz)                                                                                \
    X(cuMemGetAddressRange_v2)                                                                                     \
    X(cuMemAllocManaged)                                                                                           \
    X(cuIpcGetMemHandle)                                                                                           \
    X(cuMemCreate)                                                                                                 \
    X(cuMemRelease)                                                                                                \
    X(cuMemMap)                                                                                                    \
    X(cuMemUnmap)                                                                                                  \
    X(cuMemSetAccess)                                                                                              \
    X(cuMemRetainAllocationHandle)                                                                                 \
    X(cuMemGetAllocationPropertiesFromHandle)                                                                      \
    X(cuMemExportToShareableHandle)                                                                                \
    X(cuMemImportFromShareableHandle)                                                                              \
    X(cuLaunchKernel)                                                                                              \
    X(cuLaunchKernel_ptsz)                                                                                         \
    X(cuLaunchKernelEx)                                                                                            \
    X(cuLaunchKernelEx_ptsz)                                                                                       \
    X(cuLaunchCooperativeKernel)                                                                                   \
    X(cuLaunchCooperativeKernel_ptsz)                                                                              \
    X(cuMemcpyHtoD_v2)                                                                                             \
    X(cuMemcpyDtoH_v2)                                                                                             \
    X(cuMemcpyDtoD_v2)                                                                                             \
    X(cuMemcpy)                                                                                                    \
    X(cuMemcpyHtoD_v2_ptds)                                                                                        \
    X(cuMemcpyDtoH_v2_ptds)                                                                                        \
    X(cuMemcpyDtoD_v2_ptds)                                                                                        \
    X(cuMemcpy_ptds)                                                                                               \
    X(cuMemcpyHtoDAsync_v2)                                                                                        \
    X(cuMemcpyDtoHAsync_v2)                                                                                        \
    X(cuMemcpyDtoDAsync_v2)                                                                                        \
    X(cuMemcpyAsync)                                                                                               \
    X(cuMemcpyHtoDAsync_v2_ptsz)                                                                                   \
    X(cuMemcpyDtoHAsync_v2_ptsz)                                                                                   \
    X(cuMemcpyDtoDAsync_v2_ptsz)                                                                                   \
    X(cuMemcpyAsync_ptsz)                                                                                          \
    X(cuMemsetD8_v2)                                                                                               \
    X(cuMemsetD16_v2)                                                                                              \
    X(cuMemsetD32_v2)                                                                                              \
    X(cuMemsetD8_v2_ptds)                                                                                          \
    X(cuMemsetD16_v2_ptds)                                                                                         \
    X(cuMemsetD32_v2_ptds)                                                                                         \
    X(cuMemsetD8Async)                                                                                             \
    X(cuMemsetD16Async)                                                                                            \
    X(cuMemsetD32Async)                                                                                            \
    X(cuMemsetD8Async_ptsz)                                                                                        \
    X(cuMemsetD16Async_ptsz)                                                                                       \
    X(cuMemsetD32Async_ptsz)                                                                                       \
    X(cuModuleLoad)                                                                                                \
    X(cuModuleLoadData)                                                                                            \
    X(cuModuleLoadDataEx)                                                                                          \
    X(cuModuleUnload)                                                                                              \
    X(cuLibraryLoadData)                                                                                           \
    X(cuLibraryLoadFromFile)                                                                                       \
    X(cuLibraryUnload)                                                                                             \
    X(cuStreamCreate)                                                                                              \
    X(cuStreamCreateWithPriority)                                                                                  \
    X(cuEventCreate)                                                                                               \
    GC_GATED_SYMS(X)

/* Not wrapped: resolved for the interposer's own use. */
#define GC_INTERNAL_SYMS(X)                                                                                        \
    X(cuCtxGetDevice)                                                                                              \
    X(cuCtxGetCurrent)                                                                                             \
    X(cuCtxSetCurrent)                                                                                             \
    X(cuCtxSynchronize)                                                                                            \
    X(cuDeviceGetUuid_v2)                                                                                          \
    X(cuMemGetAllocationGranularity)                                                                               \
    X(cuMemAddressReserve)                                                                                         \
    X(cuMemAddressFree)                                                                                            \
    X(cuEventRecord)                                                                                               \
    X(cuEventQuery)                                                                                                \
    X(cuEventSynchronize)                                                                                          \
    X(cuEventDestroy_v2)                                                                                           \
    X(cuStreamSynchronize)                                                                                         \
    X(cuFuncGetParamInfo)                                                                                          \
    X(cuKernelGetParamInfo)

#define GC_SYM_ENUM(n) SYM_##n,
enum { GC_SYMS(GC_SYM_ENUM) SYM_NWRAPPED, SYM_INTERNAL_BEFORE = SYM_NWRAPPED - 1, GC_INTERNAL_SYMS(GC_SYM_ENUM) SYM_NALL };

#endif

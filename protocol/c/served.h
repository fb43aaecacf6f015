/*
 * Served mode's shared memory (docs/served-mode.md): the layout that the
 * served-mode client library (intercept/served, the application's
 * libcuda.so.1) and the worker's executor (helper/served/exec.c) both map.
 *
 * The client makes one memfd of sizeof(struct sv_shared), sealed against
 * shrinking, and sends it over the socket the helper gave it (SCM_RIGHTS,
 * with struct sv_hello); the worker checks its size, seals and version,
 * maps it and answers struct sv_welcome. From then on:
 *
 * - ring: a byte ring of variable-length records (struct sv_rec, then the
 *   op's payload), each a multiple of SV_REC_ALIGN bytes and never wrapping
 *   (a SV_OP_PAD record fills the end). Application threads take turns as
 *   producers (a lock in the client); head counts the bytes published
 *   (client), tail those consumed (worker). One worker thread runs the
 *   records in order, so calls keep the order the application made them in.
 * - replies: a synchronous call claims a reply slot, names it in its record
 *   (reply = slot + 1), and waits for state to become SV_DONE.
 * - stage: copy data, in chunks of at most SV_STAGE_BYTES, one slot each.
 *
 * Waiting on either side: spin briefly, then announce the wait in a flag,
 * fence, look again, and futex-wait (with a timeout, to notice the other
 * side's death on the socket). The other side stores, fences and wakes only
 * if the flag is set, so an enqueue is a syscall only when the worker parked.
 *
 * Nothing the worker reads here is trusted: every offset, length, id, count
 * and slot number is checked before it is used, after it was copied out of
 * the shared memory (the client may change it at any time).
 */
#ifndef GPUCR_PROTOCOL_SERVED_H
#define GPUCR_PROTOCOL_SERVED_H

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SV_MAGIC 0x31565347u /* "GSV1" */
#define SV_VERSION 4u

#define SV_RING_BYTES (4u << 20)  /* the record ring */
#define SV_NREPLY 64u             /* reply slots: synchronous calls in flight at once */
#define SV_REPLY_DATA 4096u       /* the most a reply carries */
#define SV_NSTAGE 16u             /* staging slots */
#define SV_STAGE_BYTES (1u << 20) /* one staging slot: a copy's chunk */
#define SV_REC_ALIGN 16u
#define SV_MAX_PARAM_BYTES 32768u /* kernel parameters (CUDA allows 32764) */
#define SV_MAX_PARAMS 511u        /* what a layout reply holds */
#define SV_MAX_IMAGE (1ull << 31) /* a module or library image */
#define SV_MAX_NAME 4096u         /* a kernel's (mangled) name, NUL included */
#define SV_MAX_JIT 16u            /* JIT options of cuLibraryLoadData */
#define SV_MAX_ACCESS 8u          /* access descriptors of cuMemSetAccess */
#define SV_MAX_PTR_ATTRS 32u      /* attributes of one pointer-attribute record */
#define SV_MAX_VMM_HANDLES                                                                                             \
    (1u << 16) /* VMM handles a worker holds for its process at once (made, imported, retained) */

/* Virtual handles: the kinds, and how many of each a process may hold at once. */
enum sv_kind {
    SV_K_MODULE = 0,
    SV_K_FUNC,
    SV_K_LIBRARY,
    SV_K_KERNEL,
    SV_K_STREAM,
    SV_K_EVENT,
    SV_K_GRAPH,
    SV_K_EXEC,
    /* cuBLAS and cuBLASLt (intercept/blas): their handles, matmul descriptors, matrix layouts, preferences */
    SV_K_BLAS,
    SV_K_LT,
    SV_K_LT_DESC,
    SV_K_LT_LAYOUT,
    SV_K_LT_PREF,
    SV_K_COUNT
};
#define SV_CAP_MODULE (1u << 14)
#define SV_CAP_FUNC (1u << 16)
#define SV_CAP_LIBRARY (1u << 14)
#define SV_CAP_KERNEL (1u << 16)
#define SV_CAP_STREAM (1u << 14)
#define SV_CAP_EVENT (1u << 16)
#define SV_CAP_GRAPH (1u << 12)
#define SV_CAP_EXEC (1u << 12)
#define SV_CAP_BLAS (1u << 10)
#define SV_CAP_LT (1u << 10)
#define SV_CAP_LT_DESC (1u << 12)
#define SV_CAP_LT_LAYOUT (1u << 14)
#define SV_CAP_LT_PREF (1u << 12)
/* The last ids of cuBLASLt's descriptors, layouts and preferences are never handed out to the application: a
 * capture's record of a product names them instead, with the objects made and destroyed around it, so that
 * capturing it again in another worker needs none of the application's objects, which are often gone by then. */
#define SV_LT_SCRATCH 8u
static inline uint32_t sv_cap(unsigned kind) {
    static const uint32_t caps[SV_K_COUNT] = {
        SV_CAP_MODULE, SV_CAP_FUNC, SV_CAP_LIBRARY, SV_CAP_KERNEL,  SV_CAP_STREAM,    SV_CAP_EVENT,  SV_CAP_GRAPH,
        SV_CAP_EXEC,   SV_CAP_BLAS, SV_CAP_LT,      SV_CAP_LT_DESC, SV_CAP_LT_LAYOUT, SV_CAP_LT_PREF};
    return kind < SV_K_COUNT ? caps[kind] : 0;
}
/* The ids of kind the client hands out: below this (SV_LT_SCRATCH). */
static inline uint32_t sv_cap_client(unsigned kind) {
    bool lt = kind == SV_K_LT_DESC || kind == SV_K_LT_LAYOUT || kind == SV_K_LT_PREF;
    return sv_cap(kind) - (lt ? SV_LT_SCRATCH : 0);
}
/* A stream in a record: the NULL stream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, else a stream id (>= 3). */
#define SV_STREAM_NULL 0u
#define SV_STREAM_LEGACY 1u
#define SV_STREAM_PER_THREAD 2u
#define SV_STREAM_FIRST_ID 3u

/* Reply and staging slot states (futex words). */
enum { SV_FREE = 0, SV_PENDING = 1, SV_DONE = 2 };

struct sv_header {
    uint32_t magic, version;
    uint64_t total; /* sizeof(struct sv_shared) */
    int32_t client_pid;
    uint32_t pad0;
    _Alignas(64) _Atomic uint64_t head;      /* bytes published (client) */
    _Alignas(64) _Atomic uint64_t tail;      /* bytes consumed (worker) */
    _Alignas(64) _Atomic uint32_t wsleep;    /* the worker parked, or is about to */
    _Atomic uint32_t wseq;                   /* its futex word */
    _Alignas(64) _Atomic uint32_t room_wait; /* a producer waits for room in the ring */
    _Atomic uint32_t room_seq;
    _Alignas(64) _Atomic uint32_t stage_wait; /* a thread waits for a free staging slot */
    _Atomic uint32_t stage_seq;
    /* The first failure of an asynchronous call (CUresult, 0: none) and its op: the next synchronizing call
     * returns it (the worker sets it, the client takes it). */
    _Alignas(64) _Atomic int32_t deferred;
    _Atomic uint32_t deferred_op;
};

struct sv_reply {
    _Alignas(64) _Atomic uint32_t state; /* SV_PENDING (client) -> SV_DONE (worker) */
    _Atomic uint32_t waiting;            /* the client sleeps on state */
    int32_t result;                      /* CUresult */
    uint32_t len;                        /* bytes of data */
    uint8_t data[SV_REPLY_DATA];
};

struct sv_stagehdr {
    /* SV_FREE; SV_PENDING: the client's (filling it, or waiting for data); SV_DONE: data for the client */
    _Alignas(64) _Atomic uint32_t state;
    _Atomic uint32_t waiting;
    int32_t result;
    uint32_t len;
};

struct sv_shared {
    struct sv_header h;
    struct sv_reply reply[SV_NREPLY];
    struct sv_stagehdr stagehdr[SV_NSTAGE];
    _Alignas(4096) uint8_t ring[SV_RING_BYTES];
    _Alignas(4096) uint8_t stage[SV_NSTAGE][SV_STAGE_BYTES];
};

/* The socket handshake: the client's hello (the memfd attached), the worker's answer. */
struct sv_hello {
    uint32_t magic, version;
    uint64_t total;
    int32_t client_pid;
    uint32_t pad;
};
struct sv_welcome {
    uint32_t magic, version;
    int32_t result; /* CUresult: 0, or why the worker refuses (then err says it) */
    int32_t worker_pid;
    char err[240];
};

/* ---- records ---- */

struct sv_rec {
    uint16_t op;
    uint16_t flags;
    uint32_t len;   /* the whole record, header included: a multiple of SV_REC_ALIGN */
    uint32_t reply; /* reply slot + 1; 0: none (an asynchronous call) */
    uint32_t pad;
};
/* A record of a group that one reply answers (a synchronous copy's chunks, an image's chunks before its load):
 * its failure is kept in the reply slot, and the group's last record (without the flag) answers. */
#define SV_F_GROUP 0x1u

enum sv_op {
    SV_OP_PAD = 0,
    SV_OP_QUERY,
    SV_OP_PRIMARY_SET_FLAGS,
    SV_OP_CTX_SYNC,
    SV_OP_MEM_ALLOC,
    SV_OP_MEM_ALLOC_PITCH,
    SV_OP_MEM_FREE,
    SV_OP_MEM_RANGE,
    SV_OP_MEM_ALLOC_ASYNC,
    SV_OP_MEM_FREE_ASYNC,
    SV_OP_HTOD,
    SV_OP_DTOH,
    SV_OP_DTOD,
    SV_OP_MEMSET,
    SV_OP_STREAM_CREATE,
    SV_OP_STREAM_DESTROY,
    SV_OP_STREAM_SYNC,
    SV_OP_STREAM_QUERY,
    SV_OP_STREAM_WAIT_EVENT,
    SV_OP_STREAM_BEGIN_CAPTURE,
    SV_OP_STREAM_END_CAPTURE,
    SV_OP_STREAM_MEMOP,
    SV_OP_EVENT_CREATE,
    SV_OP_EVENT_DESTROY,
    SV_OP_EVENT_RECORD,
    SV_OP_EVENT_QUERY,
    SV_OP_EVENT_SYNC,
    SV_OP_EVENT_ELAPSED,
    SV_OP_IMAGE_CHUNK,
    SV_OP_MODULE_LOAD,
    SV_OP_MODULE_UNLOAD,
    SV_OP_MODULE_GET_FUNCTION,
    SV_OP_LIBRARY_LOAD,
    SV_OP_LIBRARY_UNLOAD,
    SV_OP_LIBRARY_GET_KERNEL,
    SV_OP_KERNEL_GET_FUNCTION,
    SV_OP_LAUNCH,
    SV_OP_GRAPH_INSTANTIATE,
    SV_OP_GRAPH_LAUNCH,
    SV_OP_GRAPH_EXEC_DESTROY,
    SV_OP_GRAPH_DESTROY,
    SV_OP_VMM_GRANULARITY,
    SV_OP_VMM_RESERVE,
    SV_OP_VMM_ADDR_FREE,
    SV_OP_VMM_CREATE,
    SV_OP_VMM_RELEASE,
    SV_OP_VMM_MAP,
    SV_OP_VMM_UNMAP,
    SV_OP_VMM_SET_ACCESS,
    SV_OP_VMM_IMPORT,
    SV_OP_VMM_EXPORT,
    SV_OP_VMM_RETAIN,
    SV_OP_VMM_PROPS,
    SV_OP_FUNC_ATTR,
    SV_OP_GET_GLOBAL,
    SV_OP_STREAM_CREATE_PRIO,
    SV_OP_CAPTURE_INFO,
    SV_OP_CAPTURE_MODE,
    SV_OP_POINTER_ATTRS,
    SV_OP_CTX_LIMIT,
    SV_OP_GRAPH_NODES, /* sv_id_rec: the graph; reply: uint64 its number of nodes */
    /* cuBLAS and cuBLASLt (below: struct sv_blas_load ...) */
    SV_OP_BLAS_LOAD,
    SV_OP_BLAS_CREATE,
    SV_OP_BLAS_DESTROY,
    SV_OP_BLAS_SET,
    SV_OP_BLAS_GEMM,
    SV_OP_LT_CREATE,
    SV_OP_LT_DESTROY,
    SV_OP_LT_OBJ_CREATE,
    SV_OP_LT_OBJ_DESTROY,
    SV_OP_LT_OBJ_SET,
    SV_OP_LT_OBJ_GET,
    SV_OP_LT_HEURISTIC,
    SV_OP_LT_MATMUL,
    SV_OP_BLAS_GEMV,
    SV_OP_BLAS_DOT,
    SV_OP_BLAS_CALL,
    SV_OP_COUNT
};

/* SV_OP_QUERY: what, and its reply's data. */
enum sv_query {
    SV_Q_NAME = 1,       /* string */
    SV_Q_ATTR,           /* arg: the attribute; int32 */
    SV_Q_BUSID,          /* string */
    SV_Q_TOTALMEM,       /* uint64 */
    SV_Q_UUID,           /* 16 bytes */
    SV_Q_DRIVER_VERSION, /* int32 */
    SV_Q_MEMINFO,        /* uint64 free, total */
    SV_Q_PRIMARY_STATE,  /* uint32 flags, int32 active */
    SV_Q_PRIO_RANGE,     /* int32 least, greatest (cuCtxGetStreamPriorityRange) */
    SV_Q_COUNT
};
struct sv_query_rec {
    uint32_t what;
    int32_t arg;
};
struct sv_u64_rec {
    uint64_t v;
};
struct sv_pitch_rec {
    uint64_t width, height;
    uint32_t elem, pad;
};
struct sv_mem_async_rec {
    uint64_t v; /* size (alloc) or pointer (free) */
    uint32_t stream, pad;
};
/* SV_OP_HTOD / SV_OP_DTOH: one chunk through staging slot stage. */
struct sv_copy_rec {
    uint64_t dev;
    uint32_t stream, stage, len, async;
};
struct sv_dtod_rec {
    uint64_t dst, src, len;
    uint32_t stream, async;
};
struct sv_memset_rec {
    uint64_t dst, n;
    uint32_t val, elem, stream, async;
};
struct sv_id_rec {
    uint32_t id, flags; /* flags: of a creation */
};
struct sv_pair_rec {
    uint32_t a, b; /* stream and event, event and stream, ... as each op says */
    uint32_t flags, pad;
};
/* SV_OP_EVENT_RECORD: a the event, b the stream, flags cuEventRecordWithFlags's (0: cuEventRecord).
 * SV_OP_STREAM_CREATE_PRIO: a the stream's id, b its priority (int32), flags its flags. */
struct sv_memop_rec {
    uint64_t addr, value;
    uint32_t stream, kind, flags, pad; /* kind: 0 write32, 1 write64, 2 wait32, 3 wait64 */
};
struct sv_image_rec {
    uint64_t off, total;
    uint32_t stage, len;
};
struct sv_load_rec {
    uint64_t size;
    uint32_t id, njit;
    uint32_t jit_opt[SV_MAX_JIT];
    uint64_t jit_val[SV_MAX_JIT];
};
/* SV_OP_MODULE_GET_FUNCTION (id: the function, owner: the module), SV_OP_LIBRARY_GET_KERNEL (id: the kernel,
 * owner: the library), SV_OP_KERNEL_GET_FUNCTION (id: the function, owner: the kernel; no name). The name,
 * NUL-terminated, follows. The reply: struct sv_layout. */
struct sv_get_rec {
    uint32_t id, owner;
};
struct sv_layout {
    uint32_t n, bytes;
    struct {
        uint32_t off, size;
    } p[SV_MAX_PARAMS];
};
/* SV_OP_LAUNCH: nbytes of parameters follow, laid out as the function's layout says (extra == 0), or the
 * buffer of CU_LAUNCH_PARAM_BUFFER_POINTER as the application gave it (extra == 1). */
struct sv_launch_rec {
    uint32_t func, kernel; /* kernel: func names a kernel (a CUkernel launched as a function) */
    uint32_t grid[3], block[3];
    uint32_t shmem, stream, extra, cooperative, nbytes, pad;
};
/* SV_OP_FUNC_ATTR: a function's (kernel: func names a kernel, as in a launch) attribute got or set, its cache
 * preference set, or its occupancy asked. The reply: int32 (the attribute, or the blocks). */
enum { SV_FA_GET = 0, SV_FA_SET, SV_FA_CACHE, SV_FA_OCCUPANCY };
struct sv_func_attr_rec {
    uint32_t func, kernel;
    uint32_t what;  /* SV_FA_* */
    int32_t attr;   /* CUfunction_attribute; the block size for SV_FA_OCCUPANCY */
    int32_t value;  /* the value set, the cache preference */
    uint32_t flags; /* occupancy's */
    uint64_t dyn;   /* occupancy's dynamic shared memory */
};
/* SV_OP_GET_GLOBAL: owner a module (library 0) or a library (1); the name, NUL-terminated, follows. The reply:
 * uint64 address, bytes. */
struct sv_global_rec {
    uint32_t owner, library;
};
/* SV_OP_CAPTURE_INFO: struct sv_id_rec (id: the stream); the reply struct sv_capture_info.
 * SV_OP_CAPTURE_MODE: struct sv_id_rec (id: the mode), asynchronous: the worker thread's capture mode. */
struct sv_capture_info {
    uint32_t status, pad;
    uint64_t id;
};
/* SV_OP_POINTER_ATTRS: n attributes of ptr (single: cuPointerGetAttribute's semantics). The reply: one uint64 per
 * attribute, its value in the low bytes; a context is SV_PTR_CTX_OURS (the worker's, the application's primary
 * one) or 0, a device ordinal the application's. */
#define SV_PTR_CTX_OURS 1u
struct sv_ptr_rec {
    uint64_t ptr;
    uint32_t n, single;
    uint32_t attr[SV_MAX_PTR_ATTRS];
};
/* SV_OP_CTX_LIMIT: cuCtxSetLimit (set) or cuCtxGetLimit; the reply: uint64 (the limit). */
struct sv_limit_rec {
    uint32_t limit, set;
    uint64_t value;
};
struct sv_graph_rec {
    uint32_t exec, graph;
    uint64_t flags;
};
struct sv_vmm_rec {
    uint64_t a, b, c, d, e; /* as each op says: ptr, size, alignment or offset, address or handle, flags */
    uint32_t loc_type, handle_types;
    int32_t loc_id;
    uint32_t option;
};
struct sv_access_rec {
    uint64_t ptr, size;
    uint32_t count, pad;
    struct {
        uint32_t loc_type;
        int32_t loc_id;
        uint32_t flags;
    } d[SV_MAX_ACCESS];
};

/*
 * cuBLAS and cuBLASLt, forwarded at their own boundary (docs/served-mode.md): the application's libcublas.so.13
 * and libcublasLt.so.13 are gpucr's (intercept/blas), and the worker runs NVIDIA's. Each handle, descriptor,
 * layout and preference is a virtual id of its kind; device pointers travel as they are; host scalars by value.
 * The synchronous ones answer a cublasStatus_t as the reply's first int32 (the reply's result is the transport's);
 * an asynchronous one's failure is deferred as CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_INVALID_VALUE, ...
 *
 * SV_OP_BLAS_LOAD (synchronous): which library (0 cuBLAS, 1 cuBLASLt), from the file whose path follows,
 * NUL-terminated (the one the application would have loaded); the worker loads it once, as the process's user.
 */
#define SV_BLAS_PATH_MAX 4096u
/* After the path: the process's settings of the libraries, NUL-terminated NAME=VALUE strings (at most this many
 * bytes): cuBLAS reads CUBLAS*, CUBLASLT* and NVIDIA_TF32_OVERRIDE from its process's environment, and the worker's is
 * not the process's. The worker takes only those names. */
#define SV_BLAS_ENV_MAX 2048u
struct sv_blas_load {
    uint32_t which, pad;
};
/* Its reply: then, if status is not 0, the worker's line (NUL-terminated) that says why. */
struct sv_blas_loaded {
    int32_t status, pad;
    uint64_t version, cudart_version; /* cuBLAS: major * 10000 + minor * 100 + patch */
    int32_t major, minor, patch, pad2;
};
/* SV_OP_BLAS_CREATE (synchronous) / SV_OP_BLAS_DESTROY, SV_OP_LT_CREATE (synchronous) / SV_OP_LT_DESTROY:
 * struct sv_id_rec, the handle's id. */
/* SV_OP_BLAS_SET: a handle's setting; what: SV_BS_WORKSPACE the process's workspace (kept by the worker across the
 * stream it sets for a call, which gives cuBLAS's default pool back), SV_BS_WORKSPACE_DEFAULT the default pool
 * again (the process's cublasSetStream gave it back), else a mode. */
enum { SV_BS_WORKSPACE = 0, SV_BS_MATH, SV_BS_POINTER, SV_BS_ATOMICS, SV_BS_WORKSPACE_DEFAULT };
struct sv_blas_set {
    uint32_t handle, what;
    uint64_t a, b; /* workspace: address, bytes; else the mode in a */
};
/* SV_OP_BLAS_GEMM: one of the gemm family on the handle's stream (the stream travels with each call: the worker
 * sets it on its handle when it changed). dev_scalars: alpha and beta are device addresses (pointer mode device),
 * else their bytes. */
enum { SV_GEMM_S = 0, SV_GEMM_D, SV_GEMM_EX, SV_GEMM_S_STRIDED, SV_GEMM_D_STRIDED, SV_GEMM_EX_STRIDED };
struct sv_gemm_rec {
    uint32_t handle, stream, fn, dev_scalars;
    uint32_t transa, transb;
    int32_t m, n, k, lda, ldb, ldc, batch;
    int32_t atype, btype, ctype, compute, algo;
    uint64_t a, b, c;
    int64_t stride_a, stride_b, stride_c;
    uint8_t alpha[16], beta[16];
};
/* SV_OP_BLAS_GEMV: cublasSgemv or cublasDgemv (fn: SV_GEMM_S or SV_GEMM_D), as SV_OP_BLAS_GEMM. */
struct sv_gemv_rec {
    uint32_t handle, stream, fn, dev_scalars;
    uint32_t trans;
    int32_t m, n, lda, incx, incy;
    uint64_t a, x, y;
    uint8_t alpha[16], beta[16];
};
/* SV_OP_BLAS_DOT: cublasSdot or cublasDdot. dev_result: the result goes to device address result, asynchronously;
 * else the record is synchronous and its reply is the status, then the result's bytes (8). */
struct sv_dot_rec {
    uint32_t handle, stream, fn, dev_result;
    int32_t n, incx, incy, pad;
    uint64_t x, y, result;
};
/*
 * SV_OP_BLAS_CALL: one of cuBLAS's level-1, 2 and 3 functions on real data (fn: SV_BF_*, each S then D: fn & 1 is
 * double), on the handle's stream. Its arguments in the function's order: the integers (sizes, increments, leading
 * dimensions, and uplo, trans, diag and side by value) in i; the pointers in p, device addresses (a scalar's only
 * with dev_scalars, else 0); without dev_scalars, the values of the scalars it reads in s, packed, of the function's
 * type (rotm's param is five of them). A function that writes scalars to host memory (pointer mode host: nrm2,
 * asum, amax, amin, rotg, rotmg) is a synchronous record (sv_blas_call_sync): its reply is the status (int32), four
 * bytes, then what it wrote, packed: the result (amax, amin: an int32), rotg's a, b, c, s, rotmg's d1, d2, x1 and
 * param. The others are asynchronous.
 */
enum {
    SV_BF_SAXPY = 0,
    SV_BF_DAXPY,
    SV_BF_SCOPY,
    SV_BF_DCOPY,
    SV_BF_SSCAL,
    SV_BF_DSCAL,
    SV_BF_SSWAP,
    SV_BF_DSWAP,
    SV_BF_SROT,
    SV_BF_DROT,
    SV_BF_SROTM,
    SV_BF_DROTM,
    /* those that write scalars */
    SV_BF_SNRM2,
    SV_BF_DNRM2,
    SV_BF_SASUM,
    SV_BF_DASUM,
    SV_BF_ISAMAX,
    SV_BF_IDAMAX,
    SV_BF_ISAMIN,
    SV_BF_IDAMIN,
    SV_BF_SROTG,
    SV_BF_DROTG,
    SV_BF_SROTMG,
    SV_BF_DROTMG,
    /* level 2 */
    SV_BF_STRMV,
    SV_BF_DTRMV,
    SV_BF_STRSV,
    SV_BF_DTRSV,
    SV_BF_SGER,
    SV_BF_DGER,
    SV_BF_SSYR,
    SV_BF_DSYR,
    SV_BF_SSYR2,
    SV_BF_DSYR2,
    SV_BF_SSYMV,
    SV_BF_DSYMV,
    /* level 3 */
    SV_BF_SSYMM,
    SV_BF_DSYMM,
    SV_BF_SSYRK,
    SV_BF_DSYRK,
    SV_BF_SSYR2K,
    SV_BF_DSYR2K,
    SV_BF_STRMM,
    SV_BF_DTRMM,
    SV_BF_COUNT
};
#define SV_BLAS_CALL_INTS 10u
#define SV_BLAS_CALL_PTRS 6u
#define SV_BLAS_CALL_SCALARS 40u /* bytes: five doubles */
#define SV_BLAS_CALL_OUT 64u     /* bytes a reply's result takes at most: eight doubles */
struct sv_blas_call {
    uint32_t handle, stream, fn, dev_scalars;
    int32_t i[SV_BLAS_CALL_INTS];
    uint64_t p[SV_BLAS_CALL_PTRS];
    uint8_t s[SV_BLAS_CALL_SCALARS];
};
/* Whether a SV_OP_BLAS_CALL record of fn is synchronous (both sides decide by this). */
static inline bool sv_blas_call_sync(uint32_t fn, uint32_t dev_scalars) {
    return !dev_scalars && fn >= SV_BF_SNRM2 && fn <= SV_BF_DROTMG;
}
/* SV_OP_LT_OBJ_CREATE: a matmul descriptor (a: compute type, b: scale type), a matrix layout (a: type, b: rows,
 * c: cols, d: ld) or a preference. SV_OP_LT_OBJ_DESTROY: kind and id. SV_OP_LT_OBJ_SET: an attribute's value
 * (size bytes of value). SV_OP_LT_OBJ_GET (synchronous): the reply is the status, the size written, the value. */
#define SV_LT_ATTR_MAX 64u
struct sv_lt_obj {
    uint32_t kind, id; /* SV_K_LT_DESC, SV_K_LT_LAYOUT or SV_K_LT_PREF */
    int64_t a, b, c, d;
};
struct sv_lt_attr {
    uint32_t kind, id, attr, size;
    uint8_t value[SV_LT_ATTR_MAX];
};
struct sv_lt_got {
    int32_t status, pad;
    uint64_t written;
    uint8_t value[SV_LT_ATTR_MAX];
};
/* SV_OP_LT_HEURISTIC (synchronous): the reply is struct sv_lt_heur then count results of 96 bytes
 * (cublasLtMatmulHeuristicResult_t). */
#define SV_LT_HEUR_MAX 40u
/* A cuBLASLt handle in a record: its id, or a cuBLAS handle's id with this bit (PyTorch passes its cuBLAS handle
 * as its cuBLASLt handle, which NVIDIA's libraries allow). */
#define SV_LT_FROM_BLAS 0x80000000u
struct sv_lt_heur_rec {
    uint32_t lt, desc, adesc, bdesc, cdesc, ddesc, pref;
    int32_t requested;
};
struct sv_lt_heur {
    int32_t status, count;
};
/* SV_OP_LT_MATMUL: cublasLtMatmul on stream; alpha and beta each a device address (*_dev) or its bytes. */
struct sv_lt_matmul {
    uint32_t lt, desc, adesc, bdesc, cdesc, ddesc, stream, has_algo;
    uint32_t alpha_dev, beta_dev;
    uint64_t a, b, c, d, workspace, workspace_size;
    uint8_t alpha[16], beta[16];
    uint64_t algo[8];
};

/*
 * VMM handles across processes. A file descriptor travels over the worker's socket (SOCK_SEQPACKET), one
 * message of struct sv_fdmsg with the descriptor attached (SCM_RIGHTS), beside a record that names the same seq:
 * - SV_OP_VMM_IMPORT (synchronous): the client sends the message, then publishes the record (both under one lock,
 *   so the socket's order is the ring's); the worker takes exactly one message when it runs the record, imports
 *   the descriptor and closes it. The reply: the handle (uint64).
 * - SV_OP_VMM_EXPORT (synchronous): the worker exports handle, sends the message with the descriptor, then
 *   answers; the client, which waits for one export at a time, takes the message after a successful reply.
 * SV_OP_VMM_RETAIN: ptr in handle; the reply is the handle. SV_OP_VMM_PROPS: the reply is struct sv_props.
 */
#define SV_FD_MAGIC 0x44465347u /* "GSFD" */
struct sv_fd_rec {
    uint64_t seq;
    uint64_t handle; /* export: the handle; retain: the address */
    uint32_t type;   /* CUmemAllocationHandleType: POSIX file descriptors only */
    uint32_t pad;
};
struct sv_fdmsg {
    uint32_t magic, pad;
    uint64_t seq;
};
struct sv_props {
    uint32_t type, handle_types, loc_type;
    int32_t loc_id; /* the worker's device is the application's 0 */
    uint8_t compression, rdma;
    uint16_t usage;
    uint32_t pad;
};

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2, "shared atomics must be lock-free");
_Static_assert(sizeof(struct sv_rec) == 16, "record header");
_Static_assert(SV_REC_ALIGN % _Alignof(uint64_t) == 0, "records keep their 8-byte fields aligned");
_Static_assert(sizeof(struct sv_header) == 7 * 64, "the header's cache lines");
_Static_assert(sizeof(struct sv_reply) == 64 + SV_REPLY_DATA, "a reply slot");
_Static_assert(sizeof(struct sv_stagehdr) == 64, "a staging slot's header");
_Static_assert(sizeof(struct sv_layout) <= SV_REPLY_DATA, "a layout fits a reply");
_Static_assert(offsetof(struct sv_shared, ring) % 4096 == 0 && offsetof(struct sv_shared, stage) % 4096 == 0,
               "page-aligned ring and staging");
_Static_assert(sizeof(struct sv_shared) == offsetof(struct sv_shared, stage) + (size_t)SV_NSTAGE * SV_STAGE_BYTES,
               "the shared memory's size");
_Static_assert(sizeof(struct sv_hello) == 24 && sizeof(struct sv_welcome) == 256, "handshake messages");
_Static_assert(SV_RING_BYTES % SV_REC_ALIGN == 0 && (SV_RING_BYTES & (SV_RING_BYTES - 1)) == 0, "ring size");
_Static_assert(sizeof(struct sv_rec) + sizeof(struct sv_launch_rec) + SV_MAX_PARAM_BYTES < SV_RING_BYTES / 4,
               "a launch fits the ring many times over");

/* ---- the wait primitives both sides use on the shared memory ---- */

/* ---- a template's script ----
 *
 * What a checkpoint with a template keeps of a served process: the records its library would send a new worker to
 * make its objects again (the replay of intercept/served/replay.c), written once at the detach, so that a worker can
 * run them before the restore (gpucr image load --template) and the restored process then attaches to it with
 * nothing left to make. A file in the image (the helper checks its hash), run by a worker as the image's owner: the
 * worker trusts none of it, as it trusts nothing in the ring.
 *
 *   struct sv_script_hdr, then entries: struct sv_script_ent, the record (rec_len bytes: struct sv_rec and its
 *   payload, as in the ring), the staging slot's contents the record reads (stage_len bytes, into slot stage_slot
 *   before it runs: an image chunk's, a copy's), and what its reply must hold (expect_len bytes: an address the
 *   process keeps), each part padded to 8 bytes.
 *
 * A record with a reply (not part of a group) must succeed, its reply data starting with the expected bytes; the
 * script's last record is a synchronizing one that reports the asynchronous records' first failure.
 */
#define SV_SCRIPT_MAGIC 0x52435347u /* "GSCR" */
#define SV_SCRIPT_VERSION 1u
#define SV_SCRIPT_MAX (8ull << 30) /* the most a script may hold */
#define SV_TOKEN_BYTES 16u

struct sv_script_hdr {
    uint32_t magic, version;
    uint32_t sv_version; /* SV_VERSION of the records */
    uint32_t pad;
    uint8_t token[SV_TOKEN_BYTES]; /* the detach's: the restored process asks for the worker by it */
    uint64_t entries;
};

struct sv_script_ent {
    uint32_t rec_len, stage_len, stage_slot, expect_len;
};

static inline uint64_t sv_pad8(uint64_t n) { return (n + 7) & ~7ull; }

/* Futexes on the shared memory: the other side is another process, so not FUTEX_PRIVATE. The wait's result is
 * the system call's (its errors, EAGAIN and ETIMEDOUT among them, are the caller's to read). */
static inline long sv_futex_wait(_Atomic uint32_t *a, uint32_t val, long timeout_ns) {
    struct timespec ts = {timeout_ns / 1000000000L, timeout_ns % 1000000000L};
    return syscall(SYS_futex, (uint32_t *)a, FUTEX_WAIT, val, &ts, NULL, 0);
}

static inline void sv_futex_wake(_Atomic uint32_t *a) {
    syscall(SYS_futex, (uint32_t *)a, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* A spinning wait's pause between two looks. */
static inline void sv_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

static inline long long sv_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#endif

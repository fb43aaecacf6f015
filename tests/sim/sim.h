/*
 * Internal declarations of gpucr's simulated CUDA driver (libcuda.so.1).
 *
 * The simulator is a test double: same states, same return codes, same misuse
 * semantics as the real driver, on host memory. Files and their jobs:
 *   sim_core.c    init, environment, logging, the API gate, fork, handle table
 *   sim_device.c  devices, attributes, primary contexts
 *   sim_util.c    address-range sets, memfd parking (used by checkpoint)
 *   sim_mem.c     device memory pools, cuMemAlloc/Free, host memory, lookups
 *   sim_copy.c    copies and memsets, sync and async
 *   sim_vmm.c     virtual memory management (cuMemCreate/Map/Export/Import)
 *   sim_stream.c  streams (a worker thread each), operations, events
 *   sim_module.c  PTX parsing, modules, libraries, kernels, launches
 *   sim_proc.c    cuGetProcAddress, error strings, export tables
 *   sim_ckpt.c    the checkpoint API, both the target and the controller side
 *
 * Locks, always taken in this order when nested: sim.memlock, then sim.mu.
 * sim.gate_mu is only ever taken alone.
 */
#ifndef GPUCR_SIM_H
#define GPUCR_SIM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpucr/cudadrv.h"
#include "simk.h"

#define SIM_API __attribute__((visibility("default")))

#define SIM_DRIVER_VERSION 13000
#define SIM_MAX_DEVICES 16
#define SIM_PAGE 4096ULL
#define SIM_GRANULARITY (2ULL << 20)

/*
 * Device addresses are fixed so that a process's device pointers are the same
 * from run to run (tests compare them across processes and across CRIU
 * restores) and far from where the kernel puts host mappings.
 */
#define SIM_POOL_BASE 0x300000000000ULL /* + dev * SIM_POOL_STRIDE */
#define SIM_POOL_STRIDE (1ULL << 40)
#define SIM_VMM_BASE 0x500000000000ULL /* cuMemAddressReserve window */
#define SIM_VMM_SIZE (1ULL << 44)

#define SIM_LOG(...) sim_log(__VA_ARGS__)

/* ---- sim_util.c: sorted sets of disjoint address ranges ---- */

enum sim_range_kind { SIM_R_ALLOC = 1, SIM_R_VMAP, SIM_R_VRES, SIM_R_HOST };

typedef struct sim_range {
    uint64_t start, len;
    void *obj;
    int kind;
    int prot; /* for accessible device ranges: PROT_READ / PROT_READ|PROT_WRITE */
} sim_range;

typedef struct sim_rangeset {
    sim_range *v;
    size_t n, cap;
} sim_rangeset;

int rs_insert(sim_rangeset *rs, sim_range r);           /* 0, or -1 (no memory / overlap) */
ssize_t rs_find(const sim_rangeset *rs, uint64_t addr); /* index of the range holding addr */
ssize_t rs_find_start(const sim_rangeset *rs, uint64_t start);
void rs_remove_at(sim_rangeset *rs, size_t i);
bool rs_overlaps(const sim_rangeset *rs, uint64_t start, uint64_t len);
/* Lowest aligned gap of `size` bytes in [lo, hi) at or above `from`; 0 if none. */
uint64_t rs_fit(const sim_rangeset *rs, uint64_t lo, uint64_t hi, uint64_t from, uint64_t size, uint64_t align);
void rs_free(sim_rangeset *rs);

/*
 * Contents of a memfd copied into ordinary anonymous memory, so that CRIU
 * dumps them as process memory. Only the data extents are copied: device
 * memory is sparse and most of it is never touched.
 */
typedef struct sim_parked {
    unsigned char *buf; /* anonymous mapping holding the extents back to back */
    size_t buflen;
    uint64_t *ext; /* pairs (offset, length) */
    size_t next;
} sim_parked;

int sim_park_fd(int fd, uint64_t size, sim_parked *out); /* 0 or -errno */
int sim_unpark_fd(const sim_parked *p, uint64_t size, const char *name, int *fdout);
void sim_parked_free(sim_parked *p);
int sim_memfd(const char *name, uint64_t size); /* fd or -errno */
/* mmap at exactly `addr` without replacing anything; -errno on failure. */
int sim_map_exact(uint64_t addr, uint64_t len, int prot, int flags, int fd, off_t off);
/* Turn [addr, addr+len) into an inaccessible anonymous reservation. */
int sim_map_reserve_fixed(uint64_t addr, uint64_t len);

static inline uint64_t sim_align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
uint64_t sim_now_ns(void);
/*
 * Starts a detached thread of the simulator with every signal blocked: the
 * simulator's threads (stream workers, the restore thread) must never run
 * the application's signal handlers. Returns 0 or the pthread_create error.
 */
int sim_start_thread(void *(*fn)(void *), void *arg);

/* ---- sim_core.c ---- */

typedef enum sim_htype {
    SIM_H_STREAM = 1,
    SIM_H_EVENT,
    SIM_H_MODULE,
    SIM_H_FUNC,
    SIM_H_LIBRARY,
    SIM_H_KERNEL,
    SIM_H_GRAPH,
    SIM_H_GRAPH_EXEC,
} sim_htype;

int sim_handle_add(const void *p, sim_htype t); /* 0 or -1 (no memory); caller holds sim.mu */
bool sim_handle_is(const void *p, sim_htype t); /* caller holds sim.mu */
int sim_handle_type(const void *p);             /* 0 if unknown; caller holds sim.mu */
void sim_handle_del(const void *p);             /* caller holds sim.mu */

typedef struct sim_ctx sim_ctx;
typedef struct sim_stream sim_stream;
typedef struct sim_op sim_op;

typedef struct sim_pool {
    uint64_t base, size; /* fixed VA window for this device's cuMemAlloc memory */
    int fd;              /* the memfd behind it; -1 while checkpointed */
    sim_parked parked;
    sim_rangeset allocs; /* live cuMemAlloc allocations (obj: sim_alloc) */
} sim_pool;

typedef struct sim_device {
    int ordinal;
    int phys;       /* the GPU behind the ordinal (its UUID, its exported memory): the ordinal until a
                     * restore onto other GPUs (gpuPairs) moves it; the bus id stays the first GPU's */
    uint64_t total; /* bytes */
    uint64_t used;  /* bytes charged to this process (memlock) */
    sim_pool pool;
    sim_ctx *primary;
    unsigned primary_flags; /* cuDevicePrimaryCtxSetFlags (mu) */
} sim_device;

enum sim_ckpt_state { SIM_CK_RUNNING = 0, SIM_CK_LOCKED = 1, SIM_CK_CHECKPOINTED = 2, SIM_CK_FAILED = 3 };

typedef struct sim_state {
    pthread_mutex_t mu;       /* contexts, streams, ops, events, modules, handles */
    pthread_cond_t cv;        /* broadcast whenever an op completes or is queued */
    pthread_rwlock_t memlock; /* memory tables and protections; writers change mappings */

    pthread_mutex_t init_mu;
    atomic_int initialized; /* 1 once cuInit succeeded */
    CUresult init_err;      /* what a failed cuInit returned */
    atomic_int forked;      /* this is a fork child of an initialized process */
    int log;
    pid_t owner_pid;

    int ndev;
    sim_device dev[SIM_MAX_DEVICES];

    /* memlock: */
    sim_rangeset dmap;     /* device memory accessible now (allocations, VMM maps with access) */
    sim_rangeset vres;     /* VMM reservations (obj unused) */
    sim_rangeset vmaps;    /* VMM mappings (obj: sim_vmap) */
    sim_rangeset host;     /* page-locked host memory: allocations and registrations */
    struct sim_phys *phys; /* VMM physical allocations, a list */

    /* the gate that cuCheckpointProcessLock closes */
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;
    int gate_closed;
    int in_api;

    int ckpt_state; /* enum sim_ckpt_state, gate_mu */
} sim_state;

extern sim_state sim;

void sim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void sim_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* What an API entry needs before it can run. */
enum sim_need {
    SIM_NEED_INIT = 0, /* cuInit done; a current context is not looked at */
    SIM_NEED_CTX,      /* a current, live context without a sticky error */
    SIM_CTX_OPTIONAL,  /* like NEED_INIT, but a sticky error of the current context counts */
};

typedef struct sim_call {
    const char *name;
    sim_ctx *ctx; /* the current context, if any */
    int entered;  /* passed the gate: 1 counted in in_api, 2 a call that locks do not wait for */
} sim_call;

CUresult sim_enter(sim_call *c, const char *name, enum sim_need need);
CUresult sim_leave(sim_call *c, CUresult r);
sim_ctx *sim_current_ctx(void);
void sim_set_current_ctx(sim_ctx *ctx);

/* Gate control for the checkpoint API (restore thread only). */
void sim_gate_close(void);
void sim_gate_open(void);
void sim_gate_set_state(int st);              /* enum sim_ckpt_state */
int sim_gate_wait_idle(uint64_t deadline_ns); /* 0, or -1 at the deadline (0: none) */
/* One bounded wait on cv (monotonic deadline, 0: none); -1 once the deadline has passed. */
int sim_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns);

/* ---- sim_device.c ---- */

/* cuCtxSetLimit's limits (CUlimit 0..6) and the stream priorities (cuCtxGetStreamPriorityRange). */
#define SIM_NLIMITS 7
#define SIM_PRIO_LEAST 0
#define SIM_PRIO_GREATEST (-5)

struct sim_ctx {
    uint32_t magic;
    int dev;
    size_t limits[SIM_NLIMITS]; /* (mu) */
    int refs;                   /* primary-context retains (mu) */
    atomic_int alive;           /* between the first retain and the last release */
    atomic_int sticky;          /* a kernel fault: every later call in this context fails with it */
    sim_stream *legacy;
    sim_stream *streams;      /* all streams, the legacy one included (mu) */
    int nstreams;             /* workers not yet exited (mu) */
    struct sim_event *events; /* (mu) */
};
#define SIM_CTX_MAGIC 0x43545831u

CUresult sim_device_check(CUdevice dev);
void sim_phys_uuid(int phys, CUuuid *uuid); /* the UUID of GPU phys (not an ordinal) */
int sim_ordinal_of_phys(int phys);          /* the ordinal GPU phys is behind; -1: none */
bool sim_ctx_valid(sim_ctx *ctx);           /* one of ours, not necessarily alive */

/* ---- sim_mem.c ---- */

typedef struct sim_alloc {
    uint64_t addr, size; /* size as asked for */
    uint64_t id;         /* unique in the process: CU_POINTER_ATTRIBUTE_BUFFER_ID */
    uint64_t mapped;     /* size rounded up to the protection granule */
    int dev;
    sim_ctx *ctx;
    int free_pending; /* cuMemFreeAsync queued */
    int pooled;       /* cuMemAllocAsync: the device's default memory pool's */
} sim_alloc;

CUresult sim_mem_init(void);
/* Caller holds memlock (read or write). */
bool sim_dev_range_ok(uint64_t p, uint64_t n, bool write);
bool sim_is_device_va(uint64_t p);
bool sim_host_is_pinned(const void *p, size_t n);
CUresult sim_mem_free_locked(sim_alloc *a); /* memlock held for writing */
void sim_mem_free_ctx(sim_ctx *ctx);        /* frees everything a dying context allocated */
CUresult sim_mem_alloc_impl(sim_ctx *ctx, CUdeviceptr *dptr, size_t size);
/* A new unique buffer id (allocations, VMM mappings). */
uint64_t sim_buffer_id_next(void);
/* Frees the allocation at addr if it is still the one whose id is id (module globals); takes memlock. */
void sim_mem_free_if(uint64_t addr, uint64_t id);
/* The id of the live allocation at addr, 0 if none; takes memlock. */
uint64_t sim_mem_alloc_id(uint64_t addr);

/* What cuPointerGetAttribute(s) knows of an address (sim_mem.c, with sim_vmm_ptr_info for VMM mappings). */
typedef struct sim_ptrinfo {
    unsigned type; /* CUmemorytype; 0: not the driver's */
    sim_ctx *ctx;
    int dev;             /* the ordinal; -1 for host memory */
    uint64_t base, size; /* the allocation (RANGE_START_ADDR, RANGE_SIZE) */
    uint64_t map_base, map_size;
    uint64_t buffer_id;
    int legacy_ipc, vmm;
    unsigned access; /* CUmemAccess_flags of the current context's device */
    uint64_t htypes; /* ALLOWED_HANDLE_TYPES */
    int rdma;
} sim_ptrinfo;
/* memlock held. */
bool sim_vmm_ptr_info(uint64_t p, int dev, sim_ptrinfo *out);
/* Checkpoint support, memlock held for writing. */
int sim_mem_park_all(void);
int sim_mem_unpark_all(void);
int sim_vmm_park_all(void);
int sim_vmm_unpark_all(void);
bool sim_vmm_has_imported(void);

/* ---- sim_stream.c ---- */

typedef CUresult (*sim_op_fn)(sim_op *op);

struct sim_op {
    sim_op *next; /* in the stream's pending queue */
    int refs;     /* mu */
    int done;     /* mu */
    CUresult err; /* what run returned */
    sim_op **deps;
    int ndeps;
    sim_stream *stream;
    sim_ctx *ctx;
    sim_op_fn run;  /* NULL: a marker (event record, stream wait) */
    uint64_t ts_ns; /* completion time */
    void *arg;      /* points at payload */
    void (*fini)(sim_op *op);
    _Alignas(16) unsigned char payload[];
};

struct sim_stream {
    uint32_t magic;
    sim_ctx *ctx;
    unsigned flags;
    int priority; /* clamped to the context's range */
    int legacy;
    sim_op *head, *tail; /* pending, in order */
    sim_op *last;        /* last op queued (a reference), for dependencies and queries */
    int dying;
    struct sim_graph *capture; /* being captured into (cuStreamBeginCapture): ops are recorded, not run */
    sim_stream *next;          /* in ctx->streams */
};

/* sim_graph.c: an op submitted to a capturing stream is recorded into its graph; mu held. */
void sim_graph_record_locked(struct sim_graph *g, sim_op *op);
/* A blocking stream of the context captures (in any mode): work on the legacy stream, which would join that
 * capture, is refused; mu held. */
bool sim_ctx_blocking_capture_locked(sim_ctx *ctx);
#define SIM_STREAM_MAGIC 0x5354524du

sim_op *sim_op_new(size_t payload, sim_op_fn run);
void sim_op_put(sim_op *op); /* drop a reference; takes mu */
void sim_op_put_locked(sim_op *op);
/*
 * Queue op on stream h of ctx (NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name the
 * legacy stream) after the implicit legacy-stream dependencies. The caller keeps its own
 * reference and drops it with sim_op_put.
 */
CUresult sim_submit(sim_ctx *ctx, CUstream h, sim_op *op);
CUresult sim_op_wait(sim_op *op); /* waits, then returns op->err */
CUresult sim_stream_create_locked(sim_ctx *ctx, unsigned flags, int legacy, sim_stream **out);
CUresult sim_ctx_sync(sim_ctx *ctx);
void sim_ctx_streams_stop(sim_ctx *ctx);     /* mu held; waits for every worker to exit */
int sim_streams_drain(uint64_t deadline_ns); /* all contexts; 0 or -1 at the deadline */
void sim_stream_mark_fault(sim_ctx *ctx, CUresult r, const char *what);

/* ---- sim_module.c, sim_fatbin.c ---- */

void sim_modules_free_ctx(sim_ctx *ctx); /* mu held */
/* The PTX text of a loader's image: the image itself, or the PTX entry of a fat binary (or of a fat binary's
 * wrapper), then in *owned (malloc'd; the caller frees it). */
CUresult sim_image_text(const void *image, const char **text, char **owned);

/* ---- sim_ckpt.c ---- */

void sim_ckpt_start(void); /* starts the restore thread; warns on failure */
/* sim_devfile.c: the driver's device file (an fd CRIU cannot dump) */
void sim_devfile_open(void);
void sim_devfile_close(void);
/* sim_mem.c, sim_vmm.c: a forked child's device memory becomes inaccessible */
void sim_mem_atfork_child(void);
void sim_vmm_atfork_child(void);
void sim_ckpt_atfork_child(void);

/* ---- sim_proc.c ---- */

const char *sim_error_name(CUresult r);

#endif /* GPUCR_SIM_H */

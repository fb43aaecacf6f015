/*
 * The checkpoint API (cuCheckpointProcess*), which acts on another process.
 *
 * Target side: every initialized process runs a "cuda-restore" thread that
 * listens on a unix stream socket bound to a path in the process's own mount
 * namespace, <dir>/ckpt.<pid>.sock with <dir> /dev/shm/gpucr-sim or
 * /tmp/gpucr-sim and <pid> the process's pid in its own pid namespace. A path
 * (not an abstract name) because containers have their own network namespace
 * but the controller can always reach the target's files through
 * /proc/<pid>/root. CRIU dumps and restores a listening socket bound to a path.
 *
 * Controller side: one connection per call. The controller sends a request,
 * the target replies, the controller shuts down its writing side, the target
 * reads EOF and closes, the controller reads EOF and only then returns. So when
 * a call returns the target holds no connected socket: `criu dump` refuses
 * tasks with a unix socket connected to a peer outside the dumped tree.
 *
 * Checkpoint copies device memory into anonymous memory and drops every memfd
 * and memfd mapping (replaced by inaccessible reservations at the same
 * addresses), so CRIU sees only ordinary process memory, like the driver,
 * which parks context state in the process. Restore needs the target's restore
 * thread to run: while it is stopped (CRIU's ptrace, SIGSTOP) the controller
 * waits GPUCR_SIM_RESTORE_TIMEOUT_MS and then fails with CUDA_ERROR_TIMEOUT.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "sim.h"

/*
 * What the API returns when the target cannot be reached, as measured on an
 * H100 with driver 580 (drvtest cases ckpt_unknown_pid and ckpt_no_cuda).
 * CK_ERR_TARGET_GONE (the target died during the call) is a guess.
 */
#define CK_ERR_NO_PROCESS CUDA_ERROR_OPERATING_SYSTEM  /* no such pid */
#define CK_ERR_NO_CUDA CUDA_ERROR_NOT_INITIALIZED      /* the process never initialized CUDA */
#define CK_ERR_TARGET_GONE CUDA_ERROR_OPERATING_SYSTEM /* it died during the call */

static const char *const ck_dirs[] = {"/dev/shm/gpucr-sim", "/tmp/gpucr-sim"};

#define CK_MAGIC 0x67434b31u
enum { CK_GET_STATE = 1, CK_LOCK, CK_CHECKPOINT, CK_RESTORE, CK_UNLOCK };

typedef struct {
    uint32_t magic, op, timeout_ms, npairs;
    CUcheckpointGpuPair pairs[SIM_MAX_DEVICES]; /* CK_RESTORE: cuCheckpointProcessRestore's gpuPairs */
} ck_req;

typedef struct {
    uint32_t magic;
    int32_t result, state, pad;
} ck_rep;

static int lfd = -1;
static bool restore_failed; /* restore thread only: after one failed restore the driver answers 304 */
static char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];

/* ---- target side ---- */

static uint64_t deadline_after(unsigned ms) { return ms ? sim_now_ns() + (uint64_t)ms * 1000000ULL : 0; }

static CUresult do_lock(unsigned timeout_ms) {
    sim_gate_close();
    uint64_t dl = deadline_after(timeout_ms);
    /* calls already inside the driver finish, then queued work drains */
    if (sim_gate_wait_idle(dl) < 0 || sim_streams_drain(dl) < 0) {
        sim_gate_open();
        return CUDA_ERROR_TIMEOUT;
    }
    return CUDA_SUCCESS;
}

static CUresult do_checkpoint(void) {
    pthread_rwlock_wrlock(&sim.memlock);
    int e = sim_mem_park_all();
    if (!e)
        e = sim_vmm_park_all();
    if (e) {
        sim_vmm_unpark_all();
        sim_mem_unpark_all();
    } else {
        sim_devfile_close(); /* as the driver releases its files */
    }
    pthread_rwlock_unlock(&sim.memlock);
    return e ? (e == -ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM) : CUDA_SUCCESS;
}

/*
 * Restore onto other GPUs: each pair names a GPU of the process (its UUID at
 * checkpoint) and the GPU to put it on. Measured on driver 580 with two
 * H200s (drvtest ckpt_restore_gpu_pairs): the pairs must name every GPU the
 * process sees, used or not, else CUDA_ERROR_INVALID_VALUE; a new GPU that
 * is not there is CUDA_ERROR_INVALID_VALUE too; either way the process
 * stays checkpointed, and a restore with good pairs (or none) still works.
 * A swap of both GPUs of a process that used one works, and its ordinal 0
 * then stands for the other GPU. GUESSES, not measured: an old UUID that is
 * none of the process's GPUs, and two GPUs onto one, are
 * CUDA_ERROR_INVALID_VALUE. The ordinal the process knows a GPU by stays;
 * the GPU behind it changes.
 */
static CUresult remap_gpus(const ck_req *q) {
    if (q->npairs == 0)
        return CUDA_SUCCESS;
    int target[SIM_MAX_DEVICES];
    bool taken[SIM_MAX_DEVICES] = {false};
    for (int i = 0; i < sim.ndev; i++)
        target[i] = -1;
    for (uint32_t k = 0; k < q->npairs; k++) {
        int old = -1, neu = -1;
        for (int i = 0; i < sim.ndev; i++) {
            CUuuid u;
            sim_phys_uuid(sim.dev[i].phys, &u);
            if (memcmp(u.bytes, q->pairs[k].oldUuid.bytes, sizeof u.bytes) == 0)
                old = i;
            sim_phys_uuid(i, &u);
            if (memcmp(u.bytes, q->pairs[k].newUuid.bytes, sizeof u.bytes) == 0)
                neu = i;
        }
        if (neu < 0 || old < 0) {
            sim_warn("restore: gpuPairs[%u] names a GPU that is %s", k,
                     neu < 0 ? "not on this machine" : "none of the process's");
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (taken[neu] || target[old] >= 0) {
            sim_warn("restore: gpuPairs[%u] names a GPU twice", k);
            return CUDA_ERROR_INVALID_VALUE;
        }
        target[old] = neu;
        taken[neu] = true;
    }
    for (int i = 0; i < sim.ndev; i++) {
        if (target[i] < 0) {
            sim_warn("restore: gpuPairs lacks the process's GPU %d (every GPU it sees must be paired)", i);
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    for (int i = 0; i < sim.ndev; i++) {
        if (target[i] != sim.dev[i].phys)
            sim_log("restore: ordinal %d moves from GPU %d to GPU %d", i, sim.dev[i].phys, target[i]);
        sim.dev[i].phys = target[i];
    }
    return CUDA_SUCCESS;
}

static CUresult do_restore(const ck_req *q, int *state) {
    if (restore_failed) /* measured: once a restore failed, every later one fails so */
        return CUDA_ERROR_OPERATING_SYSTEM;
    if (q->npairs > (uint32_t)SIM_MAX_DEVICES)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rr = remap_gpus(q);
    if (rr != CUDA_SUCCESS)
        return rr; /* still checkpointed; a restore with valid pairs may follow */
    pthread_rwlock_wrlock(&sim.memlock);
    if (sim_vmm_has_imported()) {
        /*
         * Measured on the driver: imported memory alive at checkpoint makes the
         * restore fail with 801 (and later ones with 304); the process stays
         * checkpointed.
         */
        sim_warn("restore: the process held imported VMM memory at checkpoint; restore is not supported");
        pthread_rwlock_unlock(&sim.memlock);
        restore_failed = true;
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int e = sim_mem_unpark_all();
    if (!e)
        e = sim_vmm_unpark_all();
    if (!e)
        sim_devfile_open();
    pthread_rwlock_unlock(&sim.memlock);
    if (e) {
        /* as the driver after a failed restore (cuda-checkpoint issue #44): still checkpointed, 304 from now on */
        restore_failed = true;
        return e == -ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
    }
    *state = SIM_CK_LOCKED;
    return CUDA_SUCCESS;
}

static CUresult handle(const ck_req *q, int *state_out) {
    int st = sim.ckpt_state;
    CUresult r = CUDA_SUCCESS;
    switch (q->op) {
    case CK_GET_STATE: break;
    case CK_LOCK:
        if (st != SIM_CK_RUNNING)
            r = CUDA_ERROR_ILLEGAL_STATE;
        else if ((r = do_lock(q->timeout_ms)) == CUDA_SUCCESS)
            st = SIM_CK_LOCKED;
        break;
    case CK_CHECKPOINT:
        if (st != SIM_CK_LOCKED)
            r = CUDA_ERROR_ILLEGAL_STATE;
        else if ((r = do_checkpoint()) == CUDA_SUCCESS)
            st = SIM_CK_CHECKPOINTED;
        break;
    case CK_RESTORE:
        if (st != SIM_CK_CHECKPOINTED)
            r = CUDA_ERROR_ILLEGAL_STATE;
        else
            r = do_restore(q, &st);
        break;
    case CK_UNLOCK:
        if (st != SIM_CK_LOCKED) {
            r = CUDA_ERROR_ILLEGAL_STATE;
        } else {
            st = SIM_CK_RUNNING;
            sim_gate_open();
        }
        break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    if (st != sim.ckpt_state)
        sim_gate_set_state(st);
    *state_out = st;
    return r;
}

/* Reads exactly n bytes, waiting at most timeout_ms; -1 on EOF, error or timeout. */
static int read_full(int fd, void *buf, size_t n, int timeout_ms) {
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, timeout_ms);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return -1;
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Waits until the peer has closed its writing side; 0 on EOF. */
static int wait_eof(int fd, int timeout_ms) {
    char b[64];
    uint64_t dl = sim_now_ns() + (uint64_t)timeout_ms * 1000000ULL;
    for (;;) {
        uint64_t now = sim_now_ns();
        if (now >= dl)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)((dl - now) / 1000000ULL) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return -1;
        ssize_t r = read(fd, b, sizeof b);
        if (r == 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

static void serve(int c) {
    ck_req q;
    if (read_full(c, &q, sizeof q, 5000) < 0 || q.magic != CK_MAGIC)
        return;
    /* a controller that gave up (its timeout) has closed already: do not act on its stale request */
    struct pollfd p = {.fd = c, .events = POLLRDHUP};
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
        sim_log("restore thread: dropping request %u of a controller that is gone", q.op);
        return;
    }
    ck_rep rep = {.magic = CK_MAGIC};
    int st;
    rep.result = (int32_t)handle(&q, &st);
    rep.state = st;
    sim_log("restore thread: request %u -> %s, state %d", q.op, sim_error_name((CUresult)rep.result), st);
    if (send(c, &rep, sizeof rep, MSG_NOSIGNAL) != (ssize_t)sizeof rep)
        return;
    wait_eof(c, 5000);
}

static void *restore_main(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "cuda-restore", 0, 0, 0);
    for (;;) {
        int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EBADF || errno == EINVAL || errno == ENOTSOCK) {
                sim_warn("restore thread: accept: %s; checkpoint requests are no longer served", strerror(errno));
                return NULL;
            }
            sim_warn("restore thread: accept: %s", strerror(errno));
            usleep(100000);
            continue;
        }
        serve(c);
        close(c);
    }
}

__attribute__((destructor)) static void ck_unlink(void) {
    if (sock_path[0] && sim.owner_pid == getpid() && !atomic_load(&sim.forked))
        unlink(sock_path);
}

/*
 * Removes the sockets of processes that died without cleaning up (killed, or
 * dumped by CRIU and not restored): nobody listens on them any more. A
 * connection refused is the test, not the pid, because the directory may be
 * shared by processes of other pid namespaces; a live listener, even a stopped
 * one, accepts into its backlog and is left alone.
 */
static void ck_sweep(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    int budget = 256; /* bounds the cost of cuInit in a littered directory */
    while ((de = readdir(d)) && budget-- > 0) {
        if (strncmp(de->d_name, "ckpt.", 5) != 0)
            continue;
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        int n = snprintf(a.sun_path, sizeof a.sun_path, "%s/%s", dir, de->d_name);
        if (n < 0 || (size_t)n >= sizeof a.sun_path)
            continue;
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            break;
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 && errno == ECONNREFUSED)
            unlink(a.sun_path);
        close(fd);
    }
    closedir(d);
}

static int ck_bind(const char *dir) {
    if (mkdir(dir, 01777) < 0 && errno != EEXIST)
        return -errno;
    chmod(dir, 01777); /* umask may have narrowed it; other users' processes need it too */
    ck_sweep(dir);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path, sizeof a.sun_path, "%s/ckpt.%d.sock", dir, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof a.sun_path)
        return -ENAMETOOLONG;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    unlink(a.sun_path); /* left behind by an earlier process with this pid */
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 16) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    lfd = fd;
    memcpy(sock_path, a.sun_path, sizeof sock_path);
    return 0;
}

void sim_ckpt_start(void) {
    int e = -ENOENT;
    for (size_t i = 0; i < sizeof ck_dirs / sizeof ck_dirs[0] && e; i++)
        e = ck_bind(ck_dirs[i]);
    if (e) {
        sim_warn(
            "cuInit: no checkpoint socket in /dev/shm/gpucr-sim or /tmp/gpucr-sim (%s); "
            "this process cannot be checkpointed",
            strerror(-e));
        return;
    }
    int pe = sim_start_thread(restore_main, NULL);
    if (pe) {
        sim_warn("cuInit: cannot start the restore thread: %s; this process cannot be checkpointed", strerror(pe));
        close(lfd);
        lfd = -1;
        unlink(sock_path);
        sock_path[0] = 0;
    }
}

void sim_ckpt_atfork_child(void) {
    /* the child must not accept on (or unlink) its parent's socket */
    if (lfd >= 0)
        close(lfd);
    lfd = -1;
}

/* ---- controller side ---- */

/* The target's pid in its own pid namespace (last NStgid field); -1 if /proc/<pid> is gone. */
static int target_nspid(int pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    int ns = -1, tgid = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "Tgid:", 5) == 0) {
            tgid = atoi(line + 5);
        } else if (strncmp(line, "NStgid:", 7) == 0) {
            char *save = NULL;
            for (char *t = strtok_r(line + 7, " \t\n", &save); t; t = strtok_r(NULL, " \t\n", &save))
                ns = atoi(t);
        }
    }
    fclose(f);
    return ns > 0 ? ns : tgid; /* kernels without NStgid have no pid namespaces to cross */
}

/* The restore thread's tid as this process sees it; 0 if there is none. */
static int find_restore_tid(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    int tid = 0;
    struct dirent *de;
    while (!tid && (de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        char cpath[300], comm[32] = "";
        snprintf(cpath, sizeof cpath, "/proc/%d/task/%s/comm", pid, de->d_name);
        int fd = open(cpath, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, comm, sizeof comm - 1);
        close(fd);
        if (n <= 0)
            continue;
        comm[n] = 0;
        comm[strcspn(comm, "\n")] = 0;
        if (strcmp(comm, "cuda-restore") == 0)
            tid = atoi(de->d_name);
    }
    closedir(d);
    return tid;
}

/* Whether a thread is stopped (SIGSTOP, or stopped under ptrace as CRIU keeps it). */
static bool thread_stopped(int pid, int tid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/task/%d/stat", pid, tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

static unsigned restore_timeout_ms(void) {
    const char *s = getenv("GPUCR_SIM_RESTORE_TIMEOUT_MS");
    if (s && *s) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (!*end && v > 0 && v < 86400000UL)
            return (unsigned)v;
    }
    return 30000;
}

static const char *op_name(uint32_t op) {
    switch (op) {
    case CK_GET_STATE: return "cuCheckpointProcessGetState";
    case CK_LOCK: return "cuCheckpointProcessLock";
    case CK_CHECKPOINT: return "cuCheckpointProcessCheckpoint";
    case CK_RESTORE: return "cuCheckpointProcessRestore";
    case CK_UNLOCK: return "cuCheckpointProcessUnlock";
    default: return "cuCheckpointProcess?";
    }
}

static CUresult ck_connect(int pid, int *fdout) {
    int ns = target_nspid(pid);
    if (ns < 0)
        return CK_ERR_NO_PROCESS;
    CUresult r = CK_ERR_NO_CUDA;
    for (size_t i = 0; i < sizeof ck_dirs / sizeof ck_dirs[0]; i++) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        int n = snprintf(a.sun_path, sizeof a.sun_path, "/proc/%d/root%s/ckpt.%d.sock", pid, ck_dirs[i], ns);
        if (n < 0 || (size_t)n >= sizeof a.sun_path)
            continue;
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            sim_warn("checkpoint API: socket: %s", strerror(errno));
            return CUDA_ERROR_OPERATING_SYSTEM;
        }
        int e;
        do {
            e = connect(fd, (struct sockaddr *)&a, sizeof a) < 0 ? errno : 0;
        } while (e == EINTR);
        if (!e) {
            *fdout = fd;
            return CUDA_SUCCESS;
        }
        close(fd);
        if (e == EACCES || e == EPERM)
            r = CUDA_ERROR_NOT_PERMITTED;
        else if (e != ENOENT && e != ECONNREFUSED && e != ENOTDIR)
            sim_log("checkpoint API: connect %s: %s", a.sun_path, strerror(e));
    }
    return r;
}

static CUresult ck_call(int pid, ck_req *q, ck_rep *rep) {
    if (pid <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t op = q->op;
    int fd;
    CUresult r = ck_connect(pid, &fd);
    if (r != CUDA_SUCCESS)
        return r;
    q->magic = CK_MAGIC;
    if (send(fd, q, sizeof *q, MSG_NOSIGNAL) != (ssize_t)sizeof *q) {
        close(fd);
        return CK_ERR_TARGET_GONE;
    }
    unsigned limit = restore_timeout_ms();
    uint64_t stopped_since = 0;
    int tid = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, 100);
        if (pr < 0 && errno != EINTR) {
            close(fd);
            return CUDA_ERROR_OPERATING_SYSTEM;
        }
        if (pr > 0)
            break;
        if (!tid)
            tid = find_restore_tid(pid);
        if (tid && thread_stopped(pid, tid)) {
            uint64_t now = sim_now_ns();
            if (!stopped_since)
                stopped_since = now;
            if (now - stopped_since >= (uint64_t)limit * 1000000ULL) {
                fprintf(stderr,
                        "gpucr-sim: %s(pid %d): the target's restore thread (tid %d) is not running (stopped by "
                        "ptrace or SIGSTOP) after %u ms; resume that thread and retry\n",
                        op_name(op), pid, tid, limit);
                close(fd); /* the target sees we left and drops the request */
                return CUDA_ERROR_TIMEOUT;
            }
        } else {
            stopped_since = 0;
        }
    }
    if (read_full(fd, rep, sizeof *rep, 5000) < 0 || rep->magic != CK_MAGIC) {
        close(fd);
        return CK_ERR_TARGET_GONE;
    }
    /* return only once the target has closed its end: CRIU may dump it right after */
    shutdown(fd, SHUT_WR);
    if (wait_eof(fd, 10000) < 0)
        sim_warn("%s(pid %d): the target did not close its end of the connection", op_name(op), pid);
    close(fd);
    return (CUresult)rep->result;
}

static CUresult controller_enter(sim_call *c, const char *name) {
    /*
     * Measured on driver 580: a controller that never called cuInit can use
     * the checkpoint API (NVIDIA's cuda-checkpoint and the anchor's drvckpt
     * never do). A controller that did goes through its own gate as usual.
     */
    if (!atomic_load(&sim.initialized) && !atomic_load(&sim.forked)) {
        c->name = name;
        c->ctx = NULL;
        c->entered = 0;
        return CUDA_SUCCESS;
    }
    return sim_enter(c, name, SIM_NEED_INIT);
}

SIM_API CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
    sim_call c;
    CUresult r = controller_enter(&c, "cuCheckpointProcessGetRestoreThreadId");
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!tid || pid <= 0)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    if (target_nspid(pid) < 0)
        return sim_leave(&c, CK_ERR_NO_PROCESS);
    int t = find_restore_tid(pid);
    if (!t)
        return sim_leave(&c, CK_ERR_NO_CUDA);
    *tid = t;
    return sim_leave(&c, CUDA_SUCCESS);
}

SIM_API CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state) {
    sim_call c;
    CUresult r = controller_enter(&c, "cuCheckpointProcessGetState");
    if (r != CUDA_SUCCESS)
        return sim_leave(&c, r);
    if (!state)
        return sim_leave(&c, CUDA_ERROR_INVALID_VALUE);
    ck_rep rep;
    ck_req q = {.op = CK_GET_STATE};
    r = ck_call(pid, &q, &rep);
    if (r == CUDA_SUCCESS)
        *state = (CUprocessState)rep.state;
    return sim_leave(&c, r);
}

/* Lock, Checkpoint, Restore and Unlock: one request to the target each. */
static CUresult controller_op(const char *name, int pid, ck_req *q) {
    sim_call c;
    CUresult r = controller_enter(&c, name);
    if (r == CUDA_SUCCESS) {
        ck_rep rep;
        r = ck_call(pid, q, &rep);
    }
    return sim_leave(&c, r);
}

SIM_API CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
    ck_req q = {.op = CK_LOCK, .timeout_ms = args ? args->timeoutMs : 0};
    return controller_op("cuCheckpointProcessLock", pid, &q);
}

SIM_API CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args) {
    (void)args;
    ck_req q = {.op = CK_CHECKPOINT};
    return controller_op("cuCheckpointProcessCheckpoint", pid, &q);
}

SIM_API CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args) {
    ck_req q = {.op = CK_RESTORE};
    if (args && args->gpuPairsCount) {
        if (!args->gpuPairs || args->gpuPairsCount > SIM_MAX_DEVICES) {
            sim_call c;
            CUresult r = controller_enter(&c, "cuCheckpointProcessRestore");
            return sim_leave(&c, r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : r);
        }
        q.npairs = args->gpuPairsCount;
        memcpy(q.pairs, args->gpuPairs, sizeof(CUcheckpointGpuPair) * args->gpuPairsCount);
    }
    return controller_op("cuCheckpointProcessRestore", pid, &q);
}

SIM_API CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args) {
    (void)args;
    ck_req q = {.op = CK_UNLOCK};
    return controller_op("cuCheckpointProcessUnlock", pid, &q);
}

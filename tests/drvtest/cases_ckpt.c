/*
 * The checkpoint API, driven from this process against a child that holds
 * device memory (drvtest --helper ckpt_target). The child checks its own data
 * after the cycle and reports on its channel.
 */
#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "drvtest.h"

#define MIB (1ULL << 20)
#define TARGET_MIB 64

static void fill_words(uint32_t *w, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++)
        w[i] = seed * 0x9e3779b9u + (uint32_t)i;
}

static size_t count_bad(const uint32_t *w, size_t n, uint32_t seed) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += w[i] != seed * 0x9e3779b9u + (uint32_t)i;
    return bad;
}

/* ---- the target ---- */

/* A call that changes state: it waits while the process is locked or checkpointed. */
static void *call_thread(void *arg) {
    CUresult r = cuCtxSetCurrent((CUcontext)arg);
    dt_say("calling");
    CUdeviceptr p;
    if (r == CUDA_SUCCESS)
        r = cuMemAlloc(&p, 4096);
    dt_say("returned %d", (int)r);
    return NULL;
}

#define T_FAIL(...)                                                                                                    \
    do {                                                                                                               \
        dt_say(__VA_ARGS__);                                                                                           \
        return 1;                                                                                                      \
    } while (0)

/*
 * drvtest --helper ckpt_target [import]: 64 MiB of cuMemAlloc memory and 4 MiB
 * of VMM memory with known contents; with "import", also maps memory whose fd
 * arrives on fd 4. Says "ready", then obeys: verify, call, exit.
 */
static const char *uuid_text(const CUuuid *u) {
    static char s[48];
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return s;
}

static int helper_ckpt_target(int argc, char **argv) {
    bool import = argc > 0 && strcmp(argv[0], "import") == 0;
    CUdevice dev;
    CUcontext ctx;
    CUresult r;
    if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0)) || (r = cuDevicePrimaryCtxRetain(&ctx, dev)) ||
        (r = cuCtxSetCurrent(ctx)))
        T_FAIL("init: %s", dt_err(r));
    size_t n = TARGET_MIB * MIB / 4;
    uint32_t *h = malloc(n * 4);
    if (!h)
        T_FAIL("malloc");
    CUdeviceptr a;
    fill_words(h, n, 1);
    if ((r = cuMemAlloc(&a, n * 4)) || (r = cuMemcpyHtoD(a, h, n * 4)))
        T_FAIL("cuMemAlloc memory: %s", dt_err(r));
    CUmemAllocationProp prop = dt_vmm_prop(true);
    CUmemGenericAllocationHandle vh;
    CUdeviceptr va;
    CUmemAccessDesc d = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    fill_words(h, MIB, 2);
    if ((r = cuMemCreate(&vh, 4 * MIB, &prop, 0)) || (r = cuMemAddressReserve(&va, 4 * MIB, 0, 0, 0)) ||
        (r = cuMemMap(va, 4 * MIB, 0, vh, 0)) || (r = cuMemSetAccess(va, 4 * MIB, &d, 1)) ||
        (r = cuMemcpyHtoD(va, h, 4 * MIB)))
        T_FAIL("VMM memory: %s", dt_err(r));
    if (import) {
        int fd = dt_recv_fd(DT_HELPER_SOCK);
        CUmemGenericAllocationHandle ih;
        CUdeviceptr iva;
        if (fd < 0)
            T_FAIL("no fd to import");
        if ((r = cuMemImportFromShareableHandle(&ih, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) ||
            (r = cuMemAddressReserve(&iva, 2 * MIB, 0, 0, 0)) || (r = cuMemMap(iva, 2 * MIB, 0, ih, 0)) ||
            (r = cuMemSetAccess(iva, 2 * MIB, &d, 1)))
            T_FAIL("import: %s", dt_err(r));
        close(fd);
    }
    if ((r = cuCtxSynchronize()))
        T_FAIL("cuCtxSynchronize: %s", dt_err(r));
    dt_say("ready");
    char line[128];
    while (dt_hear(line, sizeof line)) {
        if (strcmp(line, "verify") == 0) {
            memset(h, 0, n * 4);
            if ((r = cuMemcpyDtoH(h, a, n * 4)))
                T_FAIL("verify: cuMemcpyDtoH: %s", dt_err(r));
            size_t bad = count_bad(h, n, 1);
            if (bad)
                T_FAIL("verify: %zu words of cuMemAlloc memory differ", bad);
            if ((r = cuMemcpyDtoH(h, va, 4 * MIB)))
                T_FAIL("verify: VMM cuMemcpyDtoH: %s", dt_err(r));
            if ((bad = count_bad(h, MIB, 2)))
                T_FAIL("verify: %zu words of VMM memory differ", bad);
            /* and the driver still works: a new allocation and a kernel */
            CUmodule m;
            CUfunction f;
            CUdeviceptr b;
            uint32_t v = 0x77, cnt = 256, back[256];
            void *args[] = {&b, &v, &cnt};
            if ((r = cuMemAlloc(&b, 1024)) || (r = cuModuleLoadData(&m, dt_ptx)) ||
                (r = cuModuleGetFunction(&f, m, "dt_fill")) ||
                (r = cuLaunchKernel(f, 2, 1, 1, 128, 1, 1, 0, NULL, args, NULL)) ||
                (r = cuMemcpyDtoH(back, b, sizeof back)))
                T_FAIL("verify: work after restore: %s", dt_err(r));
            if (back[0] != 0x77 || back[255] != 0x77)
                T_FAIL("verify: a kernel after restore wrote %x", back[0]);
            dt_say("verified ok");
        } else if (strcmp(line, "call") == 0) {
            /* on another thread, so that this one goes on answering */
            pthread_t t;
            if (pthread_create(&t, NULL, call_thread, ctx) != 0)
                T_FAIL("pthread_create");
            pthread_detach(t);
        } else if (strcmp(line, "query") == 0) {
            /* a call that only looks: it does not wait (measured) */
            size_t f, t;
            r = cuMemGetInfo(&f, &t);
            dt_say("queried %d", (int)r);
        } else if (strcmp(line, "uuid") == 0) {
            /* the GPU behind ordinal 0 now (a restore may have moved it) */
            CUuuid u;
            char bus[64];
            if ((r = cuDeviceGetUuid_v2(&u, dev)) || (r = cuDeviceGetPCIBusId(bus, (int)sizeof bus, dev)))
                T_FAIL("uuid: %s", dt_err(r));
            dt_say("uuid %s bus %s", uuid_text(&u), bus);
        } else if (strcmp(line, "exit") == 0) {
            break;
        }
    }
    free(h);
    return 0;
}

/* drvtest --helper idle: a live process that never touches CUDA. */
static int helper_idle(int argc, char **argv) {
    (void)argc;
    (void)argv;
    dt_say("ready");
    char line[64];
    while (dt_hear(line, sizeof line) && strcmp(line, "exit") != 0) {
    }
    return 0;
}

/* ---- the controller ---- */

static void start_target(dt_child *c, const char *mode) {
    const char *args[] = {mode, NULL};
    REQUIRE(dt_spawn(c, mode != NULL, "ckpt_target", mode ? args : NULL), "spawn the target");
}

static void wait_ready(dt_child *c) {
    char line[256] = "";
    bool got = dt_read_line(c->from, line, sizeof line, 60000);
    if (!got || strcmp(line, "ready") != 0) {
        dt_fail(__LINE__, "target: %s", got ? line : "no answer");
        dt_kill(c);
        dt_stop();
    }
}

static void expect_state(int pid, CUprocessState want, int line) {
    CUprocessState st = (CUprocessState)-1;
    CUresult r = cuCheckpointProcessGetState(pid, &st);
    if (dt_check_rc(r, CUDA_SUCCESS, "cuCheckpointProcessGetState", line))
        dt_check(st == want, line, "state %d, want %d", (int)st, (int)want);
}
#define STATE_IS(pid, want) expect_state(pid, want, __LINE__)

static void verify_target(dt_child *c) {
    char line[256] = "";
    dt_send_line(c->to, "verify");
    bool got = dt_read_line(c->from, line, sizeof line, 60000);
    EXPECT(got && strcmp(line, "verified ok") == 0, "target after the cycle: %s", got ? line : "no answer");
}

static void finish(dt_child *c) {
    dt_send_line(c->to, "exit");
    int st = dt_reap(c, 30000);
    EXPECT(st == 0, "target exit status %d", st);
}

/* The simulator's promise to CRIU: a checkpointed process holds no memfd, mapped or open. */
static void expect_no_memfd(int pid) {
    char path[64], target[256];
    snprintf(path, sizeof path, "/proc/%d/fd", pid);
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            char fp[320];
            snprintf(fp, sizeof fp, "/proc/%d/fd/%s", pid, de->d_name);
            ssize_t n = readlink(fp, target, sizeof target - 1);
            if (n > 0) {
                target[n] = 0;
                EXPECT(strncmp(target, "/memfd:", 7) != 0, "checkpointed target still holds fd %s -> %s", de->d_name,
                       target);
            }
        }
        closedir(d);
    }
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    FILE *f = fopen(path, "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            EXPECT(!strstr(line, "/memfd:"), "checkpointed target still maps %s", line);
        fclose(f);
    }
}

/* Locks and checkpoints a new target; its pid. */
static int checkpointed_target(dt_child *c) {
    start_target(c, NULL);
    wait_ready(c);
    REQUIRE_RC(cuCheckpointProcessLock(c->pid, NULL), CUDA_SUCCESS);
    REQUIRE_RC(cuCheckpointProcessCheckpoint(c->pid, NULL), CUDA_SUCCESS);
    return c->pid;
}

/* The GPU the target's ordinal 0 stands for now, and the bus id the driver gives for it. */
static void expect_target_uuid(dt_child *c, const char *want, const char *want_bus) {
    char line[256] = "", w[160];
    snprintf(w, sizeof w, "uuid %s bus %s", want, want_bus);
    dt_send_line(c->to, "uuid");
    bool got = dt_read_line(c->from, line, sizeof line, 60000);
    EXPECT(got && strcmp(line, w) == 0, "target's device 0 after the restore: %s, want %s", got ? line : "no answer",
           w);
}

static CUresult restore_pairs(int pid, const CUuuid *olds, const CUuuid *news, unsigned n) {
    CUcheckpointGpuPair p[4];
    CUcheckpointRestoreArgs a;
    memset(&a, 0, sizeof a);
    memset(p, 0, sizeof p);
    for (unsigned i = 0; i < n && i < 4; i++) {
        p[i].oldUuid = olds[i];
        p[i].newUuid = news[i];
    }
    a.gpuPairs = p;
    a.gpuPairsCount = n;
    return cuCheckpointProcessRestore(pid, &a);
}

/*
 * Restore onto another GPU (gpuPairs, driver 580 and newer), as measured on
 * two H200s: the pairs must name every GPU the process sees, used or not;
 * pairs that leave one out, or name a GPU that is not there, fail with
 * CUDA_ERROR_INVALID_VALUE and leave the process checkpointed, and a restore
 * with good pairs (or none) still works after them. A target that used
 * device 0, restored with both GPUs swapped, finds its memory and its
 * device 0 standing for the other GPU, whose UUID the driver gives; the
 * driver's PCI bus id for device 0 stays the old GPU's.
 */
static void ckpt_restore_gpu_pairs(void) {
    OK(cuInit(0));
    int n = 0;
    OK(cuDeviceGetCount(&n));
    if (n != 2)
        dt_skip("not two devices");
    CUuuid u[2], bogus;
    OK(cuDeviceGetUuid_v2(&u[0], 0));
    OK(cuDeviceGetUuid_v2(&u[1], 1));
    memset(&bogus, 0x5a, sizeof bogus);
    char u1[48], bus0[64];
    snprintf(u1, sizeof u1, "%s", uuid_text(&u[1]));
    OK(cuDeviceGetPCIBusId(bus0, (int)sizeof bus0, 0));
    CUuuid olds[2] = {u[0], u[1]}, swapped[2] = {u[1], u[0]};

    /* only the GPU it used: refused; then both, swapped */
    dt_child c;
    int pid = checkpointed_target(&c);
    EXPECT_RC(restore_pairs(pid, &u[0], &u[1], 1), CUDA_ERROR_INVALID_VALUE);
    STATE_IS(pid, CU_PROCESS_STATE_CHECKPOINTED);
    EXPECT_RC(restore_pairs(pid, olds, swapped, 2), CUDA_SUCCESS);
    STATE_IS(pid, CU_PROCESS_STATE_LOCKED);
    EXPECT_RC(cuCheckpointProcessUnlock(pid, NULL), CUDA_SUCCESS);
    verify_target(&c);
    /* measured: the driver's bus id for the ordinal stays the old GPU's (the interposer answers the new one's) */
    expect_target_uuid(&c, u1, bus0);
    finish(&c);

    /* a new GPU that is not there: refused; then the same GPUs */
    pid = checkpointed_target(&c);
    CUuuid news[2] = {bogus, u[1]};
    EXPECT_RC(restore_pairs(pid, olds, news, 2), CUDA_ERROR_INVALID_VALUE);
    STATE_IS(pid, CU_PROCESS_STATE_CHECKPOINTED);
    EXPECT_RC(cuCheckpointProcessRestore(pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessUnlock(pid, NULL), CUDA_SUCCESS);
    verify_target(&c);
    finish(&c);

    /* the GPU it used left out */
    pid = checkpointed_target(&c);
    EXPECT_RC(restore_pairs(pid, &u[1], &u[0], 1), CUDA_ERROR_INVALID_VALUE);
    STATE_IS(pid, CU_PROCESS_STATE_CHECKPOINTED);
    EXPECT_RC(cuCheckpointProcessRestore(pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessUnlock(pid, NULL), CUDA_SUCCESS);
    verify_target(&c);
    finish(&c);
}

static void ckpt_cycle(void) {
    OK(cuInit(0));
    bool sim = dt_is_sim();
    dt_child c;
    start_target(&c, NULL);
    wait_ready(&c);
    int pid = c.pid;
    STATE_IS(pid, CU_PROCESS_STATE_RUNNING);
    CUcheckpointLockArgs la;
    memset(&la, 0, sizeof la);
    la.timeoutMs = 20000;
    EXPECT_RC(cuCheckpointProcessLock(pid, &la), CUDA_SUCCESS);
    STATE_IS(pid, CU_PROCESS_STATE_LOCKED);
    EXPECT_RC(cuCheckpointProcessCheckpoint(pid, NULL), CUDA_SUCCESS);
    STATE_IS(pid, CU_PROCESS_STATE_CHECKPOINTED);
    if (sim)
        expect_no_memfd(pid);
    EXPECT_RC(cuCheckpointProcessRestore(pid, NULL), CUDA_SUCCESS);
    STATE_IS(pid, CU_PROCESS_STATE_LOCKED);
    EXPECT_RC(cuCheckpointProcessUnlock(pid, NULL), CUDA_SUCCESS);
    STATE_IS(pid, CU_PROCESS_STATE_RUNNING);
    verify_target(&c);
    /* and a second cycle on the same process */
    EXPECT_RC(cuCheckpointProcessLock(pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessCheckpoint(pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessRestore(pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessUnlock(pid, NULL), CUDA_SUCCESS);
    verify_target(&c);
    finish(&c);
}

/*
 * A controller that never calls cuInit, like NVIDIA's cuda-checkpoint: seen
 * working on driver 580 (cudackpt and the anchor's drvckpt), so the
 * simulator must allow it too.
 */
static void ckpt_no_init_controller(void) {
    dt_child c;
    start_target(&c, NULL);
    wait_ready(&c);
    STATE_IS(c.pid, CU_PROCESS_STATE_RUNNING);
    EXPECT_RC(cuCheckpointProcessLock(c.pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessCheckpoint(c.pid, NULL), CUDA_SUCCESS);
    STATE_IS(c.pid, CU_PROCESS_STATE_CHECKPOINTED);
    EXPECT_RC(cuCheckpointProcessRestore(c.pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessUnlock(c.pid, NULL), CUDA_SUCCESS);
    verify_target(&c);
    /* and the controller's own driver is still uninitialized */
    int n = 0;
    EXPECT_RC(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    finish(&c);
}

static void query_target(dt_child *c, CUresult want, const char *when) {
    char line[256] = "", exp[64];
    snprintf(exp, sizeof exp, "queried %d", (int)want);
    dt_send_line(c->to, "query");
    bool got = dt_read_line(c->from, line, sizeof line, 5000);
    EXPECT(got && strcmp(line, exp) == 0, "cuMemGetInfo in a %s process: %s, want %s", when, got ? line : "blocked",
           exp);
}

static void ckpt_gate(void) {
    OK(cuInit(0));
    dt_child c;
    start_target(&c, NULL);
    wait_ready(&c);
    EXPECT_RC(cuCheckpointProcessLock(c.pid, NULL), CUDA_SUCCESS);
    query_target(&c, CUDA_SUCCESS, "locked");
    dt_send_line(c.to, "call");
    char line[256] = "";
    EXPECT(dt_read_line(c.from, line, sizeof line, 10000) && strcmp(line, "calling") == 0, "target: %s", line);
    line[0] = 0;
    EXPECT(!dt_read_line(c.from, line, sizeof line, 1000), "cuMemAlloc returned while the process was locked: %s",
           line);
    EXPECT_RC(cuCheckpointProcessCheckpoint(c.pid, NULL), CUDA_SUCCESS);
    query_target(&c, EXP_CKPT_MEMINFO_CHECKPOINTED, "checkpointed");
    EXPECT_RC(cuCheckpointProcessRestore(c.pid, NULL), CUDA_SUCCESS);
    EXPECT(!dt_read_line(c.from, line, sizeof line, 500), "cuMemAlloc returned while the process was locked: %s", line);
    EXPECT_RC(cuCheckpointProcessUnlock(c.pid, NULL), CUDA_SUCCESS);
    bool got = dt_read_line(c.from, line, sizeof line, 10000);
    EXPECT(got && strcmp(line, "returned 0") == 0, "after unlock the blocked call: %s", got ? line : "no answer");
    finish(&c);
}

static void ckpt_wrong_state(void) {
    OK(cuInit(0));
    dt_child c;
    start_target(&c, NULL);
    wait_ready(&c);
    int pid = c.pid;
    const CUresult IS = CUDA_ERROR_ILLEGAL_STATE;
    EXPECT_RC(cuCheckpointProcessCheckpoint(pid, NULL), IS);
    EXPECT_RC(cuCheckpointProcessRestore(pid, NULL), IS);
    EXPECT_RC(cuCheckpointProcessUnlock(pid, NULL), IS);
    EXPECT_RC(cuCheckpointProcessLock(pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessLock(pid, NULL), IS);
    EXPECT_RC(cuCheckpointProcessRestore(pid, NULL), IS);
    EXPECT_RC(cuCheckpointProcessCheckpoint(pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessCheckpoint(pid, NULL), IS);
    EXPECT_RC(cuCheckpointProcessUnlock(pid, NULL), IS);
    EXPECT_RC(cuCheckpointProcessLock(pid, NULL), IS);
    EXPECT_RC(cuCheckpointProcessRestore(pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessRestore(pid, NULL), IS);
    EXPECT_RC(cuCheckpointProcessUnlock(pid, NULL), CUDA_SUCCESS);
    STATE_IS(pid, CU_PROCESS_STATE_RUNNING);
    verify_target(&c);
    finish(&c);
}

static void ckpt_unknown_pid(void) {
    OK(cuInit(0));
    /* a pid that just died and was reaped is free */
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0);
    REQUIRE(kill(pid, 0) < 0 && errno == ESRCH, "pid %d reused already", (int)pid);
    CUprocessState st;
    int tid;
    EXPECT_RC(cuCheckpointProcessGetState(pid, &st), EXP_CKPT_NO_PROCESS);
    EXPECT_RC(cuCheckpointProcessLock(pid, NULL), EXP_CKPT_NO_PROCESS);
    EXPECT_RC(cuCheckpointProcessGetRestoreThreadId(pid, &tid), EXP_CKPT_NO_PROCESS);
}

static void ckpt_no_cuda(void) {
    OK(cuInit(0));
    dt_child c;
    REQUIRE(dt_spawn(&c, false, "idle", NULL), "spawn");
    wait_ready(&c);
    CUprocessState st;
    int tid;
    EXPECT_RC(cuCheckpointProcessGetState(c.pid, &st), EXP_CKPT_NO_CUDA);
    EXPECT_RC(cuCheckpointProcessLock(c.pid, NULL), EXP_CKPT_NO_CUDA);
    EXPECT_RC(cuCheckpointProcessGetRestoreThreadId(c.pid, &tid), EXP_CKPT_NO_CUDA);
    finish(&c);
}

static void ckpt_restore_tid(void) {
    OK(cuInit(0));
    dt_child c;
    start_target(&c, NULL);
    wait_ready(&c);
    int tid = 0;
    if (EXPECT_RC(cuCheckpointProcessGetRestoreThreadId(c.pid, &tid), CUDA_SUCCESS)) {
        char path[64];
        struct stat sb;
        snprintf(path, sizeof path, "/proc/%d/task/%d", c.pid, tid);
        EXPECT(tid != c.pid && stat(path, &sb) == 0, "restore thread %d is not a thread of %d", tid, c.pid);
    }
    EXPECT_RC(cuCheckpointProcessGetRestoreThreadId(c.pid, NULL), CUDA_ERROR_INVALID_VALUE);
    finish(&c);
}

static void ckpt_imported(void) {
    dt_init_ctx();
    CUmemAllocationProp prop = dt_vmm_prop(true);
    CUmemGenericAllocationHandle h;
    OK(cuMemCreate(&h, 2 * MIB, &prop, 0));
    int fd = -1;
    OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    dt_child c;
    start_target(&c, "import");
    REQUIRE(dt_send_fd(c.sock, fd), "SCM_RIGHTS");
    close(fd);
    wait_ready(&c);
    EXPECT_RC(cuCheckpointProcessLock(c.pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessCheckpoint(c.pid, NULL), CUDA_SUCCESS);
    /* measured on the driver: imported memory still mapped at checkpoint makes restore fail, for good */
    EXPECT_RC(cuCheckpointProcessRestore(c.pid, NULL), CUDA_ERROR_NOT_SUPPORTED);
    STATE_IS(c.pid, CU_PROCESS_STATE_CHECKPOINTED);
    EXPECT_RC(cuCheckpointProcessRestore(c.pid, NULL), EXP_CKPT_RESTORE_AFTER_FAILED);
    dt_kill(&c);
    OK(cuMemRelease(h));
}

static char proc_state(int pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] ? p[2] : '?';
}

static void ckpt_restore_stopped(void) {
    OK(cuInit(0));
    dt_child c;
    start_target(&c, NULL);
    wait_ready(&c);
    EXPECT_RC(cuCheckpointProcessLock(c.pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessCheckpoint(c.pid, NULL), CUDA_SUCCESS);
    REQUIRE(kill(c.pid, SIGSTOP) == 0, "SIGSTOP");
    for (int i = 0; i < 200 && proc_state(c.pid) != 'T'; i++)
        dt_sleep_ms(10);
    uint64_t t0 = dt_now_ms();
    /* drvtest sets GPUCR_SIM_RESTORE_TIMEOUT_MS=2000 */
    EXPECT_RC(cuCheckpointProcessRestore(c.pid, NULL), CUDA_ERROR_TIMEOUT);
    uint64_t took = dt_now_ms() - t0;
    EXPECT(took >= 1500 && took < 20000, "the stopped restore timed out after %llu ms", (unsigned long long)took);
    REQUIRE(kill(c.pid, SIGCONT) == 0, "SIGCONT");
    STATE_IS(c.pid, CU_PROCESS_STATE_CHECKPOINTED);
    EXPECT_RC(cuCheckpointProcessRestore(c.pid, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCheckpointProcessUnlock(c.pid, NULL), CUDA_SUCCESS);
    verify_target(&c);
    finish(&c);
}

const dt_case dt_cases_ckpt[] = {
    {"ckpt_cycle", ckpt_cycle, 0},
    {"ckpt_no_init_controller", ckpt_no_init_controller, 0},
    {"ckpt_gate", ckpt_gate, 0},
    {"ckpt_wrong_state", ckpt_wrong_state, 0},
    {"ckpt_unknown_pid", ckpt_unknown_pid, 0},
    {"ckpt_no_cuda", ckpt_no_cuda, 0},
    {"ckpt_restore_tid", ckpt_restore_tid, 0},
    {"ckpt_imported", ckpt_imported, 0},
    {"ckpt_restore_stopped", ckpt_restore_stopped, DT_SIM_ONLY},
    {"ckpt_restore_gpu_pairs", ckpt_restore_gpu_pairs, 0},
    {NULL, NULL, 0},
};

const dt_helper dt_helpers_ckpt[] = {
    {"ckpt_target", helper_ckpt_target},
    {"idle", helper_idle},
    {NULL, NULL},
};

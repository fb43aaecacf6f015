/*
 * cudackpt: drives the CUDA driver's checkpoint API on another process, as
 * NVIDIA's cuda-checkpoint does (and CRIU's cuda plugin around a dump).
 *
 *   cudackpt [--timeout-ms N] ACTION... PID
 *
 * ACTION is one of
 *   lock        cuCheckpointProcessLock (timeoutMs = N; 0, the default, waits
 *               without a limit, as the driver defines it)
 *   checkpoint  cuCheckpointProcessCheckpoint (device memory to host)
 *   restore     cuCheckpointProcessRestore
 *   unlock      cuCheckpointProcessUnlock
 *   state       cuCheckpointProcessGetState: prints state=running|locked|
 *               checkpointed|failed
 *   tid         cuCheckpointProcessGetRestoreThreadId: prints tid=TID
 * run in the order given, each timed and printed as
 *   cudackpt ACTION pid=PID rc=RC (NAME) 0.123 s [state=... | tid=...]
 * The first failure also prints the driver's error name and string on stderr
 * and exits 1. Usage errors exit 2.
 *
 * No context is created: these calls act on the target process. They need
 * no cuInit in the calling process (seen on driver 580, and so in the
 * simulator; drvtest case ckpt_no_init_controller). Should a driver answer
 * CUDA_ERROR_NOT_INITIALIZED, this tool calls cuInit(0) and retries once.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuapp.h"

static unsigned timeout_ms;
static int initialized;

static const char *state_name(CUprocessState s) {
    switch (s) {
    case CU_PROCESS_STATE_RUNNING: return "running";
    case CU_PROCESS_STATE_LOCKED: return "locked";
    case CU_PROCESS_STATE_CHECKPOINTED: return "checkpointed";
    case CU_PROCESS_STATE_FAILED: return "failed";
    }
    return "unknown";
}

static const char *const actions[] = {"lock", "checkpoint", "restore", "unlock", "state", "tid"};
#define NACTIONS (sizeof(actions) / sizeof(actions[0]))

static int action_index(const char *s) {
    for (unsigned i = 0; i < NACTIONS; i++)
        if (!strcmp(s, actions[i]))
            return (int)i;
    return -1;
}

/* One driver call; *extra gets "state=..." or "tid=..." where there is one. */
static CUresult call(int action, int pid, char *extra, size_t extra_len) {
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    switch (action) {
    case 0: {
        CUcheckpointLockArgs a;
        memset(&a, 0, sizeof(a));
        a.timeoutMs = timeout_ms;
        r = cuCheckpointProcessLock(pid, &a);
        break;
    }
    case 1: {
        CUcheckpointCheckpointArgs a;
        memset(&a, 0, sizeof(a));
        r = cuCheckpointProcessCheckpoint(pid, &a);
        break;
    }
    case 2: {
        CUcheckpointRestoreArgs a;
        memset(&a, 0, sizeof(a));
        r = cuCheckpointProcessRestore(pid, &a);
        break;
    }
    case 3: {
        CUcheckpointUnlockArgs a;
        memset(&a, 0, sizeof(a));
        r = cuCheckpointProcessUnlock(pid, &a);
        break;
    }
    case 4: {
        CUprocessState s = CU_PROCESS_STATE_FAILED;
        r = cuCheckpointProcessGetState(pid, &s);
        if (r == CUDA_SUCCESS)
            snprintf(extra, extra_len, " state=%s", state_name(s));
        break;
    }
    case 5: {
        int tid = 0;
        r = cuCheckpointProcessGetRestoreThreadId(pid, &tid);
        if (r == CUDA_SUCCESS)
            snprintf(extra, extra_len, " tid=%d", tid);
        break;
    }
    }
    return r;
}

static void usage(int status) {
    fprintf(status ? stderr : stdout,
            "usage: cudackpt [--timeout-ms N] ACTION... PID\n"
            "  ACTION: lock checkpoint restore unlock state tid (run in order)\n"
            "  --timeout-ms N  lock timeout in ms (default 0: no limit)\n");
    exit(status);
}

int main(int argc, char **argv) {
    int first = 1;
    while (first < argc && !strncmp(argv[first], "--", 2)) {
        const char *opt = argv[first], *val = NULL;
        if (!strcmp(opt, "--help"))
            usage(0);
        if (!strncmp(opt, "--timeout-ms=", 13)) {
            val = opt + 13;
        } else if (!strcmp(opt, "--timeout-ms") && first + 1 < argc) {
            val = argv[++first];
        } else {
            fprintf(stderr, "cudackpt: unknown or incomplete option '%s'\n", opt);
            usage(2);
        }
        char *end = NULL;
        errno = 0;
        unsigned long v = strtoul(val, &end, 10);
        if (errno || end == val || *end || val[0] == '-' || v > 0xFFFFFFFFul) {
            fprintf(stderr, "cudackpt: bad --timeout-ms '%s'\n", val);
            usage(2);
        }
        timeout_ms = (unsigned)v;
        first++;
    }
    if (argc - first < 2)
        usage(2);
    char *end = NULL;
    errno = 0;
    long pid = strtol(argv[argc - 1], &end, 10);
    if (errno || end == argv[argc - 1] || *end || pid <= 0 || pid > 0x7FFFFFFF) {
        fprintf(stderr, "cudackpt: bad pid '%s'\n", argv[argc - 1]);
        usage(2);
    }
    for (int i = first; i < argc - 1; i++)
        if (action_index(argv[i]) < 0) {
            fprintf(stderr, "cudackpt: unknown action '%s'\n", argv[i]);
            usage(2);
        }

    for (int i = first; i < argc - 1; i++) {
        int action = action_index(argv[i]);
        char extra[64] = "";
        double t0 = gpuapp_now_s();
        CUresult r = call(action, (int)pid, extra, sizeof(extra));
        if (r == CUDA_ERROR_NOT_INITIALIZED && !initialized) {
            /* See the top: this driver wants cuInit in the calling process. */
            initialized = 1;
            fprintf(stderr, "cudackpt: the driver answered CUDA_ERROR_NOT_INITIALIZED: calling cuInit(0)\n");
            CUresult ri = cuInit(0);
            if (ri != CUDA_SUCCESS) {
                fprintf(stderr, "cudackpt: cuInit(0) failed: %d %s: %s\n", (int)ri, gpuapp_err_name(ri),
                        gpuapp_err_string(ri));
                return 1;
            }
            r = call(action, (int)pid, extra, sizeof(extra));
        }
        double t1 = gpuapp_now_s();
        printf("cudackpt %s pid=%ld rc=%d (%s) %.3f s%s\n", actions[action], pid, (int)r, gpuapp_err_name(r), t1 - t0,
               extra);
        fflush(stdout);
        if (r != CUDA_SUCCESS) {
            fprintf(stderr, "cudackpt: %s pid=%ld failed: %s: %s\n", actions[action], pid, gpuapp_err_name(r),
                    gpuapp_err_string(r));
            return 1;
        }
    }
    return 0;
}

/*
 * gpucr_plugin.so: the CRIU (>= 4.2) plugin. Each hook is forwarded to the
 * gpucr helper (docs/helper-protocol.md, ROLE_PLUGIN):
 *
 *   init(RESTORE)            DIR/gpucr exists -> PrepareRestore{DIR} with CRIU's DIR fd:
 *                            the helper checks the image and makes the memory,
 *                            then loads it while CRIU restores; failure fails
 *                            the restore before anything changed. $GPUCR_DEVICE_MAP
 *                            (OLD=NEW,...) puts the image's GPUs onto others
 *   PAUSE_DEVICES(pid)       (dump only) Checkpoint{pid, DIR, detach} with CRIU's DIR fd; a pid the
 *                            helper does not know (or no helper) -> -ENOTSUP. With
 *                            $GPUCR_PARENT (an absolute image directory) the GPU image is
 *                            incremental against it; with $GPUCR_CONCURRENT=1 the copy
 *                            runs after the process does (a snapshot on the device)
 *   CHECKPOINT_DEVICES(pid)  0 for a pid checkpointed above, else -ENOTSUP
 *   exit(DUMP, ret)          DumpDone{pid, alive} for each checkpointed pid (see
 *                            dumpdone_monitor: CRIU calls exit before it kills
 *                            or resumes the tree)
 *   POST_FORKING             after a PrepareRestore: AwaitLoad, once CRIU has forked the
 *                            tasks (they restore their memory meanwhile): a GPU image that
 *                            does not load (a damaged chunk) fails the restore there, and
 *                            CRIU kills the tasks before any of them runs (with
 *                            GPUCR_ON_DEMAND=1 the helper answers once the load runs:
 *                            the processes run while it loads)
 *   RESUME_DEVICES_LATE(pid) after a PrepareRestore: Restored{pid}; failure kills pid
 *                            (kill_restored)
 *
 * Messages go to stderr, prefixed "gpucr_plugin: ", and are appended to the
 * file $GPUCR_PLUGIN_LOG names, if set; GPUCR_LOG=debug adds debug lines.
 * Replies are waited for without a timeout (a checkpoint of a large GPU
 * process takes seconds); a helper that goes away is an error.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* CR_PLUGIN_DESC is the one symbol CRIU needs; everything else stays hidden. */
#pragma GCC visibility push(default)
#include <criu/criu-plugin.h>
#pragma GCC visibility pop

#include "wire.h" /* protocol/c: framing, the round trip */

typedef Gpucr__Helper__V1__Request Req;
typedef Gpucr__Helper__V1__Response Resp;

#define PFX "gpucr_plugin: "
#define MAX_PIDS 256 /* GPU processes in one dump, all in one GPU image */

static struct {
    int stage;
    int sock; /* helper connection, -1 until first need */
    uint64_t next_id;
    bool prepared; /* PrepareRestore succeeded in this CRIU run */
    int npids;     /* checkpointed (detached) by PAUSE_DEVICES */
    pid_t pids[MAX_PIDS];
    unsigned long long start[MAX_PIDS]; /* /proc/PID/stat starttime: guards against pid reuse */
    char sockpath[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char dir[PATH_MAX]; /* CRIU's image directory, where the GPU image of this dump goes */
} P = {.stage = -1, .sock = -1};

static bool debug_on(void) {
    const char *l = getenv("GPUCR_LOG");
    return l && strcmp(l, "debug") == 0;
}

/*
 * Appends one message line to the file $GPUCR_PLUGIN_LOG names, if set: CRIU
 * run through its RPC (go-criu, as `gpucr checkpoint` does) discards its
 * stderr, so this is how the caller gets the plugin's messages. The file is
 * opened for each line (the dump-done monitor writes after CRIU has exited),
 * never through a symlink (O_NOFOLLOW), without waiting on a FIFO (O_NONBLOCK),
 * and only a regular file is written to; one write() per line, so lines of
 * several processes do not mix. Failures are ignored: stderr has the message.
 */
static void plugin_log_append(const char *line, size_t len) {
    const char *path = getenv("GPUCR_PLUGIN_LOG");
    if (!path || !*path)
        return;
    int saved = errno;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0600);
    if (fd >= 0) {
        struct stat sb;
        if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
            ssize_t n = write(fd, line, len);
            (void)n;
        }
        close(fd);
    }
    errno = saved;
}

/*
 * CRIU's own logger, which the criu binary exports (its plugins' pr_err and
 * friends end there). Declared here, weak, with the levels of CRIU's log.h:
 * the public headers do not ship that file. Through it the plugin's messages
 * land in CRIU's log (dump.log, restore.log) among CRIU's, where whoever
 * reads the log finds the reason a dump or restore was refused.
 */
#define CRIU_LOG_ERROR 1
#define CRIU_LOG_DEBUG 4
extern void print_on_level(unsigned int loglevel, const char *format, ...) __attribute__((weak, format(printf, 2, 3)));

/* Set in the dump-done monitor, which closed CRIU's log (and may have reused its fd). */
static bool no_criu_log;

static void __attribute__((format(printf, 1, 2))) perr(const char *fmt, ...) {
    char msg[1024], line[sizeof msg + sizeof PFX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int n = snprintf(line, sizeof line, PFX "%s\n", msg);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    fputs(line, stderr);
    fflush(stderr);
    plugin_log_append(line, len);
    if (print_on_level && !no_criu_log)
        print_on_level(strncmp(msg, "debug: ", 7) == 0 ? CRIU_LOG_DEBUG : CRIU_LOG_ERROR, "%s", line);
}

#define pdebug(...)                                                                                                    \
    do {                                                                                                               \
        if (debug_on())                                                                                                \
            perr("debug: " __VA_ARGS__);                                                                               \
    } while (0)

static const char *socket_path(void) {
    const char *e = getenv("GPUCR_SOCKET");
    return e && *e ? e : "/run/gpucr/helper.sock";
}

static const char *code_name(int code) {
    switch (code) {
    case GPUCR__HELPER__V1__ERROR_CODE__ERROR_VERSION_MISMATCH: return "version mismatch";
    case GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST: return "bad request";
    case GPUCR__HELPER__V1__ERROR_CODE__ERROR_NOT_FOUND: return "not found";
    case GPUCR__HELPER__V1__ERROR_CODE__ERROR_PERMISSION: return "permission denied";
    case GPUCR__HELPER__V1__ERROR_CODE__ERROR_OUT_OF_MEMORY: return "out of GPU memory";
    case GPUCR__HELPER__V1__ERROR_CODE__ERROR_DRIVER: return "driver error";
    case GPUCR__HELPER__V1__ERROR_CODE__ERROR_STATE: return "wrong state";
    case GPUCR__HELPER__V1__ERROR_CODE__ERROR_UNAVAILABLE: return "unavailable";
    case GPUCR__HELPER__V1__ERROR_CODE__ERROR_TIMEOUT: return "timeout";
    default: return "error";
    }
}

/*
 * The image directory the GPU image goes into (dump) or comes from
 * (restore): its descriptor (the result; not to be closed), and its path
 * resolved through /proc for messages. The descriptor goes to the helper
 * with Checkpoint and PrepareRestore: the helper writes and reads only
 * beneath it. It is CRIU's own image directory, unless gpucr's CLI runs CRIU
 * in a private directory of its own inside the user's and passes the user's
 * as the descriptor GPUCR_IMAGE_DIR_FD names.
 */
static int image_dir(char *out, size_t n) {
    int fd;
    const char *e = getenv("GPUCR_IMAGE_DIR_FD");
    if (e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        struct stat sb;
        if (*end || v < 0 || v > INT_MAX || fstat((int)v, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
            perr("GPUCR_IMAGE_DIR_FD=%s names no open directory", e);
            return -1;
        }
        fd = (int)v;
    } else {
        fd = criu_get_image_dir();
    }
    if (fd < 0) {
        perr("CRIU has no image directory open");
        return -1;
    }
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, out, n - 1);
    if (k < 0) {
        perr("cannot resolve CRIU's image directory (%s): %s", link, strerror(errno));
        return -1;
    }
    if ((size_t)k >= n - 1) {
        perr("CRIU's image directory path is too long");
        return -1;
    }
    out[k] = 0;
    return fd;
}

static void disconnect(void) {
    if (P.sock >= 0)
        close(P.sock);
    P.sock = -1;
}

/* One request, one response. 0 (*out set; check (*out)->error) or -errno (transport).
 * fd, if not -1, goes with the request (SCM_RIGHTS): the image directory. */
static int roundtrip_fd(Req *req, int fd, Resp **out) {
    req->id = ++P.next_id;
    int rc = wire_roundtrip(P.sock, req, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, out, NULL, 0, NULL, false);
    if (rc < 0)
        disconnect();
    return rc;
}

static int roundtrip(Req *req, Resp **out) { return roundtrip_fd(req, -1, out); }

static const char *transport_err(int rc) {
    if (rc == -EAGAIN || rc == -EWOULDBLOCK)
        return "no answer from the helper within GPUCR_PLUGIN_TIMEOUT_S (default 600 s)";
    return rc == -EPIPE || rc == -ECONNRESET ? "the helper closed the connection (did it exit or crash?)"
                                             : strerror(-rc);
}

/*
 * One request to the helper on the plugin's connection, with the descriptor
 * fd if not -1. 0: it succeeded, and *out (if out is not NULL) holds the
 * reply, which the caller frees. Else why says what went wrong, and the
 * result is the helper's error code (> 0), or -1 when no answer came (the
 * connection is then closed).
 */
static int call_fd(Req *req, int fd, Resp **out, char *why, size_t n) {
    Resp *r = NULL;
    int rc = roundtrip_fd(req, fd, &r);
    if (rc < 0) {
        snprintf(why, n, "%s", transport_err(rc));
        return -1;
    }
    if (r->error) {
        int code = (int)r->error->code;
        if (code <= 0)
            code = -1; /* ERROR_UNSPECIFIED is a failure too */
        snprintf(why, n, "%s: %s", code_name(r->error->code), r->error->message);
        gpucr__helper__v1__response__free_unpacked(r, NULL);
        return code;
    }
    why[0] = 0;
    if (out)
        *out = r;
    else
        gpucr__helper__v1__response__free_unpacked(r, NULL);
    return 0;
}

static int call(Req *req, Resp **out, char *why, size_t n) { return call_fd(req, -1, out, why, n); }

/*
 * Connect and Hello, once per CRIU run. 0; 1: no helper listens (no socket,
 * or a stale one); -1: error, printed.
 */
static int helper_connect(void) {
    if (P.sock >= 0)
        return 0;
    const char *path = socket_path();
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) {
        perr("helper socket path %s is too long", path);
        return -1;
    }
    strcpy(a.sun_path, path);
    snprintf(P.sockpath, sizeof P.sockpath, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        perr("socket: %s", strerror(errno));
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        int e = errno;
        close(fd);
        if (e == ENOENT || e == ECONNREFUSED || e == ENOTDIR) {
            pdebug("no helper at %s (%s)", path, strerror(e));
            return 1;
        }
        perr("cannot connect to the gpucr helper at %s: %s", path, strerror(e));
        return -1;
    }
    /* Run as root (CRIU), the plugin hands the helper CRIU's image
     * directory and acts on what it answers: it talks only to a helper that
     * runs as root too, never to a process of a user who named the socket
     * (GPUCR_SOCKET, kept by `sudo -E`). */
    if (geteuid() == 0) {
        struct ucred peer = {0};
        socklen_t plen = sizeof peer;
        bool known = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &plen) == 0;
        if (!known || peer.uid != 0) {
            perr("the process listening on %s is not a gpucr helper run by root (uid %ld): not used", path,
                 known ? (long)peer.uid : -1L);
            close(fd);
            return -1;
        }
    }
    /* Every wait for the helper ends: a reply that does not come within
     * GPUCR_PLUGIN_TIMEOUT_S (default 600: a checkpoint's reply comes after
     * all of the process's GPU memory is copied) fails the hook, the
     * connection is closed, and the helper, seeing it close, gives the
     * processes back (dump) or drops what it prepared (restore). */
    const char *ts = getenv("GPUCR_PLUGIN_TIMEOUT_S");
    long tsec = ts && atol(ts) > 0 ? atol(ts) : 600;
    struct timeval tv = {.tv_sec = tsec};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0)
        perr("cannot bound the waits for the helper (%s): they may wait forever", strerror(errno));
    P.sock = fd;
    Gpucr__Helper__V1__Hello h = GPUCR__HELPER__V1__HELLO__INIT;
    h.protocol_version = GPUCR__HELPER__V1__VERSION__PROTOCOL_VERSION;
    h.role = GPUCR__HELPER__V1__ROLE__ROLE_PLUGIN;
    h.program = (char *)"criu";
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_HELLO;
    req.hello = &h;
    Resp *r = NULL;
    int rc = roundtrip(&req, &r);
    if (rc < 0) {
        perr("hello to the gpucr helper at %s failed: %s", path, transport_err(rc));
        return -1;
    }
    if (r->error || r->body_case != GPUCR__HELPER__V1__RESPONSE__BODY_HELLO ||
        r->hello->protocol_version != GPUCR__HELPER__V1__VERSION__PROTOCOL_VERSION) {
        if (r->error)
            perr("the gpucr helper at %s refused the plugin: %s: %s", path, code_name(r->error->code),
                 r->error->message);
        else
            perr("the gpucr helper at %s speaks protocol version %u, this plugin %d", path,
                 r->body_case == GPUCR__HELPER__V1__RESPONSE__BODY_HELLO ? r->hello->protocol_version : 0,
                 GPUCR__HELPER__V1__VERSION__PROTOCOL_VERSION);
        gpucr__helper__v1__response__free_unpacked(r, NULL);
        disconnect();
        return -1;
    }
    pdebug("connected to helper %s at %s", r->hello->helper_version, path);
    gpucr__helper__v1__response__free_unpacked(r, NULL);
    return 0;
}

/*
 * /proc/PID/stat: state letter, flags, starttime. 0, or -1 when there is no
 * such process.
 */
static int proc_stat(pid_t pid, char *state, unsigned long *flags, unsigned long long *start) {
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    /* after ")": state(3) ppid pgrp session tty_nr tpgid flags(9) ... starttime(22) */
    char st = 0;
    unsigned long fl = 0;
    unsigned long long s = 0;
    if (sscanf(p + 1, " %c %*d %*d %*d %*d %*d %lu %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &st, &fl,
               &s) != 3)
        return -1;
    *state = st;
    *flags = fl;
    *start = s;
    return 0;
}

/* SIGKILL pending (queued for the thread or the process): the process is dying. */
static bool sigkill_pending(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    bool dying = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long long m;
        if ((sscanf(line, "SigPnd: %llx", &m) == 1 || sscanf(line, "ShdPnd: %llx", &m) == 1) && (m & (1ull << (9 - 1))))
            dying = true;
    }
    fclose(f);
    return dying;
}

#define PF_EXITING_FLAG 0x00000004ul

/* The process runs on: it exists, is the one checkpointed, and is not dying or a zombie. */
static bool process_alive(int i) {
    char st;
    unsigned long fl;
    unsigned long long start;
    if (proc_stat(P.pids[i], &st, &fl, &start) < 0)
        return false;
    if (start != P.start[i] || st == 'Z' || st == 'X' || st == 'x' || (fl & PF_EXITING_FLAG))
        return false;
    return !sigkill_pending(P.pids[i]);
}

/* ---- hooks ---- */

static int gpucr_pause_devices(int pid) {
    if (P.stage != CR_PLUGIN_STAGE__DUMP)
        return -ENOTSUP; /* pre-dump: the GPU keeps running */
    int c = helper_connect();
    if (c == 1)
        return -ENOTSUP;
    if (c < 0) {
        perr("cannot checkpoint the GPU state of pid %d: no usable gpucr helper", pid);
        return -1;
    }
    char dir[PATH_MAX];
    int dirfd = image_dir(dir, sizeof dir);
    if (dirfd < 0)
        return -1;

    if (P.npids == MAX_PIDS) {
        perr("more than %d GPU processes in one dump", MAX_PIDS);
        return -1;
    }

    char st;
    unsigned long fl;
    unsigned long long start = 0;
    if (proc_stat(pid, &st, &fl, &start) < 0)
        start = 0;

    /* An incremental GPU image: GPUCR_PARENT names the parent image
     * directory (gpucr checkpoint --parent or --auto-parent sets it in
     * CRIU's environment); only chunks its chain lacks are copied. */
    const char *parent = getenv("GPUCR_PARENT");
    if (parent && *parent && parent[0] != '/') {
        perr("GPUCR_PARENT=%s: the parent image directory must be an absolute path", parent);
        return -1;
    }

    Gpucr__Helper__V1__Checkpoint ck = GPUCR__HELPER__V1__CHECKPOINT__INIT;
    ck.pid = pid;
    ck.image_dir = dir;
    if (parent && *parent)
        ck.parent = (char *)parent;
    ck.detach = true;
    ck.leave_running = false;
    /* A concurrent checkpoint (gpucr checkpoint --leave-running sets
     * GPUCR_CONCURRENT=1): the GPU memory is snapshotted on the device and
     * written into the image after the process runs on. */
    const char *conc = getenv("GPUCR_CONCURRENT");
    ck.concurrent = conc && strcmp(conc, "1") == 0;
    /* Served mode's template (gpucr checkpoint --template sets
     * GPUCR_TEMPLATE=1): the library of a served process writes the script
     * that makes its objects in a new worker, and the image keeps it. */
    const char *tmpl = getenv("GPUCR_TEMPLATE");
    ck.template_ = tmpl && strcmp(tmpl, "1") == 0;
    /* Every GPU process of the dump goes into one image, committed when the
     * dump has succeeded (CommitImage in exit(DUMP)). */
    ck.defer_commit = true;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_CHECKPOINT;
    req.checkpoint = &ck;
    Resp *r = NULL;
    char why[1024];
    int rc = call_fd(&req, dirfd, &r, why, sizeof why);
    if (rc == GPUCR__HELPER__V1__ERROR_CODE__ERROR_NOT_FOUND) {
        pdebug("pid %d is not a gpucr client", pid);
        return -ENOTSUP;
    }
    if (rc != 0) {
        perr("checkpoint of the GPU state of pid %d failed: %s", pid, why);
        return -1;
    }
    if (r->body_case == GPUCR__HELPER__V1__RESPONSE__BODY_CHECKPOINT && r->checkpoint)
        pdebug("pid %d: GPU state checkpointed into %s/gpucr (%llu buffers, %llu bytes, %.3f s)", pid, dir,
               (unsigned long long)r->checkpoint->buffers, (unsigned long long)r->checkpoint->bytes,
               r->checkpoint->total_seconds);
    gpucr__helper__v1__response__free_unpacked(r, NULL);
    snprintf(P.dir, sizeof P.dir, "%s", dir);
    P.pids[P.npids] = pid;
    P.start[P.npids] = start;
    P.npids++;
    return 0;
}

static int gpucr_checkpoint_devices(int pid) {
    for (int i = 0; i < P.npids; i++)
        if (P.pids[i] == pid)
            return 0;
    return -ENOTSUP;
}

/* A restored process whose GPU memory could not be restored must not run: it
 * would wait for that memory forever, or compute on garbage. CRIU (4.1, 4.2) ignores
 * what this hook returns (cr-restore.c logs it at debug level and goes on), so
 * the plugin kills the task itself. The task is still ptrace-stopped by CRIU;
 * CRIU's next step, restoring its registers and detaching, then fails on the
 * dead task, and CRIU fails the restore and kills the rest of the tree. */
static void kill_restored(int pid, const char *why) {
    perr("GPU restore of pid %d failed: %s; killing it (it cannot run without its GPU memory)", pid, why);
    if (kill(pid, SIGKILL) < 0 && errno != ESRCH)
        perr("kill pid %d: %s", pid, strerror(errno));
}

static int gpucr_resume_devices_late(int pid) {
    if (!P.prepared || P.sock < 0)
        return -ENOTSUP;
    Gpucr__Helper__V1__Restored rs = GPUCR__HELPER__V1__RESTORED__INIT;
    rs.pid = pid;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_RESTORED;
    req.restored = &rs;
    char why[1024];
    int rc = call(&req, NULL, why, sizeof why);
    if (rc == GPUCR__HELPER__V1__ERROR_CODE__ERROR_NOT_FOUND)
        return -ENOTSUP;
    if (rc != 0) {
        kill_restored(pid, why);
        return -1;
    }
    return 0;
}

/* The last point where a failure stops CRIU's restore cleanly (cr-restore.c kills the forked tasks on it, before
 * any runs): every GPU image this restore prepared must have loaded. */
static int gpucr_post_forking(void) {
    if (!P.prepared || P.sock < 0)
        return -ENOTSUP;
    Gpucr__Helper__V1__AwaitLoad al = GPUCR__HELPER__V1__AWAIT_LOAD__INIT;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_AWAIT_LOAD;
    req.await_load = &al;
    char why[1024];
    int rc = call(&req, NULL, why, sizeof why);
    if (rc != 0) {
        perr("the GPU image did not load: %s; the restore stops before the restored processes run", why);
        return -1;
    }
    pdebug("GPU image loaded (POST_FORKING)");
    return 0;
}

static int prepare_restore(void) {
    char dir[PATH_MAX];
    int dirfd = image_dir(dir, sizeof dir);
    if (dirfd < 0)
        return -1;
    /* Looked at beneath CRIU's directory, nothing followed: whatever is at
     * gpucr (a symlink, a FIFO) goes to the helper, which refuses it by name. */
    struct stat sb;
    if (fstatat(dirfd, "gpucr", &sb, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno != ENOENT) {
            perr("cannot read the GPU image in %s/gpucr: %s", dir, strerror(errno));
            return -1;
        }
        return 0; /* not a gpucr image */
    }
    if (S_ISDIR(sb.st_mode) && fstatat(dirfd, "gpucr/manifest.pb", &sb, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno != ENOENT) {
            perr("cannot read the GPU image %s/gpucr/manifest.pb: %s", dir, strerror(errno));
            return -1;
        }
        /* No manifest in gpucr/: a dump whose GPU image was never committed.
         * Restoring the processes without their GPU memory would leave them
         * waiting for it forever. */
        perr("restore refused: the GPU image in %s/gpucr is incomplete (no manifest: its dump did not commit it)", dir);
        return -1;
    }
    int c = helper_connect();
    if (c != 0) {
        if (c == 1)
            perr("the image in %s holds GPU state, but no gpucr helper listens at %s (start `gpucr helper`)", dir,
                 socket_path());
        perr("restore refused: the GPU state in %s cannot be restored", dir);
        return -1;
    }
    Gpucr__Helper__V1__PrepareRestore pr = GPUCR__HELPER__V1__PREPARE_RESTORE__INIT;
    pr.image_dir = dir;
    /* onto other GPUs: the helper reads and checks the map (GPUCR_DEVICE_MAP) */
    const char *map = getenv("GPUCR_DEVICE_MAP");
    if (map && *map)
        pr.device_map = (char *)map;
    /* run before all GPU data is loaded (calls that touch what is not in yet wait for it) */
    const char *od = getenv("GPUCR_ON_DEMAND");
    pr.on_demand = od && *od && strcmp(od, "0") != 0;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_PREPARE_RESTORE;
    req.prepare_restore = &pr;
    char why[1024];
    if (call_fd(&req, dirfd, NULL, why, sizeof why) != 0) {
        perr("restore refused: the gpucr helper cannot restore the GPU state in %s: %s", dir, why);
        disconnect();
        return -1;
    }
    P.prepared = true;
    pdebug("GPU state in %s checked and being loaded by the helper", dir);
    return 0;
}

static int gpucr_init(int stage) {
    P.stage = stage;
    if (stage == CR_PLUGIN_STAGE__RESTORE)
        return prepare_restore();
    return 0;
}

/* DumpDone for every checkpointed pid on the (already connected) helper socket. */
static void send_dump_done(void) {
    for (int i = 0; i < P.npids; i++) {
        bool alive = process_alive(i);
        if (P.sock < 0) {
            perr("cannot tell the helper what became of pid %d (alive=%d): no helper connection", P.pids[i], alive);
            continue;
        }
        Gpucr__Helper__V1__DumpDone dd = GPUCR__HELPER__V1__DUMP_DONE__INIT;
        dd.pid = P.pids[i];
        dd.alive = alive;
        Req req = GPUCR__HELPER__V1__REQUEST__INIT;
        req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_DUMP_DONE;
        req.dump_done = &dd;
        char why[1024];
        if (call(&req, NULL, why, sizeof why) != 0)
            perr("dump done for pid %d (alive=%d) failed: %s%s", P.pids[i], alive, why,
                 alive ? " (the process may stay stopped waiting for its GPU)" : "");
        else
            pdebug("dump done for pid %d (alive=%d)", P.pids[i], alive);
    }
}

/*
 * CRIU calls exit(DUMP) before it kills the dumped tree (or, with
 * --leave-running or after a failure, lets it run): at this point every
 * process is still alive and seized, and the plugin cannot know its fate.
 * Nor may it wait here for DumpDone{alive} (the helper replies once the
 * process runs again, which it cannot while CRIU holds it). So a detached
 * monitor process waits until CRIU has exited (EOF on a pipe whose write end
 * only CRIU holds), then looks at each process and sends DumpDone on the
 * plugin's helper connection. It keeps CRIU's stderr for its messages.
 */
static void dumpdone_monitor(void) {
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) {
        perr("pipe: %s; telling the helper now, before CRIU has finished", strerror(errno));
        send_dump_done();
        return;
    }
    fflush(stderr);
    pid_t c = fork();
    if (c < 0) {
        perr("fork: %s; telling the helper now, before CRIU has finished", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        send_dump_done();
        return;
    }
    if (c == 0) {
        /* intermediate child: the monitor must not be CRIU's child */
        no_criu_log = true;
        setsid();
        pid_t g = fork();
        if (g != 0)
            _exit(g < 0 ? 1 : 0);
        close(pfd[1]);
        int keep[3] = {2, pfd[0], P.sock};
        int dn = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (dn >= 0) {
            dup2(dn, 0);
            dup2(dn, 1);
        }
        /* everything else CRIU had open (service fds, the image dir, an RPC socket) */
        DIR *d = opendir("/proc/self/fd");
        if (d) {
            int dfd = dirfd(d);
            struct dirent *de;
            int fds[1024], n = 0;
            while ((de = readdir(d)) && n < 1024) {
                char *end;
                long v = strtol(de->d_name, &end, 10);
                if (*end || end == de->d_name || v <= 2 || v == dfd || v == keep[1] || v == keep[2])
                    continue;
                fds[n++] = (int)v;
            }
            closedir(d);
            for (int i = 0; i < n; i++)
                close(fds[i]);
        }
        char b;
        for (;;) {
            ssize_t n = read(pfd[0], &b, 1);
            if (n == 0 || (n < 0 && errno != EINTR))
                break;
        }
        close(pfd[0]);
        send_dump_done();
        disconnect();
        _exit(0);
    }
    close(pfd[0]);
    int status;
    while (waitpid(c, &status, 0) < 0 && errno == EINTR)
        ;
    /* pfd[1] stays open until CRIU exits; the monitor owns the connection now */
    if (P.sock >= 0)
        close(P.sock);
    P.sock = -1;
}

/* Commits (dump succeeded) or drops (it failed) the GPU image of this dump. */
static void commit_image(bool abort) {
    if (P.sock < 0) {
        perr("cannot %s the GPU image in %s: no helper connection", abort ? "drop" : "commit", P.dir);
        return;
    }
    Gpucr__Helper__V1__CommitImage ci = GPUCR__HELPER__V1__COMMIT_IMAGE__INIT;
    ci.image_dir = P.dir;
    ci.abort = abort;
    Req req = GPUCR__HELPER__V1__REQUEST__INIT;
    req.body_case = GPUCR__HELPER__V1__REQUEST__BODY_COMMIT_IMAGE;
    req.commit_image = &ci;
    char why[1024];
    if (call(&req, NULL, why, sizeof why) != 0)
        perr("%s the GPU image in %s failed: %s%s", abort ? "dropping" : "committing", P.dir, why,
             abort ? "" : " (this image cannot be restored)");
    else
        pdebug("GPU image in %s %s", P.dir, abort ? "dropped" : "committed");
}

static void gpucr_fini(int stage, int ret) {
    if (stage == CR_PLUGIN_STAGE__DUMP && P.npids > 0) {
        pdebug("dump finished (ret %d): %d checkpointed process(es)", ret, P.npids);
        commit_image(ret != 0);
        dumpdone_monitor();
    }
    if (stage == CR_PLUGIN_STAGE__RESTORE && ret && P.prepared)
        perr("CRIU's restore failed after the gpucr helper loaded the GPU state; closing the plugin's connection");
    disconnect();
    P.npids = 0;
    P.prepared = false;
}

CR_PLUGIN_REGISTER("gpucr", gpucr_init, gpucr_fini)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__PAUSE_DEVICES, gpucr_pause_devices)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__CHECKPOINT_DEVICES, gpucr_checkpoint_devices)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__POST_FORKING, gpucr_post_forking)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__RESUME_DEVICES_LATE, gpucr_resume_devices_late)

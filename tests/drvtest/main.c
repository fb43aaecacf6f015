/* drvtest's runner, its checks and its process helpers (see drvtest.h). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "drvtest.h"

#define CASE_TIMEOUT_MS 180000

const char *dt_self;
const char *dt_case_name = "?";
static int nfail;

static const dt_case *const tables[] = {dt_cases_basic, dt_cases_mem, dt_cases_stream, dt_cases_module,
                                        dt_cases_func,  dt_cases_vmm, dt_cases_share,  dt_cases_ckpt};
static const dt_helper *const helper_tables[] = {dt_helpers_basic, dt_helpers_vmm, dt_helpers_share, dt_helpers_ckpt};

/* ---- checks ---- */

const char *dt_err(CUresult r) {
    static __thread char buf[8][96];
    static __thread int k;
    const char *name = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
        name = "?";
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s(%d)", name, (int)r);
    return b;
}

static void vfail(int line, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    printf("line %d: %s\n", line, msg);
    fflush(stdout);
    nfail++;
}

void dt_fail(int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(line, fmt, ap);
    va_end(ap);
}

bool dt_check(bool ok, int line, const char *fmt, ...) {
    if (ok)
        return true;
    va_list ap;
    va_start(ap, fmt);
    vfail(line, fmt, ap);
    va_end(ap);
    return false;
}

bool dt_check_rc(CUresult got, CUresult want, const char *expr, int line) {
    if (got == want)
        return true;
    dt_fail(line, "%s (got %s want %s)", expr, dt_err(got), dt_err(want));
    return false;
}

_Noreturn void dt_stop(void) {
    fflush(stdout);
    _exit(nfail ? 1 : 2);
}

_Noreturn void dt_skip(const char *why) {
    printf("SKIP %s\n", why);
    fflush(stdout);
    _exit(77);
}

/* ---- setup ---- */

bool dt_is_sim(void) {
    char name[128] = "";
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetName(name, sizeof name, 0) != CUDA_SUCCESS)
        return false;
    return strcmp(name, "gpucr simulated GPU") == 0;
}

CUcontext dt_init_ctx(void) {
    CUdevice dev;
    CUcontext ctx;
    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
    return ctx;
}

CUmodule dt_module(void) {
    CUmodule m;
    OK(cuModuleLoadData(&m, dt_ptx));
    return m;
}

CUfunction dt_function(CUmodule m, const char *name) {
    CUfunction f;
    CUresult r = cuModuleGetFunction(&f, m, name);
    if (r != CUDA_SUCCESS) {
        dt_fail(__LINE__, "cuModuleGetFunction(%s) (got %s)", name, dt_err(r));
        dt_stop();
    }
    return f;
}

CUdeviceptr dt_alloc(size_t bytes) {
    CUdeviceptr p;
    OK(cuMemAlloc(&p, bytes));
    return p;
}

void dt_launch_fill(CUfunction f, CUstream s, CUdeviceptr p, uint32_t v, uint32_t n) {
    void *args[] = {&p, &v, &n};
    OK(cuLaunchKernel(f, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s, args, NULL));
}

void dt_launch_delay_write(CUfunction f, CUstream s, CUdeviceptr p, uint64_t delay_ns, uint32_t v) {
    void *args[] = {&p, &delay_ns, &v};
    OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, NULL));
}

void *dt_sym(const char *name) {
    void *p = dlsym(RTLD_DEFAULT, name);
    if (!p) {
        dt_fail(__LINE__, "libcuda does not export %s", name);
        dt_stop();
    }
    return p;
}

uint64_t dt_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void dt_sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- child processes ---- */

static bool move_fd(int from, int to) {
    if (from == to)
        return fcntl(to, F_SETFD, 0) == 0;
    return dup2(from, to) == to;
}

bool dt_spawn(dt_child *c, bool with_sock, const char *mode, const char *const *args) {
    int in[2], out[2], sv[2] = {-1, -1};
    c->pid = -1;
    c->to = c->from = c->sock = -1;
    if (pipe2(in, O_CLOEXEC) < 0)
        return false;
    if (pipe2(out, O_CLOEXEC) < 0) {
        close(in[0]);
        close(in[1]);
        return false;
    }
    if (with_sock && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        return false;
    }
    const char *argv[32];
    int n = 0;
    argv[n++] = dt_self;
    argv[n++] = "--helper";
    argv[n++] = mode;
    for (int i = 0; args && args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        /* fds 3 and 4 may be taken by our own pipes: park everything above 10 first */
        int a = fcntl(in[0], F_DUPFD_CLOEXEC, 10), b = fcntl(out[1], F_DUPFD_CLOEXEC, 10);
        int s = with_sock ? fcntl(sv[1], F_DUPFD_CLOEXEC, 10) : -1;
        if (a < 0 || b < 0 || (with_sock && s < 0) || !move_fd(a, 0) || !move_fd(b, DT_HELPER_OUT) ||
            (with_sock && !move_fd(s, DT_HELPER_SOCK)))
            _exit(126);
        execv(dt_self, (char *const *)argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if (with_sock)
        close(sv[1]);
    c->pid = pid;
    c->to = in[1];
    c->from = out[0];
    c->sock = with_sock ? sv[0] : -1;
    return true;
}

bool dt_read_line(int fd, char *buf, size_t n, int timeout_ms) {
    size_t k = 0;
    uint64_t end = dt_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        uint64_t now = dt_now_ms();
        if (now >= end)
            return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)(end - now));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return false;
        char ch;
        ssize_t r = read(fd, &ch, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        if (ch == '\n') {
            buf[k] = 0;
            return true;
        }
        if (k + 1 < n)
            buf[k++] = ch;
    }
}

bool dt_send_line(int fd, const char *line) {
    char buf[512];
    int n = snprintf(buf, sizeof buf, "%s\n", line);
    return n > 0 && write(fd, buf, (size_t)n) == n;
}

int dt_reap(dt_child *c, int timeout_ms) {
    if (c->pid <= 0)
        return -1;
    uint64_t end = dt_now_ms() + (uint64_t)timeout_ms;
    int st;
    for (;;) {
        pid_t w = waitpid(c->pid, &st, WNOHANG);
        if (w == c->pid)
            break;
        if (w < 0 && errno != EINTR)
            return -1;
        if (dt_now_ms() >= end) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &st, 0);
            st = -1;
            break;
        }
        dt_sleep_ms(10);
    }
    c->pid = -1;
    if (c->to >= 0)
        close(c->to);
    if (c->from >= 0)
        close(c->from);
    if (c->sock >= 0)
        close(c->sock);
    c->to = c->from = c->sock = -1;
    if (st == -1)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void dt_kill(dt_child *c) {
    if (c->pid > 0) {
        kill(c->pid, SIGCONT);
        kill(c->pid, SIGKILL);
    }
    dt_reap(c, 5000);
}

void dt_say(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    if (write(DT_HELPER_OUT, buf, (size_t)n) != n)
        _exit(125);
}

bool dt_hear(char *buf, size_t n) { return dt_read_line(0, buf, n, INT_MAX); }

bool dt_send_fd(int sock, int fd) {
    char dummy = 'F';
    struct iovec iov = {.iov_base = &dummy, .iov_len = 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    return sendmsg(sock, &m, MSG_NOSIGNAL) == 1;
}

int dt_recv_fd(int sock) {
    char dummy;
    struct iovec iov = {.iov_base = &dummy, .iov_len = 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    if (recvmsg(sock, &m, MSG_CMSG_CLOEXEC) != 1)
        return -1;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    if (!cm || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
        return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    return fd;
}

bool dt_helper_import(CUmemGenericAllocationHandle *h) {
    int fd = dt_recv_fd(DT_HELPER_SOCK);
    CUdevice dev;
    CUcontext ctx;
    CUresult r;
    if (fd < 0) {
        dt_say("no fd received");
        return false;
    }
    if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0)) || (r = cuDevicePrimaryCtxRetain(&ctx, dev)) ||
        (r = cuCtxSetCurrent(ctx))) {
        dt_say("init: %s", dt_err(r));
        return false;
    }
    if ((r = cuMemImportFromShareableHandle(h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))) {
        dt_say("cuMemImportFromShareableHandle: %s", dt_err(r));
        return false;
    }
    close(fd);
    return true;
}

/* ---- runner ---- */

static const dt_case *find_case(const char *name) {
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (const dt_case *c = tables[t]; c->name; c++)
            if (strcmp(c->name, name) == 0)
                return c;
    return NULL;
}

static int run_case_here(const char *name) {
    const dt_case *c = find_case(name);
    if (!c) {
        printf("line 0: no case named %s\n", name);
        return 1;
    }
    dt_case_name = c->name;
    if ((c->flags & DT_SIM_ONLY) && !dt_is_sim()) {
        const char *p = getenv("GPUCR_DRVTEST_PROBE");
        if (!p || strcmp(p, "1") != 0)
            dt_skip("checks the simulator's own behaviour (GPUCR_DRVTEST_PROBE=1 runs it anyway)");
    }
    c->fn();
    fflush(stdout);
    return nfail ? 1 : 0;
}

static int run_helper(int argc, char **argv) {
    for (size_t t = 0; t < sizeof helper_tables / sizeof helper_tables[0]; t++)
        for (const dt_helper *h = helper_tables[t]; h->mode; h++)
            if (strcmp(h->mode, argv[0]) == 0)
                return h->fn(argc - 1, argv + 1);
    fprintf(stderr, "drvtest: no helper mode %s\n", argv[0]);
    return 2;
}

/* Runs one case in a child process; prints its line; returns true if it passed. */
static bool run_case_child(const dt_case *c) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        printf("FAIL %s: pipe: %s\n", c->name, strerror(errno));
        return false;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        printf("FAIL %s: fork: %s\n", c->name, strerror(errno));
        close(p[0]);
        close(p[1]);
        return false;
    }
    if (pid == 0) {
        if (dup2(p[1], STDOUT_FILENO) < 0)
            _exit(126);
        execl(dt_self, dt_self, "--case", c->name, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char out[16384];
    size_t len = 0;
    uint64_t end = dt_now_ms() + CASE_TIMEOUT_MS;
    bool timed_out = false;
    for (;;) {
        uint64_t now = dt_now_ms();
        if (now >= end) {
            timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        int pr = poll(&pf, 1, (int)(end - now));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue;
        /* Once out is full, keep draining the pipe (so the child never
         * blocks on it) into a scratch buffer: the tail is dropped. */
        char drop[512];
        size_t room = len < sizeof out - 1 ? sizeof out - 1 - len : 0;
        ssize_t r = room ? read(p[0], out + len, room) : read(p[0], drop, sizeof drop);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (room)
            len += (size_t)r;
    }
    out[len] = 0;
    close(p[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    /* the first message is the case's line; the rest go to stderr */
    char *first = out, *nl = strchr(out, '\n');
    if (nl)
        *nl = 0;
    int more = 0;
    for (char *q = nl ? nl + 1 : NULL; q && *q; q = strchr(q, '\n') ? strchr(q, '\n') + 1 : NULL) {
        char *e = strchr(q, '\n');
        fprintf(stderr, "#   %s: %.*s\n", c->name, e ? (int)(e - q) : (int)strlen(q), q);
        more++;
    }
    if (timed_out) {
        printf("FAIL %s: timed out after %d s%s%s\n", c->name, CASE_TIMEOUT_MS / 1000, *first ? "; " : "", first);
        return false;
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        printf("ok %s # skip: %s\n", c->name, strncmp(first, "SKIP ", 5) == 0 ? first + 5 : first);
        return true;
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0 && !*first) {
        printf("ok %s\n", c->name);
        return true;
    }
    char why[64] = "";
    if (WIFSIGNALED(st))
        snprintf(why, sizeof why, "killed by signal %d", WTERMSIG(st));
    else if (!*first)
        snprintf(why, sizeof why, "exit status %d", WEXITSTATUS(st));
    printf("FAIL %s: %s%s%s", c->name, first, *first && *why ? "; " : "", why);
    if (more)
        printf(" (+%d more on stderr)", more);
    printf("\n");
    return false;
}

int main(int argc, char **argv) {
    static char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) {
        fprintf(stderr, "drvtest: readlink /proc/self/exe: %s\n", strerror(errno));
        return 2;
    }
    self[n] = 0;
    dt_self = self;
    /* a test that can hang on a stopped target should fail, not wait the default 30 s */
    setenv("GPUCR_SIM_RESTORE_TIMEOUT_MS", "2000", 0);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);

    if (argc >= 3 && strcmp(argv[1], "--case") == 0)
        return run_case_here(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "--helper") == 0)
        return run_helper(argc - 2, argv + 2);
    if (argc == 2 && strcmp(argv[1], "-l") == 0) {
        for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
            for (const dt_case *c = tables[t]; c->name; c++)
                printf("%s%s\n", c->name, c->flags & DT_SIM_ONLY ? " (simulator only)" : "");
        return 0;
    }
    if (argc >= 2 && argv[1][0] == '-') {
        fprintf(stderr, "usage: drvtest [-l] [NAME...]\n");
        return 2;
    }
    int passed = 0, failed = 0;
    if (argc >= 2) {
        for (int i = 1; i < argc; i++) {
            const dt_case *c = find_case(argv[i]);
            if (!c) {
                printf("FAIL %s: no such case (drvtest -l lists them)\n", argv[i]);
                failed++;
            } else if (run_case_child(c)) {
                passed++;
            } else {
                failed++;
            }
        }
    } else {
        for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
            for (const dt_case *c = tables[t]; c->name; c++)
                run_case_child(c) ? passed++ : failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

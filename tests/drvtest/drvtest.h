/*
 * drvtest: conformance test of a CUDA driver through the driver API only.
 *
 * It runs unchanged on gpucr's simulated driver and on a real GPU: what it
 * expects of the simulator is what it expects of the driver. Each case runs in
 * a fresh process (drvtest re-executes itself), so cases cannot disturb each
 * other and a case may test a process before cuInit or after a sticky error.
 *
 *   drvtest            run every case
 *   drvtest NAME...    run the named cases
 *   drvtest -l         list the cases
 *
 * Output: `ok NAME` or `FAIL NAME: what (got X want Y)` per case, then
 * `N passed, N failed`; exit status 0 only if every case passed.
 */
#ifndef GPUCR_DRVTEST_H
#define GPUCR_DRVTEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpucr/cudadrv.h"
#include "expect.h"

typedef struct dt_case {
    const char *name;
    void (*fn)(void);
    unsigned flags;
} dt_case;

#define DT_SIM_ONLY 1u /* what it checks is the simulator's own behaviour */

/* Each cases_*.c file defines one table, ended by {NULL}. */
extern const dt_case dt_cases_basic[], dt_cases_mem[], dt_cases_stream[], dt_cases_module[], dt_cases_func[],
    dt_cases_vmm[], dt_cases_share[], dt_cases_ckpt[];

/* Helper modes (drvtest --helper MODE ARG...), run in child processes by some cases. */
typedef struct dt_helper {
    const char *mode;
    int (*fn)(int argc, char **argv);
} dt_helper;
extern const dt_helper dt_helpers_vmm[], dt_helpers_share[], dt_helpers_ckpt[], dt_helpers_basic[];

/* ---- checks: a failing check records a message; the case goes on unless it must stop ---- */

extern const char *dt_case_name;

bool dt_check_rc(CUresult got, CUresult want, const char *expr, int line);
bool dt_check(bool ok, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void dt_fail(int line, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
_Noreturn void dt_stop(void); /* ends the case now */
_Noreturn void dt_skip(const char *why);

/* EXPECT_RC(call, want): the call must return want. */
#define EXPECT_RC(call, want) dt_check_rc((call), (want), #call, __LINE__)
/* REQUIRE_RC: same, and the case stops if it does not. */
#define REQUIRE_RC(call, want)                                                                                         \
    do {                                                                                                               \
        if (!dt_check_rc((call), (want), #call, __LINE__))                                                             \
            dt_stop();                                                                                                 \
    } while (0)
#define OK(call) REQUIRE_RC(call, CUDA_SUCCESS)
#define EXPECT(cond, ...) dt_check((cond), __LINE__, __VA_ARGS__)
#define REQUIRE(cond, ...)                                                                                             \
    do {                                                                                                               \
        if (!dt_check((cond), __LINE__, __VA_ARGS__))                                                                  \
            dt_stop();                                                                                                 \
    } while (0)

const char *dt_err(CUresult r); /* "CUDA_ERROR_X(n)" */

/* ---- setup ---- */

extern const char *dt_self;  /* this executable, for helpers */
bool dt_is_sim(void);        /* running on gpucr's simulated driver (after cuInit) */
CUcontext dt_init_ctx(void); /* cuInit, device 0, primary context made current */
extern const char dt_ptx[];  /* the test kernels (ptx.c) */
CUmodule dt_module(void);
CUfunction dt_function(CUmodule m, const char *name);
CUdeviceptr dt_alloc(size_t bytes);

/* Launch helpers for the test kernels (grid covers n threads of 128). */
void dt_launch_fill(CUfunction f, CUstream s, CUdeviceptr p, uint32_t v, uint32_t n);
void dt_launch_delay_write(CUfunction f, CUstream s, CUdeviceptr p, uint64_t delay_ns, uint32_t v);

/* ---- child processes ---- */

typedef struct dt_child {
    pid_t pid;
    int to;   /* write end: commands to the child (its stdin), -1 if none */
    int from; /* read end: lines from the child (its fd 3) */
    int sock; /* our end of a socketpair that is the child's fd 4 (fd passing), -1 if none */
} dt_child;

/* Starts `drvtest --helper MODE ARGS...`; with_sock adds the socketpair. */
bool dt_spawn(dt_child *c, bool with_sock, const char *mode, const char *const *args);
/* Reads one line (without the newline), waiting at most timeout_ms; false on EOF or timeout. */
bool dt_read_line(int fd, char *buf, size_t n, int timeout_ms);
bool dt_send_line(int fd, const char *line);
int dt_reap(dt_child *c, int timeout_ms); /* exit status, or -1 (killed after the timeout) */
void dt_kill(dt_child *c);

/* Inside a helper: its channel to the parent. */
#define DT_HELPER_OUT 3
#define DT_HELPER_SOCK 4
void dt_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool dt_hear(char *buf, size_t n); /* a line from stdin; false on EOF */

/* SCM_RIGHTS */
bool dt_send_fd(int sock, int fd);
int dt_recv_fd(int sock); /* -1 on failure */
/* Inside a helper: the fd on DT_HELPER_SOCK imported (and closed), device 0's primary context current; false
 * (and the parent told what failed) if any step failed. */
bool dt_helper_import(CUmemGenericAllocationHandle *h);

/* Pinned memory on device 0, POSIX-fd shareable if asked (cases_vmm.c). */
CUmemAllocationProp dt_vmm_prop(bool posix_fd);

/* An entry point libcuda exports but cudadrv.h does not declare; a failed check (and the case stops) if absent. */
void *dt_sym(const char *name);

uint64_t dt_now_ms(void);
void dt_sleep_ms(unsigned ms);

#endif /* GPUCR_DRVTEST_H */

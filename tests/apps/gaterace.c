/*
 * gaterace: threads that queue GPU work without a pause, for the test of the
 * interposer's gate (a quiesce must hold every call, however busy the
 * process, and lose none).
 *
 *   gaterace --counts FILE [--threads T] [--seconds S] [--device D]
 *
 * The threads stop after S seconds (default 10), or at SIGUSR1.
 * Each thread has its own stream and two buffers of 1024 words, and loops:
 *   cuLaunchKernel    gr_add: every word of A += 1
 *   cuMemsetD8Async   16 bytes of B, at a place and to a value of the round
 *   cuMemcpyAsync     the first 64 bytes of A to the end of B
 *   cuEventRecord     (every 64 rounds also cuEventSynchronize)
 * After each of the first three calls returns, the thread adds 1 to its
 * word in FILE (T 64-bit counters, shared memory that the test reads):
 * a counter that moves by more than one while the process is quiesced is a
 * call that ran past the closed gate. At the end each thread checks that A
 * holds exactly its number of launches, and B the last memsets and the copy:
 * no call was lost or ran twice.
 *
 *   ready pid=PID app=gaterace threads=T
 *   done calls=N errors=E
 * Exit 0 only with errors=0.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gpuapp.h"

#define WORDS 1024u
#define MAX_THREADS 64

/* gr_add(u32 *p, u32 n): p[i] += 1 for i < n */
static const char ptx[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .entry gr_add(.param .u64 gr_add_p, .param .u32 gr_add_n)\n"
    "{\n"
    "\t.reg .pred %p<2>;\n"
    "\t.reg .b32 %r<10>;\n"
    "\t.reg .b64 %rd<6>;\n"
    "\tld.param.u64 %rd1, [gr_add_p];\n"
    "\tld.param.u32 %r1, [gr_add_n];\n"
    "\tmov.u32 %r3, %ctaid.x;\n"
    "\tmov.u32 %r4, %ntid.x;\n"
    "\tmov.u32 %r5, %tid.x;\n"
    "\tmad.lo.s32 %r6, %r3, %r4, %r5;\n"
    "\tsetp.ge.u32 %p1, %r6, %r1;\n"
    "\t@%p1 bra DONE;\n"
    "\tcvta.to.global.u64 %rd2, %rd1;\n"
    "\tmul.wide.u32 %rd3, %r6, 4;\n"
    "\tadd.s64 %rd4, %rd2, %rd3;\n"
    "\tld.global.u32 %r7, [%rd4];\n"
    "\tadd.s32 %r8, %r7, 1;\n"
    "\tst.global.u32 [%rd4], %r8;\n"
    "DONE:\n"
    "\tret;\n"
    "}\n";

typedef struct {
    int index;
    CUcontext ctx;
    CUfunction add;
    _Atomic uint64_t *count; /* this thread's counter in the shared file */
    double until;
    uint64_t calls, errors;
} worker;

static volatile sig_atomic_t stop;
static void on_usr1(int sig) {
    (void)sig;
    stop = 1;
}

static void done_one(worker *w) {
    atomic_fetch_add_explicit(w->count, 1, memory_order_release);
    w->calls++;
}

static void *run(void *arg) {
    worker *w = arg;
    CHECK(cuCtxSetCurrent(w->ctx));
    CUstream s;
    CUevent ev;
    CUdeviceptr a, b;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    CHECK(cuMemAlloc(&a, WORDS * 4));
    CHECK(cuMemAlloc(&b, WORDS * 4));
    CHECK(cuMemsetD32(a, 0, WORDS));
    CHECK(cuMemsetD32(b, 0, WORDS));
    uint32_t n = WORDS;
    void *params[] = {&a, &n};
    uint64_t rounds = 0;
    unsigned char last[64]; /* the value of each 16-byte slot of B's first 1 KiB */
    memset(last, 0, sizeof last);
    while (!stop && gpuapp_now_s() < w->until) {
        rounds++;
        CHECK(cuLaunchKernel(w->add, WORDS / 256, 1, 1, 256, 1, 1, 0, s, params, NULL));
        done_one(w);
        unsigned slot = (unsigned)(rounds % 64);
        unsigned char v = (unsigned char)(rounds * 7 + (uint64_t)w->index);
        CHECK(cuMemsetD8Async(b + slot * 16, v, 16, s));
        last[slot] = v;
        done_one(w);
        CHECK(cuMemcpyAsync(b + (WORDS - 16) * 4, a, 64, s));
        done_one(w);
        CHECK(cuEventRecord(ev, s));
        if (rounds % 64 == 0)
            CHECK(cuEventSynchronize(ev));
    }
    CHECK(cuStreamSynchronize(s));
    uint32_t ha[WORDS], hb[WORDS];
    CHECK(cuMemcpyDtoH(ha, a, sizeof ha));
    CHECK(cuMemcpyDtoH(hb, b, sizeof hb));
    for (unsigned i = 0; i < WORDS; i++)
        if (ha[i] != (uint32_t)rounds) {
            fprintf(stderr, "gaterace thread %d: word %u of A is %u after %llu launches\n", w->index, i, ha[i],
                    (unsigned long long)rounds);
            w->errors++;
            break;
        }
    for (unsigned slot = 0; slot < 64 && rounds >= 64; slot++) {
        const unsigned char *p = (const unsigned char *)hb + slot * 16;
        for (int k = 0; k < 16; k++)
            if (p[k] != last[slot]) {
                fprintf(stderr, "gaterace thread %d: B slot %u is 0x%02x, its last memset 0x%02x\n", w->index, slot,
                        p[k], last[slot]);
                w->errors++;
                break;
            }
    }
    for (unsigned i = WORDS - 16; i < WORDS; i++)
        if (hb[i] != (uint32_t)rounds) {
            fprintf(stderr, "gaterace thread %d: the copy of A in B reads %u, want %llu\n", w->index, hb[i],
                    (unsigned long long)rounds);
            w->errors++;
            break;
        }
    CHECK(cuMemFree(a));
    CHECK(cuMemFree(b));
    CHECK(cuEventDestroy(ev));
    CHECK(cuStreamDestroy(s));
    return NULL;
}

int main(int argc, char **argv) {
    int threads = 8, ordinal = 0;
    double seconds = 10;
    const char *counts = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--counts") && i + 1 < argc)
            counts = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            ordinal = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: gaterace --counts FILE [--threads T] [--seconds S] [--device D]\n");
            return 2;
        }
    }
    if (!counts || threads < 1 || threads > MAX_THREADS || seconds <= 0) {
        fprintf(stderr, "gaterace: --counts FILE is required; 1 <= --threads <= %d; --seconds > 0\n", MAX_THREADS);
        return 2;
    }
    int fd = open(counts, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)(threads * sizeof(uint64_t))) != 0)
        gpuapp_die("%s: %s", counts, strerror(errno));
    _Atomic uint64_t *shared =
        mmap(NULL, (size_t)threads * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (shared == MAP_FAILED)
        gpuapp_die("mmap %s: %s", counts, strerror(errno));
    close(fd);
    gpuapp a = {.ordinal = ordinal};
    gpuapp_context(&a);
    CUmodule mod = gpuapp_load_ptx(ptx);
    CUfunction add = gpuapp_function(mod, "gr_add");
    static worker w[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    double until = gpuapp_now_s() + seconds;
    signal(SIGUSR1, on_usr1);
    printf("ready pid=%d app=gaterace threads=%d\n", (int)getpid(), threads);
    fflush(stdout);
    for (int i = 0; i < threads; i++) {
        w[i] = (worker){.index = i, .ctx = a.ctx, .add = add, .count = &shared[i], .until = until};
        if (pthread_create(&tid[i], NULL, run, &w[i]) != 0)
            gpuapp_die("pthread_create");
    }
    uint64_t calls = 0, errors = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        calls += w[i].calls;
        errors += w[i].errors;
    }
    printf("done calls=%llu errors=%llu\n", (unsigned long long)calls, (unsigned long long)errors);
    fflush(stdout);
    CHECK(cuModuleUnload(mod));
    return errors ? 1 : 0;
}

/*
 * gpucr-worker: served mode's worker as a program of its own, without Go's
 * runtime (the pool prefers it to `gpucr served-worker`, helper/served).
 *
 * Why a program of its own: a process moved to a new worker keeps its device
 * addresses only if every worker's address space is laid out alike (the pool
 * starts them without randomization), and Go 1.26 places its heap at random
 * in every process, wherever the driver would put its context or the
 * executor its address window. Go's opt-out is a build-time experiment Go
 * means to remove; this program has no Go heap at all.
 *
 *   gpucr-worker [served-worker] --device N [--libcuda PATH] [--cublas DIR]
 *
 * Its life is the Go worker's (worker.go: RunWorker): make the context (and
 * load cuBLAS ahead), say so on the control socket (descriptor 3), wait for
 * AssignWorker with the served process's socket, take that process's user
 * for good, answer, and serve the socket until the process closes it.
 *
 * A template (AssignWorker.template: a script attached, not a socket): take
 * the image owner's user, run the script (exec.h: sv_play), answer with how
 * long it took, and wait for a second AssignWorker, of the same uid and gid,
 * with the socket of the restored process that attaches; it finds its
 * objects made. The helper closing the control socket meanwhile (the image
 * unloaded) ends the template. A script that fails ends it too, after the
 * error's answer: the worker then holds the failed script's objects.
 */
#include <errno.h>
#include <grp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blas.h"
#include "exec.h"
#include "helper.pb-c.h"
#include "wire.h"

#define CONTROL_FD 3

typedef Gpucr__Helper__V1__Response Response;
typedef Gpucr__Helper__V1__Request Request;
typedef Gpucr__Helper__V1__WorkerReady WorkerReady;
typedef Gpucr__Helper__V1__Error Error;

/* One response on the control socket: ready, or the error (code, msg). 0, or -1. */
static int answer(uint64_t id, WorkerReady *ready, Gpucr__Helper__V1__ErrorCode code, const char *msg) {
    Response r = GPUCR__HELPER__V1__RESPONSE__INIT;
    Error e = GPUCR__HELPER__V1__ERROR__INIT;
    r.id = id;
    if (msg) {
        e.code = code;
        e.message = (char *)msg;
        r.error = &e;
    } else {
        r.body_case = GPUCR__HELPER__V1__RESPONSE__BODY_WORKER_READY;
        r.worker_ready = ready;
    }
    size_t n = gpucr__helper__v1__response__get_packed_size(&r);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return -1;
    gpucr__helper__v1__response__pack(&r, buf);
    int rc = wire_send_frame(CONTROL_FD, buf, n, NULL, 0);
    free(buf);
    return rc == 0 ? 0 : -1;
}

/* The user uid, with gid and groups, for good: real, effective and saved ids all, checked. 0, or -1 (err). */
static int take_user(uint32_t uid, uint32_t gid, const uint32_t *groups, size_t ngroups, char *err, size_t len) {
    gid_t *gs = calloc(ngroups ? ngroups : 1, sizeof *gs);
    if (!gs) {
        snprintf(err, len, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < ngroups; i++)
        gs[i] = groups[i];
    int rc = setgroups(ngroups, gs);
    free(gs);
    if (rc != 0) {
        snprintf(err, len, "served worker: setgroups: %s", strerror(errno));
        return -1;
    }
    if (setresgid(gid, gid, gid) != 0) {
        snprintf(err, len, "served worker: setresgid %u: %s", gid, strerror(errno));
        return -1;
    }
    if (setresuid(uid, uid, uid) != 0) {
        snprintf(err, len, "served worker: setresuid %u: %s", uid, strerror(errno));
        return -1;
    }
    uid_t r, e, s;
    gid_t gr, ge, gsv;
    if (getresuid(&r, &e, &s) != 0 || r != uid || e != uid || s != uid || getresgid(&gr, &ge, &gsv) != 0 || gr != gid ||
        ge != gid || gsv != gid) {
        snprintf(err, len, "served worker: the ids did not take (uid %u, gid %u)", uid, gid);
        return -1;
    }
    return 0;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * The next request on the control socket, which must be AssignWorker with exactly one descriptor (the served
 * process's socket, or a template's script): 1 with *req and *fd; 0 when the helper closed the socket (it let the
 * worker go); -1 otherwise (said on stderr).
 */
static int next_assignment(Request **req, int *fd) {
    uint8_t *buf = NULL;
    size_t len = 0;
    int fds[2], nfds = 0;
    int rc = wire_recv_frame(CONTROL_FD, &buf, &len, fds, 2, &nfds);
    if (rc == -EPIPE)
        return 0;
    if (rc != 0) {
        fprintf(stderr, "gpucr: served worker: waiting to be assigned: %s\n", strerror(-rc));
        return -1;
    }
    Request *r = gpucr__helper__v1__request__unpack(NULL, len, buf);
    free(buf);
    if (!r || r->body_case != GPUCR__HELPER__V1__REQUEST__BODY_ASSIGN_WORKER || nfds != 1) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        fprintf(stderr, "gpucr: served worker: expected AssignWorker with one descriptor\n");
        if (r) {
            answer(r->id, NULL, GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST,
                   "served worker: expected AssignWorker with one descriptor");
            gpucr__helper__v1__request__free_unpacked(r, NULL);
        }
        return -1;
    }
    *req = r;
    *fd = fds[0];
    return 1;
}

int main(int argc, char **argv) {
    int device = 0;
    const char *libcuda = NULL, *cublas = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "served-worker") == 0 && i == 1)
            continue; /* the Go worker's subcommand, which the pool puts first */
        if (i + 1 < argc && strcmp(argv[i], "--device") == 0)
            device = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--libcuda") == 0)
            libcuda = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--cublas") == 0)
            cublas = argv[++i];
        else {
            fprintf(stderr,
                    "usage: gpucr-worker [served-worker] --device N [--libcuda PATH] [--cublas DIR]\n"
                    "(served mode's worker: only the helper starts it)\n");
            return 2;
        }
    }
    char err[512];
    uint64_t began = now_ns();
    if (sv_prepare(libcuda, device, err, sizeof err) != 0) {
        char msg[600];
        snprintf(msg, sizeof msg, "served worker: device %d: %s", device, err);
        answer(0, NULL, GPUCR__HELPER__V1__ERROR_CODE__ERROR_UNAVAILABLE, msg);
        fprintf(stderr, "gpucr: %s\n", msg);
        return 1;
    }
    /* Not fatal: a process's first cuBLAS call loads what it names. */
    if (cublas && wblas_preload(cublas, err, sizeof err) != 0)
        fprintf(stderr, "gpucr: served worker: loading cuBLAS ahead from %s: %s\n", cublas, err);
    WorkerReady ready = GPUCR__HELPER__V1__WORKER_READY__INIT;
    ready.pid = getpid();
    ready.device = (uint32_t)device;
    ready.warm_ns = now_ns() - began;
    if (answer(0, &ready, 0, NULL) != 0) {
        fprintf(stderr, "gpucr: served worker: telling the helper it is ready failed\n");
        return 1;
    }

    Request *req = NULL;
    int sock = -1;
    int rc = next_assignment(&req, &sock);
    if (rc <= 0)
        return -rc; /* 0: the helper let the worker go unassigned */
    const Gpucr__Helper__V1__AssignWorker *a = req->assign_worker;
    if (take_user(a->uid, a->gid, a->groups, a->n_groups, err, sizeof err) != 0) {
        answer(req->id, NULL, GPUCR__HELPER__V1__ERROR_CODE__ERROR_PERMISSION, err);
        fprintf(stderr, "gpucr: %s\n", err);
        return 1;
    }
    if (a->template_) {
        /* A template: run the script, then wait for the process that attaches (the same user's). */
        uint32_t uid = a->uid, gid = a->gid;
        uint64_t took = 0;
        rc = sv_play(sock, &took, err, sizeof err);
        close(sock);
        if (rc != 0) {
            char msg[600];
            snprintf(msg, sizeof msg, "served worker: template: %s", err);
            answer(req->id, NULL,
                   rc == -2 ? GPUCR__HELPER__V1__ERROR_CODE__ERROR_DRIVER
                            : GPUCR__HELPER__V1__ERROR_CODE__ERROR_BAD_REQUEST,
                   msg);
            fprintf(stderr, "gpucr: %s\n", msg);
            return 1;
        }
        ready.template_ns = took;
        if (answer(req->id, &ready, 0, NULL) != 0) {
            fprintf(stderr, "gpucr: served worker: answering the template's assignment failed\n");
            return 1;
        }
        gpucr__helper__v1__request__free_unpacked(req, NULL);
        req = NULL;
        rc = next_assignment(&req, &sock);
        if (rc <= 0)
            return -rc; /* 0: the helper let the template go (its image was unloaded) */
        a = req->assign_worker;
        if (a->template_ || a->uid != uid || a->gid != gid) {
            char msg[200];
            if (a->template_)
                snprintf(msg, sizeof msg, "served worker: a template runs one script");
            else
                snprintf(msg, sizeof msg, "served worker: the template is uid %u gid %u's, not uid %u gid %u's", uid,
                         gid, a->uid, a->gid);
            answer(req->id, NULL, GPUCR__HELPER__V1__ERROR_CODE__ERROR_PERMISSION, msg);
            fprintf(stderr, "gpucr: %s\n", msg);
            return 1;
        }
    }
    long long client = (long long)a->client_pid;
    if (answer(req->id, &ready, 0, NULL) != 0) {
        fprintf(stderr, "gpucr: served worker: answering the assignment failed\n");
        return 1;
    }
    gpucr__helper__v1__request__free_unpacked(req, NULL);
    /* The helper says nothing more: the worker is the served process's now, whether the helper runs or not. */
    close(CONTROL_FD);
    rc = sv_serve(sock, err, sizeof err);
    close(sock);
    if (rc != 0) {
        fprintf(stderr, "gpucr: served worker: serving pid %lld: %s\n", client, err);
        return 1;
    }
    return 0;
}

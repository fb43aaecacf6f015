/*
 * A template's script (protocol/c/served.h): the records a new worker needs to make the process's objects again,
 * written once at a checkpoint's detach so that a worker can run them before the restore (a template) and the
 * restored process attach to it with nothing left to make.
 *
 * The script is the replay itself (replay.c), run with no worker: gpucrServedScript (ring.c) points the ring at a
 * private copy of the shared memory, and each record committed there comes here instead of going to a worker
 * (sv_commit). A record is written out with the staging slot it reads (an image chunk, a global's contents) and
 * the slot freed; a synchronous one is answered at once, with success and what replay.c says the answer must be
 * (sv_script_expect: the address of a reservation or of a global, which the process keeps), and the worker that
 * runs the script checks that its own answer starts with those bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client.h"

bool sv_recording;

#define OUT_BUF (1u << 20)

static struct {
    int fd;
    uint8_t *buf;
    size_t len;
    uint64_t entries, bytes;
    const char *err; /* the first failure; the replay runs on, and nothing is kept */
    uint8_t expect[SV_REPLY_DATA];
    uint32_t expect_len;
} S = {.fd = -1};

static void flush(void) {
    size_t off = 0;
    while (off < S.len && !S.err) {
        ssize_t n = write(S.fd, S.buf + off, S.len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            S.err = errno == ENOSPC ? "no space for it in memory (memfd)" : "writing it failed";
        else
            off += (size_t)n;
    }
    S.len = 0;
}

static void put(const void *p, size_t n) {
    const uint8_t *b = p;
    while (n && !S.err) {
        if (S.len == OUT_BUF)
            flush();
        size_t k = OUT_BUF - S.len < n ? OUT_BUF - S.len : n;
        memcpy(S.buf + S.len, b, k);
        S.len += k;
        b += k;
        n -= k;
    }
}

static void put_padded(const void *p, size_t n) {
    static const uint8_t zero[8];
    put(p, n);
    put(zero, sv_pad8(n) - n);
}

bool sv_script_begin(void) {
    S.err = NULL;
    S.entries = S.bytes = 0;
    S.len = 0;
    S.expect_len = 0;
    S.fd = memfd_create("gpucr-template", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    S.buf = malloc(OUT_BUF);
    if (S.fd < 0 || !S.buf) {
        if (S.fd >= 0)
            close(S.fd);
        free(S.buf);
        S.fd = -1;
        S.buf = NULL;
        return false;
    }
    struct sv_script_hdr h;
    memset(&h, 0, sizeof h); /* its place; the entries are counted by the end */
    put(&h, sizeof h);
    return true;
}

void sv_script_expect(const void *p, uint32_t n) {
    if (!sv_recording)
        return;
    S.expect_len = n < sizeof S.expect ? n : (uint32_t)sizeof S.expect;
    memcpy(S.expect, p, S.expect_len);
}

/* The staging slot a record reads, if it reads one: its slot and length. */
static bool staged(const struct sv_rec *rec, uint32_t *slot, uint32_t *len) {
    const uint8_t *pl = (const uint8_t *)(rec + 1);
    size_t plen = rec->len - sizeof *rec;
    if (rec->op == SV_OP_IMAGE_CHUNK && plen >= sizeof(struct sv_image_rec)) {
        struct sv_image_rec q;
        memcpy(&q, pl, sizeof q);
        *slot = q.stage;
        *len = q.len;
        return true;
    }
    if (rec->op == SV_OP_HTOD && plen >= sizeof(struct sv_copy_rec)) {
        struct sv_copy_rec q;
        memcpy(&q, pl, sizeof q);
        *slot = q.stage;
        *len = q.len;
        return true;
    }
    return false;
}

void sv_script_record(const struct sv_rec *rec) {
    uint32_t slot = 0, slen = 0;
    bool st = staged(rec, &slot, &slen);
    if (st && (slot >= SV_NSTAGE || slen > SV_STAGE_BYTES))
        S.err = "a record names a staging slot out of range";
    if (rec->op == SV_OP_DTOH || rec->op == SV_OP_VMM_IMPORT || rec->op == SV_OP_VMM_EXPORT)
        S.err = "the replay made a call a script cannot hold (a copy to host memory, a descriptor)";
    bool answer = rec->reply && !(rec->flags & SV_F_GROUP);
    struct sv_script_ent e = {rec->len, st && !S.err ? slen : 0, st ? slot : 0, answer ? S.expect_len : 0};
    put(&e, sizeof e);
    put_padded(rec, rec->len);
    if (e.stage_len)
        put_padded(sv_sh->stage[slot], e.stage_len);
    if (e.expect_len)
        put_padded(S.expect, e.expect_len);
    S.entries++;
    if (st && slot < SV_NSTAGE)
        atomic_store(&sv_sh->stagehdr[slot].state, SV_FREE);
    if (answer && rec->reply <= SV_NREPLY) {
        struct sv_reply *rp = &sv_sh->reply[rec->reply - 1];
        memcpy(rp->data, S.expect, S.expect_len);
        rp->len = S.expect_len;
        rp->result = CUDA_SUCCESS;
        atomic_store(&rp->state, SV_DONE);
    }
    if (answer)
        S.expect_len = 0;
}

int sv_script_end(const uint8_t token[SV_TOKEN_BYTES], bool keep, const char **why) {
    if (S.fd < 0) {
        *why = "no memfd for it";
        return -1;
    }
    flush();
    free(S.buf);
    S.buf = NULL;
    int fd = S.fd;
    S.fd = -1;
    struct sv_script_hdr h;
    memset(&h, 0, sizeof h);
    h.magic = SV_SCRIPT_MAGIC;
    h.version = SV_SCRIPT_VERSION;
    h.sv_version = SV_VERSION;
    memcpy(h.token, token, SV_TOKEN_BYTES);
    h.entries = S.entries;
    if (!S.err && pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        S.err = "writing its header failed";
    if (!S.err && lseek(fd, 0, SEEK_END) > (off_t)SV_SCRIPT_MAX)
        S.err = "it would be larger than a script may be";
    /* Sealed: the helper copies what it checked, and the worker reads it. */
    if (!S.err && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
        S.err = "sealing it failed";
    if (S.err || !keep) {
        *why = S.err ? S.err : "the replay failed";
        close(fd);
        return -1;
    }
    return fd;
}

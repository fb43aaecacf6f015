/*
 * Framing and the request/response round trip (wire.h), for libgpucr.so and
 * the CRIU plugin.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wire.h"

int wire_send_frame(int sock, const void *buf, size_t len, const int *fds, int nfds) {
    if (len == 0 || len > WIRE_MAX_FRAME || nfds < 0 || nfds > WIRE_MAX_FDS)
        return -EINVAL;
    unsigned char hdr[4] = {(unsigned char)len, (unsigned char)(len >> 8), (unsigned char)(len >> 16),
                            (unsigned char)(len >> 24)};
    struct iovec iov[2] = {{hdr, 4}, {(void *)buf, len}};
    union {
        char b[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
        struct cmsghdr align;
    } cm;
    struct msghdr mh = {0};
    mh.msg_iov = iov;
    mh.msg_iovlen = 2;
    if (nfds > 0) {
        memset(&cm, 0, sizeof cm);
        mh.msg_control = cm.b;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    size_t total = 4 + len, sent = 0;
    ssize_t n;
    do
        n = sendmsg(sock, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    sent = (size_t)n;
    while (sent < total) {
        const unsigned char *p;
        size_t left;
        if (sent < 4) {
            p = hdr + sent;
            left = 4 - sent;
        } else {
            p = (const unsigned char *)buf + (sent - 4);
            left = total - sent;
        }
        do
            n = send(sock, p, left, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n < 0)
            return -errno;
        sent += (size_t)n;
    }
    return 0;
}

static void take_fds(struct msghdr *mh, int *fds, int maxfds, int *nfds) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (*nfds < maxfds)
                fds[(*nfds)++] = fd;
            else
                close(fd);
        }
    }
}

int wire_recv_frame(int sock, uint8_t **bufp, size_t *lenp, int *fds, int maxfds, int *nfds) {
    unsigned char hdr[4];
    size_t got = 0;
    *nfds = 0;
    *bufp = NULL;
    while (got < 4) {
        union {
            char b[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
            struct cmsghdr align;
        } cm;
        /* the part of the header that recvmsg fills; cppcheck 2.10 takes it
         * for a read of uninitialized bytes */
        // cppcheck-suppress legacyUninitvar
        struct iovec iov = {hdr + got, 4 - got};
        struct msghdr mh = {0};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cm.b;
        mh.msg_controllen = sizeof cm.b;
        ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            goto fail_errno;
        if (n == 0) {
            errno = EPIPE;
            goto fail_errno;
        }
        take_fds(&mh, fds, maxfds, nfds);
        got += (size_t)n;
    }
    size_t len = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 | (size_t)hdr[3] << 24;
    if (len == 0 || len > WIRE_MAX_FRAME) {
        errno = EPROTO;
        goto fail_errno;
    }
    uint8_t *buf = malloc(len);
    if (!buf) {
        errno = ENOMEM;
        goto fail_errno;
    }
    got = 0;
    while (got < len) {
        ssize_t n = recv(sock, buf + got, len - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EPIPE;
            free(buf);
            goto fail_errno;
        }
        got += (size_t)n;
    }
    *bufp = buf;
    *lenp = len;
    return 0;
fail_errno:;
    int e = errno;
    for (int i = 0; i < *nfds; i++)
        close(fds[i]);
    *nfds = 0;
    return -e;
}

int wire_roundtrip(int sock, Gpucr__Helper__V1__Request *req, const int *sfds, int nsfds,
                   Gpucr__Helper__V1__Response **out, int *fds, int maxfds, int *nfds, bool refusals) {
    *out = NULL;
    size_t len = gpucr__helper__v1__request__get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return -ENOMEM;
    gpucr__helper__v1__request__pack(req, buf);
    int rc = wire_send_frame(sock, buf, len, sfds, nsfds);
    free(buf);
    /* A helper that refused the connection (a limit) wrote why before it
     * closed; that answer is still there to read. */
    int sent = rc;
    if (rc < 0 && !(refusals && (rc == -EPIPE || rc == -ECONNRESET)))
        return rc;
    size_t rlen;
    int nf = 0;
    int none[1];
    if (!fds) {
        fds = none;
        maxfds = 0;
    }
    rc = wire_recv_frame(sock, &buf, &rlen, fds, maxfds, &nf);
    if (rc < 0)
        return sent < 0 ? sent : rc;
    Gpucr__Helper__V1__Response *r = gpucr__helper__v1__response__unpack(NULL, rlen, buf);
    free(buf);
    /* An error of id 0 answers whatever was asked: the helper refused the
     * connection (a limit) or the frame, and closes it. */
    bool refused = refusals && r && r->id == 0 && r->error;
    if (!r || (r->id != req->id && !refused) || (sent < 0 && !refused)) {
        if (r)
            gpucr__helper__v1__response__free_unpacked(r, NULL);
        for (int i = 0; i < nf; i++)
            close(fds[i]);
        return sent < 0 ? sent : -EPROTO;
    }
    *out = r;
    if (nfds)
        *nfds = nf;
    return 0;
}

/*
 * The C side of the helper protocol's transport (docs/helper-protocol.md),
 * shared by libgpucr.so (intercept/) and the CRIU plugin (criuplugin/):
 * framing, and one request/response round trip.
 *
 * A frame is a 4-byte little-endian length N (1..16 MiB), then N bytes (a
 * protobuf message of helper.proto). File descriptors ride as SCM_RIGHTS on
 * the sendmsg that carries the frame's first byte; they are received with
 * MSG_CMSG_CLOEXEC.
 */
#ifndef GPUCR_PROTOCOL_WIRE_H
#define GPUCR_PROTOCOL_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "helper.pb-c.h"

#define WIRE_HIDDEN __attribute__((visibility("hidden")))

#define WIRE_MAX_FRAME (16u << 20)
#define WIRE_MAX_FDS 200

/* 0 or -errno. */
WIRE_HIDDEN int wire_send_frame(int sock, const void *buf, size_t len, const int *fds, int nfds);
/* *buf malloc'ed; fds received go to fds[0..*nfds) (at most maxfds; extra are closed). 0, -errno, -EPIPE at EOF. */
WIRE_HIDDEN int wire_recv_frame(int sock, uint8_t **buf, size_t *len, int *fds, int maxfds, int *nfds);

/*
 * One request on sock (req->id is the caller's), sent with sfds[0..nsfds),
 * and its response. Descriptors that come with the response go to
 * fds[0..*nfds) (at most maxfds, the others are closed; fds may be NULL for
 * none). 0: *out is the response to req->id (the caller frees it with
 * gpucr__helper__v1__response__free_unpacked), or, with refusals, an error of
 * id 0 (a helper that refuses the connection or the frame answers so, whatever
 * was asked, and closes the connection: its answer is read even when the
 * request could not be sent whole). Else -errno (transport; -EPROTO: no
 * response to this request), *out is NULL and no descriptor is kept.
 */
WIRE_HIDDEN int wire_roundtrip(int sock, Gpucr__Helper__V1__Request *req, const int *sfds, int nsfds,
                               Gpucr__Helper__V1__Response **out, int *fds, int maxfds, int *nfds, bool refusals);

#endif

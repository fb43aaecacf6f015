/*
 * The served-mode worker's executor: the half of the worker that runs the
 * served process's driver calls. It is C because it reads the shared ring on
 * every call: a cgo crossing per record would cost more than the enqueue it
 * serves. The Go half (worker.go) starts the worker, takes the user and
 * hands the socket over.
 */
#ifndef GPUCR_HELPER_SERVED_EXEC_H
#define GPUCR_HELPER_SERVED_EXEC_H
#include <stddef.h>

/*
 * Loads the driver (libpath, or "libcuda.so.1" when NULL or empty), makes
 * the primary context of device ordinal current on the calling thread, and
 * whatever else a pre-warmed worker keeps ready. Runs before the worker takes
 * its user. 0, or -1 with err filled.
 */
int sv_prepare(const char *libpath, int ordinal, char *err, size_t errlen);

/*
 * Serves the process at the other end of sock (a connected SOCK_SEQPACKET
 * or SOCK_STREAM socket) on the calling thread, the one sv_prepare ran on,
 * until that process closes it or dies. 0 when it ended that way, or -1
 * with err filled (a broken ring, a failed handshake).
 */
int sv_serve(int sock, char *err, size_t errlen);

#endif

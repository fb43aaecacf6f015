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
#include <stdint.h>

/*
 * Loads the driver (libpath, or "libcuda.so.1" when NULL or empty), makes
 * the primary context of device ordinal current on the calling thread, and
 * whatever else a pre-warmed worker keeps ready. Runs before the worker takes
 * its user. 0, or -1 with err filled.
 */
int sv_prepare(const char *libpath, int ordinal, char *err, size_t errlen);

/*
 * Runs a template's script (protocol/c/served.h, struct sv_script_hdr) read
 * from fd (a file or a memfd; nothing in it is trusted) on the calling
 * thread, the one sv_prepare ran on, after the worker took its user: each
 * record as if a client had published it (its staging bytes in its slot),
 * through private memory in place of a client's. The objects it makes stay
 * for the process that sv_serve then serves (they are the ones it names).
 * A record that needs the socket (a descriptor passed) is refused. A record
 * with a reply of its own must succeed and answer what the script expects;
 * an asynchronous one must succeed. 0 with *took_ns (may be NULL) the time
 * it took; -1 with err filled for a script that is not well-formed (or an
 * error of the worker's own); -2 with err filled for a record that failed
 * or answered differently (errors name the record by its index, from 0, and
 * its op). After a failure the worker serves nothing: its caller exits.
 * Once per worker, before sv_serve.
 */
int sv_play(int fd, uint64_t *took_ns, char *err, size_t errlen);

/*
 * Serves the process at the other end of sock (a connected SOCK_SEQPACKET
 * or SOCK_STREAM socket) on the calling thread, the one sv_prepare ran on,
 * until that process closes it or dies. 0 when it ended that way, or -1
 * with err filled (a broken ring, a failed handshake). The handles of a
 * script sv_play ran before are the process's from the start.
 */
int sv_serve(int sock, char *err, size_t errlen);

#endif

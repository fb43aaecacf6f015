/*
 * Layer 2, the helper link (2_link.c): the interposer's two connections to
 * the helper (docs/helper-protocol.md). The calls connection carries Hello
 * and the requests of allocations (Alloc, Mapped, Free), one at a time; the
 * control connection is opened here and served by the control thread
 * (7_control.c). Detach closes both; the reattach opens them again with the
 * old token. Calls only the base layer and protocol/c (wire.h).
 */
#ifndef GPUCR_INTERCEPT_LINK_H
#define GPUCR_INTERCEPT_LINK_H

#include "1_base.h"

/* The calls connection. CONN_DETACHED: both connections closed on the helper's Detach, the control thread waits
 * for the wake file. */
enum { CONN_NONE = 0, CONN_UP, CONN_OFF, CONN_DEAD, CONN_DETACHED };

/* Devices: the most the helper's list and the UUID cache (3_devices.c) hold. */
#define GC_MAX_DEV 64

/* The alloc_id of memory no helper holds any more (a helper's that ended, not moved into the next one's): never
 * named to a helper, whose ids it could collide with. */
#define GC_ORPHAN_ID UINT64_MAX

/* The helper did not serve (no helper, or it failed otherwise than out of memory): the driver's own call answers. */
#define GC_FALLBACK ((CUresult)-1)

GC_HIDDEN int gc_link_state(void); /* CONN_* */

/* Connecting, by the control layer, under gc_link_connect_lock: */
GC_HIDDEN void gc_link_connect_lock(void);
GC_HIDDEN void gc_link_connect_unlock(void);
/* The calls connection to GPUCR_SOCKET and its Hello: 0 (registered; up at gc_link_up), or -1 (CONN_OFF, warned). */
GC_HIDDEN int gc_link_connect(void);
GC_HIDDEN void gc_link_up(void);
/* The control connection and its Hello with our token: its fd, or -1 (warned). */
GC_HIDDEN int gc_link_connect_control(void);
GC_HIDDEN void gc_link_control_failed(int fd); /* no thread to serve it: closed */

/* The granularity the helper announced for the device uuid; 0: none. */
GC_HIDDEN uint64_t gc_link_granularity(const char *uuid);
/* The PCI bus id the helper gave for GPU uuid, into out (n bytes); false if it gave none. */
GC_HIDDEN bool gc_link_bus_id(const char *uuid, char *out, size_t n);

/* Requests on the calls connection. Alloc: CUDA_SUCCESS (*fd to close), GC_FALLBACK, or an error for the app;
 * addr: where it will be mapped (0: not known yet; Mapped will say). */
enum { GC_ALLOC_GPU_DIRECT_RDMA = 1, GC_ALLOC_HOST_NUMA = 2 }; /* flags of gc_link_alloc */
GC_HIDDEN CUresult gc_link_alloc(const char *uuid, uint64_t size, int kind, unsigned flags, uint64_t addr, uint64_t *id,
                                 uint64_t *rsize, int *fd);
/* ImportPeer: whether fd (which the application imports) is an export of memory the helper serves, another
 * client's: 0 with its allocation's id and size (the import is ours to keep from then on), or -1. */
GC_HIDDEN int gc_link_import_peer(int fd, uint64_t *id, uint64_t *size);
GC_HIDDEN void gc_link_mapped(uint64_t id, uint64_t addr);
/* Export: a new fd of allocation id (the caller's to close), or the CUresult for the application. */
GC_HIDDEN CUresult gc_link_export(uint64_t id, int *fd);
GC_HIDDEN void gc_link_free(uint64_t id); /* nothing for GC_ORPHAN_ID */
/* SaveFirst: the helper saves these ranges' pending chunks of a copy-on-write window (at most GC_SAVE_FIRST_MAX
 * ranges) and answers; 0, or -1 (no helper: the window is over). */
#define GC_SAVE_FIRST_MAX 32
GC_HIDDEN int gc_link_save_first(const gc_range *ranges, size_t n);
/* LoadFirst (a restore loading on demand): the helper loads these ranges' memory (all of it, if all) first and
 * answers once it is in: 0, or -1 with the reason in why (the memory never comes: the caller ends the process). */
GC_HIDDEN int gc_link_load_first(const gc_range *ranges, size_t n, bool all, char *why, size_t whylen);

/* AnalyzeModule: the module image at image (len bytes) is copied into a sealed memfd, which the helper reads (it
 * reads no process's memory), and the helper answers which parameters each kernel it decided may write through: 0
 * (*out, *n: the caller's, for gc_writes_add), or -1 (not analysed: its kernels count as writing everything their
 * parameters point into). Costs a copy of the image, once per module load with PTX. */
GC_HIDDEN int gc_link_analyze(const void *image, size_t len, gc_kwrite **out, size_t *n);

/* The helper socket's path, our client token. */
GC_HIDDEN const char *gc_link_socket(void);
GC_HIDDEN uint64_t gc_link_token(void);
/* <socket dir>/name into out, in this process's view of the socket directory (a container may mount it elsewhere
 * than the helper sees it); snprintf's result. */
GC_HIDDEN int gc_link_sock_dir_file(char *out, size_t n, const char *name);

/* Detach: closes both connections (ctl_fd is the control thread's); CONN_DETACHED. */
GC_HIDDEN void gc_link_detach(int ctl_fd);
/* Connects again with the old token until it works (CONN_UP); the new control connection. */
GC_HIDDEN int gc_link_reattach(void);

/*
 * Rejoining after the helper ended (its connections closed while the process ran): gc_link_dial connects to the
 * helper socket (a new helper listens there): the fd, or -1 (none yet; nothing warned). gc_link_rejoin says Hello
 * on it as a new client (the new helper knows nothing of us): 0 with the calls connection up under a new token
 * (the fd is the link's), or -1 (the fd closed; why says what the helper answered).
 */
GC_HIDDEN int gc_link_dial(void);
/* Whether the calls connection is gone (its helper closed it: ended), waiting up to wait_ms for its end; marks it
 * dead then. Holds the calls connection's lock meanwhile (the caller's gate is open: calls that need it wait). */
GC_HIDDEN bool gc_link_calls_lost(unsigned wait_ms);
GC_HIDDEN int gc_link_rejoin(int fd, char *why, size_t whylen);

/* Fork: prepare takes the link's locks, parent releases them; the child forgets the parent's connections (its
 * copies of them become /dev/null). */
GC_HIDDEN void gc_link_atfork_prepare(void);
GC_HIDDEN void gc_link_atfork_parent(void);
GC_HIDDEN void gc_link_atfork_child(void);

#endif

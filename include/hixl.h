/* SPDX-License-Identifier: MIT */
/*
 * hixl.h - one-sided communication for AI clusters.
 *
 * A process registers memory; a peer then puts, gets, writes with an
 * immediate and runs 64-bit atomics on it without the owner calling anything,
 * and fences to know it all landed.  This header is the whole public API and
 * its contract.  It is C11 and compiles as C++.
 *
 * Conventions (the same in every function):
 *  - Every call that can fail returns hixl_status_t: HIXL_OK (0), the
 *    progress code HIXL_INPROGRESS (1), or a negative HIXL_ERR_*.  On failure
 *    hixl_last_error() gives this thread's detailed message (what failed,
 *    which peer, which range) and nothing observable has changed: output
 *    arguments (named *_p) are written only on success, and no byte of remote
 *    memory has been touched.
 *  - Timeouts are in milliseconds: -1 waits forever, 0 does not wait.
 *  - Handles are opaque.  A handle belongs to the context it came from.
 *  - Thread safety: every function may be called from any thread at any time,
 *    except that a handle must not be used concurrently with the call that
 *    destroys it (hixl_ctx_destroy, hixl_disconnect, hixl_peer_release,
 *    hixl_mr_dereg, hixl_rmr_release, hixl_req_free, hixl_world_destroy).
 *
 * Completion semantics (see docs/semantics.md):
 *  - A put completes when its data is visible in the target's memory, a get
 *    when the data is in ours, an atomic when it has executed at the target.
 *  - hixl_fence(ctx, peer) returns once everything issued before it to that
 *    peer (or to every peer) has completed at its target.
 *  - Each hixl_put_imm / hixl_notify / notifying batch yields exactly one
 *    notification at the target, after its data is visible, in issue order
 *    per peer.
 */
#ifndef HIXL_H
#define HIXL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; everything declared here is
 * its exported API (and src/hixl.map versions it). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define HIXL_VERSION_MAJOR 1
#define HIXL_VERSION_MINOR 1
#define HIXL_VERSION_PATCH 0

typedef struct hixl_ctx hixl_ctx_t;     /* a communication context (one per process usually) */
typedef struct hixl_peer hixl_peer_t;   /* a connection to another context (or to ourselves) */
typedef struct hixl_mr hixl_mr_t;       /* a local registered region */
typedef struct hixl_rmr hixl_rmr_t;     /* a peer's region, usable as a remote target */
typedef struct hixl_req hixl_req_t;     /* an outstanding operation */
typedef struct hixl_world hixl_world_t; /* a fixed group of ranks (torchrun style) */

/* Status codes.  Values are part of the ABI and never renumbered. */
typedef enum hixl_status {
  HIXL_OK = 0,
  HIXL_INPROGRESS = 1,          /* not yet complete; test or wait again */
  HIXL_ERR_INVALID = -1,        /* bad argument (NULL, zero length, bad flags, unaligned atomic) */
  HIXL_ERR_NOMEM = -2,          /* out of memory or of a bounded resource */
  HIXL_ERR_NOT_REGISTERED = -3, /* range not inside a registered region; unknown or stale rkey */
  HIXL_ERR_ACCESS = -4,         /* the region does not grant the right the operation needs */
  HIXL_ERR_UNSUPPORTED = -5,    /* the transport or build cannot do this */
  HIXL_ERR_TIMEOUT = -6,        /* the timeout expired; the operation may still complete */
  HIXL_ERR_PEER_LOST = -7,      /* the peer died, disconnected or stopped answering */
  HIXL_ERR_TRANSPORT = -8,      /* the transport failed (details in hixl_last_error) */
  HIXL_ERR_AUTH = -9,           /* the peer rejected our auth token, or we rejected theirs */
  HIXL_ERR_AGAIN = -10,         /* a bounded queue stayed full (see docs/errors.md); retry */
  HIXL_ERR_NO_DEVICE = -11      /* no such device, or no device runtime on this machine */
} hixl_status_t;

/* Name of a status ("HIXL_ERR_ACCESS: ..."); never NULL, static storage. */
const char *hixl_strerror(hixl_status_t st);
/* The calling thread's detailed message for its last failed call; "" if none.
 * Valid until this thread's next hixl call. */
const char *hixl_last_error(void);

/* ---------------------------------------------------------------- config */

typedef struct hixl_config {
  const char *listen; /* "host:port" to listen on; NULL: all addresses, any port   (HIXL_LISTEN) */
  const char
      *transports; /* allowed, in preference order, e.g. "shm,verbs"; NULL: all (HIXL_TRANSPORTS) */
  const char
      *net_dev; /* RDMA device or netdev; NULL: auto                          (HIXL_NET_DEV) */
  const char *auth_token; /* shared secret checked at connect, <= 255 bytes; NULL: none
                             (HIXL_AUTH_TOKEN) */
  int progress_thread;    /* 1: progress in a background thread that, idle, waits as
                             `wait` says; 2: one that sleeps at once when idle    (HIXL_PROGRESS_THREAD)
                           */
  int timeout_ms;         /* default for connects and blocking calls; peers are lost
                             after max(timeout_ms, 1000) ms of silence                 (HIXL_TIMEOUT_MS) */
  int wait;               /* how blocking calls wait: a hixl_wait_mode_t; 0 is
                             HIXL_WAIT_ADAPTIVE                    (HIXL_WAIT=adaptive|spin|sleep) */
  int reserved_int;       /* must be zero */
  /* "host:port": serve this context's counters to Prometheus at /metrics
   * from its control thread (docs/observability.md); NULL: off.  A value
   * that does not parse or cannot be bound is a warning, not an error.
   * Since 1.1 (was reserved[0]).                                 (HIXL_METRICS) */
  const char *metrics;
  void *reserved[6]; /* must be zero (hixl_config_init does it) */
} hixl_config_t;

/* How a blocking call (hixl_notif_wait, hixl_req_wait, hixl_fence, ordered
 * operations, a full notification ring) waits (docs/waiting.md):
 *  - ADAPTIVE (the default): polls for a few microseconds (about the time
 *    the kernel takes to wake a sleeping thread here, at most 50 us), then
 *    sleeps in the kernel until the event itself wakes it: a waiter costs
 *    no CPU, and a notification or completion wakes it at once.
 *  - SPIN: polls until done (lowest latency; a core per waiting thread).
 *  - SLEEP: sleeps at once (no polling beyond one look). */
typedef enum hixl_wait_mode {
  HIXL_WAIT_ADAPTIVE = 0,
  HIXL_WAIT_SPIN = 1,
  HIXL_WAIT_SLEEP = 2
} hixl_wait_mode_t;

/* Fill defaults (listen NULL, transports NULL, progress_thread 0,
 * timeout_ms 10000, wait HIXL_WAIT_ADAPTIVE), then override each field from its HIXL_* environment
 * variable when set.  The strings point into the environment. */
void hixl_config_init(hixl_config_t *cfg);

/* Create a context: starts the control listener (TCP on cfg->listen) and the
 * control thread that answers peers (connects, key lookups, heartbeats), so
 * that peers can reach our memory without this process calling hixl.
 * cfg NULL means hixl_config_init() defaults.  The strings in cfg are copied.
 * Errors: INVALID (bad listen address, unknown transport name, timeout < 1,
 * an auth token longer than 255 bytes),
 * TRANSPORT (cannot listen), NOMEM. */
hixl_status_t hixl_ctx_create(const hixl_config_t *cfg, hixl_ctx_t **ctx_p);
/* Disconnect every peer, release every region and request, free the context.
 * Memory from hixl_mem_alloc is freed.  NULL is a no-op. */
void hixl_ctx_destroy(hixl_ctx_t *ctx);
/* "host:port" that peers pass to hixl_connect.  Valid while ctx lives. */
const char *hixl_ctx_address(const hixl_ctx_t *ctx);
/* The transports this context offers peers, allowed and available on this
 * machine, in preference order: e.g. "self,shm,verbs".  verbs and fabric
 * are set up when a connection first picks them (HIXL_LAZY): one whose
 * set-up then fails stays listed here, and that connection's error says
 * why.  Valid while ctx lives; NULL for a NULL ctx. */
const char *hixl_ctx_transports(const hixl_ctx_t *ctx);

/* One figure of hixl_ctx_stats: a name that stays the same from release to
 * release (docs/observability.md lists them), a line of help, the value. */
typedef enum {
  HIXL_STAT_COUNTER = 0, /* only grows while the context lives */
  HIXL_STAT_GAUGE = 1    /* a level now (peers connected, operations in flight) */
} hixl_stat_kind_t;

typedef struct hixl_stat {
  const char *name; /* e.g. "put_bytes"; static storage, never freed */
  const char *help; /* static storage */
  uint64_t value;
  int kind; /* hixl_stat_kind_t */
  int reserved;
} hixl_stat_t;

/* The counters of ctx (peer NULL) or of one of its peers (ctx may then be
 * NULL): operations and bytes by kind, errors by status, operations in
 * flight, notifications, connections, time spent waiting.  *count is the
 * room in stats on entry and the number of figures there are on return;
 * the first min(room, that number) are filled, so *count = 0 (stats may be
 * NULL) asks how many there are.  New figures are only ever appended, so a
 * fixed array sized for an older release gets the same first figures.
 * Counting costs the operations no locked instruction: a peer's figures are
 * exact while one thread at a time issues to it (concurrent issuers may
 * lose a few of its increments); the context's are exact.
 * Errors: INVALID (NULL count, NULL ctx and peer, a released peer, a peer of
 * another context, NULL stats with room). */
hixl_status_t hixl_ctx_stats(hixl_ctx_t *ctx, hixl_peer_t *peer, hixl_stat_t *stats, size_t *count);
/* The counters of the context at the other end of peer, as that context's
 * hixl_ctx_stats(ctx, NULL) gives them, asked over the authenticated
 * control connection (what hixl-info --stats shows).  Same convention for
 * stats and *count; names and help are valid until hixl_ctx_destroy of
 * ours (help is empty for figures this release does not know).  Several
 * round trips, each a snapshot of its part: figures in different parts may
 * be moments apart.  A self peer reads our own context.
 * Errors: INVALID, PEER_LOST, TIMEOUT, TRANSPORT (a malformed answer). */
hixl_status_t hixl_peer_remote_stats(hixl_peer_t *peer, hixl_stat_t *stats, size_t *count,
                                     int timeout_ms);

/* ------------------------------------------------------------------ peers */

/* Connect to the context listening at addr ("host:port", IPv4, IPv6 in
 * brackets, or a name).  The handshake checks the protocol version and the
 * auth token and picks the transport: "self" when addr is this context,
 * "shm" when both are on the same host (same kernel boot and network
 * namespace), "verbs" when both have an active RDMA port, else "fabric"
 * (libfabric) across hosts; cfg.transports limits
 * the choice.  Peers that connect to us become hixl_peer_t objects too
 * (they appear in notifications and can be used to reach back).
 * Both sides prove they hold the token without sending it (HMAC-SHA256
 * challenge-response, the target first; docs/security.md), over TLS when
 * HIXL_TLS=1.
 * Errors: INVALID (bad address), TIMEOUT, PEER_LOST (refused / closed),
 * AUTH (token mismatch, or the target could not prove it holds our token),
 * AGAIN (the target serves HIXL_MAX_PEERS peers already), UNSUPPORTED (no
 * common transport), NOMEM. */
hixl_status_t hixl_connect(hixl_ctx_t *ctx, const char *addr, int timeout_ms, hixl_peer_t **peer_p);
/* Close a peer we connected to: outstanding requests fail with PEER_LOST,
 * rmrs unpacked through it become unusable (release them still).  Its
 * connection and transport resources are released now; the handle itself
 * (under 2 KiB) stays until hixl_ctx_destroy, answering PEER_LOST if it is
 * used again, so do not (docs/reliability.md: what connections cost over
 * time); hixl_peer_release frees it.  Peers that connected to us are owned
 * by the context; for those this closes the connection and the handle
 * stays valid (but lost) until hixl_ctx_destroy or hixl_peer_release.
 * Errors: INVALID (NULL). */
hixl_status_t hixl_disconnect(hixl_peer_t *peer);
/* Done with a peer handle, ours or one a notification carried: disconnect
 * it if it is not already (its notifications not yet taken are dropped)
 * and let the context free the handle, a few seconds later (2 x timeout +
 * 1 s after its end).  Without this, a handle the application has seen
 * stays until hixl_ctx_destroy, so a long-lived target whose peers come
 * and go should release each it has done with.  Release its rmrs first
 * and free its requests (hixl_req_free: a failed request's error names its
 * peer), and take no notification on another thread meanwhile (one may
 * carry it); the handle must not be used, nor passed anywhere, afterwards
 * (its memory may then belong to a new peer).  A released peer is no
 * longer among those hixl_fence(ctx, NULL) reports lost.  If its
 * transport could not finish an operation to it, the handle is kept as
 * before (a warning says so).  Errors: INVALID (NULL; released already;
 * it still has rmrs; a rank's peer, which its world owns until
 * hixl_world_destroy or until the rank comes back); a freed handle is
 * caught only while its memory has not been reused.  On error nothing
 * changes. */
hixl_status_t hixl_peer_release(hixl_peer_t *peer);
/* "self", "shm", "verbs" or "fabric" ("closed" after hixl_disconnect);
 * NULL for a NULL peer. */
const char *hixl_peer_transport(const hixl_peer_t *peer);

/* ----------------------------------------------------------------- memory */

/* Remote access rights of a region (bit set).  Local use needs none. */
enum { HIXL_ACCESS_READ = 1, HIXL_ACCESS_WRITE = 2, HIXL_ACCESS_ATOMIC = 4 };
typedef enum { HIXL_MEM_HOST = 0, HIXL_MEM_DEVICE = 1 } hixl_mem_kind_t;

/* Register [addr, addr+len) of host memory with the given remote rights.
 * The memory must stay mapped until hixl_mr_dereg.  Any host memory works
 * (stack, heap, mmap); hixl_mem_alloc memory is faster to reach on shm.
 * Errors: INVALID (NULL addr, zero len, unknown access bits), NOMEM (too many
 * regions). */
hixl_status_t hixl_mr_reg(hixl_ctx_t *ctx, void *addr, size_t len, unsigned access,
                          hixl_mr_t **mr_p);
/* Register device memory (GPU / NPU) of device device_id: memory of the
 * process's device backend (hixl_device_backend()).  The region works on
 * every transport and may be the remote side of puts and gets from any
 * peer; see docs/device.md for how each transport reaches it.  Atomics on
 * device regions need the NIC (verbs with dmabuf or peer memory); elsewhere
 * they fail with UNSUPPORTED.  hixl_mr_reg on device memory does the same
 * as this with the memory's own device.
 * Errors: INVALID (NULL, zero len, unknown access bits, addr is host memory
 * or memory of another device, the range runs past its device allocation),
 * NO_DEVICE (no device backend, or no device device_id), NOMEM. */
hixl_status_t hixl_mr_reg_device(hixl_ctx_t *ctx, void *addr, size_t len, int device_id,
                                 unsigned access, hixl_mr_t **mr_p);
/* Allocate len bytes of the memory every transport shares best and register
 * it.  HIXL_MEM_HOST: page-aligned, zeroed, memfd-backed so same-host peers
 * map it directly -- when access grants READ (a mapping always reads): a
 * WRITE-only region is reached with a system call per operation instead,
 * about 0.5 us more for a small put.  HIXL_MEM_DEVICE: device memory of the calling thread's
 * current device (CUDA: the current context's; Ascend: aclrtGetDevice;
 * emulated: 0), from the device runtime.  Freed by hixl_mr_dereg.
 * Errors: INVALID, NOMEM, NO_DEVICE (HIXL_MEM_DEVICE without a backend). */
hixl_status_t hixl_mem_alloc(hixl_ctx_t *ctx, size_t len, hixl_mem_kind_t kind, unsigned access,
                             void **addr_p, hixl_mr_t **mr_p);
/* Copy len bytes between any two buffers, host or device, in any
 * direction, through the device runtime where one side is device memory;
 * returns when the bytes are at dst.  The only way the CPU reaches emulated
 * device memory (HIXL_DEVICE=emulated), and a convenience elsewhere.
 * len 0 is a no-op.  Errors: INVALID (NULL, a device range running past its
 * allocation), TRANSPORT (the runtime failed). */
hixl_status_t hixl_mem_copy(void *dst, const void *src, size_t len);
/* Whether addr is host or device memory, and of which device (-1 for
 * host; device_p may be NULL).  Errors: INVALID (NULL addr or kind_p). */
hixl_status_t hixl_mem_query(const void *addr, hixl_mem_kind_t *kind_p, int *device_p);
/* The device backend of this process: "cuda", "ascend", "emulated" or
 * "none" (chosen once, by HIXL_DEVICE; see docs/device.md).  Static storage. */
const char *hixl_device_backend(void);
/* Deregister; frees hixl_mem_alloc memory too.  Its rkey is never matched
 * again: peer operations issued after this returns fail with NOT_REGISTERED
 * (RDMA peers are told and acknowledge first; bounded by the timeout).  An
 * operation already racing with dereg may still land (as with RDMA);
 * quiesce first.
 * Errors: INVALID (NULL). */
hixl_status_t hixl_mr_dereg(hixl_mr_t *mr);
/* Serialize the region's remote key into buf for out-of-band exchange.
 * *len_p: capacity in, size out; buf NULL asks the size.  The blob is
 * position independent and at most HIXL_RKEY_MAX bytes.
 * Errors: INVALID (NULL mr/len_p), NOMEM (capacity too small; *len_p set to
 * the size needed). */
hixl_status_t hixl_mr_pack(const hixl_mr_t *mr, void *buf, size_t *len_p);
#define HIXL_RKEY_MAX 64
/* Turn a blob from hixl_mr_pack of the context behind peer into an rmr.
 * The blob is parsed strictly and checked with the owner: a forged, altered
 * or stale blob gives NOT_REGISTERED (or INVALID when malformed).
 * Errors: INVALID, NOT_REGISTERED, PEER_LOST, NOMEM. */
hixl_status_t hixl_rmr_unpack(hixl_peer_t *peer, const void *buf, size_t len, hixl_rmr_t **rmr_p);
/* Publish the region under a name (1..63 bytes) so peers can find it with
 * hixl_rmr_lookup.  Republishing a name replaces it; dereg unpublishes.
 * Errors: INVALID (bad name), NOMEM. */
hixl_status_t hixl_mr_publish(hixl_mr_t *mr, const char *name);
/* Ask the peer for the region it published under name, waiting up to
 * timeout_ms for it to appear.  Errors: INVALID, NOT_REGISTERED (not
 * published within the timeout, or timeout 0 and absent), PEER_LOST,
 * TIMEOUT (the peer did not answer). */
hixl_status_t hixl_rmr_lookup(hixl_peer_t *peer, const char *name, int timeout_ms,
                              hixl_rmr_t **rmr_p);
/* Release an rmr (unmaps what it mapped).  NULL is a no-op. */
void hixl_rmr_release(hixl_rmr_t *rmr);

/* ------------------------------------------------------------- operations */

/* Operation flags.  HIXL_OP_ORDERED: the operation is not started before every
 * earlier operation to the same peer has completed at the target (a fence
 * that does not block the caller). */
enum { HIXL_OP_ORDERED = 1 };

/* All operations are non-blocking.  Before anything moves, the remote range
 * [off, off+len) is checked against the rmr's region: outside it (or an
 * overflowing off+len, or a deregistered region) -> NOT_REGISTERED; the
 * region lacks READ (get), WRITE (put) or ATOMIC (atomics) -> ACCESS; len 0,
 * NULL buffers or unknown flags -> INVALID; a lost peer -> PEER_LOST.  On
 * such an error no request is created and nothing is written.
 * Local buffers need not be registered, and may be device memory (found
 * through the device backend; a local device buffer running past its
 * allocation -> INVALID).  They must stay unchanged (puts)
 * and valid (gets, atomics' old_p) until the operation completes: RDMA
 * transports move them in place, while in flight (docs/semantics.md).
 * req_p NULL: no request is returned; use
 * hixl_fence to know completion.  Otherwise *req_p must be freed with
 * hixl_req_free. */
hixl_status_t hixl_put(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *dst,
                       uint64_t off, unsigned flags, hixl_req_t **req_p);
hixl_status_t hixl_get(hixl_peer_t *peer, void *dst, size_t len, hixl_rmr_t *src, uint64_t off,
                       unsigned flags, hixl_req_t **req_p);
/* A put whose completion also yields, at the target, one notification
 * {peer, imm, len} after the data is visible, in issue order per peer. */
hixl_status_t hixl_put_imm(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *dst,
                           uint64_t off, uint32_t imm, unsigned flags, hixl_req_t **req_p);
/* A notification with no data ({peer, imm, 0} at the target). */
hixl_status_t hixl_notify(hixl_peer_t *peer, uint32_t imm, unsigned flags, hixl_req_t **req_p);
/* 64-bit atomics on an 8-byte-aligned offset (else INVALID), host byte order.
 * *old_p receives the previous value when the request completes (old_p may
 * be NULL).  CAS writes desired only if the value equals expected. */
hixl_status_t hixl_atomic_cas(hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off, uint64_t expected,
                              uint64_t desired, uint64_t *old_p, unsigned flags,
                              hixl_req_t **req_p);
hixl_status_t hixl_atomic_faa(hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off, uint64_t add,
                              uint64_t *old_p, unsigned flags, hixl_req_t **req_p);

/* One element of a batch: local buffer, remote region and offset, length. */
typedef struct hixl_xfer {
  void *local;
  hixl_rmr_t *rmr;
  uint64_t off;
  size_t len;
} hixl_xfer_t;
/* Many transfers to one peer under one request.  Every element is checked
 * before any moves; the first bad one fails the whole batch (its index is in
 * hixl_last_error).  With imm non-NULL, one notification {peer, *imm, total
 * bytes} is delivered after the whole batch is visible. */
hixl_status_t hixl_put_batch(hixl_peer_t *peer, const hixl_xfer_t *xfers, size_t n,
                             const uint32_t *imm /* NULL: no notification */, unsigned flags,
                             hixl_req_t **req_p);
hixl_status_t hixl_get_batch(hixl_peer_t *peer, const hixl_xfer_t *xfers, size_t n, unsigned flags,
                             hixl_req_t **req_p);

/* --------------------------------------------------------------- requests */

/* OK (complete), INPROGRESS, or the operation's error.  Drives progress. */
hixl_status_t hixl_req_test(hixl_req_t *req);
/* Wait for completion; TIMEOUT when it has not completed in timeout_ms (the
 * request stays valid).  Returns the operation's status otherwise. */
hixl_status_t hixl_req_wait(hixl_req_t *req, int timeout_ms);
/* Free a request.  Freeing an incomplete request is allowed: the operation
 * still runs, its result is dropped.  NULL is a no-op.  A second free of
 * the same request is detected and ignored (a warning; hixl_last_error()
 * says so) until the pool hands the object to another operation. */
void hixl_req_free(hixl_req_t *req);
/* Return once every operation issued before the call to peer (NULL: to
 * every peer) has completed at its target.  Errors: TIMEOUT; PEER_LOST when
 * the peer is lost or disconnected, since delivery to it cannot be confirmed
 * (with peer NULL: for each lost peer that was used, reported once). */
hixl_status_t hixl_fence(hixl_ctx_t *ctx, hixl_peer_t *peer /* NULL: all */, int timeout_ms);
/* Drive completions once; returns how many were processed, or < 0 (a
 * hixl_status_t) on error.  Blocking calls drive progress themselves. */
int hixl_progress(hixl_ctx_t *ctx);

/* ---------------------------------------------------------- notifications */

typedef struct hixl_notif {
  hixl_peer_t *peer; /* who sent it (valid until hixl_ctx_destroy or hixl_peer_release) */
  uint32_t imm;      /* the immediate */
  size_t len;        /* bytes of the put it followed (0 for hixl_notify) */
} hixl_notif_t;
/* Take up to max pending notifications; returns how many (0 if none), or <
 * 0 (INVALID) on bad arguments. */
int hixl_notif_poll(hixl_ctx_t *ctx, hixl_notif_t *out, int max);
/* Wait for one notification.  Errors: TIMEOUT, INVALID. */
hixl_status_t hixl_notif_wait(hixl_ctx_t *ctx, hixl_notif_t *out, int timeout_ms);

/* ------------------------------------------------------------------ world */

/* Join a fixed group: rank in [0, size).  rank or size < 0: taken from RANK /
 * WORLD_SIZE; rendezvous "host:port" (rank 0 listens there), NULL:
 * MASTER_ADDR:MASTER_PORT.  Under torchrun (TORCHELASTIC_USE_AGENT_STORE) the
 * ranks meet through the torch TCPStore its agent serves there instead
 * (HIXL_RENDEZVOUS=auto|store|listen; docs/configuration.md#under-torchrun).
 * Every rank gets a peer to every other rank
 * (one connection per pair) and a self peer for itself.  Blocks until all
 * ranks have joined or ctx's timeout expires.
 * Errors: INVALID, TIMEOUT, PEER_LOST, TRANSPORT, AUTH, NOMEM. */
hixl_status_t hixl_world_create(hixl_ctx_t *ctx, int rank, int size, const char *rendezvous,
                                hixl_world_t **world_p);
/* The peer for rank (own rank: a self peer); NULL if out of range.  A rank
 * that is lost and has come back (below) gets a new peer once
 * hixl_world_wait_rank has taken it: this returns it from then on, and the
 * old one is no longer the world's.  If the application got the old one
 * (from this, hixl_world_wait_rank or a notification) it stays valid,
 * answering PEER_LOST, until hixl_peer_release; otherwise it is freed after
 * the release grace (2 x timeout + 1 s), once the rmrs hixl_world_exchange
 * made of it are released.  After
 * hixl_world_destroy a peer this (or hixl_world_wait_rank, or a
 * notification) returned is the application's: hixl_peer_release frees it.
 * The world's peers the application never got are freed by
 * hixl_world_destroy itself (and by a hixl_world_create that fails), each
 * once the rmrs hixl_world_exchange made of it are released. */
hixl_peer_t *hixl_world_peer(hixl_world_t *w, int rank);
int hixl_world_rank(const hixl_world_t *w);
int hixl_world_size(const hixl_world_t *w);
/* Return once every rank has entered the barrier.  Does not fence.  A rank
 * found lost is not waited for: PEER_LOST (hixl_last_error names the
 * ranks) once every other rank has entered it. */
hixl_status_t hixl_world_barrier(hixl_world_t *w);
/* Collective: every rank passes its region; rmrs[r] (an array of size
 * entries) receives rank r's region, usable through hixl_world_peer(w, r).
 * Release each with hixl_rmr_release.  PEER_LOST (and no rmrs) when a rank
 * is lost, the others still in step. */
hixl_status_t hixl_world_exchange(hixl_world_t *w, hixl_mr_t *mr, hixl_rmr_t **rmrs);
/* Elastic worlds: the process of a lost rank may be started again with the
 * same rank, size and rendezvous; its hixl_world_create joins the running
 * world (connecting to every other rank) while the others go on.  Rank 0,
 * which serves the rendezvous by listening, must stay up; through
 * torchrun's store any rank may come back (docs/world.md).  This waits up
 * to timeout_ms (< 0: forever) until rank has a peer that is up, and
 * returns it: at once when it is; when the rank came back, its new peer,
 * which it takes into the world (the only call that does: every other rank
 * calls it too, before the next barrier or exchange, so that they all pair
 * with the newcomer from the same collective on).  Not during a barrier or
 * exchange of another thread (it waits for it to end).
 * Errors: INVALID, TIMEOUT (still lost). */
hixl_status_t hixl_world_wait_rank(hixl_world_t *w, int rank, int timeout_ms, hixl_peer_t **peer_p);
/* Disconnect the world's peers; those the application never got (see
 * hixl_world_peer) are freed after the release grace (and after their
 * rmrs are released), the others are left to hixl_peer_release. */
void hixl_world_destroy(hixl_world_t *w);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* HIXL_H */

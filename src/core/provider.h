/* SPDX-License-Identifier: MIT */
/*
 * The provider interface: what a transport (src/self, src/shm, src/verbs,
 * src/fabric) sees of the core, in the role of rdma-core's driver.h.  The
 * ops table a transport fills, the objects it serves (context, peer,
 * regions, requests), and the core services it calls: sending and calling
 * over the control connection, failing a peer, waiting, pushing
 * notifications, checking a peer's request against the region table.
 * Transports include this header and their own, nothing else of the core
 * (docs/architecture.md, "Layers").
 */
#ifndef HIXL_PROVIDER_H
#define HIXL_PROVIDER_H

#include "base.h"

#include "../device/device.h"
#include "stats.h"

/* Transport ids: small numbers that travel in handshakes, so fixed: each
 * transport defines its own (HIXL_TP_<NAME> in its header), transport.c
 * names them all (hixl__tp_names) and unit/transports checks they agree.
 * Ids are below HIXL_TP_MAX, which leaves room for new transports (bits of
 * a 32-bit mask in handshakes). */
#define HIXL_TP_MAX 8
/* Descriptors other parts of the library hand the control thread (ctx->aux). */
#define HIXL_AUX_MAX 16

/* --------------------------------------------------------------- waiting */

/* wait.c: every blocking wait of the library (see the top of wait.c and
 * docs/waiting.md).  fn looks (and drives progress if it must) and returns
 * true when the wait is over; hixl__wait calls it until then, polling for
 * the adaptive budget and then sleeping until an event wakes it.  Returns
 * OK, or TIMEOUT at deadline (no message recorded: the caller says what
 * did not happen). */
typedef bool (*hixl_wait_fn)(void *arg);
enum {
  HIXL_WAITF_NOSPIN = 1,   /* sleep at once (the progress thread in event mode) */
  HIXL_WAITF_PROGRESS = 2, /* completions only: not notifications (the progress thread) */
  HIXL_WAITF_SPACE = 4,    /* room in a ring we produce into: counted in *ctx->space_waiters
                              while asleep (consumers ring us only then) */
};
hixl_status_t hixl__wait(hixl_ctx_t *ctx, int64_t deadline, unsigned flags, hixl_wait_fn fn,
                         void *arg);
/* One step of a wait whose condition has no event of its own (a provider
 * said EAGAIN: room comes back with progress, not necessarily with a
 * completion): poll fn for the budget, then sleep once, at most cap_ms,
 * until any event.  OK when fn said done, INPROGRESS when the caller
 * should try again, TIMEOUT at deadline. */
hixl_status_t hixl__wait_step(hixl_ctx_t *ctx, int64_t deadline, int cap_ms, hixl_wait_fn fn,
                              void *arg);
/* Someone may sleep in hixl__wait: wake every waiter of ctx (they look again). */
void hixl__wake_all(hixl_ctx_t *ctx);
/* Bump a word sleepers watch (hixl_wait_word_t) and FUTEX_WAKE all of
 * them; shared: the word is in memory other processes map. */
void hixl__wake_word(_Atomic uint32_t *w, bool shared);
/* A transport's set of words changed (arm_words would give others): every
 * thread asleep on words wakes and arms again. */
void hixl__wake_rearm(hixl_ctx_t *ctx);
/* After making an event a waiter may wait for (a completion, a delivered
 * notification, a peer's loss): wake the sleepers, if any.  The fence pairs
 * with the waiter's after it announced itself; without sleepers this is
 * all it costs. */
#define hixl__wake_waiters(ctx)                                                                    \
  do {                                                                                             \
    atomic_thread_fence(memory_order_seq_cst);                                                     \
    if (hixl_unlikely(atomic_load_explicit((ctx)->sleepers, memory_order_relaxed) != 0))           \
      hixl__wake_all(ctx);                                                                         \
  } while (0)
/* A measured wake-up latency (waker's timestamp to the waiter running):
 * what the adaptive polling budget follows. */
void hixl__wait_sample(hixl_ctx_t *ctx, int64_t wake_ns);
/* An inbox ring of a peer's own (notif.c). */
typedef struct hixl_notif_src {
  hixl_ring_t *ring;
  hixl_peer_t *peer;
} hixl_notif_src_t;
typedef struct hixl_sleeper {
  int efd; /* its thread's eventfd */
  struct hixl_sleeper *next;
} hixl_sleeper_t;
/* How a sleeper counts itself in *ctx->sleepers and *ctx->space_waiters
 * (shm peers read both words): the low half counts threads asleep in
 * poll() (woken through eventfds and the doorbell pipe), the high half
 * threads asleep in futex_waitv on words (woken by bumping the word a
 * waiter watches, then FUTEX_WAKE).  Whoever wakes pays only for the
 * kinds that sleep; either half non-zero means someone sleeps. */
#define HIXL_SLEEP_POLL 1u
#define HIXL_SLEEP_WORD 0x10000u
/* A word a sleeping waiter watches with futex_waitv: it sleeps while
 * *word == val, and the event's maker bumps the word and wakes it.
 * shared: the word is in memory other processes map (a shm ring) rather
 * than private to this process. */
typedef struct hixl_wait_word {
  _Atomic uint32_t *word;
  uint32_t val;
  bool shared;
} hixl_wait_word_t;

/* -------------------------------------------------------------- regions */

/*
 * The region table: one slot per registered region, private to its owner
 * (it holds the rkeys): every request of a peer is checked against it or
 * ctx->slot_mr.  Same-host (shm) peers map a table of one-way tags of the
 * same slots instead (src/shm/shm_int.h), never this one.  A slot is live
 * while rkey != 0.  Only the owner writes, under ctx->reg_lock; the release
 * store of rkey publishes the other fields, and dereg clears rkey first so
 * a racing reader sees the slot dead.  rkeys are 64 random bits and never
 * reused, so a released region is never matched again even when its slot
 * is.
 */
#define HIXL_REG_SLOTS 65536u
enum { HIXL_REGF_MEMFD = 1, HIXL_REGF_DEVICE = 2 };
typedef struct hixl_reg_slot {
  _Atomic uint64_t rkey;
  uint64_t base; /* owner's virtual address of byte 0 */
  uint64_t len;
  uint32_t access;
  uint32_t flags; /* HIXL_REGF_* */
} hixl_reg_slot_t;
_Static_assert(sizeof(hixl_reg_slot_t) == 32, "region slot: 32 bytes");

/* Handles carry a magic so that a released one is recognised (they sit in a
 * quarantine before their memory is reused, see hixl__quarantine). */
#define HIXL_MAGIC_MR 0x524d4c58u
#define HIXL_MAGIC_RMR 0x524d5258u
#define HIXL_MAGIC_PEER 0x52455058u
#define HIXL_MAGIC_DEAD 0xdeadbeefu

struct hixl_mr {
  uint32_t magic;
  hixl_ctx_t *ctx;
  void *addr;
  size_t len;
  unsigned access;
  uint32_t slot;
  uint64_t rkey;
  int memfd;             /* >= 0: backing memfd (hixl_mem_alloc or inside one) */
  uint64_t fd_off;       /* offset of addr inside memfd */
  bool owns_mem;         /* hixl_mem_alloc: unmap and close (device: free) on dereg */
  int device;            /* device memory: its device id; host memory: -1 */
  void *tp[HIXL_TP_MAX]; /* per-transport registration (verbs: its ibv_mr) */
  struct hixl_mr *next;  /* ctx->mrs */
};

/* A peer's region: what the blob said, checked with the owner at unpack. */
struct hixl_rmr {
  uint32_t magic;
  hixl_peer_t *peer;
  uint64_t base; /* owner's address (for CMA) */
  uint64_t len;
  uint64_t rkey;
  uint32_t slot;
  uint32_t access;
  uint32_t flags;
  /* The region's key on the peer's transport, opaque to the core (the
   * owner's mr_key; verbs: [0] the ibv rkey; fabric: [0] the key, [1] the
   * remote address of byte 0; shm: [0] the first word of the region's tag,
   * shm_int.h). */
  uint64_t tp_key[2];
  _Atomic bool gone;     /* the owner told us it deregistered the region */
  uint8_t *map;          /* shm: byte 0 of the region in our mapping, or NULL (CMA) */
  void *map_base;        /* what mmap returned (page-aligned) */
  size_t map_len;        /* bytes mapped (page-rounded) */
  struct hixl_rmr *next; /* peer->rmrs */
};

/* --------------------------------------------------------------- requests */

enum { HIXL_REQF_DONE = 1, HIXL_REQF_FREED = 2 };
struct hixl_req {
  _Atomic int status;     /* INPROGRESS until complete; then the result */
  _Atomic unsigned flags; /* DONE / FREED: whoever sets the second recycles */
  hixl_ctx_t *ctx;
  hixl_peer_t *peer;
  uint64_t *old_p;            /* atomics: where the old value goes */
  bool counted;               /* counted in peer->issued: count its completion */
  bool issue_failed;          /* its issuing call returned the error (stats: counted there) */
  _Atomic int parts;          /* async transports: pieces in flight (+1 while issuing) */
  _Atomic int part_err;       /* the first error of a piece */
  uint32_t index;             /* position in the pool */
  _Atomic uint32_t next_free; /* pool free list link (read racily by poppers: the
                               * head's ABA tag makes a stale read harmless) */
};

/* Async transports: one more piece of req in flight / one finished.  The
 * request completes (with the first error, if any) when its last piece is
 * done. */
void hixl__req_part_add(hixl_req_t *req);
void hixl__req_part_done(hixl_req_t *req, hixl_status_t st);

/* ------------------------------------------------------------ transports */

enum { HIXL_AMO_FAA = 1, HIXL_AMO_CAS = 2 };

/* Capabilities of a transport (hixl_transport_ops_t.caps). */
enum {
  /* Its peers are processes of this host that map our memory: they may ask
   * for a region's memfd (FD_REQ) and device IPC handle (DEV_IPC_REQ, made
   * for peer->remote_pid: such a transport sets it from the kernel at its
   * bind, SO_PEERCRED, never from what the peer claimed). */
  HIXL_TP_CAP_LOCAL_MAP = 1,
  /* The loopback: a peer that is our own context (the core makes it when a
   * context connects to itself; its connect gets no handshake, ack NULL). */
  HIXL_TP_CAP_LOOPBACK = 2,
  /* Set up on first need (docs/scale.md): hixl_ctx_create only probes it
   * (its probe slot, cheap: no endpoint, no thread, no pinned memory);
   * ctx_init runs when a connection picks it, on either side, or at once
   * with HIXL_LAZY=0.  So a context that talks shm only never pays for a
   * libfabric endpoint or a verbs device. */
  HIXL_TP_CAP_LAZY = 4,
};

/* A transport's own figures in hixl_ctx_stats (its stats slot adds to
 * them; the core names them, so every transport's figures of one kind add
 * up under one name and new ones are appended, never reordered). */
enum {
  HIXL_XST_RCACHE_HITS,          /* registration cache: lookups that found an entry */
  HIXL_XST_RCACHE_MISSES,        /* lookups that registered (or fell back to bounce) */
  HIXL_XST_RCACHE_EVICTIONS,     /* entries dropped to stay under the cache's limit */
  HIXL_XST_RCACHE_INVALIDATIONS, /* entries dropped: their memory was unmapped */
  HIXL_XST_PINNED_BYTES,         /* memory registered with (pinned by) the device now */
  HIXL_XST_QPS,                  /* queue pairs held now (the verbs budget's count) */
  HIXL_XST_QPS_RECLAIMED,        /* idle pairs whose queue pairs were taken back for room */
  HIXL_XST_MRS,                  /* memory registrations with the device now */
  HIXL_XST_QP_SETUPS_LIMITED,    /* queue pair set-ups held back by a peer's set-up rate */
  HIXL_XST_N
};

/* A control message a transport owns (hixl_transport_ops_t.msgs): a
 * TP_REQ of this kind (tp_req.kind), from peers on that transport only,
 * and its TP_REPLY if it has one. */
typedef struct hixl_tp_msg {
  uint16_t kind;
  /* Descriptors the request / its reply may carry: serve gets none today
   * and a reply hands only its first to the caller, so unit/transports
   * holds them to 0 and at most 1. */
  uint8_t req_fds, reply_fds;
  /* Serve the request (control thread, ctx->lock held): fill *out (a
   * TP_REPLY of the same kind, or type 0: no reply) and the fds to pass,
   * out_fds[0..*n_out), which the caller closes after sending. */
  void (*serve)(hixl_peer_t *peer, const struct hixl_msg *m, struct hixl_msg *out, int *out_fds,
                int *n_out);
} hixl_tp_msg_t;

/*
 * One ops table per transport (size first, every slot filled; typed
 * UNSUPPORTED stubs for what a transport cannot do).  A peer picks its table
 * once at connect, so an operation costs one indirect call.  The core has
 * already checked arguments, bounds and rights when these are called.
 *
 * Synchronous transports (self, shm: async false) complete put/get/notify
 * before returning and get req NULL.  Asynchronous ones (verbs) get a
 * request from the core for every operation: each piece of work they post
 * adds a part (hixl__req_part_add) and finishes it (hixl__req_part_done) at
 * completion.  A negative return means nothing was posted by that call.
 */
typedef struct hixl_transport_ops {
  size_t size;
  const char *name;
  int id;          /* HIXL_TP_* */
  bool async;      /* see above */
  bool needs_bind; /* the handshake continues after HELLO_ACK (a bind message) */
  /* Its bind (TP_BIND / TP_BIND_REPLY, when needs_bind): in band on the
   * TCP control connection (verbs, fabric), or with bind_unix on a new
   * connection to the context's unix socket with bind_fds descriptors
   * (shm), whose unix_bind view carries the cookie HELLO_ACK gave and the
   * initiator's context id: they find the peer it binds. */
  bool bind_unix;
  uint8_t bind_fds;
  unsigned caps; /* HIXL_TP_CAP_* */
  /* This transport's own control messages (TP_REQ / TP_REPLY by kind;
   * kind 0 ends the table; NULL: none). */
  const struct hixl_tp_msg *msgs;
  /* Context set-up: NO_DEVICE means "not on this machine" (not an error).
   * For a HIXL_TP_CAP_LAZY transport it may run on any thread, after the
   * control thread started, with no lock of the core held. */
  hixl_status_t (*ctx_init)(hixl_ctx_t *ctx);
  /* Required with HIXL_TP_CAP_LAZY (NULL otherwise): whether ctx_init
   * could succeed here, cheaply (NO_DEVICE: not offered). */
  hixl_status_t (*probe)(hixl_ctx_t *ctx);
  void (*ctx_fini)(hixl_ctx_t *ctx);
  /* Make a new region reachable through this transport (and undo it). */
  hixl_status_t (*mr_reg)(hixl_mr_t *mr);
  void (*mr_dereg)(hixl_mr_t *mr);
  /* Whether this transport can serve a peer described by the handshake. */
  bool (*usable)(hixl_ctx_t *ctx, const struct hixl_msg *hello_or_ack);
  /* Initiator side: set the peer up after HELLO_ACK. */
  hixl_status_t (*connect)(hixl_peer_t *peer, const struct hixl_msg *ack, int64_t deadline);
  /* Target side of this transport's bind message m (control thread,
   * ctx->lock held): fill the reply out (type TP_BIND_REPLY and a status;
   * type 0: refused, the connection is dropped).  fds[0..nfds):
   * what came with a unix bind, consumed when the status is OK; sock: the
   * socket it came on (who is at the other end: SO_PEERCRED). */
  void (*accept)(hixl_peer_t *peer, const struct hixl_msg *m, int *fds, int nfds, int sock,
                 struct hixl_msg *out, int *out_fds, int *n_out);
  /* Release transport state (peer lost, disconnected or destroyed). */
  void (*peer_close)(hixl_peer_t *peer);
  /* Optional: the peer was just lost or closed (ctx->lock held); fail what
   * is in flight promptly.  peer_close still follows, later. */
  void (*peer_lost)(hixl_peer_t *peer);
  /* Check an unpacked blob with the owner and make it usable. */
  hixl_status_t (*rmr_attach)(hixl_rmr_t *rmr, int64_t deadline);
  void (*rmr_detach)(hixl_rmr_t *rmr);
  /* Whether the owner still holds rmr's region (stale rkey check). */
  bool (*rmr_live)(const hixl_rmr_t *rmr);
  hixl_status_t (*put)(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                       uint64_t off, hixl_req_t *req);
  hixl_status_t (*get)(hixl_peer_t *peer, void *dst, size_t len, hixl_rmr_t *rmr, uint64_t off,
                       hixl_req_t *req);
  /* A put whose notification {imm, len} follows its data. */
  hixl_status_t (*put_imm)(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                           uint64_t off, uint32_t imm, hixl_req_t *req);
  /* Deliver one notification {imm, len} after everything before it. */
  hixl_status_t (*notify)(hixl_peer_t *peer, uint32_t imm, uint64_t len, hixl_req_t *req);
  /* With req NULL: execute now and return OK with *old_p set, or return
   * INPROGRESS having done nothing (it needs a request).  With req: execute
   * now (OK, *old_p set, req untouched) or later (INPROGRESS; completes req
   * with hixl__req_complete, or through parts).  Errors leave req untouched. */
  hixl_status_t (*atomic)(hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off, int op, uint64_t a,
                          uint64_t b, uint64_t *old_p, hixl_req_t *req);
  /* Poll this transport's completion sources; returns completions or < 0. */
  int (*progress)(hixl_ctx_t *ctx);
  /* The control thread saw ctx->tp_fd[id] readable, or its periodic tick
   * (target-side work: verbs receive completions -> notifications). */
  void (*on_event)(hixl_ctx_t *ctx);
  /* Optional: liveness without messages (shm: the time of its control
   * thread's last turn, which it stores in its bell page).  For an up
   * peer, ctl.c's housekeeping (ctx->lock held), only once it has not
   * heard from the peer for half the liveness period, so an idle peer
   * costs one read per T/2, not one per tick: 1 when the peer showed life
   * since the last call, with *seen_ns the latest time it surely was
   * alive (<= now); 0 when not; -1 when this peer cannot tell.  Peers that
   * can tell get no periodic heartbeats, only a probe when they seem
   * silent for half the liveness period. */
  int (*peer_alive)(hixl_peer_t *peer, int64_t now, int64_t *seen_ns);
  /* Optional (NULL: the core issues each element, then notify): a whole
   * checked batch of total bytes, with its notification {*imm, total} when
   * imm is set. */
  hixl_status_t (*batch)(hixl_peer_t *peer, const hixl_xfer_t *xfers, size_t n, bool is_put,
                         const uint32_t *imm, uint64_t total, hixl_req_t *req);
  /* Optional, for sleeping waits (wait.c): a thread is about to sleep.
   * arm asks for an event at this transport's next completion (and, unless
   * flags has HIXL_WAITF_PROGRESS, its next notification) and stores the
   * fds that become readable then in fds[0..max); returns how many, or -1
   * when events are pending already (the waiter looks again instead of
   * sleeping).  ack_event consumes what made them readable (non-blocking;
   * the thread that woke calls it before it next sleeps, woke_ns when it
   * woke: a transport that knows when its event was made samples the
   * wake-up latency, hixl__wait_sample). */
  int (*arm)(hixl_ctx_t *ctx, unsigned flags, int *fds, int max);
  /* Optional, with arm: instead of fds, the words this transport's events
   * bump (shm: one in each peer's inbox), stored in w[0..max) with their
   * current values; returns how many, or -1 when it cannot (more than
   * max): then the waiter sleeps in poll() on arm's fds.  A thread that
   * sleeps on words counts itself with HIXL_SLEEP_WORD, so the transport's
   * producers know to bump and FUTEX_WAKE rather than write an fd. */
  int (*arm_words)(hixl_ctx_t *ctx, unsigned flags, hixl_wait_word_t *w, int max);
  /* word: the event came on one of arm_words' words, not on arm's fds. */
  void (*ack_event)(hixl_ctx_t *ctx, int64_t woke_ns, bool word);
  /* Optional: hixl_notif_poll is about to look at the inboxes (ctx->lock
   * not held): move what has arrived into them now (verbs: poll the receive
   * CQ directly, so a polling target does not wait for the control thread). */
  void (*notif_poll)(hixl_ctx_t *ctx);
  /* Optional: hixl_notif_poll took entries from peer's inbox (ctx->lock
   * held): wake its producer if it waits for room (shm: ring its doorbell
   * when its page says it waits; self: our own waiters). */
  void (*notif_consumed)(hixl_peer_t *peer);
  /* Optional: transports whose peers do not read our region table (remote
   * keys: verbs, fabric).  The key a peer needs for mr on this transport
   * (TP_MR_REPLY, into its rmr->tp_key), or false when mr is not reachable
   * through it (device memory the NIC or provider cannot reach).  Such
   * peers are also told when a region is deregistered (REGION_GONE). */
  bool (*mr_key)(const hixl_mr_t *mr, uint64_t key[2]);
  /* Optional: add this transport's figures to xs[HIXL_XST_*].  Called for
   * a context where the transport is set up (tp_ready), from any thread,
   * ctx->lock held or not (a peer's STATS is served under it): it must not
   * wait on a lock, only read its counters. */
  void (*stats)(hixl_ctx_t *ctx, uint64_t xs[HIXL_XST_N]);
} hixl_transport_ops_t;

/* Notifications of transports that receive them in our own process
 * (verbs, fabric): deliver {imm, len} from peer into the context's inbox,
 * after everything it delivered before.  False when it cannot take it now
 * (the inbox is full, or peer is not up yet): keep it, and retry it before
 * anything that arrived after it.  Called with the transport's receive
 * lock (one producer per transport at a time). */
bool hixl__inbox_push(hixl_peer_t *peer, uint32_t imm, uint64_t len);
/* In such a transport's peer_close, once nothing more can be delivered
 * for peer: drop its entries still in the inbox. */
void hixl__inbox_forget(hixl_peer_t *peer);
/* A transport whose peers write an inbox ring of their own (shm, self):
 * ring becomes peer->inbox and one of what hixl_notif_poll visits (from
 * when peer is up); NOMEM.  del before the ring's memory goes: once it
 * returns, no poller reads the ring. */
hixl_status_t hixl__notif_src_add(hixl_peer_t *peer, hixl_ring_t *ring);
void hixl__notif_src_del(hixl_peer_t *peer);

/* Slots a transport without such a step fills with (transport.c). */
hixl_status_t hixl__tp_ctx_init_none(hixl_ctx_t *ctx);
void hixl__tp_ctx_fini_none(hixl_ctx_t *ctx);
hixl_status_t hixl__tp_mr_reg_none(hixl_mr_t *mr);
void hixl__tp_mr_dereg_none(hixl_mr_t *mr);
void hixl__tp_on_event_none(hixl_ctx_t *ctx);
void hixl__tp_accept_none(hixl_peer_t *peer, const struct hixl_msg *m, int *fds, int nfds, int sock,
                          struct hixl_msg *out, int *out_fds, int *n_out);
/* put_imm of a synchronous transport: its put, then its notify. */
hixl_status_t hixl__tp_put_imm_sync(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                                    uint64_t off, uint32_t imm, hixl_req_t *req);

/* ------------------------------------------------------------------ peers */

enum { HIXL_PEER_CONNECTING = 0, HIXL_PEER_UP = 1, HIXL_PEER_LOST = 2, HIXL_PEER_CLOSED = 3 };

/* A control-plane call waiting for its reply (call.c). */
typedef struct hixl_pending {
  uint64_t seq;
  uint16_t reply_type;
  bool done;
  hixl_status_t status;
  struct hixl_msg *reply; /* caller-owned buffer the reply is decoded into */
  int fd;                 /* a passed fd, or -1 */
  hixl_req_t *req;        /* async: complete this instead of waking a waiter */
  bool part;              /* req is an asynchronous transport's (parts counted): end a part */
  struct hixl_pending *next;
} hixl_pending_t;

struct hixl_peer {
  uint32_t magic;
  hixl_ctx_t *ctx;
  const hixl_transport_ops_t *ops;
  void *tp; /* transport-private state */
  _Atomic int state;
  bool inbound; /* they connected to us; owned by the context */
  /* The handle reached the user (a notification, hixl_world_peer,
   * hixl_world_wait_rank): an inbound one is kept, lost or not, until
   * hixl_ctx_destroy or hixl_peer_release.  One that never did is freed
   * once lost and closed (ctl.c: housekeeping). */
  _Atomic bool handed;
  /* hixl_peer_release: releasing once it has claimed the handle (a second
   * release, a world taking it, are refused from then on); released once
   * it is closed, when the control thread may free it past the release
   * grace.  Not while pins > 0 (hixl__peers_pin, under ctx->lock), nor if
   * tp_kept: its transport kept records that point at it past its close
   * (operations that never finished; the handle then stays, as before). */
  _Atomic bool releasing, released;
  unsigned pins;
  bool tp_kept;
  /* A world's rank: the world owns the handle, so hixl_peer_release
   * refuses it and housekeeping keeps it until hixl_world_destroy, which
   * releases it itself unless handed (hixl__peer_world_disown). */
  _Atomic bool world_owned;
  /* Not freed before this (0: no hold): a world replaced it as a rank's
   * peer, and hixl_world_peer, which reads the rank's peer without a lock,
   * may have loaded it just before (world.c: refresh_locked). */
  int64_t hold_ns;
  bool self;
  bool unix_pending;         /* an accepted unix connection not yet bound to its peer */
  _Atomic bool used;         /* an operation was issued (fence reports loss only then) */
  _Atomic bool bye_sent;     /* hixl_disconnect began: its end counts as a disconnect */
  uint64_t fence_acked;      /* fence(NULL) reported this peer's loss */
  int fd;                    /* control socket (TCP, or unix once shm is bound); -1 when none */
  pthread_mutex_t send_lock; /* serializes writes on fd, guards the output queue */
  /* Control messages the socket did not take at once (call.c): sent by the
   * control thread when the socket drains (EPOLLOUT), so no sender ever
   * blocks on a peer that does not read; capped (HIXL_MAX_PEER_QUEUE), and a
   * peer whose queue makes no progress for the liveness period is dropped. */
  struct hixl_outmsg *oq_head, *oq_tail;
  size_t oq_bytes;
  int64_t oq_progress_ns;
  bool polled; /* fd is in the control thread's epoll (sends may queue) */
  /* TLS (tls.h) on the TCP control connection, when HIXL_TLS=1: the session
   * is used only while fd == tls_fd (shm moves to its unix socket). */
  void *tls;
  int tls_fd;
  bool tls_ready; /* handshake done (inbound: driven by the control thread) */
  uint64_t remote_ctx_id;
  pid_t remote_pid;
  uint64_t tag;    /* world tag from HELLO (0: none) */
  uint64_t cookie; /* inbound, bind_unix transports: matches the TP_BIND on the unix socket */
  /* Inbound handshake (auth.h): 0 waiting for HELLO, 1 challenge sent,
   * waiting for AUTH, 2 answered.  Nonces: theirs then ours. */
  uint8_t hs_stage;
  uint8_t auth_nonce[64];
  char name[96]; /* for messages: "host:port" or "inbound #n" */
  /* Why it was lost, for the PEER_LOST of later calls: written once by the
   * first to claim why_claimed, readable once why_ready is set (release). */
  char lost_why[512]; /* room for a verbs work-completion message and its hint */
  atomic_bool why_claimed, why_ready;
  /* Why the transport last failed operations of this peer while it stayed
   * up (verbs: its QPs refused or not made), with that status: set where
   * the failure is found (often not the caller's thread), appended to the
   * failed request's message by hixl_req_test.  Under why_lock. */
  pthread_mutex_t why_lock;
  hixl_status_t op_why_st;
  char op_why[384];

  /* Operations issued / completed, for hixl_fence.  Completions of one peer
   * arrive in issue order (control channel FIFO), so completed >= n means the
   * first n completed. */
  _Atomic uint64_t issued;
  _Atomic uint64_t completed;

  /* Its figures for hixl_ctx_stats (stats.h: operation counters written
   * with relaxed load-and-store, errors and notifications atomically). */
  _Atomic uint64_t st[HIXL_OPST_N];
  _Atomic uint64_t st_errors, st_notif_rx;
  /* The control connection's round trip (ns, 0: not measured yet): a
   * HEARTBEAT probe carries our clock, the answer echoes it (ctl.c). */
  _Atomic int64_t rtt_ns;

  /* Notifications they send us in a ring of their own (shm: shared; self:
   * local), or NULL: verbs and fabric deliver into the context's inbox
   * (hixl__inbox_push), where inbox_queued counts this peer's entries. */
  hixl_ring_t *inbox;
  _Atomic uint32_t inbox_queued;

  /* Everything below is protected by ctx->lock. */
  hixl_pending_t *pending;
  uint64_t next_seq;
  uint8_t *rx; /* control receive buffer (control thread only) */
  size_t rx_len, rx_cap;
  int rx_fds[8]; /* fds received, in order, not yet claimed */
  int n_rx_fds;
  bool rx_fds_dropped;        /* the kernel dropped some (MSG_CTRUNC: EMFILE) */
  int64_t last_rx_ns;         /* when we last heard from it (a message, or peer_alive) */
  bool alive_ok;              /* its ops' peer_alive can tell: ask only when it seems quiet */
  int64_t born_ns;            /* created / accepted: a handshake's deadline runs from here, not from
                                 its last byte (a peer trickling bytes is not kept forever) */
  _Atomic int64_t last_tx_ns; /* written under send_lock, read by heartbeats */
  int64_t lost_ns;            /* when it was lost or closed (0: not) */
  int64_t probe_ns;           /* the stamp of our last probe not answered yet (0: none) */
  uint64_t barrier_epoch;     /* world: highest barrier epoch received from them */
  uint64_t xchg_epoch;        /* world: epoch of the blob in xchg_blob */
  uint8_t xchg_blob[HIXL_RKEY_MAX];
  uint32_t xchg_len;
  hixl_rmr_t *rmrs;         /* rmrs unpacked through this peer */
  struct hixl_peer *next;   /* ctx->peers */
  struct hixl_peer **pprev; /* what points at it in ctx->peers */
  uint32_t hk_idx;          /* its slot in ctx->hk */
  /* ctx->hs_head: inbound connections in their handshake, oldest first
   * (the handshake cap walks these, never every peer).  Control thread,
   * ctx->lock. */
  struct hixl_peer *hs_next;
  bool in_hs;
};

/* peer's handle is about to reach the user (see hixl_peer.handed). */
static inline void hixl__peer_handed(hixl_peer_t *peer)
{
  if (!atomic_load_explicit(&peer->handed, memory_order_relaxed))
    atomic_store_explicit(&peer->handed, true, memory_order_relaxed);
}

/* --------------------------------------------------------------- context */

#define HIXL_MAX_PUBLISHED 1024
typedef struct hixl_published {
  char name[64];
  hixl_mr_t *mr;
} hixl_published_t;

struct hixl_ctx {
  uint64_t id;         /* random; identifies us in handshakes and blobs */
  uint8_t host_id[32]; /* boot id + network namespace: "same host" */
  hixl_config_t cfg;   /* strings below are owned copies */
  char *cfg_strs[5];
  uint32_t tp_allowed; /* bit per HIXL_TP_*: what the configuration allows */
  /* Bit per HIXL_TP_*: allowed and set up on this machine.  Bits are only
   * added (hixl__tp_need, once everything a transport needs is in place),
   * so a reader that sees one may use ctx->tp[id]. */
  _Atomic uint32_t tp_ready;
  _Atomic uint32_t tp_lazy; /* probed, to set up on first need (cleared under tp_init_lock) */
  pthread_mutex_t tp_init_lock;
  char tp_init_err[HIXL_TP_MAX][768]; /* why a lazy set-up failed, with its hint (tp_init_lock) */
  /* Operations a transport queued in software because its hardware queue
   * was full: while any wait, the control thread ticks every millisecond
   * (on_event), so they go out even if the caller never calls hixl again. */
  _Atomic long tp_backlog;
  void *tp[HIXL_TP_MAX];         /* per-transport context state (verbs: device, PD, CQs) */
  int tp_fd[HIXL_TP_MAX];        /* a transport's event fd for the control thread, or -1 */
  uint8_t tp_order[HIXL_TP_MAX]; /* preference order */
  int n_tp_order;
  char address[128];
  char tp_names[64];   /* hixl_ctx_transports() */
  char unix_name[108]; /* abstract unix socket for same-host peers */
  int listen_fd, unix_fd, wake_fd, epoll_fd;
  /* Other descriptors the control thread serves for the library (a world's
   * join listener and its connections, world.c): each slot's callback runs
   * on the control thread, without ctx->lock, with aux_lock held
   * (hixl__ctl_aux_*).  Slots live as long as the context, so an event
   * still in the thread's batch for a slot just removed finds cb NULL. */
  struct hixl_aux {
    int fd;
    void (*cb)(void *arg, int fd, uint32_t events);
    void *arg;
  } aux[HIXL_AUX_MAX];
  pthread_mutex_t aux_lock;
  /* Out of file descriptors (EMFILE at accept): listeners out of epoll
   * until this time (control thread only); the handshake cap. */
  int64_t accept_paused_until;
  /* HIXL_TEST_CTL_STALL_MS (testing only): the control thread sleeps this
   * long once, after reading its sockets (where slow transport work takes
   * its time), once the context has connected a peer (unit/ctl_stall). */
  int test_stall_ms;
  unsigned accept_paused; /* bit 0: listen_fd, bit 1: unix_fd */
  bool accept_capped;     /* paused for the handshake cap: back when one ends */
  int64_t emfile_warned_ns;
  int max_handshakes; /* HIXL_MAX_HANDSHAKES */
  int max_peers;      /* HIXL_MAX_PEERS: authenticated inbound peers at once */
  size_t max_outq;    /* HIXL_MAX_PEER_QUEUE: bytes queued for one peer at most */
  void *tls;          /* HIXL_TLS=1: credentials (tls.c); NULL: plain TCP */
  pthread_t ctl_thread;
  bool ctl_started;
  _Atomic bool stopping;
  _Atomic bool hk_due; /* a peer failed: the control thread's housekeeping runs now */
  pthread_t prog_thread;
  bool prog_started;

  /* Protects peers, pending calls, published names, world state.  Waiters
   * on control replies sleep on cond. */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  hixl_peer_t *peers;
  /* Every peer in ctx->peers, with when the control thread's housekeeping
   * next has something to do for it (ctl.c): a tick scans this array, a
   * few pages, and visits only the peers due, so that thousands of idle
   * peers cost a read each per half liveness period, not per tick. */
  struct hixl_hk_slot {
    int64_t due_ns;
    hixl_peer_t *p;
  } * hk;
  uint32_t hk_n, hk_cap;
  hixl_peer_t *hs_head; /* inbound handshakes, oldest first (hs_next) */
  unsigned n_inbound;
  hixl_published_t published[HIXL_MAX_PUBLISHED];
  /* Notifications from every verbs and fabric peer, in arrival order, each
   * tagged with its peer (notif.c): one ring per context, not per peer
   * (docs/scale.md).  Its pages are touched only as positions reach them. */
  hixl_ring_t *inbox;
  /* What hixl_notif_poll visits (notif.c), side by side because a waiter
   * woken after a long sleep finds all of it cold: the rings of the peers
   * with an inbox of their own (shm, self) in an array, not the peer list
   * (no peer's line is read unless its ring has entries), under a lock of
   * its own, not ctx->lock (a leaf: taken under ctx->lock, never around
   * it), which also serializes the consumers of the context's inbox. */
  struct {
    pthread_mutex_t lock;
    hixl_notif_src_t *v;
    unsigned n, cap;
    unsigned rr;      /* round-robin start */
    uint32_t tp_mask; /* transports with a notif_poll hook */
  } notif;

  /* Region registry. */
  pthread_mutex_t reg_lock;
  hixl_reg_slot_t *reg_table; /* HIXL_REG_SLOTS slots, memfd-backed */
  hixl_mr_t **slot_mr;        /* HIXL_REG_SLOTS: the mr in each live slot */
  int reg_fd;
  uint32_t reg_hint;
  hixl_mr_t *mrs;

  /* Released handles wait here before their memory is freed, so a use
   * after release reads a dead magic rather than reused memory. */
#define HIXL_QUARANTINE 4096
  void *quarantine[HIXL_QUARANTINE];
  unsigned q_next;

  /* Waiting (wait.c).  sleepers counts threads announced in hixl__wait;
   * it points at own_sleepers, or into memory shm peers map read-only
   * (they ring our doorbell only when it is non-zero). */
  int wait_mode;      /* HIXL_WAIT_* */
  int wait_safety_ms; /* the longest sleep before a look (SAFETY_MS) */
  _Atomic uint32_t *sleepers;
  _Atomic uint32_t own_sleepers;
  /* Threads waiting for room in a full notification ring (same placement:
   * the consumer wakes them). */
  _Atomic uint32_t *space_waiters;
  _Atomic uint32_t own_space_waiters;
  pthread_mutex_t wait_lock; /* sleeping (a leaf lock) */
  hixl_sleeper_t *sleeping;  /* threads asleep in poll() */
  /* Threads asleep in futex_waitv watch this word (private): a local
   * wake-up bumps it and wakes them all. */
  _Atomic uint32_t wake_word;
  _Atomic int64_t spin_ns;       /* the adaptive polling budget */
  _Atomic int64_t wake_stamp_ns; /* when hixl__wake_all last ran */

  /* Request pool: chunks of requests, a lock-free free list of indices. */
  pthread_mutex_t pool_lock; /* growing only */
  hixl_req_t *pool_chunks[256];
  _Atomic uint32_t pool_nchunks;
  _Atomic uint64_t pool_head; /* (aba tag << 32) | (index + 1), 0 = empty */

  /* Counters (stats.h, stats.c): the per-thread blocks, and the rest. */
  pthread_mutex_t stats_lock; /* tstats list: adding a block */
  hixl_tstats_t *_Atomic tstats;
  hixl_ctx_counters_t cnt;
  char **stat_names; /* other contexts' figure names (hixl_peer_remote_stats), stats_lock */
  size_t n_stat_names;
  struct hixl_metrics *metrics; /* HIXL_METRICS endpoint (metrics.c), or NULL */
};

/* The control connection, for transports (call.c, peer.c, handshake.c). */
/* Send a message on peer's control socket (with fds); thread-safe. */
hixl_status_t hixl__send(hixl_peer_t *peer, struct hixl_msg *m, const int *fds, int nfds);
/* Call: send m, wait for a reply of reply_type (decoded into *reply, a
 * passed fd into *fd_p when fd_p is non-NULL). */
hixl_status_t hixl__call(hixl_peer_t *peer, struct hixl_msg *m, uint16_t reply_type,
                         struct hixl_msg *reply, int *fd_p, int64_t deadline);
/* One handshake reply on a peer's TCP control connection (through TLS when
 * it has it): what the transports' connect calls use before it is polled. */
hixl_status_t hixl__peer_recv_sync(hixl_peer_t *peer, struct hixl_msg *m, int64_t deadline);
/* Read one whole message from a socket the control thread does not own yet
 * (handshakes); passed fds go to fds[0..max_fds). */
hixl_status_t hixl__recv_sync(int fd, struct hixl_msg *m, int *fds, int max_fds, int64_t deadline,
                              const char *who);
/* An atomic the owner's control thread executes (ATOMIC, asynchronous):
 * waits for room when the peer has many requests in flight (AGAIN past
 * the timeout), then sends it; req completes with the reply, or with
 * PEER_LOST.  part: req belongs to an asynchronous transport (ops->async:
 * counted by the core, completed by parts), and the reply ends one part
 * of it, writing the old value first; else the reply completes req.  tp
 * names the transport in errors. */
hixl_status_t hixl__owner_atomic(const char *tp, hixl_peer_t *peer, hixl_rmr_t *r, uint64_t off,
                                 int op, uint64_t a, uint64_t b, hixl_req_t *req, bool part);
/* End an asynchronous call's request with st (and an atomic's old value);
 * ctx->lock held. */
void hixl__pending_req_end(hixl_pending_t *pd, hixl_status_t st, uint64_t old);
/* Mark a peer lost/closed and fail what waits on it; ctx->lock held. */
void hixl__peer_fail_locked(hixl_peer_t *peer, int state, const char *why);
/* Mark a peer lost from a thread that may not take ctx->lock (completion
 * polling); the control thread fails what waits on it. */
void hixl__peer_lost_async(hixl_peer_t *peer, const char *why);
/* Why peer was lost or closed (its first reason), or NULL if not known. */
const char *hixl__peer_why(hixl_peer_t *peer);
/* A transport failed peer's operations with st for this reason while the
 * peer stays up: hixl_req_test adds it to those requests' message. */
void hixl__peer_op_why(hixl_peer_t *peer, hixl_status_t st, const char *why);
/* PEER_LOST for a call fn on a peer that is not up: "fn: peer X is lost
 * (why)tail", or "disconnected". */
hixl_status_t hixl__peer_state_err(const char *fn, hixl_peer_t *peer, const char *tail);
void hixl__wake(hixl_ctx_t *ctx);
int hixl__ctx_timeout(const hixl_ctx_t *ctx);
/* How long an issuing call waits for earlier operations of a peer (an
 * ordered operation, a notification behind writes) or for room to issue
 * (fabric queues full, owner-run atomics at their cap, shm copies staged
 * for the owner): past the liveness
 * period, so that a peer that stopped answering is declared lost first
 * and the caller hears PEER_LOST; TIMEOUT is left for a live peer that
 * does not complete.  With the timeout itself the two raced (hixl-soak:
 * a target stopped a little longer made them fail TIMEOUT at issue). */
static inline int hixl__issue_wait_ms(const hixl_ctx_t *ctx)
{
  return 2 * hixl__ctx_timeout(ctx) + 1000;
}
/* A peer silent for max(timeout_ms, this) is lost (ctl.c: liveness_ms). */
#define HIXL_LIVENESS_FLOOR_MS 1000

/* mr.c: checks of a peer's requests, and calls about remote regions. */
/* Check rkey/slot against our (private) table; base/len/access as claimed. */
hixl_status_t hixl__reg_check(const hixl_reg_slot_t *table, uint32_t slot, uint64_t rkey,
                              uint64_t base, uint64_t len, uint32_t access, uint32_t flags);
/* Owner side of a copy a peer asks us to perform (shm without CMA): the
 * live region (slot, rkey) holds [off, off + len) and grants need; *addr_p
 * is our address of byte off.  NOT_REGISTERED (no such live region, or the
 * range is outside it), UNSUPPORTED (device memory), ACCESS.  reg_lock held
 * (and kept for the copy: a deregistration waits for it). */
hixl_status_t hixl__serve_range_locked(hixl_ctx_t *ctx, uint32_t slot, uint64_t rkey, uint64_t off,
                                       uint64_t len, unsigned need, uint8_t **addr_p);
/* The ATOMIC control message for an owner-executed atomic on r+off. */
void hixl__atomic_msg(const hixl_rmr_t *r, uint64_t off, int op, uint64_t a, uint64_t b,
                      struct hixl_msg *m);
/* Transports with remote keys (mr_key): ask the owner for r's key on our
 * transport (TP_MR), which checks the whole blob, into r->tp_key.
 * unreachable ends the message of an UNSUPPORTED reply ("device memory
 * <unreachable>"). */
hixl_status_t hixl__rmr_key_call(hixl_rmr_t *r, const char *unreachable, int64_t deadline);
/* Run an atomic on our own memory (self, or a peer's ATOMIC request). */
uint64_t hixl__amo_local(uint64_t *p, int op, uint64_t a, uint64_t b);

/* notif.c: push a notification into a peer's ring, waiting (bounded by the
 * context timeout) while it is full. */
hixl_status_t hixl__notify_push(hixl_peer_t *peer, hixl_ring_t *ring, uint32_t imm, uint64_t len);

#endif /* HIXL_PROVIDER_H */

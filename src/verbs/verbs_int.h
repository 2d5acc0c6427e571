/* SPDX-License-Identifier: MIT */
/*
 * Inside the verbs transport.  Three parts, one file each:
 *
 *   verbs.c   device and port, context set-up, regions, peers and their QPs
 *             (connected over the control connection), the receive side
 *             (immediates -> notifications), the ops table;
 *   post.c    the send path: per-QP rings with selective signaling, chained
 *             work requests, the software queue for what does not fit, the
 *             bounce pool, completions;
 *   rcache.c  the registration cache for large unregistered local buffers,
 *             kept honest by a userfaultfd monitor;
 *   lazy.c    QPs made on first use (HIXL_VERBS_LAZY, default 1): the
 *             QP_REQ / QP_ACCEPT / QP_READY exchange over the control
 *             connection, run by a set-up thread of its own.
 */
#ifndef HIXL_VERBS_INT_H
#define HIXL_VERBS_INT_H

#include <infiniband/verbs.h>
#ifdef HIXL_HAVE_RDMACM
#include <rdma/rdma_cma.h>
#else
struct rdma_cm_id;
struct rdma_event_channel;
#endif

#include "../core/config.h"
#include "../core/provider.h"

#define HIXL_TP_VERBS 2 /* the wire id (transport.c names it) */
extern const hixl_transport_ops_t hixl__verbs_ops;

/* The bind (TP_BIND / TP_BIND_REPLY) as verbs reads it: the QPN of QP 0,
 * PSN, MTU (enum ibv_mtu), LID; id: the initiator's context id (request) or,
 * with rdmacm, the cookie (reply); nqps: the QP count n; cm: 1 to connect
 * with rdmacm (request), the listener's port (reply).  blob: the 16-byte
 * GID, then the QPNs of QPs 1..n-1 (4 bytes each, little-endian; none with
 * rdmacm); with rdmacm the reply's blob is the listener's address (16
 * bytes, IPv4-mapped for IPv4). */
typedef HIXL_MSG_VIEW(qpn, psn, mtu, lid, id, nqps, cm, lazy) vrb_qp_msg_t;
#define VRB_QP(m) HIXL_MSG_AS(vrb_qp_msg_t, m)

/* Verbs' own control messages (TP_REQ, kind in u32[2]; lazy.c), made when a
 * pair of contexts first needs QPs: QP_REQ (the side that needs them: its
 * QPs, as a bind), QP_ACCEPT (the other side: its QPs, or status != 0 and
 * str[0] why not), QP_READY (the requester's QPs are connected: the
 * acceptor may post), QP_WAIT (no room now, but an idle pair's QPs are
 * being reclaimed: ask again in a moment).  And when a side takes an idle
 * pair's QPs back to make room (LRU under its budget): QP_QUIESCE (we post
 * no more on them), QP_RELEASED (neither do we, everything we posted has
 * completed, and ours are gone).  gen names the request or the pair's QPs
 * the message belongs to; blob as in a bind (the GID, then the QPNs of QPs
 * 1..n-1). */
enum {
  VRB_KIND_QP_REQ = 1,
  VRB_KIND_QP_ACCEPT = 2,
  VRB_KIND_QP_READY = 3,
  VRB_KIND_QP_WAIT = 4,
  VRB_KIND_QP_QUIESCE = 5,
  VRB_KIND_QP_RELEASED = 6,
};
typedef HIXL_MSG_VIEW(qpn, psn, kind, mtu, lid, nqps, gen, status) vrb_lazy_msg_t;
#define VRB_LZ(m) HIXL_MSG_AS(vrb_lazy_msg_t, m)

#define VRB_SQ_DEPTH 256      /* send work requests in flight per QP */
#define VRB_SIGNAL_EVERY 64   /* at least one signaled request in this many */
#define VRB_CHAIN 32          /* work requests per ibv_post_send */
#define VRB_PROGRESS_MAX 1024 /* completions a send CQ a progress call, at most */
#define VRB_MAX_QPS 16        /* HIXL_VERBS_QPS upper bound */
#define VRB_QUEUE_MAX 4096    /* software-queued requests per QP before callers wait */
#define VRB_SRQ_DEPTH 512
#define VRB_RECV_SIZE 64
#define VRB_BOUNCE_SIZE 65536
#define VRB_BOUNCE_COUNT 32
#define VRB_CQ_DEPTH 8192
#define VRB_MAX_SCQS 64
#define VRB_INLINE 64
#define VRB_MAX_WR_LEN (1u << 30) /* split longer writes */
/* Reads are cut in pieces of this (default): a READ's response packets are
 * not flow controlled like a WRITE's, and one large READ on Soft-RoCE
 * overruns the receiving side's backlog, is retried whole, overruns it again
 * and never completes.  Up to max_rd_atomic pieces are in flight at once. */
#define VRB_READ_CHUNK (64u * 1024)
#define VRB_STRIPE_MIN (256u * 1024) /* a put/get this large is cut over the QPs */

enum { VRB_WR_PUT, VRB_WR_GET, VRB_WR_AMO, VRB_WR_SEND };

typedef struct vrb_rcache vrb_rcache_t;
/* The registration budget (docs/verbs.md): the memory this context has
 * registered with the device (pinned) and how many registrations, its own
 * buffers, host regions, the cache's entries and peers' atomic results
 * together, each at most its limit: HIXL_VERBS_MAX_PINNED (bytes; none by
 * default, RLIMIT_MEMLOCK is the kernel's) and HIXL_VERBS_MAX_MRS (the
 * device's max_mr unless less is asked for). */
typedef struct vrb_pins {
  _Atomic uint64_t bytes;
  _Atomic uint32_t mrs;
  uint64_t max_bytes;
  uint32_t max_mrs, dev_max_mrs;
  vrb_rcache_t *rcache; /* whose idle entries give way to a registration */
} vrb_pins_t;
enum { VRB_PIN_OK, VRB_PIN_MRS, VRB_PIN_BYTES };
/* Count one registration of bytes against the budget: VRB_PIN_OK, or which
 * limit it would pass (nothing counted). */
int hixl__vrb_pin_try(vrb_pins_t *p, uint64_t bytes);
/* The same, the registration cache's idle entries giving way when that
 * makes room (hixl__vrb_rcache_pin); else NOMEM saying which limit and
 * what `what` needed. */
hixl_status_t hixl__vrb_pin(vrb_pins_t *p, uint64_t bytes, const char *what);
void hixl__vrb_unpin(vrb_pins_t *p, uint64_t bytes);
typedef struct vrb_rent vrb_rent_t;

/* One hixl region as the send path needs it: sorted by start. */
typedef struct vrb_lreg {
  uintptr_t start, end;
  uint32_t lkey;
} vrb_lreg_t;

typedef struct vrb_scq {
  struct ibv_cq *cq;
  int cap;   /* completions it holds */
  int n_qps; /* QPs sending on it */
} vrb_scq_t;

typedef struct vrb_peer vrb_peer_t;

/* A first-in first-out list of peers linked through a next pointer of
 * theirs (lazy.c: the set-up thread's work list, the room queue). */
typedef struct vrb_fifo {
  vrb_peer_t *head, *tail;
} vrb_fifo_t;

typedef struct vrb_ctx {
  struct ibv_context *dev;
  struct ibv_pd *pd;
  struct ibv_comp_channel *sch; /* send CQ events: the progress thread's event mode */
  /* Send CQs, shared by the peers' QPs; another is made when the existing
   * ones cannot take VRB_SQ_DEPTH more completions per new QP (a device's
   * CQ holds at most max_cqe).  Only ever appended to before ctx_fini. */
  vrb_scq_t scqs[VRB_MAX_SCQS];
  _Atomic int n_scqs;
  struct ibv_comp_channel *rch;
  struct ibv_cq *rcq;
  struct ibv_srq *srq;
  uint8_t *rbufs;
  struct ibv_mr *rbufs_mr;
  uint8_t port;
  int gid_index;
  union ibv_gid gid;
  uint16_t lid;
  enum ibv_mtu mtu;
  uint32_t max_inline;
  uint32_t read_chunk; /* bytes per RDMA READ (HIXL_VERBS_READ_CHUNK) */
  int max_cqe;
  bool atomic_be; /* atomic results arrive big-endian (some HCAs) */
  char name[64];
  /* Completions are retired by one thread at a time (trylock). */
  pthread_mutex_t poll_lock;
  pthread_mutex_t cq_lock; /* scqs: adding, resizing, counting QPs */
  /* Local keys of hixl regions, sorted by start (readers: every op). */
  pthread_rwlock_t lreg_lock;
  vrb_pins_t pins; /* what this context has registered, against its budget */
  vrb_lreg_t *lregs;
  size_t n_lregs, cap_lregs;
  vrb_rcache_t *rcache;
  /* rdmacm (cm.c): the target's listener and its channel, or NULL. */
  struct rdma_event_channel *cm_ch;
  struct rdma_cm_id *cm_listen;
  struct ibv_context **cm_devs; /* rdma_get_devices(): dev is one of them */
  uint16_t cm_port;
  int ev_fd; /* epoll over the receive channel and cm_ch: ctx->tp_fd */
  /* The receive side: who may poll rcq (the control thread, or a user in
   * hixl_notif_poll), which QP 0 belongs to which peer, and whether rcq's
   * completion channel is armed (only while no user polls notifications). */
  pthread_mutex_t recv_lock;
  struct vrb_rmap {
    uint32_t qpn;
    hixl_peer_t *peer;
    int64_t retired_ns; /* 0: live; else its QP was taken down then (see rmap_retire) */
  } * rmap;
  size_t n_rmap, cap_rmap;
  _Atomic uint64_t user_polls; /* bumped by every hixl_notif_poll */
  uint64_t seen_polls;         /* control thread: the count at its last look */
  int64_t user_active_ns;      /* control thread: when it last saw it move */
  bool rcq_armed;
  /* The bounce pool, one per context (VRB_BOUNCE_COUNT x VRB_BOUNCE_SIZE,
   * pinned once), for local buffers outside any region: bounce_lock guards
   * its free list and the QPs whose queue stopped for want of a buffer
   * (bw_head..bw_tail, FIFO), which completions restart as buffers come
   * back (hixl__vrb_progress).  A leaf lock, taken under vp->lock. */
  pthread_mutex_t bounce_lock;
  uint8_t *bounce;
  struct ibv_mr *bounce_mr;
  int bounce_free[VRB_BOUNCE_COUNT], n_bounce_free;
  struct vrb_qp *bw_head, *bw_tail;
  _Atomic int n_bounce_waiting;
  /* The QP budget (HIXL_VERBS_MAX_QPS): QPs of this context, at most. */
  int max_qps;
  _Atomic int n_qps;
  _Atomic int n_lazy_qps; /* of those, lazy pairs' (reclaimable once idle) */
  /* Lazy QPs (lazy.c): peers with set-up work for the set-up thread, a
   * FIFO under work_lock (taken under ctx->lock by serve, never the other
   * way round), which work_cond signals; the thread is started with the
   * first set-up.  lazy: new outbound peers get their QPs on first use. */
  pthread_mutex_t work_lock;
  pthread_cond_t work_cond, turn_cond;
  pthread_t worker;
  bool worker_on, worker_stop;
  vrb_peer_t *busy_vp; /* the peer whose turn runs now (turn_cond: it ended) */
  vrb_fifo_t work;     /* peers whose turn is due, linked by work_next */
  bool lazy;
  /* Reclaim (lazy.c): lazy pairs whose QPs are ready, the candidates
   * (work_lock); reclaims under way; the use clock (a pair's last_use is
   * the clock's value at its last use, and the clock moves on at every
   * reclaim: least recently used to that resolution, with no clock read on
   * the fast path); pairs reclaimed so far (a figure). */
  bool reclaim; /* HIXL_VERBS_RECLAIM */
  vrb_peer_t *lru_head;
  int n_reclaiming;
  int reclaiming_qps; /* the victims' QPs: room on its way */
  /* Pairs waiting for room, in the order they first found none (ours, and
   * peers told QP_WAIT): a pair may take freed room only when what the
   * pairs ahead of it need is left over, so room a reclaim frees goes to
   * the oldest waiter, not to whichever asks first (work_lock). */
  vrb_fifo_t room;        /* linked by room_next */
  uint64_t reclaim_epoch; /* bumped as each reclaim ends (taken back or not) */
  int64_t wake_ns;        /* the set-up thread's: look again by then (0: in 50 ms) */
  _Atomic uint64_t use_clock;
  _Atomic uint64_t n_reclaimed;
  /* A peer's requests for QPs are served at most VRB_SETUP_BURST at once,
   * then one per setup_ival_ns (HIXL_VERBS_SETUP_INTERVAL_MS; 0: no
   * limit): each makes QPs and may take back other pairs' (lazy.c,
   * accept_req).  Requests told to wait for it (a figure). */
  int64_t setup_ival_ns;
  _Atomic uint64_t n_setups_limited;
  /* Receive completions that found a peer's notification ring full: kept
   * (their buffers not reposted, which throttles senders through RNR) and
   * retried at the next tick, in order.  The peer is the one the QP map
   * named when the completion came, so that one stays deliverable after
   * its QP is gone (reclaimed); peer_close takes a peer's out. */
  struct vrb_over {
    struct ibv_wc wc;
    hixl_peer_t *peer;
  } overflow[VRB_SRQ_DEPTH];
  int n_overflow;
} vrb_ctx_t;

typedef struct vrb_qp vrb_qp_t;

/* A work request as the send path describes it before posting: copied into
 * the software queue when the send queue has no room. */
typedef struct vrb_op {
  hixl_req_t *req;
  vrb_rent_t *rent; /* registration-cache entry, held until retired */
  void *local;
  uint64_t raddr;
  uint64_t cmp, swap;
  uint32_t len, lkey, rkey, imm;
  uint8_t opcode; /* enum ibv_wr_opcode */
  uint8_t kind;   /* VRB_WR_* */
  bool inl;
  bool dev; /* local is device memory: a bounce is filled / emptied by the runtime */
  struct vrb_op *next;
  /* Inline payload, taken at the call: a notification SEND's {imm, len}, or
   * a small put's bytes, so the caller may reuse its buffer at once even
   * when the op waits in the software queue. */
  uint8_t data[VRB_INLINE];
} vrb_op_t;

/* A posted work request, retired when its (or a later) completion arrives. */
typedef struct vrb_wqe {
  vrb_qp_t *q;
  hixl_req_t *req;
  vrb_rent_t *rent;
  void *copy_dst; /* a get through a bounce buffer: copy here when done */
  uint32_t len;
  int16_t bounce;
  uint8_t kind;
  bool dev; /* copy_dst is device memory */
} vrb_wqe_t;

struct vrb_qp {
  struct ibv_qp *qp;        /* NULL until rdmacm created it */
  struct rdma_cm_id *cm_id; /* rdmacm: the QP's id, else NULL */
  bool ready;               /* connected: requests may be posted (vp->lock) */
  vrb_peer_t *vp;
  uint32_t index;
  /* Under vp->lock: posted, retired, posted since the last signaled one. */
  uint32_t head, tail, since_signal;
  vrb_op_t *pend_head, *pend_tail; /* the software queue, FIFO */
  uint32_t n_pend;
  uint64_t *amo;          /* VRB_SQ_DEPTH atomic result words (vp->amo_mr) */
  struct vrb_qp *bw_next; /* in vc's bounce waiters (vc->bounce_lock) */
  bool bw_waiting;
  /* VRB_SQ_DEPTH descriptors (10 KiB): made with the QPs the first time
   * (qps_count), so that a lazy pair that never moves data has none, and
   * kept until the peer is freed (a completion of QPs taken down may still
   * sit in the shared CQ, naming one by its wr_id). */
  vrb_wqe_t *wqe;
};

struct vrb_peer {
  hixl_peer_t *peer;
  int nq;
  int scq;                          /* index of the send CQ its QPs use */
  int cq_reserved;                  /* QPs counted on that CQ */
  uint64_t cm_cookie;               /* rdmacm target side: names this peer in requests */
  struct rdma_event_channel *cm_ch; /* rdmacm initiator side */
  vrb_qp_t *qps[VRB_MAX_QPS];
  pthread_mutex_t lock; /* rings, software queues */
  _Atomic uint32_t rr;  /* round robin over the QPs */
  int qps_counted;      /* QPs counted in vc->n_qps (the budget) */
  uint64_t *amo;
  struct ibv_mr *amo_mr;
  vrb_op_t *op_free;       /* spare software-queue nodes */
  _Atomic int outstanding; /* posted and queued, not yet retired */
  /* Lazy QPs (lazy.c).  qs: VQ_*, moved by the set-up thread, except
   * NONE -> WANT by whoever first queues an op.  on_work, work_next, n_in
   * and in under vc->work_lock; the rest is the set-up thread's. */
  bool lazy;
  _Atomic int qs;
  bool on_work;        /* in vc's work list */
  uint64_t pass;       /* the set-up thread's pass that last took it */
  int64_t reaccept_ns; /* when we last made QPs again for a repeated request */
  int64_t setup_tat;   /* the peer's set-up rate for its requests (lazy.c: rate_ok) */
  int64_t quiesce_tat; /* ... and for its QP_QUIESCEs we honoured */
  vrb_peer_t *work_next;
  uint32_t psn;      /* our QPs' first PSN */
  uint64_t gen;      /* the request the QPs being made belong to */
  uint64_t next_gen; /* our next QP_REQ's */
  int64_t since_ns;  /* when the state last moved (the set-up deadline) */
  int n_in;          /* peer messages waiting for the control thread */
  /* Reclaim.  last_use: vc->use_clock at the last op or notification;
   * under work_lock: on the LRU list (QPs ready), picked as a victim; the
   * set-up thread's own: the reclaim epoch when we asked for room for our
   * QPs (0: not asked), not to try again before retry_ns, QP_WAITs
   * answered in this set-up, since when it waits for room (0: it does not). */
  _Atomic uint64_t last_use;
  bool on_lru, victim;
  vrb_peer_t *lru_prev, *lru_next;
  uint64_t room_epoch;
  int64_t retry_ns, room_since_ns;
  int n_waits;
  bool wait_limited; /* a QP_WAIT of this set-up was the peer's set-up rate, not its budget */
  bool self_limited; /* this set-up waits for the peer's quiesce rate (lazy.c: step) */
  bool victim_late;  /* QUIESCING past its deadline (no longer counted) */
  /* In vc's room queue (work_lock) since room_first_ns; told QP_WAIT (the
   * peer asks again) last at room_told_ns: a peer that stops asking, or
   * has waited its whole deadline, leaves the queue. */
  bool in_room_q, room_remote;
  vrb_peer_t *room_next;
  int64_t room_told_ns, room_first_ns;
  struct vrb_in {
    uint32_t kind, qpn[VRB_MAX_QPS], psn, mtu;
    uint64_t lid, gen, status;
    uint8_t gid[16];
    char why[160];
  } in[4];
};
/* QUIESCING: we reclaim the pair's QPs (sent QP_QUIESCE, wait for
 * QP_RELEASED); DRAINING: the other side does, and we wait for what we
 * posted to complete.  Ops called meanwhile are queued, as before READY,
 * and make new QPs once the old ones are gone. */
enum { VQ_NONE, VQ_WANT, VQ_REQ_SENT, VQ_ACCEPTED, VQ_READY, VQ_QUIESCING, VQ_DRAINING };

static inline vrb_ctx_t *hixl__vc(hixl_ctx_t *ctx) { return ctx->tp[HIXL_TP_VERBS]; }

/* vp was used now (the reclaim's LRU, lazy.c): the use clock's value, two
 * relaxed accesses, the clock's line written only at reclaims. */
static inline void hixl__vrb_used(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  atomic_store_explicit(&vp->last_use, atomic_load_explicit(&vc->use_clock, memory_order_relaxed),
                        memory_order_relaxed);
}

/* verbs.c */
hixl_status_t hixl__vrb_err(hixl_status_t st, const char *what, int rc);
/* A registration that failed (errno set): NOMEM, with what, the size, the
 * NIC, strerror and, for ENOMEM / EPERM / EAGAIN, the RLIMIT_MEMLOCK hint. */
hixl_status_t hixl__vrb_reg_err(const vrb_ctx_t *vc, const char *what, const void *addr,
                                size_t len);
/* lkey of a hixl region holding [p, p+len), or 0. */
uint32_t hixl__vrb_region_lkey(vrb_ctx_t *vc, const void *p, size_t len);

/* post.c */
hixl_status_t hixl__vrb_put(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                            uint64_t off, hixl_req_t *req);
hixl_status_t hixl__vrb_get(hixl_peer_t *peer, void *dst, size_t len, hixl_rmr_t *rmr, uint64_t off,
                            hixl_req_t *req);
hixl_status_t hixl__vrb_put_imm(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                                uint64_t off, uint32_t imm, hixl_req_t *req);
hixl_status_t hixl__vrb_notify(hixl_peer_t *peer, uint32_t imm, uint64_t len, hixl_req_t *req);
hixl_status_t hixl__vrb_batch(hixl_peer_t *peer, const hixl_xfer_t *xfers, size_t n, bool is_put,
                              const uint32_t *imm, uint64_t total, hixl_req_t *req);
hixl_status_t hixl__vrb_atomic(hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off, int op, uint64_t a,
                               uint64_t b, uint64_t *old_p, hixl_req_t *req);
int hixl__vrb_progress(hixl_ctx_t *ctx);
/* Peer going away: fail its software queues, wait (bounded) for the flush of
 * its QPs (already in ERROR), then retire whatever is left as PEER_LOST.
 * false: some never flushed (their completions may still come: keep vp). */
bool hixl__vrb_drain_peer(vrb_peer_t *vp);

/* The attributes every QP of vp is created with; the inline size a new QP
 * was granted; the ACK timeout exponent (HIXL_VERBS_TIMEOUT). */
struct ibv_qp_init_attr hixl__vrb_qp_attr(const vrb_ctx_t *vc, const vrb_peer_t *vp);
void hixl__vrb_note_inline(vrb_ctx_t *vc, uint32_t granted);
uint8_t hixl__vrb_ack_timeout(void);

/* Notifications arriving on qpn are the peer's (its QP 0); 0 on failure. */
bool hixl__vrb_rmap_add(vrb_ctx_t *vc, uint32_t qpn, hixl_peer_t *peer);

/* A QP just connected (rdmacm, lazy): post what waited for it. */
void hixl__vrb_qp_ready(vrb_qp_t *q);
/* Fail what waits in vp's software queues with st (vp->lock NOT held). */
void hixl__vrb_fail_queued(vrb_peer_t *vp, hixl_status_t st);

/* A peer's QPs: made (counted in the budget, CQ room, atomic results, QPs
 * in RESET, QP 0 in the receive map), and taken down again (none posted;
 * the map keeps QP 0's number retired for a while: see rmap_retire). */
hixl_status_t hixl__vrb_qps_make(vrb_peer_t *vp);
void hixl__vrb_qps_unmake(vrb_peer_t *vp);
/* INIT -> RTR -> RTS of vp's QPs against the peer's qpn[] (psn: ours). */
hixl_status_t hixl__vrb_qps_rts(vrb_ctx_t *vc, vrb_peer_t *vp, const uint32_t *qpn, uint32_t rpsn,
                                enum ibv_mtu rmtu, uint16_t rlid, const uint8_t rgid[16]);

/* Take every receive completion there is now into the notification rings
 * (a reclaimed pair's last ones, before its QPs go). */
void hixl__vrb_recv_drain(hixl_ctx_t *ctx);
/* Post nothing more on vp's QPs (ops queue, as before they were ready);
 * idle_only: only if nothing is posted or queued (else false, no change). */
bool hixl__vrb_qps_stop(vrb_peer_t *vp, bool idle_only);
/* Posted and not yet retired on vp's QPs (vp->lock NOT held). */
uint32_t hixl__vrb_posted(vrb_peer_t *vp);

/* The blob of a bind or QP message: our GID, then the QPNs of QPs 1.. */
void hixl__vrb_local_blob(const vrb_ctx_t *vc, const vrb_peer_t *vp, hixl_msg_t *m);

/* lazy.c */
extern const hixl_tp_msg_t hixl__vrb_msgs[];
/* An op was queued on a QP that is not ready: start the set-up if none is. */
void hixl__vrb_want(vrb_peer_t *vp);
/* vp goes away: out of the work list (ctx->lock held). */
void hixl__vrb_lazy_forget(vrb_peer_t *vp);
/* QPs the pairs waiting for room ahead of vp need (all of them when vp
 * waits for none): vp may take room only past those. */
int hixl__vrb_room_ahead(vrb_ctx_t *vc, vrb_peer_t *vp);
/* ctx_fini: stop the set-up thread (no peer left). */
void hixl__vrb_lazy_fini(vrb_ctx_t *vc);

/* cm.c (built with librdmacm) */
hixl_status_t hixl__vrb_cm_init(hixl_ctx_t *ctx, vrb_ctx_t *vc);
void hixl__vrb_cm_fini(vrb_ctx_t *vc);
/* Initiator: connect vp's QPs to the listener in the VERBS_QP_REPLY r. */
hixl_status_t hixl__vrb_cm_connect(hixl_peer_t *peer, vrb_peer_t *vp, const hixl_msg_t *r,
                                   int64_t deadline);
/* Target: connection requests and establishments (control thread). */
void hixl__vrb_cm_events(hixl_ctx_t *ctx);

/* rcache.c */
/* NULL when the cache cannot be kept safe here (no userfaultfd). */
vrb_rcache_t *hixl__vrb_rcache_new(struct ibv_pd *pd, vrb_pins_t *pins);
/* hixl__vrb_pin_try, after dropping the cache's idle entries (least
 * recently used first) when that makes enough room; none dropped when it
 * would not. */
int hixl__vrb_rcache_pin(vrb_rcache_t *rc, uint64_t bytes);
void hixl__vrb_rcache_free(vrb_rcache_t *rc);
/* A cache entry covering [p, p+len) with a reference for the caller, or NULL
 * (use bounce buffers).  *lkey_p: its local key. */
vrb_rent_t *hixl__vrb_rcache_get(vrb_rcache_t *rc, const void *p, size_t len, uint32_t *lkey_p);
/* Another reference on an entry the caller holds. */
void hixl__vrb_rcache_ref(vrb_rent_t *e);
void hixl__vrb_rcache_put(vrb_rent_t *e);
/* Its figures for hixl_ctx_stats: hits, misses, evictions (the oldest idle
 * entries dropped to stay under HIXL_VERBS_RCACHE_MAX), invalidations
 * (entries dropped because their memory was unmapped or remapped), and the
 * bytes it keeps registered now.  All zero for rc NULL. */
void hixl__vrb_rcache_stats(vrb_rcache_t *rc, uint64_t out[5]);

#endif

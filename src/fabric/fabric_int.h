/* SPDX-License-Identifier: MIT */
/*
 * Inside the libfabric transport.  Two parts:
 *
 *   fabric.c  provider choice, the domain / endpoint / CQ / AV, regions,
 *             peers (bound over the control connection), remote keys, the
 *             ops table;
 *   post.c    the data path: RMA writes and reads, notification messages,
 *             atomics (native or executed by the owner), completions, the
 *             progress thread that keeps manual-progress providers one-sided.
 */
#ifndef HIXL_FABRIC_INT_H
#define HIXL_FABRIC_INT_H

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "../core/provider.h"

#define HIXL_TP_FABRIC 3 /* the wire id (transport.c names it) */
extern const hixl_transport_ops_t hixl__fabric_ops;

/* The bind (TP_BIND / TP_BIND_REPLY) as fabric reads it: str[0] the
 * provider (the reply: or why not), blob the endpoint name (fi_getname);
 * the request's ctx_id: the initiator's context id; rxm_buf: the sender's
 * rxm buffer size (0: not rxm, or a hixl that did not send it). */
typedef HIXL_MSG_VIEW(p0, p1, p2, ctx_id, rxm_buf, q2, q3, q4) fab_bind_msg_t;

/* libfabric is loaded at run time (fab_lib_load in fabric.c), not linked:
 * Debian's libfabric links PSM's libinfinipath, whose constructor installs
 * a SIGINT handler that calls exit(1) -- linked, it ran before main() in
 * every program using hixl and took Ctrl-C (a Python KeyboardInterrupt, a
 * C program's SIG_IGN) away.  Loaded here, with the process's signal
 * handlers put back after the load.  These are the only entry points hixl
 * calls; everything else in libfabric is reached through fid ops tables. */
typedef struct {
  int (*getinfo)(uint32_t version, const char *node, const char *service, uint64_t flags,
                 const struct fi_info *hints, struct fi_info **info);
  void (*freeinfo)(struct fi_info *info);
  struct fi_info *(*dupinfo)(const struct fi_info *info);
  int (*fabric)(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
  const char *(*strerror)(int errnum);
} hixl_fab_lib_t;
extern hixl_fab_lib_t hixl__fab_lib;
#define fi_getinfo hixl__fab_lib.getinfo
#define fi_freeinfo hixl__fab_lib.freeinfo
#define fi_dupinfo hixl__fab_lib.dupinfo
#define fi_fabric hixl__fab_lib.fabric
#define fi_strerror hixl__fab_lib.strerror
#define fi_allocinfo() hixl__fab_lib.dupinfo(NULL)

#define FAB_VERSION FI_VERSION(1, 14)
#define FAB_ADDR_MAX HIXL_WIRE_BLOB /* endpoint names travel in a blob */
#define FAB_RECV_COUNT 256          /* posted notification receives */
#define FAB_MSG_SIZE 32             /* one notification message */
#define FAB_MSG_MAGIC 0x4e4c5848u   /* "HXLN" */
#define FAB_CQ_SIZE 8192

/* A notification on the wire (little-endian). */
typedef struct fab_msg {
  uint32_t magic;
  uint32_t imm;
  uint64_t len;
  uint64_t sender; /* the sender's context id: informational, never trusted */
  uint64_t cookie; /* the receiver's secret for this peer (FABRIC_BIND): checked */
} fab_msg_t;
_Static_assert(sizeof(fab_msg_t) == FAB_MSG_SIZE, "notification message size");

/* A registered region as fabric peers address it. */
typedef struct fab_mr {
  struct fid_mr *mr;
  uint64_t key;
  uint64_t base; /* remote address of byte 0: its address (FI_MR_VIRT_ADDR), else 0 */
  void *desc;    /* fi_mr_desc, for FI_MR_LOCAL */
  bool remote;   /* exposed to peers (access != 0): its key may be handed out */
} fab_mr_t;

/* Local regions (for FI_MR_LOCAL providers: their descriptors). */
typedef struct fab_lreg {
  uintptr_t start, end;
  void *desc;
} fab_lreg_t;

typedef struct fab_ctx {
  hixl_ctx_t *ctx;
  struct fi_info *info;
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_ep *ep;
  struct fid_av *av;
  struct fid_cq *cq; /* sends, RMA and receives */
  char prov[64];
  uint32_t rxm_buf; /* rxm's buffer size (eager limit); 0: not an rxm provider */
  uint8_t addr[FAB_ADDR_MAX];
  size_t addrlen;
  uint64_t mr_mode;
  bool virt_addr, prov_key, mr_local, mr_endpoint;
  bool ordered;      /* msg_order has SAW and SAS: notifications need no waiting */
  bool atomics;      /* native 64-bit FAA and CAS */
  bool manual;       /* data progress is manual (the progress thread drives it) */
  bool dc;           /* FI_DELIVERY_COMPLETE (else a read follows each put) */
  bool source;       /* FI_SOURCE: completions name the sender's fi_addr */
  uint64_t tx_flags; /* FI_COMPLETION, + FI_DELIVERY_COMPLETE */
  size_t max_msg;
  /* Notification receives. */
  uint8_t *rbufs;
  struct fid_mr *rbufs_mr;
  struct fi_context2 rctx[FAB_RECV_COUNT];
  /* Completions are read and handled under poll_lock, so notifications of a
   * peer enter its ring in the order they arrived. */
  pthread_mutex_t poll_lock;
  int wait_fd;      /* the CQ's wait fd, or -1 (then the progress thread naps) */
  bool wait_covers; /* it signals all work, a peer's too (else the thread naps) */
  pthread_t thread;
  bool thread_started;
  /* Bumped by every user-driven progress call: while users drive the CQ the
   * progress thread stays out of their way (see hixl__fab_thread). */
  _Atomic uint64_t user_polls;
  _Atomic uint64_t finished; /* operations finished (posting after EAGAIN waits for it) */
  /* Peers bound (smap entries): with none, users' progress calls skip the
   * provider (a poll of the tcp provider costs microseconds of system
   * calls, in every notification wait of a context that talks shm only);
   * the progress thread still reaps what a closed peer left in flight. */
  _Atomic int n_bound;
  _Atomic bool stop;
  /* Operation contexts: a free list (no malloc on the fast path). */
  pthread_mutex_t op_lock;
  struct fab_op *op_free;
  struct fab_op **op_chunks;
  size_t n_op_chunks;
  /* Regions for FI_MR_LOCAL. */
  pthread_rwlock_t lreg_lock;
  fab_lreg_t *lregs;
  size_t n_lregs, cap_lregs;
  /* Bound peers, for incoming notifications (poll_lock): a message is taken
   * only from a peer's fi_addr (FI_SOURCE) and with the cookie we gave it
   * at FABRIC_BIND; anything else is dropped and counted (n_dropped). */
  struct fab_smap {
    fi_addr_t fa;
    uint64_t cookie;
    hixl_peer_t *peer;
  } * smap;
  size_t n_smap, cap_smap;
  uint64_t n_dropped;
  /* Notifications that found their ring full: kept in arrival order and
   * retried; past FAB_PEND_MAX their receive buffers stay parked (not
   * reposted), so the provider holds back what comes next. */
#define FAB_PEND_MAX (FAB_RECV_COUNT * 16)
  struct fab_pend {
    fab_msg_t m;
    fi_addr_t src;
  } pend[FAB_PEND_MAX];
  int n_pend;
  int parked[FAB_RECV_COUNT];
  fi_addr_t parked_src[FAB_RECV_COUNT]; /* by receive buffer */
  int n_parked;
  /* Peer records closed while operations to them were in flight (a
   * stopped target past the drain): freed by their last completion, or
   * here at context destroy once the endpoint is closed. */
  pthread_mutex_t orphan_lock;
  struct fab_peer *orphans;
} fab_ctx_t;

typedef struct fab_peer {
  hixl_peer_t *peer;
  fi_addr_t fa;
  uint64_t tx_cookie; /* the peer's secret for us: in every notification we send */
  uint64_t rx_cookie; /* ours for it: its notifications must carry it */
  /* Operations posted and not completed, plus FAB_PEER_OPEN until
   * fab_peer_close: whoever takes the count to 0 (the close, or the last
   * completion after it) frees the record.  Read it with fab_inflight. */
  _Atomic int outstanding;
  struct fab_peer *orphan_next, **orphan_prev; /* closed with operations in flight */
} fab_peer_t;

#define FAB_PEER_OPEN (1 << 30)

static inline int fab_inflight(fab_peer_t *fp)
{
  return atomic_load(&fp->outstanding) & ~FAB_PEER_OPEN;
}

/* The last reference to a closed peer record is gone: unlink and free it. */
void hixl__fab_orphan_free(fab_ctx_t *fc, fab_peer_t *fp);

enum { FAB_OP_WRITE, FAB_OP_READ, FAB_OP_SEND, FAB_OP_AMO };

/* One posted operation; its fi_context2 is what completions hand back. */
typedef struct fab_op {
  struct fi_context2 fctx; /* first: the completion's op_context points here */
  int kind;
  hixl_req_t *req;
  fab_peer_t *fp;
  struct fid_mr *tmp_mr; /* a local buffer registered for this op only */
  uint8_t *bounce;       /* device memory staged through host memory */
  void *dev_dst;         /* a get into device memory: copy the bounce there */
  size_t len;
  uint64_t result; /* atomics' old value */
  uint64_t operand, compare;
  fab_msg_t msg; /* a notification's payload */
  struct fab_op *next;
} fab_op_t;

static inline fab_ctx_t *hixl__fc(hixl_ctx_t *ctx) { return ctx->tp[HIXL_TP_FABRIC]; }

/* fabric.c */
hixl_status_t hixl__fab_err(hixl_status_t st, const char *what, ssize_t rc);
/* The descriptor of a hixl region holding [p, p+len), or NULL. */
void *hixl__fab_region_desc(fab_ctx_t *fc, const void *p, size_t len);
/* The bound peer that sent a message from src (FI_ADDR_NOTAVAIL without
 * FI_SOURCE) carrying cookie, or NULL (poll_lock). */
hixl_peer_t *hixl__fab_sender(fab_ctx_t *fc, fi_addr_t src, uint64_t cookie);
/* 64 random bits (getrandom). */
uint64_t hixl__fab_rand64(void);
/* fi_mr_reg with an unguessable key: the provider's (FI_MR_PROV_KEY) or a
 * random one (retried on a collision); bound and enabled for FI_MR_ENDPOINT. */
int hixl__fab_mr_reg(fab_ctx_t *fc, void *buf, size_t len, uint64_t access, struct fid_mr **mr_p);

/* post.c */
hixl_status_t hixl__fab_put(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                            uint64_t off, hixl_req_t *req);
hixl_status_t hixl__fab_get(hixl_peer_t *peer, void *dst, size_t len, hixl_rmr_t *rmr, uint64_t off,
                            hixl_req_t *req);
hixl_status_t hixl__fab_put_imm(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                                uint64_t off, uint32_t imm, hixl_req_t *req);
hixl_status_t hixl__fab_notify(hixl_peer_t *peer, uint32_t imm, uint64_t len, hixl_req_t *req);
hixl_status_t hixl__fab_atomic(hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off, int op, uint64_t a,
                               uint64_t b, uint64_t *old_p, hixl_req_t *req);
int hixl__fab_progress(hixl_ctx_t *ctx);
hixl_status_t hixl__fab_post_recvs(fab_ctx_t *fc);
void *hixl__fab_thread(void *arg);
void hixl__fab_ops_free(fab_ctx_t *fc);
/* Wait (bounded) until the peer has nothing in flight. */
bool hixl__fab_drain_peer(fab_peer_t *fp);

/* A notification from no bound peer: counted here and in the context's
 * "notifications_dropped" (hixl_ctx_stats). */
static inline void fab_dropped(fab_ctx_t *fc)
{
  fc->n_dropped++;
  atomic_fetch_add_explicit(&fc->ctx->cnt.notif_dropped, 1, memory_order_relaxed);
}

#endif

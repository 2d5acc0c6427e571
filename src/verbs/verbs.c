/* SPDX-License-Identifier: MIT */
/*
 * The verbs transport: RC queue pairs over libibverbs (rdma-core), for RoCE,
 * InfiniBand and Soft-RoCE.
 *
 * Per context: one device port (HIXL_NET_DEV / cfg.net_dev names an RDMA
 * device or a netdev; else the first ACTIVE port), one PD, one send CQ polled
 * by hixl_progress, and for the target side one SRQ with its receive CQ on a
 * completion channel that the control thread watches (so a target that never
 * calls hixl still turns incoming immediates into notifications).
 *
 * Per peer: one RC QP, connected in the handshake (VERBS_QP over the control
 * connection: QPN, PSN, GID, LID, MTU; the path MTU is the smaller of both),
 * a table of send work-request slots (the send-queue depth) and a registered
 * bounce pool for local buffers that are not inside a registered region.
 *
 * Operations: put = RDMA WRITE (inline when small), get = RDMA READ,
 * put_imm = WRITE_WITH_IMM when it is one work request (else writes and a
 * notification SEND), notify = a 16-byte inline SEND {imm, len}, atomics =
 * ATOMIC_FETCH_AND_ADD / CMP_AND_SWP into a per-slot result word.  RC
 * executes a QP's requests in order at the target, so a SEND or
 * WRITE_WITH_IMM is seen after the writes before it.  HIXL_OP_ORDERED is
 * handled by the core (it waits for earlier requests).
 *
 * Every ibv_* return is normalised in vrb_err() (positive errno or -1 with
 * errno, depending on the call).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/hixl_int.h"

#define VRB_SQ_DEPTH 256
#define VRB_SRQ_DEPTH 512
#define VRB_RECV_SIZE 64
#define VRB_BOUNCE_SIZE 65536
#define VRB_BOUNCE_COUNT 32
#define VRB_CQ_DEPTH 8192
#define VRB_INLINE 64
#define VRB_NOTIF_RING 65536

enum { VRB_WR_PUT, VRB_WR_GET, VRB_WR_AMO, VRB_WR_SEND };

typedef struct vrb_ctx {
  struct ibv_context *dev;
  struct ibv_pd *pd;
  struct ibv_cq *scq;
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
  bool atomic_be; /* atomic results arrive big-endian (some HCAs) */
  char name[64];
  /* Receive completions that found a peer's notification ring full: kept
   * (their buffers not reposted, which throttles senders through RNR) and
   * retried at the next tick, in order. */
  struct ibv_wc overflow[VRB_SRQ_DEPTH];
  int n_overflow;
} vrb_ctx_t;

typedef struct vrb_peer vrb_peer_t;
typedef struct vrb_wr {
  vrb_peer_t *vp;
  hixl_req_t *req;
  int kind;
  int bounce;     /* bounce slot or -1 */
  void *copy_dst; /* get through a bounce: copy here at completion */
  size_t len;
} vrb_wr_t;

struct vrb_peer {
  hixl_peer_t *peer;
  struct ibv_qp *qp;
  pthread_mutex_t lock; /* slots, bounce pool, posting */
  vrb_wr_t wrs[VRB_SQ_DEPTH];
  int wr_free[VRB_SQ_DEPTH], n_wr_free;
  uint8_t *bounce;
  struct ibv_mr *bounce_mr;
  int bounce_free[VRB_BOUNCE_COUNT], n_bounce_free;
  uint64_t *amo; /* one result word per slot */
  struct ibv_mr *amo_mr;
  _Atomic int outstanding;
};

static vrb_ctx_t *VC(hixl_ctx_t *ctx) { return ctx->tp[HIXL_TP_VERBS]; }

/* The one place ibverbs errors become hixl errors. */
static hixl_status_t vrb_err(hixl_status_t st, const char *what, int rc)
{
  int e = rc > 0 ? rc : errno;
  return hixl__err(st, "verbs: %s: %s", what, strerror(e ? e : EIO));
}

/* ------------------------------------------------------------ device */

static bool port_active(struct ibv_context *dev, uint8_t port, struct ibv_port_attr *pa)
{
  return ibv_query_port(dev, port, pa) == 0 && pa->state == IBV_PORT_ACTIVE;
}

/* RoCEv2 IPv4 GID first (what crosses routers), then RoCEv2, then any. */
static int pick_gid(struct ibv_context *dev, uint8_t port, int table_len, unsigned ifindex)
{
  const char *e = getenv("HIXL_GID_INDEX");
  if (e && *e)
    return atoi(e);
  int best = -1, best_score = -1;
  for (int i = 0; i < table_len; i++) {
    struct ibv_gid_entry ge;
    if (ibv_query_gid_ex(dev, port, (uint32_t)i, &ge, 0) != 0)
      continue;
    if (ifindex && ge.ndev_ifindex != ifindex)
      continue;
    bool v2 = ge.gid_type == IBV_GID_TYPE_ROCE_V2;
    bool v4 = ge.gid.raw[10] == 0xff && ge.gid.raw[11] == 0xff &&
              memcmp(ge.gid.raw, "\0\0\0\0\0\0\0\0\0\0", 10) == 0;
    int score = (v2 ? 2 : 0) + (v4 ? 1 : 0);
    if (ge.gid_type == IBV_GID_TYPE_IB)
      score = 3; /* InfiniBand: the port's GID */
    if (score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return best < 0 ? 0 : best;
}

static hixl_status_t open_device(hixl_ctx_t *ctx, vrb_ctx_t *vc)
{
  const char *want = ctx->cfg.net_dev ? ctx->cfg.net_dev : getenv("HIXL_NET_DEV");
  unsigned ifindex = want ? if_nametoindex(want) : 0; /* a netdev name? */
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  if (list == NULL || n == 0) {
    if (list)
      ibv_free_device_list(list);
    return hixl__err(HIXL_ERR_NO_DEVICE, "verbs: no RDMA device");
  }
  hixl_status_t st = HIXL_ERR_NO_DEVICE;
  for (int i = 0; i < n && vc->dev == NULL; i++) {
    if (want && !ifindex && strcmp(ibv_get_device_name(list[i]), want) != 0)
      continue;
    struct ibv_context *dev = ibv_open_device(list[i]);
    if (dev == NULL)
      continue;
    struct ibv_device_attr da;
    if (ibv_query_device(dev, &da) != 0) {
      ibv_close_device(dev);
      continue;
    }
    for (uint8_t p = 1; p <= da.phys_port_cnt; p++) {
      struct ibv_port_attr pa;
      if (!port_active(dev, p, &pa))
        continue;
      int gi = pick_gid(dev, p, pa.gid_tbl_len, ifindex);
      struct ibv_gid_entry ge;
      if (ifindex && (ibv_query_gid_ex(dev, p, (uint32_t)gi, &ge, 0) != 0 ||
                      ge.ndev_ifindex != ifindex))
        continue;
      vc->dev = dev;
      vc->port = p;
      vc->gid_index = gi;
      vc->lid = pa.lid;
      vc->mtu = pa.active_mtu;
      ibv_query_gid(dev, p, gi, &vc->gid);
      snprintf(vc->name, sizeof(vc->name), "%s:%u", ibv_get_device_name(list[i]), p);
      /* ConnectX-3 (mlx4) returns atomic results big-endian. */
      vc->atomic_be = strncmp(ibv_get_device_name(list[i]), "mlx4", 4) == 0;
      st = HIXL_OK;
      break;
    }
    if (vc->dev == NULL)
      ibv_close_device(dev);
  }
  ibv_free_device_list(list);
  if (st != HIXL_OK)
    return hixl__err(HIXL_ERR_NO_DEVICE, "verbs: no active port%s%s", want ? " on " : "",
                     want ? want : "");
  return HIXL_OK;
}

static void post_recv(vrb_ctx_t *vc, uint32_t i)
{
  struct ibv_sge sge = {(uintptr_t)(vc->rbufs + (size_t)i * VRB_RECV_SIZE), VRB_RECV_SIZE,
                        vc->rbufs_mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
  int rc = ibv_post_srq_recv(vc->srq, &wr, &bad);
  if (rc)
    hixl_warn("verbs: post_srq_recv: %s", strerror(rc));
}

static void vrb_ctx_fini(hixl_ctx_t *ctx)
{
  vrb_ctx_t *vc = VC(ctx);
  if (vc == NULL)
    return;
  if (vc->srq)
    ibv_destroy_srq(vc->srq);
  if (vc->rbufs_mr)
    ibv_dereg_mr(vc->rbufs_mr);
  free(vc->rbufs);
  if (vc->rcq)
    ibv_destroy_cq(vc->rcq);
  if (vc->rch)
    ibv_destroy_comp_channel(vc->rch);
  if (vc->scq)
    ibv_destroy_cq(vc->scq);
  if (vc->pd)
    ibv_dealloc_pd(vc->pd);
  if (vc->dev)
    ibv_close_device(vc->dev);
  free(vc);
  ctx->tp[HIXL_TP_VERBS] = NULL;
  ctx->tp_fd[HIXL_TP_VERBS] = -1;
}

static hixl_status_t vrb_ctx_init(hixl_ctx_t *ctx)
{
  vrb_ctx_t *vc = calloc(1, sizeof(*vc));
  if (vc == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "verbs: no memory");
  ctx->tp[HIXL_TP_VERBS] = vc;
  hixl_status_t st = open_device(ctx, vc);
  if (st != HIXL_OK)
    goto fail;
  vc->pd = ibv_alloc_pd(vc->dev);
  vc->scq = vc->pd ? ibv_create_cq(vc->dev, VRB_CQ_DEPTH, NULL, NULL, 0) : NULL;
  vc->rch = vc->scq ? ibv_create_comp_channel(vc->dev) : NULL;
  vc->rcq = vc->rch ? ibv_create_cq(vc->dev, VRB_CQ_DEPTH, NULL, vc->rch, 0) : NULL;
  struct ibv_srq_init_attr sa = {.attr = {.max_wr = VRB_SRQ_DEPTH, .max_sge = 1}};
  vc->srq = vc->rcq ? ibv_create_srq(vc->pd, &sa) : NULL;
  vc->rbufs = calloc(VRB_SRQ_DEPTH, VRB_RECV_SIZE);
  vc->rbufs_mr = vc->srq && vc->rbufs ? ibv_reg_mr(vc->pd, vc->rbufs,
                                                   VRB_SRQ_DEPTH * VRB_RECV_SIZE,
                                                   IBV_ACCESS_LOCAL_WRITE)
                                      : NULL;
  if (vc->rbufs_mr == NULL) {
    st = vrb_err(HIXL_ERR_NO_DEVICE, "setting up PD, CQs and SRQ", 0);
    goto fail;
  }
  for (uint32_t i = 0; i < VRB_SRQ_DEPTH; i++)
    post_recv(vc, i);
  ibv_req_notify_cq(vc->rcq, 0);
  /* Non-blocking: the control thread also ticks this without an event. */
  fcntl(vc->rch->fd, F_SETFL, fcntl(vc->rch->fd, F_GETFL) | O_NONBLOCK);
  ctx->tp_fd[HIXL_TP_VERBS] = vc->rch->fd;
  hixl_info("verbs: %s gid index %d mtu %d", vc->name, vc->gid_index, 128 << vc->mtu);
  return HIXL_OK;
fail:
  vrb_ctx_fini(ctx);
  return st;
}

/* ------------------------------------------------------------ regions */

static hixl_status_t vrb_mr_reg(hixl_mr_t *mr)
{
  vrb_ctx_t *vc = VC(mr->ctx);
  int acc = IBV_ACCESS_LOCAL_WRITE;
  if (mr->access & HIXL_ACCESS_READ)
    acc |= IBV_ACCESS_REMOTE_READ;
  if (mr->access & HIXL_ACCESS_WRITE)
    acc |= IBV_ACCESS_REMOTE_WRITE;
  if (mr->access & HIXL_ACCESS_ATOMIC)
    acc |= IBV_ACCESS_REMOTE_ATOMIC;
  struct ibv_mr *m = ibv_reg_mr(vc->pd, mr->addr, mr->len, acc);
  if (m == NULL)
    return vrb_err(HIXL_ERR_NOMEM, "ibv_reg_mr", 0);
  mr->tp[HIXL_TP_VERBS] = m;
  return HIXL_OK;
}

static void vrb_mr_dereg(hixl_mr_t *mr)
{
  if (mr->tp[HIXL_TP_VERBS])
    ibv_dereg_mr(mr->tp[HIXL_TP_VERBS]);
  mr->tp[HIXL_TP_VERBS] = NULL;
}

uint32_t hixl__verbs_mr_rkey(const hixl_mr_t *mr)
{
  const struct ibv_mr *m = mr->tp[HIXL_TP_VERBS];
  return m ? m->rkey : 0;
}

/* lkey of a registered region holding [p, p+len), or 0. */
static uint32_t local_lkey(hixl_ctx_t *ctx, const void *p, size_t len)
{
  uint32_t lkey = 0;
  pthread_mutex_lock(&ctx->reg_lock);
  for (hixl_mr_t *m = ctx->mrs; m; m = m->next)
    if (m->tp[HIXL_TP_VERBS] && (const uint8_t *)p >= (uint8_t *)m->addr &&
        (const uint8_t *)p + len <= (uint8_t *)m->addr + m->len) {
      lkey = ((struct ibv_mr *)m->tp[HIXL_TP_VERBS])->lkey;
      break;
    }
  pthread_mutex_unlock(&ctx->reg_lock);
  return lkey;
}

/* ------------------------------------------------------------ peers */

static bool vrb_usable(hixl_ctx_t *ctx, const hixl_msg_t *hello)
{
  (void)hello; /* the core checked that both sides have verbs ready */
  return VC(ctx) != NULL;
}

static void vp_free(vrb_peer_t *vp)
{
  if (vp == NULL)
    return;
  if (vp->qp)
    ibv_destroy_qp(vp->qp);
  if (vp->bounce_mr)
    ibv_dereg_mr(vp->bounce_mr);
  if (vp->amo_mr)
    ibv_dereg_mr(vp->amo_mr);
  free(vp->bounce);
  free(vp->amo);
  pthread_mutex_destroy(&vp->lock);
  free(vp);
}

static vrb_peer_t *vp_new(hixl_peer_t *peer)
{
  vrb_ctx_t *vc = VC(peer->ctx);
  vrb_peer_t *vp = calloc(1, sizeof(*vp));
  if (vp == NULL)
    return NULL;
  pthread_mutex_init(&vp->lock, NULL);
  vp->peer = peer;
  for (int i = 0; i < VRB_SQ_DEPTH; i++)
    vp->wr_free[vp->n_wr_free++] = VRB_SQ_DEPTH - 1 - i;
  for (int i = 0; i < VRB_BOUNCE_COUNT; i++)
    vp->bounce_free[vp->n_bounce_free++] = VRB_BOUNCE_COUNT - 1 - i;
  vp->bounce = aligned_alloc(4096, (size_t)VRB_BOUNCE_COUNT * VRB_BOUNCE_SIZE);
  vp->amo = aligned_alloc(64, sizeof(uint64_t) * VRB_SQ_DEPTH);
  if (vp->bounce)
    vp->bounce_mr = ibv_reg_mr(vc->pd, vp->bounce, (size_t)VRB_BOUNCE_COUNT * VRB_BOUNCE_SIZE,
                               IBV_ACCESS_LOCAL_WRITE);
  if (vp->amo)
    vp->amo_mr = ibv_reg_mr(vc->pd, vp->amo, sizeof(uint64_t) * VRB_SQ_DEPTH,
                            IBV_ACCESS_LOCAL_WRITE);
  struct ibv_qp_init_attr qa = {
      .send_cq = vc->scq, .recv_cq = vc->rcq, .srq = vc->srq, .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = VRB_SQ_DEPTH, .max_send_sge = 1, .max_inline_data = VRB_INLINE}};
  if (vp->bounce_mr && vp->amo_mr)
    vp->qp = ibv_create_qp(vc->pd, &qa);
  if (vp->qp == NULL) {
    vrb_err(HIXL_ERR_NOMEM, "creating a QP and its buffers", 0);
    vp_free(vp);
    return NULL;
  }
  vc->max_inline = qa.cap.max_inline_data;
  return vp;
}

static void local_info(vrb_ctx_t *vc, vrb_peer_t *vp, hixl_msg_t *m, uint32_t psn)
{
  m->u32[0] = vp->qp->qp_num;
  m->u32[1] = psn;
  m->u32[2] = (uint32_t)vc->mtu;
  m->u64[0] = vc->lid;
  memcpy(m->blob, vc->gid.raw, 16);
  m->blob_len = 16;
}

/* INIT -> RTR -> RTS against the peer's QP. */
static hixl_status_t qp_connect(vrb_ctx_t *vc, vrb_peer_t *vp, const hixl_msg_t *r,
                                uint32_t my_psn)
{
  if (r->blob_len != 16 || r->u32[2] < IBV_MTU_256 || r->u32[2] > IBV_MTU_4096)
    return hixl__err(HIXL_ERR_TRANSPORT, "verbs: malformed QP information from the peer");
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = vc->port,
                          .qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                                             IBV_ACCESS_REMOTE_ATOMIC};
  int rc = ibv_modify_qp(vp->qp, &a,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc)
    return vrb_err(HIXL_ERR_TRANSPORT, "QP to INIT", rc);
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  /* Path MTU: the smaller of both active MTUs. */
  a.path_mtu = vc->mtu < (enum ibv_mtu)r->u32[2] ? vc->mtu : (enum ibv_mtu)r->u32[2];
  a.dest_qp_num = r->u32[0];
  a.rq_psn = r->u32[1];
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = vc->port;
  a.ah_attr.dlid = (uint16_t)r->u64[0];
  a.ah_attr.is_global = 1;
  memcpy(a.ah_attr.grh.dgid.raw, r->blob, 16);
  a.ah_attr.grh.sgid_index = (uint8_t)vc->gid_index;
  a.ah_attr.grh.hop_limit = 64;
  rc = ibv_modify_qp(vp->qp, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc)
    return vrb_err(HIXL_ERR_TRANSPORT, "QP to RTR", rc);
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = my_psn;
  /* Local ACK timeout 4.096 us * 2^t per try, 7 tries, then the peer is
   * lost.  Default 17 (0.5 s a try): generous enough for Soft-RoCE under
   * emulation; real fabrics usually run 14.  HIXL_VERBS_TIMEOUT overrides. */
  const char *to = getenv("HIXL_VERBS_TIMEOUT");
  a.timeout = (uint8_t)(to && atoi(to) > 0 && atoi(to) < 32 ? atoi(to) : 17);
  a.retry_cnt = 7;
  a.rnr_retry = 7; /* receiver not ready: retry forever (throttles notifications) */
  a.max_rd_atomic = 16;
  rc = ibv_modify_qp(vp->qp, &a,
                     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc)
    return vrb_err(HIXL_ERR_TRANSPORT, "QP to RTS", rc);
  return HIXL_OK;
}

static hixl_status_t attach_peer(hixl_peer_t *peer, vrb_peer_t *vp)
{
  peer->inbox = aligned_alloc(HIXL_CACHELINE, hixl_ring_bytes(VRB_NOTIF_RING));
  if (peer->inbox == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "verbs: no memory for the notification ring");
  hixl_ring_init(peer->inbox, VRB_NOTIF_RING);
  peer->tp = vp;
  return HIXL_OK;
}

static hixl_status_t vrb_connect(hixl_peer_t *peer, const hixl_msg_t *ack, int64_t deadline)
{
  (void)ack;
  vrb_ctx_t *vc = VC(peer->ctx);
  vrb_peer_t *vp = vp_new(peer);
  if (vp == NULL)
    return HIXL_ERR_NOMEM;
  uint32_t psn = (uint32_t)hixl__random64() & 0xffffff;
  hixl_msg_t m = {.type = HIXL_MSG_VERBS_QP}, r;
  local_info(vc, vp, &m, psn);
  m.u64[1] = peer->ctx->id;
  hixl_status_t st = hixl__send(peer, &m, NULL, 0);
  if (st == HIXL_OK)
    st = hixl__recv_sync(peer->fd, &r, NULL, 0, deadline, peer->name);
  if (st == HIXL_OK && (r.type != HIXL_MSG_VERBS_QP_REPLY || r.status != HIXL_OK))
    st = hixl__err(HIXL_ERR_TRANSPORT, "verbs: %s refused our QP (%s)", peer->name,
                   hixl_strerror(r.status));
  if (st == HIXL_OK)
    st = qp_connect(vc, vp, &r, psn);
  if (st == HIXL_OK)
    st = attach_peer(peer, vp);
  if (st != HIXL_OK)
    vp_free(vp);
  return st;
}

static void vrb_accept(hixl_peer_t *peer, const hixl_msg_t *m, hixl_msg_t *out)
{
  vrb_ctx_t *vc = VC(peer->ctx);
  memset(out, 0, sizeof(*out));
  out->type = HIXL_MSG_VERBS_QP_REPLY;
  vrb_peer_t *vp = vp_new(peer);
  uint32_t psn = (uint32_t)hixl__random64() & 0xffffff;
  hixl_status_t st = vp ? qp_connect(vc, vp, m, psn) : HIXL_ERR_NOMEM;
  if (st == HIXL_OK)
    st = attach_peer(peer, vp);
  out->status = st;
  if (st != HIXL_OK) {
    vp_free(vp);
    hixl_warn("verbs: cannot accept %s: %s", peer->name, hixl_last_error());
    return;
  }
  local_info(vc, vp, out, psn);
}

static int vrb_progress(hixl_ctx_t *ctx);

static void vrb_peer_close(hixl_peer_t *peer)
{
  vrb_peer_t *vp = peer->tp;
  if (vp) {
    /* Flush what is in flight (the QP in ERROR completes it all) before the
     * slots those completions point at go away. */
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    ibv_modify_qp(vp->qp, &a, IBV_QP_STATE);
    int64_t deadline = hixl__deadline(2000);
    unsigned it = 0;
    while (atomic_load(&vp->outstanding) > 0 && !hixl__expired(deadline)) {
      vrb_progress(peer->ctx);
      hixl__backoff(&it);
    }
    if (atomic_load(&vp->outstanding) > 0)
      hixl_warn("verbs: %d work requests to %s never completed; leaking their slots",
                atomic_load(&vp->outstanding), peer->name);
    else
      vp_free(vp);
  }
  peer->tp = NULL;
  free(peer->inbox);
  peer->inbox = NULL;
}

/* ------------------------------------------------------------ remote keys */

static hixl_status_t vrb_rmr_attach(hixl_rmr_t *r, int64_t deadline)
{
  hixl_msg_t m = {.type = HIXL_MSG_VERBS_MR}, reply;
  m.u32[0] = r->slot;
  m.u32[1] = r->access;
  m.u32[2] = r->flags;
  m.u64[0] = r->rkey;
  m.u64[1] = r->base;
  m.u64[2] = r->len;
  hixl_status_t st = hixl__call(r->peer, &m, HIXL_MSG_VERBS_MR_REPLY, &reply, NULL, deadline);
  if (st == HIXL_ERR_NOT_REGISTERED)
    return hixl__err(st, "hixl_rmr_unpack: peer %s has no live region matching the blob "
                     "(forged or stale key)", r->peer->name);
  if (st != HIXL_OK)
    return st;
  r->tp_rkey = reply.u32[0];
  return HIXL_OK;
}

static void vrb_rmr_detach(hixl_rmr_t *r) { (void)r; }

static bool vrb_rmr_live(const hixl_rmr_t *r) { return !atomic_load(&r->gone); }

/* ------------------------------------------------------------ posting */

/* Take a send slot (and a bounce buffer when asked), waiting for
 * completions when all are in use.  Returns the slot or -1 (peer lost). */
static int take_slot(vrb_peer_t *vp, bool bounce, int *bounce_p)
{
  unsigned it = 0;
  for (;;) {
    pthread_mutex_lock(&vp->lock);
    if (vp->n_wr_free > 0 && (!bounce || vp->n_bounce_free > 0)) {
      int i = vp->wr_free[--vp->n_wr_free];
      *bounce_p = bounce ? vp->bounce_free[--vp->n_bounce_free] : -1;
      pthread_mutex_unlock(&vp->lock);
      return i;
    }
    pthread_mutex_unlock(&vp->lock);
    if (atomic_load(&vp->peer->state) != HIXL_PEER_UP)
      return -1;
    vrb_progress(vp->peer->ctx);
    hixl__backoff(&it);
  }
}

static void put_slot(vrb_peer_t *vp, int i)
{
  pthread_mutex_lock(&vp->lock);
  if (vp->wrs[i].bounce >= 0)
    vp->bounce_free[vp->n_bounce_free++] = vp->wrs[i].bounce;
  vp->wr_free[vp->n_wr_free++] = i;
  pthread_mutex_unlock(&vp->lock);
}

/* Post one work request of req; on failure nothing is left in flight. */
static hixl_status_t post(vrb_peer_t *vp, int slot, struct ibv_send_wr *wr, hixl_req_t *req)
{
  wr->wr_id = (uintptr_t)&vp->wrs[slot];
  wr->send_flags |= IBV_SEND_SIGNALED;
  hixl__req_part_add(req);
  atomic_fetch_add(&vp->outstanding, 1);
  struct ibv_send_wr *bad;
  int rc = ibv_post_send(vp->qp, wr, &bad);
  if (rc) {
    atomic_fetch_sub(&vp->outstanding, 1);
    put_slot(vp, slot);
    hixl__req_part_done(req, HIXL_OK); /* undo the part (the caller reports) */
    return vrb_err(HIXL_ERR_TRANSPORT, "ibv_post_send", rc);
  }
  return HIXL_OK;
}

/* One RDMA WRITE/READ (or WRITE_WITH_IMM).  lkey: of the registered region
 * holding local (looked up once by the caller), or 0: through a bounce
 * buffer, so len is then at most VRB_BOUNCE_SIZE. */
static hixl_status_t rdma_one(hixl_peer_t *peer, bool write, void *local, size_t len,
                              uint32_t lkey, hixl_rmr_t *rmr, uint64_t off, const uint32_t *imm,
                              hixl_req_t *req)
{
  vrb_peer_t *vp = peer->tp;
  vrb_ctx_t *vc = VC(peer->ctx);
  bool inl = write && len <= vc->max_inline;
  bool bounce = !inl && lkey == 0;
  int b = -1;
  int slot = take_slot(vp, bounce, &b);
  if (slot < 0)
    return hixl__err(HIXL_ERR_PEER_LOST, "verbs: peer %s lost", peer->name);
  vrb_wr_t *w = &vp->wrs[slot];
  *w = (vrb_wr_t){.vp = vp, .req = req, .kind = write ? VRB_WR_PUT : VRB_WR_GET, .bounce = b};
  struct ibv_sge sge = {(uintptr_t)local, (uint32_t)len, lkey};
  if (bounce) {
    uint8_t *buf = vp->bounce + (size_t)b * VRB_BOUNCE_SIZE;
    if (write)
      memcpy(buf, local, len);
    else
      w->copy_dst = local, w->len = len;
    sge.addr = (uintptr_t)buf;
    sge.lkey = vp->bounce_mr->lkey;
  }
  struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1};
  wr.opcode = write ? (imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE) : IBV_WR_RDMA_READ;
  if (imm)
    wr.imm_data = htonl(*imm);
  if (inl)
    wr.send_flags = IBV_SEND_INLINE;
  wr.wr.rdma.remote_addr = rmr->base + off;
  wr.wr.rdma.rkey = rmr->tp_rkey;
  return post(vp, slot, &wr, req);
}

static hixl_status_t rdma(hixl_peer_t *peer, bool write, void *local, size_t len, hixl_rmr_t *rmr,
                          uint64_t off, hixl_req_t *req)
{
  /* Registered local memory goes in one request; anything else in bounce-
   * sized pieces.  After the first piece is posted a failure is reported
   * through the request, so the call itself never half-fails. */
  uint32_t lkey = local_lkey(peer->ctx, local, len);
  size_t step = lkey ? len : VRB_BOUNCE_SIZE;
  if (write && len <= VC(peer->ctx)->max_inline)
    step = len;
  for (size_t done = 0; done < len;) {
    size_t n = len - done < step ? len - done : step;
    hixl_status_t st = rdma_one(peer, write, (uint8_t *)local + done, n, lkey, rmr, off + done,
                                NULL, req);
    if (st != HIXL_OK) {
      if (done == 0)
        return st;
      hixl__req_part_add(req);
      hixl__req_part_done(req, st);
      return HIXL_OK;
    }
    done += n;
  }
  return HIXL_OK;
}

static hixl_status_t vrb_put(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                             uint64_t off, hixl_req_t *req)
{
  return rdma(peer, true, (void *)(uintptr_t)src, len, rmr, off, req);
}

static hixl_status_t vrb_get(hixl_peer_t *peer, void *dst, size_t len, hixl_rmr_t *rmr,
                             uint64_t off, hixl_req_t *req)
{
  return rdma(peer, false, dst, len, rmr, off, req);
}

static hixl_status_t vrb_notify(hixl_peer_t *peer, uint32_t imm, uint64_t len, hixl_req_t *req)
{
  vrb_peer_t *vp = peer->tp;
  int b;
  int slot = take_slot(vp, false, &b);
  if (slot < 0)
    return hixl__err(HIXL_ERR_PEER_LOST, "verbs: peer %s lost", peer->name);
  vp->wrs[slot] = (vrb_wr_t){.vp = vp, .req = req, .kind = VRB_WR_SEND, .bounce = -1};
  uint8_t msg[16];
  uint32_t imm_le = htole32(imm);
  uint64_t len_le = htole64(len);
  memcpy(msg, &imm_le, 4);
  memset(msg + 4, 0, 4);
  memcpy(msg + 8, &len_le, 8);
  struct ibv_sge sge = {(uintptr_t)msg, sizeof(msg), 0};
  struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_INLINE};
  return post(vp, slot, &wr, req);
}

static hixl_status_t vrb_put_imm(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                                 uint64_t off, uint32_t imm, hixl_req_t *req)
{
  /* One work request: WRITE_WITH_IMM (the target gets imm and the length
   * from its receive completion).  Larger unregistered puts: the pieces,
   * then a notification SEND carrying the total length. */
  uint32_t lkey = local_lkey(peer->ctx, src, len);
  if (len <= VRB_BOUNCE_SIZE || lkey != 0)
    return rdma_one(peer, true, (void *)(uintptr_t)src, len, lkey, rmr, off, &imm, req);
  hixl_status_t st = vrb_put(peer, src, len, rmr, off, req);
  return st == HIXL_OK ? vrb_notify(peer, imm, len, req) : st;
}

static hixl_status_t vrb_atomic(hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off, int op,
                                uint64_t a, uint64_t b, uint64_t *old_p, hixl_req_t *req)
{
  (void)old_p;
  if (req == NULL)
    return HIXL_INPROGRESS;
  vrb_peer_t *vp = peer->tp;
  int bb;
  int slot = take_slot(vp, false, &bb);
  if (slot < 0)
    return hixl__err(HIXL_ERR_PEER_LOST, "verbs: peer %s lost", peer->name);
  vp->wrs[slot] = (vrb_wr_t){.vp = vp, .req = req, .kind = VRB_WR_AMO, .bounce = -1};
  struct ibv_sge sge = {(uintptr_t)&vp->amo[slot], 8, vp->amo_mr->lkey};
  struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1};
  wr.opcode = op == HIXL_AMO_FAA ? IBV_WR_ATOMIC_FETCH_AND_ADD : IBV_WR_ATOMIC_CMP_AND_SWP;
  wr.wr.atomic.remote_addr = rmr->base + off;
  wr.wr.atomic.rkey = rmr->tp_rkey;
  wr.wr.atomic.compare_add = a;
  wr.wr.atomic.swap = b;
  hixl_status_t st = post(vp, slot, &wr, req);
  return st == HIXL_OK ? HIXL_INPROGRESS : st;
}

/* ------------------------------------------------------------ completions */

static hixl_status_t wc_status(const struct ibv_wc *wc, hixl_peer_t *peer)
{
  if (wc->status == IBV_WC_SUCCESS)
    return HIXL_OK;
  hixl_status_t st = wc->status == IBV_WC_RETRY_EXC_ERR || wc->status == IBV_WC_RNR_RETRY_EXC_ERR ||
                             wc->status == IBV_WC_WR_FLUSH_ERR
                         ? HIXL_ERR_PEER_LOST
                     : wc->status == IBV_WC_REM_ACCESS_ERR ? HIXL_ERR_ACCESS
                                                           : HIXL_ERR_TRANSPORT;
  hixl__err(st, "verbs: work request to %s failed: %s", peer->name,
            ibv_wc_status_str(wc->status));
  char why[96];
  snprintf(why, sizeof(why), "work request failed: %s", ibv_wc_status_str(wc->status));
  hixl__peer_lost_async(peer, why); /* the QP is in error now */
  return st;
}

static int vrb_progress(hixl_ctx_t *ctx)
{
  vrb_ctx_t *vc = VC(ctx);
  if (vc == NULL)
    return 0;
  struct ibv_wc wcs[32];
  int total = 0, n;
  while ((n = ibv_poll_cq(vc->scq, 32, wcs)) > 0) {
    for (int i = 0; i < n; i++) {
      vrb_wr_t *w = (vrb_wr_t *)(uintptr_t)wcs[i].wr_id;
      vrb_peer_t *vp = w->vp;
      hixl_req_t *req = w->req;
      hixl_status_t st = wc_status(&wcs[i], vp->peer);
      if (st == HIXL_OK && w->kind == VRB_WR_GET && w->copy_dst)
        memcpy(w->copy_dst, vp->bounce + (size_t)w->bounce * VRB_BOUNCE_SIZE, w->len);
      if (st == HIXL_OK && w->kind == VRB_WR_AMO && req->old_p) {
        uint64_t v = vp->amo[w - vp->wrs];
        *req->old_p = vc->atomic_be ? be64toh(v) : v;
      }
      if (w->kind == VRB_WR_AMO)
        req->old_p = NULL; /* written above; complete must not overwrite it */
      put_slot(vp, (int)(w - vp->wrs));
      atomic_fetch_sub(&vp->outstanding, 1);
      hixl__req_part_done(req, st);
    }
    total += n;
  }
  return total;
}

/* Target side: receive completions -> notifications (control thread). */
static bool deliver(hixl_ctx_t *ctx, vrb_ctx_t *vc, const struct ibv_wc *wc)
{
  hixl_peer_t *p;
  for (p = ctx->peers; p; p = p->next)
    if (p->ops == &hixl__verbs_ops && p->tp && ((vrb_peer_t *)p->tp)->qp->qp_num == wc->qp_num)
      break;
  if (p == NULL || wc->status != IBV_WC_SUCCESS)
    return true; /* gone, or a flushed receive: nothing to deliver */
  uint32_t imm;
  uint64_t len;
  if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    imm = ntohl(wc->imm_data);
    len = wc->byte_len;
  } else {
    const uint8_t *b = vc->rbufs + wc->wr_id * VRB_RECV_SIZE;
    uint32_t v32;
    uint64_t v64;
    memcpy(&v32, b, 4);
    memcpy(&v64, b + 8, 8);
    imm = le32toh(v32);
    len = le64toh(v64);
  }
  return hixl_ring_push(p->inbox, imm, len);
}

static void vrb_on_event(hixl_ctx_t *ctx)
{
  vrb_ctx_t *vc = VC(ctx);
  struct ibv_cq *cq;
  void *cq_ctx;
  if (ibv_get_cq_event(vc->rch, &cq, &cq_ctx) == 0)
    ibv_ack_cq_events(cq, 1);
  ibv_req_notify_cq(vc->rcq, 0);
  pthread_mutex_lock(&ctx->lock);
  /* Older ones first: per peer, order is kept. */
  int k = 0;
  while (k < vc->n_overflow && deliver(ctx, vc, &vc->overflow[k])) {
    post_recv(vc, (uint32_t)vc->overflow[k].wr_id);
    k++;
  }
  memmove(vc->overflow, vc->overflow + k, sizeof(vc->overflow[0]) * (size_t)(vc->n_overflow - k));
  vc->n_overflow -= k;
  struct ibv_wc wcs[32];
  int n;
  while ((n = ibv_poll_cq(vc->rcq, 32, wcs)) > 0)
    for (int i = 0; i < n; i++) {
      if (vc->n_overflow == 0 && deliver(ctx, vc, &wcs[i]))
        post_recv(vc, (uint32_t)wcs[i].wr_id);
      else if (vc->n_overflow < VRB_SRQ_DEPTH)
        vc->overflow[vc->n_overflow++] = wcs[i];
    }
  pthread_mutex_unlock(&ctx->lock);
}

const hixl_transport_ops_t hixl__verbs_ops = {
    .size = sizeof(hixl_transport_ops_t),
    .name = "verbs",
    .id = HIXL_TP_VERBS,
    .async = true,
    .needs_bind = true,
    .ctx_init = vrb_ctx_init,
    .ctx_fini = vrb_ctx_fini,
    .mr_reg = vrb_mr_reg,
    .mr_dereg = vrb_mr_dereg,
    .usable = vrb_usable,
    .connect = vrb_connect,
    .accept = vrb_accept,
    .peer_close = vrb_peer_close,
    .rmr_attach = vrb_rmr_attach,
    .rmr_detach = vrb_rmr_detach,
    .rmr_live = vrb_rmr_live,
    .put = vrb_put,
    .get = vrb_get,
    .put_imm = vrb_put_imm,
    .notify = vrb_notify,
    .atomic = vrb_atomic,
    .progress = vrb_progress,
    .on_event = vrb_on_event,
};

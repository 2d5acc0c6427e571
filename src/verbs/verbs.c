/* SPDX-License-Identifier: MIT */
/*
 * The verbs transport: RC queue pairs over libibverbs (rdma-core), for RoCE,
 * InfiniBand and Soft-RoCE.  This file: device and port, the context, local
 * regions, peers and their QPs, the receive side, the ops table.  The send
 * path is post.c, the registration cache rcache.c (see verbs_int.h).
 *
 * Per context: one device port (HIXL_NET_DEV / cfg.net_dev names an RDMA
 * device or a netdev; else the first ACTIVE port), one PD, one send CQ polled
 * by hixl_progress (with a completion channel for the progress thread's event
 * mode), and for the target side one SRQ with its receive CQ on a completion
 * channel that the control thread watches (so a target that never calls hixl
 * still turns incoming immediates into notifications).
 *
 * Per peer: HIXL_VERBS_QPS RC QPs (default 1, the initiator's choice),
 * made on first use (lazy.c) or, with HIXL_VERBS_LAZY=0, connected in the
 * handshake (VERBS_QP over the control connection: QPNs, PSN, GID, LID,
 * MTU; the path MTU is the smaller of both), a registered
 * bounce pool for small local buffers outside any region, and one atomic
 * result word per send slot.
 *
 * Every ibv_* return is normalised in hixl__vrb_err() (positive errno or -1
 * with errno, depending on the call).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "verbs_int.h"

static vrb_ctx_t *VC(hixl_ctx_t *ctx) { return hixl__vc(ctx); }

/* The one place ibverbs errors become hixl errors. */
hixl_status_t hixl__vrb_err(hixl_status_t st, const char *what, int rc)
{
  int e = rc > 0 ? rc : errno;
  return hixl__err(st, "verbs: %s: %s", what, strerror(e ? e : EIO));
}

hixl_status_t hixl__vrb_reg_err(const vrb_ctx_t *vc, const char *what, const void *addr, size_t len)
{
  int e = errno ? errno : EIO;
  /* ENOMEM is what the kernel's pinning returns over RLIMIT_MEMLOCK (and
   * some providers EPERM or EAGAIN): say the limit and the fix. */
  char hint[640] = "";
  if (e == ENOMEM || e == EPERM || e == EAGAIN)
    hixl__memlock_hint(hint, sizeof(hint), len);
  return hixl__err(HIXL_ERR_NOMEM, "verbs: %s: ibv_reg_mr of %zu KiB at %p on %s failed: %s%s%s",
                   what, (len + 1023) / 1024, addr, vc->name, strerror(e), hint[0] ? ". " : "",
                   hint);
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
      if (ifindex &&
          (ibv_query_gid_ex(dev, p, (uint32_t)gi, &ge, 0) != 0 || ge.ndev_ifindex != ifindex))
        continue;
      vc->dev = dev;
      vc->port = p;
      vc->gid_index = gi;
      vc->lid = pa.lid;
      vc->max_cqe = da.max_cqe;
      vc->max_qps = da.max_qp;
      vc->pins.dev_max_mrs = da.max_mr > 0 ? (uint32_t)da.max_mr : UINT32_MAX;
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
  hixl__vrb_lazy_fini(vc);
  hixl__vrb_rcache_free(vc->rcache);
#ifdef HIXL_HAVE_RDMACM
  hixl__vrb_cm_fini(vc);
#endif
  if (vc->ev_fd >= 0)
    close(vc->ev_fd);
  if (vc->srq)
    ibv_destroy_srq(vc->srq);
  if (vc->rbufs_mr)
    ibv_dereg_mr(vc->rbufs_mr);
  free(vc->rbufs);
  if (vc->bounce_mr)
    ibv_dereg_mr(vc->bounce_mr);
  free(vc->bounce);
  if (vc->rcq)
    ibv_destroy_cq(vc->rcq);
  if (vc->rch)
    ibv_destroy_comp_channel(vc->rch);
  for (int i = 0; i < atomic_load(&vc->n_scqs); i++)
    ibv_destroy_cq(vc->scqs[i].cq);
  if (vc->sch)
    ibv_destroy_comp_channel(vc->sch);
  if (vc->pd)
    ibv_dealloc_pd(vc->pd);
#ifdef HIXL_HAVE_RDMACM
  if (vc->cm_devs)
    rdma_free_devices(vc->cm_devs); /* dev is librdmacm's */
  else
#endif
      if (vc->dev)
    ibv_close_device(vc->dev);
  free(vc->lregs);
  free(vc->rmap);
  pthread_mutex_destroy(&vc->recv_lock);
  pthread_mutex_destroy(&vc->work_lock);
  pthread_cond_destroy(&vc->work_cond);
  pthread_cond_destroy(&vc->turn_cond);
  pthread_mutex_destroy(&vc->poll_lock);
  pthread_mutex_destroy(&vc->cq_lock);
  pthread_mutex_destroy(&vc->bounce_lock);
  pthread_rwlock_destroy(&vc->lreg_lock);
  free(vc);
  ctx->tp[HIXL_TP_VERBS] = NULL;
  ctx->tp_fd[HIXL_TP_VERBS] = -1;
}

static hixl_status_t pins_init(vrb_pins_t *p); /* with the regions, below */

static hixl_status_t vrb_ctx_init(hixl_ctx_t *ctx)
{
  vrb_ctx_t *vc = calloc(1, sizeof(*vc));
  if (vc == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "verbs: no memory");
  pthread_mutex_init(&vc->poll_lock, NULL);
  pthread_mutex_init(&vc->cq_lock, NULL);
  pthread_mutex_init(&vc->bounce_lock, NULL);
  pthread_rwlock_init(&vc->lreg_lock, NULL);
  pthread_mutex_init(&vc->recv_lock, NULL);
  pthread_mutex_init(&vc->work_lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* hixl__now_ns's clock */
  pthread_cond_init(&vc->work_cond, &ca);
  pthread_cond_init(&vc->turn_cond, NULL);
  pthread_condattr_destroy(&ca);
  vc->ev_fd = -1;
  ctx->tp[HIXL_TP_VERBS] = vc;
  hixl_status_t st = open_device(ctx, vc);
  if (st != HIXL_OK || (st = pins_init(&vc->pins)) != HIXL_OK)
    goto fail;
#ifdef HIXL_HAVE_RDMACM
  /* rdma_cm ids carry librdmacm's own device contexts, and a QP must be
   * made with a PD of its id's context: use librdmacm's context for our
   * device, so that one PD serves both connection paths. */
  int ndev = 0;
  struct ibv_context **cl = rdma_get_devices(&ndev);
  for (int i = 0; cl && i < ndev; i++)
    if (strcmp(ibv_get_device_name(cl[i]->device), ibv_get_device_name(vc->dev->device)) == 0) {
      ibv_close_device(vc->dev);
      vc->dev = cl[i];
      vc->cm_devs = cl;
      break;
    }
  if (cl && vc->cm_devs == NULL)
    rdma_free_devices(cl);
#endif
  vc->pd = ibv_alloc_pd(vc->dev);
  vc->sch = vc->pd ? ibv_create_comp_channel(vc->dev) : NULL;
  vc->rch = vc->sch ? ibv_create_comp_channel(vc->dev) : NULL;
  vc->rcq = vc->rch ? ibv_create_cq(vc->dev, VRB_CQ_DEPTH, NULL, vc->rch, 0) : NULL;
  struct ibv_srq_init_attr sa = {.attr = {.max_wr = VRB_SRQ_DEPTH, .max_sge = 1}};
  vc->srq = vc->rcq ? ibv_create_srq(vc->pd, &sa) : NULL;
  /* The context's own buffers come first in its registration budget. */
  if ((st = hixl__vrb_pin(&vc->pins, VRB_SRQ_DEPTH * VRB_RECV_SIZE, "the receive buffers")) !=
          HIXL_OK ||
      (st = hixl__vrb_pin(&vc->pins, (uint64_t)VRB_BOUNCE_COUNT * VRB_BOUNCE_SIZE,
                          "the bounce buffers")) != HIXL_OK)
    goto fail;
  vc->rbufs = calloc(VRB_SRQ_DEPTH, VRB_RECV_SIZE);
  errno = 0; /* a provider that fails without setting it: no stale ENOMEM */
  vc->rbufs_mr = vc->srq && vc->rbufs ? ibv_reg_mr(vc->pd, vc->rbufs, VRB_SRQ_DEPTH * VRB_RECV_SIZE,
                                                   IBV_ACCESS_LOCAL_WRITE)
                                      : NULL;
  if (vc->rbufs_mr == NULL) {
    /* NO_DEVICE as ever (verbs is then not offered; the message says why,
     * with the memlock hint when the registration was refused). */
    if (!vc->srq)
      hixl__vrb_err(HIXL_ERR_NO_DEVICE, "setting up PD, CQs and SRQ", 0);
    else if (vc->rbufs)
      hixl__vrb_reg_err(vc, "registering the receive buffers", vc->rbufs,
                        VRB_SRQ_DEPTH * VRB_RECV_SIZE);
    else
      hixl__err(HIXL_ERR_NO_DEVICE, "verbs: no memory for the receive buffers");
    st = HIXL_ERR_NO_DEVICE;
    goto fail;
  }
  /* The bounce pool: one per context, whatever the number of peers (it was
   * one per peer: 2 MiB pinned each, docs/scale.md). */
  vc->bounce = aligned_alloc(4096, (size_t)VRB_BOUNCE_COUNT * VRB_BOUNCE_SIZE);
  errno = 0;
  vc->bounce_mr = vc->bounce
                      ? ibv_reg_mr(vc->pd, vc->bounce, (size_t)VRB_BOUNCE_COUNT * VRB_BOUNCE_SIZE,
                                   IBV_ACCESS_LOCAL_WRITE)
                      : NULL;
  if (vc->bounce_mr == NULL) {
    st = vc->bounce ? hixl__vrb_reg_err(vc, "registering the bounce buffers", vc->bounce,
                                        (size_t)VRB_BOUNCE_COUNT * VRB_BOUNCE_SIZE)
                    : hixl__err(HIXL_ERR_NOMEM, "verbs: no memory for the bounce buffers");
    goto fail;
  }
  for (int i = 0; i < VRB_BOUNCE_COUNT; i++)
    vc->bounce_free[vc->n_bounce_free++] = VRB_BOUNCE_COUNT - 1 - i;
  /* The inline size the device grants, from a QP made and destroyed now:
   * ops are described (inline or through a key) when they are called, and
   * with lazy QPs they may be called before any QP of ours exists. */
  struct ibv_qp_init_attr pa = {
      .send_cq = vc->rcq,
      .recv_cq = vc->rcq,
      .srq = vc->srq,
      .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = VRB_SQ_DEPTH, .max_send_sge = 1, .max_inline_data = VRB_INLINE}};
  struct ibv_qp *probe = ibv_create_qp(vc->pd, &pa);
  if (probe) {
    hixl__vrb_note_inline(vc, pa.cap.max_inline_data);
    ibv_destroy_qp(probe);
  }
  /* The QP budget: the device's own limit unless HIXL_VERBS_MAX_QPS asks
   * for less (a peer costs HIXL_VERBS_QPS of them, on both sides). */
  const char *mq = getenv("HIXL_VERBS_MAX_QPS");
  long max_qps = vc->max_qps > 0 ? vc->max_qps : 1 << 20;
  if (mq && hixl__parse_int(mq, 1, 1 << 24, &max_qps) != 0) {
    st = hixl__err(HIXL_ERR_INVALID, "HIXL_VERBS_MAX_QPS=\"%.32s\": expected 1..16777216", mq);
    goto fail;
  }
  if (vc->max_qps > 0 && max_qps > vc->max_qps)
    max_qps = vc->max_qps;
  vc->max_qps = (int)max_qps;
  for (uint32_t i = 0; i < VRB_SRQ_DEPTH; i++)
    post_recv(vc, i);
  ibv_req_notify_cq(vc->rcq, 0);
  vc->rcq_armed = true;
  /* Non-blocking: the control thread also ticks this without an event; the
   * progress thread polls the send channel's fd before reading it. */
  fcntl(vc->rch->fd, F_SETFL, fcntl(vc->rch->fd, F_GETFL) | O_NONBLOCK);
  fcntl(vc->sch->fd, F_SETFL, fcntl(vc->sch->fd, F_GETFL) | O_NONBLOCK);
#ifdef HIXL_HAVE_RDMACM
  if (hixl__vrb_cm_init(ctx, vc) != HIXL_OK)
    hixl_info("verbs: no rdmacm listener (%s): HIXL_VERBS_CM=rdmacm peers are refused",
              hixl_last_error());
#endif
  /* One fd for the control thread: the receive channel and rdmacm's. */
  vc->ev_fd = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN};
  if (vc->ev_fd < 0 || epoll_ctl(vc->ev_fd, EPOLL_CTL_ADD, vc->rch->fd, &ev) != 0 ||
      (vc->cm_ch && epoll_ctl(vc->ev_fd, EPOLL_CTL_ADD, vc->cm_ch->fd, &ev) != 0)) {
    st = hixl__vrb_err(HIXL_ERR_NO_DEVICE, "epoll for the verbs channels", 0);
    goto fail;
  }
  ctx->tp_fd[HIXL_TP_VERBS] = vc->ev_fd;
  vc->rcache = hixl__vrb_rcache_new(vc->pd, &vc->pins);
  vc->pins.rcache = vc->rcache;
  long chunk = VRB_READ_CHUNK;
  const char *e = getenv("HIXL_VERBS_READ_CHUNK");
  if (e && hixl__parse_int(e, 4096, VRB_MAX_WR_LEN, &chunk) != 0) {
    hixl_warn("ignoring HIXL_VERBS_READ_CHUNK=%s (want 4096..%u)", e, VRB_MAX_WR_LEN);
    chunk = VRB_READ_CHUNK;
  }
  vc->read_chunk = (uint32_t)chunk;
  /* HIXL_VERBS_LAZY: 1 (default) makes an outbound peer's QPs on first
   * use, 0 in the handshake as before (docs/scale.md, "Lazy QPs"). */
  vc->lazy = hixl__env_int("HIXL_VERBS_LAZY", 0, 1, 1) != 0;
  /* HIXL_VERBS_RECLAIM: 1 (default) takes an idle lazy pair's QPs back
   * when the budget is full and another pair needs some; 0 refuses that
   * pair instead (docs/scale.md, "Reclaiming idle QPs"). */
  vc->reclaim = hixl__env_int("HIXL_VERBS_RECLAIM", 0, 1, 1) != 0;
  /* HIXL_VERBS_SETUP_INTERVAL_MS: a peer's requests for QPs beyond a
   * burst are served one per this (default 50 ms; 0: no limit), so that
   * no peer makes us create QPs, or take back other pairs', without
   * bound (lazy.c, accept_req). */
  vc->setup_ival_ns = hixl__env_int("HIXL_VERBS_SETUP_INTERVAL_MS", 0, 3600000, 50) * 1000000LL;
  hixl_info("verbs: %s gid index %d mtu %d, registration cache %s", vc->name, vc->gid_index,
            128 << vc->mtu, vc->rcache ? "on" : "off");
  return HIXL_OK;
fail:
  vrb_ctx_fini(ctx);
  return st;
}

/* Whether vrb_ctx_init would find a device with an active port: open it
 * and close it again (no PD, no CQ, nothing pinned). */
static hixl_status_t vrb_probe(hixl_ctx_t *ctx)
{
  vrb_ctx_t tmp;
  memset(&tmp, 0, sizeof(tmp));
  hixl_status_t st = open_device(ctx, &tmp);
  if (st == HIXL_OK)
    ibv_close_device(tmp.dev);
  return st;
}

/* ------------------------------------------------------------ regions */

/* The registration budget (vrb_pins_t): HIXL_VERBS_MAX_PINNED, bytes, and
 * HIXL_VERBS_MAX_MRS, at most the device's max_mr. */
static hixl_status_t pins_init(vrb_pins_t *p)
{
  long v;
  const char *e = getenv("HIXL_VERBS_MAX_PINNED");
  p->max_bytes = UINT64_MAX;
  if (e && *e) {
    if (hixl__parse_int(e, 1, 1L << 50, &v) != 0)
      return hixl__err(HIXL_ERR_INVALID, "HIXL_VERBS_MAX_PINNED=\"%.32s\": expected bytes, 1..2^50",
                       e);
    p->max_bytes = (uint64_t)v;
  }
  if (p->dev_max_mrs == 0)
    p->dev_max_mrs = UINT32_MAX;
  p->max_mrs = p->dev_max_mrs;
  e = getenv("HIXL_VERBS_MAX_MRS");
  if (e && *e) {
    if (hixl__parse_int(e, 1, 1L << 31, &v) != 0)
      return hixl__err(HIXL_ERR_INVALID, "HIXL_VERBS_MAX_MRS=\"%.32s\": expected 1..2^31", e);
    if ((uint64_t)v < p->max_mrs)
      p->max_mrs = (uint32_t)v;
  }
  return HIXL_OK;
}

int hixl__vrb_pin_try(vrb_pins_t *p, uint64_t bytes)
{
  uint32_t m = atomic_load_explicit(&p->mrs, memory_order_relaxed);
  do {
    if (m >= p->max_mrs)
      return VRB_PIN_MRS;
  } while (!atomic_compare_exchange_weak(&p->mrs, &m, m + 1));
  uint64_t b = atomic_load_explicit(&p->bytes, memory_order_relaxed);
  do {
    if (bytes > p->max_bytes || b > p->max_bytes - bytes) {
      atomic_fetch_sub(&p->mrs, 1);
      return VRB_PIN_BYTES;
    }
  } while (!atomic_compare_exchange_weak(&p->bytes, &b, b + bytes));
  return VRB_PIN_OK;
}

hixl_status_t hixl__vrb_pin(vrb_pins_t *p, uint64_t bytes, const char *what)
{
  /* The cache's idle entries are room held for speed only: they give way
   * to a region or a peer's atomic results. */
  int why = hixl__vrb_pin_try(p, bytes);
  if (why != VRB_PIN_OK && p->rcache)
    why = hixl__vrb_rcache_pin(p->rcache, bytes);
  if (why == VRB_PIN_OK)
    return HIXL_OK;
  uint32_t m = atomic_load(&p->mrs);
  if (why == VRB_PIN_MRS)
    return hixl__err(HIXL_ERR_NOMEM,
                     "verbs: %s: this context has %u memory registrations, its limit (%s%u); "
                     "deregister regions or raise it",
                     what, m,
                     p->max_mrs < p->dev_max_mrs ? "HIXL_VERBS_MAX_MRS=" : "the device's max_mr ",
                     p->max_mrs);
  return hixl__err(HIXL_ERR_NOMEM,
                   "verbs: %s: pinning %llu KiB more would take this context past "
                   "HIXL_VERBS_MAX_PINNED=%llu (%llu KiB pinned now: its own buffers, host "
                   "regions, the registration cache, peers' atomic results)",
                   what, (unsigned long long)(bytes >> 10), (unsigned long long)p->max_bytes,
                   (unsigned long long)(atomic_load(&p->bytes) >> 10));
}

void hixl__vrb_unpin(vrb_pins_t *p, uint64_t bytes)
{
  atomic_fetch_sub(&p->mrs, 1);
  atomic_fetch_sub(&p->bytes, bytes);
}

/* Device memory for the NIC, addressed by its device address (the iova),
 * so that peers and the send path use the same addresses as for host
 * regions: a dmabuf from the runtime (ibv_reg_dmabuf_mr), else the address
 * a peer-memory driver lets ibv_reg_mr pin.  NULL when neither works: the
 * region still serves same-host peers, local use is staged through bounce
 * buffers (post.c), and verbs peers get UNSUPPORTED at unpack. */
static struct ibv_mr *reg_device(vrb_ctx_t *vc, hixl_mr_t *mr, int acc)
{
  struct ibv_mr *m = NULL;
  int fd;
  uint64_t off;
  const char *how = "none";
  if (hixl__dev_dmabuf(mr->addr, mr->len, &fd, &off) == HIXL_OK) {
    m = ibv_reg_dmabuf_mr(vc->pd, off, mr->len, (uint64_t)(uintptr_t)mr->addr, fd, acc);
    close(fd);
    how = "dmabuf";
  }
  void *host = m ? NULL : hixl__dev_nic_addr(mr->addr);
  if (host) {
    m = ibv_reg_mr_iova(vc->pd, host, mr->len, (uint64_t)(uintptr_t)mr->addr, acc);
    how = "peer memory";
  }
  if (m == NULL)
    hixl_info("verbs: device region %p+%zu (device %d) is not reachable by %s (%s%s%s); it is "
              "staged for local use and not offered to verbs peers",
              mr->addr, mr->len, mr->device, vc->name,
              hixl__dev_rdma_allowed() ? "tried: " : "HIXL_DEVICE_RDMA=0",
              hixl__dev_rdma_allowed() ? how : "", hixl__dev_rdma_allowed() ? "" : "");
  else
    hixl_debug("verbs: device region %p+%zu registered through %s", mr->addr, mr->len, how);
  return m;
}

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
  struct ibv_mr *m;
  uint64_t pinned = mr->device >= 0 ? 0 : mr->len; /* device memory pins no host pages */
  hixl_status_t st = hixl__vrb_pin(&vc->pins, pinned, "registering a region");
  if (st != HIXL_OK)
    return st;
  if (mr->device >= 0) {
    m = reg_device(vc, mr, acc);
    if (m == NULL) {
      hixl__vrb_unpin(&vc->pins, 0);
      return HIXL_OK; /* staged locally; verbs peers are told UNSUPPORTED */
    }
  } else if ((errno = 0, m = ibv_reg_mr(vc->pd, mr->addr, mr->len, acc)) == NULL) {
    hixl__vrb_unpin(&vc->pins, pinned);
    return hixl__vrb_reg_err(vc, "registering a region", mr->addr, mr->len);
  }
  /* Into the sorted local-key index the send path searches. */
  pthread_rwlock_wrlock(&vc->lreg_lock);
  if (vc->n_lregs == vc->cap_lregs) {
    size_t cap = vc->cap_lregs ? vc->cap_lregs * 2 : 16;
    vrb_lreg_t *v = realloc(vc->lregs, cap * sizeof(*v));
    if (v == NULL) {
      pthread_rwlock_unlock(&vc->lreg_lock);
      ibv_dereg_mr(m);
      hixl__vrb_unpin(&vc->pins, pinned);
      return hixl__err(HIXL_ERR_NOMEM, "verbs: no memory for the region index");
    }
    vc->lregs = v;
    vc->cap_lregs = cap;
  }
  uintptr_t s = (uintptr_t)mr->addr;
  size_t i = vc->n_lregs;
  while (i > 0 && vc->lregs[i - 1].start > s) {
    vc->lregs[i] = vc->lregs[i - 1];
    i--;
  }
  vc->lregs[i] = (vrb_lreg_t){s, s + mr->len, m->lkey};
  vc->n_lregs++;
  pthread_rwlock_unlock(&vc->lreg_lock);
  mr->tp[HIXL_TP_VERBS] = m;
  return HIXL_OK;
}

static void vrb_mr_dereg(hixl_mr_t *mr)
{
  struct ibv_mr *m = mr->tp[HIXL_TP_VERBS];
  if (m == NULL)
    return;
  vrb_ctx_t *vc = VC(mr->ctx);
  pthread_rwlock_wrlock(&vc->lreg_lock);
  for (size_t i = 0; i < vc->n_lregs; i++)
    if (vc->lregs[i].lkey == m->lkey) {
      memmove(vc->lregs + i, vc->lregs + i + 1, (vc->n_lregs - i - 1) * sizeof(vc->lregs[0]));
      vc->n_lregs--;
      break;
    }
  pthread_rwlock_unlock(&vc->lreg_lock);
  ibv_dereg_mr(m);
  hixl__vrb_unpin(&vc->pins, mr->device < 0 ? mr->len : 0);
  mr->tp[HIXL_TP_VERBS] = NULL;
}

/* A peer's key for mr: its ibv rkey, when mr is registered with the NIC. */
/* hixl_ctx_stats: the registration cache's figures, and what this context
 * has pinned: its host regions, the cache's entries, the bounce pool and
 * the SRQ's receive buffers.  No lock: it may run on the control thread
 * under ctx->lock (a peer's STATS), and the cache's lock is held across
 * ibv_reg_mr. */
static void vrb_stats(hixl_ctx_t *ctx, uint64_t xs[HIXL_XST_N])
{
  vrb_ctx_t *vc = VC(ctx);
  if (vc == NULL)
    return;
  uint64_t rc[5];
  hixl__vrb_rcache_stats(vc->rcache, rc);
  xs[HIXL_XST_RCACHE_HITS] += rc[0];
  xs[HIXL_XST_RCACHE_MISSES] += rc[1];
  xs[HIXL_XST_RCACHE_EVICTIONS] += rc[2];
  xs[HIXL_XST_RCACHE_INVALIDATIONS] += rc[3];
  xs[HIXL_XST_PINNED_BYTES] += atomic_load_explicit(&vc->pins.bytes, memory_order_relaxed);
  xs[HIXL_XST_MRS] += atomic_load_explicit(&vc->pins.mrs, memory_order_relaxed);
  xs[HIXL_XST_QPS] += (uint64_t)atomic_load_explicit(&vc->n_qps, memory_order_relaxed);
  xs[HIXL_XST_QPS_RECLAIMED] += atomic_load_explicit(&vc->n_reclaimed, memory_order_relaxed);
  xs[HIXL_XST_QP_SETUPS_LIMITED] +=
      atomic_load_explicit(&vc->n_setups_limited, memory_order_relaxed);
}

static bool vrb_mr_key(const hixl_mr_t *mr, uint64_t key[2])
{
  const struct ibv_mr *m = mr->tp[HIXL_TP_VERBS];
  if (m == NULL)
    return false;
  key[0] = m->rkey;
  key[1] = 0;
  return true;
}

uint32_t hixl__vrb_region_lkey(vrb_ctx_t *vc, const void *p, size_t len)
{
  uintptr_t a = (uintptr_t)p, e = a + len;
  uint32_t lkey = 0;
  pthread_rwlock_rdlock(&vc->lreg_lock);
  /* The last region starting at or below a, then earlier ones (regions may
   * overlap; a larger one starting earlier can still hold the range). */
  size_t lo = 0, hi = vc->n_lregs;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (vc->lregs[mid].start <= a)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (size_t i = lo; i-- > 0;)
    if (e <= vc->lregs[i].end) {
      lkey = vc->lregs[i].lkey;
      break;
    }
  pthread_rwlock_unlock(&vc->lreg_lock);
  return lkey;
}

/* ------------------------------------------------------------ peers */

static bool vrb_usable(hixl_ctx_t *ctx, const hixl_msg_t *hello)
{
  (void)hello; /* the core checked that both sides have verbs ready */
  return VC(ctx) != NULL;
}

/* Destroy vp's QPs (rdmacm's ids too); nothing is posted on them.  Each
 * QP leaves vp (under vp->lock, where vrb_peer_lost looks) before it is
 * destroyed. */
static void qps_destroy(vrb_peer_t *vp)
{
  for (int i = 0; i < vp->nq; i++) {
    vrb_qp_t *q = vp->qps[i];
    pthread_mutex_lock(&vp->lock);
    struct ibv_qp *qp = q->qp;
    q->qp = NULL;
    q->ready = false;
    pthread_mutex_unlock(&vp->lock);
#ifdef HIXL_HAVE_RDMACM
    if (q->cm_id) {
      if (qp)
        rdma_destroy_qp(q->cm_id);
      rdma_destroy_id(q->cm_id);
      q->cm_id = NULL;
      qp = NULL;
    }
#endif
    if (qp)
      ibv_destroy_qp(qp);
  }
}

/* Give back what hixl__vrb_qps_make / vp_new counted: CQ room, budget. */
static void qps_uncount(vrb_peer_t *vp)
{
  vrb_ctx_t *vc = VC(vp->peer->ctx);
  if (vp->cq_reserved) {
    pthread_mutex_lock(&vc->cq_lock);
    vc->scqs[vp->scq].n_qps -= vp->cq_reserved;
    pthread_mutex_unlock(&vc->cq_lock);
    vp->cq_reserved = 0;
  }
  atomic_fetch_sub(&vc->n_qps, vp->qps_counted);
  if (vp->lazy)
    atomic_fetch_sub(&vc->n_lazy_qps, vp->qps_counted);
  vp->qps_counted = 0;
}

static void rmap_del(vrb_ctx_t *vc, hixl_peer_t *peer);
static void rmap_retire(vrb_ctx_t *vc, hixl_peer_t *peer);

static void vp_free(vrb_peer_t *vp)
{
  if (vp == NULL)
    return;
  /* Out of the receive map first (a failed connect never reaches
   * peer_close, and QPNs are reused). */
  rmap_del(VC(vp->peer->ctx), vp->peer);
  qps_destroy(vp);
  for (int i = 0; i < vp->nq; i++) {
    free(vp->qps[i]->wqe);
    free(vp->qps[i]);
  }
#ifdef HIXL_HAVE_RDMACM
  if (vp->cm_ch)
    rdma_destroy_event_channel(vp->cm_ch);
#endif
  qps_uncount(vp);
  if (vp->amo_mr) {
    hixl__vrb_unpin(&VC(vp->peer->ctx)->pins, vp->amo_mr->length);
    ibv_dereg_mr(vp->amo_mr);
  }
  free(vp->amo);
  while (vp->op_free) {
    vrb_op_t *o = vp->op_free;
    vp->op_free = o->next;
    free(o);
  }
  pthread_mutex_destroy(&vp->lock);
  free(vp);
}

/* A send CQ with room for nq more QPs' completions (every QP can have
 * VRB_SQ_DEPTH signaled requests in flight): an existing one, grown if the
 * device allows, or a new one.  Returns its index, counted, or -1. */
static int cq_room(vrb_ctx_t *vc, int nq)
{
  int need_one = nq * VRB_SQ_DEPTH, pick = -1;
  pthread_mutex_lock(&vc->cq_lock);
  int n = atomic_load(&vc->n_scqs);
  for (int i = 0; i < n && pick < 0; i++) {
    vrb_scq_t *c = &vc->scqs[i];
    int need = (c->n_qps + nq) * VRB_SQ_DEPTH;
    if (need <= c->cap)
      pick = i;
    else if (need <= vc->max_cqe &&
             ibv_resize_cq(c->cq, need * 2 < vc->max_cqe ? need * 2 : vc->max_cqe) == 0) {
      c->cap = c->cq->cqe;
      pick = need <= c->cap ? i : -1;
    }
  }
  if (pick < 0 && n < VRB_MAX_SCQS && need_one <= vc->max_cqe) {
    int cap = VRB_CQ_DEPTH > need_one ? VRB_CQ_DEPTH : need_one;
    cap = cap < vc->max_cqe ? cap : vc->max_cqe;
    struct ibv_cq *cq = ibv_create_cq(vc->dev, cap, NULL, vc->sch, 0);
    if (cq) {
      vc->scqs[n] = (vrb_scq_t){.cq = cq, .cap = cq->cqe};
      atomic_store_explicit(&vc->n_scqs, n + 1, memory_order_release);
      pick = n;
    }
  }
  if (pick >= 0)
    vc->scqs[pick].n_qps += nq;
  pthread_mutex_unlock(&vc->cq_lock);
  if (pick < 0)
    hixl__vrb_err(HIXL_ERR_NOMEM, "no send CQ can take another peer's QPs", 0);
  return pick;
}

/* How every QP of vp is made (in-band here, rdmacm in cm.c). */
struct ibv_qp_init_attr hixl__vrb_qp_attr(const vrb_ctx_t *vc, const vrb_peer_t *vp)
{
  return (struct ibv_qp_init_attr){
      .send_cq = vc->scqs[vp->scq].cq,
      .recv_cq = vc->rcq,
      .srq = vc->srq,
      .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = VRB_SQ_DEPTH, .max_send_sge = 1, .max_inline_data = VRB_INLINE}};
}

void hixl__vrb_note_inline(vrb_ctx_t *vc, uint32_t granted)
{
  /* What the device granted, up to what an op can carry (vrb_op_t); the
   * smallest any QP got, so an inline op fits whichever QP it goes on. */
  uint32_t mi = granted < VRB_INLINE ? granted : VRB_INLINE;
  if (vc->max_inline == 0 || mi < vc->max_inline)
    vc->max_inline = mi;
}

uint8_t hixl__vrb_ack_timeout(void)
{
  /* Local ACK timeout 4.096 us * 2^t per try, 7 tries, then the peer is
   * lost.  Default 17 (0.5 s a try): generous enough for Soft-RoCE under
   * emulation; real fabrics usually run 14.  HIXL_VERBS_TIMEOUT overrides. */
  const char *to = getenv("HIXL_VERBS_TIMEOUT");
  return (uint8_t)(to && atoi(to) > 0 && atoi(to) < 32 ? atoi(to) : 17);
}

/* Count vp's QPs in the budget, find send-CQ room, register its atomic
 * results (once).  Nothing is made for a peer past the budget. */
static hixl_status_t qps_count(vrb_peer_t *vp)
{
  vrb_ctx_t *vc = VC(vp->peer->ctx);
  int nq = vp->nq;
  /* Lazy pairs wait their turn for room behind those that waited first. */
  int ahead = vp->lazy ? hixl__vrb_room_ahead(vc, vp) : 0;
  int in_use = atomic_fetch_add(&vc->n_qps, nq);
  if (vp->lazy)
    atomic_fetch_add(&vc->n_lazy_qps, nq);
  vp->qps_counted = nq;
  if (in_use + ahead + nq > vc->max_qps) {
    qps_uncount(vp);
    return hixl__err(HIXL_ERR_AGAIN,
                     "verbs: no QP for %s: %d of this context's %d are in use%s%.0d%s and it "
                     "needs %d (HIXL_VERBS_MAX_QPS; HIXL_VERBS_QPS per peer; the device's limit "
                     "is its max_qp)",
                     vp->peer->name, in_use, vc->max_qps, ahead ? ", " : "", ahead,
                     ahead ? " kept for pairs that waited first" : "", nq);
  }
  if (vp->amo_mr == NULL) {
    size_t amo_bytes = sizeof(uint64_t) * VRB_SQ_DEPTH * (size_t)nq;
    if (vp->amo == NULL)
      vp->amo = aligned_alloc(64, amo_bytes);
    hixl_status_t st = hixl__vrb_pin(&vc->pins, amo_bytes, "a peer's atomic results");
    if (st != HIXL_OK) {
      qps_uncount(vp);
      return st;
    }
    if (vp->amo)
      vp->amo_mr = ibv_reg_mr(vc->pd, vp->amo, amo_bytes, IBV_ACCESS_LOCAL_WRITE);
    if (vp->amo_mr == NULL) {
      hixl__vrb_unpin(&vc->pins, amo_bytes);
      qps_uncount(vp);
      return hixl__vrb_err(HIXL_ERR_NOMEM, "registering a peer's atomic results", 0);
    }
    for (int i = 0; i < nq; i++)
      vp->qps[i]->amo = vp->amo + (size_t)i * VRB_SQ_DEPTH;
  }
  vp->scq = cq_room(vc, nq);
  if (vp->scq < 0) {
    qps_uncount(vp);
    return HIXL_ERR_NOMEM;
  }
  vp->cq_reserved = nq;
  for (int i = 0; i < nq; i++) {
    vrb_qp_t *q = vp->qps[i];
    if (q->wqe == NULL && (q->wqe = calloc(VRB_SQ_DEPTH, sizeof(*q->wqe))) == NULL) {
      qps_uncount(vp);
      return hixl__err(HIXL_ERR_NOMEM, "verbs: no memory for a peer's work requests");
    }
    for (int k = 0; k < VRB_SQ_DEPTH; k++)
      q->wqe[k].q = q;
  }
  return HIXL_OK;
}

hixl_status_t hixl__vrb_qps_make(vrb_peer_t *vp)
{
  vrb_ctx_t *vc = VC(vp->peer->ctx);
  hixl_status_t st = qps_count(vp);
  if (st != HIXL_OK)
    return st;
  for (int i = 0; i < vp->nq && st == HIXL_OK; i++) {
    struct ibv_qp_init_attr qa = hixl__vrb_qp_attr(vc, vp);
    struct ibv_qp *qp = ibv_create_qp(vc->pd, &qa);
    if (qp == NULL) {
      st = hixl__vrb_err(HIXL_ERR_NOMEM, "creating a QP", 0);
      break;
    }
    hixl__vrb_note_inline(vc, qa.cap.max_inline_data);
    pthread_mutex_lock(&vp->lock); /* where vrb_peer_lost looks */
    vp->qps[i]->qp = qp;
    pthread_mutex_unlock(&vp->lock);
  }
  vp->psn = (uint32_t)hixl__random64() & 0xffffff;
  if (st == HIXL_OK && !hixl__vrb_rmap_add(vc, vp->qps[0]->qp->qp_num, vp->peer))
    st = hixl__err(HIXL_ERR_NOMEM, "verbs: no memory for the QP map");
  if (st != HIXL_OK)
    hixl__vrb_qps_unmake(vp);
  return st;
}

void hixl__vrb_qps_unmake(vrb_peer_t *vp)
{
  vrb_ctx_t *vc = VC(vp->peer->ctx);
  rmap_retire(vc, vp->peer);
  qps_destroy(vp);
  qps_uncount(vp);
  /* Its atomic results' registration goes with its QPs (nothing is posted
   * on them now), so that idle pairs hold none; the memory stays for the
   * next QPs, registered again then. */
  if (vp->amo_mr) {
    hixl__vrb_unpin(&vc->pins, vp->amo_mr->length);
    ibv_dereg_mr(vp->amo_mr);
    vp->amo_mr = NULL;
  }
}

/* How a peer's QPs come: made now and connected in the bind (in-band),
 * by rdmacm as it connects, or on first use (lazy.c). */
enum { VP_INBAND, VP_RDMACM, VP_LAZY };

/* A peer with nq QP slots, set up as mode says. */
static hixl_status_t vp_new(hixl_peer_t *peer, int nq, int mode, vrb_peer_t **vp_p)
{
  vrb_peer_t *vp = calloc(1, sizeof(*vp));
  *vp_p = NULL;
  if (vp == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "verbs: no memory for a peer");
  pthread_mutex_init(&vp->lock, NULL);
  vp->peer = peer;
  vp->lazy = mode == VP_LAZY;
  for (int i = 0; i < nq; i++) {
    vrb_qp_t *q = calloc(1, sizeof(*q));
    if (q == NULL) {
      vp_free(vp);
      return hixl__err(HIXL_ERR_NOMEM, "verbs: no memory for a peer's QPs");
    }
    vp->qps[vp->nq++] = q;
    q->vp = vp;
    q->index = (uint32_t)i;
  }
  hixl_status_t st = HIXL_OK;
  if (mode == VP_INBAND)
    st = hixl__vrb_qps_make(vp);
  else if (mode == VP_RDMACM)
    st = qps_count(vp);
  if (st != HIXL_OK) {
    vp_free(vp);
    return st;
  }
  *vp_p = vp;
  return HIXL_OK;
}

void hixl__vrb_local_blob(const vrb_ctx_t *vc, const vrb_peer_t *vp, hixl_msg_t *m)
{
  memcpy(m->blob, vc->gid.raw, 16);
  for (int i = 1; i < vp->nq; i++) {
    uint32_t qpn = htole32(vp->qps[i]->qp->qp_num);
    memcpy(m->blob + 16 + 4 * (i - 1), &qpn, 4);
  }
  m->blob_len = (uint16_t)(16 + 4 * (vp->nq - 1));
}

/* Our side of the bind (TP_BIND / TP_BIND_REPLY, vrb_qp_msg_t): the QPN of
 * QP 0, PSN, MTU, LID, the QP count; blob: the GID, then the QPNs of QPs
 * 1.. (4 bytes each). */
static void local_info(vrb_ctx_t *vc, vrb_peer_t *vp, hixl_msg_t *m)
{
  VRB_QP(m)->qpn = vp->qps[0]->qp->qp_num;
  VRB_QP(m)->psn = vp->psn;
  VRB_QP(m)->mtu = (uint32_t)vc->mtu;
  VRB_QP(m)->lid = vc->lid;
  VRB_QP(m)->nqps = (uint64_t)vp->nq;
  hixl__vrb_local_blob(vc, vp, m);
}

/* The QP count a VERBS_QP message announces, or 0 when malformed. */
static int remote_nq(const hixl_msg_t *r)
{
  uint64_t nq = VRB_QP(r)->nqps ? VRB_QP(r)->nqps : 1; /* 0: an older peer, one QP */
  bool no_qps = VRB_QP(r)->cm || VRB_QP(r)->lazy;      /* rdmacm, lazy: no QPNs yet */
  uint64_t blob = no_qps ? 16 : 16 + 4 * (nq - 1);
  if (nq > VRB_MAX_QPS || r->blob_len != blob)
    return 0;
  if (!no_qps && (VRB_QP(r)->mtu < IBV_MTU_256 || VRB_QP(r)->mtu > IBV_MTU_4096))
    return 0;
  return (int)nq;
}

/* INIT -> RTR -> RTS against the peer's QP number qpn. */
static hixl_status_t qp_connect(vrb_ctx_t *vc, struct ibv_qp *qp, uint32_t qpn, uint32_t rpsn,
                                enum ibv_mtu rmtu, uint16_t rlid, const uint8_t rgid[16],
                                uint32_t my_psn)
{
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                          .port_num = vc->port,
                          .qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                                             IBV_ACCESS_REMOTE_ATOMIC};
  int rc =
      ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc)
    return hixl__vrb_err(HIXL_ERR_TRANSPORT, "QP to INIT", rc);
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  /* Path MTU: the smaller of both active MTUs. */
  a.path_mtu = vc->mtu < rmtu ? vc->mtu : rmtu;
  a.dest_qp_num = qpn;
  a.rq_psn = rpsn;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = vc->port;
  a.ah_attr.dlid = rlid;
  a.ah_attr.is_global = 1;
  memcpy(a.ah_attr.grh.dgid.raw, rgid, 16);
  a.ah_attr.grh.sgid_index = (uint8_t)vc->gid_index;
  a.ah_attr.grh.hop_limit = 64;
  rc = ibv_modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc)
    return hixl__vrb_err(HIXL_ERR_TRANSPORT, "QP to RTR", rc);
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = my_psn;
  a.timeout = hixl__vrb_ack_timeout();
  a.retry_cnt = 7;
  a.rnr_retry = 7; /* receiver not ready: retry forever (throttles notifications) */
  a.max_rd_atomic = 16;
  rc = ibv_modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc)
    return hixl__vrb_err(HIXL_ERR_TRANSPORT, "QP to RTS", rc);
  return HIXL_OK;
}

hixl_status_t hixl__vrb_qps_rts(vrb_ctx_t *vc, vrb_peer_t *vp, const uint32_t *qpn, uint32_t rpsn,
                                enum ibv_mtu rmtu, uint16_t rlid, const uint8_t rgid[16])
{
  hixl_status_t st = HIXL_OK;
  for (int i = 0; i < vp->nq && st == HIXL_OK; i++)
    st = qp_connect(vc, vp->qps[i]->qp, qpn[i], rpsn, rmtu, rlid, rgid, vp->psn);
  return st;
}

/* Connect all of vp's QPs to the peer's, pairwise (a bind message r). */
static hixl_status_t qps_connect(vrb_ctx_t *vc, vrb_peer_t *vp, const hixl_msg_t *r)
{
  if (remote_nq(r) != vp->nq)
    return hixl__err(HIXL_ERR_TRANSPORT, "verbs: malformed QP information from the peer");
  uint32_t qpn[VRB_MAX_QPS] = {VRB_QP(r)->qpn};
  for (int i = 1; i < vp->nq; i++) {
    memcpy(&qpn[i], r->blob + 16 + 4 * (i - 1), 4);
    qpn[i] = le32toh(qpn[i]);
  }
  hixl_status_t st = hixl__vrb_qps_rts(vc, vp, qpn, VRB_QP(r)->psn, (enum ibv_mtu)VRB_QP(r)->mtu,
                                       (uint16_t)VRB_QP(r)->lid, r->blob);
  for (int i = 0; i < vp->nq; i++)
    vp->qps[i]->ready = st == HIXL_OK;
  return st;
}

/* How long a QP taken down stays in the map (retired): a receive
 * completion of its last messages may, on some devices, land in the CQ a
 * little after the sender saw them acknowledged (and told us so over the
 * control connection).  Far longer than that; far shorter than a device
 * takes to hand the same QP number out again. */
#define RMAP_RETIRED_NS (2000 * 1000000LL)

static void recv_poll(hixl_ctx_t *ctx, vrb_ctx_t *vc);

/* Drop entries retired long enough ago (recv_lock held). */
static void rmap_sweep(vrb_ctx_t *vc, int64_t now)
{
  for (size_t i = 0; i < vc->n_rmap;)
    if (vc->rmap[i].retired_ns && now - vc->rmap[i].retired_ns > RMAP_RETIRED_NS)
      vc->rmap[i] = vc->rmap[--vc->n_rmap];
    else
      i++;
}

bool hixl__vrb_rmap_add(vrb_ctx_t *vc, uint32_t qpn, hixl_peer_t *peer)
{
  bool ok = true;
  pthread_mutex_lock(&vc->recv_lock);
  /* The device gave this number out again: a retired entry of it is
   * stale now.  Whatever its old QP left in the CQ is taken in first
   * (rare: a number reused within RMAP_RETIRED_NS), so that it reaches its
   * own peer and not this one. */
  bool stale = false;
  for (size_t i = 0; i < vc->n_rmap; i++)
    stale |= vc->rmap[i].qpn == qpn;
  if (stale)
    recv_poll(peer->ctx, vc);
  for (size_t i = 0; i < vc->n_rmap;)
    if (vc->rmap[i].qpn == qpn)
      vc->rmap[i] = vc->rmap[--vc->n_rmap];
    else
      i++;
  rmap_sweep(vc, hixl__now_ns());
  if (vc->n_rmap == vc->cap_rmap) {
    size_t cap = vc->cap_rmap ? vc->cap_rmap * 2 : 16;
    struct vrb_rmap *m = realloc(vc->rmap, cap * sizeof(*m));
    if (m) {
      vc->rmap = m;
      vc->cap_rmap = cap;
    }
    ok = m != NULL;
  }
  if (ok)
    vc->rmap[vc->n_rmap++] = (struct vrb_rmap){qpn, peer, 0};
  pthread_mutex_unlock(&vc->recv_lock);
  return ok;
}

/* The peer's QPs are being taken down, the peer stays: its entries stay
 * too, retired, for RMAP_RETIRED_NS (a late completion still reaches it). */
static void rmap_retire(vrb_ctx_t *vc, hixl_peer_t *peer)
{
  pthread_mutex_lock(&vc->recv_lock);
  int64_t now = hixl__now_ns();
  rmap_sweep(vc, now);
  for (size_t i = 0; i < vc->n_rmap; i++)
    if (vc->rmap[i].peer == peer && vc->rmap[i].retired_ns == 0)
      vc->rmap[i].retired_ns = now;
  pthread_mutex_unlock(&vc->recv_lock);
}

/* The peer goes: out of the map, and its kept completions dropped (their
 * buffers posted again). */
static void rmap_del(vrb_ctx_t *vc, hixl_peer_t *peer)
{
  pthread_mutex_lock(&vc->recv_lock);
  for (size_t i = 0; i < vc->n_rmap;)
    if (vc->rmap[i].peer == peer)
      vc->rmap[i] = vc->rmap[--vc->n_rmap];
    else
      i++;
  int k = 0;
  for (int i = 0; i < vc->n_overflow; i++) {
    if (vc->overflow[i].peer == peer)
      post_recv(vc, (uint32_t)vc->overflow[i].wc.wr_id);
    else
      vc->overflow[k++] = vc->overflow[i];
  }
  vc->n_overflow = k;
  pthread_mutex_unlock(&vc->recv_lock);
}

static hixl_status_t attach_peer(hixl_peer_t *peer, vrb_peer_t *vp)
{
  /* In-band QPs are in the map from hixl__vrb_qps_make on, lazy ones get
   * there when they are made; rdmacm's initiator has its QPs now, and its
   * target adds QP 0 when rdmacm makes it (cm.c). */
  if (vp->qps[0]->cm_id && vp->qps[0]->qp &&
      !hixl__vrb_rmap_add(VC(peer->ctx), vp->qps[0]->qp->qp_num, peer))
    return hixl__err(HIXL_ERR_NOMEM, "verbs: no memory for the QP map");
  peer->tp = vp;
  return HIXL_OK;
}

/* HIXL_VERBS_QPS: QPs per peer, 1..VRB_MAX_QPS (the initiator decides). */
static int qps_wanted(void)
{
  long v = 1;
  const char *e = getenv("HIXL_VERBS_QPS");
  if (e && hixl__parse_int(e, 1, VRB_MAX_QPS, &v) != 0) {
    hixl_warn("ignoring HIXL_VERBS_QPS=%s (want 1..%d)", e, VRB_MAX_QPS);
    v = 1;
  }
  return (int)v;
}

/* HIXL_VERBS_CM: "inband" (default) or "rdmacm". */
static bool cm_wanted(void)
{
  const char *e = getenv("HIXL_VERBS_CM");
  if (e == NULL || *e == 0 || strcmp(e, "inband") == 0)
    return false;
  if (strcmp(e, "rdmacm") == 0)
    return true;
  hixl_warn("ignoring HIXL_VERBS_CM=%s (want inband or rdmacm)", e);
  return false;
}

static hixl_status_t vrb_connect(hixl_peer_t *peer, const hixl_msg_t *ack, int64_t deadline)
{
  (void)ack;
  vrb_ctx_t *vc = VC(peer->ctx);
  bool cm = cm_wanted();
#ifndef HIXL_HAVE_RDMACM
  if (cm)
    return hixl__err(HIXL_ERR_UNSUPPORTED, "verbs: HIXL_VERBS_CM=rdmacm, but this libhixl "
                                           "was built without librdmacm");
#endif
  /* The initiator decides for the pair: rdmacm, QPs now, or on first use. */
  bool lazy = !cm && vc->lazy;
  vrb_peer_t *vp;
  hixl_status_t st = vp_new(peer, qps_wanted(), cm ? VP_RDMACM : lazy ? VP_LAZY : VP_INBAND, &vp);
  if (st != HIXL_OK)
    return st;
  hixl_msg_t m = {.type = HIXL_MSG_TP_BIND}, r;
  if (cm || lazy) { /* no QPs yet: the count and our GID */
    VRB_QP(&m)->nqps = (uint64_t)vp->nq;
    VRB_QP(&m)->cm = cm;
    VRB_QP(&m)->lazy = lazy;
    memcpy(m.blob, vc->gid.raw, 16);
    m.blob_len = 16;
  } else {
    local_info(vc, vp, &m);
  }
  VRB_QP(&m)->id = peer->ctx->id;
  st = hixl__send(peer, &m, NULL, 0);
  if (st == HIXL_OK)
    st = hixl__peer_recv_sync(peer, &r, deadline);
  if (st == HIXL_OK && (r.type != HIXL_MSG_TP_BIND_REPLY || r.status != HIXL_OK)) {
    bool ours = r.type == HIXL_MSG_TP_BIND_REPLY;
    st = hixl__err(ours && (r.status == HIXL_ERR_UNSUPPORTED || r.status == HIXL_ERR_AGAIN ||
                            r.status == HIXL_ERR_NOMEM)
                       ? r.status
                       : HIXL_ERR_TRANSPORT,
                   "verbs: %s refused our QPs (%s)%s%.200s", peer->name, hixl_strerror(r.status),
                   ours && r.str[0][0] ? ": target: " : "", ours ? r.str[0] : "");
  }
  if (st == HIXL_OK && lazy != (VRB_QP(&r)->lazy != 0))
    st = hixl__err(HIXL_ERR_TRANSPORT, "verbs: %s answered a lazy bind with QPs", peer->name);
#ifdef HIXL_HAVE_RDMACM
  if (st == HIXL_OK && cm)
    st = VRB_QP(&r)->cm == 0 || VRB_QP(&r)->cm > 65535 || r.blob_len != 16 || VRB_QP(&r)->id == 0
             ? hixl__err(HIXL_ERR_TRANSPORT, "verbs: malformed rdmacm reply from %s", peer->name)
             : hixl__vrb_cm_connect(peer, vp, &r, deadline);
#endif
  if (st == HIXL_OK && !cm && !lazy)
    st = qps_connect(vc, vp, &r);
  if (st == HIXL_OK)
    st = attach_peer(peer, vp);
  if (st != HIXL_OK)
    vp_free(vp);
  return st;
}

static void vrb_accept(hixl_peer_t *peer, const hixl_msg_t *m, int *fds, int nfds, int sock,
                       hixl_msg_t *out, int *out_fds, int *n_out)
{
  (void)fds, (void)nfds, (void)sock, (void)out_fds, (void)n_out; /* an in-band bind */
  vrb_ctx_t *vc = VC(peer->ctx);
  memset(out, 0, sizeof(*out));
  out->type = HIXL_MSG_TP_BIND_REPLY;
  int nq = remote_nq(m);
  bool cm = VRB_QP(m)->cm != 0, lazy = VRB_QP(m)->lazy != 0;
  hixl_status_t st = HIXL_OK;
  if (nq == 0 || (cm && lazy) || VRB_QP(m)->lazy > 1)
    st = hixl__err(HIXL_ERR_TRANSPORT, "verbs: malformed VERBS_QP");
  else if (cm && vc->cm_listen == NULL)
    st = hixl__err(HIXL_ERR_UNSUPPORTED, "verbs: the peer asked for rdmacm, which is not "
                                         "available here");
  vrb_peer_t *vp = NULL;
  if (st == HIXL_OK)
    st = vp_new(peer, nq, cm ? VP_RDMACM : lazy ? VP_LAZY : VP_INBAND, &vp);
  if (st == HIXL_OK && !cm && !lazy)
    st = qps_connect(vc, vp, m);
  if (st == HIXL_OK)
    st = attach_peer(peer, vp);
  out->status = st;
  if (st != HIXL_OK) {
    vp_free(vp);
    hixl_warn("verbs: cannot accept %s: %s", peer->name, hixl_last_error());
    snprintf(out->str[0], sizeof(out->str[0]), "%s", hixl_last_error()); /* the initiator's why */
    return;
  }
  if (cm || lazy) { /* the QPs come later: with rdmacm's requests, or on first use */
    if (cm)
      while (vp->cm_cookie == 0)
        vp->cm_cookie = hixl__random64();
    VRB_QP(out)->id = vp->cm_cookie;
    VRB_QP(out)->nqps = (uint64_t)nq;
    VRB_QP(out)->cm = cm ? vc->cm_port : 0;
    VRB_QP(out)->lazy = lazy;
    memcpy(out->blob, vc->gid.raw, 16);
    out->blob_len = 16;
    return;
  }
  local_info(vc, vp, out);
}

/* QPs to ERROR: everything posted flushes (completes as PEER_LOST). */
static void vrb_peer_lost(hixl_peer_t *peer)
{
  vrb_peer_t *vp = peer->tp;
  if (vp == NULL)
    return;
  /* Under vp->lock: the QP set-up thread makes and destroys QPs meanwhile
   * (lazy.c), and sets them there. */
  pthread_mutex_lock(&vp->lock);
  for (int i = 0; i < vp->nq; i++) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    if (vp->qps[i]->qp)
      ibv_modify_qp(vp->qps[i]->qp, &a, IBV_QP_STATE);
  }
  pthread_mutex_unlock(&vp->lock);
  /* What waits in the software queues was never posted, so no flush will
   * fail it (a lazy pair's QPs may not even exist): now. */
  hixl__vrb_fail_queued(vp, HIXL_ERR_PEER_LOST);
}

static void vrb_peer_close(hixl_peer_t *peer)
{
  vrb_peer_t *vp = peer->tp;
  if (vp) {
    hixl__vrb_lazy_forget(vp); /* the control thread's set-up work leaves it */
    /* Flush what is in flight before the descriptors those completions
     * point at go away. */
    vrb_peer_lost(peer);
    if (hixl__vrb_drain_peer(vp)) {
      vp_free(vp);
    } else {
      hixl_warn("verbs: work requests to %s never flushed; keeping their descriptors", peer->name);
      peer->tp_kept = true; /* a late flush reads the peer through them */
    }
  }
  rmap_del(VC(peer->ctx), peer); /* no receive completion reaches it now */
  peer->tp = NULL;
  hixl__inbox_forget(peer);
}

/* ------------------------------------------------------------ event mode */

/* A thread is about to sleep (wait.c): ask for an event at the next send
 * completion and, for a waiter of notifications, at the next receive; the
 * channels' fds show them.  Completions that arrived before arming raised
 * no event: the waiter looks once more after this (its poll drives both
 * CQs), so none is missed. */
static int vrb_arm(hixl_ctx_t *ctx, unsigned flags, int *fds, int max)
{
  vrb_ctx_t *vc = VC(ctx);
  if (vc == NULL || max < 2)
    return 0;
  int n = atomic_load_explicit(&vc->n_scqs, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (ibv_req_notify_cq(vc->scqs[i].cq, 0) != 0)
      return 0;
  int k = 0;
  fds[k++] = vc->sch->fd;
  if (!(flags & HIXL_WAITF_PROGRESS)) {
    pthread_mutex_lock(&vc->recv_lock);
    if (!vc->rcq_armed && ibv_req_notify_cq(vc->rcq, 0) == 0)
      vc->rcq_armed = true;
    pthread_mutex_unlock(&vc->recv_lock);
    fds[k++] = vc->rch->fd;
  }
  return k;
}

static void vrb_ack_event(hixl_ctx_t *ctx, int64_t woke_ns, bool word)
{
  (void)woke_ns;
  (void)word; /* no words: arm gives fds only */
  vrb_ctx_t *vc = VC(ctx);
  struct ibv_cq *cq;
  void *cq_ctx;
  while (ibv_get_cq_event(vc->sch, &cq, &cq_ctx) == 0)
    ibv_ack_cq_events(cq, 1);
  pthread_mutex_lock(&vc->recv_lock);
  if (ibv_get_cq_event(vc->rch, &cq, &cq_ctx) == 0) {
    ibv_ack_cq_events(cq, 1);
    vc->rcq_armed = false; /* an event disarms it */
  }
  recv_poll(ctx, vc);
  pthread_mutex_unlock(&vc->recv_lock);
}

/* ------------------------------------------------------------ remote keys */

static hixl_status_t vrb_rmr_attach(hixl_rmr_t *r, int64_t deadline)
{
  hixl_status_t st = hixl__rmr_key_call(r,
                                        "its NIC cannot reach (no dmabuf or peer-memory "
                                        "support there, or HIXL_DEVICE_RDMA=0)",
                                        deadline);
  if (st == HIXL_OK && r->tp_key[0] > UINT32_MAX)
    return hixl__err(HIXL_ERR_TRANSPORT, "hixl_rmr_unpack: peer %s sent a verbs rkey of %llu",
                     r->peer->name, (unsigned long long)r->tp_key[0]);
  return st;
}

static void vrb_rmr_detach(hixl_rmr_t *r) { (void)r; }

static bool vrb_rmr_live(const hixl_rmr_t *r) { return !atomic_load(&r->gone); }

/* Target side: receive completions -> notifications.  Whose a completion
 * is (recv_lock held): the QP map's peer for its QP, or NULL. */
static hixl_peer_t *wc_peer(vrb_ctx_t *vc, const struct ibv_wc *wc)
{
  for (size_t i = 0; i < vc->n_rmap; i++)
    if (vc->rmap[i].qpn == wc->qp_num)
      return vc->rmap[i].peer;
  return NULL;
}

/* Into p's notification ring; false: the ring is full (keep it). */
static bool deliver(vrb_ctx_t *vc, hixl_peer_t *p, const struct ibv_wc *wc)
{
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
  vrb_peer_t *vp = p->tp;
  if (vp) /* traffic from it counts as a use of the pair (LRU) */
    hixl__vrb_used(vc, vp);
  return hixl__inbox_push(p, imm, len);
}

/* While a user thread polls notifications (hixl_notif_poll, which polls the
 * receive CQ itself), the control thread leaves the CQ's channel unarmed: an
 * event, a wake-up and four syscalls per message would only compete with
 * that thread for the CPU.  It arms it again once nobody polled for this
 * long, and meanwhile drains the CQ at its ticks (the SRQ's 512 buffers
 * absorb a burst; beyond that the sender waits on RNR, nothing is lost). */
#define USER_POLL_NS (10 * 1000000LL)

static void vrb_on_event(hixl_ctx_t *ctx)
{
  vrb_ctx_t *vc = VC(ctx);
  /* Requests waiting in software queues go out as completions free room,
   * even when the caller is not calling hixl (see tp_backlog). */
  if (atomic_load(&ctx->tp_backlog) > 0)
    hixl__vrb_progress(ctx);
#ifdef HIXL_HAVE_RDMACM
  hixl__vrb_cm_events(ctx);
#endif
  struct ibv_cq *cq;
  void *cq_ctx;
  pthread_mutex_lock(&vc->recv_lock);
  if (ibv_get_cq_event(vc->rch, &cq, &cq_ctx) == 0) {
    ibv_ack_cq_events(cq, 1);
    vc->rcq_armed = false; /* an event disarms it */
  }
  recv_poll(ctx, vc);
  int64_t now = hixl__now_ns();
  uint64_t polls = atomic_load_explicit(&vc->user_polls, memory_order_relaxed);
  if (polls != vc->seen_polls) {
    vc->seen_polls = polls;
    vc->user_active_ns = now;
  }
  bool user = now - vc->user_active_ns < USER_POLL_NS;
  if (!vc->rcq_armed && !user) {
    ibv_req_notify_cq(vc->rcq, 0);
    vc->rcq_armed = true;
    recv_poll(ctx, vc); /* what arrived before arming raised no event */
  }
  pthread_mutex_unlock(&vc->recv_lock);
}

/* hixl_notif_poll is about to look at the inboxes: bring in what arrived. */
static void vrb_notif_poll(hixl_ctx_t *ctx)
{
  vrb_ctx_t *vc = VC(ctx);
  /* A counter, not a clock read: clocks can cost a syscall (see
   * util.c), and this runs in the notification wait loop. */
  atomic_fetch_add_explicit(&vc->user_polls, 1, memory_order_relaxed);
  if (pthread_mutex_trylock(&vc->recv_lock) == 0) { /* else someone is at it */
    recv_poll(ctx, vc);
    pthread_mutex_unlock(&vc->recv_lock);
  }
}

/* Receive completions -> notifications (vc->recv_lock held, so one CQ is
 * never polled by two threads at once and per-peer order holds). */
static void recv_poll(hixl_ctx_t *ctx, vrb_ctx_t *vc)
{
  bool delivered = false;
  /* Older ones first: per peer, order is kept. */
  int k = 0;
  while (k < vc->n_overflow && deliver(vc, vc->overflow[k].peer, &vc->overflow[k].wc)) {
    post_recv(vc, (uint32_t)vc->overflow[k].wc.wr_id);
    k++;
  }
  memmove(vc->overflow, vc->overflow + k, sizeof(vc->overflow[0]) * (size_t)(vc->n_overflow - k));
  vc->n_overflow -= k;
  struct ibv_wc wcs[32];
  int n;
  while ((n = ibv_poll_cq(vc->rcq, 32, wcs)) > 0) {
    delivered = true;
    for (int i = 0; i < n; i++) {
      hixl_peer_t *p = wc_peer(vc, &wcs[i]);
      if (vc->n_overflow == 0 && deliver(vc, p, &wcs[i]))
        post_recv(vc, (uint32_t)wcs[i].wr_id);
      else if (vc->n_overflow < VRB_SRQ_DEPTH) /* always: the SRQ holds no more */
        vc->overflow[vc->n_overflow++] = (struct vrb_over){wcs[i], p};
    }
  }
  if (delivered || k > 0)
    hixl__wake_waiters(ctx); /* hixl_notif_wait */
}

void hixl__vrb_recv_drain(hixl_ctx_t *ctx)
{
  vrb_ctx_t *vc = VC(ctx);
  pthread_mutex_lock(&vc->recv_lock);
  recv_poll(ctx, vc);
  pthread_mutex_unlock(&vc->recv_lock);
}

const hixl_transport_ops_t hixl__verbs_ops = {
    .size = sizeof(hixl_transport_ops_t),
    .name = "verbs",
    .id = HIXL_TP_VERBS,
    .async = true,
    .needs_bind = true,
    .caps = HIXL_TP_CAP_LAZY,
    .ctx_init = vrb_ctx_init,
    .probe = vrb_probe,
    .ctx_fini = vrb_ctx_fini,
    .mr_reg = vrb_mr_reg,
    .mr_dereg = vrb_mr_dereg,
    .usable = vrb_usable,
    .connect = vrb_connect,
    .accept = vrb_accept,
    .peer_close = vrb_peer_close,
    .peer_lost = vrb_peer_lost,
    .rmr_attach = vrb_rmr_attach,
    .rmr_detach = vrb_rmr_detach,
    .rmr_live = vrb_rmr_live,
    .put = hixl__vrb_put,
    .get = hixl__vrb_get,
    .put_imm = hixl__vrb_put_imm,
    .notify = hixl__vrb_notify,
    .batch = hixl__vrb_batch,
    .atomic = hixl__vrb_atomic,
    .progress = hixl__vrb_progress,
    .on_event = vrb_on_event,
    .arm = vrb_arm,
    .ack_event = vrb_ack_event,
    .notif_poll = vrb_notif_poll,
    .mr_key = vrb_mr_key,
    .stats = vrb_stats,
    .msgs = hixl__vrb_msgs,
};

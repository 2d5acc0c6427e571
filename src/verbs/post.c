/* SPDX-License-Identifier: MIT */
/*
 * The verbs send path.
 *
 * Each QP has a ring of VRB_SQ_DEPTH descriptors (head: posted, tail:
 * retired).  Work requests are posted in chains of up to VRB_CHAIN with one
 * ibv_post_send; only the last of each post and one in VRB_SIGNAL_EVERY ask
 * for a completion, because RC completes a send queue in order: a signaled
 * completion retires every unsignaled request before it.  A request that
 * fails always produces a completion, so the one that carries an error is
 * the one that failed.
 *
 * When the ring is full (or a local buffer needs a bounce buffer and none is
 * free), requests wait in the QP's software queue, FIFO, and whoever retires
 * completions posts them: callers never wait for room and never retry.
 *
 * Local memory: inside a hixl region, its lkey; else, when large, an entry of
 * the registration cache (rcache.c); else a bounce buffer (copied in when
 * posted, copied out at completion for gets).  Device memory the NIC cannot
 * reach (outside a region registered through dmabuf or peer memory) is
 * staged the same way, by the device runtime's copies: a transfer becomes
 * 64 KiB pieces over the peer's VRB_BOUNCE_COUNT buffers, so the copy of
 * one piece overlaps the RDMA of the pieces before it.
 *
 * Several QPs per peer (HIXL_VERBS_QPS): large transfers and batches without
 * a notification are cut over all of them; anything that carries a
 * notification (put_imm, notify, a batch with an immediate) goes entirely on
 * QP 0, where RC order gives both "data before its notification" and
 * "notifications in issue order".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_int.h"

/* ------------------------------------------------------------ retiring */

/* A bounce buffer of the context's pool for q, or -1: then q waits in the
 * pool's FIFO until a completion gives one back (hixl__vrb_progress). */
static int take_bounce(vrb_ctx_t *vc, vrb_qp_t *q)
{
  int b = -1;
  pthread_mutex_lock(&vc->bounce_lock);
  if (vc->n_bounce_free > 0) {
    b = vc->bounce_free[--vc->n_bounce_free];
  } else if (!q->bw_waiting) {
    q->bw_waiting = true;
    q->bw_next = NULL;
    if (vc->bw_tail)
      vc->bw_tail->bw_next = q;
    else
      vc->bw_head = q;
    vc->bw_tail = q;
    atomic_fetch_add(&vc->n_bounce_waiting, 1);
  }
  pthread_mutex_unlock(&vc->bounce_lock);
  return b;
}

static void release_bounce(vrb_ctx_t *vc, int b)
{
  if (b < 0)
    return;
  pthread_mutex_lock(&vc->bounce_lock);
  vc->bounce_free[vc->n_bounce_free++] = b;
  pthread_mutex_unlock(&vc->bounce_lock);
}

static uint8_t *bounce_buf(vrb_ctx_t *vc, int b)
{
  return vc->bounce + (size_t)b * VRB_BOUNCE_SIZE;
}

/* Give back what a descriptor holds (vp->lock held). */
static void release_wqe(vrb_peer_t *vp, vrb_wqe_t *e)
{
  release_bounce(hixl__vc(vp->peer->ctx), e->bounce);
  if (e->rent)
    hixl__vrb_rcache_put(e->rent);
  e->rent = NULL;
}

/* Retire one descriptor (vp->lock held). */
static void retire_one(vrb_ctx_t *vc, vrb_peer_t *vp, vrb_wqe_t *e, hixl_status_t st)
{
  hixl_req_t *req = e->req;
  if (st == HIXL_OK && e->kind == VRB_WR_GET && e->copy_dst) {
    const uint8_t *b = bounce_buf(vc, e->bounce);
    if (hixl_unlikely(e->dev))
      st = hixl__dev_copy(e->copy_dst, b, e->len);
    else
      memcpy(e->copy_dst, b, e->len);
  }
  if (e->kind == VRB_WR_AMO) {
    if (st == HIXL_OK && req->old_p) {
      uint64_t v = e->q->amo[e - e->q->wqe];
      *req->old_p = vc->atomic_be ? be64toh(v) : v;
    }
    req->old_p = NULL; /* written above; complete must not overwrite it */
  }
  release_wqe(vp, e);
  e->q->tail++;
  atomic_fetch_sub(&vp->outstanding, 1);
  hixl__req_part_done(req, st);
}

/* A software-queue node, from the peer's spares or malloc (only ever when
 * the send queue is full, so not on the fast path). */
static vrb_op_t *op_node(vrb_peer_t *vp)
{
  vrb_op_t *o = vp->op_free;
  if (o) {
    vp->op_free = o->next;
    return o;
  }
  return malloc(sizeof(*o));
}

/* Unlink the head of q's software queue (vp->lock held). */
static vrb_op_t *pend_pop(vrb_qp_t *q)
{
  vrb_op_t *o = q->pend_head;
  q->pend_head = o->next;
  if (q->pend_head == NULL)
    q->pend_tail = NULL;
  q->n_pend--;
  atomic_fetch_sub(&q->vp->peer->ctx->tp_backlog, 1);
  return o;
}

static void fail_op(vrb_peer_t *vp, vrb_op_t *o, hixl_status_t st)
{
  if (o->rent)
    hixl__vrb_rcache_put(o->rent);
  atomic_fetch_sub(&vp->outstanding, 1);
  hixl__req_part_done(o->req, st);
}

/* Fail everything waiting in q's software queue (the QP is in error or the
 * peer gone: it would never be posted); the nodes become spares, which
 * vp_free frees (vp->lock held). */
static void fail_queued(vrb_peer_t *vp, vrb_qp_t *q, hixl_status_t st)
{
  while (q->pend_head) {
    vrb_op_t *o = pend_pop(q);
    fail_op(vp, o, st);
    o->next = vp->op_free;
    vp->op_free = o;
  }
}

/* ------------------------------------------------------------ posting */

/* Post ops[0..n) on q as far as the ring and the bounce pool allow, in
 * chains; returns how many were taken (posted, or failed and reported).
 * vp->lock held. */
static size_t post_ops(vrb_qp_t *q, vrb_op_t *const *ops, size_t n)
{
  vrb_peer_t *vp = q->vp;
  vrb_ctx_t *vc = hixl__vc(vp->peer->ctx);
  struct ibv_send_wr wr[VRB_CHAIN];
  struct ibv_sge sge[VRB_CHAIN];
  uint32_t first_head;
  size_t taken = 0;
  if (!q->ready) /* rdmacm still connecting it: queued until then */
    return 0;
  while (taken < n) {
    int k = 0;
    size_t idx = taken; /* ops looked at: posted below, or failed here */
    first_head = q->head;
    while (idx < n && k < VRB_CHAIN && q->head - q->tail < VRB_SQ_DEPTH) {
      const vrb_op_t *o = ops[idx];
      int b = -1;
      bool bounce = o->lkey == 0 && !o->inl && o->kind != VRB_WR_AMO;
      if (bounce && (b = take_bounce(vc, q)) < 0)
        break;
      if (hixl_unlikely(bounce && o->dev && o->kind == VRB_WR_PUT)) {
        /* Staged from device memory; a runtime failure fails this piece. */
        hixl_status_t cst = hixl__dev_copy(bounce_buf(vc, b), o->local, o->len);
        if (cst != HIXL_OK) {
          release_bounce(vc, b);
          atomic_fetch_sub(&vp->outstanding, 1);
          hixl__req_part_done(o->req, cst);
          idx++;
          continue;
        }
      }
      uint32_t slot = q->head % VRB_SQ_DEPTH;
      vrb_wqe_t *e = &q->wqe[slot];
      e->req = o->req;
      e->rent = o->rent;
      e->kind = o->kind;
      e->bounce = (int16_t)b;
      e->copy_dst = NULL;
      e->dev = o->dev;
      e->len = o->len;
      struct ibv_send_wr *w = &wr[k];
      memset(w, 0, sizeof(*w));
      w->wr_id = (uintptr_t)e;
      w->sg_list = &sge[k];
      w->num_sge = 1;
      w->opcode = (enum ibv_wr_opcode)o->opcode;
      sge[k] = (struct ibv_sge){(uintptr_t)o->local, o->len, o->lkey};
      if (bounce) {
        uint8_t *buf = bounce_buf(vc, b);
        if (o->kind == VRB_WR_PUT && !o->dev)
          memcpy(buf, o->local, o->len);
        else if (o->kind != VRB_WR_PUT)
          e->copy_dst = o->local;
        sge[k].addr = (uintptr_t)buf;
        sge[k].lkey = vc->bounce_mr->lkey;
      }
      if (o->inl) { /* the bytes are copied into the work request now */
        w->send_flags |= IBV_SEND_INLINE;
        sge[k].addr = (uintptr_t)o->data;
      }
      switch (o->kind) {
      case VRB_WR_AMO:
        sge[k] = (struct ibv_sge){(uintptr_t)&q->amo[slot], 8, vp->amo_mr->lkey};
        w->wr.atomic.remote_addr = o->raddr;
        w->wr.atomic.rkey = o->rkey;
        w->wr.atomic.compare_add = o->cmp;
        w->wr.atomic.swap = o->swap;
        break;
      case VRB_WR_SEND:
        /* Inline: the payload is copied at post time, so the op's own
         * storage (a stack frame or a queue node) may go away after. */
        sge[k] = (struct ibv_sge){(uintptr_t)o->data, o->len, 0};
        break;
      default:
        w->wr.rdma.remote_addr = o->raddr;
        w->wr.rdma.rkey = o->rkey;
        if (o->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
          w->imm_data = htonl(o->imm);
      }
      if (++q->since_signal >= VRB_SIGNAL_EVERY) {
        w->send_flags |= IBV_SEND_SIGNALED;
        q->since_signal = 0;
      }
      if (k > 0)
        wr[k - 1].next = w;
      q->head++;
      k++;
      idx++;
    }
    if (k == 0) {
      if (idx == taken)
        break;     /* no room */
      taken = idx; /* only failed ones */
      continue;
    }
    /* The last request of every post is signaled: nothing is left waiting
     * for a completion that nobody asked for. */
    if (!(wr[k - 1].send_flags & IBV_SEND_SIGNALED)) {
      wr[k - 1].send_flags |= IBV_SEND_SIGNALED;
      q->since_signal = 0;
    }
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(q->qp, wr, &bad);
    if (rc) {
      /* Requests from bad on were not posted: take them back out of the
       * ring (newest first) and fail them.  The QP is unusable now. */
      int nbad = 0;
      for (struct ibv_send_wr *w = bad; w; w = w->next)
        nbad++;
      if (bad == NULL)
        nbad = k;
      hixl_status_t st = hixl__vrb_err(HIXL_ERR_TRANSPORT, "ibv_post_send", rc);
      for (int i = k - 1; i >= k - nbad; i--) {
        vrb_wqe_t *e = &q->wqe[(first_head + (uint32_t)i) % VRB_SQ_DEPTH];
        release_wqe(vp, e);
        q->head--;
        atomic_fetch_sub(&vp->outstanding, 1);
        hixl__req_part_done(e->req, st);
      }
      hixl__peer_lost_async(vp->peer, "ibv_post_send failed");
    }
    taken = idx;
  }
  return taken;
}

/* Post ops[0..n) while q has nothing queued; returns how many went (vp->lock
 * held). */
static size_t post_direct(vrb_qp_t *q, vrb_op_t *ops, size_t n)
{
  vrb_op_t *ptrs[VRB_CHAIN];
  size_t i = 0;
  while (i < n && q->pend_head == NULL) {
    size_t m = n - i < VRB_CHAIN ? n - i : VRB_CHAIN;
    for (size_t j = 0; j < m; j++)
      ptrs[j] = &ops[i + j];
    size_t t = post_ops(q, ptrs, m);
    i += t;
    if (t < m)
      break;
  }
  return i;
}

typedef struct queue_wait {
  vrb_peer_t *vp;
  vrb_qp_t *q;
} queue_wait_t;

/* Room in q's software queue again (or its peer is gone). */
static bool queue_room(void *arg)
{
  queue_wait_t *w = arg;
  for (int pass = 0; pass < 2; pass++) {
    if (atomic_load(&w->vp->peer->state) != HIXL_PEER_UP)
      return true;
    pthread_mutex_lock(&w->vp->lock);
    uint32_t queued = w->q->n_pend;
    pthread_mutex_unlock(&w->vp->lock);
    if (queued <= VRB_QUEUE_MAX)
      return true;
    if (pass == 0)
      hixl__vrb_progress(w->vp->peer->ctx);
  }
  return false;
}

/* Hand ops to q: post what fits; when the send queue is full, retire
 * completions once (no syscall: the CQ is polled in user space) and try
 * again; queue the rest behind what already waits.  The caller does not
 * wait, except when the software queue is over VRB_QUEUE_MAX: then it
 * drives completions until there is room (memory stays bounded).  Every op
 * has its request part and outstanding count taken already. */
static void submit(vrb_qp_t *q, vrb_op_t *ops, size_t n)
{
  vrb_peer_t *vp = q->vp;
  hixl_ctx_t *ctx = vp->peer->ctx;
  hixl__vrb_used(hixl__vc(ctx), vp); /* for the QP reclaim's LRU */
  pthread_mutex_lock(&vp->lock);
  size_t i = post_direct(q, ops, n);
  if (i < n) {
    pthread_mutex_unlock(&vp->lock);
    hixl__vrb_progress(ctx);
    pthread_mutex_lock(&vp->lock);
    i += post_direct(q, ops + i, n - i);
  }
  bool up = atomic_load(&vp->peer->state) == HIXL_PEER_UP;
  bool woke = false;
  for (; i < n; i++) {
    if (!up) { /* closing: nobody would ever post it */
      fail_op(vp, &ops[i], HIXL_ERR_PEER_LOST);
      continue;
    }
    vrb_op_t *node = op_node(vp);
    if (node == NULL) {
      fail_op(vp, &ops[i], hixl__err(HIXL_ERR_NOMEM, "verbs: no memory to queue a request"));
      continue;
    }
    *node = ops[i];
    node->next = NULL;
    if (q->pend_tail)
      q->pend_tail->next = node;
    else
      q->pend_head = node;
    q->pend_tail = node;
    q->n_pend++;
    if (atomic_fetch_add(&ctx->tp_backlog, 1) == 0 && !woke) {
      woke = true; /* the control thread starts its 1 ms tick */
      hixl__wake(ctx);
    }
  }
  uint32_t queued = q->n_pend;
  bool want = queued && !q->ready && vp->lazy;
  pthread_mutex_unlock(&vp->lock);
  if (want) /* no QPs yet (or any more): the control thread makes them */
    hixl__vrb_want(vp);
  if (queued > VRB_QUEUE_MAX) {
    queue_wait_t w = {vp, q};
    hixl__wait(ctx, INT64_MAX, 0, queue_room, &w); /* until room, or the peer is gone */
  }
}

/* Post what waits in q's software queue (vp->lock held). */
static void drain(vrb_qp_t *q)
{
  vrb_peer_t *vp = q->vp;
  while (q->pend_head) {
    vrb_op_t *ptrs[VRB_CHAIN];
    size_t m = 0;
    for (vrb_op_t *o = q->pend_head; o && m < VRB_CHAIN; o = o->next)
      ptrs[m++] = o;
    size_t t = post_ops(q, ptrs, m);
    for (size_t j = 0; j < t; j++) {
      vrb_op_t *o = pend_pop(q);
      o->next = vp->op_free;
      vp->op_free = o;
    }
    if (t < m)
      break;
  }
}

void hixl__vrb_fail_queued(vrb_peer_t *vp, hixl_status_t st)
{
  pthread_mutex_lock(&vp->lock);
  for (int i = 0; i < vp->nq; i++)
    fail_queued(vp, vp->qps[i], st);
  pthread_mutex_unlock(&vp->lock);
}

bool hixl__vrb_qps_stop(vrb_peer_t *vp, bool idle_only)
{
  pthread_mutex_lock(&vp->lock);
  bool stop = !idle_only || atomic_load(&vp->outstanding) == 0;
  for (int i = 0; i < vp->nq && stop; i++)
    vp->qps[i]->ready = false;
  pthread_mutex_unlock(&vp->lock);
  return stop;
}

uint32_t hixl__vrb_posted(vrb_peer_t *vp)
{
  uint32_t n = 0;
  pthread_mutex_lock(&vp->lock);
  for (int i = 0; i < vp->nq; i++)
    n += vp->qps[i]->head - vp->qps[i]->tail;
  pthread_mutex_unlock(&vp->lock);
  return n;
}

void hixl__vrb_qp_ready(vrb_qp_t *q)
{
  pthread_mutex_lock(&q->vp->lock);
  q->ready = true;
  drain(q);
  pthread_mutex_unlock(&q->vp->lock);
}

/* ------------------------------------------------------------ describing */

/* The local side of a transfer: a hixl region, a cache entry, or bounce. */
typedef struct {
  uint32_t lkey;
  vrb_rent_t *rent;
  bool dev; /* device memory: never touched by the CPU (no inline; staged without a key) */
} vrb_local_t;

static vrb_local_t local_key(vrb_ctx_t *vc, bool write, const void *p, size_t len)
{
  bool dev = hixl__is_dev(p);
  if (write && len <= vc->max_inline && !dev) /* sent inline: no key needed */
    return (vrb_local_t){0, NULL, false};
  vrb_local_t l = {hixl__vrb_region_lkey(vc, p, len), NULL, dev};
  /* Device memory never goes to the cache (ibv_reg_mr cannot pin it): with
   * a key it is read by the NIC, without one it is staged. */
  if (l.lkey == 0 && !dev && len > VRB_BOUNCE_SIZE && vc->rcache)
    l.rent = hixl__vrb_rcache_get(vc->rcache, p, len, &l.lkey);
  return l;
}

static void op_begin(vrb_peer_t *vp, vrb_op_t *o, hixl_req_t *req)
{
  o->req = req;
  o->next = NULL;
  hixl__req_part_add(req);
  atomic_fetch_add(&vp->outstanding, 1);
}

static vrb_qp_t *pick_qp(vrb_peer_t *vp)
{
  if (vp->nq == 1)
    return vp->qps[0];
  return vp->qps[atomic_fetch_add_explicit(&vp->rr, 1, memory_order_relaxed) % (uint32_t)vp->nq];
}

/* Describe [local, local+len) <-> rmr+off as ops into out (at most cap);
 * returns how many.  With a key: one WRITE (up to VRB_MAX_WR_LEN) or READs of
 * vc->read_chunk each; without: bounce-sized pieces.  Each op holds its own
 * reference on l.rent. */
static size_t describe(vrb_ctx_t *vc, vrb_peer_t *vp, bool write, uint8_t *local, size_t len,
                       vrb_local_t l, uint64_t raddr, uint32_t rkey, hixl_req_t *req, vrb_op_t *out,
                       size_t cap)
{
  bool inl = write && len <= vc->max_inline && !l.dev;
  size_t step = !l.lkey ? VRB_BOUNCE_SIZE : write ? VRB_MAX_WR_LEN : vc->read_chunk;
  size_t n = 0;
  for (size_t done = 0; done < len && n < cap; n++) {
    size_t m = len - done < step ? len - done : step;
    vrb_op_t *o = &out[n];
    memset(o, 0, offsetof(vrb_op_t, data));
    o->local = local + done;
    o->len = (uint32_t)m;
    if (inl)
      memcpy(o->data, o->local, m);
    o->lkey = l.lkey;
    o->inl = inl;
    o->dev = l.dev;
    o->raddr = raddr + done;
    o->rkey = rkey;
    o->kind = write ? VRB_WR_PUT : VRB_WR_GET;
    o->opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    if (l.rent) {
      hixl__vrb_rcache_ref(l.rent);
      o->rent = l.rent;
    }
    op_begin(vp, o, req);
    done += m;
  }
  return n;
}

/* One transfer on q (or striped when q is NULL and it is large), in chunks of
 * VRB_CHAIN ops.  l's own reference is dropped here. */
static void transfer(vrb_peer_t *vp, vrb_qp_t *q, bool write, uint8_t *local, size_t len,
                     vrb_local_t l, uint64_t raddr, uint32_t rkey, const uint32_t *imm,
                     hixl_req_t *req)
{
  vrb_ctx_t *vc = hixl__vc(vp->peer->ctx);
  vrb_op_t ops[VRB_CHAIN];
  if (q == NULL && vp->nq > 1 && l.lkey && len >= VRB_STRIPE_MIN) {
    /* One piece per QP, 4 KiB aligned; each piece holds its own reference
     * on the cache entry (dropped by that call), ours is dropped below. */
    size_t piece = ((len + (size_t)vp->nq - 1) / (size_t)vp->nq + 4095) & ~(size_t)4095;
    uint32_t first = atomic_fetch_add_explicit(&vp->rr, 1, memory_order_relaxed);
    for (size_t done = 0, i = 0; done < len; i++) {
      size_t m = len - done < piece ? len - done : piece;
      if (l.rent)
        hixl__vrb_rcache_ref(l.rent);
      transfer(vp, vp->qps[(first + i) % (uint32_t)vp->nq], write, local + done, m, l, raddr + done,
               rkey, NULL, req);
      done += m;
    }
    if (l.rent)
      hixl__vrb_rcache_put(l.rent);
    return;
  }
  if (q == NULL)
    q = pick_qp(vp);
  for (size_t done = 0; done < len;) {
    size_t n = describe(vc, vp, write, local + done, len - done, l, raddr + done, rkey, req, ops,
                        VRB_CHAIN);
    size_t moved = 0;
    for (size_t i = 0; i < n; i++)
      moved += ops[i].len;
    done += moved;
    if (imm && done == len) { /* the last piece carries the immediate */
      ops[n - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      ops[n - 1].imm = *imm;
    }
    submit(q, ops, n);
  }
  if (l.rent)
    hixl__vrb_rcache_put(l.rent);
}

/* ------------------------------------------------------------ operations */

hixl_status_t hixl__vrb_put(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                            uint64_t off, hixl_req_t *req)
{
  vrb_ctx_t *vc = hixl__vc(peer->ctx);
  transfer(peer->tp, NULL, true, (uint8_t *)(uintptr_t)src, len, local_key(vc, true, src, len),
           rmr->base + off, (uint32_t)rmr->tp_key[0], NULL, req);
  return HIXL_OK;
}

hixl_status_t hixl__vrb_get(hixl_peer_t *peer, void *dst, size_t len, hixl_rmr_t *rmr, uint64_t off,
                            hixl_req_t *req)
{
  vrb_ctx_t *vc = hixl__vc(peer->ctx);
  transfer(peer->tp, NULL, false, dst, len, local_key(vc, false, dst, len), rmr->base + off,
           (uint32_t)rmr->tp_key[0], NULL, req);
  return HIXL_OK;
}

static void notify_op(vrb_op_t *o, uint32_t imm, uint64_t len)
{
  memset(o, 0, offsetof(vrb_op_t, data));
  o->kind = VRB_WR_SEND;
  o->opcode = IBV_WR_SEND;
  o->inl = true;
  o->len = 16;
  uint32_t imm_le = htole32(imm);
  uint64_t len_le = htole64(len);
  memcpy(o->data, &imm_le, 4);
  memset(o->data + 4, 0, 4);
  memcpy(o->data + 8, &len_le, 8);
}

hixl_status_t hixl__vrb_notify(hixl_peer_t *peer, uint32_t imm, uint64_t len, hixl_req_t *req)
{
  vrb_peer_t *vp = peer->tp;
  vrb_op_t o;
  notify_op(&o, imm, len);
  op_begin(vp, &o, req);
  submit(vp->qps[0], &o, 1);
  return HIXL_OK;
}

hixl_status_t hixl__vrb_put_imm(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                                uint64_t off, uint32_t imm, hixl_req_t *req)
{
  /* WRITE_WITH_IMM when the put is one work request (the target takes imm
   * and the length from its receive completion); else the pieces, then a
   * notification SEND carrying the total length.  All on QP 0. */
  vrb_peer_t *vp = peer->tp;
  vrb_ctx_t *vc = hixl__vc(peer->ctx);
  vrb_local_t l = local_key(vc, true, src, len);
  bool one = len <= VRB_MAX_WR_LEN && (l.lkey != 0 || len <= VRB_BOUNCE_SIZE);
  transfer(vp, vp->qps[0], true, (uint8_t *)(uintptr_t)src, len, l, rmr->base + off,
           (uint32_t)rmr->tp_key[0], one ? &imm : NULL, req);
  return one ? HIXL_OK : hixl__vrb_notify(peer, imm, len, req);
}

hixl_status_t hixl__vrb_batch(hixl_peer_t *peer, const hixl_xfer_t *xfers, size_t n, bool is_put,
                              const uint32_t *imm, uint64_t total, hixl_req_t *req)
{
  vrb_peer_t *vp = peer->tp;
  vrb_ctx_t *vc = hixl__vc(peer->ctx);
  /* With a notification: all on QP 0 (see the top).  Without, and with
   * several QPs: the batch cut in nq contiguous runs, one per QP. */
  int nq = imm ? 1 : vp->nq;
  uint32_t first = nq > 1 ? atomic_fetch_add_explicit(&vp->rr, 1, memory_order_relaxed) : 0;
  size_t per = (n + (size_t)nq - 1) / (size_t)nq;
  for (int r = 0; r < nq; r++) {
    vrb_qp_t *q = vp->qps[(first + (uint32_t)r) % (uint32_t)vp->nq];
    size_t lo = (size_t)r * per, hi = lo + per < n ? lo + per : n;
    vrb_op_t ops[VRB_CHAIN];
    size_t k = 0;
    for (size_t i = lo; i < hi; i++) {
      const hixl_xfer_t *x = &xfers[i];
      vrb_local_t l = local_key(vc, is_put, x->local, x->len);
      for (size_t done = 0; done < x->len;) {
        if (k == VRB_CHAIN) {
          submit(q, ops, k);
          k = 0;
        }
        size_t got = describe(vc, vp, is_put, (uint8_t *)x->local + done, x->len - done, l,
                              x->rmr->base + x->off + done, (uint32_t)x->rmr->tp_key[0], req,
                              ops + k, VRB_CHAIN - k);
        for (size_t j = 0; j < got; j++)
          done += ops[k + j].len;
        k += got;
      }
      if (l.rent)
        hixl__vrb_rcache_put(l.rent);
    }
    if (imm && k < VRB_CHAIN) { /* the notification rides in the same chain */
      notify_op(&ops[k], *imm, total);
      op_begin(vp, &ops[k], req);
      k++;
      imm = NULL;
    }
    if (k)
      submit(q, ops, k);
  }
  return imm ? hixl__vrb_notify(peer, *imm, total, req) : HIXL_OK;
}

hixl_status_t hixl__vrb_atomic(hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off, int op, uint64_t a,
                               uint64_t b, uint64_t *old_p, hixl_req_t *req)
{
  (void)old_p;
  if (req == NULL)
    return HIXL_INPROGRESS;
  vrb_peer_t *vp = peer->tp;
  vrb_op_t o;
  memset(&o, 0, offsetof(vrb_op_t, data));
  o.kind = VRB_WR_AMO;
  o.opcode = op == HIXL_AMO_FAA ? IBV_WR_ATOMIC_FETCH_AND_ADD : IBV_WR_ATOMIC_CMP_AND_SWP;
  o.len = 8;
  o.raddr = rmr->base + off;
  o.rkey = (uint32_t)rmr->tp_key[0];
  o.cmp = a;
  o.swap = b;
  op_begin(vp, &o, req);
  submit(pick_qp(vp), &o, 1);
  return HIXL_INPROGRESS;
}

/* ------------------------------------------------------------ completions */

/* What a work-completion status usually means, and what to check. */
static const char *wc_hint(enum ibv_wc_status s)
{
  switch (s) {
  case IBV_WC_RETRY_EXC_ERR:
    return "the peer's NIC did not acknowledge within the retries: the peer host or NIC is gone, "
           "or the path drops packets (link down, a GID index or RoCE version the other side "
           "cannot route: HIXL_GID_INDEX; MTU; PFC/ECN drops); check ibv_devinfo port state "
           "on both hosts and ib_write_bw between them";
  case IBV_WC_RNR_RETRY_EXC_ERR:
    return "the peer had no receive posted for the retries (receiver not ready): it stopped "
           "taking messages or is overloaded";
  case IBV_WC_REM_ACCESS_ERR:
    return "the peer's NIC refused the access: the region was deregistered or re-registered "
           "(a stale rkey) or its rights changed; look the region up again";
  case IBV_WC_REM_INV_REQ_ERR:
    return "the peer's NIC rejected the request: a length or operation its QP does not allow "
           "(atomics need 8-byte alignment and remote atomic access)";
  case IBV_WC_REM_OP_ERR:
    return "the peer's NIC could not complete the operation (its QP went into error)";
  case IBV_WC_LOC_PROT_ERR:
    return "a local buffer was not registered for this access or was unmapped while the "
           "operation was in flight";
  case IBV_WC_LOC_LEN_ERR:
  case IBV_WC_LOC_QP_OP_ERR:
    return "the local QP rejected the request (a length or opcode beyond its limits)";
  case IBV_WC_WR_FLUSH_ERR:
    return "flushed: the QP had already gone into error after an earlier failure, which is "
           "the cause";
  default: return "see the NIC's kernel log (dmesg) and its vendor error code";
  }
}

/* A failed completion: the status for the request, and a message that the
 * peer keeps as the reason it was lost (every later call says it) naming
 * the operation, the status and vendor code, where it went (NIC, port, GID
 * index, the peer's GID, from the QP itself) and the usual cause.  Only the
 * first failure of an up peer gets all that: the flush that follows (up to
 * every posted request of every QP, under poll_lock) gets one line each. */
static HIXL_COLD hixl_status_t wc_fail(const struct ibv_wc *wc, const vrb_wqe_t *e)
{
  hixl_peer_t *peer = e->q->vp->peer;
  vrb_ctx_t *vc = hixl__vc(peer->ctx);
  hixl_status_t st = wc->status == IBV_WC_RETRY_EXC_ERR || wc->status == IBV_WC_RNR_RETRY_EXC_ERR ||
                             wc->status == IBV_WC_WR_FLUSH_ERR
                         ? HIXL_ERR_PEER_LOST
                     : wc->status == IBV_WC_REM_ACCESS_ERR ? HIXL_ERR_ACCESS
                                                           : HIXL_ERR_TRANSPORT;
  if (atomic_load_explicit(&peer->state, memory_order_relaxed) != HIXL_PEER_UP)
    return hixl__err(st, "verbs: work request to %s failed: %s", peer->name,
                     ibv_wc_status_str(wc->status));
  static const char *const kinds[] = {"put (RDMA WRITE)", "get (RDMA READ)", "atomic",
                                      "notification (SEND)"};
  char dgid[INET6_ADDRSTRLEN] = "?";
  struct ibv_qp_attr a;
  struct ibv_qp_init_attr ia;
  if (e->q->qp && ibv_query_qp(e->q->qp, &a, IBV_QP_AV, &ia) == 0) {
    if (a.ah_attr.is_global)
      inet_ntop(AF_INET6, a.ah_attr.grh.dgid.raw, dgid, sizeof(dgid));
    else /* InfiniBand without a GRH: the LID is the address */
      snprintf(dgid, sizeof(dgid), "none (LID %u)", a.ah_attr.dlid);
  }
  char tail[sizeof(peer->lost_why) - 48], why[sizeof(peer->lost_why)];
  const char *what = e->kind < 4 ? kinds[e->kind] : "work request";
  snprintf(tail, sizeof(tail),
           "%s (status %d, vendor error %#x) on %s port %u GID index %d, to GID %s QP %u: %s",
           ibv_wc_status_str(wc->status), (int)wc->status, wc->vendor_err, vc ? vc->name : "?",
           vc ? vc->port : 0, vc ? vc->gid_index : -1, dgid, e->q->qp ? e->q->qp->qp_num : 0,
           wc_hint(wc->status));
  snprintf(why, sizeof(why), "verbs: a %s failed: %s", what, tail);
  hixl__err(st, "verbs: a %s to peer %s failed: %s", what, peer->name, tail);
  hixl__peer_lost_async(peer, why); /* the QP is in error now */
  return st;
}

/* A completion for e: retire everything on its QP up to and including e. */
static void complete(vrb_ctx_t *vc, vrb_wqe_t *e, hixl_status_t st)
{
  vrb_qp_t *q = e->q;
  vrb_peer_t *vp = q->vp;
  pthread_mutex_lock(&vp->lock);
  uint32_t slot = (uint32_t)(e - q->wqe);
  uint32_t count = (slot - q->tail % VRB_SQ_DEPTH + VRB_SQ_DEPTH) % VRB_SQ_DEPTH + 1;
  if (count <= q->head - q->tail) { /* else: already retired (cannot happen) */
    for (uint32_t i = 0; i < count; i++) {
      vrb_wqe_t *x = &q->wqe[q->tail % VRB_SQ_DEPTH];
      retire_one(vc, vp, x, x == e ? st : HIXL_OK);
    }
  }
  /* Every QP of the peer: a ring slot or bounce buffer just freed may be
   * what one of them waits for (other peers' QPs: bounce_kick). */
  bool ok = st == HIXL_OK && atomic_load(&vp->peer->state) == HIXL_PEER_UP;
  for (int i = 0; i < vp->nq; i++) {
    if (ok)
      drain(vp->qps[i]);
    else
      fail_queued(vp, vp->qps[i], HIXL_ERR_PEER_LOST);
  }
  pthread_mutex_unlock(&vp->lock);
}

/* Bounce buffers came back: restart the QPs waiting for one, oldest first,
 * while there are buffers (poll_lock held, so that no peer's close frees
 * a QP on the list meanwhile: hixl__vrb_drain_peer takes it out under the
 * same lock).  A QP that finds none again goes back at the end. */
static void bounce_kick(vrb_ctx_t *vc)
{
  int n = atomic_load(&vc->n_bounce_waiting);
  for (int i = 0; i < n; i++) {
    pthread_mutex_lock(&vc->bounce_lock);
    vrb_qp_t *q = vc->n_bounce_free > 0 ? vc->bw_head : NULL;
    if (q) {
      vc->bw_head = q->bw_next;
      if (vc->bw_head == NULL)
        vc->bw_tail = NULL;
      q->bw_waiting = false;
      atomic_fetch_sub(&vc->n_bounce_waiting, 1);
    }
    pthread_mutex_unlock(&vc->bounce_lock);
    if (q == NULL)
      return;
    vrb_peer_t *vp = q->vp;
    pthread_mutex_lock(&vp->lock);
    if (atomic_load(&vp->peer->state) == HIXL_PEER_UP)
      drain(q);
    else
      fail_queued(vp, q, HIXL_ERR_PEER_LOST);
    pthread_mutex_unlock(&vp->lock);
  }
}

int hixl__vrb_progress(hixl_ctx_t *ctx)
{
  vrb_ctx_t *vc = hixl__vc(ctx);
  if (vc == NULL || pthread_mutex_trylock(&vc->poll_lock) != 0)
    return 0;
  struct ibv_wc wcs[32];
  int total = 0, n;
  int ncq = atomic_load_explicit(&vc->n_scqs, memory_order_acquire);
  /* At most VRB_PROGRESS_MAX completions a CQ a call: each may post what
   * its room lets out of a software queue, so with a backlog draining at
   * the other end's pace the loop could otherwise run for seconds, and the
   * control thread (which calls this for a backlog) would answer nobody
   * meanwhile.  Callers call again. */
  for (int c = 0; c < ncq; c++)
    for (int done = 0; done < VRB_PROGRESS_MAX && (n = ibv_poll_cq(vc->scqs[c].cq, 32, wcs)) > 0;
         done += n) {
      for (int i = 0; i < n; i++) {
        vrb_wqe_t *e = (vrb_wqe_t *)(uintptr_t)wcs[i].wr_id;
        complete(vc, e,
                 hixl_likely(wcs[i].status == IBV_WC_SUCCESS) ? HIXL_OK : wc_fail(&wcs[i], e));
      }
      total += n;
    }
  if (atomic_load_explicit(&vc->n_bounce_waiting, memory_order_relaxed) > 0)
    bounce_kick(vc);
  pthread_mutex_unlock(&vc->poll_lock);
  return total;
}

static bool flushed(void *arg)
{
  vrb_peer_t *vp = arg;
  if (atomic_load(&vp->outstanding) == 0)
    return true;
  hixl__vrb_progress(vp->peer->ctx);
  return atomic_load(&vp->outstanding) == 0;
}

bool hixl__vrb_drain_peer(vrb_peer_t *vp)
{
  hixl_ctx_t *ctx = vp->peer->ctx;
  vrb_ctx_t *vc = hixl__vc(ctx);
  /* Nothing queued is posted any more. */
  pthread_mutex_lock(&vp->lock);
  for (int i = 0; i < vp->nq; i++)
    fail_queued(vp, vp->qps[i], HIXL_ERR_PEER_LOST);
  pthread_mutex_unlock(&vp->lock);
  /* The QPs are in ERROR: the flush completes what was posted (the last
   * request of every post is signaled, so its flush retires the rest). */
  hixl__wait(ctx, hixl__deadline(2000), 0, flushed, vp);
  bool clean = atomic_load(&vp->outstanding) == 0;
  pthread_mutex_lock(&vc->poll_lock);   /* no completion handler is running now */
  pthread_mutex_lock(&vc->bounce_lock); /* out of the bounce waiters: vp goes */
  for (vrb_qp_t **pp = &vc->bw_head, *prev = NULL; *pp;) {
    vrb_qp_t *q = *pp;
    if (q->vp != vp) {
      prev = q;
      pp = &q->bw_next;
      continue;
    }
    *pp = q->bw_next;
    if (vc->bw_tail == q)
      vc->bw_tail = prev;
    q->bw_waiting = false;
    atomic_fetch_sub(&vc->n_bounce_waiting, 1);
  }
  pthread_mutex_unlock(&vc->bounce_lock);
  pthread_mutex_lock(&vp->lock);
  for (int i = 0; i < vp->nq; i++) {
    vrb_qp_t *q = vp->qps[i];
    while (q->head != q->tail)
      retire_one(vc, vp, &q->wqe[q->tail % VRB_SQ_DEPTH], HIXL_ERR_PEER_LOST);
  }
  pthread_mutex_unlock(&vp->lock);
  pthread_mutex_unlock(&vc->poll_lock);
  return clean;
}

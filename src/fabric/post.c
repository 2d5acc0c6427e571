/* SPDX-License-Identifier: MIT */
/*
 * The fabric data path (see fabric.c for what is emulated and why).
 *
 * Every operation is one or more posted libfabric operations, each with an
 * operation context from a free list (fab_op_t: its fi_context2 first) that
 * the completion hands back; each is a part of the hixl request.  A post
 * that meets -FI_EAGAIN (queues full) drives completions and tries again,
 * bounded by hixl__issue_wait_ms (past the liveness period).
 *
 * Completions and notification receives are read under poll_lock, by
 * whoever drives progress (a caller's hixl_progress or blocking wait, or
 * the context's progress thread).  The progress thread sleeps on the CQ's
 * wait fd (manual-progress providers like tcp wake it when bytes arrive),
 * so a target that never calls hixl still applies incoming writes and
 * answers reads: one-sided from the user's point of view.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fabric_int.h"

/* ------------------------------------------------------------ op contexts */

#define OPS_PER_CHUNK 256

static fab_op_t *op_get(fab_ctx_t *fc)
{
  pthread_mutex_lock(&fc->op_lock);
  if (fc->op_free == NULL) { /* grow: only until the pool covers what is in flight */
    fab_op_t *chunk = calloc(OPS_PER_CHUNK, sizeof(*chunk));
    fab_op_t **v = chunk ? realloc(fc->op_chunks, (fc->n_op_chunks + 1) * sizeof(*v)) : NULL;
    if (v == NULL) {
      free(chunk);
      pthread_mutex_unlock(&fc->op_lock);
      return NULL;
    }
    fc->op_chunks = v;
    fc->op_chunks[fc->n_op_chunks++] = chunk;
    for (int i = 0; i < OPS_PER_CHUNK; i++) {
      chunk[i].next = fc->op_free;
      fc->op_free = &chunk[i];
    }
  }
  fab_op_t *op = fc->op_free;
  fc->op_free = op->next;
  pthread_mutex_unlock(&fc->op_lock);
  memset(op, 0, sizeof(*op));
  return op;
}

static void op_put(fab_ctx_t *fc, fab_op_t *op)
{
  if (op->tmp_mr)
    fi_close(&op->tmp_mr->fid);
  free(op->bounce);
  op->tmp_mr = NULL;
  op->bounce = NULL;
  pthread_mutex_lock(&fc->op_lock);
  op->next = fc->op_free;
  fc->op_free = op;
  pthread_mutex_unlock(&fc->op_lock);
}

void hixl__fab_ops_free(fab_ctx_t *fc)
{
  for (size_t i = 0; i < fc->n_op_chunks; i++)
    free(fc->op_chunks[i]);
  free(fc->op_chunks);
  fc->op_chunks = NULL;
  fc->n_op_chunks = 0;
}

/* ------------------------------------------------------------ posting */

/* The descriptor a local buffer needs (FI_MR_LOCAL only): a hixl region's,
 * else a registration for this operation alone. */
static hixl_status_t local_desc(fab_ctx_t *fc, fab_op_t *op, void *buf, size_t len, void **desc_p)
{
  *desc_p = NULL;
  if (!fc->mr_local)
    return HIXL_OK;
  if ((*desc_p = hixl__fab_region_desc(fc, buf, len)) != NULL)
    return HIXL_OK;
  int rc = hixl__fab_mr_reg(fc, buf, len, FI_READ | FI_WRITE | FI_SEND | FI_RECV, &op->tmp_mr);
  if (rc)
    return hixl__fab_err(HIXL_ERR_NOMEM, "fi_mr_reg (a local buffer)", rc);
  *desc_p = fi_mr_desc(op->tmp_mr);
  return HIXL_OK;
}

/* Take a part of req for op (it completes, or fails, exactly once). */
static void op_begin(fab_op_t *op, int kind, fab_peer_t *fp, hixl_req_t *req, size_t len)
{
  op->kind = kind;
  op->fp = fp;
  op->req = req;
  op->len = len;
  hixl__req_part_add(req);
  atomic_fetch_add(&fp->outstanding, 1);
}

static void op_finish(fab_ctx_t *fc, fab_op_t *op, hixl_status_t st)
{
  hixl_req_t *req = op->req;
  fab_peer_t *fp = op->fp;
  if (st == HIXL_OK && op->dev_dst)
    st = hixl__dev_copy(op->dev_dst, op->bounce, op->len);
  if (op->kind == FAB_OP_AMO) {
    if (st == HIXL_OK && req->old_p)
      *req->old_p = op->result;
    req->old_p = NULL; /* written above; completing must not overwrite it */
  }
  op_put(fc, op);
  if (atomic_fetch_sub(&fp->outstanding, 1) == 1) /* the last reference: closed before */
    hixl__fab_orphan_free(fc, fp);
  atomic_fetch_add(&fc->finished, 1); /* queues have room: see wait_finished */
  hixl__req_part_done(req, st);       /* wakes sleeping waiters */
}

typedef struct fin_wait {
  fab_ctx_t *fc;
  hixl_peer_t *peer;
  uint64_t seen;
} fin_wait_t;

static bool finished_since(void *arg)
{
  fin_wait_t *w = arg;
  if (atomic_load(&w->fc->finished) != w->seen || atomic_load(&w->peer->state) != HIXL_PEER_UP)
    return true;
  hixl__fab_progress(w->peer->ctx);
  return atomic_load(&w->fc->finished) != w->seen;
}

/* The provider said EAGAIN: an operation of the context finishing (after
 * seen was read) makes room, but so may progress that completes nothing
 * of ours (rxm setting up a connection).  So poll, then sleep until any
 * event or 1 ms, and let the caller try again: there is no event for
 * "room again" in libfabric, and a full queue is rare and brief. */
static void wait_finished(fab_ctx_t *fc, hixl_peer_t *peer, uint64_t seen, int64_t deadline)
{
  fin_wait_t w = {fc, peer, seen};
  hixl__wait_step(peer->ctx, deadline, 1, finished_since, &w);
}

/* Post with fn until it is not -FI_EAGAIN (completions are driven between
 * tries), bounded by hixl__issue_wait_ms: past the liveness period, so
 * that queues full because the peer stopped answering end with PEER_LOST
 * once it is declared lost.  Bounded by the timeout itself the two raced,
 * and the caller heard AGAIN (hixl-soak seed 18006); AGAIN is now left for
 * a live peer whose queues stay full. */
#define POST(fc, peer, what, call)                                                                 \
  ({                                                                                               \
    ssize_t rc_;                                                                                   \
    int64_t dl_ = 0;                                                                               \
    uint64_t seen_;                                                                                \
    while ((seen_ = atomic_load(&(fc)->finished)), (rc_ = (call)) == -FI_EAGAIN) {                 \
      if (dl_ == 0)                                                                                \
        dl_ = hixl__deadline(hixl__issue_wait_ms((peer)->ctx));                                    \
      if (atomic_load(&(peer)->state) != HIXL_PEER_UP || hixl__expired(dl_))                       \
        break;                                                                                     \
      wait_finished(fc, peer, seen_, dl_);                                                         \
    }                                                                                              \
    rc_ == 0                                      ? HIXL_OK                                        \
    : atomic_load(&(peer)->state) != HIXL_PEER_UP ? hixl__peer_state_err("fabric", (peer), NULL)   \
    : rc_ == -FI_EAGAIN ? hixl__err(HIXL_ERR_AGAIN, "fabric: %s: queues full for %d ms", what,     \
                                    hixl__issue_wait_ms((peer)->ctx))                              \
                        : hixl__fab_err(HIXL_ERR_TRANSPORT, what, rc_);                            \
  })

/* One RMA transfer of at most max_msg bytes. */
static hixl_status_t post_rma(hixl_peer_t *peer, bool write, uint8_t *local, size_t len,
                              uint64_t raddr, uint64_t key, hixl_req_t *req)
{
  fab_ctx_t *fc = hixl__fc(peer->ctx);
  fab_peer_t *fp = peer->tp;
  fab_op_t *op = op_get(fc);
  if (op == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "fabric: no memory for an operation");
  void *buf = local;
  hixl_status_t st = HIXL_OK;
  if (hixl_unlikely(hixl__is_dev(local))) {
    /* No FI_HMEM: device memory goes through host memory. */
    op->bounce = malloc(len);
    if (op->bounce == NULL)
      st = hixl__err(HIXL_ERR_NOMEM, "fabric: no memory to stage %zu bytes", len);
    else if (write)
      st = hixl__dev_copy(op->bounce, local, len);
    else
      op->dev_dst = local;
    buf = op->bounce;
  }
  void *desc = NULL;
  if (st == HIXL_OK)
    st = local_desc(fc, op, buf, len, &desc);
  if (st != HIXL_OK) {
    op_put(fc, op);
    return st;
  }
  op_begin(op, write ? FAB_OP_WRITE : FAB_OP_READ, fp, req, len);
  struct iovec iov = {buf, len};
  struct fi_rma_iov rma = {raddr, len, key};
  struct fi_msg_rma msg = {.msg_iov = &iov,
                           .desc = &desc,
                           .iov_count = 1,
                           .addr = fp->fa,
                           .rma_iov = &rma,
                           .rma_iov_count = 1,
                           .context = &op->fctx};
  st = write ? POST(fc, peer, "fi_writemsg", fi_writemsg(fc->ep, &msg, fc->tx_flags))
             : POST(fc, peer, "fi_readmsg", fi_readmsg(fc->ep, &msg, FI_COMPLETION));
  if (st != HIXL_OK)
    op_finish(fc, op, st);
  return st;
}

static hixl_status_t transfer(hixl_peer_t *peer, bool write, uint8_t *local, size_t len,
                              hixl_rmr_t *rmr, uint64_t off, hixl_req_t *req)
{
  fab_ctx_t *fc = hixl__fc(peer->ctx);
  uint64_t raddr = rmr->tp_key[1] + off;
  hixl_status_t st = HIXL_OK;
  for (size_t done = 0; done < len && st == HIXL_OK;) {
    size_t n = len - done < fc->max_msg ? len - done : fc->max_msg;
    st = post_rma(peer, write, local + done, n, raddr + done, rmr->tp_key[0], req);
    done += n;
  }
  /* Without delivery completion: a read of the last byte, ordered behind
   * the writes (FI_ORDER_RAW), completes only once they are visible. */
  if (st == HIXL_OK && write && !fc->dc) {
    fab_op_t *op = op_get(fc);
    if (op == NULL)
      return hixl__err(HIXL_ERR_NOMEM, "fabric: no memory for an operation");
    void *desc = NULL;
    if ((st = local_desc(fc, op, &op->result, 1, &desc)) != HIXL_OK) {
      op_put(fc, op);
      return st;
    }
    op_begin(op, FAB_OP_READ, peer->tp, req, 1);
    st = POST(fc, peer, "fi_read",
              fi_read(fc->ep, &op->result, 1, desc, ((fab_peer_t *)peer->tp)->fa, raddr + len - 1,
                      rmr->tp_key[0], &op->fctx));
    if (st != HIXL_OK)
      op_finish(fc, op, st);
  }
  return st;
}

hixl_status_t hixl__fab_put(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                            uint64_t off, hixl_req_t *req)
{
  return transfer(peer, true, (uint8_t *)(uintptr_t)src, len, rmr, off, req);
}

hixl_status_t hixl__fab_get(hixl_peer_t *peer, void *dst, size_t len, hixl_rmr_t *rmr, uint64_t off,
                            hixl_req_t *req)
{
  return transfer(peer, false, dst, len, rmr, off, req);
}

/* Everything issued to fp so far has completed (drives completions;
 * bounded by the context timeout). */
static bool quiet(void *arg)
{
  fab_peer_t *fp = arg;
  for (int pass = 0; pass < 2; pass++) {
    if (fab_inflight(fp) == 0 || atomic_load(&fp->peer->state) != HIXL_PEER_UP)
      return true;
    if (pass == 0)
      hixl__fab_progress(fp->peer->ctx);
  }
  return false;
}

/* Waits past the liveness period (hixl__issue_wait_ms). */
static hixl_status_t wait_quiet(hixl_peer_t *peer, fab_peer_t *fp)
{
  if (fab_inflight(fp) == 0)
    return HIXL_OK;
  int ms = hixl__issue_wait_ms(peer->ctx);
  hixl__wait(peer->ctx, hixl__deadline(ms), 0, quiet, fp);
  if (fab_inflight(fp) == 0)
    return HIXL_OK;
  if (atomic_load(&peer->state) != HIXL_PEER_UP)
    return hixl__peer_state_err("fabric", peer, NULL);
  return hixl__err(HIXL_ERR_TIMEOUT, "fabric: operations to %s did not complete in %d ms",
                   peer->name, ms);
}

hixl_status_t hixl__fab_notify(hixl_peer_t *peer, uint32_t imm, uint64_t len, hixl_req_t *req)
{
  fab_ctx_t *fc = hixl__fc(peer->ctx);
  fab_peer_t *fp = peer->tp;
  /* A provider that does not deliver sends after earlier writes and sends:
   * the notification waits until everything before it has completed. */
  hixl_status_t st = fc->ordered ? HIXL_OK : wait_quiet(peer, fp);
  if (st != HIXL_OK)
    return st;
  fab_op_t *op = op_get(fc);
  if (op == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "fabric: no memory for an operation");
  op->msg = (fab_msg_t){.magic = htole32(FAB_MSG_MAGIC),
                        .imm = htole32(imm),
                        .len = htole64(len),
                        .sender = htole64(peer->ctx->id),
                        .cookie = htole64(fp->tx_cookie)};
  void *desc = NULL;
  bool inject = fc->info->tx_attr->inject_size >= FAB_MSG_SIZE;
  if (!inject && (st = local_desc(fc, op, &op->msg, FAB_MSG_SIZE, &desc)) != HIXL_OK) {
    op_put(fc, op);
    return st;
  }
  op_begin(op, FAB_OP_SEND, fp, req, FAB_MSG_SIZE);
  struct iovec iov = {&op->msg, FAB_MSG_SIZE};
  struct fi_msg msg = {
      .msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = fp->fa, .context = &op->fctx};
  st = POST(fc, peer, "fi_sendmsg",
            fi_sendmsg(fc->ep, &msg, FI_COMPLETION | (inject ? FI_INJECT : 0)));
  if (st != HIXL_OK)
    op_finish(fc, op, st);
  return st;
}

hixl_status_t hixl__fab_put_imm(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                                uint64_t off, uint32_t imm, hixl_req_t *req)
{
  hixl_status_t st = hixl__fab_put(peer, src, len, rmr, off, req);
  return st == HIXL_OK ? hixl__fab_notify(peer, imm, len, req) : st;
}

/* Executed by the owner's control thread (no native atomics): atomic with
 * respect to the owner and every other peer's atomics.  Asynchronous, like
 * every operation: the request completes with the reply, or with
 * PEER_LOST when the peer is lost.  It was a call that blocked the issuer
 * until the reply or the context's timeout, and a target stopped for
 * longer than that made it return TIMEOUT at issue -- racing the loss,
 * which the liveness check declares after the same period (hixl-soak over
 * fabric found it; docs/reliability.md). */
static hixl_status_t owner_atomic(hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off, int op,
                                  uint64_t a, uint64_t b, hixl_req_t *req)
{
  if (rmr->flags & HIXL_REGF_DEVICE)
    return hixl__err(HIXL_ERR_UNSUPPORTED,
                     "fabric: peer %s cannot run an atomic in its device memory", peer->name);
  return hixl__owner_atomic("fabric", peer, rmr, off, op, a, b, req, true);
}

hixl_status_t hixl__fab_atomic(hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off, int op, uint64_t a,
                               uint64_t b, uint64_t *old_p, hixl_req_t *req)
{
  (void)old_p; /* req->old_p receives the old value */
  if (req == NULL)
    return HIXL_INPROGRESS;
  fab_ctx_t *fc = hixl__fc(peer->ctx);
  if (!fc->atomics || fc->mr_local)
    return owner_atomic(peer, rmr, off, op, a, b, req);
  fab_peer_t *fp = peer->tp;
  fab_op_t *o = op_get(fc);
  if (o == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "fabric: no memory for an operation");
  op_begin(o, FAB_OP_AMO, fp, req, 8);
  uint64_t raddr = rmr->tp_key[1] + off;
  hixl_status_t st;
  if (op == HIXL_AMO_FAA) {
    o->operand = a;
    st = POST(fc, peer, "fi_fetch_atomic",
              fi_fetch_atomic(fc->ep, &o->operand, 1, NULL, &o->result, NULL, fp->fa, raddr,
                              rmr->tp_key[0], FI_UINT64, FI_SUM, &o->fctx));
  } else {
    o->compare = a;
    o->operand = b;
    st = POST(fc, peer, "fi_compare_atomic",
              fi_compare_atomic(fc->ep, &o->operand, 1, NULL, &o->compare, NULL, &o->result, NULL,
                                fp->fa, raddr, rmr->tp_key[0], FI_UINT64, FI_CSWAP, &o->fctx));
  }
  if (st != HIXL_OK)
    op_finish(fc, o, st);
  return st == HIXL_OK ? HIXL_INPROGRESS : st;
}

/* ------------------------------------------------------------ completions */

hixl_status_t hixl__fab_post_recvs(fab_ctx_t *fc)
{
  void *desc = fc->rbufs_mr ? fi_mr_desc(fc->rbufs_mr) : NULL;
  for (int i = 0; i < FAB_RECV_COUNT; i++) {
    ssize_t rc = fi_recv(fc->ep, fc->rbufs + (size_t)i * FAB_MSG_SIZE, FAB_MSG_SIZE, desc,
                         FI_ADDR_UNSPEC, &fc->rctx[i]);
    if (rc)
      return hixl__fab_err(HIXL_ERR_TRANSPORT, "fi_recv", rc);
  }
  return HIXL_OK;
}

static int recv_index(fab_ctx_t *fc, void *op_context)
{
  struct fi_context2 *c = op_context;
  if (c < fc->rctx || c >= fc->rctx + FAB_RECV_COUNT)
    return -1;
  return (int)(c - fc->rctx);
}

static void repost(fab_ctx_t *fc, int i)
{
  void *desc = fc->rbufs_mr ? fi_mr_desc(fc->rbufs_mr) : NULL;
  ssize_t rc;
  while ((rc = fi_recv(fc->ep, fc->rbufs + (size_t)i * FAB_MSG_SIZE, FAB_MSG_SIZE, desc,
                       FI_ADDR_UNSPEC, &fc->rctx[i])) == -FI_EAGAIN)
    fi_cq_read(fc->cq, NULL, 0);
  if (rc)
    hixl_warn("fabric: reposting a receive: %s", fi_strerror((int)-rc));
}

/* Deliver one notification that came from src; false when its peer's ring
 * is full (poll_lock).  Only a bound peer's, by its address and cookie. */
static bool deliver(fab_ctx_t *fc, const fab_msg_t *m, fi_addr_t src)
{
  if (le32toh(m->magic) != FAB_MSG_MAGIC) {
    fab_dropped(fc);
    return true; /* not ours: dropped */
  }
  hixl_peer_t *p = hixl__fab_sender(fc, src, le64toh(m->cookie));
  if (p == NULL)
    return true; /* gone */
  return hixl__inbox_push(p, le32toh(m->imm), le64toh(m->len));
}

/* Retry what found a ring full, in arrival order: the kept messages, then
 * the parked buffers (reposted as they are delivered).  True when all went. */
static bool deliver_pending(fab_ctx_t *fc)
{
  int k = 0;
  while (k < fc->n_pend && deliver(fc, &fc->pend[k].m, fc->pend[k].src))
    k++;
  memmove(fc->pend, fc->pend + k, (size_t)(fc->n_pend - k) * sizeof(fc->pend[0]));
  fc->n_pend -= k;
  if (fc->n_pend)
    return false;
  int j = 0;
  while (j < fc->n_parked) {
    fab_msg_t m;
    memcpy(&m, fc->rbufs + (size_t)fc->parked[j] * FAB_MSG_SIZE, sizeof(m));
    if (!deliver(fc, &m, fc->parked_src[fc->parked[j]]))
      break;
    repost(fc, fc->parked[j++]);
  }
  memmove(fc->parked, fc->parked + j, (size_t)(fc->n_parked - j) * sizeof(fc->parked[0]));
  fc->n_parked -= j;
  return fc->n_parked == 0;
}

/* A received notification (poll_lock held). */
static void on_recv(fab_ctx_t *fc, int ri, size_t len, fi_addr_t src)
{
  fab_msg_t m;
  if (len != FAB_MSG_SIZE) { /* short: not one of ours */
    fab_dropped(fc);
    repost(fc, ri);
    return;
  }
  memcpy(&m, fc->rbufs + (size_t)ri * FAB_MSG_SIZE, sizeof(m));
  if (fc->n_pend == 0 && fc->n_parked == 0 && deliver(fc, &m, src)) {
    repost(fc, ri);
  } else if (fc->n_parked == 0 && fc->n_pend < FAB_PEND_MAX) {
    fc->pend[fc->n_pend++] = (struct fab_pend){m, src};
    repost(fc, ri);
  } else {
    fc->parked_src[ri] = src;
    fc->parked[fc->n_parked++] = ri; /* at most FAB_RECV_COUNT: one per buffer */
  }
}

static hixl_status_t cq_err_status(const struct fi_cq_err_entry *e)
{
  /* The target no longer has the key (tcp: it deregistered the region while
   * this was in flight -- hixl_mr_dereg does not wait for operations a peer
   * has not completed yet); the provider cancels the operation and drops
   * its connection, which rxm makes again for the next one.  The
   * operation failed, the peer is alive: its control connection decides. */
  if (e->err == FI_ECANCELED && (e->prov_errno == ENOENT || e->prov_errno == -ENOENT))
    return HIXL_ERR_NOT_REGISTERED;
  switch (e->err) {
  case FI_ECANCELED:
  case FI_EIO:
  case FI_ECONNREFUSED:
  case FI_ECONNRESET:
  case FI_ECONNABORTED:
  case FI_ETIMEDOUT:
  case FI_EHOSTUNREACH:
  case FI_ENOTCONN:
  case FI_EADDRNOTAVAIL: return HIXL_ERR_PEER_LOST;
  case FI_EACCES:
  case FI_EPERM:
  case FI_EKEYREJECTED: return HIXL_ERR_ACCESS;
  default: return HIXL_ERR_TRANSPORT;
  }
}

/* Read and handle completions (poll_lock held); returns how many. */
static int poll_locked(fab_ctx_t *fc)
{
  struct fi_cq_data_entry e[32];
  fi_addr_t src[32];
  int total = 0;
  bool retried = fc->n_pend || fc->n_parked;
  if (retried)
    deliver_pending(fc);
  for (;;) {
    /* With FI_SOURCE each entry names its sender's fi_addr (FI_ADDR_NOTAVAIL:
     * not in our vector, i.e. no peer that completed a bind). */
    ssize_t n = fc->source ? fi_cq_readfrom(fc->cq, e, 32, src) : fi_cq_read(fc->cq, e, 32);
    if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err = {0};
      if (fi_cq_readerr(fc->cq, &err, 0) != 1)
        break;
      int ri = recv_index(fc, err.op_context);
      if (ri >= 0) {
        if (err.err != FI_ECANCELED)
          repost(fc, ri);
        continue;
      }
      fab_op_t *op = err.op_context;
      hixl_status_t st = cq_err_status(&err);
      char why[160];
      snprintf(why, sizeof(why), "%s failed: %s (err %d, provider %d)",
               op->kind == FAB_OP_WRITE  ? "write"
               : op->kind == FAB_OP_READ ? "read"
               : op->kind == FAB_OP_SEND ? "notification"
                                         : "atomic",
               fi_cq_strerror(fc->cq, err.prov_errno, err.err_data, NULL, 0), err.err,
               err.prov_errno);
      /* NULL once the peer was closed (its handle may be gone with it). */
      hixl_peer_t *peer = op->fp->peer;
      hixl__err(st, "fabric: peer %s: %s", peer ? peer->name : "(closed)", why);
      if (st == HIXL_ERR_PEER_LOST && peer)
        hixl__peer_lost_async(peer, why);
      op_finish(fc, op, st);
      total++;
      continue;
    }
    if (n <= 0)
      break;
    for (ssize_t i = 0; i < n; i++) {
      int ri = recv_index(fc, e[i].op_context);
      if (ri >= 0) {
        on_recv(fc, ri, e[i].len, fc->source ? src[i] : FI_ADDR_NOTAVAIL);
      } else {
        op_finish(fc, e[i].op_context, HIXL_OK);
      }
    }
    total += (int)n;
    if (n < 32)
      break;
  }
  if (total > 0 || retried)
    hixl__wake_waiters(fc->ctx); /* notifications delivered (completions woke already) */
  return total;
}

int hixl__fab_progress(hixl_ctx_t *ctx)
{
  fab_ctx_t *fc = hixl__fc(ctx);
  if (fc == NULL || atomic_load_explicit(&fc->n_bound, memory_order_relaxed) == 0)
    return 0;
  atomic_fetch_add_explicit(&fc->user_polls, 1, memory_order_relaxed);
  if (pthread_mutex_trylock(&fc->poll_lock) != 0)
    return 0;
  int n = poll_locked(fc);
  pthread_mutex_unlock(&fc->poll_lock);
  return n;
}

static bool drained(void *arg)
{
  fab_peer_t *fp = arg;
  if (fab_inflight(fp) == 0)
    return true;
  hixl__fab_progress(fp->peer->ctx);
  return fab_inflight(fp) == 0;
}

bool hixl__fab_drain_peer(fab_peer_t *fp)
{
  /* The peer is closing: its state says so, so wait on the count alone. */
  hixl__wait(fp->peer->ctx, hixl__deadline(2000), 0, drained, fp);
  return fab_inflight(fp) == 0;
}

/* The context's progress thread: completions and receives while nobody
 * calls hixl; sleeps on the CQ's wait fd (or naps) when there are none.
 * While a user thread drives progress itself (a caller spinning in a wait,
 * a target polling notifications) the thread only looks every millisecond:
 * waking for every packet would take the CPU the spinning thread needs
 * (measured: an 8-byte put round trip 1.9x fi_pingpong's with the thread
 * waking, see docs/fabric.md). */
void *hixl__fab_thread(void *arg)
{
  fab_ctx_t *fc = arg;
  unsigned idle = 0;
  /* Wake-ups in a row that found nothing to do.  A provider whose fd
   * stays readable for work it cannot do (its listening socket, when
   * accept fails with EMFILE) kept us at 100% of a CPU.  Empty wake-ups
   * are normal (target-side RMA makes no completion), a thousand in a row
   * too: we nap only when no descriptor can be had, and briefly (while
   * backed off, the connections the target has are progressed between
   * naps; docs/scale.md). */
  hixl_futile_t empty = {0};
  bool warned = false;
  uint64_t seen = atomic_load(&fc->user_polls);
  int64_t seen_ns = hixl__now_ns();
  bool user_spins = false;
  while (!atomic_load(&fc->stop)) {
    /* A user spins when it drives progress 16+ times a millisecond (a target
     * polling notifications once a millisecond does not count). */
    int64_t t = hixl__now_ns();
    if (t - seen_ns >= 1000000) {
      uint64_t now = atomic_load_explicit(&fc->user_polls, memory_order_relaxed);
      user_spins = now - seen >= 16 && t - seen_ns < 3000000;
      seen = now;
      seen_ns = t;
    }
    /* A user asleep in hixl__wait relies on us (or on the wait fd it armed). */
    if (user_spins && atomic_load(fc->ctx->sleepers) == 0) {
      nanosleep(&(struct timespec){0, 1000000}, NULL);
      continue;
    }
    pthread_mutex_lock(&fc->poll_lock);
    int n = poll_locked(fc);
    pthread_mutex_unlock(&fc->poll_lock);
    if (n > 0 || fc->n_pend || fc->n_parked) {
      idle = 0;
      hixl__futile_step(&empty, false, fc->wait_fd);
      if (fc->n_pend || fc->n_parked) /* a full ring: its owner polls it eventually */
        nanosleep(&(struct timespec){0, 100000}, NULL);
      continue;
    }
    if (fc->wait_covers) {
      struct fid *f = &fc->cq->fid;
      int r = -1;
      if (fi_trywait(fc->fabric, &f, 1) == FI_SUCCESS) {
        struct pollfd pfd = {fc->wait_fd, POLLIN, 0};
        /* Woken by the provider; 100 ms: re-check stop.  A user asleep in
         * hixl__wait armed this fd too and woke with us: give it a head
         * start.  Racing it for poll_lock, we won as often as not; its
         * trylock then failed, it found nothing and slept again until our
         * delivery woke it a second time (a notification's wake-up over
         * tcp took 120-146 us p50 that way, 45-70 without; docs/waiting.md). */
        r = poll(&pfd, 1, 100);
        if (r > 0 && atomic_load(fc->ctx->sleepers) > 0)
          nanosleep(&(struct timespec){0, 50000}, NULL);
      }
      /* Futile unless idle for real (r == 0); woken, a sleeper may have
       * taken the work: we then back off too, and it wakes on the fd
       * itself.  Not ready (trywait failed): the next round does it. */
      if (hixl__futile_step(&empty, r != 0, fc->wait_fd)) {
        if (!warned) {
          warned = true;
          char hint[256];
          hixl_warn("fabric progress: the provider keeps waking us for work it cannot do (%s); "
                    "polling it at most a tenth of the time until descriptors are free",
                    hixl__nofile_hint(hint, sizeof(hint)));
        }
      }
      continue;
    }
    /* No wait object: nap, longer the longer it stays idle (50 us .. 1 ms). */
    long ns = idle < 200 ? 50000 : 1000000;
    idle++;
    nanosleep(&(struct timespec){0, ns}, NULL);
  }
  return NULL;
}

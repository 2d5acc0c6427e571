/* SPDX-License-Identifier: MIT */
/*
 * Lazy QPs: a pair of contexts whose handshake said "lazy" (the initiator's
 * HIXL_VERBS_LAZY, default 1) has no QP, no CQ room and no budget taken
 * until one side first posts to the other.  Thousands of connected peers
 * that never move data cost no QPs (docs/scale.md, "Lazy QPs").
 *
 * The exchange, over the control connection (TP_REQ, kinds in verbs_int.h):
 *
 *   A (an op queued, QPs not ready)        B
 *   WANT: make QPs (RESET)
 *   QP_REQ {gen, QPNs, PSN, GID} ------->  make QPs, connect them (RTS)
 *   REQ_SENT                        <----  QP_ACCEPT {gen, QPNs, ...}
 *   connect ours (RTS), post the queue     ACCEPTED (B does not post yet:
 *   QP_READY {gen} --------------------->  A's QPs might not be RTR)
 *   READY                                  READY, post B's queue
 *
 * Both sides may want at once (a put each way): both send QP_REQ.  The side
 * with the larger context id wins: it ignores the other's request, and the
 * other accepts the winner's with the QPs it made for its own.  A refusal
 * (QP_ACCEPT with a status: B is past its QP budget) fails A's queued ops
 * with B's reason and leaves the pair without QPs; the next op asks again.
 * A set-up not answered within the wait for a peer (2 x timeout + 1 s)
 * fails what waits with TIMEOUT, the same way.
 *
 * Who does what: an application thread only moves NONE -> WANT (an atomic
 * exchange) and queues the peer for the set-up thread (one per context,
 * started with its first set-up, asleep while there is none).  serve
 * (control thread, ctx->lock held) only checks a message and queues it on
 * the peer.  Every ibverbs call and every message of the exchange comes
 * from the set-up thread, outside every lock of the core and outside
 * work_lock: a QP made slowly (a fresh CQ, a slow device) holds up
 * neither the control thread -- its heartbeats, other peers' messages --
 * nor ctx->lock.  peer_close waits for the thread's pass to end before it
 * frees a peer (vc->in_turns); the thread takes no core lock, so that
 * wait is short.
 *
 * Every field of the three messages is the peer's word: QP counts, blob
 * lengths, MTUs and generations are checked; a message in a state that
 * does not expect it, or for another generation, is dropped; a peer that
 * floods them faster than they are answered is cut off.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "verbs_int.h"

static void *worker_main(void *arg);

/* vp needs the set-up thread (vc->work_lock held): queued, and the thread
 * started (the first time) or woken. */
static void work_add_locked(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  if (!vp->on_work) {
    vp->on_work = true;
    vp->work_next = NULL;
    if (vc->work_tail)
      vc->work_tail->work_next = vp;
    else
      vc->work_head = vp;
    vc->work_tail = vp;
  }
  if (!vc->worker_on && !vc->worker_stop) {
    /* Every signal blocked: a library thread takes none of the
     * application's (as the control thread). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    vc->worker_on = pthread_create(&vc->worker, NULL, worker_main, vp->peer->ctx) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!vc->worker_on)
      hixl_warn("verbs: cannot start the QP set-up thread: QPs are not made on first use");
  }
  pthread_cond_signal(&vc->work_cond);
}

void hixl__vrb_want(vrb_peer_t *vp)
{
  int none = VQ_NONE;
  if (!atomic_compare_exchange_strong(&vp->qs, &none, VQ_WANT))
    return; /* a set-up is under way, or done */
  vrb_ctx_t *vc = hixl__vc(vp->peer->ctx);
  pthread_mutex_lock(&vc->work_lock);
  work_add_locked(vc, vp);
  pthread_mutex_unlock(&vc->work_lock);
}

void hixl__vrb_lazy_forget(vrb_peer_t *vp)
{
  vrb_ctx_t *vc = hixl__vc(vp->peer->ctx);
  pthread_mutex_lock(&vc->work_lock);
  /* A pass of the set-up thread holds vp, or a list vp may be on: wait
   * it out (the thread takes no lock of the core). */
  while (vc->in_turns)
    pthread_cond_wait(&vc->turn_cond, &vc->work_lock);
  if (vp->on_work) {
    vrb_peer_t **pp = &vc->work_head, *prev = NULL;
    while (*pp != vp) {
      prev = *pp;
      pp = &(*pp)->work_next;
    }
    *pp = vp->work_next;
    if (vc->work_tail == vp)
      vc->work_tail = prev;
    vp->on_work = false;
  }
  vp->n_in = 0;
  pthread_mutex_unlock(&vc->work_lock);
}

/* ------------------------------------------------------------ messages */

static void lz_send(vrb_ctx_t *vc, vrb_peer_t *vp, uint32_t kind, hixl_status_t st, const char *why)
{
  hixl_msg_t m;
  memset(&m, 0, sizeof(m));
  m.type = HIXL_MSG_TP_REQ;
  VRB_LZ(&m)->kind = kind;
  VRB_LZ(&m)->gen = vp->gen;
  VRB_LZ(&m)->status = (uint64_t)(-(int64_t)st);
  if (kind != VRB_KIND_QP_READY && st == HIXL_OK) {
    VRB_LZ(&m)->qpn = vp->qps[0]->qp->qp_num;
    VRB_LZ(&m)->psn = vp->psn;
    VRB_LZ(&m)->mtu = (uint64_t)vc->mtu;
    VRB_LZ(&m)->lid = vc->lid;
    VRB_LZ(&m)->nqps = (uint64_t)vp->nq;
    hixl__vrb_local_blob(vc, vp, &m);
  }
  if (why)
    snprintf(m.str[0], sizeof(m.str[0]), "%s", why);
  /* A failure here is the connection's: the peer is being lost. */
  (void)hixl__send(vp->peer, &m, NULL, 0);
}

/* serve: check m and queue it for the control thread's work (ctx->lock). */
static void lz_serve(hixl_peer_t *peer, const hixl_msg_t *m, hixl_msg_t *out, int *out_fds,
                     int *n_out)
{
  (void)out_fds;
  *n_out = 0;
  out->type = 0; /* the answer, if any, comes from the work */
  vrb_peer_t *vp = peer->tp;
  vrb_ctx_t *vc = hixl__vc(peer->ctx);
  const vrb_lazy_msg_t *v = HIXL_MSG_AS_CONST(vrb_lazy_msg_t, m);
  const char *bad = NULL;
  bool qps = v->kind == VRB_KIND_QP_REQ || (v->kind == VRB_KIND_QP_ACCEPT && v->status == 0);
  if (vp == NULL || !vp->lazy)
    bad = "a QP message for a pair whose QPs were made in its handshake";
  else if (v->gen == 0)
    bad = "a QP message without a generation";
  else if (qps &&
           (v->nqps != (uint64_t)vp->nq || m->blob_len != (uint32_t)(16 + 4 * (vp->nq - 1)) ||
            v->mtu < IBV_MTU_256 || v->mtu > IBV_MTU_4096 || v->lid > 0xffff))
    bad = "a malformed QP message";
  else if (v->kind == VRB_KIND_QP_ACCEPT && v->status != 0 && v->status > 1000)
    bad = "a QP refusal with no status";
  pthread_mutex_lock(&vc->work_lock);
  if (bad == NULL && vp->n_in == (int)(sizeof(vp->in) / sizeof(vp->in[0])))
    bad = "QP messages faster than they are answered";
  if (bad) {
    pthread_mutex_unlock(&vc->work_lock);
    hixl_warn("verbs: %s sent %s: cutting it off", peer->name, bad);
    hixl__peer_fail_locked(peer, HIXL_PEER_LOST, bad);
    return;
  }
  struct vrb_in *in = &vp->in[vp->n_in++];
  memset(in, 0, sizeof(*in));
  in->kind = v->kind;
  in->gen = v->gen;
  in->status = v->status;
  if (qps) {
    in->qpn[0] = v->qpn;
    for (int i = 1; i < vp->nq; i++) {
      memcpy(&in->qpn[i], m->blob + 16 + 4 * (i - 1), 4);
      in->qpn[i] = le32toh(in->qpn[i]);
    }
    in->psn = v->psn & 0xffffff;
    in->mtu = (uint32_t)v->mtu;
    in->lid = v->lid;
    memcpy(in->gid, m->blob, 16);
  }
  if (v->status)
    snprintf(in->why, sizeof(in->why), "%.*s", (int)sizeof(m->str[0]), m->str[0]);
  work_add_locked(vc, vp);
  pthread_mutex_unlock(&vc->work_lock);
}

const hixl_tp_msg_t hixl__vrb_msgs[] = {
    {.kind = VRB_KIND_QP_REQ, .serve = lz_serve},
    {.kind = VRB_KIND_QP_ACCEPT, .serve = lz_serve},
    {.kind = VRB_KIND_QP_READY, .serve = lz_serve},
    {0},
};

/* ------------------------------------------------------------ the work */

static void set_qs(vrb_peer_t *vp, int qs)
{
  atomic_store(&vp->qs, qs);
  vp->since_ns = hixl__now_ns();
}

/* The set-up failed: no QPs, what waits fails with st (message set). */
static void give_up(vrb_peer_t *vp, hixl_status_t st)
{
  hixl__peer_op_why(vp->peer, st, hixl_last_error()); /* for the failed requests' message */
  hixl__vrb_qps_unmake(vp);
  /* NONE before the queue is failed: an op queued after this asks again. */
  set_qs(vp, VQ_NONE);
  hixl__vrb_fail_queued(vp, st);
}

static void all_ready(vrb_peer_t *vp)
{
  set_qs(vp, VQ_READY);
  for (int i = 0; i < vp->nq; i++)
    hixl__vrb_qp_ready(vp->qps[i]);
  hixl_debug("verbs: QPs to %s ready", vp->peer->name);
  /* A thread asleep since before the QPs existed armed no completion
   * event of theirs (their send CQ may be new): it looks again and arms. */
  hixl__wake_all(vp->peer->ctx);
}

/* Connect our QPs (made) to the peer's in in. */
static hixl_status_t connect_to(vrb_ctx_t *vc, vrb_peer_t *vp, const struct vrb_in *in)
{
  return hixl__vrb_qps_rts(vc, vp, in->qpn, in->psn, (enum ibv_mtu)in->mtu, (uint16_t)in->lid,
                           in->gid);
}

/* Accept the peer's request in: our QPs (made now unless have) connected
 * to its, QP_ACCEPT back; or a refusal that says why. */
static void accept_req(vrb_ctx_t *vc, vrb_peer_t *vp, const struct vrb_in *in, bool have)
{
  hixl_status_t st = have ? HIXL_OK : hixl__vrb_qps_make(vp);
  if (st == HIXL_OK)
    st = connect_to(vc, vp, in);
  vp->gen = in->gen;
  if (st != HIXL_OK) {
    char why[160];
    snprintf(why, sizeof(why), "%s", hixl_last_error());
    /* Past the budget is expected (the peer is told, and asks again):
     * info; anything else is a warning. */
    if (st == HIXL_ERR_AGAIN)
      hixl_info("verbs: cannot make QPs for %s: %s", vp->peer->name, why);
    else
      hixl_warn("verbs: cannot make QPs for %s: %s", vp->peer->name, why);
    /* Ops of ours may be queued (we wanted QPs too, or an op came while
     * these were being made): they fail with the same reason. */
    give_up(vp, st);
    lz_send(vc, vp, VRB_KIND_QP_ACCEPT, st, why);
    return;
  }
  lz_send(vc, vp, VRB_KIND_QP_ACCEPT, HIXL_OK, NULL);
  hixl_debug("verbs: QPs for %s made, waiting for its ready", vp->peer->name);
  set_qs(vp, VQ_ACCEPTED);
}

static hixl_status_t refused(vrb_peer_t *vp, const struct vrb_in *in)
{
  hixl_status_t st = (hixl_status_t)(-(int64_t)in->status);
  if (st != HIXL_ERR_AGAIN && st != HIXL_ERR_NOMEM)
    st = HIXL_ERR_TRANSPORT;
  return hixl__err(st, "verbs: %s refused our QPs (%s): %s", vp->peer->name, hixl_strerror(st),
                   in->why[0] ? in->why : "no reason given");
}

static void on_msg(vrb_ctx_t *vc, vrb_peer_t *vp, const struct vrb_in *in)
{
  hixl_peer_t *peer = vp->peer;
  int qs = atomic_load(&vp->qs);
  switch (in->kind) {
  case VRB_KIND_QP_REQ:
    if (qs == VQ_NONE || qs == VQ_WANT) {
      accept_req(vc, vp, in, false);
    } else if (qs == VQ_REQ_SENT) {
      /* Both asked: the larger context id's request is the one made. */
      if (peer->ctx->id > peer->remote_ctx_id)
        return; /* ours: it accepts it */
      accept_req(vc, vp, in, true);
    } else if (qs == VQ_ACCEPTED && in->gen != vp->gen) {
      /* It gave up on the request we accepted and asks again. */
      hixl__vrb_qps_unmake(vp);
      set_qs(vp, VQ_NONE);
      accept_req(vc, vp, in, false);
    } else {
      hixl_debug("verbs: %s asked for QPs it has: dropped", peer->name);
    }
    return;
  case VRB_KIND_QP_ACCEPT:
    if (qs != VQ_REQ_SENT || in->gen != vp->gen) {
      hixl_debug("verbs: a stale QP answer from %s: dropped", peer->name);
      return;
    }
    if (in->status != 0) {
      give_up(vp, refused(vp, in));
      return;
    }
    hixl_status_t st = connect_to(vc, vp, in);
    if (st != HIXL_OK) {
      give_up(vp, st);
      return;
    }
    lz_send(vc, vp, VRB_KIND_QP_READY, HIXL_OK, NULL);
    all_ready(vp);
    return;
  case VRB_KIND_QP_READY:
    if (qs == VQ_ACCEPTED && in->gen == vp->gen)
      all_ready(vp);
    else
      hixl_debug("verbs: a stale QP ready from %s: dropped", peer->name);
    return;
  }
}

/* One peer's turn (vc->work_lock not held: vc->in_turns keeps vp) with
 * the messages that were waiting; true: keep it on the list. */
static bool step(hixl_ctx_t *ctx, vrb_ctx_t *vc, vrb_peer_t *vp, const struct vrb_in *in, int n_in,
                 int64_t now)
{
  if (atomic_load(&vp->peer->state) != HIXL_PEER_UP)
    return false; /* peer_close takes down what was made */
  for (int i = 0; i < n_in; i++)
    on_msg(vc, vp, &in[i]);
  int qs = atomic_load(&vp->qs);
  if (qs == VQ_WANT) {
    hixl_status_t st = hixl__vrb_qps_make(vp);
    if (st != HIXL_OK) {
      give_up(vp, st);
      return false;
    }
    vp->gen = hixl__random64() | 1;
    hixl_debug("verbs: asking %s for QPs", vp->peer->name);
    set_qs(vp, VQ_REQ_SENT);
    lz_send(vc, vp, VRB_KIND_QP_REQ, HIXL_OK, NULL);
    return true;
  }
  if (qs == VQ_REQ_SENT || qs == VQ_ACCEPTED) {
    int ms = hixl__issue_wait_ms(ctx);
    if (now - vp->since_ns < (int64_t)ms * 1000000)
      return true; /* looked at again at the next tick */
    give_up(vp, hixl__err(HIXL_ERR_TIMEOUT,
                          "verbs: %s did not finish setting up our QPs within %d ms (%s)",
                          vp->peer->name, ms,
                          qs == VQ_REQ_SENT ? "no answer to our request" : "no ready"));
  }
  return false;
}

/* The set-up thread: every peer on the list gets its turn; a peer whose
 * set-up waits for the other side stays on it, looked at again within
 * 50 ms (its deadline).  Asleep while the list is empty. */
static void *worker_main(void *arg)
{
  hixl_ctx_t *ctx = arg;
  vrb_ctx_t *vc = hixl__vc(ctx);
  pthread_mutex_lock(&vc->work_lock);
  while (!vc->worker_stop) {
    vrb_peer_t *list = vc->work_head;
    vc->work_head = vc->work_tail = NULL;
    int64_t now = hixl__now_ns();
    bool waiting = false;
    while (list) {
      vrb_peer_t *vp = list;
      list = vp->work_next;
      vp->on_work = false;
      /* Its turn runs without work_lock (so serve, under ctx->lock, never
       * waits for an ibverbs call), on the messages taken now.  in_turns
       * keeps peer_close from freeing it, or any peer of the rest of the
       * list (this thread's alone now), until the pass ends. */
      struct vrb_in in[sizeof(vp->in) / sizeof(vp->in[0])];
      int n_in = vp->n_in;
      memcpy(in, vp->in, sizeof(in[0]) * (size_t)n_in);
      vp->n_in = 0;
      vc->in_turns = true;
      pthread_mutex_unlock(&vc->work_lock);
      bool again = step(ctx, vc, vp, in, n_in, now);
      pthread_mutex_lock(&vc->work_lock);
      if (again) {
        work_add_locked(vc, vp);
        waiting = true;
      }
    }
    vc->in_turns = false;
    pthread_cond_broadcast(&vc->turn_cond); /* peer_close waits for a turn to end */
    if (vc->work_head && !waiting)
      continue; /* queued during the turns: at once */
    if (waiting) {
      int64_t until = hixl__now_ns() + 50 * 1000000LL;
      struct timespec ts = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};
      pthread_cond_timedwait(&vc->work_cond, &vc->work_lock, &ts);
    } else {
      pthread_cond_wait(&vc->work_cond, &vc->work_lock);
    }
  }
  pthread_mutex_unlock(&vc->work_lock);
  return NULL;
}

void hixl__vrb_lazy_fini(vrb_ctx_t *vc)
{
  pthread_mutex_lock(&vc->work_lock);
  vc->worker_stop = true;
  bool on = vc->worker_on;
  pthread_cond_signal(&vc->work_cond);
  pthread_mutex_unlock(&vc->work_lock);
  if (on)
    pthread_join(vc->worker, NULL);
}

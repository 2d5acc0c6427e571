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
 * nor ctx->lock.  peer_close waits for the thread's turn on that peer
 * (vc->busy_vp) to end before it frees it; the thread takes no core lock
 * and a turn is one peer's, so that wait is short.
 *
 * Reclaim (docs/scale.md, "Reclaiming idle QPs").  A side that needs QPs
 * past its budget (HIXL_VERBS_MAX_QPS) -- for its own op, or for a peer's
 * QP_REQ -- takes back the QPs of its least recently used idle pair
 * instead of failing:
 *
 *   R (needs room; the victim pair         O
 *   has nothing posted or queued)
 *   stop posting on it; QUIESCING
 *   QP_QUIESCE {gen} ------------------->  stop posting on it; DRAINING;
 *                                          wait for what it posted to
 *                                          complete, take the receive
 *                                          completions in, QPs down, NONE
 *   take the receive completions in,  <--  QP_RELEASED {gen}
 *   QPs down, NONE: room
 *
 * A pair that wants QPs meanwhile waits for that room up to its set-up
 * deadline: ours retries when a reclaim ends; a peer's request is answered
 * QP_WAIT, and the peer gives its own QPs back meanwhile (two full sides
 * each holding QPs for the other would wait for each other) and asks again
 * after a jittered backoff.  Waiters take room in turn: a queue in the
 * order they first found none (ours and peers told QP_WAIT), where a pair
 * may take room only past what those ahead of it need, and a shortfall
 * starts as many reclaims as it takes.  Ops called on a pair being reclaimed are
 * queued and make new QPs once the old ones are gone, as on a pair that
 * never had any.  Exactly once, in order: when R
 * gets QP_RELEASED, every message either side sent on the old QPs was
 * acknowledged (R had nothing in flight, O waited for its own), so its
 * receive completion is in the CQ; both take those in before the QPs go,
 * and the QP map keeps the old number a while for a straggler.  New QPs
 * carry nothing until both sides are READY again.  A QP_QUIESCE not
 * answered within 1.5 x the wait for a peer stops counting as a reclaim
 * under way, but our QPs stay (the peer's may still post to them) until it
 * answers or is lost: its liveness decides, since a peer whose sends wait
 * on our full notification ring (RNR) is slow, not dead.  No reclaim
 * starts while such a ring holds receive buffers back.
 * LRU: a pair's last use is the use clock's value at its last op or
 * notification; the clock moves at each reclaim (no clock read on the fast
 * path).  The side that reclaims does not see the peer's own RDMA writes
 * and reads: a pair busy only that way may be picked, and its QPs are then
 * made again at its next op.
 *
 * Every field of these messages is the peer's word: QP counts, blob
 * lengths, MTUs and generations are checked; a message in a state that
 * does not expect it, or for another generation, is dropped; a peer that
 * floods them faster than they are answered is cut off.  What it makes us
 * do goes at its set-up rate (rate_ok), per pair: its requests that make
 * QPs or start reclaims for it, and our own set-ups after it took our QPs
 * back (QP_QUIESCE); else it could ask, give back and ask again, or take
 * back whatever we set up, without bound, making us create QPs and take
 * back other pairs' idle ones each time.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "verbs_int.h"

static void *worker_main(void *arg);

/* A peer's requests for QPs served at once before its set-up rate
 * (HIXL_VERBS_SETUP_INTERVAL_MS) applies: a pair reclaimed now and then,
 * or both sides wanting at once, never waits for it. */
#define VRB_SETUP_BURST 8
/* Reclaims under way at once, at most (a context short of room for many
 * pairs at once takes back this many idle ones per round). */
#define RECLAIM_MAX 16
/* A QP_WAIT's pause before asking again: this, doubled at each further
 * QP_WAIT of the same set-up up to 16 x, and jittered by +-50% (contexts
 * full at once must not retry in step). */
#define RETRY_NS (5 * 1000000LL)
/* A peer told QP_WAIT asks again within 1.5 x 16 x RETRY_NS (120 ms):
 * one that has not within this has given up, and leaves the room queue. */
#define ROOM_TOLD_NS (500 * 1000000LL)

/* The set-up thread looks again at t at the latest (its own fields). */
static void wake_at(vrb_ctx_t *vc, int64_t t)
{
  if (vc->wake_ns == 0 || t < vc->wake_ns)
    vc->wake_ns = t;
}

/* The FIFOs' next pointer of vp: field at offset off (work_next,
 * room_next). */
#define FIFO_NEXT(vp, off) (*(vrb_peer_t **)((char *)(vp) + (off)))
#define WORK_NEXT offsetof(vrb_peer_t, work_next)
#define ROOM_NEXT offsetof(vrb_peer_t, room_next)

static void fifo_push(vrb_fifo_t *q, vrb_peer_t *vp, size_t off)
{
  FIFO_NEXT(vp, off) = NULL;
  if (q->tail)
    FIFO_NEXT(q->tail, off) = vp;
  else
    q->head = vp;
  q->tail = vp;
}

/* Unlink vp, which is on q. */
static void fifo_unlink(vrb_fifo_t *q, vrb_peer_t *vp, size_t off)
{
  vrb_peer_t **pp = &q->head, *prev = NULL;
  while (*pp != vp) {
    prev = *pp;
    pp = &FIFO_NEXT(*pp, off);
  }
  *pp = FIFO_NEXT(vp, off);
  if (q->tail == vp)
    q->tail = prev;
}

/* The room queue (vc->work_lock held): vp waits for room, behind those
 * that waited first (remote: a peer told QP_WAIT, at now); out of it. */
static void room_q_add_locked(vrb_ctx_t *vc, vrb_peer_t *vp, bool remote, int64_t now)
{
  if (remote) {
    vp->room_remote = true;
    vp->room_told_ns = now;
  }
  if (vp->in_room_q)
    return;
  vp->in_room_q = true;
  vp->room_first_ns = now;
  fifo_push(&vc->room, vp, ROOM_NEXT);
}

static void room_q_del_locked(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  vp->room_remote = false;
  if (!vp->in_room_q)
    return;
  fifo_unlink(&vc->room, vp, ROOM_NEXT);
  vp->in_room_q = false;
}

static void room_q_del(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  pthread_mutex_lock(&vc->work_lock);
  room_q_del_locked(vc, vp);
  pthread_mutex_unlock(&vc->work_lock);
}

/* QPs needed by the pairs waiting ahead of vp (all of them if vp is not
 * waiting).  A peer told QP_WAIT leaves the queue here (unless it is a
 * set-up of ours too) once it has stopped asking, or has waited as long
 * as a requester waits at all: asking again does not keep its place
 * past that.  work_lock held. */
static int room_ahead_locked(vrb_ctx_t *vc, vrb_peer_t *vp, int64_t now)
{
  int n = 0;
  for (vrb_peer_t *w = vc->room.head, *next; w && w != vp; w = next) {
    next = w->room_next;
    if (w->room_remote && atomic_load(&w->qs) != VQ_WANT &&
        (now - w->room_told_ns > ROOM_TOLD_NS ||
         now - w->room_first_ns > hixl__issue_wait_ms(w->peer->ctx) * 1000000LL)) {
      room_q_del_locked(vc, w);
      continue;
    }
    n += w->nq;
  }
  return n;
}

int hixl__vrb_room_ahead(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  pthread_mutex_lock(&vc->work_lock);
  int n = room_ahead_locked(vc, vp, hixl__now_ns());
  pthread_mutex_unlock(&vc->work_lock);
  return n;
}

/* The state of the set-up's wait for room, reset (it has QPs, or gave up). */
static void room_reset(vrb_peer_t *vp)
{
  room_q_del(hixl__vc(vp->peer->ctx), vp);
  vp->room_epoch = 0;
  vp->room_since_ns = 0;
  vp->retry_ns = 0;
  vp->n_waits = 0;
  vp->wait_limited = vp->self_limited = false;
}

/* vp needs the set-up thread (vc->work_lock held): queued, and the thread
 * started (the first time) or woken; fresh: it has new work (else it waits
 * for the other side, and is looked at again at the next pass).  false: there is no thread (it
 * could not be started, or the context is going), vp is not queued. */
static bool work_add_locked(vrb_ctx_t *vc, vrb_peer_t *vp, bool fresh)
{
  if (!vc->worker_on && !vc->worker_stop)
    vc->worker_on =
        hixl__thread_start(&vc->worker, "hixl-qp-setup", worker_main, vp->peer->ctx) == 0;
  if (!vc->worker_on || vc->worker_stop)
    return false;
  if (!vp->on_work) {
    vp->on_work = true;
    fifo_push(&vc->work, vp, WORK_NEXT);
  }
  if (fresh)
    vp->pass = 0; /* new work: taken in the thread's current pass */
  pthread_cond_signal(&vc->work_cond);
  return true;
}

/* Unlink vp from the work list (vc->work_lock held, vp on it). */
static void work_unlink_locked(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  fifo_unlink(&vc->work, vp, WORK_NEXT);
  vp->on_work = false;
}

/* The LRU list: lazy pairs whose QPs are ready (vc->work_lock held). */
static void lru_add_locked(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  if (vp->on_lru)
    return;
  vp->on_lru = true;
  vp->lru_prev = NULL;
  vp->lru_next = vc->lru_head;
  if (vc->lru_head)
    vc->lru_head->lru_prev = vp;
  vc->lru_head = vp;
}

static void lru_del_locked(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  if (!vp->on_lru)
    return;
  if (vp->lru_prev)
    vp->lru_prev->lru_next = vp->lru_next;
  else
    vc->lru_head = vp->lru_next;
  if (vp->lru_next)
    vp->lru_next->lru_prev = vp->lru_prev;
  vp->on_lru = false;
}

/* vp is no victim (any more): its reclaim ended, or never began. */
static void victim_done_locked(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  if (vp->victim) {
    vp->victim = false;
    vc->n_reclaiming--;
    vc->reclaiming_qps -= vp->nq;
    vc->reclaim_epoch++; /* who waited on it picks again if still short */
  }
}

static void lru_del(vrb_ctx_t *vc, vrb_peer_t *vp, bool victim_done)
{
  pthread_mutex_lock(&vc->work_lock);
  lru_del_locked(vc, vp);
  if (victim_done)
    victim_done_locked(vc, vp);
  pthread_mutex_unlock(&vc->work_lock);
}

void hixl__vrb_want(vrb_peer_t *vp)
{
  int none = VQ_NONE;
  if (!atomic_compare_exchange_strong(&vp->qs, &none, VQ_WANT))
    return; /* a set-up is under way, or done */
  vrb_ctx_t *vc = hixl__vc(vp->peer->ctx);
  pthread_mutex_lock(&vc->work_lock);
  bool queued = work_add_locked(vc, vp, true);
  pthread_mutex_unlock(&vc->work_lock);
  if (!queued) { /* nobody would make the QPs: what waits fails now */
    hixl_status_t st =
        hixl__err(HIXL_ERR_NOMEM, "verbs: no thread to make the QPs for %s", vp->peer->name);
    hixl__peer_op_why(vp->peer, st, hixl_last_error());
    atomic_store(&vp->qs, VQ_NONE);
    hixl__vrb_fail_queued(vp, st);
  }
}

void hixl__vrb_lazy_forget(vrb_peer_t *vp)
{
  vrb_ctx_t *vc = hixl__vc(vp->peer->ctx);
  pthread_mutex_lock(&vc->work_lock);
  /* The set-up thread's turn on vp: wait it out (the thread takes no lock
   * of the core, and a turn is one peer's). */
  while (vc->busy_vp == vp)
    pthread_cond_wait(&vc->turn_cond, &vc->work_lock);
  if (vp->on_work)
    work_unlink_locked(vc, vp);
  lru_del_locked(vc, vp);
  victim_done_locked(vc, vp);
  room_q_del_locked(vc, vp);
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
  if ((kind == VRB_KIND_QP_REQ || kind == VRB_KIND_QP_ACCEPT) && st == HIXL_OK) {
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
  if (!work_add_locked(vc, vp, true))
    vp->n_in--; /* no thread (the context is going): dropped */
  pthread_mutex_unlock(&vc->work_lock);
}

const hixl_tp_msg_t hixl__vrb_msgs[] = {
    {.kind = VRB_KIND_QP_REQ, .serve = lz_serve},
    {.kind = VRB_KIND_QP_ACCEPT, .serve = lz_serve},
    {.kind = VRB_KIND_QP_READY, .serve = lz_serve},
    {.kind = VRB_KIND_QP_WAIT, .serve = lz_serve},
    {.kind = VRB_KIND_QP_QUIESCE, .serve = lz_serve},
    {.kind = VRB_KIND_QP_RELEASED, .serve = lz_serve},
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
  /* NONE before the queue is failed, so that no op is left queued with
   * nobody to ask for QPs: one queued in between starts a new set-up (and
   * is failed here all the same; the new set-up then has nothing to post). */
  set_qs(vp, VQ_NONE);
  room_reset(vp);
  hixl__vrb_fail_queued(vp, st);
}

/* Receive buffers are held back by a full notification ring: a victim's
 * peer might then never drain (its sends wait on RNR), so no reclaim
 * starts until the rings are read. */
static bool rings_hold(vrb_ctx_t *vc)
{
  pthread_mutex_lock(&vc->recv_lock);
  bool held = vc->n_overflow > 0;
  pthread_mutex_unlock(&vc->recv_lock);
  return held;
}

/* Room for vp's QPs is being made: a reclaim it asked for is under way, or
 * one starts now (the least recently used idle pair's, vp->lock of that
 * pair not needed: its own turn checks that it is idle), or may start
 * later.  false: no lazy pair holds QPs, so none can be taken back.
 * *started (when not NULL): a reclaim started now, for vp. */
static bool room_for(vrb_ctx_t *vc, vrb_peer_t *vp, bool *started)
{
  if (started)
    *started = false;
  if (!vc->reclaim)
    return false;
  /* More than reclaims can ever free (the rest of the budget is held by
   * pairs made in their handshake, which are never taken back): refused
   * now rather than queued ahead of pairs that can be served. */
  if (vp->nq > vc->max_qps - (atomic_load(&vc->n_qps) - atomic_load(&vc->n_lazy_qps)))
    return false;
  bool held = rings_hold(vc);
  pthread_mutex_lock(&vc->work_lock);
  /* Ours is under way while no reclaim has ended since we asked. */
  bool ok = vp->room_epoch == vc->reclaim_epoch + 1 && vc->n_reclaiming > 0;
  /* QPs short for vp and the pairs that wait ahead of it, beyond what the
   * reclaims under way bring: as many victims as that takes (a requester
   * of several QPs needs several idle single-QP pairs). */
  int ahead = room_ahead_locked(vc, vp, hixl__now_ns());
  int short_by = atomic_load(&vc->n_qps) + ahead + vp->nq - vc->max_qps - vc->reclaiming_qps;
  while (!ok && !held && short_by > 0 && vc->n_reclaiming < RECLAIM_MAX) {
    vrb_peer_t *pick = NULL;
    for (vrb_peer_t *c = vc->lru_head; c; c = c->lru_next)
      if (c != vp && !c->victim &&
          (pick == NULL || atomic_load_explicit(&c->last_use, memory_order_relaxed) <
                               atomic_load_explicit(&pick->last_use, memory_order_relaxed)))
        pick = c;
    if (pick == NULL)
      break;
    pick->victim = true;
    vc->n_reclaiming++;
    vc->reclaiming_qps += pick->nq;
    short_by -= pick->nq;
    atomic_fetch_add_explicit(&vc->use_clock, 1, memory_order_relaxed);
    work_add_locked(vc, pick, true); /* its turn starts the reclaim */
    if (started)
      *started = true;
    hixl_debug("verbs: taking back the idle QPs to %s for %s", pick->peer->name, vp->peer->name);
    vp->room_epoch = vc->reclaim_epoch + 1;
    if (short_by <= 0)
      ok = true;
  }
  /* Room enough is on its way already (reclaims others started). */
  if (!ok && short_by <= 0 && vc->n_reclaiming > 0)
    ok = true;
  /* No victim now: room still comes if a reclaim is under way, once a
   * lazy pair that holds QPs (being set up, or busy) goes idle, or once
   * the pairs ahead in the queue have taken theirs (or left it) -- the
   * requester waits for it up to its deadline.  Only QPs of pairs made in
   * their handshake never come back. */
  if (!ok)
    ok = vc->n_reclaiming > 0 || atomic_load(&vc->n_lazy_qps) > 0 || ahead > 0;
  pthread_mutex_unlock(&vc->work_lock);
  return ok;
}

static void all_ready(vrb_peer_t *vp)
{
  if (atomic_load(&vp->peer->state) != HIXL_PEER_UP) {
    /* Lost while its QPs were made (vrb_peer_lost may have run before
     * they were there to move to ERROR): post nothing on them. */
    hixl__vrb_fail_queued(vp, HIXL_ERR_PEER_LOST);
    return;
  }
  hixl__peer_op_why(vp->peer, HIXL_OK, ""); /* an earlier refusal's reason is stale */
  vrb_ctx_t *vc = hixl__vc(vp->peer->ctx);
  room_reset(vp);
  hixl__vrb_used(vc, vp);
  pthread_mutex_lock(&vc->work_lock);
  lru_add_locked(vc, vp);
  pthread_mutex_unlock(&vc->work_lock);
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

/* A peer's set-up rate, per pair (a generic cell rate algorithm: a burst
 * of VRB_SETUP_BURST, then one per setup_ival_ns; tat is the next one's
 * theoretical time).  Two of them: setup_tat for its requests we serve
 * (each makes QPs, or starts reclaims for it), quiesce_tat for its
 * QP_QUIESCEs we honour (each has us set up again at our next op to it).
 * Only the set-up thread touches them. */
static bool rate_ok(const vrb_ctx_t *vc, int64_t tat, int64_t now)
{
  return vc->setup_ival_ns == 0 || tat - now <= (VRB_SETUP_BURST - 1) * vc->setup_ival_ns;
}

static void rate_charge(const vrb_ctx_t *vc, int64_t *tat, int64_t now)
{
  if (vc->setup_ival_ns)
    *tat = (*tat > now ? *tat : now) + vc->setup_ival_ns;
}

/* When rate_ok turns true again. */
static int64_t rate_next(const vrb_ctx_t *vc, int64_t tat)
{
  return tat - (VRB_SETUP_BURST - 1) * vc->setup_ival_ns;
}

/* Accept the peer's request in: our QPs (made now unless have) connected
 * to its, QP_ACCEPT back; or a refusal that says why; or, past its set-up
 * rate, QP_WAIT (it asks again after its backoff, 2.5-120 ms).  The rate
 * is charged for QPs made and for reclaims started, not for a request
 * that only finds the room it waits for still on its way. */
static void accept_req(vrb_ctx_t *vc, vrb_peer_t *vp, const struct vrb_in *in, bool have)
{
  int64_t now = hixl__now_ns();
  if (!have && !rate_ok(vc, vp->setup_tat, now)) {
    /* Not queued for room either: a peer held back by its rate must not
     * hold up those behind it, nor have them take back pairs for it.  Our
     * own set-up on this pair (we want QPs too) keeps its place. */
    if (atomic_load(&vp->qs) != VQ_WANT)
      room_q_del(vc, vp);
    vp->gen = in->gen;
    atomic_fetch_add_explicit(&vc->n_setups_limited, 1, memory_order_relaxed);
    hixl_debug("verbs: %s asks for QPs more often than HIXL_VERBS_SETUP_INTERVAL_MS allows: wait",
               vp->peer->name);
    lz_send(vc, vp, VRB_KIND_QP_WAIT, HIXL_ERR_AGAIN,
            "QP set-ups too frequent (HIXL_VERBS_SETUP_INTERVAL_MS)");
    return;
  }
  hixl_status_t st = have ? HIXL_OK : hixl__vrb_qps_make(vp);
  if (st == HIXL_OK && !have) {
    room_q_del(vc, vp); /* the room it waited for, taken */
    rate_charge(vc, &vp->setup_tat, now);
  }
  if (st == HIXL_OK)
    st = connect_to(vc, vp, in);
  vp->gen = in->gen;
  bool started = false;
  if (st == HIXL_ERR_AGAIN && !have && room_for(vc, vp, &started)) {
    if (started)
      rate_charge(vc, &vp->setup_tat, now);
    /* Past the budget (nothing was made), but an idle pair's QPs are
     * coming back: the requester asks again in a moment, and the room
     * is kept for it in its turn.  Our own queued ops (if we wanted QPs
     * too) wait for the same room. */
    pthread_mutex_lock(&vc->work_lock);
    room_q_add_locked(vc, vp, true, hixl__now_ns());
    pthread_mutex_unlock(&vc->work_lock);
    lz_send(vc, vp, VRB_KIND_QP_WAIT, HIXL_OK, NULL);
    return;
  }
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

/* The pair's QPs are gone from both sides' use (QP_RELEASED came, or we
 * drained for the other side): the last receive completions in, the QPs
 * down, room for another pair; what was queued meanwhile asks for new
 * ones. */
static void release(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  hixl__vrb_recv_drain(vp->peer->ctx);
  hixl__vrb_qps_unmake(vp);
  vp->victim_late = false;
  set_qs(vp, VQ_NONE);
  atomic_fetch_add_explicit(&vc->n_reclaimed, 1, memory_order_relaxed);
  hixl_debug("verbs: QPs to %s taken back", vp->peer->name);
  pthread_mutex_lock(&vc->work_lock);
  lru_del_locked(vc, vp);
  victim_done_locked(vc, vp);
  /* Pairs waiting for room look again now, not at the next 50 ms. */
  for (vrb_peer_t *w = vc->work.head; w; w = w->work_next)
    w->pass = 0;
  pthread_cond_signal(&vc->work_cond);
  pthread_mutex_unlock(&vc->work_lock);
  bool queued = false;
  pthread_mutex_lock(&vp->lock);
  for (int i = 0; i < vp->nq; i++)
    queued |= vp->qps[i]->n_pend > 0;
  pthread_mutex_unlock(&vp->lock);
  if (queued)
    hixl__vrb_want(vp);
}

/* vp was picked to give its QPs back: if it is idle (nothing posted or
 * queued, and no receive buffer held back by a full notification ring,
 * which could keep the other side's sends from completing), stop posting
 * and ask the other side to do the same.  Not idle: it stays, counted as
 * used now (so the next pick is another pair). */
static void quiesce(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  bool held = rings_hold(vc);
  if (held || !hixl__vrb_qps_stop(vp, true)) {
    if (!held) /* busy: counted as used now, so the next pick is another */
      hixl__vrb_used(vc, vp);
    pthread_mutex_lock(&vc->work_lock);
    victim_done_locked(vc, vp); /* still a candidate, later */
    pthread_mutex_unlock(&vc->work_lock);
    wake_at(vc, hixl__now_ns() + 2 * 1000000LL); /* the pair that wanted room looks again */
    return;
  }
  lru_del(vc, vp, false); /* still a victim: counted until released */
  set_qs(vp, VQ_QUIESCING);
  lz_send(vc, vp, VRB_KIND_QP_QUIESCE, HIXL_OK, NULL);
}

/* DRAINING: once what we posted has completed, our side is done. */
static void drain_done(vrb_ctx_t *vc, vrb_peer_t *vp)
{
  hixl__vrb_progress(vp->peer->ctx);
  if (hixl__vrb_posted(vp) > 0) {
    /* Soon done, usually; a peer that does not read its notifications
     * holds our sends on RNR, and then every 50 ms is enough. */
    int64_t now = hixl__now_ns();
    if (now - vp->since_ns < 100 * 1000000LL)
      wake_at(vc, now + 2 * 1000000LL);
    return;
  }
  release(vc, vp);
  /* After release: a QP_REQ for what we queued meanwhile comes from a
   * later turn, so it reaches the other side behind this. */
  lz_send(vc, vp, VRB_KIND_QP_RELEASED, HIXL_OK, NULL);
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
      /* It gave up on the request we accepted and asks again: a peer
       * does so after its deadline, so once per half of it at most (a
       * peer asking faster would only have us make and destroy QPs). */
      int64_t now = hixl__now_ns();
      if (now - vp->reaccept_ns < (int64_t)hixl__issue_wait_ms(peer->ctx) * 500000) {
        hixl_debug("verbs: %s asks for QPs again too soon: dropped", peer->name);
        return;
      }
      vp->reaccept_ns = now;
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
  case VRB_KIND_QP_WAIT:
    if (qs == VQ_REQ_SENT && in->gen == vp->gen) {
      /* Our QPs go back to our budget while we wait (two full contexts
       * each holding QPs for the other would wait for each other), and
       * the set-up starts again later, jittered. */
      int64_t now = hixl__now_ns();
      if (vp->room_since_ns == 0)
        vp->room_since_ns = vp->since_ns;
      int shift = vp->n_waits < 4 ? vp->n_waits : 4;
      vp->n_waits++;
      vp->wait_limited = in->status != 0; /* its set-up rate, not its budget */
      int64_t d = RETRY_NS << shift;
      vp->retry_ns = now + d / 2 + (int64_t)(hixl__random64() % (uint64_t)d);
      hixl__vrb_qps_unmake(vp);
      set_qs(vp, VQ_WANT);
    } else {
      hixl_debug("verbs: a stale QP wait from %s: dropped", peer->name);
    }
    return;
  case VRB_KIND_QP_QUIESCE:
    if (in->gen != vp->gen) {
      hixl_debug("verbs: a QP quiesce from %s for other QPs: dropped", peer->name);
    } else if (qs == VQ_READY) {
      hixl__vrb_qps_stop(vp, false);
      lru_del(vc, vp, false);
      set_qs(vp, VQ_DRAINING);
      rate_charge(vc, &vp->quiesce_tat, hixl__now_ns()); /* our next set-up's pace */
    } else if (qs == VQ_QUIESCING) {
      /* Both took the pair back at once: both stopped with nothing in
       * flight; each answers the other's and goes on its answer. */
      lz_send(vc, vp, VRB_KIND_QP_RELEASED, HIXL_OK, NULL);
    } else {
      hixl_debug("verbs: a QP quiesce from %s with no QPs ready: dropped", peer->name);
    }
    return;
  case VRB_KIND_QP_RELEASED:
    if (qs == VQ_QUIESCING && in->gen == vp->gen)
      release(vc, vp);
    else
      hixl_debug("verbs: a stale QP release from %s: dropped", peer->name);
    return;
  }
}

/* One peer's turn (vc->work_lock not held: vc->busy_vp keeps vp) with
 * the messages that were waiting; true: keep it on the list. */
static bool step(hixl_ctx_t *ctx, vrb_ctx_t *vc, vrb_peer_t *vp, const struct vrb_in *in, int n_in,
                 int64_t now)
{
  if (atomic_load(&vp->peer->state) != HIXL_PEER_UP) {
    /* Never posted, so no flush fails them; peer_close takes down the
     * QPs. */
    lru_del(vc, vp, true);
    room_q_del(vc, vp);
    hixl__vrb_fail_queued(vp, HIXL_ERR_PEER_LOST);
    return false;
  }
  /* The deadline before the messages: an answer that comes after it is
   * not taken (the other side may have given up as well).  The acceptor
   * waits half as long again as the requester, so that a requester that
   * timed out finds the acceptor still there to take its next request. */
  int qs = atomic_load(&vp->qs);
  int64_t ms = hixl__issue_wait_ms(ctx);
  if (qs == VQ_ACCEPTED || qs == VQ_QUIESCING)
    ms += ms / 2;
  if ((qs == VQ_REQ_SENT || qs == VQ_ACCEPTED) && now - vp->since_ns >= ms * 1000000) {
    give_up(vp, hixl__err(HIXL_ERR_TIMEOUT,
                          "verbs: %s did not finish setting up our QPs within %lld ms (%s)",
                          vp->peer->name, (long long)ms,
                          qs == VQ_REQ_SENT ? "no answer to our request" : "no ready"));
  } else if (qs == VQ_QUIESCING && !vp->victim_late && now - vp->since_ns >= ms * 1000000) {
    /* Its QPs may still post to ours, so ours stay until it answers or is
     * lost (its liveness, not this, decides: a peer whose sends wait on
     * our full notification ring is slow, not dead).  It no longer counts
     * as a reclaim under way: others may start meanwhile. */
    hixl_info("verbs: %s has not released the idle QPs we took back after %lld ms", vp->peer->name,
              (long long)ms);
    vp->victim_late = true;
    lru_del(vc, vp, true);
  }
  for (int i = 0; i < n_in; i++)
    on_msg(vc, vp, &in[i]);
  qs = atomic_load(&vp->qs);
  pthread_mutex_lock(&vc->work_lock);
  bool victim = vp->victim;
  pthread_mutex_unlock(&vc->work_lock);
  if (victim && qs == VQ_READY) {
    quiesce(vc, vp);
  } else if (victim && qs != VQ_QUIESCING) {
    /* Not ready any more (the other side took it back first): no
     * reclaim of ours; its release makes the room all the same. */
    pthread_mutex_lock(&vc->work_lock);
    victim_done_locked(vc, vp);
    pthread_mutex_unlock(&vc->work_lock);
  }
  if (qs == VQ_DRAINING)
    drain_done(vc, vp);
  qs = atomic_load(&vp->qs);
  if (qs == VQ_WANT) {
    int64_t wait_ns = hixl__issue_wait_ms(ctx) * 1000000LL;
    if (vp->room_since_ns && now - vp->room_since_ns >= wait_ns) {
      if (vp->self_limited)
        give_up(vp, hixl__err(HIXL_ERR_AGAIN,
                              "verbs: no QPs to %s within %lld ms: it took back the QPs we made "
                              "for it more often than our HIXL_VERBS_SETUP_INTERVAL_MS allows, "
                              "and we make them again at that rate",
                              vp->peer->name, (long long)(wait_ns / 1000000)));
      else if (vp->wait_limited)
        give_up(vp, hixl__err(HIXL_ERR_AGAIN,
                              "verbs: no QPs to %s within %lld ms: it limits how often a peer may "
                              "ask it for QPs (its HIXL_VERBS_SETUP_INTERVAL_MS), and we asked "
                              "too often",
                              vp->peer->name, (long long)(wait_ns / 1000000)));
      else
        give_up(vp, hixl__err(HIXL_ERR_AGAIN,
                              "verbs: no room for QPs to %s within %lld ms: %s's QP budget "
                              "(HIXL_VERBS_MAX_QPS) stayed full, with no idle pair to take back",
                              vp->peer->name, (long long)(wait_ns / 1000000),
                              vp->n_waits ? "its" : "our"));
      return false;
    }
    if (vp->retry_ns && now < vp->retry_ns) { /* a QP_WAIT said: later */
      wake_at(vc, vp->retry_ns);
      return true;
    }
    vp->retry_ns = 0;
    if (!rate_ok(vc, vp->quiesce_tat, now)) {
      /* It took our QPs back more often than its rate: ours again later
       * (our ops wait, up to the set-up's deadline). */
      if (!vp->self_limited)
        atomic_fetch_add_explicit(&vc->n_setups_limited, 1, memory_order_relaxed);
      vp->self_limited = true;
      if (vp->room_since_ns == 0)
        vp->room_since_ns = now;
      vp->retry_ns = rate_next(vc, vp->quiesce_tat);
      wake_at(vc, vp->retry_ns);
      return true;
    }
    hixl_status_t st = hixl__vrb_qps_make(vp);
    if (st == HIXL_OK)
      room_q_del(vc, vp); /* the room it waited for, taken */
    if (st == HIXL_ERR_AGAIN) {
      /* Past our budget: wait (up to the set-up's deadline) for an idle
       * pair's QPs, if there is one to take back, in turn. */
      if (vp->room_since_ns == 0)
        vp->room_since_ns = now;
      if (room_for(vc, vp, NULL)) {
        vp->wait_limited = vp->self_limited = false; /* now it is our budget */
        pthread_mutex_lock(&vc->work_lock);
        room_q_add_locked(vc, vp, false, now);
        pthread_mutex_unlock(&vc->work_lock);
        return true;
      }
    }
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
  /* looked at again within 50 ms, or at wake_ns */
  return qs == VQ_REQ_SENT || qs == VQ_ACCEPTED || qs == VQ_QUIESCING || qs == VQ_DRAINING;
}

/* The set-up thread: one peer's turn at a time, oldest first.  A peer
 * whose set-up waits for the other side goes back on the list, marked
 * with this pass: when only such peers are left the thread sleeps 50 ms
 * (their deadlines), or until a new peer or message comes. */
static void *worker_main(void *arg)
{
  hixl_ctx_t *ctx = arg;
  vrb_ctx_t *vc = hixl__vc(ctx);
  uint64_t pass = 1;
  pthread_mutex_lock(&vc->work_lock);
  while (!vc->worker_stop) {
    vrb_peer_t *vp = vc->work.head;
    while (vp && vp->pass == pass)
      vp = vp->work_next;
    if (vp == NULL) { /* nothing new this pass */
      if (vc->work.head) {
        int64_t now = hixl__now_ns(), until = now + 50 * 1000000LL;
        if (vc->wake_ns && vc->wake_ns < until)
          until = vc->wake_ns > now ? vc->wake_ns : now;
        vc->wake_ns = 0;
        struct timespec ts = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};
        pthread_cond_timedwait(&vc->work_cond, &vc->work_lock, &ts);
      } else {
        pthread_cond_wait(&vc->work_cond, &vc->work_lock);
      }
      pass++;
      continue;
    }
    work_unlink_locked(vc, vp);
    vp->pass = pass;
    /* Its turn runs without work_lock (serve, under ctx->lock, never waits
     * for an ibverbs call) on the messages taken now; busy_vp keeps
     * peer_close from freeing vp meanwhile. */
    struct vrb_in in[sizeof(vp->in) / sizeof(vp->in[0])];
    int n_in = vp->n_in;
    memcpy(in, vp->in, sizeof(in[0]) * (size_t)n_in);
    vp->n_in = 0;
    vc->busy_vp = vp;
    pthread_mutex_unlock(&vc->work_lock);
    bool again = step(ctx, vc, vp, in, n_in, hixl__now_ns());
    pthread_mutex_lock(&vc->work_lock);
    vc->busy_vp = NULL;
    pthread_cond_broadcast(&vc->turn_cond);
    if (again || vp->n_in > 0) /* waiting, or messages came during the turn */
      work_add_locked(vc, vp, vp->n_in > 0);
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

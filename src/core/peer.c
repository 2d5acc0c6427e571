/* SPDX-License-Identifier: MIT */
/*
 * Peers' lifetime (the control plane: conn.h): creating a peer record,
 * failing a peer and what waits on it, the self peer, hixl_disconnect and
 * freeing every peer at context destruction.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "config.h"
#include "conn.h"
#include "tls.h"

int hixl__ctx_timeout(const hixl_ctx_t *ctx) { return ctx->cfg.timeout_ms; }

void hixl__wake(hixl_ctx_t *ctx)
{
  uint64_t one = 1;
  ssize_t r = write(ctx->wake_fd, &one, sizeof(one));
  (void)r; /* a full eventfd already wakes the thread */
}

hixl_peer_t *hixl__peer_new(hixl_ctx_t *ctx, int fd, bool inbound)
{
  hixl_peer_t *p = calloc(1, sizeof(*p));
  if (p == NULL)
    return NULL;
  p->magic = HIXL_MAGIC_PEER;
  p->ctx = ctx;
  p->fd = fd;
  p->tls_fd = -1;
  p->inbound = inbound;
  atomic_init(&p->state, HIXL_PEER_CONNECTING);
  pthread_mutex_init(&p->send_lock, NULL);
  pthread_mutex_init(&p->why_lock, NULL);
  p->last_rx_ns = hixl__now_ns();
  p->born_ns = p->last_rx_ns;
  atomic_init(&p->last_tx_ns, p->last_rx_ns);
  return p;
}

bool hixl__peer_link_locked(hixl_ctx_t *ctx, hixl_peer_t *p)
{
  if (ctx->hk_n == ctx->hk_cap) {
    uint32_t cap = ctx->hk_cap ? 2 * ctx->hk_cap : 64;
    struct hixl_hk_slot *v = realloc(ctx->hk, cap * sizeof(*v));
    if (v == NULL)
      return false;
    ctx->hk = v;
    ctx->hk_cap = cap;
  }
  p->hk_idx = ctx->hk_n++;
  ctx->hk[p->hk_idx] = (struct hixl_hk_slot){.due_ns = 0, .p = p}; /* due at the next tick */
  p->next = ctx->peers;
  p->pprev = &ctx->peers;
  if (p->next)
    p->next->pprev = &p->next;
  ctx->peers = p;
  return true;
}

void hixl__peer_unlink_locked(hixl_ctx_t *ctx, hixl_peer_t *p)
{
  *p->pprev = p->next;
  if (p->next)
    p->next->pprev = p->pprev;
  p->next = NULL;
  p->pprev = NULL;
  /* The last slot takes its place (housekeeping walks the array from the
   * end, so the one moved was visited already). */
  struct hixl_hk_slot last = ctx->hk[--ctx->hk_n];
  ctx->hk[p->hk_idx] = last;
  last.p->hk_idx = p->hk_idx;
}

/* A control message waiting in a peer's output queue. */

/* Drop what is queued for p (its socket is going away).  send_lock held. */
void hixl__outq_clear(hixl_peer_t *p)
{
  while (p->oq_head) {
    hixl_outmsg_t *q = p->oq_head;
    p->oq_head = q->next;
    for (int i = 0; i < q->nfds; i++)
      close(q->fds[i]);
    free(q);
  }
  p->oq_tail = NULL;
  p->oq_bytes = 0;
}

void hixl__peer_free(hixl_peer_t *p)
{
  /* The transport first: a thread of its own may still be sending to p
   * (verbs' QP set-up thread) until peer_close returns. */
  if (p->ops)
    p->ops->peer_close(p);
  hixl__outq_clear(p);
  hixl__tls_free(p->tls);
  for (int i = 0; i < p->n_rx_fds; i++)
    close(p->rx_fds[i]);
  if (p->fd >= 0)
    close(p->fd);
  free(p->rx);
  pthread_mutex_destroy(&p->send_lock);
  pthread_mutex_destroy(&p->why_lock);
  p->magic = HIXL_MAGIC_DEAD;
  free(p);
}

/* Keep the first reason a peer ended for, so that every later PEER_LOST
 * says it (the info-level log line is usually off). */
static void note_why(hixl_peer_t *p, const char *why)
{
  bool no = false;
  if (why == NULL || !atomic_compare_exchange_strong(&p->why_claimed, &no, true))
    return;
  snprintf(p->lost_why, sizeof(p->lost_why), "%s", why);
  atomic_store_explicit(&p->why_ready, true, memory_order_release);
}

const char *hixl__peer_why(hixl_peer_t *p)
{
  return atomic_load_explicit(&p->why_ready, memory_order_acquire) ? p->lost_why : NULL;
}

void hixl__peer_op_why(hixl_peer_t *p, hixl_status_t st, const char *why)
{
  pthread_mutex_lock(&p->why_lock);
  p->op_why_st = st;
  snprintf(p->op_why, sizeof(p->op_why), "%s", why);
  pthread_mutex_unlock(&p->why_lock);
}

hixl_status_t hixl__peer_state_err(const char *fn, hixl_peer_t *p, const char *tail)
{
  const char *why = hixl__peer_why(p);
  bool closed = atomic_load(&p->state) == HIXL_PEER_CLOSED;
  return hixl__err(HIXL_ERR_PEER_LOST, "%s: peer %s is %s%s%s%s%s", fn, p->name,
                   closed ? "disconnected" : "lost", why ? " (" : "", why ? why : "",
                   why ? ")" : "", tail ? tail : "");
}

void hixl__peer_lost_async(hixl_peer_t *p, const char *why)
{
  int up = HIXL_PEER_UP;
  if (atomic_compare_exchange_strong(&p->state, &up, HIXL_PEER_LOST)) {
    note_why(p, why);
    hixl_info("peer %s lost: %s", p->name, why);
    atomic_store(&p->ctx->hk_due, true);
    hixl__wake(p->ctx);         /* the control thread fails its pending calls */
    hixl__wake_waiters(p->ctx); /* waits on this peer end */
  }
}

/* Fail every control call waiting on p; ctx->lock held. */
void hixl__fail_pending_locked(hixl_peer_t *p)
{
  hixl_pending_t *pd = p->pending;
  p->pending = NULL;
  while (pd) {
    hixl_pending_t *next = pd->next;
    pd->status = HIXL_ERR_PEER_LOST;
    pd->done = true;
    if (pd->req) {
      hixl__pending_req_end(pd, HIXL_ERR_PEER_LOST, 0);
      free(pd);
    }
    pd = next;
  }
  pthread_cond_broadcast(&p->ctx->cond);
}

void hixl__peer_fail_locked(hixl_peer_t *p, int state, const char *why)
{
  int old = atomic_load(&p->state);
  if (old == HIXL_PEER_LOST || old == HIXL_PEER_CLOSED)
    return;
  note_why(p, why);
  atomic_store(&p->state, state);
  p->lost_ns = hixl__now_ns();
  if (!p->unix_pending && old == HIXL_PEER_UP)
    hixl_info("peer %s %s: %s", p->name, state == HIXL_PEER_LOST ? "lost" : "closed", why);
  /* Counted once (stats.h): a peer we said BYE to is a disconnect even
   * when its hang-up (after our BYE) is seen first, as a loss. */
  if (old == HIXL_PEER_UP && !p->self)
    atomic_fetch_add_explicit(state == HIXL_PEER_CLOSED || atomic_load(&p->bye_sent)
                                  ? &p->ctx->cnt.disconnects
                                  : &p->ctx->cnt.losses,
                              1, memory_order_relaxed);
  hixl__fail_pending_locked(p);
  /* Let the transport fail what is in flight now, not when its own retries
   * run out (verbs: the QPs go to ERROR and flush). */
  if (old == HIXL_PEER_UP && p->ops && p->ops->peer_lost)
    p->ops->peer_lost(p);
  atomic_store(&p->ctx->hk_due, true); /* its socket closes at once */
  hixl__wake(p->ctx);
  hixl__wake_waiters(p->ctx); /* waits on this peer end */
}

hixl_peer_t *hixl__self_peer(hixl_ctx_t *ctx)
{
  hixl_peer_t *p = hixl__peer_new(ctx, -1, false);
  if (p == NULL)
    return NULL;
  p->self = true;
  p->ops = hixl__tp_loopback();
  p->remote_ctx_id = ctx->id;
  p->remote_pid = getpid();
  snprintf(p->name, sizeof(p->name), "self(%s)", ctx->address);
  if (p->ops->connect(p, NULL, INT64_MAX) != HIXL_OK) {
    p->ops = NULL;
    hixl__peer_free(p);
    return NULL;
  }
  pthread_mutex_lock(&ctx->lock);
  if (!hixl__peer_link_locked(ctx, p)) {
    pthread_mutex_unlock(&ctx->lock);
    hixl__peer_free(p);
    return NULL;
  }
  atomic_store(&p->state, HIXL_PEER_UP);
  pthread_mutex_unlock(&ctx->lock);
  return p;
}

/* hixl_disconnect's work, ctx->lock held (dropped while the control thread
 * closes the socket). */
static void disconnect_locked(hixl_peer_t *peer)
{
  hixl_ctx_t *ctx = peer->ctx;
  hixl__peer_fail_locked(peer, HIXL_PEER_CLOSED, "disconnected by us");
  /* Closed by the user, even if the peer's EOF (after our BYE) won the race
   * and marked it lost first: later calls say "disconnected". */
  atomic_store(&peer->state, HIXL_PEER_CLOSED);
  /* The control thread closes the socket; wait for it so that nothing
   * reads from a peer we are about to tear down. */
  while (peer->fd >= 0 && !peer->self) {
    atomic_store(&ctx->hk_due, true);
    hixl__wake(ctx);
    hixl__cond_wait_until(ctx, hixl__deadline(100), 100);
  }
  /* Release transport resources now; keep the handle (state CLOSED) so a
   * use after disconnect is reported as PEER_LOST, not a crash.  It is freed
   * with the context, or after the grace once released. */
  if (peer->ops) {
    for (hixl_rmr_t *r = peer->rmrs; r; r = r->next)
      peer->ops->rmr_detach(r);
    peer->ops->peer_close(peer);
    peer->ops = &hixl__closed_ops;
  }
}

static void say_bye(hixl_peer_t *peer)
{
  atomic_store(&peer->bye_sent, true);
  if (atomic_load(&peer->state) == HIXL_PEER_UP && !peer->self) {
    /* hixl__send reads peer->fd under its send_lock: the control thread
     * may be closing it right now (a peer lost meanwhile). */
    hixl_msg_t bye = {.type = HIXL_MSG_BYE};
    hixl__send(peer, &bye, NULL, 0);
  }
}

hixl_status_t hixl_disconnect(hixl_peer_t *peer)
{
  if (peer == NULL || peer->magic != HIXL_MAGIC_PEER)
    return hixl__err(HIXL_ERR_INVALID, "hixl_disconnect: %s peer",
                     peer == NULL ? "NULL" : "invalid or freed");
  hixl_ctx_t *ctx = peer->ctx;
  say_bye(peer);
  pthread_mutex_lock(&ctx->lock);
  disconnect_locked(peer);
  pthread_mutex_unlock(&ctx->lock);
  return HIXL_OK;
}

hixl_status_t hixl_peer_release(hixl_peer_t *peer)
{
  if (peer == NULL || peer->magic != HIXL_MAGIC_PEER)
    return hixl__err(HIXL_ERR_INVALID, "hixl_peer_release: %s peer",
                     peer == NULL ? "NULL" : "invalid or freed");
  hixl_ctx_t *ctx = peer->ctx;
  /* Claimed under the lock, where a world takes peers (world.c) and a
   * second release looks: from here on neither can have it. */
  pthread_mutex_lock(&ctx->lock);
  hixl_status_t st = HIXL_OK;
  size_t n_rmrs = 0;
  for (hixl_rmr_t *r = peer->rmrs; r; r = r->next)
    n_rmrs++;
  if (atomic_load(&peer->world_owned))
    st = hixl__err(HIXL_ERR_INVALID,
                   "hixl_peer_release: peer %s is a rank of a world, which owns it "
                   "(hixl_world_destroy, or the rank coming back, lets it go)",
                   peer->name);
  else if (atomic_load(&peer->releasing))
    st = hixl__err(HIXL_ERR_INVALID, "hixl_peer_release: peer %s was released already", peer->name);
  else if (n_rmrs)
    st = hixl__err(HIXL_ERR_INVALID,
                   "hixl_peer_release: peer %s still has %zu remote region(s); "
                   "hixl_rmr_release them first",
                   peer->name, n_rmrs);
  else
    atomic_store(&peer->releasing, true);
  pthread_mutex_unlock(&ctx->lock);
  if (st != HIXL_OK)
    return st;
  say_bye(peer);
  pthread_mutex_lock(&ctx->lock);
  disconnect_locked(peer);
  /* Its notifications not yet taken went with peer_close.  The control
   * thread frees the record once the grace after its end is over (an
   * operation that passed its state check before it may still be in the
   * transport until then). */
  atomic_store(&peer->released, true);
  ctx->hk[peer->hk_idx].due_ns = 0;
  pthread_mutex_unlock(&ctx->lock);
  return HIXL_OK;
}

void hixl__peer_world_disown(hixl_peer_t *p)
{
  hixl_ctx_t *ctx = p->ctx;
  /* Disconnected first: nothing more comes from it, and its notifications
   * not yet taken are dropped.  A consumer that took one just before
   * marks the peer handed under the consumers' lock (notif.c), which
   * hixl__inbox_forget skips when it finds nothing left: pass through
   * that lock, so the look at handed below comes after any such. */
  hixl_disconnect(p);
  pthread_mutex_lock(&ctx->notif.lock);
  pthread_mutex_unlock(&ctx->notif.lock);
  /* All in one hold of the lock: housekeeping never sees the peer neither
   * the world's nor released (it would free a never-handed inbound one at
   * once, under our feet).  Released with rmrs still held (a world's
   * exchange made them; the application has no handle to release it
   * with): freed once the last goes (hixl_rmr_release). */
  pthread_mutex_lock(&ctx->lock);
  if (!atomic_load(&p->handed) && !atomic_load(&p->releasing)) {
    atomic_store(&p->releasing, true);
    atomic_store(&p->released, true); /* closed by hixl_disconnect above */
    ctx->hk[p->hk_idx].due_ns = 0;
  }
  atomic_store(&p->world_owned, false);
  pthread_mutex_unlock(&ctx->lock);
}

void hixl__peer_world_own(hixl_peer_t *p) { atomic_store(&p->world_owned, true); }

hixl_peer_t **hixl__peers_pin(hixl_ctx_t *ctx, bool (*keep)(hixl_peer_t *p), size_t *n_p)
{
  pthread_mutex_lock(&ctx->lock);
  size_t n = 0;
  for (hixl_peer_t *p = ctx->peers; p; p = p->next)
    n += keep(p);
  hixl_peer_t **snap = n ? malloc(n * sizeof(*snap)) : NULL;
  size_t k = 0;
  for (hixl_peer_t *p = ctx->peers; p && snap; p = p->next)
    if (keep(p))
      snap[k++] = p;
  for (size_t i = 0; i < k; i++)
    snap[i]->pins++;
  pthread_mutex_unlock(&ctx->lock);
  *n_p = snap ? k : n;
  return snap;
}

void hixl__peers_unpin(hixl_ctx_t *ctx, hixl_peer_t **snap, size_t n)
{
  if (snap == NULL)
    return;
  pthread_mutex_lock(&ctx->lock);
  for (size_t i = 0; i < n; i++)
    snap[i]->pins--; /* a free held back meanwhile: 50 ms later */
  pthread_mutex_unlock(&ctx->lock);
  free(snap);
}

const char *hixl_peer_transport(const hixl_peer_t *peer)
{
  if (peer == NULL || peer->magic != HIXL_MAGIC_PEER || peer->ops == NULL)
    return NULL;
  return peer->ops->name;
}

/* Free every peer; the control thread is stopped.  For hixl_ctx_destroy. */
void hixl__peers_destroy(hixl_ctx_t *ctx)
{
  while (ctx->peers) {
    hixl_peer_t *p = ctx->peers;
    hixl__peer_unlink_locked(ctx, p);
    if (atomic_load(&p->state) == HIXL_PEER_UP && p->fd >= 0 && !p->inbound) {
      hixl_msg_t bye = {.type = HIXL_MSG_BYE};
      hixl__send(p, &bye, NULL, 0);
    }
    hixl__peer_fail_locked(p, HIXL_PEER_CLOSED, "context destroyed");
    while (p->rmrs) {
      hixl_rmr_t *r = p->rmrs;
      p->rmrs = r->next;
      if (p->ops)
        p->ops->rmr_detach(r);
      r->magic = HIXL_MAGIC_DEAD;
      free(r);
    }
    hixl__peer_free(p);
  }
}

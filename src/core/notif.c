/* SPDX-License-Identifier: MIT */
/*
 * Notifications.  Every peer that can notify us has an inbox ring (shm: in
 * memory the peer writes directly; self: local).  Polling takes entries in
 * ring order, which is issue order for that peer; peers are visited round
 * robin so none starves.
 */
#define _GNU_SOURCE
#include "core.h"

typedef struct push_wait {
  hixl_peer_t *peer;
  hixl_ring_t *ring;
  uint64_t pos;
  bool claimed;
} push_wait_t;

static bool push_ready(void *arg)
{
  push_wait_t *w = arg;
  w->claimed = hixl_ring_claim(w->ring, &w->pos);
  return w->claimed || atomic_load(&w->peer->state) != HIXL_PEER_UP;
}

hixl_status_t hixl__notify_push(hixl_peer_t *peer, hixl_ring_t *ring, uint32_t imm, uint64_t len)
{
  uint64_t pos;
  if (hixl_likely(hixl_ring_claim(ring, &pos))) {
    hixl_ring_publish(ring, pos, imm, len);
    return HIXL_OK;
  }
  /* Full: the target drains it when it polls.  Wait, bounded, so a target
   * that never polls costs the initiator timeout_ms and an AGAIN, never a
   * lost or reordered notification.  Its consumer wakes us when it takes
   * entries while we announce that we wait for room (notif_consumed). */
  hixl_ctx_t *ctx = peer->ctx;
  int timeout = hixl__ctx_timeout(ctx);
  push_wait_t w = {.peer = peer, .ring = ring};
  atomic_fetch_add(ctx->space_waiters, 1);
  hixl_status_t st = hixl__wait(ctx, hixl__deadline(timeout), 0, push_ready, &w);
  atomic_fetch_sub(ctx->space_waiters, 1);
  if (w.claimed) {
    hixl_ring_publish(ring, w.pos, imm, len);
    return HIXL_OK;
  }
  if (st == HIXL_OK)
    return hixl__err(HIXL_ERR_PEER_LOST,
                     "notify: peer %s lost while its notification ring was full", peer->name);
  return hixl__err(HIXL_ERR_AGAIN,
                   "notify: notification ring of peer %s full (%llu entries) for %d ms: "
                   "the target does not poll notifications",
                   peer->name, (unsigned long long)hixl_ring_cap(ring), timeout);
}

int hixl_notif_poll(hixl_ctx_t *ctx, hixl_notif_t *out, int max)
{
  if (ctx == NULL || out == NULL || max < 0)
    return hixl__err(HIXL_ERR_INVALID, "hixl_notif_poll: %s",
                     ctx == NULL   ? "NULL ctx"
                     : out == NULL ? "NULL out"
                                   : "max < 0");
  int n = 0;
  for (size_t t = 0; t < hixl__n_transports; t++) {
    const hixl_transport_ops_t *o = hixl__transports[t];
    if (o->notif_poll && (ctx->tp_ready & (1u << o->id)))
      o->notif_poll(ctx);
  }
  pthread_mutex_lock(&ctx->lock);
  unsigned npeers = 0;
  for (hixl_peer_t *p = ctx->peers; p; p = p->next)
    npeers++;
  unsigned start = npeers ? atomic_fetch_add(&ctx->notif_rr, 1) % npeers : 0;
  for (int pass = 0; pass < 2 && n < max; pass++) {
    unsigned i = 0;
    for (hixl_peer_t *p = ctx->peers; p && n < max; p = p->next, i++) {
      /* First pass: from start to the end; second: the ones before start. */
      if ((pass == 0) != (i >= start) || p->inbox == NULL)
        continue;
      uint32_t imm;
      uint64_t len;
      int n0 = n;
      while (n < max && hixl_ring_pop(p->inbox, &imm, &len)) {
        out[n].peer = p;
        out[n].imm = imm;
        out[n].len = (size_t)len;
        n++;
      }
      /* Room made: a producer may wait for it (hixl__notify_push). */
      if (n > n0 && p->ops->notif_consumed)
        p->ops->notif_consumed(p);
    }
  }
  pthread_mutex_unlock(&ctx->lock);
  return n;
}

typedef struct notif_wait {
  hixl_ctx_t *ctx;
  hixl_notif_t *out;
  int n;
  unsigned looks;
} notif_wait_t;

static bool notif_ready(void *arg)
{
  notif_wait_t *w = arg;
  w->n = hixl_notif_poll(w->ctx, w->out, 1);
  if (w->n != 0)
    return true;
  /* The inboxes' own sources are driven by hixl_notif_poll (the transports'
   * notif_poll); the caller's other operations get progress too, but not
   * at every look: a full progress pass costs the notification's latency. */
  if ((w->looks++ & 31) == 0)
    hixl_progress(w->ctx);
  return false;
}

hixl_status_t hixl_notif_wait(hixl_ctx_t *ctx, hixl_notif_t *out, int timeout_ms)
{
  if (ctx == NULL || out == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_notif_wait: NULL %s", ctx == NULL ? "ctx" : "out");
  notif_wait_t w = {ctx, out, 0, 1};
  if (notif_ready(&w))
    return w.n > 0 ? HIXL_OK : w.n;
  if (timeout_ms == 0 || hixl__wait(ctx, hixl__deadline(timeout_ms), 0, notif_ready, &w) != HIXL_OK)
    return hixl__err(HIXL_ERR_TIMEOUT, "hixl_notif_wait: no notification in %d ms", timeout_ms);
  return w.n > 0 ? HIXL_OK : w.n;
}

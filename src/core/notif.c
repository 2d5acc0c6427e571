/* SPDX-License-Identifier: MIT */
/*
 * Notifications.  A shm peer writes its own inbox ring in memory it maps,
 * and self has a local one; verbs and fabric peers' notifications arrive
 * in our process (receive completions) and go into one inbox per context,
 * each entry tagged with its peer (docs/scale.md: 2 MiB per peer before).
 * Polling takes entries in ring order, which is issue order for a peer;
 * the peers' own rings are visited round robin, and the context's inbox
 * in turn with them, so none starves.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/mman.h>

#include "core.h"

/* Entries in the context's inbox: what all its verbs and fabric peers may
 * have delivered and not yet been taken (beyond it their messages wait in
 * the transport's receive buffers: nothing is lost). */
#define CTX_INBOX_CAP 65536u

hixl_status_t hixl__notif_init(hixl_ctx_t *ctx)
{
  pthread_mutex_init(&ctx->notif.lock, NULL);
  for (size_t t = 0; t < hixl__n_transports; t++)
    if (hixl__transports[t]->notif_poll)
      ctx->notif.tp_mask |= 1u << hixl__transports[t]->id;
  /* Anonymous memory is zero, so only the header is written and the cells'
   * pages come as positions reach them. */
  void *m = mmap(NULL, hixl_ring_bytes(CTX_INBOX_CAP), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return hixl__err(HIXL_ERR_NOMEM, "hixl_ctx_create: no memory for the notification inbox");
  ctx->inbox = m;
  hixl_ring_init_zeroed(ctx->inbox, CTX_INBOX_CAP);
  return HIXL_OK;
}

void hixl__notif_fini(hixl_ctx_t *ctx)
{
  if (ctx->inbox)
    munmap(ctx->inbox, hixl_ring_bytes(CTX_INBOX_CAP));
  ctx->inbox = NULL;
  free(ctx->notif.v);
  ctx->notif.v = NULL;
  ctx->notif.n = ctx->notif.cap = 0;
  pthread_mutex_destroy(&ctx->notif.lock);
}

hixl_status_t hixl__notif_src_add(hixl_peer_t *peer, hixl_ring_t *ring)
{
  hixl_ctx_t *ctx = peer->ctx;
  hixl_status_t st = HIXL_OK;
  pthread_mutex_lock(&ctx->notif.lock);
  if (ctx->notif.n == ctx->notif.cap) {
    unsigned cap = ctx->notif.cap ? 2 * ctx->notif.cap : 16;
    hixl_notif_src_t *v = realloc(ctx->notif.v, cap * sizeof(*v));
    if (v == NULL)
      st = hixl__err(HIXL_ERR_NOMEM, "no memory to poll the notifications of peer %s", peer->name);
    else {
      ctx->notif.v = v;
      ctx->notif.cap = cap;
    }
  }
  if (st == HIXL_OK) {
    ctx->notif.v[ctx->notif.n++] = (hixl_notif_src_t){.ring = ring, .peer = peer};
    peer->inbox = ring;
  }
  pthread_mutex_unlock(&ctx->notif.lock);
  return st;
}

void hixl__notif_src_del(hixl_peer_t *peer)
{
  hixl_ctx_t *ctx = peer->ctx;
  pthread_mutex_lock(&ctx->notif.lock);
  for (unsigned i = 0; i < ctx->notif.n; i++)
    if (ctx->notif.v[i].peer == peer) {
      ctx->notif.v[i] = ctx->notif.v[--ctx->notif.n]; /* order is the round robin's only */
      break;
    }
  peer->inbox = NULL;
  pthread_mutex_unlock(&ctx->notif.lock);
}

bool hixl__inbox_push(hixl_peer_t *peer, uint32_t imm, uint64_t len)
{
  /* Not up yet (a notification can outrun the end of our side of the
   * handshake): later.  Up, lost or closing: delivered, in order. */
  if (atomic_load_explicit(&peer->state, memory_order_acquire) == HIXL_PEER_CONNECTING)
    return false;
  atomic_fetch_add_explicit(&peer->inbox_queued, 1, memory_order_relaxed);
  if (hixl_ring_push_tag(peer->ctx->inbox, imm, len, (uint64_t)(uintptr_t)peer))
    return true;
  atomic_fetch_sub_explicit(&peer->inbox_queued, 1, memory_order_relaxed);
  return false;
}

void hixl__inbox_forget(hixl_peer_t *peer)
{
  if (atomic_load(&peer->inbox_queued) == 0)
    return;
  /* Tag 0: hixl_notif_poll skips the entry.  Under the consumers' lock:
   * none of them reads a tag meanwhile. */
  hixl_ctx_t *ctx = peer->ctx;
  pthread_mutex_lock(&ctx->notif.lock);
  unsigned n = hixl_ring_retag(ctx->inbox, (uint64_t)(uintptr_t)peer, 0);
  pthread_mutex_unlock(&ctx->notif.lock);
  atomic_fetch_sub(&peer->inbox_queued, n);
}

/* Take up to max entries of the context's inbox into out (notif.lock held). */
static int inbox_take_locked(hixl_ctx_t *ctx, hixl_notif_t *out, int max)
{
  int n = 0;
  uint32_t imm;
  uint64_t len, tag;
  while (n < max && hixl_ring_pop_tag(ctx->inbox, &imm, &len, &tag)) {
    hixl_peer_t *p = (hixl_peer_t *)(uintptr_t)tag;
    if (p == NULL)
      continue; /* its peer was closed (hixl__inbox_forget) */
    atomic_fetch_sub_explicit(&p->inbox_queued, 1, memory_order_relaxed);
    hixl__peer_handed(p);
    out[n].peer = p;
    out[n].imm = imm;
    out[n].len = (size_t)len;
    n++;
  }
  return n;
}

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
  hixl_status_t st = hixl__wait(ctx, hixl__deadline(timeout), HIXL_WAITF_SPACE, push_ready, &w);
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
  /* Transports that deliver into the context's inbox bring in what
   * arrived (verbs, fabric: while they are set up). */
  if (atomic_load_explicit(&ctx->tp_ready, memory_order_relaxed) & ctx->notif.tp_mask)
    for (size_t t = 0; t < hixl__n_transports; t++) {
      const hixl_transport_ops_t *o = hixl__transports[t];
      if (o->notif_poll && (ctx->tp_ready & (1u << o->id)))
        o->notif_poll(ctx);
    }
  pthread_mutex_lock(&ctx->notif.lock);
  unsigned ns = ctx->notif.n;
  /* The context's inbox takes its turn as one more member of the round. */
  unsigned start = ctx->notif.rr++ % (ns + 1);
  bool inbox_first = start == ns;
  if (inbox_first) {
    n = inbox_take_locked(ctx, out, max);
    start = 0;
  }
  for (unsigned k = 0; k < ns && n < max; k++) {
    const hixl_notif_src_t *s = &ctx->notif.v[(start + k) % ns];
    if (!hixl_ring_maybe_nonempty(s->ring))
      continue;
    hixl_peer_t *p = s->peer;
    /* Not up yet (its connect has not returned): later, as in the inbox. */
    if (atomic_load_explicit(&p->state, memory_order_acquire) == HIXL_PEER_CONNECTING)
      continue;
    uint32_t imm;
    uint64_t len;
    int n0 = n;
    while (n < max && hixl_ring_pop(s->ring, &imm, &len)) {
      out[n].peer = p;
      out[n].imm = imm;
      out[n].len = (size_t)len;
      n++;
    }
    if (n == n0)
      continue;
    hixl__peer_handed(p);
    /* Room made: a producer may wait for it (hixl__notify_push). */
    if (p->ops->notif_consumed)
      p->ops->notif_consumed(p);
  }
  if (n < max && !inbox_first)
    n += inbox_take_locked(ctx, out + n, max - n);
  if (n > 0) { /* counted under notif.lock, which serializes the consumers */
    hixl__stat_add(&ctx->cnt.notif_received, (uint64_t)n);
    for (int i = 0; i < n; i++)
      hixl__stat_add(&out[i].peer->st_notif_rx, 1);
  }
  pthread_mutex_unlock(&ctx->notif.lock);
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

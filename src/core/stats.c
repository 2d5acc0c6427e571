/* SPDX-License-Identifier: MIT */
/*
 * hixl_ctx_stats: a context's and a peer's counters as name/value pairs
 * (stats.h says how they are counted; docs/observability.md what each
 * means).  The list only grows at its end: a program built against an
 * older header that asks for N figures gets the same first N.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

__thread hixl_tstats_cache_t hixl__tstats_tl __attribute__((tls_model("initial-exec")));

hixl_tstats_t *hixl__tstats_slow(hixl_ctx_t *ctx)
{
  hixl_tstats_cache_t *tl = &hixl__tstats_tl;
  hixl_tstats_t *b = NULL;
  int i;
  for (i = 1; i < HIXL_TSTATS_CACHE; i++)
    if (tl->id[i] == ctx->id) {
      b = tl->b[i];
      break;
    }
  if (b == NULL) {
    unsigned long me = (unsigned long)pthread_self();
    pthread_mutex_lock(&ctx->stats_lock);
    for (b = atomic_load(&ctx->tstats); b; b = b->next)
      if (b->owner == me)
        break; /* ours, or that of an ended thread whose pthread_t we got */
    if (b == NULL && (b = calloc(1, sizeof(*b))) != NULL) {
      b->owner = me;
      b->next = atomic_load(&ctx->tstats);
      atomic_store_explicit(&ctx->tstats, b, memory_order_release);
    }
    pthread_mutex_unlock(&ctx->stats_lock);
    if (b == NULL)
      return NULL;
    i = HIXL_TSTATS_CACHE - 1; /* evict the last */
  }
  /* Move to the front. */
  for (; i > 0; i--) {
    tl->id[i] = tl->id[i - 1];
    tl->b[i] = tl->b[i - 1];
  }
  tl->id[0] = ctx->id;
  tl->b[0] = b;
  return b;
}

void hixl__stats_fini(hixl_ctx_t *ctx)
{
  hixl_tstats_t *b = atomic_load(&ctx->tstats);
  while (b) {
    hixl_tstats_t *n = b->next;
    free(b);
    b = n;
  }
  atomic_store(&ctx->tstats, NULL);
  /* Our own cache: another thread's stale entries carry an id no live
   * context has. */
  for (int i = 0; i < HIXL_TSTATS_CACHE; i++)
    if (hixl__tstats_tl.id[i] == ctx->id)
      hixl__tstats_tl.id[i] = 0, hixl__tstats_tl.b[i] = NULL;
}

void hixl__stat_error(hixl_ctx_t *ctx, hixl_peer_t *peer, int status)
{
  if (ctx == NULL || status >= 0 || -status >= (int)(sizeof(ctx->cnt.errors) / 8))
    return;
  atomic_fetch_add_explicit(&ctx->cnt.errors[-status], 1, memory_order_relaxed);
  if (peer)
    atomic_fetch_add_explicit(&peer->st_errors, 1, memory_order_relaxed);
}

/* ------------------------------------------------------------ the lists */

typedef struct stat_def {
  const char *name, *help;
  int kind;
} stat_def_t;

#define C HIXL_STAT_COUNTER
#define G HIXL_STAT_GAUGE

/* Both lists start with the operation counters, in HIXL_OPSTATS order. */
#define HIXL_X(id, name, help) {name, help, C},
static const stat_def_t ctx_defs[] = {
    HIXL_OPSTATS(HIXL_X)
    /* HIXL_OPST_N */
    {"errors", "operations that failed, at issue or at completion, every status", C},
    {"errors_invalid", "operations that failed with HIXL_ERR_INVALID", C},
    {"errors_nomem", "operations that failed with HIXL_ERR_NOMEM", C},
    {"errors_not_registered", "operations that failed with HIXL_ERR_NOT_REGISTERED", C},
    {"errors_access", "operations that failed with HIXL_ERR_ACCESS", C},
    {"errors_unsupported", "operations that failed with HIXL_ERR_UNSUPPORTED", C},
    {"errors_timeout", "operations that failed with HIXL_ERR_TIMEOUT", C},
    {"errors_peer_lost", "operations that failed with HIXL_ERR_PEER_LOST", C},
    {"errors_transport", "operations that failed with HIXL_ERR_TRANSPORT", C},
    {"errors_auth", "operations that failed with HIXL_ERR_AUTH", C},
    {"errors_again", "operations that failed with HIXL_ERR_AGAIN", C},
    {"errors_no_device", "operations that failed with HIXL_ERR_NO_DEVICE", C},
    {"in_flight", "operations issued and not yet complete, over every peer", G},
    {"notifications_received", "notifications taken by hixl_notif_poll / hixl_notif_wait", C},
    {"notifications_dropped", "notifications dropped: from a sender that is not a bound peer", C},
    {"connects", "connections this context made (hixl_connect that succeeded)", C},
    {"accepts", "peers that connected to this context", C},
    {"disconnects", "peers closed: by hixl_disconnect or by the peer's own (BYE)", C},
    {"peer_losses", "peers lost: died, stopped answering, or the connection broke", C},
    {"peers", "peers connected now (both directions)", G},
    {"wait_spin_ns", "time blocking calls spent polling before sleeping (or spinning)", C},
    {"wait_sleeps", "times a blocking call slept in the kernel", C},
    {"wait_sleep_ns", "time blocking calls spent asleep", C},
};
static const stat_def_t peer_defs[] = {
    HIXL_OPSTATS(HIXL_X)
    /* HIXL_OPST_N */
    {"errors", "operations to this peer that failed, at issue or at completion", C},
    {"in_flight", "operations to this peer issued and not yet complete", G},
    {"notifications_received", "notifications from this peer taken by the user", C},
    {"up", "1 while the peer is connected, 0 once lost or disconnected", G},
};
#undef HIXL_X
#undef C
#undef G

enum {
  N_CTX = sizeof(ctx_defs) / sizeof(ctx_defs[0]),
  N_PEER = sizeof(peer_defs) / sizeof(peer_defs[0])
};

static uint64_t in_flight(hixl_peer_t *p)
{
  uint64_t done = atomic_load_explicit(&p->completed, memory_order_acquire);
  uint64_t issued = atomic_load_explicit(&p->issued, memory_order_relaxed);
  return issued > done ? issued - done : 0;
}

static void ctx_values(hixl_ctx_t *ctx, uint64_t *v)
{
  uint64_t t[HIXL_TST_N] = {0};
  for (hixl_tstats_t *b = atomic_load_explicit(&ctx->tstats, memory_order_acquire); b; b = b->next)
    for (int i = 0; i < HIXL_TST_N; i++)
      t[i] += atomic_load_explicit(&b->c[i], memory_order_relaxed);
  int k = 0;
  for (int i = 0; i < HIXL_OPST_N; i++)
    v[k++] = t[i];
  uint64_t all = 0;
  for (int s = 1; s <= 11; s++)
    all += atomic_load_explicit(&ctx->cnt.errors[s], memory_order_relaxed);
  v[k++] = all;
  for (int s = 1; s <= 11; s++)
    v[k++] = atomic_load_explicit(&ctx->cnt.errors[s], memory_order_relaxed);
  uint64_t fl = 0, up = 0;
  pthread_mutex_lock(&ctx->lock);
  for (hixl_peer_t *p = ctx->peers; p; p = p->next) {
    if (p->self)
      continue;
    fl += in_flight(p);
    up += atomic_load(&p->state) == HIXL_PEER_UP;
  }
  pthread_mutex_unlock(&ctx->lock);
  v[k++] = fl;
  v[k++] = atomic_load(&ctx->cnt.notif_received);
  v[k++] = atomic_load(&ctx->cnt.notif_dropped);
  v[k++] = atomic_load(&ctx->cnt.connects);
  v[k++] = atomic_load(&ctx->cnt.accepts);
  v[k++] = atomic_load(&ctx->cnt.disconnects);
  v[k++] = atomic_load(&ctx->cnt.losses);
  v[k++] = up;
  v[k++] = t[HIXL_WST_SPIN_NS];
  v[k++] = t[HIXL_WST_SLEEPS];
  v[k++] = t[HIXL_WST_SLEEP_NS];
}

static void peer_values(hixl_peer_t *p, uint64_t *v)
{
  int k = 0;
  for (int i = 0; i < HIXL_OPST_N; i++)
    v[k++] = atomic_load_explicit(&p->st[i], memory_order_relaxed);
  v[k++] = atomic_load_explicit(&p->st_errors, memory_order_relaxed);
  v[k++] = in_flight(p);
  v[k++] = atomic_load_explicit(&p->st_notif_rx, memory_order_relaxed);
  v[k++] = atomic_load(&p->state) == HIXL_PEER_UP;
}

hixl_status_t hixl_ctx_stats(hixl_ctx_t *ctx, hixl_peer_t *peer, hixl_stat_t *stats, size_t *count)
{
  if (count == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_ctx_stats: NULL count");
  if (peer == NULL && ctx == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_ctx_stats: NULL ctx and peer");
  if (peer != NULL && peer->magic != HIXL_MAGIC_PEER)
    return hixl__err(HIXL_ERR_INVALID, "hixl_ctx_stats: invalid peer");
  if (peer != NULL && ctx != NULL && peer->ctx != ctx)
    return hixl__err(HIXL_ERR_INVALID, "hixl_ctx_stats: the peer %s belongs to another context",
                     peer->name);
  if (stats == NULL && *count != 0)
    return hixl__err(HIXL_ERR_INVALID, "hixl_ctx_stats: NULL stats with a count of %zu", *count);
  const stat_def_t *defs = peer ? peer_defs : ctx_defs;
  size_t n = peer ? N_PEER : N_CTX;
  size_t fit = *count < n ? *count : n;
  *count = n;
  if (fit == 0)
    return HIXL_OK;
  uint64_t v[N_CTX > N_PEER ? N_CTX : N_PEER];
  if (peer)
    peer_values(peer, v);
  else
    ctx_values(ctx, v);
  for (size_t i = 0; i < fit; i++)
    stats[i] = (hixl_stat_t){
        .name = defs[i].name, .help = defs[i].help, .value = v[i], .kind = defs[i].kind};
  return HIXL_OK;
}

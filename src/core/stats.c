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
  for (size_t i = 0; i < ctx->n_stat_names; i++)
    free(ctx->stat_names[i]);
  free(ctx->stat_names);
  ctx->stat_names = NULL;
  ctx->n_stat_names = 0;
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
    {"peer_records",
     "peer handles this context holds, connected or not: a closed one stays until "
     "hixl_peer_release (or hixl_ctx_destroy) once the application has seen it",
     G},
    {"wait_spin_ns", "time blocking calls spent polling before sleeping (or spinning)", C},
    {"wait_sleeps", "times a blocking call slept in the kernel", C},
    {"wait_sleep_ns", "time blocking calls spent asleep", C},
    {"wait_budget_ns",
     "how long a blocking call polls now before it sleeps (HIXL_WAIT=adaptive): the wake-up "
     "latency measured recently, or how soon events came after a sleep began, 1-50 us",
     G},
    {"notifications_queued", "notifications arrived and not yet taken, from every peer", G},
    /* The transports' figures, HIXL_XST_* order. */
    {"rcache_hits", "registration cache: unregistered buffers found already registered", C},
    {"rcache_misses", "registration cache: unregistered buffers registered on first use", C},
    {"rcache_evictions", "registration cache: entries dropped to stay under its size limit", C},
    {"rcache_invalidations",
     "registration cache: entries dropped because their memory was unmapped or remapped", C},
    {"pinned_bytes",
     "host memory registered with (pinned by) an RDMA device now: host regions, the "
     "registration cache, bounce and receive buffers, peers' atomic results (the bytes its "
     "registration budget bounds)",
     G},
    {"qps",
     "RDMA queue pairs this context holds now, the count its QP budget bounds (a pair whose QPs "
     "are made on first use has none before)",
     G},
    {"qps_reclaimed",
     "times an idle peer's RDMA queue pairs were taken down to make room under a QP budget "
     "(this context's or the peer's), least recently used first; made again on their next use",
     C},
    {"mrs",
     "memory registrations with an RDMA device now (host and device regions, the registration "
     "cache's entries, the context's own buffers, peers' atomic results): the count its "
     "registration budget bounds",
     G},
    {"qp_setups_limited",
     "RDMA queue pair set-ups held back by a peer's set-up rate: its requests told to wait, and "
     "ours after it took back our queue pairs too often",
     C},
};
static const stat_def_t peer_defs[] = {
    HIXL_OPSTATS(HIXL_X)
    /* HIXL_OPST_N */
    {"errors", "operations to this peer that failed, at issue or at completion", C},
    {"in_flight", "operations to this peer issued and not yet complete", G},
    {"notifications_received", "notifications from this peer taken by the user", C},
    {"up", "1 while the peer is connected, 0 once lost or disconnected", G},
    {"notifications_queued", "notifications from this peer arrived and not yet taken", G},
    {"rtt_ns",
     "the control connection's round trip, heartbeat probe to answer: at connect and "
     "whenever the peer falls quiet (0 until measured)",
     G},
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

/* Entries in a ring: its head is the producer's (in shm, another
 * process's: any value), so the difference is clamped to the capacity. */
static uint64_t ring_queued(hixl_ring_t *r)
{
  if (r == NULL)
    return 0;
  uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  uint64_t d = head - tail;
  return (int64_t)d < 0 ? 0 : d > r->mask + 1 ? r->mask + 1 : d;
}

static uint64_t queued_all(hixl_ctx_t *ctx)
{
  pthread_mutex_lock(&ctx->notif.lock); /* a leaf lock: fine under ctx->lock */
  uint64_t q = ring_queued(ctx->inbox);
  for (unsigned i = 0; i < ctx->notif.n; i++)
    q += ring_queued(ctx->notif.v[i].ring);
  pthread_mutex_unlock(&ctx->notif.lock);
  return q;
}

static void ctx_values(hixl_ctx_t *ctx, uint64_t *v, bool locked)
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
  uint64_t fl = 0, up = 0, records = 0;
  if (!locked)
    pthread_mutex_lock(&ctx->lock);
  for (hixl_peer_t *p = ctx->peers; p; p = p->next) {
    records++;
    if (p->self)
      continue;
    fl += in_flight(p);
    up += atomic_load(&p->state) == HIXL_PEER_UP;
  }
  if (!locked)
    pthread_mutex_unlock(&ctx->lock);
  v[k++] = fl;
  v[k++] = atomic_load(&ctx->cnt.notif_received);
  v[k++] = atomic_load(&ctx->cnt.notif_dropped);
  v[k++] = atomic_load(&ctx->cnt.connects);
  v[k++] = atomic_load(&ctx->cnt.accepts);
  v[k++] = atomic_load(&ctx->cnt.disconnects);
  v[k++] = atomic_load(&ctx->cnt.losses);
  v[k++] = up;
  v[k++] = records;
  v[k++] = t[HIXL_WST_SPIN_NS];
  v[k++] = t[HIXL_WST_SLEEPS];
  v[k++] = t[HIXL_WST_SLEEP_NS];
  v[k++] = (uint64_t)atomic_load_explicit(&ctx->spin_ns, memory_order_relaxed);
  v[k++] = queued_all(ctx);
  uint64_t xs[HIXL_XST_N] = {0};
  uint32_t ready = atomic_load(&ctx->tp_ready);
  for (size_t i = 0; i < hixl__n_transports; i++)
    if (hixl__transports[i]->stats && (ready & (1u << hixl__transports[i]->id)))
      hixl__transports[i]->stats(ctx, xs);
  for (int i = 0; i < HIXL_XST_N; i++)
    v[k++] = xs[i];
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
  /* Its own ring (shm, self; under notif.lock, which its close takes before
   * the ring goes), or its entries in the context's inbox. */
  pthread_mutex_lock(&p->ctx->notif.lock);
  v[k++] = p->inbox ? ring_queued(p->inbox)
                    : atomic_load_explicit(&p->inbox_queued, memory_order_relaxed);
  pthread_mutex_unlock(&p->ctx->notif.lock);
  v[k++] = (uint64_t)atomic_load_explicit(&p->rtt_ns, memory_order_relaxed);
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
    ctx_values(ctx, v, false);
  for (size_t i = 0; i < fit; i++)
    stats[i] = (hixl_stat_t){
        .name = defs[i].name, .help = defs[i].help, .value = v[i], .kind = defs[i].kind};
  return HIXL_OK;
}

/* ------------------------------------------------- another context's */

/* STATS_REPLY: str[0] then str[1] hold the names of figures first ..
 * first + n - 1, each followed by '\n'; blob their values (8 bytes each,
 * little-endian); total: how many figures the answering context has. */
#define STATS_CHUNK (HIXL_WIRE_BLOB / 8)

void hixl__stats_serve_locked(hixl_peer_t *p, const hixl_msg_t *m, hixl_msg_t *out)
{
  uint64_t v[N_CTX];
  ctx_values(p->ctx, v, true);
  memset(out, 0, sizeof(*out));
  out->type = HIXL_MSG_STATS_REPLY;
  out->status = HIXL_OK;
  uint32_t first = m->stats.first < N_CTX ? m->stats.first : N_CTX;
  uint32_t n = 0;
  size_t used[2] = {0, 0};
  for (uint32_t i = first; i < N_CTX && n < STATS_CHUNK; i++, n++) {
    size_t len = strlen(ctx_defs[i].name) + 1;
    int s = used[0] + len < HIXL_WIRE_STR ? 0 : used[1] + len < HIXL_WIRE_STR ? 1 : -1;
    if (s < 0 || (s == 0 && used[1] > 0))
      break;
    memcpy(out->str[s] + used[s], ctx_defs[i].name, len - 1);
    out->str[s][used[s] + len - 1] = '\n';
    used[s] += len;
    uint64_t le = htole64(v[i]);
    memcpy(out->blob + 8 * n, &le, 8);
  }
  out->stats.first = first;
  out->stats.total = N_CTX;
  out->stats.n = n;
  out->blob_len = 8 * n;
}

/* Names from another context live in an interned table of ours (bounded:
 * a peer cannot grow it past STATS_NAMES_MAX), so the pointers handed out
 * stay valid until hixl_ctx_destroy. */
#define STATS_NAMES_MAX 512
#define STATS_NAME_MAX 63

static const char *intern(hixl_ctx_t *ctx, const char *name, size_t len)
{
  for (size_t i = 0; i < N_CTX; i++) /* ours: no copy */
    if (strlen(ctx_defs[i].name) == len && memcmp(ctx_defs[i].name, name, len) == 0)
      return ctx_defs[i].name;
  const char *r = NULL;
  pthread_mutex_lock(&ctx->stats_lock);
  for (size_t i = 0; i < ctx->n_stat_names && r == NULL; i++)
    if (strlen(ctx->stat_names[i]) == len && memcmp(ctx->stat_names[i], name, len) == 0)
      r = ctx->stat_names[i];
  if (r == NULL && ctx->n_stat_names < STATS_NAMES_MAX) {
    if (ctx->stat_names == NULL)
      ctx->stat_names = calloc(STATS_NAMES_MAX, sizeof(char *));
    char *c = ctx->stat_names ? strndup(name, len) : NULL;
    if (c)
      r = ctx->stat_names[ctx->n_stat_names++] = c;
  }
  pthread_mutex_unlock(&ctx->stats_lock);
  return r;
}

static const char *help_of(const char *name)
{
  for (size_t i = 0; i < N_CTX; i++)
    if (ctx_defs[i].name == name)
      return ctx_defs[i].help;
  return "";
}

/* A name as the wire may carry it: 1..63 of [a-z0-9_]. */
static bool name_ok(const char *s, size_t len)
{
  if (len == 0 || len > STATS_NAME_MAX)
    return false;
  for (size_t i = 0; i < len; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
      return false;
  return true;
}

/* Split one reply into stats[at ..]; false when it is malformed. */
static bool take_chunk(hixl_ctx_t *ctx, const hixl_msg_t *r, hixl_stat_t *stats, size_t room,
                       uint32_t at)
{
  uint32_t k = 0;
  for (int s = 0; s < 2; s++) {
    const char *p = r->str[s];
    size_t left = strnlen(p, HIXL_WIRE_STR);
    while (left > 0) {
      const char *nl = memchr(p, '\n', left);
      if (nl == NULL || k >= r->stats.n || !name_ok(p, (size_t)(nl - p)))
        return false;
      if (at + k < room) {
        const char *name = intern(ctx, p, (size_t)(nl - p));
        if (name == NULL)
          return false;
        uint64_t le;
        memcpy(&le, r->blob + 8 * k, 8);
        int kind = strcmp(name, "in_flight") == 0 || strcmp(name, "peers") == 0 ? HIXL_STAT_GAUGE
                                                                                : HIXL_STAT_COUNTER;
        for (size_t i = 0; i < N_CTX; i++)
          if (ctx_defs[i].name == name)
            kind = ctx_defs[i].kind;
        stats[at + k] =
            (hixl_stat_t){.name = name, .help = help_of(name), .value = le64toh(le), .kind = kind};
      }
      k++;
      left -= (size_t)(nl - p) + 1;
      p = nl + 1;
    }
  }
  return k == r->stats.n;
}

bool hixl__stats_reply_ok(hixl_ctx_t *ctx, const hixl_msg_t *r, uint32_t at, hixl_stat_t *stats,
                          size_t room)
{
  return r->status == HIXL_OK && r->stats.first == at && r->stats.total <= 4096 &&
         r->stats.total >= at && r->stats.n <= STATS_CHUNK && r->blob_len == 8 * r->stats.n &&
         (r->stats.n > 0 || at == r->stats.total) && r->stats.n <= r->stats.total - at &&
         take_chunk(ctx, r, stats, room, at);
}

hixl_status_t hixl_peer_remote_stats(hixl_peer_t *peer, hixl_stat_t *stats, size_t *count,
                                     int timeout_ms)
{
  if (peer == NULL || peer->magic != HIXL_MAGIC_PEER || count == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_peer_remote_stats: %s",
                     count == NULL ? "NULL count" : "NULL or released peer");
  if (stats == NULL && *count != 0)
    return hixl__err(HIXL_ERR_INVALID, "hixl_peer_remote_stats: NULL stats with a count of %zu",
                     *count);
  if (peer->self) /* our own context */
    return hixl_ctx_stats(peer->ctx, NULL, stats, count);
  hixl_ctx_t *ctx = peer->ctx;
  int64_t deadline = hixl__deadline(timeout_ms);
  size_t room = *count;
  /* Chunks until the room is full or every figure came; the first also
   * says how many there are (all a room of 0 asks). */
  uint32_t at = 0, total = 0;
  do {
    hixl_msg_t m = {.type = HIXL_MSG_STATS}, r;
    m.stats.first = at;
    hixl_status_t st = hixl__call(peer, &m, HIXL_MSG_STATS_REPLY, &r, NULL, deadline);
    if (st != HIXL_OK)
      return st;
    if ((at > 0 && r.stats.total != total) || !hixl__stats_reply_ok(ctx, &r, at, stats, room))
      return hixl__err(HIXL_ERR_TRANSPORT, "hixl_peer_remote_stats: a malformed reply from %s",
                       peer->name);
    total = r.stats.total;
    at += r.stats.n;
  } while (at < total && at < room);
  *count = total;
  return HIXL_OK;
}

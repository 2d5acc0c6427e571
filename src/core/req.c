/* SPDX-License-Identifier: MIT */
/*
 * Requests, fence and progress.  Requests come from a per-context pool:
 * chunks of 1024 that are never freed before the context, and a lock-free
 * LIFO of free indices (a Treiber stack whose head carries an ABA tag), so
 * taking and returning a request costs one CAS and no malloc.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define CHUNK 1024u

static hixl_req_t *req_at(hixl_ctx_t *ctx, uint32_t idx)
{
  return &ctx->pool_chunks[idx / CHUNK][idx % CHUNK];
}

static void pool_push(hixl_ctx_t *ctx, hixl_req_t *req)
{
  uint64_t head = atomic_load_explicit(&ctx->pool_head, memory_order_relaxed);
  uint64_t next;
  do {
    /* index + 1 of the old top, 0: none */
    atomic_store_explicit(&req->next_free, (uint32_t)head, memory_order_relaxed);
    next = ((head >> 32) + 1) << 32 | (uint64_t)(req->index + 1);
  } while (!atomic_compare_exchange_weak_explicit(&ctx->pool_head, &head, next,
                                                  memory_order_release, memory_order_relaxed));
}

static bool pool_grow(hixl_ctx_t *ctx)
{
  pthread_mutex_lock(&ctx->pool_lock);
  uint32_t n = atomic_load(&ctx->pool_nchunks);
  bool ok = false;
  /* Another thread may have grown it while we waited. */
  if ((uint32_t)atomic_load(&ctx->pool_head) != 0) {
    ok = true;
  } else if (n < sizeof(ctx->pool_chunks) / sizeof(ctx->pool_chunks[0])) {
    hixl_req_t *chunk = calloc(CHUNK, sizeof(hixl_req_t));
    if (chunk) {
      ctx->pool_chunks[n] = chunk;
      atomic_store(&ctx->pool_nchunks, n + 1);
      for (uint32_t i = 0; i < CHUNK; i++) {
        chunk[i].index = n * CHUNK + i;
        chunk[i].ctx = ctx;
        pool_push(ctx, &chunk[i]);
      }
      ok = true;
    }
  }
  pthread_mutex_unlock(&ctx->pool_lock);
  return ok;
}

hixl_req_t *hixl__req_get(hixl_ctx_t *ctx, hixl_peer_t *peer)
{
  for (;;) {
    uint64_t head = atomic_load_explicit(&ctx->pool_head, memory_order_acquire);
    uint32_t top = (uint32_t)head;
    if (top == 0) {
      if (!pool_grow(ctx))
        return NULL;
      continue;
    }
    hixl_req_t *req = req_at(ctx, top - 1);
    uint64_t next = (head & 0xffffffff00000000ull) |
                    atomic_load_explicit(&req->next_free, memory_order_relaxed);
    if (atomic_compare_exchange_weak_explicit(&ctx->pool_head, &head, next, memory_order_acquire,
                                              memory_order_relaxed)) {
      atomic_store_explicit(&req->status, HIXL_INPROGRESS, memory_order_relaxed);
      atomic_store_explicit(&req->flags, 0, memory_order_relaxed);
      req->peer = peer;
      req->old_p = NULL;
      req->counted = false;
      req->issue_failed = false;
      atomic_store_explicit(&req->parts, 0, memory_order_relaxed);
      atomic_store_explicit(&req->part_err, HIXL_OK, memory_order_relaxed);
      return req;
    }
  }
}

void hixl__req_complete(hixl_req_t *req, hixl_status_t st, uint64_t old)
{
  hixl_ctx_t *ctx = req->ctx;
  if (st == HIXL_OK && req->old_p)
    *req->old_p = old;
  /* An error after the call that issued it returned OK (one whose issue
   * failed is counted by that call, ops.c). */
  if (hixl_unlikely(st < 0) && !req->issue_failed)
    hixl__stat_error(ctx, req->peer, st);
  atomic_store_explicit(&req->status, st, memory_order_release);
  if (req->counted)
    atomic_fetch_add_explicit(&req->peer->completed, 1, memory_order_release);
  unsigned prev = atomic_fetch_or_explicit(&req->flags, HIXL_REQF_DONE, memory_order_acq_rel);
  if (prev & HIXL_REQF_FREED)
    pool_push(ctx, req);
  hixl__wake_waiters(ctx); /* hixl_req_wait, hixl_fence, ordered operations */
}

void hixl__req_part_add(hixl_req_t *req)
{
  atomic_fetch_add_explicit(&req->parts, 1, memory_order_relaxed);
}

void hixl__req_part_done(hixl_req_t *req, hixl_status_t st)
{
  if (st != HIXL_OK) {
    int expected = HIXL_OK;
    atomic_compare_exchange_strong(&req->part_err, &expected, st);
  }
  hixl_ctx_t *ctx = req->ctx;
  if (atomic_fetch_sub_explicit(&req->parts, 1, memory_order_acq_rel) == 1)
    hixl__req_complete(req, atomic_load(&req->part_err), 0);
  else /* a piece done: waits on a transport's in-flight count look again */
    hixl__wake_waiters(ctx);
}

void hixl__req_release(hixl_req_t *req)
{
  unsigned prev = atomic_fetch_or_explicit(&req->flags, HIXL_REQF_FREED, memory_order_acq_rel);
  if (prev & HIXL_REQF_DONE)
    pool_push(req->ctx, req);
}

hixl_req_t hixl__req_done = {.status = HIXL_OK, .flags = HIXL_REQF_DONE};

void hixl_req_free(hixl_req_t *req)
{
  if (req == NULL || req == &hixl__req_done)
    return;
  /* FREED stays set while the request waits for completion and while it
   * sits in the pool (hixl__req_get clears it), so a second free is seen
   * here -- atomically, even from two threads at once -- and changes
   * nothing: pushing it twice would hand one request to two operations.
   * (A free after the pool handed the object to another operation cannot
   * be told from that operation's own free.) */
  unsigned prev = atomic_fetch_or_explicit(&req->flags, HIXL_REQF_FREED, memory_order_acq_rel);
  if (prev & HIXL_REQF_FREED) {
    hixl__err(HIXL_ERR_INVALID, "hixl_req_free: request %p was already freed", (void *)req);
    hixl_warn("hixl_req_free: request %p was already freed (ignored)", (void *)req);
    return;
  }
  if (prev & HIXL_REQF_DONE)
    pool_push(req->ctx, req);
}

hixl_status_t hixl_req_test(hixl_req_t *req)
{
  if (req == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_req_test: NULL request");
  int st = atomic_load_explicit(&req->status, memory_order_acquire);
  if (st == HIXL_INPROGRESS) {
    hixl_progress(req->ctx);
    st = atomic_load_explicit(&req->status, memory_order_acquire);
  }
  if (st < 0) {
    /* The peer's own reason, once it is down: the transport's message (a
     * verbs work completion's status, NIC and GID) was set on the thread
     * that polled the completion, not this one. */
    hixl_peer_t *p = req->peer;
    const char *why = p && atomic_load(&p->state) != HIXL_PEER_UP ? hixl__peer_why(p) : NULL;
    if (why == NULL && p) { /* up: the transport's reason for this status, if it gave one */
      char op[sizeof(p->op_why)] = "";
      pthread_mutex_lock(&p->why_lock);
      if (p->op_why_st == st)
        snprintf(op, sizeof(op), "%s", p->op_why);
      pthread_mutex_unlock(&p->why_lock);
      if (op[0])
        return hixl__err(st, "operation to peer %s failed: %s (%s)", p->name, hixl_strerror(st),
                         op);
    }
    return hixl__err(st, "operation to peer %s failed: %s%s%s%s", p ? p->name : "?",
                     hixl_strerror(st), why ? " (peer down: " : "", why ? why : "", why ? ")" : "");
  }
  return st;
}

static bool req_done(void *arg)
{
  hixl_req_t *req = arg;
  if (atomic_load_explicit(&req->status, memory_order_acquire) != HIXL_INPROGRESS)
    return true;
  hixl_progress(req->ctx);
  return atomic_load_explicit(&req->status, memory_order_acquire) != HIXL_INPROGRESS;
}

hixl_status_t hixl_req_wait(hixl_req_t *req, int timeout_ms)
{
  if (req == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_req_wait: NULL request");
  hixl_status_t st = hixl_req_test(req);
  if (st != HIXL_INPROGRESS || timeout_ms == 0) /* done already: no clock read */
    return st == HIXL_INPROGRESS
               ? hixl__err(HIXL_ERR_TIMEOUT, "hixl_req_wait: not complete after 0 ms")
               : st;
  if (hixl__wait(req->ctx, hixl__deadline(timeout_ms), 0, req_done, req) != HIXL_OK)
    return hixl__err(HIXL_ERR_TIMEOUT, "hixl_req_wait: not complete after %d ms", timeout_ms);
  return hixl_req_test(req);
}

/* Wait until p has completed target operations (completions of one peer
 * arrive in issue order, so a count suffices) or is no longer up; *state_p
 * gets its state when the wait ended.  Fences and ordered operations. */
typedef struct completed_wait {
  hixl_peer_t *p;
  uint64_t target;
  int state;
} completed_wait_t;

static bool completed_or_down(void *arg)
{
  completed_wait_t *w = arg;
  for (int pass = 0; pass < 2; pass++) {
    if ((w->state = atomic_load(&w->p->state)) != HIXL_PEER_UP ||
        atomic_load_explicit(&w->p->completed, memory_order_acquire) >= w->target)
      return true;
    if (pass == 0)
      hixl_progress(w->p->ctx);
  }
  return false;
}

hixl_status_t hixl__wait_completed(hixl_peer_t *p, uint64_t target, int64_t deadline, int *state_p)
{
  completed_wait_t w = {p, target, HIXL_PEER_UP};
  hixl_status_t st = hixl__wait(p->ctx, deadline, 0, completed_or_down, &w);
  *state_p = w.state;
  return st;
}

static hixl_status_t fence_peer(hixl_peer_t *p, int64_t deadline, bool report_loss_once)
{
  uint64_t target = atomic_load(&p->issued);
  int state;
  hixl_status_t wst = hixl__wait_completed(p, target, deadline, &state);
  if (state != HIXL_PEER_UP) {
    /* fence(NULL) does not fail for peers it never used, and reports
     * each loss once; a fence on that very peer always says it is gone. */
    if (report_loss_once) {
      if (!atomic_load(&p->used))
        return HIXL_OK;
      uint64_t issued = atomic_load(&p->issued) + 1; /* +1: nonzero once reported */
      if (p->fence_acked == issued)
        return HIXL_OK;
      p->fence_acked = issued;
    }
    return hixl__peer_state_err("hixl_fence", p, "; cannot confirm delivery");
  }
  if (wst != HIXL_OK)
    return hixl__err(HIXL_ERR_TIMEOUT, "hixl_fence: %llu operations to %s still in flight",
                     (unsigned long long)(target - atomic_load(&p->completed)), p->name);
  return HIXL_OK;
}

static bool fence_keep(hixl_peer_t *p)
{
  return p->ops && !p->unix_pending && !atomic_load(&p->released);
}

hixl_status_t hixl_fence(hixl_ctx_t *ctx, hixl_peer_t *peer, int timeout_ms)
{
  if (ctx == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_fence: NULL ctx");
  /* shm and self stores are complete when the call returns; the fence keeps
   * them ordered before whatever the caller does next. */
  atomic_thread_fence(memory_order_seq_cst);
  if (peer) {
    if (peer->magic != HIXL_MAGIC_PEER || peer->ctx != ctx)
      return hixl__err(HIXL_ERR_INVALID, "hixl_fence: peer is invalid or not of this context");
    /* Nothing in flight (always so on shm and self): no clock read. */
    if (atomic_load(&peer->state) == HIXL_PEER_UP &&
        atomic_load_explicit(&peer->completed, memory_order_acquire) >= atomic_load(&peer->issued))
      return HIXL_OK;
    return fence_peer(peer, hixl__deadline(timeout_ms), false);
  }
  int64_t deadline = hixl__deadline(timeout_ms);
  /* All peers: a pinned snapshot (none is freed meanwhile), each waited
   * for outside the lock.  Released ones are the user's no more. */
  hixl_status_t first = HIXL_OK;
  size_t k = 0;
  hixl_peer_t **snap = hixl__peers_pin(ctx, fence_keep, &k);
  if (snap == NULL && k)
    return hixl__err(HIXL_ERR_NOMEM, "hixl_fence: no memory");
  for (size_t i = 0; i < k; i++) {
    hixl_status_t st = fence_peer(snap[i], deadline, true);
    if (st != HIXL_OK && first == HIXL_OK)
      first = st;
  }
  hixl__peers_unpin(ctx, snap, k);
  return first;
}

int hixl_progress(hixl_ctx_t *ctx)
{
  if (ctx == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_progress: NULL ctx");
  int n = 0;
  for (size_t i = 0; i < hixl__n_transports; i++) {
    int r = hixl__transports[i]->progress(ctx);
    if (r < 0)
      return r;
    n += r;
  }
  return n;
}

void hixl__pool_destroy(hixl_ctx_t *ctx)
{
  uint32_t n = atomic_load(&ctx->pool_nchunks);
  for (uint32_t i = 0; i < n; i++)
    free(ctx->pool_chunks[i]);
}

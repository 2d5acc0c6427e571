/* SPDX-License-Identifier: MIT */
/*
 * The public operations: check everything the contract promises to check
 * (arguments, peer state, bounds, rights, liveness of the remote region),
 * then make one indirect call into the peer's transport.  Checks are inline
 * and branch-predicted; the error paths are out of line (hixl__err is cold).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "core.h"

static inline hixl_status_t check_peer(const char *fn, hixl_peer_t *peer)
{
  if (hixl_unlikely(peer == NULL || peer->magic != HIXL_MAGIC_PEER))
    return hixl__err(HIXL_ERR_INVALID, "%s: %s peer", fn, peer == NULL ? "NULL" : "invalid");
  if (hixl_unlikely(atomic_load_explicit(&peer->state, memory_order_acquire) != HIXL_PEER_UP))
    return hixl__peer_state_err(fn, peer, NULL);
  return HIXL_OK;
}

static inline hixl_status_t check_remote(const char *fn, hixl_peer_t *peer, hixl_rmr_t *rmr,
                                         uint64_t off, size_t len, unsigned need)
{
  if (hixl_unlikely(rmr == NULL || rmr->magic != HIXL_MAGIC_RMR))
    return hixl__err(rmr == NULL ? HIXL_ERR_INVALID : HIXL_ERR_NOT_REGISTERED,
                     "%s: %s remote region", fn, rmr == NULL ? "NULL" : "released or invalid");
  if (hixl_unlikely(rmr->peer != peer))
    return hixl__err(HIXL_ERR_INVALID, "%s: the remote region belongs to peer %s, not %s", fn,
                     rmr->peer->name, peer->name);
  if (hixl_unlikely(len == 0))
    return hixl__err(HIXL_ERR_INVALID, "%s: zero length", fn);
  if (hixl_unlikely(off > rmr->len || len > rmr->len - off))
    return hixl__err(HIXL_ERR_NOT_REGISTERED,
                     "%s: [%llu, %llu + %zu) is outside the %llu-byte region of peer %s", fn,
                     (unsigned long long)off, (unsigned long long)off, len,
                     (unsigned long long)rmr->len, peer->name);
  if (hixl_unlikely((rmr->access & need) != need))
    return hixl__err(HIXL_ERR_ACCESS, "%s: the region of peer %s does not grant %s", fn, peer->name,
                     need == HIXL_ACCESS_READ    ? "READ"
                     : need == HIXL_ACCESS_WRITE ? "WRITE"
                                                 : "ATOMIC");
  if (hixl_unlikely(!peer->ops->rmr_live(rmr)))
    return hixl__err(HIXL_ERR_NOT_REGISTERED, "%s: peer %s has deregistered the region", fn,
                     peer->name);
  return HIXL_OK;
}

/* Device memory exists in this process: local buffers are looked at. */
static inline bool dev_any(void)
{
  return atomic_load_explicit(&hixl__dev_any, memory_order_relaxed);
}

static inline hixl_status_t check_flags(const char *fn, unsigned flags)
{
  if (hixl_unlikely(flags & ~(unsigned)HIXL_OP_ORDERED))
    return hixl__err(HIXL_ERR_INVALID, "%s: unknown flags 0x%x", fn, flags);
  return HIXL_OK;
}

/* HIXL_OP_ORDERED: everything earlier to this peer completes first.  Ops
 * that completed synchronously are already visible; only asynchronous ones
 * (counted in issued/completed) can be outstanding. */
static hixl_status_t order_after_earlier(const char *fn, hixl_peer_t *peer)
{
  uint64_t target = atomic_load(&peer->issued);
  if (atomic_load_explicit(&peer->completed, memory_order_acquire) >= target)
    return HIXL_OK;
  int state;
  hixl__wait_completed(peer, target, hixl__deadline(hixl__issue_wait_ms(peer->ctx)), &state);
  if (atomic_load_explicit(&peer->completed, memory_order_acquire) >= target)
    return HIXL_OK;
  if (atomic_load(&peer->state) != HIXL_PEER_UP)
    return hixl__err(HIXL_ERR_PEER_LOST, "%s: peer %s lost while ordering", fn, peer->name);
  return hixl__err(HIXL_ERR_TIMEOUT, "%s: earlier operations to %s did not complete", fn,
                   peer->name);
}

/* Finish a synchronous operation: hand back a completed request if asked. */
static inline hixl_status_t done_sync(hixl_peer_t *peer, hixl_status_t st, hixl_req_t **req_p)
{
  if (hixl_unlikely(st != HIXL_OK))
    return st;
  (void)peer;
  if (req_p)
    *req_p = &hixl__req_done; /* complete already: no pool traffic */
  return HIXL_OK;
}

/* What every operation does once its own arguments are checked (the peer
 * first): its flags, HIXL_OP_ORDERED's wait for earlier operations, and
 * the mark that the peer has been used. */
static inline hixl_status_t op_prepare(const char *fn, hixl_peer_t *peer, unsigned flags)
{
  hixl_status_t st = check_flags(fn, flags);
  if (hixl_unlikely(st != HIXL_OK))
    return st;
  if (hixl_unlikely(flags & HIXL_OP_ORDERED) && (st = order_after_earlier(fn, peer)) != HIXL_OK)
    return st;
  if (hixl_unlikely(!atomic_load_explicit(&peer->used, memory_order_relaxed)))
    atomic_store_explicit(&peer->used, true, memory_order_relaxed);
  return HIXL_OK;
}

/* An asynchronous transport's request: counted for fence, one part held
 * while the caller issues (so it cannot complete half-issued). */
static inline hixl_req_t *async_begin(hixl_peer_t *peer)
{
  hixl_req_t *req = hixl__req_get(peer->ctx, peer);
  if (hixl_likely(req != NULL)) {
    req->counted = true;
    atomic_store_explicit(&req->parts, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&peer->issued, 1, memory_order_relaxed);
  }
  return req;
}

/* Finish issuing: drop the caller's part; hand the request out or let it
 * complete on its own.  st < 0: the transport failed to post (part of) it. */
static hixl_status_t async_end(hixl_req_t *req, hixl_status_t st, hixl_req_t **req_p)
{
  bool failed = st < 0;
  if (failed)
    req->issue_failed = true; /* before our part goes: whoever completes it reads this */
  hixl__req_part_done(req, failed ? st : HIXL_OK);
  if (failed || req_p == NULL) {
    hixl__req_release(req);
    return failed ? st : HIXL_OK;
  }
  *req_p = req;
  return HIXL_OK;
}

/* The request an operation hands its transport: none for a synchronous
 * transport (it completes in the call), a counted one from the pool for an
 * asynchronous one. */
static inline hixl_status_t op_request(hixl_peer_t *peer, hixl_req_t **req)
{
  *req = NULL;
  if (hixl_likely(!peer->ops->async))
    return HIXL_OK;
  *req = async_begin(peer);
  if (hixl_unlikely(*req == NULL))
    return hixl__err(HIXL_ERR_NOMEM, "no memory for a request");
  return HIXL_OK;
}

/* The transport's answer st for the request op_request gave it. */
static inline hixl_status_t op_end(hixl_peer_t *peer, hixl_req_t *req, hixl_status_t st,
                                   hixl_req_t **req_p)
{
  if (hixl_likely(req == NULL))
    return done_sync(peer, st, req_p);
  return async_end(req, st, req_p);
}

/* op_prepare, then op_request. */
static inline hixl_status_t op_begin(const char *fn, hixl_peer_t *peer, unsigned flags,
                                     hixl_req_t **req)
{
  hixl_status_t st = op_prepare(fn, peer, flags);
  return hixl_likely(st == HIXL_OK) ? op_request(peer, req) : st;
}

/* Counting (stats.h): an operation issued, in this thread's block for the
 * context and in the peer; an error, when the peer is a live handle. */
static inline hixl_status_t op_counted(hixl_peer_t *peer, hixl_status_t st, int k, uint64_t bytes,
                                       bool has_bytes)
{
  if (hixl_unlikely(st != HIXL_OK)) {
    hixl__stat_error(peer->ctx, peer, st);
    return st;
  }
  hixl_tstats_t *b = hixl__tstats_for(peer->ctx->id, peer->ctx);
  if (hixl_likely(b != NULL)) {
    hixl__stat_add(&b->c[k], 1);
    if (has_bytes)
      hixl__stat_add(&b->c[k + 1], bytes);
  }
  hixl__stat_add(&peer->st[k], 1);
  if (has_bytes)
    hixl__stat_add(&peer->st[k + 1], bytes);
  return HIXL_OK;
}

static __attribute__((noinline, cold)) hixl_status_t op_failed(hixl_peer_t *peer, hixl_status_t st)
{
  if (peer != NULL && peer->magic == HIXL_MAGIC_PEER)
    hixl__stat_error(peer->ctx, peer, st);
  return st;
}

HIXL_HOT hixl_status_t hixl_put(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *dst,
                                uint64_t off, unsigned flags, hixl_req_t **req_p)
{
  hixl_status_t st = check_peer("hixl_put", peer);
  if (hixl_likely(st == HIXL_OK))
    st = check_remote("hixl_put", peer, dst, off, len, HIXL_ACCESS_WRITE);
  if (hixl_unlikely(st == HIXL_OK && src == NULL))
    st = hixl__err(HIXL_ERR_INVALID, "hixl_put: NULL src");
  if (hixl_unlikely(st == HIXL_OK && dev_any()))
    st = hixl__dev_check_local("hixl_put", src, len);
  if (hixl_unlikely(st != HIXL_OK))
    return op_failed(peer, st);
  hixl_req_t *req;
  if ((st = op_begin("hixl_put", peer, flags, &req)) != HIXL_OK)
    return op_failed(peer, st);
  return op_counted(peer, op_end(peer, req, peer->ops->put(peer, src, len, dst, off, req), req_p),
                    HIXL_OPST_PUT_OPS, len, true);
}

HIXL_HOT hixl_status_t hixl_get(hixl_peer_t *peer, void *dst, size_t len, hixl_rmr_t *src,
                                uint64_t off, unsigned flags, hixl_req_t **req_p)
{
  hixl_status_t st = check_peer("hixl_get", peer);
  if (hixl_likely(st == HIXL_OK))
    st = check_remote("hixl_get", peer, src, off, len, HIXL_ACCESS_READ);
  if (hixl_unlikely(st == HIXL_OK && dst == NULL))
    st = hixl__err(HIXL_ERR_INVALID, "hixl_get: NULL dst");
  if (hixl_unlikely(st == HIXL_OK && dev_any()))
    st = hixl__dev_check_local("hixl_get", dst, len);
  if (hixl_unlikely(st != HIXL_OK))
    return op_failed(peer, st);
  hixl_req_t *req;
  if ((st = op_begin("hixl_get", peer, flags, &req)) != HIXL_OK)
    return op_failed(peer, st);
  return op_counted(peer, op_end(peer, req, peer->ops->get(peer, dst, len, src, off, req), req_p),
                    HIXL_OPST_GET_OPS, len, true);
}

hixl_status_t hixl_put_imm(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *dst,
                           uint64_t off, uint32_t imm, unsigned flags, hixl_req_t **req_p)
{
  hixl_status_t st = check_peer("hixl_put_imm", peer);
  if (hixl_likely(st == HIXL_OK))
    st = check_remote("hixl_put_imm", peer, dst, off, len, HIXL_ACCESS_WRITE);
  if (hixl_unlikely(st == HIXL_OK && src == NULL))
    st = hixl__err(HIXL_ERR_INVALID, "hixl_put_imm: NULL src");
  if (hixl_unlikely(st == HIXL_OK && dev_any()))
    st = hixl__dev_check_local("hixl_put_imm", src, len);
  if (hixl_unlikely(st != HIXL_OK))
    return op_failed(peer, st);
  hixl_req_t *req;
  if ((st = op_begin("hixl_put_imm", peer, flags, &req)) != HIXL_OK)
    return op_failed(peer, st);
  return op_counted(
      peer, op_end(peer, req, peer->ops->put_imm(peer, src, len, dst, off, imm, req), req_p),
      HIXL_OPST_IMM_OPS, len, true);
}

hixl_status_t hixl_notify(hixl_peer_t *peer, uint32_t imm, unsigned flags, hixl_req_t **req_p)
{
  hixl_status_t st = check_peer("hixl_notify", peer);
  if (hixl_unlikely(st != HIXL_OK))
    return op_failed(peer, st);
  hixl_req_t *req;
  if ((st = op_begin("hixl_notify", peer, flags, &req)) != HIXL_OK)
    return op_failed(peer, st);
  return op_counted(peer, op_end(peer, req, peer->ops->notify(peer, imm, 0, req), req_p),
                    HIXL_OPST_NOTIFY_OPS, 0, false);
}

static hixl_status_t atomic_issue(const char *fn, hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off,
                                  int op, uint64_t a, uint64_t b, uint64_t *old_p, unsigned flags,
                                  hixl_req_t **req_p)
{
  hixl_status_t st = check_peer(fn, peer);
  if (hixl_likely(st == HIXL_OK))
    st = check_remote(fn, peer, rmr, off, 8, HIXL_ACCESS_ATOMIC);
  if (hixl_unlikely(st == HIXL_OK && (rmr->base + off) % 8 != 0))
    st = hixl__err(HIXL_ERR_INVALID, "%s: offset %llu is not 8-byte aligned", fn,
                   (unsigned long long)off);
  if (hixl_unlikely(st != HIXL_OK))
    return st;
  if ((st = op_prepare(fn, peer, flags)) != HIXL_OK)
    return st;
  if (peer->ops->async) {
    hixl_req_t *req = async_begin(peer);
    if (hixl_unlikely(req == NULL))
      return hixl__err(HIXL_ERR_NOMEM, "no memory for a request");
    req->old_p = old_p;
    uint64_t unused;
    return async_end(req, peer->ops->atomic(peer, rmr, off, op, a, b, &unused, req), req_p);
  }
  /* First without a request: a transport that can execute it now (a CPU
   * atomic on a mapping) does, and no request is taken from the pool. */
  uint64_t old = 0;
  st = peer->ops->atomic(peer, rmr, off, op, a, b, &old, NULL);
  if (hixl_likely(st == HIXL_OK)) {
    if (old_p)
      *old_p = old;
    return done_sync(peer, HIXL_OK, req_p);
  }
  if (st < 0)
    return st;
  /* INPROGRESS: it will complete later (executed by the owner), so it
   * needs a request, internal when the caller passed req_p NULL. */
  hixl_req_t *req = hixl__req_get(peer->ctx, peer);
  if (hixl_unlikely(req == NULL))
    return hixl__err(HIXL_ERR_NOMEM, "no memory for a request");
  req->old_p = old_p;
  st = peer->ops->atomic(peer, rmr, off, op, a, b, &old, req);
  if (hixl_unlikely(st < 0)) {
    req->old_p = NULL;
    req->issue_failed = true;
    hixl__req_complete(req, st, 0);
    hixl__req_release(req);
    return st;
  }
  if (st == HIXL_OK && old_p) /* completed now after all */
    *old_p = old;
  if (st == HIXL_OK)
    hixl__req_complete(req, HIXL_OK, old);
  if (req_p)
    *req_p = req;
  else
    hixl__req_release(req);
  return HIXL_OK;
}

static hixl_status_t atomic_common(const char *fn, hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off,
                                   int op, uint64_t a, uint64_t b, uint64_t *old_p, unsigned flags,
                                   hixl_req_t **req_p)
{
  hixl_status_t st = atomic_issue(fn, peer, rmr, off, op, a, b, old_p, flags, req_p);
  if (hixl_unlikely(st != HIXL_OK))
    return op_failed(peer, st);
  return op_counted(peer, st, HIXL_OPST_ATOMIC_OPS, 0, false);
}

hixl_status_t hixl_atomic_cas(hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off, uint64_t expected,
                              uint64_t desired, uint64_t *old_p, unsigned flags, hixl_req_t **req_p)
{
  return atomic_common("hixl_atomic_cas", peer, rmr, off, HIXL_AMO_CAS, expected, desired, old_p,
                       flags, req_p);
}

hixl_status_t hixl_atomic_faa(hixl_peer_t *peer, hixl_rmr_t *rmr, uint64_t off, uint64_t add,
                              uint64_t *old_p, unsigned flags, hixl_req_t **req_p)
{
  return atomic_common("hixl_atomic_faa", peer, rmr, off, HIXL_AMO_FAA, add, 0, old_p, flags,
                       req_p);
}

/* Every element is checked before any moves, so a bad batch changes nothing. */
static hixl_status_t check_batch(const char *fn, hixl_peer_t *peer, const hixl_xfer_t *xfers,
                                 size_t n, unsigned need, uint64_t *total_p)
{
  if (xfers == NULL || n == 0)
    return hixl__err(HIXL_ERR_INVALID, "%s: %s", fn, xfers == NULL ? "NULL xfers" : "empty batch");
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    hixl_status_t st = check_remote(fn, peer, xfers[i].rmr, xfers[i].off, xfers[i].len, need);
    if (st == HIXL_OK && xfers[i].local == NULL)
      st = hixl__err(HIXL_ERR_INVALID, "%s: NULL local buffer", fn);
    if (st == HIXL_OK && hixl_unlikely(dev_any()))
      st = hixl__dev_check_local(fn, xfers[i].local, xfers[i].len);
    if (st != HIXL_OK)
      return hixl__err(st, "%s (batch element %zu of %zu)", hixl_last_error(), i, n);
    total += xfers[i].len;
  }
  *total_p = total;
  return HIXL_OK;
}

/* The elements of a batch, then its notification, under one request. */
static hixl_status_t batch_issue(hixl_peer_t *peer, const hixl_xfer_t *xfers, size_t n, bool is_put,
                                 const uint32_t *imm, uint64_t total, hixl_req_t *req)
{
  if (peer->ops->batch)
    return peer->ops->batch(peer, xfers, n, is_put, imm, total, req);
  hixl_status_t st = HIXL_OK;
  for (size_t i = 0; i < n && st >= 0; i++)
    st = is_put
             ? peer->ops->put(peer, xfers[i].local, xfers[i].len, xfers[i].rmr, xfers[i].off, req)
             : peer->ops->get(peer, xfers[i].local, xfers[i].len, xfers[i].rmr, xfers[i].off, req);
  if (st >= 0 && imm)
    st = peer->ops->notify(peer, *imm, total, req);
  return st;
}

hixl_status_t hixl_put_batch(hixl_peer_t *peer, const hixl_xfer_t *xfers, size_t n,
                             const uint32_t *imm, unsigned flags, hixl_req_t **req_p)
{
  uint64_t total;
  hixl_status_t st = check_peer("hixl_put_batch", peer);
  if (st == HIXL_OK)
    st = check_batch("hixl_put_batch", peer, xfers, n, HIXL_ACCESS_WRITE, &total);
  if (st != HIXL_OK)
    return op_failed(peer, st);
  hixl_req_t *req;
  if ((st = op_begin("hixl_put_batch", peer, flags, &req)) != HIXL_OK)
    return op_failed(peer, st);
  return op_counted(peer,
                    op_end(peer, req, batch_issue(peer, xfers, n, true, imm, total, req), req_p),
                    HIXL_OPST_BATCH_OPS, total, true);
}

hixl_status_t hixl_get_batch(hixl_peer_t *peer, const hixl_xfer_t *xfers, size_t n, unsigned flags,
                             hixl_req_t **req_p)
{
  uint64_t total;
  hixl_status_t st = check_peer("hixl_get_batch", peer);
  if (st == HIXL_OK)
    st = check_batch("hixl_get_batch", peer, xfers, n, HIXL_ACCESS_READ, &total);
  if (st != HIXL_OK)
    return op_failed(peer, st);
  hixl_req_t *req;
  if ((st = op_begin("hixl_get_batch", peer, flags, &req)) != HIXL_OK)
    return op_failed(peer, st);
  return op_counted(peer,
                    op_end(peer, req, batch_issue(peer, xfers, n, false, NULL, total, req), req_p),
                    HIXL_OPST_BATCH_OPS, total, true);
}

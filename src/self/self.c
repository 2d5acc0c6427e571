/* SPDX-License-Identifier: MIT */
/*
 * The self transport: a peer that is our own context.  Remote memory is our
 * memory, so put/get are copies and atomics are CPU atomics; notifications go
 * through a local ring that hixl_notif_poll drains like any inbox.  Device
 * memory on either side is copied by the device runtime; atomics on device
 * regions are refused (the CPU cannot run them there).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "../core/provider.h"

#define SELF_RING_CAP 65536
#define HIXL_TP_SELF 0 /* the wire id (transport.c names it) */

extern const hixl_transport_ops_t hixl__self_ops;

/* The core makes a self peer when a context connects to itself (no
 * handshake: ack is NULL); its inbox is a local ring. */
static hixl_status_t self_connect(hixl_peer_t *peer, const hixl_msg_t *ack, int64_t deadline)
{
  (void)ack;
  (void)deadline;
  /* calloc of 2 MiB maps zero pages: the ring touches them as it fills. */
  hixl_ring_t *ring = calloc(1, hixl_ring_bytes(SELF_RING_CAP));
  if (ring == NULL)
    return HIXL_ERR_NOMEM;
  hixl_ring_init_zeroed(ring, SELF_RING_CAP);
  hixl_status_t st = hixl__notif_src_add(peer, ring);
  if (st != HIXL_OK)
    free(ring);
  return st;
}

static bool self_usable(hixl_ctx_t *ctx, const hixl_msg_t *m)
{
  (void)ctx;
  (void)m;
  return false; /* chosen by context id in the handshake, never negotiated */
}

static void self_peer_close(hixl_peer_t *p)
{
  hixl_ring_t *ring = p->inbox;
  if (ring == NULL)
    return;
  hixl__notif_src_del(p);
  free(ring);
}

static hixl_status_t self_rmr_attach(hixl_rmr_t *r, int64_t deadline)
{
  (void)deadline;
  hixl_ctx_t *ctx = r->peer->ctx;
  if (hixl__reg_check(ctx->reg_table, r->slot, r->rkey, r->base, r->len, r->access, r->flags) !=
      HIXL_OK)
    return hixl__err(HIXL_ERR_NOT_REGISTERED,
                     "hixl_rmr_unpack: no live region matches the blob (forged or stale key)");
  r->map = (uint8_t *)(uintptr_t)r->base;
  return HIXL_OK;
}

static void self_rmr_detach(hixl_rmr_t *r) { r->map = NULL; }

static bool self_rmr_live(const hixl_rmr_t *r)
{
  hixl_reg_slot_t *s = &r->peer->ctx->reg_table[r->slot];
  return atomic_load_explicit(&s->rkey, memory_order_acquire) == r->rkey;
}

static bool overlap(const void *a, const void *b, size_t len)
{
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + len && y < x + len;
}

/* A put's or a get's bytes: one context, so source and target may be the
 * same memory (a region put into itself); device memory on either side
 * goes through the device backend. */
static hixl_status_t self_copy(void *dst, const void *src, size_t len, bool dev)
{
  if (hixl_unlikely(dev))
    return hixl__dev_copy(dst, src, len);
  if (overlap(dst, src, len))
    memmove(dst, src, len);
  else
    hixl__copy(dst, src, len);
  return HIXL_OK;
}

static hixl_status_t self_put(hixl_peer_t *p, const void *src, size_t len, hixl_rmr_t *r,
                              uint64_t off, hixl_req_t *req)
{
  (void)p;
  (void)req;
  return self_copy(r->map + off, src, len, (r->flags & HIXL_REGF_DEVICE) || hixl__is_dev(src));
}

static hixl_status_t self_get(hixl_peer_t *p, void *dst, size_t len, hixl_rmr_t *r, uint64_t off,
                              hixl_req_t *req)
{
  (void)p;
  (void)req;
  return self_copy(dst, r->map + off, len, (r->flags & HIXL_REGF_DEVICE) || hixl__is_dev(dst));
}

static hixl_status_t self_notify(hixl_peer_t *p, uint32_t imm, uint64_t len, hixl_req_t *req)
{
  (void)req;
  /* Another thread of ours may be polling; if none is, this costs the
   * context timeout and returns AGAIN. */
  hixl_status_t st = hixl__notify_push(p, p->inbox, imm, len);
  if (st == HIXL_OK)
    hixl__wake_waiters(p->ctx); /* one of our threads may sleep in hixl_notif_wait */
  return st;
}

/* Our own thread took entries: another of ours may wait for room. */
static void self_notif_consumed(hixl_peer_t *p)
{
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(p->ctx->space_waiters, memory_order_relaxed))
    hixl__wake_all(p->ctx);
}

static hixl_status_t self_atomic(hixl_peer_t *p, hixl_rmr_t *r, uint64_t off, int op, uint64_t a,
                                 uint64_t b, uint64_t *old_p, hixl_req_t *req)
{
  (void)req;
  if (r->flags & HIXL_REGF_DEVICE)
    return hixl__err(HIXL_ERR_UNSUPPORTED,
                     "self: atomics on device memory need a NIC (the region of %s is device "
                     "memory)",
                     p->name);
  *old_p = hixl__amo_local((uint64_t *)(void *)(r->map + off), op, a, b);
  return HIXL_OK;
}

static int self_progress(hixl_ctx_t *ctx)
{
  (void)ctx;
  return 0; /* everything completes inline */
}

const hixl_transport_ops_t hixl__self_ops = {
    .size = sizeof(hixl_transport_ops_t),
    .name = "self",
    .id = HIXL_TP_SELF,
    .caps = HIXL_TP_CAP_LOOPBACK,
    .async = false,
    .needs_bind = false,
    .ctx_init = hixl__tp_ctx_init_none,
    .ctx_fini = hixl__tp_ctx_fini_none,
    .mr_reg = hixl__tp_mr_reg_none,
    .mr_dereg = hixl__tp_mr_dereg_none,
    .usable = self_usable,
    .connect = self_connect,
    .accept = hixl__tp_accept_none,
    .peer_close = self_peer_close,
    .rmr_attach = self_rmr_attach,
    .rmr_detach = self_rmr_detach,
    .rmr_live = self_rmr_live,
    .put = self_put,
    .get = self_get,
    .put_imm = hixl__tp_put_imm_sync,
    .notify = self_notify,
    .atomic = self_atomic,
    .progress = self_progress,
    .on_event = hixl__tp_on_event_none,
    .notif_consumed = self_notif_consumed,
};

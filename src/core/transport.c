/* SPDX-License-Identifier: MIT */
/* The transports built into this library, in default preference order, and
 * the ops a peer gets once it is disconnected. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "core.h"

/* Every transport's name by HIXL_TP_* id, built into this library or not:
 * a configuration may name one this build lacks, and a peer's handshake
 * names what its build has.  The ops tables carry the same names. */
const char *const hixl__tp_names[HIXL_TP_MAX] = {"self", "shm", "verbs", "fabric"};
/* (ids 4..7: unnamed, free for the next transports) */

const char *hixl__tp_join(char *buf, size_t cap, const uint8_t *order, int n, uint32_t mask)
{
  size_t pos = 0;
  buf[0] = 0;
  for (int i = 0; i < (order ? n : HIXL_TP_MAX); i++) {
    int id = order ? order[i] : i;
    if (id >= HIXL_TP_MAX || hixl__tp_names[id] == NULL || !(mask & (1u << id)) || pos >= cap)
      continue;
    int k = snprintf(buf + pos, cap - pos, "%s%s", pos ? "," : "", hixl__tp_names[id]);
    pos += k > 0 ? (size_t)k : 0;
  }
  return buf;
}

/* Each transport's table (its folder; HAVE_* from meson.build). */
extern const hixl_transport_ops_t hixl__self_ops;
extern const hixl_transport_ops_t hixl__shm_ops;
#ifdef HIXL_HAVE_VERBS
extern const hixl_transport_ops_t hixl__verbs_ops;
#endif
#ifdef HIXL_HAVE_FABRIC
extern const hixl_transport_ops_t hixl__fabric_ops;
#endif

const hixl_transport_ops_t *const hixl__transports[] = {
    &hixl__self_ops,
    &hixl__shm_ops,
#ifdef HIXL_HAVE_VERBS
    &hixl__verbs_ops,
#endif
#ifdef HIXL_HAVE_FABRIC
    &hixl__fabric_ops,
#endif
};

hixl_status_t hixl__tp_ctx_init_none(hixl_ctx_t *ctx)
{
  (void)ctx;
  return HIXL_OK;
}
void hixl__tp_ctx_fini_none(hixl_ctx_t *ctx) { (void)ctx; }
hixl_status_t hixl__tp_mr_reg_none(hixl_mr_t *mr)
{
  (void)mr;
  return HIXL_OK;
}
void hixl__tp_mr_dereg_none(hixl_mr_t *mr) { (void)mr; }
void hixl__tp_on_event_none(hixl_ctx_t *ctx) { (void)ctx; }
void hixl__tp_accept_none(hixl_peer_t *peer, const hixl_msg_t *m, int *fds, int nfds, int sock,
                          hixl_msg_t *out, int *out_fds, int *n_out)
{
  (void)peer, (void)m, (void)fds, (void)nfds, (void)sock, (void)out_fds, (void)n_out;
  out->type = 0; /* no reply: the caller drops the connection */
}

hixl_status_t hixl__tp_put_imm_sync(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *rmr,
                                    uint64_t off, uint32_t imm, hixl_req_t *req)
{
  hixl_status_t st = peer->ops->put(peer, src, len, rmr, off, req);
  return st == HIXL_OK ? peer->ops->notify(peer, imm, len, req) : st;
}
const size_t hixl__n_transports = sizeof(hixl__transports) / sizeof(hixl__transports[0]);

const hixl_transport_ops_t *hixl__tp_loopback(void)
{
  for (size_t t = 0; t < hixl__n_transports; t++)
    if (hixl__transports[t]->caps & HIXL_TP_CAP_LOOPBACK)
      return hixl__transports[t];
  return NULL; /* unit/transports: never */
}

hixl_status_t hixl__tp_need(hixl_ctx_t *ctx, const hixl_transport_ops_t *ops)
{
  uint32_t bit = 1u << ops->id;
  if (atomic_load(&ctx->tp_ready) & bit)
    return HIXL_OK;
  pthread_mutex_lock(&ctx->tp_init_lock);
  hixl_status_t st = HIXL_OK;
  if (atomic_load(&ctx->tp_ready) & bit) {
    /* another thread set it up meanwhile */
  } else if (!(atomic_load(&ctx->tp_lazy) & bit)) {
    st = hixl__err(HIXL_ERR_UNSUPPORTED, "transport %s is not available here%s%s", ops->name,
                   ctx->tp_init_err[ops->id][0] ? ": " : "", ctx->tp_init_err[ops->id]);
  } else {
    int64_t t0 = hixl__now_ns();
    st = ops->ctx_init(ctx);
    if (st == HIXL_OK) {
      st = hixl__mrs_reg_transport(ctx, ops); /* sets the ready bit */
      if (st != HIXL_OK)
        ops->ctx_fini(ctx);
    }
    if (st == HIXL_OK) {
      hixl__ctl_watch_tp(ctx, ops->id);
      hixl_info("transport %s set up on first use in %.1f ms", ops->name,
                (double)(hixl__now_ns() - t0) / 1e6);
    } else {
      /* Not offered again: a peer that picks it would fail the same way. */
      snprintf(ctx->tp_init_err[ops->id], sizeof(ctx->tp_init_err[0]), "%s", hixl_last_error());
      hixl_warn("transport %s: setting it up failed: %s", ops->name, hixl_last_error());
      st = hixl__err(st == HIXL_ERR_NO_DEVICE ? HIXL_ERR_UNSUPPORTED : st,
                     "transport %s could not be set up here: %s", ops->name,
                     ctx->tp_init_err[ops->id]);
    }
    atomic_fetch_and(&ctx->tp_lazy, ~bit);
  }
  pthread_mutex_unlock(&ctx->tp_init_lock);
  return st;
}

static bool closed_usable(hixl_ctx_t *ctx, const hixl_msg_t *m)
{
  (void)ctx;
  (void)m;
  return false;
}
static hixl_status_t closed_connect(hixl_peer_t *p, const hixl_msg_t *m, int64_t d)
{
  (void)m;
  (void)d;
  return hixl__err(HIXL_ERR_PEER_LOST, "peer %s is disconnected", p->name);
}
static void closed_peer_close(hixl_peer_t *p) { (void)p; }
static hixl_status_t closed_rmr_attach(hixl_rmr_t *r, int64_t d)
{
  (void)d;
  return hixl__err(HIXL_ERR_PEER_LOST, "peer %s is disconnected", r->peer->name);
}
static void closed_rmr_detach(hixl_rmr_t *r) { (void)r; }
static bool closed_rmr_live(const hixl_rmr_t *r)
{
  (void)r;
  return false;
}
static hixl_status_t closed_put(hixl_peer_t *p, const void *s, size_t l, hixl_rmr_t *r, uint64_t o,
                                hixl_req_t *req)
{
  (void)s, (void)l, (void)r, (void)o, (void)req;
  return hixl__err(HIXL_ERR_PEER_LOST, "peer %s is disconnected", p->name);
}
static hixl_status_t closed_get(hixl_peer_t *p, void *d, size_t l, hixl_rmr_t *r, uint64_t o,
                                hixl_req_t *req)
{
  (void)d, (void)l, (void)r, (void)o, (void)req;
  return hixl__err(HIXL_ERR_PEER_LOST, "peer %s is disconnected", p->name);
}
static hixl_status_t closed_notify(hixl_peer_t *p, uint32_t imm, uint64_t len, hixl_req_t *req)
{
  (void)imm, (void)len, (void)req;
  return hixl__err(HIXL_ERR_PEER_LOST, "peer %s is disconnected", p->name);
}
static hixl_status_t closed_atomic(hixl_peer_t *p, hixl_rmr_t *r, uint64_t o, int op, uint64_t a,
                                   uint64_t b, uint64_t *old_p, hixl_req_t *req)
{
  (void)r, (void)o, (void)op, (void)a, (void)b, (void)old_p, (void)req;
  return hixl__err(HIXL_ERR_PEER_LOST, "peer %s is disconnected", p->name);
}
static int closed_progress(hixl_ctx_t *ctx)
{
  (void)ctx;
  return 0;
}

const hixl_transport_ops_t hixl__closed_ops = {
    .size = sizeof(hixl_transport_ops_t),
    .name = "closed",
    .id = -1,
    .ctx_init = hixl__tp_ctx_init_none,
    .ctx_fini = hixl__tp_ctx_fini_none,
    .mr_reg = hixl__tp_mr_reg_none,
    .mr_dereg = hixl__tp_mr_dereg_none,
    .usable = closed_usable,
    .connect = closed_connect,
    .accept = hixl__tp_accept_none,
    .peer_close = closed_peer_close,
    .rmr_attach = closed_rmr_attach,
    .rmr_detach = closed_rmr_detach,
    .rmr_live = closed_rmr_live,
    .put = closed_put,
    .get = closed_get,
    .put_imm = hixl__tp_put_imm_sync,
    .notify = closed_notify,
    .atomic = closed_atomic,
    .progress = closed_progress,
    .on_event = hixl__tp_on_event_none,
};

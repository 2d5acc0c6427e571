/* SPDX-License-Identifier: MIT */
/*
 * Core-private declarations: the control thread, serving peers' requests,
 * pools and handles, the transport registry, and what the core still asks
 * of particular transports by name (to become slots of the provider
 * interface: issue 15).  Only src/core includes this (and white-box tests).
 */
#ifndef HIXL_CORE_H
#define HIXL_CORE_H

#include "provider.h"

/* wait.c */
void hixl__wait_init(hixl_ctx_t *ctx);
void hixl__wait_fini(hixl_ctx_t *ctx);

/* req.c */
/* Take a request from ctx's pool (no malloc unless the pool grows). */
hixl_req_t *hixl__req_get(hixl_ctx_t *ctx, hixl_peer_t *peer);
/* The request handed out for every operation that completed inside its call
 * (shm and self, mostly): shared, immutable, complete; freeing it does
 * nothing.  A window of such requests then costs no pool traffic. */
extern hixl_req_t hixl__req_done;
/* Complete: store status (and old value), count it on the peer. */
void hixl__req_complete(hixl_req_t *req, hixl_status_t st, uint64_t old);
/* Drop the caller's reference (user free, or an internal request). */
void hixl__req_release(hixl_req_t *req);
void hixl__pool_destroy(hixl_ctx_t *ctx);
/* Wait (hixl__wait) until peer p has completed target operations or is no
 * longer up; *state_p: its state when the wait ended.  Fences and
 * HIXL_OP_ORDERED. */
hixl_status_t hixl__wait_completed(hixl_peer_t *p, uint64_t target, int64_t deadline, int *state_p);

/* transports */
/* Transports whose peers do not read our region table: told of deregs. */
static inline bool hixl__tp_remote_keys(const hixl_transport_ops_t *ops)
{
  return ops && ops->mr_key != NULL;
}
/* What a peer's ops become after hixl_disconnect: every op PEER_LOST. */
extern const hixl_transport_ops_t hixl__closed_ops;
/* Every transport's name by id, built in or not (transport.c), and the
 * names of the ids in order[0..n) (order NULL: every id in id order) whose
 * bit is set in mask, comma-joined into buf (returned; cut at cap). */
extern const char *const hixl__tp_names[HIXL_TP_MAX];
const char *hixl__tp_join(char *buf, size_t cap, const uint8_t *order, int n, uint32_t mask);
/* All transports built in, in default preference order. */
extern const hixl_transport_ops_t *const hixl__transports[];
extern const size_t hixl__n_transports;
/* The loopback transport (HIXL_TP_CAP_LOOPBACK): our own context as a peer. */
const hixl_transport_ops_t *hixl__tp_loopback(void);
/* What we offer peers: transports set up, and lazy ones still to set up. */
static inline uint32_t hixl__tp_offered(hixl_ctx_t *ctx)
{
  return atomic_load(&ctx->tp_ready) | atomic_load(&ctx->tp_lazy);
}
/* Set ops up now if it is lazy and not yet (HIXL_TP_CAP_LAZY): OK once it
 * is ready; its error otherwise (it is then no longer offered).  Call with
 * no lock of the core held: it may take a while (fabric: ~0.5 s). */
hixl_status_t hixl__tp_need(hixl_ctx_t *ctx, const hixl_transport_ops_t *ops);

/* The control plane (conn.h: peer.c, call.c, handshake.c, ctl.c). */
hixl_status_t hixl__ctl_start(hixl_ctx_t *ctx);
void hixl__ctl_stop(hixl_ctx_t *ctx);
/* Watch transport id's event fd (ctx->tp_fd[id]) in the control thread. */
void hixl__ctl_watch_tp(hixl_ctx_t *ctx, int id);
/* Hand fd to the control thread: cb(arg, fd, events) runs there on its
 * events (epoll's, level-triggered), without ctx->lock, with ctx->aux_lock
 * held.  Returns the slot, or -1 when all HIXL_AUX_MAX are taken.  The
 * _locked forms are for callbacks and for whoever takes aux_lock itself to
 * remove its slots (del: out of epoll, fd not closed; once aux_lock is
 * released, cb is never called for the slot again). */
int hixl__ctl_aux_add(hixl_ctx_t *ctx, int fd, uint32_t events,
                      void (*cb)(void *arg, int fd, uint32_t events), void *arg);
int hixl__ctl_aux_add_locked(hixl_ctx_t *ctx, int fd, uint32_t events,
                             void (*cb)(void *arg, int fd, uint32_t events), void *arg);
void hixl__ctl_aux_mod_locked(hixl_ctx_t *ctx, int slot, uint32_t events);
void hixl__ctl_aux_del_locked(hixl_ctx_t *ctx, int slot);
/* HIXL_METRICS (metrics.c): the Prometheus endpoint, on the control
 * thread; a bad value or an address that cannot be bound is a warning (the
 * context works without it).  Stop after the control thread has. */
void hixl__metrics_start(hixl_ctx_t *ctx);
void hixl__metrics_stop(hixl_ctx_t *ctx);
hixl_status_t hixl__connect_tagged(hixl_ctx_t *ctx, const char *addr, int timeout_ms, uint64_t tag,
                                   hixl_peer_t **peer_p);
hixl_peer_t *hixl__self_peer(hixl_ctx_t *ctx);
/* Wait (until deadline) while an inbound peer finishes its handshake;
 * true when it is UP. */
bool hixl__peer_await_up(hixl_peer_t *peer, int64_t deadline);
void hixl__peer_free(hixl_peer_t *peer);
/* Into ctx->peers and ctx->hk (false: no memory for the slot); out of both.
 * ctx->lock held. */
bool hixl__peer_link_locked(hixl_ctx_t *ctx, hixl_peer_t *p);
void hixl__peer_unlink_locked(hixl_ctx_t *ctx, hixl_peer_t *p);
/* Snapshot the peers for which keep(p) is true (ctx->lock taken and
 * dropped) and pin them: none is freed until hixl__peers_unpin, so the
 * caller may wait on each outside the lock.  NULL with *n 0 when none;
 * NULL with *n non-zero: no memory (nothing pinned). */
hixl_peer_t **hixl__peers_pin(hixl_ctx_t *ctx, bool (*keep)(hixl_peer_t *p), size_t *n);
void hixl__peers_unpin(hixl_ctx_t *ctx, hixl_peer_t **snap, size_t n);
/* A world's rank's peer: owned by the world (hixl_peer_release refuses
 * it, housekeeping never frees it) until the world lets it go. */
void hixl__peer_world_own(hixl_peer_t *p);
/* The world is done with p: disconnect it, and release it too when the
 * application never saw its handle (hixl_world_peer, hixl_world_wait_rank,
 * a notification), freed once its rmrs (a world's exchange) are gone;
 * otherwise it is the application's to release. */
void hixl__peer_world_disown(hixl_peer_t *p);
/* Sleep on ctx->cond (ctx->lock held) until signalled, deadline, or cap_ms:
 * the one timed wait of control calls and world rendezvous. */
void hixl__cond_wait_until(hixl_ctx_t *ctx, int64_t deadline, int cap_ms);
/* The auth token (the handshake's HMAC key, TLS's PSK): at most this many
 * bytes, a documented limit (it never travels). */
#define HIXL_AUTH_TOKEN_MAX 255
/* Answer a peer's LOOKUP / FD_REQ / ATOMIC (control thread, ctx->lock
 * held): fills *out (and fds to pass, which the caller closes after
 * sending). */
void hixl__serve(hixl_peer_t *peer, const struct hixl_msg *m, struct hixl_msg *out, int *out_fds,
                 int *n_out);
void hixl__peers_destroy(hixl_ctx_t *ctx);
/* Our address to advertise when listening on the wildcard. */
void hixl__primary_ip(char *buf, size_t cap);

/* mr.c */
/* The rkey blob a peer publishes under name: asked once (no waiting for
 * it to appear); NOT_REGISTERED if it has none. */
hixl_status_t hixl__lookup_blob(hixl_peer_t *peer, const char *name, uint8_t *blob, uint32_t *len_p,
                                int64_t deadline);
/* Retire a handle (its magic already set dead); ctx->lock held. */
void hixl__quarantine_locked(hixl_ctx_t *ctx, void *obj);
void hixl__mrs_destroy(hixl_ctx_t *ctx);
/* The context's notification state: its inbox, its sources (notif.c). */
hixl_status_t hixl__notif_init(hixl_ctx_t *ctx);
void hixl__notif_fini(hixl_ctx_t *ctx);
/* A lazy transport just set up: register every region with it, then mark
 * it ready, under reg_lock (so a region registered meanwhile is done by
 * exactly one of us).  On an error, what was registered is undone. */
hixl_status_t hixl__mrs_reg_transport(hixl_ctx_t *ctx, const hixl_transport_ops_t *ops);

#endif /* HIXL_CORE_H */

/* SPDX-License-Identifier: MIT */
/*
 * The control plane: one stream socket per peer carrying wire.h messages,
 * and one control thread per context that accepts peers, runs the target
 * side of the handshake, answers requests that reach our memory (key
 * lookups, memfd requests, atomics on CMA regions), delivers replies to
 * waiting callers, sends heartbeats and notices dead peers.  Because of it a
 * target never has to call hixl for peers to use its memory.
 *
 * Locking: ctx->lock protects the peer list, pending calls and world state.
 * Only the control thread closes peer sockets and frees unbound inbound
 * connections, so a socket is never closed under a reader.  Writes to a
 * socket are serialized by peer->send_lock (lock order: ctx->lock, then
 * send_lock) and never block once the peer is polled: what a full socket
 * does not take waits in the peer's output queue, flushed by the control
 * thread on EPOLLOUT, so a peer that does not read holds nobody (it is
 * dropped past HIXL_MAX_PEER_QUEUE bytes, or after the liveness period
 * without progress).  Only the initiator's own handshake, before the peer is
 * polled, sends blocking (bounded by SO_SNDTIMEO).
 */
#ifndef HIXL_CONN_H
#define HIXL_CONN_H

#include "core.h"

/* The control plane's pieces shared by peer.c (peers' lifetime), call.c
 * (sending, calls and replies), handshake.c (both sides of the handshake)
 * and ctl.c (the control thread). */

#define RX_CAP (HIXL_WIRE_HDR + HIXL_WIRE_MAX)
/* File descriptors one outgoing control message may pass (send_some's
 * control buffer, the output queue, the dispatcher's out_fds). */
#define HIXL_CTL_MAX_FDS 4
/* How long a lost peer keeps its mappings: far longer than any copy that
 * started before the loss was seen. */
#define RELEASE_GRACE_NS(ctx) ((int64_t)(ctx)->cfg.timeout_ms * 2000000 + 1000000000LL)

/* A message the socket did not take at once: the peer's output queue. */
typedef struct hixl_outmsg {
  struct hixl_outmsg *next;
  size_t len, off;           /* bytes, and how many went out */
  int fds[HIXL_CTL_MAX_FDS]; /* our duplicates: they go with the first byte */
  int nfds;
  uint8_t bytes[];
} hixl_outmsg_t;

/* Shared between the files of the control plane. */
/* The control thread: p's socket can take more. */
void hixl__peer_writable(hixl_peer_t *p);
/* A reply arrived (control thread, ctx->lock held): complete the call
 * waiting for it (fd: a passed descriptor, or -1). */
void hixl__complete_pending_locked(hixl_peer_t *p, hixl_msg_t *m, int fd);
/* Drop what is queued for p (its socket is going away).  send_lock held. */
void hixl__outq_clear(hixl_peer_t *p);
/* A new peer record on control socket fd (-1: none yet). */
hixl_peer_t *hixl__peer_new(hixl_ctx_t *ctx, int fd, bool inbound);
/* Fail every control call waiting on p; ctx->lock held. */
void hixl__fail_pending_locked(hixl_peer_t *p);
/* Target side of a bind on the unix socket (TP_BIND with fds), arriving on
 * an accepted unix connection u: find the inbound peer it binds (its
 * transport has bind_unix and takes nfds), let the transport accept it,
 * and move the connection over to it.  NULL (ack says why) when it failed. */
hixl_peer_t *hixl__handle_bind_locked(hixl_peer_t *u, const hixl_msg_t *m, int *fds, int nfds,
                                      hixl_msg_t *ack, int *out_fds, int *n_out);
/* Target side of HELLO: answer with our nonce and our proof.  Nothing about
 * us goes out before the initiator has proved it knows the token. */
void hixl__handle_hello_locked(hixl_peer_t *p, const hixl_msg_t *m, hixl_msg_t *out);
/* Target side of AUTH.  Returns the ack to send (status set). */
void hixl__handle_auth_locked(hixl_peer_t *p, const hixl_msg_t *m, hixl_msg_t *ack);
/* Send p a HEARTBEAT probe stamped with now: its answer gives the round
 * trip (peer->rtt_ns).  ctx->lock held. */
void hixl__probe_locked(hixl_peer_t *p, int64_t now);
/* A control socket's send timeout (timeout_ms), and TCP_NODELAY for TCP. */
void hixl__set_sock_opts(int fd, int timeout_ms, bool tcp);

#endif /* HIXL_CONN_H */

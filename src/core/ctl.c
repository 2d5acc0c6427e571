/* SPDX-License-Identifier: MIT */
/*
 * The control thread (the control plane: conn.h): one per context, with an
 * epoll set of the listeners, its wake-up eventfd and every peer's socket.
 * It accepts peers, reads and dispatches their messages, answers requests
 * that reach our memory, sends heartbeats and notices dead peers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "config.h"
#include "conn.h"
#include "tls.h"

/* ------------------------------------------------------------ receiving */

/* A protocol violation: drop the connection (never trust the rest). */
static void proto_error_locked(hixl_peer_t *p, const char *what, unsigned type)
{
  hixl_warn("peer %s: protocol error: %s (%s); dropping it", p->name, what,
            hixl_wire_type_name(type));
  hixl__peer_fail_locked(p, HIXL_PEER_LOST, "protocol error");
}

/* p's transport's own message m (TP_REQ / TP_REPLY) by its kind, or NULL. */
static const hixl_tp_msg_t *tp_msg(const hixl_peer_t *p, const hixl_msg_t *m)
{
  if (m->type != HIXL_MSG_TP_REQ && m->type != HIXL_MSG_TP_REPLY)
    return NULL;
  for (const hixl_tp_msg_t *t = p->ops ? p->ops->msgs : NULL; t && t->kind; t++)
    if (t->kind == m->tp_req.kind)
      return t;
  return NULL;
}

/* Dispatch one message from p.  Called with ctx->lock held; may leave a
 * reply in *out (sent by the caller after unlocking). */
static void dispatch_locked(hixl_peer_t *p, hixl_msg_t *m, int *fds, hixl_msg_t *out, int *out_fds,
                            int *n_out, hixl_peer_t **reply_to)
{
  hixl_ctx_t *ctx = p->ctx;
  int fd = m->nfds ? fds[0] : -1;
  *reply_to = p;
  if (atomic_load(&p->state) == HIXL_PEER_CONNECTING && p->inbound) {
    if (p->unix_pending && m->type == HIXL_MSG_TP_BIND && m->nfds > 0) {
      /* A bind on the unix socket (shm): the peer it binds says whose. */
      hixl_peer_t *bound = hixl__handle_bind_locked(p, m, fds, m->nfds, out, out_fds, n_out);
      if (bound) {
        /* UP only once the ACK is on the wire (peer_readable): nothing of
         * ours may reach the initiator before it. */
        *reply_to = bound;
      } else {
        hixl_warn("unix connection with an unknown or failed %s: dropping it",
                  hixl_wire_type_name(m->type));
        for (int i = 0; i < m->nfds; i++)
          close(fds[i]);
      }
      return;
    }
    if (!p->unix_pending && p->ops && p->ops->needs_bind && !p->ops->bind_unix &&
        m->type == HIXL_MSG_TP_BIND && m->nfds == 0 && p->tp == NULL) {
      /* An in-band bind (verbs, fabric): the transport answers. */
      memset(out, 0, sizeof(*out));
      p->ops->accept(p, m, NULL, 0, p->fd, out, out_fds, n_out);
      if (out->type == 0)
        proto_error_locked(p, "bind refused", m->type);
      return;
    }
    if (!p->unix_pending && p->hs_stage == 0 && m->type == HIXL_MSG_HELLO && m->nfds == 0 &&
        m->blob_len == HIXL_AUTH_NONCE) {
      hixl__handle_hello_locked(p, m, out);
      return;
    }
    if (!p->unix_pending && p->hs_stage == 1 && m->type == HIXL_MSG_AUTH && m->nfds == 0) {
      hixl__handle_auth_locked(p, m, out);
      if (out->status != HIXL_OK)
        p->unix_pending = true; /* drop quietly after the ack */
      return;
    }
    for (int i = 0; i < m->nfds; i++)
      close(fds[i]);
    proto_error_locked(p, "unexpected message during handshake", m->type);
    return;
  }
  if (atomic_load(&p->state) != HIXL_PEER_UP) {
    for (int i = 0; i < m->nfds; i++)
      close(fds[i]);
    return;
  }
  /* Once connected, only FD_REPLY, DEV_IPC_REPLY and the transport's own
   * messages that say so may carry an fd. */
  const hixl_tp_msg_t *tm = tp_msg(p, m);
  int max_fds = m->type == HIXL_MSG_FD_REPLY || m->type == HIXL_MSG_DEV_IPC_REPLY ? 1
                : tm == NULL                                                      ? 0
                : m->type == HIXL_MSG_TP_REPLY                                    ? tm->reply_fds
                                                                                  : tm->req_fds;
  if (m->nfds > max_fds) {
    for (int i = 0; i < m->nfds; i++)
      close(fds[i]);
    proto_error_locked(p, "unexpected file descriptors", m->type);
    return;
  }
  switch (m->type) {
  case HIXL_MSG_HEARTBEAT:
    if (m->heartbeat.flags & 1) {
      /* A probe (at connect, or the peer's timeout is shorter than our
       * pace): answered at once, its stamp echoed. */
      hixl_msg_t hb = {.type = HIXL_MSG_HEARTBEAT};
      hb.heartbeat.flags = 2;
      hb.heartbeat.q0 = m->heartbeat.q0;
      hixl__send(p, &hb, NULL, 0);
    } else if ((m->heartbeat.flags & 2) && p->probe_ns != 0 &&
               m->heartbeat.q0 == (uint64_t)p->probe_ns) {
      /* The answer to our last probe (any other echo, stale or invented,
       * is ignored: the stamp is ours, so the figure is a real round
       * trip, however slow the peer chose to be). */
      int64_t rtt = hixl__now_ns() - p->probe_ns;
      if (rtt > 0)
        atomic_store_explicit(&p->rtt_ns, rtt, memory_order_relaxed);
      p->probe_ns = 0;
    }
    return;
  case HIXL_MSG_BYE: hixl__peer_fail_locked(p, HIXL_PEER_CLOSED, "peer disconnected"); return;
  case HIXL_MSG_LOOKUP_REPLY:
  case HIXL_MSG_FD_REPLY:
  case HIXL_MSG_DEV_IPC_REPLY:
  case HIXL_MSG_ATOMIC_REPLY:
  case HIXL_MSG_TP_MR_REPLY:
  case HIXL_MSG_REGION_GONE_ACK:
  case HIXL_MSG_STATS_REPLY: hixl__complete_pending_locked(p, m, fd); return;
  case HIXL_MSG_STATS: hixl__stats_serve_locked(p, m, out); return;
  case HIXL_MSG_LOOKUP:
  case HIXL_MSG_FD_REQ:
  case HIXL_MSG_DEV_IPC_REQ:
  case HIXL_MSG_ATOMIC:
  case HIXL_MSG_TP_MR: hixl__serve(p, m, out, out_fds, n_out); return;
  case HIXL_MSG_REGION_GONE:
    /* Peers without the owner's shared table (verbs) learn it this way. */
    for (hixl_rmr_t *r = p->rmrs; r; r = r->next)
      if (r->slot == m->region.slot && r->rkey == m->region.rkey)
        atomic_store(&r->gone, true);
    /* Acknowledged: the owner's hixl_mr_dereg returns only after this, so
     * an operation we issue after it fails cleanly here. */
    memset(out, 0, sizeof(*out));
    out->type = HIXL_MSG_REGION_GONE_ACK;
    out->status = HIXL_OK;
    return;
  case HIXL_MSG_WORLD_BARRIER:
    if (m->world.epoch > p->barrier_epoch)
      p->barrier_epoch = m->world.epoch;
    pthread_cond_broadcast(&ctx->cond);
    return;
  case HIXL_MSG_WORLD_XCHG:
    if (m->blob_len > sizeof(p->xchg_blob)) {
      proto_error_locked(p, "exchange blob too long", m->type);
      return;
    }
    memcpy(p->xchg_blob, m->blob, m->blob_len);
    p->xchg_len = m->blob_len;
    p->xchg_epoch = m->world.epoch;
    pthread_cond_broadcast(&ctx->cond);
    return;
  default:
    /* The transport's own messages (from peers on it only). */
    if (tm && m->type == HIXL_MSG_TP_REPLY) {
      hixl__complete_pending_locked(p, m, fd);
      return;
    }
    if (tm && tm->serve) {
      memset(out, 0, sizeof(*out));
      tm->serve(p, m, out, out_fds, n_out);
      return;
    }
    for (int i = 0; i < m->nfds; i++)
      close(fds[i]);
    proto_error_locked(p, "unexpected message", m->type);
    return;
  }
}

/* Read what p's socket has and handle every whole message.  Control thread. */
static void peer_readable(hixl_ctx_t *ctx, hixl_peer_t *p)
{
  if (p->rx == NULL && (p->rx = malloc(RX_CAP)) == NULL)
    return;
  bool tls = p->tls && p->fd == p->tls_fd;
  if (tls && !p->tls_ready && p->inbound) {
    /* The TLS handshake, a step per readable event (its deadline is the
     * handshake's: from the accept). */
    int r = hixl__tls_handshake(p->tls, p->name);
    if (r == 0)
      return;
    if (r < 0) {
      pthread_mutex_lock(&ctx->lock);
      hixl_warn("%s", hixl_last_error());
      hixl__peer_fail_locked(p, HIXL_PEER_LOST, "TLS handshake failed");
      pthread_mutex_unlock(&ctx->lock);
      return;
    }
    p->tls_ready = true;
  }
  for (;;) {
    union {
      char buf[CMSG_SPACE(sizeof(int) * 8)];
      struct cmsghdr align;
    } cm;
    struct iovec iov = {p->rx + p->rx_len, RX_CAP - p->rx_len};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf)};
    ssize_t n;
    if (tls) {
      mh.msg_controllen = 0; /* TCP: no fds */
      n = hixl__tls_recv(p->tls, iov.iov_base, iov.iov_len);
      if (n < 0 && n != -EAGAIN)
        hixl_warn("peer %s: TLS: %s", p->name, hixl__tls_strerror(n));
      errno = n == -EAGAIN ? EAGAIN : EPROTO;
      n = n < 0 ? -1 : n;
    } else {
      n = recvmsg(p->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    }
    if (n < 0 && errno == EINTR)
      continue;
    pthread_mutex_lock(&ctx->lock);
    if (n > 0 && (mh.msg_flags & MSG_CTRUNC))
      p->rx_fds_dropped = true; /* said below, when a message misses them */
    if (n > 0) {
      for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
          continue;
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int got[8];
        memcpy(got, CMSG_DATA(c), sizeof(int) * (size_t)(k > 8 ? 8 : k));
        for (int i = 0; i < k && i < 8; i++) {
          if (p->n_rx_fds < 8)
            p->rx_fds[p->n_rx_fds++] = got[i];
          else
            close(got[i]);
        }
      }
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      hixl__peer_fail_locked(p, HIXL_PEER_LOST, n == 0 ? "connection closed" : strerror(errno));
      pthread_mutex_unlock(&ctx->lock);
      return;
    }
    if (n < 0) {
      pthread_mutex_unlock(&ctx->lock);
      return;
    }
    p->rx_len += (size_t)n;
    p->last_rx_ns = hixl__now_ns();
    for (;;) {
      size_t need = 0;
      int r = hixl_wire_frame(p->rx, p->rx_len, &need);
      if (r == HIXL_WIRE_SHORT)
        break;
      hixl_msg_t m;
      if (r == HIXL_WIRE_BAD || hixl_wire_decode(p->rx, need, &m) != HIXL_WIRE_OK) {
        proto_error_locked(p, "malformed message", 0);
        pthread_mutex_unlock(&ctx->lock);
        return;
      }
      if (m.nfds > p->n_rx_fds) {
        if (p->rx_fds_dropped) {
          /* Out of descriptors: say so, to the log and to a binding peer
           * (its connect then names the limit, not a closed connection). */
          char hint[200];
          hixl__nofile_hint(hint, sizeof(hint));
          hixl_warn("dropping a connection whose %s carried descriptors the kernel could not give "
                    "us: %s",
                    hixl_wire_type_name(m.type), hint);
          if (m.type == HIXL_MSG_TP_BIND) {
            hixl_msg_t no = {
                .type = HIXL_MSG_TP_BIND_REPLY, .status = HIXL_ERR_NOMEM, .seq = m.seq};
            snprintf(no.str[0], sizeof(no.str[0]), "target: %s", hint);
            pthread_mutex_unlock(&ctx->lock);
            hixl__send(p, &no, NULL, 0);
            pthread_mutex_lock(&ctx->lock);
          }
          hixl__peer_fail_locked(p, HIXL_PEER_LOST, "out of file descriptors");
        } else {
          proto_error_locked(p, "message announces fds that did not arrive", m.type);
        }
        pthread_mutex_unlock(&ctx->lock);
        return;
      }
      int fds[8]; /* m.nfds <= n_rx_fds <= 8 */
      memcpy(fds, p->rx_fds, sizeof(int) * m.nfds);
      memmove(p->rx_fds, p->rx_fds + m.nfds, sizeof(int) * (size_t)(p->n_rx_fds - m.nfds));
      p->n_rx_fds -= m.nfds;
      memmove(p->rx, p->rx + need, p->rx_len - need);
      p->rx_len -= need;

      hixl_msg_t out;
      out.type = 0;
      int out_fds[HIXL_CTL_MAX_FDS], n_out = 0;
      hixl_peer_t *reply_to = p;
      dispatch_locked(p, &m, fds, &out, out_fds, &n_out, &reply_to);
      if (out.type != 0) {
        out.seq = m.seq;
        pthread_mutex_unlock(&ctx->lock);
        hixl_status_t sst = hixl__send(reply_to, &out, out_fds, n_out);
        for (int i = 0; i < n_out; i++)
          close(out_fds[i]);
        pthread_mutex_lock(&ctx->lock);
        /* A handshake that completed with this ACK: the peer is usable now
         * (after its transport's bind; a transport that needs no bind, after
         * HELLO). */
        bool done =
            ((out.type == HIXL_MSG_TP_BIND_REPLY && reply_to->ops && reply_to->ops->needs_bind) ||
             (out.type == HIXL_MSG_HELLO_ACK && reply_to->ops && !reply_to->ops->needs_bind &&
              !reply_to->unix_pending)) &&
            out.status == HIXL_OK;
        /* Bound, but the initiator never got our reply: the peer is of no
         * use, and must not be bound a second time. */
        if (done && sst != HIXL_OK && atomic_load(&reply_to->state) == HIXL_PEER_CONNECTING)
          hixl__peer_fail_locked(reply_to, HIXL_PEER_LOST, "bind reply not sent");
        if (done && sst == HIXL_OK && atomic_load(&reply_to->state) == HIXL_PEER_CONNECTING) {
          atomic_store(&reply_to->state, HIXL_PEER_UP);
          atomic_fetch_add_explicit(&ctx->cnt.accepts, 1, memory_order_relaxed);
          pthread_cond_broadcast(&ctx->cond);
          /* One probe per connection: its round trip for the stats (later
           * ones only when the peer falls quiet: no idle traffic). */
          hixl__probe_locked(reply_to, hixl__now_ns());
        }
        /* A refused handshake: the connection has no further use. */
        if (out.type == HIXL_MSG_HELLO_ACK && out.status != HIXL_OK)
          hixl__peer_fail_locked(reply_to, HIXL_PEER_CLOSED, "handshake refused");
      }
      if (reply_to != p || atomic_load(&p->state) >= HIXL_PEER_LOST) {
        /* p's socket moved to the peer it bound, or p failed. */
        pthread_mutex_unlock(&ctx->lock);
        return;
      }
    }
    pthread_mutex_unlock(&ctx->lock);
  }
}

/* ------------------------------------------------------ control thread */

void hixl__set_sock_opts(int fd, int timeout_ms, bool tcp)
{
  int one = 1;
  if (tcp)
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* Take a failed peer's socket out of epoll and close it (the handle stays
 * until housekeeping frees it).  ctx->lock held. */
static void close_sock_locked(hixl_ctx_t *ctx, hixl_peer_t *p)
{
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_DEL, p->fd, NULL);
  pthread_mutex_lock(&p->send_lock);
  close(p->fd);
  p->fd = -1;
  hixl__outq_clear(p);
  hixl__tls_free(p->tls); /* no sender can use it: fd is -1 under send_lock */
  p->tls = NULL;
  pthread_mutex_unlock(&p->send_lock);
}

/* The listen backlog: connections the kernel completes while we do not
 * accept (a burst past the handshake cap waits there).  The kernel caps it
 * at net.core.somaxconn (4096 by default since Linux 5.4); a full backlog
 * drops SYNs, and each costs the initiator a 1 s retransmission. */
#define HIXL_BACKLOG 4096

/* ------------------------------------------------------- handshake cap
 *
 * At most ctx->max_handshakes inbound connections may be in their
 * handshake (not authenticated yet) at once: each one that never
 * authenticates holds a descriptor and a peer.  Past the cap, or at the
 * descriptor limit, a connection is shed only when it waits on its
 * initiator -- nothing unread on its socket -- and has had a fair time to
 * answer.  When every one waits on us it is our own pace, not an attack:
 * new connections then wait in the kernel's listen backlog (HIXL_BACKLOG)
 * instead, so a burst of thousands of legitimate connects is slowed,
 * never refused.  The list is ctx->hs_head, oldest first: the cap walks
 * it, never every peer (O(peers) per accept made bursts quadratic). */

static bool in_handshake(const hixl_peer_t *p)
{
  return p->fd >= 0 && p->ops == NULL && p->hs_stage < 2 &&
         atomic_load(&p->state) == HIXL_PEER_CONNECTING;
}

static void hs_unlink_locked(hixl_ctx_t *ctx, hixl_peer_t *p)
{
  for (hixl_peer_t **pp = &ctx->hs_head; *pp; pp = &(*pp)->hs_next)
    if (*pp == p) {
      *pp = p->hs_next;
      break;
    }
  p->hs_next = NULL;
  p->in_hs = false;
}

/* Drops the connections whose handshake ended from the list; returns how
 * many remain, and in *tail where a new one goes.  ctx->lock held. */
static int hs_count_locked(hixl_ctx_t *ctx, hixl_peer_t ***tail)
{
  int n = 0;
  hixl_peer_t **pp = &ctx->hs_head;
  while (*pp) {
    hixl_peer_t *p = *pp;
    if (in_handshake(p)) {
      n++;
      pp = &p->hs_next;
      continue;
    }
    *pp = p->hs_next;
    p->hs_next = NULL;
    p->in_hs = false;
  }
  *tail = pp;
  return n;
}

/* How long an initiator may take to answer before its handshake may be
 * shed: an eighth of the handshake deadline, within 50..500 ms (a loaded
 * initiator in a burst of its own connects answers in milliseconds). */
static int64_t hs_fair_ns(const hixl_ctx_t *ctx)
{
  int64_t ns = (int64_t)(ctx->cfg.timeout_ms < HIXL_LIVENESS_FLOOR_MS ? HIXL_LIVENESS_FLOOR_MS
                                                                      : ctx->cfg.timeout_ms) *
               125000;
  return ns < 50000000 ? 50000000 : ns > 500000000 ? 500000000 : ns;
}

/* The oldest handshake that waits on its initiator and had its fair time
 * (none at the descriptor limit: descriptors are what we lack, and an
 * authenticated peer's bind needs some), or NULL with *retry_ns set to
 * when to look again.  ctx->lock held. */
static hixl_peer_t *hs_victim_locked(hixl_ctx_t *ctx, int64_t now, int64_t fair, int64_t *retry_ns)
{
  bool ours = false; /* an old one waits on us: look again soon */
  for (hixl_peer_t *p = ctx->hs_head; p; p = p->hs_next) {
    if (!in_handshake(p))
      continue;
    if (now - p->born_ns < fair) { /* the rest are younger */
      *retry_ns = ours && now + 2000000 < p->born_ns + fair ? now + 2000000 : p->born_ns + fair;
      return NULL;
    }
    int unread = 0;
    if (ioctl(p->fd, FIONREAD, &unread) == 0 && unread == 0)
      return p;
    ours = true;
  }
  *retry_ns = now + (ours ? 2000000 : fair);
  return NULL;
}

/* Shed p: it waited on its initiator past the cap.  ctx->lock held. */
static void hs_shed_locked(hixl_ctx_t *ctx, hixl_peer_t *p, const char *why)
{
  hixl__peer_fail_locked(p, HIXL_PEER_LOST, why);
  close_sock_locked(ctx, p);
  hs_unlink_locked(ctx, p);
}

/* Listeners out of epoll until `until` (the control loop puts them back). */
static void accept_pause(hixl_ctx_t *ctx, int64_t until)
{
  ctx->accept_paused_until = until;
  if (!(ctx->accept_paused & 1) && ctx->listen_fd >= 0 &&
      epoll_ctl(ctx->epoll_fd, EPOLL_CTL_DEL, ctx->listen_fd, NULL) == 0)
    ctx->accept_paused |= 1;
  if (!(ctx->accept_paused & 2) && ctx->unix_fd >= 0 &&
      epoll_ctl(ctx->epoll_fd, EPOLL_CTL_DEL, ctx->unix_fd, NULL) == 0)
    ctx->accept_paused |= 2;
}

/* Out of descriptors: a listener stays readable while accept fails, and
 * epoll would wake us for it forever (a control thread at 100% of a CPU,
 * refusing everyone).  Shed a connection that stalls in its handshake (its
 * descriptor frees at once) and take the listeners out of epoll for a
 * moment -- until one may be shed when there was none. */
static void out_of_fds(hixl_ctx_t *ctx, int err)
{
  int64_t now = hixl__now_ns(), retry = now + 100000000;
  pthread_mutex_lock(&ctx->lock);
  /* Four: room for an authenticated peer's shm bind (its unix connection
   * and the three descriptors it passes), not only for the next accept. */
  hixl_peer_t *old = NULL;
  for (int i = 0; i < 4; i++) {
    hixl_peer_t *v = hs_victim_locked(ctx, now, 0, &retry);
    if (v == NULL)
      break;
    hs_shed_locked(ctx, v, "shed: out of file descriptors");
    old = v;
  }
  pthread_mutex_unlock(&ctx->lock);
  if (now - ctx->emfile_warned_ns > 1000000000) {
    char hint[200];
    hixl_warn("accept: %s: %s: %s", strerror(err), hixl__nofile_hint(hint, sizeof(hint)),
              old ? "shedding connections that stall in their handshake"
                  : "pausing new connections");
    ctx->emfile_warned_ns = now;
  }
  accept_pause(ctx, old || retry < now + 10000000 ? now + 10000000 : retry);
  ctx->accept_capped = false;
}

static void accept_resume(hixl_ctx_t *ctx, int64_t now)
{
  if (!ctx->accept_paused || now < ctx->accept_paused_until)
    return;
  struct epoll_event ev = {.events = EPOLLIN};
  if (ctx->accept_paused & 1) {
    ev.data.ptr = &ctx->listen_fd;
    epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, ctx->listen_fd, &ev);
  }
  if (ctx->accept_paused & 2) {
    ev.data.ptr = &ctx->unix_fd;
    epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, ctx->unix_fd, &ev);
  }
  ctx->accept_paused = 0;
  ctx->accept_capped = false;
}

/* Accept what the listener holds, ACCEPT_BATCH at most a turn: the
 * listener stays readable (level-triggered), and the connected peers'
 * requests (a first lookup, an rkey's mapping) are served between batches
 * of a burst instead of after all of it. */
#define ACCEPT_BATCH 16
static void accept_all(hixl_ctx_t *ctx, int lfd, bool is_unix)
{
  for (int batch = 0; batch < ACCEPT_BATCH; batch++) {
    /* At the cap: shed one that stalls, or leave the rest in the backlog. */
    int64_t now = hixl__now_ns(), retry = 0;
    hixl_peer_t **tail;
    pthread_mutex_lock(&ctx->lock);
    if (hs_count_locked(ctx, &tail) >= ctx->max_handshakes) {
      hixl_peer_t *old = hs_victim_locked(ctx, now, hs_fair_ns(ctx), &retry);
      if (old == NULL) {
        pthread_mutex_unlock(&ctx->lock);
        accept_pause(ctx, retry);
        ctx->accept_capped = true; /* back as soon as a handshake ends */
        return;
      }
      hs_shed_locked(ctx, old,
                     "shed: it stalled in its handshake while HIXL_MAX_HANDSHAKES others were in "
                     "theirs");
    }
    pthread_mutex_unlock(&ctx->lock);
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE)
        out_of_fds(ctx, errno);
      return;
    }
    hixl__set_sock_opts(fd, ctx->cfg.timeout_ms, !is_unix);
    pthread_mutex_lock(&ctx->lock);
    hixl_peer_t *p = hixl__peer_new(ctx, fd, true);
    if (p == NULL) {
      pthread_mutex_unlock(&ctx->lock);
      close(fd);
      continue;
    }
    p->unix_pending = is_unix;
    snprintf(p->name, sizeof(p->name), "%s", is_unix ? "unix-accept" : "tcp-accept");
    if (!is_unix && ctx->tls && (p->tls = hixl__tls_session(ctx, fd, true)) == NULL) {
      hixl_warn("refused a connection: %s", hixl_last_error());
      pthread_mutex_unlock(&ctx->lock);
      hixl__peer_free(p);
      continue;
    }
    p->tls_fd = p->tls ? fd : -1;
    if (p->tls) /* GnuTLS reads with recv(): it must not block the control thread */
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (!hixl__peer_link_locked(ctx, p)) {
      hixl_warn("refused a connection: no memory for its peer");
      pthread_mutex_unlock(&ctx->lock);
      hixl__peer_free(p);
      continue;
    }
    hs_count_locked(ctx, &tail); /* the list may have changed while unlocked */
    *tail = p;
    p->in_hs = true;
    p->polled = true;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = p};
    epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, fd, &ev);
    pthread_mutex_unlock(&ctx->lock);
  }
}

/* How long a peer may stay silent before it is declared lost: the
 * context's timeout, but never under HIXL_LIVENESS_FLOOR_MS -- the timeout
 * of calls (a connect, a wait) may be tiny, a peer is not dead because a
 * loaded machine delayed its heartbeat by a few milliseconds. */
static int liveness_ms(const hixl_ctx_t *ctx)
{
  return ctx->cfg.timeout_ms < HIXL_LIVENESS_FLOOR_MS ? HIXL_LIVENESS_FLOOR_MS
                                                      : ctx->cfg.timeout_ms;
}

/* The control thread's tick: heartbeats and deadlines are looked at this
 * often (a quarter of the liveness period, 10 ms to 1 s). */
static int tick_ms(const hixl_ctx_t *ctx)
{
  int ms = liveness_ms(ctx) / 4;
  return ms < 10 ? 10 : ms > 1000 ? 1000 : ms;
}

void hixl__probe_locked(hixl_peer_t *p, int64_t now)
{
  hixl_msg_t hb = {.type = HIXL_MSG_HEARTBEAT};
  hb.heartbeat.flags = 1;
  hb.heartbeat.q0 = (uint64_t)now;
  /* A newer probe replaces an unanswered one: a late answer to the old
   * one no longer matches (and is not taken for this one's). */
  p->probe_ns = now;
  hixl__send(p, &hb, NULL, 0);
}

#define HK_FREED INT64_MIN /* visit_locked freed the peer */

/* Housekeeping for one peer: liveness and heartbeats of an up peer, the
 * handshake deadline, closing a failed peer's socket, releasing and
 * freeing.  Returns when it next has something to do for the peer (the
 * next tick: now; never: INT64_MAX), or HK_FREED.  Control thread,
 * ctx->lock held. */
static int64_t visit_locked(hixl_ctx_t *ctx, hixl_peer_t *p, int64_t now)
{
  int64_t timeout_ns = (int64_t)liveness_ms(ctx) * 1000000;
  int64_t hb_ns = timeout_ns / 4;
  int st = atomic_load(&p->state);
  bool stalled = false;
  int64_t oq_due = INT64_MAX;
  if (st == HIXL_PEER_UP && !p->self) {
    /* Messages queued for it and none taken for the liveness period: it
     * is alive enough to send but does not read (or is wedged). */
    pthread_mutex_lock(&p->send_lock);
    stalled = p->oq_head && now - p->oq_progress_ns > timeout_ns;
    if (p->oq_head)
      oq_due = p->oq_progress_ns + timeout_ns + 1;
    size_t queued = p->oq_bytes;
    pthread_mutex_unlock(&p->send_lock);
    if (stalled) {
      char why[96];
      snprintf(why, sizeof(why),
               "it has not read its control connection for %d ms (%zu bytes "
               "wait)",
               liveness_ms(ctx), queued);
      hixl_warn("peer %s: %s; dropping it", p->name, why);
      hixl__peer_fail_locked(p, HIXL_PEER_LOST, why);
      st = HIXL_PEER_LOST;
    }
  }
  if (st == HIXL_PEER_UP && !p->self) {
    /* Liveness without messages costs a read of the peer's memory: a
     * TLB and cache miss per peer (2-3 us each in this VM), the idle cost
     * at thousands of peers.  So only once it has been quiet for most of
     * the period: two ticks before the deadline (at least half the
     * period), which leaves those ticks to probe it if its memory says it
     * stopped.  The reading tells when it last turned, so the bound is the
     * same as reading at every tick. */
    int alive = -1;
    int64_t by_page = timeout_ns - 2 * (int64_t)tick_ms(ctx) * 1000000;
    if (by_page < timeout_ns / 2)
      by_page = timeout_ns / 2;
    int64_t quiet_ns = timeout_ns / 2; /* then probed */
    if (p->ops && p->ops->peer_alive) {
      alive = 0;
      if (!p->alive_ok || now - p->last_rx_ns > by_page) {
        int64_t seen = now;
        alive = p->ops->peer_alive(p, now, &seen);
        p->alive_ok = alive >= 0;
        if (alive > 0 && seen > p->last_rx_ns)
          p->last_rx_ns = seen;
      }
      if (p->alive_ok)
        quiet_ns = by_page;
    }
    if (now - p->last_rx_ns > timeout_ns) {
      char why[64];
      snprintf(why, sizeof(why), "no heartbeat for %d ms", liveness_ms(ctx));
      hixl__peer_fail_locked(p, HIXL_PEER_LOST, why);
      st = HIXL_PEER_LOST;
    } else {
      /* Each side sends heartbeats at a quarter of its own timeout, and
       * the peer's may be much longer than ours: once it has been silent
       * for half of our timeout, probe it (it answers at once), so a live
       * peer is never declared dead for its slower pace. */
      bool probe = now - p->last_rx_ns > quiet_ns;
      int64_t tx = atomic_load_explicit(&p->last_tx_ns, memory_order_relaxed);
      if ((probe || alive < 0) && now - tx > (probe ? hb_ns / 2 : hb_ns)) {
        if (probe) {
          hixl__probe_locked(p, now);
        } else {
          hixl_msg_t hb = {.type = HIXL_MSG_HEARTBEAT};
          hixl__send(p, &hb, NULL, 0);
        }
        tx = now;
      }
      /* Next: once it has been quiet that long (a message postpones
       * that: the visit then finds nothing to do), then every tick
       * (probes, the deadline); a heartbeat of ours when due; the deadline
       * of a queue seen now.  Senders need not tell us of a queue they
       * start: an up peer is visited at least every period less a tick,
       * so one is seen before it can be overdue and found stalled at the
       * same tick as when every peer was visited at every tick. */
      if (probe)
        return now;
      int64_t due = p->last_rx_ns + quiet_ns + 1;
      if (alive < 0 && tx + hb_ns + 1 < due)
        due = tx + hb_ns + 1;
      return oq_due < due ? oq_due : due;
    }
  } else if (st == HIXL_PEER_CONNECTING && p->inbound && now - p->born_ns > timeout_ns) {
    /* From the accept, not the last byte: trickling bytes buys nothing. */
    hixl__peer_fail_locked(p, HIXL_PEER_LOST, "handshake timed out");
    st = HIXL_PEER_LOST;
  }
  if (st >= HIXL_PEER_LOST && p->pending)
    hixl__fail_pending_locked(p); /* lost asynchronously (hixl__peer_lost_async) */
  if (st >= HIXL_PEER_LOST && p->lost_ns == 0)
    p->lost_ns = now;
  if (st >= HIXL_PEER_LOST && p->fd >= 0) {
    close_sock_locked(ctx, p);
    pthread_cond_broadcast(&ctx->cond);
  }
  /* A closed socket is never read again (events check fd, and this is the
   * control thread, outside peer_readable): its receive buffer, 4 KiB,
   * goes now rather than with the handle, which a disconnected or handed
   * peer keeps until hixl_ctx_destroy.  It was 85% of what every
   * connect/disconnect cycle left behind (docs/reliability.md). */
  if (st >= HIXL_PEER_LOST && p->fd < 0 && p->rx) {
    free(p->rx);
    p->rx = NULL;
    p->rx_len = 0;
  }
  /* A lost peer's mappings are released after a grace period, when no
   * operation that passed its state check before the loss can still be
   * copying into them, and once its notifications were taken.  The handle
   * itself stays (its ops say PEER_LOST) until the context goes. */
  if (st >= HIXL_PEER_LOST && p->ops && p->ops != &hixl__closed_ops && !p->unix_pending &&
      now - p->lost_ns > RELEASE_GRACE_NS(ctx) &&
      (p->inbox == NULL || !hixl_ring_maybe_nonempty(p->inbox)) &&
      atomic_load(&p->inbox_queued) == 0) {
    for (hixl_rmr_t *r = p->rmrs; r; r = r->next)
      p->ops->rmr_detach(r);
    p->ops->peer_close(p);
    p->ops = &hixl__closed_ops;
    free(p->rx);
    p->rx = NULL;
    p->rx_len = 0;
  }
  /* Never visible to the user (no handshake done, or closed and its
   * handle never given out, nor held by a world or an rmr a world's
   * exchange made): free now, so that connections that come and go cost
   * nothing once they are gone (docs/scale.md). */
  bool unseen = p->inbound && (p->unix_pending || p->ops == NULL ||
                               (p->ops == &hixl__closed_ops && !atomic_load(&p->handed) &&
                                !atomic_load(&p->world_owned) && p->rmrs == NULL));
  /* Or released by the user (hixl_peer_release), once the grace after its
   * end is over: an operation issued before may have been in the
   * transport until then. */
  bool let_go =
      atomic_load(&p->released) && p->ops == &hixl__closed_ops && !p->tp_kept && p->rmrs == NULL;
  if (st >= HIXL_PEER_LOST && let_go && now - p->lost_ns <= RELEASE_GRACE_NS(ctx))
    return p->lost_ns + RELEASE_GRACE_NS(ctx) + 1;
  if (st >= HIXL_PEER_LOST && (unseen || let_go) && !p->tp_kept) {
    if (now <= p->hold_ns)
      return p->hold_ns + 1;
    /* A thread walks a snapshot that holds it, outside the lock
     * (hixl__peers_pin): free it a little later. */
    if (p->pins != 0)
      return now + 50 * 1000000LL;
    if (p->in_hs)
      hs_unlink_locked(ctx, p);
    hixl__peer_unlink_locked(ctx, p);
    hixl__peer_free(p);
    return HK_FREED;
  }
  /* Self, up: nothing until it fails (a failure makes a full pass).
   * Released, the handle kept for the user: nothing ever again.  The
   * rest (handshakes, lost peers in their grace) at every tick. */
  if ((st == HIXL_PEER_UP && p->self) || (st >= HIXL_PEER_LOST && p->ops == &hixl__closed_ops))
    return INT64_MAX;
  return now;
}

/* Close sockets of failed peers; free connections nobody can see; send
 * heartbeats.  Visits the peers due (all of them on a full pass, after a
 * failure).  Walks the slots from the end: a freed peer's slot takes the
 * last one, visited already.  Control thread, ctx->lock held. */
static void housekeeping_locked(hixl_ctx_t *ctx, int64_t now, bool full)
{
  for (uint32_t i = ctx->hk_n; i-- > 0;) {
    if (!full && ctx->hk[i].due_ns > now)
      continue;
    hixl_peer_t *p = ctx->hk[i].p;
    int64_t due = visit_locked(ctx, p, now);
    if (due != HK_FREED)
      ctx->hk[p->hk_idx].due_ns = due;
  }
}

/* Events per turn of the control loop: enough to see every ready fd of a
 * burst at once (handshakes are capped at HIXL_MAX_HANDSHAKES, 256 by
 * default), so that up peers' requests are served first; of the others,
 * at most CTL_HS_EVENTS a turn. */
#define CTL_EVENTS 512
#define CTL_HS_EVENTS 32 /* the batch it took before: handshakes as fast as then */

/* An epoll event's pointer is a peer's (NULL: handled already), not one of
 * the context's own fds. */
/* One of ctx->aux's slots (epoll's data.ptr for them). */
static bool is_aux_event(const hixl_ctx_t *ctx, const void *ptr)
{
  return (const struct hixl_aux *)ptr >= ctx->aux &&
         (const struct hixl_aux *)ptr < ctx->aux + HIXL_AUX_MAX;
}

static bool is_peer_event(const hixl_ctx_t *ctx, const void *ptr)
{
  return ptr != NULL && ptr != &ctx->listen_fd && ptr != &ctx->unix_fd && ptr != &ctx->wake_fd &&
         !((const int *)ptr >= ctx->tp_fd && (const int *)ptr < ctx->tp_fd + HIXL_TP_MAX) &&
         !is_aux_event(ctx, ptr);
}

/* ------------------------------------------------------------ aux fds */

int hixl__ctl_aux_add_locked(hixl_ctx_t *ctx, int fd, uint32_t events,
                             void (*cb)(void *arg, int fd, uint32_t events), void *arg)
{
  for (int i = 0; i < HIXL_AUX_MAX; i++) {
    struct hixl_aux *a = &ctx->aux[i];
    if (a->cb != NULL)
      continue;
    struct epoll_event ev = {.events = events, .data.ptr = a};
    a->fd = fd;
    a->arg = arg;
    a->cb = cb;
    if (epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      a->cb = NULL;
      return -1;
    }
    return i;
  }
  return -1;
}

int hixl__ctl_aux_add(hixl_ctx_t *ctx, int fd, uint32_t events,
                      void (*cb)(void *arg, int fd, uint32_t events), void *arg)
{
  pthread_mutex_lock(&ctx->aux_lock);
  int slot = hixl__ctl_aux_add_locked(ctx, fd, events, cb, arg);
  pthread_mutex_unlock(&ctx->aux_lock);
  return slot;
}

void hixl__ctl_aux_mod_locked(hixl_ctx_t *ctx, int slot, uint32_t events)
{
  struct epoll_event ev = {.events = events, .data.ptr = &ctx->aux[slot]};
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_MOD, ctx->aux[slot].fd, &ev);
}

void hixl__ctl_aux_del_locked(hixl_ctx_t *ctx, int slot)
{
  if (slot < 0 || slot >= HIXL_AUX_MAX || ctx->aux[slot].cb == NULL)
    return;
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_DEL, ctx->aux[slot].fd, NULL);
  ctx->aux[slot].cb = NULL;
  ctx->aux[slot].arg = NULL;
  ctx->aux[slot].fd = -1;
}

/* An aux slot's event: a stale one (the slot emptied, or taken again, since
 * epoll reported it) reaches nobody or a callback that finds nothing to do. */
static void aux_event(hixl_ctx_t *ctx, struct hixl_aux *a, uint32_t events)
{
  pthread_mutex_lock(&ctx->aux_lock);
  if (a->cb)
    a->cb(a->arg, a->fd, events);
  pthread_mutex_unlock(&ctx->aux_lock);
}

static void *ctl_main(void *arg)
{
  hixl_ctx_t *ctx = arg;
  struct epoll_event evs[CTL_EVENTS];
  int64_t last_hk = 0;
  while (!atomic_load(&ctx->stopping)) {
    int hb_ms = tick_ms(ctx);
    int wait_ms = atomic_load(&ctx->tp_backlog) > 0 ? 1 : hb_ms;
    if (ctx->accept_paused) { /* listeners back in epoll on time */
      int64_t ms = (ctx->accept_paused_until - hixl__now_ns() + 999999) / 1000000;
      if (ms < wait_ms)
        wait_ms = ms < 1 ? 1 : (int)ms;
    }
    int n = epoll_wait(ctx->epoll_fd, evs, CTL_EVENTS, wait_ms);
    accept_resume(ctx, hixl__now_ns());
    /* Up peers' events first, all of them; then at most CTL_HS_EVENTS of
     * the others (handshakes, lost peers' hang-ups), the rest left for the
     * next turn (level-triggered: epoll reports them again).  In a burst
     * of connections a bound peer's request (the mapping of an rkey, before
     * its first put) waited behind every ready handshake: up to 256 of
     * them, a third of a millisecond each (docs/scale.md). */
    int hs_left = CTL_HS_EVENTS;
    for (int pass = 0; pass < 2; pass++) {
      for (int i = 0; i < n; i++) {
        void *ptr = evs[i].data.ptr;
        if (!is_peer_event(ctx, ptr)) {
          if (pass == 0)
            continue;
          if (ptr == &ctx->listen_fd) {
            accept_all(ctx, ctx->listen_fd, false);
          } else if (ptr == &ctx->unix_fd) {
            accept_all(ctx, ctx->unix_fd, true);
          } else if (ptr == &ctx->wake_fd) {
            uint64_t v;
            ssize_t r = read(ctx->wake_fd, &v, sizeof(v));
            (void)r;
          } else if (is_aux_event(ctx, ptr)) {
            aux_event(ctx, ptr, evs[i].events);
          } /* a transport's fd: handled below, with the periodic tick */
          continue;
        }
        hixl_peer_t *p = ptr;
        if (pass == 0) {
          if (atomic_load(&p->state) != HIXL_PEER_UP)
            continue;
          evs[i].data.ptr = NULL; /* done: pass 1 skips it */
        } else if (p->fd < 0 || hs_left-- <= 0) {
          continue;
        }
        /* The event may be stale: p might have been freed by the
         * housekeeping of an earlier event in this batch only if its fd was
         * removed from epoll first, which drops pending events for it. */
        if (p->fd >= 0 && (evs[i].events & EPOLLOUT))
          hixl__peer_writable(p);
        if (p->fd >= 0 && (evs[i].events & ~(uint32_t)EPOLLOUT))
          peer_readable(ctx, p);
      }
    }
    /* Liveness is judged as of now, when the sockets were last read: time
     * this thread then spends on transport work is not a peer's silence.
     * It was: an initiator feeding a backlog of notifications from here
     * (verbs, a sleeping consumer at the other end) read nothing for ten
     * seconds, then found no heartbeat for ten seconds and declared its
     * live target lost (the rxe suite's notif_order+wait=sleep, 1 run in
     * 6). */
    int64_t now = hixl__now_ns();
    if (hixl_unlikely(ctx->test_stall_ms > 0) && atomic_load(&ctx->cnt.connects) > 0) {
      usleep((useconds_t)ctx->test_stall_ms * 1000); /* once, with a peer to lose */
      ctx->test_stall_ms = 0;
    }
    /* Target-side transport work (verbs receive completions): on its event
     * and at every tick, so nothing waits longer than a tick. */
    for (size_t t = 0; t < hixl__n_transports; t++)
      if (ctx->tp_ready & (1u << hixl__transports[t]->id))
        hixl__transports[t]->on_event(ctx);
    pthread_mutex_lock(&ctx->lock);
    /* Sockets of failed peers close promptly (a failure sets hk_due);
     * heartbeats and deadlines at the tick.  Not at every event: the scan
     * is O(peers), and with thousands connected their heartbeats alone
     * made it O(peers^2) a second. */
    bool full = atomic_exchange(&ctx->hk_due, false);
    if (full || now - last_hk >= (int64_t)hb_ms * 1000000) {
      housekeeping_locked(ctx, now, full);
      last_hk = now;
    }
    hixl_peer_t **tail;
    if (ctx->accept_capped && hs_count_locked(ctx, &tail) < ctx->max_handshakes)
      ctx->accept_paused_until = 0; /* a handshake ended: accept again */
    pthread_mutex_unlock(&ctx->lock);
    accept_resume(ctx, now);
  }
  return NULL;
}

static hixl_status_t listen_tcp(hixl_ctx_t *ctx)
{
  /* Connections in their handshake (not authenticated yet) are capped:
   * past the cap the oldest is shed (HIXL_MAX_HANDSHAKES, default 256). */
  long mh = 256;
  const char *mhs = getenv("HIXL_MAX_HANDSHAKES");
  if (mhs && hixl__parse_int(mhs, 1, 1 << 20, &mh) != 0)
    return hixl__err(HIXL_ERR_INVALID, "HIXL_MAX_HANDSHAKES=\"%s\": expected 1..1048576", mhs);
  ctx->max_handshakes = (int)mh;
  /* Authenticated inbound peers at once (each costs memory). */
  long mp = 1024;
  const char *mps = getenv("HIXL_MAX_PEERS");
  if (mps && hixl__parse_int(mps, 1, 1 << 20, &mp) != 0)
    return hixl__err(HIXL_ERR_INVALID, "HIXL_MAX_PEERS=\"%s\": expected 1..1048576", mps);
  ctx->max_peers = (int)mp;
  /* Control messages queued for one peer that does not read, at most. */
  long mq = 4 << 20;
  const char *mqs = getenv("HIXL_MAX_PEER_QUEUE");
  if (mqs && hixl__parse_int(mqs, 4096, 1L << 30, &mq) != 0)
    return hixl__err(HIXL_ERR_INVALID,
                     "HIXL_MAX_PEER_QUEUE=\"%s\": expected 4096..1073741824 "
                     "(bytes)",
                     mqs);
  ctx->max_outq = (size_t)mq;
  ctx->test_stall_ms = hixl__env_int("HIXL_TEST_CTL_STALL_MS", 0, 60000, 0);
  hixl_status_t tst = hixl__tls_init(ctx);
  if (tst != HIXL_OK)
    return tst;
  char host[128], port[16];
  const char *listen_addr = ctx->cfg.listen ? ctx->cfg.listen : ":0";
  hixl_status_t st = hixl__parse_hostport(listen_addr, host, sizeof(host), port, sizeof(port));
  if (st != HIXL_OK)
    return st;
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *res;
  int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
  if (rc != 0)
    return hixl__err(HIXL_ERR_INVALID, "cannot resolve listen address \"%s\": %s", listen_addr,
                     gai_strerror(rc));
  int fd = -1, err = 0;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    if (host[0] == 0 && ai->ai_family != AF_INET)
      continue; /* any address: IPv4 wildcard, the common case */
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, HIXL_BACKLOG) == 0)
      break;
    err = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  char why[320];
  if (fd < 0)
    return hixl__err(HIXL_ERR_TRANSPORT, "cannot listen on \"%s\": %s", listen_addr,
                     hixl__strerror_fd(err ? err : EADDRNOTAVAIL, why, sizeof(why)));
  ctx->listen_fd = fd;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  getsockname(fd, (struct sockaddr *)&ss, &sl);
  char num[64], serv[16];
  getnameinfo((struct sockaddr *)&ss, sl, num, sizeof(num), serv, sizeof(serv),
              NI_NUMERICHOST | NI_NUMERICSERV);
  if (host[0] == 0 || strcmp(num, "0.0.0.0") == 0 || strcmp(num, "::") == 0)
    hixl__primary_ip(num, sizeof(num));
  if (strchr(num, ':'))
    snprintf(ctx->address, sizeof(ctx->address), "[%s]:%s", num, serv);
  else
    snprintf(ctx->address, sizeof(ctx->address), "%s:%s", num, serv);
  return HIXL_OK;
}

static hixl_status_t listen_unix(hixl_ctx_t *ctx)
{
  /* Abstract namespace: no file to clean up; scoped to the network
   * namespace, which is what "same host" means for us. */
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t len = strlen(ctx->unix_name + 1); /* named at hixl_ctx_create */
  memcpy(sa.sun_path, ctx->unix_name, sizeof(ctx->unix_name));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 ||
      bind(fd, (struct sockaddr *)&sa,
           (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len)) != 0 ||
      listen(fd, HIXL_BACKLOG) != 0) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    char why[320];
    return hixl__err(HIXL_ERR_TRANSPORT, "cannot listen on unix socket: %s",
                     hixl__strerror_fd(e, why, sizeof(why)));
  }
  ctx->unix_fd = fd;
  return HIXL_OK;
}

void hixl__ctl_watch_tp(hixl_ctx_t *ctx, int id)
{
  /* Before hixl__ctl_start: it watches every tp_fd set by then.  After:
   * epoll_ctl is safe beside the thread's epoll_wait. */
  if (ctx->epoll_fd < 0 || ctx->tp_fd[id] < 0)
    return;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &ctx->tp_fd[id]};
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, ctx->tp_fd[id], &ev);
}

hixl_status_t hixl__ctl_start(hixl_ctx_t *ctx)
{
  hixl_status_t st = listen_tcp(ctx);
  if (st != HIXL_OK)
    return st;
  if ((st = listen_unix(ctx)) != HIXL_OK)
    return st;
  ctx->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  ctx->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  char why[320];
  if (ctx->epoll_fd < 0 || ctx->wake_fd < 0)
    return hixl__err(HIXL_ERR_TRANSPORT, "epoll/eventfd: %s",
                     hixl__strerror_fd(errno, why, sizeof(why)));
  struct epoll_event ev = {.events = EPOLLIN};
  ev.data.ptr = &ctx->listen_fd;
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, ctx->listen_fd, &ev);
  ev.data.ptr = &ctx->unix_fd;
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, ctx->unix_fd, &ev);
  ev.data.ptr = &ctx->wake_fd;
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, ctx->wake_fd, &ev);
  for (int i = 0; i < HIXL_TP_MAX; i++)
    hixl__ctl_watch_tp(ctx, i);
  if (hixl__thread_start(&ctx->ctl_thread, "hixl-ctl", ctl_main, ctx) != 0)
    return hixl__err(HIXL_ERR_NOMEM, "cannot start the control thread");
  ctx->ctl_started = true;
  return HIXL_OK;
}

void hixl__ctl_stop(hixl_ctx_t *ctx)
{
  if (ctx->ctl_started) {
    atomic_store(&ctx->stopping, true);
    hixl__wake(ctx);
    pthread_join(ctx->ctl_thread, NULL);
    ctx->ctl_started = false;
  }
}

/* SPDX-License-Identifier: MIT */
/*
 * The handshake (the control plane: conn.h; the protocol in auth.h and
 * docs/architecture.md): the target's side (HELLO, AUTH, the transport's
 * choice, the shm bind on the unix socket), run by the control thread, and
 * the initiator's, run by hixl_connect in the caller's thread.
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
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "config.h"
#include "conn.h"
#include "tls.h"

/* "shm,verbs" for a bit set of HIXL_TP_* (a buffer of the calling thread). */
static const char *tp_list(uint32_t bits)
{
  static __thread char buf[64];
  return hixl__tp_join(buf, sizeof(buf), NULL, 0, bits);
}

static const hixl_transport_ops_t *pick_transport_locked(hixl_ctx_t *ctx, const hixl_msg_t *hello)
{
  uint8_t order[HIXL_TP_MAX];
  int n;
  uint32_t mask;
  if (hixl__parse_transports(hello->str[0], order, &n, &mask) != HIXL_OK)
    return NULL;
  for (int i = 0; i < n; i++) {
    if (!(ctx->tp_allowed & (1u << order[i])))
      continue;
    for (size_t t = 0; t < hixl__n_transports; t++) {
      const hixl_transport_ops_t *ops = hixl__transports[t];
      uint32_t bit = 1u << ops->id;
      /* A lazy one not set up yet is picked on trust: the caller sets it
       * up and asks again, and then usable() decides. */
      if (ops->id == order[i] && !(ops->caps & HIXL_TP_CAP_LOOPBACK) &&
          (hixl__tp_offered(ctx) & bit) && (hello->auth.tp_bits & bit) &&
          (!(atomic_load(&ctx->tp_ready) & bit) || ops->usable(ctx, hello)))
        return ops;
    }
  }
  return NULL;
}

/* The identity fields of AUTH as its proof covers them (auth.h): fixed
 * little-endian layout, the transport list with its NUL. */
static size_t auth_identity(const hixl_msg_t *m, uint8_t *buf)
{
  size_t n = 0;
  for (int i = 0; i < 4; i++)
    buf[n++] = (uint8_t)(m->auth.tp_bits >> (8 * i));
  for (int i = 0; i < 8; i++)
    buf[n++] = (uint8_t)(m->auth.ctx_id >> (8 * i));
  memcpy(buf + n, m->host_id, 32);
  n += 32;
  for (int i = 0; i < 4; i++)
    buf[n++] = (uint8_t)(m->auth.pid >> (8 * i));
  for (int i = 0; i < 8; i++)
    buf[n++] = (uint8_t)(m->auth.tag >> (8 * i));
  size_t sl = strnlen(m->str[0], HIXL_WIRE_STR - 1);
  memcpy(buf + n, m->str[0], sl);
  n += sl;
  buf[n++] = 0;
  return n;
}
#define AUTH_IDENTITY_MAX (4 + 8 + 32 + 4 + 8 + HIXL_WIRE_STR)

/* Target side of HELLO: answer with our nonce and our proof.  Nothing about
 * us goes out before the initiator has proved it knows the token. */
void hixl__handle_hello_locked(hixl_peer_t *p, const hixl_msg_t *m, hixl_msg_t *out)
{
  hixl_ctx_t *ctx = p->ctx;
  memset(out, 0, sizeof(*out));
  out->type = HIXL_MSG_AUTH_CHALLENGE;
  memcpy(p->auth_nonce, m->blob, HIXL_AUTH_NONCE);
  hixl__auth_nonce(p->auth_nonce + HIXL_AUTH_NONCE);
  memcpy(out->blob, p->auth_nonce + HIXL_AUTH_NONCE, HIXL_AUTH_NONCE);
  hixl__auth_proof(ctx->cfg.auth_token, HIXL_AUTH_LABEL_TARGET, p->auth_nonce,
                   p->auth_nonce + HIXL_AUTH_NONCE, NULL, 0, out->blob + HIXL_AUTH_NONCE);
  out->blob_len = HIXL_AUTH_NONCE + HIXL_AUTH_PROOF;
  p->hs_stage = 1;
}

/* Target side of AUTH.  Returns the ack to send (status set). */
void hixl__handle_auth_locked(hixl_peer_t *p, const hixl_msg_t *m, hixl_msg_t *ack)
{
  hixl_ctx_t *ctx = p->ctx;
  memset(ack, 0, sizeof(*ack));
  ack->type = HIXL_MSG_HELLO_ACK;
  p->hs_stage = 2;
  uint8_t id[AUTH_IDENTITY_MAX], want[HIXL_AUTH_PROOF];
  size_t idn = auth_identity(m, id);
  hixl__auth_proof(ctx->cfg.auth_token, HIXL_AUTH_LABEL_INITIATOR, p->auth_nonce,
                   p->auth_nonce + HIXL_AUTH_NONCE, id, idn, want);
  if (m->blob_len != HIXL_AUTH_PROOF || !hixl__auth_equal(want, m->blob)) {
    /* No identity in a refusal: the initiator has proved nothing. */
    ack->status = HIXL_ERR_AUTH;
    snprintf(ack->str[1], sizeof(ack->str[1]), "auth token rejected");
    hixl_warn("rejected a connection: wrong auth token");
    return;
  }
  ack->hello_ack.ctx_id = ctx->id;
  memcpy(ack->host_id, ctx->host_id, 32);
  ack->hello_ack.pid = (uint32_t)getpid();
  p->remote_ctx_id = m->auth.ctx_id;
  p->remote_pid = (pid_t)m->auth.pid;
  p->tag = m->auth.tag;
  if (m->auth.ctx_id == ctx->id) {
    /* Our own context: the initiator makes a self peer; this connection
     * only carried the handshake. */
    ack->hello_ack.tp_id = (uint32_t)hixl__tp_loopback()->id;
    p->unix_pending = true; /* not a user-visible peer: free it at EOF */
    return;
  }
  /* Every authenticated inbound peer costs memory (shm: an inbox ring, the
   * mapped table; verbs: QPs): without a token anyone authenticates, so the
   * number is capped (HIXL_MAX_PEERS). */
  int n_in = 0;
  /* Counted only when it could reach the cap: every peer of the context
   * has a housekeeping slot (ctx->hk), so there are at most hk_n.  The walk
   * touches every peer's record (a cache miss each), at every connect. */
  if (ctx->hk_n >= (uint32_t)ctx->max_peers)
    for (hixl_peer_t *q = ctx->peers; q; q = q->next)
      if (q->inbound && q->ops && !q->unix_pending && atomic_load(&q->state) <= HIXL_PEER_UP)
        n_in++;
  if (n_in >= ctx->max_peers) {
    ack->status = HIXL_ERR_AGAIN;
    snprintf(ack->str[1], sizeof(ack->str[1]),
             "%s already serves %d peers (HIXL_MAX_PEERS); retry later", ctx->address, n_in);
    hixl_warn("refused a peer: %d inbound peers already (HIXL_MAX_PEERS)", n_in);
    return;
  }
  const hixl_transport_ops_t *ops;
  /* Each turn sets up one lazy transport (or finds it failing: then it is
   * no longer offered), so this ends.  Without ctx->lock: a set-up may
   * take half a second, and the other peers' operations go on.  p stays:
   * only this thread frees peers. */
  while ((ops = pick_transport_locked(ctx, m)) != NULL &&
         !(atomic_load(&ctx->tp_ready) & (1u << ops->id))) {
    pthread_mutex_unlock(&ctx->lock);
    int64_t t0 = hixl__now_ns();
    (void)hixl__tp_need(ctx, ops);
    pthread_mutex_lock(&ctx->lock);
    /* The control thread was the set-up's: no handshake could move on
     * meanwhile, so their deadlines (from born_ns) do not count it. */
    int64_t spent = hixl__now_ns() - t0;
    for (hixl_peer_t *q = ctx->hs_head; q; q = q->hs_next)
      q->born_ns += spent;
  }
  if (ops == NULL) {
    ack->status = HIXL_ERR_UNSUPPORTED;
    bool same_host = memcmp(ctx->host_id, m->host_id, sizeof(ctx->host_id)) == 0;
    snprintf(ack->str[1], sizeof(ack->str[1]),
             "no common transport (initiator allows \"%s\" and can use \"%s\"; %s host; here "
             "\"%s\" is usable)",
             m->str[0][0] ? m->str[0] : "all", tp_list(m->auth.tp_bits),
             same_host ? "same" : "different", ctx->tp_names);
    return;
  }
  ack->hello_ack.tp_id = (uint32_t)ops->id;
  p->ops = ops;
  p->cookie = hixl__random64();
  ack->hello_ack.cookie = p->cookie;
  snprintf(ack->str[0], sizeof(ack->str[0]), "%s", ctx->unix_name + 1);
  snprintf(p->name, sizeof(p->name), "inbound#%u(pid %d)", ++ctx->n_inbound, (int)p->remote_pid);
}

hixl_peer_t *hixl__handle_bind_locked(hixl_peer_t *u, const hixl_msg_t *m, int *fds, int nfds,
                                      hixl_msg_t *ack, int *out_fds, int *n_out)
{
  hixl_ctx_t *ctx = u->ctx;
  hixl_peer_t *p;
  for (p = ctx->peers; p; p = p->next)
    if (p->inbound && !p->unix_pending && atomic_load(&p->state) == HIXL_PEER_CONNECTING &&
        p->tp == NULL && p->cookie == m->unix_bind.cookie &&
        p->remote_ctx_id == m->unix_bind.ctx_id && p->ops && p->ops->bind_unix &&
        p->ops->bind_fds == nfds)
      break;
  memset(ack, 0, sizeof(*ack));
  ack->type = HIXL_MSG_TP_BIND_REPLY;
  if (p == NULL) {
    ack->status = HIXL_ERR_AUTH;
    return NULL;
  }
  p->ops->accept(p, m, fds, nfds, u->fd, ack, out_fds, n_out);
  if (ack->type != 0 && ack->status != HIXL_OK && ack->str[0][0] == 0) {
    /* The peer proved the token (its cookie): tell it why, so that its
     * connect names the cause (a descriptor limit, memory). */
    char hint[200];
    snprintf(ack->str[0], sizeof(ack->str[0]), "target: %s",
             errno == EMFILE ? hixl__nofile_hint(hint, sizeof(hint)) : hixl_last_error());
  }
  if (ack->type == 0 || ack->status != HIXL_OK)
    return NULL;
  /* Swap sockets: the TCP one has done its job (with anything still queued
   * for it). */
  pthread_mutex_lock(&p->send_lock);
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_DEL, p->fd, NULL);
  close(p->fd);
  hixl__outq_clear(p);
  hixl__tls_free(p->tls);
  p->tls = NULL;
  p->fd = u->fd;
  u->fd = -1;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = p};
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_MOD, p->fd, &ev);
  pthread_mutex_unlock(&p->send_lock);
  atomic_store(&u->state, HIXL_PEER_CLOSED);
  return p;
}

/* ------------------------------------------------------ initiator side */

/* Blocking exchange on a socket not yet owned by the control thread. */
hixl_status_t hixl__recv_sync(int fd, hixl_msg_t *m, int *fds, int max_fds, int64_t deadline,
                              const char *who)
{
  uint8_t buf[RX_CAP];
  size_t have = 0, need = HIXL_WIRE_HDR;
  int nf = 0;
  for (;;) {
    int r = hixl_wire_frame(buf, have, &need);
    if (r == HIXL_WIRE_BAD)
      return hixl__err(HIXL_ERR_TRANSPORT, "%s: malformed handshake reply", who);
    if (r == HIXL_WIRE_OK)
      break;
    int ms = deadline == INT64_MAX ? -1 : (int)((deadline - hixl__now_ns()) / 1000000);
    if (ms < 0 && deadline != INT64_MAX)
      ms = 0;
    struct pollfd pfd = {fd, POLLIN, 0};
    int pr = poll(&pfd, 1, ms);
    if (pr == 0)
      return hixl__err(HIXL_ERR_TIMEOUT, "%s: no handshake reply in time", who);
    if (pr < 0 && errno == EINTR)
      continue;
    union {
      char b[CMSG_SPACE(sizeof(int) * 4)];
      struct cmsghdr align;
    } cm;
    struct iovec iov = {buf + have, need - have};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof(cm.b)};
    ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
      continue;
    for (struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        continue;
      int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      int got[4];
      memcpy(got, CMSG_DATA(c), sizeof(int) * (size_t)(k > 4 ? 4 : k));
      for (int i = 0; i < k && i < 4; i++) {
        if (nf < max_fds)
          fds[nf++] = got[i];
        else
          close(got[i]);
      }
    }
    if (n <= 0) {
      for (int i = 0; i < nf; i++)
        close(fds[i]);
      return hixl__err(HIXL_ERR_PEER_LOST, "%s closed the connection during the handshake", who);
    }
    if (mh.msg_flags & MSG_CTRUNC) {
      for (int i = 0; i < nf; i++)
        close(fds[i]);
      char hint[200];
      return hixl__err(HIXL_ERR_NOMEM, "%s: the kernel dropped the descriptors it passed us: %s",
                       who, hixl__nofile_hint(hint, sizeof(hint)));
    }
    have += (size_t)n;
  }
  if (hixl_wire_decode(buf, need, m) != HIXL_WIRE_OK || m->nfds != nf) {
    for (int i = 0; i < nf; i++)
      close(fds[i]);
    return hixl__err(HIXL_ERR_TRANSPORT, "%s: malformed handshake reply", who);
  }
  return HIXL_OK;
}

hixl_status_t hixl__peer_recv_sync(hixl_peer_t *peer, hixl_msg_t *m, int64_t deadline)
{
  if (peer->tls == NULL || peer->fd != peer->tls_fd)
    return hixl__recv_sync(peer->fd, m, NULL, 0, deadline, peer->name);
  uint8_t buf[RX_CAP];
  size_t have = 0, need = HIXL_WIRE_HDR;
  for (;;) {
    int r = hixl_wire_frame(buf, have, &need);
    if (r == HIXL_WIRE_BAD)
      return hixl__err(HIXL_ERR_TRANSPORT, "%s: malformed handshake reply", peer->name);
    if (r == HIXL_WIRE_OK)
      break;
    ssize_t n = hixl__tls_recv(peer->tls, buf + have, need - have);
    if (n > 0) {
      have += (size_t)n;
      continue;
    }
    if (n == 0)
      return hixl__err(HIXL_ERR_PEER_LOST, "%s closed the connection during the handshake",
                       peer->name);
    if (n != -EAGAIN)
      return hixl__err(HIXL_ERR_TRANSPORT, "%s: TLS: %s", peer->name, hixl__tls_strerror(n));
    int ms = (int)((deadline - hixl__now_ns()) / 1000000);
    struct pollfd pfd = {peer->fd, POLLIN, 0};
    if (ms <= 0 || poll(&pfd, 1, ms) == 0)
      return hixl__err(HIXL_ERR_TIMEOUT, "%s: no handshake reply in time", peer->name);
  }
  if (hixl_wire_decode(buf, need, m) != HIXL_WIRE_OK || m->nfds != 0)
    return hixl__err(HIXL_ERR_TRANSPORT, "%s: malformed handshake reply", peer->name);
  return HIXL_OK;
}

/* The initiator's TLS handshake, within the deadline (the socket stays
 * non-blocking from here on: sends poll, receives poll). */
static hixl_status_t tls_client(hixl_peer_t *p, int64_t deadline, const char *addr)
{
  fcntl(p->fd, F_SETFL, fcntl(p->fd, F_GETFL) | O_NONBLOCK);
  if ((p->tls = hixl__tls_session(p->ctx, p->fd, false)) == NULL)
    return HIXL_ERR_NOMEM;
  p->tls_fd = p->fd;
  for (;;) {
    int r = hixl__tls_handshake(p->tls, addr);
    if (r > 0) {
      /* Done: calling gnutls_handshake again on a TLS 1.3 session would
       * send a KeyUpdate (from the control thread, beside senders). */
      p->tls_ready = true;
      return HIXL_OK;
    }
    if (r < 0)
      return HIXL_ERR_AUTH;
    int ms = (int)((deadline - hixl__now_ns()) / 1000000);
    /* The direction GnuTLS is waiting for (a full socket: output). */
    struct pollfd pfd = {p->fd, hixl__tls_wants_write(p->tls) ? POLLOUT : POLLIN, 0};
    if (ms <= 0 || poll(&pfd, 1, ms) == 0)
      return hixl__err(HIXL_ERR_TIMEOUT,
                       "%s: TLS handshake timed out (does it run with "
                       "HIXL_TLS=1?)",
                       addr);
  }
}

/* What usually causes a failed TCP connect to addr, and what to do about
 * it (issue 17: errors that say what to do). */
static const char *connect_hint(int err, const char *addr)
{
  bool loop = strncmp(addr, "127.", 4) == 0 || strncmp(addr, "[::1]", 5) == 0 ||
              strncmp(addr, "localhost:", 10) == 0;
  switch (err) {
  case ECONNREFUSED:
    return loop ? "nothing listens on that port of this machine: is the target running, and is "
                  "this the address its hixl_ctx_address() gave (the port changes with every run "
                  "unless HIXL_LISTEN fixes it)?  A loopback address reaches this machine only"
                : "nothing listens on that port there: is the target running, and is this the "
                  "address its hixl_ctx_address() gave (the port changes with every run unless "
                  "HIXL_LISTEN fixes it)?";
  case EHOSTUNREACH:
  case ENETUNREACH:
    return "no route to that host: check the address and this machine's routes "
           "(ip route get HOST)";
  case ETIMEDOUT:
    return "no answer: the host is down or unreachable, or a firewall drops the port "
           "(try: nc -vz HOST PORT)";
  default: return "check the address and that the target runs";
  }
}

static hixl_status_t connect_failed(int err, const char *addr)
{
  return hixl__err(err == ETIMEDOUT ? HIXL_ERR_TIMEOUT : HIXL_ERR_PEER_LOST,
                   "cannot connect to %s: %s: %s", addr, strerror(err), connect_hint(err, addr));
}

static hixl_status_t connect_with_deadline(int fd, const struct sockaddr *sa, socklen_t sl,
                                           int64_t deadline, const char *addr, int64_t t0)
{
  if (connect(fd, sa, sl) == 0)
    return HIXL_OK;
  if (errno != EINPROGRESS)
    return connect_failed(errno, addr);
  for (;;) {
    int ms = deadline == INT64_MAX ? -1 : (int)((deadline - hixl__now_ns()) / 1000000);
    if (ms < 0 && deadline != INT64_MAX)
      ms = 0;
    struct pollfd pfd = {fd, POLLOUT, 0};
    int pr = poll(&pfd, 1, ms);
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr == 0)
      return hixl__err(HIXL_ERR_TIMEOUT,
                       "connecting to %s timed out (no answer in %lld ms): %s; or give "
                       "hixl_connect a longer timeout",
                       addr, (long long)((hixl__now_ns() - t0) / 1000000),
                       connect_hint(ETIMEDOUT, addr));
    int err = 0;
    socklen_t el = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err)
      return connect_failed(err, addr);
    return HIXL_OK;
  }
}

static hixl_status_t tcp_connect(const char *addr, int64_t deadline, int *fd_p)
{
  char host[128], port[16];
  hixl_status_t st = hixl__parse_hostport(addr, host, sizeof(host), port, sizeof(port));
  if (st != HIXL_OK)
    return st;
  if (host[0] == 0 || strcmp(port, "0") == 0)
    return hixl__err(HIXL_ERR_INVALID, "cannot connect to \"%s\": need a host and a port", addr);
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
  struct addrinfo *res;
  int rc = getaddrinfo(host, port, &hints, &res);
  if (rc != 0)
    return hixl__err(HIXL_ERR_INVALID, "cannot resolve \"%s\": %s", addr, gai_strerror(rc));
  st = HIXL_ERR_PEER_LOST;
  int64_t t0 = hixl__now_ns();
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
      continue;
    st = connect_with_deadline(fd, ai->ai_addr, ai->ai_addrlen, deadline, addr, t0);
    if (st == HIXL_OK) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      *fd_p = fd;
      break;
    }
    close(fd);
  }
  freeaddrinfo(res);
  return st;
}

/* One connection attempt; *set_up: it set up a lazy transport of ours. */
static hixl_status_t connect_once(hixl_ctx_t *ctx, const char *addr, int64_t deadline, uint64_t tag,
                                  hixl_peer_t **peer_p, bool *set_up)
{
  int fd = -1;
  hixl_status_t st = tcp_connect(addr, deadline, &fd);
  if (st != HIXL_OK)
    return st;
  hixl__set_sock_opts(fd, ctx->cfg.timeout_ms, true);

  hixl_peer_t *p = hixl__peer_new(ctx, fd, false);
  if (p == NULL) {
    close(fd);
    return hixl__err(HIXL_ERR_NOMEM, "no memory for a peer");
  }
  snprintf(p->name, sizeof(p->name), "%s", addr);
  if (ctx->tls && (st = tls_client(p, deadline, addr)) != HIXL_OK)
    goto fail;
  /* The handshake (auth.h): our nonce; the target's nonce and proof, checked
   * before anything of ours goes out; our identity and proof. */
  hixl_msg_t hello = {.type = HIXL_MSG_HELLO}, chal, ack;
  uint8_t nonces[2 * HIXL_AUTH_NONCE], proof[HIXL_AUTH_PROOF];
  hixl__auth_nonce(nonces);
  memcpy(hello.blob, nonces, HIXL_AUTH_NONCE);
  hello.blob_len = HIXL_AUTH_NONCE;
  if ((st = hixl__send(p, &hello, NULL, 0)) != HIXL_OK ||
      (st = hixl__peer_recv_sync(p, &chal, deadline)) != HIXL_OK) {
    if (st == HIXL_ERR_PEER_LOST && !ctx->tls)
      st = hixl__err(st,
                     "%s closed the connection at HELLO: it requires TLS (HIXL_TLS must be the "
                     "same on both sides), or it shed our handshake (we were slow to answer "
                     "while it had HIXL_MAX_HANDSHAKES connections in their handshake, or it "
                     "is out of descriptors: its log says which)",
                     addr);
    goto fail;
  }
  /* Nothing but a challenge: an unproven answer does not get to choose our
   * error or our message. */
  if (chal.type != HIXL_MSG_AUTH_CHALLENGE || chal.blob_len != HIXL_AUTH_NONCE + HIXL_AUTH_PROOF) {
    st = hixl__err(HIXL_ERR_TRANSPORT, "%s answered the handshake with %s", addr,
                   hixl_wire_type_name(chal.type));
    goto fail;
  }
  memcpy(nonces + HIXL_AUTH_NONCE, chal.blob, HIXL_AUTH_NONCE);
  hixl__auth_proof(ctx->cfg.auth_token, HIXL_AUTH_LABEL_TARGET, nonces, nonces + HIXL_AUTH_NONCE,
                   NULL, 0, proof);
  if (!hixl__auth_equal(proof, chal.blob + HIXL_AUTH_NONCE)) {
    /* Never the token itself, nor anything derived from it. */
    bool ours = ctx->cfg.auth_token != NULL && ctx->cfg.auth_token[0] != 0;
    st = hixl__err(HIXL_ERR_AUTH,
                   ours ? "%s did not prove it knows our auth token: it has another one or none "
                          "(set the same HIXL_AUTH_TOKEN / hixl_config_t.auth_token on both "
                          "sides), or it is not the target we meant; nothing more was sent to it"
                        : "%s requires an auth token and we have none: set HIXL_AUTH_TOKEN (or "
                          "hixl_config_t.auth_token) to the target's; nothing more was sent to it",
                   addr);
    goto fail;
  }
  hixl_msg_t auth = {.type = HIXL_MSG_AUTH};
  auth.auth.tp_bits = hixl__tp_offered(ctx); /* what we can do, for the target's choice */
  auth.auth.ctx_id = ctx->id;
  memcpy(auth.host_id, ctx->host_id, 32);
  auth.auth.pid = (uint32_t)getpid();
  auth.auth.tag = tag;
  /* Our preference order, by name. */
  hixl__tp_join(auth.str[0], sizeof(auth.str[0]), ctx->tp_order, ctx->n_tp_order, ~0u);
  uint8_t id[AUTH_IDENTITY_MAX];
  size_t idn = auth_identity(&auth, id);
  hixl__auth_proof(ctx->cfg.auth_token, HIXL_AUTH_LABEL_INITIATOR, nonces, nonces + HIXL_AUTH_NONCE,
                   id, idn, auth.blob);
  auth.blob_len = HIXL_AUTH_PROOF;
  if ((st = hixl__send(p, &auth, NULL, 0)) != HIXL_OK ||
      (st = hixl__peer_recv_sync(p, &ack, deadline)) != HIXL_OK)
    goto fail;
  if (ack.type != HIXL_MSG_HELLO_ACK) {
    st = hixl__err(HIXL_ERR_TRANSPORT, "%s answered the handshake with %s", addr,
                   hixl_wire_type_name(ack.type));
    goto fail;
  }
  if (ack.status != HIXL_OK) {
    st = hixl__err(ack.status < 0 && ack.status >= HIXL_ERR_NO_DEVICE ? ack.status
                                                                      : HIXL_ERR_TRANSPORT,
                   "%s refused the connection: %s%s", addr,
                   ack.str[1][0] ? ack.str[1] : hixl_strerror(ack.status),
                   ack.status == HIXL_ERR_UNSUPPORTED
                       ? ": allow a transport both sides can use (HIXL_TRANSPORTS or "
                         "hixl_config_t.transports, on either side; hixl-info lists what each "
                         "machine can use)"
                       : "");
    goto fail;
  }
  p->remote_ctx_id = ack.hello_ack.ctx_id;
  p->remote_pid = (pid_t)ack.hello_ack.pid;
  if (ack.hello_ack.tp_id == (uint32_t)hixl__tp_loopback()->id) {
    hixl__peer_free(p);
    hixl_peer_t *self = hixl__self_peer(ctx);
    if (self == NULL)
      return hixl__err(HIXL_ERR_NOMEM, "no memory for a self peer");
    *peer_p = self;
    return HIXL_OK;
  }
  const hixl_transport_ops_t *ops = NULL;
  for (size_t t = 0; t < hixl__n_transports; t++)
    if ((uint32_t)hixl__transports[t]->id == ack.hello_ack.tp_id)
      ops = hixl__transports[t];
  /* Offered, not just allowed: a target may name a transport that is built
   * and configured here but has no device (its context state is NULL). */
  if (ops == NULL || !(hixl__tp_offered(ctx) & (1u << ack.hello_ack.tp_id))) {
    st = hixl__err(HIXL_ERR_UNSUPPORTED,
                   "%s chose transport %u, which we did not offer (we offered %s)", addr,
                   ack.hello_ack.tp_id, ctx->tp_names);
    goto fail;
  }
  /* A lazy transport's first peer: set it up now (the target has). */
  *set_up = !(atomic_load(&ctx->tp_ready) & (1u << ops->id));
  if ((st = hixl__tp_need(ctx, ops)) != HIXL_OK) {
    st = hixl__err(st, "connecting to %s: %s", addr, hixl_last_error());
    goto fail;
  }
  p->ops = ops;
  if ((st = ops->connect(p, &ack, deadline)) != HIXL_OK) {
    p->ops = NULL;
    goto fail;
  }
  if (p->tls && p->fd != p->tls_fd) { /* shm moved to its unix socket */
    hixl__tls_free(p->tls);
    p->tls = NULL;
  }
  pthread_mutex_lock(&ctx->lock);
  if (!hixl__peer_link_locked(ctx, p)) {
    pthread_mutex_unlock(&ctx->lock);
    st = hixl__err(HIXL_ERR_NOMEM, "connecting to %s: no memory for the peer", addr);
    goto fail;
  }
  atomic_store(&p->state, HIXL_PEER_UP);
  atomic_fetch_add_explicit(&ctx->cnt.connects, 1, memory_order_relaxed);
  p->last_rx_ns = hixl__now_ns();
  pthread_mutex_lock(&p->send_lock);
  p->polled = true;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = p};
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, p->fd, &ev);
  pthread_mutex_unlock(&p->send_lock);
  hixl__probe_locked(p, hixl__now_ns()); /* the round trip, for the stats */
  pthread_mutex_unlock(&ctx->lock);
  /* Its notifications may have come already (the target can notify once
   * it has bound), while a waiter of ours looked at a peer list without
   * it: that waiter looks again. */
  hixl__wake_waiters(ctx);
  hixl_info("connected to %s over %s", addr, ops->name);
  *peer_p = p;
  return HIXL_OK;
fail:
  hixl__peer_free(p);
  return st;
}

hixl_status_t hixl__connect_tagged(hixl_ctx_t *ctx, const char *addr, int timeout_ms, uint64_t tag,
                                   hixl_peer_t **peer_p)
{
  if (ctx == NULL || addr == NULL || peer_p == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_connect: NULL %s",
                     ctx == NULL    ? "ctx"
                     : addr == NULL ? "addr"
                                    : "peer_p");
  int64_t deadline = hixl__deadline(timeout_ms);
  bool set_up = false;
  hixl_status_t st = connect_once(ctx, addr, deadline, tag, peer_p, &set_up);
  /* Our first peer over a lazy transport sets it up between the target's
   * answer and our transport's connect: 0.3-0.6 s, seconds on a loaded
   * machine, which the target counts against its handshake deadline (from
   * its accept, so that trickling bytes buys nothing: its liveness period)
   * and may drop us for.  Then once more, now quick (docs/scale.md). */
  if (st == HIXL_ERR_PEER_LOST && set_up && !hixl__expired(deadline)) {
    hixl_info("connecting to %s: %s (while we set up our transport); once more", addr,
              hixl_last_error());
    set_up = false;
    st = connect_once(ctx, addr, deadline, tag, peer_p, &set_up);
  }
  return st;
}

hixl_status_t hixl_connect(hixl_ctx_t *ctx, const char *addr, int timeout_ms, hixl_peer_t **peer_p)
{
  return hixl__connect_tagged(ctx, addr, timeout_ms, 0, peer_p);
}

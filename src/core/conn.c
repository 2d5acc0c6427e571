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
#include "core.h"
#include "tls.h"

#define RX_CAP (HIXL_WIRE_HDR + HIXL_WIRE_MAX)
/* How long a lost peer keeps its mappings: far longer than any copy that
 * started before the loss was seen. */
#define RELEASE_GRACE_NS(ctx) ((int64_t)(ctx)->cfg.timeout_ms * 2000000 + 1000000000LL)

int hixl__ctx_timeout(const hixl_ctx_t *ctx) { return ctx->cfg.timeout_ms; }

void hixl__wake(hixl_ctx_t *ctx)
{
  uint64_t one = 1;
  ssize_t r = write(ctx->wake_fd, &one, sizeof(one));
  (void)r; /* a full eventfd already wakes the thread */
}

static hixl_peer_t *peer_new(hixl_ctx_t *ctx, int fd, bool inbound)
{
  hixl_peer_t *p = calloc(1, sizeof(*p));
  if (p == NULL)
    return NULL;
  p->magic = HIXL_MAGIC_PEER;
  p->ctx = ctx;
  p->fd = fd;
  p->tls_fd = -1;
  p->inbound = inbound;
  atomic_init(&p->state, HIXL_PEER_CONNECTING);
  pthread_mutex_init(&p->send_lock, NULL);
  p->last_rx_ns = hixl__now_ns();
  p->born_ns = p->last_rx_ns;
  atomic_init(&p->last_tx_ns, p->last_rx_ns);
  return p;
}

/* A control message waiting in a peer's output queue. */
typedef struct hixl_outmsg {
  struct hixl_outmsg *next;
  size_t len, off; /* bytes, and how many went out */
  int fds[2];      /* our duplicates: they go with the first byte */
  int nfds;
  uint8_t bytes[];
} hixl_outmsg_t;

/* Drop what is queued for p (its socket is going away).  send_lock held. */
static void outq_clear(hixl_peer_t *p)
{
  while (p->oq_head) {
    hixl_outmsg_t *q = p->oq_head;
    p->oq_head = q->next;
    for (int i = 0; i < q->nfds; i++)
      close(q->fds[i]);
    free(q);
  }
  p->oq_tail = NULL;
  p->oq_bytes = 0;
}

void hixl__peer_free(hixl_peer_t *p)
{
  outq_clear(p);
  hixl__tls_free(p->tls);
  if (p->ops)
    p->ops->peer_close(p);
  for (int i = 0; i < p->n_rx_fds; i++)
    close(p->rx_fds[i]);
  if (p->fd >= 0)
    close(p->fd);
  free(p->rx);
  pthread_mutex_destroy(&p->send_lock);
  p->magic = HIXL_MAGIC_DEAD;
  free(p);
}

void hixl__peer_lost_async(hixl_peer_t *p, const char *why)
{
  int up = HIXL_PEER_UP;
  if (atomic_compare_exchange_strong(&p->state, &up, HIXL_PEER_LOST)) {
    hixl_info("peer %s lost: %s", p->name, why);
    hixl__wake(p->ctx);         /* the control thread fails its pending calls */
    hixl__wake_waiters(p->ctx); /* waits on this peer end */
  }
}

/* Fail every control call waiting on p; ctx->lock held. */
static void fail_pending_locked(hixl_peer_t *p)
{
  hixl_pending_t *pd = p->pending;
  p->pending = NULL;
  while (pd) {
    hixl_pending_t *next = pd->next;
    pd->status = HIXL_ERR_PEER_LOST;
    pd->done = true;
    if (pd->req) {
      hixl__req_complete(pd->req, HIXL_ERR_PEER_LOST, 0);
      free(pd);
    }
    pd = next;
  }
  pthread_cond_broadcast(&p->ctx->cond);
}

void hixl__peer_fail_locked(hixl_peer_t *p, int state, const char *why)
{
  int old = atomic_load(&p->state);
  if (old == HIXL_PEER_LOST || old == HIXL_PEER_CLOSED)
    return;
  atomic_store(&p->state, state);
  p->lost_ns = hixl__now_ns();
  if (!p->unix_pending && old == HIXL_PEER_UP)
    hixl_info("peer %s %s: %s", p->name, state == HIXL_PEER_LOST ? "lost" : "closed", why);
  fail_pending_locked(p);
  /* Let the transport fail what is in flight now, not when its own retries
   * run out (verbs: the QPs go to ERROR and flush). */
  if (old == HIXL_PEER_UP && p->ops && p->ops->peer_lost)
    p->ops->peer_lost(p);
  hixl__wake(p->ctx);
  hixl__wake_waiters(p->ctx); /* waits on this peer end */
}

/* ------------------------------------------------------------- sending */

/* Put bytes (with fds on the first) on a socket.  Returns how many went
 * (0: the socket is full, non-blocking only) or -errno. */
static ssize_t send_some(int fd, const uint8_t *b, size_t len, const int *fds, int nfds, bool block)
{
  union {
    char buf[CMSG_SPACE(sizeof(int) * 4)];
    struct cmsghdr align;
  } cm;
  struct iovec iov = {(void *)b, len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    memset(&cm, 0, sizeof(cm));
    mh.msg_control = cm.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  for (;;) {
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | (block ? 0 : MSG_DONTWAIT));
    if (n >= 0)
      return n;
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return block ? -ETIMEDOUT : 0; /* blocking: SO_SNDTIMEO ran out */
    return -errno;
  }
}

/* send_some on p's socket, through TLS while p has it (no fds there: TCP).
 * Blocking: until the socket takes it or SO_SNDTIMEO / timeout_ms. */
static ssize_t peer_send_some(hixl_peer_t *p, const uint8_t *b, size_t len, const int *fds,
                              int nfds, bool block)
{
  if (p->tls == NULL || p->fd != p->tls_fd)
    return send_some(p->fd, b, len, fds, nfds, block);
  int64_t deadline = hixl__deadline(p->ctx->cfg.timeout_ms);
  for (;;) {
    ssize_t n = hixl__tls_send(p->tls, b, len);
    if (n > 0)
      return n;
    if (n < 0)
      return -EPROTO;
    if (!block)
      return 0; /* GnuTLS holds the record: the retry passes the same bytes */
    int ms = (int)((deadline - hixl__now_ns()) / 1000000);
    struct pollfd pfd = {p->fd, POLLOUT, 0};
    if (ms <= 0 || (poll(&pfd, 1, ms) == 0))
      return -ETIMEDOUT;
  }
}

static void outq_arm(hixl_peer_t *p, bool out)
{
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (out ? EPOLLOUT : 0u), .data.ptr = p};
  epoll_ctl(p->ctx->epoll_fd, EPOLL_CTL_MOD, p->fd, &ev);
}

/* Send what the queue holds until the socket is full.  send_lock held. */
static hixl_status_t outq_flush(hixl_peer_t *p)
{
  while (p->oq_head) {
    hixl_outmsg_t *q = p->oq_head;
    ssize_t n = peer_send_some(p, q->bytes + q->off, q->len - q->off, q->off ? NULL : q->fds,
                               q->off ? 0 : q->nfds, false);
    if (n < 0) {
      hixl__peer_lost_async(p, "its control connection failed");
      return hixl__err(HIXL_ERR_PEER_LOST, "peer %s: sending failed: %s", p->name,
                       strerror((int)-n));
    }
    if (n == 0)
      return HIXL_OK; /* full: EPOLLOUT brings us back */
    q->off += (size_t)n;
    p->oq_bytes -= (size_t)n;
    p->oq_progress_ns = hixl__now_ns();
    if (q->off < q->len)
      continue;
    p->oq_head = q->next;
    if (p->oq_head == NULL)
      p->oq_tail = NULL;
    for (int i = 0; i < q->nfds; i++)
      close(q->fds[i]);
    free(q);
  }
  outq_arm(p, false);
  return HIXL_OK;
}

/* Queue the rest of a message.  send_lock held; p is polled. */
static hixl_status_t outq_add(hixl_peer_t *p, const uint8_t *b, size_t len, const int *fds,
                              int nfds, const char *type)
{
  if (p->oq_bytes + len > p->ctx->max_outq) {
    hixl__peer_lost_async(p, "it does not read its control connection");
    return hixl__err(HIXL_ERR_PEER_LOST,
                     "peer %s does not read its control connection: %zu bytes wait for it "
                     "(HIXL_MAX_PEER_QUEUE); %s not sent, peer dropped",
                     p->name, p->oq_bytes, type);
  }
  hixl_outmsg_t *q = malloc(sizeof(*q) + len);
  if (q == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "peer %s: no memory to queue %s", p->name, type);
  q->next = NULL;
  q->len = len;
  q->off = 0;
  q->nfds = 0;
  memcpy(q->bytes, b, len);
  for (int i = 0; i < nfds; i++) {
    if ((q->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0)) < 0) {
      int e = errno;
      for (int j = 0; j < i; j++)
        close(q->fds[j]);
      free(q);
      return hixl__err(HIXL_ERR_NOMEM, "peer %s: cannot queue %s: %s", p->name, type, strerror(e));
    }
    q->nfds++;
  }
  if (p->oq_tail)
    p->oq_tail->next = q;
  else {
    p->oq_head = q;
    p->oq_progress_ns = hixl__now_ns();
    outq_arm(p, true);
  }
  p->oq_tail = q;
  p->oq_bytes += len;
  return HIXL_OK;
}

/* Send a control message.  Never blocks on a connected peer: what the
 * socket does not take at once waits in the peer's queue (above), so
 * neither the control thread (replies, heartbeats) nor a caller is held by
 * a peer that does not read.  Before the peer is polled (the initiator's
 * handshake) it blocks, bounded by SO_SNDTIMEO. */
hixl_status_t hixl__send(hixl_peer_t *peer, hixl_msg_t *m, const int *fds, int nfds)
{
  uint8_t buf[RX_CAP];
  m->nfds = (uint16_t)nfds;
  size_t len = hixl_wire_encode(m, buf, sizeof(buf));
  if (len == 0)
    return hixl__err(HIXL_ERR_INVALID, "control message %s does not encode",
                     hixl_wire_type_name(m->type));
  const char *type = hixl_wire_type_name(m->type);
  pthread_mutex_lock(&peer->send_lock);
  hixl_status_t st = HIXL_OK;
  size_t off = 0;
  if (peer->fd < 0) {
    st = hixl__err(HIXL_ERR_PEER_LOST, "peer %s: sending %s failed: not connected", peer->name,
                   type);
    goto out;
  }
  if (peer->oq_head && (st = outq_flush(peer)) != HIXL_OK)
    goto out;
  if (peer->oq_head == NULL) {
    while (off < len) {
      ssize_t n = peer_send_some(peer, buf + off, len - off, off ? NULL : fds, off ? 0 : nfds,
                                 !peer->polled);
      if (n < 0) {
        st = hixl__err(HIXL_ERR_PEER_LOST, "peer %s: sending %s failed: %s", peer->name, type,
                       strerror((int)-n));
        goto out;
      }
      if (n == 0)
        break;
      off += (size_t)n;
    }
  }
  if (off < len)
    st = outq_add(peer, buf + off, len - off, off ? NULL : fds, off ? 0 : nfds, type);
out:
  atomic_store_explicit(&peer->last_tx_ns, hixl__now_ns(), memory_order_relaxed);
  pthread_mutex_unlock(&peer->send_lock);
  return st;
}

/* The control thread: p's socket can take more. */
static void peer_writable(hixl_peer_t *p)
{
  pthread_mutex_lock(&p->send_lock);
  if (p->fd >= 0)
    outq_flush(p);
  pthread_mutex_unlock(&p->send_lock);
}

static void pending_unlink_locked(hixl_peer_t *peer, hixl_pending_t *pd)
{
  for (hixl_pending_t **pp = &peer->pending; *pp; pp = &(*pp)->next)
    if (*pp == pd) {
      *pp = pd->next;
      return;
    }
}

static void cond_wait_until(hixl_ctx_t *ctx, int64_t deadline)
{
  /* Wake at least every 100 ms: cheap insurance against a missed signal. */
  int64_t now = hixl__now_ns();
  int64_t until = now + 100000000;
  if (deadline < until)
    until = deadline;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (until - now);
  ts.tv_sec = t / 1000000000;
  ts.tv_nsec = t % 1000000000;
  pthread_cond_timedwait(&ctx->cond, &ctx->lock, &ts);
}

/* An inbound peer can reach the user (its first notification) a moment
 * before its handshake's last message is on the wire and it is marked UP:
 * wait for that, within deadline.  ctx->lock held. */
static void await_up_locked(hixl_peer_t *peer, int64_t deadline)
{
  while (atomic_load(&peer->state) == HIXL_PEER_CONNECTING && peer->inbound &&
         hixl__now_ns() < deadline)
    cond_wait_until(peer->ctx, deadline);
}

bool hixl__peer_await_up(hixl_peer_t *peer, int64_t deadline)
{
  pthread_mutex_lock(&peer->ctx->lock);
  await_up_locked(peer, deadline);
  pthread_mutex_unlock(&peer->ctx->lock);
  return atomic_load(&peer->state) == HIXL_PEER_UP;
}

hixl_status_t hixl__call(hixl_peer_t *peer, hixl_msg_t *m, uint16_t reply_type, hixl_msg_t *reply,
                         int *fd_p, int64_t deadline)
{
  hixl_ctx_t *ctx = peer->ctx;
  hixl_pending_t pd = {.reply_type = reply_type, .reply = reply, .fd = -1};
  pthread_mutex_lock(&ctx->lock);
  await_up_locked(peer, deadline);
  if (atomic_load(&peer->state) != HIXL_PEER_UP) {
    pthread_mutex_unlock(&ctx->lock);
    return hixl__err(HIXL_ERR_PEER_LOST, "peer %s is not connected", peer->name);
  }
  pd.seq = ++peer->next_seq;
  m->seq = pd.seq;
  pd.next = peer->pending;
  peer->pending = &pd;
  pthread_mutex_unlock(&ctx->lock);

  hixl_status_t st = hixl__send(peer, m, NULL, 0);
  pthread_mutex_lock(&ctx->lock);
  if (st == HIXL_OK) {
    while (!pd.done && !hixl__expired(deadline))
      cond_wait_until(ctx, deadline);
    if (!pd.done)
      st = hixl__err(HIXL_ERR_TIMEOUT, "peer %s: no reply to %s in time", peer->name,
                     hixl_wire_type_name(m->type));
    else if (pd.status == HIXL_ERR_PEER_LOST)
      st = hixl__err(HIXL_ERR_PEER_LOST, "peer %s lost while waiting for %s", peer->name,
                     hixl_wire_type_name(reply_type));
    else
      st = pd.status;
  }
  if (!pd.done)
    pending_unlink_locked(peer, &pd);
  pthread_mutex_unlock(&ctx->lock);
  if (st == HIXL_OK && fd_p)
    *fd_p = pd.fd;
  else if (pd.fd >= 0)
    close(pd.fd);
  return st;
}

hixl_status_t hixl__call_async(hixl_peer_t *peer, hixl_msg_t *m, uint16_t reply_type,
                               hixl_req_t *req)
{
  hixl_ctx_t *ctx = peer->ctx;
  hixl_pending_t *pd = calloc(1, sizeof(*pd));
  if (pd == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "no memory for a pending call");
  pd->reply_type = reply_type;
  pd->req = req;
  pd->fd = -1;
  pthread_mutex_lock(&ctx->lock);
  if (atomic_load(&peer->state) != HIXL_PEER_UP) {
    pthread_mutex_unlock(&ctx->lock);
    free(pd);
    return hixl__err(HIXL_ERR_PEER_LOST, "peer %s is not connected", peer->name);
  }
  pd->seq = ++peer->next_seq;
  m->seq = pd->seq;
  /* Append: replies come back in order, so the list stays FIFO. */
  hixl_pending_t **pp = &peer->pending;
  while (*pp)
    pp = &(*pp)->next;
  *pp = pd;
  req->counted = true;
  atomic_fetch_add(&peer->issued, 1);
  pthread_mutex_unlock(&ctx->lock);
  hixl_status_t st = hixl__send(peer, m, NULL, 0);
  if (st != HIXL_OK) {
    /* The request is issued: fail it through the normal path. */
    pthread_mutex_lock(&ctx->lock);
    hixl__peer_fail_locked(peer, HIXL_PEER_LOST, hixl_last_error());
    pthread_mutex_unlock(&ctx->lock);
  }
  return HIXL_INPROGRESS;
}

/* ------------------------------------------------------------ receiving */

/* A protocol violation: drop the connection (never trust the rest). */
static void proto_error_locked(hixl_peer_t *p, const char *what, unsigned type)
{
  hixl_warn("peer %s: protocol error: %s (%s); dropping it", p->name, what,
            hixl_wire_type_name(type));
  hixl__peer_fail_locked(p, HIXL_PEER_LOST, "protocol error");
}

/* "shm,verbs" for a bit set of HIXL_TP_* (a buffer of the calling thread). */
static const char *tp_list(uint32_t bits)
{
  static __thread char buf[64];
  return hixl__tp_join(buf, sizeof(buf), NULL, 0, bits);
}

static const hixl_transport_ops_t *pick_transport_locked(hixl_ctx_t *ctx, const hixl_msg_t *hello)
{
  uint8_t order[HIXL_TP_COUNT];
  int n;
  uint32_t mask;
  if (hixl__parse_transports(hello->str[0], order, &n, &mask) != HIXL_OK)
    return NULL;
  for (int i = 0; i < n; i++) {
    if (!(ctx->tp_allowed & (1u << order[i])))
      continue;
    for (size_t t = 0; t < hixl__n_transports; t++) {
      const hixl_transport_ops_t *ops = hixl__transports[t];
      if (ops->id == order[i] && ops->id != HIXL_TP_SELF && (ctx->tp_ready & (1u << ops->id)) &&
          (hello->u32[0] & (1u << ops->id)) && ops->usable(ctx, hello))
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
    buf[n++] = (uint8_t)(m->u32[0] >> (8 * i));
  for (int i = 0; i < 8; i++)
    buf[n++] = (uint8_t)(m->u64[0] >> (8 * i));
  memcpy(buf + n, m->host_id, 32);
  n += 32;
  for (int i = 0; i < 4; i++)
    buf[n++] = (uint8_t)(m->u32[1] >> (8 * i));
  for (int i = 0; i < 8; i++)
    buf[n++] = (uint8_t)(m->u64[1] >> (8 * i));
  size_t sl = strnlen(m->str[0], HIXL_WIRE_STR - 1);
  memcpy(buf + n, m->str[0], sl);
  n += sl;
  buf[n++] = 0;
  return n;
}
#define AUTH_IDENTITY_MAX (4 + 8 + 32 + 4 + 8 + HIXL_WIRE_STR)

/* Target side of HELLO: answer with our nonce and our proof.  Nothing about
 * us goes out before the initiator has proved it knows the token. */
static void handle_hello_locked(hixl_peer_t *p, const hixl_msg_t *m, hixl_msg_t *out)
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
static void handle_auth_locked(hixl_peer_t *p, const hixl_msg_t *m, hixl_msg_t *ack)
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
  ack->u64[0] = ctx->id;
  memcpy(ack->host_id, ctx->host_id, 32);
  ack->u32[1] = (uint32_t)getpid();
  p->remote_ctx_id = m->u64[0];
  p->remote_pid = (pid_t)m->u32[1];
  p->tag = m->u64[1];
  if (m->u64[0] == ctx->id) {
    /* Our own context: the initiator makes a self peer; this connection
     * only carried the handshake. */
    ack->u32[0] = HIXL_TP_SELF;
    p->unix_pending = true; /* not a user-visible peer: free it at EOF */
    return;
  }
  /* Every authenticated inbound peer costs memory (shm: an inbox ring, the
   * mapped table; verbs: QPs): without a token anyone authenticates, so the
   * number is capped (HIXL_MAX_PEERS). */
  int n_in = 0;
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
  const hixl_transport_ops_t *ops = pick_transport_locked(ctx, m);
  if (ops == NULL) {
    ack->status = HIXL_ERR_UNSUPPORTED;
    bool same_host = memcmp(ctx->host_id, m->host_id, sizeof(ctx->host_id)) == 0;
    snprintf(ack->str[1], sizeof(ack->str[1]),
             "no common transport (initiator allows \"%s\" and can use \"%s\"; %s host; here "
             "\"%s\" is usable)",
             m->str[0][0] ? m->str[0] : "all", tp_list(m->u32[0]), same_host ? "same" : "different",
             ctx->tp_names);
    return;
  }
  ack->u32[0] = (uint32_t)ops->id;
  p->ops = ops;
  p->cookie = hixl__random64();
  ack->u64[1] = p->cookie;
  snprintf(ack->str[0], sizeof(ack->str[0]), "%s", ctx->unix_name + 1);
  snprintf(p->name, sizeof(p->name), "inbound#%u(pid %d)", ++ctx->n_inbound, (int)p->remote_pid);
}

/* Target side of SHM_BIND, arriving on an accepted unix connection u: find
 * the inbound peer it binds and move the connection over to it. */
static hixl_peer_t *handle_bind_locked(hixl_peer_t *u, const hixl_msg_t *m, int *fds, int nfds,
                                       hixl_msg_t *ack, int *out_fds, int *n_out)
{
  hixl_ctx_t *ctx = u->ctx;
  hixl_peer_t *p;
  for (p = ctx->peers; p; p = p->next)
    if (p->inbound && !p->unix_pending && atomic_load(&p->state) == HIXL_PEER_CONNECTING &&
        p->cookie == m->u64[0] && p->remote_ctx_id == m->u64[1] && p->ops == &hixl__shm_ops)
      break;
  memset(ack, 0, sizeof(*ack));
  ack->type = HIXL_MSG_SHM_BIND_ACK;
  if (p == NULL) {
    ack->status = HIXL_ERR_AUTH;
    return NULL;
  }
  /* Who is really at the other end (SO_PEERCRED): its pid for CMA, its uid
   * against the policy -- never what its HELLO claimed. */
  hixl_status_t st = hixl__shm_bind_cred(p, u->fd);
  if (st == HIXL_OK)
    st = hixl__shm_accept(p, fds, nfds, out_fds, n_out);
  ack->status = st;
  if (st != HIXL_OK)
    return NULL;
  /* Swap sockets: the TCP one has done its job (with anything still queued
   * for it). */
  pthread_mutex_lock(&p->send_lock);
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_DEL, p->fd, NULL);
  close(p->fd);
  outq_clear(p);
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

static void complete_pending_locked(hixl_peer_t *p, hixl_msg_t *m, int fd)
{
  hixl_pending_t *pd;
  for (pd = p->pending; pd; pd = pd->next)
    if (pd->seq == m->seq)
      break;
  if (pd == NULL || pd->reply_type != m->type) {
    /* A reply nobody waits for: the caller timed out.  Not an error. */
    if (fd >= 0)
      close(fd);
    return;
  }
  pending_unlink_locked(p, pd);
  if (pd->req) {
    hixl__req_complete(pd->req, m->status, m->u64[0]);
    free(pd);
    if (fd >= 0)
      close(fd);
    return;
  }
  *pd->reply = *m;
  pd->fd = fd;
  pd->status = m->status;
  pd->done = true;
  pthread_cond_broadcast(&p->ctx->cond);
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
    if (p->unix_pending && m->type == HIXL_MSG_SHM_BIND && m->nfds == 3) {
      hixl_peer_t *bound = handle_bind_locked(p, m, fds, 3, out, out_fds, n_out);
      if (bound) {
        /* UP only once the ACK is on the wire (peer_readable): nothing of
         * ours may reach the initiator before it. */
        *reply_to = bound;
      } else {
        hixl_warn("unix connection with an unknown or failed SHM_BIND: dropping it");
        for (int i = 0; i < m->nfds; i++)
          close(fds[i]);
      }
      return;
    }
    if (!p->unix_pending && p->ops && p->ops->needs_bind && p->ops->bind_type &&
        m->type == p->ops->bind_type && m->nfds == 0) {
      /* An in-band bind (verbs, fabric): the transport answers. */
      p->ops->accept(p, m, out);
      if (out->type == 0)
        proto_error_locked(p, "bind refused", m->type);
      return;
    }
    if (!p->unix_pending && p->hs_stage == 0 && m->type == HIXL_MSG_HELLO && m->nfds == 0 &&
        m->blob_len == HIXL_AUTH_NONCE) {
      handle_hello_locked(p, m, out);
      return;
    }
    if (!p->unix_pending && p->hs_stage == 1 && m->type == HIXL_MSG_AUTH && m->nfds == 0) {
      handle_auth_locked(p, m, out);
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
  /* Only FD_REPLY, DEV_IPC_REPLY and SHM_STAGE_REPLY may carry an fd once
   * connected. */
  if (m->nfds > (m->type == HIXL_MSG_FD_REPLY || m->type == HIXL_MSG_DEV_IPC_REPLY ||
                         m->type == HIXL_MSG_SHM_STAGE_REPLY
                     ? 1
                     : 0)) {
    for (int i = 0; i < m->nfds; i++)
      close(fds[i]);
    proto_error_locked(p, "unexpected file descriptors", m->type);
    return;
  }
  switch (m->type) {
  case HIXL_MSG_HEARTBEAT:
    if (m->u32[0] & 1) { /* a probe: the peer's timeout is shorter than our pace */
      hixl_msg_t hb = {.type = HIXL_MSG_HEARTBEAT};
      hixl__send(p, &hb, NULL, 0);
    }
    return;
  case HIXL_MSG_BYE: hixl__peer_fail_locked(p, HIXL_PEER_CLOSED, "peer disconnected"); return;
  case HIXL_MSG_LOOKUP_REPLY:
  case HIXL_MSG_FD_REPLY:
  case HIXL_MSG_DEV_IPC_REPLY:
  case HIXL_MSG_ATOMIC_REPLY:
  case HIXL_MSG_VERBS_MR_REPLY:
  case HIXL_MSG_FABRIC_MR_REPLY:
  case HIXL_MSG_REGION_GONE_ACK:
  case HIXL_MSG_SHM_STAGE_REPLY: complete_pending_locked(p, m, fd); return;
  case HIXL_MSG_SHM_STAGE_REQ:
    /* shm without CMA: the owner-side copies (src/shm/stage.c). */
    hixl__shm_stage_serve(p, m, out, out_fds, n_out);
    return;
  case HIXL_MSG_SHM_COPY:
    hixl__shm_copy_serve(p, m); /* no reply: the outcome is in the staging header */
    return;
  case HIXL_MSG_LOOKUP:
  case HIXL_MSG_FD_REQ:
  case HIXL_MSG_DEV_IPC_REQ:
  case HIXL_MSG_ATOMIC:
  case HIXL_MSG_VERBS_MR:
  case HIXL_MSG_FABRIC_MR: hixl__serve(p, m, out, out_fds, n_out); return;
  case HIXL_MSG_REGION_GONE:
    /* Peers without the owner's shared table (verbs) learn it this way. */
    for (hixl_rmr_t *r = p->rmrs; r; r = r->next)
      if (r->slot == m->u32[0] && r->rkey == m->u64[0])
        atomic_store(&r->gone, true);
    /* Acknowledged: the owner's hixl_mr_dereg returns only after this, so
     * an operation we issue after it fails cleanly here. */
    memset(out, 0, sizeof(*out));
    out->type = HIXL_MSG_REGION_GONE_ACK;
    out->status = HIXL_OK;
    return;
  case HIXL_MSG_WORLD_BARRIER:
    if (m->u64[1] > p->barrier_epoch)
      p->barrier_epoch = m->u64[1];
    pthread_cond_broadcast(&ctx->cond);
    return;
  case HIXL_MSG_WORLD_XCHG:
    if (m->blob_len > sizeof(p->xchg_blob)) {
      proto_error_locked(p, "exchange blob too long", m->type);
      return;
    }
    memcpy(p->xchg_blob, m->blob, m->blob_len);
    p->xchg_len = m->blob_len;
    p->xchg_epoch = m->u64[1];
    pthread_cond_broadcast(&ctx->cond);
    return;
  default: proto_error_locked(p, "unexpected message", m->type); return;
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
        proto_error_locked(p, "message announces fds that did not arrive", m.type);
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
      int out_fds[4], n_out = 0;
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
         * (shm after SHM_BIND; a transport that needs no bind after HELLO). */
        bool done = (out.type == HIXL_MSG_SHM_BIND_ACK ||
                     (reply_to->ops && reply_to->ops->bind_reply_type &&
                      out.type == reply_to->ops->bind_reply_type) ||
                     (out.type == HIXL_MSG_HELLO_ACK && reply_to->ops &&
                      !reply_to->ops->needs_bind && !reply_to->unix_pending)) &&
                    out.status == HIXL_OK;
        if (done && sst == HIXL_OK && atomic_load(&reply_to->state) == HIXL_PEER_CONNECTING) {
          atomic_store(&reply_to->state, HIXL_PEER_UP);
          pthread_cond_broadcast(&ctx->cond);
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

static void set_sock_opts(int fd, int timeout_ms, bool tcp)
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
  outq_clear(p);
  hixl__tls_free(p->tls); /* no sender can use it: fd is -1 under send_lock */
  p->tls = NULL;
  pthread_mutex_unlock(&p->send_lock);
}

/* The inbound connection longest in its handshake (not authenticated
 * yet), and how many there are.  ctx->lock held. */
static hixl_peer_t *oldest_handshake_locked(hixl_ctx_t *ctx, int *n_p)
{
  hixl_peer_t *old = NULL;
  int n = 0;
  for (hixl_peer_t *p = ctx->peers; p; p = p->next)
    if (p->inbound && p->fd >= 0 && atomic_load(&p->state) == HIXL_PEER_CONNECTING &&
        p->ops == NULL && p->hs_stage < 2) {
      n++;
      if (old == NULL || p->born_ns < old->born_ns)
        old = p;
    }
  *n_p = n;
  return old;
}

/* Out of descriptors: a listener stays readable while accept fails, and
 * epoll would wake us for it forever (a control thread at 100% of a CPU,
 * refusing everyone).  Shed the oldest connection still in its handshake
 * (its descriptor frees at once) and take the listeners out of epoll for a
 * moment -- longer when there was nothing to shed. */
static void out_of_fds(hixl_ctx_t *ctx, int err)
{
  int64_t now = hixl__now_ns();
  pthread_mutex_lock(&ctx->lock);
  int n;
  hixl_peer_t *old = oldest_handshake_locked(ctx, &n);
  if (old) {
    hixl__peer_fail_locked(old, HIXL_PEER_LOST, "shed: out of file descriptors");
    close_sock_locked(ctx, old);
  }
  pthread_mutex_unlock(&ctx->lock);
  if (now - ctx->emfile_warned_ns > 1000000000) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    hixl_warn("accept: %s (RLIMIT_NOFILE %llu; raise it with ulimit -n): %s", strerror(err),
              (unsigned long long)rl.rlim_cur,
              old ? "shedding the oldest connections still in their handshake"
                  : "pausing new connections");
    ctx->emfile_warned_ns = now;
  }
  ctx->accept_paused_until = now + (old ? 10 : 100) * 1000000ll;
  if (!(ctx->accept_paused & 1) && ctx->listen_fd >= 0 &&
      epoll_ctl(ctx->epoll_fd, EPOLL_CTL_DEL, ctx->listen_fd, NULL) == 0)
    ctx->accept_paused |= 1;
  if (!(ctx->accept_paused & 2) && ctx->unix_fd >= 0 &&
      epoll_ctl(ctx->epoll_fd, EPOLL_CTL_DEL, ctx->unix_fd, NULL) == 0)
    ctx->accept_paused |= 2;
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
}

static void accept_all(hixl_ctx_t *ctx, int lfd, bool is_unix)
{
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE)
        out_of_fds(ctx, errno);
      return;
    }
    set_sock_opts(fd, ctx->cfg.timeout_ms, !is_unix);
    pthread_mutex_lock(&ctx->lock);
    /* A cap on connections not authenticated yet: the oldest goes. */
    int n;
    hixl_peer_t *old = oldest_handshake_locked(ctx, &n);
    if (old && n >= ctx->max_handshakes) {
      hixl__peer_fail_locked(old, HIXL_PEER_LOST,
                             "shed: too many connections in their "
                             "handshake (HIXL_MAX_HANDSHAKES)");
      close_sock_locked(ctx, old);
    }
    hixl_peer_t *p = peer_new(ctx, fd, true);
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
    p->next = ctx->peers;
    ctx->peers = p;
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

/* Close sockets of failed peers; free connections nobody can see.  Also
 * heartbeats.  Control thread, ctx->lock held. */
static void housekeeping_locked(hixl_ctx_t *ctx, int64_t now)
{
  int64_t timeout_ns = (int64_t)liveness_ms(ctx) * 1000000;
  int64_t hb_ns = timeout_ns / 4;
  hixl_peer_t **pp = &ctx->peers;
  while (*pp) {
    hixl_peer_t *p = *pp;
    int st = atomic_load(&p->state);
    bool stalled = false;
    if (st == HIXL_PEER_UP && !p->self) {
      /* Messages queued for it and none taken for the liveness period: it
       * is alive enough to send but does not read (or is wedged). */
      pthread_mutex_lock(&p->send_lock);
      stalled = p->oq_head && now - p->oq_progress_ns > timeout_ns;
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
        bool probe = now - p->last_rx_ns > timeout_ns / 2;
        if (now - atomic_load_explicit(&p->last_tx_ns, memory_order_relaxed) >
            (probe ? hb_ns / 2 : hb_ns)) {
          hixl_msg_t hb = {.type = HIXL_MSG_HEARTBEAT};
          hb.u32[0] = probe;
          hixl__send(p, &hb, NULL, 0);
        }
      }
    } else if (st == HIXL_PEER_CONNECTING && p->inbound && now - p->born_ns > timeout_ns) {
      /* From the accept, not the last byte: trickling bytes buys nothing. */
      hixl__peer_fail_locked(p, HIXL_PEER_LOST, "handshake timed out");
      st = HIXL_PEER_LOST;
    }
    if (st >= HIXL_PEER_LOST && p->pending)
      fail_pending_locked(p); /* lost asynchronously (hixl__peer_lost_async) */
    if (st >= HIXL_PEER_LOST && p->lost_ns == 0)
      p->lost_ns = now;
    if (st >= HIXL_PEER_LOST && p->fd >= 0) {
      close_sock_locked(ctx, p);
      pthread_cond_broadcast(&ctx->cond);
    }
    /* A lost peer's mappings are released after a grace period, when no
     * operation that passed its state check before the loss can still be
     * copying into them, and once its notifications were taken.  The handle
     * itself stays (its ops say PEER_LOST) until the context goes. */
    if (st >= HIXL_PEER_LOST && p->ops && p->ops != &hixl__closed_ops && !p->unix_pending &&
        now - p->lost_ns > RELEASE_GRACE_NS(ctx) &&
        (p->inbox == NULL || !hixl_ring_maybe_nonempty(p->inbox))) {
      for (hixl_rmr_t *r = p->rmrs; r; r = r->next)
        p->ops->rmr_detach(r);
      p->ops->peer_close(p);
      p->ops = &hixl__closed_ops;
      free(p->rx);
      p->rx = NULL;
      p->rx_len = 0;
    }
    if (st >= HIXL_PEER_LOST && p->inbound && (p->unix_pending || p->ops == NULL)) {
      /* Never visible to the user: free now. */
      *pp = p->next;
      hixl__peer_free(p);
      continue;
    }
    pp = &p->next;
  }
}

static void *ctl_main(void *arg)
{
  hixl_ctx_t *ctx = arg;
  struct epoll_event evs[32];
  int64_t last_hk = 0;
  while (!atomic_load(&ctx->stopping)) {
    int hb_ms = liveness_ms(ctx) / 4;
    if (hb_ms < 10)
      hb_ms = 10;
    if (hb_ms > 1000)
      hb_ms = 1000;
    int wait_ms = atomic_load(&ctx->tp_backlog) > 0 ? 1 : hb_ms;
    if (ctx->accept_paused && wait_ms > 10)
      wait_ms = 10; /* listeners back in epoll on time */
    int n = epoll_wait(ctx->epoll_fd, evs, 32, wait_ms);
    accept_resume(ctx, hixl__now_ns());
    for (int i = 0; i < n; i++) {
      void *ptr = evs[i].data.ptr;
      if (ptr == &ctx->listen_fd) {
        accept_all(ctx, ctx->listen_fd, false);
      } else if (ptr == &ctx->unix_fd) {
        accept_all(ctx, ctx->unix_fd, true);
      } else if (ptr == &ctx->wake_fd) {
        uint64_t v;
        ssize_t r = read(ctx->wake_fd, &v, sizeof(v));
        (void)r;
      } else if ((int *)ptr >= ctx->tp_fd && (int *)ptr < ctx->tp_fd + HIXL_TP_COUNT) {
        /* handled below, with the periodic tick */
      } else {
        hixl_peer_t *p = ptr;
        /* The event may be stale: p might have been freed by the
         * housekeeping of an earlier event in this batch only if its fd was
         * removed from epoll first, which drops pending events for it. */
        if (p->fd >= 0 && (evs[i].events & EPOLLOUT))
          peer_writable(p);
        if (p->fd >= 0 && (evs[i].events & ~(uint32_t)EPOLLOUT))
          peer_readable(ctx, p);
      }
    }
    /* Target-side transport work (verbs receive completions): on its event
     * and at every tick, so nothing waits longer than a tick. */
    for (size_t t = 0; t < hixl__n_transports; t++)
      if (ctx->tp_ready & (1u << hixl__transports[t]->id))
        hixl__transports[t]->on_event(ctx);
    int64_t now = hixl__now_ns();
    pthread_mutex_lock(&ctx->lock);
    /* Sockets of failed peers close promptly; heartbeats at their pace. */
    if (n > 0 || now - last_hk >= (int64_t)hb_ms * 1000000) {
      housekeeping_locked(ctx, now);
      last_hk = now;
    }
    pthread_mutex_unlock(&ctx->lock);
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
    if (fd < 0)
      continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 256) == 0)
      break;
    err = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0)
    return hixl__err(HIXL_ERR_TRANSPORT, "cannot listen on \"%s\": %s", listen_addr,
                     strerror(err ? err : EADDRNOTAVAIL));
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
      listen(fd, 256) != 0) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    return hixl__err(HIXL_ERR_TRANSPORT, "cannot listen on unix socket: %s", strerror(e));
  }
  ctx->unix_fd = fd;
  return HIXL_OK;
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
  if (ctx->epoll_fd < 0 || ctx->wake_fd < 0)
    return hixl__err(HIXL_ERR_TRANSPORT, "epoll/eventfd: %s", strerror(errno));
  struct epoll_event ev = {.events = EPOLLIN};
  ev.data.ptr = &ctx->listen_fd;
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, ctx->listen_fd, &ev);
  ev.data.ptr = &ctx->unix_fd;
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, ctx->unix_fd, &ev);
  ev.data.ptr = &ctx->wake_fd;
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, ctx->wake_fd, &ev);
  for (int i = 0; i < HIXL_TP_COUNT; i++)
    if (ctx->tp_fd[i] >= 0) {
      ev.data.ptr = &ctx->tp_fd[i];
      epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, ctx->tp_fd[i], &ev);
    }
  if (pthread_create(&ctx->ctl_thread, NULL, ctl_main, ctx) != 0)
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

static hixl_status_t connect_with_deadline(int fd, const struct sockaddr *sa, socklen_t sl,
                                           int64_t deadline, const char *addr)
{
  if (connect(fd, sa, sl) == 0)
    return HIXL_OK;
  if (errno != EINPROGRESS)
    return hixl__err(HIXL_ERR_PEER_LOST, "cannot connect to %s: %s", addr, strerror(errno));
  for (;;) {
    int ms = deadline == INT64_MAX ? -1 : (int)((deadline - hixl__now_ns()) / 1000000);
    if (ms < 0 && deadline != INT64_MAX)
      ms = 0;
    struct pollfd pfd = {fd, POLLOUT, 0};
    int pr = poll(&pfd, 1, ms);
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr == 0)
      return hixl__err(HIXL_ERR_TIMEOUT, "connecting to %s timed out", addr);
    int err = 0;
    socklen_t el = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err)
      return hixl__err(HIXL_ERR_PEER_LOST, "cannot connect to %s: %s", addr, strerror(err));
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
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
      continue;
    st = connect_with_deadline(fd, ai->ai_addr, ai->ai_addrlen, deadline, addr);
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

hixl_status_t hixl__connect_tagged(hixl_ctx_t *ctx, const char *addr, int timeout_ms, uint64_t tag,
                                   hixl_peer_t **peer_p)
{
  if (ctx == NULL || addr == NULL || peer_p == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_connect: NULL %s",
                     ctx == NULL    ? "ctx"
                     : addr == NULL ? "addr"
                                    : "peer_p");
  int64_t deadline = hixl__deadline(timeout_ms);
  int fd = -1;
  hixl_status_t st = tcp_connect(addr, deadline, &fd);
  if (st != HIXL_OK)
    return st;
  set_sock_opts(fd, ctx->cfg.timeout_ms, true);

  hixl_peer_t *p = peer_new(ctx, fd, false);
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
                     "%s closed the connection at HELLO (does it require TLS? HIXL_TLS must "
                     "be the same on both sides)",
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
    st = hixl__err(HIXL_ERR_AUTH,
                   "%s did not prove it knows our auth token (it has another one, or it is "
                   "not the target we meant): nothing more was sent to it",
                   addr);
    goto fail;
  }
  hixl_msg_t auth = {.type = HIXL_MSG_AUTH};
  auth.u32[0] = ctx->tp_ready; /* what we can do, for the target's choice */
  auth.u64[0] = ctx->id;
  memcpy(auth.host_id, ctx->host_id, 32);
  auth.u32[1] = (uint32_t)getpid();
  auth.u64[1] = tag;
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
                   "%s refused the connection: %s", addr,
                   ack.str[1][0] ? ack.str[1] : hixl_strerror(ack.status));
    goto fail;
  }
  p->remote_ctx_id = ack.u64[0];
  p->remote_pid = (pid_t)ack.u32[1];
  if (ack.u32[0] == HIXL_TP_SELF) {
    hixl__peer_free(p);
    hixl_peer_t *self = hixl__self_peer(ctx);
    if (self == NULL)
      return hixl__err(HIXL_ERR_NOMEM, "no memory for a self peer");
    *peer_p = self;
    return HIXL_OK;
  }
  const hixl_transport_ops_t *ops = NULL;
  for (size_t t = 0; t < hixl__n_transports; t++)
    if ((uint32_t)hixl__transports[t]->id == ack.u32[0])
      ops = hixl__transports[t];
  if (ops == NULL || !(ctx->tp_allowed & (1u << ack.u32[0]))) {
    st = hixl__err(HIXL_ERR_UNSUPPORTED, "%s chose transport %u, which we do not allow", addr,
                   ack.u32[0]);
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
  atomic_store(&p->state, HIXL_PEER_UP);
  p->last_rx_ns = hixl__now_ns();
  p->next = ctx->peers;
  ctx->peers = p;
  pthread_mutex_lock(&p->send_lock);
  p->polled = true;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = p};
  epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, p->fd, &ev);
  pthread_mutex_unlock(&p->send_lock);
  pthread_mutex_unlock(&ctx->lock);
  hixl_info("connected to %s over %s", addr, ops->name);
  *peer_p = p;
  return HIXL_OK;
fail:
  hixl__peer_free(p);
  return st;
}

hixl_status_t hixl_connect(hixl_ctx_t *ctx, const char *addr, int timeout_ms, hixl_peer_t **peer_p)
{
  return hixl__connect_tagged(ctx, addr, timeout_ms, 0, peer_p);
}

hixl_peer_t *hixl__self_peer(hixl_ctx_t *ctx)
{
  hixl_peer_t *p = peer_new(ctx, -1, false);
  if (p == NULL)
    return NULL;
  p->self = true;
  p->ops = &hixl__self_ops;
  p->remote_ctx_id = ctx->id;
  p->remote_pid = getpid();
  snprintf(p->name, sizeof(p->name), "self(%s)", ctx->address);
  if (hixl__self_init(p) != HIXL_OK) {
    p->ops = NULL;
    hixl__peer_free(p);
    return NULL;
  }
  pthread_mutex_lock(&ctx->lock);
  atomic_store(&p->state, HIXL_PEER_UP);
  p->next = ctx->peers;
  ctx->peers = p;
  pthread_mutex_unlock(&ctx->lock);
  return p;
}

hixl_status_t hixl_disconnect(hixl_peer_t *peer)
{
  if (peer == NULL || peer->magic != HIXL_MAGIC_PEER)
    return hixl__err(HIXL_ERR_INVALID, "hixl_disconnect: %s peer",
                     peer == NULL ? "NULL" : "invalid or freed");
  hixl_ctx_t *ctx = peer->ctx;
  if (atomic_load(&peer->state) == HIXL_PEER_UP && peer->fd >= 0) {
    hixl_msg_t bye = {.type = HIXL_MSG_BYE};
    hixl__send(peer, &bye, NULL, 0);
  }
  pthread_mutex_lock(&ctx->lock);
  hixl__peer_fail_locked(peer, HIXL_PEER_CLOSED, "disconnected by us");
  /* Closed by the user, even if the peer's EOF (after our BYE) won the race
   * and marked it lost first: later calls say "disconnected". */
  atomic_store(&peer->state, HIXL_PEER_CLOSED);
  /* The control thread closes the socket; wait for it so that nothing
   * reads from a peer we are about to tear down. */
  while (peer->fd >= 0 && !peer->self) {
    hixl__wake(ctx);
    cond_wait_until(ctx, hixl__deadline(100));
  }
  /* Release transport resources now; keep the handle (state CLOSED) so a
   * use after disconnect is reported as PEER_LOST, not a crash.  It is freed
   * with the context. */
  if (peer->ops) {
    for (hixl_rmr_t *r = peer->rmrs; r; r = r->next)
      peer->ops->rmr_detach(r);
    peer->ops->peer_close(peer);
    peer->ops = &hixl__closed_ops;
  }
  pthread_mutex_unlock(&ctx->lock);
  return HIXL_OK;
}

const char *hixl_peer_transport(const hixl_peer_t *peer)
{
  if (peer == NULL || peer->magic != HIXL_MAGIC_PEER || peer->ops == NULL)
    return NULL;
  return peer->ops->name;
}

/* Free every peer; the control thread is stopped.  For hixl_ctx_destroy. */
void hixl__peers_destroy(hixl_ctx_t *ctx)
{
  while (ctx->peers) {
    hixl_peer_t *p = ctx->peers;
    ctx->peers = p->next;
    if (atomic_load(&p->state) == HIXL_PEER_UP && p->fd >= 0 && !p->inbound) {
      hixl_msg_t bye = {.type = HIXL_MSG_BYE};
      hixl__send(p, &bye, NULL, 0);
    }
    hixl__peer_fail_locked(p, HIXL_PEER_CLOSED, "context destroyed");
    while (p->rmrs) {
      hixl_rmr_t *r = p->rmrs;
      p->rmrs = r->next;
      if (p->ops)
        p->ops->rmr_detach(r);
      r->magic = HIXL_MAGIC_DEAD;
      free(r);
    }
    hixl__peer_free(p);
  }
}

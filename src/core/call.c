/* SPDX-License-Identifier: MIT */
/*
 * Sending and calls (the control plane: conn.h): writes to a peer's control
 * socket that never block once it is polled (what a full socket does not
 * take waits in the peer's output queue, flushed by the control thread on
 * EPOLLOUT), and request/reply calls: a pending entry, the one timed wait
 * on ctx->cond, and the reply that completes it.
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

/* ------------------------------------------------------------- sending */

/* Put bytes (with fds on the first) on a socket.  Returns how many went
 * (0: the socket is full, non-blocking only) or -errno. */
static ssize_t send_some(int fd, const uint8_t *b, size_t len, const int *fds, int nfds, bool block)
{
  union {
    char buf[CMSG_SPACE(sizeof(int) * HIXL_CTL_MAX_FDS)];
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
  if (nfds < 0 || nfds > HIXL_CTL_MAX_FDS)
    return hixl__err(HIXL_ERR_INVALID, "control message %s would pass %d fds (at most %d)",
                     hixl_wire_type_name(m->type), nfds, HIXL_CTL_MAX_FDS);
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
void hixl__peer_writable(hixl_peer_t *p)
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

void hixl__cond_wait_until(hixl_ctx_t *ctx, int64_t deadline, int cap_ms)
{
  /* The cap: cheap insurance against a missed signal.  ctx->cond runs on
   * CLOCK_MONOTONIC (ctx.c), the clock of hixl__now_ns and of deadlines. */
  int64_t until = hixl__now_ns() + (int64_t)cap_ms * 1000000;
  if (deadline < until)
    until = deadline;
  struct timespec ts = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};
  pthread_cond_timedwait(&ctx->cond, &ctx->lock, &ts);
}

/* An inbound peer can reach the user (its first notification) a moment
 * before its handshake's last message is on the wire and it is marked UP:
 * wait for that, within deadline.  ctx->lock held. */
static void await_up_locked(hixl_peer_t *peer, int64_t deadline)
{
  while (atomic_load(&peer->state) == HIXL_PEER_CONNECTING && peer->inbound &&
         hixl__now_ns() < deadline)
    hixl__cond_wait_until(peer->ctx, deadline, 100);
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
      hixl__cond_wait_until(ctx, deadline, 100);
    if (!pd.done)
      st = hixl__err(HIXL_ERR_TIMEOUT, "peer %s: no reply to %s in time", peer->name,
                     hixl_wire_type_name(m->type));
    else if (pd.status == HIXL_ERR_PEER_LOST) {
      char fn[64];
      snprintf(fn, sizeof(fn), "waiting for %s", hixl_wire_type_name(reply_type));
      st = hixl__peer_state_err(fn, peer, NULL);
    } else
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

static hixl_status_t call_async(hixl_peer_t *peer, hixl_msg_t *m, uint16_t reply_type,
                                hixl_req_t *req, bool part);

/* Requests in flight to a peer (issued, not completed) past which an
 * owner-run atomic waits for room: bounds the atomics queued on the
 * control connection, so that neither side's socket buffer fills up. */
#define OWNER_AMO_MAX 1024

static bool owner_room(hixl_peer_t *peer)
{
  return atomic_load(&peer->issued) - atomic_load(&peer->completed) < OWNER_AMO_MAX;
}

static bool owner_room_fn(void *arg)
{
  hixl_peer_t *peer = arg;
  return owner_room(peer) || atomic_load(&peer->state) != HIXL_PEER_UP;
}

hixl_status_t hixl__owner_atomic(const char *tp, hixl_peer_t *peer, hixl_rmr_t *r, uint64_t off,
                                 int op, uint64_t a, uint64_t b, hixl_req_t *req, bool part)
{
  if (!owner_room(peer)) {
    /* Past the liveness period: a peer that stopped answering is lost
     * first, and the caller hears PEER_LOST rather than AGAIN. */
    int ms = hixl__issue_wait_ms(peer->ctx);
    hixl__wait(peer->ctx, hixl__deadline(ms), 0, owner_room_fn, peer);
    if (atomic_load(&peer->state) != HIXL_PEER_UP)
      return hixl__peer_state_err(tp, peer, NULL);
    if (!owner_room(peer))
      return hixl__err(HIXL_ERR_AGAIN, "%s: %d atomics to %s in flight for %d ms", tp,
                       OWNER_AMO_MAX, peer->name, ms);
  }
  hixl_msg_t m;
  hixl__atomic_msg(r, off, op, a, b, &m);
  return call_async(peer, &m, HIXL_MSG_ATOMIC_REPLY, req, part);
}

void hixl__pending_req_end(hixl_pending_t *pd, hixl_status_t st, uint64_t old)
{
  hixl_req_t *req = pd->req;
  if (!pd->part) {
    hixl__req_complete(req, st, old);
    return;
  }
  /* The last part completes the request with no value: write it now. */
  if (st == HIXL_OK && req->old_p)
    *req->old_p = old;
  req->old_p = NULL;
  hixl__req_part_done(req, st);
}

static hixl_status_t call_async(hixl_peer_t *peer, hixl_msg_t *m, uint16_t reply_type,
                                hixl_req_t *req, bool part)
{
  hixl_ctx_t *ctx = peer->ctx;
  hixl_pending_t *pd = calloc(1, sizeof(*pd));
  if (pd == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "no memory for a pending call");
  pd->reply_type = reply_type;
  pd->req = req;
  pd->part = part;
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
  if (part) {
    hixl__req_part_add(req); /* the core counted the request already */
  } else {
    req->counted = true;
    atomic_fetch_add(&peer->issued, 1);
  }
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

void hixl__complete_pending_locked(hixl_peer_t *p, hixl_msg_t *m, int fd)
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
    hixl__pending_req_end(pd, m->status, m->atomic_reply.old);
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

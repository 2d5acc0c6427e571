/* SPDX-License-Identifier: MIT */
/*
 * shm without CMA: the owner's control thread copies (shm_int.h describes
 * the staging area).
 *
 * Initiator: a session takes the peer's staging area (its lock: one
 * operation or batch at a time per peer), cuts the transfer into pieces of
 * at most an eighth of the area, and for each piece waits until its ring
 * space is free (the pieces there before it are done), copies a put's
 * bytes in, and sends SHM_COPY.  A get's bytes are copied out when its
 * piece is done.  The session ends when every piece is done: then all of
 * it is visible at the owner (the owner copies before it publishes done),
 * so completion still means visible, and a notification pushed afterwards
 * follows the data.
 *
 * Owner: the control thread checks each SHM_COPY (staging bounds; live
 * slot and rkey, range, rights, no device memory: hixl__serve_range_locked,
 * as for an atomic), copies under the registry lock (a deregistration waits
 * for it) but not the context lock, and publishes the count of copies done
 * (and the last failure) in the staging header.  A copy it refuses changes
 * nothing; the connection stays up.  Only SHM_COPY without a staging area
 * (which no hixl initiator sends) drops the connection.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm_int.h"

/* ------------------------------------------------------------ initiator */

static hixl_status_t attach(hixl_peer_t *peer, shm_stage_out_t *so)
{
  hixl_msg_t m = {.type = HIXL_MSG_TP_REQ}, reply;
  m.tp_req.kind = SHM_KIND_STAGE;
  int fd = -1;
  hixl_status_t st = hixl__call(peer, &m, HIXL_MSG_TP_REPLY, &reply, &fd,
                                hixl__deadline(hixl__ctx_timeout(peer->ctx)));
  if (st != HIXL_OK) {
    if (fd >= 0)
      close(fd);
    return st == HIXL_ERR_PEER_LOST || st == HIXL_ERR_TIMEOUT
               ? st
               : hixl__err(st, "shm: peer %s lends no staging area for copies without CMA (%s)",
                           peer->name, hixl_strerror(st));
  }
  uint64_t size = HIXL_MSG_AS(shm_stage_msg_t, &reply)->size;
  struct stat sst;
  int seals = fd >= 0 ? fcntl(fd, F_GET_SEALS) : -1;
  /* Sealed against shrinking (and further sealing) by its owner, or a
   * truncation there could fault our accesses. */
  bool ok = fd >= 0 && size >= 4096 && size <= ((uint64_t)1 << 30) && size % 4096 == 0 &&
            fstat(fd, &sst) == 0 && (uint64_t)sst.st_size == SHM_STAGE_HDR + size && seals >= 0 &&
            (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) == (F_SEAL_SHRINK | F_SEAL_SEAL);
  void *p =
      ok ? mmap(NULL, SHM_STAGE_HDR + size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (fd >= 0)
    close(fd);
  if (p == MAP_FAILED)
    return hixl__err(HIXL_ERR_TRANSPORT, "shm: peer %s lent a staging area we cannot use",
                     peer->name);
  so->hdr = p;
  so->data = (uint8_t *)p + SHM_STAGE_HDR;
  so->size = (size_t)size;
  so->map_len = SHM_STAGE_HDR + (size_t)size;
  so->sent = atomic_load_explicit(&so->hdr->done, memory_order_acquire);
  so->head = 0;
  so->fifo_first = so->fifo_n = 0;
  so->ready = true;
  return HIXL_OK;
}

typedef struct done_wait {
  hixl_peer_t *peer;
  shm_stage_out_t *so;
  uint64_t seq;
} done_wait_t;

static bool copy_done(void *arg)
{
  done_wait_t *w = arg;
  return atomic_load_explicit(&w->so->hdr->done, memory_order_acquire) >= w->seq ||
         atomic_load_explicit(&w->peer->state, memory_order_relaxed) != HIXL_PEER_UP;
}

/* Wait until the owner has done copy number seq (it rings our doorbell
 * when we sleep). */
static hixl_status_t wait_done(hixl_peer_t *peer, shm_stage_out_t *so, uint64_t seq)
{
  if (atomic_load_explicit(&so->hdr->done, memory_order_acquire) >= seq)
    return HIXL_OK;
  done_wait_t w = {peer, so, seq};
  /* Past the liveness period: an owner that stopped is lost first, and
   * the caller hears PEER_LOST rather than TIMEOUT. */
  int ms = hixl__issue_wait_ms(peer->ctx);
  hixl__wait(peer->ctx, hixl__deadline(ms), 0, copy_done, &w);
  if (atomic_load_explicit(&so->hdr->done, memory_order_acquire) >= seq)
    return HIXL_OK;
  if (atomic_load_explicit(&peer->state, memory_order_relaxed) != HIXL_PEER_UP)
    return hixl__err(HIXL_ERR_PEER_LOST, "shm: peer %s lost during a copy", peer->name);
  return hixl__err(HIXL_ERR_TIMEOUT, "shm: peer %s did not perform a copy in %d ms", peer->name,
                   ms);
}

/* Retire the oldest piece: done, and a get's bytes taken out. */
static hixl_status_t pop(shm_stage_sess_t *s)
{
  shm_stage_out_t *so = s->so;
  shm_stage_piece_t *pc = &so->fifo[so->fifo_first];
  hixl_status_t st = wait_done(s->peer, so, pc->seq);
  if (st != HIXL_OK)
    return st;
  if (pc->dst)
    memcpy(pc->dst, so->data + pc->start, pc->len);
  so->fifo_first = (so->fifo_first + 1) % SHM_STAGE_FIFO;
  so->fifo_n--;
  return HIXL_OK;
}

static bool overlaps_any(const shm_stage_out_t *so, size_t start, size_t len)
{
  for (unsigned k = 0; k < so->fifo_n; k++) {
    const shm_stage_piece_t *pc = &so->fifo[(so->fifo_first + k) % SHM_STAGE_FIFO];
    if (pc->start < start + len && start < pc->start + pc->len)
      return true;
  }
  return false;
}

/* A session failed: nothing of it will be waited for any more (the next
 * session waits until the owner has caught up before reusing the ring). */
static hixl_status_t fail(shm_stage_sess_t *s, hixl_status_t st)
{
  s->so->fifo_n = 0;
  s->so->fifo_first = 0;
  if (s->st == HIXL_OK)
    s->st = st;
  return s->st;
}

hixl_status_t hixl__shm_stage_begin(hixl_peer_t *peer, shm_stage_sess_t *s)
{
  shm_peer_t *sp = peer->tp;
  shm_stage_out_t *so = &sp->out;
  *s = (shm_stage_sess_t){.peer = peer, .so = so, .st = HIXL_OK};
  pthread_mutex_lock(&so->lock);
  hixl_status_t st = so->ready ? HIXL_OK : attach(peer, so);
  /* Leftovers of a session that failed: the ring is reused only once the
   * owner is done with all of it. */
  if (st == HIXL_OK && atomic_load_explicit(&so->hdr->done, memory_order_acquire) < so->sent)
    st = wait_done(peer, so, so->sent);
  if (st != HIXL_OK) {
    pthread_mutex_unlock(&so->lock);
    return st;
  }
  s->first = so->sent + 1;
  return HIXL_OK;
}

hixl_status_t hixl__shm_stage_add(shm_stage_sess_t *s, bool put, void *local, const hixl_rmr_t *r,
                                  uint64_t off, size_t len)
{
  shm_stage_out_t *so = s->so;
  size_t piece_max = so->size / 8;
  for (size_t done = 0; done < len && s->st == HIXL_OK;) {
    size_t n = len - done < piece_max ? len - done : piece_max;
    if (so->head + n > so->size)
      so->head = 0;
    while (so->fifo_n > 0 && (so->fifo_n == SHM_STAGE_FIFO || overlaps_any(so, so->head, n))) {
      hixl_status_t st = pop(s);
      if (st != HIXL_OK)
        return fail(s, st);
    }
    uint8_t *l = (uint8_t *)local + done;
    if (put)
      memcpy(so->data + so->head, l, n);
    hixl_msg_t m = {.type = HIXL_MSG_TP_REQ};
    shm_copy_msg_t *c = HIXL_MSG_AS(shm_copy_msg_t, &m);
    c->kind = SHM_KIND_COPY;
    c->slot = r->slot;
    c->dir = put ? SHM_COPY_PUT : SHM_COPY_GET;
    c->rkey = r->rkey;
    c->off = off + done;
    c->len = n;
    c->soff = so->head;
    hixl_status_t st = hixl__send(s->peer, &m, NULL, 0);
    if (st != HIXL_OK)
      return fail(s, st);
    so->sent++;
    unsigned at = (so->fifo_first + so->fifo_n) % SHM_STAGE_FIFO;
    so->fifo[at] = (shm_stage_piece_t){so->sent, so->head, n, put ? NULL : l};
    so->fifo_n++;
    so->head += n;
    done += n;
  }
  return s->st;
}

hixl_status_t hixl__shm_stage_end(shm_stage_sess_t *s)
{
  shm_stage_out_t *so = s->so;
  while (s->st == HIXL_OK && so->fifo_n > 0) {
    hixl_status_t st = pop(s);
    if (st != HIXL_OK)
      fail(s, st);
  }
  if (s->st == HIXL_OK) {
    uint64_t e = atomic_load_explicit(&so->hdr->err_seq, memory_order_relaxed);
    if (e >= s->first && e <= so->sent) {
      int32_t why = atomic_load_explicit(&so->hdr->err_status, memory_order_relaxed);
      hixl_status_t st = why < 0 && why >= HIXL_ERR_NO_DEVICE ? why : HIXL_ERR_TRANSPORT;
      s->st = hixl__err(st, "shm: peer %s refused to copy into or out of its region: %s%s",
                        s->peer->name, hixl_strerror(st),
                        st == HIXL_ERR_NOT_REGISTERED ? " (deregistered meanwhile?)" : "");
    }
  } else {
    fail(s, s->st);
  }
  pthread_mutex_unlock(&so->lock);
  return s->st;
}

/* ---------------------------------------------------------------- owner */

/* A staging area for this peer: created at its first request, kept (and
 * lent again, never a second one) until the peer goes. */
void hixl__shm_stage_serve(hixl_peer_t *peer, const hixl_msg_t *m, hixl_msg_t *out, int *out_fds,
                           int *n_out)
{
  (void)m;
  memset(out, 0, sizeof(*out));
  out->type = HIXL_MSG_TP_REPLY;
  out->tp_req.kind = SHM_KIND_STAGE;
  out->status = HIXL_ERR_UNSUPPORTED;
  *n_out = 0;
  shm_peer_t *sp = peer->tp;
  if (peer->ops != &hixl__shm_ops || sp == NULL)
    return;
  shm_stage_in_t *in = &sp->in;
  if (in->hdr == NULL) {
    shm_ctx_t *sc = peer->ctx->tp[HIXL_TP_SHM];
    size_t size = sc->stage_bytes, bytes = SHM_STAGE_HDR + size;
    int fd = memfd_create("hixl-stage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void *p = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)bytes) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
      p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      hixl_warn("shm: no staging area for %s: %s", peer->name, strerror(errno));
      if (fd >= 0)
        close(fd);
      out->status = HIXL_ERR_NOMEM;
      return;
    }
    in->fd = fd;
    in->hdr = p;
    in->data = (uint8_t *)p + SHM_STAGE_HDR;
    in->size = size;
    in->map_len = bytes;
    in->handled = 0;
    hixl_info("shm: %s copies through us (no CMA): lent it a %zu-byte staging area", peer->name,
              size);
  }
  out_fds[0] = fcntl(in->fd, F_DUPFD_CLOEXEC, 0);
  if (out_fds[0] < 0) {
    out->status = HIXL_ERR_NOMEM;
    return;
  }
  *n_out = 1;
  out->status = HIXL_OK;
  HIXL_MSG_AS(shm_stage_msg_t, out)->size = in->size;
}

/* This thread copies into (or out of) the application's memory for a
 * peer; the application's thread that then takes the notification the
 * peer sends after the copy (or that wrote what a get reads, then polled)
 * meets it only through the peer's messages, another process, which no
 * C11 happens-before (nor TSan) follows.  Passing through the lock that
 * hixl_notif_poll holds, just before and just after the copy, makes that
 * order one within this process; never held across the copy itself. */
static void notif_edge(hixl_ctx_t *ctx)
{
  pthread_mutex_lock(&ctx->notif.lock);
  pthread_mutex_unlock(&ctx->notif.lock);
}

void hixl__shm_copy_serve(hixl_peer_t *peer, const hixl_msg_t *m, hixl_msg_t *out, int *out_fds,
                          int *n_out)
{
  (void)out_fds, (void)n_out;
  out->type = 0; /* no reply: the outcome is in the staging header */
  const shm_copy_msg_t *mc = HIXL_MSG_AS_CONST(shm_copy_msg_t, m);
  hixl_ctx_t *ctx = peer->ctx;
  shm_peer_t *sp = peer->tp;
  if (peer->ops != &hixl__shm_ops || sp == NULL || sp->in.hdr == NULL) {
    hixl_warn("peer %s: protocol error: SHM_COPY without a staging area; dropping it", peer->name);
    hixl__peer_fail_locked(peer, HIXL_PEER_LOST, "protocol error");
    return;
  }
  shm_stage_in_t *in = &sp->in;
  uint64_t n = ++in->handled;
  uint32_t dir = mc->dir;
  uint64_t len = mc->len, soff = mc->soff;
  hixl_status_t st;
  if ((dir != SHM_COPY_PUT && dir != SHM_COPY_GET) || len == 0 || soff > in->size ||
      len > in->size - soff) {
    st = HIXL_ERR_INVALID;
  } else {
    /* Not under ctx->lock: a copy of a piece takes tens of microseconds,
     * and the application's threads poll notifications under it.  The peer
     * and its staging stay: only this thread releases them (hixl_disconnect
     * waits for it to close the socket first). */
    pthread_mutex_unlock(&ctx->lock);
    pthread_mutex_lock(&ctx->reg_lock);
    uint8_t *addr = NULL;
    st =
        hixl__serve_range_locked(ctx, mc->slot, mc->rkey, mc->off, len,
                                 dir == SHM_COPY_PUT ? HIXL_ACCESS_WRITE : HIXL_ACCESS_READ, &addr);
    if (st == HIXL_OK) {
      notif_edge(ctx);
      if (dir == SHM_COPY_PUT)
        memcpy(addr, in->data + soff, (size_t)len);
      else
        memcpy(in->data + soff, addr, (size_t)len);
      notif_edge(ctx);
    }
    pthread_mutex_unlock(&ctx->reg_lock);
    pthread_mutex_lock(&ctx->lock);
  }
  if (st != HIXL_OK) {
    atomic_store_explicit(&in->hdr->err_status, st, memory_order_relaxed);
    atomic_store_explicit(&in->hdr->err_seq, n, memory_order_relaxed);
  }
  atomic_store_explicit(&in->hdr->done, n, memory_order_release);
  hixl__shm_ring_if_sleeping(sp); /* the initiator may sleep in wait_done */
}

void hixl__shm_stage_free(shm_peer_t *sp)
{
  if (sp->out.hdr)
    munmap(sp->out.hdr, sp->out.map_len);
  sp->out.hdr = NULL;
  sp->out.ready = false;
  if (sp->in.hdr) {
    munmap(sp->in.hdr, sp->in.map_len);
    close(sp->in.fd);
  }
  sp->in.hdr = NULL;
}

/* SPDX-License-Identifier: MIT */
/*
 * librdmacm connection management, the alternative to connecting QPs by
 * hand (HIXL_VERBS_CM=rdmacm on the initiator; the default is "inband").
 *
 * The control connection still comes first (same address for every
 * transport, auth, the region table); then:
 *
 *   initiator                               target
 *   VERBS_QP {cm wanted, QP count}   ---->  makes the peer's QP slots, a
 *                                           cookie; replies with the address
 *                                    <----  and port its rdma_cm listens on
 *   per QP: rdma_resolve_addr/route,
 *   rdma_create_qp, rdma_connect with
 *   {cookie, QP index} as private data --->  CONNECT_REQUEST (control thread):
 *                                           finds the peer by cookie,
 *                                           rdma_create_qp, rdma_accept
 *   ESTABLISHED                      <---> ESTABLISHED: the QP is ready; what
 *                                           the target queued for it is posted
 *
 * rdma_cm then owns the QP state machine, path (GID, MTU, traffic class) and
 * retry settings come from the route; the ACK timeout is still
 * HIXL_VERBS_TIMEOUT.  The target's listener is bound to the IP address of
 * the RoCE GID in use, so this works on RoCE (and Soft-RoCE); on InfiniBand
 * without an IPoIB address in the GID table it is not offered.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "verbs_int.h"

#define CM_MAGIC 0x68697863u /* "hixc" */

typedef struct cm_private {
  uint64_t cookie;
  uint32_t index;
  uint32_t magic;
} cm_private_t;

/* A 16-byte address (IPv4-mapped or IPv6, as in a RoCE GID) as a sockaddr. */
static void addr16(const uint8_t *g, uint16_t port, struct sockaddr_storage *ss)
{
  static const uint8_t v4map[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  memset(ss, 0, sizeof(*ss));
  if (memcmp(g, v4map, 12) == 0) {
    struct sockaddr_in *in = (struct sockaddr_in *)ss;
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    memcpy(&in->sin_addr, g + 12, 4);
  } else {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    memcpy(&in6->sin6_addr, g, 16);
  }
}

/* The IP address behind our GID (RoCE: IPv4-mapped or IPv6), or false. */
static bool gid_addr(const vrb_ctx_t *vc, uint16_t port, struct sockaddr_storage *ss)
{
  const uint8_t *g = vc->gid.raw;
  if (g[0] == 0xfe && (g[1] & 0xc0) == 0x80) /* link-local: needs a scope, skip */
    return false;
  addr16(g, port, ss);
  return true;
}

hixl_status_t hixl__vrb_cm_init(hixl_ctx_t *ctx, vrb_ctx_t *vc)
{
  struct sockaddr_storage ss;
  if (!gid_addr(vc, 0, &ss))
    return hixl__err(HIXL_ERR_NO_DEVICE, "verbs: rdmacm: the GID in use has no IP address");
  vc->cm_ch = rdma_create_event_channel();
  if (vc->cm_ch == NULL)
    return hixl__vrb_err(HIXL_ERR_NO_DEVICE, "rdma_create_event_channel", 0);
  fcntl(vc->cm_ch->fd, F_SETFL, fcntl(vc->cm_ch->fd, F_GETFL) | O_NONBLOCK);
  int rc = rdma_create_id(vc->cm_ch, &vc->cm_listen, ctx, RDMA_PS_TCP);
  if (rc == 0)
    rc = rdma_bind_addr(vc->cm_listen, (struct sockaddr *)&ss);
  if (rc == 0)
    rc = rdma_listen(vc->cm_listen, 64);
  if (rc != 0) {
    hixl_status_t st = hixl__vrb_err(HIXL_ERR_NO_DEVICE, "rdmacm listener", rc);
    hixl__vrb_cm_fini(vc);
    return st;
  }
  vc->cm_port = ntohs(rdma_get_src_port(vc->cm_listen));
  return HIXL_OK;
}

void hixl__vrb_cm_fini(vrb_ctx_t *vc)
{
  if (vc->cm_listen)
    rdma_destroy_id(vc->cm_listen);
  vc->cm_listen = NULL;
  if (vc->cm_ch)
    rdma_destroy_event_channel(vc->cm_ch);
  vc->cm_ch = NULL;
}

/* ------------------------------------------------------------ initiator */

/* The next event on ch for id, which must be `want`; acked here.  Events
 * of other ids (an abandoned attempt's) are skipped. */
static hixl_status_t cm_wait(struct rdma_event_channel *ch, struct rdma_cm_id *id,
                             enum rdma_cm_event_type want, int64_t deadline, const char *step)
{
  for (;;) {
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev) == 0) {
      enum rdma_cm_event_type got = ev->event;
      int status = ev->status;
      bool mine = ev->id == id;
      rdma_ack_cm_event(ev);
      if (!mine)
        continue;
      if (got == want)
        return HIXL_OK;
      return hixl__err(HIXL_ERR_TRANSPORT, "verbs: rdmacm %s: %s (status %d)", step,
                       rdma_event_str(got), status);
    }
    if (errno != EAGAIN)
      return hixl__vrb_err(HIXL_ERR_TRANSPORT, "rdma_get_cm_event", 0);
    int64_t left = (deadline - hixl__now_ns()) / 1000000;
    if (left <= 0)
      return hixl__err(HIXL_ERR_TIMEOUT, "verbs: rdmacm %s timed out", step);
    struct pollfd pf = {.fd = ch->fd, .events = POLLIN};
    poll(&pf, 1, (int)(left < 100 ? left : 100));
  }
}

hixl_status_t hixl__vrb_cm_connect(hixl_peer_t *peer, vrb_peer_t *vp, const hixl_msg_t *r,
                                   int64_t deadline)
{
  vrb_ctx_t *vc = hixl__vc(peer->ctx);
  struct sockaddr_storage src, dst;
  if (!gid_addr(vc, 0, &src))
    return hixl__err(HIXL_ERR_TRANSPORT, "verbs: rdmacm: our GID has no IP address");
  /* The target's listener: its address in IPv6 form (IPv4-mapped). */
  addr16(r->blob, (uint16_t)VRB_QP(r)->cm, &dst);
  vp->cm_ch = rdma_create_event_channel();
  if (vp->cm_ch == NULL)
    return hixl__vrb_err(HIXL_ERR_TRANSPORT, "rdma_create_event_channel", 0);
  fcntl(vp->cm_ch->fd, F_SETFL, fcntl(vp->cm_ch->fd, F_GETFL) | O_NONBLOCK);
  hixl_status_t st = HIXL_OK;
  for (int i = 0; i < vp->nq && st == HIXL_OK; i++) {
    vrb_qp_t *q = vp->qps[i];
    /* Address resolution, in attempts of one second: with an empty
     * neighbour table the kernel's first resolution can miss the ARP reply
     * and sit until its timeout (seen on Soft-RoCE); a fresh id then finds
     * the neighbour known. */
    int rc = 0, ms = 1000;
    do {
      if (q->cm_id)
        rdma_destroy_id(q->cm_id);
      q->cm_id = NULL;
      rc = rdma_create_id(vp->cm_ch, &q->cm_id, q, RDMA_PS_TCP);
      if (rc)
        return hixl__vrb_err(HIXL_ERR_TRANSPORT, "rdma_create_id", rc);
      int64_t until = hixl__now_ns() + (int64_t)(ms + 500) * 1000000;
      rc = rdma_resolve_addr(q->cm_id, (struct sockaddr *)&src, (struct sockaddr *)&dst, ms);
      st = rc ? hixl__vrb_err(HIXL_ERR_TRANSPORT, "rdma_resolve_addr", rc)
              : cm_wait(vp->cm_ch, q->cm_id, RDMA_CM_EVENT_ADDR_RESOLVED,
                        until < deadline ? until : deadline, "address resolution");
    } while (st != HIXL_OK && rc == 0 && hixl__now_ns() < deadline);
    ms = (int)((deadline - hixl__now_ns()) / 1000000);
    ms = ms > 100 ? ms : 100;
    if (st == HIXL_OK) {
      rc = rdma_resolve_route(q->cm_id, ms);
      st = rc ? hixl__vrb_err(HIXL_ERR_TRANSPORT, "rdma_resolve_route", rc)
              : cm_wait(vp->cm_ch, q->cm_id, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline,
                        "route resolution");
    }
    if (st == HIXL_OK && q->cm_id->verbs != vc->dev)
      st = hixl__err(HIXL_ERR_TRANSPORT, "verbs: rdmacm routes to %s through another device",
                     peer->name);
    if (st == HIXL_OK) {
      uint8_t t = hixl__vrb_ack_timeout();
      rdma_set_option(q->cm_id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t));
      struct ibv_qp_init_attr qa = hixl__vrb_qp_attr(vc, vp);
      rc = rdma_create_qp(q->cm_id, vc->pd, &qa);
      if (rc) {
        st = hixl__vrb_err(HIXL_ERR_NOMEM, "rdma_create_qp", rc);
      } else {
        q->qp = q->cm_id->qp;
        hixl__vrb_note_inline(vc, qa.cap.max_inline_data);
      }
    }
    if (st == HIXL_OK) {
      cm_private_t pd = {.cookie = VRB_QP(r)->id, .index = (uint32_t)i, .magic = CM_MAGIC};
      struct rdma_conn_param cp = {.private_data = &pd,
                                   .private_data_len = sizeof(pd),
                                   .responder_resources = 16,
                                   .initiator_depth = 16,
                                   .retry_count = 7,
                                   .rnr_retry_count = 7};
      rc = rdma_connect(q->cm_id, &cp);
      st = rc ? hixl__vrb_err(HIXL_ERR_TRANSPORT, "rdma_connect", rc)
              : cm_wait(vp->cm_ch, q->cm_id, RDMA_CM_EVENT_ESTABLISHED, deadline, "connect");
    }
    if (st == HIXL_OK)
      q->ready = true;
  }
  return st;
}

/* ------------------------------------------------------------ target */

/* The peer whose cookie this is (ctx->lock held). */
static vrb_peer_t *by_cookie(hixl_ctx_t *ctx, uint64_t cookie)
{
  for (hixl_peer_t *p = ctx->peers; p; p = p->next)
    if (p->ops == &hixl__verbs_ops && p->tp && ((vrb_peer_t *)p->tp)->cm_cookie == cookie)
      return p->tp;
  return NULL;
}

/* A connection request (ctx->lock held; the event is acked already, so a
 * concurrent rdma_destroy_id never waits on us).  Returns an id to destroy
 * once the lock is dropped, or NULL. */
static struct rdma_cm_id *on_request(hixl_ctx_t *ctx, vrb_ctx_t *vc, struct rdma_cm_id *id,
                                     const cm_private_t *pd, bool have_pd)
{
  vrb_peer_t *vp =
      have_pd && pd->magic == CM_MAGIC && pd->cookie ? by_cookie(ctx, pd->cookie) : NULL;
  vrb_qp_t *q = vp && pd->index < (uint32_t)vp->nq ? vp->qps[pd->index] : NULL;
  if (q == NULL || q->cm_id != NULL || id->verbs != vc->dev) {
    hixl_warn("verbs: rdmacm: refusing a connection request that matches no peer");
    rdma_reject(id, NULL, 0);
    return id;
  }
  struct ibv_qp_init_attr qa = hixl__vrb_qp_attr(vc, vp);
  uint8_t t = hixl__vrb_ack_timeout();
  rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t));
  if (rdma_create_qp(id, vc->pd, &qa) != 0) {
    hixl__vrb_err(HIXL_ERR_NOMEM, "rdma_create_qp", 0);
    hixl_warn("verbs: rdmacm: %s", hixl_last_error());
    rdma_reject(id, NULL, 0);
    return id;
  }
  struct rdma_conn_param cp = {
      .responder_resources = 16, .initiator_depth = 16, .retry_count = 7, .rnr_retry_count = 7};
  if (pd->index == 0 && !hixl__vrb_rmap_add(vc, id->qp->qp_num, vp->peer)) {
    hixl_warn("verbs: rdmacm: no memory for the QP map");
    rdma_destroy_qp(id);
    rdma_reject(id, NULL, 0);
    return id;
  }
  pthread_mutex_lock(&vp->lock);
  q->cm_id = id;
  q->qp = id->qp;
  pthread_mutex_unlock(&vp->lock);
  if (rdma_accept(id, &cp) != 0)
    hixl_warn("verbs: rdma_accept: %s", strerror(errno));
  return NULL;
}

void hixl__vrb_cm_events(hixl_ctx_t *ctx)
{
  vrb_ctx_t *vc = hixl__vc(ctx);
  if (vc->cm_ch == NULL)
    return;
  struct rdma_cm_event *ev;
  while (rdma_get_cm_event(vc->cm_ch, &ev) == 0) {
    enum rdma_cm_event_type type = ev->event;
    struct rdma_cm_id *id = ev->id;
    cm_private_t pd = {0};
    bool have_pd =
        type == RDMA_CM_EVENT_CONNECT_REQUEST && ev->param.conn.private_data_len >= sizeof(pd);
    if (have_pd)
      memcpy(&pd, ev->param.conn.private_data, sizeof(pd));
    rdma_ack_cm_event(ev);
    struct rdma_cm_id *drop = NULL;
    pthread_mutex_lock(&ctx->lock);
    if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
      drop = on_request(ctx, vc, id, &pd, have_pd);
    } else if (type == RDMA_CM_EVENT_ESTABLISHED) {
      /* Match by pointer only: the QP's peer may be gone already. */
      for (hixl_peer_t *p = ctx->peers; p; p = p->next) {
        vrb_peer_t *vp = p->ops == &hixl__verbs_ops ? p->tp : NULL;
        for (int i = 0; vp && i < vp->nq; i++)
          if (vp->qps[i]->cm_id == id)
            hixl__vrb_qp_ready(vp->qps[i]);
      }
    } /* else disconnects: the control connection reports peer loss */
    pthread_mutex_unlock(&ctx->lock);
    if (drop)
      rdma_destroy_id(drop);
  }
}

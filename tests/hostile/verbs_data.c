/* SPDX-License-Identifier: MIT */
/*
 * Hostile peers on the verbs data plane (issue 13, "trust nothing a peer
 * controls"), for Soft-RoCE in the rxe guest (tests/rxe/suite.sh; exits 77
 * where no RDMA device is active).  One process holds
 *
 *   the target T       a verbs-only context on HIXL_TEST_TARGET_NET_DEV
 *                      (rxe1) with regions "kv" (READ|WRITE|ATOMIC,
 *                      published), "ro" (READ, published), "none" (access 0,
 *                      published) and "secret" (READ|WRITE, never published);
 *   a second context   on the target's device (so: another protection
 *   T2                 domain) with a READ|WRITE region "other";
 *   the legitimate     a context on HIXL_NET_DEV (rxe0) connected to T; a
 *   peer L             thread of it puts and gets back 256 bytes of kv
 *                      ([0, 4 KiB)) all the time the attacks run, checking
 *                      every byte;
 *   the attackers      raw ibverbs / librdmacm objects of their own, or a
 *                      third hixl context A that knows the token.
 *
 * Cases (argv[1] picks one, default all):
 *
 *   rdmacm   (no handshake) connection requests to T's rdma_cm listener
 *            without the cookie of a VERBS_QP reply: no private data, a
 *            short one, guessed cookies.  Every one must be rejected (RC
 *            needs the target to move a QP of its own to RTR for the
 *            attacker; this listener and the in-band VERBS_QP, which needs
 *            an authenticated control connection, are the only ways).
 *   pd       (no handshake) a QP of the attacker's own on T's device,
 *            connected to itself, READ / WRITE / ATOMIC with T's real rkeys
 *            and addresses: refused (the MR belongs to another protection
 *            domain); the same QP reads the attacker's own MR (control).
 *   unbound  (no handshake) a QP of the attacker's own, moved to RTS by
 *            itself towards T's QP numbers (the legitimate peer's and their
 *            neighbours) with guessed PSNs, from T's device (another IP
 *            than the QP's peer) and from the legitimate peer's device (the
 *            same IP: only the PSN is unknown), with T's real kv rkey:
 *            WRITE, READ, FETCH_ADD, WRITE_WITH_IMM, SEND.  None may
 *            complete, no byte of kv's guard area may change, T may deliver
 *            no notification.  The rxe counters of T's device are printed
 *            (the legitimate peer paused): from the other IP nothing is even
 *            received (address check), from the same IP packets are received
 *            and refused on their PSN.  Control: with the PSN T expects
 *            (read from T's QP: an oracle) the same WRITE lands, so the
 *            attack does reach T and only the PSN stops it; printed: the
 *            legitimate peer's next put is then acknowledged as a duplicate
 *            and not applied (RoCE authenticates no packet).
 *   forged   (authenticated: A knows the token, connects through the
 *            library) the library's own put / get / atomic with an rmr whose
 *            access bits, NIC rkey, base or length A forged (internal
 *            headers): WRITE and FETCH_ADD on "ro", READ and WRITE on "none"
 *            (with the rkey T handed out and with the region's lkey), READ
 *            past the end of "ro", READ of "secret" with kv's rkey and with
 *            its rkey off by one bit, READ of T2's "other" with its real
 *            rkey: every one must fail with ACCESS (the NIC's remote access
 *            error) and leave the bytes intact; A's QP and T's QP for A
 *            go to the error state (T's is checked), T drops A's peer, A
 *            reconnects for the next attempt.  The PSNs T's QPs start from
 *            must differ across A's connections (a constant one would let
 *            the unbound attacker in).
 *            Controls through the very same forging path: a forged WRITE
 *            into kv (registered writable) lands, a forged READ of "ro"
 *            returns its bytes, so the refusals above are the NIC's access
 *            checks and not a broken attack (were "ro" registered with
 *            remote write, its WRITE would land like kv's and the byte
 *            check would fail; tried, as were an access-0 region given
 *            remote read, rdma_cm ignoring the cookie and a constant PSN:
 *            each fails this program; a PD shared by the contexts of one
 *            device would let the READ of "other" through).  Printed, not
 *            asserted: that A, knowing the rkey and address of the
 *            unpublished "secret", reads it (rkeys are capabilities of the
 *            protection domain, not bound to a peer or QP; rxe's are
 *            index << 8 | 8 random bits), and the rkeys T's regions got.
 *
 *   lazy     (authenticated: a context AL of A's kind with HIXL_VERBS_LAZY=1,
 *            so its pair with T has no QP until first use) verbs' own QP
 *            messages, forged through the library's control connection:
 *            a QP_READY and a QP_ACCEPT T never asked for (wrong state,
 *            random generation) are dropped, AL stays connected and its
 *            first put then makes the QPs and lands; a QP_REQ for QPs the
 *            pair has is dropped and data still moves; so are a QP_RELEASED
 *            and a QP_WAIT T never asked for and a QP_QUIESCE for other QPs
 *            (a stale generation); the right QP_QUIESCE makes T drain and
 *            take down that pair's QPs -- the forger's own, nothing else --
 *            and T goes on serving; a QP_REQ whose QP
 *            count, blob length or MTU is not the pair's, a QP_REQ or
 *            QP_QUIESCE without a generation, and any QP message on a pair whose QPs were made
 *            in its handshake (A, HIXL_VERBS_LAZY=0) cut the sender off: T
 *            drops it within the liveness bound and keeps serving L.
 *
 * Every case ends checking that the legitimate peer was served meanwhile
 * (round trips, every byte), that T still serves it, and that no protected
 * byte of T or T2 changed.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../src/verbs/verbs_int.h"
#include "../common/cases.h"

#define TOKEN "hostile-verbs-secret"
#define REG (64u * 1024)
#define LEGIT_SPAN 4096u /* kv [0, 4 KiB): the legitimate peer's */
#define GUARD_OFF 8192u  /* kv [8, 9 KiB): nobody may write it in "unbound" */
#define GUARD_LEN 1024u
#define CONTROL_OFF 16384u /* kv [16, 17 KiB): the forged-WRITE control */
#define ATTACK_IMM 0xbad00000u

/* ------------------------------------------------------------ the setup */

enum { KV, RO, NONE, SECRET, OTHER, NREG };
static const char *const reg_name[NREG] = {"kv", "ro", "none", "secret", "other"};
static const unsigned reg_access[NREG] = {HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC,
                                          HIXL_ACCESS_READ, 0, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE,
                                          HIXL_ACCESS_READ | HIXL_ACCESS_WRITE};
static uint8_t *reg_buf[NREG], *reg_copy[NREG];
static hixl_mr_t *reg_mr[NREG];

static hixl_ctx_t *target, *target2, *legit, *att;
static hixl_peer_t *to_target;
static hixl_rmr_t *legit_kv;
static const char *target_dev, *peer_dev;

static hixl_ctx_t *mk_ctx(const char *dev)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.listen = "127.0.0.1:0";
  cfg.transports = "verbs";
  cfg.auth_token = TOKEN;
  cfg.timeout_ms = 10000;
  cfg.net_dev = dev;
  hixl_ctx_t *c = NULL;
  if (hixl_ctx_create(&cfg, &c) != HIXL_OK)
    return NULL;
  return c;
}

static uint8_t pat(int r, size_t i) { return (uint8_t)(0x21 * (r + 1) + i * 7 + (i >> 9)); }

static struct ibv_mr *nic_mr(int r) { return reg_mr[r]->tp[HIXL_TP_VERBS]; }

static void check_intact(const char *when)
{
  for (int r = 0; r < NREG; r++) {
    size_t from = 0, to = REG;
    if (r == KV) { /* only the guard area of kv is protected */
      from = GUARD_OFF;
      to = GUARD_OFF + GUARD_LEN;
    }
    for (size_t i = from; i < to; i++)
      if (reg_buf[r][i] != reg_copy[r][i])
        fail_msg("%s: byte %zu of \"%s\" changed (0x%02x, was 0x%02x)", when, i, reg_name[r],
                 reg_buf[r][i], reg_copy[r][i]);
  }
}

/* No notification reached T: the legitimate peer sends none, so any would
 * be forged. */
static void check_no_notifications(void)
{
  hixl_notif_t n;
  int got = hixl_notif_poll(target, &n, 1);
  if (got > 0)
    fail_msg("the target delivered a notification (imm 0x%x, len %zu)", n.imm, n.len);
}

/* ------------------------------------------------- the legitimate peer */

static pthread_t legit_th;
static _Atomic bool legit_stop, legit_pause, legit_idle;
static _Atomic unsigned legit_rounds;
static char legit_err[256];

static bool legit_round(unsigned round)
{
  uint8_t out[256], in[256];
  for (size_t i = 0; i < sizeof(out); i++)
    out[i] = (uint8_t)(round * 31 + i);
  uint64_t off = (round % (LEGIT_SPAN / sizeof(out))) * sizeof(out);
  hixl_req_t *r = NULL;
  hixl_status_t st = hixl_put(to_target, out, sizeof(out), legit_kv, off, 0, &r);
  if (st >= 0)
    st = hixl_req_wait(r, 20000);
  hixl_req_free(r);
  if (st != HIXL_OK) {
    snprintf(legit_err, sizeof(legit_err), "round %u: put: %s (%s)", round, hixl_strerror(st),
             hixl_last_error());
    return false;
  }
  r = NULL;
  st = hixl_get(to_target, in, sizeof(in), legit_kv, off, 0, &r);
  if (st >= 0)
    st = hixl_req_wait(r, 20000);
  hixl_req_free(r);
  if (st != HIXL_OK) {
    snprintf(legit_err, sizeof(legit_err), "round %u: get: %s (%s)", round, hixl_strerror(st),
             hixl_last_error());
    return false;
  }
  if (memcmp(in, out, sizeof(in)) != 0) {
    snprintf(legit_err, sizeof(legit_err), "round %u: read back other bytes than put", round);
    return false;
  }
  return true;
}

static void *legit_main(void *arg)
{
  (void)arg;
  while (!atomic_load(&legit_stop)) {
    if (atomic_load(&legit_pause)) {
      atomic_store(&legit_idle, true);
      usleep(1000);
      continue;
    }
    atomic_store(&legit_idle, false);
    if (!legit_round(atomic_load(&legit_rounds) + 1))
      break;
    atomic_fetch_add(&legit_rounds, 1);
    usleep(1000);
  }
  return NULL;
}

static void legit_start(void)
{
  legit_err[0] = 0;
  atomic_store(&legit_stop, false);
  atomic_store(&legit_pause, false);
  atomic_store(&legit_idle, false);
  atomic_store(&legit_rounds, 0);
  assert_int_equal(pthread_create(&legit_th, NULL, legit_main, NULL), 0);
}

/* Pause (true: until it is idle) or resume the legitimate peer. */
static void legit_hold(bool hold)
{
  atomic_store(&legit_pause, hold);
  while (hold && !atomic_load(&legit_idle) && !legit_err[0])
    usleep(1000);
}

/* Stop the legitimate peer and check it was served all along, then once
 * more now. */
static void legit_finish(const char *what)
{
  for (int i = 0; i < 1000 && atomic_load(&legit_rounds) < 3 && !legit_err[0]; i++)
    usleep(10000);
  atomic_store(&legit_stop, true);
  pthread_join(legit_th, NULL);
  unsigned n = atomic_load(&legit_rounds);
  print_message("%s: %u legitimate round trips meanwhile\n", what, n);
  if (legit_err[0])
    fail_msg("%s: the legitimate peer failed: %s", what, legit_err);
  assert_true(n >= 3);
  assert_true(legit_round(1000000));
  check_intact(what);
  check_no_notifications();
}

/* --------------------------------------------------- target internals */

/* owner's verbs state of the peer whose context is remote_id (its QP
 * numbers), waiting up to 5 s for the owner to finish its side of the
 * handshake (hixl_connect may return first). */
static vrb_peer_t *target_side_of(hixl_ctx_t *owner, uint64_t remote_id)
{
  vrb_peer_t *vp = NULL;
  for (int i = 0; i < 500 && vp == NULL; i++) {
    pthread_mutex_lock(&owner->lock);
    for (hixl_peer_t *p = owner->peers; p && !vp; p = p->next)
      if (p->remote_ctx_id == remote_id && atomic_load(&p->state) == HIXL_PEER_UP &&
          p->ops == &hixl__verbs_ops)
        vp = p->tp;
    pthread_mutex_unlock(&owner->lock);
    if (vp == NULL)
      usleep(10000);
  }
  return vp;
}

static int peers_up(hixl_ctx_t *c)
{
  int n = 0;
  pthread_mutex_lock(&c->lock);
  for (hixl_peer_t *p = c->peers; p; p = p->next)
    n += atomic_load(&p->state) == HIXL_PEER_UP;
  pthread_mutex_unlock(&c->lock);
  return n;
}

/* The device name of a context ("rxe1" of "rxe1:1"). */
static void dev_name(hixl_ctx_t *c, char *out, size_t n)
{
  snprintf(out, n, "%s", hixl__vc(c)->name);
  out[strcspn(out, ":")] = 0;
}

static uint64_t counter(const char *dev, const char *name)
{
  char path[256];
  snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/hw_counters/%s", dev, name);
  FILE *f = fopen(path, "r");
  unsigned long long v = 0;
  if (f) {
    if (fscanf(f, "%llu", &v) != 1)
      v = 0;
    fclose(f);
  }
  return v;
}

/* ------------------------------------------------ raw ibverbs attacker */

typedef struct raw {
  struct ibv_context *dev;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  uint8_t *buf;
  struct ibv_mr *mr;
  uint8_t port;
  int gidx;
  union ibv_gid gid;
} raw_t;
#define RAW_BUF 4096

/* A PD, CQ, RC QP and a 4 KiB MR of our own on device `name`, using the
 * GID index hixl picked there (gidx). */
static void raw_open(raw_t *r, const char *name, uint8_t port, int gidx)
{
  memset(r, 0, sizeof(*r));
  int n = 0;
  struct ibv_device **l = ibv_get_device_list(&n);
  for (int i = 0; l && i < n && !r->dev; i++)
    if (strcmp(ibv_get_device_name(l[i]), name) == 0)
      r->dev = ibv_open_device(l[i]);
  if (l)
    ibv_free_device_list(l);
  assert_non_null(r->dev);
  r->port = port;
  r->gidx = gidx;
  assert_int_equal(ibv_query_gid(r->dev, port, gidx, &r->gid), 0);
  r->pd = ibv_alloc_pd(r->dev);
  r->cq = r->pd ? ibv_create_cq(r->dev, 64, NULL, NULL, 0) : NULL;
  assert_non_null(r->cq);
  struct ibv_qp_init_attr qa = {.send_cq = r->cq,
                                .recv_cq = r->cq,
                                .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = 16,
                                        .max_recv_wr = 16,
                                        .max_send_sge = 1,
                                        .max_recv_sge = 1,
                                        .max_inline_data = 64}};
  r->qp = ibv_create_qp(r->pd, &qa);
  assert_non_null(r->qp);
  r->buf = aligned_alloc(4096, RAW_BUF);
  r->mr = ibv_reg_mr(r->pd, r->buf, RAW_BUF,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                         IBV_ACCESS_REMOTE_ATOMIC);
  assert_non_null(r->mr);
}

static void raw_close(raw_t *r)
{
  ibv_destroy_qp(r->qp);
  ibv_dereg_mr(r->mr);
  free(r->buf);
  ibv_destroy_cq(r->cq);
  ibv_dealloc_pd(r->pd);
  ibv_close_device(r->dev);
}

/* RESET -> INIT -> RTR -> RTS towards (dgid, dqpn), entirely on our side:
 * nothing on the other side agrees to it.  Short ACK timeout, no retries
 * (rxe treats retry_cnt 7 as "forever"). */
static void raw_connect(raw_t *r, const union ibv_gid *dgid, uint32_t dqpn, uint32_t sq_psn,
                        uint32_t rq_psn)
{
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
  assert_int_equal(ibv_modify_qp(r->qp, &a, IBV_QP_STATE), 0);
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_INIT,
                           .port_num = r->port,
                           .qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                                              IBV_ACCESS_REMOTE_ATOMIC};
  assert_int_equal(
      ibv_modify_qp(r->qp, &a,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
      0);
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR,
                           .path_mtu = IBV_MTU_1024,
                           .dest_qp_num = dqpn,
                           .rq_psn = rq_psn & 0xffffff,
                           .max_dest_rd_atomic = 16,
                           .min_rnr_timer = 1};
  a.ah_attr.port_num = r->port;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = *dgid;
  a.ah_attr.grh.sgid_index = (uint8_t)r->gidx;
  a.ah_attr.grh.hop_limit = 64;
  assert_int_equal(ibv_modify_qp(r->qp, &a,
                                 IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                     IBV_QP_MIN_RNR_TIMER),
                   0);
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS,
                           .sq_psn = sq_psn & 0xffffff,
                           .timeout = 12,
                           .retry_cnt = 1,
                           .rnr_retry = 0,
                           .max_rd_atomic = 16};
  assert_int_equal(ibv_modify_qp(r->qp, &a,
                                 IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
                   0);
}

static const char *opstr(enum ibv_wr_opcode op)
{
  return op == IBV_WR_RDMA_READ              ? "READ"
         : op == IBV_WR_RDMA_WRITE           ? "WRITE"
         : op == IBV_WR_ATOMIC_FETCH_AND_ADD ? "FETCH_ADD"
                                             : "other";
}

/* Post n work requests (chained, all signaled) and wait for their n
 * completions; returns how many succeeded, and the first status seen. */
static int raw_run(raw_t *r, struct ibv_send_wr *wr, int n, enum ibv_wc_status *first)
{
  for (int i = 0; i < n; i++) {
    wr[i].wr_id = (uint64_t)i;
    wr[i].send_flags |= IBV_SEND_SIGNALED;
    wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
  }
  struct ibv_send_wr *bad;
  assert_int_equal(ibv_post_send(r->qp, wr, &bad), 0);
  int done = 0, ok = 0;
  *first = IBV_WC_SUCCESS;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (done < n) {
    struct ibv_wc wc[16];
    int k = ibv_poll_cq(r->cq, 16, wc);
    assert_true(k >= 0);
    for (int i = 0; i < k; i++) {
      if (done + i == 0)
        *first = wc[i].status;
      ok += wc[i].status == IBV_WC_SUCCESS;
    }
    done += k;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (k == 0) {
      if (t.tv_sec - t0.tv_sec > 20)
        fail_msg("the attacker's %d work requests did not complete in 20 s", n);
      usleep(200);
    }
  }
  return ok;
}

static struct ibv_sge sge(raw_t *r, size_t off, uint32_t len)
{
  return (struct ibv_sge){(uintptr_t)(r->buf + off), len, r->mr->lkey};
}

/* ---------------------------------------------------------------- cases */

static int setup(void **state)
{
  (void)state;
  target_dev = getenv("HIXL_TEST_TARGET_NET_DEV");
  peer_dev = getenv("HIXL_NET_DEV");
  target = mk_ctx(target_dev);
  target2 = mk_ctx(target_dev);
  legit = mk_ctx(peer_dev);
  att = mk_ctx(peer_dev);
  if (!target || !target2 || !legit || !att)
    return -1;
  for (int r = 0; r < NREG; r++) {
    reg_buf[r] = aligned_alloc(4096, REG);
    reg_copy[r] = malloc(REG);
    for (size_t i = 0; i < REG; i++)
      reg_buf[r][i] = pat(r, i);
    memcpy(reg_copy[r], reg_buf[r], REG);
    assert_int_equal(
        hixl_mr_reg(r == OTHER ? target2 : target, reg_buf[r], REG, reg_access[r], &reg_mr[r]),
        HIXL_OK);
    if (r != SECRET && r != OTHER)
      assert_int_equal(hixl_mr_publish(reg_mr[r], reg_name[r]), HIXL_OK);
  }
  assert_int_equal(hixl_connect(legit, hixl_ctx_address(target), 10000, &to_target), HIXL_OK);
  assert_string_equal(hixl_peer_transport(to_target), "verbs");
  assert_int_equal(hixl_rmr_lookup(to_target, "kv", 10000, &legit_kv), HIXL_OK);
  for (int r = 0; r < NREG; r++)
    print_message("%s: access %u, NIC lkey 0x%08x rkey 0x%08x at %p\n", reg_name[r], reg_access[r],
                  nic_mr(r)->lkey, nic_mr(r)->rkey, (void *)reg_buf[r]);
  return 0;
}

static int teardown(void **state)
{
  (void)state;
  hixl_rmr_release(legit_kv);
  hixl_ctx_destroy(att);
  hixl_ctx_destroy(legit);
  hixl_ctx_destroy(target2);
  hixl_ctx_destroy(target);
  for (int r = 0; r < NREG; r++) {
    free(reg_buf[r]);
    free(reg_copy[r]);
  }
  return 0;
}

#ifdef HIXL_HAVE_RDMACM
/* One rdma_cm connection request from the legitimate peer's address to T's
 * listener with private data pd (len bytes); returns the event it got. */
static enum rdma_cm_event_type cm_try(const void *pd, uint8_t len)
{
  vrb_ctx_t *tv = hixl__vc(target), *lv = hixl__vc(legit);
  struct sockaddr_in src = {.sin_family = AF_INET},
                     dst = {.sin_family = AF_INET, .sin_port = htons(tv->cm_port)};
  memcpy(&src.sin_addr, lv->gid.raw + 12, 4);
  memcpy(&dst.sin_addr, tv->gid.raw + 12, 4);
  struct rdma_event_channel *ch = rdma_create_event_channel();
  assert_non_null(ch);
  struct rdma_cm_id *id = NULL;
  enum rdma_cm_event_type got = RDMA_CM_EVENT_ADDR_ERROR;
  for (int attempt = 0; attempt < 5 && got != RDMA_CM_EVENT_ADDR_RESOLVED; attempt++) {
    if (id)
      rdma_destroy_id(id);
    assert_int_equal(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), 0);
    assert_int_equal(rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 1000),
                     0);
    struct rdma_cm_event *ev;
    assert_int_equal(rdma_get_cm_event(ch, &ev), 0);
    got = ev->event;
    rdma_ack_cm_event(ev);
  }
  assert_int_equal(got, RDMA_CM_EVENT_ADDR_RESOLVED);
  assert_int_equal(rdma_resolve_route(id, 2000), 0);
  struct rdma_cm_event *ev;
  assert_int_equal(rdma_get_cm_event(ch, &ev), 0);
  assert_int_equal(ev->event, RDMA_CM_EVENT_ROUTE_RESOLVED);
  rdma_ack_cm_event(ev);
  struct ibv_qp_init_attr qa = {
      .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
  assert_int_equal(rdma_create_qp(id, NULL, &qa), 0);
  struct rdma_conn_param cp = {.private_data = pd,
                               .private_data_len = len,
                               .responder_resources = 1,
                               .initiator_depth = 1,
                               .retry_count = 1,
                               .rnr_retry_count = 1};
  assert_int_equal(rdma_connect(id, &cp), 0);
  struct pollfd pf = {.fd = ch->fd, .events = POLLIN};
  assert_int_equal(poll(&pf, 1, 15000), 1);
  assert_int_equal(rdma_get_cm_event(ch, &ev), 0);
  got = ev->event;
  rdma_ack_cm_event(ev);
  if (got == RDMA_CM_EVENT_ESTABLISHED)
    rdma_disconnect(id);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  return got;
}
#endif

/* rdmacm: the target's rdma_cm listener takes only requests carrying the
 * cookie of a VERBS_QP reply (handed out on an authenticated control
 * connection). */
static void test_rdmacm(void **state)
{
  (void)state;
#ifndef HIXL_HAVE_RDMACM
  skip();
#else
  if (hixl__vc(target)->cm_listen == NULL)
    skip();
  int peers0 = peers_up(target);
  legit_start();
  /* cm.c's private data: {u64 cookie, u32 QP index, u32 magic "hixc"};
   * cookies 0 and 1, random ones (with and without the magic), an index
   * past any peer's QPs. */
  enum { MAGIC = 0x68697863u };
  struct {
    uint64_t cookie;
    uint32_t index, magic;
  } pd[7] = {{0, 0, MAGIC},  {1, 0, MAGIC}, {0, 0, MAGIC},    {0, 0, MAGIC},
             {0, 15, MAGIC}, {0, 0, 0},     {~0ull, 0, MAGIC}};
  for (int i = 2; i < 6; i++)
    pd[i].cookie = (uint64_t)random() << 33 ^ (uint64_t)random() << 11 ^ (uint64_t)random();
  int tries = 0;
  for (size_t i = 0; i < sizeof(pd) / sizeof(pd[0]); i++) {
    enum rdma_cm_event_type got = cm_try(&pd[i], sizeof(pd[i]));
    tries++;
    if (got != RDMA_CM_EVENT_REJECTED)
      fail_msg("connection request %zu (cookie %#llx index %u): %s, not REJECTED", i,
               (unsigned long long)pd[i].cookie, pd[i].index, rdma_event_str(got));
  }
  /* No private data, and a short one. */
  assert_int_equal(cm_try(NULL, 0), RDMA_CM_EVENT_REJECTED);
  assert_int_equal(cm_try("hixc", 4), RDMA_CM_EVENT_REJECTED);
  tries += 2;
  print_message("rdmacm: %d connection requests without a valid cookie, all rejected\n", tries);
  assert_int_equal(peers_up(target), peers0);
  legit_finish("rdmacm");
#endif
}

/* pd: T's rkeys from a QP in another protection domain on T's device. */
static void test_foreign_pd(void **state)
{
  (void)state;
  vrb_ctx_t *tv = hixl__vc(target);
  char dev[64];
  dev_name(target, dev, sizeof(dev));
  raw_t a;
  raw_open(&a, dev, tv->port, tv->gid_index);
  legit_start();
  enum ibv_wc_status first;
  /* Control: the self-connected QP reads and writes our own MR. */
  memset(a.buf, 0x11, 64);
  memset(a.buf + 1024, 0, 64);
  raw_connect(&a, &a.gid, a.qp->qp_num, 100, 100);
  struct ibv_sge s = sge(&a, 1024, 64);
  struct ibv_send_wr wr = {.sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_READ};
  wr.wr.rdma.remote_addr = (uintptr_t)a.buf;
  wr.wr.rdma.rkey = a.mr->rkey;
  assert_int_equal(raw_run(&a, &wr, 1, &first), 1);
  assert_int_equal(a.buf[1024], 0x11);
  /* T's regions with their real rkeys and addresses. */
  static const enum ibv_wr_opcode ops[] = {IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE,
                                           IBV_WR_ATOMIC_FETCH_AND_ADD};
  int refused = 0;
  for (int r = KV; r <= SECRET; r++)
    for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
      raw_connect(&a, &a.gid, a.qp->qp_num, 200 + (uint32_t)o, 200 + (uint32_t)o);
      memset(a.buf + 2048, 0x77, 64);
      s = sge(&a, ops[o] == IBV_WR_RDMA_WRITE ? 0 : 2048,
              ops[o] == IBV_WR_ATOMIC_FETCH_AND_ADD ? 8 : 64);
      wr = (struct ibv_send_wr){.sg_list = &s, .num_sge = 1, .opcode = ops[o]};
      uint64_t raddr = (uintptr_t)reg_buf[r] + (r == KV ? GUARD_OFF : 0);
      if (ops[o] == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        wr.wr.atomic.remote_addr = raddr;
        wr.wr.atomic.rkey = nic_mr(r)->rkey;
        wr.wr.atomic.compare_add = 1;
      } else {
        wr.wr.rdma.remote_addr = raddr;
        wr.wr.rdma.rkey = nic_mr(r)->rkey;
      }
      int ok = raw_run(&a, &wr, 1, &first);
      if (ok != 0 || a.buf[2048] != 0x77)
        fail_msg("a QP of another PD did %s on \"%s\" with its rkey", opstr(ops[o]), reg_name[r]);
      if (first != IBV_WC_REM_ACCESS_ERR)
        print_message("pd: %s on \"%s\": %s\n", opstr(ops[o]), reg_name[r],
                      ibv_wc_status_str(first));
      refused++;
    }
  print_message("pd: %d operations with the target's own rkeys from another PD on %s, all "
                "refused (remote access error)\n",
                refused, dev);
  raw_close(&a);
  legit_finish("pd");
}

/* unbound: one try of a QP moved to RTS by the attacker alone towards
 * T's QP qpn, first PSN psn: WRITE, READ, FETCH_ADD, WRITE_WITH_IMM and
 * SEND with T's real kv rkey at kv's guard area.  Returns how many
 * completed. */
static int unbound_try(raw_t *a, uint32_t qpn, uint32_t psn, uint32_t imm, const char *what)
{
  raw_connect(a, &hixl__vc(target)->gid, qpn, psn, 0);
  memset(a->buf, 0xa5, RAW_BUF);
  memcpy(a->buf + 3072, &imm, 4); /* the notification message a SEND carries (deliver()) */
  struct ibv_sge s[5] = {sge(a, 0, 64), sge(a, 1024, 64), sge(a, 2048, 8), sge(a, 0, 8),
                         sge(a, 3072, 16)};
  struct ibv_send_wr wr[5] = {
      {.sg_list = &s[0], .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE},
      {.sg_list = &s[1], .num_sge = 1, .opcode = IBV_WR_RDMA_READ},
      {.sg_list = &s[2], .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD},
      {.sg_list = &s[3],
       .num_sge = 1,
       .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
       .imm_data = htonl(imm)},
      {.sg_list = &s[4], .num_sge = 1, .opcode = IBV_WR_SEND}};
  uint64_t guard = (uintptr_t)reg_buf[KV] + GUARD_OFF;
  for (int i = 0; i < 4; i++) {
    wr[i].wr.rdma.remote_addr = guard + 256 * (uint64_t)i;
    wr[i].wr.rdma.rkey = nic_mr(KV)->rkey;
  }
  wr[2].wr.atomic.remote_addr = guard + 512;
  wr[2].wr.atomic.rkey = nic_mr(KV)->rkey;
  wr[2].wr.atomic.compare_add = 1;
  enum ibv_wc_status first;
  int ok = raw_run(a, wr, 5, &first);
  if (ok)
    print_message("unbound (%s): QPN %#x PSN %#x: %d work requests completed\n", what, qpn, psn,
                  ok);
  for (int i = 1024; i < 1024 + 64; i++)
    if (a->buf[i] != 0xa5)
      fail_msg("unbound (%s): the READ brought bytes of kv (QPN %#x, PSN %#x)", what, qpn, psn);
  check_intact("unbound");
  return ok;
}

/* unbound's control: the attack reaches T's QP, and only the PSN stops it.
 * A second peer P (context A, which knows the token) connects and goes
 * idle; T's QP for it is asked for the PSN it expects next (ibv_query_qp:
 * an oracle a blind attacker does not have, it would have to find it among
 * 2^24), and the attacker's unbound QP on P's device sends one WRITE with
 * it: that WRITE must land in kv (else the negative results above would
 * prove nothing).  Printed, not asserted: P's next put, whose PSN the
 * attacker used up, is acknowledged as a duplicate and not applied; the one
 * after lands again. */
static void unbound_control(const char *dev, uint8_t port, int gidx)
{
  hixl_peer_t *p;
  hixl_rmr_t *r;
  assert_int_equal(hixl_connect(att, hixl_ctx_address(target), 10000, &p), HIXL_OK);
  assert_int_equal(hixl_rmr_lookup(p, "kv", 10000, &r), HIXL_OK);
  uint8_t out[256];
  memset(out, 0x42, sizeof(out));
  hixl_req_t *q = NULL;
  assert_true(hixl_put(p, out, sizeof(out), r, CONTROL_OFF + 2048, 0, &q) >= 0);
  assert_int_equal(hixl_req_wait(q, 20000), HIXL_OK);
  hixl_req_free(q);
  vrb_peer_t *tp = target_side_of(target, att->id);
  assert_non_null(tp);
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qia;
  assert_int_equal(ibv_query_qp(tp->qps[0]->qp, &qa, IBV_QP_RQ_PSN, &qia), 0);
  raw_t a;
  raw_open(&a, dev, port, gidx);
  raw_connect(&a, &hixl__vc(target)->gid, tp->qps[0]->qp->qp_num, qa.rq_psn, 0);
  memset(a.buf, 0xa5, 256);
  struct ibv_sge s = sge(&a, 0, 256);
  struct ibv_send_wr wr = {.sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
  wr.wr.rdma.remote_addr = (uintptr_t)reg_buf[KV] + CONTROL_OFF + 4096;
  wr.wr.rdma.rkey = nic_mr(KV)->rkey;
  enum ibv_wc_status first;
  raw_run(&a, &wr, 1, &first); /* T's ACK goes to P's QP: ours times out */
  raw_close(&a);
  bool landed = true;
  for (int i = 0; i < 256; i++)
    landed &= reg_buf[KV][CONTROL_OFF + 4096 + i] == 0xa5;
  print_message("unbound: control: WRITE from an unbound QP on %s with the PSN T expects (%#x): "
                "%s (the attacker's own completion: %s)\n",
                dev, qa.rq_psn, landed ? "landed in kv" : "did not land", ibv_wc_status_str(first));
  assert_true(landed);
  for (int i = 0; i < 2; i++) {
    memset(out, 0x50 + i, sizeof(out));
    q = NULL;
    hixl_status_t st =
        hixl_put(p, out, sizeof(out), r, CONTROL_OFF + 8192 + 256 * (uint64_t)i, 0, &q);
    if (st >= 0)
      st = hixl_req_wait(q, 20000);
    hixl_req_free(q);
    print_message("unbound: control: the peer's %s put after it: %s, %s\n", i ? "second" : "next",
                  hixl_strerror(st),
                  memcmp(reg_buf[KV] + CONTROL_OFF + 8192 + 256 * i, out, sizeof(out)) == 0
                      ? "applied"
                      : "NOT applied (acknowledged as a duplicate)");
  }
  hixl_rmr_release(r);
  hixl_disconnect(p);
}

/* unbound: QPs moved to RTS by the attacker alone towards T's QP numbers:
 * those of the legitimate peer's QPs and their neighbours. */
static void test_unbound_qp(void **state)
{
  (void)state;
  vrb_peer_t *tl = target_side_of(target, legit->id);
  assert_non_null(tl);
  vrb_ctx_t *tv = hixl__vc(target), *lv = hixl__vc(legit);
  char tdev[64], ldev[64];
  dev_name(target, tdev, sizeof(tdev));
  dev_name(legit, ldev, sizeof(ldev));
  /* From T's own device (another IP than the QP's peer), then from the
   * legitimate peer's (its IP: only the PSN is unknown). */
  struct {
    const char *dev;
    uint8_t port;
    int gidx;
    const char *what;
  } from[2] = {{tdev, tv->port, tv->gid_index, "another IP"},
               {ldev, lv->port, lv->gid_index, "the legitimate peer's IP"}};
  legit_start();
  uint32_t imm = ATTACK_IMM;
  for (int f = 0; f < 2; f++) {
    raw_t a;
    raw_open(&a, from[f].dev, from[f].port, from[f].gidx);
    /* A QP not moved to RTS cannot send at all. */
    struct ibv_qp_attr qa = {.qp_state = IBV_QPS_RESET};
    assert_int_equal(ibv_modify_qp(a.qp, &qa, IBV_QP_STATE), 0);
    struct ibv_sge s0 = sge(&a, 0, 8);
    struct ibv_send_wr w0 = {.sg_list = &s0, .num_sge = 1, .opcode = IBV_WR_SEND}, *bad;
    assert_int_not_equal(ibv_post_send(a.qp, &w0, &bad), 0);
    uint32_t qpns[VRB_MAX_QPS * 5];
    int nq = 0;
    for (int i = 0; i < tl->nq; i++)
      for (int d = -2; d <= 2; d++) {
        uint32_t n = tl->qps[i]->qp->qp_num + (uint32_t)d;
        if (f == 0 && n == a.qp->qp_num)
          continue; /* ours, on the same device: not one of T's */
        qpns[nq++] = n;
      }
    /* Quiet: the legitimate peer paused, so the counters of T's device
     * show the attacker's packets alone (PSNs 0 and 2^23-1). */
    legit_hold(true);
    uint64_t c0[4] = {counter(tdev, "rcvd_pkts"), counter(tdev, "duplicate_request"),
                      counter(tdev, "out_of_seq_request"), counter(from[f].dev, "sent_pkts")};
    int tries = 0, ok = 0;
    for (int q = 0; q < nq; q++)
      for (int k = 0; k < 2; k++, tries++)
        ok += unbound_try(&a, qpns[q], k ? 0x7fffff : 0, imm++, from[f].what);
    uint64_t c1[4] = {counter(tdev, "rcvd_pkts"), counter(tdev, "duplicate_request"),
                      counter(tdev, "out_of_seq_request"), counter(from[f].dev, "sent_pkts")};
    legit_hold(false);
    print_message("unbound (%s): %d tries at %d QP numbers, the legitimate peer paused: %s "
                  "sent_pkts +%llu; %s rcvd_pkts +%llu, duplicate_request +%llu, "
                  "out_of_seq_request +%llu\n",
                  from[f].what, tries, nq, from[f].dev, (unsigned long long)(c1[3] - c0[3]), tdev,
                  (unsigned long long)(c1[0] - c0[0]), (unsigned long long)(c1[1] - c0[1]),
                  (unsigned long long)(c1[2] - c0[2]));
    /* Then with random PSNs while the legitimate peer runs. */
    for (int q = 0; q < nq; q++)
      for (int k = 0; k < 2; k++, tries++)
        ok += unbound_try(&a, qpns[q], (uint32_t)random(), imm++, from[f].what);
    print_message("unbound (%s): %d tries in all, %d work requests completed\n", from[f].what,
                  tries, ok);
    assert_int_equal(ok, 0);
    raw_close(&a);
  }
  unbound_control(ldev, lv->port, lv->gid_index);
  legit_finish("unbound");
}

/* ----------------------------------------------- forged keys, with auth */

enum { OP_GET, OP_PUT, OP_FAA };

/* A connects (the library's handshake), looks up `name`, forges the rmr
 * (access all, and the NIC rkey, base and length when given), runs op on
 * [off, off+len) and returns its status.  A's peer is closed after. */
static int forged_peers0;          /* T's peers up before A's first connection */
static uint32_t forged_psn[2][32]; /* T's first PSNs (receive, send) for each of A's QPs */
static int forged_n, forged_qp_err;
static char forged_msg[1024]; /* hixl_last_error() after the refusal */

static hixl_status_t forged(const char *name, int op, uint64_t off, size_t len, bool set_rkey,
                            uint32_t rkey, uint64_t base, uint64_t rlen, uint8_t *io)
{
  /* T has dropped A's previous peer (its QP in the error state). */
  for (int i = 0; i < 400 && peers_up(target) > forged_peers0; i++)
    usleep(25000);
  assert_int_equal(peers_up(target), forged_peers0);
  hixl_peer_t *p;
  assert_int_equal(hixl_connect(att, hixl_ctx_address(target), 10000, &p), HIXL_OK);
  /* The PSNs T's QP for A starts from: the 24 bits that, with the QP number
   * and the peer's IP, are all that bind RC packets to the connection (see
   * unbound); they must differ for every connection. */
  vrb_peer_t *tp = target_side_of(target, att->id);
  assert_non_null(tp);
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qia;
  assert_int_equal(ibv_query_qp(tp->qps[0]->qp, &qa, IBV_QP_RQ_PSN | IBV_QP_SQ_PSN, &qia), 0);
  if (forged_n < 32) {
    forged_psn[0][forged_n] = qa.rq_psn;
    forged_psn[1][forged_n++] = qa.sq_psn;
  }
  hixl_rmr_t *r;
  assert_int_equal(hixl_rmr_lookup(p, name, 10000, &r), HIXL_OK);
  r->access = HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC;
  if (set_rkey)
    r->tp_key[0] = rkey;
  if (base)
    r->base = base;
  if (rlen)
    r->len = rlen;
  hixl_req_t *q = NULL;
  uint64_t old = 0;
  hixl_status_t st = op == OP_GET   ? hixl_get(p, io, len, r, off, 0, &q)
                     : op == OP_PUT ? hixl_put(p, io, len, r, off, 0, &q)
                                    : hixl_atomic_faa(p, r, off, 1, &old, 0, &q);
  if (st >= 0)
    st = hixl_req_wait(q, 20000);
  snprintf(forged_msg, sizeof(forged_msg), "%s", st != HIXL_OK ? hixl_last_error() : "");
  /* Refused: T's QP for A went to the error state too (an RC responder's
   * class C error); T still holds it (it frees a lost peer's transport
   * state under its lock, after a grace period). */
  for (int i = 0; st != HIXL_OK && i < 200; i++) {
    int state = -1;
    pthread_mutex_lock(&target->lock);
    for (hixl_peer_t *tpp = target->peers; tpp; tpp = tpp->next)
      if (tpp->tp == tp && tpp->ops == &hixl__verbs_ops &&
          ibv_query_qp(tp->qps[0]->qp, &qa, IBV_QP_STATE, &qia) == 0)
        state = qa.qp_state;
    pthread_mutex_unlock(&target->lock);
    forged_qp_err += state == IBV_QPS_ERR;
    if (state == IBV_QPS_ERR || state == -1)
      break;
    if (i == 199)
      fail_msg("the target's QP for A is in state %d, not ERROR, after the refusal", state);
    usleep(10000);
  }
  hixl_req_free(q);
  hixl_rmr_release(r);
  hixl_disconnect(p);
  return st;
}

static void expect_refused(const char *what, hixl_status_t st)
{
  print_message("forged: %-58s %s\n", what, hixl_strerror(st));
  if (st == HIXL_OK)
    fail_msg("forged: %s: the NIC let it through", what);
  /* A remote access error (IBV_WC_REM_ACCESS_ERR) is ACCESS; anything else
   * (a timeout, a lost peer) would not show the NIC's check. */
  assert_int_equal(st, HIXL_ERR_ACCESS);
  /* The message says what the NIC said, where, and the usual cause: the
   * work completion's status and vendor code, our NIC, port and GID index,
   * the peer's GID, and the stale-key hint (docs/errors.md). */
  const char *nic = getenv("HIXL_NET_DEV");
  const char *want[] = {
      "remote access error", "(status 10, vendor error", " port ",          "GID index", "to GID ",
      "stale rkey",          "peer down: verbs: a ",     nic ? nic : " on "};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
    if (strstr(forged_msg, want[i]) == NULL)
      fail_msg("forged: %s: the error does not say \"%s\": %s", what, want[i], forged_msg);
  check_intact(what);
}

static void test_forged_keys(void **state)
{
  (void)state;
  uint8_t io[256];
  forged_peers0 = peers_up(target);
  forged_n = forged_qp_err = 0;
  legit_start();
  /* Controls: the forging path works where the NIC grants the access. */
  memset(io, 0x3c, sizeof(io));
  assert_int_equal(forged("kv", OP_PUT, CONTROL_OFF, sizeof(io), false, 0, 0, 0, io), HIXL_OK);
  assert_memory_equal(reg_buf[KV] + CONTROL_OFF, io, sizeof(io));
  memset(io, 0, sizeof(io));
  assert_int_equal(forged("ro", OP_GET, 0, sizeof(io), false, 0, 0, 0, io), HIXL_OK);
  assert_memory_equal(io, reg_buf[RO], sizeof(io));
  print_message("forged: controls: a forged WRITE into kv landed, a forged READ of ro read it\n");

  uint32_t none_rkey_given; /* what TP_MR hands out for an access-0 region */
  {
    hixl_peer_t *p;
    hixl_rmr_t *r;
    for (int i = 0; i < 400 && peers_up(target) > forged_peers0; i++)
      usleep(25000);
    assert_int_equal(hixl_connect(att, hixl_ctx_address(target), 10000, &p), HIXL_OK);
    assert_int_equal(hixl_rmr_lookup(p, "none", 10000, &r), HIXL_OK);
    none_rkey_given = (uint32_t)r->tp_key[0];
    hixl_rmr_release(r);
    hixl_disconnect(p);
  }
  print_message("forged: the target hands out NIC rkey 0x%08x for \"none\" (access 0; its lkey "
                "is 0x%08x)\n",
                none_rkey_given, nic_mr(NONE)->lkey);

  memset(io, 0xee, sizeof(io));
  expect_refused("WRITE into \"ro\" (READ only)",
                 forged("ro", OP_PUT, 0, sizeof(io), false, 0, 0, 0, io));
  expect_refused("FETCH_ADD on \"ro\" (READ only)", forged("ro", OP_FAA, 0, 8, false, 0, 0, 0, io));
  expect_refused("READ of \"none\" (access 0), rkey as handed out",
                 forged("none", OP_GET, 0, sizeof(io), false, 0, 0, 0, io));
  expect_refused("WRITE into \"none\" (access 0), rkey as handed out",
                 forged("none", OP_PUT, 0, sizeof(io), false, 0, 0, 0, io));
  expect_refused("READ of \"none\" (access 0) with its lkey as rkey",
                 forged("none", OP_GET, 0, sizeof(io), true, nic_mr(NONE)->lkey, 0, 0, io));
  expect_refused("READ past the end of \"ro\" (its rkey, longer length)",
                 forged("ro", OP_GET, REG, sizeof(io), false, 0, 0, 2 * REG, io));
  uint64_t secret = (uintptr_t)reg_buf[SECRET];
  expect_refused("READ of unpublished \"secret\" with kv's rkey",
                 forged("kv", OP_GET, 0, sizeof(io), false, 0, secret, REG, io));
  expect_refused(
      "WRITE into unpublished \"secret\", rkey off by one bit",
      forged("kv", OP_PUT, 0, sizeof(io), true, nic_mr(SECRET)->rkey ^ 1, secret, REG, io));
  expect_refused("READ of T2's \"other\" (another PD) with its real rkey",
                 forged("kv", OP_GET, 0, sizeof(io), true, nic_mr(OTHER)->rkey,
                        (uintptr_t)reg_buf[OTHER], REG, io));

  /* Not enforced, printed: the rkey is all it takes. */
  memset(io, 0, sizeof(io));
  hixl_status_t st =
      forged("kv", OP_GET, 0, sizeof(io), true, nic_mr(SECRET)->rkey, secret, REG, io);
  print_message("forged: NOT ENFORCED: READ of unpublished \"secret\" with its real rkey "
                "0x%08x: %s%s\n",
                nic_mr(SECRET)->rkey, hixl_strerror(st),
                st == HIXL_OK && memcmp(io, reg_buf[SECRET], sizeof(io)) == 0
                    ? " (its bytes read: rkeys are capabilities of the PD)"
                    : "");
  check_intact("forged");
  /* T dropped every peer A left (their QPs in the error state). */
  for (int i = 0; i < 400 && peers_up(target) > forged_peers0; i++)
    usleep(25000);
  assert_int_equal(peers_up(target), forged_peers0);
  for (int i = 0; i < forged_n; i++)
    for (int j = 0; j < i; j++)
      for (int k = 0; k < 2; k++)
        if (forged_psn[k][i] == forged_psn[k][j])
          fail_msg("connections %d and %d of A started from the same %s PSN %#x", j, i,
                   k ? "send" : "receive", forged_psn[k][i]);
  print_message("forged: %d connections of A, their QPs' first PSNs all different (e.g. %#x, "
                "%#x)\n",
                forged_n, forged_psn[0][0], forged_psn[0][forged_n - 1]);
  print_message("forged: the target's QP for A in the error state after %d of the 9 "
                "refusals\n",
                forged_qp_err);
  assert_int_equal(forged_qp_err, 9);
  legit_finish("forged");
}

/* ------------------------------------------------ lazy QPs' messages */

/* A verbs TP_REQ of kind from peer p, forged: the generation, QP count and
 * MTU given, our GID and nq - 1 made-up QPNs in the blob (blob_len as
 * given, or the right one for nq when 0). */
static hixl_status_t lazy_send(hixl_peer_t *p, uint32_t kind, uint64_t gen, uint64_t nq,
                               uint64_t mtu, uint32_t blob_len)
{
  hixl_msg_t m;
  memset(&m, 0, sizeof(m));
  m.type = HIXL_MSG_TP_REQ;
  VRB_LZ(&m)->kind = kind;
  VRB_LZ(&m)->gen = gen;
  VRB_LZ(&m)->nqps = nq;
  VRB_LZ(&m)->mtu = mtu;
  VRB_LZ(&m)->qpn = 0x11 + (uint32_t)random() % 1000;
  VRB_LZ(&m)->psn = (uint32_t)random() & 0xffffff;
  memcpy(m.blob, hixl__vc(p->ctx)->gid.raw, 16);
  m.blob_len = blob_len ? blob_len : (uint32_t)(16 + 4 * (nq > 0 ? nq - 1 : 0));
  return hixl__send(p, &m, NULL, 0);
}

/* p's pair is cut off by T: p goes down (T closed it) within the bound. */
static void expect_cut(hixl_peer_t *p, int up_before, const char *what)
{
  for (int i = 0; i < 600 && peers_up(target) >= up_before; i++)
    usleep(25000);
  if (peers_up(target) >= up_before)
    fail_msg("lazy: %s: T still serves the sender", what);
  print_message("lazy: %s: T cut the sender off\n", what);
  (void)p;
}

/* A put of 256 bytes at CONTROL_OFF + 256 * k through p that must land. */
static void lazy_put(hixl_peer_t *p, hixl_rmr_t *r, int k, const char *what)
{
  uint8_t io[256];
  memset(io, 0x50 + k, sizeof(io));
  assert_int_equal(hixl_put(p, io, sizeof(io), r, CONTROL_OFF + 256u * (unsigned)k, 0, NULL),
                   HIXL_OK);
  if (hixl_fence(p->ctx, p, 30000) != HIXL_OK)
    fail_msg("lazy: %s: %s", what, hixl_last_error());
  assert_memory_equal(reg_buf[KV] + CONTROL_OFF + 256u * (unsigned)k, io, sizeof(io));
}

static void test_lazy_msgs(void **state)
{
  (void)state;
  legit_start();
  /* Read when AL's verbs is set up, at its first connect. */
  setenv("HIXL_VERBS_LAZY", "1", 1);
  hixl_ctx_t *al = mk_ctx(peer_dev);
  assert_non_null(al);
  int up0 = peers_up(target);
  hixl_peer_t *p;
  hixl_rmr_t *r;
  assert_int_equal(hixl_connect(al, hixl_ctx_address(target), 10000, &p), HIXL_OK);
  setenv("HIXL_VERBS_LAZY", "0", 1);
  assert_int_equal(hixl_rmr_lookup(p, "kv", 10000, &r), HIXL_OK);
  vrb_peer_t *tv = target_side_of(target, al->id);
  assert_non_null(tv);
  assert_true(tv->lazy);
  assert_null(tv->qps[0]->qp); /* no QP before first use */
  /* Unasked for: dropped, nothing made, still connected. */
  assert_int_equal(lazy_send(p, VRB_KIND_QP_READY, 0x1234567, 0, 0, 16), HIXL_OK);
  assert_int_equal(lazy_send(p, VRB_KIND_QP_ACCEPT, 0x7654321, 1, IBV_MTU_1024, 0), HIXL_OK);
  usleep(300000);
  assert_int_equal(peers_up(target), up0 + 1);
  assert_null(tv->qps[0]->qp);
  lazy_put(p, r, 0, "first put after unasked-for messages");
  print_message("lazy: an unasked-for QP_READY and QP_ACCEPT dropped; the first put then made "
                "the QPs and landed\n");
  /* QPs it has: a new request is dropped, data still moves. */
  assert_int_equal(lazy_send(p, VRB_KIND_QP_REQ, 0x999, 1, IBV_MTU_1024, 0), HIXL_OK);
  usleep(300000);
  assert_int_equal(peers_up(target), up0 + 1);
  lazy_put(p, r, 1, "a put after a QP_REQ for QPs it has");
  print_message("lazy: a QP_REQ for QPs the pair has dropped; data still moves\n");
  /* Reclaim's messages unasked for, or for other QPs: dropped. */
  assert_int_equal(lazy_send(p, VRB_KIND_QP_RELEASED, tv->gen, 0, 0, 16), HIXL_OK);
  assert_int_equal(lazy_send(p, VRB_KIND_QP_WAIT, tv->gen, 0, 0, 16), HIXL_OK);
  assert_int_equal(lazy_send(p, VRB_KIND_QP_QUIESCE, tv->gen ^ 2, 0, 0, 16), HIXL_OK);
  usleep(300000);
  assert_int_equal(peers_up(target), up0 + 1);
  assert_int_equal(atomic_load(&tv->qs), VQ_READY);
  lazy_put(p, r, 2, "a put after an unasked-for QP_RELEASED, QP_WAIT and a stale QP_QUIESCE");
  print_message("lazy: an unasked-for QP_RELEASED and QP_WAIT, a QP_QUIESCE for other QPs: "
                "dropped; data still moves\n");
  /* The right QP_QUIESCE (AL's library does not know it was sent): T
   * drains, takes its QPs down and answers -- it costs the forger its own
   * pair's QPs, nothing else; T still serves everyone. */
  int qps0 = atomic_load(&hixl__vc(target)->n_qps);
  assert_int_equal(lazy_send(p, VRB_KIND_QP_QUIESCE, tv->gen, 0, 0, 16), HIXL_OK);
  for (int i = 0; i < 200 && atomic_load(&tv->qs) != VQ_NONE; i++)
    usleep(10000);
  assert_int_equal(atomic_load(&tv->qs), VQ_NONE);
  assert_int_equal(atomic_load(&hixl__vc(target)->n_qps), qps0 - 1);
  assert_int_equal(peers_up(target), up0 + 1);
  print_message("lazy: a forged QP_QUIESCE took down the forger's own pair's QPs only\n");
  hixl_rmr_release(r);
  hixl_disconnect(p);
  for (int i = 0; i < 400 && peers_up(target) > up0; i++)
    usleep(25000);
  /* Malformed: each cuts the sender off (a fresh lazy pair each time). */
  struct {
    const char *what;
    uint32_t kind;
    uint64_t gen, nq, mtu;
    uint32_t blob;
  } bad[] = {
      {"QP_REQ with 2 QPs on a 1-QP pair", VRB_KIND_QP_REQ, 5, 2, IBV_MTU_1024, 0},
      {"QP_REQ with 20 QPs", VRB_KIND_QP_REQ, 5, 20, IBV_MTU_1024, 0},
      {"QP_REQ with a short blob", VRB_KIND_QP_REQ, 5, 1, IBV_MTU_1024, 8},
      {"QP_REQ with MTU 9", VRB_KIND_QP_REQ, 5, 1, 9, 0},
      {"QP_REQ without a generation", VRB_KIND_QP_REQ, 0, 1, IBV_MTU_1024, 0},
      {"QP_ACCEPT with 3 QPs", VRB_KIND_QP_ACCEPT, 5, 3, IBV_MTU_1024, 0},
      {"QP_QUIESCE without a generation", VRB_KIND_QP_QUIESCE, 0, 0, 0, 16},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    up0 = peers_up(target);
    assert_int_equal(hixl_connect(al, hixl_ctx_address(target), 10000, &p), HIXL_OK);
    assert_int_equal(lazy_send(p, bad[i].kind, bad[i].gen, bad[i].nq, bad[i].mtu, bad[i].blob),
                     HIXL_OK);
    expect_cut(p, up0 + 1, bad[i].what);
    hixl_disconnect(p);
  }
  /* A QP message on a pair whose QPs the handshake made. */
  up0 = peers_up(target);
  assert_int_equal(hixl_connect(att, hixl_ctx_address(target), 10000, &p), HIXL_OK);
  assert_int_equal(lazy_send(p, VRB_KIND_QP_REQ, 5, 1, IBV_MTU_1024, 0), HIXL_OK);
  expect_cut(p, up0 + 1, "QP_REQ on a pair made in its handshake");
  hixl_disconnect(p);
  hixl_ctx_destroy(al);
  check_intact("lazy");
  legit_finish("lazy");
}

int main(int argc, char **argv)
{
  /* The cases (tests/common/cases.h): --list prints them; none or "all"
   * runs every one. */
  const struct CMUnitTest all[] = {
      {"rdmacm", test_rdmacm, NULL, NULL, NULL},
      {"pd", test_foreign_pd, NULL, NULL, NULL},
      {"unbound", test_unbound_qp, NULL, NULL, NULL},
      {"forged", test_forged_keys, NULL, NULL, NULL},
      {"lazy", test_lazy_msgs, NULL, NULL, NULL},
  };
  cases_options(CASES(all), argc, argv);
  const char *which = argc > 1 && strcmp(argv[1], "all") != 0 ? argv[1] : NULL;
  if (which && cases_find(CASES(all), which) < 0)
    return 2;
  signal(SIGPIPE, SIG_IGN);
  /* These attackers aim at the QPs a handshake made (they read the target's
   * QP numbers and PSNs right after it): QPs made at connect, whatever the
   * default.  Lazy pairs' own messages are hostile/verbs_lazy's. */
  setenv("HIXL_VERBS_LAZY", "0", 1);
  srandom((unsigned)time(NULL) ^ (unsigned)getpid());
  /* The cases look at each context's verbs state (its NIC MRs, QPs, the
   * rdmacm listener) before any peer connects to some of them: set verbs
   * up at creation, not at the first connection (docs/scale.md). */
  setenv("HIXL_LAZY", "0", 1);
  /* Skip where no RDMA port is active (the host; the cases run in the rxe
   * guest). */
  hixl_ctx_t *probe = mk_ctx(getenv("HIXL_TEST_TARGET_NET_DEV"));
  if (probe == NULL) {
    printf("SKIP: no active RDMA port (%s)\n", hixl_last_error());
    return 77;
  }
  hixl_ctx_destroy(probe);
  return cases_run_cmocka("verbs_data", all, sizeof(all) / sizeof(all[0]), which, setup, teardown);
}

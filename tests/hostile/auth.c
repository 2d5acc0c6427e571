/* SPDX-License-Identifier: MIT */
/*
 * auth: the control handshake against fake targets and forging initiators
 * (issue 13, finding 10).  Before, HELLO carried the token in clear to
 * whatever answered on the port, the initiator went on with any HELLO_ACK,
 * and a refused HELLO_ACK still carried the target's ctx id, pid and host
 * id.  Now (src/core/auth.h) HELLO is a nonce, the target proves it knows
 * the token first, and a refusal carries nothing.
 *
 *   fake-target  a listener that does not know the token: the library's
 *                hixl_connect gets AUTH, sends nothing after HELLO (no
 *                token bytes, no AUTH, no identity); a listener that skips
 *                the challenge and answers HELLO_ACK OK at once (what the
 *                old protocol accepted) is refused too;
 *   refusal      a wire-level initiator with the wrong token gets a
 *                HELLO_ACK with status AUTH and no identity;
 *   replay       an AUTH computed for one connection replayed on another,
 *                the target's own proof reflected back as the initiator's,
 *                a second HELLO after the challenge: all refused; a
 *                legitimate peer is served throughout;
 *   max-peers    HIXL_MAX_PEERS caps authenticated inbound peers (AGAIN
 *                past it; a slot frees when a peer leaves).
 * Exit 0 on success, 1 on failure (the reason on stderr).
 */
#define _GNU_SOURCE
#include "hostile.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include "auth.h"
#include "wire.h"

static const char *const TOKEN = "s3cret-token-never-on-the-wire";

/* ---------------------------------------------------------- raw wire */

static void send_msg(int fd, hixl_msg_t *m)
{
  uint8_t buf[HIXL_WIRE_HDR + HIXL_WIRE_MAX];
  size_t n = hixl_wire_encode(m, buf, sizeof(buf));
  if (n == 0 || send(fd, buf, n, MSG_NOSIGNAL) != (ssize_t)n)
    FAIL("send %s: %s", hixl_wire_type_name(m->type), strerror(errno));
}

/* One message, or 0 at EOF / timeout (ms).  Raw bytes seen go to *log. */
static int recv_msg(int fd, hixl_msg_t *m, int timeout_ms, uint8_t *log, size_t *log_len)
{
  uint8_t buf[HIXL_WIRE_HDR + HIXL_WIRE_MAX];
  size_t have = 0, need = HIXL_WIRE_HDR;
  for (;;) {
    int r = hixl_wire_frame(buf, have, &need);
    if (r == HIXL_WIRE_OK)
      return hixl_wire_decode(buf, need, m) == HIXL_WIRE_OK ? 1 : -1;
    if (r == HIXL_WIRE_BAD)
      return -1;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0)
      return 0;
    ssize_t n = recv(fd, buf + have, need - have, 0);
    if (n <= 0)
      return 0;
    if (log) {
      memcpy(log + *log_len, buf + have, (size_t)n);
      *log_len += (size_t)n;
    }
    have += (size_t)n;
  }
}

static int dial(const char *addr)
{
  const char *colon = strrchr(addr, ':');
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)atoi(colon + 1)),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
    FAIL("connect %s: %s", addr, strerror(errno));
  return fd;
}

/* The other side closes within ms (EOF or reset; messages before it are
 * read and ignored). */
static bool closed_soon(int fd, int ms)
{
  uint8_t b[512];
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0)
      return false;
    ssize_t n = recv(fd, b, sizeof(b), 0);
    if (n <= 0)
      return true;
  }
}

/* The identity an AUTH carries, laid out as handshake.c's auth_identity. */
static size_t identity(const hixl_msg_t *m, uint8_t *buf)
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
  size_t sl = strlen(m->str[0]);
  memcpy(buf + n, m->str[0], sl + 1);
  return n + sl + 1;
}

/* HELLO, the challenge back; the nonces in nonces[64]. */
static void hello(int fd, uint8_t nonces[64], hixl_msg_t *chal)
{
  hixl_msg_t h = {.type = HIXL_MSG_HELLO, .blob_len = 32};
  hixl__auth_nonce(nonces);
  memcpy(h.blob, nonces, 32);
  send_msg(fd, &h);
  if (recv_msg(fd, chal, 5000, NULL, NULL) != 1 || chal->type != HIXL_MSG_AUTH_CHALLENGE ||
      chal->blob_len != 64)
    FAIL("no AUTH_CHALLENGE after HELLO");
  memcpy(nonces + 32, chal->blob, 32);
}

static hixl_msg_t auth_msg(const char *token, const uint8_t nonces[64])
{
  hixl_msg_t a = {.type = HIXL_MSG_AUTH};
  a.u32[0] = 0xf;
  a.u64[0] = 0x5eed;
  a.u32[1] = (uint32_t)getpid();
  snprintf(a.str[0], sizeof(a.str[0]), "shm");
  uint8_t id[512];
  hixl__auth_proof(token, HIXL_AUTH_LABEL_INITIATOR, nonces, nonces + 32, id, identity(&a, id),
                   a.blob);
  a.blob_len = 32;
  return a;
}

static void check_no_identity(const hixl_msg_t *ack, const char *what)
{
  static const uint8_t zero[32];
  if (ack->type != HIXL_MSG_HELLO_ACK || ack->status != HIXL_ERR_AUTH)
    FAIL("%s: expected HELLO_ACK/AUTH, got %s status %d", what, hixl_wire_type_name(ack->type),
         ack->status);
  if (ack->u64[0] || ack->u64[1] || ack->u32[0] || ack->u32[1] || memcmp(ack->host_id, zero, 32) ||
      ack->str[0][0])
    FAIL("%s: the refusal carries the target's identity (ctx %llx pid %u unix \"%s\")", what,
         (unsigned long long)ack->u64[0], ack->u32[1], ack->str[0]);
}

/* ------------------------------------------------------------ targets */

static hixl_ctx_t *mk_ctx(const char *token) { return hostile_ctx("shm", token, NULL, 0); }

/* A legitimate peer with the right token puts into the target's "kv". */
static void legit_put(hixl_ctx_t *target, uint8_t *kv, const char *when)
{
  hixl_ctx_t *c = mk_ctx(TOKEN);
  hixl_peer_t *p;
  hixl_rmr_t *r;
  char msg[32];
  snprintf(msg, sizeof(msg), "legit:%s", when);
  if (hixl_connect(c, hixl_ctx_address(target), 5000, &p) != HIXL_OK ||
      hixl_rmr_lookup(p, "kv", 5000, &r) != HIXL_OK ||
      hixl_put(p, msg, strlen(msg) + 1, r, 0, 0, NULL) != HIXL_OK ||
      hixl_fence(c, p, 5000) != HIXL_OK)
    FAIL("legitimate peer (%s): %s", when, hixl_last_error());
  if (strcmp((char *)kv, msg) != 0)
    FAIL("legitimate put (%s) did not land: \"%.31s\"", when, (char *)kv);
  hixl_rmr_release(r);
  hixl_disconnect(p);
  hixl_ctx_destroy(c);
}

/* --------------------------------------------------------- fake target */

typedef struct {
  hixl_ctx_t *ctx;
  char addr[64];
  hixl_status_t st;
  char err[512];
} dial_arg_t;

static void *dialer(void *arg)
{
  dial_arg_t *d = arg;
  hixl_peer_t *p;
  d->st = hixl_connect(d->ctx, d->addr, 5000, &p);
  snprintf(d->err, sizeof(d->err), "%s", hixl_last_error());
  if (d->st == HIXL_OK)
    hixl_disconnect(p);
  return NULL;
}

/* mode 0: answers HELLO with a challenge whose proof it cannot make;
 * mode 1: answers HELLO with HELLO_ACK OK at once (no challenge);
 * mode 2: knows the token (a proper challenge), then chooses a transport
 *         the initiator did not offer: one built and allowed here but with
 *         no device (verbs on a machine without RDMA), whose context state
 *         is NULL.  The initiator must refuse, not connect through it (it
 *         crashed: it checked what it allows, not what it has). */
static void fake_target(int mode)
{
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sa);
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, 4) ||
      getsockname(lfd, (struct sockaddr *)&sa, &sl))
    FAIL("listen: %s", strerror(errno));
  /* Mode 2's initiator allows verbs, which has no device here (this
   * suite runs on the host, without RDMA). */
  dial_arg_t d = {.ctx = hostile_ctx(mode == 2 ? "shm,verbs" : "shm", TOKEN, NULL, 0)};
  snprintf(d.addr, sizeof(d.addr), "127.0.0.1:%u", ntohs(sa.sin_port));
  pthread_t th;
  pthread_create(&th, NULL, dialer, &d);
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0)
    FAIL("accept: %s", strerror(errno));
  static uint8_t seen[1 << 16];
  size_t seen_len = 0;
  hixl_msg_t m;
  if (recv_msg(fd, &m, 5000, seen, &seen_len) != 1 || m.type != HIXL_MSG_HELLO)
    FAIL("fake target: no HELLO");
  if (m.blob_len != 32 || seen_len != HIXL_WIRE_HDR + 2 + 32)
    FAIL("fake target: HELLO is %zu bytes, expected only a 32-byte nonce", seen_len);
  hixl_msg_t reply = {.type = mode == 1 ? HIXL_MSG_HELLO_ACK : HIXL_MSG_AUTH_CHALLENGE};
  if (mode == 2) {
    uint8_t nonces[64];
    memcpy(nonces, m.blob, 32);
    hixl__auth_nonce(nonces + 32);
    memcpy(reply.blob, nonces + 32, 32);
    hixl__auth_proof(TOKEN, HIXL_AUTH_LABEL_TARGET, nonces, nonces + 32, NULL, 0, reply.blob + 32);
    reply.blob_len = 64;
    send_msg(fd, &reply);
    if (recv_msg(fd, &m, 5000, seen, &seen_len) != 1 || m.type != HIXL_MSG_AUTH)
      FAIL("fake target (mode 2): no AUTH after a proper challenge");
    uint32_t offered = m.u32[0]; /* the initiator's ready transports */
    uint32_t pick = 0;
    while (pick < 8 && (offered & (1u << pick)))
      pick++;
    reply = (hixl_msg_t){.type = HIXL_MSG_HELLO_ACK, .status = HIXL_OK};
    reply.u32[0] = pick == 0 ? 2 : pick; /* not offered (self is never negotiated) */
    reply.u64[0] = 0x1234;
    send_msg(fd, &reply);
    while (recv_msg(fd, &m, 3000, seen, &seen_len) == 1)
      ;
    pthread_join(th, NULL);
    if (d.st != HIXL_ERR_UNSUPPORTED || strstr(d.err, "did not offer") == NULL)
      FAIL("fake target (mode 2): hixl_connect returned %s (%s), expected UNSUPPORTED",
           hixl_strerror(d.st), d.err);
    printf("fake target (mode 2): refused with %s: %s\n", hixl_strerror(d.st), d.err);
    close(fd);
    close(lfd);
    hixl_ctx_destroy(d.ctx);
    return;
  }
  if (mode == 0) {
    hixl__auth_nonce(reply.blob);
    hixl__auth_nonce(reply.blob + 32); /* a proof made without the token */
    reply.blob_len = 64;
  } else {
    reply.status = HIXL_OK;
    reply.u32[0] = 1; /* "shm" */
    reply.u64[0] = 0x1234;
  }
  send_msg(fd, &reply);
  /* Whatever the initiator sends now is recorded until it closes. */
  while (recv_msg(fd, &m, 3000, seen, &seen_len) == 1)
    if (m.type == HIXL_MSG_AUTH)
      FAIL("fake target (mode %d): the initiator sent AUTH (its identity and proof)", mode);
  pthread_join(th, NULL);
  if (memmem(seen, seen_len, TOKEN, strlen(TOKEN)) != NULL)
    FAIL("fake target: the token crossed the wire");
  if (seen_len != HIXL_WIRE_HDR + 2 + 32)
    FAIL("fake target (mode %d): the initiator sent %zu bytes after HELLO", mode,
         seen_len - (HIXL_WIRE_HDR + 2 + 32));
  if (mode == 0 && (d.st != HIXL_ERR_AUTH || strstr(d.err, "did not prove") == NULL))
    FAIL("fake target: hixl_connect returned %s (%s), expected HIXL_ERR_AUTH", hixl_strerror(d.st),
         d.err);
  if (mode == 1 && d.st == HIXL_OK)
    FAIL("fake target without a challenge: hixl_connect succeeded");
  printf("fake target (mode %d): refused with %s: %s\n", mode, hixl_strerror(d.st), d.err);
  close(fd);
  close(lfd);
  hixl_ctx_destroy(d.ctx);
}

/* ------------------------------------------------- forging initiators */

static int refusal(void)
{
  hixl_ctx_t *t = mk_ctx(TOKEN);
  void *kv = publish_region(t, "kv");
  int fd = dial(hixl_ctx_address(t));
  uint8_t nonces[64];
  hixl_msg_t chal, ack;
  hello(fd, nonces, &chal);
  /* The challenge itself says nothing about the target. */
  if (chal.u64[0] || chal.u32[1])
    FAIL("the challenge carries identity");
  hixl_msg_t a = auth_msg("a-wrong-token", nonces);
  send_msg(fd, &a);
  if (recv_msg(fd, &ack, 5000, NULL, NULL) != 1)
    FAIL("refusal: no HELLO_ACK");
  check_no_identity(&ack, "wrong token");
  if (!closed_soon(fd, 5000))
    FAIL("refusal: the connection stays open");
  close(fd);
  /* The same exchange with the right token is accepted: the test's AUTH is
   * well formed, only the key differed. */
  fd = dial(hixl_ctx_address(t));
  hello(fd, nonces, &chal);
  uint8_t want[32];
  hixl__auth_proof(TOKEN, HIXL_AUTH_LABEL_TARGET, nonces, nonces + 32, NULL, 0, want);
  if (!hixl__auth_equal(want, chal.blob + 32))
    FAIL("the target's proof does not verify with the right token");
  a = auth_msg(TOKEN, nonces);
  send_msg(fd, &a);
  /* Authenticated: the ack names the target (its transport choice may
   * still refuse this made-up initiator, which claims another host). */
  if (recv_msg(fd, &ack, 5000, NULL, NULL) != 1 || ack.type != HIXL_MSG_HELLO_ACK ||
      ack.status == HIXL_ERR_AUTH || ack.u64[0] == 0)
    FAIL("the right token was refused (status %d)", ack.status);
  close(fd);
  legit_put(t, kv, "refusal");
  printf("refusal: no identity in a refused HELLO_ACK; right token accepted\n");
  hixl_ctx_destroy(t);
  return 0;
}

static int replay(void)
{
  hixl_ctx_t *t = mk_ctx(TOKEN);
  void *kv = publish_region(t, "kv");
  uint8_t n1[64], n2[64];
  hixl_msg_t chal, ack;
  /* A valid AUTH of connection 1 (as if recorded off the wire)... */
  int fd1 = dial(hixl_ctx_address(t));
  hello(fd1, n1, &chal);
  hixl_msg_t recorded = auth_msg(TOKEN, n1);
  /* ...replayed on connection 2, whose HELLO used the same nonce. */
  int fd2 = dial(hixl_ctx_address(t));
  hixl_msg_t h = {.type = HIXL_MSG_HELLO, .blob_len = 32};
  memcpy(h.blob, n1, 32);
  send_msg(fd2, &h);
  if (recv_msg(fd2, &chal, 5000, NULL, NULL) != 1 || chal.type != HIXL_MSG_AUTH_CHALLENGE)
    FAIL("replay: no challenge");
  memcpy(n2, n1, 32);
  memcpy(n2 + 32, chal.blob, 32);
  if (memcmp(n1 + 32, n2 + 32, 32) == 0)
    FAIL("replay: the target reused its nonce");
  send_msg(fd2, &recorded);
  if (recv_msg(fd2, &ack, 5000, NULL, NULL) != 1)
    FAIL("replay: no HELLO_ACK");
  check_no_identity(&ack, "replayed AUTH");
  close(fd2);
  close(fd1);
  /* Reflection: the target's own proof sent back as ours. */
  int fd3 = dial(hixl_ctx_address(t));
  uint8_t n3[64];
  hello(fd3, n3, &chal);
  hixl_msg_t refl = auth_msg("x", n3);
  memcpy(refl.blob, chal.blob + 32, 32);
  send_msg(fd3, &refl);
  if (recv_msg(fd3, &ack, 5000, NULL, NULL) != 1)
    FAIL("reflection: no HELLO_ACK");
  check_no_identity(&ack, "reflected proof");
  close(fd3);
  /* A second HELLO after the challenge (fishing for more proofs): dropped. */
  int fd4 = dial(hixl_ctx_address(t));
  uint8_t n4[64];
  hello(fd4, n4, &chal);
  send_msg(fd4, &h);
  if (!closed_soon(fd4, 5000))
    FAIL("a second HELLO was answered / the connection stays open");
  close(fd4);
  legit_put(t, kv, "replay");
  printf("replay: replayed AUTH, reflected proof and a second HELLO refused\n");
  hixl_ctx_destroy(t);
  return 0;
}

/* HIXL_MAX_PEERS=2: a third authenticated peer is refused with AGAIN (each
 * costs the target memory, and without a token anyone authenticates); once
 * one leaves, a new one is served. */
static int max_peers(void)
{
  setenv("HIXL_MAX_PEERS", "2", 1);
  hixl_ctx_t *t = mk_ctx(TOKEN);
  unsetenv("HIXL_MAX_PEERS");
  publish_region(t, "kv");
  hixl_ctx_t *c[3];
  hixl_peer_t *p[3];
  for (int i = 0; i < 3; i++) {
    c[i] = mk_ctx(TOKEN);
    hixl_status_t st = hixl_connect(c[i], hixl_ctx_address(t), 5000, &p[i]);
    if (i < 2 && st != HIXL_OK)
      FAIL("peer %d: %s", i, hixl_last_error());
    if (i == 2 && (st != HIXL_ERR_AGAIN || strstr(hixl_last_error(), "HIXL_MAX_PEERS") == NULL))
      FAIL("a third peer past HIXL_MAX_PEERS=2: %s (%s)", hixl_strerror(st), hixl_last_error());
  }
  printf("max-peers: third peer refused: %s\n", hixl_last_error());
  hixl_disconnect(p[0]);
  hixl_ctx_destroy(c[0]);
  /* The target sees the BYE / EOF asynchronously: retry for a while. */
  hixl_status_t st = HIXL_ERR_AGAIN;
  for (int i = 0; i < 100 && st == HIXL_ERR_AGAIN; i++) {
    st = hixl_connect(c[2], hixl_ctx_address(t), 5000, &p[2]);
    if (st == HIXL_ERR_AGAIN)
      usleep(50000);
  }
  if (st != HIXL_OK)
    FAIL("a peer after one left: %s", hixl_last_error());
  hixl_disconnect(p[2]);
  hixl_disconnect(p[1]);
  hixl_ctx_destroy(c[1]);
  hixl_ctx_destroy(c[2]);
  hixl_ctx_destroy(t);
  return 0;
}

static int run_fake_target(void)
{
  fake_target(0);
  fake_target(1);
  fake_target(2);
  return 0;
}

/* The cases (tests/common/cases.h): --list prints them. */
static const struct test_case cases[] = {
    {"fake-target", run_fake_target},
    {"refusal", refusal},
    {"replay", replay},
    {"max-peers", max_peers},
};

int main(int argc, char **argv)
{
  cases_options(CASES(cases), argc, argv);
  if (argc < 2)
    return hostile_usage(CASES(cases), argv[0], "CASE");
  return cases_run(cases, sizeof(cases) / sizeof(cases[0]), argv[1]);
}

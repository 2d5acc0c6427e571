/* SPDX-License-Identifier: MIT */
/*
 * tls: the optional TLS on TCP control connections (HIXL_TLS=1, tls.h).
 *
 *   sniff     initiator and target talk through a relay that records every
 *             byte of the TCP control connection; with TLS the recording
 *             holds no wire message (no "HIXL" magic), no region name and
 *             no token, and the data still moves; without TLS the same
 *             recording shows the magic and the region name (so the test
 *             sees what it claims to see).  Over shm (the TCP connection
 *             carries the handshake) and, when built, fabric (it carries
 *             every control message).
 *   mismatch  TLS initiator -> plain target, plain initiator -> TLS target,
 *             TLS with a wrong token: each fails with a clear error within
 *             its timeout, and the target then serves a proper peer;
 *             HIXL_TLS=1 without a token is refused at hixl_ctx_create.
 * Exit 0 on success, 1 on failure (the reason on stderr).
 */
#define _GNU_SOURCE
#include "hostile.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

static const char *const TOKEN = "tls-psk-token-0123456789";
static const char *const REGION = "kv-region-name-on-the-wire";
static const char *g_tp = "shm";

static hixl_ctx_t *mk_ctx(const char *token, bool tls)
{
  setenv("HIXL_TLS", tls ? "1" : "0", 1);
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.auth_token = token;
  cfg.transports = g_tp;
  cfg.timeout_ms = 3000;
  hixl_ctx_t *ctx;
  if (hixl_ctx_create(&cfg, &ctx) != HIXL_OK)
    FAIL("ctx (tls %d): %s", tls, hixl_last_error());
  unsetenv("HIXL_TLS");
  return ctx;
}

/* ------------------------------------------------------------- relay */

static uint8_t g_rec[1 << 20];
static size_t g_rec_len;
static pthread_mutex_t g_rec_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_lfd;
/* Each relay's own state: a relay of the last round may still be running
 * when the next starts (TSan saw the listening fd and target shared). */
typedef struct relay {
  int lfd;
  struct sockaddr_in target;
} relay_t;
typedef struct relay_c {
  int a;
  const relay_t *r;
} relay_c_t;

static void *relay_conn(void *arg)
{
  relay_c_t *rc = arg;
  int a = rc->a;
  struct sockaddr_in target = rc->r->target;
  free(rc);
  int b = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(b, (struct sockaddr *)&target, sizeof(target)) != 0)
    FAIL("relay: connect: %s", strerror(errno));
  struct pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
  uint8_t buf[65536];
  for (;;) {
    if (poll(p, 2, -1) < 0)
      break;
    int from = (p[0].revents & (POLLIN | POLLHUP | POLLERR)) ? 0 : 1;
    ssize_t n = recv(p[from].fd, buf, sizeof(buf), 0);
    if (n <= 0)
      break;
    pthread_mutex_lock(&g_rec_lock);
    if (g_rec_len + (size_t)n <= sizeof(g_rec)) {
      memcpy(g_rec + g_rec_len, buf, (size_t)n);
      g_rec_len += (size_t)n;
    }
    pthread_mutex_unlock(&g_rec_lock);
    if (send(p[!from].fd, buf, (size_t)n, MSG_NOSIGNAL) != n)
      break;
  }
  close(a);
  close(b);
  return NULL;
}

static void *relay_main(void *arg)
{
  const relay_t *r = arg; /* never freed: the program is short */
  for (;;) {
    int a = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (a < 0)
      return NULL;
    relay_c_t *rc = malloc(sizeof(*rc));
    if (rc == NULL)
      FAIL("relay: no memory");
    *rc = (relay_c_t){a, r};
    pthread_t t;
    pthread_create(&t, NULL, relay_conn, rc);
    pthread_detach(t);
  }
}

/* A relay in front of target address addr; returns the relay's address. */
static void relay_start(const char *addr, char *out, size_t cap)
{
  const char *colon = strrchr(addr, ':');
  char host[64];
  snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
  relay_t *r = calloc(1, sizeof(*r));
  if (r == NULL)
    FAIL("relay: no memory");
  r->target.sin_family = AF_INET;
  r->target.sin_port = htons((uint16_t)atoi(colon + 1));
  if (inet_pton(AF_INET, host, &r->target.sin_addr) != 1)
    FAIL("relay: target address %s", addr);
  g_lfd = r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sa);
  if (bind(g_lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(g_lfd, 8) ||
      getsockname(g_lfd, (struct sockaddr *)&sa, &sl))
    FAIL("relay: listen: %s", strerror(errno));
  snprintf(out, cap, "127.0.0.1:%u", ntohs(sa.sin_port));
  pthread_t t;
  pthread_create(&t, NULL, relay_main, r);
  pthread_detach(t);
}

/* A put and a get back through a peer of c connected to addr. */
static void move_data(hixl_ctx_t *c, const char *addr, const char *what)
{
  hixl_peer_t *p;
  hixl_rmr_t *r;
  char msg[64], back[64] = {0};
  snprintf(msg, sizeof(msg), "through the relay: %s", what);
  if (hixl_connect(c, addr, 5000, &p) != HIXL_OK || hixl_rmr_lookup(p, REGION, 5000, &r) ||
      hixl_put(p, msg, sizeof(msg), r, 0, 0, NULL) || hixl_fence(c, p, 5000) ||
      hixl_get(p, back, sizeof(back), r, 0, 0, NULL) || hixl_fence(c, p, 5000))
    FAIL("%s: %s", what, hixl_last_error());
  if (memcmp(msg, back, sizeof(msg)) != 0)
    FAIL("%s: the get did not return the put", what);
  hixl_rmr_release(r);
  hixl_disconnect(p);
}

static hixl_ctx_t *target(bool tls)
{
  hixl_ctx_t *t = mk_ctx(TOKEN, tls);
  publish_region(t, REGION);
  return t;
}

static size_t rec_len(void)
{
  pthread_mutex_lock(&g_rec_lock);
  size_t n = g_rec_len;
  pthread_mutex_unlock(&g_rec_lock);
  return n;
}

static size_t count(const void *needle, size_t n)
{
  size_t k = 0;
  pthread_mutex_lock(&g_rec_lock);
  for (const uint8_t *p = g_rec; (p = memmem(p, g_rec_len - (size_t)(p - g_rec), needle, n)); p++)
    k++;
  pthread_mutex_unlock(&g_rec_lock);
  return k;
}

static int sniff(void)
{
  for (int tls = 0; tls <= 1; tls++) {
    hixl_ctx_t *t = target(tls);
    char via[64];
    relay_start(hixl_ctx_address(t), via, sizeof(via));
    pthread_mutex_lock(&g_rec_lock);
    g_rec_len = 0;
    pthread_mutex_unlock(&g_rec_lock);
    hixl_ctx_t *c = mk_ctx(TOKEN, tls);
    move_data(c, via, tls ? "TLS" : "plain");
    hixl_ctx_destroy(c);
    hixl_ctx_destroy(t);
    close(g_lfd);
    usleep(100000); /* the relay threads see the close */
    static const uint8_t magic[4] = {'H', 'I', 'X', 'L'};
    size_t nmagic = count(magic, 4), nname = count(REGION, strlen(REGION)),
           ntok = count(TOKEN, strlen(TOKEN));
    printf("%s over %s: %zu bytes recorded, %zu wire headers, region name %zu times, token %zu\n",
           tls ? "TLS" : "plain", g_tp, rec_len(), nmagic, nname, ntok);
    if (ntok)
      FAIL("the token crossed the wire");
    if (tls && (nmagic || nname))
      FAIL("with TLS the relay saw %zu wire headers and the region name %zu times", nmagic, nname);
    if (!tls && nmagic == 0)
      FAIL("without TLS the relay saw no wire header: the recording is not the connection");
    if (!tls && strcmp(g_tp, "shm") != 0 && nname == 0)
      FAIL("without TLS the relay did not see the LOOKUP of the region");
  }
  return 0;
}

static int mismatch(void)
{
  /* No token: refused at creation. */
  setenv("HIXL_TLS", "1", 1);
  hixl_ctx_t *x;
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  if (hixl_ctx_create(&cfg, &x) != HIXL_ERR_INVALID || !strstr(hixl_last_error(), "token"))
    FAIL("HIXL_TLS=1 without a token: %s", hixl_last_error());
  unsetenv("HIXL_TLS");
  struct {
    bool target_tls, init_tls;
    const char *token;
  } cases[] = {{false, true, TOKEN}, {true, false, TOKEN}, {true, true, "wrong-token"}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    hixl_ctx_t *t = target(cases[i].target_tls);
    hixl_ctx_t *c = mk_ctx(cases[i].token, cases[i].init_tls);
    hixl_peer_t *p;
    hixl_status_t st = hixl_connect(c, hixl_ctx_address(t), 3000, &p);
    printf("target tls %d, initiator tls %d, token %s: %s: %s\n", cases[i].target_tls,
           cases[i].init_tls, cases[i].token == TOKEN ? "right" : "wrong", hixl_strerror(st),
           hixl_last_error());
    if (st == HIXL_OK)
      FAIL("case %zu connected", i);
    hixl_ctx_destroy(c);
    /* The target still serves a peer configured like it. */
    hixl_ctx_t *ok = mk_ctx(TOKEN, cases[i].target_tls);
    move_data(ok, hixl_ctx_address(t), "after a mismatch");
    hixl_ctx_destroy(ok);
    hixl_ctx_destroy(t);
  }
  return 0;
}

/* The cases (tests/common/cases.h): --list prints them. */
static const struct test_case cases[] = {
    {"sniff", sniff},
    {"mismatch", mismatch},
};

int main(int argc, char **argv)
{
  cases_options(CASES(cases), argc, argv);
  if (argc < 2)
    return hostile_usage(CASES(cases), argv[0], "CASE [transport]");
  if (argc > 2)
    g_tp = argv[2];
  return cases_run(cases, sizeof(cases) / sizeof(cases[0]), argv[1]);
}

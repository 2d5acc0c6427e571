/* SPDX-License-Identifier: MIT */
/* HIXL_METRICS (docs/observability.md): the context's counters as a
 * Prometheus text exposition, scraped with curl and checked with
 * Prometheus' own promtool (`promtool check metrics`, Debian's prometheus
 * package: scripts/deps.sh installs it; without it this test fails, it
 * does not skip); the values are those of hixl_ctx_stats; what a hostile
 * client can do (junk, an endless request head, connections that send
 * nothing, other methods and paths) gets an answer or a close and never
 * stops the control thread; a bad value or a taken port leaves the context
 * working, without the endpoint. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include <hixl.h>

static hixl_ctx_t *make_with_metrics(const char *spec)
{
  setenv("HIXL_METRICS", spec, 1);
  hixl_ctx_t *c = NULL;
  hixl_status_t st = unit_create("self,shm", 0, NULL, &c);
  unsetenv("HIXL_METRICS");
  if (st != HIXL_OK)
    fail_msg("hixl_ctx_create with HIXL_METRICS=%s: %s", spec, hixl_last_error());
  return c;
}

static int dial(int port)
{
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Send req raw, read until the server closes (5 s at most); the reply in
 * out (NUL-terminated), or "" when the connection was closed unanswered. */
static void raw(int port, const char *req, size_t req_len, char *out, size_t cap)
{
  int fd = dial(port);
  assert_true(fd >= 0);
  if (req_len)
    assert_int_equal(send(fd, req, req_len, MSG_NOSIGNAL), (ssize_t)req_len);
  size_t got = 0;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 5000) != 1)
      fail_msg("no answer or close within 5 s to %.40s", req);
    ssize_t r = recv(fd, out + got, cap - 1 - got, 0);
    if (r <= 0)
      break;
    got += (size_t)r;
    if (got == cap - 1)
      break;
  }
  out[got] = 0;
  close(fd);
}

static char *run(const char *cmd)
{
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t cap = 1 << 20, got = 0;
  char *buf = malloc(cap);
  size_t r;
  while ((r = fread(buf + got, 1, cap - 1 - got, f)) > 0)
    got += r;
  buf[got] = 0;
  int rc = pclose(f);
  if (rc != 0)
    fail_msg("`%s` failed (status %d):\n%s", cmd, rc, buf);
  return buf;
}

static uint64_t sample(const char *text, const char *metric)
{
  char key[160];
  snprintf(key, sizeof(key), "\n%s{", metric);
  const char *p = strstr(text, key);
  if (p == NULL)
    fail_msg("no sample of %s in:\n%.2000s", metric, text);
  p = strchr(p, '}');
  return strtoull(p + 1, NULL, 10);
}

static void scrape(void **state)
{
  (void)state;
  if (system("command -v promtool >/dev/null && command -v curl >/dev/null") != 0)
    fail_msg("promtool and curl are needed (Debian: apt-get install prometheus curl; "
             "scripts/deps.sh)");
  int port = unit_free_port();
  char spec[64];
  snprintf(spec, sizeof(spec), "127.0.0.1:%d", port);
  hixl_ctx_t *ctx = make_with_metrics(spec);
  hixl_mr_t *mr;
  unit_region(ctx, 4096, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &mr);
  hixl_peer_t *self = unit_connect(ctx, ctx, "self");
  hixl_rmr_t *r;
  assert_int_equal(hixl_rmr_lookup(self, "m", 10000, &r), HIXL_OK);
  char buf[64] = {0};
  for (int i = 0; i < 3; i++)
    assert_int_equal(hixl_put(self, buf, 64, r, 0, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_get(self, buf, 32, r, 0, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_put(self, buf, 64, r, 4090, 0, NULL), HIXL_ERR_NOT_REGISTERED);

  char cmd[256];
  snprintf(cmd, sizeof(cmd), "curl -sS --max-time 10 http://127.0.0.1:%d/metrics", port);
  char *text = run(cmd);
  assert_int_equal(sample(text, "hixl_put_ops_total"), 3);
  assert_int_equal(sample(text, "hixl_put_bytes_total"), 192);
  assert_int_equal(sample(text, "hixl_get_bytes_total"), 32);
  assert_non_null(strstr(text, "\nhixl_errors_total{context=\""));
  assert_non_null(strstr(text, ",status=\"not_registered\"} 1\n"));
  assert_non_null(strstr(text, "# TYPE hixl_peers gauge\n"));
  assert_non_null(strstr(text, "# TYPE hixl_wait_sleep_seconds_total counter\n"));
  /* Prometheus' own linter: the format parses and the names follow its
   * conventions (it prints nothing when all is well). */
  snprintf(cmd, sizeof(cmd),
           "curl -sS --max-time 10 http://127.0.0.1:%d/metrics | promtool check metrics 2>&1",
           port);
  char *lint = run(cmd);
  if (lint[0] != 0)
    fail_msg("promtool check metrics:\n%s", lint);
  free(lint);
  free(text);

  /* What a client can do wrong. */
  static char out[1 << 16];
  raw(port, "HEAD /metrics HTTP/1.1\r\n\r\n", 26, out, sizeof(out));
  assert_non_null(strstr(out, "HTTP/1.1 200 OK\r\n"));
  assert_null(strstr(out, "hixl_put_ops_total")); /* HEAD: no body */
  raw(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n", 29, out, sizeof(out));
  assert_non_null(strstr(out, "hixl_put_ops_total"));
  raw(port, "GET / HTTP/1.1\r\n\r\n", 18, out, sizeof(out));
  assert_non_null(strstr(out, "HTTP/1.1 404 "));
  raw(port, "POST /metrics HTTP/1.1\r\n\r\n", 26, out, sizeof(out));
  assert_non_null(strstr(out, "HTTP/1.1 405 "));
  raw(port, "\x01\x02garbage\r\n\r\n", 13, out, sizeof(out));
  assert_non_null(strstr(out, "HTTP/1.1 400 "));
  static char big[8192];
  memset(big, 'A', sizeof(big));
  raw(port, big, sizeof(big), out, sizeof(out));
  assert_non_null(strstr(out, "HTTP/1.1 431 "));
  int half = dial(port); /* half a request, then gone */
  assert_int_equal(send(half, "GET /metrics HTTP/1.1\r\n", 23, MSG_NOSIGNAL), 23);
  close(half);
  /* Connections that never send: the fifth sheds the oldest, and a
   * scrape still gets through; the control thread serves peers meanwhile. */
  int idle[8];
  for (int i = 0; i < 8; i++)
    assert_true((idle[i] = dial(port)) >= 0);
  raw(port, "GET /metrics HTTP/1.1\r\n\r\n", 25, out, sizeof(out));
  assert_non_null(strstr(out, "hixl_put_ops_total"));
  hixl_peer_t *again;
  hixl_ctx_t *other = make_with_metrics("");
  assert_int_equal(hixl_connect(other, hixl_ctx_address(ctx), 10000, &again), HIXL_OK);
  for (int i = 0; i < 8; i++)
    close(idle[i]);
  hixl_ctx_destroy(other);

  /* A second context asking for the same port, and values that do not
   * parse: the context works, without an endpoint. */
  hixl_ctx_t *dup = make_with_metrics(spec);
  hixl_ctx_t *bad = make_with_metrics("no-port-here");
  hixl_ctx_t *bad2 = make_with_metrics("127.0.0.1:99999");
  hixl_peer_t *p;
  assert_int_equal(hixl_connect(dup, hixl_ctx_address(bad), 10000, &p), HIXL_OK);
  hixl_ctx_destroy(dup);
  hixl_ctx_destroy(bad);
  hixl_ctx_destroy(bad2);
  /* hixl_config_t.metrics, without the environment. */
  int port2 = unit_free_port();
  char spec2[64];
  snprintf(spec2, sizeof(spec2), "127.0.0.1:%d", port2);
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.transports = "self";
  cfg.metrics = spec2;
  hixl_ctx_t *viacfg;
  assert_int_equal(hixl_ctx_create(&cfg, &viacfg), HIXL_OK);
  raw(port2, "GET /metrics HTTP/1.1\r\n\r\n", 25, out, sizeof(out));
  assert_non_null(strstr(out, "hixl_put_ops_total"));
  hixl_ctx_destroy(viacfg);
  /* The endpoint goes with its context. */
  hixl_ctx_destroy(ctx);
  assert_int_equal(dial(port), -1);
}

int main(void)
{
  const struct CMUnitTest tests[] = {cmocka_unit_test(scrape)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

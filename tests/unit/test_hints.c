/* SPDX-License-Identifier: MIT */
/* Errors that say what to do (issue 17, docs/errors.md): each usual cause
 * of a failed hixl_connect is brought about for real, and its message must
 * name the fix -- and never an auth token:
 *   refused    a loopback port nobody listens on;
 *   timeout    a listener whose accept queue is full (the kernel drops our
 *              SYN, as a firewall would);
 *   auth       no token against a target with one; another token;
 *   transport  no transport both sides allow. */
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

#include <hixl.h>

static hixl_ctx_t *make(const char *transports, const char *token)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.transports = transports;
  cfg.listen = "127.0.0.1:0";
  cfg.auth_token = token;
  hixl_ctx_t *c = NULL;
  if (hixl_ctx_create(&cfg, &c) != HIXL_OK)
    fail_msg("hixl_ctx_create: %s", hixl_last_error());
  return c;
}

static void expect(hixl_status_t got, hixl_status_t want, const char *const *words, size_t n)
{
  const char *e = hixl_last_error();
  if (got != want)
    fail_msg("got %s, want %s: %s", hixl_strerror(got), hixl_strerror(want), e);
  for (size_t i = 0; i < n; i++)
    if (strstr(e, words[i]) == NULL)
      fail_msg("the message does not say \"%s\": %s", words[i], e);
}

static void refused(void **state)
{
  (void)state;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof(a);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0); /* bound, not listening */
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
  char addr[64];
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", ntohs(a.sin_port));
  hixl_ctx_t *c = make("shm", NULL);
  hixl_peer_t *p;
  static const char *const w[] = {"Connection refused", "is the target running", "hixl_ctx_address",
                                  "HIXL_LISTEN", "loopback"};
  expect(hixl_connect(c, addr, 5000, &p), HIXL_ERR_PEER_LOST, w, 5);
  close(fd);
  hixl_ctx_destroy(c);
}

static void timeout(void **state)
{
  (void)state;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof(a);
  assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(lfd, 0), 0);
  assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &l), 0);
  /* Fill the accept queue (never accepted) until a connect gets no answer. */
  int fill[16], n = 0;
  for (; n < 16; n++) {
    fill[n] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(fill[n], (struct sockaddr *)&a, sizeof(a));
    struct pollfd p = {.fd = fill[n], .events = POLLOUT};
    if (poll(&p, 1, 300) == 0) {
      n++;
      break;
    }
  }
  char addr[64];
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", ntohs(a.sin_port));
  hixl_ctx_t *c = make("shm", NULL);
  hixl_peer_t *p;
  static const char *const w[] = {"timed out", "firewall", "nc -vz", "longer timeout"};
  expect(hixl_connect(c, addr, 500, &p), HIXL_ERR_TIMEOUT, w, 4);
  for (int i = 0; i < n; i++)
    close(fill[i]);
  close(lfd);
  hixl_ctx_destroy(c);
}

static void auth(void **state)
{
  (void)state;
  hixl_ctx_t *t = make("shm", "s3cret-target-0123456789"), *none = make("shm", NULL),
             *other = make("shm", "s3cret-other-0123456789");
  hixl_peer_t *p;
  static const char *const w_none[] = {"requires an auth token", "HIXL_AUTH_TOKEN"};
  expect(hixl_connect(none, hixl_ctx_address(t), 5000, &p), HIXL_ERR_AUTH, w_none, 2);
  static const char *const w_other[] = {"another one or none", "HIXL_AUTH_TOKEN"};
  expect(hixl_connect(other, hixl_ctx_address(t), 5000, &p), HIXL_ERR_AUTH, w_other, 2);
  assert_null(strstr(hixl_last_error(), "s3cret"));
  hixl_ctx_destroy(t);
  hixl_ctx_destroy(none);
  hixl_ctx_destroy(other);
}

static void transport(void **state)
{
  (void)state;
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 0);
  hixl_ctx_t *t = make("fabric", NULL), *c = make("shm", NULL);
  hixl_peer_t *p;
  static const char *const w[] = {"no common transport", "\"shm\"", "\"fabric\"",
                                  "HIXL_TRANSPORTS"};
  expect(hixl_connect(c, hixl_ctx_address(t), 5000, &p), HIXL_ERR_UNSUPPORTED, w, 4);
  hixl_ctx_destroy(t);
  hixl_ctx_destroy(c);
}

int main(void)
{
  const struct CMUnitTest tests[] = {cmocka_unit_test(refused), cmocka_unit_test(timeout),
                                     cmocka_unit_test(auth), cmocka_unit_test(transport)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

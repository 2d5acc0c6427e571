/* SPDX-License-Identifier: MIT */
/* Configuration: defaults, environment, and the parsers of user strings. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core.h"

static void test_defaults_and_env(void **state)
{
  (void)state;
  unsetenv("HIXL_TRANSPORTS");
  unsetenv("HIXL_TIMEOUT_MS");
  unsetenv("HIXL_PROGRESS_THREAD");
  hixl_config_t c;
  memset(&c, 0x5a, sizeof(c));
  hixl_config_init(&c);
  assert_null(c.transports);
  assert_int_equal(c.timeout_ms, 10000);
  assert_int_equal(c.progress_thread, 0);
  assert_int_equal(c.wait, HIXL_WAIT_ADAPTIVE);
  assert_int_equal(c.reserved_int, 0);
  for (int i = 0; i < 6; i++)
    assert_null(c.reserved[i]);
  assert_null(c.metrics); /* HIXL_METRICS unset */
  setenv("HIXL_TRANSPORTS", "shm", 1);
  setenv("HIXL_TIMEOUT_MS", "1234", 1);
  setenv("HIXL_PROGRESS_THREAD", "1", 1);
  setenv("HIXL_AUTH_TOKEN", "s3cret", 1);
  hixl_config_init(&c);
  assert_string_equal(c.transports, "shm");
  assert_int_equal(c.timeout_ms, 1234);
  assert_int_equal(c.progress_thread, 1);
  assert_string_equal(c.auth_token, "s3cret");
  /* Bad values are ignored (with a warning), defaults kept. */
  setenv("HIXL_TIMEOUT_MS", "-5", 1);
  setenv("HIXL_PROGRESS_THREAD", "yes", 1);
  hixl_config_init(&c);
  assert_int_equal(c.timeout_ms, 10000);
  assert_int_equal(c.progress_thread, 0);
  setenv("HIXL_PROGRESS_THREAD", "2", 1); /* event mode */
  hixl_config_init(&c);
  assert_int_equal(c.progress_thread, 2);
  setenv("HIXL_PROGRESS_THREAD", "3", 1);
  hixl_config_init(&c);
  assert_int_equal(c.progress_thread, 0);
  /* HIXL_WAIT: the three modes by name; anything else keeps the default. */
  const char *names[] = {"adaptive", "spin", "sleep"};
  for (int m = 0; m < 3; m++) {
    setenv("HIXL_WAIT", names[m], 1);
    hixl_config_init(&c);
    assert_int_equal(c.wait, m);
  }
  setenv("HIXL_WAIT", "busy", 1);
  hixl_config_init(&c);
  assert_int_equal(c.wait, HIXL_WAIT_ADAPTIVE);
  unsetenv("HIXL_WAIT");
  unsetenv("HIXL_TIMEOUT_MS");
  unsetenv("HIXL_PROGRESS_THREAD");
  unsetenv("HIXL_TRANSPORTS");
  unsetenv("HIXL_AUTH_TOKEN");
}

static void test_transports(void **state)
{
  (void)state;
  uint8_t order[HIXL_TP_MAX];
  int n;
  uint32_t mask;
  assert_int_equal(hixl__parse_transports(NULL, order, &n, &mask), HIXL_OK);
  int named = 0;
  for (int i = 0; i < HIXL_TP_MAX; i++)
    named += hixl__tp_names[i] != NULL;
  assert_int_equal(n, named); /* "all": every named transport */
  assert_int_equal(named, 4);
  assert_int_equal(hixl__parse_transports("verbs,shm,verbs", order, &n, &mask), HIXL_OK);
  assert_int_equal(n, 2);
  assert_string_equal(hixl__tp_names[order[0]], "verbs");
  assert_string_equal(hixl__tp_names[order[1]], "shm");
  assert_int_equal(mask, (1u << order[0]) | (1u << order[1]));
  assert_int_equal(hixl__parse_transports("shm,tcp", order, &n, &mask), HIXL_ERR_INVALID);
  assert_non_null(strstr(hixl_last_error(), "tcp"));
  assert_int_equal(hixl__parse_transports("sh", order, &n, &mask), HIXL_ERR_INVALID);
}

static void test_hostport(void **state)
{
  (void)state;
  char h[64], p[16];
  assert_int_equal(hixl__parse_hostport("10.0.0.1:1234", h, sizeof(h), p, sizeof(p)), HIXL_OK);
  assert_string_equal(h, "10.0.0.1");
  assert_string_equal(p, "1234");
  assert_int_equal(hixl__parse_hostport("[::1]:80", h, sizeof(h), p, sizeof(p)), HIXL_OK);
  assert_string_equal(h, "::1");
  assert_int_equal(hixl__parse_hostport(":0", h, sizeof(h), p, sizeof(p)), HIXL_OK);
  assert_string_equal(h, "");
  const char *bad[] = {"", "host", "host:", "host:65536", "host:-1", "::1:80", "[::1]80", "h:12x"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(hixl__parse_hostport(bad[i], h, sizeof(h), p, sizeof(p)), HIXL_ERR_INVALID);
  assert_int_equal(hixl__parse_hostport(NULL, h, sizeof(h), p, sizeof(p)), HIXL_ERR_INVALID);
  char tiny[4];
  assert_int_equal(hixl__parse_hostport("longhost:1", tiny, sizeof(tiny), p, sizeof(p)),
                   HIXL_ERR_INVALID);
}

static void test_strerror_total(void **state)
{
  (void)state;
  for (int s = HIXL_ERR_NO_DEVICE; s <= HIXL_INPROGRESS; s++)
    assert_null(strstr(hixl_strerror((hixl_status_t)s), "unknown"));
  assert_non_null(strstr(hixl_strerror((hixl_status_t)-99), "unknown"));
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults_and_env),
      cmocka_unit_test(test_transports),
      cmocka_unit_test(test_hostport),
      cmocka_unit_test(test_strerror_total),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

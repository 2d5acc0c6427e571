/* SPDX-License-Identifier: MIT */
/* What hixl_peer_remote_stats accepts from the other end (every byte of a
 * STATS_REPLY is the peer's): a sound reply is taken; each way of lying
 * about the header, the names or the values is refused, and the names a
 * peer can make us keep are bounded.  White-box: hixl__stats_reply_ok. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "core.h"

static hixl_ctx_t *ctx;

static int setup(void **state)
{
  (void)state;
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.transports = "self";
  return hixl_ctx_create(&cfg, &ctx) == HIXL_OK ? 0 : -1;
}

static int teardown(void **state)
{
  (void)state;
  hixl_ctx_destroy(ctx);
  return 0;
}

/* A reply carrying names (joined by '\n', all in str[0]) with values
 * 1, 2, ...: figures at .. at + n - 1 of total. */
static hixl_msg_t reply(uint32_t at, uint32_t total, const char *names)
{
  hixl_msg_t r = {.type = HIXL_MSG_STATS_REPLY, .status = HIXL_OK};
  snprintf(r.str[0], sizeof(r.str[0]), "%s", names);
  uint32_t n = 0;
  for (const char *p = names; *p; p++)
    n += *p == '\n';
  for (uint32_t i = 0; i < n; i++) {
    uint64_t v = htole64(i + 1);
    memcpy(r.blob + 8 * i, &v, 8);
  }
  r.blob_len = 8 * n;
  r.stats.first = at;
  r.stats.total = total;
  r.stats.n = n;
  return r;
}

static void sound(void **state)
{
  (void)state;
  hixl_stat_t s[8];
  hixl_msg_t r = reply(0, 3, "put_ops\nsome_new_figure\n");
  assert_true(hixl__stats_reply_ok(ctx, &r, 0, s, 8));
  assert_string_equal(s[0].name, "put_ops");
  assert_string_equal(s[0].help, "puts issued"); /* ours: our help */
  assert_int_equal(s[0].value, 1);
  assert_string_equal(s[1].name, "some_new_figure");
  assert_string_equal(s[1].help, ""); /* a newer peer's: no help */
  assert_int_equal(s[1].value, 2);
  /* str[1] continues str[0]; the last chunk may be short. */
  r = reply(2, 4, "a\n");
  snprintf(r.str[1], sizeof(r.str[1]), "b\n");
  r.stats.n = 2;
  r.blob_len = 16;
  assert_true(hixl__stats_reply_ok(ctx, &r, 2, s, 8));
  assert_string_equal(s[2].name, "a");
  assert_string_equal(s[3].name, "b");
  /* Room for fewer: nothing written past it. */
  memset(s, 0, sizeof(s));
  r = reply(0, 2, "put_ops\nget_ops\n");
  assert_true(hixl__stats_reply_ok(ctx, &r, 0, s, 1));
  assert_null(s[1].name);
}

static void lies(void **state)
{
  (void)state;
  hixl_stat_t s[8];
  hixl_msg_t r;
  r = reply(0, 2, "put_ops\nget_ops\n");
  r.status = HIXL_ERR_INVALID; /* not OK */
  assert_false(hixl__stats_reply_ok(ctx, &r, 0, s, 8));
  r = reply(1, 3, "put_ops\n"); /* not the part we asked for */
  assert_false(hixl__stats_reply_ok(ctx, &r, 0, s, 8));
  r = reply(0, 5000, "put_ops\n"); /* an absurd total */
  assert_false(hixl__stats_reply_ok(ctx, &r, 0, s, 8));
  r = reply(4, 3, ""); /* a total below where we are */
  assert_false(hixl__stats_reply_ok(ctx, &r, 4, s, 8));
  r = reply(0, 3, "put_ops\n");
  r.stats.n = 17; /* more than a reply holds */
  assert_false(hixl__stats_reply_ok(ctx, &r, 0, s, 8));
  r = reply(0, 3, "put_ops\n");
  r.blob_len = 16; /* values and names disagree */
  assert_false(hixl__stats_reply_ok(ctx, &r, 0, s, 8));
  r = reply(0, 3, "put_ops\nget_ops\n");
  r.stats.n = 1; /* more names than it says */
  r.blob_len = 8;
  assert_false(hixl__stats_reply_ok(ctx, &r, 0, s, 8));
  r = reply(0, 3, "put_ops\n");
  r.stats.n = 2; /* fewer */
  r.blob_len = 16;
  assert_false(hixl__stats_reply_ok(ctx, &r, 0, s, 8));
  r = reply(0, 1, "put_ops\nget_ops\n"); /* more than the total */
  assert_false(hixl__stats_reply_ok(ctx, &r, 0, s, 8));
  r = reply(0, 3, ""); /* nothing, with figures left */
  assert_false(hixl__stats_reply_ok(ctx, &r, 0, s, 8));
  const char *bad[] = {"Put_ops\n",
                       "put ops\n",
                       "\n",
                       "put_ops",
                       "p\xc3\xa9\n",
                       "a\x1b[2J\n",
                       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    r = reply(0, 3, bad[i]);
    if (r.stats.n == 0) { /* no newline: claim one figure anyway */
      r.stats.n = 1;
      r.blob_len = 8;
    }
    if (hixl__stats_reply_ok(ctx, &r, 0, s, 8))
      fail_msg("accepted the name of bad[%zu]", i);
  }
  /* str[0] without its NUL (256 name bytes) is cut, not read past. */
  r = reply(0, 3, "");
  memset(r.str[0], 'a', sizeof(r.str[0]));
  r.stats.n = 1;
  r.blob_len = 8;
  assert_false(hixl__stats_reply_ok(ctx, &r, 0, s, 8));
}

/* A peer inventing names cannot make us keep more than 512 of them. */
static void bounded(void **state)
{
  (void)state;
  hixl_stat_t s[1];
  int kept = 0, before = (int)ctx->n_stat_names; /* the earlier cases' */
  for (int i = 0; i < 2000; i++) {
    char name[32];
    snprintf(name, sizeof(name), "made_up_%d\n", i);
    hixl_msg_t r = reply(0, 1, name);
    kept += hixl__stats_reply_ok(ctx, &r, 0, s, 1);
  }
  assert_int_equal(kept + before, 512);
  assert_true(ctx->n_stat_names <= 512);
  /* Names already kept, and ours, still go through. */
  hixl_msg_t r = reply(0, 2, "made_up_7\nput_ops\n");
  hixl_stat_t two[2];
  assert_true(hixl__stats_reply_ok(ctx, &r, 0, two, 2));
}

int main(void)
{
  const struct CMUnitTest tests[] = {cmocka_unit_test(sound), cmocka_unit_test(lies),
                                     cmocka_unit_test(bounded)};
  return cmocka_run_group_tests(tests, setup, teardown);
}

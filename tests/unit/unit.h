/* SPDX-License-Identifier: MIT */
/* What the unit tests share: a context on loopback with the transports and
 * timeout a test asks for, and a figure of hixl_ctx_stats by name.  Include
 * after <cmocka.h> (these fail the test with fail_msg). */
#ifndef HIXL_TESTS_UNIT_H
#define HIXL_TESTS_UNIT_H

#include <stdint.h>
#include <string.h>

#include <hixl.h>

/* A context listening on 127.0.0.1 over transports (NULL: the default);
 * timeout_ms 0 keeps the default; token NULL: no authentication. */
static inline hixl_ctx_t *unit_ctx(const char *transports, int timeout_ms, const char *token)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.transports = transports;
  cfg.listen = "127.0.0.1:0";
  if (timeout_ms)
    cfg.timeout_ms = timeout_ms;
  if (token)
    cfg.auth_token = token;
  hixl_ctx_t *c = NULL;
  if (hixl_ctx_create(&cfg, &c) != HIXL_OK)
    fail_msg("hixl_ctx_create(%s): %s", transports ? transports : "default", hixl_last_error());
  return c;
}

/* The value of the context's (peer NULL) or a peer's figure called name;
 * the test fails if there is none. */
static inline uint64_t unit_stat(hixl_ctx_t *ctx, hixl_peer_t *peer, const char *name)
{
  enum { MAXS = 256 };
  hixl_stat_t s[MAXS];
  size_t n = MAXS;
  if (hixl_ctx_stats(ctx, peer, s, &n) != HIXL_OK)
    fail_msg("hixl_ctx_stats: %s", hixl_last_error());
  for (size_t i = 0; i < n && i < MAXS; i++)
    if (strcmp(s[i].name, name) == 0)
      return s[i].value;
  fail_msg("no figure %s", name);
  return 0;
}

#endif

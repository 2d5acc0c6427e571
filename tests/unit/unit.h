/* SPDX-License-Identifier: MIT */
/* What the unit tests share: a context on loopback with the transports and
 * timeout a test asks for, a region published as "m" and a peer of it, a
 * figure of hixl_ctx_stats by name, a free loopback port and the entries
 * of a /proc directory.  Include after <cmocka.h> (these fail the test
 * with fail_msg); unit_create and unit_dir_entries never fail it, so a
 * forked child may call them. */
#ifndef HIXL_TESTS_UNIT_H
#define HIXL_TESTS_UNIT_H

#include <dirent.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <hixl.h>

#include "../common/port.h"

/* In *c a context listening on 127.0.0.1 over transports (NULL: the
 * default); timeout_ms 0 keeps the default; token NULL: no
 * authentication.  hixl_ctx_create's status. */
static inline hixl_status_t unit_create(const char *transports, int timeout_ms, const char *token,
                                        hixl_ctx_t **c)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.transports = transports;
  cfg.listen = "127.0.0.1:0";
  if (timeout_ms)
    cfg.timeout_ms = timeout_ms;
  if (token)
    cfg.auth_token = token;
  *c = NULL;
  return hixl_ctx_create(&cfg, c);
}

/* That context; the test fails if there is none. */
static inline hixl_ctx_t *unit_ctx(const char *transports, int timeout_ms, const char *token)
{
  hixl_ctx_t *c = NULL;
  if (unit_create(transports, timeout_ms, token, &c) != HIXL_OK)
    fail_msg("hixl_ctx_create(%s): %s", transports ? transports : "default", hixl_last_error());
  return c;
}

/* len bytes of ctx's host memory with access, published as "m": their
 * address (hixl_mr_dereg(*mr) frees them); the test fails if either
 * step does. */
static inline void *unit_region(hixl_ctx_t *ctx, size_t len, unsigned access, hixl_mr_t **mr)
{
  void *mem = NULL;
  if (hixl_mem_alloc(ctx, len, HIXL_MEM_HOST, access, &mem, mr) != HIXL_OK ||
      hixl_mr_publish(*mr, "m") != HIXL_OK)
    fail_msg("a region of %zu bytes published as \"m\": %s", len, hixl_last_error());
  return mem;
}

/* ini's peer of tgt, connected within 10 s; the test fails, naming
 * transports, if it is not. */
static inline hixl_peer_t *unit_connect(hixl_ctx_t *ini, hixl_ctx_t *tgt, const char *transports)
{
  hixl_peer_t *p = NULL;
  if (hixl_connect(ini, hixl_ctx_address(tgt), 10000, &p) != HIXL_OK)
    fail_msg("connect over %s: %s", transports, hixl_last_error());
  return p;
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

/* A free loopback port below the ephemeral range (../common/port.h), for
 * what a test starts after it; the test fails if there is none. */
static inline int unit_free_port(void)
{
  int port = test_free_port();
  if (port < 0)
    fail_msg("no free loopback port below the ephemeral range");
  return port;
}

/* The entries of a directory (/proc/self/task: threads; /proc/self/fd:
 * descriptors, the directory's own among them), . and .. not counted. */
static inline int unit_dir_entries(const char *path)
{
  DIR *d = opendir(path);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    n += e->d_name[0] != '.';
  if (d)
    closedir(d);
  return n;
}

#endif

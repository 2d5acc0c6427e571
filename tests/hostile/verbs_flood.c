/* SPDX-License-Identifier: MIT */
/*
 * control_flood.c against a verbs-only target, unchanged: linked with
 * -Wl,--wrap=setenv,--wrap=hixl_ctx_create, so that where control_flood
 * picks its transports (the target: setenv("HIXL_TRANSPORTS", ...) in its
 * forked child; the legitimate peer: cfg.transports) HIXL_HOSTILE_TRANSPORTS
 * is used instead, when set.  The target also moves to
 * HIXL_TEST_TARGET_NET_DEV when that is set (rxe1 in the rxe guest, the
 * legitimate peer staying on HIXL_NET_DEV), so the legitimate verbs peer
 * crosses the wire; and hixl_connect is wrapped to check that the
 * legitimate peer did connect over that transport (should control_flood
 * pick its transports some other way, this fails instead of quietly
 * testing shm).  tests/rxe/suite.sh runs the slowloris, cap and emfile
 * cases so (HIXL_HOSTILE_TRANSPORTS=verbs).
 */
#define _GNU_SOURCE
#include <hixl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int __real_setenv(const char *name, const char *value, int overwrite);
int __wrap_setenv(const char *name, const char *value, int overwrite);
hixl_status_t __real_hixl_ctx_create(const hixl_config_t *cfg, hixl_ctx_t **ctx_p);
hixl_status_t __wrap_hixl_ctx_create(const hixl_config_t *cfg, hixl_ctx_t **ctx_p);
hixl_status_t __real_hixl_connect(hixl_ctx_t *ctx, const char *addr, int timeout_ms,
                                  hixl_peer_t **peer_p);
hixl_status_t __wrap_hixl_connect(hixl_ctx_t *ctx, const char *addr, int timeout_ms,
                                  hixl_peer_t **peer_p);

int __wrap_setenv(const char *name, const char *value, int overwrite)
{
  const char *tp = getenv("HIXL_HOSTILE_TRANSPORTS");
  if (tp && *tp && strcmp(name, "HIXL_TRANSPORTS") == 0) {
    /* Only the target (control_flood's forked child) sets HIXL_TRANSPORTS. */
    const char *dev = getenv("HIXL_TEST_TARGET_NET_DEV");
    if (dev && *dev)
      __real_setenv("HIXL_NET_DEV", dev, 1);
    value = tp;
  }
  return __real_setenv(name, value, overwrite);
}

hixl_status_t __wrap_hixl_ctx_create(const hixl_config_t *cfg, hixl_ctx_t **ctx_p)
{
  const char *tp = getenv("HIXL_HOSTILE_TRANSPORTS");
  if (cfg == NULL || tp == NULL || *tp == 0)
    return __real_hixl_ctx_create(cfg, ctx_p);
  hixl_config_t c = *cfg;
  c.transports = tp;
  return __real_hixl_ctx_create(&c, ctx_p);
}

hixl_status_t __wrap_hixl_connect(hixl_ctx_t *ctx, const char *addr, int timeout_ms,
                                  hixl_peer_t **peer_p)
{
  hixl_status_t st = __real_hixl_connect(ctx, addr, timeout_ms, peer_p);
  const char *tp = getenv("HIXL_HOSTILE_TRANSPORTS");
  if (st == HIXL_OK && tp && *tp && !strchr(tp, ',') &&
      strcmp(hixl_peer_transport(*peer_p), tp) != 0) {
    fprintf(stderr, "FAIL: the legitimate peer connected over %s, not %s\n",
            hixl_peer_transport(*peer_p), tp);
    exit(1);
  }
  return st;
}

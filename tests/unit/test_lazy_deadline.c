/* SPDX-License-Identifier: MIT */
/* A target's lazy transport set-up (docs/scale.md) runs on its control
 * thread in the middle of a handshake; no handshake moves on meanwhile,
 * so that time must not count against their deadline (the liveness
 * period from the accept).  White-box: the library is linked with
 * --wrap=hixl__tp_need, which makes the target's fabric set-up take
 * longer than its 1 s handshake deadline; the connect must still succeed
 * and the peer serve a put.  Before the fix the target dropped the
 * handshake as timed out ("closed the connection during the handshake"). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include "core.h"

#define SETUP_DELAY_US 1600000 /* past the 1 s liveness floor */

hixl_status_t __real_hixl__tp_need(hixl_ctx_t *ctx, const hixl_transport_ops_t *ops);
hixl_status_t __wrap_hixl__tp_need(hixl_ctx_t *ctx, const hixl_transport_ops_t *ops);
static hixl_ctx_t *g_slow; /* whose first set-up is slow */

hixl_status_t __wrap_hixl__tp_need(hixl_ctx_t *ctx, const hixl_transport_ops_t *ops)
{
  if (ctx == g_slow && !(atomic_load(&ctx->tp_ready) & (1u << ops->id)))
    usleep(SETUP_DELAY_US);
  return __real_hixl__tp_need(ctx, ops);
}

#ifdef HIXL_HAVE_FABRIC
static uint32_t fabric_bit(void)
{
  for (size_t t = 0; t < hixl__n_transports; t++)
    if (strcmp(hixl__transports[t]->name, "fabric") == 0)
      return 1u << hixl__transports[t]->id;
  fail_msg("fabric is built but not in hixl__transports");
  return 0;
}

/* tgt serves a region; ini connects to it while slow's first set-up
 * takes SETUP_DELAY_US (a failed connect says it came `how`: "during a",
 * "with our own"), and the peer, over fabric, must serve a put of v to
 * word `at`.  Both contexts are destroyed. */
static void connect_slowly_and_put(hixl_ctx_t *ini, hixl_ctx_t *tgt, hixl_ctx_t *slow,
                                   const char *how, uint64_t v, size_t at)
{
  hixl_mr_t *mr;
  uint64_t *mem = unit_region(tgt, 4096, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &mr);
  g_slow = slow;
  hixl_peer_t *p = NULL;
  if (hixl_connect(ini, hixl_ctx_address(tgt), 10000, &p) != HIXL_OK)
    fail_msg("connect %s %d ms set-up: %s", how, SETUP_DELAY_US / 1000, hixl_last_error());
  g_slow = NULL;
  assert_string_equal(hixl_peer_transport(p), "fabric");
  hixl_rmr_t *r = NULL;
  assert_int_equal(hixl_rmr_lookup(p, "m", 10000, &r), HIXL_OK);
  assert_int_equal(hixl_put(p, &v, sizeof(v), r, at * sizeof(v), 0, NULL), HIXL_OK);
  assert_int_equal(hixl_fence(ini, p, 10000), HIXL_OK);
  assert_int_equal(mem[at], v);
  hixl_rmr_release(r);
  hixl_disconnect(p);
  hixl_ctx_destroy(ini);
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(tgt);
}
#endif

static void test_slow_setup_keeps_handshake(void **state)
{
  (void)state;
#ifdef HIXL_HAVE_FABRIC
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1); /* the default may pick shm's */
  /* The initiator sets fabric up at creation, so only the target's
   * set-up falls inside the handshake. */
  setenv("HIXL_LAZY", "0", 1);
  hixl_ctx_t *ini = unit_ctx("fabric", 10000, NULL);
  unsetenv("HIXL_LAZY");
  hixl_ctx_t *tgt = unit_ctx("shm,fabric", 200, NULL);      /* liveness floor: 1 s */
  assert_false(atomic_load(&tgt->tp_ready) & fabric_bit()); /* lazy: not set up yet */
  connect_slowly_and_put(ini, tgt, tgt, "during a", 0x5ca1e, 0);
#else
  skip();
#endif
}

/* The other side: the initiator's first peer over a lazy transport sets
 * it up after the target's HELLO_ACK, before its transport's connect, and
 * the target's handshake deadline runs meanwhile (it cannot tell our
 * set-up from a stall).  Made longer than the target's 1 s deadline, the
 * target drops the handshake; the connect must try once more, now quick,
 * and succeed.  Before, it failed ("closed the connection during the
 * handshake": fabric/peer_death on a loaded CI machine, where a set-up took
 * over the target's 2 s). */
static void test_slow_own_setup_retries(void **state)
{
  (void)state;
#ifdef HIXL_HAVE_FABRIC
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1);
  setenv("HIXL_LAZY", "0", 1);
  hixl_ctx_t *tgt = unit_ctx("fabric", 200, NULL); /* set up now; liveness floor: 1 s */
  unsetenv("HIXL_LAZY");
  hixl_ctx_t *ini = unit_ctx("shm,fabric", 10000, NULL);
  assert_false(atomic_load(&ini->tp_ready) & fabric_bit());
  connect_slowly_and_put(ini, tgt, ini, "with our own", 0xfab, 1);
#else
  skip();
#endif
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slow_setup_keeps_handshake),
      cmocka_unit_test(test_slow_own_setup_retries),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

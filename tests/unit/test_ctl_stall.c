/* SPDX-License-Identifier: MIT */
/* A control thread that spends long on transport work after reading its
 * sockets (verbs feeding a backlog of notifications to a slow consumer
 * did, for ten seconds) must not take its own stall for the peer's
 * silence: liveness is judged as of when the sockets were read.  The
 * stall is made with the test hook HIXL_TEST_CTL_STALL_MS (once, after
 * the first connect), 1.5 x the initiator's liveness period; the target's
 * period is long enough that the initiator's silence is no loss there.
 * Without the fix the initiator declares its live target lost. */
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

static hixl_ctx_t *make(int timeout_ms) { return unit_ctx("fabric", timeout_ms, NULL); }

static void test_stall_is_not_silence(void **state)
{
  (void)state;
#ifdef HIXL_HAVE_FABRIC
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1);
  /* Liveness 6 s: the initiator's stall is no loss here, and its
   * heartbeats (every 1.5 s) reach the initiator at least once in the
   * stall, to be read right after it. */
  hixl_ctx_t *tgt = make(6000);
  hixl_mr_t *mr;
  uint64_t *mem = unit_region(tgt, 4096, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &mr);
  setenv("HIXL_TEST_CTL_STALL_MS", "3000", 1); /* 1.5 x the initiator's 2 s */
  hixl_ctx_t *ini = make(2000);
  unsetenv("HIXL_TEST_CTL_STALL_MS");
  hixl_peer_t *p = unit_connect(ini, tgt, "fabric");
  /* The stall comes at the control thread's next turn; wait it out and a
   * few liveness checks past it. */
  sleep(5);
  hixl_rmr_t *r = NULL;
  if (hixl_rmr_lookup(p, "m", 10000, &r) != HIXL_OK)
    fail_msg("lookup after the stall: %s", hixl_last_error());
  uint64_t losses = unit_stat(ini, NULL, "peer_losses");
  printf("# after a 3 s stall of the initiator's control thread (liveness 2 s): %llu losses\n",
         (unsigned long long)losses);
  assert_int_equal(losses, 0);
  uint64_t v = 0x5ca11;
  assert_int_equal(hixl_put(p, &v, sizeof(v), r, 0, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_fence(ini, p, 10000), HIXL_OK);
  assert_int_equal(mem[0], v);
  assert_int_equal(unit_stat(tgt, NULL, "peer_losses"), 0);
  hixl_rmr_release(r);
  hixl_ctx_destroy(ini);
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(tgt);
#else
  skip();
#endif
}

int main(void)
{
  setenv("HIXL_LAZY", "0", 1); /* fabric set up at create, not inside the stall's window */
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_stall_is_not_silence)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

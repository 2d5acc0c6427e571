/* SPDX-License-Identifier: MIT */
/* Heartbeats (docs/architecture.md, docs/scale.md): idle shm peers send
 * each other no heartbeat messages -- each control thread stores the time
 * of its turn in its bell page, and the other side reads it once it has
 * not heard from it for half the liveness period -- while
 * peers over a socket-only transport (fabric) still do.  White-box: the
 * library is linked with --wrap=hixl__send, which counts HEARTBEAT
 * messages, so the test sees every one the control threads send. */
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
#include "wire.h"

hixl_status_t __real_hixl__send(hixl_peer_t *peer, hixl_msg_t *m, const int *fds, int nfds);
hixl_status_t __wrap_hixl__send(hixl_peer_t *peer, hixl_msg_t *m, const int *fds, int nfds);
static _Atomic int g_heartbeats;

hixl_status_t __wrap_hixl__send(hixl_peer_t *peer, hixl_msg_t *m, const int *fds, int nfds)
{
  if (m->type == HIXL_MSG_HEARTBEAT)
    atomic_fetch_add(&g_heartbeats, 1);
  return __real_hixl__send(peer, m, fds, nfds);
}

#define TIMEOUT_MS 1000 /* the floor: a tick of 250 ms */

static hixl_ctx_t *make(const char *transports) { return unit_ctx(transports, TIMEOUT_MS, NULL); }

/* Connect, stay idle for six ticks, and return the heartbeats sent
 * meanwhile; the peer must still be up and serve a put and an FAA. */
static int idle_heartbeats(const char *transports)
{
  hixl_ctx_t *tgt = make(transports), *ini = make(transports);
  hixl_mr_t *mr;
  uint64_t *mem =
      unit_region(tgt, 4096, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC, &mr);
  hixl_peer_t *p = unit_connect(ini, tgt, transports);
  assert_string_equal(hixl_peer_transport(p), transports);
  hixl_rmr_t *r = NULL;
  assert_int_equal(hixl_rmr_lookup(p, "m", 10000, &r), HIXL_OK);
  int h0 = atomic_load(&g_heartbeats);
  usleep(6 * TIMEOUT_MS / 4 * 1000);
  int n = atomic_load(&g_heartbeats) - h0;
  /* Six ticks of silence on a 1 s liveness period: still up both ways. */
  uint64_t v = 0x5ca1e, old = 0;
  assert_int_equal(hixl_put(p, &v, sizeof(v), r, 0, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_atomic_faa(p, r, 8, 1, &old, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_fence(ini, p, 10000), HIXL_OK);
  assert_int_equal(mem[0], v);
  assert_int_equal(mem[1], 1);
  printf("# %s: %d heartbeat messages in %d ms idle\n", transports, n, 6 * TIMEOUT_MS / 4);
  hixl_rmr_release(r);
  hixl_disconnect(p);
  hixl_ctx_destroy(ini);
  hixl_mr_dereg(mr); /* frees mem */
  hixl_ctx_destroy(tgt);
  return n;
}

static void test_shm_idle_sends_no_heartbeats(void **state)
{
  (void)state;
  assert_int_equal(idle_heartbeats("shm"), 0);
}

/* The counter counts: a transport without shared memory still sends them
 * (each side about one a tick). */
static void test_fabric_idle_sends_heartbeats(void **state)
{
  (void)state;
#ifdef HIXL_HAVE_FABRIC
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1); /* the default may pick shm's */
  /* Set up at hixl_ctx_create: a lazy set-up inside the handshake took
   * longer than the 1 s handshake deadline under ASan. */
  setenv("HIXL_LAZY", "0", 1);
  assert_true(idle_heartbeats("fabric") >= 4);
#else
  skip();
#endif
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shm_idle_sends_no_heartbeats),
      cmocka_unit_test(test_fabric_idle_sends_heartbeats),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/* Lazy transports (HIXL_TP_CAP_LAZY, docs/scale.md): a context sets up
 * fabric only when a connection picks it.  White-box: the bits and state
 * the core keeps say what was set up; the public calls say it works.
 *  - shm peers only: fabric stays unset on both sides (no endpoint, no
 *    thread), yet is offered (hixl_ctx_transports);
 *  - a fabric peer: both sides set it up then, and a region registered
 *    before that is reachable through it (put, get, FAA);
 *  - a set-up that fails (a provider that does not exist) fails that
 *    connect with the reason, withdraws the transport, and shm goes on. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "unit.h"

#include "core.h"

#ifdef HIXL_HAVE_FABRIC
static int threads(void) { return unit_dir_entries("/proc/self/task"); }

static hixl_ctx_t *make(const char *transports) { return unit_ctx(transports, 0, NULL); }

static const hixl_transport_ops_t *fabric(void)
{
  for (size_t t = 0; t < hixl__n_transports; t++)
    if (strcmp(hixl__transports[t]->name, "fabric") == 0)
      return hixl__transports[t];
  fail_msg("fabric is built but not in hixl__transports");
  return NULL;
}

static bool fabric_ready(hixl_ctx_t *c)
{
  return (atomic_load(&c->tp_ready) & (1u << fabric()->id)) != 0;
}

static void test_shm_only_sets_up_no_fabric(void **state)
{
  (void)state;
  int t0 = threads();
  hixl_ctx_t *tgt = make("shm,fabric"), *ini = make("shm,fabric");
  /* A control thread each (a sanitizer may add its own at the first):
   * no fabric progress thread, then or after the connect. */
  int t1 = threads();
  assert_true(t1 >= t0 + 2 && t1 <= t0 + 3);
  assert_non_null(strstr(hixl_ctx_transports(tgt), "fabric")); /* offered all the same */
  hixl_peer_t *p = NULL;
  assert_int_equal(hixl_connect(ini, hixl_ctx_address(tgt), 5000, &p), HIXL_OK);
  assert_string_equal(hixl_peer_transport(p), "shm");
  assert_false(fabric_ready(tgt));
  assert_false(fabric_ready(ini));
  assert_null(tgt->tp[fabric()->id]);
  assert_null(ini->tp[fabric()->id]);
  assert_int_equal(threads(), t1);
  hixl_disconnect(p);
  hixl_ctx_destroy(ini);
  hixl_ctx_destroy(tgt);
}

static void test_first_fabric_peer_sets_it_up(void **state)
{
  (void)state;
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1);
  hixl_ctx_t *tgt = make("shm,fabric"), *ini = make("fabric");
  /* Registered before fabric is set up: the set-up registers it too. */
  uint64_t *buf = NULL;
  hixl_mr_t *mr = NULL;
  assert_int_equal(hixl_mem_alloc(tgt, 4096, HIXL_MEM_HOST,
                                  HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC,
                                  (void **)&buf, &mr),
                   HIXL_OK);
  buf[0] = 0x1234;
  buf[1] = 5;
  uint8_t blob[HIXL_RKEY_MAX];
  size_t bl = sizeof(blob);
  assert_int_equal(hixl_mr_pack(mr, blob, &bl), HIXL_OK);
  assert_false(fabric_ready(tgt));

  hixl_peer_t *p = NULL;
  assert_int_equal(hixl_connect(ini, hixl_ctx_address(tgt), 10000, &p), HIXL_OK);
  assert_string_equal(hixl_peer_transport(p), "fabric");
  assert_true(fabric_ready(tgt));
  assert_true(fabric_ready(ini));

  hixl_rmr_t *r = NULL;
  assert_int_equal(hixl_rmr_unpack(p, blob, bl, &r), HIXL_OK);
  uint64_t src = 0xfeedfacecafebeefull, got = 0, old = 0;
  assert_int_equal(hixl_put(p, &src, 8, r, 16, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_fence(ini, p, 10000), HIXL_OK);
  assert_int_equal(hixl_get(p, &got, 8, r, 0, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_fence(ini, p, 10000), HIXL_OK);
  assert_int_equal(got, 0x1234);
  assert_int_equal(buf[2], src);
  assert_int_equal(hixl_atomic_faa(p, r, 8, 3, &old, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_fence(ini, p, 10000), HIXL_OK);
  assert_int_equal(old, 5);
  assert_int_equal(buf[1], 8);
  hixl_rmr_release(r);
  hixl_disconnect(p);
  hixl_ctx_destroy(ini);
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(tgt);
  unsetenv("HIXL_FABRIC_PROVIDER");
}

static void test_failed_set_up_is_reported_and_withdrawn(void **state)
{
  (void)state;
  hixl_ctx_t *tgt = make("shm,fabric"), *ini = make("fabric"), *shm = make("shm");
  setenv("HIXL_FABRIC_PROVIDER", "no-such-provider", 1);
  hixl_peer_t *p = NULL;
  hixl_status_t st = hixl_connect(ini, hixl_ctx_address(tgt), 10000, &p);
  assert_int_not_equal(st, HIXL_OK);
  assert_null(p);
  /* The target tried, failed, withdrew it, and found nothing else the
   * initiator offers: it says what each side has. */
  const char *e = hixl_last_error();
  if (strstr(e, "no common transport") == NULL)
    fail_msg("unexpected error: %s", e);
  assert_false(fabric_ready(tgt));
  assert_int_equal(hixl__tp_offered(tgt) & (1u << fabric()->id), 0);
  /* The initiator's own set-up fails with the provider's name. */
  const hixl_transport_ops_t *fab = fabric();
  assert_int_not_equal(hixl__tp_need(ini, fab), HIXL_OK);
  if (strstr(hixl_last_error(), "no-such-provider") == NULL)
    fail_msg("the error does not name the provider: %s", hixl_last_error());
  /* A second need says it failed before, and why, without trying again. */
  assert_int_equal(hixl__tp_need(ini, fab), HIXL_ERR_UNSUPPORTED);
  if (strstr(hixl_last_error(), "no-such-provider") == NULL)
    fail_msg("the second error does not say why: %s", hixl_last_error());
  unsetenv("HIXL_FABRIC_PROVIDER");
  /* The target still serves shm peers. */
  assert_int_equal(hixl_connect(shm, hixl_ctx_address(tgt), 5000, &p), HIXL_OK);
  assert_string_equal(hixl_peer_transport(p), "shm");
  hixl_disconnect(p);
  hixl_ctx_destroy(shm);
  hixl_ctx_destroy(ini);
  hixl_ctx_destroy(tgt);
}

static void test_eager_with_lazy_0(void **state)
{
  (void)state;
  setenv("HIXL_LAZY", "0", 1);
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1);
  hixl_ctx_t *c = make("shm,fabric");
  assert_true(fabric_ready(c));
  assert_non_null(c->tp[fabric()->id]);
  hixl_ctx_destroy(c);
  unsetenv("HIXL_FABRIC_PROVIDER");
  unsetenv("HIXL_LAZY");
}
#endif

int main(void)
{
#ifdef HIXL_HAVE_FABRIC
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shm_only_sets_up_no_fabric),
      cmocka_unit_test(test_first_fabric_peer_sets_it_up),
      cmocka_unit_test(test_failed_set_up_is_reported_and_withdrawn),
      cmocka_unit_test(test_eager_with_lazy_0),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
#else
  printf("1..0 # SKIP fabric is not built\n");
  return 77;
#endif
}

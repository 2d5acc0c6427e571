/* SPDX-License-Identifier: MIT */
/* The request pool: a second hixl_req_free is detected and changes
 * nothing (before, it pushed the request twice, and the next two
 * operations shared one request object). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "core.h"

static hixl_ctx_t *new_ctx(void)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.transports = "self";
  hixl_ctx_t *ctx = NULL;
  assert_int_equal(hixl_ctx_create(&cfg, &ctx), HIXL_OK);
  return ctx;
}

static void test_double_free_of_a_completed_request(void **state)
{
  (void)state;
  hixl_ctx_t *ctx = new_ctx();
  hixl_req_t *r = hixl__req_get(ctx, NULL);
  assert_non_null(r);
  hixl__req_complete(r, HIXL_OK, 0);
  hixl_req_free(r); /* back to the pool */
  hixl_req_free(r); /* the bug: pushed again */
  assert_non_null(strstr(hixl_last_error(), "already freed"));
  hixl_req_t *a = hixl__req_get(ctx, NULL), *b = hixl__req_get(ctx, NULL);
  assert_non_null(a);
  assert_non_null(b);
  assert_ptr_not_equal(a, b); /* two operations, two requests */
  hixl__req_complete(a, HIXL_OK, 0);
  hixl__req_complete(b, HIXL_OK, 0);
  hixl_req_free(a);
  hixl_req_free(b);
  hixl_ctx_destroy(ctx);
}

static void test_double_free_of_an_incomplete_request(void **state)
{
  (void)state;
  hixl_ctx_t *ctx = new_ctx();
  hixl_req_t *r = hixl__req_get(ctx, NULL);
  hixl_req_free(r); /* freed early: recycled at completion */
  hixl_req_free(r);
  assert_non_null(strstr(hixl_last_error(), "already freed"));
  hixl__req_complete(r, HIXL_OK, 0); /* pushed once, by the completion */
  hixl_req_t *a = hixl__req_get(ctx, NULL), *b = hixl__req_get(ctx, NULL);
  assert_ptr_not_equal(a, b);
  hixl__req_complete(a, HIXL_OK, 0);
  hixl__req_complete(b, HIXL_OK, 0);
  hixl_req_free(a);
  hixl_req_free(b);
  hixl_ctx_destroy(ctx);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_double_free_of_a_completed_request),
      cmocka_unit_test(test_double_free_of_an_incomplete_request),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/* Remote-key blobs: round trip, and every single-byte corruption rejected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "rkey.h"

static const hixl_rkey_info_t K = {.ctx_id = 0x1234,
                                   .rkey = 0xfeedfacecafebeefull,
                                   .base = 0x7f0000001000ull,
                                   .len = 1 << 20,
                                   .slot = 17,
                                   .access = 7,
                                   .flags = 1};

static void test_roundtrip(void **state)
{
  (void)state;
  uint8_t b[HIXL_RKEY_BLOB_LEN];
  hixl_rkey_encode(&K, b);
  hixl_rkey_info_t d;
  assert_int_equal(hixl_rkey_decode(b, sizeof(b), &d), 0);
  assert_int_equal(d.ctx_id, K.ctx_id);
  assert_int_equal(d.rkey, K.rkey);
  assert_int_equal(d.base, K.base);
  assert_int_equal(d.len, K.len);
  assert_int_equal(d.slot, K.slot);
  assert_int_equal(d.access, K.access);
  assert_int_equal(d.flags, K.flags);
}

static void test_every_byte_flip_rejected(void **state)
{
  (void)state;
  uint8_t b[HIXL_RKEY_BLOB_LEN];
  hixl_rkey_encode(&K, b);
  for (size_t i = 0; i < sizeof(b); i++)
    for (int bit = 0; bit < 8; bit++) {
      uint8_t c[sizeof(b)];
      memcpy(c, b, sizeof(b));
      c[i] ^= (uint8_t)(1u << bit);
      hixl_rkey_info_t d;
      assert_int_equal(hixl_rkey_decode(c, sizeof(c), &d), -1);
    }
}

static void test_bad_sizes_and_values(void **state)
{
  (void)state;
  uint8_t b[HIXL_RKEY_BLOB_LEN + 1];
  hixl_rkey_info_t d;
  hixl_rkey_encode(&K, b);
  assert_int_equal(hixl_rkey_decode(b, HIXL_RKEY_BLOB_LEN - 1, &d), -1);
  assert_int_equal(hixl_rkey_decode(b, HIXL_RKEY_BLOB_LEN + 1, &d), -1);
  assert_int_equal(hixl_rkey_decode(NULL, HIXL_RKEY_BLOB_LEN, &d), -1);
  hixl_rkey_info_t k = K;
  k.rkey = 0; /* never a live key */
  hixl_rkey_encode(&k, b);
  assert_int_equal(hixl_rkey_decode(b, HIXL_RKEY_BLOB_LEN, &d), -1);
  k = K;
  k.base = UINT64_MAX - 10; /* base + len wraps */
  hixl_rkey_encode(&k, b);
  assert_int_equal(hixl_rkey_decode(b, HIXL_RKEY_BLOB_LEN, &d), -1);
  k = K;
  k.access = 8; /* unknown right */
  hixl_rkey_encode(&k, b);
  assert_int_equal(hixl_rkey_decode(b, HIXL_RKEY_BLOB_LEN, &d), -1);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_every_byte_flip_rejected),
      cmocka_unit_test(test_bad_sizes_and_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

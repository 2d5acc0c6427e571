/* SPDX-License-Identifier: MIT */
/* Control-protocol codec: round trips and strict rejection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "wire.h"

static hixl_msg_t sample(uint16_t type)
{
  hixl_msg_t m;
  memset(&m, 0, sizeof(m));
  m.type = type;
  m.seq = 0x1122334455667788ull;
  m.status = -7;
  for (int i = 0; i < 3; i++)
    m.u32[i] = 0xa0000000u + (uint32_t)i;
  for (int i = 0; i < 5; i++)
    m.u64[i] = 0xb000000000000000ull + (uint64_t)i;
  for (int i = 0; i < 32; i++)
    m.host_id[i] = (uint8_t)i;
  strcpy(m.str[0], "shm,verbs");
  strcpy(m.str[1], "token");
  m.blob_len = 56;
  for (int i = 0; i < 56; i++)
    m.blob[i] = (uint8_t)(200 - i);
  return m;
}

static void test_roundtrip_all_types(void **state)
{
  (void)state;
  for (uint16_t t = 1; t < HIXL_MSG_TYPE_MAX; t++) {
    hixl_msg_t m = sample(t), d;
    uint8_t buf[HIXL_WIRE_HDR + HIXL_WIRE_MAX];
    size_t n = hixl_wire_encode(&m, buf, sizeof(buf));
    assert_true(n >= HIXL_WIRE_HDR);
    size_t need = 0;
    assert_int_equal(hixl_wire_frame(buf, n, &need), HIXL_WIRE_OK);
    assert_int_equal(need, n);
    assert_int_equal(hixl_wire_decode(buf, n, &d), HIXL_WIRE_OK);
    assert_int_equal(d.type, t);
    assert_int_equal(d.seq, m.seq);
    /* Re-encoding the decoded message gives the same bytes. */
    uint8_t again[sizeof(buf)];
    assert_int_equal(hixl_wire_encode(&d, again, sizeof(again)), n);
    assert_memory_equal(buf, again, n);
  }
}

static void test_fields_survive(void **state)
{
  (void)state;
  hixl_msg_t m = sample(HIXL_MSG_AUTH), d;
  uint8_t buf[512];
  size_t n = hixl_wire_encode(&m, buf, sizeof(buf));
  assert_int_equal(hixl_wire_decode(buf, n, &d), HIXL_WIRE_OK);
  assert_int_equal(d.u32[0], m.u32[0]);
  assert_int_equal(d.u32[1], m.u32[1]);
  assert_int_equal(d.u64[0], m.u64[0]);
  assert_int_equal(d.u64[1], m.u64[1]);
  assert_memory_equal(d.host_id, m.host_id, 32);
  assert_string_equal(d.str[0], "shm,verbs");
  assert_int_equal(d.blob_len, m.blob_len);
  assert_memory_equal(d.blob, m.blob, m.blob_len);
  /* Fields AUTH does not carry are zero after decoding: no token field. */
  assert_int_equal(d.status, 0);
  assert_string_equal(d.str[1], "");
  /* HELLO carries its nonce and nothing else (auth.h). */
  m = sample(HIXL_MSG_HELLO);
  n = hixl_wire_encode(&m, buf, sizeof(buf));
  assert_int_equal(n, HIXL_WIRE_HDR + 2 + m.blob_len);
  assert_int_equal(hixl_wire_decode(buf, n, &d), HIXL_WIRE_OK);
  assert_int_equal(d.u64[0], 0);
  assert_string_equal(d.str[0], "");
}

static void test_short_and_prefix(void **state)
{
  (void)state;
  hixl_msg_t m = sample(HIXL_MSG_WORLD_XCHG), d;
  uint8_t buf[512];
  size_t n = hixl_wire_encode(&m, buf, sizeof(buf));
  for (size_t k = 0; k < n; k++) {
    size_t need = 0;
    /* Every proper prefix asks for more, never accepts. */
    assert_int_equal(hixl_wire_frame(buf, k, &need), HIXL_WIRE_SHORT);
    assert_int_equal(hixl_wire_decode(buf, k, &d), HIXL_WIRE_BAD);
  }
}

static void test_rejects(void **state)
{
  (void)state;
  hixl_msg_t m = sample(HIXL_MSG_LOOKUP), d;
  uint8_t buf[512], bad[512];
  size_t n = hixl_wire_encode(&m, buf, sizeof(buf)), need;
  /* Bad magic, version, type, oversized length, too many fds. */
  size_t pos[] = {0, 4, 6, 8, 12};
  uint8_t val[] = {'X', HIXL_WIRE_VERSION + 1, 200, 0xff, 9};
  for (size_t i = 0; i < 5; i++) {
    memcpy(bad, buf, n);
    bad[pos[i]] = val[i];
    if (pos[i] == 8)
      bad[10] = 0xff; /* length > HIXL_WIRE_MAX */
    assert_int_equal(hixl_wire_frame(bad, n, &need), HIXL_WIRE_BAD);
    assert_int_equal(hixl_wire_decode(bad, n, &d), HIXL_WIRE_BAD);
  }
  /* Trailing bytes inside the declared length. */
  memcpy(bad, buf, n);
  bad[n] = 0;
  bad[8] = (uint8_t)(bad[8] + 1);
  assert_int_equal(hixl_wire_decode(bad, n + 1, &d), HIXL_WIRE_BAD);
  /* A string containing a NUL. */
  memcpy(bad, buf, n);
  bad[HIXL_WIRE_HDR + 2] = 0;
  assert_int_equal(hixl_wire_decode(bad, n, &d), HIXL_WIRE_BAD);
  /* A string length past the end. */
  memcpy(bad, buf, n);
  bad[HIXL_WIRE_HDR] = 0xff;
  assert_int_equal(hixl_wire_decode(bad, n, &d), HIXL_WIRE_BAD);
}

static void test_encode_limits(void **state)
{
  (void)state;
  hixl_msg_t m = sample(HIXL_MSG_LOOKUP_REPLY);
  uint8_t buf[512];
  m.blob_len = HIXL_WIRE_BLOB + 1;
  assert_int_equal(hixl_wire_encode(&m, buf, sizeof(buf)), 0);
  m = sample(HIXL_MSG_HELLO);
  assert_int_equal(hixl_wire_encode(&m, buf, 30), 0); /* does not fit */
  m.type = 0;
  assert_int_equal(hixl_wire_encode(&m, buf, sizeof(buf)), 0);
  m.type = HIXL_MSG_TYPE_MAX;
  assert_int_equal(hixl_wire_encode(&m, buf, sizeof(buf)), 0);
  assert_string_equal(hixl_wire_type_name(HIXL_MSG_TYPE_MAX), "UNKNOWN");
  assert_string_equal(hixl_wire_type_name(HIXL_MSG_BYE), "BYE");
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_all_types), cmocka_unit_test(test_fields_survive),
      cmocka_unit_test(test_short_and_prefix),    cmocka_unit_test(test_rejects),
      cmocka_unit_test(test_encode_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

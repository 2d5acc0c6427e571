/* SPDX-License-Identifier: MIT */
/* The data mover (hixl__copy): memcpy below the streaming threshold,
 * non-temporal stores from it up.  With the threshold forced down to 64
 * bytes every alignment of source and destination, every length up to 600
 * and a few large odd ones take the streaming path; each copy must equal
 * memcpy's and touch no byte outside [dst, dst + len).  The same for the
 * streaming copy called directly at every length (what shm batches do). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define GUARD 64

static void fill(uint8_t *p, size_t n, unsigned seed)
{
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(i * 131 + seed * 7 + (i >> 8));
}

/* Copy len bytes from src+so to dst+do_ and check the whole dst buffer. */
static bool g_direct; /* call hixl__copy_stream itself (as a batch does) */

static void check(uint8_t *src, uint8_t *dst, uint8_t *want, size_t cap, size_t so, size_t do_,
                  size_t len)
{
  memset(dst, 0xee, cap);
  memcpy(want, dst, cap);
  memcpy(want + GUARD + do_, src + so, len);
  if (g_direct) {
    hixl__copy_stream(dst + GUARD + do_, src + so, len);
    hixl__copy_fence();
  } else {
    hixl__copy(dst + GUARD + do_, src + so, len);
  }
  if (memcmp(dst, want, cap) != 0) {
    size_t i = 0;
    while (dst[i] == want[i])
      i++;
    fail_msg("len %zu src+%zu dst+%zu: first difference at byte %zd of the destination", len, so,
             do_, (ssize_t)i - GUARD - (ssize_t)do_);
  }
}

static void run_matrix(void)
{
  size_t cap = (3u << 20) + 4 * GUARD;
  uint8_t *src = aligned_alloc(64, cap), *dst = aligned_alloc(64, cap),
          *want = aligned_alloc(64, cap);
  assert_non_null(src);
  assert_non_null(dst);
  assert_non_null(want);
  fill(src, cap, 1);
  for (size_t so = 0; so < 18; so++)
    for (size_t d = 0; d < 18; d++)
      for (size_t len = 0; len <= 600; len += (len < 200 ? 1 : 7))
        check(src, dst, want, 2048, so, d, len);
  static const size_t big[] = {4095, 65536 + 13, (1u << 20) + 1, (3u << 20) - 3};
  for (size_t k = 0; k < sizeof(big) / sizeof(big[0]); k++)
    for (size_t a = 0; a < 4; a++)
      check(src, dst, want, cap, a * 5, a * 3 + 1, big[k]);
  free(src);
  free(dst);
  free(want);
}

static void test_streaming(void **state)
{
  (void)state;
  setenv("HIXL_COPY_STREAM_MIN", "64", 1);
  hixl__copy_init();
  run_matrix();
}

static void test_memcpy_only(void **state)
{
  (void)state;
  setenv("HIXL_COPY_STREAM_MIN", "0", 1); /* never stream */
  hixl__copy_init();
  run_matrix();
}

/* The streaming copy at every size, as shm batches call it for each block
 * (blocks smaller than the alignment head included). */
static void test_stream_direct(void **state)
{
  (void)state;
  g_direct = true;
  run_matrix();
  g_direct = false;
}

static void test_default_threshold(void **state)
{
  (void)state;
  unsetenv("HIXL_COPY_STREAM_MIN");
  hixl__copy_init();
  run_matrix();
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_streaming),
      cmocka_unit_test(test_memcpy_only),
      cmocka_unit_test(test_stream_direct),
      cmocka_unit_test(test_default_threshold),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

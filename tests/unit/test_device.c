/* SPDX-License-Identifier: MIT */
/*
 * The device shim's emulated backend, white box: which addresses are device
 * memory (edges included), copies in every direction and overlapping ones,
 * IPC export / import of the same pages (and no import of an unsealed or
 * short memfd), the NIC view, and that freeing forgets.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core.h"
#include "../device/backend.h"

static void test_lookup_edges(void **state)
{
  (void)state;
  const hixl_dev_ops_t *d = hixl__dev_backend();
  assert_non_null(d);
  assert_string_equal(d->name, "emulated");
  void *p;
  int dev;
  assert_int_equal(hixl__dev_alloc(10000, &dev, &p), HIXL_OK);
  assert_int_equal(dev, 0);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t len = (10000 + page - 1) / page * page;
  hixl_dev_range_t r;
  assert_true(hixl__dev_lookup(p, &r));
  assert_int_equal(r.base, (uintptr_t)p);
  assert_int_equal(r.len, len);
  assert_true(hixl__dev_lookup((uint8_t *)p + len - 1, &r));
  assert_false(hixl__dev_lookup((uint8_t *)p + len, &r));
  assert_false(hixl__dev_lookup((uint8_t *)p - 1, &r));
  assert_true(hixl__is_dev(p));
  int host = 0;
  assert_false(hixl__is_dev(&host));
  /* Ranges: inside, to the end, one past. */
  assert_int_equal(hixl__dev_check_local("t", p, len), HIXL_OK);
  assert_int_equal(hixl__dev_check_local("t", (uint8_t *)p + 1, len), HIXL_ERR_INVALID);
  assert_int_equal(hixl__dev_check_reg("t", p, len, 0), HIXL_OK);
  assert_int_equal(hixl__dev_check_reg("t", p, len, 1), HIXL_ERR_INVALID);
  assert_int_equal(hixl__dev_check_reg("t", p, len, 2), HIXL_ERR_NO_DEVICE);
  assert_int_equal(hixl__dev_check_reg("t", &host, 8, 0), HIXL_ERR_INVALID);
  hixl__dev_free(p);
  assert_false(hixl__dev_lookup(p, &r));
}

static void test_copies(void **state)
{
  (void)state;
  enum { N = 3 << 20 };
  uint8_t *a, *b;
  int dev;
  assert_int_equal(hixl__dev_alloc(N, &dev, (void **)&a), HIXL_OK);
  assert_int_equal(hixl__dev_alloc(N, &dev, (void **)&b), HIXL_OK);
  uint8_t *h = malloc(N), *g = malloc(N);
  for (size_t i = 0; i < N; i++)
    h[i] = (uint8_t)(i * 13 + 1);
  /* H2D, D2D, D2H. */
  assert_int_equal(hixl_mem_copy(a + 3, h, N - 3), HIXL_OK);
  assert_int_equal(hixl_mem_copy(b, a + 3, N - 3), HIXL_OK);
  memset(g, 0, N);
  assert_int_equal(hixl_mem_copy(g, b, N - 3), HIXL_OK);
  assert_memory_equal(g, h, N - 3);
  /* Overlapping, inside one allocation: memmove semantics. */
  assert_int_equal(hixl_mem_copy(b + 100, b, 1 << 20), HIXL_OK);
  assert_int_equal(hixl_mem_copy(g, b + 100, 1 << 20), HIXL_OK);
  assert_memory_equal(g, h, 1 << 20);
  /* Past the end of either side: refused. */
  assert_int_equal(hixl_mem_copy(a + N - 10, h, 4096), HIXL_ERR_INVALID);
  assert_int_equal(hixl_mem_copy(h, b + N - 10, 4096), HIXL_ERR_INVALID);
  /* The NIC view holds the same bytes the copies put there. */
  uint8_t *v = hixl__dev_nic_addr(b);
  assert_non_null(v);
  assert_memory_equal(v + 100, h, 4096);
  hixl__dev_free(a);
  hixl__dev_free(b);
  free(h);
  free(g);
}

static void test_ipc(void **state)
{
  (void)state;
  uint8_t *p;
  int dev;
  assert_int_equal(hixl__dev_alloc(1 << 20, &dev, (void **)&p), HIXL_OK);
  hixl_dev_ipc_t h;
  uint64_t off;
  assert_int_equal(hixl__dev_ipc_export(p + 4096 + 7, 1000, getpid(), &h, &off), HIXL_OK);
  assert_int_equal(off, 4096 + 7);
  assert_true(h.fd >= 0);
  void *base;
  assert_int_equal(hixl__dev_ipc_import(&h, &base), HIXL_OK);
  assert_int_equal(h.fd, -1); /* consumed */
  assert_ptr_not_equal(base, p);
  hixl_dev_range_t r;
  assert_true(hixl__dev_lookup(base, &r)); /* imported memory is device memory too */
  /* The same pages: written through one, read through the other. */
  char msg[] = "through the IPC handle";
  assert_int_equal(hixl_mem_copy(p + off, msg, sizeof(msg)), HIXL_OK);
  char back[sizeof(msg)];
  assert_int_equal(hixl_mem_copy(back, (uint8_t *)base + off, sizeof(msg)), HIXL_OK);
  assert_string_equal(back, msg);
  hixl__dev_ipc_close(base);
  assert_false(hixl__dev_lookup(base, &r));
  /* Host memory cannot be exported. */
  int x;
  assert_int_equal(hixl__dev_ipc_export(&x, 4, getpid(), &h, &off), HIXL_ERR_NOT_REGISTERED);
  hixl__dev_free(p);
}

/* The importer maps a peer's memfd only if it is sealed against shrinking
 * and as long as claimed: an exporter that truncated it under the mapping
 * killed the importer with SIGBUS (issue 13). */
static void test_ipc_unsealed(void **state)
{
  (void)state;
  hixl_dev_ipc_t h = {.len = 0, .alloc_len = 1 << 20, .device = 0};
  void *base;
  h.fd = memfd_create("unsealed", MFD_CLOEXEC); /* unsealed */
  assert_true(h.fd >= 0 && ftruncate(h.fd, 1 << 20) == 0);
  assert_int_equal(hixl__dev_ipc_import(&h, &base), HIXL_ERR_TRANSPORT);
  assert_non_null(strstr(hixl_last_error(), "sealed"));
  h.fd = hixl__memfd("short", 4096); /* sealed, but shorter than it claims */
  assert_true(h.fd >= 0);
  assert_int_equal(hixl__dev_ipc_import(&h, &base), HIXL_ERR_TRANSPORT);
  h.fd = hixl__memfd("fine", 1 << 20);
  assert_true(h.fd >= 0);
  assert_int_equal(hixl__dev_ipc_import(&h, &base), HIXL_OK);
  hixl__dev_ipc_close(base);
}

int main(void)
{
  setenv("HIXL_DEVICE", "emulated", 1);
  hixl__dev_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lookup_edges),
      cmocka_unit_test(test_copies),
      cmocka_unit_test(test_ipc),
      cmocka_unit_test(test_ipc_unsealed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

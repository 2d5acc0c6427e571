/* SPDX-License-Identifier: MIT */
/* The MPMC notification ring: FIFO, full/empty, and exactly-once under
 * concurrent producers and consumers; and, with its shared part written by
 * a hostile peer (absurd cap, corrupted seq, indices out of range), every
 * call bounded and inside the ring (run it under valgrind or ASan: the
 * rings are allocated to their exact size). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ring.h"

static hixl_ring_t *new_ring(uint64_t cap)
{
  hixl_ring_t *r = aligned_alloc(64, hixl_ring_bytes(cap));
  hixl_ring_init(r, cap);
  return r;
}

static void test_fifo_full_empty(void **state)
{
  (void)state;
  hixl_ring_t *r = new_ring(8);
  uint32_t imm;
  uint64_t len;
  assert_false(hixl_ring_pop(r, &imm, &len));
  assert_false(hixl_ring_maybe_nonempty(r));
  for (int round = 0; round < 5; round++) { /* wraps several times */
    for (uint32_t i = 0; i < 8; i++)
      assert_true(hixl_ring_push(r, i + 100u * (uint32_t)round, i));
    assert_false(hixl_ring_push(r, 999, 0)); /* full */
    assert_true(hixl_ring_maybe_nonempty(r));
    for (uint32_t i = 0; i < 8; i++) {
      assert_true(hixl_ring_pop(r, &imm, &len));
      assert_int_equal(imm, i + 100u * (uint32_t)round);
      assert_int_equal(len, i);
    }
    assert_false(hixl_ring_pop(r, &imm, &len));
  }
  assert_true(hixl_ring_valid(r, 8));
  assert_false(hixl_ring_valid(r, 16));
  r->sh->magic = 0;
  assert_false(hixl_ring_valid(r, 8));
  free(r);
}

static void test_claim_then_publish_keeps_order(void **state)
{
  (void)state;
  hixl_ring_t *r = new_ring(4);
  uint64_t p0 = 0, p1 = 0;
  assert_true(hixl_ring_claim(r, &p0));
  assert_true(hixl_ring_claim(r, &p1));
  hixl_ring_publish(r, p1, 1, 0);
  uint32_t imm;
  uint64_t len;
  /* p0 claimed but unpublished: nothing is visible yet, p1 must wait. */
  assert_false(hixl_ring_pop(r, &imm, &len));
  hixl_ring_publish(r, p0, 0, 0);
  assert_true(hixl_ring_pop(r, &imm, &len));
  assert_int_equal(imm, 0);
  assert_true(hixl_ring_pop(r, &imm, &len));
  assert_int_equal(imm, 1);
  free(r);
}

enum { PRODUCERS = 4, CONSUMERS = 2, PER = 200000 };
static hixl_ring_t *g_ring;
static _Atomic uint64_t g_taken;
static uint8_t *g_seen;
static _Atomic int g_order_errors;

static void *producer(void *arg)
{
  uint32_t id = (uint32_t)(uintptr_t)arg;
  for (uint32_t i = 0; i < PER; i++)
    while (!hixl_ring_push(g_ring, id << 24 | i, id))
      ;
  return NULL;
}

static void *consumer(void *arg)
{
  (void)arg;
  uint32_t last[PRODUCERS];
  memset(last, 0xff, sizeof(last));
  while (atomic_load(&g_taken) < (uint64_t)PRODUCERS * PER) {
    uint32_t imm;
    uint64_t len;
    if (!hixl_ring_pop(g_ring, &imm, &len))
      continue;
    uint32_t id = imm >> 24, seq = imm & 0xffffff;
    if (id != len || id >= PRODUCERS)
      atomic_fetch_add(&g_order_errors, 1);
    /* Per producer, one consumer sees increasing sequence numbers. */
    if (last[id] != 0xffffffffu && seq <= last[id])
      atomic_fetch_add(&g_order_errors, 1);
    last[id] = seq;
    g_seen[(size_t)id * PER + seq]++;
    atomic_fetch_add(&g_taken, 1);
  }
  return NULL;
}

static void test_mpmc_exactly_once(void **state)
{
  (void)state;
  g_ring = new_ring(1024);
  g_seen = calloc((size_t)PRODUCERS * PER, 1);
  pthread_t p[PRODUCERS], c[CONSUMERS];
  for (int i = 0; i < CONSUMERS; i++)
    pthread_create(&c[i], NULL, consumer, NULL);
  for (int i = 0; i < PRODUCERS; i++)
    pthread_create(&p[i], NULL, producer, (void *)(uintptr_t)i);
  for (int i = 0; i < PRODUCERS; i++)
    pthread_join(p[i], NULL);
  for (int i = 0; i < CONSUMERS; i++)
    pthread_join(c[i], NULL);
  assert_int_equal(atomic_load(&g_order_errors), 0);
  for (size_t i = 0; i < (size_t)PRODUCERS * PER; i++)
    if (g_seen[i] != 1)
      fail_msg("entry %zu taken %u times", i, g_seen[i]);
  free(g_seen);
  free(g_ring);
}

/* A hostile producer set cap to 2^40 (and garbage magic): the views keep
 * their own capacity, so nothing reads past the 8 cells. */
static void test_hostile_cap(void **state)
{
  (void)state;
  hixl_ring_t *r = new_ring(8);
  r->sh->cap = (uint64_t)1 << 40;
  r->sh->magic = 0x4141414141414141ull;
  assert_false(hixl_ring_shared_valid(r->sh, 8));
  uint32_t imm;
  uint64_t len;
  for (int round = 0; round < 3; round++) {
    for (uint32_t i = 0; i < 8; i++)
      assert_true(hixl_ring_push(r, i, i));
    assert_false(hixl_ring_push(r, 9, 9));
    for (uint32_t i = 0; i < 8; i++) {
      assert_true(hixl_ring_pop(r, &imm, &len));
      assert_int_equal(imm, i);
    }
    assert_false(hixl_ring_pop(r, &imm, &len));
    assert_false(hixl_ring_maybe_nonempty(r));
  }
  free(r);
}

/* One 8-byte store to a cell's seq: the consumer reports "nothing" instead
 * of spinning (it used to loop forever, holding ctx->lock), and producers
 * give up as if full; nothing else is disturbed. */
static void test_hostile_seq(void **state)
{
  (void)state;
  alarm(20); /* a spin is a failure, not a hung suite */
  hixl_ring_t *r = new_ring(8);
  uint32_t imm;
  uint64_t len;
  assert_true(hixl_ring_push(r, 1, 1));
  atomic_store(&r->sh->cells[0].seq_off, 12345); /* ahead of the consumer */
  assert_false(hixl_ring_pop(r, &imm, &len));
  assert_false(hixl_ring_maybe_nonempty(r));
  /* A producer facing a cell ahead of its head (a fake target): bounded. */
  hixl_ring_t *p = new_ring(8);
  for (uint64_t i = 0; i < 8; i++)
    atomic_store(&p->sh->cells[i].seq_off, 1000); /* seq i + 1000 */
  assert_false(hixl_ring_push(p, 1, 1));
  /* Behind: full. */
  for (uint64_t i = 0; i < 8; i++)
    atomic_store(&p->sh->cells[i].seq_off, (uint64_t)0 - i); /* seq 0 */
  atomic_store(&p->sh->head, 5);
  assert_false(hixl_ring_push(p, 1, 1));
  alarm(0);
  free(p);
  free(r);
}

/* head and every seq set to garbage, then operations: all bounded, all
 * inside the ring (ASan / valgrind), the consumer's own position intact. */
static void test_hostile_indices(void **state)
{
  (void)state;
  alarm(20);
  hixl_ring_t *r = new_ring(16);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  uint32_t imm;
  uint64_t len;
  for (int round = 0; round < 2000; round++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    atomic_store(&r->sh->head, x);
    atomic_store(&r->sh->cells[x & 15].seq_off, x >> 3);
    if (round % 3 == 0) /* a cell that looks ready for the consumer */
      atomic_store(&r->sh->cells[(x >> 8) & 15].seq_off,
                   atomic_load(&r->tail) + 1 - ((x >> 8) & 15));
    for (int k = 0; k < 4; k++) {
      (void)hixl_ring_push(r, (uint32_t)k, x);
      (void)hixl_ring_pop(r, &imm, &len);
      (void)hixl_ring_maybe_nonempty(r);
    }
  }
  assert_int_equal(r->mask, 15);
  alarm(0);
  free(r);
}

/* The shm inbox lives in a fresh memfd: all-zero cells are the initial
 * state, so initialising it writes the header alone (no cell page is
 * faulted in: finding 6, an idle peer cost its target 512 KiB), and such a
 * ring works like any other, across wraps. */
static void test_zeroed_init(void **state)
{
  (void)state;
  enum { CAP = 1024 };
  size_t bytes = hixl_ring_shared_bytes(CAP);
  hixl_ring_shared_t *sh = aligned_alloc(64, bytes);
  memset(sh, 0xab, bytes);
  hixl_ring_shared_init_zeroed(sh, CAP);
  for (size_t o = offsetof(hixl_ring_shared_t, cells); o < bytes; o++)
    if (((uint8_t *)sh)[o] != 0xab)
      fail_msg("init wrote byte %zu of the cells", o);
  memset(sh, 0, bytes);
  hixl_ring_shared_init_zeroed(sh, CAP);
  assert_true(hixl_ring_shared_valid(sh, CAP));
  hixl_ring_t r;
  hixl_ring_attach(&r, sh, CAP);
  uint32_t imm;
  uint64_t len;
  assert_false(hixl_ring_pop(&r, &imm, &len));
  assert_false(hixl_ring_maybe_nonempty(&r));
  /* A few entries touch only their cells. */
  for (uint32_t i = 0; i < 3; i++)
    assert_true(hixl_ring_push(&r, i, i));
  for (size_t o = offsetof(hixl_ring_shared_t, cells) + 3 * sizeof(hixl_ring_cell_t); o < bytes;
       o++)
    if (((uint8_t *)sh)[o] != 0)
      fail_msg("3 pushes wrote byte %zu", o);
  for (uint32_t i = 0; i < 3; i++) {
    assert_true(hixl_ring_pop(&r, &imm, &len));
    assert_int_equal(imm, i);
  }
  for (int round = 0; round < 5; round++) { /* wraps: full, then empty, each time */
    for (uint32_t i = 0; i < CAP; i++)
      assert_true(hixl_ring_push(&r, i + (uint32_t)round, i));
    assert_false(hixl_ring_push(&r, 0, 0));
    for (uint32_t i = 0; i < CAP; i++) {
      assert_true(hixl_ring_pop(&r, &imm, &len));
      assert_int_equal(imm, i + (uint32_t)round);
      assert_int_equal(len, i);
    }
    assert_false(hixl_ring_pop(&r, &imm, &len));
  }
  free(sh);
}

/* The context inbox's tags: each entry keeps its producer's word, in
 * order; retag rewrites only published, untaken entries (a claimed but
 * unpublished cell, and taken ones, are left alone). */
static void test_tags_and_retag(void **state)
{
  (void)state;
  hixl_ring_t *r = new_ring(8);
  assert_true(hixl_ring_push_tag(r, 1, 10, 0xa));
  assert_true(hixl_ring_push_tag(r, 2, 20, 0xb));
  assert_true(hixl_ring_push_tag(r, 3, 30, 0xa));
  uint32_t imm;
  uint64_t len, tag;
  assert_true(hixl_ring_pop_tag(r, &imm, &len, &tag)); /* taken: not retagged below */
  assert_int_equal(imm, 1);
  assert_int_equal(tag, 0xa);
  assert_true(hixl_ring_push_tag(r, 4, 40, 0xa));
  uint64_t pos = 0;
  assert_true(hixl_ring_claim(r, &pos)); /* claimed, not yet published */
  assert_int_equal(hixl_ring_retag(r, 0xa, 0), 2);
  hixl_ring_publish_tag(r, pos, 5, 50, 0xa); /* published after: keeps its tag */
  const uint64_t want_tag[] = {0xb, 0, 0, 0xa};
  const uint32_t want_imm[] = {2, 3, 4, 5};
  for (int i = 0; i < 4; i++) {
    assert_true(hixl_ring_pop_tag(r, &imm, &len, &tag));
    assert_int_equal(imm, want_imm[i]);
    assert_int_equal(len, 10 * want_imm[i]);
    assert_int_equal(tag, want_tag[i]);
  }
  assert_false(hixl_ring_pop_tag(r, &imm, &len, &tag));
  assert_int_equal(hixl_ring_retag(r, 0xa, 0), 0);
  free(r);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fifo_full_empty),
      cmocka_unit_test(test_claim_then_publish_keeps_order),
      cmocka_unit_test(test_mpmc_exactly_once),
      cmocka_unit_test(test_hostile_cap),
      cmocka_unit_test(test_hostile_seq),
      cmocka_unit_test(test_hostile_indices),
      cmocka_unit_test(test_zeroed_init),
      cmocka_unit_test(test_tags_and_retag),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * Forged owner-copy messages (shm without CMA), run under no-cma:
 *     owner_copy
 * The initiator side here is white-box (it links the internal objects and
 * reads src/shm/shm_int.h): after a real put has set up the staging area
 * the target lent us, it sends SHM_COPY messages that no hixl initiator
 * sends (wrong rkey, slot out of range, ranges outside the region or
 * wrapping, missing rights, a deregistered region, lengths beyond the
 * staging area or huge, a staging offset outside it, no length, an unknown
 * direction) and checks, for each, the exact status the target publishes
 * in the staging header; then that every region of the target is
 * unchanged (its own hash), that it still serves, that a legitimate copy
 * still works on the same connection, that a second SHM_STAGE_REQ lends
 * the same area, and that SHM_COPY on a connection without a staging area
 * drops that connection only.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "core.h"
#include "shm_int.h"

typedef struct fixture {
  hixl_ctx_t *ctx;
  target_t t;
  hixl_peer_t *peer;
  hixl_rmr_t *reg, *reg_ro, *wo, *tmp, *alloc;
  uint64_t h_reg, h_reg_ro, h_wo, h_alloc, h_ctr_reg;
} fixture_t;

static void hash_all(fixture_t *f, bool check)
{
  uint64_t a = target_hash(&f->t, "reg", 0, BIG_LEN),
           b = target_hash(&f->t, "reg_ro", 0, SMALL_LEN),
           c = target_hash(&f->t, "wo", 0, SMALL_LEN), d = target_hash(&f->t, "alloc", 0, BIG_LEN),
           e = target_hash(&f->t, "ctr_reg", 0, CTR_LEN);
  if (check) {
    assert_int_equal(a, f->h_reg);
    assert_int_equal(b, f->h_reg_ro);
    assert_int_equal(c, f->h_wo);
    assert_int_equal(d, f->h_alloc);
    assert_int_equal(e, f->h_ctr_reg);
  } else {
    f->h_reg = a, f->h_reg_ro = b, f->h_wo = c, f->h_alloc = d, f->h_ctr_reg = e;
  }
}

/* A put and a get through the owner on the "reg" region (which leaves it
 * as it was: the bytes put are the ones that were there). */
static void legit_round_trip(fixture_t *f)
{
  enum { LEN = 300000 }; /* several pieces */
  uint8_t *orig = malloc(LEN), *back = malloc(LEN);
  EXPECT_OK(hixl_get(f->peer, orig, LEN, f->reg, 12345, 0, NULL));
  EXPECT_OK(hixl_put(f->peer, orig, LEN, f->reg, 12345, 0, NULL));
  EXPECT_OK(hixl_get(f->peer, back, LEN, f->reg, 12345, 0, NULL));
  assert_memory_equal(orig, back, LEN);
  free(orig);
  free(back);
}

static int setup(void **state)
{
  fixture_t *f = calloc(1, sizeof(*f));
  f->ctx = test_ctx(3000, NULL);
  target_start(&f->t, f->ctx, NULL, 3000);
  f->peer = connect_to(f->ctx, &f->t);
  f->reg = lookup(f->peer, "reg");
  f->reg_ro = lookup(f->peer, "reg_ro");
  f->wo = lookup(f->peer, "wo");
  f->tmp = lookup(f->peer, "tmp");
  f->alloc = lookup(f->peer, "alloc");
  legit_round_trip(f); /* refused CMA, switched to owner copies, got the staging area */
  shm_peer_t *sp = f->peer->tp;
  if (!atomic_load(&sp->cma_refused) || !sp->out.ready)
    fail_msg("the kernel allowed CMA: run this test under no-cma");
  hash_all(f, false);
  *state = f;
  return 0;
}

static int teardown(void **state)
{
  fixture_t *f = *state;
  hash_all(f, true);
  hixl_disconnect(f->peer);
  target_stop(&f->t);
  hixl_ctx_destroy(f->ctx);
  free(f);
  return 0;
}

/* Send one forged SHM_COPY and return the status the owner published for it. */
static hixl_status_t forge(fixture_t *f, uint32_t slot, uint32_t dir, uint64_t rkey, uint64_t off,
                           uint64_t len, uint64_t soff)
{
  shm_peer_t *sp = f->peer->tp;
  shm_stage_out_t *so = &sp->out;
  pthread_mutex_lock(&so->lock); /* keep the initiator's own count right */
  hixl_msg_t m = {.type = HIXL_MSG_TP_REQ};
  m.u32[0] = slot; /* shm_copy_msg_t, written as the attacker's raw words */
  m.u32[1] = dir;
  m.u32[2] = SHM_KIND_COPY;
  m.u64[0] = rkey;
  m.u64[1] = off;
  m.u64[2] = len;
  m.u64[3] = soff;
  EXPECT_OK(hixl__send(f->peer, &m, NULL, 0));
  uint64_t n = ++so->sent;
  for (int i = 0; atomic_load(&so->hdr->done) < n; i++) {
    if (i > 5000)
      fail_msg("the owner did not answer a forged copy");
    usleep(1000);
  }
  hixl_status_t st =
      atomic_load(&so->hdr->err_seq) == n ? atomic_load(&so->hdr->err_status) : HIXL_OK;
  pthread_mutex_unlock(&so->lock);
  return st;
}

static void test_forged(void **state)
{
  fixture_t *f = *state;
  shm_peer_t *sp = f->peer->tp;
  uint64_t size = sp->out.size;
  hixl_rmr_t *reg = f->reg;
  enum { P = SHM_COPY_PUT, G = SHM_COPY_GET };
  /* Keys and slots. */
  assert_int_equal(forge(f, reg->slot, P, reg->rkey ^ 1, 0, 64, 0), HIXL_ERR_NOT_REGISTERED);
  assert_int_equal(forge(f, reg->slot, G, 0, 0, 64, 0), HIXL_ERR_NOT_REGISTERED);
  assert_int_equal(forge(f, HIXL_REG_SLOTS, P, reg->rkey, 0, 64, 0), HIXL_ERR_NOT_REGISTERED);
  assert_int_equal(forge(f, UINT32_MAX, G, reg->rkey, 0, 64, 0), HIXL_ERR_NOT_REGISTERED);
  assert_int_equal(forge(f, f->alloc->slot, P, reg->rkey, 0, 64, 0), HIXL_ERR_NOT_REGISTERED);
  /* Ranges: past the end, across it, wrapping around 2^64. */
  assert_int_equal(forge(f, reg->slot, P, reg->rkey, BIG_LEN, 1, 0), HIXL_ERR_NOT_REGISTERED);
  assert_int_equal(forge(f, reg->slot, P, reg->rkey, BIG_LEN + 1, 64, 0), HIXL_ERR_NOT_REGISTERED);
  assert_int_equal(forge(f, reg->slot, P, reg->rkey, BIG_LEN - 10, 64, 0), HIXL_ERR_NOT_REGISTERED);
  assert_int_equal(forge(f, reg->slot, G, reg->rkey, BIG_LEN - 10, 64, 0), HIXL_ERR_NOT_REGISTERED);
  assert_int_equal(forge(f, reg->slot, P, reg->rkey, UINT64_MAX - 10, 64, 0),
                   HIXL_ERR_NOT_REGISTERED);
  /* Rights: put into a READ-only region (heap and memfd), get from WRITE-only. */
  assert_int_equal(forge(f, f->reg_ro->slot, P, f->reg_ro->rkey, 0, 64, 0), HIXL_ERR_ACCESS);
  assert_int_equal(forge(f, f->wo->slot, G, f->wo->rkey, 0, 64, 0), HIXL_ERR_ACCESS);
  /* Lengths and staging offsets: beyond the staging area, huge, wrapping,
   * zero; an unknown direction. */
  assert_int_equal(forge(f, reg->slot, P, reg->rkey, 0, size + 1, 0), HIXL_ERR_INVALID);
  assert_int_equal(forge(f, reg->slot, G, reg->rkey, 0, (uint64_t)1 << 40, 0), HIXL_ERR_INVALID);
  assert_int_equal(forge(f, reg->slot, G, reg->rkey, 0, UINT64_MAX, 0), HIXL_ERR_INVALID);
  assert_int_equal(forge(f, reg->slot, P, reg->rkey, 0, 64, size), HIXL_ERR_INVALID);
  assert_int_equal(forge(f, reg->slot, P, reg->rkey, 0, 64, size - 10), HIXL_ERR_INVALID);
  assert_int_equal(forge(f, reg->slot, G, reg->rkey, 0, 64, UINT64_MAX - 10), HIXL_ERR_INVALID);
  assert_int_equal(forge(f, reg->slot, P, reg->rkey, 0, 0, 0), HIXL_ERR_INVALID);
  assert_int_equal(forge(f, reg->slot, 0, reg->rkey, 0, 64, 0), HIXL_ERR_INVALID);
  assert_int_equal(forge(f, reg->slot, 3, reg->rkey, 0, 64, 0), HIXL_ERR_INVALID);
  /* Device memory (HIXL_TEST_DEVICE_REGIONS=1, emulated): the owner's CPU
   * cannot copy it; refused even with every right. */
  if (getenv("HIXL_TEST_DEVICE_REGIONS")) {
    hixl_rmr_t *dev = lookup(f->peer, "dev_reg");
    assert_int_equal(forge(f, dev->slot, P, dev->rkey, 0, 64, 0), HIXL_ERR_UNSUPPORTED);
    assert_int_equal(forge(f, dev->slot, G, dev->rkey, 0, 64, 0), HIXL_ERR_UNSUPPORTED);
    hixl_rmr_release(dev);
  }
  /* A region the owner deregistered: its old rkey is refused. */
  assert_true(target_cmd(&f->t, NULL, 0, "dereg tmp"));
  assert_int_equal(forge(f, f->tmp->slot, P, f->tmp->rkey, 0, 64, 0), HIXL_ERR_NOT_REGISTERED);
  /* Legitimate ones on the same connection still work (and the last,
   * within range, right at the end of the region and of the staging). */
  assert_int_equal(forge(f, reg->slot, G, reg->rkey, BIG_LEN - 64, 64, size - 64), HIXL_OK);
  legit_round_trip(f);
  assert_true(target_cmd(&f->t, NULL, 0, "ping"));
}

/* A second request lends the very same area (a peer cannot make the owner
 * allocate more by asking again). */
static void test_stage_again(void **state)
{
  fixture_t *f = *state;
  shm_peer_t *sp = f->peer->tp;
  for (int i = 0; i < 3; i++) {
    hixl_msg_t m = {.type = HIXL_MSG_TP_REQ}, reply;
    m.u32[2] = SHM_KIND_STAGE;
    int fd = -1;
    EXPECT_OK(hixl__call(f->peer, &m, HIXL_MSG_TP_REPLY, &reply, &fd, hixl__deadline(3000)));
    assert_true(fd >= 0);
    assert_int_equal(reply.u64[0], sp->out.size);
    close(fd);
  }
  legit_round_trip(f);
}

/* SHM_COPY on a connection that has no staging area: that connection is
 * dropped (a protocol error), the target survives and serves others. */
static void test_copy_without_stage(void **state)
{
  fixture_t *f = *state;
  hixl_peer_t *p2 = connect_to(f->ctx, &f->t);
  hixl_rmr_t *r2 = lookup(p2, "reg");
  hixl_msg_t m = {.type = HIXL_MSG_TP_REQ};
  m.u32[0] = r2->slot;
  m.u32[1] = SHM_COPY_PUT;
  m.u32[2] = SHM_KIND_COPY;
  m.u64[0] = r2->rkey;
  m.u64[2] = 64;
  EXPECT_OK(hixl__send(p2, &m, NULL, 0));
  for (int i = 0; atomic_load(&p2->state) == HIXL_PEER_UP; i++) {
    if (i > 5000)
      fail_msg("the owner kept a connection that sent SHM_COPY without a staging area");
    usleep(1000);
  }
  uint8_t b[64];
  assert_int_equal(hixl_put(p2, b, sizeof(b), r2, 0, 0, NULL), HIXL_ERR_PEER_LOST);
  hixl_rmr_release(r2);
  hixl_disconnect(p2);
  assert_true(target_cmd(&f->t, NULL, 0, "ping"));
  legit_round_trip(f);
}

int main(int argc, char **argv)
{
  harness_init(argc, argv);
  g_transport = "shm";
  (void)argv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_forged, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stage_again, setup, teardown),
      cmocka_unit_test_setup_teardown(test_copy_without_stage, setup, teardown),
  };
  return cmocka_run_group_tests_name("owner_copy", tests, NULL, NULL);
}

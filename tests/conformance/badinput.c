/* SPDX-License-Identifier: MIT */
/*
 * The bad-input matrix, per transport:  badinput self|shm
 * Each case asserts the exact status and that the target's memory is
 * unchanged (hash of the whole region before and after, taken by the target
 * itself).
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "core.h"
#include "rkey.h"

typedef struct fixture {
  session_t s;
  hixl_rmr_t *alloc, *reg, *ro, *wo, *ctr;
  uint64_t h_alloc, h_reg, h_ro, h_wo, h_ctr;
} fixture_t;

static int setup(void **state)
{
  fixture_t *f = calloc(1, sizeof(*f));
  session_open(&f->s, 2000, 2000);
  f->alloc = lookup(f->s.peer, "alloc");
  f->reg = lookup(f->s.peer, "reg");
  f->ro = lookup(f->s.peer, "ro");
  f->wo = lookup(f->s.peer, "wo");
  f->ctr = lookup(f->s.peer, "ctr");
  f->h_alloc = target_hash(&f->s.t, "alloc", 0, BIG_LEN);
  f->h_reg = target_hash(&f->s.t, "reg", 0, BIG_LEN);
  f->h_ro = target_hash(&f->s.t, "ro", 0, SMALL_LEN);
  f->h_wo = target_hash(&f->s.t, "wo", 0, SMALL_LEN);
  f->h_ctr = target_hash(&f->s.t, "ctr", 0, CTR_LEN);
  *state = f;
  return 0;
}

/* Nothing in any region changed. */
static void assert_unchanged(fixture_t *f)
{
  assert_int_equal(target_hash(&f->s.t, "alloc", 0, BIG_LEN), f->h_alloc);
  assert_int_equal(target_hash(&f->s.t, "reg", 0, BIG_LEN), f->h_reg);
  assert_int_equal(target_hash(&f->s.t, "ro", 0, SMALL_LEN), f->h_ro);
  assert_int_equal(target_hash(&f->s.t, "wo", 0, SMALL_LEN), f->h_wo);
  assert_int_equal(target_hash(&f->s.t, "ctr", 0, CTR_LEN), f->h_ctr);
}

static int teardown(void **state)
{
  fixture_t *f = *state;
  assert_unchanged(f);
  session_close(&f->s);
  free(f);
  return 0;
}

static uint8_t g_buf[1 << 16];

static void test_out_of_bounds(void **state)
{
  fixture_t *f = *state;
  hixl_rmr_t *rs[] = {f->alloc, f->reg};
  for (int i = 0; i < 2; i++) {
    hixl_rmr_t *r = rs[i];
    hixl_req_t *req = (hixl_req_t *)0x1; /* must stay untouched */
    assert_int_equal(hixl_put(f->s.peer, g_buf, 8, r, BIG_LEN, 0, &req), HIXL_ERR_NOT_REGISTERED);
    assert_ptr_equal(req, (hixl_req_t *)0x1);
    assert_non_null(strstr(hixl_last_error(), "outside"));
    assert_int_equal(hixl_put(f->s.peer, g_buf, 11, r, BIG_LEN - 10, 0, NULL),
                     HIXL_ERR_NOT_REGISTERED);
    assert_int_equal(hixl_get(f->s.peer, g_buf, 2, r, BIG_LEN - 1, 0, NULL),
                     HIXL_ERR_NOT_REGISTERED);
    assert_int_equal(hixl_put_imm(f->s.peer, g_buf, 16, r, BIG_LEN - 8, 1, 0, NULL),
                     HIXL_ERR_NOT_REGISTERED);
    assert_int_equal(hixl_atomic_faa(f->s.peer, r, BIG_LEN - 4, 1, NULL, 0, NULL),
                     HIXL_ERR_NOT_REGISTERED);
    /* off + len overflows 64 bits. */
    assert_int_equal(hixl_put(f->s.peer, g_buf, 16, r, UINT64_MAX - 7, 0, NULL),
                     HIXL_ERR_NOT_REGISTERED);
    assert_int_equal(hixl_get(f->s.peer, g_buf, SIZE_MAX, r, 1, 0, NULL), HIXL_ERR_NOT_REGISTERED);
  }
}

static void test_missing_rights(void **state)
{
  fixture_t *f = *state;
  assert_int_equal(hixl_put(f->s.peer, g_buf, 8, f->ro, 0, 0, NULL), HIXL_ERR_ACCESS);
  assert_non_null(strstr(hixl_last_error(), "WRITE"));
  assert_int_equal(hixl_put_imm(f->s.peer, g_buf, 8, f->ro, 0, 5, 0, NULL), HIXL_ERR_ACCESS);
  assert_int_equal(hixl_get(f->s.peer, g_buf, 8, f->wo, 0, 0, NULL), HIXL_ERR_ACCESS);
  assert_int_equal(hixl_atomic_faa(f->s.peer, f->ro, 0, 1, NULL, 0, NULL), HIXL_ERR_ACCESS);
  assert_int_equal(hixl_atomic_cas(f->s.peer, f->wo, 0, 0, 1, NULL, 0, NULL), HIXL_ERR_ACCESS);
  hixl_rmr_t *reg_ro = lookup(f->s.peer, "reg_ro");
  assert_int_equal(hixl_put(f->s.peer, g_buf, 8, reg_ro, 0, 0, NULL), HIXL_ERR_ACCESS);
  uint8_t v[8];
  assert_int_equal(hixl_get(f->s.peer, v, 8, reg_ro, 0, 0, NULL), HIXL_OK); /* READ is granted */
  /* Without a request only a fence says v is written (on verbs it is later). */
  EXPECT_OK(hixl_fence(f->s.ctx, f->s.peer, 5000));
  hixl_rmr_release(reg_ro);
}

static void test_deregistered_region(void **state)
{
  fixture_t *f = *state;
  hixl_rmr_t *tmp = lookup(f->s.peer, "tmp");
  uint64_t v = 1;
  assert_int_equal(hixl_put(f->s.peer, &v, 8, tmp, 0, 0, NULL), HIXL_OK);
  assert_true(target_cmd(&f->s.t, NULL, 0, "dereg tmp"));
  assert_int_equal(hixl_put(f->s.peer, &v, 8, tmp, 0, 0, NULL), HIXL_ERR_NOT_REGISTERED);
  assert_non_null(strstr(hixl_last_error(), "deregistered"));
  assert_int_equal(hixl_get(f->s.peer, &v, 8, tmp, 0, 0, NULL), HIXL_ERR_NOT_REGISTERED);
  assert_int_equal(hixl_atomic_faa(f->s.peer, tmp, 0, 1, NULL, 0, NULL), HIXL_ERR_NOT_REGISTERED);
  hixl_rmr_t *again;
  assert_int_equal(hixl_rmr_lookup(f->s.peer, "tmp", 0, &again), HIXL_ERR_NOT_REGISTERED);
  hixl_rmr_release(tmp);
}

static void test_released_rmr(void **state)
{
  fixture_t *f = *state;
  hixl_rmr_t *r = lookup(f->s.peer, "alloc");
  hixl_rmr_release(r);
  assert_int_equal(hixl_put(f->s.peer, g_buf, 8, r, 0, 0, NULL), HIXL_ERR_NOT_REGISTERED);
  assert_non_null(strstr(hixl_last_error(), "released"));
  assert_int_equal(hixl_get(f->s.peer, g_buf, 8, r, 0, 0, NULL), HIXL_ERR_NOT_REGISTERED);
  hixl_rmr_release(r); /* a second release is a no-op */
}

static void test_forged_blob(void **state)
{
  fixture_t *f = *state;
  uint8_t blob[HIXL_RKEY_BLOB_LEN];
  hixl_rmr_t *r = (hixl_rmr_t *)0x1;
  /* Garbage and truncated blobs: malformed. */
  memset(blob, 0x41, sizeof(blob));
  assert_int_equal(hixl_rmr_unpack(f->s.peer, blob, sizeof(blob), &r), HIXL_ERR_INVALID);
  assert_int_equal(hixl_rmr_unpack(f->s.peer, blob, 3, &r), HIXL_ERR_INVALID);
  assert_ptr_equal(r, (hixl_rmr_t *)0x1);
  /* A genuine blob of another context, presented to this peer. */
  hixl_ctx_t *other = test_ctx(0, NULL);
  void *mem;
  hixl_mr_t *mr;
  EXPECT_OK(hixl_mem_alloc(other, 4096, HIXL_MEM_HOST, HIXL_ACCESS_WRITE, &mem, &mr));
  size_t len = 0;
  EXPECT_OK(hixl_mr_pack(mr, NULL, &len)); /* asks the size */
  assert_int_equal(len, HIXL_RKEY_BLOB_LEN);
  size_t small = 10;
  assert_int_equal(hixl_mr_pack(mr, blob, &small), HIXL_ERR_NOMEM);
  assert_int_equal(small, HIXL_RKEY_BLOB_LEN);
  EXPECT_OK(hixl_mr_pack(mr, blob, &len));
  assert_int_equal(hixl_rmr_unpack(f->s.peer, blob, len, &r), HIXL_ERR_NOT_REGISTERED);
  assert_non_null(strstr(hixl_last_error(), "another context"));
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(other);
}

/* White-box: the genuine blob a peer publishes under name. */
static hixl_status_t peer_blob(hixl_peer_t *peer, const char *name, uint8_t *blob, size_t *len_p)
{
  uint32_t len = 0;
  hixl_status_t st = hixl__lookup_blob(peer, name, blob, &len, hixl__deadline(5000));
  *len_p = len;
  return st;
}

static void test_forged_fields(void **state)
{
  fixture_t *f = *state;
  /* Forge blobs in the target's own context id: guessed rkeys, altered
   * lengths and rights.  The owner's table refuses every one. */
  uint8_t blob[HIXL_WIRE_BLOB];
  hixl_rmr_t *r;
  size_t len = sizeof(blob);
  EXPECT_OK(peer_blob(f->s.peer, "alloc", blob, &len));
  hixl_rkey_info_t k;
  assert_int_equal(hixl_rkey_decode(blob, len, &k), 0);
  hixl_rkey_info_t forged[4] = {k, k, k, k};
  forged[0].rkey ^= 0x1;                 /* guessed key */
  forged[1].len += 4096;                 /* a longer region */
  forged[2].base -= 64;                  /* shifted */
  forged[3].slot = (forged[3].slot + 1); /* another slot, same key */
  for (int i = 0; i < 4; i++) {
    hixl_rkey_encode(&forged[i], blob);
    assert_int_equal(hixl_rmr_unpack(f->s.peer, blob, HIXL_RKEY_BLOB_LEN, &r),
                     HIXL_ERR_NOT_REGISTERED);
  }
  /* More rights than granted ("ro" is READ only). */
  len = sizeof(blob);
  EXPECT_OK(peer_blob(f->s.peer, "ro", blob, &len));
  assert_int_equal(hixl_rkey_decode(blob, len, &k), 0);
  k.access = HIXL_ACCESS_READ | HIXL_ACCESS_WRITE;
  hixl_rkey_encode(&k, blob);
  assert_int_equal(hixl_rmr_unpack(f->s.peer, blob, HIXL_RKEY_BLOB_LEN, &r),
                   HIXL_ERR_NOT_REGISTERED);
  /* The genuine blob still works. */
  k.access = HIXL_ACCESS_READ;
  hixl_rkey_encode(&k, blob);
  EXPECT_OK(hixl_rmr_unpack(f->s.peer, blob, HIXL_RKEY_BLOB_LEN, &r));
  hixl_rmr_release(r);
}

static void test_unaligned_atomic(void **state)
{
  fixture_t *f = *state;
  for (uint64_t off = 1; off < 8; off++) {
    assert_int_equal(hixl_atomic_faa(f->s.peer, f->ctr, off, 1, NULL, 0, NULL), HIXL_ERR_INVALID);
    assert_non_null(strstr(hixl_last_error(), "aligned"));
    assert_int_equal(hixl_atomic_cas(f->s.peer, f->ctr, off, 0, 1, NULL, 0, NULL),
                     HIXL_ERR_INVALID);
  }
  /* "reg" starts 3 bytes past an 8-byte boundary: offset 5 is aligned. */
  uint64_t old;
  hixl_req_t *req;
  assert_int_equal(hixl_atomic_faa(f->s.peer, f->reg, 8, 0, &old, 0, NULL), HIXL_ERR_INVALID);
  EXPECT_OK(hixl_atomic_faa(f->s.peer, f->reg, 5, 0, &old, 0, &req)); /* adds 0: no change */
  EXPECT_OK(hixl_req_wait(req, 5000));
  hixl_req_free(req);
}

static void test_null_and_zero(void **state)
{
  fixture_t *f = *state;
  assert_int_equal(hixl_put(NULL, g_buf, 8, f->alloc, 0, 0, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_put(f->s.peer, NULL, 8, f->alloc, 0, 0, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_put(f->s.peer, g_buf, 8, NULL, 0, 0, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_get(f->s.peer, NULL, 8, f->alloc, 0, 0, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_put(f->s.peer, g_buf, 0, f->alloc, 0, 0, NULL), HIXL_ERR_INVALID);
  assert_non_null(strstr(hixl_last_error(), "zero length"));
  assert_int_equal(hixl_get(f->s.peer, g_buf, 0, f->alloc, 0, 0, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_put_imm(f->s.peer, g_buf, 0, f->alloc, 0, 1, 0, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_put(f->s.peer, g_buf, 8, f->alloc, 0, 0x80, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_notify(NULL, 1, 0, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_notify(f->s.peer, 1, 0x2, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_put_batch(f->s.peer, NULL, 1, NULL, 0, NULL), HIXL_ERR_INVALID);
  hixl_xfer_t x = {g_buf, f->alloc, 0, 8};
  assert_int_equal(hixl_put_batch(f->s.peer, &x, 0, NULL, 0, NULL), HIXL_ERR_INVALID);
  x.local = NULL;
  assert_int_equal(hixl_get_batch(f->s.peer, &x, 1, 0, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_req_test(NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_req_wait(NULL, 0), HIXL_ERR_INVALID);
  hixl_req_free(NULL);
  assert_int_equal(hixl_fence(NULL, NULL, 0), HIXL_ERR_INVALID);
  assert_int_equal(hixl_progress(NULL), HIXL_ERR_INVALID);
  hixl_notif_t n;
  assert_int_equal(hixl_notif_poll(NULL, &n, 1), HIXL_ERR_INVALID);
  assert_int_equal(hixl_notif_poll(f->s.ctx, NULL, 1), HIXL_ERR_INVALID);
  assert_int_equal(hixl_notif_wait(f->s.ctx, NULL, 0), HIXL_ERR_INVALID);
  /* Registration. */
  hixl_mr_t *mr;
  void *p;
  assert_int_equal(hixl_mr_reg(NULL, g_buf, 8, 0, &mr), HIXL_ERR_INVALID);
  assert_int_equal(hixl_mr_reg(f->s.ctx, NULL, 8, 0, &mr), HIXL_ERR_INVALID);
  assert_int_equal(hixl_mr_reg(f->s.ctx, g_buf, 0, 0, &mr), HIXL_ERR_INVALID);
  assert_int_equal(hixl_mr_reg(f->s.ctx, g_buf, 8, 8, &mr), HIXL_ERR_INVALID);
  assert_int_equal(hixl_mr_reg(f->s.ctx, g_buf, 8, 0, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_mr_reg(f->s.ctx, (void *)(uintptr_t)(UINTPTR_MAX - 4), 8, 0, &mr),
                   HIXL_ERR_INVALID);
  assert_int_equal(hixl_mem_alloc(f->s.ctx, 0, HIXL_MEM_HOST, 0, &p, &mr), HIXL_ERR_INVALID);
  assert_int_equal(hixl_mem_alloc(f->s.ctx, 8, (hixl_mem_kind_t)7, 0, &p, &mr), HIXL_ERR_INVALID);
  assert_int_equal(hixl_mr_dereg(NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_mr_publish(NULL, "x"), HIXL_ERR_INVALID);
  size_t len = 0;
  assert_int_equal(hixl_mr_pack(NULL, g_buf, &len), HIXL_ERR_INVALID);
  hixl_rmr_t *r;
  assert_int_equal(hixl_rmr_unpack(NULL, g_buf, 56, &r), HIXL_ERR_INVALID);
  assert_int_equal(hixl_rmr_lookup(f->s.peer, "", 0, &r), HIXL_ERR_INVALID);
  assert_int_equal(hixl_rmr_lookup(f->s.peer, NULL, 0, &r), HIXL_ERR_INVALID);
  assert_int_equal(hixl_rmr_lookup(f->s.peer, "no-such-region", 0, &r), HIXL_ERR_NOT_REGISTERED);
  assert_int_equal(hixl_rmr_lookup(f->s.peer, "no-such-region", 100, &r), HIXL_ERR_NOT_REGISTERED);
  hixl_rmr_release(NULL);
  /* Contexts and connections. */
  hixl_ctx_t *c;
  assert_int_equal(hixl_ctx_create(NULL, NULL), HIXL_ERR_INVALID);
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.timeout_ms = 0;
  assert_int_equal(hixl_ctx_create(&cfg, &c), HIXL_ERR_INVALID);
  hixl_config_init(&cfg);
  cfg.transports = "shm,carrier-pigeon";
  assert_int_equal(hixl_ctx_create(&cfg, &c), HIXL_ERR_INVALID);
  hixl_config_init(&cfg);
  cfg.listen = "not an address";
  assert_int_equal(hixl_ctx_create(&cfg, &c), HIXL_ERR_INVALID);
  hixl_config_init(&cfg);
  cfg.progress_thread = 3; /* 0, 1 (polling) or 2 (events) */
  assert_int_equal(hixl_ctx_create(&cfg, &c), HIXL_ERR_INVALID);
  assert_non_null(strstr(hixl_last_error(), "progress_thread"));
  cfg.progress_thread = -1;
  assert_int_equal(hixl_ctx_create(&cfg, &c), HIXL_ERR_INVALID);
  hixl_peer_t *peer;
  assert_int_equal(hixl_connect(f->s.ctx, NULL, 100, &peer), HIXL_ERR_INVALID);
  assert_int_equal(hixl_connect(f->s.ctx, "127.0.0.1", 100, &peer), HIXL_ERR_INVALID);
  assert_int_equal(hixl_connect(f->s.ctx, "127.0.0.1:0", 100, &peer), HIXL_ERR_INVALID);
  assert_int_equal(hixl_disconnect(NULL), HIXL_ERR_INVALID);
  assert_null(hixl_peer_transport(NULL));
  /* Device memory: host memory passed as device memory, a device that does
   * not exist (the device cases are tests/conformance/device.c). */
  mr = NULL;
  hixl_status_t dst = hixl_mr_reg_device(f->s.ctx, g_buf, 8, 0, HIXL_ACCESS_READ, &mr);
  assert_true(dst == HIXL_ERR_INVALID || dst == HIXL_ERR_NO_DEVICE); /* no backend: NO_DEVICE */
  assert_non_null(strstr(hixl_last_error(), "device"));
  assert_int_equal(hixl_mr_reg_device(f->s.ctx, g_buf, 8, 100000, HIXL_ACCESS_READ, &mr),
                   HIXL_ERR_NO_DEVICE);
  assert_null(mr);
  assert_int_equal(hixl_mem_alloc(f->s.ctx, 8, (hixl_mem_kind_t)7, 0, &p, &mr), HIXL_ERR_INVALID);
}

static void test_batch_one_bad_element(void **state)
{
  fixture_t *f = *state;
  hixl_xfer_t x[3] = {
      {g_buf, f->alloc, 0, 64}, {g_buf, f->reg, 100, 64}, {g_buf, f->alloc, BIG_LEN - 8, 64}};
  uint32_t imm = 9;
  memset(g_buf, 0xee, sizeof(g_buf));
  assert_int_equal(hixl_put_batch(f->s.peer, x, 3, &imm, 0, NULL), HIXL_ERR_NOT_REGISTERED);
  /* The element's own reason, then which element (hixl__err formats its
   * message apart from the one it wraps). */
  assert_non_null(strstr(hixl_last_error(), "is outside the"));
  assert_non_null(strstr(hixl_last_error(), "(batch element 2 of 3)"));
  x[2].rmr = f->ro;
  x[2].off = 0;
  assert_int_equal(hixl_put_batch(f->s.peer, x, 3, NULL, 0, NULL), HIXL_ERR_ACCESS);
  /* No notification was sent either. */
  char resp[64];
  assert_true(target_cmd(&f->s.t, resp, sizeof(resp), "ping"));
}

static void test_rmr_of_other_peer(void **state)
{
  fixture_t *f = *state;
  hixl_peer_t *p2 = connect_to(f->s.ctx, &f->s.t);
  assert_int_equal(hixl_put(p2, g_buf, 8, f->alloc, 0, 0, NULL), HIXL_ERR_INVALID);
  assert_non_null(strstr(hixl_last_error(), "belongs to peer"));
  hixl_disconnect(p2);
}

static void test_use_after_disconnect(void **state)
{
  fixture_t *f = *state;
  hixl_peer_t *p2 = connect_to(f->s.ctx, &f->s.t);
  hixl_rmr_t *r = lookup(p2, "alloc");
  EXPECT_OK(hixl_disconnect(p2));
  assert_int_equal(hixl_put(p2, g_buf, 8, r, 0, 0, NULL), HIXL_ERR_PEER_LOST);
  assert_non_null(strstr(hixl_last_error(), "disconnected"));
  assert_int_equal(hixl_get(p2, g_buf, 8, r, 0, 0, NULL), HIXL_ERR_PEER_LOST);
  assert_int_equal(hixl_atomic_faa(p2, r, 0, 1, NULL, 0, NULL), HIXL_ERR_PEER_LOST);
  assert_int_equal(hixl_notify(p2, 1, 0, NULL), HIXL_ERR_PEER_LOST);
  hixl_rmr_t *r2;
  assert_int_equal(hixl_rmr_lookup(p2, "alloc", 0, &r2), HIXL_ERR_PEER_LOST);
  assert_int_equal(hixl_fence(f->s.ctx, p2, 0), HIXL_ERR_PEER_LOST);
  hixl_rmr_release(r);
  assert_int_equal(hixl_disconnect(p2), HIXL_OK); /* idempotent */
}

static void test_wrong_auth_token(void **state)
{
  fixture_t *f = *state;
  /* A target that wants a token; the self case uses a second context in
   * this process. */
  hixl_ctx_t *guarded = test_ctx(0, "right-token");
  hixl_ctx_t *wrong = test_ctx(0, "wrong-token"), *none = test_ctx(0, NULL),
             *right = test_ctx(0, "right-token");
  hixl_peer_t *p;
  assert_int_equal(hixl_connect(wrong, hixl_ctx_address(guarded), 2000, &p), HIXL_ERR_AUTH);
  assert_non_null(strstr(hixl_last_error(), "token"));
  assert_int_equal(hixl_connect(none, hixl_ctx_address(guarded), 2000, &p), HIXL_ERR_AUTH);
  EXPECT_OK(hixl_connect(right, hixl_ctx_address(guarded), 2000, &p));
  hixl_disconnect(p);
  hixl_ctx_destroy(right);
  hixl_ctx_destroy(none);
  hixl_ctx_destroy(wrong);
  hixl_ctx_destroy(guarded);
  (void)f;
}

static void test_connect_closed_port(void **state)
{
  fixture_t *f = *state;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sa);
  bind(fd, (struct sockaddr *)&sa, sizeof(sa));
  getsockname(fd, (struct sockaddr *)&sa, &sl);
  close(fd); /* nobody listens there now */
  char addr[64];
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", ntohs(sa.sin_port));
  hixl_peer_t *p = (hixl_peer_t *)0x1;
  assert_int_equal(hixl_connect(f->s.ctx, addr, 2000, &p), HIXL_ERR_PEER_LOST);
  assert_ptr_equal(p, (hixl_peer_t *)0x1);
  assert_non_null(strstr(hixl_last_error(), "refused"));
}

static void test_garbage_on_control_port(void **state)
{
  fixture_t *f = *state;
  /* A client that speaks something else is dropped; the target lives on. */
  char host[64];
  int port;
  sscanf(f->s.t.addr, "%63[^:]:%d", host, &port);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, host, &sa.sin_addr);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  assert_true(write(fd, junk, sizeof(junk)) > 0);
  char c;
  assert_true(read(fd, &c, 1) <= 0); /* closed on us */
  close(fd);
  hixl_peer_t *p2 = connect_to(f->s.ctx, &f->s.t);
  hixl_disconnect(p2);
}

int main(int argc, char **argv)
{
  harness_init(argc, argv);
  if (argc != 2) {
    fprintf(stderr, "usage: %s self|shm\n", argv[0]);
    return 2;
  }
  g_transport = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_out_of_bounds),         cmocka_unit_test(test_missing_rights),
      cmocka_unit_test(test_deregistered_region),   cmocka_unit_test(test_released_rmr),
      cmocka_unit_test(test_forged_blob),           cmocka_unit_test(test_forged_fields),
      cmocka_unit_test(test_unaligned_atomic),      cmocka_unit_test(test_null_and_zero),
      cmocka_unit_test(test_batch_one_bad_element), cmocka_unit_test(test_rmr_of_other_peer),
      cmocka_unit_test(test_use_after_disconnect),  cmocka_unit_test(test_wrong_auth_token),
      cmocka_unit_test(test_connect_closed_port),   cmocka_unit_test(test_garbage_on_control_port),
  };
  return cmocka_run_group_tests_name(argv[1], tests, setup, teardown);
}

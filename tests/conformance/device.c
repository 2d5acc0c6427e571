/* SPDX-License-Identifier: MIT */
/*
 * Device memory, written once and run per transport (and per backend: the
 * emulated one in CI, CUDA on a GPU machine):
 *     device <transport> <case>
 *
 * Local buffers come in three kinds: host (malloc, unaligned), device
 * registered in the test's own context (verbs reaches it directly), and
 * device memory of another context (unregistered here: verbs stages it
 * through bounce buffers).  Remote regions (tests/common/harness.c, with
 * HIXL_TEST_DEVICE_REGIONS=1): host memfd "alloc", host malloc "reg" (CMA),
 * device "dev" (hixl_mem_alloc) and "dev_reg" (hixl_mr_reg_device of an odd
 * sub-range).  Every byte is checked twice: by the target's own view of its
 * memory (through the device runtime) and by a get back into a local buffer
 * of every kind.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cases.h"
#include "harness.h"

static bool is_verbs(void) { return strcmp(g_transport, "verbs") == 0; }
static bool rdma_off(void)
{
  const char *v = getenv("HIXL_DEVICE_RDMA");
  return v && strcmp(v, "0") == 0;
}
static bool target_rdma_off(void)
{
  const char *v = getenv("HIXL_TEST_TARGET_DEVICE_RDMA");
  return v ? strcmp(v, "0") == 0 : rdma_off();
}

/* ----------------------------------------------------------- buffers */

enum { L_HOST, L_DEV, L_DEV_UNREG, L_KINDS };
static const char *const kind_name[L_KINDS] = {"host", "device", "device(unregistered)"};

typedef struct lbuf {
  int kind;
  uint8_t *p; /* the buffer (odd offset into what was allocated) */
  size_t len;
  void *base;
  hixl_mr_t *mr;
} lbuf_t;

static hixl_ctx_t *g_other; /* owns the "unregistered" device buffers */

static void lbuf_alloc(lbuf_t *b, hixl_ctx_t *ctx, int kind, size_t len)
{
  memset(b, 0, sizeof(*b));
  b->kind = kind;
  b->len = len;
  if (kind == L_HOST) {
    b->base = malloc(len + 64);
    if (b->base == NULL)
      die("no memory");
    b->p = (uint8_t *)b->base + 5;
    return;
  }
  EXPECT_OK(hixl_mem_alloc(kind == L_DEV ? ctx : g_other, len + 64, HIXL_MEM_DEVICE, 0, &b->base,
                           &b->mr));
  b->p = (uint8_t *)b->base + 5;
  hixl_mem_kind_t k;
  int dev;
  EXPECT_OK(hixl_mem_query(b->p, &k, &dev));
  if (k != HIXL_MEM_DEVICE || dev != 0)
    die("hixl_mem_query: a device buffer reads as kind %d device %d", (int)k, dev);
}

static void lbuf_free(lbuf_t *b)
{
  if (b->mr)
    EXPECT_OK(hixl_mr_dereg(b->mr));
  else
    free(b->base);
}

/* Write / read a local buffer the way its kind allows. */
static void lbuf_set(lbuf_t *b, const void *src, size_t len)
{
  EXPECT_OK(hixl_mem_copy(b->p, src, len));
}
static void lbuf_get(const lbuf_t *b, void *dst, size_t len)
{
  EXPECT_OK(hixl_mem_copy(dst, b->p, len));
}

/* ----------------------------------------------------------- fixture */

/* A session (tests/common/harness.h) whose target has the device regions,
 * and the other context. */
static void setup(session_t *f)
{
  setenv("HIXL_TEST_DEVICE_REGIONS", "1", 1);
  session_open(f, 0, 0);
  g_other = test_ctx(0, NULL);
}

static void teardown(session_t *f)
{
  session_close(f);
  hixl_ctx_destroy(g_other);
}

/* Whether the remote region can be reached from here: device regions over
 * verbs need the target's NIC to reach its device memory. */
static bool remote_reachable(const char *region)
{
  return !(is_verbs() && strncmp(region, "dev", 3) == 0 && target_rdma_off());
}

/* ----------------------------------------------------------- directions */

/* One put then one get of len bytes at off between a local buffer of kind
 * and region: the eight direction pairs are the four (local, remote) kind
 * pairs, each way. */
static void xfer_check(session_t *f, hixl_rmr_t *rmr, const char *region, int kind, size_t len,
                       uint64_t off, uint64_t seed)
{
  lbuf_t src, dst;
  lbuf_alloc(&src, f->ctx, kind, len);
  lbuf_alloc(&dst, f->ctx, kind, len);
  uint8_t *want = xmalloc(len), *got = xmalloc(len);
  fill_pattern(want, len, seed);
  lbuf_set(&src, want, len);
  hixl_req_t *req;
  EXPECT_OK(hixl_put(f->peer, src.p, len, rmr, off, seed % 2 ? HIXL_OP_ORDERED : 0, &req));
  EXPECT_OK(hixl_req_wait(req, 60000));
  hixl_req_free(req);
  if (target_hash(&f->t, region, off, len) != hash_bytes(want, len))
    fail_msg("put %s -> %s of %zu bytes at %llu: the target's memory differs", kind_name[kind],
             region, len, (unsigned long long)off);
  EXPECT_OK(hixl_get(f->peer, dst.p, len, rmr, off, 0, NULL));
  EXPECT_OK(hixl_fence(f->ctx, f->peer, 60000));
  lbuf_get(&dst, got, len);
  if (memcmp(want, got, len) != 0)
    fail_msg("get %s -> %s of %zu bytes at %llu differs", region, kind_name[kind], len,
             (unsigned long long)off);
  free(want);
  free(got);
  lbuf_free(&src);
  lbuf_free(&dst);
}

static void test_dirs(void **state)
{
  (void)state;
  session_t f;
  setup(&f);
  static const char *const regions[] = {"alloc", "reg", "dev", "dev_reg"};
  /* 1 B to 64 MiB; the odd sizes cross every piece boundary (64 KiB bounce
   * pieces, the 4 MiB streaming threshold). */
  static const size_t sizes[] = {1,       7, 64, 4097, 65536 + 3, (1 << 20) + 1, (16 << 20) + 5,
                                 64 << 20};
  size_t nsizes = sizeof(sizes) / sizeof(sizes[0]);
  uint64_t seed = 100;
  for (size_t r = 0; r < 4; r++) {
    if (!remote_reachable(regions[r])) {
      /* Refused up front, saying why. */
      hixl_rmr_t *rmr = NULL;
      EXPECT_ST(HIXL_ERR_UNSUPPORTED, hixl_rmr_lookup(f.peer, regions[r], 10000, &rmr));
      if (rmr != NULL || strstr(hixl_last_error(), "device memory") == NULL)
        fail_msg("unpack of an unreachable device region: %s", hixl_last_error());
      continue;
    }
    hixl_rmr_t *rmr = lookup(f.peer, regions[r]);
    size_t cap = strcmp(regions[r], "dev_reg") == 0 ? SMALL_LEN : BIG_LEN;
    for (int k = 0; k < L_KINDS; k++)
      for (size_t i = 0; i < nsizes; i++) {
        size_t len = sizes[i];
        /* 64 MiB once per region with device memory on a side, not per kind
         * (rxe moves a few MB/s). */
        if (len > cap - 4096 || (len == (64u << 20) && k == L_DEV_UNREG && is_verbs()))
          continue;
        uint64_t off = 1 + 2 * ((i * 4099 + (size_t)k * 13) % 2000); /* odd */
        xfer_check(&f, rmr, regions[r], k, len, off, seed++);
      }
    hixl_rmr_release(rmr);
  }
  teardown(&f);
}

/* ----------------------------------------------------------- batches */

static void test_batch(void **state)
{
  (void)state;
  session_t f;
  setup(&f);
  const char *names[4] = {"alloc", "reg", "dev", "dev_reg"};
  hixl_rmr_t *rmrs[4];
  int nr = 0;
  const char *used[4];
  for (int i = 0; i < 4; i++)
    if (remote_reachable(names[i])) {
      used[nr] = names[i];
      rmrs[nr++] = lookup(f.peer, names[i]);
    }
  enum { N = 24 };
  hixl_xfer_t x[N];
  lbuf_t src[N], dst[N];
  uint8_t *want[N];
  for (int i = 0; i < N; i++) {
    size_t len = (size_t)1 << (i % 18); /* 1 B .. 128 KiB */
    len += (size_t)i;
    lbuf_alloc(&src[i], f.ctx, i % L_KINDS, len);
    lbuf_alloc(&dst[i], f.ctx, (i + 1) % L_KINDS, len);
    want[i] = xmalloc(len);
    fill_pattern(want[i], len, 500 + (uint64_t)i);
    lbuf_set(&src[i], want[i], len);
    /* Disjoint ranges: element i at 150 KiB * (i / nr) + odd. */
    x[i] = (hixl_xfer_t){src[i].p, rmrs[i % nr], (uint64_t)(i / nr) * 150 * 1024 + 3, len};
  }
  uint32_t imm = 77;
  hixl_req_t *req;
  EXPECT_OK(hixl_put_batch(f.peer, x, N, &imm, 0, &req));
  EXPECT_OK(hixl_req_wait(req, 60000));
  hixl_req_free(req);
  for (int i = 0; i < N; i++)
    if (target_hash(&f.t, used[i % nr], x[i].off, x[i].len) != hash_bytes(want[i], x[i].len))
      fail_msg("batch element %d (%s -> %s, %zu bytes) differs at the target", i,
               kind_name[i % L_KINDS], used[i % nr], x[i].len);
  /* The batch's one notification arrived after all of it. */
  char resp[128];
  if (!target_cmd(&f.t, resp, sizeof(resp), "notif1 alloc 0 8") || strncmp(resp, "ok 77 ", 6) != 0)
    fail_msg("batch notification: %s", resp);
  for (int i = 0; i < N; i++)
    x[i].local = dst[i].p;
  EXPECT_OK(hixl_get_batch(f.peer, x, N, 0, &req));
  EXPECT_OK(hixl_req_wait(req, 60000));
  hixl_req_free(req);
  for (int i = 0; i < N; i++) {
    uint8_t *got = xmalloc(x[i].len);
    lbuf_get(&dst[i], got, x[i].len);
    if (memcmp(got, want[i], x[i].len) != 0)
      fail_msg("get_batch element %d (%s <- %s) differs", i, kind_name[(i + 1) % L_KINDS],
               used[i % nr]);
    free(got);
    free(want[i]);
    lbuf_free(&src[i]);
    lbuf_free(&dst[i]);
  }
  for (int i = 0; i < nr; i++)
    hixl_rmr_release(rmrs[i]);
  teardown(&f);
}

/* ----------------------------------------------------------- notifications */

static void test_notif(void **state)
{
  (void)state;
  session_t f;
  setup(&f);
  const char *region = remote_reachable("dev") ? "dev" : "alloc";
  hixl_rmr_t *rmr = lookup(f.peer, region);
  for (int k = 0; k < L_KINDS; k++) {
    size_t len = k == 0 ? 8 : (size_t)300000 + (size_t)k;
    lbuf_t b;
    lbuf_alloc(&b, f.ctx, k, len);
    uint8_t *want = xmalloc(len);
    fill_pattern(want, len, 900 + (uint64_t)k);
    lbuf_set(&b, want, len);
    target_send(&f.t, "notif1 %s 4096 %zu", region, len);
    EXPECT_OK(hixl_put_imm(f.peer, b.p, len, rmr, 4096, 40 + (uint32_t)k, 0, NULL));
    char resp[128], expect[128];
    if (!target_reply(&f.t, resp, sizeof(resp)))
      fail_msg("notif1: %s", resp);
    snprintf(expect, sizeof(expect), "ok %u %zu %016llx", 40 + k, len,
             (unsigned long long)hash_bytes(want, len));
    if (strcmp(resp, expect) != 0)
      fail_msg("put_imm from %s into %s: the data was not visible with its notification "
               "(%s, expected %s)",
               kind_name[k], region, resp, expect);
    EXPECT_OK(hixl_fence(f.ctx, f.peer, 30000));
    free(want);
    lbuf_free(&b);
  }
  hixl_rmr_release(rmr);
  teardown(&f);
}

/* ----------------------------------------------------------- atomics */

static uint64_t read64(target_t *t, const char *region, uint64_t off)
{
  char resp[64];
  if (!target_cmd(t, resp, sizeof(resp), "read64 %s %llu", region, (unsigned long long)off))
    die("read64: %s", resp);
  return strtoull(resp + 3, NULL, 10);
}

static void test_atomic(void **state)
{
  (void)state;
  session_t f;
  setup(&f);
  /* Host counters keep working beside device memory. */
  hixl_rmr_t *ctr = lookup(f.peer, "ctr");
  uint64_t old = 1;
  EXPECT_OK(hixl_atomic_faa(f.peer, ctr, 0, 5, &old, 0, NULL));
  EXPECT_OK(hixl_fence(f.ctx, f.peer, 10000));
  if (old != 0 || read64(&f.t, "ctr", 0) != 5)
    fail_msg("host FAA beside device memory: old %llu", (unsigned long long)old);
  hixl_rmr_release(ctr);
  if (!remote_reachable("dev_ctr")) {
    teardown(&f);
    return;
  }
  hixl_rmr_t *rmr = lookup(f.peer, "dev_ctr");
  if (is_verbs()) {
    /* The NIC runs them in device memory it can reach. */
    EXPECT_OK(hixl_atomic_faa(f.peer, rmr, 8, 3, &old, 0, NULL));
    EXPECT_OK(hixl_fence(f.ctx, f.peer, 10000));
    if (old != 0)
      fail_msg("device FAA: old %llu", (unsigned long long)old);
    hixl_req_t *req;
    EXPECT_OK(hixl_atomic_cas(f.peer, rmr, 8, 3, 10, &old, 0, &req));
    EXPECT_OK(hixl_req_wait(req, 10000));
    hixl_req_free(req);
    if (old != 3 || read64(&f.t, "dev_ctr", 8) != 10)
      fail_msg("device CAS: old %llu, now %llu", (unsigned long long)old,
               (unsigned long long)read64(&f.t, "dev_ctr", 8));
  } else {
    /* The CPU cannot: a clear UNSUPPORTED, and nothing changed. */
    EXPECT_ST(HIXL_ERR_UNSUPPORTED, hixl_atomic_faa(f.peer, rmr, 8, 3, &old, 0, NULL));
    if (strstr(hixl_last_error(), "device memory") == NULL)
      fail_msg("unclear message: %s", hixl_last_error());
    hixl_req_t *req = NULL;
    EXPECT_ST(HIXL_ERR_UNSUPPORTED, hixl_atomic_cas(f.peer, rmr, 8, 0, 1, &old, 0, &req));
    if (req != NULL)
      fail_msg("a failed atomic returned a request");
    if (read64(&f.t, "dev_ctr", 8) != 0)
      fail_msg("a refused atomic changed device memory");
  }
  hixl_rmr_release(rmr);
  teardown(&f);
}

/* ----------------------------------------------------------- bad input */

static void test_badinput(void **state)
{
  (void)state;
  session_t f;
  setup(&f);
  hixl_ctx_t *ctx = f.ctx;
  hixl_mr_t *mr = NULL;
  uint8_t host[4096];
  /* A host pointer passed as device memory. */
  EXPECT_ST(HIXL_ERR_INVALID, hixl_mr_reg_device(ctx, host, sizeof(host), 0, 0, &mr));
  if (strstr(hixl_last_error(), "host memory") == NULL)
    fail_msg("unclear message: %s", hixl_last_error());
  void *d;
  hixl_mr_t *dmr;
  EXPECT_OK(hixl_mem_alloc(ctx, 8192, HIXL_MEM_DEVICE, HIXL_ACCESS_READ, &d, &dmr));
  /* Device ids out of range, and memory of another device. */
  EXPECT_ST(HIXL_ERR_NO_DEVICE, hixl_mr_reg_device(ctx, d, 64, -1, 0, &mr));
  EXPECT_ST(HIXL_ERR_NO_DEVICE, hixl_mr_reg_device(ctx, d, 64, 1000, 0, &mr));
  if (strcmp(hixl_device_backend(), "emulated") == 0)
    EXPECT_ST(HIXL_ERR_INVALID, hixl_mr_reg_device(ctx, d, 64, 1, 0, &mr));
  /* Past the end of the allocation (8192 rounded to pages). */
  EXPECT_ST(HIXL_ERR_INVALID, hixl_mr_reg_device(ctx, (uint8_t *)d + 4096, 1 << 20, 0, 0, &mr));
  if (mr != NULL)
    fail_msg("a failed registration wrote its output");
  /* hixl_mr_reg on device memory registers it as device memory. */
  EXPECT_OK(hixl_mr_reg(ctx, (uint8_t *)d + 100, 200, HIXL_ACCESS_READ, &mr));
  EXPECT_OK(hixl_mr_dereg(mr));
  /* A local device buffer running past its allocation: INVALID, and the
   * target is untouched. */
  const char *region = remote_reachable("dev") ? "dev" : "alloc";
  hixl_rmr_t *rmr = lookup(f.peer, region);
  uint64_t before = target_hash(&f.t, region, 0, 1 << 20);
  EXPECT_ST(HIXL_ERR_INVALID, hixl_put(f.peer, (uint8_t *)d + 4096, 1 << 20, rmr, 0, 0, NULL));
  EXPECT_ST(HIXL_ERR_INVALID, hixl_get(f.peer, (uint8_t *)d + 8000, 4096, rmr, 0, 0, NULL));
  hixl_xfer_t x[2] = {{host, rmr, 0, 64}, {(uint8_t *)d + 8190, rmr, 64, 4096}};
  EXPECT_ST(HIXL_ERR_INVALID, hixl_put_batch(f.peer, x, 2, NULL, 0, NULL));
  if (strstr(hixl_last_error(), "element 1") == NULL)
    fail_msg("the batch error does not name its element: %s", hixl_last_error());
  EXPECT_OK(hixl_fence(ctx, f.peer, 10000));
  if (target_hash(&f.t, region, 0, 1 << 20) != before)
    fail_msg("a refused operation changed the target");
  /* Remote bounds of a device region, as for host ones. */
  EXPECT_ST(HIXL_ERR_NOT_REGISTERED, hixl_put(f.peer, host, 64, rmr, BIG_LEN - 8, 0, NULL));
  hixl_rmr_release(rmr);
  /* hixl_mem_copy. */
  EXPECT_ST(HIXL_ERR_INVALID, hixl_mem_copy(NULL, host, 1));
  EXPECT_ST(HIXL_ERR_INVALID, hixl_mem_copy(host, (uint8_t *)d + 8000, 1000));
  EXPECT_OK(hixl_mem_copy(host, d, 0));
  hixl_mem_kind_t k;
  int dev = 7;
  EXPECT_OK(hixl_mem_query(host, &k, &dev));
  if (k != HIXL_MEM_HOST || dev != -1)
    fail_msg("hixl_mem_query(host): kind %d device %d", (int)k, dev);
  EXPECT_ST(HIXL_ERR_INVALID, hixl_mem_query(NULL, &k, NULL));
  /* Emulated device memory is unreachable by the CPU (a child touches it). */
  if (strcmp(hixl_device_backend(), "emulated") == 0) {
    fflush(stdout); /* not fflush(NULL): a self target thread holds its pipe's FILE lock */
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
      signal(SIGSEGV, SIG_DFL);
      volatile uint8_t *p = d;
      (void)*p;
      _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSEGV)
      fail_msg("a CPU load from emulated device memory did not fault");
  }
  EXPECT_OK(hixl_mr_dereg(dmr));
  teardown(&f);
}

/* Run with HIXL_DEVICE naming a backend this machine lacks: no device
 * memory anywhere, clear NO_DEVICE errors, host memory unaffected. */
static void test_absent(void **state)
{
  (void)state;
  if (strcmp(hixl_device_backend(), "none") != 0) {
    fprintf(stderr, "HIXL_DEVICE=%s found a runtime here; this case needs one without\n",
            getenv("HIXL_DEVICE") ? getenv("HIXL_DEVICE") : "(unset)");
    exit(77);
  }
  hixl_ctx_t *ctx = test_ctx(0, NULL);
  void *p = NULL;
  hixl_mr_t *mr = NULL;
  EXPECT_ST(HIXL_ERR_NO_DEVICE, hixl_mem_alloc(ctx, 4096, HIXL_MEM_DEVICE, 0, &p, &mr));
  const char *want = getenv("HIXL_TEST_ABSENT_MESSAGE");
  if (want && strstr(hixl_last_error(), want) == NULL)
    fail_msg("the message does not say why (%s): %s", want, hixl_last_error());
  uint8_t host[64];
  EXPECT_ST(HIXL_ERR_NO_DEVICE, hixl_mr_reg_device(ctx, host, sizeof(host), 0, 0, &mr));
  if (p != NULL || mr != NULL)
    fail_msg("a failed call wrote its outputs");
  EXPECT_OK(hixl_mr_reg(ctx, host, sizeof(host), HIXL_ACCESS_READ, &mr));
  hixl_mem_kind_t k;
  EXPECT_OK(hixl_mem_query(host, &k, NULL));
  if (k != HIXL_MEM_HOST)
    fail_msg("host memory reads as device");
  uint8_t other[64];
  memset(host, 0x5a, sizeof(host));
  EXPECT_OK(hixl_mem_copy(other, host, sizeof(host)));
  if (memcmp(other, host, sizeof(host)) != 0)
    fail_msg("hixl_mem_copy between host buffers");
  EXPECT_OK(hixl_mr_dereg(mr));
  hixl_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
  harness_init(argc, argv);
  /* The cases (tests/common/cases.h): --list prints them. */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dirs),   cmocka_unit_test(test_batch),    cmocka_unit_test(test_notif),
      cmocka_unit_test(test_atomic), cmocka_unit_test(test_badinput), cmocka_unit_test(test_absent),
  };
  return harness_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}

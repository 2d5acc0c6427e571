/* SPDX-License-Identifier: MIT */
/* hixl_ctx_stats (docs/observability.md): every operation kind counted with
 * its bytes, in the context and in the peer; errors by status, at issue
 * (and not twice); notifications taken, per context and per sender;
 * connects, accepts, disconnects and losses; waiting; the figures of a
 * context exact when several threads issue at once; the calling
 * convention (room, how many there are, bad arguments).  Over shm and
 * fabric (tcp;ofi_rxm over loopback), with the public API only. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include <hixl.h>

#define MAXS 128

static hixl_ctx_t *make(const char *transports) { return unit_ctx(transports, 1000, NULL); }

static uint64_t stat(hixl_ctx_t *ctx, hixl_peer_t *peer, const char *name)
{
  return unit_stat(ctx, peer, name);
}

typedef struct kv {
  const char *name;
  uint64_t want;
} kv_t;

static void expect(hixl_ctx_t *ctx, hixl_peer_t *peer, const kv_t *kv, size_t n, const char *what)
{
  for (size_t i = 0; i < n; i++) {
    uint64_t v = stat(ctx, peer, kv[i].name);
    if (v != kv[i].want)
      fail_msg("%s: %s = %llu, want %llu", what, kv[i].name, (unsigned long long)v,
               (unsigned long long)kv[i].want);
  }
}

/* Wait up to 10 s for a figure of ctx to reach want. */
static uint64_t settle(hixl_ctx_t *ctx, const char *name, uint64_t want)
{
  uint64_t v = stat(ctx, NULL, name);
  for (int i = 0; i < 200 && v < want; i++) {
    usleep(50000);
    v = stat(ctx, NULL, name);
  }
  return v;
}

static void counts(const char *transports)
{
  hixl_ctx_t *tgt = make(transports), *ini = make(transports);
  hixl_mr_t *mr;
  unit_region(tgt, 8192, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC, &mr);
  hixl_peer_t *p = unit_connect(ini, tgt, transports);
  hixl_rmr_t *r = NULL;
  assert_int_equal(hixl_rmr_lookup(p, "m", 10000, &r), HIXL_OK);

  static const kv_t zero[] = {{"put_ops", 0},    {"put_bytes", 0}, {"get_ops", 0},
                              {"atomic_ops", 0}, {"errors", 0},    {"in_flight", 0}};
  expect(ini, NULL, zero, 6, "before");
  expect(NULL, p, zero, 6, "peer before");
  assert_int_equal(stat(ini, NULL, "connects"), 1);
  assert_int_equal(stat(ini, NULL, "peers"), 1);
  assert_int_equal(stat(NULL, p, "up"), 1);
  /* The round trip: the probe at connect went before the lookup on the
   * same connection, so its answer came before the lookup's. */
  uint64_t rtt = stat(NULL, p, "rtt_ns");
  assert_true(rtt > 0 && rtt < 10000000000ull);
  uint8_t buf[256] = {1};
  uint64_t old;
  for (int i = 0; i < 3; i++)
    assert_int_equal(hixl_put(p, buf, 100, r, 128 * (uint64_t)i, 0, NULL), HIXL_OK);
  for (int i = 0; i < 2; i++)
    assert_int_equal(hixl_get(p, buf, 50, r, 1024, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_put_imm(p, buf, 10, r, 2048, 7, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_notify(p, 8, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_notify(p, 9, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_atomic_faa(p, r, 4096, 5, &old, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_atomic_cas(p, r, 4096, 5, 6, &old, 0, NULL), HIXL_OK);
  hixl_xfer_t x[2] = {{buf, r, 3000, 16}, {buf, r, 3100, 16}};
  uint32_t imm = 10;
  assert_int_equal(hixl_put_batch(p, x, 2, &imm, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_get_batch(p, x, 1, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_fence(ini, p, 10000), HIXL_OK);

  /* Errors: outside the region (at issue), bad flags; a NULL peer has no
   * context to count in. */
  assert_int_equal(hixl_put(p, buf, 16, r, 8190, 0, NULL), HIXL_ERR_NOT_REGISTERED);
  assert_int_equal(hixl_get(p, buf, 16, r, 0, 0x100, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_put(NULL, buf, 16, r, 0, 0, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_fence(ini, p, 10000), HIXL_OK);

  static const kv_t after[] = {{"put_ops", 3},
                               {"put_bytes", 300},
                               {"get_ops", 2},
                               {"get_bytes", 100},
                               {"put_imm_ops", 1},
                               {"put_imm_bytes", 10},
                               {"notify_ops", 2},
                               {"atomic_ops", 2},
                               {"batch_ops", 2},
                               {"batch_bytes", 48},
                               {"errors", 2},
                               {"errors_invalid", 1},
                               {"errors_not_registered", 1},
                               {"errors_peer_lost", 0},
                               {"in_flight", 0}};
  expect(ini, NULL, after, sizeof(after) / sizeof(after[0]), transports);
  /* The peer's figures are the same (one thread issued), without the
   * context's own. */
  static const kv_t peer_after[] = {{"put_ops", 3},     {"put_bytes", 300}, {"get_ops", 2},
                                    {"get_bytes", 100}, {"put_imm_ops", 1}, {"notify_ops", 2},
                                    {"atomic_ops", 2},  {"batch_ops", 2},   {"batch_bytes", 48},
                                    {"errors", 2},      {"in_flight", 0}};
  expect(NULL, p, peer_after, sizeof(peer_after) / sizeof(peer_after[0]), "peer");
  /* The target issued nothing; it took four notifications (put_imm, two
   * notify, the batch's), all from the one peer it accepted. */
  assert_int_equal(stat(tgt, NULL, "put_ops"), 0);
  assert_int_equal(stat(tgt, NULL, "accepts"), 1);
  assert_int_equal(stat(tgt, NULL, "peers"), 1);
  /* Four arrived, none taken yet (over fabric they arrive when polled:
   * wait for them). */
  for (int i = 0; i < 200 && stat(tgt, NULL, "notifications_queued") < 4; i++) {
    hixl_progress(tgt);
    usleep(10000);
  }
  assert_int_equal(stat(tgt, NULL, "notifications_queued"), 4);
  hixl_notif_t nt[4];
  hixl_peer_t *from = NULL;
  for (int i = 0; i < 4; i++) {
    if (hixl_notif_wait(tgt, &nt[i], 10000) != HIXL_OK)
      fail_msg("notification %d over %s: %s", i, transports, hixl_last_error());
    from = nt[i].peer;
  }
  /* The target's own probe at accept: answered by our control thread. */
  for (int i = 0; i < 1000 && stat(NULL, from, "rtt_ns") == 0; i++)
    usleep(10000);
  rtt = stat(NULL, from, "rtt_ns");
  assert_true(rtt > 0 && rtt < 10000000000ull);
  printf("# %s: control round trip %.1f us (initiator), %.1f us (target)\n", transports,
         stat(NULL, p, "rtt_ns") / 1e3, rtt / 1e3);
  assert_int_equal(stat(tgt, NULL, "notifications_received"), 4);
  assert_int_equal(stat(NULL, from, "notifications_received"), 4);
  assert_int_equal(stat(tgt, NULL, "notifications_queued"), 0);
  assert_int_equal(stat(NULL, from, "notifications_queued"), 0);
  assert_int_equal(stat(tgt, NULL, "notifications_dropped"), 0);
  /* A wait with nothing to take sleeps, and says so. */
  uint64_t sleeps = stat(tgt, NULL, "wait_sleeps");
  assert_int_equal(hixl_notif_wait(tgt, &nt[0], 100), HIXL_ERR_TIMEOUT);
  assert_true(stat(tgt, NULL, "wait_sleeps") > sleeps);
  assert_true(stat(tgt, NULL, "wait_sleep_ns") > 0);

  /* Disconnect: counted on our side at once, on theirs when the BYE
   * arrives; later operations fail with PEER_LOST and are counted. */
  assert_int_equal(hixl_disconnect(p), HIXL_OK);
  assert_int_equal(stat(ini, NULL, "disconnects"), 1);
  assert_int_equal(stat(ini, NULL, "peers"), 0);
  assert_int_equal(stat(NULL, p, "up"), 0);
  assert_int_equal(hixl_put(p, buf, 8, r, 0, 0, NULL), HIXL_ERR_PEER_LOST);
  assert_int_equal(stat(ini, NULL, "errors_peer_lost"), 1);
  uint64_t gone = settle(tgt, "disconnects", 1) + stat(tgt, NULL, "peer_losses");
  assert_true(gone >= 1);
  hixl_ctx_destroy(ini);
  hixl_ctx_destroy(tgt);
}

static void counts_shm(void **state)
{
  (void)state;
  counts("shm");
}

static void counts_fabric(void **state)
{
  (void)state;
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 0);
  counts("fabric");
}

/* A peer that dies is counted as lost.  The child is forked before the
 * target has threads (ThreadSanitizer refuses threads after a fork of a
 * threaded process) and learns the address through a pipe. */
static void loss(void **state)
{
  (void)state;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[1]);
    char addr[128] = {0};
    ssize_t got = 0, r;
    while (got < (ssize_t)sizeof(addr) - 1 && (r = read(fds[0], addr + got, 1)) == 1 &&
           addr[got] != '\n')
      got++;
    addr[got] = 0;
    hixl_ctx_t *c = make("shm");
    hixl_peer_t *p;
    _exit(hixl_connect(c, addr, 10000, &p) == HIXL_OK ? 0 : 1); /* no destroy: a death */
  }
  close(fds[0]);
  hixl_ctx_t *tgt = make("shm");
  char line[160];
  int len = snprintf(line, sizeof(line), "%s\n", hixl_ctx_address(tgt));
  assert_int_equal(write(fds[1], line, (size_t)len), len);
  close(fds[1]);
  int ws;
  assert_int_equal(waitpid(pid, &ws, 0), pid);
  assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  assert_int_equal(settle(tgt, "peer_losses", 1), 1);
  assert_int_equal(stat(tgt, NULL, "accepts"), 1);
  assert_int_equal(stat(tgt, NULL, "peers"), 0);
  hixl_ctx_destroy(tgt);
}

typedef struct worker {
  hixl_peer_t *p;
  hixl_rmr_t *r;
  int n;
  uint64_t off; /* its own 8 bytes of the region: the threads' puts do not race */
} worker_t;

static void *issue(void *arg)
{
  worker_t *w = arg;
  uint64_t v = 1;
  for (int i = 0; i < w->n; i++)
    if (hixl_put(w->p, &v, 8, w->r, w->off, 0, NULL) != HIXL_OK)
      return (void *)1;
  return NULL;
}

/* Four threads issue to one peer at once: the context's figures are exact
 * (per-thread counters); the peer's may miss collided increments. */
static void threads(void **state)
{
  (void)state;
  hixl_ctx_t *tgt = make("shm"), *ini = make("shm");
  hixl_mr_t *mr;
  unit_region(tgt, 4096, HIXL_ACCESS_WRITE | HIXL_ACCESS_READ, &mr);
  hixl_peer_t *p = unit_connect(ini, tgt, "shm");
  hixl_rmr_t *r;
  assert_int_equal(hixl_rmr_lookup(p, "m", 10000, &r), HIXL_OK);
  enum { T = 4, N = 20000 };
  pthread_t th[T];
  worker_t w[T];
  for (int i = 0; i < T; i++) {
    w[i] = (worker_t){p, r, N, 8 * (uint64_t)i};
    assert_int_equal(pthread_create(&th[i], NULL, issue, &w[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    void *rv;
    pthread_join(th[i], &rv);
    assert_null(rv);
  }
  /* Threads that ended leave their counts behind; new ones (which may get
   * an ended one's pthread_t and its block) add to them. */
  for (int i = 0; i < T; i++)
    assert_int_equal(pthread_create(&th[i], NULL, issue, &w[i]), 0);
  for (int i = 0; i < T; i++)
    pthread_join(th[i], NULL);
  assert_int_equal(stat(ini, NULL, "put_ops"), 2 * T * N);
  assert_int_equal(stat(ini, NULL, "put_bytes"), 2 * T * N * 8);
  uint64_t pp = stat(NULL, p, "put_ops");
  assert_true(pp > 0 && pp <= 2 * T * N);
  hixl_ctx_destroy(ini);
  hixl_ctx_destroy(tgt);
}

/* hixl_peer_remote_stats: T asks I, over the connection I made to it, for
 * I's figures; and hixl-info --stats shows them (its path in HIXL_INFO). */
static void remote(const char *transports)
{
  hixl_ctx_t *tgt = make(transports), *ini = make(transports);
  hixl_mr_t *mr;
  unit_region(tgt, 4096, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &mr);
  hixl_peer_t *p = unit_connect(ini, tgt, transports), *back;
  hixl_rmr_t *r;
  assert_int_equal(hixl_rmr_lookup(p, "m", 10000, &r), HIXL_OK);
  char buf[64] = {0};
  for (int i = 0; i < 5; i++)
    assert_int_equal(hixl_put(p, buf, 64, r, 0, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_fence(ini, p, 10000), HIXL_OK);
  if (hixl_connect(tgt, hixl_ctx_address(ini), 10000, &back) != HIXL_OK)
    fail_msg("connect back over %s: %s", transports, hixl_last_error());
  hixl_stat_t mine[MAXS], theirs[MAXS];
  size_t n_mine = MAXS, n_theirs = 0;
  assert_int_equal(hixl_peer_remote_stats(back, NULL, &n_theirs, 10000), HIXL_OK);
  assert_int_equal(hixl_ctx_stats(ini, NULL, mine, &n_mine), HIXL_OK);
  assert_int_equal(n_theirs, n_mine);
  n_theirs = MAXS;
  assert_int_equal(hixl_peer_remote_stats(back, theirs, &n_theirs, 10000), HIXL_OK);
  assert_int_equal(n_theirs, n_mine);
  for (size_t i = 0; i < n_mine; i++) {
    assert_string_equal(theirs[i].name, mine[i].name);
    assert_string_equal(theirs[i].help, mine[i].help);
    assert_int_equal(theirs[i].kind, mine[i].kind);
    /* What nothing moves while we look (waits and peers do move). */
    if (strncmp(mine[i].name, "put_", 4) == 0 || strncmp(mine[i].name, "errors", 6) == 0)
      assert_int_equal(theirs[i].value, mine[i].value);
  }
  assert_int_equal(stat(ini, NULL, "put_ops"), 5);
  /* Less room than figures: the first ones, and the count of all. */
  size_t n3 = 3;
  assert_int_equal(hixl_peer_remote_stats(back, theirs, &n3, 10000), HIXL_OK);
  assert_int_equal(n3, n_mine);
  assert_string_equal(theirs[0].name, "put_ops");
  assert_int_equal(theirs[0].value, 5);
  assert_int_equal(hixl_peer_remote_stats(NULL, theirs, &n3, 10000), HIXL_ERR_INVALID);
  n3 = 3;
  assert_int_equal(hixl_peer_remote_stats(back, NULL, &n3, 10000), HIXL_ERR_INVALID);

  const char *tool = getenv("HIXL_INFO");
  if (tool == NULL)
    fail_msg("HIXL_INFO (the path of hixl-info) is not set: run through meson test");
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "%s --stats %s 2>&1", tool, hixl_ctx_address(ini));
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  char line[256];
  bool seen = false;
  while (fgets(line, sizeof(line), f)) {
    char name[64];
    unsigned long long v;
    if (sscanf(line, "%63s %llu", name, &v) == 2 && strcmp(name, "put_bytes") == 0)
      seen = v == 320;
  }
  assert_int_equal(pclose(f), 0);
  assert_true(seen);
  hixl_disconnect(back);
  hixl_ctx_destroy(ini);
  hixl_ctx_destroy(tgt);
}

static void remote_shm(void **state)
{
  (void)state;
  remote("shm");
}

static void remote_fabric(void **state)
{
  (void)state;
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 0);
  remote("fabric");
}

/* The calling convention: room and count, names, bad arguments. */
static void convention(void **state)
{
  (void)state;
  hixl_ctx_t *a = make("self"), *b = make("self");
  size_t n = 0;
  assert_int_equal(hixl_ctx_stats(a, NULL, NULL, &n), HIXL_OK);
  assert_true(n >= 30 && n <= MAXS);
  size_t total = n;
  hixl_stat_t s[MAXS];
  memset(s, 0xee, sizeof(s));
  n = 5;
  assert_int_equal(hixl_ctx_stats(a, NULL, s, &n), HIXL_OK);
  assert_int_equal(n, total);
  assert_string_equal(s[0].name, "put_ops"); /* the first figures never move */
  assert_string_equal(s[1].name, "put_bytes");
  assert_int_equal((unsigned char)((uint8_t *)&s[5])[0], 0xee); /* nothing past the room */
  n = MAXS;
  assert_int_equal(hixl_ctx_stats(a, NULL, s, &n), HIXL_OK);
  for (size_t i = 0; i < n; i++) {
    assert_non_null(s[i].name);
    assert_non_null(s[i].help);
    assert_true(s[i].kind == HIXL_STAT_COUNTER || s[i].kind == HIXL_STAT_GAUGE);
    for (size_t j = 0; j < i; j++)
      assert_string_not_equal(s[i].name, s[j].name);
  }
  /* Bad arguments: each an INVALID that names the problem. */
  assert_int_equal(hixl_ctx_stats(a, NULL, s, NULL), HIXL_ERR_INVALID);
  assert_int_equal(hixl_ctx_stats(NULL, NULL, s, &n), HIXL_ERR_INVALID);
  n = 3;
  assert_int_equal(hixl_ctx_stats(a, NULL, NULL, &n), HIXL_ERR_INVALID);
  assert_non_null(strstr(hixl_last_error(), "NULL stats"));
  hixl_peer_t *self;
  assert_int_equal(hixl_connect(a, hixl_ctx_address(a), 10000, &self), HIXL_OK);
  n = MAXS;
  assert_int_equal(hixl_ctx_stats(b, self, s, &n), HIXL_ERR_INVALID);
  assert_non_null(strstr(hixl_last_error(), "another context"));
  n = MAXS;
  assert_int_equal(hixl_ctx_stats(a, self, s, &n), HIXL_OK);
  assert_true(n >= 10 && n < total);
  /* A self peer's other end is our own context. */
  n = MAXS;
  assert_int_equal(hixl_peer_remote_stats(self, s, &n, 1000), HIXL_OK);
  assert_int_equal(n, total);
  hixl_ctx_destroy(a);
  hixl_ctx_destroy(b);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(convention),    cmocka_unit_test(counts_shm),
      cmocka_unit_test(counts_fabric), cmocka_unit_test(loss),
      cmocka_unit_test(threads),       cmocka_unit_test(remote_shm),
      cmocka_unit_test(remote_fabric),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

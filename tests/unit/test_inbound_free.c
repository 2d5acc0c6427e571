/* SPDX-License-Identifier: MIT */
/* Inbound peers that come and go cost nothing once gone (docs/scale.md):
 * a target frees the record of a peer that connected to it, once that
 * peer is lost or disconnected and released, unless its handle reached the
 * user (a notification's peer, a world's rank), which stays valid until
 * hixl_ctx_destroy as the header promises, or until hixl_peer_release
 * (tested here on both ends).  White-box: counts the
 * target's peer list; the handles it handed out are used after the
 * others were freed (under ASan a use after free fails here). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <cmocka.h>

#include "unit.h"

#include "core.h"

#define TIMEOUT_MS 200 /* liveness floor 1 s; release grace 1.4 s */
#define N_INI 12

static hixl_ctx_t *make(const char *transports) { return unit_ctx(transports, TIMEOUT_MS, NULL); }

/* The context's peer records: the inbound ones only, or all. */
static unsigned peers_of(hixl_ctx_t *ctx, bool inbound_only)
{
  unsigned n = 0;
  pthread_mutex_lock(&ctx->lock);
  for (hixl_peer_t *p = ctx->peers; p; p = p->next)
    n += !inbound_only || p->inbound;
  pthread_mutex_unlock(&ctx->lock);
  return n;
}

static unsigned inbound_peers(hixl_ctx_t *ctx) { return peers_of(ctx, true); }
static unsigned all_peers(hixl_ctx_t *ctx) { return peers_of(ctx, false); }

/* Wait up to s seconds for count(ctx) to be want; what it is then. */
static unsigned settle_by(hixl_ctx_t *ctx, unsigned (*count)(hixl_ctx_t *), unsigned want, int s)
{
  unsigned n = count(ctx);
  for (int i = 0; i < 20 * s && n != want; i++) {
    usleep(50000);
    n = count(ctx);
  }
  return n;
}

/* Up to 15 s for the target to hold want inbound peers. */
static unsigned settle(hixl_ctx_t *ctx, unsigned want)
{
  return settle_by(ctx, inbound_peers, want, 15);
}

static void churn(const char *transports)
{
  hixl_ctx_t *tgt = make(transports);
  hixl_mr_t *mr;
  uint64_t *mem = unit_region(tgt, 4096, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &mr);
  /* Each initiator puts its index; the even ones also notify, and the
   * target takes their notifications: those handles reach the user. */
  hixl_ctx_t *ini[N_INI];
  hixl_peer_t *to[N_INI], *handed[N_INI];
  int n_handed = 0;
  for (int i = 0; i < N_INI; i++) {
    ini[i] = make(transports);
    hixl_peer_t *p = NULL;
    if (hixl_connect(ini[i], hixl_ctx_address(tgt), 10000, &p) != HIXL_OK)
      fail_msg("connect %d over %s: %s", i, transports, hixl_last_error());
    hixl_rmr_t *r = NULL;
    assert_int_equal(hixl_rmr_lookup(p, "m", 10000, &r), HIXL_OK);
    uint64_t v = (uint64_t)i + 1;
    assert_int_equal(hixl_put(p, &v, sizeof(v), r, (uint64_t)i * 8, 0, NULL), HIXL_OK);
    if (i % 2 == 0)
      assert_int_equal(hixl_notify(p, (uint32_t)i, 0, NULL), HIXL_OK);
    assert_int_equal(hixl_fence(ini[i], p, 10000), HIXL_OK);
    if (i % 2 == 0) {
      hixl_notif_t nt;
      assert_int_equal(hixl_notif_wait(tgt, &nt, 10000), HIXL_OK);
      assert_int_equal(nt.imm, (uint32_t)i);
      handed[n_handed++] = nt.peer;
    }
    hixl_rmr_release(r);
    to[i] = p;
  }
  for (int i = 0; i < N_INI; i++)
    assert_int_equal(mem[i], (uint64_t)i + 1);
  assert_int_equal(settle(tgt, N_INI), N_INI);
  /* A third disconnect, then every initiator's context goes. */
  for (int i = 0; i < N_INI; i += 3)
    assert_int_equal(hixl_disconnect(to[i]), HIXL_OK);
  for (int i = 0; i < N_INI; i++)
    hixl_ctx_destroy(ini[i]);
  unsigned left = settle(tgt, (unsigned)n_handed);
  printf("# %s: %u of %d inbound peers left after the grace (%d handed out)\n", transports, left,
         N_INI, n_handed);
  assert_int_equal(left, (unsigned)n_handed);
  /* And they stay: a few more ticks free nothing handed out. */
  usleep(3 * 250000);
  assert_int_equal(inbound_peers(tgt), (unsigned)n_handed);
  /* The handles it gave out still answer, and say the peer is gone. */
  for (int i = 0; i < n_handed; i++) {
    assert_int_equal(hixl_notify(handed[i], 1, 0, NULL), HIXL_ERR_PEER_LOST);
    assert_non_null(hixl_peer_transport(handed[i]));
  }
  hixl_notif_t nt;
  assert_int_equal(hixl_notif_poll(tgt, &nt, 1), 0);
  /* Released, they go too (hixl_peer_release), after the grace; a second
   * release of one not freed yet is refused. */
  for (int i = 0; i < n_handed; i++)
    assert_int_equal(hixl_peer_release(handed[i]), HIXL_OK);
  if (n_handed)
    assert_int_equal(hixl_peer_release(handed[0]), HIXL_ERR_INVALID);
  left = settle(tgt, 0);
  printf("# %s: %u inbound peers left after releasing the %d handed out\n", transports, left,
         n_handed);
  assert_int_equal(left, 0);
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(tgt);
}

/* hixl_peer_release on both ends of live connections: the initiator's own
 * handles (which hixl_disconnect keeps) and a target's handle of a peer
 * that is still up (the initiator then sees it gone).  What it refuses
 * changes nothing. */
static void release_both(const char *transports)
{
  hixl_ctx_t *tgt = make(transports), *ini = make(transports);
  hixl_mr_t *mr;
  uint64_t *mem = unit_region(tgt, 4096, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &mr);
  assert_int_equal(hixl_peer_release(NULL), HIXL_ERR_INVALID);
  enum { ROUNDS = 8 };
  for (int i = 0; i < ROUNDS; i++) {
    hixl_peer_t *p = NULL;
    if (hixl_connect(ini, hixl_ctx_address(tgt), 10000, &p) != HIXL_OK)
      fail_msg("connect %d over %s: %s", i, transports, hixl_last_error());
    hixl_rmr_t *r = NULL;
    assert_int_equal(hixl_rmr_lookup(p, "m", 10000, &r), HIXL_OK);
    /* An rmr still held: refused, and the peer still works. */
    assert_int_equal(hixl_peer_release(p), HIXL_ERR_INVALID);
    assert_non_null(strstr(hixl_last_error(), "remote region"));
    uint64_t v = 100 + (uint64_t)i;
    assert_int_equal(hixl_put(p, &v, sizeof(v), r, 0, 0, NULL), HIXL_OK);
    assert_int_equal(hixl_notify(p, (uint32_t)i, 0, NULL), HIXL_OK);
    assert_int_equal(hixl_fence(ini, p, 10000), HIXL_OK);
    hixl_notif_t nt;
    assert_int_equal(hixl_notif_wait(tgt, &nt, 10000), HIXL_OK);
    assert_int_equal(nt.imm, (uint32_t)i);
    assert_int_equal(mem[0], v);
    hixl_rmr_release(r);
    if (i % 2 == 0) {
      /* The initiator lets go of its own handle. */
      assert_int_equal(hixl_peer_release(p), HIXL_OK);
      assert_int_equal(hixl_peer_release(nt.peer), HIXL_OK);
    } else {
      /* The target lets go of a peer that is up: the initiator's
       * handle says it is gone, then is released in turn. */
      assert_int_equal(hixl_peer_release(nt.peer), HIXL_OK);
      hixl_status_t st = HIXL_OK;
      for (int k = 0; k < 200 && st == HIXL_OK; k++) {
        st = hixl_notify(p, 7, 0, NULL);
        if (st == HIXL_OK)
          usleep(20000);
      }
      assert_int_equal(st, HIXL_ERR_PEER_LOST);
      assert_int_equal(hixl_peer_release(p), HIXL_OK);
    }
  }
  /* fence(NULL) with released peers in the list does not report them. */
  assert_int_equal(hixl_fence(ini, NULL, 1000), HIXL_OK);
  unsigned n_ini = all_peers(ini), n_tgt = all_peers(tgt);
  for (int i = 0; i < 300 && (n_ini || n_tgt); i++) {
    usleep(50000);
    n_ini = all_peers(ini);
    n_tgt = all_peers(tgt);
  }
  printf("# %s: %u and %u peers left of %d connections after release\n", transports, n_ini, n_tgt,
         ROUNDS);
  assert_int_equal(n_ini, 0);
  assert_int_equal(n_tgt, 0);
  /* A world's rank is the world's: refused until hixl_world_destroy. */
  hixl_world_t *w = NULL;
  assert_int_equal(hixl_world_create(ini, 0, 1, "127.0.0.1:0", &w), HIXL_OK);
  hixl_peer_t *self = hixl_world_peer(w, 0);
  assert_non_null(self);
  assert_int_equal(hixl_peer_release(self), HIXL_ERR_INVALID);
  assert_non_null(strstr(hixl_last_error(), "world"));
  hixl_world_destroy(w);
  assert_int_equal(hixl_peer_release(self), HIXL_OK);
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(ini);
  hixl_ctx_destroy(tgt);
}

/* ---------------------------------------------------------- worlds */

struct world_arg {
  hixl_ctx_t *ctx;
  int rank, size;
  char rdv[64];
  hixl_world_t *w;
  hixl_status_t st;
  char err[HIXL_ERR_MAX];
  hixl_mr_t *mr; /* set: exchange it once the world is made */
  hixl_rmr_t *rmrs[2];
};

static void *world_thread(void *arg)
{
  struct world_arg *a = arg;
  a->st = hixl_world_create(a->ctx, a->rank, a->size, a->rdv, &a->w);
  if (a->st == HIXL_OK && a->mr)
    a->st = hixl_world_exchange(a->w, a->mr, a->rmrs);
  snprintf(a->err, sizeof(a->err), "%s", a->st == HIXL_OK ? "" : hixl_last_error());
  return NULL;
}

/* Up to 40 s for the context to hold want peers. */
static unsigned settle_all(hixl_ctx_t *ctx, unsigned want)
{
  return settle_by(ctx, all_peers, want, 40);
}

/* A world that fails once its ranks have connected to each other (rank 2
 * of 3 joins the rendezvous and never connects) leaves no peer behind:
 * the application never saw them.  And a world that is destroyed leaves
 * only the peers the application took (hixl_world_peer), which are then
 * its to release. */
static void world_release(const char *transports)
{
  enum { WT = 5000 }; /* the world's deadline; grace 11 s */
  hixl_ctx_t *c0 = unit_ctx(transports, WT, NULL), *c1 = unit_ctx(transports, WT, NULL);
  int port = unit_free_port(); /* the contexts are made first */
  struct world_arg a[2] = {{.ctx = c0, .rank = 0, .size = 3}, {.ctx = c1, .rank = 1, .size = 3}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    snprintf(a[i].rdv, sizeof(a[i].rdv), "127.0.0.1:%d", port);
    assert_int_equal(pthread_create(&th[i], NULL, world_thread, &a[i]), 0);
  }
  /* Rank 2: joins rank 0's rendezvous under an address nobody serves. */
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int fd = -1;
  for (int i = 0; i < 1000 && fd < 0; i++) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
      close(fd);
      fd = -1;
      usleep(10000);
    }
  }
  assert_true(fd >= 0);
  const char *join = "HIXLW 1 2 3 127.0.0.1:9\n";
  assert_int_equal(write(fd, join, strlen(join)), (ssize_t)strlen(join));
  char buf[1024];
  while (read(fd, buf, sizeof(buf)) > 0)
    ; /* the table, then rank 0 closes */
  close(fd);
  /* Both got past the rendezvous and connected to each other: what they
   * missed is rank 2's connection. */
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    printf("# rank %d: %s\n", i, a[i].err);
    assert_int_equal(a[i].st, HIXL_ERR_TIMEOUT);
    assert_non_null(strstr(a[i].err, "rank 2 did not connect"));
  }
  unsigned n0 = settle_all(c0, 0), n1 = settle_all(c1, 0);
  printf("# %s: %u and %u peers left after a failed world (ranks 0, 1)\n", transports, n0, n1);
  assert_int_equal(n0, 0);
  assert_int_equal(n1, 0);

  /* A world of 2 that works: rank 0 takes rank 1's peer, rank 1 takes
   * none but keeps the rmrs of an exchange past the world. */
  port = unit_free_port();
  void *mem[2];
  hixl_mr_t *mr[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(hixl_mem_alloc(i ? c1 : c0, 4096, HIXL_MEM_HOST,
                                    HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &mem[i], &mr[i]),
                     HIXL_OK);
  a[0] = (struct world_arg){.ctx = c0, .rank = 0, .size = 2, .mr = mr[0]};
  a[1] = (struct world_arg){.ctx = c1, .rank = 1, .size = 2, .mr = mr[1]};
  for (int i = 0; i < 2; i++) {
    snprintf(a[i].rdv, sizeof(a[i].rdv), "127.0.0.1:%d", port);
    assert_int_equal(pthread_create(&th[i], NULL, world_thread, &a[i]), 0);
  }
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    if (a[i].st != HIXL_OK)
      fail_msg("world rank %d over %s: %s", i, transports, hixl_last_error());
  }
  hixl_peer_t *p1 = hixl_world_peer(a[0].w, 1);
  assert_non_null(p1);
  for (int k = 0; k < 2; k++)
    hixl_rmr_release(a[0].rmrs[k]);
  hixl_world_destroy(a[0].w);
  hixl_world_destroy(a[1].w);
  n0 = settle_all(c0, 1);
  n1 = settle_all(c1, 2);
  printf("# %s: %u and %u peers left after hixl_world_destroy (1 taken at rank 0, rank 1 "
         "holding rmrs of 2)\n",
         transports, n0, n1);
  assert_int_equal(n0, 1);
  assert_int_equal(n1, 2);
  /* Its rmrs released, rank 1's peers go too; rank 0's taken one once
   * released. */
  for (int k = 0; k < 2; k++)
    hixl_rmr_release(a[1].rmrs[k]);
  assert_int_equal(hixl_peer_release(p1), HIXL_OK);
  n0 = settle_all(c0, 0);
  n1 = settle_all(c1, 0);
  printf("# %s: %u and %u peers left once released\n", transports, n0, n1);
  assert_int_equal(n0, 0);
  assert_int_equal(n1, 0);
  for (int i = 0; i < 2; i++)
    hixl_mr_dereg(mr[i]);
  hixl_ctx_destroy(c0);
  hixl_ctx_destroy(c1);
}

static void test_world_shm(void **state)
{
  (void)state;
  world_release("shm");
}

static void test_release_shm(void **state)
{
  (void)state;
  release_both("shm");
}

static void test_release_fabric(void **state)
{
  (void)state;
#ifdef HIXL_HAVE_FABRIC
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1);
  release_both("fabric");
#else
  skip();
#endif
}

static void test_shm(void **state)
{
  (void)state;
  churn("shm");
}

static void test_fabric(void **state)
{
  (void)state;
#ifdef HIXL_HAVE_FABRIC
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1); /* the default may pick shm's */
  churn("fabric");
#else
  skip();
#endif
}

int main(void)
{
  /* Transports set up at hixl_ctx_create: the target's lazy fabric set-up
   * at the first connect takes seconds under ASan, past the handshake
   * deadline of so short a timeout (that race is issue 16's, not this
   * test's). */
  setenv("HIXL_LAZY", "0", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shm),         cmocka_unit_test(test_fabric),
      cmocka_unit_test(test_release_shm), cmocka_unit_test(test_release_fabric),
      cmocka_unit_test(test_world_shm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

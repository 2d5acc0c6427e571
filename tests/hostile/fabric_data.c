/* SPDX-License-Identifier: MIT */
/*
 * Hostile peers on the fabric data plane (issue 13 item 7).  The target is
 * a hixl context in this process; a legitimate peer is a second context
 * (HIXL_TRANSPORTS=fabric, tcp;ofi_rxm); the attacker is a separate process
 * (this program re-executed as "attacker ...", fabric_attacker.c) that never
 * touches the control port: it opens its own endpoint against the target's
 * endpoint name (read from the target's context, as a peer gets it in
 * FABRIC_BIND_REPLY).
 *   rma:   keys 1..64 at offset 0 and at every region's address, reads and
 *          writes: all must fail, every region byte-identical after;
 *   notif: notification messages naming the legitimate peer's context id:
 *          none delivered; the legitimate peer's arrive exactly once, in order.
 * Each checks the target stays up and serves the legitimate peer meanwhile.
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
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../src/fabric/fabric_int.h"
#include "fabric_attacker.h"

#define PROV "tcp;ofi_rxm"
#define REG 4096

static hixl_ctx_t *target, *legit;
static hixl_peer_t *to_target;
static hixl_mr_t *t_legit_mr;
static hixl_rmr_t *legit_rmr;
static uint8_t *t_legit;

static hixl_ctx_t *mk_ctx(void)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.listen = "127.0.0.1:0";
  cfg.transports = "fabric";
  cfg.auth_token = "hostile-fabric-secret";
  cfg.timeout_ms = 10000;
  hixl_ctx_t *c = NULL;
  assert_int_equal(hixl_ctx_create(&cfg, &c), HIXL_OK);
  return c;
}

static int setup(void **state)
{
  (void)state;
  target = mk_ctx();
  legit = mk_ctx();
  assert_null(hixl__fc(target)); /* set up by the first fabric peer (docs/scale.md) */
  assert_int_equal(hixl_connect(legit, hixl_ctx_address(target), 10000, &to_target), HIXL_OK);
  assert_non_null(hixl__fc(target));
  t_legit = aligned_alloc(4096, REG);
  memset(t_legit, 0, REG);
  assert_int_equal(
      hixl_mr_reg(target, t_legit, REG, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &t_legit_mr),
      HIXL_OK);
  uint8_t blob[HIXL_RKEY_MAX];
  size_t len = sizeof(blob);
  assert_int_equal(hixl_mr_pack(t_legit_mr, blob, &len), HIXL_OK);
  assert_int_equal(hixl_rmr_unpack(to_target, blob, len, &legit_rmr), HIXL_OK);
  return 0;
}

static int teardown(void **state)
{
  (void)state;
  hixl_rmr_release(legit_rmr);
  hixl_ctx_destroy(legit);
  hixl_ctx_destroy(target);
  free(t_legit);
  return 0;
}

/* One round trip of the legitimate peer through the target's region. */
static void legit_round(unsigned round)
{
  uint8_t out[256], in[256];
  memset(out, (int)(round & 0xff), sizeof(out));
  out[0] = (uint8_t)(round >> 8);
  hixl_req_t *r = NULL;
  assert_true(hixl_put(to_target, out, sizeof(out), legit_rmr, 512, 0, &r) >= 0);
  assert_int_equal(hixl_req_wait(r, 10000), HIXL_OK);
  hixl_req_free(r);
  assert_true(hixl_get(to_target, in, sizeof(in), legit_rmr, 512, 0, &r) >= 0);
  assert_int_equal(hixl_req_wait(r, 10000), HIXL_OK);
  hixl_req_free(r);
  assert_memory_equal(in, out, sizeof(in));
}

static void hex(char *dst, const uint8_t *p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    sprintf(dst + 2 * i, "%02x", p[i]);
}

/* The attacker's FI_OFI_RXM_BUFFER_SIZE when not hixl's (NULL: hixl's). */
static const char *attacker_rxm_buf;

/* Run the attacker (this program as "attacker ...") while the legitimate
 * peer keeps using the target; returns its stdout, asserts it ran. */
static void run_attacker(char *const *args, char *out, size_t outsz, unsigned *rounds)
{
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(pfd[1], 1);
    close(pfd[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
    if (attacker_rxm_buf)
      setenv("FI_OFI_RXM_BUFFER_SIZE", attacker_rxm_buf, 1);
    execv("/proc/self/exe", args);
    _exit(3);
  }
  close(pfd[1]);
  int status = 0;
  *rounds = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    legit_round(++*rounds);
    usleep(2000);
  }
  legit_round(++*rounds);
  ssize_t n = read(pfd[0], out, outsz - 1);
  out[n > 0 ? n : 0] = 0;
  close(pfd[0]);
  print_message("attacker: %s(%u legitimate round trips meanwhile)\n", out, *rounds);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

static char addr_hex[2 * FAB_ADDR_MAX + 1];

static void target_addr(void)
{
  fab_ctx_t *fc = hixl__fc(target);
  hex(addr_hex, fc->addr, fc->addrlen);
}

static void test_rma_guessing(void **state)
{
  (void)state;
  static const unsigned acc[] = {HIXL_ACCESS_READ, 0, HIXL_ACCESS_WRITE,
                                 HIXL_ACCESS_READ | HIXL_ACCESS_WRITE,
                                 HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC};
  enum { N = sizeof(acc) / sizeof(acc[0]) };
  uint8_t *buf[N], *copy[N];
  hixl_mr_t *mr[N];
  char addrs[N][32];
  for (int i = 0; i < N; i++) {
    buf[i] = aligned_alloc(4096, REG);
    copy[i] = malloc(REG);
    for (int j = 0; j < REG; j++)
      buf[i][j] = (uint8_t)(0x10 * (i + 1) + j % 7);
    memcpy(copy[i], buf[i], REG);
    assert_int_equal(hixl_mr_reg(target, buf[i], REG, acc[i], &mr[i]), HIXL_OK);
    snprintf(addrs[i], sizeof(addrs[i]), "%#llx", (unsigned long long)(uintptr_t)buf[i]);
  }
  assert_int_equal(hixl_mr_publish(mr[0], "read-only"), HIXL_OK);
  target_addr();
  char *args[] = {"fabric_data", "attacker", "rma",    PROV,     addr_hex, addrs[0],
                  addrs[1],      addrs[2],   addrs[3], addrs[4], NULL};
  char out[512];
  unsigned rounds;
  run_attacker(args, out, sizeof(out), &rounds);
  /* A write's completion at the attacker means sent, not applied (no
   * delivery completion asked): the region bytes below say whether any
   * landed.  A read that completed, or whose bytes arrived, is a leak. */
  assert_non_null(strstr(out, "connected 1 ")); /* else every try failed unseen */
  assert_non_null(strstr(out, " reads 0 "));
  assert_non_null(strstr(out, " landed 0"));
  for (int i = 0; i < N; i++) {
    assert_memory_equal(buf[i], copy[i], REG);
    assert_int_equal(hixl_mr_dereg(mr[i]), HIXL_OK);
    free(buf[i]);
    free(copy[i]);
  }
  legit_round(100000);
}

/* An attacker whose rxm has another eager limit: the target's rxm rejects
 * each connection request, and the attacker's rxm retries it on every poll
 * of its CQ for as long as it keeps sending (5 s here) -- a connection
 * flood.  The target pays for each refusal (its fabric thread busy about
 * as long as the attacker's CPU), but the legitimate peer's round trips go
 * on: each one must complete (run_attacker waits up to 10 s per op). */
static void test_mismatched_flood(void **state)
{
  (void)state;
  target_addr();
  char fake[32];
  snprintf(fake, sizeof(fake), "%#llx", (unsigned long long)(uintptr_t)t_legit);
  char *args[] = {"fabric_data", "attacker", "rma", PROV, addr_hex, fake, NULL};
  char out[512];
  unsigned rounds;
  attacker_rxm_buf = "16384";
  run_attacker(args, out, sizeof(out), &rounds);
  attacker_rxm_buf = NULL;
  assert_non_null(strstr(out, "connected 0 "));
  assert_true(rounds >= 2); /* during the flood, not only the one after it */
  legit_round(100002);
}

static void test_forged_notifications(void **state)
{
  (void)state;
  hixl_notif_t n;
  while (hixl_notif_poll(target, &n, 1) > 0) {
  }
  enum { LEGIT = 40, FORGED = 16 };
  /* The target's handle of the legitimate peer: the peer of its first
   * notification. */
  hixl_req_t *r;
  assert_true(hixl_notify(to_target, 1, 0, &r) >= 0);
  assert_int_equal(hixl_req_wait(r, 10000), HIXL_OK);
  hixl_req_free(r);
  assert_int_equal(hixl_notif_wait(target, &n, 10000), HIXL_OK);
  assert_int_equal(n.imm, 1);
  hixl_peer_t *legit_at_target = n.peer;
  target_addr();
  char sender[32], count[16];
  snprintf(sender, sizeof(sender), "%llu", (unsigned long long)legit->id);
  snprintf(count, sizeof(count), "%d", FORGED);
  char *args[] = {"fabric_data", "attacker", "notif", PROV, addr_hex, sender, count, NULL};
  char out[512];
  unsigned rounds;
  run_attacker(args, out, sizeof(out), &rounds);
  char want[32];
  snprintf(want, sizeof(want), "sent %d", FORGED); /* each one reached the target */
  assert_non_null(strstr(out, want));
  usleep(200000); /* let the forged messages reach the target */
  for (uint32_t i = 2; i <= LEGIT; i++) {
    assert_true(hixl_notify(to_target, i, 0, &r) >= 0);
    assert_int_equal(hixl_req_wait(r, 10000), HIXL_OK);
    hixl_req_free(r);
  }
  uint32_t next = 2;
  int forged = 0;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double el = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9;
    if (el > (next > LEGIT ? 0.5 : 15.0))
      break;
    if (hixl_notif_poll(target, &n, 1) != 1) {
      usleep(1000);
      continue;
    }
    if (n.imm >= ATTACKER_IMM_BASE) {
      forged++;
      continue;
    }
    assert_ptr_equal(n.peer, legit_at_target);
    assert_int_equal(n.imm, next); /* exactly once, in order */
    next++;
  }
  print_message("forged notifications delivered: %d\n", forged);
  assert_int_equal(forged, 0);
  assert_int_equal(next, LEGIT + 1);
  legit_round(100001);
}

int main(int argc, char **argv)
{
  if (argc >= 2 && strcmp(argv[1], "attacker") == 0)
    return attacker_main(argc - 1, argv + 1);
  signal(SIGPIPE, SIG_IGN);
  setenv("HIXL_TRANSPORTS", "fabric", 1);
  setenv("HIXL_FABRIC_PROVIDER", PROV, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rma_guessing),
      cmocka_unit_test(test_forged_notifications),
      cmocka_unit_test(test_mismatched_flood),
  };
  return cmocka_run_group_tests_name("fabric_data", tests, setup, teardown);
}

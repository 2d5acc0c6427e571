/* SPDX-License-Identifier: MIT */
/* rxm's buffer sizes (src/fabric/fabric.c, rxm_init_sized; docs/scale.md):
 * libfabric reads them from the environment once per process, so each case
 * runs in a fresh child that sets up fabric (tcp;ofi_rxm) and reports what
 * the context's creation added to RSS, where rxm's posted receive buffers
 * (FI_OFI_RXM_MSG_RX_SIZE of them, FI_OFI_RXM_BUFFER_SIZE each) dominate:
 * 4,096 x 16 KiB = 64 MB with libfabric's sizes, 256 x 1 KiB with hixl's.
 * It also reports whether the variables are left in the environment
 * afterwards: a variable the user set stays, ours must not (children would
 * inherit them).  The buffer size must agree between peers: a child with
 * one connects to a target child with another and must be refused at the
 * connect, naming the variable (rxm itself would leave every operation
 * queued until it timed out). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include "core.h"

#ifdef HIXL_HAVE_FABRIC

typedef struct report {
  int status;           /* hixl_ctx_create */
  long rss_kib;         /* RSS added by hixl_ctx_create */
  char buf[32], rx[32]; /* FI_OFI_RXM_BUFFER_SIZE / MSG_RX_SIZE after, "" if unset */
  char err[256];
  int conn;       /* hixl_connect to the target, when given one */
  int fence;      /* a notify and a fence over that peer, when it connected */
  char cerr[256]; /* the connect's or the fence's error */
} report_t;

static long rss_kib(void)
{
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  while (f && fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %ld kB", &v) == 1)
      break;
  if (f)
    fclose(f);
  return v;
}

/* Read len bytes, or until EOF; how many came. */
static size_t read_full(int fd, void *buf, size_t len)
{
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, (char *)buf + got, len - got);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  return got;
}

static void set_sizes(const char *user_buf, const char *user_rx)
{
  unsetenv("FI_OFI_RXM_BUFFER_SIZE");
  unsetenv("FI_OFI_RXM_MSG_RX_SIZE");
  if (user_buf)
    setenv("FI_OFI_RXM_BUFFER_SIZE", user_buf, 1);
  if (user_rx)
    setenv("FI_OFI_RXM_MSG_RX_SIZE", user_rx, 1);
  setenv("HIXL_LAZY", "0", 1);
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1);
}

/* A fabric target in a child with the user's buffer size (NULL: unset):
 * its address in addr; it lives until *hold is closed. */
static pid_t target_child(const char *user_buf, char *addr, size_t len, int *hold)
{
  int a[2], h[2];
  assert_int_equal(pipe(a), 0);
  assert_int_equal(pipe(h), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(a[0]);
    close(h[1]);
    set_sizes(user_buf, NULL);
    hixl_ctx_t *c = NULL;
    char out[128] = "";
    if (unit_create("fabric", 0, NULL, &c) == HIXL_OK)
      snprintf(out, sizeof(out), "%s", hixl_ctx_address(c));
    if (write(a[1], out, sizeof(out)) != (ssize_t)sizeof(out))
      _exit(1);
    char b;
    while (read(h[0], &b, 1) > 0) {
    }
    hixl_ctx_destroy(c);
    _exit(0);
  }
  close(a[1]);
  close(h[0]);
  char in[128] = "";
  read_full(a[0], in, sizeof(in));
  close(a[0]);
  in[sizeof(in) - 1] = 0;
  if (in[0] == 0)
    fail_msg("the target child could not set up fabric");
  snprintf(addr, len, "%s", in);
  *hold = h[1];
  return pid;
}

static void target_end(pid_t pid, int hold)
{
  close(hold);
  int ws = 0;
  waitpid(pid, &ws, 0);
  assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

/* In a child: the user's FI_OFI_RXM_BUFFER_SIZE and MSG_RX_SIZE (NULL:
 * unset), then one fabric context set up at its creation; with a target,
 * a connect to it and, if that worked, a notification fenced. */
static report_t run_child_to(const char *user_buf, const char *user_rx, const char *target)
{
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(pfd[0]);
    report_t r = {0};
    set_sizes(user_buf, user_rx);
    hixl_ctx_t *c = NULL;
    long before = rss_kib();
    r.status = unit_create("fabric", 0, NULL, &c);
    r.rss_kib = rss_kib() - before;
    if (r.status != HIXL_OK)
      snprintf(r.err, sizeof(r.err), "%s", hixl_last_error());
    const char *b = getenv("FI_OFI_RXM_BUFFER_SIZE"), *x = getenv("FI_OFI_RXM_MSG_RX_SIZE");
    snprintf(r.buf, sizeof(r.buf), "%s", b ? b : "");
    snprintf(r.rx, sizeof(r.rx), "%s", x ? x : "");
    r.conn = r.fence = -1;
    hixl_peer_t *p = NULL;
    if (c && target) {
      r.conn = hixl_connect(c, target, 5000, &p);
      if (r.conn == HIXL_OK) {
        r.fence = hixl_notify(p, 7, 0, NULL);
        if (r.fence == HIXL_OK)
          r.fence = hixl_fence(c, p, 5000);
      }
      snprintf(r.cerr, sizeof(r.cerr), "%s", hixl_last_error());
    }
    if (c)
      hixl_ctx_destroy(c);
    ssize_t w = write(pfd[1], &r, sizeof(r));
    _exit(w == (ssize_t)sizeof(r) ? 0 : 1);
  }
  close(pfd[1]);
  report_t r;
  size_t got = read_full(pfd[0], &r, sizeof(r));
  close(pfd[0]);
  int ws = 0;
  waitpid(pid, &ws, 0);
  if (got != sizeof(r) || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    fail_msg("child did not report (status %#x)", ws);
  if (r.status != HIXL_OK)
    fail_msg("hixl_ctx_create over tcp;ofi_rxm: %s", r.err);
  return r;
}

static report_t run_child(const char *user_buf, const char *user_rx)
{
  return run_child_to(user_buf, user_rx, NULL);
}

/* What a context's creation adds to RSS, compared within one run (an
 * absolute figure moves with the allocator: meson's MALLOC_PERTURB_ alone
 * adds 13 MB to each):
 *   nothing set: rxm posts 256 receives of 1 KiB (6.4 MB measured);
 *   the user's 16 KiB buffers, hixl's count: 21.9 MB (+15.4 MB);
 *   the user's 16 KiB and 4,096 (libfabric's defaults): 73.5 MB (+51.6 MB).
 * Each variable the user set stays, and hixl's do not (children inherit
 * the environment). */
static void sizes_rss(void **state)
{
  (void)state;
  report_t h = run_child(NULL, NULL), b = run_child("16384", NULL), u = run_child("16384", "4096");
  print_message("context creation: hixl's sizes +%ld KiB, the user's buffer size +%ld KiB, "
                "libfabric's defaults +%ld KiB RSS\n",
                h.rss_kib, b.rss_kib, u.rss_kib);
  assert_true(h.rss_kib > 0);
  assert_true(b.rss_kib - h.rss_kib > 8 * 1024);
  assert_true(u.rss_kib - b.rss_kib > 32 * 1024);
  assert_string_equal(h.buf, "");
  assert_string_equal(h.rx, "");
  assert_string_equal(b.buf, "16384");
  assert_string_equal(b.rx, "");
  assert_string_equal(u.buf, "16384");
  assert_string_equal(u.rx, "4096");
}

/* Two processes with hixl's sizes talk (a notification is fenced). */
static void sizes_agree(void **state)
{
  (void)state;
  char addr[128];
  int hold;
  pid_t t = target_child(NULL, addr, sizeof(addr), &hold);
  report_t r = run_child_to(NULL, NULL, addr);
  target_end(t, hold);
  if (r.conn != HIXL_OK || r.fence != HIXL_OK)
    fail_msg("connect %d, fence %d: %s", r.conn, r.fence, r.cerr);
}

/* Different buffer sizes: the connect fails at once, either way round,
 * naming the variable and both sizes. */
static void sizes_differ_one(const char *target_buf, const char *our_buf, const char *a,
                             const char *b)
{
  char addr[128];
  int hold;
  pid_t t = target_child(target_buf, addr, sizeof(addr), &hold);
  report_t r = run_child_to(our_buf, NULL, addr);
  target_end(t, hold);
  print_message("connect: %s\n", r.cerr);
  assert_int_equal(r.conn, HIXL_ERR_UNSUPPORTED);
  if (strstr(r.cerr, "FI_OFI_RXM_BUFFER_SIZE") == NULL || strstr(r.cerr, a) == NULL ||
      strstr(r.cerr, b) == NULL)
    fail_msg("the error does not say what differs: %s", r.cerr);
}

static void sizes_differ(void **state)
{
  (void)state;
  sizes_differ_one(NULL, "16384", "1024", "16384");
  sizes_differ_one("4096", NULL, "4096", "1024");
}
#endif

int main(void)
{
#ifdef HIXL_HAVE_FABRIC
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sizes_rss),
      cmocka_unit_test(sizes_agree),
      cmocka_unit_test(sizes_differ),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
#else
  printf("1..0 # SKIP fabric is not built\n");
  return 77;
#endif
}

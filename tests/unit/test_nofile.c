/* SPDX-License-Identifier: MIT */
/* A shm target at its descriptor limit: the kernel drops the descriptors a
 * binding peer passes it (MSG_CTRUNC).  The initiator's connect must then
 * fail with an error that names RLIMIT_NOFILE -- never "closed the
 * connection during the handshake" -- and the target must go on serving.
 *
 * The target runs in a child process whose soft limit is set to what it
 * has open plus `extra`, for extra = 1, 2, ...: with little room its accept
 * of the unix connection fails (it pauses accepting: the connect times
 * out), with a little more the bind's 3 descriptors are dropped (the case
 * under test), with enough it connects.
 *
 * Second case: hixl_ctx_create with fabric set up at once, at open +
 * extra: every "Too many open files" it reports (the provider's FI_EMFILE,
 * its own sockets, epoll set, eventfd, memfd) must name RLIMIT_NOFILE.
 *
 * Third: a fabric target at its limit while initiators open data
 * connections it cannot accept (the provider's listening socket stays
 * readable): its progress thread must not spin, and a peer it can still
 * serve is served. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include <hixl.h>
#include "../common/usage.h"

static int open_fds(void)
{
  return unit_dir_entries("/proc/self/fd") - 1; /* the directory's own */
}

/* In a child: at most what it has open now plus extra descriptors. */
static void limit_to(int extra)
{
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = (rlim_t)(open_fds() + extra);
  setrlimit(RLIMIT_NOFILE, &rl);
}

/* In a child: t's address to the parent, with its NUL. */
static void send_address(int fd, hixl_ctx_t *t)
{
  const char *a = hixl_ctx_address(t);
  if (write(fd, a, strlen(a) + 1) < 0)
    _exit(4);
}

static hixl_ctx_t *make(void) { return unit_ctx("shm", 1500, NULL); }

/* fork, with a pipe from the child to us: *fd is the child's write end
 * in the child (which never goes back into cmocka, and is gone with the
 * test), our read end here. */
static pid_t fork_piped(int *fd)
{
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(pfd[0]);
    *fd = pfd[1];
  } else {
    close(pfd[1]);
    *fd = pfd[0];
  }
  return pid;
}

/* What the child said on fd (closed then), NUL-terminated in buf; its
 * length, <= 0 if it said nothing. */
static ssize_t answer(int fd, char *buf, size_t n)
{
  ssize_t k = read(fd, buf, n - 1);
  close(fd);
  if (k > 0)
    buf[k] = 0;
  return k;
}

/* A target with open + extra descriptors at most; its address in addr. */
static pid_t target(int extra, char *addr, size_t n)
{
  int fd;
  pid_t pid = fork_piped(&fd);
  if (pid == 0) {
    hixl_ctx_t *t = NULL, *w = NULL;
    if (unit_create("shm", 1500, NULL, &t) != HIXL_OK ||
        unit_create("shm", 1500, NULL, &w) != HIXL_OK)
      _exit(2);
    /* Warm it up: a first connection makes what later ones reuse. */
    hixl_peer_t *p = NULL;
    if (hixl_connect(w, hixl_ctx_address(t), 5000, &p) != HIXL_OK)
      _exit(3);
    hixl_disconnect(p);
    hixl_ctx_destroy(w);
    usleep(300000);
    limit_to(extra);
    send_address(fd, t);
    for (;;)
      pause();
  }
  if (answer(fd, addr, n) <= 0) { /* it could not get going at this limit: no step */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
  }
  return pid;
}

static void test_limit_is_named(void **state)
{
  (void)state;
  int named = 0, ok = 0;
  for (int extra = 0; extra <= 20 && ok == 0; extra++) {
    char addr[128];
    pid_t pid = target(extra, addr, sizeof(addr));
    if (pid < 0)
      continue;
    /* Made after the fork, gone before the next: this process forks
     * with no thread of ours running (TSan refuses to otherwise). */
    hixl_ctx_t *ini = make();
    hixl_peer_t *p = NULL;
    hixl_status_t st = hixl_connect(ini, addr, 3000, &p);
    char err[512];
    snprintf(err, sizeof(err), "%s", hixl_last_error());
    if (st == HIXL_OK) {
      ok++;
      assert_string_equal(hixl_peer_transport(p), "shm");
      hixl_disconnect(p);
    } else {
      print_message("target at open+%d: %s\n", extra, err);
      /* Below the dropped-descriptor steps the target may not accept at
       * all and shed the handshake (not named yet: docs/scale.md); from
       * the first named failure on, every failure must say why. */
      if (named > 0 && strstr(err, "closed the connection during the handshake"))
        fail_msg("at open+%d the error does not say why: %s", extra, err);
      if (strstr(err, "RLIMIT_NOFILE")) {
        named++;
        assert_true(st == HIXL_ERR_NOMEM || st == HIXL_ERR_TRANSPORT);
      }
    }
    hixl_ctx_destroy(ini);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  assert_true(named > 0);  /* the dropped-descriptor case was reached, and named */
  assert_int_equal(ok, 1); /* with room, it connects */
}

/* Run fn(arg, extra) in a child with HIXL_LAZY=0 (its transports set up
 * at hixl_ctx_create), gone with us; fn sets the limit where it needs it.
 * Returns the child's status, its hixl_last_error() in err. */
static int in_child(hixl_status_t (*fn)(const void *arg, int extra), const void *arg, int extra,
                    char *err, size_t n)
{
  int fd;
  pid_t pid = fork_piped(&fd);
  if (pid == 0) {
    setenv("HIXL_LAZY", "0", 1);
    hixl_status_t st = fn(arg, extra);
    char msg[600];
    int k = snprintf(msg, sizeof(msg), "%d %s", (int)st, st == HIXL_OK ? "" : hixl_last_error());
    if (write(fd, msg, (size_t)k + 1) < 0)
      _exit(4);
    _exit(0); /* no destroy: the process goes */
  }
  char buf[600];
  ssize_t k = answer(fd, buf, sizeof(buf));
  waitpid(pid, NULL, 0);
  if (k <= 0)
    fail_msg("the child at open+%d said nothing", extra);
  const char *sp = strchr(buf, ' ');
  snprintf(err, n, "%s", sp ? sp + 1 : "");
  return atoi(buf);
}

/* fn in a child at open + 0, 1, ... max descriptors until it succeeds
 * (*ok: whether it did); each failure is printed as what's and handed to
 * failed, which fails the test or says whether it counts.  How many
 * counted. */
static int climb(hixl_status_t (*fn)(const void *arg, int extra), const void *arg, int max,
                 const char *what, bool (*failed)(int st, const char *err, int extra), int *ok)
{
  int counted = 0;
  *ok = 0;
  for (int extra = 0; extra <= max && *ok == 0; extra++) {
    char err[600];
    int st = in_child(fn, arg, extra, err, sizeof(err));
    if (st == HIXL_OK) {
      (*ok)++;
      continue;
    }
    print_message("%s at open+%d: %s\n", what, extra, err);
    counted += failed(st, err, extra);
  }
  return counted;
}

/* An initiator at its own limit (open + extra in a child, its context
 * and shm made before the limit) connecting to a target with room: each
 * failure names RLIMIT_NOFILE; some step fails in the check before the
 * bind, saying how many descriptors it takes and how many the process
 * has; with room it connects. */
static hixl_status_t connect_limited(const void *addr, int extra)
{
  hixl_ctx_t *c = make();
  limit_to(extra);
  hixl_peer_t *p = NULL;
  return hixl_connect(c, addr, 3000, &p);
}

/* Its failures: each names the limit; counted, the check before the bind. */
static bool connect_failed(int st, const char *err, int extra)
{
  if (strstr(err, "RLIMIT_NOFILE") == NULL)
    fail_msg("at open+%d the error does not name the limit: %s", extra, err);
  if (strstr(err, "takes 6 free descriptors for a moment and this process has")) {
    assert_int_equal(st, HIXL_ERR_NOMEM);
    return true;
  }
  return false;
}

static void test_initiator_limit_is_named(void **state)
{
  (void)state;
  char addr[128];
  pid_t tpid = target(1000, addr, sizeof(addr));
  assert_true(tpid > 0);
  int ok;
  int checked = climb(connect_limited, addr, 12, "initiator", connect_failed, &ok);
  kill(tpid, SIGKILL);
  waitpid(tpid, NULL, 0);
  assert_true(checked > 0); /* the check before the bind was reached, and said so */
  assert_int_equal(ok, 1);  /* with room, it connects */
}

/* A context whose fabric set-up (HIXL_LAZY=0: at hixl_ctx_create) runs
 * out of descriptors, in a child at open + extra: every failure that says
 * "Too many open files" must also name RLIMIT_NOFILE, and with room it
 * is created. */
static hixl_status_t fabric_create_limited(const void *arg, int extra)
{
  (void)arg;
  limit_to(extra);
  hixl_ctx_t *c = NULL;
  return unit_create("fabric", 0, NULL, &c);
}

/* Its failures: "Too many open files" names the limit too; counted, those
 * that name it. */
static bool fabric_create_failed(int st, const char *err, int extra)
{
  (void)st;
  if (strstr(err, "Too many open files") && !strstr(err, "RLIMIT_NOFILE"))
    fail_msg("at open+%d the error does not name the limit: %s", extra, err);
  return strstr(err, "RLIMIT_NOFILE") != NULL;
}

static void test_fabric_limit_is_named(void **state)
{
  (void)state;
#ifndef HIXL_HAVE_FABRIC
  skip();
#endif
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1); /* the default may pick shm's */
  int ok;
  int named = climb(fabric_create_limited, NULL, 60, "fabric set-up", fabric_create_failed, &ok);
  assert_true(named > 0);  /* the provider ran out, and it was named */
  assert_int_equal(ok, 1); /* with room, it is set up */
}

enum { SPIN_INI = 12, SPIN_ROOM = 16 }; /* room: all control connections, 4 data ones */

/* The target of the third case: fabric only, a region "m", its limit at
 * open + SPIN_ROOM (room for the control connections and a few data
 * connections, not for all).  On each byte from `cmd` it reports the CPU
 * it used over the next 2 s, as CPU seconds / wall seconds. */
static pid_t fabric_target(char *addr, size_t n, int *cmd, int *rep)
{
  int a, c[2], r[2];
  assert_int_equal(pipe(c), 0);
  assert_int_equal(pipe(r), 0);
  pid_t pid = fork_piped(&a);
  if (pid == 0) {
    close(c[1]);
    close(r[0]);
    setenv("HIXL_LAZY", "0", 1);
    hixl_ctx_t *t = NULL;
    void *mem;
    hixl_mr_t *mr;
    if (unit_create("fabric", 3000, NULL, &t) != HIXL_OK ||
        hixl_mem_alloc(t, 4096, HIXL_MEM_HOST, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &mem, &mr) !=
            HIXL_OK ||
        hixl_mr_publish(mr, "m") != HIXL_OK)
      _exit(2);
    limit_to(SPIN_ROOM);
    send_address(a, t);
    char b;
    while (read(c[0], &b, 1) == 1) {
      long long c0 = cpu_us(), w0 = wall_us();
      /* Asleep as a target is (its wait arms the provider's fd too). */
      hixl_notif_t nt;
      while (wall_us() - w0 < 2000000)
        hixl_notif_wait(t, &nt, 2000);
      double frac = (double)(cpu_us() - c0) / (double)(wall_us() - w0);
      if (write(r[1], &frac, sizeof(frac)) != sizeof(frac))
        _exit(5);
    }
    _exit(0);
  }
  close(c[0]);
  close(r[1]);
  if (answer(a, addr, n) <= 0)
    fail_msg("the fabric target did not start");
  *cmd = c[1];
  *rep = r[0];
  return pid;
}

static double target_cpu(int cmd, int rep)
{
  double frac = -1;
  assert_int_equal(write(cmd, "m", 1), 1);
  assert_int_equal(read(rep, &frac, sizeof(frac)), (ssize_t)sizeof(frac));
  return frac;
}

static void test_fabric_at_limit_does_not_spin(void **state)
{
  (void)state;
#ifndef HIXL_HAVE_FABRIC
  skip();
#endif
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1);
  char addr[128];
  int cmd, rep;
  pid_t pid = fabric_target(addr, sizeof(addr), &cmd, &rep);
  double quiet = target_cpu(cmd, rep);
  hixl_ctx_t *ini[SPIN_INI] = {0};
  hixl_peer_t *p[SPIN_INI] = {0};
  hixl_rmr_t *r[SPIN_INI] = {0};
  int connected = 0, served = 0;
  /* Every control connection first (one descriptor each at the target),
   * then the puts: each first put opens a data connection (lazy), which
   * the target accepts only while it has descriptors.  Until one is not
   * served: its data connection waits in the target's backlog, which is
   * what made the provider spin. */
  for (int i = 0; i < SPIN_INI; i++) {
    ini[i] = unit_ctx("fabric", 3000, NULL);
    if (hixl_connect(ini[i], addr, 3000, &p[i]) != HIXL_OK ||
        hixl_rmr_lookup(p[i], "m", 3000, &r[i]) != HIXL_OK)
      fail_msg("initiator %d: %s", i, hixl_last_error());
    connected++;
  }
  for (int i = 0; i < SPIN_INI && served == i; i++) {
    uint64_t v = (uint64_t)i;
    hixl_status_t st = hixl_put(p[i], &v, sizeof(v), r[i], 8 * (uint64_t)i, 0, NULL);
    if (st == HIXL_OK)
      st = hixl_fence(ini[i], p[i], 1500);
    if (st == HIXL_OK)
      served++;
    else
      print_message("initiator %d: put: %s (%s)\n", i, hixl_strerror(st), hixl_last_error());
  }
  double busy = target_cpu(cmd, rep);
  print_message("target CPU: %.3f of a core idle, %.3f with %d connected, %d served\n", quiet, busy,
                connected, served);
  assert_true(connected > 0);
  assert_true(served > 0);             /* it serves whom it can */
  assert_true(served < connected);     /* and the limit was reached */
  assert_true(busy < 0.5 + 2 * quiet); /* a busy loop was a whole core (1.0), or two */
  for (int i = 0; i < SPIN_INI; i++) {
    if (r[i])
      hixl_rmr_release(r[i]);
    if (p[i])
      hixl_disconnect(p[i]);
    hixl_ctx_destroy(ini[i]);
  }
  close(cmd);
  close(rep);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_limit_is_named),
      cmocka_unit_test(test_initiator_limit_is_named),
      cmocka_unit_test(test_fabric_limit_is_named),
      cmocka_unit_test(test_fabric_at_limit_does_not_spin),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

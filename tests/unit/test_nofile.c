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
 * its own sockets, epoll set, eventfd, memfd) must name RLIMIT_NOFILE. */
#define _GNU_SOURCE
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <hixl.h>

static int open_fds(void)
{
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    n += e->d_name[0] != '.';
  if (d)
    closedir(d);
  return n - 1; /* the directory's own */
}

static hixl_ctx_t *make(void)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.transports = "shm";
  cfg.listen = "127.0.0.1:0";
  cfg.timeout_ms = 1500;
  hixl_ctx_t *c = NULL;
  if (hixl_ctx_create(&cfg, &c) != HIXL_OK)
    fail_msg("hixl_ctx_create: %s", hixl_last_error());
  return c;
}

/* A target with open + extra descriptors at most; its address in addr. */
static pid_t target(int extra, char *addr, size_t n)
{
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* Never back into cmocka from here; gone with the test. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(pfd[0]);
    hixl_config_t cfg;
    hixl_config_init(&cfg);
    cfg.transports = "shm";
    cfg.listen = "127.0.0.1:0";
    cfg.timeout_ms = 1500;
    hixl_ctx_t *t = NULL, *w = NULL;
    if (hixl_ctx_create(&cfg, &t) != HIXL_OK || hixl_ctx_create(&cfg, &w) != HIXL_OK)
      _exit(2);
    /* Warm it up: a first connection makes what later ones reuse. */
    hixl_peer_t *p = NULL;
    if (hixl_connect(w, hixl_ctx_address(t), 5000, &p) != HIXL_OK)
      _exit(3);
    hixl_disconnect(p);
    hixl_ctx_destroy(w);
    usleep(300000);
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = (rlim_t)(open_fds() + extra);
    setrlimit(RLIMIT_NOFILE, &rl);
    char a[128];
    snprintf(a, sizeof(a), "%s", hixl_ctx_address(t));
    if (write(pfd[1], a, strlen(a) + 1) < 0)
      _exit(4);
    for (;;)
      pause();
  }
  close(pfd[1]);
  ssize_t k = read(pfd[0], addr, n - 1);
  close(pfd[0]);
  if (k <= 0) { /* it could not get going at this limit: no step */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
  }
  addr[k] = 0;
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

/* A context whose fabric set-up (HIXL_LAZY=0: at hixl_ctx_create) runs
 * out of descriptors, in a child at open + extra: every failure that says
 * "Too many open files" must also name RLIMIT_NOFILE, and with room it
 * is created.  The child sends back its status and hixl_last_error(). */
static int fabric_create_at(int extra, char *err, size_t n)
{
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(pfd[0]);
    setenv("HIXL_LAZY", "0", 1);
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = (rlim_t)(open_fds() + extra);
    setrlimit(RLIMIT_NOFILE, &rl);
    hixl_config_t cfg;
    hixl_config_init(&cfg);
    cfg.transports = "fabric";
    cfg.listen = "127.0.0.1:0";
    hixl_ctx_t *c = NULL;
    hixl_status_t st = hixl_ctx_create(&cfg, &c);
    char msg[600];
    int k = snprintf(msg, sizeof(msg), "%d %s", (int)st, st == HIXL_OK ? "" : hixl_last_error());
    if (write(pfd[1], msg, (size_t)k + 1) < 0)
      _exit(4);
    _exit(0); /* no destroy: the process goes */
  }
  close(pfd[1]);
  char buf[600];
  ssize_t k = read(pfd[0], buf, sizeof(buf) - 1);
  close(pfd[0]);
  waitpid(pid, NULL, 0);
  if (k <= 0)
    fail_msg("the child at open+%d said nothing", extra);
  buf[k] = 0;
  int st = atoi(buf);
  const char *sp = strchr(buf, ' ');
  snprintf(err, n, "%s", sp ? sp + 1 : "");
  return st;
}

static void test_fabric_limit_is_named(void **state)
{
  (void)state;
#ifndef HIXL_HAVE_FABRIC
  skip();
#endif
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 1); /* the default may pick shm's */
  int named = 0, ok = 0;
  for (int extra = 0; extra <= 60 && ok == 0; extra++) {
    char err[600];
    int st = fabric_create_at(extra, err, sizeof(err));
    if (st == HIXL_OK) {
      ok++;
      continue;
    }
    print_message("fabric set-up at open+%d: %s\n", extra, err);
    if (strstr(err, "Too many open files") && !strstr(err, "RLIMIT_NOFILE"))
      fail_msg("at open+%d the error does not name the limit: %s", extra, err);
    named += strstr(err, "RLIMIT_NOFILE") != NULL;
  }
  assert_true(named > 0);  /* the provider ran out, and it was named */
  assert_int_equal(ok, 1); /* with room, it is set up */
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_limit_is_named),
      cmocka_unit_test(test_fabric_limit_is_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

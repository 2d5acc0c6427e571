/* SPDX-License-Identifier: MIT */
/* Errors that say what to do (issue 17, docs/errors.md): each usual cause
 * of a failed hixl_connect is brought about for real, and its message must
 * name the fix -- and never an auth token:
 *   refused    a loopback port nobody listens on;
 *   timeout    a listener whose accept queue is full (the kernel drops our
 *              SYN, as a firewall would);
 *   auth       no token against a target with one; another token;
 *   transport  no transport both sides allow. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <linux/capability.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include <hixl.h>

#include "base.h"

static hixl_ctx_t *make(const char *transports, const char *token)
{
  return unit_ctx(transports, 0, token);
}

static void expect(hixl_status_t got, hixl_status_t want, const char *const *words, size_t n)
{
  const char *e = hixl_last_error();
  if (got != want)
    fail_msg("got %s, want %s: %s", hixl_strerror(got), hixl_strerror(want), e);
  for (size_t i = 0; i < n; i++)
    if (strstr(e, words[i]) == NULL)
      fail_msg("the message does not say \"%s\": %s", words[i], e);
}

static void refused(void **state)
{
  (void)state;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof(a);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0); /* bound, not listening */
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
  char addr[64];
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", ntohs(a.sin_port));
  hixl_ctx_t *c = make("shm", NULL);
  hixl_peer_t *p;
  static const char *const w[] = {"Connection refused", "is the target running", "hixl_ctx_address",
                                  "HIXL_LISTEN", "loopback"};
  expect(hixl_connect(c, addr, 5000, &p), HIXL_ERR_PEER_LOST, w, 5);
  close(fd);
  hixl_ctx_destroy(c);
}

static void timeout(void **state)
{
  (void)state;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof(a);
  assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(lfd, 0), 0);
  assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &l), 0);
  /* Fill the accept queue (never accepted) until a connect gets no answer. */
  int fill[16], n = 0;
  for (; n < 16; n++) {
    fill[n] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(fill[n], (struct sockaddr *)&a, sizeof(a));
    struct pollfd p = {.fd = fill[n], .events = POLLOUT};
    if (poll(&p, 1, 300) == 0) {
      n++;
      break;
    }
  }
  char addr[64];
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", ntohs(a.sin_port));
  hixl_ctx_t *c = make("shm", NULL);
  hixl_peer_t *p;
  static const char *const w[] = {"timed out", "firewall", "nc -vz", "longer timeout"};
  expect(hixl_connect(c, addr, 500, &p), HIXL_ERR_TIMEOUT, w, 4);
  for (int i = 0; i < n; i++)
    close(fill[i]);
  close(lfd);
  hixl_ctx_destroy(c);
}

static void auth(void **state)
{
  (void)state;
  hixl_ctx_t *t = make("shm", "s3cret-target-0123456789"), *none = make("shm", NULL),
             *other = make("shm", "s3cret-other-0123456789");
  hixl_peer_t *p;
  static const char *const w_none[] = {"requires an auth token", "HIXL_AUTH_TOKEN"};
  expect(hixl_connect(none, hixl_ctx_address(t), 5000, &p), HIXL_ERR_AUTH, w_none, 2);
  static const char *const w_other[] = {"another one or none", "HIXL_AUTH_TOKEN"};
  expect(hixl_connect(other, hixl_ctx_address(t), 5000, &p), HIXL_ERR_AUTH, w_other, 2);
  assert_null(strstr(hixl_last_error(), "s3cret"));
  hixl_ctx_destroy(t);
  hixl_ctx_destroy(none);
  hixl_ctx_destroy(other);
}

static void transport(void **state)
{
  (void)state;
  setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 0);
  hixl_ctx_t *t = make("fabric", NULL), *c = make("shm", NULL);
  hixl_peer_t *p;
  static const char *const w[] = {"no common transport", "\"shm\"", "\"fabric\"",
                                  "HIXL_TRANSPORTS"};
  expect(hixl_connect(c, hixl_ctx_address(t), 5000, &p), HIXL_ERR_UNSUPPORTED, w, 4);
  hixl_ctx_destroy(t);
  hixl_ctx_destroy(c);
}

/* CAP_IPC_LOCK in this thread's effective set (left in the permitted one);
 * returns whether it was there before. */
static bool ipc_lock(bool on)
{
  struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct d[2];
  memset(d, 0, sizeof(d));
  assert_int_equal(syscall(SYS_capget, &h, d), 0);
  int i = CAP_TO_INDEX(CAP_IPC_LOCK);
  unsigned m = CAP_TO_MASK(CAP_IPC_LOCK);
  bool was = d[i].effective & m;
  if (on && !(d[i].permitted & m))
    return was;
  d[i].effective = on ? d[i].effective | m : d[i].effective & ~m;
  assert_int_equal(syscall(SYS_capset, &h, d), 0);
  return was;
}

/* The registration hint (verbs' ibv_reg_mr ENOMEM; the real failure is
 * tested in the rxe guest, conformance verbs memlock): the limit, what is
 * pinned, what is needed and every usual fix; or, where the limit does not
 * apply, that it does not and what else to look at. */
static void memlock(void **state)
{
  (void)state;
  struct rlimit old, low;
  assert_int_equal(getrlimit(RLIMIT_MEMLOCK, &old), 0);
  low = old;
  low.rlim_cur = old.rlim_max < (8u << 20) ? old.rlim_max : (8u << 20);
  assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &low), 0);
  bool had = ipc_lock(false);
  char buf[640], lim[64];
  hixl__memlock_hint(buf, sizeof(buf), 64u << 20);
  snprintf(lim, sizeof(lim), "RLIMIT_MEMLOCK is %llu KiB", (unsigned long long)low.rlim_cur / 1024);
  const char *w[] = {lim,
                     "VmPin",
                     "VmLck",
                     "needs 65536 KiB more",
                     "ulimit -l unlimited",
                     "/etc/security/limits.conf",
                     "LimitMEMLOCK=infinity",
                     "--ulimit memlock=-1",
                     "CAP_IPC_LOCK"};
  for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
    if (strstr(buf, w[i]) == NULL)
      fail_msg("the memlock hint does not say \"%s\": %s", w[i], buf);
  if (had) { /* root: with CAP_IPC_LOCK back, the limit does not apply */
    ipc_lock(true);
    hixl__memlock_hint(buf, sizeof(buf), 64u << 20);
    if (strstr(buf, "does not limit this process (it has CAP_IPC_LOCK)") == NULL ||
        strstr(buf, "max_mr") == NULL)
      fail_msg("with CAP_IPC_LOCK: %s", buf);
  }
  /* In a user namespace of its own a process holds every capability, but
   * only there: the kernel's pinning check wants CAP_IPC_LOCK in the
   * initial one (rootless containers).  A child, so that we stay here. */
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWUSER) != 0) {
      printf("memlock: user namespaces not available here (%s): not checked\n", strerror(errno));
      _exit(0);
    }
    hixl__memlock_hint(buf, sizeof(buf), 64u << 20);
    _exit(strstr(buf, lim) && strstr(buf, "only inside a user namespace") ? 0 : 1);
  }
  int ws = 0;
  assert_int_equal(waitpid(pid, &ws, 0), pid);
  if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    fail_msg("in a user namespace, the hint does not say its CAP_IPC_LOCK does not count");
  assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &old), 0);
  if (old.rlim_max == RLIM_INFINITY) {
    struct rlimit inf = {RLIM_INFINITY, RLIM_INFINITY};
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &inf), 0);
    ipc_lock(false);
    hixl__memlock_hint(buf, sizeof(buf), 64u << 20);
    ipc_lock(true);
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &old), 0);
    if (strstr(buf, "does not limit this process (unlimited)") == NULL)
      fail_msg("unlimited: %s", buf);
  }
}

int main(void)
{
  const struct CMUnitTest tests[] = {cmocka_unit_test(refused), cmocka_unit_test(timeout),
                                     cmocka_unit_test(auth), cmocka_unit_test(transport),
                                     cmocka_unit_test(memlock)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

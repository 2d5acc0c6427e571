/* SPDX-License-Identifier: MIT */
/* A waiter whose futex_waitv starts failing (docs/waiting.md): a seccomp
 * filter installed after the library probed the call, as a container
 * runtime or a sandboxing library may, makes every futex_waitv return
 * ENOSYS at once.  The wait must go back to poll() for good -- sleep, and
 * still wake on its event -- not loop on the error at 100% of a core.
 * Also, with the filter there from the start (a fresh process), the probe
 * must see it and never try words. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include <hixl.h>
#include "../common/usage.h"

#ifdef SYS_futex_waitv

/* The cases run in children (a seccomp filter cannot be taken back),
 * where cmocka's asserts would unwind into a copy of the runner: a child
 * says what failed and exits 1. */
#define CHILD_CHECK(cond, ...)                                                                     \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "test_seccomp_wait: " __VA_ARGS__);                                          \
      fprintf(stderr, "\n");                                                                       \
      _exit(1);                                                                                    \
    }                                                                                              \
  } while (0)

static void deny_futex_waitv(void)
{
  struct sock_filter f[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
#if defined(__x86_64__)
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
#elif defined(__aarch64__)
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_AARCH64, 1, 0),
#else
    BPF_JUMP(BPF_JMP | BPF_JA, 0, 0, 0),
#endif
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_futex_waitv, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
  CHILD_CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "PR_SET_NO_NEW_PRIVS: %s",
              strerror(errno));
  /* TSYNC: every thread, the library's included. */
  CHILD_CHECK(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) == 0,
              "seccomp: %s", strerror(errno));
  errno = 0;
  CHILD_CHECK(syscall(SYS_futex_waitv, NULL, 0, 0, NULL, 0) < 0 && errno == ENOSYS,
              "the filter does not deny futex_waitv");
}

typedef struct {
  hixl_peer_t *peer;
} notifier_t;

static void *notify_later(void *arg)
{
  notifier_t *n = arg;
  usleep(1500000);
  hixl_notify(n->peer, 42, 0, NULL);
  return NULL;
}

/* One context talking to itself (self): the waiter sleeps, a thread of
 * ours notifies 1.5 s later; the wait must sleep and wake. */
static void sleep_and_wake(bool deny_after_probe)
{
  hixl_ctx_t *ctx;
  CHILD_CHECK(unit_create(NULL, 0, NULL, &ctx) == HIXL_OK, "ctx: %s", hixl_last_error());
  hixl_peer_t *peer;
  CHILD_CHECK(hixl_connect(ctx, hixl_ctx_address(ctx), 10000, &peer) == HIXL_OK, "connect: %s",
              hixl_last_error());
  hixl_notif_t n;
  if (deny_after_probe) {
    /* A first sleep probes futex_waitv (and finds it), then the filter. */
    CHILD_CHECK(hixl_notif_wait(ctx, &n, 100) == HIXL_ERR_TIMEOUT, "a notification from nowhere");
    deny_futex_waitv();
  }
  notifier_t nt = {peer};
  pthread_t th;
  CHILD_CHECK(pthread_create(&th, NULL, notify_later, &nt) == 0, "pthread_create");
  long long c0 = cpu_us(), w0 = wall_us();
  hixl_status_t st = hixl_notif_wait(ctx, &n, 20000);
  long long c1 = cpu_us(), w1 = wall_us();
  pthread_join(th, NULL);
  CHILD_CHECK(st == HIXL_OK, "the waiter did not wake: %s", hixl_last_error());
  CHILD_CHECK(n.imm == 42, "notification %u, expected 42", n.imm);
  printf("# futex_waitv denied %s: the wait took %lld us of CPU in %lld us\n",
         deny_after_probe ? "after the probe" : "from the start", c1 - c0, w1 - w0);
  fflush(stdout);
  CHILD_CHECK((c1 - c0) * 10 <= w1 - w0, "the waiter did not sleep: %lld us of CPU in %lld us",
              c1 - c0, w1 - w0);
  hixl_disconnect(peer);
  hixl_ctx_destroy(ctx);
}

/* Each case in a child: a seccomp filter cannot be taken back. */
static void in_child(bool deny_after_probe)
{
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (!deny_after_probe)
      deny_futex_waitv();
    sleep_and_wake(deny_after_probe);
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg("the child failed (status %d)", status);
}

static void test_denied_after_probe(void **state)
{
  (void)state;
  in_child(true);
}

static void test_denied_from_start(void **state)
{
  (void)state;
  in_child(false);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_denied_after_probe),
      cmocka_unit_test(test_denied_from_start),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#else
int main(void)
{
  fprintf(stderr, "test_seccomp_wait: this system's headers have no futex_waitv\n");
  return 77; /* meson: skipped, and reported as such */
}
#endif

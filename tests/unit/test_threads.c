/* SPDX-License-Identifier: MIT */
/* The library's own threads take none of the application's signals
 * (hixl__thread_start): every thread of the process but the test's own --
 * control threads, the progress thread, shm's CMA helpers, fabric's
 * progress thread where fabric is built -- has SIGINT, SIGTERM, SIGCHLD,
 * SIGUSR1 and SIGALRM blocked (a handler run there could take a lock that
 * thread holds), and none of the faults (SIGSEGV, SIGBUS, SIGFPE: the
 * application's handler still sees a crash), while the test's thread
 * blocks nothing; and each is named "hixl-..." (top -H, gdb).  Read from
 * /proc/self/task/TID/status (SigBlk) and comm.  The library's threads are
 * those that were not there when the test began (a sanitizer runs one of
 * its own, started with the process's first other thread). */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "core.h"

/* TID's blocked-signal mask; its name in *comm. */
static uint64_t sigblk(const char *tid, char *comm, size_t cap)
{
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/self/task/%s/comm", tid);
  FILE *f = fopen(path, "r");
  comm[0] = 0;
  if (f && fgets(comm, (int)cap, f))
    comm[strcspn(comm, "\n")] = 0;
  if (f)
    fclose(f);
  snprintf(path, sizeof(path), "/proc/self/task/%s/status", tid);
  f = fopen(path, "r");
  assert_non_null(f);
  uint64_t m = 0;
  bool found = false;
  while (fgets(line, sizeof(line), f))
    if (strncmp(line, "SigBlk:", 7) == 0)
      found = sscanf(line + 7, "%lx", &m) == 1;
  fclose(f);
  assert_true(found);
  return m;
}

#define BIT(s) (1ull << ((s)-1))

/* The threads there are now (the test's own, and a sanitizer's background
 * thread under TSan): not the library's. */
static int before[64], n_before;

static bool existed(int tid)
{
  for (int i = 0; i < n_before; i++)
    if (before[i] == tid)
      return true;
  return false;
}

static void *nothing(void *arg) { return arg; }

static void note_threads(void)
{
  /* A sanitizer starts its own thread at the first pthread_create: have
   * that happen now, before the list is taken. */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, nothing, NULL), 0);
  pthread_join(t, NULL);
  DIR *d = opendir("/proc/self/task");
  assert_non_null(d);
  for (struct dirent *e; (e = readdir(d)) && n_before < 64;)
    if (e->d_name[0] != '.')
      before[n_before++] = atoi(e->d_name);
  closedir(d);
}

static void test_library_threads_block_signals(void **state)
{
  (void)state;
  note_threads();
  setenv("HIXL_LAZY", "0", 1); /* fabric (where built) starts its thread now */
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.progress_thread = 1;
  hixl_ctx_t *a, *b;
  assert_int_equal(hixl_ctx_create(&cfg, &a), HIXL_OK);
  cfg.progress_thread = 0;
  assert_int_equal(hixl_ctx_create(&cfg, &b), HIXL_OK);
  unsetenv("HIXL_LAZY");
  /* An 8 MiB put from an unregistered buffer over shm: where CMA works,
   * its helpers start (it may not: Yama, seccomp). */
  hixl_peer_t *p;
  hixl_rmr_t *rmr;
  hixl_mr_t *mr;
  void *dst;
  const size_t len = 8u << 20;
  assert_int_equal(hixl_mem_alloc(b, len, HIXL_MEM_HOST, HIXL_ACCESS_WRITE, &dst, &mr), HIXL_OK);
  assert_int_equal(hixl_mr_publish(mr, "dst"), HIXL_OK);
  assert_int_equal(hixl_connect(a, hixl_ctx_address(b), 10000, &p), HIXL_OK);
  assert_int_equal(hixl_rmr_lookup(p, "dst", 10000, &rmr), HIXL_OK);
  char *src = malloc(len);
  assert_non_null(src);
  memset(src, 7, len);
  assert_int_equal(hixl_put(p, src, len, rmr, 0, 0, NULL), HIXL_OK);
  assert_int_equal(hixl_fence(a, p, 30000), HIXL_OK);
  const uint64_t want = BIT(SIGINT) | BIT(SIGTERM) | BIT(SIGCHLD) | BIT(SIGUSR1) | BIT(SIGALRM);
  const uint64_t faults = BIT(SIGSEGV) | BIT(SIGBUS) | BIT(SIGFPE) | BIT(SIGILL);
  char self[32], comm[64];
  snprintf(self, sizeof(self), "%d", (int)gettid());
  DIR *d = opendir("/proc/self/task");
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.')
      continue;
    uint64_t m = sigblk(e->d_name, comm, sizeof(comm));
    if (strcmp(e->d_name, self) == 0) {
      assert_int_equal(m & (want | faults), 0); /* ours: untouched */
      continue;
    }
    if (existed(atoi(e->d_name))) {
      print_message("thread %s (%s): there before the test, not the library's\n", e->d_name, comm);
      continue;
    }
    n++;
    if (strncmp(comm, "hixl-", 5) != 0)
      fail_msg("thread %s is named %s: the library names its threads hixl-...", e->d_name, comm);
    print_message("thread %s (%s): SigBlk %016llx\n", e->d_name, comm, (unsigned long long)m);
    if ((m & want) != want || (m & faults) != 0)
      fail_msg("thread %s (%s) blocks %016llx: want SIGINT, SIGTERM, SIGCHLD, SIGUSR1, "
               "SIGALRM blocked and no fault signal",
               e->d_name, comm, (unsigned long long)m);
  }
  closedir(d);
  assert_true(n >= 3); /* two control threads and a progress thread at least */
  free(src);
  hixl_rmr_release(rmr);
  hixl_disconnect(p);
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(a);
  hixl_ctx_destroy(b);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_library_threads_block_signals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

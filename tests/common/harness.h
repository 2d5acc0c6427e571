/* SPDX-License-Identifier: MIT */
/*
 * Test harness shared by the conformance suite, the bad-input matrix and the
 * peer-death test.  Written once, run per transport:
 *
 *  - "self": the target runs in a thread of the test process, on the same
 *    context, so every peer the test makes to it is a self peer;
 *  - "shm":  the target is a forked process with its own context.
 *
 * The target creates a fixed set of regions (below; HIXL_TEST_REGIONS=heap
 * makes every host one malloc + hixl_mr_reg, so that shm reaches them all
 * with CMA or, without it, through the owner's copies), publishes them by name,
 * and then serves line commands on a pipe (hash a range, refill, collect and
 * check notifications, deregister...): it never calls a hixl data operation,
 * which is the point.  Checking the target's own view of its memory (not
 * only a get back) is what makes put/get tests non-circular.
 */
#ifndef HIXL_TEST_HARNESS_H
#define HIXL_TEST_HARNESS_H

#include <hixl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cases.h"

/* Regions every target has. */
#define BIG_LEN ((size_t)72 << 20) /* alloc / reg: room for 64 MiB at odd offsets */
#define SMALL_LEN ((size_t)1 << 20)
#define CTR_LEN 4096

typedef struct target {
  const char *transport;
  char addr[128];
  pid_t pid; /* shm: the target process */
  int cmd_fd, resp_fd;
  void *thread;    /* self: the target thread */
  hixl_ctx_t *ctx; /* self: the shared context */
} target_t;

extern const char *g_transport; /* "self" or "shm" */

/* Die with a message (tests use cmocka in the parent; helpers and children
 * report through exit codes). */
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* A configuration for the test side: the defaults, listening where a test's
 * contexts listen (HIXL_TEST_LISTEN across hosts, else 127.0.0.1:0). */
void test_config(hixl_config_t *cfg);
/* Context for the test side.  timeout_ms 0: the default. */
hixl_ctx_t *test_ctx(int timeout_ms, const char *token);
/* One of ctx's figures (hixl_ctx_stats) in *value; false when it has none
 * of that name. */
bool ctx_figure(hixl_ctx_t *ctx, const char *name, uint64_t *value);
/* malloc that dies when there is no memory (n 0: one byte). */
void *xmalloc(size_t n);

/* Call first in main(): in an exec'd target process it serves and exits. */
void harness_init(int argc, char **argv);

/* Start a target.  For self, ctx is the test's context (the target shares
 * it); for shm, ctx is ignored.  token: auth token for the target, or NULL. */
void target_start(target_t *t, hixl_ctx_t *ctx, const char *token, int timeout_ms);
/* Send a command, read the one-line reply into resp; returns true if the
 * reply starts with "ok". */
bool target_cmd(target_t *t, char *resp, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Send without waiting (pair with target_reply). */
void target_send(target_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool target_reply(target_t *t, char *resp, size_t cap);
uint64_t target_hash(target_t *t, const char *region, uint64_t off, uint64_t len);
void target_stop(target_t *t);

/* Connect to the target and look up a region (dies on failure). */
hixl_peer_t *connect_to(hixl_ctx_t *ctx, const target_t *t);
hixl_rmr_t *lookup(hixl_peer_t *peer, const char *name);

/* How most cases start: a context of the test's (timeout_ms 0: the
 * default), a target (target_timeout_ms for its own context, as for
 * target_start) and one peer connected to it. */
typedef struct session {
  hixl_ctx_t *ctx;
  target_t t;
  hixl_peer_t *peer;
} session_t;
void session_open(session_t *s, int timeout_ms, int target_timeout_ms);
/* Disconnect the peer, stop the target, destroy the context. */
void session_close(session_t *s);

/* Deterministic data and a fast hash (the target uses the same). */
void fill_pattern(void *buf, size_t len, uint64_t seed);
uint64_t hash_bytes(const void *buf, size_t len);

/* Child processes for multi-process cases: run fn(arg, index) in n forked
 * children; returns the number that did not exit 0.  Fork only from a
 * process without hixl threads (no context yet): see target_start. */
int run_children(int n, int (*fn)(void *arg, int index), void *arg);
/* Same as threads (for self, where a peer must be in-process). */
int run_threads(int n, int (*fn)(void *arg, int index), void *arg);
/* Processes for shm, threads for self. */
int run_workers(int n, int (*fn)(void *arg, int index), void *arg);

#define EXPECT_ST(expected, call)                                                                  \
  do {                                                                                             \
    hixl_status_t st__ = (call);                                                                   \
    if (st__ != (expected))                                                                        \
      die("%s:%d: %s returned %s, expected %s (%s)", __FILE__, __LINE__, #call,                    \
          hixl_strerror(st__), hixl_strerror(expected), hixl_last_error());                        \
  } while (0)
#define EXPECT_OK(call) EXPECT_ST(HIXL_OK, call)

#ifdef cmocka_unit_test /* a program that includes cmocka.h first */
/* main()'s dispatch for a program run as PROG TRANSPORT CASE (conformance,
 * device), after harness_init: --list and --check (cases.h); else the case
 * named, as a cmocka group named after the transport; any other command
 * line gets the usage, naming the cases, and exit status 2. */
static inline int harness_main(int argc, char **argv, const struct CMUnitTest *tests, size_t n)
{
  struct cases c = {tests, n, sizeof(*tests)};
  cases_options(c, argc, argv);
  if (argc != 3) {
    fprintf(stderr, "usage: %s self|shm|fabric|verbs CASE; cases: ", argv[0]);
    cases_print(stderr, c);
    fprintf(stderr, "\n");
    return 2;
  }
  g_transport = argv[1];
  return cases_run_cmocka(argv[1], tests, n, argv[2], NULL, NULL);
}
#endif

#endif

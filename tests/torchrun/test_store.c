/* SPDX-License-Identifier: MIT */
/*
 * The TCPStore client (src/core/store.c) against a real
 * torch.distributed.TCPStore served by Debian's Python (torch 1.13 here:
 * the legacy dialect), against fakes of the later VALIDATE dialect written
 * from torch's sources (tests/torchrun/store_server.py), and against bad
 * servers: garbage, silence, a closed door, absurd answers.  Each must end
 * in a clear error naming the store, within its deadline.
 *
 *   test_store PYTHON STORE_SERVER_PY     (exit 77 when PYTHON has no torch)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core.h"
#include "store.h"

static const char *g_python, *g_script;

/* ------------------------------------------------------------ a Python server */

typedef struct {
  pid_t pid;
  FILE *in, *out;
  char port[16];
} pyserver_t;

static void py_start(pyserver_t *p, const char *mode)
{
  int to[2], from[2];
  assert_int_equal(pipe(to), 0);
  assert_int_equal(pipe(from), 0);
  p->pid = fork();
  assert_true(p->pid >= 0);
  if (p->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    execl(g_python, g_python, g_script, mode, (char *)NULL);
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  p->in = fdopen(to[1], "w");
  p->out = fdopen(from[0], "r");
  char line[64];
  assert_non_null(fgets(line, sizeof(line), p->out));
  assert_int_equal(sscanf(line, "PORT %15s", p->port), 1);
}

/* One command, one line back (without the newline). */
static char *__attribute__((format(printf, 4, 5)))
py_cmd(pyserver_t *p, char *buf, size_t cap, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->in, fmt, ap);
  va_end(ap);
  fputc('\n', p->in);
  fflush(p->in);
  assert_non_null(fgets(buf, (int)cap, p->out));
  buf[strcspn(buf, "\n")] = 0;
  return buf;
}

static void py_stop(pyserver_t *p)
{
  fclose(p->in);
  int status;
  waitpid(p->pid, &status, 0);
  fclose(p->out);
}

static double now_s(void) { return (double)hixl__now_ns() / 1e9; }

static hixl_store_t *open_store(const char *port, int dialect, int timeout_ms)
{
  hixl_store_t *s = NULL;
  hixl_status_t st =
      hixl__store_connect("127.0.0.1", port, dialect, hixl__deadline(timeout_ms), &s);
  if (st != HIXL_OK)
    fail_msg("connect to 127.0.0.1:%s: %s (%s)", port, hixl_strerror(st), hixl_last_error());
  return s;
}

/* The last error names the store at 127.0.0.1:port and says what. */
static void error_says(const char *port, const char *what)
{
  char name[64];
  snprintf(name, sizeof(name), "127.0.0.1:%s", port);
  const char *e = hixl_last_error();
  if (strstr(e, name) == NULL || strstr(e, what) == NULL)
    fail_msg("error \"%s\" should name %s and say \"%s\"", e, name, what);
}

/* ------------------------------------------------------------ the real store */

/* Set, get, add, wait, check: both ways with torch's own client. */
static void ops_roundtrip(pyserver_t *py, hixl_store_t *s)
{
  char b[256];
  int64_t dl = hixl__deadline(10000);
  assert_int_equal(hixl__store_set(s, "t/a", "hello", 5, dl), HIXL_OK);
  assert_string_equal(py_cmd(py, b, sizeof(b), "get t/a"), "hello");
  py_cmd(py, b, sizeof(b), "set t/b world");
  size_t len = 0;
  assert_int_equal(hixl__store_get(s, "t/b", b, sizeof(b), &len, dl), HIXL_OK);
  assert_int_equal(len, 5);
  assert_memory_equal(b, "world", 5);
  /* An empty value. */
  assert_int_equal(hixl__store_set(s, "t/empty", "", 0, dl), HIXL_OK);
  assert_int_equal(hixl__store_get(s, "t/empty", b, sizeof(b), &len, dl), HIXL_OK);
  assert_int_equal(len, 0);

  int64_t v = 0;
  assert_int_equal(hixl__store_add(s, "t/n", 5, &v, dl), HIXL_OK);
  assert_int_equal(v, 5);
  assert_string_equal(py_cmd(py, b, sizeof(b), "add t/n 2"), "7");
  assert_int_equal(hixl__store_add(s, "t/n", -10, &v, dl), HIXL_OK);
  assert_int_equal(v, -3);
  assert_int_equal(hixl__store_add(s, "t/n", 0, &v, dl), HIXL_OK);
  assert_int_equal(v, -3);

  bool ready = true;
  const char *keys[] = {"t/a", "t/b", "t/missing"};
  assert_int_equal(hixl__store_check(s, keys, 2, &ready, dl), HIXL_OK);
  assert_true(ready);
  assert_int_equal(hixl__store_check(s, keys, 3, &ready, dl), HIXL_OK);
  assert_false(ready);

  /* A wait that the other side ends 300 ms later. */
  py_cmd(py, b, sizeof(b), "later 0.3 t/late x");
  double t0 = now_s();
  const char *late[] = {"t/a", "t/late"};
  assert_int_equal(hixl__store_wait(s, late, 2, hixl__deadline(10000)), HIXL_OK);
  double dt = now_s() - t0;
  assert_true(dt > 0.2 && dt < 9);
  assert_int_equal(hixl__store_get(s, "t/late", b, sizeof(b), &len, dl), HIXL_OK);
  assert_int_equal(len, 1);
}

static void test_torch_ops(void **state)
{
  (void)state;
  pyserver_t py;
  py_start(&py, "torch");
  hixl_store_t *s = open_store(py.port, HIXL_STORE_AUTO, 10000);
  assert_int_equal(hixl__store_dialect(s), HIXL_STORE_LEGACY);
  ops_roundtrip(&py, s);
  hixl__store_close(s);
  /* The dialect forced. */
  s = open_store(py.port, HIXL_STORE_LEGACY, 10000);
  char b[64];
  size_t len;
  assert_int_equal(hixl__store_get(s, "t/a", b, sizeof(b), &len, hixl__deadline(5000)), HIXL_OK);
  assert_int_equal(len, 5);
  hixl__store_close(s);
  py_stop(&py);
}

/* A wait that nobody ends: TIMEOUT at the deadline, naming the store; the
 * next call works (on a new connection). */
static void test_torch_wait_timeout(void **state)
{
  (void)state;
  pyserver_t py;
  py_start(&py, "torch");
  hixl_store_t *s = open_store(py.port, HIXL_STORE_AUTO, 10000);
  const char *k = "t/never";
  double t0 = now_s();
  assert_int_equal(hixl__store_wait(s, &k, 1, hixl__deadline(400)), HIXL_ERR_TIMEOUT);
  double dt = now_s() - t0;
  assert_true(dt > 0.3 && dt < 5);
  error_says(py.port, "within the timeout");
  char b[64];
  size_t len = 0;
  assert_int_equal(hixl__store_get(s, k, b, sizeof(b), &len, hixl__deadline(300)),
                   HIXL_ERR_TIMEOUT);
  assert_int_equal(hixl__store_set(s, "t/after", "1", 1, hixl__deadline(5000)), HIXL_OK);
  assert_int_equal(hixl__store_get(s, "t/after", b, sizeof(b), &len, hixl__deadline(5000)),
                   HIXL_OK);
  assert_string_equal(py_cmd(&py, b, sizeof(b), "get t/after"), "1");
  hixl__store_close(s);
  py_stop(&py);
}

/* A value longer than the caller can take: an error, nothing kept. */
static void test_torch_value_too_long(void **state)
{
  (void)state;
  pyserver_t py;
  py_start(&py, "torch");
  char big[1001], b[128];
  memset(big, 'x', 1000);
  big[1000] = 0;
  py_cmd(&py, b, sizeof(b), "set t/big %s", big);
  hixl_store_t *s = open_store(py.port, HIXL_STORE_AUTO, 10000);
  size_t len = 0;
  assert_int_equal(hixl__store_get(s, "t/big", b, 100, &len, hixl__deadline(5000)),
                   HIXL_ERR_TRANSPORT);
  error_says(py.port, "1000 bytes, more than the 100 expected");
  assert_int_equal(hixl__store_get(s, "t/big", big, sizeof(big), &len, hixl__deadline(5000)),
                   HIXL_OK);
  assert_int_equal(len, 1000);
  /* Keys are checked here. */
  assert_int_equal(hixl__store_set(s, "", "1", 1, hixl__deadline(1000)), HIXL_ERR_INVALID);
  char longkey[HIXL_STORE_KEY_MAX + 2];
  memset(longkey, 'k', sizeof(longkey) - 1);
  longkey[sizeof(longkey) - 1] = 0;
  assert_int_equal(hixl__store_set(s, longkey, "1", 1, hixl__deadline(1000)), HIXL_ERR_INVALID);
  hixl__store_close(s);
  py_stop(&py);
}

/* The VALIDATE dialect forced on a legacy server: the hello is never
 * answered, so nothing follows it; a clear TIMEOUT, and the server, which
 * read it as the start of a SET, serves everyone again once it is gone. */
static void test_torch_forced_validate(void **state)
{
  (void)state;
  pyserver_t py;
  py_start(&py, "torch");
  hixl_store_t *s = NULL;
  assert_int_equal(
      hixl__store_connect("127.0.0.1", py.port, HIXL_STORE_VALIDATE, hixl__deadline(700), &s),
      HIXL_ERR_TIMEOUT);
  error_says(py.port, "no answer to the VALIDATE hello");
  char b[64];
  py_cmd(&py, b, sizeof(b), "set t/alive yes");
  assert_string_equal(py_cmd(&py, b, sizeof(b), "get t/alive"), "yes");
  s = open_store(py.port, HIXL_STORE_AUTO, 10000);
  size_t len;
  assert_int_equal(hixl__store_get(s, "t/alive", b, sizeof(b), &len, hixl__deadline(5000)),
                   HIXL_OK);
  hixl__store_close(s);
  py_stop(&py);
}

/* ------------------------------------------------------------ the later dialect */

static void validate_fake(const char *mode)
{
  pyserver_t py;
  py_start(&py, mode);
  hixl_store_t *s = open_store(py.port, HIXL_STORE_AUTO, 10000);
  assert_int_equal(hixl__store_dialect(s), HIXL_STORE_VALIDATE);
  ops_roundtrip(&py, s);
  /* After a timeout the connection is made again, hello and all. */
  const char *k = "t/never";
  assert_int_equal(hixl__store_wait(s, &k, 1, hixl__deadline(300)), HIXL_ERR_TIMEOUT);
  char b[64];
  size_t len;
  assert_int_equal(hixl__store_get(s, "t/a", b, sizeof(b), &len, hixl__deadline(5000)), HIXL_OK);
  hixl__store_close(s);
  s = open_store(py.port, HIXL_STORE_VALIDATE, 10000);
  assert_int_equal(hixl__store_get(s, "t/b", b, sizeof(b), &len, hixl__deadline(5000)), HIXL_OK);
  hixl__store_close(s);
  py_stop(&py);
}

static void test_validate_classic(void **state)
{
  (void)state;
  validate_fake("validate-classic");
}

static void test_validate_libuv(void **state)
{
  (void)state;
  validate_fake("validate-libuv");
}

/* ------------------------------------------------------------ bad servers */

enum bad { GARBAGE, SILENT, CLOSER, HUGE_COUNT, BAD_WAIT, HUGE_VALUE };

typedef struct {
  enum bad kind;
  int lfd;
  _Atomic int cfd; /* the connection being served, -1: none */
  char port[16];
  pthread_t th;
} badserver_t;

static void drain(int fd, size_t n)
{
  char b[256];
  while (n) {
    ssize_t k = read(fd, b, n < sizeof(b) ? n : sizeof(b));
    if (k <= 0)
      return;
    n -= (size_t)k;
  }
}

static void *bad_serve(void *arg)
{
  badserver_t *b = arg;
  for (;;) {
    int fd = accept(b->lfd, NULL, NULL);
    if (fd < 0)
      return NULL;
    b->cfd = fd;
    uint8_t out[4096];
    switch (b->kind) {
    case GARBAGE: /* talks first, and nonsense */
      for (size_t i = 0; i < sizeof(out); i++)
        out[i] = (uint8_t)(i * 131 + 7);
      (void)!write(fd, out, sizeof(out));
      drain(fd, 1 << 20);
      break;
    case SILENT: drain(fd, 1 << 20); break;
    case CLOSER: break;
    case HUGE_COUNT: /* answers the probe with 2^64 - 1 keys */
      drain(fd, 1);
      memset(out, 0xff, 8);
      (void)!write(fd, out, 8);
      drain(fd, 1 << 20);
      break;
    case BAD_WAIT:   /* a good probe answer, then 7 to a wait */
    case HUGE_VALUE: /* ... then a value of 2^62 bytes to a get */
      drain(fd, 1);
      memset(out, 0, 8);
      (void)!write(fd, out, 8);
      {
        uint8_t q[256];
        ssize_t k = read(fd, q, sizeof(q)); /* the wait, one send */
        if (k > 0) {
          out[0] = b->kind == BAD_WAIT ? 7 : 0;
          (void)!write(fd, out, 1);
        }
        if (b->kind == HUGE_VALUE && read(fd, q, sizeof(q)) > 0) { /* the get */
          uint64_t n = 1ull << 62;
          (void)!write(fd, &n, 8);
        }
      }
      drain(fd, 1 << 20);
      break;
    }
    b->cfd = -1;
    close(fd);
  }
}

static void bad_start(badserver_t *b, enum bad kind)
{
  b->kind = kind;
  b->cfd = -1;
  b->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  assert_int_equal(bind(b->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(b->lfd, 16), 0);
  assert_int_equal(getsockname(b->lfd, (struct sockaddr *)&a, &al), 0);
  snprintf(b->port, sizeof(b->port), "%d", ntohs(a.sin_port));
  assert_int_equal(pthread_create(&b->th, NULL, bad_serve, b), 0);
}

/* Wake the server out of accept and out of a read, and let it end. */
static void bad_stop(badserver_t *b)
{
  shutdown(b->lfd, SHUT_RDWR);
  int fd = b->cfd;
  if (fd >= 0)
    shutdown(fd, SHUT_RDWR);
  pthread_join(b->th, NULL);
  close(b->lfd);
}

/* Connect (auto) to a bad server: status st within max_s seconds, and the
 * message names it and says what. */
static void bad_connect(enum bad kind, int timeout_ms, hixl_status_t want, double max_s,
                        const char *what)
{
  badserver_t b;
  bad_start(&b, kind);
  hixl_store_t *s = NULL;
  double t0 = now_s();
  hixl_status_t st =
      hixl__store_connect("127.0.0.1", b.port, HIXL_STORE_AUTO, hixl__deadline(timeout_ms), &s);
  double dt = now_s() - t0;
  if (st != want)
    fail_msg("bad server %d: %s (%s), want %s", kind, hixl_strerror(st), hixl_last_error(),
             hixl_strerror(want));
  assert_null(s);
  assert_true(dt < max_s);
  error_says(b.port, what);
  bad_stop(&b);
}

static void test_bad_garbage(void **state)
{
  (void)state;
  bad_connect(GARBAGE, 5000, HIXL_ERR_TRANSPORT, 4, "not a");
}

static void test_bad_silent(void **state)
{
  (void)state;
  double t0 = now_s();
  bad_connect(SILENT, 2000, HIXL_ERR_TIMEOUT, 6, "no answer to a protocol probe");
  assert_true(now_s() - t0 > 1.5);
}

static void test_bad_closer(void **state)
{
  (void)state;
  bad_connect(CLOSER, 5000, HIXL_ERR_PEER_LOST, 4, "closed the connection");
}

static void test_bad_huge_count(void **state)
{
  (void)state;
  bad_connect(HUGE_COUNT, 5000, HIXL_ERR_TRANSPORT, 4, "not a key count");
}

static void test_bad_replies(void **state)
{
  (void)state;
  badserver_t b;
  bad_start(&b, BAD_WAIT);
  hixl_store_t *s = open_store(b.port, HIXL_STORE_AUTO, 5000);
  const char *k = "x";
  assert_int_equal(hixl__store_wait(s, &k, 1, hixl__deadline(5000)), HIXL_ERR_TRANSPORT);
  error_says(b.port, "with 0x07");
  hixl__store_close(s);
  bad_stop(&b);

  bad_start(&b, HUGE_VALUE);
  s = open_store(b.port, HIXL_STORE_AUTO, 5000);
  char v[64];
  size_t len = 0;
  assert_int_equal(hixl__store_get(s, "x", v, sizeof(v), &len, hixl__deadline(5000)),
                   HIXL_ERR_TRANSPORT);
  error_says(b.port, "4611686018427387904 bytes, more than the 64 expected");
  hixl__store_close(s);
  bad_stop(&b);
}

/* Nobody listening: TIMEOUT at the deadline, saying why. */
static void test_unreachable(void **state)
{
  (void)state;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
  char port[16];
  snprintf(port, sizeof(port), "%d", ntohs(a.sin_port));
  hixl_store_t *s = NULL;
  double t0 = now_s();
  assert_int_equal(hixl__store_connect("127.0.0.1", port, HIXL_STORE_AUTO, hixl__deadline(500), &s),
                   HIXL_ERR_TIMEOUT);
  assert_true(now_s() - t0 < 4);
  error_says(port, "not reachable");
  close(fd);
  assert_int_equal(
      hixl__store_connect("no-such-host.invalid", "1", HIXL_STORE_AUTO, hixl__deadline(500), &s),
      HIXL_ERR_INVALID);
  assert_int_equal(hixl__store_dialect_parse("validate"), HIXL_STORE_VALIDATE);
  assert_int_equal(hixl__store_dialect_parse(NULL), HIXL_STORE_AUTO);
  assert_int_equal(hixl__store_dialect_parse("v2"), -1);
}

int main(int argc, char **argv)
{
  if (argc != 3) {
    fprintf(stderr, "usage: test_store PYTHON STORE_SERVER_PY\n");
    return 2;
  }
  g_python = argv[1];
  g_script = argv[2];
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "'%s' -c 'import torch.distributed' >/dev/null 2>&1", g_python);
  if (access(g_python, X_OK) != 0 || system(cmd) != 0) {
    printf("SKIP: %s cannot import torch.distributed\n", g_python);
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_torch_ops),
      cmocka_unit_test(test_torch_wait_timeout),
      cmocka_unit_test(test_torch_value_too_long),
      cmocka_unit_test(test_torch_forced_validate),
      cmocka_unit_test(test_validate_classic),
      cmocka_unit_test(test_validate_libuv),
      cmocka_unit_test(test_bad_garbage),
      cmocka_unit_test(test_bad_silent),
      cmocka_unit_test(test_bad_closer),
      cmocka_unit_test(test_bad_huge_count),
      cmocka_unit_test(test_bad_replies),
      cmocka_unit_test(test_unreachable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * What the hostile-peer programs (tests/hostile) share: failing with a
 * reason, contexts and published regions, patterned bytes, child processes
 * and the pipes to them, and a target served from a child on its stdin and
 * stdout.  Header only, like ../common/cases.h: some programs link libhixl
 * (hixl_dep), others the internal objects with symbols wrapped
 * (internal_dep, -Wl,--wrap=...), so everything here uses the public API
 * alone and is compiled into each program, where a wrapped symbol it calls
 * is wrapped too.  The one part that needs a wrap, the memfd capture, is
 * compiled only where asked for (HOSTILE_KEEP_MEMFDS).
 *
 * Include it first after #define _GNU_SOURCE (setresuid, strsignal).
 */
#ifndef HIXL_TEST_HOSTILE_H
#define HIXL_TEST_HOSTILE_H

#ifndef _GNU_SOURCE
#error "define _GNU_SOURCE before any include (hostile.h needs setresuid, strsignal)"
#endif

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <hixl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/cases.h"

/* Every program, and every child it forks, fails so: exit 1, the reason on
 * stderr. */
#define FAIL(...)                                                                                  \
  do {                                                                                             \
    fprintf(stderr, "FAIL: " __VA_ARGS__);                                                         \
    fputc('\n', stderr);                                                                           \
    exit(1);                                                                                       \
  } while (0)
/* A hixl call that must succeed. */
#define OK(x)                                                                                      \
  do {                                                                                             \
    hixl_status_t st_ = (x);                                                                       \
    if (st_ != HIXL_OK)                                                                            \
      FAIL("%s: %s (%s)", #x, hixl_strerror(st_), hixl_last_error());                              \
  } while (0)

static inline double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Byte i of the pattern the targets fill their regions with; a buffer
 * filled with pat(i + k), its own k, tells a stray write from another's. */
static inline uint8_t pat(size_t i) { return (uint8_t)(i * 131u + (i >> 12) + 7u); }

/* --- contexts and regions ------------------------------------------------ */

/* A context allowing transports.  token, listen: NULL keeps what
 * hixl_config_init took from the environment (HIXL_AUTH_TOKEN, HIXL_LISTEN),
 * as timeout_ms 0 keeps HIXL_TIMEOUT_MS or the default: a target that sets
 * those in its environment first gets them. */
static inline hixl_ctx_t *hostile_ctx(const char *transports, const char *token, const char *listen,
                                      int timeout_ms)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.transports = transports;
  if (token)
    cfg.auth_token = token;
  if (listen)
    cfg.listen = listen;
  if (timeout_ms > 0)
    cfg.timeout_ms = timeout_ms;
  hixl_ctx_t *ctx;
  OK(hixl_ctx_create(&cfg, &ctx));
  return ctx;
}

/* A target's 4 KiB region, read-write, published as name: what legitimate
 * peers put into while the attack goes on.  Returns its bytes. */
static inline void *publish_region(hixl_ctx_t *ctx, const char *name)
{
  void *p;
  hixl_mr_t *mr;
  if (hixl_mem_alloc(ctx, 4096, HIXL_MEM_HOST, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &p, &mr) !=
          HIXL_OK ||
      hixl_mr_publish(mr, name) != HIXL_OK)
    FAIL("target: %s", hixl_last_error());
  return p;
}

/* A len-byte hixl_mem_alloc region of ctx granting access, filled with
 * pat(i + k) (the target checks at the end that it still is) and, unless
 * name is NULL, published as name.  Its bytes; its mr in *mr_p. */
static inline uint8_t *pattern_region(hixl_ctx_t *ctx, size_t len, unsigned access, size_t k,
                                      const char *name, hixl_mr_t **mr_p)
{
  uint8_t *p;
  OK(hixl_mem_alloc(ctx, len, HIXL_MEM_HOST, access, (void **)&p, mr_p));
  for (size_t i = 0; i < len; i++)
    p[i] = pat(i + k);
  if (name)
    OK(hixl_mr_publish(*mr_p, name));
  return p;
}

/* Connect ctx to the target at addr and look up its region name, 10 s for
 * each: how a peer starts.  The region; the peer in *peer_p. */
static inline hixl_rmr_t *lookup_at(hixl_ctx_t *ctx, const char *addr, const char *name,
                                    hixl_peer_t **peer_p)
{
  hixl_rmr_t *r;
  OK(hixl_connect(ctx, addr, 10000, peer_p));
  OK(hixl_rmr_lookup(*peer_p, name, 10000, &r));
  return r;
}

/* Get 4 KiB of the target's "kv" (kv_len bytes of pat(i)) at the k-th of a
 * spread of offsets, and check every byte: the legitimate peer's read. */
static inline void check_get(hixl_ctx_t *ctx, hixl_peer_t *peer, hixl_rmr_t *kv, size_t kv_len,
                             size_t k)
{
  static uint8_t buf[4096];
  size_t off = (k * 4096 * 7) % kv_len;
  OK(hixl_get(peer, buf, sizeof(buf), kv, off, 0, NULL));
  OK(hixl_fence(ctx, peer, 10000));
  for (size_t i = 0; i < sizeof(buf); i++)
    if (buf[i] != pat(off + i))
      FAIL("legit peer: byte %zu of kv read %u, expected %u", off + i, buf[i], pat(off + i));
}

/* --- child processes and the pipes to them -------------------------------- */

/* fn in a child that dies with this process (it exits 0 when fn returns). */
static inline pid_t spawn(void (*fn)(void))
{
  pid_t pid = fork();
  if (pid < 0)
    FAIL("fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    fn();
    exit(0);
  }
  return pid;
}

/* Reap the child pid, called who.  limit_s is a hang guard, not a timing
 * assertion: past it the child is killed.  0 if it exited 0, else 1 with the
 * reason on stderr (the caller counts failures and still reaps the rest). */
static inline int wait_for(pid_t pid, const char *who, int limit_s)
{
  int ws;
  double end = now_s() + limit_s;
  for (;;) {
    pid_t r = waitpid(pid, &ws, WNOHANG);
    if (r == pid)
      break;
    if (now_s() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &ws, 0);
      fprintf(stderr, "FAIL: %s hung (killed after %d s)\n", who, limit_s);
      return 1;
    }
    usleep(10000);
  }
  if (WIFSIGNALED(ws)) {
    fprintf(stderr, "FAIL: %s died of signal %d (%s)\n", who, WTERMSIG(ws),
            strsignal(WTERMSIG(ws)));
    return 1;
  }
  if (WEXITSTATUS(ws) != 0) {
    fprintf(stderr, "FAIL: %s exited %d\n", who, WEXITSTATUS(ws));
    return 1;
  }
  return 0;
}

/* Become uid/gid 65534 (a forked child of a root parent only).  The change
 * of credentials clears dumpable, which would leave /proc/self/fd to root,
 * and the parent-death signal: both are set again. */
static inline void become_nobody(void)
{
  if (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 ||
      setresuid(65534, 65534, 65534) != 0)
    FAIL("cannot become uid %d: %s", 65534, strerror(errno));
  prctl(PR_SET_DUMPABLE, 1);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
}

/* One byte on a pipe: a signal between the processes of a case. */
static inline void put_byte(int fd, char c)
{
  if (write(fd, &c, 1) != 1)
    FAIL("write to a pipe: %s", strerror(errno));
}

/* Wait for a byte; a pipe closed means the other side died. */
static inline char get_byte(int fd)
{
  char c;
  ssize_t n;
  while ((n = read(fd, &c, 1)) < 0 && errno == EINTR)
    ;
  if (n != 1)
    FAIL("a pipe closed (the other side died)");
  return c;
}

/* A byte if one came, without waiting. */
static inline bool try_byte(int fd, char *c)
{
  fcntl(fd, F_SETFL, O_NONBLOCK);
  return read(fd, c, 1) == 1;
}

/* An address passed on a pipe, with its terminating 0. */
static inline void put_str(int fd, const char *s)
{
  if (s == NULL)
    FAIL("no address to pass on");
  if (write(fd, s, strlen(s) + 1) != (ssize_t)(strlen(s) + 1))
    FAIL("write to a pipe");
}

static inline void get_str(int fd, char *buf, size_t cap)
{
  size_t got = 0;
  while (got < cap) {
    ssize_t n = read(fd, buf + got, 1);
    if (n <= 0)
      FAIL("no address (the other side died)");
    if (buf[got++] == 0)
      return;
  }
  FAIL("address too long");
}

/* --- a target in a child process, on its stdin and stdout ------------------ */

/* Its own process gives the target its own limits and environment; the
 * parent reads its address, and what its "kv" holds, from its stdout. */
typedef struct piped_target {
  pid_t pid;
  FILE *in, *out; /* the target's stdin and stdout */
  char addr[128];
} piped_target_t;

/* Fork fn(arg) as the target (it dies with this process; it exits 0 when fn
 * returns) and read the address it prints first (serve_kv). */
static inline void piped_target_start(piped_target_t *t, void (*fn)(void *), void *arg)
{
  int to[2], from[2];
  if (pipe(to) || pipe(from))
    FAIL("pipe");
  t->pid = fork();
  if (t->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    fn(arg);
    exit(0);
  }
  close(to[0]);
  close(from[1]);
  t->in = fdopen(to[1], "w");
  t->out = fdopen(from[0], "r");
  if (!fgets(t->addr, sizeof(t->addr), t->out))
    FAIL("the target did not start");
  t->addr[strcspn(t->addr, "\n")] = 0;
}

/* In the target: publish a "kv" region of ctx, print ctx's address, then
 * for each line read print kv's first 16 bytes (so the parent sees what a
 * legitimate peer put there); returns when stdin closes. */
static inline void serve_kv(hixl_ctx_t *ctx)
{
  const char *kv = publish_region(ctx, "kv");
  printf("%s\n", hixl_ctx_address(ctx));
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof(line), stdin)) {
    printf("%.16s\n", kv);
    fflush(stdout);
  }
}

/* The first bytes of the target's kv, as the target itself sees them, into
 * line; false if the target is gone. */
static inline bool piped_target_peek(piped_target_t *t, char *line, int cap)
{
  fprintf(t->in, "peek\n");
  fflush(t->in);
  return fgets(line, cap, t->out) != NULL;
}

/* Close the target's stdin (serve_kv returns), reap it; its wait status. */
static inline int piped_target_stop(piped_target_t *t)
{
  fclose(t->in);
  int st = 0;
  waitpid(t->pid, &st, 0);
  fclose(t->out);
  return st;
}

/* --- cases ------------------------------------------------------------------ */

/* For a program that must be given a case: "usage: PROG ARGS; cases: a, b"
 * on stderr; returns 2, its exit status. */
static inline int hostile_usage(struct cases c, const char *prog, const char *args)
{
  fprintf(stderr, "usage: %s %s; cases: ", prog, args);
  cases_print(stderr, c);
  fprintf(stderr, "\n");
  return 2;
}

/* --- the attacker's memfd capture ------------------------------------------- */
#ifdef HOSTILE_KEEP_MEMFDS
/* For programs linked with -Wl,--wrap=close: the attacker is the library
 * itself, which closes every memfd it is handed once mapped; while
 * g_capture is set, a copy of each (the region table, inboxes, regions) is
 * kept in g_kept for the attack. */
int __real_close(int fd);
int __wrap_close(int fd);
static int g_kept[64];
static int g_nkept;
static int g_capture;

/* What fd is, as /proc/self/fd shows it ("" if it cannot be read). */
static inline const char *fd_name(int fd, char *buf, size_t cap)
{
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, buf, cap - 1);
  buf[n > 0 ? n : 0] = 0;
  return buf;
}

int __wrap_close(int fd)
{
  char link[256];
  if (g_capture && fd >= 0 && g_nkept < 64 &&
      strncmp(fd_name(fd, link, sizeof(link)), "/memfd:hixl-", 12) == 0) {
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 100);
    if (d >= 0)
      g_kept[g_nkept++] = d;
  }
  return __real_close(fd);
}
#endif

#endif

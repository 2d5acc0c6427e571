/* SPDX-License-Identifier: MIT */
/*
 * control_flood: attacks on the control port by processes that never
 * authenticate (issue 13, finding 9):
 *
 *   slowloris   connections that trickle a valid HELLO one byte every
 *               100 ms: each must be closed by the target within its
 *               handshake deadline (it ran from the last byte, so they were
 *               kept for as long as bytes came);
 *   cap         100 silent connections to a target with RLIMIT_NOFILE 64
 *               and HIXL_MAX_HANDSHAKES=8: a legitimate peer still
 *               connects and its put lands (handshakes that stall past
 *               their fair time are shed; before, the attacker took every
 *               descriptor);
 *   burst       not an attack: 48 legitimate peers connect at once to a
 *               target with HIXL_MAX_HANDSHAKES=4; every connect must
 *               succeed (the cap shed the oldest, so most of them failed
 *               with "closed the connection at HELLO")
 *   emfile      the same as cap without a useful cap (HIXL_MAX_HANDSHAKES=1000):
 *               the target is at its descriptor limit; its control thread
 *               must not spin (it ran at ~96% of a CPU, refusing everyone)
 *               and the attacker's oldest connections are shed.
 *
 * The target is a child process (its own descriptor limit); it serves a
 * "kv" region and, on a line on its stdin, prints the first bytes of it.
 * Exit 0 on success, 1 on failure (the reason on stderr).
 */
#define _GNU_SOURCE
#include "hostile.h"

#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>

/* The target's descriptor limit (0: inherited) and HIXL_MAX_HANDSHAKES. */
typedef struct target_arg {
  int nofile, max_handshakes;
} target_arg_t;

static void target_main(void *arg)
{
  const target_arg_t *a = arg;
  char mh[16];
  snprintf(mh, sizeof(mh), "%d", a->max_handshakes);
  setenv("HIXL_MAX_HANDSHAKES", mh, 1);
  setenv("HIXL_TIMEOUT_MS", "2000", 1);
  setenv("HIXL_TRANSPORTS", "self,shm", 1);
  struct rlimit rl = {(rlim_t)a->nofile, (rlim_t)a->nofile};
  if (a->nofile > 0 && setrlimit(RLIMIT_NOFILE, &rl) != 0)
    FAIL("setrlimit: %s", strerror(errno));
  hixl_ctx_t *ctx;
  if (hixl_ctx_create(NULL, &ctx) != HIXL_OK)
    FAIL("target: %s", hixl_last_error());
  serve_kv(ctx);
}

static void target_start(piped_target_t *t, int nofile, int max_handshakes)
{
  target_arg_t a = {nofile, max_handshakes};
  piped_target_start(t, target_main, &a);
}

/* A TCP connection to host:port of the target's address. */
static int dial(const char *addr)
{
  char host[128];
  snprintf(host, sizeof(host), "%s", addr);
  char *colon = strrchr(host, ':');
  *colon = 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
  if (getaddrinfo(host, colon + 1, &hints, &res) != 0)
    FAIL("getaddrinfo %s", addr);
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0)
    FAIL("connect %s: %s", addr, strerror(errno));
  freeaddrinfo(res);
  return fd;
}

/* Closed by the other side (EOF or reset) without blocking. */
static int closed_by_peer(int fd)
{
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0)
    return 0;
  char c;
  ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN);
}

/* A legitimate peer: connect, put, and the target sees the bytes. */
static void legit_put(piped_target_t *t, const char *what)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.transports = "shm";
  hixl_ctx_t *ctx;
  hixl_peer_t *p;
  hixl_rmr_t *r;
  if (hixl_ctx_create(&cfg, &ctx) != HIXL_OK)
    FAIL("%s: ctx: %s", what, hixl_last_error());
  if (hixl_connect(ctx, t->addr, 10000, &p) != HIXL_OK)
    FAIL("%s: a legitimate peer cannot connect: %s", what, hixl_last_error());
  if (hixl_rmr_lookup(p, "kv", 10000, &r) != HIXL_OK)
    FAIL("%s: lookup: %s", what, hixl_last_error());
  char msg[16] = "legit-peer-ok";
  if (hixl_put(p, msg, sizeof(msg), r, 0, 0, NULL) != HIXL_OK || hixl_fence(ctx, p, 10000))
    FAIL("%s: put: %s", what, hixl_last_error());
  char line[64];
  if (!piped_target_peek(t, line, sizeof(line)) || strncmp(line, "legit-peer-ok", 13) != 0)
    FAIL("%s: the target does not hold the legitimate put", what);
  hixl_rmr_release(r);
  hixl_disconnect(p);
  hixl_ctx_destroy(ctx);
}

static double cpu_seconds(pid_t pid)
{
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f || !fgets(buf, sizeof(buf), f))
    FAIL("read %s", path);
  fclose(f);
  char *p = strrchr(buf, ')');
  unsigned long ut, st;
  if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
    FAIL("parse %s", path);
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* A valid HELLO frame (the fuzz seed), trickled a byte at a time and never
 * finished: every byte is well-formed, so only the deadline can end it. */
static unsigned char g_hello[512];
static size_t g_hello_len;

static void slowloris(const char *seed)
{
  FILE *f = fopen(seed, "rb");
  if (f == NULL || (g_hello_len = fread(g_hello, 1, sizeof(g_hello), f)) < 32)
    FAIL("slowloris: cannot read the HELLO seed %s", seed);
  fclose(f);
  piped_target_t t;
  target_start(&t, 0, 256);
  enum { N = 5 };
  int fds[N];
  size_t sent[N] = {0};
  for (int i = 0; i < N; i++)
    fds[i] = dial(t.addr);
  double t0 = now_s();
  int open_ = N;
  /* The deadline is max(timeout, 1 s) = 2 s from the accept; allow 10 s. */
  while (open_ > 0 && now_s() - t0 < 10) {
    open_ = 0;
    for (int i = 0; i < N; i++) {
      if (fds[i] < 0)
        continue;
      if (sent[i] + 1 >= g_hello_len)
        FAIL("slowloris: the whole HELLO but its last byte went out and the connection is "
             "still open after %.1f s",
             now_s() - t0);
      if (closed_by_peer(fds[i]) || send(fds[i], g_hello + sent[i]++, 1, MSG_NOSIGNAL) < 0) {
        close(fds[i]);
        fds[i] = -1;
        continue;
      }
      open_++;
    }
    usleep(100000);
  }
  if (open_ > 0)
    FAIL("slowloris: %d connection(s) trickling a byte every 100 ms still open after %.1f s", open_,
         now_s() - t0);
  printf("slowloris: all %d trickling connections closed after %.1f s\n", N, now_s() - t0);
  legit_put(&t, "slowloris");
  piped_target_stop(&t);
}

static void flood(const char *what, int max_handshakes, int check_cpu)
{
  piped_target_t t;
  target_start(&t, 64, max_handshakes);
  enum { N = 100 };
  int fds[N];
  for (int i = 0; i < N; i++)
    fds[i] = dial(t.addr); /* the kernel's backlog takes them; the target accepts what it can */
  usleep(300000);
  if (check_cpu) {
    double c0 = cpu_seconds(t.pid), w0 = now_s();
    sleep(2);
    double use = (cpu_seconds(t.pid) - c0) / (now_s() - w0);
    printf("%s: target CPU at its descriptor limit: %.0f%% of a core\n", what, use * 100);
    if (use > 0.5)
      FAIL("%s: the target spins at its descriptor limit (%.0f%% of a core)", what, use * 100);
  }
  /* Silent connections are shed once they had their fair time to answer
   * (an eighth of the 2 s deadline): on a loaded machine, allow 5 s. */
  int shed = 0;
  for (double t0 = now_s(); shed == 0 && now_s() - t0 < 5.0; usleep(50000)) {
    shed = 0;
    for (int i = 0; i < N; i++)
      shed += closed_by_peer(fds[i]);
  }
  printf("%s: %d of %d silent connections shed so far\n", what, shed, N);
  if (shed == 0)
    FAIL("%s: no silent connection was shed", what);
  legit_put(&t, what);
  for (int i = 0; i < N; i++)
    close(fds[i]);
  piped_target_stop(&t);
}

/* One legitimate peer of the burst: its own context, released with the
 * others at once. */
typedef struct {
  const char *addr;
  pthread_barrier_t *go;
  hixl_status_t st;
  char err[256];
} burst_peer_t;

static void *burst_peer(void *arg)
{
  burst_peer_t *b = arg;
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  cfg.transports = "shm";
  hixl_ctx_t *ctx = NULL;
  hixl_peer_t *p;
  b->st = hixl_ctx_create(&cfg, &ctx);
  pthread_barrier_wait(b->go);
  if (b->st == HIXL_OK && (b->st = hixl_connect(ctx, b->addr, 10000, &p)) == HIXL_OK)
    hixl_disconnect(p);
  if (b->st != HIXL_OK)
    snprintf(b->err, sizeof(b->err), "%s", hixl_last_error());
  if (ctx)
    hixl_ctx_destroy(ctx);
  return NULL;
}

static void burst(void)
{
  piped_target_t t;
  target_start(&t, 1024, 4);
  enum { N = 48 };
  static burst_peer_t b[N];
  pthread_t th[N];
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, N);
  for (int i = 0; i < N; i++) {
    b[i] = (burst_peer_t){.addr = t.addr, .go = &go};
    if (pthread_create(&th[i], NULL, burst_peer, &b[i]) != 0)
      FAIL("burst: pthread_create");
  }
  int failed = 0, first = -1;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    if (b[i].st != HIXL_OK && failed++ == 0)
      first = i;
  }
  pthread_barrier_destroy(&go);
  printf("burst: %d of %d peers connected at once past HIXL_MAX_HANDSHAKES=4\n", N - failed, N);
  if (failed)
    FAIL("burst: %d of %d legitimate connects failed; the first: %s", failed, N, b[first].err);
  legit_put(&t, "burst");
  piped_target_stop(&t);
}

static const char *g_seed = "tests/fuzz/seeds_wire/hello.bin"; /* argv[2] */

static int run_slowloris(void)
{
  slowloris(g_seed);
  return 0;
}
static int run_cap(void)
{
  flood("cap", 8, 0);
  return 0;
}
static int run_burst(void)
{
  burst();
  return 0;
}
static int run_emfile(void)
{
  flood("emfile", 1000, 1);
  return 0;
}

/* The cases (tests/common/cases.h): --list prints them; none or "all" runs
 * every one in order. */
static const struct test_case cases[] = {
    {"slowloris", run_slowloris},
    {"cap", run_cap},
    {"burst", run_burst},
    {"emfile", run_emfile},
};

int main(int argc, char **argv)
{
  cases_options(CASES(cases), argc, argv);
  signal(SIGPIPE, SIG_IGN);
  const char *which = argc > 1 ? argv[1] : "all";
  if (argc > 2)
    g_seed = argv[2];
  return cases_run(cases, sizeof(cases) / sizeof(cases[0]),
                   strcmp(which, "all") == 0 ? NULL : which);
}

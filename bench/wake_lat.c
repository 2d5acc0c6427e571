/* SPDX-License-Identifier: MIT */
/*
 * bench/wake_lat.c: what a hixl wait costs while nothing happens, and how
 * fast an event wakes it from sleep, beside the kernel's own wake-ups
 * measured in the same run (docs/waiting.md, docs/performance.md).
 *
 * Two processes: this one waits, a forked child makes the events.
 *
 *  - Wake-up: for each sample the waiter blocks, the child sleeps --gap-ms
 *    (20 ms: long past any polling budget, so the waiter is asleep), writes
 *    its CLOCK_MONOTONIC time into shared memory and makes the event; the
 *    waiter's latency is its time on waking minus that.  Events: a bare
 *    futex wake-up (FUTEX_WAKE on a shared word), a pipe write the waiter
 *    is blocked reading, the same write to a waiter in poll() on an eventfd
 *    and the pipe with a timeout (the kernel mechanism hixl sleeps in), a
 *    1-byte send on a loopback TCP connection to a waiter in poll() on it
 *    (what libfabric's tcp provider sleeps in: fabric's floor), and a hixl
 *    notification (hixl_notify; the waiter in hixl_notif_wait).  One
 *    sample of each per round: this VM's wake-up latency drifts by 3x
 *    within seconds, so only samples taken side by side compare.
 *  - Idle: the waiter blocked for --idle-ms in hixl_notif_wait with nothing
 *    coming, then in hixl_req_wait on an operation the stopped child cannot
 *    complete (shm: an atomic its control thread executes; fabric: a get);
 *    CPU (% of a core, the whole process: every hixl thread) and wake-ups
 *    (context switches) per second, from getrusage.
 *
 * The transport is the connection's (HIXL_TRANSPORTS picks: shm by default
 * on one host, fabric when forced); HIXL_PROGRESS_THREAD and HIXL_WAIT apply
 * as usual.  --quick: few samples (the test suite runs it for its checks
 * only: every event delivered, every wait woken; it asserts no time).
 */
#define _GNU_SOURCE
#include <hixl.h>
#include "bench_util.h"
#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct shared {
  _Atomic uint32_t futex;
  _Atomic int64_t ts; /* when the child made the last event */
  char addr[128];     /* the child's context address */
} shared_t;

static shared_t *sh;
static int ctl[2];    /* parent <-> child: one byte per command */
static int pipefd[2]; /* the pipe baseline: child -> parent */
static int tcpfd[2];  /* the TCP baseline over loopback: [1] child -> [0] parent */

static void die(const char *what, hixl_status_t st)
{
  fprintf(stderr, "wake_lat: %s: %s (%s)\n", what, hixl_strerror(st), hixl_last_error());
  exit(1);
}
#define CHECK(call)                                                                                \
  do {                                                                                             \
    hixl_status_t st_ = (call);                                                                    \
    if (st_ != HIXL_OK)                                                                            \
      die(#call, st_);                                                                             \
  } while (0)

static void send_cmd(int fd, char c)
{
  if (write(fd, &c, 1) != 1) {
    perror("wake_lat: control socket");
    exit(1);
  }
}

static char recv_cmd(int fd)
{
  char c;
  ssize_t r;
  while ((r = read(fd, &c, 1)) < 0 && errno == EINTR)
    ;
  return r == 1 ? c : 'q';
}

/* ----------------------------------------------------------- the child */

static int child_main(int gap_ms)
{
  hixl_ctx_t *ctx;
  CHECK(hixl_ctx_create(NULL, &ctx));
  void *mem;
  hixl_mr_t *mr;
  /* A heap region: over shm its atomics are the owner's to execute. */
  mem = aligned_alloc(4096, 4096);
  memset(mem, 0, 4096);
  CHECK(
      hixl_mr_reg(ctx, mem, 4096, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC, &mr));
  CHECK(hixl_mr_publish(mr, "target"));
  snprintf(sh->addr, sizeof(sh->addr), "%s", hixl_ctx_address(ctx));
  send_cmd(ctl[1], 'r'); /* ready */
  hixl_peer_t *peer = NULL;
  for (;;) {
    char c = recv_cmd(ctl[1]);
    if (c == 'q')
      break;
    if (c == 'c') { /* connect to the parent (its address is in sh->addr) */
      CHECK(hixl_connect(ctx, sh->addr, 10000, &peer));
      send_cmd(ctl[1], 'r');
      continue;
    }
    sleep_ms(gap_ms);
    atomic_store(&sh->ts, now_ns());
    if (c == 'f') {
      atomic_fetch_add(&sh->futex, 1);
      syscall(SYS_futex, &sh->futex, FUTEX_WAKE, 1, NULL, NULL, 0);
    } else if (c == 'p' || c == 'P') {
      char b = 1;
      if (write(pipefd[1], &b, 1) != 1)
        return 1;
    } else if (c == 't') {
      char b = 1;
      if (send(tcpfd[1], &b, 1, MSG_NOSIGNAL) != 1)
        return 1;
    } else if (c == 'n') {
      CHECK(hixl_notify(peer, 7, 0, NULL));
    }
  }
  if (peer)
    hixl_disconnect(peer);
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(ctx);
  free(mem);
  return 0;
}

/* ---------------------------------------------------------- the waiter */

typedef struct figures {
  double p50, p90;
} figures_t;

static figures_t figures(int64_t *lat, int n)
{
  qsort(lat, (size_t)n, sizeof(*lat), cmp_i64);
  return (figures_t){lat[n / 2] / 1000.0, lat[(n * 9) / 10] / 1000.0};
}

/* One sample of each kind: the wait's latency in ns. */
static int64_t sample_futex(void)
{
  uint32_t v = atomic_load(&sh->futex);
  send_cmd(ctl[0], 'f');
  while (atomic_load(&sh->futex) == v)
    syscall(SYS_futex, &sh->futex, FUTEX_WAIT, v, NULL, NULL, 0);
  return now_ns() - atomic_load(&sh->ts);
}

static int64_t sample_pipe(void)
{
  send_cmd(ctl[0], 'p');
  char b;
  if (read(pipefd[0], &b, 1) != 1) {
    perror("wake_lat: pipe");
    exit(1);
  }
  return now_ns() - atomic_load(&sh->ts);
}

/* The kernel mechanism a hixl waiter sleeps in: poll() on two fds (its
 * eventfd and a doorbell pipe) with a timeout, woken by a pipe write. */
static int64_t sample_poll(int efd)
{
  send_cmd(ctl[0], 'P');
  struct pollfd pf[2] = {{.fd = efd, .events = POLLIN}, {.fd = pipefd[0], .events = POLLIN}};
  while (poll(pf, 2, 1000) <= 0)
    ;
  char b;
  if (read(pipefd[0], &b, 1) != 1) {
    perror("wake_lat: pipe");
    exit(1);
  }
  return now_ns() - atomic_load(&sh->ts);
}

/* What a provider over TCP sleeps on: poll() on a loopback TCP socket,
 * woken by a 1-byte send (TCP_NODELAY) -- the kernel's part of a fabric
 * (tcp;ofi_rxm) wake-up, which has the loopback stack in the sender's
 * send() besides the wake-up itself. */
static int64_t sample_tcp(void)
{
  send_cmd(ctl[0], 't');
  struct pollfd pf = {.fd = tcpfd[0], .events = POLLIN};
  while (poll(&pf, 1, 1000) <= 0)
    ;
  char b;
  if (recv(tcpfd[0], &b, 1, 0) != 1) {
    perror("wake_lat: tcp");
    exit(1);
  }
  return now_ns() - atomic_load(&sh->ts);
}

/* A connected pair of loopback TCP sockets, Nagle off. */
static int tcp_pair(int fds[2])
{
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  int one = 1, l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  fds[1] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l < 0 || fds[1] < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 1) != 0 ||
      getsockname(l, (struct sockaddr *)&a, &al) != 0 ||
      connect(fds[1], (struct sockaddr *)&a, sizeof(a)) != 0 ||
      (fds[0] = accept4(l, NULL, NULL, SOCK_CLOEXEC)) < 0)
    return -1;
  close(l);
  setsockopt(fds[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fds[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return 0;
}

static int64_t sample_notif(hixl_ctx_t *ctx)
{
  send_cmd(ctl[0], 'n');
  hixl_notif_t nf;
  CHECK(hixl_notif_wait(ctx, &nf, 30000));
  int64_t lat = now_ns() - atomic_load(&sh->ts);
  if (nf.imm != 7) {
    fprintf(stderr, "wake_lat: notification imm %u, want 7\n", nf.imm);
    exit(1);
  }
  return lat;
}

typedef struct usage {
  double cpu_pct, wakeups_s, secs;
} usage_t;

static struct rusage ru0;
static int64_t t0;
static void usage_begin(void)
{
  getrusage(RUSAGE_SELF, &ru0);
  t0 = now_ns();
}

static usage_t usage_end(void)
{
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  double secs = (double)(now_ns() - t0) / 1e9;
  double cpu =
      (double)(r.ru_utime.tv_sec - ru0.ru_utime.tv_sec + r.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
      (double)(r.ru_utime.tv_usec - ru0.ru_utime.tv_usec + r.ru_stime.tv_usec -
               ru0.ru_stime.tv_usec) /
          1e6;
  double sw = (double)(r.ru_nvcsw - ru0.ru_nvcsw + r.ru_nivcsw - ru0.ru_nivcsw);
  return (usage_t){100.0 * cpu / secs, sw / secs, secs};
}

static void stop_child(pid_t pid)
{
  kill(pid, SIGSTOP);
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  for (int i = 0; i < 10000; i++) {
    FILE *f = fopen(path, "r");
    size_t k = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
      fclose(f);
    buf[k] = 0;
    const char *p = strrchr(buf, ')');
    if (p && p[1] == ' ' && p[2] == 'T')
      return;
    sleep_ms(1);
  }
}

int main(int argc, char **argv)
{
  int n = 200, gap_ms = 20, idle_ms = 10000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      n = 10;
      idle_ms = 1000;
    } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      n = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--gap-ms") == 0 && i + 1 < argc) {
      gap_ms = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--idle-ms") == 0 && i + 1 < argc) {
      idle_ms = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: %s [--quick] [--iters N] [--gap-ms MS] [--idle-ms MS]\n", argv[0]);
      return 2;
    }
  }
  if (n < 2)
    n = 2;
  sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED || socketpair(AF_UNIX, SOCK_STREAM, 0, ctl) != 0 || pipe(pipefd) != 0 ||
      tcp_pair(tcpfd) != 0) {
    perror("wake_lat");
    return 1;
  }
  pid_t pid = fork(); /* before any context: no hixl threads to fork */
  if (pid == 0) {
    close(ctl[0]);
    _exit(child_main(gap_ms));
  }
  close(ctl[1]);
  if (recv_cmd(ctl[0]) != 'r')
    return 1;
  char child_addr[128];
  snprintf(child_addr, sizeof(child_addr), "%s", sh->addr);
  hixl_ctx_t *ctx;
  CHECK(hixl_ctx_create(NULL, &ctx));
  snprintf(sh->addr, sizeof(sh->addr), "%s", hixl_ctx_address(ctx));
  send_cmd(ctl[0], 'c');
  if (recv_cmd(ctl[0]) != 'r')
    return 1;
  hixl_peer_t *peer;
  CHECK(hixl_connect(ctx, child_addr, 10000, &peer));
  hixl_rmr_t *rmr;
  CHECK(hixl_rmr_lookup(peer, "target", 10000, &rmr));
  const char *tp = hixl_peer_transport(peer);

  /* Warm the path once, then measure one sample of each kind per round:
   * this VM's wake-up latency drifts by 3x within seconds, so only
   * samples taken side by side compare. */
  sample_notif(ctx);
  int64_t *lat = calloc(5 * (size_t)n, sizeof(*lat));
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  for (int i = 0; i < n; i++) {
    lat[i] = sample_futex();
    lat[n + i] = sample_pipe();
    lat[2 * n + i] = sample_poll(efd);
    lat[3 * n + i] = sample_notif(ctx);
    lat[4 * n + i] = sample_tcp();
  }
  close(efd);
  figures_t fx = figures(lat, n), pp = figures(lat + n, n), po = figures(lat + 2 * n, n),
            hx = figures(lat + 3 * n, n), tc = figures(lat + 4 * n, n);
  free(lat);
  printf("wake-up from sleep (%d samples, %d ms apart; us)   p50      p90\n", n, gap_ms);
  printf("  futex (FUTEX_WAKE, shared word)          %8.1f %8.1f\n", fx.p50, fx.p90);
  printf("  pipe (blocked read)                      %8.1f %8.1f\n", pp.p50, pp.p90);
  printf("  poll (eventfd + pipe, 1 s timeout)       %8.1f %8.1f\n", po.p50, po.p90);
  printf("  hixl notification over %-6s            %8.1f %8.1f\n", tp, hx.p50, hx.p90);
  printf("  hixl / futex                             %7.2fx %7.2fx\n", hx.p50 / fx.p50,
         hx.p90 / fx.p90);
  printf("  hixl / pipe                              %7.2fx %7.2fx\n", hx.p50 / pp.p50,
         hx.p90 / pp.p90);
  printf("  poll / futex (the kernel's part)         %7.2fx %7.2fx\n", po.p50 / fx.p50,
         po.p90 / fx.p90);
  printf("  tcp over loopback (poll, 1-byte send)    %8.1f %8.1f\n", tc.p50, tc.p90);
  printf("  hixl / tcp                               %7.2fx %7.2fx\n", hx.p50 / tc.p50,
         hx.p90 / tc.p90);

  /* Idle: a notification wait with nothing coming. */
  usage_begin();
  hixl_notif_t nf;
  hixl_status_t st = hixl_notif_wait(ctx, &nf, idle_ms);
  usage_t un = usage_end();
  if (st != HIXL_ERR_TIMEOUT)
    die("idle hixl_notif_wait (want TIMEOUT)", st);
  /* And a request that cannot complete: the child is stopped. */
  usage_t ur = {0, 0, 0};
  bool shm = strcmp(tp, "shm") == 0, fabric = strcmp(tp, "fabric") == 0;
  if (shm || fabric) {
    uint64_t old = 0, buf[8];
    hixl_req_t *req;
    stop_child(pid);
    if (shm)
      CHECK(hixl_atomic_faa(peer, rmr, 0, 1, &old, 0, &req));
    else
      CHECK(hixl_get(peer, buf, sizeof(buf), rmr, 0, 0, &req));
    usage_begin();
    st = hixl_req_wait(req, idle_ms);
    ur = usage_end();
    kill(pid, SIGCONT);
    if (st != HIXL_ERR_TIMEOUT)
      die("hixl_req_wait on a stopped peer (want TIMEOUT)", st);
    CHECK(hixl_req_wait(req, 30000));
    hixl_req_free(req);
  }
  printf("idle, whole process (all hixl threads)   %% of a core   wake-ups/s\n");
  printf("  hixl_notif_wait, %.1f s                   %8.3f %10.1f\n", un.secs, un.cpu_pct,
         un.wakeups_s);
  if (shm || fabric)
    printf("  hixl_req_wait (peer stopped), %.1f s      %8.3f %10.1f\n", ur.secs, ur.cpu_pct,
           ur.wakeups_s);
  else
    printf("  hixl_req_wait: n/a over %s (operations complete in the call)\n", tp);
  const char *pt = getenv("HIXL_PROGRESS_THREAD"), *wm = getenv("HIXL_WAIT");
  printf("transport %s, HIXL_PROGRESS_THREAD=%s, HIXL_WAIT=%s\n", tp, pt ? pt : "0",
         wm ? wm : "adaptive");

  send_cmd(ctl[0], 'q');
  int status = 0;
  waitpid(pid, &status, 0);
  hixl_rmr_release(rmr);
  hixl_disconnect(peer);
  hixl_ctx_destroy(ctx);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

/* SPDX-License-Identifier: MIT */
/*
 * hixl-perf: latency and bandwidth of hixl operations, with the single-thread
 * memcpy limit measured in the same run beside every figure.
 *
 *   hixl-perf [-t put|get|faa|cas|pingpong|putpoll] [-s SIZE | -a] [-n ITERS]
 *             [-m alloc|reg] [--transport shm|self] [--json FILE] [--quick]
 *
 * By default it forks a target process on this host (shm).  The target
 * registers a 64 MiB region and then does nothing: every operation is
 * one-sided.  Latency is one operation including its completion, measured
 * per operation (p50/p99); bandwidth is back-to-back operations of one size.
 *
 * pingpong: we put_imm SIZE bytes, the target answers each notification with
 * a put_imm of the same size into our region; the latency is half the round
 * trip (ib_send_lat's method: the target learns of the data from a
 * completion).  putpoll: ib_write_lat's and ucx_perftest's put latency: we
 * put SIZE bytes whose last 8 carry a sequence number, the target spins on
 * that word in its own memory and puts back the same way; half the round
 * trip.  (In both the target calls hixl, by necessity; nothing else does.)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <hixl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REGION_LEN ((size_t)64 << 20)
#define PP_STOP 0xffffffffu

static double mono_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Timing with the TSC where there is one (as perftest does with get_cycles):
 * in a virtual machine whose clock source is not the TSC, every
 * clock_gettime is a system call and an emulated device read that would be
 * counted in every latency.  Calibrated once against CLOCK_MONOTONIC. */
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static double tsc_hz;
static void clock_init(void)
{
  double t0 = mono_s();
  uint64_t c0 = __rdtsc();
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
  tsc_hz = (double)(__rdtsc() - c0) / (mono_s() - t0);
}
static double now_s(void) { return (double)__rdtsc() / tsc_hz; }
#else
static void clock_init(void) {}
static double now_s(void) { return mono_s(); }
#endif

static void die(const char *what, hixl_status_t st)
{
  fprintf(stderr, "hixl-perf: %s: %s (%s)\n", what, hixl_strerror(st), hixl_last_error());
  exit(1);
}
#define CK(call)                                                                                \
  do {                                                                                          \
    hixl_status_t s_ = (call);                                                                  \
    if (s_ != HIXL_OK)                                                                          \
      die(#call, s_);                                                                           \
  } while (0)

/* pingpong target: answer each notification with a put_imm of its length
 * into the initiator's "perf-back" region, until PP_STOP. */
static void serve_pingpong(hixl_ctx_t *ctx, void *addr)
{
  hixl_rmr_t *back = NULL;
  for (;;) {
    hixl_notif_t n;
    CK(hixl_notif_wait(ctx, &n, -1));
    if (n.imm == PP_STOP)
      break;
    if (back == NULL)
      CK(hixl_rmr_lookup(n.peer, "perf-back", 10000, &back));
    CK(hixl_put_imm(n.peer, addr, n.len ? n.len : 8, back, 0, n.imm, 0, NULL));
  }
  if (back)
    hixl_rmr_release(back);
}

/* putpoll target: wait for the sequence number in the last 8 bytes of the
 * first `size` bytes of our region, put the same back into the initiator's
 * "perf-back", until the number is all ones.  The size and the peer come in
 * a hello notification {imm = size}. */
static void serve_putpoll(hixl_ctx_t *ctx, void *addr)
{
  hixl_notif_t n;
  CK(hixl_notif_wait(ctx, &n, -1));
  size_t size = n.imm;
  hixl_rmr_t *back;
  CK(hixl_rmr_lookup(n.peer, "perf-back", 10000, &back));
  volatile uint64_t *seq = (volatile uint64_t *)((uint8_t *)addr + size - 8);
  for (uint64_t want = 1;; want++) {
    uint64_t v;
    while ((v = *seq) != want && v != UINT64_MAX)
      hixl_progress(ctx); /* retires our own puts' completions */
    if (v == UINT64_MAX)
      break;
    CK(hixl_put(n.peer, addr, size, back, 0, 0, NULL));
  }
  CK(hixl_fence(ctx, n.peer, -1));
  hixl_rmr_release(back);
}

/* The target: a region, published, then idle until told to stop. */
static int run_target(const char *test, const char *mem, int out_fd, int in_fd,
                      hixl_ctx_t *shared)
{
  hixl_ctx_t *ctx = shared;
  if (ctx == NULL)
    CK(hixl_ctx_create(NULL, &ctx));
  hixl_mr_t *mr;
  void *addr = NULL, *to_free = NULL;
  unsigned acc = HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC;
  if (strcmp(mem, "reg") == 0) {
    if (posix_memalign(&to_free, 4096, REGION_LEN) != 0)
      return 1;
    addr = to_free;
    memset(addr, 0, REGION_LEN);
    CK(hixl_mr_reg(ctx, addr, REGION_LEN, acc, &mr));
  } else {
    CK(hixl_mem_alloc(ctx, REGION_LEN, HIXL_MEM_HOST, acc, &addr, &mr));
  }
  CK(hixl_mr_publish(mr, "perf"));
  if (shared)
    return 0; /* same context: nothing to wait for */
  dprintf(out_fd, "%s\n", hixl_ctx_address(ctx));
  if (strcmp(test, "pingpong") == 0)
    serve_pingpong(ctx, addr);
  if (strcmp(test, "putpoll") == 0)
    serve_putpoll(ctx, addr);
  char c;
  while (read(in_fd, &c, 1) < 0 && errno == EINTR)
    ;
  hixl_mr_dereg(mr);
  free(to_free);
  hixl_ctx_destroy(ctx);
  return 0;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct result {
  size_t size;
  long iters;
  double p50_us, p99_us, gbps, mops, memcpy_gbps;
} result_t;

static hixl_status_t one_op(const char *test, hixl_peer_t *peer, hixl_rmr_t *rmr, void *buf,
                            size_t size, uint64_t off)
{
  /* Written when the atomic completes, which may be after we return (atomics
   * the owner executes): it must outlive the call. */
  static uint64_t old;
  if (strcmp(test, "put") == 0)
    return hixl_put(peer, buf, size, rmr, off, 0, NULL);
  if (strcmp(test, "get") == 0)
    return hixl_get(peer, buf, size, rmr, off, 0, NULL);
  if (strcmp(test, "faa") == 0)
    return hixl_atomic_faa(peer, rmr, off & ~7ull, 1, &old, 0, NULL);
  return hixl_atomic_cas(peer, rmr, off & ~7ull, 0, 1, &old, 0, NULL);
}

static double memcpy_gbps(size_t size, long iters, void *a, void *b)
{
  memcpy(a, b, size); /* warm */
  double t0 = now_s();
  for (long i = 0; i < iters; i++) {
    memcpy(a, b, size);
    __asm__ volatile("" ::: "memory");
  }
  return (double)size * (double)iters / (now_s() - t0) / 1e9;
}

/* The figures of a ping-pong: lat[] holds r.iters half round trips (us),
 * t_all the sum of the whole round trips (s); two messages per round. */
static result_t pingpong_result(result_t r, double *lat, double t_all, void *buf, void *buf2)
{
  qsort(lat, (size_t)r.iters, sizeof(double), cmp_double);
  r.p50_us = lat[r.iters / 2];
  r.p99_us = lat[(r.iters * 99) / 100];
  free(lat);
  r.gbps = 2.0 * (double)r.size * (double)r.iters / t_all / 1e9;
  r.mops = 2.0 * (double)r.iters / t_all / 1e6;
  r.memcpy_gbps = memcpy_gbps(r.size, r.iters, buf2, buf);
  return r;
}

/* Half round trips of put_imm ping-pongs (see the top). */
static result_t pingpong(hixl_ctx_t *ctx, hixl_peer_t *peer, hixl_rmr_t *rmr, size_t size,
                         long iters, void *buf, void *buf2)
{
  result_t r = {.size = size, .iters = iters};
  long lat_n = iters;
  double *lat = malloc(sizeof(double) * (size_t)lat_n);
  double t_all = 0;
  for (long i = -10; i < lat_n; i++) { /* ten to warm up */
    double t0 = now_s();
    CK(hixl_put_imm(peer, buf, size, rmr, 0, (uint32_t)(i & 0x7fffffff), 0, NULL));
    hixl_notif_t n;
    CK(hixl_notif_wait(ctx, &n, -1));
    double dt = now_s() - t0;
    if (n.imm != (uint32_t)(i & 0x7fffffff) || n.len != size) {
      fprintf(stderr, "hixl-perf: pingpong: got {%u, %zu}, want {%ld, %zu}\n", n.imm, n.len, i,
              size);
      exit(1);
    }
    if (i >= 0) {
      lat[i] = dt / 2 * 1e6;
      t_all += dt;
    }
  }
  return pingpong_result(r, lat, t_all, buf, buf2);
}

/* Half round trips of puts noticed by polling memory (see the top). */
static result_t putpoll(hixl_ctx_t *ctx, hixl_peer_t *peer, hixl_rmr_t *rmr, size_t size,
                        long iters, void *buf, void *buf2)
{
  result_t r = {.size = size, .iters = iters};
  if (size < 8)
    size = r.size = 8;
  CK(hixl_notify(peer, (uint32_t)size, 0, NULL)); /* hello: the size */
  double *lat = malloc(sizeof(double) * (size_t)iters);
  volatile uint64_t *mine = (volatile uint64_t *)((uint8_t *)buf2 + size - 8);
  uint64_t *out = (uint64_t *)((uint8_t *)buf + size - 8);
  double t_all = 0;
  for (long i = -10; i < iters; i++) { /* ten to warm up */
    uint64_t seq = (uint64_t)(i + 11);
    *out = seq;
    double t0 = now_s();
    CK(hixl_put(peer, buf, size, rmr, 0, 0, NULL));
    while (*mine != seq)
      hixl_progress(ctx);
    double dt = now_s() - t0;
    if (i >= 0) {
      lat[i] = dt / 2 * 1e6;
      t_all += dt;
    }
  }
  *out = UINT64_MAX;
  CK(hixl_put(peer, buf, size, rmr, 0, 0, NULL));
  CK(hixl_fence(ctx, peer, -1));
  return pingpong_result(r, lat, t_all, buf, buf2);
}

static result_t measure(const char *test, hixl_ctx_t *ctx, hixl_peer_t *peer, hixl_rmr_t *rmr,
                        size_t size, long iters, void *buf, void *buf2)
{
  if (strcmp(test, "putpoll") == 0)
    return putpoll(ctx, peer, rmr, size, iters, buf, buf2);
  if (strcmp(test, "pingpong") == 0)
    return pingpong(ctx, peer, rmr, size, iters, buf, buf2);
  result_t r = {.size = size, .iters = iters};
  bool atomic = strcmp(test, "faa") == 0 || strcmp(test, "cas") == 0;
  /* Latency: each op timed alone, with its completion (a fence: on shm the
   * op itself has completed, on verbs this waits for the ACK or response). */
  long lat_n = iters < 2000 ? iters : 2000;
  double *lat = malloc(sizeof(double) * (size_t)lat_n);
  for (long i = 0; i < 10; i++)
    one_op(test, peer, rmr, buf, size, 0);
  CK(hixl_fence(ctx, peer, -1));
  for (long i = 0; i < lat_n; i++) {
    double t0 = now_s();
    hixl_status_t st = one_op(test, peer, rmr, buf, size, 0);
    st = st ? st : hixl_fence(ctx, peer, -1);
    lat[i] = (now_s() - t0) * 1e6;
    if (st != HIXL_OK)
      die(test, st);
  }
  qsort(lat, (size_t)lat_n, sizeof(double), cmp_double);
  r.p50_us = lat[lat_n / 2];
  r.p99_us = lat[(lat_n * 99) / 100];
  free(lat);
  /* Bandwidth / rate: back to back, one fence at the end. */
  double t0 = now_s();
  for (long i = 0; i < iters; i++) {
    hixl_status_t st = one_op(test, peer, rmr, buf, size, 0);
    if (st != HIXL_OK)
      die(test, st);
  }
  CK(hixl_fence(ctx, peer, -1));
  double dt = now_s() - t0;
  r.gbps = atomic ? 8.0 * (double)iters / dt / 1e9 : (double)size * (double)iters / dt / 1e9;
  r.mops = (double)iters / dt / 1e6;
  r.memcpy_gbps = memcpy_gbps(size, iters, buf2, buf);
  return r;
}

static long iters_for(size_t size, bool quick)
{
  /* About 256 MiB moved per size (less when quick), at least 20 ops. */
  long n = (long)(((size_t)(quick ? 16 : 256) << 20) / (size ? size : 1));
  long max = quick ? 2000 : 200000;
  return n < 20 ? 20 : n > max ? max : n;
}

static void usage(void)
{
  fprintf(stderr,
          "usage: hixl-perf [-t put|get|faa|cas|pingpong] [-s SIZE | -a] [-n ITERS]\n"
          "                 [-m alloc|reg] [--transport shm|self] [--json FILE] [--quick]\n"
          "  -t pingpong put_imm ping-pong with the target: half round trip (ib_send_lat's method)\n"
          "  -t putpoll  put ping-pong, each side polling its memory: half round trip\n"
          "              (ib_write_lat's method)\n"
          "  -a          sweep sizes 8 B .. 64 MiB (default)\n"
          "  -m alloc    target memory from hixl_mem_alloc (mapped: one memcpy per put)\n"
          "  -m reg      target memory from malloc + hixl_mr_reg (CMA on shm)\n"
          "  --quick     few iterations; checks that numbers are sane (for the test suite)\n");
  exit(2);
}

int main(int argc, char **argv)
{
  const char *test = "put", *mem = "alloc", *transport = "shm", *json = NULL;
  size_t one_size = 0;
  long iters = 0;
  bool quick = false;
  static const struct option opts[] = {{"transport", required_argument, 0, 'T'},
                                       {"json", required_argument, 0, 'j'},
                                       {"quick", no_argument, 0, 'q'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "t:s:an:m:h", opts, NULL)) != -1) {
    switch (c) {
    case 't': test = optarg; break;
    case 's': one_size = strtoull(optarg, NULL, 0); break;
    case 'a': one_size = 0; break;
    case 'n': iters = atol(optarg); break;
    case 'm': mem = optarg; break;
    case 'T': transport = optarg; break;
    case 'j': json = optarg; break;
    case 'q': quick = true; break;
    default: usage();
    }
  }
  if (strcmp(test, "put") && strcmp(test, "get") && strcmp(test, "faa") && strcmp(test, "cas") &&
      strcmp(test, "pingpong") && strcmp(test, "putpoll"))
    usage();
  bool pp = strcmp(test, "pingpong") == 0 || strcmp(test, "putpoll") == 0;
  if (pp && strcmp(transport, "self") == 0) {
    fprintf(stderr, "hixl-perf: %s needs a target process (not --transport self)\n", test);
    return 2;
  }
  if (one_size > REGION_LEN || (strcmp(mem, "alloc") && strcmp(mem, "reg")))
    usage();

  clock_init();
  hixl_ctx_t *ctx = NULL;
  char addr[128] = {0};
  pid_t pid = -1;
  int to_target[2] = {-1, -1};
  if (strcmp(transport, "self") == 0) {
    CK(hixl_ctx_create(NULL, &ctx));
    run_target(test, mem, -1, -1, ctx);
    snprintf(addr, sizeof(addr), "%s", hixl_ctx_address(ctx));
  } else {
    int from_target[2];
    if (pipe(from_target) || pipe(to_target))
      return 1;
    pid = fork();
    if (pid == 0) {
      close(from_target[0]);
      close(to_target[1]);
      /* Two RDMA devices on one host (Soft-RoCE tests): the target's own. */
      const char *dev = getenv("HIXL_PERF_TARGET_NET_DEV");
      if (dev)
        setenv("HIXL_NET_DEV", dev, 1);
      _exit(run_target(test, mem, from_target[1], to_target[0], NULL));
    }
    close(from_target[1]);
    close(to_target[0]);
    ssize_t n = read(from_target[0], addr, sizeof(addr) - 1);
    if (n <= 0)
      return 1;
    addr[strcspn(addr, "\n")] = 0;
    close(from_target[0]);
    /* Our context only now: fork before any hixl thread exists. */
    CK(hixl_ctx_create(NULL, &ctx));
  }
  hixl_peer_t *peer;
  hixl_rmr_t *rmr;
  CK(hixl_connect(ctx, addr, 10000, &peer));
  CK(hixl_rmr_lookup(peer, "perf", 10000, &rmr));

  void *buf, *buf2;
  if (posix_memalign(&buf, 4096, REGION_LEN) || posix_memalign(&buf2, 4096, REGION_LEN))
    return 1;
  memset(buf, 1, REGION_LEN);
  memset(buf2, 2, REGION_LEN);
  /* Registered local buffers, as a zero-copy user would have them (RDMA
   * transports then need no bounce copies). */
  hixl_mr_t *lmr1, *lmr2;
  CK(hixl_mr_reg(ctx, buf, REGION_LEN, 0, &lmr1));
  CK(hixl_mr_reg(ctx, buf2, REGION_LEN, HIXL_ACCESS_WRITE, &lmr2));
  CK(hixl_mr_publish(lmr2, "perf-back")); /* pingpong: the target answers here */

  size_t sizes[32];
  int nsizes = 0;
  bool atomic = strcmp(test, "faa") == 0 || strcmp(test, "cas") == 0;
  if (atomic || (strcmp(test, "putpoll") == 0 && one_size == 0))
    sizes[nsizes++] = 8; /* putpoll: the target serves one size per run */
  else if (one_size)
    sizes[nsizes++] = one_size;
  else if (quick)
    for (size_t s = 8; s <= (1u << 20); s *= 128)
      sizes[nsizes++] = s;
  else
    for (size_t s = 8; s <= REGION_LEN; s *= 4)
      sizes[nsizes++] = s;

  printf("# hixl-perf %s over %s (peer memory: %s), memcpy measured in the same run\n", test,
         hixl_peer_transport(peer), mem);
  printf("%10s %8s %10s %10s %10s %10s %12s %8s\n", "size", "iters", "p50(us)", "p99(us)",
         "GB/s", "Mops/s", "memcpy GB/s", "ratio");
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (jf)
    fprintf(jf, "{\"test\":\"%s\",\"transport\":\"%s\",\"mem\":\"%s\",\"results\":[", test,
            hixl_peer_transport(peer), mem);
  bool sane = true;
  for (int i = 0; i < nsizes; i++) {
    long n = iters ? iters : iters_for(sizes[i], quick);
    result_t r = measure(test, ctx, peer, rmr, sizes[i], n, buf, buf2);
    printf("%10zu %8ld %10.3f %10.3f %10.4g %10.4g %12.4g %8.3g\n", r.size, r.iters, r.p50_us,
           r.p99_us, r.gbps, r.mops, r.memcpy_gbps, r.gbps / r.memcpy_gbps);
    if (jf)
      fprintf(jf,
              "%s{\"size\":%zu,\"iters\":%ld,\"p50_us\":%.4f,\"p99_us\":%.4f,\"gbps\":%.4f,"
              "\"mops\":%.4f,\"memcpy_gbps\":%.4f}",
              i ? "," : "", r.size, r.iters, r.p50_us, r.p99_us, r.gbps, r.mops, r.memcpy_gbps);
    sane = sane && isfinite(r.gbps) && r.gbps > 0 && r.p50_us > 0 && r.p99_us >= r.p50_us;
  }
  if (jf) {
    fprintf(jf, "]}\n");
    fclose(jf);
  }
  /* The data really moved: write a pattern, read it back. */
  if (!atomic) {
    size_t n = 1 << 20;
    for (size_t k = 0; k < n; k++)
      ((unsigned char *)buf)[k] = (unsigned char)(k * 7 + 3);
    CK(hixl_put(peer, buf, n, rmr, 4096, 0, NULL));
    CK(hixl_get(peer, buf2, n, rmr, 4096, 0, NULL));
    CK(hixl_fence(ctx, peer, -1));
    if (memcmp(buf, buf2, n) != 0) {
      fprintf(stderr, "hixl-perf: data check failed\n");
      sane = false;
    }
  }
  if (strcmp(test, "pingpong") == 0)
    CK(hixl_notify(peer, PP_STOP, 0, NULL));

  CK(hixl_fence(ctx, peer, -1));
  hixl_rmr_release(rmr);
  hixl_mr_dereg(lmr1);
  hixl_mr_dereg(lmr2);
  hixl_disconnect(peer);
  if (pid > 0) {
    close(to_target[1]);
    waitpid(pid, NULL, 0);
  }
  hixl_ctx_destroy(ctx);
  free(buf);
  free(buf2);
  if (!sane)
    fprintf(stderr, "hixl-perf: insane result\n");
  return sane ? 0 : 1;
}

/* SPDX-License-Identifier: MIT */
/*
 * hixl-perf: latency, bandwidth and message rate of hixl operations, with the
 * single-thread memcpy limit measured in the same run beside every figure.
 * In the spirit of ib_write_bw / ucx_perftest / nixlbench; see
 * docs/performance.md for every option and how to read the output.
 *
 * Roles: by default one process forks the target locally (the initiator
 * connects to it over whatever transport hixl picks: shm on one host);
 * `--server` runs only the target and prints its address, `--client ADDR`
 * only the initiator.  The target registers one region ("perf") and serves:
 * every operation is one-sided except the ping-pong tests, where the target
 * answers (by necessity).  It is steered by notifications whose top nibble
 * is 0xF (CTL_*), so one server serves every test of a client.
 *
 * Latency: one operation at a time, each timed with its completion (a fence:
 * on shm the op has completed at return, on verbs this waits for the ACK or
 * the response); p50/p99.  Bandwidth and message rate: a window of W
 * operations outstanding (-w; each with its request, the oldest waited for
 * when the window is full), as ib_write_bw's tx depth.
 *
 * pingpong: we put_imm SIZE bytes, the target answers each notification with
 * a put_imm of the same size into our region; the latency is half the round
 * trip (ib_send_lat's method).  putpoll: ib_write_lat's and ucx_perftest's
 * put latency: we put SIZE bytes whose last 8 carry a sequence number, the
 * target spins on that word in its own memory and puts back the same way;
 * half the round trip.
 *
 * put_batch / get_batch: B (-b) blocks of SIZE, scattered on both sides
 * (random block slots, as a paged KV cache), under one request; printed
 * beside one contiguous put (get) of the same bytes in the same run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <hixl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIN_REGION ((size_t)64 << 20)
/* Target control notifications: top nibble 0xF, command in bits 24..27. */
#define CTL 0xf0000000u
#define CTL_SINK (CTL | 1u << 24)    /* drop data notifications (default) */
#define CTL_ECHO (CTL | 2u << 24)    /* answer each with a put_imm back */
#define CTL_PUTPOLL (CTL | 3u << 24) /* | size: serve one putpoll run */
#define CTL_STOP 0xffffffffu         /* end of the session */
#define MAX_LAT_ITERS 20000

/* ------------------------------------------------------------------ clock */

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
  if (st == HIXL_ERR_NOT_REGISTERED)
    fprintf(stderr, "hixl-perf: (with --client: is the server's --region large enough?)\n");
  exit(1);
}
#define CK(call)                                                                                   \
  do {                                                                                             \
    hixl_status_t s_ = (call);                                                                     \
    if (s_ != HIXL_OK)                                                                             \
      die(#call, s_);                                                                              \
  } while (0)

/* ----------------------------------------------------------------- options */

enum { T_PUT, T_GET, T_PUT_IMM, T_PUT_BATCH, T_GET_BATCH, T_FAA, T_CAS, T_PINGPONG, T_PUTPOLL };
static const char *const test_names[] = {"put", "get", "put_imm",  "put_batch", "get_batch",
                                         "faa", "cas", "pingpong", "putpoll"};
#define NTESTS (int)(sizeof(test_names) / sizeof(test_names[0]))

typedef struct cfg {
  int test;
  size_t size;     /* 0: sweep */
  size_t max_size; /* sweep up to this */
  long iters;      /* 0: by size */
  long warmup;
  int window;
  int batch;
  bool lat, bw;
  const char *mem;            /* host memory: alloc | reg */
  bool dev_local, dev_remote; /* --mem: device memory on our side / the target's */
  const char *transport;
  bool server;
  const char *client; /* address, or NULL */
  size_t region;      /* target region bytes */
  const char *json;
  bool quick;
  int cpu_init, cpu_target; /* --cpus; -1: not pinned */
  size_t sizes[40];         /* what will be measured */
  int nsizes;
} cfg_t;

static bool is_atomic(int t) { return t == T_FAA || t == T_CAS; }
static bool is_pingpong(int t) { return t == T_PINGPONG || t == T_PUTPOLL; }
static bool is_batch(int t) { return t == T_PUT_BATCH || t == T_GET_BATCH; }

/* The sizes to measure: atomics 8 B; -s one; else 8 B by 4x up to --max
 * bytes per operation (a batch's blocks together), or up to 1 MiB by 128x
 * with --quick.  putpoll needs 8 B for its sequence word. */
static void pick_sizes(cfg_t *c)
{
  size_t blocks = is_batch(c->test) ? (size_t)c->batch : 1;
  size_t max = c->quick ? (size_t)1 << 20 : c->max_size, step = c->quick ? 128 : 4;
  c->nsizes = 0;
  if (is_atomic(c->test))
    c->sizes[c->nsizes++] = 8;
  else if (c->size)
    c->sizes[c->nsizes++] = c->size;
  else
    for (size_t s = 8; s * blocks <= max && c->nsizes < 40; s *= step)
      c->sizes[c->nsizes++] = s;
  if (c->nsizes == 0) /* a batch bigger than --max: its smallest blocks */
    c->sizes[c->nsizes++] = 8;
  for (int i = 0; i < c->nsizes; i++)
    if (c->test == T_PUTPOLL && c->sizes[i] < 8)
      c->sizes[i] = 8;
}

/* Bytes a side needs: the largest transfer (a batch's 2B block slots), and
 * at least 1 MiB + 4 KiB for the data check; page-rounded. */
static size_t bytes_needed(const cfg_t *c)
{
  size_t need = ((size_t)1 << 20) + 4096;
  for (int i = 0; i < c->nsizes; i++) {
    size_t s = c->sizes[i] * (is_batch(c->test) ? 2 * (size_t)c->batch : 1);
    need = s > need ? s : need;
  }
  return (need + 4095) & ~(size_t)4095;
}

/* ------------------------------------------------------------------ target */

/* putpoll: wait for the sequence number in the last 8 bytes of the first
 * `size` bytes of our region, put the same back into the initiator's
 * "perf-back", until the number is all ones. */
static void serve_putpoll(hixl_ctx_t *ctx, hixl_peer_t *peer, hixl_rmr_t *back, void *addr,
                          size_t size)
{
  volatile uint64_t *seq = (volatile uint64_t *)((uint8_t *)addr + size - 8);
  for (uint64_t want = 1;; want++) {
    uint64_t v;
    while ((v = *seq) != want && v != UINT64_MAX)
      hixl_progress(ctx);                             /* retires our own puts' completions */
    CK(hixl_put(peer, addr, size, back, 0, 0, NULL)); /* the last one says "seen" */
    if (v == UINT64_MAX)
      break;
  }
  CK(hixl_fence(ctx, peer, -1));
  *seq = 0; /* the next run starts from 1 again */
}

/* The next notification.  While they flow (a ping-pong, a put_imm stream)
 * this polls flat out, then pauses and yields as hixl_notif_wait does; after
 * about 20 ms without any it polls once a millisecond.  A target that
 * waited in hixl_notif_wait through a whole one-sided test would take its
 * 50 us naps 20 000 times a second: on Soft-RoCE under emulation that CPU is
 * the one rxe's packet processing needs (write bandwidth fell to 0.7x of
 * ib_write_bw with it). */
static void next_notif(hixl_ctx_t *ctx, hixl_notif_t *n)
{
  /* The library's own wait: it polls for a few microseconds, which covers
   * a ping-pong's next message, then sleeps until one arrives. */
  hixl_status_t st = hixl_notif_wait(ctx, n, -1);
  if (st != HIXL_OK)
    die("hixl_notif_wait", st);
}

/* Serve one initiator until CTL_STOP.  Data notifications are dropped or,
 * after CTL_ECHO, answered; CTL_PUTPOLL runs the putpoll responder. */
static void serve(hixl_ctx_t *ctx, void *addr)
{
  hixl_rmr_t *back = NULL;
  bool echo = false;
  for (;;) {
    hixl_notif_t n;
    next_notif(ctx, &n);
    if ((n.imm & CTL) == CTL && back == NULL && n.imm != CTL_STOP)
      CK(hixl_rmr_lookup(n.peer, "perf-back", 10000, &back));
    if (n.imm == CTL_STOP)
      break;
    if (n.imm == CTL_ECHO || n.imm == CTL_SINK)
      echo = n.imm == CTL_ECHO;
    else if ((n.imm & 0xff000000u) == CTL_PUTPOLL)
      serve_putpoll(ctx, n.peer, back, addr, n.imm & 0xffffffu);
    else if (echo)
      CK(hixl_put_imm(n.peer, addr, n.len ? n.len : 8, back, 0, n.imm, 0, NULL));
  }
  if (back)
    hixl_rmr_release(back);
}

static void *g_self_mem; /* --transport self, -m reg: the target's region */

/* The target: one region, published as "perf", its address written to
 * out_fd (or printed with --server); then serve.  shared: the --transport
 * self case, where the target is our own context and serves nobody. */
static int run_target(const cfg_t *c, int out_fd, hixl_ctx_t *shared)
{
  hixl_ctx_t *ctx = shared;
  if (ctx == NULL)
    CK(hixl_ctx_create(NULL, &ctx));
  hixl_mr_t *mr;
  void *addr = NULL, *to_free = NULL;
  unsigned acc = HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC;
  if (c->dev_remote) {
    CK(hixl_mem_alloc(ctx, c->region, HIXL_MEM_DEVICE, acc, &addr, &mr));
  } else if (strcmp(c->mem, "reg") == 0) {
    if (posix_memalign(&to_free, 4096, c->region) != 0) {
      fprintf(stderr, "hixl-perf: no memory for a %zu-byte region\n", c->region);
      return 1;
    }
    addr = to_free;
    memset(addr, 0, c->region);
    CK(hixl_mr_reg(ctx, addr, c->region, acc, &mr));
  } else {
    CK(hixl_mem_alloc(ctx, c->region, HIXL_MEM_HOST, acc, &addr, &mr));
  }
  CK(hixl_mr_publish(mr, "perf"));
  if (shared) {
    g_self_mem = to_free; /* freed by main after the context */
    return 0;
  }
  if (out_fd >= 0) {
    /* The region's address too: the initiator's process_vm_writev reference. */
    dprintf(out_fd, "%s %llx\n", hixl_ctx_address(ctx), (unsigned long long)(uintptr_t)addr);
    close(out_fd);
  } else {
    printf("hixl-perf server: %s (region %zu bytes, %s memory); waiting for a client\n",
           hixl_ctx_address(ctx), c->region, c->dev_remote ? "device" : c->mem);
    fflush(stdout);
  }
  serve(ctx, addr);
  hixl_mr_dereg(mr);
  free(to_free);
  hixl_ctx_destroy(ctx);
  return 0;
}

/* --------------------------------------------------------------- initiator */

typedef struct result {
  size_t size; /* bytes per operation (per block for batches) */
  long iters, lat_iters;
  double p50_us, p99_us, gbps, mops, memcpy_gbps;
  double contig_gbps; /* batches: one put/get of the same bytes */
  double cma_gbps;    /* -m reg over shm: one process_vm_writev/readv of the same bytes */
} result_t;

typedef struct bench {
  const cfg_t *c;
  hixl_ctx_t *ctx;
  hixl_peer_t *peer;
  hixl_rmr_t *rmr;
  uint8_t *buf, *buf2; /* local: source of puts, destination of gets / echoes */
  uint8_t *ref;        /* with device memory: the reference copy's destination, of the
                        * target's kind */
  size_t buf_len;
  hixl_req_t **win; /* window of requests */
  uint64_t *olds;   /* atomics' results, one per window slot */
  hixl_xfer_t *xf;  /* batch entries */
  pid_t cma_pid;    /* -m reg, target forked here: its pid and region, for the */
  uint8_t *cma_mem; /* single process_vm_writev/readv reference (0 / NULL: none) */
} bench_t;

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void percentiles(result_t *r, double *lat, long n)
{
  qsort(lat, (size_t)n, sizeof(double), cmp_double);
  r->p50_us = lat[n / 2];
  r->p99_us = lat[(n * 99) / 100];
  r->lat_iters = n;
}

/* Issue operation i of the test (slot: its window slot, for atomics' old
 * values); req_p NULL for none. */
static hixl_status_t issue(bench_t *b, int test, size_t size, long slot, hixl_req_t **req_p)
{
  switch (test) {
  case T_PUT: return hixl_put(b->peer, b->buf, size, b->rmr, 0, 0, req_p);
  case T_GET: return hixl_get(b->peer, b->buf2, size, b->rmr, 0, 0, req_p);
  case T_PUT_IMM: return hixl_put_imm(b->peer, b->buf, size, b->rmr, 0, 1, 0, req_p);
  case T_PUT_BATCH: return hixl_put_batch(b->peer, b->xf, (size_t)b->c->batch, NULL, 0, req_p);
  case T_GET_BATCH: return hixl_get_batch(b->peer, b->xf, (size_t)b->c->batch, 0, req_p);
  case T_FAA: return hixl_atomic_faa(b->peer, b->rmr, 0, 1, &b->olds[slot], 0, req_p);
  default: return hixl_atomic_cas(b->peer, b->rmr, 0, 0, 1, &b->olds[slot], 0, req_p);
  }
}

/* The reference: one copy of size bytes between buffers of the kinds the
 * transfer moves between (memcpy for host memory; with device memory on a
 * side, the device runtime's copy through hixl_mem_copy). */
static double memcpy_gbps(size_t size, long iters, void *a, const void *b, bool dev)
{
  if (dev)
    CK(hixl_mem_copy(a, b, size)); /* warm */
  else
    memcpy(a, b, size);
  double t0 = now_s();
  for (long i = 0; i < iters; i++) {
    if (dev)
      CK(hixl_mem_copy(a, b, size));
    else
      memcpy(a, b, size);
    __asm__ volatile("" ::: "memory");
  }
  return (double)size * (double)iters / (now_s() - t0) / 1e9;
}

/* The reference of -m reg over shm: what one process_vm_writev (puts) or
 * process_vm_readv (gets) of the same bytes into the target's region does on
 * one thread; 0 where the kernel refuses (no CMA: hixl's owner copies). */
static double cma_gbps(const bench_t *b, bool put, size_t size, long iters)
{
  double t0 = 0;
  for (long i = -1; i < iters; i++) { /* -1: warm */
    if (i == 0)
      t0 = now_s();
    struct iovec l = {put ? b->buf : b->buf2, size}, r = {b->cma_mem, size};
    for (size_t done = 0; done < size;) {
      ssize_t n = put ? process_vm_writev(b->cma_pid, &l, 1, &r, 1, 0)
                      : process_vm_readv(b->cma_pid, &l, 1, &r, 1, 0);
      if (n <= 0)
        return 0;
      done += (size_t)n;
      l.iov_base = (uint8_t *)l.iov_base + n, l.iov_len -= (size_t)n;
      r.iov_base = (uint8_t *)r.iov_base + n, r.iov_len -= (size_t)n;
    }
  }
  return (double)size * (double)iters / (now_s() - t0) / 1e9;
}

static bool has_cma_ref(const bench_t *b)
{
  int t = b->c->test;
  return b->cma_mem != NULL && (t == T_PUT || t == T_GET || t == T_PUT_IMM);
}

/* Latency: each operation alone, with its completion. */
static void measure_lat(bench_t *b, int test, size_t size, long n, result_t *r)
{
  double *lat = malloc(sizeof(double) * (size_t)n);
  for (long i = 0; i < b->c->warmup; i++)
    CK(issue(b, test, size, 0, NULL));
  CK(hixl_fence(b->ctx, b->peer, -1));
  for (long i = 0; i < n; i++) {
    double t0 = now_s();
    hixl_status_t st = issue(b, test, size, 0, NULL);
    st = st ? st : hixl_fence(b->ctx, b->peer, -1);
    lat[i] = (now_s() - t0) * 1e6;
    if (st != HIXL_OK)
      die(test_names[test], st);
  }
  percentiles(r, lat, n);
  free(lat);
}

/* Wait for the request in a window slot, if any, and free it. */
static void retire(bench_t *b, int test, long slot)
{
  if (b->win[slot] == NULL)
    return;
  hixl_status_t st = hixl_req_wait(b->win[slot], -1);
  if (st != HIXL_OK)
    die(test_names[test], st);
  hixl_req_free(b->win[slot]);
  b->win[slot] = NULL;
}

/* Bandwidth / rate: n operations with up to W outstanding; returns seconds. */
static double run_window(bench_t *b, int test, size_t size, long n)
{
  int w = b->c->window;
  double t0 = now_s();
  for (long i = 0; i < n; i++) {
    long slot = i % w;
    retire(b, test, slot);
    hixl_status_t st = issue(b, test, size, slot, &b->win[slot]);
    if (st != HIXL_OK)
      die(test_names[test], st);
  }
  for (int k = 0; k < w; k++)
    retire(b, test, k);
  CK(hixl_fence(b->ctx, b->peer, -1)); /* put_imm's notifications, too */
  return now_s() - t0;
}

/* The figures of a ping-pong: lat[] holds n half round trips (us), t_all
 * the sum of the whole round trips (s); two messages per round. */
static void pingpong_figures(result_t *r, double *lat, long n, size_t size, double t_all)
{
  percentiles(r, lat, n);
  free(lat);
  r->gbps = 2.0 * (double)size * (double)n / t_all / 1e9;
  r->mops = 2.0 * (double)n / t_all / 1e6;
}

/* Half round trips of put_imm ping-pongs (see the top). */
static void pingpong(bench_t *b, size_t size, long n, result_t *r)
{
  CK(hixl_notify(b->peer, CTL_ECHO, 0, NULL));
  double *lat = malloc(sizeof(double) * (size_t)n);
  double t_all = 0;
  for (long i = -b->c->warmup; i < n; i++) {
    uint32_t imm = (uint32_t)(i & 0x7fffffff);
    double t0 = now_s();
    CK(hixl_put_imm(b->peer, b->buf, size, b->rmr, 0, imm, 0, NULL));
    hixl_notif_t nt;
    CK(hixl_notif_wait(b->ctx, &nt, -1));
    double dt = now_s() - t0;
    if (nt.imm != imm || nt.len != size) {
      fprintf(stderr, "hixl-perf: pingpong: got {%u, %zu}, want {%u, %zu}\n", nt.imm, nt.len, imm,
              size);
      exit(1);
    }
    if (i >= 0) {
      lat[i] = dt / 2 * 1e6;
      t_all += dt;
    }
  }
  CK(hixl_notify(b->peer, CTL_SINK, 0, NULL));
  pingpong_figures(r, lat, n, size, t_all);
}

/* Half round trips of puts noticed by polling memory (see the top). */
static void putpoll(bench_t *b, size_t size, long n, result_t *r)
{
  CK(hixl_notify(b->peer, CTL_PUTPOLL | (uint32_t)size, 0, NULL));
  double *lat = malloc(sizeof(double) * (size_t)n);
  volatile uint64_t *mine = (volatile uint64_t *)(b->buf2 + size - 8);
  uint64_t *out = (uint64_t *)(b->buf + size - 8);
  *mine = 0;
  double t_all = 0;
  long warm = b->c->warmup;
  for (long i = -warm; i < n; i++) {
    uint64_t seq = (uint64_t)(i + warm + 1);
    *out = seq;
    double t0 = now_s();
    CK(hixl_put(b->peer, b->buf, size, b->rmr, 0, 0, NULL));
    while (*mine != seq)
      hixl_progress(b->ctx);
    double dt = now_s() - t0;
    if (i >= 0) {
      lat[i] = dt / 2 * 1e6;
      t_all += dt;
    }
  }
  /* The end, and its echo: afterwards the target no longer watches the word
   * (the next test may overwrite it). */
  *out = UINT64_MAX;
  CK(hixl_put(b->peer, b->buf, size, b->rmr, 0, 0, NULL));
  while (*mine != UINT64_MAX)
    hixl_progress(b->ctx);
  CK(hixl_fence(b->ctx, b->peer, -1));
  pingpong_figures(r, lat, n, size, t_all);
}

/* Scatter B blocks of size over both sides: a random permutation of 2B
 * slots on each side, so no two blocks are adjacent in order. */
static void setup_batch(bench_t *b, size_t size)
{
  int nb = b->c->batch;
  size_t slots = 2 * (size_t)nb;
  uint32_t *perm = malloc(sizeof(uint32_t) * slots);
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (int side = 0; side < 2; side++) {
    for (size_t k = 0; k < slots; k++)
      perm[k] = (uint32_t)k;
    for (size_t k = slots - 1; k > 0; k--) { /* Fisher-Yates, xorshift */
      seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
      size_t j = seed % (k + 1);
      uint32_t t = perm[k];
      perm[k] = perm[j], perm[j] = t;
    }
    for (int k = 0; k < nb; k++) {
      if (side == 0)
        b->xf[k].local = (b->c->test == T_PUT_BATCH ? b->buf : b->buf2) + perm[k] * size;
      else
        b->xf[k].off = perm[k] * size;
      b->xf[k].rmr = b->rmr;
      b->xf[k].len = size;
    }
  }
  free(perm);
}

static result_t measure(bench_t *b, size_t size, long iters)
{
  const cfg_t *c = b->c;
  result_t r = {.size = size, .iters = iters};
  long lat_n = iters < MAX_LAT_ITERS ? iters : MAX_LAT_ITERS;
  size_t bytes = size * (is_batch(c->test) ? (size_t)c->batch : 1);
  if (c->test == T_PINGPONG) {
    pingpong(b, size, lat_n, &r);
  } else if (c->test == T_PUTPOLL) {
    putpoll(b, size, lat_n, &r);
  } else {
    if (is_batch(c->test))
      setup_batch(b, size);
    if (c->lat)
      measure_lat(b, c->test, size, lat_n, &r);
    if (c->bw) {
      run_window(b, c->test, size, c->warmup < iters ? c->warmup : iters);
      double dt = run_window(b, c->test, size, iters);
      r.gbps = (is_atomic(c->test) ? 8.0 : (double)bytes) * (double)iters / dt / 1e9;
      r.mops = (double)iters / dt / 1e6;
      if (is_batch(c->test)) { /* one contiguous op of the same bytes */
        int one = c->test == T_PUT_BATCH ? T_PUT : T_GET;
        run_window(b, one, bytes, c->warmup < iters ? c->warmup : iters);
        r.contig_gbps = (double)bytes * (double)iters / run_window(b, one, bytes, iters) / 1e9;
      }
    }
  }
  bool dev = b->c->dev_local || b->c->dev_remote;
  r.memcpy_gbps =
      memcpy_gbps(bytes, iters < 100000 ? iters : 100000, dev ? b->ref : b->buf2, b->buf, dev);
  if (has_cma_ref(b) && c->bw)
    r.cma_gbps = cma_gbps(b, c->test != T_GET, bytes, iters < 100000 ? iters : 100000);
  return r;
}

static long iters_for(size_t bytes, bool quick)
{
  /* About 256 MiB moved per size (less when quick), at least 20 ops. */
  long n = (long)(((size_t)(quick ? 16 : 256) << 20) / (bytes ? bytes : 1));
  long max = quick ? 2000 : 200000;
  return n < 20 ? 20 : n > max ? max : n;
}

/* The data really moved: a pattern put, read back with a get, compared. */
static bool check_data(bench_t *b)
{
  size_t n = b->buf_len < ((size_t)1 << 20) ? b->buf_len : (size_t)1 << 20;
  uint8_t *want = malloc(n), *got = malloc(n);
  for (size_t k = 0; k < n; k++)
    want[k] = (uint8_t)(k * 7 + 3);
  CK(hixl_mem_copy(b->buf, want, n)); /* device memory too */
  CK(hixl_put(b->peer, b->buf, n, b->rmr, 4096, 0, NULL));
  CK(hixl_fence(b->ctx, b->peer, -1));
  CK(hixl_get(b->peer, b->buf2, n, b->rmr, 4096, 0, NULL));
  CK(hixl_fence(b->ctx, b->peer, -1));
  CK(hixl_mem_copy(got, b->buf2, n));
  bool ok = memcmp(want, got, n) == 0;
  if (!ok)
    fprintf(stderr, "hixl-perf: data check failed\n");
  free(want);
  free(got);
  return ok;
}

static void print_row(const bench_t *b, const result_t *r, FILE *jf, bool first)
{
  const cfg_t *c = b->c;
  char p50[32] = "-", p99[32] = "-", gb[32] = "-", mo[32] = "-", ra[32] = "-";
  if (r->lat_iters) {
    snprintf(p50, sizeof(p50), "%.3f", r->p50_us);
    snprintf(p99, sizeof(p99), "%.3f", r->p99_us);
  }
  if (r->mops > 0) {
    snprintf(gb, sizeof(gb), "%.4g", r->gbps);
    snprintf(mo, sizeof(mo), "%.4g", r->mops);
    snprintf(ra, sizeof(ra), "%.3g", r->gbps / r->memcpy_gbps);
  }
  printf("%10zu %8ld %10s %10s %10s %10s %12.4g %8s", r->size, r->iters, p50, p99, gb, mo,
         r->memcpy_gbps, ra);
  if (is_batch(c->test) && r->contig_gbps > 0)
    printf(" %12.4g %8.3g", r->contig_gbps, r->gbps / r->contig_gbps);
  if (has_cma_ref(b) && r->cma_gbps > 0 && r->mops > 0)
    printf(" %12.4g %8.3g", r->cma_gbps, r->gbps / r->cma_gbps);
  else if (has_cma_ref(b))
    printf(" %12s %8s", "-", "-");
  printf("\n");
  fflush(stdout);
  if (!jf)
    return;
  fprintf(jf, "%s{\"size\":%zu,\"iters\":%ld", first ? "" : ",", r->size, r->iters);
  if (r->lat_iters)
    fprintf(jf, ",\"p50_us\":%.4f,\"p99_us\":%.4f", r->p50_us, r->p99_us);
  if (r->mops > 0)
    fprintf(jf, ",\"gbps\":%.4f,\"mops\":%.4f", r->gbps, r->mops);
  fprintf(jf, ",\"memcpy_gbps\":%.4f", r->memcpy_gbps);
  if (r->contig_gbps > 0)
    fprintf(jf, ",\"contig_gbps\":%.4f", r->contig_gbps);
  if (r->cma_gbps > 0)
    fprintf(jf, ",\"cma_gbps\":%.4f", r->cma_gbps);
  fprintf(jf, "}");
}

static bool sane(const cfg_t *c, const result_t *r)
{
  bool ok = isfinite(r->memcpy_gbps) && r->memcpy_gbps > 0;
  if (r->lat_iters)
    ok = ok && r->p50_us > 0 && r->p99_us >= r->p50_us && isfinite(r->p99_us);
  if (c->bw || is_pingpong(c->test))
    ok = ok && isfinite(r->gbps) && r->gbps > 0 && r->mops > 0;
  if (is_batch(c->test) && c->bw)
    ok = ok && isfinite(r->contig_gbps) && r->contig_gbps > 0;
  return ok;
}

static int run_initiator(const cfg_t *c, hixl_ctx_t *ctx, const char *addr, pid_t target_pid,
                         uint64_t target_mem)
{
  bench_t b = {.c = c, .ctx = ctx};
  if (target_pid > 0 && target_mem && strcmp(c->mem, "reg") == 0 && !c->dev_local &&
      !c->dev_remote) {
    b.cma_pid = target_pid;
    b.cma_mem = (uint8_t *)(uintptr_t)target_mem;
  }
  CK(hixl_connect(ctx, addr, 10000, &b.peer));
  CK(hixl_rmr_lookup(b.peer, "perf", 10000, &b.rmr));

  /* Local buffers big enough for the largest transfer (batches: 2B slots),
   * registered as a zero-copy user would have them (RDMA transports then
   * need no bounce copies), of the same kind as the target's: the ping-pongs'
   * answers land in buf2 ("perf-back"), so with -m alloc it must be memory a
   * same-host target maps, not reaches with a system call per put: it grants
   * READ as well as WRITE, since shm maps only regions that grant READ (a
   * mapping always reads; docs/security.md), and a write-only region is
   * reached with process_vm_writev (about 0.5 us here per echo). */
  const unsigned back_acc = HIXL_ACCESS_READ | HIXL_ACCESS_WRITE;
  b.buf_len = bytes_needed(c);
  hixl_mr_t *lmr1, *lmr2, *lmr3 = NULL;
  if (c->dev_local) {
    CK(hixl_mem_alloc(ctx, b.buf_len, HIXL_MEM_DEVICE, 0, (void **)&b.buf, &lmr1));
    CK(hixl_mem_alloc(ctx, b.buf_len, HIXL_MEM_DEVICE, back_acc, (void **)&b.buf2, &lmr2));
  } else if (strcmp(c->mem, "alloc") == 0) {
    CK(hixl_mem_alloc(ctx, b.buf_len, HIXL_MEM_HOST, 0, (void **)&b.buf, &lmr1));
    CK(hixl_mem_alloc(ctx, b.buf_len, HIXL_MEM_HOST, back_acc, (void **)&b.buf2, &lmr2));
  } else {
    if (posix_memalign((void **)&b.buf, 4096, b.buf_len) ||
        posix_memalign((void **)&b.buf2, 4096, b.buf_len)) {
      fprintf(stderr, "hixl-perf: no memory for 2 x %zu bytes\n", b.buf_len);
      return 1;
    }
    CK(hixl_mr_reg(ctx, b.buf, b.buf_len, 0, &lmr1));
    CK(hixl_mr_reg(ctx, b.buf2, b.buf_len, back_acc, &lmr2));
  }
  if (c->dev_local || c->dev_remote) /* the reference copy's destination */
    CK(hixl_mem_alloc(ctx, b.buf_len, c->dev_remote ? HIXL_MEM_DEVICE : HIXL_MEM_HOST, 0,
                      (void **)&b.ref, &lmr3));
  if (!c->dev_local) {
    memset(b.buf, 1, b.buf_len);
    memset(b.buf2, 2, b.buf_len);
  }                                       /* device memory comes zeroed */
  CK(hixl_mr_publish(lmr2, "perf-back")); /* ping-pongs: the target answers here */
  b.win = calloc((size_t)c->window, sizeof(*b.win));
  b.olds = calloc((size_t)c->window, sizeof(*b.olds));
  b.xf = calloc((size_t)c->batch, sizeof(*b.xf));

  const char *tp = hixl_peer_transport(b.peer);
  printf("# hixl-perf %s over %s (memory: %s here, %s at the target; window %d",
         test_names[c->test], tp, c->dev_local ? "device" : c->mem,
         c->dev_remote ? "device" : c->mem, c->window);
  if (is_batch(c->test))
    printf(", %d scattered blocks per batch", c->batch);
  printf("); %s measured in the same run\n",
         c->dev_local || c->dev_remote ? "hixl_mem_copy (the device runtime's copy)" : "memcpy");
  printf("%10s %8s %10s %10s %10s %10s %12s %8s", "size", "iters", "p50(us)", "p99(us)", "GB/s",
         "Mops/s", "memcpy GB/s", "ratio");
  if (is_batch(c->test))
    printf(" %12s %8s", "contig GB/s", "batch/1");
  if (has_cma_ref(&b))
    printf(" %12s %8s", c->test == T_GET ? "readv GB/s" : "writev GB/s", "hixl/cma");
  printf("\n");
  FILE *jf = NULL;
  if (c->json && (jf = fopen(c->json, "w")) == NULL) {
    fprintf(stderr, "hixl-perf: %s: %s\n", c->json, strerror(errno));
    return 1;
  }
  if (jf)
    fprintf(jf,
            "{\"tool\":\"hixl-perf\",\"test\":\"%s\",\"transport\":\"%s\",\"mem\":\"%s\","
            "\"mem_local\":\"%s\",\"mem_remote\":\"%s\",\"device_backend\":\"%s\","
            "\"window\":%d,\"batch\":%d,\"results\":[",
            test_names[c->test], tp, c->mem, c->dev_local ? "device" : "host",
            c->dev_remote ? "device" : "host", hixl_device_backend(), c->window,
            is_batch(c->test) ? c->batch : 1);
  bool ok = true;
  for (int i = 0; i < c->nsizes; i++) {
    size_t bytes = c->sizes[i] * (is_batch(c->test) ? (size_t)c->batch : 1);
    long n = c->iters ? c->iters : iters_for(bytes, c->quick);
    result_t r = measure(&b, c->sizes[i], n);
    print_row(&b, &r, jf, i == 0);
    ok = ok && sane(c, &r);
  }
  if (jf) {
    fprintf(jf, "]}\n");
    fclose(jf);
  }
  if (!is_atomic(c->test))
    ok = check_data(&b) && ok;
  CK(hixl_fence(ctx, b.peer, -1));
  CK(hixl_notify(b.peer, CTL_STOP, 0, NULL));
  /* The server ends its context as soon as it sees CTL_STOP, which can be
   * before the provider's acknowledgement of that notification reached us
   * (fabric, manual progress): a peer gone after STOP is the expected end. */
  hixl_status_t fst = hixl_fence(ctx, b.peer, -1);
  if (fst != HIXL_OK && fst != HIXL_ERR_PEER_LOST)
    CK(fst);
  hixl_rmr_release(b.rmr);
  hixl_mr_dereg(lmr1);
  hixl_mr_dereg(lmr2);
  if (lmr3)
    hixl_mr_dereg(lmr3);
  if (strcmp(c->mem, "alloc") != 0 && !c->dev_local) {
    free(b.buf);
    free(b.buf2);
  }
  hixl_disconnect(b.peer);
  free(b.win);
  free(b.olds);
  free(b.xf);
  if (!ok)
    fprintf(stderr, "hixl-perf: insane result\n");
  return ok ? 0 : 1;
}

/* ------------------------------------------------------------------- main */

static void usage(void)
{
  fprintf(stderr,
          "usage: hixl-perf [-t TEST] [-s SIZE | -a [--max SIZE]] [-n ITERS] [-W WARMUP]\n"
          "                 [-w WINDOW] [-b BLOCKS] [--lat | --bw] [-m alloc|reg]\n"
          "                 [--mem host|device[,host|device]]\n"
          "                 [--transport NAME] [--server | --client ADDR] [--region BYTES]\n"
          "                 [--json FILE] [--quick]\n"
          "  -t TEST     put get put_imm put_batch get_batch faa cas pingpong putpoll\n"
          "              pingpong: put_imm each way, half round trip (ib_send_lat's method)\n"
          "              putpoll: put each way, each side polling its memory, half round\n"
          "              trip (ib_write_lat's and ucp_put_lat's method)\n"
          "  -s SIZE     one size (bytes; k/m/g suffixes); per block for batches\n"
          "  -a          sweep sizes 8 B .. --max (default 64m) by 4x (the default)\n"
          "  -n ITERS    operations per size (default: about 256 MiB moved)\n"
          "  -W WARMUP   operations before timing (default 16)\n"
          "  -w WINDOW   operations outstanding in bandwidth mode (default 64)\n"
          "  -b BLOCKS   blocks per batch (default 1024)\n"
          "  --lat/--bw  only latency / only bandwidth (default both)\n"
          "  -m alloc    memory from hixl_mem_alloc, both sides (shm maps it: a memcpy per put)\n"
          "  -m reg      memory from malloc + hixl_mr_reg, both sides (CMA on shm)\n"
          "  --mem L[,R] host or device memory here (L) and at the target (R; default L):\n"
          "              device = hixl_mem_alloc(HIXL_MEM_DEVICE) of the device backend\n"
          "              (HIXL_DEVICE: cuda, ascend, emulated); the reference copy is then\n"
          "              hixl_mem_copy between the same kinds.  --server: R is its region\n"
          "  --transport self|shm|verbs|...  (self: one process, no target)\n"
          "  --server    run the target only, print its address, serve one client\n"
          "  --client A  run the initiator only, against a --server at address A\n"
          "  --region B  target region size (default: 64m, or what the sizes need)\n"
          "  --cpus I,T  pin the initiator to CPU I and the target to CPU T\n"
          "  --json FILE write the results as JSON\n"
          "  --quick     few iterations; checks that numbers are sane (test suite)\n");
  exit(2);
}

/* Pin the calling process (and the threads it will start) to one CPU. */
static void pin(int cpu)
{
  if (cpu < 0)
    return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0)
    fprintf(stderr, "hixl-perf: cannot pin to CPU %d: %s\n", cpu, strerror(errno));
}

static size_t parse_size(const char *s)
{
  char *end;
  unsigned long long v = strtoull(s, &end, 0);
  switch (*end) {
  case 'k':
  case 'K':
    v <<= 10;
    end++;
    break;
  case 'm':
  case 'M':
    v <<= 20;
    end++;
    break;
  case 'g':
  case 'G':
    v <<= 30;
    end++;
    break;
  default: break;
  }
  if (*end || end == s) {
    fprintf(stderr, "hixl-perf: bad size '%s'\n", s);
    exit(2);
  }
  return (size_t)v;
}

int main(int argc, char **argv)
{
  cfg_t c = {.test = T_PUT,
             .max_size = (size_t)64 << 20,
             .warmup = 16,
             .window = 64,
             .batch = 1024,
             .lat = true,
             .bw = true,
             .mem = "alloc",
             .transport = NULL,
             .cpu_init = -1,
             .cpu_target = -1};
  static const struct option opts[] = {{"transport", required_argument, 0, 'T'},
                                       {"json", required_argument, 0, 'j'},
                                       {"quick", no_argument, 0, 'q'},
                                       {"lat", no_argument, 0, 'L'},
                                       {"bw", no_argument, 0, 'B'},
                                       {"max", required_argument, 0, 'M'},
                                       {"server", no_argument, 0, 'S'},
                                       {"client", required_argument, 0, 'C'},
                                       {"region", required_argument, 0, 'R'},
                                       {"cpus", required_argument, 0, 'P'},
                                       {"mem", required_argument, 0, 'D'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int o;
  const char *test = "put";
  while ((o = getopt_long(argc, argv, "t:s:an:W:w:b:m:h", opts, NULL)) != -1) {
    switch (o) {
    case 't': test = optarg; break;
    case 's': c.size = parse_size(optarg); break;
    case 'a': c.size = 0; break;
    case 'n': c.iters = atol(optarg); break;
    case 'W': c.warmup = atol(optarg); break;
    case 'w': c.window = atoi(optarg); break;
    case 'b': c.batch = atoi(optarg); break;
    case 'm': c.mem = optarg; break;
    case 'T': c.transport = optarg; break;
    case 'j': c.json = optarg; break;
    case 'q': c.quick = true; break;
    case 'L': c.bw = false; break;
    case 'B': c.lat = false; break;
    case 'M': c.max_size = parse_size(optarg); break;
    case 'S': c.server = true; break;
    case 'C': c.client = optarg; break;
    case 'R': c.region = parse_size(optarg); break;
    case 'P':
      if (sscanf(optarg, "%d,%d", &c.cpu_init, &c.cpu_target) != 2)
        usage();
      break;
    case 'D': {
      char l[16] = "", r[16] = "";
      int k = sscanf(optarg, "%15[a-z],%15[a-z]", l, r);
      if (k < 1 || (strcmp(l, "host") && strcmp(l, "device")) ||
          (k == 2 && strcmp(r, "host") && strcmp(r, "device")) ||
          strlen(optarg) != strlen(l) + (k == 2 ? 1 + strlen(r) : 0))
        usage();
      c.dev_local = strcmp(l, "device") == 0;
      c.dev_remote = strcmp(k == 2 ? r : l, "device") == 0;
      break;
    }
    default: usage();
    }
  }
  c.test = -1;
  for (int i = 0; i < NTESTS; i++)
    if (strcmp(test, test_names[i]) == 0)
      c.test = i;
  if (c.test < 0 || optind != argc || c.iters < 0 || c.warmup < 0 || c.window < 1 ||
      c.window > 65536 || c.batch < 1 || c.batch > (1 << 20) || (!c.lat && !c.bw) ||
      (strcmp(c.mem, "alloc") && strcmp(c.mem, "reg")) || (c.server && c.client) || c.max_size < 8)
    usage();
  bool self = c.transport && strcmp(c.transport, "self") == 0;
  if (is_pingpong(c.test) && self) {
    fprintf(stderr, "hixl-perf: %s needs a target process (not --transport self)\n", test);
    return 2;
  }
  if (c.test == T_PUTPOLL && (c.dev_local || c.dev_remote)) {
    fprintf(stderr, "hixl-perf: putpoll polls memory with the CPU: host memory only\n");
    return 2;
  }
  if (c.transport && !self)
    setenv("HIXL_TRANSPORTS", c.transport, 1);
  pick_sizes(&c);
  if (c.server) /* the client picks the tests: the data check's need only */
    c.nsizes = 0;
  size_t need = bytes_needed(&c);
  if (c.region == 0)
    c.region = need > MIN_REGION ? need : MIN_REGION;
  else if (!c.client && c.region < need) {
    fprintf(stderr, "hixl-perf: --region %zu is smaller than the %zu bytes the test needs\n",
            c.region, need);
    return 2;
  }
  c.region = (c.region + 4095) & ~(size_t)4095;

  clock_init();
  if (c.server) {
    pin(c.cpu_target);
    return run_target(&c, -1, NULL);
  }
  hixl_ctx_t *ctx = NULL;
  char addr[256] = {0};
  pid_t pid = -1;
  unsigned long long target_mem = 0;
  if (c.client) {
    snprintf(addr, sizeof(addr), "%s", c.client);
  } else if (self) {
    CK(hixl_ctx_create(NULL, &ctx));
    if (run_target(&c, -1, ctx) != 0)
      return 1;
    snprintf(addr, sizeof(addr), "%s", hixl_ctx_address(ctx));
  } else {
    int from_target[2];
    if (pipe(from_target))
      return 1;
    pid_t parent = getpid();
    pid = fork();
    if (pid == 0) {
      close(from_target[0]);
      prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive the initiator */
      if (getppid() != parent)
        _exit(1);
      pin(c.cpu_target);
      /* Two RDMA devices on one host (Soft-RoCE tests): the target's own. */
      const char *dev = getenv("HIXL_PERF_TARGET_NET_DEV");
      if (dev)
        setenv("HIXL_NET_DEV", dev, 1);
      _exit(run_target(&c, from_target[1], NULL));
    }
    close(from_target[1]);
    ssize_t n = read(from_target[0], addr, sizeof(addr) - 1);
    close(from_target[0]);
    if (n <= 0) {
      fprintf(stderr, "hixl-perf: the target did not start\n");
      waitpid(pid, NULL, 0);
      return 1;
    }
    addr[strcspn(addr, "\n")] = 0;
    char *sp = strchr(addr, ' '); /* "ADDRESS REGION" */
    if (sp) {
      *sp = 0;
      target_mem = strtoull(sp + 1, NULL, 16);
    }
  }
  pin(c.cpu_init);
  if (ctx == NULL) /* only now: fork before any hixl thread exists */
    CK(hixl_ctx_create(NULL, &ctx));
  int rc = run_initiator(&c, ctx, addr, pid, target_mem);
  hixl_ctx_destroy(ctx);
  free(g_self_mem);
  if (pid > 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "hixl-perf: the target failed (status %#x)\n", status);
      rc = 1;
    }
  }
  return rc;
}

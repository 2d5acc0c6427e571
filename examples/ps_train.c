/* SPDX-License-Identifier: MIT */
/*
 * ps_train: parameter-server training with one-sided operations (the seeds'
 * example 000), verified against a single-process run of the same algorithm.
 *
 * Rank 0 is the parameter server (PS), ranks 1..N-1 are workers.  The model
 * is linear regression, y = x . w, on synthetic data: worker r's samples
 * come from its own seeded stream, the labels from a hidden w_true plus
 * noise, so the loss truly falls.  Each step:
 *
 *   worker: compute the gradient of its minibatch (and the loss) into its
 *           registered "grad" buffer, then hixl_notify(PS, step): "ready";
 *   PS:     on N-1 notifications, hixl_get every worker's gradient, average
 *           them (in rank order), update w, hixl_put_imm the new w into every
 *           worker's registered "param" buffer (the notification says
 *           "version step+1 is there"), and fence;
 *   worker: wait for that notification, go on.
 *
 * Workers never receive anything two-sided: the PS pulls and pushes.  With
 * --mode twosided (or both, the default) the same steps run again with the
 * same data moved by plain TCP send/recv, and the one-sided/two-sided ratio
 * is printed from the same run.  At the end the PS recomputes everything in
 * one process and compares the parameters bit for bit (same code, same
 * order of floating-point operations): exit 1 on any difference.
 *
 * Start it with torchrun (python3 -m torch.distributed.run --no_python
 * --nproc_per_node 4 hixl-ps-train: the world rendezvous goes through
 * torchrun's store), with torchrun's variables by hand (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT), or let it fork N local ranks itself:
 * ps_train --launch 4
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <hixl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                                \
  do {                                                                                             \
    hixl_status_t st_ = (call);                                                                    \
    if (st_ != HIXL_OK) {                                                                          \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", g_rank, #call, hixl_strerror(st_),          \
              hixl_last_error());                                                                  \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static _Thread_local int g_rank = -1;

/* ------------------------------------------------------------ the group */

/* A world of processes (hixl_world_*), or with --self N the ranks as threads
 * of one context, reaching each other through one self peer. */
static hixl_world_t *g_world;
static hixl_peer_t *g_selfpeer;
static int g_size;
static pthread_barrier_t g_bar;

static hixl_peer_t *peer_of(int r) { return g_world ? hixl_world_peer(g_world, r) : g_selfpeer; }

static void barrier(void)
{
  if (g_world)
    CHECK(hixl_world_barrier(g_world));
  else
    pthread_barrier_wait(&g_bar);
}

/* Every rank's region of this kind, in rmrs[rank]. */
static void exchange(hixl_mr_t *mr, hixl_rmr_t **rmrs, const char *what)
{
  if (g_world) {
    CHECK(hixl_world_exchange(g_world, mr, rmrs));
    return;
  }
  char name[64];
  snprintf(name, sizeof(name), "%s%d", what, g_rank);
  CHECK(hixl_mr_publish(mr, name));
  barrier();
  for (int r = 0; r < g_size; r++) {
    snprintf(name, sizeof(name), "%s%d", what, r);
    CHECK(hixl_rmr_lookup(g_selfpeer, name, 10000, &rmrs[r]));
  }
  barrier();
}

/* Immediates carry their destination rank in the top byte: with --self all
 * ranks share one notification queue, and a thread that takes another
 * rank's notification leaves it in that rank's mailbox. */
#define IMM(dest, value) ((uint32_t)(dest) << 24 | (uint32_t)(value))
/* A worker's compute report to the PS after the last step: IMM(0, REPORT)
 * plus its mean compute time per step in us (steps stay below REPORT). */
#define REPORT 0x800000u
#define REPORT_US_MASK 0x7fffffu
#define MAX_SELF 64
static pthread_mutex_t g_mbox_lock = PTHREAD_MUTEX_INITIALIZER;
static hixl_notif_t g_mbox[MAX_SELF][64];
static int g_mbox_n[MAX_SELF];

static void take(hixl_ctx_t *ctx, hixl_notif_t *n)
{
  if (g_world) {
    CHECK(hixl_notif_wait(ctx, n, -1));
    return;
  }
  for (;;) {
    pthread_mutex_lock(&g_mbox_lock);
    int got = 0;
    if (g_mbox_n[g_rank] > 0) {
      *n = g_mbox[g_rank][0];
      memmove(g_mbox[g_rank], g_mbox[g_rank] + 1, sizeof(*n) * (size_t)--g_mbox_n[g_rank]);
      got = 1;
    } else if (hixl_notif_poll(ctx, n, 1) == 1) {
      int dest = (int)(n->imm >> 24);
      if (dest == g_rank) {
        got = 1;
      } else if (dest < g_size && g_mbox_n[dest] < 64) {
        g_mbox[dest][g_mbox_n[dest]++] = *n;
      } else {
        fprintf(stderr, "rank %d: notification for rank %d lost\n", g_rank, dest);
        exit(1);
      }
    }
    pthread_mutex_unlock(&g_mbox_lock);
    if (got)
      return;
    hixl_progress(ctx);
    sched_yield();
  }
}

typedef struct opts {
  size_t params; /* P */
  int steps;     /* S */
  int batch;     /* samples per worker per step */
  float lr;
  bool onesided, twosided;
  int launch;     /* > 0: fork this many local ranks */
  int self_ranks; /* > 0: this many ranks as threads of one context (self) */
} opts_t;

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of the calling thread: a worker's compute, not counting the
 * time other ranks held its CPU (ranks may outnumber the cores). */
static double cpu_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *xalloc(size_t n)
{
  void *p = NULL;
  if (posix_memalign(&p, 4096, n ? n : 1) != 0) {
    fprintf(stderr, "rank %d: out of memory (%zu bytes)\n", g_rank, n);
    exit(1);
  }
  return p;
}

/* ------------------------------------------------------------ the model */

/* splitmix64: the synthetic data is a pure function of (seed, index). */
static uint64_t mix(uint64_t x)
{
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A float in [-1, 1) from (seed, index). */
static float unit(uint64_t seed, uint64_t i)
{
  return (float)((double)(mix(seed * 0x100000001b3ull + i) >> 11) * 0x1p-52 - 1.0);
}

/* Worker r's shard: SHARD samples, visited in turn (epoch after epoch), so
 * the training loss falls as the model fits them.  Feature j of sample s,
 * and the hidden true weights. */
#define SHARD 16
static float feature(int r, int s, size_t j) { return unit(((uint64_t)r << 32) ^ (uint64_t)s, j); }
static float w_true(size_t j) { return unit(0xC0FFEE, j); }

/* Gradient of the mean squared error of worker r's minibatch at step t,
 * into g[0..p), the loss into g[p].  Every rank and the reference call this
 * same function: identical floating-point operations in identical order. */
static void gradient(int r, int t, const opts_t *o, const float *w, float *g)
{
  size_t p = o->params;
  memset(g, 0, sizeof(float) * (p + 1));
  double loss = 0;
  for (int i = 0; i < o->batch; i++) {
    int smp = (int)(((long)t * o->batch + i) % SHARD);
    float pred = 0, y = 0;
    for (size_t j = 0; j < p; j++) {
      float x = feature(r, smp, j);
      pred += x * w[j];
      y += x * w_true(j);
    }
    y += 0.01f * unit(0xA015E ^ (uint64_t)r, (uint64_t)smp);
    float err = pred - y;
    loss += (double)err * err;
    float k = 2.0f * err / (float)o->batch;
    for (size_t j = 0; j < p; j++)
      g[j] += k * feature(r, smp, j);
  }
  g[p] = (float)(loss / o->batch);
}

/* The PS's update from the workers' gradients, in rank order. */
static float update(const opts_t *o, int workers, float *w, float *const *grads)
{
  size_t p = o->params;
  float scale = o->lr / (float)workers;
  double loss = 0;
  for (size_t j = 0; j < p; j++) {
    float sum = 0;
    for (int k = 0; k < workers; k++)
      sum += grads[k][j];
    w[j] -= scale * sum;
  }
  for (int k = 0; k < workers; k++)
    loss += grads[k][p];
  return (float)(loss / workers);
}

/* The whole run in one process: what the PS must end up with. */
static void reference(const opts_t *o, int workers, float *w)
{
  size_t p = o->params;
  memset(w, 0, sizeof(float) * p);
  float **g = malloc(sizeof(float *) * (size_t)workers);
  for (int k = 0; k < workers; k++)
    g[k] = xalloc(sizeof(float) * (p + 1));
  for (int t = 0; t < o->steps; t++) {
    for (int k = 0; k < workers; k++)
      gradient(k + 1, t, o, w, g[k]);
    update(o, workers, w, g);
  }
  for (int k = 0; k < workers; k++)
    free(g[k]);
  free(g);
}

/* ------------------------------------------------------------ one-sided */

/* Wait for a notification from peer with imm == want (others: an error). */
static void wait_notif(hixl_ctx_t *ctx, hixl_peer_t *from, uint32_t want)
{
  hixl_notif_t n;
  take(ctx, &n);
  if ((g_world && n.peer != from) || n.imm != want) {
    fprintf(stderr, "rank %d: unexpected notification imm %u (want %u)\n", g_rank, n.imm, want);
    exit(1);
  }
}

typedef struct run_stats {
  double seconds, bytes;
  double comm;        /* PS seconds spent moving gradients in and parameters out */
  double update;      /* PS seconds spent averaging and applying gradients */
  double compute;     /* the slowest worker's CPU seconds computing gradients (one-sided) */
  double compute_sum; /* every worker's, together */
  float last_loss;
} run_stats_t;

static run_stats_t onesided(hixl_ctx_t *ctx, const opts_t *o, float *final_w)
{
  int size = g_size, workers = size - 1;
  size_t p = o->params;
  size_t pbytes = sizeof(float) * p, gbytes = sizeof(float) * (p + 1);
  unsigned rw = HIXL_ACCESS_READ | HIXL_ACCESS_WRITE;
  /* Every rank has a parameter and a gradient buffer (the PS: its global
   * parameters and one gradient slot per worker), from hixl_mem_alloc: the
   * memory every transport reaches best (shm maps it into the peers, verbs
   * registers it once). */
  float *param, *grad;
  hixl_mr_t *pmr, *gmr;
  CHECK(hixl_mem_alloc(ctx, pbytes, HIXL_MEM_HOST, rw, (void **)&param, &pmr));
  CHECK(hixl_mem_alloc(ctx, g_rank == 0 ? gbytes * (size_t)workers : gbytes, HIXL_MEM_HOST, rw,
                       (void **)&grad, &gmr));
  memset(param, 0, pbytes);
  hixl_rmr_t **prm = calloc((size_t)size, sizeof(*prm));
  hixl_rmr_t **grm = calloc((size_t)size, sizeof(*grm));
  exchange(pmr, prm, "param");
  exchange(gmr, grm, "grad");
  hixl_peer_t *ps = peer_of(0);
  run_stats_t st = {0};
  barrier();
  double t_start = now_s();
  if (g_rank == 0) {
    float **gk = malloc(sizeof(float *) * (size_t)workers);
    hixl_req_t **reqs = malloc(sizeof(*reqs) * (size_t)workers);
    for (int k = 0; k < workers; k++)
      gk[k] = grad + (p + 1) * (size_t)k;
    /* Version 0: the initial parameters into every worker. */
    for (int r = 1; r < size; r++)
      CHECK(hixl_put_imm(peer_of(r), param, pbytes, prm[r], 0, IMM(r, 0), 0, NULL));
    CHECK(hixl_fence(ctx, NULL, -1));
    for (int t = 0; t < o->steps; t++) {
      double t0 = now_s();
      /* N-1 "ready" notifications, in any order. */
      for (int k = 0; k < workers; k++) {
        hixl_notif_t n;
        take(ctx, &n);
        if (n.imm != IMM(0, t)) {
          fprintf(stderr, "PS: notification for step %u during step %d\n", n.imm, t);
          exit(1);
        }
      }
      /* Pull every gradient (all in flight at once), then average. */
      double c0 = now_s();
      for (int r = 1; r < size; r++)
        CHECK(hixl_get(peer_of(r), gk[r - 1], gbytes, grm[r], 0, 0, &reqs[r - 1]));
      for (int k = 0; k < workers; k++) {
        CHECK(hixl_req_wait(reqs[k], -1));
        hixl_req_free(reqs[k]);
      }
      st.comm += now_s() - c0;
      double u0 = now_s();
      float loss = update(o, workers, param, gk);
      st.update += now_s() - u0;
      /* Push version t+1 to everyone; its notification follows the data. */
      c0 = now_s();
      for (int r = 1; r < size; r++)
        CHECK(hixl_put_imm(peer_of(r), param, pbytes, prm[r], 0, IMM(r, t + 1), 0, NULL));
      CHECK(hixl_fence(ctx, NULL, -1));
      st.comm += now_s() - c0;
      double dt = now_s() - t0;
      double bytes = (double)workers * (double)(gbytes + pbytes);
      st.bytes += bytes;
      st.last_loss = loss;
      if (o->steps <= 40 || t < 5 || t == o->steps - 1 || t % (o->steps / 10 + 1) == 0)
        printf("  step %4d  loss %-12.6g %8.3f ms  %7.3f GB/s (gradients in, parameters out)\n", t,
               loss, dt * 1e3, bytes / dt / 1e9);
    }
    /* Each worker's compute time per step (us, in the notification's
     * value with the REPORT bit): the step's waste is what is left after
     * the slowest worker's compute, the update and the data movement. */
    for (int k = 0; k < workers; k++) {
      hixl_notif_t n;
      take(ctx, &n);
      if ((n.imm & ~REPORT_US_MASK) != IMM(0, REPORT)) {
        fprintf(stderr, "PS: notification %u instead of a compute report\n", n.imm);
        exit(1);
      }
      double c = (double)(n.imm & REPORT_US_MASK) * 1e-6 * o->steps;
      if (c > st.compute)
        st.compute = c;
      st.compute_sum += c;
    }
    memcpy(final_w, param, pbytes);
    free(gk);
    free(reqs);
  } else {
    double compute = 0;
    for (int t = 0; t < o->steps; t++) {
      wait_notif(ctx, ps, IMM(g_rank, t)); /* parameters of version t are here */
      double c0 = cpu_s();
      gradient(g_rank, t, o, param, grad);
      compute += cpu_s() - c0;
      CHECK(hixl_notify(ps, IMM(0, t), 0, NULL));
    }
    wait_notif(ctx, ps, IMM(g_rank, o->steps)); /* the last version */
    double us = compute / o->steps * 1e6;
    uint32_t v = us >= (double)REPORT_US_MASK ? REPORT_US_MASK : (uint32_t)us;
    CHECK(hixl_notify(ps, IMM(0, REPORT) | v, 0, NULL));
  }
  st.seconds = now_s() - t_start;
  barrier();
  for (int r = 0; r < size; r++) {
    hixl_rmr_release(prm[r]);
    hixl_rmr_release(grm[r]);
  }
  free(prm);
  free(grm);
  CHECK(hixl_mr_dereg(pmr)); /* frees hixl_mem_alloc memory */
  CHECK(hixl_mr_dereg(gmr));
  return st;
}

/* ------------------------------------------------------------ two-sided */

static void io_all(int fd, void *buf, size_t n, bool out)
{
  uint8_t *b = buf;
  while (n > 0) {
    ssize_t k = out ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
    if (k <= 0) {
      if (k < 0 && errno == EINTR)
        continue;
      fprintf(stderr, "rank %d: two-sided %s: %s\n", g_rank, out ? "send" : "recv",
              k == 0 ? "connection closed" : strerror(errno));
      exit(1);
    }
    b += k;
    n -= (size_t)k;
  }
}

/* The baseline: the same steps, the same bytes, moved with send/recv over
 * TCP (what a two-sided collective library does at its core). */
static run_stats_t twosided(hixl_ctx_t *ctx, const opts_t *o, float *final_w)
{
  int size = g_size, workers = size - 1;
  size_t p = o->params;
  size_t pbytes = sizeof(float) * p, gbytes = sizeof(float) * (p + 1);
  run_stats_t st = {0};
  const char *host = getenv("MASTER_ADDR") ? getenv("MASTER_ADDR") : "127.0.0.1";
  int one = 1;
  int *fds = calloc((size_t)size, sizeof(int));
  if (g_rank == 0) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* Any free port, told to each worker in a notification: a fixed one
     * (MASTER_PORT + 1 was) can be anybody's ephemeral port. */
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t alen = sizeof(a);
    if (bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, size) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &alen) != 0) {
      fprintf(stderr, "PS: two-sided listen: %s\n", strerror(errno));
      exit(1);
    }
    for (int r = 1; r < size; r++)
      CHECK(hixl_notify(peer_of(r), IMM(r, ntohs(a.sin_port)), 0, NULL));
    for (int k = 0; k < workers; k++) {
      int fd = accept(ls, NULL, NULL);
      int r = 0;
      io_all(fd, &r, sizeof(r), false);
      if (r < 1 || r >= size || fds[r]) {
        fprintf(stderr, "PS: two-sided: bad rank %d\n", r);
        exit(1);
      }
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      fds[r] = fd;
    }
    close(ls);
  } else {
    hixl_notif_t n;
    take(ctx, &n); /* the PS's port */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(n.imm & 0xffff))};
    /* MASTER_ADDR is often a host name under torchrun (--master_addr). */
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    int g = getaddrinfo(host, NULL, &hints, &res);
    if (g != 0) {
      fprintf(stderr, "rank %d: two-sided: cannot resolve MASTER_ADDR %s: %s\n", g_rank, host,
              gai_strerror(g));
      exit(1);
    }
    a.sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
      fprintf(stderr, "rank %d: two-sided connect: %s\n", g_rank, strerror(errno));
      exit(1);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    io_all(fd, &g_rank, sizeof(g_rank), true);
    fds[0] = fd;
  }
  float *param = xalloc(pbytes);
  memset(param, 0, pbytes);
  double t_start = now_s();
  if (g_rank == 0) {
    float **gk = malloc(sizeof(float *) * (size_t)workers);
    for (int k = 0; k < workers; k++)
      gk[k] = xalloc(gbytes);
    for (int r = 1; r < size; r++)
      io_all(fds[r], param, pbytes, true);
    for (int t = 0; t < o->steps; t++) {
      /* Data movement only: each gradient is timed from the moment its
       * first bytes are there (the worker's compute is not counted). */
      for (int r = 1; r < size; r++) {
        struct pollfd pf = {.fd = fds[r], .events = POLLIN};
        while (poll(&pf, 1, -1) < 0 && errno == EINTR)
          ;
        double c0 = now_s();
        io_all(fds[r], gk[r - 1], gbytes, false);
        st.comm += now_s() - c0;
      }
      double u0 = now_s();
      st.last_loss = update(o, workers, param, gk);
      st.update += now_s() - u0;
      double c0 = now_s();
      for (int r = 1; r < size; r++)
        io_all(fds[r], param, pbytes, true);
      st.comm += now_s() - c0;
      st.bytes += (double)workers * (double)(gbytes + pbytes);
    }
    for (int r = 1; r < size; r++) { /* each worker's compute (CPU seconds) */
      double c;
      io_all(fds[r], &c, sizeof(c), false);
      if (c > st.compute)
        st.compute = c;
      st.compute_sum += c;
    }
    memcpy(final_w, param, pbytes);
    for (int k = 0; k < workers; k++)
      free(gk[k]);
    free(gk);
  } else {
    float *grad = xalloc(gbytes);
    io_all(fds[0], param, pbytes, false);
    double compute = 0;
    for (int t = 0; t < o->steps; t++) {
      double c0 = cpu_s();
      gradient(g_rank, t, o, param, grad);
      compute += cpu_s() - c0;
      io_all(fds[0], grad, gbytes, true);
      io_all(fds[0], param, pbytes, false);
    }
    io_all(fds[0], &compute, sizeof(compute), true);
    free(grad);
  }
  st.seconds = now_s() - t_start;
  for (int r = 0; r < size; r++)
    if (fds[r] > 0)
      close(fds[r]);
  free(fds);
  free(param);
  barrier();
  return st;
}

/* ------------------------------------------------------------ launcher */

static int free_port(void)
{
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0)
    return 29500;
  close(fd);
  return ntohs(a.sin_port);
}

/* Fork n ranks of this program with torchrun's variables; wait for all. */
static int launch(int n, int argc, char **argv)
{
  char port[16], ws[16];
  snprintf(port, sizeof(port), "%d", free_port());
  snprintf(ws, sizeof(ws), "%d", n);
  char **args = calloc((size_t)argc + 1, sizeof(char *));
  int k = 0;
  for (int i = 0; i < argc; i++) { /* drop --launch N */
    if (strcmp(argv[i], "--launch") == 0) {
      i++;
      continue;
    }
    if (strncmp(argv[i], "--launch=", 9) == 0)
      continue;
    args[k++] = argv[i];
  }
  pid_t *pids = calloc((size_t)n, sizeof(pid_t));
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      char rank[16];
      snprintf(rank, sizeof(rank), "%d", r);
      setenv("RANK", rank, 1);
      setenv("WORLD_SIZE", ws, 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port, 1);
      execv("/proc/self/exe", args);
      perror("execv");
      _exit(127);
    }
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "ps_train: rank %d failed (status %#x)\n", r, status);
      failed++;
    }
  }
  free(pids);
  free(args);
  return failed ? 1 : 0;
}

/* ------------------------------------------------------------ main */

static int rank_main(hixl_ctx_t *ctx, const opts_t *op);
static opts_t g_opts;
static hixl_ctx_t *g_self_ctx;

static void *rank_thread(void *arg)
{
  g_rank = (int)(intptr_t)arg;
  return rank_main(g_self_ctx, &g_opts) ? (void *)1 : NULL;
}

static void usage(void)
{
  fprintf(stderr,
          "usage: ps_train [--launch N] [--params P] [--steps S] [--batch B] [--lr LR]\n"
          "                [--mode onesided|twosided|both]\n"
          "  --launch N  fork N local ranks (else RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)\n"
          "  --self N    N ranks as threads of one context (the self transport)\n"
          "  --params P  model size (default 65536; 100000000 works, slowly)\n");
  exit(2);
}

int main(int argc, char **argv)
{
  opts_t o = {
      .params = 65536, .steps = 20, .batch = 4, .lr = 0.0f, .onesided = true, .twosided = true};
  static const struct option lo[] = {{"launch", required_argument, 0, 'L'},
                                     {"params", required_argument, 0, 'P'},
                                     {"steps", required_argument, 0, 'S'},
                                     {"batch", required_argument, 0, 'B'},
                                     {"lr", required_argument, 0, 'l'},
                                     {"mode", required_argument, 0, 'm'},
                                     {"self", required_argument, 0, 'T'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'L': o.launch = atoi(optarg); break;
    case 'T': o.self_ranks = atoi(optarg); break;
    case 'P': o.params = strtoull(optarg, NULL, 10); break;
    case 'S': o.steps = atoi(optarg); break;
    case 'B': o.batch = atoi(optarg); break;
    case 'l': o.lr = strtof(optarg, NULL); break;
    case 'm':
      o.onesided = strcmp(optarg, "twosided") != 0;
      o.twosided = strcmp(optarg, "onesided") != 0;
      if (strcmp(optarg, "onesided") && strcmp(optarg, "twosided") && strcmp(optarg, "both"))
        usage();
      break;
    default: usage();
    }
  }
  if (o.params == 0 || o.steps < 1 || o.batch < 1 || optind != argc)
    usage();
  if (o.launch > 0)
    return o.launch < 2 ? (usage(), 2) : launch(o.launch, argc, argv);

  hixl_ctx_t *ctx;
  CHECK(hixl_ctx_create(NULL, &ctx));
  if (o.self_ranks) { /* ranks as threads of this context */
    if (o.self_ranks < 2 || o.self_ranks > MAX_SELF)
      usage();
    g_size = o.self_ranks;
    CHECK(hixl_connect(ctx, hixl_ctx_address(ctx), 10000, &g_selfpeer));
    pthread_barrier_init(&g_bar, NULL, (unsigned)g_size);
    g_opts = o;
    g_self_ctx = ctx;
    pthread_t *th = calloc((size_t)g_size, sizeof(pthread_t));
    for (intptr_t r = 1; r < g_size; r++)
      pthread_create(&th[r], NULL, rank_thread, (void *)r);
    g_rank = 0;
    int rc = rank_main(ctx, &o);
    for (int r = 1; r < g_size; r++) {
      void *trc = NULL;
      pthread_join(th[r], &trc);
      rc |= trc != NULL;
    }
    free(th);
    hixl_disconnect(g_selfpeer);
    hixl_ctx_destroy(ctx);
    return rc;
  }
  CHECK(hixl_world_create(ctx, -1, -1, NULL, &g_world));
  g_rank = hixl_world_rank(g_world);
  g_size = hixl_world_size(g_world);
  int rc = rank_main(ctx, &o);
  hixl_world_destroy(g_world);
  hixl_ctx_destroy(ctx);
  return rc;
}

/* What a step would take with no waiting waste: the workers' compute (the
 * slowest one's CPU time, or all of theirs spread over the cores when
 * workers outnumber them), then the PS's update and its data movement, in
 * sequence; the rest of the step is waiting. */
static void print_step(const char *name, const run_stats_t *s, int steps)
{
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  double spread = s->compute_sum / (double)(ncpu > 0 ? ncpu : 1);
  double compute = s->compute > spread ? s->compute : spread;
  double need = compute + s->update + s->comm, ms = 1e3 / steps;
  printf("%s step: %.3f ms = workers' compute %.3f (CPU time: slowest %.3f, all %.3f on %ld "
         "cores) + update %.3f + moving data %.3f + waiting %.3f (%.1f%% over the work)\n",
         name, s->seconds * ms, compute * ms, s->compute * ms, s->compute_sum * ms, ncpu,
         s->update * ms, s->comm * ms, (s->seconds - need) * ms,
         100.0 * (s->seconds - need) / need);
}

/* One rank's part, after the group is formed. */
static int rank_main(hixl_ctx_t *ctx, const opts_t *op)
{
  opts_t o = *op;
  int size = g_size;
  if (size < 2) {
    fprintf(stderr, "ps_train: needs at least 2 ranks (a PS and a worker)\n");
    return 2;
  }
  int workers = size - 1;
  /* Step size: the averaged loss curves by about 2P / (3 * batch * workers)
   * along each sample (features uniform in [-1, 1), samples of different
   * workers nearly orthogonal when P is large); this lr removes about two
   * thirds of a sample's error at each visit. */
  if (o.lr == 0.0f)
    o.lr = (float)(o.batch * workers) / (float)o.params;
  float *one = xalloc(sizeof(float) * o.params), *two = xalloc(sizeof(float) * o.params);
  if (g_rank == 0)
    printf("ps_train: %d workers, %zu parameters, %d steps, batch %d, lr %g, over %s\n", workers,
           o.params, o.steps, o.batch, o.lr, hixl_peer_transport(peer_of(1)));
  run_stats_t s1 = {0}, s2 = {0};
  if (o.onesided) {
    if (g_rank == 0)
      printf("one-sided (workers notify; the PS gets gradients and puts parameters):\n");
    s1 = onesided(ctx, &o, one);
  }
  if (o.twosided)
    s2 = twosided(ctx, &o, two);
  int rc = 0;
  if (g_rank == 0) {
    if (o.onesided) {
      printf("one-sided: %.3f s, %.3f ms/step; moving data %.3f ms/step = %.3f GB/s; "
             "final loss %g\n",
             s1.seconds, s1.seconds / o.steps * 1e3, s1.comm / o.steps * 1e3,
             s1.bytes / s1.comm / 1e9, s1.last_loss);
      print_step("one-sided", &s1, o.steps);
    }
    if (o.twosided)
      printf("two-sided (TCP send/recv): %.3f s, %.3f ms/step; moving data %.3f ms/step = "
             "%.3f GB/s; final loss %g\n",
             s2.seconds, s2.seconds / o.steps * 1e3, s2.comm / o.steps * 1e3,
             s2.bytes / s2.comm / 1e9, s2.last_loss);
    if (o.twosided)
      print_step("two-sided", &s2, o.steps);
    if (o.onesided && o.twosided)
      printf("one-sided / two-sided: data movement %.2fx faster, whole steps %.2fx\n",
             s2.comm / s1.comm, s2.seconds / s1.seconds);
    /* The check: the single-process run of the same algorithm. */
    float *ref = xalloc(sizeof(float) * o.params);
    reference(&o, workers, ref);
    size_t bytes = sizeof(float) * o.params;
    bool ok1 = !o.onesided || memcmp(one, ref, bytes) == 0;
    bool ok2 = !o.twosided || memcmp(two, ref, bytes) == 0;
    printf("check against the single-process reference: %s%s\n",
           ok1 && ok2 ? "identical, bit for bit" : "DIFFERENT", ok1 ? "" : " (one-sided)");
    if (!ok2)
      printf("  (two-sided differs)\n");
    rc = ok1 && ok2 ? 0 : 1;
    free(ref);
  }
  free(one);
  free(two);
  return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * cma_bw: large puts and gets between two processes' ordinary (malloc'ed,
 * hixl_mr_reg'ed) memory over shm, beside what the machine does without
 * hixl, all in one run and on the very same buffers:
 *
 *   memcpy     one thread, between two local buffers of the size
 *   writev     one process_vm_writev of the size into the target's region
 *              (readv for gets): what shm did before it split transfers
 *   writev-2t  two threads, one process_vm_writev (readv) of half each: the
 *              most a split in two could give
 *   hixl       hixl_put / hixl_get with the defaults (CMA split across
 *              HIXL_SHM_CMA_THREADS threads from HIXL_SHM_CMA_SPLIT_MIN up)
 *   hixl-1t    the same with HIXL_SHM_CMA_THREADS=1
 *   owner      the same with HIXL_SHM_CMA=0: the target's control thread
 *              copies through its staging area (what runs where the kernel
 *              refuses CMA)
 *   socket     the bytes written into a unix stream socket and read by the
 *              target into its region (the alternative to a staging area)
 *
 * Rounds interleave the columns; figures are medians over rounds (GB/s),
 * ratios are medians of each round's own ratio.  Usage:
 *     cma_bw [--sizes 1m,16m,100m] [--rounds 7] [--quick]
 * Built by tests/cma/meson.build (build/tests/cma/cma_bw); --quick (in the
 * suite) runs small sizes and checks the bytes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hixl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, hixl_status_t st)
{
  fprintf(stderr, "cma_bw: %s: %s (%s)\n", what, hixl_strerror(st),
          st ? hixl_last_error() : strerror(errno));
  exit(1);
}

#define CHECK(call)                                                                                \
  do {                                                                                             \
    hixl_status_t st_ = (call);                                                                    \
    if (st_ != HIXL_OK)                                                                            \
      die(#call, st_);                                                                             \
  } while (0)

/* ---------------------------------------------------------------- target */

/* The target: a region of max bytes, published as "cma"; it tells its
 * address on out, then serves socket transfers (an 8-byte length, then that
 * many bytes into a buffer of the region's size, then a 1-byte ack) until
 * the socket closes.  (Not into the region itself: its control thread may
 * be writing there for the owner column at the same time.) */
static int run_target(size_t max, int out, int sock)
{
  hixl_ctx_t *ctx;
  hixl_mr_t *mr;
  uint8_t *mem = malloc(max), *sockbuf = malloc(max);
  if (mem == NULL || sockbuf == NULL)
    return 1;
  memset(mem, 0x5a, max);
  memset(sockbuf, 0x5a, max);
  CHECK(hixl_ctx_create(NULL, &ctx));
  CHECK(hixl_mr_reg(ctx, mem, max, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &mr));
  CHECK(hixl_mr_publish(mr, "cma"));
  dprintf(out, "%s %llx\n", hixl_ctx_address(ctx), (unsigned long long)(uintptr_t)mem);
  close(out);
  for (;;) {
    uint64_t len;
    if (recv(sock, &len, 8, MSG_WAITALL) != 8 || len > max)
      break;
    for (size_t got = 0; got < len;) {
      ssize_t n = recv(sock, sockbuf + got, len - got, 0);
      if (n <= 0)
        return 1;
      got += (size_t)n;
    }
    char ack = 1;
    if (send(sock, &ack, 1, MSG_NOSIGNAL) != 1)
      break;
  }
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(ctx);
  free(mem);
  free(sockbuf);
  return 0;
}

/* ------------------------------------------------------------- initiator */

enum { C_MEMCPY, C_CMA1, C_CMA2, C_HIXL, C_HIXL1, C_OWNER, C_SOCKET, NCOL };
static const char *const col_name[NCOL] = {"memcpy",  "writev", "writev-2t", "hixl",
                                           "hixl-1t", "owner",  "socket"};

typedef struct bench {
  pid_t pid;
  uint8_t *remote; /* the target's region, its address */
  uint8_t *a, *b;  /* local buffers */
  int sock;
  hixl_ctx_t *ctx[3]; /* default, one thread, owner copies */
  hixl_peer_t *peer[3];
  hixl_rmr_t *rmr[3];
} bench_t;

static hixl_ctx_t *ctx_with(const char *var, const char *val)
{
  char *old = var && getenv(var) ? strdup(getenv(var)) : NULL;
  if (var)
    setenv(var, val, 1);
  hixl_ctx_t *ctx;
  CHECK(hixl_ctx_create(NULL, &ctx));
  if (var && old)
    setenv(var, old, 1);
  else if (var)
    unsetenv(var);
  free(old);
  return ctx;
}

/* One process_vm_writev / readv of [off, off + len) (looping over partial
 * transfers); false when the kernel refuses. */
static bool cma_once(pid_t pid, bool put, uint8_t *local, uint8_t *remote, size_t len)
{
  struct iovec l = {local, len}, r = {remote, len};
  for (size_t done = 0; done < len;) {
    ssize_t n =
        put ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n <= 0)
      return false;
    done += (size_t)n;
    l.iov_base = (uint8_t *)l.iov_base + n, l.iov_len -= (size_t)n;
    r.iov_base = (uint8_t *)r.iov_base + n, r.iov_len -= (size_t)n;
  }
  return true;
}

typedef struct half {
  bench_t *b;
  bool put, ok;
  size_t off, len;
} half_t;

static void *half_main(void *arg)
{
  half_t *h = arg;
  h->ok = cma_once(h->b->pid, h->put, h->b->a + h->off, h->b->remote + h->off, h->len);
  return NULL;
}

/* Seconds for one transfer of size bytes in column c. */
static double once(bench_t *b, int c, bool put, size_t size)
{
  double t0 = now();
  switch (c) {
  case C_MEMCPY: memcpy(put ? b->b : b->a, put ? b->a : b->b, size); break;
  case C_CMA1:
    if (!cma_once(b->pid, put, b->a, b->remote, size))
      return -1; /* refused here (no-cma, Yama): the column stays empty */
    break;
  case C_CMA2: {
    size_t h = size / 2 & ~(size_t)4095;
    half_t one = {b, put, false, 0, h}, two = {b, put, false, h, size - h};
    pthread_t th;
    if (pthread_create(&th, NULL, half_main, &two) != 0)
      return -1;
    half_main(&one);
    pthread_join(th, NULL);
    if (!one.ok || !two.ok)
      return -1;
    break;
  }
  case C_HIXL:
  case C_HIXL1:
  case C_OWNER: {
    int k = c - C_HIXL;
    CHECK(put ? hixl_put(b->peer[k], b->a, size, b->rmr[k], 0, 0, NULL)
              : hixl_get(b->peer[k], b->a, size, b->rmr[k], 0, 0, NULL));
    break;
  }
  case C_SOCKET: {
    if (!put)
      return -1; /* one direction is enough to compare */
    uint64_t len = size;
    char ack;
    if (send(b->sock, &len, 8, MSG_NOSIGNAL) != 8)
      return -1;
    for (size_t done = 0; done < size;) {
      ssize_t n = send(b->sock, b->a + done, size - done, MSG_NOSIGNAL);
      if (n <= 0)
        return -1;
      done += (size_t)n;
    }
    if (recv(b->sock, &ack, 1, MSG_WAITALL) != 1)
      return -1;
    break;
  }
  }
  return now() - t0;
}

static int cmp_double(const void *x, const void *y)
{
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static double median(double *v, int n)
{
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Every column's put (or get) of size bytes moves the same bytes: check
 * the target holds (or we got) them. */
static bool check_bytes(bench_t *b, size_t size, bool put)
{
  uint8_t *back = malloc(size);
  bool ok = back != NULL;
  for (int k = 0; ok && k < 3; k++) {
    for (size_t i = 0; i < size; i++)
      b->a[i] = (uint8_t)(i * 7 + (size_t)k + 1);
    if (put) {
      CHECK(hixl_put(b->peer[k], b->a, size, b->rmr[k], 0, 0, NULL));
      CHECK(hixl_get(b->peer[(k + 1) % 3], back, size, b->rmr[(k + 1) % 3], 0, 0, NULL));
    } else {
      CHECK(hixl_put(b->peer[(k + 1) % 3], b->a, size, b->rmr[(k + 1) % 3], 0, 0, NULL));
      CHECK(hixl_get(b->peer[k], back, size, b->rmr[k], 0, 0, NULL));
    }
    ok = memcmp(back, b->a, size) == 0;
    if (!ok)
      fprintf(stderr, "cma_bw: %s of %zu bytes (%s) moved the wrong bytes\n", put ? "put" : "get",
              size, col_name[C_HIXL + k]);
  }
  free(back);
  return ok;
}

static size_t parse_size(const char *s)
{
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end == 'k')
    v <<= 10;
  else if (*end == 'm')
    v <<= 20;
  else if (*end == 'g')
    v <<= 30;
  return (size_t)v;
}

int main(int argc, char **argv)
{
  size_t sizes[16] = {(size_t)1 << 20, (size_t)16 << 20, (size_t)100 << 20};
  int nsizes = 3, rounds = 7;
  bool quick = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = true;
      sizes[0] = (size_t)1 << 20, sizes[1] = (size_t)8 << 20;
      nsizes = 2;
      rounds = 2;
    } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
      nsizes = 0;
      for (char *t = strtok(argv[++i], ","); t && nsizes < 16; t = strtok(NULL, ","))
        sizes[nsizes++] = parse_size(t);
    } else {
      fprintf(stderr, "usage: cma_bw [--sizes 1m,16m,100m] [--rounds N] [--quick]\n");
      return 2;
    }
  }
  if (rounds < 1 || rounds > 100 || nsizes < 1)
    return 2;
  size_t max = 0;
  for (int i = 0; i < nsizes; i++)
    max = sizes[i] > max ? sizes[i] : max;
  int pipefd[2], sv[2];
  if (pipe(pipefd) != 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
    return 1;
  /* Fork before any hixl thread exists in this process. */
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(pipefd[0]);
    close(sv[0]);
    _exit(run_target(max, pipefd[1], sv[1]));
  }
  close(pipefd[1]);
  close(sv[1]);
  char line[256] = "";
  FILE *f = fdopen(pipefd[0], "r");
  if (f == NULL || fgets(line, sizeof(line), f) == NULL)
    die("the target did not start", 0);
  fclose(f);
  char addr[200];
  unsigned long long remote;
  if (sscanf(line, "%199s %llx", addr, &remote) != 2)
    die("the target's answer", 0);
  bench_t b = {.pid = pid, .remote = (uint8_t *)(uintptr_t)remote, .sock = sv[0]};
  b.a = malloc(max);
  b.b = malloc(max);
  if (b.a == NULL || b.b == NULL)
    die("no memory", 0);
  memset(b.a, 1, max);
  memset(b.b, 2, max);
  b.ctx[0] = ctx_with(NULL, NULL);
  b.ctx[1] = ctx_with("HIXL_SHM_CMA_THREADS", "1");
  b.ctx[2] = ctx_with("HIXL_SHM_CMA", "0");
  hixl_mr_t *lmr[3];
  for (int k = 0; k < 3; k++) {
    CHECK(hixl_connect(b.ctx[k], addr, 10000, &b.peer[k]));
    CHECK(hixl_rmr_lookup(b.peer[k], "cma", 10000, &b.rmr[k]));
    CHECK(hixl_mr_reg(b.ctx[k], b.a, max, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &lmr[k]));
  }
  bool ok = true;
  const char *t = getenv("HIXL_SHM_CMA_THREADS"), *m = getenv("HIXL_SHM_CMA_SPLIT_MIN");
  printf("# cma_bw: malloc'ed + registered memory to another process over shm; GB/s, medians "
         "of %d rounds (HIXL_SHM_CMA_THREADS=%s, HIXL_SHM_CMA_SPLIT_MIN=%s)\n",
         rounds, t ? t : "default", m ? m : "default");
  for (int dir = 0; dir < 2; dir++) {
    bool put = dir == 0;
    printf("# %s\n%9s", put ? "put" : "get", "size");
    for (int c = 0; c < NCOL; c++)
      if (put || c != C_SOCKET)
        printf(" %9s", c == C_CMA1 && !put   ? "readv"
                       : c == C_CMA2 && !put ? "readv-2t"
                                             : col_name[c]);
    printf(" %12s %12s %12s\n",
           "hixl/"
           "cma1",
           "hixl/memcpy", "owner/memcpy");
    for (int si = 0; si < nsizes; si++) {
      size_t size = sizes[si];
      double g[NCOL][100], r_cma[100], r_mc[100], r_own[100];
      for (int c = 0; c < NCOL; c++)
        once(&b, c, put, size); /* warm: pages, helpers, the staging area */
      int reps = size >= ((size_t)64 << 20) ? 1 : size >= ((size_t)8 << 20) ? 3 : 20;
      for (int rd = 0; rd < rounds; rd++) {
        for (int c = 0; c < NCOL; c++) {
          double best = -1;
          for (int i = 0; i < reps; i++) {
            double s = once(&b, c, put, size);
            if (s > 0 && (best < 0 || s < best))
              best = s;
          }
          g[c][rd] = best > 0 ? (double)size / best / 1e9 : 0;
        }
        r_cma[rd] = g[C_CMA1][rd] > 0 ? g[C_HIXL][rd] / g[C_CMA1][rd] : 0;
        r_mc[rd] = g[C_HIXL][rd] / g[C_MEMCPY][rd];
        r_own[rd] = g[C_OWNER][rd] / g[C_MEMCPY][rd];
      }
      if (size % ((size_t)1 << 20) == 0)
        printf("%8zuM", size >> 20);
      else
        printf("%8zuK", size >> 10);
      for (int c = 0; c < NCOL; c++)
        if (put || c != C_SOCKET)
          printf(" %9.2f", median(g[c], rounds));
      printf(" %12.2f %12.2f %12.2f\n", median(r_cma, rounds), median(r_mc, rounds),
             median(r_own, rounds));
      fflush(stdout);
      if (quick)
        ok = check_bytes(&b, size, put) && ok;
    }
  }
  for (int k = 0; k < 3; k++) {
    hixl_mr_dereg(lmr[k]);
    hixl_rmr_release(b.rmr[k]);
    hixl_disconnect(b.peer[k]);
    hixl_ctx_destroy(b.ctx[k]);
  }
  close(b.sock);
  int status;
  waitpid(pid, &status, 0);
  free(b.a);
  free(b.b);
  return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

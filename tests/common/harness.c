/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

const char *g_transport = "shm";

/* Self targets are threads that read and zero memory other threads write
 * through hixl; the harness's command pipe orders them, but ThreadSanitizer
 * does not see a pipe as synchronization.  Passing through this mutex at each
 * command and reply gives it the same order (and costs nothing otherwise). */
static pthread_mutex_t g_order = PTHREAD_MUTEX_INITIALIZER;
static void order_point(void)
{
  pthread_mutex_lock(&g_order);
  pthread_mutex_unlock(&g_order);
}

void die(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[pid %d] FAIL: ", (int)getpid());
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
  _exit(1);
}

void test_config(hixl_config_t *cfg)
{
  hixl_config_init(cfg);
  /* Across network namespaces (tests/netns/netns-run) this host's address. */
  const char *listen = getenv("HIXL_TEST_LISTEN");
  cfg->listen = listen && *listen ? listen : "127.0.0.1:0";
}

hixl_ctx_t *test_ctx(int timeout_ms, const char *token)
{
  hixl_config_t cfg;
  test_config(&cfg);
  if (timeout_ms > 0)
    cfg.timeout_ms = timeout_ms;
  cfg.auth_token = token;
  hixl_ctx_t *ctx;
  EXPECT_OK(hixl_ctx_create(&cfg, &ctx));
  return ctx;
}

bool ctx_figure(hixl_ctx_t *ctx, const char *name, uint64_t *value)
{
  hixl_stat_t s[128];
  size_t n = sizeof(s) / sizeof(s[0]);
  if (hixl_ctx_stats(ctx, NULL, s, &n) != HIXL_OK)
    return false;
  for (size_t i = 0; i < n && i < sizeof(s) / sizeof(s[0]); i++)
    if (strcmp(s[i].name, name) == 0) {
      *value = s[i].value;
      return true;
    }
  return false;
}

void *xmalloc(size_t n)
{
  void *p = malloc(n ? n : 1);
  if (p == NULL)
    die("out of memory (%zu)", n);
  return p;
}

/* ------------------------------------------------------------ data */

void fill_pattern(void *buf, size_t len, uint64_t seed)
{
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x1234567;
  uint8_t *p = buf;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    memcpy(p + i, &x, 8);
  }
  for (; i < len; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (uint8_t)x;
  }
}

uint64_t hash_bytes(const void *buf, size_t len)
{
  const uint8_t *p = buf;
  uint64_t h = 0xcbf29ce484222325ull ^ len;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < len; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* ------------------------------------------------------------ target */

typedef struct region {
  const char *name;
  size_t len;
  unsigned access;
  bool alloc;      /* hixl_mem_alloc (memfd); else malloc + hixl_mr_reg (CMA) */
  size_t misalign; /* malloc regions: base offset from 64-byte alignment */
  uint64_t seed;   /* 0: zero-filled */
  bool device;     /* device memory (only with HIXL_TEST_DEVICE_REGIONS=1): alloc: one
                    * hixl_mem_alloc(HIXL_MEM_DEVICE); else hixl_mr_reg_device of an
                    * odd sub-range of a larger device allocation */
  void *addr, *to_free;
  hixl_mr_t *mr, *backing;
} region_t;

#define RWA (HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC)
static region_t proto_regions[] = {
    {"alloc", BIG_LEN, RWA, true, 0, 1},
    {"reg", BIG_LEN, RWA, false, 3, 2},
    {"ro", SMALL_LEN, HIXL_ACCESS_READ, true, 0, 3},
    {"wo", SMALL_LEN, HIXL_ACCESS_WRITE, true, 0, 4},
    {"ctr", CTR_LEN, RWA, true, 0, 0},
    {"ctr_reg", CTR_LEN, RWA, false, 0, 0},
    {"tmp", CTR_LEN, RWA, true, 0, 5},
    {"reg_ro", SMALL_LEN, HIXL_ACCESS_READ, false, 5, 6},
    {"dev", BIG_LEN, RWA, true, 0, 7, true},
    {"dev_reg", SMALL_LEN, RWA, false, 4096 + 5, 8, true},
    {"dev_ctr", CTR_LEN, RWA, true, 0, 0, true},
};
#define NREG (sizeof(proto_regions) / sizeof(proto_regions[0]))

typedef struct target_state {
  hixl_ctx_t *ctx;
  bool own_ctx; /* an exec'd target process (not a self-mode thread) */
  region_t regions[NREG];
  FILE *in, *out;
} target_state_t;

/* In a target process, the owner's control thread may write and read the
 * regions on a peer's behalf (shm without CMA: the owner's copies), and the
 * peer sends its next command only once it saw the copy done, through
 * shared memory and a pipe: an order ThreadSanitizer cannot see.  The
 * control thread takes the context lock after each copy, so taking it here
 * at each command (hixl_fence over all peers takes it; this target issues
 * nothing, so it returns at once) shows TSan that order.  Costs nothing
 * otherwise.  Self-mode targets share the test's context (and its fence
 * reports): order_point does their part. */
static void target_sync(target_state_t *ts)
{
  if (ts->own_ctx)
    (void)hixl_fence(ts->ctx, NULL, 0);
}

static region_t *find_region(target_state_t *ts, const char *name)
{
  for (size_t i = 0; i < NREG; i++)
    if (strcmp(ts->regions[i].name, name) == 0 && ts->regions[i].mr)
      return &ts->regions[i];
  return NULL;
}

/* The target's own view of its memory; device regions through the device
 * runtime (hixl_mem_copy), never a CPU access. */
static void region_read(const region_t *r, uint64_t off, void *buf, size_t len)
{
  if (r->device)
    EXPECT_OK(hixl_mem_copy(buf, (uint8_t *)r->addr + off, len));
  else
    memcpy(buf, (uint8_t *)r->addr + off, len);
}

static void region_write(const region_t *r, uint64_t off, const void *buf, size_t len)
{
  if (r->device)
    EXPECT_OK(hixl_mem_copy((uint8_t *)r->addr + off, buf, len));
  else
    memcpy((uint8_t *)r->addr + off, buf, len);
}

static uint64_t region_hash(const region_t *r, uint64_t off, size_t len)
{
  if (!r->device)
    return hash_bytes((uint8_t *)r->addr + off, len);
  void *tmp = malloc(len ? len : 1);
  if (tmp == NULL)
    die("no memory to hash %zu bytes", len);
  region_read(r, off, tmp, len);
  uint64_t h = hash_bytes(tmp, len);
  free(tmp);
  return h;
}

static void region_fill(const region_t *r, uint64_t seed)
{
  if (!r->device) {
    if (seed)
      fill_pattern(r->addr, r->len, seed);
    else
      memset(r->addr, 0, r->len);
    return;
  }
  void *tmp = calloc(1, r->len);
  if (tmp == NULL)
    die("no memory to fill %zu bytes", r->len);
  if (seed)
    fill_pattern(tmp, r->len, seed);
  region_write(r, 0, tmp, r->len);
  free(tmp);
}

static bool g_device_regions;

static void target_setup(target_state_t *ts)
{
  memcpy(ts->regions, proto_regions, sizeof(proto_regions));
  const char *dr = getenv("HIXL_TEST_DEVICE_REGIONS");
  g_device_regions = dr && strcmp(dr, "1") == 0;
  /* HIXL_TEST_REGIONS=heap: every host region is malloc + hixl_mr_reg (so
   * shm reaches all of them with CMA, or the owner's copies without it),
   * aligned as hixl_mem_alloc's would be. */
  const char *rk = getenv("HIXL_TEST_REGIONS");
  bool heap = rk && strcmp(rk, "heap") == 0;
  for (size_t i = 0; i < NREG; i++) {
    region_t *r = &ts->regions[i];
    if (r->device && !g_device_regions)
      continue;
    if (heap && !r->device && r->alloc)
      r->alloc = false; /* misalign stays 0 */
    if (r->device && r->alloc) {
      EXPECT_OK(hixl_mem_alloc(ts->ctx, r->len, HIXL_MEM_DEVICE, r->access, &r->addr, &r->mr));
    } else if (r->device) {
      void *base;
      EXPECT_OK(hixl_mem_alloc(ts->ctx, r->len + r->misalign + 4096, HIXL_MEM_DEVICE, 0, &base,
                               &r->backing));
      r->addr = (uint8_t *)base + r->misalign;
      EXPECT_OK(hixl_mr_reg_device(ts->ctx, r->addr, r->len, 0, r->access, &r->mr));
    } else if (r->alloc) {
      EXPECT_OK(hixl_mem_alloc(ts->ctx, r->len, HIXL_MEM_HOST, r->access, &r->addr, &r->mr));
    } else {
      if (posix_memalign(&r->to_free, 64, r->len + 64) != 0)
        die("no memory for region %s", r->name);
      r->addr = (uint8_t *)r->to_free + r->misalign;
      EXPECT_OK(hixl_mr_reg(ts->ctx, r->addr, r->len, r->access, &r->mr));
    }
    region_fill(r, r->seed);
    char name[64];
    /* Self targets share the test's context: keep their names apart from
     * anything a test publishes itself. */
    snprintf(name, sizeof(name), "%s", r->name);
    EXPECT_OK(hixl_mr_publish(r->mr, name));
  }
}

static void target_teardown(target_state_t *ts)
{
  for (size_t i = 0; i < NREG; i++) {
    region_t *r = &ts->regions[i];
    if (r->mr)
      hixl_mr_dereg(r->mr);
    if (r->backing)
      hixl_mr_dereg(r->backing);
    free(r->to_free);
  }
}

/* Notification i of the count a command collects, within timeout_ms;
 * false, saying why in resp, when none came. */
static bool next_notif(target_state_t *ts, unsigned long i, unsigned long count, int timeout_ms,
                       hixl_notif_t *n, char *resp, size_t cap)
{
  hixl_status_t st = hixl_notif_wait(ts->ctx, n, timeout_ms);
  if (st != HIXL_OK)
    snprintf(resp, cap, "bad: notification %lu of %lu: %s", i, count, hixl_strerror(st));
  return st == HIXL_OK;
}

/* After the count notifications a command collected: exactly once, nothing
 * more may arrive ("ok COUNT" in resp; an extra one's imm in hex where it
 * packs fields). */
static void no_more_notifs(target_state_t *ts, unsigned long count, bool imm_hex, char *resp,
                           size_t cap)
{
  hixl_notif_t extra;
  if (hixl_notif_poll(ts->ctx, &extra, 1) == 0)
    snprintf(resp, cap, "ok %lu", count);
  else if (imm_hex)
    snprintf(resp, cap, "bad: an extra notification imm %#x", extra.imm);
  else
    snprintf(resp, cap, "bad: an extra notification imm %u", extra.imm);
}

/* Collect count notifications from one peer: imm 0..count-1 in order, each
 * with len imm % 61, each after its data (the first 8 bytes at its slot
 * carry imm when len >= 8).  Slots repeat every 131072 notifications, more
 * than any ring holds, so a producer can never be a whole period ahead. */
static void check_notifs(target_state_t *ts, unsigned long count, char *resp, size_t cap)
{
  region_t *r = find_region(ts, "alloc");
  hixl_peer_t *from = NULL;
  for (unsigned long i = 0; i < count; i++) {
    hixl_notif_t n;
    if (!next_notif(ts, i, count, 30000, &n, resp, cap))
      return;
    if (from == NULL)
      from = n.peer;
    if (n.peer != from || n.imm != (uint32_t)i || n.len != i % 61) {
      snprintf(resp, cap, "bad: notification %lu: imm %u len %zu peer %s", i, n.imm, n.len,
               n.peer == from ? "same" : "other");
      return;
    }
    if (n.len >= 8) {
      uint64_t v;
      memcpy(&v, (uint8_t *)r->addr + (i % 131072) * 64, 8);
      if (v != i) {
        snprintf(resp, cap, "bad: data of notification %lu not visible (%llu)", i,
                 (unsigned long long)v);
        return;
      }
    }
  }
  no_more_notifs(ts, count, false, resp, cap);
}

/* Collect count notifications from up to 64 peers (qp_lru): imm is
 * p << 20 | seq, seq 0, 1, 2, ... in order per sender p, each after its
 * 8 data bytes (seq) at "alloc" + p * 8192 + seq % 1024 * 8; every sender
 * p always the same peer; then nothing more. */
static void check_notifs_many(target_state_t *ts, unsigned long count, char *resp, size_t cap)
{
  region_t *r = find_region(ts, "alloc");
  hixl_peer_t *from[64] = {0};
  uint32_t next[64] = {0};
  for (unsigned long i = 0; i < count; i++) {
    hixl_notif_t n;
    if (!next_notif(ts, i, count, 60000, &n, resp, cap))
      return;
    uint32_t p = n.imm >> 20, seq = n.imm & 0xfffff;
    if (p >= 64 || n.len != 8 || (from[p] && from[p] != n.peer) || seq != next[p]) {
      snprintf(resp, cap, "bad: notification %lu: sender %u seq %u (expected %u) len %zu%s", i, p,
               seq, p < 64 ? next[p] : 0, n.len,
               p < 64 && from[p] && from[p] != n.peer ? ", another peer" : "");
      return;
    }
    from[p] = n.peer;
    next[p]++;
    uint64_t v;
    memcpy(&v, (uint8_t *)r->addr + p * 8192 + (seq % 1024) * 8, 8);
    if (v != seq) {
      snprintf(resp, cap, "bad: data of sender %u seq %u not visible (%llu)", p, seq,
               (unsigned long long)v);
      return;
    }
  }
  no_more_notifs(ts, count, true, resp, cap);
}

static void target_serve(target_state_t *ts)
{
  char line[256];
  while (fgets(line, sizeof(line), ts->in)) {
    order_point();
    target_sync(ts);
    char cmd[32] = "", name[32] = "";
    unsigned long long a = 0, b = 0;
    char resp[256] = "bad: unknown command";
    int n = sscanf(line, "%31s %31s %llu %llu", cmd, name, &a, &b);
    region_t *r = n >= 2 ? find_region(ts, name) : NULL;
    if (strcmp(cmd, "quit") == 0) {
      fprintf(ts->out, "ok\n");
      fflush(ts->out);
      return;
    } else if (strcmp(cmd, "hash") == 0 && r && n == 4 && a + b <= r->len) {
      snprintf(resp, sizeof(resp), "ok %016llx", (unsigned long long)region_hash(r, a, b));
    } else if (strcmp(cmd, "fill") == 0 && r && n == 3) {
      region_fill(r, a);
      snprintf(resp, sizeof(resp), "ok");
    } else if (strcmp(cmd, "zero") == 0 && r && n == 2 && r->device) {
      region_fill(r, 0);
      snprintf(resp, sizeof(resp), "ok");
    } else if (strcmp(cmd, "read64") == 0 && r && n == 3 && a + 8 <= r->len && r->device) {
      uint64_t v;
      region_read(r, a, &v, 8);
      snprintf(resp, sizeof(resp), "ok %llu", (unsigned long long)v);
    } else if (strcmp(cmd, "zero") == 0 && r && n == 2 && (uintptr_t)r->addr % 8 == 0) {
      /* Words that peers update with atomics are accessed atomically by their
       * owner too (the owner's control thread may execute those atomics). */
      for (size_t i = 0; i + 8 <= r->len; i += 8)
        __atomic_store_n((uint64_t *)(void *)((uint8_t *)r->addr + i), 0, __ATOMIC_SEQ_CST);
      snprintf(resp, sizeof(resp), "ok");
    } else if (strcmp(cmd, "read64") == 0 && r && n == 3 && a + 8 <= r->len &&
               ((uintptr_t)r->addr + a) % 8 == 0) {
      uint64_t v = __atomic_load_n((uint64_t *)(void *)((uint8_t *)r->addr + a), __ATOMIC_SEQ_CST);
      snprintf(resp, sizeof(resp), "ok %llu", (unsigned long long)v);
    } else if (strcmp(cmd, "dereg") == 0 && r && n == 2) {
      hixl_status_t st = hixl_mr_dereg(r->mr);
      r->mr = NULL;
      snprintf(resp, sizeof(resp), st == HIXL_OK ? "ok" : "bad: %s", hixl_last_error());
    } else if (strcmp(cmd, "notif") == 0 && sscanf(line, "%31s %llu", cmd, &a) == 2) {
      check_notifs(ts, (unsigned long)a, resp, sizeof(resp));
    } else if (strcmp(cmd, "notif1") == 0 && r && n == 4 && a + b <= r->len) {
      /* One notification, then at once the target's view of a range. */
      hixl_notif_t nf;
      hixl_status_t st = hixl_notif_wait(ts->ctx, &nf, 30000);
      if (st == HIXL_OK)
        snprintf(resp, sizeof(resp), "ok %u %zu %016llx", nf.imm, nf.len,
                 (unsigned long long)region_hash(r, a, b));
      else
        snprintf(resp, sizeof(resp), "bad: %s", hixl_strerror(st));
    } else if (strcmp(cmd, "sleepwait") == 0 && sscanf(line, "%31s %llu", cmd, &a) == 2) {
      /* Block in hixl_notif_wait (a ms) and say what the whole process
       * spent meanwhile: CPU (user + system, us), wall (us), voluntary
       * context switches -- a sleeping waiter spends next to nothing. */
      struct rusage r0, r1;
      struct timespec w0, w1;
      getrusage(RUSAGE_SELF, &r0);
      clock_gettime(CLOCK_MONOTONIC, &w0);
      hixl_notif_t nf;
      hixl_status_t st = hixl_notif_wait(ts->ctx, &nf, (int)a);
      clock_gettime(CLOCK_MONOTONIC, &w1);
      getrusage(RUSAGE_SELF, &r1);
      long long cpu =
          (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) *
              1000000LL +
          (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) + (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
      long long wall = (w1.tv_sec - w0.tv_sec) * 1000000LL + (w1.tv_nsec - w0.tv_nsec) / 1000;
      if (st == HIXL_OK)
        snprintf(resp, sizeof(resp), "ok %u %lld %lld %ld", nf.imm, cpu, wall,
                 r1.ru_nvcsw - r0.ru_nvcsw);
      else
        snprintf(resp, sizeof(resp), "bad: %s", hixl_last_error());
    } else if (strcmp(cmd, "echo") == 0 && sscanf(line, "%31s %llu %llu", cmd, &a, &b) >= 2) {
      /* Answer a notifications, each with a notification of the same imm
       * to its sender (a ping-pong's far side), b us after it came. */
      snprintf(resp, sizeof(resp), "ok %llu", a);
      for (unsigned long long i = 0; i < a; i++) {
        hixl_notif_t nf;
        hixl_status_t st = hixl_notif_wait(ts->ctx, &nf, 30000);
        if (st == HIXL_OK && b > 0)
          usleep((useconds_t)(b < 1000000 ? b : 1000000));
        if (st == HIXL_OK)
          st = hixl_notify(nf.peer, nf.imm, 0, NULL);
        if (st != HIXL_OK) {
          snprintf(resp, sizeof(resp), "bad: echo %llu of %llu: %s", i, a, hixl_last_error());
          break;
        }
      }
    } else if (strcmp(cmd, "notifs") == 0 && sscanf(line, "%31s %llu", cmd, &a) == 2) {
      check_notifs_many(ts, (unsigned long)a, resp, sizeof(resp));
    } else if (strcmp(cmd, "stat") == 0 && n == 2) {
      /* One of the target context's figures (hixl_ctx_stats). */
      uint64_t v;
      if (ctx_figure(ts->ctx, name, &v))
        snprintf(resp, sizeof(resp), "ok %llu", (unsigned long long)v);
      else
        snprintf(resp, sizeof(resp), "bad: no figure %s", name);
    } else if (strcmp(cmd, "ping") == 0) {
      snprintf(resp, sizeof(resp), "ok");
    }
    target_sync(ts);
    order_point();
    fprintf(ts->out, "%s\n", resp);
    fflush(ts->out);
  }
}

static void *target_thread(void *arg)
{
  target_state_t *ts = arg;
  target_serve(ts);
  target_teardown(ts);
  fclose(ts->in);
  fclose(ts->out);
  free(ts);
  return NULL;
}

void target_start(target_t *t, hixl_ctx_t *ctx, const char *token, int timeout_ms)
{
  memset(t, 0, sizeof(*t));
  t->transport = g_transport;
  signal(SIGPIPE, SIG_IGN); /* a dead target must fail a test, not kill it */
  int cmd[2], resp[2];
  if (pipe2(cmd, O_CLOEXEC) != 0 || pipe2(resp, O_CLOEXEC) != 0)
    die("pipe: %s", strerror(errno));
  t->cmd_fd = cmd[1];
  t->resp_fd = resp[0];
  target_state_t *ts = calloc(1, sizeof(*ts));
  if (strcmp(g_transport, "self") == 0) {
    ts->ctx = ctx;
    target_setup(ts);
    snprintf(t->addr, sizeof(t->addr), "%s", hixl_ctx_address(ctx));
    ts->in = fdopen(cmd[0], "r");
    ts->out = fdopen(resp[1], "w");
    pthread_t th;
    if (pthread_create(&th, NULL, target_thread, ts) != 0)
      die("pthread_create");
    t->thread = (void *)(uintptr_t)th;
    t->ctx = ctx;
    return;
  }
  /* A forked target execs a fresh image of this program: forking a process
   * whose threads may hold allocator locks (ASan's do) and then calling
   * malloc in the child can deadlock.  exec is the only safe thing. */
  char a_cmd[16], a_resp[16], a_to[16];
  snprintf(a_cmd, sizeof(a_cmd), "%d", cmd[0]);
  snprintf(a_resp, sizeof(a_resp), "%d", resp[1]);
  snprintf(a_to, sizeof(a_to), "%d", timeout_ms);
  char *args[] = {"hixl-test-target",
                  "--hixl-target",
                  a_cmd,
                  a_resp,
                  a_to,
                  (char *)(token ? token : "-"),
                  NULL};
  pid_t pid = fork();
  if (pid < 0)
    die("fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
    /* On Soft-RoCE the target uses the other device (tests/rxe/suite.sh). */
    const char *dev = getenv("HIXL_TEST_TARGET_NET_DEV");
    if (dev)
      setenv("HIXL_NET_DEV", dev, 1);
    /* Another host: the target runs in another network namespace. */
    const char *ns = getenv("HIXL_TEST_TARGET_NETNS");
    if (ns && *ns) {
      char path[256];
      snprintf(path, sizeof(path), "/var/run/netns/%s", ns);
      int nfd = open(path, O_RDONLY | O_CLOEXEC);
      if (nfd < 0 || setns(nfd, CLONE_NEWNET) != 0)
        _exit(126);
      close(nfd);
      const char *tl = getenv("HIXL_TEST_TARGET_LISTEN");
      if (tl)
        setenv("HIXL_TEST_LISTEN", tl, 1);
    }
    /* A target whose NIC may reach its device memory while ours may not. */
    const char *rdma = getenv("HIXL_TEST_TARGET_DEVICE_RDMA");
    if (rdma)
      setenv("HIXL_DEVICE_RDMA", rdma, 1);
    fcntl(cmd[0], F_SETFD, 0);
    fcntl(resp[1], F_SETFD, 0);
    execv("/proc/self/exe", args);
    _exit(127);
  }
  free(ts);
  close(cmd[0]);
  close(resp[1]);
  t->pid = pid;
  if (!target_reply(t, t->addr, sizeof(t->addr)))
    die("target did not start");
}

void harness_init(int argc, char **argv)
{
  if (argc != 6 || strcmp(argv[1], "--hixl-target") != 0)
    return;
  /* The exec'd target process (see target_start). */
  target_state_t *ts = calloc(1, sizeof(*ts));
  ts->ctx = test_ctx(atoi(argv[4]), strcmp(argv[5], "-") ? argv[5] : NULL);
  ts->own_ctx = true;
  target_setup(ts);
  ts->in = fdopen(atoi(argv[2]), "r");
  ts->out = fdopen(atoi(argv[3]), "w");
  if (ts->in == NULL || ts->out == NULL)
    die("target: bad pipe fds");
  fprintf(ts->out, "%s\n", hixl_ctx_address(ts->ctx));
  fflush(ts->out);
  target_serve(ts);
  target_teardown(ts);
  hixl_ctx_destroy(ts->ctx);
  exit(0);
}

void target_send(target_t *t, const char *fmt, ...)
{
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
  va_end(ap);
  buf[n++] = '\n';
  order_point();
  if (write(t->cmd_fd, buf, (size_t)n) != n)
    die("target command: %s", strerror(errno));
}

bool target_reply(target_t *t, char *resp, size_t cap)
{
  size_t n = 0;
  for (;;) {
    char c;
    ssize_t r = read(t->resp_fd, &c, 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      die("target closed its pipe");
    if (c == '\n')
      break;
    if (n + 1 < cap)
      resp[n++] = c;
  }
  resp[n] = 0;
  order_point();
  /* The first reply of a forked target is its address. */
  return strncmp(resp, "ok", 2) == 0 || strchr(resp, ':') != NULL;
}

bool target_cmd(target_t *t, char *resp, size_t cap, const char *fmt, ...)
{
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  target_send(t, "%s", buf);
  char local[256];
  if (resp == NULL) {
    resp = local;
    cap = sizeof(local);
  }
  return target_reply(t, resp, cap) && strncmp(resp, "ok", 2) == 0;
}

uint64_t target_hash(target_t *t, const char *region, uint64_t off, uint64_t len)
{
  char resp[128];
  if (!target_cmd(t, resp, sizeof(resp), "hash %s %llu %llu", region, (unsigned long long)off,
                  (unsigned long long)len))
    die("hash %s: %s", region, resp);
  return strtoull(resp + 3, NULL, 16);
}

void target_stop(target_t *t)
{
  if (t->cmd_fd < 0)
    return;
  int status;
  bool dead = t->pid > 0 && waitpid(t->pid, &status, WNOHANG) == t->pid;
  if (!dead) {
    target_send(t, "quit");
    char resp[64];
    target_reply(t, resp, sizeof(resp));
  }
  close(t->cmd_fd);
  close(t->resp_fd);
  t->cmd_fd = t->resp_fd = -1;
  if (t->pid > 0 && !dead)
    waitpid(t->pid, &status, 0);
  else if (t->thread)
    pthread_join((pthread_t)(uintptr_t)t->thread, NULL);
}

hixl_peer_t *connect_to(hixl_ctx_t *ctx, const target_t *t)
{
  hixl_peer_t *peer;
  EXPECT_OK(hixl_connect(ctx, t->addr, 10000, &peer));
  const char *tp = hixl_peer_transport(peer);
  if (strcmp(tp, g_transport) != 0)
    die("connected over %s, expected %s", tp, g_transport);
  return peer;
}

hixl_rmr_t *lookup(hixl_peer_t *peer, const char *name)
{
  hixl_rmr_t *rmr;
  EXPECT_OK(hixl_rmr_lookup(peer, name, 10000, &rmr));
  return rmr;
}

void session_open(session_t *s, int timeout_ms, int target_timeout_ms)
{
  s->ctx = test_ctx(timeout_ms, NULL);
  target_start(&s->t, s->ctx, NULL, target_timeout_ms);
  s->peer = connect_to(s->ctx, &s->t);
}

void session_close(session_t *s)
{
  hixl_disconnect(s->peer);
  target_stop(&s->t);
  hixl_ctx_destroy(s->ctx);
}

/* ------------------------------------------------------------ workers */

int run_children(int n, int (*fn)(void *arg, int index), void *arg)
{
  pid_t pids[64];
  for (int i = 0; i < n; i++) {
    pids[i] = fork();
    if (pids[i] < 0)
      die("fork: %s", strerror(errno));
    if (pids[i] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      _exit(fn(arg, i));
    }
  }
  int failed = 0;
  for (int i = 0; i < n; i++) {
    int status;
    if (waitpid(pids[i], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      failed++;
  }
  return failed;
}

struct thr {
  int (*fn)(void *, int);
  void *arg;
  int index, rc;
};
static void *thr_main(void *p)
{
  struct thr *t = p;
  t->rc = t->fn(t->arg, t->index);
  return NULL;
}

int run_threads(int n, int (*fn)(void *arg, int index), void *arg)
{
  pthread_t th[64];
  struct thr t[64];
  for (int i = 0; i < n; i++) {
    t[i] = (struct thr){fn, arg, i, 0};
    pthread_create(&th[i], NULL, thr_main, &t[i]);
  }
  int failed = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(th[i], NULL);
    failed += t[i].rc != 0;
  }
  return failed;
}

int run_workers(int n, int (*fn)(void *arg, int index), void *arg)
{
  return strcmp(g_transport, "self") == 0 ? run_threads(n, fn, arg) : run_children(n, fn, arg);
}

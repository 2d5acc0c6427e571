/* SPDX-License-Identifier: MIT */
/*
 * bench/scale.c: what N connected peers cost one target, and what they do to
 * its latency, for N from 16 to a few thousand (docs/scale.md).  A benchmark,
 * not a timed test: it reports figures and checks only that every operation
 * landed.
 *
 * Per N, this process forks one target and --procs initiator processes (it
 * never creates a context itself, so every N starts from fresh processes).
 * Each initiator holds N/P contexts, one per simulated peer, each connecting
 * once to the target: N peers of the target, N control threads on the
 * initiators' side.
 *
 *  - Cost per peer: the target reads /proc/self (VmRSS from status; Pss and
 *    shared memory from smaps_rollup; fds, threads, lines of maps) before
 *    the burst and after all N are connected and have done one round of
 *    operations; the table shows the difference divided by the peers
 *    connected.  A note below each row shows which mappings of the target's
 *    smaps grew (by name), and what the initiators' contexts cost.
 *  - Connects/s: every initiator context waits on one futex in shared
 *    memory; the target releases them all at once and connects/s is N over
 *    the time from that release (CLOCK_MONOTONIC, in the shared page) to the
 *    last connect done.  One thread per context, so the burst is real.
 *  - First put after the burst: right after its connect, each context
 *    unpacks the target's rkey, puts its 8-byte value into its slot and
 *    fences; the time from connect-returned to fence-done, p50/p99 over all
 *    N.  Then a get of the slot (verified) and an FAA of 1 on the counter.
 *    --hold-ops: each context waits until every connect of the burst has
 *    returned before its first operation (timed from then), so that
 *    connects/s is the burst's alone; by default the first operations of
 *    the early contexts overlap the later connects, as between real hosts,
 *    but here on the same CPUs (over fabric each initiator connection's
 *    first operation clears about 2.3 MB of rxm buffers, once per context).
 *  - Idle CPU: with all N connected and quiet, CPU time (getrusage
 *    RUSAGE_SELF, user+sys, every thread) of the target over --idle-s, in
 *    ms of CPU per second, and the same summed over the initiator
 *    processes: heartbeats and whatever else a connected peer costs.
 *  - Put latency with N connected: up to 64 contexts spread over the
 *    initiators, one process at a time, each 200 8-byte puts each followed
 *    by a fence; p50/p99 of put+fence.
 *  - Check: at the end the target verifies that the counter at offset 0
 *    equals N and that slot 8 + 8*i holds peer i's value (0x5ca1e << 40 | i):
 *    OK or FAILED.  A connect that fails is reported with hixl_last_error()
 *    and the count reached; the run goes on with the peers it has.
 *
 * Run it (the test suite does not; it takes minutes at N = 4096):
 *
 *   hixl-scale [--transport shm|fabric|verbs] [--peers N[,N,...]] [--procs P]
 *              [--idle-s S] [--timeout-s S] [--smaps DIR] [--hold-ops]
 *
 * Defaults: shm, peers 16,64,256,1024, 4 initiator processes, 2 s idle, a
 * 300 s watchdog per N (every child is killed past it, or when the machine
 * runs short of memory).  --smaps DIR keeps the target's /proc/self/smaps
 * before and after each burst there.  --transport sets HIXL_TRANSPORTS in
 * every process (fabric also sets HIXL_FABRIC_PROVIDER="tcp;ofi_rxm" unless
 * it is set; verbs needs an RDMA device, as in the rxe guest, where the
 * first put after the burst includes each lazy pair's QP set-up unless
 * HIXL_VERBS_LAZY=0); past 1024 peers the target's HIXL_MAX_PEERS is raised to N
 * unless it is set.  HIXL_LAZY=0 (unless set): transports are set up at
 * hixl_ctx_create, so the target's one-time fabric set-up (about 70 MB with
 * tcp;ofi_rxm) falls before the burst and is shown apart, and the burst
 * times connects rather than every initiator context's own libfabric
 * set-up (a real peer pays that once, on its own machine).
 * HIXL_MAX_HANDSHAKES is left alone: a burst of more than its 256
 * connections sheds the oldest handshakes, and those connects fail (set
 * it in the environment to see the burst without that cap).  RLIMIT_NOFILE
 * is raised to its hard limit in every process.  Over fabric every
 * initiator context holds its own endpoint (about 70 MB with the default
 * rxm buffers; FI_OFI_RXM_BUFFER_SIZE=1024 makes it about 9 MB), which
 * bounds N on one machine.  The table goes to stdout, one row per N as
 * soon as it is done; notes ('#' lines) go to stderr.  Exit status 1 if
 * any N failed its check.
 *
 * Build by hand against a built library, e.g.:
 *   gcc -O2 -Wall -Wextra -std=gnu11 -Iinclude bench/scale.c -Lbuild -lhixl \
 *       -Wl,-rpath,$PWD/build -lm -o hixl-scale
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <hixl.h>
#include "bench_util.h"
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_PROCS 64
#define PUT_CTXS 64   /* contexts that time puts with N connected */
#define PUT_ITERS 200 /* puts (each with a fence) per such context */
#define SLOT_MAGIC (UINT64_C(0x5ca1e) << 40)
#define REGION_BASE (1u << 20) /* the region: 1 MiB plus 8 bytes per peer */

/* ------------------------------------------------------------ utilities */

static double cpu_s(void)
{
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static long raise_nofile(void)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return -1;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
    return -1;
  return (long)rl.rlim_cur;
}

/* Cross-process futex barriers on words of the shared page. */
static void futex_wait(_Atomic uint32_t *w, uint32_t v, int ms)
{
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, v, &t, NULL, 0);
}

static void wait_ge(_Atomic uint32_t *w, uint32_t v)
{
  uint32_t cur;
  while ((cur = atomic_load(w)) < v)
    futex_wait(w, cur, 1000);
}

static void set_wake(_Atomic uint32_t *w, uint32_t v)
{
  atomic_store(w, v);
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void bump_wake(_Atomic uint32_t *w)
{
  atomic_fetch_add(w, 1);
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Nearest-rank percentile of v[0..n) (sorts v). */
static int64_t pct(int64_t *v, int n, double p)
{
  if (n <= 0)
    return -1;
  qsort(v, (size_t)n, sizeof(*v), cmp_i64);
  int i = (int)(p * n + 0.999999) - 1;
  return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* ------------------------------------------------------------- /proc */

typedef struct snap {
  int64_t rss_kib, pss_kib, shared_kib, pss_shmem_kib;
  int fds, threads, maps;
} snap_t;

static int64_t field_kib(const char *file, const char *key)
{
  FILE *f = fopen(file, "r");
  if (!f)
    return -1;
  char line[512];
  size_t kl = strlen(key);
  int64_t v = -1;
  while (fgets(line, sizeof(line), f))
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
      v = strtoll(line + kl + 1, NULL, 10);
      break;
    }
  fclose(f);
  return v;
}

static snap_t take_snap(void)
{
  snap_t s;
  s.rss_kib = field_kib("/proc/self/status", "VmRSS");
  s.pss_kib = field_kib("/proc/self/smaps_rollup", "Pss");
  s.shared_kib = field_kib("/proc/self/smaps_rollup", "Shared_Clean") +
                 field_kib("/proc/self/smaps_rollup", "Shared_Dirty");
  s.pss_shmem_kib = field_kib("/proc/self/smaps_rollup", "Pss_Shmem");
  s.fds = count_dir("/proc/self/fd") - 1; /* less opendir's own */
  s.threads = count_dir("/proc/self/task");
  s.maps = 0;
  FILE *f = fopen("/proc/self/maps", "r");
  if (f) {
    int c, last = '\n';
    while ((c = getc(f)) != EOF) {
      if (c == '\n')
        s.maps++;
      last = c;
    }
    if (last != '\n')
      s.maps++;
    fclose(f);
  }
  return s;
}

/* smaps grouped by mapping name: how many, and their Rss / Pss. */
#define MAX_NAMES 128
typedef struct mapgroup {
  char name[72];
  int count;
  int64_t rss_kib, pss_kib;
} mapgroup_t;
typedef struct mapstat {
  int n;
  mapgroup_t g[MAX_NAMES];
} mapstat_t;

static void group_name(const char *raw, char *out, size_t cap)
{
  /* "/memfd:hixl-regions (deleted)" -> "memfd:hixl-regions"; libraries and
   * files by their base name; nothing -> "[anon]". */
  while (*raw == ' ')
    raw++;
  size_t len = strcspn(raw, "\n");
  if (len == 0) {
    snprintf(out, cap, "[anon]");
    return;
  }
  const char *p = raw;
  if (strncmp(p, "/memfd:", 7) == 0)
    p++;
  else if (*p == '/') {
    /* The last '/' of the first len bytes (by hand: gcc's -Wnonnull
     * misfires on memrchr here under -fsanitize). */
    const char *slash = p;
    for (size_t i = 0; i < len; i++)
      if (p[i] == '/')
        slash = p + i;
    p = slash + 1;
  }
  size_t k = len - (size_t)(p - raw);
  const char *del = strstr(p, " (deleted)");
  if (del && del < p + k)
    k = (size_t)(del - p);
  if (k >= cap)
    k = cap - 1;
  memcpy(out, p, k);
  out[k] = 0;
}

static void read_smaps(mapstat_t *ms, const char *copy_to)
{
  ms->n = 0;
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f)
    return;
  FILE *out = copy_to ? fopen(copy_to, "w") : NULL;
  char line[1024];
  mapgroup_t *cur = NULL;
  while (fgets(line, sizeof(line), f)) {
    if (out)
      fputs(line, out);
    unsigned long a, b;
    int off = 0;
    if (sscanf(line, "%lx-%lx %*s %*s %*s %*s%n", &a, &b, &off) == 2 && off > 0) {
      char name[72];
      group_name(line + off, name, sizeof(name));
      cur = NULL;
      for (int i = 0; i < ms->n; i++)
        if (strcmp(ms->g[i].name, name) == 0)
          cur = &ms->g[i];
      if (!cur && ms->n < MAX_NAMES) {
        cur = &ms->g[ms->n++];
        snprintf(cur->name, sizeof(cur->name), "%s", name);
        cur->count = 0;
        cur->rss_kib = cur->pss_kib = 0;
      }
      if (cur)
        cur->count++;
    } else if (cur && strncmp(line, "Rss:", 4) == 0) {
      cur->rss_kib += strtoll(line + 4, NULL, 10);
    } else if (cur && strncmp(line, "Pss:", 4) == 0) {
      cur->pss_kib += strtoll(line + 4, NULL, 10);
    }
  }
  if (out)
    fclose(out);
  fclose(f);
}

/* "name +count maps +rss KiB" for the groups that grew most, into buf. */
static void smaps_growth(const mapstat_t *b, const mapstat_t *a, int peers, char *buf, size_t cap)
{
  mapgroup_t d[MAX_NAMES];
  int nd = 0;
  for (int i = 0; i < a->n; i++) {
    mapgroup_t g = a->g[i];
    for (int j = 0; j < b->n; j++)
      if (strcmp(b->g[j].name, g.name) == 0) {
        g.count -= b->g[j].count;
        g.rss_kib -= b->g[j].rss_kib;
        g.pss_kib -= b->g[j].pss_kib;
      }
    if (g.count != 0 || g.rss_kib > 64 || g.rss_kib < -64)
      d[nd++] = g;
  }
  /* Largest Rss growth first. */
  for (int i = 0; i < nd; i++)
    for (int j = i + 1; j < nd; j++)
      if (d[j].rss_kib > d[i].rss_kib) {
        mapgroup_t t = d[i];
        d[i] = d[j];
        d[j] = t;
      }
  size_t o = 0;
  buf[0] = 0;
  for (int i = 0; i < nd && i < 6 && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%s %+d maps %+lld KiB (%.1f KiB/peer, Pss %.1f)",
                          i ? "; " : "", d[i].name, d[i].count, (long long)d[i].rss_kib,
                          peers ? (double)d[i].rss_kib / peers : 0.0,
                          peers ? (double)d[i].pss_kib / peers : 0.0);
  if (nd == 0)
    snprintf(buf, cap, "nothing grew");
}

/* --------------------------------------------------------- shared page */

enum { PH_INIT, PH_TARGET_READY, PH_GO, PH_IDLE, PH_IDLE_END, PH_QUIT };

/* Steps of one context's first round; st[] holds -step on failure. */
enum {
  ST_NONE,
  ST_OK,
  ST_CREATE,
  ST_CONNECT,
  ST_UNPACK,
  ST_PUT,
  ST_FENCE,
  ST_GET,
  ST_GETVAL,
  ST_FAA,
  ST_COUNT
};
static const char *step_name[] = {"not run", "ok",    "ctx_create", "connect",   "rmr_unpack",
                                  "put",     "fence", "get",        "get value", "faa"};

typedef struct proc_slot {
  _Atomic int err_taken[ST_COUNT];
  char err[ST_COUNT][256]; /* the first failure at each step, with hixl_last_error() */
  int created;             /* contexts created */
  int64_t create_ns;       /* creating them */
  snap_t s0, s1, s2;       /* before contexts, after creating them, after the burst */
  double idle_cpu_ms_s;
  int64_t teardown_ns;
  char tp[16];  /* the transport its first connection got */
  int put_ctxs; /* contexts that timed puts */
  char put_err[256];
} proc_slot_t;

typedef struct shared {
  _Atomic uint32_t phase, ready, burst, idle, turn, put_done, quit;
  _Atomic uint32_t connected; /* connects returned (ok or not), for --hold-ops */
  int n, procs;
  int64_t t_release;
  char addr[256];
  unsigned char blob[HIXL_RKEY_MAX];
  size_t blob_len;
  /* target's results */
  snap_t tpre, tb, ta; /* before its context, before the burst, after it */
  mapstat_t mb, ma;
  double idle_cpu_ms_s;
  uint64_t counter;
  int slots_bad, slots_ok;
  int64_t destroy_ns;
  char target_err[384];
  int target_done;
  proc_slot_t proc[MAX_PROCS];
  /* per rank, and the put samples: laid out after the struct */
} shared_t;

static shared_t *sh;
static int64_t *conn_start, *conn_done, *first_put, *unpack_ns; /* [n] */
static int *st;                                                 /* [n] */
static int64_t *put_lat; /* [PUT_CTXS * PUT_ITERS], -1: none */

static size_t shared_bytes(int n)
{
  return sizeof(shared_t) + (size_t)n * (4 * sizeof(int64_t) + sizeof(int)) +
         (size_t)PUT_CTXS * PUT_ITERS * sizeof(int64_t) + 64;
}

static void layout(int n)
{
  char *p = (char *)(sh + 1);
  p = (char *)(((uintptr_t)p + 7) & ~(uintptr_t)7);
  conn_start = (int64_t *)p;
  conn_done = conn_start + n;
  first_put = conn_done + n;
  unpack_ns = first_put + n;
  put_lat = unpack_ns + n;
  st = (int *)(put_lat + PUT_CTXS * PUT_ITERS);
}

static void record_err(char *dst, size_t cap, _Atomic int *taken, const char *what, hixl_status_t s)
{
  if (taken && atomic_exchange(taken, 1))
    return;
  snprintf(dst, cap, "%s: %s (%s)", what, hixl_strerror(s), hixl_last_error());
}

/* ------------------------------------------------------------- target */

static const char *g_smaps_dir;
static bool g_hold_ops;
static const char *g_tp;

static int target_main(void)
{
  raise_nofile();
  int n = sh->n, P = sh->procs;
  char mp[32];
  if (n > 1024 && !getenv("HIXL_MAX_PEERS")) { /* no thread yet: setenv is safe */
    snprintf(mp, sizeof(mp), "%d", n);
    setenv("HIXL_MAX_PEERS", mp, 1);
  }
  sh->tpre = take_snap();
  hixl_ctx_t *ctx;
  hixl_status_t s = hixl_ctx_create(NULL, &ctx);
  if (s != HIXL_OK) {
    record_err(sh->target_err, sizeof(sh->target_err), NULL, "target hixl_ctx_create", s);
    return 1;
  }
  size_t len = REGION_BASE + 8 * ((size_t)n + 1);
  void *mem;
  hixl_mr_t *mr;
  s = hixl_mem_alloc(ctx, len, HIXL_MEM_HOST,
                     HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC, &mem, &mr);
  size_t bl = sizeof(sh->blob);
  if (s == HIXL_OK)
    s = hixl_mr_pack(mr, sh->blob, &bl);
  if (s != HIXL_OK) {
    record_err(sh->target_err, sizeof(sh->target_err), NULL, "target hixl_mem_alloc/mr_pack", s);
    return 1;
  }
  sh->blob_len = bl;
  snprintf(sh->addr, sizeof(sh->addr), "%s", hixl_ctx_address(ctx));
  set_wake(&sh->phase, PH_TARGET_READY);

  wait_ge(&sh->ready, (uint32_t)P); /* every initiator has its contexts */
  char path[512];
  snprintf(path, sizeof(path), "%s/smaps-%s-%d-before", g_smaps_dir ? g_smaps_dir : "", g_tp, n);
  read_smaps(&sh->mb, g_smaps_dir ? path : NULL);
  sh->tb = take_snap();

  sh->t_release = now_ns();
  set_wake(&sh->phase, PH_GO);
  wait_ge(&sh->burst, (uint32_t)P);
  sh->ta = take_snap();
  snprintf(path, sizeof(path), "%s/smaps-%s-%d-after", g_smaps_dir ? g_smaps_dir : "", g_tp, n);
  read_smaps(&sh->ma, g_smaps_dir ? path : NULL);

  /* Idle: everyone connected and quiet. */
  sleep_ms(200); /* let the burst's stragglers (closes, acks) settle */
  set_wake(&sh->phase, PH_IDLE);
  double c0 = cpu_s();
  int64_t t0 = now_ns();
  sleep_ms((int)(atof(getenv("HIXL_SCALE_IDLE_MS")) + 0.5));
  double c1 = cpu_s();
  int64_t t1 = now_ns();
  set_wake(&sh->phase, PH_IDLE_END);
  sh->idle_cpu_ms_s = (c1 - c0) * 1e3 / ((double)(t1 - t0) / 1e9);
  wait_ge(&sh->idle, (uint32_t)P);

  /* Put latency, one initiator process at a time. */
  for (int p = 0; p < P; p++) {
    set_wake(&sh->turn, (uint32_t)p + 1);
    wait_ge(&sh->put_done, (uint32_t)p + 1);
  }

  /* Check. */
  volatile uint64_t *w = mem;
  sh->counter = w[0];
  for (int i = 0; i < n; i++) {
    if (st[i] != ST_OK)
      continue;
    if (w[1 + i] == (SLOT_MAGIC | (uint64_t)i))
      sh->slots_ok++;
    else
      sh->slots_bad++;
  }

  set_wake(&sh->phase, PH_QUIT);
  wait_ge(&sh->quit, (uint32_t)P);
  int64_t d0 = now_ns();
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(ctx);
  sh->destroy_ns = now_ns() - d0;
  sh->target_done = 1;
  return 0;
}

/* --------------------------------------------------------- initiators */

typedef struct ictx {
  hixl_ctx_t *ctx;
  hixl_peer_t *peer;
  hixl_rmr_t *rmr;
  int rank;
  proc_slot_t *ps;
} ictx_t;

static int fail(ictx_t *c, int step, const char *what, hixl_status_t s)
{
  st[c->rank] = -step;
  char w[96];
  snprintf(w, sizeof(w), "rank %d %s", c->rank, what);
  record_err(c->ps->err[step], sizeof(c->ps->err[step]), &c->ps->err_taken[step], w, s);
  return -1;
}

/* One context's burst: connect, then the first round of operations. */
static void *burst_main(void *arg)
{
  ictx_t *c = arg;
  int i = c->rank;
  wait_ge(&sh->phase, PH_GO);
  conn_start[i] = now_ns();
  hixl_status_t s = hixl_connect(c->ctx, sh->addr, 30000, &c->peer);
  int64_t t = now_ns();
  conn_done[i] = t;
  bump_wake(&sh->connected);
  if (s != HIXL_OK) {
    c->peer = NULL;
    fail(c, ST_CONNECT, "hixl_connect", s);
    return NULL;
  }
  if (g_hold_ops) { /* set before the initiators were forked */
    /* Every connect first (or 30 s, for contexts never made): the burst
     * alone, its connects not sharing the CPUs with first operations. */
    uint32_t cur;
    while ((cur = atomic_load(&sh->connected)) < (uint32_t)sh->n && now_ns() - t < 30000000000LL)
      futex_wait(&sh->connected, cur, 100);
    t = now_ns();
  }
  uint64_t off = 8 + 8 * (uint64_t)i, val = SLOT_MAGIC | (uint64_t)i, got = 0, old = 0;
  if ((s = hixl_rmr_unpack(c->peer, sh->blob, sh->blob_len, &c->rmr)) != HIXL_OK) {
    c->rmr = NULL;
    fail(c, ST_UNPACK, "hixl_rmr_unpack", s);
    return NULL;
  }
  unpack_ns[i] = now_ns() - t;
  if ((s = hixl_put(c->peer, &val, 8, c->rmr, off, 0, NULL)) != HIXL_OK) {
    fail(c, ST_PUT, "hixl_put", s);
    return NULL;
  }
  if ((s = hixl_fence(c->ctx, c->peer, 10000)) != HIXL_OK) {
    fail(c, ST_FENCE, "hixl_fence after the first put", s);
    return NULL;
  }
  first_put[i] = now_ns() - t;
  if ((s = hixl_get(c->peer, &got, 8, c->rmr, off, 0, NULL)) != HIXL_OK ||
      (s = hixl_fence(c->ctx, c->peer, 10000)) != HIXL_OK) {
    fail(c, ST_GET, "hixl_get", s);
    return NULL;
  }
  if (got != val) {
    st[i] = -ST_GETVAL;
    if (!atomic_exchange(&c->ps->err_taken[ST_GETVAL], 1))
      snprintf(c->ps->err[ST_GETVAL], sizeof(c->ps->err[ST_GETVAL]),
               "rank %d: get read %#llx, want %#llx", i, (unsigned long long)got,
               (unsigned long long)val);
    return NULL;
  }
  if ((s = hixl_atomic_faa(c->peer, c->rmr, 0, 1, &old, 0, NULL)) != HIXL_OK ||
      (s = hixl_fence(c->ctx, c->peer, 10000)) != HIXL_OK) {
    fail(c, ST_FAA, "hixl_atomic_faa", s);
    return NULL;
  }
  st[i] = ST_OK;
  return NULL;
}

static int initiator_main(int p)
{
  raise_nofile();
  int n = sh->n, P = sh->procs;
  int lo = (int)((int64_t)n * p / P), hi = (int)((int64_t)n * (p + 1) / P), k = hi - lo;
  proc_slot_t *ps = &sh->proc[p];
  ps->s0 = take_snap();
  wait_ge(&sh->phase, PH_TARGET_READY);
  ictx_t *cs = calloc((size_t)k, sizeof(*cs));
  pthread_t *th = calloc((size_t)k, sizeof(*th));
  bool *started = calloc((size_t)k, sizeof(*started));
  if (!cs || !th || !started)
    return 1;
  int64_t t0 = now_ns();
  int created = 0;
  for (int j = 0; j < k; j++) {
    cs[j].rank = lo + j;
    cs[j].ps = ps;
    hixl_status_t s = hixl_ctx_create(NULL, &cs[j].ctx);
    if (s != HIXL_OK) {
      cs[j].ctx = NULL;
      for (int r = j; r < k; r++)
        st[lo + r] = -ST_CREATE;
      char w[96];
      snprintf(w, sizeof(w), "hixl_ctx_create of context %d of this process", j);
      record_err(ps->err[ST_CREATE], sizeof(ps->err[ST_CREATE]), &ps->err_taken[ST_CREATE], w, s);
      break;
    }
    created++;
  }
  ps->create_ns = now_ns() - t0;
  ps->created = created;
  ps->s1 = take_snap();
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  for (int j = 0; j < created; j++) {
    int e = pthread_create(&th[j], &attr, burst_main, &cs[j]);
    if (e != 0) {
      st[lo + j] = -ST_CONNECT;
      if (!atomic_exchange(&ps->err_taken[ST_CONNECT], 1))
        snprintf(ps->err[ST_CONNECT], sizeof(ps->err[ST_CONNECT]), "pthread_create for rank %d: %s",
                 lo + j, strerror(e));
      continue;
    }
    started[j] = true;
  }
  pthread_attr_destroy(&attr);
  bump_wake(&sh->ready);
  for (int j = 0; j < created; j++)
    if (started[j])
      pthread_join(th[j], NULL);
  for (int j = 0; j < created; j++)
    if (cs[j].peer) {
      snprintf(ps->tp, sizeof(ps->tp), "%s", hixl_peer_transport(cs[j].peer));
      break;
    }
  ps->s2 = take_snap();
  bump_wake(&sh->burst);

  wait_ge(&sh->phase, PH_IDLE);
  double c0 = cpu_s();
  int64_t w0 = now_ns();
  wait_ge(&sh->phase, PH_IDLE_END);
  double c1 = cpu_s();
  int64_t w1 = now_ns();
  ps->idle_cpu_ms_s = (c1 - c0) * 1e3 / ((double)(w1 - w0) / 1e9);
  bump_wake(&sh->idle);

  /* Put latency: every stride-th rank, at most PUT_CTXS of them. */
  wait_ge(&sh->turn, (uint32_t)p + 1);
  int stride = (n + PUT_CTXS - 1) / PUT_CTXS;
  for (int j = 0; j < created; j++) {
    int r = lo + j;
    ictx_t *c = &cs[j];
    if (r % stride != 0 || st[r] != ST_OK)
      continue;
    int64_t *lat = put_lat + (size_t)(r / stride) * PUT_ITERS;
    uint64_t val = SLOT_MAGIC | (uint64_t)r, off = 8 + 8 * (uint64_t)r;
    for (int it = 0; it < PUT_ITERS; it++) {
      int64_t a = now_ns();
      hixl_status_t s = hixl_put(c->peer, &val, 8, c->rmr, off, 0, NULL);
      if (s == HIXL_OK)
        s = hixl_fence(c->ctx, c->peer, 10000);
      if (s != HIXL_OK) {
        char w[96];
        snprintf(w, sizeof(w), "rank %d put+fence %d", r, it);
        record_err(ps->put_err, sizeof(ps->put_err), NULL, w, s);
        break;
      }
      lat[it] = now_ns() - a;
    }
    ps->put_ctxs++;
  }
  bump_wake(&sh->put_done);

  wait_ge(&sh->phase, PH_QUIT);
  int64_t d0 = now_ns();
  for (int j = 0; j < created; j++) {
    hixl_rmr_release(cs[j].rmr);
    if (cs[j].peer)
      hixl_disconnect(cs[j].peer);
    hixl_ctx_destroy(cs[j].ctx);
  }
  ps->teardown_ns = now_ns() - d0;
  bump_wake(&sh->quit);
  free(cs);
  free(th);
  free(started);
  return 0;
}

/* ------------------------------------------------------- orchestrator */

static volatile sig_atomic_t g_alarm;
static void on_alarm(int sig)
{
  (void)sig;
  g_alarm = 1;
}

static int64_t mem_available_kib(void) { return field_kib("/proc/meminfo", "MemAvailable"); }

/* "a / b" with two decimals, or "n/a" when a < 0. */
static void fmt_pair(char *buf, size_t cap, double a, double b)
{
  if (a < 0)
    snprintf(buf, cap, "n/a");
  else
    snprintf(buf, cap, "%.2f / %.2f", a, b);
}

/* One N: fork, run, collect, print.  Returns 0 when the check passed. */
static int run_n(int n, int P, int timeout_s)
{
  if (P > n)
    P = n;
  size_t bytes = shared_bytes(n);
  sh = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) {
    perror("hixl-scale: mmap");
    return 1;
  }
  sh->n = n;
  sh->procs = P;
  layout(n);
  for (int i = 0; i < PUT_CTXS * PUT_ITERS; i++)
    put_lat[i] = -1;
  fflush(stdout);
  fflush(stderr);

  pid_t pids[MAX_PROCS + 1];
  int npids = 0;
  pid_t pid = fork();
  if (pid == 0)
    _exit(target_main());
  pids[npids++] = pid;
  for (int p = 0; p < P; p++) {
    pid = fork();
    if (pid == 0)
      _exit(initiator_main(p));
    pids[npids++] = pid;
  }

  /* Wait for all; kill everyone when one dies badly, on the watchdog, or
   * when memory runs short, so that nothing hangs. */
  char failure[256] = "";
  int alive = npids;
  bool killed = false;
  g_alarm = 0;
  alarm((unsigned)timeout_s);
  int64_t t_start = now_ns();
  while (alive > 0) {
    int status;
    pid_t w = waitpid(-1, &status, WNOHANG);
    if (w > 0) {
      alive--;
      bool bad = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
      if (bad && !killed) {
        int who = -1;
        for (int i = 0; i < npids; i++)
          if (pids[i] == w)
            who = i;
        if (WIFSIGNALED(status))
          snprintf(failure, sizeof(failure), "%s %d killed by signal %d",
                   who == 0 ? "target" : "initiator", who == 0 ? 0 : who - 1, WTERMSIG(status));
        else
          snprintf(failure, sizeof(failure), "%s %d exited with %d",
                   who == 0 ? "target" : "initiator", who == 0 ? 0 : who - 1, WEXITSTATUS(status));
      }
      for (int i = 0; i < npids; i++)
        if (pids[i] == w)
          pids[i] = 0;
      if (bad && !killed) {
        killed = true;
        for (int i = 0; i < npids; i++)
          if (pids[i] > 0)
            kill(pids[i], SIGKILL);
      }
      continue;
    }
    if (w < 0 && errno == ECHILD)
      break;
    int64_t avail = mem_available_kib();
    if (!killed && (g_alarm || (avail >= 0 && avail < 512 * 1024))) {
      killed = true;
      if (g_alarm)
        snprintf(failure, sizeof(failure), "watchdog: not done after %d s (phase %u)", timeout_s,
                 atomic_load(&sh->phase));
      else
        snprintf(failure, sizeof(failure), "memory: MemAvailable %lld KiB, stopped (phase %u)",
                 (long long)avail, atomic_load(&sh->phase));
      for (int i = 0; i < npids; i++)
        if (pids[i] > 0)
          kill(pids[i], SIGKILL);
    }
    sleep_ms(50);
  }
  alarm(0);
  double wall_s = (double)(now_ns() - t_start) / 1e9;

  /* Figures. */
  int ok = 0, nconn = 0, bycode[16] = {0};
  int64_t last = 0;
  int64_t *fp = malloc(sizeof(int64_t) * (size_t)n), *cd = malloc(sizeof(int64_t) * (size_t)n);
  int64_t *pl = malloc(sizeof(int64_t) * PUT_CTXS * PUT_ITERS);
  int64_t *up = malloc(sizeof(int64_t) * (size_t)n), *pf = malloc(sizeof(int64_t) * (size_t)n);
  int nfp = 0, ncd = 0, npl = 0;
  for (int i = 0; i < n; i++) {
    int s = st[i] < 0 ? -st[i] : st[i];
    bycode[s < 16 ? s : 0]++;
    if (st[i] == ST_OK)
      ok++;
    if (st[i] == ST_OK || st[i] < -ST_CONNECT) { /* connected */
      nconn++;
      if (conn_done[i] > last)
        last = conn_done[i];
      cd[ncd++] = conn_done[i] - conn_start[i];
    }
    if (st[i] == ST_OK || st[i] < -ST_FENCE) {
      up[nfp] = unpack_ns[i];
      pf[nfp] = first_put[i] - unpack_ns[i];
      fp[nfp++] = first_put[i];
    }
  }
  for (int i = 0; i < PUT_CTXS * PUT_ITERS; i++)
    if (put_lat[i] >= 0)
      pl[npl++] = put_lat[i];
  double cps = nconn && last > sh->t_release ? nconn / ((double)(last - sh->t_release) / 1e9) : 0;
  int64_t fp50 = pct(fp, nfp, 0.50), fp99 = pct(fp, nfp, 0.99);
  int64_t pl50 = pct(pl, npl, 0.50), pl99 = pct(pl, npl, 0.99);
  int64_t cd50 = pct(cd, ncd, 0.50), cd99 = pct(cd, ncd, 0.99);
  int64_t up50 = pct(up, nfp, 0.50), up99 = pct(up, nfp, 0.99);
  int64_t pf50 = pct(pf, nfp, 0.50), pf99 = pct(pf, nfp, 0.99);
  bool have_after = atomic_load(&sh->burst) >= (uint32_t)P;
  bool have_idle = atomic_load(&sh->idle) >= (uint32_t)P;
  double idle_init = 0;
  for (int p = 0; p < P; p++)
    idle_init += sh->proc[p].idle_cpu_ms_s;
  bool pass = !failure[0] && sh->target_done && ok == n && sh->counter == (uint64_t)n &&
              sh->slots_ok == n && sh->slots_bad == 0;

  /* Notes first (stderr), then the row (stdout). */
  for (int p = 0; p < P; p++) {
    for (int e = 0; e < ST_COUNT; e++)
      if (sh->proc[p].err[e][0])
        fprintf(stderr, "# N=%d initiator %d, first failure at %s: %s\n", n, p, step_name[e],
                sh->proc[p].err[e]);
    if (sh->proc[p].put_err[0])
      fprintf(stderr, "# N=%d initiator %d: %s\n", n, p, sh->proc[p].put_err);
  }
  if (sh->target_err[0])
    fprintf(stderr, "# N=%d target: %s\n", n, sh->target_err);
  if (failure[0])
    fprintf(stderr, "# N=%d FAILED: %s\n", n, failure);
  if (ok != n) {
    fprintf(stderr, "# N=%d reached: %d of %d connected, %d completed the first round;", n, nconn,
            n, ok);
    for (int s = 0; s < 16 && s < (int)(sizeof(step_name) / sizeof(*step_name)); s++)
      if (bycode[s] && s != ST_OK)
        fprintf(stderr, " %d failed at %s;", bycode[s], step_name[s]);
    fprintf(stderr, "\n");
  }
  int peers = nconn ? nconn : 1;
  if (have_after) {
    char g[1200];
    smaps_growth(&sh->mb, &sh->ma, peers, g, sizeof(g));
    fprintf(stderr, "# N=%d target smaps growth: %s\n", n, g);
    fprintf(stderr,
            "# N=%d target context and region, once (before any peer): %+lld KiB RSS, %+d fds, "
            "%+d threads, %+d maps\n",
            n, (long long)(sh->tb.rss_kib - sh->tpre.rss_kib), sh->tb.fds - sh->tpre.fds,
            sh->tb.threads - sh->tpre.threads, sh->tb.maps - sh->tpre.maps);
    fprintf(stderr,
            "# N=%d target: RSS %lld -> %lld KiB, Pss %lld -> %lld, shared %lld -> %lld "
            "(Pss_Shmem %lld -> %lld), fds %d -> %d, maps %d -> %d, threads %d -> %d\n",
            n, (long long)sh->tb.rss_kib, (long long)sh->ta.rss_kib, (long long)sh->tb.pss_kib,
            (long long)sh->ta.pss_kib, (long long)sh->tb.shared_kib, (long long)sh->ta.shared_kib,
            (long long)sh->tb.pss_shmem_kib, (long long)sh->ta.pss_shmem_kib, sh->tb.fds,
            sh->ta.fds, sh->tb.maps, sh->ta.maps, sh->tb.threads, sh->ta.threads);
    int64_t r1 = 0, r2 = 0, created = 0;
    int f1 = 0, f2 = 0, t1 = 0, t2 = 0;
    double cr = 0, td = 0;
    for (int p = 0; p < P; p++) {
      proc_slot_t *q = &sh->proc[p];
      r1 += q->s1.rss_kib - q->s0.rss_kib;
      r2 += q->s2.rss_kib - q->s1.rss_kib;
      f1 += q->s1.fds - q->s0.fds;
      f2 += q->s2.fds - q->s1.fds;
      t1 += q->s1.threads - q->s0.threads;
      t2 += q->s2.threads - q->s1.threads;
      created += q->created;
      if ((double)q->create_ns / 1e6 > cr)
        cr = (double)q->create_ns / 1e6;
      if ((double)q->teardown_ns / 1e6 > td)
        td = (double)q->teardown_ns / 1e6;
    }
    double c = created ? (double)created : 1;
    fprintf(stderr,
            "# N=%d initiators (%d procs, transport %s): per context created %.1f KiB RSS, "
            "%.2f fds, %.2f threads (slowest proc created its %d in %.0f ms); per connection "
            "%+.1f KiB, %+.2f fds; connect call p50/p99 %.1f / %.1f ms; first put = rmr_unpack "
            "p50/p99 %.2f / %.2f ms + put+fence %.2f / %.2f ms\n",
            n, P, sh->proc[0].tp[0] ? sh->proc[0].tp : "?", (double)r1 / c, f1 / c, t1 / c,
            sh->proc[0].created, cr, (double)r2 / peers, (double)f2 / peers, (double)cd50 / 1e6,
            (double)cd99 / 1e6, (double)up50 / 1e6, (double)up99 / 1e6, (double)pf50 / 1e6,
            (double)pf99 / 1e6);
    (void)t2;
    fprintf(stderr,
            "# N=%d check: counter %llu (want %d), slots %d ok %d bad; teardown: initiators "
            "%.0f ms (slowest proc), target destroy %.0f ms; %d put contexts; wall %.1f s\n",
            n, (unsigned long long)sh->counter, n, sh->slots_ok, sh->slots_bad, td,
            (double)sh->destroy_ns / 1e6, npl / PUT_ITERS, wall_s);
  }

  char kib[32] = "n/a", pss[32] = "n/a", fds[32] = "n/a", maps[32] = "n/a", thr[32] = "n/a";
  char cpsb[48], fpb[80], idt[32] = "n/a", idi[32] = "n/a", plb[80];
  if (have_after) {
    snprintf(kib, sizeof(kib), "%.1f", (double)(sh->ta.rss_kib - sh->tb.rss_kib) / peers);
    snprintf(pss, sizeof(pss), "%.1f", (double)(sh->ta.pss_kib - sh->tb.pss_kib) / peers);
    snprintf(fds, sizeof(fds), "%.2f", (double)(sh->ta.fds - sh->tb.fds) / peers);
    snprintf(maps, sizeof(maps), "%.2f", (double)(sh->ta.maps - sh->tb.maps) / peers);
    snprintf(thr, sizeof(thr), "%d -> %d", sh->tb.threads, sh->ta.threads);
  }
  if (nconn == n)
    snprintf(cpsb, sizeof(cpsb), "%.0f", cps);
  else
    snprintf(cpsb, sizeof(cpsb), "%.0f (%d/%d)", cps, nconn, n);
  fmt_pair(fpb, sizeof(fpb), nfp ? (double)fp50 / 1e6 : -1, (double)fp99 / 1e6);
  if (have_idle) {
    snprintf(idt, sizeof(idt), "%.2f", sh->idle_cpu_ms_s);
    snprintf(idi, sizeof(idi), "%.2f", idle_init);
  }
  fmt_pair(plb, sizeof(plb), npl ? (double)pl50 / 1e3 : -1, (double)pl99 / 1e3);
  printf("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", g_tp, n, kib, pss,
         fds, maps, thr, cpsb, fpb, idt, idi, plb, pass ? "OK" : "FAILED");
  fflush(stdout);
  fflush(stderr);
  free(fp);
  free(cd);
  free(pl);
  free(up);
  free(pf);
  munmap(sh, bytes);
  sh = NULL;
  return pass ? 0 : 1;
}

static void usage(const char *argv0)
{
  fprintf(stderr,
          "usage: %s [--transport shm|fabric|verbs] [--peers N[,N,...]] [--procs P] [--idle-s S]\n"
          "          [--timeout-s S] [--smaps DIR] [--hold-ops]\n",
          argv0);
  exit(2);
}

int main(int argc, char **argv)
{
  const char *tp = "shm", *peers = "16,64,256,1024";
  int P = 4, timeout_s = 300;
  double idle_s = 2;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--transport") == 0 && i + 1 < argc)
      tp = argv[++i];
    else if (strcmp(argv[i], "--peers") == 0 && i + 1 < argc)
      peers = argv[++i];
    else if (strcmp(argv[i], "--procs") == 0 && i + 1 < argc)
      P = atoi(argv[++i]);
    else if (strcmp(argv[i], "--idle-s") == 0 && i + 1 < argc)
      idle_s = atof(argv[++i]);
    else if (strcmp(argv[i], "--timeout-s") == 0 && i + 1 < argc)
      timeout_s = atoi(argv[++i]);
    else if (strcmp(argv[i], "--smaps") == 0 && i + 1 < argc)
      g_smaps_dir = argv[++i];
    else if (strcmp(argv[i], "--hold-ops") == 0)
      g_hold_ops = true;
    else
      usage(argv[0]);
  }
  if (P < 1 || P > MAX_PROCS || idle_s <= 0 || timeout_s < 1 ||
      (strcmp(tp, "shm") != 0 && strcmp(tp, "fabric") != 0 && strcmp(tp, "verbs") != 0))
    usage(argv[0]);
  g_tp = tp;

  /* The environment of every process, before any fork. */
  setenv("HIXL_TRANSPORTS", tp, 1);
  /* Transports set up at hixl_ctx_create (unless HIXL_LAZY is set): the
   * target's before-the-burst figures then include its one-time fabric
   * set-up, and the burst times connects, not each initiator context's
   * libfabric set-up (which a real peer pays once, elsewhere). */
  setenv("HIXL_LAZY", "0", 0);
  if (strcmp(tp, "fabric") == 0)
    setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 0);
  char ms[32];
  snprintf(ms, sizeof(ms), "%.0f", idle_s * 1e3);
  setenv("HIXL_SCALE_IDLE_MS", ms, 1);
  long nofile = raise_nofile();
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_alarm;
  sigaction(SIGALRM, &sa, NULL);

  fprintf(stderr,
          "# hixl-scale: transport %s (HIXL_TRANSPORTS=%s%s%s, HIXL_LAZY=%s), %d initiator "
          "processes, idle %.1f s, RLIMIT_NOFILE %ld, watchdog %d s per N%s\n",
          tp, tp, strcmp(tp, "fabric") == 0 ? ", HIXL_FABRIC_PROVIDER=" : "",
          strcmp(tp, "fabric") == 0 ? getenv("HIXL_FABRIC_PROVIDER") : "", getenv("HIXL_LAZY"), P,
          idle_s, nofile, timeout_s,
          g_hold_ops ? ", first operations held until every connect returned" : "");
  printf("| transport | N | target KiB/peer (RSS) | Pss KiB/peer | fds/peer | maps/peer | target "
         "threads | connects/s | first put p50 / p99 (ms) | idle target CPU ms/s | idle "
         "initiators CPU ms/s | put+fence p50 / p99 (us) | check |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  fflush(stdout);

  int rc = 0;
  const char *p = peers;
  while (*p) {
    char *end;
    long n = strtol(p, &end, 10);
    if (end == p || n < 1 || n > 1 << 20)
      usage(argv[0]);
    rc |= run_n((int)n, P, timeout_s);
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',')
      usage(argv[0]);
  }
  return rc;
}

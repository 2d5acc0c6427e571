/* SPDX-License-Identifier: MIT */
/*
 * kv_transfer: prefill/decode disaggregation (the seeds' example 003).
 *
 * The decode process owns a paged KV-cache pool laid out like vLLM's paged
 * attention: per layer, a K and a V tensor of NB blocks, each block holding
 * `block_tokens` tokens x `kv_heads` x `head_dim` values (fp16/bf16).  It is
 * one hixl_mem_alloc'ed region, published as "kv_pool".
 *
 * For each request decode takes free block ids and hands prefill a
 * descriptor {request, sequence length, block ids} with one put_imm into the
 * slot prefill published for it.  Prefill "computes" the KV cache layer by
 * layer (deterministic data from request, layer, K/V, token) and writes each
 * layer's blocks into the pool with one hixl_put_batch whose immediate
 * {slot, layer} tells decode that layer is there, so decode starts on layer
 * 0 while later layers are in flight.  Decode checks every byte of every
 * block against the same generator and frees the blocks.
 *
 * After an untimed warm-up pass (the first write to each page of the pool
 * faults it into prefill's mapping), the same requests run with a batch per
 * layer, with one put per block (the layer's notification then an ORDERED
 * notify), and two-sided: the same blocks sent over a TCP socket and
 * received straight into their places in the pool (the baseline).  Each
 * pass prints its transfer time and bandwidth apart from the time spent
 * generating the KV data (prefill) and checking it (decode), then the
 * end-to-end figure, time to first layer and layer spacing.
 *
 *   kv_transfer [--model tiny|llama2-7b|llama2-70b] [--requests N]
 *               [--seq-len MIN:MAX] [--blocks NB] [--concurrency C]
 *               [--passes batch,block,tcp] [--no-warmup]
 *
 * By default it forks prefill itself (decode prints its address to it);
 * --role decode / --role prefill --connect ADDR run the two sides apart
 * (two hosts on verbs).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <hixl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                                \
  do {                                                                                             \
    hixl_status_t st_ = (call);                                                                    \
    if (st_ != HIXL_OK) {                                                                          \
      fprintf(stderr, "%s: %s failed: %s (%s)\n", g_role, #call, hixl_strerror(st_),               \
              hixl_last_error());                                                                  \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static const char *g_role = "kv_transfer";

/* ------------------------------------------------------------ shapes */

typedef struct shape {
  const char *name;
  int layers, kv_heads, head_dim, block_tokens;
} shape_t;

static const shape_t shapes[] = {
    {"tiny", 4, 4, 64, 16},         /* for tests: 8 KiB blocks */
    {"llama2-7b", 32, 32, 128, 16}, /* 128 KiB K (and V) per block per layer */
    {"llama2-70b", 80, 8, 128, 16}, /* grouped-query attention: 8 KV heads */
};

/* How a pass moves the KV blocks. */
enum { MODE_BATCH, MODE_BLOCK, MODE_TCP, NMODES };
static const char *const mode_name[NMODES] = {"one batch per layer", "one put per block",
                                              "two-sided (TCP)"};
static const char *const mode_opt[NMODES] = {"batch", "block", "tcp"};

#define MAX_PASSES 8

typedef struct cfg {
  shape_t s;
  int dtype_bytes; /* fp16 and bf16: 2 */
  int requests, seq_min, seq_max, blocks, concurrency;
  int passes[MAX_PASSES], npasses; /* the timed passes, in order */
  bool warmup;                     /* an untimed batch pass first */
} cfg_t;

#define MAX_SLOTS 64
#define MAX_REQ_BLOCKS 512
#define IMM_DESC 0x80000000u /* decode -> prefill: descriptor in slot (low bits) */
#define IMM_HELLO 0x40000000u
#define IMM_STOP 0x20000000u
#define IMM_PORT 0x10000000u     /* decode -> prefill: connect to this TCP port (low bits) */
#define IMM_TWOSIDED 0x08000000u /* decode -> prefill: descriptors come by TCP now */
#define IMM_REPORT 0x04000000u   /* decode -> prefill: send this pass's figures by TCP */

/* One request as decode hands it to prefill (in prefill's slot memory, or
 * over the socket in the two-sided pass; nblocks 0 there ends the pass).
 * pass: pass number << 2 | mode. */
typedef struct desc {
  uint32_t req, seq_len, nblocks, pass;
  uint32_t block[MAX_REQ_BLOCKS];
} desc_t;

/* What prefill measured in one pass, sent to decode over the socket. */
typedef struct report {
  double gen;          /* seconds generating the KV data */
  double xfer;         /* seconds in hixl calls (issue and wait), or in send() */
  double bytes;        /* KV bytes written */
  double lat50, lat99; /* per layer, seconds in hixl calls (or send) */
} report_t;

static size_t block_bytes(const cfg_t *c)
{
  return (size_t)c->s.block_tokens * (size_t)c->s.kv_heads * (size_t)c->s.head_dim *
         (size_t)c->dtype_bytes;
}
/* Offset of (layer, K=0/V=1, block) in the pool: [layer][kv][block][...]. */
static uint64_t pool_off(const cfg_t *c, int layer, int kv, uint32_t block)
{
  return (((uint64_t)layer * 2 + (uint64_t)kv) * (uint64_t)c->blocks + block) * block_bytes(c);
}

/* The "computed" KV values of (request, layer, kv, block index within the
 * request): 8-byte words from a hash, so any misplaced or stale byte shows. */
static uint64_t mix(uint64_t x)
{
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
static void generate(const cfg_t *c, uint32_t req, int layer, int kv, uint32_t bi, void *out)
{
  uint64_t *w = out,
           seed = mix(((uint64_t)req << 24) ^ ((uint64_t)layer << 12) ^ ((uint64_t)kv << 11) ^ bi);
  for (size_t i = 0; i < block_bytes(c) / 8; i++)
    w[i] = mix(seed + i);
}

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, int n, int p)
{
  if (n == 0)
    return 0;
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return v[(n - 1) * p / 100];
}

/* ------------------------------------------------------------ two-sided */

/* All of iov (any count: IOV_MAX at a time) sent or received, or exit. */
static void io_vec(int fd, struct iovec *iov, size_t cnt, bool out)
{
  while (cnt > 0) {
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = cnt < IOV_MAX ? cnt : IOV_MAX};
    ssize_t k = out ? sendmsg(fd, &m, MSG_NOSIGNAL) : recvmsg(fd, &m, MSG_WAITALL);
    if (k <= 0) {
      if (k < 0 && errno == EINTR)
        continue;
      fprintf(stderr, "%s: two-sided %s: %s\n", g_role, out ? "send" : "recv",
              k == 0 ? "connection closed" : strerror(errno));
      exit(1);
    }
    size_t done = (size_t)k;
    while (cnt > 0 && done >= iov->iov_len) {
      done -= iov->iov_len;
      iov++;
      cnt--;
    }
    if (cnt > 0) {
      iov->iov_base = (uint8_t *)iov->iov_base + done;
      iov->iov_len -= done;
    }
  }
}

static void io_all(int fd, void *buf, size_t n, bool out)
{
  struct iovec v = {buf, n};
  io_vec(fd, &v, 1, out);
}

static void tcp_opts(int fd)
{
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* ------------------------------------------------------------ notifications */

/* Normally each role has its own context and simply waits.  With --self both
 * roles are threads of one context (the self transport): one notification
 * queue, so whichever thread takes a notification meant for the other (by
 * its immediate: descriptors and stop are prefill's, the rest decode's)
 * leaves it in the other's mailbox. */
static bool g_shared;
static pthread_mutex_t g_mbox_lock = PTHREAD_MUTEX_INITIALIZER;
static hixl_notif_t g_mbox[2][4096];
static int g_mbox_n[2];

static bool for_prefill(uint32_t imm)
{
  return (imm & (IMM_DESC | IMM_PORT | IMM_TWOSIDED | IMM_REPORT)) || imm == IMM_STOP;
}

static hixl_status_t take(hixl_ctx_t *ctx, int role /* 0 prefill, 1 decode */, hixl_notif_t *n,
                          int timeout_ms)
{
  if (!g_shared)
    return hixl_notif_wait(ctx, n, timeout_ms);
  double until = timeout_ms < 0 ? 1e300 : now_s() + timeout_ms / 1e3;
  for (;;) {
    pthread_mutex_lock(&g_mbox_lock);
    if (g_mbox_n[role] > 0) {
      *n = g_mbox[role][0];
      memmove(g_mbox[role], g_mbox[role] + 1, sizeof(hixl_notif_t) * (size_t)--g_mbox_n[role]);
      pthread_mutex_unlock(&g_mbox_lock);
      return HIXL_OK;
    }
    int got = hixl_notif_poll(ctx, n, 1);
    if (got == 1 && (for_prefill(n->imm) ? 0 : 1) != role) {
      int other = 1 - role;
      if (g_mbox_n[other] == 4096) {
        fprintf(stderr, "%s: mailbox full\n", g_role);
        exit(1);
      }
      g_mbox[other][g_mbox_n[other]++] = *n;
      got = 0;
    }
    pthread_mutex_unlock(&g_mbox_lock);
    if (got == 1)
      return HIXL_OK;
    if (got < 0)
      return got;
    if (now_s() > until)
      return HIXL_ERR_TIMEOUT;
    hixl_progress(ctx);
    sched_yield();
  }
}

/* ------------------------------------------------------------ prefill */

/* Prefill's figures of the pass under way. */
typedef struct pre_stats {
  double gen, xfer, bytes;
  double *lat;
  int nlat;
} pre_stats_t;

static void lat_add(pre_stats_t *ps, double v)
{
  if (ps->nlat < 100000)
    ps->lat[ps->nlat++] = v;
}

/* A socket to decode's two-sided port: the host of its hixl address. */
static int tcp_connect(const char *addr, uint16_t port)
{
  char host[256];
  snprintf(host, sizeof(host), "%s", addr[0] == '[' ? addr + 1 : addr);
  char *end = addr[0] == '[' ? strchr(host, ']') : strrchr(host, ':');
  if (end)
    *end = 0;
  char ps[8];
  snprintf(ps, sizeof(ps), "%u", port);
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
  int g = getaddrinfo(host, ps, &hints, &res);
  if (g != 0) {
    fprintf(stderr, "prefill: two-sided: cannot resolve %s: %s\n", host, gai_strerror(g));
    exit(1);
  }
  int fd = socket(res->ai_family, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    fprintf(stderr, "prefill: two-sided connect to %s port %u: %s\n", host, port, strerror(errno));
    exit(1);
  }
  freeaddrinfo(res);
  tcp_opts(fd);
  return fd;
}

/* Generate layer l of request d into base, (block, K/V) after one another;
 * fill x with where each block goes in the pool. */
static int gen_layer(const cfg_t *c, const desc_t *d, int l, uint8_t *base, hixl_rmr_t *pool,
                     hixl_xfer_t *x, pre_stats_t *ps)
{
  size_t bb = block_bytes(c);
  double t0 = now_s();
  int k = 0;
  for (uint32_t b = 0; b < d->nblocks; b++)
    for (int kv = 0; kv < 2; kv++) {
      uint8_t *src = base + ((size_t)b * 2 + (size_t)kv) * bb;
      generate(c, d->req, l, kv, b, src);
      if (x)
        x[k] = (hixl_xfer_t){src, pool, pool_off(c, l, kv, d->block[b]), bb};
      k++;
    }
  ps->gen += now_s() - t0;
  ps->bytes += (double)k * (double)bb;
  return k;
}

/* One request, one-sided: a batch (or a put per block and an ORDERED
 * notify) per layer, two layers in flight.  Only the hixl calls (issuing a
 * layer's writes, waiting for them) count as transfer time. */
static void prefill_onesided(const cfg_t *c, hixl_peer_t *dec, hixl_rmr_t *pool, uint32_t slot,
                             const desc_t *d, uint8_t *stage, size_t layer_bytes, hixl_xfer_t *x,
                             pre_stats_t *ps)
{
  hixl_req_t *inflight[2] = {NULL, NULL};
  double busy[2] = {0, 0};
  bool per_block = (d->pass & 3) == MODE_BLOCK;
  for (int l = 0; l < c->s.layers; l++) {
    int half = l & 1;
    if (inflight[half]) { /* its staging half is about to be rewritten */
      double t0 = now_s();
      CHECK(hixl_req_wait(inflight[half], -1));
      busy[half] += now_s() - t0;
      ps->xfer += now_s() - t0;
      hixl_req_free(inflight[half]);
      inflight[half] = NULL;
      lat_add(ps, busy[half]);
    }
    int k = gen_layer(c, d, l, stage + (size_t)half * layer_bytes, pool, x, ps);
    uint32_t imm = slot << 8 | (uint32_t)l;
    double t0 = now_s();
    if (!per_block) {
      CHECK(hixl_put_batch(dec, x, (size_t)k, &imm, 0, &inflight[half]));
    } else {
      for (int i = 0; i < k; i++)
        CHECK(hixl_put(dec, x[i].local, x[i].len, pool, x[i].off, 0, NULL));
      /* ORDERED: the notification goes once every put above has landed. */
      CHECK(hixl_notify(dec, imm, HIXL_OP_ORDERED, &inflight[half]));
    }
    busy[half] = now_s() - t0;
    ps->xfer += busy[half];
  }
  for (int half = 0; half < 2; half++)
    if (inflight[half]) {
      double t0 = now_s();
      CHECK(hixl_req_wait(inflight[half], -1));
      busy[half] += now_s() - t0;
      ps->xfer += now_s() - t0;
      hixl_req_free(inflight[half]);
      lat_add(ps, busy[half]);
    }
}

/* The two-sided pass: descriptors come over the socket, each layer goes
 * back as a header {request, layer} and its blocks, one send. */
static void prefill_twosided(const cfg_t *c, int fd, uint8_t *stage, pre_stats_t *ps)
{
  desc_t d;
  for (;;) {
    io_all(fd, &d, offsetof(desc_t, block), false);
    if (d.nblocks == 0)
      return;
    if (d.nblocks > MAX_REQ_BLOCKS) {
      fprintf(stderr, "prefill: bad two-sided descriptor\n");
      exit(1);
    }
    io_all(fd, d.block, sizeof(uint32_t) * d.nblocks, false);
    for (int l = 0; l < c->s.layers; l++) {
      int k = gen_layer(c, &d, l, stage, NULL, NULL, ps);
      uint32_t hdr[2] = {d.req, (uint32_t)l};
      struct iovec v[2] = {{hdr, sizeof(hdr)}, {stage, (size_t)k * block_bytes(c)}};
      double t0 = now_s();
      io_vec(fd, v, 2, true);
      lat_add(ps, now_s() - t0);
      ps->xfer += now_s() - t0;
    }
  }
}

/* Prefill: take descriptors, write every layer of every request into the
 * decode pool; on IMM_REPORT send what it measured since the last one.
 * Returns when decode says stop. */
static int prefill(cfg_t c, const char *addr, hixl_ctx_t *shared)
{
  hixl_ctx_t *ctx = shared;
  if (ctx == NULL) {
    g_role = "prefill";
    CHECK(hixl_ctx_create(NULL, &ctx));
  }
  hixl_peer_t *dec;
  CHECK(hixl_connect(ctx, addr, 30000, &dec));
  hixl_rmr_t *pool;
  CHECK(hixl_rmr_lookup(dec, "kv_pool", 30000, &pool));
  /* The slots decode writes descriptors into. */
  desc_t *slots;
  hixl_mr_t *smr;
  CHECK(hixl_mem_alloc(ctx, sizeof(desc_t) * MAX_SLOTS, HIXL_MEM_HOST, HIXL_ACCESS_WRITE,
                       (void **)&slots, &smr));
  CHECK(hixl_mr_publish(smr, "kv_slots"));
  /* Staging: two layers of the largest request (K and V blocks). */
  size_t layer_bytes = 2 * (size_t)MAX_REQ_BLOCKS * block_bytes(&c);
  uint8_t *stage = NULL;
  if (posix_memalign((void **)&stage, 4096, 2 * layer_bytes) != 0)
    return 1;
  memset(stage, 0, 2 * layer_bytes); /* its pages in now, not in the first pass */
  hixl_mr_t *stmr;
  CHECK(hixl_mr_reg(ctx, stage, 2 * layer_bytes, 0, &stmr));
  hixl_xfer_t *x = malloc(sizeof(hixl_xfer_t) * 2 * MAX_REQ_BLOCKS);
  pre_stats_t ps = {.lat = malloc(sizeof(double) * 100000)};
  int fd = -1;
  CHECK(hixl_notify(dec, IMM_HELLO, 0, NULL));
  for (;;) {
    hixl_notif_t n;
    CHECK(take(ctx, 0, &n, -1));
    if (n.imm == IMM_STOP)
      break;
    if (n.imm & IMM_PORT) {
      fd = tcp_connect(addr, (uint16_t)(n.imm & 0xffff));
    } else if (n.imm == IMM_TWOSIDED && fd >= 0) {
      prefill_twosided(&c, fd, stage, &ps);
    } else if (n.imm == IMM_REPORT && fd >= 0) {
      report_t r = {.gen = ps.gen,
                    .xfer = ps.xfer,
                    .bytes = ps.bytes,
                    .lat50 = pct(ps.lat, ps.nlat, 50),
                    .lat99 = pct(ps.lat, ps.nlat, 99)};
      io_all(fd, &r, sizeof(r), true);
      ps.gen = ps.xfer = ps.bytes = 0;
      ps.nlat = 0;
    } else if (n.imm & IMM_DESC) {
      uint32_t slot = n.imm & 0xffff;
      if (slot >= MAX_SLOTS) {
        fprintf(stderr, "prefill: bad slot %u\n", slot);
        return 1;
      }
      prefill_onesided(&c, dec, pool, slot, &slots[slot], stage, layer_bytes, x, &ps);
    } else {
      fprintf(stderr, "prefill: unexpected notification %#x\n", n.imm);
      return 1;
    }
  }
  if (fd >= 0)
    close(fd);
  free(ps.lat);
  free(x);
  hixl_rmr_release(pool);
  CHECK(hixl_mr_dereg(stmr));
  free(stage);
  hixl_disconnect(dec);
  if (shared == NULL)
    hixl_ctx_destroy(ctx);
  return 0;
}

/* ------------------------------------------------------------ decode */

typedef struct live {
  bool used;
  uint32_t req, nblocks, layers_done;
  uint32_t block[MAX_REQ_BLOCKS];
  double t_sent, t_first;
  desc_t d; /* what was put into prefill's slot: stays until the slot is reused */
} live_t;

typedef struct pass_stats {
  double seconds, bytes, ttfl_p50, ttfl_p99, gap_p50, gap_p99;
  double check; /* decode: seconds checking the data */
  double recv;  /* decode, two-sided: seconds in recv() (from a layer's first bytes on) */
  report_t pre; /* prefill's figures */
} pass_stats_t;

/* One pass over c.requests requests (the same lengths in every pass,
 * request ids of their own, so that a block a pass failed to write would
 * still hold an earlier pass's data and fail the check). */
static pass_stats_t decode_pass(cfg_t c, hixl_ctx_t *ctx, hixl_peer_t *pre, hixl_rmr_t *slots,
                                uint8_t *pool, int fd, uint32_t seed, int mode, int pass_no)
{
  size_t bb = block_bytes(&c);
  uint32_t *free_ids = malloc(sizeof(uint32_t) * (size_t)c.blocks);
  int nfree = 0;
  for (int b = c.blocks - 1; b >= 0; b--)
    free_ids[nfree++] = (uint32_t)b;
  live_t *live = calloc(MAX_SLOTS, sizeof(live_t));
  int conc = c.concurrency < MAX_SLOTS ? c.concurrency : MAX_SLOTS;
  double *ttfl = malloc(sizeof(double) * (size_t)c.requests);
  double *gap = malloc(sizeof(double) * (size_t)c.requests * (size_t)c.s.layers);
  struct iovec *iov = malloc(sizeof(struct iovec) * 2 * MAX_REQ_BLOCKS);
  int nttfl = 0, ngap = 0, issued = 0, done = 0, inflight = 0;
  double bytes = 0, check = 0, recv_s = 0;
  uint8_t *want = malloc(bb);
  uint64_t rng = seed;
  if (mode == MODE_TCP)
    CHECK(hixl_notify(pre, IMM_TWOSIDED, 0, NULL));
  double t0 = now_s();
  while (done < c.requests) {
    /* Hand out new requests while there are slots and blocks. */
    while (issued < c.requests && inflight < conc) {
      rng = mix(rng);
      uint32_t len = (uint32_t)c.seq_min + (uint32_t)(rng % (uint64_t)(c.seq_max - c.seq_min + 1));
      uint32_t nb = (len + (uint32_t)c.s.block_tokens - 1) / (uint32_t)c.s.block_tokens;
      if ((int)nb > nfree)
        break; /* wait for blocks to come back */
      int slot = 0;
      while (live[slot].used)
        slot++;
      live_t *L = &live[slot];
      L->used = true;
      L->req = (uint32_t)issued + (uint32_t)pass_no * (uint32_t)c.requests;
      L->nblocks = nb;
      L->layers_done = 0;
      desc_t *d = &L->d;
      d->req = L->req;
      d->seq_len = len;
      d->nblocks = nb;
      d->pass = (uint32_t)pass_no << 2 | (uint32_t)mode;
      for (uint32_t b = 0; b < nb; b++)
        L->block[b] = d->block[b] = free_ids[--nfree];
      size_t dlen = offsetof(desc_t, block) + sizeof(uint32_t) * nb;
      L->t_sent = now_s();
      if (mode == MODE_TCP) {
        io_all(fd, d, dlen, true);
      } else {
        /* put_imm: the notification follows the descriptor's bytes. */
        CHECK(hixl_put_imm(pre, d, dlen, slots, sizeof(desc_t) * (size_t)slot,
                           IMM_DESC | (uint32_t)slot, 0, NULL));
      }
      issued++;
      inflight++;
    }
    /* Layers arriving, in any order across requests, in order per request. */
    live_t *L = NULL;
    uint32_t layer;
    if (mode == MODE_TCP) {
      /* Waiting for prefill to generate the layer is not transfer time:
       * the clock starts when its first bytes are here. */
      struct pollfd pf = {.fd = fd, .events = POLLIN};
      while (poll(&pf, 1, -1) < 0 && errno == EINTR)
        ;
      double r0 = now_s();
      uint32_t hdr[2];
      io_all(fd, hdr, sizeof(hdr), false);
      for (int s = 0; s < MAX_SLOTS; s++)
        if (live[s].used && live[s].req == hdr[0])
          L = &live[s];
      layer = hdr[1];
      if (L == NULL || layer != L->layers_done) {
        fprintf(stderr, "decode: unexpected two-sided layer %u of request %u\n", hdr[1], hdr[0]);
        exit(1);
      }
      /* Straight into the blocks' places in the pool, as the puts do. */
      int k = 0;
      for (uint32_t b = 0; b < L->nblocks; b++)
        for (int kv = 0; kv < 2; kv++)
          iov[k++] = (struct iovec){pool + pool_off(&c, (int)layer, kv, L->block[b]), bb};
      io_vec(fd, iov, (size_t)k, false);
      recv_s += now_s() - r0;
    } else {
      hixl_notif_t n;
      CHECK(take(ctx, 1, &n, 60000));
      uint32_t slot = n.imm >> 8;
      layer = n.imm & 0xff;
      L = slot < MAX_SLOTS ? &live[slot] : NULL;
      if (L == NULL || !L->used || layer != L->layers_done) {
        fprintf(stderr, "decode: unexpected notification %#x\n", n.imm);
        exit(1);
      }
    }
    double t = now_s();
    if (layer == 0) {
      L->t_first = t;
      ttfl[nttfl++] = t - L->t_sent;
    } else {
      gap[ngap++] = t - L->t_first; /* arrival of layer l after layer l-1 */
      L->t_first = t;
    }
    /* Check every byte of this layer's blocks. */
    for (uint32_t b = 0; b < L->nblocks; b++)
      for (int kv = 0; kv < 2; kv++) {
        generate(&c, L->req, (int)layer, kv, b, want);
        if (memcmp(pool + pool_off(&c, (int)layer, kv, L->block[b]), want, bb) != 0) {
          fprintf(stderr, "decode: request %u layer %u %c block %u (pool block %u): wrong data\n",
                  L->req, layer, kv ? 'V' : 'K', b, L->block[b]);
          exit(1);
        }
      }
    check += now_s() - t;
    bytes += 2.0 * (double)L->nblocks * (double)bb;
    if (++L->layers_done == (uint32_t)c.s.layers) { /* used: its blocks go back */
      for (uint32_t b = 0; b < L->nblocks; b++)
        free_ids[nfree++] = L->block[b];
      L->used = false;
      inflight--;
      done++;
    }
  }
  pass_stats_t ps = {.seconds = now_s() - t0, .bytes = bytes, .check = check, .recv = recv_s};
  if (mode == MODE_TCP) { /* the end of the two-sided descriptors */
    desc_t end = {.nblocks = 0};
    io_all(fd, &end, offsetof(desc_t, block), true);
  }
  /* Prefill's side of it. */
  CHECK(hixl_notify(pre, IMM_REPORT, 0, NULL));
  io_all(fd, &ps.pre, sizeof(ps.pre), false);
  ps.ttfl_p50 = pct(ttfl, nttfl, 50);
  ps.ttfl_p99 = pct(ttfl, nttfl, 99);
  ps.gap_p50 = pct(gap, ngap, 50);
  ps.gap_p99 = pct(gap, ngap, 99);
  free(iov);
  free(want);
  free(ttfl);
  free(gap);
  free(live);
  free(free_ids);
  return ps;
}

/* The transfer time of a pass: prefill's time in hixl calls (one-sided),
 * decode's time in recv() (two-sided). */
static double xfer_s(const pass_stats_t *p, int mode)
{
  return mode == MODE_TCP ? p->recv : p->pre.xfer;
}

static int decode(cfg_t c, int addr_fd, hixl_ctx_t *shared)
{
  hixl_ctx_t *ctx = shared;
  if (ctx == NULL) {
    g_role = "decode";
    CHECK(hixl_ctx_create(NULL, &ctx));
  }
  size_t bb = block_bytes(&c);
  size_t pool_bytes = (size_t)c.s.layers * 2 * (size_t)c.blocks * bb;
  uint8_t *pool;
  hixl_mr_t *pmr;
  CHECK(hixl_mem_alloc(ctx, pool_bytes, HIXL_MEM_HOST, HIXL_ACCESS_WRITE | HIXL_ACCESS_READ,
                       (void **)&pool, &pmr));
  memset(pool, 0, pool_bytes); /* its pages in now, not in the first pass */
  CHECK(hixl_mr_publish(pmr, "kv_pool"));
  printf("kv_transfer: %s (%d layers, %d KV heads x %d, %d-token blocks: %zu KiB per K or V "
         "block), pool %d blocks = %.1f MiB, %d requests of %d..%d tokens, %d at a time\n",
         c.s.name, c.s.layers, c.s.kv_heads, c.s.head_dim, c.s.block_tokens, bb >> 10, c.blocks,
         (double)pool_bytes / (1 << 20), c.requests, c.seq_min, c.seq_max, c.concurrency);
  fflush(stdout);
  /* The two-sided baseline's socket, on any free port (told to prefill in
   * a notification); prefill's figures come back over it too. */
  int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in la = {.sin_family = AF_INET};
  socklen_t alen = sizeof(la);
  if (ls >= 0)
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (ls < 0 || bind(ls, (struct sockaddr *)&la, alen) != 0 || listen(ls, 1) != 0 ||
      getsockname(ls, (struct sockaddr *)&la, &alen) != 0) {
    fprintf(stderr, "decode: two-sided listen: %s\n", strerror(errno));
    return 1;
  }
  if (addr_fd >= 0) {
    dprintf(addr_fd, "%s\n", hixl_ctx_address(ctx));
    close(addr_fd);
  } else if (shared == NULL) {
    printf("decode listening at %s\n", hixl_ctx_address(ctx));
    fflush(stdout);
  }
  hixl_notif_t n;
  CHECK(take(ctx, 1, &n, 60000));
  if (n.imm != IMM_HELLO) {
    fprintf(stderr, "decode: expected prefill's hello\n");
    return 1;
  }
  hixl_peer_t *pre = n.peer;
  hixl_rmr_t *slots;
  CHECK(hixl_rmr_lookup(pre, "kv_slots", 30000, &slots));
  CHECK(hixl_notify(pre, IMM_PORT | ntohs(la.sin_port), 0, NULL));
  int fd = accept(ls, NULL, NULL);
  if (fd < 0) {
    fprintf(stderr, "decode: two-sided accept: %s\n", strerror(errno));
    return 1;
  }
  close(ls);
  tcp_opts(fd);
  printf("over %s\n", hixl_peer_transport(pre));
  if (c.warmup) {
    pass_stats_t w = decode_pass(c, ctx, pre, slots, pool, fd, 42, MODE_BATCH, 0);
    printf("warm-up pass (untimed): %.1f MiB, verified\n", w.bytes / (1 << 20));
  }
  pass_stats_t r[MAX_PASSES];
  double total = 0;
  int first[NMODES] = {-1, -1, -1};
  for (int i = 0; i < c.npasses; i++) {
    int m = c.passes[i];
    pass_stats_t *p = &r[i];
    *p = decode_pass(c, ctx, pre, slots, pool, fd, 42, m, i + 1);
    if (first[m] < 0)
      first[m] = i;
    total += p->bytes;
    double x = xfer_s(p, m);
    printf("%s: %.1f MiB; transfer %.3f ms = %.3f GB/s (%s); per layer p50 %.3f ms, "
           "p99 %.3f\n",
           mode_name[m], p->bytes / (1 << 20), x * 1e3, p->bytes / x / 1e9,
           m == MODE_TCP ? "decode's time in recv" : "prefill's time in hixl calls",
           p->pre.lat50 * 1e3, p->pre.lat99 * 1e3);
    printf("  generating %.3f ms (prefill), checking %.3f ms (decode); end to end %.3f ms = "
           "%.3f GB/s; first layer after p50 %.3f ms (p99 %.3f); next layers every p50 "
           "%.3f ms (p99 %.3f)\n",
           p->pre.gen * 1e3, p->check * 1e3, p->seconds * 1e3, p->bytes / p->seconds / 1e9,
           p->ttfl_p50 * 1e3, p->ttfl_p99 * 1e3, p->gap_p50 * 1e3, p->gap_p99 * 1e3);
    fflush(stdout);
  }
  /* Ratios of the transfer bandwidths (the same bytes in every pass). */
  int ba = first[MODE_BATCH], bl = first[MODE_BLOCK], tc = first[MODE_TCP];
  if (ba >= 0 && tc >= 0)
    printf("one-sided / two-sided: transfer %.2fx faster (one batch per layer against TCP), "
           "end to end %.2fx\n",
           xfer_s(&r[tc], MODE_TCP) / xfer_s(&r[ba], MODE_BATCH), r[tc].seconds / r[ba].seconds);
  if (ba >= 0 && bl >= 0)
    printf("batching gain: %.2fx the transfer bandwidth of one put per block\n",
           xfer_s(&r[bl], MODE_BLOCK) / xfer_s(&r[ba], MODE_BATCH));
  printf("every byte of %.1f MiB verified\n", total / (1 << 20));
  fflush(stdout);
  /* Every layer was checked, so prefill's writes are all done: stop it. */
  CHECK(hixl_notify(pre, IMM_STOP, 0, NULL));
  /* Prefill disconnects as soon as it takes STOP, which can be before this
   * fence looks: then the fence cannot confirm delivery and says the peer
   * is gone (docs/semantics.md), which here means it stopped. */
  hixl_status_t st = hixl_fence(ctx, pre, -1);
  if (st != HIXL_OK && st != HIXL_ERR_PEER_LOST) {
    fprintf(stderr, "%s: hixl_fence after STOP failed: %s (%s)\n", g_role, hixl_strerror(st),
            hixl_last_error());
    exit(1);
  }
  close(fd);
  hixl_rmr_release(slots);
  if (shared == NULL)
    hixl_ctx_destroy(ctx);
  return 0;
}

/* ------------------------------------------------------------ main */

static hixl_ctx_t *g_self_ctx;
static cfg_t g_self_cfg;
static void *prefill_thread(void *arg)
{
  (void)arg;
  return prefill(g_self_cfg, hixl_ctx_address(g_self_ctx), g_self_ctx) ? (void *)1 : NULL;
}

static void usage(void)
{
  fprintf(stderr,
          "usage: kv_transfer [--model tiny|llama2-7b|llama2-70b] [--layers L] [--kv-heads H]\n"
          "         [--head-dim D] [--block-tokens B] [--dtype fp16|bf16] [--requests N]\n"
          "         [--seq-len MIN:MAX] [--blocks NB] [--concurrency C]\n"
          "         [--passes batch,block,tcp] [--no-warmup]\n"
          "         [--role decode | --role prefill --connect ADDR | --self]\n"
          "  --passes  the timed passes, in order (default batch,block,tcp)\n"
          "  --self    both roles as threads of one context (the self transport)\n");
  exit(2);
}

int main(int argc, char **argv)
{
  cfg_t c = {.s = shapes[0],
             .dtype_bytes = 2,
             .requests = 32,
             .seq_min = 16,
             .seq_max = 256,
             .blocks = 256,
             .concurrency = 4,
             .passes = {MODE_BATCH, MODE_BLOCK, MODE_TCP},
             .npasses = 3,
             .warmup = true};
  const char *role = NULL, *addr = NULL;
  static const struct option lo[] = {{"model", required_argument, 0, 'M'},
                                     {"layers", required_argument, 0, 'L'},
                                     {"kv-heads", required_argument, 0, 'H'},
                                     {"head-dim", required_argument, 0, 'D'},
                                     {"block-tokens", required_argument, 0, 'T'},
                                     {"dtype", required_argument, 0, 't'},
                                     {"requests", required_argument, 0, 'n'},
                                     {"seq-len", required_argument, 0, 's'},
                                     {"blocks", required_argument, 0, 'b'},
                                     {"concurrency", required_argument, 0, 'c'},
                                     {"role", required_argument, 0, 'r'},
                                     {"connect", required_argument, 0, 'a'},
                                     {"self", no_argument, 0, 'S'},
                                     {"passes", required_argument, 0, 'P'},
                                     {"no-warmup", no_argument, 0, 'W'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  int o;
  while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (o) {
    case 'M': {
      bool found = false;
      for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        if (strcmp(optarg, shapes[i].name) == 0) {
          c.s = shapes[i];
          found = true;
        }
      if (!found)
        usage();
      break;
    }
    case 'L': c.s.layers = atoi(optarg); break;
    case 'H': c.s.kv_heads = atoi(optarg); break;
    case 'D': c.s.head_dim = atoi(optarg); break;
    case 'T': c.s.block_tokens = atoi(optarg); break;
    case 't':
      if (strcmp(optarg, "fp16") && strcmp(optarg, "bf16"))
        usage();
      c.dtype_bytes = 2;
      break;
    case 'n': c.requests = atoi(optarg); break;
    case 's':
      if (sscanf(optarg, "%d:%d", &c.seq_min, &c.seq_max) != 2)
        usage();
      break;
    case 'b': c.blocks = atoi(optarg); break;
    case 'c': c.concurrency = atoi(optarg); break;
    case 'r': role = optarg; break;
    case 'a': addr = optarg; break;
    case 'S': g_shared = true; break;
    case 'W': c.warmup = false; break;
    case 'P': {
      c.npasses = 0;
      for (char *save = NULL, *t = strtok_r(optarg, ",", &save); t;
           t = strtok_r(NULL, ",", &save)) {
        int m = 0;
        while (m < NMODES && strcmp(t, mode_opt[m]) != 0)
          m++;
        if (m == NMODES || c.npasses == MAX_PASSES)
          usage();
        c.passes[c.npasses++] = m;
      }
      if (c.npasses == 0)
        usage();
      break;
    }
    default: usage();
    }
  }
  int max_nb = (c.seq_max + c.s.block_tokens - 1) / (c.s.block_tokens > 0 ? c.s.block_tokens : 1);
  if (c.s.layers < 1 || c.s.layers > 255 || c.s.kv_heads < 1 || c.s.head_dim < 1 ||
      c.s.block_tokens < 1 || block_bytes(&c) % 8 || c.requests < 1 || c.seq_min < 1 ||
      c.seq_max < c.seq_min || max_nb > MAX_REQ_BLOCKS || max_nb > c.blocks || c.concurrency < 1 ||
      optind != argc) {
    fprintf(stderr,
            "kv_transfer: bad shape or sizes (at most %d blocks per request, and no "
            "more than the pool; at most 255 layers)\n",
            MAX_REQ_BLOCKS);
    usage();
  }
  if (role && strcmp(role, "prefill") == 0)
    return addr ? prefill(c, addr, NULL) : (usage(), 2);
  if (role && strcmp(role, "decode") == 0)
    return decode(c, -1, NULL);
  if (role)
    usage();
  if (g_shared) { /* both roles as threads of one context: the self transport */
    hixl_ctx_t *ctx;
    CHECK(hixl_ctx_create(NULL, &ctx));
    g_self_ctx = ctx;
    g_self_cfg = c;
    pthread_t th;
    if (pthread_create(&th, NULL, prefill_thread, NULL) != 0)
      return 1;
    int rc = decode(c, -1, ctx);
    void *prc = NULL;
    pthread_join(th, &prc);
    hixl_ctx_destroy(ctx);
    return rc || prc ? 1 : 0;
  }
  /* Both, on this host: prefill forked first (no hixl threads yet). */
  int p[2];
  if (pipe(p) != 0)
    return 1;
  pid_t pid = fork();
  if (pid == 0) {
    close(p[1]);
    char a[256] = {0};
    ssize_t k = read(p[0], a, sizeof(a) - 1);
    if (k <= 0)
      _exit(1);
    a[strcspn(a, "\n")] = 0;
    _exit(prefill(c, a, NULL));
  }
  close(p[0]);
  int rc = decode(c, p[1], NULL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "kv_transfer: prefill failed (status %#x)\n", status);
    rc = 1;
  }
  return rc;
}

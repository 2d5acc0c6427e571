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
 * The same requests run twice, with a batch per layer and with one put per
 * block (the layer's notification then an ORDERED notify), and both are
 * printed: KV bytes, GB/s, time to first layer, per-layer latency p50/p99.
 *
 *   kv_transfer [--model tiny|llama2-7b|llama2-70b] [--requests N]
 *               [--seq-len MIN:MAX] [--blocks NB] [--concurrency C]
 *
 * By default it forks prefill itself (decode prints its address to it);
 * --role decode / --role prefill --connect ADDR run the two sides apart
 * (two hosts on verbs).
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <hixl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                             \
  do {                                                                                          \
    hixl_status_t st_ = (call);                                                                 \
    if (st_ != HIXL_OK) {                                                                       \
      fprintf(stderr, "%s: %s failed: %s (%s)\n", g_role, #call, hixl_strerror(st_),            \
              hixl_last_error());                                                               \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

static const char *g_role = "kv_transfer";

/* ------------------------------------------------------------ shapes */

typedef struct shape {
  const char *name;
  int layers, kv_heads, head_dim, block_tokens;
} shape_t;

static const shape_t shapes[] = {
    {"tiny", 4, 4, 64, 16},        /* for tests: 8 KiB blocks */
    {"llama2-7b", 32, 32, 128, 16}, /* 128 KiB K (and V) per block per layer */
    {"llama2-70b", 80, 8, 128, 16}, /* grouped-query attention: 8 KV heads */
};

typedef struct cfg {
  shape_t s;
  int dtype_bytes; /* fp16 and bf16: 2 */
  int requests, seq_min, seq_max, blocks, concurrency;
  bool per_block; /* this pass: one put per block */
} cfg_t;

#define MAX_SLOTS 64
#define MAX_REQ_BLOCKS 512
#define IMM_DESC 0x80000000u /* decode -> prefill: descriptor in slot (low bits) */
#define IMM_HELLO 0x40000000u
#define IMM_STOP 0x20000000u

/* One request as decode hands it to prefill (in prefill's slot memory). */
typedef struct desc {
  uint32_t req, seq_len, nblocks, pass;
  uint32_t block[MAX_REQ_BLOCKS];
} desc_t;

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
  uint64_t *w = out, seed = mix(((uint64_t)req << 24) ^ ((uint64_t)layer << 12) ^
                                ((uint64_t)kv << 11) ^ bi);
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

static bool for_prefill(uint32_t imm) { return (imm & IMM_DESC) || imm == IMM_STOP; }

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

/* Prefill: take descriptors, write every layer of every request into the
 * decode pool, one batch (or one put per block) per layer, two layers in
 * flight.  Returns when decode says stop. */
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
  size_t bb = block_bytes(&c);
  size_t layer_bytes = 2 * (size_t)MAX_REQ_BLOCKS * bb;
  uint8_t *stage = NULL;
  if (posix_memalign((void **)&stage, 4096, 2 * layer_bytes) != 0)
    return 1;
  hixl_mr_t *stmr;
  CHECK(hixl_mr_reg(ctx, stage, 2 * layer_bytes, 0, &stmr));
  hixl_xfer_t *x = malloc(sizeof(hixl_xfer_t) * 2 * MAX_REQ_BLOCKS);
  double *lat = malloc(sizeof(double) * 100000);
  int nlat = 0;
  CHECK(hixl_notify(dec, IMM_HELLO, 0, NULL));
  for (;;) {
    hixl_notif_t n;
    CHECK(take(ctx, 0, &n, -1));
    if (n.imm == IMM_STOP)
      break;
    if (!(n.imm & IMM_DESC)) {
      fprintf(stderr, "prefill: unexpected notification %#x\n", n.imm);
      return 1;
    }
    uint32_t slot = n.imm & 0xffff;
    const desc_t *d = &slots[slot];
    hixl_req_t *inflight[2] = {NULL, NULL};
    double t_issue[2] = {0, 0};
    for (int l = 0; l < c.s.layers; l++) {
      int half = l & 1;
      if (inflight[half]) { /* its staging half is about to be rewritten */
        CHECK(hixl_req_wait(inflight[half], -1));
        hixl_req_free(inflight[half]);
        inflight[half] = NULL;
        if (nlat < 100000)
          lat[nlat++] = now_s() - t_issue[half];
      }
      uint8_t *base = stage + (size_t)half * layer_bytes;
      int k = 0;
      for (uint32_t b = 0; b < d->nblocks; b++)
        for (int kv = 0; kv < 2; kv++) {
          uint8_t *src = base + ((size_t)b * 2 + (size_t)kv) * bb;
          generate(&c, d->req, l, kv, b, src);
          x[k++] = (hixl_xfer_t){src, pool, pool_off(&c, l, kv, d->block[b]), bb};
        }
      uint32_t imm = slot << 8 | (uint32_t)l;
      t_issue[half] = now_s();
      if (!d->pass) {
        CHECK(hixl_put_batch(dec, x, (size_t)k, &imm, 0, &inflight[half]));
      } else {
        for (int i = 0; i < k; i++)
          CHECK(hixl_put(dec, x[i].local, x[i].len, pool, x[i].off, 0, NULL));
        /* ORDERED: the notification goes once every put above has landed. */
        CHECK(hixl_notify(dec, imm, HIXL_OP_ORDERED, &inflight[half]));
      }
    }
    for (int half = 0; half < 2; half++)
      if (inflight[half]) {
        CHECK(hixl_req_wait(inflight[half], -1));
        hixl_req_free(inflight[half]);
        if (nlat < 100000)
          lat[nlat++] = now_s() - t_issue[half];
      }
  }
  /* Per-layer transfer latency (issue to completion), for decode to print. */
  printf("  prefill: per-layer write latency p50 %.3f ms, p99 %.3f ms (%d layers)\n",
         pct(lat, nlat, 50) * 1e3, pct(lat, nlat, 99) * 1e3, nlat);
  fflush(stdout);
  free(lat);
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
} pass_stats_t;

static pass_stats_t decode_pass(cfg_t c, hixl_ctx_t *ctx, hixl_peer_t *pre, hixl_rmr_t *slots,
                                uint8_t *pool, uint32_t seed, bool per_block)
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
  int nttfl = 0, ngap = 0, issued = 0, done = 0, inflight = 0;
  double bytes = 0;
  uint8_t *want = malloc(bb);
  uint64_t rng = seed;
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
      L->req = (uint32_t)issued;
      L->nblocks = nb;
      L->layers_done = 0;
      desc_t *d = &L->d;
      d->req = L->req;
      d->seq_len = len;
      d->nblocks = nb;
      d->pass = per_block;
      for (uint32_t b = 0; b < nb; b++)
        L->block[b] = d->block[b] = free_ids[--nfree];
      size_t dlen = offsetof(desc_t, block) + sizeof(uint32_t) * nb;
      L->t_sent = now_s();
      /* put_imm: the notification follows the descriptor's bytes. */
      CHECK(hixl_put_imm(pre, d, dlen, slots, sizeof(desc_t) * (size_t)slot,
                         IMM_DESC | (uint32_t)slot, 0, NULL));
      issued++;
      inflight++;
    }
    /* Layers arriving, in any order across requests, in order per request. */
    hixl_notif_t n;
    CHECK(take(ctx, 1, &n, 60000));
    uint32_t slot = n.imm >> 8, layer = n.imm & 0xff;
    live_t *L = slot < MAX_SLOTS ? &live[slot] : NULL;
    if (L == NULL || !L->used || layer != L->layers_done) {
      fprintf(stderr, "decode: unexpected notification %#x\n", n.imm);
      exit(1);
    }
    double t = now_s();
    if (layer == 0) {
      L->t_first = t;
      ttfl[nttfl++] = t - L->t_sent;
    } else {
      gap[ngap++] = t - L->t_first; /* arrival of layer l after layer 0 */
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
    bytes += 2.0 * (double)L->nblocks * (double)bb;
    if (++L->layers_done == (uint32_t)c.s.layers) { /* used: its blocks go back */
      for (uint32_t b = 0; b < L->nblocks; b++)
        free_ids[nfree++] = L->block[b];
      L->used = false;
      inflight--;
      done++;
    }
  }
  pass_stats_t ps = {.seconds = now_s() - t0, .bytes = bytes};
  ps.ttfl_p50 = pct(ttfl, nttfl, 50);
  ps.ttfl_p99 = pct(ttfl, nttfl, 99);
  ps.gap_p50 = pct(gap, ngap, 50);
  ps.gap_p99 = pct(gap, ngap, 99);
  free(want);
  free(ttfl);
  free(gap);
  free(live);
  free(free_ids);
  return ps;
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
  CHECK(hixl_mr_publish(pmr, "kv_pool"));
  printf("kv_transfer: %s (%d layers, %d KV heads x %d, %d-token blocks: %zu KiB per K or V "
         "block), pool %d blocks = %.1f MiB, %d requests of %d..%d tokens, %d at a time\n",
         c.s.name, c.s.layers, c.s.kv_heads, c.s.head_dim, c.s.block_tokens, bb >> 10, c.blocks,
         (double)pool_bytes / (1 << 20), c.requests, c.seq_min, c.seq_max, c.concurrency);
  fflush(stdout);
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
  printf("over %s\n", hixl_peer_transport(pre));
  pass_stats_t r[2];
  for (int pass = 0; pass < 2; pass++) {
    r[pass] = decode_pass(c, ctx, pre, slots, pool, 42, pass == 1);
    printf("%-26s %8.1f MiB in %7.3f s = %7.3f GB/s; first layer after p50 %.3f ms "
           "(p99 %.3f); next layers every p50 %.3f ms (p99 %.3f)\n",
           pass ? "one put per block:" : "one batch per layer:", r[pass].bytes / (1 << 20),
           r[pass].seconds, r[pass].bytes / r[pass].seconds / 1e9, r[pass].ttfl_p50 * 1e3,
           r[pass].ttfl_p99 * 1e3, r[pass].gap_p50 * 1e3, r[pass].gap_p99 * 1e3);
    fflush(stdout);
  }
  printf("batching gain: %.2fx the bandwidth of one put per block; every byte verified\n",
         (r[0].bytes / r[0].seconds) / (r[1].bytes / r[1].seconds));
  fflush(stdout);
  /* Every layer was checked, so prefill's writes are all done: stop it. */
  CHECK(hixl_notify(pre, IMM_STOP, 0, NULL));
  CHECK(hixl_fence(ctx, pre, -1));
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
          "         [--role decode | --role prefill --connect ADDR | --self]\n"
          "  --self  both roles as threads of one context (the self transport)\n");
  exit(2);
}

int main(int argc, char **argv)
{
  cfg_t c = {.s = shapes[0], .dtype_bytes = 2, .requests = 32, .seq_min = 16, .seq_max = 256,
             .blocks = 256, .concurrency = 4};
  const char *role = NULL, *addr = NULL;
  static const struct option lo[] = {
      {"model", required_argument, 0, 'M'},       {"layers", required_argument, 0, 'L'},
      {"kv-heads", required_argument, 0, 'H'},    {"head-dim", required_argument, 0, 'D'},
      {"block-tokens", required_argument, 0, 'T'}, {"dtype", required_argument, 0, 't'},
      {"requests", required_argument, 0, 'n'},    {"seq-len", required_argument, 0, 's'},
      {"blocks", required_argument, 0, 'b'},      {"concurrency", required_argument, 0, 'c'},
      {"role", required_argument, 0, 'r'},        {"connect", required_argument, 0, 'a'},
      {"self", no_argument, 0, 'S'},
      {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
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
    default: usage();
    }
  }
  int max_nb = (c.seq_max + c.s.block_tokens - 1) / (c.s.block_tokens > 0 ? c.s.block_tokens : 1);
  if (c.s.layers < 1 || c.s.layers > 255 || c.s.kv_heads < 1 || c.s.head_dim < 1 ||
      c.s.block_tokens < 1 || block_bytes(&c) % 8 || c.requests < 1 || c.seq_min < 1 ||
      c.seq_max < c.seq_min || max_nb > MAX_REQ_BLOCKS || max_nb > c.blocks ||
      c.concurrency < 1 || optind != argc) {
    fprintf(stderr, "kv_transfer: bad shape or sizes (at most %d blocks per request, and no "
                    "more than the pool; at most 255 layers)\n", MAX_REQ_BLOCKS);
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

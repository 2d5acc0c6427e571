/* SPDX-License-Identifier: MIT */
/*
 * bench/soak.c: hours of faults, nothing lost (docs/reliability.md).
 *
 * A supervisor forks --targets target processes and --initiators initiator
 * processes (it never creates a context itself) and, while they work, kills
 * (SIGKILL, then a restart), and stops (SIGSTOP for 1-5 s, then SIGCONT)
 * them on a schedule drawn from --seed: the same seed gives the same
 * schedule, so a failure can be replayed.  Target 0 and initiator 0 are
 * never killed (only stopped): their RSS and descriptors are sampled every
 * second for the trend, and they exit through hixl_ctx_destroy at the end,
 * so that LeakSanitizer (an ASan build) checks them.
 *
 * What is checked, all the time, in every process:
 *  - Data.  Every target has two regions: A from hixl_mem_alloc (memfd;
 *    mapped by shm peers) and B registered heap memory (hixl_mr_reg;
 *    reached with process_vm_* on shm).  Each initiator owns blocks of
 *    64 B .. 256 KiB in both and writes them with put, put_batch and
 *    ordered puts; every byte of a block is a function of (initiator,
 *    region, block, version), and the version (64-bit, unique per
 *    initiator incarnation) heads the block.  Gets and get_batches read
 *    blocks back and compare every byte with what the last completed put
 *    wrote (or, after an operation that ended with PEER_LOST, with either
 *    version it may have left).  A mismatch is a torn or stale block.
 *  - Notifications.  put_imm, notifying put_batch and notify carry a
 *    per-connection sequence number in the immediate; the first message of
 *    every connection is a put_imm (its "hello").  A target checks, for
 *    each peer, that sequence numbers arrive exactly once and in order,
 *    that the notification's length is the bytes put, and -- after the
 *    data, as promised -- every byte of the message and of the blocks the
 *    batch wrote with it.  It then writes an acknowledgement word that the
 *    initiator reads (get) before it reuses a message slot or rewrites a
 *    block a message named.  A connection that was lost and replaced may
 *    have its message overwritten by its successor before the target read
 *    it: that is counted as "superseded", never as a pass.
 *  - Atomics.  FAA on a per-initiator counter must return exactly the
 *    count the initiator expects (A and B); FAA on a shared counter must
 *    return strictly increasing values to each initiator; a CAS spin lock
 *    guards two words x, y of region B with the invariant x + y == 0, which
 *    the holder checks, breaks and restores with puts, then fences and
 *    releases.  A holder that died or lost its connection leaves the lock
 *    with its slot in it: its next connection takes it over and repairs.
 *  - Status.  Operations may end only with OK or PEER_LOST (the fault
 *    injection's effect); anything else is "unexpected".  A request that
 *    does not complete within twice the timeout and 5 s (11 s at the
 *    default) counts as unexpected (TIMEOUT) too.
 *  - Hangs.  A process that is not stopped and makes no progress for
 *    max(20 s, 4 x HIXL_TIMEOUT_MS) is a hang (its stacks go to the log,
 *    through gdb when installed).
 *  - Deaths.  Every PEER_LOST an initiator sees is logged with the time;
 *    the supervisor matches it to the faults: detection time after a kill
 *    (from the SIGKILL) and after a stop longer than the timeout (from the
 *    SIGSTOP); a loss that no kill, and no stop of either side at least
 *    half the timeout long (heartbeats are due every quarter of it and
 *    go at the next tick, so a stop that long may be silence enough),
 *    explains is a false death.
 *
 * Usage:
 *   hixl-soak [--transport shm|fabric|verbs] [--duration S] [--seed N]
 *             [--targets N] [--initiators N] [--timeout-ms MS]
 *             [--fault-ms MEAN] [--no-faults] [--listen HOST]
 *             [--env-target K=V] [--env-initiator K=V] [--quiet]
 *             [--inject block|notif|lock|faa]
 *
 * Defaults: shm, 60 s, a seed from the clock (printed), 3 targets, 4
 * initiators, HIXL_TIMEOUT_MS 3000, a fault every 2 s on average, listen
 * on 127.0.0.1.  --transport sets HIXL_TRANSPORTS in every process (fabric
 * also HIXL_FABRIC_PROVIDER="tcp;ofi_rxm" unless set).  --env-target and
 * --env-initiator set a variable in one role only (the rxe guest puts the
 * targets on rxe1: --env-target HIXL_NET_DEV=rxe1).  Exit status 0 when
 * every check held, 1 otherwise; the summary's last line says PASS or FAIL
 * (and, on FAIL, the command that replays the schedule).
 *
 * --inject breaks, in target 0, what one check watches (a byte of every
 * block of an initiator, a notification taken twice, the locked invariant,
 * a private counter), every 200th notification: a run must then FAIL with
 * that check's errors.  tests/soak_selftest.sh runs each in the suite, so
 * that a check that sees nothing cannot pass for one that holds.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <hixl.h>
#include "bench_util.h"
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_T 8
#define MAX_I 8
#define MAX_LOSS 32768
#define MAX_EVENTS 8192
#define MAX_SAMPLES 8192
#define MAX_TPEERS 65536 /* connections a target incarnation tracks */

/* ------------------------------------------------------------ layout */

/* Region A (hixl_mem_alloc) and B (hixl_mr_reg'd heap), same layout:
 *   [0, 4096)  header: A: token at 0, ack[slot] at 64 + 8 * slot,
 *              counter[slot] at 256 + 8 * slot, shared counter at 512,
 *              lock at 576; B: counter[slot] at 256 + 8 * slot, x at 0,
 *              y at 8.
 *   then one area per initiator slot: NMSG message slots of MSG_SZ, then
 *   NBLK blocks of blk_sz[] bytes. */
#define HDR_SZ 4096u
#define OFF_TOKEN 0u
#define OFF_ACK(s) (64u + 8u * (unsigned)(s))
#define OFF_CNT(s) (256u + 8u * (unsigned)(s))
#define OFF_SHARED 512u
#define OFF_LOCK 576u
#define OFF_X 0u
#define OFF_Y 8u
#define NMSG 16u
#define MSG_SZ 1024u
#define NBLK 8u
static const uint32_t blk_sz[NBLK] = {64, 256, 4096, 4096, 16384, 65536, 65536, 262144};
#define BLK_TOTAL (64u + 256 + 4096 + 4096 + 16384 + 65536 + 65536 + 262144)
#define AREA_SZ (NMSG * MSG_SZ + BLK_TOTAL)
#define REGION_SZ (HDR_SZ + MAX_I * AREA_SZ)

static uint64_t msg_off(int slot, uint32_t seq)
{
  return HDR_SZ + (uint64_t)slot * AREA_SZ + (uint64_t)(seq % NMSG) * MSG_SZ;
}

static uint64_t blk_off(int slot, int b)
{
  uint64_t o = HDR_SZ + (uint64_t)slot * AREA_SZ + NMSG * MSG_SZ;
  for (int i = 0; i < b; i++)
    o += blk_sz[i];
  return o;
}

/* The immediate: slot (3 bits), message region (1), has-data (1), hello
 * (1), then 26 bits: the connection's epoch for its hello (whose seq is 1),
 * else the seq. */
#define IMM(slot, reg, data, hello, v)                                                             \
  (((uint32_t)(slot) << 29) | ((uint32_t)(reg) << 28) | ((uint32_t)(data) << 27) |                 \
   ((uint32_t)(hello) << 26) | ((v)&0x3ffffffu))
#define IMM_SLOT(i) ((int)((i) >> 29))
#define IMM_REG(i) ((int)(((i) >> 28) & 1))
#define IMM_DATA(i) ((int)(((i) >> 27) & 1))
#define IMM_HELLO(i) ((int)(((i) >> 26) & 1))
#define IMM_VAL(i) ((i)&0x3ffffffu)
#define IMM_SEQ(i) (IMM_HELLO(i) ? 1u : IMM_VAL(i))

/* A message: header, then up to 3 block references, then filler derived
 * from (epoch, seq). */
#define MSG_MAGIC 0x50414b4du
typedef struct msg_hdr {
  uint32_t magic, len;
  uint32_t epoch, seq;
  uint32_t nref, pad;
  struct {
    uint32_t reg, blk;
    uint64_t ver;
  } ref[3];
} msg_hdr_t;

/* ------------------------------------------------------------ shared page */

enum { K_PUT, K_GET, K_PUT_IMM, K_NOTIFY, K_PUT_BATCH, K_GET_BATCH, K_CAS, K_FAA, K_FENCE, K_N };
static const char *const kind_name[K_N] = {"put",       "get", "put_imm", "notify", "put_batch",
                                           "get_batch", "cas", "faa",     "fence"};

typedef struct stats {
  _Atomic uint64_t ops[K_N], bytes;
  _Atomic uint64_t lost_ops;           /* operations that ended with PEER_LOST */
  _Atomic uint64_t successor_refusals; /* NOT_REGISTERED, then the peer lost (on_fail) */
  _Atomic uint64_t unexpected;         /* any other failure */
  _Atomic uint64_t verify_ok, verify_err;
  _Atomic uint64_t notif_ok, notif_superseded, notif_err;
  _Atomic uint64_t connects, connect_fail;
  _Atomic uint64_t inv_ok, inv_err, lock_busy, lock_repairs;
  _Atomic uint64_t faa_ok, faa_err;
  _Atomic uint64_t errors_printed;
  _Atomic int64_t progress_ns;
  _Atomic uint32_t incarnation;
  _Atomic int err_set;
  char first_err[512];
} stats_t;

typedef struct loss {
  int64_t t_ns, conn_ns;
  int ini, tgt;
  char why[112]; /* hixl_last_error() of the operation that saw it */
} loss_t;

typedef struct shared {
  stats_t tgt[MAX_T], ini[MAX_I];
  _Atomic uint32_t tgt_port[MAX_T];  /* its control port; 0 while it is not up */
  _Atomic uint32_t cur_epoch[MAX_I]; /* each initiator slot's newest connection (1, 2, ...) */
  _Atomic uint32_t nloss;
  loss_t loss[MAX_LOSS];
  _Atomic int stop_initiators, stop_targets;
} shared_t;

static shared_t *sh;

/* ------------------------------------------------------------ options */

static struct opts {
  const char *transport, *listen, *inject;
  int duration_s, ntgt, nini, timeout_ms, fault_ms;
  bool faults, quiet;
  uint64_t seed;
  const char *env_t[16], *env_i[16];
  int nenv_t, nenv_i;
} o = {"shm", "127.0.0.1", NULL, 60, 3, 4, 3000, 2000, true, false, 0, {0}, {0}, 0, 0};

/* ------------------------------------------------------------ utilities */

static uint64_t splitmix(uint64_t *s)
{
  uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static uint64_t rnd(uint64_t *s, uint64_t n) { return n ? splitmix(s) % n : 0; }

/* The bytes a block holds at a version: the version, then a stream seeded
 * from everything that names it.  Version 0: never written (zeroes). */
static void gen_block(uint8_t *p, size_t len, int slot, int reg, int blk, uint64_t ver)
{
  if (ver == 0) {
    memset(p, 0, len);
    return;
  }
  uint64_t s = ver * UINT64_C(0x100000001b3) ^ ((uint64_t)slot << 56) ^ ((uint64_t)reg << 48) ^
               ((uint64_t)blk << 40);
  memcpy(p, &ver, 8);
  for (size_t i = 8; i < len; i += 8) {
    uint64_t v = splitmix(&s);
    memcpy(p + i, &v, len - i < 8 ? len - i : 8);
  }
}

static void gen_filler(uint8_t *p, size_t len, uint32_t epoch, uint32_t seq)
{
  uint64_t s = ((uint64_t)epoch << 32) | seq;
  for (size_t i = 0; i < len; i += 8) {
    uint64_t v = splitmix(&s);
    memcpy(p + i, &v, len - i < 8 ? len - i : 8);
  }
}

static stats_t *me_stats;
static const char *me_name = "soak";

static void note_err(_Atomic uint64_t *counter, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void note_err(_Atomic uint64_t *counter, const char *fmt, ...)
{
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (counter)
    atomic_fetch_add(counter, 1);
  int exp = 0;
  if (atomic_compare_exchange_strong(&me_stats->err_set, &exp, 1))
    snprintf(me_stats->first_err, sizeof(me_stats->first_err), "%s", buf);
  if (atomic_fetch_add(&me_stats->errors_printed, 1) < 20)
    fprintf(stderr, "%s[%d]: %s\n", me_name, (int)getpid(), buf);
}

static void progress(void) { atomic_store(&me_stats->progress_ns, now_ns()); }

/* ------------------------------------------------------------ target */

typedef struct tpeer {
  hixl_peer_t *peer;
  int slot;
  uint32_t epoch, next;
} tpeer_t;

static uint8_t *tgt_a, *tgt_b;

static bool check_bytes(const uint8_t *got, const uint8_t *want, size_t len, size_t *at)
{
  if (memcmp(got, want, len) == 0)
    return true;
  size_t i = 0;
  while (i < len && got[i] == want[i])
    i++;
  *at = i;
  return false;
}

/* Verify the message (and the blocks it names) of notification n from
 * peer state tp.  Returns 1 ok, 0 superseded, -1 error (noted). */
static int verify_msg(tpeer_t *tp, const hixl_notif_t *n)
{
  uint32_t seq = IMM_SEQ(n->imm);
  int slot = IMM_SLOT(n->imm);
  const uint8_t *base = IMM_REG(n->imm) ? tgt_b : tgt_a;
  const uint8_t *m = base + msg_off(slot, seq);
  msg_hdr_t h;
  memcpy(&h, m, sizeof(h));
  if (h.magic != MSG_MAGIC || h.epoch != tp->epoch || h.seq != seq) {
    /* Only a newer connection of the same initiator slot may have written
     * there since (it does not know what we have read). */
    if (atomic_load(&sh->cur_epoch[slot]) > tp->epoch)
      return 0;
    note_err(&me_stats->notif_err,
             "slot %d seq %u: message header epoch %u seq %u magic %#x, expected epoch %u", slot,
             seq, h.epoch, h.seq, h.magic, tp->epoch);
    return -1;
  }
  if (h.len < sizeof(h) || h.len > MSG_SZ || h.nref > 3) {
    note_err(&me_stats->notif_err, "slot %d seq %u: message length %u nref %u", slot, seq, h.len,
             h.nref);
    return -1;
  }
  uint8_t want[MSG_SZ];
  gen_filler(want, h.len - sizeof(h), h.epoch, h.seq);
  size_t at;
  size_t total = h.len;
  if (!check_bytes(m + sizeof(h), want, h.len - sizeof(h), &at)) {
    if (atomic_load(&sh->cur_epoch[slot]) > tp->epoch)
      return 0;
    note_err(&me_stats->notif_err,
             "slot %d seq %u: message byte %zu differs after its notification", slot, seq,
             sizeof(h) + at);
    return -1;
  }
  static uint8_t blk[262144], wblk[262144];
  for (uint32_t r = 0; r < h.nref; r++) {
    uint32_t reg = h.ref[r].reg, b = h.ref[r].blk;
    if (reg > 1 || b >= NBLK) {
      note_err(&me_stats->notif_err, "slot %d seq %u: bad block reference %u/%u", slot, seq, reg,
               b);
      return -1;
    }
    total += blk_sz[b];
    memcpy(blk, (reg ? tgt_b : tgt_a) + blk_off(slot, (int)b), blk_sz[b]);
    gen_block(wblk, blk_sz[b], slot, (int)reg, (int)b, h.ref[r].ver);
    if (!check_bytes(blk, wblk, blk_sz[b], &at)) {
      if (atomic_load(&sh->cur_epoch[slot]) > tp->epoch)
        return 0;
      note_err(&me_stats->notif_err,
               "slot %d seq %u: block %c%u byte %zu is not version %#" PRIx64
               " after the batch's notification",
               slot, seq, reg ? 'B' : 'A', b, at, h.ref[r].ver);
      return -1;
    }
  }
  if (n->len != total) {
    note_err(&me_stats->notif_err, "slot %d seq %u: notification length %zu, %zu bytes were put",
             slot, seq, n->len, total);
    return -1;
  }
  return 1;
}

static tpeer_t *tpeers;
static int ntpeers;

static tpeer_t *tpeer_find(hixl_peer_t *p, bool *fresh)
{
  *fresh = false;
  for (int i = ntpeers - 1; i >= 0; i--)
    if (tpeers[i].peer == p)
      return &tpeers[i];
  if (ntpeers == MAX_TPEERS)
    memmove(tpeers, tpeers + 1, sizeof(*tpeers) * --ntpeers);
  *fresh = true;
  tpeer_t *t = &tpeers[ntpeers++];
  memset(t, 0, sizeof(*t));
  t->peer = p;
  return t;
}

static void target_notif(const hixl_notif_t *n)
{
  bool fresh;
  tpeer_t *tp = tpeer_find(n->peer, &fresh);
  uint32_t seq = IMM_SEQ(n->imm);
  int slot = IMM_SLOT(n->imm);
  if (slot >= o.nini) {
    note_err(&me_stats->notif_err, "notification from slot %d (imm %#x)", slot, n->imm);
    return;
  }
  if (fresh) {
    if (!IMM_HELLO(n->imm) || !IMM_DATA(n->imm)) {
      note_err(&me_stats->notif_err,
               "slot %d: first notification of a connection is seq %u, not its hello", slot, seq);
      tp->next = seq + 1;
      return;
    }
    tp->slot = slot;
    tp->epoch = IMM_VAL(n->imm);
  } else if (IMM_HELLO(n->imm) || seq != tp->next || slot != tp->slot) {
    note_err(&me_stats->notif_err, "slot %d: notification seq %u, expected %u (%s)", slot, seq,
             tp->next, seq < tp->next ? "duplicate or reordered" : "one went missing");
    tp->next = seq + 1;
    return;
  }
  tp->next = seq + 1;
  int r = 1;
  if (IMM_DATA(n->imm))
    r = verify_msg(tp, n);
  else if (n->len != 0) {
    note_err(&me_stats->notif_err, "slot %d seq %u: notify with length %zu", slot, seq, n->len);
    r = -1;
  }
  if (r == 1)
    atomic_fetch_add(&me_stats->notif_ok, 1);
  else if (r == 0)
    atomic_fetch_add(&me_stats->notif_superseded, 1);
  /* Acknowledge for the newest connection of the slot only: the word is
   * the initiator's credit for reusing message slots and blocks. */
  if (r == 1 && tp->epoch == atomic_load(&sh->cur_epoch[slot])) {
    uint64_t ack = ((uint64_t)tp->epoch << 32) | seq;
    __atomic_store_n((uint64_t *)(tgt_a + OFF_ACK(slot)), ack, __ATOMIC_RELEASE);
  }
}

/* --inject: break what a check watches, to show that it sees it (the
 * target 0 does it every 200th notification). */
static void inject(const hixl_notif_t *n)
{
  int slot = IMM_SLOT(n->imm);
  if (!strcmp(o.inject, "block")) {
    for (int b = 0; b < (int)NBLK; b++)
      tgt_a[blk_off(slot, b) + blk_sz[b] - 1] ^= 0x40;
  } else if (!strcmp(o.inject, "notif")) {
    target_notif(n); /* as if delivered twice */
  } else if (!strcmp(o.inject, "lock")) {
    uint64_t x;
    memcpy(&x, tgt_b + OFF_X, 8);
    x += 7;
    memcpy(tgt_b + OFF_X, &x, 8);
  } else if (!strcmp(o.inject, "faa")) {
    __atomic_fetch_add((uint64_t *)(tgt_a + OFF_CNT(slot)), 1, __ATOMIC_SEQ_CST);
  }
}

static int run_target(int idx)
{
  unsigned ninj = 0;
  me_stats = &sh->tgt[idx];
  me_name = "target";
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  char listen[160];
  snprintf(listen, sizeof(listen), "%s:0", o.listen);
  cfg.listen = listen;
  hixl_ctx_t *ctx;
  hixl_mr_t *mra, *mrb;
  void *a;
  unsigned acc = HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC;
  if (hixl_ctx_create(&cfg, &ctx) != HIXL_OK ||
      hixl_mem_alloc(ctx, REGION_SZ, HIXL_MEM_HOST, acc, &a, &mra) != HIXL_OK) {
    fprintf(stderr, "target %d: %s\n", idx, hixl_last_error());
    return 2;
  }
  tgt_a = a;
  if (posix_memalign((void **)&tgt_b, 4096, REGION_SZ) != 0)
    return 2;
  memset(tgt_b, 0, REGION_SZ);
  uint64_t seed = o.seed ^ ((uint64_t)idx << 40) ^ now_ns();
  uint64_t token = splitmix(&seed) | 1;
  memcpy(tgt_a + OFF_TOKEN, &token, 8);
  if (hixl_mr_reg(ctx, tgt_b, REGION_SZ, acc, &mrb) != HIXL_OK ||
      hixl_mr_publish(mra, "soakA") != HIXL_OK || hixl_mr_publish(mrb, "soakB") != HIXL_OK) {
    fprintf(stderr, "target %d: %s\n", idx, hixl_last_error());
    return 2;
  }
  tpeers = calloc(MAX_TPEERS, sizeof(*tpeers));
  if (!tpeers)
    return 2;
  const char *addr = hixl_ctx_address(ctx), *colon = strrchr(addr, ':');
  atomic_store(&sh->tgt_port[idx], colon ? (uint32_t)atoi(colon + 1) : 0);
  while (!atomic_load(&sh->stop_targets)) {
    progress();
    hixl_notif_t n[16];
    int k = hixl_notif_poll(ctx, n, 16);
    if (k == 0) {
      hixl_status_t st = hixl_notif_wait(ctx, &n[0], 200);
      if (st == HIXL_OK)
        k = 1;
      else if (st != HIXL_ERR_TIMEOUT)
        note_err(&me_stats->unexpected, "hixl_notif_wait: %s", hixl_last_error());
    }
    for (int i = 0; i < k; i++) {
      target_notif(&n[i]);
      if (o.inject && idx == 0 && ++ninj % 200 == 0)
        inject(&n[i]);
    }
  }
  atomic_store(&sh->tgt_port[idx], 0);
  hixl_ctx_destroy(ctx); /* deregisters both regions, frees A */
  free(tgt_b);
  free(tpeers);
  return 0;
}

/* ------------------------------------------------------------ initiator */

typedef struct blkst {
  uint64_t ver;   /* what the last completed put wrote (0: never written) */
  uint64_t maybe; /* a put that ended with PEER_LOST: it may have landed */
  bool unknown;   /* written by an earlier incarnation: put before any get */
  uint32_t pin;   /* named by message seq pin: not rewritten until acked */
} blkst_t;

typedef struct conn {
  hixl_peer_t *peer;
  hixl_rmr_t *ra, *rb;
  uint64_t token;      /* the target incarnation this state is about */
  uint32_t epoch, seq; /* this connection's, and its last message */
  uint32_t acked;      /* last seq the target acknowledged */
  int64_t conn_ns;
  uint32_t tgt_inc; /* the target's incarnation when we connected */
  blkst_t b[2][NBLK];
  uint64_t cnt[2]; /* our FAA counters' expected values */
  bool cnt_known[2];
  uint64_t cnt_maybe[2]; /* FAAs that ended with PEER_LOST since: each may have run */
  uint64_t shared_last;  /* the last old value of the shared counter */
  bool lost;
} conn_t;

static hixl_ctx_t *ictx;
static int islot;
static uint32_t iinc;
static uint64_t irng;
static uint8_t *stage[2][NBLK], *rbuf[2][NBLK];

/* How long a request or fence may take: past the loss of a peer that
 * stopped answering (the timeout, and a tick), with room for a slow one. */
static int wait_ms(void) { return 2 * o.timeout_ms + 5000; }

static hixl_status_t wait_req(hixl_req_t *r, int kind, size_t bytes)
{
  hixl_status_t st = hixl_req_wait(r, wait_ms());
  hixl_req_free(r);
  if (st == HIXL_OK) {
    atomic_fetch_add(&me_stats->ops[kind], 1);
    atomic_fetch_add(&me_stats->bytes, bytes);
  }
  return st;
}

/* Record a status that is not OK: PEER_LOST is the faults' doing. */
/* After a NOT_REGISTERED: whether the peer turns out lost (probing with a
 * read of the token every 50 ms, within the wait bound). */
static bool refusal_then_lost(conn_t *c, int tgt)
{
  if (atomic_load(&sh->tgt[tgt].incarnation) != c->tgt_inc)
    return true; /* killed and restarted meanwhile */
  int64_t end = now_ns() + (int64_t)wait_ms() * 1000000;
  while (now_ns() < end) {
    uint64_t v;
    hixl_req_t *q;
    hixl_status_t st = hixl_get(c->peer, &v, 8, c->ra, OFF_TOKEN, 0, &q);
    if (st == HIXL_OK) {
      st = hixl_req_wait(q, wait_ms());
      hixl_req_free(q);
    }
    if (st == HIXL_ERR_PEER_LOST)
      return true;
    sleep_ms(50);
  }
  return false;
}

static void on_fail(conn_t *c, int tgt, hixl_status_t st, const char *what)
{
  /* Over fabric a target refuses an operation of a peer it no longer
   * knows with a key error: a successor that took a killed target's port
   * (rxm connects our old address to it), or a target that, resumed from a
   * long stop, found us silent and dropped us first.  Either way the loss
   * follows: NOT_REGISTERED is the fault injection's only if it does. */
  if (st == HIXL_ERR_NOT_REGISTERED && refusal_then_lost(c, tgt)) {
    atomic_fetch_add(&me_stats->successor_refusals, 1);
    st = HIXL_ERR_PEER_LOST;
  }
  if (st == HIXL_ERR_PEER_LOST) {
    atomic_fetch_add(&me_stats->lost_ops, 1);
    if (!c->lost) {
      uint32_t i = atomic_fetch_add(&sh->nloss, 1);
      if (i < MAX_LOSS) {
        sh->loss[i] = (loss_t){now_ns(), c->conn_ns, islot, tgt, {0}};
        snprintf(sh->loss[i].why, sizeof(sh->loss[i].why), "%s: %s", what, hixl_last_error());
      }
    }
  } else {
    note_err(&me_stats->unexpected, "target %d %s: %s (%s)", tgt, what, hixl_strerror(st),
             hixl_last_error());
  }
  c->lost = true;
}

static void conn_close(conn_t *c)
{
  hixl_rmr_release(c->ra);
  hixl_rmr_release(c->rb);
  if (c->peer)
    hixl_disconnect(c->peer);
  c->peer = NULL;
  c->ra = c->rb = NULL;
}

static bool get8(conn_t *c, int tgt, hixl_rmr_t *r, uint64_t off, uint64_t *v)
{
  hixl_req_t *q;
  hixl_status_t st = hixl_get(c->peer, v, 8, r, off, 0, &q);
  if (st == HIXL_OK)
    st = wait_req(q, K_GET, 8);
  if (st != HIXL_OK)
    on_fail(c, tgt, st, "get (8 bytes)");
  return st == HIXL_OK;
}

static bool put8(conn_t *c, int tgt, hixl_rmr_t *r, uint64_t off, uint64_t v)
{
  hixl_req_t *q;
  hixl_status_t st = hixl_put(c->peer, &v, 8, r, off, 0, &q);
  if (st == HIXL_OK)
    st = wait_req(q, K_PUT, 8);
  if (st != HIXL_OK)
    on_fail(c, tgt, st, "put (8 bytes)");
  return st == HIXL_OK;
}

static bool fence(conn_t *c, int tgt)
{
  hixl_status_t st = hixl_fence(ictx, c->peer, wait_ms());
  if (st == HIXL_OK)
    atomic_fetch_add(&me_stats->ops[K_FENCE], 1);
  else
    on_fail(c, tgt, st, "fence");
  return st == HIXL_OK;
}

/* Write a message (seq = ++c->seq) and notify with it: put_imm, or a
 * put_batch of the message and up to two blocks with one notification. */
static bool send_msg(conn_t *c, int tgt, bool batch)
{
  uint32_t seq = c->seq + 1;
  if (seq - c->acked >= NMSG)
    return true; /* no credit: the target has not caught up; later */
  int reg = (int)rnd(&irng, 2);
  static uint8_t m[MSG_SZ];
  msg_hdr_t h;
  memset(&h, 0, sizeof(h));
  h.magic = MSG_MAGIC;
  h.len = (uint32_t)(sizeof(h) + 8 + rnd(&irng, MSG_SZ - sizeof(h) - 8));
  h.epoch = c->epoch;
  h.seq = seq;
  hixl_xfer_t x[3];
  size_t nx = 1, total = h.len;
  if (batch) {
    for (int k = 0; k < 2; k++) {
      int br = (int)rnd(&irng, 2), b = (int)rnd(&irng, NBLK);
      blkst_t *bs = &c->b[br][b];
      if (bs->pin > c->acked || bs->maybe)
        continue;
      bool dup = false;
      for (uint32_t j = 0; j < h.nref; j++)
        dup |= h.ref[j].reg == (uint32_t)br && h.ref[j].blk == (uint32_t)b;
      if (dup)
        continue;
      uint64_t v = ((uint64_t)iinc << 32) | (uint32_t)(bs->ver + 1);
      gen_block(stage[br][b], blk_sz[b], islot, br, b, v);
      h.ref[h.nref].reg = (uint32_t)br;
      h.ref[h.nref].blk = (uint32_t)b;
      h.ref[h.nref].ver = v;
      h.nref++;
      x[nx++] = (hixl_xfer_t){stage[br][b], br ? c->rb : c->ra, blk_off(islot, b), blk_sz[b]};
      total += blk_sz[b];
    }
  }
  memcpy(m, &h, sizeof(h));
  gen_filler(m + sizeof(h), h.len - sizeof(h), h.epoch, seq);
  hixl_rmr_t *mr = reg ? c->rb : c->ra;
  uint32_t imm = seq == 1 ? IMM(islot, reg, 1, 1, c->epoch) : IMM(islot, reg, 1, 0, seq);
  hixl_req_t *q;
  hixl_status_t st;
  int kind;
  if (batch && h.nref > 0) {
    x[0] = (hixl_xfer_t){m, mr, msg_off(islot, seq), h.len};
    kind = K_PUT_BATCH;
    st = hixl_put_batch(c->peer, x, nx, &imm, rnd(&irng, 4) == 0 ? HIXL_OP_ORDERED : 0, &q);
  } else {
    h.nref = 0;
    total = h.len;
    kind = K_PUT_IMM;
    st = hixl_put_imm(c->peer, m, h.len, mr, msg_off(islot, seq), imm, 0, &q);
  }
  c->seq = seq; /* issued: the target may see it whatever we hear back */
  for (uint32_t j = 0; j < h.nref; j++) {
    blkst_t *bs = &c->b[h.ref[j].reg][h.ref[j].blk];
    bs->maybe = h.ref[j].ver;
    bs->pin = seq;
  }
  if (st == HIXL_OK)
    st = wait_req(q, kind, total);
  if (st != HIXL_OK) {
    on_fail(c, tgt, st, kind == K_PUT_BATCH ? "put_batch+imm" : "put_imm");
    return false;
  }
  for (uint32_t j = 0; j < h.nref; j++) {
    blkst_t *bs = &c->b[h.ref[j].reg][h.ref[j].blk];
    bs->ver = bs->maybe;
    bs->maybe = 0;
    bs->unknown = false;
  }
  return true;
}

static bool send_notify(conn_t *c, int tgt)
{
  uint32_t seq = c->seq + 1;
  hixl_req_t *q;
  hixl_status_t st = hixl_notify(c->peer, IMM(islot, 0, 0, 0, seq), 0, &q);
  c->seq = seq;
  if (st == HIXL_OK)
    st = wait_req(q, K_NOTIFY, 0);
  if (st != HIXL_OK)
    on_fail(c, tgt, st, "notify");
  return st == HIXL_OK;
}

/* Put (from stage) or get (into rbuf) blocks (pr[j], pb[j]), j < n: one
 * batch, or one operation each (puts ordered now and then), all waited
 * for.  The first failure, after every issued one is waited for. */
static hixl_status_t move_blocks(conn_t *c, bool put, const int *pr, const int *pb, int n,
                                 bool batch)
{
  hixl_status_t st = HIXL_OK;
  if (batch) {
    hixl_xfer_t x[3];
    size_t total = 0;
    for (int j = 0; j < n; j++) {
      x[j] = (hixl_xfer_t){put ? stage[pr[j]][pb[j]] : rbuf[pr[j]][pb[j]], pr[j] ? c->rb : c->ra,
                           blk_off(islot, pb[j]), blk_sz[pb[j]]};
      total += blk_sz[pb[j]];
    }
    hixl_req_t *q;
    st = put ? hixl_put_batch(c->peer, x, (size_t)n, NULL, 0, &q)
             : hixl_get_batch(c->peer, x, (size_t)n, 0, &q);
    return st == HIXL_OK ? wait_req(q, put ? K_PUT_BATCH : K_GET_BATCH, total) : st;
  }
  hixl_req_t *q[3] = {0};
  int issued = 0;
  for (int j = 0; j < n && st == HIXL_OK; j++) {
    hixl_rmr_t *r = pr[j] ? c->rb : c->ra;
    if (put) {
      unsigned fl = rnd(&irng, 3) == 0 ? HIXL_OP_ORDERED : 0;
      st = hixl_put(c->peer, stage[pr[j]][pb[j]], blk_sz[pb[j]], r, blk_off(islot, pb[j]), fl,
                    &q[j]);
    } else {
      st = hixl_get(c->peer, rbuf[pr[j]][pb[j]], blk_sz[pb[j]], r, blk_off(islot, pb[j]), 0, &q[j]);
    }
    if (st == HIXL_OK)
      issued++;
  }
  for (int j = 0; j < issued; j++) {
    hixl_status_t s2 = wait_req(q[j], put ? K_PUT : K_GET, blk_sz[pb[j]]);
    if (s2 != HIXL_OK && st == HIXL_OK)
      st = s2;
  }
  return st;
}

/* Put 1-3 blocks (singly, ordered, or as one batch), then read 1-3 back. */
static bool data_round(conn_t *c, int tgt)
{
  int np = 1 + (int)rnd(&irng, 3);
  int pr[3], pb[3], n = 0;
  for (int k = 0; k < np; k++) {
    int r = (int)rnd(&irng, 2), b = (int)rnd(&irng, NBLK);
    blkst_t *bs = &c->b[r][b];
    /* Not a block a message still names, nor one an operation that ended
     * with PEER_LOST left unsettled (a read settles it first). */
    if (bs->pin > c->acked || bs->maybe)
      continue;
    bool dup = false;
    for (int j = 0; j < n; j++)
      dup |= pr[j] == r && pb[j] == b;
    if (dup)
      continue;
    uint64_t v = ((uint64_t)iinc << 32) | (uint32_t)(bs->ver + 1);
    gen_block(stage[r][b], blk_sz[b], islot, r, b, v);
    bs->maybe = v;
    pr[n] = r;
    pb[n] = b;
    n++;
  }
  bool batch = n > 1 && rnd(&irng, 2);
  hixl_status_t st = move_blocks(c, true, pr, pb, n, batch);
  if (st != HIXL_OK) {
    on_fail(c, tgt, st, "put");
    return false;
  }
  for (int j = 0; j < n; j++) {
    blkst_t *bs = &c->b[pr[j]][pb[j]];
    bs->ver = bs->maybe;
    bs->maybe = 0;
    bs->unknown = false;
  }
  /* Read back blocks whose content we know. */
  int ng = 1 + (int)rnd(&irng, 3);
  n = 0;
  for (int k = 0; k < ng; k++) {
    int r = (int)rnd(&irng, 2), b = (int)rnd(&irng, NBLK);
    if (c->b[r][b].unknown)
      continue;
    bool dup = false;
    for (int j = 0; j < n; j++)
      dup |= pr[j] == r && pb[j] == b;
    if (!dup) {
      pr[n] = r;
      pb[n] = b;
      n++;
    }
  }
  if (n == 0)
    return true;
  batch = n > 1 && rnd(&irng, 2);
  st = move_blocks(c, false, pr, pb, n, batch);
  if (st != HIXL_OK) {
    on_fail(c, tgt, st, batch ? "get_batch" : "get");
    return false;
  }
  static uint8_t want[262144];
  for (int j = 0; j < n; j++) {
    blkst_t *bs = &c->b[pr[j]][pb[j]];
    const uint8_t *got = rbuf[pr[j]][pb[j]];
    size_t len = blk_sz[pb[j]], at = 0;
    uint64_t seen;
    memcpy(&seen, got, 8);
    bool match = seen == bs->ver || (bs->maybe && seen == bs->maybe);
    uint64_t cand = seen;
    bool ok = false;
    if (match) {
      gen_block(want, len, islot, pr[j], pb[j], cand);
      ok = check_bytes(got, want, len, &at);
    }
    if (ok) {
      atomic_fetch_add(&me_stats->verify_ok, 1);
      bs->ver = cand;
      bs->maybe = 0;
    } else {
      note_err(&me_stats->verify_err,
               "target %d block %c%d (%zu bytes): read version %#" PRIx64 " byte %zu wrong; "
               "expected version %#" PRIx64 " (or %#" PRIx64 ")",
               tgt, pr[j] ? 'B' : 'A', pb[j], len, seen, at, bs->ver, bs->maybe);
      bs->unknown = true; /* report once, then rewrite it */
    }
  }
  return true;
}

/* FAA on our counter (exact) and on the shared one (increasing). */
static bool faa_round(conn_t *c, int tgt)
{
  int r = (int)rnd(&irng, 2);
  uint64_t old = 0;
  hixl_req_t *q;
  hixl_status_t st = hixl_atomic_faa(c->peer, r ? c->rb : c->ra, OFF_CNT(islot), 1, &old, 0, &q);
  if (st == HIXL_OK)
    st = wait_req(q, K_FAA, 8);
  if (st != HIXL_OK) {
    c->cnt_maybe[r]++; /* it may have executed */
    on_fail(c, tgt, st, "faa");
    return false;
  }
  bool ok = !c->cnt_known[r] || (old >= c->cnt[r] && old - c->cnt[r] <= c->cnt_maybe[r]);
  if (ok)
    atomic_fetch_add(&me_stats->faa_ok, 1);
  else
    note_err(&me_stats->faa_err,
             "target %d counter %c: FAA returned %" PRIu64 ", expected %" PRIu64, tgt,
             r ? 'B' : 'A', old, c->cnt[r]);
  c->cnt[r] = old + 1;
  c->cnt_known[r] = true;
  c->cnt_maybe[r] = 0;
  st = hixl_atomic_faa(c->peer, c->ra, OFF_SHARED, 1, &old, 0, &q);
  if (st == HIXL_OK)
    st = wait_req(q, K_FAA, 8);
  if (st != HIXL_OK) {
    on_fail(c, tgt, st, "faa (shared)");
    return false;
  }
  if (c->shared_last != UINT64_MAX && old <= c->shared_last)
    note_err(&me_stats->faa_err,
             "target %d shared counter: FAA returned %" PRIu64 " after %" PRIu64, tgt, old,
             c->shared_last);
  else
    atomic_fetch_add(&me_stats->faa_ok, 1);
  c->shared_last = old;
  return true;
}

static bool cas(conn_t *c, int tgt, uint64_t expect, uint64_t want, uint64_t *old)
{
  hixl_req_t *q;
  hixl_status_t st = hixl_atomic_cas(c->peer, c->ra, OFF_LOCK, expect, want, old, 0, &q);
  if (st == HIXL_OK)
    st = wait_req(q, K_CAS, 8);
  if (st != HIXL_OK)
    on_fail(c, tgt, st, "cas");
  return st == HIXL_OK;
}

/* The CAS lock around x + y == 0 (region B).  The lock word names the
 * holder: its connection's epoch and its slot. */
static bool lock_round(conn_t *c, int tgt)
{
  uint64_t me = ((uint64_t)c->epoch << 8) | (uint64_t)(islot + 1), old = 0;
  if (!cas(c, tgt, 0, me, &old))
    return false;
  bool repair = false;
  if (old != 0) {
    if ((old & 0xff) != (uint64_t)(islot + 1)) {
      atomic_fetch_add(&me_stats->lock_busy, 1); /* another slot holds it */
      return true;
    }
    /* An earlier connection (or incarnation) of our slot lost it while
     * holding it: take it over and repair what it may have left half done. */
    uint64_t o2 = 0;
    if (!cas(c, tgt, old, me, &o2))
      return false;
    if (o2 != old)
      return true;
    repair = true;
  }
  uint64_t x, y;
  if (!get8(c, tgt, c->rb, OFF_X, &x) || !get8(c, tgt, c->rb, OFF_Y, &y))
    return false;
  if (!repair && x + y != 0) {
    note_err(&me_stats->inv_err,
             "target %d: under the lock x + y = %" PRIu64 " (x %" PRIu64 ", y %" PRIu64 ")", tgt,
             x + y, x, y);
    repair = true;
  }
  if (repair) {
    atomic_fetch_add(&me_stats->lock_repairs, 1);
    if (!put8(c, tgt, c->rb, OFF_Y, (uint64_t)0 - x))
      return false;
  } else {
    atomic_fetch_add(&me_stats->inv_ok, 1);
    if (!put8(c, tgt, c->rb, OFF_X, x + 1) || !put8(c, tgt, c->rb, OFF_Y, y - 1))
      return false;
  }
  if (!fence(c, tgt))
    return false;
  if (!cas(c, tgt, me, 0, &old))
    return false;
  if (old != me)
    note_err(&me_stats->inv_err, "target %d: lock held %#" PRIx64 " when we released it", tgt, old);
  return true;
}

/* (Re)connect to target t; the state of the blocks is kept when it is the
 * same target incarnation (its token), else forgotten. */
static bool conn_open(conn_t *c, int t)
{
  uint32_t port = atomic_load(&sh->tgt_port[t]);
  if (port == 0)
    return false; /* not up (yet) */
  char addr[160];
  snprintf(addr, sizeof(addr), strchr(o.listen, ':') ? "[%s]:%u" : "%s:%u", o.listen, port);
  hixl_peer_t *p;
  hixl_status_t st = hixl_connect(ictx, addr, 2000, &p);
  if (st != HIXL_OK) {
    atomic_fetch_add(&me_stats->connect_fail, 1);
    if (st != HIXL_ERR_PEER_LOST && st != HIXL_ERR_TIMEOUT && st != HIXL_ERR_AGAIN)
      note_err(&me_stats->unexpected, "connect %s: %s (%s)", addr, hixl_strerror(st),
               hixl_last_error());
    return false;
  }
  hixl_rmr_t *ra = NULL, *rb = NULL;
  st = hixl_rmr_lookup(p, "soakA", 2000, &ra);
  if (st == HIXL_OK)
    st = hixl_rmr_lookup(p, "soakB", 2000, &rb);
  if (st != HIXL_OK) {
    atomic_fetch_add(&me_stats->connect_fail, 1);
    if (st != HIXL_ERR_PEER_LOST && st != HIXL_ERR_TIMEOUT)
      note_err(&me_stats->unexpected, "lookup at %s: %s (%s)", addr, hixl_strerror(st),
               hixl_last_error());
    hixl_rmr_release(ra);
    hixl_disconnect(p);
    return false;
  }
  atomic_fetch_add(&me_stats->connects, 1);
  uint64_t token_before = c->token;
  c->peer = p;
  c->ra = ra;
  c->rb = rb;
  c->lost = false;
  c->conn_ns = now_ns();
  c->tgt_inc = atomic_load(&sh->tgt[t].incarnation);
  /* Published before anything of this connection is written: a target that
   * finds an older connection's message overwritten knows why. */
  c->epoch = atomic_fetch_add(&sh->cur_epoch[islot], 1) + 1;
  c->seq = 0;
  c->acked = 0;
  uint64_t token;
  if (!get8(c, t, ra, OFF_TOKEN, &token))
    return false;
  if (token != token_before) {
    /* A new target (or our first visit): nothing of ours is there. */
    c->token = token;
    for (int r = 0; r < 2; r++) {
      for (int b = 0; b < (int)NBLK; b++)
        c->b[r][b] = (blkst_t){0, 0, iinc > 1 && token_before == 0, 0};
      c->cnt_known[r] = false;
      c->cnt_maybe[r] = 0;
    }
    c->shared_last = UINT64_MAX;
  }
  for (int r = 0; r < 2; r++)
    for (int b = 0; b < (int)NBLK; b++)
      c->b[r][b].pin = 0;
  return send_msg(c, t, false); /* the hello: seq 1 */
}

static int run_initiator(int idx)
{
  me_stats = &sh->ini[idx];
  me_name = "initiator";
  islot = idx;
  iinc = atomic_load(&me_stats->incarnation);
  irng = o.seed ^ ((uint64_t)idx << 48) ^ ((uint64_t)iinc << 32);
  for (int r = 0; r < 2; r++)
    for (int b = 0; b < (int)NBLK; b++)
      if (!(stage[r][b] = malloc(blk_sz[b])) || !(rbuf[r][b] = malloc(blk_sz[b])))
        return 2;
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  if (hixl_ctx_create(&cfg, &ictx) != HIXL_OK) {
    fprintf(stderr, "initiator %d: %s\n", idx, hixl_last_error());
    return 2;
  }
  conn_t *conns = calloc((size_t)o.ntgt, sizeof(*conns));
  if (!conns)
    return 2;
  while (!atomic_load(&sh->stop_initiators)) {
    progress();
    int t = (int)rnd(&irng, (uint64_t)o.ntgt);
    conn_t *c = &conns[t];
    if (c->peer && c->lost)
      conn_close(c);
    if (!c->peer) {
      if (!conn_open(c, t))
        sleep_ms(20);
      continue;
    }
    uint64_t ack;
    if (!get8(c, t, c->ra, OFF_ACK(islot), &ack))
      continue;
    if ((uint32_t)(ack >> 32) == c->epoch && (uint32_t)ack > c->acked)
      c->acked = (uint32_t)ack;
    switch (rnd(&irng, 8)) {
    case 0:
    case 1:
    case 2: data_round(c, t); break;
    case 3: send_msg(c, t, false); break;
    case 4: send_msg(c, t, true); break;
    case 5:
      if (rnd(&irng, 2))
        send_notify(c, t);
      else
        fence(c, t);
      break;
    case 6: faa_round(c, t); break;
    default: lock_round(c, t); break;
    }
  }
  for (int t = 0; t < o.ntgt; t++)
    conn_close(&conns[t]);
  hixl_ctx_destroy(ictx);
  free(conns);
  for (int r = 0; r < 2; r++)
    for (int b = 0; b < (int)NBLK; b++) {
      free(stage[r][b]);
      free(rbuf[r][b]);
    }
  return 0;
}

/* ------------------------------------------------------------ supervisor */

typedef struct proc {
  pid_t pid;
  bool is_tgt;
  int idx;
  bool stopped;
  int64_t stop_until, restart_at;
} proc_t;

typedef struct event {
  int64_t t0, t1; /* start, end (stops), or t0 only (kills) */
  bool kill, tgt;
  int idx;
} event_t;

static proc_t procs[MAX_T + MAX_I];
static int nprocs;
static event_t ev[MAX_EVENTS];
static int nev;
static int64_t t_start;
static int child_failures;

static void apply_env(const char *const *kv, int n)
{
  for (int i = 0; i < n; i++) {
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", kv[i]);
    char *eq = strchr(buf, '=');
    if (eq) {
      *eq = 0;
      setenv(buf, eq + 1, 1);
    }
  }
}

static void spawn(proc_t *p)
{
  stats_t *s = p->is_tgt ? &sh->tgt[p->idx] : &sh->ini[p->idx];
  atomic_fetch_add(&s->incarnation, 1);
  atomic_store(&s->progress_ns, now_ns());
  if (p->is_tgt)
    atomic_store(&sh->tgt_port[p->idx], 0);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    /* A child goes with the supervisor, and ignores SIGHUP: the kernel
     * sends SIGHUP to a stopped member of a process group that becomes
     * orphaned (the shell that started the soak exits while a child is
     * SIGSTOPped), which would read as an unexplained death. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGHUP, SIG_IGN);
    if (p->is_tgt)
      apply_env(o.env_t, o.nenv_t);
    else
      apply_env(o.env_i, o.nenv_i);
    /* exit, not _exit: LeakSanitizer (an ASan build) checks at exit. */
    exit(p->is_tgt ? run_target(p->idx) : run_initiator(p->idx));
  }
  p->pid = pid;
  p->stopped = false;
  p->restart_at = 0;
}

static const char *pname(const proc_t *p, char *buf, size_t n)
{
  snprintf(buf, n, "%s %d", p->is_tgt ? "target" : "initiator", p->idx);
  return buf;
}

static void dump_stacks(pid_t pid)
{
  char cmd[256];
  snprintf(cmd, sizeof(cmd),
           "command -v gdb >/dev/null && gdb -q -batch -p %d -ex 'thread apply all bt' 2>&1 | "
           "grep -E '^(#|Thread)' | head -n 120 >&2",
           (int)pid);
  if (system(cmd) != 0)
    fprintf(stderr, "(no stacks: gdb missing or failed)\n");
}

static int64_t proc_kib(pid_t pid, const char *key)
{
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  int64_t v = -1;
  size_t kl = strlen(key);
  while (fgets(line, sizeof(line), f))
    if (strncmp(line, key, kl) == 0) {
      v = strtoll(line + kl, NULL, 10);
      break;
    }
  fclose(f);
  return v;
}

static int proc_fds(pid_t pid)
{
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  return count_dir(path);
}

typedef struct sample {
  double t;
  int64_t rss[2];
  int fds[2];
} sample_t;
static sample_t samples[MAX_SAMPLES];
static int nsamples;

/* Least-squares slope of y over the samples from index i0 on, per minute. */
static double slope(int i0, int which, bool fds)
{
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int i = i0; i < nsamples; i++) {
    double x = samples[i].t / 60.0, y = fds ? samples[i].fds[which] : (double)samples[i].rss[which];
    n++;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  double d = n * sxx - sx * sx;
  return n < 3 || d == 0 ? 0 : (n * sxy - sx * sy) / d;
}

static void reap(bool ending)
{
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int i = 0; i < nprocs; i++) {
      proc_t *p = &procs[i];
      if (p->pid != pid)
        continue;
      p->pid = 0;
      char nm[32];
      bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && p->restart_at;
      if (!killed && !(ending && WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        child_failures++;
        if (WIFEXITED(status))
          fprintf(stderr, "soak: %s exited with status %d%s\n", pname(p, nm, sizeof(nm)),
                  WEXITSTATUS(status), ending ? "" : " during the run");
        else
          fprintf(stderr, "soak: %s died of signal %d\n", pname(p, nm, sizeof(nm)),
                  WTERMSIG(status));
        if (!ending && !p->restart_at)
          p->restart_at = now_ns() + 200000000;
      }
    }
  }
}

static void usage(void)
{
  fprintf(stderr, "usage: hixl-soak [--transport shm|fabric|verbs] [--duration S] [--seed N]\n"
                  "  [--targets N] [--initiators N] [--timeout-ms MS] [--fault-ms MEAN]\n"
                  "  [--no-faults] [--listen HOST] [--env-target K=V] [--env-initiator K=V]\n"
                  "  [--inject block|notif|lock|faa] [--quiet]\n");
  exit(2);
}

static void sum_stats(stats_t *tot, const stats_t *s, int n)
{
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < K_N; k++)
      tot->ops[k] += s[i].ops[k];
    tot->bytes += s[i].bytes;
    tot->lost_ops += s[i].lost_ops;
    tot->successor_refusals += s[i].successor_refusals;
    tot->unexpected += s[i].unexpected;
    tot->verify_ok += s[i].verify_ok;
    tot->verify_err += s[i].verify_err;
    tot->notif_ok += s[i].notif_ok;
    tot->notif_superseded += s[i].notif_superseded;
    tot->notif_err += s[i].notif_err;
    tot->connects += s[i].connects;
    tot->connect_fail += s[i].connect_fail;
    tot->inv_ok += s[i].inv_ok;
    tot->inv_err += s[i].inv_err;
    tot->lock_busy += s[i].lock_busy;
    tot->lock_repairs += s[i].lock_repairs;
    tot->faa_ok += s[i].faa_ok;
    tot->faa_err += s[i].faa_err;
  }
}

/* The longest run of time, before loss l and after its connection, that
 * stops of its target or its initiator cover together (gaps under 100 ms
 * joined). */
static int cmp_iv(const void *a, const void *b)
{
  const int64_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0];
}

static int64_t merged_stop_ns(const loss_t *l)
{
  static int64_t iv[MAX_EVENTS][2];
  int n = 0;
  for (int e = 0; e < nev; e++) {
    bool about = ev[e].tgt ? ev[e].idx == l->tgt : ev[e].idx == l->ini;
    int64_t end = ev[e].t1 ? ev[e].t1 : l->t_ns;
    if (about && !ev[e].kill && ev[e].t0 <= l->t_ns && end >= l->conn_ns) {
      iv[n][0] = ev[e].t0;
      iv[n][1] = end;
      n++;
    }
  }
  qsort(iv, (size_t)n, sizeof(iv[0]), cmp_iv);
  int64_t best = 0;
  for (int k = 0; k < n;) {
    int64_t lo = iv[k][0], hi = iv[k][1];
    for (k++; k < n && iv[k][0] <= hi + 100000000; k++)
      hi = iv[k][1] > hi ? iv[k][1] : hi;
    best = hi - lo > best ? hi - lo : best;
  }
  return best;
}

/* Match every loss to a fault: detection times, and false deaths. */
static void analyse_losses(int *false_deaths, int64_t *det_kill, int *ndk, int64_t *det_stop,
                           int *nds)
{
  uint32_t n = atomic_load(&sh->nloss);
  if (n > MAX_LOSS)
    n = MAX_LOSS;
  /* A peer is lost after timeout_ms of silence.  Heartbeats are due every
   * quarter of it but go at the control thread's next tick (another
   * quarter), so the silence of a stop can start up to half the timeout
   * before it: a stop of half the timeout may legitimately cost a peer
   * (measured: stops of 1.8-1.9 s did, at 3 s).  Shorter ones must never. */
  int64_t thr = (int64_t)o.timeout_ms / 2 * 1000000;
  *false_deaths = *ndk = *nds = 0;
  /* Detection: per kill of a target, the first loss of it after the kill
   * (by any initiator, of a connection made before it); per stop longer
   * than the timeout, the first loss after the SIGSTOP that the stop
   * alone explains: no earlier than its silence could (thr), no later
   * than 2 s after the SIGCONT, and not by an initiator itself stopped
   * meanwhile.  Either way, before the target's next fault. */
  for (int e = 0; e < nev; e++) {
    if (!ev[e].tgt || (!ev[e].kill && ev[e].t1 - ev[e].t0 < (int64_t)o.timeout_ms * 1000000))
      continue;
    int64_t lo = ev[e].t0 + (ev[e].kill ? 0 : thr);
    int64_t hi = ev[e].kill ? ev[e].t0 + 30000000000LL : ev[e].t1 + 2000000000LL;
    for (int f = e + 1; f < nev; f++)
      if (ev[f].tgt && ev[f].idx == ev[e].idx) {
        hi = ev[f].t0 < hi ? ev[f].t0 : hi;
        break;
      }
    int64_t best = INT64_MAX;
    for (uint32_t i = 0; i < n; i++) {
      const loss_t *l = &sh->loss[i];
      if (l->tgt != ev[e].idx || l->t_ns < lo || l->t_ns > hi || l->conn_ns >= ev[e].t0 ||
          l->t_ns - ev[e].t0 >= best)
        continue;
      bool ini_stopped = false;
      for (int f = 0; f < nev && !ini_stopped; f++)
        ini_stopped = !ev[f].tgt && !ev[f].kill && ev[f].idx == l->ini && ev[f].t0 <= l->t_ns &&
                      (ev[f].t1 == 0 || ev[f].t1 >= ev[e].t0);
      if (!ini_stopped)
        best = l->t_ns - ev[e].t0;
    }
    if (best == INT64_MAX)
      continue;
    if (ev[e].kill)
      det_kill[(*ndk)++] = best;
    else
      det_stop[(*nds)++] = best;
  }
  for (uint32_t i = 0; i < n; i++) {
    const loss_t *l = &sh->loss[i];
    bool explained = false;
    for (int e = 0; e < nev && !explained; e++) {
      bool about = ev[e].tgt ? ev[e].idx == l->tgt : ev[e].idx == l->ini;
      if (!about || ev[e].t0 > l->t_ns)
        continue;
      if (ev[e].kill && ev[e].tgt)
        explained = ev[e].t0 >= l->conn_ns - 1000000000; /* killed while we knew it */
      else if (!ev[e].kill) {
        int64_t end = ev[e].t1 ? ev[e].t1 : INT64_MAX;
        explained = end - ev[e].t0 >= thr && end >= l->conn_ns;
      }
    }
    /* Stops of the two sides that overlap or follow each other at once
     * make one silence: the target stopped, then the initiator before the
     * target's first heartbeat after it reached it (seen in the guest:
     * 4.5 s and 5.0 s overlapping, 6.6 s in all, at a 10 s timeout). */
    if (!explained)
      explained = merged_stop_ns(l) >= thr;
    if (!explained) {
      (*false_deaths)++;
      if (*false_deaths <= 10)
        fprintf(stderr,
                "soak: false death? initiator %d saw target %d lost at %.3f s (connected at "
                "%.3f s), no kill or long stop explains it: %s\n",
                l->ini, l->tgt, (double)(l->t_ns - t_start) / 1e9,
                (double)(l->conn_ns - t_start) / 1e9, l->why);
      for (int e = 0; e < nev; e++) /* the faults around it */
        if (ev[e].t0 > l->conn_ns - 10000000000LL && ev[e].t0 < l->t_ns + 1000000000LL)
          fprintf(stderr, "soak:   %8.3f s %s %s %d, until %.3f s\n",
                  (double)(ev[e].t0 - t_start) / 1e9, ev[e].kill ? "kill" : "stop",
                  ev[e].tgt ? "target" : "initiator", ev[e].idx,
                  (double)((ev[e].t1 ? ev[e].t1 : ev[e].t0) - t_start) / 1e9);
    }
  }
}

static void print_det(const char *what, int64_t *v, int n)
{
  if (n == 0) {
    printf("  detection %-22s none measured\n", what);
    return;
  }
  qsort(v, (size_t)n, sizeof(*v), cmp_i64);
  printf("  detection %-22s n %d, min %.0f ms, p50 %.0f ms, max %.0f ms\n", what, n,
         (double)v[0] / 1e6, (double)v[n / 2] / 1e6, (double)v[n - 1] / 1e6);
}

int main(int argc, char **argv)
{
  o.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--no-faults"))
      o.faults = false;
    else if (!strcmp(a, "--quiet"))
      o.quiet = true;
    else if (!v)
      usage();
    else if (!strcmp(a, "--transport"))
      o.transport = argv[++i];
    else if (!strcmp(a, "--listen"))
      o.listen = argv[++i];
    else if (!strcmp(a, "--duration"))
      o.duration_s = atoi(argv[++i]);
    else if (!strcmp(a, "--seed"))
      o.seed = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(a, "--targets"))
      o.ntgt = atoi(argv[++i]);
    else if (!strcmp(a, "--initiators"))
      o.nini = atoi(argv[++i]);
    else if (!strcmp(a, "--timeout-ms"))
      o.timeout_ms = atoi(argv[++i]);
    else if (!strcmp(a, "--inject"))
      o.inject = argv[++i];
    else if (!strcmp(a, "--fault-ms"))
      o.fault_ms = atoi(argv[++i]);
    else if (!strcmp(a, "--env-target") && o.nenv_t < 16)
      o.env_t[o.nenv_t++] = argv[++i];
    else if (!strcmp(a, "--env-initiator") && o.nenv_i < 16)
      o.env_i[o.nenv_i++] = argv[++i];
    else
      usage();
  }
  if (o.ntgt < 1 || o.ntgt > MAX_T || o.nini < 1 || o.nini > MAX_I || o.duration_s < 1 ||
      o.timeout_ms < 1000 || o.fault_ms < 100)
    usage();
  if (o.inject && strcmp(o.inject, "block") && strcmp(o.inject, "notif") &&
      strcmp(o.inject, "lock") && strcmp(o.inject, "faa"))
    usage();
  setenv("HIXL_TRANSPORTS", o.transport, 1);
  if (!strcmp(o.transport, "fabric"))
    setenv("HIXL_FABRIC_PROVIDER", "tcp;ofi_rxm", 0);
  char tmo[32];
  snprintf(tmo, sizeof(tmo), "%d", o.timeout_ms);
  setenv("HIXL_TIMEOUT_MS", tmo, 1);
  sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) {
    perror("mmap");
    return 2;
  }
  memset(sh, 0, sizeof(*sh));
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("hixl-soak: transport %s, %d s, seed %" PRIu64 ", %d targets, %d initiators, "
         "HIXL_TIMEOUT_MS %d, faults %s (every %d ms on average)\n",
         o.transport, o.duration_s, o.seed, o.ntgt, o.nini, o.timeout_ms, o.faults ? "on" : "off",
         o.fault_ms);
  t_start = now_ns();
  for (int i = 0; i < o.ntgt; i++)
    procs[nprocs++] = (proc_t){.is_tgt = true, .idx = i};
  for (int i = 0; i < o.nini; i++)
    procs[nprocs++] = (proc_t){.is_tgt = false, .idx = i};
  for (int i = 0; i < o.ntgt; i++)
    spawn(&procs[i]);
  for (int i = 0; i < 500 && atomic_load(&sh->tgt_port[0]) == 0; i++)
    sleep_ms(10);
  for (int i = o.ntgt; i < nprocs; i++)
    spawn(&procs[i]);

  uint64_t frng = o.seed;
  int64_t end = t_start + (int64_t)o.duration_s * 1000000000;
  int64_t warm = t_start + (int64_t)o.duration_s * 250000000; /* trends after the first quarter */
  int64_t next_fault = t_start + 3000000000LL;
  int64_t next_sample = t_start;
  int64_t hang_ns = (int64_t)(o.timeout_ms * 4 > 20000 ? o.timeout_ms * 4 : 20000) * 1000000;
  int hangs = 0, kills = 0, stops = 0;
  int warm_idx = -1;
  while (now_ns() < end) {
    int64_t now = now_ns();
    reap(false);
    for (int i = 0; i < nprocs; i++) {
      proc_t *p = &procs[i];
      char nm[32];
      if (p->pid && p->stopped && now >= p->stop_until) {
        kill(p->pid, SIGCONT);
        p->stopped = false;
        for (int e = nev - 1; e >= 0; e--)
          if (!ev[e].kill && ev[e].tgt == p->is_tgt && ev[e].idx == p->idx && !ev[e].t1) {
            ev[e].t1 = now;
            break;
          }
        stats_t *s = p->is_tgt ? &sh->tgt[p->idx] : &sh->ini[p->idx];
        atomic_store(&s->progress_ns, now);
      }
      if (!p->pid && p->restart_at && now >= p->restart_at)
        spawn(p);
      stats_t *s = p->is_tgt ? &sh->tgt[p->idx] : &sh->ini[p->idx];
      if (p->pid && !p->stopped && now - atomic_load(&s->progress_ns) > hang_ns) {
        hangs++;
        fprintf(stderr, "soak: %s (pid %d) made no progress for %.0f s: a hang\n",
                pname(p, nm, sizeof(nm)), (int)p->pid,
                (double)(now - atomic_load(&s->progress_ns)) / 1e9);
        dump_stacks(p->pid);
        atomic_store(&s->progress_ns, now); /* report it once per period */
      }
    }
    if (o.faults && now >= next_fault && nev < MAX_EVENTS) {
      next_fault =
          now + (int64_t)(o.fault_ms / 2 + (int)rnd(&frng, (uint64_t)o.fault_ms)) * 1000000;
      uint64_t what = rnd(&frng, 100);
      int victim = (int)rnd(&frng, (uint64_t)nprocs);
      int ms = 1000 + (int)rnd(&frng, 4001);
      int delay = 100 + (int)rnd(&frng, 900);
      proc_t *p = &procs[victim];
      bool long_lived = p->idx == 0;
      if (p->pid && !p->stopped && !p->restart_at) {
        char nm[32];
        if (what < 55 && !long_lived) {
          kill(p->pid, SIGKILL);
          p->restart_at = now + (int64_t)delay * 1000000;
          ev[nev++] = (event_t){now, 0, true, p->is_tgt, p->idx};
          kills++;
          if (!o.quiet)
            printf("  %7.3f s  kill %s, restart in %d ms\n", (double)(now - t_start) / 1e9,
                   pname(p, nm, sizeof(nm)), delay);
        } else {
          kill(p->pid, SIGSTOP);
          p->stopped = true;
          p->stop_until = now + (int64_t)ms * 1000000;
          ev[nev++] = (event_t){now, 0, false, p->is_tgt, p->idx};
          stops++;
          if (!o.quiet)
            printf("  %7.3f s  stop %s for %d ms\n", (double)(now - t_start) / 1e9,
                   pname(p, nm, sizeof(nm)), ms);
        }
      }
    }
    if (now >= next_sample && nsamples < MAX_SAMPLES) {
      next_sample = now + 1000000000;
      sample_t *s = &samples[nsamples];
      s->t = (double)(now - t_start) / 1e9;
      pid_t lp[2] = {procs[0].pid, procs[o.ntgt].pid};
      bool ok = true;
      for (int k = 0; k < 2; k++) {
        s->rss[k] = lp[k] ? proc_kib(lp[k], "VmRSS:") : -1;
        s->fds[k] = lp[k] ? proc_fds(lp[k]) : -1;
        ok &= s->rss[k] > 0 && s->fds[k] > 0;
      }
      if (ok) {
        if (warm_idx < 0 && now >= warm)
          warm_idx = nsamples;
        nsamples++;
      }
    }
    sleep_ms(10);
  }
  /* The end: let everyone run, stop the initiators (they close cleanly),
   * then the targets. */
  for (int i = 0; i < nprocs; i++) {
    if (procs[i].pid && procs[i].stopped) {
      kill(procs[i].pid, SIGCONT);
      procs[i].stopped = false;
      for (int e = nev - 1; e >= 0; e--)
        if (!ev[e].kill && ev[e].tgt == procs[i].is_tgt && ev[e].idx == procs[i].idx && !ev[e].t1)
          ev[e].t1 = now_ns();
    }
    if (!procs[i].pid && procs[i].restart_at)
      procs[i].restart_at = 0; /* not restarted any more */
  }
  atomic_store(&sh->stop_initiators, 1);
  int64_t deadline = now_ns() + 60000000000LL;
  for (;;) {
    reap(true);
    bool any = false;
    for (int i = o.ntgt; i < nprocs; i++)
      any |= procs[i].pid != 0;
    if (!any)
      break;
    if (now_ns() > deadline) {
      for (int i = o.ntgt; i < nprocs; i++)
        if (procs[i].pid) {
          fprintf(stderr, "soak: initiator %d did not finish within 60 s: a hang\n", procs[i].idx);
          dump_stacks(procs[i].pid);
          kill(procs[i].pid, SIGKILL);
          hangs++;
        }
      deadline = INT64_MAX;
    }
    sleep_ms(10);
  }
  atomic_store(&sh->stop_targets, 1);
  deadline = now_ns() + 60000000000LL;
  for (;;) {
    reap(true);
    bool any = false;
    for (int i = 0; i < o.ntgt; i++)
      any |= procs[i].pid != 0;
    if (!any)
      break;
    if (now_ns() > deadline) {
      for (int i = 0; i < o.ntgt; i++)
        if (procs[i].pid) {
          fprintf(stderr, "soak: target %d did not finish within 60 s: a hang\n", procs[i].idx);
          dump_stacks(procs[i].pid);
          kill(procs[i].pid, SIGKILL);
          hangs++;
        }
      deadline = INT64_MAX;
    }
    sleep_ms(10);
  }
  double secs = (double)(now_ns() - t_start) / 1e9;

  stats_t ti, tt;
  memset(&ti, 0, sizeof(ti));
  memset(&tt, 0, sizeof(tt));
  sum_stats(&ti, sh->ini, o.nini);
  sum_stats(&tt, sh->tgt, o.ntgt);
  uint64_t total = 0;
  printf("operations (completed OK):");
  for (int k = 0; k < K_N; k++) {
    printf(" %s %" PRIu64, kind_name[k], (uint64_t)ti.ops[k]);
    total += ti.ops[k];
  }
  printf("\n  total %" PRIu64 " (%.0f/s), %.1f MB moved; %" PRIu64 " ended with PEER_LOST (%" PRIu64
         " of them refused NOT_REGISTERED first: by a target that had dropped us)\n",
         total, (double)total / secs, (double)ti.bytes / 1e6, (uint64_t)ti.lost_ops,
         (uint64_t)ti.successor_refusals);
  printf("checks passed: %" PRIu64 " blocks read back, %" PRIu64 " notifications (%" PRIu64
         " superseded by a newer connection), %" PRIu64 " atomics, %" PRIu64
         " lock invariants (%" PRIu64 " busy, %" PRIu64 " repaired after a holder's loss)\n",
         (uint64_t)ti.verify_ok, (uint64_t)tt.notif_ok, (uint64_t)tt.notif_superseded,
         (uint64_t)ti.faa_ok, (uint64_t)ti.inv_ok, (uint64_t)ti.lock_busy,
         (uint64_t)ti.lock_repairs);
  printf("connections: %" PRIu64 " made, %" PRIu64 " attempts failed (target down or stopped)\n",
         (uint64_t)ti.connects, (uint64_t)ti.connect_fail);
  int fd_count = 0, ndk, nds;
  int64_t *dk = calloc(MAX_EVENTS, sizeof(int64_t)), *ds = calloc(MAX_EVENTS, sizeof(int64_t));
  if (!dk || !ds)
    return 2;
  analyse_losses(&fd_count, dk, &ndk, ds, &nds);
  printf("faults: %d kills, %d stops (1-5 s); %u losses seen by initiators\n", kills, stops,
         atomic_load(&sh->nloss));
  print_det("after a target kill:", dk, ndk);
  print_det("into a long stop:", ds, nds);
  if (warm_idx >= 0 && nsamples - warm_idx >= 3) {
    for (int k = 0; k < 2; k++) {
      int64_t mx = 0;
      int fmx = 0;
      for (int i = warm_idx; i < nsamples; i++) {
        mx = samples[i].rss[k] > mx ? samples[i].rss[k] : mx;
        fmx = samples[i].fds[k] > fmx ? samples[i].fds[k] : fmx;
      }
      printf("  %-12s RSS %.1f -> %.1f MB (max %.1f, %+.0f KiB/min after warm-up), fds %d -> %d "
             "(max %d, %+.1f/min)\n",
             k ? "initiator 0" : "target 0", (double)samples[warm_idx].rss[k] / 1024,
             (double)samples[nsamples - 1].rss[k] / 1024, (double)mx / 1024,
             slope(warm_idx, k, false), samples[warm_idx].fds[k], samples[nsamples - 1].fds[k], fmx,
             slope(warm_idx, k, true));
    }
  }
  uint64_t errs = ti.verify_err + tt.notif_err + ti.inv_err + ti.faa_err + ti.unexpected +
                  tt.unexpected + tt.verify_err + tt.inv_err + tt.faa_err;
  printf("errors: verify %" PRIu64 ", notifications %" PRIu64 ", invariants %" PRIu64
         ", atomics %" PRIu64 ", unexpected statuses %" PRIu64 ", hangs %d, false deaths %d, "
         "child failures %d\n",
         (uint64_t)ti.verify_err, (uint64_t)tt.notif_err, (uint64_t)ti.inv_err,
         (uint64_t)ti.faa_err, (uint64_t)(ti.unexpected + tt.unexpected), hangs, fd_count,
         child_failures);
  for (int i = 0; i < o.ntgt; i++)
    if (sh->tgt[i].err_set)
      printf("  first error of target %d: %s\n", i, sh->tgt[i].first_err);
  for (int i = 0; i < o.nini; i++)
    if (sh->ini[i].err_set)
      printf("  first error of initiator %d: %s\n", i, sh->ini[i].first_err);
  bool pass = errs == 0 && hangs == 0 && fd_count == 0 && child_failures == 0 && total > 0 &&
              ti.verify_ok > 0 && tt.notif_ok > 0;
  printf("%s (seed %" PRIu64 ")\n", pass ? "PASS" : "FAIL", o.seed);
  if (!pass)
    printf("replay the same schedule: hixl-soak --transport %s --duration %d --targets %d "
           "--initiators %d --timeout-ms %d --fault-ms %d%s --seed %" PRIu64 "\n",
           o.transport, o.duration_s, o.ntgt, o.nini, o.timeout_ms, o.fault_ms,
           o.faults ? "" : " --no-faults", o.seed);
  free(dk);
  free(ds);
  return pass ? 0 : 1;
}

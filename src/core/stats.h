/* SPDX-License-Identifier: MIT */
/*
 * Counters of a context and of its peers (hixl_ctx_stats; docs/observability.md).
 *
 * The hot path must not pay for them (issue 17: at most 2% on an 8-byte
 * put), and a locked add costs about 6 ns here, a sixth of a put over shm.
 * So:
 *
 *  - the context's operation counters live in per-thread blocks: each
 *    thread that issues on a context gets one (found through a small
 *    thread-local cache keyed by the context's id, never by its address, so
 *    a destroyed context's block is never touched), written by that thread
 *    alone with plain relaxed stores and summed by hixl_ctx_stats.  A block
 *    lives until the context goes; a new thread with the pthread_t of one
 *    that ended takes its block over, so the blocks stay as many as the
 *    threads alive at once;
 *  - a peer's operation counters are in the peer, also with relaxed
 *    load-and-store: exact while one thread at a time issues to that peer,
 *    short by the increments that collided when several do (the context's
 *    figures stay exact);
 *  - errors, connections and notifications are rare or already under a
 *    lock, and use plain atomics.
 */
#ifndef HIXL_STATS_H
#define HIXL_STATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The figures of the per-thread blocks and of a peer: an operation count
 * and, for the kinds that move bytes, their bytes. */
#define HIXL_OPSTATS(X)                                                                            \
  X(PUT_OPS, "put_ops", "puts issued")                                                             \
  X(PUT_BYTES, "put_bytes", "bytes of puts issued")                                                \
  X(GET_OPS, "get_ops", "gets issued")                                                             \
  X(GET_BYTES, "get_bytes", "bytes of gets issued")                                                \
  X(IMM_OPS, "put_imm_ops", "puts with an immediate (write with notification) issued")             \
  X(IMM_BYTES, "put_imm_bytes", "bytes of puts with an immediate issued")                          \
  X(NOTIFY_OPS, "notify_ops", "notifications without data issued (hixl_notify)")                   \
  X(ATOMIC_OPS, "atomic_ops", "atomics (CAS, FAA) issued")                                         \
  X(BATCH_OPS, "batch_ops", "batches issued (hixl_put_batch, hixl_get_batch)")                     \
  X(BATCH_BYTES, "batch_bytes", "bytes of batches issued")

enum {
#define HIXL_X(id, name, help) HIXL_OPST_##id,
  HIXL_OPSTATS(HIXL_X)
#undef HIXL_X
      HIXL_OPST_N
};

/* The waiting figures, per thread as well (wait.c). */
enum {
  HIXL_WST_SPIN_NS = HIXL_OPST_N, /* polling for the adaptive budget (or spinning) */
  HIXL_WST_SLEEPS,                /* times a blocking call slept in the kernel */
  HIXL_WST_SLEEP_NS,              /* time asleep */
  HIXL_TST_N
};

/* One thread's counters for one context. */
typedef struct hixl_tstats {
  _Atomic uint64_t c[HIXL_TST_N];
  unsigned long owner; /* pthread_self() of the thread writing it */
  struct hixl_tstats *next;
} hixl_tstats_t;

/* The context's own counters (beside the per-thread blocks). */
typedef struct hixl_ctx_counters {
  _Atomic uint64_t errors[12]; /* by -status (HIXL_ERR_INVALID .. HIXL_ERR_NO_DEVICE) */
  _Atomic uint64_t notif_received, notif_dropped;
  _Atomic uint64_t connects, accepts, disconnects, losses;
} hixl_ctx_counters_t;

struct hixl_ctx;
struct hixl_peer;

/* The calling thread's block for ctx (slow path: stats.c), NULL when no
 * memory could be had (then nothing is counted). */
hixl_tstats_t *hixl__tstats_slow(struct hixl_ctx *ctx);

#define HIXL_TSTATS_CACHE 4
typedef struct hixl_tstats_cache {
  uint64_t id[HIXL_TSTATS_CACHE];
  hixl_tstats_t *b[HIXL_TSTATS_CACHE];
} hixl_tstats_cache_t;
/* initial-exec: the general model calls __tls_get_addr at every access
 * (measured: a tenth off the 8-byte put rate).  64 bytes of glibc's static
 * TLS reserve, which a library loaded with dlopen (Python) may also use. */
extern __thread hixl_tstats_cache_t hixl__tstats_tl __attribute__((tls_model("initial-exec")));

/* A counter only its own thread writes: no locked instruction. */
static inline void hixl__stat_add(_Atomic uint64_t *c, uint64_t v)
{
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
}

/* Context ids are random and never 0. */
static inline hixl_tstats_t *hixl__tstats_for(uint64_t ctx_id, struct hixl_ctx *ctx)
{
  if (__builtin_expect(hixl__tstats_tl.id[0] == ctx_id, 1))
    return hixl__tstats_tl.b[0];
  return hixl__tstats_slow(ctx);
}

/* Free the blocks (hixl_ctx_destroy). */
void hixl__stats_fini(struct hixl_ctx *ctx);

struct hixl_msg;
/* Answer a peer's STATS (control thread, ctx->lock held): a chunk of our
 * figures from m's first, as many as fit in one STATS_REPLY. */
void hixl__stats_serve_locked(struct hixl_peer *p, const struct hixl_msg *m, struct hixl_msg *out);

/* A STATS_REPLY r for the figures from at, checked (every byte is the
 * peer's) and, if sound, taken into stats[at ..] (those below room). */
struct hixl_stat;
bool hixl__stats_reply_ok(struct hixl_ctx *ctx, const struct hixl_msg *r, uint32_t at,
                          struct hixl_stat *stats, size_t room);

/* An error the library returns for ctx (and peer, when known). */
void hixl__stat_error(struct hixl_ctx *ctx, struct hixl_peer *peer, int status);

#endif

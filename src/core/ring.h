/* SPDX-License-Identifier: MIT */
/*
 * A bounded multi-producer multi-consumer ring of notifications (D. Vyukov's
 * bounded MPMC queue) that can live in memory shared between processes: no
 * pointers inside, only indices and sequence numbers.
 *
 * Invariants: cell i's seq is i + k*cap when free for the producer of
 * position i + k*cap, and i + k*cap + 1 once that producer has published.
 * A producer claims position p by CAS on head, writes the cell, then stores
 * seq = p + 1 with release; a consumer claims p by CAS on tail after seeing
 * seq == p + 1 (acquire), reads, then stores seq = p + cap (release).  So
 * every entry is taken exactly once and in claim order, and an entry's
 * payload is visible to the consumer that sees it published.
 *
 * A cell stores seq - i (seq_off), not seq: the initial state (seq == i for
 * every cell, head 0) is then all zeroes after the header, so a ring in a
 * fresh memfd is initialised by writing its header alone.  Its pages are
 * faulted in only as positions reach them: an idle peer's 1024-cell shm
 * inbox costs one page, not 32 KiB (issue 13, finding 6).
 *
 * Pure code: unit-tested on its own (tests/unit/test_ring.c).
 */
#ifndef HIXL_RING_H
#define HIXL_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct hixl_ring_cell {
  _Atomic uint64_t seq_off; /* seq - (the cell's index): see the top */
  uint32_t imm;
  uint32_t flags;
  uint64_t len;
  /* The producer's word for the consumer, opaque here: the context inbox
   * keeps the sending peer in it (notif.c).  A ring in shared memory
   * leaves it 0, and its consumer never reads it: a peer could write any. */
  uint64_t tag;
} hixl_ring_cell_t;

/* The part producers write: what may live in memory another process maps
 * (shm).  magic and cap only identify it; nobody reads cap for bounds. */
typedef struct hixl_ring_shared {
  uint64_t magic;
  uint64_t cap; /* power of two: informational */
  char pad0[48];
  _Atomic uint64_t head; /* next position to produce */
  /* The producer's wake-up word for a consumer asleep in futex_waitv
   * (wait.c, shm): bumped, with the time it rang, then FUTEX_WAKE.  In the
   * head's line, which the producer owns already when it rings.  A peer
   * may write any value: it can wake, or fail to wake, only its own
   * consumer's watch of this ring. */
  _Atomic uint32_t bell;
  uint32_t pad_bell;
  _Atomic int64_t rang_ns;
  char pad1[40];
  hixl_ring_cell_t cells[];
} hixl_ring_shared_t;
_Static_assert(offsetof(hixl_ring_shared_t, cells) == 128,
               "ring layout is shared between processes");

/* Each side's private view: the mask (cap - 1) and, for the consumer, the
 * next position to consume.  Never in shared memory, so a peer that
 * scribbles the shared part can at worst garble or stall its own
 * notifications: every index is masked with the private cap, and no loop
 * waits on a word the peer may hold still. */
typedef struct hixl_ring {
  uint64_t mask;
  hixl_ring_shared_t *sh;
  char pad0[48];
  _Atomic uint64_t tail; /* next position to consume */
  char pad1[56];
} hixl_ring_t;

#define HIXL_RING_MAGIC 0x474e495248584948ull /* "HIXHRING" */

/* A producer's claim gives up (as if full) after this many positions that
 * moved under it: only a ring scribbled by its owner gets there. */
#define HIXL_RING_CLAIM_RETRIES 4096u

static inline size_t hixl_ring_shared_bytes(uint64_t cap)
{
  return sizeof(hixl_ring_shared_t) + cap * sizeof(hixl_ring_cell_t);
}

/* A local ring: view and shared part in one allocation of this size. */
static inline size_t hixl_ring_bytes(uint64_t cap)
{
  return sizeof(hixl_ring_t) + hixl_ring_shared_bytes(cap);
}

static inline uint64_t hixl_ring_cap(const hixl_ring_t *r) { return r->mask + 1; }

/* Cell i's seq (i = its index, pos & mask). */
static inline uint64_t hixl_ring_seq(hixl_ring_cell_t *c, uint64_t i)
{
  return atomic_load_explicit(&c->seq_off, memory_order_acquire) + i;
}

static inline void hixl_ring_set_seq(hixl_ring_cell_t *c, uint64_t i, uint64_t seq)
{
  atomic_store_explicit(&c->seq_off, seq - i, memory_order_release);
}

/* Initialise the shared part of cap cells (a power of two >= 2) in memory
 * known to be zero (a fresh memfd): the header only, no cell is touched. */
static inline void hixl_ring_shared_init_zeroed(hixl_ring_shared_t *sh, uint64_t cap)
{
  sh->magic = HIXL_RING_MAGIC;
  sh->cap = cap;
  atomic_store_explicit(&sh->head, 0, memory_order_release);
}

/* The same in memory of any content. */
static inline void hixl_ring_shared_init(hixl_ring_shared_t *sh, uint64_t cap)
{
  for (uint64_t i = 0; i < cap; i++)
    atomic_store_explicit(&sh->cells[i].seq_off, 0, memory_order_relaxed);
  hixl_ring_shared_init_zeroed(sh, cap);
}

/* A view of a shared part of cap cells (ours, or mapped from a peer). */
static inline void hixl_ring_attach(hixl_ring_t *r, hixl_ring_shared_t *sh, uint64_t cap)
{
  r->mask = cap - 1;
  r->sh = sh;
  atomic_store_explicit(&r->tail, 0, memory_order_release);
}

/* A local ring in hixl_ring_bytes(cap) bytes at r (cap a power of two >= 2). */
static inline void hixl_ring_init(hixl_ring_t *r, uint64_t cap)
{
  hixl_ring_shared_t *sh = (hixl_ring_shared_t *)(void *)(r + 1);
  hixl_ring_shared_init(sh, cap);
  hixl_ring_attach(r, sh, cap);
}

/* The same in memory known to be zero (calloc, anonymous mmap): only the
 * header is written, so a cell's page is touched when a position reaches
 * it, not before. */
static inline void hixl_ring_init_zeroed(hixl_ring_t *r, uint64_t cap)
{
  hixl_ring_shared_t *sh = (hixl_ring_shared_t *)(void *)(r + 1);
  hixl_ring_shared_init_zeroed(sh, cap);
  hixl_ring_attach(r, sh, cap);
}

/* A shared part mapped from a peer: check it is one of ours and of the
 * size we expect (a check at mapping time only: cap is never re-read). */
static inline bool hixl_ring_shared_valid(const hixl_ring_shared_t *sh, uint64_t cap)
{
  return sh->magic == HIXL_RING_MAGIC && sh->cap == cap && cap >= 2 && (cap & (cap - 1)) == 0;
}

static inline bool hixl_ring_valid(const hixl_ring_t *r, uint64_t cap)
{
  return r->mask == cap - 1 && hixl_ring_shared_valid(r->sh, cap);
}

/* Claim the next free position; false if the ring is full (or, bounded,
 * if its shared words keep moving under us).  *pos_p is then passed to
 * hixl_ring_publish.  Splitting claim from publish lets a put reserve its
 * notification before moving data, so a full ring fails the put before
 * anything is written. */
static inline bool hixl_ring_claim(hixl_ring_t *r, uint64_t *pos_p)
{
  uint64_t mask = r->mask;
  hixl_ring_shared_t *sh = r->sh;
  uint64_t pos = atomic_load_explicit(&sh->head, memory_order_relaxed);
  for (unsigned tries = 0; tries < HIXL_RING_CLAIM_RETRIES; tries++) {
    hixl_ring_cell_t *c = &sh->cells[pos & mask];
    uint64_t seq = hixl_ring_seq(c, pos & mask);
    int64_t diff = (int64_t)(seq - pos);
    if (diff == 0) {
      if (atomic_compare_exchange_weak_explicit(&sh->head, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed)) {
        *pos_p = pos;
        return true;
      }
    } else if (diff < 0) {
      return false;
    } else {
      pos = atomic_load_explicit(&sh->head, memory_order_relaxed);
    }
  }
  return false;
}

static inline void hixl_ring_publish_tag(hixl_ring_t *r, uint64_t pos, uint32_t imm, uint64_t len,
                                         uint64_t tag)
{
  hixl_ring_cell_t *c = &r->sh->cells[pos & r->mask];
  c->imm = imm;
  c->len = len;
  c->flags = 0;
  c->tag = tag;
  hixl_ring_set_seq(c, pos & r->mask, pos + 1);
}

static inline void hixl_ring_publish(hixl_ring_t *r, uint64_t pos, uint32_t imm, uint64_t len)
{
  hixl_ring_publish_tag(r, pos, imm, len, 0);
}

static inline bool hixl_ring_push_tag(hixl_ring_t *r, uint32_t imm, uint64_t len, uint64_t tag)
{
  uint64_t pos;
  if (!hixl_ring_claim(r, &pos))
    return false;
  hixl_ring_publish_tag(r, pos, imm, len, tag);
  return true;
}

static inline bool hixl_ring_push(hixl_ring_t *r, uint32_t imm, uint64_t len)
{
  return hixl_ring_push_tag(r, imm, len, 0);
}

/* Take the oldest entry; false if none is published yet.  The position is
 * the view's own (private) tail: a cell whose seq is not exactly the one
 * expected is not ready, and we return rather than wait on it (a seq
 * ahead of us can only move on if another consumer of this view took the
 * position, which the private tail then shows). */
static inline bool hixl_ring_pop_tag(hixl_ring_t *r, uint32_t *imm_p, uint64_t *len_p,
                                     uint64_t *tag_p)
{
  uint64_t mask = r->mask;
  hixl_ring_shared_t *sh = r->sh;
  uint64_t pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
  for (;;) {
    hixl_ring_cell_t *c = &sh->cells[pos & mask];
    uint64_t seq = hixl_ring_seq(c, pos & mask);
    int64_t diff = (int64_t)(seq - (pos + 1));
    if (diff == 0) {
      if (atomic_compare_exchange_weak_explicit(&r->tail, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed)) {
        *imm_p = c->imm;
        *len_p = c->len;
        if (tag_p)
          *tag_p = c->tag;
        hixl_ring_set_seq(c, pos & mask, pos + mask + 1);
        return true;
      }
    } else if (diff < 0) {
      return false;
    } else {
      uint64_t now = atomic_load_explicit(&r->tail, memory_order_relaxed);
      if (now == pos)
        return false; /* not ours to wait for: scribbled, or a racing consumer stalled */
      pos = now;
    }
  }
}

static inline bool hixl_ring_pop(hixl_ring_t *r, uint32_t *imm_p, uint64_t *len_p)
{
  return hixl_ring_pop_tag(r, imm_p, len_p, NULL);
}

/* Rewrite the tag of every published, not yet taken entry whose tag is
 * from to to; returns how many.  Only while no consumer runs (the caller
 * excludes them: the context inbox, under ctx->lock): producers never
 * touch a published cell, and an unpublished one is skipped. */
static inline unsigned hixl_ring_retag(hixl_ring_t *r, uint64_t from, uint64_t to)
{
  unsigned n = 0;
  uint64_t mask = r->mask;
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_acquire);
  for (uint64_t pos = tail; pos != head && pos - tail <= mask; pos++) {
    hixl_ring_cell_t *c = &r->sh->cells[pos & mask];
    if (hixl_ring_seq(c, pos & mask) == pos + 1 && c->tag == from) {
      c->tag = to;
      n++;
    }
  }
  return n;
}

/* Cheap emptiness hint for pollers (may be stale). */
static inline bool hixl_ring_maybe_nonempty(hixl_ring_t *r)
{
  uint64_t pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
  return hixl_ring_seq(&r->sh->cells[pos & r->mask], pos & r->mask) == pos + 1;
}

#endif

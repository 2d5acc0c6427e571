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
 * Pure code: unit-tested on its own (tests/unit/test_ring.c).
 */
#ifndef HIXL_RING_H
#define HIXL_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct hixl_ring_cell {
  _Atomic uint64_t seq;
  uint32_t imm;
  uint32_t flags;
  uint64_t len;
  uint64_t pad;
} hixl_ring_cell_t;

typedef struct hixl_ring {
  uint64_t magic;
  uint64_t cap; /* power of two */
  char pad0[48];
  _Atomic uint64_t head; /* next position to produce */
  char pad1[56];
  _Atomic uint64_t tail; /* next position to consume */
  char pad2[56];
  hixl_ring_cell_t cells[];
} hixl_ring_t;

#define HIXL_RING_MAGIC 0x474e495248584948ull /* "HIXHRING" */

static inline size_t hixl_ring_bytes(uint64_t cap)
{
  return sizeof(hixl_ring_t) + cap * sizeof(hixl_ring_cell_t);
}

/* cap must be a power of two >= 2. */
static inline void hixl_ring_init(hixl_ring_t *r, uint64_t cap)
{
  r->magic = HIXL_RING_MAGIC;
  r->cap = cap;
  for (uint64_t i = 0; i < cap; i++)
    atomic_store_explicit(&r->cells[i].seq, i, memory_order_relaxed);
  atomic_store_explicit(&r->head, 0, memory_order_relaxed);
  atomic_store_explicit(&r->tail, 0, memory_order_release);
}

/* A ring mapped from a peer: check it is one of ours and of the size we
 * expect before trusting its indices. */
static inline bool hixl_ring_valid(const hixl_ring_t *r, uint64_t cap)
{
  return r->magic == HIXL_RING_MAGIC && r->cap == cap && cap >= 2 && (cap & (cap - 1)) == 0;
}

/* Claim the next free position; false if the ring is full.  *pos_p is then
 * passed to hixl_ring_publish.  Splitting claim from publish lets a put
 * reserve its notification before moving data, so a full ring fails the put
 * before anything is written. */
static inline bool hixl_ring_claim(hixl_ring_t *r, uint64_t *pos_p)
{
  uint64_t mask = r->cap - 1;
  uint64_t pos = atomic_load_explicit(&r->head, memory_order_relaxed);
  for (;;) {
    hixl_ring_cell_t *c = &r->cells[pos & mask];
    uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
    int64_t diff = (int64_t)(seq - pos);
    if (diff == 0) {
      if (atomic_compare_exchange_weak_explicit(&r->head, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed)) {
        *pos_p = pos;
        return true;
      }
    } else if (diff < 0) {
      return false;
    } else {
      pos = atomic_load_explicit(&r->head, memory_order_relaxed);
    }
  }
}

static inline void hixl_ring_publish(hixl_ring_t *r, uint64_t pos, uint32_t imm, uint64_t len)
{
  hixl_ring_cell_t *c = &r->cells[pos & (r->cap - 1)];
  c->imm = imm;
  c->len = len;
  c->flags = 0;
  atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
}

static inline bool hixl_ring_push(hixl_ring_t *r, uint32_t imm, uint64_t len)
{
  uint64_t pos;
  if (!hixl_ring_claim(r, &pos))
    return false;
  hixl_ring_publish(r, pos, imm, len);
  return true;
}

/* Take the oldest entry; false if none is published yet. */
static inline bool hixl_ring_pop(hixl_ring_t *r, uint32_t *imm_p, uint64_t *len_p)
{
  uint64_t mask = r->cap - 1;
  uint64_t pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
  for (;;) {
    hixl_ring_cell_t *c = &r->cells[pos & mask];
    uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
    int64_t diff = (int64_t)(seq - (pos + 1));
    if (diff == 0) {
      if (atomic_compare_exchange_weak_explicit(&r->tail, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed)) {
        *imm_p = c->imm;
        *len_p = c->len;
        atomic_store_explicit(&c->seq, pos + r->cap, memory_order_release);
        return true;
      }
    } else if (diff < 0) {
      return false;
    } else {
      pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
    }
  }
}

/* Cheap emptiness hint for pollers (may be stale). */
static inline bool hixl_ring_maybe_nonempty(hixl_ring_t *r)
{
  uint64_t pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
  return atomic_load_explicit(&r->cells[pos & (r->cap - 1)].seq, memory_order_acquire) == pos + 1;
}

#endif

/* SPDX-License-Identifier: MIT */
/*
 * Inside the shm transport: what shm.c (binding, data path), cma.c
 * (process_vm_writev/readv, split across threads) and stage.c (copies the
 * owner performs when the kernel refuses CMA) share.  White-box tests
 * (tests/cma/owner_copy.c) read it too.
 */
#ifndef HIXL_SHM_INT_H
#define HIXL_SHM_INT_H

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "../core/provider.h"

#define HIXL_TP_SHM 1 /* the wire id (transport.c names it) */
extern const hixl_transport_ops_t hixl__shm_ops;

/* shm's own control messages (TP_REQ / TP_REPLY, tp_req.kind), the owner's
 * copies where the kernel refuses CMA (stage.c).  STAGE: lend me a staging
 * area; the reply's size is the bytes of data after its 4096-byte header
 * (+1 fd: the sealed memfd).  COPY: copy between a staging piece and a
 * region; slot, rkey, off (in the region), len, soff (in the staging
 * data), dir (SHM_COPY_PUT: staging -> region, SHM_COPY_GET: back), all
 * checked by the owner; no reply, the outcome goes into the staging
 * header. */
enum { SHM_KIND_STAGE = 1, SHM_KIND_COPY = 2 };
typedef HIXL_MSG_VIEW(p0, p1, kind, size, q1, q2, q3, q4) shm_stage_msg_t;
typedef HIXL_MSG_VIEW(slot, dir, kind, rkey, off, len, soff, q4) shm_copy_msg_t;

/*
 * The staging area: when the kernel refuses CMA towards a peer (EPERM under
 * Yama ptrace_scope >= 1 between siblings, seccomp, containers; ENOSYS),
 * data for its non-mapped regions travels through a memfd the owner creates
 * for that peer, seals (no shrink, no grow, no more seals) and lends it
 * (SHM_STAGE_REQ / SHM_STAGE_REPLY).  The initiator copies a piece into the
 * data area and sends SHM_COPY (slot, rkey, offset, length, staging
 * offset); the owner's control thread checks everything as for an atomic
 * and copies.  Gets go the other way.  Pieces are pipelined through a ring
 * of the data area: the initiator fills the next while the owner copies
 * the last.
 *
 * The owner only ever writes the header (below) and never reads it: all it
 * acts on comes in the message and is checked against its own registry and
 * the staging's size.
 */
#define SHM_STAGE_HDR 4096u
enum { SHM_COPY_PUT = 1, SHM_COPY_GET = 2 };
typedef struct shm_stage_hdr {
  _Atomic uint64_t done; /* SHM_COPY messages the owner has finished */
  uint8_t pad0[56];
  _Atomic uint64_t err_seq;   /* number (1-based) of the last one that failed */
  _Atomic int32_t err_status; /* and why (written before done is published) */
} shm_stage_hdr_t;

/* Initiator side: the peer's staging area we fill (one user at a time). */
#define SHM_STAGE_FIFO 64 /* pieces in flight, at most: bounds the socket's load */
typedef struct shm_stage_piece {
  uint64_t seq; /* its SHM_COPY's number */
  size_t start, len;
  void *dst; /* a get: where the bytes go once done (NULL: a put) */
} shm_stage_piece_t;
typedef struct shm_stage_out {
  pthread_mutex_t lock;
  bool ready; /* mapped */
  shm_stage_hdr_t *hdr;
  uint8_t *data;
  size_t size, map_len;
  uint64_t sent; /* SHM_COPY messages sent */
  size_t head;   /* next free byte of the ring */
  shm_stage_piece_t fifo[SHM_STAGE_FIFO];
  unsigned fifo_first, fifo_n;
} shm_stage_out_t;

/* Owner side: the staging area we lent the peer (control thread only). */
typedef struct shm_stage_in {
  int fd;
  shm_stage_hdr_t *hdr;
  uint8_t *data;
  size_t size, map_len;
  uint64_t handled; /* SHM_COPY messages handled */
} shm_stage_in_t;

/*
 * The region table shm peers map (read-only: an O_RDONLY open of a memfd
 * sealed against future writes): per slot of the owner's registry, a
 * one-way tag of the live region there, zero when none.  Never a key, an
 * address or a length: those stay in the owner's private registry
 * (ctx->reg_table, ctx->slot_mr), against which it checks every request.
 * A peer that unpacks a blob computes the tag of what the blob claims
 * (shm_tag: SHA-256 of the owner's context id, the slot and every field,
 * truncated to 128 bits) and compares it with the slot, once; the data
 * path then compares the first word only (a deregistration zeroes it) with
 * one load.  To forge a blob that passes, a peer would need a preimage of a
 * live tag; the rkey of a region it has no blob for (64 random bits, in the
 * hash) is not derivable from the tag.
 *
 * The owner writes under its registration's order: w[1], then w[0] with
 * release; a deregistration zeroes w[0] first (before the memory goes).
 */
typedef struct shm_tag {
  _Atomic uint64_t w[2];
} shm_tag_t;
_Static_assert(sizeof(shm_tag_t) == 16, "the tag table is shared between processes");
#define SHM_TAGS_BYTES ((size_t)HIXL_REG_SLOTS * sizeof(shm_tag_t))

/*
 * The doorbell (docs/waiting.md): the page after the tags, in the same
 * read-only mapping, says whether the owner has threads asleep in
 * hixl__wait (ctx->sleepers points here) or waiting for room in a ring it
 * produces into (ctx->space_waiters).  A peer that makes an event for it
 * (a notification in its inbox, a staged copy done, room in a ring) reads
 * the word after its own store and a full fence, and only when it is
 * non-zero writes 8 bytes (its CLOCK_MONOTONIC time: the wake-up latency
 * the owner's adaptive polling follows) into the owner's doorbell: the
 * write end of a pipe whose read end only the owner holds (handed over at
 * SHM_BIND).  So a peer can wake the owner spuriously, never steal or
 * block another peer's wake-up; writes use RWF_NOWAIT, so a peer that
 * fills the pipe and clears O_NONBLOCK on the shared write end cannot
 * block its other writers either.  (A pipe, not a datagram socket: a unix
 * socket's wake-up took 46 us where a pipe's took 32 here.)  Only the owner
 * writes the page.  Each word's low half counts threads asleep in poll()
 * (the pipe); its high half threads asleep in futex_waitv on one word per
 * peer (HIXL_SLEEP_WORD), which the peer bumps in the ring it produces
 * into, ring.h's `bell`, and FUTEX_WAKEs (hixl__shm_bell_send).
 *
 * `alive` is the owner's heartbeat: its control thread stores its
 * CLOCK_MONOTONIC time there at every turn of its loop (at least once a
 * tick), and a peer that sees it move counts that as hearing from the
 * owner at that time (shm_peer_alive), so no heartbeat messages go between
 * shm peers, and a peer reads the page only once it has not heard from the
 * owner for half its liveness period: one store per context per turn and
 * one load per peer per T/2, where messages cost two system calls per peer
 * and a load per tick cost a TLB miss per peer per tick (idle CPU at 4,096
 * peers, docs/scale.md).  A time, not a counter, because a counter that
 * moved between two reads T/2 apart says the owner lived at some point in
 * between, too vague for both promises (a silent peer lost within T plus
 * a tick, a live one never before T).
 */
typedef struct shm_bell {
  _Atomic uint32_t sleepers;
  uint32_t pad0[15];
  _Atomic uint32_t space_waiters;
  uint32_t pad1[15];
  _Atomic uint64_t alive;
} shm_bell_t;
_Static_assert(sizeof(shm_bell_t) <= 4096, "the bell is one page");
#define SHM_BELL_PAGE 4096u
#define SHM_TABLE_BYTES (SHM_TAGS_BYTES + SHM_BELL_PAGE) /* tags, then the bell */

typedef struct shm_peer {
  const shm_tag_t *table;        /* theirs, read-only */
  const shm_bell_t *bell;        /* theirs: the page after the table */
  int bell_w;                    /* their doorbell's write end */
  uint64_t alive_seen;           /* bell->alive when we last looked (control thread) */
  int64_t alive_read_ns;         /* when we looked */
  bool alive_unclocked;          /* its times are not on our clock (shm_peer_alive) */
  hixl_ring_shared_t *outbox_sh; /* their inbox, mapped: we produce */
  hixl_ring_shared_t *inbox_sh;  /* ours, mapped by them: they produce */
  /* Our private views of both (ring.h): the capacity and our consumer
   * position never come from the shared memory. */
  hixl_ring_t outbox, inbox;
  /* The kernel refused CMA towards this peer (or HIXL_SHM_CMA=0): its
   * non-mapped regions are reached through the owner's copies. */
  _Atomic bool cma_refused;
  shm_stage_out_t out;
  shm_stage_in_t in;
  /* On the context's watch list (sc->watch, under sc->wlock): sleepers
   * wait on inbox_sh->bell.  rang_seen: its rang_ns when we last sampled. */
  struct shm_peer *wnext, *wprev;
  int64_t rang_seen;
} shm_peer_t;

/* Per context (ctx->tp[HIXL_TP_SHM]): settings read at hixl_ctx_create and
 * the helper threads that split large CMA transfers (started lazily, at
 * the first transfer of split_min bytes or more). */
#define SHM_CMA_MAX_THREADS 16
/* Sleepers watch each bound peer's inbox word while there are at most this
 * many peers (futex_waitv's cost grows with its words; wait.c's MAX_WORDS
 * leaves one more for the context's own). */
#ifndef SHM_WAIT_WORDS
#define SHM_WAIT_WORDS 8
#endif
#define SHM_MAX_UIDS 64 /* in HIXL_SHM_ALLOW_UIDS */
struct shm_cma_job;
typedef struct shm_ctx {
  bool cma_off;       /* HIXL_SHM_CMA=0 */
  int cma_threads;    /* HIXL_SHM_CMA_THREADS: threads per large transfer, the caller too */
  size_t split_min;   /* HIXL_SHM_CMA_SPLIT_MIN */
  size_t stage_bytes; /* HIXL_SHM_STAGE_BYTES: data area of a staging we lend */
  shm_tag_t *tags;    /* our tag table (mapped read-write before sealing) */
  int tags_fd;        /* a read-only open of it: what peers get */
  shm_bell_t *bell;   /* our doorbell page (after the tags) */
  int bell_r, bell_w; /* our doorbell pipe: we alone hold the read end */
  /* HIXL_SHM_ALLOW_UIDS: the uids of peers we bind with besides our own
   * (effective) uid and root's; any: every uid. */
  bool uid_any;
  int n_uids;
  uint32_t uids[SHM_MAX_UIDS];
  /* Bound peers whose inboxes sleepers may watch with futex_waitv (at
   * most SHM_WAIT_WORDS of them: past that they sleep on the pipe). */
  pthread_mutex_t wlock;
  shm_peer_t *watch;
  int n_watch;
  pthread_mutex_t lock;
  pthread_cond_t work, idle;
  struct shm_cma_job *queue; /* jobs helpers may join */
  _Atomic int njobs;         /* in the queue: what spinning helpers watch */
  int sleepers;              /* helpers waiting on work */
  int started;               /* helper threads running */
  bool no_helpers;           /* none could be started */
  bool stopping;
  _Atomic bool stop_flag; /* stopping, for spinning helpers */
  pthread_t threads[SHM_CMA_MAX_THREADS];
} shm_ctx_t;

/* cma.c */
hixl_status_t hixl__shm_ctx_init(hixl_ctx_t *ctx);
void hixl__shm_ctx_fini(hixl_ctx_t *ctx);
/* shm.c: our tag table (at context set-up; NO_DEVICE when it cannot be
 * handed out read-only) and its release.  The target side of the binding's
 * credential check is hixl__shm_bind_cred (core/provider.h). */
hixl_status_t hixl__shm_table_init(hixl_ctx_t *ctx, shm_ctx_t *sc);
void hixl__shm_table_fini(hixl_ctx_t *ctx, shm_ctx_t *sc);
/* Wake peer's threads (they sleep, or wait for room; see shm_bell): v is
 * the word of its page that says how many sleep, and how (HIXL_SLEEP_*). */
void hixl__shm_bell_send(shm_peer_t *sp, uint32_t v);
static inline void hixl__shm_ring_if_sleeping(shm_peer_t *sp)
{
  atomic_thread_fence(memory_order_seq_cst); /* our store first: pairs with its announce */
  uint32_t v = atomic_load_explicit(&sp->bell->sleepers, memory_order_relaxed);
  if (hixl_unlikely(v != 0))
    hixl__shm_bell_send(sp, v);
}
/* Move cnt paired elements (l[i].iov_len == r[i].iov_len, total bytes in
 * all) to or from the peer's memory with process_vm_writev/readv, split
 * across the context's helper threads from split_min bytes up.  Returns 0,
 * or the errno that stopped it (EPERM / ENOSYS: the kernel refuses; the
 * caller falls back).  l and r may be modified. */
int hixl__shm_cma(hixl_peer_t *peer, bool write, struct iovec *l, struct iovec *r, size_t cnt,
                  size_t total);

/* stage.c, initiator side: copies through the owner.  A session holds the
 * peer's staging for one operation or one batch: add pieces, then end
 * (which waits for all of them and reports the first failure). */
typedef struct shm_stage_sess {
  hixl_peer_t *peer;
  shm_stage_out_t *so;
  uint64_t first; /* the first SHM_COPY number of this session */
  hixl_status_t st;
  int64_t deadline;
} shm_stage_sess_t;
hixl_status_t hixl__shm_stage_begin(hixl_peer_t *peer, shm_stage_sess_t *s);
hixl_status_t hixl__shm_stage_add(shm_stage_sess_t *s, bool put, void *local, const hixl_rmr_t *r,
                                  uint64_t off, size_t len);
hixl_status_t hixl__shm_stage_end(shm_stage_sess_t *s);
void hixl__shm_stage_free(shm_peer_t *sp);

/* shm target side of SHM_BIND, first: who is at the other end of the unix
 * socket sock it came on (SO_PEERCRED, from the kernel), never what its
 * HELLO said.  Sets peer->remote_pid (where CMA goes, whom device IPC is
 * exported to) to that process's; AUTH (with the detail, logged) when its
 * uid is neither ours, nor root, nor one HIXL_SHM_ALLOW_UIDS allows. */
hixl_status_t hixl__shm_bind_cred(hixl_peer_t *peer, int sock);
/* shm target side: map the initiator's segments (fds), create ours.  The
 * fds are consumed on success only (the caller closes them otherwise). */
hixl_status_t hixl__shm_accept(hixl_peer_t *peer, const int *fds, int nfds, int *out_fds,
                               int *n_out);
/* shm owner side when the kernel refuses CMA (src/shm/stage.c; control
 * thread, ctx->lock held): lend a peer a staging area (SHM_STAGE_REQ), and
 * perform one of its copies (SHM_COPY; drops ctx->lock while copying). */
void hixl__shm_stage_serve(hixl_peer_t *peer, const struct hixl_msg *m, struct hixl_msg *out,
                           int *out_fds, int *n_out);
void hixl__shm_copy_serve(hixl_peer_t *peer, const struct hixl_msg *m, struct hixl_msg *out,
                          int *out_fds, int *n_out);

#endif

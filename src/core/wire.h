/* SPDX-License-Identifier: MIT */
/*
 * The control protocol: length-prefixed, versioned messages on one stream
 * socket per peer.  Every message is a 24-byte header followed by a payload
 * whose fields are fixed by its type (a schema, below).  Parsing is strict:
 * wrong magic or version, unknown type, a length over HIXL_WIRE_MAX, a short
 * field, a string with a NUL or over its limit, or trailing bytes reject the
 * whole message.  All integers are little-endian on the wire.
 *
 * This file is pure (no sockets, no context) so that it is unit-tested and
 * fuzzed on its own (tests/unit/test_wire.c, tests/fuzz/fuzz_wire.c).
 */
#ifndef HIXL_WIRE_H
#define HIXL_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HIXL_WIRE_MAGIC 0x4c584948u /* "HIXL" */
/* The wire version, which both ends must share.  2: the QP count in the
 * verbs bind; REGION_GONE_ACK.  3: DEV_IPC, the fabric bind.  4: shm's
 * staging messages, HEARTBEAT's probe flag.  5: HELLO / AUTH_CHALLENGE /
 * AUTH (the token never travels).  6: the shm bind passes a third fd (the
 * doorbell).  7: TP_MR / TP_MR_REPLY.  8: transports' binds and own
 * messages are TP_BIND / TP_BIND_REPLY and TP_REQ / TP_REPLY (each
 * transport reads its fields through its own view).  9: shm's sleeper
 * words count futex-word sleepers in their high half, woken through the
 * word in the ring they sleep on rather than the doorbell pipe.  10: STATS /
 * STATS_REPLY (hixl_peer_remote_stats); HEARTBEAT's u64[0], the stamp a
 * probe carries and its answer echoes (the round trip in the stats).  11:
 * verbs binds may be lazy (TP_BIND u64[4]) and its QP_REQ / QP_ACCEPT /
 * QP_READY (TP_REQ) make the QPs on first use (src/verbs/lazy.c).  12:
 * verbs' QP_WAIT / QP_QUIESCE / QP_RELEASED (TP_REQ) take an idle pair's
 * QPs back under the QP budget. */
#define HIXL_WIRE_VERSION 12
#define HIXL_WIRE_HDR 24
#define HIXL_WIRE_MAX 4096 /* payload bytes; every message is far smaller */
#define HIXL_WIRE_STR 256  /* string field capacity, NUL included */
#define HIXL_WIRE_BLOB 128 /* byte field capacity */

enum hixl_msg_type {
  HIXL_MSG_HELLO = 1,       /* initiator -> target over TCP: its nonce (auth.h) */
  HIXL_MSG_HELLO_ACK,       /* status, chosen transport, target identity */
  HIXL_MSG_LOOKUP,          /* name */
  HIXL_MSG_LOOKUP_REPLY,    /* status, rkey blob */
  HIXL_MSG_FD_REQ,          /* slot, rkey: give me the memfd of a region */
  HIXL_MSG_FD_REPLY,        /* status (+ 1 fd) */
  HIXL_MSG_ATOMIC,          /* slot, rkey, off, op, a, b */
  HIXL_MSG_ATOMIC_REPLY,    /* status, old */
  HIXL_MSG_HEARTBEAT,       /* u32[0] bit 0: a probe, answer at once (bit 1: an answer,
                               echoing the probe's u64[0]) */
  HIXL_MSG_BYE,             /* empty: orderly disconnect */
  HIXL_MSG_WORLD_BARRIER,   /* world id, epoch */
  HIXL_MSG_WORLD_XCHG,      /* world id, epoch, blob */
  HIXL_MSG_TP_BIND,         /* initiator -> target: the chosen transport's bind */
  HIXL_MSG_TP_BIND_REPLY,   /* status, the target's side of it */
  HIXL_MSG_TP_MR,           /* a whole blob: the region's transport key please */
  HIXL_MSG_TP_MR_REPLY,     /* status, the key (two words, the transport's) */
  HIXL_MSG_REGION_GONE,     /* u32[0] slot, u64[0] rkey: the owner deregistered it */
  HIXL_MSG_REGION_GONE_ACK, /* status: the peer has marked it gone */
  HIXL_MSG_DEV_IPC_REQ,     /* slot, rkey: the device IPC handle of a region please */
  HIXL_MSG_DEV_IPC_REPLY,   /* status, handle (+ 1 fd for backends whose handle is one) */
  HIXL_MSG_TP_REQ,          /* a transport's own request (u32[2]: its kind) */
  HIXL_MSG_TP_REPLY,        /* status, the answer to one (u32[2]: its kind) */
  HIXL_MSG_AUTH_CHALLENGE,  /* target -> initiator: its nonce and proof (auth.h) */
  HIXL_MSG_AUTH,            /* initiator -> target: its identity and proof */
  HIXL_MSG_STATS,           /* u32[0]: the first figure wanted (hixl_peer_remote_stats) */
  HIXL_MSG_STATS_REPLY,     /* status, first, total, n; names in str[], values in blob */
  HIXL_MSG_TYPE_MAX
};

/* A decoded message.  Fields a type does not use are zero. */
/* A view of the integer fields for one message type: the three 32-bit and
 * five 64-bit words by name (p<i> / q<i>: not used by that type).  Every
 * view has the layout of the codec's u32[3] / u64[5]. */
#define HIXL_MSG_VIEW(a0, a1, a2, b0, b1, b2, b3, b4)                                              \
  struct {                                                                                         \
    uint32_t a0, a1, a2;                                                                           \
    uint64_t b0, b1, b2, b3, b4;                                                                   \
  }

typedef struct hixl_msg {
  uint16_t type;
  uint16_t nfds; /* fds passed along (unix sockets only) */
  uint64_t seq;  /* calls: chosen by the caller, echoed by the reply */
  int32_t status;
  /* The integer fields: the codec moves u32[] / u64[] by schema (wire.c);
   * everything else reads and writes them through the view named after
   * the message's type (the table below says what each carries). */
  union {
    struct {
      uint32_t u32[3];
      uint64_t u64[5];
    };
    HIXL_MSG_VIEW(tp_bits, pid, p2, ctx_id, tag, q2, q3, q4) auth;
    HIXL_MSG_VIEW(tp_id, pid, p2, ctx_id, cookie, q2, q3, q4) hello_ack;
    /* TP_BIND on the unix socket (a transport with bind_unix) */
    HIXL_MSG_VIEW(p0, p1, p2, cookie, ctx_id, q2, q3, q4) unix_bind;
    /* TP_REQ, TP_REPLY: which of the transport's own messages it is */
    HIXL_MSG_VIEW(p0, p1, kind, q0, q1, q2, q3, q4) tp_req;
    /* FD_REQ, DEV_IPC_REQ, REGION_GONE: a region by slot and rkey */
    HIXL_MSG_VIEW(slot, p1, p2, rkey, q1, q2, q3, q4) region;
    HIXL_MSG_VIEW(p0, p1, p2, offset, q1, q2, q3, q4) fd_reply;
    HIXL_MSG_VIEW(slot, op, p2, rkey, off, a, b, q4) atomic;
    HIXL_MSG_VIEW(p0, p1, p2, old, q1, q2, q3, q4) atomic_reply;
    HIXL_MSG_VIEW(flags, p1, p2, q0, q1, q2, q3, q4) heartbeat;
    HIXL_MSG_VIEW(p0, p1, p2, world, epoch, q2, q3, q4) world; /* WORLD_BARRIER, WORLD_XCHG */
    HIXL_MSG_VIEW(slot, access, flags, rkey, base, len, q3, q4) tp_mr;
    HIXL_MSG_VIEW(p0, p1, p2, key0, key1, q2, q3, q4) tp_mr_reply;
    HIXL_MSG_VIEW(device, p1, p2, offset, alloc_len, q2, q3, q4) dev_ipc_reply;
    HIXL_MSG_VIEW(first, total, n, q0, q1, q2, q3, q4) stats; /* STATS, STATS_REPLY */
  };
  uint8_t host_id[32];
  char str[2][HIXL_WIRE_STR];
  uint8_t blob[HIXL_WIRE_BLOB];
  uint32_t blob_len;
} hixl_msg_t;

/* A transport's own view of m's integer words (T: a HIXL_MSG_VIEW type of
 * the transport's, for its TP_BIND / TP_REQ fields). */
#define HIXL_MSG_AS(T, m) ((T *)(void *)(m)->u32)
#define HIXL_MSG_AS_CONST(T, m) ((const T *)(const void *)(m)->u32)

/* Field meaning per type (see wire.c for the schema; the views above name
 * the integer fields):
 * HELLO:       blob = the initiator's 32-byte nonce (nothing else before the target
 *              has proved it knows the token: src/core/auth.h)
 * AUTH_CHALLENGE: blob = the target's nonce (32) then its proof (32)
 * AUTH:        u32[0] transports it can use (bits), u64[0] ctx_id, host_id, u32[1] pid,
 *              u64[1] tag, str[0] transports (preference), blob = its proof (32, over
 *              these fields too)
 * HELLO_ACK:   status, u32[0] transport id, u64[0] ctx_id, host_id,
 *              u32[1] pid, u64[1] cookie, str[0] unix name, str[1] message (the answer
 *              to AUTH; a refusal carries no identity, only status and message)
 * TP_BIND:     u32[0..2], u64[0..4], str[0], blob: the chosen transport's bind,
 *              its fields in its own view (verbs: verbs_int.h; fabric:
 *              fabric_int.h); on the unix socket (shm: +3 fds: table, inbox,
 *              doorbell) u64[0] is the cookie HELLO_ACK gave, u64[1] the ctx id
 * TP_BIND_REPLY: status and the same fields (shm: +3 fds)
 * LOOKUP:      str[0] name
 * LOOKUP_REPLY: status, blob
 * FD_REQ:      u32[0] slot, u64[0] rkey
 * FD_REPLY:    status, u64[0] offset of the region in the memfd (+1 fd)
 * ATOMIC:      u32[0] slot, u32[1] op, u64[0] rkey, u64[1] off, u64[2] a, u64[3] b
 * ATOMIC_REPLY: status, u64[0] old
 * WORLD_BARRIER: u64[0] world id, u64[1] epoch
 * WORLD_XCHG:  u64[0] world id, u64[1] epoch, blob
 * TP_MR:       u32[0] slot, u32[1] access, u32[2] flags, u64[0] rkey, u64[1] base,
 *              u64[2] len (all checked by the owner; asked by peers of transports
 *              with remote keys: the ops table's mr_key)
 * TP_MR_REPLY: status, u64[0], u64[1] the region's key on the peer's transport, opaque
 *              to the core (verbs: u64[0] the ibv rkey; fabric: u64[0] the key, u64[1]
 *              the remote address of byte 0: its virtual address with FI_MR_VIRT_ADDR,
 *              else 0)
 * DEV_IPC_REQ: u32[0] slot, u64[0] rkey
 * DEV_IPC_REPLY: status, u32[0] device, u64[0] offset of the region in what the
 *              handle maps, u64[1] bytes it maps, blob = the runtime's handle
 *              (+1 fd: the emulated backend's memfd)
 * TP_REQ:      u32[2] the transport's kind (its msgs table), the other fields its own
 *              (shm's staging: src/shm/shm_int.h)
 * TP_REPLY:    status, u32[2] the kind, the other fields its own (+ the fds its
 *              table allows)
 */

/* Encode m into buf (capacity cap).  Returns bytes written or 0 if it does
 * not fit or m->type is unknown. */
size_t hixl_wire_encode(const hixl_msg_t *m, uint8_t *buf, size_t cap);

enum { HIXL_WIRE_OK = 0, HIXL_WIRE_SHORT = 1, HIXL_WIRE_BAD = -1 };
/* Look at the first n bytes of a stream.  SHORT: need more bytes (*need_p
 * says how many in all); BAD: reject; OK: a whole message of *need_p bytes is
 * there. */
int hixl_wire_frame(const uint8_t *buf, size_t n, size_t *need_p);
/* Decode exactly one whole message (as framed above).  Returns OK or BAD. */
int hixl_wire_decode(const uint8_t *buf, size_t n, hixl_msg_t *m);
const char *hixl_wire_type_name(unsigned type);

#endif

/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include "wire.h"

#include <stddef.h>
#include <string.h>

/* Every view of the integer fields (wire.h) overlays u32[] / u64[]. */
_Static_assert(offsetof(hixl_msg_t, atomic.slot) == offsetof(hixl_msg_t, u32[0]), "views: u32");
_Static_assert(offsetof(hixl_msg_t, atomic.rkey) == offsetof(hixl_msg_t, u64[0]), "views: u64");
_Static_assert(offsetof(hixl_msg_t, tp_req.q4) == offsetof(hixl_msg_t, u64[4]), "views: end");
_Static_assert(sizeof(((hixl_msg_t *)0)->atomic) ==
                   offsetof(hixl_msg_t, u64[4]) + 8 - offsetof(hixl_msg_t, u32[0]),
               "views: size");

/* Field kinds of the schema. */
enum {
  F_END = 0,
  F_STATUS,
  F_U32_0,
  F_U32_1,
  F_U32_2,
  F_U64_0,
  F_U64_1,
  F_U64_2,
  F_U64_3,
  F_U64_4,
  F_HOST,
  F_STR0,
  F_STR1,
  F_BLOB
};

static const uint8_t schema[HIXL_MSG_TYPE_MAX][12] = {
    [HIXL_MSG_HELLO] = {F_BLOB},
    [HIXL_MSG_HELLO_ACK] = {F_STATUS, F_U32_0, F_U64_0, F_HOST, F_U32_1, F_U64_1, F_STR0, F_STR1},
    [HIXL_MSG_LOOKUP] = {F_STR0},
    [HIXL_MSG_LOOKUP_REPLY] = {F_STATUS, F_BLOB},
    [HIXL_MSG_FD_REQ] = {F_U32_0, F_U64_0},
    [HIXL_MSG_FD_REPLY] = {F_STATUS, F_U64_0},
    [HIXL_MSG_ATOMIC] = {F_U32_0, F_U32_1, F_U64_0, F_U64_1, F_U64_2, F_U64_3},
    [HIXL_MSG_ATOMIC_REPLY] = {F_STATUS, F_U64_0},
    [HIXL_MSG_HEARTBEAT] = {F_U32_0, F_U64_0},
    [HIXL_MSG_BYE] = {F_END},
    [HIXL_MSG_WORLD_BARRIER] = {F_U64_0, F_U64_1},
    [HIXL_MSG_WORLD_XCHG] = {F_U64_0, F_U64_1, F_BLOB},
    /* A transport's messages carry every field; the transport reads its own. */
    [HIXL_MSG_TP_BIND] = {F_U32_0, F_U32_1, F_U32_2, F_U64_0, F_U64_1, F_U64_2, F_U64_3, F_U64_4,
                          F_STR0, F_BLOB},
    [HIXL_MSG_TP_BIND_REPLY] = {F_STATUS, F_U32_0, F_U32_1, F_U32_2, F_U64_0, F_U64_1, F_U64_2,
                                F_U64_3, F_U64_4, F_STR0, F_BLOB},
    [HIXL_MSG_TP_REQ] = {F_U32_0, F_U32_1, F_U32_2, F_U64_0, F_U64_1, F_U64_2, F_U64_3, F_U64_4,
                         F_STR0, F_BLOB},
    [HIXL_MSG_TP_REPLY] = {F_STATUS, F_U32_0, F_U32_1, F_U32_2, F_U64_0, F_U64_1, F_U64_2, F_U64_3,
                           F_U64_4, F_STR0, F_BLOB},
    [HIXL_MSG_TP_MR] = {F_U32_0, F_U32_1, F_U32_2, F_U64_0, F_U64_1, F_U64_2},
    [HIXL_MSG_TP_MR_REPLY] = {F_STATUS, F_U64_0, F_U64_1},
    [HIXL_MSG_REGION_GONE] = {F_U32_0, F_U64_0},
    [HIXL_MSG_REGION_GONE_ACK] = {F_STATUS},
    [HIXL_MSG_DEV_IPC_REQ] = {F_U32_0, F_U64_0},
    [HIXL_MSG_DEV_IPC_REPLY] = {F_STATUS, F_U32_0, F_U64_0, F_U64_1, F_BLOB},
    [HIXL_MSG_AUTH_CHALLENGE] = {F_BLOB},
    [HIXL_MSG_AUTH] = {F_U32_0, F_U64_0, F_HOST, F_U32_1, F_U64_1, F_STR0, F_BLOB},
    [HIXL_MSG_STATS] = {F_U32_0},
    [HIXL_MSG_STATS_REPLY] = {F_STATUS, F_U32_0, F_U32_1, F_U32_2, F_STR0, F_STR1, F_BLOB},
};

static const char *const type_names[HIXL_MSG_TYPE_MAX] = {
    [HIXL_MSG_HELLO] = "HELLO",
    [HIXL_MSG_HELLO_ACK] = "HELLO_ACK",
    [HIXL_MSG_LOOKUP] = "LOOKUP",
    [HIXL_MSG_LOOKUP_REPLY] = "LOOKUP_REPLY",
    [HIXL_MSG_FD_REQ] = "FD_REQ",
    [HIXL_MSG_FD_REPLY] = "FD_REPLY",
    [HIXL_MSG_ATOMIC] = "ATOMIC",
    [HIXL_MSG_ATOMIC_REPLY] = "ATOMIC_REPLY",
    [HIXL_MSG_HEARTBEAT] = "HEARTBEAT",
    [HIXL_MSG_BYE] = "BYE",
    [HIXL_MSG_WORLD_BARRIER] = "WORLD_BARRIER",
    [HIXL_MSG_WORLD_XCHG] = "WORLD_XCHG",
    [HIXL_MSG_TP_BIND] = "TP_BIND",
    [HIXL_MSG_TP_BIND_REPLY] = "TP_BIND_REPLY",
    [HIXL_MSG_TP_REQ] = "TP_REQ",
    [HIXL_MSG_TP_REPLY] = "TP_REPLY",
    [HIXL_MSG_TP_MR] = "TP_MR",
    [HIXL_MSG_TP_MR_REPLY] = "TP_MR_REPLY",
    [HIXL_MSG_REGION_GONE] = "REGION_GONE",
    [HIXL_MSG_REGION_GONE_ACK] = "REGION_GONE_ACK",
    [HIXL_MSG_DEV_IPC_REQ] = "DEV_IPC_REQ",
    [HIXL_MSG_DEV_IPC_REPLY] = "DEV_IPC_REPLY",
    [HIXL_MSG_AUTH_CHALLENGE] = "AUTH_CHALLENGE",
    [HIXL_MSG_AUTH] = "AUTH",
    [HIXL_MSG_STATS] = "STATS",
    [HIXL_MSG_STATS_REPLY] = "STATS_REPLY",
};

const char *hixl_wire_type_name(unsigned type)
{
  if (type == 0 || type >= HIXL_MSG_TYPE_MAX)
    return "UNKNOWN";
  return type_names[type];
}

static void put16(uint8_t *p, uint16_t v)
{
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p)
{
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}
static uint64_t get64(const uint8_t *p)
{
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

/* Field width on the wire, for fixed-size kinds; strings and blobs are a
 * 2-byte length plus bytes. */
static size_t fixed_width(uint8_t f)
{
  switch (f) {
  case F_STATUS:
  case F_U32_0:
  case F_U32_1:
  case F_U32_2: return 4;
  case F_U64_0:
  case F_U64_1:
  case F_U64_2:
  case F_U64_3:
  case F_U64_4: return 8;
  case F_HOST: return 32;
  default: return 0;
  }
}

size_t hixl_wire_encode(const hixl_msg_t *m, uint8_t *buf, size_t cap)
{
  if (m->type == 0 || m->type >= HIXL_MSG_TYPE_MAX || cap < HIXL_WIRE_HDR)
    return 0;
  size_t pos = HIXL_WIRE_HDR;
  for (const uint8_t *f = schema[m->type]; *f != F_END; f++) {
    size_t w = fixed_width(*f);
    const uint8_t *bytes = NULL;
    size_t blen = 0;
    if (*f == F_STR0 || *f == F_STR1) {
      bytes = (const uint8_t *)m->str[*f - F_STR0];
      blen = strnlen(m->str[*f - F_STR0], HIXL_WIRE_STR);
      if (blen >= HIXL_WIRE_STR)
        return 0;
      w = 2 + blen;
    } else if (*f == F_BLOB) {
      bytes = m->blob;
      blen = m->blob_len;
      if (blen > HIXL_WIRE_BLOB)
        return 0;
      w = 2 + blen;
    }
    if (pos + w > cap || pos + w - HIXL_WIRE_HDR > HIXL_WIRE_MAX)
      return 0;
    uint8_t *p = buf + pos;
    switch (*f) {
    case F_STATUS: put32(p, (uint32_t)m->status); break;
    case F_U32_0:
    case F_U32_1:
    case F_U32_2: put32(p, m->u32[*f - F_U32_0]); break;
    case F_U64_0:
    case F_U64_1:
    case F_U64_2:
    case F_U64_3:
    case F_U64_4: put64(p, m->u64[*f - F_U64_0]); break;
    case F_HOST: memcpy(p, m->host_id, 32); break;
    default:
      put16(p, (uint16_t)blen);
      if (blen)
        memcpy(p + 2, bytes, blen);
      break;
    }
    pos += w;
  }
  put32(buf, HIXL_WIRE_MAGIC);
  put16(buf + 4, HIXL_WIRE_VERSION);
  put16(buf + 6, m->type);
  put32(buf + 8, (uint32_t)(pos - HIXL_WIRE_HDR));
  put32(buf + 12, m->nfds);
  put64(buf + 16, m->seq);
  return pos;
}

int hixl_wire_frame(const uint8_t *buf, size_t n, size_t *need_p)
{
  /* Reject garbage as early as its first bytes allow, so a confused or
   * hostile peer is dropped without buffering anything. */
  static const uint8_t magic[4] = {'H', 'I', 'X', 'L'};
  for (size_t i = 0; i < n && i < 4; i++)
    if (buf[i] != magic[i])
      return HIXL_WIRE_BAD;
  if (n < HIXL_WIRE_HDR) {
    *need_p = HIXL_WIRE_HDR;
    return HIXL_WIRE_SHORT;
  }
  if (get16(buf + 4) != HIXL_WIRE_VERSION)
    return HIXL_WIRE_BAD;
  uint16_t type = get16(buf + 6);
  uint32_t len = get32(buf + 8);
  if (type == 0 || type >= HIXL_MSG_TYPE_MAX || len > HIXL_WIRE_MAX || get32(buf + 12) > 4)
    return HIXL_WIRE_BAD;
  *need_p = HIXL_WIRE_HDR + (size_t)len;
  return n < *need_p ? HIXL_WIRE_SHORT : HIXL_WIRE_OK;
}

int hixl_wire_decode(const uint8_t *buf, size_t n, hixl_msg_t *m)
{
  size_t need;
  if (hixl_wire_frame(buf, n, &need) != HIXL_WIRE_OK || need != n)
    return HIXL_WIRE_BAD;
  memset(m, 0, sizeof(*m));
  m->type = get16(buf + 6);
  m->nfds = (uint16_t)get32(buf + 12);
  m->seq = get64(buf + 16);
  size_t pos = HIXL_WIRE_HDR;
  for (const uint8_t *f = schema[m->type]; *f != F_END; f++) {
    size_t w = fixed_width(*f);
    if (w) {
      if (n - pos < w)
        return HIXL_WIRE_BAD;
      const uint8_t *p = buf + pos;
      switch (*f) {
      case F_STATUS: m->status = (int32_t)get32(p); break;
      case F_U32_0:
      case F_U32_1:
      case F_U32_2: m->u32[*f - F_U32_0] = get32(p); break;
      case F_HOST: memcpy(m->host_id, p, 32); break;
      default: m->u64[*f - F_U64_0] = get64(p); break;
      }
      pos += w;
      continue;
    }
    if (n - pos < 2)
      return HIXL_WIRE_BAD;
    size_t blen = get16(buf + pos);
    pos += 2;
    if (n - pos < blen)
      return HIXL_WIRE_BAD;
    if (*f == F_BLOB) {
      if (blen > HIXL_WIRE_BLOB)
        return HIXL_WIRE_BAD;
      memcpy(m->blob, buf + pos, blen);
      m->blob_len = (uint32_t)blen;
    } else {
      if (blen >= HIXL_WIRE_STR || memchr(buf + pos, 0, blen) != NULL)
        return HIXL_WIRE_BAD;
      char *s = m->str[*f - F_STR0];
      memcpy(s, buf + pos, blen);
      s[blen] = 0;
    }
    pos += blen;
  }
  return pos == n ? HIXL_WIRE_OK : HIXL_WIRE_BAD;
}

/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include "rkey.h"

#include <string.h>

static void put(uint8_t *p, uint64_t v, int n)
{
  for (int i = 0; i < n; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get(const uint8_t *p, int n)
{
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}
/* FNV-1a 64: enough to catch accidental damage. */
static uint64_t sum(const uint8_t *p, size_t n)
{
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

void hixl_rkey_encode(const hixl_rkey_info_t *k, uint8_t out[HIXL_RKEY_BLOB_LEN])
{
  memset(out, 0, HIXL_RKEY_BLOB_LEN);
  put(out, HIXL_RKEY_MAGIC, 4);
  out[4] = HIXL_RKEY_VERSION;
  out[5] = (uint8_t)k->flags;
  put(out + 8, k->slot, 4);
  put(out + 12, k->access, 4);
  put(out + 16, k->ctx_id, 8);
  put(out + 24, k->rkey, 8);
  put(out + 32, k->base, 8);
  put(out + 40, k->len, 8);
  put(out + 48, sum(out, 48), 8);
}

int hixl_rkey_decode(const void *buf, size_t len, hixl_rkey_info_t *k)
{
  const uint8_t *p = buf;
  if (buf == NULL || len != HIXL_RKEY_BLOB_LEN)
    return -1;
  if (get(p, 4) != HIXL_RKEY_MAGIC || p[4] != HIXL_RKEY_VERSION || get(p + 6, 2) != 0 ||
      (p[5] & ~3u) != 0 || get(p + 48, 8) != sum(p, 48))
    return -1;
  hixl_rkey_info_t v = {
      .flags = p[5],
      .slot = (uint32_t)get(p + 8, 4),
      .access = (uint32_t)get(p + 12, 4),
      .ctx_id = get(p + 16, 8),
      .rkey = get(p + 24, 8),
      .base = get(p + 32, 8),
      .len = get(p + 40, 8),
  };
  if ((v.access & ~7u) != 0 || v.rkey == 0 || v.len == 0 || v.base + v.len < v.base)
    return -1;
  *k = v;
  return 0;
}

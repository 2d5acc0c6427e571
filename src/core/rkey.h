/* SPDX-License-Identifier: MIT */
/*
 * The remote-key blob that hixl_mr_pack writes and hixl_rmr_unpack reads:
 * 56 bytes, little-endian, position independent:
 *
 *   0  u32 magic "HXRK"   4 u8 version   5 u8 flags (HIXL_REGF_*)
 *   6  u16 reserved (0)   8 u32 slot    12 u32 access
 *  16  u64 owner ctx id  24 u64 rkey    32 u64 base   40 u64 len
 *  48  u64 checksum of bytes 0..47 (catches truncation and corruption, not
 *      forgery: forgery is caught by checking rkey with the owner)
 *
 * Pure code: unit-tested and fuzzed.
 */
#ifndef HIXL_RKEY_H
#define HIXL_RKEY_H

#include <stddef.h>
#include <stdint.h>

#define HIXL_RKEY_BLOB_LEN 56
#define HIXL_RKEY_MAGIC 0x4b525848u /* "HXRK" */
#define HIXL_RKEY_VERSION 1

typedef struct hixl_rkey_info {
  uint64_t ctx_id, rkey, base, len;
  uint32_t slot, access, flags;
} hixl_rkey_info_t;

void hixl_rkey_encode(const hixl_rkey_info_t *k, uint8_t out[HIXL_RKEY_BLOB_LEN]);
/* 0 on success, -1 if malformed (size, magic, version, reserved bits,
 * unknown flags or access bits, checksum, zero rkey/len, base+len wraps). */
int hixl_rkey_decode(const void *buf, size_t len, hixl_rkey_info_t *k);

#endif

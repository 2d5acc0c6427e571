/* SPDX-License-Identifier: MIT */
/* libFuzzer target for rkey blobs (hixl_rmr_unpack's parser): no crash, and
 * an accepted blob re-encodes to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rkey.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  hixl_rkey_info_t k;
  if (hixl_rkey_decode(data, size, &k) != 0)
    return 0;
  uint8_t again[HIXL_RKEY_BLOB_LEN];
  hixl_rkey_encode(&k, again);
  if (memcmp(again, data, sizeof(again)) != 0)
    abort();
  return 0;
}

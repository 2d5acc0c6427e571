/* SPDX-License-Identifier: MIT */
/* libFuzzer target for the control protocol parser: every byte a peer can
 * send goes through hixl_wire_frame / hixl_wire_decode.  Invariants: no
 * crash, and whatever decodes re-encodes to the very same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  size_t need = 0;
  int r = hixl_wire_frame(data, size, &need);
  if (r != HIXL_WIRE_OK)
    return 0;
  hixl_msg_t m;
  if (hixl_wire_decode(data, need, &m) != HIXL_WIRE_OK)
    return 0;
  uint8_t again[HIXL_WIRE_HDR + HIXL_WIRE_MAX];
  size_t n = hixl_wire_encode(&m, again, sizeof(again));
  if (n != need || memcmp(again, data, n) != 0)
    abort();
  return 0;
}

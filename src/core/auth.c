/* SPDX-License-Identifier: MIT */
/* Challenge-response for the control connection: see auth.h. */
#define _GNU_SOURCE
#include "auth.h"

#include <errno.h>
#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

void hixl__auth_nonce(uint8_t out[HIXL_AUTH_NONCE])
{
  size_t got = 0;
  while (got < HIXL_AUTH_NONCE) {
    ssize_t n = getrandom(out + got, HIXL_AUTH_NONCE - got, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      abort(); /* 32 bytes from an initialised pool cannot fail; never go on with a guessable nonce
                */
    got += (size_t)n;
  }
}

void hixl__auth_proof(const char *token, const char *label, const uint8_t *nonce_i,
                      const uint8_t *nonce_t, const void *extra, size_t extra_len,
                      uint8_t out[HIXL_AUTH_PROOF])
{
  struct hmac_sha256_ctx h;
  const char *key = token ? token : "";
  hmac_sha256_set_key(&h, strlen(key), (const uint8_t *)key);
  /* The label with its NUL: no label is a prefix of another's input. */
  hmac_sha256_update(&h, strlen(label) + 1, (const uint8_t *)label);
  hmac_sha256_update(&h, HIXL_AUTH_NONCE, nonce_i);
  hmac_sha256_update(&h, HIXL_AUTH_NONCE, nonce_t);
  if (extra_len)
    hmac_sha256_update(&h, extra_len, extra);
  hmac_sha256_digest(&h, HIXL_AUTH_PROOF, out);
  memset(&h, 0, sizeof(h));
}

bool hixl__auth_equal(const uint8_t *a, const uint8_t *b)
{
  return memeql_sec(a, b, HIXL_AUTH_PROOF) != 0;
}

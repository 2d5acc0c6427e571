/* SPDX-License-Identifier: MIT */
/*
 * Mutual authentication of the control connection (handshake.c) without the
 * token ever crossing the wire: a challenge-response over two fresh nonces
 * with HMAC-SHA256 keyed by the token (nettle, Debian's vetted
 * implementation; no hand-written crypto).
 *
 *   initiator -> target  HELLO       nonce_i (32 random bytes), nothing else
 *   target -> initiator  CHALLENGE   nonce_t, proof_t = HMAC(token, "hixl target" |
 *                                    nonce_i | nonce_t)
 *   initiator            checks proof_t: a target that does not know the token
 *                        learns nothing of ours and gets nothing more
 *   initiator -> target  AUTH        its identity (ctx id, pid, host id, tag,
 *                                    transports) and proof_i = HMAC(token,
 *                                    "hixl initiator" | nonce_i | nonce_t | identity)
 *   target               checks proof_i; only then answers HELLO_ACK with its
 *                        own identity (a refused one carries none)
 *
 * Both nonces are fresh per connection, so a recorded exchange replays
 * nowhere, and the two labels keep one side's proof from serving as the
 * other's (reflection).  What it does not stop: an active man in the middle
 * that relays a whole handshake between a real initiator and a real target
 * (there is no channel binding without TLS); docs/security.md says so.
 * No token configured = the empty key, same exchange: anyone may connect.
 */
#ifndef HIXL_AUTH_H
#define HIXL_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HIXL_AUTH_NONCE 32
#define HIXL_AUTH_PROOF 32 /* HMAC-SHA256 */

/* Fresh random bytes (getrandom). */
void hixl__auth_nonce(uint8_t out[HIXL_AUTH_NONCE]);
/* HMAC-SHA256(token, label | nonce_i | nonce_t | extra). token NULL = "". */
void hixl__auth_proof(const char *token, const char *label, const uint8_t *nonce_i,
                      const uint8_t *nonce_t, const void *extra, size_t extra_len,
                      uint8_t out[HIXL_AUTH_PROOF]);
/* Constant-time comparison of two proofs. */
bool hixl__auth_equal(const uint8_t *a, const uint8_t *b);

#define HIXL_AUTH_LABEL_TARGET "hixl target v1"
#define HIXL_AUTH_LABEL_INITIATOR "hixl initiator v1"

#endif

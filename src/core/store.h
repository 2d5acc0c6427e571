/* SPDX-License-Identifier: MIT */
/*
 * A small, strict client of torch.distributed's TCPStore wire protocol: the
 * key-value store torchrun's agent serves at MASTER_ADDR:MASTER_PORT, through
 * which torch's own process groups bootstrap.  Only what the world
 * rendezvous needs: set, get, add, wait (and check, to name what is missing
 * after a timeout).
 *
 * Every byte from the store is untrusted: replies are bounded (a value
 * longer than the caller's buffer is an error, never an allocation), every
 * read and write has a deadline, and any surprise (a wrong reply byte, data
 * nobody asked for, a closed connection) is an error whose message names
 * the store's address.  After an error or a timeout the connection is
 * dropped (the stream can no longer be trusted to be in step); the next
 * call connects again.
 *
 * Keys are sent as torch's TCPStore client sends them: with a leading "/"
 * (its keyPrefix_), so hixl__store_set(s, "a/b", ...) is what Python's
 * TCPStore.get("a/b") reads.
 */
#ifndef HIXL_STORE_H
#define HIXL_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl.h"

typedef struct hixl_store hixl_store_t;

/* Protocol dialects (docs/configuration.md#under-torchrun):
 *   LEGACY:   torch 1.x and early 2.x: no handshake, SET=0 GET=2 ADD=3
 *             CHECK=4 WAIT=5 GETNUMKEYS=6 (run here against torch 1.13);
 *   VALIDATE: later 2.x (both the classic and the libuv server): the first
 *             query is VALIDATE=0 with the 32-bit magic 0x3C85F7CE, then
 *             SET=1 GET=3 ADD=4 CHECK=5 WAIT=6 GETNUMKEYS=7;
 *   AUTO:     find out with a probe that no server of either kind can
 *             misread (hixl__store_connect). */
enum { HIXL_STORE_AUTO = 0, HIXL_STORE_LEGACY = 1, HIXL_STORE_VALIDATE = 2 };

#define HIXL_STORE_KEY_MAX 1024 /* bytes of a key, without torch's "/" */

/* Parse "auto" / "legacy" / "validate" (NULL or "": auto); -1 otherwise. */
int hixl__store_dialect_parse(const char *s);
const char *hixl__store_dialect_name(int dialect);

/* Connect to the store at host:port (retrying a refused connect until the
 * deadline: the server may not be up yet) and settle the dialect.
 * Errors: INVALID (unresolvable host, bad dialect), TIMEOUT, PEER_LOST,
 * TRANSPORT (not a TCPStore), NOMEM. */
hixl_status_t hixl__store_connect(const char *host, const char *port, int dialect, int64_t deadline,
                                  hixl_store_t **store_p);
void hixl__store_close(hixl_store_t *s);
/* "host:port", for messages. */
const char *hixl__store_name(const hixl_store_t *s);
int hixl__store_dialect(const hixl_store_t *s);

hixl_status_t hixl__store_set(hixl_store_t *s, const char *key, const void *val, size_t len,
                              int64_t deadline);
/* Add delta to the integer at key (absent: 0); *value_p gets the new value. */
hixl_status_t hixl__store_add(hixl_store_t *s, const char *key, int64_t delta, int64_t *value_p,
                              int64_t deadline);
/* Return once every key exists; TIMEOUT at the deadline. */
hixl_status_t hixl__store_wait(hixl_store_t *s, const char *const *keys, size_t n,
                               int64_t deadline);
/* *ready_p: whether every key exists now. */
hixl_status_t hixl__store_check(hixl_store_t *s, const char *const *keys, size_t n, bool *ready_p,
                                int64_t deadline);
/* Wait for key, then read its value into buf (at most cap bytes: a longer
 * value is a TRANSPORT error, and nothing of it is kept); *len_p its length. */
hixl_status_t hixl__store_get(hixl_store_t *s, const char *key, void *buf, size_t cap,
                              size_t *len_p, int64_t deadline);

#endif

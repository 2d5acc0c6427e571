/* SPDX-License-Identifier: MIT */
/*
 * Optional TLS on the TCP control connections (HIXL_TLS=1), with GnuTLS
 * from Debian: TLS 1.3 with an external pre-shared key, the auth token (so
 * no certificates to deploy; both ends prove the key, and everything on the
 * control connection -- region names, keys, cookies, fabric endpoint names
 * -- is encrypted and integrity-protected).  What it does not cover: RDMA
 * and libfabric data, and the unix socket of shm (same host, the kernel's).
 * See docs/security.md.
 *
 * Sessions are driven by the control plane (handshake.c, call.c, ctl.c) on
 * non-blocking sockets: one thread receives (the control thread) while
 * another sends under the peer's send_lock, which GnuTLS allows.  A send
 * that returned "again" is retried with the same bytes (the queue head),
 * as GnuTLS requires.
 */
#ifndef HIXL_TLS_H
#define HIXL_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "core.h"

/* Reads HIXL_TLS; sets ctx->tls.  UNSUPPORTED when asked for in a build
 * without GnuTLS, INVALID without a token (the token is the key). */
hixl_status_t hixl__tls_init(hixl_ctx_t *ctx);
void hixl__tls_fini(hixl_ctx_t *ctx);
/* A session on fd; NULL (and hixl_last_error set) on failure. */
void *hixl__tls_session(hixl_ctx_t *ctx, int fd, bool server);
void hixl__tls_free(void *s);
/* 1: handshake done, 0: call again when the socket is readable/writable,
 * < 0: failed (hixl_last_error says why). */
int hixl__tls_handshake(void *s, const char *who);
/* Bytes sent (a whole record: all of len), 0: again (retry with the same
 * bytes), < 0: -errno-like failure. */
ssize_t hixl__tls_send(void *s, const void *buf, size_t len);
/* Bytes received, 0: closed, -EAGAIN: nothing now, other < 0: a GnuTLS
 * error code (hixl__tls_strerror). */
ssize_t hixl__tls_recv(void *s, void *buf, size_t len);
/* The last call that returned "again" was waiting to write (else to read). */
bool hixl__tls_wants_write(void *s);
/* The last failure of a session call, for messages. */
const char *hixl__tls_strerror(ssize_t rc);

#endif

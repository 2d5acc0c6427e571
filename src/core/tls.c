/* SPDX-License-Identifier: MIT */
/* Optional TLS-PSK on the TCP control connections: see tls.h. */
#define _GNU_SOURCE
#include "tls.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#ifdef HIXL_HAVE_TLS
#include <gnutls/gnutls.h>

/* TLS 1.3 only, key exchange with the PSK plus (EC)DHE for forward secrecy. */
/* Two cheap groups only: a peer holding the token must not be able to make
 * the control thread compute an FFDHE-8192 exchange (~200 ms each). */
#define PRIORITY                                                                                   \
  "NORMAL:-VERS-ALL:+VERS-TLS1.3:-KX-ALL:+ECDHE-PSK:-GROUP-ALL:+GROUP-X25519:+GROUP-SECP256R1"
#define PSK_USER "hixl"

typedef struct tls_ctx {
  gnutls_psk_server_credentials_t srv;
  gnutls_psk_client_credentials_t cli;
  gnutls_priority_t prio;
  char *key;
} tls_ctx_t;

static int server_key(gnutls_session_t s, const char *user, gnutls_datum_t *key)
{
  const tls_ctx_t *t = gnutls_session_get_ptr(s);
  (void)user; /* one key for everyone: the token */
  size_t n = strlen(t->key);
  key->data = gnutls_malloc(n);
  if (key->data == NULL)
    return -1;
  memcpy(key->data, t->key, n);
  key->size = (unsigned)n;
  return 0;
}

hixl_status_t hixl__tls_init(hixl_ctx_t *ctx)
{
  const char *e = getenv("HIXL_TLS");
  long on = 0;
  if (e && hixl__parse_int(e, 0, 1, &on) != 0)
    return hixl__err(HIXL_ERR_INVALID, "HIXL_TLS=\"%s\": expected 0 or 1", e);
  if (!on)
    return HIXL_OK;
  const char *tok = ctx->cfg.auth_token;
  if (tok == NULL || tok[0] == 0)
    return hixl__err(HIXL_ERR_INVALID, "HIXL_TLS=1 needs an auth token: it is TLS's pre-shared "
                                       "key (HIXL_AUTH_TOKEN)");
  tls_ctx_t *t = calloc(1, sizeof(*t));
  if (t == NULL || (t->key = strdup(tok)) == NULL) {
    free(t);
    return hixl__err(HIXL_ERR_NOMEM, "no memory for TLS");
  }
  gnutls_datum_t k = {(unsigned char *)t->key, (unsigned)strlen(t->key)};
  int rc;
  if ((rc = gnutls_psk_allocate_server_credentials(&t->srv)) < 0 ||
      (rc = gnutls_psk_allocate_client_credentials(&t->cli)) < 0 ||
      (rc = gnutls_psk_set_client_credentials(t->cli, PSK_USER, &k, GNUTLS_PSK_KEY_RAW)) < 0 ||
      (rc = gnutls_priority_init(&t->prio, PRIORITY, NULL)) < 0) {
    ctx->tls = t;
    hixl__tls_fini(ctx);
    return hixl__err(HIXL_ERR_TRANSPORT, "TLS setup failed: %s", gnutls_strerror(rc));
  }
  gnutls_psk_set_server_credentials_function(t->srv, server_key);
  ctx->tls = t;
  return HIXL_OK;
}

void hixl__tls_fini(hixl_ctx_t *ctx)
{
  tls_ctx_t *t = ctx->tls;
  if (t == NULL)
    return;
  if (t->srv)
    gnutls_psk_free_server_credentials(t->srv);
  if (t->cli)
    gnutls_psk_free_client_credentials(t->cli);
  if (t->prio)
    gnutls_priority_deinit(t->prio);
  if (t->key) {
    memset(t->key, 0, strlen(t->key));
    free(t->key);
  }
  free(t);
  ctx->tls = NULL;
}

void *hixl__tls_session(hixl_ctx_t *ctx, int fd, bool server)
{
  tls_ctx_t *t = ctx->tls;
  gnutls_session_t s;
  /* No session tickets: nothing is sent after the handshake but records. */
  int rc = gnutls_init(&s, (server ? GNUTLS_SERVER : GNUTLS_CLIENT) | GNUTLS_NONBLOCK |
                               GNUTLS_NO_TICKETS);
  if (rc < 0) {
    hixl__err(HIXL_ERR_NOMEM, "TLS session: %s", gnutls_strerror(rc));
    return NULL;
  }
  gnutls_session_set_ptr(s, t);
  if ((rc = gnutls_priority_set(s, t->prio)) < 0 ||
      (rc = gnutls_credentials_set(s, GNUTLS_CRD_PSK, server ? (void *)t->srv : (void *)t->cli)) <
          0) {
    gnutls_deinit(s);
    hixl__err(HIXL_ERR_TRANSPORT, "TLS session: %s", gnutls_strerror(rc));
    return NULL;
  }
  gnutls_transport_set_int(s, fd);
  return s;
}

void hixl__tls_free(void *s)
{
  if (s)
    gnutls_deinit(s);
}

int hixl__tls_handshake(void *s, const char *who)
{
  int rc = gnutls_handshake(s);
  if (rc == GNUTLS_E_SUCCESS)
    return 1;
  if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED)
    return 0;
  hixl__err(HIXL_ERR_AUTH,
            "%s: TLS handshake failed: %s (both sides need HIXL_TLS=1 and the same token)", who,
            gnutls_strerror(rc));
  return -1;
}

ssize_t hixl__tls_send(void *s, const void *buf, size_t len)
{
  for (;;) {
    ssize_t n = gnutls_record_send(s, buf, len);
    if (n >= 0)
      return n;
    if (n == GNUTLS_E_INTERRUPTED)
      continue;
    if (n == GNUTLS_E_AGAIN)
      return 0;
    return n;
  }
}

ssize_t hixl__tls_recv(void *s, void *buf, size_t len)
{
  for (;;) {
    ssize_t n = gnutls_record_recv(s, buf, len);
    if (n >= 0)
      return n;
    if (n == GNUTLS_E_INTERRUPTED)
      continue;
    if (n == GNUTLS_E_AGAIN)
      return -EAGAIN;
    if (n == GNUTLS_E_PREMATURE_TERMINATION)
      return 0; /* closed without close_notify: hixl peers just close */
    return n;   /* a GnuTLS code, for hixl__tls_strerror */
  }
}

bool hixl__tls_wants_write(void *s) { return gnutls_record_get_direction(s) == 1; }

const char *hixl__tls_strerror(ssize_t rc)
{
  return rc == -EAGAIN ? "again" : gnutls_strerror((int)rc);
}

#else /* no GnuTLS in this build */

hixl_status_t hixl__tls_init(hixl_ctx_t *ctx)
{
  const char *e = getenv("HIXL_TLS");
  if (e && strcmp(e, "0") != 0)
    return hixl__err(HIXL_ERR_UNSUPPORTED,
                     "HIXL_TLS=%s: this build has no TLS (GnuTLS was not "
                     "found at build time: libgnutls28-dev)",
                     e);
  ctx->tls = NULL;
  return HIXL_OK;
}
void hixl__tls_fini(hixl_ctx_t *ctx) { (void)ctx; }
void *hixl__tls_session(hixl_ctx_t *ctx, int fd, bool server)
{
  (void)ctx, (void)fd, (void)server;
  return NULL;
}
void hixl__tls_free(void *s) { (void)s; }
int hixl__tls_handshake(void *s, const char *who)
{
  (void)s, (void)who;
  return -1;
}
ssize_t hixl__tls_send(void *s, const void *buf, size_t len)
{
  (void)s, (void)buf, (void)len;
  return -EPROTO;
}
ssize_t hixl__tls_recv(void *s, void *buf, size_t len)
{
  (void)s, (void)buf, (void)len;
  return -EPROTO;
}
bool hixl__tls_wants_write(void *s)
{
  (void)s;
  return false;
}
const char *hixl__tls_strerror(ssize_t rc)
{
  (void)rc;
  return "no TLS in this build";
}
#endif

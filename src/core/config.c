/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

void hixl_config_init(hixl_config_t *cfg)
{
  if (cfg == NULL)
    return;
  memset(cfg, 0, sizeof(*cfg));
  cfg->timeout_ms = 10000;
  cfg->listen = getenv("HIXL_LISTEN");
  cfg->transports = getenv("HIXL_TRANSPORTS");
  cfg->net_dev = getenv("HIXL_NET_DEV");
  cfg->auth_token = getenv("HIXL_AUTH_TOKEN");
  cfg->metrics = getenv("HIXL_METRICS");
  long v;
  const char *e = getenv("HIXL_PROGRESS_THREAD");
  if (e && hixl__parse_int(e, 0, 2, &v) == 0)
    cfg->progress_thread = (int)v;
  else if (e)
    hixl_warn("ignoring HIXL_PROGRESS_THREAD=%s (want 0, 1 or 2)", e);
  e = getenv("HIXL_WAIT");
  if (e && strcmp(e, "adaptive") == 0)
    cfg->wait = HIXL_WAIT_ADAPTIVE;
  else if (e && strcmp(e, "spin") == 0)
    cfg->wait = HIXL_WAIT_SPIN;
  else if (e && strcmp(e, "sleep") == 0)
    cfg->wait = HIXL_WAIT_SLEEP;
  else if (e)
    hixl_warn("ignoring HIXL_WAIT=%s (want adaptive, spin or sleep)", e);
  e = getenv("HIXL_TIMEOUT_MS");
  if (e && hixl__parse_int(e, 1, 24L * 3600 * 1000, &v) == 0)
    cfg->timeout_ms = (int)v;
  else if (e)
    hixl_warn("ignoring HIXL_TIMEOUT_MS=%s (want 1..86400000)", e);
}

int hixl__parse_int(const char *s, long lo, long hi, long *out)
{
  if (s == NULL || *s == 0)
    return -1;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end != 0 || v < lo || v > hi)
    return -1;
  *out = v;
  return 0;
}

hixl_status_t hixl__parse_uids(const char *s, uint32_t *uids, int cap, int *n_p, bool *any_p)
{
  int n = 0;
  if (s != NULL && strcmp(s, "any") == 0) {
    *n_p = 0;
    *any_p = true;
    return HIXL_OK;
  }
  for (const char *p = s; p != NULL && *p != 0;) {
    char *end;
    errno = 0;
    unsigned long v = *p >= '0' && *p <= '9' ? strtoul(p, &end, 10) : 0;
    if (*p < '0' || *p > '9' || errno || v >= UINT32_MAX || (*end != 0 && *end != ','))
      return hixl__err(HIXL_ERR_INVALID, "\"%s\": want \"any\" or uids separated by commas", s);
    if (n == cap)
      return hixl__err(HIXL_ERR_INVALID, "\"%s\": more than %d uids", s, cap);
    uids[n++] = (uint32_t)v;
    p = *end == ',' ? end + 1 : end;
    if (*end == ',' && *p == 0)
      return hixl__err(HIXL_ERR_INVALID, "\"%s\": a trailing comma", s);
  }
  *n_p = n;
  *any_p = false;
  return HIXL_OK;
}

hixl_status_t hixl__parse_transports(const char *s, uint8_t *order, int *n_p, uint32_t *mask_p)
{
  uint32_t mask = 0;
  int n = 0;
  if (s == NULL || *s == 0 || strcmp(s, "all") == 0) {
    for (int i = 0; i < HIXL_TP_MAX; i++) {
      if (hixl__tp_names[i] == NULL)
        continue;
      order[n++] = (uint8_t)i;
      mask |= 1u << i;
    }
    *n_p = n;
    *mask_p = mask;
    return HIXL_OK;
  }
  const char *p = s;
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    int id = -1;
    for (int i = 0; i < HIXL_TP_MAX; i++)
      if (hixl__tp_names[i] && strlen(hixl__tp_names[i]) == len &&
          strncmp(p, hixl__tp_names[i], len) == 0)
        id = i;
    if (id < 0) {
      char known[64];
      return hixl__err(HIXL_ERR_INVALID, "unknown transport '%.*s' in \"%s\" (known: %s)",
                       (int)(len > 32 ? 32 : len), p, s,
                       hixl__tp_join(known, sizeof(known), NULL, 0, ~0u));
    }
    if (!(mask & (1u << id))) {
      order[n++] = (uint8_t)id;
      mask |= 1u << id;
    }
    p += len;
    if (*p == ',')
      p++;
  }
  *n_p = n;
  *mask_p = mask;
  return HIXL_OK;
}

hixl_status_t hixl__parse_hostport(const char *s, char *host, size_t host_cap, char *port,
                                   size_t port_cap)
{
  if (s == NULL || *s == 0)
    return hixl__err(HIXL_ERR_INVALID, "empty address (want host:port)");
  const char *colon;
  const char *h = s;
  size_t hlen;
  if (*s == '[') {
    const char *rb = strchr(s, ']');
    if (rb == NULL || rb[1] != ':')
      return hixl__err(HIXL_ERR_INVALID, "bad address \"%s\" (want [v6addr]:port)", s);
    h = s + 1;
    hlen = (size_t)(rb - h);
    colon = rb + 1;
  } else {
    colon = strrchr(s, ':');
    if (colon == NULL)
      return hixl__err(HIXL_ERR_INVALID, "bad address \"%s\" (want host:port)", s);
    hlen = (size_t)(colon - s);
    if (memchr(s, ':', hlen) != NULL)
      return hixl__err(HIXL_ERR_INVALID, "bad address \"%s\" (put IPv6 in brackets)", s);
  }
  const char *pt = colon + 1;
  long pv;
  if (hixl__parse_int(pt, 0, 65535, &pv) != 0)
    return hixl__err(HIXL_ERR_INVALID, "bad port in address \"%s\"", s);
  if (hlen + 1 > host_cap || strlen(pt) + 1 > port_cap)
    return hixl__err(HIXL_ERR_INVALID, "address \"%s\" too long", s);
  memcpy(host, h, hlen);
  host[hlen] = 0;
  strcpy(port, pt);
  return HIXL_OK;
}

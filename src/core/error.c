/* SPDX-License-Identifier: MIT */
/* One error convention: hixl_status_t plus a per-thread detailed message. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

static _Thread_local char last_error[HIXL_ERR_MAX];

const char *hixl_strerror(hixl_status_t st)
{
  switch (st) {
  case HIXL_OK: return "HIXL_OK: success";
  case HIXL_INPROGRESS: return "HIXL_INPROGRESS: operation in progress";
  case HIXL_ERR_INVALID: return "HIXL_ERR_INVALID: invalid argument";
  case HIXL_ERR_NOMEM: return "HIXL_ERR_NOMEM: out of memory or resources";
  case HIXL_ERR_NOT_REGISTERED: return "HIXL_ERR_NOT_REGISTERED: range not in a registered region";
  case HIXL_ERR_ACCESS: return "HIXL_ERR_ACCESS: region does not grant this access";
  case HIXL_ERR_UNSUPPORTED: return "HIXL_ERR_UNSUPPORTED: not supported";
  case HIXL_ERR_TIMEOUT: return "HIXL_ERR_TIMEOUT: timed out";
  case HIXL_ERR_PEER_LOST: return "HIXL_ERR_PEER_LOST: peer lost";
  case HIXL_ERR_TRANSPORT: return "HIXL_ERR_TRANSPORT: transport error";
  case HIXL_ERR_AUTH: return "HIXL_ERR_AUTH: authentication failed";
  case HIXL_ERR_AGAIN: return "HIXL_ERR_AGAIN: resource temporarily unavailable";
  case HIXL_ERR_NO_DEVICE: return "HIXL_ERR_NO_DEVICE: no such device";
  }
  return "HIXL_ERR_?: unknown status";
}

const char *hixl_last_error(void) { return last_error; }

hixl_status_t hixl__err(hixl_status_t st, const char *fmt, ...)
{
  /* Formatted apart first: an argument may be hixl_last_error() itself
   * (a caller that puts its context before the error it got). */
  char buf[HIXL_ERR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  memcpy(last_error, buf, strlen(buf) + 1);
  hixl_debug("%s: %s", hixl_strerror(st), last_error);
  return st;
}

/* SPDX-License-Identifier: MIT */
/* Pure parsers of user-supplied strings (unit-tested). */
#ifndef HIXL_CONFIG_H
#define HIXL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl.h"

/* "shm,verbs" -> order[] of HIXL_TP_* ids (no duplicates) and a bit mask.
 * NULL or "" or "all": every transport in default order.  INVALID on an
 * unknown name (the detail names it). */
hixl_status_t hixl__parse_transports(const char *s, uint8_t *order, int *n_p, uint32_t *mask_p);
/* Split "host:port", "[v6]:port" or ":port" into host and port strings.
 * host "" means any address.  INVALID when malformed. */
hixl_status_t hixl__parse_hostport(const char *s, char *host, size_t host_cap, char *port,
                                   size_t port_cap);
/* Parse a decimal int in [lo, hi]; -1 on error. */
int hixl__parse_int(const char *s, long lo, long hi, long *out);
/* HIXL_SHM_ALLOW_UIDS: "any" (*any_p true), or a comma-separated list of
 * decimal uids (at most cap, into uids[], *n_p of them).  NULL or "": none.
 * INVALID when malformed (the detail says why); outputs set on success. */
hixl_status_t hixl__parse_uids(const char *s, uint32_t *uids, int cap, int *n_p, bool *any_p);

#endif

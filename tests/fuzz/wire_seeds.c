/* SPDX-License-Identifier: MIT */
/* The wire fuzzer's seed corpus (tests/fuzz/seeds_wire): one valid message
 * of every type, made with the codec itself.
 *
 *   wire_seeds write DIR   write DIR/<type>.bin for every message type
 *   wire_seeds check DIR   every DIR/<type>.bin decodes at this wire version
 *                          and every type has one (unit/wire-seeds)
 *
 * Seeds of an older wire version are rejected at the header, so the fuzzer
 * would never get past it; the check makes a version bump regenerate them
 * (docs/testing.md). */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

/* A message of type t with every field set (the codec keeps those its
 * schema has and zeroes the rest, so decode gives back what it encodes). */
static size_t make(unsigned t, uint8_t *buf, size_t cap)
{
  hixl_msg_t m;
  memset(&m, 0, sizeof(m));
  m.type = (uint16_t)t;
  m.seq = 7;
  m.status = -3;
  for (int i = 0; i < 3; i++)
    m.u32[i] = 11u + (uint32_t)i;
  for (int i = 0; i < 5; i++)
    m.u64[i] = 0x1000u + (uint64_t)i;
  for (int i = 0; i < 32; i++)
    m.host_id[i] = (uint8_t)i;
  snprintf(m.str[0], sizeof(m.str[0]), "shm,verbs");
  snprintf(m.str[1], sizeof(m.str[1]), "seed");
  m.blob_len = 64;
  for (uint32_t i = 0; i < m.blob_len; i++)
    m.blob[i] = (uint8_t)(i * 7);
  hixl_msg_t d;
  size_t n = hixl_wire_encode(&m, buf, cap);
  if (n == 0 || hixl_wire_decode(buf, n, &d) != HIXL_WIRE_OK)
    return 0;
  return hixl_wire_encode(&d, buf, cap); /* the canonical form */
}

static void file_name(char *out, size_t cap, const char *dir, unsigned t)
{
  char name[64];
  snprintf(name, sizeof(name), "%s", hixl_wire_type_name(t));
  for (char *c = name; *c; c++)
    *c = (char)tolower((unsigned char)*c);
  snprintf(out, cap, "%s/%s.bin", dir, name);
}

int main(int argc, char **argv)
{
  if (argc != 3 || (strcmp(argv[1], "write") != 0 && strcmp(argv[1], "check") != 0)) {
    fprintf(stderr, "usage: %s write|check DIR\n", argv[0]);
    return 2;
  }
  bool write = strcmp(argv[1], "write") == 0;
  int bad = 0;
  for (unsigned t = 1; t < HIXL_MSG_TYPE_MAX; t++) {
    char path[4096];
    file_name(path, sizeof(path), argv[2], t);
    uint8_t buf[HIXL_WIRE_HDR + HIXL_WIRE_MAX];
    if (write) {
      size_t n = make(t, buf, sizeof(buf));
      FILE *f = n ? fopen(path, "wb") : NULL;
      if (f == NULL || fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "wire_seeds: %s: %s\n", path, n ? strerror(errno) : "cannot encode");
        return 1;
      }
      continue;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
      fprintf(stderr, "wire_seeds: no seed for %s (%s): run `wire_seeds write %s`\n",
              hixl_wire_type_name(t), path, argv[2]);
      bad++;
      continue;
    }
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    size_t need = 0;
    hixl_msg_t m;
    if (hixl_wire_frame(buf, n, &need) != HIXL_WIRE_OK || need != n ||
        hixl_wire_decode(buf, n, &m) != HIXL_WIRE_OK || m.type != t) {
      fprintf(stderr,
              "wire_seeds: %s does not decode as %s at wire version %d: run `wire_seeds write "
              "%s`\n",
              path, hixl_wire_type_name(t), HIXL_WIRE_VERSION, argv[2]);
      bad++;
    }
  }
  if (!write && bad == 0)
    printf("wire_seeds: %d seeds, all wire version %d\n", HIXL_MSG_TYPE_MAX - 1, HIXL_WIRE_VERSION);
  return bad ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/* The fabric attacker (fabric_attacker.c): its own libfabric endpoint. */
#ifndef HIXL_FABRIC_ATTACKER_H
#define HIXL_FABRIC_ATTACKER_H
#include <stdint.h>

/* A hixl notification message as the wire has it (src/fabric/fabric_int.h). */
typedef struct attacker_msg {
  uint32_t magic, imm;
  uint64_t len, sender, cookie;
} attacker_msg_t;
#define ATTACKER_MSG_MAGIC 0x4e4c5848u
#define ATTACKER_IMM_BASE 0xbad00000u

int attacker_main(int argc, char **argv);
#endif

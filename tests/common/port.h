/* SPDX-License-Identifier: MIT */
/* A free loopback TCP port for a rendezvous a test starts after picking it
 * (a world's rank 0, a metrics endpoint): picked at random below the
 * kernel's ephemeral range, so that no listener or connection -- of this
 * test, whose contexts take ephemeral ports, or of another test running
 * beside it (docs/testing.md) -- takes it between this check and the bind
 * that follows, and seeded by the pid and the time, so that tests started
 * at once pick different ones. */
#ifndef HIXL_TEST_PORT_H
#define HIXL_TEST_PORT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* The port, or -1 if none of 1000 tries could be bound. */
static inline int test_free_port(void)
{
  int lo = 32768;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d", &lo) != 1)
      lo = 32768;
    fclose(f);
  }
  if (lo <= 11000)
    lo = 32768; /* an unusual range: take ports from below the default one */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  /* Our own generator: the test's use of rand() stays its own. */
  uint64_t x = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec;
  for (int tries = 0; tries < 1000; tries++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    int port = 10000 + (int)(x % (uint64_t)(lo - 10000));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    if (fd >= 0)
      close(fd);
    if (ok)
      return port;
  }
  return -1;
}

#endif

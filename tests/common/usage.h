/* SPDX-License-Identifier: MIT */
/* What a process spent: CPU (user + system, every thread) and wall time,
 * in microseconds.  Tests that prove a waiter sleeps compare the two. */
#ifndef HIXL_TEST_USAGE_H
#define HIXL_TEST_USAGE_H

#include <sys/resource.h>
#include <time.h>

static inline long long cpu_us(void)
{
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000LL + r.ru_utime.tv_usec +
         r.ru_stime.tv_usec;
}

static inline long long wall_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

#endif

/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_util.h: the small helpers every benchmark in bench/ needs
 * (clock, sleep, sorting, counting /proc entries), in one place.  Header
 * only, so that each program still builds by hand from its one .c file.
 */
#ifndef HIXL_BENCH_UTIL_H
#define HIXL_BENCH_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in ns: the same clock in every process of the machine. */
static inline int64_t now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void sleep_ms(int ms)
{
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
  while (nanosleep(&t, &t) != 0 && errno == EINTR)
    ;
}

/* qsort comparator for int64_t. */
static inline int cmp_i64(const void *a, const void *b)
{
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* Entries of a directory, not counting . and .. (and hidden ones); -1 if
 * it cannot be opened.  /proc/PID/fd, /proc/PID/task. */
static inline int count_dir(const char *path)
{
  DIR *d = opendir(path);
  if (!d)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

#endif

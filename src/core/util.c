/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hixl_int.h"

int64_t hixl__now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Deadlines use the coarse clock (same timeline, one scheduler tick of
 * resolution): it is read from the vDSO page without touching hardware,
 * while CLOCK_MONOTONIC costs a system call and an emulated device read
 * wherever the clock source is not the TSC (virtual machines: hpet here).
 * Timeouts are milliseconds; a tick more or less does not matter. */
static int64_t coarse_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t hixl__deadline(int timeout_ms)
{
  if (timeout_ms < 0)
    return INT64_MAX;
  return coarse_ns() + (int64_t)timeout_ms * 1000000;
}

bool hixl__expired(int64_t deadline_ns)
{
  return deadline_ns != INT64_MAX && coarse_ns() >= deadline_ns;
}

bool hixl__wait_expired(int64_t deadline_ns, unsigned iter)
{
  /* While spinning, read the clock one round in 32 only (even the coarse
   * clock is a few dozen instructions); once the loop yields or sleeps,
   * every round. */
  if (deadline_ns == INT64_MAX || (iter < 1024 && iter % 32 != 0))
    return false;
  return coarse_ns() >= deadline_ns;
}

void hixl__backoff(unsigned *iter)
{
  unsigned i = (*iter)++;
  /* First poll flat out (the caller's poll is the loop body: a completion
   * that lands within microseconds is seen at once, as perftest sees it),
   * then pause, then yield (a busy poll that lets other threads run) for a
   * few thousand rounds, then sleep.  A wait of some tens of microseconds
   * must not fall into the sleep: its granularity (~50-100 us with timer
   * slack) would dominate the latency.  (Under emulation PAUSE leaves the
   * translated code each time; measured on Soft-RoCE/TCG: atomics' p50 went
   * from 1.18x to 1.03x of ib_atomic_lat without it in the first rounds.) */
  if (i < 256) {
    __asm__ volatile("" ::: "memory");
  } else if (i < 1024) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#endif
  } else if (i < 8192) {
    sched_yield();
  } else {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}

uint64_t hixl__random64(void)
{
  uint64_t v = 0;
  while (v == 0) {
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
      /* getrandom cannot fail for 8 bytes once the pool is initialised;
       * fall back to time and address entropy rather than abort. */
      v ^= (uint64_t)hixl__now_ns() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)&v;
    }
  }
  return v;
}

/* Same host = same kernel boot and same network namespace: processes in two
 * namespaces are treated as two hosts (they cannot reach each other's
 * abstract unix sockets anyway). */
hixl_status_t hixl__host_id(uint8_t out[32])
{
  memset(out, 0, 32);
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[64] = {0};
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n > 0)
      memcpy(out, buf, n > 24 ? 24 : (size_t)n);
  }
  struct stat st;
  if (stat("/proc/self/ns/net", &st) == 0) {
    uint64_t ino = (uint64_t)st.st_ino;
    memcpy(out + 24, &ino, 8);
  }
  return HIXL_OK;
}

int hixl__memfd(const char *name, size_t len)
{
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0)
    return -1;
  if (ftruncate(fd, (off_t)len) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/*
 * Data mover: every put and get goes through here, so that a better copy
 * (non-temporal stores for very large transfers, see shared/BASELINES.md)
 * can be put in one place once it is measured to win.  A first attempt at
 * avoiding glibc's slow path for (dst - src) % 64 in {8, 16} measured 0.5x of
 * memcpy on this machine (the slow path did not show), so it is plain
 * memcpy until a benchmark says otherwise.
 */
void hixl__copy(void *dst, const void *src, size_t len) { memcpy(dst, src, len); }

/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/capability.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "core.h"

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

int64_t hixl__now_coarse_ns(void) { return coarse_ns(); }

long hixl__env_int(const char *name, long lo, long hi, long def)
{
  const char *e = getenv(name);
  long v;
  if (e == NULL)
    return def;
  if (hixl__parse_int(e, lo, hi, &v) == 0)
    return v;
  hixl_warn("ignoring %s=%s (want %ld..%ld)", name, e, lo, hi);
  return def;
}

int hixl__thread_start(pthread_t *t, const char *name, void *(*fn)(void *), void *arg)
{
  static const int faults[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS};
  sigset_t block, old;
  sigfillset(&block);
  for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++)
    sigdelset(&block, faults[i]);
  /* The new thread inherits the creator's mask: set it around the create. */
  pthread_sigmask(SIG_SETMASK, &block, &old);
  int rc = pthread_create(t, NULL, fn, arg);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc == 0)
    (void)pthread_setname_np(*t, name); /* a name is a convenience */
  return rc;
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
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return -1;
  /* Sealed at its size before anyone else sees it: a process we lend it to
   * cannot truncate it under our mappings or its other borrowers' (SIGBUS),
   * nor add seals of its own.  Peers refuse unsealed ones.
   * Mode 0400: a memfd's inode is created 0777, so a peer we hand a
   * read-only open of it (a READ-only region) could open it again
   * read-write through /proc/self/fd/N.  Its mode now refuses that to a
   * peer of another uid; one of our uid can chmod it back and root ignores
   * modes (docs/transports.md: such peers can reach our memory anyway).
   * Our own read-only reopens only need the read bit. */
  if (ftruncate(fd, (off_t)len) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
      fchmod(fd, 0400) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

bool hixl__fd_sealed(int fd, uint64_t need)
{
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) == (F_SEAL_SHRINK | F_SEAL_SEAL) &&
         fstat(fd, &st) == 0 && st.st_size >= 0 && (uint64_t)st.st_size >= need;
}

/*
 * Data mover: every put and get of shm and self goes through here.
 *
 * From hixl__stream_min bytes up (half the cache CPU 0 shares) to glibc's
 * own streaming threshold it copies with non-temporal stores: glibc keeps
 * ordinary stores up to 3/4 of the cache size cpuid reports, which on VMs
 * and large packages is far more than the cache the CPU really shares, and
 * such a copy evicts everything and writes every line back.  Below that the
 * destination is better left in cache for its reader.  The measurements and
 * the variants that lost: docs/performance.md#large-copies-streaming-stores.
 */
#if defined(__x86_64__)
#include <emmintrin.h>

size_t hixl__stream_min = SIZE_MAX;
/* From here up glibc's memcpy streams by itself (from 3/4 of the cache size
 * it believes in: 48 MiB here, measured between 48 and 64 MiB), with a
 * 4-page loop that beats ours by a few percent (0.94-1.0 measured at 64 MiB):
 * leave those sizes to it. */
static size_t stream_max = SIZE_MAX;

/* The largest cache CPU 0 sees, from sysfs: the slice it really shares.
 * sysconf(_SC_LEVEL3_CACHE_SIZE) reports the whole package here (64 MiB,
 * where the VM's CPUs share 8 MiB and memcpy falls off from 4 MiB). */
static size_t last_level_cache(void)
{
  size_t best = 0;
  for (int i = 0; i < 8; i++) {
    char path[96], buf[32] = "";
    snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    FILE *f = fopen(path, "re");
    if (f == NULL)
      break;
    if (fgets(buf, sizeof(buf), f)) {
      char *end;
      unsigned long v = strtoul(buf, &end, 10);
      v <<= *end == 'K' ? 10 : *end == 'M' ? 20 : 0;
      best = v > best ? v : best;
    }
    fclose(f);
  }
  return best;
}

void hixl__copy_init(void)
{
  const char *e = getenv("HIXL_COPY_STREAM_MIN");
  long v;
  if (e && hixl__parse_int(e, 0, LONG_MAX, &v) == 0) {
    hixl__stream_min = v ? (size_t)v : SIZE_MAX; /* 0: never */
    stream_max = SIZE_MAX;
    return;
  }
  size_t llc = last_level_cache();
  hixl__stream_min = llc ? llc / 2 : (size_t)4 << 20;
  if (hixl__stream_min < ((size_t)1 << 20))
    hixl__stream_min = (size_t)1 << 20;
  long glibc_l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (glibc_l3 > 0 && (size_t)glibc_l3 / 4 * 3 > hixl__stream_min)
    stream_max = (size_t)glibc_l3 / 4 * 3;
}

/* Non-temporal stores; the caller fences (hixl__copy_fence) before the data
 * may be reported complete. */
static void copy_stream(uint8_t *d, const uint8_t *s, size_t len)
{
  size_t head = (16 - ((uintptr_t)d & 15)) & 15; /* to a 16-byte aligned d */
  if (head > len)
    head = len;
  memcpy(d, s, head);
  d += head, s += head, len -= head;
  for (size_t n = len / 64; n; n--, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
    _mm_stream_si128((__m128i *)(void *)d, a);
    _mm_stream_si128((__m128i *)(void *)(d + 16), b);
    _mm_stream_si128((__m128i *)(void *)(d + 32), c);
    _mm_stream_si128((__m128i *)(void *)(d + 48), e);
  }
  memcpy(d, s, len % 64);
}

void hixl__copy_stream(void *dst, const void *src, size_t len) { copy_stream(dst, src, len); }

void hixl__copy_fence(void) { _mm_sfence(); }

void hixl__copy(void *dst, const void *src, size_t len)
{
  if (len >= hixl__stream_min && len < stream_max) {
    copy_stream(dst, src, len);
    /* Streaming stores are weakly ordered: fence them before anything that
     * says "done" (a notification, a completion) can be seen. */
    _mm_sfence();
  } else {
    memcpy(dst, src, len);
  }
}
#else
size_t hixl__stream_min = SIZE_MAX;
void hixl__copy_init(void) {}
void hixl__copy_stream(void *dst, const void *src, size_t len) { memcpy(dst, src, len); }
void hixl__copy_fence(void) {}
void hixl__copy(void *dst, const void *src, size_t len) { memcpy(dst, src, len); }
#endif

const char *hixl__strerror_fd(int err, char *buf, size_t n)
{
  int k = snprintf(buf, n, "%s", strerror(err));
  if ((err == EMFILE || err == ENFILE) && k > 0 && (size_t)k + 2 < n) {
    memcpy(buf + k, ": ", 2);
    hixl__nofile_hint(buf + k + 2, n - (size_t)k - 2);
  }
  return buf;
}

bool hixl__fd_exhausted(int any_fd)
{
  int fd = fcntl(any_fd, F_DUPFD_CLOEXEC, 0);
  if (fd >= 0) {
    close(fd);
    return false;
  }
  return errno == EMFILE || errno == ENFILE;
}

int hixl__fd_room(int any_fd, int need)
{
  int fds[16], n = 0;
  if (need > 16)
    need = 16;
  while (n < need && (fds[n] = fcntl(any_fd, F_DUPFD_CLOEXEC, 0)) >= 0)
    n++;
  for (int i = 0; i < n; i++)
    close(fds[i]);
  return n;
}

bool hixl__futile_step(hixl_futile_t *f, bool futile, int any_fd)
{
  if (!futile) {
    *f = (hixl_futile_t){0};
    return false;
  }
  if (++f->n % HIXL_FUTILE_WAKEUPS == 0)
    f->exhausted = hixl__fd_exhausted(any_fd);
  int64_t now = hixl__now_ns();
  if (f->exhausted) {
    /* The round's cost as wall time (a descheduled round counts in full:
     * the bound then errs on the side of napping longer). */
    int64_t nap = f->end_ns ? HIXL_FUTILE_DUTY * (now - f->end_ns) : 0;
    nap = nap < HIXL_FUTILE_NAP_NS       ? HIXL_FUTILE_NAP_NS
          : nap > HIXL_FUTILE_NAP_MAX_NS ? HIXL_FUTILE_NAP_MAX_NS
                                         : nap;
    nanosleep(&(struct timespec){0, (long)nap}, NULL);
    now = hixl__now_ns();
  }
  f->end_ns = now;
  return f->exhausted;
}

const char *hixl__nofile_hint(char *buf, size_t n)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    rl.rlim_cur = rl.rlim_max = 0;
  /* What to raise it by: each shm or fabric peer holds 2 (docs/scale.md:
   * descriptor limits), and an shm bind takes up to 6 more for a moment
   * (the target's: the TCP connection, the 3 passed to it, its own 3). */
  snprintf(buf, n,
           "the process is at its descriptor limit, RLIMIT_NOFILE %llu (hard %llu): raise it by 2 "
           "per peer, with 6 more free while one binds (ulimit -n; systemd: LimitNOFILE=)",
           (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max);
  return buf;
}

/* CAP_IPC_LOCK in this thread's effective set (capabilities are per
 * thread; /proc/self/status would show the main thread's). */
static bool cap_ipc_lock(void)
{
  struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct d[2];
  memset(d, 0, sizeof(d));
  if (syscall(SYS_capget, &h, d) != 0)
    return false;
  return (d[CAP_TO_INDEX(CAP_IPC_LOCK)].effective & CAP_TO_MASK(CAP_IPC_LOCK)) != 0;
}

/* A "VmXxx:   123 kB" line of /proc/self/status, in KiB (0 when absent). */
static unsigned long long status_kib(const char *key)
{
  char line[128];
  unsigned long long v = 0;
  size_t kl = strlen(key);
  FILE *f = fopen("/proc/self/status", "re");
  while (f && fgets(line, sizeof(line), f))
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
      v = strtoull(line + kl + 1, NULL, 10);
      break;
    }
  if (f)
    fclose(f);
  return v;
}

/* Whether this process is in the initial user namespace (an identity
 * uid_map).  The kernel's pinning check is capable(CAP_IPC_LOCK) there: the
 * capability inside another user namespace (a rootless container's root)
 * does not lift the limit. */
static bool init_userns(void)
{
  FILE *f = fopen("/proc/self/uid_map", "re");
  if (f == NULL)
    return true; /* no user namespaces in this kernel */
  unsigned long a = 1, b = 1, c = 0;
  bool id = fscanf(f, "%lu %lu %lu", &a, &b, &c) == 3 && a == 0 && b == 0 && c == 4294967295ul;
  fclose(f);
  return id;
}

const char *hixl__memlock_hint(char *buf, size_t n, size_t want)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
    rl.rlim_cur = rl.rlim_max = RLIM_INFINITY;
  bool cap = cap_ipc_lock(), ns_cap = cap && !init_userns();
  if (rl.rlim_cur == RLIM_INFINITY || (cap && !ns_cap)) {
    snprintf(buf, n,
             "RLIMIT_MEMLOCK does not limit this process (%s), so the kernel or the device "
             "refused for another reason: out of memory, or the device's own limits on "
             "registered memory (ibv_devinfo -v: max_mr, max_mr_size)",
             rl.rlim_cur == RLIM_INFINITY ? "unlimited" : "it has CAP_IPC_LOCK");
    return buf;
  }
  char hard[32] = "unlimited";
  if (rl.rlim_max != RLIM_INFINITY)
    snprintf(hard, sizeof(hard), "%llu KiB", (unsigned long long)rl.rlim_max / 1024);
  snprintf(buf, n,
           "RLIMIT_MEMLOCK is %llu KiB (hard %s) and this process has %llu KiB pinned (VmPin) "
           "and %llu KiB locked (VmLck) already; this needs %llu KiB more: raise it (ulimit -l "
           "unlimited in the shell, '* - memlock unlimited' in /etc/security/limits.conf, "
           "LimitMEMLOCK=infinity for a systemd service, --ulimit memlock=-1 for docker) or "
           "give the process CAP_IPC_LOCK%s",
           (unsigned long long)rl.rlim_cur / 1024, hard, status_kib("VmPin"), status_kib("VmLck"),
           (unsigned long long)(want + 1023) / 1024,
           ns_cap ? " (it has CAP_IPC_LOCK only inside a user namespace, a rootless "
                    "container's, which does not count for pinning)"
                  : "");
  return buf;
}

/* SPDX-License-Identifier: MIT */
/*
 * The base layer: what every part of the library uses and nothing in it
 * depends on a context, a peer or a transport: errors, time, the data
 * mover, memfds, and (through their own headers) the log, the notification
 * ring, the wire codec and the rkey codec.  src/device includes this alone;
 * transports get it through provider.h, the core through core.h
 * (docs/architecture.md, "Layers").  Nothing here is visible outside
 * libhixl.so (src/hixl.map).
 */
#ifndef HIXL_BASE_H
#define HIXL_BASE_H

#include "hixl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include "log.h"
#include "ring.h"
#include "wire.h"

#define HIXL_HOT __attribute__((hot))
#define HIXL_COLD __attribute__((cold, noinline))
#define hixl_likely(x) __builtin_expect(!!(x), 1)
#define hixl_unlikely(x) __builtin_expect(!!(x), 0)
#define HIXL_CACHELINE 64

/* ------------------------------------------------------------- errors */

/* The longest hixl_last_error() message, with its NUL: room for a
 * message and its hint.  hixl__err may be passed hixl_last_error() to wrap
 * it; a caller that makes other calls before it wraps the error copies it
 * into a buffer this size first. */
#define HIXL_ERR_MAX 1024

/* Record a detailed message for this thread and return st (st < 0). */
hixl_status_t hixl__err(hixl_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), cold));

/* -------------------------------------------------------------- time */

int64_t hixl__now_ns(void);
/* Deadline helper: -1 forever, 0 now, else now + ms. */
int64_t hixl__deadline(int timeout_ms);
bool hixl__expired(int64_t deadline_ns);
/* The coarse clock deadlines use (a tick of resolution, no hardware read). */
int64_t hixl__now_coarse_ns(void);

/* util.c */
hixl_status_t hixl__host_id(uint8_t out[32]);
/* The environment variable name as a decimal in [lo, hi]; def when unset,
 * and (with a warning that says what it wants) when it is anything else. */
long hixl__env_int(const char *name, long lo, long hi, long def);
/* pthread_create for the library's own threads (control, progress, a
 * transport's): the new thread starts with every asynchronous signal
 * blocked, so that SIGINT, SIGTERM, SIGCHLD, SIGUSR1 and the like go to
 * the application's threads, whose handlers expect them (a handler run on
 * a library thread could take a lock that thread holds); faults (SIGSEGV,
 * SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS) stay deliverable to whatever
 * handler the application has, as they are on any thread.  name (at most
 * 15 characters, "hixl-...") is what top -H, gdb and /proc show for it.
 * 0 or an errno. */
int hixl__thread_start(pthread_t *t, const char *name, void *(*fn)(void *), void *arg);
uint64_t hixl__random64(void);
int hixl__memfd(const char *name, size_t len);
/* "RLIMIT_NOFILE is 1024 (hard 524288): raise it (ulimit -n; systemd:
 * LimitNOFILE=)" in buf: what to say when the kernel drops passed fds. */
const char *hixl__nofile_hint(char *buf, size_t n);
/* Why pinning want more bytes may fail, and the fix, in buf: RLIMIT_MEMLOCK
 * against what the process has pinned (VmPin, what ib_umem_get compares
 * with it) and locked (VmLck), or that the limit does not apply (unlimited,
 * or CAP_IPC_LOCK in the calling thread's effective set in the initial
 * user namespace: the kernel checks capable(CAP_IPC_LOCK)). */
const char *hixl__memlock_hint(char *buf, size_t n, size_t want);
/* strerror(err), and for EMFILE/ENFILE the hint above after it, in buf. */
const char *hixl__strerror_fd(int err, char *buf, size_t n);
/* Whether the process is out of descriptors now (duplicating any_fd, an
 * open one, fails with EMFILE or ENFILE).  For loops that keep waking on
 * an fd whose work cannot be done without one: a provider's listening
 * socket whose accept fails stays readable. */
bool hixl__fd_exhausted(int any_fd);
/* How many descriptors the process can still open, counted up to need (at
 * most 16) by duplicating any_fd, an open one, and closing the copies: a
 * check before work that needs need of them at once. */
int hixl__fd_room(int any_fd, int need);
/* Such a loop's run of futile wake-ups (woken, nothing it could do):
 * hixl__futile_step counts one round and, only while the process is out
 * of descriptors (asked again every HIXL_FUTILE_WAKEUPS futile rounds),
 * naps and says so.  The nap is HIXL_FUTILE_DUTY times what the round
 * took since the last step, at least HIXL_FUTILE_NAP_NS and at most
 * HIXL_FUTILE_NAP_MAX_NS: such a loop then uses at most a tenth of a CPU
 * however slow a round is (a sanitizer's build, a loaded machine), and
 * the connections it has wait at most a few milliseconds longer (the
 * fabric progress thread, sleepers in wait.c; docs/scale.md). */
#define HIXL_FUTILE_WAKEUPS 1024u
#define HIXL_FUTILE_DUTY 9
#define HIXL_FUTILE_NAP_NS 250000
#define HIXL_FUTILE_NAP_MAX_NS 4000000
typedef struct hixl_futile {
  unsigned n;     /* futile rounds in a row */
  bool exhausted; /* and no descriptor could be had when last asked */
  int64_t end_ns; /* when the last step returned (0: none in this run) */
} hixl_futile_t;
bool hixl__futile_step(hixl_futile_t *f, bool futile, int any_fd);
/* Whether a memfd another process lent us may be mapped: only if it cannot
 * shrink under the mapping (a truncation would make every access past the
 * new end SIGBUS): sealed against shrinking and against further seals, and
 * at least need bytes long.  hixl__memfd seals every one it makes. */
bool hixl__fd_sealed(int fd, uint64_t need);
/* The one data mover of self and shm (see util.c). */
void hixl__copy(void *dst, const void *src, size_t len);
/* The streaming copy itself (any size; memcpy off x86-64) and the fence that
 * must follow a run of them before completion is reported. */
void hixl__copy_stream(void *dst, const void *src, size_t len);
void hixl__copy_fence(void);
/* hixl__copy streams from this many bytes up (SIZE_MAX: never). */
extern size_t hixl__stream_min;
/* Sets the size from which hixl__copy streams (HIXL_COPY_STREAM_MIN, else
 * half the last-level cache); called once, by the first hixl_ctx_create. */
void hixl__copy_init(void);

#endif /* HIXL_BASE_H */

/* SPDX-License-Identifier: MIT */
/*
 * Waiting (docs/waiting.md): every blocking call polls for a moment, then
 * sleeps in the kernel until the event it waits for wakes it.
 *
 * A waiter announces itself before its last look: it adds itself to
 * ctx->sleeping (its thread's eventfd) and counts itself in *ctx->sleepers,
 * then asks each transport to arm its event sources (verbs: the CQs'
 * completion channels; fabric: the provider's wait fd; shm: the context's
 * doorbell pipe), looks once more, and sleeps in poll() on those fds and
 * its eventfd.  Whoever makes an event (completes a request, delivers a
 * notification, fails a peer) publishes it, then reads *ctx->sleepers
 * (seq_cst on both sides: Dekker's pattern, the io_uring SQ_NEED_WAKEUP
 * one) and only when it is non-zero pays for a wake-up.  So the fast path
 * of a producer is one fence and one load, and a waiter that found nothing
 * after announcing cannot miss an event made after its look.
 *
 * shm peers in other processes cannot write our eventfds (they would steal
 * wake-ups); they read *ctx->sleepers in a read-only page (the shm
 * transport puts the counter there) and write into our doorbell pipe,
 * whose read end only we hold.
 *
 * Every waiter has its own eventfd, so several threads may wait on one
 * context: a local wake-up writes all of them.  A transport fd (the
 * doorbell, a completion channel) is shared: poll() wakes every thread
 * asleep on it, and none drains it until it next sleeps (sleep_once).
 *
 * Adaptive polling: the budget is the wake-up latency recently measured
 * here (from a waker's timestamp to the waiter running again), clamped to
 * [SPIN_MIN_NS, SPIN_MAX_NS]: waiting longer than a wake-up costs more
 * than sleeping, shorter forfeits latency for nothing (the competitive
 * spin-then-block argument).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core.h"

#define SPIN_MIN_NS 1000
#define SPIN_MAX_NS 50000
#define SPIN_INIT_NS 20000
/* A waiter sleeps at most this long before looking again although nothing
 * woke it: insurance against a lost wake-up (a local peer that scribbles
 * the doorbell's queue full, a provider whose wait fd misses an event),
 * never the way an event is seen (docs/waiting.md). */
#define SAFETY_MS 1000
#define MAX_FDS 8

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t efd_key;

static void efd_close(void *v) { close((int)(intptr_t)v - 1); }
static void key_init(void) { pthread_key_create(&efd_key, efd_close); }

/* This thread's eventfd (made at its first sleep, closed at its exit). */
static int thread_efd(void)
{
  pthread_once(&key_once, key_init);
  intptr_t v = (intptr_t)pthread_getspecific(efd_key);
  if (v > 0)
    return (int)v - 1;
  int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0)
    return -1;
  if (pthread_setspecific(efd_key, (void *)(intptr_t)(fd + 1)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void hixl__wait_init(hixl_ctx_t *ctx)
{
  ctx->wait_mode = ctx->cfg.wait;
  ctx->sleepers = &ctx->own_sleepers;
  ctx->space_waiters = &ctx->own_space_waiters;
  atomic_store(&ctx->spin_ns, SPIN_INIT_NS);
  pthread_mutex_init(&ctx->wait_lock, NULL);
}

void hixl__wait_fini(hixl_ctx_t *ctx) { pthread_mutex_destroy(&ctx->wait_lock); }

void hixl__wake_all(hixl_ctx_t *ctx)
{
  atomic_store_explicit(&ctx->wake_stamp_ns, hixl__now_ns(), memory_order_relaxed);
  uint64_t one = 1;
  pthread_mutex_lock(&ctx->wait_lock);
  for (hixl_sleeper_t *s = ctx->sleeping; s; s = s->next) {
    ssize_t r = write(s->efd, &one, sizeof(one));
    (void)r; /* EAGAIN: its counter is full, so it is awake already */
  }
  pthread_mutex_unlock(&ctx->wait_lock);
}

void hixl__wait_sample(hixl_ctx_t *ctx, int64_t wake_ns)
{
  /* A hostile local peer may send any timestamp: the clamp bounds what it
   * can do to the budget. */
  if (wake_ns <= 0 || wake_ns > 10000000)
    return;
  if (wake_ns < SPIN_MIN_NS)
    wake_ns = SPIN_MIN_NS;
  if (wake_ns > SPIN_MAX_NS)
    wake_ns = SPIN_MAX_NS;
  int64_t b = atomic_load_explicit(&ctx->spin_ns, memory_order_relaxed);
  atomic_store_explicit(&ctx->spin_ns, b + (wake_ns - b) / 8, memory_order_relaxed);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield" ::: "memory");
#else
  __asm__ volatile("" ::: "memory");
#endif
}

static int ms_left(int64_t deadline, int cap)
{
  if (deadline == INT64_MAX)
    return cap;
  int64_t ns = deadline - hixl__now_coarse_ns();
  if (ns <= 0)
    return 0;
  int64_t ms = (ns + 999999) / 1000000;
  return ms < cap ? (int)ms : cap;
}

/* What woke this thread's last sleep, drained at its next one (not on the
 * way back to the caller: a wake-up's latency is the time to return). */
static __thread struct {
  hixl_ctx_t *ctx;
  unsigned fired; /* bit 0: our eventfd; bit 1 + i: transport i's fds */
  int64_t woke_ns;
} last;

static void drain_last(hixl_ctx_t *ctx, int efd)
{
  if (last.ctx != ctx || last.fired == 0)
    return;
  if (last.fired & 1) {
    uint64_t v;
    if (read(efd, &v, sizeof(v)) == (ssize_t)sizeof(v)) {
      int64_t stamp = atomic_load_explicit(&ctx->wake_stamp_ns, memory_order_relaxed);
      if (stamp && stamp < last.woke_ns)
        hixl__wait_sample(ctx, last.woke_ns - stamp);
    }
  }
  for (size_t t = 0; t < hixl__n_transports; t++)
    if (last.fired & (2u << t))
      hixl__transports[t]->ack_event(ctx, last.woke_ns);
  last.fired = 0;
}

/* Announce, arm, look once more, sleep; returns true when fn said done.
 * Several threads may sleep on one transport fd: poll() wakes all of them,
 * and none drains it before it next sleeps (then it announces itself and
 * looks again), so an event can keep a thread from sleeping but never
 * leave one asleep. */
static bool sleep_once(hixl_ctx_t *ctx, int64_t deadline, int cap_ms, unsigned flags,
                       hixl_wait_fn fn, void *arg)
{
  int efd = thread_efd();
  drain_last(ctx, efd);
  hixl_sleeper_t me = {.efd = efd};
  struct pollfd pf[1 + MAX_FDS];
  unsigned bit[1 + MAX_FDS];
  nfds_t n = 0;
  if (efd >= 0) {
    pf[n] = (struct pollfd){.fd = efd, .events = POLLIN};
    bit[n++] = 1;
    pthread_mutex_lock(&ctx->wait_lock);
    me.next = ctx->sleeping;
    ctx->sleeping = &me;
    pthread_mutex_unlock(&ctx->wait_lock);
  }
  /* The progress thread waits for transport events only (armed below):
   * in the list (hixl_ctx_destroy wakes it), not in the count, so nobody
   * pays a wake-up for it. */
  bool counted = !(flags & HIXL_WAITF_PROGRESS);
  if (counted)
    atomic_fetch_add_explicit(ctx->sleepers, 1, memory_order_seq_cst);
  /* Waiting for room: announced only for the sleep, so a consumer pays no
   * doorbell while we poll (it did on every take, a system call each). */
  if (flags & HIXL_WAITF_SPACE)
    atomic_fetch_add_explicit(ctx->space_waiters, 1, memory_order_seq_cst);
  atomic_thread_fence(memory_order_seq_cst);
  bool pending = false; /* a transport has events already: do not sleep */
  for (size_t t = 0; t < hixl__n_transports && !pending; t++) {
    const hixl_transport_ops_t *o = hixl__transports[t];
    if (o->arm == NULL || !(ctx->tp_ready & (1u << o->id)) || ctx->tp[o->id] == NULL)
      continue;
    int fds[MAX_FDS];
    int k = o->arm(ctx, flags, fds, (int)(1 + MAX_FDS - n));
    if (k < 0)
      pending = true;
    for (int i = 0; i < k; i++) {
      pf[n] = (struct pollfd){.fd = fds[i], .events = POLLIN};
      bit[n++] = 2u << t;
    }
  }
  bool done = fn(arg);
  int r = 0;
  if (!done && !pending) {
    int ms = ms_left(deadline, cap_ms);
    if (efd < 0 && ms > 1)
      ms = 1; /* no eventfd (out of fds): local wake-ups cannot reach us */
    if (ms > 0)
      r = poll(pf, n, ms);
  }
  if (counted)
    atomic_fetch_sub_explicit(ctx->sleepers, 1, memory_order_seq_cst);
  if (flags & HIXL_WAITF_SPACE)
    atomic_fetch_sub_explicit(ctx->space_waiters, 1, memory_order_seq_cst);
  if (efd >= 0) {
    pthread_mutex_lock(&ctx->wait_lock);
    hixl_sleeper_t **pp = &ctx->sleeping;
    while (*pp != &me)
      pp = &(*pp)->next;
    *pp = me.next;
    pthread_mutex_unlock(&ctx->wait_lock);
  }
  if (r > 0) {
    last.ctx = ctx;
    last.woke_ns = hixl__now_ns();
    last.fired = 0;
    for (nfds_t i = 0; i < n; i++)
      if (pf[i].revents)
        last.fired |= bit[i];
  }
  return done;
}

/* Poll fn for the adaptive budget (or forever in SPIN mode); true when
 * fn said done, false when it is time to sleep (or TIMEOUT in *st). */
static bool poll_phase(hixl_ctx_t *ctx, int64_t deadline, unsigned flags, hixl_wait_fn fn,
                       void *arg, hixl_status_t *st)
{
  *st = HIXL_OK;
  if (fn(arg))
    return true;
  if (deadline != INT64_MAX && hixl__expired(deadline)) {
    *st = HIXL_ERR_TIMEOUT;
    return false;
  }
  int mode = ctx->wait_mode;
  if (mode == HIXL_WAIT_SPIN) {
    for (unsigned i = 1;; i++) {
      if (fn(arg))
        return true;
      if ((i & 63) == 0 && hixl__expired(deadline)) {
        *st = HIXL_ERR_TIMEOUT;
        return false;
      }
      cpu_relax();
    }
  }
  if (mode == HIXL_WAIT_ADAPTIVE && !(flags & HIXL_WAITF_NOSPIN)) {
    int64_t budget = atomic_load_explicit(&ctx->spin_ns, memory_order_relaxed);
    int64_t t0 = hixl__now_ns();
    for (unsigned i = 1;; i++) {
      if (fn(arg))
        return true;
      if ((i & 7) == 0 && hixl__now_ns() - t0 >= budget)
        break;
      cpu_relax();
    }
  }
  return false;
}

hixl_status_t hixl__wait(hixl_ctx_t *ctx, int64_t deadline, unsigned flags, hixl_wait_fn fn,
                         void *arg)
{
  hixl_status_t st;
  if (poll_phase(ctx, deadline, flags, fn, arg, &st))
    return HIXL_OK;
  if (st != HIXL_OK)
    return st;
  for (;;) {
    if (sleep_once(ctx, deadline, SAFETY_MS, flags, fn, arg))
      return HIXL_OK;
    if (fn(arg))
      return HIXL_OK;
    if (hixl__expired(deadline))
      return HIXL_ERR_TIMEOUT;
  }
}

hixl_status_t hixl__wait_step(hixl_ctx_t *ctx, int64_t deadline, int cap_ms, hixl_wait_fn fn,
                              void *arg)
{
  hixl_status_t st;
  if (poll_phase(ctx, deadline, 0, fn, arg, &st))
    return HIXL_OK;
  if (st != HIXL_OK)
    return st;
  if (sleep_once(ctx, deadline, cap_ms, 0, fn, arg) || fn(arg))
    return HIXL_OK;
  return hixl__expired(deadline) ? HIXL_ERR_TIMEOUT : HIXL_INPROGRESS;
}

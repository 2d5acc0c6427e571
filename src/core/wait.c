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
 * Words instead of fds: when every event source armed can be a futex word
 * (shm's peers' inboxes, up to a few; the context's own wake_word for
 * local wake-ups), the waiter sleeps in futex_waitv instead of poll() and
 * counts itself with HIXL_SLEEP_WORD: the kernel wakes a futex faster than
 * a poll() (1.09x a bare futex wake-up against 1.19-1.24x here), and
 * such a sleeper is in no list, so waking costs it one atomic on its way
 * back.  The word is read before the sleeper announces itself; a waker
 * that sees the announcement bumps it after, so futex_waitv either sees
 * the new value or is woken (the same Dekker argument).
 *
 * Adaptive polling: the budget is the wake-up latency recently measured
 * here (from a waker's timestamp to the waiter running again), clamped to
 * [SPIN_MIN_NS, SPIN_MAX_NS]: waiting longer than a wake-up costs more
 * than sleeping, shorter forfeits latency for nothing (the competitive
 * spin-then-block argument).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
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
/* futex_waitv takes up to 128; each costs the kernel a queueing and an
 * unqueueing per sleep, so past a few peers poll() on one pipe wins. */
#define MAX_WORDS 9

#ifdef SYS_futex_waitv
/* Linux 5.16; seccomp profiles may refuse it (EPERM) as an old kernel
 * does (ENOSYS).  nr == 0 is EINVAL where it exists. */
static _Atomic bool futex_waitv_ok;
static pthread_once_t futex_once = PTHREAD_ONCE_INIT;
static void futex_probe(void)
{
  const char *e = getenv("HIXL_NO_FUTEX_WAITV");
  atomic_store(&futex_waitv_ok, syscall(SYS_futex_waitv, NULL, 0, 0, NULL, 0) < 0 &&
                                    errno == EINVAL && !(e && *e && strcmp(e, "0") != 0));
}
static bool words_ok(void)
{
  pthread_once(&futex_once, futex_probe);
  return atomic_load_explicit(&futex_waitv_ok, memory_order_relaxed);
}
#else
static bool words_ok(void) { return false; }
#endif

static void futex_wake(_Atomic uint32_t *w, bool shared)
{
  syscall(SYS_futex, w, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

/* Does a thread of ctx sleep on words (either count's high half)? */
static bool word_sleepers(const hixl_ctx_t *ctx)
{
  uint32_t v = atomic_load_explicit(ctx->sleepers, memory_order_relaxed) |
               atomic_load_explicit(ctx->space_waiters, memory_order_relaxed);
  return v >= HIXL_SLEEP_WORD;
}

void hixl__wake_word(_Atomic uint32_t *w, bool shared)
{
  atomic_fetch_add_explicit(w, 1, memory_order_seq_cst);
  futex_wake(w, shared);
}

void hixl__wake_rearm(hixl_ctx_t *ctx)
{
  /* Bumped whether or not anyone sleeps: a sleeper that read the word
   * before the change then cannot sleep through it (futex_waitv sees the
   * new value), and one that announced itself before our look is woken. */
  atomic_fetch_add_explicit(&ctx->wake_word, 1, memory_order_seq_cst);
  atomic_thread_fence(memory_order_seq_cst);
  if (word_sleepers(ctx))
    futex_wake(&ctx->wake_word, false);
}

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
  /* Tests turn the safety net off, so that a lost wake-up is a hang they
   * see rather than a 1 s delay (docs/testing.md). */
  const char *e = getenv("HIXL_WAIT_SAFETY_MS");
  ctx->wait_safety_ms = e && atoi(e) > 0 ? atoi(e) : SAFETY_MS;
  pthread_mutex_init(&ctx->wait_lock, NULL);
}

void hixl__wait_fini(hixl_ctx_t *ctx) { pthread_mutex_destroy(&ctx->wait_lock); }

void hixl__wake_all(hixl_ctx_t *ctx)
{
  atomic_store_explicit(&ctx->wake_stamp_ns, hixl__now_ns(), memory_order_relaxed);
  if (word_sleepers(ctx))
    hixl__wake_word(&ctx->wake_word, false);
  uint64_t one = 1;
  pthread_mutex_lock(&ctx->wait_lock);
  for (hixl_sleeper_t *s = ctx->sleeping; s; s = s->next) {
    ssize_t r = write(s->efd, &one, sizeof(one));
    (void)r; /* EAGAIN: its counter is full, so it is awake already */
  }
  pthread_mutex_unlock(&ctx->wait_lock);
}

/* This thread's last sleep gave the budget a sample (drain_last): a wake-up
 * with no stamp then feeds it from how soon its event came instead. */
static __thread bool sampled;

void hixl__wait_sample(hixl_ctx_t *ctx, int64_t wake_ns)
{
  /* A hostile local peer may send any timestamp: the clamp bounds what it
   * can do to the budget. */
  if (wake_ns <= 0 || wake_ns > 10000000)
    return;
  sampled = true;
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
  unsigned fired; /* bit 0: our eventfd (or wake_word); bit 1 + i: transport i's */
  bool word;      /* the sleep was on words */
  int64_t slept_ns, woke_ns;
  int64_t spun_ns;      /* the poll phase before it, when it was the wait's first sleep */
  hixl_futile_t futile; /* sleeps in a row that woke (or did not sleep) for nothing */
} last;

/* How long the poll phase that just gave up polled; 0 once the wait has
 * slept (only its first sleep follows a poll phase).  Set only where a
 * poll phase gives up, which a sleep always follows, and cleared by that
 * sleep: the fast path (the event is there at once) touches no TLS. */
static __thread int64_t spin_before;

static void futile_reset(void) { last.futile = (hixl_futile_t){0}; }

static void drain_last(hixl_ctx_t *ctx)
{
  if (last.ctx != ctx || last.fired == 0)
    return;
  sampled = false;
  if (last.fired & 1) {
    uint64_t v;
    if (last.word || read(thread_efd(), &v, sizeof(v)) == (ssize_t)sizeof(v)) {
      /* A stamp from before the sleep is an older wake-up's (a re-arm
       * stamps none): not this one's latency. */
      int64_t stamp = atomic_load_explicit(&ctx->wake_stamp_ns, memory_order_relaxed);
      if (stamp > last.slept_ns && stamp < last.woke_ns)
        hixl__wait_sample(ctx, last.woke_ns - stamp);
    }
  }
  for (size_t t = 0; t < hixl__n_transports; t++)
    if (last.fired & (2u << t))
      hixl__transports[t]->ack_event(ctx, last.woke_ns, last.word);
  /* A transport's descriptor woke us with no time of its event (fabric,
   * verbs: the provider's or the kernel's, not a peer's stamp).  When the
   * event came within SPIN_MAX_NS of the sleep, polling for as long as the
   * whole wait took would have caught it without the wake-up: sample
   * that.  Without this the budget stayed at SPIN_INIT_NS while fabric's
   * replies came just after it, so every ping-pong reply paid a wake-up
   * (half round trips 1.5-2x longer).  An event that came later than
   * that would not have been caught by any budget: the polling was
   * wasted, and the budget goes back toward its start (else it could only
   * ever rise: every such sample is above the budget that ran out).  A
   * peer that times its events to land just after the budget can hold it
   * at SPIN_MAX_NS, no further. */
  int64_t slept = last.woke_ns - last.slept_ns;
  if (!sampled && (last.fired & ~1u) && last.spun_ns > 0 && slept >= 0)
    hixl__wait_sample(ctx, slept < SPIN_MAX_NS ? last.spun_ns + slept : SPIN_INIT_NS);
  last.fired = 0;
}

/* This sleep's event sources: words, when every transport armed could
 * give words (futex_waitv), else fds (poll; slot 0 is our eventfd). */
typedef struct sources {
  struct pollfd pf[1 + MAX_FDS];
  unsigned bit[1 + MAX_FDS];
  nfds_t n;
  hixl_wait_word_t w[MAX_WORDS];
  unsigned wbit[MAX_WORDS];
  int nw;
  bool words;
} sources_t;

static bool arm_fds(hixl_ctx_t *ctx, unsigned flags, size_t t, sources_t *s)
{
  int fds[MAX_FDS];
  int k = hixl__transports[t]->arm(ctx, flags, fds, (int)(1 + MAX_FDS - s->n));
  if (k < 0)
    return false;
  for (int i = 0; i < k; i++) {
    s->pf[s->n] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    s->bit[s->n++] = 2u << t;
  }
  return true;
}

/* Arm every ready transport; false when one has events pending already
 * (look again instead of sleeping).  Words are read here, before the
 * waiter announces itself: a waker that sees the announcement bumps its
 * word afterwards, so futex_waitv cannot sleep through it. */
static bool arm_all(hixl_ctx_t *ctx, unsigned flags, sources_t *s)
{
  s->n = 1;
  s->nw = 0;
  s->words = !(flags & HIXL_WAITF_PROGRESS) && words_ok();
  if (s->words) {
    s->w[0] =
        (hixl_wait_word_t){.word = &ctx->wake_word,
                           .val = atomic_load_explicit(&ctx->wake_word, memory_order_seq_cst)};
    s->wbit[0] = 1;
    s->nw = 1;
  }
  unsigned on_words = 0;
  for (size_t t = 0; t < hixl__n_transports; t++) {
    const hixl_transport_ops_t *o = hixl__transports[t];
    if (o->arm == NULL || !(ctx->tp_ready & (1u << o->id)) || ctx->tp[o->id] == NULL)
      continue;
    if (s->words && o->arm_words) {
      int k = o->arm_words(ctx, flags, s->w + s->nw, MAX_WORDS - s->nw);
      if (k >= 0) {
        for (int i = 0; i < k; i++)
          s->wbit[s->nw + i] = 2u << t;
        s->nw += k;
        on_words |= 1u << t;
        continue;
      }
    }
    nfds_t before = s->n;
    if (!arm_fds(ctx, flags, t, s))
      return false;
    if (s->n > before)
      s->words = false; /* an fd to wait on: poll() for everything */
  }
  if (!s->words)
    for (size_t t = 0; t < hixl__n_transports; t++)
      if ((on_words & (1u << t)) && !arm_fds(ctx, flags, t, s))
        return false;
  return true;
}

/* futex_waitv on s's words for at most ms from now_ns (CLOCK_MONOTONIC,
 * read by the caller already); the bit of what woke us, 0 for a timeout or
 * a word that had moved already. */
static unsigned sleep_words(const sources_t *s, int64_t now_ns, int ms)
{
#ifdef SYS_futex_waitv
  struct futex_waitv wv[MAX_WORDS];
  for (int i = 0; i < s->nw; i++)
    wv[i] = (struct futex_waitv){.val = s->w[i].val,
                                 .uaddr = (uint64_t)(uintptr_t)s->w[i].word,
                                 .flags = FUTEX_32 | (s->w[i].shared ? 0 : FUTEX_PRIVATE_FLAG)};
  int64_t until = now_ns + (int64_t)ms * 1000000;
  struct timespec ts = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};
  long r = syscall(SYS_futex_waitv, wv, (unsigned)s->nw, 0, &ts, CLOCK_MONOTONIC);
  if (r >= 0 && r < s->nw)
    return s->wbit[r];
  /* EAGAIN: a word moved (look again); ETIMEDOUT, EINTR; EFAULT: a peer's
   * ring unmapped under us (its peer is gone; look again).  Anything else
   * (a seccomp filter installed since the probe, ENOMEM) would return at
   * once every time: a busy loop.  From then on, poll(). */
  if (r < 0 && errno != EAGAIN && errno != ETIMEDOUT && errno != EINTR && errno != EFAULT)
    atomic_store(&futex_waitv_ok, false);
  return 0;
#else
  (void)s;
  (void)now_ns;
  (void)ms;
  return 0;
#endif
}

/* Announce, arm, look once more, sleep; returns true when fn said done.
 * Several threads may sleep on one transport fd: poll() wakes all of them,
 * and none drains it before it next sleeps (then it announces itself and
 * looks again), so an event can keep a thread from sleeping but never
 * leave one asleep. */
static bool sleep_once(hixl_ctx_t *ctx, int64_t deadline, int cap_ms, unsigned flags,
                       hixl_wait_fn fn, void *arg)
{
  drain_last(ctx);
  sources_t s;
  bool armed = arm_all(ctx, flags, &s);
  uint32_t unit = s.words ? HIXL_SLEEP_WORD : HIXL_SLEEP_POLL;
  hixl_sleeper_t me = {.efd = -1};
  s.pf[0] = (struct pollfd){.fd = -1}; /* poll() skips a negative fd */
  s.bit[0] = 1;
  if (!s.words && (me.efd = thread_efd()) >= 0) {
    s.pf[0] = (struct pollfd){.fd = me.efd, .events = POLLIN};
    pthread_mutex_lock(&ctx->wait_lock);
    me.next = ctx->sleeping;
    ctx->sleeping = &me;
    pthread_mutex_unlock(&ctx->wait_lock);
  }
  /* The progress thread waits for transport events only (armed above):
   * in the list (hixl_ctx_destroy wakes it), not in the count, so nobody
   * pays a wake-up for it. */
  bool counted = !(flags & HIXL_WAITF_PROGRESS);
  if (counted)
    atomic_fetch_add_explicit(ctx->sleepers, unit, memory_order_seq_cst);
  /* Waiting for room: announced only for the sleep, so a consumer pays no
   * doorbell while we poll (it did on every take, a system call each). */
  if (flags & HIXL_WAITF_SPACE)
    atomic_fetch_add_explicit(ctx->space_waiters, unit, memory_order_seq_cst);
  atomic_thread_fence(memory_order_seq_cst);
  bool done = fn(arg);
  unsigned fired = 0;
  int64_t slept_ns = 0;
  if (!done && armed) {
    slept_ns = hixl__now_ns();
    int ms = ms_left(deadline, cap_ms);
    if (!s.words && me.efd < 0 && ms > 1)
      ms = 1; /* no eventfd (out of fds): local wake-ups cannot reach us */
    if (ms > 0 && s.words) {
      fired = sleep_words(&s, slept_ns, ms);
    } else if (ms > 0 && poll(s.pf, s.n, ms) > 0) {
      for (nfds_t i = 0; i < s.n; i++)
        if (s.pf[i].revents)
          fired |= s.bit[i];
    }
  }
  if (counted)
    atomic_fetch_sub_explicit(ctx->sleepers, unit, memory_order_seq_cst);
  if (flags & HIXL_WAITF_SPACE)
    atomic_fetch_sub_explicit(ctx->space_waiters, unit, memory_order_seq_cst);
  if (me.efd >= 0) {
    pthread_mutex_lock(&ctx->wait_lock);
    hixl_sleeper_t **pp = &ctx->sleeping;
    while (*pp != &me)
      pp = &(*pp)->next;
    *pp = me.next;
    pthread_mutex_unlock(&ctx->wait_lock);
  }
  if (slept_ns) {
    hixl_tstats_t *b = hixl__tstats_for(ctx->id, ctx);
    if (b) {
      hixl__stat_add(&b->c[HIXL_WST_SLEEPS], 1);
      hixl__stat_add(&b->c[HIXL_WST_SLEEP_NS], (uint64_t)(hixl__now_ns() - slept_ns));
    }
  }
  if (fired) {
    last.ctx = ctx;
    last.woke_ns = hixl__now_ns();
    last.fired = fired;
    last.word = s.words;
    last.slept_ns = slept_ns;
    last.spun_ns = spin_before;
  }
  spin_before = 0;
  /* Woken by a transport (or not armed) again and again, and still not
   * done: a transport fd that stays readable for work that needs a
   * descriptor we cannot get (the fabric provider's listening socket at
   * EMFILE) made this a busy loop at 100% of a CPU.  At the descriptor
   * limit, hixl__futile_step naps (a tenth of a CPU at most; it asks
   * again every HIXL_FUTILE_WAKEUPS turns).  The count is this thread's, cleared by
   * every wait that ends (hixl__wait, hixl__wait_step). */
  bool futile = !done && ((fired & ~1u) || !armed); /* not a full sleep or a local wake-up */
  hixl__futile_step(&last.futile, futile, ctx->epoll_fd);
  return done;
}

/* Time polled, t0 to t1, in the calling thread's counters (hixl_ctx_stats'
 * wait_spin_ns); returns done.  t1 is the loop's own last clock reading,
 * not a new one: the waiter that just found its event pays nothing more. */
static bool spun(hixl_ctx_t *ctx, int64_t t0, int64_t t1, bool done)
{
  hixl_tstats_t *b = hixl__tstats_for(ctx->id, ctx);
  if (b && t1 > t0)
    hixl__stat_add(&b->c[HIXL_WST_SPIN_NS], (uint64_t)(t1 - t0));
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
    int64_t t0 = hixl__now_coarse_ns(), t1 = t0;
    for (unsigned i = 1;; i++) {
      if (fn(arg))
        return spun(ctx, t0, t1, true);
      if ((i & 63) == 0) {
        t1 = hixl__now_coarse_ns();
        if (deadline != INT64_MAX && t1 >= deadline) {
          *st = HIXL_ERR_TIMEOUT;
          return spun(ctx, t0, t1, false);
        }
      }
      cpu_relax();
    }
  }
  if (mode == HIXL_WAIT_ADAPTIVE && !(flags & HIXL_WAITF_NOSPIN)) {
    int64_t budget = atomic_load_explicit(&ctx->spin_ns, memory_order_relaxed);
    int64_t t0 = hixl__now_ns(), t1 = t0;
    for (unsigned i = 1;; i++) {
      if (fn(arg))
        return spun(ctx, t0, t1, true);
      if ((i & 7) == 0 && (t1 = hixl__now_ns()) - t0 >= budget)
        break;
      cpu_relax();
    }
    spun(ctx, t0, t1, false);
    spin_before = t1 - t0;
  }
  return false;
}

static hixl_status_t wait_loop(hixl_ctx_t *ctx, int64_t deadline, unsigned flags, hixl_wait_fn fn,
                               void *arg)
{
  hixl_status_t st;
  if (poll_phase(ctx, deadline, flags, fn, arg, &st))
    return HIXL_OK;
  if (st != HIXL_OK)
    return st;
  for (;;) {
    if (sleep_once(ctx, deadline, ctx->wait_safety_ms, flags, fn, arg))
      return HIXL_OK;
    if (fn(arg))
      return HIXL_OK;
    if (hixl__expired(deadline))
      return HIXL_ERR_TIMEOUT;
  }
}

hixl_status_t hixl__wait(hixl_ctx_t *ctx, int64_t deadline, unsigned flags, hixl_wait_fn fn,
                         void *arg)
{
  hixl_status_t st = wait_loop(ctx, deadline, flags, fn, arg);
  futile_reset();
  return st;
}

static hixl_status_t step(hixl_ctx_t *ctx, int64_t deadline, int cap_ms, hixl_wait_fn fn, void *arg)
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

/* One step of a wait its caller loops over (INPROGRESS: not yet): the
 * futile count runs on across steps, and stops with the wait. */
hixl_status_t hixl__wait_step(hixl_ctx_t *ctx, int64_t deadline, int cap_ms, hixl_wait_fn fn,
                              void *arg)
{
  hixl_status_t st = step(ctx, deadline, cap_ms, fn, arg);
  if (st != HIXL_INPROGRESS)
    futile_reset();
  return st;
}

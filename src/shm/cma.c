/* SPDX-License-Identifier: MIT */
/*
 * Cross-memory attach (process_vm_writev / process_vm_readv) for the shm
 * transport, and the threads that share large transfers.
 *
 * One such call copies at a fraction of memcpy's rate on one thread (the
 * kernel pins and maps the other process's pages a batch at a time;
 * figures in docs/performance.md#cma-large-transfers-and-no-cma), and two
 * threads nearly halve the time.  So a transfer of split_min bytes or more
 * is cut into pieces (about four per thread, at least 1 MiB each) that the
 * caller and the context's helper threads take from a shared counter: a
 * helper that is busy or not scheduled (a loaded machine) just takes
 * fewer, and the caller never waits for a piece nobody started.  Helpers
 * are started at the first such transfer, never for smaller ones: those
 * make exactly one system call per IOV window, with nothing allocated.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../core/config.h"
#include "shm_int.h"

/* A transfer shared by threads: pieces [i * piece, (i + 1) * piece) of the
 * byte range its element lists cover. */
typedef struct shm_cma_job {
  pid_t pid;
  bool write;
  const struct iovec *l, *r;
  size_t cnt, total, piece, npieces;
  _Atomic size_t next; /* the next piece to take */
  _Atomic int err;     /* the first errno of any piece */
  int users;           /* helpers inside it (ctx lock) */
  struct shm_cma_job *next_job;
} shm_cma_job_t;

/* Bytes [from, to) of the paired lists (total bytes in all).  The tail of
 * the lists goes to the kernel as it is; a range that starts or ends
 * inside an element goes through a window of up to W elements. */
static int cma_range(pid_t pid, bool write, const struct iovec *l, const struct iovec *r,
                     size_t cnt, size_t from, size_t to, size_t total)
{
  enum { W = 64, IOV_LIMIT = 1024 };
  struct iovec lw[W], rw[W];
  size_t i = 0, skip = from;
  while (i < cnt && skip >= l[i].iov_len)
    skip -= l[i++].iov_len;
  size_t left = to - from;
  while (left > 0) {
    const struct iovec *lp = lw, *rp = rw;
    size_t k = 0;
    if (skip == 0 && to == total) {
      lp = l + i, rp = r + i;
      k = cnt - i < IOV_LIMIT ? cnt - i : IOV_LIMIT;
    } else {
      size_t bytes = 0, sk = skip;
      for (size_t j = i; k < W && j < cnt && bytes < left; j++, sk = 0) {
        size_t n = l[j].iov_len - sk;
        if (n > left - bytes)
          n = left - bytes;
        if (n == 0)
          continue;
        lw[k] = (struct iovec){(uint8_t *)l[j].iov_base + sk, n};
        rw[k] = (struct iovec){(uint8_t *)r[j].iov_base + sk, n};
        k++;
        bytes += n;
      }
    }
    if (k == 0)
      return EFAULT; /* the lists end before `to`: a caller's bug */
    ssize_t n =
        write ? process_vm_writev(pid, lp, k, rp, k, 0) : process_vm_readv(pid, lp, k, rp, k, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return n < 0 ? errno : EFAULT;
    /* The kernel may stop anywhere (a partial transfer): go on from there. */
    size_t adv = (size_t)n;
    left -= adv < left ? adv : left;
    while (adv > 0 && i < cnt) {
      size_t rem = l[i].iov_len - skip;
      if (adv >= rem) {
        adv -= rem;
        i++;
        skip = 0;
      } else {
        skip += adv;
        adv = 0;
      }
    }
  }
  return 0;
}

static void run_pieces(shm_cma_job_t *j)
{
  for (;;) {
    size_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (i >= j->npieces)
      return;
    if (atomic_load_explicit(&j->err, memory_order_relaxed) != 0)
      continue; /* failed already: take the rest without moving them */
    size_t from = i * j->piece;
    size_t to = from + j->piece < j->total ? from + j->piece : j->total;
    int e = cma_range(j->pid, j->write, j->l, j->r, j->cnt, from, to, j->total);
    if (e != 0) {
      int zero = 0;
      atomic_compare_exchange_strong(&j->err, &zero, e);
    }
  }
}

static void unlink_job_locked(shm_ctx_t *sc, shm_cma_job_t *j)
{
  for (shm_cma_job_t **pp = &sc->queue; *pp; pp = &(*pp)->next_job)
    if (*pp == j) {
      *pp = j->next_job;
      atomic_fetch_sub_explicit(&sc->njobs, 1, memory_order_relaxed);
      return;
    }
}

/* After a job a helper polls for the next one this long before it sleeps:
 * back-to-back large transfers then find it awake (a futex wake-up costs
 * tens of microseconds on a VM, a tenth of a 4 MiB transfer). */
#define HELPER_SPIN_NS 50000

static void *helper_main(void *arg)
{
  shm_ctx_t *sc = arg;
  pthread_mutex_lock(&sc->lock);
  while (!sc->stopping) {
    shm_cma_job_t *j = sc->queue;
    if (j == NULL) {
      pthread_mutex_unlock(&sc->lock);
      int64_t until = hixl__now_ns() + HELPER_SPIN_NS;
      unsigned it = 0;
      while (atomic_load_explicit(&sc->njobs, memory_order_relaxed) == 0 &&
             !atomic_load_explicit(&sc->stop_flag, memory_order_relaxed) &&
             (++it % 64 != 0 || hixl__now_ns() < until))
        __asm__ volatile("" ::: "memory");
      pthread_mutex_lock(&sc->lock);
      if (sc->queue == NULL && !sc->stopping) {
        sc->sleepers++;
        pthread_cond_wait(&sc->work, &sc->lock);
        sc->sleepers--;
      }
      continue;
    }
    j->users++;
    pthread_mutex_unlock(&sc->lock);
    run_pieces(j);
    pthread_mutex_lock(&sc->lock);
    unlink_job_locked(sc, j); /* every piece is taken: nobody else may join */
    if (--j->users == 0)
      pthread_cond_broadcast(&sc->idle);
  }
  pthread_mutex_unlock(&sc->lock);
  return NULL;
}

/* Start the helpers (once; sc->lock held).  false: none could be started. */
static bool start_helpers_locked(shm_ctx_t *sc)
{
  if (sc->started > 0 || sc->stopping || sc->no_helpers)
    return sc->started > 0;
  for (int i = 0; i < sc->cma_threads - 1; i++) {
    if (hixl__thread_start(&sc->threads[sc->started], "hixl-cma", helper_main, sc) != 0)
      break;
    sc->started++;
  }
  if (sc->started == 0) {
    hixl_warn("shm: cannot start a CMA helper thread; large transfers use one thread");
    sc->no_helpers = true; /* not tried again */
  }
  return sc->started > 0;
}

int hixl__shm_cma(hixl_peer_t *peer, bool write, struct iovec *l, struct iovec *r, size_t cnt,
                  size_t total)
{
  shm_ctx_t *sc = peer->ctx->tp[HIXL_TP_SHM];
  if (hixl_likely(total < sc->split_min || sc->cma_threads < 2))
    return cma_range(peer->remote_pid, write, l, r, cnt, 0, total, total);
  /* About four pieces per thread, at least 1 MiB (or half the threshold,
   * if lower) each: a system call per piece costs nothing beside it. */
  size_t floor = sc->split_min / 2 < ((size_t)1 << 20) ? sc->split_min / 2 : (size_t)1 << 20;
  size_t piece = total / ((size_t)sc->cma_threads * 4);
  if (piece < floor)
    piece = floor;
  piece = (piece + 4095) & ~(size_t)4095;
  shm_cma_job_t j = {.pid = peer->remote_pid,
                     .write = write,
                     .l = l,
                     .r = r,
                     .cnt = cnt,
                     .total = total,
                     .piece = piece,
                     .npieces = (total + piece - 1) / piece};
  pthread_mutex_lock(&sc->lock);
  if (j.npieces < 2 || !start_helpers_locked(sc)) {
    pthread_mutex_unlock(&sc->lock);
    return cma_range(peer->remote_pid, write, l, r, cnt, 0, total, total);
  }
  j.next_job = sc->queue;
  sc->queue = &j;
  atomic_fetch_add_explicit(&sc->njobs, 1, memory_order_relaxed);
  if (sc->sleepers > 0)
    pthread_cond_broadcast(&sc->work);
  pthread_mutex_unlock(&sc->lock);
  run_pieces(&j);
  /* Every piece is taken; wait for the helpers still copying theirs. */
  pthread_mutex_lock(&sc->lock);
  unlink_job_locked(sc, &j);
  while (j.users > 0)
    pthread_cond_wait(&sc->idle, &sc->lock);
  pthread_mutex_unlock(&sc->lock);
  return atomic_load(&j.err);
}

/* A size from the environment: bytes, with an optional k / m / g suffix. */
static bool env_size(const char *name, size_t lo, size_t hi, size_t *out)
{
  const char *e = getenv(name);
  if (e == NULL || *e == 0)
    return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(e, &end, 10);
  int shift = *end == 'k' || *end == 'K'   ? 10
              : *end == 'm' || *end == 'M' ? 20
              : *end == 'g' || *end == 'G' ? 30
                                           : 0;
  if (shift)
    end++;
  if (errno || end == e || *end != 0 || e[0] == '-' || v > (ULLONG_MAX >> shift) ||
      (v << shift) < lo || (v << shift) > hi) {
    hixl_warn("ignoring %s=%s (want %zu..%zu bytes; k, m, g suffixes)", name, e, lo, hi);
    return false;
  }
  *out = (size_t)(v << shift);
  return true;
}

hixl_status_t hixl__shm_ctx_init(hixl_ctx_t *ctx)
{
  shm_ctx_t *sc = calloc(1, sizeof(*sc));
  if (sc == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "shm: no memory");
  /* Defaults measured on a 2-vCPU VM (docs/performance.md#cma). */
  sc->cma_threads = (int)hixl__env_int("HIXL_SHM_CMA_THREADS", 1, SHM_CMA_MAX_THREADS, 2);
  sc->split_min = (size_t)4 << 20;
  sc->stage_bytes = (size_t)4 << 20;
  sc->cma_off = hixl__env_int("HIXL_SHM_CMA", 0, 1, 1) == 0;
  const char *e = getenv("HIXL_SHM_ALLOW_UIDS");
  if (e && hixl__parse_uids(e, sc->uids, SHM_MAX_UIDS, &sc->n_uids, &sc->uid_any) != HIXL_OK)
    hixl_warn("ignoring HIXL_SHM_ALLOW_UIDS=%s (%s): only peers of our uid and root are "
              "bound with",
              e, hixl_last_error());
  env_size("HIXL_SHM_CMA_SPLIT_MIN", (size_t)64 << 10, SIZE_MAX >> 1, &sc->split_min);
  env_size("HIXL_SHM_STAGE_BYTES", (size_t)64 << 10, (size_t)1 << 30, &sc->stage_bytes);
  sc->stage_bytes = (sc->stage_bytes + 4095) & ~(size_t)4095;
  /* Optional, like Open MPI: let any process of ours ptrace (and so CMA
   * into) this one where Yama's ptrace_scope 1 would refuse a sibling.
   * Process-wide and weaker isolation, hence off unless asked for. */
  e = getenv("HIXL_SHM_PTRACER");
  if (e && strcmp(e, "1") == 0) {
#ifdef PR_SET_PTRACER
    if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0)
      hixl_info("shm: prctl(PR_SET_PTRACER): %s", strerror(errno));
#endif
  }
  hixl_status_t st = hixl__shm_table_init(ctx, sc);
  if (st != HIXL_OK) {
    free(sc);
    return st;
  }
  pthread_mutex_init(&sc->lock, NULL);
  pthread_mutex_init(&sc->wlock, NULL);
  pthread_cond_init(&sc->work, NULL);
  pthread_cond_init(&sc->idle, NULL);
  ctx->tp[HIXL_TP_SHM] = sc;
  return HIXL_OK;
}

void hixl__shm_ctx_fini(hixl_ctx_t *ctx)
{
  shm_ctx_t *sc = ctx->tp[HIXL_TP_SHM];
  if (sc == NULL)
    return;
  pthread_mutex_lock(&sc->lock);
  sc->stopping = true;
  atomic_store(&sc->stop_flag, true);
  pthread_cond_broadcast(&sc->work);
  pthread_mutex_unlock(&sc->lock);
  for (int i = 0; i < sc->started; i++)
    pthread_join(sc->threads[i], NULL);
  pthread_mutex_destroy(&sc->lock);
  pthread_mutex_destroy(&sc->wlock);
  pthread_cond_destroy(&sc->work);
  pthread_cond_destroy(&sc->idle);
  hixl__shm_table_fini(ctx, sc);
  free(sc);
  ctx->tp[HIXL_TP_SHM] = NULL;
}

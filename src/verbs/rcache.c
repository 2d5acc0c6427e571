/* SPDX-License-Identifier: MIT */
/*
 * Registration cache: large local buffers that are not inside a hixl region
 * are registered (ibv_reg_mr) on first use and the registration is kept, so
 * a user who puts from the same malloc'd buffer again pays nothing.
 *
 * The danger of every such cache (UCX, libfabric, MPI have one each) is a
 * buffer that is freed and its address range mapped again: the old
 * registration pins the old pages, and a transfer through it would silently
 * move the wrong bytes.  Here each cached range is also registered with a
 * userfaultfd, and a monitor thread receives the kernel's UNMAP, REMOVE
 * (madvise DONTNEED/FREE: what free() does to large chunks) and REMAP
 * events for it and drops the entries they touch.  Where userfaultfd is not
 * available, there is no cache and such buffers go through bounce buffers:
 * slower, never wrong.
 *
 * No window: the kernel lets munmap (madvise, mremap) return as soon as the
 * monitor has read the event, not when it has dropped the entry, so the
 * monitor reads events only while holding the cache lock and drops the
 * entries before releasing it.  A lookup after munmap returns therefore
 * waits for the drop.  (libfabric's uffd monitor reads first and locks
 * after: a thread that maps new memory at the same address and posts from
 * it at once can hit the old entry there.  The conformance case `remap`
 * caught exactly that here under load.)  HIXL_VERBS_RCACHE=0 turns the
 * cache off.
 *
 * Entries are page-aligned, never overlap (an entry a new range overlaps is
 * dropped first), sorted by start, reference counted (every posted work
 * request holds one until it is retired, so an entry dropped while in flight
 * is deregistered only afterwards) and kept in LRU order under a byte limit
 * (HIXL_VERBS_RCACHE_MAX, default 1 GiB pinned).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "verbs_int.h"

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

struct vrb_rent {
  uintptr_t start, end;
  struct ibv_mr *mr;
  _Atomic int refs;        /* one for being in the cache, one per user */
  vrb_pins_t *pins;        /* counted in its context's budget until deregistered */
  vrb_rent_t *prev, *next; /* LRU, most recent first */
};

struct vrb_rcache {
  struct ibv_pd *pd;
  vrb_pins_t *pins;
  pthread_mutex_t lock;
  vrb_rent_t **v; /* sorted by start */
  size_t n, cap;
  vrb_rent_t *lru_head, *lru_tail;
  /* Registered bytes: changed under lock, read without it by hixl_ctx_stats
   * (which may run on the control thread under ctx->lock: never wait on a
   * lock held across ibv_reg_mr). */
  _Atomic size_t bytes;
  size_t max_bytes;
  int uffd, stop_fd;
  pthread_t monitor;
  bool monitor_started;
  _Atomic uint64_t hits, misses, invalidated, evicted;
  unsigned test_delay_us; /* HIXL_VERBS_RCACHE_TEST_DELAY_US: see monitor_main */
};

static size_t page_size(void)
{
  static size_t ps;
  if (ps == 0)
    ps = (size_t)sysconf(_SC_PAGESIZE);
  return ps;
}

/* ------------------------------------------------------------ entries */

void hixl__vrb_rcache_ref(vrb_rent_t *e) { atomic_fetch_add(&e->refs, 1); }

void hixl__vrb_rcache_put(vrb_rent_t *e)
{
  if (atomic_fetch_sub(&e->refs, 1) == 1) {
    ibv_dereg_mr(e->mr);
    hixl__vrb_unpin(e->pins, e->end - e->start);
    free(e);
  }
}

/* Index of the first entry whose end is above addr (lock held). */
static size_t find(const vrb_rcache_t *rc, uintptr_t addr)
{
  size_t lo = 0, hi = rc->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (rc->v[mid]->end <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void lru_unlink(vrb_rcache_t *rc, vrb_rent_t *e)
{
  if (e->prev)
    e->prev->next = e->next;
  else
    rc->lru_head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    rc->lru_tail = e->prev;
  e->prev = e->next = NULL;
}

static void lru_front(vrb_rcache_t *rc, vrb_rent_t *e)
{
  e->next = rc->lru_head;
  e->prev = NULL;
  if (rc->lru_head)
    rc->lru_head->prev = e;
  rc->lru_head = e;
  if (rc->lru_tail == NULL)
    rc->lru_tail = e;
}

/* Drop entry i from the cache (lock held): no longer watched, deregistered
 * when its last in-flight user retires. */
static void drop(vrb_rcache_t *rc, size_t i)
{
  vrb_rent_t *e = rc->v[i];
  memmove(rc->v + i, rc->v + i + 1, (rc->n - i - 1) * sizeof(rc->v[0]));
  rc->n--;
  lru_unlink(rc, e);
  rc->bytes -= e->end - e->start;
  /* Unregistering also wakes a thread blocked on a fault in the range. */
  struct uffdio_range r = {.start = e->start, .len = e->end - e->start};
  ioctl(rc->uffd, UFFDIO_UNREGISTER, &r); /* fails harmlessly once unmapped */
  hixl__vrb_rcache_put(e);
}

/* Drop the least recently used entry nobody uses (lock held): its
 * registration goes now.  false when every entry is in use. */
static bool evict_idle(vrb_rcache_t *rc)
{
  vrb_rent_t *old = rc->lru_tail;
  while (old && atomic_load(&old->refs) > 1)
    old = old->prev;
  if (old == NULL)
    return false;
  drop(rc, find(rc, old->start));
  atomic_fetch_add_explicit(&rc->evicted, 1, memory_order_relaxed);
  return true;
}

/* Would dropping every idle entry make room in the budget for a
 * registration of bytes (lock held)?  If not, none is dropped for it. */
static bool idle_would_do(vrb_rcache_t *rc, uint64_t bytes)
{
  uint64_t idle = 0;
  uint32_t n = 0;
  for (vrb_rent_t *x = rc->lru_head; x; x = x->next)
    if (atomic_load(&x->refs) == 1) {
      idle += x->end - x->start;
      n++;
    }
  const vrb_pins_t *p = rc->pins;
  uint64_t b = atomic_load(&p->bytes), m = atomic_load(&p->mrs);
  b = b > idle ? b - idle : 0;
  m = m > n ? m - n : 0;
  return m + 1 <= p->max_mrs && bytes <= p->max_bytes && b <= p->max_bytes - bytes;
}

/* Count a registration of bytes in the budget, dropping idle entries for
 * it when that makes enough room (lock held): hixl__vrb_pin_try's result. */
static int pin_locked(vrb_rcache_t *rc, uint64_t bytes)
{
  int pin = hixl__vrb_pin_try(rc->pins, bytes);
  if (pin != VRB_PIN_OK && idle_would_do(rc, bytes))
    while ((pin = hixl__vrb_pin_try(rc->pins, bytes)) != VRB_PIN_OK && evict_idle(rc))
      ;
  return pin;
}

int hixl__vrb_rcache_pin(vrb_rcache_t *rc, uint64_t bytes)
{
  pthread_mutex_lock(&rc->lock);
  int pin = pin_locked(rc, bytes);
  pthread_mutex_unlock(&rc->lock);
  return pin;
}

/* Drop every entry overlapping [s, e) (lock held). */
static size_t drop_range(vrb_rcache_t *rc, uintptr_t s, uintptr_t e)
{
  size_t n = 0;
  size_t i = find(rc, s);
  while (i < rc->n && rc->v[i]->start < e) {
    drop(rc, i);
    n++;
  }
  return n;
}

/* ------------------------------------------------------------ monitor */

static void *monitor_main(void *arg)
{
  vrb_rcache_t *rc = arg;
  struct pollfd pf[2] = {{.fd = rc->uffd, .events = POLLIN}, {.fd = rc->stop_fd, .events = POLLIN}};
  for (;;) {
    if (poll(pf, 2, -1) < 0 && errno != EINTR)
      break;
    if (pf[1].revents)
      break;
    /* Lock, then read (the fd is non-blocking): see the top. */
    struct uffd_msg msg[16];
    pthread_mutex_lock(&rc->lock);
    ssize_t got = read(rc->uffd, msg, sizeof(msg));
    if (got <= 0) {
      pthread_mutex_unlock(&rc->lock);
      continue;
    }
    /* For the tests: a monitor descheduled right after its read.  Without
     * the lock held across read and drop, `conformance remap` then fails
     * every time. */
    if (rc->test_delay_us)
      usleep(rc->test_delay_us);
    for (size_t i = 0; i < (size_t)got / sizeof(msg[0]); i++) {
      uintptr_t s = 0, e = 0;
      switch (msg[i].event) {
      case UFFD_EVENT_UNMAP:
        s = (uintptr_t)msg[i].arg.remove.start;
        e = (uintptr_t)msg[i].arg.remove.end;
        break;
      case UFFD_EVENT_REMOVE:
        s = (uintptr_t)msg[i].arg.remove.start;
        e = (uintptr_t)msg[i].arg.remove.end;
        break;
      case UFFD_EVENT_REMAP:
        s = (uintptr_t)msg[i].arg.remap.from;
        e = s + (uintptr_t)msg[i].arg.remap.len;
        break;
      case UFFD_EVENT_PAGEFAULT:
        /* A page of a cached range was discarded and touched again before
         * we saw the REMOVE: drop the entry; unregistering wakes the thread
         * (and a plain wake covers a range no longer ours). */
        s = (uintptr_t)msg[i].arg.pagefault.address & ~(uintptr_t)(page_size() - 1);
        e = s + page_size();
        break;
      default: continue;
      }
      atomic_fetch_add(&rc->invalidated, drop_range(rc, s, e));
      if (msg[i].event == UFFD_EVENT_PAGEFAULT) {
        struct uffdio_range r = {.start = s, .len = e - s};
        ioctl(rc->uffd, UFFDIO_WAKE, &r);
      }
    }
    pthread_mutex_unlock(&rc->lock);
  }
  return NULL;
}

/* ------------------------------------------------------------ cache */

vrb_rcache_t *hixl__vrb_rcache_new(struct ibv_pd *pd, vrb_pins_t *pins)
{
  const char *e = getenv("HIXL_VERBS_RCACHE");
  if (e && strcmp(e, "0") == 0)
    return NULL;
  int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
  if (fd < 0)
    fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    hixl_info("verbs: no userfaultfd (%s): no registration cache, large unregistered "
              "buffers go through bounce buffers",
              strerror(errno));
    return NULL;
  }
  struct uffdio_api api = {.api = UFFD_API,
                           .features = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE |
                                       UFFD_FEATURE_EVENT_REMAP};
  vrb_rcache_t *rc = NULL;
  if (ioctl(fd, UFFDIO_API, &api) != 0) {
    hixl_info("verbs: userfaultfd lacks unmap events (%s): no registration cache", strerror(errno));
    goto fail;
  }
  rc = calloc(1, sizeof(*rc));
  if (rc == NULL)
    goto fail;
  rc->pd = pd;
  rc->pins = pins;
  rc->uffd = fd;
  rc->stop_fd = eventfd(0, EFD_CLOEXEC);
  rc->max_bytes = 1ul << 30;
  e = getenv("HIXL_VERBS_RCACHE_MAX");
  long v;
  if (e && hixl__parse_int(e, 0, 1L << 50, &v) == 0)
    rc->max_bytes = (size_t)v;
  e = getenv("HIXL_VERBS_RCACHE_TEST_DELAY_US");
  if (e && hixl__parse_int(e, 0, 1000000, &v) == 0)
    rc->test_delay_us = (unsigned)v;
  pthread_mutex_init(&rc->lock, NULL);
  if (rc->stop_fd < 0 || hixl__thread_start(&rc->monitor, "hixl-rcache", monitor_main, rc) != 0)
    goto fail;
  rc->monitor_started = true;
  return rc;
fail:
  if (rc && rc->stop_fd >= 0)
    close(rc->stop_fd);
  free(rc);
  close(fd);
  return NULL;
}

void hixl__vrb_rcache_free(vrb_rcache_t *rc)
{
  if (rc == NULL)
    return;
  if (rc->monitor_started) {
    uint64_t one = 1;
    if (write(rc->stop_fd, &one, sizeof(one)) < 0)
      hixl_warn("verbs: cannot stop the registration-cache monitor");
    pthread_join(rc->monitor, NULL);
  }
  pthread_mutex_lock(&rc->lock);
  while (rc->n)
    drop(rc, rc->n - 1);
  pthread_mutex_unlock(&rc->lock);
  free(rc->v);
  close(rc->stop_fd);
  close(rc->uffd);
  pthread_mutex_destroy(&rc->lock);
  free(rc);
}

vrb_rent_t *hixl__vrb_rcache_get(vrb_rcache_t *rc, const void *p, size_t len, uint32_t *lkey_p)
{
  uintptr_t ps = page_size();
  uintptr_t s = (uintptr_t)p & ~(ps - 1);
  uintptr_t e = ((uintptr_t)p + len + ps - 1) & ~(ps - 1);
  if (e - s > rc->max_bytes)
    return NULL;
  pthread_mutex_lock(&rc->lock);
  size_t i = find(rc, s);
  if (i < rc->n && rc->v[i]->start <= s && e <= rc->v[i]->end) {
    vrb_rent_t *hit = rc->v[i];
    atomic_fetch_add(&hit->refs, 1);
    lru_unlink(rc, hit);
    lru_front(rc, hit);
    pthread_mutex_unlock(&rc->lock);
    atomic_fetch_add_explicit(&rc->hits, 1, memory_order_relaxed);
    *lkey_p = hit->mr->lkey;
    return hit;
  }
  atomic_fetch_add_explicit(&rc->misses, 1, memory_order_relaxed);
  /* Miss: what [s, e) overlaps goes (so nothing uffd-watched is inside the
   * range ibv_reg_mr is about to touch), then the oldest idle entries while
   * over the limit. */
  drop_range(rc, s, e);
  while (rc->bytes + (e - s) > rc->max_bytes && rc->lru_tail) {
    vrb_rent_t *old = rc->lru_tail;
    drop(rc, find(rc, old->start));
    atomic_fetch_add_explicit(&rc->evicted, 1, memory_order_relaxed);
  }
  /* And while the context's registration budget has no room: idle
   * entries go (an entry still in flight keeps its room until it retires),
   * unless all of them would not make enough; then the buffer is bounced
   * (NULL), never refused. */
  if (pin_locked(rc, e - s) != VRB_PIN_OK) {
    pthread_mutex_unlock(&rc->lock);
    return NULL;
  }
  vrb_rent_t *ent = NULL;
  if (rc->n == rc->cap) {
    size_t cap = rc->cap ? rc->cap * 2 : 64;
    vrb_rent_t **v = realloc(rc->v, cap * sizeof(*v));
    if (v == NULL)
      goto unpin;
    rc->v = v;
    rc->cap = cap;
  }
  ent = calloc(1, sizeof(*ent));
  if (ent == NULL)
    goto unpin;
  ent->start = s;
  ent->end = e;
  ent->pins = rc->pins;
  ent->mr = ibv_reg_mr(rc->pd, (void *)s, e - s, IBV_ACCESS_LOCAL_WRITE);
  if (ent->mr == NULL) { /* read-only or unpinnable memory: bounce it */
    free(ent);
    ent = NULL;
    goto unpin;
  }
  struct uffdio_register reg = {.range = {.start = s, .len = e - s},
                                .mode = UFFDIO_REGISTER_MODE_MISSING};
  if (ioctl(rc->uffd, UFFDIO_REGISTER, &reg) != 0) {
    /* Not anonymous or shmem memory (a file mapping, say): cannot watch. */
    hixl_debug("verbs: cannot watch [%#lx, %#lx) for unmaps (%s): not cached", (unsigned long)s,
               (unsigned long)e, strerror(errno));
    ibv_dereg_mr(ent->mr);
    free(ent);
    ent = NULL;
    goto unpin;
  }
  atomic_init(&ent->refs, 2); /* the cache's and the caller's */
  i = find(rc, s);
  memmove(rc->v + i + 1, rc->v + i, (rc->n - i) * sizeof(rc->v[0]));
  rc->v[i] = ent;
  rc->n++;
  rc->bytes += e - s;
  lru_front(rc, ent);
  *lkey_p = ent->mr->lkey;
  pthread_mutex_unlock(&rc->lock);
  return ent;
unpin:
  hixl__vrb_unpin(rc->pins, e - s);
  pthread_mutex_unlock(&rc->lock);
  return NULL;
}

void hixl__vrb_rcache_stats(vrb_rcache_t *rc, uint64_t out[5])
{
  if (rc == NULL) {
    memset(out, 0, 5 * sizeof(out[0]));
    return;
  }
  out[0] = atomic_load_explicit(&rc->hits, memory_order_relaxed);
  out[1] = atomic_load_explicit(&rc->misses, memory_order_relaxed);
  out[2] = atomic_load_explicit(&rc->evicted, memory_order_relaxed);
  out[3] = atomic_load_explicit(&rc->invalidated, memory_order_relaxed);
  out[4] = atomic_load_explicit(&rc->bytes, memory_order_relaxed);
}

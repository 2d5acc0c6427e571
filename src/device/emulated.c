/* SPDX-License-Identifier: MIT */
/*
 * The emulated device backend: device memory without a device, so that
 * every device code path of hixl runs where there is no GPU or NPU (CI).
 *
 * An allocation is a memfd mapped twice:
 *   - the device address the user gets, mapped PROT_NONE: a CPU load or
 *     store there faults, as one into GPU memory would, so any code path
 *     that touches device memory without going through this shim is caught
 *     by the tests instead of silently working;
 *   - a private read-write view, locked in memory (pinned, best effort:
 *     mlock fails quietly under a small RLIMIT_MEMLOCK), that only the
 *     shim's copy, IPC and NIC calls use.
 * IPC hands the memfd to the importer, which maps it the same two ways.
 * The NIC address of a device address is its place in the view: what a
 * peer-memory driver gives the HCA for GPU memory.
 *
 * HIXL_EMULATED_DEVICES: how many devices there are (default 2); memory is
 * always allocated on device 0 (the "current" device).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"

typedef struct emu_alloc {
  uintptr_t base; /* the PROT_NONE device address */
  size_t len;     /* bytes mapped (page-rounded) */
  uint8_t *view;  /* the read-write view */
  int fd;         /* the memfd (own allocations), -1 for imports */
  int device;
  bool locked;
} emu_alloc_t;

static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_INITIALIZER;
static emu_alloc_t *g_tab; /* sorted by base */
static size_t g_n, g_cap;
static int g_count = 2;

static hixl_status_t emu_init(void)
{
  const char *s = getenv("HIXL_EMULATED_DEVICES");
  if (s && *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 1 || v > 64)
      return hixl__err(HIXL_ERR_NO_DEVICE, "HIXL_EMULATED_DEVICES=%s is not in 1..64", s);
    g_count = (int)v;
  }
  return HIXL_OK;
}

static int emu_count(void) { return g_count; }

static hixl_status_t emu_current(int *device_p)
{
  *device_p = 0;
  return HIXL_OK;
}

/* Index of the allocation holding p, or -1 (g_lock held). */
static ssize_t find_locked(uintptr_t p)
{
  size_t lo = 0, hi = g_n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (g_tab[mid].base <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0 || p >= g_tab[lo - 1].base + g_tab[lo - 1].len)
    return -1;
  return (ssize_t)lo - 1;
}

static hixl_status_t insert(const emu_alloc_t *a)
{
  pthread_rwlock_wrlock(&g_lock);
  if (g_n == g_cap) {
    size_t cap = g_cap ? g_cap * 2 : 16;
    emu_alloc_t *t = realloc(g_tab, cap * sizeof(*t));
    if (t == NULL) {
      pthread_rwlock_unlock(&g_lock);
      return hixl__err(HIXL_ERR_NOMEM, "emulated device: no memory for the allocation table");
    }
    g_tab = t;
    g_cap = cap;
  }
  size_t i = g_n;
  while (i > 0 && g_tab[i - 1].base > a->base) {
    g_tab[i] = g_tab[i - 1];
    i--;
  }
  g_tab[i] = *a;
  g_n++;
  pthread_rwlock_unlock(&g_lock);
  hixl__dev_mark_active();
  return HIXL_OK;
}

/* Remove the allocation starting at base; false when there is none. */
static bool take(uintptr_t base, emu_alloc_t *out)
{
  pthread_rwlock_wrlock(&g_lock);
  ssize_t i = find_locked(base);
  bool ok = i >= 0 && g_tab[i].base == base;
  if (ok) {
    *out = g_tab[i];
    memmove(g_tab + i, g_tab + i + 1, (g_n - (size_t)i - 1) * sizeof(*g_tab));
    g_n--;
  }
  pthread_rwlock_unlock(&g_lock);
  return ok;
}

static void unmap(const emu_alloc_t *a)
{
  if (a->locked)
    munlock(a->view, a->len);
  munmap(a->view, a->len);
  munmap((void *)a->base, a->len);
  if (a->fd >= 0)
    close(a->fd);
}

/* Map fd the two ways (see the top). */
static hixl_status_t map2(int fd, size_t len, int device, bool lock, emu_alloc_t *a)
{
  void *dev = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
  if (dev == MAP_FAILED)
    return hixl__err(HIXL_ERR_NOMEM, "emulated device: mmap of %zu bytes: %s", len,
                     strerror(errno));
  void *view = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (view == MAP_FAILED) {
    int e = errno;
    munmap(dev, len);
    return hixl__err(HIXL_ERR_NOMEM, "emulated device: mmap of %zu bytes: %s", len, strerror(e));
  }
  *a = (emu_alloc_t){(uintptr_t)dev, len, view, -1, device, false};
  if (lock) {
    a->locked = mlock(view, len) == 0;
    if (!a->locked)
      hixl_debug("emulated device: %zu bytes not pinned (mlock: %s)", len, strerror(errno));
  }
  return HIXL_OK;
}

static hixl_status_t emu_alloc(int device, size_t len, void **p_p)
{
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (len > SIZE_MAX - page)
    return hixl__err(HIXL_ERR_NOMEM, "emulated device: %zu bytes is too large", len);
  size_t map_len = (len + page - 1) & ~(page - 1);
  int fd = hixl__memfd("hixl-device", map_len);
  if (fd < 0)
    return hixl__err(HIXL_ERR_NOMEM, "emulated device: memfd of %zu bytes: %s", map_len,
                     strerror(errno));
  emu_alloc_t a;
  hixl_status_t st = map2(fd, map_len, device, true, &a);
  if (st != HIXL_OK) {
    close(fd);
    return st;
  }
  a.fd = fd;
  if ((st = insert(&a)) != HIXL_OK) {
    unmap(&a);
    return st;
  }
  *p_p = (void *)a.base;
  return HIXL_OK;
}

static void emu_free(void *p)
{
  emu_alloc_t a;
  if (take((uintptr_t)p, &a))
    unmap(&a);
}

static bool emu_lookup(const void *p, hixl_dev_range_t *r)
{
  pthread_rwlock_rdlock(&g_lock);
  ssize_t i = find_locked((uintptr_t)p);
  if (i >= 0)
    *r = (hixl_dev_range_t){g_tab[i].base, g_tab[i].len, g_tab[i].device};
  pthread_rwlock_unlock(&g_lock);
  return i >= 0;
}

/* Where the CPU may touch [p, p+len): p itself for host memory, its place
 * in the view for device memory; NULL when it runs past its allocation. */
static uint8_t *cpu_addr(const void *p, size_t len)
{
  uint8_t *out = (uint8_t *)(uintptr_t)p;
  pthread_rwlock_rdlock(&g_lock);
  ssize_t i = find_locked((uintptr_t)p);
  if (i >= 0) {
    size_t off = (uintptr_t)p - g_tab[i].base;
    out = len <= g_tab[i].len - off ? g_tab[i].view + off : NULL;
  }
  pthread_rwlock_unlock(&g_lock);
  return out;
}

static hixl_status_t emu_copy(void *dst, const void *src, size_t len)
{
  uint8_t *d = cpu_addr(dst, len), *s = cpu_addr(src, len);
  if (d == NULL || s == NULL)
    return hixl__err(HIXL_ERR_INVALID,
                     "emulated device: copy of %zu bytes runs past the "
                     "device allocation of its %s",
                     len, d == NULL ? "destination" : "source");
  /* Both views of one allocation may overlap even when the addresses do
   * not look alike: memmove is always right. */
  uintptr_t x = (uintptr_t)d, y = (uintptr_t)s;
  if (x < y + len && y < x + len)
    memmove(d, s, len);
  else
    hixl__copy(d, s, len);
  return HIXL_OK;
}

static hixl_status_t emu_ipc_export(const hixl_dev_range_t *r, const void *p, size_t len,
                                    pid_t importer, hixl_dev_ipc_t *h)
{
  (void)importer;
  (void)len;
  pthread_rwlock_rdlock(&g_lock);
  ssize_t i = find_locked(r->base);
  int fd = i >= 0 && g_tab[i].fd >= 0 ? fcntl(g_tab[i].fd, F_DUPFD_CLOEXEC, 0) : -1;
  pthread_rwlock_unlock(&g_lock);
  if (fd < 0)
    return hixl__err(HIXL_ERR_NOT_REGISTERED,
                     "emulated device: %#lx is not an allocation of this process",
                     (unsigned long)r->base);
  h->fd = fd; /* the whole allocation */
  h->len = 0;
  h->alloc_len = r->len;
  h->offset = (uintptr_t)p - r->base;
  return HIXL_OK;
}

static hixl_status_t emu_ipc_import(const hixl_dev_ipc_t *h, void **base_p)
{
  hixl_status_t rc;
  emu_alloc_t a;
  /* The exporter is a peer: its memfd must be sealed against shrinking (a
   * truncation under our mapping would SIGBUS every later copy) and as long
   * as it says (hixl__fd_sealed, as shm checks every memfd it maps). */
  if (h->fd < 0 || h->alloc_len == 0 || h->alloc_len > SIZE_MAX || h->device < 0 ||
      h->device >= g_count) {
    rc = hixl__err(HIXL_ERR_TRANSPORT, "emulated device: a malformed IPC handle");
  } else if (!hixl__fd_sealed(h->fd, h->alloc_len)) {
    rc = hixl__err(HIXL_ERR_TRANSPORT,
                   "emulated device: the exporter's memfd is not sealed "
                   "against shrinking, or shorter than the %llu bytes it claims",
                   (unsigned long long)h->alloc_len);
  } else if ((rc = map2(h->fd, (size_t)h->alloc_len, h->device, false, &a)) == HIXL_OK &&
             (rc = insert(&a)) != HIXL_OK) {
    unmap(&a);
  }
  if (h->fd >= 0)
    close(h->fd);
  if (rc == HIXL_OK)
    *base_p = (void *)a.base;
  return rc;
}

static void emu_ipc_close(void *base) { emu_free(base); }

static void *emu_nic_addr(const void *p) { return cpu_addr(p, 1); }

const hixl_dev_ops_t hixl__dev_emulated_ops = {
    .size = sizeof(hixl_dev_ops_t),
    .name = "emulated",
    .init = emu_init,
    .count = emu_count,
    .current = emu_current,
    .alloc = emu_alloc,
    .free = emu_free,
    .lookup = emu_lookup,
    .copy = emu_copy,
    .ipc_export = emu_ipc_export,
    .ipc_import = emu_ipc_import,
    .ipc_close = emu_ipc_close,
    .dmabuf = NULL,
    .nic_addr = emu_nic_addr,
};

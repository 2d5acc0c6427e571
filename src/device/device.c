/* SPDX-License-Identifier: MIT */
/*
 * The device-memory shim: backend selection, the calls the core and the
 * transports make, and the public hixl_mem_copy / hixl_mem_query /
 * hixl_device_backend.  See device.h for the backends.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "backend.h"

_Atomic bool hixl__dev_any;

static const hixl_dev_ops_t *g_dev;         /* the backend, or NULL */
static char g_why[256] = "not initialised"; /* why there is none */
static bool g_rdma = true;                  /* HIXL_DEVICE_RDMA */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static bool try_backend(const hixl_dev_ops_t *ops, char *why, size_t cap, size_t *used)
{
  hixl_status_t st = ops->init();
  if (st == HIXL_OK && ops->count() > 0) {
    g_dev = ops;
    return true;
  }
  /* The backends' messages start with their names. */
  *used += (size_t)snprintf(why + *used, *used < cap ? cap - *used : 0, "%s%s%s", *used ? "; " : "",
                            st == HIXL_OK ? ops->name : "",
                            st == HIXL_OK ? ": no devices" : hixl_last_error());
  return false;
}

static void dev_select(void)
{
  const char *want = getenv("HIXL_DEVICE");
  const char *rdma = getenv("HIXL_DEVICE_RDMA");
  g_rdma = !(rdma && strcmp(rdma, "0") == 0);
  char why[sizeof(g_why)] = "";
  size_t used = 0;
  if (want == NULL || *want == 0 || strcasecmp(want, "auto") == 0) {
    if (!try_backend(&hixl__dev_cuda_ops, why, sizeof(why), &used) &&
        !try_backend(&hixl__dev_ascend_ops, why, sizeof(why), &used))
      try_backend(&hixl__dev_emulated_ops, why, sizeof(why), &used);
  } else if (strcasecmp(want, "none") == 0) {
    snprintf(why, sizeof(why), "HIXL_DEVICE=none");
  } else {
    const hixl_dev_ops_t *all[] = {&hixl__dev_cuda_ops, &hixl__dev_ascend_ops,
                                   &hixl__dev_emulated_ops};
    const hixl_dev_ops_t *ops = NULL;
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
      if (strcasecmp(want, all[i]->name) == 0)
        ops = all[i];
    if (ops == NULL)
      snprintf(why, sizeof(why), "HIXL_DEVICE=%s is not cuda, ascend, emulated, auto or none",
               want);
    else
      try_backend(ops, why, sizeof(why), &used);
  }
  if (g_dev) {
    hixl_debug("device backend: %s (%d device%s)", g_dev->name, g_dev->count(),
               g_dev->count() == 1 ? "" : "s");
    /* A real runtime can hand out device pointers without us: look at every
     * buffer from now on.  Emulated memory exists only once allocated. */
    if (g_dev != &hixl__dev_emulated_ops)
      hixl__dev_mark_active();
  } else {
    snprintf(g_why, sizeof(g_why), "%s", why);
    hixl_debug("no device backend: %s", g_why);
  }
}

void hixl__dev_init(void) { pthread_once(&g_once, dev_select); }

const hixl_dev_ops_t *hixl__dev_backend(void)
{
  hixl__dev_init();
  return g_dev;
}

void hixl__dev_mark_active(void)
{
  atomic_store_explicit(&hixl__dev_any, true, memory_order_release);
}

static hixl_status_t no_backend(const char *fn)
{
  return hixl__err(HIXL_ERR_NO_DEVICE, "%s: no device backend (%s)", fn, g_why);
}

bool hixl__dev_lookup(const void *p, hixl_dev_range_t *r)
{
  hixl_dev_range_t tmp;
  return g_dev && p && g_dev->lookup(p, r ? r : &tmp);
}

hixl_status_t hixl__dev_check_local(const char *fn, const void *p, size_t len)
{
  hixl_dev_range_t r;
  if (!hixl__dev_lookup(p, &r))
    return HIXL_OK;
  if (len > r.base + r.len - (uintptr_t)p)
    return hixl__err(HIXL_ERR_INVALID,
                     "%s: local device buffer %p + %zu runs past its allocation (%#lx + %zu, "
                     "device %d)",
                     fn, p, len, (unsigned long)r.base, r.len, r.device);
  return HIXL_OK;
}

hixl_status_t hixl__dev_copy(void *dst, const void *src, size_t len)
{
  if (g_dev == NULL) { /* both host: nothing else can exist */
    memmove(dst, src, len);
    return HIXL_OK;
  }
  return g_dev->copy(dst, src, len);
}

hixl_status_t hixl__dev_alloc(size_t len, int *device_p, void **p_p)
{
  hixl__dev_init();
  if (g_dev == NULL)
    return no_backend("hixl_mem_alloc(HIXL_MEM_DEVICE)");
  int dev;
  hixl_status_t st = g_dev->current(&dev);
  if (st != HIXL_OK)
    return st;
  if ((st = g_dev->alloc(dev, len, p_p)) != HIXL_OK)
    return st;
  *device_p = dev;
  return HIXL_OK;
}

void hixl__dev_free(void *p)
{
  if (g_dev)
    g_dev->free(p);
}

hixl_status_t hixl__dev_check_reg(const char *fn, const void *p, size_t len, int device)
{
  hixl__dev_init();
  if (g_dev == NULL)
    return no_backend(fn);
  int n = g_dev->count();
  if (device < 0 || device >= n)
    return hixl__err(HIXL_ERR_NO_DEVICE, "%s: no device %d (the %s backend has %d: 0..%d)", fn,
                     device, g_dev->name, n, n - 1);
  hixl_dev_range_t r;
  if (!g_dev->lookup(p, &r))
    return hixl__err(HIXL_ERR_INVALID, "%s: %p is host memory, not %s device memory", fn, p,
                     g_dev->name);
  if (r.device != device)
    return hixl__err(HIXL_ERR_INVALID, "%s: %p is memory of device %d, not of device %d", fn, p,
                     r.device, device);
  if (len > r.base + r.len - (uintptr_t)p)
    return hixl__err(HIXL_ERR_INVALID, "%s: %p + %zu runs past its device allocation (%#lx + %zu)",
                     fn, p, len, (unsigned long)r.base, r.len);
  return HIXL_OK;
}

hixl_status_t hixl__dev_ipc_export(const void *p, size_t len, pid_t importer, hixl_dev_ipc_t *h,
                                   uint64_t *off_p)
{
  hixl_dev_range_t r;
  if (g_dev == NULL || !g_dev->lookup(p, &r) || len > r.base + r.len - (uintptr_t)p)
    return hixl__err(HIXL_ERR_NOT_REGISTERED, "device IPC: %p + %zu is not device memory", p, len);
  memset(h, 0, sizeof(*h));
  h->fd = -1;
  hixl_status_t st = g_dev->ipc_export(&r, p, len, importer, h);
  if (st != HIXL_OK)
    return st;
  h->device = r.device;
  *off_p = h->offset;
  return HIXL_OK;
}

hixl_status_t hixl__dev_ipc_import(hixl_dev_ipc_t *h, void **base_p)
{
  hixl__dev_init();
  if (g_dev == NULL) {
    if (h->fd >= 0)
      close(h->fd);
    h->fd = -1;
    return no_backend("device IPC import");
  }
  hixl_status_t st = g_dev->ipc_import(h, base_p);
  h->fd = -1;
  return st;
}

void hixl__dev_ipc_close(void *base)
{
  if (g_dev && base)
    g_dev->ipc_close(base);
}

bool hixl__dev_rdma_allowed(void) { return g_rdma; }

hixl_status_t hixl__dev_dmabuf(const void *p, size_t len, int *fd_p, uint64_t *off_p)
{
  if (g_dev == NULL || g_dev->dmabuf == NULL || !g_rdma)
    return HIXL_ERR_UNSUPPORTED;
  return g_dev->dmabuf(p, len, fd_p, off_p);
}

void *hixl__dev_nic_addr(const void *p)
{
  if (g_dev == NULL || g_dev->nic_addr == NULL || !g_rdma)
    return NULL;
  return g_dev->nic_addr(p);
}

/* ------------------------------------------------------------ public */

hixl_status_t hixl_mem_copy(void *dst, const void *src, size_t len)
{
  if (dst == NULL || src == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_mem_copy: NULL %s", dst == NULL ? "dst" : "src");
  if (len == 0)
    return HIXL_OK;
  if ((uintptr_t)dst + len < (uintptr_t)dst || (uintptr_t)src + len < (uintptr_t)src)
    return hixl__err(HIXL_ERR_INVALID, "hixl_mem_copy: %zu bytes wrap the address space", len);
  hixl__dev_init();
  hixl_status_t st = hixl__dev_check_local("hixl_mem_copy (dst)", dst, len);
  if (st == HIXL_OK)
    st = hixl__dev_check_local("hixl_mem_copy (src)", src, len);
  if (st != HIXL_OK)
    return st;
  return hixl__dev_copy(dst, src, len);
}

hixl_status_t hixl_mem_query(const void *addr, hixl_mem_kind_t *kind_p, int *device_p)
{
  if (addr == NULL || kind_p == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_mem_query: NULL %s", addr == NULL ? "addr" : "kind_p");
  hixl__dev_init();
  hixl_dev_range_t r;
  bool dev = hixl__dev_lookup(addr, &r);
  *kind_p = dev ? HIXL_MEM_DEVICE : HIXL_MEM_HOST;
  if (device_p)
    *device_p = dev ? r.device : -1;
  return HIXL_OK;
}

const char *hixl_device_backend(void)
{
  hixl__dev_init();
  return g_dev ? g_dev->name : "none";
}

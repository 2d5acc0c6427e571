/* SPDX-License-Identifier: MIT */
/*
 * The Ascend backend: the AscendCL runtime (libascendcl.so), found with
 * dlopen at run time.  Written against the CANN 8 AscendCL reference; the
 * types and constants used are declared below with its values.  It has
 * never run on an Ascend NPU (docs/device.md says what has).
 *
 *   lookup      aclrtPointerGetAttributes (location type, device id); the
 *               extent comes from hixl's own table of the allocations it
 *               made, imported or had registered (AscendCL has no call for
 *               "the allocation holding this address")
 *   copy        aclrtMemcpy with the direction from lookup
 *   IPC         aclrtIpcMemGetExportKey / aclrtIpcMemSetImportPid (the
 *               importer's pid must be allowed first) / aclrtIpcMemImportByKey
 *   NIC         none: RoCE on Ascend goes through HCCS/RoCE inside the NPU,
 *               not a host HCA; verbs stages (docs/device.md)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

typedef int aclError;
enum {
  ACL_SUCCESS = 0,
  ACL_ERROR_REPEAT_INITIALIZE = 100002,
  ACL_MEM_MALLOC_HUGE_FIRST = 0,
  ACL_MEMCPY_HOST_TO_HOST = 0,
  ACL_MEMCPY_HOST_TO_DEVICE = 1,
  ACL_MEMCPY_DEVICE_TO_HOST = 2,
  ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
  ACL_MEM_LOCATION_TYPE_DEVICE = 1,
};
typedef struct {
  uint32_t id;
  uint32_t type;
} acl_mem_location_t;
typedef struct {
  acl_mem_location_t location;
  uint64_t page_size;
} acl_ptr_attributes_t;

static struct {
  void *lib;
  aclError (*Init)(const char *);
  aclError (*GetDeviceCount)(uint32_t *);
  aclError (*GetDevice)(int32_t *);
  aclError (*SetDevice)(int32_t);
  aclError (*Malloc)(void **, size_t, int);
  aclError (*Free)(void *);
  aclError (*Memcpy)(void *, size_t, const void *, size_t, int);
  aclError (*PointerGetAttributes)(const void *, acl_ptr_attributes_t *);
  aclError (*IpcMemGetExportKey)(void *, size_t, char *, size_t, uint64_t);
  aclError (*IpcMemSetImportPid)(const char *, int32_t *, size_t);
  aclError (*IpcMemImportByKey)(void **, const char *, uint64_t);
  aclError (*IpcMemClose)(const char *);
  const char *(*GetRecentErrMsg)(void);
  uint32_t count;
} acl;

/* Ranges hixl knows the extent of (its allocations, imports, registered
 * ranges), for lookup. */
typedef struct {
  uintptr_t base;
  size_t len;
  int device;
  bool imported;
  char key[HIXL_DEV_IPC_BYTES];
} asc_range_t;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static asc_range_t *g_tab;
static size_t g_n, g_cap;

static hixl_status_t acl_err(hixl_status_t st, const char *call, aclError e)
{
  const char *m = acl.GetRecentErrMsg ? acl.GetRecentErrMsg() : NULL;
  return hixl__err(st, "ascend: %s failed (%d)%s%s", call, e, m ? ": " : "", m ? m : "");
}

static hixl_status_t asc_init(void)
{
  acl.lib = dlopen("libascendcl.so", RTLD_NOW | RTLD_LOCAL);
  if (acl.lib == NULL)
    return hixl__err(HIXL_ERR_NO_DEVICE, "ascend: libascendcl.so not found (%s)", dlerror());
  struct {
    void **p;
    const char *name;
  } syms[] = {
      {(void **)&acl.Init, "aclInit"},
      {(void **)&acl.GetDeviceCount, "aclrtGetDeviceCount"},
      {(void **)&acl.GetDevice, "aclrtGetDevice"},
      {(void **)&acl.SetDevice, "aclrtSetDevice"},
      {(void **)&acl.Malloc, "aclrtMalloc"},
      {(void **)&acl.Free, "aclrtFree"},
      {(void **)&acl.Memcpy, "aclrtMemcpy"},
      {(void **)&acl.PointerGetAttributes, "aclrtPointerGetAttributes"},
      {(void **)&acl.IpcMemGetExportKey, "aclrtIpcMemGetExportKey"},
      {(void **)&acl.IpcMemSetImportPid, "aclrtIpcMemSetImportPid"},
      {(void **)&acl.IpcMemImportByKey, "aclrtIpcMemImportByKey"},
      {(void **)&acl.IpcMemClose, "aclrtIpcMemClose"},
  };
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++)
    if ((*syms[i].p = dlsym(acl.lib, syms[i].name)) == NULL) {
      hixl_status_t st =
          hixl__err(HIXL_ERR_NO_DEVICE, "ascend: libascendcl.so lacks %s", syms[i].name);
      dlclose(acl.lib);
      memset(&acl, 0, sizeof(acl));
      return st;
    }
  *(void **)&acl.GetRecentErrMsg = dlsym(acl.lib, "aclGetRecentErrMsg");
  aclError e = acl.Init(NULL);
  if (e != ACL_SUCCESS && e != ACL_ERROR_REPEAT_INITIALIZE) {
    hixl_status_t st = acl_err(HIXL_ERR_NO_DEVICE, "aclInit", e);
    dlclose(acl.lib);
    memset(&acl, 0, sizeof(acl));
    return st;
  }
  if ((e = acl.GetDeviceCount(&acl.count)) != ACL_SUCCESS)
    acl.count = 0;
  return HIXL_OK;
}

static int asc_count(void) { return (int)acl.count; }

static hixl_status_t asc_current(int *device_p)
{
  int32_t d = -1;
  if (acl.GetDevice(&d) != ACL_SUCCESS || d < 0) {
    /* No device set on this thread: device 0, as the runtime would. */
    aclError e = acl.SetDevice(0);
    if (e != ACL_SUCCESS)
      return acl_err(HIXL_ERR_NO_DEVICE, "aclrtSetDevice(0)", e);
    d = 0;
  }
  *device_p = d;
  return HIXL_OK;
}

static hixl_status_t remember(uintptr_t base, size_t len, int device, bool imported,
                              const char *key)
{
  pthread_mutex_lock(&g_lock);
  if (g_n == g_cap) {
    size_t cap = g_cap ? 2 * g_cap : 16;
    asc_range_t *t = realloc(g_tab, cap * sizeof(*t));
    if (t == NULL) {
      pthread_mutex_unlock(&g_lock);
      return hixl__err(HIXL_ERR_NOMEM, "ascend: no memory for the range table");
    }
    g_tab = t;
    g_cap = cap;
  }
  asc_range_t *r = &g_tab[g_n++];
  *r = (asc_range_t){base, len, device, imported, ""};
  if (key)
    snprintf(r->key, sizeof(r->key), "%s", key);
  pthread_mutex_unlock(&g_lock);
  return HIXL_OK;
}

static bool forget(uintptr_t base, asc_range_t *out)
{
  pthread_mutex_lock(&g_lock);
  for (size_t i = 0; i < g_n; i++)
    if (g_tab[i].base == base) {
      *out = g_tab[i];
      g_tab[i] = g_tab[--g_n];
      pthread_mutex_unlock(&g_lock);
      return true;
    }
  pthread_mutex_unlock(&g_lock);
  return false;
}

static hixl_status_t asc_alloc(int device, size_t len, void **p_p)
{
  void *p = NULL;
  aclError e = acl.Malloc(&p, len, ACL_MEM_MALLOC_HUGE_FIRST);
  if (e != ACL_SUCCESS)
    return acl_err(HIXL_ERR_NOMEM, "aclrtMalloc", e);
  hixl_status_t st = remember((uintptr_t)p, len, device, false, NULL);
  if (st != HIXL_OK) {
    acl.Free(p);
    return st;
  }
  *p_p = p;
  return HIXL_OK;
}

static void asc_free(void *p)
{
  asc_range_t r;
  if (forget((uintptr_t)p, &r))
    acl.Free(p);
}

static bool asc_lookup(const void *p, hixl_dev_range_t *out)
{
  acl_ptr_attributes_t a;
  if (acl.PointerGetAttributes(p, &a) != ACL_SUCCESS ||
      a.location.type != ACL_MEM_LOCATION_TYPE_DEVICE)
    return false;
  /* The extent: a range hixl knows, else from p to the end of the address
   * space (the runtime checks the copies themselves). */
  *out = (hixl_dev_range_t){(uintptr_t)p, SIZE_MAX - (uintptr_t)p, (int)a.location.id};
  pthread_mutex_lock(&g_lock);
  for (size_t i = 0; i < g_n; i++)
    if ((uintptr_t)p >= g_tab[i].base && (uintptr_t)p - g_tab[i].base < g_tab[i].len)
      *out = (hixl_dev_range_t){g_tab[i].base, g_tab[i].len, g_tab[i].device};
  pthread_mutex_unlock(&g_lock);
  return true;
}

static hixl_status_t asc_copy(void *dst, const void *src, size_t len)
{
  hixl_dev_range_t r;
  bool dd = asc_lookup(dst, &r), sd = asc_lookup(src, &r);
  int kind = dd && sd ? ACL_MEMCPY_DEVICE_TO_DEVICE
             : dd     ? ACL_MEMCPY_HOST_TO_DEVICE
             : sd     ? ACL_MEMCPY_DEVICE_TO_HOST
                      : ACL_MEMCPY_HOST_TO_HOST;
  aclError e = acl.Memcpy(dst, len, src, len, kind);
  return e == ACL_SUCCESS ? HIXL_OK : acl_err(HIXL_ERR_TRANSPORT, "aclrtMemcpy", e);
}

static hixl_status_t asc_ipc_export(const hixl_dev_range_t *rng, const void *p, size_t len,
                                    pid_t importer, hixl_dev_ipc_t *h)
{
  (void)rng;
  char key[HIXL_DEV_IPC_BYTES] = "";
  aclError e = acl.IpcMemGetExportKey((void *)(uintptr_t)p, len, key, sizeof(key), 0);
  if (e != ACL_SUCCESS)
    return acl_err(HIXL_ERR_TRANSPORT, "aclrtIpcMemGetExportKey", e);
  int32_t pid = (int32_t)importer;
  if ((e = acl.IpcMemSetImportPid(key, &pid, 1)) != ACL_SUCCESS)
    return acl_err(HIXL_ERR_TRANSPORT, "aclrtIpcMemSetImportPid", e);
  memcpy(h->bytes, key, sizeof(key));
  h->len = (uint32_t)strnlen(key, sizeof(key));
  h->fd = -1;
  h->alloc_len = len; /* just the range */
  h->offset = 0;
  return HIXL_OK;
}

static hixl_status_t asc_ipc_import(const hixl_dev_ipc_t *h, void **base_p)
{
  char key[HIXL_DEV_IPC_BYTES + 1];
  if (h->len == 0 || h->len >= sizeof(key) - 1)
    return hixl__err(HIXL_ERR_TRANSPORT, "ascend: a malformed IPC key");
  memcpy(key, h->bytes, h->len);
  key[h->len] = 0;
  void *p = NULL;
  aclError e = acl.IpcMemImportByKey(&p, key, 0);
  if (e != ACL_SUCCESS)
    return acl_err(HIXL_ERR_TRANSPORT, "aclrtIpcMemImportByKey", e);
  hixl_status_t st = remember((uintptr_t)p, (size_t)h->alloc_len, h->device, true, key);
  if (st != HIXL_OK) {
    acl.IpcMemClose(key);
    return st;
  }
  *base_p = p;
  return HIXL_OK;
}

static void asc_ipc_close(void *base)
{
  asc_range_t r;
  if (forget((uintptr_t)base, &r) && r.imported)
    acl.IpcMemClose(r.key);
}

const hixl_dev_ops_t hixl__dev_ascend_ops = {
    .size = sizeof(hixl_dev_ops_t),
    .name = "ascend",
    .init = asc_init,
    .count = asc_count,
    .current = asc_current,
    .alloc = asc_alloc,
    .free = asc_free,
    .lookup = asc_lookup,
    .copy = asc_copy,
    .ipc_export = asc_ipc_export,
    .ipc_import = asc_ipc_import,
    .ipc_close = asc_ipc_close,
    .dmabuf = NULL,
    .nic_addr = NULL,
};

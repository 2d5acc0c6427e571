/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend: the driver API (libcuda.so.1), found with dlopen at run
 * time.  No CUDA header is needed to build it: the handful of types and
 * constants used are declared below with the values of cuda.h (they are
 * part of the driver's ABI).
 *
 *   lookup      cuPointerGetAttribute(MEMORY_TYPE, DEVICE_ORDINAL) and
 *               cuMemGetAddressRange (host pointers give INVALID_VALUE)
 *   copy        cuMemcpy (unified addressing: any direction), then a
 *               synchronisation of the legacy stream, since device-to-device
 *               copies return before they finish
 *   IPC         cuIpcGetMemHandle / cuIpcOpenMemHandle of the allocation
 *   NIC         cuMemGetHandleForAddressRange (dmabuf, CUDA 11.7+) for
 *               ibv_reg_dmabuf_mr; the device address itself for ibv_reg_mr
 *               (works when nvidia-peermem is loaded)
 *
 * Every thread that calls in gets the primary context of device 0 made
 * current if it has none (the runtime API does the same lazily).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct {
  char reserved[64];
} CUipcMemHandle;

enum {
  CUDA_SUCCESS = 0,
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_MEMORYTYPE_DEVICE = 2,
  CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
  CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1,
};

static struct {
  void *lib;
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*CtxGetCurrent)(CUcontext *);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxGetDevice)(CUdevice *);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*StreamSynchronize)(void *);
  CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
  CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
  CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
  CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
  CUresult (*IpcCloseMemHandle)(CUdeviceptr);
  CUresult (*MemGetHandleForAddressRange)(void *, CUdeviceptr, size_t, int, unsigned long long);
  CUresult (*GetErrorString)(CUresult, const char **);
  int count;
  CUcontext ctx0; /* primary context of device 0 */
} cu;

static const char *cu_str(CUresult r)
{
  const char *s = NULL;
  if (cu.GetErrorString == NULL || cu.GetErrorString(r, &s) != CUDA_SUCCESS || s == NULL)
    return "unknown CUDA error";
  return s;
}

static hixl_status_t cu_err(hixl_status_t st, const char *call, CUresult r)
{
  return hixl__err(st, "cuda: %s: %s (%d)", call, cu_str(r), r);
}

/* The newest versioned name first (cuda.h maps cuMemAlloc to cuMemAlloc_v2). */
static void *sym(const char *name, const char *v2)
{
  void *p = v2 ? dlsym(cu.lib, v2) : NULL;
  return p ? p : dlsym(cu.lib, name);
}

#define LOAD(field, name, v2)                                                                      \
  do {                                                                                             \
    *(void **)&cu.field = sym(name, v2);                                                           \
    if (cu.field == NULL && required)                                                              \
      return hixl__err(HIXL_ERR_NO_DEVICE, "cuda: libcuda.so.1 lacks %s", name);                   \
  } while (0)

static hixl_status_t load(void)
{
  bool required = true;
  LOAD(Init, "cuInit", NULL);
  LOAD(DeviceGetCount, "cuDeviceGetCount", NULL);
  LOAD(DeviceGet, "cuDeviceGet", NULL);
  LOAD(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL);
  LOAD(CtxGetCurrent, "cuCtxGetCurrent", NULL);
  LOAD(CtxSetCurrent, "cuCtxSetCurrent", NULL);
  LOAD(CtxGetDevice, "cuCtxGetDevice", NULL);
  LOAD(MemAlloc, "cuMemAlloc", "cuMemAlloc_v2");
  LOAD(MemFree, "cuMemFree", "cuMemFree_v2");
  LOAD(Memcpy, "cuMemcpy", NULL);
  LOAD(StreamSynchronize, "cuStreamSynchronize", NULL);
  LOAD(PointerGetAttribute, "cuPointerGetAttribute", NULL);
  LOAD(MemGetAddressRange, "cuMemGetAddressRange", "cuMemGetAddressRange_v2");
  LOAD(IpcGetMemHandle, "cuIpcGetMemHandle", NULL);
  LOAD(IpcOpenMemHandle, "cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2");
  LOAD(IpcCloseMemHandle, "cuIpcCloseMemHandle", NULL);
  LOAD(GetErrorString, "cuGetErrorString", NULL);
  required = false; /* CUDA 11.7+ */
  LOAD(MemGetHandleForAddressRange, "cuMemGetHandleForAddressRange", NULL);
  return HIXL_OK;
}

static hixl_status_t cu_init(void)
{
  cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (cu.lib == NULL)
    return hixl__err(HIXL_ERR_NO_DEVICE, "cuda: libcuda.so.1 not found (%s)", dlerror());
  hixl_status_t st = load();
  CUresult r;
  CUdevice d0;
  if (st == HIXL_OK && (r = cu.Init(0)) != CUDA_SUCCESS)
    st = cu_err(HIXL_ERR_NO_DEVICE, "cuInit", r);
  if (st == HIXL_OK && (r = cu.DeviceGetCount(&cu.count)) != CUDA_SUCCESS)
    st = cu_err(HIXL_ERR_NO_DEVICE, "cuDeviceGetCount", r);
  if (st == HIXL_OK && cu.count > 0 &&
      ((r = cu.DeviceGet(&d0, 0)) != CUDA_SUCCESS ||
       (r = cu.DevicePrimaryCtxRetain(&cu.ctx0, d0)) != CUDA_SUCCESS))
    st = cu_err(HIXL_ERR_NO_DEVICE, "cuDevicePrimaryCtxRetain", r);
  if (st != HIXL_OK) {
    dlclose(cu.lib);
    memset(&cu, 0, sizeof(cu));
  }
  return st;
}

static int cu_count(void) { return cu.count; }

/* A context current on this thread (the caller's, else device 0's). */
static hixl_status_t ensure_ctx(void)
{
  static __thread bool done;
  if (hixl_likely(done))
    return HIXL_OK;
  CUcontext c = NULL;
  if (cu.CtxGetCurrent(&c) == CUDA_SUCCESS && c == NULL) {
    CUresult r = cu.CtxSetCurrent(cu.ctx0);
    if (r != CUDA_SUCCESS)
      return cu_err(HIXL_ERR_TRANSPORT, "cuCtxSetCurrent", r);
  }
  done = true;
  return HIXL_OK;
}

static hixl_status_t cu_current(int *device_p)
{
  hixl_status_t st = ensure_ctx();
  CUdevice d;
  CUresult r;
  if (st == HIXL_OK && (r = cu.CtxGetDevice(&d)) != CUDA_SUCCESS)
    st = cu_err(HIXL_ERR_NO_DEVICE, "cuCtxGetDevice", r);
  if (st == HIXL_OK)
    *device_p = d;
  return st;
}

static hixl_status_t cu_alloc(int device, size_t len, void **p_p)
{
  (void)device; /* the current context's device, which cu_current reported */
  hixl_status_t st = ensure_ctx();
  if (st != HIXL_OK)
    return st;
  CUdeviceptr p;
  CUresult r = cu.MemAlloc(&p, len);
  if (r != CUDA_SUCCESS)
    return cu_err(HIXL_ERR_NOMEM, "cuMemAlloc", r);
  *p_p = (void *)(uintptr_t)p;
  return HIXL_OK;
}

static void cu_free(void *p)
{
  if (ensure_ctx() == HIXL_OK)
    cu.MemFree((CUdeviceptr)(uintptr_t)p);
}

static bool cu_lookup(const void *p, hixl_dev_range_t *out)
{
  unsigned type = 0;
  int ordinal = -1;
  CUdeviceptr base;
  size_t size;
  CUdeviceptr a = (CUdeviceptr)(uintptr_t)p;
  /* Host memory CUDA does not know answers INVALID_VALUE: not device. */
  if (cu.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a) != CUDA_SUCCESS ||
      type != CU_MEMORYTYPE_DEVICE)
    return false;
  if (cu.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a) != CUDA_SUCCESS ||
      cu.MemGetAddressRange(&base, &size, a) != CUDA_SUCCESS)
    return false;
  *out = (hixl_dev_range_t){(uintptr_t)base, size, ordinal};
  return true;
}

static hixl_status_t cu_copy(void *dst, const void *src, size_t len)
{
  hixl_status_t st = ensure_ctx();
  if (st != HIXL_OK)
    return st;
  CUresult r = cu.Memcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, len);
  if (r != CUDA_SUCCESS)
    return cu_err(HIXL_ERR_TRANSPORT, "cuMemcpy", r);
  /* Device-to-device copies are asynchronous to the host; the contract
   * says the bytes are there when a put completes. */
  if ((r = cu.StreamSynchronize(NULL)) != CUDA_SUCCESS)
    return cu_err(HIXL_ERR_TRANSPORT, "cuStreamSynchronize", r);
  return HIXL_OK;
}

static hixl_status_t cu_ipc_export(const hixl_dev_range_t *rng, const void *p, size_t len,
                                   pid_t importer, hixl_dev_ipc_t *h)
{
  (void)importer;
  (void)len;
  hixl_status_t st = ensure_ctx();
  if (st != HIXL_OK)
    return st;
  CUipcMemHandle ih;
  CUresult r = cu.IpcGetMemHandle(&ih, (CUdeviceptr)rng->base);
  if (r != CUDA_SUCCESS)
    return cu_err(HIXL_ERR_TRANSPORT, "cuIpcGetMemHandle", r);
  _Static_assert(sizeof(ih) <= HIXL_DEV_IPC_BYTES, "CUipcMemHandle fits");
  memcpy(h->bytes, &ih, sizeof(ih));
  h->len = sizeof(ih);
  h->fd = -1;
  h->alloc_len = rng->len;
  h->offset = (uintptr_t)p - rng->base;
  return HIXL_OK;
}

static hixl_status_t cu_ipc_import(const hixl_dev_ipc_t *h, void **base_p)
{
  if (h->len != sizeof(CUipcMemHandle))
    return hixl__err(HIXL_ERR_TRANSPORT, "cuda: a malformed IPC handle (%u bytes)", h->len);
  hixl_status_t st = ensure_ctx();
  if (st != HIXL_OK)
    return st;
  CUipcMemHandle ih;
  memcpy(&ih, h->bytes, sizeof(ih));
  CUdeviceptr p;
  CUresult r = cu.IpcOpenMemHandle(&p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS)
    return cu_err(HIXL_ERR_TRANSPORT, "cuIpcOpenMemHandle", r);
  *base_p = (void *)(uintptr_t)p;
  return HIXL_OK;
}

static void cu_ipc_close(void *base)
{
  if (ensure_ctx() == HIXL_OK)
    cu.IpcCloseMemHandle((CUdeviceptr)(uintptr_t)base);
}

static hixl_status_t cu_dmabuf(const void *p, size_t len, int *fd_p, uint64_t *off_p)
{
  if (cu.MemGetHandleForAddressRange == NULL)
    return HIXL_ERR_UNSUPPORTED;
  /* The range must be host-page aligned: widen it to pages (inside the
   * allocation, which CUDA aligns far more coarsely). */
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)p & ~(page - 1);
  uintptr_t e = ((uintptr_t)p + len + page - 1) & ~(page - 1);
  int fd = -1;
  CUresult r = cu.MemGetHandleForAddressRange(&fd, (CUdeviceptr)a, e - a,
                                              CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS || fd < 0)
    return HIXL_ERR_UNSUPPORTED;
  *fd_p = fd;
  *off_p = (uintptr_t)p - a;
  return HIXL_OK;
}

static void *cu_nic_addr(const void *p) { return (void *)(uintptr_t)p; }

const hixl_dev_ops_t hixl__dev_cuda_ops = {
    .size = sizeof(hixl_dev_ops_t),
    .name = "cuda",
    .init = cu_init,
    .count = cu_count,
    .current = cu_current,
    .alloc = cu_alloc,
    .free = cu_free,
    .lookup = cu_lookup,
    .copy = cu_copy,
    .ipc_export = cu_ipc_export,
    .ipc_import = cu_ipc_import,
    .ipc_close = cu_ipc_close,
    .dmabuf = cu_dmabuf,
    .nic_addr = cu_nic_addr,
};

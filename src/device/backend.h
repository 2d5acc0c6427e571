/* SPDX-License-Identifier: MIT */
/*
 * The device backends' interface (cuda.c, ascend.c, emulated.c; chosen by
 * device.c): one ops table per memory backend, the shape of libfabric's
 * src/hmem.c.  Only src/device includes this; the rest of the library calls
 * the shim in device.h.
 */
#ifndef HIXL_DEVICE_BACKEND_H
#define HIXL_DEVICE_BACKEND_H

#include "device.h"

typedef struct hixl_dev_ops {
  size_t size;
  const char *name;
  /* Load and initialise the runtime: OK, or NO_DEVICE with the reason. */
  hixl_status_t (*init)(void);
  int (*count)(void);
  /* The calling thread's current device. */
  hixl_status_t (*current)(int *device_p);
  hixl_status_t (*alloc)(int device, size_t len, void **p_p);
  void (*free)(void *p);
  /* Whether p is device memory: the allocation holding it. */
  bool (*lookup)(const void *p, hixl_dev_range_t *r);
  /* Copy len bytes between any two buffers (host or device, any direction);
   * returns when the bytes are at dst.  Overlap: as memmove where the
   * runtime allows (emulated), undefined otherwise. */
  hixl_status_t (*copy)(void *dst, const void *src, size_t len);
  /* Export [p, p+len), inside allocation r, for a same-host process (pid:
   * the importer): fills bytes/len/fd, alloc_len and offset (the backend
   * may export the whole allocation or just the range). */
  hixl_status_t (*ipc_export)(const hixl_dev_range_t *r, const void *p, size_t len, pid_t importer,
                              hixl_dev_ipc_t *h);
  /* Import it: *base_p is its byte 0 in our address space (device memory
   * that lookup and copy know from then on).  Takes ownership of h->fd. */
  hixl_status_t (*ipc_import)(const hixl_dev_ipc_t *h, void **base_p);
  void (*ipc_close)(void *base);
  /* Optional (NULL: none).  A dmabuf fd covering [p, p+len) and the offset
   * of p in it, for ibv_reg_dmabuf_mr; the caller closes the fd. */
  hixl_status_t (*dmabuf)(const void *p, size_t len, int *fd_p, uint64_t *off_p);
  /* Optional (NULL: none).  The address ibv_reg_mr pins for device address
   * p (a peer-memory driver's view), or NULL when the NIC cannot. */
  void *(*nic_addr)(const void *p);
} hixl_dev_ops_t;

extern const hixl_dev_ops_t hixl__dev_cuda_ops;
extern const hixl_dev_ops_t hixl__dev_ascend_ops;
extern const hixl_dev_ops_t hixl__dev_emulated_ops;

/* The selected backend, or NULL when none (after hixl__dev_init). */
const hixl_dev_ops_t *hixl__dev_backend(void);

/* Backends report here when device memory first exists in the process. */
void hixl__dev_mark_active(void);

#endif /* HIXL_DEVICE_BACKEND_H */

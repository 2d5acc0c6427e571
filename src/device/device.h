/* SPDX-License-Identifier: MIT */
/*
 * The device-memory shim: one ops table per memory backend, chosen once per
 * process (the shape of libfabric's src/hmem.c).
 *
 *   cuda      the CUDA driver API, libcuda.so.1 found with dlopen (cuda.c)
 *   ascend    the Ascend runtime, libascendcl.so found with dlopen (ascend.c)
 *   emulated  pinned host memory that hixl treats strictly as device memory
 *             (emulated.c): the address the user gets is mapped PROT_NONE, so
 *             any access that does not go through this shim faults, exactly
 *             as a CPU load from GPU memory would.
 *
 * libhixl.so links none of the runtimes; without them only the device kind
 * is lost.  HIXL_DEVICE picks one (auto, cuda, ascend, emulated, none); auto
 * takes the first runtime that initialises with at least one device, else
 * emulated.
 *
 * This header is what the rest of the library (core and transports) calls;
 * src/device/backend.h is the backends' interface.  The rest asks four things of device memory: is
 * this address device memory (and of which allocation), copy between any two buffers, hand an
 * allocation to a same-host process (IPC), and let a NIC reach it (dmabuf, or an address ibv_reg_mr
 * accepts).  Everything else (which transport stages, which refuses) is decided by the transports.
 */
#ifndef HIXL_DEVICE_H
#define HIXL_DEVICE_H

#include "../core/base.h"

#define HIXL_DEV_IPC_BYTES 64 /* cuIpcMemHandle is 64 bytes; Ascend keys are shorter */

/* An IPC handle: what an owner sends a same-host peer so it can map one
 * device allocation.  bytes/len: the runtime's handle; fd: a passed file
 * descriptor (emulated: the memfd), else -1. */
typedef struct hixl_dev_ipc {
  uint8_t bytes[HIXL_DEV_IPC_BYTES];
  uint32_t len;
  int fd;
  uint64_t alloc_len; /* bytes the handle maps */
  uint64_t offset;    /* where the exported range starts in them */
  int device;
} hixl_dev_ipc_t;

/*
 * hixl__dev_any turns true when device memory can exist in this process (a
 * real runtime was found, or emulated memory was allocated or imported);
 * until then no operation looks at its buffers twice.  Transports test
 * local buffers with hixl__is_dev() and remote regions with
 * HIXL_REGF_DEVICE. */
typedef struct hixl_dev_range {
  uintptr_t base; /* the device allocation holding the address */
  size_t len;
  int device;
} hixl_dev_range_t;
extern _Atomic bool hixl__dev_any;
/* Select and initialise the backend (once per process; cheap when absent). */
void hixl__dev_init(void);
bool hixl__dev_lookup(const void *p, hixl_dev_range_t *r);
static inline bool hixl__is_dev(const void *p)
{
  return hixl_unlikely(atomic_load_explicit(&hixl__dev_any, memory_order_relaxed)) &&
         hixl__dev_lookup(p, NULL);
}
/* fn's local buffer [p, p+len): INVALID when it starts in device memory and
 * runs past that allocation (checked before anything moves). */
hixl_status_t hixl__dev_check_local(const char *fn, const void *p, size_t len);
/* Copy between any two buffers, host or device. */
hixl_status_t hixl__dev_copy(void *dst, const void *src, size_t len);
/* Allocation (hixl_mem_alloc) and the checks of hixl_mr_reg_device. */
hixl_status_t hixl__dev_alloc(size_t len, int *device_p, void **p_p);
void hixl__dev_free(void *p);
hixl_status_t hixl__dev_check_reg(const char *fn, const void *p, size_t len, int device);
/* IPC for same-host peers (shm): the owner exports the allocation holding
 * [p, p+len) for process importer; *off_p is p's offset in it.  The
 * importer maps it (the fd in h, if any, is consumed). */
hixl_status_t hixl__dev_ipc_export(const void *p, size_t len, pid_t importer, hixl_dev_ipc_t *h,
                                   uint64_t *off_p);
hixl_status_t hixl__dev_ipc_import(hixl_dev_ipc_t *h, void **base_p);
void hixl__dev_ipc_close(void *base);
/* For NIC registration: a dmabuf fd (+ offset) or a host address ibv_reg_mr
 * pins; HIXL_DEVICE_RDMA=0 turns both off (the NIC never touches device
 * memory: local buffers are staged, device regions are not offered). */
bool hixl__dev_rdma_allowed(void);
hixl_status_t hixl__dev_dmabuf(const void *p, size_t len, int *fd_p, uint64_t *off_p);
void *hixl__dev_nic_addr(const void *p);

#endif /* HIXL_DEVICE_H */

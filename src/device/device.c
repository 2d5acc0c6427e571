/* SPDX-License-Identifier: MIT */
/*
 * Device-memory shim.  The backends (Ascend runtime and CUDA found with
 * dlopen at run time, and an emulated backend for CI) arrive with the
 * device-memory issue; until then every device call reports NO_DEVICE with a
 * message that says why, and host memory is unaffected.
 */
#include "../core/hixl_int.h"

hixl_status_t hixl__dev_check(int device_id)
{
  return hixl__err(HIXL_ERR_NO_DEVICE,
                   "device memory (device %d): no device backend in this build yet "
                   "(Ascend, CUDA and emulated backends are not implemented)",
                   device_id);
}

/* SPDX-License-Identifier: MIT */
/* hixl-info: what this build and this machine offer. */
#include <hixl.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
  printf("hixl %d.%d.%d\n", HIXL_VERSION_MAJOR, HIXL_VERSION_MINOR, HIXL_VERSION_PATCH);
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  printf("config: transports=%s timeout_ms=%d progress_thread=%d auth=%s\n",
         cfg.transports ? cfg.transports : "(all)", cfg.timeout_ms, cfg.progress_thread,
         cfg.auth_token ? "set" : "none");
  hixl_ctx_t *ctx;
  hixl_status_t st = hixl_ctx_create(&cfg, &ctx);
  if (st != HIXL_OK) {
    printf("context: %s (%s)\n", hixl_strerror(st), hixl_last_error());
    return 1;
  }
  printf("address: %s\n", hixl_ctx_address(ctx));
  printf("transports: %s\n", hixl_ctx_transports(ctx));
  void *p;
  hixl_mr_t *mr;
  st = hixl_mem_alloc(ctx, 4096, HIXL_MEM_DEVICE, 0, &p, &mr);
  printf("device memory: backend %s, %s\n", hixl_device_backend(),
         st == HIXL_OK ? "allocation works" : hixl_last_error());
  if (st == HIXL_OK)
    hixl_mr_dereg(mr);
  hixl_ctx_destroy(ctx);
  return 0;
}

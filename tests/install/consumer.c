/* An out-of-tree program built against the installed library through
 * pkg-config (tests/install/check.sh). */
#include <hixl.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
  hixl_ctx_t *ctx;
  if (hixl_ctx_create(NULL, &ctx) != HIXL_OK)
    return 1;
  hixl_peer_t *self;
  void *mem;
  hixl_mr_t *mr;
  hixl_rmr_t *rmr;
  if (hixl_connect(ctx, hixl_ctx_address(ctx), 5000, &self) != HIXL_OK ||
      hixl_mem_alloc(ctx, 64, HIXL_MEM_HOST, HIXL_ACCESS_WRITE, &mem, &mr) != HIXL_OK ||
      hixl_mr_publish(mr, "x") != HIXL_OK || hixl_rmr_lookup(self, "x", 1000, &rmr) != HIXL_OK ||
      hixl_put(self, "installed", 10, rmr, 0, 0, NULL) != HIXL_OK ||
      hixl_fence(ctx, NULL, 1000) != HIXL_OK) {
    fprintf(stderr, "consumer: %s\n", hixl_last_error());
    return 1;
  }
  int ok = strcmp((const char *)mem, "installed") == 0;
  printf("consumer: %s over %s\n", ok ? "ok" : "BAD", hixl_peer_transport(self));
  hixl_rmr_release(rmr);
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(ctx);
  return ok ? 0 : 1;
}

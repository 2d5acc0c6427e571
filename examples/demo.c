/* SPDX-License-Identifier: MIT */
/*
 * demo: two processes on one host.  The target allocates a region, publishes
 * it and then only waits for notifications; the initiator puts, gets, writes
 * with an immediate and runs atomics on it, and fences.  Run: ./demo
 */
#include <hixl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(call)                                                                                \
  do {                                                                                             \
    hixl_status_t st_ = (call);                                                                    \
    if (st_ != HIXL_OK) {                                                                          \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, hixl_strerror(st_), hixl_last_error());       \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static int target(int addr_pipe)
{
  hixl_ctx_t *ctx;
  CHECK(hixl_ctx_create(NULL, &ctx));
  void *mem;
  hixl_mr_t *mr;
  CHECK(hixl_mem_alloc(ctx, 4096, HIXL_MEM_HOST,
                       HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC, &mem, &mr));
  CHECK(hixl_mr_publish(mr, "demo"));
  const char *addr = hixl_ctx_address(ctx);
  if (write(addr_pipe, addr, strlen(addr) + 1) < 0)
    return 1;
  close(addr_pipe);
  /* The target calls nothing for puts, gets or atomics; it only takes the
   * notifications it was sent. */
  hixl_notif_t n;
  CHECK(hixl_notif_wait(ctx, &n, 10000));
  printf("[target] notification imm=%" PRIu32 " len=%zu: region says \"%s\"\n", n.imm, n.len,
         (char *)mem);
  CHECK(hixl_notif_wait(ctx, &n, 10000));
  printf("[target] notification imm=%" PRIu32 ": counter=%" PRIu64 "\n", n.imm,
         *(uint64_t *)((char *)mem + 64));
  hixl_mr_dereg(mr);
  hixl_ctx_destroy(ctx);
  return 0;
}

int main(void)
{
  int fds[2];
  if (pipe(fds) != 0)
    return 1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    return target(fds[1]);
  }
  close(fds[1]);
  char addr[128] = {0};
  if (read(fds[0], addr, sizeof(addr) - 1) <= 0)
    return 1;

  hixl_ctx_t *ctx;
  hixl_peer_t *peer;
  hixl_rmr_t *rmr;
  CHECK(hixl_ctx_create(NULL, &ctx));
  CHECK(hixl_connect(ctx, addr, 5000, &peer));
  CHECK(hixl_rmr_lookup(peer, "demo", 5000, &rmr));
  printf("[initiator] connected to %s over %s\n", addr, hixl_peer_transport(peer));

  const char msg[] = "hello from a one-sided put";
  CHECK(hixl_put(peer, msg, sizeof(msg), rmr, 0, 0, NULL));
  char back[sizeof(msg)];
  hixl_req_t *req;
  CHECK(hixl_get(peer, back, sizeof(back), rmr, 0, 0, &req));
  CHECK(hixl_req_wait(req, -1));
  hixl_req_free(req);
  printf("[initiator] put %zu bytes, got back \"%s\"\n", sizeof(msg), back);
  CHECK(hixl_put_imm(peer, msg, sizeof(msg), rmr, 0, 7, 0, NULL));

  uint64_t old = 0;
  for (int i = 0; i < 10; i++)
    CHECK(hixl_atomic_faa(peer, rmr, 64, 5, &old, 0, NULL));
  CHECK(hixl_fence(ctx, peer, 5000));
  printf("[initiator] 10 x fetch-and-add 5: last old value %" PRIu64 "\n", old);
  CHECK(hixl_atomic_cas(peer, rmr, 64, 50, 1000, &old, 0, &req));
  CHECK(hixl_req_wait(req, -1));
  hixl_req_free(req);
  printf("[initiator] compare-and-swap 50 -> 1000: old value %" PRIu64 "%s\n", old,
         old == 50 ? " (swapped)" : "");
  CHECK(hixl_fence(ctx, NULL, 5000)); /* everything above has landed */
  /* The last word: the target exits once it has it, so no fence after it
   * (a fence to a peer that has gone reports HIXL_ERR_PEER_LOST). */
  CHECK(hixl_notify(peer, 8, 0, NULL));

  int status;
  waitpid(pid, &status, 0);
  hixl_rmr_release(rmr);
  hixl_disconnect(peer);
  hixl_ctx_destroy(ctx);
  bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && old == 50;
  printf("demo %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

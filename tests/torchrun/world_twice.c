/* SPDX-License-Identifier: MIT */
/*
 * Several hixl worlds in one job, each rank started by torchrun (or with
 * its variables): world 1 is created and used; world 2 is created while
 * world 1 lives, both are used; world 1 goes; world 3 is created and used.
 * In each, every rank puts a mark carrying the world's number into every
 * rank's region and adds to a counter on rank 0: a world that met another
 * world's peers, or keys, would show the wrong marks or hang.
 *
 *   world_twice                 exit 0 when every check held
 *   world_twice --absent R      rank R never joins; the others must get
 *                               TIMEOUT naming rank R (HIXL_TIMEOUT_MS short)
 */
#define _GNU_SOURCE
#include <hixl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_rank = -1;

#define CHECK(call)                                                                                \
  do {                                                                                             \
    hixl_status_t st_ = (call);                                                                    \
    if (st_ != HIXL_OK) {                                                                          \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", g_rank, #call, hixl_strerror(st_),          \
              hixl_last_error());                                                                  \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

typedef struct {
  hixl_world_t *w;
  uint64_t *mem;
  hixl_mr_t *mr;
  uint64_t k; /* the world's number */
} world_t;

static void create(hixl_ctx_t *ctx, world_t *x, uint64_t k)
{
  x->k = k;
  CHECK(hixl_world_create(ctx, -1, -1, NULL, &x->w));
  int size = atoi(getenv("WORLD_SIZE"));
  if (hixl_world_rank(x->w) != g_rank || hixl_world_size(x->w) != size) {
    fprintf(stderr, "rank %d: world %llu says rank %d of %d\n", g_rank, (unsigned long long)k,
            hixl_world_rank(x->w), hixl_world_size(x->w));
    exit(1);
  }
  CHECK(hixl_mem_alloc(ctx, 4096, HIXL_MEM_HOST,
                       HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC, (void **)&x->mem,
                       &x->mr));
}

/* Marks into every rank, a counter on rank 0, then every mark checked. */
static void use(hixl_ctx_t *ctx, world_t *x, int round)
{
  int size = hixl_world_size(x->w);
  hixl_rmr_t **rmrs = calloc((size_t)size, sizeof(*rmrs));
  CHECK(hixl_world_exchange(x->w, x->mr, rmrs));
  uint64_t mark = x->k << 48 | (uint64_t)round << 32 | (uint64_t)g_rank;
  for (int r = 0; r < size; r++)
    CHECK(hixl_put(hixl_world_peer(x->w, r), &mark, 8, rmrs[r], (uint64_t)g_rank * 8, 0, NULL));
  CHECK(hixl_atomic_faa(hixl_world_peer(x->w, 0), rmrs[0], 2048, x->k, NULL, 0, NULL));
  /* Fence this world's peers only: a destroyed world's disconnected peers
   * would answer a fence on all (NULL) with PEER_LOST. */
  for (int r = 0; r < size; r++)
    CHECK(hixl_fence(ctx, hixl_world_peer(x->w, r), 10000));
  CHECK(hixl_world_barrier(x->w));
  for (int r = 0; r < size; r++)
    if (x->mem[r] != (x->k << 48 | (uint64_t)round << 32 | (uint64_t)r)) {
      fprintf(stderr, "rank %d: world %llu round %d: slot %d holds %#llx\n", g_rank,
              (unsigned long long)x->k, round, r, (unsigned long long)x->mem[r]);
      exit(1);
    }
  if (g_rank == 0 && x->mem[256] != x->k * (uint64_t)size * (uint64_t)round) {
    fprintf(stderr, "rank 0: world %llu counter %llu after round %d\n", (unsigned long long)x->k,
            (unsigned long long)x->mem[256], round);
    exit(1);
  }
  /* Nobody may put the next round before everyone has checked this one. */
  CHECK(hixl_world_barrier(x->w));
  for (int r = 0; r < size; r++)
    hixl_rmr_release(rmrs[r]);
  free(rmrs);
}

static void destroy(world_t *x)
{
  hixl_world_destroy(x->w);
  CHECK(hixl_mr_dereg(x->mr));
}

int main(int argc, char **argv)
{
  const char *r = getenv("RANK");
  g_rank = r ? atoi(r) : -1;
  hixl_ctx_t *ctx;
  CHECK(hixl_ctx_create(NULL, &ctx));
  if (argc == 3 && strcmp(argv[1], "--absent") == 0) {
    int absent = atoi(argv[2]);
    const char *t = getenv("HIXL_TIMEOUT_MS");
    int timeout_ms = t ? atoi(t) : 10000;
    if (g_rank == absent) { /* outlive the others' wait, join nothing */
      usleep((useconds_t)(timeout_ms + 3000) * 1000);
      hixl_ctx_destroy(ctx);
      return 0;
    }
    hixl_world_t *w;
    hixl_status_t st = hixl_world_create(ctx, -1, -1, NULL, &w);
    char want[64];
    snprintf(want, sizeof(want), "rank(s) %d of %s did not join", absent, getenv("WORLD_SIZE"));
    if (st != HIXL_ERR_TIMEOUT || strstr(hixl_last_error(), want) == NULL) {
      fprintf(stderr, "rank %d: want TIMEOUT saying \"%s\", got %s (%s)\n", g_rank, want,
              hixl_strerror(st), st ? hixl_last_error() : "");
      return 1;
    }
    printf("rank %d: TIMEOUT as wanted: %s\n", g_rank, hixl_last_error());
    hixl_ctx_destroy(ctx);
    return 0;
  }
  if (argc != 1) {
    fprintf(stderr, "usage: world_twice [--absent RANK]\n");
    return 2;
  }
  world_t w1, w2, w3;
  create(ctx, &w1, 1);
  use(ctx, &w1, 1);
  create(ctx, &w2, 2); /* while world 1 lives */
  use(ctx, &w2, 1);
  use(ctx, &w1, 2);
  destroy(&w1);
  create(ctx, &w3, 3);
  use(ctx, &w3, 1);
  use(ctx, &w2, 2);
  destroy(&w2);
  destroy(&w3);
  hixl_ctx_destroy(ctx);
  printf("rank %d: 3 worlds ok\n", g_rank);
  return 0;
}

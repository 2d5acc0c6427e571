/* SPDX-License-Identifier: MIT */
/* hixl-info: what this build and this machine offer; with --stats, the
 * counters of a running context (docs/observability.md).
 *
 *   hixl-info                          this build, a context's address and transports
 *   hixl-info --stats ADDR [--watch [S]] [--timeout MS]
 *                                      ADDR's counters (hixl_peer_remote_stats), over
 *                                      its control port: HIXL_AUTH_TOKEN / HIXL_TLS as
 *                                      for any connect; --watch redraws every S
 *                                      seconds (default 1) with rates, like top
 */
#define _GNU_SOURCE
#include <hixl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXS 256

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig, stop = 1; }

static int usage(void)
{
  fprintf(stderr, "usage: hixl-info [--stats ADDR [--watch [SECONDS]] [--timeout MS]]\n");
  return 2;
}

static double now_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One table: name, value, and (watching) the rate of counters since the
 * last one. */
static void print_table(const char *addr, const hixl_stat_t *s, size_t n, const uint64_t *prev,
                        double dt)
{
  printf("%-26s %20s%s\n", addr, "value", prev ? "         per second" : "");
  for (size_t i = 0; i < n; i++) {
    printf("%-26s %20llu", s[i].name, (unsigned long long)s[i].value);
    if (prev && s[i].kind == HIXL_STAT_COUNTER && dt > 0 && s[i].value >= prev[i])
      printf(" %18.1f", (double)(s[i].value - prev[i]) / dt);
    printf("\n");
  }
}

static int stats(const char *addr, double watch_s, int timeout_ms)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  hixl_ctx_t *ctx;
  hixl_status_t st = hixl_ctx_create(&cfg, &ctx);
  if (st != HIXL_OK) {
    fprintf(stderr, "hixl-info: cannot create a context: %s\n", hixl_last_error());
    return 1;
  }
  hixl_peer_t *peer;
  if ((st = hixl_connect(ctx, addr, timeout_ms, &peer)) != HIXL_OK) {
    fprintf(stderr, "hixl-info: cannot connect to %s: %s\n", addr, hixl_last_error());
    hixl_ctx_destroy(ctx);
    return 1;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  hixl_stat_t s[MAXS];
  uint64_t prev[MAXS];
  double t_prev = 0;
  int rc = 0;
  for (int round = 0; !stop; round++) {
    size_t n = MAXS;
    if ((st = hixl_peer_remote_stats(peer, s, &n, timeout_ms)) != HIXL_OK) {
      fprintf(stderr, "hixl-info: %s: %s\n", addr, hixl_last_error());
      rc = 1;
      break;
    }
    if (n > MAXS)
      n = MAXS;
    double t = now_s();
    if (watch_s > 0)
      printf("\033[H\033[2J"); /* home, clear: like top */
    print_table(addr, s, n, round > 0 ? prev : NULL, t - t_prev);
    fflush(stdout);
    if (watch_s <= 0)
      break;
    for (size_t i = 0; i < n; i++)
      prev[i] = s[i].value;
    t_prev = t;
    for (double left = watch_s; left > 0 && !stop; left -= 0.1)
      usleep(100000);
  }
  hixl_disconnect(peer);
  hixl_ctx_destroy(ctx);
  return rc;
}

static int info(void)
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

int main(int argc, char **argv)
{
  const char *addr = NULL;
  double watch_s = 0;
  int timeout_ms = 10000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--stats") == 0 && i + 1 < argc)
      addr = argv[++i];
    else if (strcmp(argv[i], "--watch") == 0) {
      watch_s = 1;
      if (i + 1 < argc && argv[i + 1][0] != '-') {
        char *end;
        watch_s = strtod(argv[++i], &end);
        if (*end || watch_s < 0.1 || watch_s > 3600)
          return usage();
      }
    } else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 3600000)
        return usage();
      timeout_ms = (int)v;
    } else
      return usage();
  }
  if (addr == NULL && watch_s > 0)
    return usage();
  return addr ? stats(addr, watch_s, timeout_ms) : info();
}

/* SPDX-License-Identifier: MIT */
/* Context lifetime. */
#define _GNU_SOURCE
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "core.h"
#include "tls.h"

static pthread_once_t copy_once = PTHREAD_ONCE_INIT;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

void hixl__primary_ip(char *buf, size_t cap)
{
  /* The first IPv4 address of an up, non-loopback interface: what a peer on
   * another host (or network namespace) can reach.  Loopback otherwise. */
  snprintf(buf, cap, "127.0.0.1");
  struct ifaddrs *ifs;
  if (getifaddrs(&ifs) != 0)
    return;
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
    if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
        (i->ifa_flags & IFF_LOOPBACK))
      continue;
    getnameinfo(i->ifa_addr, sizeof(struct sockaddr_in), buf, (socklen_t)cap, NULL, 0,
                NI_NUMERICHOST);
    break;
  }
  freeifaddrs(ifs);
}

/* The progress thread drives completions while the application computes.
 * Idle, it waits like any waiter (wait.c) for transport events only: it is
 * not counted among the sleepers that completions and shm peers wake, so
 * it costs them nothing; an armed completion channel or wait fd wakes it.
 * HIXL_PROGRESS_THREAD=2 skips the polling before it sleeps. */
static bool progress_made(void *arg)
{
  hixl_ctx_t *ctx = arg;
  return atomic_load(&ctx->stopping) || hixl_progress(ctx) > 0;
}

static void *progress_main(void *arg)
{
  hixl_ctx_t *ctx = arg;
  unsigned flags = HIXL_WAITF_PROGRESS | (ctx->cfg.progress_thread == 2 ? HIXL_WAITF_NOSPIN : 0);
  while (!atomic_load(&ctx->stopping))
    hixl__wait(ctx, INT64_MAX, flags, progress_made, ctx);
  return NULL;
}

static char *dup_opt(const char *s) { return s ? strdup(s) : NULL; }

hixl_status_t hixl_ctx_create(const hixl_config_t *cfg_in, hixl_ctx_t **ctx_p)
{
  pthread_once(&log_once, hixl__log_init);
  pthread_once(&copy_once, hixl__copy_init);
  hixl__dev_init(); /* cheap without a runtime; needed before any buffer is looked at */
  if (ctx_p == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_ctx_create: NULL ctx_p");
  hixl_config_t defaults;
  if (cfg_in == NULL) {
    hixl_config_init(&defaults);
    cfg_in = &defaults;
  }
  if (cfg_in->timeout_ms < 1)
    return hixl__err(HIXL_ERR_INVALID, "hixl_ctx_create: timeout_ms must be >= 1 (got %d)",
                     cfg_in->timeout_ms);
  if (cfg_in->auth_token && strlen(cfg_in->auth_token) > HIXL_AUTH_TOKEN_MAX)
    return hixl__err(HIXL_ERR_INVALID,
                     "hixl_ctx_create: the auth token has %zu bytes; at most "
                     "%d (HIXL_AUTH_TOKEN)",
                     strlen(cfg_in->auth_token), HIXL_AUTH_TOKEN_MAX);
  if (cfg_in->auth_token && cfg_in->auth_token[0] && strlen(cfg_in->auth_token) < 16)
    /* Anyone may ask a target for its proof over a nonce of their choosing,
     * and a fake target sees the initiator's: a short token falls to an
     * offline dictionary. */
    hixl_warn("the auth token has %zu bytes: it can be guessed offline from one handshake; use "
              "16 or more random bytes (docs/security.md)",
              strlen(cfg_in->auth_token));
  if (cfg_in->timeout_ms < HIXL_LIVENESS_FLOOR_MS)
    hixl_info("timeout_ms %d: calls time out after it, but a peer is declared lost only "
              "after %d ms of silence",
              cfg_in->timeout_ms, HIXL_LIVENESS_FLOOR_MS);
  if (cfg_in->wait < HIXL_WAIT_ADAPTIVE || cfg_in->wait > HIXL_WAIT_SLEEP)
    return hixl__err(HIXL_ERR_INVALID,
                     "hixl_ctx_create: wait %d (want 0 adaptive, 1 spin, 2 sleep)", cfg_in->wait);
  if (cfg_in->reserved_int)
    return hixl__err(HIXL_ERR_INVALID,
                     "hixl_ctx_create: reserved fields must be zero (use hixl_config_init)");
  for (int i = 0; i < 6; i++)
    if (cfg_in->reserved[i])
      return hixl__err(HIXL_ERR_INVALID,
                       "hixl_ctx_create: reserved fields must be zero (use hixl_config_init)");
  hixl_ctx_t *ctx = calloc(1, sizeof(*ctx));
  if (ctx == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "hixl_ctx_create: no memory");
  ctx->listen_fd = ctx->unix_fd = ctx->wake_fd = ctx->epoll_fd = ctx->reg_fd = -1;
  for (int i = 0; i < HIXL_TP_MAX; i++)
    ctx->tp_fd[i] = -1;
  ctx->cfg = *cfg_in;
  if (cfg_in->progress_thread < 0 || cfg_in->progress_thread > 2) {
    free(ctx);
    return hixl__err(HIXL_ERR_INVALID,
                     "hixl_ctx_create: progress_thread %d (want 0 none, 1, or 2 sleeping at once)",
                     cfg_in->progress_thread);
  }
  ctx->cfg_strs[0] = dup_opt(cfg_in->listen);
  ctx->cfg_strs[1] = dup_opt(cfg_in->transports);
  ctx->cfg_strs[2] = dup_opt(cfg_in->net_dev);
  ctx->cfg_strs[3] = dup_opt(cfg_in->auth_token);
  ctx->cfg.listen = ctx->cfg_strs[0];
  ctx->cfg.transports = ctx->cfg_strs[1];
  ctx->cfg.net_dev = ctx->cfg_strs[2];
  ctx->cfg.auth_token = ctx->cfg_strs[3];
  ctx->cfg_strs[4] = dup_opt(cfg_in->metrics);
  ctx->cfg.metrics = ctx->cfg_strs[4];
  pthread_mutex_init(&ctx->lock, NULL);
  pthread_mutex_init(&ctx->tp_init_lock, NULL);
  hixl__wait_init(ctx);
  pthread_mutex_init(&ctx->reg_lock, NULL);
  pthread_mutex_init(&ctx->pool_lock, NULL);
  pthread_mutex_init(&ctx->aux_lock, NULL);
  pthread_mutex_init(&ctx->stats_lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&ctx->cond, &ca);
  pthread_condattr_destroy(&ca);

  hixl_status_t st = hixl__notif_init(ctx);
  if (st != HIXL_OK)
    goto fail;
  st = hixl__parse_transports(ctx->cfg.transports, ctx->tp_order, &ctx->n_tp_order,
                              &ctx->tp_allowed);
  if (st != HIXL_OK)
    goto fail;
  ctx->tp_allowed |= 1u << hixl__tp_loopback()->id; /* our own context is always reachable */
  ctx->id = hixl__random64();
  if (ctx->id == 0) /* 0 marks an empty slot of the counters' thread cache */
    ctx->id = 1;
  hixl__host_id(ctx->host_id);
  /* The abstract unix name of our control socket (and, + "-bell", of the
   * shm doorbell): leading NUL, scoped to the network namespace. */
  snprintf(ctx->unix_name + 1, sizeof(ctx->unix_name) - 1, "hixl-%d-%016llx", (int)getpid(),
           (unsigned long long)ctx->id);

  size_t table_bytes = HIXL_REG_SLOTS * sizeof(hixl_reg_slot_t);
  ctx->reg_fd = hixl__memfd("hixl-regions", table_bytes);
  ctx->slot_mr = calloc(HIXL_REG_SLOTS, sizeof(*ctx->slot_mr));
  if (ctx->reg_fd < 0 || ctx->slot_mr == NULL) {
    char why[320];
    st = hixl__err(HIXL_ERR_NOMEM, "hixl_ctx_create: region table: %s",
                   hixl__strerror_fd(errno, why, sizeof(why)));
    goto fail;
  }
  ctx->reg_table = mmap(NULL, table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ctx->reg_fd, 0);
  if (ctx->reg_table == MAP_FAILED) {
    ctx->reg_table = NULL;
    st = hixl__err(HIXL_ERR_NOMEM, "hixl_ctx_create: region table: %s", strerror(errno));
    goto fail;
  }
  /* Transports that need set-up on this machine (a device): absent is not
   * an error, the transport is just not offered.  Lazy ones are probed
   * only, and set up when a connection first picks one (hixl__tp_need):
   * a context that talks shm only never opens a libfabric endpoint or a
   * verbs device (docs/scale.md).  HIXL_LAZY=0 sets all up now. */
  const char *lz = getenv("HIXL_LAZY");
  bool eager = lz && strcmp(lz, "0") == 0;
  for (size_t i = 0; i < hixl__n_transports; i++) {
    const hixl_transport_ops_t *ops = hixl__transports[i];
    if (!(ctx->tp_allowed & (1u << ops->id)))
      continue;
    bool lazy = ops->caps & HIXL_TP_CAP_LAZY;
    st = lazy ? ops->probe(ctx) : ops->ctx_init(ctx);
    if (st == HIXL_OK)
      atomic_fetch_or(lazy ? &ctx->tp_lazy : &ctx->tp_ready, 1u << ops->id);
    else if (st == HIXL_ERR_NO_DEVICE)
      hixl_info("transport %s not available: %s", ops->name, hixl_last_error());
    else
      goto fail;
  }
  /* HIXL_LAZY=0: set the lazy ones up now (before the control thread,
   * which then watches their fds).  As for the others above: one whose
   * device or provider is absent (UNSUPPORTED, from NO_DEVICE) is just not
   * offered; any other failure fails the context. */
  for (size_t i = 0; eager && i < hixl__n_transports; i++)
    if ((atomic_load(&ctx->tp_lazy) & (1u << hixl__transports[i]->id)) &&
        (st = hixl__tp_need(ctx, hixl__transports[i])) != HIXL_OK && st != HIXL_ERR_UNSUPPORTED)
      goto fail;
  hixl__tp_join(ctx->tp_names, sizeof(ctx->tp_names), ctx->tp_order, ctx->n_tp_order,
                hixl__tp_offered(ctx));
  st = HIXL_OK;
  if ((st = hixl__ctl_start(ctx)) != HIXL_OK)
    goto fail;
  hixl__metrics_start(ctx);
  if (ctx->cfg.progress_thread) {
    if (hixl__thread_start(&ctx->prog_thread, "hixl-progress", progress_main, ctx) != 0) {
      st = hixl__err(HIXL_ERR_NOMEM, "hixl_ctx_create: cannot start the progress thread");
      goto fail;
    }
    ctx->prog_started = true;
  }
  hixl_info("context %016llx listening on %s", (unsigned long long)ctx->id, ctx->address);
  *ctx_p = ctx;
  return HIXL_OK;
fail:
  hixl_ctx_destroy(ctx);
  return st;
}

void hixl_ctx_destroy(hixl_ctx_t *ctx)
{
  if (ctx == NULL)
    return;
  atomic_store(&ctx->stopping, true);
  hixl__wake_all(ctx); /* the progress thread, if asleep */
  if (ctx->prog_started)
    pthread_join(ctx->prog_thread, NULL);
  hixl__ctl_stop(ctx);
  hixl__metrics_stop(ctx);
  pthread_mutex_lock(&ctx->lock);
  hixl__peers_destroy(ctx);
  free(ctx->hk);
  hixl__tls_fini(ctx); /* after the last session went with its peer */
  pthread_mutex_unlock(&ctx->lock);
  hixl__mrs_destroy(ctx);
  /* Last set up, first torn down: fabric's thread is gone before shm
   * moves the sleeper count back out of its page. */
  for (size_t i = hixl__n_transports; i-- > 0;)
    if (ctx->tp_ready & (1u << hixl__transports[i]->id))
      hixl__transports[i]->ctx_fini(ctx);
  for (unsigned i = 0; i < HIXL_QUARANTINE; i++)
    free(ctx->quarantine[i]);
  hixl__pool_destroy(ctx);
  hixl__notif_fini(ctx);
  if (ctx->reg_table)
    munmap(ctx->reg_table, HIXL_REG_SLOTS * sizeof(hixl_reg_slot_t));
  free(ctx->slot_mr);
  int fds[] = {ctx->listen_fd, ctx->unix_fd, ctx->wake_fd, ctx->epoll_fd, ctx->reg_fd};
  for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
    if (fds[i] >= 0)
      close(fds[i]);
  for (int i = 0; i < 5; i++)
    free(ctx->cfg_strs[i]);
  pthread_mutex_destroy(&ctx->lock);
  pthread_mutex_destroy(&ctx->tp_init_lock);
  pthread_mutex_destroy(&ctx->reg_lock);
  pthread_mutex_destroy(&ctx->pool_lock);
  pthread_mutex_destroy(&ctx->aux_lock);
  hixl__stats_fini(ctx);
  pthread_mutex_destroy(&ctx->stats_lock);
  pthread_cond_destroy(&ctx->cond);
  hixl__wait_fini(ctx);
  free(ctx);
}

const char *hixl_ctx_address(const hixl_ctx_t *ctx) { return ctx ? ctx->address : NULL; }

const char *hixl_ctx_transports(const hixl_ctx_t *ctx) { return ctx ? ctx->tp_names : NULL; }

/* SPDX-License-Identifier: MIT */
/*
 * The libfabric transport: reliable datagram endpoints (FI_EP_RDM) of one
 * provider, RMA for puts and gets, messages for notifications, native
 * atomics where the provider has them.
 *
 * Provider: HIXL_FABRIC_PROVIDER (a libfabric provider name such as
 * "tcp;ofi_rxm", "shm", "efa"), else the first of efa, cxi,
 * verbs;ofi_rxm, tcp;ofi_rxm, tcp, shm that fi_getinfo offers with
 * RMA and messages.  What it lacks is filled in above it, never silently
 * wrong (docs/fabric.md):
 *   - atomics: executed by the owner's control thread (an ATOMIC control
 *     message) when the provider has no 64-bit FAA/CAS;
 *   - put_imm: the write, then a notification message; when the provider
 *     does not order sends after writes (FI_ORDER_SAW, FI_ORDER_SAS) the
 *     message waits until everything before it to that peer has completed;
 *   - completion means visible at the target: FI_DELIVERY_COMPLETE where
 *     the provider offers it; otherwise a put completes only after a read
 *     of its last byte, which RMA read-after-write order (FI_ORDER_RAW) puts
 *     behind it (required, else the provider is refused).
 * Memory registration modes: FI_MR_VIRT_ADDR (remote addresses are virtual
 * addresses, else offsets), FI_MR_PROV_KEY (the provider's keys, else ours),
 * FI_MR_LOCAL (local buffers need descriptors: hixl regions have them, other
 * buffers are registered for the operation), FI_MR_ENDPOINT (bound to the
 * endpoint).  Keys and addresses are exchanged over the control connection.
 *
 * Binding: after HELLO picked fabric, the initiator sends FABRIC_BIND (its
 * provider and endpoint name); the target checks the provider, inserts the
 * name in its address vector and answers with its own.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "fabric_int.h"
#include "fabric_sigs.h"

#define FC(ctx) hixl__fc(ctx)

hixl_status_t hixl__fab_err(hixl_status_t st, const char *what, ssize_t rc)
{
  /* The provider opens sockets and epoll sets as it goes (an endpoint, a
   * connection on first use): at the limit, say which and how to raise it. */
  char hint[200] = "";
  if (rc == -FI_EMFILE || rc == -ENFILE) {
    hint[0] = ':';
    hint[1] = ' ';
    hixl__nofile_hint(hint + 2, sizeof(hint) - 2);
  }
  return hixl__err(st, "fabric: %s: %s (%zd)%s", what, fi_strerror((int)-rc), rc, hint);
}

/* ------------------------------------------------------------ set-up */

/* Not sockets (deprecated upstream): it claims send-after-write order it
 * does not keep, and a 1000-write batch once never completed under load in
 * CI; it still runs when named in HIXL_FABRIC_PROVIDER. */
static const char *const prefer[] = {"efa", "cxi", "verbs;ofi_rxm", "tcp;ofi_rxm", "tcp", "shm"};

static struct fi_info *hints_for(const char *prov, bool atomics, bool dc, bool source)
{
  struct fi_info *h = fi_allocinfo();
  if (h == NULL)
    return NULL;
  h->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND |
            FI_RECV | (atomics ? FI_ATOMIC : 0) | (source ? FI_SOURCE : 0);
  h->ep_attr->type = FI_EP_RDM;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->domain_attr->threading = FI_THREAD_SAFE;
  h->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  h->tx_attr->msg_order = FI_ORDER_SAW | FI_ORDER_SAS | FI_ORDER_RAW;
  if (dc)
    h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  h->fabric_attr->prov_name = strdup(prov);
  return h;
}

/* rxm sizes its buffer pools from the environment only, read once, when
 * libfabric initialises its providers (the first fi_getinfo of the
 * process; the fi_info hints do not reach them), and libfabric's defaults
 * cost 64 MB per context at set-up and 17.7 MB per connection at its first
 * operation (docs/scale.md):
 *   FI_OFI_RXM_MSG_RX_SIZE, 4,096: buffers posted to the shared receive
 *     context.  Local: peers do not depend on it.
 *   FI_OFI_RXM_BUFFER_SIZE, 16 KiB: each buffer, and rxm's eager limit.
 *     The transmit pool grows by 1,024 of them at a connection's first
 *     send.  hixl's messages are FAB_MSG_SIZE bytes and its RMA does not
 *     go through these buffers, so 1 KiB is plenty.  Both sides must agree
 *     (rxm rejects a connection whose eager limit differs), so the bind
 *     carries it and a mismatch fails the connect saying so.
 * A variable the user set wins. */
static const char *const rxm_sized[] = {"FI_OFI_RXM_MSG_RX_SIZE=256",
                                        "FI_OFI_RXM_BUFFER_SIZE=1024"};
#define N_SIZED (sizeof(rxm_sized) / sizeof(rxm_sized[0]))
/* Never freed: another thread's getenv may still walk it after we put the
 * original back (a static keeps it reachable for leak checkers). */
static char **volatile env_sized; /* volatile: written only, kept */
/* The buffer size rxm was initialised with, as rxm reads it (rxm_init.c:
 * strtol base 0, capped at INT32_MAX; 16 KiB unset). */
static uint32_t rxm_buf_size = 16384;

static void rxm_note_buf_size(void)
{
  const char *v = getenv("FI_OFI_RXM_BUFFER_SIZE");
  if (v == NULL)
    return;
  long n = strtol(v, NULL, 0);
  rxm_buf_size = (size_t)n > INT32_MAX ? INT32_MAX : (uint32_t)n;
}

static int getinfo_keep_signals(struct fi_info *hints, struct fi_info **info);

/* Not setenv: that may free the array another thread's getenv walks.
 * Publish a longer copy with one store, and put the original back after
 * the providers are initialised, so that child processes do not inherit
 * our sizes.  If someone changed environ meanwhile, theirs stays (it then
 * carries our variables too). */
static void rxm_init_sized(void)
{
  char **old = environ;
  size_t n = 0, add = 0;
  while (old != NULL && old[n] != NULL)
    n++;
  char **e = malloc((n + N_SIZED + 1) * sizeof(*e));
  if (e != NULL) {
    if (n)
      memcpy(e, old, n * sizeof(*e));
    for (size_t i = 0; i < N_SIZED; i++) {
      char name[64];
      size_t len = strcspn(rxm_sized[i], "=");
      snprintf(name, sizeof(name), "%.*s", (int)len, rxm_sized[i]);
      if (getenv(name) == NULL)
        e[n + add++] = (char *)rxm_sized[i];
    }
    e[n + add] = NULL;
    if (add == 0) {
      free(e);
      e = NULL;
    } else {
      env_sized = e;
      __atomic_store_n(&environ, e, __ATOMIC_RELEASE);
    }
  }
  rxm_note_buf_size(); /* what the providers see now */
  /* fi_ini, and nothing else: no provider has this name. */
  struct fi_info *h = fi_allocinfo(), *info = NULL;
  if (h != NULL && (h->fabric_attr->prov_name = strdup("hixl-init")) != NULL &&
      getinfo_keep_signals(h, &info) == 0)
    fi_freeinfo(info);
  if (h != NULL)
    fi_freeinfo(h);
  if (e != NULL)
    __atomic_compare_exchange_n(&environ, &e, old, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
  /* Without memory for the copy or the hints, libfabric initialises at the
   * first real fi_getinfo with its own sizes: dearer, not wrong. */
}

hixl_fab_lib_t hixl__fab_lib;
static pthread_once_t fab_lib_once = PTHREAD_ONCE_INIT;
static char fab_lib_error[256];

static void fab_lib_load_once(void)
{
  struct sigaction old[HIXL_N_KEPT_SIGS];
  hixl__sigs_save(old);
  void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  hixl__sigs_restore(old);
  if (h == NULL) {
    snprintf(fab_lib_error, sizeof(fab_lib_error), "cannot load libfabric.so.1: %s", dlerror());
    return;
  }
  hixl_fab_lib_t l = {
      .getinfo = (int (*)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
                          struct fi_info **))dlsym(h, "fi_getinfo"),
      .freeinfo = (void (*)(struct fi_info *))dlsym(h, "fi_freeinfo"),
      .dupinfo = (struct fi_info * (*)(const struct fi_info *)) dlsym(h, "fi_dupinfo"),
      .fabric =
          (int (*)(struct fi_fabric_attr *, struct fid_fabric **, void *))dlsym(h, "fi_fabric"),
      .strerror = (const char *(*)(int))dlsym(h, "fi_strerror"),
  };
  if (!l.getinfo || !l.freeinfo || !l.dupinfo || !l.fabric || !l.strerror) {
    snprintf(fab_lib_error, sizeof(fab_lib_error),
             "libfabric.so.1 lacks fi_getinfo, "
             "fi_freeinfo, fi_dupinfo, fi_fabric or fi_strerror");
    dlclose(h);
    return;
  }
  hixl__fab_lib = l; /* the handle stays open for the life of the process */
  rxm_init_sized();
}

/* Load libfabric once per process; NO_DEVICE (saying why) without it. */
static hixl_status_t fab_lib_load(void)
{
  pthread_once(&fab_lib_once, fab_lib_load_once);
  if (hixl__fab_lib.getinfo == NULL)
    return hixl__err(HIXL_ERR_NO_DEVICE, "fabric: %s", fab_lib_error);
  return HIXL_OK;
}

/* fi_getinfo loads providers on its first call: keep the signals there too. */
static int getinfo_keep_signals(struct fi_info *hints, struct fi_info **info)
{
  struct sigaction old[HIXL_N_KEPT_SIGS];
  hixl__sigs_save(old);
  int rc = fi_getinfo(FAB_VERSION, NULL, NULL, 0, hints, info);
  hixl__sigs_restore(old);
  return rc;
}

/* The first info of provider prov: with FI_SOURCE (the sender's address on
 * receive completions) if it has it, with atomics if it has them, with
 * delivery completion if it has it (*dc_p, *source_p say). */
static struct fi_info *probe(const char *prov, bool *dc_p, bool *source_p)
{
  static const bool tries[4][2] = {{1, 1}, {0, 1}, {1, 0}, {0, 0}};
  /* HIXL_FABRIC_DC=0: as if the provider had no delivery completion (tests
   * the read-after-write path with a provider that has it). */
  const char *dcenv = getenv("HIXL_FABRIC_DC");
  int first = dcenv && strcmp(dcenv, "0") == 0 ? 2 : 0;
  for (int st = 0; st < 8; st++) {
    int t = first + st % 4;
    bool source = st < 4;
    if (t >= 4)
      continue;
    struct fi_info *h = hints_for(prov, tries[t][0], tries[t][1], source), *info = NULL;
    if (h == NULL)
      return NULL;
    int rc = getinfo_keep_signals(h, &info);
    fi_freeinfo(h);
    if (rc == 0 && info) {
      /* fi_getinfo matches "tcp" inside "tcp;ofi_rxm": keep exact names. */
      for (struct fi_info *i = info; i; i = i->next)
        if (strcmp(i->fabric_attr->prov_name, prov) == 0) {
          struct fi_info *one = fi_dupinfo(i);
          fi_freeinfo(info);
          *dc_p = tries[t][1];
          *source_p = source;
          return one;
        }
      fi_freeinfo(info);
    }
  }
  return NULL;
}

static void fc_free(fab_ctx_t *fc)
{
  if (fc == NULL)
    return;
  if (fc->thread_started) {
    atomic_store(&fc->stop, true);
    pthread_join(fc->thread, NULL);
  }
  /* Read only now: the progress thread counts under poll_lock, and could
   * still be counting until the join (ThreadSanitizer caught the read
   * that came before it). */
  if (fc->n_dropped)
    hixl_info("fabric: %llu notification messages from unbound senders were dropped",
              (unsigned long long)fc->n_dropped);
  if (fc->ep)
    fi_close(&fc->ep->fid);
  if (fc->rbufs_mr)
    fi_close(&fc->rbufs_mr->fid);
  if (fc->av)
    fi_close(&fc->av->fid);
  if (fc->cq)
    fi_close(&fc->cq->fid);
  if (fc->domain)
    fi_close(&fc->domain->fid);
  if (fc->fabric)
    fi_close(&fc->fabric->fid);
  if (fc->info)
    fi_freeinfo(fc->info);
  /* The endpoint is closed: no completion comes for what was left. */
  while (fc->orphans)
    hixl__fab_orphan_free(fc, fc->orphans);
  pthread_mutex_destroy(&fc->orphan_lock);
  hixl__fab_ops_free(fc);
  free(fc->rbufs);
  free(fc->lregs);
  free(fc->smap);
  pthread_mutex_destroy(&fc->poll_lock);
  pthread_mutex_destroy(&fc->op_lock);
  pthread_rwlock_destroy(&fc->lreg_lock);
  free(fc);
}

static hixl_status_t open_all(fab_ctx_t *fc)
{
  struct fi_info *in = fc->info;
  int rc;
  if ((rc = fi_fabric(in->fabric_attr, &fc->fabric, NULL)))
    return hixl__fab_err(HIXL_ERR_TRANSPORT, "fi_fabric", rc);
  if ((rc = fi_domain(fc->fabric, in, &fc->domain, NULL)))
    return hixl__fab_err(HIXL_ERR_TRANSPORT, "fi_domain", rc);
  struct fi_cq_attr cqa = {
      .size = FAB_CQ_SIZE, .format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_FD};
  if (fi_cq_open(fc->domain, &cqa, &fc->cq, NULL) != 0) {
    cqa.wait_obj = FI_WAIT_NONE; /* the progress thread naps instead */
    if ((rc = fi_cq_open(fc->domain, &cqa, &fc->cq, NULL)))
      return hixl__fab_err(HIXL_ERR_TRANSPORT, "fi_cq_open", rc);
  }
  fc->wait_fd = -1;
  if (cqa.wait_obj == FI_WAIT_FD && fi_control(&fc->cq->fid, FI_GETWAIT, &fc->wait_fd) != 0)
    fc->wait_fd = -1;
  struct fi_av_attr ava = {.type = FI_AV_TABLE};
  if ((rc = fi_av_open(fc->domain, &ava, &fc->av, NULL)))
    return hixl__fab_err(HIXL_ERR_TRANSPORT, "fi_av_open", rc);
  if ((rc = fi_endpoint(fc->domain, in, &fc->ep, NULL)))
    return hixl__fab_err(HIXL_ERR_TRANSPORT, "fi_endpoint", rc);
  if ((rc = fi_ep_bind(fc->ep, &fc->cq->fid, FI_TRANSMIT | FI_RECV)) ||
      (rc = fi_ep_bind(fc->ep, &fc->av->fid, 0)) || (rc = fi_enable(fc->ep)))
    return hixl__fab_err(HIXL_ERR_TRANSPORT, "binding the endpoint", rc);
  fc->addrlen = sizeof(fc->addr) - sizeof(uint64_t); /* + a cookie in a bind's blob */
  if ((rc = fi_getname(&fc->ep->fid, fc->addr, &fc->addrlen)))
    return hixl__fab_err(HIXL_ERR_TRANSPORT, "fi_getname", rc);
  /* Notification receives. */
  fc->rbufs = calloc(FAB_RECV_COUNT, FAB_MSG_SIZE);
  if (fc->rbufs == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "fabric: no memory for receive buffers");
  if (fc->mr_local &&
      (rc = hixl__fab_mr_reg(fc, fc->rbufs, FAB_RECV_COUNT * FAB_MSG_SIZE, FI_RECV, &fc->rbufs_mr)))
    return hixl__fab_err(HIXL_ERR_TRANSPORT, "fi_mr_reg (receive buffers)", rc);
  return hixl__fab_post_recvs(fc);
}

/* Whether the provider has native 64-bit FAA and CAS. */
static bool native_atomics(fab_ctx_t *fc)
{
  if (!(fc->info->caps & FI_ATOMIC))
    return false;
  struct fi_atomic_attr a;
  return fi_query_atomic(fc->domain, FI_UINT64, FI_SUM, &a, FI_FETCH_ATOMIC) == 0 &&
         fi_query_atomic(fc->domain, FI_UINT64, FI_CSWAP, &a, FI_COMPARE_ATOMIC) == 0;
}

/* Whether a provider's send-after-write order also means the write's data
 * is in memory when the send completes at the target.  msg_order promises
 * the order in which operations are processed, not that data is placed
 * (sockets claims SAW and delivers a send before the write's bytes: the
 * conformance case notif_order catches it).  Trusted: providers whose wire
 * is one ordered stream per peer (tcp, rxm over verbs RC, shm).
 * HIXL_FABRIC_ORDERED=0/1 overrides. */
static bool trusted_order(const char *prov)
{
  const char *o = getenv("HIXL_FABRIC_ORDERED");
  if (o && (strcmp(o, "0") == 0 || strcmp(o, "1") == 0))
    return o[0] == '1';
  /* Not tcp;ofi_rxm nor tcp: they claim send-after-write order, yet across
   * two network namespaces under CPU load a notification arrived before
   * its put's data 5-9 times in 12 (tests/netns, notif_order beside two busy
   * processes; on loopback it never showed).  Their notifications wait for
   * the data's completion.  verbs;ofi_rxm is untested here; shm is one
   * host's memory. */
  static const char *const ok[] = {"verbs;ofi_rxm", "shm"};
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
    if (strcmp(prov, ok[i]) == 0)
      return true;
  return false;
}

static hixl_status_t fab_ctx_init(hixl_ctx_t *ctx)
{
  hixl_status_t lst = fab_lib_load();
  if (lst != HIXL_OK)
    return lst;
  const char *want = getenv("HIXL_FABRIC_PROVIDER");
  struct fi_info *info = NULL;
  bool dc = false, source = false;
  if (want && *want) {
    info = probe(want, &dc, &source);
    if (info == NULL)
      return hixl__err(HIXL_ERR_NO_DEVICE,
                       "fabric: provider \"%s\" (HIXL_FABRIC_PROVIDER) "
                       "offers no reliable endpoint with RMA and messages here",
                       want);
  } else {
    for (size_t i = 0; i < sizeof(prefer) / sizeof(prefer[0]) && info == NULL; i++)
      info = probe(prefer[i], &dc, &source);
    if (info == NULL)
      return hixl__err(HIXL_ERR_NO_DEVICE, "fabric: no libfabric provider with reliable "
                                           "endpoints, RMA and messages");
  }
  fab_ctx_t *fc = calloc(1, sizeof(*fc));
  if (fc == NULL) {
    fi_freeinfo(info);
    return hixl__err(HIXL_ERR_NOMEM, "fabric: no memory");
  }
  fc->ctx = ctx;
  fc->info = info;
  pthread_mutex_init(&fc->poll_lock, NULL);
  pthread_mutex_init(&fc->op_lock, NULL);
  pthread_mutex_init(&fc->orphan_lock, NULL);
  pthread_rwlock_init(&fc->lreg_lock, NULL);
  snprintf(fc->prov, sizeof(fc->prov), "%s", info->fabric_attr->prov_name);
  fc->rxm_buf = strstr(fc->prov, "ofi_rxm") != NULL ? rxm_buf_size : 0;
  fc->mr_mode = info->domain_attr->mr_mode;
  fc->virt_addr = fc->mr_mode & (FI_MR_VIRT_ADDR | FI_MR_BASIC);
  fc->prov_key = fc->mr_mode & (FI_MR_PROV_KEY | FI_MR_BASIC);
  fc->mr_local = fc->mr_mode & FI_MR_LOCAL;
  fc->mr_endpoint = fc->mr_mode & FI_MR_ENDPOINT;
  uint64_t order = info->tx_attr->msg_order;
  fc->ordered = (order & (FI_ORDER_SAW | FI_ORDER_SAS)) == (FI_ORDER_SAW | FI_ORDER_SAS) &&
                trusted_order(fc->prov);
  fc->manual = info->domain_attr->data_progress == FI_PROGRESS_MANUAL;
  fc->max_msg = info->ep_attr->max_msg_size ? info->ep_attr->max_msg_size : SIZE_MAX;
  /* Completion = visible at the target: delivery completion, or a read
   * behind each put (read-after-write order). */
  fc->dc = dc;
  fc->source = source;
  fc->tx_flags = FI_COMPLETION | (dc ? FI_DELIVERY_COMPLETE : 0);
  if (!dc && !(order & FI_ORDER_RAW)) {
    hixl_status_t e = hixl__err(HIXL_ERR_NO_DEVICE,
                                "fabric: %s has neither delivery "
                                "completion nor read-after-write order: a put's completion "
                                "could not mean visible",
                                fc->prov);
    fi_freeinfo(info);
    pthread_mutex_destroy(&fc->poll_lock);
    pthread_mutex_destroy(&fc->op_lock);
    pthread_mutex_destroy(&fc->orphan_lock);
    pthread_rwlock_destroy(&fc->lreg_lock);
    free(fc);
    return e;
  }
  hixl_status_t st = open_all(fc);
  if (st == HIXL_OK) {
    /* Whether the CQ's wait fd also wakes us for work a peer brings that
     * makes no completion here (the target side of its atomics and
     * messages): with tcp it is the sockets' readiness, so yes; libfabric's
     * shm provider queues them in shared memory without a signal, so its
     * target must keep polling (the progress thread naps, docs/waiting.md). */
    fc->wait_covers = fc->wait_fd >= 0 &&
                      (strncmp(fc->prov, "tcp", 3) == 0 || strncmp(fc->prov, "sockets", 7) == 0);

    fc->atomics = native_atomics(fc);
    ctx->tp[HIXL_TP_FABRIC] = fc;
    if (hixl__thread_start(&fc->thread, "hixl-fabric", hixl__fab_thread, fc) != 0)
      st = hixl__err(HIXL_ERR_NOMEM, "fabric: cannot start the progress thread");
    else
      fc->thread_started = true;
  }
  if (st != HIXL_OK) {
    ctx->tp[HIXL_TP_FABRIC] = NULL;
    fc_free(fc);
    return st;
  }
  hixl_info("fabric: provider %s (%s progress), %s atomics, %s notifications, %s, mr_mode "
            "%#llx, %s",
            fc->prov, fc->manual ? "manual" : "auto", fc->atomics ? "native" : "owner-executed",
            fc->ordered ? "ordered" : "waiting", fc->dc ? "delivery complete" : "read after write",
            (unsigned long long)fc->mr_mode,
            fc->source ? "senders by address (FI_SOURCE) and cookie" : "senders by cookie");
  return HIXL_OK;
}

/* Offered without looking: even loading libfabric costs ~200 ms here (a
 * provider library's constructor, infinipath's, sleeps in a loop), and
 * fi_getinfo initialises every provider.  Whether it loads and which
 * provider serves is found at the set-up; a failure there withdraws the
 * transport and is the error of the connection that needed it. */
static hixl_status_t fab_probe(hixl_ctx_t *ctx)
{
  (void)ctx;
  return HIXL_OK;
}

static void fab_ctx_fini(hixl_ctx_t *ctx)
{
  fc_free(FC(ctx));
  ctx->tp[HIXL_TP_FABRIC] = NULL;
}

/* ------------------------------------------------------------ regions */

uint64_t hixl__fab_rand64(void)
{
  uint64_t v = 0;
  size_t got = 0;
  while (got < sizeof(v)) {
    ssize_t n = getrandom((uint8_t *)&v + got, sizeof(v) - got, 0);
    if (n > 0)
      got += (size_t)n;
    else if (n < 0 && errno != EINTR && errno != EAGAIN)
      abort(); /* no randomness: a guessable key would open every region */
  }
  return v;
}

/* Keys are capabilities on the wire: whoever reaches our endpoint with a
 * valid key and address reads (and, with FI_REMOTE_WRITE, writes) the
 * region.  Never sequential: the provider's keys, else 64 random bits
 * (within the provider's key size), a new draw when one is taken. */
int hixl__fab_mr_reg(fab_ctx_t *fc, void *buf, size_t len, uint64_t access, struct fid_mr **mr_p)
{
  size_t ksz = fc->info->domain_attr->mr_key_size;
  uint64_t mask = ksz == 0 || ksz >= 8 ? ~0ull : (1ull << (8 * ksz)) - 1;
  int rc = -FI_ENOKEY;
  *mr_p = NULL;
  for (int tries = 0; tries < 16 && rc == -FI_ENOKEY; tries++) {
    uint64_t key = fc->prov_key ? 0 : hixl__fab_rand64() & mask;
    rc = fi_mr_reg(fc->domain, buf, len, access, 0, key, 0, mr_p, NULL);
    if (rc != 0)
      *mr_p = NULL;
    if (fc->prov_key)
      break;
  }
  if (rc == 0 && fc->mr_endpoint && (rc = fi_mr_bind(*mr_p, &fc->ep->fid, 0)) == 0)
    rc = fi_mr_enable(*mr_p);
  if (rc && *mr_p) {
    fi_close(&(*mr_p)->fid);
    *mr_p = NULL;
  }
  return rc;
}

static hixl_status_t fab_mr_reg(hixl_mr_t *mr)
{
  fab_ctx_t *fc = FC(mr->ctx);
  void *buf = mr->addr;
  if (mr->device >= 0) {
    /* No FI_HMEM here: the NIC address of device memory, or nothing (the
     * region then serves other transports; fabric peers are refused). */
    buf = hixl__dev_nic_addr(mr->addr);
    if (buf == NULL) {
      hixl_info("fabric: device region %p+%zu is not reachable by %s", mr->addr, mr->len, fc->prov);
      return HIXL_OK;
    }
  }
  /* A region no peer may touch is not exposed at all: registered only when
   * local operations need its descriptor (FI_MR_LOCAL), without remote
   * rights, and its key is never handed out (fab_mr_key). */
  bool remote = mr->access != 0;
  if (!remote && !(fc->mr_local && mr->device < 0))
    return HIXL_OK;
  /* Remote rights exactly as granted, so a provider that checks them
   * (libfabric's util MR map does) refuses the rest on the wire. */
  uint64_t acc = FI_READ | FI_WRITE | FI_SEND | FI_RECV;
  if (mr->access & HIXL_ACCESS_READ)
    acc |= FI_REMOTE_READ;
  if (mr->access & (HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC))
    acc |= FI_REMOTE_WRITE;
  fab_mr_t *m = calloc(1, sizeof(*m));
  if (m == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "fabric: no memory for a region");
  m->remote = remote;
  int rc = hixl__fab_mr_reg(fc, buf, mr->len, acc, &m->mr);
  if (rc) {
    free(m);
    return hixl__fab_err(HIXL_ERR_NOMEM, "fi_mr_reg", rc);
  }
  m->key = fi_mr_key(m->mr);
  m->base = fc->virt_addr ? (uint64_t)(uintptr_t)buf : 0;
  m->desc = fi_mr_desc(m->mr);
  if (m->key == FI_KEY_NOTAVAIL) {
    fi_close(&m->mr->fid);
    free(m);
    return hixl__err(HIXL_ERR_UNSUPPORTED, "fabric: %s has keys larger than 64 bits", fc->prov);
  }
  if (fc->mr_local && mr->device < 0) {
    pthread_rwlock_wrlock(&fc->lreg_lock);
    if (fc->n_lregs == fc->cap_lregs) {
      size_t cap = fc->cap_lregs ? 2 * fc->cap_lregs : 16;
      fab_lreg_t *v = realloc(fc->lregs, cap * sizeof(*v));
      if (v == NULL) {
        pthread_rwlock_unlock(&fc->lreg_lock);
        fi_close(&m->mr->fid);
        free(m);
        return hixl__err(HIXL_ERR_NOMEM, "fabric: no memory for the region index");
      }
      fc->lregs = v;
      fc->cap_lregs = cap;
    }
    fc->lregs[fc->n_lregs++] =
        (fab_lreg_t){(uintptr_t)mr->addr, (uintptr_t)mr->addr + mr->len, m->desc};
    pthread_rwlock_unlock(&fc->lreg_lock);
  }
  mr->tp[HIXL_TP_FABRIC] = m;
  return HIXL_OK;
}

static void fab_mr_dereg(hixl_mr_t *mr)
{
  fab_mr_t *m = mr->tp[HIXL_TP_FABRIC];
  if (m == NULL)
    return;
  fab_ctx_t *fc = FC(mr->ctx);
  pthread_rwlock_wrlock(&fc->lreg_lock);
  for (size_t i = 0; i < fc->n_lregs; i++)
    if (fc->lregs[i].desc == m->desc && fc->lregs[i].start == (uintptr_t)mr->addr) {
      fc->lregs[i] = fc->lregs[--fc->n_lregs];
      break;
    }
  pthread_rwlock_unlock(&fc->lreg_lock);
  fi_close(&m->mr->fid);
  free(m);
  mr->tp[HIXL_TP_FABRIC] = NULL;
}

/* A peer's key for mr: the provider's key and the remote address of byte 0,
 * for regions registered for remote access. */
static bool fab_mr_key(const hixl_mr_t *mr, uint64_t key[2])
{
  const fab_mr_t *m = mr->tp[HIXL_TP_FABRIC];
  if (m == NULL || !m->remote)
    return false;
  key[0] = m->key;
  key[1] = m->base;
  return true;
}

void *hixl__fab_region_desc(fab_ctx_t *fc, const void *p, size_t len)
{
  uintptr_t a = (uintptr_t)p, e = a + len;
  void *d = NULL;
  pthread_rwlock_rdlock(&fc->lreg_lock);
  for (size_t i = 0; i < fc->n_lregs && d == NULL; i++)
    if (a >= fc->lregs[i].start && e <= fc->lregs[i].end)
      d = fc->lregs[i].desc;
  pthread_rwlock_unlock(&fc->lreg_lock);
  return d;
}

/* ------------------------------------------------------------ peers */

static bool fab_usable(hixl_ctx_t *ctx, const hixl_msg_t *hello)
{
  fab_ctx_t *fc = FC(ctx);
  if (fc == NULL)
    return false;
  /* The shm provider reaches only this host. */
  if (strcmp(fc->prov, "shm") == 0)
    return memcmp(ctx->host_id, hello->host_id, sizeof(ctx->host_id)) == 0;
  return true;
}

static hixl_status_t smap_add(fab_ctx_t *fc, hixl_peer_t *peer)
{ /* peer->tp set */
  pthread_mutex_lock(&fc->poll_lock);
  if (fc->n_smap == fc->cap_smap) {
    size_t cap = fc->cap_smap ? 2 * fc->cap_smap : 16;
    struct fab_smap *v = realloc(fc->smap, cap * sizeof(*v));
    if (v == NULL) {
      pthread_mutex_unlock(&fc->poll_lock);
      return hixl__err(HIXL_ERR_NOMEM, "fabric: no memory for the peer map");
    }
    fc->smap = v;
    fc->cap_smap = cap;
  }
  fab_peer_t *fp = peer->tp;
  fc->smap[fc->n_smap++] = (struct fab_smap){fp->fa, fp->rx_cookie, peer};
  atomic_fetch_add(&fc->n_bound, 1);
  pthread_mutex_unlock(&fc->poll_lock);
  return HIXL_OK;
}

hixl_peer_t *hixl__fab_sender(fab_ctx_t *fc, fi_addr_t src, uint64_t cookie)
{
  /* The newest binding (a reconnect replaces the old).  With FI_SOURCE the
   * address picks the peer and the cookie must be the one we gave it; the
   * payload's sender id is never believed. */
  for (size_t i = fc->n_smap; i-- > 0;)
    if ((!fc->source || fc->smap[i].fa == src) && fc->smap[i].cookie == cookie)
      return fc->smap[i].peer;
  fab_dropped(fc);
  if (fc->n_dropped == 1 || (fc->n_dropped & (fc->n_dropped - 1)) == 0)
    hixl_warn("fabric: dropped a notification from an unbound sender (%llu so far)",
              (unsigned long long)fc->n_dropped);
  return NULL;
}

/* An endpoint name travels with a cookie: name || 8 bytes (little-endian). */
static size_t blob_with_cookie(uint8_t *blob, const fab_ctx_t *fc, uint64_t cookie)
{
  memcpy(blob, fc->addr, fc->addrlen);
  uint64_t le = htole64(cookie);
  memcpy(blob + fc->addrlen, &le, sizeof(le));
  return fc->addrlen + sizeof(le);
}

/* A peer's fabric state: its address in our vector, the cookies (blob:
 * its name || its cookie for us). */
static hixl_status_t attach_peer(hixl_peer_t *peer, const uint8_t *blob, size_t len,
                                 uint64_t rx_cookie)
{
  fab_ctx_t *fc = FC(peer->ctx);
  if (len <= sizeof(uint64_t))
    return hixl__err(HIXL_ERR_TRANSPORT, "fabric: %s sent a malformed endpoint name", peer->name);
  fab_peer_t *fp = calloc(1, sizeof(*fp));
  if (fp == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "fabric: no memory for a peer");
  fp->peer = peer;
  fp->rx_cookie = rx_cookie;
  atomic_init(&fp->outstanding, FAB_PEER_OPEN);
  uint64_t le;
  memcpy(&le, blob + len - sizeof(le), sizeof(le));
  fp->tx_cookie = le64toh(le);
  int rc = fi_av_insert(fc->av, blob, 1, &fp->fa, 0, NULL);
  if (rc != 1) {
    free(fp);
    return hixl__fab_err(HIXL_ERR_TRANSPORT, "fi_av_insert", rc < 0 ? rc : -FI_EINVAL);
  }
  peer->tp = fp;
  hixl_status_t st = smap_add(fc, peer);
  if (st != HIXL_OK) {
    peer->tp = NULL;
    fi_av_remove(fc->av, &fp->fa, 1, 0);
    free(fp);
    return st;
  }
  return HIXL_OK;
}

/* rxm refuses a connection between endpoints of different eager limits
 * and then leaves every operation queued until it times out as "queues
 * full": say so at the bind instead.  A peer that sent 0 is not rxm (the
 * provider names already matched) or a hixl before this check. */
static bool rxm_buf_agrees(const fab_ctx_t *fc, uint64_t theirs, const char *us, const char *them,
                           char *why, size_t len)
{
  if (theirs == 0 || fc->rxm_buf == 0 || theirs == fc->rxm_buf)
    return true;
  snprintf(why, len,
           "rxm buffer size %u %s, %llu %s: set FI_OFI_RXM_BUFFER_SIZE the same on both sides (or "
           "on neither)",
           fc->rxm_buf, us, (unsigned long long)theirs, them);
  return false;
}

static hixl_status_t fab_connect(hixl_peer_t *peer, const hixl_msg_t *ack, int64_t deadline)
{
  (void)ack;
  fab_ctx_t *fc = FC(peer->ctx);
  hixl_msg_t m = {.type = HIXL_MSG_TP_BIND}, r;
  snprintf(m.str[0], sizeof(m.str[0]), "%s", fc->prov);
  uint64_t rx_cookie = hixl__fab_rand64();
  m.blob_len = (uint32_t)blob_with_cookie(m.blob, fc, rx_cookie);
  HIXL_MSG_AS(fab_bind_msg_t, &m)->ctx_id = peer->ctx->id;
  HIXL_MSG_AS(fab_bind_msg_t, &m)->rxm_buf = fc->rxm_buf;
  hixl_status_t st = hixl__send(peer, &m, NULL, 0);
  if (st == HIXL_OK)
    st = hixl__peer_recv_sync(peer, &r, deadline);
  if (st != HIXL_OK)
    return st;
  if (r.type != HIXL_MSG_TP_BIND_REPLY || r.status != HIXL_OK || r.blob_len == 0)
    return hixl__err(r.type == HIXL_MSG_TP_BIND_REPLY && r.status == HIXL_ERR_UNSUPPORTED
                         ? HIXL_ERR_UNSUPPORTED
                         : HIXL_ERR_TRANSPORT,
                     "fabric: %s refused our endpoint (%s%s%s)", peer->name,
                     hixl_strerror(r.status), r.str[0][0] ? ": " : "", r.str[0]);
  char why[HIXL_WIRE_STR];
  if (!rxm_buf_agrees(fc, HIXL_MSG_AS(fab_bind_msg_t, &r)->rxm_buf, "here", "there", why,
                      sizeof(why)))
    return hixl__err(HIXL_ERR_UNSUPPORTED, "fabric: cannot connect to %s: %s", peer->name, why);
  return attach_peer(peer, r.blob, r.blob_len, rx_cookie);
}

static void fab_accept(hixl_peer_t *peer, const hixl_msg_t *m, int *fds, int nfds, int sock,
                       hixl_msg_t *out, int *out_fds, int *n_out)
{
  (void)fds, (void)nfds, (void)sock, (void)out_fds, (void)n_out; /* an in-band bind */
  fab_ctx_t *fc = FC(peer->ctx);
  memset(out, 0, sizeof(*out));
  out->type = HIXL_MSG_TP_BIND_REPLY;
  if (strcmp(m->str[0], fc->prov) != 0) {
    out->status = HIXL_ERR_UNSUPPORTED;
    snprintf(out->str[0], sizeof(out->str[0]), "provider %s here, %s there", fc->prov, m->str[0]);
    return;
  }
  if (!rxm_buf_agrees(fc, HIXL_MSG_AS(fab_bind_msg_t, m)->rxm_buf, "at the target",
                      "at the initiator", out->str[0], sizeof(out->str[0]))) {
    out->status = HIXL_ERR_UNSUPPORTED;
    hixl_warn("fabric: refused %s: %s", peer->name, out->str[0]);
    return;
  }
  uint64_t rx_cookie = hixl__fab_rand64();
  hixl_status_t st = attach_peer(peer, m->blob, m->blob_len, rx_cookie);
  out->status = st;
  if (st != HIXL_OK) {
    snprintf(out->str[0], sizeof(out->str[0]), "%s", hixl_last_error());
    return;
  }
  snprintf(out->str[0], sizeof(out->str[0]), "%s", fc->prov);
  HIXL_MSG_AS(fab_bind_msg_t, out)->rxm_buf = fc->rxm_buf;
  out->blob_len = (uint32_t)blob_with_cookie(out->blob, fc, rx_cookie);
}

static void fab_peer_close(hixl_peer_t *peer)
{
  fab_peer_t *fp = peer->tp;
  if (fp == NULL)
    return;
  fab_ctx_t *fc = FC(peer->ctx);
  if (!hixl__fab_drain_peer(fp))
    hixl_warn("fabric: %d operations to %s did not finish; their record is kept until they "
              "do or the context goes",
              fab_inflight(fp), peer->name);
  pthread_mutex_lock(&fc->poll_lock);
  for (size_t i = 0; i < fc->n_smap; i++)
    if (fc->smap[i].peer == peer) {
      memmove(fc->smap + i, fc->smap + i + 1, (fc->n_smap - i - 1) * sizeof(*fc->smap));
      fc->n_smap--;
      atomic_fetch_sub(&fc->n_bound, 1);
      break;
    }
  fp->peer = NULL; /* completions read it under poll_lock, and the handle may go first */
  pthread_mutex_unlock(&fc->poll_lock);
  fi_av_remove(fc->av, &fp->fa, 1, 0);
  peer->tp = NULL;
  hixl__inbox_forget(peer);
  /* Operations still in flight keep the record (their completion reads
   * op->fp); the last one frees it.  The open bit goes under orphan_lock: a
   * completion taking the count to 0 right after waits there for the
   * record to be listed before it unlinks it. */
  pthread_mutex_lock(&fc->orphan_lock);
  if (atomic_fetch_and(&fp->outstanding, ~FAB_PEER_OPEN) == FAB_PEER_OPEN) {
    pthread_mutex_unlock(&fc->orphan_lock);
    free(fp);
    return;
  }
  peer->tp_kept = true; /* their completions name its requests, whose peer this is */
  fp->orphan_next = fc->orphans;
  fp->orphan_prev = &fc->orphans;
  if (fc->orphans)
    fc->orphans->orphan_prev = &fp->orphan_next;
  fc->orphans = fp;
  pthread_mutex_unlock(&fc->orphan_lock);
}

void hixl__fab_orphan_free(fab_ctx_t *fc, fab_peer_t *fp)
{
  pthread_mutex_lock(&fc->orphan_lock);
  *fp->orphan_prev = fp->orphan_next;
  if (fp->orphan_next)
    fp->orphan_next->orphan_prev = fp->orphan_prev;
  pthread_mutex_unlock(&fc->orphan_lock);
  free(fp);
}

/* ------------------------------------------------------------ remote keys */

static hixl_status_t fab_rmr_attach(hixl_rmr_t *r, int64_t deadline)
{
  return hixl__rmr_key_call(r, "its fabric provider cannot reach", deadline);
}

static void fab_rmr_detach(hixl_rmr_t *r) { (void)r; }

static bool fab_rmr_live(const hixl_rmr_t *r) { return !atomic_load(&r->gone); }

static void fab_notif_poll(hixl_ctx_t *ctx) { hixl__fab_progress(ctx); }

/* A thread is about to sleep (wait.c): the CQ's wait fd, once fi_trywait
 * says nothing is pending.  The progress thread sleeps on it too and wakes
 * waiters when it completes what they wait for; whoever reads the CQ first
 * handles it. */
static int fab_arm(hixl_ctx_t *ctx, unsigned flags, int *fds, int max)
{
  (void)flags;
  fab_ctx_t *fc = hixl__fc(ctx);
  if (fc == NULL || !fc->wait_covers || max < 1 || atomic_load(&fc->n_bound) == 0)
    return 0; /* the progress thread polls, and wakes us when it completes ours */
  struct fid *f = &fc->cq->fid;
  if (fi_trywait(fc->fabric, &f, 1) != FI_SUCCESS)
    return -1;
  fds[0] = fc->wait_fd;
  return 1;
}

static void fab_ack_event(hixl_ctx_t *ctx, int64_t woke_ns, bool word)
{
  (void)woke_ns;
  (void)word; /* no words: arm gives fds only */
  hixl__fab_progress(ctx);
}

const hixl_transport_ops_t hixl__fabric_ops = {
    .size = sizeof(hixl_transport_ops_t),
    .name = "fabric",
    .id = HIXL_TP_FABRIC,
    .async = true,
    .needs_bind = true,
    .caps = HIXL_TP_CAP_LAZY,
    .ctx_init = fab_ctx_init,
    .probe = fab_probe,
    .ctx_fini = fab_ctx_fini,
    .mr_reg = fab_mr_reg,
    .mr_dereg = fab_mr_dereg,
    .usable = fab_usable,
    .connect = fab_connect,
    .accept = fab_accept,
    .peer_close = fab_peer_close,
    .rmr_attach = fab_rmr_attach,
    .rmr_detach = fab_rmr_detach,
    .rmr_live = fab_rmr_live,
    .put = hixl__fab_put,
    .get = hixl__fab_get,
    .put_imm = hixl__fab_put_imm,
    .notify = hixl__fab_notify,
    .atomic = hixl__fab_atomic,
    .progress = hixl__fab_progress,
    .on_event = hixl__tp_on_event_none,
    .notif_poll = fab_notif_poll,
    .arm = fab_arm,
    .ack_event = fab_ack_event,
    .mr_key = fab_mr_key,
};

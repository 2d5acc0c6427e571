/* SPDX-License-Identifier: MIT */
/*
 * Region registry: registration, allocation, remote keys, names, and the
 * owner-side checks a peer's request goes through.  The table of live
 * regions is shared read-only with same-host peers (see provider.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core.h"
#include "rkey.h"

#define ACCESS_ALL (HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC)

void hixl__quarantine_locked(hixl_ctx_t *ctx, void *obj)
{
  void *old = ctx->quarantine[ctx->q_next];
  ctx->quarantine[ctx->q_next] = obj;
  ctx->q_next = (ctx->q_next + 1) % HIXL_QUARANTINE;
  free(old);
}

static hixl_status_t reg_common(hixl_ctx_t *ctx, void *addr, size_t len, unsigned access, int memfd,
                                uint64_t fd_off, bool owns, int device, hixl_mr_t **mr_p)
{
  hixl_mr_t *mr = calloc(1, sizeof(*mr));
  if (mr == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "no memory for a region");
  pthread_mutex_lock(&ctx->reg_lock);
  uint32_t slot = UINT32_MAX;
  for (uint32_t i = 0; i < HIXL_REG_SLOTS; i++) {
    uint32_t s = (ctx->reg_hint + i) % HIXL_REG_SLOTS;
    if (ctx->slot_mr[s] == NULL) {
      slot = s;
      break;
    }
  }
  if (slot == UINT32_MAX) {
    pthread_mutex_unlock(&ctx->reg_lock);
    free(mr);
    return hixl__err(HIXL_ERR_NOMEM, "too many registered regions (%u)", HIXL_REG_SLOTS);
  }
  ctx->reg_hint = slot + 1;
  *mr = (hixl_mr_t){.magic = HIXL_MAGIC_MR,
                    .ctx = ctx,
                    .addr = addr,
                    .len = len,
                    .access = access,
                    .slot = slot,
                    .rkey = hixl__random64(),
                    .memfd = memfd,
                    .fd_off = fd_off,
                    .owns_mem = owns,
                    .device = device};
  hixl_reg_slot_t *s = &ctx->reg_table[slot];
  s->base = (uint64_t)(uintptr_t)addr;
  s->len = len;
  s->access = access;
  /* MEMFD: shm peers may map the memfd (FD_REQ).  A mapping always reads,
   * so only for a region that grants READ; one without reaches them as a
   * non-mapped region (CMA, or our copies), whose every access is checked. */
  s->flags = (device >= 0 ? HIXL_REGF_DEVICE : 0) |
             (memfd >= 0 && (access & HIXL_ACCESS_READ) ? HIXL_REGF_MEMFD : 0);
  atomic_store_explicit(&s->rkey, mr->rkey, memory_order_release);
  ctx->slot_mr[slot] = mr;
  mr->next = ctx->mrs;
  ctx->mrs = mr;
  /* The transports ready now register it below; one set up from here on
   * finds it in ctx->mrs (hixl__mrs_reg_transport, under reg_lock). */
  uint32_t ready = atomic_load(&ctx->tp_ready);
  pthread_mutex_unlock(&ctx->reg_lock);
  /* Each transport with a device registers it too (verbs: ibv_reg_mr), so
   * that every peer can reach it however it is connected. */
  for (size_t i = 0; i < hixl__n_transports; i++) {
    const hixl_transport_ops_t *ops = hixl__transports[i];
    if (!(ready & (1u << ops->id)))
      continue;
    hixl_status_t st = ops->mr_reg(mr);
    if (st != HIXL_OK) {
      mr->owns_mem = false; /* the caller frees what it allocated */
      mr->memfd = -1;
      hixl_mr_dereg(mr);
      return st;
    }
  }
  hixl_debug("registered %p+%zu access %u slot %u%s", addr, len, access, slot,
             device >= 0  ? " (device)"
             : memfd >= 0 ? " (memfd)"
                          : "");
  *mr_p = mr;
  return HIXL_OK;
}

static hixl_status_t check_reg_args(const char *fn, hixl_ctx_t *ctx, const void *addr, size_t len,
                                    unsigned access, const void *out)
{
  if (ctx == NULL || addr == NULL || out == NULL)
    return hixl__err(HIXL_ERR_INVALID, "%s: NULL %s", fn,
                     ctx == NULL    ? "ctx"
                     : addr == NULL ? "addr"
                                    : "output pointer");
  if (len == 0)
    return hixl__err(HIXL_ERR_INVALID, "%s: zero length", fn);
  if ((uintptr_t)addr + len < (uintptr_t)addr)
    return hixl__err(HIXL_ERR_INVALID, "%s: %p + %zu wraps the address space", fn, addr, len);
  if (access & ~(unsigned)ACCESS_ALL)
    return hixl__err(HIXL_ERR_INVALID, "%s: unknown access bits 0x%x", fn,
                     access & ~(unsigned)ACCESS_ALL);
  return HIXL_OK;
}

hixl_status_t hixl_mr_reg(hixl_ctx_t *ctx, void *addr, size_t len, unsigned access,
                          hixl_mr_t **mr_p)
{
  hixl_status_t st = check_reg_args("hixl_mr_reg", ctx, addr, len, access, mr_p);
  if (st != HIXL_OK)
    return st;
  /* Device memory passed here is registered as what it is. */
  hixl_dev_range_t dr;
  if (hixl__is_dev(addr) && hixl__dev_lookup(addr, &dr))
    return hixl_mr_reg_device(ctx, addr, len, dr.device, access, mr_p);
  /* Exactly memory we allocated (a second registration of an allocation,
   * with other rights)?  Then peers can map it too.  Not a part of one: a
   * peer handed the memfd could map all of it, not just the region, so a
   * region inside an allocation is reached as non-mapped memory (CMA, or
   * our copies), every access checked against its bounds. */
  int memfd = -1;
  pthread_mutex_lock(&ctx->reg_lock);
  for (hixl_mr_t *m = ctx->mrs; m; m = m->next)
    if (m->owns_mem && m->device < 0 && addr == m->addr && len == m->len) {
      memfd = fcntl(m->memfd, F_DUPFD_CLOEXEC, 0);
      break;
    }
  pthread_mutex_unlock(&ctx->reg_lock);
  st = reg_common(ctx, addr, len, access, memfd, 0, false, -1, mr_p);
  if (st != HIXL_OK && memfd >= 0)
    close(memfd);
  return st;
}

hixl_status_t hixl_mr_reg_device(hixl_ctx_t *ctx, void *addr, size_t len, int device_id,
                                 unsigned access, hixl_mr_t **mr_p)
{
  hixl_status_t st = check_reg_args("hixl_mr_reg_device", ctx, addr, len, access, mr_p);
  if (st == HIXL_OK)
    st = hixl__dev_check_reg("hixl_mr_reg_device", addr, len, device_id);
  if (st != HIXL_OK)
    return st;
  return reg_common(ctx, addr, len, access, -1, 0, false, device_id, mr_p);
}

hixl_status_t hixl_mem_alloc(hixl_ctx_t *ctx, size_t len, hixl_mem_kind_t kind, unsigned access,
                             void **addr_p, hixl_mr_t **mr_p)
{
  if (addr_p == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_mem_alloc: NULL addr_p");
  hixl_status_t st = check_reg_args("hixl_mem_alloc", ctx, addr_p, len, access, mr_p);
  if (st != HIXL_OK)
    return st;
  if (kind == HIXL_MEM_DEVICE) {
    void *p;
    int device;
    if ((st = hixl__dev_alloc(len, &device, &p)) != HIXL_OK)
      return st;
    if ((st = reg_common(ctx, p, len, access, -1, 0, true, device, mr_p)) != HIXL_OK) {
      hixl__dev_free(p);
      return st;
    }
    *addr_p = p;
    return HIXL_OK;
  }
  if (kind != HIXL_MEM_HOST)
    return hixl__err(HIXL_ERR_INVALID, "hixl_mem_alloc: unknown memory kind %d", (int)kind);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (len > SIZE_MAX - page)
    return hixl__err(HIXL_ERR_NOMEM, "hixl_mem_alloc: %zu bytes is too large", len);
  size_t map_len = (len + page - 1) & ~(page - 1);
  int fd = hixl__memfd("hixl-mem", map_len);
  if (fd < 0)
    return hixl__err(HIXL_ERR_NOMEM, "hixl_mem_alloc: memfd of %zu bytes: %s", map_len,
                     strerror(errno));
  void *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return hixl__err(HIXL_ERR_NOMEM, "hixl_mem_alloc: mmap of %zu bytes: %s", map_len, strerror(e));
  }
  st = reg_common(ctx, p, len, access, fd, 0, true, -1, mr_p);
  if (st != HIXL_OK) {
    munmap(p, map_len);
    close(fd);
    return st;
  }
  *addr_p = p;
  return HIXL_OK;
}

static void mr_unpublish_locked(hixl_ctx_t *ctx, hixl_mr_t *mr)
{
  for (int i = 0; i < HIXL_MAX_PUBLISHED; i++)
    if (ctx->published[i].mr == mr)
      ctx->published[i] = (hixl_published_t){0};
}

static bool mr_valid(const hixl_mr_t *mr) { return mr != NULL && mr->magic == HIXL_MAGIC_MR; }

/* Peers told of a deregistration: up, of a transport with remote keys. */
static bool told_of_dereg(hixl_peer_t *p)
{
  return hixl__tp_remote_keys(p->ops) && atomic_load(&p->state) == HIXL_PEER_UP;
}

hixl_status_t hixl_mr_dereg(hixl_mr_t *mr)
{
  if (!mr_valid(mr))
    return hixl__err(HIXL_ERR_INVALID, "hixl_mr_dereg: %s region",
                     mr == NULL ? "NULL" : "invalid or already deregistered");
  hixl_ctx_t *ctx = mr->ctx;
  pthread_mutex_lock(&ctx->lock);
  mr_unpublish_locked(ctx, mr);
  pthread_mutex_unlock(&ctx->lock);
  /* Peers that cannot read our region table (verbs) are told, and we wait
   * (bounded by the timeout) for each to acknowledge: an operation a peer
   * issues after this call returns fails there with NOT_REGISTERED instead
   * of reaching the dead key and breaking its QP.  One already in flight
   * may still land, as the header says.  The snapshot is pinned: none of
   * its peers is freed while we wait on each outside the lock. */
  size_t k = 0;
  hixl_peer_t **vps = hixl__peers_pin(ctx, told_of_dereg, &k);
  if (vps == NULL)
    k = 0; /* no memory: they learn it at their next use of the key */
  int64_t deadline = hixl__deadline(hixl__ctx_timeout(ctx));
  for (size_t i = 0; i < k; i++) {
    hixl_msg_t gone = {.type = HIXL_MSG_REGION_GONE}, ack;
    gone.region.slot = mr->slot;
    gone.region.rkey = mr->rkey;
    if (hixl__call(vps[i], &gone, HIXL_MSG_REGION_GONE_ACK, &ack, NULL, deadline) != HIXL_OK)
      hixl_info("hixl_mr_dereg: peer %s did not acknowledge (%s); going on", vps[i]->name,
                hixl_last_error());
  }
  hixl__peers_unpin(ctx, vps, k);

  pthread_mutex_lock(&ctx->reg_lock);
  hixl_reg_slot_t *s = &ctx->reg_table[mr->slot];
  /* Kill the rkey first: a peer checking the slot now sees it dead. */
  atomic_store_explicit(&s->rkey, 0, memory_order_release);
  s->base = s->len = 0;
  s->access = s->flags = 0;
  ctx->slot_mr[mr->slot] = NULL;
  for (hixl_mr_t **pp = &ctx->mrs; *pp; pp = &(*pp)->next)
    if (*pp == mr) {
      *pp = mr->next;
      break;
    }
  for (size_t i = 0; i < hixl__n_transports; i++)
    if (ctx->tp_ready & (1u << hixl__transports[i]->id))
      hixl__transports[i]->mr_dereg(mr);
  /* Unmapping under reg_lock: a peer's atomic executed by our control
   * thread holds reg_lock, so it never touches freed memory. */
  if (mr->owns_mem && mr->device >= 0) {
    hixl__dev_free(mr->addr);
  } else if (mr->owns_mem) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    munmap(mr->addr, (mr->len + page - 1) & ~(page - 1));
  }
  pthread_mutex_unlock(&ctx->reg_lock);
  if (mr->memfd >= 0)
    close(mr->memfd);
  pthread_mutex_lock(&ctx->lock);
  mr->magic = HIXL_MAGIC_DEAD;
  hixl__quarantine_locked(ctx, mr);
  pthread_mutex_unlock(&ctx->lock);
  return HIXL_OK;
}

hixl_status_t hixl__mrs_reg_transport(hixl_ctx_t *ctx, const hixl_transport_ops_t *ops)
{
  pthread_mutex_lock(&ctx->reg_lock);
  hixl_status_t st = HIXL_OK;
  hixl_mr_t *m;
  for (m = ctx->mrs; m; m = m->next)
    if ((st = ops->mr_reg(m)) != HIXL_OK)
      break;
  if (st == HIXL_OK)
    atomic_fetch_or(&ctx->tp_ready, 1u << ops->id);
  else /* undo those before m, the one that failed (and undid itself) */
    for (hixl_mr_t *u = ctx->mrs; u != m; u = u->next)
      ops->mr_dereg(u);
  pthread_mutex_unlock(&ctx->reg_lock);
  return st;
}

/* For hixl_ctx_destroy: every region still registered. */
void hixl__mrs_destroy(hixl_ctx_t *ctx)
{
  while (ctx->mrs)
    hixl_mr_dereg(ctx->mrs);
}

static void mr_to_info(const hixl_mr_t *mr, hixl_rkey_info_t *k)
{
  *k = (hixl_rkey_info_t){.ctx_id = mr->ctx->id,
                          .rkey = mr->rkey,
                          .base = (uint64_t)(uintptr_t)mr->addr,
                          .len = mr->len,
                          .slot = mr->slot,
                          .access = mr->access,
                          .flags = mr->ctx->reg_table[mr->slot].flags};
}

hixl_status_t hixl_mr_pack(const hixl_mr_t *mr, void *buf, size_t *len_p)
{
  if (!mr_valid(mr) || len_p == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_mr_pack: %s",
                     len_p == NULL ? "NULL len_p" : "NULL, invalid or deregistered region");
  if (buf == NULL || *len_p < HIXL_RKEY_BLOB_LEN) {
    bool asking = buf == NULL;
    *len_p = HIXL_RKEY_BLOB_LEN;
    if (asking)
      return HIXL_OK;
    return hixl__err(HIXL_ERR_NOMEM, "hixl_mr_pack: buffer too small (need %d bytes)",
                     HIXL_RKEY_BLOB_LEN);
  }
  hixl_rkey_info_t k;
  mr_to_info(mr, &k);
  hixl_rkey_encode(&k, buf);
  *len_p = HIXL_RKEY_BLOB_LEN;
  return HIXL_OK;
}
_Static_assert(HIXL_RKEY_BLOB_LEN <= HIXL_RKEY_MAX, "rkey blob must fit HIXL_RKEY_MAX");
_Static_assert(HIXL_RKEY_BLOB_LEN <= HIXL_WIRE_BLOB, "rkey blob must fit a control message");

hixl_status_t hixl__reg_check(const hixl_reg_slot_t *table, uint32_t slot, uint64_t rkey,
                              uint64_t base, uint64_t len, uint32_t access, uint32_t flags)
{
  if (slot >= HIXL_REG_SLOTS)
    return HIXL_ERR_NOT_REGISTERED;
  const hixl_reg_slot_t *s = &table[slot];
  if (atomic_load_explicit(&((hixl_reg_slot_t *)s)->rkey, memory_order_acquire) != rkey ||
      s->base != base || s->len != len || s->access != access || s->flags != flags)
    return HIXL_ERR_NOT_REGISTERED;
  return HIXL_OK;
}

static bool peer_valid(const hixl_peer_t *p) { return p != NULL && p->magic == HIXL_MAGIC_PEER; }

hixl_status_t hixl_rmr_unpack(hixl_peer_t *peer, const void *buf, size_t len, hixl_rmr_t **rmr_p)
{
  if (!peer_valid(peer) || buf == NULL || rmr_p == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_rmr_unpack: NULL or invalid %s",
                     !peer_valid(peer) ? "peer"
                     : buf == NULL     ? "buf"
                                       : "rmr_p");
  if (!hixl__peer_await_up(peer, hixl__deadline(hixl__ctx_timeout(peer->ctx))))
    return hixl__err(HIXL_ERR_PEER_LOST, "hixl_rmr_unpack: peer %s is not connected", peer->name);
  hixl_rkey_info_t k;
  if (hixl_rkey_decode(buf, len, &k) != 0)
    return hixl__err(HIXL_ERR_INVALID, "hixl_rmr_unpack: malformed rkey blob (%zu bytes)", len);
  if (k.ctx_id != peer->remote_ctx_id)
    return hixl__err(HIXL_ERR_NOT_REGISTERED,
                     "hixl_rmr_unpack: the blob belongs to another context than peer %s",
                     peer->name);
  hixl_rmr_t *r = calloc(1, sizeof(*r));
  if (r == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "no memory for an rmr");
  *r = (hixl_rmr_t){.magic = HIXL_MAGIC_RMR,
                    .peer = peer,
                    .base = k.base,
                    .len = k.len,
                    .rkey = k.rkey,
                    .slot = k.slot,
                    .access = k.access,
                    .flags = k.flags};
  hixl_status_t st = peer->ops->rmr_attach(r, hixl__deadline(hixl__ctx_timeout(peer->ctx)));
  if (st != HIXL_OK) {
    free(r);
    return st;
  }
  pthread_mutex_lock(&peer->ctx->lock);
  r->next = peer->rmrs;
  peer->rmrs = r;
  pthread_mutex_unlock(&peer->ctx->lock);
  *rmr_p = r;
  return HIXL_OK;
}

void hixl_rmr_release(hixl_rmr_t *rmr)
{
  if (rmr == NULL || rmr->magic != HIXL_MAGIC_RMR)
    return;
  hixl_peer_t *peer = rmr->peer;
  hixl_ctx_t *ctx = peer->ctx;
  pthread_mutex_lock(&ctx->lock);
  for (hixl_rmr_t **pp = &peer->rmrs; *pp; pp = &(*pp)->next)
    if (*pp == rmr) {
      *pp = rmr->next;
      break;
    }
  peer->ops->rmr_detach(rmr);
  rmr->magic = HIXL_MAGIC_DEAD;
  hixl__quarantine_locked(ctx, rmr);
  /* A peer a world released with rmrs held (hixl__peer_world_disown) is
   * freed once the last goes: housekeeping looks at it again. */
  if (peer->rmrs == NULL && atomic_load(&peer->released))
    ctx->hk[peer->hk_idx].due_ns = 0;
  pthread_mutex_unlock(&ctx->lock);
}

static bool name_ok(const char *name)
{
  size_t n = name ? strnlen(name, 64) : 0;
  if (n == 0 || n > 63)
    return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
      return false;
  return true;
}

hixl_status_t hixl_mr_publish(hixl_mr_t *mr, const char *name)
{
  if (!mr_valid(mr))
    return hixl__err(HIXL_ERR_INVALID, "hixl_mr_publish: NULL, invalid or deregistered region");
  if (!name_ok(name))
    return hixl__err(HIXL_ERR_INVALID, "hixl_mr_publish: name must be 1..63 printable bytes");
  hixl_ctx_t *ctx = mr->ctx;
  pthread_mutex_lock(&ctx->lock);
  int free_i = -1;
  for (int i = 0; i < HIXL_MAX_PUBLISHED; i++) {
    if (ctx->published[i].mr && strcmp(ctx->published[i].name, name) == 0) {
      ctx->published[i].mr = mr;
      pthread_mutex_unlock(&ctx->lock);
      return HIXL_OK;
    }
    if (!ctx->published[i].mr && free_i < 0)
      free_i = i;
  }
  if (free_i < 0) {
    pthread_mutex_unlock(&ctx->lock);
    return hixl__err(HIXL_ERR_NOMEM, "hixl_mr_publish: more than %d names published",
                     HIXL_MAX_PUBLISHED);
  }
  snprintf(ctx->published[free_i].name, sizeof(ctx->published[free_i].name), "%s", name);
  ctx->published[free_i].mr = mr;
  pthread_mutex_unlock(&ctx->lock);
  return HIXL_OK;
}

static hixl_status_t lookup_locked(hixl_ctx_t *ctx, const char *name, uint8_t *blob,
                                   uint32_t *len_p)
{
  for (int i = 0; i < HIXL_MAX_PUBLISHED; i++)
    if (ctx->published[i].mr && strcmp(ctx->published[i].name, name) == 0) {
      hixl_rkey_info_t k;
      mr_to_info(ctx->published[i].mr, &k);
      hixl_rkey_encode(&k, blob);
      *len_p = HIXL_RKEY_BLOB_LEN;
      return HIXL_OK;
    }
  return HIXL_ERR_NOT_REGISTERED;
}

hixl_status_t hixl__lookup_blob(hixl_peer_t *peer, const char *name, uint8_t *blob, uint32_t *len_p,
                                int64_t deadline)
{
  if (peer->self) {
    pthread_mutex_lock(&peer->ctx->lock);
    hixl_status_t st = lookup_locked(peer->ctx, name, blob, len_p);
    pthread_mutex_unlock(&peer->ctx->lock);
    return st;
  }
  hixl_msg_t m = {.type = HIXL_MSG_LOOKUP}, reply;
  snprintf(m.str[0], sizeof(m.str[0]), "%s", name);
  hixl_status_t st = hixl__call(peer, &m, HIXL_MSG_LOOKUP_REPLY, &reply, NULL, deadline);
  if (st == HIXL_OK) {
    memcpy(blob, reply.blob, reply.blob_len);
    *len_p = reply.blob_len;
  }
  return st;
}

hixl_status_t hixl_rmr_lookup(hixl_peer_t *peer, const char *name, int timeout_ms,
                              hixl_rmr_t **rmr_p)
{
  if (!peer_valid(peer) || rmr_p == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_rmr_lookup: NULL or invalid %s",
                     rmr_p == NULL ? "rmr_p" : "peer");
  if (!name_ok(name))
    return hixl__err(HIXL_ERR_INVALID, "hixl_rmr_lookup: name must be 1..63 printable bytes");
  int64_t deadline = hixl__deadline(timeout_ms);
  /* Each call is bounded by the context timeout (a peer that does not
   * answer), the whole by timeout_ms (a name that does not appear). */
  int call_ms = hixl__ctx_timeout(peer->ctx);
  for (;;) {
    if (!hixl__peer_await_up(peer, hixl__deadline(call_ms)))
      return hixl__err(HIXL_ERR_PEER_LOST, "hixl_rmr_lookup: peer %s is not connected", peer->name);
    uint8_t blob[HIXL_WIRE_BLOB];
    uint32_t blen = 0;
    hixl_status_t st = hixl__lookup_blob(peer, name, blob, &blen, hixl__deadline(call_ms));
    if (st == HIXL_OK)
      return hixl_rmr_unpack(peer, blob, blen, rmr_p);
    if (st != HIXL_ERR_NOT_REGISTERED)
      return st;
    if (hixl__expired(deadline) || timeout_ms == 0)
      return hixl__err(HIXL_ERR_NOT_REGISTERED, "hixl_rmr_lookup: peer %s has no region \"%s\"",
                       peer->name, name);
    usleep(5000);
  }
}

uint64_t hixl__amo_local(uint64_t *p, int op, uint64_t a, uint64_t b)
{
  if (op == HIXL_AMO_FAA)
    return __atomic_fetch_add(p, a, __ATOMIC_SEQ_CST);
  uint64_t expected = a;
  __atomic_compare_exchange_n(p, &expected, b, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}

void hixl__atomic_msg(const hixl_rmr_t *r, uint64_t off, int op, uint64_t a, uint64_t b,
                      hixl_msg_t *m)
{
  *m = (hixl_msg_t){.type = HIXL_MSG_ATOMIC};
  m->atomic.slot = r->slot;
  m->atomic.op = (uint32_t)op;
  m->atomic.rkey = r->rkey;
  m->atomic.off = off;
  m->atomic.a = a;
  m->atomic.b = b;
}

hixl_status_t hixl__rmr_key_call(hixl_rmr_t *r, const char *unreachable, int64_t deadline)
{
  hixl_msg_t m = {.type = HIXL_MSG_TP_MR}, reply;
  m.tp_mr.slot = r->slot;
  m.tp_mr.access = r->access;
  m.tp_mr.flags = r->flags;
  m.tp_mr.rkey = r->rkey;
  m.tp_mr.base = r->base;
  m.tp_mr.len = r->len;
  hixl_status_t st = hixl__call(r->peer, &m, HIXL_MSG_TP_MR_REPLY, &reply, NULL, deadline);
  if (st == HIXL_OK) {
    r->tp_key[0] = reply.tp_mr_reply.key0;
    r->tp_key[1] = reply.tp_mr_reply.key1;
  }
  if (st == HIXL_ERR_NOT_REGISTERED)
    return hixl__err(st,
                     "hixl_rmr_unpack: peer %s has no live region matching the blob "
                     "(forged or stale key)",
                     r->peer->name);
  if (st == HIXL_ERR_UNSUPPORTED)
    return hixl__err(st, "hixl_rmr_unpack: the region of peer %s is device memory %s",
                     r->peer->name, unreachable);
  return st;
}

/* The owner's view of a peer's request on (slot, rkey). */
static hixl_mr_t *live_mr(hixl_ctx_t *ctx, uint32_t slot, uint64_t rkey)
{
  if (slot >= HIXL_REG_SLOTS)
    return NULL;
  hixl_mr_t *mr = ctx->slot_mr[slot];
  return mr && mr->rkey == rkey ? mr : NULL;
}

hixl_status_t hixl__serve_range_locked(hixl_ctx_t *ctx, uint32_t slot, uint64_t rkey, uint64_t off,
                                       uint64_t len, unsigned need, uint8_t **addr_p)
{
  /* The initiator checked all of this too; that is not trusted. */
  hixl_mr_t *mr = live_mr(ctx, slot, rkey);
  if (mr == NULL || len == 0 || off > mr->len || len > mr->len - off)
    return HIXL_ERR_NOT_REGISTERED;
  if (mr->device >= 0) /* the CPU cannot copy device memory */
    return HIXL_ERR_UNSUPPORTED;
  if ((mr->access & need) != need)
    return HIXL_ERR_ACCESS;
  *addr_p = (uint8_t *)mr->addr + off;
  return HIXL_OK;
}

void hixl__serve(hixl_peer_t *peer, const hixl_msg_t *m, hixl_msg_t *out, int *out_fds, int *n_out)
{
  hixl_ctx_t *ctx = peer->ctx;
  memset(out, 0, sizeof(*out));
  *n_out = 0;
  switch (m->type) {
  case HIXL_MSG_LOOKUP:
    out->type = HIXL_MSG_LOOKUP_REPLY;
    out->status = lookup_locked(ctx, m->str[0], out->blob, &out->blob_len);
    return;
  case HIXL_MSG_FD_REQ: {
    out->type = HIXL_MSG_FD_REPLY;
    out->status = HIXL_ERR_NOT_REGISTERED;
    /* Only same-host peers may ask, and only for regions whose memfd they
     * may map (HIXL_REGF_MEMFD: the whole memfd, granting READ). */
    if (!(peer->ops->caps & HIXL_TP_CAP_LOCAL_MAP))
      return;
    pthread_mutex_lock(&ctx->reg_lock);
    hixl_mr_t *mr = live_mr(ctx, m->region.slot, m->region.rkey);
    if (mr && mr->memfd >= 0 && (ctx->reg_table[mr->slot].flags & HIXL_REGF_MEMFD)) {
      /* A region the peer may not write reaches it as a read-only open of
       * the memfd (a new open file description): it can neither map that
       * writable nor write or truncate through it. */
      bool rw = (mr->access & (HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC)) != 0;
      char path[48];
      snprintf(path, sizeof(path), "/proc/self/fd/%d", mr->memfd);
      out_fds[0] = rw ? fcntl(mr->memfd, F_DUPFD_CLOEXEC, 0) : open(path, O_RDONLY | O_CLOEXEC);
      if (out_fds[0] >= 0) {
        *n_out = 1;
        out->status = HIXL_OK;
        out->fd_reply.offset = mr->fd_off;
      } else {
        out->status = HIXL_ERR_NOMEM;
      }
    }
    pthread_mutex_unlock(&ctx->reg_lock);
    return;
  }
  case HIXL_MSG_DEV_IPC_REQ: {
    /* A same-host peer maps a device region through the backend's IPC. */
    out->type = HIXL_MSG_DEV_IPC_REPLY;
    out->status = HIXL_ERR_NOT_REGISTERED;
    if (!(peer->ops->caps & HIXL_TP_CAP_LOCAL_MAP))
      return;
    pthread_mutex_lock(&ctx->reg_lock);
    hixl_mr_t *mr = live_mr(ctx, m->region.slot, m->region.rkey);
    hixl_dev_ipc_t h;
    uint64_t off;
    if (mr && mr->device >= 0) {
      out->status = hixl__dev_ipc_export(mr->addr, mr->len, peer->remote_pid, &h, &off);
      if (out->status == HIXL_OK) {
        out->dev_ipc_reply.device = (uint32_t)h.device;
        out->dev_ipc_reply.offset = off;
        out->dev_ipc_reply.alloc_len = h.alloc_len;
        memcpy(out->blob, h.bytes, h.len);
        out->blob_len = h.len;
        if (h.fd >= 0) {
          out_fds[0] = h.fd;
          *n_out = 1;
        }
      } else {
        hixl_info("device IPC export for %s: %s", peer->name, hixl_last_error());
      }
    }
    pthread_mutex_unlock(&ctx->reg_lock);
    return;
  }
  case HIXL_MSG_ATOMIC: {
    out->type = HIXL_MSG_ATOMIC_REPLY;
    uint64_t off = m->atomic.off;
    int op = (int)m->atomic.op;
    pthread_mutex_lock(&ctx->reg_lock);
    hixl_mr_t *mr = live_mr(ctx, m->atomic.slot, m->atomic.rkey);
    /* Checked again here: the initiator's checks are not trusted. */
    if (mr == NULL || off > mr->len || mr->len - off < 8)
      out->status = HIXL_ERR_NOT_REGISTERED;
    else if (mr->device >= 0) /* the CPU cannot run an atomic in device memory */
      out->status = HIXL_ERR_UNSUPPORTED;
    else if (!(mr->access & HIXL_ACCESS_ATOMIC))
      out->status = HIXL_ERR_ACCESS;
    else if (((uintptr_t)mr->addr + off) % 8 != 0 || (op != HIXL_AMO_FAA && op != HIXL_AMO_CAS))
      out->status = HIXL_ERR_INVALID;
    else
      out->atomic_reply.old =
          hixl__amo_local((uint64_t *)((uint8_t *)mr->addr + off), op, m->atomic.a, m->atomic.b);
    pthread_mutex_unlock(&ctx->reg_lock);
    return;
  }
  case HIXL_MSG_TP_MR: {
    /* The key of a live region on the peer's transport (its mr_key), for
     * peers of transports with remote keys only. */
    out->type = HIXL_MSG_TP_MR_REPLY;
    out->status = HIXL_ERR_NOT_REGISTERED;
    if (peer->ops->mr_key == NULL)
      return;
    pthread_mutex_lock(&ctx->reg_lock);
    hixl_mr_t *mr = live_mr(ctx, m->tp_mr.slot, m->tp_mr.rkey);
    /* The whole blob must match, as for peers that read our table. */
    bool match = mr && hixl__reg_check(ctx->reg_table, m->tp_mr.slot, m->tp_mr.rkey, m->tp_mr.base,
                                       m->tp_mr.len, m->tp_mr.access, m->tp_mr.flags) == HIXL_OK;
    if (match && peer->ops->mr_key(mr, out->u64))
      out->status = HIXL_OK;
    else if (match && mr->device >= 0)
      out->status = HIXL_ERR_UNSUPPORTED; /* device memory our NIC / provider cannot reach */
    pthread_mutex_unlock(&ctx->reg_lock);
    return;
  }
  default: return;
  }
}

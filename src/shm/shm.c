/* SPDX-License-Identifier: MIT */
/*
 * The shm transport: processes on the same host (same kernel boot and
 * network namespace).
 *
 * Binding (after the TCP HELLO picked shm): the initiator connects to the
 * target's abstract unix socket and sends SHM_BIND with two fds, its region
 * table and its notification inbox; the target answers SHM_BIND_ACK with its
 * own two.  From then on the unix socket is the control connection (it can
 * carry fds) and the TCP one is closed.  Each side takes the other's pid
 * and uid from the kernel (SO_PEERCRED on that socket), never from the
 * handshake: the pid is where CMA goes (a peer that named another process
 * made a privileged target write into it), and a peer of another uid is
 * refused unless HIXL_SHM_ALLOW_UIDS allows it.
 *
 * Data path:
 *  - regions backed by a whole memfd (hixl_mem_alloc, or a registration of
 *    exactly such an allocation) granting READ are mapped into the
 *    initiator once, at rmr unpack (FD_REQ passes the fd), with PROT_WRITE
 *    only if the region grants WRITE or ATOMIC: a put or get is one copy,
 *    an atomic one CPU instruction, no syscall (a part of an allocation is
 *    not: the peer could map all of it; mr.c);
 *  - other regions are reached with process_vm_writev/readv (CMA, cma.c;
 *    large transfers split across helper threads); atomics on them are
 *    executed by the owner's control thread (ATOMIC message);
 *  - where the kernel refuses CMA towards a peer (EPERM: Yama, seccomp,
 *    containers; ENOSYS), that is remembered for the peer and its
 *    non-mapped regions are reached through the owner's control thread,
 *    which copies through a staging area it lends (stage.c);
 *  - every operation first checks the owner's region table (mapped
 *    read-only; one-way tags, never keys: shm_int.h) so a deregistered
 *    region is refused without a syscall;
 *  - notifications are pushed into the owner's inbox ring (ring.h) after
 *    the data, with release ordering, so the owner sees data before the
 *    notification;
 *  - device regions are imported at unpack through the device backend's IPC
 *    (DEV_IPC_REQ: a CUDA IPC handle, an Ascend key, the emulated memfd) and
 *    moved with the runtime's copies, which also serve local device
 *    buffers; a local device buffer to a CMA region is staged through a
 *    host buffer on the stack.  Atomics on device regions are refused.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "shm_int.h"

#ifndef SHM_RING_CAP
#define SHM_RING_CAP 1024u /* entries of a peer's inbox: 32 bytes each, 32 KiB (docs/scale.md) */
#endif

/* ------------------------------------------------------ the tag table */

/* The tag of a region (shm_int.h): SHA-256 over a label, the owner's
 * context id and every field a blob carries, truncated to 128 bits; w[0]
 * is never 0 (0 marks a free slot). */
static void shm_tag(uint64_t ctx_id, uint32_t slot, uint64_t rkey, uint64_t base, uint64_t len,
                    uint32_t access, uint32_t flags, uint64_t out[2])
{
  static const char label[16] = "hixl region tag";
  uint8_t in[sizeof(label) + 4 * 8 + 3 * 4], d[SHA256_DIGEST_SIZE];
  size_t o = 0;
  memcpy(in + o, label, sizeof(label)), o += sizeof(label);
  memcpy(in + o, &ctx_id, 8), o += 8;
  memcpy(in + o, &rkey, 8), o += 8;
  memcpy(in + o, &base, 8), o += 8;
  memcpy(in + o, &len, 8), o += 8;
  memcpy(in + o, &slot, 4), o += 4;
  memcpy(in + o, &access, 4), o += 4;
  memcpy(in + o, &flags, 4), o += 4;
  struct sha256_ctx h;
  sha256_init(&h);
  sha256_update(&h, o, in);
  sha256_digest(&h, sizeof(d), d);
  memcpy(out, d, 16);
  if (out[0] == 0)
    out[0] = 1;
}

static hixl_status_t bell_init(hixl_ctx_t *ctx, shm_ctx_t *sc);

hixl_status_t hixl__shm_table_init(hixl_ctx_t *ctx, shm_ctx_t *sc)
{
  /* Mapped read-write here first; then sealed against shrinking, growing
   * and (F_SEAL_FUTURE_WRITE, Linux 5.1) any new writable mapping or
   * write(), and mode 0400 (hixl__memfd says why); what peers get is a
   * read-only open.  Either of the last two alone keeps a peer from
   * writing it; with neither, shm is not offered. */
  sc->tags_fd = sc->bell_r = sc->bell_w = -1;
  int fd = memfd_create("hixl-regions", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  void *p = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, (off_t)SHM_TABLE_BYTES) == 0)
    p = mmap(NULL, SHM_TABLE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    return hixl__err(HIXL_ERR_NOMEM, "shm: region table: %s", strerror(e));
  }
  const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  bool future = fcntl(fd, F_ADD_SEALS, seals | F_SEAL_FUTURE_WRITE) == 0;
  if (!future)
    fcntl(fd, F_ADD_SEALS, seals);
  fchmod(fd, 0400);
  char path[48];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  int ro = open(path, O_RDONLY | O_CLOEXEC);
  if (ro < 0 && future) {
    ro = fd; /* writable fd, but no new writable mapping or write() works */
    fd = -1;
  }
  if (fd >= 0)
    close(fd);
  if (ro < 0) {
    munmap(p, SHM_TABLE_BYTES);
    return hixl__err(HIXL_ERR_NO_DEVICE, "shm: the region table cannot be handed out "
                                         "read-only (no /proc/self/fd, no F_SEAL_FUTURE_WRITE)");
  }
  sc->tags = p;
  sc->tags_fd = ro;
  sc->bell = (shm_bell_t *)(void *)((uint8_t *)p + SHM_TAGS_BYTES);
  hixl_status_t st = bell_init(ctx, sc);
  if (st != HIXL_OK)
    hixl__shm_table_fini(ctx, sc);
  return st;
}

/* Our doorbell: the pipe peers ring, and the context's sleeper counts
 * moved into the page peers read. */
static hixl_status_t bell_init(hixl_ctx_t *ctx, shm_ctx_t *sc)
{
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
    return hixl__err(HIXL_ERR_NOMEM, "shm: doorbell pipe: %s", strerror(errno));
  sc->bell_r = p[0];
  sc->bell_w = p[1];
  ctx->sleepers = &sc->bell->sleepers;
  ctx->space_waiters = &sc->bell->space_waiters;
  return HIXL_OK;
}

void hixl__shm_bell_send(shm_peer_t *sp, uint32_t v)
{
  int64_t now = hixl__now_ns();
  if (v >= HIXL_SLEEP_WORD) { /* asleep on our inbox's word there */
    atomic_store_explicit(&sp->outbox_sh->rang_ns, now, memory_order_relaxed);
    hixl__wake_word(&sp->outbox_sh->bell, true);
  }
  if ((v & (HIXL_SLEEP_WORD - 1)) == 0)
    return;
  struct iovec iov = {&now, sizeof(now)};
  /* Never blocks, whatever the peer did to the write end's flags: a full
   * pipe means the owner has wake-ups to read anyway. */
  ssize_t r = pwritev2(sp->bell_w, &iov, 1, -1, RWF_NOWAIT);
  if (r < 0 && (errno == EOPNOTSUPP || errno == EINVAL))
    r = write(sp->bell_w, &now, sizeof(now)); /* no RWF_NOWAIT on pipes (< Linux 5.8) */
  (void)r; /* its process may be gone: its loss is seen on the control socket */
}

void hixl__shm_table_fini(hixl_ctx_t *ctx, shm_ctx_t *sc)
{
  if (ctx->sleepers != &ctx->own_sleepers) {
    ctx->sleepers = &ctx->own_sleepers;
    ctx->space_waiters = &ctx->own_space_waiters;
  }
  if (sc->bell_r >= 0)
    close(sc->bell_r);
  if (sc->bell_w >= 0)
    close(sc->bell_w);
  sc->bell_r = sc->bell_w = -1;
  if (sc->tags)
    munmap(sc->tags, SHM_TABLE_BYTES);
  if (sc->tags_fd >= 0)
    close(sc->tags_fd);
  sc->tags = NULL;
  sc->tags_fd = -1;
}

/* A region joins the registry: its tag goes into its slot (the private
 * registry already holds it; this runs before hixl_mr_reg returns, so no
 * peer holds its blob yet). */
static hixl_status_t shm_mr_reg(hixl_mr_t *mr)
{
  hixl_ctx_t *ctx = mr->ctx;
  shm_ctx_t *sc = ctx->tp[HIXL_TP_SHM];
  uint64_t t[2];
  shm_tag(ctx->id, mr->slot, mr->rkey, (uint64_t)(uintptr_t)mr->addr, mr->len, mr->access,
          ctx->reg_table[mr->slot].flags, t);
  shm_tag_t *s = &sc->tags[mr->slot];
  atomic_store_explicit(&s->w[1], t[1], memory_order_relaxed);
  atomic_store_explicit(&s->w[0], t[0], memory_order_release);
  return HIXL_OK;
}

/* Under reg_lock, before the memory is released: peers see it dead. */
static void shm_mr_dereg(hixl_mr_t *mr)
{
  shm_ctx_t *sc = mr->ctx->tp[HIXL_TP_SHM];
  shm_tag_t *s = &sc->tags[mr->slot];
  atomic_store_explicit(&s->w[0], 0, memory_order_release);
  atomic_store_explicit(&s->w[1], 0, memory_order_relaxed);
}

/* ---------------------------------------------------------------- peers */

static bool uid_allowed(const shm_ctx_t *sc, uid_t uid)
{
  /* Root may ptrace and rewrite any process of ours anyway: refusing it
   * would protect nothing. */
  if (sc->uid_any || uid == geteuid() || uid == 0)
    return true;
  for (int i = 0; i < sc->n_uids; i++)
    if (sc->uids[i] == (uint32_t)uid)
      return true;
  return false;
}

/* The process at the other end of unix socket sock, from the kernel (taken
 * when it connected), checked against our uid policy.  Its pid is as our
 * pid namespace sees it: 0 when it cannot (a container beside ours), and
 * then CMA is never tried (shm_peer_new: the owner's copies). */
static hixl_status_t peer_cred(hixl_ctx_t *ctx, int sock, const char *who, struct ucred *cr_p)
{
  struct ucred cr;
  socklen_t len = sizeof(cr);
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || len != sizeof(cr) || cr.pid < 0)
    return hixl__err(HIXL_ERR_TRANSPORT, "shm: no credentials for the unix socket of %s: %s", who,
                     strerror(errno));
  if (!uid_allowed(ctx->tp[HIXL_TP_SHM], cr.uid))
    return hixl__err(HIXL_ERR_AUTH,
                     "shm: %s (pid %d) runs as uid %u, this process as uid %u: refused "
                     "(HIXL_SHM_ALLOW_UIDS lists other uids to allow, or \"any\")",
                     who, (int)cr.pid, (unsigned)cr.uid, (unsigned)geteuid());
  *cr_p = cr;
  return HIXL_OK;
}

hixl_status_t hixl__shm_bind_cred(hixl_peer_t *peer, int sock)
{
  struct ucred cr;
  hixl_status_t st = peer_cred(peer->ctx, sock, peer->name, &cr);
  if (st != HIXL_OK) {
    hixl_warn("%s", hixl_last_error());
    return st;
  }
  if (cr.pid != peer->remote_pid)
    hixl_info("shm: %s said it was pid %d; the kernel says pid %d", peer->name,
              (int)peer->remote_pid, (int)cr.pid);
  peer->remote_pid = cr.pid;
  return HIXL_OK;
}

static bool shm_usable(hixl_ctx_t *ctx, const hixl_msg_t *hello)
{
  return memcmp(ctx->host_id, hello->host_id, sizeof(ctx->host_id)) == 0;
}

/* pid: the peer's, from the kernel (0: not in our pid namespace). */
static shm_peer_t *shm_peer_new(hixl_ctx_t *ctx, pid_t pid)
{
  shm_peer_t *sp = calloc(1, sizeof(*sp));
  if (sp == NULL)
    return NULL;
  pthread_mutex_init(&sp->out.lock, NULL);
  sp->in.fd = -1;
  sp->bell_w = -1;
  const shm_ctx_t *sc = ctx->tp[HIXL_TP_SHM];
  atomic_init(&sp->cma_refused, sc->cma_off || pid <= 0);
  return sp;
}

/* A peer's inbox is mapped and bound: sleepers may watch its word. */
static void watch_add(hixl_ctx_t *ctx, shm_peer_t *sp)
{
  shm_ctx_t *sc = ctx->tp[HIXL_TP_SHM];
  pthread_mutex_lock(&sc->wlock);
  sp->wprev = NULL;
  sp->wnext = sc->watch;
  if (sc->watch)
    sc->watch->wprev = sp;
  sc->watch = sp;
  sc->n_watch++;
  pthread_mutex_unlock(&sc->wlock);
  /* A sleeper that armed before this peer was watched would not hear it:
   * it wakes and arms again. */
  hixl__wake_rearm(ctx);
}

/* Before the inbox is unmapped: no new sleeper reads its word, and those
 * that did wake (their futex_waitv must not wait on memory being unmapped,
 * whose address may come back as something else).  For a peer whose tp is
 * set: connect and accept set it and watch_add together. */
static void watch_del(hixl_ctx_t *ctx, shm_peer_t *sp)
{
  shm_ctx_t *sc = ctx->tp[HIXL_TP_SHM];
  pthread_mutex_lock(&sc->wlock);
  if (sp->wprev)
    sp->wprev->wnext = sp->wnext;
  else
    sc->watch = sp->wnext;
  if (sp->wnext)
    sp->wnext->wprev = sp->wprev;
  sc->n_watch--;
  pthread_mutex_unlock(&sc->wlock);
  hixl__wake_rearm(ctx);
}

static void shm_free(shm_peer_t *sp)
{
  if (sp == NULL)
    return;
  hixl__shm_stage_free(sp);
  pthread_mutex_destroy(&sp->out.lock);
  if (sp->bell_w >= 0)
    close(sp->bell_w);
  if (sp->table)
    munmap((void *)sp->table, SHM_TABLE_BYTES);
  if (sp->outbox_sh)
    munmap(sp->outbox_sh, hixl_ring_shared_bytes(SHM_RING_CAP));
  if (sp->inbox_sh)
    munmap(sp->inbox_sh, hixl_ring_shared_bytes(SHM_RING_CAP));
  free(sp);
}

static hixl_status_t make_inbox(shm_peer_t *sp, int *fd_p)
{
  size_t bytes = hixl_ring_shared_bytes(SHM_RING_CAP);
  int fd = hixl__memfd("hixl-inbox", bytes);
  if (fd < 0)
    return hixl__err(HIXL_ERR_NOMEM, "shm: notification ring: %s", strerror(errno));
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return hixl__err(HIXL_ERR_NOMEM, "shm: notification ring: %s", strerror(e));
  }
  sp->inbox_sh = p;
  hixl_ring_shared_init_zeroed(sp->inbox_sh, SHM_RING_CAP); /* a fresh memfd: zero */
  hixl_ring_attach(&sp->inbox, sp->inbox_sh, SHM_RING_CAP);
  *fd_p = fd;
  return HIXL_OK;
}

/* Only a sealed fd (hixl__fd_sealed): the peer cannot truncate it
 * under our mapping. */
static void *map_fd(int fd, size_t bytes, int prot)
{
  if (!hixl__fd_sealed(fd, bytes))
    return NULL;
  void *p = mmap(NULL, bytes, prot, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* Map the peer's table and inbox (fds[0], fds[1]) and keep its doorbell
 * (fds[2], which must be a pipe's write end); the caller closes all three. */
static hixl_status_t map_theirs(shm_peer_t *sp, const int *fds, const char *who)
{
  struct stat stb;
  if (fstat(fds[2], &stb) != 0 || !S_ISFIFO(stb.st_mode) ||
      (fcntl(fds[2], F_GETFL) & O_ACCMODE) != O_WRONLY)
    return hixl__err(HIXL_ERR_TRANSPORT, "shm: the doorbell %s passed is not a pipe's write end",
                     who);
  if ((sp->bell_w = fcntl(fds[2], F_DUPFD_CLOEXEC, 0)) < 0) {
    char why[300];
    return hixl__err(errno == EMFILE || errno == ENFILE ? HIXL_ERR_NOMEM : HIXL_ERR_TRANSPORT,
                     "shm: keeping the doorbell of %s: %s", who,
                     hixl__strerror_fd(errno, why, sizeof(why)));
  }
  sp->table = map_fd(fds[0], SHM_TABLE_BYTES, PROT_READ);
  sp->bell = sp->table
                 ? (const shm_bell_t *)(const void *)((const uint8_t *)sp->table + SHM_TAGS_BYTES)
                 : NULL;
  sp->outbox_sh = map_fd(fds[1], hixl_ring_shared_bytes(SHM_RING_CAP), PROT_READ | PROT_WRITE);
  if (sp->table == NULL || sp->outbox_sh == NULL ||
      !hixl_ring_shared_valid(sp->outbox_sh, SHM_RING_CAP))
    return hixl__err(HIXL_ERR_TRANSPORT,
                     "shm: cannot map the segments of %s (unsealed, short "
                     "or not a ring)",
                     who);
  /* The capacity is ours (SHM_RING_CAP), never re-read from their memory. */
  hixl_ring_attach(&sp->outbox, sp->outbox_sh, SHM_RING_CAP);
  return HIXL_OK;
}

/* Descriptors a bind takes at once, beyond the connection's own: our
 * inbox's memfd, the unix socket, the target's 3 passed back (mapped, then
 * closed) and the copy of its doorbell we keep.  2 stay: the socket and
 * the doorbell; the TCP connection goes. */
#define SHM_BIND_FDS 6

static hixl_status_t shm_connect(hixl_peer_t *peer, const hixl_msg_t *ack, int64_t deadline)
{
  hixl_ctx_t *ctx = peer->ctx;
  /* Checked first: short of them, the kernel would fail one step or
   * another, or silently drop the target's descriptors on their way. */
  int room = hixl__fd_room(peer->fd, SHM_BIND_FDS);
  if (room < SHM_BIND_FDS) {
    char hint[200];
    return hixl__err(HIXL_ERR_NOMEM,
                     "shm: binding with %s takes %d free descriptors for a moment and this "
                     "process has %d: %s",
                     peer->name, SHM_BIND_FDS, room, hixl__nofile_hint(hint, sizeof(hint)));
  }
  shm_peer_t *sp = shm_peer_new(ctx, 1); /* its pid: below */
  if (sp == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "shm: no memory");
  int inbox_fd = -1, ufd = -1, tcp_fd = peer->fd;
  hixl_status_t st = make_inbox(sp, &inbox_fd);
  if (st != HIXL_OK)
    goto fail;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t nlen = strnlen(ack->str[0], sizeof(sa.sun_path) - 2);
  memcpy(sa.sun_path + 1, ack->str[0], nlen);
  ufd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ufd < 0 || connect(ufd, (struct sockaddr *)&sa,
                         (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nlen)) != 0) {
    st = hixl__err(HIXL_ERR_TRANSPORT, "shm: cannot reach %s over its unix socket: %s", peer->name,
                   strerror(errno));
    goto fail;
  }
  /* Whoever listens there (the name came from the peer) is who we bind
   * with: its pid and uid, from the kernel. */
  struct ucred cr;
  if ((st = peer_cred(ctx, ufd, peer->name, &cr)) != HIXL_OK)
    goto fail;
  peer->remote_pid = cr.pid;
  if (cr.pid == 0) /* not in our pid namespace: no CMA */
    atomic_store(&sp->cma_refused, true);
  struct timeval tv = {ctx->cfg.timeout_ms / 1000, (ctx->cfg.timeout_ms % 1000) * 1000};
  setsockopt(ufd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  hixl_msg_t bind = {.type = HIXL_MSG_TP_BIND};
  bind.unix_bind.cookie = ack->hello_ack.cookie;
  bind.unix_bind.ctx_id = ctx->id;
  const shm_ctx_t *sc = ctx->tp[HIXL_TP_SHM];
  int fds[3] = {sc->tags_fd, inbox_fd, sc->bell_w};
  peer->fd = ufd;
  st = hixl__send(peer, &bind, fds, 3);
  hixl_msg_t reply;
  int got[3];
  if (st == HIXL_OK)
    st = hixl__recv_sync(ufd, &reply, got, 3, deadline, peer->name);
  if (st != HIXL_OK)
    goto fail;
  if (reply.type != HIXL_MSG_TP_BIND_REPLY || reply.status != HIXL_OK || reply.nfds != 3) {
    for (int i = 0; i < reply.nfds; i++)
      close(got[i]);
    if (reply.status == HIXL_ERR_AUTH)
      st = hixl__err(HIXL_ERR_AUTH,
                     "shm: %s refused the bind (%s): it binds with peers of "
                     "its own uid and root, and of the uids its HIXL_SHM_ALLOW_UIDS lists; "
                     "this process runs as uid %u",
                     peer->name, hixl_strerror(reply.status), (unsigned)geteuid());
    else if (reply.type == HIXL_MSG_TP_BIND_REPLY && reply.status == HIXL_ERR_NOMEM)
      st = hixl__err(HIXL_ERR_NOMEM, "shm: %s could not take the bind: %.200s", peer->name,
                     reply.str[0]);
    else
      st = hixl__err(HIXL_ERR_TRANSPORT, "shm: %s refused the bind (%s)%s%.200s", peer->name,
                     hixl_strerror(reply.status), reply.str[0][0] ? ": " : "", reply.str[0]);
    goto fail;
  }
  st = map_theirs(sp, got, peer->name);
  for (int i = 0; i < 3; i++)
    close(got[i]);
  if (st != HIXL_OK)
    goto fail;
  peer->tp = sp;
  if ((st = hixl__notif_src_add(peer, &sp->inbox)) != HIXL_OK) {
    peer->tp = NULL;
    goto fail;
  }
  close(inbox_fd);
  close(tcp_fd);
  watch_add(ctx, sp);
  return HIXL_OK;
fail:
  peer->fd = tcp_fd;
  if (ufd >= 0)
    close(ufd);
  if (inbox_fd >= 0)
    close(inbox_fd);
  shm_free(sp);
  return st;
}

hixl_status_t hixl__shm_accept(hixl_peer_t *peer, const int *fds, int nfds, int *out_fds,
                               int *n_out)
{
  if (nfds != 3)
    return HIXL_ERR_INVALID;
  shm_peer_t *sp = shm_peer_new(peer->ctx, peer->remote_pid); /* hixl__shm_bind_cred's */
  if (sp == NULL)
    return HIXL_ERR_NOMEM;
  int inbox_fd = -1;
  hixl_status_t st = map_theirs(sp, fds, peer->name);
  if (st == HIXL_OK)
    st = make_inbox(sp, &inbox_fd);
  const shm_ctx_t *sc = peer->ctx->tp[HIXL_TP_SHM];
  int table_fd = st == HIXL_OK ? fcntl(sc->tags_fd, F_DUPFD_CLOEXEC, 0) : -1;
  int bell_fd = table_fd >= 0 ? fcntl(sc->bell_w, F_DUPFD_CLOEXEC, 0) : -1;
  if (bell_fd >= 0) {
    peer->tp = sp;
    if ((st = hixl__notif_src_add(peer, &sp->inbox)) != HIXL_OK)
      peer->tp = NULL;
  }
  if (st != HIXL_OK || bell_fd < 0) {
    if (inbox_fd >= 0)
      close(inbox_fd);
    if (table_fd >= 0)
      close(table_fd);
    if (bell_fd >= 0)
      close(bell_fd);
    shm_free(sp);
    return st != HIXL_OK ? st : HIXL_ERR_NOMEM;
  }
  for (int i = 0; i < 3; i++) /* mapped or kept: consumed (on failure the caller closes them) */
    close(fds[i]);
  out_fds[0] = table_fd;
  out_fds[1] = inbox_fd;
  out_fds[2] = bell_fd;
  *n_out = 3;
  watch_add(peer->ctx, sp);
  return HIXL_OK;
}

/* Target side of SHM_BIND on an accepted unix connection sock: who is
 * really at the other end (SO_PEERCRED: its pid for CMA, its uid against
 * the policy, never what its HELLO claimed), then the segments. */
static void shm_accept(hixl_peer_t *peer, const hixl_msg_t *m, int *fds, int nfds, int sock,
                       hixl_msg_t *out, int *out_fds, int *n_out)
{
  (void)m;
  out->type = HIXL_MSG_TP_BIND_REPLY;
  hixl_status_t st = hixl__shm_bind_cred(peer, sock);
  if (st == HIXL_OK)
    st = hixl__shm_accept(peer, fds, nfds, out_fds, n_out);
  out->status = st;
}

/* shm's own control messages: the owner's copies where the kernel refuses
 * CMA (stage.c). */
static const hixl_tp_msg_t shm_msgs[] = {
    {.kind = SHM_KIND_STAGE, .reply_fds = 1, .serve = hixl__shm_stage_serve},
    {.kind = SHM_KIND_COPY, .serve = hixl__shm_copy_serve},
    {0},
};

static void shm_peer_close(hixl_peer_t *peer)
{
  if (peer->tp) {
    watch_del(peer->ctx, peer->tp);
    hixl__notif_src_del(peer);
  }
  shm_free(peer->tp);
  peer->tp = NULL;
}

/* A device region: the owner exports it, we import it (device.h). */
static hixl_status_t attach_device(hixl_rmr_t *r, int64_t deadline)
{
  hixl_peer_t *peer = r->peer;
  hixl_msg_t m = {.type = HIXL_MSG_DEV_IPC_REQ}, reply;
  m.region.slot = r->slot;
  m.region.rkey = r->rkey;
  int fd = -1;
  hixl_status_t st = hixl__call(peer, &m, HIXL_MSG_DEV_IPC_REPLY, &reply, &fd, deadline);
  if (st != HIXL_OK) {
    if (fd >= 0)
      close(fd);
    return st == HIXL_ERR_NOT_REGISTERED
               ? hixl__err(st, "hixl_rmr_unpack: peer %s no longer has the region", peer->name)
               : hixl__err(st,
                           "hixl_rmr_unpack: peer %s could not export its device region "
                           "(%s)",
                           peer->name, hixl_strerror(st));
  }
  hixl_dev_ipc_t h = {.fd = fd,
                      .alloc_len = reply.dev_ipc_reply.alloc_len,
                      .device = (int)reply.dev_ipc_reply.device};
  if (reply.blob_len > sizeof(h.bytes) || reply.dev_ipc_reply.offset > h.alloc_len ||
      r->len > h.alloc_len - reply.dev_ipc_reply.offset) {
    if (fd >= 0)
      close(fd);
    return hixl__err(HIXL_ERR_TRANSPORT, "shm: peer %s sent a malformed device IPC handle",
                     peer->name);
  }
  memcpy(h.bytes, reply.blob, reply.blob_len);
  h.len = reply.blob_len;
  void *base;
  if ((st = hixl__dev_ipc_import(&h, &base)) != HIXL_OK)
    return st;
  r->map_base = base;
  r->map_len = 0; /* not an mmap: released by the backend */
  r->map = (uint8_t *)base + reply.dev_ipc_reply.offset;
  return HIXL_OK;
}

static hixl_status_t shm_rmr_attach(hixl_rmr_t *r, int64_t deadline)
{
  hixl_peer_t *peer = r->peer;
  shm_peer_t *sp = peer->tp;
  /* What the blob claims must be what the owner registered in that slot
   * (shm_int.h); the first word is what rmr_live compares from now on. */
  uint64_t t[2];
  shm_tag(peer->remote_ctx_id, r->slot, r->rkey, r->base, r->len, r->access, r->flags, t);
  const shm_tag_t *s = r->slot < HIXL_REG_SLOTS ? &sp->table[r->slot] : NULL;
  if (s == NULL ||
      atomic_load_explicit((_Atomic uint64_t *)&s->w[0], memory_order_acquire) != t[0] ||
      atomic_load_explicit((_Atomic uint64_t *)&s->w[1], memory_order_relaxed) != t[1])
    return hixl__err(HIXL_ERR_NOT_REGISTERED,
                     "hixl_rmr_unpack: peer %s has no live region matching the blob (forged or "
                     "stale key)",
                     peer->name);
  r->tp_key[0] = t[0];
  if (r->flags & HIXL_REGF_DEVICE)
    return attach_device(r, deadline);
  if (!(r->flags & HIXL_REGF_MEMFD))
    return HIXL_OK; /* reached with CMA */
  hixl_msg_t m = {.type = HIXL_MSG_FD_REQ}, reply;
  m.region.slot = r->slot;
  m.region.rkey = r->rkey;
  int fd = -1;
  hixl_status_t st = hixl__call(peer, &m, HIXL_MSG_FD_REPLY, &reply, &fd, deadline);
  if (st != HIXL_OK)
    return st == HIXL_ERR_NOT_REGISTERED
               ? hixl__err(st, "hixl_rmr_unpack: peer %s no longer has the region", peer->name)
               : st;
  if (fd < 0)
    return hixl__err(HIXL_ERR_TRANSPORT, "shm: peer %s sent no fd for the region", peer->name);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uint64_t off = reply.fd_reply.offset;
  uint64_t map_off = off & ~(uint64_t)(page - 1);
  size_t delta = (size_t)(off - map_off);
  size_t map_len = (delta + r->len + page - 1) & ~(page - 1);
  int prot = PROT_READ | (r->access & (HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC) ? PROT_WRITE : 0);
  void *p = MAP_FAILED;
  errno = EPERM; /* unsealed or short: its owner could truncate it under us */
  if (hixl__fd_sealed(fd, map_off + map_len))
    p = mmap(NULL, map_len, prot, MAP_SHARED, fd, (off_t)map_off);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED)
    return hixl__err(HIXL_ERR_TRANSPORT, "shm: cannot map a region of peer %s: %s", peer->name,
                     strerror(e));
  r->map_base = p;
  r->map_len = map_len;
  r->map = (uint8_t *)p + delta;
  return HIXL_OK;
}

static void shm_rmr_detach(hixl_rmr_t *r)
{
  if (r->map_base && (r->flags & HIXL_REGF_DEVICE))
    hixl__dev_ipc_close(r->map_base);
  else if (r->map_base)
    munmap(r->map_base, r->map_len);
  r->map_base = NULL;
  r->map = NULL;
}

static bool shm_rmr_live(const hixl_rmr_t *r)
{
  const shm_peer_t *sp = r->peer->tp;
  return atomic_load_explicit((_Atomic uint64_t *)&sp->table[r->slot].w[0], memory_order_acquire) ==
         r->tp_key[0];
}

static hixl_status_t cma_error(hixl_peer_t *peer, bool write, int e)
{
  const char *call = write ? "process_vm_writev" : "process_vm_readv";
  if (e == ESRCH) {
    /* The process is gone: say so for every later call too, without
     * waiting for the control thread to see the socket close. */
    pthread_mutex_lock(&peer->ctx->lock);
    hixl__peer_fail_locked(peer, HIXL_PEER_LOST, "process gone");
    pthread_mutex_unlock(&peer->ctx->lock);
    return hixl__err(HIXL_ERR_PEER_LOST, "shm: peer %s (pid %d) is gone", peer->name,
                     (int)peer->remote_pid);
  }
  return hixl__err(HIXL_ERR_TRANSPORT, "shm: %s into peer %s (pid %d) failed: %s", call, peer->name,
                   (int)peer->remote_pid, strerror(e));
}

/* The kernel refuses CMA towards this peer: from now on (this peer only,
 * no system call tried again) its non-mapped regions go through its
 * control thread. */
static HIXL_COLD bool cma_refused(hixl_peer_t *peer, bool write, int e)
{
  if (e != EPERM && e != ENOSYS)
    return false;
  shm_peer_t *sp = peer->tp;
  if (!atomic_exchange(&sp->cma_refused, true))
    hixl_info("shm: %s into peer %s (pid %d): %s; its registered memory is reached through "
              "its control thread from now on (slower for large transfers). %s",
              write ? "process_vm_writev" : "process_vm_readv", peer->name, (int)peer->remote_pid,
              strerror(e),
              e == ENOSYS
                  ? "This kernel has no cross-memory attach (CONFIG_CROSS_MEMORY_ATTACH)"
                  : "Usual causes: Yama (kernel.yama.ptrace_scope 1 refuses non-descendants: "
                    "set HIXL_SHM_PTRACER=1 in the target, which calls "
                    "prctl(PR_SET_PTRACER) as Open MPI does, or ptrace_scope 0), or a "
                    "container's seccomp profile (allow process_vm_readv/writev, or "
                    "--cap-add SYS_PTRACE); hixl_mem_alloc memory is mapped and not "
                    "affected");
  return true;
}

/* Owner-side copies of one range (a session of its own). */
static hixl_status_t staged(hixl_peer_t *peer, bool put, void *local, const hixl_rmr_t *r,
                            uint64_t off, size_t len)
{
  shm_stage_sess_t s;
  hixl_status_t st = hixl__shm_stage_begin(peer, &s);
  if (st != HIXL_OK)
    return st;
  hixl__shm_stage_add(&s, put, local, r, off, len);
  return hixl__shm_stage_end(&s);
}

/* A range of a non-mapped region: CMA, or the owner's copies. */
static hixl_status_t cma(hixl_peer_t *peer, bool write, void *local, const hixl_rmr_t *r,
                         uint64_t off, size_t len)
{
  shm_peer_t *sp = peer->tp;
  if (hixl_likely(!atomic_load_explicit(&sp->cma_refused, memory_order_relaxed))) {
    struct iovec l = {local, len}, rv = {(void *)(uintptr_t)(r->base + off), len};
    int e = hixl__shm_cma(peer, write, &l, &rv, 1, len);
    if (hixl_likely(e == 0))
      return HIXL_OK;
    if (!cma_refused(peer, write, e))
      return cma_error(peer, write, e);
  }
  return staged(peer, write, local, r, off, len);
}

/* Device memory on either side (shm_put / shm_get's slow path): the
 * runtime copies to and from mapped (imported) regions; a CMA region and a
 * local device buffer meet in a host buffer, piece by piece. */
static HIXL_COLD hixl_status_t dev_xfer(hixl_peer_t *peer, bool put, void *local, size_t len,
                                        hixl_rmr_t *r, uint64_t off)
{
  if (r->map != NULL)
    return put ? hixl__dev_copy(r->map + off, local, len)
               : hixl__dev_copy(local, r->map + off, len);
  enum { PIECE = 64 * 1024 };
  uint8_t buf[PIECE];
  for (size_t done = 0; done < len;) {
    size_t n = len - done < PIECE ? len - done : PIECE;
    hixl_status_t st = put ? hixl__dev_copy(buf, (uint8_t *)local + done, n) : HIXL_OK;
    if (st == HIXL_OK)
      st = cma(peer, put, buf, r, off + done, n);
    if (st == HIXL_OK && !put)
      st = hixl__dev_copy((uint8_t *)local + done, buf, n);
    if (st != HIXL_OK)
      return st;
    done += n;
  }
  return HIXL_OK;
}

static HIXL_HOT hixl_status_t shm_put(hixl_peer_t *peer, const void *src, size_t len, hixl_rmr_t *r,
                                      uint64_t off, hixl_req_t *req)
{
  (void)req;
  if (hixl_unlikely((r->flags & HIXL_REGF_DEVICE) || hixl__is_dev(src)))
    return dev_xfer(peer, true, (void *)(uintptr_t)src, len, r, off);
  if (hixl_likely(r->map != NULL)) {
    hixl__copy(r->map + off, src, len);
    return HIXL_OK;
  }
  return cma(peer, true, (void *)(uintptr_t)src, r, off, len);
}

static HIXL_HOT hixl_status_t shm_get(hixl_peer_t *peer, void *dst, size_t len, hixl_rmr_t *r,
                                      uint64_t off, hixl_req_t *req)
{
  (void)req;
  if (hixl_unlikely((r->flags & HIXL_REGF_DEVICE) || hixl__is_dev(dst)))
    return dev_xfer(peer, false, dst, len, r, off);
  if (hixl_likely(r->map != NULL)) {
    hixl__copy(dst, r->map + off, len);
    return HIXL_OK;
  }
  return cma(peer, false, dst, r, off, len);
}

static hixl_status_t shm_notify(hixl_peer_t *peer, uint32_t imm, uint64_t len, hixl_req_t *req)
{
  (void)req;
  shm_peer_t *sp = peer->tp;
  hixl_status_t st = hixl__notify_push(peer, &sp->outbox, imm, len);
  if (hixl_likely(st == HIXL_OK))
    hixl__shm_ring_if_sleeping(sp);
  return st;
}

/* We took entries from peer's inbox: ring it if it waits for room. */
static void shm_notif_consumed(hixl_peer_t *peer)
{
  shm_peer_t *sp = peer->tp;
  atomic_thread_fence(memory_order_seq_cst);
  uint32_t v = atomic_load_explicit(&sp->bell->space_waiters, memory_order_relaxed);
  if (hixl_unlikely(v != 0))
    hixl__shm_bell_send(sp, v);
}

/* A thread is about to sleep (wait.c): our doorbell, unless it is the
 * progress thread (no shm event is progress). */
/* The control thread's turn (shm_bell's `alive`): we are alive now.  The
 * coarse clock (a few ms behind, never a system call) is plenty for a
 * liveness period of a second or more. */
static void shm_on_event(hixl_ctx_t *ctx)
{
  shm_ctx_t *sc = ctx->tp[HIXL_TP_SHM];
  if (sc && sc->bell)
    atomic_store_explicit(&sc->bell->alive, (uint64_t)hixl__now_coarse_ns(), memory_order_relaxed);
}

/* A stored time this far from what our clock allows (earlier than our
 * previous look, though stored after it, or later than now) is not on our
 * clock. */
#define SHM_ALIVE_SLACK_NS 1000000000

/* Has the peer's control thread turned since we last looked, and when?
 * Its page is sealed against shrinking (no SIGBUS) and any value is
 * harmless: a peer that pretends to be alive could as well send
 * heartbeats, and one that says it turned long ago is lost sooner. */
static int shm_peer_alive(hixl_peer_t *peer, int64_t now, int64_t *seen_ns)
{
  shm_peer_t *sp = peer->tp;
  if (sp == NULL || sp->bell == NULL)
    return -1;
  uint64_t v = atomic_load_explicit(&sp->bell->alive, memory_order_relaxed);
  int64_t before = sp->alive_read_ns;
  sp->alive_read_ns = now;
  if (v == sp->alive_seen)
    return 0;
  sp->alive_seen = v;
  int64_t t = (int64_t)v;
  /* Same host, same CLOCK_MONOTONIC -- unless the owner lives in another
   * time namespace.  Then all we know is that it turned since our last
   * look: count it as now, which may find it lost up to T/2 late
   * (docs/scale.md), never early. */
  if (!sp->alive_unclocked && (t > now + SHM_ALIVE_SLACK_NS || t < before - SHM_ALIVE_SLACK_NS)) {
    hixl_debug("shm peer %s: its clock is not ours; liveness from its turns only", peer->name);
    sp->alive_unclocked = true;
  }
  *seen_ns = sp->alive_unclocked || t > now ? now : t;
  return 1;
}

/* The words our sleepers watch: each bound peer's inbox bell, while they
 * are few (SHM_WAIT_WORDS); read under wlock, which watch_del takes before
 * the ring is unmapped. */
static int shm_arm_words(hixl_ctx_t *ctx, unsigned flags, hixl_wait_word_t *w, int max)
{
  shm_ctx_t *sc = ctx->tp[HIXL_TP_SHM];
  if (flags & HIXL_WAITF_PROGRESS)
    return 0;
  pthread_mutex_lock(&sc->wlock);
  int n = sc->n_watch;
  if (n > max || n > SHM_WAIT_WORDS) {
    pthread_mutex_unlock(&sc->wlock);
    return -1;
  }
  int k = 0;
  for (shm_peer_t *sp = sc->watch; sp; sp = sp->wnext)
    w[k++] =
        (hixl_wait_word_t){.word = &sp->inbox_sh->bell,
                           .val = atomic_load_explicit(&sp->inbox_sh->bell, memory_order_seq_cst),
                           .shared = true};
  pthread_mutex_unlock(&sc->wlock);
  return k;
}

static int shm_arm(hixl_ctx_t *ctx, unsigned flags, int *fds, int max)
{
  const shm_ctx_t *sc = ctx->tp[HIXL_TP_SHM];
  if ((flags & HIXL_WAITF_PROGRESS) || sc->bell_r < 0 || max < 1)
    return 0;
  fds[0] = sc->bell_r;
  return 1;
}

static void shm_ack_event(hixl_ctx_t *ctx, int64_t woke_ns, bool word)
{
  shm_ctx_t *sc = ctx->tp[HIXL_TP_SHM];
  int64_t buf[64], last = 0;
  if (word) { /* woken on a word: the latest time a watched peer rang */
    pthread_mutex_lock(&sc->wlock);
    for (shm_peer_t *sp = sc->watch; sp; sp = sp->wnext) {
      int64_t t = atomic_load_explicit(&sp->inbox_sh->rang_ns, memory_order_relaxed);
      if (t != sp->rang_seen) {
        sp->rang_seen = t;
        if (t > last && t < woke_ns)
          last = t;
      }
    }
    pthread_mutex_unlock(&sc->wlock);
    if (last > 0)
      hixl__wait_sample(ctx, woke_ns - last);
    return;
  }
  /* Bounded: a peer that keeps the pipe full must not keep us here. */
  for (int i = 0; i < 16; i++) {
    ssize_t r = read(sc->bell_r, buf, sizeof(buf));
    if (r <= 0)
      break;
    if (r % 8 == 0)
      last = buf[r / 8 - 1];
    if (r < (ssize_t)sizeof(buf))
      break;
  }
  if (last > 0 && last < woke_ns)
    hixl__wait_sample(ctx, woke_ns - last);
}

/* A batch: blocks in mapped regions copied directly, streamed when the batch
 * as a whole is as large as a copy that hixl__copy would stream (1024 x 16
 * KiB blocks are one 16 MiB transfer to the caches); blocks in unmapped
 * regions gathered into one process_vm_writev/readv per CMA_IOV of them
 * instead of a system call each (or, without CMA, into one session of owner
 * copies, pipelined).  Then the notification, after all. */
typedef struct shm_batch_cma {
  hixl_peer_t *peer;
  const hixl_xfer_t *x;
  bool is_put;
  size_t k, bytes;
  size_t idx[256]; /* the elements in lv / rv */
  struct iovec lv[256], rv[256];
  shm_stage_sess_t sess; /* owner copies, open while in_sess */
  bool in_sess;
} shm_batch_cma_t;

static hixl_status_t batch_staged(shm_batch_cma_t *b, size_t i)
{
  if (!b->in_sess) {
    hixl_status_t st = hixl__shm_stage_begin(b->peer, &b->sess);
    if (st != HIXL_OK)
      return st;
    b->in_sess = true;
  }
  const hixl_xfer_t *x = &b->x[i];
  return hixl__shm_stage_add(&b->sess, b->is_put, x->local, x->rmr, x->off, x->len);
}

/* The gathered elements: one CMA call (split across threads when large),
 * or, where the kernel refuses it, owner copies of the same elements. */
static hixl_status_t batch_flush(shm_batch_cma_t *b)
{
  size_t k = b->k;
  b->k = 0;
  if (k == 0)
    return HIXL_OK;
  int e = hixl__shm_cma(b->peer, b->is_put, b->lv, b->rv, k, b->bytes);
  b->bytes = 0;
  if (hixl_likely(e == 0))
    return HIXL_OK;
  if (!cma_refused(b->peer, b->is_put, e))
    return cma_error(b->peer, b->is_put, e);
  hixl_status_t st = HIXL_OK;
  for (size_t j = 0; j < k && st == HIXL_OK; j++)
    st = batch_staged(b, b->idx[j]);
  return st;
}

static hixl_status_t batch_end_sess(shm_batch_cma_t *b, hixl_status_t st)
{
  if (!b->in_sess)
    return st;
  b->in_sess = false;
  hixl_status_t st2 = hixl__shm_stage_end(&b->sess);
  return st != HIXL_OK ? st : st2;
}

static hixl_status_t shm_batch(hixl_peer_t *peer, const hixl_xfer_t *x, size_t n, bool is_put,
                               const uint32_t *imm, uint64_t total, hixl_req_t *req)
{
  shm_batch_cma_t b;
  b.peer = peer;
  b.x = x;
  b.is_put = is_put;
  b.k = b.bytes = 0;
  b.in_sess = false;
  shm_peer_t *sp = peer->tp;
  bool stream = total >= hixl__stream_min;
  hixl_status_t st = HIXL_OK;
  for (size_t i = 0; i < n && st == HIXL_OK; i++) {
    hixl_rmr_t *r = x[i].rmr;
    if (hixl_unlikely((r->flags & HIXL_REGF_DEVICE) || hixl__is_dev(x[i].local))) {
      /* Its own CMA calls or owner copies (a session of its own). */
      st = batch_end_sess(&b, batch_flush(&b));
      if (st == HIXL_OK)
        st = dev_xfer(peer, is_put, x[i].local, x[i].len, r, x[i].off);
      continue;
    }
    if (hixl_likely(r->map != NULL)) {
      uint8_t *p = r->map + x[i].off;
      void *dst = is_put ? p : x[i].local;
      const void *src = is_put ? (const void *)x[i].local : p;
      if (stream)
        hixl__copy_stream(dst, src, x[i].len);
      else
        hixl__copy(dst, src, x[i].len);
      continue;
    }
    if (hixl_unlikely(atomic_load_explicit(&sp->cma_refused, memory_order_relaxed))) {
      st = batch_staged(&b, i);
      continue;
    }
    b.idx[b.k] = i;
    b.lv[b.k] = (struct iovec){x[i].local, x[i].len};
    b.rv[b.k] = (struct iovec){(void *)(uintptr_t)(r->base + x[i].off), x[i].len};
    b.bytes += x[i].len;
    if (++b.k == sizeof(b.idx) / sizeof(b.idx[0]))
      st = batch_flush(&b);
  }
  if (stream)
    hixl__copy_fence();
  if (st == HIXL_OK)
    st = batch_flush(&b);
  st = batch_end_sess(&b, st);
  if (st == HIXL_OK && imm)
    st = shm_notify(peer, *imm, total, req);
  return st;
}

static hixl_status_t shm_atomic(hixl_peer_t *peer, hixl_rmr_t *r, uint64_t off, int op, uint64_t a,
                                uint64_t b, uint64_t *old_p, hixl_req_t *req)
{
  if (hixl_unlikely(r->flags & HIXL_REGF_DEVICE))
    return hixl__err(HIXL_ERR_UNSUPPORTED,
                     "shm: atomics on device memory need a NIC (the region of %s is device "
                     "memory)",
                     peer->name);
  if (hixl_likely(r->map != NULL)) {
    *old_p = hixl__amo_local((uint64_t *)(void *)(r->map + off), op, a, b);
    return HIXL_OK;
  }
  if (req == NULL)
    return HIXL_INPROGRESS; /* asynchronous: the core supplies a request */
  /* Not mapped: the owner's control thread executes it on its memory, so
   * it is atomic with respect to the owner and every other peer. */
  return hixl__owner_atomic("shm", peer, r, off, op, a, b, req, false);
}

static int shm_progress(hixl_ctx_t *ctx)
{
  (void)ctx;
  return 0; /* data moves inline; async atomics complete on the control thread */
}

const hixl_transport_ops_t hixl__shm_ops = {
    .size = sizeof(hixl_transport_ops_t),
    .name = "shm",
    .id = HIXL_TP_SHM,
    .async = false,
    .needs_bind = true,
    .bind_unix = true,
    .bind_fds = 3,
    .caps = HIXL_TP_CAP_LOCAL_MAP,
    .msgs = shm_msgs,
    .ctx_init = hixl__shm_ctx_init,
    .ctx_fini = hixl__shm_ctx_fini,
    .mr_reg = shm_mr_reg,
    .mr_dereg = shm_mr_dereg,
    .usable = shm_usable,
    .connect = shm_connect,
    .accept = shm_accept,
    .peer_close = shm_peer_close,
    .rmr_attach = shm_rmr_attach,
    .rmr_detach = shm_rmr_detach,
    .rmr_live = shm_rmr_live,
    .put = shm_put,
    .get = shm_get,
    .put_imm = hixl__tp_put_imm_sync,
    .notify = shm_notify,
    .batch = shm_batch,
    .atomic = shm_atomic,
    .progress = shm_progress,
    .on_event = shm_on_event,
    .peer_alive = shm_peer_alive,
    .arm = shm_arm,
    .arm_words = shm_arm_words,
    .ack_event = shm_ack_event,
    .notif_consumed = shm_notif_consumed,
};

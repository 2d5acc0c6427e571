/* SPDX-License-Identifier: MIT */
/*
 * hixl_world: a fixed group of ranks, set up the way torchrun does it.
 *
 * Rendezvous: rank 0 listens on the rendezvous address; every other rank
 * connects (retrying until rank 0 is up), sends "HIXLW 1 <rank> <size>
 * <ctx address>\n"; once all have joined, rank 0 answers each with
 * "HIXLW 1 <world id> <size>\n" and one address per rank.  Then rank i
 * connects to every rank j < i with a tag (world id, i) in its HELLO, and
 * waits for the tagged inbound connections of the ranks above it: one
 * connection per pair.  Barrier and exchange travel as control messages,
 * so they never mix with the user's notifications.
 *
 * Under torchrun, MASTER_PORT is taken: the agent serves its TCPStore there
 * (TORCHELASTIC_USE_AGENT_STORE=True).  Then the same exchange goes through
 * that store, as torch's own process groups bootstrap (store.c): under
 * hixl/world/<run id>/<restart>/<generation>/, every rank sets addr/<rank>
 * to "HIXLW 1 <rank> <size> <ctx address>"; rank 0 waits for all, and sets
 * "table" to exactly the answer the listening rank 0 sends; the others wait
 * for the table.  The generation is the value of an add on
 * hixl/world/<run id>/<restart>/gen/<rank>: the n-th world a rank creates
 * is generation n in every rank, and never meets the keys of another.
 * HIXL_RENDEZVOUS=store|listen overrides the choice.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"
#include "conn.h"
#include "store.h"

#define WORLD_JOINS 4 /* join connections rank 0 serves at once */

/* A rank's connection to rank 0's join listener (control thread only). */
struct join_conn {
  int fd, slot;  /* -1: free */
  uint64_t seq;  /* the oldest is shed for a new one */
  size_t in_len; /* the join line so far */
  char in[256];
  char *out; /* the reply, being written */
  size_t out_len, out_off;
};

struct hixl_world {
  hixl_ctx_t *ctx;
  int rank, size;
  uint32_t id;
  bool joined; /* this rank came back into a running world */
  /* The current peer of each rank: replaced (under ctx->lock) when a lost
   * rank has come back; read without the lock by hixl_world_peer. */
  hixl_peer_t *_Atomic *peers;
  /* Per rank, barriers and exchanges sent to its current peer: each pair
   * of ranks counts its own, so a rank that comes back starts at 0 with
   * every other (ctx->lock). */
  uint64_t *bsent, *xsent;
  bool *skipped; /* per rank: lost when the barrier or exchange began, not sent to */
  /* Rank 0 meeting by listening: the listener stays open for ranks that
   * come back, served by the control thread (join_cb), with the table of
   * every rank's current address. */
  char (*addrs)[128];
  char (*join_addr)[128];     /* what a rank that comes back said, until it connected */
  pthread_mutex_t addrs_lock; /* addrs and join_addr: the control thread and refresh */
  int lfd, lslot;
  /* A barrier or exchange is running (ctx->lock): no rank's peer is
   * replaced meanwhile, so that it pairs with the same peers throughout. */
  int in_coll;
  struct join_conn jc[WORLD_JOINS];
  uint64_t jseq;
};

#define LINE_MAX_ 256

/* The tag in a world connection's HELLO: (world id, rank of the initiator). */
static uint64_t tag_of(uint32_t id, int rank) { return (uint64_t)id << 32 | (uint32_t)(rank + 1); }

static int ms_left(int64_t deadline)
{
  if (deadline == INT64_MAX)
    return -1;
  int64_t ms = (deadline - hixl__now_ns()) / 1000000;
  return ms < 0 ? 0 : (int)ms;
}

/* Read one '\n'-terminated line (strictly bounded). */
static hixl_status_t read_line(int fd, char *buf, size_t cap, int64_t deadline)
{
  size_t n = 0;
  for (;;) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int pr = poll(&pfd, 1, ms_left(deadline));
    if (pr == 0)
      return hixl__err(HIXL_ERR_TIMEOUT, "hixl_world_create: rendezvous timed out");
    if (pr < 0 && errno == EINTR)
      continue;
    char c;
    ssize_t r = read(fd, &c, 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return hixl__err(HIXL_ERR_PEER_LOST, "hixl_world_create: rendezvous connection closed");
    if (c == '\n') {
      buf[n] = 0;
      return HIXL_OK;
    }
    if (n + 1 >= cap || c == 0)
      return hixl__err(HIXL_ERR_TRANSPORT, "hixl_world_create: malformed rendezvous line");
    buf[n++] = c;
  }
}

static hixl_status_t write_all(int fd, const char *s)
{
  size_t len = strlen(s), off = 0;
  while (off < len) {
    ssize_t n = send(fd, s + off, len - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return hixl__err(HIXL_ERR_PEER_LOST, "hixl_world_create: rendezvous write failed: %s",
                       strerror(errno));
    off += (size_t)n;
  }
  return HIXL_OK;
}

static bool addr_ok(const char *a)
{
  size_t n = strlen(a);
  if (n == 0 || n >= 128)
    return false;
  for (size_t i = 0; i < n; i++)
    if (a[i] <= ' ' || a[i] > '~')
      return false;
  return true;
}

/* Rank 0's table: "<kind> 1 <world id> <size>", then one address per rank
 * (rank `own`'s is own_addr when own >= 0), a line each; NUL-terminated.
 * The answer of the listening rank 0 (kind HIXLW; HIXLJ to a rank that
 * comes back), and the store's table. */
static char *table_make(const hixl_world_t *w, const char *kind, char (*addrs)[128], int own,
                        const char *own_addr, size_t *len_p)
{
  size_t cap = 64 + (size_t)w->size * 129, n;
  char *t = malloc(cap);
  if (t == NULL)
    return NULL;
  n = (size_t)snprintf(t, cap, "%s 1 %08" PRIx32 " %d\n", kind, w->id, w->size);
  for (int r = 0; r < w->size; r++)
    n += (size_t)snprintf(t + n, cap - n, "%s\n", r == own ? own_addr : addrs[r]);
  *len_p = n;
  return t;
}

/* An inbound peer that is up, tagged as rank j's connection to this
 * world, other than `except` (ctx->lock held). */
static hixl_peer_t *tagged_up_locked(const hixl_world_t *w, int j, const hixl_peer_t *except)
{
  for (hixl_peer_t *p = w->ctx->peers; p; p = p->next)
    if (p != except && p->inbound && p->tag == tag_of(w->id, j) &&
        atomic_load(&p->state) == HIXL_PEER_UP && !atomic_load(&p->releasing))
      return p;
  return NULL;
}

static hixl_status_t rendezvous_server(hixl_world_t *w, const char *host, const char *port,
                                       char (*addrs)[128], int64_t deadline)
{
  struct addrinfo hints = {
      .ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *res;
  (void)host; /* rank 0 listens on every address: MASTER_ADDR is one of ours */
  if (getaddrinfo(NULL, port, &hints, &res) != 0)
    return hixl__err(HIXL_ERR_INVALID, "hixl_world_create: bad rendezvous port %s", port);
  int lfd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (lfd < 0 || bind(lfd, res->ai_addr, res->ai_addrlen) != 0 || listen(lfd, 1024) != 0) {
    int e = errno;
    freeaddrinfo(res);
    if (lfd >= 0)
      close(lfd);
    return hixl__err(HIXL_ERR_TRANSPORT,
                     "hixl_world_create: cannot listen on rendezvous port "
                     "%s: %s",
                     port, strerror(e));
  }
  freeaddrinfo(res);
  int *fds = calloc((size_t)w->size, sizeof(int));
  hixl_status_t st = fds ? HIXL_OK : HIXL_ERR_NOMEM;
  snprintf(addrs[0], 128, "%s", hixl_ctx_address(w->ctx));
  int joined = 1;
  while (st == HIXL_OK && joined < w->size) {
    struct pollfd pfd = {lfd, POLLIN, 0};
    int pr = poll(&pfd, 1, ms_left(deadline));
    if (pr == 0) {
      st = hixl__err(HIXL_ERR_TIMEOUT, "hixl_world_create: only %d of %d ranks joined", joined,
                     w->size);
      break;
    }
    if (pr < 0)
      continue;
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
      continue;
    char line[LINE_MAX_], addr[LINE_MAX_];
    int r, s, ver;
    if (read_line(fd, line, sizeof(line), deadline) != HIXL_OK ||
        sscanf(line, "HIXLW %d %d %d %255s", &ver, &r, &s, addr) != 4 || ver != 1 || s != w->size ||
        r <= 0 || r >= w->size || fds[r] || !addr_ok(addr)) {
      hixl_warn("world rendezvous: rejected a join (\"%.60s\")", line);
      close(fd);
      continue;
    }
    fds[r] = fd;
    snprintf(addrs[r], 128, "%s", addr);
    joined++;
  }
  if (st == HIXL_OK) {
    size_t tlen;
    char *table = table_make(w, "HIXLW", addrs, -1, NULL, &tlen);
    if (table == NULL)
      st = hixl__err(HIXL_ERR_NOMEM, "hixl_world_create: no memory");
    for (int r = 1; r < w->size && st == HIXL_OK; r++)
      st = write_all(fds[r], table);
    free(table);
  }
  for (int r = 1; fds && r < w->size; r++)
    if (fds[r])
      close(fds[r]);
  free(fds);
  /* Kept for ranks that come back (served once the world is made), unless
   * HIXL_WORLD_ELASTIC=0 asks to give the port back now. */
  const char *el = getenv("HIXL_WORLD_ELASTIC");
  if (st == HIXL_OK && !(el && strcmp(el, "0") == 0))
    w->lfd = lfd;
  else
    close(lfd);
  return st;
}

static int dial(const char *host, const char *port, hixl_status_t *st)
{
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
  struct addrinfo *res;
  int fd = -1;
  if (getaddrinfo(host, port, &hints, &res) != 0) {
    *st = hixl__err(HIXL_ERR_INVALID, "hixl_world_create: cannot resolve %s", host);
    return -1;
  }
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  *st = HIXL_OK;
  return fd;
}

/* One try: rank 0 answers "HIXLW 1 <id> <size>" while the world forms, or
 * "HIXLJ 1 <id> <size>" once it runs (this rank comes back), then one
 * address per rank.  PEER_LOST: it closed without answering (it refuses a
 * rank whose previous process it still sees alive: try again). */
static hixl_status_t client_once(hixl_world_t *w, int fd, char (*addrs)[128], int64_t deadline)
{
  char line[LINE_MAX_], kind[8];
  snprintf(line, sizeof(line), "HIXLW 1 %d %d %s\n", w->rank, w->size, hixl_ctx_address(w->ctx));
  hixl_status_t st = write_all(fd, line);
  int ver, size;
  unsigned id;
  if (st == HIXL_OK && (st = read_line(fd, line, sizeof(line), deadline)) == HIXL_OK &&
      (sscanf(line, "%7s %d %x %d", kind, &ver, &id, &size) != 4 || ver != 1 || size != w->size ||
       (strcmp(kind, "HIXLW") != 0 && strcmp(kind, "HIXLJ") != 0)))
    st = hixl__err(HIXL_ERR_TRANSPORT, "hixl_world_create: bad rendezvous reply");
  for (int k = 0; k < w->size && st == HIXL_OK; k++) {
    st = read_line(fd, line, sizeof(line), deadline);
    if (st == HIXL_OK && !addr_ok(line))
      st = hixl__err(HIXL_ERR_TRANSPORT, "hixl_world_create: bad address in rendezvous reply");
    if (st == HIXL_OK)
      snprintf(addrs[k], 128, "%s", line);
  }
  if (st == HIXL_OK) {
    w->id = id;
    w->joined = strcmp(kind, "HIXLJ") == 0;
  }
  return st;
}

static hixl_status_t rendezvous_client(hixl_world_t *w, const char *host, const char *port,
                                       char (*addrs)[128], int64_t deadline)
{
  /* Rank 0 may not be listening yet, or may still see this rank's previous
   * process alive: retry until the deadline. */
  for (;;) {
    hixl_status_t st;
    int fd = dial(host, port, &st);
    if (st != HIXL_OK)
      return st;
    if (fd >= 0) {
      st = client_once(w, fd, addrs, deadline);
      close(fd);
      if (st != HIXL_ERR_PEER_LOST || hixl__expired(deadline))
        return st;
    } else if (hixl__expired(deadline)) {
      return hixl__err(HIXL_ERR_TIMEOUT, "hixl_world_create: rank 0 not reachable at %s:%s", host,
                       port);
    }
    usleep(20000);
  }
}

/* ------------------------------------------------------------ coming back */

static void join_cb(void *arg, int fd, uint32_t events);

static void join_close(hixl_world_t *w, struct join_conn *c)
{
  if (c->fd < 0)
    return;
  hixl__ctl_aux_del_locked(w->ctx, c->slot);
  close(c->fd);
  free(c->out);
  memset(c, 0, sizeof(*c));
  c->fd = c->slot = -1;
}

/* Write what the socket takes of the reply; closed once all of it went. */
static void join_write(hixl_world_t *w, struct join_conn *c)
{
  while (c->out_off < c->out_len) {
    ssize_t n =
        send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      hixl__ctl_aux_mod_locked(w->ctx, c->slot, EPOLLOUT | EPOLLRDHUP);
      return;
    }
    if (n <= 0)
      break;
    c->out_off += (size_t)n;
  }
  join_close(w, c);
}

/* The join line of a rank that comes back: "HIXLW 1 <rank> <size> <addr>".
 * Refused (closed without a reply) when rank 0 still sees that rank's
 * previous process alive: the rank tries again until it is lost. */
static void join_line(hixl_world_t *w, struct join_conn *c)
{
  char addr[128];
  int ver, r, sz, used = 0;
  if (sscanf(c->in, "HIXLW %d %d %d %127s%n", &ver, &r, &sz, addr, &used) != 4 || ver != 1 ||
      (size_t)used != strlen(c->in) || sz != w->size || r <= 0 || r >= w->size || !addr_ok(addr)) {
    hixl_warn("world %08" PRIx32 ": rejected a join (\"%.60s\")", w->id, c->in);
    join_close(w, c);
    return;
  }
  /* Refused while rank r has a peer that is up here: its previous process
   * (not found dead yet), or another process that already came back as r
   * (so that two cannot both take its place).  Lock order: aux_lock, then
   * ctx->lock (nothing takes aux_lock under ctx->lock). */
  hixl_ctx_t *ctx = w->ctx;
  pthread_mutex_lock(&ctx->lock);
  hixl_peer_t *cur = atomic_load(&w->peers[r]);
  bool taken =
      (cur && atomic_load(&cur->state) == HIXL_PEER_UP) || tagged_up_locked(w, r, NULL) != NULL;
  pthread_mutex_unlock(&ctx->lock);
  if (taken) {
    hixl_debug("world %08" PRIx32 ": rank %d asks to join, and it is up", w->id, r);
    join_close(w, c);
    return;
  }
  /* Its own address in its slot; the table itself takes it only once the
   * rank has connected (refresh_locked), so a join that never follows
   * through leaves the others' view of rank r as it was. */
  pthread_mutex_lock(&w->addrs_lock);
  snprintf(w->join_addr[r], 128, "%s", addr);
  c->out = table_make(w, "HIXLJ", w->addrs, r, addr, &c->out_len);
  pthread_mutex_unlock(&w->addrs_lock);
  if (c->out == NULL) {
    join_close(w, c);
    return;
  }
  c->out_off = 0;
  hixl_info("world %08" PRIx32 ": rank %d comes back from %s", w->id, r, addr);
  join_write(w, c);
}

static void join_read(hixl_world_t *w, struct join_conn *c)
{
  ssize_t n = recv(c->fd, c->in + c->in_len, sizeof(c->in) - 1 - c->in_len, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return;
  if (n <= 0) {
    join_close(w, c);
    return;
  }
  c->in_len += (size_t)n;
  c->in[c->in_len] = 0;
  char *nl = memchr(c->in, '\n', c->in_len);
  if (nl == NULL) {
    if (c->in_len + 1 >= sizeof(c->in) || memchr(c->in, 0, c->in_len)) {
      hixl_warn("world %08" PRIx32 ": rejected a join (no line in %zu bytes)", w->id, c->in_len);
      join_close(w, c);
    }
    return;
  }
  if (nl != c->in + c->in_len - 1 || memchr(c->in, 0, c->in_len)) { /* one line, then a reply */
    hixl_warn("world %08" PRIx32 ": rejected a join (bytes after its line)", w->id);
    join_close(w, c);
    return;
  }
  *nl = 0;
  join_line(w, c);
}

static void join_accept(hixl_world_t *w)
{
  for (int k = 0; k < WORLD_JOINS; k++) {
    int fd = accept4(w->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        /* Level-triggered: the listener would wake us at once, forever.
         * Coming back is no longer served; the world itself goes on. */
        char why[320];
        hixl_warn("world %08" PRIx32 ": stops serving ranks that come back, and closes its "
                  "rendezvous port: %s",
                  w->id, hixl__strerror_fd(errno, why, sizeof(why)));
        hixl__ctl_aux_del_locked(w->ctx, w->lslot);
        w->lslot = -1;
        close(w->lfd); /* refused at once, not left in the backlog */
        w->lfd = -1;
      }
      return;
    }
    struct join_conn *c = NULL;
    for (int i = 0; i < WORLD_JOINS; i++)
      if (w->jc[i].fd < 0 || c == NULL || (c->fd >= 0 && w->jc[i].seq < c->seq))
        c = &w->jc[i];
    join_close(w, c); /* the oldest, when all are taken */
    c->fd = fd;
    c->seq = ++w->jseq;
    if ((c->slot = hixl__ctl_aux_add_locked(w->ctx, fd, EPOLLIN | EPOLLRDHUP, join_cb, w)) < 0) {
      close(fd);
      c->fd = -1;
      return;
    }
  }
}

/* The control thread, aux_lock held: the listener or one of its
 * connections (a stale event may name a descriptor no longer ours). */
static void join_cb(void *arg, int fd, uint32_t events)
{
  hixl_world_t *w = arg;
  if (fd == w->lfd) {
    if (w->lslot >= 0)
      join_accept(w);
    return;
  }
  for (int i = 0; i < WORLD_JOINS; i++) {
    struct join_conn *c = &w->jc[i];
    if (c->fd != fd)
      continue;
    if (c->out)
      join_write(w, c);
    else if (events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))
      join_read(w, c);
    return;
  }
}

/* ------------------------------------------------------------ torchrun's store */

#define STORE_VAL_MAX 256
#define STORE_KEY_CAP 256

/* A piece of a key from the environment: printable, no '/', bounded. */
static void key_part(char *out, size_t cap, const char *v, const char *dflt)
{
  if (v == NULL || *v == 0)
    v = dflt;
  size_t n = 0;
  for (; *v && n + 1 < cap; v++)
    out[n++] = (*v > ' ' && *v <= '~' && *v != '/') ? *v : '_';
  out[n] = 0;
}

/* "2, 3, 5": the ranks (not self) whose address is not in the store, asked
 * after a timeout with a short grace of its own; false when the store did
 * not say. */
static bool missing_ranks(hixl_store_t *s, const char *base, int size, int self, char *out,
                          size_t cap)
{
  int64_t grace = hixl__deadline(2000);
  size_t n = 0;
  int listed = 0, more = 0;
  out[0] = 0;
  for (int r = 0; r < size; r++) {
    if (r == self)
      continue;
    char key[STORE_KEY_CAP + 32];
    snprintf(key, sizeof(key), "%s/addr/%d", base, r);
    const char *k = key;
    bool ready = false;
    if (hixl__store_check(s, &k, 1, &ready, grace) != HIXL_OK)
      return false;
    if (ready)
      continue;
    if (listed < 16 && n < cap) {
      n += (size_t)snprintf(out + n, cap - n, "%s%d", listed ? ", " : "", r);
      listed++;
    } else {
      more++;
    }
  }
  if (more && n < cap)
    snprintf(out + n, cap - n, " and %d more", more);
  return true;
}

/* Parse the table (untrusted: it came through the store) strictly.  With
 * mine_p, a table whose entry for this rank is another address (that of
 * its previous process) is taken, and *mine_p says which it was. */
static hixl_status_t table_parse(hixl_world_t *w, const char *t, size_t len, char (*addrs)[128],
                                 const char *store, bool *mine_p)
{
  const char *p = t, *end = t + len;
  int ver, size, used = 0;
  unsigned id;
  const char *nl = memchr(p, '\n', (size_t)(end - p));
  char line[LINE_MAX_];
  if (nl == NULL || (size_t)(nl - p) >= sizeof(line))
    goto bad;
  memcpy(line, p, (size_t)(nl - p));
  line[nl - p] = 0;
  if (sscanf(line, "HIXLW %d %8x %d%n", &ver, &id, &size, &used) != 3 || ver != 1 || used != nl - p)
    goto bad;
  if (size != w->size)
    return hixl__err(HIXL_ERR_INVALID,
                     "hixl_world_create: rank 0 formed a world of %d ranks, "
                     "this rank was started with %d (torch store at %s)",
                     size, w->size, store);
  p = nl + 1;
  for (int r = 0; r < w->size; r++) {
    nl = memchr(p, '\n', (size_t)(end - p));
    if (nl == NULL || nl - p >= 128)
      goto bad;
    memcpy(addrs[r], p, (size_t)(nl - p));
    addrs[r][nl - p] = 0;
    if (!addr_ok(addrs[r]))
      goto bad;
    p = nl + 1;
  }
  if (p != end)
    goto bad;
  if (strcmp(addrs[w->rank], hixl_ctx_address(w->ctx)) != 0) {
    if (!mine_p)
      goto bad;
    *mine_p = false; /* made before this process: it comes back */
  } else if (mine_p) {
    *mine_p = true;
  }
  w->id = id;
  return HIXL_OK;
bad:
  return hixl__err(HIXL_ERR_TRANSPORT,
                   "hixl_world_create: malformed world table from the "
                   "torch store at %s",
                   store);
}

/* Rank r's address as it set it under base ("HIXLW 1 <r> <size> <addr>",
 * untrusted: it came through the store). */
static hixl_status_t get_addr(hixl_store_t *s, const hixl_world_t *w, const char *base, int r,
                              char *addr, int64_t deadline)
{
  char key[STORE_KEY_CAP + 32], val[STORE_VAL_MAX];
  const char *store = hixl__store_name(s);
  size_t len = 0;
  int ver, rr, sz, used = 0;
  char a[128];
  snprintf(key, sizeof(key), "%s/addr/%d", base, r);
  hixl_status_t st = hixl__store_get(s, key, val, sizeof(val) - 1, &len, deadline);
  if (st != HIXL_OK)
    return st;
  val[len] = 0;
  if (strlen(val) != len || sscanf(val, "HIXLW %d %d %d %127s%n", &ver, &rr, &sz, a, &used) != 4 ||
      ver != 1 || rr != r || (size_t)used != len || !addr_ok(a))
    return hixl__err(HIXL_ERR_TRANSPORT,
                     "hixl_world_create: malformed address of rank %d in "
                     "the torch store at %s (\"%.60s\")",
                     r, store, val);
  if (sz != w->size)
    return hixl__err(HIXL_ERR_INVALID,
                     "hixl_world_create: rank %d was started with a world "
                     "of %d ranks, this rank with %d (torch store at %s)",
                     r, sz, w->size, store);
  snprintf(addr, 128, "%s", a);
  return HIXL_OK;
}

/* Worlds this process made through a store, and how far its generation
 * counter ran ahead of them: a process that comes back finds the worlds
 * of the process it replaces counted there too. */
static pthread_mutex_t store_gen_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t store_worlds, store_offset;

static hixl_status_t rendezvous_store(hixl_world_t *w, const char *host, const char *port,
                                      char (*addrs)[128], int64_t deadline)
{
  const char *proto = getenv("HIXL_STORE_PROTOCOL");
  int dialect = hixl__store_dialect_parse(proto);
  if (dialect < 0)
    return hixl__err(HIXL_ERR_INVALID,
                     "hixl_world_create: HIXL_STORE_PROTOCOL=%.32s (want "
                     "auto, legacy or validate)",
                     proto);
  hixl_store_t *s;
  hixl_status_t st = hixl__store_connect(host, port, dialect, deadline, &s);
  if (st != HIXL_OK)
    return hixl__err(st, "hixl_world_create: %s", hixl_last_error());
  const char *store = hixl__store_name(s);
  char run[64], restart[24], key[STORE_KEY_CAP + 32], base[STORE_KEY_CAP];
  key_part(run, sizeof(run), getenv("TORCHELASTIC_RUN_ID"), "-");
  key_part(restart, sizeof(restart), getenv("TORCHELASTIC_RESTART_COUNT"), "0");
  snprintf(key, sizeof(key), "hixl/world/%s/%s/gen/%d", run, restart, w->rank);
  int64_t gen = 0;
  char(*keys)[STORE_KEY_CAP + 32] = NULL;
  const char **kp = NULL;
  char *table = NULL;
  /* The n-th world of a process is generation n (plus the offset below).
   * A count past that is a rank whose process was started again: its
   * predecessor's worlds are counted too.  It comes back into the latest
   * of them (the one running), and puts the count back, so that the next
   * world it makes meets the others' next.  A new world is counted here
   * whether or not it forms (the other ranks count theirs); a comeback
   * only once it succeeded (a failed one put the count back: the next try
   * is a comeback again).  Under the lock, the add too: another thread's
   * world must not be taken for a comeback. */
  bool back = false;
  int64_t local = 0;
  pthread_mutex_lock(&store_gen_lock);
  if ((st = hixl__store_add(s, key, 1, &gen, deadline)) == HIXL_OK && (gen < 1 || gen > (1 << 30)))
    st = hixl__err(HIXL_ERR_TRANSPORT,
                   "hixl_world_create: torch store at %s: counter \"%s\" "
                   "is %" PRId64 ", not a world generation",
                   store, key, gen);
  if (st == HIXL_OK) {
    local = store_worlds + 1;
    if (gen > local + store_offset) {
      int64_t undo;
      if ((st = hixl__store_add(s, key, -1, &undo, deadline)) == HIXL_OK) {
        gen--;
        back = true;
      }
    } else {
      store_worlds = local;
    }
  }
  pthread_mutex_unlock(&store_gen_lock);
  if (st != HIXL_OK)
    goto out;
  snprintf(base, sizeof(base), "hixl/world/%s/%s/%" PRId64, run, restart, gen);
  char val[STORE_VAL_MAX];
  int vn =
      snprintf(val, sizeof(val), "HIXLW 1 %d %d %s", w->rank, w->size, hixl_ctx_address(w->ctx));
  snprintf(key, sizeof(key), "%s/addr/%d", base, w->rank);
  if ((st = hixl__store_set(s, key, val, (size_t)vn, deadline)) != HIXL_OK)
    goto out;
  size_t tcap = 64 + (size_t)w->size * 129, tlen = 0;
  bool formed = false;
  if (back) { /* the world may be running: its table is there */
    snprintf(key, sizeof(key), "%s/table", base);
    const char *tk = key;
    if ((st = hixl__store_check(s, &tk, 1, &formed, deadline)) != HIXL_OK)
      goto out;
  }
  if (formed || (back && w->rank != 0)) {
    bool mine = false;
    snprintf(key, sizeof(key), "%s/table", base);
    if ((table = malloc(tcap)) == NULL) {
      st = hixl__err(HIXL_ERR_NOMEM, "hixl_world_create: no memory");
      goto out;
    }
    if ((st = hixl__store_get(s, key, table, tcap, &tlen, deadline)) != HIXL_OK ||
        (st = table_parse(w, table, tlen, addrs, store, &mine)) != HIXL_OK)
      goto out;
    if (!mine) {
      /* Made with our predecessor: come back, to each rank's latest
       * address (a rank that came back before us set its own). */
      w->joined = true;
      for (int r = 0; r < w->size && st == HIXL_OK; r++)
        if (r != w->rank)
          st = get_addr(s, w, base, r, addrs[r], deadline);
      snprintf(addrs[w->rank], 128, "%s", hixl_ctx_address(w->ctx));
      hixl_info("world %08" PRIx32 ": rank %d comes back (torch store at %s, world generation "
                "%" PRId64 ")",
                w->id, w->rank, store, gen);
    }
  } else if (w->rank == 0) {
    keys = calloc((size_t)w->size, sizeof(*keys));
    kp = calloc((size_t)w->size, sizeof(*kp));
    if (keys == NULL || kp == NULL) {
      st = hixl__err(HIXL_ERR_NOMEM, "hixl_world_create: no memory");
      goto out;
    }
    for (int r = 0; r < w->size; r++) {
      snprintf(keys[r], sizeof(keys[r]), "%s/addr/%d", base, r);
      kp[r] = keys[r];
    }
    st = hixl__store_wait(s, kp + 1, (size_t)w->size - 1, deadline);
    for (int r = 1; r < w->size && st == HIXL_OK; r++)
      st = get_addr(s, w, base, r, addrs[r], deadline);
    if (st == HIXL_OK) {
      snprintf(addrs[0], 128, "%s", hixl_ctx_address(w->ctx));
      if ((table = table_make(w, "HIXLW", addrs, -1, NULL, &tlen)) == NULL) {
        st = hixl__err(HIXL_ERR_NOMEM, "hixl_world_create: no memory");
        goto out;
      }
      snprintf(key, sizeof(key), "%s/table", base);
      st = hixl__store_set(s, key, table, tlen, deadline);
    }
  } else {
    snprintf(key, sizeof(key), "%s/table", base);
    if ((table = malloc(tcap)) == NULL) {
      st = hixl__err(HIXL_ERR_NOMEM, "hixl_world_create: no memory");
      goto out;
    }
    if ((st = hixl__store_get(s, key, table, tcap, &tlen, deadline)) == HIXL_OK)
      st = table_parse(w, table, tlen, addrs, store, NULL);
  }
  if (st == HIXL_ERR_TIMEOUT) {
    char miss[160];
    if (!missing_ranks(s, base, w->size, w->rank, miss, sizeof(miss)))
      st = hixl__err(HIXL_ERR_TIMEOUT,
                     "hixl_world_create: the world did not form within %d ms, "
                     "and the torch store at %s did not say which ranks are missing (world "
                     "generation %" PRId64 ")",
                     hixl__ctx_timeout(w->ctx), store, gen);
    else if (miss[0])
      st = hixl__err(HIXL_ERR_TIMEOUT,
                     "hixl_world_create: rank(s) %s of %d did not join within "
                     "%d ms (torch store at %s, world generation %" PRId64 ")",
                     miss, w->size, hixl__ctx_timeout(w->ctx), store, gen);
    else if (w->rank != 0)
      st = hixl__err(HIXL_ERR_TIMEOUT,
                     "hixl_world_create: every rank joined, but rank 0 did not "
                     "publish the world within %d ms (torch store at %s, world generation %" PRId64
                     ")",
                     hixl__ctx_timeout(w->ctx), store, gen);
  }
out:
  if (back && st == HIXL_OK) {
    pthread_mutex_lock(&store_gen_lock);
    store_worlds = local;
    store_offset = gen - local;
    pthread_mutex_unlock(&store_gen_lock);
  }
  if (st != HIXL_OK && strncmp(hixl_last_error(), "hixl_world_create", 17) != 0)
    st = hixl__err(st, "hixl_world_create: %s", hixl_last_error());
  free(table);
  free(kp);
  free(keys);
  hixl__store_close(s);
  return st;
}

hixl_status_t hixl_world_create(hixl_ctx_t *ctx, int rank, int size, const char *rendezvous,
                                hixl_world_t **world_p)
{
  if (ctx == NULL || world_p == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_world_create: NULL %s", ctx ? "world_p" : "ctx");
  long v;
  if (rank < 0) {
    if (hixl__parse_int(getenv("RANK"), 0, 1 << 20, &v) != 0)
      return hixl__err(HIXL_ERR_INVALID, "hixl_world_create: rank < 0 and RANK is not set");
    rank = (int)v;
  }
  if (size < 0) {
    if (hixl__parse_int(getenv("WORLD_SIZE"), 1, 1 << 20, &v) != 0)
      return hixl__err(HIXL_ERR_INVALID, "hixl_world_create: size < 0 and WORLD_SIZE is not set");
    size = (int)v;
  }
  if (size < 1 || rank >= size)
    return hixl__err(HIXL_ERR_INVALID, "hixl_world_create: rank %d not in [0, %d)", rank, size);
  /* Rank 0 listening, or torchrun's store (HIXL_RENDEZVOUS, default auto:
   * the store when torchrun's agent holds MASTER_PORT with it). */
  const char *mode = getenv("HIXL_RENDEZVOUS");
  bool use_store;
  if (mode == NULL || *mode == 0 || strcmp(mode, "auto") == 0) {
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    use_store =
        rendezvous == NULL && agent != NULL &&
        (strcmp(agent, "True") == 0 || strcmp(agent, "true") == 0 || strcmp(agent, "1") == 0);
  } else if (strcmp(mode, "store") == 0) {
    use_store = true;
  } else if (strcmp(mode, "listen") == 0) {
    use_store = false;
  } else {
    return hixl__err(HIXL_ERR_INVALID,
                     "hixl_world_create: HIXL_RENDEZVOUS=%.32s (want auto, "
                     "store or listen)",
                     mode);
  }
  char rdv[256];
  if (rendezvous == NULL) {
    const char *a = getenv("MASTER_ADDR"), *p = getenv("MASTER_PORT");
    if (a == NULL || p == NULL)
      return hixl__err(HIXL_ERR_INVALID,
                       "hixl_world_create: no rendezvous and MASTER_ADDR/MASTER_PORT not set");
    snprintf(rdv, sizeof(rdv), strchr(a, ':') ? "[%s]:%s" : "%s:%s", a, p);
  } else {
    snprintf(rdv, sizeof(rdv), "%s", rendezvous);
  }
  char host[128], port[16];
  hixl_status_t st = hixl__parse_hostport(rdv, host, sizeof(host), port, sizeof(port));
  if (st != HIXL_OK)
    return st;
  hixl_world_t *w = calloc(1, sizeof(*w));
  char(*addrs)[128] = calloc((size_t)size, 128);
  if (w == NULL || addrs == NULL || (w->peers = calloc((size_t)size, sizeof(*w->peers))) == NULL ||
      (w->bsent = calloc((size_t)size, sizeof(*w->bsent))) == NULL ||
      (w->xsent = calloc((size_t)size, sizeof(*w->xsent))) == NULL ||
      (w->skipped = calloc((size_t)size, sizeof(*w->skipped))) == NULL) {
    if (w) {
      free(w->peers);
      free(w->bsent);
      free(w->xsent);
    }
    free(w);
    free(addrs);
    return hixl__err(HIXL_ERR_NOMEM, "hixl_world_create: no memory");
  }
  w->ctx = ctx;
  w->rank = rank;
  w->size = size;
  w->lfd = w->lslot = -1;
  pthread_mutex_init(&w->addrs_lock, NULL);
  for (int i = 0; i < WORLD_JOINS; i++)
    w->jc[i].fd = w->jc[i].slot = -1;
  int64_t deadline = hixl__deadline(hixl__ctx_timeout(ctx));
  if (size > 1 && use_store) {
    w->id = (uint32_t)hixl__random64();
    st = rendezvous_store(w, host, port, addrs, deadline);
  } else if (size > 1) {
    if (rank == 0) {
      w->id = (uint32_t)hixl__random64();
      st = rendezvous_server(w, host, port, addrs, deadline);
    } else {
      st = rendezvous_client(w, host, port, addrs, deadline);
    }
  }
  hixl_peer_t *self = NULL;
  if (st == HIXL_OK && (self = hixl__self_peer(ctx)) == NULL)
    st = hixl__err(HIXL_ERR_NOMEM, "hixl_world_create: no memory for a self peer");
  if (self) {
    hixl__peer_world_own(self);
    atomic_store(&w->peers[rank], self);
  }
  /* Once per pair: rank i connects to every j < i and takes the
   * connections of those above it; a rank that comes back connects to
   * every other. */
  int upto = w->joined ? size : rank;
  for (int j = 0; j < upto && st == HIXL_OK; j++) {
    if (j == rank)
      continue;
    hixl_peer_t *p = NULL;
    st = hixl__connect_tagged(ctx, addrs[j], ms_left(deadline), tag_of(w->id, rank), &p);
    if (st != HIXL_OK && w->joined)
      st = hixl__err(st, "hixl_world_create: coming back as rank %d, rank %d (%s): %s", rank, j,
                     addrs[j], hixl_last_error());
    if (p)
      hixl__peer_world_own(p);
    atomic_store(&w->peers[j], p);
  }
  if (st == HIXL_OK && !w->joined && rank + 1 < size) {
    pthread_mutex_lock(&ctx->lock);
    for (int j = rank + 1; j < size && st == HIXL_OK;) {
      hixl_peer_t *p = tagged_up_locked(w, j, NULL);
      if (p) {
        hixl__peer_world_own(p);
        atomic_store(&w->peers[j++], p);
        continue;
      }
      if (hixl__expired(deadline)) {
        st = hixl__err(HIXL_ERR_TIMEOUT, "hixl_world_create: rank %d did not connect", j);
        break;
      }
      hixl__cond_wait_until(ctx, deadline, 20);
    }
    pthread_mutex_unlock(&ctx->lock);
  }
  if (st == HIXL_OK && w->lfd >= 0) {
    /* Rank 0: from now on the control thread answers ranks that come back. */
    int fl = fcntl(w->lfd, F_GETFL);
    w->addrs = addrs;
    addrs = NULL;
    w->join_addr = calloc((size_t)size, 128);
    if (w->join_addr == NULL || fl < 0 || fcntl(w->lfd, F_SETFL, fl | O_NONBLOCK) != 0 ||
        (w->lslot = hixl__ctl_aux_add(ctx, w->lfd, EPOLLIN, join_cb, w)) < 0) {
      hixl_warn("world %08" PRIx32 ": ranks that come back cannot be served (no room in the "
                "control thread)",
                w->id);
      close(w->lfd);
      w->lfd = -1;
    }
  }
  free(addrs);
  if (st != HIXL_OK) {
    /* The teardown's own failures (a BYE to a rank gone meanwhile) must
     * not replace why the world could not be made. */
    char why[HIXL_ERR_MAX];
    snprintf(why, sizeof(why), "%s", hixl_last_error());
    hixl_world_destroy(w);
    return hixl__err(st, "%s", why);
  }
  *world_p = w;
  return HIXL_OK;
}

/* Rank j's peer is not up: take the connection of its new process, if it
 * came back (ctx->lock held; hixl_world_wait_rank only, never during a
 * collective).  Returns the peer it replaced, for the caller to let go of
 * outside the lock (hixl__peer_world_disown): the world keeps nothing of
 * it, so a rank that comes back again and again costs nothing that stays
 * (it kept each old one, 1.7 KiB, until hixl_world_destroy).  The
 * application may hold the old one (hixl_world_peer, a notification):
 * then it is the application's, answering PEER_LOST until
 * hixl_peer_release, like any peer it was handed (which it may do from
 * here on: no longer world_owned).  Never handed, it is freed -- but not
 * within the release grace: hixl_world_peer reads peers[j] without a lock
 * and may have loaded the old one just before the store below; it marks
 * it handed and, finding peers[j] changed, returns the new one instead
 * (hold_ns keeps its store off freed memory). */
static hixl_peer_t *refresh_locked(hixl_world_t *w, int j)
{
  hixl_peer_t *cur = atomic_load(&w->peers[j]);
  if (w->in_coll || j == w->rank || cur == NULL || atomic_load(&cur->state) == HIXL_PEER_UP)
    return NULL;
  hixl_peer_t *p = tagged_up_locked(w, j, cur);
  if (p == NULL)
    return NULL;
  cur->hold_ns = hixl__now_ns() + RELEASE_GRACE_NS(w->ctx);
  if (w->join_addr) { /* rank 0: the table now gives the rank's new address */
    pthread_mutex_lock(&w->addrs_lock);
    if (w->join_addr[j][0])
      snprintf(w->addrs[j], 128, "%s", w->join_addr[j]);
    pthread_mutex_unlock(&w->addrs_lock);
  }
  hixl__peer_world_own(p);
  w->bsent[j] = w->xsent[j] = 0;
  atomic_store(&w->peers[j], p);
  atomic_store(&cur->world_owned, false);
  hixl_info("world %08" PRIx32 ": rank %d is back (%s)", w->id, j, p->name);
  return cur;
}

hixl_peer_t *hixl_world_peer(hixl_world_t *w, int rank)
{
  if (w == NULL || rank < 0 || rank >= w->size)
    return NULL;
  /* Marked handed (hixl_world_destroy and hixl_world_wait_rank's
   * replacement leave it to the application), then checked still the
   * rank's: both seq_cst, so when the check finds it, the replacement's
   * store comes later, and so does hixl__peer_world_disown's look at
   * handed (it will not free it).  Replaced meanwhile: the new one.  (The
   * old one, marked after that look, is then kept as if handed: a leak of
   * one record, only in this race.) */
  for (;;) {
    hixl_peer_t *p = atomic_load(&w->peers[rank]);
    if (p == NULL)
      return NULL;
    if (!atomic_load(&p->handed))
      atomic_store(&p->handed, true);
    if (atomic_load(&w->peers[rank]) == p)
      return p;
  }
}

hixl_status_t hixl_world_wait_rank(hixl_world_t *w, int rank, int timeout_ms, hixl_peer_t **peer_p)
{
  if (w == NULL || peer_p == NULL || rank < 0 || rank >= w->size)
    return hixl__err(HIXL_ERR_INVALID, "hixl_world_wait_rank: %s",
                     w == NULL        ? "NULL world"
                     : peer_p == NULL ? "NULL peer_p"
                                      : "rank out of range");
  hixl_ctx_t *ctx = w->ctx;
  int64_t deadline = hixl__deadline(timeout_ms);
  hixl_status_t st = HIXL_OK;
  pthread_mutex_lock(&ctx->lock);
  for (;;) {
    hixl_peer_t *old = refresh_locked(w, rank);
    if (old) { /* the world's no more: disown takes ctx->lock itself */
      pthread_mutex_unlock(&ctx->lock);
      hixl__peer_world_disown(old);
      pthread_mutex_lock(&ctx->lock);
      continue;
    }
    hixl_peer_t *p = atomic_load(&w->peers[rank]);
    if (atomic_load(&p->state) == HIXL_PEER_UP) {
      hixl__peer_handed(p);
      *peer_p = p;
      break;
    }
    if (hixl__expired(deadline)) {
      st = hixl__err(HIXL_ERR_TIMEOUT,
                     "hixl_world_wait_rank: rank %d (%s) is lost and has not come back within "
                     "%d ms",
                     rank, p->name, timeout_ms);
      break;
    }
    hixl__cond_wait_until(ctx, deadline, 20);
  }
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

int hixl_world_rank(const hixl_world_t *w) { return w ? w->rank : -1; }
int hixl_world_size(const hixl_world_t *w) { return w ? w->size : -1; }

/* Send (type, the pair's next count, blob) to every other rank that is up,
 * whatever fails on the way: each pair's counts must stay in step for the
 * ranks that go on. */
static void broadcast(hixl_world_t *w, uint16_t type, const void *blob, uint32_t blob_len)
{
  hixl_ctx_t *ctx = w->ctx;
  for (int j = 0; j < w->size; j++) {
    if (j == w->rank)
      continue;
    hixl_msg_t m = {.type = type};
    pthread_mutex_lock(&ctx->lock);
    hixl_peer_t *p = atomic_load(&w->peers[j]);
    bool up = atomic_load(&p->state) == HIXL_PEER_UP;
    w->skipped[j] = !up;
    if (up)
      m.world.epoch = type == HIXL_MSG_WORLD_XCHG ? ++w->xsent[j] : ++w->bsent[j];
    pthread_mutex_unlock(&ctx->lock);
    if (!up)
      continue;
    m.world.world = w->id;
    if (blob_len)
      memcpy(m.blob, blob, blob_len);
    m.blob_len = blob_len;
    (void)hixl__send(p, &m, NULL, 0); /* a failure makes p lost: wait_all says so */
  }
}

/* Wait until every other rank's count reached ours, or it is lost; then
 * PEER_LOST naming the lost ones, or OK.  Every rank that is up is waited
 * for, so a barrier that reports a loss still held the ranks that go on. */
static hixl_status_t wait_all(hixl_world_t *w, bool xchg, const char *what)
{
  hixl_ctx_t *ctx = w->ctx;
  char lost[160] = "";
  size_t ln = 0;
  int n_lost = 0;
  pthread_mutex_lock(&ctx->lock);
  for (int j = 0; j < w->size;) {
    hixl_peer_t *p = atomic_load(&w->peers[j]);
    if (j != w->rank && w->skipped[j]) /* lost before it began */
      goto lost;
    if (j == w->rank || (xchg ? p->xchg_epoch >= w->xsent[j] : p->barrier_epoch >= w->bsent[j])) {
      j++;
      continue;
    }
    if (atomic_load(&p->state) != HIXL_PEER_UP)
      goto lost;
    hixl__cond_wait_until(ctx, INT64_MAX, 20); /* no deadline: a lost rank ends it */
    continue;
  lost:
    if (ln < sizeof(lost))
      ln += (size_t)snprintf(lost + ln, sizeof(lost) - ln, "%s%d", n_lost ? ", " : "", j);
    n_lost++;
    j++;
  }
  pthread_mutex_unlock(&ctx->lock);
  if (n_lost == 0)
    return HIXL_OK;
  return hixl__err(HIXL_ERR_PEER_LOST,
                   "hixl_world_%s: rank%s %s %s lost (the other ranks went through it; "
                   "hixl_world_wait_rank waits for a rank to come back)",
                   what, n_lost > 1 ? "s" : "", lost, n_lost > 1 ? "are" : "is");
}

/* A collective pairs with the same peers from its start to its end: a rank
 * that came back is taken only by hixl_world_wait_rank, between
 * collectives (in_coll holds it off meanwhile).  Taken on its own, at the
 * start of whichever collective each rank happened to be in, it made the
 * ranks disagree: one rank's exchange included the newcomer and went
 * through, another's did not and reported the loss, and their next
 * collectives no longer matched. */
static void coll_begin(hixl_world_t *w)
{
  pthread_mutex_lock(&w->ctx->lock);
  w->in_coll++;
  pthread_mutex_unlock(&w->ctx->lock);
}

static hixl_status_t coll_end(hixl_world_t *w, hixl_status_t st)
{
  pthread_mutex_lock(&w->ctx->lock);
  w->in_coll--;
  pthread_mutex_unlock(&w->ctx->lock);
  return st;
}

static hixl_status_t barrier_in(hixl_world_t *w)
{
  broadcast(w, HIXL_MSG_WORLD_BARRIER, NULL, 0);
  return wait_all(w, false, "barrier");
}

hixl_status_t hixl_world_barrier(hixl_world_t *w)
{
  if (w == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_world_barrier: NULL world");
  coll_begin(w);
  return coll_end(w, barrier_in(w));
}

hixl_status_t hixl_world_exchange(hixl_world_t *w, hixl_mr_t *mr, hixl_rmr_t **rmrs)
{
  if (w == NULL || mr == NULL || rmrs == NULL)
    return hixl__err(HIXL_ERR_INVALID, "hixl_world_exchange: NULL %s",
                     w == NULL    ? "world"
                     : mr == NULL ? "mr"
                                  : "rmrs");
  uint8_t blob[HIXL_RKEY_MAX];
  size_t len = sizeof(blob);
  hixl_status_t st = hixl_mr_pack(mr, blob, &len);
  if (st != HIXL_OK)
    return st;
  coll_begin(w);
  broadcast(w, HIXL_MSG_WORLD_XCHG, blob, (uint32_t)len);
  if ((st = wait_all(w, true, "exchange")) != HIXL_OK) {
    char why[HIXL_ERR_MAX];
    snprintf(why, sizeof(why), "%s", hixl_last_error());
    barrier_in(w); /* in step with the ranks that got through */
    return coll_end(w, hixl__err(st, "%s", why));
  }
  int j;
  for (j = 0; j < w->size && st == HIXL_OK; j++) {
    uint8_t theirs[HIXL_RKEY_MAX];
    uint32_t tlen = (uint32_t)len;
    hixl_peer_t *p = atomic_load(&w->peers[j]);
    if (j == w->rank) {
      memcpy(theirs, blob, len);
    } else {
      pthread_mutex_lock(&w->ctx->lock);
      tlen = p->xchg_len;
      memcpy(theirs, p->xchg_blob, tlen);
      pthread_mutex_unlock(&w->ctx->lock);
    }
    st = hixl_rmr_unpack(p, theirs, tlen, &rmrs[j]);
  }
  if (st != HIXL_OK) {
    char why[HIXL_ERR_MAX];
    snprintf(why, sizeof(why), "%s", hixl_last_error());
    for (int k = 0; k < j - 1; k++)
      hixl_rmr_release(rmrs[k]);
    barrier_in(w); /* in step with the ranks that got through */
    return coll_end(w, hixl__err(st, "%s", why));
  }
  /* Nobody may send the next exchange before everyone read this one. */
  return coll_end(w, barrier_in(w));
}

void hixl_world_destroy(hixl_world_t *w)
{
  if (w == NULL)
    return;
  if (w->addrs) { /* rank 0 served joins: the control thread lets go first */
    pthread_mutex_lock(&w->ctx->aux_lock);
    hixl__ctl_aux_del_locked(w->ctx, w->lslot);
    for (int i = 0; i < WORLD_JOINS; i++)
      join_close(w, &w->jc[i]);
    pthread_mutex_unlock(&w->ctx->aux_lock);
  }
  if (w->lfd >= 0)
    close(w->lfd);
  for (int j = 0; j < w->size; j++) {
    hixl_peer_t *p = atomic_load(&w->peers[j]);
    if (p)
      hixl__peer_world_disown(p);
  }
  free(w->addrs);
  free(w->join_addr);
  pthread_mutex_destroy(&w->addrs_lock);
  free(w->bsent);
  free(w->xsent);
  free(w->skipped);
  free((void *)w->peers);
  free(w);
}

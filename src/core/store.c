/* SPDX-License-Identifier: MIT */
/*
 * The client of torch's TCPStore (store.h).  The protocol, as torch's
 * TCPStore.cpp speaks it (1.13; later changes noted in store.h and
 * docs/configuration.md): a query is one type byte and its arguments; a
 * string or byte vector is a 64-bit length and the bytes; a count of keys
 * is 64-bit; integers are 64-bit; all in the host's byte order, which is
 * little-endian on every machine torch runs its store on, and written
 * here explicitly as little-endian.
 *
 *   SET   key value         no answer
 *   GET   key               value (length + bytes); the key must exist
 *                           (torch's server drops the connection otherwise,
 *                           so a get always waits first, as torch's does)
 *   ADD   key int64         the new int64 (the value is kept as its
 *                           decimal text)
 *   CHECK n key...          one byte: 0 all exist, 1 not
 *   WAIT  n key...          one byte 0 once all exist (no answer before)
 *   GETNUMKEYS              int64
 *
 * The server is one thread that reads each query to its end before it
 * serves anyone else, so a query always leaves here whole, in one send.
 */
#define _GNU_SOURCE
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core.h"

#define VALIDATE_MAGIC 0x3C85F7CEu
/* How long a legacy server may take to answer the first probe before the
 * other dialect is tried beside it (it answers in microseconds). */
#define PROBE_MS 1000
/* Keys per WAIT / CHECK query (torch's libuv server refuses more than
 * 128 Ki in one). */
#define KEYS_PER_QUERY 4096

enum { OP_SET, OP_GET, OP_ADD, OP_CHECK, OP_WAIT, OP_NUMKEYS, OP_COUNT };
static const uint8_t op_code[3][OP_COUNT] = {
    [HIXL_STORE_LEGACY] = {0, 2, 3, 4, 5, 6},
    [HIXL_STORE_VALIDATE] = {1, 3, 4, 5, 6, 7},
};
static const uint8_t validate_hello[5] = {0x00, 0xCE, 0xF7, 0x85, 0x3C}; /* VALIDATE, magic LE */

struct hixl_store {
  int fd; /* -1: none (after an error); the next call connects again */
  int dialect;
  char host[256];
  char port[16];
  char name[288];
};

int hixl__store_dialect_parse(const char *s)
{
  if (s == NULL || *s == 0 || strcmp(s, "auto") == 0)
    return HIXL_STORE_AUTO;
  if (strcmp(s, "legacy") == 0)
    return HIXL_STORE_LEGACY;
  if (strcmp(s, "validate") == 0)
    return HIXL_STORE_VALIDATE;
  return -1;
}

const char *hixl__store_dialect_name(int dialect)
{
  return dialect == HIXL_STORE_LEGACY     ? "legacy"
         : dialect == HIXL_STORE_VALIDATE ? "validate"
                                          : "auto";
}

const char *hixl__store_name(const hixl_store_t *s) { return s ? s->name : "?"; }
int hixl__store_dialect(const hixl_store_t *s) { return s ? s->dialect : -1; }

static int ms_left(int64_t deadline)
{
  if (deadline == INT64_MAX)
    return -1;
  int64_t ms = (deadline - hixl__now_ns() + 999999) / 1000000;
  return ms <= 0 ? 0 : ms > INT32_MAX ? INT32_MAX : (int)ms;
}

static void drop(hixl_store_t *s)
{
  if (s->fd >= 0)
    close(s->fd);
  s->fd = -1;
}

/* Fail: the connection is out of step now, drop it; the message names the store. */
static hixl_status_t __attribute__((format(printf, 3, 4)))
fail(hixl_store_t *s, hixl_status_t st, const char *fmt, ...)
{
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  drop(s);
  return hixl__err(st, "torch store at %s: %s", s->name, msg);
}

/* ------------------------------------------------------------ bytes */

typedef struct {
  uint8_t *p;
  size_t len, cap;
  bool oom;
} buf_t;

static void put(buf_t *b, const void *d, size_t n)
{
  if (b->oom)
    return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n)
      cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (p == NULL) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, d, n);
  b->len += n;
}

static void put_u8(buf_t *b, uint8_t v) { put(b, &v, 1); }

static void put_u64(buf_t *b, uint64_t v)
{
  uint8_t le[8];
  for (int i = 0; i < 8; i++)
    le[i] = (uint8_t)(v >> (8 * i));
  put(b, le, 8);
}

static uint64_t get_u64(const uint8_t *le)
{
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | le[i];
  return v;
}

/* A key as torch's client sends it: "/" + key. */
static void put_key(buf_t *b, const char *key)
{
  size_t n = strlen(key);
  put_u64(b, n + 1);
  put_u8(b, '/');
  put(b, key, n);
}

static hixl_status_t key_ok(hixl_store_t *s, const char *key)
{
  size_t n = key ? strnlen(key, HIXL_STORE_KEY_MAX + 1) : 0;
  if (n == 0 || n > HIXL_STORE_KEY_MAX)
    return hixl__err(HIXL_ERR_INVALID, "torch store at %s: %s key", s->name,
                     n ? "over-long" : "empty or NULL");
  return HIXL_OK;
}

/* ------------------------------------------------------------ the socket */

static hixl_status_t send_all(hixl_store_t *s, const void *d, size_t n, int64_t deadline,
                              const char *what)
{
  const uint8_t *p = d;
  while (n) {
    struct pollfd pfd = {s->fd, POLLOUT, 0};
    int pr = poll(&pfd, 1, ms_left(deadline));
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr == 0)
      return fail(s, HIXL_ERR_TIMEOUT, "could not send %s within the timeout", what);
    ssize_t k = send(s->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
      continue;
    if (k <= 0)
      return fail(s, HIXL_ERR_PEER_LOST, "sending %s: %s", what,
                  k < 0 ? strerror(errno) : "nothing sent");
    p += k;
    n -= (size_t)k;
  }
  return HIXL_OK;
}

static hixl_status_t recv_all(hixl_store_t *s, void *d, size_t n, int64_t deadline,
                              const char *what)
{
  uint8_t *p = d;
  size_t got = 0;
  while (got < n) {
    struct pollfd pfd = {s->fd, POLLIN, 0};
    int pr = poll(&pfd, 1, ms_left(deadline));
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr == 0)
      return fail(s, HIXL_ERR_TIMEOUT, "no answer to %s within the timeout", what);
    ssize_t k = recv(s->fd, p + got, n - got, MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
      continue;
    if (k == 0)
      return fail(s, HIXL_ERR_PEER_LOST, "closed the connection %s the answer to %s",
                  got ? "in the middle of" : "instead of", what);
    if (k < 0)
      return fail(s, HIXL_ERR_PEER_LOST, "reading the answer to %s: %s", what, strerror(errno));
    got += (size_t)k;
  }
  return HIXL_OK;
}

/* A TCPStore only ever speaks when asked: bytes waiting before a query
 * are garbage.  An idle connection the server closed is simply dropped. */
static hixl_status_t check_quiet(hixl_store_t *s)
{
  if (s->fd < 0)
    return HIXL_OK;
  struct pollfd pfd = {s->fd, POLLIN, 0};
  if (poll(&pfd, 1, 0) <= 0)
    return HIXL_OK;
  uint8_t b[64];
  ssize_t k = recv(s->fd, b, sizeof(b), MSG_PEEK | MSG_DONTWAIT);
  if (k > 0)
    return fail(s, HIXL_ERR_TRANSPORT,
                "sent %zd%s byte(s) nobody asked for (first 0x%02x): not a TCPStore, or out of "
                "step",
                k, k == (ssize_t)sizeof(b) ? "+" : "", b[0]);
  if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
    drop(s); /* closed while idle: connect again */
  return HIXL_OK;
}

/* A connected, non-blocking TCP socket to the store, retrying until the
 * deadline (the store may not be listening yet). */
static int dial(hixl_store_t *s, int64_t deadline, hixl_status_t *st)
{
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
  int last = ECONNREFUSED;
  for (;;) {
    struct addrinfo *res;
    int g = getaddrinfo(s->host, s->port, &hints, &res);
    if (g != 0) {
      *st = hixl__err(HIXL_ERR_INVALID, "torch store at %s: cannot resolve \"%s\": %s", s->name,
                      s->host, gai_strerror(g));
      return -1;
    }
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        last = errno;
        continue;
      }
      int err = 0;
      if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
          struct pollfd pfd = {fd, POLLOUT, 0};
          int pr;
          do
            pr = poll(&pfd, 1, ms_left(deadline));
          while (pr < 0 && errno == EINTR);
          socklen_t el = sizeof(err);
          if (pr != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
            err = ETIMEDOUT;
        }
      }
      if (err == 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        freeaddrinfo(res);
        return fd;
      }
      last = err;
      close(fd);
    }
    freeaddrinfo(res);
    int left = ms_left(deadline);
    if (left == 0) {
      *st = hixl__err(HIXL_ERR_TIMEOUT, "torch store at %s: not reachable within the timeout (%s)",
                      s->name, strerror(last));
      return -1;
    }
    usleep((useconds_t)(left < 0 || left > 50 ? 50 : left) * 1000);
  }
}

/* Connect again in the settled dialect.  A VALIDATE server wants its hello
 * first; a GETNUMKEYS rides with it and must be answered before anything
 * else is sent.  (Were the server a legacy one after all, it would read the
 * hello as a SET whose 8-byte key length ends in our next query's bytes, a
 * length of terabytes: nothing more goes out until the hello is answered,
 * and a legacy server never answers it.) */
static hixl_status_t ensure(hixl_store_t *s, int64_t deadline)
{
  hixl_status_t st = check_quiet(s);
  if (st != HIXL_OK || s->fd >= 0)
    return st;
  if ((s->fd = dial(s, deadline, &st)) < 0)
    return st;
  if (s->dialect == HIXL_STORE_VALIDATE) {
    uint8_t hello[6], le[8];
    memcpy(hello, validate_hello, 5);
    hello[5] = op_code[HIXL_STORE_VALIDATE][OP_NUMKEYS];
    if ((st = send_all(s, hello, sizeof(hello), deadline, "the VALIDATE hello")) != HIXL_OK ||
        (st = recv_all(s, le, 8, deadline, "the VALIDATE hello")) != HIXL_OK)
      return st;
    if (get_u64(le) > (1ull << 40))
      return fail(s, HIXL_ERR_TRANSPORT,
                  "answered the VALIDATE hello with 0x%016" PRIx64 ", not a key count",
                  get_u64(le));
  }
  return HIXL_OK;
}

/* ------------------------------------------------------------ the dialect */

/* Reads 8 bytes on one of several probe connections. */
typedef struct {
  int fd;
  uint8_t b[8];
  size_t got;
  bool closed;
} probe_t;

/* Index of the probe that got its 8 bytes, -1 if all were closed, -2 at
 * the deadline. */
static int probe_race(probe_t *p, int n, int64_t deadline)
{
  for (;;) {
    struct pollfd pfd[2];
    int live = 0;
    for (int i = 0; i < n; i++) {
      pfd[i] = (struct pollfd){p[i].closed ? -1 : p[i].fd, POLLIN, 0};
      live += !p[i].closed;
    }
    if (live == 0)
      return -1;
    int pr = poll(pfd, (nfds_t)n, ms_left(deadline));
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0)
      return -2;
    for (int i = 0; i < n; i++) {
      if (p[i].closed || pfd[i].revents == 0)
        continue;
      ssize_t k = recv(p[i].fd, p[i].b + p[i].got, 8 - p[i].got, MSG_DONTWAIT);
      if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
        continue;
      if (k <= 0) {
        p[i].closed = true;
        continue;
      }
      if ((p[i].got += (size_t)k) == 8)
        return i;
    }
  }
}

/*
 * Which dialect does the server speak?  Probe A is a legacy GETNUMKEYS:
 * one byte, a whole query to a legacy server (which answers at once); a
 * VALIDATE-era server drops a client whose first query is not VALIDATE
 * (the classic server closes, the libuv one ignores it).  Probe B, sent
 * only when A met silence, is the VALIDATE hello and a GETNUMKEYS in that
 * dialect.  To a legacy server B is the start of a SET whose key length is
 * never finished, so it cannot write anything there; closing B ends it.
 * The first probe answered wins.
 */
static hixl_status_t settle(hixl_store_t *s, int64_t deadline)
{
  hixl_status_t st;
  probe_t p[2] = {{.fd = -1}, {.fd = -1}};
  int n = 0, won = -2;
  if ((p[0].fd = dial(s, deadline, &st)) < 0)
    return st;
  n = 1;
  s->fd = p[0].fd;
  uint8_t q = op_code[HIXL_STORE_LEGACY][OP_NUMKEYS];
  if ((st = send_all(s, &q, 1, deadline, "the protocol probe")) != HIXL_OK)
    return st;
  int64_t soon = hixl__now_ns() + (int64_t)PROBE_MS * 1000000;
  won = probe_race(p, 1, soon < deadline ? soon : deadline);
  if ((won == -2 && !hixl__expired(deadline)) || won == -1) {
    /* Silence or a closed door: try the VALIDATE dialect beside it. */
    if ((p[1].fd = dial(s, deadline, &st)) < 0) {
      close(p[0].fd);
      s->fd = -1;
      return st;
    }
    n = 2;
    s->fd = p[1].fd;
    uint8_t hello[6];
    memcpy(hello, validate_hello, 5);
    hello[5] = op_code[HIXL_STORE_VALIDATE][OP_NUMKEYS];
    if ((st = send_all(s, hello, sizeof(hello), deadline, "the protocol probe")) != HIXL_OK) {
      close(p[0].fd);
      return st;
    }
    won = probe_race(p, 2, deadline);
  }
  for (int i = 0; i < n; i++)
    if (i != won)
      close(p[i].fd);
  s->fd = -1;
  if (won < 0) {
    bool any = p[0].got || (n > 1 && p[1].got);
    return hixl__err(won == -2 ? HIXL_ERR_TIMEOUT : HIXL_ERR_PEER_LOST,
                     "torch store at %s: %s (is a torch.distributed TCPStore serving there?)",
                     s->name,
                     won == -2 ? "no answer to a protocol probe in either dialect within the "
                                 "timeout"
                     : any     ? "closed the connection in the middle of its answer to a probe"
                               : "closed the connection on a protocol probe in either dialect");
  }
  s->fd = p[won].fd;
  s->dialect = won == 0 ? HIXL_STORE_LEGACY : HIXL_STORE_VALIDATE;
  uint64_t keys = get_u64(p[won].b);
  if (keys > (1ull << 40))
    return fail(s, HIXL_ERR_TRANSPORT,
                "answered the protocol probe with 0x%016" PRIx64 ", not a key count: not a "
                "TCPStore",
                keys);
  hixl_debug("torch store at %s speaks the %s dialect (%" PRIu64 " keys)", s->name,
             hixl__store_dialect_name(s->dialect), keys);
  return check_quiet(s);
}

hixl_status_t hixl__store_connect(const char *host, const char *port, int dialect, int64_t deadline,
                                  hixl_store_t **store_p)
{
  if (host == NULL || port == NULL || store_p == NULL || dialect < HIXL_STORE_AUTO ||
      dialect > HIXL_STORE_VALIDATE)
    return hixl__err(HIXL_ERR_INVALID, "torch store: bad arguments");
  if (strlen(host) >= sizeof(((hixl_store_t *)0)->host) ||
      strlen(port) >= sizeof(((hixl_store_t *)0)->port))
    return hixl__err(HIXL_ERR_INVALID, "torch store: address too long");
  hixl_store_t *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return hixl__err(HIXL_ERR_NOMEM, "torch store: no memory");
  s->fd = -1;
  strcpy(s->host, host);
  strcpy(s->port, port);
  snprintf(s->name, sizeof(s->name), strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
  hixl_status_t st;
  if (dialect == HIXL_STORE_AUTO) {
    st = settle(s, deadline);
  } else {
    s->dialect = dialect;
    st = ensure(s, deadline);
  }
  if (st != HIXL_OK) {
    hixl__store_close(s);
    return st;
  }
  *store_p = s;
  return HIXL_OK;
}

void hixl__store_close(hixl_store_t *s)
{
  if (s == NULL)
    return;
  drop(s);
  free(s);
}

/* ------------------------------------------------------------ queries */

/* Send one whole query (b), freeing it. */
static hixl_status_t send_query(hixl_store_t *s, buf_t *b, int64_t deadline, const char *what)
{
  hixl_status_t st;
  if (b->oom)
    st = hixl__err(HIXL_ERR_NOMEM, "torch store at %s: no memory for %s", s->name, what);
  else
    st = send_all(s, b->p, b->len, deadline, what);
  free(b->p);
  return st;
}

hixl_status_t hixl__store_set(hixl_store_t *s, const char *key, const void *val, size_t len,
                              int64_t deadline)
{
  hixl_status_t st;
  if ((st = key_ok(s, key)) != HIXL_OK || (st = ensure(s, deadline)) != HIXL_OK)
    return st;
  buf_t b = {0};
  put_u8(&b, op_code[s->dialect][OP_SET]);
  put_key(&b, key);
  put_u64(&b, len);
  put(&b, val, len);
  char what[80];
  snprintf(what, sizeof(what), "set of \"%.40s\"", key);
  return send_query(s, &b, deadline, what);
}

hixl_status_t hixl__store_add(hixl_store_t *s, const char *key, int64_t delta, int64_t *value_p,
                              int64_t deadline)
{
  hixl_status_t st;
  if ((st = key_ok(s, key)) != HIXL_OK || (st = ensure(s, deadline)) != HIXL_OK)
    return st;
  buf_t b = {0};
  put_u8(&b, op_code[s->dialect][OP_ADD]);
  put_key(&b, key);
  put_u64(&b, (uint64_t)delta);
  char what[80];
  snprintf(what, sizeof(what), "add to \"%.40s\"", key);
  uint8_t le[8];
  if ((st = send_query(s, &b, deadline, what)) != HIXL_OK ||
      (st = recv_all(s, le, 8, deadline, what)) != HIXL_OK)
    return st;
  if (value_p)
    *value_p = (int64_t)get_u64(le);
  return HIXL_OK;
}

/* WAIT or CHECK on keys[0..n): the one-byte answer. */
static hixl_status_t keys_query(hixl_store_t *s, int op, const char *const *keys, size_t n,
                                uint8_t *answer, int64_t deadline)
{
  hixl_status_t st;
  for (size_t i = 0; i < n; i++)
    if ((st = key_ok(s, keys[i])) != HIXL_OK)
      return st;
  if ((st = ensure(s, deadline)) != HIXL_OK)
    return st;
  buf_t b = {0};
  put_u8(&b, op_code[s->dialect][op]);
  put_u64(&b, n);
  for (size_t i = 0; i < n; i++)
    put_key(&b, keys[i]);
  char what[120];
  snprintf(what, sizeof(what), "%s for %zu key(s) (\"%.40s\"%s)", op == OP_WAIT ? "wait" : "check",
           n, keys[0], n > 1 ? ", ..." : "");
  if ((st = send_query(s, &b, deadline, what)) != HIXL_OK ||
      (st = recv_all(s, answer, 1, deadline, what)) != HIXL_OK)
    return st;
  if (*answer > (op == OP_WAIT ? 0 : 1))
    return fail(s, HIXL_ERR_TRANSPORT, "answered %s with 0x%02x (want %s)", what, *answer,
                op == OP_WAIT ? "0, stop waiting" : "0 ready or 1 not ready");
  return HIXL_OK;
}

hixl_status_t hixl__store_wait(hixl_store_t *s, const char *const *keys, size_t n, int64_t deadline)
{
  for (size_t i = 0; i < n; i += KEYS_PER_QUERY) {
    uint8_t a;
    hixl_status_t st = keys_query(s, OP_WAIT, keys + i,
                                  n - i < KEYS_PER_QUERY ? n - i : KEYS_PER_QUERY, &a, deadline);
    if (st != HIXL_OK)
      return st;
  }
  return HIXL_OK;
}

hixl_status_t hixl__store_check(hixl_store_t *s, const char *const *keys, size_t n, bool *ready_p,
                                int64_t deadline)
{
  bool ready = true;
  for (size_t i = 0; i < n && ready; i += KEYS_PER_QUERY) {
    uint8_t a;
    hixl_status_t st = keys_query(s, OP_CHECK, keys + i,
                                  n - i < KEYS_PER_QUERY ? n - i : KEYS_PER_QUERY, &a, deadline);
    if (st != HIXL_OK)
      return st;
    ready = a == 0;
  }
  *ready_p = ready;
  return HIXL_OK;
}

hixl_status_t hixl__store_get(hixl_store_t *s, const char *key, void *buf, size_t cap,
                              size_t *len_p, int64_t deadline)
{
  hixl_status_t st = hixl__store_wait(s, &key, 1, deadline);
  if (st != HIXL_OK)
    return st;
  buf_t b = {0};
  put_u8(&b, op_code[s->dialect][OP_GET]);
  put_key(&b, key);
  char what[80];
  snprintf(what, sizeof(what), "get of \"%.40s\"", key);
  uint8_t le[8];
  if ((st = send_query(s, &b, deadline, what)) != HIXL_OK ||
      (st = recv_all(s, le, 8, deadline, what)) != HIXL_OK)
    return st;
  uint64_t len = get_u64(le);
  if (len > cap)
    return fail(s, HIXL_ERR_TRANSPORT,
                "the value of \"%.40s\" is %" PRIu64 " bytes, more than the %zu expected", key, len,
                cap);
  if (len && (st = recv_all(s, buf, (size_t)len, deadline, what)) != HIXL_OK)
    return st;
  *len_p = (size_t)len;
  return HIXL_OK;
}

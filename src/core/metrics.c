/* SPDX-License-Identifier: MIT */
/*
 * HIXL_METRICS=host:port: the context's counters (hixl_ctx_stats) in
 * Prometheus' text exposition format (version 0.0.4) at GET /metrics,
 * served by the control thread (an aux slot: no thread of its own).
 * docs/observability.md.
 *
 * What a client can make it do is bounded, since anyone who reaches the
 * port is a client (there is no authentication: bind it to an address
 * only your scraper reaches):
 *  - at most METRICS_CONNS connections at once; one more closes the
 *    oldest, and connections older than METRICS_IDLE_NS are closed at the
 *    next accept (a slow client cannot hold the endpoint for long);
 *  - a request is read into a fixed buffer: longer than that without its
 *    blank line ends the connection with 431;
 *  - sockets are non-blocking: a reply the socket does not take at once is
 *    finished on EPOLLOUT, never waited for.
 * A value that does not parse, or an address that cannot be bound (say a
 * second context of the process with the same port), is logged as a
 * warning and the context goes on without the endpoint, as with the other
 * HIXL_ variables that tune rather than decide.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"
#include "core.h"

#define METRICS_CONNS 4
#define METRICS_REQ 2048
#define METRICS_IDLE_NS (10 * 1000000000ll)

typedef struct mconn {
  int fd, slot;
  int64_t born_ns;
  size_t got;
  char req[METRICS_REQ];
  char *out;
  size_t out_len, out_off;
} mconn_t;

typedef struct hixl_metrics hixl_metrics_t;
struct hixl_metrics {
  hixl_ctx_t *ctx;
  int lfd, lslot;
  char bound[128];
  mconn_t conn[METRICS_CONNS];
};

/* A growing text buffer; on allocation failure it stays failed. */
typedef struct text {
  char *p;
  size_t len, cap;
  bool failed;
} text_t;

static void tprintf(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tprintf(text_t *t, const char *fmt, ...)
{
  if (t->failed)
    return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = true;
      return;
    }
    if (t->p && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap ? t->cap * 2 : 8192;
    while (cap < t->len + (size_t)n + 1)
      cap *= 2;
    char *q = realloc(t->p, cap);
    if (q == NULL) {
      t->failed = true;
      return;
    }
    t->p = q;
    t->cap = cap;
  }
}

static bool ends_with(const char *s, const char *suf)
{
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

/* The exposition of ctx's figures: counters get "_total", times in ns
 * become seconds, the errors by status one family with a "status" label
 * (their sum, "errors", is left to PromQL). */
static void expose(hixl_ctx_t *ctx, text_t *t)
{
  hixl_stat_t st[128];
  size_t n = sizeof(st) / sizeof(st[0]);
  if (hixl_ctx_stats(ctx, NULL, st, &n) != HIXL_OK)
    return;
  if (n > sizeof(st) / sizeof(st[0]))
    n = sizeof(st) / sizeof(st[0]);
  /* The label value: our address, escaped as the format wants. */
  char label[300];
  size_t k = 0;
  for (const char *a = ctx->address; *a && k + 3 < sizeof(label); a++) {
    if (*a == '"' || *a == '\\')
      label[k++] = '\\';
    label[k++] = *a;
  }
  label[k] = 0;
  bool errors_done = false;
  for (size_t i = 0; i < n; i++) {
    const char *name = st[i].name;
    if (strcmp(name, "errors") == 0)
      continue;
    if (strncmp(name, "errors_", 7) == 0) {
      if (!errors_done) {
        tprintf(t, "# HELP hixl_errors_total operations that failed, by status\n");
        tprintf(t, "# TYPE hixl_errors_total counter\n");
        errors_done = true;
      }
      tprintf(t, "hixl_errors_total{context=\"%s\",status=\"%s\"} %llu\n", label, name + 7,
              (unsigned long long)st[i].value);
      continue;
    }
    bool counter = st[i].kind == HIXL_STAT_COUNTER;
    bool ns = ends_with(name, "_ns");
    char metric[96];
    snprintf(metric, sizeof(metric), "hixl_%.*s%s%s", (int)(strlen(name) - (ns ? 3 : 0)), name,
             ns ? "_seconds" : "", counter ? "_total" : "");
    tprintf(t, "# HELP %s %s\n# TYPE %s %s\n", metric, st[i].help, metric,
            counter ? "counter" : "gauge");
    if (ns)
      tprintf(t, "%s{context=\"%s\"} %.9f\n", metric, label, (double)st[i].value / 1e9);
    else
      tprintf(t, "%s{context=\"%s\"} %llu\n", metric, label, (unsigned long long)st[i].value);
  }
}

static void conn_close(hixl_metrics_t *m, mconn_t *c)
{
  if (c->fd < 0)
    return;
  hixl__ctl_aux_del_locked(m->ctx, c->slot);
  close(c->fd);
  free(c->out);
  *c = (mconn_t){.fd = -1, .slot = -1};
}

/* Send what is left of the reply; close when it is all out (or failed). */
static void conn_flush(hixl_metrics_t *m, mconn_t *c)
{
  while (c->out_off < c->out_len) {
    ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
    if (w > 0) {
      c->out_off += (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      hixl__ctl_aux_mod_locked(m->ctx, c->slot, EPOLLOUT | EPOLLRDHUP);
      return;
    }
    break;
  }
  conn_close(m, c);
}

static void reply(hixl_metrics_t *m, mconn_t *c, int code, const char *reason, bool head)
{
  text_t body = {0};
  if (code == 200)
    expose(m->ctx, &body);
  else
    tprintf(&body, "%d %s\n", code, reason);
  text_t t = {0};
  if (body.failed) {
    code = 500;
    reason = "Internal Server Error";
  }
  tprintf(&t,
          "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n"
          "\r\n",
          code, reason,
          code == 200 ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain; charset=utf-8",
          body.failed ? 0 : body.len);
  if (!head && !body.failed && body.len)
    tprintf(&t, "%.*s", (int)body.len, body.p);
  free(body.p);
  if (t.failed) {
    free(t.p);
    conn_close(m, c);
    return;
  }
  c->out = t.p;
  c->out_len = t.len;
  c->out_off = 0;
  conn_flush(m, c);
}

/* A whole request head is in c->req: answer it. */
static void answer(hixl_metrics_t *m, mconn_t *c)
{
  /* The request line: METHOD SP /path SP HTTP/1.x, nothing else. */
  char method[8], path[64];
  size_t ml = strspn(c->req, "ABCDEFGHIJKLMNOPQRSTUVWXYZ");
  const char *pp = c->req + ml + 1;
  size_t pl = strcspn(pp, " \r\n");
  if (ml == 0 || ml >= sizeof(method) || c->req[ml] != ' ' || *pp != '/' || pl >= sizeof(path) ||
      strncmp(pp + pl, " HTTP/1.", 8) != 0) {
    reply(m, c, 400, "Bad Request", false);
    return;
  }
  memcpy(method, c->req, ml);
  method[ml] = 0;
  memcpy(path, pp, pl);
  path[pl] = 0;
  bool head = strcmp(method, "HEAD") == 0;
  if (strcmp(method, "GET") != 0 && !head) {
    reply(m, c, 405, "Method Not Allowed", false);
    return;
  }
  /* The path, without a query string (Prometheus may add one). */
  path[strcspn(path, "?")] = 0;
  if (strcmp(path, "/metrics") != 0) {
    reply(m, c, 404, "Not Found", head);
    return;
  }
  reply(m, c, 200, "OK", head);
}

static void conn_cb(void *arg, int fd, uint32_t events)
{
  hixl_metrics_t *m = arg;
  mconn_t *c = NULL;
  for (int i = 0; i < METRICS_CONNS; i++)
    if (m->conn[i].fd == fd)
      c = &m->conn[i];
  if (c == NULL)
    return;
  if (c->out) { /* writing the reply */
    if (events & (EPOLLERR | EPOLLHUP))
      conn_close(m, c);
    else
      conn_flush(m, c);
    return;
  }
  for (;;) {
    ssize_t r = recv(fd, c->req + c->got, sizeof(c->req) - 1 - c->got, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (r <= 0) {
      conn_close(m, c);
      return;
    }
    c->got += (size_t)r;
    c->req[c->got] = 0;
    if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) {
      answer(m, c);
      return;
    }
    if (c->got == sizeof(c->req) - 1) {
      reply(m, c, 431, "Request Header Fields Too Large", false);
      return;
    }
  }
}

static void listen_cb(void *arg, int fd, uint32_t events)
{
  (void)events;
  hixl_metrics_t *m = arg;
  int64_t now = hixl__now_ns();
  for (int i = 0; i < METRICS_CONNS; i++)
    if (m->conn[i].fd >= 0 && now - m->conn[i].born_ns > METRICS_IDLE_NS)
      conn_close(m, &m->conn[i]);
  for (int n = 0; n < 16; n++) {
    int cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (cfd < 0)
      return; /* EAGAIN, or EMFILE: the listener stays readable, tried at the next event */
    mconn_t *c = NULL, *oldest = NULL;
    for (int i = 0; i < METRICS_CONNS; i++) {
      if (m->conn[i].fd < 0 && c == NULL)
        c = &m->conn[i];
      if (m->conn[i].fd >= 0 && (oldest == NULL || m->conn[i].born_ns < oldest->born_ns))
        oldest = &m->conn[i];
    }
    if (c == NULL) {
      conn_close(m, oldest);
      c = oldest;
    }
    *c = (mconn_t){.fd = cfd, .born_ns = now};
    c->slot = hixl__ctl_aux_add_locked(m->ctx, cfd, EPOLLIN | EPOLLRDHUP, conn_cb, m);
    if (c->slot < 0) {
      close(cfd);
      c->fd = -1;
      return;
    }
  }
}

static hixl_status_t metrics_start(hixl_ctx_t *ctx, const char *spec)
{
  char host[128], port[16];
  hixl_status_t st = hixl__parse_hostport(spec, host, sizeof(host), port, sizeof(port));
  if (st != HIXL_OK)
    return hixl__err(HIXL_ERR_INVALID, "HIXL_METRICS: %s", hixl_last_error());
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *res;
  int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
  if (rc != 0)
    return hixl__err(HIXL_ERR_INVALID, "HIXL_METRICS=\"%.64s\": %s", spec, gai_strerror(rc));
  int fd = -1, err = 0;
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    if (host[0] == 0 && ai->ai_family != AF_INET)
      continue;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
                    bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0)) {
      err = errno;
      close(fd);
      fd = -1;
    } else if (fd < 0) {
      err = errno;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    char why[320];
    return hixl__err(HIXL_ERR_TRANSPORT, "HIXL_METRICS: cannot listen on \"%.64s\": %s", spec,
                     hixl__strerror_fd(err ? err : EADDRNOTAVAIL, why, sizeof(why)));
  }
  hixl_metrics_t *m = calloc(1, sizeof(*m));
  if (m == NULL) {
    close(fd);
    return hixl__err(HIXL_ERR_NOMEM, "HIXL_METRICS: no memory");
  }
  m->ctx = ctx;
  m->lfd = fd;
  for (int i = 0; i < METRICS_CONNS; i++)
    m->conn[i] = (mconn_t){.fd = -1, .slot = -1};
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  char num[64] = "?", serv[16] = "?";
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
    getnameinfo((struct sockaddr *)&ss, sl, num, sizeof(num), serv, sizeof(serv),
                NI_NUMERICHOST | NI_NUMERICSERV);
  snprintf(m->bound, sizeof(m->bound), "%s%s%s:%s", ss.ss_family == AF_INET6 ? "[" : "", num,
           ss.ss_family == AF_INET6 ? "]" : "", serv);
  ctx->metrics = m;
  if ((m->lslot = hixl__ctl_aux_add(ctx, fd, EPOLLIN, listen_cb, m)) < 0) {
    ctx->metrics = NULL;
    close(fd);
    free(m);
    return hixl__err(HIXL_ERR_NOMEM, "HIXL_METRICS: no room in the control thread's set");
  }
  hixl_info("metrics of context %s at http://%s/metrics", ctx->address, m->bound);
  return HIXL_OK;
}

void hixl__metrics_start(hixl_ctx_t *ctx)
{
  const char *spec = ctx->cfg.metrics; /* hixl_config_init: HIXL_METRICS */
  if (spec != NULL && spec[0] != 0 && metrics_start(ctx, spec) != HIXL_OK)
    hixl_warn("no metrics endpoint for context %s: %s", ctx->address, hixl_last_error());
}

void hixl__metrics_stop(hixl_ctx_t *ctx)
{
  hixl_metrics_t *m = ctx->metrics;
  if (m == NULL)
    return;
  pthread_mutex_lock(&ctx->aux_lock);
  for (int i = 0; i < METRICS_CONNS; i++)
    conn_close(m, &m->conn[i]);
  hixl__ctl_aux_del_locked(ctx, m->lslot);
  pthread_mutex_unlock(&ctx->aux_lock);
  close(m->lfd);
  free(m);
  ctx->metrics = NULL;
}

/* SPDX-License-Identifier: MIT */
/*
 * control_noread: a peer that sends requests and never reads the replies
 * (issue 13, finding 8).  Before, the target's control thread sent replies
 * with blocking writes bounded only by timeout_ms: once the attacker's
 * socket was full the thread sat in sendmsg, no new peer could connect for
 * 25-38 s and a connected peer was declared lost.  Now replies that do not
 * fit wait in a per-peer queue (src/core/call.c), capped by HIXL_MAX_PEER_QUEUE; a
 * peer over the cap is dropped.
 *
 * The target is a child process (HIXL_TIMEOUT_MS=30000, so the old blocking
 * send would hold its control thread for 30 s per reply; queue cap 64 KiB).
 * The attacker is the library itself, connected over shm, whose control
 * thread is then stopped inside recvmsg (wrapped, -Wl,--wrap=recvmsg) while
 * the main thread writes LOOKUPs straight onto the socket.  Asserts: the
 * attacker is dropped (its socket closed by the target) long before the
 * target's 30 s liveness, a legitimate peer connects and its put lands
 * meanwhile, and the target is alive at the end.
 */
#define _GNU_SOURCE
#include "hostile.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "core.h"
#include "wire.h"

/* The attacker's control thread stops reading once this is set. */
static _Atomic int g_stop_reading;
static pthread_t g_attacker_thread;
ssize_t __real_recvmsg(int fd, struct msghdr *m, int flags);
ssize_t __wrap_recvmsg(int fd, struct msghdr *m, int flags);
ssize_t __wrap_recvmsg(int fd, struct msghdr *m, int flags)
{
  while (atomic_load(&g_stop_reading) && pthread_equal(pthread_self(), g_attacker_thread))
    usleep(10000);
  return __real_recvmsg(fd, m, flags);
}

/* Over shm, all else as the environment says (the target sets its timeout
 * and queue cap there first). */
static hixl_ctx_t *mk_ctx(void) { return hostile_ctx("shm", NULL, NULL, 0); }

static void target_main(void *arg)
{
  (void)arg;
  setenv("HIXL_TIMEOUT_MS", "30000", 1);
  setenv("HIXL_MAX_PEER_QUEUE", "65536", 1);
  hixl_ctx_t *ctx = mk_ctx();
  serve_kv(ctx);
  hixl_ctx_destroy(ctx);
}

int main(void)
{
  piped_target_t t;
  piped_target_start(&t, target_main, NULL);
  const char *addr = t.addr;

  /* The attacker: a real shm peer, then its control thread stops reading. */
  hixl_ctx_t *a = mk_ctx();
  hixl_peer_t *ap;
  if (hixl_connect(a, addr, 5000, &ap) != HIXL_OK)
    FAIL("attacker connect: %s", hixl_last_error());
  g_attacker_thread = a->ctl_thread;
  atomic_store(&g_stop_reading, 1);
  hixl_msg_t m = {.type = HIXL_MSG_LOOKUP};
  snprintf(m.str[0], sizeof(m.str[0]), "kv");
  uint8_t frame[256];
  size_t flen = hixl_wire_encode(&m, frame, sizeof(frame));
  int fd = ap->fd;
  double t0 = now_s();
  long sent = 0;
  bool dropped = false;
  /* Requests until the target hangs up on us (or 20 s: its liveness is 30). */
  while (!dropped && now_s() - t0 < 20) {
    ssize_t n = send(fd, frame, flen, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n == (ssize_t)flen) {
      sent++;
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      dropped = true; /* EPIPE / ECONNRESET */
      break;
    }
    if (n > 0)
      FAIL("partial LOOKUP frame");
    struct pollfd p = {fd, POLLOUT | POLLRDHUP, 0};
    poll(&p, 1, 100);
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR))
      dropped = true;
  }
  double t_drop = now_s() - t0;
  if (!dropped)
    FAIL("the target still holds a peer that read none of %ld replies after %.1f s", sent, t_drop);
  printf("noread: dropped after %ld unread LOOKUPs, %.1f s\n", sent, t_drop);

  /* A legitimate peer is served (its connect has 5 s; the old code's control
   * thread was stuck in a 30 s send). */
  hixl_ctx_t *l = mk_ctx();
  hixl_peer_t *lp;
  hixl_rmr_t *r;
  static const char msg[] = "legit-after";
  if (hixl_connect(l, addr, 5000, &lp) != HIXL_OK || hixl_rmr_lookup(lp, "kv", 5000, &r) ||
      hixl_put(lp, msg, sizeof(msg), r, 0, 0, NULL) || hixl_fence(l, lp, 5000))
    FAIL("legitimate peer: %s", hixl_last_error());
  char line[64];
  if (!piped_target_peek(&t, line, sizeof(line)) || strncmp(line, msg, strlen(msg)) != 0)
    FAIL("the legitimate put did not land (target shows \"%s\")", line);
  hixl_rmr_release(r);
  hixl_disconnect(lp);
  hixl_ctx_destroy(l);
  atomic_store(&g_stop_reading, 0);
  hixl_ctx_destroy(a);
  int st = piped_target_stop(&t);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    FAIL("the target died (status %#x)", st);
  printf("noread: legitimate peer served, target alive\n");
  return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * shm_bell: a peer that abuses the doorbell it is handed (docs/waiting.md,
 * docs/security.md).  Every shm peer of a target holds the write end of
 * the target's doorbell pipe (the same open file description for all of
 * them).  The attacker, an authenticated shm peer, fills that pipe and then
 * clears O_NONBLOCK on the shared write end while the target sleeps and is
 * stopped (it drains nothing): with a plain write() every honest peer that
 * rings it would block for good.  An honest peer must still notify (each
 * hixl_notify returns: an alarm kills the process otherwise), and the
 * target, once it continues, must receive every notification.  The attacker also tries to read the
 * pipe (steal wake-ups): it has no read end.
 *
 * A sleeper with few peers waits on one futex word per peer instead, in
 * the inbox that peer writes (docs/waiting.md).  Second round: while the
 * target sleeps, the attacker scribbles its own word and the time beside
 * it (random values, stores only) from a thread, and the honest peer's
 * notifications, sent one at a time, must each still reach the target.
 * Run with the waits' safety net off (meson.build), and also with
 * HIXL_NO_FUTEX_WAITV=1 (the pipe alone).
 *
 * Linked with the internal objects: the attacker takes the fd from its own
 * shm peer state.
 */
#define _GNU_SOURCE
#include "hostile.h"

#include <pthread.h>

#include "core.h"
#include "../../src/shm/shm_int.h"

#define N 20

static _Atomic bool scribbling = true;

/* The attacker's thread: its inbox word at the target, and the ring time
 * beside it, get any value, by plain stores. */
static void *scribble(void *arg)
{
  hixl_ring_shared_t *sh = arg;
  unsigned x = 12345;
  while (atomic_load(&scribbling)) {
    x = x * 1103515245u + 12345u;
    atomic_store(&sh->bell, x);
    atomic_store(&sh->rang_ns, (int64_t)x * ((x & 1) ? -1 : 1000));
    /* Stores only: a FUTEX_WAKE here would wake the target anyway and
     * hide an honest wake-up that was lost. */
    usleep(100);
  }
  return NULL;
}

static hixl_ctx_t *mk_ctx(void) { return hostile_ctx("shm", NULL, NULL, 0); }

int main(void)
{
  int out[2];
  if (pipe(out) != 0)
    FAIL("pipe");
  pid_t t = fork();
  if (t == 0) { /* the target: asleep in hixl_notif_wait, counts what comes */
    hixl_ctx_t *ctx = mk_ctx();
    char addr[128];
    snprintf(addr, sizeof(addr), "%s\n", hixl_ctx_address(ctx));
    if (write(out[1], addr, strlen(addr)) < 0)
      _exit(2);
    int got = 0;
    while (got < 2 * N) {
      hixl_notif_t n;
      if (hixl_notif_wait(ctx, &n, 30000) != HIXL_OK)
        FAIL("target: notification %d of %d did not come: %s", got, 2 * N, hixl_last_error());
      if (n.imm != (uint32_t)got)
        FAIL("target: notification %u, expected %d", n.imm, got);
      got++;
    }
    hixl_ctx_destroy(ctx);
    _exit(0);
  }
  char addr[128] = "";
  FILE *f = fdopen(out[0], "r");
  if (f == NULL || fgets(addr, sizeof(addr), f) == NULL)
    FAIL("no target address");
  addr[strcspn(addr, "\n")] = 0;
  alarm(30); /* a blocked ring would hang here: the alarm makes it a failure */

  /* The attacker. */
  hixl_ctx_t *actx = mk_ctx();
  hixl_peer_t *ap;
  OK(hixl_connect(actx, addr, 10000, &ap));
  if (strcmp(hixl_peer_transport(ap), "shm") != 0)
    FAIL("attacker: transport %s, expected shm", hixl_peer_transport(ap));
  int bell = ((shm_peer_t *)ap->tp)->bell_w;
  char b;
  if (read(bell, &b, 1) >= 0 || (errno != EBADF && errno != EINVAL))
    FAIL("attacker: read the doorbell (%s): it holds a read end", strerror(errno));
  fcntl(bell, F_SETFL, fcntl(bell, F_GETFL) | O_NONBLOCK);
  static char junk[65536];
  size_t filled = 0;
  for (;;) {
    ssize_t r = write(bell, junk, sizeof(junk));
    if (r <= 0)
      break;
    filled += (size_t)r;
  }
  fcntl(bell, F_SETFL, fcntl(bell, F_GETFL) & ~O_NONBLOCK); /* shared with every peer */
  printf("attacker: filled the doorbell with %zu bytes, cleared O_NONBLOCK\n", filled);

  /* The honest peer: rings the target, asleep and stopped (so it drains
   * nothing: the pipe stays full), N times; then the target continues. */
  hixl_ctx_t *hctx = mk_ctx();
  hixl_peer_t *hp;
  OK(hixl_connect(hctx, addr, 10000, &hp));
  usleep(200000); /* the target is asleep in hixl_notif_wait */
  kill(t, SIGSTOP);
  fcntl(bell, F_SETFL, fcntl(bell, F_GETFL) | O_NONBLOCK);
  while (write(bell, junk, sizeof(junk)) > 0)
    ;
  fcntl(bell, F_SETFL, fcntl(bell, F_GETFL) & ~O_NONBLOCK);
  for (int i = 0; i < N; i++)
    OK(hixl_notify(hp, (uint32_t)i, 0, NULL));
  kill(t, SIGCONT);

  /* Round two: the target asleep (not stopped), the attacker's word and
   * time scribbled all along, the honest peer's notifications one by one. */
  pthread_t th;
  if (pthread_create(&th, NULL, scribble, ((shm_peer_t *)ap->tp)->outbox_sh) != 0)
    FAIL("pthread_create");
  /* How it sleeps, from its page (which we map read-only): on words (the
   * high half) unless HIXL_NO_FUTEX_WAITV keeps it in poll(). */
  const char *nofw = getenv("HIXL_NO_FUTEX_WAITV");
  bool want_words = !(nofw && *nofw && strcmp(nofw, "0") != 0);
  const shm_bell_t *tb = ((shm_peer_t *)hp->tp)->bell;
  int asleep_as_wanted = 0;
  for (int i = N; i < 2 * N; i++) {
    usleep(20000); /* it has drained round one and sleeps again */
    uint32_t v = atomic_load(&tb->sleepers);
    if (v != 0 && (v >= HIXL_SLEEP_WORD) == want_words)
      asleep_as_wanted++;
    OK(hixl_notify(hp, (uint32_t)i, 0, NULL));
  }
  if (asleep_as_wanted == 0)
    FAIL("the target never slept %s (this kernel lacks futex_waitv?)",
         want_words ? "on futex words" : "in poll()");
  printf("target asleep %s at %d of %d notifications\n", want_words ? "on words" : "in poll()",
         asleep_as_wanted, N);
  int status = 0;
  if (waitpid(t, &status, 0) != t || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    FAIL("the target did not receive every notification (status %d)", status);
  atomic_store(&scribbling, false);
  pthread_join(th, NULL);
  printf("honest peer: %d notifications delivered to a sleeping target past a full, "
         "blocking doorbell, %d past a scribbled word\n",
         N, N);
  hixl_disconnect(hp);
  hixl_disconnect(ap);
  hixl_ctx_destroy(hctx);
  hixl_ctx_destroy(actx);
  return 0;
}

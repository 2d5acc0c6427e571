/* SPDX-License-Identifier: MIT */
/*
 * shm_truncate: a peer that completes the shm handshake (the library
 * itself, linked with --wrap=close so it keeps a copy of every memfd it is
 * handed: the target's region table and inbox at bind, a region's memfd at
 * FD_REQ) then ftruncates every one of them to 0 and scribbles the
 * target's notification ring (cap 2^40 in its header, garbage over its
 * indices and every cell).  Issue 13, findings 3 and 4: the target died of
 * SIGBUS (hixl_notif_poll, hixl_mr_dereg, its own buffer) or SIGSEGV / a
 * spin under ctx->lock in hixl_notif_poll, and a legitimate peer already
 * connected died of SIGBUS in hixl_get.
 *
 * Three processes: the target (serves a 1 MiB "kv" region, polls
 * notifications, checks its own bytes), a legitimate peer (gets from kv and
 * notifies, before, during and after the attack), the attacker.  Passes
 * if the target and the legitimate peer survive, every byte the legitimate
 * peer read and the target's own buffer are intact, the target still takes
 * the legitimate peer's notifications after the attack, and deregisters.
 * The target also publishes "ro", 64 KiB granted READ only: the attacker
 * tries to map its fd writable and to write through it (finding 1: the fd
 * was O_RDWR whatever the region's access); its bytes must stay intact.
 * Argument "scribble": the rings only, no truncation (finding 4 alone);
 * "readonly": neither, only the READ-only region; "readonly-nobody": the
 * same with the attacker running as uid 65534 (needs root; the target lets
 * that uid in with HIXL_SHM_ALLOW_UIDS), which also reopens the read-only
 * fd read-write through /proc/self/fd: memfd inodes were mode 0777, so
 * that worked for any uid; hixl__memfd now makes them 0400 (a process of
 * the same uid could chmod it back, and root ignores modes: the limit).
 * Exit 0 on success, 1 on failure (the reason on stderr).
 */
#define _GNU_SOURCE
#define HOSTILE_KEEP_MEMFDS /* linked with --wrap=close: g_kept, g_capture */
#include "hostile.h"

#include <sys/mman.h>
#include <sys/stat.h>

#define KV_LEN (1u << 20)
#define RO_LEN (64u << 10) /* "ro": published with READ only */
#define TOKEN "hostile-shm"

static bool g_truncate = true; /* off for "scribble": the rings only */
static bool g_scribble = true; /* off for "readonly": the READ-only region only */
static bool g_nobody;          /* "readonly-nobody": the attacker is uid 65534 */

static hixl_ctx_t *mk_ctx(void) { return hostile_ctx("shm", TOKEN, "127.0.0.1:0", 5000); }

static char g_addr[256];
static int g_ctl[2];     /* parent -> target: one byte = stop */
static int g_addr_p[2];  /* target -> parent: its address */
static int g_peer_go[2]; /* parent -> legit peer: one byte = finish */

static void target_main(void)
{
  if (g_nobody)
    setenv("HIXL_SHM_ALLOW_UIDS", "65534", 1);
  hixl_ctx_t *ctx = mk_ctx();
  hixl_mr_t *mr, *ro_mr;
  uint8_t *kv = pattern_region(ctx, KV_LEN, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, 0, "kv", &mr);
  uint8_t *ro = pattern_region(ctx, RO_LEN, HIXL_ACCESS_READ, 1, "ro", &ro_mr);
  put_str(g_addr_p[1], hixl_ctx_address(ctx));
  uint64_t notifs = 0, late = 0;
  for (;;) {
    char c;
    bool stop = try_byte(g_ctl[0], &c);
    hixl_notif_t nb[64];
    int n = hixl_notif_poll(ctx, nb, 64);
    for (int i = 0; i < n; i++) {
      notifs++;
      if (nb[i].imm == 0xfeed)
        late++;
    }
    if (stop)
      break;
    usleep(2000);
  }
  for (size_t i = 0; i < KV_LEN; i++)
    if (kv[i] != pat(i))
      FAIL("target: its own buffer changed at byte %zu", i);
  for (size_t i = 0; i < RO_LEN; i++)
    if (ro[i] != pat(i + 1))
      FAIL("target: its READ-only region changed at byte %zu", i);
  OK(hixl_mr_dereg(ro_mr));
  if (late == 0)
    FAIL("target: no notification from the legitimate peer after the attack (%llu in all)",
         (unsigned long long)notifs);
  OK(hixl_mr_dereg(mr));
  printf("target: %llu notifications (%llu after the attack), buffer intact\n",
         (unsigned long long)notifs, (unsigned long long)late);
  hixl_ctx_destroy(ctx);
  exit(0);
}

static void legit_main(void)
{
  hixl_ctx_t *ctx = mk_ctx();
  hixl_peer_t *peer;
  hixl_rmr_t *kv = lookup_at(ctx, g_addr, "kv", &peer);
  uint64_t gets = 0;
  bool finishing = false;
  double end = 0;
  for (size_t k = 0;; k++) {
    check_get(ctx, peer, kv, KV_LEN, k);
    gets++;
    char c;
    if (!finishing && try_byte(g_peer_go[0], &c)) {
      finishing = true;
      end = now_s() + 0.2;
    }
    OK(hixl_notify(peer, finishing ? 0xfeed : 1, 0, NULL));
    if (finishing && now_s() > end)
      break;
    usleep(500);
  }
  OK(hixl_fence(ctx, peer, 10000));
  printf("legit peer: %llu gets intact\n", (unsigned long long)gets);
  exit(0);
}

static void attacker_main(void)
{
  if (g_nobody)
    become_nobody();
  hixl_ctx_t *ctx = mk_ctx();
  g_capture = 1;
  hixl_peer_t *peer;
  lookup_at(ctx, g_addr, "kv", &peer);
  hixl_rmr_t *ro;
  OK(hixl_rmr_lookup(peer, "ro", 10000, &ro));
  g_capture = 0;
  int truncated = 0, inboxes = 0, ro_writes = 0;
  for (int i = 0; i < g_nkept; i++) {
    int fd = g_kept[i];
    char path[64], link[256];
    fd_name(fd, link, sizeof(link));
    struct stat st;
    if (fstat(fd, &st) != 0)
      continue;
    /* A notification ring (ours or the target's): cap absurd, and garbage
     * over its indices and cells (the header's first 64 bytes are magic and
     * cap, then indices, then cells, in every layout). */
    if (g_scribble && strstr(link, "hixl-inbox") && st.st_size > 64) {
      uint8_t *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        inboxes++;
        uint64_t cap = (uint64_t)1 << 40;
        memcpy(p + 8, &cap, 8);
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (size_t o = 64; o + 8 <= (size_t)st.st_size; o += 8) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          memcpy(p + o, &x, 8);
        }
        munmap(p, (size_t)st.st_size);
      }
    }
    /* The READ-only region: map it writable, write through the fd. */
    if (strstr(link, "hixl-mem") && st.st_size == RO_LEN) {
      uint8_t *p = mmap(NULL, RO_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        memset(p, 0xaa, 64);
        ro_writes++;
        munmap(p, RO_LEN);
      }
      if (pwrite(fd, "owned", 5, 128) == 5)
        ro_writes++;
      /* A read-write open of the same file through /proc (another uid:
       * root ignores the inode's mode, see the top). */
      snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
      int rw = g_nobody ? open(path, O_RDWR | O_CLOEXEC) : -1;
      if (rw >= 0) {
        p = mmap(NULL, RO_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
        if (p != MAP_FAILED) {
          memset(p + 256, 0xbb, 64);
          ro_writes++;
          munmap(p, RO_LEN);
        }
        if (pwrite(rw, "owned", 5, 512) == 5)
          ro_writes++;
        close(rw);
      }
    }
    if (g_truncate && ftruncate(fd, 0) == 0)
      truncated++;
  }
  printf("attacker: %d memfds captured, %d inboxes scribbled, %d truncated, %d writes into "
         "the READ-only region\n",
         g_nkept, inboxes, truncated, ro_writes);
  /* A notification into the scribbled ring (bounded: at worst AGAIN after
   * timeout_ms), then leave without a word. */
  (void)hixl_notify(peer, 0xbad, 0, NULL);
  if (g_nkept < 4)
    FAIL("attacker: captured only %d memfds (expected table, inbox and the regions')", g_nkept);
  _exit(0);
}

/* The three processes, with the attack the case chose. */
static int attack(void)
{
  if (pipe(g_ctl) || pipe(g_addr_p) || pipe(g_peer_go))
    FAIL("pipe");
  pid_t target = spawn(target_main);
  get_str(g_addr_p[0], g_addr, sizeof(g_addr));
  pid_t legit = spawn(legit_main);
  usleep(300000); /* the legitimate peer is connected and reading */
  pid_t att = spawn(attacker_main);
  /* 60 s: a hang guard for each */
  int fails = wait_for(att, "attacker", 60);
  usleep(300000); /* the target and the legitimate peer go on meanwhile */
  put_byte(g_peer_go[1], 'x');
  fails += wait_for(legit, "legitimate peer", 60);
  put_byte(g_ctl[1], 'x');
  fails += wait_for(target, "target", 60);
  if (fails) {
    kill(target, SIGKILL);
    kill(legit, SIGKILL);
    return 1;
  }
  printf("ok\n");
  return 0;
}

static int run_truncate(void) { return attack(); }
static int run_scribble(void)
{
  g_truncate = false;
  return attack();
}
static int run_readonly(void)
{
  g_truncate = false;
  g_scribble = false;
  return attack();
}
static int run_readonly_nobody(void)
{
  if (getuid() != 0) {
    printf("skip: readonly-nobody needs root (an attacker of another uid)\n");
    return 77;
  }
  g_nobody = true;
  g_truncate = false;
  g_scribble = false;
  return attack();
}

/* The cases (tests/common/cases.h): --list prints them; none is truncate. */
static const struct test_case cases[] = {
    {"truncate", run_truncate},
    {"scribble", run_scribble},
    {"readonly", run_readonly},
    {"readonly-nobody", run_readonly_nobody},
};

int main(int argc, char **argv)
{
  cases_options(CASES(cases), argc, argv);
  setvbuf(stdout, NULL, _IONBF, 0);
  return cases_run(cases, sizeof(cases) / sizeof(cases[0]), argc > 1 ? argv[1] : "truncate");
}

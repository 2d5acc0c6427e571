/* SPDX-License-Identifier: MIT */
/*
 * shm_trust: peers that completed the shm handshake and then use what they
 * were handed, or what they told us, against us (issue 13, "trust nothing
 * a peer controls").  The attacker is the library itself, linked with
 * --wrap=close (it keeps a copy of every memfd it is handed), --wrap=getpid
 * (it can claim another process's pid in the handshake) and
 * --wrap=hixl__memfd (its emulated device memory can be left unsealed).
 * One mode per run:
 *
 *   table        finding 2: the region table a peer maps listed every region
 *                (published or not) with its rkey, and was handed out
 *                writable.  The attacker harvests keys from it, forges blobs
 *                for the target's unpublished regions and writes into them,
 *                then tries every way to write the table (mmap, pwrite, a
 *                read-write reopen through /proc, mprotect) and zeroes what
 *                it can.  The target's unpublished bytes must be intact, a
 *                legitimate peer must keep reading (and looking up) its
 *                region, and the attacker must find no key and write nothing.
 *   subregion    finding 1: a 4 KiB region registered inside a 1 MiB
 *                hixl_mem_alloc granted nothing (access 0): FD_REQ handed
 *                out the whole memfd for the small region (read-write), and
 *                for the allocation itself (read-only, though it grants no
 *                READ).  The rest of the allocation must stay unreachable and
 *                intact; the small region still works (put, get).
 *   idle         finding 6: 48 idle peers must not cost the target more than
 *                IDLE_MAX_SHM_KIB of shared memory each (the inbox ring was
 *                written cell by cell: 512 KiB and more per peer), nor
 *                IDLE_MAX_KIB in all (not checked under sanitizers, whose
 *                allocators inflate the heap).
 *   devtrunc     the emulated device importer mapped a peer's memfd without
 *                checking its seals: an owner that truncates its device
 *                memory under the importer's mapping killed it (SIGBUS).
 *                The importer must refuse the unsealed memfd and stay up.
 *   uid-target   finding 5: a peer of another uid (65534) is refused at
 *                SHM_BIND by default (HIXL_ERR_AUTH, naming the setting) and
 *                accepted with HIXL_SHM_ALLOW_UIDS=65534.
 *   uid-initiator the same from the initiator's side: a target of another
 *                uid is refused unless the initiator allows it.
 *   pidlie       finding 5: an initiator claims a bystander's pid in its
 *                HELLO; the target's puts into the initiator's CMA region
 *                went into the bystander (a confused deputy).  They must land
 *                in the initiator, the bystander must be untouched.
 *   pidlie-target the same with a lying target and an honest initiator.
 *
 * The uid modes and the pid modes need root (they exit 77 otherwise).
 * Exit 0 on success, 1 on failure (the reason on stderr).
 */
#define _GNU_SOURCE
#define HOSTILE_KEEP_MEMFDS /* linked with --wrap=close: g_kept, g_capture */
#include "hostile.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include "core.h"
#include "rkey.h"

#define KV_LEN (1u << 20)
#define SECRET_LEN (64u << 10)
#define BIG_LEN (1u << 20)    /* subregion: the allocation */
#define SMALL_OFF (64u << 10) /* and the region inside it */
#define SMALL_LEN 4096u
#define VICTIM_LEN (64u << 10)
#define IDLE_WARM 4
#define IDLE_PEERS 48
#define IDLE_MAX_KIB 64     /* resident memory per idle peer, all of it */
#define IDLE_MAX_SHM_KIB 32 /* of which shared memory (the rings: 580 KiB before) */
/* Sanitizer runtimes grow every allocation (TSan: ~70 KiB of heap per
 * peer): there only the shared-memory part, the finding itself, is held to
 * its bound. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define IDLE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define IDLE_SANITIZED 1
#endif
#endif
#ifndef IDLE_SANITIZED
#define IDLE_SANITIZED 0
#endif
#define NOBODY 65534
#define TOKEN "hostile-trust-token"

static const char *g_mode;
static bool mode(const char *m) { return strcmp(g_mode, m) == 0; }

/* --- the attacker's instruments (and the memfd capture, hostile.h) ------ */
pid_t __real_getpid(void);
pid_t __wrap_getpid(void);
int __real_hixl__memfd(const char *name, size_t len);
int __wrap_hixl__memfd(const char *name, size_t len);
static pid_t g_fake_pid;  /* != 0: what getpid() says */
static bool g_unseal_dev; /* emulated device memory in an unsealed memfd */
static int g_dev_fd = -1; /* and its fd, to truncate */

pid_t __wrap_getpid(void) { return g_fake_pid ? g_fake_pid : __real_getpid(); }

int __wrap_hixl__memfd(const char *name, size_t len)
{
  if (!g_unseal_dev || strcmp(name, "hixl-device") != 0)
    return __real_hixl__memfd(name, len);
  int fd = memfd_create(name, MFD_CLOEXEC); /* no seals at all */
  if (fd < 0 || ftruncate(fd, (off_t)len) != 0)
    return -1;
  g_dev_fd = fcntl(fd, F_DUPFD_CLOEXEC, 100);
  return fd;
}

/* --- common ------------------------------------------------------------- */
static hixl_ctx_t *mk_ctx(void) { return hostile_ctx("shm", TOKEN, "127.0.0.1:0", 5000); }

/* VmRSS of pid, and its anonymous and shared-memory parts. */
static long rss_kib(pid_t pid, long *anon_p, long *shmem_p)
{
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "re");
  long v = -1;
  while (f && fgets(line, sizeof(line), f)) {
    sscanf(line, "VmRSS: %ld kB", &v);
    sscanf(line, "RssAnon: %ld kB", anon_p);
    sscanf(line, "RssShmem: %ld kB", shmem_p);
  }
  if (f)
    fclose(f);
  if (v < 0)
    FAIL("cannot read the RSS of pid %d", (int)pid);
  return v;
}

/* Pipes between the parent and the children. */
static int g_t_ctl[2]; /* parent -> target: 'q' stop */
static int g_t_out[2]; /* target -> parent: its address */
static int g_l_go[2];  /* parent -> legit peer: 'f' finish */
static int g_l_rdy[2]; /* legit peer -> parent: 'r' served once */
static int g_a_ctl[2]; /* parent -> attacker */
static int g_a_out[2]; /* attacker -> parent */
static int g_b_ctl[2]; /* parent -> bystander: 'q' check and leave */
static char g_addr[256];
static char g_addr2[256];
static pid_t g_bystander;

/* Every process forks from main: this buffer has the same address in each.
 * The bystander fills it with pat(i + 11); the pid-lie attacker registers
 * its own copy as a CMA region. */
static uint8_t g_victim[VICTIM_LEN] __attribute__((aligned(4096)));

/* --- the honest target ---------------------------------------------------- */
static void target_main(void)
{
  if (mode("uid-initiator"))
    become_nobody();
  hixl_ctx_t *ctx = mk_ctx();
  hixl_mr_t *mr;
  uint8_t *kv = pattern_region(ctx, KV_LEN, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, 0, "kv", &mr);
  /* table: two regions nobody was given a blob for. */
  uint8_t *secret = NULL, *secret2 = NULL;
  hixl_mr_t *secret_mr = NULL, *secret2_mr = NULL;
  if (mode("table")) {
    secret = aligned_alloc(4096, SECRET_LEN);
    for (size_t i = 0; i < SECRET_LEN; i++)
      secret[i] = pat(i + 3);
    OK(hixl_mr_reg(ctx, secret, SECRET_LEN, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &secret_mr));
    secret2 =
        pattern_region(ctx, SECRET_LEN, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, 5, NULL, &secret2_mr);
  }
  /* subregion: 4 KiB published inside an unpublished 1 MiB allocation. */
  uint8_t *big = NULL;
  hixl_mr_t *big_mr = NULL, *small_mr = NULL;
  if (mode("subregion")) {
    big = pattern_region(ctx, BIG_LEN, 0, 9, NULL, &big_mr);
    OK(hixl_mr_reg(ctx, big + SMALL_OFF, SMALL_LEN, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE,
                   &small_mr));
    OK(hixl_mr_publish(small_mr, "small"));
    OK(hixl_mr_publish(big_mr, "none"));
  }
  /* uid-target: a second context that lets uid 65534 in. */
  hixl_ctx_t *ctx2 = NULL;
  hixl_mr_t *mr2 = NULL;
  if (mode("uid-target")) {
    setenv("HIXL_SHM_ALLOW_UIDS", "65534", 1);
    ctx2 = mk_ctx();
    unsetenv("HIXL_SHM_ALLOW_UIDS");
    pattern_region(ctx2, KV_LEN, HIXL_ACCESS_READ, 0, "kv", &mr2);
  }
  put_str(g_t_out[1], hixl_ctx_address(ctx));
  if (ctx2)
    put_str(g_t_out[1], hixl_ctx_address(ctx2));
  uint64_t notifs = 0, late = 0;
  for (;;) {
    char c;
    bool stop = try_byte(g_t_ctl[0], &c);
    hixl_notif_t nb[64];
    int n = hixl_notif_poll(ctx, nb, 64);
    for (int i = 0; i < n; i++) {
      notifs++;
      if (nb[i].imm == 0xfeed)
        late++;
      if (nb[i].imm == 0xa77) {
        /* pidlie: the initiator asks for a put into its region "att". */
        hixl_rmr_t *att;
        /* Its notification can be seen before our control thread has
         * marked the new peer up: the lookup waits for that. */
        OK(hixl_rmr_lookup(nb[i].peer, "att", 10000, &att));
        static uint8_t src[VICTIM_LEN];
        for (size_t k = 0; k < VICTIM_LEN; k++)
          src[k] = pat(k + 13);
        OK(hixl_put(nb[i].peer, src, VICTIM_LEN, att, 0, 0, NULL));
        OK(hixl_fence(ctx, nb[i].peer, 10000));
        OK(hixl_notify(nb[i].peer, 0xd0e, 0, NULL));
        hixl_rmr_release(att);
      }
    }
    if (stop)
      break;
    usleep(1000);
  }
  for (size_t i = 0; i < KV_LEN; i++)
    if (kv[i] != pat(i))
      FAIL("target: its kv changed at byte %zu", i);
  if (secret) {
    for (size_t i = 0; i < SECRET_LEN; i++)
      if (secret[i] != pat(i + 3))
        FAIL("target: its unpublished heap region was written at byte %zu", i);
    for (size_t i = 0; i < SECRET_LEN; i++)
      if (secret2[i] != pat(i + 5))
        FAIL("target: its unpublished hixl_mem_alloc region was written at byte %zu", i);
    OK(hixl_mr_dereg(secret_mr));
    OK(hixl_mr_dereg(secret2_mr));
  }
  if (big) {
    for (size_t i = 0; i < BIG_LEN; i++)
      if ((i < SMALL_OFF || i >= SMALL_OFF + SMALL_LEN) && big[i] != pat(i + 9))
        FAIL("target: byte %zu of the allocation around the small region changed", i);
    OK(hixl_mr_dereg(small_mr));
    OK(hixl_mr_dereg(big_mr));
  }
  if (late == 0)
    FAIL("target: no notification from the legitimate peer after the attack (%llu in all)",
         (unsigned long long)notifs);
  OK(hixl_mr_dereg(mr));
  printf("target: %llu notifications (%llu after the attack), memory intact\n",
         (unsigned long long)notifs, (unsigned long long)late);
  if (ctx2)
    hixl_ctx_destroy(ctx2);
  hixl_ctx_destroy(ctx);
  exit(0);
}

/* --- the legitimate peer -------------------------------------------------- */
static void legit_main(void)
{
  hixl_ctx_t *ctx = mk_ctx();
  hixl_peer_t *peer;
  hixl_rmr_t *kv = lookup_at(ctx, g_addr, "kv", &peer);
  uint64_t gets = 0;
  int after = -1; /* rounds left once told to finish */
  for (size_t k = 0; after != 0; k++) {
    check_get(ctx, peer, kv, KV_LEN, k);
    gets++;
    if (gets == 1)
      put_byte(g_l_rdy[1], 'r');
    char c;
    if (after < 0 && try_byte(g_l_go[0], &c)) {
      /* After the attack: a fresh lookup (the blob checked against the
       * target's table again) must work too. */
      hixl_rmr_t *kv_again;
      OK(hixl_rmr_lookup(peer, "kv", 10000, &kv_again));
      hixl_rmr_release(kv);
      kv = kv_again;
      after = 50;
    }
    OK(hixl_notify(peer, after >= 0 ? 0xfeed : 1, 0, NULL));
    if (after > 0)
      after--;
    usleep(500);
  }
  OK(hixl_fence(ctx, peer, 10000));
  printf("legit peer: %llu gets intact\n", (unsigned long long)gets);
  hixl_ctx_destroy(ctx);
  exit(0);
}

/* --- the attackers -------------------------------------------------------- */
/* Every way to write a memfd we hold read-only; each that works zeroes it.
 * Returns how many worked. */
static int try_write(int fd, size_t size)
{
  int wrote = 0;
  uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) {
    memset(p, 0, size);
    munmap(p, size);
    wrote++;
  }
  static const uint8_t zero[4096];
  if (pwrite(fd, zero, sizeof(zero), 0) > 0)
    wrote++;
  p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) {
    if (mprotect(p, size, PROT_READ | PROT_WRITE) == 0) {
      memset(p, 0, size);
      wrote++;
    }
    munmap(p, size);
  }
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  int rw = open(path, O_RDWR | O_CLOEXEC);
  if (rw >= 0) {
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
    if (p != MAP_FAILED) {
      memset(p, 0, size);
      munmap(p, size);
      wrote++;
    }
    if (pwrite(rw, zero, sizeof(zero), 0) > 0)
      wrote++;
    close(rw);
  }
  return wrote;
}

static void attack_table(hixl_ctx_t *ctx, hixl_peer_t *peer)
{
  hixl_rmr_t *kv;
  OK(hixl_rmr_lookup(peer, "kv", 10000, &kv));
  g_capture = 0;
  int table = -1;
  char name[256];
  for (int i = 0; i < g_nkept; i++)
    if (strstr(fd_name(g_kept[i], name, sizeof(name)), "hixl-regions"))
      table = g_kept[i];
  if (table < 0)
    FAIL("attacker: no region table among %d memfds", g_nkept);
  struct stat st;
  if (fstat(table, &st) != 0 || st.st_size <= 0)
    FAIL("attacker: fstat of the table");
  size_t size = (size_t)st.st_size;
  const uint8_t *t = mmap(NULL, size, PROT_READ, MAP_SHARED, table, 0);
  if (t == MAP_FAILED)
    FAIL("attacker: cannot even read the table: %s", strerror(errno));
  /* Harvest: the key of kv (which we hold) anywhere in it, and every slot
   * read as {rkey, base, len, access, flags} forged into a blob. */
  int leaked = 0, forged = 0, wrote = 0;
  for (size_t o = 0; o + 8 <= size; o += 8) {
    uint64_t w;
    memcpy(&w, t + o, 8);
    leaked += w == kv->rkey;
  }
  for (size_t s = 0; s < size / 32; s++) {
    const uint8_t *e = t + s * 32;
    hixl_rkey_info_t k = {.ctx_id = peer->remote_ctx_id, .slot = (uint32_t)s};
    memcpy(&k.rkey, e, 8);
    memcpy(&k.base, e + 8, 8);
    memcpy(&k.len, e + 16, 8);
    memcpy(&k.access, e + 24, 4);
    memcpy(&k.flags, e + 28, 4);
    if (k.rkey == 0 || k.rkey == kv->rkey || k.len == 0)
      continue;
    uint8_t blob[HIXL_RKEY_BLOB_LEN];
    hixl_rkey_encode(&k, blob);
    hixl_rmr_t *r;
    if (hixl_rmr_unpack(peer, blob, sizeof(blob), &r) != HIXL_OK)
      continue;
    forged++;
    static uint8_t junk[256];
    memset(junk, 0x5a, sizeof(junk));
    if (hixl_put(peer, junk, k.len < sizeof(junk) ? (size_t)k.len : sizeof(junk), r, 0, 0, NULL) ==
        HIXL_OK)
      (void)hixl_fence(ctx, peer, 10000);
  }
  munmap((void *)t, size);
  wrote = try_write(table, size);
  printf("attacker: table of %zu bytes: kv's key found %d times, %d regions reached with "
         "forged blobs, %d writes into the table\n",
         size, leaked, forged, wrote);
  if (leaked || forged || wrote)
    FAIL("attacker: the table gave away keys or took writes");
}

static void attack_subregion(hixl_ctx_t *ctx, hixl_peer_t *peer)
{
  g_capture = 1;
  hixl_rmr_t *small, *none;
  OK(hixl_rmr_lookup(peer, "small", 10000, &small));
  OK(hixl_rmr_lookup(peer, "none", 10000, &none));
  g_capture = 0;
  static uint8_t one[64];
  if (hixl_get(peer, one, sizeof(one), none, 0, 0, NULL) == HIXL_OK)
    FAIL("attacker: read a region granted nothing");
  int exposed = 0;
  char name[256];
  for (int i = 0; i < g_nkept; i++) {
    struct stat st;
    if (!strstr(fd_name(g_kept[i], name, sizeof(name)), "hixl-mem") || fstat(g_kept[i], &st) != 0 ||
        (size_t)st.st_size < BIG_LEN)
      continue;
    uint8_t *p = mmap(NULL, BIG_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, g_kept[i], 0);
    bool rw = p != MAP_FAILED;
    if (!rw)
      p = mmap(NULL, BIG_LEN, PROT_READ, MAP_SHARED, g_kept[i], 0);
    if (p == MAP_FAILED)
      continue;
    exposed++;
    printf("attacker: mapped the whole 1 MiB allocation (%s); byte 0 reads %u\n",
           rw ? "read-write" : "read-only", p[0]);
    if (rw)
      memset(p, 0x55, SMALL_OFF);
    munmap(p, BIG_LEN);
  }
  /* The region itself works, whatever carries it. */
  static uint8_t buf[SMALL_LEN];
  memset(buf, 0x77, sizeof(buf));
  OK(hixl_put(peer, buf, sizeof(buf), small, 0, 0, NULL));
  OK(hixl_fence(ctx, peer, 10000));
  memset(buf, 0, sizeof(buf));
  OK(hixl_get(peer, buf, sizeof(buf), small, 0, 0, NULL));
  for (size_t i = 0; i < sizeof(buf); i++)
    if (buf[i] != 0x77)
      FAIL("attacker: the small region read back %u at %zu", buf[i], i);
  if (exposed)
    FAIL("attacker: the memfd of the whole allocation was handed out");
  printf("attacker: the small region works, nothing around it reachable\n");
}

static void attacker_main(void)
{
  hixl_ctx_t *ctx = mk_ctx();
  if (mode("idle")) {
    hixl_peer_t *p;
    for (int i = 0; i < IDLE_WARM; i++)
      OK(hixl_connect(ctx, g_addr, 10000, &p));
    put_byte(g_a_out[1], 'w');
    get_byte(g_a_ctl[0]);
    for (int i = 0; i < IDLE_PEERS; i++)
      OK(hixl_connect(ctx, g_addr, 10000, &p));
    put_byte(g_a_out[1], 'c');
    get_byte(g_a_ctl[0]); /* measured: leave */
    _exit(0);
  }
  hixl_peer_t *peer;
  g_capture = 1; /* the table comes at bind */
  OK(hixl_connect(ctx, g_addr, 10000, &peer));
  g_capture = 0;
  if (mode("table"))
    attack_table(ctx, peer);
  else if (mode("subregion"))
    attack_subregion(ctx, peer);
  _exit(0); /* without a word */
}

/* The peer of another uid (uid-target): refused by default, accepted by the
 * context that allows it. */
static void nobody_peer_main(void)
{
  become_nobody();
  hixl_ctx_t *ctx = mk_ctx();
  hixl_peer_t *peer;
  hixl_status_t st = hixl_connect(ctx, g_addr, 10000, &peer);
  if (st == HIXL_OK)
    FAIL("uid %d peer: accepted by a target that does not allow its uid", NOBODY);
  if (st != HIXL_ERR_AUTH || !strstr(hixl_last_error(), "HIXL_SHM_ALLOW_UIDS"))
    FAIL("uid %d peer: refused with %s (%s): want AUTH naming HIXL_SHM_ALLOW_UIDS", NOBODY,
         hixl_strerror(st), hixl_last_error());
  printf("uid %d peer: refused: %s\n", NOBODY, hixl_last_error());
  hixl_rmr_t *kv = lookup_at(ctx, g_addr2, "kv", &peer);
  for (size_t k = 0; k < 16; k++)
    check_get(ctx, peer, kv, KV_LEN, k);
  printf("uid %d peer: served by the target that allows it\n", NOBODY);
  hixl_ctx_destroy(ctx);
  exit(0);
}

/* uid-initiator: a root initiator and a target of uid 65534. */
static void root_initiator_main(void)
{
  hixl_ctx_t *ctx = mk_ctx();
  hixl_peer_t *peer;
  hixl_status_t st = hixl_connect(ctx, g_addr, 10000, &peer);
  if (st == HIXL_OK)
    FAIL("initiator: bound to a target of uid %d it does not allow", NOBODY);
  if (st != HIXL_ERR_AUTH || !strstr(hixl_last_error(), "HIXL_SHM_ALLOW_UIDS"))
    FAIL("initiator: refused with %s (%s): want AUTH naming HIXL_SHM_ALLOW_UIDS", hixl_strerror(st),
         hixl_last_error());
  printf("initiator: refused the target: %s\n", hixl_last_error());
  setenv("HIXL_SHM_ALLOW_UIDS", "65534", 1);
  hixl_ctx_t *ctx2 = mk_ctx();
  hixl_rmr_t *kv = lookup_at(ctx2, g_addr, "kv", &peer);
  for (size_t k = 0; k < 16; k++)
    check_get(ctx2, peer, kv, KV_LEN, k);
  OK(hixl_notify(peer, 0xfeed, 0, NULL));
  printf("initiator: with HIXL_SHM_ALLOW_UIDS=65534, served\n");
  hixl_ctx_destroy(ctx2);
  hixl_ctx_destroy(ctx);
  exit(0);
}

/* --- pid lies -------------------------------------------------------------- */
static void bystander_main(void)
{
  for (size_t i = 0; i < VICTIM_LEN; i++)
    g_victim[i] = pat(i + 11);
  put_byte(g_a_out[1], 'b');
  get_byte(g_b_ctl[0]);
  for (size_t i = 0; i < VICTIM_LEN; i++)
    if (g_victim[i] != pat(i + 11))
      FAIL("bystander (pid %d): byte %zu of its memory was written by a hixl peer (%u)",
           (int)getpid(), i, g_victim[i]);
  printf("bystander: untouched\n");
  exit(0);
}

/* Wait for notification imm (a hang guard only); then g_victim must hold
 * what the honest side put. */
static void expect_put(hixl_ctx_t *ctx, uint32_t imm, const char *who)
{
  double end = now_s() + 60;
  for (;;) {
    hixl_notif_t nb;
    if (hixl_notif_poll(ctx, &nb, 1) == 1 && nb.imm == imm)
      break;
    if (now_s() > end)
      FAIL("%s: no notification after the put", who);
    usleep(1000);
  }
  for (size_t i = 0; i < VICTIM_LEN; i++)
    if (g_victim[i] != pat(i + 13))
      FAIL("%s: the put did not land here (byte %zu is %u): it went to pid %d", who, i, g_victim[i],
           (int)g_fake_pid);
  printf("%s: the put landed in this process, not in pid %d\n", who, (int)g_fake_pid);
}

static void liar_initiator_main(void)
{
  g_fake_pid = g_bystander;
  memset(g_victim, 0, sizeof(g_victim));
  hixl_ctx_t *ctx = mk_ctx();
  hixl_mr_t *mr;
  OK(hixl_mr_reg(ctx, g_victim, VICTIM_LEN, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &mr));
  OK(hixl_mr_publish(mr, "att"));
  hixl_peer_t *peer;
  OK(hixl_connect(ctx, g_addr, 10000, &peer));
  OK(hixl_notify(peer, 0xa77, 0, NULL)); /* "put into my region, please" */
  expect_put(ctx, 0xd0e, "lying initiator");
  OK(hixl_notify(peer, 0xfeed, 0, NULL));
  OK(hixl_fence(ctx, peer, 10000));
  hixl_ctx_destroy(ctx);
  exit(0);
}

static void liar_target_main(void)
{
  g_fake_pid = g_bystander;
  memset(g_victim, 0, sizeof(g_victim));
  hixl_ctx_t *ctx = mk_ctx();
  hixl_mr_t *mr;
  OK(hixl_mr_reg(ctx, g_victim, VICTIM_LEN, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &mr));
  OK(hixl_mr_publish(mr, "att"));
  put_str(g_t_out[1], hixl_ctx_address(ctx));
  expect_put(ctx, 0xd0e, "lying target");
  get_byte(g_t_ctl[0]);
  hixl_ctx_destroy(ctx);
  exit(0);
}

static void honest_initiator_main(void)
{
  hixl_ctx_t *ctx = mk_ctx();
  hixl_peer_t *peer;
  hixl_rmr_t *att = lookup_at(ctx, g_addr, "att", &peer);
  static uint8_t src[VICTIM_LEN];
  for (size_t k = 0; k < VICTIM_LEN; k++)
    src[k] = pat(k + 13);
  OK(hixl_put(peer, src, VICTIM_LEN, att, 0, 0, NULL));
  OK(hixl_fence(ctx, peer, 10000));
  OK(hixl_notify(peer, 0xd0e, 0, NULL));
  OK(hixl_fence(ctx, peer, 10000));
  hixl_ctx_destroy(ctx);
  exit(0);
}

/* --- devtrunc ---------------------------------------------------------- */
static void dev_owner_main(void)
{
  g_unseal_dev = true;
  hixl_ctx_t *ctx = mk_ctx();
  hixl_mr_t *mr;
  pattern_region(ctx, KV_LEN, HIXL_ACCESS_READ, 0, "kv", &mr);
  void *dev;
  hixl_mr_t *dmr;
  OK(hixl_mem_alloc(ctx, KV_LEN, HIXL_MEM_DEVICE, HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &dev,
                    &dmr));
  if (g_dev_fd < 0)
    FAIL("device owner: no unsealed device memfd (is HIXL_DEVICE=emulated set?)");
  OK(hixl_mr_publish(dmr, "dev"));
  put_str(g_t_out[1], hixl_ctx_address(ctx));
  get_byte(g_a_ctl[0]); /* the importer looked it up */
  if (ftruncate(g_dev_fd, 0) != 0)
    FAIL("device owner: ftruncate: %s", strerror(errno));
  put_byte(g_a_out[1], 't');
  get_byte(g_t_ctl[0]);
  hixl_ctx_destroy(ctx);
  exit(0);
}

static void dev_importer_main(void)
{
  hixl_ctx_t *ctx = mk_ctx();
  hixl_peer_t *peer;
  hixl_rmr_t *kv = lookup_at(ctx, g_addr, "kv", &peer), *dev = NULL;
  check_get(ctx, peer, kv, KV_LEN, 0);
  hixl_status_t st = hixl_rmr_lookup(peer, "dev", 10000, &dev);
  printf("importer: lookup of the unsealed device region: %s (%s)\n", hixl_strerror(st),
         st == HIXL_OK ? "imported" : hixl_last_error());
  put_byte(g_a_ctl[1], 'l');
  get_byte(g_a_out[0]); /* truncated */
  if (st == HIXL_OK) {
    static uint8_t buf[4096];
    (void)hixl_get(peer, buf, sizeof(buf), dev, 8192, 0, NULL); /* SIGBUS before */
    (void)hixl_fence(ctx, peer, 10000);
  }
  for (size_t k = 0; k < 16; k++)
    check_get(ctx, peer, kv, KV_LEN, k);
  if (st == HIXL_OK)
    FAIL("importer: imported device memory in an unsealed memfd");
  printf("importer: up, its other region intact\n");
  hixl_ctx_destroy(ctx);
  exit(0);
}

/* ------------------------------------------------------------------------- */
/* A process of a case.  run_procs starts them in order, each once the one
 * before is ready (the addresses it passes on read, or its ready byte come),
 * and finishes them in the reverse order: the last (the attacker or the
 * like) ends by itself, each other is told to by its stop byte; all are
 * reaped. */
typedef struct proc {
  void (*main)(void);
  const char *who;
  int addrs;       /* addresses it passes on g_t_out (g_addr, g_addr2) */
  const int *rdy;  /* the pipe it writes a byte on once ready, or NULL */
  const int *stop; /* the pipe its stop byte goes to, or NULL */
  char stop_byte;
  pid_t *pid_p; /* where its pid goes for the processes after it, or NULL */
} proc_t;

static const proc_t TARGET = {target_main, "target", 1, NULL, g_t_ctl, 'q'};
static const proc_t LEGIT = {legit_main, "legitimate peer", 0, g_l_rdy, g_l_go, 'f'};

/* The target's memory with a few peers, then with IDLE_PEERS more idle
 * ones (the attacker's, in two steps); the number of bounds it exceeds. */
static int measure_idle(pid_t target)
{
  int fails = 0;
  get_byte(g_a_out[0]);
  long anon0 = 0, shm0 = 0, anon1 = 0, shm1 = 0;
  long before = rss_kib(target, &anon0, &shm0);
  put_byte(g_a_ctl[1], 'm');
  get_byte(g_a_out[0]);
  long after = rss_kib(target, &anon1, &shm1);
  long per = (after - before) / IDLE_PEERS;
  printf("target RSS: %ld KiB with %d peers, %ld KiB with %d more idle peers: %ld KiB each "
         "(%.1f KiB anonymous, %.1f KiB shared memory)\n",
         before, IDLE_WARM + 1, after, IDLE_PEERS, per, (double)(anon1 - anon0) / IDLE_PEERS,
         (double)(shm1 - shm0) / IDLE_PEERS);
  long per_shm = (shm1 - shm0) / IDLE_PEERS;
  if (per_shm > IDLE_MAX_SHM_KIB) {
    fprintf(stderr,
            "FAIL: an idle peer costs the target %ld KiB of shared memory (at most %d "
            "wanted)\n",
            per_shm, IDLE_MAX_SHM_KIB);
    fails++;
  }
  if (!IDLE_SANITIZED && per > IDLE_MAX_KIB) {
    fprintf(stderr, "FAIL: an idle peer costs the target %ld KiB (at most %d wanted)\n", per,
            IDLE_MAX_KIB);
    fails++;
  }
  put_byte(g_a_ctl[1], 'x');
  return fails;
}

/* Run the n processes of a case (see proc_t); with measure, the idle
 * measurement of the first, the target, once all are started.  Returns the
 * number of failures. */
static int run_procs(const proc_t *p, int n, bool measure)
{
  pid_t pid[4];
  if (n > 4)
    FAIL("run_procs: %d processes", n);
  for (int i = 0; i < n; i++) {
    pid[i] = spawn(p[i].main);
    if (p[i].pid_p)
      *p[i].pid_p = pid[i];
    if (p[i].addrs) {
      get_str(g_t_out[0], g_addr, sizeof(g_addr));
      if (p[i].addrs > 1)
        get_str(g_t_out[0], g_addr2, sizeof(g_addr2));
    }
    if (p[i].rdy)
      get_byte(p[i].rdy[0]);
  }
  int fails = measure ? measure_idle(pid[0]) : 0;
  for (int i = n - 1; i >= 0; i--) {
    if (p[i].stop)
      put_byte(p[i].stop[1], p[i].stop_byte);
    fails += wait_for(pid[i], p[i].who, 90);
  }
  return fails;
}

/* target + legitimate peer (connected and served) + attacker (table,
 * subregion, idle). */
static int run_attack(void)
{
  const proc_t p[] = {TARGET, LEGIT, {attacker_main, "attacker"}};
  return run_procs(p, 3, mode("idle"));
}

static int run_devtrunc(void)
{
  const proc_t p[] = {{dev_owner_main, "device owner", 1, NULL, g_t_ctl, 'q'},
                      {dev_importer_main, "importer"}};
  return run_procs(p, 2, false);
}

static int run_uid_target(void)
{
  const proc_t p[] = {{target_main, "target", 2, NULL, g_t_ctl, 'q'}, /* and one allowing 65534 */
                      LEGIT,
                      {nobody_peer_main, "uid 65534 peer"}};
  return run_procs(p, 3, false);
}

static int run_uid_initiator(void)
{
  const proc_t p[] = {{target_main, "uid 65534 target", 1, NULL, g_t_ctl, 'q'},
                      {root_initiator_main, "root initiator"}};
  return run_procs(p, 2, false);
}

/* The bystander first (filled, its pid known to the liar), leaving last. */
static int run_pidlie(void)
{
  const proc_t bystander = {bystander_main, "bystander", 0, g_a_out, g_b_ctl, 'q', &g_bystander};
  if (mode("pidlie")) {
    const proc_t p[] = {bystander, TARGET, LEGIT, {liar_initiator_main, "lying initiator"}};
    return run_procs(p, 4, false);
  }
  const proc_t p[] = {bystander,
                      {liar_target_main, "lying target", 1, NULL, g_t_ctl, 'q'},
                      {honest_initiator_main, "honest initiator"}};
  return run_procs(p, 3, false);
}

/* The cases (tests/common/cases.h): --list prints them; none is table.
 * Each returns its number of failures; g_mode is its name. */
static const struct test_case cases[] = {
    {"table", run_attack},          {"subregion", run_attack},
    {"idle", run_attack},           {"devtrunc", run_devtrunc},
    {"uid-target", run_uid_target}, {"uid-initiator", run_uid_initiator},
    {"pidlie", run_pidlie},         {"pidlie-target", run_pidlie},
};

int main(int argc, char **argv)
{
  cases_options(CASES(cases), argc, argv);
  setvbuf(stdout, NULL, _IONBF, 0);
  g_mode = argc > 1 ? argv[1] : "table";
  if (cases_find(CASES(cases), g_mode) < 0)
    return 2;
  if ((strncmp(g_mode, "uid", 3) == 0 || strncmp(g_mode, "pidlie", 6) == 0) && getuid() != 0) {
    printf("skip: mode %s needs root (another uid, another process's memory)\n", g_mode);
    return 77;
  }
  if (pipe(g_t_ctl) || pipe(g_t_out) || pipe(g_l_go) || pipe(g_l_rdy) || pipe(g_a_ctl) ||
      pipe(g_a_out) || pipe(g_b_ctl))
    FAIL("pipe");
  signal(SIGPIPE, SIG_IGN);
  if (cases_run(cases, sizeof(cases) / sizeof(cases[0]), g_mode))
    return 1;
  printf("ok\n");
  return 0;
}

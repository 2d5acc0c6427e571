/* SPDX-License-Identifier: MIT */
/* hixl-info: what this build and this machine offer, as a doctor: each
 * problem with its fix, exit status 1 when something hixl needs is wrong
 * (docs/observability.md#hixl-info-as-a-doctor); with --stats, the counters
 * of a running context.
 *
 *   hixl-info                          this build and this machine, checked
 *   hixl-info --stats ADDR [--watch [S]] [--timeout MS]
 *                                      ADDR's counters (hixl_peer_remote_stats), over
 *                                      its control port: HIXL_AUTH_TOKEN / HIXL_TLS as
 *                                      for any connect; --watch redraws every S
 *                                      seconds (default 1) with rates, like top
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <hixl.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXS 256

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig, stop = 1; }

static int usage(void)
{
  fprintf(stderr, "usage: hixl-info [--stats ADDR [--watch [SECONDS]] [--timeout MS]]\n");
  return 2;
}

static double now_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One table: name, value, and (watching) the rate of counters since the
 * last one. */
static void print_table(const char *addr, const hixl_stat_t *s, size_t n, const uint64_t *prev,
                        double dt)
{
  printf("%-26s %20s%s\n", addr, "value", prev ? "         per second" : "");
  for (size_t i = 0; i < n; i++) {
    printf("%-26s %20llu", s[i].name, (unsigned long long)s[i].value);
    if (prev && s[i].kind == HIXL_STAT_COUNTER && dt > 0 && s[i].value >= prev[i])
      printf(" %18.1f", (double)(s[i].value - prev[i]) / dt);
    printf("\n");
  }
}

static int stats(const char *addr, double watch_s, int timeout_ms)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  hixl_ctx_t *ctx;
  hixl_status_t st = hixl_ctx_create(&cfg, &ctx);
  if (st != HIXL_OK) {
    fprintf(stderr, "hixl-info: cannot create a context: %s\n", hixl_last_error());
    return 1;
  }
  hixl_peer_t *peer;
  if ((st = hixl_connect(ctx, addr, timeout_ms, &peer)) != HIXL_OK) {
    fprintf(stderr, "hixl-info: cannot connect to %s: %s\n", addr, hixl_last_error());
    hixl_ctx_destroy(ctx);
    return 1;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  hixl_stat_t s[MAXS];
  uint64_t prev[MAXS];
  double t_prev = 0;
  int rc = 0;
  for (int round = 0; !stop; round++) {
    size_t n = MAXS;
    if ((st = hixl_peer_remote_stats(peer, s, &n, timeout_ms)) != HIXL_OK) {
      fprintf(stderr, "hixl-info: %s: %s\n", addr, hixl_last_error());
      rc = 1;
      break;
    }
    if (n > MAXS)
      n = MAXS;
    double t = now_s();
    if (watch_s > 0)
      printf("\033[H\033[2J"); /* home, clear: like top */
    print_table(addr, s, n, round > 0 ? prev : NULL, t - t_prev);
    fflush(stdout);
    if (watch_s <= 0)
      break;
    for (size_t i = 0; i < n; i++)
      prev[i] = s[i].value;
    t_prev = t;
    for (double left = watch_s; left > 0 && !stop; left -= 0.1)
      usleep(100000);
  }
  hixl_disconnect(peer);
  hixl_ctx_destroy(ctx);
  return rc;
}

/* ------------------------------------------------------------ the doctor */

static int n_fail, n_warn;

/* One finding: "ok", "note" (worth knowing, nothing to fix), "warn" (works,
 * but slower or limited: the fix follows), "FAIL" (something needed is
 * wrong: exit status 1). */
static void say(const char *level, const char *fix, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(const char *level, const char *fix, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  printf("[%-4s] ", level);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  if (fix)
    printf("       fix: %s\n", fix);
  n_fail += strcmp(level, "FAIL") == 0;
  n_warn += strcmp(level, "warn") == 0;
}

/* The first line of a small sysfs / procfs file, or "" when unreadable. */
static const char *read_line(const char *path, char *buf, size_t n)
{
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return buf;
  if (fgets(buf, (int)n, f) == NULL)
    buf[0] = 0;
  fclose(f);
  buf[strcspn(buf, "\n")] = 0;
  return buf;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
  return strcmp((*a)->d_name, (*b)->d_name);
}

/* The GID verbs would pick on a port, as src/verbs/verbs.c does (RoCE v2
 * with an IPv4-mapped address first), from sysfs; -1 when none. */
static int pick_gid(const char *port_dir, char *gid, size_t gn, char *ndev, size_t nn)
{
  int best = -1, best_score = -1;
  for (int i = 0; i < 256; i++) {
    char path[512], g[64], type[32];
    snprintf(path, sizeof(path), "%s/gids/%d", port_dir, i);
    if (read_line(path, g, sizeof(g))[0] == 0)
      break;
    if (strcmp(g, "0000:0000:0000:0000:0000:0000:0000:0000") == 0)
      continue;
    snprintf(path, sizeof(path), "%s/gid_attrs/types/%d", port_dir, i);
    read_line(path, type, sizeof(type));
    bool v2 = strstr(type, "v2") != NULL;
    bool v4 = strncmp(g, "0000:0000:0000:0000:0000:ffff:", 30) == 0;
    int score = (v2 ? 2 : 0) + (v4 ? 1 : 0);
    if (type[0] == 0 || strstr(type, "IB"))
      score = 3; /* InfiniBand: no types file */
    if (score > best_score) {
      best = i;
      best_score = score;
      snprintf(gid, gn, "%s", g);
      snprintf(path, sizeof(path), "%s/gid_attrs/ndevs/%d", port_dir, i);
      read_line(path, ndev, nn);
    }
  }
  return best;
}

static bool check_rdma(void)
{
  printf("\nverbs (RDMA)\n");
  struct dirent **devs = NULL;
  int n = scandir("/sys/class/infiniband", &devs, NULL, by_name);
  struct utsname u;
  uname(&u);
  char mod[512];
  snprintf(mod, sizeof(mod), "/lib/modules/%s/kernel/drivers/infiniband/sw/rxe", u.release);
  bool rxe_mod = access("/sys/module/rdma_rxe", F_OK) == 0 || access(mod, F_OK) == 0;
  int devices = 0, active = 0;
  const char *want = getenv("HIXL_NET_DEV");
  char chosen[160] = "";
  for (int d = 0; d < n; d++) {
    const char *name = devs[d]->d_name;
    if (name[0] == '.')
      continue;
    devices++;
    char pdir[512];
    snprintf(pdir, sizeof(pdir), "/sys/class/infiniband/%s/ports", name);
    struct dirent **ports = NULL;
    int np = scandir(pdir, &ports, NULL, by_name);
    for (int p = 0; p < np; p++) {
      if (ports[p]->d_name[0] == '.')
        continue;
      char dir[600], path[700], state[64], ll[32], gid[64] = "", ndev[64] = "", mtu[16] = "";
      snprintf(dir, sizeof(dir), "%s/%s", pdir, ports[p]->d_name);
      snprintf(path, sizeof(path), "%s/state", dir);
      read_line(path, state, sizeof(state));
      snprintf(path, sizeof(path), "%s/link_layer", dir);
      read_line(path, ll, sizeof(ll));
      int gi = pick_gid(dir, gid, sizeof(gid), ndev, sizeof(ndev));
      if (ndev[0]) {
        snprintf(path, sizeof(path), "/sys/class/net/%s/mtu", ndev);
        read_line(path, mtu, sizeof(mtu));
      }
      bool up = strstr(state, "ACTIVE") != NULL;
      active += up;
      if (up && chosen[0] == 0 &&
          (want == NULL || strcmp(want, name) == 0 || strcmp(want, ndev) == 0))
        snprintf(chosen, sizeof(chosen), "%s port %s (GID index %d)", name, ports[p]->d_name, gi);
      say(up ? "ok" : "warn",
          up ? NULL : "bring its link up (ip link set NETDEV up; for rxe the netdev under it)",
          "%s port %s: %s, %s, GID index %d %s (netdev %s, MTU %s)", name, ports[p]->d_name,
          state[0] ? state : "state unknown", ll[0] ? ll : "?", gi, gi < 0 ? "none" : gid,
          ndev[0] ? ndev : "-", mtu[0] ? mtu : "-");
      if (up && gi < 0)
        say("FAIL", "give the netdev an IP address (RoCE GIDs come from its addresses)",
            "%s port %s is active but has no usable GID", name, ports[p]->d_name);
    }
    for (int p = 0; p < np; p++)
      free(ports[p]);
    free(ports);
  }
  for (int d = 0; d < n; d++)
    free(devs[d]);
  free(devs);
  if (devices == 0) {
    say("note",
        rxe_mod ? "to emulate RDMA over Ethernet (Soft-RoCE): modprobe rdma_rxe; rdma link add "
                  "rxe0 type rxe netdev ETH"
                : NULL,
        "no RDMA device: verbs is not offered (peers on other hosts use fabric); the kernel's "
        "rdma_rxe module is %s",
        rxe_mod ? "available" : "not installed (Soft-RoCE cannot be added on this kernel)");
    return false;
  }
  if (active == 0)
    say("FAIL", "bring a port up (ip link set NETDEV up)",
        "%d RDMA device(s) but no ACTIVE port: verbs cannot be used", devices);
  else if (chosen[0])
    say("ok", NULL, "verbs would use %s%s%s", chosen, want ? ", as HIXL_NET_DEV says" : "",
        want ? "" : " (the first active port; HIXL_NET_DEV picks another)");
  else
    say("FAIL", "set HIXL_NET_DEV to an RDMA device or netdev with an active port",
        "HIXL_NET_DEV=%s names no active port", want);
  return active > 0;
}

/* CAP_IPC_LOCK lifts RLIMIT_MEMLOCK for ibv_reg_mr (the kernel's
 * can_do_mlock), as it does for root by default. */
static bool cap_ipc_lock(void)
{
  char line[256];
  FILE *f = fopen("/proc/self/status", "r");
  bool yes = false;
  while (f && fgets(line, sizeof(line), f))
    if (strncmp(line, "CapEff:", 7) == 0)
      yes = (strtoull(line + 7, NULL, 16) >> 14) & 1;
  if (f)
    fclose(f);
  return yes;
}

static void check_memlock(bool rdma)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
    return;
  unsigned long long kib = (unsigned long long)rl.rlim_cur / 1024;
  if (rl.rlim_cur == RLIM_INFINITY) {
    say("ok", NULL, "RLIMIT_MEMLOCK unlimited");
  } else if (cap_ipc_lock()) {
    say("ok", NULL,
        "RLIMIT_MEMLOCK is %llu KiB, but this process has CAP_IPC_LOCK (root): "
        "registration is not limited by it (other users' processes are)",
        kib);
  } else if (!rdma) {
    say("note", NULL,
        "RLIMIT_MEMLOCK is %llu KiB (only RDMA registration pins memory; no RDMA "
        "device here)",
        kib);
  } else {
    /* A verbs context pins its bounce pool (2 MiB) and receive buffers at
     * set-up, then every region registered: under 4 MiB not even set-up
     * works; a KV cache or parameter shard wants far more than 64 MiB. */
    const char *fix = "ulimit -l unlimited (shell), '* - memlock unlimited' in "
                      "/etc/security/limits.conf, LimitMEMLOCK=infinity (systemd), --ulimit "
                      "memlock=-1 (docker)";
    if (rl.rlim_cur < (4ull << 20))
      say("FAIL", fix,
          "RLIMIT_MEMLOCK is %llu KiB: a verbs context cannot even pin its own "
          "buffers (ibv_reg_mr fails with ENOMEM)",
          kib);
    else
      say(rl.rlim_cur < (1ull << 30) ? "warn" : "ok", rl.rlim_cur < (1ull << 30) ? fix : NULL,
          "RLIMIT_MEMLOCK is %llu KiB: registering more than that for RDMA fails with ENOMEM", kib);
  }
}

static void check_shm_dir(void)
{
  struct statvfs v;
  if (statvfs("/dev/shm", &v) != 0) {
    say("note", NULL, "/dev/shm is missing (hixl's shm transport uses memfd, not /dev/shm)");
    return;
  }
  unsigned long long mib = (unsigned long long)v.f_blocks * v.f_frsize >> 20;
  say(mib < 1024 ? "warn" : "ok",
      mib < 1024 ? "a larger /dev/shm (docker: --shm-size=8g) for the programs that use it" : NULL,
      "/dev/shm: %llu MiB (hixl's shm transport uses memfd and needs none of it; PyTorch's "
      "DataLoader and NCCL do)",
      mib);
}

/* Can a process read a sibling's memory (what shm's CMA path does for
 * memory registered with hixl_mr_reg)?  Two children of ours: the second
 * reads the first. */
static void check_cma(void)
{
  char yama[16];
  read_line("/proc/sys/kernel/yama/ptrace_scope", yama, sizeof(yama));
  int pfd[2];
  if (pipe(pfd) != 0)
    return;
  static volatile uint64_t secret = 0x5ca1ab1e;
  pid_t a = fork();
  if (a == 0) { /* the sibling that is read: waits until the pipe closes */
    close(pfd[1]);
    char c;
    while (read(pfd[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(pfd[0]);
  pid_t b = fork();
  if (b == 0) {
    uint64_t got = 0;
    struct iovec l = {&got, sizeof(got)}, r = {(void *)&secret, sizeof(secret)};
    ssize_t n = process_vm_readv(a, &l, 1, &r, 1, 0);
    _exit(n == (ssize_t)sizeof(got) && got == secret ? 0 : errno == EPERM ? 2 : 3);
  }
  int st = 0;
  waitpid(b, &st, 0);
  close(pfd[1]);
  waitpid(a, NULL, 0);
  int code = WIFEXITED(st) ? WEXITSTATUS(st) : 3;
  if (code == 0)
    say("ok", NULL, "process_vm_readv between sibling processes works (yama ptrace_scope %s)",
        yama[0] ? yama : "absent");
  else
    say("warn",
        "HIXL_SHM_PTRACER=1 in the target (it calls prctl(PR_SET_PTRACER), as Open MPI does), "
        "or sysctl kernel.yama.ptrace_scope=0; in a container, allow process_vm_readv/writev "
        "in its seccomp profile",
        "process_vm_readv between sibling processes is refused (%s; yama ptrace_scope %s): shm "
        "then copies memory registered with hixl_mr_reg through its owner (slower); "
        "hixl_mem_alloc memory is mapped and not affected",
        code == 2 ? "EPERM" : "failed", yama[0] ? yama : "absent");
}

static void check_hostname(const char *advertised)
{
  char host[256];
  if (gethostname(host, sizeof(host)) != 0)
    return;
  host[sizeof(host) - 1] = 0;
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
  if (getaddrinfo(host, NULL, &hints, &res) != 0) {
    say("note", NULL, "the hostname %s does not resolve (hixl advertises an interface address, %s)",
        host, advertised);
    return;
  }
  char num[64] = "";
  getnameinfo(res->ai_addr, res->ai_addrlen, num, sizeof(num), NULL, 0, NI_NUMERICHOST);
  freeaddrinfo(res);
  if (strncmp(num, "127.", 4) == 0)
    say("note",
        "give other tools the interface address, e.g. MASTER_ADDR=<that address> for torchrun",
        "the hostname %s resolves to %s, a loopback address (Debian's /etc/hosts does this): "
        "hixl advertises an interface address instead (%s), but a MASTER_ADDR=$(hostname) "
        "would not reach this machine from another",
        host, num, advertised);
  else
    say("ok", NULL, "the hostname %s resolves to %s", host, num);
}

static int info(void)
{
  printf("hixl %d.%d.%d\n", HIXL_VERSION_MAJOR, HIXL_VERSION_MINOR, HIXL_VERSION_PATCH);
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  printf("config: transports=%s timeout_ms=%d progress_thread=%d auth=%s\n",
         cfg.transports ? cfg.transports : "(all)", cfg.timeout_ms, cfg.progress_thread,
         cfg.auth_token ? "set" : "none");
  printf("\ncontext\n");
  hixl_ctx_t *ctx;
  hixl_status_t st = hixl_ctx_create(&cfg, &ctx);
  if (st != HIXL_OK) {
    say("FAIL", NULL, "hixl_ctx_create: %s (%s)", hixl_strerror(st), hixl_last_error());
    return 1;
  }
  const char *addr = hixl_ctx_address(ctx);
  bool loop = strncmp(addr, "127.", 4) == 0 || strncmp(addr, "[::1]", 5) == 0;
  say(loop ? "warn" : "ok",
      loop ? "bring up a non-loopback interface, or set HIXL_LISTEN=<its address>:0" : NULL,
      "a context advertises %s%s", addr,
      loop ? ": a loopback address, which peers on other hosts cannot reach" : "");
  say("ok", NULL, "transports offered: %s", hixl_ctx_transports(ctx));
  void *p;
  hixl_mr_t *mr;
  st = hixl_mem_alloc(ctx, 4096, HIXL_MEM_DEVICE, 0, &p, &mr);
  say(st == HIXL_OK ? "ok" : "note", NULL, "device memory: backend %s, %s", hixl_device_backend(),
      st == HIXL_OK ? "allocation works" : hixl_last_error());
  if (st == HIXL_OK)
    hixl_mr_dereg(mr);
  check_hostname(addr);
  hixl_ctx_destroy(ctx);

  bool rdma = check_rdma();
  printf("\nthis machine\n");
  check_memlock(rdma);
  check_cma();
  check_shm_dir();
  printf("\n%d problem(s), %d warning(s)\n", n_fail, n_warn);
  return n_fail ? 1 : 0;
}

int main(int argc, char **argv)
{
  const char *addr = NULL;
  double watch_s = 0;
  int timeout_ms = 10000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--stats") == 0 && i + 1 < argc)
      addr = argv[++i];
    else if (strcmp(argv[i], "--watch") == 0) {
      watch_s = 1;
      if (i + 1 < argc && argv[i + 1][0] != '-') {
        char *end;
        watch_s = strtod(argv[++i], &end);
        if (*end || watch_s < 0.1 || watch_s > 3600)
          return usage();
      }
    } else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 3600000)
        return usage();
      timeout_ms = (int)v;
    } else
      return usage();
  }
  if (addr == NULL && watch_s > 0)
    return usage();
  return addr ? stats(addr, watch_s, timeout_ms) : info();
}

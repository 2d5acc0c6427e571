/* SPDX-License-Identifier: MIT */
/* hixl-info: what this build and this machine offer, as a doctor: each
 * problem with its fix, exit status 1 when something hixl needs is wrong
 * (docs/observability.md#hixl-info-as-a-doctor); with --stats, the counters
 * of a running context; with --peer, whether and how this machine reaches a
 * running context; with --serve, a context for --peer to reach.
 *
 *   hixl-info                          this build and this machine, checked: the
 *                                      context, device backends (CUDA, Ascend),
 *                                      RDMA, libfabric's providers, limits
 *   hixl-info --stats ADDR [--watch [S]] [--timeout MS]
 *                                      ADDR's counters (hixl_peer_remote_stats), over
 *                                      its control port: HIXL_AUTH_TOKEN / HIXL_TLS as
 *                                      for any connect; --watch redraws every S
 *                                      seconds (default 1) with rates, like top
 *   hixl-info --peer ADDR [--timeout MS]
 *                                      connects to ADDR (HIXL_AUTH_TOKEN / HIXL_TLS as
 *                                      for any connect): the transport chosen and why
 *                                      each other one was not (a context allowed only
 *                                      that one tries), the control round trip, and a
 *                                      put/get check on the region ADDR published as
 *                                      "hixl-info.probe", if it did
 *   hixl-info --serve [ADDR] [--for S] a context listening on ADDR (else HIXL_LISTEN)
 *                                      that publishes "hixl-info.probe" (64 KiB, read
 *                                      and write) for --peer: prints its address as
 *                                      stdout's first line, serves until SIGINT /
 *                                      SIGTERM or S seconds
 *
 * Exit status: 0 when everything needed works, 1 on a problem, 2 on a usage
 * error.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
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
#ifdef HIXL_HAVE_FABRIC
/* Headers only (types, FI_VERSION): libfabric.so.1 is loaded with dlopen,
 * as the library does (src/fabric/fabric_int.h says why). */
#include <rdma/fabric.h>

#include "../src/fabric/fabric_sigs.h" /* handlers kept across the load */
#endif

#define MAXS 256
/* The region --serve publishes and --peer looks for. */
#define PROBE_NAME "hixl-info.probe"
#define PROBE_SLOT 4096 /* bytes one --peer writes */
#define PROBE_SLOTS 16  /* --serve's region: concurrent --peer runs pick slots by pid */

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig, stop = 1; }

static int usage(void)
{
  fprintf(stderr, "usage: hixl-info                     check this build and this machine\n"
                  "       hixl-info --stats ADDR [--watch [SECONDS]] [--timeout MS]\n"
                  "       hixl-info --peer ADDR [--timeout MS]\n"
                  "       hixl-info --serve [ADDR] [--for SECONDS]\n");
  return 2;
}

static double now_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int64_t now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
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
  /* Flush first: a child that leaves by any route that flushes stdio (a
   * sanitizer's _exit interceptor does) would print our buffer again. */
  fflush(stdout);
  fflush(stderr);
  pid_t a = fork();
  if (a < 0) {
    close(pfd[0]);
    close(pfd[1]);
    return;
  }
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
  if (b > 0)
    waitpid(b, &st, 0);
  else
    st = 3 << 8; /* no second child: "failed", and the first is let go below */
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

/* ------------------------------------------------------------ devices */

/* Where a symbol's library was loaded from (several CUDA or libfabric
 * installations on one machine are a classic trap), else name. */
static const char *lib_path(void *sym, const char *name)
{
  Dl_info di;
  return sym && dladdr(sym, &di) && di.dli_fname ? di.dli_fname : name;
}

/* What the device runtimes on this machine are, beside the backend the
 * library chose (src/device/device.c: the first of cuda, ascend, emulated
 * that works, or HIXL_DEVICE): the same library names the backends dlopen,
 * so "not found" here is "not found" there.  Nothing is closed: unloading a
 * GPU driver library inside a process is asking for trouble at exit. */
typedef int (*cu_int_fn)(int *);
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_name_fn)(int, const char **);

/* The runtime is what frameworks (PyTorch) bring; hixl uses the driver API
 * only, so its absence is worth knowing, not a problem. */
static void check_cudart(void)
{
  static const char *const rt[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                   "libcudart.so.11.0"};
  for (size_t i = 0; i < sizeof(rt) / sizeof(rt[0]); i++) {
    void *hr = dlopen(rt[i], RTLD_NOW | RTLD_LOCAL);
    cu_int_fn rv = hr ? (cu_int_fn)dlsym(hr, "cudaRuntimeGetVersion") : NULL;
    int x = 0;
    if (rv && rv(&x) == 0) {
      say("ok", NULL, "CUDA runtime: %s, version %d.%d (hixl itself needs only the driver)",
          lib_path((void *)rv, rt[i]), x / 1000, x % 1000 / 10);
      return;
    }
  }
  say("note", NULL, "CUDA runtime: libcudart not found (hixl needs only the driver, libcuda.so.1)");
}

static void check_cuda(const char *backend, const char *want)
{
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    say("note", NULL, "CUDA: libcuda.so.1 not found (%s): no NVIDIA driver here", dlerror());
    check_cudart();
    return;
  }
  cu_int_fn drv = (cu_int_fn)dlsym(h, "cuDriverGetVersion");
  cu_init_fn init = (cu_init_fn)dlsym(h, "cuInit");
  cu_int_fn count = (cu_int_fn)dlsym(h, "cuDeviceGetCount");
  cu_name_fn name = (cu_name_fn)dlsym(h, "cuGetErrorName");
  int v = 0, n = 0;
  char ver[32] = "version unknown";
  if (drv && drv(&v) == 0)
    snprintf(ver, sizeof(ver), "driver API %d.%d", v / 1000, v % 1000 / 10);
  /* cuInit fails without a GPU (or without the device nodes in a
   * container) even where the library is installed: the usual reason
   * device memory is not CUDA's. */
  int r = init ? init(0) : -1;
  const char *rname = NULL;
  if (r != 0 && (name == NULL || name(r, &rname) != 0))
    rname = NULL;
  bool used = strcmp(backend, "cuda") == 0;
  if (r == 0 && count && count(&n) == 0 && n > 0) {
    /* Works, yet not taken, and nobody asked for another backend: a
     * symbol or the primary context failed in src/device/cuda.c. */
    bool odd = !used && want == NULL;
    say(odd ? "warn" : "ok",
        odd ? "HIXL_LOG=debug hixl-info says why the backend was not taken" : NULL,
        "CUDA: %s, %s, %d device(s)%s", lib_path((void *)init, "libcuda.so.1"), ver, n,
        odd ? ", yet hixl did not take the cuda backend" : "");
  } else if (r == 0) {
    say("note", NULL, "CUDA: %s, %s, no device", lib_path((void *)init, "libcuda.so.1"), ver);
  } else {
    const char *why = rname ? rname : init ? "unknown error" : "no cuInit";
    say(want && strcmp(want, "cuda") != 0 ? "note" : "warn",
        "check that nvidia-smi sees the GPU; in a container, run it with the GPUs (docker: "
        "--gpus all, with the NVIDIA container toolkit)",
        "CUDA: %s (%s) is here, but cuInit fails: %s (%d)%s", lib_path((void *)drv, "libcuda.so.1"),
        ver, why, r, used ? "" : ": device memory is not CUDA's");
  }
  check_cudart();
}

typedef int (*acl_ver_fn)(int32_t *, int32_t *, int32_t *);

static void check_ascend(const char *backend, const char *want)
{
  void *h = dlopen("libascendcl.so", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    say("note", NULL, "Ascend: libascendcl.so not found (%s): no CANN runtime here", dlerror());
    return;
  }
  acl_ver_fn ver = (acl_ver_fn)dlsym(h, "aclrtGetVersion");
  int32_t a = 0, b = 0, c = 0;
  char v[48] = "version unknown (no aclrtGetVersion)";
  if (ver && ver(&a, &b, &c) == 0)
    snprintf(v, sizeof(v), "AscendCL %d.%d.%d", (int)a, (int)b, (int)c);
  bool used = strcmp(backend, "ascend") == 0;
  /* Found, not taken, and nobody asked for another: aclInit or a symbol
   * failed in src/device/ascend.c (or CUDA came first). */
  bool odd = !used && want == NULL && strcmp(backend, "cuda") != 0;
  say(odd ? "warn" : "ok",
      odd ? "HIXL_LOG=debug hixl-info says why the backend was not taken" : NULL,
      "Ascend: %s, %s%s", lib_path(dlsym(h, "aclrtGetVersion"), "libascendcl.so"), v,
      odd ? ", yet hixl did not take the ascend backend" : "");
}

static void check_devices(void)
{
  printf("\ndevice backends\n");
  const char *backend = hixl_device_backend();
  const char *want = getenv("HIXL_DEVICE");
  if (want && (*want == 0 || strcmp(want, "auto") == 0))
    want = NULL;
  bool real = strcmp(backend, "cuda") == 0 || strcmp(backend, "ascend") == 0;
  say(real ? "ok" : "note", NULL, "backend in use: %s (%s)%s", backend,
      want ? "HIXL_DEVICE says" : "the first of cuda, ascend, emulated that works",
      strcmp(backend, "emulated") == 0
          ? ": device memory is emulated, host memory standing in for it (tests, CI)"
          : "");
  check_cuda(backend, want);
  check_ascend(backend, want);
}

/* ------------------------------------------------------------ libfabric */

#ifdef HIXL_HAVE_FABRIC
typedef int (*fi_getinfo_fn)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
                             struct fi_info **);
typedef void (*fi_freeinfo_fn)(struct fi_info *);
typedef struct fi_info *(*fi_dupinfo_fn)(const struct fi_info *);
typedef uint32_t (*fi_version_fn)(void);
typedef const char *(*fi_strerror_fn)(int);

/* Appends name to the comma-separated list in buf, once. */
static void add_name(char *buf, size_t n, const char *name)
{
  if (name == NULL)
    name = "?";
  size_t len = strlen(buf), nl = strlen(name);
  for (const char *p = buf; (p = strstr(p, name)) != NULL; p += nl)
    if ((p == buf || p[-1] == ' ') && (p[nl] == ',' || p[nl] == 0))
      return;
  if (len + nl + 3 < n)
    snprintf(buf + len, n - len, "%s%s", len ? ", " : "", name);
}
#endif

/* libfabric's providers that could carry the fabric transport: fi_getinfo
 * with what fabric.c's hints_for asks at the least (no atomics, no
 * delivery completion, no FI_SOURCE: it tries with them first and does
 * without), and which one hixl would take (its preference list, or
 * HIXL_FABRIC_PROVIDER).  rdma: verbs can carry peers on other hosts, so a
 * missing libfabric is then a note, not a warning. */
static void check_fabric(bool rdma)
{
  printf("\nfabric (libfabric)\n");
#ifndef HIXL_HAVE_FABRIC
  say(rdma ? "note" : "warn", "install libfabric-dev and build hixl again (meson setup finds it)",
      "this build has no fabric transport (built without libfabric-dev, or with "
      "-Dfabric=disabled)%s",
      rdma ? "" : ": with no RDMA device either, peers on other hosts cannot be reached");
#else
  struct sigaction old[HIXL_N_KEPT_SIGS];
  hixl__sigs_save(old);
  void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  hixl__sigs_restore(old);
  if (h == NULL) {
    say(rdma ? "note" : "warn", "apt install libfabric1 (Debian; its tcp provider serves any host)",
        "libfabric.so.1 not found (%s): the fabric transport cannot be set up%s", dlerror(),
        rdma ? "" : ", and with no RDMA device peers on other hosts cannot be reached");
    return;
  }
  fi_getinfo_fn getinfo = (fi_getinfo_fn)dlsym(h, "fi_getinfo");
  fi_freeinfo_fn freeinfo = (fi_freeinfo_fn)dlsym(h, "fi_freeinfo");
  fi_dupinfo_fn dupinfo = (fi_dupinfo_fn)dlsym(h, "fi_dupinfo");
  fi_version_fn version = (fi_version_fn)dlsym(h, "fi_version");
  fi_strerror_fn strerr = (fi_strerror_fn)dlsym(h, "fi_strerror");
  if (!getinfo || !freeinfo || !dupinfo || !version || !strerr) {
    say("FAIL", "reinstall libfabric1",
        "libfabric.so.1 lacks fi_getinfo, fi_freeinfo, fi_dupinfo, "
        "fi_version or fi_strerror");
    return;
  }
  uint32_t v = version();
  say("ok", NULL, "libfabric %u.%u (%s; hixl asks for API 1.14)", FI_MAJOR(v), FI_MINOR(v),
      lib_path((void *)version, "libfabric.so.1"));
  struct fi_info *hints = dupinfo(NULL), *list = NULL;
  if (hints == NULL)
    return;
  hints->caps =
      FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
  hints->ep_attr->type = FI_EP_RDM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->tx_attr->msg_order = FI_ORDER_SAW | FI_ORDER_SAS | FI_ORDER_RAW;
  hixl__sigs_save(old);
  int rc = getinfo(FI_VERSION(1, 14), NULL, NULL, 0, hints, &list);
  hixl__sigs_restore(old);
  freeinfo(hints);
  const char *fi_prov = getenv("FI_PROVIDER");
  if (rc != 0 || list == NULL) {
    say(rdma ? "note" : "warn",
        fi_prov ? "FI_PROVIDER limits libfabric's providers: unset it, or name one this machine "
                  "has (tcp gives tcp;ofi_rxm)"
                : "a libfabric with the tcp provider (Debian's libfabric1 has it); fi_info -t "
                  "FI_EP_RDM (libfabric-bin) lists what this one offers",
        "no libfabric provider offers reliable endpoints with RMA and messages (fi_getinfo: "
        "%s)%s%s: the fabric transport cannot be set up",
        rc ? strerr(-rc) : "none", fi_prov ? "; FI_PROVIDER=" : "", fi_prov ? fi_prov : "");
    return;
  }
  /* One line per provider, with the fabrics and domains it came with. */
  const char *seen[32];
  int n_seen = 0;
  for (struct fi_info *i = list; i && n_seen < 32; i = i->next) {
    const char *prov = i->fabric_attr->prov_name;
    bool dup = false;
    for (int k = 0; k < n_seen; k++)
      dup |= strcmp(seen[k], prov) == 0;
    if (dup)
      continue;
    seen[n_seen++] = prov;
    char doms[256] = "", fabs[256] = "";
    for (struct fi_info *j = i; j; j = j->next)
      if (strcmp(j->fabric_attr->prov_name, prov) == 0) {
        add_name(doms, sizeof(doms), j->domain_attr->name);
        add_name(fabs, sizeof(fabs), j->fabric_attr->name);
      }
    say("ok", NULL, "provider %s: domains %s; fabrics %s", prov, doms, fabs);
  }
  /* Which one: exact names, as fabric.c's probe keeps them. */
  static const char *const prefer[] = {"efa", "cxi", "verbs;ofi_rxm", "tcp;ofi_rxm", "tcp", "shm"};
  const char *want = getenv("HIXL_FABRIC_PROVIDER");
  const char *pick = NULL;
  for (int k = 0; k < n_seen && want && *want; k++)
    if (strcmp(seen[k], want) == 0)
      pick = seen[k];
  for (size_t p = 0; p < sizeof(prefer) / sizeof(prefer[0]) && !(want && *want) && !pick; p++)
    for (int k = 0; k < n_seen; k++)
      if (strcmp(seen[k], prefer[p]) == 0)
        pick = prefer[p];
  if (want && *want && pick == NULL)
    say("FAIL", "set HIXL_FABRIC_PROVIDER to a provider listed above, or unset it",
        "HIXL_FABRIC_PROVIDER=%s is not among them: the fabric transport cannot be set up", want);
  else if (want && *want)
    say("ok", NULL, "fabric would use %s, as HIXL_FABRIC_PROVIDER says", pick);
  else if (pick)
    say("ok", NULL,
        "fabric would use %s (the first offered of efa, cxi, verbs;ofi_rxm, tcp;ofi_rxm, tcp, "
        "shm; HIXL_FABRIC_PROVIDER picks another)",
        pick);
  else
    say("warn", "HIXL_FABRIC_PROVIDER=<a provider listed above>",
        "none of the providers hixl tries by default (efa, cxi, verbs;ofi_rxm, tcp;ofi_rxm, tcp, "
        "shm) is offered%s%s",
        fi_prov ? "; FI_PROVIDER=" : "", fi_prov ? fi_prov : "");
  freeinfo(list);
#endif
}

/* ------------------------------------------------------------ --serve */

/* A context with a region for --peer's put/get check: hixl_mem_alloc
 * memory (mapped by shm peers), published under PROBE_NAME.  Peers do all
 * the work (one-sided): this process only waits. */
static int serve(const char *listen, double for_s)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  if (listen)
    cfg.listen = listen;
  hixl_ctx_t *ctx;
  if (hixl_ctx_create(&cfg, &ctx) != HIXL_OK) {
    fprintf(stderr, "hixl-info: cannot create a context: %s\n", hixl_last_error());
    return 1;
  }
  void *p;
  hixl_mr_t *mr;
  hixl_status_t st = hixl_mem_alloc(ctx, (size_t)PROBE_SLOT * PROBE_SLOTS, HIXL_MEM_HOST,
                                    HIXL_ACCESS_READ | HIXL_ACCESS_WRITE, &p, &mr);
  if (st == HIXL_OK && (st = hixl_mr_publish(mr, PROBE_NAME)) != HIXL_OK)
    hixl_mr_dereg(mr);
  if (st != HIXL_OK) {
    fprintf(stderr, "hixl-info: cannot publish a region: %s\n", hixl_last_error());
    hixl_ctx_destroy(ctx);
    return 1;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  printf("%s\n", hixl_ctx_address(ctx)); /* the first line: what scripts read */
  fflush(stdout);
  fprintf(stderr,
          "hixl-info: serving \"%s\" (%d KiB, read and write; transports %s) until "
          "Ctrl-C%s\n",
          PROBE_NAME, PROBE_SLOT * PROBE_SLOTS / 1024, hixl_ctx_transports(ctx),
          for_s > 0 ? " or the --for time" : "");
  int64_t end = for_s > 0 ? now_ns() + (int64_t)(for_s * 1e9) : INT64_MAX;
  while (!stop && now_ns() < end)
    usleep(50000);
  hixl_ctx_destroy(ctx); /* deregisters and frees the region */
  return 0;
}

/* ------------------------------------------------------------ --peer */

static int cmp_i64(const void *a, const void *b)
{
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* Sorts t; the minimum and the median, in microseconds. */
static void min_median_us(int64_t *t, int n, double *min_us, double *med_us)
{
  qsort(t, (size_t)n, sizeof(*t), cmp_i64);
  *min_us = (double)t[0] / 1e3;
  *med_us = (double)(n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2) / 1e3;
}

/* The fix for a failed connect where the message alone may not say it. */
static const char *connect_fix(hixl_status_t st)
{
  switch (st) {
  case HIXL_ERR_AUTH:
    return "the same HIXL_AUTH_TOKEN on both sides (and HIXL_TLS=1 on both, or on neither)";
  case HIXL_ERR_UNSUPPORTED:
    return "HIXL_TRANSPORTS on both sides must share a transport both machines can use "
           "(hixl-info on each side lists what it offers)";
  default: return NULL; /* the message carries the hint (src/core/handshake.c) */
  }
}

/* cfg.listen with port 0: the contexts that try one transport each live
 * beside the first one, which holds a port HIXL_LISTEN may have fixed. */
static const char *any_port(const char *listen, char *buf, size_t n)
{
  if (listen == NULL)
    return NULL;
  const char *colon = strrchr(listen, ':');
  if (colon == NULL || strchr(colon, ']'))
    return listen;
  snprintf(buf, n, "%.*s:0", (int)(colon - listen), listen);
  return buf;
}

/* Whether name is one of the comma-separated list. */
static bool listed(const char *list, const char *name)
{
  size_t n = strlen(name);
  for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
    if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == 0))
      return true;
  return false;
}

/* Why the other transports were not chosen: a context allowed only `name`
 * connects to addr too.  Not a problem either way (the chosen one works):
 * [ok] when it would also work, [note] with the reason when not. */
static void try_transport(const hixl_config_t *base, const char *name, const char *addr,
                          int timeout_ms)
{
  hixl_config_t cfg = *base;
  char listen[300];
  cfg.listen = any_port(base->listen, listen, sizeof(listen));
  cfg.transports = name;
  const char *env = getenv("HIXL_TRANSPORTS");
  char left_out[160] = "";
  if (env && *env && strcmp(env, "all") != 0 && !listed(env, name))
    snprintf(left_out, sizeof(left_out), "; HIXL_TRANSPORTS=%s leaves it out", env);
  hixl_ctx_t *ctx;
  if (hixl_ctx_create(&cfg, &ctx) != HIXL_OK) {
    say("note", NULL, "%s: a context with only it cannot be created here: %s%s", name,
        hixl_last_error(), left_out);
    return;
  }
  if (hixl_ctx_transports(ctx)[0] == 0) {
    /* Not offered: its probe's error is this thread's last (ctx.c logs
     * it at HIXL_LOG=info); a message from something else is not its. */
    const char *e = hixl_last_error();
    bool its = strncmp(e, name, strlen(name)) == 0 && e[strlen(name)] == ':';
    say("note", NULL, "%s: not offered on this side: %s%s", name,
        its ? e : "not in this build, or no device for it (HIXL_LOG=info says which)", left_out);
    hixl_ctx_destroy(ctx);
    return;
  }
  hixl_peer_t *peer;
  int64_t t0 = now_ns();
  hixl_status_t st = hixl_connect(ctx, addr, timeout_ms, &peer);
  if (st == HIXL_OK) {
    say("ok", NULL, "%s: would also work (connected in %.1f ms)%s", name,
        (double)(now_ns() - t0) / 1e6, left_out);
    hixl_disconnect(peer);
  } else if (strcmp(name, "self") == 0 && strstr(hixl_last_error(), "no common transport")) {
    /* Nothing to explain beyond what self is. */
    say("note", NULL, "self: serves a context's own address only, and the target is another%s",
        left_out);
  } else {
    say("note", NULL, "%s: %s%s", name, hixl_last_error(), left_out);
  }
  hixl_ctx_destroy(ctx);
}

/* The put/get check on the region the target published as PROBE_NAME:
 * PROBE_SLOT bytes of a pattern this run makes, read back and compared,
 * then 8-byte gets timed one at a time (issue to completion). */
static void data_check(hixl_peer_t *peer, int timeout_ms)
{
  hixl_rmr_t *rmr;
  hixl_status_t st = hixl_rmr_lookup(peer, PROBE_NAME, 0, &rmr);
  if (st == HIXL_ERR_NOT_REGISTERED) {
    say("note", NULL,
        "the target publishes no \"%s\" region: no put/get check (hixl-info --serve "
        "publishes one)",
        PROBE_NAME);
    return;
  }
  if (st != HIXL_OK) {
    say("FAIL", NULL, "hixl_rmr_lookup(\"%s\"): %s", PROBE_NAME, hixl_last_error());
    return;
  }
  static uint8_t out[PROBE_SLOT], back[PROBE_SLOT];
  uint32_t seed = (uint32_t)getpid() * 2654435761u ^ (uint32_t)now_ns();
  for (size_t i = 0; i < sizeof(out); i++)
    out[i] = (uint8_t)((seed >> (i % 4 * 8)) + i * 31);
  /* A slot of our own, so that two --peer runs at once do not overwrite
   * each other's pattern; a region smaller than --serve's gets offset 0. */
  uint64_t off = (uint64_t)(getpid() % PROBE_SLOTS) * PROBE_SLOT;
  hixl_req_t *req;
  st = hixl_put(peer, out, sizeof(out), rmr, off, 0, &req);
  if (st == HIXL_ERR_NOT_REGISTERED && off != 0)
    st = hixl_put(peer, out, sizeof(out), rmr, off = 0, 0, &req);
  const char *what = "hixl_put";
  if (st == HIXL_OK) {
    st = hixl_req_wait(req, timeout_ms);
    hixl_req_free(req);
  }
  if (st == HIXL_OK &&
      (what = "hixl_get", st = hixl_get(peer, back, sizeof(back), rmr, off, 0, &req)) == HIXL_OK) {
    st = hixl_req_wait(req, timeout_ms);
    hixl_req_free(req);
  }
  if (st != HIXL_OK) {
    say("FAIL", NULL, "%s of %zu bytes at offset %llu of \"%s\": %s", what, sizeof(out),
        (unsigned long long)off, PROBE_NAME, hixl_last_error());
    hixl_rmr_release(rmr);
    return;
  }
  size_t bad = 0;
  while (bad < sizeof(out) && out[bad] == back[bad])
    bad++;
  if (bad < sizeof(out)) {
    say("FAIL", "is another process writing \"" PROBE_NAME "\" at the same time?",
        "put %zu bytes and got different ones back: the first at byte %zu (0x%02x, not 0x%02x)",
        sizeof(out), bad, back[bad], out[bad]);
    hixl_rmr_release(rmr);
    return;
  }
  say("ok", NULL, "put %zu bytes to \"%s\" (offset %llu) and got them back: identical", sizeof(out),
      PROBE_NAME, (unsigned long long)off);
  enum { N_GETS = 100 };
  int64_t t[N_GETS];
  uint64_t word = 0;
  for (int i = 0; i < N_GETS; i++) {
    int64_t t0 = now_ns();
    st = hixl_get(peer, &word, sizeof(word), rmr, off, 0, &req);
    if (st == HIXL_OK) {
      st = hixl_req_wait(req, timeout_ms);
      hixl_req_free(req);
    }
    t[i] = now_ns() - t0;
    if (st != HIXL_OK || memcmp(&word, out, sizeof(word)) != 0) {
      say("FAIL", NULL, "8-byte get %d of %d: %s", i + 1, N_GETS,
          st != HIXL_OK ? hixl_last_error() : "not the bytes put there");
      hixl_rmr_release(rmr);
      return;
    }
  }
  double mn, med;
  min_median_us(t, N_GETS, &mn, &med);
  say("ok", NULL,
      "data round trip, 8-byte get to completion (%d gets): min %.2f us, median %.2f us", N_GETS,
      mn, med);
  hixl_rmr_release(rmr);
}

static int peer_check(const char *addr, int timeout_ms)
{
  printf("hixl %d.%d.%d, to the context at %s\n", HIXL_VERSION_MAJOR, HIXL_VERSION_MINOR,
         HIXL_VERSION_PATCH, addr);
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  printf("config: transports=%s timeout_ms=%d auth=%s tls=%s\n",
         cfg.transports ? cfg.transports : "(all)", timeout_ms, cfg.auth_token ? "set" : "none",
         getenv("HIXL_TLS") ? getenv("HIXL_TLS") : "unset");
  printf("\nconnection\n");
  hixl_ctx_t *ctx;
  if (hixl_ctx_create(&cfg, &ctx) != HIXL_OK) {
    say("FAIL", NULL, "hixl_ctx_create: %s", hixl_last_error());
    printf("\n%d problem(s), %d warning(s)\n", n_fail, n_warn);
    return 1;
  }
  char mine[128];
  snprintf(mine, sizeof(mine), "%s", hixl_ctx_transports(ctx));
  hixl_peer_t *peer;
  int64_t t0 = now_ns();
  hixl_status_t st = hixl_connect(ctx, addr, timeout_ms, &peer);
  if (st != HIXL_OK) {
    /* The status's name only: "peer lost" would mislead for a refusal. */
    const char *name = hixl_strerror(st);
    say("FAIL", connect_fix(st), "hixl_connect: %s (%.*s)", hixl_last_error(),
        (int)strcspn(name, ":"), name);
    hixl_ctx_destroy(ctx);
    printf("\n%d problem(s), %d warning(s)\n", n_fail, n_warn);
    return 1;
  }
  const char *chosen = hixl_peer_transport(peer);
  say("ok", NULL, "connected in %.1f ms; transport %s (this side offers %s, in that order)",
      (double)(now_ns() - t0) / 1e6, chosen, mine);
  /* Every transport hixl knows, this side's first: a transport this build
   * lacks or this machine cannot offer says so. */
  char names[256], seen[256] = "";
  snprintf(names, sizeof(names), "%s,self,shm,verbs,fabric", mine);
  for (char *save = NULL, *n = strtok_r(names, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
    if (strcmp(n, chosen) == 0 || listed(seen, n))
      continue;
    snprintf(seen + strlen(seen), sizeof(seen) - strlen(seen), "%s%s", seen[0] ? "," : "", n);
    try_transport(&cfg, n, addr, timeout_ms);
  }

  printf("\nround trip\n");
  /* Room 0: one STATS message and its reply (the count only), so each
   * sample is one control round trip through the target's control thread. */
  enum { N_RTT = 10 };
  int64_t t[N_RTT];
  int got = 0;
  for (; got < N_RTT; got++) {
    size_t n = 0;
    int64_t s0 = now_ns();
    if ((st = hixl_peer_remote_stats(peer, NULL, &n, timeout_ms)) != HIXL_OK)
      break;
    t[got] = now_ns() - s0;
  }
  if (got < N_RTT) {
    say("FAIL", NULL, "hixl_peer_remote_stats: %s", hixl_last_error());
  } else {
    double mn, med;
    min_median_us(t, N_RTT, &mn, &med);
    say("ok", NULL,
        "control round trip (hixl_peer_remote_stats, %d times): min %.1f us, median %.1f us", N_RTT,
        mn, med);
  }

  printf("\ndata\n");
  data_check(peer, timeout_ms);
  hixl_disconnect(peer);
  hixl_ctx_destroy(ctx);
  printf("\n%d problem(s), %d warning(s)\n", n_fail, n_warn);
  return n_fail ? 1 : 0;
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

  check_devices();
  bool rdma = check_rdma();
  check_fabric(rdma);
  printf("\nthis machine\n");
  check_memlock(rdma);
  check_cma();
  check_shm_dir();
  printf("\n%d problem(s), %d warning(s)\n", n_fail, n_warn);
  return n_fail ? 1 : 0;
}

int main(int argc, char **argv)
{
  const char *addr = NULL, *peer = NULL, *listen = NULL;
  bool serving = false;
  double watch_s = 0, for_s = 0;
  int timeout_ms = 10000, modes = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--stats") == 0 && i + 1 < argc)
      addr = argv[++i], modes++;
    else if (strcmp(argv[i], "--peer") == 0 && i + 1 < argc)
      peer = argv[++i], modes++;
    else if (strcmp(argv[i], "--serve") == 0) {
      serving = true, modes++;
      if (i + 1 < argc && argv[i + 1][0] != '-')
        listen = argv[++i];
    } else if (strcmp(argv[i], "--watch") == 0 || strcmp(argv[i], "--for") == 0) {
      bool watch = argv[i][2] == 'w';
      double v = 1;
      if (!watch && (i + 1 >= argc || argv[i + 1][0] == '-')) /* --for needs its SECONDS */
        return usage();
      if (i + 1 < argc && argv[i + 1][0] != '-') {
        char *end;
        v = strtod(argv[++i], &end);
        if (*end || v < (watch ? 0.1 : 0.001) || v > (watch ? 3600 : 31 * 86400))
          return usage();
      }
      *(watch ? &watch_s : &for_s) = v;
    } else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 3600000)
        return usage();
      timeout_ms = (int)v;
    } else
      return usage();
  }
  if (modes > 1 || (addr == NULL && watch_s > 0) || (!serving && for_s > 0))
    return usage();
  if (serving)
    return serve(listen, for_s);
  if (peer)
    return peer_check(peer, timeout_ms);
  return addr ? stats(addr, watch_s, timeout_ms) : info();
}

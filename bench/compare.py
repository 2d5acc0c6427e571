#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""hixl beside its peers, in one run on one machine.

For every operation and size it measures, interleaved round by round (the
machines here drift by 10-30% within minutes, so only figures from the same
round are compared):

  memcpy  single-thread memcpy of the same size (hixl-perf measures it in the
          same process, beside its own figure): the limit;
  hixl    tools/hixl-perf over shm (target memory from hixl_mem_alloc);
  ucx     ucx_perftest (Debian's ucx-utils) with UCX_TLS=sm;
  mpi     Open MPI one-sided (osc/sm: MPI_Put/MPI_Get + MPI_Win_flush,
          MPI_Fetch_and_op, MPI_Compare_and_swap) and two-sided
          (MPI_Send/MPI_Recv), bench/mpi_rma.c.

It prints one table per operation with the ratios, writes everything to
OUT/results.json and one chart per operation (gnuplot) to OUT/*.png, and a
verdict per target of issue #5.  Every figure is the median over --rounds.

  bench/compare.py [--build build] [--out bench-out] [--rounds 3] [--quick]
                   [--sizes 8,4k,64m] [--report OUT/samples.json] [--verbs]

Processes are pinned as shared/BASELINES.md did: initiators on CPU 1,
targets on CPU 0 (hixl-perf --cpus, taskset for UCX, --bind-to core for MPI).
libfabric's shm provider is not compared: Debian packages no fabtests (only
fi_pingpong, a two-sided test).  Verbs beside perftest is
bench/verbs-vs-perftest.sh (inside the Soft-RoCE guest); --verbs runs it.
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, timeout=300, env=None):
    """Run cmd; its stdout, or None (with the reason logged) on failure."""
    e = dict(os.environ)
    e.update(env or {})
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout, env=e, text=True)
    except subprocess.TimeoutExpired:
        log("  timeout:", " ".join(cmd))
        return None
    except FileNotFoundError:
        log("  not found:", cmd[0])
        return None
    if p.returncode != 0:
        log("  failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-800:]))
        return None
    return p.stdout


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def size_str(s):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if s >= 1 << shift and s % (1 << shift) == 0:
            return "%d%s" % (s >> shift, unit)
    return str(s)


# ------------------------------------------------------------------ hixl

def hixl(build, test, size, extra=(), iters=None):
    """One hixl-perf run: its single result row as a dict (or None)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as jf:
        cmd = [os.path.join(build, "tools", "hixl-perf"), "-t", test, "-s", str(size),
               "--cpus", "1,0", "--json", jf.name] + list(extra)
        if iters:
            cmd += ["-n", str(iters)]
        if run(cmd, timeout=600) is None:
            return None
        with open(jf.name) as f:
            return json.load(f)["results"][0]


# ------------------------------------------------------------------- ucx

def ucx(test, size, iters):
    """ucx_perftest server pinned to CPU 0, client to CPU 1, UCX_TLS=sm.
    Returns {p50_us, avg_us, gbps, mops} (bandwidth in decimal GB/s)."""
    if shutil.which("ucx_perftest") is None:
        return None
    port = str(free_port())
    env = dict(os.environ, UCX_TLS="sm")
    srv = subprocess.Popen(["taskset", "-c", "0", "ucx_perftest", "-p", port],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        out = None
        for _ in range(20):  # until the server listens
            time.sleep(0.1)
            out = run(["taskset", "-c", "1", "ucx_perftest", "127.0.0.1", "-p", port, "-t", test,
                       "-s", str(size), "-n", str(iters), "-w", str(min(iters, 1000)), "-f"],
                      timeout=300, env={"UCX_TLS": "sm"})
            if out is not None:
                break
    finally:
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
    if out is None:
        return None
    for line in reversed(out.splitlines()):
        f = line.split()
        if len(f) >= 8 and all(re.match(r"^[0-9.]+$", x) for x in f[-8:]):
            n, p50, avg, _, mbs, _, rate, _ = (float(x) for x in f[-8:])
            return {"p50_us": p50, "avg_us": avg, "gbps": mbs * 1048576 / 1e9,
                    "mops": rate / 1e6}
    return None


# ------------------------------------------------------------------- mpi

def mpi_build(out):
    if shutil.which("mpicc") is None or shutil.which("mpirun") is None:
        log("no mpicc/mpirun: MPI is left out (apt-get install openmpi-bin libopenmpi-dev)")
        return None
    exe = os.path.join(out, "mpi_rma")
    if run(["mpicc", "-O2", "-o", exe, os.path.join(ROOT, "bench", "mpi_rma.c")]) is None:
        return None
    return exe


def mpi(exe, sizes):
    """All MPI figures of one round: {(op, size): {p50_us, gbps, mops}}."""
    if exe is None:
        return {}
    cmd = ["mpirun", "-np", "2", "--bind-to", "core", "--mca", "osc", "sm",
           "--mca", "btl", "self,vader", exe, ",".join(str(s) for s in sizes)]
    if os.geteuid() == 0:
        cmd[1:1] = ["--allow-run-as-root"]
    out = run(cmd, timeout=900, env={"OMPI_MCA_rmaps_base_oversubscribe": "1"})
    res = {}
    for line in (out or "").splitlines():
        f = line.split()
        if len(f) == 6 and f[0] == "mpi":
            res[(f[1], int(f[2]))] = {"p50_us": float(f[3]), "gbps": float(f[4]),
                                      "mops": float(f[5])}
    return res


# ---------------------------------------------------------------- driver

def iters_for(size, quick):
    """About 256 MiB moved per size, at least 64 operations (a 64 MiB copy
    takes 7 ms here: fewer make a run of 20 a hostage to one hiccup)."""
    n = ((16 if quick else 256) << 20) // size
    return max(20 if quick else 64, min(n, 2000 if quick else 200000))


def parse_sizes(text):
    out = []
    for t in text.split(","):
        t = t.strip().lower()
        mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(t[-1:], 1)
        out.append(int(t.rstrip("kmg")) * mult)
    return out


def median(vals):
    v = [x for x in vals if x is not None]
    return statistics.median(v) if v else None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-out"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="few sizes and iterations")
    ap.add_argument("--sizes", help="comma-separated sizes (k/m/g), instead of 8 B .. 64 MiB")
    ap.add_argument("--report", metavar="SAMPLES_JSON",
                    help="no measuring: print the tables and charts of an earlier run")
    ap.add_argument("--verbs", action="store_true",
                    help="also run bench/verbs-vs-perftest.sh in the Soft-RoCE guest")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.report:
        with open(a.report) as f:
            saved = json.load(f)
        samples = {(x["op"], x["size"]): x["samples"] for x in saved}
        a.rounds = max(len(v) for x in saved for v in x["samples"].values())
        report(samples, sorted({x["size"] for x in saved if "bandwidth" in x["op"]
                                and "batch" not in x["op"]}), a)
        return
    sizes = parse_sizes(a.sizes) if a.sizes else [8, 4096, 65536, 1 << 20] if a.quick else \
        [8, 64, 512, 4096, 65536, 1 << 20, 16 << 20, 64 << 20]
    mpi_exe = mpi_build(a.out)
    log("sizes %s, %d rounds; every figure a median" % (sizes, a.rounds))

    # samples[(op, size)][who] = [one figure per round]
    samples = {}

    def add(op, size, who, val):
        samples.setdefault((op, size), {}).setdefault(who, []).append(val)

    for r in range(a.rounds):
        log("round %d/%d" % (r + 1, a.rounds))
        m = mpi(mpi_exe, sizes)
        for s in sizes:
            n = iters_for(s, a.quick)
            for op, ucx_test in (("put", "ucp_put_bw"), ("get", "ucp_get")):
                h = hixl(a.build, op, s, ["--bw"], n)
                u = ucx(ucx_test, s, n)
                add(op + " bandwidth", s, "hixl", h and h["gbps"])
                add(op + " bandwidth", s, "memcpy", h and h["memcpy_gbps"])
                add(op + " bandwidth", s, "ucx", u and u["gbps"])
                add(op + " bandwidth", s, "mpi", (m.get((op, s)) or {}).get("gbps"))
            add("send/recv bandwidth", s, "mpi", (m.get(("sendrecv", s)) or {}).get("gbps"))
            u = ucx("tag_bw", s, n)
            add("send/recv bandwidth", s, "ucx", u and u["gbps"])
        n = 2000 if a.quick else 20000
        # Latency, 8 B: the ping-pong (ucp_put_lat's and ib_write_lat's method)
        # and one op + completion (MPI put + flush).
        h = hixl(a.build, "putpoll", 8, [], n)
        u = ucx("ucp_put_lat", 8, n)
        add("put latency (ping-pong)", 8, "hixl", h and h["p50_us"])
        add("put latency (ping-pong)", 8, "ucx", u and u["p50_us"])
        # A notification each way: put_imm against UCX's active message
        # (ucp_am_lat: the receiver's handler runs on arrival), issue 14.
        h = hixl(a.build, "pingpong", 8, [], n)
        u = ucx("ucp_am_lat", 8, n)
        add("notification latency (ping-pong)", 8, "hixl", h and h["p50_us"])
        add("notification latency (ping-pong)", 8, "ucx", u and u["p50_us"])
        h = hixl(a.build, "put", 8, ["--lat"], n)
        add("put latency (op + completion)", 8, "hixl", h and h["p50_us"])
        add("put latency (op + completion)", 8, "mpi", (m.get(("put", 8)) or {}).get("p50_us"))
        for op, ucx_test in (("faa", "ucp_fadd"), ("cas", "ucp_cswap")):
            h = hixl(a.build, op, 8, ["--lat"], n)
            u = ucx(ucx_test, 8, n)
            add(op + " latency", 8, "hixl", h and h["p50_us"])
            add(op + " latency", 8, "ucx", u and u["p50_us"])
            add(op + " latency", 8, "mpi", (m.get((op, 8)) or {}).get("p50_us"))
        # put_batch: 1024 scattered 16 KiB blocks vs one put of the same bytes.
        h = hixl(a.build, "put_batch", 16384, ["--bw", "-b", "1024"], 20 if a.quick else 100)
        add("put_batch 1024 x 16 KiB", 16384 * 1024, "hixl batch", h and h["gbps"])
        add("put_batch 1024 x 16 KiB", 16384 * 1024, "hixl one put", h and h["contig_gbps"])

    with open(os.path.join(a.out, "samples.json"), "w") as f:
        json.dump([{"op": op, "size": s, "samples": w} for (op, s), w in samples.items()], f)
    report(samples, sizes, a)


def report(samples, sizes, a):
    table = {}
    for (op, s), who in samples.items():
        table.setdefault(op, {})[s] = {k: median(v) for k, v in who.items()}
    res = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "host": os.uname().nodename, "rounds": a.rounds, "ops": {}}
    verdicts = []
    print("# hixl beside memcpy, UCX (sm) and Open MPI (osc/sm, vader); medians of %d rounds"
          % a.rounds)
    for op, rows in table.items():
        lower = "latency" in op
        cols = [c for c in ("memcpy", "hixl", "hixl batch", "hixl one put", "ucx", "mpi")
                if any(c in v for v in rows.values())]
        unit = "us (p50)" if lower else "GB/s"
        print("\n## %s (%s)" % (op, unit))
        hdr = "%8s" % "size" + "".join("%13s" % c for c in cols)
        ref = "hixl" if "hixl" in cols else "hixl batch" if "hixl batch" in cols else None
        others = [c for c in cols if ref and c != ref]
        hdr += "".join("%14s" % ("%s/%s" % (ref.split()[-1], o.split()[-1])) for o in others)
        print(hdr)
        res["ops"][op] = []
        for s in sorted(rows):
            v = rows[s]
            line = "%8s" % size_str(s)
            for c in cols:
                line += "%13s" % ("-" if v.get(c) is None else "%.4g" % v[c])
            for o in others:
                ok = v.get(ref) is not None and v.get(o)
                line += "%14s" % ("%.2f" % (v[ref] / v[o]) if ok else "-")
            print(line)
            res["ops"][op].append(dict(size=s, **{k: x for k, x in v.items() if x is not None}))
    # Issue #5's targets.  The ratio of each round's two figures (measured
    # seconds apart), then the median of those: drift between rounds cancels.
    def get(op, s, who):
        return (table.get(op, {}).get(s) or {}).get(who)

    def ratio(op, s, a_, b_):
        w = samples.get((op, s), {})
        rs = [x / y for x, y in zip(w.get(a_, []), w.get(b_, [])) if x and y]
        return statistics.median(rs) if rs else None

    def target(name, r, ok):
        if r is not None:
            verdicts.append((name, r, ok(r)))
    for op in ("put bandwidth", "get bandwidth"):
        for s in sizes:
            if s >= 65536:
                target("%s %s >= 0.9 x memcpy" % (op, size_str(s)),
                       ratio(op, s, "hixl", "memcpy"), lambda r: r >= 0.9)
            target("%s %s >= UCX" % (op, size_str(s)), ratio(op, s, "hixl", "ucx"),
                   lambda r: r >= 1.0)
    for op in ("put latency (ping-pong)", "notification latency (ping-pong)", "faa latency",
               "cas latency"):
        target("%s <= UCX" % op, ratio(op, 8, "hixl", "ucx"), lambda r: r <= 1.0)
    target("put_batch 1024 x 16 KiB >= 0.8 x one put",
           ratio("put_batch 1024 x 16 KiB", 16 << 20, "hixl batch", "hixl one put"),
           lambda r: r >= 0.8)
    print("\n## one-sided vs two-sided (the seeds' headline)")
    print("%8s %14s %14s %14s %12s %12s" % ("size", "hixl put", "MPI send/recv", "UCX tag",
                                             "hixl/MPI", "hixl/UCX"))
    for s in sizes:
        h = get("put bandwidth", s, "hixl")
        m2, u2 = get("send/recv bandwidth", s, "mpi"), get("send/recv bandwidth", s, "ucx")
        print("%8s %14s %14s %14s %12s %12s" % (
            size_str(s), "%.4g" % h if h else "-", "%.4g" % m2 if m2 else "-",
            "%.4g" % u2 if u2 else "-", "%.2fx" % (h / m2) if h and m2 else "-",
            "%.2fx" % (h / u2) if h and u2 else "-"))
    print("\n## targets (issue #5): median over rounds of the ratio within each round")
    for name, ratio, ok in verdicts:
        print("%-52s %6.2f  %s" % (name, ratio, "met" if ok else "NOT MET"))
    res["targets"] = [{"target": n, "ratio": r, "met": ok} for n, r, ok in verdicts]
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    charts(res, a.out)
    if a.verbs:
        out = run([os.path.join(ROOT, "tests", "rxe", "rxe-run"), "--cache",
                   os.path.join(a.build, "rxe-cache"), "--share", ROOT, "--",
                   os.path.join(ROOT, "bench", "verbs-vs-perftest.sh"), a.build], timeout=3600)
        print("\n## verbs over Soft-RoCE beside perftest\n" + (out or "(the guest run failed)"))
    log("results: %s/results.json and charts %s/*.png" % (a.out, a.out))


def gnuplot(script):
    if run(["gnuplot", "-e", script]) is None:  # no cairo: the plain png terminal
        run(["gnuplot", "-e", script.replace("pngcairo", "png")])


def charts(res, out):
    """One PNG per swept operation (every column against size, log-log) and
    one bar chart of the single-size ones (the 8-byte latencies)."""
    if shutil.which("gnuplot") is None:
        log("no gnuplot: no charts (apt-get install gnuplot-nox)")
        return
    single = [(op, rows[0]) for op, rows in res["ops"].items()
              if len(rows) == 1 and "latency" in op]
    if single:
        dat = os.path.join(out, "latency.dat")
        with open(dat, "w") as f:
            for op, r in single:
                f.write('"%s" %s\n' % (op.replace(" latency", ""), " ".join(
                    str(r.get(c, "NaN")) for c in ("hixl", "ucx", "mpi"))))
        gnuplot("set terminal pngcairo size 900,540; set output '%s';"
                "set style data histograms; set style histogram clustered; set style fill solid;"
                "set grid ytics; set ylabel 'us (p50)'; set yrange [0:*];"
                "set title '8-byte latencies (same run, medians; lower is better)';"
                "plot '%s' using 2:xtic(1) title 'hixl', '' using 3 title 'ucx',"
                " '' using 4 title 'mpi'" % (os.path.join(out, "latency.png"), dat))
    for op, rows in res["ops"].items():
        if len(rows) < 2:
            continue
        cols = [c for c in ("memcpy", "hixl", "ucx", "mpi") if any(c in r for r in rows)]
        name = re.sub(r"[^a-z0-9]+", "-", op.lower()).strip("-")
        dat = os.path.join(out, name + ".dat")
        with open(dat, "w") as f:
            for r in rows:
                f.write("%d %s\n" % (r["size"], " ".join(
                    str(r[c]) if c in r else "NaN" for c in cols)))
        plot = ", ".join("'%s' using 1:%d with linespoints title '%s'" % (dat, i + 2, c)
                         for i, c in enumerate(cols))
        script = ("set terminal pngcairo size 900,540; set output '%s';"
                  "set logscale xy; set grid; set key left top;"
                  "set xlabel 'bytes'; set ylabel '%s'; set title '%s (same run, medians)';"
                  "plot %s" % (os.path.join(out, name + ".png"),
                               "us" if "latency" in op else "GB/s", op, plot))
        gnuplot(script)


if __name__ == "__main__":
    main()

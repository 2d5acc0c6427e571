#!/usr/bin/env python3
"""What a call costs from Python beside the same call from C, same run.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py [--rounds 7]

Two processes over shm (the target in a child, an alloc region on both
sides, so a put is one memcpy and the call overhead is what is measured):

  put 8 B      : peer.put(buf, rmr, off) in a Python loop (waits for
                 completion, as the C loop does with hixl_req_wait), beside
                 hixl._hixl._bench_put_c, the same hixl_put + hixl_req_wait
                 loop written in C inside the extension (same process, same
                 peer, same buffer);
  put_batch    : peer.put_batch(rows, rmr) with a (1024, 3) uint64 numpy
                 array, beside hixl_put_batch from C on a prebuilt
                 hixl_xfer_t array (_bench_batch_c); per element.
  seed put     : hixl.put()'s module path (_xfer_addr, no request) for 8 B.

Medians over rounds; the difference Python - C is the Python overhead
(targets, docs/python.md: <= 1 us per 8-byte put, <= 50 ns per batch
element).  A benchmark, not a test: nothing is asserted.
"""
import argparse
import os
import statistics
import subprocess
import sys
import textwrap
import time

import numpy as np

import hixl

TARGET = textwrap.dedent("""
    import sys, hixl
    ctx = hixl.Context(transports="shm")
    r = ctx.alloc(64 << 20); r.publish("t")
    print(ctx.address, flush=True)
    sys.stdin.read()
""")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=200000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--block", type=int, default=64)
    a = ap.parse_args()
    t = subprocess.Popen([sys.executable, "-c", TARGET], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    addr = t.stdout.readline().strip()
    ctx = hixl.Context(transports="shm")
    peer = ctx.connect(addr)
    rmr = peer.lookup("t")
    assert peer.transport == "shm"
    src = ctx.alloc(64 << 20)
    small = memoryview(src)[:8]
    blocks = np.arange(a.batch, dtype=np.uint64)
    rows = np.stack([src.address + blocks * a.block, blocks * (2 * a.block),
                     np.full(a.batch, a.block, dtype=np.uint64)], axis=1).astype(np.uint64)
    rows = np.ascontiguousarray(rows)

    def py_put(n):
        put = peer.put
        t0 = time.perf_counter_ns()
        for _ in range(n):
            put(small, rmr, 64)
        return (time.perf_counter_ns() - t0) / n

    def py_seed(n):
        x = hixl._hixl._xfer_addr
        addr_ = src.address
        t0 = time.perf_counter_ns()
        for _ in range(n):
            x(peer, rmr, addr_, 8, 64, False)
        return (time.perf_counter_ns() - t0) / n

    def py_batch(n):
        pb = peer.put_batch
        t0 = time.perf_counter_ns()
        for _ in range(n):
            pb(rows, rmr)
        return (time.perf_counter_ns() - t0) / n

    res = {k: [] for k in ("put_c", "put_py", "seed_py", "batch_c", "batch_py")}
    nb = max(a.iters // a.batch * 4, 200)
    for r in range(a.rounds):
        res["put_c"].append(hixl._hixl._bench_put_c(peer, small, rmr, 64, a.iters))
        res["put_py"].append(py_put(a.iters))
        res["seed_py"].append(py_seed(a.iters))
        ctx.fence()
        res["batch_c"].append(hixl._hixl._bench_batch_c(peer, rows, rmr, nb))
        res["batch_py"].append(py_batch(nb))
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"hixl Python overhead, shm, {a.rounds} rounds (median), same run")
    print(f"{'call':<34}{'C':>12}{'Python':>12}{'Py - C':>12}{'Py / C':>9}")
    print(f"{'put 8 B + wait (ns/call)':<34}{med['put_c']:>12.0f}{med['put_py']:>12.0f}"
          f"{med['put_py'] - med['put_c']:>12.0f}{med['put_py'] / med['put_c']:>9.2f}")
    print(f"{'hixl.put (module API) 8 B (ns)':<34}{med['put_c']:>12.0f}{med['seed_py']:>12.0f}"
          f"{med['seed_py'] - med['put_c']:>12.0f}{med['seed_py'] / med['put_c']:>9.2f}")
    per_c, per_py = med["batch_c"] / a.batch, med["batch_py"] / a.batch
    print(f"{f'put_batch {a.batch} x {a.block} B (ns/elem)':<34}{per_c:>12.1f}{per_py:>12.1f}"
          f"{per_py - per_c:>12.1f}{per_py / per_c:>9.2f}")
    print(f"targets: put overhead <= 1000 ns: {'met' if med['put_py'] - med['put_c'] <= 1000 else 'NOT met'}; "
          f"batch overhead <= 50 ns/elem: {'met' if per_py - per_c <= 50 else 'NOT met'}")
    small.release()
    t.stdin.close()
    t.wait()
    ctx.close()


if __name__ == "__main__":
    main()

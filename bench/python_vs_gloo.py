#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""python_vs_gloo.py: 100 MB from rank 0 to rank 1, hixl one-sided put +
fence from Python (the seed's module API) beside torch.distributed gloo
send/recv of the same tensor, in the same run.  A benchmark, not a test.

Targets on rank 1:
  - an ordinary torch tensor, hixl.register_memory(t.data_ptr(), nbytes)
    of torch.empty(25M float32) (shm: one cross-process copy, CMA);
  - a hixl.alloc region (memfd-backed, mapped by the peer: one memcpy);
  - gloo: dist.recv into an ordinary tensor; rank 0 times dist.send until a
    one-element acknowledgement from rank 1 says the data is there (the
    counterpart of put + fence, which returns once the data has landed).

Each is run --rounds times after one warm-up round (which faults the target's
pages in); the median is printed with GB/s and the gloo/hixl ratio.

    /usr/bin/python3 bench/python_vs_gloo.py                 # spawns the two ranks itself
    /usr/bin/python3 -m torch.distributed.run --redirects 2 --tee 1 \\
        --nproc_per_node 2 --master_port 29500 bench/python_vs_gloo.py
"""
import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import time

import torch


def free_port(avoid=()):
    """A port below the ephemeral range that nobody holds now (bind test)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError):
        low = 32768
    for _ in range(200):
        p = random.randrange(max(1024, low - 12000), low - 1)
        if p in avoid:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", p))
                return p
            except OSError:
                continue
    raise RuntimeError("no free port below the ephemeral range")


def launch(argv):
    """Start the two ranks with torchrun's variables (hixl's world at
    MASTER_PORT; gloo's own rendezvous at a second port)."""
    p1 = free_port()
    p2 = free_port(avoid=(p1,))
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(p1),
                   HIXL_BENCH_GLOO_PORT=str(p2), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv,
                                      env=env))
    rc = 0
    for r, p in enumerate(procs):
        if p.wait() != 0:
            print(f"python_vs_gloo.py: rank {r} failed ({p.returncode})", file=sys.stderr)
            rc = 1
    return rc


def gloo_init():
    import torch.distributed as dist
    if os.environ.get("TORCHELASTIC_RUN_ID"):   # under torchrun: its store, env://
        dist.init_process_group("gloo")
    else:
        port = os.environ.get("HIXL_BENCH_GLOO_PORT") or str(int(os.environ["MASTER_PORT"]) + 1)
        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}",
                                rank=int(os.environ["RANK"]), world_size=2)
    return dist


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=100_000_000, help="message size (default 100 MB)")
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    if "RANK" not in os.environ:
        return launch(sys.argv[1:])
    torch.set_num_threads(1)
    import hixl
    hixl.init()
    rank = hixl.get_rank()
    if hixl.get_world_size() != 2:
        raise SystemExit("python_vs_gloo.py: needs exactly 2 ranks")
    n = a.bytes // 4
    nbytes = 4 * n
    # Region 0: an ordinary tensor (the source on rank 0, the target on rank 1);
    # region 1: a hixl.alloc region of the same size.
    t = torch.empty(n) if rank else torch.arange(n, dtype=torch.float32)
    assert hixl.register_memory(t.data_ptr(), nbytes) == 0
    mem = hixl.alloc(nbytes)
    assert mem.index == 1
    hixl.barrier()
    results = {}
    for name, region in (("hixl put + fence -> registered torch tensor", 0),
                         ("hixl put + fence -> hixl.alloc region (memfd)", 1)):
        times = []
        for i in range(a.rounds + 1):
            hixl.barrier()
            if rank == 0:
                t0 = time.perf_counter()
                hixl.put(dst_rank=1, src_addr=t.data_ptr(), dst_addr=0, size=nbytes,
                         region=region)
                hixl.fence()
                if i:
                    times.append(time.perf_counter() - t0)
        hixl.barrier()
        if rank == 1:   # what landed
            got = t if region == 0 else mem.torch(torch.float32)
            if not torch.equal(got, torch.arange(n, dtype=torch.float32)):
                raise SystemExit(f"python_vs_gloo.py: {name}: wrong data")
            del got
        results[name] = times
    dist = gloo_init()
    ack = torch.zeros(1)
    times = []
    for i in range(a.rounds + 1):
        dist.barrier()
        if rank == 0:
            t0 = time.perf_counter()
            dist.send(t, 1)
            dist.recv(ack, 1)
            if i:
                times.append(time.perf_counter() - t0)
        else:
            dist.recv(t, 0)
            dist.send(ack, 0)
    results["gloo send/recv (+ 4-byte ack)"] = times
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        gloo = statistics.median(times)
        print(f"python_vs_gloo.py: {nbytes / 1e6:.0f} MB rank 0 -> rank 1, "
              f"over {hixl.world().peer(1).transport}, median of {a.rounds} rounds "
              f"(min..max)", flush=True)
        for name, ts in results.items():
            m = statistics.median(ts)
            print(f"  {name:<48} {m * 1e3:9.2f} ms ({min(ts) * 1e3:.2f}..{max(ts) * 1e3:.2f}) "
                  f"{nbytes / m / 1e9:7.2f} GB/s   gloo / this: {gloo / m:5.2f}x", flush=True)
    del mem
    hixl.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())

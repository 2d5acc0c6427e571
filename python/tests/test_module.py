"""The seed's module API, exactly as the seed calls it: launched as plain
processes with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, and by torchrun
(whose agent holds MASTER_PORT: the world meets through its store)."""
import os
import random
import socket
import subprocess
import sys
import textwrap

import pytest

import hixl

RANK_SCRIPT = textwrap.dedent(r"""
    import sys, torch, hixl
    hixl.init()
    rank, n = hixl.get_rank(), hixl.get_world_size()
    # region 0: an ordinary tensor (heap memory); region 1: hixl.alloc
    params = torch.full((1024,), float(rank))
    assert hixl.register_memory(params.data_ptr(), params.numel() * 4) == 0
    buf = hixl.alloc(4096)
    assert buf.index == 1 and buf.nbytes == 4096 and buf.address != 0
    hixl.barrier()
    # every rank writes its mark into slot [rank] of every rank's region 1,
    # and reads the next rank's whole region 0 (the seed's get)
    mark = torch.tensor([rank * 10 + 1.0])
    for r in range(n):
        hixl.put(dst_rank=r, src_addr=mark.data_ptr(), dst_addr=rank * 4, size=4, region=1)
    nxt = (rank + 1) % n
    got = torch.empty(1024)
    hixl.get(src_rank=nxt, src_addr=0, dst_addr=got.data_ptr(), size=4096)
    hixl.fence()
    assert torch.all(got == float(nxt)), got[:4]
    hixl.barrier()
    view = buf.torch(torch.float32)[:n]
    assert view.tolist() == [r * 10 + 1.0 for r in range(n)], view
    # the seed's PS pattern: rank 0 pushes new parameters into everyone's region 0
    if rank == 0:
        newp = torch.arange(1024, dtype=torch.float32)
        for r in range(1, n):
            hixl.put(dst_rank=r, src_addr=newp.data_ptr(), dst_addr=0, size=4096)
        hixl.fence()
    hixl.barrier()
    if rank != 0:
        assert torch.equal(params, torch.arange(1024, dtype=torch.float32))
    # a region registered after the last barrier is found on demand
    late = torch.zeros(8)
    assert hixl.register_memory(late.data_ptr(), 32) == 2
    hixl.world().barrier()                 # a plain world barrier: no directory read
    one = torch.ones(1)
    hixl.put((rank + 1) % n, one.data_ptr(), 4 * rank, 4, region=2)
    hixl.fence()
    hixl.world().barrier()
    assert late[(rank - 1) % n].item() == 1.0, late
    # errors: a region nobody registered, a rank out of range
    try:
        hixl.put(nxt, one.data_ptr(), 0, 4, region=7)
        raise SystemExit("no error for region 7")
    except hixl.NotRegisteredError as e:
        assert "region 7" in str(e)
    try:
        hixl.get(n, 0, one.data_ptr(), 4)
        raise SystemExit("no error for rank n")
    except hixl.InvalidError:
        pass
    del view
    hixl.finalize()
    assert not hixl.is_initialized()
    print(f"rank {rank} of {n} ok", flush=True)
""")


def free_port():
    """A free TCP port below the ephemeral range (so no connection's
    ephemeral port can take it between our check and the bind)."""
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for _ in range(200):
        port = random.randrange(20000, max(20001, lo - 1))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


def test_module_api_single_process():
    r = subprocess.run([sys.executable, "-c", RANK_SCRIPT], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, RANK="0", WORLD_SIZE="1",
                                             MASTER_ADDR="127.0.0.1", MASTER_PORT="1"))
    assert r.returncode == 0 and "rank 0 of 1 ok" in r.stdout, r.stderr


def launch_plain(n, extra_env=None, prefix=()):
    port = free_port()
    procs = []
    for rank in range(n):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), **(extra_env or {}))
        procs.append(subprocess.Popen([*prefix, sys.executable, "-c", RANK_SCRIPT], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=180) for p in procs]
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"rank {rank} of {n} ok" in out, (rank, out, err)


def test_module_api_three_processes():
    launch_plain(3)


def test_module_api_under_torchrun_4_ranks(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    # Debian 12's torch 1.13 on Python 3.11 needs --redirects/--tee (its
    # default hits an enum bug); MASTER_PORT is held by torchrun's agent.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--redirects", "2", "--tee", "1",
           "--nproc_per_node", "4", "--master_port", str(free_port()), str(script)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank} of 4 ok" in r.stdout + r.stderr, r.stdout[-3000:]


def test_module_api_misuse():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import hixl
        try:
            hixl.put(0, 0, 0, 8)
        except hixl.InvalidError as e:
            assert "init" in str(e); print("not initialized:", e)
        hixl.init(rank=0, world_size=1, rendezvous="127.0.0.1:1")
        try:
            hixl.init(rank=0, world_size=1, rendezvous="127.0.0.1:1")
        except hixl.InvalidError as e:
            print("twice:", e)
        hixl.finalize()
        try:
            hixl.finalize()
        except hixl.InvalidError as e:
            print("finalized:", e)
    """)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [l.split(":")[0] for l in r.stdout.splitlines()] == ["not initialized", "twice",
                                                                 "finalized"]


def test_module_api_where_cma_is_refused():
    # Ordinary tensors registered by address are heap memory, which shm
    # reaches with process_vm_writev/readv; Yama (ptrace_scope 1), seccomp
    # profiles and containers refuse that between sibling ranks.  Under
    # tests/cma/no-cma (a seccomp filter making both calls fail with EPERM)
    # the same ranks must work through the owner's copies.
    no_cma = os.path.join(os.environ.get("HIXL_BUILD_DIR", "build"), "tests", "cma", "no-cma")
    assert os.access(no_cma, os.X_OK), f"{no_cma} was not built"
    launch_plain(3, prefix=(no_cma,))

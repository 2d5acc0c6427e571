"""Elastic worlds from Python: a rank's process is killed in the middle of
its steps, a new one comes back as the same rank, and the others go on
(World.wait_rank, World.peer returning the new Peer)."""
import os
import subprocess
import sys
import textwrap

from test_module import free_port

RANK = textwrap.dedent(r"""
    import os, signal, sys, hixl
    rank, inc, rdv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    w = hixl.World(rank, 3, rdv)
    ctx = w.context
    reg = ctx.alloc(4096)
    mem = memoryview(reg)
    def steps(rmrs, n, die_at=None):
        p0 = w.peer(0)
        for i in range(n):
            p0.put(bytes([rank * 16 + i % 16]) * 512, rmrs[0], 512 * rank)
            p0.faa(rmrs[0], 8 * (4 + rank), 1)
            if die_at is not None and i + 1 == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
    if inc == 2:                                  # came back: joins the running world
        steps(w.exchange(reg), 40)
        w.barrier(); w.barrier()
        print("ok", flush=True); sys.exit(0)
    rmrs = w.exchange(reg)
    w.barrier()
    if rank:
        steps(rmrs, 40, die_at=10 if rank == 2 else None)
    old = w.peer(2)
    try:
        w.barrier()
        raise SystemExit("barrier passed without rank 2")
    except hixl.PeerLostError as e:
        assert "rank 2 is lost" in str(e), e
    back = w.wait_rank(2, timeout_ms=30000)
    assert back is w.peer(2) and back is not old and w.peers[2] is back
    try:
        old.put(b"x", rmrs[2], 0)
        raise SystemExit("put through the old peer passed")
    except hixl.PeerLostError:
        pass
    again = w.exchange(reg)
    w.barrier()                                   # rank 2's steps are done
    if rank == 0:
        import struct
        c = struct.unpack_from("<QQQ", mem, 8 * 4)
        assert c == (0, 40, 10 + 40), c
        assert bytes(mem[1024:1536]) == bytes([2 * 16 + 39 % 16]) * 512
    w.barrier()
    print("ok", flush=True)
""")


def test_rank_dies_and_comes_back():
    rdv = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, HIXL_TIMEOUT_MS="5000")

    def start(rank, inc):
        return subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(inc), rdv], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [start(r, 1) for r in range(3)]
    out, err = procs[2].communicate(timeout=120)
    assert procs[2].returncode == -9, (out, err)   # killed itself after 10 steps
    procs[2] = start(2, 2)
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", (r, out, err)

"""Elastic worlds from Python: a rank's process is killed in the middle of
its steps, a new one comes back as the same rank, and the others go on
(World.wait_rank, World.peer returning the new Peer).  Rank 0 serving the
rendezvous by listening (then it must stay up), and torchrun's store (then
rank 0 itself may come back)."""
import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest

from test_module import free_port

# Rank 0 is a parameter server: workers put a 512-byte gradient into their
# slot of its region and count their steps with an FAA.  The victim dies
# after a few steps (rank 0: right after the first barrier).
RANK = textwrap.dedent(r"""
    import os, signal, struct, sys, hixl
    rank, inc, victim, rdv = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    w = hixl.World(rank, 3, rdv)
    reg = w.context.alloc(4096)
    mem = memoryview(reg)
    def steps(rmrs, n, die_at=None):
        p0 = w.peer(0)
        for i in range(n):
            p0.put(bytes([rank * 16 + i % 16]) * 512, rmrs[0], 512 * rank)
            p0.faa(rmrs[0], 8 * (4 + rank), 1)
            if i + 1 == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
    def check():                                  # at rank 0, once every step is done
        c = struct.unpack_from("<QQQ", mem, 8 * 4)
        want = (0, 40, 50) if victim == 2 else (0, 40, 40)
        assert c == want, (c, want)
        for r in (1, 2):
            assert bytes(mem[512 * r:512 * r + 512]) == bytes([r * 16 + 39 % 16]) * 512, r
    if inc == 2:                                  # came back: joins the running world
        rmrs = w.exchange(reg)
        if rank:
            steps(rmrs, 40)
        w.barrier()
        if rank == 0:
            check()
        w.barrier()
        print("ok", flush=True); sys.exit(0)
    rmrs = w.exchange(reg)
    w.barrier()
    if rank == victim == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    if rank and victim == 2:
        steps(rmrs, 40, die_at=10 if rank == 2 else None)
    old = w.peer(victim)
    try:
        w.barrier()
        raise SystemExit("barrier passed without the victim")
    except hixl.PeerLostError as e:
        assert f"rank {victim} is lost" in str(e), e
    back = w.wait_rank(victim, timeout_ms=30000)
    assert back is w.peer(victim) and back is not old and w.peers[victim] is back
    try:
        old.put(b"x", rmrs[victim], 0)
        raise SystemExit("put through the old peer passed")
    except hixl.PeerLostError:
        pass
    rmrs[victim].release()                        # then the old peer, no longer the world's,
    old.close()                                   # is ours to close, and its handle goes
    again = w.exchange(reg)
    if rank and victim == 0:
        steps(again, 40)
    w.barrier()                                   # every step done
    if rank == 0:
        check()
    w.barrier()
    print("ok", flush=True)
""")


def run_world(victim, rdv, env):
    def start(rank, inc):
        return subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(inc), str(victim),
                                 rdv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    procs = [start(r, 1) for r in range(3)]
    out, err = procs[victim].communicate(timeout=120)
    assert procs[victim].returncode == -9, (out, err)   # killed itself
    procs[victim] = start(victim, 2)
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", (r, out, err)


def test_worker_comes_back_listening():
    run_world(2, f"127.0.0.1:{free_port()}", dict(os.environ, HIXL_RENDEZVOUS="listen"))


@pytest.mark.parametrize("victim", [2, 0])
def test_rank_comes_back_through_the_store(victim):
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=60), wait_for_workers=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    env.update(HIXL_RENDEZVOUS="store")
    run_world(victim, f"127.0.0.1:{store.port}", env)
    # the victim put its generation count back: its next world meets the others'
    for r in range(3):
        assert store.get(f"hixl/world/-/0/gen/{r}") == b"1", r

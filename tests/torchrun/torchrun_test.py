#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Programs launched by torchrun, as a user would:

    python3 -m torch.distributed.run --redirects 2 --tee 1 --master_port P \
        --no_python --nproc_per_node 4 PROGRAM ARGS...

torchrun's agent holds MASTER_PORT with its own TCPStore, so hixl's world
must rendezvous through that store.  Each rank runs under
rank-status.sh, which leaves its exit status in a file: every rank's status
is checked, besides torchrun's own.  Usage:

    torchrun_test.py CASE BUILD_DIR SOURCE_DIR

Cases: ps_train, ps_train-direct (no wrapper: the command line of
docs/examples.md), worlds (three worlds in one job, two alive at once),
absent (one rank never joins: the others get TIMEOUT naming it),
store-override (no torchrun: HIXL_RENDEZVOUS=store and a TCPStore started
here).  Exit 77 only when this Python has no torch.
"""
import atexit
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

try:
    import torch.distributed  # noqa: F401
except ImportError:
    print("SKIP: %s has no torch" % sys.executable)
    sys.exit(77)

CASE, BUILD, SRC = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
NPROC = 4
WRAP = os.path.join(SRC, "tests/torchrun/rank-status.sh")
# Each run's status files and logs (its output, printed below, has the logs):
# removed when this test exits, passed or failed.
SDIRS = []
atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in SDIRS])


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def port_is_free(p):
    """Nobody listens on p and it can be bound on every address (as torchrun's store does)."""
    for fam, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(fam, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            s.bind((addr, p))
        except OSError:
            return False
        finally:
            s.close()
    return True


def free_port():
    """A free port below the kernel's ephemeral range, so no connection's
    local port can take it between this check and torchrun's bind (the
    contexts' listeners take ephemeral ports)."""
    lo = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    if lo <= 12000:
        lo = 32768
    rng = random.Random(os.getpid() ^ int(time.time() * 1000))
    for _ in range(2000):
        p = rng.randrange(11000, lo - 1)
        if port_is_free(p):
            return p
    fail("no free port below %d" % lo)


def torchrun(prog, args, env_extra=None, wrap=True, timeout=240):
    """Run prog under torchrun (retrying with another port when the port
    was taken after all); returns (torchrun's status, output, status dir)."""
    for attempt in range(3):
        port = free_port()
        sdir = tempfile.mkdtemp(prefix="hixl-torchrun-")
        SDIRS.append(sdir)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--redirects", "2", "--tee", "1",
               "--log_dir", os.path.join(sdir, "logs"), "--master_port", str(port),
               "--no_python", "--nproc_per_node", str(NPROC)]
        cmd += ([WRAP, sdir] if wrap else []) + [prog] + args
        env = dict(os.environ)
        for k in ("TORCHELASTIC_USE_AGENT_STORE", "HIXL_RENDEZVOUS", "RANK", "WORLD_SIZE",
                  "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        env.update(env_extra or {})
        print("$ " + " ".join(cmd), flush=True)
        t0 = time.time()
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, text=True)
        out = p.stdout
        # Each rank's stderr went to a file (--redirects 2): show them.
        for root, _, files in os.walk(os.path.join(sdir, "logs")):
            for f in sorted(files):
                if f == "stderr.log":
                    text = open(os.path.join(root, f)).read()
                    if text.strip():
                        out += "\n[stderr of rank %s]\n%s" % (os.path.basename(root), text)
        print(out)
        print("torchrun exited %d after %.1f s" % (p.returncode, time.time() - t0), flush=True)
        if p.returncode != 0 and "Address already in use" in out and "hixl_world_create" not in out:
            continue  # the port was taken after all: another one
        return p.returncode, out, sdir
    fail("torchrun could not get a port in 3 tries")


def rank_statuses(sdir):
    got = {}
    for r in range(NPROC):
        f = os.path.join(sdir, "rank-%d.status" % r)
        if not os.path.exists(f):
            fail("rank %d left no exit status (never started, or killed)" % r)
        got[r] = int(open(f).read().strip())
    bad = {r: s for r, s in got.items() if s != 0}
    if bad:
        fail("ranks exited with %s" % bad)
    print("every rank exited 0: %s" % got)


def expect(out, pattern, count=1):
    n = len(re.findall(pattern, out))
    if n < count:
        fail("want %d line(s) matching %r in the output, found %d" % (count, pattern, n))


ps_train = os.path.join(BUILD, "examples/hixl-ps-train")
world_twice = os.path.join(BUILD, "tests/torchrun/world_twice")
ps_args = ["--params", "4096", "--steps", "8"]

if CASE in ("ps_train", "ps_train-direct"):
    rc, out, sdir = torchrun(ps_train, ps_args, wrap=CASE == "ps_train")
    if rc != 0:
        fail("torchrun exited %d" % rc)
    if CASE == "ps_train":
        rank_statuses(sdir)
    expect(out, r"check against the single-process reference: identical, bit for bit")
    expect(out, r"ps_train: 3 workers, 4096 parameters")
elif CASE == "worlds":
    rc, out, sdir = torchrun(world_twice, [])
    if rc != 0:
        fail("torchrun exited %d" % rc)
    rank_statuses(sdir)
    expect(out, r"rank \d: 3 worlds ok", NPROC)
elif CASE == "absent":
    rc, out, sdir = torchrun(world_twice, ["--absent", "3"], {"HIXL_TIMEOUT_MS": "3000"})
    if rc != 0:
        fail("torchrun exited %d" % rc)
    rank_statuses(sdir)
    expect(out, r"TIMEOUT as wanted: hixl_world_create: rank\(s\) 3 of 4 did not join", NPROC - 1)
elif CASE == "store-override":
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=60), wait_for_workers=False)
    procs = []
    for r in range(NPROC):
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("TORCHELASTIC_"):
                del env[k]
        env.update(RANK=str(r), WORLD_SIZE=str(NPROC), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(store.port), HIXL_RENDEZVOUS="store")
        procs.append(subprocess.Popen([world_twice], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    out = ""
    bad = {}
    for r, p in enumerate(procs):
        o, _ = p.communicate(timeout=240)
        out += o
        if p.returncode != 0:
            bad[r] = p.returncode
    print(out)
    if bad:
        fail("ranks exited with %s" % bad)
    expect(out, r"rank \d: 3 worlds ok", NPROC)
    # The keys are where docs/configuration.md says.
    if store.get("hixl/world/-/0/gen/2") != b"3":
        fail("generation counter of rank 2 is %r, want 3" % store.get("hixl/world/-/0/gen/2"))
    t = store.get("hixl/world/-/0/2/table").decode()
    if not re.fullmatch(r"HIXLW 1 [0-9a-f]{8} 4\n(\S+\n){4}", t):
        fail("world table %r" % t)
else:
    fail("unknown case " + CASE)
print("PASS: " + CASE)

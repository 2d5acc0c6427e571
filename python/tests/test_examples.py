# SPDX-License-Identifier: MIT
"""The Python examples at small sizes: examples/ps_train.py under torchrun
(a PS and 3 workers; one-sided and gloo, parameters bit for bit against one
process) and examples/kv_transfer.py (both roles forked, and the two roles
started apart; every KV byte regenerated and compared).

The examples directory is HIXL_EXAMPLES_DIR (meson points it at the source
tree's examples/), else ../../examples from here.  torchrun's port is chosen
below the ephemeral range by a bind test (a port from the ephemeral range can
be taken by any outgoing connection between the test and torchrun's bind),
and a run that still loses its port to somebody is retried on another one.
"""
import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("numpy")

EXAMPLES = Path(os.environ.get("HIXL_EXAMPLES_DIR",
                               Path(__file__).resolve().parents[2] / "examples"))
PY = sys.executable
TIMEOUT = 150  # seconds per run: far above the ~10-30 s these take under load


def free_port():
    """A TCP port below the ephemeral range that nobody holds (bind test)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError):
        low = 32768
    rnd = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(500):
        port = rnd.randrange(max(1024, low - 12000), low - 1)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    pytest.fail("no free port below the ephemeral range")


def run(args, timeout=TIMEOUT, **kw):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env, **kw)
    return p.returncode, p.stdout


def torchrun(script, nproc, *args):
    """Run script under torchrun on a fresh port; retry when the port was lost."""
    for attempt in range(3):
        port = free_port()
        rc, out = run([PY, "-m", "torch.distributed.run", "--redirects", "2", "--tee", "1",
                       "--nproc_per_node", str(nproc), "--master_port", str(port),
                       str(EXAMPLES / script), *args])
        if rc != 0 and re.search(r"address already in use|EADDRINUSE", out, re.I):
            continue
        return rc, out
    return rc, out


def test_ps_train_torchrun():
    rc, out = torchrun("ps_train.py", 4, "--params", "4096", "--steps", "8")
    assert rc == 0, out
    assert "check against the single-process reference: identical, bit for bit" in out, out
    assert re.search(r"one-sided / two-sided: data movement [\d.]+x faster, "
                     r"whole steps [\d.]+x", out), out
    # the training is real: the loss falls
    losses = [float(x) for x in re.findall(r"\]:\s+step\s+\d+\s+loss\s+(\S+)", out)]
    assert len(losses) == 16, out         # 8 steps, one-sided then two-sided
    assert losses[7] < losses[0] and losses[15] == losses[7], out


def test_kv_transfer_forked():
    rc, out = run([PY, str(EXAMPLES / "kv_transfer.py"), "--requests", "12",
                   "--seq-len", "16:200", "--blocks", "128"])
    assert rc == 0, out
    assert re.search(r"every byte of [\d.]+ MiB verified", out), out
    # the transfer timed apart from generating and checking, in every pass
    for what in ("one batch per layer", "one put per block", r"two-sided \(TCP\)"):
        assert re.search(what + r": +[\d.]+ MiB; transfer [\d.]+ ms = [\d.]+ GB/s", out), out
    assert len(re.findall(r"generating [\d.]+ ms \(prefill\), checking [\d.]+ ms \(decode\); "
                          r"end to end [\d.]+ ms = [\d.]+ GB/s", out)) == 3, out
    assert re.search(r"batching gain: [\d.]+x the transfer bandwidth of one put per block",
                     out), out
    assert re.search(r"one-sided / two-sided: transfer [\d.]+x faster", out), out


def test_kv_transfer_roles_apart():
    """--role decode prints its address; --role prefill --connect reaches it."""
    common = ["--requests", "6", "--seq-len", "16:120", "--blocks", "64"]
    dec = subprocess.Popen([PY, str(EXAMPLES / "kv_transfer.py"), "--role", "decode", *common],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines = []
    try:
        deadline = time.monotonic() + 60
        addr = None
        while addr is None and time.monotonic() < deadline:
            line = dec.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.match(r"decode listening at (\S+)", line)
            if m:
                addr = m.group(1)
        assert addr, "".join(lines)
        rc, pout = run([PY, str(EXAMPLES / "kv_transfer.py"), "--role", "prefill",
                        "--connect", addr, *common])
        out, _ = dec.communicate(timeout=TIMEOUT)
        out = "".join(lines) + out
        assert rc == 0, pout
        assert dec.returncode == 0, out
        assert "verified" in out, out
    finally:
        if dec.poll() is None:
            dec.kill()
            dec.wait()


def test_ps_train_onesided_poll_sleep():
    """One-sided alone, waiting by ctx.poll() and a sleep (--poll-sleep-us)."""
    rc, out = torchrun("ps_train.py", 3, "--params", "2000", "--steps", "5", "--mode", "onesided",
                       "--poll-sleep-us", "200")
    assert rc == 0, out
    assert "check against the single-process reference: identical, bit for bit" in out, out
    assert "two-sided" not in out, out

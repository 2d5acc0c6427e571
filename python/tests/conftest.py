"""Shared fixtures of the Python suite (run by meson as suite 'python',
with PYTHONPATH at build/python and Debian's /usr/bin/python3, the
interpreter that has numpy, torch and pytest: docs/python.md)."""
import os
import subprocess
import sys
import textwrap

import pytest

import hixl

# The target process of most tests: publishes an alloc region "kv"
# (1 MiB, all rights), a registered heap region "heap" (numpy, 1 MiB), a
# read-only region "ro" and a write-only "wo"; then answers commands on
# stdin: "peek OFF N" prints hex of kv, "hpeek OFF N" of heap, "notifs"
# prints the notifications received so far, "quit".
TARGET = textwrap.dedent(r"""
    import sys, numpy as np, hixl
    ctx = hixl.Context()
    kv = ctx.alloc(1 << 20)
    kv.publish("kv")
    heap_arr = np.zeros(1 << 20, dtype=np.uint8)
    heap = ctx.register(heap_arr)
    heap.publish("heap")
    ro = ctx.alloc(4096, access=hixl.READ); ro.numpy()[:] = 0x5a; ro.publish("ro")
    wo = ctx.alloc(4096, access=hixl.WRITE); wo.publish("wo")
    kva = kv.numpy()
    print(ctx.address, flush=True)
    seen = []
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "peek":
            o, n = int(cmd[1]), int(cmd[2]); print(kva[o:o + n].tobytes().hex(), flush=True)
        elif cmd[0] == "hpeek":
            o, n = int(cmd[1]), int(cmd[2]); print(heap_arr[o:o + n].tobytes().hex(), flush=True)
        elif cmd[0] == "notifs":
            seen += [(n.imm, n.nbytes) for n in ctx.poll(1024)]
            print(repr(seen), flush=True)
""")


class Target:
    def __init__(self, env=None):
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen([sys.executable, "-c", TARGET], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=e)
        self.address = self.p.stdout.readline().strip()
        assert self.address, "the target process did not start"

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def peek(self, off, n):
        return bytes.fromhex(self.ask(f"peek {off} {n}"))

    def hpeek(self, off, n):
        return bytes.fromhex(self.ask(f"hpeek {off} {n}"))

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.write("quit\n")
                self.p.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


@pytest.fixture
def target():
    t = Target()
    yield t
    t.close()


@pytest.fixture
def ctx():
    c = hixl.Context()
    yield c
    c.close()


@pytest.fixture
def peer(ctx, target):
    p = ctx.connect(target.address)
    yield p
    p.close()


def run_py(code, env=None, timeout=120):
    """Run code in a fresh interpreter (for what is chosen once per process,
    such as the device backend); returns the CompletedProcess."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, text=True,
                          capture_output=True, timeout=timeout)

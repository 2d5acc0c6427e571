"""One exception class per hixl_status_t, each raised by a real failure,
deriving from hixl.Error (with .status) and the matching builtin, with
hixl_last_error() as the message.  Bad input changes nothing."""
import os
import signal
import time

import numpy as np
import pytest

import hixl
from conftest import Target, run_py

CLASSES = [
    (hixl.InvalidError, hixl.ERR_INVALID, ValueError),
    (hixl.NoMemoryError, hixl.ERR_NOMEM, MemoryError),
    (hixl.NotRegisteredError, hixl.ERR_NOT_REGISTERED, LookupError),
    (hixl.AccessError, hixl.ERR_ACCESS, PermissionError),
    (hixl.UnsupportedError, hixl.ERR_UNSUPPORTED, NotImplementedError),
    (hixl.TimeoutError, hixl.ERR_TIMEOUT, TimeoutError),
    (hixl.PeerLostError, hixl.ERR_PEER_LOST, ConnectionError),
    (hixl.TransportError, hixl.ERR_TRANSPORT, OSError),
    (hixl.AuthError, hixl.ERR_AUTH, PermissionError),
    (hixl.AgainError, hixl.ERR_AGAIN, BlockingIOError),
    (hixl.NoDeviceError, hixl.ERR_NO_DEVICE, RuntimeError),
]


@pytest.mark.parametrize("cls,status,builtin", CLASSES)
def test_hierarchy(cls, status, builtin):
    assert issubclass(cls, hixl.Error) and issubclass(cls, builtin)
    assert status < 0 and hixl.strerror(status).startswith("HIXL_ERR_")


def check(excinfo, cls, status, *words):
    e = excinfo.value
    assert type(e) is cls and e.status == status
    msg = str(e)
    for w in words:
        assert w in msg, (w, msg)


def test_invalid(peer):
    kv = peer.lookup("kv")
    with pytest.raises(hixl.InvalidError) as ei:
        peer.put(b"", kv, 0)
    check(ei, hixl.InvalidError, hixl.ERR_INVALID, "hixl_put")
    with pytest.raises(ValueError):
        peer.faa(kv, 3, 1)                      # unaligned atomic
    with pytest.raises(hixl.InvalidError, match="writable"):
        peer.get(b"read-only", kv, 0)           # a get into bytes
    with pytest.raises(hixl.InvalidError, match="nbytes= is required"):
        peer.put(12345, kv, 0)
    with pytest.raises(hixl.InvalidError, match="must be a buffer"):
        peer.put(object(), kv, 0)
    with pytest.raises(hixl.InvalidError, match="shape"):
        peer.put_batch(np.zeros((4, 2), dtype=np.uint64), kv)
    with pytest.raises(hixl.InvalidError, match="32 bits"):
        peer.notify(2**32)
    with pytest.raises(hixl.InvalidError):
        hixl.Context(timeout_ms=0)


def test_not_registered_changes_nothing(peer, target):
    kv = peer.lookup("kv")
    peer.put(b"keep", kv, (1 << 20) - 4)
    with pytest.raises(hixl.NotRegisteredError) as ei:
        peer.put(b"12345", kv, (1 << 20) - 4)   # one byte past the end
    check(ei, hixl.NotRegisteredError, hixl.ERR_NOT_REGISTERED, "outside", str(1 << 20))
    assert target.peek((1 << 20) - 4, 4) == b"keep"
    rows = np.array([[np.zeros(8).ctypes.data, 0, 8], [0, 1 << 40, 8]], dtype=np.uint64)
    with pytest.raises(hixl.NotRegisteredError):
        peer.put_batch(rows, kv)                # the second row is bad: nothing moves
    with pytest.raises(hixl.NotRegisteredError):
        peer.lookup("no-such-region", timeout=0.1)


def test_access(peer, target):
    ro, wo = peer.lookup("ro"), peer.lookup("wo")
    with pytest.raises(hixl.AccessError) as ei:
        peer.put(b"nope", ro, 0)
    check(ei, hixl.AccessError, hixl.ERR_ACCESS)
    with pytest.raises(PermissionError):
        peer.get(bytearray(4), wo, 0)
    with pytest.raises(hixl.AccessError):
        peer.faa(ro, 0, 1)
    buf = bytearray(4)
    peer.get(buf, ro, 0)
    assert buf == b"\x5a" * 4


def test_nomem(ctx):
    with pytest.raises(hixl.NoMemoryError) as ei:
        ctx.alloc(1 << 62)
    check(ei, hixl.NoMemoryError, hixl.ERR_NOMEM, "hixl_mem_alloc")


def test_timeout(ctx):
    with pytest.raises(hixl.TimeoutError) as ei:
        ctx.wait(timeout=0.05)
    check(ei, hixl.TimeoutError, hixl.ERR_TIMEOUT)


def test_peer_lost():
    t = Target()
    c = hixl.Context(timeout_ms=3000)
    try:
        p = c.connect(t.address)
        kv = p.lookup("kv")
        p.put(b"alive", kv, 0)
        os.kill(t.p.pid, signal.SIGKILL)
        t.p.wait()
        # The control thread sees the loss (a closed socket, or the
        # heartbeat bound); until then shm puts still land in the dead
        # target's mapping.  A count of tries raced it on a busy machine
        # (1,000 puts took a millisecond): wait by time, generously.
        deadline = time.monotonic() + 30
        with pytest.raises(hixl.PeerLostError) as ei:
            while time.monotonic() < deadline:
                p.put(b"x" * 8, kv, 0)
                c.fence(p)
                time.sleep(0.001)
        assert ei.value.status == hixl.ERR_PEER_LOST
        assert isinstance(ei.value, ConnectionError)
    finally:
        c.close()
        t.close()


def test_auth():
    t = Target(env={"HIXL_AUTH_TOKEN": "right"})
    try:
        with hixl.Context(auth_token="wrong") as c:
            with pytest.raises(hixl.AuthError) as ei:
                c.connect(t.address, timeout=5)
            check(ei, hixl.AuthError, hixl.ERR_AUTH)
        with hixl.Context(auth_token="right") as c:
            assert c.connect(t.address, timeout=5).transport == "shm"
    finally:
        t.close()


def test_transport():
    with pytest.raises(hixl.TransportError) as ei:
        hixl.Context(listen="192.0.2.77:1")      # not an address of this host
    check(ei, hixl.TransportError, hixl.ERR_TRANSPORT, "listen")


def test_unsupported_and_no_device_in_fresh_processes():
    # The device backend is chosen once per process: fresh interpreters.
    r = run_py("""
        import hixl
        with hixl.Context() as c:
            dev = c.alloc(4096, device=True)
            assert dev.is_device and dev.device == 0
            dev.publish("d")
            me = c.connect(c.address)
            d = me.lookup("d")
            try:
                me.faa(d, 0, 1)
            except hixl.UnsupportedError as e:
                assert e.status == hixl.ERR_UNSUPPORTED and isinstance(e, NotImplementedError)
                print("unsupported:", e)
    """, env={"HIXL_DEVICE": "emulated"})
    assert r.returncode == 0 and "unsupported:" in r.stdout, r.stderr
    r = run_py("""
        import hixl
        with hixl.Context() as c:
            try:
                c.alloc(4096, device=True)
            except hixl.NoDeviceError as e:
                assert e.status == hixl.ERR_NO_DEVICE and isinstance(e, RuntimeError)
                print("no device:", e)
    """, env={"HIXL_DEVICE": "none"})
    assert r.returncode == 0 and "no device:" in r.stdout, r.stderr


def test_again_when_the_target_never_polls(target):
    with hixl.Context(timeout_ms=300) as c:
        p = c.connect(target.address)
        with pytest.raises(hixl.AgainError) as ei:
            for _ in range(1 << 20):
                p.notify(1)
        check(ei, hixl.AgainError, hixl.ERR_AGAIN, "does not poll")


def test_token_length_limit():
    # The token keys the handshake's HMAC (it never travels); 255 bytes, the
    # documented maximum, work end to end; longer is refused at creation.
    with pytest.raises(hixl.InvalidError, match="at most 255"):
        hixl.Context(auth_token="x" * 300)
    tok = "y" * 255
    t = Target(env={"HIXL_AUTH_TOKEN": tok})
    try:
        with hixl.Context(auth_token=tok) as c:
            p = c.connect(t.address, timeout=5)
            p.put(b"token ok", p.lookup("kv"), 0)
            assert t.peek(0, 8) == b"token ok"
    finally:
        t.close()


def test_tiny_call_timeout_does_not_drop_live_peers(target):
    # timeout_ms bounds calls; a peer is declared lost only after a second
    # of silence at least (before, timeout_ms=1 dropped every peer between
    # two heartbeats).
    import time
    with hixl.Context(timeout_ms=1) as c:
        p = c.connect(target.address, timeout=5)
        kv = p.lookup("kv", timeout=5)
        time.sleep(0.5)                       # idle: only heartbeats
        p.put(b"alive", kv, 0)
        c.fence(timeout=5)
        assert target.peek(0, 5) == b"alive"

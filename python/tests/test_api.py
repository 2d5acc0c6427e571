"""Every call of the object API, against a target in another process
(shm), the target checking its own memory."""
import asyncio
import mmap

import numpy as np
import pytest
import torch

import hixl


def test_context_properties(ctx):
    host, port = ctx.address.rsplit(":", 1)
    assert host and int(port) > 0
    assert "self" in ctx.transports and "shm" in ctx.transports
    assert ctx.timeout_ms > 0 and not ctx.closed


def test_context_keywords_and_manager():
    with hixl.Context(listen="127.0.0.1:0", transports="self,shm", timeout_ms=3000,
                      progress_thread=1, auth_token="t0k") as c:
        assert c.address.startswith("127.0.0.1:")
        assert c.transports == ("self", "shm")
        assert c.timeout_ms == 3000
    assert c.closed
    c.close()  # idempotent


def test_context_wait_modes():
    # docs/waiting.md: each mode makes a working context (a notification to
    # ourselves is waited for and taken); any other name is refused.
    for mode in ("adaptive", "spin", "sleep"):
        with hixl.Context(transports="self,shm", wait=mode) as c:
            me = c.connect(c.address)
            me.notify(7)
            n = c.wait(timeout=5)
            assert n.imm == 7, (mode, n)
    with pytest.raises(hixl.InvalidError):
        hixl.Context(wait="busy")


def test_put_get_every_buffer_kind(peer, target):
    kv = peer.lookup("kv")
    peer.put(b"bytes-in", kv, 0)                                   # bytes
    peer.put(bytearray(b"bytearray"), kv, 16)                      # bytearray
    peer.put(memoryview(b"xmemoryview")[1:], kv, 32)               # memoryview slice
    peer.put(np.arange(4, dtype=np.uint16), kv, 48)                # numpy
    peer.put(torch.tensor([1.5, -2.0], dtype=torch.float32), kv, 64)   # torch
    src = np.frombuffer(b"raw-addr", dtype=np.uint8)
    peer.put(src.ctypes.data, kv, 80, nbytes=8)                    # raw address
    peer.put((src.ctypes.data, 8), kv, 96)                         # (address, nbytes)
    peer.put(b"prefix-only", kv, 112, nbytes=6)                    # a prefix
    with mmap.mmap(-1, 4096) as mm:
        mm[:5] = b"mmap!"
        peer.put(mm, kv, 128, nbytes=5)                            # mmap
    assert target.peek(0, 8) == b"bytes-in"
    assert target.peek(16, 9) == b"bytearray"
    assert target.peek(32, 10) == b"memoryview"
    assert target.peek(48, 8) == np.arange(4, dtype=np.uint16).tobytes()
    assert target.peek(64, 8) == np.array([1.5, -2.0], dtype=np.float32).tobytes()
    assert target.peek(80, 8) == b"raw-addr"
    assert target.peek(96, 8) == b"raw-addr"
    assert target.peek(112, 8) == b"prefix\0\0"
    assert target.peek(128, 5) == b"mmap!"
    # gets into every writable kind
    ba = bytearray(8)
    peer.get(ba, kv, 0)
    assert ba == b"bytes-in"
    arr = np.zeros(4, dtype=np.uint16)
    peer.get(arr, kv, 48)
    assert arr.tolist() == [0, 1, 2, 3]
    t = torch.zeros(2)
    peer.get(t, kv, 64)
    assert t.tolist() == [1.5, -2.0]
    raw = np.zeros(8, dtype=np.uint8)
    peer.get(raw.ctypes.data, kv, 80, nbytes=8)
    assert raw.tobytes() == b"raw-addr"


def test_heap_region_cma(peer, target):
    heap = peer.lookup("heap")
    data = np.random.default_rng(1).integers(0, 255, 300000, dtype=np.uint8)
    peer.put(data, heap, 1000)
    assert target.hpeek(1000, 64) == data[:64].tobytes()
    back = np.zeros_like(data)
    peer.get(back, heap, 1000)
    assert np.array_equal(back, data)


def test_large_put_releases_nothing_wrong(peer, target):
    kv = peer.lookup("kv")
    big = np.random.default_rng(2).integers(0, 255, 1 << 20, dtype=np.uint8)
    peer.put(big, kv, 0)
    back = np.empty_like(big)
    peer.get(back, kv, 0)
    assert np.array_equal(big, back)


def test_put_imm_notify_and_notifications(ctx, target):
    p = ctx.connect(target.address)
    kv = p.lookup("kv")
    p.put_imm(b"abcd", kv, 200, imm=7)
    p.notify(8)
    p.put_imm(np.zeros(10, dtype=np.uint8), kv, 300, 9)
    assert target.ask("notifs") == repr([(7, 4), (8, 0), (9, 10)])
    assert target.peek(200, 4) == b"abcd"


def test_notifications_to_us(ctx):
    # The self transport: our own context is both sides.
    reg = ctx.alloc(4096)
    reg.publish("me")
    me = ctx.connect(ctx.address)
    assert me.transport == "self"
    r = me.lookup("me")
    me.put_imm(b"hi", r, 0, imm=41)
    me.notify(42)
    n = ctx.wait(timeout=5)
    assert isinstance(n, hixl.Notification)
    assert (n.imm, n.nbytes) == (41, 2) and n.peer.transport == "self"
    assert [(x.imm, x.nbytes) for x in ctx.poll()] == [(42, 0)]
    assert ctx.poll() == []
    with pytest.raises(hixl.TimeoutError):
        ctx.wait(timeout=0.01)
    assert bytes(memoryview(reg)[:2]) == b"hi"


def test_atomics(peer, target):
    kv = peer.lookup("kv")
    assert peer.faa(kv, 4096, 5) == 0
    assert peer.faa(kv, 4096, 2**64 - 1) == 5      # wraps: adds -1
    assert peer.cas(kv, 4096, 4, 100) == 4
    assert peer.cas(kv, 4096, 4, 7) == 100          # fails: unchanged
    assert int.from_bytes(target.peek(4096, 8), "little") == 100
    req = peer.faa(kv, 4096, 1, wait=False)
    assert req.wait() == 100
    assert peer.cas(kv, 4096, expected=101, desired=0, wait=False).wait() == 101


def test_batches_numpy_and_sequences(peer, target):
    kv = peer.lookup("kv")
    blocks = np.arange(64 * 32, dtype=np.uint8).reshape(64, 32)
    base = blocks.ctypes.data
    rows = np.array([[base + i * 32, 8192 + (63 - i) * 32, 32] for i in range(64)],
                    dtype=np.uint64)
    peer.put_batch(rows, kv, imm=5)
    got = target.peek(8192, 64 * 32)
    assert got == blocks[::-1].tobytes()
    assert target.ask("notifs") == repr([(5, 64 * 32)])
    back = np.zeros_like(blocks)
    rows_back = np.array([[back.ctypes.data + i * 32, 8192 + i * 32, 32] for i in range(64)],
                         dtype=np.int64)      # signed rows are accepted too
    peer.get_batch(rows_back, kv)
    assert np.array_equal(back, blocks[::-1])
    # sequences: (local, offset), (local, rmr, offset), (address, offset, nbytes)
    a, b = bytearray(b"AAAA"), np.frombuffer(b"BBBB", dtype=np.uint8)
    peer.put_batch([(a, 20000), (b"CCCC", kv, 20004), (b.ctypes.data, 20008, 4)], kv)
    assert target.peek(20000, 12) == b"AAAACCCCBBBB"
    out1, out2 = bytearray(4), np.zeros(4, dtype=np.uint8)
    peer.get_batch([(out1, kv, 20004), (out2, 20008)], kv)
    assert out1 == b"CCCC" and out2.tobytes() == b"BBBB"
    req = peer.put_batch(rows, kv, wait=False)
    assert req.wait(timeout=10) is None


def test_requests_and_asyncio(peer, target):
    kv = peer.lookup("kv")
    reqs = [peer.put(bytes([i]) * 64, kv, 64 * i, wait=False) for i in range(16)]
    for r in reqs:
        assert r.wait(5) is None and r.done() and r.status == hixl.OK

    async def main():
        rs = [peer.put(b"z" * 8, kv, 30000 + 8 * i, wait=False) for i in range(8)]
        out = await asyncio.gather(*rs)
        old = await peer.faa(kv, 4096 + 8, 3, wait=False)
        return out, old

    out, old = asyncio.run(main())
    assert out == [None] * 8 and old == 0
    assert target.peek(30000, 64) == b"z" * 64
    ctx = peer.context
    ctx.fence(peer)
    ctx.fence(timeout=5)
    assert ctx.progress() >= 0


def test_pack_unpack_publish(ctx, target):
    other = hixl.Context()
    try:
        reg = other.alloc(8192)
        blob = reg.pack()
        assert isinstance(blob, bytes) and 0 < len(blob) <= hixl.RKEY_MAX
        p = ctx.connect(other.address)
        r = p.unpack(blob)
        p.put(b"unpacked", r, 4000)
        assert bytes(memoryview(reg)[4000:4008]) == b"unpacked"
        assert r.peer == p and not r.released
        r.release()
        assert r.released
        with pytest.raises(hixl.InvalidError):
            p.put(b"x", r, 0)
        reg.publish("late")
        assert p.lookup("late", timeout=2) is not None
        with pytest.raises(hixl.NotRegisteredError):
            p.lookup("never", timeout=0.2)
        p.close()
    finally:
        other.close()


def test_alloc_views_zero_copy(ctx):
    reg = ctx.alloc(1 << 16)
    a = reg.numpy(np.float32)
    t = reg.torch(torch.float32)
    m = memoryview(reg)
    a[3] = 2.5
    assert t[3].item() == 2.5 and m[12:16].tobytes() == np.float32(2.5).tobytes()
    t[4] = -1.0
    assert a[4] == -1.0
    assert reg.numpy(np.uint8, shape=(256, 256)).shape == (256, 256)
    assert reg.torch(torch.float16, shape=(2, -1)).shape == (2, 1 << 14)
    assert a.ctypes.data == reg.address == t.data_ptr()
    assert reg.nbytes == 1 << 16 and len(reg) == 1 << 16 and reg.device == -1
    assert not reg.is_device
    # live views: neither the region nor the context can be closed
    with pytest.raises(BufferError):
        reg.close()
    with pytest.raises(BufferError):
        ctx.close()
    assert not reg.closed and a[3] == 2.5
    del a, t
    m.release()
    reg.close()
    assert reg.closed
    with pytest.raises(hixl.InvalidError):
        reg.numpy()


def test_register_keeps_object_alive_and_pinned(ctx):
    ba = bytearray(4096)
    reg = ctx.register(ba)
    with pytest.raises(BufferError):
        ba.extend(b"x")          # the region holds an export: no resize under it
    assert reg.obj is ba
    reg.close()
    ba.extend(b"x")              # released with the region
    t = torch.ones(16)
    reg = ctx.register(t, access=hixl.READ)
    assert reg.address == t.data_ptr() and reg.nbytes == 64
    reg.close()
    with pytest.raises(hixl.InvalidError):
        ctx.register(torch.ones(4, 4).t())       # not contiguous
    with pytest.raises(hixl.InvalidError):
        ctx.register(b"read-only")               # bytes are not writable (default access)
    ctx.register(b"read-only", access=hixl.READ).close()


def test_world_in_one_process(ctx):
    w = hixl.World(ctx, 0, 1, "127.0.0.1:1")  # size 1: nothing to meet
    assert (w.rank, w.size) == (0, 1)
    me = w.peer(0)
    assert me.transport == "self" and w.peers == (me,)
    w.barrier()
    reg = ctx.alloc(4096)
    (r,) = w.exchange(reg)
    me.put(b"world", r, 0)
    assert bytes(memoryview(reg)[:5]) == b"world"
    with pytest.raises(hixl.InvalidError):
        me.close()          # belongs to the world
    r.release()
    w.close()
    with pytest.raises(hixl.InvalidError):
        w.barrier()
    with pytest.raises(hixl.InvalidError):
        me.put(b"x", r, 0)


def test_module_functions():
    assert hixl.strerror(hixl.ERR_ACCESS).startswith("HIXL_ERR_ACCESS")
    assert hixl.device_backend() in ("cuda", "ascend", "emulated", "none")
    src, dst = b"copy me", bytearray(7)
    hixl.mem_copy(dst, src, 7)
    assert dst == src
    a = np.zeros(4)
    assert hixl.mem_query(a.ctypes.data) == ("host", -1)
    with pytest.raises(hixl.InvalidError):
        hixl.mem_copy(bytearray(2), b"toolong", 7)


def test_world_makes_its_own_context():
    w = hixl.World(0, 1, "127.0.0.1:1")          # the spelling: World(rank, size, rendezvous)
    ctx = w.context
    assert not ctx.closed and w.peer(0).transport == "self"
    w.close()
    assert ctx.closed                             # made by the world, closed with it
    with hixl.Context() as c:
        w = hixl.World(rank=0, size=1, rendezvous="127.0.0.1:1", ctx=c)
        w.close()
        assert not c.closed                       # the caller's: left open
    with pytest.raises(hixl.InvalidError):
        hixl.World(0, 1, "127.0.0.1:1", ctx="not a context")


def test_with_block_left_by_an_exception_keeps_it():
    class Boom(Exception):
        pass
    with pytest.raises(Boom):
        with hixl.Context() as c:
            view = c.alloc(4096).numpy()
            raise Boom()                 # not replaced by the BufferError of `view`
    assert not c.closed and view[0] == 0  # the memory is still there for the view
    del view
    c.close()
    with pytest.raises(hixl.InvalidError, match="C-contiguous"):
        with hixl.Context() as c2:
            me = c2.connect(c2.address)
            reg = c2.alloc(4096)
            reg.publish("r")
            rows = np.zeros((3, 4), dtype=np.uint64)[:, :3]     # strided
            me.put_batch(rows, me.lookup("r"))


def test_numpy_integers_are_addresses_and_offsets(peer, target):
    kv = peer.lookup("kv")
    src = np.frombuffer(b"np-addr!", dtype=np.uint8)
    peer.put(np.uint64(src.ctypes.data), kv, np.int64(40000), nbytes=np.int32(8))
    assert target.peek(40000, 8) == b"np-addr!"       # the memory at the address, not the scalar
    assert peer.faa(kv, np.uint64(40008), np.int8(3)) == 0


def test_stats_dicts(ctx, target):
    # hixl_ctx_stats as dicts: the context's and a peer's, exact for one thread.
    s0 = ctx.stats()
    assert isinstance(s0, dict) and list(s0)[:2] == ["put_ops", "put_bytes"]
    assert all(isinstance(v, int) for v in s0.values())
    p = ctx.connect(target.address)
    kv = p.lookup("kv")
    p.put(b"x" * 100, kv, 0)
    p.get(bytearray(40), kv, 0)
    assert p.faa(kv, 4096, 1) >= 0
    with pytest.raises(hixl.Error):
        p.put(b"y" * 16, kv, (1 << 20) - 8)      # past the region's end
    s = ctx.stats()
    assert s["put_ops"] - s0["put_ops"] == 1 and s["put_bytes"] - s0["put_bytes"] == 100
    assert s["get_ops"] - s0["get_ops"] == 1 and s["get_bytes"] - s0["get_bytes"] == 40
    assert s["atomic_ops"] - s0["atomic_ops"] == 1
    assert s["errors_not_registered"] - s0["errors_not_registered"] == 1
    assert s["connects"] - s0["connects"] == 1 and s["peers"] >= 1
    ps = p.stats()
    assert (ps["put_ops"], ps["put_bytes"], ps["get_bytes"], ps["errors"], ps["up"]) == \
        (1, 100, 40, 1, 1)
    # The target's own counters, asked over the connection: it accepted us.
    rs = p.remote_stats(timeout=10)
    assert list(rs)[:2] == ["put_ops", "put_bytes"] and rs["accepts"] >= 1
    p.close()
    with pytest.raises(hixl.Error):
        p.stats()
    assert ctx.stats()["disconnects"] - s0["disconnects"] == 1


def test_metrics_keyword():
    # Context(metrics="host:port"): hixl_config_t.metrics, scraped by hand.
    import socket
    import urllib.request
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with hixl.Context(transports="self", metrics=f"127.0.0.1:{port}") as c:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b"# TYPE hixl_put_ops_total counter" in body
        assert c.stats()["put_ops"] == 0

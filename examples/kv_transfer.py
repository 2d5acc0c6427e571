#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""kv_transfer.py: prefill -> decode transfer of a paged KV cache held in
torch tensors, with hixl's Python object API (the seeds' example 003).

Decode owns the KV-cache pool, laid out like vLLM's paged attention: one
ctx.alloc region viewed with region.torch() as a tensor of shape
[layers, 2 (K, V), blocks, block_tokens, kv_heads, head_dim], fp16, and
published as "kv_pool".  For each request (a random sequence length) decode
takes free block ids and hands prefill a descriptor {request, length, block
ids} with one put_imm into the slot prefill published for it ("kv_slots").
Prefill "computes" the request's KV layer by layer -- deterministic values
from (request, layer, K/V, token, lane) -- into a registered staging tensor,
and writes each layer's blocks into the pool with ONE peer.put_batch of a
numpy descriptor array (rows: local address, remote offset, length) whose
immediate {slot, layer} tells decode that layer is there; two layers are in
flight.  Decode checks every byte of every block of every layer against a
regenerated copy, and frees the blocks.

After an untimed warm-up pass, the same requests run with one put_batch
per layer, with one peer.put per block and an ORDERED notify per layer, and
two-sided: the same blocks sent over a TCP socket and received straight
into their places in the pool (the baseline).  Decode prints, per pass, the
transfer time and bandwidth (prefill's time in hixl calls; two-sided:
decode's time in recv) apart from prefill's time generating the KV data and
decode's time checking it, then end to end, time to first layer and layer
spacing; then the one-sided / two-sided ratio and the batching gain.

    /usr/bin/python3 examples/kv_transfer.py                      # both roles, forked here
    /usr/bin/python3 examples/kv_transfer.py --role decode         # host A: prints its address
    /usr/bin/python3 examples/kv_transfer.py --role prefill --connect A:PORT   # host B
"""
import argparse
import os
import select
import socket
import struct
import sys
import time

import numpy as np
import torch

import hixl

SHAPES = {  # layers, kv_heads, head_dim, block_tokens
    "tiny": (4, 4, 64, 16),           # 8 KiB per K or V block
    "llama2-7b": (32, 32, 128, 16),   # 128 KiB per K or V block
    "llama2-70b": (80, 8, 128, 16),   # grouped-query attention: 8 KV heads
}
MAX_SLOTS = 64
MAX_REQ_BLOCKS = 512
SLOT_INTS = 4 + MAX_REQ_BLOCKS      # req, seq_len, nblocks, pass, block ids (int32)
IMM_DESC = 0x80000000               # decode -> prefill: a descriptor in slot (low bits)
IMM_HELLO = 0x40000000              # prefill -> decode: here I am
IMM_STOP = 0x20000000               # decode -> prefill: no more requests
IMM_BYE = 0x10000000                # prefill -> decode: all my writes are done
IMM_PORT = 0x08000000               # decode -> prefill: connect to this TCP port (low bits)
IMM_TWOSIDED = 0x04000000           # decode -> prefill: descriptors come by TCP now
IMM_REPORT = 0x02000000             # decode -> prefill: send this pass's figures by TCP
PASSES = {"batch": 0, "block": 1, "tcp": 2}
PASS_NAME = ["one batch per layer", "one put per block", "two-sided (TCP)"]
WAIT_S = 120.0


class Cfg:
    def __init__(self, a):
        self.layers, self.heads, self.head_dim, self.block_tokens = SHAPES[a.model]
        for k in ("layers", "heads", "head_dim", "block_tokens"):
            v = getattr(a, k.replace("heads", "kv_heads"))
            if v:
                setattr(self, k, v)
        self.model = a.model
        self.requests, self.blocks, self.concurrency = a.requests, a.blocks, a.concurrency
        self.seq_min, self.seq_max = (int(v) for v in a.seq_len.split(":"))
        self.lanes = self.heads * self.head_dim
        self.block_bytes = self.block_tokens * self.lanes * 2  # fp16
        self.max_nb = -(-self.seq_max // self.block_tokens)
        self.warmup = a.warmup
        self.passes = [PASSES[p] for p in a.passes.split(",")]

    def pool_off(self, layer, kv, block):
        """Byte offset of (layer, K=0/V=1, block) in the pool."""
        return ((layer * 2 + kv) * self.blocks + block) * self.block_bytes


# ------------------------------------------------------------------ the KV values

M32 = 0xFFFFFFFF


def mix32(x):
    """A 32-bit integer hash, elementwise on an int64 tensor."""
    x = x & M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def fp16_bits(x):
    """Sign and 10 mantissa bits of a hash, as int16 (the exponent is OR-ed in
    later: values in +-[1, 2), never NaN)."""
    x = x & 0x83FF
    return (x - ((x >> 15) << 16)).to(torch.int16)


_lane_bits = {}


def generate(cfg, req, layer, ntok, out=None):
    """The "computed" K and V of tokens 0..ntok-1 of request `req` at `layer`,
    shape [2, ntok, lanes], as int16 (the bits of fp16 values): one hash per
    (request, layer, K/V, token), combined with one per lane.  Any misplaced,
    stale or torn block shows."""
    lanes = _lane_bits.get(cfg.lanes)
    if lanes is None:
        lanes = _lane_bits[cfg.lanes] = fp16_bits(
            mix32(torch.arange(cfg.lanes, dtype=torch.int64) + 0x5BD1E995)).view(1, 1, -1)
    kv = torch.arange(2, dtype=torch.int64).view(2, 1)
    tok = torch.arange(ntok, dtype=torch.int64).view(1, ntok)
    key = mix32(mix32(mix32(torch.tensor(req * 0x10000 + layer)) + kv) + tok)
    out = torch.bitwise_xor(fp16_bits(key).view(2, ntok, 1), lanes, out=out)
    out.bitwise_or_(0x3C00)
    return out


def pct(v, p):
    if not v:
        return 0.0
    v = sorted(v)
    return v[(len(v) - 1) * p // 100]


# ------------------------------------------------------------------ two-sided

REPORT = struct.Struct("<5d")   # prefill's figures of a pass: gen, xfer, bytes, lat50, lat99
HDR = struct.Struct("<2I")      # two-sided: a layer's header {request, layer}
DESC = struct.Struct("<4i")     # two-sided: a descriptor's head {req, seq_len, nblocks, pass}


def recv_exact(sock, mv):
    """Fill the memoryview mv from sock."""
    while len(mv):
        k = sock.recv_into(mv, len(mv), socket.MSG_WAITALL)
        if k == 0:
            raise SystemExit("two-sided: connection closed")
        mv = mv[k:]


def recv_vec(sock, bufs):
    """Fill the memoryviews bufs from sock, in order (scatter: recvmsg_into)."""
    i = 0
    while i < len(bufs):
        k = sock.recvmsg_into(bufs[i:i + 1024], 0, socket.MSG_WAITALL)[0]
        if k == 0:
            raise SystemExit("two-sided: connection closed")
        while i < len(bufs) and k >= len(bufs[i]):
            k -= len(bufs[i])
            i += 1
        if k:
            bufs[i] = bufs[i][k:]


def recv_bytes(sock, n):
    b = bytearray(n)
    recv_exact(sock, memoryview(b))
    return bytes(b)


def send_vec(sock, head, payload):
    """head then payload (a numpy array), one sendmsg and the rest, if any."""
    k = sock.sendmsg([head, payload])
    if k < len(head):
        sock.sendall(head[k:])
        k = len(head)
    sock.sendall(memoryview(payload)[k - len(head):])


def tcp_connect(addr, port):
    """A socket to decode's two-sided port, on the host of its hixl address."""
    host = addr[1:addr.index("]")] if addr.startswith("[") else addr.rsplit(":", 1)[0]
    s = socket.create_connection((host, port), timeout=60)
    s.settimeout(None)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


# ------------------------------------------------------------------ prefill

class PreStats:
    """Prefill's figures of the pass under way: seconds generating the KV
    data, seconds in hixl calls (issuing a layer's writes, waiting for them;
    two-sided: in send), bytes, and the transfer time of each layer."""

    def __init__(self):
        self.gen = self.xfer = 0.0
        self.bytes = 0
        self.layer = []

    def report(self):
        return REPORT.pack(self.gen, self.xfer, self.bytes, pct(self.layer, 50),
                           pct(self.layer, 99))


def _prefill_onesided(cfg, dec, pool, slot, d, stage, layer_elems, st):
    """One request: a put_batch (or a put per block and an ORDERED notify) per
    layer, two layers in flight.  Only the hixl calls count as transfer."""
    req, _, nb, mode = (int(v) for v in d[:4])
    per_block = mode & 1
    block_ids = d[4:4 + nb].astype(np.uint64)
    ntok = nb * cfg.block_tokens
    bb = cfg.block_bytes
    inflight = [None, None]
    busy = [0.0, 0.0]
    kvs = np.repeat(np.arange(2, dtype=np.uint64), nb)
    bs = np.tile(np.arange(nb, dtype=np.uint64), 2)

    def finish(half):
        t = time.perf_counter()
        inflight[half].wait(WAIT_S)
        dt = time.perf_counter() - t
        busy[half] += dt
        st.xfer += dt
        st.layer.append(busy[half])
        inflight[half] = None

    for layer in range(cfg.layers):
        half = layer & 1
        if inflight[half] is not None:   # its staging half is about to be rewritten
            finish(half)
        buf = stage[half * layer_elems:half * layer_elems + 2 * ntok * cfg.lanes]
        t = time.perf_counter()
        generate(cfg, req, layer, ntok, out=buf.view(2, ntok, cfg.lanes))
        st.gen += time.perf_counter() - t
        # One row per block: (local address, remote offset, length).
        rows = np.empty((2 * nb, 3), dtype=np.uint64)
        rows[:, 0] = buf.data_ptr() + (kvs * nb + bs) * bb
        rows[:, 1] = ((layer * 2 + kvs) * cfg.blocks + block_ids[bs]) * bb
        rows[:, 2] = bb
        imm = slot << 8 | layer
        if per_block:   # the per-block arguments as plain ints, before the clock
            blocks = [(int(a), int(o)) for a, o in rows[:, :2]]
        t = time.perf_counter()
        if not per_block:
            inflight[half] = dec.put_batch(rows, pool, imm=imm, wait=False)
        else:
            for a, o in blocks:
                dec.put((a, bb), pool, o, wait=False)
            # ORDERED: the notification goes once every put above has landed.
            inflight[half] = dec.notify(imm, ordered=True, wait=False)
        busy[half] = time.perf_counter() - t
        st.xfer += busy[half]
        st.bytes += 2 * nb * bb
    for half in (0, 1):
        if inflight[half] is not None:
            finish(half)


def _prefill_twosided(cfg, sock, stage, st):
    """The two-sided pass: descriptors come over the socket (nblocks 0 ends
    it); each layer goes back as a header and its blocks, one sendmsg."""
    while True:
        req, _, nb, _ = DESC.unpack(recv_bytes(sock, DESC.size))
        if nb == 0:
            return
        recv_bytes(sock, 4 * nb)   # the block ids: decode's business
        ntok = nb * cfg.block_tokens
        buf = stage[:2 * ntok * cfg.lanes]
        payload = buf.numpy().view(np.uint8)
        for layer in range(cfg.layers):
            t = time.perf_counter()
            generate(cfg, req, layer, ntok, out=buf.view(2, ntok, cfg.lanes))
            st.gen += time.perf_counter() - t
            t = time.perf_counter()
            send_vec(sock, HDR.pack(req, layer), payload)
            dt = time.perf_counter() - t
            st.xfer += dt
            st.layer.append(dt)
            st.bytes += payload.nbytes


def _prefill(ctx, cfg, addr):
    dec = ctx.connect(addr, timeout=60)
    pool = dec.lookup("kv_pool", timeout=60)
    slots_region = ctx.alloc(MAX_SLOTS * SLOT_INTS * 4)
    slots = slots_region.numpy(np.int32).reshape(MAX_SLOTS, SLOT_INTS)
    slots_region.publish("kv_slots")
    # Staging: two layers of the largest request, K and V blocks.
    layer_elems = 2 * cfg.max_nb * cfg.block_tokens * cfg.lanes
    stage = torch.zeros(2 * layer_elems, dtype=torch.int16)   # pages in now, not in pass 1
    stage_region = ctx.register(stage)
    st = PreStats()
    sock = None
    dec.notify(IMM_HELLO)
    while True:
        n = ctx.wait(timeout=WAIT_S)
        if n.imm == IMM_STOP:
            break
        if n.imm & IMM_PORT:
            sock = tcp_connect(addr, n.imm & 0xFFFF)
        elif n.imm == IMM_TWOSIDED and sock:
            _prefill_twosided(cfg, sock, stage, st)
        elif n.imm == IMM_REPORT and sock:
            sock.sendall(st.report())
            st = PreStats()
        elif n.imm & IMM_DESC and (n.imm & 0xFFFF) < MAX_SLOTS:
            slot = n.imm & 0xFFFF
            _prefill_onesided(cfg, dec, pool, slot, slots[slot], stage, layer_elems, st)
        else:
            raise SystemExit(f"prefill: unexpected notification {n.imm:#x}")
    ctx.fence()
    dec.notify(IMM_BYE)
    if sock:
        sock.close()
    pool.release()
    del slots
    stage_region.close()
    return 0


def prefill(cfg, addr):
    ctx = hixl.Context()
    try:
        return _prefill(ctx, cfg, addr)
    finally:
        # Not `with`: an exception leaves views of the region alive in its
        # traceback, and Context.close() would then raise BufferError in its
        # place (the context goes with the process instead).
        try:
            ctx.close()
        except BufferError:
            pass


# ------------------------------------------------------------------ decode

def decode_pass(cfg, ctx, pre, slots_rmr, kv, sock, mode, pass_no, seed=42):
    """One pass over cfg.requests requests (the same lengths in every pass,
    request ids of their own); returns its statistics, prefill's included."""
    pool16 = kv.view(torch.int16)
    pool8 = kv.view(-1).view(torch.uint8).numpy()   # the pool's bytes, for recv_into
    bb = cfg.block_bytes
    free_ids = list(range(cfg.blocks - 1, -1, -1))
    live = [None] * MAX_SLOTS
    conc = min(cfg.concurrency, MAX_SLOTS)
    rng = np.random.default_rng(seed)
    lens = rng.integers(cfg.seq_min, cfg.seq_max + 1, size=cfg.requests)
    desc = np.zeros((MAX_SLOTS, SLOT_INTS), dtype=np.int32)  # stays until the slot is reused
    issued = done = inflight = 0
    nbytes = 0
    check = recv_s = 0.0
    ttfl, gaps = [], []
    if mode == 2:
        pre.notify(IMM_TWOSIDED)
    t0 = time.perf_counter()
    while done < cfg.requests:
        while issued < cfg.requests and inflight < conc:
            seq_len = int(lens[issued])
            nb = -(-seq_len // cfg.block_tokens)
            if nb > len(free_ids):
                break   # wait for blocks to come back
            slot = live.index(None)
            blocks = [free_ids.pop() for _ in range(nb)]
            d = desc[slot]
            # Request ids differ between the passes: a block a later pass
            # failed to write would still hold an earlier pass's data.
            req = issued + pass_no * cfg.requests
            d[:4] = (req, seq_len, nb, pass_no << 2 | mode)
            d[4:4 + nb] = blocks
            live[slot] = {"req": req, "blocks": blocks, "layers": 0,
                          "sent": time.perf_counter(), "last": 0.0}
            if mode == 2:
                sock.sendall(d[:4 + nb].tobytes())
            else:
                # put_imm: the notification follows the descriptor's bytes.
                pre.put_imm(d[:4 + nb], slots_rmr, slot * SLOT_INTS * 4, imm=IMM_DESC | slot)
            issued += 1
            inflight += 1
        if mode == 2:
            # Waiting for prefill to generate the layer is not transfer
            # time: the clock starts when its first bytes are here.
            select.select([sock], [], [])
            r0 = time.perf_counter()
            req, layer = HDR.unpack(recv_bytes(sock, HDR.size))
            recv_s += time.perf_counter() - r0
            slot = next((i for i, x in enumerate(live) if x is not None and x["req"] == req),
                        MAX_SLOTS)
            L = live[slot] if slot < MAX_SLOTS else None
            if L is None or layer != L["layers"]:
                raise SystemExit(f"decode: unexpected two-sided layer {layer} of request {req}")
            # Straight into the blocks' places in the pool, as the puts do.
            # Where the blocks go (built off the clock, as put_batch's rows are).
            offs = [cfg.pool_off(layer, kvn, b) for kvn in (0, 1) for b in L["blocks"]]
            bufs = [memoryview(pool8[o:o + bb]) for o in offs]
            r0 = time.perf_counter()
            recv_vec(sock, bufs)
            recv_s += time.perf_counter() - r0
            del bufs
        else:
            n = ctx.wait(timeout=WAIT_S)
            slot, layer = n.imm >> 8, n.imm & 0xFF
            L = live[slot] if slot < MAX_SLOTS else None
            if L is None or layer != L["layers"]:
                raise SystemExit(f"decode: unexpected notification {n.imm:#x}")
        t = time.perf_counter()
        (ttfl if layer == 0 else gaps).append(t - (L["sent"] if layer == 0 else L["last"]))
        L["last"] = t
        # Every byte of this layer's K and V blocks against a regenerated copy.
        nb = len(L["blocks"])
        ntok = nb * cfg.block_tokens
        got = pool16[layer][:, L["blocks"]].reshape(2, ntok, cfg.lanes)
        want = generate(cfg, L["req"], layer, ntok)
        if not torch.equal(got, want):
            bad = (got != want).reshape(2, nb, -1).any(dim=2).nonzero().tolist()
            kvn, b = bad[0]
            raise SystemExit(f"decode: request {L['req']} layer {layer} {'KV'[kvn]} block {b} "
                             f"(pool block {L['blocks'][b]}): wrong data "
                             f"({len(bad)} bad blocks in this layer)")
        check += time.perf_counter() - t
        nbytes += 2 * nb * bb
        L["layers"] += 1
        if L["layers"] == cfg.layers:   # used: its blocks go back
            free_ids.extend(L["blocks"])
            live[slot] = None
            inflight -= 1
            done += 1
    seconds = time.perf_counter() - t0
    if mode == 2:
        sock.sendall(DESC.pack(0, 0, 0, 0))   # the end of the two-sided descriptors
    pre.notify(IMM_REPORT)                    # prefill's side of it
    gen, xfer, _, lat50, lat99 = REPORT.unpack(recv_bytes(sock, REPORT.size))
    return {"seconds": seconds, "bytes": nbytes, "check": check, "gen": gen,
            "xfer": recv_s if mode == 2 else xfer, "lat50": lat50, "lat99": lat99,
            "ttfl50": pct(ttfl, 50), "ttfl99": pct(ttfl, 99),
            "gap50": pct(gaps, 50), "gap99": pct(gaps, 99)}


def _decode(ctx, cfg, addr_fd=None):
    pool_bytes = cfg.layers * 2 * cfg.blocks * cfg.block_bytes
    region = ctx.alloc(pool_bytes)
    kv = region.torch(torch.float16).view(cfg.layers, 2, cfg.blocks, cfg.block_tokens,
                                          cfg.heads, cfg.head_dim)
    kv.zero_()   # the pool's pages in now, not during the first pass
    region.publish("kv_pool")
    print(f"kv_transfer.py: {cfg.model} ({cfg.layers} layers, {cfg.heads} KV heads x "
          f"{cfg.head_dim}, {cfg.block_tokens}-token blocks: {cfg.block_bytes >> 10} KiB per "
          f"K or V block), pool {list(kv.shape)} fp16 = {pool_bytes / 2**20:.1f} MiB, "
          f"{cfg.requests} requests of {cfg.seq_min}..{cfg.seq_max} tokens, "
          f"{cfg.concurrency} at a time", flush=True)
    # The two-sided baseline's socket, on any free port (told to prefill in
    # a notification); prefill's figures come back over it too.
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.bind(("0.0.0.0", 0))
    ls.listen(1)
    if addr_fd is not None:
        os.write(addr_fd, (ctx.address + "\n").encode())
        os.close(addr_fd)
    else:
        print(f"decode listening at {ctx.address}", flush=True)
    n = ctx.wait(timeout=WAIT_S)
    if n.imm != IMM_HELLO:
        raise SystemExit("decode: expected prefill's hello")
    pre = n.peer
    slots = pre.lookup("kv_slots", timeout=60)
    pre.notify(IMM_PORT | ls.getsockname()[1])
    ls.settimeout(60)
    sock, _ = ls.accept()
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ls.close()
    print(f"over {pre.transport}", flush=True)
    if cfg.warmup:   # (pass 0)
        # Untimed: the first writes to each page of the pool fault it into
        # prefill's mapping (shm maps it lazily); measure what follows.
        s = decode_pass(cfg, ctx, pre, slots, kv, sock, 0, 0)
        print(f"warm-up pass (untimed): {s['bytes'] / 2**20:.1f} MiB, verified", flush=True)
    r = {}
    total = 0
    for i, mode in enumerate(cfg.passes):
        s = decode_pass(cfg, ctx, pre, slots, kv, sock, mode, i + 1)
        r.setdefault(mode, s)
        total += s["bytes"]
        who = "decode's time in recv" if mode == 2 else "prefill's time in hixl calls"
        print(f"{PASS_NAME[mode] + ':':<22} {s['bytes'] / 2**20:8.1f} MiB; transfer "
              f"{s['xfer'] * 1e3:.3f} ms = {s['bytes'] / max(s['xfer'], 1e-9) / 1e9:.3f} GB/s ({who}); "
              f"per layer p50 {s['lat50'] * 1e3:.3f} ms, p99 {s['lat99'] * 1e3:.3f}", flush=True)
        print(f"  generating {s['gen'] * 1e3:.3f} ms (prefill), checking {s['check'] * 1e3:.3f} "
              f"ms (decode); end to end {s['seconds'] * 1e3:.3f} ms = "
              f"{s['bytes'] / s['seconds'] / 1e9:.3f} GB/s; first layer after p50 "
              f"{s['ttfl50'] * 1e3:.3f} ms (p99 {s['ttfl99'] * 1e3:.3f}); next layers "
              f"every p50 {s['gap50'] * 1e3:.3f} ms (p99 {s['gap99'] * 1e3:.3f})", flush=True)
    # Ratios of the transfer times (the same bytes in every pass).
    if 0 in r and 2 in r:
        print(f"one-sided / two-sided: transfer {r[2]['xfer'] / r[0]['xfer']:.2f}x faster "
              f"(one batch per layer against TCP), end to end "
              f"{r[2]['seconds'] / r[0]['seconds']:.2f}x", flush=True)
    if 0 in r and 1 in r:
        print(f"batching gain: {r[1]['xfer'] / r[0]['xfer']:.2f}x the transfer bandwidth of "
              f"one put per block", flush=True)
    print(f"every byte of {total / 2**20:.1f} MiB verified", flush=True)
    pre.notify(IMM_STOP)
    n = ctx.wait(timeout=WAIT_S)   # prefill is done with the pool
    if n.imm != IMM_BYE:
        raise SystemExit(f"decode: expected prefill's goodbye, got {n.imm:#x}")
    sock.close()
    slots.release()
    del kv
    return 0


def decode(cfg, addr_fd=None):
    ctx = hixl.Context()
    try:
        return _decode(ctx, cfg, addr_fd)
    finally:
        # Not `with`: an exception leaves views of the region alive in its
        # traceback, and Context.close() would then raise BufferError in its
        # place (the context goes with the process instead).
        try:
            ctx.close()
        except BufferError:
            pass


# ------------------------------------------------------------------ main

def passes_arg(v):
    if not v or any(p not in PASSES for p in v.split(",")):
        raise argparse.ArgumentTypeError("a comma-separated list of batch, block, tcp")
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--block-tokens", type=int)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--seq-len", default="16:256", help="MIN:MAX tokens per request")
    ap.add_argument("--blocks", type=int, default=256, help="blocks in the pool")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--passes", default="batch,block,tcp", type=passes_arg,
                    help="the timed passes, in order, of: batch (one put_batch per layer), "
                         "block (one put per block), tcp (two-sided send/recv)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="no untimed pass first (the first pass then pays the page faults)")
    ap.add_argument("--role", choices=["decode", "prefill", "both"], default="both")
    ap.add_argument("--connect", metavar="ADDR", help="decode's address (--role prefill)")
    a = ap.parse_args()
    cfg = Cfg(a)
    if not (1 <= cfg.layers <= 255 and cfg.heads >= 1 and cfg.head_dim >= 1 and
            cfg.block_tokens >= 1 and cfg.requests >= 1 and 1 <= cfg.seq_min <= cfg.seq_max and
            cfg.max_nb <= min(MAX_REQ_BLOCKS, cfg.blocks) and cfg.concurrency >= 1):
        ap.error(f"bad shape or sizes (at most {MAX_REQ_BLOCKS} blocks per request, and no more "
                 "than the pool; at most 255 layers)")
    torch.set_num_threads(1)
    if a.role == "prefill":
        if not a.connect:
            ap.error("--role prefill needs --connect ADDR")
        return prefill(cfg, a.connect)
    if a.role == "decode":
        return decode(cfg)
    # Both on this host: prefill forked first (no hixl threads yet), told
    # decode's address through a pipe.
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            os.close(wfd)
            with os.fdopen(rfd) as f:
                addr = f.readline().strip()
            if addr:
                rc = prefill(cfg, addr)
        except BaseException as e:  # noqa: BLE001 -- the child must not return into main
            print(f"prefill: {e!r}", file=sys.stderr, flush=True)
        finally:
            sys.stdout.flush()
            os._exit(rc)
    os.close(rfd)
    try:
        rc = decode(cfg, wfd)
    except BaseException:
        os.kill(pid, 15)
        os.waitpid(pid, 0)
        raise
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        print(f"kv_transfer.py: prefill failed (status {status:#x})", file=sys.stderr)
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""ps_train.py: parameter-server training with PyTorch and one-sided hixl
(the founding example, seed 000), verified bit for bit.

Rank 0 is the parameter server (PS), ranks 1..N-1 are workers.  The model is
a two-layer MLP (nn.Module: Linear -> Tanh -> Linear) trained by plain SGD on
a synthetic regression task: worker r owns its own seeded shard of SHARD
samples (visited again and again, so the loss falls), the labels come from a
hidden teacher.  Every model's parameters are views of one flat float32
tensor, so a whole model moves as one buffer.

Each step, with the seed's module API (hixl.init, register_memory, barrier,
get, put, fence, finalize):

  worker: forward + backward (autograd) of its minibatch at the parameters of
          version t, the flat gradient (and the loss, in its last element)
          into its registered `grads` tensor (region 1), then
          peer(0).notify(t): "ready";
  PS:     on N-1 notifications, hixl.get every worker's gradient (region 1),
          fence, average them in rank order, update its registered global
          parameters, hixl.put them into every worker's `params` tensor
          (region 0), fence, and peer(r).notify(t + 1): "version t+1 is there";
  worker: waits for that notification, goes on.

Workers never receive anything two-sided: the PS pulls and pushes.  With
--mode twosided (or both, the default) the same steps run again with the same
bytes moved by torch.distributed send/recv over gloo, and the PS prints the
one-sided / two-sided ratio of the time spent moving data and of the whole
steps, measured in the same run (--poll-sleep-us: see wait_notification).
Finally the PS recomputes the training in one process (the same gradient and
update functions, the same order of floating-point operations) and compares
the parameters with torch.equal: exit 1 on any difference.

    /usr/bin/python3 -m torch.distributed.run --redirects 2 --tee 1 \\
        --nproc_per_node 4 --master_port 29500 examples/ps_train.py --steps 20

(Debian's torch 1.13 under Python 3.11 needs --redirects 2 --tee 1: the
default 0 hits an enum bug in torchrun.)
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

IN = 64      # input features
SHARD = 64   # samples per worker, visited in turn
WAIT_S = 300.0  # longest wait for a peer's notification


# ------------------------------------------------------------------ the model

class MLP(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(IN, hidden)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))).squeeze(-1)


def hidden_for(params):
    """The hidden width whose MLP has about `params` parameters."""
    return max(1, (params - 1) // (IN + 2))


def n_params(hidden):
    return IN * hidden + hidden + hidden + 1


def bind_flat(model, flat):
    """Make the model's parameters views of `flat` (what hixl moves)."""
    off = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.data = flat[off:off + n].view_as(p)
            off += n
    assert off == flat.numel()


def initial_params(hidden, seed):
    """Version 0: nn.Linear's own initialisation, seeded, flattened."""
    torch.manual_seed(seed)
    m = MLP(hidden)
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).contiguous()


def shard(rank, seed):
    """Worker `rank`'s samples and labels (a pure function of seed, rank)."""
    g = torch.Generator().manual_seed(seed * 1000003 + rank)
    x = torch.rand(SHARD, IN, generator=g) * 2 - 1
    t = torch.Generator().manual_seed(seed)
    w_true = torch.randn(IN, generator=t)
    y = torch.tanh(x @ w_true / IN ** 0.5) + 0.01 * torch.randn(SHARD, generator=g)
    return x, y


def gradient(model, grads, x, y, t, batch):
    """Forward and backward of the minibatch of step t at the model's current
    parameters; the flat gradient into grads[:-1], the loss into grads[-1].
    Workers and the reference run exactly this: same operations, same order."""
    idx = torch.tensor([(t * batch + i) % SHARD for i in range(batch)])
    for p in model.parameters():
        p.grad = None
    loss = F.mse_loss(model(x[idx]), y[idx])
    loss.backward()
    off = 0
    for p in model.parameters():
        n = p.numel()
        grads[off:off + n].copy_(p.grad.reshape(-1))
        off += n
    grads[off] = loss.detach()


def update(params, grads, lr):
    """The PS's SGD step from the workers' gradients, summed in rank order.
    Returns the mean loss."""
    P = params.numel()
    total = grads[0][:P].clone()
    for g in grads[1:]:
        total.add_(g[:P])
    params.add_(total, alpha=-lr / len(grads))
    return sum(float(g[P]) for g in grads) / len(grads)


def reference(opt, hidden, workers):
    """The whole training in one process: what the PS must end up with."""
    params = initial_params(hidden, opt.seed)
    model = MLP(hidden)
    bind_flat(model, params)
    data = [shard(r, opt.seed) for r in range(1, workers + 1)]
    grads = [torch.zeros(params.numel() + 1) for _ in range(workers)]
    for t in range(opt.steps):
        for k in range(workers):
            gradient(model, grads[k], *data[k], t, opt.batch)
        update(params, grads, opt.lr)
    return params


def report_step(opt, t, loss, dt, nbytes):
    if opt.steps <= 40 or t < 5 or t == opt.steps - 1 or t % (opt.steps // 10 + 1) == 0:
        print(f"  step {t:4d}  loss {loss:<12.6g} {dt * 1e3:8.3f} ms  "
              f"{nbytes / dt / 1e9:7.3f} GB/s (gradients in, parameters out)", flush=True)


# ------------------------------------------------------------------ one-sided

def wait_notification(ctx, want, poll_sleep=0.0):
    """The next notification, which must carry `want`.  ctx.wait() polls
    (then naps 50 us at a time, about a tenth of a core per waiting rank); with
    --poll-sleep-us the rank sleeps between ctx.poll() calls instead, leaving the
    CPU to the ranks that compute when there are more ranks than cores."""
    if poll_sleep <= 0:
        n = ctx.wait(timeout=WAIT_S)
    else:
        deadline = time.monotonic() + WAIT_S
        while True:
            got = ctx.poll(1)
            if got:
                n = got[0]
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"rank {os.environ.get('RANK')}: no notification "
                                 f"in {WAIT_S} s (expected {want})")
            time.sleep(poll_sleep)
    if n.imm != want:
        raise SystemExit(f"rank {os.environ.get('RANK')}: notification {n.imm}, expected {want}")
    return n


def onesided(hixl, opt, rank, size, hidden, registered):
    """One-sided training; the PS returns (final params, stats).  The tensors
    registered with hixl go into `registered`: hixl.register_memory takes a
    bare address, so the caller keeps them alive until hixl.finalize()."""
    workers = size - 1
    P = n_params(hidden)
    pbytes, gbytes = 4 * P, 4 * (P + 1)
    ctx, world = hixl.context(), hixl.world()
    nap = opt.poll_sleep_us * 1e-6
    stats = {"seconds": 0.0, "comm": 0.0, "bytes": 0.0, "loss": float("nan")}
    if rank == 0:
        params = initial_params(hidden, opt.seed)          # the global parameters
        assert hixl.register_memory(params.data_ptr(), pbytes) == 0
        registered.append(params)   # registered memory must outlive its region
        grads = [torch.empty(P + 1) for _ in range(workers)]  # where the gets land
        hixl.barrier()
        peers = [world.peer(r) for r in range(size)]
        t_start = time.perf_counter()
        for r in range(1, size):   # version 0 into every worker
            hixl.put(dst_rank=r, src_addr=params.data_ptr(), dst_addr=0, size=pbytes)
        hixl.fence()
        for r in range(1, size):
            peers[r].notify(0)
        for t in range(opt.steps):
            t0 = time.perf_counter()
            for _ in range(workers):   # N-1 "ready", in any order
                wait_notification(ctx, t, nap)
            c0 = time.perf_counter()
            for r in range(1, size):   # pull every gradient, all in flight at once
                hixl.get(src_rank=r, src_addr=0, dst_addr=grads[r - 1].data_ptr(),
                         size=gbytes, region=1)
            hixl.fence()
            stats["comm"] += time.perf_counter() - c0
            loss = update(params, grads, opt.lr)
            c0 = time.perf_counter()
            for r in range(1, size):   # push version t+1
                hixl.put(dst_rank=r, src_addr=params.data_ptr(), dst_addr=0, size=pbytes)
            hixl.fence()
            reqs = [peers[r].notify(t + 1, wait=False) for r in range(1, size)]
            for q in reqs:
                q.wait(WAIT_S)
            stats["comm"] += time.perf_counter() - c0
            dt = time.perf_counter() - t0
            nbytes = workers * (gbytes + pbytes)
            stats["bytes"] += nbytes
            stats["loss"] = loss
            report_step(opt, t, loss, dt, nbytes)
        stats["seconds"] = time.perf_counter() - t_start
        hixl.barrier()
        return params, stats
    # a worker: its parameters (region 0) and gradient (region 1)
    params = torch.zeros(P)
    grads = torch.zeros(P + 1)
    assert hixl.register_memory(params.data_ptr(), pbytes) == 0
    assert hixl.register_memory(grads.data_ptr(), gbytes) == 1
    registered.extend((params, grads))
    model = MLP(hidden)
    bind_flat(model, params)
    x, y = shard(rank, opt.seed)
    hixl.barrier()
    server = world.peer(0)
    for t in range(opt.steps):
        wait_notification(ctx, t, nap)       # parameters of version t are here
        gradient(model, grads, x, y, t, opt.batch)
        server.notify(t)
    wait_notification(ctx, opt.steps, nap)   # the last version
    hixl.barrier()
    return None, stats


# ------------------------------------------------------------------ two-sided

def twosided(opt, rank, size, hidden):
    """The baseline: the same steps and bytes, torch.distributed send/recv over
    gloo.  Data-movement time on the PS is counted from the moment every
    worker said "ready" (a one-element message, as the one-sided notify)."""
    import torch.distributed as dist
    workers = size - 1
    P = n_params(hidden)
    pbytes, gbytes = 4 * P, 4 * (P + 1)
    ready = torch.zeros(1)
    stats = {"seconds": 0.0, "comm": 0.0, "bytes": 0.0, "loss": float("nan")}
    dist.barrier()
    if rank == 0:
        params = initial_params(hidden, opt.seed)
        grads = [torch.empty(P + 1) for _ in range(workers)]
        t_start = time.perf_counter()
        for q in [dist.isend(params, r) for r in range(1, size)]:
            q.wait()
        for t in range(opt.steps):
            t0 = time.perf_counter()
            for r in range(1, size):
                dist.recv(ready, src=r)
            c0 = time.perf_counter()
            for q in [dist.irecv(grads[r - 1], src=r) for r in range(1, size)]:
                q.wait()
            stats["comm"] += time.perf_counter() - c0
            loss = update(params, grads, opt.lr)
            c0 = time.perf_counter()
            for q in [dist.isend(params, r) for r in range(1, size)]:
                q.wait()
            stats["comm"] += time.perf_counter() - c0
            dt = time.perf_counter() - t0
            nbytes = workers * (gbytes + pbytes)
            stats["bytes"] += nbytes
            stats["loss"] = loss
            report_step(opt, t, loss, dt, nbytes)
        stats["seconds"] = time.perf_counter() - t_start
        dist.barrier()
        return params.clone(), stats
    params = torch.zeros(P)
    grads = torch.zeros(P + 1)
    model = MLP(hidden)
    bind_flat(model, params)
    x, y = shard(rank, opt.seed)
    dist.recv(params, src=0)
    for t in range(opt.steps):
        gradient(model, grads, x, y, t, opt.batch)
        dist.send(ready, 0)
        dist.send(grads, 0)
        dist.recv(params, src=0)
    dist.barrier()
    return None, stats


# ------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=1 << 20,
                    help="model size in parameters (about; the MLP's hidden width follows)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="samples per worker per step")
    ap.add_argument("--lr", type=float, default=None,
                    help="SGD step (default min(1/sqrt(H), 100/H), H the hidden width: "
                         "the loss falls at every size)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--poll-sleep-us", type=float, default=0, metavar="US",
                    help="wait for notifications by ctx.poll() and a sleep of US microseconds "
                         "(default 0: ctx.wait())")
    ap.add_argument("--mode", choices=["onesided", "twosided", "both"], default="both")
    opt = ap.parse_args()
    if opt.steps < 1 or opt.batch < 1 or opt.params < IN + 3:
        ap.error("--steps and --batch must be >= 1, --params > %d" % (IN + 2))
    torch.set_num_threads(1)   # the same kernels, the same order, in every process
    rank = int(os.environ.get("RANK", "0"))
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size < 2:
        raise SystemExit("ps_train.py: needs at least 2 ranks (a PS and a worker); "
                         "launch it with torchrun --nproc_per_node 4")
    workers = size - 1
    hidden = hidden_for(opt.params)
    P = n_params(hidden)
    if opt.lr is None:
        opt.lr = min(hidden ** -0.5, 100.0 / hidden)
    one = two = None
    s1 = s2 = None
    hixl = None
    registered = []
    if opt.mode in ("onesided", "both"):
        import hixl
        hixl.init()
        assert (hixl.get_rank(), hixl.get_world_size()) == (rank, size)
        if rank == 0:
            print(f"ps_train.py: {workers} workers, MLP {IN}-{hidden}-1 = {P} parameters "
                  f"({4 * P / 2**20:.1f} MiB), {opt.steps} steps, batch {opt.batch}, "
                  f"lr {opt.lr:.4g}, over {hixl.world().peer(1).transport}", flush=True)
            print("one-sided (workers notify; the PS gets gradients and puts parameters):",
                  flush=True)
        one, s1 = onesided(hixl, opt, rank, size, hidden, registered)
    if opt.mode in ("twosided", "both"):
        import torch.distributed as dist
        dist.init_process_group("gloo")   # the same torchrun environment
        if rank == 0:
            if hixl is None:
                print(f"ps_train.py: {workers} workers, MLP {IN}-{hidden}-1 = {P} parameters "
                      f"({4 * P / 2**20:.1f} MiB), {opt.steps} steps, batch {opt.batch}, "
                      f"lr {opt.lr:.4g}", flush=True)
            print("two-sided (torch.distributed send/recv over gloo):", flush=True)
        two, s2 = twosided(opt, rank, size, hidden)
        dist.destroy_process_group()
    rc = 0
    if rank == 0:
        for name, s in (("one-sided (hixl get/put)", s1), ("two-sided (gloo send/recv)", s2)):
            if s is not None:
                print(f"{name}: {s['seconds']:.3f} s, {s['seconds'] / opt.steps * 1e3:.3f} ms/step; "
                      f"moving data {s['comm'] / opt.steps * 1e3:.3f} ms/step = "
                      f"{s['bytes'] / s['comm'] / 1e9:.3f} GB/s; final loss {s['loss']:.6g}",
                      flush=True)
        if s1 is not None and s2 is not None:
            print(f"one-sided / two-sided: data movement {s2['comm'] / s1['comm']:.2f}x faster, "
                  f"whole steps {s2['seconds'] / s1['seconds']:.2f}x", flush=True)
    if hixl is not None:
        hixl.finalize()   # before the reference: nobody waits in a barrier meanwhile
        registered.clear()
    if rank == 0:
        ref = reference(opt, hidden, workers)
        bad = [name for name, got in (("one-sided", one), ("two-sided", two))
               if got is not None and not torch.equal(got, ref)]
        if bad:
            for name in bad:
                got = one if name == "one-sided" else two
                diff = (got != ref).sum().item()
                print(f"  {name}: {diff} of {P} parameters differ "
                      f"(max |diff| {(got - ref).abs().max().item():.3g})", flush=True)
            print("check against the single-process reference: DIFFERENT", flush=True)
            rc = 1
        else:
            print("check against the single-process reference: identical, bit for bit",
                  flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())

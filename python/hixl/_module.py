"""The seed's module API: one world per process, regions by index.

    hixl.init(); i = hixl.register_memory(ptr, nbytes); hixl.barrier()
    hixl.put(dst_rank, src_addr, dst_addr, size, region=0)   # dst_addr: remote offset
    hixl.get(src_rank, src_addr, dst_addr, size, region=0)   # src_addr: remote offset
    hixl.fence(); hixl.finalize()

How regions become known (docs/python.md): every rank keeps a directory,
a small hixl_mem_alloc region whose key every rank gets once in init()
(World.exchange).  Entry k holds the packed key of this rank's region k;
the count at offset 0 is written after the entry.  barrier() is a world
barrier, a one-sided read of each other rank's new entries, and a second
barrier, so that no rank appends to its directory while another reads it.
A put to a region not yet known reads that rank's directory on demand.
"""
import struct
import threading

from . import _hixl

_DIR_ENTRIES = 4096
_ENTRY = 8 + _hixl.RKEY_MAX          # u32 length, u32 reserved, blob
_HEAD = 64                           # u64 count, then reserved
_DIR_BYTES = _HEAD + _DIR_ENTRIES * _ENTRY

_lock = threading.RLock()
_st = None


class _State:
    def __init__(self, ctx, world):
        self.ctx = ctx
        self.world = world
        self.rank = world.rank
        self.size = world.size
        self.peers = [world.peer(r) for r in range(self.size)]
        self.regions = []            # ours, index = region number
        self.dir = ctx.alloc(_DIR_BYTES, access=_hixl.READ)
        self.dirview = memoryview(self.dir)
        self.dir_rmrs = world.exchange(self.dir)
        self.remote = [[] for _ in range(self.size)]   # [rank][index] -> RemoteRegion


def _state():
    if _st is None:
        raise _hixl.InvalidError("hixl.init() has not been called (or finalize() has)")
    return _st


def is_initialized():
    return _st is not None


def init(*, rank=None, world_size=None, rendezvous=None, **context_kwargs):
    """Create the context and join the world: RANK, WORLD_SIZE and
    MASTER_ADDR:MASTER_PORT from the environment (torchrun sets them; under
    torchrun the world meets through torchrun's own store), HIXL_* variables
    honoured.  Keywords override: rank=, world_size=, rendezvous="host:port",
    and Context's (listen=, transports=, net_dev=, auth_token=, ...)."""
    global _st
    with _lock:
        if _st is not None:
            raise _hixl.InvalidError("hixl.init(): already initialized (call finalize() first)")
        ctx = _hixl.Context(**context_kwargs)
        try:
            world = _hixl.World(ctx, rank, world_size, rendezvous)
            _st = _State(ctx, world)
        except BaseException:
            ctx.close()
            raise


def context():
    """The Context under the module API (notifications, atomics, batches)."""
    return _state().ctx


def world():
    """The World under the module API."""
    return _state().world


def get_rank():
    return _state().rank


def get_world_size():
    return _state().size


def _append(s, region):
    idx = len(s.regions)
    if idx >= _DIR_ENTRIES:
        region.close()
        raise _hixl.NoMemoryError(f"register_memory: at most {_DIR_ENTRIES} regions per rank")
    blob = region.pack()
    off = _HEAD + idx * _ENTRY
    s.dirview[off + 8:off + 8 + len(blob)] = blob
    s.dirview[off:off + 8] = struct.pack("<II", len(blob), 0)
    s.dirview[0:8] = struct.pack("<Q", idx + 1)     # count last: entries before it are whole
    s.regions.append(region)
    region.index = idx
    return idx


def register_memory(ptr, nbytes, access=_hixl.ALL):
    """Register [ptr, ptr + nbytes) of this process (any memory: a tensor's
    data_ptr(), numpy's ctypes.data, ...); returns its index on this rank
    (0, 1, 2 ... in call order).  Peers see it after the next barrier()."""
    with _lock:
        s = _state()
        region = s.ctx.register((int(ptr), int(nbytes)), access=access)
        return _append(s, region)


def alloc(nbytes, access=_hixl.ALL):
    """Allocate nbytes with hixl_mem_alloc (the fastest memory for
    same-host peers), register it as the next index and return the Region:
    .address, .index, .nbytes, .numpy(dtype), .torch(dtype), memoryview()."""
    with _lock:
        s = _state()
        region = s.ctx.alloc(nbytes, access=access)
        _append(s, region)
        return region


def _refresh(s, r):
    """Read rank r's directory entries we do not know yet (one-sided)."""
    known = s.remote[r]
    peer = s.peers[r]
    head = bytearray(8)
    peer.get(head, s.dir_rmrs[r], 0)
    count = struct.unpack("<Q", head)[0]
    if count > _DIR_ENTRIES:
        raise _hixl.TransportError(f"rank {r}'s region directory says {count} regions")
    if count <= len(known):
        return
    first = len(known)
    entries = bytearray((count - first) * _ENTRY)
    peer.get(entries, s.dir_rmrs[r], _HEAD + first * _ENTRY)
    for k in range(count - first):
        e = entries[k * _ENTRY:(k + 1) * _ENTRY]
        n = struct.unpack_from("<I", e)[0]
        if not 0 < n <= _hixl.RKEY_MAX:
            raise _hixl.TransportError(f"rank {r}'s region {first + k}: bad directory entry")
        known.append(peer.unpack(bytes(e[8:8 + n])))


def barrier():
    """Wait for every rank; afterwards every rank knows every region any
    rank registered before entering.  Does not fence."""
    with _lock:
        s = _state()
        s.world.barrier()
        for r in range(s.size):
            _refresh(s, r)
        s.world.barrier()


def _rmr(s, rank, region):
    if not isinstance(rank, int) or not 0 <= rank < s.size:
        raise _hixl.InvalidError(f"rank {rank} is not in [0, {s.size})")
    if not isinstance(region, int) or region < 0:
        raise _hixl.InvalidError(f"region must be a region index >= 0, not {region!r}")
    known = s.remote[rank]
    if region >= len(known):
        with _lock:
            _refresh(s, rank)
        if region >= len(known):
            raise _hixl.NotRegisteredError(
                f"rank {rank} has registered {len(known)} region(s); there is no region "
                f"{region} (register it on that rank; barrier() makes it known)")
    return known[region]


def put(dst_rank, src_addr, dst_addr, size, *, region=0):
    """Write size bytes from local address src_addr to byte offset dst_addr
    of region `region` of rank dst_rank.  Returns at once; fence() waits."""
    s = _state()
    _hixl._xfer_addr(s.peers[dst_rank] if 0 <= dst_rank < s.size else None,
                     _rmr(s, dst_rank, region), src_addr, size, dst_addr, False)


def get(src_rank, src_addr, dst_addr, size, *, region=0):
    """Read size bytes from byte offset src_addr of region `region` of rank
    src_rank into local address dst_addr.  Returns at once; fence() waits."""
    s = _state()
    _hixl._xfer_addr(s.peers[src_rank] if 0 <= src_rank < s.size else None,
                     _rmr(s, src_rank, region), dst_addr, size, src_addr, True)


def fence(timeout=None):
    """Return once every put and get this rank issued has completed."""
    _state().ctx.fence(None, timeout)


def finalize():
    """Fence, barrier, then close the world and the context.  If views of
    alloc() regions are still alive, the context is released with the last
    of them instead (their memory stays valid)."""
    global _st
    with _lock:
        s = _state()
        try:
            s.ctx.fence()
            s.world.barrier()
        finally:
            _st = None
            for rl in s.remote:
                for rmr in rl:
                    rmr.release()
            for rmr in s.dir_rmrs:
                rmr.release()
            s.dirview.release()
            s.world.close()
            try:
                s.ctx.close()
            except BufferError:
                pass  # live views: freed when the last one goes (docs/python.md)

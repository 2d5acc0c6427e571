"""hixl: one-sided communication for AI clusters (docs/python.md).

Two ways to use it:

- the object API, mirroring the C library: ``Context``, ``Region``,
  ``Peer``, ``RemoteRegion``, ``Request``, ``World``, one exception class
  per status (all derive from ``hixl.Error``);
- the seed's module API: ``hixl.init()``, ``register_memory``, ``alloc``,
  ``barrier``, ``put``, ``get``, ``fence``, ``finalize``.
"""
from ._hixl import (  # noqa: F401  (re-exported)
    Context, Peer, Region, RemoteRegion, Request, World, Notification,
    Error, InvalidError, NoMemoryError, NotRegisteredError, AccessError,
    UnsupportedError, TimeoutError, PeerLostError, TransportError, AuthError,
    AgainError, NoDeviceError,
    READ, WRITE, ATOMIC, ALL, RKEY_MAX, OK, INPROGRESS,
    ERR_INVALID, ERR_NOMEM, ERR_NOT_REGISTERED, ERR_ACCESS, ERR_UNSUPPORTED,
    ERR_TIMEOUT, ERR_PEER_LOST, ERR_TRANSPORT, ERR_AUTH, ERR_AGAIN, ERR_NO_DEVICE,
    strerror, last_error, device_backend, mem_copy, mem_query,
)
from . import _hixl, _aio
from ._module import (  # noqa: F401
    init, finalize, get_rank, get_world_size, register_memory, alloc, barrier,
    put, get, fence, context, world, is_initialized,
)

_hixl._set_await(_aio.await_request)


__version__ = "1.1.0"

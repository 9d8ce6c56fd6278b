"""The process group object a "c10drs" group is: PyTorch's ``ProcessGroup``, handing back our
own ``Work``.

Why: PyTorch wraps the ``Work`` a Python-implemented backend returns in a C++ holder that
forwards only ``wait()`` and ``get_future()`` (``PyWorkHolder`` in 2.15), so through
``torch.distributed`` a ``Work`` would answer ``is_completed()`` False after a successful
``wait()``, ``exception()`` None after a failure, and ``dist.recv(t)`` without ``src`` could
not read the sender. PyTorch uses a ``ProcessGroup`` returned by a backend's creator as the
group itself; this subclass registers the c10drs backend for "cpu" on itself, and each of
its ops runs PyTorch's own path (the dispatcher, hooks, flight recorder, profiler, all as for
any group) and then returns the ``Work`` our backend made for the call instead of the holder.

Every method below must have the name of the C++ method it overrides in its code object:
pybind11 skips a Python override only when the calling frame is that very method (any other
name would recurse into itself).

Used when every device of the group's backend string is "c10drs"; a "cpu:c10drs,cuda:nccl"
group keeps the plain backend (PyTorch stops registering backends once a creator returns a
group), and with it the held ``Work``. PyTorch does not wrap a returned group in
``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s checking wrapper; that wrapper cannot wrap a Python backend
anyway (it calls ``getBackendName`` from C++, which a Python backend cannot answer: every op
failed with "getBackendName is not implemented"), so DETAIL's cross-rank checks do not run on
"c10drs" groups, and their ops now work.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Optional

import torch
from torch._C._distributed_c10d import ProcessGroup

_TLS = threading.local()


def made(work: Any) -> None:
    """Records the ``Work`` the backend just made on this thread (the op's own)."""
    _TLS.work = work


def _take() -> Optional[Any]:
    work = getattr(_TLS, "work", None)
    _TLS.work = None
    return work


#: The ops of ``ProcessGroup`` that return a ``Work`` from the backend.
_WORK_OPS = (
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "reduce",
    "allgather",
    "_allgather_base",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "alltoall_base",
    "alltoall",
    "send",
    "recv",
    "recv_anysource",
    "barrier",
)


class C10dRsProcessGroup(ProcessGroup):
    """A ``ProcessGroup`` whose CPU backend is ``backend`` (a ``ProcessGroupC10dRs``)."""

    def __init__(self, store: Any, rank: int, size: int, backend: Any) -> None:
        super().__init__(store, rank, size)
        self._c10drs = backend
        cpu, custom = torch.device("cpu"), ProcessGroup.BackendType.CUSTOM
        self._register_backend(cpu, custom, backend)
        self._set_default_backend(custom)


def _through(name: str) -> Any:
    def op(self: C10dRsProcessGroup, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        held = getattr(super(C10dRsProcessGroup, self), name)(*args, **kw)
        ours = _take()
        return ours if ours is not None else held

    op.__name__ = op.__qualname__ = name
    op.__code__ = op.__code__.replace(co_name=name)
    op.__doc__ = f"PyTorch's ``ProcessGroup.{name}``, returning the backend's own ``Work``."
    return op


for _name in _WORK_OPS:
    setattr(C10dRsProcessGroup, _name, _through(_name))


def usable() -> bool:
    """Whether the group being created may be a ``C10dRsProcessGroup``: every device of its
    backend string on c10drs (read from PyTorch's ``_new_process_group_helper``, the creator's
    caller; False when it cannot be found)."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code.co_name == "_new_process_group_helper":
                config = frame.f_locals.get("backend_config")
                if config is None:
                    return False
                backends = set(config.get_device_backend_map().values())
                return backends == {"c10drs"}
            frame = frame.f_back
        return False
    finally:
        del frame

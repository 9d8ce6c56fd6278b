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

Every op below is a plain method of the C++ method's name (see ``Group``): pybind11 skips a
Python override only when the calling frame is that very method (any other name would recurse
into itself).

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


def _ours(held: Any) -> Any:
    """The ``Work`` our backend made during the call that returned ``held``, else ``held``."""
    ours = _take()
    return ours if ours is not None else held


class Group(ProcessGroup):
    """The ``ProcessGroup`` of an all-"c10drs" group: PyTorch's class, with our backend
    (``ProcessGroupC10dRs``, the package's one public group class) registered for "cpu", and
    each op that returns a ``Work`` returning our backend's own. Not public: users see a
    ``torch.distributed.ProcessGroup`` (``isinstance`` holds).

    Every op is a plain ``def`` of the C++ method's own name with ``self`` first: pybind11 skips
    a Python override of a virtual method only when the calling frame is a function of that name
    whose first argument is the same object (pybind11's ``get_type_override``; no code object is
    rewritten). Each clears the thread's last ``Work`` (``made``), runs PyTorch's own path
    (``super()``: the dispatcher, hooks, flight recorder, profiler) and hands back our ``Work``.
    """

    def __init__(self, store: Any, rank: int, size: int, backend: Any) -> None:
        super().__init__(store, rank, size)
        self._c10drs = backend
        cpu, custom = torch.device("cpu"), ProcessGroup.BackendType.CUSTOM
        # ``_register_backend`` and ``_set_default_backend`` are private ``ProcessGroup``
        # methods (PyTorch's own ``_new_process_group_helper`` sets up every group with them);
        # no public API registers a backend on a group a creator returns.
        self._register_backend(cpu, custom, backend)
        self._set_default_backend(custom)

    def allreduce(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().allreduce(*args, **kw))

    def allreduce_coalesced(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().allreduce_coalesced(*args, **kw))

    def broadcast(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().broadcast(*args, **kw))

    def reduce(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().reduce(*args, **kw))

    def allgather(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().allgather(*args, **kw))

    def _allgather_base(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super()._allgather_base(*args, **kw))

    def allgather_coalesced(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().allgather_coalesced(*args, **kw))

    def allgather_into_tensor_coalesced(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().allgather_into_tensor_coalesced(*args, **kw))

    def gather(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().gather(*args, **kw))

    def scatter(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().scatter(*args, **kw))

    def reduce_scatter(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().reduce_scatter(*args, **kw))

    def _reduce_scatter_base(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super()._reduce_scatter_base(*args, **kw))

    def reduce_scatter_tensor_coalesced(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().reduce_scatter_tensor_coalesced(*args, **kw))

    def alltoall_base(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().alltoall_base(*args, **kw))

    def alltoall(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().alltoall(*args, **kw))

    def send(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().send(*args, **kw))

    def recv(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().recv(*args, **kw))

    def recv_anysource(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().recv_anysource(*args, **kw))

    def barrier(self, *args: Any, **kw: Any) -> Any:
        _TLS.work = None
        return _ours(super().barrier(*args, **kw))



def usable() -> bool:
    """Whether the group being created may be a ``Group``: every device of its backend string
    on c10drs (False when that cannot be read).

    No supported hook tells a backend creator the rest of the group's backend string (its
    ``_DistributedBackendOptions`` carry store, ranks, timeout, group name and the half-built
    ``ProcessGroup``, not the device map), and returning a group for "cpu:c10drs,cuda:nccl"
    would drop the CUDA backend (PyTorch stops at a creator that returns a group). So this
    relies on private PyTorch names, checked for the supported versions (``_version``): the
    creator's caller is ``torch.distributed.distributed_c10d._new_process_group_helper``, whose
    local ``backend_config`` (a ``BackendConfig``) it reads from the call stack. A PyTorch that
    renames either makes this False: the group is then PyTorch's, which works, with PyTorch's
    ``Work`` (see the module docs).
    """
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

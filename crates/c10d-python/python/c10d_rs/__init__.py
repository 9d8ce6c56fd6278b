"""c10d-rs's CPU collective engine as a ``torch.distributed`` backend.

Two lines in a PyTorch program::

    import c10d_rs                          # registers the backend "c10drs" for device "cpu"
    dist.init_process_group("c10drs")       # or "cpu:c10drs,cuda:nccl", new_group(backend="c10drs")

The package is also found through the ``torch.distributed.backends`` entry point, so
``init_process_group("c10drs")`` works even without the import.

Everything PyTorch's own CPU backend (Gloo) offers is there: every collective and ReduceOp
(AVG and PREMUL_SUM too), point-to-point with any-source receives, barriers and monitored
barriers, coalesced ops, abort and shutdown. Contiguous tensors are used in place; the engine
runs in Rust threads that never hold the GIL. See ``ProcessGroupC10dRs`` (the backend, as
``ProcessGroupGloo`` is Gloo's; the package's one group class) and ``Work``.

Supported PyTorch: ``SUPPORTED_TORCH`` (">=2.15,<2.16"); importing under another version raises
``ImportError`` naming that range (see ``_version``).

``Work`` objects tell the truth: ``w.wait(); w.is_completed()`` holds, ``w.exception()`` is
the failure, and ``dist.recv(tensor)`` without ``src`` returns the sender. PyTorch forwards only
``wait()`` and ``get_future()`` of a Python backend's ``Work``, so a "c10drs" group is our own
``ProcessGroup`` subclass that hands back our ``Work`` (see ``_group``). In a
"cpu:c10drs,cuda:nccl" group the group is PyTorch's and its ``Work`` answers only
``wait()``/``get_future()``: poll with ``work.get_future().done()`` and use :func:`recv_any` for
receives from any source there. ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` runs no cross-rank checks on
"c10drs" groups (PyTorch's checking wrapper cannot wrap a Python backend).
"""

import torch as _torch

from ._version import SUPPORTED as SUPPORTED_TORCH
from ._version import check_torch as _check_torch

_check_torch(_torch.__version__)

from ._backend import (  # noqa: E402 (after the version check)
    BACKEND_NAME,
    ProcessGroupC10dRs,
    Work,
    create_backend,
    recv_any,
    register,
)
from ._engine import __version__  # noqa: E402

__all__ = [
    "BACKEND_NAME",
    "ProcessGroupC10dRs",
    "SUPPORTED_TORCH",
    "Work",
    "__version__",
    "create_backend",
    "recv_any",
    "register",
]

register()

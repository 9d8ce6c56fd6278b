"""c10d-rs's CPU collective engine as a ``torch.distributed`` backend.

Two lines in a PyTorch program::

    import c10d_rs                          # registers the backend "c10drs" for device "cpu"
    dist.init_process_group("c10drs")       # or "cpu:c10drs,cuda:nccl", new_group(backend="c10drs")

The package is also found through the ``torch.distributed.backends`` entry point, so
``init_process_group("c10drs")`` works even without the import.

Everything PyTorch's own CPU backend (Gloo) offers is there: every collective and ReduceOp
(AVG and PREMUL_SUM too), point-to-point with any-source receives, barriers and monitored
barriers, coalesced ops, abort and shutdown. Contiguous tensors are used in place; the engine
runs in Rust threads that never hold the GIL. See ``ProcessGroupC10dRs`` and ``Work``.

What PyTorch does not let a Python-implemented backend do (the same holds for any out-of-tree
backend written in Python): the ``Work`` objects ``torch.distributed`` hands back forward only
``wait()`` and ``get_future()`` to us, so their ``is_completed()``, ``is_success()``,
``exception()`` and source rank are PyTorch's defaults. Use ``work.get_future().done()`` to
poll, and :func:`recv_any` instead of ``dist.recv(tensor)`` without ``src``. A ``Work`` taken
straight from the backend (``group._get_backend(torch.device("cpu")).allreduce(...)``) has them all.
"""

from ._backend import (
    BACKEND_NAME,
    ProcessGroupC10dRs,
    Work,
    create_backend,
    recv_any,
    register,
)
from ._engine import __version__

__all__ = [
    "BACKEND_NAME",
    "ProcessGroupC10dRs",
    "Work",
    "__version__",
    "create_backend",
    "recv_any",
    "register",
]

register()

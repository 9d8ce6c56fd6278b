"""The call forms of a backend's methods, as PyTorch's bindings declare them for every backend
(``torch._C._distributed_c10d.Backend``, which ``ProcessGroupGloo`` inherits unchanged): an
options object, or its fields one by one (``pg.allreduce(t)``, ``pg.allreduce([t], op)``,
``pg.broadcast(t, root)``, ``pg.reduce(t, root, op)``, ``pg.allgather(outs, t)`` …).

Each ``*_call`` helper takes the arguments after the tensors and returns the options object;
a call no binding accepts raises ``TypeError`` as pybind11 does ("incompatible function
arguments"). Fields given as ``None`` keep the option's default.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict, Sequence, Tuple

import torch

#: (argument name, options attribute), in positional order.
Fields = Sequence[Tuple[str, str]]


def incompatible(method: str, args: Sequence[Any], kw: Dict[str, Any]) -> TypeError:
    """pybind11's error for a call that matches no overload."""
    got = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kw.items()])
    return TypeError(
        f"{method}(): incompatible function arguments. See help(ProcessGroupGloo.{method}) "
        f"for the supported forms. Invoked with: {got}"
    )


def options(method: str, cls: type, args: Sequence[Any], kw: Dict[str, Any], fields: Fields) -> Any:
    """An options object of ``cls`` from ``(opts)`` / ``(opts=...)`` / no argument, or, when
    ``fields`` is not empty, from the fields' values given by position or name."""
    if (args and isinstance(args[0], cls)) or "opts" in kw:
        if len(args) + len(kw) != 1:
            raise incompatible(method, args, kw)
        opts = args[0] if args else kw["opts"]
        if not isinstance(opts, cls):
            raise incompatible(method, args, kw)
        return opts
    names = [n for n, _ in fields]
    if len(args) > len(fields) or any(k not in names for k in kw):
        raise incompatible(method, args, kw)
    values = dict(zip(names, args))
    for k, v in kw.items():
        if k in values:
            raise incompatible(method, args, kw)
        values[k] = v
    opts = cls()
    for name, attr in fields:
        v = values.get(name)
        if v is not None:
            setattr(opts, attr, v)
    return opts


def one_or_list(method: str, x: Any) -> Tuple[list, bool]:
    """``(tensors, single)``: a list (or tuple) of tensors, or one tensor as a list of one."""
    if isinstance(x, torch.Tensor):
        return [x], True
    if isinstance(x, (list, tuple)):
        return list(x), False
    raise TypeError(f"{method}(): expected a tensor or a list of tensors, got {type(x).__name__}")


def require(method: str, single: bool, args: Sequence[Any], kw: Dict[str, Any], n: int) -> None:
    """The one-tensor forms need their first ``n`` fields (a root rank) given."""
    if single and len(args) + len(kw) < n:
        raise incompatible(method, args, kw)


def timeout_of(x: Any) -> Any:
    """A ``monitored_barrier`` timeout given as a ``timedelta`` or in an options object."""
    if isinstance(x, timedelta) or x is None:
        return x
    return getattr(x, "timeout", None)


REDUCE_FIELDS: Fields = (("op", "reduceOp"), ("timeout", "timeout"))
ROOT_FIELDS: Fields = (("root", "rootRank"), ("timeout", "timeout"))
ROOT_REDUCE_FIELDS: Fields = (("root", "rootRank"), ("op", "reduceOp"), ("timeout", "timeout"))
TIMEOUT_FIELDS: Fields = (("timeout", "timeout"),)

__all__ = [
    "incompatible",
    "options",
    "one_or_list",
    "require",
    "timeout_of",
    "REDUCE_FIELDS",
    "ROOT_FIELDS",
    "ROOT_REDUCE_FIELDS",
    "TIMEOUT_FIELDS",
]


def gloo_allgather_layout(
    outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], size: int
) -> Tuple[list, list]:
    """``ProcessGroupGloo.allgather`` with ``n`` inputs per rank: each of the ``n`` output lists
    holds ``n * size`` tensors, rank-major (``outputs[j][r * n + i]`` receives rank ``r``'s
    ``inputs[i]``). Returned in the engine's form (one output list of ``size`` tensors per
    input, ``lists[k][r]`` receiving rank ``r``'s ``ins[k]``): each input once per output list,
    so every output tensor is written by the engine. With one input both forms are the same
    (the engine checks it).

    Raises ``RuntimeError`` with Gloo's texts when the lists do not match.
    """
    n = len(inputs)
    if n <= 1:
        return list(outputs), list(inputs)
    op = "ProcessGroupGloo::allgather"
    if len(outputs) != n:
        raise RuntimeError(f"{op}: requires input/output tensor lists to have the same length")
    for j, o in enumerate(outputs):
        if len(o) != n * size:
            raise RuntimeError(
                f"{op}: invalid output tensor list at index {j} "
                f"(expected length {n * size}, got {len(o)})"
            )
    lists = [[o[r * n + i] for r in range(size)] for o in outputs for i in range(n)]
    return lists, [inputs[i] for _ in outputs for i in range(n)]

"""all_reduce of sparse COO tensors, with Gloo's semantics and checks.

As ``ProcessGroupGloo``: the tensors of the list are summed and coalesced locally; every rank's
metadata (sparse and dense dimensions, nnz, shape), indices and values are all-gathered; the
result is the coalesced sum of every rank's tensor, written into each input tensor (its indices
and values replaced). Only ``ReduceOp.SUM``. The all-gathers run on the dense engine, padded to
the largest nnz of the group.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import torch
import torch.distributed as dist

#: Runs one dense all-gather of ``input`` into ``outputs`` (one tensor per rank) and waits.
AllGather = Callable[[List[torch.Tensor], torch.Tensor], object]

_OP = "ProcessGroupGloo::allreduce"


def is_sparse_call(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether an all_reduce goes the sparse way: any of its tensors is sparse (its checks
    then refuse a list of mixed layouts with Gloo's "invalid tensor layout" text)."""
    return any(isinstance(t, torch.Tensor) and t.is_sparse for t in tensors)


def check(tensors: Sequence[torch.Tensor], op: object) -> None:
    """Gloo's checks of a sparse all_reduce: one layout, one size, SUM.

    Raises ``RuntimeError`` with ``ProcessGroupGloo``'s texts.
    """
    if not tensors:
        raise RuntimeError(f"{_OP}: requires non-empty tensor list")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if t.layout != first.layout:
            raise RuntimeError(
                f"{_OP}: invalid tensor layout at index {i} "
                f"(expected {_layout(first)}, got {_layout(t)})"
            )
    for t in tensors[1:]:
        if t.shape != first.shape:
            raise RuntimeError(
                f"{_OP}: invalid tensor size at index 0 "
                f"(expected {_shape(first)}, got {_shape(t)})"
            )
    kind = op.op if isinstance(op, dist.ReduceOp) else op
    if int(getattr(kind, "value", kind)) != int(dist.ReduceOp.SUM.value):
        raise RuntimeError(
            f"{_OP}: unsupported reduction operation "
            "(allreduce of sparse tensors only works with ReduceOp.SUM)"
        )


def _layout(t: torch.Tensor) -> str:
    return "Sparse" if t.is_sparse else "Strided"


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(d) for d in t.shape) + ")"


def all_reduce(tensors: Sequence[torch.Tensor], world: int, all_gather: AllGather) -> torch.Tensor:
    """The sum over ranks of the sum of ``tensors``, coalesced, also written into each of them."""
    local = tensors[0]
    for t in tensors[1:]:
        local = local + t
    local = local.coalesce()
    meta = _gather_meta(local, world, all_gather)
    nnz = [int(m[2]) for m in meta]
    width = max(nnz)
    indices = _gather_padded(local._indices(), 1, width, world, all_gather)
    values = _gather_padded(local._values(), 0, width, world, all_gather)
    out = None
    for r in range(world):
        part = torch.sparse_coo_tensor(
            indices[r][:, : nnz[r]], values[r][: nnz[r]], local.shape, dtype=local.dtype
        )
        out = part if out is None else out + part
    result = out.coalesce()
    for t in tensors:
        t.copy_(result)
    return result


def _gather_meta(t: torch.Tensor, world: int, all_gather: AllGather) -> List[torch.Tensor]:
    """Every rank's [sparse dims, dense dims, nnz, shape…]; the same dimensions everywhere."""
    mine = torch.tensor([t.sparse_dim(), t.dense_dim(), t._nnz(), *t.shape], dtype=torch.int64)
    metas = [torch.empty_like(mine) for _ in range(world)]
    all_gather(metas, mine)
    for r, m in enumerate(metas):
        if not torch.equal(torch.cat([m[:2], m[3:]]), torch.cat([mine[:2], mine[3:]])):
            raise RuntimeError(
                f"{_OP}: sparse tensor dimensions differ across ranks (rank {r} has "
                f"{m.tolist()}, this rank {mine.tolist()}: [sparse dims, dense dims, nnz, shape])"
            )
    return metas


def _gather_padded(
    x: torch.Tensor, dim: int, width: int, world: int, all_gather: AllGather
) -> List[torch.Tensor]:
    """``x`` of every rank, padded with zeros to ``width`` along ``dim`` (the nnz dimension)."""
    shape = list(x.shape)
    shape[dim] = width
    padded = torch.zeros(shape, dtype=x.dtype)
    padded.narrow(dim, 0, x.shape[dim]).copy_(x)
    outs = [torch.empty_like(padded) for _ in range(world)]
    all_gather(outs, padded)
    return outs


def check_coalesced(tensors: Sequence[torch.Tensor]) -> None:
    """``allreduce_coalesced`` takes dense tensors only (Gloo's texts)."""
    op = "ProcessGroupGloo::allreduce_coalesced"
    if tensors and tensors[0].is_sparse:
        raise RuntimeError(f"{op}: unsupported layout")
    for i, t in enumerate(tensors):
        if t.is_sparse:
            raise RuntimeError(
                f"{op}: invalid tensor layout at index {i} (expected Strided, got Sparse)"
            )

""""c10drs" as a drop-in for ``ProcessGroupGloo`` when called directly as a backend object.

Every call below runs, in the same processes, on the c10drs backend of the default group and on
PyTorch's own ``ProcessGroupGloo`` (a gloo subgroup of the same ranks): the call forms
PyTorch's bindings declare must give the same results, the bad calls the same exception type
and a text that PyTorch's own Gloo tests (``test/distributed/test_c10d_gloo.py``) match, and
sparse COO all_reduce the same coalesced sum.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Callable, List

import pytest
import torch
import torch._C._distributed_c10d as _c10d
import torch.distributed as dist
from harness import init, run_ranks

R = dist.ReduceOp
CPU = torch.device("cpu")


def backends() -> List[Any]:
    """(c10drs backend, Gloo backend) of the same ranks."""
    gloo = dist.new_group(backend="gloo")
    c = dist.group.WORLD._get_backend(CPU)
    g = gloo._get_backend(CPU)
    assert type(c).__name__ == "ProcessGroupC10dRs" and type(g).__name__ == "ProcessGroupGloo"
    return [c, g]


def same_on_both(pgs: List[Any], what: str, run: Callable[[Any], List[torch.Tensor]]) -> None:
    """``run(pg)`` returns the tensors to compare; both backends must give equal ones."""
    got = [run(pg) for pg in pgs]
    for a, b in zip(got[0], got[1]):
        torch.testing.assert_close(a, b, msg=lambda m: f"{what}: c10drs vs gloo: {m}")


def call_forms(rank: int, world: int, pgs: List[Any]) -> None:
    def val(n: int = 4) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32) + 10 * (rank + 1)

    def wait(w: Any) -> None:
        w.wait()

    def ar(form: Callable[[Any, torch.Tensor], Any], name: str) -> Callable[[Any], List[torch.Tensor]]:
        def run(pg: Any) -> List[torch.Tensor]:
            t = val()
            wait(form(pg, t))
            # reduce leaves non-root buffers unspecified (Gloo's hold partial sums)
            return [] if name.startswith("reduce(") and rank != 0 else [t]

        return run

    opts = _c10d.AllreduceOptions()
    opts.reduceOp = R.MAX
    forms = {
        "allreduce([t])": lambda pg, t: pg.allreduce([t]),
        "allreduce(t)": lambda pg, t: pg.allreduce(t),
        "allreduce([t], MAX)": lambda pg, t: pg.allreduce([t], R.MAX),
        "allreduce(t, op=MIN, timeout)": lambda pg, t: pg.allreduce(
            t, op=R.MIN, timeout=timedelta(seconds=30)
        ),
        "allreduce([t], opts)": lambda pg, t: pg.allreduce([t], opts),
        "broadcast(t, 1)": lambda pg, t: pg.broadcast(t, 1),
        "broadcast(t, root=0)": lambda pg, t: pg.broadcast(t, root=0),
        "reduce(t, 0, PRODUCT)": lambda pg, t: pg.reduce(t, 0, R.PRODUCT),
        "allreduce_coalesced([t, t2])": lambda pg, t: pg.allreduce_coalesced([t, t * 2]),
    }
    for name, form in forms.items():
        same_on_both(pgs, name, ar(form, name))

    def allgather_list(pg: Any) -> List[torch.Tensor]:
        outs = [torch.zeros(4) for _ in range(world)]
        wait(pg.allgather(outs, val()))
        return outs

    def allgather_two_inputs(pg: Any) -> List[torch.Tensor]:
        # Gloo's form: two output lists of 2 * world tensors, rank-major; the future's value is
        # the two lists.
        lists = [[torch.zeros(4) for _ in range(2 * world)] for _ in range(2)]
        w = pg.allgather(lists, [val(), val() + 100])
        w.wait()
        value = w.get_future().wait()
        assert len(value) == 2 and all(len(v) == 2 * world for v in value), type(pg).__name__
        return [t for ts in lists for t in ts]

    def gather_root1(pg: Any) -> List[torch.Tensor]:
        outs = [torch.zeros(4) for _ in range(world)] if rank == 1 else []
        wait(pg.gather(outs, val(), 1))
        return outs

    def scatter_root0(pg: Any) -> List[torch.Tensor]:
        out = torch.zeros(4)
        ins = [val() + r for r in range(world)] if rank == 0 else []
        wait(pg.scatter(out, ins, 0))
        return [out]

    def reduce_scatter_op(pg: Any) -> List[torch.Tensor]:
        out = torch.zeros(4)
        wait(pg.reduce_scatter(out, [val() * (r + 1) for r in range(world)], R.SUM))
        return [out]

    def alltoall_base(pg: Any) -> List[torch.Tensor]:
        out = torch.zeros(2 * world)
        wait(pg.alltoall_base(out, val(2 * world), [], []))
        return [out]

    def barrier(pg: Any) -> List[torch.Tensor]:
        wait(pg.barrier())
        return []

    for name, run in [
        ("allgather(outs, t)", allgather_list),
        ("allgather(2 lists, 2 inputs)", allgather_two_inputs),
        ("gather(outs, t, 1)", gather_root1),
        ("scatter(out, ins, 0)", scatter_root0),
        ("reduce_scatter(out, ins, SUM)", reduce_scatter_op),
        ("alltoall_base(out, in, [], [])", alltoall_base),
        ("barrier()", barrier),
    ]:
        same_on_both(pgs, name, run)


def _bad_calls(rank: int, world: int) -> List[Any]:
    """(what, PyTorch's test regex, the call) of bad calls that fail before any data moves."""
    f1, f2, d1 = torch.zeros(1), torch.zeros(2), torch.zeros(1, dtype=torch.float64)
    sp = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (2,))
    sp4 = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (4,))

    def bopts(root: int = 0, root_tensor: int = 0) -> Any:
        o = _c10d.BroadcastOptions()
        o.rootRank, o.rootTensor = root, root_tensor
        return o

    def ropts(root: int = 0, root_tensor: int = 0) -> Any:
        o = _c10d.ReduceOptions()
        o.rootRank, o.rootTensor = root, root_tensor
        return o

    def root(cls: Any, r: int) -> Any:
        o = cls()
        o.rootRank = r
        return o

    def sum_op(op: Any) -> Any:
        o = _c10d.AllreduceOptions()
        o.reduceOp = op
        return o

    outs = lambda n: [torch.zeros(1) for _ in range(n)]  # noqa: E731
    return [
        ("broadcast root -1", "invalid root rank", lambda pg: pg.broadcast([f1], bopts(-1))),
        ("broadcast root = size", "invalid root rank", lambda pg: pg.broadcast([f1], bopts(world))),
        ("broadcast root tensor -1", "invalid root tensor", lambda pg: pg.broadcast([f1], bopts(0, -1))),
        ("broadcast root tensor 1", "invalid root tensor", lambda pg: pg.broadcast([f1], bopts(0, 1))),
        ("broadcast of nothing", "invalid root tensor", lambda pg: pg.broadcast([], bopts())),
        ("broadcast mixed types", "invalid tensor type", lambda pg: pg.broadcast([f1, d1], bopts())),
        ("broadcast mixed sizes", "invalid tensor size", lambda pg: pg.broadcast([f1, f2], bopts())),
        ("allreduce of nothing", "requires non-empty tensor list", lambda pg: pg.allreduce([])),
        ("allreduce mixed types", "invalid tensor type", lambda pg: pg.allreduce([f1, d1])),
        ("allreduce mixed sizes", "invalid tensor size", lambda pg: pg.allreduce([f1, f2])),
        ("coalesced of nothing", "requires non-empty tensor list", lambda pg: pg.allreduce_coalesced([])),
        ("coalesced mixed types", "tensors must all have the same type",
            lambda pg: pg.allreduce_coalesced([f1, d1])),
        ("coalesced dense + sparse", "invalid tensor layout at index",
            lambda pg: pg.allreduce_coalesced([f1, sp])),
        ("coalesced sparse", "unsupported layout", lambda pg: pg.allreduce_coalesced([sp, sp])),
        ("sparse layouts", "invalid tensor layout", lambda pg: pg.allreduce([sp, f2])),
        ("dense then sparse", "invalid tensor layout", lambda pg: pg.allreduce([f1, sp])),
        ("sparse sizes", "invalid tensor size", lambda pg: pg.allreduce([sp, sp4])),
        ("sparse MAX", "unsupported reduction operation",
            lambda pg: pg.allreduce([sp], sum_op(R.MAX))),
        ("reduce root -1", "invalid root rank", lambda pg: pg.reduce([f1], ropts(-1))),
        ("reduce root = size", "invalid root rank", lambda pg: pg.reduce([f1], ropts(world))),
        ("reduce root tensor 1", "invalid root tensor", lambda pg: pg.reduce([f1], ropts(0, 1))),
        ("reduce of two", "requires a single-element tensor list",
            lambda pg: pg.reduce([f1, f1], ropts())),
        ("gather root -1", "invalid root rank",
            lambda pg: pg.gather([], [f1], root(_c10d.GatherOptions, -1))),
        ("gather of two inputs", "requires a single-element input tensor list",
            lambda pg: pg.gather([], [f1, f1], root(_c10d.GatherOptions, 0))),
        ("gather short list", "Incorrect output list size",
            lambda pg: pg.gather([outs(world - 1)], [f1], root(_c10d.GatherOptions, rank))),
        ("gather list off the root", "requires empty output on non-root",
            lambda pg: pg.gather([outs(world)], [f1], root(_c10d.GatherOptions, (rank + 1) % world))),
        ("scatter root -1", "invalid root rank",
            lambda pg: pg.scatter([f1], [], root(_c10d.ScatterOptions, -1))),
        ("scatter into two", "requires a single-element output tensor list",
            lambda pg: pg.scatter([f1, f1], [], root(_c10d.ScatterOptions, 0))),
        ("scatter long list", "Incorrect input list size",
            lambda pg: pg.scatter([f1], [outs(world + 1)], root(_c10d.ScatterOptions, rank))),
        ("scatter list off the root", "requires empty input on non-root",
            lambda pg: pg.scatter([f1], [outs(world)], root(_c10d.ScatterOptions, (rank + 1) % world))),
        ("allgather of nothing", "requires non-empty input tensor list", lambda pg: pg.allgather([], [])),
        # Two inputs per rank: each output list holds 2 * world tensors.
        ("allgather 2 inputs, lists of world", "invalid output tensor list",
            lambda pg: pg.allgather([outs(world), outs(world)], [f1, f1])),
        ("allgather 2 inputs, one list", "requires input/output tensor lists to have the same length",
            lambda pg: pg.allgather([outs(2 * world)], [f1, f1])),
        ("allgather 2 inputs, mixed types", "invalid tensor type",
            lambda pg: pg.allgather([outs(2 * world), outs(2 * world)], [f1, d1])),
        ("allgather lengths", "requires input/output tensor lists to have the same length",
            lambda pg: pg.allgather([outs(world), outs(world)], [f1])),
        ("allgather short list", "invalid output tensor list",
            lambda pg: pg.allgather([outs(world - 1)], [f1])),
        ("allgather output type", "invalid tensor type",
            lambda pg: pg.allgather([[d1] * world], [f1])),
        ("allgather_coalesced lists", "output lists should be equal to world size",
            lambda pg: pg.allgather_coalesced([[f1]] * (world + 1), [f1], _c10d.AllgatherOptions())),
        ("allgather_coalesced size", "invalid size of output tensor at index 0",
            lambda pg: pg.allgather_coalesced([[f2]] * world, [f1], _c10d.AllgatherOptions())),
        ("alltoall short input list", "input tensor list size.*does not match world size",
            lambda pg: pg.alltoall(outs(world), outs(world - 1), _c10d.AllToAllOptions())),
        ("alltoall long output list", "output tensor list size.*does not match world size",
            lambda pg: pg.alltoall(outs(world + 1), outs(world), _c10d.AllToAllOptions())),
        ("alltoall_base split count", "Number of tensor splits not equal to group size",
            lambda pg: pg.alltoall_base(f2, f2, [2], [1, 1])),
        ("alltoall_base split sum", "Split sizes doesn't match total dim 0 size",
            lambda pg: pg.alltoall_base(f2, f2, [3] + [0] * (world - 1), [2] + [0] * (world - 1))),
        ("send of two", "single", lambda pg: pg.send([f1, f1], (rank + 1) % world, 0)),
        ("send negative tag", "Tag must be nonnegative",
            lambda pg: pg.send([f1], (rank + 1) % world, -1)),
    ]


def errors(rank: int, world: int, pgs: List[Any]) -> None:
    for what, pattern, call in _bad_calls(rank, world):
        kinds = []
        for pg in pgs:
            with pytest.raises(Exception) as info:
                w = call(pg)
                w.wait()
            e = info.value
            assert re.search(pattern, str(e)), f"{what}: {type(pg).__name__}: {e!r}"
            kinds.append(type(e))
        assert kinds[0] is kinds[1], f"{what}: c10drs raises {kinds[0]}, Gloo {kinds[1]}"


def sparse(rank: int, world: int, pgs: List[Any]) -> None:
    def mine() -> List[torch.Tensor]:
        # rank r: entries at rows r and r + 1 of a 4 x 3 matrix (rows overlap across ranks),
        # plus a second tensor of the list summed locally first.
        i = torch.tensor([[rank, rank + 1, rank], [0, 2, 1]])
        v = torch.tensor([1.0, 2.0, 3.0]) * (rank + 1)
        a = torch.sparse_coo_tensor(i, v, (world + 1, 3))
        b = torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.tensor([0.5]), (world + 1, 3))
        return [a, b]

    got = []
    for pg in pgs:
        ts = mine()
        w = pg.allreduce(ts)
        w.wait()
        # As Gloo's: the result once per input tensor.
        assert len(w.get_future().wait()) == len(ts), type(pg).__name__
        out = w.result()[0] if type(pg).__name__ == "ProcessGroupC10dRs" else ts[0]
        assert ts[0].is_sparse and ts[0].is_coalesced(), type(pg).__name__
        torch.testing.assert_close(ts[0].to_dense(), ts[1].to_dense())
        got.append(out)
    assert got[0].is_sparse and got[0].is_coalesced()
    torch.testing.assert_close(got[0]._indices(), got[1]._indices())
    torch.testing.assert_close(got[0]._values(), got[1]._values())
    want = sum(
        torch.sparse_coo_tensor(
            torch.tensor([[r, r + 1, r, 0], [0, 2, 1, 0]]),
            torch.tensor([1.0 * (r + 1), 2.0 * (r + 1), 3.0 * (r + 1), 0.5]),
            (world + 1, 3),
        ).to_dense()
        for r in range(world)
    )
    torch.testing.assert_close(got[0].to_dense(), want)
    # through torch.distributed (PyTorch dispatches sparse tensors to allreduce_sparse)
    t = mine()[0]
    dist.all_reduce(t)
    torch.testing.assert_close(t.to_dense(), want - 0.5 * world * (torch.arange(3) == 0) * (
        torch.arange(world + 1) == 0
    ).unsqueeze(1))


def timeouts(pgs: List[Any]) -> None:
    # ``pg.options._timeout`` and ``_set_default_timeout``, as on ProcessGroupGloo.
    for pg in pgs:
        pg._set_default_timeout(timedelta(seconds=23))
        assert pg.options._timeout == timedelta(seconds=23), type(pg).__name__
        pg._set_default_timeout(timedelta(seconds=60))


def worker(rank: int, world: int, port: int) -> None:
    init(rank, world, port)
    pgs = backends()
    timeouts(pgs)
    call_forms(rank, world, pgs)
    errors(rank, world, pgs)
    sparse(rank, world, pgs)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_backend_object_matches_process_group_gloo(world: int) -> None:
    run_ranks(worker, world)

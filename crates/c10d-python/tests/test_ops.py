"""Every op x dtype x ReduceOp on 2, 3 and 4 ranks, against values computed locally."""

from __future__ import annotations

import functools
import threading
import time

import pytest
import torch
import torch.distributed as dist
from harness import init, run_ranks

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
COMPLEX = [torch.complex64, torch.complex128]
DTYPES = FLOATS + INTS + [torch.bool] + COMPLEX
R = dist.ReduceOp


def value(rank: int, dtype: torch.dtype, n: int = 7) -> torch.Tensor:
    """Rank r's input: small values (1 or 2) so products never overflow int8."""
    base = (torch.arange(n) + rank) % 2
    if dtype == torch.bool:
        return base == 0
    if dtype in COMPLEX:
        return (base + 1).to(dtype) + 1j * rank
    return (base + 1).to(dtype)


def reduce_ops(dtype: torch.dtype):
    if dtype == torch.bool:
        return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    if dtype in COMPLEX:
        return ["SUM", "AVG", "PREMUL_SUM"]
    ops = ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
    return ops + (["PREMUL_SUM"] if dtype in FLOATS else ["BAND", "BOR", "BXOR"])


def expected(name: str, xs: list, dtype: torch.dtype) -> torch.Tensor:
    w = len(xs)
    if dtype == torch.bool:
        fn = {
            "SUM": torch.logical_or, "MAX": torch.logical_or, "BOR": torch.logical_or,
            "PRODUCT": torch.logical_and, "MIN": torch.logical_and, "BAND": torch.logical_and,
            "BXOR": torch.logical_xor,
        }[name]
        return functools.reduce(fn, xs)
    wide = torch.complex128 if dtype in COMPLEX else (torch.float64 if dtype in FLOATS else torch.int64)
    s = torch.stack([x.to(wide) for x in xs])
    if name == "SUM":
        r = s.sum(0)
    elif name == "AVG":
        r = s.sum(0) / w if dtype in FLOATS + COMPLEX else torch.div(s.sum(0), w, rounding_mode="trunc")
    elif name == "PREMUL_SUM":
        r = s.sum(0) * 2.5
    elif name == "PRODUCT":
        r = s.prod(0)
    elif name == "MIN":
        r = s.amin(0)
    elif name == "MAX":
        r = s.amax(0)
    else:
        fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[name]
        r = functools.reduce(fn, [x.to(torch.int64) for x in xs])
    return r.to(dtype)


def op_of(name: str):
    return dist._make_nccl_premul_sum(2.5) if name == "PREMUL_SUM" else getattr(R, name)


def check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")


def all_reduce_matrix(rank: int, world: int) -> None:
    xs = lambda dt: [value(r, dt) for r in range(world)]  # noqa: E731
    for dt in DTYPES:
        for name in reduce_ops(dt):
            t = value(rank, dt)
            dist.all_reduce(t, op=op_of(name))
            check(t, expected(name, xs(dt), dt), f"all_reduce {name} {dt}")
            # reduce to the last rank with the same op
            t = value(rank, dt)
            dist.reduce(t, dst=world - 1, op=op_of(name))
            if rank == world - 1:
                check(t, expected(name, xs(dt), dt), f"reduce {name} {dt}")
    with pytest.raises(RuntimeError, match="AVG with dtype torch.bool"):
        dist.all_reduce(torch.ones(3, dtype=torch.bool), op=R.AVG)


def data_movement(rank: int, world: int) -> None:
    for dt in DTYPES:
        xs = [value(r, dt, 4) for r in range(world)]
        me = xs[rank]
        # broadcast from the last rank
        t = me.clone()
        dist.broadcast(t, src=world - 1)
        check(t, xs[-1], f"broadcast {dt}")
        # all_gather (list) and all_gather_into_tensor
        outs = [torch.zeros_like(me) for _ in range(world)]
        dist.all_gather(outs, me)
        for r in range(world):
            check(outs[r], xs[r], f"all_gather {dt} from {r}")
        flat = torch.zeros(world * 4, dtype=dt)
        dist.all_gather_into_tensor(flat, me)
        check(flat, torch.cat(xs), f"all_gather_into_tensor {dt}")
        # gather / scatter with root 0
        g = [torch.zeros_like(me) for _ in range(world)] if rank == 0 else None
        dist.gather(me, g, dst=0)
        if rank == 0:
            check(torch.cat(g), torch.cat(xs), f"gather {dt}")
        s = torch.zeros_like(me)
        dist.scatter(s, xs if rank == 0 else None, src=0)
        check(s, xs[rank], f"scatter {dt}")
        # all_to_all (list): rank r sends chunk j of its input to rank j
        ins = [value(rank * world + j, dt, 3) for j in range(world)]
        outs = [torch.zeros(3, dtype=dt) for _ in range(world)]
        dist.all_to_all(outs, ins)
        for j in range(world):
            check(outs[j], value(j * world + rank, dt, 3), f"all_to_all {dt}")
        if dt == torch.bool:
            continue
        # reduce_scatter (list and tensor), SUM
        blocks = [[value(r * world + j, dt, 2) for j in range(world)] for r in range(world)]
        want = expected("SUM", [blocks[r][rank] for r in range(world)], dt)
        o = torch.zeros(2, dtype=dt)
        dist.reduce_scatter(o, blocks[rank])
        check(o, want, f"reduce_scatter {dt}")
        o = torch.zeros(2, dtype=dt)
        dist.reduce_scatter_tensor(o, torch.cat(blocks[rank]))
        check(o, want, f"reduce_scatter_tensor {dt}")


def uneven_all_to_all_and_p2p(rank: int, world: int) -> None:
    # rank r sends (j + 1) rows of width 2 to rank j, filled with 100 r + j
    in_splits = [j + 1 for j in range(world)]
    out_splits = [rank + 1] * world
    inp = torch.cat([torch.full((j + 1, 2), 100.0 * rank + j) for j in range(world)])
    out = torch.zeros(sum(out_splits), 2)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    want = torch.cat([torch.full((rank + 1, 2), 100.0 * j + rank) for j in range(world)])
    check(out, want, "all_to_all_single uneven")
    # even split without sizes
    out = torch.zeros(world * 2)
    dist.all_to_all_single(out, torch.arange(world * 2.0) + 10 * rank)
    check(out, torch.tensor([10.0 * j + 2 * rank + k for j in range(world) for k in range(2)]), "a2a even")
    # send/recv around a ring, then batch_isend_irecv the other way
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    r = torch.zeros(3)
    if rank % 2 == 0:
        dist.send(torch.full((3,), float(rank)), nxt)
        dist.recv(r, prv)
    else:
        dist.recv(r, prv)
        dist.send(torch.full((3,), float(rank)), nxt)
    check(r, torch.full((3,), float(prv)), "send/recv ring")
    r = torch.zeros(3, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, torch.full((3,), rank, dtype=torch.int64), prv),
           dist.P2POp(dist.irecv, r, nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check(r, torch.full((3,), nxt, dtype=torch.int64), "batch_isend_irecv")
    # receive from any source: every other rank sends its rank to rank 0, tagged
    import c10d_rs

    if rank == 0:
        seen = set()
        for _ in range(world - 1):
            r = torch.zeros(1, dtype=torch.int64)
            src = c10d_rs.recv_any(r, tag=7)
            assert r.item() == src, (r, src)
            seen.add(src)
        assert seen == set(range(1, world)), seen
    else:
        dist.send(torch.full((1,), rank, dtype=torch.int64), 0, tag=7)


def coalesced_async_and_misc(rank: int, world: int) -> None:
    from torch.distributed.distributed_c10d import _coalescing_manager

    ts = [torch.full((3,), float(rank)), torch.full((2, 2), 1.0)]
    with _coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    tot = float(sum(range(world)))
    check(ts[0], torch.full((3,), tot), "coalesced all_reduce 0")
    check(ts[1], torch.full((2, 2), float(world)), "coalesced all_reduce 1")
    outs = [torch.zeros(world * 2), torch.zeros(world)]
    with _coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(rank)))
        dist.all_gather_into_tensor(outs[1], torch.full((1,), float(rank)))
    cm.wait()
    check(outs[1], torch.arange(world, dtype=torch.float32), "coalesced all_gather_into_tensor")
    outs = [torch.zeros(1), torch.zeros(2)]
    with _coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(outs[0], torch.ones(world))
        dist.reduce_scatter_tensor(outs[1], torch.ones(world * 2))
    cm.wait()
    check(outs[1], torch.full((2,), float(world)), "coalesced reduce_scatter_tensor")
    # reduce_scatter AVG of ranks -> each rank gets (mean of ranks)
    o = torch.zeros(1)
    dist.reduce_scatter_tensor(o, torch.full((world,), float(rank)), op=R.AVG)
    check(o, torch.full((1,), tot / world), "reduce_scatter_tensor AVG")
    # async work and its future
    t = torch.ones(1000)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    assert w.wait() is True
    check(fut.wait()[0], torch.full((1000,), float(world)), "future value")
    # non-contiguous tensors behave as with Gloo: used through a contiguous copy
    nc = (torch.arange(6.0).reshape(2, 3) * (rank + 1)).t()
    dist.all_reduce(nc)
    check(nc, (torch.arange(6.0).reshape(2, 3) * sum(range(1, world + 1))).t(), "non-contiguous")
    with pytest.raises(ValueError, match="contiguous"):
        dist.all_to_all_single(torch.zeros(world, 2).t(), torch.zeros(world, 2).t())
    # empty tensors pass through
    dist.all_reduce(torch.zeros(0))
    # Python threads keep running while a collective blocks (the GIL is released)
    ticks = [0]
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    th = threading.Thread(target=tick)
    th.start()
    if rank == 0:
        time.sleep(0.3)
    before = ticks[0]
    dist.barrier()
    during = ticks[0] - before
    stop.set()
    th.join()
    if rank != 0:
        assert during >= 20, f"only {during} ticks of another thread during a 0.3 s barrier"
    dist.monitored_barrier(wait_all_ranks=True)
    # a subgroup on c10drs, and sequence numbers
    sub = dist.new_group(ranks=[0, 1], backend="c10drs")
    if rank < 2:
        t = torch.full((2,), float(rank + 1))
        dist.all_reduce(t, group=sub)
        check(t, torch.full((2,), 3.0), "subgroup all_reduce")
    # under the profiler every op is an async event "c10drs:<op>"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4), async_op=True).wait()
    events = [e for e in prof.events() if e.name == "c10drs:all_reduce"]
    assert len(events) == 2, sorted({e.name for e in prof.events()})
    assert all(e.is_async for e in events)
    pg = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert pg._get_sequence_number_for_group() > 0
    assert pg.name() == "c10drs" and dist.get_backend() == "c10drs"


def worker(rank: int, world: int, port: int) -> None:
    init(rank, world, port)
    all_reduce_matrix(rank, world)
    data_movement(rank, world)
    uneven_all_to_all_and_p2p(rank, world)
    coalesced_async_and_misc(rank, world)
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_op_dtype_and_reduce_op(world: int) -> None:
    run_ranks(worker, world)

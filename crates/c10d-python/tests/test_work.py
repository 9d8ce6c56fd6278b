"""``Work`` objects from ``torch.distributed`` tell the truth on "c10drs": completed after
``wait()``, the failure in ``exception()``, the sender of a receive from any source; and a group
whose other devices run another backend keeps working (with PyTorch's held ``Work``)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import c10d_rs._group
from harness import init, run_ranks


def truthful(rank: int, world: int, port: int) -> None:
    init(rank, world, port)
    assert type(dist.group.WORLD) is c10d_rs._group.Group  # our ProcessGroup, returning our Work
    assert dist.get_backend() == "c10drs"
    # success
    t = torch.ones(4)
    w = dist.all_reduce(t, async_op=True)
    assert w.wait() is True
    assert w.is_completed() and w.is_success() and w.exception() is None
    assert torch.equal(t, torch.full((4,), float(world)))
    w = dist.broadcast(t, src=0, async_op=True)
    w.wait()
    assert w.is_completed()
    assert w.get_future().done()
    # receive from any source: the sender's rank
    if rank == 0:
        for r in range(1, world):
            got = torch.zeros(2)
            src = dist.recv(got)
            assert torch.equal(got, torch.full((2,), float(src))), (src, got)
    else:
        time.sleep(0.05 * rank)
        dist.send(torch.full((2,), float(rank)), dst=0)
    dist.barrier()
    # failure: rank 0 alone in a collective of a group with a 1 s timeout
    quick = dist.new_group(timeout=timedelta(seconds=1))
    if rank == 0:
        w = dist.all_reduce(torch.ones(2), group=quick, async_op=True)
        with pytest.raises(dist.DistBackendError):
            w.wait()
        assert w.is_completed() and not w.is_success()
        assert isinstance(w.exception(), dist.DistBackendError), w.exception()
    dist.barrier()
    dist.destroy_process_group()


def test_work_reports_completion_failure_and_source() -> None:
    run_ranks(truthful, 2)


def mixed(rank: int, world: int, port: int) -> None:
    init(rank, world, port, backend="cpu:c10drs,cuda:gloo")
    pg = dist.group.WORLD
    assert type(pg).__name__ == "ProcessGroup"
    assert type(pg._get_backend(torch.device("cpu"))).__name__ == "ProcessGroupC10dRs"
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(world)))
    dist.destroy_process_group()


def test_a_group_with_another_backend_for_cuda_keeps_the_plain_backend() -> None:
    run_ranks(mixed, 2)


def detail(rank: int, world: int, port: int) -> None:
    import os

    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    dist.set_debug_level_from_env()
    init(rank, world, port)
    # PyTorch's DETAIL wrapper cannot wrap a Python backend (it asks getBackendName from C++):
    # the group is ours, unwrapped, and its ops work.
    assert type(dist.group.WORLD) is c10d_rs._group.Group  # our ProcessGroup, returning our Work
    t = torch.ones(3)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    assert w.is_completed() and torch.equal(t, torch.full((3,), float(world)))
    dist.destroy_process_group()


def test_detail_debugging_keeps_c10drs_groups_working() -> None:
    run_ranks(detail, 2)

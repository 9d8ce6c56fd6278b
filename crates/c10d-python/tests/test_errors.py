"""Errors come out as PyTorch's exception types with our messages; nothing hangs."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from harness import init, run_ranks


def killed_rank(rank: int, world: int, port: int) -> None:
    init(rank, world, port)
    dist.all_reduce(torch.ones(4))  # everyone is connected
    if rank == world - 1:
        os._exit(0)  # dies without a word
    t0 = time.monotonic()
    with pytest.raises(dist.DistError) as exc:
        for _ in range(1000):  # the dead rank's peers fail at the first op that needs it
            dist.all_reduce(torch.ones(1 << 16))
    took = time.monotonic() - t0
    msg = str(exc.value)
    assert isinstance(exc.value, (dist.DistBackendError, dist.DistNetworkError)), type(exc.value)
    assert f"rank {world - 1}" in msg, msg
    assert took < 3.0, f"survivor {rank} took {took:.2f} s to notice the dead rank"
    os._exit(0)  # the group is broken; skip teardown


def test_killed_rank_fails_every_survivor_promptly() -> None:
    run_ranks(killed_rank, 3)


def silent_rank(rank: int, world: int, port: int) -> None:
    init(rank, world, port, timeout=timedelta(seconds=1))
    dist.barrier()
    if rank == 1:
        time.sleep(4)  # never joins the next all_reduce in time
        os._exit(0)
    t0 = time.monotonic()
    w = dist.all_reduce(torch.ones(4), async_op=True)
    with pytest.raises(dist.DistBackendError) as exc:
        w.wait()
    took = time.monotonic() - t0
    msg = str(exc.value)
    assert "timed out" in msg.lower() and "ALLREDUCE" in msg, msg
    assert "no data from rank(s) 1" in msg, msg  # names the silent rank
    assert took < 3.5, f"timeout of 1 s took {took:.2f} s"
    os._exit(0)


def test_timeout_is_a_dist_backend_error_naming_the_op() -> None:
    run_ranks(silent_rank, 2)


def bad_arguments(rank: int, world: int, port: int) -> None:
    init(rank, world, port)
    with pytest.raises(RuntimeError, match="unsupported dtype torch.uint16"):
        dist.all_reduce(torch.ones(3, dtype=torch.uint16))
    with pytest.raises(RuntimeError, match="AVG with dtype torch.bool"):
        dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG)
    with pytest.raises(RuntimeError, match="premul|PREMUL"):
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0))
    with pytest.raises(RuntimeError, match="world_size times input tensor size"):
        dist.all_gather_into_tensor(torch.zeros(3), torch.zeros(2))  # wrong output size
    with pytest.raises(RuntimeError, match="contiguous"):
        dist.send(torch.zeros(2, 2).t(), (rank + 1) % world)
    # mismatched sizes across ranks fail on every rank, promptly, never a hang
    t0 = time.monotonic()
    with pytest.raises(dist.DistError) as exc:
        dist.all_reduce(torch.ones(4 + rank))
    assert time.monotonic() - t0 < 5.0
    assert "rank" in str(exc.value), str(exc.value)
    os._exit(0)


def test_bad_arguments_raise_pytorch_exception_types() -> None:
    run_ranks(bad_arguments, 2)


def wait_timeout(rank: int, world: int, port: int) -> None:
    init(rank, world, port)
    if rank == 0:
        w = dist.all_reduce(torch.ones(2), async_op=True)
        with pytest.raises(dist.DistBackendError, match="(?i)timed out"):
            w.wait(timedelta(milliseconds=200))  # rank 1 is still asleep
        dist.barrier()
        w.wait()
    else:
        time.sleep(1.0)
        dist.all_reduce(torch.ones(2))
        dist.barrier()
    # a zero timeout is a real one: rank 0 fails at once, naming itself, as with Gloo
    sub = dist.new_group([0, 1])
    if rank == 0:
        with pytest.raises(dist.DistBackendError, match="Rank 0 timed out in monitoredBarrier"):
            dist.monitored_barrier(group=sub, timeout=timedelta(0))
    dist.destroy_process_group()


def test_work_wait_with_timeout() -> None:
    run_ranks(wait_timeout, 2)


def abort_unblocks(rank: int, world: int, port: int) -> None:
    import threading

    init(rank, world, port)
    dist.barrier()
    if rank == 1:
        time.sleep(3)  # never sends
        os._exit(0)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    threading.Timer(0.3, backend.abort).start()
    t0 = time.monotonic()
    w = dist.irecv(torch.zeros(4), src=1)
    with pytest.raises(dist.DistError, match="aborted"):
        w.wait()
    assert time.monotonic() - t0 < 2.0
    # an aborted group refuses new work with the same explanation
    with pytest.raises(dist.DistError, match="aborted"):
        dist.all_reduce(torch.ones(2))
    os._exit(0)


def test_abort_from_another_thread_unblocks_a_stuck_receive() -> None:
    run_ranks(abort_unblocks, 2)

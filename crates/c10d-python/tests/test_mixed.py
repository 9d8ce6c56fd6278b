"""A job of PyTorch and Rust ranks: rank 0 is PyTorch on "c10drs", ranks 1 and 2 are the Rust
example ``mixed_rank`` on "gloo", all in one group through one TCPStore. Every rank runs the
same sequence (all_reduce, all_gather, broadcast, a subgroup's all_reduce, barrier,
all_gather_object) and checks every result."""

from __future__ import annotations

import os

import pytest
from harness import run_mixed

RUST_RANK = os.environ.get("C10D_MIXED_RANK")
WORLD = 3


def _pytorch_rank(port: int) -> None:
    from datetime import timedelta

    import c10d_rs  # noqa: F401  (registers "c10drs")
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("c10drs", store=store, rank=0, world_size=WORLD)
    t = torch.full((4,), 1.0)
    dist.all_reduce(t)
    assert t.tolist() == [6.0] * 4, t
    outs = [torch.zeros(2) for _ in range(WORLD)]
    dist.all_gather(outs, torch.zeros(2))
    assert [o.tolist() for o in outs] == [[10.0 * r] * 2 for r in range(WORLD)], outs
    b = torch.arange(3.0)
    dist.broadcast(b, src=WORLD - 1)
    assert b.tolist() == [200.0, 201.0, 202.0], b
    sub = dist.new_group([0, 2])
    s = torch.zeros(2)
    dist.all_reduce(s, group=sub)
    assert s.tolist() == [2.0, 2.0], s
    dist.barrier()
    names = [None] * WORLD
    dist.all_gather_object(names, "rank0")
    assert names == [f"rank{r}" for r in range(WORLD)], names
    dist.destroy_process_group()
    os._exit(0)


@pytest.mark.skipif(RUST_RANK is None, reason="C10D_MIXED_RANK not set (cargo xtask python sets it)")
def test_pytorch_and_rust_ranks_share_one_group() -> None:
    envs = [{"WORLD_SIZE": str(WORLD), "RANK": str(r)} for r in (1, 2)]
    for r, (code, out, err) in zip((1, 2), run_mixed(RUST_RANK, envs, _pytorch_rank, ())):
        assert code == 0 and f"mixed rank {r}: OK" in out, f"rank {r}: {out}\n{err}"

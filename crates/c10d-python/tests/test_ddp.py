"""DistributedDataParallel on "c10drs" ends where the same run on "gloo" ends."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from harness import init, run_ranks


def train(rank: int, world: int, port: int, backend: str, out: str) -> None:
    init(rank, world, port, backend=backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1234 + rank)  # every rank sees its own data
    for _ in range(20):
        x = torch.randn(32, 8, generator=g)
        y = x.sum(1, keepdim=True).sin()
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    _finish(model, rank, world, out)


def _finish(model: torch.nn.Module, rank: int, world: int, out: str) -> None:
    """Every rank ends with the same parameters; rank 0 saves them to ``out``."""
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    for other in gathered:
        assert torch.equal(other, flat), "parameters differ between ranks"
    if rank == 0:
        torch.save(flat, out)
    dist.destroy_process_group()


def _same_as_gloo(train_fn, world: int) -> None:
    """``train_fn`` on "c10drs" and on "gloo" ends with the same parameters."""
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = os.path.join(tmp, "c10drs.pt"), os.path.join(tmp, "gloo.pt")
        run_ranks(train_fn, world, "c10drs", ours)
        run_ranks(train_fn, world, "gloo", theirs)
        a, b = torch.load(ours), torch.load(theirs)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_ddp_matches_gloo() -> None:
    _same_as_gloo(train, 3)


def train_sparse(rank: int, world: int, port: int, backend: str, out: str) -> None:
    """An embedding with sparse gradients (``nn.Embedding(sparse=True)``): DDP all-reduces
    sparse COO gradients."""
    init(rank, world, port, backend=backend)
    torch.manual_seed(0)
    model = torch.nn.EmbeddingBag(50, 8, mode="sum", sparse=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(99 + rank)
    for _ in range(10):
        idx = torch.randint(0, 50, (16, 4), generator=g)
        opt.zero_grad()
        ddp(idx).pow(2).mean().backward()
        opt.step()
    _finish(model, rank, world, out)


def test_ddp_with_sparse_gradients_matches_gloo() -> None:
    _same_as_gloo(train_sparse, 2)

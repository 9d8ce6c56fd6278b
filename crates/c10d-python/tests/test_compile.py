"""torch.compile of functional collectives on "c10drs": PyTorch resolves the group by name."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from harness import init, run_ranks


def compiled(rank: int, world: int, port: int) -> None:
    init(rank, world, port)
    group = dist.group.WORLD

    def step(x: torch.Tensor) -> torch.Tensor:
        y = funcol.all_reduce(x * 2, "sum", group)
        z = funcol.all_gather_tensor(y + 1, 0, group)
        return funcol.reduce_scatter_tensor(z, "avg", 0, group)

    fn = torch.compile(step, backend="aot_eager", fullgraph=True)
    x = torch.full((4,), float(rank + 1))
    got = fn(x)
    want = step(x)  # eager functional collectives
    s = 2.0 * world * (world + 1) / 2
    torch.testing.assert_close(want, torch.full((4,), s + 1))
    torch.testing.assert_close(got, want)
    # the eager functional op set by group name
    name = group.group_name
    t = torch.ops._c10d_functional.all_reduce(torch.ones(3), "avg", name)
    t = torch.ops._c10d_functional.wait_tensor(t)
    torch.testing.assert_close(t, torch.ones(3))
    dist.destroy_process_group()


def test_torch_compile_functional_collectives() -> None:
    run_ranks(compiled, 2)

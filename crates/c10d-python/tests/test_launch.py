"""Launch under torchrun and under c10drun (env://), and rendezvous through file://."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from harness import run_ranks

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import sys, torch, torch.distributed as dist
if sys.argv[1] == "import":
    import c10d_rs  # otherwise found through the torch.distributed.backends entry point
dist.init_process_group(sys.argv[2])
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((3,), float(rank + 1))
dist.all_reduce(t)
assert t.tolist() == [world * (world + 1) / 2] * 3, t
assert dist.group.WORLD._get_backend(torch.device("cpu")).name() == "c10drs"
sub = dist.new_group(backend="c10drs")
dist.all_reduce(t, group=sub)
print(f"ok rank {rank} of {world}", flush=True)
dist.destroy_process_group()
"""


def _script(tmp: str) -> str:
    p = os.path.join(tmp, "job.py")
    Path(p).write_text(SCRIPT)
    return p


def _run(cmd: list, n: int) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for rank in range(n):
        assert f"ok rank {rank} of {n}" in out, out


def test_torchrun_env_rendezvous() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", _script(tmp), "import", "c10drs"]
        _run(cmd, 2)


def _c10drun() -> str:
    exe = os.environ.get("C10D_C10DRUN")
    if exe:
        return exe
    subprocess.run(["cargo", "build", "-q", "-p", "c10d-run", "--bin", "c10drun"],
                   cwd=ROOT, check=True, timeout=900)
    return str(ROOT / "target" / "debug" / "c10drun")


def test_c10drun_with_entry_point_and_device_map() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [_c10drun(), "--nproc-per-node", "3", "--master-port", "0",
               sys.executable, _script(tmp), "no-import", "cpu:c10drs,cuda:gloo"]
        _run(cmd, 3)


def file_rendezvous(rank: int, world: int, _port: int, path: str) -> None:
    dist.init_process_group("c10drs", init_method=f"file://{path}", rank=rank, world_size=world)
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [float(world)] * 2
    dist.destroy_process_group()


def test_file_init_method() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_ranks(file_rendezvous, 2, os.path.join(tmp, "rdzv"))

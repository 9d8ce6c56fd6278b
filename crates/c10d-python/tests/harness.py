"""Runs a function on N local ranks (spawned processes) and fails the test if any rank fails.

Rendezvous never uses a fixed port: the parent hosts a TCPStore on 127.0.0.1 port 0 and the
ranks join it as clients (the "store passed in" rendezvous), or use a file:// init method.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp

DEADLINE_S = 120.0


def _entry(rank: int, fn: Callable[..., Any], world: int, port: int, args: tuple) -> None:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import c10d_rs  # noqa: F401  (registers "c10drs")

    fn(rank, world, port, *args)
    # Leave without the interpreter's teardown: PyTorch's own Gloo (the baseline some tests run)
    # can abort in a thread destructor at exit on a loaded machine ("terminate called without an
    # active exception"), which would fail a rank whose work had succeeded. Tests tear their
    # groups down explicitly with destroy_process_group(), so our teardown is still exercised.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, deadline_s: float = DEADLINE_S):
    """Runs ``fn(rank, world, store_port, *args)`` on ``world`` processes; raises on failure."""
    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    ctx = mp.start_processes(
        _entry, args=(fn, world, store.port, args), nprocs=world, join=False, start_method="spawn"
    )
    end = time.monotonic() + deadline_s
    try:
        while not ctx.join(timeout=0.5):
            if time.monotonic() > end:
                raise TimeoutError(f"ranks did not finish within {deadline_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
        del store


def init(rank: int, world: int, port: int, backend: str = "c10drs", **kw: Any) -> None:
    """Joins the parent's store as a client and initializes the default group."""
    from datetime import timedelta

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, **kw)


def run_mixed(
    rust_bin: str, rust_envs: list, py_fn: Callable[..., Any], py_args: tuple, deadline_s: float = 120
) -> list:
    """A job of PyTorch and Rust ranks: ``py_fn(*py_args)`` in a spawned process (rank 0) and
    ``rust_bin`` once per environment of ``rust_envs`` (each with its RANK), all joined through
    a TCPStore the parent hosts (``C10D_STORE_PORT``; ``py_args`` gets the port first). Returns
    the Rust ranks' ``(returncode, stdout, stderr)``; asserts the PyTorch rank exited 0."""
    import subprocess

    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    rust = [
        subprocess.Popen([rust_bin], env=dict(os.environ, C10D_STORE_PORT=str(store.port), **e),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for e in rust_envs
    ]
    py = mp.get_context("spawn").Process(target=py_fn, args=(store.port, *py_args))
    py.start()
    try:
        outs = [p.communicate(timeout=deadline_s) for p in rust]
        py.join(timeout=deadline_s)
    finally:
        for p in rust:
            if p.poll() is None:
                p.kill()
        if py.is_alive():
            py.kill()
    assert py.exitcode == 0, f"the PyTorch rank exited with {py.exitcode}"
    return [(p.returncode, out, err) for p, (out, err) in zip(rust, outs)]

"""Rust members of a vLLM ``StatelessProcessGroup``: rank 0 is the Python side of a weight-sync
group (what vLLM workers and the RL trainers that use vLLM's class run), ranks 1 and 2 are the
example ``vllm_member`` (``c10d_world::stateless``). They exchange a config by
``broadcast_obj``, names by ``all_gather_obj``, objects round a ring by ``send_obj``/``recv_obj``, the
pickled ``ncclUniqueId`` that vLLM's ``PyNcclCommunicator`` broadcasts (read by c10d-nccl's vLLM
scheme), and a ``barrier``.

Rank 0 is vLLM's own class when vLLM is importable, or when ``C10D_VLLM_UTILS`` names a vLLM
checkout's ``vllm/distributed/utils.py`` (its ``StatelessProcessGroup``, ``create_tcp_store``
and ``sched_yield`` are loaded from that file). Otherwise it is ``ProtocolPeer`` below, written
here from vLLM's store protocol (keys and pickles), since vLLM cannot be installed on the test
machines; the ``ncclUniqueId`` class is then defined at vLLM's module path."""

from __future__ import annotations

import ast
import os
import pickle
import socket
import subprocess
import sys
import time
import types
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

MEMBER = os.environ.get("C10D_VLLM_MEMBER")
WORLD = 3
CONFIG = {"model": "llama", "tp": 2, "names": ["a.weight", "b.bias"], "shapes": [[4, 8], [8]]}
ID_MODULE = "vllm.distributed.device_communicators.pynccl_wrapper"


class ProtocolPeer:
    """vLLM's store protocol for the calls this test makes (see the module docstring)."""

    def __init__(self, store, rank: int, world_size: int):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.sent = {i: 0 for i in range(world_size)}
        self.got = {i: 0 for i in range(world_size)}
        self.bsent = 0
        self.bgot = {i: 0 for i in range(world_size)}

    @staticmethod
    def create(host, port, rank, world_size, listen_socket=None, store_timeout=300):
        import torch.distributed as dist

        # The store takes the socket over, as vLLM's create_tcp_store does.
        fd = listen_socket.detach() if listen_socket else None
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0,
                              timeout=timedelta(seconds=store_timeout), use_libuv=False,
                              master_listen_fd=fd)
        return ProtocolPeer(store, rank, world_size)

    def send_obj(self, obj, dst):
        self.store.set(f"send_to/{dst}/{self.sent[dst]}", pickle.dumps(obj))
        self.sent[dst] += 1

    def recv_obj(self, src):
        obj = pickle.loads(self.store.get(f"send_to/{self.rank}/{self.got[src]}"))
        self.got[src] += 1
        return obj

    def broadcast_obj(self, obj, src):
        if self.rank == src:
            self.store.set(f"broadcast_from/{src}/{self.bsent}", pickle.dumps(obj))
            self.bsent += 1
            return obj
        obj = pickle.loads(self.store.get(f"broadcast_from/{src}/{self.bgot[src]}"))
        self.bgot[src] += 1
        return obj

    def all_gather_obj(self, obj):
        return [self.broadcast_obj(obj if i == self.rank else None, src=i) for i in range(self.world_size)]

    def barrier(self, timeout: float = 30.0):
        bid = self.broadcast_obj(f"barrier_{uuid.uuid4()}" if self.rank == 0 else None, src=0)
        for phase in ("arrival", "departure"):
            self.store.set(f"{phase}_{bid}_{self.rank}", b"1")
            if phase == "departure" and self.rank != 0:
                return
            keys = [f"{phase}_{bid}_{i}" for i in range(self.world_size)]
            deadline = time.time() + timeout
            while not self.store.check(keys):
                assert time.time() < deadline, f"barrier {phase} timed out"
                time.sleep(0.001)
        for i in range(self.world_size):
            for phase in ("arrival", "departure"):
                self.store.delete_key(f"{phase}_{bid}_{i}")


def _vllm_class(path: str):
    """vLLM's ``StatelessProcessGroup`` from its source file (with the helpers it calls)."""
    import dataclasses
    import logging
    from collections import deque
    from typing import Any

    import torch
    from torch.distributed import TCPStore

    tree = ast.parse(Path(path).read_text())
    wanted = {"StatelessProcessGroup", "create_tcp_store", "sched_yield", "USE_SCHED_YIELD"}
    body = []
    for node in tree.body:
        names = {getattr(node, "name", None)} | {
            t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)
        }
        if names & wanted:
            body.append(node)
    module = types.ModuleType("vllm_distributed_utils_src")
    module.__dict__.update(
        dataclasses=dataclasses, deque=deque, Any=Any, pickle=pickle, time=time, uuid=uuid,
        socket=socket, timedelta=timedelta, torch=torch, os=os, sys=sys, TCPStore=TCPStore,
        logger=logging.getLogger("vllm"))
    sys.modules[module.__name__] = module  # dataclasses looks the module up
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), module.__dict__)  # noqa: S102
    return module.StatelessProcessGroup


def _rank0_class():
    try:
        from vllm.distributed.utils import StatelessProcessGroup

        return StatelessProcessGroup, "vLLM (installed)"
    except ImportError:
        pass
    path = os.environ.get("C10D_VLLM_UTILS")
    if path:
        return _vllm_class(path), f"vLLM ({path})"
    return ProtocolPeer, "the protocol peer"


def _id_class(tmp: Path):
    """vLLM's ``ncclUniqueId`` (a ctypes structure of 128 bytes) at vLLM's module path."""
    try:
        module = __import__(ID_MODULE, fromlist=["ncclUniqueId"])
        return module.ncclUniqueId
    except ImportError:
        pass
    d = tmp / "ids"
    parts = ID_MODULE.split(".")
    pkg = d.joinpath(*parts[:-1])
    pkg.mkdir(parents=True)
    for i in range(1, len(parts)):
        (d.joinpath(*parts[:i]) / "__init__.py").write_text("")
    (pkg / f"{parts[-1]}.py").write_text(
        "import ctypes\nclass ncclUniqueId(ctypes.Structure):\n"
        "    _fields_ = [('internal', ctypes.c_byte * 128)]\n")
    sys.path.insert(0, str(d))
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm."):
            del sys.modules[name]
    module = __import__(ID_MODULE, fromlist=["ncclUniqueId"])
    return module.ncclUniqueId


@pytest.mark.skipif(MEMBER is None, reason="C10D_VLLM_MEMBER not set (cargo xtask python sets it)")
def test_rust_members_of_a_vllm_stateless_group(tmp_path):
    cls, kind = _rank0_class()
    print(f"rank 0: {kind}")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    members = [
        subprocess.Popen([MEMBER], env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD),
                                            C10D_STORE_PORT=str(port)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in (1, 2)
    ]
    try:
        g = cls.create("127.0.0.1", port, 0, WORLD, listen_socket=sock, store_timeout=60)
        g.broadcast_obj(CONFIG, src=0)
        assert g.all_gather_obj("py0") == ["py0", "rust1", "rust2"]
        # A ring (0 -> 1 -> 2 -> 0): vLLM's send_to/{dst}/{n} keys do not name the sender, so
        # two senders to one rank would overwrite each other.
        g.send_obj(41, dst=1)
        assert g.recv_obj(src=2) == ("ok", 2.5)
        raw = bytes((i * 37 + 11) % 256 for i in range(128))
        uid = _id_class(tmp_path)()
        for i, b in enumerate(raw):
            uid.internal[i] = b - 256 if b > 127 else b
        g.broadcast_obj(uid, src=0)
        g.barrier()
        outs = [p.communicate(timeout=60) for p in members]
    finally:
        for p in members:
            if p.poll() is None:
                p.kill()
    for r, (p, (out, err)) in zip((1, 2), zip(members, outs)):
        assert p.returncode == 0, f"rank {r} failed ({p.returncode}):\n{out}\n{err}"
        assert "model: \"llama\", tp: 2" in out and "[4, 8], [8]" in out, out
        assert "all=py0,rust1,rust2" in out, out
        if r == 2:
            assert "from_rank1=[41, 42, 43]" in out, out
        assert "unique_id_key=broadcast_from/0/2" in out, out
        assert f"unique_id={raw.hex()}" in out, out
        assert f"done rank={r}" in out, out

"""Runs PyTorch's generic distributed test suite (shipped in the wheel) against "c10drs".

    BACKEND=c10drs WORLD_SIZE=3 python run_pytorch_suite.py [-k PATTERN] [unittest args]
    C10D_RS_AS_GLOO=1 BACKEND=gloo ...   # our engine registered under the name "gloo"

The second form exists because many tests of the suite are gated on the backend's *name*
("gloo"); registering our creator under that name runs them against our engine (PyTorch's
own ProcessGroupGloo is then never created in these processes).

Not part of `cargo xtask test` (it takes tens of minutes); `cargo xtask pytorch-suite` runs it
and prints the counts. The test class is assembled the way PyTorch's own
`test/distributed/test_distributed_spawn.py` does it: each test spawns WORLD_SIZE processes
that rendezvous through a file:// init method. Tests that PyTorch gates on a backend name
("gloo", "nccl") skip themselves for any other backend and say so.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("BACKEND", "gloo" if os.environ.get("C10D_RS_AS_GLOO") == "1" else "c10drs")
os.environ.setdefault("WORLD_SIZE", "3")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import c10d_rs  # noqa: E402,F401  (registers the backend in this process and every spawned one)
import torch  # noqa: E402
from torch.testing._internal.common_distributed import (  # noqa: E402
    DistTestCases,
    MultiProcessTestCase,
)

# PyTorch's suite gates features on backend names. "plugin" is its extension point for
# out-of-tree backends; "ddp" lets the DistributedDataParallel tests run on CPU. Spawned ranks
# import this module too, so they see the same sets.
DistTestCases.backend_feature["plugin"].add("c10drs")
DistTestCases.backend_feature["ddp"].add("c10drs")

if os.environ.get("C10D_RS_AS_GLOO") == "1":
    import torch.distributed as dist

    # CUSTOM: PyTorch must not treat our Python backend as its C++ ProcessGroupGloo.
    def _as_gloo(opts, backend_options=None):
        backend = c10d_rs.create_backend(opts, backend_options)
        backend.profiling_prefix = "gloo"  # the suite looks for "gloo:<op>" profiler events
        return backend

    dist.Backend.register_backend(
        "gloo",
        _as_gloo,
        extended_api=True,
        devices=["cpu"],
        _backend_type=dist.ProcessGroup.BackendType.CUSTOM,
    )
from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402,I001
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """PyTorch's generic suite, one spawned process per rank."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


assert issubclass(TestDistBackendWithSpawn, MultiProcessTestCase)

if __name__ == "__main__":
    run_tests()

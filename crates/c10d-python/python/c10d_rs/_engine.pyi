"""Typed stubs of the native module ``c10d_rs._engine`` (Rust, PyO3).

Tensors cross as descriptors ``(data_ptr, shape, dtype_name, tensor)`` of contiguous CPU
tensors; the engine uses their memory in place and keeps ``tensor`` alive until the op is done.
Reduce ops are ``(RedOpType id, PREMUL_SUM factor)``; timeouts are seconds (None: the group's).
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

Desc = Tuple[int, Tuple[int, ...], str, torch.Tensor]

__version__: str

class PyWork:
    """The handle of one launched op."""

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks with the GIL released; raises the op's error (DistBackendError, ...)."""
    def is_completed(self) -> bool: ...
    def is_success(self) -> bool: ...
    def exception(self) -> Optional[BaseException]: ...
    def source_rank(self) -> Optional[int]: ...
    def sequence_number(self) -> int: ...
    def op_type(self) -> str: ...
    def add_done_callback(self, callback: Callable[[], Any], defer: bool = False) -> None:
        """Calls ``callback()`` once the op finished: on the callback thread (GIL held), or at
        once on this thread if it already has and ``defer`` is False."""

class Engine:
    """One c10d-rs CPU process group (c10d-gloo's ProcessGroupGloo)."""

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: Optional[float],
        group_name: str,
        group_desc: str,
        global_ranks: Sequence[int],
    ) -> None:
        """Connects to every peer through ``store``; raises DistNetworkError after ``timeout`` s."""
    def rank(self) -> int: ...
    def size(self) -> int: ...
    def sequence_number(self) -> int: ...
    def timeout(self) -> float: ...
    def set_timeout(self, timeout: Optional[float]) -> None: ...
    def cross_memory_attach(self) -> Optional[bool]: ...
    def run(
        self,
        name: str,
        outputs: List[List[Desc]],
        inputs: List[List[Desc]],
        timeout: Optional[float] = None,
        async_op: bool = True,
        *,
        root: int = 0,
        root_tensor: int = 0,
        reduce_op: int = 0,
        factor: float = 1.0,
        output_splits: Sequence[int] = (),
        input_splits: Sequence[int] = (),
        peer: int = 0,
        tag: int = 0,
    ) -> PyWork:
        """Runs the op ``name`` (PyTorch's Backend method: "allreduce", "_allgather_base",
        "alltoall_base", "recvAnysource" ...) writing ``outputs`` and reading ``inputs`` (lists
        of lists: a flat list is one list, one tensor a list of one)."""
    def monitored_barrier(self, timeout: Optional[float], wait_all_ranks: bool) -> None: ...
    def abort(self) -> None: ...
    def shutdown(self) -> None: ...

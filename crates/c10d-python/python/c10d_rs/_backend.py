"""The ``torch.distributed`` backend "c10drs": a ``Backend`` subclass over the Rust engine."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d
from torch._C._distributed_c10d import Backend as _CBackend
from torch._C._distributed_c10d import Work as _CWork

from . import _calls, _engine, _group, _sparse
from ._calls import (
    REDUCE_FIELDS,
    ROOT_FIELDS,
    ROOT_REDUCE_FIELDS,
    TIMEOUT_FIELDS,
    incompatible,
    one_or_list,
    options,
    require,
    timeout_of,
)

BACKEND_NAME = "c10drs"

_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
}

_Desc = Tuple[int, Tuple[int, ...], str, torch.Tensor]


def _seconds(td: Optional[timedelta]) -> Optional[float]:
    """Seconds of an options timeout; None when PyTorch left it unset (kUnsetTimeout, -1 ms).

    Zero is a real timeout (``monitored_barrier(timeout=0)`` fails at once, as with Gloo).
    """
    if td is None:
        return None
    s = td.total_seconds()
    return s if s >= 0 else None


def _wait_seconds(td: Optional[timedelta]) -> Optional[float]:
    """Seconds of a ``Work.wait`` timeout; None for PyTorch's kNoTimeout (0)."""
    s = _seconds(td)
    return s if s else None


def _async(opts: Any) -> bool:
    """PyTorch's ``opts.asyncOp`` (True without options): False when the caller waits at once
    (then the op runs inline)."""
    return bool(getattr(opts, "asyncOp", True))


def _reduce_op(op: Any) -> Tuple[int, float]:
    """(RedOpType id, PREMUL_SUM factor) of a ``dist.ReduceOp``."""
    kind = op.op if isinstance(op, dist.ReduceOp) else op
    kid = int(kind.value if hasattr(kind, "value") else kind)
    if kid != int(dist.ReduceOp.PREMUL_SUM.value):
        return kid, 0.0
    factor = op.factor
    if isinstance(factor, torch.Tensor):
        factor = factor.item()
    return kid, float(factor)


class _Staging:
    """Contiguous stand-ins for non-contiguous tensors, copied back when the work is done.

    PyTorch's Gloo accepts non-contiguous tensors in its collectives; so do we, through a
    contiguous copy. Point-to-point and all_to_all_single refuse them, as Gloo does.
    """

    def __init__(self) -> None:
        self.back: List[Tuple[torch.Tensor, torch.Tensor]] = []

    def desc(self, t: torch.Tensor, out: bool) -> _Desc:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"c10drs: expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise ValueError(
                f"c10drs: only CPU tensors are supported, got a tensor on {t.device} "
                '(use "cpu:c10drs,cuda:nccl" to send CUDA tensors to NCCL)'
            )
        if t.is_sparse:
            raise RuntimeError("c10drs: sparse tensors are not supported")
        dtype = _DTYPES.get(t.dtype)
        if dtype is None:
            raise RuntimeError(f"c10drs: unsupported dtype {t.dtype}")
        if not t.is_contiguous():
            c = t.contiguous()
            if out:
                self.back.append((t, c))
            t = c
        return (t.data_ptr(), tuple(t.shape), dtype, t)

    def descs(self, ts: Sequence[torch.Tensor], out: bool) -> List[_Desc]:
        return [self.desc(t, out) for t in ts]

    def lists(self, tss: Sequence[Sequence[torch.Tensor]], out: bool) -> List[List[_Desc]]:
        return [self.descs(ts, out) for ts in tss]

    def copy_back(self) -> None:
        for t, c in self.back:
            t.copy_(c)
        self.back = []


def _nonnegative(value: int, text: str) -> int:
    """``value`` as the engine takes it (unsigned): a negative one raises ``RuntimeError(text)``,
    as Gloo's check of the same argument does."""
    if value < 0:
        raise RuntimeError(text)
    return value


def _root(op: str, opts: Any) -> int:
    """``opts.rootRank``, refused with Gloo's text when negative."""
    return _nonnegative(opts.rootRank, f"ProcessGroupGloo::{op}: invalid root rank: {opts.rootRank}")


def _roots(op: str, opts: Any) -> Tuple[int, int]:
    """``(opts.rootRank, opts.rootTensor)``, each refused with Gloo's text when negative."""
    tensor = opts.rootTensor
    return _root(op, opts), _nonnegative(tensor, f"ProcessGroupGloo::{op}: invalid root tensor: {tensor}")


def _dense(ts: Sequence[torch.Tensor], exc: type, msg: str) -> None:
    for t in ts:
        if not t.is_contiguous():
            raise exc(msg)


class Work(_CWork):
    """A ``torch.distributed.Work`` for one c10drs operation.

    ``wait()`` releases the GIL while the engine works; ``get_future()`` is completed by the
    engine's callback thread with the operation's output tensors (or its error).
    """

    def __init__(
        self,
        work: _engine.PyWork,
        result: Sequence[torch.Tensor] = (),
        staging: Optional[_Staging] = None,
    ) -> None:
        super().__init__()
        _group.made(self)
        self._work = work
        self._result = list(result)
        self._staging = staging
        self._lock = threading.Lock()
        self._future: Optional[torch.futures.Future] = None
        #: Under the profiler: completed once the op's event has ended (see ``_launch``).
        self._profiled: Optional[torch.futures.Future] = None

    def _finish(self) -> None:
        with self._lock:
            if self._staging is not None and self._work.is_success():
                self._staging.copy_back()
            self._staging = None

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        self._work.wait(_wait_seconds(timeout))
        self._finish()
        if self._profiled is not None:
            # The event ends on the callback thread; a caller that leaves the profiler right
            # after wait() must not find it still open (PyTorch's kineto then fails to parse).
            self._profiled.wait()
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> Optional[BaseException]:
        return self._work.exception()

    def source_rank(self) -> int:
        r = self._work.source_rank()
        if r is None:
            raise RuntimeError(
                "sourceRank() may only be called on work objects that correspond to a "
                "recv or recv-from-any call."
            )
        return r

    _source_rank = source_rank

    def result(self) -> List[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            if self._future is not None:
                return self._future
            fut: torch.futures.Future = torch.futures.Future()
            self._future = fut

        def done() -> None:
            self._finish()
            exc = self._work.exception()
            if exc is None:
                fut.set_result(self._result)
            else:
                fut.set_exception(exc)

        self._work.add_done_callback(done)
        return fut

    def __repr__(self) -> str:
        return (
            f"c10d_rs.Work({self._work.op_type()}, seq={self._work.sequence_number()}, "
            f"completed={self._work.is_completed()})"
        )


class ProcessGroupC10dRs(_CBackend):
    """The c10drs backend of one process group (PyTorch calls its methods).

    Mirrors ``ProcessGroupGloo``'s methods and their argument order; every op is launched
    asynchronously on the Rust engine and returns a :class:`Work`.
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta = timedelta(minutes=30),
        group_name: str = "0",
        group_desc: str = "undefined",
        global_ranks: Sequence[int] = (),
    ) -> None:
        super().__init__(rank, size)
        self._timeout = timeout
        self._engine = _engine.Engine(
            store, rank, size, _seconds(timeout), str(group_name), group_desc, list(global_ranks)
        )

    #: Prefix of this backend's profiler events (the name it is registered under).
    profiling_prefix: str = BACKEND_NAME

    # -- identity ----------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 (PyTorch's name)
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    @property
    def supports_coalescing(self) -> bool:
        """False: ``batch_isend_irecv`` issues each op on its own (as with Gloo)."""
        return False

    @property
    def supports_splitting(self) -> bool:
        """False: subgroups rendezvous through the store."""
        return False

    def _get_sequence_number_for_group(self) -> int:
        return self._engine.sequence_number()

    def _set_sequence_number_for_group(self) -> None:
        pass

    def _set_timeout(self, timeout: timedelta) -> None:
        self._engine.set_timeout(_seconds(timeout))
        self._timeout = timeout

    set_timeout = _set_timeout
    #: ``ProcessGroupGloo._set_default_timeout``.
    _set_default_timeout = _set_timeout

    @property
    def options(self) -> Any:
        """``pg.options`` as PyTorch's backends answer it: a ``Backend.Options`` with this
        backend's name and its current default timeout (``_timeout``, a ``timedelta``)."""
        return _c10d.Backend.Options(BACKEND_NAME, self._timeout)

    def _launch(
        self,
        name: str,
        launch: Callable[[_Staging], _engine.PyWork],
        result: Sequence[torch.Tensor],
    ) -> Work:
        """Launches one op; under the autograd profiler it shows as the async event
        ``c10drs:<name>`` (``name`` as torch.distributed's function: ``all_reduce``,
        ``all_gather_into_tensor`` …) that ends when the op completes, as Gloo's ``gloo:<name>``."""
        rf = None
        if torch.autograd._profiler_enabled():
            rf = torch.autograd.profiler.record_function(f"{self.profiling_prefix}:{name}")
            rf.__enter__()
        staging = _Staging()
        try:
            work = Work(launch(staging), result, staging if staging.back else None)
        except BaseException:
            if rf is not None:
                rf.__exit__(None, None, None)
            raise
        if rf is not None:
            # The event ends on the callback thread, so the profiler sees it as async (as
            # Gloo's events, which end on Gloo's worker threads), even for a blocking op.
            done: torch.futures.Future = torch.futures.Future()
            work._profiled = rf._call_end_callbacks_on_future(done)
            work._work.add_done_callback(lambda: done.set_result(None), True)
        return work

    def _collective(
        self,
        name: str,
        opts: Any,
        launch: Callable[[_Staging, Optional[float], bool], _engine.PyWork],
        result: Sequence[torch.Tensor],
    ) -> Work:
        """A collective launched with its options' timeout (seconds) and ``asyncOp``."""
        to, async_op = _seconds(getattr(opts, "timeout", None)), _async(opts)
        return self._launch(name, lambda s: launch(s, to, async_op), result)

    # -- collectives ---------------------------------------------------------------------
    # Each method takes every call form PyTorch's bindings declare (see ``_calls``).
    def allreduce(self, tensors: Any, *args: Any, **kw: Any) -> Work:
        """``(tensors, opts)`` / ``(tensors or tensor, op=SUM, timeout=None)``; sparse COO
        tensors are summed as Gloo sums them (``_sparse``)."""
        ts, _ = one_or_list("allreduce", tensors)
        opts = options("allreduce", _c10d.AllreduceOptions, args, kw, REDUCE_FIELDS)
        if _sparse.is_sparse_call(ts):
            return self.allreduce_sparse(ts, opts)
        op, factor = _reduce_op(opts.reduceOp)
        e = self._engine
        return self._collective(
            "all_reduce",
            opts,
            lambda s, to, a: e.run("allreduce", [s.descs(ts, True)], [], to, a, reduce_op=op, factor=factor),
            ts,
        )

    def allreduce_sparse(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        """all_reduce of sparse COO tensors (``ReduceOp.SUM``), with Gloo's semantics."""
        opts = opts if opts is not None else _c10d.AllreduceOptions()
        _sparse.check(tensors, opts.reduceOp)
        to = _seconds(opts.timeout)
        last: List[_engine.PyWork] = []

        def all_gather(outs: List[torch.Tensor], inp: torch.Tensor) -> None:
            s = _Staging()
            w = self._engine.run("allgather", [s.descs(outs, True)], [s.descs([inp], False)], to, False)
            w.wait(None)
            last[:] = [w]

        result = _sparse.all_reduce(tensors, self.size(), all_gather)
        # As Gloo's: the result once per input tensor.
        return Work(last[0], [result for _ in tensors])

    def allreduce_coalesced(self, tensors: List[torch.Tensor], *args: Any, **kw: Any) -> Work:
        opts = options("allreduce_coalesced", _c10d.AllreduceCoalescedOptions, args, kw, ())
        _sparse.check_coalesced(tensors)
        op, factor = _reduce_op(opts.reduceOp)
        e = self._engine
        return self._collective(
            "all_reduce",
            opts,
            lambda s, to, a: e.run(
                "allreduce_coalesced", [s.descs(tensors, True)], [], to, a, reduce_op=op, factor=factor
            ),
            tensors,
        )

    def broadcast(self, tensors: Any, *args: Any, **kw: Any) -> Work:
        """``(tensors, opts)`` / ``(tensor, root, timeout=None)``."""
        ts, single = one_or_list("broadcast", tensors)
        require("broadcast", single, args, kw, 1)
        opts = options("broadcast", _c10d.BroadcastOptions, args, kw, ROOT_FIELDS)
        root, root_tensor = _roots("broadcast", opts)
        e = self._engine
        return self._collective(
            "broadcast",
            opts,
            lambda s, to, a: e.run(
                "broadcast", [s.descs(ts, True)], [], to, a, root=root, root_tensor=root_tensor
            ),
            ts,
        )

    def reduce(self, tensors: Any, *args: Any, **kw: Any) -> Work:
        """``(tensors, opts)`` / ``(tensor, root, op=SUM, timeout)``."""
        ts, single = one_or_list("reduce", tensors)
        require("reduce", single, args, kw, 1)
        opts = options("reduce", _c10d.ReduceOptions, args, kw, ROOT_REDUCE_FIELDS)
        op, factor = _reduce_op(opts.reduceOp)
        root, root_tensor = _roots("reduce", opts)
        e = self._engine
        return self._collective(
            "reduce",
            opts,
            lambda s, to, a: e.run(
                "reduce", [s.descs(ts, True)], [], to, a,
                root=root, root_tensor=root_tensor, reduce_op=op, factor=factor,
            ),
            ts,
        )

    def allgather(self, outputs: Any, inputs: Any, *args: Any, **kw: Any) -> Work:
        """``(output lists, inputs, opts)`` / ``(outputs, input, timeout)``."""
        if isinstance(inputs, torch.Tensor):
            outputs, inputs = [list(outputs)], [inputs]
        opts = options("allgather", _c10d.AllgatherOptions, args, kw, TIMEOUT_FIELDS)
        lists, ins = _calls.gloo_allgather_layout(outputs, inputs, self.size())
        e = self._engine
        return self._collective(
            "all_gather",
            opts,
            lambda s, to, a: e.run("allgather", s.lists(lists, True), [s.descs(ins, False)], to, a),
            outputs[0] if len(outputs) == 1 else outputs,
        )

    def allgather_coalesced(
        self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor], *args: Any, **kw: Any
    ) -> Work:
        opts = options("allgather_coalesced", _c10d.AllgatherOptions, args, kw, ())
        e = self._engine
        return self._collective(
            "all_gather",
            opts,
            lambda s, to, a: e.run(
                "allgather_coalesced", s.lists(outputs, True), [s.descs(inputs, False)], to, a
            ),
            [t for ts in outputs for t in ts],
        )

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> Work:
        e = self._engine
        return self._collective(
            "all_gather_into_tensor",
            opts,
            lambda s, to, a: e.run(
                "_allgather_base", [[s.desc(output, True)]], [[s.desc(input, False)]], to, a
            ),
            [output],
        )

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> Work:
        e = self._engine
        return self._collective(
            "all_gather_into_tensor",
            opts,
            lambda s, to, a: e.run(
                "allgather_into_tensor_coalesced",
                [s.descs(outputs, True)], [s.descs(inputs, False)], to, a,
            ),
            outputs,
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, outputs: Any, inputs: Any, *args: Any, **kw: Any) -> Work:
        """``(output lists, inputs, opts)`` / ``(outputs, input, root, timeout)``."""
        single = isinstance(inputs, torch.Tensor)
        if single:
            outputs, inputs = ([list(outputs)] if len(outputs) else []), [inputs]
        require("gather", single, args, kw, 1)
        opts = options("gather", _c10d.GatherOptions, args, kw, ROOT_FIELDS)
        root = _root("gather", opts)
        e = self._engine
        return self._collective(
            "gather",
            opts,
            lambda s, to, a: e.run(
                "gather", s.lists(outputs, True), [s.descs(inputs, False)], to, a, root=root
            ),
            [t for ts in outputs for t in ts],
        )

    def scatter(self, outputs: Any, inputs: Any, *args: Any, **kw: Any) -> Work:
        """``(outputs, input lists, opts)`` / ``(output, inputs, root, timeout)``."""
        single = isinstance(outputs, torch.Tensor)
        if single:
            outputs, inputs = [outputs], ([list(inputs)] if len(inputs) else [])
        require("scatter", single, args, kw, 1)
        opts = options("scatter", _c10d.ScatterOptions, args, kw, ROOT_FIELDS)
        root = _root("scatter", opts)
        e = self._engine
        return self._collective(
            "scatter",
            opts,
            lambda s, to, a: e.run(
                "scatter", [s.descs(outputs, True)], s.lists(inputs, False), to, a, root=root
            ),
            outputs,
        )

    def reduce_scatter(self, outputs: Any, inputs: Any, *args: Any, **kw: Any) -> Work:
        """``(outputs, input lists, opts)`` / ``(output, inputs, op=SUM, timeout)``."""
        if isinstance(outputs, torch.Tensor):
            outputs, inputs = [outputs], [list(inputs)]
        opts = options("reduce_scatter", _c10d.ReduceScatterOptions, args, kw, REDUCE_FIELDS)
        op, factor = _reduce_op(opts.reduceOp)
        e = self._engine
        return self._collective(
            "reduce_scatter",
            opts,
            lambda s, to, a: e.run(
                "reduce_scatter", [s.descs(outputs, True)], s.lists(inputs, False), to, a,
                reduce_op=op, factor=factor,
            ),
            outputs,
        )

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> Work:
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        op, factor = _reduce_op(opts.reduceOp)
        e = self._engine
        return self._collective(
            "reduce_scatter_tensor",
            opts,
            lambda s, to, a: e.run(
                "_reduce_scatter_base", [[s.desc(output, True)]], [[s.desc(input, False)]], to, a,
                reduce_op=op, factor=factor,
            ),
            [output],
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> Work:
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        op, factor = _reduce_op(opts.reduceOp)
        e = self._engine
        return self._collective(
            "reduce_scatter_tensor",
            opts,
            lambda s, to, a: e.run(
                "reduce_scatter_tensor_coalesced", [s.descs(outputs, True)],
                [s.descs(inputs, False)], to, a, reduce_op=op, factor=factor,
            ),
            outputs,
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], *args: Any, **kw: Any
    ) -> Work:
        opts = options("alltoall", _c10d.AllToAllOptions, args, kw, ())
        e = self._engine
        return self._collective(
            "all_to_all",
            opts,
            lambda s, to, a: e.run("alltoall", [s.descs(outputs, True)], [s.descs(inputs, False)], to, a),
            outputs,
        )

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: List[int],
        input_splits: List[int],
        *args: Any,
        **kw: Any,
    ) -> Work:
        """``(output, input, output splits, input splits, opts)`` / ``(…, timeout)``."""
        opts = options("alltoall_base", _c10d.AllToAllOptions, args, kw, TIMEOUT_FIELDS)
        _dense([output, input], ValueError, "Tensors must be contiguous")
        for sz in list(output_splits) + list(input_splits):
            _nonnegative(sz, "Split sizes must be non-negative")
        outs, ins, e = list(output_splits), list(input_splits), self._engine
        return self._collective(
            "all_to_all_single",
            opts,
            lambda s, to, a: e.run(
                "alltoall_base", [[s.desc(output, True)]], [[s.desc(input, False)]], to, a,
                output_splits=outs, input_splits=ins,
            ),
            [output],
        )

    alltoall_base = all_to_all_single

    def barrier(self, *args: Any, **kw: Any) -> Work:
        opts = options("barrier", _c10d.BarrierOptions, args, kw, ())
        e = self._engine
        return self._collective("barrier", opts, lambda s, to, a: e.run("barrier", [], [], to, a), [])

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """``(timeout=None, wait_all_ranks=False)``; an options object's timeout is taken too."""
        self._engine.monitored_barrier(_seconds(timeout_of(timeout)), wait_all_ranks)

    # -- point to point ------------------------------------------------------------------
    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Work:
        _dense(tensors, RuntimeError, "input tensor has to be contiguous")
        _nonnegative(tag, "Tag must be nonnegative")
        _nonnegative(dst, f"ProcessGroupGloo::send: invalid destination rank {dst}")
        return self._launch("send", lambda s: self._engine.run("send", [], [s.descs(tensors, False)], peer=dst, tag=tag), [])

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Work:
        _dense(tensors, RuntimeError, "output tensor has to be contiguous")
        _nonnegative(tag, "Tag must be nonnegative")
        _nonnegative(src, f"ProcessGroupGloo::recv: invalid source rank {src}")
        return self._launch("recv", lambda s: self._engine.run("recv", [s.descs(tensors, True)], [], peer=src, tag=tag), tensors)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Work:
        _dense(tensors, RuntimeError, "output tensor has to be contiguous")
        _nonnegative(tag, "Tag must be nonnegative")
        return self._launch("recv_anysource",
            lambda s: self._engine.run("recvAnysource", [s.descs(tensors, True)], [], tag=tag), tensors
        )

    # -- lifetime ------------------------------------------------------------------------
    def abort(self) -> None:
        self._engine.abort()

    def shutdown(self) -> None:
        self._engine.shutdown()


def _backend_of(group: Optional[dist.ProcessGroup]) -> ProcessGroupC10dRs:
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise ValueError("Default process group has not been initialized")
    backend = pg._get_backend(torch.device("cpu"))
    if not isinstance(backend, ProcessGroupC10dRs):
        raise ValueError(f"group {pg.group_name} does not run c10drs on CPU")
    return backend


def recv_any(
    tensor: torch.Tensor, group: Optional[dist.ProcessGroup] = None, tag: int = 0
) -> int:
    """``dist.recv(tensor)`` without ``src`` for "c10drs" groups; returns the sender's global rank.

    PyTorch forwards only ``wait`` and ``get_future`` of a Python backend's Work through its
    own ``Work`` objects, so ``dist.recv(tensor)`` cannot read the sender from a Python
    backend (it raises "sourceRank() may only be called on work objects that correspond to a
    recv or recv-from-any call"). This calls the backend directly instead.
    """
    backend = _backend_of(group)
    work = backend.recv_anysource([tensor], tag)
    work.wait()
    src = work.source_rank()
    return dist.get_global_rank(group, src) if group is not None else src


def create_backend(dist_backend_opts: Any, backend_options: Any = None) -> Any:
    """The creator PyTorch calls (``extended_api=True``) for every group on "c10drs": the
    group itself (a ``_group.Group``, so that users get our ``Work``) where PyTorch
    allows it, else the backend (see ``_group``)."""
    o = dist_backend_opts
    backend = ProcessGroupC10dRs(
        o.store,
        o.group_rank,
        o.group_size,
        o.timeout,
        group_name=str(o.group_id),
        group_desc=str(getattr(backend_options, "group_desc", "undefined") or "undefined"),
        global_ranks=list(o.global_ranks_in_group or []),
    )
    if _group.usable():
        return _group.Group(o.store, o.group_rank, o.group_size, backend)
    return backend


def register() -> None:
    """Registers "c10drs" for device "cpu" with ``torch.distributed`` (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True, devices=["cpu"])

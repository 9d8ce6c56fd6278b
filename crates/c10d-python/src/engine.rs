//! [`Engine`]: one c10d-rs CPU process group ([`ProcessGroupGloo`]) driven from Python.
//!
//! Every method mirrors one `c10d::Backend` op with PyTorch's argument order; tensors come as
//! descriptors (see [`crate::tensor`]), reduce ops as `(RedOpType id, PREMUL_SUM factor)`,
//! timeouts in seconds (None: the group's default). Every op returns a [`PyWork`]; the GIL is
//! released while the engine takes the op. `async_op` is PyTorch's `opts.asyncOp`: False when
//! the caller (`dist.all_reduce(..., async_op=False)`) waits right away, and then the op runs
//! on the calling thread when the engine is free, as a blocking call of c10d-gloo does — on a
//! 2-core VM that saves two thread wake-ups (≈ 30 µs each) per op.

use crate::errors::py_result;
use crate::store::PyStore;
use crate::tensor::{tensor_lists, tensors, TensorArg};
use crate::work::PyWork;
use c10d_core::*;
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Arc;
use std::time::Duration;

/// A c10d-rs CPU process group (`ProcessGroupGloo` of c10d-gloo) for one torch.distributed group.
#[pyclass(frozen, module = "c10d_rs._engine")]
pub struct Engine {
    pg: Arc<ProcessGroupGloo>,
}

/// An op's timeout: None (or negative, PyTorch's unset) → the group's default; 0 is a real,
/// already expired timeout.
fn secs(t: Option<f64>) -> Option<Duration> {
    t.filter(|s| *s >= 0.0 && s.is_finite())
        .map(Duration::from_secs_f64)
}

/// A group's default timeout: None or 0 → PyTorch's default (30 min).
fn group_timeout(t: Option<f64>) -> Duration {
    secs(t).filter(|t| !t.is_zero()).unwrap_or(DEFAULT_TIMEOUT)
}

fn reduce_op(id: u8, factor: f64) -> PyResult<ReduceOp> {
    ReduceOp::from_id(id, factor)
        .ok_or_else(|| PyValueError::new_err(format!("c10drs: unknown ReduceOp id {id}")))
}

impl Engine {
    /// Launches `f` with the GIL released and wraps its work.
    fn launch(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&ProcessGroupGloo) -> Result<Work> + Send,
    ) -> PyResult<PyWork> {
        let pg = &self.pg;
        py_result(py.detach(|| f(pg))).map(PyWork::new)
    }
}

#[pymethods]
impl Engine {
    /// Joins group `group_name` as `rank` of `size` through `store` (any torch.distributed
    /// Store; PyTorch passes the group's prefixed store); `timeout` in seconds, None or 0 for
    /// PyTorch's 30 min default. Blocks (GIL released) until every
    /// peer is connected or `timeout` seconds passed (then `DistNetworkError`).
    #[new]
    #[pyo3(signature = (store, rank, size, timeout, group_name, group_desc, global_ranks))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        store: Py<PyAny>,
        rank: usize,
        size: usize,
        timeout: Option<f64>,
        group_name: String,
        group_desc: String,
        global_ranks: Vec<usize>,
    ) -> PyResult<Engine> {
        let base = BackendOptions {
            backend: "c10drs".into(),
            timeout: group_timeout(timeout),
            group_name,
            group_desc,
            global_ranks,
        };
        let opts = GlooOptions {
            hostname_hint: std::env::var("MASTER_ADDR").ok(),
            ..GlooOptions::from_backend_options(&base)
        };
        let store: Arc<dyn c10d_store::Store> = Arc::new(PyStore::new(store));
        let pg = py_result(py.detach(|| ProcessGroupGloo::new(store, rank, size, opts)))?;
        Ok(Engine { pg })
    }

    /// This process's rank in the group.
    fn rank(&self) -> usize {
        self.pg.rank()
    }
    /// Number of ranks in the group.
    fn size(&self) -> usize {
        self.pg.size()
    }
    /// Ops issued so far (`_get_sequence_number_for_group`).
    fn sequence_number(&self) -> u64 {
        self.pg.sequence_number()
    }
    /// Default per-op timeout in seconds.
    fn timeout(&self) -> f64 {
        self.pg.timeout().as_secs_f64()
    }
    /// Changes the default per-op timeout (seconds; None or 0: PyTorch's 30 min default).
    #[pyo3(signature = (timeout=None))]
    fn set_timeout(&self, timeout: Option<f64>) {
        self.pg.set_timeout(group_timeout(timeout));
    }
    /// Whether every rank of the group is on this host and cross-memory attach is in use
    /// (None until the group has decided).
    fn cross_memory_attach(&self) -> Option<bool> {
        self.pg.cross_memory_attach()
    }

    /// `allreduce`.
    #[pyo3(signature = (ts, op, factor, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn allreduce(
        &self,
        py: Python<'_>,
        ts: Vec<TensorArg>,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (ts, reduce_op) = (tensors(ts)?, reduce_op(op, factor)?);
        let o = AllreduceOptions {
            reduce_op,
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.all_reduce(&ts, &o))
    }

    /// `allreduce_coalesced`.
    #[pyo3(signature = (ts, op, factor, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn allreduce_coalesced(
        &self,
        py: Python<'_>,
        ts: Vec<TensorArg>,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (ts, reduce_op) = (tensors(ts)?, reduce_op(op, factor)?);
        let o = AllreduceCoalescedOptions {
            reduce_op,
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.all_reduce_coalesced(&ts, &o))
    }

    /// `broadcast`.
    #[pyo3(signature = (ts, root, root_tensor, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn broadcast(
        &self,
        py: Python<'_>,
        ts: Vec<TensorArg>,
        root: usize,
        root_tensor: usize,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let ts = tensors(ts)?;
        let o = BroadcastOptions {
            root_rank: root,
            root_tensor,
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.broadcast(&ts, &o))
    }

    /// `reduce`.
    #[pyo3(signature = (ts, root, root_tensor, op, factor, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        py: Python<'_>,
        ts: Vec<TensorArg>,
        root: usize,
        root_tensor: usize,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (ts, reduce_op) = (tensors(ts)?, reduce_op(op, factor)?);
        let o = ReduceOptions {
            reduce_op,
            root_rank: root,
            root_tensor,
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.reduce(&ts, &o))
    }

    /// `allgather`: `outputs[i][r]` receives rank r's `inputs[i]`.
    #[pyo3(signature = (outputs, inputs, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn allgather(
        &self,
        py: Python<'_>,
        outputs: Vec<Vec<TensorArg>>,
        inputs: Vec<TensorArg>,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (outs, ins) = (tensor_lists(outputs)?, tensors(inputs)?);
        let o = AllgatherOptions {
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.all_gather(&outs, &ins, &o))
    }

    /// `allgather_coalesced`.
    #[pyo3(signature = (outputs, inputs, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn allgather_coalesced(
        &self,
        py: Python<'_>,
        outputs: Vec<Vec<TensorArg>>,
        inputs: Vec<TensorArg>,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (outs, ins) = (tensor_lists(outputs)?, tensors(inputs)?);
        let o = AllgatherOptions {
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.all_gather_coalesced(&outs, &ins, &o))
    }

    /// `_allgather_base` / `all_gather_into_tensor`: dim-0 concatenation into `output`.
    #[pyo3(signature = (output, input, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn allgather_into_tensor(
        &self,
        py: Python<'_>,
        output: TensorArg,
        input: TensorArg,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (out, inp) = (output.into_tensor()?, input.into_tensor()?);
        let o = AllgatherOptions {
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.all_gather_into_tensor(&out, &inp, &o))
    }

    /// `allgather_into_tensor_coalesced`.
    #[pyo3(signature = (outputs, inputs, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn allgather_into_tensor_coalesced(
        &self,
        py: Python<'_>,
        outputs: Vec<TensorArg>,
        inputs: Vec<TensorArg>,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (outs, ins) = (tensors(outputs)?, tensors(inputs)?);
        let o = AllgatherOptions {
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| {
            pg.all_gather_into_tensor_coalesced(&outs, &ins, &o)
        })
    }

    /// `gather` to `root`: `outputs[0][r]` (root only) receives rank r's `inputs[0]`.
    #[pyo3(signature = (outputs, inputs, root, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        py: Python<'_>,
        outputs: Vec<Vec<TensorArg>>,
        inputs: Vec<TensorArg>,
        root: usize,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (outs, ins) = (tensor_lists(outputs)?, tensors(inputs)?);
        let o = GatherOptions {
            root_rank: root,
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.gather(&outs, &ins, &o))
    }

    /// `scatter` from `root`: rank r's `outputs[0]` receives the root's `inputs[0][r]`.
    #[pyo3(signature = (outputs, inputs, root, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn scatter(
        &self,
        py: Python<'_>,
        outputs: Vec<TensorArg>,
        inputs: Vec<Vec<TensorArg>>,
        root: usize,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (outs, ins) = (tensors(outputs)?, tensor_lists(inputs)?);
        let o = ScatterOptions {
            root_rank: root,
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.scatter(&outs, &ins, &o))
    }

    /// `reduce_scatter` (list form).
    #[pyo3(signature = (outputs, inputs, op, factor, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        outputs: Vec<TensorArg>,
        inputs: Vec<Vec<TensorArg>>,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (outs, ins) = (tensors(outputs)?, tensor_lists(inputs)?);
        let o = ReduceScatterOptions {
            reduce_op: reduce_op(op, factor)?,
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.reduce_scatter(&outs, &ins, &o))
    }

    /// `_reduce_scatter_base` / `reduce_scatter_tensor`.
    #[pyo3(signature = (output, input, op, factor, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter_tensor(
        &self,
        py: Python<'_>,
        output: TensorArg,
        input: TensorArg,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (out, inp) = (output.into_tensor()?, input.into_tensor()?);
        let o = ReduceScatterOptions {
            reduce_op: reduce_op(op, factor)?,
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.reduce_scatter_tensor(&out, &inp, &o))
    }

    /// `reduce_scatter_tensor_coalesced`.
    #[pyo3(signature = (outputs, inputs, op, factor, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter_tensor_coalesced(
        &self,
        py: Python<'_>,
        outputs: Vec<TensorArg>,
        inputs: Vec<TensorArg>,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (outs, ins) = (tensors(outputs)?, tensors(inputs)?);
        let o = ReduceScatterOptions {
            reduce_op: reduce_op(op, factor)?,
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.reduce_scatter_tensor_coalesced(&outs, &ins, &o))
    }

    /// `alltoall` (list form).
    #[pyo3(signature = (outputs, inputs, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn alltoall(
        &self,
        py: Python<'_>,
        outputs: Vec<TensorArg>,
        inputs: Vec<TensorArg>,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (outs, ins) = (tensors(outputs)?, tensors(inputs)?);
        let o = AllToAllOptions {
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| pg.all_to_all(&outs, &ins, &o))
    }

    /// `alltoall_base` / `all_to_all_single`; split sizes in dim-0 rows (empty: even split).
    #[pyo3(signature = (output, input, output_splits, input_splits, timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn alltoall_base(
        &self,
        py: Python<'_>,
        output: TensorArg,
        input: TensorArg,
        output_splits: Vec<usize>,
        input_splits: Vec<usize>,
        timeout: Option<f64>,
        async_op: bool,
    ) -> PyResult<PyWork> {
        let (out, inp) = (output.into_tensor()?, input.into_tensor()?);
        let o = AllToAllOptions {
            timeout: secs(timeout),
            async_op,
        };
        self.launch(py, |pg| {
            pg.all_to_all_single(&out, &inp, &output_splits, &input_splits, &o)
        })
    }

    /// `barrier`.
    #[pyo3(signature = (timeout=None, async_op=true))]
    #[allow(clippy::too_many_arguments)]
    fn barrier(&self, py: Python<'_>, timeout: Option<f64>, async_op: bool) -> PyResult<PyWork> {
        let o = BarrierOptions {
            timeout: secs(timeout),
            async_op,
            ..Default::default()
        };
        self.launch(py, |pg| pg.barrier(&o))
    }

    /// `monitored_barrier`: blocks (GIL released); fails naming the ranks that did not arrive
    /// within `timeout` seconds (all of them with `wait_all_ranks`).
    #[pyo3(signature = (timeout, wait_all_ranks))]
    fn monitored_barrier(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        wait_all_ranks: bool,
    ) -> PyResult<()> {
        let o = BarrierOptions {
            timeout: secs(timeout),
            ..Default::default()
        };
        let pg = &self.pg;
        py_result(py.detach(|| pg.monitored_barrier(&o, wait_all_ranks)))
    }

    /// `send` to group rank `dst`.
    fn send(&self, py: Python<'_>, ts: Vec<TensorArg>, dst: usize, tag: i64) -> PyResult<PyWork> {
        let ts = tensors(ts)?;
        self.launch(py, |pg| pg.send(&ts, dst, tag))
    }

    /// `recv` from group rank `src`.
    fn recv(&self, py: Python<'_>, ts: Vec<TensorArg>, src: usize, tag: i64) -> PyResult<PyWork> {
        let ts = tensors(ts)?;
        self.launch(py, |pg| pg.recv(&ts, src, tag))
    }

    /// `recv_anysource`: the work's `source_rank()` says who sent.
    fn recv_anysource(&self, py: Python<'_>, ts: Vec<TensorArg>, tag: i64) -> PyResult<PyWork> {
        let ts = tensors(ts)?;
        self.launch(py, |pg| pg.recv_anysource(&ts, tag))
    }

    /// Fails every pending op of the group at once and closes its connections (`abort`).
    fn abort(&self, py: Python<'_>) {
        let pg = &self.pg;
        py.detach(|| pg.abort());
    }

    /// Finishes pending ops, then closes the group (`shutdown`).
    fn shutdown(&self, py: Python<'_>) {
        let pg = &self.pg;
        py.detach(|| pg.shutdown());
    }
}

//! [`Engine`]: one c10d-rs CPU process group ([`ProcessGroupGloo`]) driven from Python.
//!
//! One entry point, `run`, takes every op as PyTorch's `Backend` method name and its
//! arguments ([`crate::call`] builds the [`Op`]); tensors come as descriptors (see
//! [`crate::tensor`]), reduce ops as `(RedOpType id, PREMUL_SUM factor)`, timeouts in seconds
//! (None: the group's default). Every op returns a [`PyWork`]; the GIL is released while the
//! engine takes the op. `async_op` is PyTorch's `opts.asyncOp`: False when
//! the caller (`dist.all_reduce(..., async_op=False)`) waits right away, and then the op runs
//! on the calling thread when the engine is free, as a blocking call of c10d-gloo does — on a
//! 2-core VM that saves two thread wake-ups (≈ 30 µs each) per op.

use crate::call::{self, CallOptions};
use crate::errors::py_result;
use crate::store::PyStore;
use crate::tensor::{tensor_lists, TensorArg};
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

    /// Runs one op: `name` is PyTorch's `Backend` method (`"allreduce"`, `"_allgather_base"`,
    /// `"alltoall_base"`, `"recvAnysource"` …), `outputs` the tensors it writes and `inputs`
    /// those it reads, each a list of lists of descriptors (see [`crate::call`]); `reduce_op`
    /// and `factor` are PyTorch's `RedOpType` id and PREMUL_SUM factor; `output_splits` /
    /// `input_splits` are `alltoall_base`'s; `peer` and `tag` a send's or receive's.
    #[pyo3(signature = (name, outputs, inputs, timeout=None, async_op=true, *, root=0,
        root_tensor=0, reduce_op=0, factor=1.0, output_splits=Vec::new(),
        input_splits=Vec::new(), peer=0, tag=0))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        name: &str,
        outputs: Vec<Vec<TensorArg>>,
        inputs: Vec<Vec<TensorArg>>,
        timeout: Option<f64>,
        async_op: bool,
        root: usize,
        root_tensor: usize,
        reduce_op: u8,
        factor: f64,
        output_splits: Vec<usize>,
        input_splits: Vec<usize>,
        peer: usize,
        tag: i64,
    ) -> PyResult<PyWork> {
        let o = CallOptions {
            timeout: secs(timeout),
            async_op,
            root,
            root_tensor,
            reduce_op: self::reduce_op(reduce_op, factor)?,
            splits: (output_splits, input_splits),
            peer: (peer, tag),
        };
        let op = call::build(name, tensor_lists(outputs)?, tensor_lists(inputs)?, o)?;
        let pg = &self.pg;
        py_result(py.detach(|| pg.run(op))).map(PyWork::new)
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

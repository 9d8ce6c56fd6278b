//! `TORCH_DISTRIBUTED_DEBUG=DETAIL`: a backend wrapper that checks every collective across ranks
//! before running it (mirrors PyTorch's `ProcessGroupWrapper`).
//!
//! Before each collective the wrapper runs, on a helper CPU backend of the same ranks:
//! 1. a monitored barrier (a rank that hangs is named: "Ranks 1 failed to pass monitoredBarrier");
//! 2. an all-gather of the fingerprints' lengths, then of the fingerprints (op type, sequence
//!    number, tensor count, dtypes, device types, shapes) padded to the longest;
//!
//! and fails with PyTorch's text, e.g. `Detected mismatch between collectives on ranks. Rank 0 is
//! running collective: CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE,
//! TensorShape=[2], TensorDtypes=Float, TensorDeviceTypes=CPU), but Rank 1 is running collective:
//! CollectiveFingerPrint(...).Collectives differ in the following aspects: ...`. Departure from
//! PyTorch: the real sequence number is
//! printed (PyTorch prints 0), and a length mismatch is reported with both full fingerprints.
//!
//! Which tensors are fingerprinted follows PyTorch: inputs for most ops; outputs for scatter and
//! reduce_scatter; input and output for `_reduce_scatter_base`; none for the coalesced ops,
//! all-to-all, barrier and uneven all-gather/reduce-scatter lists. Point-to-point ops are not checked.

use c10d_core::{
    AllgatherOptions, Backend, BackendOptions, BarrierOptions, Collectives, DType, DeviceType,
    DistError, Op, OpType, Result, Tensor, Work,
};
use std::sync::Arc;
use std::time::Duration;

/// A collective's description as exchanged in DETAIL mode (`CollectiveFingerPrint`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveFingerPrint {
    /// Operation.
    pub op: OpType,
    /// Group sequence number when the op was issued.
    pub sequence_number: u64,
    /// Dtypes of the fingerprinted tensors.
    pub dtypes: Vec<DType>,
    /// Device types of the fingerprinted tensors.
    pub device_types: Vec<DeviceType>,
    /// Shapes of the fingerprinted tensors.
    pub shapes: Vec<Vec<usize>>,
}

fn op_code(op: OpType) -> i64 {
    op.code() as i64
}

fn device_name(d: DeviceType) -> &'static str {
    match d {
        DeviceType::Cpu => "CPU",
        DeviceType::Cuda => "CUDA",
    }
}

impl CollectiveFingerPrint {
    /// The fingerprint of `op` over `tensors` at `seq`.
    pub fn new(op: OpType, tensors: &[&Tensor], seq: u64) -> Self {
        CollectiveFingerPrint {
            op,
            sequence_number: seq,
            dtypes: tensors.iter().map(|t| t.dtype()).collect(),
            device_types: tensors.iter().map(|t| t.device().device_type()).collect(),
            shapes: tensors.iter().map(|t| t.shape().to_vec()).collect(),
        }
    }

    /// Serialises to int64s: op, seq, count, dtypes, device types, then (len, dims...) per shape.
    pub fn serialize(&self) -> Vec<i64> {
        let mut v = vec![
            op_code(self.op),
            self.sequence_number as i64,
            self.dtypes.len() as i64,
        ];
        v.extend(self.dtypes.iter().map(|d| d.code() as i64));
        v.extend(self.device_types.iter().map(|d| *d as i64));
        for s in &self.shapes {
            v.push(s.len() as i64);
            v.extend(s.iter().map(|&x| x as i64));
        }
        v
    }

    /// Inverse of [`CollectiveFingerPrint::serialize`].
    ///
    /// # Errors
    /// [`DistError::Backend`] for a malformed buffer.
    pub fn deserialize(v: &[i64]) -> Result<Self> {
        let bad = || DistError::backend(format!("malformed collective fingerprint {v:?}"));
        let mut it = v.iter().copied();
        let mut next = || it.next().ok_or_else(bad);
        let op = u8::try_from(next()?)
            .ok()
            .and_then(OpType::from_code)
            .ok_or_else(bad)?;
        let seq = next()? as u64;
        let n = next()? as usize;
        if n > v.len() {
            return Err(bad());
        }
        let mut dtypes = Vec::with_capacity(n);
        for _ in 0..n {
            dtypes.push(DType::from_code(next()? as u8).ok_or_else(bad)?);
        }
        let mut device_types = Vec::with_capacity(n);
        for _ in 0..n {
            device_types.push(if next()? == 0 {
                DeviceType::Cpu
            } else {
                DeviceType::Cuda
            });
        }
        let mut shapes = Vec::with_capacity(n);
        for _ in 0..n {
            let len = next()? as usize;
            if len > v.len() {
                return Err(bad());
            }
            let mut s = Vec::with_capacity(len);
            for _ in 0..len {
                s.push(next()? as usize);
            }
            shapes.push(s);
        }
        Ok(CollectiveFingerPrint {
            op,
            sequence_number: seq,
            dtypes,
            device_types,
            shapes,
        })
    }

    fn size_strs(&self) -> Vec<String> {
        self.shapes
            .first()
            .map(|s| s.iter().map(|x| x.to_string()).collect())
            .unwrap_or_default()
    }
    fn dtype_strs(&self) -> Vec<String> {
        self.dtypes
            .iter()
            .map(|d| d.torch_name().to_string())
            .collect()
    }
    fn device_strs(&self) -> Vec<String> {
        self.device_types
            .iter()
            .map(|d| device_name(*d).to_string())
            .collect()
    }

    /// "Collectives differ in the following aspects: ..." text, `None` when nothing differs.
    pub fn diff(&self, other: &CollectiveFingerPrint) -> Option<String> {
        let mut found = false;
        let mut s = String::from("Collectives differ in the following aspects: ");
        if other.sequence_number != self.sequence_number {
            found = true;
            s.push_str(&format!(
                "\t Sequence number: {}vs {}",
                self.sequence_number, other.sequence_number
            ));
        }
        if other.op != self.op {
            found = true;
            s.push_str(&format!(
                "  Op type: {}vs {}",
                self.op.name(),
                other.op.name()
            ));
        }
        let mut check = |arg: &str, other: Vec<String>, cur: Vec<String>| {
            if other != cur {
                found = true;
                s.push_str(&format!(
                    "  Tensor {arg}: {}vs {}",
                    cur.join(", "),
                    other.join(", ")
                ));
            }
        };
        check("Tensor shapes", other.size_strs(), self.size_strs());
        check("Tensor dtypes", other.dtype_strs(), self.dtype_strs());
        check("Tensor devices", other.device_strs(), self.device_strs());
        found.then_some(s)
    }
}

impl std::fmt::Display for CollectiveFingerPrint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.dtypes.is_empty() {
            write!(
                f,
                "CollectiveFingerPrint(SequenceNumber={}OpType={})",
                self.sequence_number,
                self.op.name()
            )
        } else {
            write!(
                f,
                "CollectiveFingerPrint(SequenceNumber={}, OpType={}, TensorShape=[{}], TensorDtypes={}, TensorDeviceTypes={})",
                self.sequence_number,
                self.op.name(),
                self.size_strs().join(", "),
                self.dtype_strs().join(", "),
                self.device_strs().join(", ")
            )
        }
    }
}

/// The DETAIL-mode wrapper around a backend (`ProcessGroupWrapper`).
pub struct DetailWrapper {
    inner: Arc<dyn Backend>,
    helper: Arc<dyn Backend>,
}

impl DetailWrapper {
    /// Wraps `inner`; `helper` is a CPU backend over the same ranks used only for the checks.
    pub fn new(inner: Arc<dyn Backend>, helper: Arc<dyn Backend>) -> Self {
        DetailWrapper { inner, helper }
    }

    /// The wrapped backend (`_get_backend_wrapper().wrapped_pg`).
    pub fn wrapped(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    fn helper_timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn allgather_i64(&self, data: Vec<i64>) -> Result<Vec<Vec<i64>>> {
        let (n, len) = (self.helper.size(), data.len());
        let input = Tensor::from_vec(data);
        let outs: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(DType::I64, &[len])).collect();
        let opts = AllgatherOptions {
            timeout: Some(self.helper_timeout()),
            async_op: false,
        };
        self.helper
            .all_gather(
                std::slice::from_ref(&outs),
                std::slice::from_ref(&input),
                &opts,
            )?
            .wait()?;
        outs.iter().map(|t| t.to_vec::<i64>()).collect()
    }

    /// Runs the monitored barrier and the fingerprint comparison (`runCollectiveChecks`).
    ///
    /// # Errors
    /// "ProcessGroupWrapper: Monitored Barrier encountered error running collective: ..." when a
    /// rank does not arrive; "Detected mismatch between collectives on ranks. ..." on a mismatch.
    pub fn run_collective_checks(&self, op: OpType, tensors: &[&Tensor]) -> Result<()> {
        let fp = CollectiveFingerPrint::new(op, tensors, self.inner.sequence_number());
        let bopts = BarrierOptions {
            timeout: Some(self.helper_timeout()),
            ..Default::default()
        };
        self.helper.monitored_barrier(&bopts, true).map_err(|e| {
            e.map_message(|m| format!("ProcessGroupWrapper: Monitored Barrier encountered error running collective: {fp}. Error: \n{m}"))
        })?;
        let ser = fp.serialize();
        let lens = self.allgather_i64(vec![ser.len() as i64])?;
        let max = lens.iter().map(|l| l[0] as usize).max().unwrap_or(0);
        let mut padded = ser.clone();
        padded.resize(max, 0);
        let all = self.allgather_i64(padded)?;
        let me = self.inner.rank();
        for (r, (buf, len)) in all.iter().zip(&lens).enumerate() {
            let theirs = &buf[..(len[0] as usize).min(buf.len())];
            if theirs != ser.as_slice() {
                let other = CollectiveFingerPrint::deserialize(theirs)?;
                let mut msg = format!(
                    "Detected mismatch between collectives on ranks. Rank {me} is running collective: {fp}, but Rank {r} is running collective: {other}."
                );
                if let Some(d) = fp.diff(&other) {
                    msg.push_str(&d);
                }
                return Err(DistError::backend(msg));
            }
        }
        Ok(())
    }
}

fn same_size(ts: &[Tensor]) -> bool {
    ts.windows(2).all(|w| w[0].shape() == w[1].shape())
}

/// What PyTorch's `ProcessGroupWrapper` fingerprints of `op`: its op type and tensors (inputs
/// for most ops; outputs for scatter and reduce_scatter; input and output for
/// `_reduce_scatter_base`; none for coalesced ops, all-to-all, barrier and uneven lists).
/// `None`: not checked (point-to-point ops).
fn fingerprinted<'o>(op: &'o Op<'_>) -> Option<(OpType, Vec<&'o Tensor>)> {
    let tensors: Vec<&Tensor> = match op {
        Op::Send { .. } | Op::Recv { .. } | Op::RecvAnysource { .. } => return None,
        Op::Broadcast { tensors, .. }
        | Op::AllReduce { tensors, .. }
        | Op::Reduce { tensors, .. } => tensors.iter().collect(),
        Op::AllGather {
            outputs, inputs, ..
        } if outputs.last().is_none_or(|o| same_size(o)) => inputs.iter().collect(),
        Op::AllGatherIntoTensor { input, .. } => vec![input.as_ref()],
        Op::Gather { inputs, .. } => inputs.iter().collect(),
        Op::Scatter { outputs, .. } => outputs.iter().collect(),
        Op::ReduceScatter {
            outputs, inputs, ..
        } if inputs.last().is_none_or(|i| same_size(i)) => outputs.iter().collect(),
        Op::ReduceScatterTensor { output, input, .. } => vec![input.as_ref(), output.as_ref()],
        _ => Vec::new(),
    };
    Some((op.op_type(), tensors))
}

impl Collectives for DetailWrapper {
    fn run(&self, op: Op<'_>) -> Result<Work> {
        if let Some((kind, tensors)) = fingerprinted(&op) {
            self.run_collective_checks(kind, &tensors)?;
        }
        self.inner.run(op)
    }
}

impl Backend for DetailWrapper {
    c10d_core::delegate_backend!(
        inner: name,
        rank,
        size,
        device_type,
        timeout,
        sequence_number,
        set_sequence_number,
        is_initialized,
        monitored_barrier,
        supports_coalescing,
        start_coalescing,
        end_coalescing,
        supports_splitting,
    );
    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout);
        self.helper.set_timeout(timeout);
    }
    fn split(&self, ranks: &[usize], opts: &BackendOptions) -> Result<Option<Arc<dyn Backend>>> {
        self.inner.split(ranks, opts)
    }
    fn abort(&self) {
        self.inner.abort();
        self.helper.abort();
    }
    fn shutdown(&self) {
        self.inner.shutdown();
        self.helper.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_roundtrip_and_texts() {
        let a = Tensor::from_vec(vec![1.0f32, 2.0]);
        let b = Tensor::from_vec(vec![1.0f64, 2.0, 3.0]);
        let fa = CollectiveFingerPrint::new(OpType::Allreduce, &[&a], 0);
        let fb = CollectiveFingerPrint::new(OpType::Broadcast, &[&b], 0);
        assert_eq!(
            CollectiveFingerPrint::deserialize(&fa.serialize()).unwrap(),
            fa
        );
        assert_eq!(
            fa.to_string(),
            "CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[2], TensorDtypes=Float, TensorDeviceTypes=CPU)"
        );
        let d = fa.diff(&fb).unwrap();
        assert!(
            d.starts_with("Collectives differ in the following aspects: "),
            "{d}"
        );
        assert!(d.contains("Op type: ALLREDUCEvs BROADCAST"), "{d}");
        assert!(d.contains("Tensor Tensor shapes: 2vs 3"), "{d}");
        assert!(d.contains("Tensor Tensor dtypes: Floatvs Double"), "{d}");
        assert!(fa.diff(&fa).is_none());
    }
}

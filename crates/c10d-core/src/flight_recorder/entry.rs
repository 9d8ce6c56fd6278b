//! One recorded op, kept compact (no heap allocation for up to four tensors of up to two
//! dimensions) so that recording stays off the critical path.

use crate::dtype::DType;
use crate::tensor::Tensor;
use crate::work::OpType;
use smallvec::SmallVec;
use std::cell::Cell;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Identity of a recorded group (entries refer to it by `pg_id`).
#[derive(Debug)]
pub(crate) struct GroupInfo {
    pub pg_id: u64,
    pub name: String,
    pub desc: String,
    /// The backend's name in profiling names (`"gloo"` → `"gloo:all_reduce"`).
    pub backend: &'static str,
    /// This process's rank in the group (p2p profiling names use group ranks).
    pub group_rank: usize,
}

/// Shapes of a tensor list, flattened as PyTorch keeps them (`dims` per tensor, then sizes).
#[derive(Debug, Clone, Default)]
pub(crate) struct Shapes {
    dims: SmallVec<[u8; 4]>,
    sizes: SmallVec<[i64; 8]>,
    dtypes: SmallVec<[DType; 4]>,
}

impl Shapes {
    pub fn of(tensors: &[Tensor]) -> Shapes {
        let mut s = Shapes::default();
        for t in tensors {
            let shape = t.shape();
            s.dims.push(shape.len().min(u8::MAX as usize) as u8);
            s.sizes
                .extend(shape.iter().take(u8::MAX as usize).map(|&d| d as i64));
            s.dtypes.push(t.dtype());
        }
        s
    }

    /// One size list per tensor (`[[4, 2], [8]]`).
    pub fn lists(&self) -> Vec<Vec<i64>> {
        let mut at = 0;
        self.dims
            .iter()
            .map(|&d| {
                let v = self.sizes[at..at + d as usize].to_vec();
                at += d as usize;
                v
            })
            .collect()
    }

    /// PyTorch's `ScalarType` names (`"Float"`, `"Long"` ...).
    pub fn dtype_names(&self) -> Vec<String> {
        self.dtypes
            .iter()
            .map(|d| d.torch_name().to_string())
            .collect()
    }
}

/// The lifecycle of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    Scheduled,
    Started(u64),
    Completed { started: u64, completed: u64 },
}

/// One recorded op.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub record_id: u64,
    pub pg_id: u64,
    pub collective_seq_id: u64,
    pub p2p_seq_id: u64,
    pub op_id: u64,
    pub op: OpType,
    /// Group rank of the peer of a send/recv; `None` for a receive from any source.
    pub peer: Option<usize>,
    pub inputs: Shapes,
    pub outputs: Shapes,
    pub time_created_ns: u64,
    pub progress: Progress,
    pub timeout: Duration,
    pub retired: bool,
    pub error: Option<String>,
    /// Index of the submitting thread in the thread registry ([`current_thread`]).
    pub thread: u32,
}

impl Entry {
    pub fn is_p2p(&self) -> bool {
        matches!(self.op, OpType::Send | OpType::Recv | OpType::RecvAnysource)
    }

    /// PyTorch's profiling name: `"gloo:all_reduce"`, `"gloo:send 0->1"`, `"gloo:recv 1<-0"`,
    /// `"gloo:recv 1<-?"` (ranks within the group).
    pub fn profiling_name(&self, g: &GroupInfo) -> String {
        let me = g.group_rank;
        let peer = || self.peer.map_or("?".to_string(), |p| p.to_string());
        match self.op {
            OpType::Send => format!("{}:send {me}->{}", g.backend, peer()),
            OpType::Recv | OpType::RecvAnysource => format!("{}:recv {me}<-{}", g.backend, peer()),
            op => format!("{}:{}", g.backend, op_name(op)),
        }
    }
}

/// The op part of PyTorch's profiling names, spelled as the flight-recorder analyzer knows
/// them (`torch.distributed.flight_recorder.components.types.COLLECTIVES`).
pub(crate) fn op_name(op: OpType) -> &'static str {
    match op {
        OpType::Broadcast => "broadcast",
        OpType::Allreduce => "all_reduce",
        OpType::AllreduceCoalesced => "allreduce_coalesced",
        OpType::Reduce => "reduce",
        OpType::Allgather => "all_gather",
        OpType::AllgatherBase => "_all_gather_base",
        OpType::AllgatherCoalesced => "allgather_coalesced",
        OpType::Gather => "gather",
        OpType::Scatter => "scatter",
        OpType::ReduceScatter => "reduce_scatter",
        OpType::ReduceScatterBase => "_reduce_scatter_base",
        OpType::AlltoallBase | OpType::Alltoall => "all_to_all",
        OpType::Barrier | OpType::MonitoredBarrier => "barrier",
        OpType::Coalesced => "coalesced",
        OpType::AllreduceSparse => "sparse_all_reduce",
        OpType::Send => "send",
        OpType::Recv | OpType::RecvAnysource => "recv",
        OpType::Unknown => "unknown",
    }
}

/// Nanoseconds since the Unix epoch (PyTorch's `c10::getTime()`).
pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Names and ids of the threads that recorded ops, indexed by [`current_thread`] (an entry
/// keeps a 4-byte index instead of a thread handle).
static THREADS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

thread_local! {
    static THREAD_INDEX: Cell<Option<u32>> = const { Cell::new(None) };
}

/// This thread's index in the registry (registered at its first call).
pub(crate) fn current_thread() -> u32 {
    THREAD_INDEX.with(|c| {
        if let Some(i) = c.get() {
            return i;
        }
        let t = std::thread::current();
        let mut v = THREADS.lock().unwrap_or_else(|e| e.into_inner());
        let i = v.len() as u32;
        v.push((t.name().unwrap_or("").to_string(), format!("{:?}", t.id())));
        c.set(Some(i));
        i
    })
}

/// `(thread_name, thread_id)` of a registered thread.
pub(crate) fn thread_info(index: u32) -> (String, String) {
    let v = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    v.get(index as usize).cloned().unwrap_or_default()
}

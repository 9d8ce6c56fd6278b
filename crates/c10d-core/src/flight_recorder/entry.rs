//! One recorded op, kept compact (two cache lines, no heap allocation for the common ops) so
//! that recording stays off the critical path.

use crate::dtype::DType;
use crate::tensor::Tensor;
use crate::work::OpType;
use smallvec::SmallVec;
use std::cell::Cell;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

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

/// Shapes and dtypes of an op's input and output tensors, packed into words so that a
/// typical entry fits two cache lines: a header (inputs | outputs << 32 | same << 63), one word
/// per tensor (dtype code | ndim << 8), then all sizes. `same`: the outputs have the inputs'
/// shapes and dtypes (in-place ops) and are not stored again.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shapes(SmallVec<[u64; 5]>);

/// Sizes and PyTorch dtype names of a tensor list.
pub(crate) type Listed = (Vec<Vec<i64>>, Vec<String>);

impl Shapes {
    #[cfg(test)]
    pub fn of(inputs: &[Tensor], outputs: &[Tensor]) -> Shapes {
        let mut s = Shapes::default();
        s.set(inputs, outputs);
        s
    }

    /// Replaces the words with those of `inputs` and `outputs`, reusing the storage (a ring
    /// slot's shapes are rewritten in place, without building a new vector and moving it).
    pub fn set(&mut self, inputs: &[Tensor], outputs: &[Tensor]) {
        let same = inputs.len() == outputs.len()
            && inputs
                .iter()
                .zip(outputs)
                .all(|(a, b)| a.dtype() == b.dtype() && a.shape() == b.shape());
        let outs = if same { &[][..] } else { outputs };
        let w = &mut self.0;
        w.clear();
        w.push(inputs.len() as u64 | (outs.len() as u64) << 32 | (same as u64) << 63);
        for t in inputs.iter().chain(outs) {
            w.push(t.dtype().code() as u64 | (t.dim() as u64) << 8);
        }
        for t in inputs.iter().chain(outs) {
            w.extend(t.shape().iter().map(|&d| d as u64));
        }
    }

    /// (inputs, outputs), each as size lists (`[[4, 2], [8]]`) and PyTorch's dtype names.
    pub fn decode(&self) -> (Listed, Listed) {
        let Some(&head) = self.0.first() else {
            return Default::default();
        };
        let n_in = (head & 0xffff_ffff) as usize;
        let n_out = ((head >> 32) & 0x7fff_ffff) as usize;
        let tensors = &self.0[1..(1 + n_in + n_out).min(self.0.len())];
        let mut sizes = self.0[1 + tensors.len()..].iter();
        let mut list = |ts: &[u64]| -> Listed {
            ts.iter()
                .map(|&t| {
                    let dims = sizes.by_ref().take((t >> 8) as usize);
                    let name = DType::from_code((t & 0xff) as u8).map_or("?", |d| d.torch_name());
                    (dims.map(|&d| d as i64).collect(), name.to_string())
                })
                .unzip()
        };
        let ins = list(&tensors[..n_in.min(tensors.len())]);
        let outs = list(&tensors[n_in.min(tensors.len())..]);
        if head >> 63 == 1 {
            (ins.clone(), ins)
        } else {
            (ins, outs)
        }
    }
}

/// `peer` of an entry with no peer (collectives, receives from any source).
pub(crate) const NO_PEER: u32 = u32::MAX;

/// One recorded op: 128 bytes (two cache lines) unless it has more than five words of shapes
/// or an error.
#[derive(Debug, Clone)]
#[repr(align(64))]
pub(crate) struct Entry {
    pub record_id: u64,
    pub time_created_ns: u64,
    /// 0: not started.
    pub time_started_ns: u64,
    /// 0: not completed.
    pub time_completed_ns: u64,
    pub collective_seq_id: u64,
    pub op_id: u64,
    pub p2p_seq_id: u32,
    pub pg_id: u32,
    pub timeout_ms: u32,
    /// Index of the submitting thread in the thread registry ([`current_thread`]).
    pub thread: u32,
    /// Group rank of the peer of a send/recv ([`NO_PEER`]: a receive from any source).
    pub peer: u32,
    pub op: OpType,
    pub retired: bool,
    /// Boxed: 8 bytes instead of a `String`'s 24 keep the entry in two cache lines (errors are
    /// rare, their extra allocation does not matter).
    #[allow(clippy::box_collection)]
    pub error: Option<Box<String>>,
    pub shapes: Shapes,
}

/// Whether `op` is a send or receive (recorded with a peer, and without a collective id).
pub(crate) fn is_p2p(op: OpType) -> bool {
    matches!(op, OpType::Send | OpType::Recv | OpType::RecvAnysource)
}

impl Default for Entry {
    /// An empty slot (overwritten by [`super::ring::Ring::push_with`]).
    fn default() -> Self {
        Entry {
            record_id: 0,
            time_created_ns: 0,
            time_started_ns: 0,
            time_completed_ns: 0,
            collective_seq_id: 0,
            op_id: 0,
            p2p_seq_id: 0,
            pg_id: 0,
            timeout_ms: 0,
            thread: 0,
            peer: NO_PEER,
            op: OpType::Unknown,
            retired: false,
            error: None,
            shapes: Shapes::default(),
        }
    }
}

impl Entry {
    pub fn is_p2p(&self) -> bool {
        is_p2p(self.op)
    }

    /// PyTorch's profiling name: `"gloo:all_reduce"`, `"gloo:send 0->1"`, `"gloo:recv 1<-0"`,
    /// `"gloo:recv 1<-?"` (ranks within the group).
    pub fn profiling_name(&self, g: &GroupInfo) -> String {
        let me = g.group_rank;
        let peer = || match self.peer {
            NO_PEER => "?".to_string(),
            p => p.to_string(),
        };
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

/// Nanoseconds since the Unix epoch (PyTorch's `c10::getTime()`), from the coarse realtime
/// clock: a read of the kernel's last tick (resolution 1–4 ms) instead of a hardware clock
/// read, which costs far more (several per op, on the path of every collective). Plenty for
/// telling when an op was submitted, started or completed, and which one is stuck.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, a valid exclusive reference.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    if rc != 0 {
        return SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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

//! What is recorded of one op: the fixed fields a slot holds ([`Head`]), and a whole entry as
//! a dump reads it back ([`Entry`]).

use crate::op_type::OpType;
use std::cell::Cell;
use std::sync::Mutex;

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

/// `peer` of an entry with no peer (collectives, receives from any source).
pub(crate) const NO_PEER: u32 = u32::MAX;

/// The fields of an op fixed when it is recorded (all but its shapes, start, end and error).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head {
    /// Monotonic milliseconds (see `clock`).
    pub created_ms: u64,
    pub collective_seq_id: u64,
    pub op_id: u64,
    pub p2p_seq_id: u32,
    pub pg_id: u32,
    pub timeout_ms: u32,
    /// Group rank of the peer of a send/recv ([`NO_PEER`]: a receive from any source).
    pub peer: u32,
    pub op: OpType,
    /// Index of the recording thread in the thread registry ([`current_thread`]).
    pub thread: u32,
}

impl Head {
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

/// One recorded op as a dump reads it from a ring.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The entry's index among all ops this process recorded (set when the rings' entries
    /// are merged).
    pub record_id: u64,
    /// The entry's index in its thread's ring.
    pub local_id: u64,
    pub head: Head,
    /// Monotonic milliseconds; `None`: not started.
    pub started_ms: Option<u64>,
    /// `None`: not completed (a failed op is retired without completing).
    pub completed_ms: Option<u64>,
    pub retired: bool,
    pub error: Option<String>,
    /// Packed shapes (see `shapes`).
    pub shapes: Vec<u64>,
}

/// Whether `op` is a send or receive (recorded with a peer, and without a collective id).
pub(crate) fn is_p2p(op: OpType) -> bool {
    matches!(op, OpType::Send | OpType::Recv | OpType::RecvAnysource)
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

/// Names and ids of the threads that recorded ops, indexed by [`current_thread`] (an entry
/// keeps a 4-byte index instead of a thread handle).
static THREADS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

thread_local! {
    static THREAD_INDEX: Cell<Option<u32>> = const { Cell::new(None) };
}

/// This thread's index in the registry (registered at its first call); `u32::MAX` (no name)
/// while the thread's locals are being destroyed.
pub(crate) fn current_thread() -> u32 {
    let index = THREAD_INDEX.try_with(|c| {
        if let Some(i) = c.get() {
            return i;
        }
        let t = std::thread::current();
        let mut v = THREADS.lock().unwrap_or_else(|e| e.into_inner());
        let i = v.len() as u32;
        v.push((t.name().unwrap_or("").to_string(), format!("{:?}", t.id())));
        c.set(Some(i));
        i
    });
    index.unwrap_or(u32::MAX)
}

/// `(thread_name, thread_id)` of a registered thread.
pub(crate) fn thread_info(index: u32) -> (String, String) {
    let v = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    v.get(index as usize).cloned().unwrap_or_default()
}

//! [`OpType`]: what kind of collective a `Work`, an error context or a flight-recorder entry
//! is about (PyTorch's `OpType` names). A leaf: it imports nothing of the crate.

/// Operation type of a work, with PyTorch's `OpType` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum OpType {
    Broadcast,
    Allreduce,
    AllreduceCoalesced,
    Reduce,
    Allgather,
    AllgatherBase,
    AllgatherCoalesced,
    Gather,
    Scatter,
    ReduceScatter,
    AlltoallBase,
    Alltoall,
    Send,
    Recv,
    RecvAnysource,
    Barrier,
    ReduceScatterBase,
    Coalesced,
    AllreduceSparse,
    MonitoredBarrier,
    Unknown,
}

impl OpType {
    /// Every op type, in declaration order (the order of [`OpType::code`]).
    pub const ALL: [OpType; 21] = [
        OpType::Broadcast,
        OpType::Allreduce,
        OpType::AllreduceCoalesced,
        OpType::Reduce,
        OpType::Allgather,
        OpType::AllgatherBase,
        OpType::AllgatherCoalesced,
        OpType::Gather,
        OpType::Scatter,
        OpType::ReduceScatter,
        OpType::AlltoallBase,
        OpType::Alltoall,
        OpType::Send,
        OpType::Recv,
        OpType::RecvAnysource,
        OpType::Barrier,
        OpType::ReduceScatterBase,
        OpType::Coalesced,
        OpType::AllreduceSparse,
        OpType::MonitoredBarrier,
        OpType::Unknown,
    ];

    /// Stable one-byte code for wire formats (index in [`OpType::ALL`]).
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Inverse of [`OpType::code`].
    pub fn from_code(code: u8) -> Option<OpType> {
        OpType::ALL.get(code as usize).copied()
    }

    /// PyTorch's `opTypeToString` name ("ALLREDUCE", "_ALLGATHER_BASE" ...).
    pub const fn name(self) -> &'static str {
        match self {
            OpType::Broadcast => "BROADCAST",
            OpType::Allreduce => "ALLREDUCE",
            OpType::AllreduceCoalesced => "ALLREDUCE_COALESCED",
            OpType::Reduce => "REDUCE",
            OpType::Allgather => "ALLGATHER",
            OpType::AllgatherBase => "_ALLGATHER_BASE",
            OpType::AllgatherCoalesced => "ALLGATHER_COALESCED",
            OpType::Gather => "GATHER",
            OpType::Scatter => "SCATTER",
            OpType::ReduceScatter => "REDUCE_SCATTER",
            OpType::AlltoallBase => "ALLTOALL_BASE",
            OpType::Alltoall => "ALLTOALL",
            OpType::Send => "SEND",
            OpType::Recv => "RECV",
            OpType::RecvAnysource => "RECVANYSOURCE",
            OpType::Barrier => "BARRIER",
            OpType::ReduceScatterBase => "_REDUCE_SCATTER_BASE",
            OpType::Coalesced => "COALESCED",
            OpType::AllreduceSparse => "_ALLREDUCE_SPARSE",
            OpType::MonitoredBarrier => "MONITORED_BARRIER",
            OpType::Unknown => "UNKNOWN",
        }
    }
}

//! Options structs of the collectives, with PyTorch's fields and defaults (`c10d/Types.hpp`).
//!
//! `timeout: None` means "unset" (PyTorch's `kUnsetTimeout`): the backend's own timeout applies.

use crate::reduce::ReduceOp;
use crate::Device;
use std::time::Duration;

/// Mirrors `BroadcastOptions` (root_rank 0, root_tensor 0, async_op true).
#[derive(Debug, Clone, PartialEq)]
pub struct BroadcastOptions {
    /// Group rank that sends.
    pub root_rank: usize,
    /// Index into the tensor list of the root whose data is sent.
    pub root_tensor: usize,
    /// Per-op timeout; `None` = backend default.
    pub timeout: Option<Duration>,
    /// Whether the caller will wait asynchronously (informational, as in PyTorch).
    pub async_op: bool,
}
impl Default for BroadcastOptions {
    fn default() -> Self {
        BroadcastOptions {
            root_rank: 0,
            root_tensor: 0,
            timeout: None,
            async_op: true,
        }
    }
}

/// Mirrors `AllreduceOptions` (reduce_op SUM).
#[derive(Debug, Clone, PartialEq)]
pub struct AllreduceOptions {
    /// Reduction.
    pub reduce_op: ReduceOp,
    /// Per-op timeout; `None` = backend default.
    pub timeout: Option<Duration>,
    /// Whether the caller will wait asynchronously.
    pub async_op: bool,
}
impl Default for AllreduceOptions {
    fn default() -> Self {
        AllreduceOptions {
            reduce_op: ReduceOp::Sum,
            timeout: None,
            async_op: true,
        }
    }
}

/// Mirrors `AllreduceCoalescedOptions` (same fields as [`AllreduceOptions`]).
pub type AllreduceCoalescedOptions = AllreduceOptions;

/// Mirrors `ReduceOptions` (reduce_op SUM, root_rank 0, root_tensor 0).
#[derive(Debug, Clone, PartialEq)]
pub struct ReduceOptions {
    /// Reduction.
    pub reduce_op: ReduceOp,
    /// Group rank receiving the result.
    pub root_rank: usize,
    /// Index of the tensor on the root.
    pub root_tensor: usize,
    /// Per-op timeout; `None` = backend default.
    pub timeout: Option<Duration>,
    /// Whether the caller will wait asynchronously.
    pub async_op: bool,
}
impl Default for ReduceOptions {
    fn default() -> Self {
        ReduceOptions {
            reduce_op: ReduceOp::Sum,
            root_rank: 0,
            root_tensor: 0,
            timeout: None,
            async_op: true,
        }
    }
}

/// Mirrors `AllgatherOptions`.
#[derive(Debug, Clone, PartialEq)]
pub struct AllgatherOptions {
    /// Per-op timeout; `None` = backend default.
    pub timeout: Option<Duration>,
    /// Whether the caller will wait asynchronously.
    pub async_op: bool,
}
impl Default for AllgatherOptions {
    fn default() -> Self {
        AllgatherOptions {
            timeout: None,
            async_op: true,
        }
    }
}

/// Mirrors `GatherOptions` (root_rank 0).
#[derive(Debug, Clone, PartialEq)]
pub struct GatherOptions {
    /// Group rank receiving.
    pub root_rank: usize,
    /// Per-op timeout; `None` = backend default.
    pub timeout: Option<Duration>,
    /// Whether the caller will wait asynchronously.
    pub async_op: bool,
}
impl Default for GatherOptions {
    fn default() -> Self {
        GatherOptions {
            root_rank: 0,
            timeout: None,
            async_op: true,
        }
    }
}

/// Mirrors `ScatterOptions` (root_rank 0).
#[derive(Debug, Clone, PartialEq)]
pub struct ScatterOptions {
    /// Group rank sending.
    pub root_rank: usize,
    /// Per-op timeout; `None` = backend default.
    pub timeout: Option<Duration>,
    /// Whether the caller will wait asynchronously.
    pub async_op: bool,
}
impl Default for ScatterOptions {
    fn default() -> Self {
        ScatterOptions {
            root_rank: 0,
            timeout: None,
            async_op: true,
        }
    }
}

/// Mirrors `ReduceScatterOptions` (reduce_op SUM).
#[derive(Debug, Clone, PartialEq)]
pub struct ReduceScatterOptions {
    /// Reduction.
    pub reduce_op: ReduceOp,
    /// Per-op timeout; `None` = backend default.
    pub timeout: Option<Duration>,
    /// Whether the caller will wait asynchronously.
    pub async_op: bool,
}
impl Default for ReduceScatterOptions {
    fn default() -> Self {
        ReduceScatterOptions {
            reduce_op: ReduceOp::Sum,
            timeout: None,
            async_op: true,
        }
    }
}

/// Mirrors `AllToAllOptions`.
#[derive(Debug, Clone, PartialEq)]
pub struct AllToAllOptions {
    /// Per-op timeout; `None` = backend default.
    pub timeout: Option<Duration>,
    /// Whether the caller will wait asynchronously.
    pub async_op: bool,
}
impl Default for AllToAllOptions {
    fn default() -> Self {
        AllToAllOptions {
            timeout: None,
            async_op: true,
        }
    }
}

/// Mirrors `BarrierOptions` (device_ids empty, no device).
#[derive(Debug, Clone, PartialEq)]
pub struct BarrierOptions {
    /// Devices to use (NCCL); empty = the group's choice.
    pub device_ids: Vec<u32>,
    /// Per-op timeout; `None` = backend default.
    pub timeout: Option<Duration>,
    /// Device the barrier runs on, if pinned.
    pub device: Option<Device>,
    /// Whether the caller will wait asynchronously.
    pub async_op: bool,
}
impl Default for BarrierOptions {
    fn default() -> Self {
        BarrierOptions {
            device_ids: Vec::new(),
            timeout: None,
            device: None,
            async_op: true,
        }
    }
}

/// Options every backend receives at construction (mirrors `Backend::Options`).
#[derive(Debug, Clone, PartialEq)]
pub struct BackendOptions {
    /// Backend name ("gloo", "nccl" ...).
    pub backend: String,
    /// Default timeout of every op (PyTorch: 30 min, NCCL 10 min).
    pub timeout: Duration,
    /// Group name (for handshakes and errors).
    pub group_name: String,
    /// Group description (for errors and logs).
    pub group_desc: String,
    /// Global ranks of the group members, in group-rank order (empty = identity).
    pub global_ranks: Vec<usize>,
}
impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            backend: String::new(),
            timeout: DEFAULT_TIMEOUT,
            group_name: "0".into(),
            group_desc: "default_pg".into(),
            global_ranks: Vec::new(),
        }
    }
}

/// `torch.distributed.default_pg_timeout`: 30 minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// `default_pg_nccl_timeout`: 10 minutes.
pub const DEFAULT_NCCL_TIMEOUT: Duration = Duration::from_secs(10 * 60);

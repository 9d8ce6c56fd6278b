//! The `Backend` trait: every c10d collective, implemented per device type.
//!
//! Mirrors `c10d::Backend` (`torch.distributed.Backend` objects returned by
//! `ProcessGroup._get_backend`). Every method has a default that returns
//! [`DistError::Unsupported`] "Backend {name} does not support {op}" (PyTorch's text), so a
//! backend implements only what it supports. Argument errors are returned synchronously as
//! `Err`; communication errors fail the returned [`Work`].
//!
//! Ranks and roots are *group* ranks. Tensor lists follow PyTorch's C++ signatures: an
//! `outputs: &[Vec<Tensor>]` is `std::vector<std::vector<at::Tensor>>`.

use crate::device::DeviceType;
use crate::error::{DistError, Result};
use crate::options::*;
use crate::tensor::Tensor;
use crate::work::Work;
use std::sync::Arc;
use std::time::Duration;

fn unsupported<T>(backend: &str, op: &str) -> Result<T> {
    Err(DistError::unsupported(format!(
        "Backend {backend} does not support {op}"
    )))
}

/// A collective backend for one device type within one process group.
#[allow(unused_variables)]
pub trait Backend: Send + Sync + 'static {
    /// Backend name ("gloo", "nccl", or a registered third-party name).
    fn name(&self) -> &str;
    /// This process's rank in the group.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn size(&self) -> usize;
    /// The device type this backend serves.
    fn device_type(&self) -> DeviceType;

    /// Default per-op timeout.
    fn timeout(&self) -> Duration;
    /// Changes the default per-op timeout of later ops (`dist.set_timeout` / `pg._set_timeout`).
    fn set_timeout(&self, timeout: Duration);

    /// Number of collectives (and p2p ops) issued so far (`_get_sequence_number_for_group`).
    fn sequence_number(&self) -> u64 {
        0
    }
    /// Sets the sequence number (`_set_sequence_number_for_group`); backends start at 0 so this
    /// is normally a no-op.
    fn set_sequence_number(&self, seq: u64) {}
    /// False while a lazily connected backend has not yet made its connections.
    fn is_initialized(&self) -> bool {
        true
    }

    /// `broadcast`: `tensors[opts.root_tensor]` of `opts.root_rank` to every rank's tensors.
    fn broadcast(&self, tensors: &[Tensor], opts: &BroadcastOptions) -> Result<Work> {
        unsupported(self.name(), "broadcast")
    }
    /// `allreduce`: in-place reduction of all tensors of all ranks into every tensor.
    fn all_reduce(&self, tensors: &[Tensor], opts: &AllreduceOptions) -> Result<Work> {
        unsupported(self.name(), "allreduce")
    }
    /// `allreduce_coalesced`: several tensors of one dtype reduced as one flat buffer.
    fn all_reduce_coalesced(
        &self,
        tensors: &[Tensor],
        opts: &AllreduceCoalescedOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "allreduce_coalesced")
    }
    /// `reduce`: reduction into `tensors[opts.root_tensor]` on `opts.root_rank`.
    fn reduce(&self, tensors: &[Tensor], opts: &ReduceOptions) -> Result<Work> {
        unsupported(self.name(), "reduce")
    }
    /// `allgather`: `outputs[i][r]` receives `inputs[i]` of rank r.
    fn all_gather(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "allgather")
    }
    /// `_allgather_base` / `all_gather_into_tensor`: `output` is the dim-0 concatenation of every rank's `input`.
    fn all_gather_into_tensor(
        &self,
        output: &Tensor,
        input: &Tensor,
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "_allgather_base")
    }
    /// `allgather_coalesced`: `outputs[r][i]` receives `inputs[i]` of rank r.
    fn all_gather_coalesced(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "allgather_coalesced")
    }
    /// `allgather_into_tensor_coalesced`: one `all_gather_into_tensor` per pair, as one op.
    fn all_gather_into_tensor_coalesced(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "allgather_into_tensor_coalesced")
    }
    /// `gather`: on the root, `outputs[0][r]` receives rank r's `inputs[0]`; `outputs` empty elsewhere.
    fn gather(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &GatherOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "gather")
    }
    /// `scatter`: rank r's `outputs[0]` receives the root's `inputs[0][r]`.
    fn scatter(
        &self,
        outputs: &[Tensor],
        inputs: &[Vec<Tensor>],
        opts: &ScatterOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "scatter")
    }
    /// `reduce_scatter`: rank r's `outputs[0]` = op over ranks of `inputs[0][r]`.
    fn reduce_scatter(
        &self,
        outputs: &[Tensor],
        inputs: &[Vec<Tensor>],
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "reduce_scatter")
    }
    /// `_reduce_scatter_base` / `reduce_scatter_tensor`: `input` is `size` × `output` along dim 0.
    fn reduce_scatter_tensor(
        &self,
        output: &Tensor,
        input: &Tensor,
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "_reduce_scatter_base")
    }
    /// `reduce_scatter_tensor_coalesced`: one `reduce_scatter_tensor` per pair, as one op.
    fn reduce_scatter_tensor_coalesced(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "reduce_scatter_tensor_coalesced")
    }
    /// `alltoall_base` / `all_to_all_single`: dim-0 splits of `input` go to each rank, received
    /// splits land in `output` in rank order. Empty split lists mean equal splits.
    fn all_to_all_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
        opts: &AllToAllOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "alltoall_base")
    }
    /// `alltoall`: `outputs[j]` receives rank j's `inputs[self]`.
    fn all_to_all(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &AllToAllOptions,
    ) -> Result<Work> {
        unsupported(self.name(), "alltoall")
    }
    /// `barrier`: completes after every rank entered it and all earlier ops of this group finished.
    fn barrier(&self, opts: &BarrierOptions) -> Result<Work> {
        unsupported(self.name(), "barrier")
    }
    /// `monitored_barrier`: blocking barrier through rank 0 that names the ranks that did not arrive.
    fn monitored_barrier(&self, opts: &BarrierOptions, wait_all_ranks: bool) -> Result<()> {
        unsupported(self.name(), "monitoredBarrier")
    }
    /// `send` to group rank `dst` with `tag`.
    fn send(&self, tensors: &[Tensor], dst: usize, tag: i64) -> Result<Work> {
        unsupported(self.name(), "send")
    }
    /// `recv` from group rank `src` with `tag`.
    fn recv(&self, tensors: &[Tensor], src: usize, tag: i64) -> Result<Work> {
        unsupported(self.name(), "recv")
    }
    /// `recvAnysource`: receive from whichever rank sends with `tag` first; see [`Work::source_rank`].
    fn recv_anysource(&self, tensors: &[Tensor], tag: i64) -> Result<Work> {
        unsupported(self.name(), "recvAnysource")
    }

    /// True when the backend batches ops between [`Backend::start_coalescing`] and [`Backend::end_coalescing`].
    fn supports_coalescing(&self) -> bool {
        false
    }
    /// Starts a coalescing window (`startCoalescing`).
    fn start_coalescing(&self) -> Result<()> {
        unsupported(self.name(), "startCoalescing")
    }
    /// Ends a coalescing window and returns one work for all ops in it (`endCoalescing`).
    fn end_coalescing(&self) -> Result<Work> {
        unsupported(self.name(), "endCoalescing")
    }

    /// True when [`Backend::split`] can make child backends without a new rendezvous (NCCL's
    /// `ncclCommSplit`).
    fn supports_splitting(&self) -> bool {
        false
    }
    /// Splits this backend: every rank of the parent calls it with the same `ranks` (parent group
    /// ranks of the child, in child-rank order). Members get `Some(child)`, non-members `None`
    /// (they still take part, as NCCL's no-colour split requires).
    fn split(&self, ranks: &[usize], opts: &BackendOptions) -> Result<Option<Arc<dyn Backend>>> {
        unsupported(self.name(), "split")
    }

    /// `shrink` (PyTorch 2.9's backend shrink, `ncclCommShrink` in `ProcessGroupNCCL`): a
    /// backend for this group's members not in `ranks_to_exclude` (group ranks), made from this
    /// one; called by the survivors only. `Ok(None)` when this backend cannot shrink itself
    /// (the default): the caller then creates a new backend for the survivors.
    ///
    /// # Errors
    /// The backend's own failure to shrink.
    fn shrink(
        &self,
        ranks_to_exclude: &[usize],
        opts: &BackendOptions,
    ) -> Result<Option<Arc<dyn Backend>>> {
        Ok(None)
    }

    /// Aborts all pending ops and the connections (`abort`); pending works fail.
    fn abort(&self) {}
    /// Orderly shutdown after the user is done (`shutdown`); later ops fail.
    fn shutdown(&self) {}
}

/// Implements, inside an `impl Backend for Wrapper` block, the named [`Backend`] methods by
/// calling the same method of the wrapped backend in field `$inner` (an `Arc<dyn Backend>` or
/// any type with those methods). For backends that wrap another one and change only some ops
/// (c10d-core's `Staged`, c10d-world's DETAIL wrapper):
///
/// ```ignore
/// impl Backend for Wrapper {
///     c10d_core::delegate_backend!(inner: name, rank, size, device_type, timeout);
///     fn set_timeout(&self, t: Duration) { /* ... */ }
///     // ...
/// }
/// ```
///
/// Methods it can delegate: `name`, `rank`, `size`, `device_type`, `timeout`, `set_timeout`,
/// `sequence_number`, `set_sequence_number`, `is_initialized`, `barrier`,
/// `monitored_barrier`, `supports_coalescing`, `start_coalescing`, `end_coalescing`,
/// `supports_splitting`, `abort`, `shutdown` (those whose arguments and result need no
/// translation).
#[macro_export]
macro_rules! delegate_backend {
    ($inner:ident: $($method:ident),+ $(,)?) => {
        $($crate::delegate_backend!(@one $inner $method);)+
    };
    (@one $i:ident name) => {
        fn name(&self) -> &str { self.$i.name() }
    };
    (@one $i:ident rank) => {
        fn rank(&self) -> usize { self.$i.rank() }
    };
    (@one $i:ident size) => {
        fn size(&self) -> usize { self.$i.size() }
    };
    (@one $i:ident device_type) => {
        fn device_type(&self) -> $crate::DeviceType { self.$i.device_type() }
    };
    (@one $i:ident timeout) => {
        fn timeout(&self) -> ::std::time::Duration { self.$i.timeout() }
    };
    (@one $i:ident set_timeout) => {
        fn set_timeout(&self, timeout: ::std::time::Duration) { self.$i.set_timeout(timeout) }
    };
    (@one $i:ident sequence_number) => {
        fn sequence_number(&self) -> u64 { self.$i.sequence_number() }
    };
    (@one $i:ident set_sequence_number) => {
        fn set_sequence_number(&self, seq: u64) { self.$i.set_sequence_number(seq) }
    };
    (@one $i:ident is_initialized) => {
        fn is_initialized(&self) -> bool { self.$i.is_initialized() }
    };
    (@one $i:ident barrier) => {
        fn barrier(&self, opts: &$crate::BarrierOptions) -> $crate::Result<$crate::Work> {
            self.$i.barrier(opts)
        }
    };
    (@one $i:ident monitored_barrier) => {
        fn monitored_barrier(
            &self,
            opts: &$crate::BarrierOptions,
            wait_all_ranks: bool,
        ) -> $crate::Result<()> {
            self.$i.monitored_barrier(opts, wait_all_ranks)
        }
    };
    (@one $i:ident supports_coalescing) => {
        fn supports_coalescing(&self) -> bool { self.$i.supports_coalescing() }
    };
    (@one $i:ident start_coalescing) => {
        fn start_coalescing(&self) -> $crate::Result<()> { self.$i.start_coalescing() }
    };
    (@one $i:ident end_coalescing) => {
        fn end_coalescing(&self) -> $crate::Result<$crate::Work> { self.$i.end_coalescing() }
    };
    (@one $i:ident supports_splitting) => {
        fn supports_splitting(&self) -> bool { self.$i.supports_splitting() }
    };
    (@one $i:ident abort) => {
        fn abort(&self) { self.$i.abort() }
    };
    (@one $i:ident shutdown) => {
        fn shutdown(&self) { self.$i.shutdown() }
    };
}

/// Error text for a missing backend, as PyTorch's `ProcessGroup::getBackend`.
pub(crate) fn no_backend_error(device: DeviceType) -> DistError {
    DistError::invalid(format!(
        "No backend type associated with device type {device}"
    ))
}

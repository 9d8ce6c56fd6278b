//! The `Backend` trait: a collective backend for one device type (mirrors `c10d::Backend`,
//! the objects `ProcessGroup._get_backend` returns).
//!
//! A backend runs ops through its [`Collectives::run`] (one `match` over [`Op`]: an op it
//! lacks answers [`Op::unsupported_by`], PyTorch's "Backend {name} does not support {op}");
//! this trait adds what is not an op: identity, timeouts, sequence numbers, coalescing
//! windows, splitting, shrinking, abort and shutdown. Ranks are *group* ranks.

use crate::collectives::Collectives;
use crate::device::DeviceType;
use crate::error::{DistError, Result};
#[cfg(doc)]
use crate::op::Op;
use crate::options::*;
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
pub trait Backend: Collectives + Send + Sync + 'static {
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

    /// `monitored_barrier`: blocking barrier through rank 0 that names the ranks that did not
    /// arrive (PyTorch's `monitoredBarrier`; not an [`Op`]: it blocks and returns no `Work`).
    ///
    /// # Errors
    /// The ranks that did not arrive within `opts.timeout`, or "Backend {name} does not
    /// support monitoredBarrier" (the default).
    fn monitored_barrier(&self, opts: &BarrierOptions, wait_all_ranks: bool) -> Result<()> {
        unsupported(self.name(), "monitoredBarrier")
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
/// `sequence_number`, `set_sequence_number`, `is_initialized`, `monitored_barrier`, `supports_coalescing`, `start_coalescing`, `end_coalescing`,
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

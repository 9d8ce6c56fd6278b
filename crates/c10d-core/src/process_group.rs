//! `ProcessGroup`: a group of ranks with one backend per device type.
//!
//! Mirrors `c10d::ProcessGroup`: rank, size, group name and description, the backends keyed by
//! device type, a default device type, an optional bound device, and the sequence number.
//! Collectives dispatch to the backend of the tensors' device; tensors of several device types in
//! one call are refused.

use crate::backend::{no_backend_error, Backend};
use crate::collectives::Collectives;
use crate::device::{Device, DeviceType};
use crate::dtype::Element;
use crate::error::{DistError, Result};
use crate::op::Op;
use crate::options::*;
use crate::reduce::ReduceOp;
use crate::tensor::Tensor;
use crate::work::Work;
use std::sync::{Arc, RwLock};
use std::time::Duration;

struct Inner {
    rank: usize,
    size: usize,
    name: String,
    desc: String,
    bound_device: Option<Device>,
    backends: RwLock<Vec<(DeviceType, Arc<dyn Backend>)>>,
    default_device: RwLock<DeviceType>,
}

/// A process group (`torch.distributed.ProcessGroup`). Cloning shares the group.
#[derive(Clone)]
pub struct ProcessGroup(Arc<Inner>);

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup(name={:?}, rank={}, size={})",
            self.0.name, self.0.rank, self.0.size
        )
    }
}

impl ProcessGroup {
    /// A group with no backends yet.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when `rank >= size` or `size == 0`.
    pub fn new(
        rank: usize,
        size: usize,
        name: impl Into<String>,
        desc: impl Into<String>,
        bound_device: Option<Device>,
    ) -> Result<Self> {
        if size == 0 || rank >= size {
            return Err(DistError::invalid(format!(
                "Invalid rank {rank} for a group of size {size}"
            )));
        }
        Ok(ProcessGroup(Arc::new(Inner {
            rank,
            size,
            name: name.into(),
            desc: desc.into(),
            bound_device,
            backends: RwLock::new(Vec::new()),
            default_device: RwLock::new(DeviceType::Cpu),
        })))
    }

    /// A group over a single backend for its device type (the common case).
    ///
    /// # Errors
    /// As [`ProcessGroup::new`].
    pub fn with_backend(
        backend: Arc<dyn Backend>,
        name: impl Into<String>,
        desc: impl Into<String>,
    ) -> Result<Self> {
        let pg = ProcessGroup::new(backend.rank(), backend.size(), name, desc, None)?;
        pg.set_backend(backend.device_type(), backend, true);
        Ok(pg)
    }

    /// Registers the backend for `device_type` (`_register_backend`); `make_default` also makes
    /// it the default device type (used for barrier and device-less calls).
    pub fn set_backend(
        &self,
        device_type: DeviceType,
        backend: Arc<dyn Backend>,
        make_default: bool,
    ) {
        let mut b = self.0.backends.write().unwrap_or_else(|e| e.into_inner());
        b.retain(|(d, _)| *d != device_type);
        b.push((device_type, backend));
        if make_default {
            *self
                .0
                .default_device
                .write()
                .unwrap_or_else(|e| e.into_inner()) = device_type;
        }
    }

    /// The backend for a device type (`_get_backend(device)`).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "No backend type associated with device type cuda".
    pub fn backend(&self, device_type: DeviceType) -> Result<Arc<dyn Backend>> {
        self.0
            .backends
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(d, _)| *d == device_type)
            .map(|(_, b)| b.clone())
            .ok_or_else(|| no_backend_error(device_type))
    }

    /// All (device type, backend) pairs.
    pub fn backends(&self) -> Vec<(DeviceType, Arc<dyn Backend>)> {
        self.0
            .backends
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The default device type's backend.
    ///
    /// # Errors
    /// As [`ProcessGroup::backend`].
    pub fn default_backend(&self) -> Result<Arc<dyn Backend>> {
        self.backend(self.default_device_type())
    }

    /// The default device type (the accelerator one for mixed groups).
    pub fn default_device_type(&self) -> DeviceType {
        *self
            .0
            .default_device
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// This process's rank in the group (`pg.rank()`).
    pub fn rank(&self) -> usize {
        self.0.rank
    }
    /// Group size (`pg.size()`).
    pub fn size(&self) -> usize {
        self.0.size
    }
    /// Group name (`pg.group_name`).
    pub fn group_name(&self) -> &str {
        &self.0.name
    }
    /// Group description (`pg.group_desc`).
    pub fn group_desc(&self) -> &str {
        &self.0.desc
    }
    /// Device the group is bound to (`pg.bound_device_id`).
    pub fn bound_device_id(&self) -> Option<Device> {
        self.0.bound_device
    }
    /// Sequence number of the default backend (`_get_sequence_number_for_group`).
    pub fn sequence_number(&self) -> u64 {
        self.default_backend()
            .map(|b| b.sequence_number())
            .unwrap_or(0)
    }
    /// Sets every backend's default timeout (`pg._set_default_timeout`).
    pub fn set_timeout(&self, timeout: Duration) {
        for (_, b) in self.backends() {
            b.set_timeout(timeout);
        }
    }
    /// True when both handles are the same group.
    pub fn ptr_eq(&self, other: &ProcessGroup) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    fn backend_for<'a>(
        &self,
        tensors: impl IntoIterator<Item = &'a Tensor>,
    ) -> Result<Arc<dyn Backend>> {
        let mut dt = None;
        for t in tensors {
            let d = t.device().device_type();
            match dt {
                None => dt = Some(d),
                Some(x) if x != d => {
                    return Err(DistError::invalid(format!(
                        "tensors of one collective must be on one device type, got {x} and {d}"
                    )))
                }
                _ => {}
            }
        }
        self.backend(dt.unwrap_or_else(|| self.default_device_type()))
    }

    /// `monitored_barrier` on the CPU backend.
    ///
    /// # Errors
    /// The barrier's failure (naming the ranks that did not arrive), or no CPU backend.
    pub fn monitored_barrier(&self, opts: &BarrierOptions, wait_all_ranks: bool) -> Result<()> {
        self.backend(DeviceType::Cpu)?
            .monitored_barrier(opts, wait_all_ranks)
    }
    /// Blocking all_reduce over a plain slice (copied into a tensor and back).
    ///
    /// # Errors
    /// As [`ProcessGroup::all_reduce`] plus the op's own failure.
    pub fn all_reduce_slice<T: Element>(&self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let t = Tensor::from_vec(data.to_vec());
        self.all_reduce(
            std::slice::from_ref(&t),
            &AllreduceOptions {
                reduce_op: op,
                ..Default::default()
            },
        )?
        .wait()?;
        t.read(|s: &[T]| data.copy_from_slice(s))
    }

    /// Aborts every backend (`_abort`).
    pub fn abort(&self) {
        self.backends().into_iter().for_each(|(_, b)| b.abort());
    }
    /// Shuts down every backend (`shutdown`).
    pub fn shutdown(&self) {
        self.backends().into_iter().for_each(|(_, b)| b.shutdown());
    }
}

impl Collectives for ProcessGroup {
    /// Runs `op` on the backend of its tensors' device type (a barrier: `opts.device`'s, else
    /// the default device type's).
    ///
    /// # Errors
    /// Tensors of several device types, no backend for the device type, or the backend's own
    /// argument errors.
    fn run(&self, op: Op) -> Result<Work> {
        let backend = match &op {
            Op::Barrier { opts } => self.backend(
                opts.device
                    .map(|d| d.device_type())
                    .unwrap_or_else(|| self.default_device_type()),
            )?,
            _ => self.backend_for(op.tensors())?,
        };
        backend.run(op)
    }
}

//! `ProcessGroup`: a group of ranks with one backend per device type.
//!
//! Mirrors `c10d::ProcessGroup`: rank, size, group name and description, the backends keyed by
//! device type, a default device type, an optional bound device, and the sequence number.
//! Collectives dispatch to the backend of the tensors' device; tensors of several device types in
//! one call are refused.

use crate::backend::{no_backend_error, Backend};
use crate::device::{Device, DeviceType};
use crate::dtype::Element;
use crate::error::{DistError, Result};
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

    /// `broadcast` (see [`Backend::broadcast`]).
    ///
    /// # Errors
    /// Argument errors from the backend, or no backend for the tensors' device.
    pub fn broadcast(&self, tensors: &[Tensor], opts: &BroadcastOptions) -> Result<Work> {
        self.backend_for(tensors)?.broadcast(tensors, opts)
    }
    /// `allreduce` (see [`Backend::all_reduce`]).
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn all_reduce(&self, tensors: &[Tensor], opts: &AllreduceOptions) -> Result<Work> {
        self.backend_for(tensors)?.all_reduce(tensors, opts)
    }
    /// `allreduce_coalesced`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn all_reduce_coalesced(
        &self,
        tensors: &[Tensor],
        opts: &AllreduceCoalescedOptions,
    ) -> Result<Work> {
        self.backend_for(tensors)?
            .all_reduce_coalesced(tensors, opts)
    }
    /// `reduce`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn reduce(&self, tensors: &[Tensor], opts: &ReduceOptions) -> Result<Work> {
        self.backend_for(tensors)?.reduce(tensors, opts)
    }
    /// `allgather`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn all_gather(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        self.backend_for(inputs.iter().chain(outputs.iter().flatten()))?
            .all_gather(outputs, inputs, opts)
    }
    /// `_allgather_base`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn all_gather_into_tensor(
        &self,
        output: &Tensor,
        input: &Tensor,
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        self.backend_for([output, input])?
            .all_gather_into_tensor(output, input, opts)
    }
    /// `allgather_coalesced`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn all_gather_coalesced(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        self.backend_for(inputs.iter().chain(outputs.iter().flatten()))?
            .all_gather_coalesced(outputs, inputs, opts)
    }
    /// `allgather_into_tensor_coalesced`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn all_gather_into_tensor_coalesced(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        self.backend_for(inputs.iter().chain(outputs))?
            .all_gather_into_tensor_coalesced(outputs, inputs, opts)
    }
    /// `gather`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn gather(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &GatherOptions,
    ) -> Result<Work> {
        self.backend_for(inputs.iter().chain(outputs.iter().flatten()))?
            .gather(outputs, inputs, opts)
    }
    /// `scatter`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn scatter(
        &self,
        outputs: &[Tensor],
        inputs: &[Vec<Tensor>],
        opts: &ScatterOptions,
    ) -> Result<Work> {
        self.backend_for(outputs.iter().chain(inputs.iter().flatten()))?
            .scatter(outputs, inputs, opts)
    }
    /// `reduce_scatter`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn reduce_scatter(
        &self,
        outputs: &[Tensor],
        inputs: &[Vec<Tensor>],
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        self.backend_for(outputs.iter().chain(inputs.iter().flatten()))?
            .reduce_scatter(outputs, inputs, opts)
    }
    /// `_reduce_scatter_base`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn reduce_scatter_tensor(
        &self,
        output: &Tensor,
        input: &Tensor,
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        self.backend_for([output, input])?
            .reduce_scatter_tensor(output, input, opts)
    }
    /// `reduce_scatter_tensor_coalesced`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn reduce_scatter_tensor_coalesced(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        self.backend_for(outputs.iter().chain(inputs))?
            .reduce_scatter_tensor_coalesced(outputs, inputs, opts)
    }
    /// `alltoall_base`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn all_to_all_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
        opts: &AllToAllOptions,
    ) -> Result<Work> {
        self.backend_for([output, input])?.all_to_all_single(
            output,
            input,
            output_split_sizes,
            input_split_sizes,
            opts,
        )
    }
    /// `alltoall`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn all_to_all(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &AllToAllOptions,
    ) -> Result<Work> {
        self.backend_for(outputs.iter().chain(inputs))?
            .all_to_all(outputs, inputs, opts)
    }
    /// `barrier` on the default backend (or `opts.device`'s).
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn barrier(&self, opts: &BarrierOptions) -> Result<Work> {
        let dt = opts
            .device
            .map(|d| d.device_type())
            .unwrap_or_else(|| self.default_device_type());
        self.backend(dt)?.barrier(opts)
    }
    /// `monitored_barrier` on the CPU backend.
    ///
    /// # Errors
    /// The barrier's failure (naming the ranks that did not arrive), or no CPU backend.
    pub fn monitored_barrier(&self, opts: &BarrierOptions, wait_all_ranks: bool) -> Result<()> {
        self.backend(DeviceType::Cpu)?
            .monitored_barrier(opts, wait_all_ranks)
    }
    /// `send`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn send(&self, tensors: &[Tensor], dst: usize, tag: i64) -> Result<Work> {
        self.backend_for(tensors)?.send(tensors, dst, tag)
    }
    /// `recv`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn recv(&self, tensors: &[Tensor], src: usize, tag: i64) -> Result<Work> {
        self.backend_for(tensors)?.recv(tensors, src, tag)
    }
    /// `recvAnysource`.
    ///
    /// # Errors
    /// As [`ProcessGroup::broadcast`].
    pub fn recv_anysource(&self, tensors: &[Tensor], tag: i64) -> Result<Work> {
        self.backend_for(tensors)?.recv_anysource(tensors, tag)
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

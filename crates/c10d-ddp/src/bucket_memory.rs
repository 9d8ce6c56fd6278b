//! Where the Reducer's buckets live: beside their parameters. Host parameters get host
//! buckets; device parameters (CUDA tensors of c10d-nccl, or any [`c10d_core::DeviceStorage`]
//! that can allocate) get buckets on their device, allocated with `Tensor::new_zeros` from an
//! empty tensor kept per device, so the Reducer never holds the parameters themselves (caller
//! memory lent for a scope stays the caller's).

use c10d_core::{DType, Device, DistError, Result, Tensor};

/// One empty tensor per device of the parameters, to allocate buckets (and the bucket
/// rebuild's message) from.
pub(crate) struct BucketMemory {
    anchors: Vec<Tensor>,
}

impl BucketMemory {
    /// Anchors for the devices of `params`.
    ///
    /// # Errors
    /// A device parameter whose storage cannot allocate, naming the parameter.
    pub fn for_params(params: &[Tensor]) -> Result<BucketMemory> {
        let mut anchors: Vec<Tensor> = Vec::new();
        for (i, p) in params.iter().enumerate() {
            if anchors.iter().any(|a| a.device() == p.device()) {
                continue;
            }
            let a = p.new_zeros(p.dtype(), &[0]).map_err(|e| {
                e.with_prefix(&format!(
                    "parameter {i} on {}: the Reducer keeps its buckets on the parameters' \
                     device and could not allocate there: ",
                    p.device()
                ))
            })?;
            anchors.push(a);
        }
        Ok(BucketMemory { anchors })
    }

    /// A flat tensor of `numel` zeros of `dtype` on `device`.
    ///
    /// # Errors
    /// A device no parameter was on; the device's allocation error.
    pub fn zeros(&self, dtype: DType, device: Device, numel: usize) -> Result<Tensor> {
        match self.anchors.iter().find(|a| a.device() == device) {
            Some(a) => a.new_zeros(dtype, &[numel]),
            None => Err(DistError::invalid(format!(
                "no parameter on {device} was registered with this Reducer"
            ))),
        }
    }

    /// `host` (a CPU tensor) copied to `device` (itself when `device` is the CPU).
    ///
    /// # Errors
    /// A device no parameter was on; the device's allocation or copy error.
    pub fn to_device(&self, host: &Tensor, device: Device) -> Result<Tensor> {
        match self.anchors.iter().find(|a| a.device() == device) {
            Some(a) => beside(a, host),
            None if device == Device::Cpu => Ok(host.clone()),
            None => Err(DistError::invalid(format!(
                "no parameter on {device} was registered with this Reducer"
            ))),
        }
    }
}

/// `host` (a CPU tensor) copied to `like`'s device (itself when that is the CPU): what DDP's
/// helper messages (bucket rebuild, parameter verification) travel in, on the parameters'
/// device as PyTorch moves them there, so a group with only a device backend carries them.
///
/// # Errors
/// The device's allocation or copy error.
pub(crate) fn beside(like: &Tensor, host: &Tensor) -> Result<Tensor> {
    if like.is_cpu() {
        return Ok(host.clone());
    }
    let t = like.new_zeros(host.dtype(), host.shape())?;
    t.copy_from(host)?;
    Ok(t)
}

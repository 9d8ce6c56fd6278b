//! Where the Reducer's buckets live: beside their parameters. Host parameters get host
//! buckets; device parameters (CUDA tensors of c10d-nccl, or any [`c10d_core::DeviceStorage`]
//! that can allocate) get buckets on their device, allocated with `Tensor::new_zeros` from an
//! empty tensor kept per (device, dtype), so the Reducer never holds the parameters themselves
//! (caller memory lent for a scope stays the caller's).

use c10d_core::{DType, Device, Result, Tensor};

/// One empty tensor per (device, dtype) of the parameters, to allocate buckets from.
pub(crate) struct BucketMemory {
    anchors: Vec<Tensor>,
}

impl BucketMemory {
    /// Anchors for the devices and dtypes of `params`.
    ///
    /// # Errors
    /// A device parameter whose storage cannot allocate, naming the parameter.
    pub fn for_params(params: &[Tensor]) -> Result<BucketMemory> {
        let mut anchors: Vec<Tensor> = Vec::new();
        for (i, p) in params.iter().enumerate() {
            let known = anchors
                .iter()
                .any(|a| a.device() == p.device() && a.dtype() == p.dtype());
            if !known {
                let a = p.new_zeros(&[0]).map_err(|e| {
                    e.with_prefix(&format!(
                        "parameter {i} on {}: the Reducer keeps its buckets on the parameters' \
                         device and could not allocate there: ",
                        p.device()
                    ))
                })?;
                anchors.push(a);
            }
        }
        Ok(BucketMemory { anchors })
    }

    /// A flat bucket of `numel` zeros of `dtype` on `device`.
    ///
    /// # Errors
    /// A (device, dtype) no parameter had; the device's allocation error.
    pub fn zeros(&self, dtype: DType, device: Device, numel: usize) -> Result<Tensor> {
        match self
            .anchors
            .iter()
            .find(|a| a.device() == device && a.dtype() == dtype)
        {
            Some(a) => a.new_zeros(&[numel]),
            None => Err(c10d_core::DistError::invalid(format!(
                "no parameter of {dtype} on {device} was registered with this Reducer"
            ))),
        }
    }
}

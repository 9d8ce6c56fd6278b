//! CUDA devices: one retained primary context per ordinal (the context the CUDA runtime, and so
//! NCCL and PyTorch, use for that device), made once per process and bound to the calling
//! thread before each driver call.

use crate::cuda;
use c10d_core::{Device, DistError, Result};
use cudarc::driver::{CudaContext, DriverError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A driver error as a [`DistError::Backend`]: "CUDA error in {what}: {name}".
pub(crate) fn driver_error(what: &str, e: DriverError) -> DistError {
    DistError::backend(format!("CUDA error in {what}: {e:?}"))
}

/// The ordinal of a CUDA device.
///
/// # Errors
/// [`DistError::InvalidArgument`] for a CPU device, or an ordinal past the visible devices
/// ("Invalid device cuda:3: 1 CUDA device(s) visible"); PyTorch's no-GPU error without a GPU.
pub fn ordinal(device: Device) -> Result<u32> {
    let Device::Cuda(i) = device else {
        return Err(DistError::invalid(format!(
            "expected a CUDA device, got {device}"
        )));
    };
    let status = cuda::cuda_status();
    if status.device_count == 0 {
        return Err(cuda::no_gpus_error(status));
    }
    if i as usize >= status.device_count {
        return Err(DistError::invalid(format!(
            "Invalid device {device}: {} CUDA device(s) visible",
            status.device_count
        )));
    }
    Ok(i)
}

/// The primary context of `device`, bound to the calling thread.
///
/// # Errors
/// As [`ordinal`]; a driver error creating or binding the context.
pub fn context(device: Device) -> Result<Arc<CudaContext>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<u32, Arc<CudaContext>>>> = OnceLock::new();
    let i = ordinal(device)?;
    let mut map = CONTEXTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let ctx = match map.get(&i) {
        Some(c) => c.clone(),
        None => {
            let c = CudaContext::new(i as usize)
                .map_err(|e| driver_error("cuDevicePrimaryCtxRetain", e))?;
            map.insert(i, c.clone());
            c
        }
    };
    drop(map);
    ctx.bind_to_thread()
        .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
    Ok(ctx)
}

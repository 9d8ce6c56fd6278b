//! Choosing the device and the backend at run time, from one build: what an inference server
//! or trainer reads from its configuration.

use crate::inplace::from_candle;
use c10d_core::{DistError, Result};
use candle_core::Device;

/// The candle device and the `init_process_group` backend string for `choice`: `"cpu"` gives
/// the CPU and `"gloo"`; `"cuda"` gives `cuda:local_rank` (candle's device on its own stream)
/// and `"cpu:gloo,cuda:nccl"` (CUDA tensors over NCCL, CPU tensors, such as object
/// collectives, over gloo). NCCL is only loaded once a group uses it.
///
/// # Errors
/// [`DistError::InvalidArgument`] for another `choice`; candle's error when the CUDA device
/// cannot be opened (no GPU, or c10d-candle built without its `cuda` feature).
pub fn device_and_backend(choice: &str, local_rank: usize) -> Result<(Device, String)> {
    match choice {
        "cpu" => Ok((Device::Cpu, "gloo".into())),
        "cuda" => {
            let dev = Device::new_cuda(local_rank).map_err(from_candle)?;
            Ok((dev, "cpu:gloo,cuda:nccl".into()))
        }
        other => Err(DistError::invalid(format!(
            "c10d-candle: device {other:?}: expected \"cpu\" or \"cuda\""
        ))),
    }
}

/// [`device_and_backend`] for `C10D_CANDLE_DEVICE` (default `"cpu"`) and `LOCAL_RANK`
/// (default 0, as set by `c10drun` / torchrun).
///
/// # Errors
/// As [`device_and_backend`]; a `LOCAL_RANK` that is not a number.
pub fn device_and_backend_from_env() -> Result<(Device, String)> {
    let choice = std::env::var("C10D_CANDLE_DEVICE").unwrap_or_else(|_| "cpu".into());
    let local = match std::env::var("LOCAL_RANK") {
        Ok(v) => v
            .parse()
            .map_err(|_| DistError::invalid(format!("LOCAL_RANK={v:?} is not a number")))?,
        Err(_) => 0,
    };
    device_and_backend(&choice, local)
}

/// Joins the job on the device `C10D_CANDLE_DEVICE` chooses: `init_process_group` (env://
/// rendezvous, the environment `c10drun` / torchrun gives, 60 s timeout) with the backend of
/// [`device_and_backend_from_env`]; returns the device. What the candle examples start with.
///
/// # Errors
/// As [`device_and_backend_from_env`] and `init_process_group`.
pub fn init_on_chosen_device() -> Result<Device> {
    let (dev, backend) = device_and_backend_from_env()?;
    c10d_world::init_process_group(c10d_world::InitOptions {
        backend: Some(backend),
        timeout: Some(std::time::Duration::from_secs(60)),
        ..Default::default()
    })?;
    Ok(dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_gloo_and_other_names_are_refused() {
        let (dev, backend) = device_and_backend("cpu", 3).unwrap();
        assert!(dev.is_cpu());
        assert_eq!(backend, "gloo");
        let e = device_and_backend("tpu", 0).unwrap_err().to_string();
        assert!(e.contains("expected \"cpu\" or \"cuda\""), "{e}");
    }

    #[test]
    fn cuda_without_a_gpu_is_an_error_not_a_panic() {
        if cfg!(feature = "cuda") {
            return; // with the feature, a GPU may be there
        }
        let e = device_and_backend("cuda", 0).unwrap_err().to_string();
        assert!(e.contains("candle"), "{e}");
    }
}

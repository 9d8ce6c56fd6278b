//! Whether this process can see a CUDA GPU, through cudarc's driver API loaded at run time.
//!
//! cudarc's dynamic loader panics when `libcuda` is missing, so the driver library is first
//! probed here with `libloading` (under the names cudarc tries), and the cudarc calls run
//! inside `catch_unwind` as a second guard: [`cuda_device_count`] never panics.

use c10d_core::DistError;
use std::sync::OnceLock;

/// PyTorch's message when a `ProcessGroupNCCL` is made without a GPU (a `ValueError`).
pub const NO_GPUS_MESSAGE: &str = "ProcessGroupNCCL is only supported with GPUs, no GPUs found!";

/// The CUDA driver library names probed, in order (cudarc tries the same ones among others).
pub const DRIVER_LIBRARY_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaStatus {
    /// Number of visible CUDA devices (0 when the driver is missing or reports an error).
    pub device_count: usize,
    /// The driver library that opened, if any.
    pub driver_library: Option<String>,
    /// What was looked for and what happened, for error messages.
    pub detail: String,
}

fn probe() -> CudaStatus {
    let mut failures = Vec::new();
    let mut driver = None;
    for name in DRIVER_LIBRARY_NAMES {
        // SAFETY: opening the CUDA driver library only runs its initialisers; the handle is
        // dropped at once (cudarc opens its own).
        match unsafe { libloading::Library::new(name) } {
            Ok(_) => {
                driver = Some(name.to_string());
                break;
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    let Some(lib) = driver else {
        return CudaStatus {
            device_count: 0,
            driver_library: None,
            detail: format!(
                "the CUDA driver library could not be loaded ({})",
                failures.join("; ")
            ),
        };
    };
    let counted = std::panic::catch_unwind(|| -> Result<i32, String> {
        cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
        cudarc::driver::result::device::get_count()
            .map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))
    });
    match counted {
        Ok(Ok(n)) => CudaStatus {
            device_count: n.max(0) as usize,
            detail: format!("CUDA driver {lib} reports {n} device(s)"),
            driver_library: Some(lib),
        },
        Ok(Err(e)) => CudaStatus {
            device_count: 0,
            detail: format!("CUDA driver {lib} loaded, but {e}"),
            driver_library: Some(lib),
        },
        Err(_) => CudaStatus {
            device_count: 0,
            detail: format!("CUDA driver {lib} loaded, but cudarc could not use it"),
            driver_library: Some(lib),
        },
    }
}

/// The probe's result, computed once per process (CUDA fixes the visible devices at `cuInit`).
pub fn cuda_status() -> &'static CudaStatus {
    static STATUS: OnceLock<CudaStatus> = OnceLock::new();
    STATUS.get_or_init(probe)
}

/// Number of CUDA devices this process can use; 0 without a driver or GPU. Never panics.
pub fn cuda_device_count() -> usize {
    cuda_status().device_count
}

/// PyTorch's no-GPU error ([`DistError::InvalidArgument`], Python's `ValueError`) followed by
/// what was looked for.
pub fn no_gpus_error(status: &CudaStatus) -> DistError {
    DistError::invalid(format!("{NO_GPUS_MESSAGE} ({})", status.detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_count_never_panics_and_is_stable() {
        let a = cuda_device_count();
        let b = cuda_device_count();
        assert_eq!(a, b);
        let s = cuda_status();
        assert!(!s.detail.is_empty());
        if s.driver_library.is_none() {
            assert_eq!(a, 0);
            assert!(s.detail.contains("libcuda.so.1"), "{}", s.detail);
        }
    }

    #[test]
    fn no_gpu_error_is_pytorchs_value_error() {
        let s = CudaStatus {
            device_count: 0,
            driver_library: None,
            detail: "the CUDA driver library could not be loaded (libcuda.so.1: not found)".into(),
        };
        let e = no_gpus_error(&s);
        assert_eq!(e.kind(), c10d_core::ErrorKind::InvalidArgument);
        assert!(e.message().starts_with(NO_GPUS_MESSAGE));
        assert!(e.message().contains("libcuda.so.1"));
    }
}

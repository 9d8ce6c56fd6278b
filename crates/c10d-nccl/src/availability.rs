//! Whether the NCCL backend can run in this process: the library loads and a GPU is visible.

use crate::cuda;
use crate::loader;
use crate::version::Version;
#[cfg(doc)]
use c10d_core::DistError;
use c10d_core::Result;

/// What [`check_available`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclAvailability {
    /// The loaded NCCL's version.
    pub version: Version,
    /// Where it was loaded from.
    pub library: String,
    /// Visible CUDA devices (at least 1).
    pub device_count: usize,
}

/// The NCCL library (loaded once per process) and at least one GPU.
///
/// # Errors
/// - no GPU: [`DistError::InvalidArgument`] "ProcessGroupNCCL is only supported with GPUs, no
///   GPUs found!" and what was looked for (PyTorch's `ValueError`), checked first as PyTorch does;
/// - no loadable NCCL: [`DistError::Unsupported`] listing every place tried.
pub fn check_available() -> Result<NcclAvailability> {
    let status = cuda::cuda_status();
    if status.device_count == 0 {
        return Err(cuda::no_gpus_error(status));
    }
    let lib = loader::library()?;
    Ok(NcclAvailability {
        version: lib.version(),
        library: lib.location().to_string(),
        device_count: status.device_count,
    })
}

/// `torch.distributed.is_nccl_available()` for this crate: the NCCL library loads and at least
/// one GPU is visible. Never panics.
pub fn is_nccl_available() -> bool {
    cuda::cuda_device_count() > 0 && loader::library().is_ok()
}

/// The version of the process's NCCL library (loading it if needed). Needs no GPU.
///
/// # Errors
/// [`DistError::Unsupported`] listing every place tried when no NCCL loads.
pub fn nccl_version() -> Result<Version> {
    Ok(loader::library()?.version())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailability_is_clear_whatever_the_machine() {
        match check_available() {
            Err(e) if cuda::cuda_device_count() == 0 => {
                assert_eq!(e.kind(), c10d_core::ErrorKind::InvalidArgument);
                assert!(e.message().starts_with(cuda::NO_GPUS_MESSAGE), "{e}");
                assert!(!is_nccl_available());
            }
            Err(e) => assert!(e.message().contains("could not be loaded"), "{e}"),
            Ok(found) => {
                assert!(found.device_count > 0);
                assert!(is_nccl_available());
            }
        }
    }
}

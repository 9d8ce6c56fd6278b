//! Whether the NCCL backend can run in this process: the library loads and a GPU is visible.

use crate::cuda;
use crate::loader;
use crate::version::Version;
use c10d_core::{DistError, Result};

/// True when this version of the crate has the NCCL collectives. False for now: loading,
/// options, environment parsing and watchdog bookkeeping exist; communicators and collectives
/// on device memory come with a GPU-equipped change (see the crate docs).
pub const COLLECTIVES_BUILT: bool = false;

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

/// The honest error for creating an NCCL backend in a build without the collectives, once
/// [`check_available`] has passed.
pub fn collectives_not_built(found: &NcclAvailability) -> DistError {
    DistError::unsupported(format!(
        "NCCL {} ({}) and {} GPU(s) were found, but the NCCL collectives are not in this version of c10d-rs (c10d-nccl has its loader, options, environment parsing and watchdog bookkeeping only)",
        found.version, found.library, found.device_count
    ))
}

/// The error creating an NCCL backend gives in this build: no GPU, no NCCL, or (with both)
/// collectives not built. Never panics.
pub fn backend_creation_error() -> DistError {
    match check_available() {
        Err(e) => e,
        Ok(found) => collectives_not_built(&found),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_error_is_clear_whatever_the_machine() {
        let e = backend_creation_error();
        if cuda::cuda_device_count() == 0 {
            assert_eq!(e.kind(), c10d_core::ErrorKind::InvalidArgument);
            assert!(e.message().starts_with(cuda::NO_GPUS_MESSAGE), "{e}");
            assert!(!is_nccl_available());
        } else if loader::library().is_err() {
            assert!(e.message().contains("could not be loaded"), "{e}");
        } else {
            assert!(
                e.message().contains("collectives are not in this version"),
                "{e}"
            );
        }
    }

    #[test]
    fn not_built_message_says_what_was_found() {
        let e = collectives_not_built(&NcclAvailability {
            version: Version::new(2, 27, 3),
            library: "libnccl.so.2".into(),
            device_count: 2,
        });
        assert_eq!(e.kind(), c10d_core::ErrorKind::Unsupported);
        assert!(e
            .message()
            .starts_with("NCCL 2.27.3 (libnccl.so.2) and 2 GPU(s) were found"));
    }
}

//! Checked NCCL calls: an `ncclResult_t` becomes a typed [`NcclError`] carrying NCCL's own
//! description and last error message, and converts into a [`DistError::Backend`] as PyTorch's
//! `C10D_NCCL_CHECK` raises `DistBackendError`.

use crate::library::NcclLibrary;
use crate::sys;
use crate::version::Version;
use c10d_core::DistError;
use std::ffi::{c_char, c_int, CStr};
use std::fmt;

/// A failed NCCL call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclError {
    /// The C function that failed ("ncclCommInitRank").
    pub call: &'static str,
    /// The `ncclResult_t` it returned.
    pub code: sys::ncclResult_t,
    /// `ncclGetErrorString(code)`.
    pub description: String,
    /// `ncclGetLastError`, when NCCL recorded one.
    pub last_error: Option<String>,
    /// The loaded NCCL's version.
    pub version: Version,
}

/// The enum name of an `ncclResult_t` ("ncclSystemError"), or "ncclResult(N)" for unknown codes.
pub fn result_name(code: sys::ncclResult_t) -> String {
    match code {
        sys::ncclSuccess => "ncclSuccess".into(),
        sys::ncclUnhandledCudaError => "ncclUnhandledCudaError".into(),
        sys::ncclSystemError => "ncclSystemError".into(),
        sys::ncclInternalError => "ncclInternalError".into(),
        sys::ncclInvalidArgument => "ncclInvalidArgument".into(),
        sys::ncclInvalidUsage => "ncclInvalidUsage".into(),
        sys::ncclRemoteError => "ncclRemoteError".into(),
        sys::ncclInProgress => "ncclInProgress".into(),
        sys::ncclTimeout => "ncclTimeout".into(),
        other => format!("ncclResult({other})"),
    }
}

impl fmt::Display for NcclError {
    /// PyTorch's shape: `"NCCL error in: <call>, <description>, NCCL version 2.27.3\n<name>"`
    /// followed by `"\nLast error:\n<message>"` when NCCL has one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NCCL error in: {}, {}, NCCL version {}\n{}",
            self.call,
            self.description,
            self.version,
            result_name(self.code)
        )?;
        if let Some(last) = &self.last_error {
            write!(f, "\nLast error:\n{last}")?;
        }
        Ok(())
    }
}

impl std::error::Error for NcclError {}

impl From<NcclError> for DistError {
    fn from(e: NcclError) -> DistError {
        DistError::backend(e.to_string())
    }
}

/// Copies a C string NCCL returned (static or thread-local storage); null gives `None`.
///
/// # Safety
/// `p` must be null or point to a NUL-terminated string valid for the duration of the call.
unsafe fn c_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    (!s.is_empty()).then_some(s)
}

/// `ncclGetErrorString(code)`.
pub fn error_string(lib: &NcclLibrary, code: sys::ncclResult_t) -> String {
    // SAFETY: ncclGetErrorString accepts any code and returns a pointer to a static string.
    let p = unsafe { (lib.get_error_string)(code) };
    // SAFETY: NCCL returns null or a static NUL-terminated string.
    unsafe { c_string(p) }.unwrap_or_else(|| format!("unknown NCCL result {code}"))
}

/// `ncclGetLastError(comm)`; `comm` may be null (the process-wide last error).
///
/// # Safety
/// `comm` must be null or a live communicator of `lib`.
pub unsafe fn last_error(lib: &NcclLibrary, comm: sys::ncclComm_t) -> Option<String> {
    // SAFETY: the caller guarantees `comm` is null or live.
    let p = unsafe { (lib.get_last_error)(comm) };
    // SAFETY: NCCL returns null or a NUL-terminated string it owns.
    unsafe { c_string(p) }
}

/// Turns the result of `call` into `Ok` or an [`NcclError`] with NCCL's description and the
/// process-wide last error.
pub fn check(
    lib: &NcclLibrary,
    call: &'static str,
    code: sys::ncclResult_t,
) -> Result<(), NcclError> {
    if code == sys::ncclSuccess {
        return Ok(());
    }
    Err(NcclError {
        call,
        code,
        description: error_string(lib, code),
        // SAFETY: a null communicator asks for the process-wide last error.
        last_error: unsafe { last_error(lib, std::ptr::null_mut()) },
        version: lib.version(),
    })
}

/// `ncclGetVersion`, decoded.
///
/// # Errors
/// [`NcclError`] when the call fails; an undecodable code is reported as `ncclInternalError`.
pub fn get_version(lib: &NcclLibrary) -> Result<Version, NcclError> {
    let mut code: c_int = 0;
    // SAFETY: `code` is a valid writable int.
    let rc = unsafe { (lib.get_version)(&mut code) };
    check(lib, "ncclGetVersion", rc)?;
    Version::from_code(code).ok_or_else(|| NcclError {
        call: "ncclGetVersion",
        code: sys::ncclInternalError,
        description: format!("invalid version code {code}"),
        last_error: None,
        version: lib.version(),
    })
}

/// `ncclGetUniqueId`: the bootstrap handle rank 0 shares through the store. Needs no GPU, but
/// NCCL opens its bootstrap socket here.
///
/// # Errors
/// [`NcclError`] from NCCL (e.g. no usable network interface).
pub fn get_unique_id(lib: &NcclLibrary) -> Result<sys::ncclUniqueId, NcclError> {
    let mut id = sys::ncclUniqueId::default();
    // SAFETY: `id` is a valid, writable 128-byte ncclUniqueId.
    let rc = unsafe { (lib.get_unique_id)(&mut id) };
    check(lib, "ncclGetUniqueId", rc)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_has_pytorchs_shape() {
        let e = NcclError {
            call: "ncclCommInitRank",
            code: sys::ncclSystemError,
            description: "unhandled system error (run with NCCL_DEBUG=INFO for details)".into(),
            last_error: Some("socketStartConnect: Connect to 10.0.0.1<1234> failed".into()),
            version: Version::new(2, 27, 3),
        };
        let s = e.to_string();
        assert!(
            s.starts_with("NCCL error in: ncclCommInitRank, unhandled system error"),
            "{s}"
        );
        assert!(s.contains("NCCL version 2.27.3\nncclSystemError"), "{s}");
        assert!(
            s.ends_with("Last error:\nsocketStartConnect: Connect to 10.0.0.1<1234> failed"),
            "{s}"
        );
        let d: DistError = e.into();
        assert_eq!(d.kind(), c10d_core::ErrorKind::Backend);
        assert_eq!(result_name(6), "ncclRemoteError");
        assert_eq!(result_name(42), "ncclResult(42)");
    }
}

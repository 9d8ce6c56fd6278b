//! The NCCL function table: one opened `libnccl` with its core functions resolved at load and
//! the newer ones looked up on first use.
//!
//! Core functions (present in every NCCL ≥ 2.13) are resolved when the library is opened; a
//! library missing one is rejected with an error naming it. Functions newer than that
//! (`ncclCommInitRankConfig` 2.14, `ncclCommFinalize` 2.14, `ncclCommSplit` 2.18,
//! `ncclCommInitRankScalable` 2.23,
//! `ncclCommShrink` 2.27) are looked up only when asked for, so an older NCCL still loads and
//! fails only the feature that needs them, with an error naming the function, the version it
//! needs and the version loaded.

use crate::sys;
use crate::version::Version;
use c10d_core::{DistError, Result};
use libloading::Library;
use std::ffi::c_int;
use std::fmt;
use std::sync::OnceLock;

/// The oldest NCCL whose core function set this crate needs (`ncclGetLastError` came in 2.13).
pub const MIN_NCCL_VERSION: Version = Version::new(2, 13, 0);

/// A function newer than [`MIN_NCCL_VERSION`], looked up on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalFunction {
    /// Its C name.
    pub name: &'static str,
    /// The first NCCL release that has it.
    pub since: Version,
}

/// `ncclCommInitRankConfig` (communicator config, non-blocking init).
pub const COMM_INIT_RANK_CONFIG: OptionalFunction = OptionalFunction {
    name: "ncclCommInitRankConfig",
    since: Version::new(2, 14, 0),
};
/// `ncclCommInitRankScalable` (one communicator from several roots' unique ids).
pub const COMM_INIT_RANK_SCALABLE: OptionalFunction = OptionalFunction {
    name: "ncclCommInitRankScalable",
    since: Version::new(2, 23, 0),
};
/// `ncclCommFinalize` (flush before destroy).
pub const COMM_FINALIZE: OptionalFunction = OptionalFunction {
    name: "ncclCommFinalize",
    since: Version::new(2, 14, 0),
};
/// `ncclCommSplit` (subgroups of an eagerly initialised parent).
pub const COMM_SPLIT: OptionalFunction = OptionalFunction {
    name: "ncclCommSplit",
    since: Version::new(2, 18, 0),
};
/// `ncclCommShrink` (`shrink_group`).
pub const COMM_SHRINK: OptionalFunction = OptionalFunction {
    name: "ncclCommShrink",
    since: Version::new(2, 27, 0),
};

/// Why an optional function is unavailable in the loaded NCCL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingFunction {
    /// The function asked for.
    pub function: OptionalFunction,
    /// The loaded NCCL's version.
    pub loaded: Version,
    /// Where the library was loaded from.
    pub library: String,
    /// The dynamic loader's message when the version is new enough but the symbol is absent.
    pub lookup_error: Option<String>,
}

impl fmt::Display for MissingFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.lookup_error {
            None => write!(
                f,
                "{} needs NCCL >= {}, but the loaded NCCL is {} ({})",
                self.function.name, self.function.since, self.loaded, self.library
            ),
            Some(e) => write!(
                f,
                "{} (NCCL >= {}) was not found in the loaded NCCL {} ({}): {}",
                self.function.name, self.function.since, self.loaded, self.library, e
            ),
        }
    }
}

impl From<MissingFunction> for DistError {
    fn from(m: MissingFunction) -> DistError {
        DistError::unsupported(m.to_string())
    }
}

/// An opened NCCL library and its function table. Function pointers are valid for as long as
/// this value lives (it owns the library handle).
pub struct NcclLibrary {
    /// What was passed to the dynamic loader (a path or a soname).
    location: String,
    version: Version,
    /// `ncclGetVersion`.
    pub(crate) get_version: sys::ncclGetVersion_t,
    /// `ncclGetUniqueId`.
    pub(crate) get_unique_id: sys::ncclGetUniqueId_t,
    /// `ncclCommInitRank`.
    pub(crate) comm_init_rank: sys::ncclCommInitRank_t,
    /// `ncclCommDestroy`.
    pub(crate) comm_destroy: sys::ncclCommDestroy_t,
    /// `ncclCommAbort`.
    pub(crate) comm_abort: sys::ncclCommDestroy_t,
    /// `ncclCommGetAsyncError`.
    pub(crate) comm_get_async_error: sys::ncclCommGetAsyncError_t,
    /// `ncclCommCount`.
    pub(crate) comm_count: sys::ncclCommQueryInt_t,
    /// `ncclCommCuDevice`.
    pub(crate) comm_cu_device: sys::ncclCommQueryInt_t,
    /// `ncclCommUserRank`.
    pub(crate) comm_user_rank: sys::ncclCommQueryInt_t,
    /// `ncclGroupStart`.
    pub(crate) group_start: sys::ncclGroup_t,
    /// `ncclGroupEnd`.
    pub(crate) group_end: sys::ncclGroup_t,
    /// `ncclAllReduce`.
    pub(crate) all_reduce: sys::ncclAllReduce_t,
    /// `ncclBroadcast`.
    pub(crate) broadcast: sys::ncclBroadcast_t,
    /// `ncclReduce`.
    pub(crate) reduce: sys::ncclReduce_t,
    /// `ncclAllGather`.
    pub(crate) all_gather: sys::ncclAllGather_t,
    /// `ncclReduceScatter`.
    pub(crate) reduce_scatter: sys::ncclReduceScatter_t,
    /// `ncclSend`.
    pub(crate) send: sys::ncclSend_t,
    /// `ncclRecv`.
    pub(crate) recv: sys::ncclRecv_t,
    /// `ncclRedOpCreatePreMulSum`.
    pub(crate) red_op_create_pre_mul_sum: sys::ncclRedOpCreatePreMulSum_t,
    /// `ncclRedOpDestroy`.
    pub(crate) red_op_destroy: sys::ncclRedOpDestroy_t,
    /// `ncclGetErrorString`.
    pub(crate) get_error_string: sys::ncclGetErrorString_t,
    /// `ncclGetLastError`.
    pub(crate) get_last_error: sys::ncclGetLastError_t,
    comm_init_rank_config: OnceLock<Result<sys::ncclCommInitRankConfig_t, MissingFunction>>,
    comm_init_rank_scalable: OnceLock<Result<sys::ncclCommInitRankScalable_t, MissingFunction>>,
    comm_finalize: OnceLock<Result<sys::ncclCommFinalize_t, MissingFunction>>,
    comm_split: OnceLock<Result<sys::ncclCommSplit_t, MissingFunction>>,
    comm_shrink: OnceLock<Result<sys::ncclCommShrink_t, MissingFunction>>,
    // Last field: dropped after nothing can call through the pointers above any more.
    lib: Library,
}

impl fmt::Debug for NcclLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclLibrary")
            .field("location", &self.location)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Resolves `name` in `lib` as a value of type `F`.
///
/// # Safety
/// `F` must be the exact C signature of `name` (a `sys::*_t` function pointer type).
unsafe fn symbol<F: Copy>(lib: &Library, name: &str) -> std::result::Result<F, String> {
    // SAFETY: the caller guarantees `F` is the symbol's real type; the value is copied out of
    // the `Symbol` and stays valid while `lib` is loaded, which its owner guarantees.
    unsafe { lib.get::<F>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| e.to_string())
}

impl NcclLibrary {
    /// Opens the library at `location` (a path, or a soname for the system's search path),
    /// reads its version and resolves every core function.
    ///
    /// # Errors
    /// A message (no error kind: the loader collects them) when the dynamic loader refuses the
    /// file, when `ncclGetVersion` is missing or fails, or when a core function is missing (the
    /// message names it and the version it needs).
    pub fn open(location: &str) -> std::result::Result<NcclLibrary, String> {
        // SAFETY: loading a shared library runs its initialisers; NCCL's only set up internal
        // state (no CUDA call happens before the first NCCL API call).
        let lib = unsafe { Library::new(location) }.map_err(|e| e.to_string())?;
        // SAFETY: the type is ncclGetVersion's C signature from nccl.h.
        let get_version: sys::ncclGetVersion_t = unsafe { symbol(&lib, "ncclGetVersion") }
            .map_err(|e| format!("not an NCCL library (no ncclGetVersion): {e}"))?;
        let mut code: c_int = 0;
        // SAFETY: `code` is a valid, writable int for the duration of the call.
        let rc = unsafe { get_version(&mut code) };
        if rc != sys::ncclSuccess {
            return Err(format!("ncclGetVersion failed with NCCL result {rc}"));
        }
        let version = Version::from_code(code)
            .ok_or_else(|| format!("ncclGetVersion returned an invalid code {code}"))?;
        let missing = |name: &str, e: String| {
            format!(
                "{name} is missing from this NCCL {version} ({e}); c10d-rs needs NCCL >= {MIN_NCCL_VERSION}"
            )
        };
        macro_rules! core {
            ($name:literal) => {
                // SAFETY: every field type is the C signature of the named function in nccl.h.
                unsafe { symbol(&lib, $name) }.map_err(|e| missing($name, e))?
            };
        }
        Ok(NcclLibrary {
            location: location.to_string(),
            version,
            get_version,
            get_unique_id: core!("ncclGetUniqueId"),
            comm_init_rank: core!("ncclCommInitRank"),
            comm_destroy: core!("ncclCommDestroy"),
            comm_abort: core!("ncclCommAbort"),
            comm_get_async_error: core!("ncclCommGetAsyncError"),
            comm_count: core!("ncclCommCount"),
            comm_cu_device: core!("ncclCommCuDevice"),
            comm_user_rank: core!("ncclCommUserRank"),
            group_start: core!("ncclGroupStart"),
            group_end: core!("ncclGroupEnd"),
            all_reduce: core!("ncclAllReduce"),
            broadcast: core!("ncclBroadcast"),
            reduce: core!("ncclReduce"),
            all_gather: core!("ncclAllGather"),
            reduce_scatter: core!("ncclReduceScatter"),
            send: core!("ncclSend"),
            recv: core!("ncclRecv"),
            red_op_create_pre_mul_sum: core!("ncclRedOpCreatePreMulSum"),
            red_op_destroy: core!("ncclRedOpDestroy"),
            get_error_string: core!("ncclGetErrorString"),
            get_last_error: core!("ncclGetLastError"),
            comm_init_rank_config: OnceLock::new(),
            comm_init_rank_scalable: OnceLock::new(),
            comm_finalize: OnceLock::new(),
            comm_split: OnceLock::new(),
            comm_shrink: OnceLock::new(),
            lib,
        })
    }

    /// What the library was opened from (a path or a soname).
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The loaded NCCL's version (from `ncclGetVersion`, read at open).
    pub fn version(&self) -> Version {
        self.version
    }

    /// True when the loaded NCCL is at least `v`.
    pub fn at_least(&self, v: Version) -> bool {
        self.version >= v
    }

    /// Looks up a function newer than the core set.
    ///
    /// # Safety
    /// `F` must be the exact C signature of `function.name`.
    ///
    /// # Errors
    /// [`MissingFunction`] when the loaded version is older than `function.since`, or when the
    /// symbol is absent.
    pub unsafe fn lookup_optional<F: Copy>(
        &self,
        function: OptionalFunction,
    ) -> std::result::Result<F, MissingFunction> {
        let err = |lookup_error| MissingFunction {
            function,
            loaded: self.version,
            library: self.location.clone(),
            lookup_error,
        };
        if self.version < function.since {
            return Err(err(None));
        }
        // SAFETY: the caller guarantees `F` matches the symbol's C signature.
        unsafe { symbol::<F>(&self.lib, function.name) }.map_err(|e| err(Some(e)))
    }

    fn cached<F: Copy>(
        &self,
        cell: &OnceLock<std::result::Result<F, MissingFunction>>,
        function: OptionalFunction,
    ) -> Result<F> {
        // SAFETY: every call site pairs a cell of the function's `sys::*_t` type with the
        // matching `OptionalFunction` constant.
        let r = cell.get_or_init(|| unsafe { self.lookup_optional::<F>(function) });
        r.clone().map_err(DistError::from)
    }

    /// `ncclCommInitRankConfig` (NCCL ≥ 2.14).
    ///
    /// # Errors
    /// [`DistError::Unsupported`] naming the function, the version it needs and the loaded one.
    pub fn comm_init_rank_config(&self) -> Result<sys::ncclCommInitRankConfig_t> {
        self.cached(&self.comm_init_rank_config, COMM_INIT_RANK_CONFIG)
    }

    /// `ncclCommInitRankScalable` (NCCL ≥ 2.23).
    ///
    /// # Errors
    /// As [`NcclLibrary::comm_init_rank_config`].
    pub fn comm_init_rank_scalable(&self) -> Result<sys::ncclCommInitRankScalable_t> {
        self.cached(&self.comm_init_rank_scalable, COMM_INIT_RANK_SCALABLE)
    }

    /// `ncclCommFinalize` (NCCL ≥ 2.14).
    ///
    /// # Errors
    /// As [`NcclLibrary::comm_init_rank_config`].
    pub fn comm_finalize(&self) -> Result<sys::ncclCommFinalize_t> {
        self.cached(&self.comm_finalize, COMM_FINALIZE)
    }

    /// `ncclCommSplit` (NCCL ≥ 2.18).
    ///
    /// # Errors
    /// As [`NcclLibrary::comm_init_rank_config`].
    pub fn comm_split(&self) -> Result<sys::ncclCommSplit_t> {
        self.cached(&self.comm_split, COMM_SPLIT)
    }

    /// `ncclCommShrink` (NCCL ≥ 2.27).
    ///
    /// # Errors
    /// As [`NcclLibrary::comm_init_rank_config`].
    pub fn comm_shrink(&self) -> Result<sys::ncclCommShrink_t> {
        self.cached(&self.comm_shrink, COMM_SHRINK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_function_messages_name_function_and_versions() {
        let m = MissingFunction {
            function: COMM_SPLIT,
            loaded: Version::new(2, 17, 1),
            library: "/opt/nccl/libnccl.so.2".into(),
            lookup_error: None,
        };
        assert_eq!(
            m.to_string(),
            "ncclCommSplit needs NCCL >= 2.18.0, but the loaded NCCL is 2.17.1 (/opt/nccl/libnccl.so.2)"
        );
        let e: DistError = m.into();
        assert_eq!(e.kind(), c10d_core::ErrorKind::Unsupported);
        let m = MissingFunction {
            function: COMM_SHRINK,
            loaded: Version::new(2, 28, 3),
            library: "libnccl.so.2".into(),
            lookup_error: Some("undefined symbol: ncclCommShrink".into()),
        };
        let s = m.to_string();
        assert!(
            s.contains("ncclCommShrink (NCCL >= 2.27.0) was not found in the loaded NCCL 2.28.3"),
            "{s}"
        );
        assert!(s.contains("undefined symbol"), "{s}");
    }

    #[test]
    fn opening_a_non_library_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("libnccl.so.2");
        std::fs::write(&p, b"this is not an ELF file").unwrap();
        let e = NcclLibrary::open(p.to_str().unwrap()).unwrap_err();
        assert!(!e.is_empty());
        let e = NcclLibrary::open("/nonexistent/dir/libnccl.so.2").unwrap_err();
        assert!(!e.is_empty());
    }

    #[test]
    fn a_library_without_nccl_symbols_is_rejected_by_name() {
        // libc is loadable everywhere this crate runs and is certainly not NCCL.
        let e = NcclLibrary::open("libc.so.6").unwrap_err();
        assert!(e.contains("not an NCCL library (no ncclGetVersion)"), "{e}");
    }
}

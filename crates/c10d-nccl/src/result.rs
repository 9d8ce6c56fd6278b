//! Checked NCCL calls: the only code that calls through the function table of
//! [`NcclLibrary`] (cudarc's `result` layer). Each NCCL function has one wrapper here whose
//! `ncclResult_t` becomes a typed [`NcclError`] carrying NCCL's own description and last error
//! message, and converts into a [`DistError::Backend`] as PyTorch's `C10D_NCCL_CHECK` raises
//! `DistBackendError`. Calls that a non-blocking communicator may finish later return
//! [`Progress`] instead of treating `ncclInProgress` as an error.

use crate::library::NcclLibrary;
use crate::sys;
use crate::version::Version;
use c10d_core::DistError;
use std::ffi::{c_char, c_int, c_void, CStr};
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

/// How a call that a non-blocking communicator may finish later ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// `ncclSuccess`: done.
    Done,
    /// `ncclInProgress`: poll `ncclCommGetAsyncError` until it is done.
    InProgress,
}

/// As [`check`], with `ncclInProgress` a success that is still running.
pub fn check_progress(
    lib: &NcclLibrary,
    call: &'static str,
    code: sys::ncclResult_t,
) -> Result<Progress, NcclError> {
    if code == sys::ncclInProgress {
        return Ok(Progress::InProgress);
    }
    check(lib, call, code).map(|()| Progress::Done)
}

thread_local! {
    /// How many NCCL groups the calling thread has open (NCCL's own counter is not exposed).
    static OPEN_GROUPS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many NCCL groups the calling thread has open ([`group_start`] minus [`group_end`]).
pub fn open_groups() -> usize {
    OPEN_GROUPS.with(|c| c.get())
}

/// Runs `f` with every NCCL group of this thread closed, then reopens as many (PyTorch's
/// "Group Start/End Note"): a communicator made inside an open group would only be created at
/// the group's end, after the operations that need it. Closing launches what the groups
/// queued so far; a failure to close or reopen is returned (after `f` ran, for the reopen).
///
/// # Errors
/// NCCL's error; `f`'s.
pub fn with_groups_closed<T>(
    lib: &NcclLibrary,
    f: impl FnOnce() -> c10d_core::Result<T>,
) -> c10d_core::Result<T> {
    let n = open_groups();
    for _ in 0..n {
        group_end(lib)?;
    }
    let r = f();
    for _ in 0..n {
        group_start(lib)?;
    }
    r
}

/// `ncclGroupStart`: opens (or nests) the calling thread's NCCL group.
///
/// # Errors
/// NCCL's error.
pub fn group_start(lib: &NcclLibrary) -> Result<(), NcclError> {
    // SAFETY: ncclGroupStart only touches NCCL's thread-local group state.
    check(lib, "ncclGroupStart", unsafe { (lib.group_start)() })?;
    OPEN_GROUPS.with(|c| c.set(c.get() + 1));
    Ok(())
}

/// `ncclGroupEnd`: closes the calling thread's NCCL group; the outermost close launches the
/// group's operations (and finishes a communicator made inside it).
///
/// # Errors
/// NCCL's error (the group's operations are then discarded).
pub fn group_end(lib: &NcclLibrary) -> Result<Progress, NcclError> {
    // NCCL closes the group even when it reports an error.
    OPEN_GROUPS.with(|c| c.set(c.get().saturating_sub(1)));
    // SAFETY: ncclGroupEnd only touches NCCL's thread-local group state and the communicators
    // of the calls queued in it, which their callers keep alive and locked.
    check_progress(lib, "ncclGroupEnd", unsafe { (lib.group_end)() })
}

/// The arguments every data-moving NCCL call shares.
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    /// The communicator (live and locked by the caller).
    pub comm: sys::ncclComm_t,
    /// The stream of the communicator's device the kernels are queued on.
    pub stream: sys::cudaStream_t,
    /// NCCL's element type.
    pub dtype: sys::ncclDataType_t,
    /// Elements per rank, as NCCL counts them.
    pub count: usize,
}

/// `ncclAllReduce(send, recv, count, dtype, op, comm, stream)`.
///
/// # Safety
/// `send` and `recv` hold `count` elements of `dtype` on the communicator's device and stay
/// alive until the queued kernel has run; `l.comm` is live and not used concurrently.
///
/// # Errors
/// NCCL's error.
pub unsafe fn all_reduce(
    lib: &NcclLibrary,
    send: *const c_void,
    recv: *mut c_void,
    op: sys::ncclRedOp_t,
    l: Launch,
) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    let rc = unsafe { (lib.all_reduce)(send, recv, l.count, l.dtype, op, l.comm, l.stream) };
    check(lib, "ncclAllReduce", rc)
}

/// `ncclBroadcast(send, recv, count, dtype, root, comm, stream)`.
///
/// # Safety
/// As [`all_reduce`].
///
/// # Errors
/// NCCL's error.
pub unsafe fn broadcast(
    lib: &NcclLibrary,
    send: *const c_void,
    recv: *mut c_void,
    root: usize,
    l: Launch,
) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    let rc = unsafe {
        (lib.broadcast)(
            send,
            recv,
            l.count,
            l.dtype,
            root as c_int,
            l.comm,
            l.stream,
        )
    };
    check(lib, "ncclBroadcast", rc)
}

/// `ncclReduce(send, recv, count, dtype, op, root, comm, stream)`.
///
/// # Safety
/// As [`all_reduce`].
///
/// # Errors
/// NCCL's error.
pub unsafe fn reduce(
    lib: &NcclLibrary,
    send: *const c_void,
    recv: *mut c_void,
    op: sys::ncclRedOp_t,
    root: usize,
    l: Launch,
) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    let rc = unsafe {
        (lib.reduce)(
            send,
            recv,
            l.count,
            l.dtype,
            op,
            root as c_int,
            l.comm,
            l.stream,
        )
    };
    check(lib, "ncclReduce", rc)
}

/// `ncclAllGather(send, recv, sendcount, dtype, comm, stream)`: `l.count` is the per-rank
/// (send) count; `recv` holds `size` times as many.
///
/// # Safety
/// As [`all_reduce`], with `recv` of `size × count` elements.
///
/// # Errors
/// NCCL's error.
pub unsafe fn all_gather(
    lib: &NcclLibrary,
    send: *const c_void,
    recv: *mut c_void,
    l: Launch,
) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    let rc = unsafe { (lib.all_gather)(send, recv, l.count, l.dtype, l.comm, l.stream) };
    check(lib, "ncclAllGather", rc)
}

/// `ncclReduceScatter(send, recv, recvcount, dtype, op, comm, stream)`: `l.count` is the
/// per-rank (receive) count; `send` holds `size` times as many.
///
/// # Safety
/// As [`all_reduce`], with `send` of `size × count` elements.
///
/// # Errors
/// NCCL's error.
pub unsafe fn reduce_scatter(
    lib: &NcclLibrary,
    send: *const c_void,
    recv: *mut c_void,
    op: sys::ncclRedOp_t,
    l: Launch,
) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    let rc = unsafe { (lib.reduce_scatter)(send, recv, l.count, l.dtype, op, l.comm, l.stream) };
    check(lib, "ncclReduceScatter", rc)
}

/// `ncclSend(buf, count, dtype, peer, comm, stream)`.
///
/// # Safety
/// As [`all_reduce`] for `buf`; `peer` is a rank of the communicator.
///
/// # Errors
/// NCCL's error.
pub unsafe fn send(
    lib: &NcclLibrary,
    buf: *const c_void,
    peer: usize,
    l: Launch,
) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    let rc = unsafe { (lib.send)(buf, l.count, l.dtype, peer as c_int, l.comm, l.stream) };
    check(lib, "ncclSend", rc)
}

/// `ncclRecv(buf, count, dtype, peer, comm, stream)`.
///
/// # Safety
/// As [`send`], `buf` written.
///
/// # Errors
/// NCCL's error.
pub unsafe fn recv(
    lib: &NcclLibrary,
    buf: *mut c_void,
    peer: usize,
    l: Launch,
) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    let rc = unsafe { (lib.recv)(buf, l.count, l.dtype, peer as c_int, l.comm, l.stream) };
    check(lib, "ncclRecv", rc)
}

/// `ncclRedOpCreatePreMulSum` with a host-immediate scalar: a reduction that multiplies by
/// the scalar (one element of `dtype` at `scalar`, read before the call returns) and sums.
///
/// # Safety
/// `comm` is live and not used concurrently; `scalar` points to one readable element of `dtype`.
///
/// # Errors
/// NCCL's error.
pub unsafe fn red_op_create_pre_mul_sum(
    lib: &NcclLibrary,
    scalar: *mut c_void,
    dtype: sys::ncclDataType_t,
    comm: sys::ncclComm_t,
) -> Result<sys::ncclRedOp_t, NcclError> {
    let mut op: sys::ncclRedOp_t = 0;
    // SAFETY: per the caller's contract; `op` is writable.
    let rc = unsafe {
        (lib.red_op_create_pre_mul_sum)(&mut op, scalar, dtype, sys::ncclScalarHostImmediate, comm)
    };
    check(lib, "ncclRedOpCreatePreMulSum", rc).map(|()| op)
}

/// `ncclRedOpDestroy(op, comm)`.
///
/// # Safety
/// `op` was created on `comm`, which is live and not used concurrently.
///
/// # Errors
/// NCCL's error.
pub unsafe fn red_op_destroy(
    lib: &NcclLibrary,
    op: sys::ncclRedOp_t,
    comm: sys::ncclComm_t,
) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    check(lib, "ncclRedOpDestroy", unsafe {
        (lib.red_op_destroy)(op, comm)
    })
}

/// `ncclCommInitRankConfig` (NCCL ≥ 2.14), else `ncclCommInitRank` (always blocking):
/// the new handle (null when NCCL made none) and whether it is still initialising.
///
/// # Safety
/// `config` is valid for the call; the device's context is current on this thread.
///
/// # Errors
/// NCCL's error; the handle NCCL may have made is returned in neither case.
pub unsafe fn comm_init_rank(
    lib: &NcclLibrary,
    size: usize,
    id: sys::ncclUniqueId,
    rank: usize,
    config: *mut sys::ncclConfig_t,
) -> (sys::ncclComm_t, Result<Progress, NcclError>) {
    let mut comm: sys::ncclComm_t = std::ptr::null_mut();
    let (n, r) = (size as c_int, rank as c_int);
    let rc = match lib.comm_init_rank_config() {
        // SAFETY: `comm` is writable; `config` valid per the caller; `id` by value.
        Ok(f) => unsafe { f(&mut comm, n, id, r, config) },
        // SAFETY: as above, without a config.
        Err(_) => unsafe { (lib.comm_init_rank)(&mut comm, n, id, r) },
    };
    (comm, check_progress(lib, "ncclCommInitRankConfig", rc))
}

/// `ncclCommInitRankScalable` (NCCL ≥ 2.23) from several roots' `ids`: the new handle (null
/// when NCCL made none) and whether it is still initialising.
///
/// # Safety
/// `config` is valid for the call; the device's context is current on this thread.
///
/// # Errors
/// Outer: [`c10d_core::DistError::Unsupported`] when the loaded NCCL lacks the function
/// (nothing was called). Inner: NCCL's error.
#[allow(clippy::type_complexity)]
pub unsafe fn comm_init_rank_scalable(
    lib: &NcclLibrary,
    size: usize,
    ids: &mut [sys::ncclUniqueId],
    rank: usize,
    config: *mut sys::ncclConfig_t,
) -> c10d_core::Result<(sys::ncclComm_t, Result<Progress, NcclError>)> {
    let f = lib.comm_init_rank_scalable()?;
    let mut comm: sys::ncclComm_t = std::ptr::null_mut();
    let (n, r, k) = (size as c_int, rank as c_int, ids.len() as c_int);
    // SAFETY: `comm` is writable, `ids` holds `k` ids for the call, `config` is valid per the
    // caller.
    let rc = unsafe { f(&mut comm, n, r, k, ids.as_mut_ptr(), config) };
    Ok((comm, check_progress(lib, "ncclCommInitRankScalable", rc)))
}

/// `ncclCommSplit(comm, color, key, &child, config)` (NCCL ≥ 2.18).
///
/// # Safety
/// `comm` is live and not used concurrently; `config` is valid for the call.
///
/// # Errors
/// The missing function; NCCL's error.
pub unsafe fn comm_split(
    lib: &NcclLibrary,
    comm: sys::ncclComm_t,
    color: c_int,
    key: c_int,
    config: *mut sys::ncclConfig_t,
) -> c10d_core::Result<(sys::ncclComm_t, Result<Progress, NcclError>)> {
    let f = lib.comm_split()?;
    let mut child: sys::ncclComm_t = std::ptr::null_mut();
    // SAFETY: per the caller's contract; `child` is writable.
    let rc = unsafe { f(comm, color, key, &mut child, config) };
    Ok((child, check_progress(lib, "ncclCommSplit", rc)))
}

/// `ncclCommShrink(comm, exclude, n, &child, config, flags)` (NCCL ≥ 2.27).
///
/// # Safety
/// As [`comm_split`].
///
/// # Errors
/// The missing function; NCCL's error.
pub unsafe fn comm_shrink(
    lib: &NcclLibrary,
    comm: sys::ncclComm_t,
    exclude: &mut [c_int],
    config: *mut sys::ncclConfig_t,
    flags: c_int,
) -> c10d_core::Result<(sys::ncclComm_t, Result<Progress, NcclError>)> {
    let f = lib.comm_shrink()?;
    let mut child: sys::ncclComm_t = std::ptr::null_mut();
    let n = exclude.len() as c_int;
    // SAFETY: per the caller's contract; the exclusion list and `child` outlive the call.
    let rc = unsafe { f(comm, exclude.as_mut_ptr(), n, &mut child, config, flags) };
    Ok((child, check_progress(lib, "ncclCommShrink", rc)))
}

/// `ncclCommFinalize(comm)` (NCCL ≥ 2.14): flushes the communicator's operations and its
/// peers' so that [`comm_destroy`] can free it; non-blocking communicators finish later.
///
/// # Safety
/// `comm` is live and not used concurrently.
///
/// # Errors
/// The missing function; NCCL's error.
pub unsafe fn comm_finalize(
    lib: &NcclLibrary,
    comm: sys::ncclComm_t,
) -> c10d_core::Result<Result<Progress, NcclError>> {
    let f = lib.comm_finalize()?;
    // SAFETY: per the caller's contract.
    Ok(check_progress(lib, "ncclCommFinalize", unsafe { f(comm) }))
}

/// `ncclCommDestroy(comm)`: frees a finalized communicator.
///
/// # Safety
/// `comm` is live, finalized, not used concurrently, and never used again.
///
/// # Errors
/// NCCL's error.
pub unsafe fn comm_destroy(lib: &NcclLibrary, comm: sys::ncclComm_t) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    check(lib, "ncclCommDestroy", unsafe { (lib.comm_destroy)(comm) })
}

/// `ncclCommAbort(comm)`: stops the communicator's kernels and frees it without waiting for
/// peers.
///
/// # Safety
/// `comm` is live, not used concurrently, and never used again.
///
/// # Errors
/// NCCL's error.
pub unsafe fn comm_abort(lib: &NcclLibrary, comm: sys::ncclComm_t) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    check(lib, "ncclCommAbort", unsafe { (lib.comm_abort)(comm) })
}

/// `ncclCommGetAsyncError(comm)`: the communicator's state (`ncclSuccess`, `ncclInProgress`
/// or the error of an earlier call).
///
/// # Safety
/// `comm` is live and not used concurrently.
///
/// # Errors
/// The query's own failure.
pub unsafe fn comm_get_async_error(
    lib: &NcclLibrary,
    comm: sys::ncclComm_t,
) -> Result<sys::ncclResult_t, NcclError> {
    let mut state = sys::ncclSuccess;
    // SAFETY: per the caller's contract; `state` is writable.
    let rc = unsafe { (lib.comm_get_async_error)(comm, &mut state) };
    check(lib, "ncclCommGetAsyncError", rc).map(|()| state)
}

/// `ncclCommUserRank` and `ncclCommCount`: this rank and the number of ranks.
///
/// # Safety
/// `comm` is live and not used concurrently.
///
/// # Errors
/// NCCL's error.
pub unsafe fn comm_rank_and_size(
    lib: &NcclLibrary,
    comm: sys::ncclComm_t,
) -> Result<(usize, usize), NcclError> {
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: per the caller's contract; writable ints.
    check(lib, "ncclCommUserRank", unsafe {
        (lib.comm_user_rank)(comm, &mut rank)
    })?;
    // SAFETY: as above.
    check(lib, "ncclCommCount", unsafe {
        (lib.comm_count)(comm, &mut size)
    })?;
    Ok((rank as usize, size as usize))
}

/// `ncclCommCuDevice`: the CUDA device ordinal the communicator runs on.
///
/// # Safety
/// `comm` is live and not used concurrently.
///
/// # Errors
/// NCCL's error.
pub unsafe fn comm_cu_device(lib: &NcclLibrary, comm: sys::ncclComm_t) -> Result<i32, NcclError> {
    let mut device: c_int = 0;
    // SAFETY: per the caller's contract; a writable int.
    check(lib, "ncclCommCuDevice", unsafe {
        (lib.comm_cu_device)(comm, &mut device)
    })?;
    Ok(device)
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

//! The raw NCCL C ABI: the types of `nccl.h` and the signatures of the functions this crate
//! calls, as they are laid out in memory. Nothing here is safe to use on its own; the checked
//! layer is [`crate::result`] and the function table is [`crate::library::NcclLibrary`].
//!
//! Facts taken from NCCL's public header (`nccl.h`, checked against 2.14 … 2.30):
//! - `ncclResult_t`, `ncclDataType_t`, `ncclRedOp_t` and `ncclScalarResidence_t` are C enums,
//!   passed as `int` (4 bytes). `ncclRedOp_t` also carries handles made by
//!   `ncclRedOpCreatePreMulSum`, so it is an integer here, not a Rust enum.
//! - `ncclUniqueId` is 128 opaque bytes; `ncclComm_t` is a pointer to an opaque struct.
//! - `ncclConfig_t` is a versioned, append-only struct: NCCL reads the first `size` bytes, checks
//!   `magic` and resets fields newer than `version` to their defaults. [`ncclConfig_t`] is the
//!   2.27 layout (through `nvlsCTAs`); an older NCCL reads only the prefix it knows, a newer one
//!   keeps its defaults for the fields after ours.
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_void};

/// `ncclResult_t`: the status every NCCL call returns.
pub type ncclResult_t = c_int;
/// `ncclSuccess`.
pub const ncclSuccess: ncclResult_t = 0;
/// `ncclUnhandledCudaError`: a CUDA call inside NCCL failed.
pub const ncclUnhandledCudaError: ncclResult_t = 1;
/// `ncclSystemError`: a system call (socket, memory …) failed.
pub const ncclSystemError: ncclResult_t = 2;
/// `ncclInternalError`: an NCCL bug or an inconsistent state.
pub const ncclInternalError: ncclResult_t = 3;
/// `ncclInvalidArgument`: a bad argument to an NCCL call.
pub const ncclInvalidArgument: ncclResult_t = 4;
/// `ncclInvalidUsage`: a bad use of the API (e.g. mismatched collectives).
pub const ncclInvalidUsage: ncclResult_t = 5;
/// `ncclRemoteError` (NCCL ≥ 2.13): a peer failed or disconnected.
pub const ncclRemoteError: ncclResult_t = 6;
/// `ncclInProgress` (NCCL ≥ 2.14): a non-blocking call has not finished yet.
pub const ncclInProgress: ncclResult_t = 7;
/// `ncclTimeout` (NCCL ≥ 2.30).
pub const ncclTimeout: ncclResult_t = 8;

/// `ncclDataType_t`: the element type of a buffer.
pub type ncclDataType_t = c_int;
/// `ncclInt8` (`ncclChar`).
pub const ncclInt8: ncclDataType_t = 0;
/// `ncclUint8`.
pub const ncclUint8: ncclDataType_t = 1;
/// `ncclInt32` (`ncclInt`).
pub const ncclInt32: ncclDataType_t = 2;
/// `ncclUint32`.
pub const ncclUint32: ncclDataType_t = 3;
/// `ncclInt64`.
pub const ncclInt64: ncclDataType_t = 4;
/// `ncclUint64`.
pub const ncclUint64: ncclDataType_t = 5;
/// `ncclFloat16` (`ncclHalf`).
pub const ncclFloat16: ncclDataType_t = 6;
/// `ncclFloat32` (`ncclFloat`).
pub const ncclFloat32: ncclDataType_t = 7;
/// `ncclFloat64` (`ncclDouble`).
pub const ncclFloat64: ncclDataType_t = 8;
/// `ncclBfloat16` (NCCL ≥ 2.10).
pub const ncclBfloat16: ncclDataType_t = 9;
/// `ncclFloat8e4m3` (NCCL ≥ 2.24).
pub const ncclFloat8e4m3: ncclDataType_t = 10;
/// `ncclFloat8e5m2` (NCCL ≥ 2.24).
pub const ncclFloat8e5m2: ncclDataType_t = 11;

/// `ncclRedOp_t`: a built-in reduction, or a handle made by `ncclRedOpCreatePreMulSum`.
pub type ncclRedOp_t = c_int;
/// `ncclSum`.
pub const ncclSum: ncclRedOp_t = 0;
/// `ncclProd`.
pub const ncclProd: ncclRedOp_t = 1;
/// `ncclMax`.
pub const ncclMax: ncclRedOp_t = 2;
/// `ncclMin`.
pub const ncclMin: ncclRedOp_t = 3;
/// `ncclAvg` (NCCL ≥ 2.10).
pub const ncclAvg: ncclRedOp_t = 4;
/// `ncclNumOps`: the number of built-in ops; user-created ops are ≥ this.
pub const ncclNumOps: ncclRedOp_t = 5;

/// `ncclScalarResidence_t`: where the scalar of `ncclRedOpCreatePreMulSum` lives.
pub type ncclScalarResidence_t = c_int;
/// `ncclScalarDevice`: device memory, read while the collective runs.
pub const ncclScalarDevice: ncclScalarResidence_t = 0;
/// `ncclScalarHostImmediate`: host memory, read before the create call returns.
pub const ncclScalarHostImmediate: ncclScalarResidence_t = 1;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: the opaque bootstrap handle rank 0 makes and every rank passes to
/// `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ncclUniqueId {
    /// The opaque bytes.
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl Default for ncclUniqueId {
    fn default() -> Self {
        ncclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        }
    }
}

impl std::fmt::Debug for ncclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ncclUniqueId(..{} bytes)", NCCL_UNIQUE_ID_BYTES)
    }
}

/// The opaque communicator struct behind [`ncclComm_t`].
#[repr(C)]
pub struct ncclComm {
    _private: [u8; 0],
}
/// `ncclComm_t`: an NCCL communicator handle.
pub type ncclComm_t = *mut ncclComm;

/// `cudaStream_t` as NCCL takes it (a `CUstream` of the driver API is the same pointer).
pub type cudaStream_t = *mut c_void;

/// `NCCL_CONFIG_UNDEF_INT`: "not set, use NCCL's default".
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_SPLIT_NOCOLOR`: the colour of a rank that takes part in `ncclCommSplit` but joins no
/// new communicator.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_API_MAGIC`, the `magic` field of an initialised `ncclConfig_t`.
pub const NCCL_API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_SHRINK_DEFAULT`: shrink flag, shrink a healthy communicator.
pub const NCCL_SHRINK_DEFAULT: c_int = 0;
/// `NCCL_SHRINK_ABORT`: shrink flag, abort outstanding operations of the parent first.
pub const NCCL_SHRINK_ABORT: c_int = 1;
/// The `version` this crate writes into [`ncclConfig_t`]: the layout is NCCL 2.27.0's
/// (`ncclConfig_v22700`), encoded as `NCCL_VERSION(2, 27, 0)`.
pub const NCCL_CONFIG_LAYOUT_VERSION: u32 = 22700;

/// `ncclConfig_t` as of NCCL 2.27 (`ncclConfig_v22700`): field order and types exactly as the
/// header has them. Build it with [`ncclConfig_t::initializer`] (`NCCL_CONFIG_INITIALIZER`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclConfig_t {
    /// `sizeof(ncclConfig_t)`: how many bytes NCCL may read.
    pub size: usize,
    /// [`NCCL_API_MAGIC`].
    pub magic: u32,
    /// The NCCL version code of this layout ([`NCCL_CONFIG_LAYOUT_VERSION`]).
    pub version: u32,
    /// 1 = blocking init/calls, 0 = non-blocking (`ncclInProgress`) (NCCL ≥ 2.14).
    pub blocking: c_int,
    /// CUDA thread-block cluster size (NCCL ≥ 2.17).
    pub cgaClusterSize: c_int,
    /// Minimum number of CTAs (channels) (NCCL ≥ 2.17).
    pub minCTAs: c_int,
    /// Maximum number of CTAs (channels) (NCCL ≥ 2.17).
    pub maxCTAs: c_int,
    /// Network plugin name, NUL-terminated, or null (NCCL ≥ 2.17).
    pub netName: *const c_char,
    /// 1 = a split child shares the parent's resources (NCCL ≥ 2.18).
    pub splitShare: c_int,
    /// Network traffic class (NCCL ≥ 2.25).
    pub trafficClass: c_int,
    /// Communicator name for logs and profilers, NUL-terminated, or null (NCCL ≥ 2.27).
    pub commName: *const c_char,
    /// Enable CollNet (NCCL ≥ 2.27).
    pub collnetEnable: c_int,
    /// `NCCL_CTA_POLICY_*` (NCCL ≥ 2.27).
    pub CTAPolicy: c_int,
    /// 1 = a shrunk child shares the parent's resources (NCCL ≥ 2.27).
    pub shrinkShare: c_int,
    /// Number of NVLS CTAs (NCCL ≥ 2.27).
    pub nvlsCTAs: c_int,
}

impl ncclConfig_t {
    /// `NCCL_CONFIG_INITIALIZER` for this layout: size, magic and version set, every attribute
    /// [`NCCL_CONFIG_UNDEF_INT`] or null.
    pub const fn initializer() -> ncclConfig_t {
        ncclConfig_t {
            size: std::mem::size_of::<ncclConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_CONFIG_LAYOUT_VERSION,
            blocking: NCCL_CONFIG_UNDEF_INT,
            cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
            minCTAs: NCCL_CONFIG_UNDEF_INT,
            maxCTAs: NCCL_CONFIG_UNDEF_INT,
            netName: std::ptr::null(),
            splitShare: NCCL_CONFIG_UNDEF_INT,
            trafficClass: NCCL_CONFIG_UNDEF_INT,
            commName: std::ptr::null(),
            collnetEnable: NCCL_CONFIG_UNDEF_INT,
            CTAPolicy: NCCL_CONFIG_UNDEF_INT,
            shrinkShare: NCCL_CONFIG_UNDEF_INT,
            nvlsCTAs: NCCL_CONFIG_UNDEF_INT,
        }
    }
}

/// `ncclGetVersion(int*)`.
pub type ncclGetVersion_t = unsafe extern "C" fn(version: *mut c_int) -> ncclResult_t;
/// `ncclGetUniqueId(ncclUniqueId*)`.
pub type ncclGetUniqueId_t = unsafe extern "C" fn(unique_id: *mut ncclUniqueId) -> ncclResult_t;
/// `ncclCommInitRank(comm*, nranks, id, rank)` (the id is passed by value).
pub type ncclCommInitRank_t = unsafe extern "C" fn(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t;
/// `ncclCommInitRankConfig(comm*, nranks, id, rank, config*)` (NCCL ≥ 2.14).
pub type ncclCommInitRankConfig_t = unsafe extern "C" fn(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t;
/// `ncclCommInitRankScalable(comm*, nranks, rank, nIds, ids*, config*)` (NCCL ≥ 2.23): one
/// communicator from several roots' unique ids.
pub type ncclCommInitRankScalable_t = unsafe extern "C" fn(
    comm: *mut ncclComm_t,
    nranks: c_int,
    rank: c_int,
    n_ids: c_int,
    comm_ids: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t;
/// `ncclCommSplit(comm, color, key, newcomm*, config*)` (NCCL ≥ 2.18).
pub type ncclCommSplit_t = unsafe extern "C" fn(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t;
/// `ncclCommShrink(comm, excludeRanks*, count, newcomm*, config*, flags)` (NCCL ≥ 2.27).
pub type ncclCommShrink_t = unsafe extern "C" fn(
    comm: ncclComm_t,
    exclude_ranks: *mut c_int,
    exclude_count: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrink_flags: c_int,
) -> ncclResult_t;
/// `ncclCommFinalize(comm)` (NCCL ≥ 2.14).
pub type ncclCommFinalize_t = unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t;
/// `ncclCommDestroy(comm)` / `ncclCommAbort(comm)`.
pub type ncclCommDestroy_t = unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t;
/// `ncclCommGetAsyncError(comm, ncclResult_t*)`.
pub type ncclCommGetAsyncError_t =
    unsafe extern "C" fn(comm: ncclComm_t, async_error: *mut ncclResult_t) -> ncclResult_t;
/// `ncclCommCount` / `ncclCommCuDevice` / `ncclCommUserRank`: `(comm, int*)`.
pub type ncclCommQueryInt_t =
    unsafe extern "C" fn(comm: ncclComm_t, out: *mut c_int) -> ncclResult_t;
/// `ncclGroupStart()` / `ncclGroupEnd()`.
pub type ncclGroup_t = unsafe extern "C" fn() -> ncclResult_t;
/// `ncclAllReduce(send, recv, count, dtype, op, comm, stream)`.
pub type ncclAllReduce_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclBroadcast(send, recv, count, dtype, root, comm, stream)`.
pub type ncclBroadcast_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclReduce(send, recv, count, dtype, op, root, comm, stream)`.
pub type ncclReduce_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclAllGather(send, recv, sendcount, dtype, comm, stream)`.
pub type ncclAllGather_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclReduceScatter(send, recv, recvcount, dtype, op, comm, stream)`.
pub type ncclReduceScatter_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclSend(send, count, dtype, peer, comm, stream)`.
pub type ncclSend_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclRecv(recv, count, dtype, peer, comm, stream)`.
pub type ncclRecv_t = unsafe extern "C" fn(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclRedOpCreatePreMulSum(op*, scalar*, dtype, residence, comm)` (NCCL ≥ 2.11).
pub type ncclRedOpCreatePreMulSum_t = unsafe extern "C" fn(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t;
/// `ncclRedOpDestroy(op, comm)` (NCCL ≥ 2.11).
pub type ncclRedOpDestroy_t =
    unsafe extern "C" fn(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t;
/// `ncclGetErrorString(result)`: a static string.
pub type ncclGetErrorString_t = unsafe extern "C" fn(result: ncclResult_t) -> *const c_char;
/// `ncclGetLastError(comm)` (NCCL ≥ 2.13): the last error message, comm may be null.
pub type ncclGetLastError_t = unsafe extern "C" fn(comm: ncclComm_t) -> *const c_char;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn abi_sizes_match_nccl_h() {
        assert_eq!(size_of::<ncclUniqueId>(), 128);
        assert_eq!(size_of::<ncclResult_t>(), 4);
        assert_eq!(size_of::<ncclDataType_t>(), 4);
        assert_eq!(size_of::<ncclRedOp_t>(), 4);
        assert_eq!(size_of::<ncclComm_t>(), size_of::<usize>());
    }

    #[cfg(target_pointer_width = "64")]
    #[test]
    fn config_layout_is_nccl_2_27() {
        // Offsets as a C compiler lays out ncclConfig_v22700 on an LP64 target.
        assert_eq!(offset_of!(ncclConfig_t, size), 0);
        assert_eq!(offset_of!(ncclConfig_t, magic), 8);
        assert_eq!(offset_of!(ncclConfig_t, version), 12);
        assert_eq!(offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(offset_of!(ncclConfig_t, cgaClusterSize), 20);
        assert_eq!(offset_of!(ncclConfig_t, minCTAs), 24);
        assert_eq!(offset_of!(ncclConfig_t, maxCTAs), 28);
        assert_eq!(offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(offset_of!(ncclConfig_t, splitShare), 40);
        assert_eq!(offset_of!(ncclConfig_t, trafficClass), 44);
        assert_eq!(offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(offset_of!(ncclConfig_t, collnetEnable), 56);
        assert_eq!(offset_of!(ncclConfig_t, CTAPolicy), 60);
        assert_eq!(offset_of!(ncclConfig_t, shrinkShare), 64);
        assert_eq!(offset_of!(ncclConfig_t, nvlsCTAs), 68);
        assert_eq!(size_of::<ncclConfig_t>(), 72);
        assert_eq!(align_of::<ncclConfig_t>(), 8);
    }

    #[test]
    fn initializer_matches_the_macro() {
        let c = ncclConfig_t::initializer();
        assert_eq!(c.size, size_of::<ncclConfig_t>());
        assert_eq!(c.magic, 0xcafebeef);
        assert_eq!(c.version, 22700);
        assert_eq!(c.blocking, i32::MIN);
        assert_eq!(c.minCTAs, i32::MIN);
        assert_eq!(c.maxCTAs, i32::MIN);
        assert!(c.netName.is_null() && c.commName.is_null());
        assert_eq!(c.splitShare, i32::MIN);
    }
}

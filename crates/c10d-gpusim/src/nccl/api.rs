//! Exported: the NCCL API c10d-nccl calls (`nccl.h`, NCCL 2.27), over [`crate::nccl::comm`],
//! [`crate::nccl::group`] and the hub.
//!
//! Departures from NCCL, on purpose: arguments are checked as NCCL's `ArgsCheck` does (device
//! pointers, ranks, types, reductions) and a mismatch between ranks (another collective, count,
//! type or root) fails every rank with `ncclInvalidUsage` instead of hanging or corrupting;
//! enqueueing never returns `ncclInProgress`; `ncclCommShrink`'s abort flag is accepted and
//! does nothing more than the default (in-flight ops of the parent end when it is aborted).
//! Each exported function is the driver or NCCL function of the same name, with its C signature
//! and documented behaviour; what differs is said above.
#![allow(non_snake_case, missing_docs, clippy::missing_safety_doc)]

use crate::cuda::{device, memory};
use crate::nccl::codes::{INVALID_ARGUMENT, INVALID_USAGE, IN_PROGRESS, SUCCESS, SYSTEM_ERROR};
use crate::nccl::comm::{Comm, COMMS};
use crate::nccl::group;
use crate::nccl::hub;
use crate::nccl::ops::Spec;
use crate::nccl::wire::OpHeader;
use crate::reduce;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The NCCL version the simulator claims: 2.27.3 (split, shrink and scalable init exist).
pub const VERSION: c_int = 22703;
const ID_MAGIC: &[u8; 8] = b"C10DSIM1";
const NUM_OPS: c_int = 5;

/// `ncclUniqueId`: 128 bytes; ours hold the magic, the hub's port and the communicator's key.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// The bytes.
    pub internal: [u8; 128],
}

/// [`crate::out`] with NCCL's codes: `ncclInvalidArgument` for a null out-pointer.
fn w<T>(p: *mut T, v: T) -> c_int {
    // SAFETY: the caller passes null or writable storage of `T` (the API's contract).
    match unsafe { crate::out(p, v) } {
        crate::abi::SUCCESS => SUCCESS,
        _ => INVALID_ARGUMENT,
    }
}

fn comm_of(h: usize) -> Result<Arc<Comm>, c_int> {
    COMMS.get(h).ok_or(INVALID_ARGUMENT)
}

#[no_mangle]
pub extern "C" fn ncclGetVersion(v: *mut c_int) -> c_int {
    w(v, VERSION)
}

#[no_mangle]
pub extern "C" fn ncclGetUniqueId(id: *mut UniqueId) -> c_int {
    let Ok(port) = hub::port() else {
        return SYSTEM_ERROR;
    };
    let mut internal = [0u8; 128];
    internal[..8].copy_from_slice(ID_MAGIC);
    internal[8..10].copy_from_slice(&port.to_le_bytes());
    internal[10..18].copy_from_slice(&hub::new_key().to_le_bytes());
    w(id, UniqueId { internal })
}

fn parse_id(id: &UniqueId) -> Option<(u16, u64)> {
    (&id.internal[..8] == ID_MAGIC).then(|| {
        (
            u16::from_le_bytes([id.internal[8], id.internal[9]]),
            u64::from_le_bytes(id.internal[10..18].try_into().expect("8 bytes")),
        )
    })
}

/// Whether `config` (an `ncclConfig_t`, may be null) asks for a non-blocking communicator.
fn non_blocking(config: *const c_void) -> bool {
    if config.is_null() {
        return std::env::var("NCCL_COMM_BLOCKING").as_deref() == Ok("0");
    }
    // SAFETY: a non-null config is an ncclConfig_t: size (usize), magic, version (u32), then
    // `blocking` (int) at offset 16 in every layout since 2.14.
    let (magic, blocking) = unsafe {
        let p = config.cast::<u8>();
        (
            p.add(8).cast::<u32>().read_unaligned(),
            p.add(16).cast::<i32>().read_unaligned(),
        )
    };
    magic == 0xcafe_beef && blocking == 0
}

/// Starts `comm`'s connection: on this thread (blocking: its result) or on a thread of its
/// own (non-blocking: `ncclInProgress`).
fn start(comm: Arc<Comm>) -> c_int {
    if comm.non_blocking {
        let c = comm.clone();
        let spawned = std::thread::Builder::new()
            .name("gpusim-nccl-init".into())
            .spawn(move || c.connect());
        return if spawned.is_ok() {
            IN_PROGRESS
        } else {
            SYSTEM_ERROR
        };
    }
    comm.connect();
    comm.async_error()
}

fn init(
    out: *mut usize,
    nranks: c_int,
    id: &UniqueId,
    rank: c_int,
    config: *const c_void,
) -> c_int {
    let Some((port, key)) = parse_id(id) else {
        return INVALID_ARGUMENT;
    };
    if nranks < 1 || rank < 0 || rank >= nranks {
        return INVALID_ARGUMENT;
    }
    let dev = device::current().unwrap_or(0);
    let comm = Comm::new(port, dev, non_blocking(config));
    comm.set_place(key, rank as u32, nranks as u32);
    if w(out, COMMS.insert(comm.clone())) != SUCCESS {
        return INVALID_ARGUMENT;
    }
    start(comm)
}

#[no_mangle]
pub extern "C" fn ncclCommInitRank(
    out: *mut usize,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> c_int {
    init(out, nranks, &id, rank, std::ptr::null())
}

#[no_mangle]
pub extern "C" fn ncclCommInitRankConfig(
    out: *mut usize,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *const c_void,
) -> c_int {
    init(out, nranks, &id, rank, config)
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    out: *mut usize,
    nranks: c_int,
    rank: c_int,
    n_ids: c_int,
    ids: *const UniqueId,
    config: *const c_void,
) -> c_int {
    if n_ids < 1 || ids.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: `ids` holds `n_ids >= 1` unique ids (the API's contract); the first names the hub.
    let first = unsafe { *ids };
    init(out, nranks, &first, rank, config)
}

/// Runs `job` on this thread (a blocking call: its result), or on a thread of its own while
/// `busy` answers `ncclInProgress` (a non-blocking call).
fn here_or_in_background(
    nb: bool,
    busy: &Comm,
    job: impl FnOnce() -> c_int + Send + 'static,
) -> c_int {
    if !nb {
        return job();
    }
    busy.begin_finalize();
    match std::thread::Builder::new()
        .name("gpusim-nccl-split".into())
        .spawn(job)
    {
        Ok(_) => IN_PROGRESS,
        Err(_) => SYSTEM_ERROR,
    }
}

/// A child communicator (split, shrink) placed by the parent's hub with `header` + `data`.
/// A rank outside every child (`NCCL_SPLIT_NOCOLOR`) gets a null handle at once, as NCCL
/// knows its color locally, and still takes part in the parent's exchange (in the background
/// for a non-blocking parent, whose async error says `ncclInProgress` until it is done).
fn child(
    parent: Arc<Comm>,
    out: *mut usize,
    header: OpHeader,
    data: Vec<u8>,
    member: bool,
    config: *const c_void,
) -> c_int {
    let nb = non_blocking(config);
    let p = parent.clone();
    if !member {
        w(out, 0usize);
        return here_or_in_background(nb, &p, move || {
            let placed = parent.place(header, &data, &|| false);
            parent.finished_finalize();
            match placed {
                Ok(_) => SUCCESS,
                Err((code, msg)) => {
                    parent.fail(code, &msg);
                    code
                }
            }
        });
    }
    let comm = Comm::new(parent.port, parent.device, nb);
    w(out, COMMS.insert(comm.clone()));
    here_or_in_background(nb, &p, move || {
        let c = comm.clone();
        let placed = parent.place(header, &data, &|| c.aborted());
        parent.finished_finalize();
        match placed {
            Ok((key, rank, n)) => {
                comm.set_place(key, rank, n);
                comm.connect();
                comm.async_error()
            }
            Err((code, msg)) => {
                comm.fail(code, &msg);
                code
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn ncclCommSplit(
    comm: usize,
    color: c_int,
    key: c_int,
    out: *mut usize,
    config: *const c_void,
) -> c_int {
    let parent = match comm_of(comm) {
        Ok(c) if c.usable() => c,
        Ok(_) => return INVALID_USAGE,
        Err(e) => return e,
    };
    let header = OpHeader {
        op: 6,
        dtype: 0,
        red: 0,
        root: color.max(-1),
        count: 0,
    };
    child(
        parent,
        out,
        header,
        key.to_le_bytes().to_vec(),
        color >= 0,
        config,
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: usize,
    exclude: *const c_int,
    count: c_int,
    out: *mut usize,
    config: *const c_void,
    _flags: c_int,
) -> c_int {
    let parent = match comm_of(comm) {
        Ok(c) if !c.aborted() => c,
        Ok(_) => return INVALID_USAGE,
        Err(e) => return e,
    };
    let n = count.max(0) as usize;
    if n == 0 || exclude.is_null() {
        parent.set_last_error("c10d-gpusim: ncclCommShrink: excludeRanksCount must be positive");
        return INVALID_ARGUMENT;
    }
    // SAFETY: `exclude` holds `count` ints (the API's contract).
    let ranks = unsafe { std::slice::from_raw_parts(exclude, n) };
    if ranks.contains(&(parent.rank() as c_int)) {
        return INVALID_ARGUMENT;
    }
    let data: Vec<u8> = ranks
        .iter()
        .flat_map(|r| (*r as u32).to_le_bytes())
        .collect();
    let header = OpHeader {
        op: 7,
        dtype: 0,
        red: 0,
        root: -1,
        count: n as u64,
    };
    child(parent, out, header, data, true, config)
}

fn wait_idle(comm: &Comm) {
    while comm.inflight.load(Ordering::Acquire) > 0 && !comm.aborted() {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[no_mangle]
pub extern "C" fn ncclCommFinalize(comm: usize) -> c_int {
    let c = match comm_of(comm) {
        Ok(c) => c,
        Err(e) => return e,
    };
    if !c.non_blocking {
        wait_idle(&c);
        return SUCCESS;
    }
    c.begin_finalize();
    std::thread::spawn(move || {
        wait_idle(&c);
        c.finished_finalize();
    });
    IN_PROGRESS
}

#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: usize) -> c_int {
    match COMMS.remove(comm) {
        Some(c) => {
            c.leave();
            SUCCESS
        }
        None => INVALID_ARGUMENT,
    }
}

#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: usize) -> c_int {
    match COMMS.remove(comm) {
        Some(c) => {
            c.abort();
            // As NCCL's abort, it returns only after the kernels left (their end events may
            // fire meanwhile) and the resources are freed: that takes a while.
            std::thread::sleep(std::time::Duration::from_millis(100));
            SUCCESS
        }
        None if comm == 0 => SUCCESS,
        None => INVALID_ARGUMENT,
    }
}

#[no_mangle]
pub extern "C" fn ncclCommGetAsyncError(comm: usize, err: *mut c_int) -> c_int {
    match comm_of(comm) {
        Ok(c) => w(err, c.async_error()),
        Err(e) => e,
    }
}

fn query(comm: usize, out: *mut c_int, f: impl Fn(&Comm) -> c_int) -> c_int {
    match comm_of(comm) {
        Ok(c) => w(out, f(&c)),
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn ncclCommCount(comm: usize, out: *mut c_int) -> c_int {
    query(comm, out, |c| c.nranks() as c_int)
}

#[no_mangle]
pub extern "C" fn ncclCommCuDevice(comm: usize, out: *mut c_int) -> c_int {
    query(comm, out, |c| c.device as c_int)
}

#[no_mangle]
pub extern "C" fn ncclCommUserRank(comm: usize, out: *mut c_int) -> c_int {
    query(comm, out, |c| c.rank() as c_int)
}

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> c_int {
    group::start()
}

#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> c_int {
    group::end()
}

/// NCCL's argument checks for one op: a live, initialised communicator; a known type; device
/// pointers (as NCCL's `PtrCheck`); the reduction; the root or peer in range.
fn check(
    comm: usize,
    dtype: c_int,
    ptrs: &[*const c_void],
    red: Option<c_int>,
    root: Option<c_int>,
) -> Result<(Arc<Comm>, Option<Vec<u8>>), c_int> {
    let c = comm_of(comm)?;
    if !c.usable() {
        c.set_last_error("c10d-gpusim: op on a communicator that is not initialised, has an error, or was aborted");
        return Err(INVALID_USAGE);
    }
    let fail = |msg: String| {
        c.set_last_error(&format!("c10d-gpusim: invalid argument: {msg}"));
        INVALID_ARGUMENT
    };
    reduce::dtype_size(dtype).ok_or_else(|| fail(format!("data type {dtype}")))?;
    for p in ptrs {
        if memory::range_of(*p as u64, 0).is_none() {
            return Err(fail(format!("{p:?} is not a device pointer")));
        }
    }
    if root.is_some_and(|r| r < 0 || r as u32 >= c.nranks()) {
        return Err(fail(format!(
            "root or peer {root:?} of {} ranks",
            c.nranks()
        )));
    }
    let premul = match red {
        Some(r) if (0..NUM_OPS).contains(&r) => None,
        Some(r) => Some(
            c.premul
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&r)
                .cloned()
                .ok_or_else(|| fail(format!("reduction {r}")))?,
        ),
        None => None,
    };
    Ok((c, premul))
}

#[allow(clippy::too_many_arguments)]
fn coll(
    op: u8,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    red: c_int,
    root: c_int,
    comm: usize,
    stream: usize,
) -> c_int {
    let ptrs: Vec<*const c_void> = if count == 0 {
        vec![]
    } else {
        vec![send, recv.cast_const()]
    };
    let reduces = matches!(op, 1 | 3 | 5);
    let rooted = matches!(op, 2 | 3);
    match check(
        comm,
        dtype,
        &ptrs,
        reduces.then_some(red),
        rooted.then_some(root),
    ) {
        Ok((c, premul)) => {
            let red = if premul.is_some() || !reduces { 0 } else { red };
            let header = OpHeader {
                op,
                dtype,
                red,
                root: if rooted { root } else { -1 },
                count: count as u64,
            };
            group::add(
                c,
                stream,
                Spec::Coll {
                    header,
                    send: send as u64,
                    recv: recv as u64,
                    premul,
                },
            )
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    comm: usize,
    stream: usize,
) -> c_int {
    coll(1, send, recv, count, dtype, op, 0, comm, stream)
}

#[no_mangle]
pub extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: usize,
    stream: usize,
) -> c_int {
    coll(2, send, recv, count, dtype, 0, root, comm, stream)
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
    comm: usize,
    stream: usize,
) -> c_int {
    coll(3, send, recv, count, dtype, op, root, comm, stream)
}

#[no_mangle]
pub extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    comm: usize,
    stream: usize,
) -> c_int {
    coll(4, send, recv, count, dtype, 0, 0, comm, stream)
}

#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    comm: usize,
    stream: usize,
) -> c_int {
    coll(5, send, recv, count, dtype, op, 0, comm, stream)
}

fn p2p(
    buf: *const c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: usize,
    stream: usize,
    sending: bool,
) -> c_int {
    let ptrs: Vec<*const c_void> = if count == 0 { vec![] } else { vec![buf] };
    match check(comm, dtype, &ptrs, None, Some(peer)) {
        Ok((c, _)) => {
            let bytes = count * reduce::dtype_size(dtype).unwrap_or(0);
            let (buf, peer) = (buf as u64, peer as u32);
            let spec = if sending {
                Spec::Send { buf, bytes, peer }
            } else {
                Spec::Recv { buf, bytes, peer }
            };
            group::add(c, stream, spec)
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn ncclSend(
    buf: *const c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: usize,
    stream: usize,
) -> c_int {
    p2p(buf, count, dtype, peer, comm, stream, true)
}

#[no_mangle]
pub extern "C" fn ncclRecv(
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: usize,
    stream: usize,
) -> c_int {
    p2p(buf.cast_const(), count, dtype, peer, comm, stream, false)
}

#[no_mangle]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut c_int,
    scalar: *const c_void,
    dtype: c_int,
    residence: c_int,
    comm: usize,
) -> c_int {
    let c = match comm_of(comm) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let Some(size) = reduce::dtype_size(dtype) else {
        return INVALID_ARGUMENT;
    };
    if scalar.is_null() {
        return INVALID_ARGUMENT;
    }
    let bytes = if residence == 1 {
        // SAFETY: a host scalar of `dtype` (the API's contract for ncclScalarHostImmediate).
        unsafe { std::slice::from_raw_parts(scalar.cast::<u8>(), size) }.to_vec()
    } else {
        match memory::read(scalar as u64, size) {
            Ok(b) => b,
            Err(_) => return INVALID_ARGUMENT,
        }
    };
    let mut m = c.premul.lock().unwrap_or_else(|e| e.into_inner());
    let handle = NUM_OPS + m.len() as c_int + 1000;
    m.insert(handle, bytes);
    w(op, handle)
}

#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: c_int, comm: usize) -> c_int {
    match comm_of(comm) {
        Ok(c) => match c
            .premul
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&op)
        {
            Some(_) => SUCCESS,
            None => INVALID_ARGUMENT,
        },
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn ncclGetErrorString(code: c_int) -> *const c_char {
    let s: &'static [u8] = match code {
        0 => b"no error\0",
        1 => b"unhandled cuda error (run with NCCL_DEBUG=INFO for details)\0",
        2 => b"unhandled system error (run with NCCL_DEBUG=INFO for details)\0",
        3 => b"internal error - please report this issue to the NCCL developers\0",
        4 => b"invalid argument (run with NCCL_DEBUG=WARN for details)\0",
        5 => b"invalid usage (run with NCCL_DEBUG=WARN for details)\0",
        6 => b"remote process exited or there was a network error\0",
        7 => b"NCCL operation in progress\0",
        8 => b"NCCL operation timed out\0",
        _ => b"unknown result code\0",
    };
    s.as_ptr().cast()
}

#[no_mangle]
pub extern "C" fn ncclGetLastError(comm: usize) -> *const c_char {
    match comm_of(comm) {
        Ok(c) => c.last_error_ptr(),
        Err(_) => c"".as_ptr(),
    }
}

//! Exported: streams, events, stream capture and graphs, host functions, stream memory
//! operations (`cuStreamWaitValue32` / `cuStreamWriteValue32`).
//! Each exported function is the driver or NCCL function of the same name, with its C signature
//! and documented behaviour; what differs is said above.
#![allow(non_snake_case, missing_docs, clippy::missing_safety_doc)]

use super::api_context::code;
use super::capture::{self, Node};
use super::event::Event;
use super::{device, launch, memory};
use crate::abi::{self, CuResult};
use crate::out;
use crate::registry::Registry;
use std::ffi::c_void;
use std::sync::{Arc, LazyLock};

static EVENTS: LazyLock<Registry<Event>> = LazyLock::new(|| Registry::new(0x7000_0000));
static GRAPHS: LazyLock<Registry<Vec<Node>>> = LazyLock::new(|| Registry::new(0x8000_0000));

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(s: *mut usize, flags: u32) -> CuResult {
    // SAFETY: forwarded with the caller's contract.
    unsafe { cuStreamCreateWithPriority(s, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    s: *mut usize,
    flags: u32,
    prio: i32,
) -> CuResult {
    match device::new_stream(flags, prio) {
        // SAFETY: the caller passes a writable CUstream.
        Ok(h) => unsafe { out(s, h) },
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(s: usize) -> CuResult {
    match device::STREAMS.remove(s) {
        Some(st) => {
            st.close();
            abi::SUCCESS
        }
        None => abi::INVALID_HANDLE,
    }
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(s: usize) -> CuResult {
    let r = device::stream(s).and_then(|st| {
        if let Some(cap) = capture::of(&st) {
            capture::invalidate(&cap);
            return Err(abi::CAPTURE_UNSUPPORTED);
        }
        capture::check_unsafe_call()?;
        st.synchronize();
        device::sticky(st.device)
    });
    code(r)
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(s: usize) -> CuResult {
    let r = device::stream(s).and_then(|st| {
        device::sticky(st.device)?;
        if capture::of(&st).is_some() {
            return Err(abi::CAPTURE_UNSUPPORTED);
        }
        Ok(st.idle())
    });
    match r {
        Ok(true) => abi::SUCCESS,
        Ok(false) => abi::NOT_READY,
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(s: usize, p: *mut i32) -> CuResult {
    match device::stream(s) {
        // SAFETY: as above.
        Ok(st) => unsafe { out(p, st.priority) },
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(s: usize, f: *mut u32) -> CuResult {
    match device::stream(s) {
        // SAFETY: as above.
        Ok(st) => unsafe { out(f, st.non_blocking as u32) },
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(s: usize, ctx: *mut usize) -> CuResult {
    match device::stream(s) {
        // SAFETY: as above.
        Ok(st) => unsafe { out(ctx, device::context_handle(st.device)) },
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(s: usize, e: usize, _flags: u32) -> CuResult {
    let r = device::stream(s).and_then(|st| {
        let ev = EVENTS.get(e).ok_or(abi::INVALID_HANDLE)?;
        ev.wait_on(&st)
    });
    code(r)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(e: *mut usize, _flags: u32) -> CuResult {
    if let Err(err) = device::current() {
        return err;
    }
    // SAFETY: as above.
    unsafe { out(e, EVENTS.insert(Arc::new(Event::default()))) }
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(e: usize) -> CuResult {
    EVENTS
        .remove(e)
        .map_or(abi::INVALID_HANDLE, |_| abi::SUCCESS)
}

#[no_mangle]
pub extern "C" fn cuEventRecord(e: usize, s: usize) -> CuResult {
    let r = device::stream(s).and_then(|st| {
        device::sticky(st.device)?;
        EVENTS.get(e).ok_or(abi::INVALID_HANDLE)?.record(&st)
    });
    code(r)
}

#[no_mangle]
pub extern "C" fn cuEventRecordWithFlags(e: usize, s: usize, _flags: u32) -> CuResult {
    cuEventRecord(e, s)
}

#[no_mangle]
pub extern "C" fn cuEventQuery(e: usize) -> CuResult {
    match EVENTS.get(e) {
        Some(ev) => ev.query(),
        None => abi::INVALID_HANDLE,
    }
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(e: usize) -> CuResult {
    let Some(ev) = EVENTS.get(e) else {
        return abi::INVALID_HANDLE;
    };
    if let Err(err) = capture::check_unsafe_call() {
        return err;
    }
    ev.synchronize()
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: usize, end: usize) -> CuResult {
    let (Some(a), Some(b)) = (EVENTS.get(start), EVENTS.get(end)) else {
        return abi::INVALID_HANDLE;
    };
    match b.elapsed_ms(&a) {
        // SAFETY: as above.
        Ok(v) => unsafe { out(ms, v) },
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, start: usize, end: usize) -> CuResult {
    // SAFETY: forwarded with the caller's contract.
    unsafe { cuEventElapsedTime(ms, start, end) }
}

#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) -> CuResult {
    if mode.is_null() {
        return abi::INVALID_VALUE;
    }
    // SAFETY: `mode` is a readable and writable CUstreamCaptureMode (the API's contract).
    match capture::exchange_mode(unsafe { *mode }) {
        Ok(prev) => {
            // SAFETY: as above.
            unsafe { *mode = prev };
            abi::SUCCESS
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(s: usize, mode: u32) -> CuResult {
    code(device::stream(s).and_then(|st| capture::begin(&st, mode)))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(s: usize, graph: *mut usize) -> CuResult {
    match device::stream(s).and_then(|st| capture::end(&st)) {
        // SAFETY: the caller passes a writable CUgraph.
        Ok(nodes) => unsafe { out(graph, GRAPHS.insert(Arc::new(nodes))) },
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(s: usize, status: *mut u32) -> CuResult {
    match device::stream(s) {
        // SAFETY: as above.
        Ok(st) => unsafe { out(status, capture::status(&st)) },
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut usize,
    graph: usize,
    _flags: u64,
) -> CuResult {
    match GRAPHS.get(graph) {
        // SAFETY: as above; an executable graph is a copy of the graph's nodes.
        Some(g) => unsafe { out(exec, GRAPHS.insert(Arc::new((*g).clone()))) },
        None => abi::INVALID_HANDLE,
    }
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch(exec: usize, s: usize) -> CuResult {
    let Some(g) = GRAPHS.get(exec) else {
        return abi::INVALID_HANDLE;
    };
    let works: Vec<_> = g.iter().map(|n| n()).collect();
    let all = launch::node(move || works.iter().for_each(|w| w()));
    code(launch::enqueue(s, all).map(|_| ()))
}

#[no_mangle]
pub extern "C" fn cuGraphUpload(exec: usize, _s: usize) -> CuResult {
    GRAPHS
        .get(exec)
        .map_or(abi::INVALID_HANDLE, |_| abi::SUCCESS)
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(g: usize) -> CuResult {
    GRAPHS
        .remove(g)
        .map_or(abi::INVALID_HANDLE, |_| abi::SUCCESS)
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(g: usize) -> CuResult {
    cuGraphDestroy(g)
}

/// A host pointer that may cross to the stream's worker (the caller keeps it valid until the
/// host function ran, as `cuLaunchHostFunc` requires).
#[derive(Clone, Copy)]
struct UserData(*mut c_void);
// SAFETY: the pointer is only handed back to the caller's own function, on the stream's
// worker, as CUDA hands it to its host function on a driver thread.
unsafe impl Send for UserData {}
// SAFETY: as above; it is never dereferenced here.
unsafe impl Sync for UserData {}

#[no_mangle]
pub extern "C" fn cuLaunchHostFunc(
    s: usize,
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    user: *mut c_void,
) -> CuResult {
    let Some(f) = f else {
        return abi::INVALID_VALUE;
    };
    let user = UserData(user);
    let work = move || {
        let u = user;
        // SAFETY: the caller's function with the caller's data, as CUDA calls it.
        unsafe { f(u.0) }
    };
    code(launch::enqueue(s, launch::node(work)).map(|_| ()))
}

fn value_reached(addr: u64, value: u32, flags: u32) -> bool {
    let Ok(bytes) = memory::read(addr, 4) else {
        return true; // the address is checked when queued; a freed flag ends the wait
    };
    let v = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    match flags & 0x3 {
        abi::WAIT_VALUE_GEQ => (v as i32).wrapping_sub(value as i32) >= 0,
        abi::WAIT_VALUE_EQ => v == value,
        abi::WAIT_VALUE_AND => v & value != 0,
        _ => !(v | value) != 0,
    }
}

#[no_mangle]
pub extern "C" fn cuStreamWaitValue32_v2(s: usize, addr: u64, value: u32, flags: u32) -> CuResult {
    if memory::range_of(addr, 4).is_none() {
        return abi::INVALID_VALUE;
    }
    let work = move || {
        while !value_reached(addr, value, flags) {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    };
    code(launch::enqueue(s, launch::node(work)).map(|_| ()))
}

#[no_mangle]
pub extern "C" fn cuStreamWaitValue32(s: usize, addr: u64, value: u32, flags: u32) -> CuResult {
    cuStreamWaitValue32_v2(s, addr, value, flags)
}

#[no_mangle]
pub extern "C" fn cuStreamWriteValue32_v2(
    s: usize,
    addr: u64,
    value: u32,
    _flags: u32,
) -> CuResult {
    if memory::range_of(addr, 4).is_none() {
        return abi::INVALID_VALUE;
    }
    let work = move || {
        let _ = memory::write(addr, &value.to_le_bytes());
    };
    code(launch::enqueue(s, launch::node(work)).map(|_| ()))
}

#[no_mangle]
pub extern "C" fn cuStreamWriteValue32(s: usize, addr: u64, value: u32, flags: u32) -> CuResult {
    cuStreamWriteValue32_v2(s, addr, value, flags)
}

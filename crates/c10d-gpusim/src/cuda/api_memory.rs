//! Exported: allocation (synchronous, stream-ordered, pools, pinned host memory), copies,
//! memsets and pointer attributes.
//!
//! Synchronous frees and copies first wait for the device's queued work, as CUDA's do where
//! they touch memory that queued work may use ("cuMemFree ... implicit synchronisation";
//! `cuMemcpy*` without `Async` returns once the copy is done and is ordered after the legacy
//! stream); synchronous variants are "potentially unsafe" during a capture.
//! Each exported function is the driver or NCCL function of the same name, with its C signature
//! and documented behaviour; what differs is said above.
#![allow(non_snake_case, missing_docs, clippy::missing_safety_doc)]

use super::api_context::code;
use super::{capture, device, launch, memory, pool};
use crate::abi::{self, CuResult};
use crate::out;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, LazyLock, Mutex};

fn sync_checked() -> Result<usize, CuResult> {
    let d = device::current()?;
    device::sticky(d)?;
    capture::check_unsafe_call()?;
    Ok(d)
}

fn checked_copy(d: usize, dst: u64, dst_host: bool, src: u64, src_host: bool, n: usize) {
    if let Err(msg) = memory::copy(dst, dst_host, src, src_host, n) {
        device::fail(d, abi::ILLEGAL_ADDRESS, &msg);
    }
}

/// Host memory from `cuMemHostAlloc` (page-locked): start → length.
static PINNED: LazyLock<Mutex<BTreeMap<u64, usize>>> = LazyLock::new(Default::default);

fn is_pinned(addr: u64, n: usize) -> bool {
    let p = PINNED.lock().unwrap_or_else(|e| e.into_inner());
    p.range(..=addr)
        .next_back()
        .is_some_and(|(s, len)| addr + n as u64 <= s + *len as u64)
}

/// Queues a copy on `stream` (either side host memory as the flags say). As the driver API's
/// "API synchronization behavior" states for pageable host memory: a host-to-device copy
/// takes the source when called ("staged") and a device-to-host copy returns only once done;
/// with page-locked memory (`cuMemHostAlloc`) both are fully asynchronous.
fn copy_async(
    dst: u64,
    dst_host: bool,
    src: u64,
    src_host: bool,
    n: usize,
    stream: usize,
) -> CuResult {
    if !dst_host && memory::range_of(dst, n).is_none()
        || !src_host && memory::range_of(src, n).is_none()
    {
        return abi::INVALID_VALUE;
    }
    let r = device::stream(stream).and_then(|s| {
        let d = s.device;
        device::sticky(d)?;
        if src_host && !is_pinned(src, n) {
            // SAFETY: the caller's host buffer of `n` bytes, read now as the driver stages it.
            let staged = unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec();
            let work = move || checked_copy(d, dst, dst_host, staged.as_ptr() as u64, true, n);
            return launch::enqueue_on(&s, launch::node(work));
        }
        let sid = Arc::as_ptr(&s) as usize;
        crate::config::trace(|| format!("queue copy {src:#x}->{dst:#x} {n}B on stream {sid:#x}"));
        let work = move || {
            crate::config::trace(|| format!("run copy {src:#x}->{dst:#x} {n}B on stream {sid:#x}"));
            checked_copy(d, dst, dst_host, src, src_host, n)
        };
        launch::enqueue_on(&s, launch::node(work))?;
        if dst_host && !is_pinned(dst, n) && capture::of(&s).is_none() {
            s.synchronize();
        }
        Ok(())
    });
    code(r)
}

/// A synchronous copy: ordered after the legacy stream's work, done when it returns.
fn copy_sync(dst: u64, dst_host: bool, src: u64, src_host: bool, n: usize) -> CuResult {
    let r = sync_checked().and_then(|d| {
        device::legacy(d).synchronize();
        memory::copy(dst, dst_host, src, src_host, n).map_err(|m| {
            device::fail(d, abi::ILLEGAL_ADDRESS, &m);
            abi::ILLEGAL_ADDRESS
        })
    });
    code(r)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(ptr: *mut u64, size: usize) -> CuResult {
    match sync_checked().and_then(|d| memory::alloc(d, size).ok_or(abi::OUT_OF_MEMORY)) {
        // SAFETY: the caller passes a writable CUdeviceptr.
        Ok(p) => unsafe { out(ptr, p) },
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: u64) -> CuResult {
    let r = sync_checked().and_then(|d| {
        device::synchronize(d);
        if pool::owner(ptr).is_some() || !memory::free(ptr) {
            return Err(abi::INVALID_VALUE);
        }
        Ok(())
    });
    code(r)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(ptr: *mut u64, size: usize, stream: usize) -> CuResult {
    let r = device::stream(stream).and_then(|s| pool::alloc(pool::default_of(s.device), size, &s));
    match r {
        // SAFETY: as above.
        Ok(p) => unsafe { out(ptr, p) },
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    ptr: *mut u64,
    size: usize,
    p: usize,
    stream: usize,
) -> CuResult {
    match device::stream(stream).and_then(|s| pool::alloc(p, size, &s)) {
        // SAFETY: as above.
        Ok(v) => unsafe { out(ptr, v) },
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(ptr: u64, stream: usize) -> CuResult {
    code(device::stream(stream).and_then(|s| pool::free_async(ptr, &s)))
}

#[repr(C)]
struct PoolProps {
    alloc_type: u32,
    handle_types: u32,
    location_type: u32,
    location_id: i32,
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(p: *mut usize, props: *const c_void) -> CuResult {
    if props.is_null() {
        return abi::INVALID_VALUE;
    }
    // SAFETY: `props` points to a CUmemPoolProps, whose first four fields are these ints.
    let props = unsafe { &*props.cast::<PoolProps>() };
    let d = props.location_id;
    if d < 0 || d as usize >= device::count() || props.location_type != 1 {
        return abi::INVALID_VALUE;
    }
    // SAFETY: as above.
    unsafe { out(p, pool::create(d as usize)) }
}

#[no_mangle]
pub extern "C" fn cuMemPoolDestroy(p: usize) -> CuResult {
    code(pool::destroy(p))
}

#[no_mangle]
pub extern "C" fn cuMemPoolTrimTo(p: usize, keep: usize) -> CuResult {
    code(pool::trim(p, keep))
}

#[no_mangle]
pub extern "C" fn cuMemPoolSetAttribute(p: usize, _attr: u32, value: *mut c_void) -> CuResult {
    if pool::POOLS.get(p).is_none() {
        return abi::INVALID_HANDLE;
    }
    if value.is_null() {
        abi::INVALID_VALUE
    } else {
        abi::SUCCESS
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(p: *mut usize, dev: i32) -> CuResult {
    if dev < 0 || dev as usize >= device::count() {
        return abi::INVALID_DEVICE;
    }
    // SAFETY: as above.
    unsafe { out(p, pool::default_of(dev as usize)) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    let (used, all) = match device::current() {
        Ok(d) => memory::usage(d),
        Err(e) => return e,
    };
    // SAFETY: as above.
    unsafe {
        out(free, (all - used) as usize);
        out(total, all as usize)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(p: *mut *mut c_void, size: usize, _flags: u32) -> CuResult {
    // SAFETY: plain host memory stands for pinned memory; freed by cuMemFreeHost.
    let m = unsafe { libc::malloc(size.max(1)) };
    if m.is_null() {
        return abi::OUT_OF_MEMORY;
    }
    PINNED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(m as u64, size);
    // SAFETY: as above.
    unsafe { out(p, m) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(p: *mut *mut c_void, size: usize) -> CuResult {
    // SAFETY: forwarded with the caller's contract.
    unsafe { cuMemHostAlloc(p, size, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CuResult {
    PINNED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(p as u64));
    // SAFETY: `p` came from cuMemHostAlloc (malloc).
    unsafe { libc::free(p) };
    abi::SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    s: usize,
) -> CuResult {
    copy_async(dst, false, src as u64, true, n, s)
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, s: usize) -> CuResult {
    copy_async(dst as u64, true, src, false, n, s)
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, s: usize) -> CuResult {
    copy_async(dst, false, src, false, n, s)
}

#[no_mangle]
pub extern "C" fn cuMemcpyAsync(dst: u64, src: u64, n: usize, s: usize) -> CuResult {
    copy_async(
        dst,
        !memory::is_device_address(dst),
        src,
        !memory::is_device_address(src),
        n,
        s,
    )
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> CuResult {
    copy_sync(dst, false, src as u64, true, n)
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> CuResult {
    copy_sync(dst as u64, true, src, false, n)
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) -> CuResult {
    copy_sync(dst, false, src, false, n)
}

/// Writes `pattern` at `ptr` when the stream reaches it (again at each graph replay).
fn memset(d: usize, ptr: u64, pattern: Vec<u8>) -> impl Fn() + Send + Sync {
    move || {
        if let Err(m) = memory::write(ptr, &pattern) {
            device::fail(d, abi::ILLEGAL_ADDRESS, &m);
        }
    }
}

fn memset_async(ptr: u64, bytes: Vec<u8>, count: usize, s: usize) -> CuResult {
    let pattern = bytes.repeat(count);
    if memory::range_of(ptr, pattern.len()).is_none() {
        return abi::INVALID_VALUE;
    }
    let r = device::stream(s).and_then(|s| {
        device::sticky(s.device)?;
        launch::enqueue_on(&s, launch::node(memset(s.device, ptr, pattern)))
    });
    code(r)
}

fn memset_sync(ptr: u64, bytes: Vec<u8>, count: usize) -> CuResult {
    let r = sync_checked().and_then(|d| {
        device::legacy(d).synchronize();
        memory::write(ptr, &bytes.repeat(count)).map_err(|_| abi::INVALID_VALUE)
    });
    code(r)
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async(ptr: u64, v: u8, n: usize, s: usize) -> CuResult {
    memset_async(ptr, vec![v], n, s)
}

#[no_mangle]
pub extern "C" fn cuMemsetD32Async(ptr: u64, v: u32, n: usize, s: usize) -> CuResult {
    memset_async(ptr, v.to_le_bytes().to_vec(), n, s)
}

#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(ptr: u64, v: u8, n: usize) -> CuResult {
    memset_sync(ptr, vec![v], n)
}

#[no_mangle]
pub extern "C" fn cuMemsetD32_v2(ptr: u64, v: u32, n: usize) -> CuResult {
    memset_sync(ptr, v.to_le_bytes().to_vec(), n)
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attr: u32, ptr: u64) -> CuResult {
    let Some((d, start, size)) = memory::range_of(ptr, 0) else {
        return abi::INVALID_VALUE; // host memory: "not a device pointer"
    };
    // SAFETY: `data` points to storage of the attribute's type, as the API requires.
    unsafe {
        match attr {
            abi::POINTER_ATTRIBUTE_MEMORY_TYPE => out(data.cast::<u32>(), abi::MEMORYTYPE_DEVICE),
            abi::POINTER_ATTRIBUTE_DEVICE_ORDINAL => out(data.cast::<i32>(), d as i32),
            abi::POINTER_ATTRIBUTE_CONTEXT => out(data.cast::<usize>(), device::context_handle(d)),
            abi::POINTER_ATTRIBUTE_DEVICE_POINTER => out(data.cast::<u64>(), ptr),
            abi::POINTER_ATTRIBUTE_RANGE_START_ADDR => out(data.cast::<u64>(), start),
            abi::POINTER_ATTRIBUTE_RANGE_SIZE => out(data.cast::<usize>(), size),
            _ => crate::unsupported("cuPointerGetAttribute with this attribute"),
        }
    }
}

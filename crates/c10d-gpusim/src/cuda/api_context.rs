//! Exported: initialisation, devices, primary contexts, error names.
//!
//! Attributes answer as an H100 SXM would (compute capability 9.0, 132 SMs, memory pools and
//! stream memory operations supported).
//! Each exported function is the driver or NCCL function of the same name, with its C signature
//! and documented behaviour; what differs is said above.
#![allow(non_snake_case, missing_docs, clippy::missing_safety_doc)]

use super::device;
use crate::abi::{self, CuResult};
use crate::out;
use std::ffi::c_char;

/// Turns a `Result` into the `CUresult` the C caller sees.
pub fn code(r: Result<(), CuResult>) -> CuResult {
    r.err().unwrap_or(abi::SUCCESS)
}

fn ordinal(dev: i32) -> Result<usize, CuResult> {
    device::check_init()?;
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < device::count())
        .ok_or(abi::INVALID_DEVICE)
}

/// What an H100 SXM answers for `attr` (`CUdevice_attribute`); 0 for the rest.
fn attribute(attr: u32) -> i32 {
    match attr {
        1 => 1024,       // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,   // MAX_BLOCK_DIM_X / Y
        4 => 64,         // MAX_BLOCK_DIM_Z
        5 => i32::MAX,   // MAX_GRID_DIM_X
        6 | 7 => 65535,  // MAX_GRID_DIM_Y / Z
        8 => 49152,      // MAX_SHARED_MEMORY_PER_BLOCK
        10 => 32,        // WARP_SIZE
        13 => 1_980_000, // CLOCK_RATE (kHz)
        16 => 132,       // MULTIPROCESSOR_COUNT
        33 => 0,         // PCI_BUS_ID (set per device below)
        36 => 2_619_000, // MEMORY_CLOCK_RATE
        37 => 5120,      // GLOBAL_MEMORY_BUS_WIDTH
        39 => 2048,      // MAX_THREADS_PER_MULTIPROCESSOR
        41 => 1,         // UNIFIED_ADDRESSING
        75 => 9,         // COMPUTE_CAPABILITY_MAJOR
        76 => 0,         // COMPUTE_CAPABILITY_MINOR
        89 => 1,         // CONCURRENT_MANAGED_ACCESS
        92 => 1,         // CAN_USE_STREAM_MEM_OPS (CAN_USE_64_BIT_STREAM_MEM_OPS is 93)
        93 => 1,
        115 => 1, // MEMORY_POOLS_SUPPORTED
        _ => 0,
    }
}

#[no_mangle]
pub extern "C" fn cuInit(_flags: u32) -> CuResult {
    device::init();
    abi::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut i32) -> CuResult {
    // SAFETY: the caller passes a writable int, as the API requires.
    unsafe { out(v, 12080) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut i32) -> CuResult {
    if let Err(e) = device::check_init() {
        return e;
    }
    // SAFETY: as above.
    unsafe { out(n, device::count() as i32) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(d: *mut i32, ordinal_: i32) -> CuResult {
    match ordinal(ordinal_) {
        // SAFETY: as above.
        Ok(o) => unsafe { out(d, o as i32) },
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut i32, attr: u32, dev: i32) -> CuResult {
    match ordinal(dev) {
        // SAFETY: as above.
        Ok(d) if attr == 33 => unsafe { out(v, 0x18 + d as i32) },
        // SAFETY: as above.
        Ok(_) => unsafe { out(v, attribute(attr)) },
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: i32, dev: i32) -> CuResult {
    let d = match ordinal(dev) {
        Ok(d) => d,
        Err(e) => return e,
    };
    let text = format!("c10d-gpusim H100 (simulated device {d})\0");
    let n = text.len().min(len.max(0) as usize);
    if n == 0 || name.is_null() {
        return abi::INVALID_VALUE;
    }
    // SAFETY: `name` has room for `len` bytes (the API's contract); `n <= len`, and the last
    // byte written is a NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast(), name, n);
        *name.add(n - 1) = 0;
    }
    abi::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: i32) -> CuResult {
    match ordinal(dev) {
        // SAFETY: as above.
        Ok(d) => unsafe { out(bytes, super::memory::usage(d).1 as usize) },
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: i32) -> CuResult {
    match ordinal(dev) {
        // SAFETY: as above.
        Ok(d) => unsafe {
            out(
                uuid,
                [
                    0xc1, 0x0d, 0x51, 0x4d, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, d as u8,
                ],
            )
        },
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: i32) -> CuResult {
    // SAFETY: forwarded with the caller's contract.
    unsafe { cuDeviceGetUuid_v2(uuid, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut usize, dev: i32) -> CuResult {
    match ordinal(dev) {
        // SAFETY: as above.
        Ok(d) => unsafe { out(ctx, device::context_handle(d)) },
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: i32) -> CuResult {
    code(ordinal(dev).map(|_| ()))
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: usize) -> CuResult {
    if ctx == 0 {
        device::set_current(None);
        return abi::SUCCESS;
    }
    match device::device_of_context(ctx) {
        Some(d) => {
            device::set_current(Some(d));
            abi::SUCCESS
        }
        None => abi::INVALID_CONTEXT,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut usize) -> CuResult {
    let h = device::current().map(device::context_handle).unwrap_or(0);
    // SAFETY: as above.
    unsafe { out(ctx, h) }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut i32) -> CuResult {
    match device::current() {
        // SAFETY: as above.
        Ok(d) => unsafe { out(dev, d as i32) },
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    let r = device::current().and_then(|d| {
        super::capture::check_unsafe_call()?;
        device::synchronize(d);
        device::sticky(d)
    });
    code(r)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut i32,
    greatest: *mut i32,
) -> CuResult {
    // SAFETY: both are writable ints or null (the API allows null for either).
    unsafe {
        if !least.is_null() {
            *least = 0;
        }
        if !greatest.is_null() {
            *greatest = -5;
        }
    }
    abi::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(e: CuResult, s: *mut *const c_char) -> CuResult {
    // SAFETY: as above; the strings are static and NUL-terminated.
    unsafe { out(s, abi::error_text(e).0.as_ptr().cast()) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(e: CuResult, s: *mut *const c_char) -> CuResult {
    // SAFETY: as above.
    unsafe { out(s, abi::error_text(e).1.as_ptr().cast()) }
}

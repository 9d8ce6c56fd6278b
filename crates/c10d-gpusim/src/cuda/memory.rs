//! Simulated device memory: host memory behind device addresses that no host pointer can
//! alias. Device `d`'s addresses start at `0x7e00_0000_0000_0000 + d << 40`: above the x86-64
//! canonical range, so a host dereference of a device pointer faults, as on a GPU. Fresh and
//! freed memory is filled with `0xff` bytes (NaN in every float dtype, -1 in signed integers),
//! so reading memory nobody wrote, or memory after its free, shows as a failed check.

use crate::config;
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

/// The byte fresh and freed memory holds.
pub const POISON: u8 = 0xff;
const BASE: u64 = 0x7e00_0000_0000_0000;
const ALIGN: u64 = 512;

/// One allocation.
struct Block {
    device: usize,
    bytes: Box<[u8]>,
}

struct Space {
    blocks: BTreeMap<u64, Block>,
    next: Vec<u64>,
    used: Vec<u64>,
}

fn space() -> &'static Mutex<Space> {
    static SPACE: OnceLock<Mutex<Space>> = OnceLock::new();
    SPACE.get_or_init(|| {
        let gpus = config::get().gpus as u64;
        Mutex::new(Space {
            blocks: BTreeMap::new(),
            next: (0..gpus).map(|d| BASE + (d << 40)).collect(),
            used: vec![0; gpus as usize],
        })
    })
}

fn lock() -> std::sync::MutexGuard<'static, Space> {
    space().lock().unwrap_or_else(|e| e.into_inner())
}

/// Allocates `size` bytes on `device`; `None` past the device's memory.
pub fn alloc(device: usize, size: usize) -> Option<u64> {
    let mut s = lock();
    if s.used[device] + size as u64 > config::get().memory_bytes {
        return None;
    }
    let addr = s.next[device];
    s.next[device] += (size.max(1) as u64).div_ceil(ALIGN) * ALIGN;
    s.used[device] += size as u64;
    let bytes = vec![POISON; size].into_boxed_slice();
    s.blocks.insert(addr, Block { device, bytes });
    Some(addr)
}

/// Frees the allocation that starts at `addr`: false when there is none.
pub fn free(addr: u64) -> bool {
    let mut s = lock();
    match s.blocks.remove(&addr) {
        Some(b) => {
            s.used[b.device] -= b.bytes.len() as u64;
            true
        }
        None => false,
    }
}

/// Bytes in use and the total of `device`.
pub fn usage(device: usize) -> (u64, u64) {
    let s = lock();
    let used = s.used.get(device).copied().unwrap_or(0);
    (used, config::get().memory_bytes)
}

/// The allocation holding `[addr, addr + len)`: (device, start, size).
pub fn range_of(addr: u64, len: usize) -> Option<(usize, u64, usize)> {
    let s = lock();
    let (&start, b) = s.blocks.range(..=addr).next_back()?;
    let end = start + b.bytes.len() as u64;
    (addr + len as u64 <= end).then_some((b.device, start, b.bytes.len()))
}

/// Whether `addr` is a simulated device address (allocated or not).
pub fn is_device_address(addr: u64) -> bool {
    addr >= BASE && addr < BASE + ((config::get().gpus as u64) << 40)
}

/// The host pointer behind `[addr, addr + len)`, or an error naming the range when no live
/// allocation holds it (`what` names the operation).
///
/// The pointer stays valid while the allocation lives: frees go through the streams that
/// use the memory, or synchronise the device first, as CUDA's do.
pub fn host_ptr(addr: u64, len: usize, what: &str) -> Result<*mut u8, String> {
    let mut s = lock();
    let found = s.blocks.range_mut(..=addr).next_back();
    match found {
        Some((&start, b)) if addr + len as u64 <= start + b.bytes.len() as u64 => {
            // `addr - start` is within the block, checked above.
            Ok(b.bytes[(addr - start) as usize..].as_mut_ptr())
        }
        _ => Err(format!(
            "c10d-gpusim: {what}: illegal address {addr:#x} (+{len} bytes): not inside a live allocation"
        )),
    }
}

/// Fills `[addr, addr + len)` with the poison byte (a block handed back to a pool).
pub fn poison(addr: u64, len: usize) {
    if let Ok(p) = host_ptr(addr, len, "poison") {
        // SAFETY: `host_ptr` checked that the range lies inside a live allocation.
        unsafe { std::ptr::write_bytes(p, POISON, len) };
    }
}

/// Copies `len` bytes from device or host address `src` to `dst` (either side may be host
/// memory, given as a plain pointer value, when `src_host` / `dst_host` say so).
pub fn copy(dst: u64, dst_host: bool, src: u64, src_host: bool, len: usize) -> Result<(), String> {
    if len == 0 {
        return Ok(());
    }
    let d = if dst_host {
        dst as *mut u8
    } else {
        host_ptr(dst, len, "copy destination")?
    };
    let s = if src_host {
        src as *const u8
    } else {
        host_ptr(src, len, "copy source")?
    };
    // SAFETY: both ranges were checked against live allocations (device side) or are the
    // caller's host buffers of `len` bytes, as the CUDA API requires of its caller; `copy`
    // allows overlap.
    unsafe { std::ptr::copy(s, d, len) };
    Ok(())
}

/// Reads `len` device bytes into a vector.
pub fn read(addr: u64, len: usize) -> Result<Vec<u8>, String> {
    let mut v = vec![0u8; len];
    copy(v.as_mut_ptr() as u64, true, addr, false, len)?;
    Ok(v)
}

/// Writes `data` to device memory at `addr`.
pub fn write(addr: u64, data: &[u8]) -> Result<(), String> {
    copy(addr, false, data.as_ptr() as u64, true, data.len())
}

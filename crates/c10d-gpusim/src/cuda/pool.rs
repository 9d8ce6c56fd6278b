//! Stream-ordered memory pools (`cuMemPoolCreate`, `cuMemAllocAsync`,
//! `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`). A free is an operation of its stream: once
//! the stream reaches it the block is poisoned and can be handed out again on any stream;
//! before that, only an allocation on the same stream may take it (stream order makes that
//! safe, as the CUDA documentation of stream-ordered allocation says). So memory freed on one
//! stream while another stream still uses it is reused and overwritten as on a GPU.

use crate::abi::{self, CuResult};
use crate::cuda::stream::Stream;
use crate::cuda::{launch, memory};
use crate::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

const GRAIN: usize = 512;

/// A memory pool of one device.
pub struct Pool {
    device: usize,
    /// Blocks whose free completed, by rounded size.
    free: Mutex<Vec<(u64, usize)>>,
    /// Blocks freed on a stream that has not reached the free yet.
    pending: Mutex<Vec<(Arc<Stream>, u64, usize)>>,
}

/// Every pool, by handle.
pub static POOLS: LazyLock<Registry<Pool>> = LazyLock::new(|| Registry::new(0x6000_0000));
static OWNER: LazyLock<Mutex<HashMap<u64, (usize, usize)>>> = LazyLock::new(Default::default);
static DEFAULTS: LazyLock<Mutex<HashMap<usize, usize>>> = LazyLock::new(Default::default);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new pool on `device`; its handle.
pub fn create(device: usize) -> usize {
    POOLS.insert(Arc::new(Pool {
        device,
        free: Mutex::new(Vec::new()),
        pending: Mutex::new(Vec::new()),
    }))
}

/// The default pool of `device` (what `cuMemAllocAsync` uses).
pub fn default_of(device: usize) -> usize {
    *lock(&DEFAULTS)
        .entry(device)
        .or_insert_with(|| create(device))
}

/// Allocates `size` bytes from pool `handle` for use on `stream`.
pub fn alloc(handle: usize, size: usize, stream: &Arc<Stream>) -> Result<u64, CuResult> {
    let pool = POOLS.get(handle).ok_or(abi::INVALID_HANDLE)?;
    if pool.device != stream.device {
        return Err(abi::INVALID_VALUE);
    }
    let rounded = size.max(1).div_ceil(GRAIN) * GRAIN;
    let same_stream = {
        let mut p = lock(&pool.pending);
        let i = p
            .iter()
            .position(|(s, _, n)| *n == rounded && Arc::ptr_eq(s, stream));
        i.map(|i| p.remove(i).1)
    };
    let reused = same_stream.or_else(|| {
        let mut f = lock(&pool.free);
        let i = f.iter().position(|(_, n)| *n == rounded);
        i.map(|i| f.remove(i).0)
    });
    let ptr = match reused {
        Some(p) => p,
        None => memory::alloc(pool.device, rounded).ok_or(abi::OUT_OF_MEMORY)?,
    };
    lock(&OWNER).insert(ptr, (handle, rounded));
    Ok(ptr)
}

/// Frees `ptr` on `stream` (a block of no pool is freed outright when the stream reaches it).
pub fn free_async(ptr: u64, stream: &Arc<Stream>) -> Result<(), CuResult> {
    let owner = lock(&OWNER).remove(&ptr);
    let Some((handle, size)) = owner else {
        if memory::range_of(ptr, 0).is_none_or(|(_, start, _)| start != ptr) {
            return Err(abi::INVALID_VALUE);
        }
        return launch::enqueue_on(
            stream,
            launch::node(move || {
                memory::free(ptr);
            }),
        );
    };
    let pool = POOLS.get(handle).ok_or(abi::INVALID_HANDLE)?;
    lock(&pool.pending).push((stream.clone(), ptr, size));
    let p = pool.clone();
    launch::enqueue_on(stream, launch::node(move || complete_free(&p, ptr, size)))
}

/// The stream reached the free: the block is poisoned (a block already handed out again on
/// the same stream too: its new owner's work is queued after this) and, unless reused, free.
fn complete_free(pool: &Pool, ptr: u64, size: usize) {
    memory::poison(ptr, size);
    let mut pending = lock(&pool.pending);
    let Some(i) = pending.iter().position(|(_, p, _)| *p == ptr) else {
        return; // already reused on its own stream
    };
    pending.remove(i);
    drop(pending);
    lock(&pool.free).push((ptr, size));
}

/// Releases the pool's completed free blocks beyond `keep` bytes (`cuMemPoolTrimTo`).
pub fn trim(handle: usize, keep: usize) -> Result<(), CuResult> {
    let pool = POOLS.get(handle).ok_or(abi::INVALID_HANDLE)?;
    let mut f = lock(&pool.free);
    let mut kept = f.iter().map(|(_, n)| n).sum::<usize>();
    while kept > keep {
        let Some((p, n)) = f.pop() else { break };
        memory::free(p);
        kept -= n;
    }
    Ok(())
}

/// Whether `ptr` was allocated from a pool and is live: (pool handle, size).
pub fn owner(ptr: u64) -> Option<(usize, usize)> {
    lock(&OWNER).get(&ptr).copied()
}

/// `cuMemPoolDestroy`: its free blocks are released; live allocations stay valid until freed
/// ("the resources ... will be released automatically once there are no more outstanding
/// allocations"), so the pool's record stays.
pub fn destroy(handle: usize) -> Result<(), CuResult> {
    trim(handle, 0)
}

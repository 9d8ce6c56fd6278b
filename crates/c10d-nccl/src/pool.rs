//! c10d-nccl's own stream-ordered memory pool per device (`cuMemPoolCreate`), which every
//! [`crate::memory`] block comes from, and the per-device stream tensors are allocated on.
//!
//! A pool of our own (not the device's default pool, which a framework in the same process
//! may tune) so that its attributes can be set without surprising anyone:
//! - `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 0`: an allocation never makes its
//!   stream wait for a free queued on another stream. Otherwise allocating a tensor could wait
//!   behind a temporary buffer freed on an NCCL stream whose collective hangs.
//! - `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = u64::MAX`: freed blocks stay cached for reuse (as
//!   PyTorch's caching allocator keeps them) instead of going back to the driver at every
//!   synchronisation; an allocation that finds the device full trims the pool and tries once
//!   more.

use crate::device::{self, driver_error};
use c10d_core::{Device, DistError, Result};
use cudarc::driver::{sys, CudaStream};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// One device's pool and memory stream.
#[derive(Clone)]
pub(crate) struct DevicePool {
    pool: PoolHandle,
    /// Where tensors are allocated (and freed): waited for after each allocation, so a block
    /// is usable from any stream.
    pub stream: Arc<CudaStream>,
    /// Where blocks that device copies used on other streams are freed, after those copies:
    /// never waited for by an allocation (a free waiting behind a caller's stream must not
    /// stall the next allocation).
    pub free_stream: Arc<CudaStream>,
}

/// The raw pool handle, created once per device and never destroyed.
#[derive(Clone, Copy)]
struct PoolHandle(sys::CUmemoryPool);

// SAFETY: a CUDA memory pool handle may be used from any thread; it is never destroyed.
unsafe impl Send for PoolHandle {}
// SAFETY: as above.
unsafe impl Sync for PoolHandle {}

impl DevicePool {
    /// The pool of `device`, made at first use; `None` where the device has no stream-ordered
    /// allocator (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED` is 0).
    ///
    /// # Errors
    /// As [`device::context`]; the driver's error making the pool or its stream.
    pub fn of(device: Device) -> Result<Option<DevicePool>> {
        static POOLS: Mutex<Vec<(u32, Option<DevicePool>)>> = Mutex::new(Vec::new());
        let i = device::ordinal(device)?;
        let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = pools.iter().find(|(d, _)| *d == i) {
            return Ok(p.clone());
        }
        let p = DevicePool::create(device, i)?;
        pools.push((i, p.clone()));
        Ok(p)
    }

    fn create(device: Device, ordinal: u32) -> Result<Option<DevicePool>> {
        let ctx = device::context(device)?;
        let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
        let supported = ctx
            .attribute(attr)
            .map_err(|e| driver_error("cuDeviceGetAttribute", e))?;
        if supported == 0 {
            return Ok(None);
        }
        ctx.bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        let pool = new_pool(ordinal)?;
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        let free_stream = ctx
            .new_stream()
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        Ok(Some(DevicePool {
            pool,
            stream,
            free_stream,
        }))
    }

    /// `nbytes` (non-zero) from the pool, ordered on `stream` (`cuMemAllocFromPoolAsync`).
    ///
    /// # Safety
    /// `stream` belongs to this pool's device, whose context is bound to this thread; the block
    /// is used only by work ordered after this point on `stream` (or after `stream` was waited
    /// for), and freed once with `cuMemFreeAsync`.
    ///
    /// # Errors
    /// The driver's error (out of memory included).
    pub unsafe fn alloc(&self, nbytes: usize, stream: &CudaStream) -> Result<sys::CUdeviceptr> {
        let mut ptr: sys::CUdeviceptr = 0;
        let mut attempt = || {
            // SAFETY: per the caller's contract; `ptr` is writable; the pool is live.
            unsafe {
                sys::cuMemAllocFromPoolAsync(&mut ptr, nbytes, self.pool.0, stream.cu_stream())
            }
        };
        let mut rc = attempt();
        if rc == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            // The pool keeps what was freed: give it back to the driver and try once more.
            // SAFETY: a live pool; trimming only releases unused blocks.
            let _ = unsafe { sys::cuMemPoolTrimTo(self.pool.0, 0) };
            rc = attempt();
        }
        rc.result()
            .map_err(|e| driver_error("cuMemAllocFromPoolAsync", e))?;
        Ok(ptr)
    }
}

/// A pool on device `ordinal` with the attributes of the module docs.
fn new_pool(ordinal: u32) -> Result<PoolHandle> {
    // SAFETY: an all-zero CUmemPoolProps is valid (no handle types, no limits); the fields that
    // matter are set below.
    let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = ordinal as i32;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is writable and `props` valid for the call.
    unsafe { sys::cuMemPoolCreate(&mut pool, &props) }
        .result()
        .map_err(|e| driver_error("cuMemPoolCreate", e))?;
    let mut no_waits: i32 = 0;
    let mut keep_all: u64 = u64::MAX;
    let attrs = [
        (
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
            (&mut no_waits as *mut i32).cast::<c_void>(),
        ),
        (
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep_all as *mut u64).cast::<c_void>(),
        ),
    ];
    if pool.is_null() {
        return Err(DistError::backend("cuMemPoolCreate returned no pool"));
    }
    for (attr, value) in attrs {
        // SAFETY: a live pool; `value` points to the attribute's type (int, cuuint64_t).
        let set = unsafe { sys::cuMemPoolSetAttribute(pool, attr, value) }.result();
        if let Err(e) = set {
            // SAFETY: the pool was made above and nothing was allocated from it.
            let _ = unsafe { sys::cuMemPoolDestroy(pool) };
            return Err(driver_error("cuMemPoolSetAttribute", e));
        }
    }
    Ok(PoolHandle(pool))
}

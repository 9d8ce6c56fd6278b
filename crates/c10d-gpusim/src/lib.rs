//! c10d-gpusim: a simulated CUDA driver and NCCL on the CPU, built as a shared library that is
//! loaded where the real ones are (`libcuda.so.1` through the dynamic loader's search path,
//! `libnccl.so.2` through `C10D_NCCL_LIBRARY`), so c10d-nccl's own code runs unchanged on a
//! machine without a GPU. `cargo xtask test-multigpu --simulated` builds it, lays out the
//! library names in `target/gpusim/` and runs the GPU suite on it.
//!
//! What it models, and where (each module cites the CUDA or NCCL documentation it follows):
//!
//! | module | what |
//! |---|---|
//! | [`config`] | `C10D_SIM_*` settings: devices, seed, random delays, the sabotage switch |
//! | [`cuda::memory`], [`cuda::pool`] | device memory at addresses no host pointer aliases, poisoned when fresh and after free; stream-ordered pools |
//! | [`cuda::stream`], [`cuda::launch`], [`cuda::event`] | streams executing on worker threads with random delays; the legacy and per-thread default streams; events |
//! | [`cuda::capture`] | stream capture, capture modes, graphs and their replay |
//! | [`nccl`] | communicators across processes through a hub, every collective with real reductions ([`reduce`]), groups, split, shrink, abort, asynchronous errors, injected faults |
//!
//! Out of scope: kernels compiled for a GPU (PTX, cuBLAS), timings, NCCL's transports.
//! A driver function it does not implement is absent from the library, so cudarc fails with
//! "Missing symbol NAME" naming it, never a silent success; an attribute or mode it does not
//! model returns `CUDA_ERROR_NOT_SUPPORTED` with a line on stderr.

pub mod abi;
pub mod config;
pub mod cuda;
pub mod nccl;
pub mod reduce;
mod registry;

/// Writes `v` through the caller's out-pointer: `CUDA_ERROR_INVALID_VALUE` when it is null.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
pub unsafe fn out<T>(p: *mut T, v: T) -> abi::CuResult {
    if p.is_null() {
        return abi::INVALID_VALUE;
    }
    // SAFETY: non-null and valid for writes by the caller's contract.
    unsafe { p.write(v) };
    abi::SUCCESS
}

/// What an unmodelled attribute or mode returns: `CUDA_ERROR_NOT_SUPPORTED`, with a line
/// naming it on stderr.
pub fn unsupported(what: &str) -> abi::CuResult {
    eprintln!("c10d-gpusim: {what} is not simulated (CUDA_ERROR_NOT_SUPPORTED)");
    abi::NOT_SUPPORTED
}

//! c10d-nccl: the NCCL (CUDA) backend of c10d-rs, PyTorch's `ProcessGroupNCCL` in Rust.
//!
//! NCCL and the CUDA driver are both loaded at run time, so this crate builds, and its CPU-side
//! tests pass, on a machine with no CUDA toolkit, no driver, no NCCL and no GPU; there
//! [`is_nccl_available`] is false and [`ProcessGroupNccl::new`] fails with what was looked for.
//!
//! ```no_run
//! use c10d_core::{AllreduceOptions, Collectives, DType, Device};
//! use c10d_nccl::{memory, NcclOptions, ProcessGroupNccl};
//! # fn main() -> c10d_core::Result<()> {
//! # let store: std::sync::Arc<dyn c10d_store::Store> = std::sync::Arc::new(c10d_store::HashStore::new());
//! let pg = ProcessGroupNccl::new(store, 0, 1, NcclOptions::default())?;
//! pg.bind(Device::Cuda(0))?; // eager init (PyTorch's device_id); else at the first op
//! let t = memory::from_cpu(&c10d_core::Tensor::from_vec(vec![1.0f32; 1024]), Device::Cuda(0))?;
//! pg.all_reduce(&[t.clone()], &AllreduceOptions::default())?.wait()?; // the stream waits, not the host
//! assert_eq!(t.to_vec::<f32>()?[0], 1.0);                             // copied after that wait
//! # Ok(()) }
//! ```
//! Through c10d-world, `init_process_group` with `"nccl"` or `"cpu:gloo,cuda:nccl"` (and
//! `device_id` for eager init) makes this backend for CUDA tensors.
//!
//! # Which file owns what
//! Layers in cudarc's style (`sys` → checked calls → safe types), over our own loader (cudarc's
//! NCCL loader never tries `libnccl.so.2`, and its safe layer has no split, abort, config or
//! async-error query):
//!
//! | file | owns |
//! |---|---|
//! | [`sys`] | the raw NCCL ABI: result, data type and reduction codes, `ncclUniqueId`, `ncclComm_t`, the 2.27 `ncclConfig_t`, function signatures |
//! | [`library`] | the function table of one opened `libnccl`; newer functions (`ncclCommInitRankConfig` 2.14, `ncclCommSplit` 2.18, `ncclCommShrink` 2.27) looked up on first use, with an error naming the function and both versions |
//! | [`result`] | checked calls: `ncclResult_t` → errors with NCCL's own text |
//! | [`loader`], [`python`], [`version`] | where NCCL is found (`C10D_NCCL_LIBRARY`, the system's `libnccl.so.2`, PyTorch's `nvidia-nccl-cu12/cu13` wheel), once per process |
//! | [`cuda`], [`device`] | GPU count (never panicking without a driver); one primary context per device |
//! | [`memory`], `pool` | CUDA tensors: [`memory::CudaMemory`] (a `DeviceStorage` over a block of c10d-nccl's stream-ordered pool), `zeros` / `empty` / `from_cpu` |
//! | [`caller_memory`] | collectives on memory the caller owns: cudarc's `CudaSlice` / `CudaView` / `CudaViewMut` in a borrow scope on the caller's stream, and `from_raw_device` |
//! | [`stream`] | the caller's current stream per device and thread (`torch.cuda.current_stream`) |
//! | [`comm`] | [`comm::Communicator`]: init from a unique id, split, shrink, abort (from any thread), async-error query; non-blocking calls polled against deadlines |
//! | [`process_group`] | [`ProcessGroupNccl`]: the unique id through the store, the NCCL stream, how an op reaches the device (`launch`), coalescing, sequence numbers, the flight recorder |
//! | `collectives` | the `Backend` methods: each op as NCCL calls in one group |
//! | `inflight`, `events` | one enqueued op as the watchdog sees it, and `Work::wait`'s stream wait; a pool of end events |
//! | [`watchdog`], `watchdog_thread`, [`heartbeat`] | the watchdog's rules as pure logic (timeouts, async errors, `TORCH_NCCL_ASYNC_ERROR_HANDLING`), the thread that applies them and keeps failed ops' memory until their end event, and the heartbeat monitor |
//! | `bootstrap`, [`unique_id`], [`pickled_id`] | the unique id through the store (PyTorch's legacy, vLLM's or c10d-rs's key scheme; vLLM's pickle parsed, never loaded) and an abortable communicator creation |
//! | `coalescing`, [`capture`] | coalesced blocks; CUDA graph capture |
//! | [`env`](mod@env), [`options`], [`mapping`], [`availability`] | `TORCH_NCCL_*` with PyTorch's parsing, `ProcessGroupNCCL.Options` / `NCCLConfig`, dtypes and reductions (PyTorch's refusals), [`is_nccl_available`] |
//!
//! # How an op flows
//! 1. The `Backend` method checks its arguments (c10d-core's shared checks, PyTorch's texts)
//!    and calls `launch` with a body of NCCL calls.
//! 2. `launch` requires CUDA tensors of one device ("Tensors must be CUDA and dense"), refuses
//!    an NCCL group it does not own open on the thread, makes the communicator if the group has
//!    none yet (rank 0's `ncclUniqueId` goes through the group's store, every rank calls
//!    `ncclCommInitRankConfig`; `abort()` interrupts it), and leases the tensors.
//! 3. The NCCL stream is ordered after the caller by [`stream`]'s rule (its declared stream, else
//!    the legacy default stream); the body runs between `ncclGroupStart` and `ncclGroupEnd` (or inside
//!    the open coalesced block's group); an end event is recorded.
//! 4. The `Work` goes to the group's watchdog thread, which completes it when the end event
//!    fires, or fails it on its timeout or an NCCL error, and then aborts the communicator and/or
//!    ends the process as `TORCH_NCCL_ASYNC_ERROR_HANDLING` says (default 3: end the process,
//!    as PyTorch); a failed op's memory stays until its end event fired. `Work::wait` makes the
//!    caller's current stream wait on the end event and gives the tensors back; it blocks the
//!    host with `TORCH_NCCL_BLOCKING_WAIT=1`, a `wait_timeout` or for `barrier`. A captured op (CUDA graph) joins the caller's stream at
//!    once and is not watched.
//!
//! # Departures from PyTorch
//! - Communicators are made non-blocking unless `NcclConfig::blocking` says otherwise, so that
//!   initialisation, split and every enqueue are bounded by the group's timeout and can be
//!   aborted from another thread (PyTorch is blocking unless `TORCH_NCCL_USE_COMM_NONBLOCKING=1`).
//!   A non-blocking call answers `ncclInProgress` and is polled (`ncclCommGetAsyncError`, a
//!   host call that CUDA graph capture allows) until done; the simulated suite runs every case
//!   with each `ncclGroupEnd` answering `ncclInProgress` (`C10D_SIM_GROUP_END_IN_PROGRESS`),
//!   graph capture included.
//! - A tensor stays leased from the op until its `Work::wait` (or completion): passing it to a
//!   second op before waiting on the first is refused (PyTorch queues it on the stream). Wait
//!   on each op (cheap: a stream wait) to queue ops back to back.
//! - One device per process group; `barrier` runs a 1-byte all_reduce (of a byte allocated with
//!   the communicator) on the bound device, else `cuda:LOCAL_RANK`, else the global rank
//!   modulo the device count.
//! - The list `all_gather` is one `ncclBroadcast` per rank into the output list (no flat buffer
//!   and copies); the list `reduce_scatter` goes through a flat buffer and is refused during
//!   CUDA graph capture (use `reduce_scatter_tensor`).
//! - `shutdown()` of a blocking communicator (or with an NCCL older than 2.14) aborts it: a
//!   blocking `ncclCommFinalize` cannot be bounded.
//! - An op whose end event never fires after its group was dropped (its work stuck behind the
//!   caller's stream) leaks its device memory with a warning rather than freeing it under work
//!   that may still run.
//! - `TORCH_NCCL_DESYNC_DEBUG`, `TORCH_NCCL_PROPAGATE_ERROR`, `TORCH_NCCL_NAN_CHECK` and
//!   `TORCH_NCCL_ENABLE_TIMING` set to true are refused ([`mod@env`]).
//! - `start_coalescing` and `end_coalescing` must run on one thread (NCCL's group is the
//!   thread's); an op that fails inside a block makes `end_coalescing` return that error after
//!   launching the block's other ops, and the block is over either way.
//! - `PREMUL_SUM` takes a host scalar (not a device tensor); complex tensors reduce with SUM and
//!   AVG only; fp8 has no c10d dtype yet.
//! - `send`/`recv` run on the group's communicator (PyTorch makes a 2-rank communicator per
//!   pair); `recv` from any source is unsupported, as in PyTorch.
//! - Ranks sharing one GPU (tests) need distinct `NCCL_HOSTID`s: NCCL then joins them through its
//!   socket transport instead of refusing ("Duplicate GPU detected").
#![warn(missing_docs)]

pub mod availability;
mod bootstrap;
pub mod caller_memory;
pub mod capture;
pub mod checks;
mod collectives;
pub mod comm;
pub mod cuda;
pub mod device;
pub mod env;
mod events;
pub mod heartbeat;
mod inflight;
pub mod library;
pub mod loader;
pub mod mapping;
pub mod memory;
pub mod options;
pub mod pickled_id;
mod pool;
pub mod process_group;
pub mod python;
pub mod result;
pub mod stream;
pub mod sys;
pub mod unique_id;
pub mod version;
pub mod watchdog;
mod watchdog_thread;

pub use availability::{check_available, is_nccl_available, nccl_version, NcclAvailability};
pub use cuda::cuda_device_count;
/// The cudarc this crate is built against (0.19, candle 0.11's line): name its types through
/// this path (`c10d_nccl::cudarc::driver::CudaSlice`) to get the ones [`caller_memory`] takes.
pub use cudarc;
pub use env::{ErrorHandlingMode, NcclEnv};
pub use library::NcclLibrary;
pub use loader::{library as nccl_library, LoadError};
pub use options::{NcclConfig, NcclOptions};
pub use process_group::ProcessGroupNccl;
pub use result::NcclError;
pub use version::Version;
pub use watchdog::{Watchdog, WorkProbe, WorkRecord};

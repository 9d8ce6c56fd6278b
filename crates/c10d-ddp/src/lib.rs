//! # c10d-ddp
//!
//! Data-parallel training: what PyTorch's `DistributedDataParallel` does under the hood, for
//! Rust training loops that compute their own gradients (burn, candle, hand-written code).
//! Depends on c10d-core only: it reduces through any [`c10d_core::ProcessGroup`] (made by
//! c10d-world, or by hand from a backend).
//!
//! This crate holds the pieces `torch/csrc/distributed/c10d/init.cpp` binds for DDP: the
//! [`Reducer`], [`GradBucket`] and the comm hooks ([`comm_hooks`]), and
//! [`compute_bucket_assignment_by_size`] (`dist._compute_bucket_assignment_by_size`).
//!
//! ## The flow
//!
//! 1. **Register the parameters**: [`Reducer::new`] takes the model's parameters in registration
//!    order (their dtype, device and shape) and a [`c10d_core::ProcessGroup`]; any backend works.
//! 2. **Buckets**: parameters are grouped by dtype into flat buffers of about `bucket_cap_mb`
//!    (25 MiB, the first one 1 MiB), in reverse registration order, because the last layers'
//!    gradients are computed first. As in DDP, the first iteration uses one bucket per dtype
//!    (unless `find_unused_parameters`), and the buckets are rebuilt after it in the order the
//!    gradients actually arrived on rank 0.
//! 3. **Backward pass**: for each parameter, write its local gradient into
//!    [`Reducer::grad`]`(i)` (a view into its bucket: `gradient_as_bucket_view`, no copy) and
//!    call [`Reducer::mark_variable_ready`]`(i)`, or hand a gradient tensor to
//!    [`Reducer::mark_variable_ready_with_grad`]. When a bucket is complete (and all buckets
//!    before it), its all_reduce is launched asynchronously, so communication overlaps the rest
//!    of the backward pass. Buckets are launched in the same order on every rank.
//! 4. **Hooks**: the reduction of a bucket is DDP's own (divide by the group size, then sum), or a
//!    registered [`CommHook`]: [`AllReduceHook`], [`Fp16CompressHook`], [`Bf16CompressHook`],
//!    [`PowerSgdHook`] or the caller's own (a closure receiving the [`GradBucket`] and returning
//!    a [`BucketFuture`]).
//! 5. **Finalize**: [`Reducer::finalize_backward`] waits for every bucket and leaves the averaged
//!    gradients in place. [`Reducer::stats`] tells how much communication time was hidden behind
//!    the backward pass.
//!
//! Before training, [`verify_params_across_processes`] checks that every rank has the same
//! parameters and [`broadcast_coalesced()`] copies rank 0's initial values to all ranks.
//!
//! ```no_run
//! use c10d_core::{DType, Tensor};
//! use c10d_ddp::{Reducer, ReducerOptions};
//! # fn main() -> c10d_core::Result<()> {
//! # let pg = c10d_world::World::global().world_group()?;
//! let params = vec![Tensor::zeros(DType::F32, &[64, 32]), Tensor::zeros(DType::F32, &[64])];
//! let reducer = Reducer::new(&params, pg, ReducerOptions::default())?;
//! for _step in 0..10 {
//!     for i in (0..params.len()).rev() {
//!         // ... compute the local gradient of parameter i into reducer.grad(i)? ...
//!         reducer.mark_variable_ready(i)?;
//!     }
//!     reducer.finalize_backward()?;
//!     // reducer.grad(i)? now holds the gradient averaged over the ranks.
//! }
//! println!("ddp: {}", reducer.stats());
//! # Ok(()) }
//! ```
//!
//! ## Differences from PyTorch
//!
//! - **No autograd**: there is no graph to hook into, so the caller tells the Reducer when a
//!   gradient is ready (`mark_variable_ready` plays the part of the autograd hook) and when the
//!   backward pass is over (`finalize_backward` plays the part of the engine's final callback).
//! - **Unused parameters** cannot be found by walking a graph: the caller lists the ones it knows
//!   of in [`Reducer::prepare_for_backward`], and with `find_unused_parameters` any parameter
//!   still unmarked at `finalize_backward` is reduced as zero (PyTorch raises there). Globally
//!   unused parameters are not detected (PyTorch leaves their `.grad` untouched; here they get a
//!   zero gradient), so no extra all_reduce of a usage map is made.
//! - **static_graph** records the unused parameters and rebuilds the buckets after the first
//!   iteration (PyTorch rebuilds after the second); reentrant backward passes (a parameter's hook
//!   firing several times) are not counted.
//! - **Gradients** are the bucket views, or tensors copied in and (unless
//!   `gradient_as_bucket_view`) written back at finalize; PyTorch re-points `param.grad`
//!   instead. Bucket views change when buckets are rebuilt: fetch [`Reducer::grad`] each
//!   iteration.
//! - Dense, floating-point parameters only (no sparse gradients, no mixed precision, no
//!   `no_sync` accumulation).
//! - **Device parameters** (CUDA tensors of c10d-nccl, its views of the caller's memory such as
//!   candle's, or any `DeviceStorage` that can allocate) get their buckets on their device, as
//!   in PyTorch: gradients are copied into the buckets and back on the device
//!   (`Tensor::copy_from`, `zero_`, `new_zeros`), in the order c10d-nccl's stream rule gives
//!   (`c10d_nccl::stream`), and the bucket rebuild's message travels on the first parameter's
//!   device (so a group with only `"nccl"` carries it), as do [`verify_params_across_processes`]'s
//!   gathers and [`broadcast_coalesced()`]'s flat buffers. The Reducer has no kernels of its own, so
//!   on a device it does not divide gradients by the group size on the way in: the bucket's
//!   all_reduce averages (`ReduceOp::Avg`; NCCL pre-multiplies floats by 1/size, the same
//!   pre-division; a CPU backend that stages device tensors, `"cuda:gloo"`, sums and then
//!   divides, which can overflow float16 where the pre-division would not). Hooks
//!   that cast or compute on the host ([`Fp16CompressHook`], [`Bf16CompressHook`],
//!   [`PowerSgdHook`]) are refused for device buckets at `register_comm_hook`;
//!   [`AllReduceHook`] and the caller's own hooks work.
//! - **Lent gradients** (views of a `c10d_core::borrowed::scope` or a
//!   `c10d_nccl::caller_memory::scope`, `c10d_candle::with_tensor`) are cut off when their
//!   scope ends: give them to [`Reducer::mark_variable_ready_with_grad`] with
//!   `gradient_as_bucket_view`, or `finalize_backward` fails copying back into them.
//! - **A failed iteration** (a failed `finalize_backward` or bucket launch) leaves the Reducer
//!   unusable: every later iteration call says the previous backward pass failed and that a
//!   new Reducer must be built (PyTorch's Reducer is left in an undefined state there).
//! - [`PowerSgdHook`] is PyTorch's `powerSGD_hook` for float32 buckets (differences in
//!   [`powersgd`]); the batched variant and the other stateful hooks are not provided.

mod average;
pub mod broadcast_coalesced;
pub mod bucket_assignment;
mod bucket_memory;
mod buckets;
pub mod comm_hooks;
mod elementwise;
mod errors;
pub mod grad_bucket;
pub mod powersgd;
mod rebuild;
pub mod reducer;
pub mod stats;
pub mod verify;

pub use broadcast_coalesced::{broadcast_coalesced, DEFAULT_BROADCAST_BUCKET_SIZE};
pub use bucket_assignment::{
    bucket_bytes_cap, compute_bucket_assignment_by_size, default_bucket_size_limits,
    BucketAssignment, TensorMeta, DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_BYTES, MB_TO_BYTES,
};
pub use comm_hooks::{AllReduceHook, Bf16CompressHook, CommHook, Fp16CompressHook};
pub use grad_bucket::{BucketFuture, GradBucket};
pub use powersgd::{PowerSgdHook, PowerSgdOptions};
pub use reducer::{Reducer, ReducerOptions};
pub use stats::DdpStats;
pub use verify::verify_params_across_processes;

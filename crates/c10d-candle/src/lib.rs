//! Collectives on [candle](https://github.com/huggingface/candle) tensors for c10d-rs (see the
//! crate README). [`all_reduce`], [`broadcast`], [`all_gather_into_tensor`],
//! [`reduce_scatter_tensor`], [`send`] and [`recv`] (PyTorch's names, called as c10d-world's
//! collectives are: `cc::all_reduce(&t).op(ReduceOp::Avg).group(&sub).run()?`) take
//! `candle_core::Tensor`s: CPU tensors go through c10d-rs's CPU backend with
//! the tensor's own storage as the buffer (in place, no copy). With the `cuda` feature, CUDA
//! tensors go through the group's NCCL backend the same way, on candle's device stream (see
//! `cuda_slices.rs` and `c10d_nccl::caller_memory`); without it they are refused with an error
//! naming the feature.
//!
//! | candle dtype | elements | reductions |
//! |---|---|---|
//! | F32, F64, F16, BF16, U8, I16, I32, I64 | the same type | all |
//! | U32 | its bits as `i32` | SUM and PRODUCT (wrapping, bit-identical to `u32`); others refused |
//! | F8E4M3, F6E2M3, F6E3M2, F4, F8E8M0 | refused | |
//!
//! | file | what |
//! |---|---|
//! | `checks.rs` | a tensor's contiguous span and the unsupported-dtype error (shared by both slice kinds) |
//! | `slices.rs` | a CPU tensor's elements as the slice type collectives take; dtype rules |
//! | `cuda_slices.rs` | (feature `cuda`) a CUDA tensor's elements as cudarc views; CUDA dtype rules |
//! | `inplace.rs` | running a collective on a tensor's storage (candle's `InplaceOp1`) |
//! | `collectives.rs` | the collectives |
//! | `tensors.rs` | a candle tensor as a c10d-rs tensor (`with_tensor`, `empty_like`): DDP's Reducer and other c10d-rs APIs |
//! | `runtime.rs` | the device and backend chosen at run time (`"cpu"` → gloo, `"cuda"` → NCCL) |
//!
//! Compatible with candle 0.11 (whose cudarc, 0.19, is c10d-nccl's).

mod checks;
mod collectives;
#[cfg(feature = "cuda")]
mod cuda_slices;
mod inplace;
mod runtime;
mod slices;
mod tensors;

pub use collectives::{
    all_gather_into_tensor, all_reduce, all_reduced, broadcast, recv, reduce_scatter_tensor, send,
    AllGatherIntoTensor, AllReduce, AllReduced, Broadcast, Collective, RecvTensor,
    ReduceScatterTensor, SendTensor,
};
pub use inplace::from_candle;
pub use runtime::{device_and_backend, device_and_backend_from_env, init_on_chosen_device};
pub use tensors::{c10d_dtype, empty_like, with_tensor};

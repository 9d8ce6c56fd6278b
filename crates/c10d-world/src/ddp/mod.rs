//! Data-parallel training: what PyTorch's `DistributedDataParallel` does under the hood.
//!
//! This module holds the pieces `torch/csrc/distributed/c10d/init.cpp` binds for DDP:
//! [`compute_bucket_assignment_by_size`] (`dist._compute_bucket_assignment_by_size`).

pub mod bucket_assignment;

pub use bucket_assignment::{
    bucket_bytes_cap, compute_bucket_assignment_by_size, default_bucket_size_limits,
    BucketAssignment, TensorMeta, DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_BYTES, MB_TO_BYTES,
};

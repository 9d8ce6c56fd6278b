//! `ncclResult_t` values (`nccl.h`), the codes every part of the simulated NCCL answers with.
#![allow(missing_docs)]

pub const SUCCESS: i32 = 0;
pub const UNHANDLED_CUDA_ERROR: i32 = 1;
pub const SYSTEM_ERROR: i32 = 2;
pub const INTERNAL_ERROR: i32 = 3;
pub const INVALID_ARGUMENT: i32 = 4;
pub const INVALID_USAGE: i32 = 5;
pub const REMOTE_ERROR: i32 = 6;
pub const IN_PROGRESS: i32 = 7;

//! DDP communication hooks: how a bucket of gradients is reduced across ranks.
//!
//! Mirrors `DistributedDataParallel.register_comm_hook` and the hooks of
//! `torch.distributed.algorithms.ddp_comm_hooks.default_hooks`: [`AllReduceHook`]
//! (`allreduce_hook`), [`Fp16CompressHook`] (`fp16_compress_hook`) and [`Bf16CompressHook`]
//! (`bf16_compress_hook`). A user hook is any type implementing [`CommHook`], closures included:
//!
//! ```
//! use c10d_ddp::{BucketFuture, GradBucket};
//! use c10d_core::{AllreduceOptions, Collectives, ProcessGroup, Result};
//! // Sum without averaging.
//! let hook = |pg: &ProcessGroup, bucket: &GradBucket| -> Result<BucketFuture> {
//!     let work = pg.all_reduce(&[bucket.buffer().clone()], &AllreduceOptions::default())?;
//!     Ok(BucketFuture::from_work(work, bucket.buffer().clone()))
//! };
//! # let _ = hook;
//! ```
//!
//! As in PyTorch, a registered hook replaces the Reducer's own averaging: gradients are copied
//! into the bucket unscaled and the hook decides what the reduced value is.

use super::average::average_op;
use super::elementwise::{cast_copy, div_in_place};
use super::grad_bucket::{BucketFuture, GradBucket};
use c10d_core::{AllreduceOptions, Collectives, DType, ProcessGroup, ReduceOp, Result, Tensor};

/// A communication hook (`register_comm_hook`'s `hook(state, bucket) -> Future[Tensor]`; the
/// state is whatever the implementing type holds).
pub trait CommHook: Send + Sync {
    /// Launches the reduction of `bucket` on `process_group` and returns its future. Called once
    /// per bucket per iteration, in bucket order, on the thread that marked the bucket's last
    /// gradient ready.
    ///
    /// # Errors
    /// Any error launching the collective; it is returned by the `mark_variable_ready` call that
    /// launched the bucket.
    fn run_hook(&self, process_group: &ProcessGroup, bucket: &GradBucket) -> Result<BucketFuture>;

    /// The name DDP's logger reports for the hook (`comm_hook` in `DDPLoggingData`).
    fn name(&self) -> String {
        "user".into()
    }

    /// Whether the hook works on buckets in device memory (a Reducer of device parameters
    /// refuses a hook that does not at `register_comm_hook`). True by default: a hook of the
    /// caller's own decides; the built-in hooks that cast or compute on the host say false.
    fn supports_device_buckets(&self) -> bool {
        true
    }
}

impl<F> CommHook for F
where
    F: Fn(&ProcessGroup, &GradBucket) -> Result<BucketFuture> + Send + Sync,
{
    fn run_hook(&self, process_group: &ProcessGroup, bucket: &GradBucket) -> Result<BucketFuture> {
        self(process_group, bucket)
    }
}

fn all_reduce(pg: &ProcessGroup, t: &Tensor, reduce_op: ReduceOp) -> Result<c10d_core::Work> {
    pg.all_reduce(
        std::slice::from_ref(t),
        &AllreduceOptions {
            reduce_op,
            ..Default::default()
        },
    )
}

/// `allreduce_hook`: divides the bucket by the group size, then sums it over the ranks in place
/// (the same result as DDP without a hook). A bucket in device memory is averaged by the
/// collective instead (`ReduceOp::Avg`), as DDP's own reduction does there.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllReduceHook;

impl CommHook for AllReduceHook {
    fn run_hook(&self, pg: &ProcessGroup, bucket: &GradBucket) -> Result<BucketFuture> {
        let buf = bucket.buffer().clone();
        let op = average_op(&buf);
        if op == ReduceOp::Sum {
            div_in_place(&buf, pg.size() as f64)?;
        }
        let work = all_reduce(pg, &buf, op)?;
        Ok(BucketFuture::from_work(work, buf))
    }
    fn name(&self) -> String {
        "allreduce_hook".into()
    }
}

/// Casts the bucket to `wire` (dividing by the group size), sums it over the ranks, and casts
/// the result back into the bucket buffer.
fn compress_hook(pg: &ProcessGroup, bucket: &GradBucket, wire: DType) -> Result<BucketFuture> {
    let buf = bucket.buffer().clone();
    if buf.dtype() == wire {
        return AllReduceHook.run_hook(pg, bucket);
    }
    let compressed = Tensor::zeros(wire, &[buf.numel()]);
    cast_copy(&compressed, &buf)?;
    div_in_place(&compressed, pg.size() as f64)?;
    let work = all_reduce(pg, &compressed, ReduceOp::Sum)?;
    Ok(
        BucketFuture::from_work(work, compressed).then(move |reduced| {
            cast_copy(&buf, &reduced)?;
            Ok(buf)
        }),
    )
}

/// `fp16_compress_hook`: the bucket travels as float16 (half the bytes of float32), averaged;
/// the result has float16's precision (about 3 significant decimal digits, range ±65504).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fp16CompressHook;

impl CommHook for Fp16CompressHook {
    fn run_hook(&self, pg: &ProcessGroup, bucket: &GradBucket) -> Result<BucketFuture> {
        compress_hook(pg, bucket, DType::F16)
    }
    fn name(&self) -> String {
        "fp16_compress_hook".into()
    }
    fn supports_device_buckets(&self) -> bool {
        false
    }
}

/// `bf16_compress_hook`: the bucket travels as bfloat16 (float32's range, about 2–3 significant
/// decimal digits), averaged.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bf16CompressHook;

impl CommHook for Bf16CompressHook {
    fn run_hook(&self, pg: &ProcessGroup, bucket: &GradBucket) -> Result<BucketFuture> {
        compress_hook(pg, bucket, DType::BF16)
    }
    fn name(&self) -> String {
        "bf16_compress_hook".into()
    }
    fn supports_device_buckets(&self) -> bool {
        false
    }
}

//! The Reducer's buckets: one flat buffer per bucket, per-parameter views into it, and the
//! in-flight reduction of each bucket with its timing.

use super::average::average_op;
use super::bucket_assignment::{BucketAssignment, TensorMeta};
use super::bucket_memory::BucketMemory;
use super::comm_hooks::CommHook;
use super::grad_bucket::{check_hook_result, BucketFuture, GradBucket};
use super::stats::DoneAt;
use c10d_core::{AllreduceOptions, Collectives, DistError, ProcessGroup, Result, Tensor};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

/// Where a parameter's gradient lives: bucket and position inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Locator {
    pub bucket: usize,
    pub intra: usize,
}

/// A reduction in flight.
struct Inflight {
    future: BucketFuture,
    launched: Instant,
    done: Arc<DoneAt>,
}

/// One bucket: its flat buffer and the parameters laid out in it.
pub(crate) struct Bucket {
    pub buffer: Tensor,
    pub params: Vec<usize>,
    pub offsets: Vec<usize>,
    pub lengths: Vec<usize>,
    /// Per-parameter views of `buffer`, shaped like the parameter.
    pub views: Vec<Tensor>,
    /// Parameters not yet marked ready in this iteration.
    pub pending: usize,
    inflight: Option<Inflight>,
}

/// Builds the buckets of `assignment` (bucket order = reduction order) over zeroed buffers
/// from `memory` (on the parameters' device).
///
/// # Errors
/// [`DistError::InvalidArgument`] when a bucket mixes dtypes or devices, is empty, or when the
/// assignment does not name every parameter exactly once; the device's allocation error.
pub(crate) fn build_buckets(
    metas: &[TensorMeta],
    shapes: &[Vec<usize>],
    assignment: &BucketAssignment,
    memory: &BucketMemory,
) -> Result<(Vec<Bucket>, Vec<Locator>)> {
    let mut locators: Vec<Option<Locator>> = vec![None; metas.len()];
    let mut buckets = Vec::with_capacity(assignment.bucket_indices.len());
    for (b, indices) in assignment.bucket_indices.iter().enumerate() {
        let first = indices
            .first()
            .ok_or_else(|| DistError::invalid("Empty bucket specified."))?;
        let meta0 = metas
            .get(*first)
            .ok_or_else(|| out_of_range(*first, metas.len()))?;
        let (mut offsets, mut lengths, mut offset) = (Vec::new(), Vec::new(), 0usize);
        for (k, &i) in indices.iter().enumerate() {
            let m = metas.get(i).ok_or_else(|| out_of_range(i, metas.len()))?;
            if m.dtype != meta0.dtype {
                return Err(DistError::invalid(
                    "All parameters in a bucket must have the same dtype.",
                ));
            }
            if m.device != meta0.device {
                return Err(DistError::invalid(
                    "All parameters in a bucket must be placed on the same device.",
                ));
            }
            if locators[i]
                .replace(Locator {
                    bucket: b,
                    intra: k,
                })
                .is_some()
            {
                return Err(DistError::invalid(format!(
                    "parameter {i} is assigned to more than one bucket"
                )));
            }
            offsets.push(offset);
            lengths.push(m.numel);
            offset += m.numel;
        }
        let buffer = memory.zeros(meta0.dtype, meta0.device, offset)?;
        let views = indices
            .iter()
            .enumerate()
            .map(|(k, &i)| buffer.narrow(offsets[k], lengths[k])?.reshape(&shapes[i]))
            .collect::<Result<Vec<_>>>()?;
        buckets.push(Bucket {
            buffer,
            params: indices.clone(),
            offsets,
            lengths,
            pending: indices.len(),
            views,
            inflight: None,
        });
    }
    let locators = locators
        .into_iter()
        .enumerate()
        .map(|(i, l)| l.ok_or_else(|| DistError::invalid(format!("parameter {i} is in no bucket"))))
        .collect::<Result<Vec<_>>>()?;
    Ok((buckets, locators))
}

fn out_of_range(i: usize, n: usize) -> DistError {
    DistError::invalid(format!(
        "Out of range variable index specified: {i} (the Reducer has {n} parameters)"
    ))
}

impl Bucket {
    /// The bucket as a comm hook sees it.
    pub fn grad_bucket(&self, index: usize, is_last: bool, shapes: &[Vec<usize>]) -> GradBucket {
        GradBucket {
            index,
            buffer: self.buffer.clone(),
            offsets: self.offsets.clone(),
            lengths: self.lengths.clone(),
            shapes: self.params.iter().map(|&i| shapes[i].clone()).collect(),
            parameter_indices: self.params.clone(),
            is_last,
        }
    }

    /// Launches the reduction: the hook's, or DDP's own: the sum of the (pre-divided) buffer in
    /// host memory, the collective's average ([`ReduceOp::Avg`]) of a device buffer.
    pub fn launch(
        &mut self,
        grad_bucket: &GradBucket,
        pg: &ProcessGroup,
        hook: Option<&dyn CommHook>,
    ) -> Result<()> {
        let launched = Instant::now();
        let future = match hook {
            Some(h) => h.run_hook(pg, grad_bucket)?,
            None => {
                let opts = AllreduceOptions {
                    reduce_op: average_op(&self.buffer),
                    ..Default::default()
                };
                let work = pg.all_reduce(std::slice::from_ref(&self.buffer), &opts)?;
                BucketFuture::from_work(work, self.buffer.clone())
            }
        };
        let done = Arc::new(DoneAt::default());
        match future.work() {
            Some(w) => {
                let waker = Waker::from(done.clone());
                let mut w = w.clone();
                if Pin::new(&mut w)
                    .poll(&mut Context::from_waker(&waker))
                    .is_ready()
                {
                    done.stamp();
                }
            }
            None => done.stamp(),
        }
        self.inflight = Some(Inflight {
            future,
            launched,
            done,
        });
        Ok(())
    }

    /// Waits for the reduction and leaves its result in the buffer. Returns the time the
    /// reduction was in flight (launch, completion).
    pub fn finish(
        &mut self,
        grad_bucket: &GradBucket,
        timeout: Duration,
    ) -> Result<(Instant, Instant)> {
        let Some(inflight) = self.inflight.take() else {
            return Err(DistError::invalid(format!(
                "bucket {} was never launched in this iteration",
                grad_bucket.index
            )));
        };
        let result = inflight.future.wait(timeout)?;
        check_hook_result(grad_bucket, &result)?;
        let same = result.shares_storage_with(&self.buffer)
            && result.storage_offset_bytes() == self.buffer.storage_offset_bytes();
        if !same {
            self.buffer.copy_from(&result.reshape(&[result.numel()])?)?;
        }
        inflight.done.stamp();
        let done = inflight.done.get().unwrap_or_else(Instant::now);
        Ok((inflight.launched, done))
    }

    /// Size of the buffer in bytes.
    pub fn nbytes(&self) -> usize {
        self.buffer.nbytes()
    }
}

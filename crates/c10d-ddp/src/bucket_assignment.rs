//! Gradient bucketing by size: which parameters share one flat all_reduce buffer.
//!
//! Mirrors `torch.distributed._compute_bucket_assignment_by_size`
//! (`compute_bucket_assignment_by_size` in PyTorch's `reducer.cpp`) and the limits `DistributedDataParallel` passes to it
//! (`_DEFAULT_FIRST_BUCKET_BYTES`, `bucket_cap_mb`).

use c10d_core::{DType, Device, DistError, Result, Tensor};
use std::collections::HashMap;

/// `torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`: the size limit of the first bucket (1 MiB).
pub const DEFAULT_FIRST_BUCKET_BYTES: usize = 1024 * 1024;

/// DDP's default `bucket_cap_mb` (25 MiB).
pub const DEFAULT_BUCKET_CAP_MB: f64 = 25.0;

/// Bytes per MiB, as DDP converts `bucket_cap_mb` (`_MB_TO_BYTES`).
pub const MB_TO_BYTES: usize = 1024 * 1024;

/// What bucketing needs to know of a parameter: element type, device and element count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMeta {
    /// Element type (buckets never mix dtypes).
    pub dtype: DType,
    /// Device (buckets never span devices).
    pub device: Device,
    /// Number of elements.
    pub numel: usize,
}

impl TensorMeta {
    /// The metadata of `t`.
    pub fn of(t: &Tensor) -> TensorMeta {
        TensorMeta {
            dtype: t.dtype(),
            device: t.device(),
            numel: t.numel(),
        }
    }

    /// Size in bytes (`numel * element_size`).
    pub fn nbytes(&self) -> usize {
        self.numel * self.dtype.size()
    }
}

/// The result of [`compute_bucket_assignment_by_size`]: bucket `b` holds the parameters
/// `bucket_indices[b]` (in the order given) and was cut at `per_bucket_size_limits[b]` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketAssignment {
    /// Parameter indices per bucket.
    pub bucket_indices: Vec<Vec<usize>>,
    /// The size limit (bytes) that was in force for each bucket.
    pub per_bucket_size_limits: Vec<usize>,
}

/// One open bucket per (dtype, device) while the assignment runs.
#[derive(Default)]
struct Accumulator {
    indices: Vec<usize>,
    size: usize,
    size_limit: usize,
    /// Position in `bucket_size_limits` of the limit in force.
    limit_pos: usize,
}

/// Assigns tensors to buckets of at most about `bucket_size_limits` bytes, as PyTorch does.
///
/// Tensors are visited in the order given; each (dtype, device) pair fills its own bucket, which
/// is closed as soon as its size reaches the current limit (so a bucket may exceed it by its last
/// tensor). The first bucket of each (dtype, device) uses `bucket_size_limits[0]`, the next one
/// `bucket_size_limits[1]`, and so on, the last limit applying to every later bucket.
///
/// `tensor_indices` names the tensors: empty means tensor `i` is parameter `i`, and the buckets
/// are then sorted by their smallest index (the order DDP expects gradients in); non-empty (one
/// index per tensor, as in a bucket rebuild in gradient-arrival order) keeps the order in which
/// buckets were closed, then the still-open buckets.
///
/// Differences from PyTorch: there are no sparse tensors, so `expect_sparse_gradient` is not an
/// argument; with `tensor_indices` and several dtypes, the open buckets are appended in reverse
/// order of the first tensor of each dtype (PyTorch appends them in its hash map's order, which
/// depends on the hash of the dtype).
///
/// # Errors
/// [`DistError::InvalidArgument`] when `tensors` or `bucket_size_limits` is empty, or when
/// `tensor_indices` is non-empty but not of the same length as `tensors`.
pub fn compute_bucket_assignment_by_size(
    tensors: &[TensorMeta],
    bucket_size_limits: &[usize],
    tensor_indices: &[usize],
) -> Result<BucketAssignment> {
    check_arguments(tensors, bucket_size_limits, tensor_indices)?;
    let mut result: Vec<(Vec<usize>, usize)> = Vec::new();
    let mut open: HashMap<(DType, Device), Accumulator> = HashMap::new();
    // Keys in order of first appearance (to append open buckets deterministically).
    let mut keys: Vec<(DType, Device)> = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let index = tensor_indices.get(i).copied().unwrap_or(i);
        let key = (t.dtype, t.device);
        let acc = open.entry(key).or_insert_with(|| {
            keys.push(key);
            Accumulator::default()
        });
        acc.indices.push(index);
        acc.size += t.nbytes();
        acc.size_limit = bucket_size_limits[acc.limit_pos];
        if acc.size >= acc.size_limit {
            result.push((std::mem::take(&mut acc.indices), acc.size_limit));
            acc.size = 0;
            acc.limit_pos = (acc.limit_pos + 1).min(bucket_size_limits.len() - 1);
        }
    }
    for key in keys.iter().rev() {
        let acc = open.get_mut(key).expect("every key has an accumulator");
        if !acc.indices.is_empty() {
            result.push((std::mem::take(&mut acc.indices), acc.size_limit));
        }
    }
    if tensor_indices.is_empty() {
        result.sort_by_key(|(indices, _)| indices.iter().copied().min());
    }
    let (bucket_indices, per_bucket_size_limits) = result.into_iter().unzip();
    Ok(BucketAssignment {
        bucket_indices,
        per_bucket_size_limits,
    })
}

fn check_arguments(
    tensors: &[TensorMeta],
    bucket_size_limits: &[usize],
    tensor_indices: &[usize],
) -> Result<()> {
    if tensors.is_empty() {
        return Err(DistError::invalid(
            "compute_bucket_assignment_by_size: expected at least one tensor",
        ));
    }
    if bucket_size_limits.is_empty() {
        return Err(DistError::invalid(
            "compute_bucket_assignment_by_size: expected at least one bucket size limit",
        ));
    }
    if !tensor_indices.is_empty() && tensor_indices.len() != tensors.len() {
        return Err(DistError::invalid(format!(
            "compute_bucket_assignment_by_size: {} tensor indices given for {} tensors",
            tensor_indices.len(),
            tensors.len()
        )));
    }
    Ok(())
}

/// The bucket size limits DDP uses, in bytes: `[first_bucket_bytes, bucket_cap]` when the first
/// bucket cap is smaller, else `[bucket_cap]`. `bucket_cap_mb: None` is PyTorch's default
/// (25 MiB, with a 1 MiB first bucket); an explicit value applies to the first bucket too
/// (`_BucketCapacityConfig.create`).
pub fn default_bucket_size_limits(bucket_cap_mb: Option<f64>) -> Vec<usize> {
    let cap = bucket_bytes_cap(bucket_cap_mb);
    let first = if bucket_cap_mb.is_none() {
        DEFAULT_FIRST_BUCKET_BYTES
    } else {
        cap
    };
    if first < cap {
        vec![first, cap]
    } else {
        vec![cap]
    }
}

/// `bucket_cap_mb` in bytes (`int(bucket_cap_mb * 1024 * 1024)`), 25 MiB when `None`.
pub fn bucket_bytes_cap(bucket_cap_mb: Option<f64>) -> usize {
    (bucket_cap_mb.unwrap_or(DEFAULT_BUCKET_CAP_MB) * MB_TO_BYTES as f64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(n: usize) -> TensorMeta {
        TensorMeta {
            dtype: DType::F32,
            device: Device::Cpu,
            numel: n,
        }
    }

    #[test]
    fn limits_follow_ddp_defaults() {
        assert_eq!(default_bucket_size_limits(None), vec![1 << 20, 25 << 20]);
        assert_eq!(default_bucket_size_limits(Some(0.5)), vec![1 << 19]);
    }

    #[test]
    fn a_bucket_closes_when_it_reaches_its_limit() {
        let t = [f32s(2), f32s(2), f32s(1), f32s(4)];
        let a = compute_bucket_assignment_by_size(&t, &[8, 16], &[]).unwrap();
        assert_eq!(a.bucket_indices, vec![vec![0], vec![1, 2, 3]]);
        assert_eq!(a.per_bucket_size_limits, vec![8, 16]);
        assert!(compute_bucket_assignment_by_size(&[], &[8], &[]).is_err());
        assert!(compute_bucket_assignment_by_size(&t, &[], &[]).is_err());
        assert!(compute_bucket_assignment_by_size(&t, &[8], &[1]).is_err());
    }
}

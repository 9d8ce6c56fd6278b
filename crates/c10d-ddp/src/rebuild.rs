//! Rebuilding buckets in gradient-arrival order (`Reducer::rebuild_buckets` and
//! `sync_bucket_indices`): every rank computes an assignment from the order its gradients
//! arrived in, and rank 0's is broadcast so that all ranks reduce the same buckets.

use super::bucket_assignment::{compute_bucket_assignment_by_size, BucketAssignment, TensorMeta};
use super::bucket_memory::BucketMemory;
use c10d_core::{BroadcastOptions, Collectives, DistError, ProcessGroup, Result, Tensor};
use std::time::Duration;

/// The rebuilt assignment: buckets by size over the parameters in `arrival` order (parameters
/// that never arrived are appended in index order), as computed on rank 0. The message travels
/// on the first parameter's device (as PyTorch's `sync_bucket_indices` moves it there), so a
/// group with only a device backend (`"nccl"`) can carry it.
///
/// # Errors
/// A failed or timed-out broadcast; [`DistError::InvalidArgument`] when rank 0's assignment does
/// not fit this rank's parameters (the models differ).
pub(crate) fn sync_rebuilt_assignment(
    pg: &ProcessGroup,
    metas: &[TensorMeta],
    arrival: &[usize],
    limits: &[usize],
    timeout: Duration,
    memory: &BucketMemory,
) -> Result<BucketAssignment> {
    let n = metas.len();
    let mut order: Vec<usize> = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    for i in arrival.iter().copied().chain(0..n) {
        if !std::mem::replace(&mut seen[i], true) {
            order.push(i);
        }
    }
    let ordered: Vec<TensorMeta> = order.iter().map(|&i| metas[i]).collect();
    let local = compute_bucket_assignment_by_size(&ordered, limits, &order)?;
    let msg = memory.to_device(&Tensor::from_vec(encode(&local, n)), metas[0].device)?;
    let opts = BroadcastOptions {
        root_rank: 0,
        timeout: Some(timeout),
        ..Default::default()
    };
    pg.broadcast(std::slice::from_ref(&msg), &opts)?
        .wait_timeout(timeout)?;
    decode(&msg.to_vec::<i64>()?, n).ok_or_else(|| {
        DistError::invalid(format!(
            "rank {}: the rebuilt buckets broadcast by rank 0 do not fit this rank's {n} \
             parameters; the model must be the same on every rank",
            pg.rank()
        ))
    })
}

/// `[indices (n)] [bucket count] [bucket lengths (n, padded)] [size limits (n, padded)]`.
fn encode(a: &BucketAssignment, n: usize) -> Vec<i64> {
    let mut v = vec![0i64; 3 * n + 1];
    let flat = a.bucket_indices.iter().flatten();
    for (slot, &i) in v.iter_mut().zip(flat) {
        *slot = i as i64;
    }
    v[n] = a.bucket_indices.len() as i64;
    for (b, (idx, lim)) in a
        .bucket_indices
        .iter()
        .zip(&a.per_bucket_size_limits)
        .enumerate()
    {
        v[n + 1 + b] = idx.len() as i64;
        v[2 * n + 1 + b] = (*lim).min(i64::MAX as usize) as i64;
    }
    v
}

fn decode(v: &[i64], n: usize) -> Option<BucketAssignment> {
    let nb = usize::try_from(*v.get(n)?).ok().filter(|&b| b <= n)?;
    let mut indices = Vec::with_capacity(nb);
    let mut limits = Vec::with_capacity(nb);
    let mut at = 0usize;
    for b in 0..nb {
        let len = usize::try_from(v[n + 1 + b]).ok()?;
        let bucket: Vec<usize> = v
            .get(at..at.checked_add(len)?)?
            .iter()
            .map(|&i| usize::try_from(i).ok().filter(|&i| i < n))
            .collect::<Option<_>>()?;
        at += len;
        indices.push(bucket);
        limits.push(usize::try_from(v[2 * n + 1 + b]).ok()?);
    }
    (at == n).then_some(BucketAssignment {
        bucket_indices: indices,
        per_bucket_size_limits: limits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips() {
        let a = BucketAssignment {
            bucket_indices: vec![vec![2], vec![0, 1]],
            per_bucket_size_limits: vec![8, usize::MAX],
        };
        let back = decode(&encode(&a, 3), 3).unwrap();
        assert_eq!(back.bucket_indices, a.bucket_indices);
        assert_eq!(back.per_bucket_size_limits, vec![8, i64::MAX as usize]);
        assert!(decode(&encode(&a, 3), 4).is_none());
    }
}

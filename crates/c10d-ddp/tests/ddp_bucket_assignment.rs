//! DDP bucket assignment: PyTorch's results (recorded from torch 2.15's
//! `torch.distributed._compute_bucket_assignment_by_size` for the same lists) and the limits DDP
//! derives from `bucket_cap_mb`. `interop_ddp_buckets.rs` compares many more lists live.

use c10d_core::{DType, Device};
use c10d_ddp::{compute_bucket_assignment_by_size, default_bucket_size_limits, TensorMeta};

const MIB: usize = 1 << 20;

fn t(numel: usize, dtype: DType) -> TensorMeta {
    TensorMeta {
        dtype,
        device: Device::Cpu,
        numel,
    }
}

#[test]
fn mixed_dtypes_with_ddp_default_limits() {
    let ts = [
        t(300_000, DType::F32),
        t(10, DType::F32),
        t(300_000, DType::F64),
        t(100_000, DType::F32),
        t(3_670_016, DType::F16),
        t(20_000, DType::F32),
    ];
    let a = compute_bucket_assignment_by_size(&ts, &default_bucket_size_limits(None), &[]).unwrap();
    assert_eq!(
        a.bucket_indices,
        vec![vec![0], vec![1, 3, 5], vec![2], vec![4]]
    );
    assert_eq!(a.per_bucket_size_limits, vec![MIB, 25 * MIB, MIB, MIB]);
}

#[test]
fn rebuilt_order_keeps_the_arrival_order() {
    let ts = [
        t(300_000, DType::F32),
        t(10, DType::F32),
        t(300_000, DType::F32),
        t(100_000, DType::F32),
    ];
    let a = compute_bucket_assignment_by_size(&ts, &[MIB, 25 * MIB], &[3, 2, 1, 0]).unwrap();
    assert_eq!(a.bucket_indices, vec![vec![3], vec![2, 1, 0]]);
    assert_eq!(a.per_bucket_size_limits, vec![MIB, 25 * MIB]);
}

#[test]
fn later_buckets_use_the_last_limit() {
    let ts: Vec<TensorMeta> = [100, 50, 300, 10, 1000, 1]
        .iter()
        .map(|&n| t(n, DType::F32))
        .collect();
    let a = compute_bucket_assignment_by_size(&ts, &[400, 1000], &[]).unwrap();
    assert_eq!(
        a.bucket_indices,
        vec![vec![0], vec![1, 2], vec![3, 4], vec![5]]
    );
    assert_eq!(a.per_bucket_size_limits, vec![400, 1000, 1000, 1000]);
}

#[test]
fn an_explicit_cap_applies_to_the_first_bucket_too() {
    assert_eq!(default_bucket_size_limits(None), vec![MIB, 25 * MIB]);
    assert_eq!(default_bucket_size_limits(Some(4.0)), vec![4 * MIB]);
    assert_eq!(default_bucket_size_limits(Some(0.25)), vec![MIB / 4]);
}

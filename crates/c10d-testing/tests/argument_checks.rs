//! One copy of PyTorch's argument checks, the same text from every backend: each bad call of
//! the table runs against c10d-gloo's `ProcessGroupGloo`, this crate's `StoreBackend`, and the
//! checks the NCCL backend runs before it touches a device (`c10d_core::checks::At` with
//! `ProcessGroupNCCL`'s prefix: what `c10d_nccl`'s `all_to_all_single` and `broadcast` call
//! first; its `ProcessGroupNccl` cannot be made without a GPU). The texts must agree after the
//! backend's `"<Backend>::<op>: "` prefix.

use c10d_core::checks::At;
use c10d_core::{AllToAllOptions, Backend, BroadcastOptions, DType, Result, Tensor};
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::HashStore;
use c10d_testing::StoreBackend;
use std::sync::Arc;
use std::time::Duration;

/// Rank 0 of a group of 2 (no peer ever connects: every call here fails its checks first).
fn backends() -> Vec<(&'static str, Arc<dyn Backend>)> {
    let gloo = ProcessGroupGloo::new(
        Arc::new(HashStore::new()),
        0,
        2,
        GlooOptions {
            lazy_init: true,
            ..Default::default()
        },
    )
    .unwrap();
    let store = StoreBackend::new(
        Arc::new(HashStore::new()),
        0,
        2,
        Duration::from_secs(5),
        "store",
    )
    .unwrap();
    vec![("ProcessGroupGloo", gloo), ("StoreBackend", store)]
}

/// One bad call: how a backend runs it, and how the NCCL backend's checks see it.
struct Case {
    name: &'static str,
    call: fn(&dyn Backend) -> Result<()>,
    nccl: fn(At<'_>) -> Result<()>,
    op: &'static str,
}

fn f32s(shape: &[usize]) -> Tensor {
    Tensor::zeros(DType::F32, shape)
}

fn a2a(out: &Tensor, inp: &Tensor, os: &[usize], is: &[usize], b: &dyn Backend) -> Result<()> {
    b.all_to_all_single(out, inp, os, is, &AllToAllOptions::default())
        .map(|_| ())
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "dim 0 not divisible by the group size",
            op: "alltoall_base",
            call: |b| a2a(&f32s(&[3]), &f32s(&[3]), &[], &[], b),
            nccl: |at| {
                at.all_to_all_single(&f32s(&[3]), &f32s(&[3]), &[], &[], (0, 2))
                    .map(|_| ())
            },
        },
        Case {
            name: "wrong number of split sizes",
            op: "alltoall_base",
            call: |b| a2a(&f32s(&[4]), &f32s(&[4]), &[4], &[2, 2], b),
            nccl: |at| {
                at.all_to_all_single(&f32s(&[4]), &f32s(&[4]), &[4], &[2, 2], (0, 2))
                    .map(|_| ())
            },
        },
        Case {
            name: "split sizes that do not sum to dim 0",
            op: "alltoall_base",
            call: |b| a2a(&f32s(&[4]), &f32s(&[4]), &[2, 2], &[1, 2], b),
            nccl: |at| {
                at.all_to_all_single(&f32s(&[4]), &f32s(&[4]), &[2, 2], &[1, 2], (0, 2))
                    .map(|_| ())
            },
        },
        Case {
            name: "input and output dtypes differ",
            op: "alltoall_base",
            call: |b| a2a(&f32s(&[2]), &Tensor::zeros(DType::I64, &[2]), &[], &[], b),
            nccl: |at| {
                at.all_to_all_single(
                    &f32s(&[2]),
                    &Tensor::zeros(DType::I64, &[2]),
                    &[],
                    &[],
                    (0, 2),
                )
                .map(|_| ())
            },
        },
        Case {
            name: "what a rank sends itself differs from what it expects",
            op: "alltoall_base",
            call: |b| a2a(&f32s(&[4]), &f32s(&[4]), &[1, 3], &[2, 2], b),
            nccl: |at| {
                at.all_to_all_single(&f32s(&[4]), &f32s(&[4]), &[1, 3], &[2, 2], (0, 2))
                    .map(|_| ())
            },
        },
        Case {
            name: "broadcast root out of range",
            op: "broadcast",
            call: |b| {
                let opts = BroadcastOptions {
                    root_rank: 2,
                    ..Default::default()
                };
                b.broadcast(&[f32s(&[2])], &opts).map(|_| ())
            },
            nccl: |at| at.root(2, 2),
        },
    ]
}

#[test]
fn every_backend_gives_the_same_text_for_each_bad_call() {
    let backends = backends();
    for case in cases() {
        let nccl_at = At {
            backend: "ProcessGroupNCCL",
            op: case.op,
        };
        let nccl = (case.nccl)(nccl_at).unwrap_err();
        let want = nccl
            .message()
            .strip_prefix(&format!("ProcessGroupNCCL::{}: ", case.op))
            .unwrap_or_else(|| panic!("{}: {}", case.name, nccl.message()))
            .to_string();
        for (name, b) in &backends {
            let e = (case.call)(b.as_ref()).unwrap_err();
            assert_eq!(
                e.message(),
                format!("{name}::{}: {want}", case.op),
                "{}: {name} differs from the NCCL backend's checks",
                case.name
            );
            assert_eq!(e.kind(), nccl.kind(), "{}: {name}", case.name);
        }
    }
}

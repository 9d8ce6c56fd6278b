//! One copy of PyTorch's argument checks, the same text from every backend: each bad call of
//! the table runs against c10d-gloo's `ProcessGroupGloo`, this crate's `StoreBackend`, and
//! `c10d_nccl::checks::NcclChecks` (what every op of `ProcessGroupNccl` runs first, before it
//! touches a device: `ProcessGroupNccl` itself cannot be made without a GPU). The texts must
//! agree after the backend's `"<Backend>::"` prefix, and name the op PyTorch names.
//!
//! Every op of the `Backend` trait that takes arguments has rows here; each row has one defect.

use c10d_core::*;
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_nccl::checks::NcclChecks;
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

/// One bad call, as a backend runs it and as the NCCL backend's checks see it.
#[derive(Clone)]
struct Case {
    name: &'static str,
    /// The op PyTorch names in the message.
    op: &'static str,
    call: fn(&dyn Backend) -> Result<()>,
    nccl: fn(&NcclChecks) -> Result<()>,
}

fn f32s(n: usize) -> Tensor {
    Tensor::zeros(DType::F32, &[n])
}

fn i64s(n: usize) -> Tensor {
    Tensor::zeros(DType::I64, &[n])
}

/// `n` tensors of `len` f32s.
fn list(n: usize, len: usize) -> Vec<Tensor> {
    (0..n).map(|_| f32s(len)).collect()
}

fn bcast(root_rank: usize, root_tensor: usize) -> BroadcastOptions {
    BroadcastOptions {
        root_rank,
        root_tensor,
        ..Default::default()
    }
}

fn red(root_rank: usize) -> ReduceOptions {
    ReduceOptions {
        root_rank,
        ..Default::default()
    }
}

fn ar(op: ReduceOp) -> AllreduceOptions {
    AllreduceOptions {
        reduce_op: op,
        ..Default::default()
    }
}

fn gat(root_rank: usize) -> GatherOptions {
    GatherOptions {
        root_rank,
        ..Default::default()
    }
}

fn sca(root_rank: usize) -> ScatterOptions {
    ScatterOptions {
        root_rank,
        ..Default::default()
    }
}

fn rs() -> ReduceScatterOptions {
    ReduceScatterOptions::default()
}

fn a2a() -> AllToAllOptions {
    AllToAllOptions::default()
}

fn ag() -> AllgatherOptions {
    AllgatherOptions::default()
}

/// A row: `$call` on a backend `b`, `$nccl` on the NCCL checks `c`.
macro_rules! case {
    ($name:expr, $op:expr, |$b:ident| $call:expr, |$c:ident| $nccl:expr) => {
        Case {
            name: $name,
            op: $op,
            call: |$b| $call.map(|_| ()),
            nccl: |$c| $nccl.map(|_| ()),
        }
    };
}

fn broadcast_and_reductions() -> Vec<Case> {
    vec![
        case!(
            "broadcast root out of range",
            "broadcast",
            |b| b.broadcast(&[f32s(2)], &bcast(2, 0)),
            |c| c.broadcast(&[f32s(2)], &bcast(2, 0))
        ),
        case!(
            "broadcast of an empty list",
            "broadcast",
            |b| b.broadcast(&[], &bcast(0, 0)),
            |c| c.broadcast(&[], &bcast(0, 0))
        ),
        case!(
            "broadcast of mixed dtypes",
            "broadcast",
            |b| b.broadcast(&[f32s(2), i64s(2)], &bcast(0, 0)),
            |c| c.broadcast(&[f32s(2), i64s(2)], &bcast(0, 0))
        ),
        case!(
            "allreduce of an empty list",
            "allreduce",
            |b| b.all_reduce(&[], &ar(ReduceOp::Sum)),
            |c| c.allreduce(&[], ReduceOp::Sum)
        ),
        case!(
            "allreduce of mixed sizes",
            "allreduce",
            |b| b.all_reduce(&[f32s(2), f32s(3)], &ar(ReduceOp::Sum)),
            |c| c.allreduce(&[f32s(2), f32s(3)], ReduceOp::Sum)
        ),
        case!(
            "bitwise allreduce of floats",
            "allreduce",
            |b| b.all_reduce(&[f32s(2)], &ar(ReduceOp::Band)),
            |c| c.allreduce(&[f32s(2)], ReduceOp::Band)
        ),
        case!(
            "allreduce_coalesced of an empty list",
            "allreduce_coalesced",
            |b| b.all_reduce_coalesced(&[], &AllreduceCoalescedOptions::default()),
            |c| c.allreduce_coalesced(&[], ReduceOp::Sum)
        ),
        case!(
            "allreduce_coalesced of mixed dtypes",
            "allreduce_coalesced",
            |b| b.all_reduce_coalesced(&[f32s(2), i64s(3)], &AllreduceCoalescedOptions::default()),
            |c| c.allreduce_coalesced(&[f32s(2), i64s(3)], ReduceOp::Sum)
        ),
        case!(
            "reduce root out of range",
            "reduce",
            |b| b.reduce(&[f32s(2)], &red(5)),
            |c| c.reduce(&[f32s(2)], &red(5))
        ),
        case!(
            "reduce of two tensors",
            "reduce",
            |b| b.reduce(&list(2, 2), &red(0)),
            |c| c.reduce(&list(2, 2), &red(0))
        ),
        case!(
            "reduce of an empty list",
            "reduce",
            |b| b.reduce(&[], &red(0)),
            |c| c.reduce(&[], &red(0))
        ),
    ]
}

fn gathers() -> Vec<Case> {
    vec![
        case!(
            "allgather of no inputs",
            "allgather",
            |b| b.all_gather(&[], &[], &ag()),
            |c| c.allgather(&[], &[])
        ),
        case!(
            "allgather with one output list too many",
            "allgather",
            |b| b.all_gather(&[list(2, 2), list(2, 2)], &[f32s(2)], &ag()),
            |c| c.allgather(&[list(2, 2), list(2, 2)], &[f32s(2)])
        ),
        case!(
            "allgather output list shorter than the group",
            "allgather",
            |b| b.all_gather(&[list(1, 2)], &[f32s(2)], &ag()),
            |c| c.allgather(&[list(1, 2)], &[f32s(2)])
        ),
        case!(
            "allgather output of another dtype",
            "allgather",
            |b| b.all_gather(&[vec![f32s(2), i64s(2)]], &[f32s(2)], &ag()),
            |c| c.allgather(&[vec![f32s(2), i64s(2)]], &[f32s(2)])
        ),
        case!(
            "allgather output of another size",
            "allgather",
            |b| b.all_gather(&[vec![f32s(2), f32s(3)]], &[f32s(2)], &ag()),
            |c| c.allgather(&[vec![f32s(2), f32s(3)]], &[f32s(2)])
        ),
        case!(
            "_allgather_base dtypes differ",
            "_allgather_base",
            |b| b.all_gather_into_tensor(&i64s(4), &f32s(2), &ag()),
            |c| c.allgather_base(&i64s(4), &f32s(2))
        ),
        case!(
            "_allgather_base output not group-size times the input",
            "_allgather_base",
            |b| b.all_gather_into_tensor(&f32s(3), &f32s(2), &ag()),
            |c| c.allgather_base(&f32s(3), &f32s(2))
        ),
        case!(
            "allgather_coalesced of no inputs",
            "allgather_coalesced",
            |b| b.all_gather_coalesced(&[vec![], vec![]], &[], &ag()),
            |c| c.allgather_coalesced(&[vec![], vec![]], &[])
        ),
        case!(
            "allgather_coalesced with one output list per input",
            "allgather_coalesced",
            |b| b.all_gather_coalesced(&[list(2, 2)], &[f32s(2)], &ag()),
            |c| c.allgather_coalesced(&[list(2, 2)], &[f32s(2)])
        ),
        case!(
            "allgather_coalesced output list of the wrong length",
            "allgather_coalesced",
            |b| b.all_gather_coalesced(&[list(2, 2), list(1, 2)], &list(2, 2), &ag()),
            |c| c.allgather_coalesced(&[list(2, 2), list(1, 2)], &list(2, 2))
        ),
        case!(
            "allgather_coalesced output of another size",
            "allgather_coalesced",
            |b| b.all_gather_coalesced(&[list(1, 2), list(1, 3)], &list(1, 2), &ag()),
            |c| c.allgather_coalesced(&[list(1, 2), list(1, 3)], &list(1, 2))
        ),
        case!(
            "allgather_into_tensor_coalesced lists of two lengths",
            "allgather_into_tensor_coalesced",
            |b| b.all_gather_into_tensor_coalesced(&[f32s(4)], &list(2, 2), &ag()),
            |c| c.allgather_into_tensor_coalesced(&[f32s(4)], &list(2, 2))
        ),
        case!(
            "allgather_into_tensor_coalesced output too small",
            "allgather_into_tensor_coalesced",
            |b| b.all_gather_into_tensor_coalesced(&[f32s(4), f32s(3)], &list(2, 2), &ag()),
            |c| c.allgather_into_tensor_coalesced(&[f32s(4), f32s(3)], &list(2, 2))
        ),
        case!(
            "gather root out of range",
            "gather",
            |b| b.gather(&[list(2, 2)], &[f32s(2)], &gat(2)),
            |c| c.gather(&[list(2, 2)], &[f32s(2)], 2)
        ),
        case!(
            "gather of two inputs",
            "gather",
            |b| b.gather(&[list(2, 2)], &list(2, 2), &gat(0)),
            |c| c.gather(&[list(2, 2)], &list(2, 2), 0)
        ),
        case!(
            "gather root list shorter than the group",
            "gather",
            |b| b.gather(&[list(1, 2)], &[f32s(2)], &gat(0)),
            |c| c.gather(&[list(1, 2)], &[f32s(2)], 0)
        ),
        case!(
            "gather output list off the root",
            "gather",
            |b| b.gather(&[list(2, 2)], &[f32s(2)], &gat(1)),
            |c| c.gather(&[list(2, 2)], &[f32s(2)], 1)
        ),
        case!(
            "gather root list of another dtype",
            "gather",
            |b| b.gather(&[vec![f32s(2), i64s(2)]], &[f32s(2)], &gat(0)),
            |c| c.gather(&[vec![f32s(2), i64s(2)]], &[f32s(2)], 0)
        ),
    ]
}

fn scatters() -> Vec<Case> {
    vec![
        case!(
            "scatter root out of range",
            "scatter",
            |b| b.scatter(&[f32s(2)], &[list(2, 2)], &sca(3)),
            |c| c.scatter(&[f32s(2)], &[list(2, 2)], 3)
        ),
        case!(
            "scatter into two outputs",
            "scatter",
            |b| b.scatter(&list(2, 2), &[list(2, 2)], &sca(0)),
            |c| c.scatter(&list(2, 2), &[list(2, 2)], 0)
        ),
        case!(
            "scatter root list longer than the group",
            "scatter",
            |b| b.scatter(&[f32s(2)], &[list(3, 2)], &sca(0)),
            |c| c.scatter(&[f32s(2)], &[list(3, 2)], 0)
        ),
        case!(
            "scatter input list off the root",
            "scatter",
            |b| b.scatter(&[f32s(2)], &[list(2, 2)], &sca(1)),
            |c| c.scatter(&[f32s(2)], &[list(2, 2)], 1)
        ),
        case!(
            "scatter root list of another size",
            "scatter",
            |b| b.scatter(&[f32s(2)], &[vec![f32s(2), f32s(5)]], &sca(0)),
            |c| c.scatter(&[f32s(2)], &[vec![f32s(2), f32s(5)]], 0)
        ),
        case!(
            "reduce_scatter into two outputs",
            "reduce_scatter",
            |b| b.reduce_scatter(&list(2, 2), &[list(2, 2)], &rs()),
            |c| c.reduce_scatter(&list(2, 2), &[list(2, 2)], ReduceOp::Sum)
        ),
        case!(
            "reduce_scatter input list longer than the group",
            "reduce_scatter",
            |b| b.reduce_scatter(&[f32s(2)], &[list(3, 2)], &rs()),
            |c| c.reduce_scatter(&[f32s(2)], &[list(3, 2)], ReduceOp::Sum)
        ),
        case!(
            "reduce_scatter input of another dtype",
            "reduce_scatter",
            |b| b.reduce_scatter(&[f32s(2)], &[vec![f32s(2), i64s(2)]], &rs()),
            |c| c.reduce_scatter(&[f32s(2)], &[vec![f32s(2), i64s(2)]], ReduceOp::Sum)
        ),
        case!(
            "reduce_scatter own block of another size",
            "reduce_scatter",
            |b| b.reduce_scatter(&[f32s(2)], &[list(2, 3)], &rs()),
            |c| c.reduce_scatter(&[f32s(2)], &[list(2, 3)], ReduceOp::Sum)
        ),
        case!(
            "_reduce_scatter_base dtypes differ",
            "_reduce_scatter_base",
            |b| b.reduce_scatter_tensor(&f32s(2), &i64s(4), &rs()),
            |c| c.reduce_scatter_base(&f32s(2), &i64s(4), ReduceOp::Sum)
        ),
        case!(
            "_reduce_scatter_base input not group-size times the output",
            "_reduce_scatter_base",
            |b| b.reduce_scatter_tensor(&f32s(2), &f32s(5), &rs()),
            |c| c.reduce_scatter_base(&f32s(2), &f32s(5), ReduceOp::Sum)
        ),
        case!(
            "reduce_scatter_tensor_coalesced of no pairs",
            "reduce_scatter_tensor_coalesced",
            |b| b.reduce_scatter_tensor_coalesced(&[], &[], &rs()),
            |c| c.reduce_scatter_tensor_coalesced(&[], &[], ReduceOp::Sum)
        ),
        case!(
            "reduce_scatter_tensor_coalesced input too small",
            "reduce_scatter_tensor_coalesced",
            |b| b.reduce_scatter_tensor_coalesced(&list(2, 2), &[f32s(4), f32s(2)], &rs()),
            |c| c.reduce_scatter_tensor_coalesced(&list(2, 2), &[f32s(4), f32s(2)], ReduceOp::Sum)
        ),
    ]
}

fn all_to_all_and_p2p() -> Vec<Case> {
    vec![
        case!(
            "dim 0 not divisible by the group size",
            "alltoall_base",
            |b| b.all_to_all_single(&f32s(3), &f32s(3), &[], &[], &a2a()),
            |c| c.alltoall_base(&f32s(3), &f32s(3), &[], &[])
        ),
        case!(
            "wrong number of split sizes",
            "alltoall_base",
            |b| b.all_to_all_single(&f32s(4), &f32s(4), &[4], &[2, 2], &a2a()),
            |c| c.alltoall_base(&f32s(4), &f32s(4), &[4], &[2, 2])
        ),
        case!(
            "split sizes that do not sum to dim 0",
            "alltoall_base",
            |b| b.all_to_all_single(&f32s(4), &f32s(4), &[2, 2], &[1, 2], &a2a()),
            |c| c.alltoall_base(&f32s(4), &f32s(4), &[2, 2], &[1, 2])
        ),
        case!(
            "alltoall_base dtypes differ",
            "alltoall_base",
            |b| b.all_to_all_single(&f32s(2), &i64s(2), &[], &[], &a2a()),
            |c| c.alltoall_base(&f32s(2), &i64s(2), &[], &[])
        ),
        case!(
            "what a rank sends itself differs from what it expects",
            "alltoall_base",
            |b| b.all_to_all_single(&f32s(4), &f32s(4), &[1, 3], &[2, 2], &a2a()),
            |c| c.alltoall_base(&f32s(4), &f32s(4), &[1, 3], &[2, 2])
        ),
        case!(
            "alltoall input list shorter than the group",
            "alltoall",
            |b| b.all_to_all(&list(2, 2), &list(1, 2), &a2a()),
            |c| c.alltoall(&list(2, 2), &list(1, 2))
        ),
        case!(
            "alltoall output list longer than the group",
            "alltoall",
            |b| b.all_to_all(&list(3, 2), &list(2, 2), &a2a()),
            |c| c.alltoall(&list(3, 2), &list(2, 2))
        ),
        case!(
            "alltoall dtypes differ",
            "alltoall",
            |b| b.all_to_all(&[f32s(2), i64s(2)], &list(2, 2), &a2a()),
            |c| c.alltoall(&[f32s(2), i64s(2)], &list(2, 2))
        ),
        case!(
            "alltoall own block of another size",
            "alltoall",
            |b| b.all_to_all(&[f32s(3), f32s(2)], &list(2, 2), &a2a()),
            |c| c.alltoall(&[f32s(3), f32s(2)], &list(2, 2))
        ),
        case!(
            "send to a rank outside the group",
            "send",
            |b| b.send(&[f32s(2)], 2, 0),
            |c| c.send(&[f32s(2)], 2)
        ),
        case!(
            "send of two tensors",
            "send",
            |b| b.send(&list(2, 2), 1, 0),
            |c| c.send(&list(2, 2), 1)
        ),
        case!(
            "recv from a rank outside the group",
            "recv",
            |b| b.recv(&[f32s(2)], 7, 0),
            |c| c.recv(&[f32s(2)], 7)
        ),
        case!("recv into no tensor", "recv", |b| b.recv(&[], 1, 0), |c| c
            .recv(&[], 1)),
    ]
}

fn cases() -> Vec<Case> {
    [
        broadcast_and_reductions(),
        gathers(),
        scatters(),
        all_to_all_and_p2p(),
    ]
    .concat()
}

#[test]
fn every_backend_gives_the_same_text_for_each_bad_call() {
    let backends = backends();
    let nccl_checks = NcclChecks::new(0, 2);
    for case in cases() {
        let nccl = (case.nccl)(&nccl_checks).map(|_| ()).expect_err(case.name);
        let prefix = format!("ProcessGroupNCCL::{}: ", case.op);
        let want = nccl
            .message()
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{}: {}", case.name, nccl.message()))
            .to_string();
        for (name, b) in &backends {
            let e = (case.call)(b.as_ref()).expect_err(case.name);
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

/// What a backend refuses for its own hardware comes after the shared checks, in its own words.
#[test]
fn backend_rules_come_after_the_shared_checks() {
    let c = NcclChecks::new(0, 2);
    let e = c.allreduce(&list(2, 2), ReduceOp::Sum).unwrap_err();
    assert_eq!(
        e.message(),
        "ProcessGroupNCCL::allreduce: requires a single-element tensor list"
    );
    let e = c
        .reduce_scatter(&[f32s(2)], &[vec![f32s(2), f32s(3)]], ReduceOp::Sum)
        .unwrap_err();
    assert!(
        e.message()
            .contains("uneven input blocks are not supported"),
        "{e}"
    );
    let (_, gloo) = backends().remove(0);
    let e = gloo.send(&[f32s(2)], 0, 0).unwrap_err();
    assert_eq!(
        e.message(),
        "ProcessGroupGloo::send: invalid destination rank 0 (rank 0 of a group of 2)"
    );
}

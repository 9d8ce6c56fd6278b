use super::*;
use crate::ReduceOp;
use std::borrow::Cow;

fn t(v: &[f32]) -> Tensor {
    Tensor::from_vec(v.to_vec())
}

/// One op of every variant, with distinct tensors on each side.
fn every_op() -> Vec<Op<'static>> {
    let (a, b) = (t(&[1.0]), t(&[1.0, 2.0]));
    vec![
        Op::Broadcast {
            tensors: vec![a.clone()].into(),
            opts: Default::default(),
        },
        Op::AllReduce {
            tensors: vec![a.clone()].into(),
            opts: Default::default(),
        },
        Op::AllReduceCoalesced {
            tensors: vec![a.clone(), b.clone()].into(),
            opts: Default::default(),
        },
        Op::Reduce {
            tensors: vec![a.clone()].into(),
            opts: Default::default(),
        },
        Op::AllGather {
            outputs: vec![vec![b.clone(), b.clone()]].into(),
            inputs: vec![a.clone()].into(),
            opts: Default::default(),
        },
        Op::AllGatherIntoTensor {
            output: Cow::Owned(b.clone()),
            input: Cow::Owned(a.clone()),
            opts: Default::default(),
        },
        Op::AllGatherCoalesced {
            outputs: vec![vec![b.clone()]].into(),
            inputs: vec![a.clone()].into(),
            opts: Default::default(),
        },
        Op::AllGatherIntoTensorCoalesced {
            outputs: vec![b.clone()].into(),
            inputs: vec![a.clone()].into(),
            opts: Default::default(),
        },
        Op::Gather {
            outputs: vec![vec![b.clone()]].into(),
            inputs: vec![a.clone()].into(),
            opts: Default::default(),
        },
        Op::Scatter {
            outputs: vec![b.clone()].into(),
            inputs: vec![vec![a.clone()]].into(),
            opts: Default::default(),
        },
        Op::ReduceScatter {
            outputs: vec![b.clone()].into(),
            inputs: vec![vec![a.clone()]].into(),
            opts: Default::default(),
        },
        Op::ReduceScatterTensor {
            output: Cow::Owned(b.clone()),
            input: Cow::Owned(a.clone()),
            opts: Default::default(),
        },
        Op::ReduceScatterTensorCoalesced {
            outputs: vec![b.clone()].into(),
            inputs: vec![a.clone()].into(),
            opts: Default::default(),
        },
        Op::AllToAllSingle {
            output: Cow::Owned(b.clone()),
            input: Cow::Owned(a.clone()),
            output_split_sizes: vec![].into(),
            input_split_sizes: vec![].into(),
            opts: Default::default(),
        },
        Op::AllToAll {
            outputs: vec![b.clone()].into(),
            inputs: vec![a.clone()].into(),
            opts: Default::default(),
        },
        Op::Barrier {
            opts: Default::default(),
        },
        Op::Send {
            tensors: vec![a.clone()].into(),
            dst: 1,
            tag: 0,
        },
        Op::Recv {
            tensors: vec![a.clone()].into(),
            src: 1,
            tag: 0,
        },
        Op::RecvAnysource {
            tensors: vec![a].into(),
            tag: 0,
        },
    ]
}

#[test]
fn names_and_op_types_are_pytorchs() {
    let names: Vec<_> = every_op().iter().map(Op::name).collect();
    assert_eq!(
        names,
        [
            "broadcast",
            "allreduce",
            "allreduce_coalesced",
            "reduce",
            "allgather",
            "_allgather_base",
            "allgather_coalesced",
            "allgather_into_tensor_coalesced",
            "gather",
            "scatter",
            "reduce_scatter",
            "_reduce_scatter_base",
            "reduce_scatter_tensor_coalesced",
            "alltoall_base",
            "alltoall",
            "barrier",
            "send",
            "recv",
            "recvAnysource"
        ]
    );
    let op = &every_op()[13];
    assert_eq!(op.op_type(), OpType::AlltoallBase);
    assert_eq!(
        op.unsupported_by("x").to_string(),
        DistError::unsupported("Backend x does not support alltoall_base").to_string()
    );
}

/// Inputs hold the one-element tensors, outputs the two-element ones (in-place ops and
/// receives: outputs only; a send: inputs only).
#[test]
fn sides_put_each_tensor_where_pytorch_does() {
    for op in every_op() {
        let (ins, outs) = op.sides();
        let in_place = matches!(
            op,
            Op::Broadcast { .. }
                | Op::AllReduce { .. }
                | Op::AllReduceCoalesced { .. }
                | Op::Reduce { .. }
                | Op::Recv { .. }
                | Op::RecvAnysource { .. }
        );
        if in_place {
            assert!(ins.is_empty(), "{op:?}");
            assert!(!outs.is_empty(), "{op:?}");
        } else if matches!(op, Op::Send { .. }) {
            assert!(outs.is_empty() && !ins.is_empty());
        } else if !matches!(op, Op::Barrier { .. }) {
            assert!(ins.iter().all(|t| t.numel() == 1), "{op:?}");
            assert!(outs.iter().all(|t| t.numel() == 2), "{op:?}");
            assert!(!ins.is_empty() && !outs.is_empty(), "{op:?}");
        }
        assert_eq!(op.nbytes(), op.tensors().map(Tensor::nbytes).sum::<usize>());
    }
}

#[test]
fn mapping_keeps_the_layout_and_reports_each_side() {
    for op in every_op() {
        let (ins, outs) = op.sides();
        let want: Vec<(Side, usize)> = ins
            .iter()
            .map(|t| (Side::Input, t.numel()))
            .chain(outs.iter().map(|t| (Side::Output, t.numel())))
            .collect();
        let mut seen = Vec::new();
        let name = op.name();
        let mapped = op
            .try_map_tensors(|side, t| {
                seen.push((side, t.numel()));
                Ok(Tensor::from_vec(vec![9.0f32; t.numel()]))
            })
            .unwrap();
        seen.sort_by_key(|(s, _)| *s == Side::Output);
        assert_eq!(seen, want, "{name}");
        assert_eq!(mapped.name(), name);
        assert!(mapped
            .tensors()
            .all(|t| t.to_vec::<f32>().unwrap().iter().all(|x| *x == 9.0)));
    }
    let failed = every_op()[1]
        .clone()
        .try_map_tensors(|_, _| Err(DistError::invalid("no")));
    assert!(failed.is_err());
}

#[test]
fn check_applies_the_ops_own_check() {
    let checks = Checks {
        backend: "ProcessGroupGloo",
        rank: 0,
        size: 2,
    };
    let ok = Op::AllReduce {
        tensors: vec![t(&[1.0])].into(),
        opts: Default::default(),
    };
    ok.check(&checks, false).unwrap();
    let bad = Op::AllReduce {
        tensors: vec![t(&[1.0]), t(&[1.0, 2.0])].into(),
        opts: AllreduceOptions {
            reduce_op: ReduceOp::Sum,
            ..Default::default()
        },
    };
    let e = bad.check(&checks, false).unwrap_err().to_string();
    assert!(e.contains("ProcessGroupGloo::allreduce"), "{e}");
    let to_self = Op::Send {
        tensors: vec![t(&[1.0])].into(),
        dst: 0,
        tag: 0,
    };
    assert!(to_self.check(&checks, false).is_err());
    to_self.check(&checks, true).unwrap();
}

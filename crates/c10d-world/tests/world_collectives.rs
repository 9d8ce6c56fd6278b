//! Free-function collectives: Python-layer checks, p2p and batch_isend_irecv, coalescing,
//! object collectives and TORCH_DISTRIBUTED_DEBUG=DETAIL mismatch reports.

use c10d_testing::world as world_common;

use c10d_core::{c32, DType, DebugLevel, ErrorKind, ReduceOp, Tensor};
use c10d_world::{GroupMember, GroupOptions, P2POp, Rank};
use world_common::*;

#[test]
fn python_layer_checks() {
    run(2, |w, r| {
        let f = Tensor::from_vec(vec![1.0f32; 2]);
        let d = Tensor::from_vec(vec![1.0f64; 2]);
        let e = w.all_gather(&[f.clone(), d.clone()], &f).run().unwrap_err();
        assert!(
            e.to_string().contains("tensors with different dtypes"),
            "{e}"
        );
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let e = w
            .all_to_all(&[f.clone(), d.clone()], &[f.clone(), f.clone()])
            .run()
            .unwrap_err();
        assert!(
            e.to_string().contains("tensors with different dtypes"),
            "{e}"
        );
        // complex and its real dtype mix is allowed by the check
        let c = Tensor::from_vec(vec![c32 { re: 1.0, im: 2.0 }]);
        let e = w.all_reduce(&c).op(ReduceOp::Max).run().unwrap_err();
        assert!(
            e.to_string()
                .contains("all_reduce does not support ReduceOp.MAX on complex tensors"),
            "{e}"
        );
        w.all_reduce(&c).run().unwrap();
        // scatter_list rules
        let out = Tensor::zeros(DType::F32, &[2]);
        let list = vec![f.clone(), f.clone()];
        let e = w
            .scatter(&out)
            .scatter_list(if r == 1 { &list } else { &[] })
            .src(0)
            .run()
            .unwrap_err();
        let expect = if r == 0 {
            "Argument ``scatter_list`` must be specified on source rank."
        } else {
            "Argument ``scatter_list`` must NOT be specified on non-source ranks."
        };
        assert_eq!(e.to_string(), expect);
        let e = w
            .gather(&f)
            .gather_list(if r == 1 { &list } else { &[] })
            .dst(0)
            .run()
            .unwrap_err();
        assert!(
            e.to_string().contains("Argument ``gather_list`` must"),
            "{e}"
        );
        // both / neither root: a `Rank` is one of the two, so only PyTorch's optional pairs
        // (P2POp, the object collectives) can still give both or neither
        let e = Rank::from_pair(Some(0), Some(0)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Can't specify both group_rank and global_rank"
        );
        let e = Rank::from_pair(None, None).unwrap_err();
        assert_eq!(e.to_string(), "Must specify global_rank or group_rank");
        // send to self
        let e = w.send(&f, r).run().unwrap_err();
        assert!(
            e.to_string()
                .starts_with("Invalid destination rank: destination rank should not be the same"),
            "{e}"
        );
        let e = w.recv(&f).src(Rank::Group(r)).run().unwrap_err();
        assert!(e.to_string().starts_with("Invalid source rank"), "{e}");
        let both = P2POp::new("isend", f.clone(), Some(1 - r), None, 0, Some(1 - r)).unwrap();
        let e = w.batch_isend_irecv(&[both]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Can't specify both group_rank and global_rank"
        );
        w.barrier().run().unwrap();
    });
}

#[test]
fn all_reduce_of_empty_tensors_succeeds() {
    let out = run(2, |w, _| {
        let t = Tensor::zeros(DType::F32, &[0]);
        w.all_reduce(&t).run().map(|()| t.numel())
    });
    assert_eq!(out, vec![Ok(0), Ok(0)]);
}

#[test]
fn all_ops_route_data() {
    let out = run(3, |w, r| {
        let n = 3;
        // all_gather / into_tensor
        let t = Tensor::from_vec(vec![r as i32; 2]);
        let outs: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(DType::I32, &[2])).collect();
        w.all_gather(&outs, &t).run().unwrap();
        let flat = Tensor::zeros(DType::I32, &[6]);
        w.all_gather_into_tensor(&flat, &t).run().unwrap();
        assert_eq!(flat.to_vec::<i32>().unwrap(), vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(outs[2].to_vec::<i32>().unwrap(), vec![2, 2]);
        // reduce to 1
        let x = Tensor::from_vec(vec![(r + 1) as i64]);
        w.reduce(&x, 1).op(ReduceOp::Product).run().unwrap();
        if r == 1 {
            assert_eq!(x.to_vec::<i64>().unwrap(), vec![6]);
        }
        // gather / scatter
        let g: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(DType::I32, &[2])).collect();
        let gather_list: &[Tensor] = if r == 2 { &g } else { &[] };
        w.gather(&t).gather_list(gather_list).dst(2).run().unwrap();
        if r == 2 {
            assert_eq!(g[1].to_vec::<i32>().unwrap(), vec![1, 1]);
        }
        let sl: Vec<Tensor> = (0..n)
            .map(|i| Tensor::from_vec(vec![i as i32 * 7; 2]))
            .collect();
        let so = Tensor::zeros(DType::I32, &[2]);
        let scatter_list: &[Tensor] = if r == 0 { &sl } else { &[] };
        w.scatter(&so).scatter_list(scatter_list).run().unwrap();
        assert_eq!(so.to_vec::<i32>().unwrap(), vec![r as i32 * 7; 2]);
        // reduce_scatter: chunk i on rank r holds r+i+1
        let ins: Vec<Tensor> = (0..n)
            .map(|i| Tensor::from_vec(vec![(r + i + 1) as f32; 5]))
            .collect();
        let rs = Tensor::zeros(DType::F32, &[5]);
        w.reduce_scatter(&rs, &ins).run().unwrap();
        let expect: f32 = (0..n).map(|k| (k + r + 1) as f32).sum();
        assert_eq!(rs.to_vec::<f32>().unwrap(), vec![expect; 5]);
        let big = Tensor::from_vec((0..6).map(|i| (i + r) as f32).collect::<Vec<_>>());
        let small = Tensor::zeros(DType::F32, &[2]);
        w.reduce_scatter_tensor(&small, &big)
            .op(ReduceOp::Max)
            .run()
            .unwrap();
        assert_eq!(
            small.to_vec::<f32>().unwrap(),
            vec![(2 * r + 2) as f32, (2 * r + 3) as f32]
        );
        // all_to_all: rank i sends i*100+j to j
        let ai: Vec<Tensor> = (0..n)
            .map(|j| Tensor::from_vec(vec![(r * 100 + j) as i64]))
            .collect();
        let ao: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(DType::I64, &[1])).collect();
        w.all_to_all(&ao, &ai).run().unwrap();
        let got: Vec<i64> = ao.iter().map(|t| t.to_vec::<i64>().unwrap()[0]).collect();
        assert_eq!(
            got,
            (0..n).map(|j| (j * 100 + r) as i64).collect::<Vec<_>>()
        );
        // uneven all_to_all_single
        let in_splits: Vec<usize> = (0..n).map(|g| g + 1).collect();
        let input = Tensor::from_vec(vec![r as i64; in_splits.iter().sum()]);
        let out_splits = vec![r + 1; n];
        let output = Tensor::zeros(DType::I64, &[(r + 1) * n]);
        w.all_to_all_single(&output, &input)
            .output_split_sizes(&out_splits)
            .input_split_sizes(&in_splits)
            .run()
            .unwrap();
        // coalesced all_reduce through the coalescing manager
        let a = Tensor::from_vec(vec![1.0f64; 3]);
        let b = Tensor::from_vec(vec![2.0f64; 2]);
        let (_, cm) = w
            .coalescing_manager(None, true, || {
                w.all_reduce(&a).run()?;
                w.all_reduce(&b).run()?;
                Ok(())
            })
            .unwrap();
        cm.wait().unwrap();
        assert_eq!(a.to_vec::<f64>().unwrap(), vec![3.0; 3]);
        assert_eq!(b.to_vec::<f64>().unwrap(), vec![6.0; 2]);
        output.to_vec::<i64>().unwrap()
    });
    assert_eq!(out[2], vec![0, 0, 0, 1, 1, 1, 2, 2, 2]);
}

#[test]
fn p2p_and_batch_isend_irecv() {
    let out = run(3, |w, r| {
        let n = 3;
        let e =
            P2POp::new("send", Tensor::from_vec(vec![0u8]), Some(0), None, 0, None).unwrap_err();
        assert!(e.to_string().starts_with("Invalid ``op``"), "{e}");
        let e = w.batch_isend_irecv(&[]).unwrap_err();
        assert!(e.to_string().starts_with("Invalid ``p2p_op_list``"), "{e}");
        let world = GroupMember::from(w.world_group().unwrap());
        let mut a = P2POp::isend(Tensor::from_vec(vec![0u8]), (r + 1) % n);
        a.group = Some(world);
        let b = P2POp::irecv(Tensor::from_vec(vec![0u8]), (r + n - 1) % n);
        // a names WORLD explicitly, b uses None: different groups for PyTorch's check
        let e = w.batch_isend_irecv(&[a, b]).unwrap_err();
        assert_eq!(e.to_string(), "All ops need to use the same group.");
        // ring exchange with tags
        let recv = Tensor::zeros(DType::I64, &[2]);
        let ops = vec![
            P2POp::new("irecv", recv.clone(), Some((r + n - 1) % n), None, 7, None).unwrap(),
            P2POp::new(
                "isend",
                Tensor::from_vec(vec![r as i64; 2]),
                Some((r + 1) % n),
                None,
                7,
                None,
            )
            .unwrap(),
        ];
        for wk in w.batch_isend_irecv(&ops).unwrap() {
            wk.wait().unwrap();
        }
        // blocking send/recv 0 -> 2 with a group rank
        let t = Tensor::from_vec(vec![42.0f32]);
        if r == 0 {
            w.send(&t, Rank::Group(2)).tag(3).run().unwrap();
        } else if r == 2 {
            let z = Tensor::zeros(DType::F32, &[1]);
            assert_eq!(w.recv(&z).src(0).tag(3).run().unwrap(), 0);
            assert_eq!(z.to_vec::<f32>().unwrap(), vec![42.0]);
        }
        recv.to_vec::<i64>().unwrap()[0]
    });
    assert_eq!(out, vec![2, 0, 1]);
}

#[test]
fn object_collectives() {
    let out = run(3, |w, r| {
        let all: Vec<usize> = w.all_gather_object(&r).run().unwrap();
        assert_eq!(all, vec![0, 1, 2]);
        let strs: Vec<String> = w.all_gather_object(&"x".repeat(r * 5)).run().unwrap();
        assert_eq!(strs[2], "xxxxxxxxxx");
        let g = w.gather_object(&(r, format!("r{r}"))).dst(0).run().unwrap();
        assert_eq!(g.is_some(), r == 0);
        if let Some(g) = g {
            assert_eq!(g[2], (2, "r2".to_string()));
        }
        let mut objs: Vec<Option<i32>> = vec![if r == 0 { Some(99) } else { None }];
        w.broadcast_object_list(&mut objs).src(0).run().unwrap();
        assert_eq!(objs, vec![Some(99)]);
        let inputs: Vec<Vec<u32>> = (0..3).map(|i| vec![i; i as usize]).collect();
        let scatter = w.scatter_object_list().src(1);
        let scatter = if r == 1 {
            scatter.scatter_object_input_list(&inputs)
        } else {
            scatter
        };
        let mine: Option<Vec<u32>> = scatter.run().unwrap();
        assert_eq!(mine.unwrap(), vec![r as u32; r]);
        let mut got: Vec<Option<String>> = vec![None, None];
        if r == 0 {
            let objs = [Some("a".to_string()), None];
            w.send_object_list(&objs, 1).run().unwrap();
        } else if r == 1 {
            assert_eq!(w.recv_object_list(&mut got).src(0).run().unwrap(), 0);
        }
        // on a 2-rank local-synchronization subgroup, with global src/dst
        if r >= 1 {
            let sub = w
                .new_group(
                    Some(&[1, 2]),
                    GroupOptions {
                        use_local_synchronization: true,
                        ..Default::default()
                    },
                )
                .unwrap();
            let v: Vec<usize> = w.all_gather_object(&(r * 10)).group(&sub).run().unwrap();
            assert_eq!(v, vec![10, 20]);
            let mut b = vec![r];
            w.broadcast_object_list(&mut b)
                .src(2)
                .group(&sub)
                .run()
                .unwrap();
            assert_eq!(b, vec![2]);
        }
        got
    });
    assert_eq!(out[1], vec![Some("a".to_string()), None]);
    assert_eq!(out[0], vec![None, None]);
}

fn detail_setup(w: &c10d_world::World, _r: usize) {
    w.set_debug_level(DebugLevel::Detail);
    w.set_detail_helper_backend("store");
}

#[test]
fn detail_passes_matching_collectives() {
    let out = run_with(2, detail_setup, |w, r| {
        assert_eq!(w.get_debug_level().unwrap(), DebugLevel::Detail);
        let t = Tensor::from_vec(vec![r as f32 + 1.0; 2]);
        w.all_reduce(&t).run().unwrap();
        w.barrier().run().unwrap();
        t.to_vec::<f32>().unwrap()
    });
    assert_eq!(out[0], vec![3.0, 3.0]);
}

#[test]
fn detail_reports_op_mismatch() {
    let out = run_with(2, detail_setup, |w, r| {
        let e = if r == 0 {
            w.all_reduce(&Tensor::from_vec(vec![1.0f32; 2]))
                .run()
                .unwrap_err()
        } else {
            w.broadcast(&Tensor::from_vec(vec![1.0f32; 2]), 0)
                .run()
                .unwrap_err()
        };
        e.to_string()
    });
    let e0 = &out[0];
    assert!(e0.starts_with("Detected mismatch between collectives on ranks. Rank 0 is running collective: CollectiveFingerPrint("), "{e0}");
    assert!(
        e0.contains(
            "OpType=ALLREDUCE, TensorShape=[2], TensorDtypes=Float, TensorDeviceTypes=CPU)"
        ),
        "{e0}"
    );
    assert!(
        e0.contains("but Rank 1 is running collective: CollectiveFingerPrint("),
        "{e0}"
    );
    assert!(e0.contains("SequenceNumber"), "{e0}");
    assert!(
        e0.contains("Collectives differ in the following aspects: "),
        "{e0}"
    );
    assert!(e0.contains("Op type: ALLREDUCEvs BROADCAST"), "{e0}");
    assert!(
        out[1].contains("Op type: BROADCASTvs ALLREDUCE"),
        "{}",
        out[1]
    );
}

#[test]
fn detail_reports_shape_and_dtype_mismatch() {
    let out = run_with(2, detail_setup, |w, r| {
        let t = if r == 0 {
            Tensor::from_vec(vec![1.0f32; 2])
        } else {
            Tensor::from_vec(vec![1.0f32; 3])
        };
        let shape = w.all_reduce(&t).run().unwrap_err().to_string();
        let t = if r == 0 {
            Tensor::from_vec(vec![1.0f64; 2])
        } else {
            Tensor::from_vec(vec![1.0f32; 2])
        };
        let dtype = w.all_reduce(&t).run().unwrap_err().to_string();
        let t = if r == 0 {
            Tensor::zeros(DType::I64, &[2, 2])
        } else {
            Tensor::zeros(DType::I64, &[4])
        };
        let ndim = w.all_reduce(&t).run().unwrap_err().to_string();
        (shape, dtype, ndim)
    });
    assert!(
        out[0].0.contains("Tensor Tensor shapes: 2vs 3"),
        "{}",
        out[0].0
    );
    assert!(
        out[0].1.contains("Tensor Tensor dtypes: Doublevs Float"),
        "{}",
        out[0].1
    );
    assert!(out[1].1.contains("TensorDtypes=Float"), "{}", out[1].1);
    assert!(
        out[0].2.contains("TensorShape=[2, 2], TensorDtypes=Long"),
        "{}",
        out[0].2
    );
    assert!(
        out[0].2.contains("Tensor Tensor shapes: 2, 2vs 4"),
        "{}",
        out[0].2
    );
}

#[test]
fn detail_without_helper_backend_errors() {
    register();
    let s = store();
    let w = c10d_world::World::new();
    w.set_debug_level(DebugLevel::Detail);
    w.set_detail_helper_backend("no-such-backend");
    let e = w.init_process_group(opts(&s, 0, 1)).unwrap_err();
    assert!(
        e.to_string()
            .contains("ProcessGroupWrapper unsupported without GLOO backend"),
        "{e}"
    );
}

#[test]
fn detail_catches_more_op_pairs() {
    let out = run_with(2, detail_setup, |w, r| {
        // reduce vs barrier
        let e1 = if r == 0 {
            w.reduce(&Tensor::from_vec(vec![1i64; 2]), 0)
                .run()
                .unwrap_err()
        } else {
            w.barrier().run().unwrap_err()
        };
        // _allgather_base vs _reduce_scatter_base
        let e2 = if r == 0 {
            w.all_gather_into_tensor(
                &Tensor::zeros(DType::F32, &[4]),
                &Tensor::zeros(DType::F32, &[2]),
            )
            .run()
            .unwrap_err()
        } else {
            w.reduce_scatter_tensor(
                &Tensor::zeros(DType::F32, &[2]),
                &Tensor::zeros(DType::F32, &[4]),
            )
            .run()
            .unwrap_err()
        };
        // scatter with different output shapes
        let out = if r == 0 {
            Tensor::zeros(DType::F32, &[2])
        } else {
            Tensor::zeros(DType::F32, &[3])
        };
        let list = vec![
            Tensor::zeros(DType::F32, &[2]),
            Tensor::zeros(DType::F32, &[2]),
        ];
        let e3 = w
            .scatter(&out)
            .scatter_list(if r == 0 { &list } else { &[] })
            .src(0)
            .run()
            .unwrap_err();
        (e1.to_string(), e2.to_string(), e3.to_string())
    });
    let (a, b, c) = &out[0];
    assert!(
        a.contains("OpType=REDUCE, TensorShape=[2], TensorDtypes=Long"),
        "{a}"
    );
    assert!(a.contains("but Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=0OpType=BARRIER)"), "{a}");
    assert!(a.contains("Op type: REDUCEvs BARRIER"), "{a}");
    assert!(
        b.contains("Op type: _ALLGATHER_BASEvs _REDUCE_SCATTER_BASE"),
        "{b}"
    );
    assert!(
        c.contains("OpType=SCATTER") && c.contains("Tensor Tensor shapes: 2vs 3"),
        "{c}"
    );
    assert!(
        out[1].0.contains("Op type: BARRIERvs REDUCE"),
        "{}",
        out[1].0
    );
}

#[test]
fn single_tensor_variants() {
    let out = run(3, |w, r| {
        let t = Tensor::from_vec_shaped(vec![r as i16; 4], &[2, 2]).unwrap();
        // stacked output on the root, group rank given
        let g = Tensor::zeros(DType::I16, &[3, 2, 2]);
        let mut gather = w.gather_single(&t).dst(Rank::Group(1));
        if r == 1 {
            gather = gather.gather_tensor(&g);
        }
        gather.run().unwrap();
        if r == 1 {
            let e = w.gather_into_tensor(&t).dst(1).run().unwrap_err();
            assert_eq!(
                e.to_string(),
                "gather_tensor must be specified on the destination rank"
            );
            let bad = Tensor::zeros(DType::I16, &[5]);
            assert!(w
                .gather_into_tensor(&t)
                .dst(1)
                .gather_tensor(&bad)
                .run()
                .unwrap_err()
                .to_string()
                .contains("world_size (3)"));
        }
        let ag = Tensor::zeros(DType::I16, &[12]);
        w.all_gather_single(&ag, &t).run().unwrap();
        let rs = Tensor::zeros(DType::I16, &[4]);
        w.reduce_scatter_single(&rs, &ag).run().unwrap();
        (
            g.to_vec::<i16>().unwrap(),
            ag.to_vec::<i16>().unwrap(),
            rs.to_vec::<i16>().unwrap(),
        )
    });
    assert_eq!(out[1].0, vec![0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
    assert_eq!(out[0].0, vec![0; 12]);
    assert_eq!(out[2].1, vec![0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
    assert_eq!(out[2].2, vec![6, 6, 6, 6]);
}

#[test]
fn coalescing_manager_fast_paths_and_mixed_ops() {
    let out = run(2, |w, r| {
        let (i1, i2) = (
            Tensor::from_vec(vec![r as i32; 2]),
            Tensor::from_vec(vec![r as i32 + 10; 3]),
        );
        let (o1, o2) = (
            Tensor::zeros(DType::I32, &[4]),
            Tensor::zeros(DType::I32, &[6]),
        );
        w.coalescing_manager(None, false, || {
            w.all_gather_into_tensor(&o1, &i1).run()?;
            w.all_gather_into_tensor(&o2, &i2).run()
        })
        .unwrap();
        let big = Tensor::from_vec(vec![1.0f32; 4]);
        let small = Tensor::zeros(DType::F32, &[2]);
        let (recorded, cm) = w
            .coalescing_manager(None, true, || {
                w.reduce_scatter_tensor(&small, &big)
                    .op(ReduceOp::Avg)
                    .start()
            })
            .unwrap();
        assert_eq!(cm.works.len(), 1);
        // PyTorch's _IllegalWork: the recorded op's own work cannot be waited on
        let e = recorded.wait().unwrap_err().to_string();
        assert!(
            e.starts_with("Illegal to call wait in IllegalWork class"),
            "{e}"
        );
        cm.wait().unwrap();
        let a = Tensor::from_vec(vec![1.0f32]);
        let e = w
            .coalescing_manager(None, false, || {
                w.all_reduce(&a).run()?;
                w.all_gather_into_tensor(&o1, &i1).run()
            })
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Coalescing manager does not support fast-path coalescing of all_reduce, yet all_gather_into_tensor is still recorded in coalescing manager."
        );
        // the World is usable afterwards
        w.all_reduce(&a).run().unwrap();
        (
            o1.to_vec::<i32>().unwrap(),
            o2.to_vec::<i32>().unwrap(),
            small.to_vec::<f32>().unwrap(),
            a.to_vec::<f32>().unwrap(),
        )
    });
    assert_eq!(out[0].0, vec![0, 0, 1, 1]);
    assert_eq!(out[1].1, vec![10, 10, 10, 11, 11, 11]);
    assert_eq!(out[0].2, vec![1.0, 1.0]);
    assert_eq!(out[0].3, vec![2.0]);
}

/// A backend with only all_reduce and barrier (no fused coalesced ops).
struct NoFuse(std::sync::Arc<dyn c10d_core::Backend>);

impl c10d_core::Backend for NoFuse {
    fn name(&self) -> &str {
        "nofuse"
    }
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn device_type(&self) -> c10d_core::DeviceType {
        self.0.device_type()
    }
    fn timeout(&self) -> std::time::Duration {
        self.0.timeout()
    }
    fn set_timeout(&self, t: std::time::Duration) {
        self.0.set_timeout(t)
    }
}

impl c10d_core::Collectives for NoFuse {
    fn run(&self, op: c10d_core::Op) -> c10d_core::Result<c10d_core::Work> {
        match op {
            c10d_core::Op::AllReduce { .. } | c10d_core::Op::Barrier { .. } => self.0.run(op),
            op => Err(op.unsupported_by("nofuse")),
        }
    }
}

#[test]
fn coalescing_manager_falls_back_to_single_ops() {
    use std::sync::Arc;
    let inner = c10d_testing::StoreBackend::creator("inner");
    c10d_world::register_backend(
        "nofuse",
        Arc::new(move |a: &c10d_world::BackendCreateArgs| {
            let b = inner(a)?.expect("store backend");
            let nf: Arc<dyn c10d_core::Backend> = Arc::new(NoFuse(b));
            Ok(Some(nf))
        }),
        Some(&[c10d_core::DeviceType::Cpu]),
        false,
    );
    let out = run(2, |w, r| {
        let g = w
            .new_group(
                None,
                GroupOptions {
                    backend: Some("nofuse".into()),
                    ..Default::default()
                },
            )
            .unwrap();
        let (a, b) = (
            Tensor::from_vec(vec![r as i64 + 1]),
            Tensor::from_vec(vec![10i64; 2]),
        );
        let (_, cm) = w
            .coalescing_manager(Some(&g), true, || {
                w.all_reduce(&a).group(&g).run()?;
                w.all_reduce(&b).group(&g).run()
            })
            .unwrap();
        assert_eq!(
            cm.works.len(),
            2,
            "one work per op when the backend cannot fuse"
        );
        cm.wait().unwrap();
        let e = w
            .all_reduce_coalesced(std::slice::from_ref(&a))
            .group(&g)
            .run()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Backend nofuse does not support allreduce_coalesced"
        );
        (a.to_vec::<i64>().unwrap(), b.to_vec::<i64>().unwrap())
    });
    assert_eq!(out[0], (vec![3], vec![20, 20]));
}

#[test]
fn detail_checks_split_groups_too() {
    let out = run_with(3, detail_setup, |w, r| {
        let g = w
            .split_group(
                None,
                &[vec![0, 1], vec![2]],
                c10d_world::SplitOptions::default(),
            )
            .unwrap();
        if r < 2 {
            let t = if r == 0 {
                Tensor::zeros(DType::F32, &[2])
            } else {
                Tensor::zeros(DType::F32, &[5])
            };
            Some(w.all_reduce(&t).group(&g).run().unwrap_err().to_string())
        } else {
            None
        }
    });
    let e = out[0].as_ref().unwrap();
    assert!(e.contains("Tensor Tensor shapes: 2vs 5"), "{e}");
}

/// The ops a [`Coalescer`] deferred while its block is open.
type Deferred = Vec<Box<dyn FnOnce() -> c10d_core::Result<c10d_core::Work> + Send>>;

/// A backend that coalesces as NCCL does: while a block is open, its ops are only queued and
/// run when the block ends (a block left open swallows every later op).
struct Coalescer {
    inner: std::sync::Arc<dyn c10d_core::Backend>,
    block: std::sync::Mutex<Option<Deferred>>,
}

impl Coalescer {
    fn run_or_defer(
        &self,
        op: c10d_core::OpType,
        f: impl FnOnce() -> c10d_core::Result<c10d_core::Work> + Send + 'static,
    ) -> c10d_core::Result<c10d_core::Work> {
        let mut block = self.block.lock().unwrap();
        match block.as_mut() {
            Some(q) => {
                q.push(Box::new(f));
                Ok(c10d_core::Work::completed(op, 0, Ok(()), Vec::new()))
            }
            None => f(),
        }
    }
}

impl c10d_core::Collectives for Coalescer {
    /// all_reduce, send and recv wait for the block's end; barrier runs at once.
    fn run(&self, op: c10d_core::Op) -> c10d_core::Result<c10d_core::Work> {
        use c10d_core::Op;
        match op {
            Op::AllReduce { .. } | Op::Send { .. } | Op::Recv { .. } => {
                let (b, kind) = (self.inner.clone(), op.op_type());
                let op = op.into_owned();
                self.run_or_defer(kind, move || b.run(op))
            }
            Op::Barrier { .. } => self.inner.run(op),
            op => Err(op.unsupported_by("coalescer")),
        }
    }
}

impl c10d_core::Backend for Coalescer {
    c10d_core::delegate_backend!(inner: rank, size, device_type, timeout, set_timeout);
    fn name(&self) -> &str {
        "coalescer"
    }
    fn supports_coalescing(&self) -> bool {
        true
    }
    fn start_coalescing(&self) -> c10d_core::Result<()> {
        let mut block = self.block.lock().unwrap();
        if block.is_some() {
            return Err(c10d_core::DistError::invalid("already coalescing"));
        }
        *block = Some(Vec::new());
        Ok(())
    }
    fn end_coalescing(&self) -> c10d_core::Result<c10d_core::Work> {
        let ops = self.block.lock().unwrap().take().expect("a block is open");
        for op in ops {
            op()?.wait()?;
        }
        Ok(c10d_core::Work::completed(
            c10d_core::OpType::Coalesced,
            0,
            Ok(()),
            Vec::new(),
        ))
    }
}

#[test]
fn a_failed_batch_isend_irecv_ends_its_coalescing_block() {
    use std::sync::Arc;
    let inner = c10d_testing::StoreBackend::creator("inner");
    c10d_world::register_backend(
        "coalescer",
        Arc::new(move |a: &c10d_world::BackendCreateArgs| {
            let b = inner(a)?.expect("store backend");
            let c: Arc<dyn c10d_core::Backend> = Arc::new(Coalescer {
                inner: b,
                block: std::sync::Mutex::new(None),
            });
            Ok(Some(c))
        }),
        Some(&[c10d_core::DeviceType::Cpu]),
        false,
    );
    let out = run(2, |w, r| {
        let opts = GroupOptions {
            backend: Some("coalescer".into()),
            ..Default::default()
        };
        let g = w.new_group(None, opts).unwrap();
        let p2p = |kind: &str, t: &Tensor, peer: usize, tag: i64| {
            let mut op = P2POp::new(kind, t.clone(), Some(peer), None, tag, None).unwrap();
            op.group = Some(g.clone());
            op
        };
        let (mine, theirs) = (
            Tensor::from_vec(vec![r as i64 + 1]),
            Tensor::zeros(DType::I64, &[1]),
        );
        // The second op names a peer outside the group: the call fails after the first op
        // was queued in the block, which is launched when the block ends (as NCCL's group).
        let bad = [p2p("isend", &mine, 1 - r, 0), p2p("irecv", &theirs, 7, 0)];
        assert!(w.batch_isend_irecv(&bad).is_err());
        w.recv(&theirs).src(1 - r).group(&g).run().unwrap();
        // A later op really runs (it would be swallowed by a block left open).
        let t = Tensor::from_vec(vec![r as i64 + 1]);
        w.all_reduce(&t).group(&g).run().unwrap();
        // And a later batch works.
        let (buf, got) = (
            Tensor::from_vec(vec![10 * (r as i64 + 1)]),
            Tensor::zeros(DType::I64, &[1]),
        );
        let ring = [p2p("isend", &buf, 1 - r, 5), p2p("irecv", &got, 1 - r, 5)];
        for wk in w.batch_isend_irecv(&ring).unwrap() {
            wk.wait().unwrap();
        }
        let vals = |t: &Tensor| t.to_vec::<i64>().unwrap();
        (vals(&theirs), vals(&t), vals(&got))
    });
    assert_eq!(out[0], (vec![2], vec![3], vec![20]));
    assert_eq!(out[1], (vec![1], vec![3], vec![10]));
}

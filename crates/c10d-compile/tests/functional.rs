//! The `_c10d_functional` op set on 2–4 ranks as threads, over gloo and the store test backend
//! (values asserted as in PyTorch's test_c10d_functional_native.py: each rank fills its tensor
//! with its rank).

mod common;

use c10d_compile::{wait_tensor, wait_tensors, Funcol, GroupRef};
use c10d_core::{DType, Tensor};
use c10d_world::GroupOptions;
use common::run;

fn filled(r: usize, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec_shaped(vec![r as f32; n], shape).unwrap()
}

#[test]
fn all_reduce_new_and_in_place() {
    for backend in ["gloo", "store"] {
        run(2, backend, |w, r| {
            let f = Funcol::new(w);
            let t = filled(r, &[4, 4]);
            let out = f.all_reduce(&t, "avg", "0").unwrap();
            assert!(!out.completed(), "not completed before first use");
            assert_eq!(out.shape(), &[4, 4]);
            assert_eq!(out.to_vec::<f32>().unwrap(), vec![0.5; 16]);
            assert!(out.completed());
            let out = out.wait().unwrap();
            assert!(!out.shares_storage_with(&t), "a new tensor");
            assert_eq!(
                t.to_vec::<f32>().unwrap(),
                vec![r as f32; 16],
                "input untouched"
            );

            let res = f.all_reduce_(&t, "sum", "0").unwrap().wait().unwrap();
            assert!(res.shares_storage_with(&t), "the same tensor");
            assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 16]);

            let e = f.all_reduce(&t, "foo", "0").unwrap_err().to_string();
            assert_eq!(e, "Unrecognized reduce_op: foo");
        });
    }
}

#[test]
fn all_reduce_on_four_ranks_by_every_group_kind() {
    run(4, "gloo", |w, r| {
        let f = Funcol::new(w);
        let world = w.world_group().unwrap();
        let t = filled(r, &[3]);
        let by_name = f.all_reduce(&t, "sum", "0").unwrap();
        let by_pg = f.all_reduce(&t, "max", &world).unwrap();
        let by_ranks = f
            .all_reduce(&t, "min", GroupRef::ranks(&[0, 1, 2, 3], ""))
            .unwrap();
        assert_eq!(by_name.to_vec::<f32>().unwrap(), vec![6.0; 3]);
        assert_eq!(by_pg.to_vec::<f32>().unwrap(), vec![3.0; 3]);
        assert_eq!(by_ranks.to_vec::<f32>().unwrap(), vec![0.0; 3]);
        // A 2-D rank layout: this rank's row is its group, found by tag. (Creation through
        // ranks + tag makes only this rank's row, so with several rows the groups are made
        // beforehand by every rank, as new_group requires.)
        for pair in [[0i64, 1], [2, 3]] {
            w.new_group_with_tag(Some(&pair), GroupOptions::default(), Some("pairs"))
                .unwrap();
        }
        let pair = GroupRef::rank_lists(&[vec![0, 1], vec![2, 3]], "pairs");
        let s = f.all_reduce(&t, "sum", pair.clone()).unwrap();
        let want = if r < 2 { 1.0 } else { 5.0 };
        assert_eq!(s.to_vec::<f32>().unwrap(), vec![want; 3]);
        let pg = f.resolve(pair).unwrap();
        assert_eq!(pg.size(), 2);
        assert_eq!(w.get_group_tag(&pg).unwrap(), "pairs");
        // By GroupMember, and by name of a new group.
        let g = w.new_group(Some(&[1, 3]), GroupOptions::default()).unwrap();
        if let Some(pg) = g.group() {
            let s = f.all_reduce(&t, "sum", &g).unwrap();
            assert_eq!(s.to_vec::<f32>().unwrap(), vec![4.0; 3]);
            let s = f.all_reduce(&t, "product", pg.group_name()).unwrap();
            assert_eq!(s.to_vec::<f32>().unwrap(), vec![3.0; 3]);
        } else {
            let e = f.all_reduce(&t, "sum", &g).unwrap_err().to_string();
            assert!(e.contains("not a member"), "{e}");
        }
    });
}

#[test]
fn device_mesh_groups_as_pytorch_accepts_them() {
    run(4, "gloo", |w, r| {
        let f = Funcol::new(w);
        let t = filled(r, &[2]);
        let mesh = w
            .init_device_mesh("cpu", &[2, 2], Some(&["dp", "tp"]))
            .unwrap();
        // (mesh, dim): dp pairs ranks {0, 2} and {1, 3}; tp pairs {0, 1} and {2, 3}
        let dp = f.all_reduce(&t, "sum", (&mesh, 0)).unwrap();
        assert_eq!(
            dp.to_vec::<f32>().unwrap(),
            vec![(2 * (r % 2) + 2) as f32; 2]
        );
        let tp = f.all_reduce(&t, "sum", (&mesh, "tp")).unwrap();
        assert_eq!(
            tp.to_vec::<f32>().unwrap(),
            vec![(4 * (r / 2) + 1) as f32; 2]
        );
        let e = f.all_reduce(&t, "sum", &mesh).unwrap_err().to_string();
        assert_eq!(
            e,
            "Only 1D mesh is supported, pass in (DeviceMesh, int) together if mesh > 1D"
        );
        let tp_mesh = mesh.slice(&["tp"]).unwrap();
        let one = f.all_reduce(&t, "max", &tp_mesh).unwrap();
        assert_eq!(one.to_vec::<f32>().unwrap(), vec![(r | 1) as f32; 2]);
        let e = f.all_reduce(&t, "sum", (&mesh, 2)).unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
    });
}

#[test]
fn group_resolution_errors() {
    run(2, "store", |w, r| {
        let f = Funcol::new(w);
        let t = filled(r, &[1]);
        let e = f.all_reduce(&t, "sum", "nope").unwrap_err().to_string();
        assert_eq!(
            e,
            "Could not resolve the process group registered under the name nope"
        );
        let bad = GroupRef::rank_lists(&[vec![0], vec![1, 2, 3]], "");
        let e = f.all_reduce(&t, "sum", bad).unwrap_err().to_string();
        assert_eq!(e, "group sizes must be identical");
        // A name registered by hand ("default" in PyTorch's tests).
        w.register_process_group("default", &w.world_group().unwrap());
        let s = f.all_reduce(&t, "sum", "default").unwrap();
        assert_eq!(s.to_vec::<f32>().unwrap(), vec![1.0]);
        w.unregister_process_group("default");
        assert!(f.all_reduce(&t, "sum", "default").is_err());
    });
}

#[test]
fn all_reduce_coalesced_variants() {
    run(2, "gloo", |w, r| {
        let f = Funcol::new(w);
        let ts = vec![filled(r, &[2]), filled(r + 1, &[3, 2])];
        let outs = f.all_reduce_coalesced(&ts, "sum", "0").unwrap();
        assert_eq!(outs.len(), 2);
        assert_eq!(outs[0].to_vec::<f32>().unwrap(), vec![1.0; 2]);
        assert_eq!(outs[1].to_vec::<f32>().unwrap(), vec![3.0; 6]);
        assert!(!outs[0].tensor().unwrap().shares_storage_with(&ts[0]));
        let outs = f.all_reduce_coalesced_(&ts, "avg", "0").unwrap();
        for (o, t) in outs.iter().zip(&ts) {
            assert!(o.tensor().unwrap().shares_storage_with(t));
        }
        assert_eq!(ts[0].to_vec::<f32>().unwrap(), vec![0.5; 2]);
        assert_eq!(ts[1].to_vec::<f32>().unwrap(), vec![1.5; 6]);
    });
}

#[test]
fn all_gather_into_tensor_variants() {
    run(3, "gloo", |w, r| {
        let f = Funcol::new(w);
        let t = filled(r, &[2, 2]);
        let out = f.all_gather_into_tensor(&t, 3, "0").unwrap();
        assert_eq!(out.shape(), &[6, 2]);
        let want: Vec<f32> = (0..3).flat_map(|i| vec![i as f32; 4]).collect();
        assert_eq!(out.to_vec::<f32>().unwrap(), want);
        // 0-d input → shape [group_size].
        let scalar = Tensor::from_vec_shaped(vec![r as i64], &[]).unwrap();
        let out = f.all_gather_into_tensor(&scalar, 3, "0").unwrap();
        assert_eq!(out.shape(), &[3]);
        assert_eq!(out.to_vec::<i64>().unwrap(), vec![0, 1, 2]);
        // _out
        let dst = Tensor::zeros(DType::F32, &[6, 2]);
        let res = f
            .all_gather_into_tensor_out(&t, 3, "0", &dst)
            .unwrap()
            .wait()
            .unwrap();
        assert!(res.shares_storage_with(&dst));
        assert_eq!(dst.to_vec::<f32>().unwrap(), want);
        // _coalesced
        let outs = f
            .all_gather_into_tensor_coalesced(&[filled(r, &[1]), filled(10 + r, &[2])], 3, "0")
            .unwrap();
        assert_eq!(outs[0].to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0]);
        assert_eq!(
            outs[1].to_vec::<f32>().unwrap(),
            vec![10.0, 10.0, 11.0, 11.0, 12.0, 12.0]
        );
        let e = f
            .all_gather_into_tensor(&t, 2, "0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("group_size 2 does not match the size 3"), "{e}");
    });
}

#[test]
fn reduce_scatter_tensor_variants() {
    run(2, "gloo", |w, r| {
        let f = Funcol::new(w);
        // Each rank holds [0, 1]; "avg" scatters so each rank gets its rank.
        let t = Tensor::from_vec(vec![0.0f32, 1.0]);
        let out = f.reduce_scatter_tensor(&t, "avg", 2, "0").unwrap();
        assert_eq!(out.shape(), &[1]);
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![r as f32]);
        let dst = Tensor::zeros(DType::F32, &[1]);
        f.reduce_scatter_tensor_out(&t, "sum", 2, "0", &dst)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(dst.to_vec::<f32>().unwrap(), vec![2.0 * r as f32]);
        let a = Tensor::from_vec_shaped(vec![1i64, 2, 3, 4], &[2, 2]).unwrap();
        let b = Tensor::from_vec(vec![r as i64 + 1; 4]);
        let outs = f
            .reduce_scatter_tensor_coalesced(&[a, b], "max", 2, "0")
            .unwrap();
        assert_eq!(outs[0].shape(), &[1, 2]);
        let want0 = if r == 0 { vec![1, 2] } else { vec![3, 4] };
        assert_eq!(outs[0].to_vec::<i64>().unwrap(), want0);
        assert_eq!(outs[1].to_vec::<i64>().unwrap(), vec![2, 2]);
    });
}

/// Uneven splits: rank r sends S[r][j] rows to rank j and receives S[j][r] rows from j.
#[test]
fn all_to_all_single_uneven() {
    let s = [[1usize, 2, 0], [0, 1, 3], [2, 2, 1]];
    run(3, "gloo", move |w, r| {
        let f = Funcol::new(w);
        let input_splits = s[r].to_vec();
        let output_splits: Vec<usize> = (0..3).map(|j| s[j][r]).collect();
        let rows: usize = input_splits.iter().sum();
        // Row value = 100*sender + 10*receiver + index within the block.
        let mut data = Vec::new();
        for (j, &n) in input_splits.iter().enumerate() {
            for k in 0..n {
                data.extend([(100 * r + 10 * j + k) as i32; 2]);
            }
        }
        let t = Tensor::from_vec_shaped(data, &[rows, 2]).unwrap();
        let out = f
            .all_to_all_single(&t, Some(&output_splits), Some(&input_splits), "0")
            .unwrap();
        let mut want = Vec::new();
        for (j, &n) in output_splits.iter().enumerate() {
            for k in 0..n {
                want.extend([(100 * j + 10 * r + k) as i32; 2]);
            }
        }
        assert_eq!(out.shape(), &[output_splits.iter().sum::<usize>(), 2]);
        assert_eq!(out.to_vec::<i32>().unwrap(), want);
        // Equal splits when both are None; exactly one given is an error.
        let even = Tensor::from_vec(vec![r as f32; 3]);
        let out = f.all_to_all_single(&even, None, None, "0").unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0]);
        let e = f
            .all_to_all_single(&even, Some(&[1, 1, 1]), None, "0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("must either be specified together"), "{e}");
    });
}

#[test]
fn broadcast_new_and_in_place() {
    run(2, "gloo", |w, r| {
        let f = Funcol::new(w);
        let t = filled(r, &[5]);
        let out = f.broadcast(&t, 1, "0").unwrap().wait().unwrap();
        assert!(!out.shares_storage_with(&t));
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![1.0; 5]);
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![r as f32; 5]);
        let res = f.broadcast_(&t, 0, "0").unwrap().wait().unwrap();
        assert!(res.shares_storage_with(&t));
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0; 5]);
        assert!(f.broadcast(&t, 2, "0").is_err());
    });
}

#[test]
fn point_to_point_and_batches() {
    run(2, "gloo", |w, r| {
        let f = Funcol::new(w);
        let peer = 1 - r;
        if r == 0 {
            let t = Tensor::from_vec(vec![7.0f32; 4]);
            let p = f.isend(&t, peer, 0, "0").unwrap();
            assert_eq!(p.shape(), &[0], "isend returns an empty placeholder");
            wait_tensor(&t).unwrap();
            p.wait().unwrap();
        } else {
            let t = Tensor::zeros(DType::F32, &[4]);
            let got = f.irecv(&t, peer, 0, "0").unwrap().wait().unwrap();
            assert!(got.shares_storage_with(&t));
            assert_eq!(t.to_vec::<f32>().unwrap(), vec![7.0; 4]);
        }
        // A batch exchanging with the peer in both directions.
        let send = Tensor::from_vec(vec![r as i64; 3]);
        let recv = Tensor::zeros(DType::I64, &[3]);
        let outs = f
            .batch_p2p_ops(
                &["isend", "irecv"],
                &[peer, peer],
                &[1, 1],
                &[send.clone(), recv.clone()],
                "0",
            )
            .unwrap();
        assert_eq!(outs.len(), 2);
        let got = wait_tensors(&[send, recv.clone()]).unwrap();
        assert!(got[1].shares_storage_with(&recv));
        assert_eq!(recv.to_vec::<i64>().unwrap(), vec![peer as i64; 3]);
        for o in outs {
            o.wait().unwrap();
        }
        // An empty batch gives one placeholder tensor.
        let empty = f.batch_p2p_ops(&[], &[], &[], &[], "0").unwrap();
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].shape(), &[0]);
        let e = f
            .batch_p2p_ops(
                &["send"],
                &[peer],
                &[0],
                &[Tensor::zeros(DType::F32, &[1])],
                "0",
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown op \"send\""), "{e}");
    });
}

/// The result is a `Future` too: awaited from a minimal executor.
#[test]
fn async_collective_tensor_is_a_future() {
    run(2, "gloo", |w, r| {
        let f = Funcol::new(w);
        let t = filled(r + 1, &[2]);
        let fut = f.all_reduce(&t, "sum", "0").unwrap();
        let out = block_on(fut).unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![3.0; 2]);
    });
}

fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    let deadline = std::time::Instant::now() + common::TIMEOUT;
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "future did not complete"
        );
        std::thread::park_timeout(std::time::Duration::from_millis(50));
    }
}

#[test]
fn complex_tensors_only_with_sum_avg_premul_sum() {
    run(2, "gloo", |w, r| {
        let f = Funcol::new(w);
        let t = Tensor::from_vec(vec![
            c10d_core::c32 {
                re: r as f32,
                im: 1.0
            };
            2
        ]);
        let out = f.all_reduce(&t, "sum", "0").unwrap();
        assert_eq!(
            out.to_vec::<c10d_core::c32>().unwrap(),
            vec![c10d_core::c32 { re: 1.0, im: 2.0 }; 2]
        );
        let e = f.all_reduce(&t, "max", "0").unwrap_err().to_string();
        assert!(e.contains("does not support complex"), "{e}");
    });
}

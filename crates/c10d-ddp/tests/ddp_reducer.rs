//! The DDP Reducer with ranks as threads: averaged gradients equal an all_reduce of each
//! gradient (over gloo, asynchronous, and over the store test backend), buckets rebuilt in
//! gradient-arrival order, unused parameters, static graphs and the errors PyTorch raises.

use c10d_testing::world as world_common;

use c10d_core::{
    AllreduceOptions, Collectives, DType, DistError, ErrorKind, ProcessGroup, ReduceOp, Tensor,
};
use c10d_ddp::{
    compute_bucket_assignment_by_size, AllReduceHook, BucketFuture, CommHook, Fp16CompressHook,
    GradBucket, Reducer, ReducerOptions, TensorMeta,
};
use c10d_testing::fake_device::HostBackedDevice;
use c10d_world::World;
use std::sync::Arc;
use std::time::Duration;
use world_common::{run, run_gloo, run_gloo_as};

/// Shapes of a small model; params 0..5 in registration order.
const SHAPES: [&[usize]; 5] = [&[8, 4], &[8], &[3, 8], &[3], &[5, 3]];

fn params() -> Vec<Tensor> {
    SHAPES
        .iter()
        .map(|s| Tensor::zeros(DType::F32, s))
        .collect()
}

/// A gradient that divides exactly by 2, 3 and 4 (small integers times 12), so that averaging in
/// any order gives the same bits.
fn grad_value(rank: usize, iter: usize, param: usize, k: usize) -> f32 {
    (12 * ((rank * 7 + iter * 3 + param * 5 + k) % 17)) as f32 - 96.0
}

fn local_grad(rank: usize, iter: usize, param: usize) -> Tensor {
    let n: usize = SHAPES[param].iter().product();
    let v: Vec<f32> = (0..n).map(|k| grad_value(rank, iter, param, k)).collect();
    Tensor::from_vec_shaped(v, SHAPES[param]).unwrap()
}

/// Three iterations; every gradient after finalize must equal the all_reduce (AVG) of that
/// gradient. Half the gradients are written into the bucket views, half passed as tensors.
fn gradients_equal_all_reduce(w: &World, rank: usize) {
    gradients_equal_all_reduce_placed(w, rank, &|t| t);
}

/// A host tensor's copy on the fake `cuda:0` (host memory behind `DeviceStorage`).
fn on_fake_cuda(t: Tensor) -> Tensor {
    HostBackedDevice::tensor(&t.to_vec::<f32>().unwrap(), t.shape(), 0)
}

/// As [`gradients_equal_all_reduce`], with parameters and gradients placed by `place` (on the
/// host, or on a device: the buckets then live there too).
fn gradients_equal_all_reduce_placed(w: &World, rank: usize, place: &dyn Fn(Tensor) -> Tensor) {
    let pg = w.world_group().unwrap();
    let opts = ReducerOptions {
        bucket_cap_mb: Some(200.0 / (1 << 20) as f64),
        timeout: Some(Duration::from_secs(20)),
        ..Default::default()
    };
    let params: Vec<Tensor> = params().into_iter().map(place).collect();
    let reducer = Reducer::new(&params, pg.clone(), opts).unwrap();
    for iter in 0..3 {
        let mut given = Vec::new();
        for p in (0..SHAPES.len()).rev() {
            let g = place(local_grad(rank, iter, p));
            if p % 2 == 0 {
                reducer.grad(p).unwrap().copy_from(&g).unwrap();
                reducer.mark_variable_ready(p).unwrap();
            } else {
                reducer.mark_variable_ready_with_grad(p, &g).unwrap();
                given.push((p, g));
            }
        }
        reducer.finalize_backward().unwrap();
        for (p, shape) in SHAPES.iter().enumerate() {
            let expect = place(local_grad(rank, iter, p));
            let avg = AllreduceOptions {
                reduce_op: ReduceOp::Avg,
                ..Default::default()
            };
            pg.all_reduce(std::slice::from_ref(&expect), &avg)
                .unwrap()
                .wait()
                .unwrap();
            let got = reducer.grad(p).unwrap();
            assert_eq!(got.shape(), *shape);
            assert_eq!(
                got.device(),
                params[p].device(),
                "the bucket is beside its parameter"
            );
            assert_eq!(
                got.to_vec::<f32>().unwrap(),
                expect.to_vec::<f32>().unwrap(),
                "iter {iter} param {p}"
            );
        }
        for (p, g) in given {
            assert_eq!(
                g.to_vec::<f32>().unwrap(),
                reducer.grad(p).unwrap().to_vec::<f32>().unwrap(),
                "copied back, param {p}"
            );
        }
    }
    if let Some(n) = HostBackedDevice::device_ops(&reducer.grad(0).unwrap()) {
        // 5 gradients copied into the buckets per iteration, 5 views moved by the rebuild: on
        // the device, not through the host.
        assert!(n >= 3 * 5 + 5, "{n} on-device copies");
    }
    let s = reducer.stats();
    assert_eq!(s.iterations, 3);
    assert!(s.has_rebuilt_buckets);
    assert!(s.bucket_sizes.len() > 1, "{s:?}");
    assert_eq!(
        s.bucket_sizes.iter().sum::<usize>(),
        4 * (32 + 8 + 24 + 3 + 15)
    );
}

#[test]
fn gradients_after_finalize_equal_an_all_reduce_of_each_gradient_gloo() {
    run_gloo(3, |_| {}, gradients_equal_all_reduce);
}

/// Device parameters (host memory behind `DeviceStorage`, through gloo's `"cuda:gloo"`
/// staging): the buckets are allocated on the device, gradients are copied and zeroed there,
/// and the collective averages (`ReduceOp::Avg`); the results are the host Reducer's.
#[test]
fn device_parameters_get_device_buckets_averaged_by_the_collective() {
    run_gloo(
        3,
        |_| {},
        |w, rank| {
            gradients_equal_all_reduce_placed(w, rank, &on_fake_cuda);
        },
    );
}

/// A group whose only backend takes device tensors (`"cuda:gloo"`, as `"nccl"`): the bucket
/// rebuild's message travels on the parameters' device, as PyTorch's `sync_bucket_indices`
/// moves it there (a host message would find no backend).
#[test]
fn a_device_only_group_carries_the_bucket_rebuild() {
    run_gloo_as(
        2,
        "cuda:gloo",
        |_| {},
        |w, rank| {
            gradients_equal_all_reduce_placed(w, rank, &on_fake_cuda);
        },
    );
}

#[test]
fn a_device_reducer_zeroes_unused_gradients_on_the_device_and_refuses_host_only_hooks() {
    run_gloo(
        2,
        |_| {},
        |w, rank| {
            let pg = w.world_group().unwrap();
            let params: Vec<Tensor> = params().into_iter().map(on_fake_cuda).collect();
            let opts = ReducerOptions {
                find_unused_parameters: true,
                ..Default::default()
            };
            let reducer = Reducer::new(&params, pg, opts).unwrap();
            let e = reducer.register_comm_hook(Fp16CompressHook).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(
                e.to_string()
                    .contains("fp16_compress_hook works on buckets in host memory"),
                "{e}"
            );
            assert!(e.to_string().contains("cuda:0"), "{e}");
            reducer.register_comm_hook(AllReduceHook).unwrap();
            let host = local_grad(rank, 0, 0);
            let e = reducer.mark_variable_ready_with_grad(0, &host).unwrap_err();
            assert!(
                e.to_string().contains("Expected a gradient on cuda:0"),
                "{e}"
            );
            // A stale value in the unused parameter's view: prepare_for_backward zeroes it.
            reducer
                .grad(1)
                .unwrap()
                .copy_from(&on_fake_cuda(Tensor::full(9f32, &[8])))
                .unwrap();
            let before = HostBackedDevice::device_ops(&reducer.grad(2).unwrap()).unwrap();
            reducer.prepare_for_backward(&[1]).unwrap();
            for p in [4, 3, 2, 0] {
                reducer
                    .mark_variable_ready_with_grad(p, &on_fake_cuda(local_grad(rank, 0, p)))
                    .unwrap();
            }
            reducer.finalize_backward().unwrap();
            assert_eq!(
                reducer.grad(1).unwrap().to_vec::<f32>().unwrap(),
                vec![0.0; 8]
            );
            let after = HostBackedDevice::device_ops(&reducer.grad(2).unwrap()).unwrap();
            assert!(
                after >= before + 5,
                "zeroing and copies ran on the device: {before} → {after}"
            );
            let want = (grad_value(0, 0, 2, 5) + grad_value(1, 0, 2, 5)) / 2.0;
            assert_eq!(reducer.grad(2).unwrap().to_vec::<f32>().unwrap()[5], want);
        },
    );
}

#[test]
fn gradients_after_finalize_equal_an_all_reduce_of_each_gradient_store_backend() {
    run(2, gradients_equal_all_reduce);
}

#[test]
fn buckets_are_rebuilt_in_rank_0s_arrival_order() {
    let out = run(2, |w, rank| {
        let pg = w.world_group().unwrap();
        let cap = 150.0 / (1 << 20) as f64;
        let opts = ReducerOptions {
            bucket_cap_mb: Some(cap),
            ..Default::default()
        };
        let reducer = Reducer::new(&params(), pg, opts).unwrap();
        // First iteration: one bucket (DDP's first iteration without find_unused_parameters).
        assert_eq!(reducer.bucket_indices(), vec![vec![0, 1, 2, 3, 4]]);
        // Rank 1 marks in another order; rank 0's order wins.
        let order: &[usize] = if rank == 0 {
            &[2, 0, 4, 1, 3]
        } else {
            &[4, 3, 2, 1, 0]
        };
        for &p in order {
            reducer
                .mark_variable_ready_with_grad(p, &local_grad(rank, 0, p))
                .unwrap();
        }
        reducer.finalize_backward().unwrap();
        reducer.bucket_indices()
    });
    let metas: Vec<TensorMeta> = [2, 0, 4, 1, 3]
        .iter()
        .map(|&p| TensorMeta::of(&params()[p]))
        .collect();
    let expect = compute_bucket_assignment_by_size(&metas, &[150], &[2, 0, 4, 1, 3]).unwrap();
    assert_eq!(expect.bucket_indices, vec![vec![2, 0], vec![4, 1, 3]]);
    assert_eq!(
        out,
        vec![expect.bucket_indices.clone(), expect.bucket_indices]
    );
}

#[test]
fn unused_parameters_are_reduced_as_zeros() {
    run(2, |w, rank| {
        let pg = w.world_group().unwrap();
        let opts = ReducerOptions {
            find_unused_parameters: true,
            ..Default::default()
        };
        let reducer = Reducer::new(&params(), pg, opts).unwrap();
        // Rank 0 declares param 1 unused up front (listed twice: still one parameter); rank 1
        // simply never marks param 3.
        let skip = if rank == 0 { 1 } else { 3 };
        if rank == 0 {
            reducer.prepare_for_backward(&[1, 1]).unwrap();
        }
        for p in (0..SHAPES.len()).filter(|&p| p != skip) {
            reducer
                .mark_variable_ready_with_grad(p, &local_grad(rank, 0, p))
                .unwrap();
        }
        reducer.finalize_backward().unwrap();
        for (p, shape) in SHAPES.iter().enumerate() {
            let other = 1 - rank;
            let mine = if p == skip {
                vec![0.0; 0]
            } else {
                local_grad(rank, 0, p).to_vec::<f32>().unwrap()
            };
            let theirs = if p == [1, 3][other] {
                vec![]
            } else {
                local_grad(other, 0, p).to_vec::<f32>().unwrap()
            };
            let n: usize = shape.iter().product();
            let expect: Vec<f32> = (0..n)
                .map(|k| {
                    (mine.get(k).copied().unwrap_or(0.0) + theirs.get(k).copied().unwrap_or(0.0))
                        / 2.0
                })
                .collect();
            assert_eq!(
                reducer.grad(p).unwrap().to_vec::<f32>().unwrap(),
                expect,
                "param {p}"
            );
        }
        assert_eq!(reducer.stats().unused_parameters, 1);
        assert!(
            !reducer.stats().has_rebuilt_buckets,
            "no rebuild with find_unused_parameters"
        );
    });
}

#[test]
fn a_gradient_never_marked_is_an_error_naming_rank_and_index() {
    run(2, |w, rank| {
        let pg = w.world_group().unwrap();
        let names: Vec<String> = (0..SHAPES.len()).map(|i| format!("layer{i}")).collect();
        let opts = ReducerOptions {
            param_names: names,
            ..Default::default()
        };
        let reducer = Reducer::new(&params(), pg, opts).unwrap();
        for p in [0, 1, 3, 4] {
            reducer.mark_variable_ready(p).unwrap();
        }
        // Refused calls inside the iteration leave it usable.
        let e = reducer.mark_variable_ready(0).unwrap_err().to_string();
        assert!(
            e.starts_with("Expected to mark a variable ready only once."),
            "{e}"
        );
        assert!(
            e.contains("Parameter at index 0 with name layer0 has been marked as ready twice"),
            "{e}"
        );
        assert!(reducer
            .mark_variable_ready(9)
            .unwrap_err()
            .to_string()
            .contains("Out of range variable index"));
        assert!(reducer
            .prepare_for_backward(&[])
            .unwrap_err()
            .to_string()
            .contains("[2]"));
        let e = reducer.finalize_backward().unwrap_err().to_string();
        assert!(
            e.starts_with("Expected to have finished reduction in the prior iteration"),
            "{e}"
        );
        assert!(e.contains("find_unused_parameters"), "{e}");
        assert!(
            e.contains(&format!(
                "Parameters which did not receive grad for rank {rank}: layer2"
            )),
            "{e}"
        );
        assert!(
            e.contains(&format!(
                "Parameter indices which did not receive grad for rank {rank}: [2]"
            )),
            "{e}"
        );
        // The failed finalize broke the Reducer: every later call says so and quotes the error.
        let poisoned = [
            reducer.mark_variable_ready(0).unwrap_err(),
            reducer.mark_variable_ready(2).unwrap_err(),
            reducer.prepare_for_backward(&[]).unwrap_err(),
            reducer.finalize_backward().unwrap_err(),
        ];
        for e in poisoned {
            let e = e.to_string();
            assert!(
                e.starts_with("The previous backward pass of this Reducer failed"),
                "{e}"
            );
            assert!(e.contains("build a new Reducer"), "{e}");
            assert!(
                e.contains(&format!("did not receive grad for rank {rank}: [2]")),
                "{e}"
            );
        }
    });
}

#[test]
fn a_failed_reduction_breaks_the_reducer_with_a_clear_error() {
    run(2, |w, _rank| {
        let pg = w.world_group().unwrap();
        let reducer = Reducer::new(&params(), pg, ReducerOptions::default()).unwrap();
        let hook = |pg: &ProcessGroup, b: &GradBucket| -> c10d_core::Result<BucketFuture> {
            let f = AllReduceHook.run_hook(pg, b)?;
            Ok(f.then(|_| Err(DistError::backend("injected reduction failure"))))
        };
        reducer.register_comm_hook(hook).unwrap();
        for p in (0..SHAPES.len()).rev() {
            reducer.mark_variable_ready(p).unwrap();
        }
        let e = reducer.finalize_backward().unwrap_err();
        assert!(e.to_string().contains("injected reduction failure"), "{e}");
        let e = reducer.mark_variable_ready(4).unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::Backend,
            "the first error's kind is kept"
        );
        let e = e.to_string();
        assert!(
            e.starts_with("The previous backward pass of this Reducer failed"),
            "{e}"
        );
        assert!(e.contains("injected reduction failure"), "{e}");
        assert!(reducer.finalize_backward().is_err());
    });
}

#[test]
fn static_graph_fixes_the_unused_set_after_the_first_iteration() {
    run(2, |w, rank| {
        let pg = w.world_group().unwrap();
        let opts = ReducerOptions {
            static_graph: true,
            ..Default::default()
        };
        let reducer = Reducer::new(&params(), pg, opts).unwrap();
        for iter in 0..2 {
            for p in [4, 3, 1, 0] {
                reducer
                    .mark_variable_ready_with_grad(p, &local_grad(rank, iter, p))
                    .unwrap();
            }
            reducer.finalize_backward().unwrap();
            assert_eq!(
                reducer.grad(2).unwrap().to_vec::<f32>().unwrap(),
                vec![0.0; 24]
            );
            assert_eq!(reducer.stats().unused_parameters, 1, "iteration {iter}");
        }
        let e = reducer.mark_variable_ready(2).unwrap_err().to_string();
        assert!(
            e.starts_with("Your training graph has changed in this iteration"),
            "{e}"
        );
        for p in [4, 3, 1] {
            reducer.mark_variable_ready(p).unwrap();
        }
        let e = reducer.finalize_backward().unwrap_err().to_string();
        assert!(
            e.contains("this is not compatible with static_graph set to True"),
            "{e}"
        );
        assert!(e.contains(&format!("for rank {rank}: [0]")), "{e}");
    });
}

#[test]
fn bad_parameters_are_refused() {
    run(1, |w, _| {
        let pg = w.world_group().unwrap();
        let e = Reducer::new(&[], pg.clone(), ReducerOptions::default()).unwrap_err();
        assert_eq!(e.to_string(), "Expected at least one parameter.");
        let e = Reducer::new(
            &[Tensor::zeros(DType::I64, &[2])],
            pg.clone(),
            ReducerOptions::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("floating-point"), "{e}");
        let r = Reducer::new(&params(), pg, ReducerOptions::default()).unwrap();
        let e = r
            .mark_variable_ready_with_grad(0, &Tensor::zeros(DType::F64, &[8, 4]))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("Expected torch.float32, got torch.float64"),
            "{e}"
        );
        assert!(
            r.finalize_backward().is_err(),
            "a backward pass with a missing gradient"
        );
    });
}

#[test]
fn a_full_bucket_is_launched_before_the_backward_pass_ends() {
    run(2, |w, rank| {
        let pg = w.world_group().unwrap();
        let opts = ReducerOptions {
            bucket_cap_mb: Some(150.0 / (1 << 20) as f64),
            ..Default::default()
        };
        let reducer = Reducer::new(&params(), pg, opts).unwrap();
        let launched = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = launched.clone();
        reducer
            .register_comm_hook(
                move |pg: &c10d_core::ProcessGroup, b: &c10d_ddp::GradBucket| {
                    log.lock().unwrap().push(b.index());
                    c10d_ddp::AllReduceHook.run_hook(pg, b)
                },
            )
            .unwrap();
        for iter in 0..2 {
            launched.lock().unwrap().clear();
            // Arrival order 4, 3, 2, 1, 0: rebuilt into [4, 3, 2] (168 bytes) and [1, 0] (160).
            for p in [4, 3, 2] {
                reducer
                    .mark_variable_ready_with_grad(p, &local_grad(rank, iter, p))
                    .unwrap();
            }
            let after_first = launched.lock().unwrap().clone();
            for p in [1, 0] {
                reducer
                    .mark_variable_ready_with_grad(p, &local_grad(rank, iter, p))
                    .unwrap();
            }
            let before_finalize = launched.lock().unwrap().clone();
            reducer.finalize_backward().unwrap();
            if iter == 0 {
                // One bucket in the first iteration: launched by the last gradient.
                assert!(after_first.is_empty());
                assert_eq!(before_finalize, vec![0]);
            } else {
                assert_eq!(reducer.bucket_indices(), vec![vec![4, 3, 2], vec![1, 0]]);
                assert_eq!(
                    after_first,
                    vec![0],
                    "bucket 0 launched as soon as it was full"
                );
                assert_eq!(before_finalize, vec![0, 1]);
            }
        }
    });
}

#[test]
fn gradient_as_bucket_view_leaves_given_gradients_untouched() {
    run(2, |w, rank| {
        let pg = w.world_group().unwrap();
        let opts = ReducerOptions {
            gradient_as_bucket_view: true,
            ..Default::default()
        };
        let reducer = Reducer::new(&params(), pg, opts).unwrap();
        let given: Vec<Tensor> = (0..SHAPES.len()).map(|p| local_grad(rank, 0, p)).collect();
        for (p, g) in given.iter().enumerate().rev() {
            reducer.mark_variable_ready_with_grad(p, g).unwrap();
        }
        reducer.finalize_backward().unwrap();
        for (p, g) in given.iter().enumerate() {
            assert_eq!(
                g.to_vec::<f32>().unwrap(),
                local_grad(rank, 0, p).to_vec::<f32>().unwrap()
            );
            let avg: Vec<f32> = local_grad(0, 0, p)
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .zip(local_grad(1, 0, p).to_vec::<f32>().unwrap())
                .map(|(a, b)| (a + b) / 2.0)
                .collect();
            assert_eq!(reducer.grad(p).unwrap().to_vec::<f32>().unwrap(), avg);
        }
    });
}

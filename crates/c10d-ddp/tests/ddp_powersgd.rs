//! The PowerSGD comm hook with ranks as threads: plain averaging before `start_powersgd_iter`,
//! exact recovery of a rank-1 average, small matrices sent uncompressed, and error feedback.

use c10d_testing::world as world_common;

use c10d_core::{DType, Tensor};
use c10d_ddp::{PowerSgdHook, PowerSgdOptions, Reducer, ReducerOptions};
use world_common::{run, run_gloo};

/// Parameters: a 40 × 30 matrix (compressed at rank 1: (40 + 30) × 2 < 1200), a bias of 40 and a
/// 2 × 2 matrix (not worth compressing).
fn params() -> Vec<Tensor> {
    vec![
        Tensor::zeros(DType::F32, &[40, 30]),
        Tensor::zeros(DType::F32, &[40]),
        Tensor::zeros(DType::F32, &[2, 2]),
    ]
}

/// Rank `rank`'s gradients: the matrix is `u vᵀ` scaled by `scale(rank)`, so the average is
/// rank 1 too; the bias and the small matrix are arbitrary.
fn grads(rank: usize, iter: usize) -> Vec<Vec<f32>> {
    let s = 1.0 + rank as f32 + iter as f32 * 0.5;
    let u: Vec<f32> = (0..40).map(|i| ((i * 7 % 11) as f32 - 5.0) / 5.0).collect();
    let v: Vec<f32> = (0..30).map(|j| ((j * 5 % 13) as f32 - 6.0) / 6.0).collect();
    let m = u
        .iter()
        .flat_map(|a| v.iter().map(move |b| s * a * b))
        .collect();
    let bias = (0..40).map(|i| (i + rank) as f32 * 0.25).collect();
    let small = vec![rank as f32, 1.0, 2.0, -(rank as f32)];
    vec![m, bias, small]
}

fn average(iter: usize, p: usize) -> Vec<f32> {
    let (a, b) = (&grads(0, iter)[p], &grads(1, iter)[p]);
    a.iter().zip(b).map(|(x, y)| (x + y) / 2.0).collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs `iters` iterations on 2 ranks; returns, per iteration, rank 0's reduced gradients.
fn train(
    opts: PowerSgdOptions,
    iters: usize,
    grads_of: fn(usize, usize) -> Vec<Vec<f32>>,
) -> Vec<Vec<Vec<f32>>> {
    let out = run(2, move |w, rank| {
        let pg = w.world_group().unwrap();
        let reducer = Reducer::new(&params(), pg, ReducerOptions::default()).unwrap();
        let hook = PowerSgdHook::new(opts.clone()).unwrap();
        reducer.register_comm_hook(hook.clone()).unwrap();
        let mut seen = Vec::new();
        for iter in 0..iters {
            for (p, g) in grads_of(rank, iter).into_iter().enumerate().rev() {
                reducer
                    .mark_variable_ready_with_grad(p, &Tensor::from_vec(g))
                    .unwrap();
            }
            reducer.finalize_backward().unwrap();
            seen.push(
                (0..3)
                    .map(|p| {
                        reducer
                            .grad(p)
                            .unwrap()
                            .reshape(&[params()[p].numel()])
                            .unwrap()
                            .to_vec::<f32>()
                            .unwrap()
                    })
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(hook.iteration(), iters as u64);
        seen
    });
    assert_eq!(out[0], out[1], "ranks disagree");
    out.into_iter().next().unwrap()
}

#[test]
fn plain_averaging_before_the_start_iteration() {
    let opts = PowerSgdOptions {
        start_powersgd_iter: 10,
        ..Default::default()
    };
    let got = train(opts, 2, grads);
    for (iter, g) in got.iter().enumerate() {
        for (p, gp) in g.iter().enumerate() {
            assert!(
                max_diff(gp, &average(iter, p)) < 1e-6,
                "iter {iter} param {p}"
            );
        }
    }
}

#[test]
fn a_rank_1_average_is_recovered_and_vectors_are_exact() {
    let opts = PowerSgdOptions {
        start_powersgd_iter: 0,
        ..Default::default()
    };
    let got = train(opts, 3, grads);
    for (iter, g) in got.iter().enumerate() {
        let m = average(iter, 0);
        let scale = m.iter().fold(0f32, |a, x| a.max(x.abs()));
        assert!(
            max_diff(&g[0], &m) < 1e-4 * scale,
            "iter {iter}: {}",
            max_diff(&g[0], &m)
        );
        assert!(
            max_diff(&g[1], &average(iter, 1)) < 1e-6,
            "bias, iter {iter}"
        );
        // Sent uncompressed: exact up to the rounding of the error feedback.
        assert!(
            max_diff(&g[2], &average(iter, 2)) < 1e-6,
            "small matrix, iter {iter}"
        );
    }
}

/// Rank 0's matrix is `u vᵀ`, rank 1's `u' v'ᵀ`: their average has rank 2, which rank-1
/// PowerSGD cannot represent in one step.
fn rank_2_grads(rank: usize, _iter: usize) -> Vec<Vec<f32>> {
    let mut g = grads(0, 0);
    if rank == 1 {
        g[0] = (0..40)
            .flat_map(|i| {
                (0..30).map(move |j| (i as f32 * 0.7).cos() * (j as f32 * 0.3 + 1.0).sin())
            })
            .collect();
    }
    g
}

#[test]
fn error_feedback_carries_what_the_approximation_lost() {
    const T: usize = 40;
    let exact: Vec<f32> = {
        let (a, b) = (&rank_2_grads(0, 0)[0], &rank_2_grads(1, 0)[0]);
        a.iter().zip(b).map(|(x, y)| (x + y) / 2.0).collect()
    };
    let opts = PowerSgdOptions {
        start_powersgd_iter: 0,
        ..Default::default()
    };
    let with = train(opts.clone(), T, rank_2_grads);
    let without = train(
        PowerSgdOptions {
            use_error_feedback: false,
            ..opts
        },
        8,
        rank_2_grads,
    );
    let first_err = max_diff(&with[0][0], &exact);
    assert!(
        first_err > 1e-2,
        "a rank-2 average is not representable: {first_err}"
    );
    // Summed over iterations, error feedback delivers (almost) the exact total; without it the
    // lost part is lost every time.
    let total = |run: &[Vec<Vec<f32>>]| -> Vec<f32> {
        (0..exact.len())
            .map(|k| run.iter().map(|g| g[0][k]).sum())
            .collect()
    };
    let exact_total: Vec<f32> = exact.iter().map(|x| x * T as f32).collect();
    let (e_with, e_without) = (
        max_diff(&total(&with), &exact_total),
        max_diff(&total(&without), &exact_total),
    );
    assert!(
        e_with < e_without / 5.0,
        "with feedback {e_with}, without {e_without}"
    );
}

/// The first iteration reduces one bucket of both matrices; gradients arriving last-first make
/// the rebuilt bucket 0 hold the 40 × 30 matrix alone, whose `Q` (30 × 1) is not the first one
/// stored for bucket 0 (10 × 1): warm start must start it afresh, not reuse it.
#[test]
fn warm_start_survives_the_bucket_rebuild() {
    let rank_1 = |rank: usize, n: usize, m: usize| -> Vec<f32> {
        let s = 1.0 + rank as f32;
        (0..n)
            .flat_map(|i| (0..m).map(move |j| s * ((i % 5) as f32 - 2.0) * ((j % 3) as f32 + 1.0)))
            .collect()
    };
    let shapes: [&[usize]; 2] = [&[20, 10], &[40, 30]];
    let out = run_gloo(
        2,
        |_| {},
        move |w, rank| {
            let pg = w.world_group().unwrap();
            let params: Vec<Tensor> = shapes
                .iter()
                .map(|s| Tensor::zeros(DType::F32, s))
                .collect();
            let opts = ReducerOptions {
                bucket_cap_mb: Some(0.001),
                ..Default::default()
            };
            let reducer = Reducer::new(&params, pg, opts).unwrap();
            let hook = PowerSgdHook::new(PowerSgdOptions {
                start_powersgd_iter: 0,
                ..Default::default()
            })
            .unwrap();
            reducer.register_comm_hook(hook).unwrap();
            for _iter in 0..3 {
                for (p, s) in shapes.iter().enumerate().rev() {
                    let g = Tensor::from_vec_shaped(rank_1(rank, s[0], s[1]), s).unwrap();
                    reducer.mark_variable_ready_with_grad(p, &g).unwrap();
                }
                reducer.finalize_backward().unwrap();
            }
            let got = reducer.grad(1).unwrap().reshape(&[1200]).unwrap();
            (reducer.bucket_indices(), got.to_vec::<f32>().unwrap())
        },
    );
    let average: Vec<f32> = rank_1(0, 40, 30).iter().map(|x| x * 1.5).collect();
    for (buckets, got) in out {
        assert_eq!(buckets, vec![vec![1], vec![0]], "rebuilt in arrival order");
        assert!(
            max_diff(&got, &average) < 1e-4,
            "{}",
            max_diff(&got, &average)
        );
    }
}

#[test]
fn invalid_options_are_refused_with_the_setting_named() {
    let cases: Vec<(PowerSgdOptions, &str)> = vec![
        (
            PowerSgdOptions {
                matrix_approximation_rank: 0,
                ..Default::default()
            },
            "matrix_approximation_rank must be at least 1",
        ),
        (
            PowerSgdOptions {
                min_compression_rate: f64::NAN,
                ..Default::default()
            },
            "min_compression_rate",
        ),
        (
            PowerSgdOptions {
                min_compression_rate: -1.0,
                ..Default::default()
            },
            "min_compression_rate",
        ),
        (
            PowerSgdOptions {
                orthogonalization_epsilon: -1e-8,
                ..Default::default()
            },
            "orthogonalization_epsilon",
        ),
        (
            PowerSgdOptions {
                timeout: Some(std::time::Duration::ZERO),
                ..Default::default()
            },
            "timeout",
        ),
    ];
    for (opts, want) in cases {
        let err = PowerSgdHook::new(opts.clone()).err().expect("accepted");
        assert_eq!(
            err.kind(),
            c10d_core::ErrorKind::InvalidArgument,
            "{opts:?}"
        );
        assert!(err.to_string().contains(want), "{err}");
    }
    let ok = PowerSgdHook::new(PowerSgdOptions::default()).unwrap();
    assert_eq!(ok.iteration(), 0);
}

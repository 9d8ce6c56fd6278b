//! DDP comm hooks with ranks as threads: the fp16/bf16 compression hooks average within their
//! precision, the all_reduce hook equals DDP's own averaging, and a user closure sees every
//! bucket and decides the result.

use c10d_testing::world as world_common;

use c10d_core::{AllreduceOptions, Collectives, DType, ProcessGroup, Result, Tensor};
use c10d_ddp::{
    AllReduceHook, Bf16CompressHook, BucketFuture, CommHook, Fp16CompressHook, GradBucket, Reducer,
    ReducerOptions,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use world_common::run;

const SIZES: [usize; 4] = [300, 40, 200, 7];

/// Pseudo-random gradient values in [-1, 1) with many significant bits.
fn grad(rank: usize, param: usize) -> Vec<f32> {
    let mut x = (rank as u64 + 1) * 0x9E37_79B9 + param as u64 * 0x85EB_CA6B;
    (0..SIZES[param])
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Runs one iteration on 2 ranks with `hook` and returns, per rank, (got, exact average in f64).
fn one_iteration<H: CommHook + Clone + 'static>(hook: H) -> Vec<Vec<(Vec<f32>, Vec<f64>)>> {
    run(2, move |w, rank| {
        let pg = w.world_group().unwrap();
        let params: Vec<Tensor> = SIZES
            .iter()
            .map(|&n| Tensor::zeros(DType::F32, &[n]))
            .collect();
        let opts = ReducerOptions {
            find_unused_parameters: true,
            bucket_cap_mb: Some(1e-3),
            ..Default::default()
        };
        let reducer = Reducer::new(&params, pg, opts).unwrap();
        reducer.register_comm_hook(hook.clone()).unwrap();
        assert!(reducer
            .register_comm_hook(hook.clone())
            .unwrap_err()
            .to_string()
            .contains("can only be called once"));
        for p in (0..SIZES.len()).rev() {
            reducer
                .mark_variable_ready_with_grad(p, &Tensor::from_vec(grad(rank, p)))
                .unwrap();
        }
        reducer.finalize_backward().unwrap();
        (0..SIZES.len())
            .map(|p| {
                let exact: Vec<f64> = grad(0, p)
                    .iter()
                    .zip(grad(1, p))
                    .map(|(a, b)| (*a as f64 + b as f64) / 2.0)
                    .collect();
                (reducer.grad(p).unwrap().to_vec::<f32>().unwrap(), exact)
            })
            .collect()
    })
}

fn max_err(out: &[Vec<(Vec<f32>, Vec<f64>)>]) -> f64 {
    out.iter()
        .flatten()
        .flat_map(|(g, e)| g.iter().zip(e).map(|(a, b)| (*a as f64 - b).abs()))
        .fold(0.0, f64::max)
}

#[test]
fn all_reduce_hook_averages_like_ddp() {
    let out = one_iteration(AllReduceHook);
    assert!(max_err(&out) < 1e-6, "{}", max_err(&out));
    assert_eq!(
        out[0].iter().map(|p| &p.0).collect::<Vec<_>>(),
        out[1].iter().map(|p| &p.0).collect::<Vec<_>>()
    );
}

#[test]
fn fp16_compression_is_within_half_precision() {
    let out = one_iteration(Fp16CompressHook);
    let err = max_err(&out);
    // |values| < 1: float16 keeps 11 significant bits, so each rounding is below 2^-11.
    assert!(err < 2.0 * 2f64.powi(-11), "fp16 error {err}");
    assert!(
        err > 1e-6,
        "fp16 error {err}: the gradients did not go through float16"
    );
}

#[test]
fn bf16_compression_is_within_bfloat16_precision() {
    let out = one_iteration(Bf16CompressHook);
    let err = max_err(&out);
    // bfloat16 keeps 8 significant bits.
    assert!(err < 2.0 * 2f64.powi(-8), "bf16 error {err}");
    assert!(
        err > 2f64.powi(-11),
        "bf16 error {err}: the gradients did not go through bfloat16"
    );
}

/// What the hook saw of a bucket: index, parameter indices, offsets, is_last.
type Seen = (usize, Vec<usize>, Vec<usize>, bool);

/// A user hook: sums without averaging, then doubles in a continuation; records what it saw.
#[derive(Clone, Default)]
struct SumTwice {
    calls: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl CommHook for SumTwice {
    fn run_hook(&self, pg: &ProcessGroup, bucket: &GradBucket) -> Result<BucketFuture> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().unwrap().push((
            bucket.index(),
            bucket.parameter_indices().to_vec(),
            bucket.offsets().to_vec(),
            bucket.is_last(),
        ));
        assert_eq!(bucket.gradients().unwrap().len(), bucket.lengths().len());
        let work = pg.all_reduce(&[bucket.buffer().clone()], &AllreduceOptions::default())?;
        Ok(
            BucketFuture::from_work(work, bucket.buffer().clone()).then(|t| {
                let doubled = Tensor::from_vec(
                    t.to_vec::<f32>()?
                        .iter()
                        .map(|x| x * 2.0)
                        .collect::<Vec<_>>(),
                );
                Ok(doubled)
            }),
        )
    }
    fn name(&self) -> String {
        "sum_twice".into()
    }
}

#[test]
fn a_user_hook_decides_the_result() {
    let hook = SumTwice::default();
    let out = one_iteration(hook.clone());
    for rank in &out {
        for (got, exact) in rank {
            for (g, e) in got.iter().zip(exact) {
                assert!((*g as f64 - 4.0 * e).abs() < 1e-5, "{g} vs 4 × {e}");
            }
        }
    }
    // find_unused_parameters keeps the size-based buckets (1048-byte cap): [0] closes alone,
    // [1, 2, 3] stays open; reversed for reduction. Both ranks share the hook.
    let seen = hook.seen.lock().unwrap().clone();
    assert_eq!(hook.calls.load(Ordering::SeqCst), 4);
    for s in &seen {
        match s.0 {
            0 => assert_eq!(
                (&s.1, &s.2, s.3),
                (&vec![1, 2, 3], &vec![0, 40, 240], false)
            ),
            _ => assert_eq!((&s.1, &s.2, s.3), (&vec![0], &vec![0], true)),
        }
    }
}

#[test]
fn a_closure_is_a_hook() {
    run(2, |w, rank| {
        let pg = w.world_group().unwrap();
        let reducer = Reducer::new(
            &[Tensor::zeros(DType::F32, &[3])],
            pg,
            ReducerOptions::default(),
        )
        .unwrap();
        reducer
            .register_comm_hook(
                |pg: &ProcessGroup, b: &GradBucket| -> Result<BucketFuture> {
                    let work =
                        pg.all_reduce(&[b.buffer().clone()], &AllreduceOptions::default())?;
                    Ok(BucketFuture::from_work(work, b.buffer().clone()))
                },
            )
            .unwrap();
        reducer
            .mark_variable_ready_with_grad(0, &Tensor::from_vec(vec![rank as f32 + 1.0; 3]))
            .unwrap();
        reducer.finalize_backward().unwrap();
        assert_eq!(
            reducer.grad(0).unwrap().to_vec::<f32>().unwrap(),
            vec![3.0; 3]
        );
        assert_eq!(reducer.stats().comm_hook, "user");
    });
}

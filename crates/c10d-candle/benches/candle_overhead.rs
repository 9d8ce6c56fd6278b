//! The adapter's overhead: a float32 all_reduce (SUM) on a candle CPU tensor against the same
//! all_reduce on a plain `Vec<f32>`, 2 ranks (threads, each its own `World`, "gloo" on this
//! host), alternating in one run (and alternating which goes first). Each time is the wall
//! time of the blocking call on rank 0 (the collective itself included; for candle, also taking
//! the tensor's storage lock and its slice through `InplaceOp1`). Printed: the median of each,
//! their ratio, and the median of the per-pair ratios (candle / Vec of the same round), which
//! drifts of a loaded machine disturb less.
//!
//! `cargo bench -p c10d-candle --bench candle_overhead [-- MiB ITERS]` (default 64 MiB, 40).

use c10d_testing::world as common;

use c10d_core::ReduceOp;
use c10d_world::World;
use candle_core::{Device, Tensor};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Rank `r`'s times (candle, Vec), one pair per round, on its initialised world `w`.
fn rank(w: &World, bytes: usize, iters: usize, go: &Barrier) -> (Vec<Duration>, Vec<Duration>) {
    let len = bytes / 4;
    let t = Tensor::from_vec(vec![1f32; len], len, &Device::Cpu).expect("tensor");
    let mut v = vec![1f32; len];
    let (mut tc, mut tv) = (Vec::new(), Vec::new());
    let candle = || {
        go.wait();
        let t0 = Instant::now();
        c10d_candle::all_reduce(&t)
            .op(ReduceOp::Sum)
            .world(w)
            .run()
            .expect("candle all_reduce");
        t0.elapsed()
    };
    for i in 0..iters + 2 {
        // Alternate which goes first, so neither always pays for the other's after-effects.
        let mut plain = || {
            go.wait();
            let t0 = Instant::now();
            w.all_reduce(&mut v)
                .op(ReduceOp::Sum)
                .run()
                .expect("vec all_reduce");
            t0.elapsed()
        };
        let (a, b) = if i % 2 == 0 {
            let a = candle();
            (a, plain())
        } else {
            let b = plain();
            (candle(), b)
        };
        if i >= 2 {
            tc.push(a);
            tv.push(b);
        }
    }
    (tc, tv)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mib: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(64);
    let iters: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(40);
    let n = 2;
    let go = Arc::new(Barrier::new(n));
    let res = common::ranks(n, Duration::from_secs(120), move |w, _r| {
        rank(w, mib << 20, iters, &go)
    });
    let (tc, tv) = res.into_iter().next().expect("rank 0");
    let mut pairs: Vec<f64> = tc
        .iter()
        .zip(&tv)
        .map(|(c, v)| c.as_secs_f64() / v.as_secs_f64())
        .collect();
    pairs.sort_by(f64::total_cmp);
    let (c, v) = (median(tc), median(tv));
    println!(
        "c10d-candle all_reduce f32 {mib} MiB, {n} ranks, median of {iters}: candle tensor {:.2} ms, Vec<f32> {:.2} ms, ratio {:.3}; median per-round ratio {:.3}",
        c.as_secs_f64() * 1e3,
        v.as_secs_f64() * 1e3,
        c.as_secs_f64() / v.as_secs_f64(),
        pairs[pairs.len() / 2]
    );
}

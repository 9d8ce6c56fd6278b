//! What the flight recorder costs: a 1 KiB all-reduce between 2 ranks (threads of this process,
//! blocking calls as `dist.all_reduce(t)` makes them) with recording off and on, alternating
//! in the same run, plus the recorder's own cost per op (record, start, finish).
//!
//! Run: `cargo bench -p c10d-gloo --bench flight_recorder`. Prints the median and best
//! per-op time of each mode over the rounds, their spread, and the ratio on / off (median of
//! the ratios of adjacent off/on rounds, and of the medians and bests); a ratio within the
//! spread of the rounds means recording costs nothing measurable.

use c10d_core::flight_recorder::OpRecord;
use c10d_core::*;
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::{HashStore, Store};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const ROUNDS: usize = 40;
const ITERS: usize = 500;

fn world() -> Vec<Arc<ProcessGroupGloo>> {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let s = store.clone();
            std::thread::spawn(move || {
                let o = GlooOptions {
                    group_name: "fr-bench".into(),
                    ..Default::default()
                };
                ProcessGroupGloo::new(s, r, 2, o).expect("create group")
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Per-op seconds of each round, recording on in odd rounds (rank 0 reports).
fn rounds(pgs: Vec<Arc<ProcessGroupGloo>>) -> Vec<(bool, f64)> {
    let fr = FlightRecorder::global().unwrap().clone();
    let barrier = Arc::new(Barrier::new(2));
    let hs: Vec<_> = pgs
        .into_iter()
        .enumerate()
        .map(|(r, pg)| {
            let (fr, barrier) = (fr.clone(), barrier.clone());
            std::thread::spawn(move || {
                let t = Tensor::from_vec(vec![1f32; 256]);
                let opts = AllreduceOptions {
                    async_op: false,
                    ..Default::default()
                };
                let mut out = Vec::new();
                for round in 0..ROUNDS + 2 {
                    let on = round % 2 == 1;
                    if r == 0 {
                        fr.set_enabled(on);
                    }
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..ITERS {
                        pg.all_reduce(std::slice::from_ref(&t), &opts)
                            .unwrap()
                            .wait()
                            .unwrap();
                    }
                    let per_op = start.elapsed().as_secs_f64() / ITERS as f64;
                    barrier.wait();
                    if round >= 2 {
                        out.push((on, per_op)); // the first two rounds warm up
                    }
                }
                out
            })
        })
        .collect();
    let mut res: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    res.swap_remove(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The recorder alone: record + started + finished for a 1 KiB all-reduce's entry, in ns.
fn recorder_ns() -> f64 {
    let fr = FlightRecorder::new(Default::default());
    let g = fr.register_group("gloo", "solo", "", &[], 0, 1);
    let t = [Tensor::from_vec(vec![1f32; 256])];
    let n = 200_000u64;
    let start = Instant::now();
    for i in 1..=n {
        let rec = OpRecord {
            op: OpType::Allreduce,
            collective_seq_id: i,
            p2p_seq_id: 0,
            op_id: i,
            peer: None,
            inputs: &t,
            outputs: &t,
            timeout: Duration::from_secs(1800),
        };
        let tr = g.record(&rec).unwrap();
        tr.started();
        tr.finished(Ok(()));
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let res = rounds(world());
    let pick = |on: bool| -> Vec<f64> {
        res.iter()
            .filter(|x| x.0 == on)
            .map(|x| x.1 * 1e6)
            .collect()
    };
    let (off, on) = (pick(false), pick(true));
    let spread = |v: &[f64]| {
        let m = median(v.to_vec());
        100.0 * v.iter().map(|x| (x - m).abs()).sum::<f64>() / v.len() as f64 / m
    };
    let best = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
    println!("# 2 ranks (threads), 1 KiB all_reduce, {ROUNDS} alternating rounds of {ITERS} ops");
    println!(
        "{:<14} {:>12} {:>10} {:>16}",
        "recording", "median µs", "best µs", "mean |dev| %"
    );
    println!(
        "{:<14} {:>12.2} {:>10.2} {:>16.1}",
        "off",
        median(off.clone()),
        best(&off),
        spread(&off)
    );
    println!(
        "{:<14} {:>12.2} {:>10.2} {:>16.1}",
        "on",
        median(on.clone()),
        best(&on),
        spread(&on)
    );
    // Each off round is followed by an on round: the ratio within a pair cancels slow drifts
    // of the (shared) machine.
    let pairs: Vec<f64> = off.iter().zip(&on).map(|(f, n)| n / f).collect();
    println!(
        "ratio on/off: median of pairs {:.3}, of medians {:.3}, of bests {:.3}",
        median(pairs),
        median(on.clone()) / median(off.clone()),
        best(&on) / best(&off)
    );
    println!(
        "recorder alone (record + start + finish): {:.0} ns per op",
        recorder_ns()
    );
}

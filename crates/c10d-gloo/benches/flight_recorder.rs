//! What the flight recorder costs: a 1 KiB all-reduce between 2 rank processes (blocking calls,
//! as `dist.all_reduce(t)` makes them) with recording off (`TORCH_FR_BUFFER_SIZE=0`) and on
//! (PyTorch's default, 2000 entries), alternating in the same run, plus the recorder's own cost
//! per op (record, start, finish) in a loop.
//!
//! Run: `cargo bench -p c10d-gloo --bench flight_recorder`. The bench re-runs itself as the two
//! ranks of each round (a fresh TcpStore and group per round). It prints the median and best
//! per-op time of each mode over the rounds and the ratio on / off (median of the ratios of
//! adjacent off/on rounds, and of the medians and bests); a ratio within the spread of the
//! rounds means recording costs nothing measurable. Ranks are processes, as in a real job:
//! ranks as threads of one process would share one recorder, which real ranks never do.

use c10d_core::flight_recorder::OpRecord;
use c10d_core::*;
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROUNDS: usize = 16;
const ITERS: usize = 4000;
const WARMUP: usize = 300;
const RANK: &str = "C10D_FR_BENCH_RANK";
const PORT: &str = "C10D_FR_BENCH_PORT";

/// One rank of a round: prints the per-op µs of `ITERS` blocking 1 KiB all-reduces.
fn rank_main(rank: usize, port: u16) {
    let o = TcpStoreOptions {
        timeout: Duration::from_secs(60),
        wait_for_workers: false,
        ..Default::default()
    };
    let store: Arc<dyn Store> = Arc::new(TcpStore::new("127.0.0.1", port, o).unwrap());
    let pg = ProcessGroupGloo::new(store, rank, 2, GlooOptions::default()).unwrap();
    let t = Tensor::from_vec(vec![1f32; 256]);
    let opts = AllreduceOptions {
        async_op: false,
        ..Default::default()
    };
    let run = |n: usize| {
        for _ in 0..n {
            pg.all_reduce(std::slice::from_ref(&t), &opts)
                .unwrap()
                .wait()
                .unwrap();
        }
    };
    run(WARMUP);
    let start = Instant::now();
    run(ITERS);
    println!("{}", start.elapsed().as_secs_f64() * 1e6 / ITERS as f64);
}

/// One round: two rank processes with the given buffer size; rank 0's per-op µs.
fn round(exe: &std::path::Path, buffer_size: &str) -> f64 {
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..Default::default()
    })
    .unwrap();
    let kids: Vec<_> = (0..2)
        .map(|r| {
            Command::new(exe)
                .env(RANK, r.to_string())
                .env(PORT, srv.port().to_string())
                .env("TORCH_FR_BUFFER_SIZE", buffer_size)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<String> = kids
        .into_iter()
        .map(|k| String::from_utf8(k.wait_with_output().unwrap().stdout).unwrap())
        .collect();
    outs[0].trim().parse().expect("rank 0 prints its per-op µs")
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
    if let (Ok(r), Ok(p)) = (std::env::var(RANK), std::env::var(PORT)) {
        return rank_main(r.parse().unwrap(), p.parse().unwrap());
    }
    let exe = std::env::current_exe().unwrap();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        off.push(round(&exe, "0"));
        on.push(round(&exe, "2000"));
    }
    let spread = |v: &[f64]| {
        let m = median(v.to_vec());
        100.0 * v.iter().map(|x| (x - m).abs()).sum::<f64>() / v.len() as f64 / m
    };
    let best = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
    println!("# 2 rank processes, 1 KiB all_reduce, {ROUNDS} alternating rounds of {ITERS} ops");
    println!(
        "{:<14} {:>10} {:>9} {:>13}",
        "recording", "median µs", "best µs", "mean |dev| %"
    );
    for (name, v) in [("off", &off), ("on (2000)", &on)] {
        let m = median(v.to_vec());
        println!("{name:<14} {m:>10.2} {:>9.2} {:>13.1}", best(v), spread(v));
    }
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

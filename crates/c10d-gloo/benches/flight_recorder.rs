//! What the flight recorder costs: a 1 KiB all-reduce between 2 rank processes (blocking calls,
//! as `dist.all_reduce(t)` makes them) with recording off and on (PyTorch's default, 2000
//! entries), over shared memory (1.15 µs an op in the README's "Flight recorder" table) and over
//! sockets (`C10D_GLOO_SHM=0 C10D_GLOO_CMA=0`; 33.5 µs there), plus the recorder's own cost per op in a loop, part by
//! part (the check of a recorder that is off, record, start, finish).
//!
//! Run: `cargo bench -p c10d-gloo --bench flight_recorder`. The bench re-runs itself as the two
//! ranks of each round (a fresh TcpStore and group per round). Inside a round both ranks run
//! blocks of ops (a few ms each) and switch recording off and on between blocks at the same op
//! ([`FlightRecorder::set_enabled`]), three blocks at a time: off, off again, on. So an "off"
//! block and the blocks after it ran in the same processes, on the same cores and
//! shared-memory segment: their ratio is free of the spread between processes (the placement
//! of two processes on two cores moves a 1 KiB all-reduce by ±10 %, more than what is
//! measured here). The second "off" block is the control: its ratio to the first shows what
//! two blocks differ by when nothing changes (an A/A test; its median should be 1.0). It
//! prints the median and best per-op time of each mode, and the median and quartiles of the
//! on/off and control ratios. Recording costs time when the quartiles of the on/off ratios lie
//! above 1.0, and nothing measurable when they do not (the verdict line says which).
//! Ranks are processes, as in a real job: ranks as threads of one process would share one
//! recorder, which real ranks never do.
//!
//! [`FlightRecorder::set_enabled`]: c10d_core::flight_recorder::FlightRecorder::set_enabled

use c10d_core::flight_recorder::OpRecord;
use c10d_core::*;
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROUNDS: usize = 4;
/// (off, off, on) block triples per round.
const PAIRS: usize = 24;
/// More than one lap of the default 2000-entry ring, so the timed ops are the steady state.
const WARMUP: usize = 3000;
const RANK: &str = "C10D_FR_BENCH_RANK";
const BLOCK_ENV: &str = "C10D_FR_BENCH_BLOCK";
const PORT: &str = "C10D_FR_BENCH_PORT";

/// One rank of a round: prints, per round of three blocks, the per-op µs of a block with
/// recording off, of a second one off (the A/A control: what two blocks differ by when
/// nothing changes) and of one on.
fn rank_main(rank: usize, port: u16, block: usize) {
    let o = TcpStoreOptions {
        timeout: Duration::from_secs(60),
        wait_for_workers: false,
        ..Default::default()
    };
    let store: Arc<dyn Store> = Arc::new(TcpStore::new("127.0.0.1", port, o).unwrap());
    let pg = ProcessGroupGloo::new(store, rank, 2, GlooOptions::default()).unwrap();
    let recorder = pg.flight_recorder().recorder().clone();
    let t = Tensor::from_vec(vec![1f32; 256]);
    let opts = AllreduceOptions {
        async_op: false,
        ..Default::default()
    };
    let run = |n: usize| {
        let start = Instant::now();
        for _ in 0..n {
            pg.all_reduce(std::slice::from_ref(&t), &opts)
                .unwrap()
                .wait()
                .unwrap();
        }
        start.elapsed().as_secs_f64() * 1e6 / n as f64
    };
    run(WARMUP);
    for _ in 0..PAIRS {
        recorder.set_enabled(false);
        let off = run(block);
        let control = run(block);
        recorder.set_enabled(true);
        let on = run(block);
        println!("{off} {control} {on}");
    }
}

/// A transport the benchmark compares on: its name, the environment that selects it, and the
/// ops per block (a block lasts a few milliseconds).
struct Transport {
    name: &'static str,
    env: &'static [(&'static str, &'static str)],
    block: usize,
}

const TRANSPORTS: [Transport; 2] = [
    Transport {
        name: "shared memory",
        env: &[],
        block: 4000,
    },
    Transport {
        name: "sockets",
        env: &[("C10D_GLOO_SHM", "0"), ("C10D_GLOO_CMA", "0")],
        block: 300,
    },
];

/// One round: two rank processes recording into a 2000-entry ring; rank 0's (off, control,
/// on) block times.
fn round(exe: &std::path::Path, transport: &Transport) -> Vec<[f64; 3]> {
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
                .env(BLOCK_ENV, transport.block.to_string())
                .env("TORCH_FR_BUFFER_SIZE", "2000")
                .envs(transport.env.iter().copied())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<String> = kids
        .into_iter()
        .map(|k| String::from_utf8(k.wait_with_output().unwrap().stdout).unwrap())
        .collect();
    let triple = |l: &str| {
        let v: Vec<f64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
        [v[0], v[1], v[2]]
    };
    outs[0].lines().map(triple).collect()
}

/// The value at fraction `q` of the sorted `v` (0.5: the median).
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Median and quartiles of `v`, as text.
fn spread(v: &[f64]) -> String {
    let q = |f| quantile(v, f);
    format!(
        "median {:.4}, quartiles {:.4}..{:.4}",
        q(0.5),
        q(0.25),
        q(0.75)
    )
}

/// Prints the off/on comparison of `transport`.
fn compare(exe: &std::path::Path, transport: &Transport) {
    let rows: Vec<[f64; 3]> = (0..ROUNDS).flat_map(|_| round(exe, transport)).collect();
    let col = |i: usize| -> Vec<f64> { rows.iter().map(|r| r[i]).collect() };
    let ratio = |i: usize| -> Vec<f64> { rows.iter().map(|r| r[i] / r[0]).collect() };
    println!(
        "# {}: 2 rank processes, 1 KiB all_reduce, {ROUNDS} rounds × {PAIRS} × (off, off, on) blocks of {} ops",
        transport.name, transport.block
    );
    println!("{:<14} {:>10} {:>9}", "recording", "median µs", "best µs");
    for (name, v) in [("off", col(0)), ("on (2000)", col(2))] {
        let best = quantile(&v, 0.0);
        println!("{name:<14} {:>10.3} {best:>9.3}", quantile(&v, 0.5));
    }
    let (on, control) = (ratio(2), ratio(1));
    println!("ratio on/off:         {}", spread(&on));
    println!("ratio off/off (A/A):  {}", spread(&control));
    let verdict = if quantile(&on, 0.25) > 1.0 {
        "measurable: the quartiles of the on/off ratios lie above 1.0"
    } else if quantile(&on, 0.75) < 1.0 {
        "none: ops ran faster with recording on (the quartiles lie below 1.0)"
    } else {
        "not measurable: 1.0 lies between the quartiles of the on/off ratios"
    };
    println!("recording cost over {}: {verdict}", transport.name);
}

/// How much of an op's recording a loop of [`recorder_ns`] does.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Parts {
    /// `record` on a recorder that is off (the check every op pays).
    Off,
    Record,
    RecordStart,
    RecordStartFinish,
}

/// The recorder alone: `parts` of a 1 KiB all-reduce's recording, in ns per op (best of 5
/// loops of 1M ops, one thread).
fn recorder_ns(parts: Parts) -> f64 {
    let fr = FlightRecorder::new(Default::default());
    let g = fr.register_group("gloo", "solo", "", &[], 0, 1);
    fr.set_enabled(parts != Parts::Off);
    let t = [Tensor::from_vec(vec![1f32; 256])];
    let n = 1_000_000u64;
    let one_loop = || {
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
            let Some(tr) = std::hint::black_box(g.record(&rec)) else {
                continue;
            };
            if parts >= Parts::RecordStart {
                tr.started();
            }
            if parts >= Parts::RecordStartFinish {
                tr.finished(Ok(()));
            }
        }
        start.elapsed().as_nanos() as f64 / n as f64
    };
    (0..5).map(|_| one_loop()).fold(f64::INFINITY, f64::min)
}

fn main() {
    if let (Ok(r), Ok(p), Ok(b)) = (
        std::env::var(RANK),
        std::env::var(PORT),
        std::env::var(BLOCK_ENV),
    ) {
        return rank_main(r.parse().unwrap(), p.parse().unwrap(), b.parse().unwrap());
    }
    let exe = std::env::current_exe().unwrap();
    for transport in &TRANSPORTS {
        compare(&exe, transport);
    }
    let [off, record, start, finish] = [
        Parts::Off,
        Parts::Record,
        Parts::RecordStart,
        Parts::RecordStartFinish,
    ]
    .map(recorder_ns);
    println!(
        "recorder alone, ns per op: record {:.1}, start {:.1}, finish {:.1}; in all {:.1} \
         (loop with recording off: {off:.1})",
        record - off,
        start - record,
        finish - start,
        finish - off
    );
}

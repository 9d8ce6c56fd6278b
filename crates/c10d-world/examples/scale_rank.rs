//! One rank of the scale benchmark (`cargo xtask bench-scale`): what a job of many ranks pays to
//! start and to make its groups, and what each rank holds while it all-reduces.
//!
//! ```text
//! c10drun --nnodes H --node-rank h --nproc-per-node M ... target/release/examples/scale_rank
//! ```
//!
//! Every rank, in order (H = `C10D_SCALE_HOSTS`, default `LOCAL_WORLD_SIZE` apart; M ranks per
//! host; milliseconds since `C10D_SCALE_T0_NS`, the launch time in Unix nanoseconds, or since
//! this process started):
//! 1. `init_process_group("gloo")` (env://) — `init` (since the launch: the launcher's own
//!    rendezvous included) and `init_in_process` (since this process started);
//! 2. a 1 KiB all_reduce on the world, every element checked — `first`;
//! 3. `new_group` for every host's ranks (every rank calls it H times, as PyTorch requires)
//!    and an all_reduce in its own — `new_group` (from a barrier to the op's end);
//! 4. `split_group` by host, an all_reduce — `split_group`;
//! 5. `init_device_mesh("cpu", (H, M))`, an all_reduce along each dimension — `mesh`;
//! 6. all_reduces of 1 KiB and 64 KiB (`C10D_SCALE_ITERS` each, default 5) and one of 1 MiB
//!    on the world while a thread counts this process's sockets every 2 ms — `sockets` (the most seen
//!    then, the store's connection and the listeners included) and `VmHWM`.
//!
//! Rank 0 prints one line `scale: key=value ...` with the largest value over the ranks (and the
//! sum of wrong elements); exit status 1 when any element was wrong.

use c10d_core::{ReduceOp, Result};
use c10d_world as dist;
use dist::GroupMember;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the launch (or since `start`).
struct Clock {
    t0_ns: Option<u128>,
    start: Instant,
}

impl Clock {
    fn new() -> Clock {
        let t0_ns = std::env::var("C10D_SCALE_T0_NS")
            .ok()
            .and_then(|v| v.parse().ok());
        Clock {
            t0_ns,
            start: Instant::now(),
        }
    }

    fn ms(&self) -> f64 {
        match self.t0_ns {
            Some(t0) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                now.saturating_sub(t0) as f64 / 1e6
            }
            None => self.start.elapsed().as_secs_f64() * 1e3,
        }
    }
}

fn env_usize(k: &str) -> Option<usize> {
    std::env::var(k).ok().and_then(|v| v.trim().parse().ok())
}

/// This rank's input: element `i` of rank `r` is `(r + i) % 5` (exact in float32 at any size
/// this benchmark runs).
fn input(r: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((r + i) % 5) as f32).collect()
}

/// Elements of an all_reduce SUM over `ranks` that differ from the expected sums.
fn wrong(got: &[f32], ranks: &[usize]) -> usize {
    got.iter()
        .enumerate()
        .filter(|(i, v)| {
            let want: usize = ranks.iter().map(|r| (r + i) % 5).sum();
            **v != want as f32
        })
        .count()
}

/// A checked all_reduce of `n` floats on `group` (global `ranks`): wrong elements.
fn checked_all_reduce(
    group: Option<&GroupMember>,
    ranks: &[usize],
    me: usize,
    n: usize,
) -> Result<usize> {
    let mut v = input(me, n);
    dist::all_reduce(&mut v[..]).group(group).run()?;
    Ok(wrong(&v, ranks))
}

/// Counts this process's sockets every 2 ms until stopped; the most seen.
struct SocketWatch {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn sockets_now() -> usize {
    c10d_testing::procfs::sockets("self")
}

impl SocketWatch {
    fn start() -> SocketWatch {
        let (stop, max) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (s, m) = (stop.clone(), max.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                m.fetch_max(sockets_now(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        SocketWatch {
            stop,
            max,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.max.load(Ordering::Relaxed).max(sockets_now())
    }
}

/// The peak resident set of this process, MiB.
fn vm_hwm_mib() -> f64 {
    c10d_testing::procfs::status_kib("self", "VmHWM").map_or(0.0, |kb| kb as f64 / 1024.0)
}

/// Each phase's figure on this rank, in the printed order.
const KEYS: [&str; 9] = [
    "init_ms",
    "init_in_process_ms",
    "first_all_reduce_ms",
    "new_group_ms",
    "split_group_ms",
    "mesh_ms",
    "sockets_during_all_reduce",
    "sockets_after",
    "vm_hwm_mib",
];

fn run() -> Result<bool> {
    let clock = Clock::new();
    dist::init_process_group(dist::InitOptions {
        backend: Some("gloo".into()),
        ..Default::default()
    })?;
    let mut fig = [0f64; KEYS.len()];
    fig[0] = clock.ms();
    fig[1] = clock.start.elapsed().as_secs_f64() * 1e3;
    let me = dist::get_rank(None)? as usize;
    let n = dist::get_world_size(None)? as usize;
    let everyone: Vec<usize> = (0..n).collect();
    let mut bad = checked_all_reduce(None, &everyone, me, 256)?;
    fig[2] = clock.ms();
    let m = env_usize("LOCAL_WORLD_SIZE").unwrap_or(n).max(1);
    let hosts = env_usize("C10D_SCALE_HOSTS").unwrap_or(n / m).max(1);
    let m = n / hosts;
    let host_ranks: Vec<Vec<usize>> = (0..hosts).map(|h| (h * m..(h + 1) * m).collect()).collect();
    let mine = &host_ranks[me / m];

    // new_group: every rank creates every host's group.
    dist::barrier().run()?;
    let t = Instant::now();
    let mut own = None;
    for g in &host_ranks {
        let member = dist::new_group(Some(g), Default::default())?;
        if g.contains(&me) {
            own = Some(member);
        }
    }
    bad += checked_all_reduce(own.as_ref(), mine, me, 256)?;
    fig[3] = t.elapsed().as_secs_f64() * 1e3;

    // split_group by host.
    dist::barrier().run()?;
    let t = Instant::now();
    let split = dist::split_group(None, &host_ranks, Default::default())?;
    bad += checked_all_reduce(Some(&split), mine, me, 256)?;
    fig[4] = t.elapsed().as_secs_f64() * 1e3;

    // A 2-D mesh (hosts × local ranks), an all_reduce along each dimension.
    dist::barrier().run()?;
    let t = Instant::now();
    let mesh = dist::init_device_mesh("cpu", &[hosts, m], Some(&["host", "local"]))?;
    let column: Vec<usize> = (0..hosts).map(|h| h * m + me % m).collect();
    bad += checked_all_reduce(Some(&mesh.get_group("host")?), &column, me, 256)?;
    bad += checked_all_reduce(Some(&mesh.get_group("local")?), mine, me, 256)?;
    fig[5] = t.elapsed().as_secs_f64() * 1e3;

    // Sockets while the world all-reduces.
    dist::barrier().run()?;
    let iters = env_usize("C10D_SCALE_ITERS").unwrap_or(5);
    let watch = SocketWatch::start();
    // (1 MiB once: a ring of n ranks takes 2(n − 1) steps, each waiting for every rank to
    // run, which on a 2-core machine with 512 ranks is seconds.)
    for (elems, times) in [(256usize, iters), (16 << 10, iters), (256 << 10, 1)] {
        for _ in 0..times {
            bad += checked_all_reduce(None, &everyone, me, elems)?;
        }
    }
    fig[6] = watch.finish() as f64;
    fig[7] = sockets_now() as f64;
    fig[8] = vm_hwm_mib();

    dist::all_reduce(&mut fig[..]).op(ReduceOp::Max).run()?;
    let mut wrong_total = [bad as f64];
    dist::all_reduce(&mut wrong_total[..]).run()?;
    if me == 0 {
        let kv: Vec<String> = KEYS
            .iter()
            .zip(fig)
            .map(|(k, v)| format!("{k}={v:.1}"))
            .collect();
        println!(
            "scale: ranks={n} hosts={hosts} {} wrong={}",
            kv.join(" "),
            wrong_total[0]
        );
    }
    dist::destroy_process_group(None)?;
    Ok(wrong_total[0] == 0.0)
}

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("scale_rank: {e}");
            std::process::exit(1);
        }
    }
}

//! Mesh creation time (`init_device_mesh`), cargo bench target (`harness = false`):
//!
//! 1. 8 ranks as threads of this process over one TcpStore and gloo: shapes (8,), (2, 4),
//!    (2, 2, 2), with and without the cross-rank argument check;
//! 2. 4 processes (this binary started again per rank, joining a TcpStore this process hosts,
//!    as under c10drun) beside PyTorch's `init_device_mesh` on the same store server, in the
//!    same run, when `C10D_TORCH_PYTHON` names a Python with PyTorch (`cargo xtask bench` sets
//!    it): shapes (4,), (2, 2).
//!
//! A figure is the slowest rank's median over `REPS` meshes of the wall time of one
//! `init_device_mesh` call, all ranks starting together after a barrier; it includes the
//! argument check (unless said otherwise) and the creation of every group with its gloo
//! connections and shared-memory segment (also shown without the segment, `C10D_GLOO_SHM=0`);
//! not the world's own initialisation.
//!
//! Run: `cargo bench -p c10d-world --bench device_mesh`

use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use c10d_world::{InitOptions, MeshOptions, World};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const REPS: usize = 5;
const CHILD: &str = "C10D_MESH_BENCH_CHILD";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn store(port: u16) -> Arc<dyn Store> {
    let opts = TcpStoreOptions {
        timeout: Duration::from_secs(120),
        wait_for_workers: false,
        ..Default::default()
    };
    Arc::new(TcpStore::new("127.0.0.1", port, opts).expect("store client"))
}

/// Median milliseconds of `REPS` meshes of `shape` on this rank (barrier before each).
fn time_meshes(w: &World, shape: &[usize], check: bool) -> f64 {
    let names: Vec<String> = (0..shape.len()).map(|d| format!("d{d}")).collect();
    let times = (0..REPS)
        .map(|_| {
            w.barrier().run().expect("barrier");
            let opts = MeshOptions {
                mesh_dim_names: Some(names.clone()),
                check_arguments: check,
                ..Default::default()
            };
            let t = Instant::now();
            let m = w.init_device_mesh_with("cpu", shape, opts).expect("mesh");
            let ms = t.elapsed().as_secs_f64() * 1e3;
            drop(m);
            ms
        })
        .collect();
    median(times)
}

fn init(w: &World, port: u16, rank: usize, n: usize) {
    w.init_process_group(InitOptions {
        backend: Some("gloo".into()),
        store: Some(store(port)),
        rank: Some(rank),
        world_size: Some(n),
        timeout: Some(Duration::from_secs(120)),
        ..Default::default()
    })
    .expect("init");
}

fn threads(n: usize, cases: &[(&'static [usize], bool)]) -> Vec<f64> {
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..Default::default()
    })
    .expect("store server");
    let port = srv.port();
    let cases = cases.to_vec();
    let per_rank: Vec<Vec<f64>> = (0..n)
        .map(|r| {
            let cases = cases.clone();
            std::thread::spawn(move || {
                let w = World::new();
                init(&w, port, r, n);
                let out = cases.iter().map(|(s, c)| time_meshes(&w, s, *c)).collect();
                w.barrier().run().expect("barrier");
                w.destroy_process_group(None).expect("destroy");
                out
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect();
    slowest(&per_rank)
}

/// Per case, the slowest rank's figure.
fn slowest(per_rank: &[Vec<f64>]) -> Vec<f64> {
    (0..per_rank[0].len())
        .map(|i| per_rank.iter().map(|r| r[i]).fold(0.0, f64::max))
        .collect()
}

const PROC_SHAPES: [&[usize]; 2] = [&[4], &[2, 2]];

fn child() {
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    let n: usize = std::env::var("WORLD_SIZE").unwrap().parse().unwrap();
    let port: u16 = std::env::var("MASTER_PORT").unwrap().parse().unwrap();
    let w = World::new();
    init(&w, port, rank, n);
    let figs: Vec<String> = PROC_SHAPES
        .iter()
        .map(|s| format!("{:.3}", time_meshes(&w, s, true)))
        .collect();
    println!("TIMES {}", figs.join(" "));
    w.barrier().run().expect("barrier");
    w.destroy_process_group(None).expect("destroy");
}

/// Runs `n` ranks of `cmd(rank)` against a fresh store server; the slowest rank per shape.
fn processes(n: usize, cmd: impl Fn(usize) -> Command) -> Vec<f64> {
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..Default::default()
    })
    .expect("store server");
    let kids: Vec<_> = (0..n)
        .map(|r| {
            let mut c = cmd(r);
            c.env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", srv.port().to_string())
                .env("TORCHELASTIC_USE_AGENT_STORE", "True")
                .stdout(Stdio::piped());
            c.spawn().expect("spawn rank")
        })
        .collect();
    let per_rank: Vec<Vec<f64>> = kids
        .into_iter()
        .map(|k| {
            let out = k.wait_with_output().expect("rank output");
            assert!(out.status.success(), "a rank failed");
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let line = text
                .lines()
                .find(|l| l.starts_with("TIMES "))
                .expect("TIMES line");
            line[6..].split(' ').map(|x| x.parse().unwrap()).collect()
        })
        .collect();
    slowest(&per_rank)
}

fn main() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    println!("init_device_mesh, 8 ranks as threads, gloo, TcpStore (slowest rank's median of {REPS}, ms)");
    let cases: [(&'static [usize], bool); 4] = [
        (&[8], true),
        (&[2, 4], true),
        (&[2, 2, 2], true),
        (&[2, 2, 2], false),
    ];
    let t = threads(8, &cases);
    for ((shape, check), ms) in cases.iter().zip(&t) {
        let note = if *check { "" } else { " (argument check off)" };
        println!("  shape {shape:?}: {ms:.2} ms{note}");
    }
    println!("init_device_mesh, 4 processes, gloo, TcpStore (slowest rank's median of {REPS}, ms)");
    let exe = std::env::current_exe().expect("current exe");
    let ours = processes(4, |_| {
        let mut c = Command::new(&exe);
        c.env(CHILD, "1");
        c
    });
    // the same without the groups' shared-memory segments (whose pages every new gloo group
    // reserves when it connects)
    let no_shm = processes(4, |_| {
        let mut c = Command::new(&exe);
        c.env(CHILD, "1").env("C10D_GLOO_SHM", "0");
        c
    });
    let torch = std::env::var("C10D_TORCH_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .map(|py| {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_device_mesh.py");
            processes(4, |_| {
                let mut c = Command::new(&py);
                c.arg(script).env("REPS", REPS.to_string());
                c
            })
        });
    for (i, shape) in PROC_SHAPES.iter().enumerate() {
        match &torch {
            Some(t) => println!(
                "  shape {shape:?}: c10d-rs {:.2} ms, PyTorch {:.2} ms (PyTorch / c10d-rs = {:.2}x); C10D_GLOO_SHM=0: {:.2} ms ({:.2}x)",
                ours[i],
                t[i],
                t[i] / ours[i],
                no_shm[i],
                t[i] / no_shm[i]
            ),
            None => println!(
                "  shape {shape:?}: c10d-rs {:.2} ms, C10D_GLOO_SHM=0: {:.2} ms (no PyTorch baseline: set C10D_TORCH_PYTHON)",
                ours[i], no_shm[i]
            ),
        }
    }
}

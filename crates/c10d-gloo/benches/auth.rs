//! What authentication (`C10D_AUTH_SECRET_FILE`, `c10d_store::auth`) costs: store connection
//! set-up, group creation of 4 ranks (threads in this process, over a HashStore), and the
//! per-op path (1 KiB all_reduce on the created groups), each without and with a secret,
//! alternating rounds; medians, in µs.
//!
//!     cargo bench -p c10d-gloo --bench auth

use c10d_core::{AllreduceOptions, Collectives, Tensor};
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::{
    AuthSecret, HashStore, ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROUNDS: usize = 5;
const CONNECTS: usize = 100;
const OPS: usize = 2000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn store_connects(secret: Option<&AuthSecret>) -> f64 {
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        auth: secret.cloned(),
        ..Default::default()
    })
    .unwrap();
    let times = (0..CONNECTS)
        .map(|_| {
            let t0 = Instant::now();
            let s = TcpStore::new(
                "127.0.0.1",
                srv.port(),
                TcpStoreOptions {
                    wait_for_workers: false,
                    auth: secret.cloned(),
                    ..Default::default()
                },
            )
            .unwrap();
            let us = t0.elapsed().as_secs_f64() * 1e6;
            drop(s);
            us
        })
        .collect();
    median(times)
}

/// (group creation µs, 1 KiB all_reduce µs per op) for 4 ranks on threads.
fn group_of_four() -> (f64, f64) {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let t0 = Instant::now();
    let pgs: Vec<Arc<ProcessGroupGloo>> = (0..4)
        .map(|r| {
            let s = store.clone();
            std::thread::spawn(move || {
                let o = GlooOptions {
                    timeout: Duration::from_secs(60),
                    ..Default::default()
                };
                ProcessGroupGloo::new(s, r, 4, o).unwrap()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let create = t0.elapsed().as_secs_f64() * 1e6;
    let per_op: Vec<f64> = pgs
        .iter()
        .cloned()
        .map(|pg| {
            std::thread::spawn(move || {
                let t = Tensor::from_vec(vec![1.0f32; 256]);
                let opts = AllreduceOptions::default();
                let t0 = Instant::now();
                for _ in 0..OPS {
                    pg.all_reduce(std::slice::from_ref(&t), &opts)
                        .unwrap()
                        .wait()
                        .unwrap();
                }
                t0.elapsed().as_secs_f64() * 1e6 / OPS as f64
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    (create, per_op.into_iter().fold(0.0, f64::max))
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    let secret = AuthSecret::create_file(&path).unwrap();
    let mut rows = [
        [Vec::new(), Vec::new(), Vec::new()],
        [Vec::new(), Vec::new(), Vec::new()],
    ];
    for _ in 0..ROUNDS {
        for (i, with) in [false, true].into_iter().enumerate() {
            // The gloo mesh reads the environment (single-threaded here between rounds).
            if with {
                std::env::set_var("C10D_AUTH_SECRET_FILE", &path);
            } else {
                std::env::remove_var("C10D_AUTH_SECRET_FILE");
            }
            rows[i][0].push(store_connects(with.then_some(&secret)));
            let (create, op) = group_of_four();
            rows[i][1].push(create);
            rows[i][2].push(op);
        }
    }
    println!("# authentication cost, medians of {ROUNDS} alternating rounds (µs)");
    println!(
        "{:<40} {:>12} {:>12} {:>8}",
        "", "no secret", "secret", "ratio"
    );
    let names = [
        "store connect (TCP + handshake + PING)",
        "4-rank group creation (mesh set-up)",
        "1 KiB all_reduce per op, 4 ranks",
    ];
    for (k, name) in names.iter().enumerate() {
        let (a, b) = (median(rows[0][k].clone()), median(rows[1][k].clone()));
        println!("{name:<40} {a:>12.1} {b:>12.1} {:>7.2}x", b / a);
    }
}

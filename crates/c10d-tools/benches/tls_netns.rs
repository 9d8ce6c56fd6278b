//! What TLS costs between hosts: a 16 MiB float all_reduce between two network namespaces
//! joined by a veth pair (one `c10d-bench` rank in each, env:// rendezvous on host 0), with and
//! without `C10D_TLS_*` (store and mesh encrypted), in alternating rounds of the same run.
//!
//! `cargo bench -p c10d-tools --bench tls_netns` (root and `ip netns` needed; says why not
//! otherwise). Each figure is c10d-bench's bus bandwidth (GB/s; nccl-tests' definition, the
//! slowest rank's time per op, 20 timed ops after 3 warm-up ops, every element checked after);
//! the round's ratio is plain / TLS. It includes the whole op: encryption and decryption on
//! both ranks, the veth pair's copies, and the reduction. Environment: `TLS_BENCH_ROUNDS`
//! (default 3), `TLS_BENCH_BYTES` (default 16M).

use c10d_testing::netns;
use netns::Hosts;
use std::process::Output;

const BENCH: &str = env!("CARGO_BIN_EXE_c10d-bench");

/// One 2-rank all_reduce job (rank r in namespace r) with `env`; each rank's output.
fn job(hosts: &Hosts, port: u16, bytes: &str, env: &[(&str, String)]) -> Vec<Output> {
    let kids: Vec<_> = (0..2)
        .map(|r| {
            hosts
                .rank_command(r, BENCH, r, 2, 1, port)
                .args([
                    "all_reduce",
                    "-b",
                    bytes,
                    "-e",
                    bytes,
                    "-n",
                    "20",
                    "-w",
                    "3",
                ])
                .args(["--timeout", "120"])
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .spawn()
                .expect("spawn c10d-bench")
        })
        .collect();
    kids.into_iter()
        .map(|k| k.wait_with_output().expect("wait for c10d-bench"))
        .collect()
}

/// Rank 0's average bus bandwidth (GB/s), after checking that both ranks succeeded and no
/// element was wrong.
fn busbw(outs: &[Output], what: &str) -> f64 {
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "{what}: rank {r} failed:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let table = String::from_utf8_lossy(&outs[0].stdout);
    assert!(
        table.contains("Out of bounds values : 0 OK"),
        "{what}:\n{table}"
    );
    table
        .lines()
        .find_map(|l| l.strip_prefix("# Avg bus bandwidth    :"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{what}: no bandwidth line:\n{table}"))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("tls_netns: benchmark");
        return;
    }
    let Some(hosts) = Hosts::or_skip("tlsbench", 7) else {
        return;
    };
    let rounds: usize = std::env::var("TLS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let bytes = std::env::var("TLS_BENCH_BYTES").unwrap_or_else(|_| "16M".into());
    let dir = tempfile::tempdir().expect("temporary directory");
    let files = c10d_store::tls::create_job_files(dir.path()).expect("TLS files");
    let tls_env = vec![
        ("C10D_TLS_CERT_FILE", files.cert.display().to_string()),
        ("C10D_TLS_KEY_FILE", files.key.display().to_string()),
        ("C10D_TLS_CA_FILE", files.ca.display().to_string()),
    ];
    println!("# {bytes} float all_reduce, 2 ranks in 2 network namespaces (veth), bus GB/s");
    println!("# round   plain     TLS   plain/TLS");
    let mut port = 29_600;
    for round in 1..=rounds {
        let plain = busbw(&job(&hosts, port, &bytes, &[]), "plain");
        let tls = busbw(&job(&hosts, port + 1, &bytes, &tls_env), "TLS");
        port += 2;
        println!("{round:7} {plain:7.3} {tls:7.3} {:9.2}", plain / tls);
    }
}

//! TLS on the mesh's TCP connections (`GlooOptions::tls`): ranks with certificates of the
//! job's CA reduce correctly over encrypted connections (sizes that make the session hold
//! unsent ciphertext, odd lengths, values that differ per rank and element); a rank without
//! TLS or with a certificate of another CA cannot join, and every rank fails with an error
//! that names the problem.

use c10d_core::Collectives;
mod common;
use c10d_core::Tensor;
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::tls::{create_job_files, TlsConfig};
use c10d_store::{HashStore, Store};
use common::*;
use std::sync::Arc;
use std::time::Duration;

fn job_tls() -> (TlsConfig, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let files = create_job_files(dir.path()).unwrap();
    (TlsConfig::from_files(&files).unwrap(), dir)
}

/// TCP only (no same-host Unix sockets, so TLS applies), with `tls`.
fn tcp_opts(tls: Option<TlsConfig>, timeout: Duration) -> GlooOptions {
    GlooOptions {
        timeout,
        local_unix_sockets: false,
        tls,
        ..Default::default()
    }
}

fn values(rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| (rank * 7 + i % 251) as f32).collect()
}

#[test]
fn ranks_of_the_jobs_ca_reduce_over_tls() {
    let (tls, _dir) = job_tls();
    let world = 3;
    let pgs = make_world(world, tcp_opts(Some(tls), Duration::from_secs(60)));
    for n in [1usize, 1000, (4 << 20) + 3] {
        let ts: Vec<Tensor> = (0..world).map(|r| Tensor::from_vec(values(r, n))).collect();
        all_reduce_each(&pgs, &ts);
        let want: Vec<f32> = (0..n)
            .map(|i| (0..world).map(|r| (r * 7 + i % 251) as f32).sum())
            .collect();
        for (r, t) in ts.iter().enumerate() {
            assert!(f32s(t) == want, "rank {r}, {n} elements: wrong sum");
        }
    }
    // Point to point as well: rank 2 sends to rank 0.
    let sent = Tensor::from_vec(values(2, 300_001));
    let got = Tensor::from_vec(vec![0f32; 300_001]);
    let p2 = pgs[2].clone();
    let s = sent.clone();
    let tx = std::thread::spawn(move || p2.send(&[s], 0, 5).unwrap().wait().unwrap());
    pgs[0]
        .recv(std::slice::from_ref(&got), 2, 5)
        .unwrap()
        .wait()
        .unwrap();
    tx.join().unwrap();
    assert_eq!(f32s(&got), values(2, 300_001));
}

/// Builds a 2-rank group where rank 1 has `tls1`; returns both ranks' results.
fn join_with(
    tls0: TlsConfig,
    tls1: Option<TlsConfig>,
) -> (
    c10d_core::Result<Arc<ProcessGroupGloo>>,
    c10d_core::Result<Arc<ProcessGroupGloo>>,
) {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let t = Duration::from_secs(3);
    let s0 = store.clone();
    let r0 = std::thread::spawn(move || ProcessGroupGloo::new(s0, 0, 2, tcp_opts(Some(tls0), t)));
    let r1 = ProcessGroupGloo::new(store, 1, 2, tcp_opts(tls1, t));
    (r0.join().unwrap(), r1)
}

#[test]
fn a_rank_without_tls_cannot_join() {
    let (tls, _dir) = job_tls();
    let (r0, r1) = join_with(tls, None);
    let Err(e1) = r1 else {
        panic!("the plain rank joined")
    };
    assert!(e1.message().contains("requires TLS"), "{e1}");
    let Err(e0) = r0 else {
        panic!("the TLS rank accepted a plain peer")
    };
    assert!(e0.message().contains("rank(s) 1"), "{e0}");
}

#[test]
fn a_rank_of_another_ca_cannot_join() {
    let (tls, _dir) = job_tls();
    let (other, _dir2) = job_tls();
    let (r0, r1) = join_with(tls, Some(other));
    let Err(e1) = r1 else {
        panic!("a rank of another CA joined")
    };
    assert!(
        e1.message().contains("TLS handshake with rank 0 failed"),
        "{e1}"
    );
    let Err(e0) = r0 else {
        panic!("rank 0 accepted a certificate of another CA")
    };
    assert!(e0.message().contains("rank(s) 1"), "{e0}");
}

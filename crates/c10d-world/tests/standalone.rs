//! Standalone groups (vLLM's `StatelessProcessGroup`-style): rank 0 hosts the store, every rank
//! joins; two groups side by side in each process (ranks as threads), collectives and object
//! exchange checked by value; every blocking step bounded, its error naming the step.

use c10d_core::Tensor;
use c10d_world::standalone::{StandaloneGroup, StandaloneOptions};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const N: usize = 3;

fn opts(port: u16, rank: usize, name: &str) -> StandaloneOptions {
    StandaloneOptions {
        timeout: Some(Duration::from_secs(30)),
        ..StandaloneOptions::new("127.0.0.1", port, rank, N, name)
    }
}

/// Rank 0 listens on port 0 and tells the others the port; everyone joins.
fn groups(name: &'static str) -> Vec<mpsc::Receiver<StandaloneGroup>> {
    let (port_tx, port_rx) = mpsc::channel::<u16>();
    let mut out = Vec::new();
    let mut ports = Vec::new();
    for rank in 0..N {
        let (tx, rx) = mpsc::channel();
        out.push(rx);
        if rank == 0 {
            let port_tx = port_tx.clone();
            std::thread::spawn(move || {
                let host = StandaloneGroup::listen("127.0.0.1", 0).unwrap();
                for _ in 1..N {
                    port_tx.send(host.port()).unwrap();
                }
                tx.send(host.join(opts(0, 0, name)).unwrap()).unwrap();
            });
        } else {
            ports.push(tx);
        }
    }
    for (i, tx) in ports.into_iter().enumerate() {
        let port = port_rx.recv().unwrap();
        std::thread::spawn(move || {
            tx.send(StandaloneGroup::join(opts(port, i + 1, name)).unwrap())
                .unwrap();
        });
    }
    out
}

#[test]
fn two_groups_side_by_side() {
    let (a, b) = (groups("trainer-sync"), groups("second"));
    let a: Vec<StandaloneGroup> = a.into_iter().map(|r| r.recv().unwrap()).collect();
    let b: Vec<StandaloneGroup> = b.into_iter().map(|r| r.recv().unwrap()).collect();
    let handles: Vec<_> = a
        .into_iter()
        .zip(b)
        .map(|(ga, gb)| {
            std::thread::spawn(move || {
                let r = ga.rank();
                let t = Tensor::from_vec(vec![r as f32 + 1.0; 4]);
                ga.world().all_reduce(&t).run().unwrap();
                let u = Tensor::from_vec(vec![10 * (r as i64 + 1)]);
                gb.world().all_reduce(&u).run().unwrap();
                let names = (r == 0).then(|| vec![("w".to_string(), vec![2i64, 3])]);
                let got: Vec<(String, Vec<i64>)> = ga.broadcast_obj(names, 0).unwrap();
                let all = gb.all_gather_obj(&format!("rank{r}")).unwrap();
                ga.barrier().unwrap();
                gb.barrier().unwrap();
                ga.destroy().unwrap();
                gb.destroy().unwrap();
                (
                    t.to_vec::<f32>().unwrap(),
                    u.to_vec::<i64>().unwrap(),
                    got,
                    all,
                )
            })
        })
        .collect();
    for h in handles {
        let (t, u, got, all) = h.join().unwrap();
        assert_eq!(t, vec![6.0; 4]);
        assert_eq!(u, vec![60]);
        assert_eq!(got, vec![("w".to_string(), vec![2, 3])]);
        assert_eq!(all, vec!["rank0", "rank1", "rank2"]);
    }
}

#[test]
fn every_step_is_bounded_and_named() {
    // A socket that accepts connections (in the kernel's backlog) but never answers: no
    // store there.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let o = StandaloneOptions {
        timeout: Some(Duration::from_secs(1)),
        ..StandaloneOptions::new("127.0.0.1", port, 1, 2, "nobody")
    };
    let start = Instant::now();
    let e = StandaloneGroup::join(o)
        .err()
        .expect("joining a store nobody hosts fails");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let m = e.to_string();
    assert!(m.contains("connecting to the store failed after"), "{m}");
    assert!(m.contains(&format!("127.0.0.1:{port}")), "{m}");
    // Rank 1 never joins: rank 0's initialisation fails within its timeout.
    let host = StandaloneGroup::listen("127.0.0.1", 0).unwrap();
    let o = StandaloneOptions {
        timeout: Some(Duration::from_secs(2)),
        ..StandaloneOptions::new("127.0.0.1", 0, 0, 2, "alone")
    };
    let start = Instant::now();
    let e = host.join(o).err().expect("a group missing a rank fails");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert!(
        e.to_string()
            .contains("initialising the group failed after"),
        "{e}"
    );
}

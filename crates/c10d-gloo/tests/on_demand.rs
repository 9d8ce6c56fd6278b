//! Connections on demand: a rank connects to the peers its algorithms need, not to the whole
//! group, and a peer that never connects is named when the op that needs it times out.

mod common;
use c10d_core::*;
use c10d_gloo::GlooOptions;
use common::*;
use std::time::Duration;

/// Over sockets (no shared memory, no cross-memory attach: every rank talks through the wire).
fn sockets() -> GlooOptions {
    GlooOptions {
        shared_memory: false,
        cross_memory_attach: false,
        ..opts()
    }
}

#[test]
fn a_large_group_connects_only_what_its_algorithms_need() {
    // 40 ranks: a 1 KiB all_reduce runs recursive doubling (5 round partners + a fold partner),
    // a 256 KiB one the ring (2 neighbours, connected at creation); the direct exchange would
    // have connected all 39 peers.
    let n = 40;
    let res = run_world(n, sockets(), move |r, pg| {
        let after_creation = pg.connected_peers();
        let mut wrong = 0;
        for elems in [256usize, 64 << 10] {
            let t = Tensor::from_vec((0..elems).map(|i| ((r + i) % 7) as f32).collect::<Vec<_>>());
            pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            let want = |i: usize| (0..n).map(|q| (q + i) % 7).sum::<usize>() as f32;
            wrong += f32s(&t)
                .iter()
                .enumerate()
                .filter(|(i, v)| **v != want(*i))
                .count();
        }
        (after_creation, pg.connected_peers(), wrong)
    });
    for (r, (created, after, wrong)) in res.into_iter().enumerate() {
        assert_eq!(wrong, 0, "rank {r}");
        assert!(
            created <= 2,
            "rank {r}: {created} connections after creation"
        );
        // Ring neighbours, at most 6 doubling partners (overlapping or not).
        assert!(
            after <= 8,
            "rank {r}: {after} connections after the all_reduces"
        );
    }
}

#[test]
fn a_peer_that_never_connects_is_named() {
    // Lazy init and 4 ranks, of which rank 3 never makes its group: the others' all_reduce
    // (the direct exchange: everyone needs rank 3) times out naming it.
    let o = GlooOptions {
        lazy_init: true,
        ..sockets()
    };
    let store: std::sync::Arc<dyn c10d_store::Store> =
        std::sync::Arc::new(c10d_store::HashStore::new());
    let hs: Vec<_> = (0..3)
        .map(|r| {
            let (s, o) = (store.clone(), o.clone());
            std::thread::spawn(move || {
                let pg = c10d_gloo::ProcessGroupGloo::new(s, r, 4, o).unwrap();
                let t = Tensor::full(1.0f32, &[256]);
                let opts = AllreduceOptions {
                    timeout: Some(Duration::from_millis(600)),
                    ..Default::default()
                };
                let e = pg.all_reduce(&[t], &opts).unwrap().wait().unwrap_err();
                e.to_string()
            })
        })
        .collect();
    for (r, h) in hs.into_iter().enumerate() {
        let e = h.join().unwrap();
        assert!(
            e.contains(&format!(
                "Timed out waiting 600ms for ALLREDUCE (seq 0) on rank {r}"
            )),
            "{e}"
        );
        assert!(
            e.contains(&format!("rank(s) 3 never connected to rank {r}")),
            "{e}"
        );
    }
}

/// A store that counts the requests of one rank.
struct Counting {
    inner: std::sync::Arc<dyn c10d_store::Store>,
    n: std::sync::atomic::AtomicUsize,
}

impl Counting {
    fn tick(&self) {
        self.n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl c10d_store::Store for Counting {
    fn set(&self, k: &str, v: &[u8]) -> Result<()> {
        self.tick();
        self.inner.set(k, v)
    }
    fn get(&self, k: &str) -> Result<Vec<u8>> {
        self.tick();
        self.inner.get(k)
    }
    fn add(&self, k: &str, d: i64) -> Result<i64> {
        self.tick();
        self.inner.add(k, d)
    }
    fn compare_set(&self, k: &str, e: &[u8], d: &[u8]) -> Result<Vec<u8>> {
        self.tick();
        self.inner.compare_set(k, e, d)
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.tick();
        self.inner.check(keys)
    }
    fn wait_timeout(&self, keys: &[&str], t: Duration) -> Result<()> {
        self.tick();
        self.inner.wait_timeout(keys, t)
    }
    fn delete_key(&self, k: &str) -> Result<bool> {
        self.tick();
        self.inner.delete_key(k)
    }
    fn num_keys(&self) -> Result<i64> {
        self.tick();
        self.inner.num_keys()
    }
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        self.tick();
        self.inner.multi_get(keys)
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&self, t: Duration) {
        self.inner.set_timeout(t)
    }
    fn clone_store(&self) -> Result<std::sync::Arc<dyn c10d_store::Store>> {
        self.inner.clone_store()
    }
}

#[test]
fn making_a_group_and_its_first_all_reduce_cost_a_rank_the_same_store_requests_at_any_size() {
    // A full mesh would read every peer's address (n − 1 reads and waits); on demand a rank
    // writes its 2 keys, reads its neighbours' (and its doubling partners' when it dials them),
    // whatever n is. (Waits are counted per 100 ms slice, so a slow neighbour adds a few.)
    let per_rank = |n: usize| -> Vec<usize> {
        let shared: std::sync::Arc<dyn c10d_store::Store> =
            std::sync::Arc::new(c10d_store::HashStore::new());
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let s = std::sync::Arc::new(Counting {
                        inner: shared,
                        n: Default::default(),
                    });
                    let pg = c10d_gloo::ProcessGroupGloo::new(s.clone(), r, n, sockets()).unwrap();
                    let t = Tensor::full(1.0f32, &[256]);
                    pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
                        .unwrap()
                        .wait()
                        .unwrap();
                    assert_eq!(f32s(&t), vec![n as f32; 256]);
                    let count = s.n.load(std::sync::atomic::Ordering::Relaxed);
                    drop(pg);
                    count
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    };
    for n in [24, 64] {
        let counts = per_rank(n);
        let most = *counts.iter().max().unwrap();
        println!(
            "{n} ranks: at most {most} store requests per rank (creation and a 1 KiB all_reduce)"
        );
        // 2 writes + (2 reads + a wait or a few) per dialled peer, at most 7 of them at 64.
        assert!(
            most <= 40,
            "n {n}: a rank made {most} store requests: {counts:?}"
        );
    }
}

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

//! What a rank holds per peer of a group before it connects to any: with connections on
//! demand, a group of 100,000 ranks must cost a rank little more than its per-peer tables
//! (about 120 bytes a peer: a pointer to a connection not made yet, receive queues, liveness
//! and flow-control counters), not a connection's worth of state per peer. Alone in its test
//! binary: it reads this process's resident set.

use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use std::sync::Arc;

fn rss_kib() -> u64 {
    c10d_testing::procfs::status_kib("self", "VmRSS").expect("VmRSS")
}

#[test]
fn a_group_of_100k_ranks_costs_a_rank_a_few_mib() {
    let n = 100_000;
    let store: Arc<dyn c10d_store::Store> = Arc::new(c10d_store::HashStore::new());
    let before = rss_kib();
    let o = GlooOptions {
        lazy_init: true,
        ..Default::default()
    };
    let pg = ProcessGroupGloo::new(store, 0, n, o).expect("create");
    let grown = rss_kib().saturating_sub(before);
    assert_eq!(pg.connected_peers(), 0);
    // 116 bytes a peer measured (11 MiB); a connection's state per peer was 1.4 KiB (140 MiB).
    assert!(grown < 32 << 10, "{grown} KiB for a group of {n}");
}

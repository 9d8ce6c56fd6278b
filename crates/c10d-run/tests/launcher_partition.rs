//! A partitioned node's launcher must not hang: two network namespaces act as two hosts,
//! joined by a veth pair with private addresses (10.231.1.1 / 10.231.1.2, which exist only
//! inside them). `c10drun --nnodes 2` runs on each with one `c10d-bench` rank per node; then
//! the link is taken down. Both workers must fail naming the other rank, and both launchers
//! must exit, bounded, with summaries that say what went wrong. Needs root and `ip netns`;
//! skips with a printed reason otherwise. The namespaces are removed even when the test fails.

mod launcher_util;
use c10d_testing::netns;
use launcher_util::*;
use netns::Hosts;
use std::time::{Duration, Instant};

/// The `c10d-bench` binary of c10d-tools (built with cargo when missing).
static BENCH: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| workspace_bin("c10d-tools", "c10d-bench"));

/// `c10drun` for node `node` of the 2-node job, inside its namespace (node 0 picks the store's
/// port: pass "0").
fn node(hosts: &Hosts, node: usize, port: &str) -> Job {
    let rank = node.to_string();
    let c10drun = c10drun();
    let args = [
        "netns",
        "exec",
        &hosts.names[node],
        &c10drun,
        "--nnodes",
        "2",
        "--node-rank",
        &rank,
        "--nproc-per-node",
        "1",
        "--master-addr",
        "10.231.1.1",
        "--master-port",
        port,
        "--run-id",
        "partition",
        "--rdzv-timeout",
        "8",
        "--stop-timeout",
        "2",
        "--rdzv-conf",
        "read_timeout=8",
        BENCH.as_str(),
        "all_reduce",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1000000000",
        "--timeout",
        "5",
    ];
    spawn("ip", &args, &[])
}

#[test]
fn both_launchers_exit_when_the_link_goes_down() {
    let Some(hosts) = Hosts::or_skip("part", 1) else {
        return;
    };
    let mut n0 = node(&hosts, 0, "0");
    let port = n0.wait_for_store_port("10.231.1.1", Duration::from_secs(60));
    let n1 = node(&hosts, 1, &port);
    n0.wait_for_stdout("[rank 0]: # c10d-bench all_reduce", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    hosts.link_down().unwrap();
    let o1 = n1.finish(Duration::from_secs(90));
    let t1 = t0.elapsed();
    let o0 = n0.finish(Duration::from_secs(90));
    let t0 = t0.elapsed();
    println!(
        "after the link went down: node 1's launcher exited in {:.1} s, node 0's in {:.1} s",
        t1.as_secs_f64(),
        t0.as_secs_f64()
    );
    println!("node 0:\n{}\nnode 1:\n{}", o0.summary(), o1.summary());
    assert_eq!(o0.code, Some(1), "node 0: {o0}");
    assert_eq!(o1.code, Some(1), "node 1: {o1}");
    // Each worker names the other rank, and each launcher's summary shows it.
    assert!(
        o0.summary().contains("rank 0: error: ProcessGroupGloo")
            && o0.summary().contains("rank(s) 1"),
        "{o0}"
    );
    assert!(
        o1.summary().contains("rank 1: error: ProcessGroupGloo")
            && o1.summary().contains("rank(s) 0"),
        "{o1}"
    );
    // Node 1 cannot reach the store on node 0; node 0 gives up waiting for node 1.
    assert!(
        o1.summary()
            .contains(&format!("the store at 10.231.1.1:{port} is unreachable")),
        "{o1}"
    );
    assert!(
        o0.summary()
            .contains("exit barrier: not every node finished"),
        "{o0}"
    );
}

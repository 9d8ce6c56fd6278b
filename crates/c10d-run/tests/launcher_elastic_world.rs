//! Elastic node counts under `c10drun --nnodes 1:3 --rdzv-backend c10d`, with network
//! namespaces as hosts (three on one switch, private addresses that exist only inside them).
//! One node starts alone; a second and a third join; the third is then cut off the network.
//! Every transition must end with every worker on the new world size running correct
//! collectives (values differ per rank and element), without counting against
//! `--max-restarts 0`; each launcher says who joined or left. The workers are this test binary
//! re-run: `init_process_group("gloo")` over env://, then all_reduces until the test asks them
//! to stop. Needs root and `ip netns`; skips with a printed reason otherwise.

mod launcher_util;
use c10d_core::Tensor;
use c10d_testing::netns;
use c10d_world as dist;
use launcher_util::*;
use netns::Lan;
use std::time::{Duration, Instant};

const CHILD: &str = "C10D_ELASTIC_CHILD";
/// A file whose existence asks the workers to finish.
const STOP: &str = "C10D_ELASTIC_STOP";
/// Elements per all_reduce (odd, so a partial or shifted result shows).
const N: usize = 1025;

/// Rank `r`'s element `j`; the last element carries the rank's "stop" vote.
fn value(r: usize, j: usize) -> f32 {
    ((r + 1) * 1000 + j % 7) as f32
}

fn child_main() {
    dist::init_process_group(dist::InitOptions {
        backend: Some("gloo".into()),
        timeout: Some(Duration::from_secs(20)),
        ..Default::default()
    })
    .unwrap();
    let r = dist::get_rank(None).unwrap() as usize;
    let w = dist::get_world_size(None).unwrap() as usize;
    println!("world {w} rank {r} ready");
    let stop = std::env::var(STOP).unwrap();
    for i in 0.. {
        let vote = std::path::Path::new(&stop).exists() as u8 as f32;
        let mut v: Vec<f32> = (0..N).map(|j| value(r, j)).collect();
        v.push(vote);
        let t = Tensor::from_vec(v);
        dist::all_reduce(&t).run().unwrap();
        let got = t.to_vec::<f32>().unwrap();
        for (j, x) in got[..N].iter().enumerate() {
            let want: f32 = (0..w).map(|q| value(q, j)).sum();
            assert_eq!(
                *x, want,
                "world {w} rank {r}: element {j} of all_reduce {i}"
            );
        }
        if i == 20 {
            println!("world {w} rank {r}: 20 all_reduces correct");
        }
        if got[N] > 0.0 && i >= 20 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    dist::destroy_process_group(None).unwrap();
}

/// `c10drun` for the node on host `h`, its store endpoint at host 0 (`port` "0": host 0 picks
/// it), this binary as the worker.
fn node(lan: &Lan, h: usize, port: &str, stop: &str) -> Job {
    let exe = std::env::current_exe().unwrap();
    let endpoint = format!("{}:{port}", lan.addr(0));
    let c10drun = c10drun();
    let args = [
        "netns",
        "exec",
        &lan.names[h],
        &c10drun,
        "--nnodes",
        "1:3",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        &endpoint,
        "--rdzv-id",
        "elastic",
        "--rdzv-conf",
        "last_call_timeout=1,keep_alive_interval=0.5,keep_alive_max_attempt=4,join_timeout=60,read_timeout=5",
        "--max-restarts",
        "0",
        "--stop-timeout",
        "2",
        "--no-python",
        exe.to_str().unwrap(),
        "every_transition_ends_on_the_new_world_size",
        "--exact",
        "--nocapture",
    ];
    spawn("ip", &args, &[(CHILD, "1"), (STOP, stop)])
}

/// Waits until the workers of `nodes` (node rank = position) printed `what` for world size
/// `w` `times` times each; returns the seconds since `t0`.
fn all_at(nodes: &mut [&mut Job], w: usize, what: &str, times: usize, t0: Instant) -> f64 {
    for (r, n) in nodes.iter_mut().enumerate() {
        let needle = format!("world {w} rank {r}{what}");
        n.wait_for_stdout_count(&needle, times, Duration::from_secs(90));
    }
    t0.elapsed().as_secs_f64()
}

#[test]
fn every_transition_ends_on_the_new_world_size() {
    if std::env::var_os(CHILD).is_some() {
        child_main();
        return;
    }
    let Some(lan) = Lan::or_skip("elastic", 9, 3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let stop = stop.to_str().unwrap();
    let t0 = Instant::now();
    let mut a = node(&lan, 0, "0", stop);
    let port = a.wait_for_store_port(&lan.addr(0), Duration::from_secs(60));
    let alone = all_at(&mut [&mut a], 1, " ready", 1, t0);
    all_at(&mut [&mut a], 1, ": 20 all_reduces correct", 1, t0);

    let t = Instant::now();
    let mut b = node(&lan, 1, &port, stop);
    let two = all_at(&mut [&mut a, &mut b], 2, " ready", 1, t);
    all_at(&mut [&mut a, &mut b], 2, ": 20 all_reduces correct", 1, t);

    let t = Instant::now();
    let c = node(&lan, 2, &port, stop);
    let mut c = c;
    let three = all_at(&mut [&mut a, &mut b, &mut c], 3, " ready", 1, t);
    all_at(
        &mut [&mut a, &mut b, &mut c],
        3,
        ": 20 all_reduces correct",
        1,
        t,
    );

    let t = Instant::now();
    lan.unplug(2).unwrap();
    let back = all_at(&mut [&mut a, &mut b], 2, " ready", 2, t);
    all_at(&mut [&mut a, &mut b], 2, ": 20 all_reduces correct", 2, t);
    println!(
        "to all workers running on the new world size: alone (incl. last call 1 s) {alone:.2} s, \
         a node joined (1 → 2) {two:.2} s, another joined (2 → 3) {three:.2} s, \
         one cut off (3 → 2, keep-alive limit 2 s) {back:.2} s"
    );

    std::fs::write(stop, b"").unwrap();
    let (oa, ob) = (
        a.finish(Duration::from_secs(60)),
        b.finish(Duration::from_secs(60)),
    );
    let oc = c.finish(Duration::from_secs(60));
    println!(
        "node a:\n{}\nnode b:\n{}\nnode c:\n{}",
        oa.summary(),
        ob.summary(),
        oc.summary()
    );
    assert_eq!(oa.code, Some(0), "{oa}");
    assert_eq!(ob.code, Some(0), "{ob}");
    for o in [&oa, &ob] {
        let s = o.summary();
        assert!(s.contains("WORLD_SIZE 3"), "{o}");
        assert!(s.contains("joined [3], left []"), "{o}");
        assert!(s.contains("joined [], left [3]"), "{o}");
        assert!(s.contains("lost"), "{o}");
        assert!(!s.contains("restarting"), "{o}");
    }
    // The node cut off stops its worker and ends, saying why.
    assert_ne!(oc.code, Some(0), "{oc}");
    assert!(oc.summary().contains("unreachable"), "{oc}");
}

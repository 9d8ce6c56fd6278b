//! Back-pressure on a peer that runs ahead: a root waiting for a late rank keeps only a bounded
//! amount of the early frames another rank streams at it, and still sees at once when that rank
//! goes away. (One test, in this order: the first part measures the process's peak memory.)

mod common;
use c10d_core::*;
use common::*;
use std::sync::Mutex;
use std::time::Duration;

/// Peak resident memory of this process, KiB (`VmHWM`).
fn peak_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn back_pressure_bounds_memory_and_still_sees_a_dead_peer() {
    a_root_waiting_for_a_late_rank_buffers_a_bounded_amount();
    a_peer_that_dies_while_paused_is_seen_at_once();
}

fn a_root_waiting_for_a_late_rank_buffers_a_bounded_amount() {
    const OPS: usize = 384;
    const N: usize = 1 << 18; // 1 MiB of f32 per reduce
    let pgs = make_world(3, opts());
    let before = peak_kib();
    // Rank 1 streams 384 MiB of reduces at root 0, which is stuck in the first one until rank 2
    // starts 2 s later. Without back-pressure the root would hold all of them.
    let sums = run_on(pgs, |r, pg| {
        if r == 2 {
            std::thread::sleep(Duration::from_secs(2));
        }
        let t = Tensor::zeros(DType::F32, &[N]);
        let mut first = 0f32;
        for i in 0..OPS {
            t.write(|s: &mut [f32]| s.fill((r + i) as f32)).unwrap();
            let o = ReduceOptions {
                root_rank: 0,
                ..Default::default()
            };
            pg.reduce(std::slice::from_ref(&t), &o)
                .unwrap()
                .wait()
                .unwrap();
            if r == 0 && i == 0 {
                first = f32s(&t)[N - 1];
            }
        }
        first
    });
    assert_eq!(sums[0], 3.0, "rank 0's first reduce: 0 + 1 + 2");
    let grown_mib = peak_kib().saturating_sub(before) / 1024;
    println!("peak memory grew by {grown_mib} MiB while 384 MiB were streamed ahead");
    assert!(grown_mib < 200, "grew by {grown_mib} MiB");
}

fn a_peer_that_dies_while_paused_is_seen_at_once() {
    // Rank 1 runs 128 MiB ahead of root 0, which waits for rank 2 (never coming) and pauses
    // reading rank 1; rank 1's last send then times out and it goes away. Its error and end of
    // stream are behind the unread frames, yet root 0 must fail at once, naming rank 1, not at
    // its own 60 s timeout (or its liveness probe 1 s before).
    use std::sync::{Arc, Condvar};
    use std::time::Instant;
    const N: usize = 1 << 18;
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    let d = done.clone();
    let res = run_on(make_world(3, opts()), move |r, pg| {
        let reduce = |ms: u64| {
            let o = ReduceOptions {
                root_rank: 0,
                timeout: Some(Duration::from_millis(ms)),
                ..Default::default()
            };
            pg.reduce(&[Tensor::zeros(DType::F32, &[N])], &o)
                .and_then(|w| w.wait())
        };
        match r {
            0 => {
                let e = reduce(60_000).unwrap_err().to_string();
                *d.0.lock().unwrap() = true;
                d.1.notify_all();
                (e, Instant::now())
            }
            1 => {
                let e = (0..128).find_map(|_| reduce(1000).err());
                pg.abort();
                (e.map(|e| e.to_string()).unwrap_or_default(), Instant::now())
            }
            _ => {
                let g = d.0.lock().unwrap();
                let _ =
                    d.1.wait_timeout_while(g, Duration::from_secs(90), |done| !*done);
                (String::new(), Instant::now())
            }
        }
    });
    let ((e0, failed), (e1, left)) = (&res[0], &res[1]);
    assert!(e1.contains("Timed out waiting 1000ms"), "{e1}");
    assert!(e0.contains("rank 1"), "{e0}");
    let after = failed.saturating_duration_since(*left);
    println!("root failed {} ms after rank 1 left", after.as_millis());
    assert!(
        after < Duration::from_secs(30),
        "root failed {after:?} after rank 1 left: {e0}"
    );
}

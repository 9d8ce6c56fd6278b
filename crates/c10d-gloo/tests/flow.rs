//! Back-pressure on a peer that runs ahead: a root waiting for a late rank keeps only a bounded
//! amount of the early frames another rank streams at it (alone in this test binary, because it
//! measures the process's peak memory).

mod common;
use c10d_core::*;
use common::*;
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
            pg.reduce(&[t.clone()], &o).unwrap().wait().unwrap();
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

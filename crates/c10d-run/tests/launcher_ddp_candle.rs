//! The example `ddp_candle` under `c10drun` on 2 and 4 CPU ranks: it must exit 0, print the
//! Reducer's `ddp:` line, every rank must report bit-identical parameters across ranks, and
//! rank 0 must report a match with one process trained on the full batch.

mod launcher_util;
use launcher_util::*;
use std::time::Duration;

#[test]
fn ddp_candle_on_2_and_4_ranks_matches_one_process() {
    let example = workspace_example("c10d-candle", "ddp_candle");
    for n in [2usize, 4] {
        let nproc = n.to_string();
        let out = run_c10drun(
            &["--standalone", "--nproc-per-node", &nproc, &example],
            Duration::from_secs(240),
        );
        assert_eq!(out.code, Some(0), "{n} ranks: {out}");
        assert!(out.stdout.contains("[rank 0]: ddp: "), "{out}");
        for r in 0..n {
            let want = format!("rank {r}: parameters bit-identical on all {n} ranks");
            assert!(out.stdout.contains(&want), "missing {want:?}: {out}");
        }
        let m = out
            .stdout_line_with("vs one process on the full batch")
            .unwrap_or_else(|| panic!("{out}"));
        assert!(m.ends_with("(match)"), "{m}");
        println!("{n} ranks: {m}");
    }
}

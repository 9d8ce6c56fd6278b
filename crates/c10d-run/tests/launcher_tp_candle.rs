//! The example `tp_candle` under `c10drun` on 2 and 4 CPU ranks: column-parallel (all_gather),
//! row-parallel (all_reduce) and the MLP block must each match the single-device matmul on
//! every rank; a hidden size the world size does not divide is refused by every rank.

mod launcher_util;
use launcher_util::*;
use std::time::Duration;

#[test]
fn tp_candle_on_2_and_4_ranks_matches_one_device() {
    let example = workspace_example("c10d-candle", "tp_candle");
    for n in [2usize, 4] {
        let nproc = n.to_string();
        let out = run_c10drun(
            &["--standalone", "--nproc-per-node", &nproc, &example],
            Duration::from_secs(120),
        );
        assert_eq!(out.code, Some(0), "{n} ranks: {out}");
        for r in 0..n {
            let line = out
                .stdout_line_with(&format!("tp_candle: rank {r} of {n} "))
                .unwrap_or_else(|| panic!("no line of rank {r}: {out}"));
            assert!(line.ends_with("(match)"), "{line}");
            println!("{line}");
        }
    }
}

#[test]
fn a_hidden_size_the_world_does_not_divide_is_refused() {
    let example = workspace_example("c10d-candle", "tp_candle");
    let out = spawn(
        &c10drun(),
        &["--standalone", "--nproc-per-node", "2", &example],
        &[("C10D_TP_DIMS", "4,8,7,3")],
    )
    .finish(Duration::from_secs(120));
    assert_ne!(out.code, Some(0), "{out}");
    assert!(
        out.stderr
            .contains("H = 7 is not a multiple of the world size 2"),
        "{out}"
    );
}

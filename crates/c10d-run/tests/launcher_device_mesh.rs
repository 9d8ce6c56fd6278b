//! The `device_mesh` example under `c10drun --nproc-per-node 4`: a 2 × 2 data × tensor
//! parallel training checked against one process. Each rank must print its coordinate and
//! its groups (global ranks) as the grid gives them, and rank 0 the passed check.

mod launcher_util;
use launcher_util::*;
use std::time::Duration;

#[test]
fn two_by_two_data_and_tensor_parallel_step_under_c10drun() {
    let bin = workspace_example("c10d-world", "device_mesh");
    let out = run_c10drun(
        &["--nproc-per-node", "4", "--master-port", "0", &bin],
        Duration::from_secs(120),
    );
    assert_eq!(out.code, Some(0), "{out}");
    let expected = [
        "rank 0: coordinate [0, 0], dp group [0, 2], tp group [0, 1]",
        "rank 1: coordinate [0, 1], dp group [1, 3], tp group [0, 1]",
        "rank 2: coordinate [1, 0], dp group [0, 2], tp group [2, 3]",
        "rank 3: coordinate [1, 1], dp group [1, 3], tp group [2, 3]",
    ];
    for (r, want) in expected.iter().enumerate() {
        assert!(
            out.stdout.contains(&format!("[rank {r}]: {want}\n")),
            "{out}"
        );
    }
    let check = out
        .stdout_line_with("[rank 0]: check: DeviceMesh((dp=2, tp=2), 'cpu', stride=(2, 1))")
        .unwrap_or_else(|| panic!("no check line: {out}"));
    assert!(check.ends_with(" OK"), "{check}");
}

//! The `device_mesh` example under `c10drun --nproc-per-node 4`: a 2 × 2 data × tensor
//! parallel training checked against one process. Each rank must print its coordinate and
//! its groups (global ranks) as the grid gives them, and rank 0 the passed check.

#[path = "../../c10d-run/tests/launcher_util/mod.rs"]
mod launcher_util;
use launcher_util::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The example binary next to the test binaries, built on demand.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let bin = profile_dir.join("examples").join("device_mesh");
    if !bin.exists() {
        let target_dir = profile_dir.parent().unwrap();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args([
            "build",
            "-p",
            "c10d-world",
            "--example",
            "device_mesh",
            "--manifest-path",
        ])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .env("CARGO_TARGET_DIR", target_dir);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().expect("cargo").success(),
            "building the example failed"
        );
    }
    bin
}

#[test]
fn two_by_two_data_and_tensor_parallel_step_under_c10drun() {
    let bin = example();
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "4",
            "--master-port",
            "0",
            bin.to_str().unwrap(),
        ],
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

//! The `agree_autotune` example under `c10drun --nproc-per-node 4`: every rank prints
//! `rank R: local <variant>, agreed <variant>` and the agreed variant is the same on all ranks.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>` of this test binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// A binary of the workspace, built with cargo when `cargo test` did not build it already.
fn built(path: &Path, cargo_args: &[&str]) -> PathBuf {
    if !path.exists() {
        let profile = profile_dir();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.arg("build")
            .args(cargo_args)
            .arg("--manifest-path")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml"))
            .env("CARGO_TARGET_DIR", profile.parent().unwrap());
        if profile.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("cannot run cargo");
        assert!(st.success(), "cargo build {cargo_args:?} failed");
    }
    assert!(path.exists(), "{} missing", path.display());
    path.to_path_buf()
}

#[test]
fn agree_autotune_under_c10drun_with_4_ranks() {
    let profile = profile_dir();
    let c10drun = built(
        &profile.join("c10drun"),
        &["-p", "c10d-run", "--bin", "c10drun"],
    );
    let example = built(
        &profile.join("examples").join("agree_autotune"),
        &["-p", "c10d-compile", "--example", "agree_autotune"],
    );
    let mut child = Command::new(c10drun)
        .args(["--nproc-per-node", "4", "--master-port", "0"])
        .arg(example)
        .env_remove("TORCH_DISTRIBUTED_DEBUG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("c10drun did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (out_t.join().unwrap(), err_t.join().unwrap());
    assert!(status.success(), "c10drun failed:\n{out}\n{err}");
    let mut agreed = Vec::new();
    for r in 0..4 {
        let needle = format!("rank {r}: local ");
        let line = out
            .lines()
            .find(|l| l.contains(&needle))
            .unwrap_or_else(|| panic!("no line for rank {r}:\n{out}\n{err}"));
        let tail = &line[line.find(&needle).unwrap() + needle.len()..];
        let (local, rest) = tail.split_once(", agreed ").expect("format");
        assert!(["naive", "blocked"].contains(&local), "{line}");
        agreed.push(rest.trim().to_string());
    }
    assert!(
        ["naive", "blocked"].contains(&agreed[0].as_str()),
        "{agreed:?}"
    );
    assert!(
        agreed.iter().all(|a| a == &agreed[0]),
        "ranks disagree: {out}"
    );
}

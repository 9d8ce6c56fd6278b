//! The main job end to end: the `ddp_wine` example (data-parallel training on the wine-quality
//! data) under `c10drun` with 1, 2 and 4 ranks. Checks that every run passes its own checks
//! (parameters bit-identical on all ranks, single-process reference within 1e-4), that it reports
//! its DDP buckets on a `ddp:` line, and that the loss curves of the runs agree.

mod launcher_util;
use launcher_util::*;
use std::time::Duration;

/// (epoch, train_loss, val_loss) rows printed by rank 0.
fn curve(out: &Output) -> Vec<(usize, f64, f64)> {
    out.stdout
        .lines()
        .filter_map(|l| l.strip_prefix("[rank 0]: epoch "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[2].parse().unwrap(),
                f[4].parse().unwrap(),
            )
        })
        .collect()
}

fn run_demo(nproc: usize) -> Output {
    let bin = workspace_example("c10d-ddp", "ddp_wine");
    let n = nproc.to_string();
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            &n,
            "--master-port",
            "0",
            &bin,
            "--epochs",
            "8",
            // A smaller model than the demo's default keeps the debug build fast; the small
            // bucket cap still gives several buckets.
            "--hidden",
            "32",
            "--layers",
            "2",
            "--bucket-cap-mb",
            "0.002",
        ],
        Duration::from_secs(300),
    );
    assert_eq!(out.code, Some(0), "{nproc} ranks: {out}");
    assert!(
        out.stdout.contains(&format!(
            "[rank 0]: check: parameters identical on all {nproc} ranks"
        )),
        "{out}"
    );
    let line = out
        .stdout_line_with("check: single-process run on the full data")
        .unwrap_or_else(|| panic!("no reference check: {out}"));
    assert!(line.ends_with(" OK"), "{line}");
    let ddp = out
        .stdout_line_with("[rank 0]: ddp: ")
        .unwrap_or_else(|| panic!("no ddp: line: {out}"));
    assert!(
        ddp.contains(" buckets (") && !ddp.contains(": 1 buckets") && ddp.contains("% hidden"),
        "{ddp}"
    );
    for r in 0..nproc {
        assert!(
            out.stdout
                .contains(&format!("[rank {r}]: rank {r} trained on ")),
            "rank {r} did not train: {out}"
        );
    }
    out
}

#[test]
fn loss_curves_agree_for_1_2_and_4_ranks() {
    let runs: Vec<(usize, Output)> = [1, 2, 4].into_iter().map(|n| (n, run_demo(n))).collect();
    let base = curve(&runs[0].1);
    assert_eq!(base.len(), 8, "{}", runs[0].1);
    // Training must actually learn something.
    assert!(
        base[7].1 < base[0].1,
        "train loss did not decrease: {base:?}"
    );
    for (n, out) in &runs[1..] {
        let c = curve(out);
        assert_eq!(c.len(), base.len(), "{n} ranks: {out}");
        for (a, b) in base.iter().zip(&c) {
            assert_eq!(a.0, b.0);
            assert!(
                (a.1 - b.1).abs() <= 1e-4 && (a.2 - b.2).abs() <= 1e-4,
                "{n} ranks, epoch {}: {a:?} vs {b:?}",
                a.0
            );
        }
    }
}

#[test]
fn the_demo_fails_loudly_when_a_rank_dies() {
    // Rank 1 is killed with SIGKILL in the middle of a long training. The workers ignore SIGTERM
    // (the disposition survives `exec`), so the launcher's SIGTERM cannot end rank 0: it has to
    // leave its blocked all_reduce through the error Gloo raises for the dead peer, well before
    // the launcher's SIGKILL 60 s later.
    let bin = workspace_example("c10d-ddp", "ddp_wine");
    let script = format!(
        "trap '' TERM; exec '{}' --epochs 100000 --hidden 32 --layers 2",
        bin
    );
    let mut job = spawn_c10drun(&[
        "--nproc-per-node",
        "2",
        "--master-port",
        "0",
        "--stop-timeout",
        "60",
        "sh",
        "-c",
        &script,
    ]);
    let line = job.wait_for_stdout("[rank 0]: epoch   1 ", Duration::from_secs(120));
    assert!(line.contains("train_loss"));
    // Find rank 1's pid: the newest child process of c10drun with RANK=1 in its environment.
    let pid = find_worker_pid(1).expect("rank 1 process not found");
    // SAFETY: plain syscall on a pid we just identified as our grandchild.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let out = job.finish(Duration::from_secs(120));
    assert_eq!(out.code, Some(1), "{out}");
    let s = out.summary();
    assert!(
        s.contains("root cause (first observed failure):")
            && s.contains("rank 1 (local_rank 1, pid ")
            && s.contains("signal SIGKILL"),
        "{out}"
    );
    // The survivor's collective failed with an error: it exited by itself with status 1.
    assert!(
        !out.stderr.contains("sending SIGKILL"),
        "rank 0 hung until SIGKILL: {out}"
    );
    assert!(
        s.contains("other failures:")
            && s.contains("rank 0 (local_rank 0, pid ")
            && s.contains("exit code 1"),
        "{out}"
    );
    assert!(out.stderr.contains("[rank 0]: ddp_wine: error: "), "{out}");
}

/// Pid of a running `ddp_wine` worker whose environment has `RANK=<rank>` and whose parent is a
/// c10drun started by this test process.
fn find_worker_pid(rank: usize) -> Option<i32> {
    let me = std::process::id().to_string();
    let want = format!("RANK={rank}");
    for e in std::fs::read_dir("/proc").ok()? {
        let e = e.ok()?;
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        if comm.trim() != "ddp_wine" {
            continue;
        }
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if !env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()) {
            continue;
        }
        // parent = c10drun, grandparent = this test process
        let ppid = parent_of(pid)?;
        if parent_of(ppid).map(|p| p.to_string()) == Some(me.clone()) {
            return Some(pid);
        }
    }
    None
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split_whitespace().nth(1)?.parse().ok()
}

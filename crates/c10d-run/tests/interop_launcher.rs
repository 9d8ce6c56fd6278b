//! Interop: `c10drun` launches real PyTorch programs (torch.distributed with the Gloo backend,
//! env:// rendezvous through the launcher's agent store). Needs `C10D_TORCH_PYTHON`.

mod launcher_util;
use launcher_util::*;
use std::time::Duration;

fn torch_python() -> Option<String> {
    match std::env::var("C10D_TORCH_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            println!("skipped: C10D_TORCH_PYTHON not set");
            None
        }
    }
}

const TRAIN_PY: &str = r#"
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
assert dist.is_torchelastic_launched()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
print(f"allreduce rank={rank} world={world} local_rank={os.environ['LOCAL_RANK']} sum={t.tolist()}", flush=True)
g = [torch.zeros(1) for _ in range(world)]
dist.all_gather(g, torch.tensor([float(rank * 10)]))
print(f"allgather rank={rank} {[x.item() for x in g]}", flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "fail":
    if rank == 1:
        print("rank 1 exits with code 3", flush=True)
        os._exit(3)
    dist.all_reduce(t)  # blocks: rank 1 is gone
    print("UNREACHABLE", flush=True)
dist.barrier()
dist.destroy_process_group()
"#;

#[test]
fn launches_a_torch_gloo_job() {
    let Some(py) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("train.py");
    std::fs::write(&script, TRAIN_PY).unwrap();
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            &py,
            script.to_str().unwrap(),
        ],
        Duration::from_secs(240),
    );
    assert_eq!(out.code, Some(0), "{out}");
    for r in 0..2 {
        let want = format!(
            "[rank {r}]: allreduce rank={r} world=2 local_rank={r} sum=[3.0, 3.0, 3.0, 3.0]"
        );
        assert!(out.stdout.contains(&want), "missing {want:?}: {out}");
        let want = format!("[rank {r}]: allgather rank={r} [0.0, 10.0]");
        assert!(out.stdout.contains(&want), "missing {want:?}: {out}");
    }
}

#[test]
fn a_failing_torch_rank_is_reported_and_the_survivor_does_not_hang() {
    let Some(py) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("train.py");
    std::fs::write(&script, TRAIN_PY).unwrap();
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            &py,
            script.to_str().unwrap(),
            "fail",
        ],
        Duration::from_secs(240),
    );
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stdout.contains("[rank 1]: rank 1 exits with code 3"),
        "{out}"
    );
    assert!(!out.stdout.contains("UNREACHABLE"), "{out}");
    let summary = out.summary();
    assert!(
        summary.contains("root cause (first observed failure):"),
        "{out}"
    );
    assert!(
        summary.contains("rank 1 (local_rank 1, pid ") && summary.contains("): exit code 3"),
        "{out}"
    );
    // Rank 0 either saw Gloo's connection error and exited non-zero, or was stopped by c10drun.
    assert!(summary.contains("rank 0 (local_rank 0, pid "), "{out}");
}

#[test]
fn the_torch_baseline_bench_runs_under_c10drun_and_prints_the_same_table() {
    let Some(py) = torch_python() else { return };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../c10d-world/benches/torch_gloo_bench.py"
    );
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            &py,
            script,
            "all_reduce",
            "-b",
            "1K",
            "-e",
            "4K",
            "-n",
            "3",
            "-w",
            "1",
        ],
        Duration::from_secs(240),
    );
    assert_eq!(out.code, Some(0), "{out}");
    let rows: Vec<Vec<String>> = out
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("[rank 0]: "))
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    for (r, size) in rows.iter().zip(["1024", "2048", "4096"]) {
        assert_eq!(r.len(), 8, "{r:?}");
        assert_eq!(r[0], size);
        assert_eq!(
            (r[2].as_str(), r[3].as_str(), r[7].as_str()),
            ("float", "sum", "0"),
            "{r:?}"
        );
        assert!(r[4].parse::<f64>().unwrap() > 0.0);
    }
    assert!(
        out.stdout
            .contains("[rank 0]: # Out of bounds values : 0 OK"),
        "{out}"
    );
}

/// A PyTorch job restarted ten times in a row: each attempt's `init_process_group` (env://,
/// the agent store) must rendezvous afresh. PyTorch 2.15 adds no per-attempt key prefix under
/// the agent store, so a launcher that kept one store for every attempt fails here (gloo
/// connects to the previous attempt's dead address: "Connection refused").
const RESTART_PY: &str = r#"
import os, sys, time
import torch
import torch.distributed as dist

attempt, fails = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
print(f"attempt {attempt} rank {rank} sum {t[0].item():g}", flush=True)
dist.barrier()  # both lines are out before anyone stops
if attempt < fails:
    if rank == 1:
        os._exit(5)
    time.sleep(120)  # stopped by the launcher
dist.destroy_process_group()
"#;

#[test]
fn a_torch_job_restarted_ten_times_rendezvous_afresh_each_time() {
    let Some(py) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("restart.py");
    std::fs::write(&script, RESTART_PY).unwrap();
    let out = run_c10drun(
        &[
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "10",
            &py,
            script.to_str().unwrap(),
            "10",
        ],
        Duration::from_secs(400),
    );
    assert_eq!(out.code, Some(0), "{out}");
    for a in 0..=10 {
        for r in 0..2 {
            let want = format!("[rank {r}]: attempt {a} rank {r} sum 3\n");
            assert!(out.stdout.contains(&want), "missing {want:?}: {out}");
        }
    }
}

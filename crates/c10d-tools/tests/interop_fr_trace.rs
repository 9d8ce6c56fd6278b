//! Flight-recorder dumps across implementations (gated on C10D_TORCH_PYTHON): PyTorch's own
//! analyzer (`python -m torch.distributed.flight_recorder.fr_trace`) reads the dumps of a real
//! c10d-rs gloo job whose rank 2 never joined the third all-reduce and names the same missing
//! rank; and `c10d-fr-trace` reads the dumps PyTorch 2.15's gloo writes for a job whose rank 1
//! never issued the third all-reduce.
//!
//! Run: `C10D_TORCH_PYTHON=~/.cache/c10d-rs/torch-venv/bin/python cargo test -p c10d-world --test interop_fr_trace`

mod fr_common;

use fr_common::*;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_c10d-fr-trace");

fn python() -> Option<String> {
    match std::env::var("C10D_TORCH_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            println!("skipped: C10D_TORCH_PYTHON not set");
            None
        }
    }
}

#[test]
fn torch_analyzer_reads_our_dumps() {
    if std::env::var_os(CHILD).is_some() {
        return child_main();
    }
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    run_timeout_job(dir.path(), "torch_analyzer_reads_our_dumps");
    let out = Command::new(&py)
        .args(["-m", "torch.distributed.flight_recorder.fr_trace"])
        .arg(dir.path())
        .args(["-p", "trace_"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("Not all ranks joining collective, sequence number: 3"),
        "{text}"
    );
    assert!(text.contains("missing ranks: {2}"), "{text}");
    assert!(text.contains("collective: gloo:all_reduce"), "{text}");
    assert!(text.contains("input sizes: [[256]]"), "{text}");
}

/// One PyTorch gloo rank: two all-reduces, then rank 0 issues a third (async) that rank 1
/// never issues; each rank writes `_dump_fr_trace` to `<dir>/pt_<rank>` and exits at once.
const TORCH_RANK: &str = r#"
import os, sys, datetime, torch, torch.distributed as dist
import torch._C._distributed_c10d as c
rank, d = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
for _ in range(2):
    dist.all_reduce(torch.ones(256))
if rank == 0:
    dist.all_reduce(torch.ones(256), async_op=True)
open(f"{d}/pt_{rank}", "wb").write(c._dump_fr_trace(True, False, False))
sys.stdout.flush()
os._exit(0)
"#;

#[test]
fn we_read_torchs_dumps() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let kids: Vec<_> = (0..2)
        .map(|r| {
            Command::new(&py)
                .args(["-c", TORCH_RANK, &r.to_string(), d])
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut kids = Kids(kids);
    for c in &mut kids.0 {
        assert!(c.wait().unwrap().success());
    }
    let out = Command::new(BIN)
        .arg(dir.path().join("pt_"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("group 0 (default_pg), ranks 0, 1: dumps from ranks 0, 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "rank 1 never entered collective #3 all_reduce [256] Float, which rank 0 entered"
        ),
        "{text}"
    );
}

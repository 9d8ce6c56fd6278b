//! What a trial may leave behind: processes (found by the environment marker every rank
//! carries), files in its private `TMPDIR`, shared memory under /dev/shm, abstract Unix sockets
//! of its ranks, network namespaces.

use std::collections::BTreeSet;
use std::path::Path;

/// Names under /dev/shm now.
pub fn shm() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Pids of live processes whose environment holds `C10D_CHAOS_TRIAL=<marker>`.
pub fn marked(marker: &str) -> Vec<i32> {
    let want = format!("C10D_CHAOS_TRIAL={marker}");
    let mut out = Vec::new();
    let Ok(d) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in d.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

/// Waits up to `limit` for the processes of trial `marker` to be gone (a parent's death
/// reaches its children a moment later); true when none is left.
pub fn settle(marker: &str, limit: std::time::Duration) -> bool {
    let end = std::time::Instant::now() + limit;
    loop {
        if marked(marker).is_empty() {
            return true;
        }
        if std::time::Instant::now() > end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Everything trial `marker` left behind (pids of its ranks in `pids`); empty when clean.
/// `shm_before`: /dev/shm when the trial began (entries of other programs are not blamed on it
/// unless they name one of its pids or c10d).
pub fn check(marker: &str, pids: &[i32], tmp: &Path, shm_before: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for pid in marked(marker) {
        out.push(format!("process {pid} still running"));
    }
    if let Ok(d) = std::fs::read_dir(tmp) {
        for e in d.flatten() {
            out.push(format!("temp file {}", e.path().display()));
        }
    }
    for name in shm().difference(shm_before) {
        let ours = name.contains("c10d") || pids.iter().any(|p| name.contains(&p.to_string()));
        if ours {
            out.push(format!("shared memory /dev/shm/{name}"));
        }
    }
    let unix = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    for pid in pids {
        let tag = format!("c10d-gloo.{pid}.");
        if unix.contains(&tag) {
            out.push(format!("Unix socket {tag}* of a dead rank"));
        }
    }
    out
}

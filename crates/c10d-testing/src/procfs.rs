//! What `/proc` says about a process (Linux), for the benchmarks and tests that count a rank's
//! sockets and memory. `pid` is a process id or `"self"`.

/// How many of the process's descriptors are sockets (0 when `/proc` cannot be read).
pub fn sockets(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// A `kB` field of `/proc/<pid>/status` (`"VmRSS"`, `"VmHWM"`), in KiB.
pub fn status_kib(pid: &str, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

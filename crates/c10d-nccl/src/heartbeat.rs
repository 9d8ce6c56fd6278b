//! The heartbeat monitor, as PyTorch's `HeartbeatMonitor`: the watchdog thread bumps a counter
//! on every turn of its loop (also while idle), and a monitor thread per group looks at it. When
//! the counter has not moved for `TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC` (the watchdog is stuck in a
//! CUDA or NCCL call, e.g. an `ncclCommAbort` that never returns), the monitor logs it, writes
//! the flight recorder's dump (when `TORCH_NCCL_DUMP_ON_TIMEOUT` / `TORCH_FR_DUMP_ON_TIMEOUT`
//! is on) and ends the process with `SIGABRT`; with `TORCH_NCCL_ENABLE_MONITORING=0` it only
//! logs that it would have. [`Heartbeat`] is the rule, pure and tested; `spawn_monitor` the
//! thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;
use std::time::{Duration, Instant};

/// The monitor's settings (`TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`, `TORCH_NCCL_ENABLE_MONITORING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatConfig {
    /// How long the watchdog may make no progress.
    pub timeout: Duration,
    /// End the process then (else only log).
    pub terminate: bool,
}

/// The rule: a verdict once the heartbeat counter has not moved for the timeout.
#[derive(Debug)]
pub struct Heartbeat {
    timeout: Duration,
    last_beat: u64,
    since: Instant,
}

impl Heartbeat {
    /// A monitor that saw counter value `beat` at `now`.
    pub fn new(timeout: Duration, beat: u64, now: Instant) -> Heartbeat {
        Heartbeat {
            timeout,
            last_beat: beat,
            since: now,
        }
    }

    /// Looks at the counter: `Some(how long it has not moved)` once that reaches the timeout
    /// (then the clock starts again, so a monitor that only logs does so once per timeout).
    pub fn observe(&mut self, beat: u64, now: Instant) -> Option<Duration> {
        if beat != self.last_beat {
            self.last_beat = beat;
            self.since = now;
            return None;
        }
        let stuck = now.saturating_duration_since(self.since);
        if stuck < self.timeout {
            return None;
        }
        self.since = now;
        Some(stuck)
    }
}

/// What the monitor logs for group `group` whose watchdog made no progress for `stuck`.
pub fn stuck_message(group: &str, stuck: Duration) -> String {
    format!(
        "ProcessGroupNCCL (group {group:?}): the watchdog got stuck for {} seconds without making progress in monitoring enqueued collectives (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC); it is blocked inside a CUDA or NCCL call",
        stuck.as_secs()
    )
}

/// Starts the monitor of a watchdog whose loop bumps `beat`; it ends once `beat` is gone.
pub(crate) fn spawn_monitor(config: HeartbeatConfig, beat: Weak<AtomicU64>, group: String) {
    let step = (config.timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let name = format!("c10d-nccl-monitor-{group}");
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let Some(b) = beat.upgrade() else { return };
        let mut rule = Heartbeat::new(config.timeout, b.load(Ordering::Relaxed), Instant::now());
        drop(b);
        loop {
            std::thread::sleep(step);
            let Some(b) = beat.upgrade() else { return };
            if let Some(stuck) = rule.observe(b.load(Ordering::Relaxed), Instant::now()) {
                on_stuck(config, &group, stuck);
            }
        }
    });
    if let Err(e) = spawned {
        log::warn!("c10d-nccl: no heartbeat monitor for a group: {e}");
    }
}

fn on_stuck(config: HeartbeatConfig, group: &str, stuck: Duration) {
    let msg = stuck_message(group, stuck);
    log::error!("{msg}");
    if let Ok(fr) = c10d_core::FlightRecorder::global() {
        if fr.dump_on_failure() {
            if let Err(e) = fr.dump_to_file() {
                log::error!("c10d-nccl: the flight recorder dump failed: {e}");
            }
        }
    }
    if !config.terminate {
        log::error!("c10d-nccl: the heartbeat monitor is disabled (TORCH_NCCL_ENABLE_MONITORING=0), but would have terminated the process");
        return;
    }
    eprintln!("{msg}\nTerminating the process after attempting to dump debug info.");
    std::process::abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moving_heartbeat_never_trips_and_a_stuck_one_trips_once_per_timeout() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut h = Heartbeat::new(10 * s, 0, t0);
        // Progress every 9 s for a minute: never.
        for i in 1..7u64 {
            assert_eq!(h.observe(i, t0 + 9 * s * i as u32), None);
        }
        let last = t0 + 54 * s;
        assert_eq!(h.observe(6, last + 9 * s), None);
        assert_eq!(h.observe(6, last + 10 * s), Some(10 * s));
        // The clock starts again after a verdict.
        assert_eq!(h.observe(6, last + 15 * s), None);
        assert_eq!(h.observe(6, last + 20 * s), Some(10 * s));
        // Progress resets it.
        assert_eq!(h.observe(7, last + 29 * s), None);
        assert_eq!(h.observe(7, last + 38 * s), None);
    }

    const CHILD: &str = "C10D_HEARTBEAT_CHILD";
    const NAME: &str =
        "heartbeat::tests::the_monitor_thread_ends_a_stuck_process_and_spares_a_live_one";

    /// In a child process: a monitor (300 ms timeout) over a heartbeat that is `stuck` or kept
    /// moving by a thread; exits 0 after 3 s unless the monitor ended it first.
    fn child(stuck: bool) -> ! {
        let fr = c10d_core::FlightRecorder::global().expect("recorder");
        let _group = fr.register_group("nccl", "hb", "heartbeat test", &[], 0, 1);
        let beat = std::sync::Arc::new(AtomicU64::new(0));
        let config = HeartbeatConfig {
            timeout: Duration::from_millis(300),
            terminate: true,
        };
        spawn_monitor(config, std::sync::Arc::downgrade(&beat), "hb".into());
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if !stuck {
                beat.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::process::exit(0);
    }

    #[test]
    fn the_monitor_thread_ends_a_stuck_process_and_spares_a_live_one() {
        use std::os::unix::process::ExitStatusExt;
        if let Ok(mode) = std::env::var(CHILD) {
            child(mode == "stuck");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let prefix = dir.path().join("fr_").to_string_lossy().into_owned();
        let run = |mode: &str| {
            let start = Instant::now();
            let out = std::process::Command::new(std::env::current_exe().expect("exe"))
                .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
                .env(CHILD, mode)
                .env("TORCH_FR_DUMP_TEMP_FILE", &prefix)
                .env("TORCH_FR_DUMP_ON_TIMEOUT", "1")
                .output()
                .expect("child");
            (out, start.elapsed())
        };
        let (out, took) = run("stuck");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(6), "{:?}: {err}", out.status);
        assert!(err.contains("the watchdog got stuck for"), "{err}");
        assert!(err.contains("Terminating the process"), "{err}");
        assert!(took < Duration::from_secs(3), "ended after {took:?}");
        assert!(
            dir.path().join("fr_0").exists(),
            "no flight-recorder dump was written"
        );
        let (out, _) = run("alive");
        assert!(
            out.status.success(),
            "a moving heartbeat was ended: {:?}",
            out.status
        );
    }

    #[test]
    fn the_message_names_the_group_and_the_time() {
        let m = stuck_message("g0", Duration::from_secs(480));
        assert!(m.contains("\"g0\"") && m.contains("480 seconds"), "{m}");
    }
}

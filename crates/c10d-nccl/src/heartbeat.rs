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

    #[test]
    fn the_message_names_the_group_and_the_time() {
        let m = stuck_message("g0", Duration::from_secs(480));
        assert!(m.contains("\"g0\"") && m.contains("480 seconds"), "{m}");
    }
}

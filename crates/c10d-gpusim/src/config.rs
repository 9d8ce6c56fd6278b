//! The simulator's settings, read once per process from the environment:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `C10D_SIM_GPUS` | simulated devices per process | 8 |
//! | `C10D_SIM_SEED` | seed of every random choice (delays) | 0 |
//! | `C10D_SIM_DELAY_US` | each queued stream operation first sleeps a random 0..=MAX µs | 0 |
//! | `C10D_SIM_DROP_STREAM_WAITS` | `1`: `cuStreamWaitEvent` does nothing (sabotage: ordering tests must fail) | off |
//! | `C10D_SIM_FAULTS` | faults to inject, see [`crate::nccl::faults`] | none |
//! | `C10D_SIM_GROUP_END_IN_PROGRESS` | `1`: on a non-blocking communicator, `ncclGroupEnd` (and a lone op) returns `ncclInProgress` and the communicator reports it for a few milliseconds, as NCCL may while it enqueues | off |
//! | `C10D_SIM_MEMORY_GB` | memory of each simulated device (what `cuMemGetInfo` and `cuDeviceTotalMem` say; allocations past it fail) | 80 |

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The settings of this process.
#[derive(Debug, Clone)]
pub struct Config {
    /// Number of simulated devices.
    pub gpus: usize,
    /// Seed of the random delays.
    pub seed: u64,
    /// Largest random delay before a queued stream operation, in microseconds.
    pub delay_us: u64,
    /// Ignore `cuStreamWaitEvent` (sabotage switch).
    pub drop_stream_waits: bool,
    /// Bytes of memory per device.
    pub memory_bytes: u64,
    /// Non-blocking communicators answer `ncclInProgress` at a group's end.
    pub group_end_in_progress: bool,
}

fn var<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// The process's settings (read at the first call).
pub fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| Config {
        gpus: var("C10D_SIM_GPUS", 8usize),
        seed: var("C10D_SIM_SEED", 0u64),
        delay_us: var("C10D_SIM_DELAY_US", 0u64),
        drop_stream_waits: var("C10D_SIM_DROP_STREAM_WAITS", 0u8) == 1,
        memory_bytes: var("C10D_SIM_MEMORY_GB", 80u64) << 30,
        group_end_in_progress: var("C10D_SIM_GROUP_END_IN_PROGRESS", 0u8) == 1,
    })
}

/// splitmix64: the next pseudo-random number of a stream seeded by `C10D_SIM_SEED`, the
/// process id and a per-stream salt (so ranks and streams differ, runs with a seed repeat).
pub fn next_random(state: &AtomicU64) -> u64 {
    let mut z = state
        .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A random-number state for one stream, from the seed, the rank's environment and `salt`.
pub fn rng_state(salt: u64) -> AtomicU64 {
    let rank: u64 = var("RANK", var("C10D_GPU_RANK", 0u64));
    AtomicU64::new(get().seed ^ rank.wrapping_mul(0x1000_0001) ^ salt.wrapping_mul(0x9e37))
}

/// Sleeps the random delay before a queued operation (nothing when `C10D_SIM_DELAY_US` is 0).
pub fn random_delay(state: &AtomicU64) {
    let max = get().delay_us;
    if max > 0 {
        let us = next_random(state) % (max + 1);
        std::thread::sleep(std::time::Duration::from_micros(us));
    }
}

/// Whether `C10D_SIM_TRACE` is set (read once).
pub fn tracing() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("C10D_SIM_TRACE").is_some())
}

/// A line on stderr when `C10D_SIM_TRACE` is set (debugging the simulator and its users);
/// `line` is only formatted then, so queued work pays nothing otherwise.
pub fn trace(line: impl FnOnce() -> String) {
    if tracing() {
        eprintln!(
            "c10d-gpusim trace [{:?}]: {}",
            std::thread::current().id(),
            line()
        );
    }
}

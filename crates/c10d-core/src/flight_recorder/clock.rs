//! The recorder's clock: whole milliseconds of the coarse monotonic clock (the kernel's last
//! tick, resolution 1–4 ms), read in a few nanoseconds without touching a hardware counter,
//! and shifted to the Unix epoch only when a dump is written.
//!
//! Milliseconds are all the coarse clock resolves, and they let an op's start and end share a
//! 64-bit word with the tag that tells whose they are (see `slot`). A monotonic clock keeps
//! the entries of one thread in order even when the wall clock is stepped; the shift to the
//! epoch is measured at the dump, so a wall-clock step between an op and the dump moves its
//! times by the step.

/// Milliseconds of `CLOCK_MONOTONIC_COARSE` (time since boot; `CLOCK_MONOTONIC` where there
/// is no coarse clock).
#[inline]
pub(crate) fn now_ms() -> u64 {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let clock = libc::CLOCK_MONOTONIC_COARSE;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let clock = libc::CLOCK_MONOTONIC;
    read(clock) / 1_000_000
}

/// Nanoseconds since the Unix epoch of the monotonic millisecond `ms` (PyTorch's
/// `c10::getTime()` unit), by the offset between the two clocks now.
pub(crate) fn epoch_ns_of(ms: u64, offset: Offset) -> u64 {
    (ms * 1_000_000).saturating_add_signed(offset.0)
}

/// Unix-epoch time minus monotonic time, in ns, measured once per dump.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Offset(i64);

impl Offset {
    pub(crate) fn now() -> Offset {
        let real = read(libc::CLOCK_REALTIME) as i64;
        let mono = read(libc::CLOCK_MONOTONIC) as i64;
        Offset(real - mono)
    }
}

/// Nanoseconds of clock `id`; 0 if the clock cannot be read (no Linux system lacks these).
#[inline]
fn read(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, a valid exclusive reference.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

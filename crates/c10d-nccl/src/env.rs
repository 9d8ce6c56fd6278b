//! PyTorch's `TORCH_NCCL_*` environment variables, parsed with PyTorch's rules
//! (`getCvarBool` / `getCvarInt` in `c10d/Utils.hpp`) into a typed [`NcclEnv`].
//!
//! Rules, as PyTorch applies them:
//! - Booleans accept (case-insensitively) `1 y yes t true` and `0 n no f false`; anything else,
//!   `"abc"`, `"-1"`, `"2147483647"`, `"4294967295"` included, is the error
//!   "Invalid value for environment variable: NAME".
//! - Integers are read as C++'s `std::stoi`: leading blanks and a sign, then digits; trailing
//!   text is ignored (`"12abc"` is 12); no digits or a value outside `i32` is the same error.
//! - A variable with an older alias (`NCCL_BLOCKING_WAIT` for `TORCH_NCCL_BLOCKING_WAIT` …) reads
//!   both; the new name wins when both are set, and using the old one logs a deprecation
//!   warning. A set but invalid alias is an error even when the new name is also set.
//!
//! The variables the backend reads (none is parsed and then ignored):
//! - `TORCH_NCCL_BLOCKING_WAIT` (alias `NCCL_BLOCKING_WAIT`), default false: `Work::wait`
//!   blocks the host until the op finishes or times out, then raises; no watchdog thread.
//! - `TORCH_NCCL_ASYNC_ERROR_HANDLING` (alias `NCCL_ASYNC_ERROR_HANDLING`), default 3: what the
//!   watchdog does on a timeout or NCCL error, see [`ErrorHandlingMode`]. Values other than
//!   0–3 are rejected here (PyTorch casts them unchecked into its enum).
//! - `TORCH_NCCL_HIGH_PRIORITY`, default false: use high-priority NCCL streams for every group.
//! - `TORCH_NCCL_ENABLE_MONITORING`, default true: the heartbeat monitor ends the process when
//!   the watchdog thread makes no progress for the heartbeat timeout ([`crate::heartbeat`]);
//!   false: it only logs that it would have.
//! - `TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`, default 480 (8 min): that timeout; at least 1.
//!
//! `TORCH_NCCL_DUMP_ON_TIMEOUT` (dump the flight recorder on a timeout or error) is read by
//! c10d-core's flight recorder, with `TORCH_FR_DUMP_ON_TIMEOUT`, for every backend.
//!
//! Refused when set to true, with an error naming the variable and what to use instead
//! (their values are still checked as PyTorch checks them): `TORCH_NCCL_DESYNC_DEBUG` (alias
//! `NCCL_DESYNC_DEBUG`: the desync report; the flight recorder and `c10d-fr-trace` answer the
//! same question), `TORCH_NCCL_PROPAGATE_ERROR` (peers fail by their own timeout instead),
//! `TORCH_NCCL_NAN_CHECK` (needs a device kernel, which this crate does not build) and
//! `TORCH_NCCL_ENABLE_TIMING` (alias `NCCL_ENABLE_TIMING`: flight-recorder durations are host
//! time from submission to the watchdog seeing the end).

use c10d_core::{DistError, Result};

/// `TORCH_NCCL_BLOCKING_WAIT` and its old name.
pub const BLOCKING_WAIT: &[&str] = &["TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"];
/// `TORCH_NCCL_ASYNC_ERROR_HANDLING` and its old name.
pub const ASYNC_ERROR_HANDLING: &[&str] = &[
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_ASYNC_ERROR_HANDLING",
];
/// `TORCH_NCCL_DESYNC_DEBUG` and its old name.
pub const DESYNC_DEBUG: &[&str] = &["TORCH_NCCL_DESYNC_DEBUG", "NCCL_DESYNC_DEBUG"];
/// `TORCH_NCCL_HIGH_PRIORITY`.
pub const HIGH_PRIORITY: &[&str] = &["TORCH_NCCL_HIGH_PRIORITY"];
/// `TORCH_NCCL_PROPAGATE_ERROR`.
pub const PROPAGATE_ERROR: &[&str] = &["TORCH_NCCL_PROPAGATE_ERROR"];
/// `TORCH_NCCL_ENABLE_MONITORING`.
pub const ENABLE_MONITORING: &[&str] = &["TORCH_NCCL_ENABLE_MONITORING"];
/// `TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`.
pub const HEARTBEAT_TIMEOUT_SEC: &[&str] = &["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"];
/// `TORCH_NCCL_NAN_CHECK`.
pub const NAN_CHECK: &[&str] = &["TORCH_NCCL_NAN_CHECK"];
/// `TORCH_NCCL_ENABLE_TIMING` and its old name.
pub const ENABLE_TIMING: &[&str] = &["TORCH_NCCL_ENABLE_TIMING", "NCCL_ENABLE_TIMING"];

/// PyTorch's default heartbeat timeout: 8 minutes.
pub const DEFAULT_HEARTBEAT_TIMEOUT_SEC: i32 = 8 * 60;

/// `TORCH_NCCL_ASYNC_ERROR_HANDLING`: what happens when the watchdog sees a timeout or an NCCL
/// error (PyTorch's `ErrorHandlingMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorHandlingMode {
    /// 0: do nothing; the failed work carries the error, other ops may hang.
    NoHandling,
    /// 1: abort the communicators, then tear the process down.
    TearDown,
    /// 2: abort the communicators, keep the process.
    CleanUpOnly,
    /// 3 (default): tear the process down without aborting (for when `ncclCommAbort` hangs).
    SkipCleanUp,
}

impl ErrorHandlingMode {
    /// The mode for PyTorch's numeric value.
    pub fn from_code(code: i32) -> Option<ErrorHandlingMode> {
        Some(match code {
            0 => ErrorHandlingMode::NoHandling,
            1 => ErrorHandlingMode::TearDown,
            2 => ErrorHandlingMode::CleanUpOnly,
            3 => ErrorHandlingMode::SkipCleanUp,
            _ => return None,
        })
    }

    /// PyTorch's numeric value.
    pub const fn code(self) -> i32 {
        match self {
            ErrorHandlingMode::NoHandling => 0,
            ErrorHandlingMode::TearDown => 1,
            ErrorHandlingMode::CleanUpOnly => 2,
            ErrorHandlingMode::SkipCleanUp => 3,
        }
    }

    /// `SHOULD_CLEAN_UP`: abort the communicators (modes 1 and 2).
    pub const fn should_clean_up(self) -> bool {
        matches!(
            self,
            ErrorHandlingMode::TearDown | ErrorHandlingMode::CleanUpOnly
        )
    }

    /// `SHOULD_TEAR_DOWN`: end the process (modes 1 and 3).
    pub const fn should_tear_down(self) -> bool {
        matches!(
            self,
            ErrorHandlingMode::TearDown | ErrorHandlingMode::SkipCleanUp
        )
    }
}

/// The parsed `TORCH_NCCL_*` settings of one backend instance (PyTorch reads them in the
/// `ProcessGroupNCCL` constructor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclEnv {
    /// `TORCH_NCCL_BLOCKING_WAIT`.
    pub blocking_wait: bool,
    /// `TORCH_NCCL_ASYNC_ERROR_HANDLING`.
    pub async_error_handling: ErrorHandlingMode,
    /// `TORCH_NCCL_HIGH_PRIORITY`.
    pub high_priority: bool,
    /// `TORCH_NCCL_ENABLE_MONITORING`.
    pub enable_monitoring: bool,
    /// `TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC` (at least 1).
    pub heartbeat_timeout_sec: i32,
}

impl Default for NcclEnv {
    /// PyTorch's defaults (no variable set).
    fn default() -> Self {
        NcclEnv {
            blocking_wait: false,
            async_error_handling: ErrorHandlingMode::SkipCleanUp,
            high_priority: false,
            enable_monitoring: true,
            heartbeat_timeout_sec: DEFAULT_HEARTBEAT_TIMEOUT_SEC,
        }
    }
}

fn invalid(name: &str) -> DistError {
    DistError::invalid(format!("Invalid value for environment variable: {name}"))
}

/// Reads the names of one variable, last (oldest) first, so the first (newest) set one wins;
/// each set value goes through `parse`.
fn read<T>(
    names: &[&str],
    lookup: &dyn Fn(&str) -> Option<String>,
    default: T,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T> {
    let mut value = default;
    for (i, name) in names.iter().enumerate().rev() {
        let Some(raw) = lookup(name) else { continue };
        if i > 0 {
            log::warn!(
                "Environment variable {name} is deprecated; use {} instead",
                names[0]
            );
        }
        value = parse(&raw).ok_or_else(|| invalid(name))?;
    }
    Ok(value)
}

/// The variables c10d-nccl refuses when true, and what to use instead.
const UNSUPPORTED: &[(&[&str], &str)] = &[
    (
        DESYNC_DEBUG,
        "its desync report is not implemented; the flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE, dumped on a timeout) and c10d-fr-trace show which rank is behind",
    ),
    (
        PROPAGATE_ERROR,
        "errors are not published through the store; peers fail by their own timeout",
    ),
    (
        NAN_CHECK,
        "it needs a device kernel, which c10d-nccl does not build",
    ),
    (
        ENABLE_TIMING,
        "ops are not timed on the device; flight-recorder durations are host time",
    ),
];

/// Checks the refused variables: a bad value is PyTorch's error, a true one is refused.
fn refuse_unsupported(lookup: &dyn Fn(&str) -> Option<String>) -> Result<()> {
    for (names, why) in UNSUPPORTED {
        if read(names, lookup, false, parse_bool)? {
            let name = names
                .iter()
                .find(|n| lookup(n).is_some())
                .unwrap_or(&names[0]);
            return Err(DistError::unsupported(format!(
                "{name}=1 is not supported by c10d-nccl: {why}"
            )));
        }
    }
    Ok(())
}

/// PyTorch's boolean spelling (`getCvarBool`).
pub fn parse_bool(raw: &str) -> Option<bool> {
    match raw.to_ascii_lowercase().as_str() {
        "y" | "yes" | "1" | "t" | "true" => Some(true),
        "n" | "no" | "0" | "f" | "false" => Some(false),
        _ => None,
    }
}

/// C++ `std::stoi`: optional leading whitespace, an optional sign, at least one digit; the rest
/// of the string is ignored; out of `i32` range is `None`.
pub fn parse_stoi(raw: &str) -> Option<i32> {
    let s = raw.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let mut v: i64 = 0;
    for b in rest.as_bytes()[..digits].iter() {
        v = v * 10 + i64::from(b - b'0');
        if v > i64::from(i32::MAX) + 1 {
            return None;
        }
    }
    let v = if neg { -v } else { v };
    i32::try_from(v).ok()
}

impl NcclEnv {
    /// Parses the variables through `lookup` (a variable is set when it returns `Some`).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Invalid value for environment variable: NAME" for the
    /// first bad value (PyTorch raises `RuntimeError` with the same text).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<NcclEnv> {
        let d = NcclEnv::default();
        refuse_unsupported(lookup)?;
        let heartbeat_timeout_sec = read(
            HEARTBEAT_TIMEOUT_SEC,
            lookup,
            d.heartbeat_timeout_sec,
            |raw| parse_stoi(raw).filter(|&s| s >= 1),
        )?;
        Ok(NcclEnv {
            blocking_wait: read(BLOCKING_WAIT, lookup, d.blocking_wait, parse_bool)?,
            async_error_handling: read(
                ASYNC_ERROR_HANDLING,
                lookup,
                d.async_error_handling,
                |raw| parse_stoi(raw).and_then(ErrorHandlingMode::from_code),
            )?,
            high_priority: read(HIGH_PRIORITY, lookup, d.high_priority, parse_bool)?,
            enable_monitoring: read(ENABLE_MONITORING, lookup, d.enable_monitoring, parse_bool)?,
            heartbeat_timeout_sec,
        })
    }

    /// The heartbeat monitor's settings.
    pub fn heartbeat(&self) -> crate::heartbeat::HeartbeatConfig {
        crate::heartbeat::HeartbeatConfig {
            timeout: std::time::Duration::from_secs(self.heartbeat_timeout_sec.max(1) as u64),
            terminate: self.enable_monitoring,
        }
    }

    /// Parses the process environment.
    ///
    /// # Errors
    /// As [`NcclEnv::from_lookup`].
    pub fn from_process_env() -> Result<NcclEnv> {
        NcclEnv::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Whether the watchdog thread runs: PyTorch creates none under blocking wait.
    pub fn watchdog_enabled(&self) -> bool {
        !self.blocking_wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<NcclEnv> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        NcclEnv::from_lookup(&|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_are_pytorchs() {
        let e = parse(&[]).unwrap();
        assert_eq!(e, NcclEnv::default());
        assert!(!e.blocking_wait);
        assert_eq!(e.async_error_handling, ErrorHandlingMode::SkipCleanUp);
        assert_eq!(e.async_error_handling.code(), 3);
        assert!(e.enable_monitoring);
        assert_eq!(e.heartbeat_timeout_sec, 480);
        assert!(e.watchdog_enabled());
    }

    #[test]
    fn blocking_wait_rejects_pytorchs_bad_values() {
        for bad in ["abc", "-1", "2147483647", "4294967295", "", "2"] {
            let e = parse(&[("TORCH_NCCL_BLOCKING_WAIT", bad)]).unwrap_err();
            assert_eq!(
                e.message(),
                "Invalid value for environment variable: TORCH_NCCL_BLOCKING_WAIT",
                "{bad:?}"
            );
            assert_eq!(e.kind(), c10d_core::ErrorKind::InvalidArgument);
        }
        for (good, want) in [
            ("1", true),
            ("TRUE", true),
            ("yes", true),
            ("t", true),
            ("0", false),
            ("No", false),
            ("f", false),
        ] {
            assert_eq!(
                parse(&[("TORCH_NCCL_BLOCKING_WAIT", good)])
                    .unwrap()
                    .blocking_wait,
                want,
                "{good}"
            );
        }
        let e = parse(&[("TORCH_NCCL_BLOCKING_WAIT", "1")]).unwrap();
        assert!(!e.watchdog_enabled());
    }

    #[test]
    fn new_name_wins_over_the_deprecated_alias() {
        let e = parse(&[
            ("TORCH_NCCL_BLOCKING_WAIT", "0"),
            ("NCCL_BLOCKING_WAIT", "1"),
        ])
        .unwrap();
        assert!(!e.blocking_wait);
        let e = parse(&[("NCCL_BLOCKING_WAIT", "1")]).unwrap();
        assert!(e.blocking_wait);
        // A bad alias is still an error, naming the alias.
        let e = parse(&[
            ("TORCH_NCCL_BLOCKING_WAIT", "1"),
            ("NCCL_BLOCKING_WAIT", "abc"),
        ])
        .unwrap_err();
        assert!(e.message().ends_with(": NCCL_BLOCKING_WAIT"), "{e}");
    }

    #[test]
    fn async_error_handling_modes() {
        use ErrorHandlingMode::*;
        for (raw, mode) in [
            ("0", NoHandling),
            ("1", TearDown),
            ("2", CleanUpOnly),
            ("3", SkipCleanUp),
            (" 1", TearDown),
            ("2abc", CleanUpOnly),
        ] {
            assert_eq!(
                parse(&[("TORCH_NCCL_ASYNC_ERROR_HANDLING", raw)])
                    .unwrap()
                    .async_error_handling,
                mode,
                "{raw}"
            );
        }
        assert_eq!(
            parse(&[("NCCL_ASYNC_ERROR_HANDLING", "2")])
                .unwrap()
                .async_error_handling,
            CleanUpOnly
        );
        for bad in ["abc", "4", "-1", "99999999999", ""] {
            let e = parse(&[("TORCH_NCCL_ASYNC_ERROR_HANDLING", bad)]).unwrap_err();
            assert!(
                e.message().ends_with("TORCH_NCCL_ASYNC_ERROR_HANDLING"),
                "{bad}: {e}"
            );
        }
        assert!(TearDown.should_clean_up() && TearDown.should_tear_down());
        assert!(CleanUpOnly.should_clean_up() && !CleanUpOnly.should_tear_down());
        assert!(!SkipCleanUp.should_clean_up() && SkipCleanUp.should_tear_down());
        assert!(!NoHandling.should_clean_up() && !NoHandling.should_tear_down());
    }

    #[test]
    fn unsupported_variables_are_refused_when_true_and_checked_always() {
        for name in [
            "TORCH_NCCL_DESYNC_DEBUG",
            "NCCL_DESYNC_DEBUG",
            "TORCH_NCCL_PROPAGATE_ERROR",
            "TORCH_NCCL_NAN_CHECK",
            "TORCH_NCCL_ENABLE_TIMING",
            "NCCL_ENABLE_TIMING",
        ] {
            let e = parse(&[(name, "1")]).unwrap_err();
            assert_eq!(e.kind(), c10d_core::ErrorKind::Unsupported, "{name}");
            assert!(
                e.message()
                    .starts_with(&format!("{name}=1 is not supported by c10d-nccl: ")),
                "{e}"
            );
            assert_eq!(parse(&[(name, "0")]).unwrap(), NcclEnv::default(), "{name}");
            let e = parse(&[(name, "maybe")]).unwrap_err();
            assert_eq!(e.kind(), c10d_core::ErrorKind::InvalidArgument, "{name}");
        }
    }

    #[test]
    fn other_flags_and_heartbeat() {
        let e = parse(&[
            ("TORCH_NCCL_HIGH_PRIORITY", "true"),
            ("TORCH_NCCL_ENABLE_MONITORING", "0"),
            ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "30"),
        ])
        .unwrap();
        assert!(e.high_priority);
        assert!(!e.enable_monitoring);
        assert_eq!(e.heartbeat_timeout_sec, 30);
        let h = e.heartbeat();
        assert_eq!(h.timeout, std::time::Duration::from_secs(30));
        assert!(!h.terminate);
        assert!(NcclEnv::default().heartbeat().terminate);
        for bad in ["soon", "0", "-5"] {
            let e = parse(&[("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", bad)]).unwrap_err();
            assert_eq!(
                e.message(),
                "Invalid value for environment variable: TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"
            );
        }
    }

    #[test]
    fn stoi_semantics() {
        assert_eq!(parse_stoi("42"), Some(42));
        assert_eq!(parse_stoi("  -7x"), Some(-7));
        assert_eq!(parse_stoi("+3"), Some(3));
        assert_eq!(parse_stoi("2147483647"), Some(i32::MAX));
        assert_eq!(parse_stoi("-2147483648"), Some(i32::MIN));
        assert_eq!(parse_stoi("2147483648"), None);
        assert_eq!(parse_stoi("4294967295"), None);
        assert_eq!(parse_stoi("abc"), None);
        assert_eq!(parse_stoi("-"), None);
        assert_eq!(parse_stoi(""), None);
    }
}

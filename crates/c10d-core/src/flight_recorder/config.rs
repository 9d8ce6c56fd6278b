//! The flight recorder's settings and the environment variables they come from (PyTorch's
//! names and defaults; see the module documentation of [`crate::flight_recorder`]).

use crate::error::{DistError, Result};
use std::path::PathBuf;

/// Ring size: `TORCH_FR_BUFFER_SIZE`, then PyTorch's older `TORCH_NCCL_TRACE_BUFFER_SIZE`.
pub const BUFFER_SIZE_ENV: [&str; 2] = ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"];
/// Dump file prefix: `TORCH_FR_DUMP_TEMP_FILE`, then `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`.
pub const DUMP_FILE_ENV: [&str; 2] = ["TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"];
/// Dump when an op times out or fails: `TORCH_FR_DUMP_ON_TIMEOUT`, then
/// `TORCH_NCCL_DUMP_ON_TIMEOUT`.
pub const DUMP_ON_TIMEOUT_ENV: [&str; 2] =
    ["TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT"];
/// Our own (no PyTorch counterpart): a signal (`SIGUSR1`, `USR2`, `10` ...) that makes the
/// process write its dump. Unset: no handler is installed.
pub const DUMP_SIGNAL_ENV: &str = "C10D_FR_DUMP_SIGNAL";
/// PyTorch's default ring size (`FlightRecorder`'s constructor).
pub const DEFAULT_BUFFER_SIZE: usize = 2000;

/// Settings of a [`crate::flight_recorder::FlightRecorder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrConfig {
    /// Entries kept; 0 disables recording (PyTorch: a size ≤ 0 disables it).
    pub buffer_size: usize,
    /// Dumps go to `<dump_prefix><global rank>`.
    pub dump_prefix: String,
    /// Write the dump when an op of a group times out or fails (once per run of failures).
    pub dump_on_failure: bool,
    /// Signal number whose delivery writes the dump (`None`: no handler).
    pub dump_signal: Option<i32>,
}

impl Default for FrConfig {
    fn default() -> Self {
        FrConfig {
            buffer_size: DEFAULT_BUFFER_SIZE,
            dump_prefix: default_dump_prefix(),
            dump_on_failure: true,
            dump_signal: None,
        }
    }
}

impl FrConfig {
    /// Reads the settings from the environment through `get` (`std::env::var` in
    /// [`FrConfig::from_env`]; tests pass a map).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Invalid value for environment variable: NAME" (PyTorch's
    /// text) for a buffer size that is not an integer, a boolean that is not one of PyTorch's
    /// spellings (`1/0`, `true/false`, `yes/no`, `y/n`, `t/f`), or an unknown signal name.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<FrConfig> {
        let mut c = FrConfig::default();
        if let Some(v) = first_set(&get, &BUFFER_SIZE_ENV, parse_int)? {
            c.buffer_size = usize::try_from(v).unwrap_or(0);
        }
        if let Some(p) = first_set(&get, &DUMP_FILE_ENV, |s| Some(s.to_string()))? {
            c.dump_prefix = p;
        }
        if let Some(b) = first_set(&get, &DUMP_ON_TIMEOUT_ENV, parse_bool)? {
            c.dump_on_failure = b;
        }
        if let Some(s) = first_set(&get, &[DUMP_SIGNAL_ENV], parse_signal)? {
            c.dump_signal = Some(s);
        }
        Ok(c)
    }

    /// [`FrConfig::from_vars`] over the process environment.
    ///
    /// # Errors
    /// As [`FrConfig::from_vars`].
    pub fn from_env() -> Result<FrConfig> {
        Self::from_vars(|k| std::env::var(k).ok())
    }
}

/// The value of the first variable of `names` that is set (PyTorch: earlier names take
/// precedence), each set one checked.
fn first_set<T>(
    get: &impl Fn(&str) -> Option<String>,
    names: &[&str],
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Option<T>> {
    let mut found = None;
    for name in names.iter().rev() {
        if let Some(v) = get(name) {
            let parsed = parse(v.trim()).ok_or_else(|| {
                DistError::invalid(format!("Invalid value for environment variable: {name}"))
            })?;
            found = Some(parsed);
        }
    }
    Ok(found)
}

fn parse_int(s: &str) -> Option<i64> {
    s.parse().ok()
}

/// PyTorch's `getCvarBool` spellings.
fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "y" | "yes" | "1" | "t" | "true" => Some(true),
        "n" | "no" | "0" | "f" | "false" => Some(false),
        _ => None,
    }
}

/// `SIGUSR1`, `USR1`, `sigusr2`, or a number.
fn parse_signal(s: &str) -> Option<i32> {
    if let Ok(n) = s.parse::<i32>() {
        return (n > 0).then_some(n);
    }
    let up = s.to_ascii_uppercase();
    match up.strip_prefix("SIG").unwrap_or(&up) {
        "USR1" => Some(signal_hook::consts::SIGUSR1),
        "USR2" => Some(signal_hook::consts::SIGUSR2),
        "HUP" => Some(signal_hook::consts::SIGHUP),
        "WINCH" => Some(signal_hook::consts::SIGWINCH),
        _ => None,
    }
}

/// PyTorch 2.15's default prefix: `$XDG_CACHE_HOME/torch/comm_lib_trace_rank_`, else
/// `$HOME/.cache/torch/comm_lib_trace_rank_` (`/tmp/.cache/...` without `HOME`).
pub fn default_dump_prefix() -> String {
    let root = match std::env::var_os("XDG_CACHE_HOME") {
        Some(x) if !x.is_empty() => PathBuf::from(x),
        _ => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into())).join(".cache")
        }
    };
    root.join("torch")
        .join("comm_lib_trace_rank_")
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<FrConfig> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        FrConfig::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_are_pytorchs() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.buffer_size, 2000);
        assert!(c.dump_on_failure);
        assert_eq!(c.dump_signal, None);
        assert!(c.dump_prefix.ends_with("/torch/comm_lib_trace_rank_"));
    }

    #[test]
    fn new_names_win_over_old_ones() {
        let c = cfg(&[("TORCH_NCCL_TRACE_BUFFER_SIZE", "7")]).unwrap();
        assert_eq!(c.buffer_size, 7);
        let c = cfg(&[
            ("TORCH_NCCL_TRACE_BUFFER_SIZE", "7"),
            ("TORCH_FR_BUFFER_SIZE", "9"),
        ])
        .unwrap();
        assert_eq!(c.buffer_size, 9);
        let c = cfg(&[
            ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/x/old_"),
            ("TORCH_FR_DUMP_TEMP_FILE", "/x/new_"),
        ])
        .unwrap();
        assert_eq!(c.dump_prefix, "/x/new_");
        let c = cfg(&[("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")]).unwrap();
        assert!(!c.dump_on_failure);
    }

    #[test]
    fn zero_and_negative_sizes_disable() {
        assert_eq!(
            cfg(&[("TORCH_FR_BUFFER_SIZE", "0")]).unwrap().buffer_size,
            0
        );
        assert_eq!(
            cfg(&[("TORCH_FR_BUFFER_SIZE", "-5")]).unwrap().buffer_size,
            0
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("TORCH_FR_BUFFER_SIZE", "lots"),
            ("TORCH_NCCL_TRACE_BUFFER_SIZE", "1.5"),
            ("TORCH_FR_DUMP_ON_TIMEOUT", "maybe"),
            ("C10D_FR_DUMP_SIGNAL", "SIGFOO"),
        ] {
            let e = cfg(&[(k, v)]).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("Invalid value for environment variable: {k}")
            );
        }
    }

    #[test]
    fn signal_names_and_numbers() {
        let usr1 = signal_hook::consts::SIGUSR1;
        for v in ["SIGUSR1", "usr1", "UsR1"] {
            assert_eq!(
                cfg(&[(DUMP_SIGNAL_ENV, v)]).unwrap().dump_signal,
                Some(usr1)
            );
        }
        assert_eq!(
            cfg(&[(DUMP_SIGNAL_ENV, "12")]).unwrap().dump_signal,
            Some(12)
        );
    }
}

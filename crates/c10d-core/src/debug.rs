//! `TORCH_DISTRIBUTED_DEBUG` parsing.

use crate::error::{DistError, Result};

/// Debug level, mirrors `torch.distributed.DebugLevel` (`OFF`, `INFO`, `DETAIL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum DebugLevel {
    /// No extra checks (the default).
    #[default]
    Off,
    /// Extra logging.
    Info,
    /// Collective fingerprint checks before every collective (see c10d-world).
    Detail,
}

/// The environment variable PyTorch reads the debug level from.
pub const DEBUG_ENV: &str = "TORCH_DISTRIBUTED_DEBUG";

impl DebugLevel {
    /// Parses a value case-insensitively (`off`, `INFO`, `Detail` ...).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] with PyTorch's text
    /// "The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL." for anything else.
    pub fn parse(value: &str) -> Result<Self> {
        match value.to_ascii_uppercase().as_str() {
            "OFF" => Ok(DebugLevel::Off),
            "INFO" => Ok(DebugLevel::Info),
            "DETAIL" => Ok(DebugLevel::Detail),
            _ => Err(DistError::invalid(
                "The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL.",
            )),
        }
    }

    /// Reads `TORCH_DISTRIBUTED_DEBUG`; unset means [`DebugLevel::Off`].
    ///
    /// Mirrors `torch.distributed.get_debug_level()` after `set_debug_level_from_env()`.
    ///
    /// # Errors
    /// As [`DebugLevel::parse`] when the variable is set to an invalid value.
    pub fn from_env() -> Result<Self> {
        match std::env::var(DEBUG_ENV) {
            Ok(v) => Self::parse(&v),
            Err(_) => Ok(DebugLevel::Off),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_case_insensitively_and_rejects_others() {
        assert_eq!(DebugLevel::parse("off").unwrap(), DebugLevel::Off);
        assert_eq!(DebugLevel::parse("Info").unwrap(), DebugLevel::Info);
        assert_eq!(DebugLevel::parse("DETAIL").unwrap(), DebugLevel::Detail);
        for bad in ["foo", "0", "1", "-1", ""] {
            let e = DebugLevel::parse(bad).unwrap_err();
            assert_eq!(
                e.to_string(),
                "The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL."
            );
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        }
    }
}

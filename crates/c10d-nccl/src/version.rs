//! NCCL version numbers: decoding `ncclGetVersion`'s code, comparing, printing "2.27.3".

use std::fmt;

/// An NCCL version (major.minor.patch). Ordered, so `v >= Version::new(2, 18, 0)` reads as
/// "has ncclCommSplit".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major version (2 for every NCCL this crate supports).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch level.
    pub patch: u32,
}

impl Version {
    /// A version from its three parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Decodes the integer `ncclGetVersion` writes.
    ///
    /// NCCL's `NCCL_VERSION(X, Y, Z)` is `X*1000 + Y*100 + Z` up to 2.8 and
    /// `X*10000 + Y*100 + Z` from 2.9 on, so codes ≥ 10000 use the new scheme
    /// (`22703` → 2.27.3) and smaller ones the old (`2708` → 2.7.8). Negative codes give `None`.
    pub fn from_code(code: i32) -> Option<Version> {
        if code < 0 {
            return None;
        }
        let c = code as u32;
        Some(if c >= 10_000 {
            Version::new(c / 10_000, (c % 10_000) / 100, c % 100)
        } else {
            Version::new(c / 1000, (c % 1000) / 100, c % 100)
        })
    }

    /// The code NCCL's `NCCL_VERSION` macro gives for this version (inverse of
    /// [`Version::from_code`]).
    pub const fn code(self) -> i32 {
        if self.major <= 2 && self.minor <= 8 {
            (self.major * 1000 + self.minor * 100 + self.patch) as i32
        } else {
            (self.major * 10_000 + self.minor * 100 + self.patch) as i32
        }
    }

    /// Parses "2.27.3" (a fourth part, as in "2.27.3-1" or "2.27.3.1", is ignored).
    pub fn parse(s: &str) -> Option<Version> {
        let mut it = s
            .trim()
            .split(['.', '-', '+'])
            .map(|p| p.parse::<u32>().ok());
        let major = it.next()??;
        let minor = it.next()??;
        let patch = it.next()??;
        Some(Version::new(major, minor, patch))
    }
}

impl fmt::Display for Version {
    /// "2.27.3", as `torch.cuda.nccl.version()` prints joined with dots.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_both_schemes() {
        assert_eq!(Version::from_code(22703), Some(Version::new(2, 27, 3)));
        assert_eq!(Version::from_code(23007), Some(Version::new(2, 30, 7)));
        assert_eq!(Version::from_code(20903), Some(Version::new(2, 9, 3)));
        assert_eq!(Version::from_code(21003), Some(Version::new(2, 10, 3)));
        assert_eq!(Version::from_code(2708), Some(Version::new(2, 7, 8)));
        assert_eq!(Version::from_code(2406), Some(Version::new(2, 4, 6)));
        assert_eq!(Version::from_code(-1), None);
    }

    #[test]
    fn encodes_like_the_macro() {
        for v in [
            Version::new(2, 7, 8),
            Version::new(2, 9, 6),
            Version::new(2, 18, 1),
            Version::new(2, 27, 3),
        ] {
            assert_eq!(Version::from_code(v.code()), Some(v));
        }
        assert_eq!(Version::new(2, 8, 4).code(), 2804);
        assert_eq!(Version::new(2, 14, 0).code(), 21400);
    }

    #[test]
    fn orders_and_prints() {
        assert!(Version::new(2, 18, 0) > Version::new(2, 17, 9));
        assert!(Version::new(2, 9, 0) > Version::new(2, 8, 99));
        assert!(Version::new(3, 0, 0) > Version::new(2, 99, 99));
        assert_eq!(Version::new(2, 27, 3).to_string(), "2.27.3");
        assert_eq!(Version::parse("2.30.7"), Some(Version::new(2, 30, 7)));
        assert_eq!(Version::parse("2.27.3-1"), Some(Version::new(2, 27, 3)));
        assert_eq!(Version::parse("2.x"), None);
    }
}

//! Devices (`torch.device`).

use crate::error::{DistError, Result};

/// The kind of device, mirroring `c10::DeviceType` for the two this project supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceType {
    /// Host memory.
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
}

impl DeviceType {
    /// "cpu" or "cuda", as in backend strings like `"cpu:gloo,cuda:nccl"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeviceType::Cpu => "cpu",
            DeviceType::Cuda => "cuda",
        }
    }

    /// Parses "cpu" / "cuda" (case-insensitive).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] for any other string.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceType::Cpu),
            "cuda" => Ok(DeviceType::Cuda),
            _ => Err(DistError::invalid(format!("Unknown device type '{s}'"))),
        }
    }
}

impl std::fmt::Display for DeviceType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A device: `cpu` or `cuda:N`. Mirrors `torch.device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// CUDA device with the given ordinal.
    Cuda(u32),
}

impl Device {
    /// The device type.
    pub const fn device_type(self) -> DeviceType {
        match self {
            Device::Cpu => DeviceType::Cpu,
            Device::Cuda(_) => DeviceType::Cuda,
        }
    }

    /// Parses "cpu", "cuda", "cuda:3".
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] for malformed strings.
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("cpu") {
            return Ok(Device::Cpu);
        }
        if s.eq_ignore_ascii_case("cuda") {
            return Ok(Device::Cuda(0));
        }
        if let Some(n) = s.strip_prefix("cuda:") {
            return n
                .parse()
                .map(Device::Cuda)
                .map_err(|_| DistError::invalid(format!("Invalid device string: '{s}'")));
        }
        Err(DistError::invalid(format!("Invalid device string: '{s}'")))
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parse_devices() {
        assert_eq!(Device::parse("cpu").unwrap(), Device::Cpu);
        assert_eq!(Device::parse("cuda:2").unwrap(), Device::Cuda(2));
        assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
        assert!(Device::parse("tpu").is_err());
    }
}

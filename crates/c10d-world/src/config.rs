//! Backend names, backend strings and the backend registry (mirrors `torch.distributed.Backend`,
//! `BackendConfig` and `Backend.register_backend`).
//!
//! The registry is process-wide, like PyTorch's class attributes on `Backend`: every [`crate::World`]
//! in the process sees the same backends. Built-ins are `"gloo"` (CPU, and CUDA tensors staged
//! through the host in PyTorch; here it serves `cpu` and, as in PyTorch's capability table, is also
//! listed for `cuda`) and `"nccl"` (CUDA), served by `c10d-nccl`'s `ProcessGroupNccl`, which loads
//! NCCL and finds GPUs at run time. Where either is missing, `"nccl"` is unavailable and creating
//! it fails with `c10d-nccl`'s error: PyTorch's "ProcessGroupNCCL is only supported with GPUs, no
//! GPUs found!" without a GPU, the places searched without a loadable NCCL. PyTorch 2.15's NCCL
//! names are all built in: `"nccl"` and `"nccl2"` make the communicator at group creation
//! (eager, on `device_id` or the rank's default device) unless `TORCH_DIST_USE_NCCL2=0`, which
//! makes `"nccl"` lazy like `"nccl-legacy"` and `"nccl-lazy"` (at the first op, or at creation
//! with a `device_id`); see `NCCL_NAMES` for the departures.
//!
//! Backend strings follow PyTorch's `BackendConfig` rules:
//! - `"gloo"` → `cpu:gloo,cuda:gloo`; `"nccl"` → `cuda:nccl`; a registered name → its devices;
//! - `"cpu:gloo,cuda:nccl"` (case-insensitive) round-trips;
//! - `"undefined"` / none → `cpu:gloo` (this build detects no accelerator);
//! - `"cpu:gloo,"` or `"cpu:gloo:x"` → "Invalid device:backend pairing"; a repeated device →
//!   "Duplicate device type"; an unregistered name → "Unknown backend".
//!
//! Device types are typed ([`DeviceType`]: `cpu`, `cuda`) throughout: in the parsed config, the
//! registry and [`BackendCreateArgs::device`]. A device type c10d-rs has no tensors for
//! (`"xpu:gloo"`) is refused when the string is parsed ("Invalid device:backend pairing: …
//! Unknown device type 'xpu'"), and [`register_backend`] takes device types, not names.
//! PyTorch accepts any device name there (a departure on purpose: such a group could never run
//! an op here).

use c10d_core::{DeviceType, DistError, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

pub(crate) use crate::plugin::Plugin;
pub use crate::plugin::{BackendCreateArgs, BackendCreator};

/// The names of the built-in NCCL backends (see `nccl.rs` for how each initialises).
const NCCL_NAMES: [&str; 4] = ["nccl", "nccl2", "nccl-legacy", "nccl-lazy"];

struct Registry {
    /// Lower-case name → plugin.
    plugins: BTreeMap<String, Plugin>,
    /// Lower-case name → device types it supports (`Backend.backend_capability`).
    capability: Vec<(String, Vec<DeviceType>)>,
    /// Device type → default backend (`Backend.default_device_backend_map`).
    default_device_backend: Vec<(DeviceType, String)>,
}

fn registry() -> &'static RwLock<Registry> {
    static R: OnceLock<RwLock<Registry>> = OnceLock::new();
    R.get_or_init(|| {
        let mut plugins = BTreeMap::new();
        #[cfg(feature = "gloo")]
        plugins.insert("gloo".to_string(), crate::gloo::plugin());
        #[cfg(not(feature = "gloo"))]
        plugins.insert("gloo".to_string(), Plugin::left_out("gloo", "gloo"));
        let mut capability = vec![("gloo".into(), vec![DeviceType::Cpu, DeviceType::Cuda])];
        for name in NCCL_NAMES {
            #[cfg(feature = "nccl")]
            plugins.insert(name.to_string(), crate::nccl::plugin(name));
            #[cfg(not(feature = "nccl"))]
            plugins.insert(name.to_string(), Plugin::left_out(name, "nccl"));
            capability.push((name.to_string(), vec![DeviceType::Cuda]));
        }
        RwLock::new(Registry {
            plugins,
            capability,
            default_device_backend: vec![
                (DeviceType::Cpu, "gloo".into()),
                (DeviceType::Cuda, "nccl".into()),
            ],
        })
    })
}

fn read() -> std::sync::RwLockReadGuard<'static, Registry> {
    registry().read().unwrap_or_else(|e| e.into_inner())
}

/// Registers a third-party backend (`Backend.register_backend(name, func, extended_api, devices)`).
///
/// `name` is case-insensitive and stored lower-case. `devices` lists the device types it serves
/// (`None` = `[Cpu]`, PyTorch's "cpu and the current accelerator" on a CPU-only build); each
/// device without a default backend gets this one as default. Registering an existing name replaces
/// its creator (PyTorch raises for built-ins only through attribute clashes; here built-ins can be
/// replaced too, which tests use to inject fakes).
///
/// With `extended_api == false` the creator receives only store, rank, size, timeout and device
/// (other fields of [`BackendCreateArgs`] are empty), as PyTorch's plain creators do.
pub fn register_backend(
    name: &str,
    creator: BackendCreator,
    devices: Option<&[DeviceType]>,
    extended_api: bool,
) {
    let name = name.to_ascii_lowercase();
    let devices: Vec<DeviceType> = devices.map_or_else(|| vec![DeviceType::Cpu], <[_]>::to_vec);
    let mut r = registry().write().unwrap_or_else(|e| e.into_inner());
    r.capability.retain(|(n, _)| *n != name);
    r.capability.push((name.clone(), devices.clone()));
    for d in &devices {
        if !r.default_device_backend.iter().any(|(dev, _)| dev == d) {
            r.default_device_backend.push((*d, name.clone()));
        }
    }
    r.plugins.insert(
        name,
        Plugin {
            creator,
            extended_api,
            available: true,
            probe: None,
        },
    );
}

/// True when `name` is a registered backend whose creator can work in this build
/// (`is_backend_available`). `"gloo"` and registered third-party backends are available;
/// `"nccl"` only where c10d-nccl finds NCCL and a GPU. Also accepts a `"device:backend,..."` string (every backend must be available).
pub fn is_backend_available(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    if lower.contains(':') {
        return lower
            .split(',')
            .all(|p| p.split(':').nth(1).is_some_and(is_backend_available));
    }
    let plugin = read().plugins.get(&lower).map(|p| (p.available, p.probe));
    match plugin {
        Some((true, Some(probe))) => probe(),
        Some((available, _)) => available,
        None => false,
    }
}

/// `torch.distributed.is_gloo_available()`.
pub fn is_gloo_available() -> bool {
    is_backend_available("gloo")
}

/// `torch.distributed.is_nccl_available()`: c10d-nccl's `is_nccl_available` (the library
/// loads and a GPU is visible).
pub fn is_nccl_available() -> bool {
    is_backend_available("nccl")
}

/// `torch.cuda.is_available()`: a CUDA driver loads and sees at least one device (cached);
/// always false without the `nccl` feature.
pub fn cuda_available() -> bool {
    #[cfg(feature = "nccl")]
    return c10d_nccl::cuda_device_count() > 0;
    #[cfg(not(feature = "nccl"))]
    false
}

/// The default backend of a device type (`get_default_backend_for_device("cpu")` → `"gloo"`;
/// `"cuda:1"` reads as `cuda`).
///
/// # Errors
/// [`DistError::InvalidArgument`] "Default backend not registered for device : {device}" (also
/// for a device type c10d-rs does not know).
pub fn get_default_backend_for_device(device: &str) -> Result<String> {
    let unknown = || {
        DistError::invalid(format!(
            "Default backend not registered for device : {device}"
        ))
    };
    let d = DeviceType::parse(device.split(':').next().unwrap_or("")).map_err(|_| unknown())?;
    default_backend(d).ok_or_else(unknown)
}

/// The default backend of device type `d`, if one is registered.
fn default_backend(d: DeviceType) -> Option<String> {
    read()
        .default_device_backend
        .iter()
        .find(|(dev, _)| *dev == d)
        .map(|(_, b)| b.clone())
}

/// Normalises a backend name like `Backend(name)`: lower case.
pub fn normalize_backend_name(name: &str) -> String {
    name.to_ascii_lowercase()
}

pub(crate) fn creator_for(name: &str) -> Result<(BackendCreator, bool)> {
    read()
        .plugins
        .get(&name.to_ascii_lowercase())
        .map(|p| (p.creator.clone(), p.extended_api))
        .ok_or_else(|| unknown_backend(name))
}

fn unknown_backend(name: &str) -> DistError {
    let known: Vec<String> = read().plugins.keys().cloned().collect();
    DistError::invalid(format!(
        "Unknown backend '{name}'. Specify a 'device:backend' string or use one of: {known:?}"
    ))
}

const FORMAT_HINT: &str = "Custom backend string is an experimental feature where the backend string must be in the format: \"<device_type1>:<backend1>,<device_type2>:<backend2>...\". e.g. 'cpu:gloo,cuda:nccl'";

/// A parsed backend string (`BackendConfig`): ordered device → backend pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// (device type, backend name) pairs, names lower case, in the order given.
    pub device_backend_map: Vec<(DeviceType, String)>,
}

impl BackendConfig {
    /// Parses a backend string with PyTorch's `BackendConfig` rules (see the module docs).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`]: "Invalid device:backend pairing: {pair}. ...",
    /// "Duplicate device type {device} in backend string: {string}. ...", "Unknown backend '{name}' ...".
    pub fn parse(backend: &str) -> Result<BackendConfig> {
        let lower = backend.trim().to_ascii_lowercase();
        let mut map: Vec<(DeviceType, String)> = Vec::new();
        if lower.is_empty() || lower == "undefined" {
            let b = get_default_backend_for_device("cpu")?;
            map.push((DeviceType::Cpu, b));
        } else if !lower.contains(':') {
            let caps = read()
                .capability
                .iter()
                .find(|(n, _)| *n == lower)
                .map(|(_, d)| d.clone());
            match caps {
                Some(devs) => {
                    for d in devs {
                        map.push((d, lower.clone()));
                    }
                }
                None => return Err(unknown_backend(&lower)),
            }
        } else {
            for pair in lower.split(',') {
                let parts: Vec<&str> = pair.split(':').collect();
                if parts.len() != 2 {
                    return Err(DistError::invalid(format!(
                        "Invalid device:backend pairing: {pair}. The custom backend string argument is invalid: {backend}. {FORMAT_HINT}"
                    )));
                }
                let (device, name) = (parts[0].trim(), parts[1].trim().to_string());
                let device = DeviceType::parse(device).map_err(|_| {
                    DistError::invalid(format!(
                        "Invalid device:backend pairing: {pair}. Unknown device type '{device}' (c10d-rs knows cpu and cuda). {FORMAT_HINT}"
                    ))
                })?;
                if map.iter().any(|(d, _)| *d == device) {
                    return Err(DistError::invalid(format!(
                        "Duplicate device type {device} in backend string: {backend}. {FORMAT_HINT}"
                    )));
                }
                if !read().plugins.contains_key(&name) {
                    return Err(unknown_backend(&name));
                }
                map.push((device, name));
            }
        }
        Ok(BackendConfig {
            device_backend_map: map,
        })
    }

    /// The device → backend map (`get_device_backend_map`).
    pub fn device_backend_map(&self) -> &[(DeviceType, String)] {
        &self.device_backend_map
    }

    /// The distinct backend names, in order.
    pub fn backend_names(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for (_, b) in &self.device_backend_map {
            if !v.contains(b) {
                v.push(b.clone());
            }
        }
        v
    }
}

impl fmt::Display for BackendConfig {
    /// `"cpu:gloo,cuda:nccl"` (PyTorch's `repr(BackendConfig)`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s: Vec<String> = self
            .device_backend_map
            .iter()
            .map(|(d, b)| format!("{d}:{b}"))
            .collect();
        f.write_str(&s.join(","))
    }
}

/// The default timeout for a backend string (`_get_default_timeout`): 10 min for NCCL variants
/// ("nccl", "nccl2", "nccl-legacy", "nccl-lazy"), 30 min otherwise.
pub fn default_timeout_for(backend: &str) -> Duration {
    let b = backend.to_ascii_lowercase();
    if matches!(b.as_str(), "nccl" | "nccl2" | "nccl-legacy" | "nccl-lazy") {
        c10d_core::DEFAULT_NCCL_TIMEOUT
    } else {
        c10d_core::DEFAULT_TIMEOUT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_types_are_checked_when_parsed() {
        let e = BackendConfig::parse("xpu:gloo").unwrap_err();
        assert!(
            e.message()
                .starts_with("Invalid device:backend pairing: xpu:gloo. Unknown device type 'xpu'"),
            "{e}"
        );
        let map = BackendConfig::parse("cpu:gloo,cuda:nccl").unwrap();
        assert_eq!(
            map.device_backend_map(),
            &[
                (DeviceType::Cpu, "gloo".to_string()),
                (DeviceType::Cuda, "nccl".to_string())
            ]
        );
        assert!(get_default_backend_for_device("xpu").is_err());
        assert_eq!(get_default_backend_for_device("cuda:1").unwrap(), "nccl");
    }

    #[test]
    fn parse_backend_strings() {
        assert_eq!(
            BackendConfig::parse("gloo").unwrap().to_string(),
            "cpu:gloo,cuda:gloo"
        );
        assert_eq!(
            BackendConfig::parse("GLOO").unwrap().to_string(),
            "cpu:gloo,cuda:gloo"
        );
        assert_eq!(
            BackendConfig::parse("nccl").unwrap().to_string(),
            "cuda:nccl"
        );
        assert_eq!(
            BackendConfig::parse("cpu:gloo,cuda:nccl")
                .unwrap()
                .to_string(),
            "cpu:gloo,cuda:nccl"
        );
        assert_eq!(
            BackendConfig::parse("CPU:GLOO,CUDA:NCCL")
                .unwrap()
                .to_string(),
            "cpu:gloo,cuda:nccl"
        );
        assert_eq!(
            BackendConfig::parse("undefined").unwrap().to_string(),
            "cpu:gloo"
        );
        let e = BackendConfig::parse("cpu:gloo,").unwrap_err();
        assert!(
            e.to_string().contains("Invalid device:backend pairing"),
            "{e}"
        );
        let e = BackendConfig::parse("cpu:gloo:x").unwrap_err();
        assert!(
            e.to_string().contains("Invalid device:backend pairing"),
            "{e}"
        );
        let e = BackendConfig::parse("cpu:gloo,cpu:nccl").unwrap_err();
        assert!(e.to_string().contains("Duplicate device type cpu"), "{e}");
        // PyTorch 2.15's NCCL names are built in (CUDA only).
        for name in ["nccl2", "nccl-legacy", "nccl-lazy"] {
            assert_eq!(
                BackendConfig::parse(name).unwrap().to_string(),
                format!("cuda:{name}")
            );
        }
        let e = BackendConfig::parse("bogus").unwrap_err();
        assert!(e.to_string().contains("Unknown backend"), "{e}");
        assert_eq!(e.kind(), c10d_core::ErrorKind::InvalidArgument);
    }

    #[test]
    fn timeouts_and_defaults() {
        assert_eq!(default_timeout_for("nccl"), Duration::from_secs(600));
        assert_eq!(default_timeout_for("nccl-lazy"), Duration::from_secs(600));
        assert_eq!(default_timeout_for("gloo"), Duration::from_secs(1800));
        assert_eq!(get_default_backend_for_device("cpu").unwrap(), "gloo");
        assert_eq!(get_default_backend_for_device("cuda:0").unwrap(), "nccl");
        assert!(get_default_backend_for_device("xpu").is_err());
        assert!(!is_nccl_available());
        assert!(!is_backend_available("cpu:gloo,cuda:nccl"));
    }

    #[test]
    #[cfg(feature = "nccl")]
    fn nccl_group_creation_fails_with_c10d_nccls_reason() {
        use crate::world::{InitOptions, World};
        let w = World::new();
        let store: std::sync::Arc<dyn c10d_store::Store> =
            std::sync::Arc::new(c10d_store::HashStore::new());
        let e = w
            .init_process_group(InitOptions {
                backend: Some("nccl".into()),
                store: Some(store),
                rank: Some(0),
                world_size: Some(1),
                ..Default::default()
            })
            .unwrap_err();
        assert!(!w.is_initialized());
        let m = e.message();
        assert!(m.contains("nccl is not available"), "{m}");
        if c10d_nccl::cuda_device_count() == 0 {
            assert_eq!(e.kind(), c10d_core::ErrorKind::InvalidArgument);
            assert!(
                m.starts_with("ProcessGroupNCCL is only supported with GPUs, no GPUs found!"),
                "{m}"
            );
            assert!(m.contains("libcuda"), "{m}");
        } else {
            assert!(
                m.contains("could not be loaded")
                    || m.contains("collectives are not in this version"),
                "{m}"
            );
        }
    }
}

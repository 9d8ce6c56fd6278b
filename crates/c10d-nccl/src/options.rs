//! The backend's options (PyTorch's `ProcessGroupNCCL.Options`) and the communicator
//! configuration (`NCCLConfig`, NCCL's `ncclConfig_t`).

use crate::env::NcclEnv;
use crate::sys;
use c10d_core::BackendOptions;
use std::ffi::CString;
use std::time::Duration;

/// NCCL's "not set" value for integer config fields (`NCCL_CONFIG_UNDEF_INT`, `INT_MIN`).
pub const CONFIG_UNDEF_INT: i32 = sys::NCCL_CONFIG_UNDEF_INT;

/// Communicator configuration, as `torch.cuda.nccl`'s `NCCLConfig`: every integer defaults to
/// [`CONFIG_UNDEF_INT`] (NCCL picks), strings to unset. Copyable like PyTorch's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclConfig {
    /// 1 = blocking communicator calls, 0 = non-blocking (`ncclInProgress`).
    pub blocking: i32,
    /// CUDA thread-block cluster size.
    pub cga_cluster_size: i32,
    /// Minimum number of CTAs.
    pub min_ctas: i32,
    /// Maximum number of CTAs.
    pub max_ctas: i32,
    /// Network plugin to use.
    pub net_name: Option<String>,
    /// 1 = children made by split share the parent's resources.
    pub split_share: i32,
    /// Communicator name; [`NcclOptions::from_backend_options`] sets `"<desc>:<name>"` when unset.
    pub comm_name: Option<String>,
}

impl Default for NcclConfig {
    fn default() -> Self {
        NcclConfig {
            blocking: CONFIG_UNDEF_INT,
            cga_cluster_size: CONFIG_UNDEF_INT,
            min_ctas: CONFIG_UNDEF_INT,
            max_ctas: CONFIG_UNDEF_INT,
            net_name: None,
            split_share: CONFIG_UNDEF_INT,
            comm_name: None,
        }
    }
}

/// An `ncclConfig_t` together with the C strings its pointers refer to; pass
/// [`RawConfig::as_mut_ptr`] to `ncclCommInitRankConfig` / `ncclCommSplit` while this lives.
#[derive(Debug)]
pub struct RawConfig {
    raw: sys::ncclConfig_t,
    _net_name: Option<CString>,
    _comm_name: Option<CString>,
}

impl RawConfig {
    /// The C struct (its string pointers borrow from `self`).
    pub fn raw(&self) -> &sys::ncclConfig_t {
        &self.raw
    }

    /// Pointer for the NCCL call; valid while `self` is alive and not moved.
    pub fn as_mut_ptr(&mut self) -> *mut sys::ncclConfig_t {
        &mut self.raw
    }
}

impl NcclConfig {
    /// Builds the C struct. Strings with an interior NUL are cut at it (NCCL would stop there).
    pub fn to_raw(&self) -> RawConfig {
        let cstr = |s: &Option<String>| {
            s.as_ref().map(|s| {
                let bytes: Vec<u8> = s.bytes().take_while(|&b| b != 0).collect();
                CString::new(bytes).expect("NUL bytes were removed")
            })
        };
        let net_name = cstr(&self.net_name);
        let comm_name = cstr(&self.comm_name);
        let mut raw = sys::ncclConfig_t::initializer();
        raw.blocking = self.blocking;
        raw.cgaClusterSize = self.cga_cluster_size;
        raw.minCTAs = self.min_ctas;
        raw.maxCTAs = self.max_ctas;
        raw.splitShare = self.split_share;
        raw.netName = net_name.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        raw.commName = comm_name.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        // The CStrings' heap buffers do not move when the CStrings move into the struct.
        RawConfig {
            raw,
            _net_name: net_name,
            _comm_name: comm_name,
        }
    }
}

/// Options of one NCCL backend instance (`ProcessGroupNCCL.Options`).
#[derive(Debug, Clone, PartialEq)]
pub struct NcclOptions {
    /// Default timeout of every op (10 minutes).
    pub timeout: Duration,
    /// Run NCCL ops on a high-priority CUDA stream.
    pub is_high_priority_stream: bool,
    /// Communicator configuration.
    pub config: NcclConfig,
    /// Group name (`group_name`, the PG GUID in logs).
    pub group_name: String,
    /// Group description (`group_desc`).
    pub group_desc: String,
    /// Global ranks of the members in group-rank order (empty for the default group).
    pub global_ranks: Vec<usize>,
    /// How rank 0's `ncclUniqueId` reaches the others through the store (c10d-rs's own by
    /// default; PyTorch's legacy, PyTorch 2.15 nccl2 and vLLM's schemes let their processes
    /// join the group).
    pub unique_id_exchange: crate::unique_id::UniqueIdExchange,
}

impl Default for NcclOptions {
    fn default() -> Self {
        NcclOptions {
            timeout: c10d_core::DEFAULT_NCCL_TIMEOUT,
            is_high_priority_stream: false,
            config: NcclConfig::default(),
            group_name: String::new(),
            group_desc: String::new(),
            global_ranks: Vec::new(),
            unique_id_exchange: crate::unique_id::UniqueIdExchange::default(),
        }
    }
}

impl NcclOptions {
    /// Options for a group described by core [`BackendOptions`], with the environment's
    /// overrides: `TORCH_NCCL_HIGH_PRIORITY` forces high-priority streams, and an unset
    /// communicator name becomes `"<group_desc>:<group_name>"` as PyTorch names it.
    pub fn from_backend_options(opts: &BackendOptions, env: &NcclEnv) -> NcclOptions {
        let mut o = NcclOptions {
            timeout: opts.timeout,
            group_name: opts.group_name.clone(),
            group_desc: opts.group_desc.clone(),
            global_ranks: opts.global_ranks.clone(),
            ..NcclOptions::default()
        };
        o.apply_env(env);
        o
    }

    /// Applies the environment overrides and defaults to options the user built (what
    /// PyTorch's constructor does to `pg_options`).
    pub fn apply_env(&mut self, env: &NcclEnv) {
        self.is_high_priority_stream |= env.high_priority;
        if self.config.comm_name.is_none() {
            self.config.comm_name = Some(format!("{}:{}", self.group_desc, self.group_name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn defaults() {
        let o = NcclOptions::default();
        assert_eq!(o.timeout, Duration::from_secs(600));
        assert_eq!(o.timeout, c10d_core::DEFAULT_NCCL_TIMEOUT);
        assert!(!o.is_high_priority_stream);
        let c = NcclConfig::default();
        assert_eq!(c.min_ctas, -2147483648);
        assert_eq!(c.max_ctas, i32::MIN);
        assert_eq!(c.blocking, i32::MIN);
        assert_eq!(c.cga_cluster_size, i32::MIN);
        assert_eq!(c.split_share, i32::MIN);
        assert_eq!(c.net_name, None);
        let copy = c.clone();
        assert_eq!(copy, c);
    }

    #[test]
    fn from_backend_options_names_the_comm_and_reads_env() {
        let bo = BackendOptions {
            backend: "nccl".into(),
            timeout: Duration::from_secs(123),
            group_name: "0".into(),
            group_desc: "default_pg".into(),
            global_ranks: vec![],
        };
        let o = NcclOptions::from_backend_options(&bo, &NcclEnv::default());
        assert_eq!(o.timeout, Duration::from_secs(123));
        assert_eq!(o.config.comm_name.as_deref(), Some("default_pg:0"));
        assert!(!o.is_high_priority_stream);
        let env = NcclEnv {
            high_priority: true,
            ..NcclEnv::default()
        };
        let o = NcclOptions::from_backend_options(&bo, &env);
        assert!(o.is_high_priority_stream);
        // A user-chosen name is kept.
        let mut user = NcclOptions {
            config: NcclConfig {
                comm_name: Some("mine".into()),
                ..NcclConfig::default()
            },
            ..NcclOptions::default()
        };
        user.apply_env(&NcclEnv::default());
        assert_eq!(user.config.comm_name.as_deref(), Some("mine"));
    }

    #[test]
    fn raw_config_carries_fields_and_strings() {
        let c = NcclConfig {
            blocking: 0,
            max_ctas: 16,
            net_name: Some("Socket".into()),
            comm_name: Some("default_pg:0".into()),
            split_share: 1,
            ..NcclConfig::default()
        };
        let mut raw = c.to_raw();
        let r = *raw.raw();
        assert_eq!(r.magic, sys::NCCL_API_MAGIC);
        assert_eq!(r.size, std::mem::size_of::<sys::ncclConfig_t>());
        assert_eq!(r.blocking, 0);
        assert_eq!(r.maxCTAs, 16);
        assert_eq!(r.minCTAs, i32::MIN);
        assert_eq!(r.splitShare, 1);
        assert_eq!(r.trafficClass, i32::MIN);
        // SAFETY: the pointers refer to CStrings owned by `raw`, alive for this scope.
        let (net, name) = unsafe { (CStr::from_ptr(r.netName), CStr::from_ptr(r.commName)) };
        assert_eq!(net.to_str().unwrap(), "Socket");
        assert_eq!(name.to_str().unwrap(), "default_pg:0");
        assert!(!raw.as_mut_ptr().is_null());
        let unset = NcclConfig::default().to_raw();
        assert!(unset.raw().netName.is_null() && unset.raw().commName.is_null());
    }
}

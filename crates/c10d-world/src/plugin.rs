//! What the backend registry holds and hands to a backend creator: [`BackendCreateArgs`],
//! [`BackendCreator`] and the registry entry `Plugin`. Below `config` (the registry) and the
//! built-in creators (`gloo`, `nccl`), which all use it.

use c10d_core::{Backend, BackendOptions, DeviceType, DistError, Result};
use c10d_store::Store;
use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Everything a backend creator receives (mirrors `c10d::DistributedBackendOptions` for
/// extended-API creators and `(store, rank, world_size, timeout)` for the others).
#[derive(Clone)]
pub struct BackendCreateArgs {
    /// The group's store for this device: `PrefixStore("<device>/", PrefixStore("<group name>/", ...))`.
    pub store: Arc<dyn Store>,
    /// This process's rank in the group.
    pub group_rank: usize,
    /// Number of ranks in the group.
    pub group_size: usize,
    /// Default timeout of every op.
    pub timeout: Duration,
    /// The device type this instance serves.
    pub device: DeviceType,
    /// Group name (`group_id`); empty for non-extended creators.
    pub group_name: String,
    /// Group description; empty for non-extended creators.
    pub group_desc: String,
    /// Global ranks of the members in group-rank order (`global_ranks_in_group`); empty for the
    /// default group and for non-extended creators.
    pub global_ranks_in_group: Vec<usize>,
    /// The backend-specific options the user passed as `pg_options`, if any (extended only).
    pub pg_options: Option<Arc<dyn Any + Send + Sync>>,
    /// `MASTER_ADDR` (or the host of a `tcp://` init method), a hint for the listen address.
    pub hostname_hint: Option<String>,
    /// The device the group is bound to (`device_id`): an NCCL group makes its communicator
    /// there at once (eager init) instead of at its first collective.
    pub device_id: Option<c10d_core::Device>,
}

impl BackendCreateArgs {
    /// The core [`BackendOptions`] for these arguments.
    pub fn backend_options(&self, backend: &str) -> BackendOptions {
        BackendOptions {
            backend: backend.to_string(),
            timeout: self.timeout,
            group_name: self.group_name.clone(),
            group_desc: self.group_desc.clone(),
            global_ranks: self.global_ranks_in_group.clone(),
        }
    }
}

impl fmt::Debug for BackendCreateArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendCreateArgs")
            .field("group_rank", &self.group_rank)
            .field("group_size", &self.group_size)
            .field("timeout", &self.timeout)
            .field("device", &self.device)
            .field("group_name", &self.group_name)
            .field("global_ranks_in_group", &self.global_ranks_in_group)
            .finish()
    }
}

/// A backend constructor (`func` of `Backend.register_backend`). Returns `Ok(None)` when this
/// rank should be treated as a non-member (PyTorch's creators may return `None`).
pub type BackendCreator =
    Arc<dyn Fn(&BackendCreateArgs) -> Result<Option<Arc<dyn Backend>>> + Send + Sync>;

/// A registry entry: how to create the backend and whether it can be created here.
#[derive(Clone)]
pub(crate) struct Plugin {
    pub(crate) creator: BackendCreator,
    pub(crate) extended_api: bool,
    pub(crate) available: bool,
    /// Asked (outside the registry lock) when `available` is true; `None` = always usable.
    pub(crate) probe: Option<fn() -> bool>,
}

impl Plugin {
    /// A built-in backend this build left out (its cargo feature is off): known by name, not
    /// available, and its creation fails saying which feature to turn on.
    #[cfg_attr(all(feature = "gloo", feature = "nccl"), allow(dead_code))]
    pub(crate) fn left_out(name: &'static str, feature: &'static str) -> Plugin {
        Plugin {
            creator: Arc::new(move |_a: &BackendCreateArgs| {
                Err(DistError::unsupported(format!(
                    "Backend {name} is not available: c10d-world was built without its `{feature}` feature"
                )))
            }),
            extended_api: true,
            available: false,
            probe: None,
        }
    }
}

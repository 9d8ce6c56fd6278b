//! The argument structs of group creation: [`InitOptions`], [`GroupOptions`], [`SplitOptions`]
//! and the backend options [`PgOptions`].

use c10d_core::Device;
use c10d_store::Store;
use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

/// Backend-specific options (`pg_options` / `backend_options`). `timeout` mirrors
/// `Options._timeout`, which `init_process_group`/`new_group` ignore with a warning in favour of
/// their own `timeout` argument, as PyTorch does. `backend_specific` is handed to extended-API
/// creators (e.g. `c10d_gloo::GlooOptions`).
#[derive(Clone, Default)]
pub struct PgOptions {
    /// `_timeout` of the options object (ignored by group creation, with a warning).
    pub timeout: Option<Duration>,
    /// Options object passed through to the backend creator.
    pub backend_specific: Option<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("timeout", &self.timeout)
            .field("backend_specific", &self.backend_specific.is_some())
            .finish()
    }
}

/// An environment lookup: `Some(value)` for a set variable, `None` for an unset one.
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Arguments of [`World::init_process_group`](super::World::init_process_group) (`torch.distributed.init_process_group`).
#[derive(Clone, Default)]
pub struct InitOptions {
    /// Backend string ("gloo", "nccl", "cpu:gloo,cuda:nccl", a registered name); `None` =
    /// the default for `device_id`'s type, else "undefined" → `cpu:gloo`.
    pub backend: Option<String>,
    /// Init method URL (`env://`, `tcp://host:port`, `file:///path`); `None` and no `store` → `env://`.
    pub init_method: Option<String>,
    /// An existing store shared by all ranks (then `world_size` and `rank` are required).
    pub store: Option<Arc<dyn Store>>,
    /// Number of ranks.
    pub world_size: Option<usize>,
    /// This process's rank.
    pub rank: Option<usize>,
    /// Default op timeout of the group; `None` = 30 min (10 min for NCCL).
    pub timeout: Option<Duration>,
    /// Device the default group is bound to.
    pub device_id: Option<Device>,
    /// Backend options.
    pub pg_options: Option<PgOptions>,
    /// Ignored, as in PyTorch (the default group is always named "0").
    pub group_name: Option<String>,
    /// Environment lookup for `env://` (`MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`,
    /// `TORCHELASTIC_USE_AGENT_STORE` ...); `None` = the process environment. Lets ranks that run
    /// as threads use `env://` with their own variables.
    pub env: Option<EnvLookup>,
}

impl std::fmt::Debug for InitOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitOptions")
            .field("backend", &self.backend)
            .field("init_method", &self.init_method)
            .field("store", &self.store.is_some())
            .field("world_size", &self.world_size)
            .field("rank", &self.rank)
            .field("timeout", &self.timeout)
            .field("device_id", &self.device_id)
            .finish()
    }
}

/// Arguments of [`World::new_group`](super::World::new_group) besides the ranks (`torch.distributed.new_group`).
#[derive(Clone, Debug)]
pub struct GroupOptions {
    /// Default op timeout; `None` = the backend's default (30 min, NCCL 10 min).
    pub timeout: Option<Duration>,
    /// Backend string; `None` = the default group's.
    pub backend: Option<String>,
    /// Backend options.
    pub pg_options: Option<PgOptions>,
    /// Only members call; non-members get the sentinel at once; hashed group names.
    pub use_local_synchronization: bool,
    /// Group description (default "undefined").
    pub group_desc: Option<String>,
    /// Bound device; must match the default group's when that is bound.
    pub device_id: Option<Device>,
    /// Sort the ranks (default true); when false, list position = group rank.
    pub sort_ranks: bool,
    /// An explicit group name (what PyTorch's private `_new_process_group_helper(group_name=..)`
    /// takes); the counter still advances. `None` = the counter/SHA-1 name.
    pub group_name: Option<String>,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            timeout: None,
            backend: None,
            pg_options: None,
            use_local_synchronization: false,
            group_desc: None,
            device_id: None,
            sort_ranks: true,
            group_name: None,
        }
    }
}

/// Arguments of [`World::split_group`](super::World::split_group) besides parent and ranks.
#[derive(Clone, Debug, Default)]
pub struct SplitOptions {
    /// Default op timeout of the child; `None` = the backend's default.
    pub timeout: Option<Duration>,
    /// Backend options for the child.
    pub pg_options: Option<PgOptions>,
    /// Description; `None` = `"<parent desc>:split:<n>"`.
    pub group_desc: Option<String>,
    /// Keep only these device backends of the parent ("gloo", "cpu:gloo").
    pub backend: Option<String>,
}

//! The process-wide state of `torch.distributed` (`_World`) behind an explicit [`World`] value:
//! the default group, every group's name, store, rank map, backend config and tag, the group
//! counter, and the name → group registry.
//!
//! [`World::global`] is the one the free functions of this crate use; tests create several
//! [`World`]s (one per rank thread) with [`World::new`].
//!
//! Locking: the state lock is never held while a backend is created or a collective runs, so a
//! slow rendezvous in one group cannot block queries.
//!
//! One concept per file; each adds methods to [`World`]:
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | [`World`], its state (`State`, `GroupEntry`) and per-world settings |
//! | `member.rs` | [`GroupMember`] (a group or PyTorch's `NON_GROUP_MEMBER`) |
//! | `options.rs` | [`InitOptions`], [`GroupOptions`], [`SplitOptions`], [`PgOptions`] |
//! | `init.rs` | `init_process_group`, [`store_based_barrier`], launcher environment |
//! | `groups.rs` | `new_group`, `new_subgroups*`, `_find_or_create_pg_by_ranks_and_tag` |
//! | `split.rs` | `split_group` |
//! | `create.rs` | the one backend-creation path every group goes through (`NewPg`) |
//! | `registry.rs` | registration under names and tags, group naming, the name registry |
//! | `queries.rs` | `get_rank`, `get_world_size`, `get_backend`, ... |
//! | `teardown.rs` | `destroy_process_group`, `_abort_process_group` |

mod create;
mod groups;
mod init;
mod member;
mod options;
mod queries;
mod registry;
mod split;
mod teardown;

pub(crate) use create::{BackendSource, NewPg};
pub(crate) use init::join_store;
pub use init::{get_node_local_rank, is_torchelastic_launched, store_based_barrier};
pub use member::{GroupMember, NON_GROUP_MEMBER_VALUE};
pub use options::{EnvLookup, GroupOptions, InitOptions, PgOptions, SplitOptions};
pub use registry::hash_ranks_to_str;
pub(crate) use registry::process_group_name;
pub(crate) use teardown::stop_backends;

use crate::config::BackendConfig;
use c10d_core::{DebugLevel, DistError, ProcessGroup, Result};
use c10d_store::Store;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

#[derive(Clone)]
pub(crate) struct GroupEntry {
    pub(crate) pg: ProcessGroup,
    /// The backend string the group was created with (`pg_map[pg][0]`).
    pub(crate) backend_name: String,
    /// The group's prefix store (`pg_map[pg][1]`).
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: BackendConfig,
    /// Global ranks in group-rank order.
    pub(crate) ranks: Vec<usize>,
    pub(crate) tag: String,
    pub(crate) split_count: usize,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) default_pg: Option<ProcessGroup>,
    pub(crate) groups: Vec<GroupEntry>,
    pub(crate) group_count: usize,
    pub(crate) tags_to_pg: HashMap<String, Vec<ProcessGroup>>,
    pub(crate) registry: HashMap<String, ProcessGroup>,
    pub(crate) init_method: Option<String>,
    pub(crate) hostname_hint: Option<String>,
    pub(crate) coalescing: Option<crate::coalescing::CoalescingState>,
    /// Grows of WORLD so far (the generation of the next, `crate::grow`).
    pub(crate) grow_generation: u64,
}

impl State {
    pub(crate) fn entry(&self, pg: &ProcessGroup) -> Option<&GroupEntry> {
        self.groups.iter().find(|e| e.pg.ptr_eq(pg))
    }
    fn entry_mut(&mut self, pg: &ProcessGroup) -> Option<&mut GroupEntry> {
        self.groups.iter_mut().find(|e| e.pg.ptr_eq(pg))
    }
    /// The default group's entry; "Default process group has not been initialized" without one.
    pub(crate) fn default_entry(&self) -> Result<&GroupEntry> {
        self.default_pg
            .as_ref()
            .and_then(|pg| self.entry(pg))
            .ok_or_else(|| DistError::invalid(NOT_INITIALIZED))
    }
    fn is_world(&self, pg: &ProcessGroup) -> bool {
        self.default_pg.as_ref().is_some_and(|d| d.ptr_eq(pg))
    }
}

#[derive(Default)]
struct Settings {
    debug_level: Option<DebugLevel>,
    init_barrier: Option<bool>,
    detail_helper_backend: Option<String>,
    /// Meshes whose arguments were checked across ranks (kept across re-initialisation).
    mesh_checks: usize,
}

/// The state of one `torch.distributed` "process": default group, groups, names, tags.
///
/// All methods mirror the free functions of `torch.distributed` of the same name; see the crate
/// docs. `World` is `Send + Sync`; share it with `Arc` or use [`World::global`].
pub struct World {
    pub(crate) state: Mutex<State>,
    settings: Mutex<Settings>,
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("World")
            .field("initialized", &st.default_pg.is_some())
            .field("groups", &st.groups.len())
            .finish()
    }
}

pub(crate) const NOT_INITIALIZED: &str =
    "Default process group has not been initialized, please make sure to call init_process_group.";

impl World {
    /// An empty world (no default group). Debug level and init barrier come from the environment
    /// unless set with [`World::set_debug_level`] / [`World::set_init_barrier`].
    pub fn new() -> World {
        World {
            state: Mutex::new(State::default()),
            settings: Mutex::new(Settings::default()),
        }
    }

    /// The process-wide world used by the free functions.
    pub fn global() -> &'static World {
        static G: OnceLock<World> = OnceLock::new();
        G.get_or_init(World::new)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn settings(&self) -> MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Overrides `TORCH_DISTRIBUTED_DEBUG` for this world (groups created afterwards).
    pub fn set_debug_level(&self, level: DebugLevel) {
        self.settings().debug_level = Some(level);
    }

    /// The debug level: the override, else `TORCH_DISTRIBUTED_DEBUG` (`get_debug_level`).
    ///
    /// # Errors
    /// "The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL." for a bad variable.
    pub fn get_debug_level(&self) -> Result<DebugLevel> {
        match self.settings().debug_level {
            Some(l) => Ok(l),
            None => DebugLevel::from_env(),
        }
    }

    /// Overrides `TORCH_DIST_INIT_BARRIER` for this world.
    pub fn set_init_barrier(&self, on: bool) {
        self.settings().init_barrier = Some(on);
    }

    fn init_barrier(&self) -> bool {
        self.settings().init_barrier.unwrap_or_else(|| {
            std::env::var("TORCH_DIST_INIT_BARRIER").is_ok_and(|v| v.trim() == "1")
        })
    }

    /// The number of this mesh argument check (0, 1, …); see `device_mesh::agree`.
    pub(crate) fn next_mesh_check(&self) -> usize {
        let mut s = self.settings();
        s.mesh_checks += 1;
        s.mesh_checks - 1
    }

    /// The backend used for DETAIL mode's helper group (default "gloo", as PyTorch's
    /// `ProcessGroupWrapper`); tests may point it at another registered CPU backend.
    pub fn set_detail_helper_backend(&self, name: &str) {
        self.settings().detail_helper_backend = Some(name.to_ascii_lowercase());
    }
}

pub(crate) fn not_registered(g: &ProcessGroup) -> DistError {
    DistError::invalid(format!(
        "Group {g:?} is not registered, please create group with torch.distributed.new_group API"
    ))
}

//! The process-wide state of `torch.distributed` (`_World`) behind an explicit [`World`] value:
//! the default group, every group's name, store, rank map, backend config and tag, the group
//! counter, and the name → group registry.
//!
//! [`World::global`] is the one the free functions of this crate use; tests create several
//! [`World`]s (one per rank thread) with [`World::new`].
//!
//! Locking: the state lock is never held while a backend is created or a collective runs, so a
//! slow rendezvous in one group cannot block queries.

use crate::config::{self, BackendConfig, BackendCreateArgs};
use crate::detail::DetailWrapper;
use c10d_core::{
    Backend, BackendOptions, DebugLevel, Device, DeviceType, DistError, ProcessGroup, Result,
};
use c10d_store::{PrefixStore, Store};
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// `GroupMember.NON_GROUP_MEMBER`'s value in PyTorch (−100).
pub const NON_GROUP_MEMBER_VALUE: i64 = -100;

/// What group creation returns on one rank: the group, or PyTorch's `GroupMember.NON_GROUP_MEMBER`
/// sentinel on ranks outside it. Collectives given a non-member group warn and do nothing.
#[derive(Clone, Debug)]
pub enum GroupMember {
    /// This rank belongs to the group.
    Group(ProcessGroup),
    /// This rank is not in the group (`GroupMember.NON_GROUP_MEMBER`, value −100).
    NonGroupMember,
}

impl GroupMember {
    /// The group, or `None` for the non-member sentinel.
    pub fn group(&self) -> Option<&ProcessGroup> {
        match self {
            GroupMember::Group(g) => Some(g),
            GroupMember::NonGroupMember => None,
        }
    }
    /// True for the non-member sentinel.
    pub fn is_non_member(&self) -> bool {
        matches!(self, GroupMember::NonGroupMember)
    }
    /// The group.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "this rank is not a member of the group" for the sentinel.
    pub fn into_group(self) -> Result<ProcessGroup> {
        match self {
            GroupMember::Group(g) => Ok(g),
            GroupMember::NonGroupMember => Err(DistError::invalid(
                "this rank is not a member of the group (GroupMember.NON_GROUP_MEMBER)",
            )),
        }
    }
    /// PyTorch's integer view of the sentinel: −100 for non-members, `None` for real groups.
    pub fn sentinel_value(&self) -> Option<i64> {
        self.is_non_member().then_some(NON_GROUP_MEMBER_VALUE)
    }
}

impl From<ProcessGroup> for GroupMember {
    fn from(pg: ProcessGroup) -> Self {
        GroupMember::Group(pg)
    }
}

impl From<&ProcessGroup> for GroupMember {
    fn from(pg: &ProcessGroup) -> Self {
        GroupMember::Group(pg.clone())
    }
}

impl PartialEq for GroupMember {
    /// Same group object (pointer equality), or both the sentinel.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (GroupMember::Group(a), GroupMember::Group(b)) => a.ptr_eq(b),
            (GroupMember::NonGroupMember, GroupMember::NonGroupMember) => true,
            _ => false,
        }
    }
}

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

/// Arguments of [`World::init_process_group`] (`torch.distributed.init_process_group`).
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

/// Arguments of [`World::new_group`] besides the ranks (`torch.distributed.new_group`).
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

/// Arguments of [`World::split_group`] besides parent and ranks.
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
    pub(crate) coalescing: Option<crate::collectives::CoalescingState>,
}

impl State {
    pub(crate) fn entry(&self, pg: &ProcessGroup) -> Option<&GroupEntry> {
        self.groups.iter().find(|e| e.pg.ptr_eq(pg))
    }
    fn entry_mut(&mut self, pg: &ProcessGroup) -> Option<&mut GroupEntry> {
        self.groups.iter_mut().find(|e| e.pg.ptr_eq(pg))
    }
    /// The default group's entry; "Default process group has not been initialized" without one.
    fn default_entry(&self) -> Result<&GroupEntry> {
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

    /// The backend used for DETAIL mode's helper group (default "gloo", as PyTorch's
    /// `ProcessGroupWrapper`); tests may point it at another registered CPU backend.
    pub fn set_detail_helper_backend(&self, name: &str) {
        self.settings().detail_helper_backend = Some(name.to_ascii_lowercase());
    }

    // ------------------------------------------------------------------ init

    /// `torch.distributed.init_process_group`: creates the default group ("0", desc
    /// "default_pg"). A store made from `init_method` is wrapped in `PrefixStore("default_pg", ..)`;
    /// a store passed in `store` is used as given (PyTorch's rule).
    ///
    /// Rules: `store` and `init_method` are exclusive; with a store, `world_size` and `rank` are
    /// required; neither → `env://`. The timeout defaults to 30 min (10 min for NCCL) and is also
    /// set on a store made by rendezvous. With `TORCH_DIST_INIT_BARRIER=1` a store-based barrier
    /// follows. Installs a panic hook that prefixes panic messages with `[rank{N}]:`.
    ///
    /// # Errors
    /// - [`DistError::InvalidArgument`] "trying to initialize the default process group twice!",
    ///   "Cannot specify both init_method and store.", "world_size must be positive if using
    ///   store", "rank must be non-negative if using store", backend-string errors;
    /// - rendezvous errors (bad URL, missing env vars, store timeouts);
    /// - backend creation errors (e.g. nccl unavailable);
    /// - [`DistError::Store`] "Timed out initializing process group in store based barrier ..."
    pub fn init_process_group(&self, opts: InitOptions) -> Result<()> {
        if self.lock().default_pg.is_some() {
            return Err(DistError::invalid(
                "trying to initialize the default process group twice!",
            ));
        }
        if opts.store.is_some() && opts.init_method.is_some() {
            return Err(DistError::invalid(
                "Cannot specify both init_method and store.",
            ));
        }
        let backend = match (&opts.backend, opts.device_id) {
            (Some(b), _) => config::normalize_backend_name(b),
            (None, Some(d)) => config::get_default_backend_for_device(d.device_type().as_str())?,
            (None, None) => "undefined".to_string(),
        };
        let backend_config = BackendConfig::parse(&backend)?;
        let timeout = opts
            .timeout
            .unwrap_or_else(|| config::default_timeout_for(&backend));
        warn_ignored_pg_timeout(&opts.pg_options);
        let (store, rank, world_size, init_method, hint) = match opts.store.clone() {
            Some(store) => {
                let ws = opts.world_size.filter(|w| *w > 0).ok_or_else(|| {
                    DistError::invalid("world_size must be positive if using store")
                })?;
                let rank = opts.rank.ok_or_else(|| {
                    DistError::invalid("rank must be non-negative if using store")
                })?;
                (store, rank, ws, None, std::env::var("MASTER_ADDR").ok())
            }
            None => {
                let url = opts
                    .init_method
                    .clone()
                    .unwrap_or_else(|| "env://".to_string());
                let env = |k: &str| match &opts.env {
                    Some(f) => f(k),
                    None => std::env::var(k).ok(),
                };
                let rdv = c10d_store::rendezvous::rendezvous_with_env(
                    &url,
                    opts.rank,
                    opts.world_size,
                    timeout,
                    &env,
                )?;
                rdv.store.set_timeout(timeout);
                let hint = hostname_hint(&url, &env);
                // Only a store made by rendezvous is wrapped, as in PyTorch: a user's store is
                // used as given.
                let store: Arc<dyn Store> = Arc::new(PrefixStore::new("default_pg", rdv.store));
                (store, rdv.rank, rdv.world_size, Some(url), hint)
            }
        };
        if rank >= world_size {
            return Err(DistError::invalid(format!(
                "Invalid rank {rank} for world_size {world_size}: rank must be in [0, world_size)"
            )));
        }
        let (group_name, count_before) = {
            let mut st = self.lock();
            st.hostname_hint = hint;
            let before = st.group_count;
            (process_group_name(&mut st, &[], false), before)
        };
        let member = self.new_process_group_helper(NewPg {
            group_size: world_size,
            group_rank: Some(rank),
            global_ranks: Vec::new(),
            backend: backend.clone(),
            config: backend_config,
            store: store.clone(),
            group_name: group_name.clone(),
            pg_options: opts.pg_options.clone(),
            timeout,
            pg_tag: None,
            device_id: opts.device_id,
            group_desc: "default_pg".to_string(),
        });
        let member = match member {
            Ok(m) => m,
            Err(e) => {
                // Departure from PyTorch: a failed init does not consume a group name, so a retry
                // names WORLD "0" again.
                self.lock().group_count = count_before;
                return Err(e);
            }
        };
        let pg = member.0.into_group().map_err(|_| {
            DistError::invalid("Default process group creation returned a nonmember")
        })?;
        {
            let mut st = self.lock();
            st.default_pg = Some(pg.clone());
            st.init_method = init_method;
            if let Some(e) = st.entry_mut(&pg) {
                e.ranks = (0..world_size).collect();
            }
        }
        crate::panic_hook::install(rank);
        if self.init_barrier() {
            store_based_barrier(rank, store.as_ref(), &group_name, world_size, timeout)?;
        }
        Ok(())
    }

    // ------------------------------------------------------------------ groups

    /// `torch.distributed.new_group(ranks, ...)`: every rank of the world calls it (unless
    /// `use_local_synchronization`), in the same order. `ranks = None` means all ranks.
    ///
    /// Returns the group on members and [`GroupMember::NonGroupMember`] elsewhere. Names are
    /// `str(counter)` ("1", "2", ...) or, with local synchronization, the SHA-1 of
    /// `"<ranks joined by _>_<counter>"`. The counter advances on every rank that reaches naming.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`]: not initialized; "ranks list must not contain duplicate
    /// entries, got [..]"; "the new group's world size should be less or equal to the world size
    /// set by init_process_group"; "Rank {r} is out of range. Valid ranks are 0 to {W-1}
    /// (world_size={W})"; "Mismatched bound device between new pg and the default pg."; "The
    /// specified group name has already been created, please use a different group name"; backend
    /// string and creation errors; the store-based barrier's timeout when enabled.
    pub fn new_group(&self, ranks: Option<&[usize]>, opts: GroupOptions) -> Result<GroupMember> {
        let ranks: Option<Vec<i64>> = ranks.map(|r| r.iter().map(|&x| x as i64).collect());
        self.new_group_with_tag(ranks.as_deref(), opts, None)
    }

    /// `_new_group_with_tag(ranks, pg_tag=tag, ...)`: as [`World::new_group`], registered under tag
    /// `"user:<tag>"`; the same tag and ranks give back the same group object (the counter still
    /// advances). Ranks are `i64` so that negative ranks give PyTorch's range error.
    ///
    /// # Errors
    /// As [`World::new_group`].
    pub fn new_group_with_tag(
        &self,
        ranks: Option<&[i64]>,
        opts: GroupOptions,
        pg_tag: Option<&str>,
    ) -> Result<GroupMember> {
        let (default_pg, default_backend, default_store) = {
            let st = self.lock();
            let e = st.default_entry()?;
            (e.pg.clone(), e.backend_name.clone(), e.store.clone())
        };
        let device_id = match (opts.device_id, default_pg.bound_device_id()) {
            (None, d) => d,
            (Some(d), Some(b)) if d != b => {
                return Err(DistError::invalid(
                    "Mismatched bound device between new pg and the default pg.",
                ))
            }
            (Some(d), _) => Some(d),
        };
        let global_rank = default_pg.rank();
        let world_size = default_pg.size();
        let backend = opts
            .backend
            .as_deref()
            .map(config::normalize_backend_name)
            .unwrap_or(default_backend);
        let backend_config = BackendConfig::parse(&backend)?;
        let timeout = opts
            .timeout
            .unwrap_or_else(|| config::default_timeout_for(&backend));
        warn_ignored_pg_timeout(&opts.pg_options);
        if opts.use_local_synchronization {
            if let Some(r) = ranks {
                if !r.contains(&(global_rank as i64)) {
                    return Ok(GroupMember::NonGroupMember);
                }
            }
        }
        let (ranks, group_rank) = match ranks {
            Some(r) => {
                let mut r = r.to_vec();
                if opts.sort_ranks {
                    r.sort_unstable();
                }
                let mut seen = r.clone();
                seen.sort_unstable();
                seen.dedup();
                if seen.len() != r.len() {
                    return Err(DistError::invalid(format!(
                        "ranks list must not contain duplicate entries, got {r:?}"
                    )));
                }
                if r.len() > world_size {
                    return Err(DistError::invalid(
                        "the new group's world size should be less or equal to the world size set by init_process_group",
                    ));
                }
                for &x in &r {
                    if x < 0 || x as usize >= world_size {
                        return Err(DistError::invalid(format!(
                            "Rank {x} is out of range. Valid ranks are 0 to {} (world_size={world_size})",
                            world_size as i64 - 1
                        )));
                    }
                }
                let r: Vec<usize> = r.into_iter().map(|x| x as usize).collect();
                let gr = r.iter().position(|&x| x == global_rank);
                (r, gr)
            }
            None => ((0..world_size).collect::<Vec<_>>(), Some(global_rank)),
        };
        let group_name = {
            let mut st = self.lock();
            let generated = process_group_name(&mut st, &ranks, opts.use_local_synchronization);
            opts.group_name.clone().unwrap_or(generated)
        };
        let (member, pg_store) = self.new_process_group_helper(NewPg {
            group_size: ranks.len(),
            group_rank,
            global_ranks: ranks.clone(),
            backend: backend.clone(),
            config: backend_config,
            store: default_store.clone(),
            group_name: group_name.clone(),
            pg_options: opts.pg_options.clone(),
            timeout,
            pg_tag: pg_tag.map(str::to_string),
            device_id,
            group_desc: opts
                .group_desc
                .clone()
                .unwrap_or_else(|| "undefined".into()),
        })?;
        if self.init_barrier() {
            let (store, n) = if opts.use_local_synchronization {
                (pg_store.unwrap_or(default_store), ranks.len())
            } else {
                (default_store, world_size)
            };
            store_based_barrier(global_rank, store.as_ref(), &group_name, n, timeout)?;
        }
        Ok(member)
    }

    /// `new_subgroups(group_size, group, ...)`: splits `group` (default WORLD) into consecutive
    /// subgroups of `group_size` ranks; returns (this rank's subgroup, all subgroups).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`]: `None` size ("Default group size only takes effect when
    /// CUDA/XPU is available. ..." on this CPU-only build); "The arg 'group_size' (0) must be
    /// positive"; "The arg 'group_size' ({n}) must not exceed the world size ({W})"; "The world
    /// size ({W}) must be divisible by 'group_size={n}'"; as [`World::new_group`].
    pub fn new_subgroups(
        &self,
        group_size: Option<usize>,
        group: Option<&ProcessGroup>,
        opts: GroupOptions,
    ) -> Result<(ProcessGroup, Vec<GroupMember>)> {
        let group_size = group_size.ok_or_else(|| {
            DistError::invalid(
                "Default group size only takes effect when CUDA/XPU is available.If your subgroup using a backend that does not depend on CUDA/XPU,please pass in 'group_size' correctly.",
            )
        })?;
        if group_size == 0 {
            return Err(DistError::invalid(format!(
                "The arg 'group_size' ({group_size}) must be positive"
            )));
        }
        let ranks = self.get_process_group_ranks(group)?;
        let world_size = ranks.len();
        if world_size < group_size {
            return Err(DistError::invalid(format!(
                "The arg 'group_size' ({group_size}) must not exceed the world size ({world_size})"
            )));
        }
        if world_size % group_size != 0 {
            return Err(DistError::invalid(format!(
                "The world size ({world_size}) must be divisible by 'group_size={group_size}'"
            )));
        }
        let lists: Vec<Vec<i64>> = ranks
            .chunks(group_size)
            .map(|c| c.iter().map(|&x| x as i64).collect())
            .collect();
        let (mine, all) = self.new_subgroups_by_enumeration(&lists, opts)?;
        let mine = mine
            .and_then(|m| m.group().cloned())
            .ok_or_else(|| DistError::invalid("Current rank was not assigned to a subgroup"))?;
        Ok((mine, all))
    }

    /// `new_subgroups_by_enumeration(ranks_per_subgroup_list, ...)`: one `new_group` per list;
    /// returns (this rank's subgroup or `None` when in none, all subgroups).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`]: "The arg 'ranks_per_subgroup_list' cannot be empty"; "Rank
    /// {r} has appeared in both subgroup [..] and [..]"; "Rank -1 is out of range ..." and the other
    /// [`World::new_group`] errors.
    pub fn new_subgroups_by_enumeration(
        &self,
        ranks_per_subgroup_list: &[Vec<i64>],
        opts: GroupOptions,
    ) -> Result<(Option<GroupMember>, Vec<GroupMember>)> {
        if ranks_per_subgroup_list.is_empty() {
            return Err(DistError::invalid(
                "The arg 'ranks_per_subgroup_list' cannot be empty",
            ));
        }
        let my_rank = self.rank()? as i64;
        let mut seen: HashMap<i64, Vec<i64>> = HashMap::new();
        let mut cur = None;
        let mut all = Vec::new();
        for ranks in ranks_per_subgroup_list {
            let g = self.new_group_with_tag(
                Some(ranks),
                GroupOptions {
                    use_local_synchronization: false,
                    ..opts.clone()
                },
                None,
            )?;
            all.push(g.clone());
            for &r in ranks {
                if let Some(prev) = seen.get(&r) {
                    return Err(DistError::invalid(format!(
                        "Rank {r} has appeared in both subgroup {prev:?} and {ranks:?}"
                    )));
                }
                seen.insert(r, ranks.clone());
                if r == my_rank {
                    cur = Some(g.clone());
                }
            }
        }
        Ok((cur, all))
    }

    /// `split_group(parent_pg, split_ranks, ...)`: every rank of `parent` (default WORLD) calls it
    /// with the same lists of *parent group ranks*; inner order is kept (position = new group
    /// rank). Ranks in no list get [`GroupMember::NonGroupMember`]. Names are hashed like local
    /// synchronization (`sha1("<ranks>_<counter>")`, the first list's ranks on non-members). When
    /// the parent's backend supports splitting the child comes from [`Backend::split`]; otherwise
    /// members create a fresh backend over `PrefixStore("<name>/", default store)`.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`]: "split_ranks cannot be None or empty", "Group .. is not
    /// registered", "Global rank {r} is not part of the parent group ..", "the split group cannot
    /// be empty", "the split group's size should be less or equal to the world_size set by
    /// init_process_group", "the split group cannot have duplicate ranks", "Requested backend
    /// '..' is not present in the parent process group ..", "Backend mismatch for device ..".
    pub fn split_group(
        &self,
        parent: Option<&ProcessGroup>,
        split_ranks: &[Vec<usize>],
        opts: SplitOptions,
    ) -> Result<GroupMember> {
        if split_ranks.is_empty() {
            return Err(DistError::invalid("split_ranks cannot be None or empty"));
        }
        let (default_pg, default_store, parent, parent_entry) = {
            let st = self.lock();
            let de = st.default_entry()?;
            let (d, ds) = (de.pg.clone(), de.store.clone());
            let parent = parent.cloned().unwrap_or_else(|| d.clone());
            let pe = st
                .entry(&parent)
                .cloned()
                .ok_or_else(|| DistError::invalid(format!("Group {parent:?} is not registered")))?;
            (d, ds, parent, pe)
        };
        let global_rank = default_pg.rank();
        let world_size = default_pg.size();
        let parent_group_rank = parent_entry
            .ranks
            .iter()
            .position(|&r| r == global_rank)
            .ok_or_else(|| {
                DistError::invalid(format!(
                    "Global rank {global_rank} is not part of the parent group {parent:?}"
                ))
            })?;
        let mut backend_str = parent_entry.backend_name.clone();
        let mut backend_config = parent_entry.config.clone();
        if let Some(req) = &opts.backend {
            let parent_devices: Vec<String> = parent
                .backends()
                .iter()
                .map(|(d, _)| d.as_str().to_string())
                .collect();
            let parent_map: Vec<(String, String)> = parent_entry
                .config
                .device_backend_map
                .iter()
                .filter(|(d, _)| parent_devices.contains(d))
                .cloned()
                .collect();
            let req_lower = req.to_ascii_lowercase();
            let requested: Vec<(String, String)> = if req_lower.contains(':') {
                BackendConfig::parse(&req_lower)?.device_backend_map
            } else {
                let r: Vec<(String, String)> = parent_map
                    .iter()
                    .filter(|(_, b)| *b == req_lower)
                    .cloned()
                    .collect();
                if r.is_empty() {
                    return Err(DistError::invalid(format!(
                        "Requested backend '{req_lower}' is not present in the parent process group (parent backends: {parent_map:?})"
                    )));
                }
                r
            };
            for (dev, be) in &requested {
                match parent_map.iter().find(|(d, _)| d == dev) {
                    None => {
                        return Err(DistError::invalid(format!(
                            "Requested backend for device '{dev}' is not present in the parent process group (parent backends: {parent_map:?})"
                        )))
                    }
                    Some((_, pb)) if pb != be => {
                        return Err(DistError::invalid(format!(
                            "Backend mismatch for device '{dev}': parent has '{pb}', requested '{be}'. Backend names must match exactly when filtering split_group backends."
                        )))
                    }
                    _ => {}
                }
            }
            backend_str = req_lower;
            backend_config = BackendConfig {
                device_backend_map: requested,
            };
        }
        let timeout = opts
            .timeout
            .unwrap_or_else(|| config::default_timeout_for(&backend_str));
        let mut my_group = &split_ranks[0];
        for g in split_ranks {
            if g.is_empty() {
                return Err(DistError::invalid("the split group cannot be empty"));
            }
            if g.len() > world_size {
                return Err(DistError::invalid(
                    "the split group's size should be less or equal to the world_size set by init_process_group",
                ));
            }
            let mut s = g.clone();
            s.sort_unstable();
            s.dedup();
            if s.len() != g.len() {
                return Err(DistError::invalid(
                    "the split group cannot have duplicate ranks",
                ));
            }
            if g.contains(&parent_group_rank) {
                my_group = g;
                break;
            }
        }
        for &r in my_group {
            if r >= parent_entry.ranks.len() {
                return Err(DistError::invalid(format!(
                    "split_group: rank {r} is not a rank of the parent group (size {})",
                    parent_entry.ranks.len()
                )));
            }
        }
        let (group_name, group_desc) = {
            let mut st = self.lock();
            let name = process_group_name(&mut st, my_group, true);
            let desc = match &opts.group_desc {
                Some(d) => d.clone(),
                None => {
                    let e = st.entry_mut(&parent);
                    let n = e.map(|e| {
                        let n = e.split_count;
                        e.split_count += 1;
                        n
                    });
                    format!("{}:split:{}", parent.group_desc(), n.unwrap_or(0))
                }
            };
            (name, desc)
        };
        let is_member = my_group.contains(&parent_group_rank);
        let global_ranks: Vec<usize> = my_group.iter().map(|&r| parent_entry.ranks[r]).collect();
        let parent_backend = parent.default_backend()?;
        if parent_backend.supports_splitting() {
            let bopts = BackendOptions {
                backend: backend_str.clone(),
                timeout,
                group_name: group_name.clone(),
                group_desc: group_desc.clone(),
                global_ranks: global_ranks.clone(),
            };
            let child = parent_backend.split(my_group, &bopts)?;
            let Some(child) = child else {
                return Ok(GroupMember::NonGroupMember);
            };
            if !is_member {
                return Ok(GroupMember::NonGroupMember);
            }
            let store: Arc<dyn Store> =
                Arc::new(PrefixStore::new(&format!("{group_name}/"), default_store));
            let child = if self.get_debug_level()? == DebugLevel::Detail {
                let args = BackendCreateArgs {
                    store: Arc::new(PrefixStore::new(
                        &format!("{}/", child.device_type()),
                        store.clone(),
                    )),
                    group_rank: child.rank(),
                    group_size: child.size(),
                    timeout,
                    device: child.device_type().as_str().to_string(),
                    group_name: group_name.clone(),
                    group_desc: group_desc.clone(),
                    global_ranks_in_group: global_ranks.clone(),
                    pg_options: None,
                    hostname_hint: self.lock().hostname_hint.clone(),
                };
                self.wrap_detail(child, &args)?
            } else {
                child
            };
            let pg = ProcessGroup::new(
                child.rank(),
                child.size(),
                group_name.clone(),
                group_desc,
                parent.bound_device_id(),
            )?;
            pg.set_backend(child.device_type(), child.clone(), true);
            for (d, _) in &backend_config.device_backend_map {
                if let Ok(dt) = DeviceType::parse(d) {
                    if dt != child.device_type() {
                        pg.set_backend(dt, child.clone(), false);
                    }
                }
            }
            self.register_pg(
                GroupEntry {
                    pg: pg.clone(),
                    backend_name: backend_str,
                    store,
                    config: backend_config,
                    ranks: global_ranks,
                    tag: String::new(),
                    split_count: 0,
                },
                None,
            )?;
            return Ok(GroupMember::Group(pg));
        }
        if !is_member {
            return Ok(GroupMember::NonGroupMember);
        }
        let group_rank = my_group.iter().position(|&r| r == parent_group_rank);
        let (member, _) = self.new_process_group_helper(NewPg {
            group_size: my_group.len(),
            group_rank,
            global_ranks,
            backend: backend_str,
            config: backend_config,
            store: default_store,
            group_name,
            pg_options: opts.pg_options,
            timeout,
            pg_tag: None,
            device_id: parent.bound_device_id(),
            group_desc,
        })?;
        Ok(member)
    }

    // ------------------------------------------------------------------ creation helper

    pub(crate) fn new_process_group_helper(
        &self,
        a: NewPg,
    ) -> Result<(GroupMember, Option<Arc<dyn Store>>)> {
        {
            let st = self.lock();
            if st.groups.iter().any(|e| e.pg.group_name() == a.group_name) {
                return Err(DistError::invalid(
                    "The specified group name has already been created, please use a different group name",
                ));
            }
            if let Some(tag) = a.pg_tag.as_deref().filter(|t| !t.is_empty()) {
                if let Some(pg) = find_pg_by_ranks_and_tag(&st, tag, &a.global_ranks) {
                    let store = st.entry(&pg).map(|e| e.store.clone());
                    return Ok((GroupMember::Group(pg), store));
                }
            }
        }
        let is_default = a.global_ranks.is_empty();
        if !is_default && a.group_rank.is_none() {
            return Ok((GroupMember::NonGroupMember, None));
        }
        let group_rank = a
            .group_rank
            .ok_or_else(|| DistError::invalid("Group rank must be specified for group members"))?;
        let prefix_store: Arc<dyn Store> = Arc::new(PrefixStore::new(
            &format!("{}/", a.group_name),
            a.store.clone(),
        ));
        let pg = ProcessGroup::new(
            group_rank,
            a.group_size,
            a.group_name.clone(),
            a.group_desc.clone(),
            a.device_id,
        )?;
        let map = &a.config.device_backend_map;
        let distinct = a.config.backend_names();
        let mixed = distinct.len() > 1;
        let debug = self.get_debug_level()?;
        let hint = self.lock().hostname_hint.clone();
        let mut created: Vec<(String, Arc<dyn Backend>)> = Vec::new();
        for (device, bname) in map {
            let dt = DeviceType::parse(device)?;
            let backend = match created.iter().find(|(n, _)| n == bname) {
                Some((_, b)) if !mixed => b.clone(),
                _ => {
                    let (creator, extended) = config::creator_for(bname)?;
                    let store: Arc<dyn Store> = Arc::new(PrefixStore::new(
                        &format!("{device}/"),
                        prefix_store.clone(),
                    ));
                    let args = BackendCreateArgs {
                        store: store.clone(),
                        group_rank,
                        group_size: a.group_size,
                        timeout: a.timeout,
                        device: device.clone(),
                        group_name: if extended {
                            a.group_name.clone()
                        } else {
                            String::new()
                        },
                        group_desc: if extended {
                            a.group_desc.clone()
                        } else {
                            String::new()
                        },
                        global_ranks_in_group: if extended {
                            a.global_ranks.clone()
                        } else {
                            Vec::new()
                        },
                        pg_options: if extended {
                            a.pg_options
                                .as_ref()
                                .and_then(|o| o.backend_specific.clone())
                        } else {
                            None
                        },
                        hostname_hint: hint.clone(),
                    };
                    let Some(mut b) = creator(&args)? else {
                        return Ok((GroupMember::NonGroupMember, None));
                    };
                    if debug == DebugLevel::Detail {
                        b = self.wrap_detail(b, &args)?;
                    }
                    created.push((bname.clone(), b.clone()));
                    b
                }
            };
            pg.set_backend(dt, backend, false);
        }
        // Default device: the accelerator's for mixed configs, else the first device listed.
        let default_dt = if mixed && map.iter().any(|(d, _)| d == "cuda") {
            DeviceType::Cuda
        } else {
            map.first()
                .map(|(d, _)| DeviceType::parse(d))
                .transpose()?
                .unwrap_or(DeviceType::Cpu)
        };
        if let Ok(b) = pg.backend(default_dt) {
            pg.set_backend(default_dt, b, true);
        }
        let tag = match a.pg_tag.as_deref() {
            None | Some("") => None,
            Some(t) => Some(format!("user:{t}")),
        };
        let ranks = if is_default {
            (0..a.group_size).collect()
        } else {
            a.global_ranks.clone()
        };
        self.register_pg(
            GroupEntry {
                pg: pg.clone(),
                backend_name: a.backend.clone(),
                store: prefix_store.clone(),
                config: a.config.clone(),
                ranks,
                tag: String::new(),
                split_count: 0,
            },
            tag,
        )?;
        Ok((GroupMember::Group(pg), Some(prefix_store)))
    }

    fn wrap_detail(
        &self,
        b: Arc<dyn Backend>,
        args: &BackendCreateArgs,
    ) -> Result<Arc<dyn Backend>> {
        let helper_name = self
            .settings()
            .detail_helper_backend
            .clone()
            .unwrap_or_else(|| "gloo".to_string());
        if !config::is_backend_available(&helper_name) {
            return Err(DistError::invalid(
                "ProcessGroupWrapper unsupported without GLOO backend.",
            ));
        }
        let (creator, _) = config::creator_for(&helper_name)?;
        let mut hargs = args.clone();
        // PyTorch: PrefixStore(f"pg_wrapper:{group_name}", backend store) for the helper group.
        let prefix = format!("pg_wrapper:{}", args.group_name);
        hargs.store = Arc::new(PrefixStore::new(&prefix, args.store.clone()));
        hargs.group_name = prefix;
        hargs.device = "cpu".into();
        let helper = creator(&hargs)?.ok_or_else(|| {
            DistError::invalid("ProcessGroupWrapper: helper backend creation returned no backend")
        })?;
        Ok(Arc::new(DetailWrapper::new(b, helper)))
    }

    /// Registers a group in the maps (`_register_pg_in_world`): tag `pg_tag` when given, else
    /// "ptd:<name>" plus "" ; and the name registry.
    fn register_pg(&self, mut e: GroupEntry, pg_tag: Option<String>) -> Result<()> {
        let mut st = self.lock();
        let name = e.pg.group_name().to_string();
        if st.groups.iter().any(|x| x.pg.group_name() == name) {
            return Err(DistError::invalid(
                "The specified group name has already been created, please use a different group name",
            ));
        }
        match pg_tag {
            Some(t) => {
                e.tag = t.clone();
                st.tags_to_pg.entry(t).or_default().push(e.pg.clone());
            }
            None => {
                let t = format!("ptd:{name}");
                e.tag = t.clone();
                st.tags_to_pg.entry(t).or_default().push(e.pg.clone());
                st.tags_to_pg
                    .entry(String::new())
                    .or_default()
                    .push(e.pg.clone());
            }
        }
        st.registry.insert(name, e.pg.clone());
        st.groups.push(e);
        Ok(())
    }

    // ------------------------------------------------------------------ queries

    /// `is_initialized()`: true once the default group exists.
    pub fn is_initialized(&self) -> bool {
        self.lock().default_pg.is_some()
    }

    /// The default group (`_get_default_group` / `GroupMember.WORLD`).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Default process group has not been initialized, ...".
    pub fn world_group(&self) -> Result<ProcessGroup> {
        self.lock()
            .default_pg
            .clone()
            .ok_or_else(|| DistError::invalid(NOT_INITIALIZED))
    }

    /// The default group's store (`_get_default_store`): `PrefixStore("0/", store)` where `store`
    /// is the user's store or `PrefixStore("default_pg", rendezvous store)`.
    ///
    /// # Errors
    /// Not initialized.
    pub fn default_store(&self) -> Result<Arc<dyn Store>> {
        Ok(self.lock().default_entry()?.store.clone())
    }

    /// The store recorded for a group (`_world.pg_map[pg][1]`).
    ///
    /// # Errors
    /// "Invalid process group specified" for unknown groups.
    pub fn group_store(&self, group: &ProcessGroup) -> Result<Arc<dyn Store>> {
        self.lock()
            .entry(group)
            .map(|e| e.store.clone())
            .ok_or_else(|| DistError::invalid("Invalid process group specified"))
    }

    /// Resolves an optional group argument to a group (None → WORLD).
    pub(crate) fn group_or_default(&self, group: Option<&ProcessGroup>) -> Result<ProcessGroup> {
        match group {
            Some(g) => Ok(g.clone()),
            None => self.world_group(),
        }
    }

    /// `get_rank(group)`: this process's rank in `group` (WORLD when `None`); −1 on a non-member.
    ///
    /// # Errors
    /// Not initialized; an unregistered group.
    pub fn get_rank(&self, group: Option<&GroupMember>) -> Result<i64> {
        let world = self.world_group()?;
        match group {
            Some(GroupMember::NonGroupMember) => Ok(-1),
            None => Ok(world.rank() as i64),
            Some(GroupMember::Group(g)) => Ok(self.get_group_rank(g, world.rank())? as i64),
        }
    }

    /// `get_world_size(group)`: the size of `group` (WORLD when `None`); −1 on a non-member.
    ///
    /// # Errors
    /// Not initialized.
    pub fn get_world_size(&self, group: Option<&GroupMember>) -> Result<i64> {
        let world = self.world_group()?;
        match group {
            Some(GroupMember::NonGroupMember) => Ok(-1),
            None => Ok(world.size() as i64),
            Some(GroupMember::Group(g)) => Ok(g.size() as i64),
        }
    }

    /// This process's global rank (`get_rank()` as `usize`).
    ///
    /// # Errors
    /// Not initialized.
    pub fn rank(&self) -> Result<usize> {
        Ok(self.world_group()?.rank())
    }

    /// The world size (`get_world_size()` as `usize`).
    ///
    /// # Errors
    /// Not initialized.
    pub fn world_size(&self) -> Result<usize> {
        Ok(self.world_group()?.size())
    }

    /// `get_group_rank(group, global_rank)`: identity on WORLD.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Group .. is not registered, please create group with
    /// torch.distributed.new_group API"; "Global rank {r} is not part of group ..".
    pub fn get_group_rank(&self, group: &ProcessGroup, global_rank: usize) -> Result<usize> {
        let st = self.lock();
        if st.is_world(group) {
            return Ok(global_rank);
        }
        let e = st.entry(group).ok_or_else(|| not_registered(group))?;
        e.ranks
            .iter()
            .position(|&r| r == global_rank)
            .ok_or_else(|| {
                DistError::invalid(format!(
                    "Global rank {global_rank} is not part of group {group:?}"
                ))
            })
    }

    /// `get_global_rank(group, group_rank)`: identity on WORLD.
    ///
    /// # Errors
    /// "Group .. is not registered ..."; "Group rank {r} is not part of group ..".
    pub fn get_global_rank(&self, group: &ProcessGroup, group_rank: usize) -> Result<usize> {
        let st = self.lock();
        if st.is_world(group) {
            return Ok(group_rank);
        }
        let e = st.entry(group).ok_or_else(|| not_registered(group))?;
        e.ranks.get(group_rank).copied().ok_or_else(|| {
            DistError::invalid(format!(
                "Group rank {group_rank} is not part of group {group:?}"
            ))
        })
    }

    /// `get_process_group_ranks(group)`: global ranks in group-rank order (WORLD when `None`).
    ///
    /// # Errors
    /// Not initialized; an unregistered group.
    pub fn get_process_group_ranks(&self, group: Option<&ProcessGroup>) -> Result<Vec<usize>> {
        let g = self.group_or_default(group)?;
        let st = self.lock();
        st.entry(&g)
            .map(|e| e.ranks.clone())
            .ok_or_else(|| not_registered(&g))
    }

    /// `get_pg_count()`: number of live groups, WORLD included.
    pub fn get_pg_count(&self) -> usize {
        self.lock().groups.len()
    }

    /// `_get_sequence_number_for_group(group)`: collectives (and, on the caller, p2p ops) issued
    /// on the group's default backend so far (WORLD when `None`).
    ///
    /// # Errors
    /// Not initialized.
    pub fn get_sequence_number_for_group(&self, group: Option<&ProcessGroup>) -> Result<u64> {
        Ok(self.group_or_default(group)?.sequence_number())
    }

    /// The group counter used for names (`_world.group_count`).
    pub fn group_count(&self) -> usize {
        self.lock().group_count
    }

    /// `get_backend(group)`: the backend string the group was created with (e.g. "gloo").
    ///
    /// # Errors
    /// Not initialized; "Invalid process group specified"; −1 groups: "Invalid process group specified".
    pub fn get_backend(&self, group: Option<&GroupMember>) -> Result<String> {
        self.with_group_entry(group, |e| e.backend_name.clone())
    }

    /// `get_backend_config(group)`: "cpu:gloo,cuda:gloo" style string.
    ///
    /// # Errors
    /// As [`World::get_backend`].
    pub fn get_backend_config(&self, group: Option<&GroupMember>) -> Result<String> {
        self.with_group_entry(group, |e| e.config.to_string())
    }

    /// `f` on the registry entry of `group` (None = WORLD); "Invalid process group specified"
    /// for a non-member or an unregistered group.
    fn with_group_entry<R>(
        &self,
        group: Option<&GroupMember>,
        f: impl FnOnce(&GroupEntry) -> R,
    ) -> Result<R> {
        let g = match group {
            Some(GroupMember::NonGroupMember) => {
                return Err(DistError::invalid("Invalid process group specified"))
            }
            Some(GroupMember::Group(g)) => g.clone(),
            None => self.world_group()?,
        };
        self.lock()
            .entry(&g)
            .map(f)
            .ok_or_else(|| DistError::invalid("Invalid process group specified"))
    }

    /// `_get_group_tag(pg)`: the tag with "user:" stripped.
    ///
    /// # Errors
    /// "Invalid process group specified".
    pub fn get_group_tag(&self, group: &ProcessGroup) -> Result<String> {
        let st = self.lock();
        let e = st
            .entry(group)
            .ok_or_else(|| DistError::invalid("Invalid process group specified"))?;
        Ok(e.tag.strip_prefix("user:").unwrap_or(&e.tag).to_string())
    }

    /// `_find_pg_by_ranks_and_tag(tag, ranks)`: a group of this tag whose members are `ranks`.
    pub fn find_pg_by_ranks_and_tag(&self, tag: &str, ranks: &[usize]) -> Option<ProcessGroup> {
        find_pg_by_ranks_and_tag(&self.lock(), tag, ranks)
    }

    /// `_find_or_create_pg_by_ranks_and_tag(tag, ranks, stride)`: picks this rank's `stride`-sized
    /// slice of `ranks`, finds it by tag or creates it with [`World::new_group_with_tag`].
    ///
    /// # Errors
    /// "Ranks length ({n}) must be divisible by stride ({s})"; "rankset doesn't include the current
    /// node"; "Cannot automatically create PG with empty tag"; creation errors.
    pub fn find_or_create_pg_by_ranks_and_tag(
        &self,
        tag: &str,
        ranks: &[usize],
        stride: usize,
    ) -> Result<ProcessGroup> {
        if stride == 0 || ranks.len() % stride != 0 {
            return Err(DistError::invalid(format!(
                "Ranks length ({}) must be divisible by stride ({stride})",
                ranks.len()
            )));
        }
        let me = self.rank()?;
        let mut mine = ranks
            .chunks(stride)
            .find(|c| c.contains(&me))
            .map(|c| c.to_vec())
            .ok_or_else(|| DistError::invalid("rankset doesn't include the current node"))?;
        mine.sort_unstable();
        if let Some(pg) = self.find_pg_by_ranks_and_tag(tag, &mine) {
            return Ok(pg);
        }
        if tag.is_empty() {
            return Err(DistError::invalid(
                "Cannot automatically create PG with empty tag",
            ));
        }
        let r: Vec<i64> = mine.iter().map(|&x| x as i64).collect();
        self.new_group_with_tag(Some(&r), GroupOptions::default(), Some(tag))?
            .into_group()
            .map_err(|_| {
                DistError::invalid(format!(
                    "Rank {me} was not included in process group {mine:?}"
                ))
            })
    }

    /// The init method URL the default group was made with (`_default_pg_init_method`).
    pub fn init_method(&self) -> Option<String> {
        self.lock().init_method.clone()
    }

    // ------------------------------------------------------------------ name registry

    /// Registers `group` under `name` (`_register_process_group`), replacing any previous one.
    pub fn register_process_group(&self, name: &str, group: &ProcessGroup) {
        self.lock().registry.insert(name.to_string(), group.clone());
    }

    /// Looks a group up by name (`_resolve_process_group`). Every created group is registered
    /// under its group name.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Could not resolve the process group registered under the name {name}".
    pub fn resolve_process_group(&self, name: &str) -> Result<ProcessGroup> {
        self.lock().registry.get(name).cloned().ok_or_else(|| {
            DistError::invalid(format!(
                "Could not resolve the process group registered under the name {name}"
            ))
        })
    }

    /// Removes a name from the registry (`_unregister_process_group`); unknown names are ignored.
    pub fn unregister_process_group(&self, name: &str) {
        self.lock().registry.remove(name);
    }

    /// Clears the name registry (`_unregister_all_process_groups`).
    pub fn unregister_all_process_groups(&self) {
        self.lock().registry.clear();
    }

    // ------------------------------------------------------------------ teardown

    /// `destroy_process_group(group)`: `None` or WORLD shuts every group down (reverse name order),
    /// clears all maps and tags and resets the counter; another group is shut down and removed;
    /// the non-member sentinel is a no-op.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Invalid process group specified" for unknown or destroyed groups.
    pub fn destroy_process_group(&self, group: Option<&GroupMember>) -> Result<()> {
        self.teardown(group, false)
    }

    /// `_abort_process_group(group)`: as [`World::destroy_process_group`] but aborts backends
    /// (pending works fail) instead of shutting them down.
    ///
    /// # Errors
    /// "Invalid process group specified or has been destroyed."
    pub fn abort_process_group(&self, group: Option<&GroupMember>) -> Result<()> {
        self.teardown(group, true)
    }

    fn teardown(&self, group: Option<&GroupMember>, abort: bool) -> Result<()> {
        let err = || {
            DistError::invalid(if abort {
                "Invalid process group specified or has been destroyed."
            } else {
                "Invalid process group specified"
            })
        };
        let pg = match group {
            Some(GroupMember::NonGroupMember) => return Ok(()),
            Some(GroupMember::Group(g)) => g.clone(),
            None => self.lock().default_pg.clone().ok_or_else(err)?,
        };
        let mut st = self.lock();
        if st.entry(&pg).is_none() {
            return Err(err());
        }
        let all = group.is_none() || st.is_world(&pg);
        if all {
            let mut groups = std::mem::take(&mut st.groups);
            st.default_pg = None;
            st.tags_to_pg.clear();
            st.registry.clear();
            st.group_count = 0;
            st.coalescing = None;
            st.init_method = None;
            drop(st);
            groups.sort_by(|a, b| b.pg.group_name().cmp(a.pg.group_name()));
            for g in groups {
                stop_backends(&g.pg, abort);
            }
        } else {
            st.groups.retain(|e| !e.pg.ptr_eq(&pg));
            for v in st.tags_to_pg.values_mut() {
                v.retain(|g| !g.ptr_eq(&pg));
            }
            let name = pg.group_name().to_string();
            if st.registry.get(&name).is_some_and(|g| g.ptr_eq(&pg)) {
                st.registry.remove(&name);
            }
            drop(st);
            stop_backends(&pg, abort);
        }
        Ok(())
    }
}

/// Shuts down (or aborts) each distinct backend of `pg` once: a backend serving several device
/// types (gloo for cpu and cuda) is registered under each of them.
pub(crate) fn stop_backends(pg: &ProcessGroup, abort: bool) {
    let mut seen: Vec<*const ()> = Vec::new();
    for (_, b) in pg.backends() {
        let p = Arc::as_ptr(&b) as *const ();
        if seen.contains(&p) {
            continue;
        }
        seen.push(p);
        if abort {
            b.abort()
        } else {
            b.shutdown()
        }
    }
}

pub(crate) struct NewPg {
    pub(crate) group_size: usize,
    pub(crate) group_rank: Option<usize>,
    pub(crate) global_ranks: Vec<usize>,
    pub(crate) backend: String,
    pub(crate) config: BackendConfig,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) group_name: String,
    pub(crate) pg_options: Option<PgOptions>,
    pub(crate) timeout: Duration,
    pub(crate) pg_tag: Option<String>,
    pub(crate) device_id: Option<Device>,
    pub(crate) group_desc: String,
}

pub(crate) fn not_registered(g: &ProcessGroup) -> DistError {
    DistError::invalid(format!(
        "Group {g:?} is not registered, please create group with torch.distributed.new_group API"
    ))
}

fn warn_ignored_pg_timeout(o: &Option<PgOptions>) {
    if o.as_ref().is_some_and(|o| o.timeout.is_some()) {
        log::warn!("pg_options._timeout was specified, but timeout kwarg has a default value that will always override it.");
    }
}

fn hostname_hint(url: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(rest) = url.strip_prefix("tcp://") {
        let host = rest.split(['/', '?']).next().unwrap_or("");
        let host = match host.rfind(':') {
            Some(i) => &host[..i],
            None => host,
        };
        return Some(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        );
    }
    env("MASTER_ADDR")
}

/// SHA-1 hex of `"<ranks joined by _>_<counter>"` (`_hash_ranks_to_str`).
pub fn hash_ranks_to_str(ranks: &[usize], counter: usize) -> String {
    use sha1::{Digest, Sha1};
    let mut s: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    s.push(counter.to_string());
    let digest = Sha1::digest(s.join("_").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// `_process_group_name`: hashed or `str(counter)`; advances the counter either way.
pub(crate) fn process_group_name(st: &mut State, ranks: &[usize], hashed: bool) -> String {
    let name = if hashed {
        hash_ranks_to_str(ranks, st.group_count)
    } else {
        st.group_count.to_string()
    };
    st.group_count += 1;
    name
}

fn find_pg_by_ranks_and_tag(st: &State, tag: &str, ranks: &[usize]) -> Option<ProcessGroup> {
    let tag = if !tag.is_empty() && !tag.starts_with("ptd:") && !tag.starts_with("user:") {
        format!("user:{tag}")
    } else {
        tag.to_string()
    };
    for g in st.tags_to_pg.get(&tag)? {
        if g.size() != ranks.len() {
            continue;
        }
        let granks = st.entry(g).map(|e| e.ranks.clone()).unwrap_or_default();
        if ranks.iter().all(|r| granks.contains(r)) {
            return Some(g.clone());
        }
    }
    None
}

/// `_store_based_barrier`: each rank adds 1 to `store_based_barrier_key:<name>`; the last sets
/// `<key>:last_worker`; all wait for it, re-checking at least every 10 s.
///
/// # Errors
/// [`DistError::Store`] "Timed out initializing process group in store based barrier on rank
/// {rank}, for key: {key} (world_size={n}, num_workers_joined={k}, timeout={t:?} error={e})".
pub fn store_based_barrier(
    rank: usize,
    store: &dyn Store,
    group_name: &str,
    world_size: usize,
    timeout: Duration,
) -> Result<()> {
    let key = format!("store_based_barrier_key:{group_name}");
    store.add(&key, 1)?;
    let count = store.add(&key, 0)?;
    let last = format!("{key}:last_worker");
    if count as usize == world_size {
        store.set(&last, b"1")?;
    }
    let start = Instant::now();
    let interval = Duration::from_secs_f64(10.0 + world_size as f64 / 1000.0);
    loop {
        let remaining = timeout.saturating_sub(start.elapsed());
        let wait = interval.min(remaining).max(Duration::from_millis(1));
        match store.wait_timeout(&[last.as_str()], wait) {
            Ok(()) => return Ok(()),
            Err(e) if e.is_store_error() => {
                let joined = store.add(&key, 0).unwrap_or(-1);
                if start.elapsed() >= timeout {
                    return Err(DistError::store(format!(
                        "Timed out initializing process group in store based barrier on rank {rank}, for key: {key} (world_size={world_size}, num_workers_joined={joined}, timeout={timeout:?} error={e})"
                    )));
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// `get_node_local_rank(fallback_rank)`: `LOCAL_RANK` from the environment, else the fallback.
///
/// # Errors
/// [`DistError::InvalidArgument`] when `LOCAL_RANK` is missing (and no fallback) or not an integer.
pub fn get_node_local_rank(fallback_rank: Option<usize>) -> Result<usize> {
    match std::env::var("LOCAL_RANK") {
        Ok(v) => v.trim().parse().map_err(|_| DistError::invalid(format!("LOCAL_RANK must be an integer, got {v:?}"))),
        Err(_) => fallback_rank.ok_or_else(|| {
            DistError::invalid(
                "LOCAL_RANK is not in the environment. Consider passing fallback_rank to allow `get_node_local_rank` to work, assuming you are not running in a multi-device context and want the code to run locally instead.",
            )
        }),
    }
}

/// `is_torchelastic_launched()`: true when `TORCHELASTIC_RUN_ID` is set (torchrun / c10drun).
pub fn is_torchelastic_launched() -> bool {
    std::env::var_os("TORCHELASTIC_RUN_ID").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha1_names_match_pytorch() {
        // hashlib.sha1(b"0_1_6").hexdigest()
        let h = hash_ranks_to_str(&[0, 1], 6);
        assert!(h.starts_with("3722ef32") && h.ends_with("7206"), "{h}");
        assert_eq!(h.len(), 40);
    }
}

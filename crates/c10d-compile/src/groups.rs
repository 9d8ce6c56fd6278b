//! The compile-side groups of `torch/_dynamo/distributed.py`: `get_compile_pg()`,
//! `get_guard_pg()` and `get_compile_sync_pg()`.
//!
//! Each is a group over *all* ranks made with [`World::new_group_with_tag`] (PyTorch's
//! `_new_group_with_tag`) under its tag, created on first use and cached. A group exists only
//! while its switch is on ([`crate::config`]) and the world is initialized; otherwise the getter
//! returns `None`. The compile-sync group always runs on the CPU backend (`"gloo"`) with the
//! default group's timeout, so compile traffic never interleaves with accelerator model traffic.
//!
//! Like any collective group creation, the first call must be made by every rank, in the same
//! order relative to other group creations.
//!
//! The cache is tied to the default group it was made under: after `destroy_process_group()` the
//! cached groups are forgotten and a re-initialized world gets fresh ones (so is a cached group
//! that was destroyed on its own).

use crate::config;
use c10d_core::{DistError, ProcessGroup, Result};
use c10d_world::{GroupOptions, World};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Tag of the compile group (`_new_group_with_tag(pg_tag="pt2_compile_pg")`).
pub const COMPILE_PG_TAG: &str = "pt2_compile_pg";
/// Tag of the guard group.
pub const GUARD_PG_TAG: &str = "pt2_guard_pg";
/// Tag of the compile-sync group (always on the CPU backend).
pub const COMPILE_SYNC_PG_TAG: &str = "pt2_compile_sync_pg";
/// Backend of the compile-sync group.
pub const COMPILE_SYNC_BACKEND: &str = "gloo";

/// One of the three compile-side groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileGroupKind {
    /// `get_compile_pg()`: the compiler collective (automatic-dynamic states).
    Compile,
    /// `get_guard_pg()`: the guard collective (one bool per rank).
    Guard,
    /// `get_compile_sync_pg()`: digests and cache-hit agreement, on gloo.
    CompileSync,
}

impl CompileGroupKind {
    /// The tag the group is registered under.
    pub const fn tag(self) -> &'static str {
        match self {
            CompileGroupKind::Compile => COMPILE_PG_TAG,
            CompileGroupKind::Guard => GUARD_PG_TAG,
            CompileGroupKind::CompileSync => COMPILE_SYNC_PG_TAG,
        }
    }

    fn index(self) -> usize {
        match self {
            CompileGroupKind::Compile => 0,
            CompileGroupKind::Guard => 1,
            CompileGroupKind::CompileSync => 2,
        }
    }
}

#[derive(Default)]
struct Cache {
    /// The default group the cached groups were made under.
    world_pg: Option<ProcessGroup>,
    groups: [Option<ProcessGroup>; 3],
}

/// The compile-side groups of one [`World`], and the exchanges built on them
/// (see [`crate::exchange`]).
///
/// [`CompileGroups::global`] serves the process-wide world (the free functions
/// [`get_compile_pg`], [`get_guard_pg`], [`get_compile_sync_pg`]); ranks run as threads create
/// one per rank with [`CompileGroups::new`].
pub struct CompileGroups<'w> {
    world: &'w World,
    compiler_collectives: Mutex<Option<bool>>,
    guard_collectives: Mutex<Option<bool>>,
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for CompileGroups<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileGroups")
            .field("compiler_collectives", &self.compiler_collectives_enabled())
            .field("guard_collectives", &self.guard_collectives_enabled())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<'w> CompileGroups<'w> {
    /// The compile-side groups of `world`. Switches follow the process-wide settings until
    /// overridden with [`CompileGroups::set_enable_compiler_collectives`] /
    /// [`CompileGroups::set_enable_guard_collectives`].
    pub fn new(world: &'w World) -> CompileGroups<'w> {
        CompileGroups {
            world,
            compiler_collectives: Mutex::new(None),
            guard_collectives: Mutex::new(None),
            cache: Mutex::new(Cache::default()),
        }
    }

    /// The world these groups belong to.
    pub fn world(&self) -> &'w World {
        self.world
    }

    /// Overrides `enable_compiler_collectives` for this world (`None` = process-wide setting).
    pub fn set_enable_compiler_collectives(&self, on: Option<bool>) {
        *lock(&self.compiler_collectives) = on;
    }

    /// Overrides the guard-collectives switch for this world (`None` = process-wide setting).
    pub fn set_enable_guard_collectives(&self, on: Option<bool>) {
        *lock(&self.guard_collectives) = on;
    }

    /// Whether compiler collectives (compile group, compile-sync group) are on for this world.
    pub fn compiler_collectives_enabled(&self) -> bool {
        lock(&self.compiler_collectives).unwrap_or_else(config::enable_compiler_collectives)
    }

    /// Whether guard collectives (guard group) are on for this world.
    pub fn guard_collectives_enabled(&self) -> bool {
        lock(&self.guard_collectives).unwrap_or_else(config::enable_guard_collectives)
    }

    fn enabled(&self, kind: CompileGroupKind) -> bool {
        match kind {
            CompileGroupKind::Compile | CompileGroupKind::CompileSync => {
                self.compiler_collectives_enabled()
            }
            CompileGroupKind::Guard => self.guard_collectives_enabled(),
        }
    }

    /// `get_compile_pg()`: the group tagged `"pt2_compile_pg"` over all ranks on the default
    /// backend; `None` unless compiler collectives are enabled and the world is initialized.
    ///
    /// # Errors
    /// Group creation errors (rendezvous timeout, backend errors).
    pub fn get_compile_pg(&self) -> Result<Option<ProcessGroup>> {
        self.get(CompileGroupKind::Compile)
    }

    /// `get_guard_pg()`: the group tagged `"pt2_guard_pg"`; `None` unless guard collectives are
    /// enabled and the world is initialized.
    ///
    /// # Errors
    /// As [`CompileGroups::get_compile_pg`].
    pub fn get_guard_pg(&self) -> Result<Option<ProcessGroup>> {
        self.get(CompileGroupKind::Guard)
    }

    /// `get_compile_sync_pg()`: the group tagged `"pt2_compile_sync_pg"`, always on `"gloo"`,
    /// with the default group's timeout; `None` unless compiler collectives are enabled and the
    /// world is initialized.
    ///
    /// # Errors
    /// "get_compile_sync_pg: the compile-sync group needs the gloo backend, which is not
    /// available"; creation errors.
    pub fn get_compile_sync_pg(&self) -> Result<Option<ProcessGroup>> {
        self.get(CompileGroupKind::CompileSync)
    }

    /// The group of `kind`, created on first use (see the module docs).
    ///
    /// # Errors
    /// As [`CompileGroups::get_compile_sync_pg`]; "compile group: rank R is not a member of the
    /// all-ranks group tagged T" (PyTorch asserts this cannot happen).
    pub fn get(&self, kind: CompileGroupKind) -> Result<Option<ProcessGroup>> {
        if !self.enabled(kind) {
            return Ok(None);
        }
        let mut cache = lock(&self.cache);
        let world_pg = match self.world.world_group() {
            Ok(pg) => pg,
            Err(_) => {
                // Not initialized (or destroyed): forget everything.
                *cache = Cache::default();
                return Ok(None);
            }
        };
        if !cache.world_pg.as_ref().is_some_and(|p| p.ptr_eq(&world_pg)) {
            *cache = Cache {
                world_pg: Some(world_pg.clone()),
                groups: Default::default(),
            };
        }
        let slot = &mut cache.groups[kind.index()];
        if let Some(pg) = slot {
            // Still registered in this world? (It may have been destroyed on its own.)
            if self.world.get_group_tag(pg).is_ok() {
                return Ok(Some(pg.clone()));
            }
            *slot = None;
        }
        let mut opts = GroupOptions::default();
        if kind == CompileGroupKind::CompileSync {
            if !c10d_world::is_gloo_available() {
                return Err(DistError::invalid(
                    "get_compile_sync_pg: the compile-sync group needs the gloo backend, which is not available",
                ));
            }
            opts.backend = Some(COMPILE_SYNC_BACKEND.to_string());
            opts.timeout = Some(world_pg.default_backend()?.timeout());
        }
        let member = self
            .world
            .new_group_with_tag(None, opts, Some(kind.tag()))?;
        let pg = member.into_group().map_err(|_| {
            DistError::invalid(format!(
                "compile group: rank {} is not a member of the all-ranks group tagged {}",
                world_pg.rank(),
                kind.tag()
            ))
        })?;
        *slot = Some(pg.clone());
        Ok(Some(pg))
    }

    /// Forgets the cached groups (they stay alive in the world); the next getter call looks
    /// them up again by tag.
    pub fn clear_cache(&self) {
        *lock(&self.cache) = Cache::default();
    }
}

impl CompileGroups<'static> {
    /// The compile-side groups of [`World::global`].
    pub fn global() -> &'static CompileGroups<'static> {
        static G: OnceLock<CompileGroups<'static>> = OnceLock::new();
        G.get_or_init(|| CompileGroups::new(World::global()))
    }
}

/// [`CompileGroups::get_compile_pg`] on the global world.
///
/// # Errors
/// See [`CompileGroups::get_compile_pg`].
pub fn get_compile_pg() -> Result<Option<ProcessGroup>> {
    CompileGroups::global().get_compile_pg()
}

/// [`CompileGroups::get_guard_pg`] on the global world.
///
/// # Errors
/// See [`CompileGroups::get_guard_pg`].
pub fn get_guard_pg() -> Result<Option<ProcessGroup>> {
    CompileGroups::global().get_guard_pg()
}

/// [`CompileGroups::get_compile_sync_pg`] on the global world.
///
/// # Errors
/// See [`CompileGroups::get_compile_sync_pg`].
pub fn get_compile_sync_pg() -> Result<Option<ProcessGroup>> {
    CompileGroups::global().get_compile_sync_pg()
}

//! Read-only questions about the world and its groups: ranks, sizes, stores, backends, tags.

use super::registry::find_pg_by_ranks_and_tag;
use super::{not_registered, GroupEntry, GroupMember, World, NOT_INITIALIZED};
use c10d_core::{DistError, ProcessGroup, Result};
use c10d_store::Store;
use std::sync::Arc;

impl World {
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

    /// The init method URL the default group was made with (`_default_pg_init_method`).
    pub fn init_method(&self) -> Option<String> {
        self.lock().init_method.clone()
    }
}

//! `shrink_group` (PyTorch 2.9+): after a rank dies, the survivors build a smaller group from the
//! one they had and go on with collectives.
//!
//! How it works here: every surviving member creates a fresh backend for the remaining ranks over
//! the shrunk group's own store prefix (`"<old group's store>/<new name>/"`, the layout PyTorch
//! uses), with the parent's backend string, backend config, op timeout and bound device. The
//! excluded ranks take no part, so a dead rank cannot hold the shrink up: it costs one
//! rendezvous of the survivors over the store (milliseconds on one host). The old group is then
//! aborted (non-collectively) and forgotten.
//!
//! ## Departures from PyTorch
//!
//! - PyTorch shrinks through the backend's own `shrink` (`ncclCommShrink`) and raises
//!   `TypeError` "... does not support shrinking operations" for every other backend, Gloo
//!   included, so it cannot shrink a CPU group at all. Here the group's default backend shrinks
//!   itself when it can ([`c10d_core::Backend::shrink`]: NCCL ≥ 2.27 with a live communicator
//!   uses `ncclCommShrink`), and every other backend, or an NCCL one whose communicator was
//!   aborted after a failure, is replaced by a new one for the survivors.
//! - There are no `shrink_flags` and no `pg_options` arguments: the parent is always aborted
//!   after the new group exists (what `SHRINK_ABORT` asks for), and the new group is created
//!   with the backend's default options.
//! - The group is passed as `Option<&GroupMember>` (as the collectives take it) so that a
//!   non-member's `GroupMember::NonGroupMember` gets a clear error, and the result is a
//!   [`GroupMember::Group`].
//! - Shrinking the default group makes the shrunk group the new default and renumbers the world:
//!   the new global ranks are the new group ranks (`get_rank()`, `get_world_size()`,
//!   `get_global_rank` and `get_process_group_ranks` all agree). PyTorch keeps the old global
//!   ranks in the new default group's rank map, so there `get_global_rank(new, r)` still returns
//!   the pre-shrink rank while `get_rank()` returns the new one.
//! - The old target group is aborted rather than destroyed (a peer is usually dead, so
//!   nothing collective may run during cleanup); when the default group is shrunk, every other
//!   group is aborted and forgotten, as in PyTorch.

use crate::world::{
    not_registered, stop_backends, BackendSource, GroupEntry, GroupMember, NewPg, World,
};
use c10d_core::{DistError, ProcessGroup, Result};

impl World {
    /// `shrink_group(ranks_to_exclude, group=None)` (PyTorch 2.9+): a new, smaller group made of
    /// the ranks of `group` (default: the default group) that are not in `ranks_to_exclude`.
    ///
    /// - `ranks_to_exclude` are ranks **of `group`** (group ranks, not global ranks).
    /// - Only the surviving members call it (all of them, as for any group creation); the
    ///   excluded ranks must not (they are typically dead).
    /// - The survivors keep their order: new group rank = position among the remaining ranks.
    /// - The new group has a new, hashed name (`_process_group_name(ranks, use_hashed_name=True)`
    ///   over the old group's ranks, which advances the group counter), the description
    ///   `"default:shrunken"` for the default group and `"<old name>:shrunk"` otherwise, the same
    ///   backend, backend config, op timeout and bound device as the old group, and its store is
    ///   the old group's store under the prefix `"<new name>/"`.
    /// - The old group is aborted (its pending works fail) and removed; using it afterwards
    ///   fails as for a destroyed group.
    /// - Shrinking the default group makes the shrunk group the new default group: the world is
    ///   renumbered (`get_rank()`/`get_world_size()` answer for the shrunk group), and every
    ///   other group is aborted and removed, since its ranks no longer mean anything.
    ///
    /// Unlike PyTorch (which needs `ncclCommShrink`), this works on every backend, the CPU ones
    /// included: the survivors create a fresh backend over the store. See the
    /// [module docs](crate::shrink) for the other differences.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] with PyTorch's texts:
    /// - "ranks_to_exclude cannot be empty. ..." for an empty list;
    /// - "Default process group has not been initialized ..." before `init_process_group`;
    /// - "Cannot shrink a process group with size N. ..." for a group of one rank;
    /// - "Rank R at index I is out of bounds for group size N. ..." for a rank not in the group;
    /// - "Duplicate rank R found in ranks_to_exclude at index I. ...";
    /// - "Cannot exclude all N ranks from process group. ...";
    /// - "Current rank R is in the exclusion list and should not call shrink_group(). ..." when an
    ///   excluded rank calls it;
    /// - "shrink_group: this rank is not a member of the group ..." for
    ///   [`GroupMember::NonGroupMember`], and "Group .. is not registered ..." for a group this
    ///   world does not know (destroyed, or another world's);
    ///
    /// and the backend's error if the survivors' rendezvous fails (for example when a survivor
    /// does not call `shrink_group` within the store timeout). The old group is left untouched
    /// when any of these fail.
    pub fn shrink_group(
        &self,
        ranks_to_exclude: &[usize],
        group: Option<&GroupMember>,
    ) -> Result<GroupMember> {
        if ranks_to_exclude.is_empty() {
            return Err(DistError::invalid(
                "ranks_to_exclude cannot be empty. To shrink a group, you must specify at least \
                 one rank to exclude. Example: [failed_rank_id]",
            ));
        }
        let (target, entry, is_default) = self.shrink_target(group)?;
        let current_rank = target.rank();
        // Survivors in old group-rank order; the new group rank is the position among them.
        let remaining = survivors(ranks_to_exclude, entry.ranks.len(), current_rank)?;
        let new_rank = remaining
            .iter()
            .position(|&r| r == current_rank)
            .ok_or_else(|| DistError::invalid("shrink_group: current rank not among survivors"))?;
        let remaining_global: Vec<usize> = remaining.iter().map(|&r| entry.ranks[r]).collect();
        let group_name = {
            let mut st = self.lock();
            crate::world::process_group_name(&mut st, &entry.ranks, true)
        };
        let group_desc = if is_default {
            "default:shrunken".to_string()
        } else {
            format!("{}:shrunk", target.group_name())
        };
        let parent_backend = target.default_backend()?;
        let timeout = parent_backend.timeout();
        let a = NewPg {
            group_size: remaining.len(),
            group_rank: Some(new_rank),
            // The default group's members are renumbered 0..n: they are the new world.
            global_ranks: if is_default {
                (0..remaining.len()).collect()
            } else {
                remaining_global
            },
            backend: entry.backend_name.clone(),
            config: entry.config.clone(),
            store: entry.store.clone(),
            group_name,
            pg_options: None,
            timeout,
            pg_tag: None,
            device_id: target.bound_device_id(),
            group_desc,
        };
        // A backend that can shrink itself (NCCL: `ncclCommShrink`) makes the survivors'
        // backend for its device; the others, and every backend of the rest, are made anew.
        let bopts = a.backend_options();
        let source = match parent_backend.shrink(ranks_to_exclude, &bopts)? {
            Some(child) => BackendSource::Shrunk(child),
            None => BackendSource::Create,
        };
        let (member, _) = self.create_group(a, source)?;
        let new_pg = member
            .group()
            .cloned()
            .ok_or_else(|| DistError::invalid("shrink_group: the backend created no group"))?;
        let to_abort = self.forget_shrunk(&new_pg, &target, is_default);
        if is_default && to_abort.len() > 1 {
            warn_destroyed(&to_abort, &target);
        }
        for g in &to_abort {
            stop_backends(g, true);
        }
        Ok(GroupMember::Group(new_pg))
    }

    /// The group to shrink (default WORLD), its entry, and whether it is WORLD.
    fn shrink_target(
        &self,
        group: Option<&GroupMember>,
    ) -> Result<(ProcessGroup, GroupEntry, bool)> {
        let st = self.lock();
        let default_pg = st
            .default_pg
            .clone()
            .ok_or_else(|| DistError::invalid(crate::world::NOT_INITIALIZED))?;
        let target: ProcessGroup = match group {
            None => default_pg.clone(),
            Some(GroupMember::Group(g)) => g.clone(),
            Some(GroupMember::NonGroupMember) => {
                return Err(DistError::invalid(
                    "shrink_group: this rank is not a member of the group to shrink \
                     (GroupMember.NON_GROUP_MEMBER); only the group's surviving members \
                     call shrink_group()",
                ))
            }
        };
        let entry = st
            .entry(&target)
            .cloned()
            .ok_or_else(|| not_registered(&target))?;
        let is_default = default_pg.ptr_eq(&target);
        Ok((target, entry, is_default))
    }

    /// Removes the shrunk group (and, when WORLD was shrunk, every other group) from the maps,
    /// making the new group WORLD in that case; returns the removed groups to abort. (Also what
    /// a grown WORLD does, `crate::grow`.)
    pub(crate) fn forget_shrunk(
        &self,
        new_pg: &ProcessGroup,
        target: &ProcessGroup,
        is_default: bool,
    ) -> Vec<ProcessGroup> {
        let mut st = self.lock();
        let doomed: Vec<ProcessGroup> = st
            .groups
            .iter()
            .filter(|e| !e.pg.ptr_eq(new_pg) && (is_default || e.pg.ptr_eq(target)))
            .map(|e| e.pg.clone())
            .collect();
        let is_doomed = |g: &ProcessGroup| doomed.iter().any(|d| d.ptr_eq(g));
        st.groups.retain(|e| !is_doomed(&e.pg));
        for v in st.tags_to_pg.values_mut() {
            v.retain(|g| !is_doomed(g));
        }
        st.tags_to_pg.retain(|_, v| !v.is_empty());
        st.registry.retain(|_, g| !is_doomed(g));
        if is_default {
            // Its rank map is already 0..n: the survivors' new global ranks were passed in.
            st.default_pg = Some(new_pg.clone());
            st.coalescing = None;
        }
        doomed
    }
}

/// The surviving group ranks, in order, after checking `ranks_to_exclude` against the group
/// (PyTorch's texts: size, bounds, duplicates, all excluded, the caller excluded).
fn survivors(
    ranks_to_exclude: &[usize],
    group_size: usize,
    current_rank: usize,
) -> Result<Vec<usize>> {
    if group_size <= 1 {
        return Err(DistError::invalid(format!(
            "Cannot shrink a process group with size {group_size}. \
             Group must have at least 2 ranks to support shrinking."
        )));
    }
    let mut excluded = vec![false; group_size];
    for (i, &r) in ranks_to_exclude.iter().enumerate() {
        if r >= group_size {
            return Err(DistError::invalid(format!(
                "Rank {r} at index {i} is out of bounds for group size {group_size}. \
                 Valid ranks are in range [0, {}].",
                group_size - 1
            )));
        }
        if excluded[r] {
            return Err(DistError::invalid(format!(
                "Duplicate rank {r} found in ranks_to_exclude at index {i}. \
                 Each rank can only be excluded once."
            )));
        }
        excluded[r] = true;
    }
    if ranks_to_exclude.len() >= group_size {
        return Err(DistError::invalid(format!(
            "Cannot exclude all {group_size} ranks from process group. \
             At least one rank must remain. Excluding {} ranks.",
            ranks_to_exclude.len()
        )));
    }
    if excluded[current_rank] {
        return Err(DistError::invalid(format!(
            "Current rank {current_rank} is in the exclusion list and should not call \
             shrink_group(). Only non-excluded ranks should participate in the shrinking \
             operation. Excluded ranks should terminate their processes instead."
        )));
    }
    Ok((0..group_size).filter(|&r| !excluded[r]).collect())
}

/// Shrinking WORLD aborts every other group: PyTorch's warning naming them.
fn warn_destroyed(to_abort: &[ProcessGroup], target: &ProcessGroup) {
    let names: Vec<&str> = to_abort
        .iter()
        .filter(|g| !g.ptr_eq(target))
        .map(|g| g.group_name())
        .collect();
    log::warn!(
        "Shrinking default group will destroy {} other process groups: {}. This is \
         necessary because shrinking the default group reassigns global ranks, making \
         existing groups inconsistent.",
        names.len(),
        names.join(", ")
    );
}

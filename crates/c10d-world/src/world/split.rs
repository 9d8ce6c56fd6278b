//! `split_group`: child groups of a parent from lists of parent group ranks.
//!
//! Steps: find the parent and this rank in it, narrow the parent's backends when asked
//! (`backend=`), pick and check this rank's list, name the child, then either let the parent's
//! backend split (collective over the parent) or create a fresh backend; both end in the shared
//! creation path ([`World::create_group`]).

use super::create::BackendSource;
use super::{process_group_name, GroupEntry, GroupMember, NewPg, SplitOptions, World};
use crate::config::{self, BackendConfig};
use c10d_core::{DeviceType, DistError, ProcessGroup, Result};
use c10d_store::Store;
use std::sync::Arc;

/// The parent group as `split_group` sees it on this rank.
struct SplitParent {
    parent: ProcessGroup,
    entry: GroupEntry,
    /// The default group's store (the child's store is `PrefixStore("<name>/", it)`).
    default_store: Arc<dyn Store>,
    /// This rank's rank in the parent.
    group_rank: usize,
    /// WORLD's size.
    world_size: usize,
}

/// A device → backend list, as in [`BackendConfig::device_backend_map`].
type DeviceBackends = Vec<(DeviceType, String)>;

/// `map` as the error texts show it: `[("cpu", "gloo")]`.
fn show(map: &DeviceBackends) -> String {
    let pairs: Vec<(&str, &str)> = map.iter().map(|(d, b)| (d.as_str(), b.as_str())).collect();
    format!("{pairs:?}")
}

impl World {
    /// `split_group(parent_pg, split_ranks, ...)`: every rank of `parent` (default WORLD) calls it
    /// with the same lists of *parent group ranks*; inner order is kept (position = new group
    /// rank). Ranks in no list get [`GroupMember::NonGroupMember`]. Names are hashed like local
    /// synchronization (`sha1("<ranks>_<counter>")`, the first list's ranks on non-members). When
    /// the parent's backend supports splitting the child comes from [`Backend::split`](c10d_core::Backend::split); otherwise
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
        let p = self.split_parent(parent)?;
        let (backend, backend_config) = match &opts.backend {
            Some(req) => narrow_backends(&p, req)?,
            None => (p.entry.backend_name.clone(), p.entry.config.clone()),
        };
        let timeout = opts
            .timeout
            .unwrap_or_else(|| config::default_timeout_for(&backend));
        let my_group = my_split_group(split_ranks, p.group_rank, p.world_size)?;
        check_in_parent(my_group, &p.entry)?;
        let (group_name, group_desc) = self.split_name(&p.parent, my_group, &opts);
        let is_member = my_group.contains(&p.group_rank);
        let global_ranks: Vec<usize> = my_group.iter().map(|&r| p.entry.ranks[r]).collect();
        let parent_backend = p.parent.default_backend()?;
        let mut a = NewPg {
            group_size: my_group.len(),
            group_rank: my_group.iter().position(|&r| r == p.group_rank),
            global_ranks,
            backend,
            config: backend_config,
            store: p.default_store,
            group_name,
            pg_options: opts.pg_options,
            timeout,
            pg_tag: None,
            device_id: p.parent.bound_device_id(),
            group_desc,
        };
        if parent_backend.supports_splitting() {
            let bopts = a.backend_options();
            // Collective over the parent: every parent rank takes part, members or not.
            let Some(child) = parent_backend.split(my_group, &bopts)? else {
                return Ok(GroupMember::NonGroupMember);
            };
            if !is_member {
                return Ok(GroupMember::NonGroupMember);
            }
            a.group_rank = Some(child.rank());
            a.group_size = child.size();
            return Ok(self.create_group(a, BackendSource::Split(child))?.0);
        }
        if !is_member {
            return Ok(GroupMember::NonGroupMember);
        }
        Ok(self.new_process_group_helper(a)?.0)
    }

    /// The parent (default WORLD), its entry and this rank's place in it.
    fn split_parent(&self, parent: Option<&ProcessGroup>) -> Result<SplitParent> {
        let (default_pg, default_store, parent, entry) = {
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
        let group_rank = entry
            .ranks
            .iter()
            .position(|&r| r == global_rank)
            .ok_or_else(|| {
                DistError::invalid(format!(
                    "Global rank {global_rank} is not part of the parent group {parent:?}"
                ))
            })?;
        Ok(SplitParent {
            parent,
            entry,
            default_store,
            group_rank,
            world_size: default_pg.size(),
        })
    }

    /// The child's name (hashed over its parent ranks) and description (the given one, else
    /// "<parent desc>:split:<n>" counting the parent's splits).
    fn split_name(
        &self,
        parent: &ProcessGroup,
        my_group: &[usize],
        opts: &SplitOptions,
    ) -> (String, String) {
        let mut st = self.lock();
        let name = process_group_name(&mut st, my_group, true);
        let desc = match &opts.group_desc {
            Some(d) => d.clone(),
            None => {
                let e = st.entry_mut(parent);
                let n = e.map(|e| {
                    let n = e.split_count;
                    e.split_count += 1;
                    n
                });
                format!("{}:split:{}", parent.group_desc(), n.unwrap_or(0))
            }
        };
        (name, desc)
    }
}

/// This rank's list (the first list when it is in none), checking each list up to it: not empty,
/// not larger than WORLD, no duplicates.
fn my_split_group(
    split_ranks: &[Vec<usize>],
    parent_group_rank: usize,
    world_size: usize,
) -> Result<&[usize]> {
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
    Ok(my_group)
}

/// Every rank of `my_group` must be a rank of the parent.
fn check_in_parent(my_group: &[usize], parent: &GroupEntry) -> Result<()> {
    for &r in my_group {
        if r >= parent.ranks.len() {
            return Err(DistError::invalid(format!(
                "split_group: rank {r} is not a rank of the parent group (size {})",
                parent.ranks.len()
            )));
        }
    }
    Ok(())
}

/// `backend=` of `split_group`: the parent's backends kept (a "device:backend" list or a bare
/// backend name), each of which the parent must have with exactly that name.
fn narrow_backends(p: &SplitParent, req: &str) -> Result<(String, BackendConfig)> {
    let parent_devices: Vec<DeviceType> = p.parent.backends().iter().map(|(d, _)| *d).collect();
    let parent_map: DeviceBackends = p
        .entry
        .config
        .device_backend_map
        .iter()
        .filter(|(d, _)| parent_devices.contains(d))
        .cloned()
        .collect();
    let req_lower = req.to_ascii_lowercase();
    let requested = requested_backends(&parent_map, &req_lower)?;
    check_requested(&parent_map, &requested)?;
    Ok((
        req_lower,
        BackendConfig {
            device_backend_map: requested,
        },
    ))
}

/// The requested device → backend pairs: parsed from "cpu:gloo,..." or, for a bare name, the
/// parent's devices that use it.
fn requested_backends(parent_map: &DeviceBackends, req_lower: &str) -> Result<DeviceBackends> {
    if req_lower.contains(':') {
        return Ok(BackendConfig::parse(req_lower)?.device_backend_map);
    }
    let r: DeviceBackends = parent_map
        .iter()
        .filter(|(_, b)| *b == req_lower)
        .cloned()
        .collect();
    if r.is_empty() {
        return Err(DistError::invalid(format!(
            "Requested backend '{req_lower}' is not present in the parent process group (parent backends: {})",
            show(parent_map)
        )));
    }
    Ok(r)
}

/// Each requested device must be one of the parent's, with the same backend name.
fn check_requested(parent_map: &DeviceBackends, requested: &DeviceBackends) -> Result<()> {
    for (dev, be) in requested {
        match parent_map.iter().find(|(d, _)| d == dev) {
            None => {
                return Err(DistError::invalid(format!(
                    "Requested backend for device '{dev}' is not present in the parent process group (parent backends: {})",
            show(parent_map)
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
    Ok(())
}

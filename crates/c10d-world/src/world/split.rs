//! `split_group`: child groups of a parent from lists of parent group ranks.

use super::{process_group_name, GroupEntry, GroupMember, NewPg, SplitOptions, World};
use crate::config::{self, BackendConfig, BackendCreateArgs};
use c10d_core::{BackendOptions, DebugLevel, DeviceType, DistError, ProcessGroup, Result};
use c10d_store::{PrefixStore, Store};
use std::sync::Arc;

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

}

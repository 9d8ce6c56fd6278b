//! Groups from rank lists: `new_group`, `new_subgroups`, `new_subgroups_by_enumeration` and
//! `_find_or_create_pg_by_ranks_and_tag`.

use super::init::warn_ignored_pg_timeout;
use super::{process_group_name, store_based_barrier, GroupMember, GroupOptions, NewPg, World};
use crate::config::{self, BackendConfig};
use c10d_core::{DistError, ProcessGroup, Result};
use std::collections::HashMap;

impl World {
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
        let (ranks, group_rank) = member_ranks(ranks, opts.sort_ranks, world_size, global_rank)?;
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
        if stride == 0 || !ranks.len().is_multiple_of(stride) {
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
}

/// The group's global ranks (sorted when asked) and this rank's place in it (`None` outside),
/// all of WORLD for `None`.
///
/// # Errors
/// Duplicates, more ranks than WORLD, a rank outside `0..world_size` (PyTorch's texts).
fn member_ranks(
    ranks: Option<&[i64]>,
    sort_ranks: bool,
    world_size: usize,
    global_rank: usize,
) -> Result<(Vec<usize>, Option<usize>)> {
    Ok(match ranks {
        Some(r) => {
            let mut r = r.to_vec();
            if sort_ranks {
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
    })
}

//! One process group per mesh dimension, the way PyTorch's `_init_one_process_group` makes
//! them, so that a PyTorch rank and a Rust rank of one job create the same groups in the same
//! order, with the same names ("1", "2", … from `new_group`; hashed names from `split_group`)
//! and descriptions (`"mesh_<dim name>"`):
//!
//! 1. A dimension spanning the whole world with no backend override reuses the default group
//!    (a new group `"mesh_default"` when CUDA is present and the default backend is "gloo").
//! 2. When the default group is bound to an accelerator and the override (if any) names its
//!    backend: one `split_group` over all of the dimension's groups.
//! 3. Otherwise one `new_group` per group of the dimension, in the order of their first
//!    position in the rank map.

use super::layout::Layout;
use super::options::BackendOverride;
use crate::{config, GroupMember, GroupOptions, SplitOptions, World};
use c10d_core::{DeviceType, DistError, ProcessGroup, Result};

/// This rank's group along every dimension of `layout` over `rank_map` (empty outside the
/// mesh). `names` (or "dim_{i}") give the group descriptions.
///
/// # Errors
/// Group creation errors; an inconsistency (a rank in some dimensions' groups but not all).
pub(crate) fn init_dim_groups(
    world: &World,
    layout: &Layout,
    rank_map: &[usize],
    names: &Option<Vec<String>>,
    overrides: &[BackendOverride],
    preserve_rank_order: bool,
) -> Result<Vec<ProcessGroup>> {
    let mut mine = Vec::with_capacity(layout.ndim());
    for d in 0..layout.ndim() {
        let name = names
            .as_ref()
            .map_or_else(|| format!("dim_{d}"), |n| n[d].clone());
        let rows = layout.groups_along(d, rank_map)?;
        mine.push(init_one(
            world,
            &rows,
            &name,
            &overrides[d],
            preserve_rank_order,
        )?);
    }
    let found: Vec<ProcessGroup> = mine.iter().flatten().cloned().collect();
    if !found.is_empty() && found.len() != mine.len() {
        return Err(DistError::invalid(format!(
            "DeviceMesh: rank {} is in the groups of some mesh dimensions but not all",
            world.rank()?
        )));
    }
    Ok(found)
}

/// The group of one dimension whose groups are `rows` (global ranks); `None` when this rank is
/// in none of them.
fn init_one(
    world: &World,
    rows: &[Vec<usize>],
    dim_name: &str,
    ov: &BackendOverride,
    preserve_rank_order: bool,
) -> Result<Option<ProcessGroup>> {
    let world_size = world.world_size()?;
    if rows[0].len() == world_size && ov.is_none() {
        let in_order = rows[0].iter().copied().eq(0..world_size);
        if !preserve_rank_order || in_order {
            return whole_world(world, world_size).map(Some);
        }
    }
    let desc = format!("mesh_{dim_name}");
    let timeout = ov.pg_options.as_ref().and_then(|o| o.timeout);
    if use_split(world, ov)? {
        let opts = SplitOptions {
            timeout,
            pg_options: ov.pg_options.clone(),
            group_desc: Some(desc),
            backend: None,
        };
        return Ok(world.split_group(None, rows, opts)?.group().cloned());
    }
    let me = world.rank()?;
    let mut mine = None;
    for row in rows {
        let opts = GroupOptions {
            timeout,
            backend: ov.backend.clone(),
            pg_options: ov.pg_options.clone(),
            group_desc: Some(desc.clone()),
            sort_ranks: !preserve_rank_order,
            ..Default::default()
        };
        let g = world.new_group(Some(row), opts)?;
        if row.contains(&me) {
            mine = Some(member_group(g, me, row)?);
        }
    }
    Ok(mine)
}

/// A dimension over the whole world: the default group, or (CUDA present, default backend
/// "gloo") a new world-sized group described "mesh_default", as PyTorch does.
fn whole_world(world: &World, world_size: usize) -> Result<ProcessGroup> {
    if config::cuda_available() && world.get_backend(None)? == "gloo" {
        let all: Vec<usize> = (0..world_size).collect();
        let opts = GroupOptions {
            group_desc: Some("mesh_default".into()),
            ..Default::default()
        };
        return member_group(world.new_group(Some(&all), opts)?, world.rank()?, &all);
    }
    world.world_group()
}

/// `split_group` applies when the default group is bound to an accelerator and the override
/// names no other backend than the one it uses there.
fn use_split(world: &World, ov: &BackendOverride) -> Result<bool> {
    let default = world.world_group()?;
    let Some(dev) = default.bound_device_id() else {
        return Ok(false);
    };
    if dev.device_type() == DeviceType::Cpu {
        return Ok(false);
    }
    Ok(match &ov.backend {
        None => true,
        Some(b) => default
            .backend(dev.device_type())
            .is_ok_and(|be| be.name().eq_ignore_ascii_case(b)),
    })
}

fn member_group(g: GroupMember, me: usize, row: &[usize]) -> Result<ProcessGroup> {
    g.into_group().map_err(|_| {
        DistError::invalid(format!(
            "Rank {me} was not included in process group {row:?}"
        ))
    })
}

//! Making a mesh: `init_device_mesh`, `DeviceMesh(device_type, mesh)` and `from_group`.
//!
//! Steps of [`World::init_device_mesh_with`] and [`DeviceMesh::new_in`]: check the arguments
//! locally (PyTorch's checks), initialise the world if it is not (`env://`, as PyTorch does),
//! check that every rank passed the same arguments ([`super::agree`]), then create one group per
//! dimension ([`super::groups`]).

use super::agree::{check_same_arguments, MeshArgs};
use super::groups::init_dim_groups;
use super::layout::Layout;
use super::mesh::{coordinate_in, DeviceMesh, Root};
use super::options::{py_tuple, BackendOverride, MeshArray, MeshOptions};
use crate::{InitOptions, World};
use c10d_core::{DistError, ProcessGroup, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

impl World {
    /// `init_device_mesh(device_type, mesh_shape, mesh_dim_names=...)`: the world's ranks
    /// `0..Π mesh_shape` laid out row-major on a grid of `mesh_shape`, one process group per
    /// dimension. Every rank of the world calls it with the same arguments.
    ///
    /// `device_type` is "cpu" or "cuda" (no index). A mesh smaller than the world leaves the
    /// other ranks outside it (no coordinate, no groups), as in PyTorch.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] in PyTorch's words: "Each mesh_dim_name must be unique.
    /// Found repeated mesh_dim_name in mesh_dim_names (..)"; "mesh_shape and mesh_dim_names
    /// should have same length! .."; "Device type with index is not supported but got cuda:0.
    /// .."; "Mesh should not be bigger than default world size {W}, but found {n} ranks!";
    /// "init_device_mesh: rank {r} passed {argument}=.. but rank 0 passed .." when ranks
    /// disagree (on every rank); store timeouts naming the rank waited for; group creation
    /// errors.
    pub fn init_device_mesh(
        &self,
        device_type: &str,
        mesh_shape: &[usize],
        mesh_dim_names: Option<&[&str]>,
    ) -> Result<DeviceMesh<'_>> {
        let opts = MeshOptions {
            mesh_dim_names: mesh_dim_names.map(|n| n.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        };
        self.init_device_mesh_with(device_type, mesh_shape, opts)
    }

    /// [`World::init_device_mesh`] with every option: per-dimension backends
    /// (`backend_override`), `preserve_rank_order`, and the cross-rank argument check.
    ///
    /// # Errors
    /// As [`World::init_device_mesh`]; "Found redundant dim index {i} and name {n} in
    /// backend_override"; "Found invalid keys in backend_override: got [..], expected integers
    /// in range [0, {ndim}) or one of (..)".
    pub fn init_device_mesh_with(
        &self,
        device_type: &str,
        mesh_shape: &[usize],
        opts: MeshOptions,
    ) -> Result<DeviceMesh<'_>> {
        let n: usize = mesh_shape.iter().product();
        let mesh = MeshArray::new(mesh_shape.to_vec(), (0..n).collect())?;
        build(self, device_type, mesh, opts, "init_device_mesh")
    }
}

impl DeviceMesh<'static> {
    /// `DeviceMesh(device_type, mesh, mesh_dim_names=...)` on [`World::global`]: an explicit
    /// layout of global ranks.
    ///
    /// # Errors
    /// As [`DeviceMesh::new_in`].
    pub fn new(
        device_type: &str,
        mesh: MeshArray,
        opts: MeshOptions,
    ) -> Result<DeviceMesh<'static>> {
        DeviceMesh::new_in(World::global(), device_type, mesh, opts)
    }
}

impl<'w> DeviceMesh<'w> {
    /// `DeviceMesh(device_type, mesh, ...)` in `world`: `mesh` holds global ranks, each at most
    /// once; every rank of the world calls it with the same arguments.
    ///
    /// # Errors
    /// As [`World::init_device_mesh_with`]; "DeviceMesh: rank {r} appears more than once in the
    /// mesh {mesh}"; "DeviceMesh: rank {r} in the mesh is not a rank of the world (size {W})".
    pub fn new_in(
        world: &'w World,
        device_type: &str,
        mesh: MeshArray,
        opts: MeshOptions,
    ) -> Result<DeviceMesh<'w>> {
        build(world, device_type, mesh, opts, "DeviceMesh")
    }

    /// `DeviceMesh.from_group(group, device_type, mesh, mesh_dim_names=...)`: a mesh over groups
    /// that exist already (one per dimension, in dimension order); nothing is created and no
    /// rank talks to another. With one group, `mesh` defaults to its ranks.
    ///
    /// A departure from PyTorch, which trusts the caller: each group must hold exactly the
    /// mesh's ranks along its dimension through this rank.
    ///
    /// # Errors
    /// PyTorch's: "Invalid mesh [..] for ProcessGroup with ranks [..]"; "Expects at least one
    /// ProcessGroup to be passed"; "Must pass mesh if passing multiple ProcessGroups"; "Must
    /// pass mesh_dim_names if passing multiple ProcessGroups"; "Expects mesh with ndim equal to
    /// number of ProcessGroups but got mesh [..] and {n} ProcessGroups"; and "from_group: group
    /// '{name}' of dimension {d} holds ranks [..], but the mesh's ranks along it through rank
    /// {r} are [..]".
    pub fn from_group(
        world: &'w World,
        groups: &[ProcessGroup],
        device_type: &str,
        mesh: Option<MeshArray>,
        mesh_dim_names: Option<&[&str]>,
    ) -> Result<DeviceMesh<'w>> {
        let mesh = from_group_mesh(world, groups, mesh, mesh_dim_names)?;
        let names = mesh_dim_names.map(|n| n.iter().map(|s| s.to_string()).collect());
        check_names(&names, mesh.shape().len())?;
        let m = new_mesh(world, device_type, &mesh, names, false, groups.to_vec())?;
        check_from_group(world, &m)?;
        Ok(m)
    }
}

/// The mesh of `from_group`, with PyTorch's checks.
fn from_group_mesh(
    world: &World,
    groups: &[ProcessGroup],
    mesh: Option<MeshArray>,
    names: Option<&[&str]>,
) -> Result<MeshArray> {
    if let [g] = groups {
        let ranks = world.get_process_group_ranks(Some(g))?;
        if let Some(m) = mesh.filter(|m| m.shape().len() != 1 || m.ranks() != ranks.as_slice()) {
            return Err(DistError::invalid(format!(
                "Invalid mesh {m} for ProcessGroup with ranks {ranks:?}"
            )));
        }
        return Ok(MeshArray::from(ranks));
    }
    if groups.is_empty() {
        return Err(DistError::invalid(
            "Expects at least one ProcessGroup to be passed",
        ));
    }
    let mesh =
        mesh.ok_or_else(|| DistError::invalid("Must pass mesh if passing multiple ProcessGroups"))?;
    if names.is_none() {
        return Err(DistError::invalid(
            "Must pass mesh_dim_names if passing multiple ProcessGroups",
        ));
    }
    if mesh.shape().len() != groups.len() {
        return Err(DistError::invalid(format!(
            "Expects mesh with ndim equal to number of ProcessGroups but got mesh {mesh} and {} ProcessGroups",
            groups.len()
        )));
    }
    Ok(mesh)
}

/// Each group of a `from_group` mesh holds the mesh's ranks along its dimension.
fn check_from_group(world: &World, m: &DeviceMesh<'_>) -> Result<()> {
    let mesh = m.mesh()?;
    let Some(coord) = coordinate_in(&mesh, m.rank) else {
        return Ok(());
    };
    for (d, g) in m.groups.iter().enumerate() {
        let mut line: Vec<usize> = (0..mesh.shape()[d])
            .filter_map(|i| {
                let mut c = coord.clone();
                c[d] = i;
                mesh.get(&c)
            })
            .collect();
        let mut held = world.get_process_group_ranks(Some(g))?;
        line.sort_unstable();
        held.sort_unstable();
        if line != held {
            return Err(DistError::invalid(format!(
                "from_group: group '{}' of dimension {d} holds ranks {held:?}, but the mesh's ranks along it through rank {} are {line:?}",
                g.group_name(),
                m.rank
            )));
        }
    }
    Ok(())
}

/// The shared path of `init_device_mesh` and `DeviceMesh(..)`.
fn build<'w>(
    world: &'w World,
    device_type: &str,
    mesh: MeshArray,
    opts: MeshOptions,
    what: &str,
) -> Result<DeviceMesh<'w>> {
    let ndim = mesh.shape().len();
    check_names(&opts.mesh_dim_names, ndim)?;
    let overrides = normalize_overrides(&opts.backend_override, ndim, &opts.mesh_dim_names)?;
    check_device_type(device_type)?;
    if !world.is_initialized() {
        world.init_process_group(InitOptions::default())?;
    }
    if opts.check_arguments {
        let args = MeshArgs::new(device_type, &mesh, &opts);
        check_same_arguments(world, what, &args)?;
    }
    check_ranks(world, &mesh)?;
    let names = opts.mesh_dim_names;
    let mut m = new_mesh(
        world,
        device_type,
        &mesh,
        names,
        opts.preserve_rank_order,
        Vec::new(),
    )?;
    m.groups = init_dim_groups(
        world,
        &m.layout,
        &m.root.rank_map,
        &m.dim_names,
        &overrides,
        opts.preserve_rank_order,
    )?;
    Ok(m)
}

/// A root mesh over `mesh` with this rank's `groups`.
fn new_mesh<'w>(
    world: &'w World,
    device_type: &str,
    mesh: &MeshArray,
    dim_names: Option<Vec<String>>,
    preserve_rank_order: bool,
    groups: Vec<ProcessGroup>,
) -> Result<DeviceMesh<'w>> {
    let layout = Layout::row_major(mesh.shape());
    let root = Root {
        rank_map: mesh.ranks().to_vec(),
        layout: layout.clone(),
        dim_names: dim_names.clone(),
        preserve_rank_order,
        flattened: Mutex::new(HashMap::new()),
    };
    Ok(DeviceMesh {
        world,
        device_type: device_type.to_string(),
        root: Arc::new(root),
        is_root: true,
        layout,
        dim_names,
        groups,
        rank: world.rank()?,
    })
}

/// Unique names, one per dimension.
pub(crate) fn check_names(names: &Option<Vec<String>>, ndim: usize) -> Result<()> {
    let Some(names) = names else {
        return Ok(());
    };
    let mut uniq = names.clone();
    uniq.sort();
    uniq.dedup();
    if uniq.len() != names.len() {
        return Err(DistError::invalid(format!(
            "Each mesh_dim_name must be unique. Found repeated mesh_dim_name in mesh_dim_names {}",
            py_tuple(names)
        )));
    }
    if names.len() != ndim {
        return Err(DistError::invalid(format!(
            "mesh_shape and mesh_dim_names should have same length! Found len(mesh_dim_names): {} and len(mesh_shape):{ndim}.",
            names.len()
        )));
    }
    Ok(())
}

/// "cpu", "cuda": letters only.
fn check_device_type(device_type: &str) -> Result<()> {
    if !device_type.is_empty() && !device_type.chars().all(|c| c.is_alphabetic()) {
        return Err(DistError::invalid(format!(
            "Device type with index is not supported but got {device_type}. If you maintained a 'torch.device' object, it's recommended to pass in 'device.type'."
        )));
    }
    Ok(())
}

/// The mesh fits the world: not bigger, every rank a world rank, none twice.
fn check_ranks(world: &World, mesh: &MeshArray) -> Result<()> {
    let world_size = world.world_size()?;
    let n = mesh.ranks().len();
    if n > world_size {
        return Err(DistError::invalid(format!(
            "Mesh should not be bigger than default world size {world_size}, but found {n} ranks!"
        )));
    }
    let mut seen = vec![false; world_size];
    for &r in mesh.ranks() {
        if r >= world_size {
            return Err(DistError::invalid(format!(
                "DeviceMesh: rank {r} in the mesh is not a rank of the world (size {world_size})"
            )));
        }
        if std::mem::replace(&mut seen[r], true) {
            return Err(DistError::invalid(format!(
                "DeviceMesh: rank {r} appears more than once in the mesh {mesh}"
            )));
        }
    }
    Ok(())
}

/// `_normalize_backend_override`: one override per dimension from keys that are indices or
/// names.
pub(crate) fn normalize_overrides(
    given: &[(String, BackendOverride)],
    ndim: usize,
    names: &Option<Vec<String>>,
) -> Result<Vec<BackendOverride>> {
    let mut left: Vec<&(String, BackendOverride)> = given.iter().collect();
    let mut out = Vec::with_capacity(ndim);
    for d in 0..ndim {
        let name = names.as_ref().map(|n| n[d].as_str());
        let by_name = name.and_then(|n| left.iter().position(|(k, _)| k == n));
        let by_index = left.iter().position(|(k, _)| *k == d.to_string());
        let pick = match (by_name, by_index) {
            (Some(_), Some(_)) => {
                return Err(DistError::invalid(format!(
                    "Found redundant dim index {d} and name {} in backend_override",
                    name.unwrap_or_default()
                )))
            }
            (Some(i), None) | (None, Some(i)) => left.remove(i).1.clone(),
            (None, None) => BackendOverride::default(),
        };
        out.push(pick);
    }
    if !left.is_empty() {
        let keys: Vec<String> = left.iter().map(|(k, _)| k.clone()).collect();
        let names = names
            .as_deref()
            .map(py_tuple)
            .unwrap_or_else(|| "()".into());
        return Err(DistError::invalid(format!(
            "Found invalid keys in backend_override: got {keys:?}, expected integers in range [0, {ndim}) or one of {names}"
        )));
    }
    Ok(out)
}

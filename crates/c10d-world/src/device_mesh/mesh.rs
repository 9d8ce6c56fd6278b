//! [`DeviceMesh`]: the value and its queries (`get_group`, `get_local_rank`, `get_coordinate`,
//! `size`, `shape`, `mesh`, …).

use super::layout::{unravel, Layout};
use super::options::{py_tuple, MeshArray, MeshDim};
use crate::{GroupMember, World};
use c10d_core::{DistError, ProcessGroup, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What a root mesh and every mesh sliced from it share: the rank map and the flattened
/// dimensions created so far (`_flatten_mapping`).
pub(crate) struct Root {
    pub(crate) rank_map: Vec<usize>,
    pub(crate) layout: Layout,
    pub(crate) dim_names: Option<Vec<String>>,
    pub(crate) preserve_rank_order: bool,
    pub(crate) flattened: Mutex<HashMap<String, Flattened>>,
}

impl Root {
    /// The flattened dimension `name`, when one was made.
    pub(crate) fn flattened(&self, name: &str) -> Option<Flattened> {
        let flat = self.flattened.lock().unwrap_or_else(|e| e.into_inner());
        flat.get(name).cloned()
    }
}

/// A flattened dimension of a root mesh: its layout and this rank's group (`None` outside).
#[derive(Clone)]
pub(crate) struct Flattened {
    pub(crate) axis: Layout,
    pub(crate) group: Option<ProcessGroup>,
}

/// Ranks on an n-dimensional grid with one process group per dimension
/// (`torch.distributed.device_mesh.DeviceMesh`).
///
/// Made by [`World::init_device_mesh`] (a row-major grid of the world's ranks),
/// [`DeviceMesh::new`] (an explicit [`MeshArray`]) or [`DeviceMesh::from_group`]; sliced with
/// [`DeviceMesh::slice`], flattened with [`DeviceMesh::flatten`], split with
/// [`DeviceMesh::unflatten`]. Slices share their root's groups: nothing is created by slicing.
///
/// A rank outside the mesh (a mesh smaller than the world) holds a mesh with no coordinate and
/// no groups; its group queries fail with an error saying so.
///
/// Cloning is cheap (the groups are handles). The mesh borrows the [`World`] its groups live in.
#[derive(Clone)]
pub struct DeviceMesh<'w> {
    pub(crate) world: &'w World,
    pub(crate) device_type: String,
    pub(crate) root: Arc<Root>,
    pub(crate) is_root: bool,
    pub(crate) layout: Layout,
    pub(crate) dim_names: Option<Vec<String>>,
    /// This rank's group of each dimension; empty when the rank is outside the mesh.
    pub(crate) groups: Vec<ProcessGroup>,
    pub(crate) rank: usize,
}

impl<'w> DeviceMesh<'w> {
    /// The device type the mesh was made for ("cpu", "cuda").
    pub fn device_type(&self) -> &str {
        &self.device_type
    }

    /// The dimension names (`mesh_dim_names`), `None` for an unnamed mesh.
    pub fn mesh_dim_names(&self) -> Option<&[String]> {
        self.dim_names.as_deref()
    }

    /// Number of dimensions (`ndim`).
    pub fn ndim(&self) -> usize {
        self.layout.ndim()
    }

    /// Size of each dimension (`shape`).
    pub fn shape(&self) -> Vec<usize> {
        self.layout.shape()
    }

    /// Number of ranks in the mesh (`size()`).
    pub fn size(&self) -> usize {
        self.layout.numel()
    }

    /// Size of one dimension (`size(mesh_dim)`).
    ///
    /// # Errors
    /// An unknown dimension (see [`DeviceMesh::get_group`]).
    pub fn size_of<'a>(&self, dim: impl Into<MeshDim<'a>>) -> Result<usize> {
        Ok(self.layout.axes()[self.dim_index(dim.into())?].numel())
    }

    /// This process's global rank (`get_rank`).
    pub fn get_rank(&self) -> usize {
        self.rank
    }

    /// The ranks of the mesh (`mesh`): for a mesh that is one block of its root, that block;
    /// otherwise the block holding this rank.
    ///
    /// # Errors
    /// "In order to get the mesh Tensor of a DeviceMesh it needs to either have all its original
    /// dimensions (e.g., no slicing) or it needs to contain the local rank" for a rank outside
    /// every block of a sliced mesh.
    pub fn mesh(&self) -> Result<MeshArray> {
        let blocks = self.layout.blocks(&self.root.rank_map)?;
        let block = match blocks.len() {
            1 => blocks.into_iter().next(),
            _ => blocks.into_iter().find(|b| b.contains(&self.rank)),
        };
        let block = block.ok_or_else(|| {
            DistError::invalid(
                "In order to get the mesh Tensor of a DeviceMesh it needs to either have all its original dimensions (e.g., no slicing) or it needs to contain the local rank",
            )
        })?;
        MeshArray::new(self.shape(), block)
    }

    /// This rank's index along every dimension (`get_coordinate`); `None` outside the mesh.
    pub fn get_coordinate(&self) -> Option<Vec<usize>> {
        coordinate_in(&self.mesh().ok()?, self.rank)
    }

    /// This rank's group along `dim` (`get_group(mesh_dim)`), as a [`GroupMember`] that every
    /// collective takes (`.group(&g)`), always [`GroupMember::Group`]; on a root mesh a flattened
    /// dimension's name also works.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`]: "Mesh dimension 'x' does not exist. Available mesh
    /// dimensions are: mesh_dim_names=(..)"; "No `mesh_dim_names` found." for a name on an
    /// unnamed mesh; "mesh dimension {i} is out of range for a {n}-D mesh"; "rank {r} is not part
    /// of the DeviceMesh .." outside the mesh.
    pub fn get_group<'a>(&self, dim: impl Into<MeshDim<'a>>) -> Result<GroupMember> {
        self.process_group(dim.into()).map(GroupMember::Group)
    }

    /// This rank's [`ProcessGroup`] along `dim`.
    fn process_group(&self, dim: MeshDim<'_>) -> Result<ProcessGroup> {
        if let MeshDim::Name(n) = dim {
            if let Some(f) = self.flattened(n) {
                return f.group.ok_or_else(|| self.not_member());
            }
        }
        let i = self.dim_index(dim)?;
        self.groups.get(i).cloned().ok_or_else(|| self.not_member())
    }

    /// The only group of a 1-D mesh (`get_group()` with no argument).
    ///
    /// # Errors
    /// "Found the DeviceMesh have {n} dimensions Optional kwarg `mesh_dim` needs to be specified
    /// when device_mesh.ndim > 1. ..." on a mesh of several dimensions; as
    /// [`DeviceMesh::get_group`].
    pub fn group(&self) -> Result<GroupMember> {
        if self.ndim() != 1 {
            return Err(DistError::invalid(format!(
                "Found the DeviceMesh have {} dimensions Optional kwarg `mesh_dim` needs to be specified when device_mesh.ndim > 1. If you want to get the list of all the ProcessGroups in the DeviceMesh,please use `get_all_groups()` instead.",
                self.ndim()
            )));
        }
        self.get_group(0)
    }

    /// This rank's group of every dimension, in dimension order (`get_all_groups`).
    ///
    /// # Errors
    /// As [`DeviceMesh::get_group`].
    pub fn get_all_groups(&self) -> Result<Vec<GroupMember>> {
        (0..self.ndim()).map(|d| self.get_group(d)).collect()
    }

    /// This rank's rank in its group along `dim` (`get_local_rank(mesh_dim)`).
    ///
    /// # Errors
    /// As [`DeviceMesh::get_group`].
    pub fn get_local_rank<'a>(&self, dim: impl Into<MeshDim<'a>>) -> Result<usize> {
        Ok(self.process_group(dim.into())?.rank())
    }

    /// [`DeviceMesh::get_local_rank`] of a 1-D mesh (`get_local_rank()`).
    ///
    /// # Errors
    /// As [`DeviceMesh::group`].
    pub fn local_rank(&self) -> Result<usize> {
        self.group()?;
        self.get_local_rank(0)
    }

    /// The names of this rank's groups, one per dimension (`_dim_group_names`).
    pub fn dim_group_names(&self) -> Vec<String> {
        self.groups
            .iter()
            .map(|g| g.group_name().to_string())
            .collect()
    }

    /// Aborts every group of the mesh and of its flattened dimensions (`abort()`), so that
    /// ranks blocked in a collective on them return an error.
    ///
    /// # Errors
    /// "abort() is not supported on a submesh. Call abort() on the root mesh instead."
    pub fn abort(&self) -> Result<()> {
        if !self.is_root {
            return Err(DistError::invalid(
                "abort() is not supported on a submesh. Call abort() on the root mesh instead.",
            ));
        }
        let flat = self
            .root
            .flattened
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let flat_groups = flat.values().filter_map(|f| f.group.clone());
        for g in self.groups.iter().cloned().chain(flat_groups) {
            g.abort();
        }
        Ok(())
    }

    /// The index of `dim`.
    pub(crate) fn dim_index(&self, dim: MeshDim<'_>) -> Result<usize> {
        match dim {
            MeshDim::Index(i) if i < self.ndim() => Ok(i),
            MeshDim::Index(i) => Err(DistError::invalid(format!(
                "mesh dimension {i} is out of range for a {}-D mesh",
                self.ndim()
            ))),
            MeshDim::Name(n) => self.dim_by_name(n),
        }
    }

    /// `_get_mesh_dim_by_name`.
    fn dim_by_name(&self, name: &str) -> Result<usize> {
        let names = match &self.dim_names {
            Some(n) if !n.is_empty() => n,
            _ => return Err(DistError::invalid("No `mesh_dim_names` found.")),
        };
        names.iter().position(|n| n == name).ok_or_else(|| {
            DistError::invalid(format!(
                "Mesh dimension '{name}' does not exist. Available mesh dimensions are: mesh_dim_names={}",
                py_tuple(names)
            ))
        })
    }

    /// The flattened dimension `name` of the root, when this is a root mesh.
    pub(crate) fn flattened(&self, name: &str) -> Option<Flattened> {
        if !self.is_root {
            return None;
        }
        let flat = self
            .root
            .flattened
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        flat.get(name).cloned()
    }

    fn not_member(&self) -> DistError {
        DistError::invalid(format!(
            "rank {} is not part of the DeviceMesh {self}: it has no group along its dimensions",
            self.rank
        ))
    }
}

impl std::fmt::Display for DeviceMesh<'_> {
    /// PyTorch's repr: `DeviceMesh((dp=2, tp=4), 'cpu', stride=(4, 1))`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shape = self.shape();
        let dims: Vec<String> = match &self.dim_names {
            Some(n) => n
                .iter()
                .zip(&shape)
                .map(|(n, s)| format!("{n}={s}"))
                .collect(),
            None => shape.iter().map(|s| s.to_string()).collect(),
        };
        let strides: Vec<String> = self.layout.axes().iter().map(stride_text).collect();
        let dims = if dims.len() == 1 && self.dim_names.is_none() {
            format!("({},)", dims[0])
        } else {
            format!("({})", dims.join(", "))
        };
        let strides = match strides.len() {
            1 => format!("({},)", strides[0]),
            _ => format!("({})", strides.join(", ")),
        };
        write!(
            f,
            "DeviceMesh({dims}, '{}', stride={strides})",
            self.device_type
        )
    }
}

impl std::fmt::Debug for DeviceMesh<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// `rank`'s coordinate in `mesh` (`None` when it is not there).
pub(crate) fn coordinate_in(mesh: &MeshArray, rank: usize) -> Option<Vec<usize>> {
    let i = mesh.ranks().iter().position(|&r| r == rank)?;
    Some(unravel(i, mesh.shape()))
}

/// One axis's stride as PyTorch prints it: the stride of a one-mode axis, a tuple otherwise.
fn stride_text(axis: &super::layout::Axis) -> String {
    match axis.modes() {
        [] => "0".to_string(),
        [(_, s)] => s.to_string(),
        m => {
            let s: Vec<String> = m.iter().map(|(_, s)| s.to_string()).collect();
            format!("({})", s.join(", "))
        }
    }
}

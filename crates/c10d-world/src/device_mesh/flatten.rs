//! Flattening dimensions into one (`_flatten`) and splitting one into several (`_unflatten`).
//! Both create the new dimensions' groups (collectively: every rank of the world calls them
//! in the same order, as in PyTorch).

use super::create::{check_names, normalize_overrides};
use super::groups::init_dim_groups;
use super::layout::Layout;
use super::mesh::{DeviceMesh, Flattened};
use super::options::{py_tuple, BackendOverride, MeshDim};
use c10d_core::{DistError, Result};

impl<'w> DeviceMesh<'w> {
    /// `mesh._flatten(mesh_dim_name)`: this mesh's dimensions as one, named `name` (default:
    /// the names joined by "_"), its groups created with the default backend. The root mesh
    /// remembers it: `root.slice(&[name])` and `root.get_group(name)` find it, and flattening
    /// the same dimensions under the same name again returns it without creating anything.
    ///
    /// # Errors
    /// As [`DeviceMesh::flatten_with`].
    pub fn flatten(&self, name: Option<&str>) -> Result<DeviceMesh<'w>> {
        self.flatten_with(name, BackendOverride::default())
    }

    /// [`DeviceMesh::flatten`] with a backend for the new dimension (`backend_override`).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] in PyTorch's words: "Cannot flatten a DeviceMesh without
    /// mesh_dim_names!"; "{name} already exists for submesh of the {root}. The mesh_dim_names of
    /// submesh and flattened mesh are (..). Please specify another valid mesh_dim_name.";
    /// "Flatten mesh with mesh_dim_name {name} has been created before, Please specify another
    /// valid mesh_dim_name."; group creation errors.
    pub fn flatten_with(&self, name: Option<&str>, ov: BackendOverride) -> Result<DeviceMesh<'w>> {
        let names = self.dim_names.as_ref().ok_or_else(|| {
            DistError::invalid("Cannot flatten a DeviceMesh without mesh_dim_names!")
        })?;
        let name = name
            .filter(|n| !n.is_empty())
            .map_or_else(|| names.join("_"), str::to_string);
        if self.ndim() == 1 && names.contains(&name) {
            return Ok(self.clone());
        }
        self.check_flatten_name(&name)?;
        let axis = Layout::from_axes(vec![self.layout.collapse()]);
        let flat = match self.root.flattened(&name) {
            Some(f) if f.axis == axis => f,
            Some(_) => {
                return Err(DistError::invalid(format!(
                    "Flatten mesh with mesh_dim_name {name} has been created before, Please specify another valid mesh_dim_name."
                )))
            }
            None => self.create_flattened(&name, axis, ov)?,
        };
        Ok(DeviceMesh {
            is_root: false,
            layout: flat.axis.clone(),
            dim_names: Some(vec![name]),
            groups: flat.group.into_iter().collect(),
            ..self.clone()
        })
    }

    /// `mesh._unflatten(dim, mesh_sizes, mesh_dim_names)`: dimension `dim` split into
    /// dimensions of `mesh_sizes` (outermost first) named `mesh_dim_names`, their groups
    /// created; the other dimensions keep theirs.
    ///
    /// # Errors
    /// As [`DeviceMesh::unflatten_with`].
    pub fn unflatten<'a>(
        &self,
        dim: impl Into<MeshDim<'a>>,
        mesh_sizes: &[usize],
        mesh_dim_names: &[&str],
    ) -> Result<DeviceMesh<'w>> {
        self.unflatten_with(dim, mesh_sizes, mesh_dim_names, &[])
    }

    /// [`DeviceMesh::unflatten`] with backends for the new dimensions (keys: index among the
    /// new dimensions, or name).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] in PyTorch's words: "dim {d} specified in `_unflatten` is
    /// out of range {ndim}"; "dim x specified in `_unflatten` is not in (..)"; "mesh_dim_names
    /// must have same length as mesh_sizes in _unflatten!"; "The product of mesh_sizes=(..) is
    /// {p}, but the original dimension at dim={d} has size {n}. These must be equal for
    /// unflatten to work correctly."; a repeated name; group creation errors.
    pub fn unflatten_with<'a>(
        &self,
        dim: impl Into<MeshDim<'a>>,
        mesh_sizes: &[usize],
        mesh_dim_names: &[&str],
        backend_override: &[(String, BackendOverride)],
    ) -> Result<DeviceMesh<'w>> {
        let d = self.unflatten_dim(dim.into())?;
        if mesh_sizes.len() != mesh_dim_names.len() {
            return Err(DistError::invalid(
                "mesh_dim_names must have same length as mesh_sizes in _unflatten!",
            ));
        }
        let axes = self.split_axis(d, mesh_sizes)?;
        let new_names: Vec<String> = mesh_dim_names.iter().map(|s| s.to_string()).collect();
        let mut names = self.dim_names.clone().unwrap_or_default();
        names.splice(d..=d, new_names.clone());
        check_names(&Some(names.clone()), self.ndim() - 1 + mesh_sizes.len())?;
        let part = Layout::from_axes(axes.clone());
        let ovs = normalize_overrides(backend_override, axes.len(), &Some(new_names.clone()))?;
        let new_groups = init_dim_groups(
            self.world,
            &part,
            &self.root.rank_map,
            &Some(new_names),
            &ovs,
            self.root.preserve_rank_order,
        )?;
        let mut groups = self.groups.clone();
        if !groups.is_empty() {
            groups.splice(d..=d, new_groups);
        }
        Ok(DeviceMesh {
            is_root: false,
            layout: self.layout.splice(d, axes),
            dim_names: Some(names),
            groups,
            ..self.clone()
        })
    }

    /// The index of `_unflatten`'s `dim`, with its errors.
    fn unflatten_dim(&self, dim: MeshDim<'_>) -> Result<usize> {
        let names = self.dim_names.clone().unwrap_or_default();
        match dim {
            MeshDim::Index(i) if i < self.ndim() => Ok(i),
            MeshDim::Index(i) => Err(DistError::invalid(format!(
                "dim {i} specified in `_unflatten` is out of range {}",
                self.ndim()
            ))),
            MeshDim::Name(n) => names.iter().position(|x| x == n).ok_or_else(|| {
                DistError::invalid(format!(
                    "dim {n} specified in `_unflatten` is not in {}",
                    py_tuple(&names)
                ))
            }),
        }
    }

    /// Dimension `d`'s axis split into `sizes`.
    fn split_axis(&self, d: usize, sizes: &[usize]) -> Result<Vec<super::layout::Axis>> {
        let axis = &self.layout.axes()[d];
        let product: usize = sizes.iter().product();
        if product != axis.numel() {
            let shown: Vec<String> = sizes.iter().map(usize::to_string).collect();
            return Err(DistError::invalid(format!(
                "The product of mesh_sizes=({}{}) is {product}, but the original dimension at dim={d} has size {}. These must be equal for unflatten to work correctly.",
                shown.join(", "),
                if sizes.len() == 1 { "," } else { "" },
                axis.numel()
            )));
        }
        axis.split(sizes)
    }

    /// A flattened name must not name a dimension of the root.
    fn check_flatten_name(&self, name: &str) -> Result<()> {
        let root_names = self.root.dim_names.clone().unwrap_or_default();
        if root_names.iter().any(|n| n == name) {
            return Err(DistError::invalid(format!(
                "{name} already exists for submesh of the {}. The mesh_dim_names of submesh and flattened mesh are {}. Please specify another valid mesh_dim_name.",
                self.root_text(),
                py_tuple(&root_names)
            )));
        }
        Ok(())
    }

    /// Creates the flattened dimension's groups and records it in the root (the lock is not
    /// held while the groups are created).
    fn create_flattened(&self, name: &str, axis: Layout, ov: BackendOverride) -> Result<Flattened> {
        let groups = init_dim_groups(
            self.world,
            &axis,
            &self.root.rank_map,
            &Some(vec![name.to_string()]),
            &[ov],
            self.root.preserve_rank_order,
        )?;
        let f = Flattened {
            axis,
            group: groups.into_iter().next(),
        };
        let mut flat = self
            .root
            .flattened
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Ok(flat.entry(name.to_string()).or_insert(f).clone())
    }

    /// The root mesh as PyTorch prints it.
    fn root_text(&self) -> String {
        let root = DeviceMesh {
            is_root: true,
            layout: self.root.layout.clone(),
            dim_names: self.root.dim_names.clone(),
            groups: Vec::new(),
            ..self.clone()
        };
        root.to_string()
    }
}

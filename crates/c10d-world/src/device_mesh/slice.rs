//! Slicing a mesh by dimension names (`mesh["tp"]`, `mesh["dp", "cp"]`): the sliced mesh
//! reuses the groups of the dimensions it keeps; nothing is created and no rank talks to
//! another.

use super::layout::{Axis, Layout};
use super::mesh::DeviceMesh;
use super::options::{py_list, py_tuple};
use c10d_core::{DistError, ProcessGroup, Result};

impl<'w> DeviceMesh<'w> {
    /// The mesh of the dimensions `names` (`mesh[names]`), in that order, which must be the
    /// order they have in this mesh. On a root mesh, names of flattened dimensions are accepted
    /// too. Slicing all dimensions in order gives the mesh itself.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] in PyTorch's words: "Cannot slice a DeviceMesh without
    /// mesh_dim_names!"; "Invalid mesh_dim_names ('x',) specified. Valid mesh_dim_names are
    /// ['dp', 'tp']."; "Invalid mesh_dim_names ('tp', 'dp') specified. Mesh dim indices should be
    /// in ascending order."; "Slicing overlapping dim_names (..) is not allowed."
    pub fn slice(&self, names: &[&str]) -> Result<DeviceMesh<'w>> {
        let own = self.dim_names.as_ref().ok_or_else(|| {
            DistError::invalid("Cannot slice a DeviceMesh without mesh_dim_names!")
        })?;
        let wanted: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        if &wanted == own {
            return Ok(self.clone());
        }
        let picked: Vec<(Axis, Option<ProcessGroup>)> = names
            .iter()
            .map(|n| self.pick(n))
            .collect::<Option<_>>()
            .ok_or_else(|| self.invalid_names(&wanted))?;
        let layout = Layout::from_axes(picked.iter().map(|p| p.0.clone()).collect());
        check_slice(&layout, &wanted)?;
        let groups = match self.groups.is_empty() {
            true => Vec::new(),
            false => picked.into_iter().filter_map(|p| p.1).collect(),
        };
        Ok(DeviceMesh {
            is_root: false,
            layout,
            dim_names: Some(wanted),
            groups,
            ..self.clone()
        })
    }

    /// The axis and this rank's group of dimension `name`: one of this mesh's, or on a root
    /// mesh a flattened one.
    fn pick(&self, name: &str) -> Option<(Axis, Option<ProcessGroup>)> {
        let own = self.dim_names.as_ref()?;
        if let Some(i) = own.iter().position(|n| n == name) {
            return Some((self.layout.axes()[i].clone(), self.groups.get(i).cloned()));
        }
        let f = self.flattened(name)?;
        Some((f.axis.axes()[0].clone(), f.group))
    }

    fn invalid_names(&self, wanted: &[String]) -> DistError {
        let mut valid: Vec<String> = self.dim_names.clone().unwrap_or_default();
        if self.is_root {
            let flat = self
                .root
                .flattened
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut extra: Vec<String> = flat.keys().cloned().collect();
            extra.sort();
            valid.extend(extra);
        }
        DistError::invalid(format!(
            "Invalid mesh_dim_names {} specified. Valid mesh_dim_names are {}.",
            py_tuple(wanted),
            py_list(&valid)
        ))
    }
}

/// The sliced dimensions keep the root's order and do not overlap.
fn check_slice(layout: &Layout, names: &[String]) -> Result<()> {
    if !layout.is_sorted() {
        return Err(DistError::invalid(format!(
            "Invalid mesh_dim_names {} specified. Mesh dim indices should be in ascending order.",
            py_tuple(names)
        )));
    }
    if !layout.is_orthogonal() {
        return Err(DistError::invalid(format!(
            "Slicing overlapping dim_names {} is not allowed.",
            py_tuple(names)
        )));
    }
    Ok(())
}

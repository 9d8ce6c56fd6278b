//! The arguments of mesh creation: [`MeshArray`] (an explicit rank layout), [`MeshDim`] (a
//! dimension by index or name), [`BackendOverride`] and [`MeshOptions`].

use crate::world::PgOptions;
use c10d_core::{DistError, Result};

/// An n-dimensional array of global ranks: `shape` and the ranks in row-major order (the
/// `mesh` argument of `DeviceMesh(device_type, mesh)`; what [`DeviceMesh::mesh`](super::DeviceMesh::mesh) returns).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeshArray {
    shape: Vec<usize>,
    ranks: Vec<usize>,
}

impl MeshArray {
    /// An array of `shape` holding `ranks` row-major.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "mesh of shape [..] needs N ranks, got M" when the
    /// product of `shape` is not `ranks.len()`, and for an empty shape.
    pub fn new(shape: Vec<usize>, ranks: Vec<usize>) -> Result<MeshArray> {
        let n: usize = shape.iter().product();
        if shape.is_empty() || n != ranks.len() {
            return Err(DistError::invalid(format!(
                "mesh of shape {shape:?} needs {n} ranks, got {}",
                ranks.len()
            )));
        }
        Ok(MeshArray { shape, ranks })
    }

    /// A 2-D array from its rows.
    ///
    /// # Errors
    /// As [`MeshArray::new`], for rows of different lengths.
    pub fn from_rows(rows: &[Vec<usize>]) -> Result<MeshArray> {
        let cols = rows.first().map_or(0, Vec::len);
        MeshArray::new(vec![rows.len(), cols], rows.concat())
    }

    /// Size of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The ranks, row-major.
    pub fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// The rank at `coordinate` (one index per dimension); `None` outside the array.
    pub fn get(&self, coordinate: &[usize]) -> Option<usize> {
        if coordinate.len() != self.shape.len() {
            return None;
        }
        let mut i = 0;
        for (&c, &s) in coordinate.iter().zip(&self.shape) {
            if c >= s {
                return None;
            }
            i = i * s + c;
        }
        Some(self.ranks[i])
    }
}

impl From<Vec<usize>> for MeshArray {
    /// A 1-D array.
    fn from(ranks: Vec<usize>) -> MeshArray {
        MeshArray {
            shape: vec![ranks.len()],
            ranks,
        }
    }
}

impl std::fmt::Display for MeshArray {
    /// Nested lists, as `mesh.tolist()` prints: `[[0, 1], [2, 3]]`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn nest(f: &mut std::fmt::Formatter<'_>, shape: &[usize], r: &[usize]) -> std::fmt::Result {
            let Some((&n, inner)) = shape.split_first() else {
                return write!(f, "{}", r[0]);
            };
            let step = inner.iter().product::<usize>();
            write!(f, "[")?;
            for i in 0..n {
                if i > 0 {
                    write!(f, ", ")?;
                }
                nest(f, inner, &r[i * step..(i + 1) * step])?;
            }
            write!(f, "]")
        }
        nest(f, &self.shape, &self.ranks)
    }
}

/// A mesh dimension, by index or by name (PyTorch's `mesh_dim: int | str`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MeshDim<'a> {
    /// The dimension's index.
    Index(usize),
    /// The dimension's name (`mesh_dim_names`), or a flattened dimension's name on a root mesh.
    Name(&'a str),
}

impl From<usize> for MeshDim<'_> {
    fn from(i: usize) -> Self {
        MeshDim::Index(i)
    }
}

impl<'a> From<&'a str> for MeshDim<'a> {
    fn from(n: &'a str) -> Self {
        MeshDim::Name(n)
    }
}

impl<'a> From<&'a String> for MeshDim<'a> {
    fn from(n: &'a String) -> Self {
        MeshDim::Name(n)
    }
}

/// A per-dimension backend choice (a value of `backend_override`): the backend string
/// ("gloo", "cpu:gloo", a registered name) and/or its options; `None` = the default group's.
#[derive(Clone, Debug, Default)]
pub struct BackendOverride {
    /// Backend string of the dimension's groups.
    pub backend: Option<String>,
    /// Backend options; their `timeout` becomes the groups' timeout, as in PyTorch.
    pub pg_options: Option<PgOptions>,
}

impl BackendOverride {
    /// A backend by name.
    pub fn backend(name: &str) -> BackendOverride {
        BackendOverride {
            backend: Some(name.to_string()),
            pg_options: None,
        }
    }

    pub(crate) fn is_none(&self) -> bool {
        self.backend.is_none() && self.pg_options.is_none()
    }
}

/// Optional arguments of [`World::init_device_mesh_with`](crate::World::init_device_mesh_with)
/// and [`DeviceMesh::new`](super::DeviceMesh::new).
#[derive(Clone, Debug)]
pub struct MeshOptions {
    /// One unique name per dimension (`mesh_dim_names`); `None` = unnamed ("dim_0", … in group
    /// descriptions).
    pub mesh_dim_names: Option<Vec<String>>,
    /// `backend_override`: keys are dimension indices (as strings: "0") or names; every other
    /// dimension uses the default group's backend.
    pub backend_override: Vec<(String, BackendOverride)>,
    /// `preserve_rank_order`: groups keep the mesh's rank order instead of sorting, and a
    /// world-sized permuted dimension gets its own group.
    pub preserve_rank_order: bool,
    /// Check through the default store that every rank passed the same arguments, and fail
    /// on every rank naming the first rank that differs (default `true`). A departure from
    /// PyTorch, which hangs on a mismatch; turn it off in a job whose PyTorch ranks build the
    /// same mesh (they do not take part in the check).
    pub check_arguments: bool,
}

impl Default for MeshOptions {
    fn default() -> Self {
        MeshOptions {
            mesh_dim_names: None,
            backend_override: Vec::new(),
            preserve_rank_order: false,
            check_arguments: true,
        }
    }
}

impl MeshOptions {
    /// Options with these dimension names.
    pub fn named(names: &[&str]) -> MeshOptions {
        MeshOptions {
            mesh_dim_names: Some(names.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }
    }
}

/// `names` as Python prints a tuple of strings: `('dp', 'tp')`, `('dp',)`.
pub(crate) fn py_tuple(names: &[String]) -> String {
    let inner: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    match inner.len() {
        1 => format!("({},)", inner[0]),
        _ => format!("({})", inner.join(", ")),
    }
}

/// `names` as Python prints a list of strings: `['dp', 'tp']`.
pub(crate) fn py_list(names: &[String]) -> String {
    let inner: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    format!("[{}]", inner.join(", "))
}

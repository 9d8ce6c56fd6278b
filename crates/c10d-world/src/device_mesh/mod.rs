//! `torch.distributed.device_mesh`: ranks on an n-dimensional grid with named dimensions and
//! one process group per dimension, the group-management half of PyTorch's `DeviceMesh` (no
//! DTensor).
//!
//! ```no_run
//! use c10d_world as dist;
//! # fn main() -> c10d_core::Result<()> {
//! // 4 ranks: data parallel × tensor parallel
//! let mesh = dist::init_device_mesh("cpu", &[2, 2], Some(&["dp", "tp"]))?;
//! let tp = mesh.get_group("tp")?; // this rank's row
//! let dp = mesh.slice(&["dp"])?;  // a 1-D mesh over this rank's column
//! println!("{mesh}: coordinate {:?}, dp rank {}", mesh.get_coordinate(), dp.local_rank()?);
//! # let _ = tp; Ok(()) }
//! ```
//!
//! Group creation follows PyTorch's `_init_one_process_group` step for step (see `groups.rs`),
//! so a PyTorch rank and a Rust rank of one job create the same groups under the same names.
//!
//! Departures from PyTorch: every rank's arguments are compared through the store before any
//! group is made, and a mismatch fails on every rank naming the rank and the argument
//! ([`MeshOptions::check_arguments`]; PyTorch hangs); [`DeviceMesh::from_group`] checks that
//! each group holds the mesh's ranks along its dimension; a rank outside the mesh gets an error
//! from group queries instead of an `IndexError`. No device is selected: c10d-nccl picks the
//! device from `LOCAL_RANK` itself. No thread-local "current mesh" (`with mesh:`), which only
//! DTensor uses.
//!
//! | file | owns |
//! |---|---|
//! | `layout.rs` | where each dimension's ranks sit in the rank map (PyTorch's CuTe layouts) |
//! | `options.rs` | [`MeshArray`], [`MeshDim`], [`BackendOverride`], [`MeshOptions`] |
//! | `mesh.rs` | [`DeviceMesh`] and its queries |
//! | `create.rs` | `init_device_mesh`, `DeviceMesh::new`, `from_group`, argument checks |
//! | `agree.rs` | the cross-rank argument check |
//! | `groups.rs` | one group per dimension, as PyTorch makes them |
//! | `slice.rs` | `mesh[names]` |
//! | `flatten.rs` | `_flatten`, `_unflatten` |

mod agree;
mod create;
mod flatten;
mod groups;
mod layout;
mod mesh;
mod options;
mod slice;

pub use mesh::DeviceMesh;
pub use options::{BackendOverride, MeshArray, MeshDim, MeshOptions};

/// `torch.distributed.device_mesh.init_device_mesh(device_type, mesh_shape, mesh_dim_names)`
/// on [`World::global`](crate::World::global); see [`World::init_device_mesh`](crate::World::init_device_mesh).
///
/// # Errors
/// As [`World::init_device_mesh`](crate::World::init_device_mesh).
pub fn init_device_mesh(
    device_type: &str,
    mesh_shape: &[usize],
    mesh_dim_names: Option<&[&str]>,
) -> c10d_core::Result<DeviceMesh<'static>> {
    crate::World::global().init_device_mesh(device_type, mesh_shape, mesh_dim_names)
}

//! The built-in NCCL backend creators (`"nccl"`, `"nccl2"`, `"nccl-legacy"`, `"nccl-lazy"`):
//! c10d-nccl's `ProcessGroupNccl` with the user's `NcclOptions` or the defaults, initialised
//! eagerly or lazily as each name asks (feature `nccl`).

use crate::plugin::{BackendCreateArgs, Plugin};
use c10d_core::{Backend, Result};
use std::sync::Arc;

/// When a built-in NCCL backend makes its communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NcclInit {
    /// At group creation, on `device_id` or else the rank's default device (PyTorch 2.15's
    /// `"nccl"` / `"nccl2"`).
    Eager,
    /// On `device_id` at group creation, else at the first op (`"nccl-legacy"`, `"nccl-lazy"`,
    /// and `"nccl"` under `TORCH_DIST_USE_NCCL2=0`).
    Lazy,
}

/// The built-in NCCL backend names and how each initialises (PyTorch 2.15: `"nccl"` builds
/// the eager `ProcessGroupNCCL2` unless `TORCH_DIST_USE_NCCL2=0`, `"nccl-legacy"` the old lazy
/// `ProcessGroupNCCL`, `"nccl-lazy"` one whose point-to-point communicators are made lazily).
/// All of them are c10d-nccl's `ProcessGroupNccl`; departures: `"nccl-lazy"` runs
/// point-to-point ops on the group's communicator (no communicator per pair), and
/// `TORCH_DIST_USE_NCCL2` is read at each group's creation (PyTorch reads it once).
fn init_rule(name: &str) -> fn() -> NcclInit {
    match name {
        "nccl" => nccl_default_init,
        "nccl2" => || NcclInit::Eager,
        _ => || NcclInit::Lazy,
    }
}

/// `"nccl"`'s init: eager unless `TORCH_DIST_USE_NCCL2=0`.
fn nccl_default_init() -> NcclInit {
    match std::env::var("TORCH_DIST_USE_NCCL2").as_deref() {
        Ok("0") => NcclInit::Lazy,
        _ => NcclInit::Eager,
    }
}

/// A built-in NCCL creator: a [`c10d_nccl::ProcessGroupNccl`] with the user's `pg_options` (a
/// [`c10d_nccl::NcclOptions`]) or the defaults, bound to `device_id` when the group has one,
/// or to the rank's default device when `init` is eager. Never a panic: without a GPU or NCCL,
/// c10d-nccl's reason.
fn create_nccl(a: &BackendCreateArgs, init: NcclInit) -> Result<Option<Arc<dyn Backend>>> {
    let bopts = a.backend_options("nccl");
    let options = match a
        .pg_options
        .as_ref()
        .and_then(|o| o.downcast_ref::<c10d_nccl::NcclOptions>())
    {
        Some(user) => c10d_nccl::NcclOptions {
            timeout: a.timeout,
            group_name: bopts.group_name.clone(),
            group_desc: bopts.group_desc.clone(),
            global_ranks: bopts.global_ranks.clone(),
            ..user.clone()
        },
        None => {
            c10d_nccl::NcclOptions::from_backend_options(&bopts, &c10d_nccl::NcclEnv::default())
        }
    };
    let pg = c10d_nccl::ProcessGroupNccl::new(a.store.clone(), a.group_rank, a.group_size, options)
        .map_err(|e| {
            e.map_message(|m| {
                format!("{m}\nBackend nccl is not available in this process; use backend \"gloo\"")
            })
        })?;
    match (a.device_id, init) {
        (Some(d @ c10d_core::Device::Cuda(_)), _) => pg.bind(d)?,
        (_, NcclInit::Eager) => pg.bind(pg.default_device()?)?,
        (_, NcclInit::Lazy) => {}
    }
    Ok(Some(Arc::new(pg)))
}

/// The registry entry of the built-in NCCL name `name`.
pub(crate) fn plugin(name: &str) -> Plugin {
    let init = init_rule(name);
    Plugin {
        creator: Arc::new(move |a: &BackendCreateArgs| create_nccl(a, init())),
        extended_api: true,
        // Usable where c10d-nccl finds NCCL and a GPU.
        available: true,
        probe: Some(c10d_nccl::is_nccl_available),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_initialises_as_pytorch_2_15_does() {
        assert_eq!(init_rule("nccl")(), NcclInit::Eager);
        assert_eq!(init_rule("nccl2")(), NcclInit::Eager);
        assert_eq!(init_rule("nccl-legacy")(), NcclInit::Lazy);
        assert_eq!(init_rule("nccl-lazy")(), NcclInit::Lazy);
    }
}

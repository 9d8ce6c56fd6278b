//! The built-in `"gloo"` backend creator: a `c10d_gloo::ProcessGroupGloo` over the group's
//! prefixed store, wrapped in `c10d_core::staging::Staged` so that it takes CUDA tensors too
//! (copied through host memory, as PyTorch's Gloo does).
//!
//! Options: a `c10d_gloo::GlooOptions` passed as [`crate::PgOptions::backend_specific`] is used
//! as given, with timeout, group name/description and global ranks overwritten by the group's;
//! otherwise `GlooOptions::from_backend_options` (which honours `TORCH_GLOO_LAZY_INIT=1`). The
//! listen-address hint is `MASTER_ADDR` or the host of a `tcp://` init method.

use crate::plugin::{BackendCreateArgs, Plugin};
use c10d_core::staging::Staged;
use c10d_core::{Backend, Result};
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use std::sync::Arc;

/// The registry entry of `"gloo"`.
pub(crate) fn plugin() -> Plugin {
    Plugin {
        creator: Arc::new(create_gloo),
        extended_api: true,
        available: true,
        probe: None,
    }
}

/// Creator registered under `"gloo"`.
fn create_gloo(args: &BackendCreateArgs) -> Result<Option<Arc<dyn Backend>>> {
    let base = args.backend_options("gloo");
    let mut o = match args
        .pg_options
        .as_ref()
        .and_then(|p| p.downcast_ref::<GlooOptions>())
    {
        Some(g) => {
            let mut g = g.clone();
            g.timeout = base.timeout;
            g.group_name = base.group_name.clone();
            g.group_desc = base.group_desc.clone();
            g.global_ranks = base.global_ranks.clone();
            g
        }
        None => GlooOptions::from_backend_options(&base),
    };
    if o.hostname_hint.is_none() {
        o.hostname_hint = args.hostname_hint.clone();
    }
    let pg: Arc<dyn Backend> =
        ProcessGroupGloo::new(args.store.clone(), args.group_rank, args.group_size, o)?;
    // CUDA tensors (`"cuda:gloo"`) are staged through host memory, as PyTorch's Gloo does.
    Ok(Some(Arc::new(Staged::new(pg))))
}

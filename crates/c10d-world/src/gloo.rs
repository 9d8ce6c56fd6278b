//! The built-in `"gloo"` backend creator.
//!
//! Builds a `c10d_gloo::ProcessGroupGloo` over the group's prefixed store once that crate provides
//! it. Until then the creator reports the backend as unavailable (and
//! [`crate::is_backend_available`]`("gloo")` is false) so callers get a clear error instead of a
//! hang.

use crate::config::BackendCreateArgs;
use c10d_core::{Backend, DistError, Result};
use std::sync::Arc;

/// Whether the gloo backend can be created in this build.
pub(crate) const GLOO_AVAILABLE: bool = false;

/// Creator registered under `"gloo"`.
pub(crate) fn create_gloo(args: &BackendCreateArgs) -> Result<Option<Arc<dyn Backend>>> {
    Err(DistError::unsupported(format!(
        "Backend gloo is not available in this build of c10d-world (group {:?}, rank {})",
        args.group_name, args.group_rank
    )))
}

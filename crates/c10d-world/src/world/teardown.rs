//! Ending groups: `destroy_process_group` and `_abort_process_group`.

use super::{GroupMember, World};
use c10d_core::{DistError, ProcessGroup, Result};
use std::sync::Arc;

impl World {
    /// `destroy_process_group(group)`: `None` or WORLD shuts every group down (reverse name order),
    /// clears all maps and tags and resets the counter; another group is shut down and removed;
    /// the non-member sentinel is a no-op.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Invalid process group specified" for unknown or destroyed groups.
    pub fn destroy_process_group(&self, group: Option<&GroupMember>) -> Result<()> {
        self.teardown(group, false)
    }

    /// `_abort_process_group(group)`: as [`World::destroy_process_group`] but aborts backends
    /// (pending works fail) instead of shutting them down.
    ///
    /// # Errors
    /// "Invalid process group specified or has been destroyed."
    pub fn abort_process_group(&self, group: Option<&GroupMember>) -> Result<()> {
        self.teardown(group, true)
    }

    fn teardown(&self, group: Option<&GroupMember>, abort: bool) -> Result<()> {
        let err = || {
            DistError::invalid(if abort {
                "Invalid process group specified or has been destroyed."
            } else {
                "Invalid process group specified"
            })
        };
        let pg = match group {
            Some(GroupMember::NonGroupMember) => return Ok(()),
            Some(GroupMember::Group(g)) => g.clone(),
            None => self.lock().default_pg.clone().ok_or_else(err)?,
        };
        let mut st = self.lock();
        if st.entry(&pg).is_none() {
            return Err(err());
        }
        let all = group.is_none() || st.is_world(&pg);
        if all {
            let mut groups = std::mem::take(&mut st.groups);
            st.default_pg = None;
            st.tags_to_pg.clear();
            st.registry.clear();
            st.group_count = 0;
            st.coalescing = None;
            st.init_method = None;
            drop(st);
            groups.sort_by(|a, b| b.pg.group_name().cmp(a.pg.group_name()));
            for g in groups {
                stop_backends(&g.pg, abort);
            }
        } else {
            st.groups.retain(|e| !e.pg.ptr_eq(&pg));
            for v in st.tags_to_pg.values_mut() {
                v.retain(|g| !g.ptr_eq(&pg));
            }
            let name = pg.group_name().to_string();
            if st.registry.get(&name).is_some_and(|g| g.ptr_eq(&pg)) {
                st.registry.remove(&name);
            }
            drop(st);
            stop_backends(&pg, abort);
        }
        Ok(())
    }
}

/// Shuts down (or aborts) each distinct backend of `pg` once: a backend serving several device
/// types (gloo for cpu and cuda) is registered under each of them.
pub(crate) fn stop_backends(pg: &ProcessGroup, abort: bool) {
    let mut seen: Vec<*const ()> = Vec::new();
    for (_, b) in pg.backends() {
        let p = Arc::as_ptr(&b) as *const ();
        if seen.contains(&p) {
            continue;
        }
        seen.push(p);
        if abort {
            b.abort()
        } else {
            b.shutdown()
        }
    }
}

//! The maps of groups: registration under names and tags, group naming, the name registry.

use super::{GroupEntry, State, World};
use c10d_core::{DistError, ProcessGroup, Result};

impl World {
    /// Registers a group in the maps (`_register_pg_in_world`): tag `pg_tag` when given, else
    /// "ptd:<name>" plus "" ; and the name registry.
    pub(super) fn register_pg(&self, mut e: GroupEntry, pg_tag: Option<String>) -> Result<()> {
        let mut st = self.lock();
        let name = e.pg.group_name().to_string();
        if st.groups.iter().any(|x| x.pg.group_name() == name) {
            return Err(DistError::invalid(
                "The specified group name has already been created, please use a different group name",
            ));
        }
        match pg_tag {
            Some(t) => {
                e.tag = t.clone();
                st.tags_to_pg.entry(t).or_default().push(e.pg.clone());
            }
            None => {
                let t = format!("ptd:{name}");
                e.tag = t.clone();
                st.tags_to_pg.entry(t).or_default().push(e.pg.clone());
                st.tags_to_pg
                    .entry(String::new())
                    .or_default()
                    .push(e.pg.clone());
            }
        }
        st.registry.insert(name, e.pg.clone());
        st.groups.push(e);
        Ok(())
    }

    /// Registers `group` under `name` (`_register_process_group`), replacing any previous one.
    pub fn register_process_group(&self, name: &str, group: &ProcessGroup) {
        self.lock().registry.insert(name.to_string(), group.clone());
    }

    /// Looks a group up by name (`_resolve_process_group`). Every created group is registered
    /// under its group name.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Could not resolve the process group registered under the name {name}".
    pub fn resolve_process_group(&self, name: &str) -> Result<ProcessGroup> {
        self.lock().registry.get(name).cloned().ok_or_else(|| {
            DistError::invalid(format!(
                "Could not resolve the process group registered under the name {name}"
            ))
        })
    }

    /// Removes a name from the registry (`_unregister_process_group`); unknown names are ignored.
    pub fn unregister_process_group(&self, name: &str) {
        self.lock().registry.remove(name);
    }

    /// Clears the name registry (`_unregister_all_process_groups`).
    pub fn unregister_all_process_groups(&self) {
        self.lock().registry.clear();
    }
}

/// SHA-1 hex of `"<ranks joined by _>_<counter>"` (`_hash_ranks_to_str`).
pub fn hash_ranks_to_str(ranks: &[usize], counter: usize) -> String {
    use sha1::{Digest, Sha1};
    let mut s: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    s.push(counter.to_string());
    let digest = Sha1::digest(s.join("_").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// `_process_group_name`: hashed or `str(counter)`; advances the counter either way.
pub(crate) fn process_group_name(st: &mut State, ranks: &[usize], hashed: bool) -> String {
    let name = if hashed {
        hash_ranks_to_str(ranks, st.group_count)
    } else {
        st.group_count.to_string()
    };
    st.group_count += 1;
    name
}

pub(super) fn find_pg_by_ranks_and_tag(
    st: &State,
    tag: &str,
    ranks: &[usize],
) -> Option<ProcessGroup> {
    let tag = if !tag.is_empty() && !tag.starts_with("ptd:") && !tag.starts_with("user:") {
        format!("user:{tag}")
    } else {
        tag.to_string()
    };
    for g in st.tags_to_pg.get(&tag)? {
        if g.size() != ranks.len() {
            continue;
        }
        let granks = st.entry(g).map(|e| e.ranks.clone()).unwrap_or_default();
        if ranks.iter().all(|r| granks.contains(r)) {
            return Some(g.clone());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha1_names_match_pytorch() {
        // hashlib.sha1(b"0_1_6").hexdigest()
        let h = hash_ranks_to_str(&[0, 1], 6);
        assert!(h.starts_with("3722ef32") && h.ends_with("7206"), "{h}");
        assert_eq!(h.len(), 40);
    }
}

//! How a functional collective names its group (`RANK_TYPES` + tag in
//! `torch.distributed._functional_collectives`): a registered group name, a group handle, a
//! [`GroupMember`], a [`DeviceMesh`] (1-D) or a mesh and one of its dimensions, or a rank list
//! (or list of equal-size rank lists) plus a tag.

use c10d_core::{DistError, ProcessGroup, Result};
use c10d_world::{DeviceMesh, GroupMember, MeshDim, World};

/// A group argument of a functional collective.
#[derive(Clone, Debug)]
pub enum GroupRef<'a> {
    /// A name in the world's group registry (`_resolve_process_group(name)`); every group is
    /// registered under its group name ("0" for WORLD, "1", ...).
    Name(&'a str),
    /// A group handle.
    Group(&'a ProcessGroup),
    /// What group creation returned (the non-member sentinel is refused).
    Member(&'a GroupMember),
    /// A mesh and, for a mesh of several dimensions, the dimension (PyTorch's `DeviceMesh` and
    /// `(DeviceMesh, int)`; a name works too): this rank's group along it.
    Mesh(&'a DeviceMesh<'a>, Option<MeshDim<'a>>),
    /// Ranks + tag (deprecated in PyTorch, which warns): one rank list, or several lists of equal
    /// size of which this rank's is used (`_expand_group`). The group is found by tag and ranks
    /// or created with that tag (`_find_or_create_pg_by_ranks_and_tag`). As in PyTorch, creation
    /// makes only this rank's list with `new_group`, which every rank of the world must call in
    /// the same order: with a single list spanning the world that holds; with several lists,
    /// create the groups beforehand on every rank (`World::new_group_with_tag`) so they are found.
    Ranks {
        /// The rank lists.
        ranks: Vec<Vec<usize>>,
        /// The tag ("" = untagged groups and WORLD).
        tag: &'a str,
    },
}

impl<'a> GroupRef<'a> {
    /// One rank list plus tag.
    pub fn ranks(ranks: &[usize], tag: &'a str) -> GroupRef<'a> {
        GroupRef::Ranks {
            ranks: vec![ranks.to_vec()],
            tag,
        }
    }

    /// Several rank lists (a 2-D rank layout) plus tag.
    pub fn rank_lists(lists: &[Vec<usize>], tag: &'a str) -> GroupRef<'a> {
        GroupRef::Ranks {
            ranks: lists.to_vec(),
            tag,
        }
    }

    /// The group this argument names in `world`.
    ///
    /// # Errors
    /// "Could not resolve the process group registered under the name X"; "Only 1D mesh is
    /// supported, pass in (DeviceMesh, int) together if mesh > 1D"; the mesh's group errors
    /// (unknown dimension, rank outside the mesh); "group sizes must be
    /// identical" for rank lists of different sizes; "this rank is not a member of the group
    /// (GroupMember.NON_GROUP_MEMBER)"; "rankset doesn't include the current node"; group
    /// creation errors.
    pub fn resolve(&self, world: &World) -> Result<ProcessGroup> {
        match self {
            GroupRef::Name(n) => world.resolve_process_group(n),
            GroupRef::Group(g) => Ok((*g).clone()),
            GroupRef::Member(m) => (*m).clone().into_group(),
            GroupRef::Mesh(mesh, None) if mesh.ndim() != 1 => Err(DistError::invalid(
                "Only 1D mesh is supported, pass in (DeviceMesh, int) together if mesh > 1D",
            )),
            GroupRef::Mesh(mesh, dim) => mesh
                .get_group(dim.unwrap_or(MeshDim::Index(0)))?
                .into_group(),
            GroupRef::Ranks { ranks, tag } => {
                let (flat, group_size) = expand_group(ranks)?;
                log::warn!(
                    "The combination of ranks + tag as process group identifier has been deprecated. \
                     Please switch to using ProcessGroup, DeviceMesh, or group name instead."
                );
                world.find_or_create_pg_by_ranks_and_tag(tag, &flat, group_size)
            }
        }
    }
}

/// `_expand_group`: the flattened ranks and the group size (the length of each list).
///
/// # Errors
/// "group sizes must be identical" when lists differ in length; "group must not be empty".
pub fn expand_group(ranks: &[Vec<usize>]) -> Result<(Vec<usize>, usize)> {
    let size = ranks
        .first()
        .map(Vec::len)
        .ok_or_else(|| DistError::invalid("group must not be empty"))?;
    if ranks.iter().any(|r| r.len() != size) {
        return Err(DistError::invalid("group sizes must be identical"));
    }
    if size == 0 {
        return Err(DistError::invalid("group must not be empty"));
    }
    Ok((ranks.concat(), size))
}

impl<'a> From<&'a str> for GroupRef<'a> {
    fn from(n: &'a str) -> Self {
        GroupRef::Name(n)
    }
}

impl<'a> From<&'a String> for GroupRef<'a> {
    fn from(n: &'a String) -> Self {
        GroupRef::Name(n)
    }
}

impl<'a> From<&'a ProcessGroup> for GroupRef<'a> {
    fn from(g: &'a ProcessGroup) -> Self {
        GroupRef::Group(g)
    }
}

impl<'a> From<&'a DeviceMesh<'a>> for GroupRef<'a> {
    /// A 1-D mesh (`group=mesh`).
    fn from(m: &'a DeviceMesh<'a>) -> Self {
        GroupRef::Mesh(m, None)
    }
}

impl<'a> From<(&'a DeviceMesh<'a>, usize)> for GroupRef<'a> {
    /// A mesh dimension by index (`group=(mesh, dim)`).
    fn from((m, d): (&'a DeviceMesh<'a>, usize)) -> Self {
        GroupRef::Mesh(m, Some(MeshDim::Index(d)))
    }
}

impl<'a> From<(&'a DeviceMesh<'a>, &'a str)> for GroupRef<'a> {
    /// A mesh dimension by name.
    fn from((m, d): (&'a DeviceMesh<'a>, &'a str)) -> Self {
        GroupRef::Mesh(m, Some(MeshDim::Name(d)))
    }
}

impl<'a> From<&'a GroupMember> for GroupRef<'a> {
    fn from(m: &'a GroupMember) -> Self {
        GroupRef::Member(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_group_rules() {
        assert_eq!(
            expand_group(&[vec![0], vec![1, 2, 3]])
                .unwrap_err()
                .to_string(),
            "group sizes must be identical"
        );
        assert_eq!(
            expand_group(&[vec![0, 1], vec![2, 3]]).unwrap(),
            (vec![0, 1, 2, 3], 2)
        );
        assert_eq!(expand_group(&[vec![3, 1]]).unwrap(), (vec![3, 1], 2));
    }
}

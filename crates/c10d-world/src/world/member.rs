//! What group creation returns on one rank: the group or PyTorch's non-member sentinel.

use c10d_core::{DistError, ProcessGroup, Result};

/// `GroupMember.NON_GROUP_MEMBER`'s value in PyTorch (−100).
pub const NON_GROUP_MEMBER_VALUE: i64 = -100;

/// What group creation returns on one rank: the group, or PyTorch's `GroupMember.NON_GROUP_MEMBER`
/// sentinel on ranks outside it. Collectives given a non-member group warn and do nothing.
#[derive(Clone, Debug)]
pub enum GroupMember {
    /// This rank belongs to the group.
    Group(ProcessGroup),
    /// This rank is not in the group (`GroupMember.NON_GROUP_MEMBER`, value −100).
    NonGroupMember,
}

impl GroupMember {
    /// The group, or `None` for the non-member sentinel.
    pub fn group(&self) -> Option<&ProcessGroup> {
        match self {
            GroupMember::Group(g) => Some(g),
            GroupMember::NonGroupMember => None,
        }
    }
    /// True for the non-member sentinel.
    pub fn is_non_member(&self) -> bool {
        matches!(self, GroupMember::NonGroupMember)
    }
    /// The group.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`](c10d_core::DistError::InvalidArgument) "this rank is not a member of the group" for the sentinel.
    pub fn into_group(self) -> Result<ProcessGroup> {
        match self {
            GroupMember::Group(g) => Ok(g),
            GroupMember::NonGroupMember => Err(DistError::invalid(
                "this rank is not a member of the group (GroupMember.NON_GROUP_MEMBER)",
            )),
        }
    }
    /// PyTorch's integer view of the sentinel: −100 for non-members, `None` for real groups.
    pub fn sentinel_value(&self) -> Option<i64> {
        self.is_non_member().then_some(NON_GROUP_MEMBER_VALUE)
    }
}

impl From<ProcessGroup> for GroupMember {
    fn from(pg: ProcessGroup) -> Self {
        GroupMember::Group(pg)
    }
}

impl From<&ProcessGroup> for GroupMember {
    fn from(pg: &ProcessGroup) -> Self {
        GroupMember::Group(pg.clone())
    }
}

impl PartialEq for GroupMember {
    /// Same group object (pointer equality), or both the sentinel.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (GroupMember::Group(a), GroupMember::Group(b)) => a.ptr_eq(b),
            (GroupMember::NonGroupMember, GroupMember::NonGroupMember) => true,
            _ => false,
        }
    }
}

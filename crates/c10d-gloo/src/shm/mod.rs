//! The group's shared-memory segment as the platform gives it: a POSIX shared-memory object
//! made when the group connects (`setup.rs`: rank 0 creates it under a random name, every rank
//! maps it and votes through the store, rank 0 unlinks the name) and its layout and primitives
//! (`segment.rs`: per-rank lines and slots, futex waits and wakes). The engine keeps the
//! segment; the algorithms that run through it are in `algo::shm`.

pub(crate) mod segment;
mod setup;

pub(crate) use setup::setup;

use segment::Segment;

/// The group's shared-memory state.
#[derive(Default)]
pub(crate) enum ShmState {
    /// Not usable in this group (not set up yet, voted down, or not every rank on this host).
    #[default]
    Off,
    /// Mapped by every rank.
    On(Segment),
}

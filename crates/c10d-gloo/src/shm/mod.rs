//! The group's shared-memory segment as the platform gives it: a POSIX shared-memory object set
//! up through the group's store when an op first needs it (`setup.rs`: rank 0 checks that
//! `/dev/shm` has room, creates it under a random name, every rank maps it and votes, rank 0
//! unlinks the name), how big it should be and whether it fits (`fit.rs`: slots sized to the op,
//! an eighth of `/dev/shm` left free), and its layout and primitives (`segment.rs`: per-rank
//! lines and slots, futex waits and wakes, `statvfs`). The engine keeps the segment; the
//! algorithms that run through it, and the probe that sets it up, are in `algo::shm`.

pub(crate) mod fit;
pub(crate) mod segment;
pub(crate) mod setup;

use segment::Segment;

/// The group's shared-memory segment.
#[derive(Default)]
pub(crate) enum ShmState {
    /// None (not set up yet, voted down, no room, or not every rank on this host).
    #[default]
    Off,
    /// Mapped by every rank.
    On(Segment),
}

/// What the group learnt from its set-ups so far (equal on every rank: every rank runs the
/// same set-ups and gets the same outcomes).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Set-ups run so far (names the next one's store keys).
    pub setups: u32,
    /// The largest slot a set-up may still be asked for: `None` while no set-up failed (the
    /// group's largest slot), `Some(0)` never again (a rank refused).
    pub limit: Option<usize>,
}

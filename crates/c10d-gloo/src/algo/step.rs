//! The step tag a frame carries within one collective, in one layout for every algorithm:
//!
//! | bits | 28–31 | 20–27 | 0–19 |
//! |------|-------|-------|------|
//! | field | [`Phase`] | round (mod 256) | piece (mod 2²⁰) |
//!
//! Peers match a collective's frames by (collective, step) in the order each peer sends them,
//! and check the step of every frame against the receive it lands in: a frame of another phase,
//! round or piece there means the ranks chose different algorithms or sizes (a mismatch error).
//! Within one collective every frame a rank sends to one peer has its own step, except that
//! rounds and pieces wrap (a ring of more than 257 ranks, a buffer of more than 2²⁰ pieces):
//! frames 256 rounds apart then share a step, which the per-peer order still tells apart.

/// What part of an algorithm a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Phase {
    /// The data of single-phase algorithms and the reduce-scatter half of two-phase ones.
    Data = 0,
    /// The all-gather half of two-phase all-reduces (ring, all-pairs).
    Gather = 1,
    /// Cross-memory attach: probe, vote, addresses, "segment reduced", "done reading".
    CmaProbe = 2,
    CmaVote = 3,
    CmaAddr = 4,
    CmaReduced = 5,
    CmaDone = 6,
    /// Two-level all-reduce: the phases inside and between hosts, and the cross-memory-attach
    /// hand-shakes inside a host. (7 was the host map's exchange, now read from the store.)
    HostReduce = 8,
    CrossReduce = 9,
    CrossGather = 10,
    HostGather = 11,
    HostFinal = 12,
    HostDone = 13,
    /// Empty control frames of the flow-controlled algorithms (ready-to-receive and
    /// request-to-send).
    Control = 15,
}

/// The step of piece `piece` of round `round` of `phase`.
pub(crate) const fn step(phase: Phase, round: usize, piece: usize) -> u32 {
    ((phase as u32) << 28) | (((round & 0xff) as u32) << 20) | (piece & 0xf_ffff) as u32
}

/// "Every receive for you is posted": the empty frame a receiver sends its sender (chain
/// broadcast, all-to-all).
pub(crate) const READY: u32 = step(Phase::Control, 0xff, 0xf_ffff);

/// "A block will follow once you are ready": the empty frame of all-to-all's held-back blocks.
pub(crate) const RTS: u32 = step(Phase::Control, 0xff, 0xf_fffe);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_do_not_overlap() {
        assert_eq!(step(Phase::Data, 0, 0), 0);
        assert_eq!(step(Phase::Data, 0, 7), 7);
        assert_eq!(step(Phase::Gather, 3, 7), 1 << 28 | 3 << 20 | 7);
        assert_eq!(step(Phase::Control, 0xff, 0xf_ffff), u32::MAX);
        // Wrapping keeps a field inside its bits.
        assert_eq!(step(Phase::Data, 256, 0), step(Phase::Data, 0, 0));
        assert_eq!(step(Phase::Data, 0, 1 << 20), step(Phase::Data, 0, 0));
        assert_ne!(READY, RTS);
    }
}

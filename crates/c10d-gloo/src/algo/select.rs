//! Which algorithm runs a collective: one pure table from (message size, group size, options,
//! what the group can do) to an algorithm. Every rank evaluates it with the same inputs (sizes
//! are checked against the peers' in every frame; the group's abilities are agreed by all
//! ranks), so every rank picks the same algorithm.
//!
//! | op | size (bytes, `len`) | picks |
//! |----|------|-------|
//! | all_reduce (`Auto`) | `len ≤ small_allreduce` | shared memory (direct fold) if the group's slot holds it (set it up first, see below), else the direct exchange |
//! | | `≤ cma_min`, ≤ 8 ranks | shared memory (all-pairs fold) if the group's slot holds it (set up first), else (below `cma_min`) all-pairs |
//! | | `≥ cma_min`, every peer on this host | cross-memory attach if the group agreed to it (probe first if it never asked) |
//! | | `> small_allreduce`, peers on other hosts, equal hosts of ≥ 2 ranks | two-level (reduce in the host, exchange between hosts, spread; learn the host map first if never asked) |
//! | | otherwise | up to `small_allreduce` the direct exchange (≤ 16 ranks) or recursive doubling; above, all-pairs up to 8 ranks, else the pipelined ring |
//! | all_reduce (forced) | any | the algorithm the options name, over sockets |
//! | broadcast (`Auto`) | fits a slot (set up first) | shared memory |
//! | | `≤ small_broadcast` / above | binomial tree / pipelined chain |
//! | all_gather, reduce_scatter | total `< cma_min`, fits a slot (set up first) | shared memory |
//! | | total `≥ cma_min`, every peer on this host | cross-memory attach (probe first if never asked) |
//! | | otherwise | direct exchange |
//!
//! Shared memory replaces exactly the socket algorithm it stands in for (same fold order, same
//! bits), so where it is not possible nothing but speed changes. Whether cross-memory attach
//! works, how the ranks sit on hosts, and the group's shared-memory segment are learnt or set
//! up by probes that every rank runs at the same op ([`Choice::Probe`]); their verdicts then
//! feed the table. "Set up first": a same-host group whose segment's slot is smaller than the
//! op's bytes per rank (no segment yet: 0), but which may still ask for that many
//! ([`Caps::shm_limit`]), sets up a segment whose slots hold them ([`Probe::Shm`]); a set-up
//! that finds no room in `/dev/shm` lowers the limit, one a rank refuses sets it to 0.

use super::shm::Fold;
use crate::options::{AllreduceAlgorithm, BroadcastAlgorithm};

/// Largest group whose small all-reduces use the direct exchange (every rank sends to every
/// other: n − 1 connections); larger groups use recursive doubling (⌊log₂ n⌋ + 1).
pub(crate) const DIRECT_MAX_RANKS: usize = 16;

/// The options the table reads (copied from `GlooOptions` into each op).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub allreduce: AllreduceAlgorithm,
    pub broadcast: BroadcastAlgorithm,
    /// Direct exchange (and its shared-memory fold) up to this many bytes.
    pub small_allreduce: usize,
    /// Binomial tree up to this many bytes, pipelined chain above.
    pub small_broadcast: usize,
    /// Cross-memory attach from this many bytes (shared memory below).
    pub cma_min: usize,
}

/// What the group can do, as every rank agreed when it connected (or at its first probe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Ranks in the group.
    pub size: usize,
    /// Every peer is on this host (Unix-socket connections).
    pub local: bool,
    /// Bytes one rank's slot of the group's shared-memory segment holds; `None`: no segment.
    pub shm_slot: Option<usize>,
    /// The most bytes per rank a new segment may be set up for (0: none; only for groups of
    /// ranks on this host).
    pub shm_limit: usize,
    /// Whether cross-memory attach works between every pair of ranks.
    pub cma: CmaVerdict,
    /// How the ranks sit on hosts (for groups that span hosts).
    pub hosts: HostsVerdict,
}

/// The group's host map, as far as the table needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostsVerdict {
    /// Never probed: the first op that would run two-level asks first.
    Unprobed,
    /// Two or more hosts of the same number (≥ 2) of ranks: two-level algorithms apply.
    Hierarchical,
    /// Anything else (one rank per host, uneven hosts): flat algorithms.
    Flat,
}

/// A probe the table needs before it can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Whether cross-memory attach works (`algo::cma::probe`).
    Cma,
    /// Which ranks share a host (`algo::hierarchical::probe`).
    Hosts,
    /// Set up a shared-memory segment whose slots hold this many bytes per rank
    /// (`algo::shm::probe`).
    Shm(usize),
}

/// The group's cross-memory-attach verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmaVerdict {
    /// Never probed: the first op that would use it probes first.
    Unprobed,
    Permitted,
    Refused,
}

/// The table's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice<A> {
    Run(A),
    /// An algorithm that needs something the group never probed would run: run the probe (a
    /// collective step every rank takes at this op), then ask again.
    Probe(Probe),
}

/// All-reduce algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllReduce {
    Shm(Fold),
    Cma,
    TwoLevel,
    Direct,
    /// Recursive doubling: small buffers in groups of more than [`DIRECT_MAX_RANKS`].
    Doubling,
    AllPairs,
    Ring,
}

/// Broadcast algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Broadcast {
    Shm,
    Tree,
    Chain,
}

/// All-gather and reduce-scatter algorithms (the socket one is the direct exchange).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exchange {
    Shm,
    Cma,
    Direct,
}

impl Caps {
    /// A shared-memory op of `bytes` per rank: run it when it fits the group's slots, set up a
    /// segment first when one may still be set up for it; `None` when it cannot use shared
    /// memory.
    fn shm<A>(&self, bytes: usize, run: A) -> Option<Choice<A>> {
        if bytes == 0 {
            None
        } else if self.shm_slot.is_some_and(|slot| bytes <= slot) {
            Some(Choice::Run(run))
        } else if bytes <= self.shm_limit {
            Some(Choice::Probe(Probe::Shm(bytes)))
        } else {
            None
        }
    }

    /// Cross-memory attach for an op of `bytes` (≥ the threshold, checked by the caller):
    /// `None` when it cannot apply at all.
    fn cma<A>(&self, bytes: usize, run: A) -> Option<Choice<A>> {
        if self.size < 2 || bytes == 0 || !self.local {
            return None;
        }
        match self.cma {
            CmaVerdict::Unprobed => Some(Choice::Probe(Probe::Cma)),
            CmaVerdict::Permitted => Some(Choice::Run(run)),
            CmaVerdict::Refused => None,
        }
    }
}

/// The all-reduce of `len` bytes.
pub(crate) fn all_reduce(s: &Settings, caps: &Caps, len: usize) -> Choice<AllReduce> {
    use AllReduce::*;
    let sockets = || match s.allreduce {
        AllreduceAlgorithm::Direct => Direct,
        AllreduceAlgorithm::AllPairs => AllPairs,
        AllreduceAlgorithm::Ring => Ring,
        AllreduceAlgorithm::Auto if len <= s.small_allreduce && caps.size <= DIRECT_MAX_RANKS => {
            Direct
        }
        AllreduceAlgorithm::Auto if len <= s.small_allreduce => Doubling,
        AllreduceAlgorithm::Auto if caps.size <= 8 => AllPairs,
        AllreduceAlgorithm::Auto => Ring,
    };
    if s.allreduce != AllreduceAlgorithm::Auto {
        return Choice::Run(sockets());
    }
    if len <= s.small_allreduce {
        if let Some(c) = caps.shm(len, Shm(Fold::Direct)) {
            return c;
        }
    }
    if !caps.local && len > s.small_allreduce {
        return match caps.hosts {
            HostsVerdict::Unprobed => Choice::Probe(Probe::Hosts),
            HostsVerdict::Hierarchical => Choice::Run(TwoLevel),
            HostsVerdict::Flat => Choice::Run(sockets()),
        };
    }
    // Up to and including `cma_min` (one slot's worth by default) the segment is faster than
    // cross-memory attach, whose three hand-shakes and page pinning dominate below ~4 MiB.
    if len <= s.cma_min && caps.size <= 8 {
        if let Some(c) = caps.shm(len, Shm(Fold::AllPairs)) {
            return c;
        }
    }
    if len < s.cma_min {
        return Choice::Run(sockets());
    }
    caps.cma(len, Cma).unwrap_or(Choice::Run(sockets()))
}

/// The broadcast of `len` bytes.
pub(crate) fn broadcast(s: &Settings, caps: &Caps, len: usize) -> Choice<Broadcast> {
    let shm = match s.broadcast {
        BroadcastAlgorithm::Auto => caps.shm(len, Broadcast::Shm),
        _ => None,
    };
    shm.unwrap_or(Choice::Run(match s.broadcast {
        BroadcastAlgorithm::Chain => Broadcast::Chain,
        BroadcastAlgorithm::Tree => Broadcast::Tree,
        BroadcastAlgorithm::Auto if len <= s.small_broadcast => Broadcast::Tree,
        BroadcastAlgorithm::Auto => Broadcast::Chain,
    }))
}

/// An all-gather or reduce-scatter: `mine` bytes this rank contributes (what its slot must
/// hold), `total` bytes the op moves in all (all-gather: the outputs; reduce-scatter: the
/// blocks), which picks between shared memory and cross-memory attach.
pub(crate) fn exchange(s: &Settings, caps: &Caps, mine: usize, total: usize) -> Choice<Exchange> {
    if total < s.cma_min {
        return caps
            .shm(mine, Exchange::Shm)
            .unwrap_or(Choice::Run(Exchange::Direct));
    }
    caps.cma(total, Exchange::Cma)
        .unwrap_or(Choice::Run(Exchange::Direct))
}

#[cfg(test)]
mod tests {
    use super::*;
    use AllReduce::*;

    const KIB: usize = 1024;
    const MIB: usize = 1024 * KIB;

    fn settings() -> Settings {
        Settings {
            allreduce: AllreduceAlgorithm::Auto,
            broadcast: BroadcastAlgorithm::Auto,
            small_allreduce: 64 * KIB,
            small_broadcast: 64 * KIB,
            cma_min: 2 * MIB,
        }
    }

    /// A same-host group of `size` with a segment of 2 MiB slots and CMA permitted.
    fn host(size: usize) -> Caps {
        Caps {
            size,
            local: true,
            shm_slot: Some(2 * MIB),
            shm_limit: 2 * MIB,
            cma: CmaVerdict::Permitted,
            hosts: HostsVerdict::Unprobed,
        }
    }

    /// A group over several hosts whose host map was learnt to be flat (one rank per host).
    fn remote(size: usize) -> Caps {
        Caps {
            local: false,
            shm_slot: None,
            shm_limit: 0,
            cma: CmaVerdict::Unprobed,
            hosts: HostsVerdict::Flat,
            ..host(size)
        }
    }

    #[test]
    fn all_reduce_on_one_host_uses_shared_memory_then_cma() {
        let s = settings();
        let c = host(4);
        assert_eq!(all_reduce(&s, &c, 4), Choice::Run(Shm(Fold::Direct)));
        assert_eq!(all_reduce(&s, &c, 64 * KIB), Choice::Run(Shm(Fold::Direct)));
        assert_eq!(
            all_reduce(&s, &c, 64 * KIB + 4),
            Choice::Run(Shm(Fold::AllPairs))
        );
        assert_eq!(
            all_reduce(&s, &c, 2 * MIB - 4),
            Choice::Run(Shm(Fold::AllPairs))
        );
        assert_eq!(
            all_reduce(&s, &c, 2 * MIB),
            Choice::Run(Shm(Fold::AllPairs))
        );
        assert_eq!(all_reduce(&s, &c, 2 * MIB + 4), Choice::Run(Cma));
        assert_eq!(all_reduce(&s, &c, 64 * MIB), Choice::Run(Cma));
    }

    #[test]
    fn all_reduce_over_sockets_follows_size_and_group_size() {
        let s = settings();
        for size in [2, 8] {
            let c = remote(size);
            assert_eq!(all_reduce(&s, &c, KIB), Choice::Run(Direct));
            assert_eq!(all_reduce(&s, &c, MIB), Choice::Run(AllPairs));
            assert_eq!(all_reduce(&s, &c, 64 * MIB), Choice::Run(AllPairs));
        }
        assert_eq!(all_reduce(&s, &remote(9), MIB), Choice::Run(Ring));
        assert_eq!(all_reduce(&s, &remote(9), KIB), Choice::Run(Direct));
        // Beyond 16 ranks small buffers take recursive doubling (log₂ n peers, not n − 1).
        assert_eq!(all_reduce(&s, &remote(16), KIB), Choice::Run(Direct));
        assert_eq!(all_reduce(&s, &remote(17), KIB), Choice::Run(Doubling));
        assert_eq!(all_reduce(&s, &remote(512), KIB), Choice::Run(Doubling));
        assert_eq!(all_reduce(&s, &remote(512), MIB), Choice::Run(Ring));
    }

    #[test]
    fn all_reduce_without_a_segment_or_beyond_its_slots_uses_sockets() {
        let s = settings();
        let none = Caps {
            shm_slot: None,
            shm_limit: 0,
            ..host(2)
        };
        assert_eq!(all_reduce(&s, &none, KIB), Choice::Run(Direct));
        assert_eq!(all_reduce(&s, &none, MIB), Choice::Run(AllPairs));
        let small = Caps {
            shm_slot: Some(64 * KIB),
            shm_limit: 64 * KIB,
            ..host(12)
        };
        assert_eq!(all_reduce(&s, &small, KIB), Choice::Run(Shm(Fold::Direct)));
        // More than 8 ranks: the socket path would run the ring, whose order shm does not copy.
        assert_eq!(all_reduce(&s, &small, 100 * KIB), Choice::Run(Ring));
        // Empty buffers never touch the segment.
        assert_eq!(all_reduce(&s, &host(2), 0), Choice::Run(Direct));
    }

    #[test]
    fn cma_is_probed_once_then_its_verdict_decides() {
        let s = settings();
        let unprobed = Caps {
            cma: CmaVerdict::Unprobed,
            ..host(2)
        };
        assert_eq!(
            all_reduce(&s, &unprobed, 4 * MIB),
            Choice::Probe(Probe::Cma)
        );
        // Below the threshold nothing asks for the probe.
        assert_eq!(
            all_reduce(&s, &unprobed, MIB),
            Choice::Run(Shm(Fold::AllPairs))
        );
        let refused = Caps {
            cma: CmaVerdict::Refused,
            ..host(2)
        };
        assert_eq!(all_reduce(&s, &refused, 4 * MIB), Choice::Run(AllPairs));
        // A peer on another host: no probe at all.
        assert_eq!(all_reduce(&s, &remote(2), 4 * MIB), Choice::Run(AllPairs));
        assert_eq!(all_reduce(&s, &host(1), 4 * MIB), Choice::Run(AllPairs));
    }

    #[test]
    fn groups_over_hosts_learn_the_host_map_then_run_two_level_above_small_messages() {
        let s = settings();
        let unprobed = Caps {
            hosts: HostsVerdict::Unprobed,
            ..remote(4)
        };
        assert_eq!(all_reduce(&s, &unprobed, KIB), Choice::Run(Direct));
        assert_eq!(all_reduce(&s, &unprobed, 64 * KIB), Choice::Run(Direct));
        assert_eq!(
            all_reduce(&s, &unprobed, 64 * KIB + 4),
            Choice::Probe(Probe::Hosts)
        );
        let two = Caps {
            hosts: HostsVerdict::Hierarchical,
            ..remote(4)
        };
        assert_eq!(all_reduce(&s, &two, KIB), Choice::Run(Direct));
        assert_eq!(all_reduce(&s, &two, MIB), Choice::Run(TwoLevel));
        assert_eq!(all_reduce(&s, &two, 64 * MIB), Choice::Run(TwoLevel));
        // Flat maps (one rank per host, uneven hosts) keep the flat algorithms.
        assert_eq!(all_reduce(&s, &remote(4), 64 * MIB), Choice::Run(AllPairs));
        // A forced algorithm stays forced.
        let ring = Settings {
            allreduce: AllreduceAlgorithm::Ring,
            ..s
        };
        assert_eq!(all_reduce(&ring, &two, 64 * MIB), Choice::Run(Ring));
    }

    #[test]
    fn forced_all_reduce_algorithms_always_run_over_sockets() {
        for (algo, want) in [
            (AllreduceAlgorithm::Direct, Direct),
            (AllreduceAlgorithm::AllPairs, AllPairs),
            (AllreduceAlgorithm::Ring, Ring),
        ] {
            let s = Settings {
                allreduce: algo,
                ..settings()
            };
            for len in [4, MIB, 64 * MIB] {
                assert_eq!(all_reduce(&s, &host(4), len), Choice::Run(want));
            }
        }
    }

    #[test]
    fn broadcast_table() {
        let s = settings();
        assert_eq!(broadcast(&s, &host(4), KIB), Choice::Run(Broadcast::Shm));
        assert_eq!(
            broadcast(&s, &host(4), 2 * MIB),
            Choice::Run(Broadcast::Shm)
        );
        assert_eq!(
            broadcast(&s, &host(4), 2 * MIB + 1),
            Choice::Run(Broadcast::Chain)
        );
        assert_eq!(
            broadcast(&s, &remote(4), 64 * KIB),
            Choice::Run(Broadcast::Tree)
        );
        assert_eq!(
            broadcast(&s, &remote(4), 64 * KIB + 1),
            Choice::Run(Broadcast::Chain)
        );
        assert_eq!(broadcast(&s, &host(4), 0), Choice::Run(Broadcast::Tree));
        let tree = Settings {
            broadcast: BroadcastAlgorithm::Tree,
            ..s
        };
        assert_eq!(
            broadcast(&tree, &host(4), KIB),
            Choice::Run(Broadcast::Tree)
        );
        let chain = Settings {
            broadcast: BroadcastAlgorithm::Chain,
            ..s
        };
        assert_eq!(
            broadcast(&chain, &host(4), KIB),
            Choice::Run(Broadcast::Chain)
        );
    }

    #[test]
    fn exchange_table() {
        let s = settings();
        let c = host(4);
        assert_eq!(exchange(&s, &c, KIB, 4 * KIB), Choice::Run(Exchange::Shm));
        assert_eq!(exchange(&s, &c, MIB, 4 * MIB), Choice::Run(Exchange::Cma));
        let small = Caps {
            shm_slot: Some(64 * KIB),
            shm_limit: 64 * KIB,
            ..c
        };
        assert_eq!(
            exchange(&s, &small, 128 * KIB, 512 * KIB),
            Choice::Run(Exchange::Direct)
        );
        assert_eq!(
            exchange(&s, &remote(4), MIB, 4 * MIB),
            Choice::Run(Exchange::Direct)
        );
        let unprobed = Caps {
            cma: CmaVerdict::Unprobed,
            ..c
        };
        assert_eq!(
            exchange(&s, &unprobed, MIB, 4 * MIB),
            Choice::Probe(Probe::Cma)
        );
        assert_eq!(exchange(&s, &c, 0, 0), Choice::Run(Exchange::Direct));
    }

    #[test]
    fn shared_memory_is_set_up_by_the_first_op_that_needs_it_and_grown_on_demand() {
        let s = settings();
        let fresh = Caps {
            shm_slot: None,
            ..host(4)
        };
        assert_eq!(all_reduce(&s, &fresh, KIB), Choice::Probe(Probe::Shm(KIB)));
        assert_eq!(all_reduce(&s, &fresh, MIB), Choice::Probe(Probe::Shm(MIB)));
        assert_eq!(all_reduce(&s, &fresh, 4 * MIB), Choice::Run(Cma));
        assert_eq!(all_reduce(&s, &fresh, 0), Choice::Run(Direct));
        assert_eq!(broadcast(&s, &fresh, KIB), Choice::Probe(Probe::Shm(KIB)));
        assert_eq!(
            exchange(&s, &fresh, KIB, 4 * KIB),
            Choice::Probe(Probe::Shm(KIB))
        );
        // A 64 KiB segment runs what fits and grows for more.
        let small = Caps {
            shm_slot: Some(64 * KIB),
            ..host(4)
        };
        assert_eq!(all_reduce(&s, &small, KIB), Choice::Run(Shm(Fold::Direct)));
        assert_eq!(
            all_reduce(&s, &small, 100 * KIB),
            Choice::Probe(Probe::Shm(100 * KIB))
        );
        assert_eq!(
            broadcast(&s, &small, 2 * MIB),
            Choice::Probe(Probe::Shm(2 * MIB))
        );
        // No room for 128 KiB slots: what needs them uses sockets, smaller ops shared memory.
        let no_room = Caps {
            shm_limit: 64 * KIB,
            ..small
        };
        assert_eq!(all_reduce(&s, &no_room, 100 * KIB), Choice::Run(AllPairs));
        assert_eq!(
            all_reduce(&s, &no_room, KIB),
            Choice::Run(Shm(Fold::Direct))
        );
        assert_eq!(
            broadcast(&s, &no_room, 100 * KIB),
            Choice::Run(Broadcast::Chain)
        );
        let refused = Caps {
            shm_limit: 0,
            ..fresh
        };
        assert_eq!(all_reduce(&s, &refused, KIB), Choice::Run(Direct));
        assert_eq!(
            exchange(&s, &refused, KIB, 4 * KIB),
            Choice::Run(Exchange::Direct)
        );
        // Forced socket algorithms never ask.
        let tree = Settings {
            broadcast: BroadcastAlgorithm::Tree,
            ..s
        };
        assert_eq!(broadcast(&tree, &fresh, KIB), Choice::Run(Broadcast::Tree));
        let ring = Settings {
            allreduce: AllreduceAlgorithm::Ring,
            ..s
        };
        assert_eq!(all_reduce(&ring, &fresh, KIB), Choice::Run(Ring));
    }
}

//! The group's host map: which ranks share a host (plain data, from the identities the ranks
//! publish; `algo::hierarchical` learns it and runs the two-level algorithms over it, the engine
//! keeps it between ops).

/// The group's ranks by host, when they split into at least two hosts of equal size ≥ 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hosts {
    /// `members[h]`: the ranks of host `h`, increasing; hosts ordered by their lowest rank.
    pub(crate) members: Vec<Vec<usize>>,
    /// `(host, local index)` of each rank.
    pub(crate) place: Vec<(usize, usize)>,
    /// Every rank can read its host's peers' memory (cross-memory attach), as all ranks agreed.
    pub(crate) cma: bool,
}

/// Most ranks per host, and most hosts, that the two-level algorithms run over: each rank talks
/// to every rank of its host and to one per host, so beyond this a rank would hold more
/// connections than the flat ring's two (a host of 64 ranks keeps the flat algorithms).
pub(crate) const MAX_FANOUT: usize = 16;

/// Largest group whose ranks check whether they share hosts (reading every rank's identity:
/// O(n) bytes from the store per rank, once). The same-host paths (shared memory up to 16
/// ranks, cross-memory attach, the two-level host map of at most 16 × 16 ranks) talk to every
/// peer of the host, which beyond this many ranks would cost more connections than the socket
/// algorithms need; larger groups run those, and read no identity at all.
pub(crate) const MAX_MAP_RANKS: usize = MAX_FANOUT * MAX_FANOUT;

impl Hosts {
    /// The host map from every rank's host key (`None`: a host of its own, e.g. a rank without
    /// Unix sockets). `None` unless the keys split the group into at least two hosts with the
    /// same number (2 ..= [`MAX_FANOUT`]) of ranks each, and at most [`MAX_FANOUT`] hosts. Every
    /// rank computes it from the same published keys, so every rank gets the same map.
    pub(crate) fn from_host_keys(keys: &[Option<&str>]) -> Option<Hosts> {
        let n = keys.len();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let mut index: std::collections::HashMap<&str, usize> = Default::default();
        let mut place = vec![(0, 0); n];
        for (r, k) in keys.iter().enumerate() {
            let h = match k {
                Some(k) => *index.entry(k).or_insert(members.len()),
                None => members.len(),
            };
            if h == members.len() {
                members.push(Vec::new());
            }
            place[r] = (h, members[h].len());
            members[h].push(r);
        }
        let m = members[0].len();
        let uniform = members.iter().all(|h| h.len() == m);
        let fits = (2..=MAX_FANOUT).contains(&m) && (2..=MAX_FANOUT).contains(&members.len());
        (uniform && fits).then_some(Hosts {
            members,
            place,
            cma: false,
        })
    }

    /// The ranks of local index `i`, one per host, in host order.
    pub(crate) fn column(&self, i: usize) -> Vec<usize> {
        self.members.iter().map(|h| h[i]).collect()
    }
}

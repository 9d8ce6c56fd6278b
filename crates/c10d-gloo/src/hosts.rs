//! The group's host map: which ranks share a host (plain data; `algo::hierarchical` learns it
//! and runs the two-level algorithms over it, the engine keeps it between ops).

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

impl Hosts {
    /// The host map from every rank's view: `local[r][p]` says that rank `r` reaches `p` over a
    /// Unix socket (same host). `None` unless the views agree (symmetric and transitive), and
    /// split the group into at least two hosts with the same number (≥ 2) of ranks each.
    pub(crate) fn from_local_peers(local: &[Vec<bool>]) -> Option<Hosts> {
        let n = local.len();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let mut place = vec![(usize::MAX, 0); n];
        for r in 0..n {
            if place[r].0 != usize::MAX {
                continue;
            }
            let host: Vec<usize> = (0..n).filter(|&p| p == r || local[r][p]).collect();
            for (i, &p) in host.iter().enumerate() {
                let same_view = (0..n).all(|q| (q == p || local[p][q]) == host.contains(&q));
                if !same_view || place[p].0 != usize::MAX {
                    return None;
                }
                place[p] = (members.len(), i);
            }
            members.push(host);
        }
        let m = members[0].len();
        let uniform = members.iter().all(|h| h.len() == m);
        (members.len() >= 2 && m >= 2 && uniform).then_some(Hosts {
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

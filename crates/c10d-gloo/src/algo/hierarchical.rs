//! Two-level all-reduce for groups that span hosts: reduce inside each host, exchange between
//! hosts one segment per local rank, spread inside the host. Between hosts each byte of the
//! buffer crosses the network once each way per host (the flat all-pairs sends every rank's
//! whole share across), and every local rank carries its own segment, so all the host's links
//! and cores work at once.
//!
//! With `m` ranks on each of `H` hosts, local rank `i` of host `h` owns segment `i` of the
//! buffer (`m` segments by element count):
//! 1. inside the host: every local rank sends segment `j` to local rank `j`; rank `i` folds the
//!    host's `m` copies of segment `i` in a fixed order (local-rank order over sockets; its own
//!    copy first, then the others in local-rank order, with cross-memory attach);
//! 2. between hosts, among the `H` ranks of local index `i` (one per host): segment `i` is cut
//!    into `H` parts; the rank on host `g` folds part `g` of every host's partial sum in host
//!    order and sends the result to the others (all-pairs);
//! 3. inside the host: every local rank sends its final segment to the others.
//!
//! Inside a host the phases copy straight between the ranks' buffers with cross-memory
//! attach when every rank of the group can read its host's peers (probed with the host map):
//! rank `i` reads segment `i` of every local peer's buffer (phase 1) and, once a peer says its
//! segment is final, that segment (phase 3): one copy per byte, where a socket costs two. That
//! path runs the three phases as a pipeline over chunks of the segments ([`pipelined`]), so the
//! link between hosts carries one chunk while the host's phases work on others. Otherwise the
//! host's phases go over the sockets, one phase after the other.
//!
//! Every element is folded by exactly one rank in a fixed order and then copied, so all ranks
//! end with the same bits (they differ from the flat algorithms', whose fold order is another).
//! The host map comes from the connections ([`Hosts::from_local_peers`]): two ranks share a
//! host when they talk over a Unix socket; every rank learns every rank's view once (a small
//! all-gather, [`probe`]), so all ranks derive the same map, and a map that is not a clean
//! partition into equal hosts makes the group keep the flat algorithms.

use super::cma;
use super::part;
use super::step::{step, Phase};
use crate::engine::Comm;
use crate::hosts::Hosts;

mod pipelined;
use c10d_core::reduce::reduce_into;
use c10d_core::{DType, ReduceOp, Result};

/// Step tags of the phases (one frame per peer per phase).
const STEP_PROBE: u32 = step(Phase::HostMap, 0, 0);
const STEP_HOST_RS: u32 = step(Phase::HostReduce, 0, 0);
const STEP_CROSS_RS: u32 = step(Phase::CrossReduce, 0, 0);
const STEP_CROSS_AG: u32 = step(Phase::CrossGather, 0, 0);
const STEP_HOST_AG: u32 = step(Phase::HostGather, 0, 0);

/// Learns the host map: every rank sends every other its view (which peers it reaches over a
/// Unix socket) and derives the map from all views; every rank gets the same answer. A rank
/// that does not allow two-level algorithms (`allowed == false`) shows no local peer, which
/// makes the views disagree: the whole group stays flat.
///
/// # Errors
/// As [`Comm::exchange`].
pub(crate) fn probe(
    comm: &mut Comm<'_>,
    allowed: bool,
    cma_allowed: bool,
) -> Result<Option<Hosts>> {
    let (r, n) = (comm.rank(), comm.size());
    let mine: Vec<u8> = (0..n)
        .map(|p| u8::from(allowed && p != r && comm.peer_is_local(p)))
        .collect();
    let mut views = vec![vec![0u8; n]; n];
    views[r].copy_from_slice(&mine);
    {
        let mut recvs: Vec<(usize, u32, &mut [u8])> = views
            .iter_mut()
            .enumerate()
            .filter(|(p, _)| *p != r)
            .map(|(p, v)| (p, STEP_PROBE, v.as_mut_slice()))
            .collect();
        let sends: Vec<(usize, u32, &[u8])> = (0..n)
            .filter(|p| *p != r)
            .map(|p| (p, STEP_PROBE, mine.as_slice()))
            .collect();
        comm.exchange(&sends, &mut recvs)?;
    }
    let local: Vec<Vec<bool>> = views
        .iter()
        .map(|v| v.iter().map(|&b| b == 1).collect())
        .collect();
    let mut hosts = Hosts::from_local_peers(&local);
    if let Some(h) = &mut hosts {
        let (host, _) = h.place[r];
        let locals = h.members[host].clone();
        let mine = cma::probe_among(comm, &locals, cma_allowed)?;
        h.cma = cma::vote(comm, mine)?;
    }
    match &hosts {
        Some(h) => log::info!(
            "{}: two-level all_reduce over {} hosts of {} ranks{}",
            comm.ctx(),
            h.members.len(),
            h.members[0].len(),
            if h.cma {
                " (cross-memory attach inside hosts)"
            } else {
                ""
            }
        ),
        None => log::info!(
            "{}: not equal hosts of several ranks: flat algorithms",
            comm.ctx()
        ),
    }
    Ok(hosts)
}

/// Two-level all-reduce of `buf` in place over `hosts` (see the module docs).
///
/// # Errors
/// As [`Comm::exchange`]; a reduction error (never for a dtype the op was checked against).
pub(crate) fn all_reduce(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    op: ReduceOp,
    dtype: DType,
    hosts: &Hosts,
) -> Result<()> {
    if hosts.cma {
        return pipelined::all_reduce(comm, buf, op, dtype, hosts);
    }
    let (host, i) = hosts.place[comm.rank()];
    let locals = hosts.members[host].clone();
    let es = dtype.size();
    let segs: Vec<std::ops::Range<usize>> = (0..locals.len())
        .map(|j| part(buf.len() / es, locals.len(), j, es))
        .collect();
    let column = hosts.column(i);
    let mine = segs[i].clone();
    reduce_in_host(comm, buf, op, dtype, &locals, i, &segs)?;
    all_reduce_across(comm, &mut buf[mine], op, dtype, &column, host)?;
    gather_in_host(comm, buf, &locals, i, &segs)
}

/// Phase 1: `buf[segs[i]]` becomes the host's sum of segment `i`, folded in local-rank order.
fn reduce_in_host(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    op: ReduceOp,
    dtype: DType,
    locals: &[usize],
    i: usize,
    segs: &[std::ops::Range<usize>],
) -> Result<()> {
    reduce_scatter_among(comm, buf, (op, dtype), (locals, i), segs, STEP_HOST_RS)
}

/// Phase 2: all-pairs all-reduce of `seg` among `column` (one rank per host; we are
/// `column[host]`): part `g` is folded by `column[g]` in host order, then sent to the others.
fn all_reduce_across(
    comm: &mut Comm<'_>,
    seg: &mut [u8],
    op: ReduceOp,
    dtype: DType,
    column: &[usize],
    host: usize,
) -> Result<()> {
    let (h, es) = (column.len(), dtype.size());
    let parts: Vec<std::ops::Range<usize>> =
        (0..h).map(|g| part(seg.len() / es, h, g, es)).collect();
    reduce_scatter_among(
        comm,
        seg,
        (op, dtype),
        (column, host),
        &parts,
        STEP_CROSS_RS,
    )?;
    spread(comm, seg, column, host, &parts, STEP_CROSS_AG)
}

/// Reduce-scatter among `ranks` (we are `ranks[me]`): every rank sends `buf[parts[k]]` to
/// `ranks[k]`; `buf[parts[me]]` becomes the fold of every rank's copy in the order of `ranks`.
fn reduce_scatter_among(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    (op, dtype): (ReduceOp, DType),
    (ranks, me): (&[usize], usize),
    parts: &[std::ops::Range<usize>],
    step: u32,
) -> Result<()> {
    let own = parts[me].clone();
    let len = own.len();
    let mut scratch = comm.take_scratch(len * ranks.len());
    {
        let slots = scratch.bytes();
        slots[me * len..(me + 1) * len].copy_from_slice(&buf[own.clone()]);
        // (`split_n`: empty parts, when the buffer has fewer elements than ranks, still get
        // their empty receive, matching the peer's empty frame.)
        let mut recvs: Vec<(usize, u32, &mut [u8])> = crate::slices::split_n(slots, ranks.len())
            .into_iter()
            .enumerate()
            .filter(|(k, _)| *k != me)
            .map(|(k, s)| (ranks[k], step, s))
            .collect();
        let sends: Vec<(usize, u32, &[u8])> = (0..ranks.len())
            .filter(|k| *k != me)
            .map(|k| (ranks[k], step, &buf[parts[k].clone()]))
            .collect();
        comm.exchange(&sends, &mut recvs)?;
    }
    let slots = scratch.bytes();
    let (acc, rest) = slots.split_at_mut(len);
    for k in 1..ranks.len() {
        reduce_into(op, dtype, acc, &rest[(k - 1) * len..k * len])?;
    }
    buf[own].copy_from_slice(acc);
    comm.put_scratch(scratch);
    Ok(())
}

/// Phase 3: every local rank's final segment to every other local rank.
fn gather_in_host(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    locals: &[usize],
    i: usize,
    segs: &[std::ops::Range<usize>],
) -> Result<()> {
    spread(comm, buf, locals, i, segs, STEP_HOST_AG)
}

/// `ranks[me]` sends `buf[parts[me]]` to every other rank of `ranks` and receives
/// `buf[parts[k]]` from `ranks[k]`.
fn spread(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    ranks: &[usize],
    me: usize,
    parts: &[std::ops::Range<usize>],
    step: u32,
) -> Result<()> {
    let sizes: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    let mut pieces = crate::slices::split_sizes(buf, &sizes);
    let own: &[u8] = std::mem::take::<&mut [u8]>(&mut pieces[me]);
    let sends: Vec<(usize, u32, &[u8])> = (0..ranks.len())
        .filter(|k| *k != me)
        .map(|k| (ranks[k], step, own))
        .collect();
    let mut recvs: Vec<(usize, u32, &mut [u8])> = pieces
        .into_iter()
        .enumerate()
        .filter(|(k, _)| *k != me)
        .map(|(k, p)| (ranks[k], step, p))
        .collect();
    comm.exchange(&sends, &mut recvs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Views of `n` ranks placed on hosts `host[r]`.
    fn views(host: &[usize]) -> Vec<Vec<bool>> {
        let n = host.len();
        (0..n)
            .map(|r| (0..n).map(|p| p != r && host[p] == host[r]).collect())
            .collect()
    }

    #[test]
    fn hosts_from_consistent_views() {
        let h = Hosts::from_local_peers(&views(&[0, 1, 0, 1])).unwrap();
        assert_eq!(h.members, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(h.place, vec![(0, 0), (1, 0), (0, 1), (1, 1)]);
        assert_eq!(h.column(1), vec![2, 3]);
        let h = Hosts::from_local_peers(&views(&[0, 0, 0, 1, 1, 1])).unwrap();
        assert_eq!(h.members, vec![vec![0, 1, 2], vec![3, 4, 5]]);
    }

    #[test]
    fn no_hierarchy_for_one_host_single_ranks_or_uneven_hosts() {
        assert_eq!(Hosts::from_local_peers(&views(&[0, 0, 0, 0])), None);
        assert_eq!(Hosts::from_local_peers(&views(&[0, 1, 2])), None);
        assert_eq!(Hosts::from_local_peers(&views(&[0, 0, 0, 1])), None);
    }

    #[test]
    fn no_hierarchy_when_views_disagree() {
        // Rank 0 reaches 1 locally but 1 does not say so (asymmetric).
        let mut v = views(&[0, 0, 1, 1]);
        v[1][0] = false;
        assert_eq!(Hosts::from_local_peers(&v), None);
        // 0–1 and 1–2 local but 0–2 not (not transitive).
        let mut v = views(&[0, 0, 0, 1, 1, 1]);
        v[0][2] = false;
        v[2][0] = false;
        assert_eq!(Hosts::from_local_peers(&v), None);
    }
}

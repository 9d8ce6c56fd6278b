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
//! The host map comes from the identities the ranks publish in the store ([`Hosts::from_host_keys`]):
//! two ranks share a host when they run on the same kernel and network namespace; every rank
//! reads them once ([`probe`]), so all ranks derive the same map, and a map that is not a
//! partition into equal hosts of 2 ..= 16 ranks, at most 16 of them, keeps the flat algorithms.

use super::cma;
use super::part;
use super::step::{step, Phase};
use crate::engine::Comm;
use crate::hosts::Hosts;

mod pipelined;
use c10d_core::reduce::reduce_into;
use c10d_core::{DType, ReduceOp, Result};

/// Step tags of the phases (one frame per peer per phase).
const STEP_HOST_RS: u32 = step(Phase::HostReduce, 0, 0);
const STEP_CROSS_RS: u32 = step(Phase::CrossReduce, 0, 0);
const STEP_CROSS_AG: u32 = step(Phase::CrossGather, 0, 0);
const STEP_HOST_AG: u32 = step(Phase::HostGather, 0, 0);

/// Learns the host map from the identities every rank published (where it runs, whether it
/// allows two-level algorithms; one read of the store, no connection): every rank gets the same
/// answer. A rank that does not allow two-level algorithms makes the whole group stay flat.
/// Then the ranks of each host probe cross-memory attach among themselves and the group votes.
///
/// # Errors
/// A store failure reading the identities; as [`Comm::exchange`].
pub(crate) fn probe(comm: &mut Comm<'_>, cma_allowed: bool) -> Result<Option<Hosts>> {
    let r = comm.rank();
    if comm.size() > crate::hosts::MAX_MAP_RANKS {
        // More hosts or ranks per host than the two-level algorithms run over, whatever the
        // map: no need to read every rank's identity.
        log::info!("{}: more than 256 ranks: flat algorithms", comm.ctx());
        return Ok(None);
    }
    let ids = comm.identities()?;
    let keys: Vec<Option<&str>> = ids.iter().map(|i| i.host.as_deref()).collect();
    let allowed = ids.iter().all(|i| i.two_level);
    let mut hosts = Hosts::from_host_keys(&keys).filter(|_| allowed);
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

    fn keys(host: &[usize]) -> Vec<String> {
        host.iter().map(|h| format!("h{h}")).collect()
    }

    fn map(host: &[usize]) -> Option<Hosts> {
        let k = keys(host);
        Hosts::from_host_keys(&k.iter().map(|s| Some(s.as_str())).collect::<Vec<_>>())
    }

    #[test]
    fn hosts_from_host_keys() {
        let h = map(&[0, 1, 0, 1]).unwrap();
        assert_eq!(h.members, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(h.place, vec![(0, 0), (1, 0), (0, 1), (1, 1)]);
        assert_eq!(h.column(1), vec![2, 3]);
        let h = map(&[0, 0, 0, 1, 1, 1]).unwrap();
        assert_eq!(h.members, vec![vec![0, 1, 2], vec![3, 4, 5]]);
        assert_eq!(h.place[4], (1, 1));
    }

    #[test]
    fn no_hierarchy_for_one_host_single_ranks_uneven_or_too_wide_hosts() {
        assert_eq!(map(&[0, 0, 0, 0]), None);
        assert_eq!(map(&[0, 1, 2]), None);
        assert_eq!(map(&[0, 0, 0, 1]), None);
        // 8 hosts of 64 ranks: a rank would talk to 63 + 7 peers; the flat ring needs 2.
        let wide: Vec<usize> = (0..512).map(|r| r / 64).collect();
        assert_eq!(map(&wide), None);
        let ok: Vec<usize> = (0..256).map(|r| r % 16).collect();
        assert!(map(&ok).is_some());
    }

    #[test]
    fn a_rank_without_a_host_key_is_a_host_of_its_own() {
        let a = Some("a");
        assert_eq!(Hosts::from_host_keys(&[a, None, a, None]), None);
        assert_eq!(Hosts::from_host_keys(&[None, None]), None);
    }
}

//! The two-level all-reduce with cross-memory attach inside each host, pipelined in chunks so
//! that the link between hosts stays busy while the host's phases run.
//!
//! Local rank `i` owns segment `i` (as in the parent module), cut into `K` chunks; chunk `c`
//! is cut into one piece per host. For each chunk, in chunk order:
//! 1. host reduce: the host's copies of chunk `c` of segment `i` are folded into our buffer
//!    (our own copy first, then the local peers' in local-rank order, read from their memory);
//!    then piece `g` of the chunk goes to the rank of our column on host `g`;
//! 2. cross reduce, once the other hosts' copies of our piece arrived (in scratch): they are
//!    folded in host order and the result goes to every other host;
//! 3. once the other hosts' final pieces arrived in place, the chunk is final here and every
//!    local peer is told so (`FINAL`, one empty frame per chunk); a local peer's final chunk
//!    is read from its memory once it said so.
//!
//! A rank runs step 1 for chunk after chunk, and between chunks (and between the pieces of a
//! chunk) does whatever steps 2 and 3 have their data, without blocking ([`Posts::test`]), so
//! the link carries earlier chunks while later ones are reduced inside the host, and a slow
//! local peer delays only the reads of its own chunks. What is left runs in order at the end,
//! blocking. Receives are posted up front. A column peer's frames must arrive in the order they
//! are posted, whatever the timing, so it is fixed: reduce frame `t`, then final frame
//! `t − LAG`, for `t = 0, 1, ...` (a rank sends the final frame of chunk `c` only after the
//! reduce frame of chunk `c + LAG`, and waits for it before it sends the reduce frame after).
//! Local peers only send `FINAL` frames, in chunk order.
//!
//! Who reads what, and when: local rank `j` reads our copy of chunk `c` of its segment in its
//! step 1, and we write that chunk of our buffer (step 3) only after its `FINAL(c)`, which it
//! sends later; we read its final chunk only after that `FINAL(c)` too.
//! Nobody returns from the op before every local peer said `DONE` (it no longer reads our
//! buffer). A receive posted into bytes we still fold or send is right by causality: a final
//! piece can only arrive after its folder received our copy of it.
//!
//! Every element is folded by exactly one rank, in a fixed order: inside the host by the
//! owner of its segment (own copy, then local-rank order), across hosts by the owner of its
//! piece (host order). All ranks end with the same bits.

use super::super::cma::{self, Published};
use super::super::part;
use super::super::step::{step, Phase};
use crate::engine::{Buf, Comm, Posts};
use crate::hosts::Hosts;
use c10d_core::reduce::reduce_into;
use c10d_core::{DType, DistError, ReduceOp, Result};
use std::ops::Range;

/// Target bytes of one chunk of a segment (the pipeline's unit).
const CHUNK: usize = 1 << 20;
/// At most this many chunks per segment (frames per op stay few).
const MAX_CHUNKS: usize = 64;
/// Bytes folded per read of a peer's memory (fits L2 with the accumulator).
const PIECE: usize = 256 << 10;
/// The order of frames to a column peer: reduce frame `t`, then final frame `t − LAG`, for
/// `t = 0, 1, ...` (see the module docs): how far host reduces may run ahead of the link.
const LAG: usize = 2;
/// "I no longer read your buffer".
const STEP_DONE: u32 = step(Phase::HostDone, 0, 0);

/// Step of the cross-host reduce frame of chunk `c`.
const fn reduce_step(c: usize) -> u32 {
    step(Phase::CrossReduce, 0, c)
}

/// Step of the cross-host final frame of chunk `c`.
const fn gather_step(c: usize) -> u32 {
    step(Phase::CrossGather, 0, c)
}

/// Step of "chunk `c` of my segment is final, and I no longer read your copy of it".
const fn final_step(c: usize) -> u32 {
    step(Phase::HostFinal, 0, c)
}

/// Where every part of the buffer lies (all ranks compute the same plan).
struct Plan {
    es: usize,
    count: usize,
    /// Ranks per host, hosts.
    m: usize,
    h: usize,
    /// Our host and local index.
    host: usize,
    i: usize,
    /// Chunks per segment.
    chunks: usize,
    /// Bytes of one scratch slot (the largest piece).
    slot: usize,
}

impl Plan {
    fn new(len: usize, es: usize, hosts: &Hosts, rank: usize, chunk: usize) -> Plan {
        let (host, i) = hosts.place[rank];
        let (m, h) = (hosts.members[host].len(), hosts.members.len());
        let count = len / es;
        let seg_elems = count.div_ceil(m);
        let chunks = (seg_elems * es)
            .div_ceil(chunk.max(es))
            .clamp(1, MAX_CHUNKS);
        let chunk_elems = seg_elems.div_ceil(chunks);
        Plan {
            es,
            count,
            m,
            h,
            host,
            i,
            chunks,
            slot: chunk_elems.div_ceil(h) * es,
        }
    }

    /// Bytes of segment `j` (local rank `j` folds it).
    fn seg(&self, j: usize) -> Range<usize> {
        part(self.count, self.m, j, self.es)
    }

    /// Bytes of chunk `c` of segment `j`.
    fn chunk(&self, j: usize, c: usize) -> Range<usize> {
        let s = self.seg(j);
        let p = part(s.len() / self.es, self.chunks, c, self.es);
        s.start + p.start..s.start + p.end
    }

    /// Bytes of piece `g` (host `g`'s rank of our column folds it) of our chunk `c`.
    fn piece(&self, c: usize, g: usize) -> Range<usize> {
        let k = self.chunk(self.i, c);
        let p = part(k.len() / self.es, self.h, g, self.es);
        k.start + p.start..k.start + p.end
    }

    /// Scratch bytes where host `g`'s copy of our piece of chunk `c` lands (`g != host`).
    fn slot(&self, c: usize, g: usize) -> Range<usize> {
        let k = if g < self.host { g } else { g - 1 };
        let at = (c * (self.h - 1) + k) * self.slot;
        at..at + self.piece(c, self.host).len()
    }

    fn scratch_len(&self) -> usize {
        self.chunks * (self.h - 1) * self.slot
    }
}

/// The ranks the schedule talks to, and what it reads of the local peers.
struct Team<'a> {
    /// Our host's ranks, by local index.
    locals: &'a [usize],
    /// Our column: the rank of our local index on each host.
    column: &'a [usize],
    /// The local peers' published buffers, by local index.
    peers: &'a [Published],
}

/// A failed read of local rank `j`'s memory (mapped to the group's error after the posts).
type ReadFail = (usize, std::io::Error);

/// What a step that reads a local peer's memory ends with (inside the op's `Result`).
type Step = std::result::Result<(), ReadFail>;

/// Two-level all-reduce of `buf` in place, cross-memory attach inside hosts (see the module
/// docs); `hosts.cma` must be set.
///
/// # Errors
/// As [`Comm::wait`] (the group's failure, the op's time-out); a failed read of a local peer's
/// memory (the group fails with that text).
pub(crate) fn all_reduce(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    op: ReduceOp,
    dtype: DType,
    hosts: &Hosts,
) -> Result<()> {
    let p = Plan::new(buf.len(), dtype.size(), hosts, comm.rank(), CHUNK);
    let locals = hosts.members[p.host].clone();
    let column = hosts.column(p.i);
    let peers = cma::publish_among(comm, &locals, &[&*buf])?;
    for (j, pb) in peers.iter().enumerate() {
        if j != p.i && pb.len(0) != Some(buf.len() as u64) {
            let e = DistError::backend(format!(
                "{}: rank {}'s buffer has {} bytes, rank {}'s {}",
                comm.ctx(),
                locals[j],
                pb.len(0).unwrap_or(0),
                comm.rank(),
                buf.len()
            ));
            return Err(comm.fail_group(crate::engine::blaming(e, [locals[j]])));
        }
    }
    let team = Team {
        locals: &locals,
        column: &column,
        peers: &peers,
    };
    let mut scratch = comm.take_scratch(p.scratch_len());
    let mut tmp = comm.take_scratch(PIECE.min(p.seg(p.i).len()).max(1));
    let run = comm.with_posts(|posts| {
        schedule(
            posts,
            &p,
            &team,
            (op, dtype),
            buf,
            (scratch.bytes(), tmp.bytes()),
        )
    });
    comm.put_scratch(tmp);
    comm.put_scratch(scratch);
    if let Err((j, e)) = run? {
        return Err(cma::read_error(comm, locals[j], e));
    }
    cma::all_to_all(comm, &locals, STEP_DONE, &[], 0)?;
    Ok(())
}

/// Posts every receive, then runs the rounds (module docs). `Ok(Err(..))`: a read of a local
/// peer's memory failed.
fn schedule<'b>(
    posts: &mut Posts<'_, '_, 'b>,
    p: &Plan,
    team: &Team<'_>,
    (op, dtype): (ReduceOp, DType),
    buf: &'b mut [u8],
    (scratch, tmp): (&'b mut [u8], &mut [u8]),
) -> Result<Step> {
    let (b, s) = (posts.buffer(buf), posts.buffer(scratch));
    let ids = post_receives(posts, p, team, b, s)?;
    let mut run = Run {
        p,
        team,
        op: (op, dtype),
        bufs: (b, s),
        ids,
        reduced: 0,
        crossed: 0,
        finals: 0,
        read: vec![0; p.m],
    };
    while run.reduced < p.chunks {
        if let Err(f) = run.reduce_in_host(posts, tmp)? {
            return Ok(Err(f));
        }
        if let Err(f) = run.service(posts)? {
            return Ok(Err(f));
        }
    }
    while run.crossed < p.chunks {
        posts.wait(&run.ids.reduce[run.crossed])?;
        run.reduce_across(posts)?;
        if let Err(f) = run.service(posts)? {
            return Ok(Err(f));
        }
    }
    while run.finals < p.chunks {
        posts.wait(&run.ids.gather[run.finals])?;
        run.announce(posts);
        if let Err(f) = run.service(posts)? {
            return Ok(Err(f));
        }
    }
    for j in (0..p.m).filter(|&j| j != p.i) {
        while run.read[j] < p.chunks {
            posts.wait(&[run.ids.fin[run.read[j]][j]])?;
            if let Err(f) = run.read_final(posts, j)? {
                return Ok(Err(f));
            }
        }
    }
    posts.wait_all()?;
    Ok(Ok(()))
}

/// One op's rounds: what is posted, and how far each step got.
struct Run<'a> {
    p: &'a Plan,
    team: &'a Team<'a>,
    op: (ReduceOp, DType),
    /// The buffer and the scratch, as registered.
    bufs: (Buf, Buf),
    ids: Ids,
    /// Chunks reduced inside the host and sent across (step 1).
    reduced: usize,
    /// Chunks whose piece was folded across hosts and sent back (step 2).
    crossed: usize,
    /// Chunks final here and announced to the local peers (step 3).
    finals: usize,
    /// Per local rank: final chunks of its segment read (step 3).
    read: Vec<usize>,
}

impl Run<'_> {
    /// Does every step whose data is in, without blocking, until none is left (step 2 of
    /// chunk `c` only once step 1 sent chunk `c + LAG`, the order the column peers expect).
    fn service(&mut self, posts: &mut Posts<'_, '_, '_>) -> Result<Step> {
        let (p, k) = (self.p, self.p.chunks);
        loop {
            let mut moved = false;
            let sent_next = self.crossed + LAG < self.reduced || self.reduced == k;
            if self.crossed < self.reduced
                && sent_next
                && posts.test(&self.ids.reduce[self.crossed])?
            {
                self.reduce_across(posts)?;
                moved = true;
            }
            if self.finals < self.crossed && posts.test(&self.ids.gather[self.finals])? {
                self.announce(posts);
                moved = true;
            }
            for j in (0..p.m).filter(|&j| j != p.i) {
                if self.read[j] < k && posts.test(&[self.ids.fin[self.read[j]][j]])? {
                    if let Err(f) = self.read_final(posts, j)? {
                        return Ok(Err(f));
                    }
                    moved = true;
                }
            }
            if !moved {
                return Ok(Ok(()));
            }
        }
    }
}

/// The receive ids of one op: `reduce[c][k]` / `gather[c][k]` from the `k`-th other host,
/// `fin[c][j]` from local rank `j` (ours unused).
struct Ids {
    reduce: Vec<Vec<u64>>,
    gather: Vec<Vec<u64>>,
    fin: Vec<Vec<u64>>,
}

/// Posts every receive of the op, per peer in the order that peer sends.
fn post_receives(
    posts: &mut Posts<'_, '_, '_>,
    p: &Plan,
    team: &Team<'_>,
    b: Buf,
    s: Buf,
) -> Result<Ids> {
    let others: Vec<usize> = (0..p.h).filter(|&g| g != p.host).collect();
    let mut ids = Ids {
        reduce: vec![Vec::new(); p.chunks],
        gather: vec![Vec::new(); p.chunks],
        fin: vec![vec![0; p.m]; p.chunks],
    };
    for t in 0..p.chunks + LAG {
        for &g in &others {
            let peer = team.column[g];
            if t < p.chunks {
                ids.reduce[t].push(posts.recv(peer, reduce_step(t), s, p.slot(t, g))?);
            }
            if t >= LAG {
                let c = t - LAG;
                ids.gather[c].push(posts.recv(peer, gather_step(c), b, p.piece(c, g))?);
            }
        }
    }
    for (c, fin) in ids.fin.iter_mut().enumerate() {
        for (j, id) in fin.iter_mut().enumerate().filter(|(j, _)| *j != p.i) {
            *id = posts.await_signal(team.locals[j], final_step(c));
        }
    }
    Ok(ids)
}

impl Run<'_> {
    /// Step 1 for the next chunk: it becomes the host's fold of it (own copy first, then the
    /// local peers' in local-rank order), piece by piece, moving the sockets between pieces;
    /// then its pieces go to the other hosts.
    fn reduce_in_host(&mut self, posts: &mut Posts<'_, '_, '_>, tmp: &mut [u8]) -> Result<Step> {
        let (p, (op, dtype), b, c) = (self.p, self.op, self.bufs.0, self.reduced);
        let k = p.chunk(p.i, c);
        let mut off = k.start;
        while off < k.end {
            let l = tmp.len().min(k.end - off);
            for (j, peer) in self.team.peers.iter().enumerate() {
                if j == p.i {
                    continue;
                }
                let t = &mut tmp[..l];
                if let Err(e) = peer.read(0, off, t) {
                    return Ok(Err((j, e)));
                }
                reduce_into(op, dtype, posts.bytes_mut(b, off..off + l)?, t)?;
            }
            off += l;
            posts.test(&[])?;
        }
        while self.crossed + LAG < c {
            posts.wait(&self.ids.reduce[self.crossed])?;
            self.reduce_across(posts)?;
        }
        for g in (0..p.h).filter(|&g| g != p.host) {
            posts.send(self.team.column[g], reduce_step(c), b, p.piece(c, g))?;
        }
        self.reduced += 1;
        Ok(Ok(()))
    }

    /// Step 2 for the next chunk (the other hosts' copies of our piece are in): our piece
    /// becomes the fold of every host's copy in host order, and goes to the other hosts.
    fn reduce_across(&mut self, posts: &mut Posts<'_, '_, '_>) -> Result<()> {
        let (p, (op, dtype), (b, s), c) = (self.p, self.op, self.bufs, self.crossed);
        let mine = p.piece(c, p.host);
        if p.host == 0 {
            for g in 1..p.h {
                posts.fold(op, dtype, (b, mine.clone()), (s, p.slot(c, g)))?;
            }
        } else {
            // Host 0's copy is the accumulator: fold hosts 1.. (ours in its place) into it.
            let acc = p.slot(c, 0);
            for g in 1..p.h {
                let src = if g == p.host {
                    (b, mine.clone())
                } else {
                    (s, p.slot(c, g))
                };
                posts.fold(op, dtype, (s, acc.clone()), src)?;
            }
            posts.copy((b, mine.clone()), (s, acc))?;
        }
        for g in (0..p.h).filter(|&g| g != p.host) {
            posts.send(self.team.column[g], gather_step(c), b, mine.clone())?;
        }
        self.crossed += 1;
        Ok(())
    }

    /// Step 3 for the next chunk (the other hosts' final pieces are in): tells the local peers
    /// it is final.
    fn announce(&mut self, posts: &mut Posts<'_, '_, '_>) {
        for j in (0..self.p.m).filter(|&j| j != self.p.i) {
            posts.signal(self.team.locals[j], final_step(self.finals));
        }
        self.finals += 1;
    }

    /// Step 3's read: the next final chunk of local rank `j`'s segment (it said so), from its
    /// memory.
    fn read_final(&mut self, posts: &mut Posts<'_, '_, '_>, j: usize) -> Result<Step> {
        let k = self.p.chunk(j, self.read[j]);
        let dst = posts.bytes_mut(self.bufs.0, k.clone())?;
        if let Err(e) = self.team.peers[j].read(0, k.start, dst) {
            return Ok(Err((j, e)));
        }
        self.read[j] += 1;
        Ok(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `h` hosts of `m` ranks (host `g` holds ranks `g * m ..`).
    fn hosts(h: usize, m: usize) -> Hosts {
        Hosts {
            members: (0..h).map(|g| (g * m..(g + 1) * m).collect()).collect(),
            place: (0..h * m).map(|r| (r / m, r % m)).collect(),
            cma: true,
        }
    }

    /// Every byte of the buffer lies in exactly one chunk, every chunk of our segment splits
    /// into the pieces in host order, and the scratch slots hold their pieces without
    /// overlapping.
    #[test]
    fn plan_covers_every_element_once() {
        for (h, m) in [(2, 2), (2, 3), (3, 2), (4, 4)] {
            let hs = hosts(h, m);
            for es in [1, 2, 4, 8] {
                for count in [1, 2, 5, 7, 64, 1001, 65_537, 1_000_003] {
                    for chunk in [es, 4096, 1 << 20] {
                        check_plan(&hs, count * es, es, chunk);
                    }
                }
            }
        }
    }

    fn check_plan(hs: &Hosts, len: usize, es: usize, chunk: usize) {
        let mut owner = vec![0u8; len];
        for r in 0..hs.place.len() {
            let p = Plan::new(len, es, hs, r, chunk);
            assert!(p.chunks >= 1 && p.chunks <= MAX_CHUNKS);
            let mut at = p.seg(p.i).start;
            for c in 0..p.chunks {
                let k = p.chunk(p.i, c);
                assert_eq!(k.start, at, "chunks of a segment are contiguous");
                let mut q = k.start;
                for g in 0..p.h {
                    let piece = p.piece(c, g);
                    assert_eq!(piece.start, q, "pieces of a chunk are contiguous");
                    q = piece.end;
                }
                assert_eq!(q, k.end);
                at = k.end;
                if hs.place[r].0 == 0 {
                    owner[k].iter_mut().for_each(|o| *o += 1);
                }
            }
            assert_eq!(at, p.seg(p.i).end);
            let mut used = vec![false; p.scratch_len()];
            for c in 0..p.chunks {
                for g in (0..p.h).filter(|&g| g != p.host) {
                    let slot = p.slot(c, g);
                    assert!(slot.end <= p.scratch_len());
                    assert_eq!(slot.len(), p.piece(c, p.host).len());
                    for u in &mut used[slot] {
                        assert!(!*u, "slots overlap");
                        *u = true;
                    }
                }
            }
        }
        assert!(
            owner.iter().all(|&o| o == 1),
            "{len} bytes: every byte in one chunk of host 0"
        );
    }
}

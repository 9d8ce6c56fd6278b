//! Broadcast: binomial tree (small) and pipelined chain with receiver-driven flow control
//! (large).

use crate::engine::Comm;
use c10d_core::Result;

use super::step::READY;

/// The chain sends this much of the buffer before its successor's [`READY`] frame arrived.
const EAGER_BYTES: usize = 128 << 10;

/// Binomial tree rooted at `root`. With virtual rank v = r − root (mod n), v receives from
/// v − 2^b where 2^b is its lowest set bit, then sends to v + 2^j for j < b (v = 0: every j
/// with 2^j < n). ⌈log₂ n⌉ rounds.
pub(crate) fn tree(comm: &mut Comm<'_>, buf: &mut [u8], root: usize) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    if n == 1 {
        return Ok(());
    }
    let vr = (r + n - root) % n;
    let mut mask = 1usize;
    while mask < n {
        if vr & mask != 0 {
            let src = (vr - mask + root) % n;
            comm.exchange(&[], &mut [(src, 0, &mut *buf)])?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    let mut sends: Vec<(usize, u32, &[u8])> = Vec::new();
    while mask > 0 {
        if vr + mask < n {
            sends.push(((vr + mask + root) % n, 0, &*buf));
        }
        mask >>= 1;
    }
    comm.exchange(&sends, &mut [])
}

/// Pipelined chain root → root+1 → … → root−1 in chunks of `chunk_bytes` (groups of more than
/// 4 ranks use smaller chunks for a short buffer, so that it still forms about n−1 chunks of
/// at least 64 KiB): each chunk is forwarded as soon as it arrived, so the chain costs about
/// one buffer time plus n−2 chunk times.
///
/// Flow control: every rank but the root posts all its receives, then sends an empty
/// [`READY`] frame to its predecessor, which sends only the first [`EAGER_BYTES`] (one piece)
/// before that frame arrived. Without it a sender that runs ahead (the root of back-to-back
/// broadcasts, whose sends complete as soon as the kernel took the bytes) floods a receiver
/// still busy with the previous op, whose engine must then park every chunk in a temporary
/// buffer and copy it again later: on a loaded 2-core host that extra copy, allocation and
/// page faulting made 4-rank broadcasts of 0.5–64 MiB 2–5× slower than with the handshake.
/// The eager first piece hides the handshake's latency (it cost 2-rank broadcasts of
/// 0.5–1 MiB up to 2×).
pub(crate) fn chain(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    root: usize,
    chunk_bytes: usize,
) -> Result<()> {
    let (r, n, len) = (comm.rank(), comm.size(), buf.len());
    if n == 1 || len == 0 {
        return Ok(());
    }
    let vr = (r + n - root) % n;
    let prev = (r + n - 1) % n;
    let next = (vr + 1 < n).then_some((r + 1) % n);
    let mut chunk = chunk_bytes.max(1);
    if n > 4 {
        // Enough chunks to keep a long chain busy; with few ranks (the common single-host case,
        // where ranks share cores) fewer, larger frames cost less.
        chunk = chunk.min(len.div_ceil(n - 1).max(64 << 10));
    }
    // Pieces: [0, e) sent at once, then chunks of `chunk` bytes sent once the successor is ready.
    let e = EAGER_BYTES.min(len).min(chunk);
    let pieces: Vec<(usize, usize)> = std::iter::once((0, e))
        .filter(|(_, l)| *l > 0)
        .chain((e..len).step_by(chunk).map(|lo| (lo, chunk.min(len - lo))))
        .collect();
    let first_gated = usize::from(e > 0);
    let range = |k: usize| pieces[k].0..pieces[k].0 + pieces[k].1;
    comm.with_posts(|posts| {
        let b = posts.buffer(buf);
        // Our successor's ready frame; posted first, as it is the first frame it sends us.
        let mut ready = next.map(|nx| posts.await_signal(nx, READY));
        if vr == 0 {
            let nx = next.expect("n > 1");
            for k in 0..pieces.len() {
                if k == first_gated {
                    if let Some(id) = ready.take() {
                        posts.wait(&[id])?;
                    }
                }
                posts.send(nx, k as u32, b, range(k))?;
            }
        } else {
            let ids = (0..pieces.len())
                .map(|k| posts.recv(prev, k as u32, b, range(k)))
                .collect::<Result<Vec<u64>>>()?;
            posts.signal(prev, READY);
            for (k, id) in ids.iter().enumerate() {
                posts.wait(&[*id])?;
                if let Some(nx) = next {
                    if k == first_gated {
                        if let Some(rid) = ready.take() {
                            posts.wait(&[rid])?;
                        }
                    }
                    posts.send(nx, k as u32, b, range(k))?;
                }
            }
        }
        posts.wait_all()
    })
}

#[cfg(test)]
mod tests {
    use crate::algo::exchange::tests::{opts, run_world};
    use crate::{BroadcastAlgorithm, GlooOptions};
    use c10d_core::*;

    #[test]
    fn chain_back_to_back_every_world_and_root() {
        for n in [2usize, 3, 4, 5, 7] {
            let o = GlooOptions {
                broadcast_algorithm: BroadcastAlgorithm::Chain,
                pipeline_chunk_bytes: 100_000,
                ..opts()
            };
            run_world(n, o, move |r, pg| {
                for root in [0, n - 1] {
                    // Sizes below one chunk, a few chunks (n > 4: the short-buffer split), odd.
                    let lens = [3usize, 20_000, 70_001, 300_000];
                    let ops: Vec<(Tensor, Work, i32)> = lens
                        .iter()
                        .enumerate()
                        .map(|(k, len)| {
                            let v = (root * 1000 + k) as i32;
                            let t = Tensor::full(if r == root { v } else { -1 }, &[*len]);
                            let o = BroadcastOptions {
                                root_rank: root,
                                ..Default::default()
                            };
                            let w = pg.broadcast(std::slice::from_ref(&t), &o).unwrap();
                            (t, w, v)
                        })
                        .collect();
                    for (t, w, v) in ops {
                        w.wait().unwrap();
                        let got = t.to_vec::<i32>().unwrap();
                        assert!(got.iter().all(|x| *x == v), "n {n} root {root} rank {r}");
                    }
                }
            });
        }
    }
}

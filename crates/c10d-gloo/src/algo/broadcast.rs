//! Broadcast: binomial tree (small) and pipelined chain (large).

use crate::engine::Comm;
use c10d_core::Result;

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

/// Pipelined chain root → root+1 → … → root−1 in chunks of `chunk_bytes`: each chunk is
/// forwarded as soon as it arrived, so the chain costs about one buffer time plus n−2 chunk times.
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
    let chunk = chunk_bytes.max(1);
    let k_chunks = len.div_ceil(chunk);
    let bp = buf.as_mut_ptr();
    // SAFETY: every post refers to `buf`, which outlives this function; receives are waited on
    // before their chunk is forwarded, sends finish in `wait_all` (or are detached on error).
    unsafe {
        if vr == 0 {
            for k in 0..k_chunks {
                let lo = k * chunk;
                comm.post_send(
                    next.expect("n > 1"),
                    k as u32,
                    bp.add(lo),
                    chunk.min(len - lo),
                );
            }
        } else {
            let ids: Vec<u64> = (0..k_chunks)
                .map(|k| {
                    let lo = k * chunk;
                    comm.post_recv(prev, k as u32, bp.add(lo), chunk.min(len - lo))
                })
                .collect();
            for (k, id) in ids.iter().enumerate() {
                comm.wait(&[*id])?;
                if let Some(nx) = next {
                    let lo = k * chunk;
                    comm.post_send(nx, k as u32, bp.add(lo), chunk.min(len - lo));
                }
            }
        }
    }
    comm.wait_all()
}

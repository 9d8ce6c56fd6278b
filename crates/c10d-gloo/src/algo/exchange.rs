//! Data-movement collectives by direct exchange: all-gather, gather, scatter, all-to-all.
//!
//! All of them post every receive at once and let the engine drive the sockets full-duplex;
//! each byte crosses the wire once, so this is bandwidth-optimal on a full mesh (a ring would
//! move the same bytes in n−1 dependent steps). All-gather, gather and scatter also post every
//! send at once; all-to-all holds large blocks back until their receiver is ready (see
//! [`all_to_all`]).

use super::step::{READY, RTS};
use crate::engine::{Buf, Comm};
use c10d_core::Result;

/// All-gather of `inputs.len()` tensors: `outputs[i * n + p]` receives rank p's `inputs[i]`.
pub(crate) fn all_gather(
    comm: &mut Comm<'_>,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let mut recvs: Vec<(usize, u32, &mut [u8])> = Vec::new();
    for (j, o) in outputs.iter_mut().enumerate() {
        let (i, p) = (j / n, j % n);
        if p == r {
            o.copy_from_slice(inputs[i]);
        } else {
            recvs.push((p, i as u32, &mut **o));
        }
    }
    let mut sends: Vec<(usize, u32, &[u8])> = Vec::new();
    for (i, inp) in inputs.iter().enumerate() {
        for p in (0..n).filter(|p| *p != r) {
            sends.push((p, i as u32, inp));
        }
    }
    // Receives from one peer are listed in step order (i outer), matching its send order.
    recvs.sort_by_key(|(p, s, _)| (*p, *s));
    comm.exchange(&sends, &mut recvs)
}

/// Gather to `root`: on the root `outputs[p]` receives rank p's `input`.
pub(crate) fn gather(
    comm: &mut Comm<'_>,
    input: &[u8],
    outputs: &mut [&mut [u8]],
    root: usize,
) -> Result<()> {
    let r = comm.rank();
    if r != root {
        return comm.exchange(&[(root, 0, input)], &mut []);
    }
    let mut recvs: Vec<(usize, u32, &mut [u8])> = Vec::new();
    for (p, o) in outputs.iter_mut().enumerate() {
        if p == r {
            o.copy_from_slice(input);
        } else {
            recvs.push((p, 0, &mut **o));
        }
    }
    comm.exchange(&[], &mut recvs)
}

/// Scatter from `root`: rank p's `output` receives the root's `inputs[p]`.
pub(crate) fn scatter(
    comm: &mut Comm<'_>,
    inputs: &[&[u8]],
    output: &mut [u8],
    root: usize,
) -> Result<()> {
    let r = comm.rank();
    if r != root {
        return comm.exchange(&[], &mut [(root, 0, output)]);
    }
    output.copy_from_slice(inputs[r]);
    let sends: Vec<(usize, u32, &[u8])> = inputs
        .iter()
        .enumerate()
        .filter(|(p, _)| *p != r)
        .map(|(p, b)| (p, 0, *b))
        .collect();
    comm.exchange(&sends, &mut [])
}

/// Blocks of at least this many bytes wait for the receiver's ready frame (see [`all_to_all`]).
const PULL_MIN_BYTES: usize = 128 << 10;

/// All-to-all: block `inputs[p]` goes to rank p; `outputs[p]` receives rank p's block for us.
///
/// Every receive is posted at once; blocks under [`PULL_MIN_BYTES`] are sent at once too.
/// Larger blocks use receiver-driven flow control: the receiver, once its receives are posted,
/// sends an empty [`READY`] frame, and the block is sent (in pairwise order: r+1, r+2, …) only
/// after it arrived. Without it a rank that finished an op early floods peers still busy with
/// the previous one, whose engines must park the block in a temporary buffer and copy it again
/// (20–30% slower with 4 ranks at 0.5–64 MiB on a loaded 2-core host); the handshake costs one
/// message latency, which is why small blocks skip it.
///
/// Each side decides from its own view of the block size, which may be wrong (ranks whose split
/// sizes disagree), so a sender of a large block also announces it with an empty [`RTS`] frame
/// sent at once. Per peer and direction the frames are: `READY` (if the sender's block for us
/// is large), `RTS` (if our block for it is large), then the block; the peer posts its receives
/// from its own sizes in the same order, so a disagreement shows up as a frame that does not
/// match (an error naming both ranks) instead of two ranks waiting for each other's ready
/// frames until the timeout.
pub(crate) fn all_to_all(
    comm: &mut Comm<'_>,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let large: Vec<(bool, bool)> = (0..n)
        .map(|p| {
            (
                inputs[p].len() >= PULL_MIN_BYTES,
                outputs[p].len() >= PULL_MIN_BYTES,
            )
        })
        .collect();
    let out_len: Vec<usize> = outputs.iter().map(|o| o.len()).collect();
    outputs[r].copy_from_slice(inputs[r]);
    comm.with_posts(|posts| {
        let ins: Vec<Buf> = inputs.iter().map(|b| posts.input(b)).collect();
        let outs: Vec<Buf> = outputs.iter_mut().map(|b| posts.buffer(b)).collect();
        let whole = |b: &[u8]| 0..b.len();
        let mut ready = Vec::new();
        for i in 1..n {
            let p = (r + n - i) % n;
            if large[p].0 {
                ready.push((p, posts.await_signal(p, READY)));
            }
            if large[p].1 {
                posts.await_signal(p, RTS);
            }
            posts.recv(p, 0, outs[p], 0..out_len[p])?;
        }
        for i in 1..n {
            let p = (r + i) % n;
            if large[p].1 {
                posts.signal(p, READY);
            }
            if large[p].0 {
                posts.signal(p, RTS);
            } else {
                posts.send(p, 0, ins[p], whole(inputs[p]))?;
            }
        }
        // Large blocks in pairwise order (r+1, r+2, …) as their receivers become ready.
        ready.sort_by_key(|(p, _)| (p + n - r) % n);
        for (p, id) in ready {
            posts.wait(&[id])?;
            posts.send(p, 0, ins[p], whole(inputs[p]))?;
        }
        posts.wait_all()
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::{GlooOptions, ProcessGroupGloo};
    use c10d_core::*;
    use c10d_store::{HashStore, Store};
    use std::borrow::Cow;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Runs `f(rank, pg)` for `n` ranks on threads over one store; results in rank order.
    pub(crate) fn run_world<T: Send + 'static>(
        n: usize,
        o: GlooOptions,
        f: impl Fn(usize, Arc<ProcessGroupGloo>) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        let f = Arc::new(f);
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (s, o, f) = (store.clone(), o.clone(), f.clone());
                std::thread::spawn(move || {
                    let pg = ProcessGroupGloo::new(s, r, n, o).expect("create group");
                    f(r, pg)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    }

    pub(crate) fn opts() -> GlooOptions {
        GlooOptions {
            timeout: Duration::from_secs(60),
            ..Default::default()
        }
    }

    /// Elements rank `s` sends rank `d`: a mix of blocks above and below `PULL_MIN_BYTES`.
    fn block(s: usize, d: usize) -> usize {
        if (s + 2 * d).is_multiple_of(3) {
            33_000 + s
        } else {
            5 + d
        }
    }

    #[test]
    fn all_to_all_large_and_small_blocks_back_to_back() {
        for n in [2usize, 3, 4, 7] {
            run_world(n, opts(), move |r, pg| {
                let in_splits: Vec<usize> = (0..n).map(|d| block(r, d)).collect();
                let out_splits: Vec<usize> = (0..n).map(|s| block(s, r)).collect();
                // Several ops in flight at once: a rank may run ahead into the next op.
                let ops: Vec<(Tensor, Work)> = (0..4)
                    .map(|it| {
                        let data: Vec<i32> = (0..n)
                            .flat_map(|d| vec![(it * 10_000 + r * 100 + d) as i32; block(r, d)])
                            .collect();
                        let inp = Tensor::from_vec(data);
                        let out = Tensor::zeros(DType::I32, &[out_splits.iter().sum()]);
                        let w = pg
                            .run(Op::AllToAllSingle {
                                output: Cow::Owned(out.clone()),
                                input: Cow::Owned(inp),
                                output_split_sizes: out_splits.clone().into(),
                                input_split_sizes: in_splits.clone().into(),
                                opts: AllToAllOptions::default(),
                            })
                            .unwrap();
                        (out, w)
                    })
                    .collect();
                for (it, (out, w)) in ops.into_iter().enumerate() {
                    w.wait().unwrap();
                    let want: Vec<i32> = (0..n)
                        .flat_map(|s| vec![(it * 10_000 + s * 100 + r) as i32; block(s, r)])
                        .collect();
                    assert!(
                        out.to_vec::<i32>().unwrap() == want,
                        "n {n} rank {r} op {it}"
                    );
                }
            });
        }
    }

    #[test]
    fn all_to_all_disagreeing_split_sizes_fail_promptly() {
        // Each rank sends the other a large block (so it waits for the ready frame) but expects
        // a small one: if the ready frame depended on the receiver's view of the size, both
        // would wait for each other until the timeout. They must report the mismatch instead.
        let res = run_world(2, opts(), |r, pg| {
            let ins = if r == 0 {
                [1usize, 40_000]
            } else {
                [40_000, 1]
            };
            let outs = [1usize, 1];
            let inp = Tensor::zeros(DType::I32, &[ins.iter().sum()]);
            let out = Tensor::zeros(DType::I32, &[2]);
            let t0 = Instant::now();
            let res = pg
                .run(Op::AllToAllSingle {
                    output: Cow::Owned(out),
                    input: Cow::Owned(inp),
                    output_split_sizes: outs.to_vec().into(),
                    input_split_sizes: ins.to_vec().into(),
                    opts: AllToAllOptions::default(),
                })
                .unwrap()
                .wait();
            (res.err().map(|e| e.to_string()), t0.elapsed())
        });
        for (r, (e, took)) in res.iter().enumerate() {
            let e = e.as_deref().expect("both ranks must fail");
            assert!(e.contains("mismatch"), "rank {r}: {e}");
            assert!(*took < Duration::from_secs(20), "rank {r} took {took:?}");
        }
    }
}

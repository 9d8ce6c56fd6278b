//! Data-movement collectives by direct exchange: all-gather, gather, scatter, all-to-all.
//!
//! All of them post every receive and every send at once and let the engine drive the
//! sockets full-duplex; each byte crosses the wire once, so this is bandwidth-optimal on a full
//! mesh (a ring would move the same bytes in n−1 dependent steps).

use crate::engine::Comm;
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

/// All-to-all: block `inputs[p]` goes to rank p; `outputs[p]` receives rank p's block for us.
pub(crate) fn all_to_all(
    comm: &mut Comm<'_>,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
) -> Result<()> {
    let r = comm.rank();
    outputs[r].copy_from_slice(inputs[r]);
    let mut recvs: Vec<(usize, u32, &mut [u8])> = outputs
        .iter_mut()
        .enumerate()
        .filter(|(p, _)| *p != r)
        .map(|(p, b)| (p, 0, &mut **b))
        .collect();
    let sends: Vec<(usize, u32, &[u8])> = inputs
        .iter()
        .enumerate()
        .filter(|(p, _)| *p != r)
        .map(|(p, b)| (p, 0, *b))
        .collect();
    comm.exchange(&sends, &mut recvs)
}

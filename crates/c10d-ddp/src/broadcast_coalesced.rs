//! `broadcast_coalesced`: the initial parameter sync of DDP (`dist._broadcast_coalesced`), many
//! tensors broadcast through a few flat buffers.

use c10d_core::{
    BroadcastOptions, Collectives, DType, Device, DistError, ProcessGroup, Result, Tensor, Work,
};
use std::time::Duration;

/// DDP's `broadcast_bucket_size` for the initial sync: 250 MiB.
pub const DEFAULT_BROADCAST_BUCKET_SIZE: usize = 250 * 1024 * 1024;

/// Broadcasts `tensors` from group rank `src` to every rank, packed into flat buffers of one
/// dtype and device and about `buffer_size` bytes each (a buffer is closed once it reaches the
/// size), all launched at once and then awaited. Device tensors are packed on their device
/// (`Tensor::new_zeros`, on-device copies). Every rank must pass the same list of shapes and dtypes
/// (check with [`super::verify_params_across_processes`]).
///
/// `timeout` bounds each broadcast (`None` = the group's default backend timeout).
///
/// # Errors
/// [`DistError::InvalidArgument`] for `src` outside the group; a device whose storage cannot
/// allocate the flat buffer; a failed or timed-out broadcast.
pub fn broadcast_coalesced(
    pg: &ProcessGroup,
    tensors: &[Tensor],
    buffer_size: usize,
    src: usize,
    timeout: Option<Duration>,
) -> Result<()> {
    if src >= pg.size() {
        return Err(DistError::invalid(format!(
            "broadcast_coalesced: src {src} is not a rank of a group of size {}",
            pg.size()
        )));
    }
    let timeout = match timeout {
        Some(t) => t,
        None => pg.default_backend()?.timeout(),
    };
    let opts = BroadcastOptions {
        root_rank: src,
        timeout: Some(timeout),
        ..Default::default()
    };
    let mut inflight: Vec<(Vec<usize>, Tensor, Work)> = Vec::new();
    for group in take_tensors(tensors, buffer_size) {
        let flat = flatten(tensors, &group, pg.rank() == src)?;
        let work = pg.broadcast(std::slice::from_ref(&flat), &opts)?;
        inflight.push((group, flat, work));
    }
    for (group, flat, work) in inflight {
        work.wait_timeout(timeout)?;
        if pg.rank() != src {
            unflatten(tensors, &group, &flat)?;
        }
    }
    Ok(())
}

/// Groups tensor indices by dtype and device, in order, closing a group once it holds `limit`
/// bytes.
fn take_tensors(tensors: &[Tensor], limit: usize) -> Vec<Vec<usize>> {
    let mut done = Vec::new();
    let mut open: Vec<((DType, Device), Vec<usize>, usize)> = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let key = (t.dtype(), t.device());
        let pos = match open.iter().position(|g| g.0 == key) {
            Some(p) => p,
            None => {
                open.push((key, Vec::new(), 0));
                open.len() - 1
            }
        };
        let g = &mut open[pos];
        g.1.push(i);
        g.2 += t.nbytes();
        if g.2 >= limit {
            done.push(std::mem::take(&mut g.1));
            g.2 = 0;
        }
    }
    done.extend(open.into_iter().map(|g| g.1).filter(|g| !g.is_empty()));
    done
}

/// A flat buffer for `group` on its device, filled with the tensors' data when `fill`.
fn flatten(tensors: &[Tensor], group: &[usize], fill: bool) -> Result<Tensor> {
    let total: usize = group.iter().map(|&i| tensors[i].numel()).sum();
    let first = &tensors[group[0]];
    let flat = first.new_zeros(first.dtype(), &[total])?;
    if fill {
        let mut at = 0;
        for &i in group {
            let n = tensors[i].numel();
            flat.narrow(at, n)?.copy_from(&tensors[i].reshape(&[n])?)?;
            at += n;
        }
    }
    Ok(flat)
}

fn unflatten(tensors: &[Tensor], group: &[usize], flat: &Tensor) -> Result<()> {
    let mut at = 0;
    for &i in group {
        let n = tensors[i].numel();
        tensors[i].reshape(&[n])?.copy_from(&flat.narrow(at, n)?)?;
        at += n;
    }
    Ok(())
}

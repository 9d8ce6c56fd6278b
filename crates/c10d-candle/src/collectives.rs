//! The collectives on candle tensors. Every function takes the [`World`] whose groups to use
//! (`World::global()` for the process's default one) and an optional group (`None`: WORLD);
//! ranks (`src`, `dst`) are global ranks, as in `torch.distributed`. Tensors must be
//! contiguous, on the CPU (the group's CPU backend) or, with the `cuda` feature, on a CUDA
//! device (its NCCL backend, on candle's device stream); dtypes as the [crate docs](crate)
//! list. In-place ops write the tensor's own
//! storage: every candle tensor sharing that storage sees the result, as with PyTorch views.

#[cfg(feature = "cuda")]
use crate::cuda_slices::{CudaMut, CudaRef};
use crate::inplace::{check_device, device_refused, from_candle, on_elements};
use crate::slices::{check_u32_op, each_mut, slice_ref, SliceMut, SliceRef};
use c10d_core::{DistError, ReduceOp, Result};
use c10d_world::{GroupMember, World};
use candle_core::{Storage, Tensor};

/// `$body` with `$a` (output) and `$b` (input) bound to slices of one element type.
macro_rules! each_pair {
    ($o:expr, $i:expr, |$a:ident, $b:ident| $body:expr) => {
        match ($o, $i) {
            (SliceMut::F32($a), SliceRef::F32($b)) => $body,
            (SliceMut::F64($a), SliceRef::F64($b)) => $body,
            (SliceMut::F16($a), SliceRef::F16($b)) => $body,
            (SliceMut::BF16($a), SliceRef::BF16($b)) => $body,
            (SliceMut::U8($a), SliceRef::U8($b)) => $body,
            (SliceMut::I16($a), SliceRef::I16($b)) => $body,
            (SliceMut::I32($a), SliceRef::I32($b)) => $body,
            (SliceMut::I64($a), SliceRef::I64($b)) => $body,
            (SliceMut::U32($a), SliceRef::U32($b)) => $body,
            #[cfg(feature = "cuda")]
            (SliceMut::Cuda(o), SliceRef::Cuda(i)) => match (o, i) {
                (CudaMut::F32($a), CudaRef::F32($b)) => $body,
                (CudaMut::F64($a), CudaRef::F64($b)) => $body,
                (CudaMut::F16($a), CudaRef::F16($b)) => $body,
                (CudaMut::BF16($a), CudaRef::BF16($b)) => $body,
                (CudaMut::U8($a), CudaRef::U8($b)) => $body,
                (CudaMut::I32($a), CudaRef::I32($b)) => $body,
                (CudaMut::I64($a), CudaRef::I64($b)) => $body,
                _ => Err(DistError::invalid(
                    "c10d-candle: the output and input tensors have different dtypes",
                )),
            },
            _ => Err(DistError::invalid(
                "c10d-candle: the output and input tensors have different dtypes or devices",
            )),
        }
    };
}

/// `f` on `t`'s elements, read only.
fn with_input<R>(t: &Tensor, what: &str, f: impl FnOnce(SliceRef<'_>) -> Result<R>) -> Result<R> {
    check_device(t, what)?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(cs) => f(slice_ref(cs, layout, what)?),
        #[cfg(feature = "cuda")]
        Storage::Cuda(cs) => f(SliceRef::Cuda(crate::cuda_slices::cuda_slice_ref(
            cs, layout, what,
        )?)),
        _ => Err(device_refused(t, what)),
    }
}

/// `dist.all_reduce(t, op, group)`: `t` (any shape) becomes the reduction over the group's
/// ranks, in place.
///
/// # Errors
/// A tensor not on the CPU, not contiguous or of an unsupported dtype (U32 takes only SUM and
/// PRODUCT); the collective's error (a peer that left, a timeout, a shape mismatch across
/// ranks).
pub fn all_reduce(w: &World, t: &Tensor, op: ReduceOp, group: Option<&GroupMember>) -> Result<()> {
    on_elements(t, "all_reduce", &|s| {
        if let SliceMut::U32(_) = s {
            check_u32_op(op, "all_reduce")?;
        }
        each_mut!(s, |v| w.all_reduce(v).op(op).group(group).run().map(|_| ()))
    })
}

/// [`all_reduce`] into a new tensor (a copy of `t`), leaving `t` as it is.
///
/// # Errors
/// As [`all_reduce`].
pub fn all_reduced(
    w: &World,
    t: &Tensor,
    op: ReduceOp,
    group: Option<&GroupMember>,
) -> Result<Tensor> {
    let out = t.copy().map_err(from_candle)?;
    all_reduce(w, &out, op, group)?;
    Ok(out)
}

/// `dist.broadcast(t, src, group)`: `t` becomes global rank `src`'s tensor, in place.
///
/// # Errors
/// As [`all_reduce`]; `src` outside the group.
pub fn broadcast(w: &World, t: &Tensor, src: usize, group: Option<&GroupMember>) -> Result<()> {
    on_elements(t, "broadcast", &|s| {
        each_mut!(s, |v| w.broadcast(v, src).group(group).run().map(|_| ()))
    })
}

/// `dist.all_gather_into_tensor`: every rank's `t` (shape `[d0, ...]`, a scalar counts as
/// `[1]`) concatenated along dimension 0 in group-rank order, as a new tensor of shape
/// `[n * d0, ...]` (`n` the group's size).
///
/// # Errors
/// As [`all_reduce`].
pub fn all_gather(w: &World, t: &Tensor, group: Option<&GroupMember>) -> Result<Tensor> {
    let n = group_size(w, group)?;
    let mut dims = t.dims().to_vec();
    match dims.first_mut() {
        Some(d0) => *d0 *= n,
        None => dims.push(n),
    }
    let out = Tensor::zeros(dims, t.dtype(), t.device()).map_err(from_candle)?;
    on_elements(&out, "all_gather", &|o| {
        with_input(t, "all_gather", |i| {
            each_pair!(o, i, |a, b| w
                .all_gather_into_tensor(a, b)
                .group(group)
                .run()
                .map(|_| ()))
        })
    })?;
    Ok(out)
}

/// `dist.reduce_scatter_tensor`: `t` (shape `[n * k, ...]`) reduced over the group's ranks, and
/// this rank's `k` rows of the result, as a new tensor of shape `[k, ...]`.
///
/// # Errors
/// As [`all_reduce`]; a first dimension that `n` does not divide (naming both).
pub fn reduce_scatter(
    w: &World,
    t: &Tensor,
    op: ReduceOp,
    group: Option<&GroupMember>,
) -> Result<Tensor> {
    let n = group_size(w, group)?;
    let mut dims = t.dims().to_vec();
    match dims.first_mut() {
        Some(d0) if *d0 % n == 0 => *d0 /= n,
        _ => {
            return Err(DistError::invalid(format!(
                "c10d-candle: reduce_scatter of a tensor of shape {dims:?} over {n} ranks: the first dimension must be a multiple of {n}"
            )))
        }
    }
    let out = Tensor::zeros(dims, t.dtype(), t.device()).map_err(from_candle)?;
    on_elements(&out, "reduce_scatter", &|o| {
        if let SliceMut::U32(_) = o {
            check_u32_op(op, "reduce_scatter")?;
        }
        with_input(t, "reduce_scatter", |i| {
            each_pair!(o, i, |a, b| w
                .reduce_scatter_tensor(a, b)
                .op(op)
                .group(group)
                .run()
                .map(|_| ()))
        })
    })?;
    Ok(out)
}

/// `dist.send(t, dst, group)`: sends `t` to global rank `dst` (blocking until it is sent).
///
/// # Errors
/// As [`all_reduce`]; `dst` outside the group or this rank.
pub fn send(w: &World, t: &Tensor, dst: usize, group: Option<&GroupMember>) -> Result<()> {
    with_input(t, "send", |s| match s {
        SliceRef::F32(v) => w.send(v, dst).group(group).run().map(|_| ()),
        SliceRef::F64(v) => w.send(v, dst).group(group).run().map(|_| ()),
        SliceRef::F16(v) => w.send(v, dst).group(group).run().map(|_| ()),
        SliceRef::BF16(v) => w.send(v, dst).group(group).run().map(|_| ()),
        SliceRef::U8(v) => w.send(v, dst).group(group).run().map(|_| ()),
        SliceRef::I16(v) => w.send(v, dst).group(group).run().map(|_| ()),
        SliceRef::I32(v) | SliceRef::U32(v) => w.send(v, dst).group(group).run().map(|_| ()),
        SliceRef::I64(v) => w.send(v, dst).group(group).run().map(|_| ()),
        #[cfg(feature = "cuda")]
        SliceRef::Cuda(c) => match c {
            CudaRef::F32(v) => w.send(v, dst).group(group).run().map(|_| ()),
            CudaRef::F64(v) => w.send(v, dst).group(group).run().map(|_| ()),
            CudaRef::F16(v) => w.send(v, dst).group(group).run().map(|_| ()),
            CudaRef::BF16(v) => w.send(v, dst).group(group).run().map(|_| ()),
            CudaRef::U8(v) => w.send(v, dst).group(group).run().map(|_| ()),
            CudaRef::I32(v) => w.send(v, dst).group(group).run().map(|_| ()),
            CudaRef::I64(v) => w.send(v, dst).group(group).run().map(|_| ()),
        },
    })
}

/// `dist.recv(t, src, group)`: `t` becomes what global rank `src` sends, in place.
///
/// # Errors
/// As [`all_reduce`]; a message of another size.
pub fn recv(w: &World, t: &Tensor, src: usize, group: Option<&GroupMember>) -> Result<()> {
    on_elements(t, "recv", &|s| {
        each_mut!(s, |v| w.recv(v).src(src).group(group).run().map(|_| ()))
    })
}

fn group_size(w: &World, group: Option<&GroupMember>) -> Result<usize> {
    let n = w.get_world_size(group)?;
    usize::try_from(n)
        .map_err(|_| DistError::invalid("c10d-candle: this rank is not a member of the group"))
}

//! The collectives on candle tensors, called as c10d-world's are (see `c10d_world`'s "Call
//! style"): PyTorch's name and required arguments, its keyword arguments as builder methods
//! ([`Collective::group`], `.op(..)`), and `.run()` at the end:
//!
//! ```no_run
//! # use c10d_candle as cc;
//! # fn f(t: &candle_core::Tensor, sub: &c10d_world::GroupMember) -> c10d_core::Result<()> {
//! cc::all_reduce(t).op(c10d_core::ReduceOp::Sum).group(sub).run()?;
//! let all = cc::all_gather_into_tensor(t).run()?; // a new tensor: every rank's `t`, stacked
//! # Ok(()) }
//! ```
//!
//! The groups are those of [`World::global`] (the process's default world) unless
//! [`Collective::world`] names another (tests that run ranks as threads); `.group(..)` left out
//! is WORLD. Ranks (`src`, `dst`) are global ranks, as in `torch.distributed`. Tensors must be
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

/// One call: the op's arguments, the world and the group; ended by `.run()`.
#[must_use = "a collective does nothing until .run()"]
pub struct Collective<'a, Op> {
    args: Op,
    world: &'a World,
    group: Option<&'a GroupMember>,
}

impl<'a, Op> Collective<'a, Op> {
    fn new(args: Op) -> Self {
        Collective {
            args,
            world: World::global(),
            group: None,
        }
    }

    /// PyTorch's `group=`: the group to run on (`None`, the default: WORLD).
    pub fn group(mut self, group: impl Into<Option<&'a GroupMember>>) -> Self {
        self.group = group.into();
        self
    }

    /// The [`World`] whose groups to use (default [`World::global`]).
    pub fn world(mut self, world: &'a World) -> Self {
        self.world = world;
        self
    }
}

/// [`all_reduce`]'s arguments.
pub struct AllReduce<'a> {
    tensor: &'a Tensor,
    op: ReduceOp,
}

/// [`all_reduced`]'s arguments.
pub struct AllReduced<'a> {
    tensor: &'a Tensor,
    op: ReduceOp,
}

/// [`broadcast`]'s arguments.
pub struct Broadcast<'a> {
    tensor: &'a Tensor,
    src: usize,
}

/// [`all_gather_into_tensor`]'s arguments.
pub struct AllGatherIntoTensor<'a> {
    input: &'a Tensor,
}

/// [`reduce_scatter_tensor`]'s arguments.
pub struct ReduceScatterTensor<'a> {
    input: &'a Tensor,
    op: ReduceOp,
}

/// [`send`]'s arguments.
pub struct SendTensor<'a> {
    tensor: &'a Tensor,
    dst: usize,
}

/// [`recv`]'s arguments.
pub struct RecvTensor<'a> {
    tensor: &'a Tensor,
    src: usize,
}

/// `dist.all_reduce(tensor, op=SUM, group=None)`: `tensor` (any shape) becomes the reduction
/// over the group's ranks, in place. `.op(..)` sets the reduction (default SUM).
///
/// # Errors
/// (from `.run()`) A tensor not on the CPU, not contiguous or of an unsupported dtype (U32
/// takes only SUM and PRODUCT); the collective's error (a peer that left, a timeout, a shape
/// mismatch across ranks).
pub fn all_reduce(tensor: &Tensor) -> Collective<'_, AllReduce<'_>> {
    Collective::new(AllReduce {
        tensor,
        op: ReduceOp::Sum,
    })
}

impl<'a> Collective<'a, AllReduce<'a>> {
    /// PyTorch's `op=` (default SUM).
    pub fn op(mut self, op: ReduceOp) -> Self {
        self.args.op = op;
        self
    }

    /// Runs the all-reduce (blocking).
    ///
    /// # Errors
    /// As [`all_reduce`].
    pub fn run(self) -> Result<()> {
        let (w, group, op) = (self.world, self.group, self.args.op);
        on_elements(self.args.tensor, "all_reduce", &|s| {
            if let SliceMut::U32(_) = s {
                check_u32_op(op, "all_reduce")?;
            }
            each_mut!(s, |v| w.all_reduce(v).op(op).group(group).run().map(|_| ()))
        })
    }
}

/// [`all_reduce`] into a new tensor (a copy of `tensor`), leaving `tensor` as it is (not a
/// PyTorch function: `dist.all_reduce(t.clone())`). `.op(..)` as for [`all_reduce`].
///
/// # Errors
/// As [`all_reduce`].
pub fn all_reduced(tensor: &Tensor) -> Collective<'_, AllReduced<'_>> {
    Collective::new(AllReduced {
        tensor,
        op: ReduceOp::Sum,
    })
}

impl<'a> Collective<'a, AllReduced<'a>> {
    /// PyTorch's `op=` (default SUM).
    pub fn op(mut self, op: ReduceOp) -> Self {
        self.args.op = op;
        self
    }

    /// Runs the all-reduce on a copy (blocking) and returns the copy.
    ///
    /// # Errors
    /// As [`all_reduce`].
    pub fn run(self) -> Result<Tensor> {
        let out = self.args.tensor.copy().map_err(from_candle)?;
        all_reduce(&out)
            .op(self.args.op)
            .group(self.group)
            .world(self.world)
            .run()?;
        Ok(out)
    }
}

/// `dist.broadcast(tensor, src, group=None)`: `tensor` becomes global rank `src`'s tensor, in
/// place.
///
/// # Errors
/// (from `.run()`) As [`all_reduce`]; `src` outside the group.
pub fn broadcast(tensor: &Tensor, src: usize) -> Collective<'_, Broadcast<'_>> {
    Collective::new(Broadcast { tensor, src })
}

impl<'a> Collective<'a, Broadcast<'a>> {
    /// Runs the broadcast (blocking).
    ///
    /// # Errors
    /// As [`broadcast`].
    pub fn run(self) -> Result<()> {
        let (w, group, src) = (self.world, self.group, self.args.src);
        on_elements(self.args.tensor, "broadcast", &|s| {
            each_mut!(s, |v| w.broadcast(v, src).group(group).run().map(|_| ()))
        })
    }
}

/// `dist.all_gather_into_tensor(output, input, group=None)`: every rank's `input` (shape
/// `[d0, ...]`, a scalar counts as `[1]`) concatenated along dimension 0 in group-rank order.
/// The `output` PyTorch takes first is made here and returned by `.run()`: a new tensor of
/// shape `[n * d0, ...]` (`n` the group's size).
///
/// # Errors
/// (from `.run()`) As [`all_reduce`].
pub fn all_gather_into_tensor(input: &Tensor) -> Collective<'_, AllGatherIntoTensor<'_>> {
    Collective::new(AllGatherIntoTensor { input })
}

impl<'a> Collective<'a, AllGatherIntoTensor<'a>> {
    /// Runs the all-gather (blocking) and returns the output.
    ///
    /// # Errors
    /// As [`all_gather_into_tensor`].
    pub fn run(self) -> Result<Tensor> {
        let (w, group, t) = (self.world, self.group, self.args.input);
        let n = group_size(w, group)?;
        let mut dims = t.dims().to_vec();
        match dims.first_mut() {
            Some(d0) => *d0 *= n,
            None => dims.push(n),
        }
        let out = Tensor::zeros(dims, t.dtype(), t.device()).map_err(from_candle)?;
        on_elements(&out, "all_gather_into_tensor", &|o| {
            with_input(t, "all_gather_into_tensor", |i| {
                each_pair!(o, i, |a, b| w
                    .all_gather_into_tensor(a, b)
                    .group(group)
                    .run()
                    .map(|_| ()))
            })
        })?;
        Ok(out)
    }
}

/// `dist.reduce_scatter_tensor(output, input, op=SUM, group=None)`: `input` (shape
/// `[n * k, ...]`) reduced over the group's ranks, and this rank's `k` rows of the result. The
/// `output` PyTorch takes first is made here and returned by `.run()`: a new tensor of shape
/// `[k, ...]`. `.op(..)` sets the reduction (default SUM).
///
/// # Errors
/// (from `.run()`) As [`all_reduce`]; a first dimension that `n` does not divide (naming both).
pub fn reduce_scatter_tensor(input: &Tensor) -> Collective<'_, ReduceScatterTensor<'_>> {
    Collective::new(ReduceScatterTensor {
        input,
        op: ReduceOp::Sum,
    })
}

impl<'a> Collective<'a, ReduceScatterTensor<'a>> {
    /// PyTorch's `op=` (default SUM).
    pub fn op(mut self, op: ReduceOp) -> Self {
        self.args.op = op;
        self
    }

    /// Runs the reduce-scatter (blocking) and returns this rank's part.
    ///
    /// # Errors
    /// As [`reduce_scatter_tensor`].
    pub fn run(self) -> Result<Tensor> {
        let (w, group, t, op) = (self.world, self.group, self.args.input, self.args.op);
        let n = group_size(w, group)?;
        let mut dims = t.dims().to_vec();
        match dims.first_mut() {
            Some(d0) if *d0 % n == 0 => *d0 /= n,
            _ => {
                return Err(DistError::invalid(format!(
                    "c10d-candle: reduce_scatter_tensor of a tensor of shape {dims:?} over {n} ranks: the first dimension must be a multiple of {n}"
                )))
            }
        }
        let out = Tensor::zeros(dims, t.dtype(), t.device()).map_err(from_candle)?;
        on_elements(&out, "reduce_scatter_tensor", &|o| {
            if let SliceMut::U32(_) = o {
                check_u32_op(op, "reduce_scatter_tensor")?;
            }
            with_input(t, "reduce_scatter_tensor", |i| {
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
}

/// `dist.send(tensor, dst, group=None)`: sends `tensor` to global rank `dst` (`.run()` blocks
/// until it is sent).
///
/// # Errors
/// (from `.run()`) As [`all_reduce`]; `dst` outside the group or this rank.
pub fn send(tensor: &Tensor, dst: usize) -> Collective<'_, SendTensor<'_>> {
    Collective::new(SendTensor { tensor, dst })
}

impl<'a> Collective<'a, SendTensor<'a>> {
    /// Runs the send (blocking).
    ///
    /// # Errors
    /// As [`send`].
    pub fn run(self) -> Result<()> {
        let (w, group, dst) = (self.world, self.group, self.args.dst);
        with_input(self.args.tensor, "send", |s| match s {
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
}

/// `dist.recv(tensor, src, group=None)`: `tensor` becomes what global rank `src` sends, in
/// place.
///
/// # Errors
/// (from `.run()`) As [`all_reduce`]; a message of another size.
pub fn recv(tensor: &Tensor, src: usize) -> Collective<'_, RecvTensor<'_>> {
    Collective::new(RecvTensor { tensor, src })
}

impl<'a> Collective<'a, RecvTensor<'a>> {
    /// Runs the receive (blocking).
    ///
    /// # Errors
    /// As [`recv`].
    pub fn run(self) -> Result<()> {
        let (w, group, src) = (self.world, self.group, self.args.src);
        on_elements(self.args.tensor, "recv", &|s| {
            each_mut!(s, |v| w.recv(v).src(src).group(group).run().map(|_| ()))
        })
    }
}

fn group_size(w: &World, group: Option<&GroupMember>) -> Result<usize> {
    let n = w.get_world_size(group)?;
    usize::try_from(n)
        .map_err(|_| DistError::invalid("c10d-candle: this rank is not a member of the group"))
}

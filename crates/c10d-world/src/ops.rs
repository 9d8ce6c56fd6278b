//! Each collective of `torch.distributed` as a [`World`] method returning a [`Collective`]
//! builder: its arguments (one type per op), its optional keywords and its launch, with
//! PyTorch's Python-layer checks before the group's backend is called.
//!
//! Conventions (PyTorch's):
//! - [`GroupMember::NonGroupMember`](crate::GroupMember::NonGroupMember) → a warning ("Running {op} on global rank {r} which does
//!   not belong to the given group.") and no communication (see [`Collective::start`]).
//! - Roots are a [`Rank`]: global (`src`/`dst`) or group rank (`group_src`/`group_dst`).
//!   `gather`/`scatter` default to global rank 0, `recv` to any source.
//! - Tensor lists must share one dtype ("Invalid usage of tensors with different dtypes ...";
//!   a complex tensor counts as its real dtype).

use crate::buffer::{with_tensors, Buffer, BufferMut, SharedBuffer};
use crate::call::{keyword, unit_op, AsyncCall, Call, Collective, Keywords, Rank};
use crate::collectives::{check_complex_op, ensure_same_dtype, root_only_list};
use crate::world::World;
use c10d_core::{
    AllToAllOptions, AllgatherOptions, AllreduceOptions, BarrierOptions, BroadcastOptions,
    Collectives, DistError, GatherOptions, Op, OpType, ProcessGroup, ReduceOp, ReduceOptions,
    ReduceScatterOptions, Result, ScatterOptions, Tensor, Work,
};
use std::borrow::Cow;

/// Implements [`Call`] and [`AsyncCall`] for an argument type generic over its memory (the
/// [`Buffer`]s named in brackets): `run` views each buffer as a tensor for the call, `start`
/// exists when every buffer is a [`SharedBuffer`]; both end in the type's `launch_on` over
/// tensors: `buffer_op!(Type<[lifetime,] P: Bound, ..>, "name", OpType::X, |args| [fields]
/// resolved-expression);`.
macro_rules! buffer_op {
    ($ty:ident<$($l:lifetime,)? $($P:ident: $B:ident),+>, $name:literal, $op_type:expr,
     |$a:ident| [$($buf:ident),+] $resolved:expr) => {
        impl<$($l,)? $($P: $B),+> crate::call::Sealed for $ty<$($l,)? $($P),+> {}
        impl<$($l,)? $($P: $B),+> Call for $ty<$($l,)? $($P),+> {
            type Output = ();
            fn run(self, w: &World, kw: &Keywords<'_>) -> Result<()> {
                refuse_borrowed_in_coalescing(w, $name, $(<$P as Buffer>::BORROWED)||+)?;
                let $a = self;
                buffer_op!(@with $a, [$($buf),+], $resolved.launch_on(w, kw)).map(drop)
            }
        }
        impl<$($l,)? $($P: SharedBuffer),+> AsyncCall for $ty<$($l,)? $($P),+> {
            const NAME: &'static str = $name;
            const OP_TYPE: OpType = $op_type;
            fn launch(&self, w: &World, kw: &Keywords<'_>) -> Result<Option<Work>> {
                let $a = self;
                $(let $buf = $a.$buf.tensor();)+
                $resolved.launch_on(w, kw)
            }
        }
    };
    (@with $a:ident, [$b:ident], $e:expr) => { $a.$b.with_tensor(|$b| $e) };
    (@with $a:ident, [$o:ident, $i:ident], $e:expr) => { with_tensors($a.$o, $a.$i, |$o, $i| $e) };
}

/// Refuses an op on borrowed memory while a coalescing block is open: the block would launch
/// it after the call returned and the borrow ended.
fn refuse_borrowed_in_coalescing(w: &World, op: &str, borrowed: bool) -> Result<()> {
    if borrowed && w.lock().coalescing.is_some() {
        return Err(DistError::invalid(format!(
            "{op} on borrowed memory (a slice or array) cannot run inside a coalescing_manager block, which launches ops after the call returns; pass Tensors"
        )));
    }
    Ok(())
}

/// Arguments of [`World::all_reduce`].
#[derive(Debug)]
pub struct AllReduce<D> {
    tensor: D,
    op: ReduceOp,
}
impl AllReduce<&Tensor> {
    fn launch_on(&self, w: &World, kw: &Keywords<'_>) -> Result<Option<Work>> {
        let a = self;
        check_complex_op(a.op, &[a.tensor], "all_reduce")?;
        let Some(pg) = w.op_group(kw.group, "all_reduce")? else {
            return Ok(None);
        };
        let op = Op::AllReduce {
            tensors: Cow::Borrowed(std::slice::from_ref(a.tensor)),
            opts: AllreduceOptions {
                reduce_op: a.op,
                timeout: kw.timeout,
                async_op: kw.async_op,
            },
        };
        let Some(op) = w.defer_if_coalescing(&pg, op) else {
            return Ok(None);
        };
        let work = pg.run(op)?;
        w.launched(&pg, work, kw.async_op)
    }
}
buffer_op!(AllReduce<D: BufferMut>, "all_reduce", OpType::Allreduce, |a| [tensor] AllReduce { tensor, op: a.op });
keyword!([D] AllReduce<D>, /// PyTorch's `op=` (default [`ReduceOp::Sum`]).
    op: ReduceOp => |a, op| a.op = op);

/// Arguments of [`World::all_reduce_coalesced`].
#[derive(Debug)]
pub struct AllReduceCoalesced<'a> {
    tensors: &'a [Tensor],
    op: ReduceOp,
}
unit_op!([] AllReduceCoalesced<'_>,
    "all_reduce_coalesced",
    OpType::AllreduceCoalesced,
    |a, w, kw| {
        ensure_same_dtype(a.tensors)?;
        check_complex_op(a.op, &a.tensors.iter().collect::<Vec<_>>(), "all_reduce")?;
        let Some(pg) = w.op_group(kw.group, "all_reduce_coalesced")? else {
            return Ok(None);
        };
        let opts = AllreduceOptions {
            reduce_op: a.op,
            timeout: kw.timeout,
            async_op: kw.async_op,
        };
        let work = pg.all_reduce_coalesced(a.tensors, &opts)?;
        w.launched(&pg, work, kw.async_op)
    }
);
keyword!([] AllReduceCoalesced<'a>, /// PyTorch's `op=` (default [`ReduceOp::Sum`]).
    op: ReduceOp => |a, op| a.op = op);

/// Arguments of [`World::broadcast`].
#[derive(Debug)]
pub struct Broadcast<D> {
    tensor: D,
    src: Rank,
}
impl Broadcast<&Tensor> {
    fn launch_on(&self, w: &World, kw: &Keywords<'_>) -> Result<Option<Work>> {
        let a = self;
        let Some(pg) = w.op_group(kw.group, "broadcast")? else {
            return Ok(None);
        };
        let (src, group_src) = a.src.pair();
        let opts = BroadcastOptions {
            root_rank: w.group_rank_of(&pg, src, group_src)?,
            root_tensor: 0,
            timeout: kw.timeout,
            async_op: kw.async_op,
        };
        let work = pg.broadcast(std::slice::from_ref(a.tensor), &opts)?;
        w.launched(&pg, work, kw.async_op)
    }
}
buffer_op!(Broadcast<D: BufferMut>, "broadcast", OpType::Broadcast, |a| [tensor] Broadcast { tensor, src: a.src });

/// Arguments of [`World::reduce`].
#[derive(Debug)]
pub struct Reduce<D> {
    tensor: D,
    dst: Rank,
    op: ReduceOp,
}
impl Reduce<&Tensor> {
    fn launch_on(&self, w: &World, kw: &Keywords<'_>) -> Result<Option<Work>> {
        let a = self;
        check_complex_op(a.op, &[a.tensor], "reduce")?;
        let Some(pg) = w.op_group(kw.group, "reduce")? else {
            return Ok(None);
        };
        let (dst, group_dst) = a.dst.pair();
        let opts = ReduceOptions {
            reduce_op: a.op,
            root_rank: w.group_rank_of(&pg, dst, group_dst)?,
            root_tensor: 0,
            timeout: kw.timeout,
            async_op: kw.async_op,
        };
        let work = pg.reduce(std::slice::from_ref(a.tensor), &opts)?;
        w.launched(&pg, work, kw.async_op)
    }
}
buffer_op!(Reduce<D: BufferMut>, "reduce", OpType::Reduce, |a| [tensor] Reduce { tensor, dst: a.dst, op: a.op });
keyword!([D] Reduce<D>, /// PyTorch's `op=` (default [`ReduceOp::Sum`]).
    op: ReduceOp => |a, op| a.op = op);

fn allgather_opts(kw: &Keywords<'_>) -> AllgatherOptions {
    AllgatherOptions {
        timeout: kw.timeout,
        async_op: kw.async_op,
    }
}

/// Arguments of [`World::all_gather`].
#[derive(Debug)]
pub struct AllGather<'a> {
    tensor_list: &'a [Tensor],
    tensor: &'a Tensor,
}
unit_op!([] AllGather<'_>, "all_gather", OpType::Allgather, |a, w, kw| {
    ensure_same_dtype(a.tensor_list.iter().chain([a.tensor]))?;
    let Some(pg) = w.op_group(kw.group, "all_gather")? else {
        return Ok(None);
    };
    let outputs = [a.tensor_list.to_vec()];
    let work = pg.all_gather(
        &outputs,
        std::slice::from_ref(a.tensor),
        &allgather_opts(kw),
    )?;
    w.launched(&pg, work, kw.async_op)
});

/// Arguments of [`World::all_gather_into_tensor`].
#[derive(Debug)]
pub struct AllGatherIntoTensor<O, I> {
    output: O,
    input: I,
}
impl AllGatherIntoTensor<&Tensor, &Tensor> {
    fn launch_on(&self, w: &World, kw: &Keywords<'_>) -> Result<Option<Work>> {
        let a = self;
        ensure_same_dtype([a.output, a.input])?;
        let Some(pg) = w.op_group(kw.group, "all_gather_into_tensor")? else {
            return Ok(None);
        };
        let op = Op::AllGatherIntoTensor {
            output: Cow::Borrowed(a.output),
            input: Cow::Borrowed(a.input),
            opts: allgather_opts(kw),
        };
        let Some(op) = w.defer_if_coalescing(&pg, op) else {
            return Ok(None);
        };
        let work = pg.run(op)?;
        w.launched(&pg, work, kw.async_op)
    }
}
buffer_op!(AllGatherIntoTensor<O: BufferMut, I: Buffer>, "all_gather_into_tensor", OpType::AllgatherBase, |a| [output, input] AllGatherIntoTensor { output, input });

/// Arguments of [`World::all_gather_coalesced`].
#[derive(Debug)]
pub struct AllGatherCoalesced<'a> {
    output_tensor_lists: &'a [Vec<Tensor>],
    input_tensor_list: &'a [Tensor],
}
unit_op!([] AllGatherCoalesced<'_>,
    "all_gather_coalesced",
    OpType::AllgatherCoalesced,
    |a, w, kw| {
        let outs = a.output_tensor_lists.iter().flatten();
        ensure_same_dtype(a.input_tensor_list.iter().chain(outs))?;
        let Some(pg) = w.op_group(kw.group, "all_gather_coalesced")? else {
            return Ok(None);
        };
        let work = pg.all_gather_coalesced(
            a.output_tensor_lists,
            a.input_tensor_list,
            &allgather_opts(kw),
        )?;
        w.launched(&pg, work, kw.async_op)
    }
);

/// The root of gather/scatter: `root` when given, else global rank 0 (PyTorch's default).
fn root_or_global0(w: &World, pg: &ProcessGroup, root: Option<Rank>) -> Result<usize> {
    let (global, group) = root.map_or((None, None), Rank::pair);
    w.root_or_global0(pg, global, group)
}

/// The backend gather shared by [`World::gather`] and [`World::gather_single`] (`outputs`
/// empty off the root).
fn gather_launch(
    w: &World,
    pg: &ProcessGroup,
    kw: &Keywords<'_>,
    outputs: &[Vec<Tensor>],
    tensor: &Tensor,
    root: usize,
) -> Result<Option<Work>> {
    let opts = GatherOptions {
        root_rank: root,
        timeout: kw.timeout,
        async_op: kw.async_op,
    };
    let work = pg.gather(outputs, std::slice::from_ref(tensor), &opts)?;
    w.launched(pg, work, kw.async_op)
}

/// Arguments of [`World::gather`].
#[derive(Debug)]
pub struct Gather<'a> {
    tensor: &'a Tensor,
    gather_list: &'a [Tensor],
    dst: Option<Rank>,
}
unit_op!([] Gather<'_>, "gather", OpType::Gather, |a, w, kw| {
    ensure_same_dtype([a.tensor].into_iter().chain(a.gather_list))?;
    let Some(pg) = w.op_group(kw.group, "gather")? else {
        return Ok(None);
    };
    let root = root_or_global0(w, &pg, a.dst)?;
    let is_root = root == pg.rank();
    let outputs = root_only_list(a.gather_list, is_root, "gather_list", "destination")?;
    gather_launch(w, &pg, kw, &outputs, a.tensor, root)
});
keyword!([] Gather<'a>, /// PyTorch's `gather_list=`: one tensor per group rank, on the destination only.
    gather_list: &'a [Tensor] => |a, list| a.gather_list = list);
keyword!([] Gather<'a>, /// PyTorch's `dst=` ([`Rank::Global`], default 0) or `group_dst=` ([`Rank::Group`]).
    dst: impl Into<Rank> => |a, dst| a.dst = Some(dst.into()));

/// Arguments of [`World::gather_single`].
#[derive(Debug)]
pub struct GatherSingle<'a> {
    tensor: &'a Tensor,
    gather_tensor: Option<&'a Tensor>,
    dst: Option<Rank>,
}
unit_op!([] GatherSingle<'_>, "gather_single", OpType::Gather, |a, w, kw| {
    let Some(pg) = w.op_group(kw.group, "gather_single")? else {
        return Ok(None);
    };
    let root = root_or_global0(w, &pg, a.dst)?;
    let outputs = if root == pg.rank() {
        let g = a.gather_tensor.ok_or_else(|| {
            DistError::invalid("gather_tensor must be specified on the destination rank")
        })?;
        vec![gather_tensor_views(a.tensor, g, pg.size())?]
    } else {
        Vec::new()
    };
    gather_launch(w, &pg, kw, &outputs, a.tensor, root)
});
keyword!([] GatherSingle<'a>, /// PyTorch's `gather_tensor=`: on the destination, room for every rank's `tensor`.
    gather_tensor: &'a Tensor => |a, g| a.gather_tensor = Some(g));
keyword!([] GatherSingle<'a>, /// PyTorch's `dst=` ([`Rank::Global`], default 0) or `group_dst=` ([`Rank::Group`]).
    dst: impl Into<Rank> => |a, dst| a.dst = Some(dst.into()));

/// `gather_tensor` (world-size × `tensor` elements, flat or stacked) as one view per rank.
fn gather_tensor_views(tensor: &Tensor, g: &Tensor, n: usize) -> Result<Vec<Tensor>> {
    ensure_same_dtype([tensor, g])?;
    if g.numel() != n * tensor.numel() {
        return Err(DistError::invalid(format!(
            "gather_tensor must hold world_size ({n}) copies of tensor ({} elements each), but has {} elements",
            tensor.numel(),
            g.numel()
        )));
    }
    let views = g.reshape(&[g.numel()])?.chunk(n)?;
    views.iter().map(|v| v.reshape(tensor.shape())).collect()
}

/// Arguments of [`World::scatter`].
#[derive(Debug)]
pub struct Scatter<'a> {
    tensor: &'a Tensor,
    scatter_list: &'a [Tensor],
    src: Option<Rank>,
}
unit_op!([] Scatter<'_>, "scatter", OpType::Scatter, |a, w, kw| {
    ensure_same_dtype([a.tensor].into_iter().chain(a.scatter_list))?;
    let Some(pg) = w.op_group(kw.group, "scatter")? else {
        return Ok(None);
    };
    let root = root_or_global0(w, &pg, a.src)?;
    let inputs = root_only_list(a.scatter_list, root == pg.rank(), "scatter_list", "source")?;
    let opts = ScatterOptions {
        root_rank: root,
        timeout: kw.timeout,
        async_op: kw.async_op,
    };
    let work = pg.scatter(std::slice::from_ref(a.tensor), &inputs, &opts)?;
    w.launched(&pg, work, kw.async_op)
});
keyword!([] Scatter<'a>, /// PyTorch's `scatter_list=`: one tensor per group rank, on the source only.
    scatter_list: &'a [Tensor] => |a, list| a.scatter_list = list);
keyword!([] Scatter<'a>, /// PyTorch's `src=` ([`Rank::Global`], default 0) or `group_src=` ([`Rank::Group`]).
    src: impl Into<Rank> => |a, src| a.src = Some(src.into()));

fn reduce_scatter_opts(op: ReduceOp, kw: &Keywords<'_>) -> ReduceScatterOptions {
    ReduceScatterOptions {
        reduce_op: op,
        timeout: kw.timeout,
        async_op: kw.async_op,
    }
}

/// Arguments of [`World::reduce_scatter`].
#[derive(Debug)]
pub struct ReduceScatter<'a> {
    output: &'a Tensor,
    input_list: &'a [Tensor],
    op: ReduceOp,
}
unit_op!([] ReduceScatter<'_>,
    "reduce_scatter",
    OpType::ReduceScatter,
    |a, w, kw| {
        ensure_same_dtype([a.output].into_iter().chain(a.input_list))?;
        let Some(pg) = w.op_group(kw.group, "reduce_scatter")? else {
            return Ok(None);
        };
        let inputs = [a.input_list.to_vec()];
        let opts = reduce_scatter_opts(a.op, kw);
        let work = pg.reduce_scatter(std::slice::from_ref(a.output), &inputs, &opts)?;
        w.launched(&pg, work, kw.async_op)
    }
);
keyword!([] ReduceScatter<'a>, /// PyTorch's `op=` (default [`ReduceOp::Sum`]).
    op: ReduceOp => |a, op| a.op = op);

/// Arguments of [`World::reduce_scatter_tensor`].
#[derive(Debug)]
pub struct ReduceScatterTensor<O, I> {
    output: O,
    input: I,
    op: ReduceOp,
}
impl ReduceScatterTensor<&Tensor, &Tensor> {
    fn launch_on(&self, w: &World, kw: &Keywords<'_>) -> Result<Option<Work>> {
        let a = self;
        ensure_same_dtype([a.output, a.input])?;
        let Some(pg) = w.op_group(kw.group, "reduce_scatter_tensor")? else {
            return Ok(None);
        };
        let op = Op::ReduceScatterTensor {
            output: Cow::Borrowed(a.output),
            input: Cow::Borrowed(a.input),
            opts: reduce_scatter_opts(a.op, kw),
        };
        let Some(op) = w.defer_if_coalescing(&pg, op) else {
            return Ok(None);
        };
        let work = pg.run(op)?;
        w.launched(&pg, work, kw.async_op)
    }
}
buffer_op!(ReduceScatterTensor<O: BufferMut, I: Buffer>, "reduce_scatter_tensor", OpType::ReduceScatterBase, |a| [output, input] ReduceScatterTensor { output, input, op: a.op });
keyword!([O, I] ReduceScatterTensor<O, I>, /// PyTorch's `op=` (default [`ReduceOp::Sum`]).
    op: ReduceOp => |a, op| a.op = op);

/// Arguments of [`World::all_to_all`].
#[derive(Debug)]
pub struct AllToAll<'a> {
    output_tensor_list: &'a [Tensor],
    input_tensor_list: &'a [Tensor],
}
unit_op!([] AllToAll<'_>, "all_to_all", OpType::Alltoall, |a, w, kw| {
    ensure_same_dtype(a.output_tensor_list.iter().chain(a.input_tensor_list))?;
    let Some(pg) = w.op_group(kw.group, "all_to_all")? else {
        return Ok(None);
    };
    let opts = AllToAllOptions {
        timeout: kw.timeout,
        async_op: kw.async_op,
    };
    let work = pg.all_to_all(a.output_tensor_list, a.input_tensor_list, &opts)?;
    w.launched(&pg, work, kw.async_op)
});

/// Arguments of [`World::all_to_all_single`].
#[derive(Debug)]
pub struct AllToAllSingle<'a, O, I> {
    output: O,
    input: I,
    output_split_sizes: &'a [usize],
    input_split_sizes: &'a [usize],
}
impl AllToAllSingle<'_, &Tensor, &Tensor> {
    fn launch_on(&self, w: &World, kw: &Keywords<'_>) -> Result<Option<Work>> {
        let a = self;
        ensure_same_dtype([a.output, a.input])?;
        let Some(pg) = w.op_group(kw.group, "all_to_all_single")? else {
            return Ok(None);
        };
        let opts = AllToAllOptions {
            timeout: kw.timeout,
            async_op: kw.async_op,
        };
        let (outs, ins) = (a.output_split_sizes, a.input_split_sizes);
        let work = pg.all_to_all_single(a.output, a.input, outs, ins, &opts)?;
        w.launched(&pg, work, kw.async_op)
    }
}
buffer_op!(AllToAllSingle<'a, O: BufferMut, I: Buffer>, "all_to_all_single", OpType::AlltoallBase, |a| [output, input] AllToAllSingle { output, input, output_split_sizes: a.output_split_sizes, input_split_sizes: a.input_split_sizes });
keyword!([O, I] AllToAllSingle<'a, O, I>, /// PyTorch's `output_split_sizes=`: dim-0 rows received from each rank (default: equal).
    output_split_sizes: &'a [usize] => |a, s| a.output_split_sizes = s);
keyword!([O, I] AllToAllSingle<'a, O, I>, /// PyTorch's `input_split_sizes=`: dim-0 rows sent to each rank (default: equal).
    input_split_sizes: &'a [usize] => |a, s| a.input_split_sizes = s);

/// Arguments of [`World::barrier`].
#[derive(Debug)]
pub struct Barrier<'a> {
    device_ids: Option<&'a [u32]>,
}
unit_op!([] Barrier<'_>, "barrier", OpType::Barrier, |a, w, kw| {
    let Some(pg) = w.op_group(kw.group, "barrier")? else {
        return Ok(None);
    };
    // PyTorch: the first of `device_ids`, else the group's bound device, else its default.
    let device = match a.device_ids.and_then(|d| d.first()) {
        Some(&i) => Some(c10d_core::Device::Cuda(i)),
        None => pg.bound_device_id(),
    };
    let opts = BarrierOptions {
        device_ids: a.device_ids.map(|d| d.to_vec()).unwrap_or_default(),
        timeout: kw.timeout,
        device,
        async_op: kw.async_op,
    };
    let work = pg.barrier(&opts)?;
    w.launched(&pg, work, kw.async_op)
});
keyword!([] Barrier<'a>, /// PyTorch's `device_ids=`: the accelerator the barrier runs on (the first one).
    device_ids: &'a [u32] => |a, ids| a.device_ids = Some(ids));

/// Arguments of [`World::monitored_barrier`] (blocking only, as in PyTorch).
#[derive(Debug)]
pub struct MonitoredBarrier {
    wait_all_ranks: bool,
}
impl crate::call::Sealed for MonitoredBarrier {}
impl Call for MonitoredBarrier {
    type Output = ();
    fn run(self, w: &World, kw: &Keywords<'_>) -> Result<()> {
        let Some(pg) = w.op_group(kw.group, "monitored_barrier")? else {
            return Ok(());
        };
        if pg.backend(c10d_core::DeviceType::Cpu).is_err() {
            return Err(DistError::invalid(
                "monitored_barrier requires a group with a CPU-capable backend (e.g. GLOO).",
            ));
        }
        let opts = BarrierOptions {
            timeout: kw.timeout,
            ..Default::default()
        };
        pg.monitored_barrier(&opts, self.wait_all_ranks)
    }
}
impl Collective<'_, MonitoredBarrier> {
    /// PyTorch's `wait_all_ranks=`: rank 0 waits for every rank and names all that failed
    /// (default: it fails at the first).
    pub fn wait_all_ranks(mut self, wait_all_ranks: bool) -> Self {
        self.args.wait_all_ranks = wait_all_ranks;
        self
    }
}

/// Arguments of [`World::send`] / [`World::isend`]; `D` is the memory sent ([`Buffer`]).
#[derive(Debug)]
pub struct SendTensor<D> {
    tensor: D,
    dst: Rank,
    tag: i64,
}
impl<D: Buffer> crate::call::Sealed for SendTensor<D> {}
impl<D: Buffer> Call for SendTensor<D> {
    type Output = ();
    fn run(self, w: &World, kw: &Keywords<'_>) -> Result<()> {
        let (dst, tag) = (self.dst, self.tag);
        self.tensor
            .with_tensor(|t| match isend_on(w, kw, t, dst, tag)? {
                Some(work) => wait_within(&work, kw),
                None => Ok(()),
            })
    }
}
impl<D: SharedBuffer> AsyncCall for SendTensor<D> {
    const NAME: &'static str = "isend";
    const OP_TYPE: OpType = OpType::Send;
    fn launch(&self, w: &World, kw: &Keywords<'_>) -> Result<Option<Work>> {
        isend_on(w, kw, self.tensor.tensor(), self.dst, self.tag)
    }
}
keyword!([D] SendTensor<D>, /// PyTorch's `tag=` (default 0): matches a `recv` with the same tag.
    tag: i64 => |a, tag| a.tag = tag);

fn isend_on(w: &World, kw: &Keywords<'_>, t: &Tensor, dst: Rank, tag: i64) -> Result<Option<Work>> {
    let (dst, group_dst) = dst.pair();
    w.isend_pair(t, dst, kw.group, tag, group_dst)
}

/// Arguments of [`World::recv`] / [`World::irecv`]; `D` is the memory received into
/// ([`BufferMut`]).
#[derive(Debug)]
pub struct RecvTensor<D> {
    tensor: D,
    src: Option<Rank>,
    tag: i64,
}
impl<D: BufferMut> crate::call::Sealed for RecvTensor<D> {}
impl<D: BufferMut> Call for RecvTensor<D> {
    /// The sender's global rank (−1 on a non-member).
    type Output = i64;
    fn run(self, w: &World, kw: &Keywords<'_>) -> Result<i64> {
        let (src, tag) = (self.src, self.tag);
        self.tensor
            .with_tensor(|t| recv_blocking(w, kw, t, src, tag))
    }
}
impl<D: SharedBuffer> AsyncCall for RecvTensor<D> {
    const NAME: &'static str = "irecv";
    const OP_TYPE: OpType = OpType::Recv;
    fn launch(&self, w: &World, kw: &Keywords<'_>) -> Result<Option<Work>> {
        irecv_on(w, kw, self.tensor.tensor(), self.src, self.tag)
    }
}
keyword!([D] RecvTensor<D>, /// PyTorch's `src=` ([`Rank::Global`]) or `group_src=` ([`Rank::Group`]); default: any source.
    src: impl Into<Rank> => |a, src| a.src = Some(src.into()));
keyword!([D] RecvTensor<D>, /// PyTorch's `tag=` (default 0): matches a `send` with the same tag.
    tag: i64 => |a, tag| a.tag = tag);

fn irecv_on(
    w: &World,
    kw: &Keywords<'_>,
    t: &Tensor,
    src: Option<Rank>,
    tag: i64,
) -> Result<Option<Work>> {
    let (src, group_src) = src.map_or((None, None), Rank::pair);
    w.irecv_pair(t, src, kw.group, tag, group_src)
}

/// `recv`: receives into `t` and returns the sender's global rank (−1 on a non-member).
fn recv_blocking(
    w: &World,
    kw: &Keywords<'_>,
    t: &Tensor,
    src: Option<Rank>,
    tag: i64,
) -> Result<i64> {
    let Some(pg) = w.op_group(kw.group, "recv")? else {
        return Ok(-1);
    };
    let Some(work) = irecv_on(w, kw, t, src, tag)? else {
        return Ok(-1);
    };
    wait_within(&work, kw)?;
    let group_src_rank = match src {
        None => work.source_rank().ok_or_else(|| {
            DistError::backend("recv from any source: backend did not report the source rank")
        })?,
        Some(Rank::Group(g)) => g,
        Some(Rank::Global(r)) => w.get_group_rank(&pg, r)?,
    };
    Ok(w.get_global_rank(&pg, group_src_rank)? as i64)
}

/// Waits for a point-to-point `work`, within the call's timeout when one was given.
fn wait_within(work: &Work, kw: &Keywords<'_>) -> Result<()> {
    match kw.timeout {
        Some(t) => work.wait_timeout(t),
        None => work.wait(),
    }
}

impl World {
    /// `all_reduce(tensor, op=SUM, group=None, async_op=False)`: in-place reduction across
    /// the group. `tensor` is a [`Tensor`] or memory the caller owns ([`crate::buffer`]), as
    /// for every op here with a [`Buffer`] argument. Keywords: [`op`](Collective::<AllReduce>::op), `group`, `timeout`.
    ///
    /// # Errors
    /// Not initialized; "all_reduce does not support ReduceOp.MAX on complex tensors"; backend
    /// argument errors ("Cannot use ReduceOp.BAND with non-integral dtype ..."); the op's failure.
    pub fn all_reduce<D: BufferMut>(&self, tensor: D) -> Collective<'_, AllReduce<D>> {
        let op = ReduceOp::Sum;
        Collective::new(self, AllReduce { tensor, op })
    }

    /// `all_reduce_coalesced(tensors, op=SUM, group=None, async_op=False)`.
    ///
    /// # Errors
    /// "tensors with different dtypes"; complex with a non-complex op; backend errors.
    pub fn all_reduce_coalesced<'a>(
        &'a self,
        tensors: &'a [Tensor],
    ) -> Collective<'a, AllReduceCoalesced<'a>> {
        let op = ReduceOp::Sum;
        Collective::new(self, AllReduceCoalesced { tensors, op })
    }

    /// `broadcast(tensor, src, group=None, async_op=False, group_src=None)`: `src` is a global
    /// rank (`usize`) or a [`Rank::Group`].
    ///
    /// # Errors
    /// A global `src` outside the group; backend errors.
    pub fn broadcast<D: BufferMut>(
        &self,
        tensor: D,
        src: impl Into<Rank>,
    ) -> Collective<'_, Broadcast<D>> {
        let src = src.into();
        Collective::new(self, Broadcast { tensor, src })
    }

    /// `reduce(tensor, dst, op=SUM, group=None, async_op=False, group_dst=None)`.
    ///
    /// # Errors
    /// As [`World::broadcast`] and [`World::all_reduce`].
    pub fn reduce<D: BufferMut>(
        &self,
        tensor: D,
        dst: impl Into<Rank>,
    ) -> Collective<'_, Reduce<D>> {
        let (dst, op) = (dst.into(), ReduceOp::Sum);
        Collective::new(self, Reduce { tensor, dst, op })
    }

    /// `all_gather(tensor_list, tensor, group=None, async_op=False)`: `tensor_list[r]`
    /// receives rank r's tensor.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors ("invalid output tensor list" ...).
    pub fn all_gather<'a>(
        &'a self,
        tensor_list: &'a [Tensor],
        tensor: &'a Tensor,
    ) -> Collective<'a, AllGather<'a>> {
        Collective::new(
            self,
            AllGather {
                tensor_list,
                tensor,
            },
        )
    }

    /// `all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False)`:
    /// `output` is the dim-0 concatenation of every rank's `input`.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn all_gather_into_tensor<O: BufferMut, I: Buffer>(
        &self,
        output: O,
        input: I,
    ) -> Collective<'_, AllGatherIntoTensor<O, I>> {
        Collective::new(self, AllGatherIntoTensor { output, input })
    }

    /// `all_gather_single`: [`World::all_gather_into_tensor`] under PyTorch 2.15's new name.
    ///
    /// # Errors
    /// As [`World::all_gather_into_tensor`].
    pub fn all_gather_single<O: BufferMut, I: Buffer>(
        &self,
        output: O,
        input: I,
    ) -> Collective<'_, AllGatherIntoTensor<O, I>> {
        self.all_gather_into_tensor(output, input)
    }

    /// `all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None,
    /// async_op=False)`: `output_tensor_lists[r][i]` receives rank r's `input_tensor_list[i]`.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn all_gather_coalesced<'a>(
        &'a self,
        output_tensor_lists: &'a [Vec<Tensor>],
        input_tensor_list: &'a [Tensor],
    ) -> Collective<'a, AllGatherCoalesced<'a>> {
        let args = AllGatherCoalesced {
            output_tensor_lists,
            input_tensor_list,
        };
        Collective::new(self, args)
    }

    /// `gather(tensor, gather_list=None, dst=0, group=None, async_op=False, group_dst=None)`.
    /// Keywords: [`gather_list`](Collective::<Gather>::gather_list) (destination only),
    /// [`dst`](Collective::<Gather>::dst).
    ///
    /// # Errors
    /// "Argument ``gather_list`` must be specified on destination rank." / "... must NOT be
    /// specified on non-destination ranks."; "tensors with different dtypes"; backend errors.
    pub fn gather<'a>(&'a self, tensor: &'a Tensor) -> Collective<'a, Gather<'a>> {
        let args = Gather {
            tensor,
            gather_list: &[],
            dst: None,
        };
        Collective::new(self, args)
    }

    /// `gather_single(tensor, gather_tensor=None, dst=0, group=None, async_op=False,
    /// group_dst=None)`: on the root, `gather_tensor` (world-size × `tensor` elements, flat or
    /// stacked) receives every rank's `tensor` in group-rank order; elsewhere it is ignored.
    ///
    /// # Errors
    /// "gather_tensor must be specified on the destination rank"; a wrongly sized
    /// `gather_tensor`; "tensors with different dtypes"; backend errors.
    pub fn gather_single<'a>(&'a self, tensor: &'a Tensor) -> Collective<'a, GatherSingle<'a>> {
        let args = GatherSingle {
            tensor,
            gather_tensor: None,
            dst: None,
        };
        Collective::new(self, args)
    }

    /// `gather_into_tensor`: alias of [`World::gather_single`].
    ///
    /// # Errors
    /// As [`World::gather_single`].
    pub fn gather_into_tensor<'a>(
        &'a self,
        tensor: &'a Tensor,
    ) -> Collective<'a, GatherSingle<'a>> {
        self.gather_single(tensor)
    }

    /// `scatter(tensor, scatter_list=None, src=0, group=None, async_op=False, group_src=None)`.
    /// Keywords: [`scatter_list`](Collective::<Scatter>::scatter_list) (source only),
    /// [`src`](Collective::<Scatter>::src).
    ///
    /// # Errors
    /// "Argument ``scatter_list`` must be specified on source rank." / "Argument
    /// ``scatter_list`` must NOT be specified on non-source ranks."; "tensors with different
    /// dtypes"; backend errors.
    pub fn scatter<'a>(&'a self, tensor: &'a Tensor) -> Collective<'a, Scatter<'a>> {
        let args = Scatter {
            tensor,
            scatter_list: &[],
            src: None,
        };
        Collective::new(self, args)
    }

    /// `reduce_scatter(output, input_list, op=SUM, group=None, async_op=False)`: rank r's
    /// `output` = op over ranks of `input_list[r]`.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn reduce_scatter<'a>(
        &'a self,
        output: &'a Tensor,
        input_list: &'a [Tensor],
    ) -> Collective<'a, ReduceScatter<'a>> {
        let op = ReduceOp::Sum;
        Collective::new(
            self,
            ReduceScatter {
                output,
                input_list,
                op,
            },
        )
    }

    /// `reduce_scatter_tensor(output, input, op=SUM, group=None, async_op=False)`: `input` is
    /// group-size × `output` along dim 0.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn reduce_scatter_tensor<O: BufferMut, I: Buffer>(
        &self,
        output: O,
        input: I,
    ) -> Collective<'_, ReduceScatterTensor<O, I>> {
        let op = ReduceOp::Sum;
        Collective::new(self, ReduceScatterTensor { output, input, op })
    }

    /// `reduce_scatter_single`: [`World::reduce_scatter_tensor`] under PyTorch 2.15's new name.
    ///
    /// # Errors
    /// As [`World::reduce_scatter_tensor`].
    pub fn reduce_scatter_single<O: BufferMut, I: Buffer>(
        &self,
        output: O,
        input: I,
    ) -> Collective<'_, ReduceScatterTensor<O, I>> {
        self.reduce_scatter_tensor(output, input)
    }

    /// `all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False)`:
    /// `outputs[j]` receives rank j's `inputs[me]`.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn all_to_all<'a>(
        &'a self,
        output_tensor_list: &'a [Tensor],
        input_tensor_list: &'a [Tensor],
    ) -> Collective<'a, AllToAll<'a>> {
        let args = AllToAll {
            output_tensor_list,
            input_tensor_list,
        };
        Collective::new(self, args)
    }

    /// `all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
    /// group=None, async_op=False)`: equal dim-0 splits unless the split keywords are given.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn all_to_all_single<O: BufferMut, I: Buffer>(
        &self,
        output: O,
        input: I,
    ) -> Collective<'_, AllToAllSingle<'_, O, I>> {
        let args = AllToAllSingle {
            output,
            input,
            output_split_sizes: &[],
            input_split_sizes: &[],
        };
        Collective::new(self, args)
    }

    /// `barrier(group=None, async_op=False, device_ids=None)`.
    ///
    /// # Errors
    /// Not initialized; the barrier's failure (timeout, dead peer).
    pub fn barrier(&self) -> Collective<'_, Barrier<'_>> {
        Collective::new(self, Barrier { device_ids: None })
    }

    /// `monitored_barrier(group=None, timeout=None, wait_all_ranks=False)`: a barrier through
    /// rank 0 that names the ranks that did not arrive; blocking only. Non-members return at
    /// once. Without `.timeout(..)` the group backend's timeout applies (PyTorch: 30 min).
    ///
    /// # Errors
    /// "Rank 1 failed to pass monitoredBarrier in 2000 ms" (rank 0), "Rank {r} successfully
    /// reached monitoredBarrier, but received errors while waiting for send/recv from rank 0.
    /// Please check rank 0 logs for faulty rank." (others); no CPU backend → "monitored_barrier
    /// requires a group with a CPU-capable backend (e.g. GLOO).".
    pub fn monitored_barrier(&self) -> Collective<'_, MonitoredBarrier> {
        let args = MonitoredBarrier {
            wait_all_ranks: false,
        };
        Collective::new(self, args)
    }

    /// `send(tensor, dst, group=None, tag=0, group_dst=None)`: `.run()` blocks until sent,
    /// `.start()` is `isend`. `dst` is a global rank (`usize`) or a [`Rank::Group`].
    ///
    /// # Errors
    /// "Invalid destination rank: destination rank should not be the same as the rank of the
    /// current process."; a global `dst` outside the group; backend errors.
    pub fn send<D: Buffer>(
        &self,
        tensor: D,
        dst: impl Into<Rank>,
    ) -> Collective<'_, SendTensor<D>> {
        let dst = dst.into();
        Collective::new(
            self,
            SendTensor {
                tensor,
                dst,
                tag: 0,
            },
        )
    }

    /// `isend(tensor, dst, group=None, tag=0, group_dst=None)`: the same builder as
    /// [`World::send`]; end it with `.start()`.
    ///
    /// # Errors
    /// As [`World::send`].
    pub fn isend<D: Buffer>(
        &self,
        tensor: D,
        dst: impl Into<Rank>,
    ) -> Collective<'_, SendTensor<D>> {
        self.send(tensor, dst)
    }

    /// `recv(tensor, src=None, group=None, tag=0, group_src=None)`: `.run()` blocks and returns
    /// the sender's *global* rank (−1 on a non-member); `.start()` is `irecv` (see
    /// [`Work::source_rank`]). Without `.src(..)` any source matches.
    ///
    /// # Errors
    /// "Invalid source rank: source rank should not be the same as the rank of the current
    /// process."; backend errors.
    pub fn recv<D: BufferMut>(&self, tensor: D) -> Collective<'_, RecvTensor<D>> {
        Collective::new(
            self,
            RecvTensor {
                tensor,
                src: None,
                tag: 0,
            },
        )
    }

    /// `irecv(tensor, src=None, group=None, tag=0, group_src=None)`: the same builder as
    /// [`World::recv`]; end it with `.start()`.
    ///
    /// # Errors
    /// As [`World::recv`].
    pub fn irecv<D: BufferMut>(&self, tensor: D) -> Collective<'_, RecvTensor<D>> {
        self.recv(tensor)
    }
}

//! The `_c10d_functional` op set: collectives that return their outputs at once as
//! [`AsyncCollectiveTensor`]s and register their work in the work registry
//! ([`crate::registry`]), addressed by group name, handle, [`c10d_world::GroupMember`] or ranks +
//! tag ([`GroupRef`]).
//!
//! Ops without a trailing `_` write into **new** tensors and leave their inputs alone; `_` ops
//! work in place and return the same tensor (same storage); `_out` ops write into the given
//! output. Reduce ops are PyTorch's strings ("sum", "avg", "product", "min", "max", "band",
//! "bor", "bxor", "premul_sum"; anything else: "Unrecognized reduce_op: foo"). Ranks given to
//! `broadcast`, `isend` and `irecv` are **group** ranks, as in the C++ ops.
//!
//! The ops run on the group's backend for the tensors' device type (CPU gloo now; an accelerator
//! backend when one is registered).

use crate::async_tensor::AsyncCollectiveTensor;
use crate::group_ref::GroupRef;
use crate::registry;
use c10d_core::{
    AllToAllOptions, AllgatherOptions, AllreduceOptions, BroadcastOptions, Collectives, DType,
    DistError, ProcessGroup, ReduceOp, ReduceScatterOptions, Result, Tensor, Work,
};
use c10d_world::World;

/// The functional collectives on one [`World`] (`torch.distributed._functional_collectives`,
/// conventionally imported as `funcol`). [`Funcol::global`] uses the process-wide world.
#[derive(Clone, Copy, Debug)]
pub struct Funcol<'w> {
    world: &'w World,
}

/// Registers `work` under every output and wraps each output.
fn finish(outputs: Vec<Tensor>, work: Work) -> Vec<AsyncCollectiveTensor> {
    let id = registry::new_work_id();
    let refs: Vec<&Tensor> = outputs.iter().collect();
    registry::register_with_id(&refs, id, &work);
    outputs
        .into_iter()
        .map(|t| AsyncCollectiveTensor::new(t, Some(work.clone())))
        .collect()
}

fn finish_one(output: Tensor, work: Work) -> AsyncCollectiveTensor {
    finish(vec![output], work)
        .pop()
        .expect("one output in, one out")
}

fn parse_op(op: &str, tensors: &[&Tensor]) -> Result<ReduceOp> {
    let rop = ReduceOp::parse(op)?;
    for t in tensors {
        rop.check_dtype(t.dtype())?;
    }
    Ok(rop)
}

fn clone_all(ts: &[Tensor]) -> Result<Vec<Tensor>> {
    ts.iter().map(Tensor::deep_clone).collect()
}

/// Shape of `all_gather_into_tensor`'s output: dim 0 times `n` (a 0-d input gives `[n]`).
fn gathered_shape(shape: &[usize], n: usize) -> Vec<usize> {
    match shape.split_first() {
        None => vec![n],
        Some((d0, rest)) => std::iter::once(d0 * n)
            .chain(rest.iter().copied())
            .collect(),
    }
}

/// Shape of `reduce_scatter_tensor`'s output: dim 0 divided by `n` (warns when not divisible,
/// as PyTorch's op does; the backend then refuses the mismatched sizes).
fn scattered_shape(shape: &[usize], n: usize) -> Result<Vec<usize>> {
    let (d0, rest) = shape.split_first().ok_or_else(|| {
        DistError::invalid("reduce_scatter_tensor: input must have at least one dimension")
    })?;
    if d0 % n != 0 {
        log::warn!(
            "reduce_scatter_tensor: input dimension 0 ({d0}) is not a multiple of group_size {n}"
        );
    }
    Ok(std::iter::once(d0 / n)
        .chain(rest.iter().copied())
        .collect())
}

fn check_group_size(op: &str, pg: &ProcessGroup, group_size: usize) -> Result<()> {
    if pg.size() != group_size {
        return Err(DistError::invalid(format!(
            "{op}: group_size {group_size} does not match the size {} of group {:?}",
            pg.size(),
            pg.group_name()
        )));
    }
    Ok(())
}

impl Funcol<'static> {
    /// The functional collectives of [`World::global`].
    pub fn global() -> Funcol<'static> {
        Funcol {
            world: World::global(),
        }
    }
}

impl<'w> Funcol<'w> {
    /// The functional collectives of `world`.
    pub fn new(world: &'w World) -> Funcol<'w> {
        Funcol { world }
    }

    /// The world groups are resolved in.
    pub fn world(&self) -> &'w World {
        self.world
    }

    /// Resolves a group argument (see [`GroupRef::resolve`]).
    ///
    /// # Errors
    /// See [`GroupRef::resolve`].
    pub fn resolve<'g>(&self, group: impl Into<GroupRef<'g>>) -> Result<ProcessGroup> {
        group.into().resolve(self.world)
    }

    fn all_reduce_on(&self, pg: &ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Work> {
        pg.all_reduce(
            std::slice::from_ref(t),
            &AllreduceOptions {
                reduce_op: op,
                ..Default::default()
            },
        )
    }

    /// `all_reduce(t, op, group)`: the reduction into a **new** tensor (the input is untouched).
    ///
    /// # Errors
    /// "Unrecognized reduce_op: foo"; op/dtype errors ("ReduceOp.MAX does not support complex
    /// tensors ..."); group resolution and backend errors.
    pub fn all_reduce<'g>(
        &self,
        t: &Tensor,
        op: &str,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<AsyncCollectiveTensor> {
        let rop = parse_op(op, &[t])?;
        let pg = self.resolve(group)?;
        let out = t.deep_clone()?;
        let w = self.all_reduce_on(&pg, &out, rop)?;
        Ok(finish_one(out, w))
    }

    /// `all_reduce_(t, op, group)`: in place; the result wraps the same tensor.
    ///
    /// # Errors
    /// As [`Funcol::all_reduce`].
    pub fn all_reduce_<'g>(
        &self,
        t: &Tensor,
        op: &str,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<AsyncCollectiveTensor> {
        let rop = parse_op(op, &[t])?;
        let pg = self.resolve(group)?;
        let w = self.all_reduce_on(&pg, t, rop)?;
        Ok(finish_one(t.clone(), w))
    }

    fn coalesced_all_reduce(
        &self,
        ts: &[Tensor],
        op: &str,
        group: GroupRef<'_>,
        in_place: bool,
    ) -> Result<Vec<AsyncCollectiveTensor>> {
        let rop = parse_op(op, &ts.iter().collect::<Vec<_>>())?;
        let pg = group.resolve(self.world)?;
        let outs = if in_place {
            ts.to_vec()
        } else {
            clone_all(ts)?
        };
        if outs.is_empty() {
            return Ok(Vec::new());
        }
        let w = pg.all_reduce_coalesced(
            &outs,
            &AllreduceOptions {
                reduce_op: rop,
                ..Default::default()
            },
        )?;
        Ok(finish(outs, w))
    }

    /// `all_reduce_coalesced(ts, op, group)`: one op over several tensors, into new tensors;
    /// each output is registered (same work).
    ///
    /// # Errors
    /// As [`Funcol::all_reduce`]; tensors of different dtypes.
    pub fn all_reduce_coalesced<'g>(
        &self,
        ts: &[Tensor],
        op: &str,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<Vec<AsyncCollectiveTensor>> {
        self.coalesced_all_reduce(ts, op, group.into(), false)
    }

    /// `all_reduce_coalesced_(ts, op, group)`: in place.
    ///
    /// # Errors
    /// As [`Funcol::all_reduce_coalesced`].
    pub fn all_reduce_coalesced_<'g>(
        &self,
        ts: &[Tensor],
        op: &str,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<Vec<AsyncCollectiveTensor>> {
        self.coalesced_all_reduce(ts, op, group.into(), true)
    }

    /// `all_gather_into_tensor(t, group_size, group)`: the dim-0 concatenation of every rank's
    /// `t` in a new tensor (a 0-d input gives shape `[group_size]`).
    ///
    /// # Errors
    /// `group_size` differing from the group's size; group and backend errors.
    pub fn all_gather_into_tensor<'g>(
        &self,
        t: &Tensor,
        group_size: usize,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<AsyncCollectiveTensor> {
        let out = Tensor::zeros(t.dtype(), &gathered_shape(t.shape(), group_size));
        self.all_gather_into_tensor_out(t, group_size, group, &out)
    }

    /// `all_gather_into_tensor_out(t, group_size, group, *, out)`: into `out`.
    ///
    /// # Errors
    /// As [`Funcol::all_gather_into_tensor`]; a wrongly sized `out`.
    pub fn all_gather_into_tensor_out<'g>(
        &self,
        t: &Tensor,
        group_size: usize,
        group: impl Into<GroupRef<'g>>,
        out: &Tensor,
    ) -> Result<AsyncCollectiveTensor> {
        let pg = self.resolve(group)?;
        check_group_size("all_gather_into_tensor", &pg, group_size)?;
        let w = pg.all_gather_into_tensor(out, t, &AllgatherOptions::default())?;
        Ok(finish_one(out.clone(), w))
    }

    /// `all_gather_into_tensor_coalesced(ts, group_size, group)`: one gathered tensor per input,
    /// in one op.
    ///
    /// # Errors
    /// As [`Funcol::all_gather_into_tensor`].
    pub fn all_gather_into_tensor_coalesced<'g>(
        &self,
        ts: &[Tensor],
        group_size: usize,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<Vec<AsyncCollectiveTensor>> {
        let pg = self.resolve(group)?;
        check_group_size("all_gather_into_tensor_coalesced", &pg, group_size)?;
        let outs: Vec<Tensor> = ts
            .iter()
            .map(|t| Tensor::zeros(t.dtype(), &gathered_shape(t.shape(), group_size)))
            .collect();
        if outs.is_empty() {
            return Ok(Vec::new());
        }
        let w = pg.all_gather_into_tensor_coalesced(&outs, ts, &AllgatherOptions::default())?;
        Ok(finish(outs, w))
    }

    /// `reduce_scatter_tensor(t, op, group_size, group)`: rank r gets the reduction of the r-th
    /// dim-0 block of every rank's `t`, in a new tensor.
    ///
    /// # Errors
    /// As [`Funcol::all_reduce`]; `group_size` mismatch; backend size checks.
    pub fn reduce_scatter_tensor<'g>(
        &self,
        t: &Tensor,
        op: &str,
        group_size: usize,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<AsyncCollectiveTensor> {
        let out = Tensor::zeros(t.dtype(), &scattered_shape(t.shape(), group_size.max(1))?);
        self.reduce_scatter_tensor_out(t, op, group_size, group, &out)
    }

    /// `reduce_scatter_tensor_out(t, op, group_size, group, *, out)`: into `out`.
    ///
    /// # Errors
    /// As [`Funcol::reduce_scatter_tensor`].
    pub fn reduce_scatter_tensor_out<'g>(
        &self,
        t: &Tensor,
        op: &str,
        group_size: usize,
        group: impl Into<GroupRef<'g>>,
        out: &Tensor,
    ) -> Result<AsyncCollectiveTensor> {
        let rop = parse_op(op, &[t])?;
        let pg = self.resolve(group)?;
        check_group_size("reduce_scatter_tensor", &pg, group_size)?;
        let w = pg.reduce_scatter_tensor(
            out,
            t,
            &ReduceScatterOptions {
                reduce_op: rop,
                ..Default::default()
            },
        )?;
        Ok(finish_one(out.clone(), w))
    }

    /// `reduce_scatter_tensor_coalesced(ts, op, group_size, group)`.
    ///
    /// # Errors
    /// As [`Funcol::reduce_scatter_tensor`].
    pub fn reduce_scatter_tensor_coalesced<'g>(
        &self,
        ts: &[Tensor],
        op: &str,
        group_size: usize,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<Vec<AsyncCollectiveTensor>> {
        let rop = parse_op(op, &ts.iter().collect::<Vec<_>>())?;
        let pg = self.resolve(group)?;
        check_group_size("reduce_scatter_tensor_coalesced", &pg, group_size)?;
        let outs = ts
            .iter()
            .map(|t| {
                Ok(Tensor::zeros(
                    t.dtype(),
                    &scattered_shape(t.shape(), group_size)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        if outs.is_empty() {
            return Ok(Vec::new());
        }
        let w = pg.reduce_scatter_tensor_coalesced(
            &outs,
            ts,
            &ReduceScatterOptions {
                reduce_op: rop,
                ..Default::default()
            },
        )?;
        Ok(finish(outs, w))
    }

    /// `all_to_all_single(t, output_split_sizes, input_split_sizes, group)`: rank r sends
    /// `input_split_sizes[j]` dim-0 rows to rank j and receives `output_split_sizes[j]` rows from
    /// rank j, in rank order, into a new tensor. Both `None` = equal splits of dim 0.
    ///
    /// # Errors
    /// "output_split_sizes and input_split_sizes must either be specified together or both set
    /// to None"; split lists of the wrong length or sum; backend errors.
    pub fn all_to_all_single<'g>(
        &self,
        t: &Tensor,
        output_split_sizes: Option<&[usize]>,
        input_split_sizes: Option<&[usize]>,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<AsyncCollectiveTensor> {
        let pg = self.resolve(group)?;
        let n = pg.size();
        let (d0, rest) = t.shape().split_first().ok_or_else(|| {
            DistError::invalid("all_to_all_single: input must have at least one dimension")
        })?;
        let (outs, ins) = match (output_split_sizes, input_split_sizes) {
            (Some(o), Some(i)) => (o.to_vec(), i.to_vec()),
            (None, None) => (vec![d0 / n; n], vec![d0 / n; n]),
            _ => {
                return Err(DistError::invalid(
                    "output_split_sizes and input_split_sizes must either be specified together or both set to None",
                ))
            }
        };
        if outs.len() != n || ins.len() != n {
            return Err(DistError::invalid(format!(
                "all_to_all_single: split sizes must have one entry per rank ({n}), got output {} and input {}",
                outs.len(),
                ins.len()
            )));
        }
        let out_rows: usize = outs.iter().sum();
        let shape: Vec<usize> = std::iter::once(out_rows)
            .chain(rest.iter().copied())
            .collect();
        let out = Tensor::zeros(t.dtype(), &shape);
        let w = pg.all_to_all_single(&out, t, &outs, &ins, &AllToAllOptions::default())?;
        Ok(finish_one(out, w))
    }

    /// `broadcast(t, src, group)`: group rank `src`'s `t` on every rank, in a new tensor.
    ///
    /// # Errors
    /// `src` out of range; backend errors.
    pub fn broadcast<'g>(
        &self,
        t: &Tensor,
        src: usize,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<AsyncCollectiveTensor> {
        let pg = self.resolve(group)?;
        let out = t.deep_clone()?;
        let w = self.broadcast_on(&pg, &out, src)?;
        Ok(finish_one(out, w))
    }

    /// `broadcast_(t, src, group)`: in place.
    ///
    /// # Errors
    /// As [`Funcol::broadcast`].
    pub fn broadcast_<'g>(
        &self,
        t: &Tensor,
        src: usize,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<AsyncCollectiveTensor> {
        let pg = self.resolve(group)?;
        let w = self.broadcast_on(&pg, t, src)?;
        Ok(finish_one(t.clone(), w))
    }

    fn broadcast_on(&self, pg: &ProcessGroup, t: &Tensor, src: usize) -> Result<Work> {
        if src >= pg.size() {
            return Err(DistError::invalid(format!(
                "broadcast: src {src} is not a rank of group {:?} (size {})",
                pg.group_name(),
                pg.size()
            )));
        }
        pg.broadcast(
            std::slice::from_ref(t),
            &BroadcastOptions {
                root_rank: src,
                ..Default::default()
            },
        )
    }

    /// `isend(t, dst, tag, group)`: sends `t` to group rank `dst`; returns an empty placeholder
    /// tensor. The work is registered under `t` and the placeholder.
    ///
    /// # Errors
    /// Backend errors (bad peer, ...).
    pub fn isend<'g>(
        &self,
        t: &Tensor,
        dst: usize,
        tag: i64,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<AsyncCollectiveTensor> {
        let pg = self.resolve(group)?;
        let w = pg.send(std::slice::from_ref(t), dst, tag)?;
        let placeholder = Tensor::zeros(t.dtype(), &[0]);
        let id = registry::new_work_id();
        registry::register_with_id(&[t, &placeholder], id, &w);
        Ok(AsyncCollectiveTensor::new(placeholder, Some(w)))
    }

    /// `irecv(t, src, tag, group)`: receives into `t` from group rank `src`; returns `t`.
    ///
    /// # Errors
    /// Backend errors.
    pub fn irecv<'g>(
        &self,
        t: &Tensor,
        src: usize,
        tag: i64,
        group: impl Into<GroupRef<'g>>,
    ) -> Result<AsyncCollectiveTensor> {
        let pg = self.resolve(group)?;
        let w = pg.recv(std::slice::from_ref(t), src, tag)?;
        Ok(finish_one(t.clone(), w))
    }

    /// `batch_p2p_ops(ops, peers, tags, tensors, group)`: `ops[i]` is `"isend"` or `"irecv"` of
    /// `tensors[i]` with group rank `peers[i]` and `tags[i]`. Returns the tensors (each
    /// registered with its op's work). An empty batch returns one empty f32 tensor (PyTorch: one
    /// undefined tensor).
    ///
    /// # Errors
    /// Lists of different lengths; an op other than "isend"/"irecv"; backend errors.
    pub fn batch_p2p_ops<'g>(
        &self,
        ops: &[&str],
        peers: &[usize],
        tags: &[i64],
        tensors: &[Tensor],
        group: impl Into<GroupRef<'g>>,
    ) -> Result<Vec<AsyncCollectiveTensor>> {
        if ops.is_empty() {
            return Ok(vec![AsyncCollectiveTensor::new(
                Tensor::zeros(DType::F32, &[0]),
                None,
            )]);
        }
        if peers.len() != ops.len() || tags.len() != ops.len() || tensors.len() != ops.len() {
            return Err(DistError::invalid(format!(
                "batch_p2p_ops: ops ({}), peers ({}), tags ({}) and tensors ({}) must have the same length",
                ops.len(),
                peers.len(),
                tags.len(),
                tensors.len()
            )));
        }
        if let Some(bad) = ops.iter().find(|o| !matches!(**o, "isend" | "irecv")) {
            return Err(DistError::invalid(format!(
                "batch_p2p_ops: unknown op {bad:?} (expected \"isend\" or \"irecv\")"
            )));
        }
        let pg = self.resolve(group)?;
        let mut out = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let t = std::slice::from_ref(&tensors[i]);
            let w = if *op == "isend" {
                pg.send(t, peers[i], tags[i])?
            } else {
                pg.recv(t, peers[i], tags[i])?
            };
            out.push(finish_one(tensors[i].clone(), w));
        }
        Ok(out)
    }
}

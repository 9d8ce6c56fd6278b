//! The collectives of `torch.distributed` as methods of [`World`], with PyTorch's Python-layer
//! checks, then dispatched to the group's backend.
//!
//! Conventions (PyTorch's):
//! - `group: None` = WORLD; [`GroupMember::NonGroupMember`] → a warning ("Running {op} on global
//!   rank {r} which does not belong to the given group.") and `Ok(None)` without communicating.
//! - Roots are given either as global ranks (`src`/`dst`) or as group ranks
//!   (`group_src`/`group_dst`), never both ("Can't specify both group_rank and global_rank").
//! - `async_op == true` returns `Some(Work)`; otherwise the call waits and returns `None`.
//! - Tensor lists must share one dtype ("Invalid usage of tensors with different dtypes ...";
//!   a complex tensor counts as its real dtype).

use crate::world::{GroupMember, World, NOT_INITIALIZED};
use c10d_core::{
    AllToAllOptions, AllgatherOptions, AllreduceOptions, BarrierOptions, BroadcastOptions, DType,
    DistError, GatherOptions, ProcessGroup, ReduceOp, ReduceOptions, ReduceScatterOptions, Result,
    ScatterOptions, Tensor, Work,
};
use std::time::Duration;

/// Recorded state of an open [`World::coalescing_manager`] block.
pub(crate) struct CoalescingState {
    pg: ProcessGroup,
    ops: Vec<CollOp>,
    works: Vec<Work>,
}

enum CollOp {
    AllReduce(Tensor, ReduceOp),
    AllGatherIntoTensor(Tensor, Tensor),
    ReduceScatterTensor(Tensor, Tensor, ReduceOp),
}

impl CollOp {
    fn name(&self) -> &'static str {
        match self {
            CollOp::AllReduce(..) => "all_reduce",
            CollOp::AllGatherIntoTensor(..) => "all_gather_into_tensor",
            CollOp::ReduceScatterTensor(..) => "reduce_scatter_tensor",
        }
    }

    /// Issues this op alone (a backend without the fused op).
    fn launch(&self, pg: &ProcessGroup, async_op: bool) -> Result<Work> {
        match self {
            CollOp::AllReduce(t, op) => pg.all_reduce(
                std::slice::from_ref(t),
                &AllreduceOptions {
                    reduce_op: *op,
                    timeout: None,
                    async_op,
                },
            ),
            CollOp::AllGatherIntoTensor(out, inp) => pg.all_gather_into_tensor(
                out,
                inp,
                &AllgatherOptions {
                    timeout: None,
                    async_op,
                },
            ),
            CollOp::ReduceScatterTensor(out, inp, op) => pg.reduce_scatter_tensor(
                out,
                inp,
                &ReduceScatterOptions {
                    reduce_op: *op,
                    timeout: None,
                    async_op,
                },
            ),
        }
    }

    /// Issues `ops` (non-empty, all of `ops[0]`'s kind) as one coalesced op.
    fn launch_fused(pg: &ProcessGroup, ops: &[CollOp], async_op: bool) -> Result<Work> {
        match &ops[0] {
            CollOp::AllReduce(_, op) => {
                let mut ts = Vec::new();
                for o in ops {
                    if let CollOp::AllReduce(t, o2) = o {
                        if o2 != op {
                            return Err(DistError::invalid("coalescing_manager: all_reduce ops with different reduce ops cannot be coalesced"));
                        }
                        ts.push(t.clone());
                    }
                }
                pg.all_reduce_coalesced(
                    &ts,
                    &AllreduceOptions {
                        reduce_op: *op,
                        timeout: None,
                        async_op,
                    },
                )
            }
            CollOp::AllGatherIntoTensor(..) => {
                let (mut outs, mut ins) = (Vec::new(), Vec::new());
                for o in ops {
                    if let CollOp::AllGatherIntoTensor(out, inp) = o {
                        outs.push(out.clone());
                        ins.push(inp.clone());
                    }
                }
                pg.all_gather_into_tensor_coalesced(
                    &outs,
                    &ins,
                    &AllgatherOptions {
                        timeout: None,
                        async_op,
                    },
                )
            }
            CollOp::ReduceScatterTensor(_, _, op) => {
                let (mut outs, mut ins) = (Vec::new(), Vec::new());
                for o in ops {
                    if let CollOp::ReduceScatterTensor(out, inp, _) = o {
                        outs.push(out.clone());
                        ins.push(inp.clone());
                    }
                }
                pg.reduce_scatter_tensor_coalesced(
                    &outs,
                    &ins,
                    &ReduceScatterOptions {
                        reduce_op: *op,
                        timeout: None,
                        async_op,
                    },
                )
            }
        }
    }
}

/// The works of a coalescing block (`_CoalescingManager`).
#[derive(Debug, Default)]
pub struct CoalescingManager {
    /// One work per launched (fused or individual) operation.
    pub works: Vec<Work>,
}

impl CoalescingManager {
    /// Waits for every work.
    ///
    /// # Errors
    /// The first failed work's error.
    pub fn wait(&self) -> Result<()> {
        self.works.iter().try_for_each(|w| w.wait())
    }
}

/// Kind of a point-to-point op in a [`P2POp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2PKind {
    /// `torch.distributed.isend`
    Isend,
    /// `torch.distributed.irecv`
    Irecv,
}

/// One entry of [`World::batch_isend_irecv`] (`torch.distributed.P2POp`).
#[derive(Debug, Clone)]
pub struct P2POp {
    /// isend or irecv.
    pub op: P2PKind,
    /// Tensor to send or receive into.
    pub tensor: Tensor,
    /// Global peer rank (exclusive with `group_peer`).
    pub peer: Option<usize>,
    /// Group (None = WORLD).
    pub group: Option<GroupMember>,
    /// Message tag.
    pub tag: i64,
    /// Group peer rank (exclusive with `peer`).
    pub group_peer: Option<usize>,
}

impl P2POp {
    /// `P2POp(op, tensor, peer, group, tag, group_peer)` with `op` named by string ("isend" /
    /// "irecv", as the Python functions).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Invalid ``op``. Expected ``op`` to be of type
    /// ``torch.distributed.isend`` or ``torch.distributed.irecv``." for any other name.
    pub fn new(
        op: &str,
        tensor: Tensor,
        peer: Option<usize>,
        group: Option<GroupMember>,
        tag: i64,
        group_peer: Option<usize>,
    ) -> Result<P2POp> {
        let op = match op {
            "isend" | "torch.distributed.isend" => P2PKind::Isend,
            "irecv" | "torch.distributed.irecv" => P2PKind::Irecv,
            _ => {
                return Err(DistError::invalid(
                    "Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or ``torch.distributed.irecv``.",
                ))
            }
        };
        Ok(P2POp {
            op,
            tensor,
            peer,
            group,
            tag,
            group_peer,
        })
    }
    /// An isend to global rank `peer` on WORLD with tag 0.
    pub fn isend(tensor: Tensor, peer: usize) -> P2POp {
        P2POp {
            op: P2PKind::Isend,
            tensor,
            peer: Some(peer),
            group: None,
            tag: 0,
            group_peer: None,
        }
    }
    /// An irecv from global rank `peer` on WORLD with tag 0.
    pub fn irecv(tensor: Tensor, peer: usize) -> P2POp {
        P2POp {
            op: P2PKind::Irecv,
            tensor,
            peer: Some(peer),
            group: None,
            tag: 0,
            group_peer: None,
        }
    }
}

fn real_dtype(d: DType) -> DType {
    match d {
        DType::Complex64 => DType::F32,
        DType::Complex128 => DType::F64,
        d => d,
    }
}

/// `_ensure_all_tensors_same_dtype`.
pub(crate) fn ensure_same_dtype<'a>(ts: impl IntoIterator<Item = &'a Tensor>) -> Result<()> {
    let mut last: Option<DType> = None;
    for t in ts {
        let d = real_dtype(t.dtype());
        match last {
            None => last = Some(d),
            Some(l) if l != d => {
                return Err(DistError::invalid(format!(
                    "Invalid usage of tensors with different dtypes. Found {l} and {}",
                    t.dtype()
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

fn finish(work: Work, async_op: bool) -> Result<Option<Work>> {
    if async_op {
        Ok(Some(work))
    } else {
        work.wait()?;
        Ok(None)
    }
}

fn check_complex_op(op: ReduceOp, ts: &[&Tensor], fname: &str) -> Result<()> {
    if ts.iter().any(|t| t.dtype().is_complex()) && !op.supports_complex() {
        return Err(DistError::invalid(format!(
            "{fname} does not support {op} on complex tensors"
        )));
    }
    Ok(())
}

/// The root's tensor list of gather/scatter as the backend takes it (`[list]` on the root, empty
/// elsewhere): "Argument ``{arg}`` must be specified on {root} rank." / "Argument ``{arg}`` must
/// NOT be specified on non-{root} ranks." when it is missing on the root or given elsewhere.
fn root_only_list(
    list: &[Tensor],
    is_root: bool,
    arg: &str,
    root: &str,
) -> Result<Vec<Vec<Tensor>>> {
    match (is_root, list.is_empty()) {
        (true, true) => Err(DistError::invalid(format!(
            "Argument ``{arg}`` must be specified on {root} rank."
        ))),
        (false, false) => Err(DistError::invalid(format!(
            "Argument ``{arg}`` must NOT be specified on non-{root} ranks."
        ))),
        (true, false) => Ok(vec![list.to_vec()]),
        (false, true) => Ok(Vec::new()),
    }
}

impl World {
    /// The group an op runs on; `None` for non-members (after a warning).
    pub(crate) fn op_group(
        &self,
        group: Option<&GroupMember>,
        op: &str,
    ) -> Result<Option<ProcessGroup>> {
        match group {
            Some(GroupMember::NonGroupMember) => {
                let r = self
                    .lock()
                    .default_pg
                    .as_ref()
                    .map(|p| p.rank() as i64)
                    .unwrap_or(-1);
                log::warn!(
                    "Running {op} on global rank {r} which does not belong to the given group."
                );
                Ok(None)
            }
            Some(GroupMember::Group(g)) => {
                let st = self.lock();
                if st.default_pg.is_none() {
                    return Err(DistError::invalid(NOT_INITIALIZED));
                }
                if st.entry(g).is_none() && !st.registry.values().any(|p| p.ptr_eq(g)) {
                    return Err(DistError::invalid(format!(
                        "Invalid process group specified: {g:?} is not registered (destroyed, or created by another World)"
                    )));
                }
                Ok(Some(g.clone()))
            }
            None => Ok(Some(self.world_group()?)),
        }
    }

    fn group_rank_of(
        &self,
        pg: &ProcessGroup,
        global: Option<usize>,
        group_rank: Option<usize>,
    ) -> Result<usize> {
        match (group_rank, global) {
            (Some(_), Some(_)) => Err(DistError::invalid(
                "Can't specify both group_rank and global_rank",
            )),
            (Some(g), None) => Ok(g),
            (None, Some(r)) => self.get_group_rank(pg, r),
            (None, None) => Err(DistError::invalid("Must specify global_rank or group_rank")),
        }
    }

    /// [`World::group_rank_of`] for ops whose root defaults to global rank 0 (gather, scatter,
    /// the object collectives).
    pub(crate) fn root_or_global0(
        &self,
        pg: &ProcessGroup,
        global: Option<usize>,
        group_rank: Option<usize>,
    ) -> Result<usize> {
        let global = global.or(group_rank.is_none().then_some(0));
        self.group_rank_of(pg, global, group_rank)
    }

    /// Inside a [`World::coalescing_manager`] block on `pg`: records `op` for the fused launch
    /// at the block's end and returns true; otherwise false.
    fn defer_if_coalescing(&self, pg: &ProcessGroup, op: impl FnOnce() -> CollOp) -> bool {
        match self.lock().coalescing.as_mut() {
            Some(c) if c.pg.ptr_eq(pg) => {
                c.ops.push(op());
                true
            }
            _ => false,
        }
    }

    fn record_work(&self, pg: &ProcessGroup, w: &Work) {
        if let Some(c) = self.lock().coalescing.as_mut() {
            if c.pg.ptr_eq(pg) {
                c.works.push(w.clone());
            }
        }
    }

    fn launched(&self, pg: &ProcessGroup, w: Work, async_op: bool) -> Result<Option<Work>> {
        self.record_work(pg, &w);
        finish(w, async_op)
    }

    /// The backend gather shared by [`World::gather`] and [`World::gather_single`] (`outputs`
    /// empty off the root).
    fn gather_launch(
        &self,
        pg: &ProcessGroup,
        outputs: &[Vec<Tensor>],
        tensor: &Tensor,
        root: usize,
        async_op: bool,
    ) -> Result<Option<Work>> {
        let opts = GatherOptions {
            root_rank: root,
            timeout: None,
            async_op,
        };
        let w = pg.gather(outputs, std::slice::from_ref(tensor), &opts)?;
        self.launched(pg, w, async_op)
    }

    /// `all_reduce(tensor, op, group, async_op)`: in-place reduction across the group.
    ///
    /// # Errors
    /// Not initialized; "all_reduce does not support ReduceOp.MAX on complex tensors"; backend
    /// argument errors ("Cannot use ReduceOp.BAND with non-integral dtype ..."); the op's failure.
    pub fn all_reduce(
        &self,
        tensor: &Tensor,
        op: ReduceOp,
        group: Option<&GroupMember>,
        async_op: bool,
    ) -> Result<Option<Work>> {
        check_complex_op(op, &[tensor], "all_reduce")?;
        let Some(pg) = self.op_group(group, "all_reduce")? else {
            return Ok(None);
        };
        if self.defer_if_coalescing(&pg, || CollOp::AllReduce(tensor.clone(), op)) {
            return Ok(None);
        }
        let opts = AllreduceOptions {
            reduce_op: op,
            timeout: None,
            async_op,
        };
        let w = pg.all_reduce(std::slice::from_ref(tensor), &opts)?;
        self.launched(&pg, w, async_op)
    }

    /// `all_reduce_coalesced(tensors, op, group, async_op)`.
    ///
    /// # Errors
    /// "tensors with different dtypes"; complex with a non-complex op; backend errors.
    pub fn all_reduce_coalesced(
        &self,
        tensors: &[Tensor],
        op: ReduceOp,
        group: Option<&GroupMember>,
        async_op: bool,
    ) -> Result<Option<Work>> {
        ensure_same_dtype(tensors)?;
        check_complex_op(op, &tensors.iter().collect::<Vec<_>>(), "all_reduce")?;
        let Some(pg) = self.op_group(group, "all_reduce_coalesced")? else {
            return Ok(None);
        };
        let opts = AllreduceOptions {
            reduce_op: op,
            timeout: None,
            async_op,
        };
        let w = pg.all_reduce_coalesced(tensors, &opts)?;
        self.launched(&pg, w, async_op)
    }

    /// `broadcast(tensor, src, group, async_op, group_src)`: `src` is a global rank, `group_src`
    /// a group rank (exactly one).
    ///
    /// # Errors
    /// Both or neither root given; src not in the group; backend errors.
    pub fn broadcast(
        &self,
        tensor: &Tensor,
        src: Option<usize>,
        group: Option<&GroupMember>,
        async_op: bool,
        group_src: Option<usize>,
    ) -> Result<Option<Work>> {
        let Some(pg) = self.op_group(group, "broadcast")? else {
            return Ok(None);
        };
        let root = self.group_rank_of(&pg, src, group_src)?;
        let opts = BroadcastOptions {
            root_rank: root,
            root_tensor: 0,
            timeout: None,
            async_op,
        };
        let w = pg.broadcast(std::slice::from_ref(tensor), &opts)?;
        self.launched(&pg, w, async_op)
    }

    /// `reduce(tensor, dst, op, group, async_op, group_dst)`.
    ///
    /// # Errors
    /// As [`World::broadcast`] and [`World::all_reduce`].
    pub fn reduce(
        &self,
        tensor: &Tensor,
        dst: Option<usize>,
        op: ReduceOp,
        group: Option<&GroupMember>,
        async_op: bool,
        group_dst: Option<usize>,
    ) -> Result<Option<Work>> {
        check_complex_op(op, &[tensor], "reduce")?;
        let Some(pg) = self.op_group(group, "reduce")? else {
            return Ok(None);
        };
        let root = self.group_rank_of(&pg, dst, group_dst)?;
        let opts = ReduceOptions {
            reduce_op: op,
            root_rank: root,
            root_tensor: 0,
            timeout: None,
            async_op,
        };
        let w = pg.reduce(std::slice::from_ref(tensor), &opts)?;
        self.launched(&pg, w, async_op)
    }

    /// `all_gather(tensor_list, tensor, group, async_op)`: `tensor_list[r]` receives rank r's tensor.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors ("invalid output tensor list" ...).
    pub fn all_gather(
        &self,
        tensor_list: &[Tensor],
        tensor: &Tensor,
        group: Option<&GroupMember>,
        async_op: bool,
    ) -> Result<Option<Work>> {
        ensure_same_dtype(tensor_list.iter().chain([tensor]))?;
        let Some(pg) = self.op_group(group, "all_gather")? else {
            return Ok(None);
        };
        let opts = AllgatherOptions {
            timeout: None,
            async_op,
        };
        let w = pg.all_gather(&[tensor_list.to_vec()], std::slice::from_ref(tensor), &opts)?;
        self.launched(&pg, w, async_op)
    }

    /// `all_gather_into_tensor(output, input, group, async_op)`: `output` is the dim-0
    /// concatenation of every rank's `input`.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn all_gather_into_tensor(
        &self,
        output: &Tensor,
        input: &Tensor,
        group: Option<&GroupMember>,
        async_op: bool,
    ) -> Result<Option<Work>> {
        ensure_same_dtype([output, input])?;
        let Some(pg) = self.op_group(group, "all_gather_into_tensor")? else {
            return Ok(None);
        };
        if self.defer_if_coalescing(&pg, || {
            CollOp::AllGatherIntoTensor(output.clone(), input.clone())
        }) {
            return Ok(None);
        }
        let w = pg.all_gather_into_tensor(
            output,
            input,
            &AllgatherOptions {
                timeout: None,
                async_op,
            },
        )?;
        self.launched(&pg, w, async_op)
    }

    /// `all_gather_coalesced(output_tensor_lists, input_tensor_list, group, async_op)`:
    /// `output_tensor_lists[r][i]` receives rank r's `input_tensor_list[i]`.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn all_gather_coalesced(
        &self,
        output_tensor_lists: &[Vec<Tensor>],
        input_tensor_list: &[Tensor],
        group: Option<&GroupMember>,
        async_op: bool,
    ) -> Result<Option<Work>> {
        ensure_same_dtype(
            input_tensor_list
                .iter()
                .chain(output_tensor_lists.iter().flatten()),
        )?;
        let Some(pg) = self.op_group(group, "all_gather_coalesced")? else {
            return Ok(None);
        };
        let w = pg.all_gather_coalesced(
            output_tensor_lists,
            input_tensor_list,
            &AllgatherOptions {
                timeout: None,
                async_op,
            },
        )?;
        self.launched(&pg, w, async_op)
    }

    /// `gather(tensor, gather_list, dst, group, async_op, group_dst)`; root defaults to global 0.
    ///
    /// # Errors
    /// "Argument ``gather_list`` must be specified on destination rank." / "... must NOT be
    /// specified on non-destination ranks."; "tensors with different dtypes"; backend errors.
    pub fn gather(
        &self,
        tensor: &Tensor,
        gather_list: Option<&[Tensor]>,
        dst: Option<usize>,
        group: Option<&GroupMember>,
        async_op: bool,
        group_dst: Option<usize>,
    ) -> Result<Option<Work>> {
        let gl = gather_list.unwrap_or(&[]);
        ensure_same_dtype([tensor].into_iter().chain(gl))?;
        let Some(pg) = self.op_group(group, "gather")? else {
            return Ok(None);
        };
        let root = self.root_or_global0(&pg, dst, group_dst)?;
        let outputs = root_only_list(gl, root == pg.rank(), "gather_list", "destination")?;
        self.gather_launch(&pg, &outputs, tensor, root, async_op)
    }

    /// `gather_single(tensor, gather_tensor, dst, group, async_op, group_dst)` (alias
    /// `gather_into_tensor`): on the root, `gather_tensor` (world-size × `tensor` elements, flat
    /// or stacked) receives every rank's `tensor` in group-rank order; elsewhere it is ignored.
    ///
    /// # Errors
    /// "gather_tensor must be specified on the destination rank"; a wrongly sized
    /// `gather_tensor`; "tensors with different dtypes"; backend errors.
    pub fn gather_single(
        &self,
        tensor: &Tensor,
        gather_tensor: Option<&Tensor>,
        dst: Option<usize>,
        group: Option<&GroupMember>,
        async_op: bool,
        group_dst: Option<usize>,
    ) -> Result<Option<Work>> {
        let Some(pg) = self.op_group(group, "gather_single")? else {
            return Ok(None);
        };
        let root = self.root_or_global0(&pg, dst, group_dst)?;
        let outputs = if root == pg.rank() {
            let g = gather_tensor.ok_or_else(|| {
                DistError::invalid("gather_tensor must be specified on the destination rank")
            })?;
            ensure_same_dtype([tensor, g])?;
            let n = pg.size();
            if g.numel() != n * tensor.numel() {
                return Err(DistError::invalid(format!(
                    "gather_tensor must hold world_size ({n}) copies of tensor ({} elements each), but has {} elements",
                    tensor.numel(),
                    g.numel()
                )));
            }
            let views = g.reshape(&[g.numel()])?.chunk(n)?;
            vec![views
                .iter()
                .map(|v| v.reshape(tensor.shape()))
                .collect::<Result<Vec<_>>>()?]
        } else {
            Vec::new()
        };
        self.gather_launch(&pg, &outputs, tensor, root, async_op)
    }

    /// `gather_into_tensor`: alias of [`World::gather_single`].
    ///
    /// # Errors
    /// As [`World::gather_single`].
    pub fn gather_into_tensor(
        &self,
        tensor: &Tensor,
        gather_tensor: Option<&Tensor>,
        dst: Option<usize>,
        group: Option<&GroupMember>,
        async_op: bool,
        group_dst: Option<usize>,
    ) -> Result<Option<Work>> {
        self.gather_single(tensor, gather_tensor, dst, group, async_op, group_dst)
    }

    /// `all_gather_single(output, input, group, async_op)`: alias of
    /// [`World::all_gather_into_tensor`] (PyTorch 2.15's new name).
    ///
    /// # Errors
    /// As [`World::all_gather_into_tensor`].
    pub fn all_gather_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        group: Option<&GroupMember>,
        async_op: bool,
    ) -> Result<Option<Work>> {
        self.all_gather_into_tensor(output, input, group, async_op)
    }

    /// `reduce_scatter_single(output, input, op, group, async_op)`: alias of
    /// [`World::reduce_scatter_tensor`] (PyTorch 2.15's new name).
    ///
    /// # Errors
    /// As [`World::reduce_scatter_tensor`].
    pub fn reduce_scatter_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        op: ReduceOp,
        group: Option<&GroupMember>,
        async_op: bool,
    ) -> Result<Option<Work>> {
        self.reduce_scatter_tensor(output, input, op, group, async_op)
    }

    /// `scatter(tensor, scatter_list, src, group, async_op, group_src)`; root defaults to global 0.
    ///
    /// # Errors
    /// "Argument ``scatter_list`` must be specified on source rank." / "Argument
    /// ``scatter_list`` must NOT be specified on non-source ranks."; "tensors with different
    /// dtypes"; backend errors.
    pub fn scatter(
        &self,
        tensor: &Tensor,
        scatter_list: Option<&[Tensor]>,
        src: Option<usize>,
        group: Option<&GroupMember>,
        async_op: bool,
        group_src: Option<usize>,
    ) -> Result<Option<Work>> {
        let sl = scatter_list.unwrap_or(&[]);
        ensure_same_dtype([tensor].into_iter().chain(sl))?;
        let Some(pg) = self.op_group(group, "scatter")? else {
            return Ok(None);
        };
        let root = self.root_or_global0(&pg, src, group_src)?;
        let inputs = root_only_list(sl, root == pg.rank(), "scatter_list", "source")?;
        let w = pg.scatter(
            std::slice::from_ref(tensor),
            &inputs,
            &ScatterOptions {
                root_rank: root,
                timeout: None,
                async_op,
            },
        )?;
        self.launched(&pg, w, async_op)
    }

    /// `reduce_scatter(output, input_list, op, group, async_op)`: rank r's `output` = op over
    /// ranks of `input_list[r]`.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn reduce_scatter(
        &self,
        output: &Tensor,
        input_list: &[Tensor],
        op: ReduceOp,
        group: Option<&GroupMember>,
        async_op: bool,
    ) -> Result<Option<Work>> {
        ensure_same_dtype([output].into_iter().chain(input_list))?;
        let Some(pg) = self.op_group(group, "reduce_scatter")? else {
            return Ok(None);
        };
        let opts = ReduceScatterOptions {
            reduce_op: op,
            timeout: None,
            async_op,
        };
        let w = pg.reduce_scatter(std::slice::from_ref(output), &[input_list.to_vec()], &opts)?;
        self.launched(&pg, w, async_op)
    }

    /// `reduce_scatter_tensor(output, input, op, group, async_op)`: `input` is group-size ×
    /// `output` along dim 0.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn reduce_scatter_tensor(
        &self,
        output: &Tensor,
        input: &Tensor,
        op: ReduceOp,
        group: Option<&GroupMember>,
        async_op: bool,
    ) -> Result<Option<Work>> {
        ensure_same_dtype([output, input])?;
        let Some(pg) = self.op_group(group, "reduce_scatter_tensor")? else {
            return Ok(None);
        };
        if self.defer_if_coalescing(&pg, || {
            CollOp::ReduceScatterTensor(output.clone(), input.clone(), op)
        }) {
            return Ok(None);
        }
        let opts = ReduceScatterOptions {
            reduce_op: op,
            timeout: None,
            async_op,
        };
        let w = pg.reduce_scatter_tensor(output, input, &opts)?;
        self.launched(&pg, w, async_op)
    }

    /// `all_to_all(output_tensor_list, input_tensor_list, group, async_op)`: `outputs[j]`
    /// receives rank j's `inputs[me]`.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn all_to_all(
        &self,
        output_tensor_list: &[Tensor],
        input_tensor_list: &[Tensor],
        group: Option<&GroupMember>,
        async_op: bool,
    ) -> Result<Option<Work>> {
        ensure_same_dtype(output_tensor_list.iter().chain(input_tensor_list))?;
        let Some(pg) = self.op_group(group, "all_to_all")? else {
            return Ok(None);
        };
        let w = pg.all_to_all(
            output_tensor_list,
            input_tensor_list,
            &AllToAllOptions {
                timeout: None,
                async_op,
            },
        )?;
        self.launched(&pg, w, async_op)
    }

    /// `all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op)`:
    /// `None` splits = equal dim-0 splits.
    ///
    /// # Errors
    /// "tensors with different dtypes"; backend errors.
    pub fn all_to_all_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        output_split_sizes: Option<&[usize]>,
        input_split_sizes: Option<&[usize]>,
        group: Option<&GroupMember>,
        async_op: bool,
    ) -> Result<Option<Work>> {
        ensure_same_dtype([output, input])?;
        let Some(pg) = self.op_group(group, "all_to_all_single")? else {
            return Ok(None);
        };
        let w = pg.all_to_all_single(
            output,
            input,
            output_split_sizes.unwrap_or(&[]),
            input_split_sizes.unwrap_or(&[]),
            &AllToAllOptions {
                timeout: None,
                async_op,
            },
        )?;
        self.launched(&pg, w, async_op)
    }

    /// `barrier(group, async_op, device_ids)`.
    ///
    /// # Errors
    /// Not initialized; the barrier's failure (timeout, dead peer).
    pub fn barrier(
        &self,
        group: Option<&GroupMember>,
        async_op: bool,
        device_ids: Option<&[u32]>,
    ) -> Result<Option<Work>> {
        let Some(pg) = self.op_group(group, "barrier")? else {
            return Ok(None);
        };
        // PyTorch: the first of `device_ids`, else the group's bound device, else its default.
        let device = match device_ids.and_then(|d| d.first()) {
            Some(&i) => Some(c10d_core::Device::Cuda(i)),
            None => pg.bound_device_id(),
        };
        let opts = BarrierOptions {
            device_ids: device_ids.map(|d| d.to_vec()).unwrap_or_default(),
            timeout: None,
            device,
            async_op,
        };
        let w = pg.barrier(&opts)?;
        self.launched(&pg, w, async_op)
    }

    /// `monitored_barrier(group, timeout, wait_all_ranks)`: a barrier through rank 0 that names
    /// the ranks that did not arrive. Non-members return at once.
    ///
    /// # Errors
    /// "Rank 1 failed to pass monitoredBarrier in 2000 ms" (rank 0), "Rank {r} successfully
    /// reached monitoredBarrier, but received errors while waiting for send/recv from rank 0.
    /// Please check rank 0 logs for faulty rank." (others); no CPU backend → "monitored_barrier
    /// requires a group with a CPU-capable backend (e.g. GLOO).". A `None` timeout uses the
    /// group backend's timeout (PyTorch uses the 30-min default regardless of the group's).
    pub fn monitored_barrier(
        &self,
        group: Option<&GroupMember>,
        timeout: Option<Duration>,
        wait_all_ranks: bool,
    ) -> Result<()> {
        let Some(pg) = self.op_group(group, "monitored_barrier")? else {
            return Ok(());
        };
        if pg.backend(c10d_core::DeviceType::Cpu).is_err() {
            return Err(DistError::invalid(
                "monitored_barrier requires a group with a CPU-capable backend (e.g. GLOO).",
            ));
        }
        let opts = BarrierOptions {
            timeout,
            ..Default::default()
        };
        pg.monitored_barrier(&opts, wait_all_ranks)
    }

    fn p2p_peer(
        &self,
        pg: &ProcessGroup,
        global: Option<usize>,
        group_peer: Option<usize>,
        kind: &str,
    ) -> Result<usize> {
        let peer = self.group_rank_of(pg, global, group_peer)?;
        if peer == pg.rank() {
            return Err(DistError::invalid(format!(
                "Invalid {kind} rank: {kind} rank should not be the same as the rank of the current process."
            )));
        }
        Ok(peer)
    }

    /// `isend(tensor, dst, group, tag, group_dst)`.
    ///
    /// # Errors
    /// "Invalid destination rank: destination rank should not be the same as the rank of the
    /// current process."; both or neither of `dst`/`group_dst`; backend errors.
    pub fn isend(
        &self,
        tensor: &Tensor,
        dst: Option<usize>,
        group: Option<&GroupMember>,
        tag: i64,
        group_dst: Option<usize>,
    ) -> Result<Option<Work>> {
        let Some(pg) = self.op_group(group, "isend")? else {
            return Ok(None);
        };
        let peer = self.p2p_peer(&pg, dst, group_dst, "destination")?;
        let w = pg.send(std::slice::from_ref(tensor), peer, tag)?;
        self.record_work(&pg, &w);
        Ok(Some(w))
    }

    /// `send(tensor, dst, group, tag, group_dst)`: blocking [`World::isend`].
    ///
    /// # Errors
    /// As [`World::isend`] plus the op's failure.
    pub fn send(
        &self,
        tensor: &Tensor,
        dst: Option<usize>,
        group: Option<&GroupMember>,
        tag: i64,
        group_dst: Option<usize>,
    ) -> Result<()> {
        if let Some(w) = self.isend(tensor, dst, group, tag, group_dst)? {
            w.wait()?;
        }
        Ok(())
    }

    /// `irecv(tensor, src, group, tag, group_src)`: `src` and `group_src` both `None` = any source
    /// (see [`Work::source_rank`]).
    ///
    /// # Errors
    /// "Invalid source rank: ..."; both `src` and `group_src`; backend errors.
    pub fn irecv(
        &self,
        tensor: &Tensor,
        src: Option<usize>,
        group: Option<&GroupMember>,
        tag: i64,
        group_src: Option<usize>,
    ) -> Result<Option<Work>> {
        let Some(pg) = self.op_group(group, "irecv")? else {
            return Ok(None);
        };
        let w = if src.is_none() && group_src.is_none() {
            pg.recv_anysource(std::slice::from_ref(tensor), tag)?
        } else {
            let peer = self.p2p_peer(&pg, src, group_src, "source")?;
            pg.recv(std::slice::from_ref(tensor), peer, tag)?
        };
        self.record_work(&pg, &w);
        Ok(Some(w))
    }

    /// `recv(tensor, src, group, tag, group_src)`: blocking receive; returns the sender's
    /// *global* rank, or −1 on a non-member.
    ///
    /// # Errors
    /// As [`World::irecv`] plus the op's failure.
    pub fn recv(
        &self,
        tensor: &Tensor,
        src: Option<usize>,
        group: Option<&GroupMember>,
        tag: i64,
        group_src: Option<usize>,
    ) -> Result<i64> {
        let Some(pg) = self.op_group(group, "recv")? else {
            return Ok(-1);
        };
        let Some(w) = self.irecv(tensor, src, group, tag, group_src)? else {
            return Ok(-1);
        };
        w.wait()?;
        let group_src_rank = match (src, group_src) {
            (None, None) => w.source_rank().ok_or_else(|| {
                DistError::backend("recv from any source: backend did not report the source rank")
            })?,
            _ => self.group_rank_of(&pg, src, group_src)?,
        };
        Ok(self.get_global_rank(&pg, group_src_rank)? as i64)
    }

    /// `batch_isend_irecv(p2p_op_list)`: launches every op and returns their works (backends
    /// with coalescing get one start/end window around them).
    ///
    /// # Errors
    /// "Invalid ``p2p_op_list``. ..." for an empty list; "All ops need to use the same group.";
    /// the ops' own argument errors.
    pub fn batch_isend_irecv(&self, p2p_op_list: &[P2POp]) -> Result<Vec<Work>> {
        let Some(first) = p2p_op_list.first() else {
            return Err(DistError::invalid("Invalid ``p2p_op_list``. Each op is expected to to be of type ``torch.distributed.P2POp``."));
        };
        if !p2p_op_list.iter().all(|p| p.group == first.group) {
            return Err(DistError::invalid("All ops need to use the same group."));
        }
        let Some(pg) = self.op_group(first.group.as_ref(), "batch_isend_irecv")? else {
            return Ok(Vec::new());
        };
        let coalesce = pg
            .default_backend()
            .map(|b| b.supports_coalescing())
            .unwrap_or(false);
        if coalesce {
            pg.default_backend()?.start_coalescing()?;
        }
        let mut works = Vec::new();
        for p in p2p_op_list {
            let w = match p.op {
                P2PKind::Isend => {
                    self.isend(&p.tensor, p.peer, p.group.as_ref(), p.tag, p.group_peer)?
                }
                P2PKind::Irecv => {
                    self.irecv(&p.tensor, p.peer, p.group.as_ref(), p.tag, p.group_peer)?
                }
            };
            works.extend(w);
        }
        if coalesce {
            let w = pg.default_backend()?.end_coalescing()?;
            return Ok(vec![w]);
        }
        Ok(works)
    }

    /// `_coalescing_manager(group, device, async_ops)`: runs `f`; `all_reduce`,
    /// `all_gather_into_tensor` and `reduce_scatter_tensor` issued on `group` inside it are
    /// recorded and launched at the end as one coalesced op (`allreduce_coalesced`,
    /// `allgather_into_tensor_coalesced`, `reduce_scatter_tensor_coalesced`); other ops run at
    /// once and their works are collected. With `async_ops == false` every work is waited for.
    /// When the backend lacks the fused op ([`DistError::Unsupported`]), the recorded ops are
    /// issued one by one instead.
    ///
    /// # Errors
    /// "Coalescing manager does not support fast-path coalescing of X, yet Y is still recorded in
    /// coalescing manager." for mixed recorded ops; a nested manager; `f`'s error; the ops' errors.
    pub fn coalescing_manager<R>(
        &self,
        group: Option<&GroupMember>,
        async_ops: bool,
        f: impl FnOnce() -> Result<R>,
    ) -> Result<(R, CoalescingManager)> {
        let Some(pg) = self.op_group(group, "coalescing_manager")? else {
            return Ok((f()?, CoalescingManager::default()));
        };
        {
            let mut st = self.lock();
            if st.coalescing.is_some() {
                return Err(DistError::invalid(
                    "coalescing_manager: a coalescing block is already open in this World",
                ));
            }
            st.coalescing = Some(CoalescingState {
                pg: pg.clone(),
                ops: Vec::new(),
                works: Vec::new(),
            });
        }
        let r = f();
        let state = self.lock().coalescing.take();
        let r = r?;
        let Some(state) = state else {
            return Ok((r, CoalescingManager::default()));
        };
        let mut works = state.works;
        if let Some(op0) = state.ops.first() {
            if let Some(bad) = state
                .ops
                .iter()
                .find(|o| std::mem::discriminant(*o) != std::mem::discriminant(op0))
            {
                return Err(DistError::invalid(format!(
                    "Coalescing manager does not support fast-path coalescing of {}, yet {} is still recorded in coalescing manager.",
                    op0.name(),
                    bad.name()
                )));
            }
            let fused = CollOp::launch_fused(&pg, &state.ops, async_ops);
            match fused {
                Ok(w) => works.push(w),
                // A backend without the fused op: issue the recorded ops one by one, in order
                // (every rank takes the same branch, as the backend is the same everywhere).
                Err(e) if e.kind() == c10d_core::ErrorKind::Unsupported => {
                    for o in &state.ops {
                        works.push(o.launch(&pg, async_ops)?);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let cm = CoalescingManager { works };
        if !async_ops {
            cm.wait()?;
        }
        Ok((r, cm))
    }

    /// `set_timeout(timeout, group)`: changes the default timeout of a live group's backends
    /// (WORLD when `None`).
    ///
    /// # Errors
    /// Not initialized.
    pub fn set_timeout(&self, timeout: Duration, group: Option<&ProcessGroup>) -> Result<()> {
        self.group_or_default(group)?.set_timeout(timeout);
        Ok(())
    }
}

//! What the collectives of [`crate::ops`] share: group resolution (the non-member warning),
//! roots, PyTorch's dtype checks, the [`World::coalescing_manager`] block that records ops
//! for a fused launch, and the point-to-point batch ([`P2POp`], [`World::batch_isend_irecv`]),
//! which keeps PyTorch's optional (`peer`, `group_peer`) pair: giving both fails with "Can't
//! specify both group_rank and global_rank".

use crate::coalescing::{alone, fuse, python_name, CoalescingState};
use crate::world::{GroupMember, World, NOT_INITIALIZED};
use c10d_core::{Collectives, DType, DistError, Op, ProcessGroup, ReduceOp, Result, Tensor, Work};
use std::time::Duration;

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

pub(crate) fn check_complex_op(op: ReduceOp, ts: &[&Tensor], fname: &str) -> Result<()> {
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
pub(crate) fn root_only_list(
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

    pub(crate) fn group_rank_of(
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
    /// at the block's end and returns `None`; otherwise gives `op` back, to run now.
    pub(crate) fn defer_if_coalescing<'a>(&self, pg: &ProcessGroup, op: Op<'a>) -> Option<Op<'a>> {
        match self.lock().coalescing.as_mut() {
            Some(c) if c.pg.ptr_eq(pg) => {
                c.ops.push(op.into_owned());
                None
            }
            _ => Some(op),
        }
    }

    pub(crate) fn record_work(&self, pg: &ProcessGroup, w: &Work) {
        if let Some(c) = self.lock().coalescing.as_mut() {
            if c.pg.ptr_eq(pg) {
                c.works.push(w.clone());
            }
        }
    }

    pub(crate) fn launched(
        &self,
        pg: &ProcessGroup,
        w: Work,
        async_op: bool,
    ) -> Result<Option<Work>> {
        self.record_work(pg, &w);
        finish(w, async_op)
    }

    pub(crate) fn p2p_peer(
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

    /// `isend` with PyTorch's (`dst`, `group_dst`) pair (exactly one given), as
    /// [`World::isend`] and [`P2POp`] take it.
    pub(crate) fn isend_pair(
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

    /// `irecv` with PyTorch's (`src`, `group_src`) pair (both `None` = any source).
    pub(crate) fn irecv_pair(
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

    /// `batch_isend_irecv(p2p_op_list)`: launches every op and returns their works (backends
    /// with coalescing get one start/end window around them, always closed: an op that fails
    /// inside it fails the call after the window was ended, so later ops run normally).
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
        let coalescing = pg
            .default_backend()
            .ok()
            .filter(|b| b.supports_coalescing());
        let Some(backend) = coalescing else {
            return self.launch_p2p(p2p_op_list);
        };
        backend.start_coalescing()?;
        // The block ends whatever happened inside it (PyTorch's leaves it open on an error,
        // after which every op of the group would be swallowed by the block).
        let launched = self.launch_p2p(p2p_op_list);
        let ended = backend.end_coalescing();
        launched?;
        Ok(vec![ended?])
    }

    /// Issues each op of a `batch_isend_irecv` list; their works in order.
    fn launch_p2p(&self, p2p_op_list: &[P2POp]) -> Result<Vec<Work>> {
        let mut works = Vec::new();
        for p in p2p_op_list {
            let (g, peer) = (p.group.as_ref(), p.peer);
            let w = match p.op {
                P2PKind::Isend => self.isend_pair(&p.tensor, peer, g, p.tag, p.group_peer)?,
                P2PKind::Irecv => self.irecv_pair(&p.tensor, peer, g, p.tag, p.group_peer)?,
            };
            works.extend(w);
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
                    python_name(op0),
                    python_name(bad)
                )));
            }
            let fused = fuse(&state.ops, async_ops).and_then(|op| pg.run(op));
            match fused {
                Ok(w) => works.push(w),
                // A backend without the fused op: issue the recorded ops one by one, in order
                // (every rank takes the same branch, as the backend is the same everywhere).
                Err(e) if e.kind() == c10d_core::ErrorKind::Unsupported => {
                    for o in &state.ops {
                        works.push(pg.run(alone(o, async_ops))?);
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

//! Coalesced blocks (`start_coalescing` … `end_coalescing`, what `batch_isend_irecv` and
//! `_coalescing_manager` use): the ops of a block run in one NCCL group and complete as one
//! `Work`.
//!
//! - The NCCL group opens at the block's first op, after that op's communicator exists: a
//!   communicator made inside an open group would only be created when the group ends (and
//!   [`crate::result::with_groups_closed`] covers one made by another group's op).
//! - The block's tensors are leased as one set ([`TensorLeases::extend`]), so two receives into
//!   disjoint `narrow()` halves of one buffer are legal; overlapping outputs are refused.
//! - An op that fails inside the block fails at once and is remembered: `end_coalescing`
//!   still closes the group (launching the ops that were queued, which the peers expect, and
//!   which the watchdog then bounds) and returns that first error. The block is always over
//!   after `end_coalescing`, whatever happened in it.
//! - Temporary buffers and PREMUL_SUM reductions of the block's ops live until its group ended.

use super::ProcessGroupNccl;
use super::{destroy_premul, Calls, DeviceComm, Enqueue, Pending, Submit};
use crate::result;
use crate::sys;
use crate::watchdog::WorkRecord;
use c10d_core::flight_recorder::Trace;
use c10d_core::{DistError, OpType, Result, Tensor, TensorLeases, Work};
use cudarc::driver::CudaStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An open coalesced block.
pub(crate) struct Coalesced {
    dc: Option<Arc<DeviceComm>>,
    group_open: bool,
    leases: TensorLeases,
    keep: Vec<Tensor>,
    temps: Vec<Tensor>,
    premul: Vec<sys::ncclRedOp_t>,
    caller: Option<Arc<CudaStream>>,
    capturing: bool,
    numel_in: i64,
    numel_out: i64,
    /// The first error of an op of the block, returned by `end_coalescing`.
    pub failed: Option<DistError>,
}

impl Coalesced {
    /// Whether the block's NCCL group is open on its thread.
    pub fn group_open(&self) -> bool {
        self.group_open
    }

    /// `abort()` from a thread other than the one whose NCCL group the block holds open: the
    /// block fails with `why`, and its communicator's abort is done when the block's own thread
    /// ends it (closing an NCCL group is only possible on the thread that opened it).
    pub fn abort_from_another_thread(&mut self, why: &str) {
        self.failed
            .get_or_insert_with(|| DistError::backend(why.to_string()));
        if let Some(dc) = &self.dc {
            dc.comm.abort();
        }
    }

    /// The block as one op numbered `seq`: its record, what its `Work` (or its retirement)
    /// holds, and the first error of its ops.
    fn into_pending(
        self,
        seq: u64,
        trace: Option<Trace>,
        timeout: Duration,
    ) -> (WorkRecord, Pending, Option<DistError>) {
        let record = WorkRecord {
            seq,
            op: OpType::Coalesced,
            numel_in: self.numel_in,
            numel_out: self.numel_out,
            timeout,
            start: Instant::now(),
        };
        let pending = Pending {
            leases: vec![self.leases],
            keep: self.keep,
            outputs: Vec::new(),
            host_blocking: false,
            trace,
            caller: self.caller,
            capturing: self.capturing,
        };
        (record, pending, self.failed)
    }
}

impl ProcessGroupNccl {
    /// `start_coalescing`: later ops join one NCCL group until [`Self::end_block`].
    ///
    /// # Errors
    /// A block already open.
    pub(crate) fn start_block(&self) -> Result<()> {
        let mut co = self.coalescing.lock().unwrap_or_else(|e| e.into_inner());
        if co.is_some() {
            return Err(DistError::invalid(
                "ProcessGroupNCCL: start_coalescing called while already coalescing",
            ));
        }
        *co = Some(Coalesced {
            dc: None,
            group_open: false,
            leases: TensorLeases::acquire(&[], &[])?,
            keep: Vec::new(),
            temps: Vec::new(),
            premul: Vec::new(),
            caller: None,
            capturing: false,
            numel_in: 0,
            numel_out: 0,
            failed: None,
        });
        Ok(())
    }

    /// Queues one op of the open block `c`; its `Work` is a completed placeholder (the block's
    /// own comes from `end_coalescing`).
    pub(crate) fn launch_in_block(
        &self,
        c: &mut Coalesced,
        dc: &Arc<DeviceComm>,
        op: &Submit<'_>,
        (caller, capturing): (Option<Arc<CudaStream>>, bool),
        body: impl FnOnce(&mut Enqueue<'_>) -> Result<()>,
    ) -> Result<Work> {
        c.leases.extend(op.inputs, op.outputs)?;
        if !c.group_open {
            dc.comm.open_block()?;
            c.group_open = true;
        }
        c.dc.get_or_insert_with(|| dc.clone());
        c.caller = c.caller.take().or(caller);
        c.capturing |= capturing;
        c.keep.extend(op.inputs.iter().chain(op.outputs).cloned());
        c.numel_in += op.inputs.iter().map(Tensor::numel).sum::<usize>() as i64;
        c.numel_out += op.outputs.iter().map(Tensor::numel).sum::<usize>() as i64;
        let calls = Calls {
            grouped: false,
            capturing,
            keep: &mut c.keep,
            temps: &mut c.temps,
            premul: &mut c.premul,
        };
        self.enqueue_calls(dc, calls, body)?;
        Ok(Work::completed(
            op.kind,
            self.sequence(),
            Ok(()),
            Vec::new(),
        ))
    }

    /// A block still open when the group is aborted or shut down: its NCCL group is ended here
    /// when this thread has one open (launching what was queued, on a communicator about to be
    /// aborted), and its memory is retired; a block another thread holds open is left to that
    /// thread, its communicator aborted when its group ends, its memory never given back.
    pub(crate) fn abandon_block(&self, mut c: Coalesced, why: &str) {
        let Some(dc) = c.dc.clone() else {
            return;
        };
        if c.group_open && result::open_groups() == 0 {
            log::warn!("c10d-nccl: group {:?} ended while another thread's coalesced block was open; end blocks before abort() or shutdown()", self.options.group_name);
            dc.comm.abort();
            std::mem::forget((c.keep, c.leases));
            return;
        }
        if c.group_open {
            if let Err(e) = dc.comm.close_block() {
                log::warn!("c10d-nccl: ending an abandoned coalesced block: {e}");
            }
        }
        drop(std::mem::take(&mut c.temps));
        let timeout = self.default_timeout();
        let (seq, trace) = self.number(OpType::Coalesced, None, &[], &[], timeout);
        let (record, pending, _) = c.into_pending(seq, trace, timeout);
        self.retire(&dc, record, pending, DistError::backend(why.to_string()));
    }

    /// `end_coalescing`: closes the block's group; one `Work` for every op of the block.
    ///
    /// # Errors
    /// No open block; the first error of an op of the block (its other ops were launched and
    /// are watched); NCCL's error at the group's end.
    pub(crate) fn end_block(&self) -> Result<Work> {
        let mut c = self
            .coalescing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| {
                DistError::invalid("ProcessGroupNCCL: end_coalescing without start_coalescing")
            })?;
        let timeout = self.default_timeout();
        let (seq, trace) = self.number(OpType::Coalesced, None, &[], &[], timeout);
        let dc = match (c.dc.clone(), c.group_open) {
            (Some(dc), true) => dc,
            _ => {
                return match c.failed {
                    Some(e) => Err(e),
                    None => Ok(Work::completed(OpType::Coalesced, seq, Ok(()), Vec::new())),
                }
            }
        };
        let ended = dc.comm.close_block();
        let ready = dc
            .comm
            .finish_call("ncclGroupEnd", ended, Instant::now() + timeout);
        if ready.is_ok() {
            if let Ok(l) = dc.comm.lock() {
                destroy_premul(self.lib, l.raw(), &mut c.premul);
            }
        }
        // Freed on the NCCL stream, after whatever of the block runs there.
        drop(std::mem::take(&mut c.temps));
        let (record, pending, failed) = c.into_pending(seq, trace, timeout);
        if let Err(e) = ready {
            // The communicator is aborted; work of the block may still sit on the NCCL stream.
            return Err(self.retire(&dc, record, pending, failed.unwrap_or(e)));
        }
        let work = self.finish_launch(&dc, record, pending)?;
        match failed {
            Some(e) => Err(e),
            None => Ok(work),
        }
    }
}

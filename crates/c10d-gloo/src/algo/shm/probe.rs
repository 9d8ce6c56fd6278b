//! Setting the group's segment up at the op that first needs it ([`probe`]), and how many bytes
//! per rank a new segment may still be asked for ([`limit`]).

use crate::engine::Comm;
use crate::shm::fit::{limit_after_no_room, slot_for};
use crate::shm::segment::{slot_bytes, MAX_RANKS};
use crate::shm::setup::{setup_slot, Ask, Outcome, SetupError};
use crate::shm::ShmState;
use c10d_core::{DistError, Result};

/// The most bytes per rank a new segment may be set up for (`Caps::shm_limit`): 0 unless the
/// group has 2 ..= [`MAX_RANKS`] ranks and all on this host (`local`); then the
/// group's largest slot, lowered by set-ups that found no room, 0 after one a rank refused.
pub(crate) fn limit(comm: &mut Comm<'_>, local: bool) -> usize {
    let n = comm.size();
    if !local || !(2..=MAX_RANKS).contains(&n) {
        return 0;
    }
    comm.shm_budget().limit.unwrap_or(slot_bytes(n))
}

/// Sets up a segment whose slots hold `bytes` per rank (the algorithm table asked for it:
/// every rank runs this at the same op, and all get the same outcome): replaces the group's
/// segment when every rank mapped the new one; lowers the group's limit when `/dev/shm` had no
/// room (rank 0 warned, once for this group: later set-ups ask only for smaller slots) or
/// when a rank refused (this rank's vote is `allowed`). Records the group's verdict.
///
/// # Errors
/// A peer did not reach the set-up before the op's deadline: the op's time-out text naming it
/// (every rank abandons the set-up; a later op sets up again). The store failed, a peer was
/// lost or the group stopped meanwhile: the group fails.
pub(crate) fn probe(comm: &mut Comm<'_>, bytes: usize, allowed: bool) -> Result<()> {
    let n = comm.size();
    let slot = slot_for(bytes, n);
    let ctx = comm.ctx();
    let store = comm.store();
    let ask = Ask {
        store: store.as_ref(),
        gen: comm.shm_budget().setups,
        rank: comm.rank(),
        n,
        slot,
        allowed,
        deadline: comm.deadline(),
        ctx: &ctx,
    };
    let me = ask.rank;
    // A peer lost or a stop ends the wait at once. (Not a frame of this op from a peer: a
    // rank that saw the outcome first may already run the rest of the op, or its next probe,
    // over sockets.)
    let mut alive = || -> Result<()> {
        if let Some(e) = comm.stop_requested() {
            return Err(e);
        }
        match (0..n).find(|&p| p != me) {
            Some(p) => comm.check_alive(p),
            None => Ok(()),
        }
    };
    let outcome = setup_slot(&ask, &mut alive);
    comm.shm_budget().setups += 1;
    match outcome {
        Ok(Outcome::Mapped(seg)) => *comm.shm() = ShmState::On(seg),
        Ok(Outcome::NoRoom) => comm.shm_budget().limit = Some(limit_after_no_room(slot)),
        Ok(Outcome::Refused) => comm.shm_budget().limit = Some(0),
        // Peers gave up waiting for `late` (this op failed there): so does this op here, naming
        // them (or, on a late rank itself, the others).
        Ok(Outcome::Abandoned(late)) => {
            let me = comm.rank();
            if !late.contains(&me) {
                return Err(comm.timed_out(&late));
            }
            // This rank is the late one: it did not wait, the others gave up on it.
            let (op, seq, ..) = comm.op_desc();
            let late: Vec<String> = late.iter().map(usize::to_string).collect();
            return Err(DistError::backend(format!(
                "{ctx}: {op} (seq {seq}) abandoned: the other ranks timed out waiting for rank(s) {} (this one among them) to set the group's shared memory up; the op failed on every rank and the group stays usable",
                late.join(", ")
            )));
        }
        // Every rank saw every rank's size in the votes: all fail alike, naming one that differs.
        Ok(Outcome::Mismatch(p, theirs)) => {
            let (op, seq, dtype, total) = comm.op_desc();
            let e = DistError::backend(format!(
                "{ctx}: Detected mismatch between collectives: rank {} is running {op} (seq {seq}, {}, {total} bytes) but rank {p} runs one of another size (it set shared memory up for {theirs} bytes per rank where this rank needs {slot})",
                comm.rank(),
                dtype.torch_name()
            ));
            return Err(comm.fail_group(crate::engine::blaming(e, [p])));
        }
        // The op's usual time-out text, naming the ranks that did not get this far; their parts
        // were vetoed, so they abandon this set-up too and the group stays usable.
        Err(SetupError::TimedOut(missing)) => return Err(comm.timed_out(&missing)),
        Err(SetupError::Failed(e)) => {
            let e = DistError::backend(format!(
                "{ctx}: setting up shared memory (slots of {slot} bytes) failed: {}",
                e.message()
            ));
            return Err(comm.fail_group(e));
        }
    }
    let on = matches!(comm.shm(), ShmState::On(_));
    comm.set_shm_verdict(on);
    Ok(())
}

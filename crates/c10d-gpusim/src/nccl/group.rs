//! `ncclGroupStart` / `ncclGroupEnd`: the calling thread's open group collects its ops; the
//! outermost end queues them, one batch per (communicator, stream) in call order, as one
//! stream operation each (a single op outside a group is a group of its own).

use crate::cuda::capture::Node;
use crate::cuda::stream::Work;
use crate::cuda::{device, launch};
use crate::nccl::codes::{INVALID_USAGE, IN_PROGRESS, SUCCESS, UNHANDLED_CUDA_ERROR};
use crate::nccl::comm::Comm;
use crate::nccl::ops::{self, Spec};
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[derive(Default)]
struct Group {
    depth: usize,
    pending: Vec<(Arc<Comm>, usize, Spec)>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// `ncclGroupStart`.
pub fn start() -> i32 {
    GROUP.with(|g| g.borrow_mut().depth += 1);
    SUCCESS
}

/// `ncclGroupEnd`.
pub fn end() -> i32 {
    let pending = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return None;
        }
        g.depth -= 1;
        Some(if g.depth == 0 {
            std::mem::take(&mut g.pending)
        } else {
            Vec::new()
        })
    });
    match pending {
        None => INVALID_USAGE,
        Some(p) => flush(p),
    }
}

/// Adds an op to the open group, or queues it at once outside one.
pub fn add(comm: Arc<Comm>, stream: usize, spec: Spec) -> i32 {
    let alone = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.pending.push((comm, stream, spec));
        g.depth == 0
    });
    if alone {
        let p = GROUP.with(|g| std::mem::take(&mut g.borrow_mut().pending));
        return flush(p);
    }
    SUCCESS
}

fn flush(pending: Vec<(Arc<Comm>, usize, Spec)>) -> i32 {
    let mut batches: Vec<(Arc<Comm>, usize, Vec<Spec>)> = Vec::new();
    for (comm, stream, spec) in pending {
        match batches
            .iter_mut()
            .find(|(c, s, _)| Arc::ptr_eq(c, &comm) && *s == stream)
        {
            Some(b) => b.2.push(spec),
            None => batches.push((comm, stream, vec![spec])),
        }
    }
    let mut rc = SUCCESS;
    for (comm, stream, specs) in batches {
        let slow = comm.non_blocking && crate::config::get().group_end_in_progress;
        let r = queue(comm.clone(), stream, specs);
        if rc == SUCCESS {
            rc = r;
        }
        if slow && r == SUCCESS {
            enqueue_in_background(comm);
            rc = IN_PROGRESS;
        }
    }
    rc
}

/// `C10D_SIM_GROUP_END_IN_PROGRESS`: the communicator says `ncclInProgress` for 5 ms, as a
/// non-blocking NCCL may while it finishes enqueueing (the work is queued already).
fn enqueue_in_background(comm: Arc<Comm>) {
    comm.begin_finalize();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(5));
        comm.finished_finalize();
    });
}

fn queue(comm: Arc<Comm>, stream: usize, specs: Vec<Spec>) -> i32 {
    if device::current().is_err() {
        device::set_current(Some(comm.device));
    }
    let c = comm.clone();
    let node: Node = Arc::new(move || {
        let planned = Arc::new(ops::plan(&c, &specs));
        c.inflight.fetch_add(1, Ordering::AcqRel);
        let c = c.clone();
        let work: Work = Arc::new(move || ops::run(&c, &planned));
        work
    });
    match launch::enqueue(stream, node) {
        Ok(_) => SUCCESS,
        Err(e) => {
            comm.set_last_error(&format!(
                "c10d-gpusim: queueing an NCCL op on stream {stream:#x} failed: CUDA error {e}"
            ));
            UNHANDLED_CUDA_ERROR
        }
    }
}

//! NCCL operations as a stream runs them: a batch (one `ncclGroupEnd`'s ops on one
//! communicator and stream) first hands every input to the hub — read from device memory when
//! the stream reaches the batch, as a kernel reads it — then waits for every result and writes
//! it to device memory. A failure sets the communicator's asynchronous error and, as a NCCL
//! kernel whose peers are gone does, keeps the stream busy until the communicator is aborted.

use crate::cuda::{device, memory};
use crate::nccl::codes::{
    INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR, SYSTEM_ERROR, UNHANDLED_CUDA_ERROR,
};
use crate::nccl::comm::Comm;
use crate::nccl::faults::{self, Fault};
use crate::nccl::wire::{Frame, Kind, OpHeader};
use crate::reduce::{self, RedOp};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What one call asked for.
#[derive(Clone, Debug)]
pub enum Spec {
    /// A collective.
    Coll {
        /// What it is.
        header: OpHeader,
        /// Input device address.
        send: u64,
        /// Output device address.
        recv: u64,
        /// The rank's PreMulSum scalar (the op is then sent as a sum).
        premul: Option<Vec<u8>>,
    },
    /// `ncclSend`.
    Send {
        /// Device address.
        buf: u64,
        /// Bytes.
        bytes: usize,
        /// Destination rank.
        peer: u32,
    },
    /// `ncclRecv`.
    Recv {
        /// Device address.
        buf: u64,
        /// Bytes.
        bytes: usize,
        /// Source rank.
        peer: u32,
    },
}

/// A spec with its sequence number and injected fault, fixed when the batch is queued.
pub struct Planned {
    spec: Spec,
    seq: u64,
    fault: Option<Fault>,
}

/// Numbers the batch's ops (in call order, so every rank numbers alike) and draws their faults.
pub fn plan(comm: &Comm, specs: &[Spec]) -> Vec<Planned> {
    specs
        .iter()
        .map(|spec| {
            let seq = match spec {
                Spec::Coll { .. } => comm.next_seq(),
                Spec::Send { peer, .. } => comm.next_p2p(*peer, true),
                Spec::Recv { peer, .. } => comm.next_p2p(*peer, false),
            };
            Planned {
                spec: spec.clone(),
                seq,
                fault: faults::next_op(),
            }
        })
        .collect()
}

/// Input and output bytes of a collective for this rank.
fn sizes(h: &OpHeader, nranks: u32, rank: u32) -> (usize, usize) {
    let n = h.count as usize * reduce::dtype_size(h.dtype).unwrap_or(0);
    let all = n * nranks as usize;
    match h.op {
        2 if h.root as u32 != rank => (0, n),
        3 if h.root as u32 != rank => (n, 0),
        4 => (n, all),
        5 => (all, n),
        _ => (n, n),
    }
}

type Failure = (i32, String);

fn input(comm: &Comm, spec: &Spec) -> Result<Frame, Failure> {
    let illegal = |m: String| (UNHANDLED_CUDA_ERROR, m);
    Ok(match spec {
        Spec::Coll {
            header,
            send,
            premul,
            ..
        } => {
            let (bytes, _) = sizes(header, comm.nranks(), comm.rank());
            let mut data = memory::read(*send, bytes).map_err(illegal)?;
            if let Some(s) = premul {
                let mut out = vec![0u8; data.len()];
                reduce::reduce(
                    header.dtype,
                    &RedOp::PreMulSum(s.clone()),
                    &[&data],
                    &mut out,
                )
                .map_err(|m| (INVALID_ARGUMENT, m))?;
                data = out;
            }
            Frame::new(Kind::Contribute, comm.key(), 0, comm.rank(), 0).with(header.encode(&data))
        }
        Spec::Send { buf, bytes, peer } => {
            let data = memory::read(*buf, *bytes).map_err(illegal)?;
            Frame::new(Kind::Send, comm.key(), 0, comm.rank(), *peer).with(data)
        }
        Spec::Recv { peer, .. } => Frame::new(Kind::RecvPost, comm.key(), 0, comm.rank(), *peer),
    })
}

fn output(comm: &Comm, p: &Planned) -> Result<(), Option<Failure>> {
    let (key, dst, want) = match &p.spec {
        Spec::Coll { header, recv, .. } => (
            (Kind::Result, p.seq, 0),
            *recv,
            sizes(header, comm.nranks(), comm.rank()).1,
        ),
        Spec::Recv { buf, bytes, peer } => ((Kind::Deliver, p.seq, *peer), *buf, *bytes),
        Spec::Send { .. } => return Ok(()),
    };
    let data = comm.wait(key.0, key.1, key.2).ok_or(None)?.map_err(Some)?;
    if data.len() != want {
        return Err(Some((INVALID_USAGE, format!(
            "c10d-gpusim: rank {} expected {want} bytes for op {} but its peers sent {} (a count mismatch between ranks)",
            comm.rank(), p.seq, data.len()
        ))));
    }
    memory::write(dst, &data).map_err(|m| Some((UNHANDLED_CUDA_ERROR, m)))
}

fn inject(comm: &Comm, fault: Fault, seq: u64) {
    let what = format!(
        "c10d-gpusim: injected fault {fault:?} at op {seq} of rank {}",
        comm.rank()
    );
    match fault {
        Fault::Die => {
            eprintln!("{what}: killing the process");
            // SAFETY: kill(2) on our own pid with SIGKILL has no memory effects.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        Fault::RemoteError => comm.fail(
            REMOTE_ERROR,
            &format!("{what} [remote process exited or there was a network error]"),
        ),
        Fault::SystemError => comm.fail(SYSTEM_ERROR, &format!("{what} [system error]")),
        Fault::Hang | Fault::InitHang => eprintln!("{what}: the op never completes"),
    }
}

fn trace(comm: &Comm, batch: &[Planned], what: &str) {
    crate::config::trace(|| {
        let ops: Vec<String> = batch
            .iter()
            .map(|p| format!("{:?}#{}", p.spec, p.seq))
            .collect();
        format!(
            "comm {:#x} rank {}: {what} {ops:?}",
            comm.key(),
            comm.rank()
        )
    });
}

/// Runs a batch on the stream's worker.
pub fn run(comm: &Arc<Comm>, batch: &[Planned]) {
    trace(comm, batch, "start");
    let result = run_inner(comm, batch);
    trace(comm, batch, &format!("end {:?}", result.as_ref().err()));
    if let Err(Some((code, msg))) = result {
        if code == UNHANDLED_CUDA_ERROR {
            device::fail(comm.device, crate::abi::ILLEGAL_ADDRESS, &msg);
        }
        comm.fail(code, &msg);
        comm.wait_until_aborted();
    }
    comm.inflight.fetch_sub(1, Ordering::AcqRel);
}

fn run_inner(comm: &Comm, batch: &[Planned]) -> Result<(), Option<Failure>> {
    if let Some(p) = batch.iter().find(|p| p.fault.is_some()) {
        inject(comm, p.fault.expect("found"), p.seq);
        comm.wait_until_aborted();
        return Err(None);
    }
    if comm.aborted() {
        return Err(None);
    }
    for p in batch {
        let mut f = input(comm, &p.spec).map_err(Some)?;
        f.seq = p.seq;
        comm.send(&f).map_err(Some)?;
    }
    for p in batch {
        output(comm, p)?;
    }
    Ok(())
}

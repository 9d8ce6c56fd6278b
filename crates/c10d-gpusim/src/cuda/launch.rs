//! The one path every queued operation takes (copies, memsets, host functions, stream memory
//! operations, event records and waits, NCCL kernels, graph launches): into the capture when
//! the stream captures, else onto the stream with the implicit synchronisation of the legacy
//! default stream.

use crate::abi::{self, CuResult};
use crate::cuda::capture::{self, Node};
use crate::cuda::device;
use crate::cuda::stream::{Stream, Work};
use std::sync::Arc;

/// Queues `node` on the stream behind `handle`.
///
/// # Errors
/// The stream's lookup errors; the device's sticky error; `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`
/// when the legacy stream is used while a blocking stream of its device captures.
pub fn enqueue(handle: usize, node: Node) -> Result<Arc<Stream>, CuResult> {
    let stream = device::stream(handle)?;
    device::sticky(stream.device)?;
    enqueue_on(&stream, node)?;
    Ok(stream)
}

/// [`enqueue`] on a resolved stream.
pub fn enqueue_on(stream: &Arc<Stream>, node: Node) -> Result<(), CuResult> {
    if let Some(cap) = capture::of(stream) {
        capture::record(&cap, node);
        return Ok(());
    }
    if device::is_legacy(stream) && capture::blocking_capture_on(stream.device) {
        return Err(abi::CAPTURE_IMPLICIT);
    }
    let work = node();
    let waits = implicit_waits(stream);
    if waits.is_empty() {
        stream.push(work);
    } else {
        stream.push(Arc::new(move || {
            for (s, n) in &waits {
                s.wait_for(*n);
            }
            work()
        }));
    }
    Ok(())
}

/// A node that is the same work at every replay.
pub fn node(work: impl Fn() + Send + Sync + 'static) -> Node {
    let work: Work = Arc::new(work);
    Arc::new(move || work.clone())
}

/// What work queued now on `stream` must wait for: on the legacy stream, all prior work of
/// the device's blocking streams; on a blocking stream, prior legacy-stream work.
fn implicit_waits(stream: &Arc<Stream>) -> Vec<(Arc<Stream>, u64)> {
    if stream.non_blocking {
        return Vec::new();
    }
    let others: Vec<Arc<Stream>> = if device::is_legacy(stream) {
        device::streams_of(stream.device)
            .into_iter()
            .filter(|s| !s.non_blocking && !Arc::ptr_eq(s, stream))
            .collect()
    } else {
        vec![device::legacy(stream.device)]
    };
    others
        .into_iter()
        .map(|s| {
            let n = s.submitted();
            (s, n)
        })
        .filter(|(s, n)| !s.reached(*n))
        .collect()
}

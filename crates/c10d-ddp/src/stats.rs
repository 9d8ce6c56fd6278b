//! Counters of a Reducer, in the spirit of PyTorch's DDP `Logger` (`DDPLoggingData`): bucket
//! layout and where the backward pass's communication time went.

use std::sync::{Arc, Mutex};
use std::task::Wake;
use std::time::{Duration, Instant};

/// A snapshot of a Reducer's counters ([`super::Reducer::stats`]); times are sums over all
/// finished iterations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DdpStats {
    /// Finished iterations (`finalize_backward` calls that succeeded).
    pub iterations: u64,
    /// Size in bytes of each current bucket, in reduction order (`bucket_sizes`).
    pub bucket_sizes: Vec<usize>,
    /// Whether the buckets were rebuilt in gradient-arrival order (`has_rebuilt_buckets`).
    pub has_rebuilt_buckets: bool,
    /// The registered comm hook's name, or "builtin_allreduce" without one (`comm_hook`).
    pub comm_hook: String,
    /// Parameters treated as unused in the last iteration (`unused_parameter_size` counts bytes
    /// in PyTorch; this is their number).
    pub unused_parameters: usize,
    /// From the start of the backward pass (first gradient marked ready, or
    /// `prepare_for_backward`) to `finalize_backward` (`backward_compute_time`).
    pub backward_compute_time: Duration,
    /// Time some bucket's reduction was in flight (launch to completion, overlapping reductions
    /// counted once) (`backward_comm_time`).
    pub backward_comm_time: Duration,
    /// The part of `backward_comm_time` before `finalize_backward` was called, i.e. hidden behind
    /// the backward computation (`backward_compute_comm_overlap_time`).
    pub backward_compute_comm_overlap_time: Duration,
    /// Time `finalize_backward` spent waiting for reductions to finish.
    pub finalize_wait_time: Duration,
    /// Total bytes of gradient buckets reduced.
    pub bytes_reduced: u64,
}

impl DdpStats {
    /// The share of communication time hidden behind the backward pass (0 when nothing was
    /// communicated).
    pub fn hidden_comm_share(&self) -> f64 {
        let comm = self.backward_comm_time.as_secs_f64();
        if comm > 0.0 {
            self.backward_compute_comm_overlap_time.as_secs_f64() / comm
        } else {
            0.0
        }
    }
}

impl std::fmt::Display for DdpStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} buckets ({} bytes), {} iterations, comm {:.1} ms of which {:.0}% hidden behind the backward pass, finalize waited {:.1} ms, backward compute {:.1} ms",
            self.bucket_sizes.len(),
            self.bucket_sizes.iter().sum::<usize>(),
            self.iterations,
            self.backward_comm_time.as_secs_f64() * 1e3,
            self.hidden_comm_share() * 100.0,
            self.finalize_wait_time.as_secs_f64() * 1e3,
            self.backward_compute_time.as_secs_f64() * 1e3,
        )
    }
}

/// Records when a collective completed: a waker that stamps the time it is woken.
#[derive(Default)]
pub(crate) struct DoneAt(Mutex<Option<Instant>>);

impl Wake for DoneAt {
    fn wake(self: Arc<Self>) {
        self.stamp();
    }
}

impl DoneAt {
    /// Sets the completion time to now unless it is already set.
    pub(crate) fn stamp(&self) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.get_or_insert_with(Instant::now);
    }
    /// The completion time, if recorded.
    pub(crate) fn get(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Length of the union of `intervals`, and of its part before `cut`.
pub(crate) fn union_before(
    mut intervals: Vec<(Instant, Instant)>,
    cut: Instant,
) -> (Duration, Duration) {
    intervals.sort();
    let (mut total, mut before) = (Duration::ZERO, Duration::ZERO);
    let mut cur: Option<(Instant, Instant)> = None;
    let mut close = |(s, e): (Instant, Instant)| {
        total += e - s;
        if s < cut {
            before += e.min(cut) - s;
        }
    };
    for (s, e) in intervals {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some(done) => {
                close(done);
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some(done) = cur {
        close(done);
    }
    (total, before)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_counts_overlaps_once() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let (total, before) = union_before(
            vec![(ms(0), ms(10)), (ms(5), ms(20)), (ms(30), ms(40))],
            ms(15),
        );
        assert_eq!(total, Duration::from_millis(30));
        assert_eq!(before, Duration::from_millis(15));
    }
}

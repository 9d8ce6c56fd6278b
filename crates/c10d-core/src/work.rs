//! `Work`: the handle of one launched operation (mirrors `c10d::Work` / `torch.distributed.Work`).

use crate::error::{DistError, Result};
use crate::flight_recorder::Trace;
use crate::tensor::Tensor;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

pub use crate::op_type::OpType;

impl std::fmt::Display for OpType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

enum Status {
    Pending,
    Done(Result<()>),
}

struct State {
    status: Status,
    source_rank: Option<usize>,
    outputs: Vec<Tensor>,
    wakers: Vec<Waker>,
    /// Threads blocked on the condition variable: completion signals it only when there are
    /// some (a signal is a system call even with nobody waiting, one per op on the fast path
    /// where the caller's own thread completes the op).
    sleepers: u32,
    abort: Option<Box<dyn FnOnce() + Send>>,
    wait_hook: Option<WaitHook>,
}

/// A backend's own `wait`: called with the caller's timeout before blocking; `Some(result)` ends
/// the wait with that result, `None` falls back to blocking until completion. NCCL uses it to make
/// the caller's stream wait on the op's end event without blocking the host, as PyTorch's
/// `WorkNCCL::wait` does.
pub type WaitHook = Arc<dyn Fn(Option<Duration>) -> Option<Result<()>> + Send + Sync>;

struct Inner {
    op: OpType,
    seq: u64,
    state: Mutex<State>,
    cv: Condvar,
}

/// Handle of one launched operation. Cloning shares the handle.
///
/// `wait()` blocks until the backend completes the operation; it cannot hang forever because
/// every backend enforces its per-op timeout and fails the work when it expires. Works of one
/// group complete in issue order. `Work` is also a [`Future`] (output `Result<()>`), usable from
/// any executor without pulling in an async runtime.
#[derive(Clone)]
pub struct Work(Arc<Inner>);

/// The backend's side of a [`Work`]: completes it exactly once. Dropping it without completing
/// fails the work (so a crashed worker thread never leaves a waiter hanging). With a flight
/// recorder [`Trace`] attached ([`WorkCompleter::set_trace`]) the recorder learns when the op
/// starts and how it ended.
pub struct WorkCompleter {
    inner: Option<Arc<Inner>>,
    trace: Option<Trace>,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Work(op={}, seq={}, completed={})",
            self.0.op,
            self.0.seq,
            self.is_completed()
        )
    }
}

fn lock(inner: &Inner) -> std::sync::MutexGuard<'_, State> {
    inner.state.lock().unwrap_or_else(|e| e.into_inner())
}

impl Work {
    /// A pending work and the completer the backend keeps.
    pub fn new(op: OpType, seq: u64) -> (Work, WorkCompleter) {
        let inner = Arc::new(Inner {
            op,
            seq,
            state: Mutex::new(State {
                status: Status::Pending,
                source_rank: None,
                outputs: Vec::new(),
                wakers: Vec::new(),
                sleepers: 0,
                abort: None,
                wait_hook: None,
            }),
            cv: Condvar::new(),
        });
        (
            Work(inner.clone()),
            WorkCompleter {
                inner: Some(inner),
                trace: None,
            },
        )
    }

    /// A work that is already complete (for no-op collectives such as a 1-rank group).
    pub fn completed(op: OpType, seq: u64, result: Result<()>, outputs: Vec<Tensor>) -> Work {
        let (w, c) = Work::new(op, seq);
        c.set_outputs(outputs);
        c.complete(result);
        w
    }

    /// The operation type.
    pub fn op_type(&self) -> OpType {
        self.0.op
    }

    /// The group sequence number this op was issued with.
    pub fn sequence_number(&self) -> u64 {
        self.0.seq
    }

    /// Blocks until done; returns the op's error if it failed. Mirrors `Work.wait()`.
    ///
    /// # Errors
    /// The error the backend failed the op with (timeout, dead peer, mismatch ...).
    pub fn wait(&self) -> Result<()> {
        let mut st = match self.settle(None) {
            Ok(r) => return r,
            Err(st) => st,
        };
        loop {
            if let Status::Done(r) = &st.status {
                return r.clone();
            }
            st.sleepers += 1;
            st = self.0.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            st.sleepers -= 1;
        }
    }

    /// Blocks at most `timeout`. Mirrors `Work.wait(timeout)`.
    ///
    /// # Errors
    /// The op's own error, or [`DistError::Backend`] "Work {op} (seq {n}) timed out after {ms}ms
    /// in wait()" when it is still running (the op itself goes on; call [`Work::abort`] to stop it).
    pub fn wait_timeout(&self, timeout: Duration) -> Result<()> {
        let Some(deadline) = Instant::now().checked_add(timeout) else {
            // A timeout past the end of time (e.g. Duration::MAX) means no timeout.
            return self.wait();
        };
        let mut st = match self.settle(Some(timeout)) {
            Ok(r) => return r,
            Err(st) => st,
        };
        loop {
            if let Status::Done(r) = &st.status {
                return r.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DistError::backend(format!(
                    "Work {} (seq {}) timed out after {}ms in wait()",
                    self.0.op,
                    self.0.seq,
                    timeout.as_millis()
                )));
            }
            st.sleepers += 1;
            st = (self.0.cv.wait_timeout(st, deadline - now))
                .unwrap_or_else(|e| e.into_inner())
                .0;
            st.sleepers -= 1;
        }
    }

    /// The op's result when it is done, or the backend's wait hook's answer; otherwise the
    /// locked state to block on (one lock when there is no hook).
    fn settle(
        &self,
        timeout: Option<Duration>,
    ) -> std::result::Result<Result<()>, MutexGuard<'_, State>> {
        let st = lock(&self.0);
        if let Status::Done(r) = &st.status {
            return Ok(r.clone());
        }
        let Some(hook) = st.wait_hook.clone() else {
            return Err(st);
        };
        drop(st);
        match hook(timeout) {
            Some(r) => Ok(r),
            None => Err(lock(&self.0)),
        }
    }

    /// True once the op finished, successfully or not (`Work.is_completed()`).
    pub fn is_completed(&self) -> bool {
        matches!(lock(&self.0).status, Status::Done(_))
    }

    /// True once the op finished successfully (`Work.is_success()`).
    pub fn is_success(&self) -> bool {
        matches!(lock(&self.0).status, Status::Done(Ok(())))
    }

    /// The error of a failed op (`Work.exception()`), `None` while pending or on success.
    pub fn exception(&self) -> Option<DistError> {
        match &lock(&self.0).status {
            Status::Done(Err(e)) => Some(e.clone()),
            _ => None,
        }
    }

    /// For a receive from any source: the group rank the message came from (`Work._source_rank()`).
    pub fn source_rank(&self) -> Option<usize> {
        lock(&self.0).source_rank
    }

    /// The output tensors (`Work.result()`); empty until completion.
    pub fn result(&self) -> Vec<Tensor> {
        let st = lock(&self.0);
        match st.status {
            Status::Done(_) => st.outputs.clone(),
            Status::Pending => Vec::new(),
        }
    }

    /// Asks the backend to abort the op (`Work.abort()`); the work then fails if still pending.
    pub fn abort(&self) {
        let hook = lock(&self.0).abort.take();
        if let Some(h) = hook {
            h();
        }
    }
}

impl Future for Work {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = lock(&self.0);
        match &st.status {
            Status::Done(r) => Poll::Ready(r.clone()),
            Status::Pending => {
                if !st.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    st.wakers.push(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

impl WorkCompleter {
    /// Attaches the flight-recorder trace of this op: [`WorkCompleter::mark_started`] and the
    /// completion (or the drop) are reported to it.
    pub fn set_trace(&mut self, trace: Option<Trace>) {
        self.trace = trace;
    }

    /// Tells the flight recorder (if a trace is attached) that the op started running.
    pub fn mark_started(&self) {
        if let Some(t) = &self.trace {
            t.started();
        }
    }

    /// Sets the output tensors reported by [`Work::result`].
    pub fn set_outputs(&self, outputs: Vec<Tensor>) {
        if let Some(i) = &self.inner {
            lock(i).outputs = outputs;
        }
    }

    /// Records the source rank of a receive-from-any-source.
    pub fn set_source_rank(&self, rank: usize) {
        if let Some(i) = &self.inner {
            lock(i).source_rank = Some(rank);
        }
    }

    /// Installs the hook [`Work::abort`] calls.
    pub fn set_abort_hook(&self, hook: Box<dyn FnOnce() + Send>) {
        if let Some(i) = &self.inner {
            lock(i).abort = Some(hook);
        }
    }

    /// Installs the backend's own wait ([`WaitHook`]), used by [`Work::wait`] and
    /// [`Work::wait_timeout`] while the work is pending.
    pub fn set_wait_hook(&self, hook: WaitHook) {
        if let Some(i) = &self.inner {
            lock(i).wait_hook = Some(hook);
        }
    }

    /// Completes the work, waking every waiter and future. The flight recorder hears of it
    /// first (so a dump it writes on failure exists when a waiter sees the error, unless the
    /// completing thread holds dumps back: see `flight_recorder::hold_failure_dumps`).
    pub fn complete(mut self, result: Result<()>) {
        if let Some(i) = self.inner.take() {
            Self::finish(&i, self.trace.take(), result);
        }
    }

    fn finish(i: &Inner, trace: Option<Trace>, result: Result<()>) {
        if let Some(t) = trace {
            t.finished(result.as_ref().map(|_| ()));
        }
        let (wakers, sleepers) = {
            let mut st = lock(i);
            if matches!(st.status, Status::Done(_)) {
                return;
            }
            st.status = Status::Done(result);
            st.abort = None;
            st.wait_hook = None;
            (std::mem::take(&mut st.wakers), st.sleepers)
        };
        // A waiter counts itself and checks the status under the lock before it blocks, so
        // with none counted here none can miss the completion.
        if sleepers > 0 {
            i.cv.notify_all();
        }
        wakers.into_iter().for_each(Waker::wake);
    }
}

impl Drop for WorkCompleter {
    fn drop(&mut self) {
        if let Some(i) = self.inner.take() {
            let msg = format!(
                "{} (seq {}) was dropped by its backend without completing",
                i.op, i.seq
            );
            Self::finish(&i, self.trace.take(), Err(DistError::backend(msg)));
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn wait_hook_ends_a_wait_and_goes_at_completion() {
        let (w, c) = Work::new(OpType::Allreduce, 1);
        c.set_wait_hook(Arc::new(|timeout| {
            if timeout.is_some() {
                None
            } else {
                Some(Ok(()))
            }
        }));
        w.wait().unwrap();
        assert!(!w.is_completed());
        // The hook steps aside for a timed wait, which then times out as usual.
        assert!(w.wait_timeout(Duration::from_millis(10)).is_err());
        c.complete(Err(DistError::backend("boom")));
        // Completed: the op's own result, not the hook's.
        assert_eq!(w.wait().unwrap_err().message(), "boom");
    }

    use super::*;
    use std::task::Wake;

    #[test]
    fn wait_returns_result_and_timeout_errors() {
        let (w, c) = Work::new(OpType::Allreduce, 3);
        assert!(!w.is_completed());
        let e = w.wait_timeout(Duration::from_millis(10)).unwrap_err();
        assert!(e
            .to_string()
            .contains("ALLREDUCE (seq 3) timed out after 10ms"));
        let w2 = w.clone();
        let t = std::thread::spawn(move || w2.wait());
        c.complete(Err(DistError::backend("boom")));
        assert_eq!(t.join().unwrap().unwrap_err().to_string(), "boom");
        assert!(w.is_completed() && !w.is_success());
        assert_eq!(w.exception().unwrap().to_string(), "boom");
    }

    #[test]
    fn completion_wakes_threads_blocked_in_wait() {
        // Both waiters are counted as sleeping before the op completes: the completion must
        // signal them (it skips the signal only when nobody sleeps).
        let (w, c) = Work::new(OpType::Allreduce, 4);
        let (tx, rx) = std::sync::mpsc::channel();
        for timed in [false, true] {
            let (w, tx) = (w.clone(), tx.clone());
            std::thread::spawn(move || {
                let r = if timed {
                    w.wait_timeout(Duration::from_secs(600))
                } else {
                    w.wait()
                };
                tx.send(r.is_ok()).unwrap();
            });
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while lock(&w.0).sleepers < 2 {
            assert!(Instant::now() < deadline, "the waiters never blocked");
            std::thread::sleep(Duration::from_millis(1));
        }
        c.complete(Ok(()));
        for _ in 0..2 {
            let woken = rx.recv_timeout(Duration::from_secs(20));
            assert_eq!(woken, Ok(true), "a waiter was not woken");
        }
        assert_eq!(lock(&w.0).sleepers, 0);
    }

    #[test]
    fn op_codes_round_trip() {
        for op in OpType::ALL {
            assert_eq!(OpType::from_code(op.code()), Some(op));
        }
        assert_eq!(OpType::from_code(21), None);
    }

    #[test]
    fn huge_wait_timeout_means_no_timeout() {
        let (w, c) = Work::new(OpType::Allreduce, 0);
        c.complete(Ok(()));
        assert!(w.wait_timeout(Duration::MAX).is_ok());
    }

    #[test]
    fn dropped_completer_fails_the_work() {
        let (w, c) = Work::new(OpType::Barrier, 0);
        drop(c);
        assert!(w
            .wait()
            .unwrap_err()
            .to_string()
            .contains("dropped by its backend"));
    }

    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn future_is_woken_on_completion() {
        let (mut w, c) = Work::new(OpType::Send, 1);
        let flag = Arc::new(Flag(false.into()));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        c.set_source_rank(2);
        c.complete(Ok(()));
        assert!(flag.0.load(std::sync::atomic::Ordering::SeqCst));
        assert!(matches!(
            Pin::new(&mut w).poll(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(w.source_rank(), Some(2));
    }
}

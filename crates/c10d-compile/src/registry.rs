//! The process-wide work registry behind `wait_tensor` (c10d's `WorkRegistry`).
//!
//! Functional collectives return their outputs at once and register the op's [`Work`] under each
//! output's **storage**; `wait_tensor(t)` pops every work registered for `t`'s storage, waits
//! for them and returns `t` itself. PyTorch's rules:
//! - one functional op registers one work per output (a coalesced op with two outputs adds two
//!   entries, the same work under each storage); a work registered twice under one storage
//!   counts once;
//! - [`wait_tensor`] on a tensor with nothing registered is a no-op;
//! - the registry is process-wide, so a tensor can be waited from any thread; registered works
//!   stay alive after the caller drops its handles;
//! - a plain asynchronous collective is registered only inside
//!   [`allow_inflight_collective_as_graph_input_ctx`] (see [`track_async_work`]);
//! - works still registered when the process exits are reported with PyTorch's warning ("At the
//!   time of process termination, there are still N unwaited collective calls. ...") and are left
//!   alone (never waited), so exit cannot hang.
//!
//! Departures: tensors carry no public storage identity, so entries are found by
//! [`Tensor::shares_storage_with`] (a short linear scan) and each entry keeps its storage alive
//! until it is waited (PyTorch holds it weakly; the work keeps its outputs alive anyway). The
//! in-flight scope is per thread (PyTorch keeps it per rank with `RankLocal`: with ranks run as
//! threads each rank has its own scope; in a one-rank-per-process program the two agree).

use c10d_core::{DistError, Result, Tensor, Work};
use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

/// A registered work and the id that identifies it (works carry no identity of their own).
struct Registered {
    id: u64,
    work: Work,
}

struct Entry {
    /// Any tensor viewing the storage (the key).
    key: Tensor,
    works: Vec<Registered>,
}

static REGISTRY: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static AT_EXIT: Once = Once::new();

thread_local! {
    static INFLIGHT_DEPTH: Cell<usize> = const { Cell::new(0) };
}

fn registry() -> MutexGuard<'static, Vec<Entry>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// PyTorch's warning for works still registered at process exit (`~WorkRegistry`).
pub fn unwaited_at_exit_message(n: usize) -> String {
    format!(
        "At the time of process termination, there are still {n} unwaited collective calls. \
         Please review your program to ensure that:\n\
         1. c10d_functional.wait_tensor() is invoked on all tensors returned from c10d_functional collective,\n\
         2. c10d_functional.wait_tensor() is invoked on all output tensors of async_op=True torch.distributed collective \
         called under `with allow_inflight_collective_as_graph_input_ctx():`,\n\
         before the output tensors of the collective are used."
    )
}

extern "C" fn warn_unwaited_at_exit() {
    // Never block or panic at exit: a registry locked by a thread that is still running is
    // skipped; works are not waited (they are leaked, as PyTorch does).
    let n = match REGISTRY.try_lock() {
        Ok(r) => r.iter().map(|e| e.works.len()).sum(),
        Err(std::sync::TryLockError::Poisoned(p)) => {
            p.into_inner().iter().map(|e| e.works.len()).sum()
        }
        Err(std::sync::TryLockError::WouldBlock) => 0,
    };
    if n > 0 {
        let _ = writeln!(std::io::stderr(), "[W] {}", unwaited_at_exit_message(n));
    }
}

fn install_exit_hook() {
    AT_EXIT.call_once(|| {
        // SAFETY: `atexit` only stores the pointer of an `extern "C" fn()` that takes no
        // arguments, never unwinds (it neither panics nor blocks) and touches only statics that
        // live for the whole process.
        let rc = unsafe { libc::atexit(warn_unwaited_at_exit) };
        if rc != 0 {
            log::debug!(
                "c10d-compile: atexit registration failed; no exit warning for unwaited works"
            );
        }
    });
}

/// A fresh id for a work about to be registered under one or more tensors.
pub(crate) fn new_work_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Registers `work` (identified by `id`) under the storage of each of `tensors`.
pub(crate) fn register_with_id(tensors: &[&Tensor], id: u64, work: &Work) {
    install_exit_hook();
    let mut reg = registry();
    for t in tensors {
        match reg.iter_mut().find(|e| e.key.shares_storage_with(t)) {
            Some(e) => {
                if !e.works.iter().any(|w| w.id == id) {
                    e.works.push(Registered {
                        id,
                        work: work.clone(),
                    });
                }
            }
            None => reg.push(Entry {
                key: (*t).clone(),
                works: vec![Registered {
                    id,
                    work: work.clone(),
                }],
            }),
        }
    }
}

/// `c10d::register_work(tensor, work)`: registers `work` under `tensor`'s storage, so that
/// [`wait_tensor`] on any view of it waits for the work. Each call registers a new entry (a
/// [`Work`] handle has no identity to deduplicate on); functional collectives register each
/// op once per storage.
pub fn register_work(tensor: &Tensor, work: &Work) {
    register_with_id(&[tensor], new_work_id(), work);
}

/// Removes the works registered under `tensor`'s storage without waiting for them, returning
/// them.
pub fn pop_works(tensor: &Tensor) -> Vec<Work> {
    let mut reg = registry();
    match reg.iter().position(|e| e.key.shares_storage_with(tensor)) {
        Some(i) => reg
            .swap_remove(i)
            .works
            .into_iter()
            .map(|w| w.work)
            .collect(),
        None => Vec::new(),
    }
}

/// `get_work_registry_size()`: the number of registered works, summed over storages.
pub fn work_registry_size() -> usize {
    registry().iter().map(|e| e.works.len()).sum()
}

/// `torch.ops._c10d_functional.wait_tensor(t)`: waits for (and unregisters) every work
/// registered under `t`'s storage and returns `t` (a handle to the same tensor). A tensor with
/// nothing registered returns at once. The wait is bounded by each op's backend timeout.
///
/// # Errors
/// The first failure among the waited works (all are waited first).
pub fn wait_tensor(tensor: &Tensor) -> Result<Tensor> {
    let mut first_err = None;
    for w in pop_works(tensor) {
        if let Err(e) = w.wait() {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(tensor.clone()),
    }
}

/// `torch.ops._c10d_functional.wait_tensors(ts)`: [`wait_tensor`] on each.
///
/// # Errors
/// [`DistError::InvalidArgument`] "wait_tensors requires at least one tensor" for an empty list;
/// as [`wait_tensor`].
pub fn wait_tensors(tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    if tensors.is_empty() {
        return Err(DistError::invalid(
            "wait_tensors requires at least one tensor",
        ));
    }
    let mut first_err = None;
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        match wait_tensor(t) {
            Ok(t) => out.push(t),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// `_set_allow_inflight_collective_as_graph_input(on)` for the calling thread.
pub fn set_allow_inflight_collective_as_graph_input(on: bool) {
    INFLIGHT_DEPTH.with(|d| d.set(on as usize));
}

/// `_allow_inflight_collective_as_graph_input()`: whether the calling thread is inside an
/// [`allow_inflight_collective_as_graph_input_ctx`] scope.
pub fn allow_inflight_collective_as_graph_input() -> bool {
    INFLIGHT_DEPTH.with(|d| d.get() > 0)
}

/// `allow_inflight_collective_as_graph_input_ctx()`: runs `f` with plain asynchronous
/// collectives registered in the work registry (see [`track_async_work`]); scopes nest, and the
/// previous state comes back when `f` returns or panics.
pub fn allow_inflight_collective_as_graph_input_ctx<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            INFLIGHT_DEPTH.with(|d| d.set(self.0));
        }
    }
    let prev = INFLIGHT_DEPTH.with(|d| {
        let p = d.get();
        d.set(p + 1);
        p
    });
    let _restore = Restore(prev);
    f()
}

/// For plain asynchronous collectives of c10d-world (`World::all_reduce(..).start()` and
/// friends): registers `work` under each of `tensors` when the calling thread is inside
/// [`allow_inflight_collective_as_graph_input_ctx`], as PyTorch's `ProcessGroup` does; outside
/// the scope nothing is registered. Returns `work` unchanged, so it wraps a call:
/// `track_async_work(&[t.clone()], world.all_reduce(&t).op(op).start()?)`.
///
/// (c10d-world sits below this crate and does not know the registry; this is the one place
/// where its async works enter it.)
pub fn track_async_work(tensors: &[Tensor], work: Work) -> Work {
    if allow_inflight_collective_as_graph_input() {
        let refs: Vec<&Tensor> = tensors.iter().collect();
        register_with_id(&refs, new_work_id(), &work);
    }
    work
}

//! The Reducer: gradient buckets reduced while the backward pass goes on (`c10d::Reducer`).

use super::bucket_assignment::{
    compute_bucket_assignment_by_size, default_bucket_size_limits, BucketAssignment, TensorMeta,
};
use super::bucket_memory::BucketMemory;
use super::buckets::{build_buckets, Bucket, Locator};
use super::comm_hooks::CommHook;
use super::elementwise::{copy_scaled, div_in_place, not_float};
use super::errors;
use super::rebuild::sync_rebuilt_assignment;
use super::stats::{union_before, DdpStats};
use c10d_core::{DistError, ProcessGroup, Result, Tensor};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How a [`Reducer`] buckets and reduces, with `DistributedDataParallel`'s names and defaults.
#[derive(Debug, Clone, Default)]
pub struct ReducerOptions {
    /// Bucket size cap in MiB; `None` = 25 MiB with a 1 MiB first bucket, PyTorch's default.
    pub bucket_cap_mb: Option<f64>,
    /// Treat gradients not marked ready by `finalize_backward` as unused (zero) instead of
    /// failing; buckets are then never rebuilt (as in PyTorch).
    pub find_unused_parameters: bool,
    /// Leave reduced gradients only in the bucket views ([`Reducer::grad`]), never copying them
    /// back into tensors given to [`Reducer::mark_variable_ready_with_grad`].
    pub gradient_as_bucket_view: bool,
    /// The set of used parameters is the same every iteration (`static_graph=True`): the first
    /// iteration reduces everything at `finalize_backward` and records the unused parameters,
    /// later ones mark those ready by themselves.
    pub static_graph: bool,
    /// Parameter names for error messages (empty, or one per parameter).
    pub param_names: Vec<String>,
    /// Longest wait for one bucket in `finalize_backward` and for the bucket rebuild's
    /// broadcast; `None` = the group's default backend timeout.
    pub timeout: Option<Duration>,
}

/// Mutable state, behind one lock.
struct State {
    buckets: Vec<Bucket>,
    locators: Vec<Locator>,
    /// The next bucket to launch: buckets are reduced strictly in order on every rank.
    next_bucket: usize,
    in_backward: bool,
    ready: Vec<bool>,
    copy_back: Vec<Option<Tensor>>,
    unused: Vec<usize>,
    arrival: Vec<usize>,
    has_rebuilt: bool,
    static_unused: Option<Vec<usize>>,
    hook: Option<Box<dyn CommHook>>,
    backward_start: Instant,
    stats: DdpStats,
    /// The error that broke an iteration after it had changed the buckets (a failed
    /// `finalize_backward`, or a failed bucket launch): every later iteration call fails.
    failed: Option<DistError>,
}

/// Reduces gradients across the ranks of a process group in buckets, overlapping communication
/// with the rest of the backward pass (PyTorch's `c10d::Reducer`, the engine of
/// `DistributedDataParallel`). See the [module docs](super) for the flow.
pub struct Reducer {
    pg: ProcessGroup,
    metas: Vec<TensorMeta>,
    shapes: Vec<Vec<usize>>,
    opts: ReducerOptions,
    timeout: Duration,
    memory: BucketMemory,
    state: Mutex<State>,
}

impl std::fmt::Debug for Reducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Reducer(params={}, group={:?}, buckets={:?})",
            self.metas.len(),
            self.pg,
            self.bucket_indices()
        )
    }
}

impl Reducer {
    /// A Reducer for `params` (the model's parameters in registration order; only their dtype,
    /// device and shape are used) on `process_group`.
    ///
    /// Initial buckets follow DDP: with `static_graph` or without `find_unused_parameters`, one
    /// bucket per dtype for the first iteration, rebuilt in gradient-arrival order afterwards;
    /// otherwise buckets by size over the parameters in reverse order.
    ///
    /// Buckets live beside their parameters: host memory for CPU parameters, the device for
    /// device parameters (allocated through their storage: c10d-nccl's CUDA tensors and its
    /// views of the caller's memory can; see the [module docs](super) for what differs there).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] for an empty parameter list, a parameter that is not
    /// floating point, or `param_names` of the wrong length; a device parameter whose storage
    /// cannot allocate buckets there (naming the parameter).
    pub fn new(
        params: &[Tensor],
        process_group: ProcessGroup,
        opts: ReducerOptions,
    ) -> Result<Reducer> {
        check_params(params, &opts)?;
        let metas: Vec<TensorMeta> = params.iter().map(TensorMeta::of).collect();
        let shapes: Vec<Vec<usize>> = params.iter().map(|p| p.shape().to_vec()).collect();
        let limits = if opts.static_graph || !opts.find_unused_parameters {
            vec![usize::MAX]
        } else {
            default_bucket_size_limits(opts.bucket_cap_mb)
        };
        let mut a = compute_bucket_assignment_by_size(&metas, &limits, &[])?;
        // DDP hands the Reducer the buckets reversed: the last parameters' gradients come first.
        a.bucket_indices.reverse();
        a.per_bucket_size_limits.reverse();
        let memory = BucketMemory::for_params(params)?;
        let (buckets, locators) = build_buckets(&metas, &shapes, &a, &memory)?;
        let timeout = match opts.timeout {
            Some(t) => t,
            None => process_group.default_backend()?.timeout(),
        };
        let n = metas.len();
        let stats = DdpStats {
            bucket_sizes: buckets.iter().map(Bucket::nbytes).collect(),
            comm_hook: "builtin_allreduce".into(),
            ..Default::default()
        };
        Ok(Reducer {
            pg: process_group,
            metas,
            shapes,
            opts,
            timeout,
            memory,
            state: Mutex::new(State {
                buckets,
                locators,
                next_bucket: 0,
                in_backward: false,
                ready: vec![false; n],
                copy_back: vec![None; n],
                unused: Vec::new(),
                arrival: Vec::new(),
                has_rebuilt: false,
                static_unused: None,
                hook: None,
                backward_start: Instant::now(),
                stats,
                failed: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The process group gradients are reduced over.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.pg
    }

    /// Number of registered parameters.
    pub fn num_params(&self) -> usize {
        self.metas.len()
    }

    /// Parameter indices of each bucket, in reduction order.
    pub fn bucket_indices(&self) -> Vec<Vec<usize>> {
        self.lock()
            .buckets
            .iter()
            .map(|b| b.params.clone())
            .collect()
    }

    /// The gradient of parameter `index`: a view (the parameter's shape) into its bucket's
    /// buffer. Write the local gradient here and call [`Reducer::mark_variable_ready`]; after
    /// [`Reducer::finalize_backward`] it holds the averaged gradient. Views change when the
    /// buckets are rebuilt (after the first iteration): fetch it again each iteration.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] for an index out of range.
    pub fn grad(&self, index: usize) -> Result<Tensor> {
        self.check_index(index)?;
        let st = self.lock();
        let l = st.locators[index];
        Ok(st.buckets[l.bucket].views[l.intra].clone())
    }

    /// Registers a comm hook (`register_comm_hook`); allowed once, outside a backward pass.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when a hook is already registered or a backward pass is
    /// under way; [`DistError::Unsupported`] for a hook that works on host buckets only
    /// ([`CommHook::supports_device_buckets`]) when a bucket is on a device.
    pub fn register_comm_hook(&self, hook: impl CommHook + 'static) -> Result<()> {
        let mut st = self.lock();
        if let Some(b) = st.buckets.iter().find(|b| !b.buffer.is_cpu()) {
            if !hook.supports_device_buckets() {
                return Err(DistError::unsupported(format!(
                    "{} works on buckets in host memory; this Reducer keeps buckets on {} \
                     (its parameters' device): use AllReduceHook, no hook, or a hook of your own",
                    hook.name(),
                    b.buffer.device()
                )));
            }
        }
        if st.hook.is_some() {
            return Err(DistError::invalid(
                "register_comm_hook or register_builtin_comm_hook can only be called once.",
            ));
        }
        if st.in_backward {
            return Err(DistError::invalid(
                "register_comm_hook must not be called during a backward pass",
            ));
        }
        st.stats.comm_hook = hook.name();
        st.hook = Some(Box::new(hook));
        Ok(())
    }

    /// The counters (bucket sizes, communication and waiting times) for the user to print.
    pub fn stats(&self) -> DdpStats {
        self.lock().stats.clone()
    }

    /// Starts a backward pass (`prepare_for_backward`); `unused` lists parameters that get no
    /// gradient in this iteration (they are reduced as zeros). Optional: the first
    /// `mark_variable_ready` starts a pass with no unused parameters.
    ///
    /// # Errors
    /// The "Expected to have finished reduction in the prior iteration ..." error when the
    /// previous pass was not finalized; an index out of range; the "previous backward pass of
    /// this Reducer failed" error (see [`Reducer::finalize_backward`]).
    pub fn prepare_for_backward(&self, unused: &[usize]) -> Result<()> {
        for &i in unused {
            self.check_index(i)?;
        }
        let mut st = self.lock();
        check_not_failed(&st)?;
        if st.in_backward {
            let unmarked = unmarked(&st);
            return Err(errors::unfinished(
                self.pg.rank(),
                &unmarked,
                &self.opts.param_names,
                self.opts.static_graph && st.static_unused.is_some(),
            ));
        }
        let r = self.begin(&mut st, unused);
        poison_on_error(&mut st, r)
    }

    /// Marks the gradient of parameter `index` ready, already written into
    /// [`Reducer::grad`]`(index)`: PyTorch's `Reducer::mark_variable_ready`, which its autograd
    /// hook calls once a parameter's gradient is accumulated. When this completes a bucket (and
    /// all earlier ones), the bucket's all_reduce is launched asynchronously.
    ///
    /// # Errors
    /// A parameter marked twice in one iteration; under `static_graph`, a parameter that was
    /// unused in the first iteration; an index out of range (these leave the iteration as it
    /// was); an error launching the reduction (this one fails the iteration, as a failed
    /// [`Reducer::finalize_backward`] does); the "previous backward pass of this Reducer failed"
    /// error.
    pub fn mark_variable_ready(&self, index: usize) -> Result<()> {
        self.mark(index, None)
    }

    /// As [`Reducer::mark_variable_ready`] with the gradient in `grad` (same dtype, element
    /// count and device as the parameter), which is copied into the bucket. Unless
    /// `gradient_as_bucket_view`, `finalize_backward` writes the averaged gradient back into
    /// `grad`, which must then still be usable: a view lent by a scope that has ended fails
    /// there ("given back"); set `gradient_as_bucket_view` for lent gradients.
    ///
    /// # Errors
    /// As [`Reducer::mark_variable_ready`]; a gradient of another dtype ("Expected torch.float32,
    /// got torch.float64"), size or device than the parameter's.
    pub fn mark_variable_ready_with_grad(&self, index: usize, grad: &Tensor) -> Result<()> {
        self.mark(index, Some(grad))
    }

    /// Waits for every bucket's reduction and leaves the averaged gradients in the bucket views
    /// (and in the tensors given to `mark_variable_ready_with_grad`). After the first iteration,
    /// also rebuilds the buckets in the order gradients arrived on rank 0 (a broadcast).
    ///
    /// A failed `finalize_backward` leaves the Reducer unusable: some buckets may have been
    /// launched (on this rank and on the others) and not waited for, so their buffers cannot be
    /// reused safely. Every later `prepare_for_backward`, `mark_variable_ready*` and
    /// `finalize_backward` then fails with "The previous backward pass of this Reducer failed
    /// ... build a new Reducer", quoting the first error, with its kind. (PyTorch leaves the
    /// Reducer in an undefined state there; DDP is rebuilt after such errors in practice.)
    ///
    /// # Errors
    /// Gradients never marked ready without `find_unused_parameters` ("Expected to have finished
    /// reduction ..." naming the rank and parameter indices); no backward pass under way (this
    /// one leaves the Reducer usable); a failed or timed-out reduction; the "previous backward
    /// pass of this Reducer failed" error.
    pub fn finalize_backward(&self) -> Result<()> {
        let mut st = self.lock();
        check_not_failed(&st)?;
        if !st.in_backward {
            return Err(DistError::invalid(
                "finalize_backward() called outside a backward pass: no gradient was marked \
                 ready since the last finalize_backward()",
            ));
        }
        let r = self.finalize(&mut st);
        poison_on_error(&mut st, r)
    }
}

/// The "previous backward pass failed" error when an earlier iteration failed.
fn check_not_failed(st: &State) -> Result<()> {
    match &st.failed {
        Some(e) => Err(errors::previous_pass_failed(e)),
        None => Ok(()),
    }
}

/// Records `r`'s error as the one that broke the Reducer, and passes `r` on.
fn poison_on_error(st: &mut State, r: Result<()>) -> Result<()> {
    if let Err(e) = &r {
        st.failed = Some(e.clone());
        st.in_backward = false;
    }
    r
}

impl Reducer {
    /// `finalize_backward` once a backward pass is known to be under way.
    fn finalize(&self, st: &mut State) -> Result<()> {
        let compute_end = Instant::now();
        self.complete_marking(st)?;
        let result = self.wait_all(st, compute_end);
        st.in_backward = false;
        result?;
        for (i, g) in std::mem::take(&mut st.copy_back).into_iter().enumerate() {
            if let Some(g) = g {
                let l = st.locators[i];
                g.copy_from(&st.buckets[l.bucket].views[l.intra].reshape(g.shape())?)?;
            }
        }
        st.copy_back = vec![None; self.metas.len()];
        st.stats.iterations += 1;
        st.stats.unused_parameters = st.unused.len();
        if self.should_rebuild(st) {
            self.rebuild(st)?;
        }
        Ok(())
    }
}

fn check_params(params: &[Tensor], opts: &ReducerOptions) -> Result<()> {
    if params.is_empty() {
        return Err(DistError::invalid("Expected at least one parameter."));
    }
    for (i, p) in params.iter().enumerate() {
        if !matches!(
            p.dtype(),
            c10d_core::DType::F32
                | c10d_core::DType::F64
                | c10d_core::DType::F16
                | c10d_core::DType::BF16
        ) {
            return Err(not_float(p.dtype()).with_prefix(&format!("parameter {i}: ")));
        }
    }
    if !opts.param_names.is_empty() && opts.param_names.len() != params.len() {
        return Err(DistError::invalid(format!(
            "{} parameter names given for {} parameters",
            opts.param_names.len(),
            params.len()
        )));
    }
    Ok(())
}

fn unmarked(st: &State) -> Vec<usize> {
    (0..st.ready.len()).filter(|&i| !st.ready[i]).collect()
}

/// The per-iteration steps behind the public methods.
impl Reducer {
    fn check_index(&self, index: usize) -> Result<()> {
        if index >= self.metas.len() {
            return Err(DistError::invalid(format!(
                "Out of range variable index: {index} (the Reducer has {} parameters)",
                self.metas.len()
            )));
        }
        Ok(())
    }

    fn static_first_iteration(&self, st: &State) -> bool {
        self.opts.static_graph && st.static_unused.is_none()
    }

    fn should_rebuild(&self, st: &State) -> bool {
        (self.opts.static_graph || !self.opts.find_unused_parameters) && !st.has_rebuilt
    }

    /// Resets the per-iteration state and marks the unused parameters.
    fn begin(&self, st: &mut State, unused: &[usize]) -> Result<()> {
        st.in_backward = true;
        st.backward_start = Instant::now();
        st.next_bucket = 0;
        st.ready.iter_mut().for_each(|r| *r = false);
        st.unused.clear();
        st.arrival.clear();
        for b in st.buckets.iter_mut() {
            b.pending = b.params.len();
        }
        let mut all: Vec<usize> = st.static_unused.clone().unwrap_or_default();
        for &i in unused {
            if !all.contains(&i) {
                all.push(i); // an index listed twice is still one unused parameter
            }
        }
        for i in all {
            self.mark_unused(st, i)?;
        }
        Ok(())
    }

    fn mark(&self, index: usize, grad: Option<&Tensor>) -> Result<()> {
        self.check_index(index)?;
        let mut st = self.lock();
        check_not_failed(&st)?;
        if let Some(g) = grad {
            let l = st.locators[index];
            check_grad(index, g, &st.buckets[l.bucket].views[l.intra])?;
        }
        if !st.in_backward {
            let r = self.begin(&mut st, &[]);
            poison_on_error(&mut st, r)?;
        }
        if st
            .static_unused
            .as_ref()
            .is_some_and(|u| u.contains(&index))
        {
            return Err(errors::static_graph_changed(index, &self.opts.param_names));
        }
        if st.ready[index] {
            return Err(errors::marked_twice(index, &self.opts.param_names));
        }
        self.fill_view(&st, index, grad)?;
        if let Some(g) = grad {
            if !self.opts.gradient_as_bucket_view {
                st.copy_back[index] = Some(g.clone());
            }
        }
        let r = self.set_ready(&mut st, index);
        poison_on_error(&mut st, r)
    }

    /// Marks an unused parameter ready with a zero gradient.
    fn mark_unused(&self, st: &mut State, index: usize) -> Result<()> {
        if st.ready[index] {
            return Err(errors::marked_twice(index, &self.opts.param_names));
        }
        let l = st.locators[index];
        st.buckets[l.bucket].views[l.intra].zero_()?;
        st.unused.push(index);
        self.set_ready(st, index)
    }

    /// Copies (or scales in place) the gradient into its bucket view. Without a comm hook a
    /// host gradient is divided by the group size on the way in, as PyTorch does; a device
    /// bucket is averaged by its collective instead ([`super::average::average_op`]).
    fn fill_view(&self, st: &State, index: usize, grad: Option<&Tensor>) -> Result<()> {
        let l = st.locators[index];
        let view = &st.buckets[l.bucket].views[l.intra];
        let n = if st.hook.is_none() && view.is_cpu() {
            self.pg.size()
        } else {
            1
        };
        match grad {
            Some(g) if !is_same_view(g, view) => {
                if n > 1 {
                    copy_scaled(view, g, 1.0 / n as f64)
                } else {
                    view.copy_from(g)
                }
            }
            _ if n > 1 => div_in_place(view, n as f64),
            _ => Ok(()),
        }
    }

    /// Records `index` as ready and launches every bucket that became complete, in order.
    fn set_ready(&self, st: &mut State, index: usize) -> Result<()> {
        st.ready[index] = true;
        st.arrival.push(index);
        let b = st.locators[index].bucket;
        st.buckets[b].pending -= 1;
        if self.static_first_iteration(st) {
            return Ok(()); // reduced all at once in finalize_backward (delay_all_reduce)
        }
        self.launch_ready_buckets(st)
    }

    fn launch_ready_buckets(&self, st: &mut State) -> Result<()> {
        let n = st.buckets.len();
        while st.next_bucket < n && st.buckets[st.next_bucket].pending == 0 {
            let b = st.next_bucket;
            let gb = st.buckets[b].grad_bucket(b, b + 1 == n, &self.shapes);
            let State { buckets, hook, .. } = &mut *st;
            buckets[b].launch(&gb, &self.pg, hook.as_deref())?;
            st.next_bucket += 1;
        }
        Ok(())
    }

    /// At finalize: handles gradients never marked (unused, or an error) and, in a static
    /// graph's first iteration, launches every bucket.
    fn complete_marking(&self, st: &mut State) -> Result<()> {
        let missing = unmarked(st);
        if self.static_first_iteration(st) {
            for &i in &missing {
                self.mark_unused(st, i)?;
            }
            st.static_unused = Some(missing);
            return self.launch_ready_buckets(st);
        }
        if missing.is_empty() {
            return Ok(());
        }
        if self.opts.find_unused_parameters && !self.opts.static_graph {
            for i in missing {
                self.mark_unused(st, i)?;
            }
            return Ok(());
        }
        Err(errors::unfinished(
            self.pg.rank(),
            &missing,
            &self.opts.param_names,
            self.opts.static_graph,
        ))
    }

    /// Waits for every bucket and adds the iteration's times to the counters.
    fn wait_all(&self, st: &mut State, compute_end: Instant) -> Result<()> {
        let n = st.buckets.len();
        let mut intervals = Vec::with_capacity(n);
        let mut bytes = 0u64;
        for b in 0..n {
            let gb = st.buckets[b].grad_bucket(b, b + 1 == n, &self.shapes);
            intervals.push(st.buckets[b].finish(&gb, self.timeout)?);
            bytes += st.buckets[b].nbytes() as u64;
        }
        let finalize_end = Instant::now();
        let (comm, overlap) = union_before(intervals, compute_end);
        let s = &mut st.stats;
        s.backward_compute_time += compute_end.saturating_duration_since(st.backward_start);
        s.backward_comm_time += comm;
        s.backward_compute_comm_overlap_time += overlap;
        s.finalize_wait_time += finalize_end - compute_end;
        s.bytes_reduced += bytes;
        Ok(())
    }

    /// Rebuilds the buckets in gradient-arrival order (rank 0's, broadcast), keeping the current
    /// gradient values.
    fn rebuild(&self, st: &mut State) -> Result<()> {
        let limits = default_bucket_size_limits(self.opts.bucket_cap_mb);
        let a: BucketAssignment = sync_rebuilt_assignment(
            &self.pg,
            &self.metas,
            &st.arrival,
            &limits,
            self.timeout,
            &self.memory,
        )?;
        let (buckets, locators) = build_buckets(&self.metas, &self.shapes, &a, &self.memory)?;
        for (old, new) in st.locators.iter().zip(&locators) {
            buckets[new.bucket].views[new.intra]
                .copy_from(&st.buckets[old.bucket].views[old.intra])?;
        }
        st.stats.bucket_sizes = buckets.iter().map(Bucket::nbytes).collect();
        st.stats.has_rebuilt_buckets = true;
        st.buckets = buckets;
        st.locators = locators;
        st.has_rebuilt = true;
        Ok(())
    }
}

/// A gradient given for parameter `index` must match its bucket view in dtype, element count
/// and device (or be the view itself).
fn check_grad(index: usize, g: &Tensor, view: &Tensor) -> Result<()> {
    let why = if is_same_view(g, view) {
        return Ok(());
    } else if g.dtype() != view.dtype() {
        format!("Expected {}, got {}", view.dtype(), g.dtype())
    } else if g.numel() != view.numel() {
        format!("Expected {} elements, got {}", view.numel(), g.numel())
    } else if g.device() != view.device() {
        format!(
            "Expected a gradient on {} (the parameter's device), got one on {}",
            view.device(),
            g.device()
        )
    } else {
        return Ok(());
    };
    Err(DistError::invalid(format!(
        "gradient of parameter {index}: {why}"
    )))
}

/// True when `g` is exactly `view` (the caller passed the bucket view itself).
fn is_same_view(g: &Tensor, view: &Tensor) -> bool {
    g.shares_storage_with(view)
        && g.storage_offset_bytes() == view.storage_offset_bytes()
        && g.numel() == view.numel()
}

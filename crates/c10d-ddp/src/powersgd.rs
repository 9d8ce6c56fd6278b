//! PowerSGD gradient compression (`torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook`):
//! each gradient matrix `M` (n × m) of a bucket travels as two thin factors `P` (n × r) and `Q`
//! (m × r) with `M ≈ P Qᵀ`, after `start_powersgd_iter` plain all_reduce iterations.
//!
//! Per bucket: vectors (and matrices not worth compressing) are averaged exactly by one
//! all_reduce; for the matrices, `P = M Q` is all_reduced, orthogonalised, then `Q = Mᵀ P` is
//! all_reduced and the bucket receives `P Qᵀ / world_size`. With error feedback, what the
//! approximation lost is added to the bucket's next gradient; with warm start, `Q` is reused
//! from the previous iteration.
//!
//! Differences from PyTorch: a bucket's error feedback and `Q` are dropped when its parameters
//! change (the rebuild after the first iteration), so `start_powersgd_iter` may be below 2,
//! which PyTorch refuses with error feedback or warm start; float32 buckets only (other dtypes
//! use [`AllReduceHook`]); the random initial `Q` comes from a seeded generator of ours (the
//! same on every rank, but not PyTorch's numbers); the `P` all_reduce overlaps the backward
//! pass, the `Q` all_reduce runs when `finalize_backward` waits for the bucket.

use super::comm_hooks::{AllReduceHook, CommHook};
use super::grad_bucket::{BucketFuture, GradBucket};
use c10d_core::{
    AllreduceOptions, Collectives, DType, DistError, ProcessGroup, Result, Tensor, Work,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// PowerSGD's settings, with `PowerSGDState`'s names and defaults.
#[derive(Debug, Clone)]
pub struct PowerSgdOptions {
    /// Rank `r` of the approximation (`matrix_approximation_rank`, default 1).
    pub matrix_approximation_rank: usize,
    /// Iterations of plain all_reduce before compression starts (`start_powerSGD_iter`, 1000).
    pub start_powersgd_iter: u64,
    /// A matrix is compressed only when `(n + m) r × min_compression_rate < n m` (default 2).
    pub min_compression_rate: f64,
    /// Add the previous approximation error to the next gradient (`use_error_feedback`, true).
    pub use_error_feedback: bool,
    /// Reuse the previous iteration's `Q` (`warm_start`, true).
    pub warm_start: bool,
    /// Added to column norms when orthogonalising (`orthogonalization_epsilon`, 0).
    pub orthogonalization_epsilon: f32,
    /// Seed of the initial `Q` (`random_seed`, 0).
    pub random_seed: u64,
    /// Longest wait for the hook's own all_reduces (`None` = the group's backend timeout).
    pub timeout: Option<Duration>,
}

impl PowerSgdOptions {
    /// Checks the settings [`PowerSgdHook::new`] relies on.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] naming the setting when `matrix_approximation_rank` is 0
    /// (every compressed matrix would be replaced by zeros), `min_compression_rate` is not a
    /// positive finite number, `orthogonalization_epsilon` is negative or not finite (the
    /// orthogonalisation would divide by zero or produce NaN), or `timeout` is `Some(0)`.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(DistError::invalid(format!("PowerSgdOptions: {what}")));
        if self.matrix_approximation_rank == 0 {
            return bad("matrix_approximation_rank must be at least 1, got 0".into());
        }
        let rate = self.min_compression_rate;
        if !(rate.is_finite() && rate > 0.0) {
            return bad(format!(
                "min_compression_rate must be a positive finite number, got {rate}"
            ));
        }
        let eps = self.orthogonalization_epsilon;
        if !(eps.is_finite() && eps >= 0.0) {
            return bad(format!(
                "orthogonalization_epsilon must be finite and at least 0, got {eps}"
            ));
        }
        if self.timeout == Some(Duration::ZERO) {
            return bad("timeout must be longer than zero (None = the backend's timeout)".into());
        }
        Ok(())
    }
}

impl Default for PowerSgdOptions {
    fn default() -> Self {
        PowerSgdOptions {
            matrix_approximation_rank: 1,
            start_powersgd_iter: 1000,
            min_compression_rate: 2.0,
            use_error_feedback: true,
            warm_start: true,
            orthogonalization_epsilon: 0.0,
            random_seed: 0,
            timeout: None,
        }
    }
}

#[derive(Default)]
struct Memory {
    iter: u64,
    error: HashMap<usize, Vec<f32>>,
    q: HashMap<usize, Vec<Vec<f32>>>,
    /// The parameters of each bucket when its error and `Q` were kept.
    layout: HashMap<usize, Vec<usize>>,
}

impl Memory {
    /// Forgets bucket `b`'s error feedback and `Q` when it now holds other parameters (the
    /// buckets are rebuilt after the first iteration): they describe another bucket's memory.
    fn check_layout(&mut self, b: usize, params: &[usize]) {
        if self.layout.get(&b).map(Vec::as_slice) != Some(params) {
            self.error.remove(&b);
            self.q.remove(&b);
            self.layout.insert(b, params.to_vec());
        }
    }
}

/// The PowerSGD comm hook (`powerSGD_hook` with its `PowerSGDState`).
#[derive(Clone)]
pub struct PowerSgdHook {
    opts: PowerSgdOptions,
    memory: Arc<Mutex<Memory>>,
}

impl PowerSgdHook {
    /// A hook with `opts`; its state lives as long as the hook. Like `PowerSGDState`'s
    /// constructor, this is where bad settings are refused (PyTorch checks fewer of them).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when `opts` is invalid (see [`PowerSgdOptions::validate`]).
    pub fn new(opts: PowerSgdOptions) -> Result<PowerSgdHook> {
        opts.validate()?;
        Ok(PowerSgdHook {
            opts,
            memory: Arc::new(Mutex::new(Memory::default())),
        })
    }

    /// Iterations seen so far (`PowerSGDState.iter`).
    pub fn iteration(&self) -> u64 {
        self.lock().iter
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A gradient matrix of the bucket: element offset, rows, columns, approximation rank.
#[derive(Clone, Copy)]
struct Block {
    offset: usize,
    n: usize,
    m: usize,
    r: usize,
}

/// Splits the bucket into compressed matrices and the offsets/lengths of the rest.
fn split(bucket: &GradBucket, o: &PowerSgdOptions) -> (Vec<Block>, Vec<(usize, usize)>) {
    let (mut blocks, mut plain) = (Vec::new(), Vec::new());
    for k in 0..bucket.offsets().len() {
        let (offset, len, shape) = (
            bucket.offsets()[k],
            bucket.lengths()[k],
            &bucket.shapes()[k],
        );
        if shape.len() > 1 && len > 0 {
            let (n, m) = (shape[0], len / shape[0]);
            let r = o.matrix_approximation_rank.min(n).min(m);
            if ((n + m) * r) as f64 * o.min_compression_rate < (n * m) as f64 {
                blocks.push(Block { offset, n, m, r });
                continue;
            }
        }
        plain.push((offset, len));
    }
    (blocks, plain)
}

/// Whether `qs` holds one `m × r` matrix for each of `blocks`.
fn fits(qs: &[Vec<f32>], blocks: &[Block]) -> bool {
    qs.len() == blocks.len() && qs.iter().zip(blocks).all(|(q, k)| q.len() == k.m * k.r)
}

fn all_reduce(pg: &ProcessGroup, data: Vec<f32>) -> Result<(Tensor, Work)> {
    let t = Tensor::from_vec(data);
    let w = pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())?;
    Ok((t, w))
}

impl CommHook for PowerSgdHook {
    fn run_hook(&self, pg: &ProcessGroup, bucket: &GradBucket) -> Result<BucketFuture> {
        let mut mem = self.lock();
        if mem.iter < self.opts.start_powersgd_iter || bucket.buffer().dtype() != DType::F32 {
            if bucket.is_last() {
                mem.iter += 1;
            }
            return AllReduceHook.run_hook(pg, bucket);
        }
        let b = bucket.index();
        mem.check_layout(b, bucket.parameter_indices());
        let world = pg.size() as f32;
        let mut input: Vec<f32> = bucket.buffer().to_vec()?;
        if self.opts.use_error_feedback {
            if let Some(e) = mem.error.get(&b).filter(|e| e.len() == input.len()) {
                input.iter_mut().zip(e).for_each(|(x, e)| *x += e);
            }
        }
        let (blocks, plain) = split(bucket, &self.opts);
        let flat: Vec<f32> = plain
            .iter()
            .flat_map(|&(o, l)| input[o..o + l].iter().map(|x| x / world))
            .collect();
        let (plain_t, plain_w) = all_reduce(pg, flat)?;
        // A stored Q is reused only when it fits this bucket's matrices: the buckets are
        // rebuilt after the first iteration, so bucket `b` may hold other matrices by now.
        let qs = match mem
            .q
            .get(&b)
            .filter(|q| self.opts.warm_start && fits(q, &blocks))
        {
            Some(q) => q.clone(),
            None => initial_qs(&blocks, self.opts.random_seed ^ ((b as u64) << 32)),
        };
        let ps: Vec<f32> = blocks
            .iter()
            .zip(&qs)
            .flat_map(|(k, q)| mat_q(&input, k, q))
            .collect();
        let (p_t, p_w) = all_reduce(pg, ps)?;
        drop(mem);
        let timeout = match self.opts.timeout {
            Some(t) => t,
            None => pg.default_backend()?.timeout(),
        };
        let step = Compress {
            hook: self.clone(),
            pg: pg.clone(),
            buffer: bucket.buffer().clone(),
            index: b,
            is_last: bucket.is_last(),
            input,
            blocks,
            plain,
            plain_reduced: (plain_t, plain_w),
            timeout,
        };
        Ok(BucketFuture::from_work(p_w, p_t).then(move |p| step.finish(p)))
    }

    fn name(&self) -> String {
        "powerSGD_hook".into()
    }
    fn supports_device_buckets(&self) -> bool {
        false
    }
}

/// The second half of PowerSGD for one bucket, run once the `P` all_reduce completed.
struct Compress {
    hook: PowerSgdHook,
    pg: ProcessGroup,
    buffer: Tensor,
    index: usize,
    is_last: bool,
    input: Vec<f32>,
    blocks: Vec<Block>,
    plain: Vec<(usize, usize)>,
    plain_reduced: (Tensor, Work),
    timeout: Duration,
}

impl Compress {
    fn finish(self, p: Tensor) -> Result<Tensor> {
        let eps = self.hook.opts.orthogonalization_epsilon;
        let p_all: Vec<f32> = p.to_vec()?;
        let mut ps = Vec::with_capacity(self.blocks.len());
        let mut at = 0;
        for k in &self.blocks {
            let mut pk = p_all[at..at + k.n * k.r].to_vec();
            at += k.n * k.r;
            orthogonalize(&mut pk, k.n, k.r, eps);
            ps.push(pk);
        }
        let qs: Vec<f32> = self
            .blocks
            .iter()
            .zip(&ps)
            .flat_map(|(k, p)| mat_t_p(&self.input, k, p))
            .collect();
        let (q_t, q_w) = all_reduce(&self.pg, qs)?;
        q_w.wait_timeout(self.timeout)?;
        self.plain_reduced.1.wait_timeout(self.timeout)?;
        let world = self.pg.size() as f32;
        let q_all: Vec<f32> = q_t.to_vec::<f32>()?.iter().map(|q| q / world).collect();
        let mut out = vec![0f32; self.input.len()];
        let mut q_mem = Vec::with_capacity(self.blocks.len());
        let mut at = 0;
        for (k, p) in self.blocks.iter().zip(&ps) {
            let q = &q_all[at..at + k.m * k.r];
            at += k.m * k.r;
            write_product(&mut out, k, p, q);
            q_mem.push(q.to_vec());
        }
        let plain: Vec<f32> = self.plain_reduced.0.to_vec()?;
        let mut at = 0;
        for &(o, l) in &self.plain {
            out[o..o + l].copy_from_slice(&plain[at..at + l]);
            at += l;
        }
        self.remember(&out, q_mem);
        self.buffer.write(|b: &mut [f32]| b.copy_from_slice(&out))?;
        Ok(self.buffer)
    }

    /// Stores the error feedback and the warm-start `Q`, and counts the iteration.
    fn remember(&self, out: &[f32], q: Vec<Vec<f32>>) {
        let mut mem = self.hook.lock();
        if self.hook.opts.use_error_feedback {
            // What this rank's input lost against the bucket's new (averaged) content, over the
            // whole bucket, as PyTorch computes it (`input_tensor_cp - input_tensor`).
            let e = self.input.iter().zip(out).map(|(x, o)| x - o).collect();
            mem.error.insert(self.index, e);
        }
        if self.hook.opts.warm_start {
            mem.q.insert(self.index, q);
        }
        if self.is_last {
            mem.iter += 1;
        }
    }
}

/// Seeded standard-normal initial `Q` (m × r) per block, orthogonalised.
fn initial_qs(blocks: &[Block], seed: u64) -> Vec<Vec<f32>> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    blocks
        .iter()
        .map(|k| {
            let mut q: Vec<f32> = (0..k.m * k.r)
                .map(|_| {
                    let (u1, u2) = (next().max(f64::MIN_POSITIVE), next());
                    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
                })
                .collect();
            orthogonalize(&mut q, k.m, k.r, 0.0);
            q
        })
        .collect()
}

/// `M Q` (n × r) for the block's matrix `M` (n × m, row-major in `input`) and `Q` (m × r).
fn mat_q(input: &[f32], k: &Block, q: &[f32]) -> Vec<f32> {
    let mut p = vec![0f32; k.n * k.r];
    for a in 0..k.n {
        let row = &input[k.offset + a * k.m..k.offset + (a + 1) * k.m];
        for (b, x) in row.iter().enumerate() {
            for c in 0..k.r {
                p[a * k.r + c] += x * q[b * k.r + c];
            }
        }
    }
    p
}

/// `Mᵀ P` (m × r).
fn mat_t_p(input: &[f32], k: &Block, p: &[f32]) -> Vec<f32> {
    let mut q = vec![0f32; k.m * k.r];
    for a in 0..k.n {
        let row = &input[k.offset + a * k.m..k.offset + (a + 1) * k.m];
        for (b, x) in row.iter().enumerate() {
            for c in 0..k.r {
                q[b * k.r + c] += x * p[a * k.r + c];
            }
        }
    }
    q
}

/// `out[block] = P Qᵀ`.
fn write_product(out: &mut [f32], k: &Block, p: &[f32], q: &[f32]) {
    for a in 0..k.n {
        for b in 0..k.m {
            out[k.offset + a * k.m + b] = (0..k.r).map(|c| p[a * k.r + c] * q[b * k.r + c]).sum();
        }
    }
}

/// Gram–Schmidt on the `cols` columns of the row-major `rows × cols` matrix `a`
/// (`_orthogonalize_gram_schmidt`).
fn orthogonalize(a: &mut [f32], rows: usize, cols: usize, eps: f32) {
    for i in 0..cols {
        let norm = (0..rows)
            .map(|j| a[j * cols + i].powi(2))
            .sum::<f32>()
            .sqrt();
        let d = norm + eps;
        if d > 0.0 {
            (0..rows).for_each(|j| a[j * cols + i] /= d);
        }
        for k in i + 1..cols {
            let dot: f32 = (0..rows).map(|j| a[j * cols + i] * a[j * cols + k]).sum();
            (0..rows).for_each(|j| a[j * cols + k] -= dot * a[j * cols + i]);
        }
    }
}

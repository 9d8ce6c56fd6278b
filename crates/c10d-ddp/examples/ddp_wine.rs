//! Data-parallel training (what PyTorch's DistributedDataParallel does) on real data: the red
//! wine-quality data set (1599 wines × 11 physico-chemical features → quality score), shipped
//! inside the `linfa-datasets` crate, with gradients reduced by c10d-world's DDP [`Reducer`].
//!
//! ```text
//! c10drun --nproc-per-node 4 target/release/examples/ddp_wine [--epochs 20] [--hidden 128] ...
//! ```
//!
//! Every rank holds the same model — an MLP `11 → h → … → h → 1` (tanh), written out by hand,
//! its parameters checked across ranks (`verify_params_across_processes`) and copied from rank 0
//! (`broadcast_coalesced`) as DDP does at construction. Each step, the global batch
//! (`--batch-size` samples of one seeded permutation per epoch) is cut into one slice per rank.
//! A rank runs the forward pass on its slice, then the backward pass layer by layer from the
//! last: each layer's weight and bias gradients are computed straight into the Reducer's bucket
//! views and marked ready, so a bucket's asynchronous all_reduce runs while the earlier layers'
//! gradients are still being computed. `finalize_backward` waits and leaves the mean gradient of
//! the global batch in place, whatever the number of ranks; all ranks then apply the same
//! SGD-with-momentum step.
//!
//! At the end the program proves the point:
//! 1. `all_gather_into_tensor` of the parameters: they must be bit-identical on every rank;
//! 2. rank 0 repeats the training in one process on the full data with the same batch order and
//!    checks that the parameters and the loss curve match within `--tolerance` (default 1e-4,
//!    max absolute difference; float32 sums in another order give differences around 1e-6).
//!
//! It also prints the Reducer's counters on a line starting with `ddp:` (buckets, bytes, and the
//! share of communication time hidden behind the backward pass).
//!
//! The loss printed per epoch is the mean squared error on the standardised quality score
//! (train: mean over the epoch's samples, under the weights of the moment; val: the held-out
//! 20 %, after the epoch). With 1, 2 or 4 ranks the curves agree to about 1e-6.
//!
//! Without `RANK`/`WORLD_SIZE` in the environment it runs as a world of one, so
//! `cargo run --example ddp_wine` works too. Exit status 1 when a check fails.

use c10d_core::{Result, Tensor};
use c10d_ddp::{self as ddp, Reducer, ReducerOptions};
use c10d_store::HashStore;
use c10d_world as dist;
use clap::Parser;
use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
#[command(about = "Data-parallel training of an MLP on the wine-quality data with c10d-rs")]
struct Args {
    /// Passes over the training data.
    #[arg(long, default_value_t = 20)]
    epochs: usize,
    /// Global batch size (split over the ranks). Large enough that each rank's backward pass
    /// takes about as long as reducing a bucket, so that the two can overlap.
    #[arg(long = "batch-size", default_value_t = 256)]
    batch_size: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.05)]
    lr: f32,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9)]
    momentum: f32,
    /// Units per hidden layer.
    #[arg(long, default_value_t = 128)]
    hidden: usize,
    /// Hidden layers.
    #[arg(long, default_value_t = 3)]
    layers: usize,
    /// Gradient bucket size cap in MiB (DDP's bucket_cap_mb; small, as the model is small).
    #[arg(long = "bucket-cap-mb", default_value_t = 0.05)]
    bucket_cap_mb: f64,
    /// Seed of the initial weights, the train/val split and the batch order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Largest allowed |parameter difference| against the single-process run.
    #[arg(long, default_value_t = 1e-4)]
    tolerance: f32,
    /// Skip the single-process reference run.
    #[arg(long = "no-reference")]
    no_reference: bool,
    /// Collective timeout in seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

/// SplitMix64: a tiny seeded generator, so every rank draws the same numbers.
struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn symmetric(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// Standardised samples: `x` is row-major `n × d`.
struct Data {
    x: Vec<f32>,
    y: Vec<f32>,
    d: usize,
}
impl Data {
    fn len(&self) -> usize {
        self.y.len()
    }
    fn row(&self, i: usize) -> &[f32] {
        &self.x[i * self.d..(i + 1) * self.d]
    }
}

/// Loads the data, splits 80/20 with a seeded shuffle and standardises with the training
/// statistics. Returns (train, val, quality std) .
fn load(seed: u64) -> (Data, Data, f64) {
    let ds = linfa_datasets::winequality();
    let (n, d) = (ds.records.nrows(), ds.records.ncols());
    let mut idx: Vec<usize> = (0..n).collect();
    Rng(seed ^ 0x5EED).shuffle(&mut idx);
    let n_train = n * 4 / 5;
    let (tr, va) = idx.split_at(n_train);
    let mean_std = |vals: &mut dyn Iterator<Item = f64>| {
        let v: Vec<f64> = vals.collect();
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let s = (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64).sqrt();
        (m, if s > 0.0 { s } else { 1.0 })
    };
    let fstats: Vec<(f64, f64)> = (0..d)
        .map(|j| mean_std(&mut tr.iter().map(|&i| ds.records[[i, j]])))
        .collect();
    let tstats = mean_std(&mut tr.iter().map(|&i| ds.targets[i] as f64));
    let make = |rows: &[usize]| Data {
        x: rows
            .iter()
            .flat_map(|&i| (0..d).map(move |j| (i, j)))
            .map(|(i, j)| ((ds.records[[i, j]] - fstats[j].0) / fstats[j].1) as f32)
            .collect(),
        y: rows
            .iter()
            .map(|&i| ((ds.targets[i] as f64 - tstats.0) / tstats.1) as f32)
            .collect(),
        d,
    };
    (make(tr), make(va), tstats.1)
}

/// The MLP `dims[0] → dims[1] (tanh) → … → dims[L]` (the last layer linear). Layer `l` has the
/// parameters `2l` (weight, `dims[l+1] × dims[l]`) and `2l + 1` (bias, `dims[l+1]`), registered
/// in that order as `nn.Sequential` of `nn.Linear` would.
struct Mlp {
    dims: Vec<usize>,
}

impl Mlp {
    fn num_layers(&self) -> usize {
        self.dims.len() - 1
    }
    fn shapes(&self) -> Vec<Vec<usize>> {
        (0..self.num_layers())
            .flat_map(|l| [vec![self.dims[l + 1], self.dims[l]], vec![self.dims[l + 1]]])
            .collect()
    }
    fn num_params(&self) -> usize {
        self.shapes()
            .iter()
            .map(|s| s.iter().product::<usize>())
            .sum()
    }
    /// PyTorch's `nn.Linear` init: uniform in ±1/sqrt(fan_in).
    fn init(&self, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = Rng(seed);
        self.shapes()
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let bound = 1.0 / (self.dims[i / 2] as f32).sqrt();
                let n: usize = s.iter().product();
                (0..n).map(|_| rng.symmetric() * bound).collect()
            })
            .collect()
    }
    /// Activations of every layer for the `n` rows of `x` (`acts[0]` is `x`).
    fn forward(&self, p: &[Vec<f32>], x: Vec<f32>, n: usize) -> Vec<Vec<f32>> {
        let mut acts = vec![x];
        for l in 0..self.num_layers() {
            let (fan_in, out) = (self.dims[l], self.dims[l + 1]);
            let (w, b, a) = (&p[2 * l], &p[2 * l + 1], &acts[l]);
            let last = l + 1 == self.num_layers();
            let mut z = vec![0f32; n * out];
            for i in 0..n {
                let row = &a[i * fan_in..(i + 1) * fan_in];
                for o in 0..out {
                    let w_o = &w[o * fan_in..(o + 1) * fan_in];
                    let v = b[o] + w_o.iter().zip(row).map(|(w, x)| w * x).sum::<f32>();
                    z[i * out + o] = if last { v } else { v.tanh() };
                }
            }
            acts.push(z);
        }
        acts
    }
    /// Backward pass from the last layer: every parameter's gradient of `Σ (f(x_i) − y_i)²`,
    /// times `scale`, is handed to `sync` as soon as it is computed.
    fn backward(
        &self,
        p: &[Vec<f32>],
        acts: &[Vec<f32>],
        mut dz: Vec<f32>,
        scale: f32,
        sync: &dyn GradSync,
    ) -> Result<()> {
        let n = acts[0].len() / self.dims[0];
        for l in (0..self.num_layers()).rev() {
            let (fan_in, out, a) = (self.dims[l], self.dims[l + 1], &acts[l]);
            sync.compute(2 * l + 1, &mut |gb| {
                for (i, d) in dz.iter().enumerate() {
                    gb[i % out] += d;
                }
                gb.iter_mut().for_each(|g| *g *= scale);
            })?;
            sync.compute(2 * l, &mut |gw| {
                for i in 0..n {
                    let row = &a[i * fan_in..(i + 1) * fan_in];
                    for o in 0..out {
                        let d = dz[i * out + o];
                        let g_o = &mut gw[o * fan_in..(o + 1) * fan_in];
                        g_o.iter_mut().zip(row).for_each(|(g, x)| *g += d * x);
                    }
                }
                gw.iter_mut().for_each(|g| *g *= scale);
            })?;
            if l > 0 {
                dz = self.propagate(&p[2 * l], &dz, a, fan_in, out);
            }
        }
        Ok(())
    }
    /// `dZ_{l-1} = (dZ_l · W_l) ⊙ (1 − a²)` for the tanh layer below.
    fn propagate(&self, w: &[f32], dz: &[f32], a: &[f32], fan_in: usize, out: usize) -> Vec<f32> {
        let n = a.len() / fan_in;
        let mut da = vec![0f32; n * fan_in];
        for i in 0..n {
            let da_i = &mut da[i * fan_in..(i + 1) * fan_in];
            for o in 0..out {
                let d = dz[i * out + o];
                let w_o = &w[o * fan_in..(o + 1) * fan_in];
                da_i.iter_mut().zip(w_o).for_each(|(g, w)| *g += d * w);
            }
        }
        da.iter_mut().zip(a).for_each(|(g, a)| *g *= 1.0 - a * a);
        da
    }
    /// Σ (f(x_i) − y_i)² over `rows` of `data`.
    fn sse(&self, p: &[Vec<f32>], data: &Data, rows: &[usize]) -> f64 {
        let out = self.forward(p, gather(data, rows), rows.len());
        let pred = out.last().expect("at least one layer");
        rows.iter()
            .zip(pred)
            .map(|(&i, f)| ((f - data.y[i]) as f64).powi(2))
            .sum()
    }
}

/// The rows `rows` of `data` as one row-major `rows.len() × d` matrix.
fn gather(data: &Data, rows: &[usize]) -> Vec<f32> {
    rows.iter()
        .flat_map(|&i| data.row(i).iter().copied())
        .collect()
}

/// Where gradients go: the DDP Reducer, or a plain buffer (one process).
trait GradSync {
    /// Runs `f` on parameter `i`'s zeroed gradient buffer, then marks the gradient ready.
    fn compute(&self, i: usize, f: &mut dyn FnMut(&mut [f32])) -> Result<()>;
    /// Ends the backward pass; afterwards `read(i)` gives the mean gradient of the global batch.
    fn finish(&self) -> Result<()>;
    /// Runs `f` on parameter `i`'s gradient.
    fn read(&self, i: usize, f: &mut dyn FnMut(&[f32])) -> Result<()>;
    /// Sums `v` elementwise over the ranks.
    fn sum(&self, v: &mut [f64]) -> Result<()>;
    /// The world size the gradients are averaged over.
    fn world(&self) -> usize;
}

/// The data-parallel way: gradients are written into the Reducer's bucket views.
struct Ddp {
    reducer: Reducer,
}

impl GradSync for Ddp {
    fn compute(&self, i: usize, f: &mut dyn FnMut(&mut [f32])) -> Result<()> {
        self.reducer.grad(i)?.write(|g: &mut [f32]| {
            g.fill(0.0);
            f(g)
        })?;
        self.reducer.mark_variable_ready(i)
    }
    fn finish(&self) -> Result<()> {
        self.reducer.finalize_backward()
    }
    fn read(&self, i: usize, f: &mut dyn FnMut(&[f32])) -> Result<()> {
        self.reducer.grad(i)?.read(|g: &[f32]| f(g))
    }
    fn sum(&self, v: &mut [f64]) -> Result<()> {
        let t = Tensor::from_vec(v.to_vec());
        dist::all_reduce(&t).run()?;
        t.read(|s: &[f64]| v.copy_from_slice(s))
    }
    fn world(&self) -> usize {
        self.reducer.process_group().size()
    }
}

/// One process: gradients stay in local buffers.
struct Local {
    grads: RefCell<Vec<Vec<f32>>>,
}

impl GradSync for Local {
    fn compute(&self, i: usize, f: &mut dyn FnMut(&mut [f32])) -> Result<()> {
        let mut g = self.grads.borrow_mut();
        g[i].fill(0.0);
        f(&mut g[i]);
        Ok(())
    }
    fn finish(&self) -> Result<()> {
        Ok(())
    }
    fn read(&self, i: usize, f: &mut dyn FnMut(&[f32])) -> Result<()> {
        f(&self.grads.borrow()[i]);
        Ok(())
    }
    fn sum(&self, _v: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn world(&self) -> usize {
        1
    }
}

/// Loss curve and final parameters of one training run.
struct History {
    train: Vec<f32>,
    val: Vec<f32>,
    params: Vec<f32>,
    samples_seen: usize,
}

/// One SGD step of this rank on its slice of `batch`; returns the slice's loss sum.
fn step(
    model: &Mlp,
    (params, velocity): (&mut [Vec<f32>], &mut [Vec<f32>]),
    data: &Data,
    (batch, rank): (&[usize], usize),
    args: &Args,
    sync: &dyn GradSync,
) -> Result<f64> {
    let world = sync.world();
    let (lo, hi) = (batch.len() * rank / world, batch.len() * (rank + 1) / world);
    let rows = &batch[lo..hi];
    let acts = model.forward(params, gather(data, rows), rows.len());
    let pred = acts.last().expect("at least one layer");
    let err: Vec<f32> = rows.iter().zip(pred).map(|(&i, f)| f - data.y[i]).collect();
    let loss: f64 = err.iter().map(|e| (*e as f64) * (*e as f64)).sum();
    let dout: Vec<f32> = err.iter().map(|e| 2.0 * e).collect();
    // The Reducer averages over ranks: scale so that the average is the global batch's mean.
    let scale = world as f32 / batch.len() as f32;
    model.backward(params, &acts, dout, scale, sync)?;
    sync.finish()?;
    for (i, (p, v)) in params.iter_mut().zip(velocity.iter_mut()).enumerate() {
        sync.read(i, &mut |g| {
            for ((p, v), g) in p.iter_mut().zip(v.iter_mut()).zip(g) {
                *v = args.momentum * *v + g;
                *p -= args.lr * *v;
            }
        })?;
    }
    Ok(loss)
}

/// Trains as `rank` of `sync.world()` (world 1 = the single-process reference).
fn train(
    args: &Args,
    model: &Mlp,
    (train_set, val_set): (&Data, &Data),
    (mut params, rank): (Vec<Vec<f32>>, usize),
    sync: &dyn GradSync,
    verbose: bool,
) -> Result<History> {
    let world = sync.world();
    let mut velocity: Vec<Vec<f32>> = params.iter().map(|p| vec![0f32; p.len()]).collect();
    let mut order: Vec<usize> = (0..train_set.len()).collect();
    let mut rng = Rng(args.seed.wrapping_add(1));
    let (mut train_curve, mut val_curve, mut samples_seen) = (Vec::new(), Vec::new(), 0);
    for epoch in 1..=args.epochs {
        rng.shuffle(&mut order);
        let mut loss_sum = 0f64;
        for batch in order.chunks(args.batch_size) {
            let pv = (&mut params[..], &mut velocity[..]);
            loss_sum += step(model, pv, train_set, (batch, rank), args, sync)?;
            samples_seen += batch.len() * (rank + 1) / world - batch.len() * rank / world;
        }
        // Validation: each rank scores every world-th sample; one all_reduce for both sums.
        let val_rows: Vec<usize> = (rank..val_set.len()).step_by(world).collect();
        let mut sums = [loss_sum, model.sse(&params, val_set, &val_rows)];
        sync.sum(&mut sums)?;
        let (tl, vl) = (
            (sums[0] / train_set.len() as f64) as f32,
            (sums[1] / val_set.len() as f64) as f32,
        );
        train_curve.push(tl);
        val_curve.push(vl);
        if verbose {
            println!("epoch {epoch:>3}  train_loss {tl:.6}  val_loss {vl:.6}");
        }
    }
    Ok(History {
        train: train_curve,
        val: val_curve,
        params: params.concat(),
        samples_seen,
    })
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("ddp_wine: error: {e}");
            std::process::exit(1);
        }
    }
}

/// Joins the job: env:// rendezvous under c10drun/torchrun, alone a world of one.
fn init(timeout: Duration) -> Result<()> {
    let launched = std::env::var_os("RANK").is_some();
    let mut init = dist::InitOptions {
        backend: Some("gloo".into()),
        timeout: Some(timeout),
        ..Default::default()
    };
    if !launched {
        init.store = Some(Arc::new(HashStore::new()));
        init.rank = Some(0);
        init.world_size = Some(1);
    }
    dist::init_process_group(init)
}

/// DDP's construction: same parameters everywhere, rank 0's values, and the Reducer.
fn make_ddp(args: &Args, model: &Mlp, params: &mut [Vec<f32>]) -> Result<Ddp> {
    let pg = dist::World::global().world_group()?;
    let timeout = Some(Duration::from_secs(args.timeout));
    let shapes = model.shapes();
    let tensors: Vec<Tensor> = params
        .iter()
        .zip(&shapes)
        .map(|(p, s)| Tensor::from_vec_shaped(p.clone(), s))
        .collect::<Result<_>>()?;
    ddp::verify_params_across_processes(&pg, &tensors, &[], timeout)?;
    ddp::broadcast_coalesced(
        &pg,
        &tensors,
        ddp::DEFAULT_BROADCAST_BUCKET_SIZE,
        0,
        timeout,
    )?;
    for (p, t) in params.iter_mut().zip(&tensors) {
        t.read(|s: &[f32]| p.copy_from_slice(s))?;
    }
    let opts = ReducerOptions {
        bucket_cap_mb: Some(args.bucket_cap_mb),
        gradient_as_bucket_view: true,
        timeout,
        ..Default::default()
    };
    Ok(Ddp {
        reducer: Reducer::new(&tensors, pg, opts)?,
    })
}

/// Prints the data set and the training set-up (rank 0).
fn announce(args: &Args, model: &Mlp, (train_set, val_set): (&Data, &Data), world: usize) {
    println!(
        "ddp_wine: red wine quality, {} samples x {} features (train {}, val {}), standardised",
        train_set.len() + val_set.len(),
        train_set.d,
        train_set.len(),
        val_set.len()
    );
    let dims: Vec<String> = model.dims.iter().map(|d| d.to_string()).collect();
    println!(
        "ddp_wine: {world} rank(s), MLP {} ({} parameters), global batch {} (~{} per rank), bucket_cap_mb {}, SGD lr {} momentum {}",
        dims.join("-"),
        model.num_params(),
        args.batch_size,
        args.batch_size.div_ceil(world),
        args.bucket_cap_mb,
        args.lr,
        args.momentum
    );
}

/// The ranks whose trained parameters differ (bitwise) from this rank's `params`; then leaves
/// the process group (a barrier first, so no rank leaves while another still gathers).
fn ranks_with_other_params(params: &[f32], world: usize) -> Result<Vec<usize>> {
    let np = params.len();
    let mine = Tensor::from_vec(params.to_vec());
    let all = Tensor::zeros(c10d_core::DType::F32, &[world * np]);
    dist::all_gather_into_tensor(&all, &mine).run()?;
    let all: Vec<f32> = all.to_vec()?;
    let differing: Vec<usize> = (0..world)
        .filter(|r| {
            all[r * np..(r + 1) * np]
                .iter()
                .zip(params)
                .any(|(a, b)| a.to_bits() != b.to_bits())
        })
        .collect();
    dist::barrier().run()?;
    dist::destroy_process_group(None)?;
    Ok(differing)
}

/// Check 2 (rank 0): the same training in one process on the full data reaches the same
/// parameters and losses within `args.tolerance`.
fn matches_single_process(
    args: &Args,
    model: &Mlp,
    sets: (&Data, &Data),
    hist: &History,
) -> Result<bool> {
    let local = Local {
        grads: RefCell::new(
            model
                .init(args.seed)
                .iter()
                .map(|p| vec![0f32; p.len()])
                .collect(),
        ),
    };
    let reference = train(args, model, sets, (model.init(args.seed), 0), &local, false)?;
    let dp = max_abs_diff(&hist.params, &reference.params);
    let dl =
        max_abs_diff(&hist.train, &reference.train).max(max_abs_diff(&hist.val, &reference.val));
    let good = dp <= args.tolerance && dl <= args.tolerance;
    println!(
        "check: single-process run on the full data: max |param diff| {dp:.3e}, max |loss diff| {dl:.3e} (tolerance {:.0e}) {}",
        args.tolerance,
        if good { "OK" } else { "FAILED" }
    );
    Ok(good)
}

fn run(args: &Args) -> Result<bool> {
    init(Duration::from_secs(args.timeout))?;
    let rank = dist::get_rank(None)? as usize;
    let world = dist::get_world_size(None)? as usize;
    let lead = rank == 0;

    let (train_set, val_set, quality_std) = load(args.seed);
    let mut dims = vec![train_set.d];
    dims.extend(std::iter::repeat_n(args.hidden, args.layers));
    dims.push(1);
    let model = Mlp { dims };
    let np = model.num_params();
    let mut params = model.init(args.seed);
    let sync = make_ddp(args, &model, &mut params)?;
    if lead {
        announce(args, &model, (&train_set, &val_set), world);
    }
    let t0 = Instant::now();
    let sets = (&train_set, &val_set);
    let hist = train(args, &model, sets, (params, rank), &sync, lead)?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "rank {rank} trained on {} samples ({:.1} per epoch) in {secs:.2} s",
        hist.samples_seen,
        hist.samples_seen as f64 / args.epochs as f64
    );
    let stats = sync.reducer.stats();
    if lead {
        println!("ddp: {stats}; bucket bytes {:?}", stats.bucket_sizes);
    }

    // Check 1: parameters identical on every rank.
    let differing = ranks_with_other_params(&hist.params, world)?;
    let mut ok = differing.is_empty();
    if lead {
        let (tl, vl) = (
            hist.train.last().copied().unwrap_or(f32::NAN),
            hist.val.last().copied().unwrap_or(f32::NAN),
        );
        println!(
            "final train_loss {tl:.6}  val_loss {vl:.6}  (val RMSE {:.3} quality points)",
            (vl as f64).sqrt() * quality_std
        );
        if ok {
            println!(
                "check: parameters identical on all {world} ranks ({np} values each, bitwise)"
            );
        } else {
            println!("check FAILED: parameters of ranks {differing:?} differ from rank 0's");
        }
    } else if !ok {
        eprintln!("rank {rank}: parameters differ from those of ranks {differing:?}");
    }

    // Check 2: the same training in one process on the full data.
    if lead && !args.no_reference {
        ok &= matches_single_process(args, &model, sets, &hist)?;
    }
    Ok(ok)
}

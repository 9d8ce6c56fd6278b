//! Data-parallel training (what PyTorch's DistributedDataParallel does) on real data: the red
//! wine-quality data set (1599 wines × 11 physico-chemical features → quality score), shipped
//! inside the `linfa-datasets` crate.
//!
//! ```text
//! c10drun --nproc-per-node 4 target/release/examples/ddp_wine [--epochs 20] [--batch-size 64] ...
//! ```
//!
//! Every rank holds the same model — a small MLP `11 → 32 (tanh) → 1`, written out by hand —
//! and the same data split. Each step, the global batch (`--batch-size` samples of one seeded
//! permutation per epoch) is cut into one slice per rank; a rank computes the *sum* of per-sample
//! gradients over its slice, the gradients are flattened into buckets (`--bucket-cap` values, the
//! last layer's first, as DDP orders them) and every bucket is summed over the ranks with an
//! asynchronous `all_reduce`; dividing by the global batch size gives exactly the full-batch mean
//! gradient, whatever the number of ranks. All ranks then apply the same SGD-with-momentum step.
//!
//! At the end the program proves the point:
//! 1. `all_gather_into_tensor` of the parameters: they must be bit-identical on every rank;
//! 2. rank 0 repeats the training in one process on the full data with the same batch order and
//!    checks that the parameters and the loss curve match within `--tolerance` (default 1e-4,
//!    max absolute difference; float32 sums in another order give differences around 1e-6).
//!
//! The loss printed per epoch is the mean squared error on the standardised quality score
//! (train: mean over the epoch's samples, under the weights of the moment; val: the held-out
//! 20 %, after the epoch). With 1, 2 or 4 ranks the curves
//! agree to about 1e-6.
//!
//! Without `RANK`/`WORLD_SIZE` in the environment it runs as a world of one, so
//! `cargo run --example ddp_wine` works too. Exit status 1 when a check fails.

use c10d_core::{Result, Tensor, Work};
use c10d_store::HashStore;
use c10d_world as dist;
use clap::Parser;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
#[command(about = "Data-parallel training of an MLP on the wine-quality data with c10d-rs")]
struct Args {
    /// Passes over the training data.
    #[arg(long, default_value_t = 20)]
    epochs: usize,
    /// Global batch size (split over the ranks).
    #[arg(long = "batch-size", default_value_t = 64)]
    batch_size: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.01)]
    lr: f32,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9)]
    momentum: f32,
    /// Hidden units.
    #[arg(long, default_value_t = 32)]
    hidden: usize,
    /// Gradient bucket size in values (DDP's bucket_cap_mb, in elements).
    #[arg(long = "bucket-cap", default_value_t = 128)]
    bucket_cap: usize,
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

/// The MLP `d → h (tanh) → 1` as one flat parameter vector: `[W1 (h×d), b1 (h), w2 (h), b2]`.
struct Mlp {
    d: usize,
    h: usize,
}
impl Mlp {
    fn num_params(&self) -> usize {
        self.h * self.d + 2 * self.h + 1
    }
    /// PyTorch's `nn.Linear` init: uniform in ±1/sqrt(fan_in).
    fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = Rng(seed);
        let (b1, b2) = (1.0 / (self.d as f32).sqrt(), 1.0 / (self.h as f32).sqrt());
        let mut p = Vec::with_capacity(self.num_params());
        p.extend((0..self.h * self.d + self.h).map(|_| rng.symmetric() * b1));
        p.extend((0..self.h + 1).map(|_| rng.symmetric() * b2));
        p
    }
    fn predict(&self, p: &[f32], x: &[f32], act: &mut [f32]) -> f32 {
        let (d, h) = (self.d, self.h);
        let (w1, rest) = p.split_at(h * d);
        let (b1, rest) = rest.split_at(h);
        let (w2, b2) = rest.split_at(h);
        let mut out = b2[0];
        for j in 0..h {
            let z = b1[j]
                + w1[j * d..(j + 1) * d]
                    .iter()
                    .zip(x)
                    .map(|(w, x)| w * x)
                    .sum::<f32>();
            act[j] = z.tanh();
            out += w2[j] * act[j];
        }
        out
    }
    /// Adds the gradient of Σ (f(x_i) − y_i)² over `rows` to `grad` and returns that sum.
    fn accumulate(&self, p: &[f32], data: &Data, rows: &[usize], grad: &mut [f32]) -> f32 {
        let (d, h) = (self.d, self.h);
        let mut act = vec![0f32; h];
        let mut loss = 0f32;
        for &i in rows {
            let x = data.row(i);
            let e = self.predict(p, x, &mut act) - data.y[i];
            loss += e * e;
            let dy = 2.0 * e;
            let w2 = &p[h * d + h..h * d + 2 * h];
            let (gw1, rest) = grad.split_at_mut(h * d);
            let (gb1, rest) = rest.split_at_mut(h);
            let (gw2, gb2) = rest.split_at_mut(h);
            gb2[0] += dy;
            for j in 0..h {
                gw2[j] += dy * act[j];
                let dz = dy * w2[j] * (1.0 - act[j] * act[j]);
                gb1[j] += dz;
                for (g, xk) in gw1[j * d..(j + 1) * d].iter_mut().zip(x) {
                    *g += dz * xk;
                }
            }
        }
        loss
    }
    fn sse(&self, p: &[f32], data: &Data, rows: impl Iterator<Item = usize>) -> f32 {
        let mut act = vec![0f32; self.h];
        rows.map(|i| {
            let e = self.predict(p, data.row(i), &mut act) - data.y[i];
            e * e
        })
        .sum()
    }
}

/// How the ranks combine their partial sums: by all_reduce, or not at all (one process).
trait GradSync {
    /// Sums every buffer elementwise over the ranks, in place.
    fn sum(&self, bufs: &mut [&mut [f32]]) -> Result<()>;
}

/// The data-parallel way: one asynchronous all_reduce per bucket, then wait for all of them
/// (the communication of bucket k overlaps the launch of bucket k+1, as in DDP).
struct AllReduce {
    timeout: Duration,
}
impl GradSync for AllReduce {
    fn sum(&self, bufs: &mut [&mut [f32]]) -> Result<()> {
        let mut inflight: Vec<(Tensor, Work)> = Vec::with_capacity(bufs.len());
        for b in bufs.iter() {
            let t = Tensor::from_vec(b.to_vec());
            let w = dist::all_reduce(&t).start()?;
            inflight.push((t, w));
        }
        for (b, (t, w)) in bufs.iter_mut().zip(inflight) {
            w.wait_timeout(self.timeout)?;
            t.read(|s: &[f32]| b.copy_from_slice(s))?;
        }
        Ok(())
    }
}

/// One process: nothing to combine.
struct Local;
impl GradSync for Local {
    fn sum(&self, _bufs: &mut [&mut [f32]]) -> Result<()> {
        Ok(())
    }
}

/// Loss curve and final parameters of one training run.
struct History {
    train: Vec<f32>,
    val: Vec<f32>,
    params: Vec<f32>,
    samples_seen: usize,
}

/// Which part of every global batch this process computes.
#[derive(Clone, Copy)]
struct Shard {
    rank: usize,
    world: usize,
}

/// Trains as `shard.rank` of `shard.world` (world 1 = the single-process reference).
fn train(
    args: &Args,
    model: &Mlp,
    (train_set, val_set): (&Data, &Data),
    Shard { rank, world }: Shard,
    sync: &dyn GradSync,
    verbose: bool,
) -> Result<History> {
    let np = model.num_params();
    let mut params = model.init(args.seed);
    let mut velocity = vec![0f32; np];
    // Gradient buffer plus one slot for the loss sum, cut into buckets.
    let mut grad = vec![0f32; np + 1];
    let mut order: Vec<usize> = (0..train_set.len()).collect();
    let mut rng = Rng(args.seed.wrapping_add(1));
    let mut hist = History {
        train: Vec::new(),
        val: Vec::new(),
        params: Vec::new(),
        samples_seen: 0,
    };
    for epoch in 1..=args.epochs {
        rng.shuffle(&mut order);
        let mut loss_sum = 0f64;
        for batch in order.chunks(args.batch_size) {
            // This rank's slice of the global batch.
            let (lo, hi) = (batch.len() * rank / world, batch.len() * (rank + 1) / world);
            grad.iter_mut().for_each(|g| *g = 0.0);
            let local_loss = model.accumulate(&params, train_set, &batch[lo..hi], &mut grad[..np]);
            grad[np] = local_loss;
            hist.samples_seen += hi - lo;
            {
                // Buckets in reverse parameter order (DDP: the last layer's gradients are ready first).
                let mut buckets: Vec<&mut [f32]> = Vec::new();
                let mut rest: &mut [f32] = &mut grad;
                while !rest.is_empty() {
                    let take = rest.len().min(args.bucket_cap.max(1));
                    let (head, tail) = rest.split_at_mut(rest.len() - take);
                    buckets.push(tail);
                    rest = head;
                }
                sync.sum(&mut buckets)?;
            }
            let scale = 1.0 / batch.len() as f32;
            for ((p, v), g) in params.iter_mut().zip(velocity.iter_mut()).zip(&grad[..np]) {
                *v = args.momentum * *v + g * scale;
                *p -= args.lr * *v;
            }
            loss_sum += grad[np] as f64;
        }
        // Validation: each rank scores every world-th sample, then one all_reduce.
        let mut val = [model.sse(&params, val_set, (rank..val_set.len()).step_by(world))];
        sync.sum(&mut [&mut val[..]])?;
        let (tl, vl) = (
            (loss_sum / train_set.len() as f64) as f32,
            val[0] / val_set.len() as f32,
        );
        hist.train.push(tl);
        hist.val.push(vl);
        if verbose {
            println!("epoch {epoch:>3}  train_loss {tl:.6}  val_loss {vl:.6}");
        }
    }
    hist.params = params;
    Ok(hist)
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

fn run(args: &Args) -> Result<bool> {
    let timeout = Duration::from_secs(args.timeout);
    // Under c10drun/torchrun: env:// rendezvous. Alone: a world of one over an in-process store.
    let launched = std::env::var_os("RANK").is_some();
    let init = if launched {
        dist::InitOptions {
            backend: Some("gloo".into()),
            timeout: Some(timeout),
            ..Default::default()
        }
    } else {
        dist::InitOptions {
            backend: Some("gloo".into()),
            store: Some(Arc::new(HashStore::new())),
            rank: Some(0),
            world_size: Some(1),
            timeout: Some(timeout),
            ..Default::default()
        }
    };
    dist::init_process_group(init)?;
    let rank = dist::get_rank(None)? as usize;
    let world = dist::get_world_size(None)? as usize;
    let lead = rank == 0;

    let (train_set, val_set, quality_std) = load(args.seed);
    let model = Mlp {
        d: train_set.d,
        h: args.hidden,
    };
    let np = model.num_params();
    if lead {
        println!(
            "ddp_wine: red wine quality, {} samples x {} features (train {}, val {}), standardised",
            train_set.len() + val_set.len(),
            train_set.d,
            train_set.len(),
            val_set.len()
        );
        println!(
            "ddp_wine: {world} rank(s), MLP {}-{}-1 ({np} parameters), global batch {} (~{} per rank), {} gradient buckets, SGD lr {} momentum {}",
            model.d,
            model.h,
            args.batch_size,
            args.batch_size.div_ceil(world),
            (np + 1).div_ceil(args.bucket_cap.max(1)),
            args.lr,
            args.momentum
        );
    }
    let t0 = Instant::now();
    let hist = train(
        args,
        &model,
        (&train_set, &val_set),
        Shard { rank, world },
        &AllReduce { timeout },
        lead,
    )?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "rank {rank} trained on {} samples ({:.1} per epoch) in {secs:.2} s",
        hist.samples_seen,
        hist.samples_seen as f64 / args.epochs as f64
    );

    // Check 1: parameters identical on every rank.
    let mine = Tensor::from_vec(hist.params.clone());
    let all = Tensor::zeros(c10d_core::DType::F32, &[world * np]);
    dist::all_gather_into_tensor(&all, &mine).run()?;
    let all: Vec<f32> = all.to_vec()?;
    let differing: Vec<usize> = (0..world)
        .filter(|r| {
            all[r * np..(r + 1) * np]
                .iter()
                .zip(&hist.params)
                .any(|(a, b)| a.to_bits() != b.to_bits())
        })
        .collect();
    dist::barrier().run()?;
    dist::destroy_process_group(None)?;
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
        let reference = train(
            args,
            &model,
            (&train_set, &val_set),
            Shard { rank: 0, world: 1 },
            &Local,
            false,
        )?;
        let dp = max_abs_diff(&hist.params, &reference.params);
        let dl = max_abs_diff(&hist.train, &reference.train)
            .max(max_abs_diff(&hist.val, &reference.val));
        let good = dp <= args.tolerance && dl <= args.tolerance;
        println!(
            "check: single-process run on the full data: max |param diff| {dp:.3e}, max |loss diff| {dl:.3e} (tolerance {:.0e}) {}",
            args.tolerance,
            if good { "OK" } else { "FAILED" }
        );
        ok &= good;
    }
    Ok(ok)
}

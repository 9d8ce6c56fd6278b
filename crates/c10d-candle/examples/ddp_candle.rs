//! Data-parallel training of a candle model with c10d-rs's DDP `Reducer`: each rank computes
//! its shard's gradients with candle's `backward`, the Reducer averages them bucket by bucket
//! as they are marked ready (last layer first, as autograd produces them), and the optimiser
//! step runs in candle. At the end every rank checks that all ranks hold bit-identical
//! parameters, and rank 0 trains the same model alone on the full batch and checks that DDP
//! matched it within float tolerance. Exits non-zero otherwise.
//!
//! ```sh
//! cargo build -p c10d-candle --example ddp_candle
//! c10drun --standalone --nproc-per-node 4 target/debug/examples/ddp_candle
//! ```
//!
//! The gradients go to the Reducer as they are, candle tensors lent with
//! `c10d_candle::with_tensor` (no copy on the way to the bucket but the bucket copy itself), and
//! the averaged ones come back into fresh candle tensors the same way.
//!
//! `C10D_CANDLE_DEVICE=cuda` (c10d-candle built with its `cuda` feature) trains on
//! `cuda:LOCAL_RANK` with the same code: the parameters' first broadcast runs on the CUDA
//! tensors over NCCL, the Reducer's buckets are on the GPU, gradients are copied into them and
//! back on the GPU on candle's stream, and the buckets are averaged over NCCL.
//!
//! The model is an MLP 8-32-32-1 (tanh) on a synthetic regression set of 256 samples; the
//! global batch is the whole set, split evenly across the ranks (`WORLD_SIZE` must divide
//! 256). `C10D_STEPS` (default 60) and `C10D_LR` (default 0.05) set the schedule.

use c10d_candle as cc;
use c10d_core::Result;
use c10d_ddp::{Reducer, ReducerOptions};
use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{linear, Linear, VarBuilder, VarMap};

const SAMPLES: usize = 256;
const FEATURES: usize = 8;

/// The MLP and its parameters in a fixed order (by name: a `VarMap` is a hash map).
struct Model {
    layers: Vec<Linear>,
    params: Vec<(String, Var)>,
    dev: Device,
}

impl Model {
    fn new(dev: &Device) -> candle_core::Result<Model> {
        let vm = VarMap::new();
        let vb = VarBuilder::from_varmap(&vm, DType::F32, dev);
        let dims = [FEATURES, 32, 32, 1];
        let layers = (0..3)
            .map(|i| linear(dims[i], dims[i + 1], vb.pp(format!("l{i}"))))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut params: Vec<(String, Var)> = vm
            .data()
            .lock()
            .expect("var map")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Model {
            layers,
            params,
            dev: dev.clone(),
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.tanh()?;
            }
        }
        Ok(h)
    }

    /// All parameters, flattened in order.
    fn flat(&self) -> candle_core::Result<Vec<f32>> {
        let mut out = Vec::new();
        for (_, v) in &self.params {
            out.extend(v.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(out)
    }

    /// Sets the parameters from `flat` (as [`Model::flat`] lays them out).
    fn load(&self, flat: &[f32]) -> candle_core::Result<()> {
        let mut at = 0;
        for (_, v) in &self.params {
            let n = v.as_tensor().elem_count();
            let t = Tensor::from_slice(&flat[at..at + n], v.as_tensor().shape(), &self.dev)?;
            v.set(&t)?;
            at += n;
        }
        Ok(())
    }

    /// One SGD step with the gradients `grads` (one per parameter, in order).
    fn sgd(&self, grads: &[Tensor], lr: f32) -> candle_core::Result<()> {
        for ((_, v), g) in self.params.iter().zip(grads) {
            v.set(&(v.as_tensor() - (g * lr as f64)?)?)?;
        }
        Ok(())
    }

    /// The mean squared error on (`x`, `y`) and each parameter's gradient (contiguous).
    fn grads(&self, x: &Tensor, y: &Tensor) -> candle_core::Result<(f32, Vec<Tensor>)> {
        let loss = candle_nn::loss::mse(&self.forward(x)?, y)?;
        let gs = loss.backward()?;
        let grads = self
            .params
            .iter()
            .map(|(name, v)| {
                let g = gs
                    .get(v.as_tensor())
                    .ok_or_else(|| candle_core::Error::Msg(format!("no gradient for {name}")))?;
                g.contiguous()
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok((loss.to_scalar::<f32>()?, grads))
    }
}

/// The data set: rows `rows` of (features, target).
fn data(rows: std::ops::Range<usize>, dev: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let n = rows.len();
    let mut x = Vec::with_capacity(n * FEATURES);
    let mut y = Vec::with_capacity(n);
    for i in rows {
        let f: Vec<f32> = (0..FEATURES)
            .map(|j| ((i as f32) * 0.37 + (j as f32) * 1.3).sin())
            .collect();
        let t = f
            .iter()
            .enumerate()
            .map(|(j, v)| v * (j as f32 - 3.5) / 4.0)
            .sum::<f32>()
            + 0.1 * (i as f32).cos();
        x.extend(f);
        y.push(t);
    }
    Ok((
        Tensor::from_vec(x, (n, FEATURES), dev)?,
        Tensor::from_vec(y, (n, 1), dev)?,
    ))
}

fn env<T: std::str::FromStr>(k: &str, default: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Success when the run's checks passed; failure when they did not, or when it failed (the
/// error on stderr).
fn main() -> std::process::ExitCode {
    match run() {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ddp_candle: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool> {
    let c = cc::from_candle;
    let dev = cc::init_on_chosen_device()?;
    let w = c10d_world::World::global();
    let (rank, world) = (w.get_rank(None)? as usize, w.get_world_size(None)? as usize);
    if !SAMPLES.is_multiple_of(world) {
        return Err(c10d_core::DistError::invalid(format!(
            "ddp_candle: WORLD_SIZE {world} must divide {SAMPLES}"
        )));
    }
    let (steps, lr) = (env("C10D_STEPS", 60usize), env("C10D_LR", 0.05f32));
    let model = Model::new(&dev).map_err(c)?;
    // DDP's first step: every rank starts from rank 0's parameters.
    for (_, v) in &model.params {
        cc::broadcast(v.as_tensor(), 0).run()?;
    }
    let initial = model.flat().map_err(c)?;
    let shard = SAMPLES / world;
    let (x, y) = data(rank * shard..(rank + 1) * shard, &dev).map_err(c)?;
    // The Reducer reads the parameters' dtype, shape and device (its buckets go there).
    let metas = model
        .params
        .iter()
        .map(|(_, v)| cc::empty_like(v.as_tensor()))
        .collect::<Result<Vec<_>>>()?;
    let reducer = Reducer::new(
        &metas,
        w.world_group()?,
        ReducerOptions {
            bucket_cap_mb: Some(0.002), // ~2 KB buckets: several per step
            param_names: model.params.iter().map(|(n, _)| n.clone()).collect(),
            // The lent gradients are copied in; the averages are copied out below.
            gradient_as_bucket_view: true,
            ..Default::default()
        },
    )?;
    drop(metas);
    let mut last = 0.0;
    for step in 0..steps {
        let (loss, grads) = model.grads(&x, &y).map_err(c)?;
        let avg = reduce_grads(&reducer, &grads)?;
        model.sgd(&avg, lr).map_err(c)?;
        last = loss;
        if rank == 0 && (step % 20 == 0 || step + 1 == steps) {
            println!("ddp_candle: step {step}: rank 0's shard loss {loss:.6}");
        }
    }
    let stats = reducer.stats();
    let on = reducer.grad(0)?.device();
    println!(
        "ddp: {stats}; bucket bytes {:?} on {on}",
        stats.bucket_sizes
    );
    check(&model, &initial, (steps, lr), rank, world, last)
}

/// The Reducer's round: marks each gradient ready from the last parameter to the first (as
/// backward produces them; full buckets start their all_reduce at once), waits, and returns
/// the averaged gradients as new candle tensors on the gradients' device.
fn reduce_grads(reducer: &Reducer, grads: &[Tensor]) -> Result<Vec<Tensor>> {
    reducer.prepare_for_backward(&[])?;
    for (i, g) in grads.iter().enumerate().rev() {
        cc::with_tensor(g, |t| reducer.mark_variable_ready_with_grad(i, t))?;
    }
    reducer.finalize_backward()?;
    grads
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let avg = g.zeros_like().map_err(cc::from_candle)?;
            cc::with_tensor(&avg, |t| t.copy_from(&reducer.grad(i)?))?;
            Ok(avg)
        })
        .collect()
}

/// Every rank's parameters bit-identical (all_gather of their bits), and rank 0's equal to a
/// single process trained on the full batch from the same start (within 1e-4 relative).
fn check(
    model: &Model,
    initial: &[f32],
    (steps, lr): (usize, f32),
    rank: usize,
    world: usize,
    last_loss: f32,
) -> Result<bool> {
    let c = cc::from_candle;
    let mine = model.flat().map_err(c)?;
    let bits: Vec<u32> = mine.iter().map(|x| x.to_bits()).collect();
    let n = bits.len();
    let t = Tensor::from_vec(bits, n, &Device::Cpu).map_err(c)?;
    let all = cc::all_gather_into_tensor(&t)
        .run()?
        .to_vec1::<u32>()
        .map_err(c)?;
    let same = all.chunks(n).all(|r| r == &all[..n]);
    println!(
        "ddp_candle: rank {rank}: parameters {} on all {world} ranks (final shard loss {last_loss:.6})",
        if same { "bit-identical" } else { "DIFFER" }
    );
    if rank != 0 {
        return Ok(same);
    }
    let alone = Model::new(&model.dev).map_err(c)?;
    alone.load(initial).map_err(c)?;
    let (x, y) = data(0..SAMPLES, &model.dev).map_err(c)?;
    for _ in 0..steps {
        let (_, g) = alone.grads(&x, &y).map_err(c)?;
        alone.sgd(&g, lr).map_err(c)?;
    }
    let single = alone.flat().map_err(c)?;
    let worst = mine
        .iter()
        .zip(&single)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
        .fold(0f32, f32::max);
    let close = worst <= 1e-4;
    println!(
        "ddp_candle: {world} ranks vs one process on the full batch: max relative difference {worst:.2e} ({})",
        if close { "match" } else { "MISMATCH" }
    );
    Ok(same && close)
}

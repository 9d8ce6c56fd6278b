//! Data-parallel training that survives elastic membership changes (the `elastic` layer of
//! `cargo xtask chaos`): a linear model `y = x·w + b` trained by plain SGD on a synthetic,
//! seeded data stream, gradients reduced by the DDP [`Reducer`], the step and the parameters
//! checkpointed (by rank 0, written to a temporary file and renamed) after every step.
//!
//! ```text
//! c10drun --nnodes 1:3 --rdzv-backend c10d ... ddp_elastic --checkpoint FILE [--steps 60]
//! ddp_elastic --reference [--steps 60]     # the same training in one process, no c10d
//! ```
//!
//! Under `c10drun` a worker group may be stopped at any moment (a node joined or left) and
//! started again with another world size: rank 0 reads the checkpoint and broadcasts it, so
//! every rank resumes at the last completed step with the same parameters. Step `s` always
//! uses the same global batch of [`BATCH`] samples (cut into one slice per rank; 12 divides
//! evenly by 1, 2, 3, 4 and 6 ranks) and the Reducer's mean makes its gradient the global
//! batch's mean whatever the world size, so the final parameters equal the single-process
//! reference up to float summation order (about 1e-6). Rank 0 prints
//! `ddp_elastic: done <steps> steps params <hex bits>` at the end; `--reference` prints the
//! same line.

use c10d_core::{Result, Tensor};
use c10d_ddp::{self as ddp, Reducer, ReducerOptions};
use c10d_world as dist;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// Features per sample.
const D: usize = 6;
/// Samples per step (global batch).
const BATCH: usize = 12;

#[derive(Parser, Debug)]
#[command(about = "Elastic data-parallel training with a checkpoint per step")]
struct Args {
    /// Steps of the whole training.
    #[arg(long, default_value_t = 60)]
    steps: usize,
    /// Milliseconds each step sleeps (so that the job lasts while nodes come and go).
    #[arg(long = "step-ms", default_value_t = 50)]
    step_ms: u64,
    /// The checkpoint file (step and parameters).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Train in one process without c10d and print the final parameters.
    #[arg(long)]
    reference: bool,
    /// Collective timeout in seconds.
    #[arg(long, default_value_t = 20)]
    timeout: u64,
    /// Learning rate.
    #[arg(long, default_value_t = 0.05)]
    lr: f32,
}

/// SplitMix64 of `seed`, as a value in [-1, 1).
fn noise(seed: u64) -> f32 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Sample `i` of step `s`: features and target.
fn sample(s: usize, i: usize) -> ([f32; D], f32) {
    let mut x = [0f32; D];
    for (j, v) in x.iter_mut().enumerate() {
        *v = noise(((s * BATCH + i) * D + j) as u64);
    }
    let y: f32 = x
        .iter()
        .enumerate()
        .map(|(j, v)| v * (j as f32 - 2.5))
        .sum::<f32>()
        + 0.5
        + 0.01 * noise(u64::MAX - (s * BATCH + i) as u64);
    (x, y)
}

/// Gradient (w then b) of the mean squared error of samples `lo..hi` of step `s`, scaled by
/// `scale` (world / BATCH: the Reducer's mean over the ranks then gives the batch mean).
fn grad(params: &[f32], s: usize, (lo, hi): (usize, usize), scale: f32) -> Vec<f32> {
    let mut g = vec![0f32; D + 1];
    for i in lo..hi {
        let (x, y) = sample(s, i);
        let pred: f32 = x.iter().zip(params).map(|(a, w)| a * w).sum::<f32>() + params[D];
        let e = 2.0 * (pred - y) * scale;
        for j in 0..D {
            g[j] += e * x[j];
        }
        g[D] += e;
    }
    g
}

fn hex(params: &[f32]) -> String {
    params
        .iter()
        .map(|p| format!("{:08x}", p.to_bits()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// (step, parameters) of the checkpoint; (0, zeros) when there is none.
fn load(path: &std::path::Path) -> (usize, Vec<f32>) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return (0, vec![0f32; D + 1]);
    };
    let mut it = text.split_whitespace();
    let step = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let params: Vec<f32> = it
        .filter_map(|h| u32::from_str_radix(h, 16).ok())
        .map(f32::from_bits)
        .collect();
    assert_eq!(
        params.len(),
        D + 1,
        "checkpoint {} is damaged",
        path.display()
    );
    (step, params)
}

/// Writes the checkpoint atomically (temporary file in the same folder, renamed).
fn save(path: &std::path::Path, step: usize, params: &[f32]) {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, format!("{step} {}\n", hex(params))).expect("checkpoint written");
    std::fs::rename(&tmp, path).expect("checkpoint renamed");
}

fn reference(args: &Args) {
    let mut p = vec![0f32; D + 1];
    for s in 0..args.steps {
        let g = grad(&p, s, (0, BATCH), 1.0 / BATCH as f32);
        for (p, g) in p.iter_mut().zip(g) {
            *p -= args.lr * g;
        }
    }
    println!("ddp_elastic: done {} steps params {}", args.steps, hex(&p));
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.reference {
        reference(&args);
        return Ok(());
    }
    let ckpt = args.checkpoint.clone().expect("--checkpoint FILE");
    let timeout = Duration::from_secs(args.timeout);
    dist::init_process_group(dist::InitOptions {
        backend: Some("gloo".into()),
        timeout: Some(timeout),
        ..Default::default()
    })?;
    let rank = dist::get_rank(None)? as usize;
    let world = dist::get_world_size(None)? as usize;
    let pg = dist::World::global().world_group()?;
    // Rank 0's checkpoint for everyone: [step, w…, b].
    let (step, params) = if rank == 0 {
        load(&ckpt)
    } else {
        (0, vec![0f32; D + 1])
    };
    let mut state = vec![step as f32];
    state.extend(&params);
    let state = Tensor::from_vec(state);
    ddp::broadcast_coalesced(
        &pg,
        std::slice::from_ref(&state),
        ddp::DEFAULT_BROADCAST_BUCKET_SIZE,
        0,
        Some(timeout),
    )?;
    let state: Vec<f32> = state.to_vec()?;
    let first = state[0] as usize;
    let mut p = state[1..].to_vec();
    println!("ddp_elastic: world {world} rank {rank} resumes at step {first}");
    let tensors = vec![Tensor::from_vec(p.clone())];
    let reducer = Reducer::new(
        &tensors,
        pg,
        ReducerOptions {
            gradient_as_bucket_view: true,
            timeout: Some(timeout),
            ..Default::default()
        },
    )?;
    let (lo, hi) = (BATCH * rank / world, BATCH * (rank + 1) / world);
    for s in first..args.steps {
        let g = grad(&p, s, (lo, hi), world as f32 / BATCH as f32);
        reducer
            .grad(0)?
            .write(|b: &mut [f32]| b.copy_from_slice(&g))?;
        reducer.mark_variable_ready(0)?;
        reducer.finalize_backward()?;
        reducer.grad(0)?.read(|g: &[f32]| {
            for (p, g) in p.iter_mut().zip(g) {
                *p -= args.lr * g;
            }
        })?;
        if rank == 0 {
            save(&ckpt, s + 1, &p);
        }
        std::thread::sleep(Duration::from_millis(args.step_ms));
    }
    if rank == 0 {
        println!("ddp_elastic: done {} steps params {}", args.steps, hex(&p));
    }
    dist::barrier().run()?;
    dist::destroy_process_group(None)?;
    Ok(())
}

//! Data × tensor parallelism on a 2-D [`DeviceMesh`]: one training step after another of a
//! two-layer MLP `y = W2 · relu(W1 · x)`, with
//! - the batch split along "dp" (each dp coordinate trains on its own shard), and
//! - the layers split along "tp" as Megatron-LM splits them: W1 by rows (a column-parallel
//!   linear layer: each tp rank computes half of the hidden features), W2 by columns (a
//!   row-parallel layer: each tp rank's half gives a partial output, summed by an all_reduce
//!   along "tp");
//! - gradients averaged along "dp" (all_reduce `Avg`).
//!
//! ```text
//! c10drun --nproc-per-node 4 target/release/examples/device_mesh
//! ```
//!
//! Each rank prints `rank R: coordinate [i, j], dp group [a, b], tp group [c, d]` (global
//! ranks). At the end the shards are gathered along "tp" and rank 0 checks the full weights and
//! every step's loss against the same training in one process on the whole batch; exit status 1
//! when they differ by more than 1e-9 (float64). Any even world size works: the mesh is
//! (world / 2) × 2.

use c10d_core::{ReduceOp, Result};
use c10d_world as dist;
use dist::{DeviceMesh, GroupMember};

/// Input features, hidden features, outputs, global batch, steps, learning rate.
const D: usize = 6;
const H: usize = 8;
const O: usize = 3;
const BATCH: usize = 16;
const STEPS: usize = 5;
const LR: f64 = 0.1;

/// Deterministic values in [-1, 1) (a linear congruential generator).
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// `a (n×k) · bᵀ` where `b` is `m×k`: an `n×m` matrix.
fn matmul_t(a: &[f64], b: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut c = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            c[i * m + j] = (0..k).map(|l| a[i * k + l] * b[j * k + l]).sum();
        }
    }
    c
}

/// `aᵀ (k×n) · b (n×m)` where `a` is `n×k`: a `k×m` matrix.
fn t_matmul(a: &[f64], b: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut c = vec![0.0; k * m];
    for i in 0..n {
        for p in 0..k {
            for j in 0..m {
                c[p * m + j] += a[i * k + p] * b[i * m + j];
            }
        }
    }
    c
}

/// One layer pair's share: `w1` rows (`hs × D`) and the matching `w2` columns (`O × hs`).
struct Shard {
    hs: usize,
    w1: Vec<f64>,
    w2: Vec<f64>,
}

impl Shard {
    /// Tensor-parallel shard `j` of `parts` of the full weights.
    fn of(w1: &[f64], w2: &[f64], j: usize, parts: usize) -> Shard {
        let hs = H / parts;
        let w1 = w1[j * hs * D..(j + 1) * hs * D].to_vec();
        let w2 = (0..O)
            .flat_map(|o| w2[o * H + j * hs..o * H + (j + 1) * hs].to_vec())
            .collect();
        Shard { hs, w1, w2 }
    }

    /// Forward and backward on `b` samples; `sum_tp` sums the partial outputs over the tensor
    /// parallel ranks. Returns the loss (mean over the samples of ½‖y − t‖²) and the gradients.
    fn step(
        &self,
        x: &[f64],
        t: &[f64],
        b: usize,
        sum_tp: impl Fn(&mut [f64]) -> Result<()>,
    ) -> Result<(f64, Vec<f64>, Vec<f64>)> {
        let pre = matmul_t(x, &self.w1, b, D, self.hs);
        let h: Vec<f64> = pre.iter().map(|&v| v.max(0.0)).collect();
        let mut y = matmul_t(&h, &self.w2, b, self.hs, O);
        sum_tp(&mut y)?;
        let dy: Vec<f64> = y.iter().zip(t).map(|(y, t)| (y - t) / b as f64).collect();
        let loss = y
            .iter()
            .zip(t)
            .map(|(y, t)| 0.5 * (y - t) * (y - t))
            .sum::<f64>()
            / b as f64;
        let g2 = t_matmul(&dy, &h, b, O, self.hs);
        let w2t = transpose(&self.w2, O, self.hs);
        let dh: Vec<f64> = matmul_t(&dy, &w2t, b, O, self.hs)
            .iter()
            .zip(&pre)
            .map(|(g, p)| if *p > 0.0 { *g } else { 0.0 })
            .collect();
        let g1 = t_matmul(&dh, x, b, self.hs, D);
        Ok((loss, g1, g2))
    }

    fn apply(&mut self, g1: &[f64], g2: &[f64]) {
        self.w1.iter_mut().zip(g1).for_each(|(w, g)| *w -= LR * g);
        self.w2.iter_mut().zip(g2).for_each(|(w, g)| *w -= LR * g);
    }
}

fn transpose(a: &[f64], n: usize, m: usize) -> Vec<f64> {
    (0..m)
        .flat_map(|j| (0..n).map(move |i| a[i * m + j]))
        .collect()
}

/// The full model and data.
fn model_and_data() -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let w1 = values(1, H * D);
    let w2 = values(2, O * H);
    (w1, w2, values(3, BATCH * D), values(4, BATCH * O))
}

/// The whole training in one process: the losses and the final (W1, W2).
fn reference() -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let (w1, w2, x, t) = model_and_data();
    let mut s = Shard::of(&w1, &w2, 0, 1);
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let (loss, g1, g2) = s.step(&x, &t, BATCH, |_| Ok(()))?;
        s.apply(&g1, &g2);
        losses.push(loss);
    }
    Ok((losses, s.w1, s.w2))
}

fn ranks(g: &GroupMember) -> Result<Vec<usize>> {
    dist::get_process_group_ranks(g.group())
}

/// This rank's training; returns the losses of the global batch and the full weights.
fn train(mesh: &DeviceMesh<'_>) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let (dp, tp) = (mesh.get_group("dp")?, mesh.get_group("tp")?);
    let (i, j) = (mesh.get_local_rank("dp")?, mesh.get_local_rank("tp")?);
    let (w1, w2, x, t) = model_and_data();
    let b = BATCH / mesh.size_of("dp")?;
    let (x, t) = (
        &x[i * b * D..(i + 1) * b * D],
        &t[i * b * O..(i + 1) * b * O],
    );
    let mut s = Shard::of(&w1, &w2, j, mesh.size_of("tp")?);
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let sum_tp = |y: &mut [f64]| dist::all_reduce(y).group(&tp).run();
        let (loss, mut g1, mut g2) = s.step(x, t, b, sum_tp)?;
        dist::all_reduce(&mut g1)
            .op(ReduceOp::Avg)
            .group(&dp)
            .run()?;
        dist::all_reduce(&mut g2)
            .op(ReduceOp::Avg)
            .group(&dp)
            .run()?;
        s.apply(&g1, &g2);
        let mut l = [loss];
        dist::all_reduce(&mut l[..])
            .op(ReduceOp::Avg)
            .group(&dp)
            .run()?;
        losses.push(l[0]);
    }
    let (full1, full2) = gather(&s, &tp, mesh.size_of("tp")?)?;
    Ok((losses, full1, full2))
}

/// The full W1 and W2 from the tensor-parallel shards (all_gather along "tp").
fn gather(s: &Shard, tp: &GroupMember, parts: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut w1 = vec![0.0; H * D];
    dist::all_gather_into_tensor(&mut w1, &s.w1[..])
        .group(tp)
        .run()?;
    let mut cols = vec![0.0; O * H];
    dist::all_gather_into_tensor(&mut cols, &s.w2[..])
        .group(tp)
        .run()?;
    // cols holds each shard's O × hs block in turn; put the columns back in place
    let hs = H / parts;
    let w2 = (0..O)
        .flat_map(|o| (0..H).map(move |c| (o, c)))
        .map(|(o, c)| cols[(c / hs) * O * hs + o * hs + c % hs])
        .collect();
    Ok((w1, w2))
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn run() -> Result<bool> {
    dist::init_process_group(dist::InitOptions {
        backend: Some("gloo".into()),
        ..Default::default()
    })?;
    let (rank, world) = (
        dist::get_rank(None)? as usize,
        dist::get_world_size(None)? as usize,
    );
    if world % 2 != 0 || !BATCH.is_multiple_of(world / 2) {
        eprintln!(
            "device_mesh needs an even world size dividing {}, got {world}",
            2 * BATCH
        );
        return Ok(false);
    }
    let mesh = dist::init_device_mesh("cpu", &[world / 2, 2], Some(&["dp", "tp"]))?;
    let c = mesh.get_coordinate().unwrap_or_default();
    let (dp, tp) = (
        ranks(&mesh.get_group("dp")?)?,
        ranks(&mesh.get_group("tp")?)?,
    );
    println!("rank {rank}: coordinate {c:?}, dp group {dp:?}, tp group {tp:?}");
    let (losses, w1, w2) = train(&mesh)?;
    let (ref_losses, ref1, ref2) = reference()?;
    let diff = max_diff(&w1, &ref1)
        .max(max_diff(&w2, &ref2))
        .max(max_diff(&losses, &ref_losses));
    let ok = diff <= 1e-9;
    if rank == 0 {
        println!("losses: {losses:.6?}");
        let verdict = if ok { "OK" } else { "FAILED" };
        println!("check: {mesh} weights and losses after {STEPS} steps vs one process: max abs diff {diff:.1e} {verdict}");
    }
    dist::barrier().run()?;
    dist::destroy_process_group(None)?;
    Ok(ok)
}

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("device_mesh: {e}");
            std::process::exit(1);
        }
    }
}

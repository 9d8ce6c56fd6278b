//! Tensor-parallel linear layers on candle tensors, Megatron style, checked against one device
//! doing the whole matmul:
//! - **column-parallel**: rank r holds columns `[r·H/n, (r+1)·H/n)` of `W1` (`D × H`) and
//!   computes its part of `x·W1`; an all_gather puts the `B × H` result together on every rank;
//! - **row-parallel**: rank r holds rows `[r·H/n, (r+1)·H/n)` of `W2` (`H × O`) and the matching
//!   columns of its input; the partial products `B × O` are summed by an all_reduce;
//! - the two in a row (an MLP block `tanh(x·W1)·W2`), with no communication between them.
//!
//! Every rank builds the same full weights from a formula, keeps its shard, and compares each
//! result with the full matmul on its own device (max relative difference ≤ 1e-4; the sums run
//! in another order). Exits non-zero on a mismatch.
//!
//! ```sh
//! cargo build -p c10d-run -p c10d-candle --example tp_candle
//! target/debug/c10drun --standalone --nproc-per-node 2 target/debug/examples/tp_candle
//! # on GPUs (c10d-candle's `cuda` feature; rank r on cuda:LOCAL_RANK, collectives over NCCL):
//! C10D_CANDLE_DEVICE=cuda target/debug/c10drun --standalone --nproc-per-node 2 target/debug/examples/tp_candle
//! ```
//!
//! `C10D_TP_DIMS=B,D,H,O` sets the sizes (default `8,64,128,32`; `H` must be a multiple of the
//! world size).

use c10d_candle as cc;
use c10d_core::{DistError, ReduceOp, Result};
use candle_core::{Device, Tensor, D};

/// A `rows × cols` matrix whose element (i, j) is a fixed function of (i, j, seed).
fn matrix(rows: usize, cols: usize, seed: f32, dev: &Device) -> candle_core::Result<Tensor> {
    let v: Vec<f32> = (0..rows * cols)
        .map(|k| {
            let (i, j) = ((k / cols) as f32, (k % cols) as f32);
            (i * 0.61 + j * 1.7 + seed).sin() / (cols as f32).sqrt()
        })
        .collect();
    Tensor::from_vec(v, (rows, cols), dev)
}

/// The largest `|a - b| / max(|b|, 1)` over all elements.
fn max_rel_diff(a: &Tensor, b: &Tensor) -> candle_core::Result<f32> {
    let (a, b) = (
        a.flatten_all()?.to_vec1::<f32>()?,
        b.flatten_all()?.to_vec1::<f32>()?,
    );
    Ok(a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0f32, f32::max))
}

fn dims() -> Result<[usize; 4]> {
    let s = std::env::var("C10D_TP_DIMS").unwrap_or_else(|_| "8,64,128,32".into());
    let v: Vec<usize> = s.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    v.try_into()
        .map_err(|_| DistError::invalid(format!("tp_candle: C10D_TP_DIMS={s}: expected B,D,H,O")))
}

/// Success when the run's checks passed; failure when they did not, or when it failed (the
/// error on stderr).
fn main() -> std::process::ExitCode {
    match run() {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("tp_candle: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool> {
    let c = cc::from_candle;
    let dev = cc::init_on_chosen_device()?;
    let w = c10d_world::World::global();
    let (rank, n) = (w.get_rank(None)? as usize, w.get_world_size(None)? as usize);
    let [b, d, h, o] = dims()?;
    if !h.is_multiple_of(n) {
        return Err(DistError::invalid(format!(
            "tp_candle: H = {h} is not a multiple of the world size {n}"
        )));
    }
    let k = h / n;
    let x = matrix(b, d, 0.3, &dev).map_err(c)?;
    let (w1, w2) = (
        matrix(d, h, 1.1, &dev).map_err(c)?,
        matrix(h, o, 2.9, &dev).map_err(c)?,
    );
    let w1_r = w1
        .narrow(1, rank * k, k)
        .and_then(|t| t.contiguous())
        .map_err(c)?;
    let w2_r = w2
        .narrow(0, rank * k, k)
        .and_then(|t| t.contiguous())
        .map_err(c)?;

    // Column-parallel: (x·W1_r)ᵀ gathered along dim 0 is (x·W1)ᵀ.
    let y_r = x.matmul(&w1_r).map_err(c)?;
    let y_t =
        cc::all_gather_into_tensor(&y_r.t().and_then(|t| t.contiguous()).map_err(c)?).run()?;
    let y = y_t.t().map_err(c)?;
    let col = max_rel_diff(&y, &x.matmul(&w1).map_err(c)?).map_err(c)?;

    // Row-parallel: the input's columns of this shard times W2_r, summed over the ranks.
    let h_full = y.tanh().map_err(c)?;
    let h_r = h_full
        .narrow(D::Minus1, rank * k, k)
        .and_then(|t| t.contiguous())
        .map_err(c)?;
    let z = h_r.matmul(&w2_r).map_err(c)?;
    cc::all_reduce(&z).op(ReduceOp::Sum).run()?;
    let want_z = h_full.matmul(&w2).map_err(c)?;
    let row = max_rel_diff(&z, &want_z).map_err(c)?;

    // The MLP block: column-parallel then row-parallel, one all_reduce in all.
    let m = x
        .matmul(&w1_r)
        .and_then(|t| t.tanh())
        .and_then(|t| t.matmul(&w2_r))
        .map_err(c)?;
    cc::all_reduce(&m).op(ReduceOp::Sum).run()?;
    let mlp = max_rel_diff(&m, &want_z).map_err(c)?;

    let ok = [col, row, mlp].iter().all(|&e| e <= 1e-4);
    println!(
        "tp_candle: rank {rank} of {n} on {:?}: B={b} D={d} H={h} O={o}: max relative difference \
         column-parallel {col:.2e}, row-parallel {row:.2e}, MLP block {mlp:.2e} ({})",
        dev.location(),
        if ok { "match" } else { "MISMATCH" }
    );
    c10d_world::destroy_process_group(None)?;
    Ok(ok)
}

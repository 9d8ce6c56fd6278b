//! DDP's Reducer on CUDA parameters over NCCL (part of `gpu_world`): buckets on the GPU,
//! gradients copied in and out on the device, averaged by the bucket's all_reduce. Values
//! differ per rank, parameter, element and iteration; half the gradients are given as
//! `c10d_nccl::memory` tensors, half as views of cudarc buffers on the caller's non-blocking
//! stream (a `caller_memory::scope`), whose averaged gradients are copied back into cudarc
//! buffers and read on that stream with no other synchronisation.

use c10d_core::{DType, Device, Tensor};
use c10d_ddp::{Reducer, ReducerOptions};
use c10d_world::World;
use std::time::Duration;

/// Shapes of the parameters; odd sizes so that bucket offsets are not round.
const SHAPES: [&[usize]; 4] = [&[33, 7], &[7], &[1001, 3], &[5]];

/// Rank `rank`'s gradient of parameter `p` in iteration `iter`, element `i`.
fn grad_value(rank: usize, iter: usize, p: usize, i: usize) -> f32 {
    (rank * 7 + (i + 13 * p + 5 * iter) % 251) as f32
}

fn local(rank: usize, iter: usize, p: usize) -> Vec<f32> {
    let n: usize = SHAPES[p].iter().product();
    (0..n).map(|i| grad_value(rank, iter, p, i)).collect()
}

/// The average over `world` ranks (exact in f32: sums of small integers, halves).
fn average(world: usize, iter: usize, p: usize) -> Vec<f32> {
    let n: usize = SHAPES[p].iter().product();
    (0..n)
        .map(|i| (0..world).map(|r| grad_value(r, iter, p, i)).sum::<f32>() / world as f32)
        .collect()
}

/// Three iterations of the Reducer on `dev`'s parameters (buckets rebuilt after the first).
pub fn device_reducer(w: &World, rank: usize, dev: Device) -> Result<(), String> {
    let e = |e: c10d_core::DistError| e.to_string();
    let d = |e: c10d_nccl::cudarc::driver::DriverError| format!("{e:?}");
    let world = w.get_world_size(None).map_err(e)? as usize;
    let params = SHAPES
        .iter()
        .map(|s| c10d_nccl::memory::zeros(DType::F32, s, dev))
        .collect::<c10d_core::Result<Vec<Tensor>>>()
        .map_err(e)?;
    let opts = ReducerOptions {
        bucket_cap_mb: Some(8192.0 / (1 << 20) as f64),
        gradient_as_bucket_view: true,
        timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    let reducer = Reducer::new(&params, w.world_group().map_err(e)?, opts).map_err(e)?;
    let ctx = c10d_nccl::device::context(dev).map_err(e)?;
    let s = ctx.new_stream().map_err(d)?;
    for iter in 0..3 {
        reducer.prepare_for_backward(&[]).map_err(e)?;
        for p in (0..SHAPES.len()).rev() {
            let g = local(rank, iter, p);
            if p % 2 == 0 {
                let t = c10d_nccl::memory::from_cpu(&Tensor::from_vec(g), dev).map_err(e)?;
                reducer.mark_variable_ready_with_grad(p, &t).map_err(e)?;
            } else {
                let mut buf = s.clone_htod(&g).map_err(d)?;
                c10d_nccl::caller_memory::scope(&s, |sc| {
                    let v = sc.view_mut_shaped(&mut buf, SHAPES[p])?;
                    reducer.mark_variable_ready_with_grad(p, &v)
                })
                .map_err(e)?;
            }
        }
        reducer.finalize_backward().map_err(e)?;
        for p in 0..SHAPES.len() {
            let got = reducer.grad(p).map_err(e)?;
            if got.device() != dev {
                return Err(format!("parameter {p}'s bucket is on {}", got.device()));
            }
            let host = if p % 2 == 0 {
                got.to_vec::<f32>().map_err(e)?
            } else {
                let mut out = s.alloc_zeros::<f32>(got.numel()).map_err(d)?;
                c10d_nccl::caller_memory::scope(&s, |sc| sc.view_mut(&mut out)?.copy_from(&got))
                    .map_err(e)?;
                s.clone_dtoh(&out).map_err(d)?
            };
            let want = average(world, iter, p);
            if host != want {
                let bad = host.iter().zip(&want).position(|(a, b)| a != b);
                return Err(format!(
                    "device Reducer, iteration {iter}, parameter {p}: first wrong element {bad:?} \
                     (got {:?}, expected {:?})",
                    bad.map(|i| host[i]),
                    bad.map(|i| want[i])
                ));
            }
        }
    }
    if !reducer.stats().has_rebuilt_buckets {
        return Err("device Reducer: buckets were not rebuilt after the first iteration".into());
    }
    Ok(())
}

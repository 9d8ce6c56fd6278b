//! DDP's Reducer on CUDA parameters over NCCL (part of `gpu_world`): buckets on the GPU,
//! gradients copied in and out on the device, averaged by the bucket's all_reduce. Values
//! differ per rank, parameter, element and iteration; half the gradients are given as
//! `c10d_nccl::memory` tensors, half as views of cudarc buffers on the caller's non-blocking
//! stream (a `caller_memory::scope`), whose averaged gradients are copied back into cudarc
//! buffers and read on that stream with no other synchronisation.
//!
//! [`device_reducer_on_a_declared_stream`] runs with a stream declared for the thread (the fast
//! path: nothing waits on the host): each gradient's copy into its bucket is queued behind a
//! producer that sleeps 100 ms on that stream; gradients given as temporaries are dropped at
//! once and a block of the same size allocated (a free not ordered after the queued copy would
//! let that block be the gradient's, zeroed); one scope view, on a stream that is late too, is
//! copied into its bucket view with another stream declared than its scope's; and memory
//! written late on the declared stream is copied into a scope view and read on the scope's
//! stream.

use c10d_core::{DType, Device, Tensor};
use c10d_ddp::{Reducer, ReducerOptions};
use c10d_nccl::cudarc::driver::{result, CudaStream};
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

/// CUDA parameters of [`SHAPES`] on `dev` and a Reducer over them (8 KiB buckets, gradients
/// only in the bucket views).
fn new_reducer(w: &World, dev: Device) -> Result<(Vec<Tensor>, Reducer), String> {
    let e = |e: c10d_core::DistError| e.to_string();
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
    Ok((params, reducer))
}

/// A host function that sleeps 100 ms, queued on `s`: what follows on `s` runs late.
fn stall(s: &CudaStream) -> Result<(), String> {
    unsafe extern "C" fn sleep_100ms(_: *mut std::ffi::c_void) {
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: a live stream; the callback only sleeps and touches no CUDA state.
    unsafe {
        result::stream::launch_host_function(s.cu_stream(), sleep_100ms, std::ptr::null_mut())
    }
    .map_err(|e| format!("cuLaunchHostFunc: {e:?}"))
}

/// Checks parameter `p`'s averaged gradient `got` (read back on the thread's stream).
fn check(what: &str, got: &Tensor, world: usize, iter: usize, p: usize) -> Result<(), String> {
    let host = got.to_vec::<f32>().map_err(|e| e.to_string())?;
    let want = average(world, iter, p);
    if host != want {
        let bad = host.iter().zip(&want).position(|(a, b)| a != b);
        return Err(format!(
            "{what}, iteration {iter}, parameter {p}: first wrong element {bad:?} (got {:?}, \
             expected {:?})",
            bad.map(|i| host[i]),
            bad.map(|i| want[i])
        ));
    }
    Ok(())
}

/// Two iterations with a declared stream (see the module docs).
pub fn device_reducer_on_a_declared_stream(
    w: &World,
    rank: usize,
    dev: Device,
) -> Result<(), String> {
    let e = |e: c10d_core::DistError| e.to_string();
    let d = |e: c10d_nccl::cudarc::driver::DriverError| format!("{e:?}");
    let world = w.get_world_size(None).map_err(e)? as usize;
    let ctx = c10d_nccl::device::context(dev).map_err(e)?;
    let (declared, scope_stream) = (ctx.new_stream().map_err(d)?, ctx.new_stream().map_err(d)?);
    let _on = c10d_nccl::stream::use_stream(dev, declared.clone()).map_err(e)?;
    let (params, reducer) = new_reducer(w, dev)?;
    for iter in 0..2 {
        // Blocks allocated while the copies from dropped gradients are still queued: a free not
        // ordered after its copy would hand the gradient's block to one of them, zeroed.
        let mut spare = Vec::new();
        reducer.prepare_for_backward(&[]).map_err(e)?;
        for p in (0..SHAPES.len()).rev() {
            let host = Tensor::from_vec(local(rank, iter, p));
            let g = c10d_nccl::memory::from_cpu(&host, dev).map_err(e)?;
            stall(&declared)?;
            if p == 3 {
                // The scope's stream is late too; the copy runs there, after `declared`.
                stall(&scope_stream)?;
                let mut buf = scope_stream.clone_htod(&local(rank, iter, p)).map_err(d)?;
                c10d_nccl::caller_memory::scope(&scope_stream, |sc| {
                    let v = sc.view_mut_shaped(&mut buf, SHAPES[p])?;
                    let _other = c10d_nccl::stream::use_stream(dev, declared.clone())?;
                    reducer.grad(p)?.copy_from(&v)?;
                    reducer.mark_variable_ready(p)
                })
                .map_err(e)?;
            } else {
                reducer.mark_variable_ready_with_grad(p, &g).map_err(e)?;
                let n = g.numel();
                drop(g); // its copy into the bucket is still queued behind the stall
                spare.push(params[0].new_zeros(DType::F32, &[n]).map_err(e)?);
            }
        }
        reducer.finalize_backward().map_err(e)?;
        for p in 0..SHAPES.len() {
            let got = reducer.grad(p).map_err(e)?;
            check("declared stream", &got, world, iter, p)?;
        }
    }
    late_source_into_a_scope_view(&reducer, world, dev, &declared, &scope_stream)
}

/// A copy from memory written late on the declared stream into a view of a scope on another
/// stream, read back on the scope's stream: the scope's stream must have joined the declared one.
fn late_source_into_a_scope_view(
    reducer: &Reducer,
    world: usize,
    dev: Device,
    declared: &std::sync::Arc<CudaStream>,
    scope_stream: &std::sync::Arc<CudaStream>,
) -> Result<(), String> {
    let e = |e: c10d_core::DistError| e.to_string();
    let d = |e: c10d_nccl::cudarc::driver::DriverError| format!("{e:?}");
    let avg = reducer.grad(0).map_err(e)?;
    let late = c10d_nccl::memory::zeros(DType::F32, &[avg.numel()], dev).map_err(e)?;
    stall(declared)?;
    late.copy_from(&avg).map_err(e)?; // queued on `declared`, behind the stall
    let mut out = scope_stream.alloc_zeros::<f32>(avg.numel()).map_err(d)?;
    c10d_nccl::caller_memory::scope(scope_stream, |sc| {
        let v = sc.view_mut(&mut out)?;
        let _other = c10d_nccl::stream::use_stream(dev, declared.clone())?;
        v.copy_from(&late)
    })
    .map_err(e)?;
    let host = scope_stream.clone_dtoh(&out).map_err(d)?;
    check(
        "late source into a scope view",
        &Tensor::from_vec(host),
        world,
        1,
        0,
    )
}

/// Three iterations of the Reducer on `dev`'s parameters (buckets rebuilt after the first).
pub fn device_reducer(w: &World, rank: usize, dev: Device) -> Result<(), String> {
    let e = |e: c10d_core::DistError| e.to_string();
    let d = |e: c10d_nccl::cudarc::driver::DriverError| format!("{e:?}");
    let world = w.get_world_size(None).map_err(e)? as usize;
    let (_params, reducer) = new_reducer(w, dev)?;
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
            check("device Reducer", &Tensor::from_vec(host), world, iter, p)?;
        }
    }
    if !reducer.stats().has_rebuilt_buckets {
        return Err("device Reducer: buckets were not rebuilt after the first iteration".into());
    }
    Ok(())
}

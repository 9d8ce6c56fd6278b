//! Per-op host overhead of a world-size-1 `all_reduce` of 1 KiB … 64 MiB (f32, cuda:0):
//! c10d-nccl against a bare `ncclAllReduce` on the same kind of communicator and stream, and
//! against PyTorch's ProcessGroupNCCL (`torch_overhead.py`, run by the interpreter in
//! `C10D_TORCH_PYTHON`, else `/opt/torch/.venv/bin/python`, else `python3`), in the same run.
//!
//! Two figures per size, in µs per op: `host` is the time of the call and its `Work::wait`
//! (which only makes the caller's stream wait), with no host synchronisation in the loop;
//! `e2e` adds a device synchronisation after every op. Without a GPU it prints
//! `skipped: no GPU`.
//!
//! `cargo bench -p c10d-nccl --bench overhead [-- ITERS]` (default 2000 iterations per size).

use c10d_core::{AllreduceOptions, Backend, DType, Device, Tensor};
use c10d_nccl::{memory, stream, sys, NcclOptions, ProcessGroupNccl};
use c10d_store::HashStore;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

const DEV: Device = Device::Cuda(0);
const SIZES: [usize; 9] = [
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
];

fn sync() {
    stream::current_stream(DEV).unwrap().synchronize().unwrap();
}

/// µs per call of `f` over `iters` calls, after a warm-up; with `sync_each`, a device sync
/// follows every call.
fn per_op(iters: usize, sync_each: bool, mut f: impl FnMut()) -> f64 {
    for _ in 0..20 {
        f();
    }
    sync();
    let start = Instant::now();
    for _ in 0..iters {
        f();
        if sync_each {
            sync();
        }
    }
    let us = start.elapsed().as_secs_f64() / iters as f64 * 1e6;
    sync();
    us
}

/// A bare `ncclAllReduce` on a world-size-1 communicator of our own, on a stream of our own.
fn bare(iters: usize, t: &Tensor, sync_each: bool) -> f64 {
    let lib = c10d_nccl::nccl_library().unwrap();
    let ctx = c10d_nccl::device::context(DEV).unwrap();
    let id = c10d_nccl::result::get_unique_id(lib).unwrap();
    let cfg = c10d_nccl::NcclConfig {
        blocking: 1,
        ..Default::default()
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    let comm = c10d_nccl::comm::Communicator::init(lib, id, 1, 0, DEV, &cfg, deadline).unwrap();
    let s = ctx.new_stream().unwrap();
    let caller = stream::current_stream(DEV).unwrap();
    let ev = ctx.new_event(None).unwrap();
    let p = t.device_ptr().unwrap() as *mut std::ffi::c_void;
    let n = t.numel();
    let us = per_op(iters, sync_each, || {
        ev.record(&caller).unwrap();
        s.wait(&ev).unwrap();
        let l = comm.lock().unwrap();
        // SAFETY: `t` is live device memory of `n` f32; the communicator is locked; the stream
        // is ours on the same device.
        let args = c10d_nccl::result::Launch {
            comm: l.raw(),
            stream: s.cu_stream() as _,
            dtype: sys::ncclFloat32,
            count: n,
        };
        // SAFETY: `t` is live device memory of `n` f32; the communicator is locked; the stream
        // is ours on the same device.
        unsafe { c10d_nccl::result::all_reduce(lib, p, p, sys::ncclSum, args) }.unwrap();
        drop(l);
        ev.record(&s).unwrap();
        caller.wait(&ev).unwrap();
    });
    s.synchronize().unwrap();
    us
}

fn torch(iters: usize) -> Vec<(usize, f64, f64)> {
    let python = std::env::var("C10D_TORCH_PYTHON").ok().unwrap_or_else(|| {
        let venv = "/opt/torch/.venv/bin/python";
        if std::path::Path::new(venv).exists() {
            venv.into()
        } else {
            "python3".into()
        }
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_overhead.py");
    let script = if std::path::Path::new(script).exists() {
        script.to_string()
    } else {
        "crates/c10d-nccl/benches/torch_overhead.py".into()
    };
    let mut cmd = Command::new(&python);
    cmd.arg(&script).arg(iters.to_string());
    SIZES.iter().for_each(|s| {
        cmd.arg(s.to_string());
    });
    let out = match cmd.output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => {
            eprintln!(
                "PyTorch baseline failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            return Vec::new();
        }
        Err(e) => {
            eprintln!("PyTorch baseline not run ({python}): {e}");
            return Vec::new();
        }
    };
    out.lines()
        .filter_map(|l| {
            if l.starts_with("torch-version") {
                println!("{l}");
            }
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() != 4 || f[0] != "torch" {
                return None;
            }
            Some((f[1].parse().ok()?, f[2].parse().ok()?, f[3].parse().ok()?))
        })
        .collect()
}

fn main() {
    if c10d_nccl::cuda_device_count() == 0 {
        println!("skipped: no GPU");
        return;
    }
    let iters: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000);
    println!(
        "NCCL {} ({}), {iters} iterations per size",
        c10d_nccl::nccl_version().unwrap(),
        c10d_nccl::nccl_library().unwrap().location()
    );
    let pg =
        ProcessGroupNccl::new(Arc::new(HashStore::new()), 0, 1, NcclOptions::default()).unwrap();
    pg.bind(DEV).unwrap();
    let mut rows = Vec::new();
    for &bytes in &SIZES {
        let t = memory::zeros(DType::F32, &[bytes / 4], DEV).unwrap();
        let o = AllreduceOptions::default();
        let run = |sync_each| {
            per_op(iters, sync_each, || {
                pg.all_reduce(std::slice::from_ref(&t), &o)
                    .unwrap()
                    .wait()
                    .unwrap()
            })
        };
        let (ours_host, ours_e2e) = (run(false), run(true));
        let (bare_host, bare_e2e) = (bare(iters, &t, false), bare(iters, &t, true));
        rows.push((bytes, bare_host, ours_host, bare_e2e, ours_e2e));
    }
    let torch = torch(iters);
    println!(
        "{:>9} | {:>9} {:>9} {:>9} {:>8} {:>10} | {:>9} {:>9} {:>9}",
        "bytes",
        "bare host",
        "ours host",
        "torch host",
        "ours-bare",
        "torch/ours",
        "bare e2e",
        "ours e2e",
        "torch e2e"
    );
    for (bytes, bh, oh, be, oe) in rows {
        let (th, te) = torch
            .iter()
            .find(|r| r.0 == bytes)
            .map_or((f64::NAN, f64::NAN), |r| (r.1, r.2));
        println!("{bytes:>9} | {bh:>9.2} {oh:>9.2} {th:>10.2} {:>8.2} {:>10.2} | {be:>9.2} {oe:>9.2} {te:>9.2}", oh - bh, th / oh);
    }
}

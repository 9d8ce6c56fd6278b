//! Per-op host overhead of `all_reduce` (f32, 1 KiB … 64 MiB) at world sizes 1, 2 and 4
//! (`C10D_BENCH_WORLD_SIZES`), one process per rank, each rank on its own GPU when there are
//! enough (`cuda:rank`), else sharing GPUs with one `NCCL_HOSTID` per rank. Three contenders
//! in the same run, on the same devices:
//! - `bare`: a loop of `ncclAllReduce` on a communicator of its own and a stream of its own,
//!   ordered after the caller's stream by one event (what any correct wrapper must do at least);
//! - `ours`: `ProcessGroupNccl::all_reduce` + `Work::wait` with the caller's stream declared
//!   (`c10d_nccl::stream::use_stream`), i.e. the fast path of the ordering rule;
//! - `slice`: the same on a cudarc `CudaSlice<f32>` the caller owns, through
//!   `c10d_nccl::caller_memory::scope` on the caller's stream (what c10d-world's builders and
//!   c10d-candle's CUDA tensors do per call: a view made, the op, the scope ended);
//! - `torch`: PyTorch's `dist.all_reduce` on `"nccl"` (`torch_overhead.py`, run by the
//!   interpreter in `C10D_TORCH_PYTHON`, else `/opt/torch/.venv/bin/python`, else `python3`),
//!   rendezvousing through the same TCP store (ours, which speaks PyTorch's protocol).
//!
//! Two figures per size, in µs per op, from rank 0: `host` is the time of the call and its
//! wait (which only makes the caller's stream wait), with no host synchronisation in the loop,
//! so it is the enqueue cost (at world size > 1 it can include back-pressure from NCCL's
//! queue); `e2e` adds a device synchronisation after every op (the op's latency on the device
//! plus the host overhead). `ours-bare` is the host figure's difference: the target is under
//! 2 µs at every size. Without a GPU it prints `skipped: no GPU`.
//!
//! `cargo bench -p c10d-nccl --bench overhead [-- ITERS]` (default 1000 iterations per size,
//! fewer for large sizes: 256 MiB of traffic per loop, at least 10). Every world size is bounded
//! by `C10D_BENCH_LIMIT_S` (default 600 s); a rank that fails ends the others.

use c10d_core::{AllreduceOptions, Collectives, DType, Device, Tensor};
use c10d_nccl::{caller_memory, memory, stream, sys, NcclOptions, ProcessGroupNccl};
use c10d_store::{PrefixStore, ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// One rank's figures for one size (µs per op).
#[derive(Default, Clone, Copy)]
struct Row {
    bare_host: f64,
    ours_host: f64,
    bare_e2e: f64,
    ours_e2e: f64,
    slice_host: f64,
    slice_e2e: f64,
}

/// µs per call of `f` over `iters` calls after a warm-up; with `sync_each`, `sync` follows
/// every call. `sync` also ends the warm-up and the loop.
fn per_op(iters: usize, sync_each: bool, sync: &dyn Fn(), mut f: impl FnMut()) -> f64 {
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

/// What a rank needs: its rank, the world size, its device and the job's store.
struct Rank {
    rank: usize,
    world: usize,
    dev: Device,
    store: Arc<dyn Store>,
}

/// Iterations for a size: `iters`, fewer for large sizes (256 MiB of traffic per loop, at
/// least 10), so that world sizes over sockets finish in minutes.
fn iters_for(bytes: usize, iters: usize) -> usize {
    ((256usize << 20) / bytes).clamp(10, iters.max(10))
}

/// A blocking communicator of its own for the bare loop (unique id through the store), as
/// PyTorch's communicators are blocking.
fn bare_comm(r: &Rank) -> c10d_nccl::comm::Communicator {
    let lib = c10d_nccl::nccl_library().unwrap();
    let key = "bare/id";
    let id = if r.rank == 0 {
        let id = c10d_nccl::result::get_unique_id(lib).unwrap();
        let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
        r.store.set(key, &bytes).unwrap();
        id
    } else {
        let bytes = r.store.get(key).unwrap();
        let mut id = sys::ncclUniqueId::default();
        id.internal
            .iter_mut()
            .zip(bytes)
            .for_each(|(d, s)| *d = s as _);
        id
    };
    let cfg = c10d_nccl::NcclConfig {
        blocking: 1,
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    c10d_nccl::comm::Communicator::init(lib, id, r.world, r.rank, r.dev, &cfg, deadline).unwrap()
}

/// A bare `ncclAllReduce` loop on `comm` and a stream of its own, ordered after the caller's
/// stream by one event each way.
fn bare(
    comm: &c10d_nccl::comm::Communicator,
    r: &Rank,
    iters: usize,
    t: &Tensor,
    sync_each: bool,
    caller: &Arc<cudarc::driver::CudaStream>,
) -> f64 {
    let lib = comm.library();
    let ctx = c10d_nccl::device::context(r.dev).unwrap();
    let s = ctx.new_stream().unwrap();
    let ev = ctx.new_event(None).unwrap();
    let p = t.device_ptr().unwrap() as *mut std::ffi::c_void;
    let n = t.numel();
    let sync = || caller.synchronize().unwrap();
    per_op(iters, sync_each, &sync, || {
        ev.record(caller).unwrap();
        s.wait(&ev).unwrap();
        let l = comm.lock().unwrap();
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
    })
}

/// One rank of the Rust side: every size, ours and bare; rank 0 prints `row` lines.
fn rank_main(iters: usize) {
    let var = |k: &str| std::env::var(k).unwrap();
    let (rank, world): (usize, usize) = (
        var("RANK").parse().unwrap(),
        var("WORLD_SIZE").parse().unwrap(),
    );
    let port: u16 = var("MASTER_PORT").parse().unwrap();
    let dev = Device::Cuda(var("C10D_BENCH_DEVICE").parse().unwrap());
    let opts = TcpStoreOptions {
        timeout: Duration::from_secs(120),
        ..Default::default()
    };
    let store: Arc<dyn Store> = Arc::new(TcpStore::new("127.0.0.1", port, opts).unwrap());
    let r = Rank {
        rank,
        world,
        dev,
        store: store.clone(),
    };
    let pg = ProcessGroupNccl::new(
        Arc::new(PrefixStore::new("ours/", store)),
        rank,
        world,
        NcclOptions::default(),
    )
    .unwrap();
    pg.bind(dev).unwrap();
    let caller = c10d_nccl::device::context(dev)
        .unwrap()
        .new_stream()
        .unwrap();
    let _declared = stream::use_stream(dev, caller.clone()).unwrap();
    let comm = bare_comm(&r);
    for &bytes in &SIZES {
        let iters = iters_for(bytes, iters);
        let t = memory::zeros(DType::F32, &[bytes / 4], dev).unwrap();
        let o = AllreduceOptions::default();
        let sync = || caller.synchronize().unwrap();
        let ours = |sync_each| {
            per_op(iters, sync_each, &sync, || {
                pg.all_reduce(std::slice::from_ref(&t), &o)
                    .unwrap()
                    .wait()
                    .unwrap()
            })
        };
        let mut buf = caller.alloc_zeros::<f32>(bytes / 4).unwrap();
        let mut slice = |sync_each| {
            per_op(iters, sync_each, &sync, || {
                caller_memory::scope(&caller, |s| {
                    let v = s.view_mut(&mut buf)?;
                    pg.all_reduce(&[(*v).clone()], &o)?.wait()
                })
                .unwrap()
            })
        };
        let (slice_host, slice_e2e) = (slice(false), slice(true));
        let row = Row {
            ours_host: ours(false),
            ours_e2e: ours(true),
            bare_host: bare(&comm, &r, iters, &t, false, &caller),
            bare_e2e: bare(&comm, &r, iters, &t, true, &caller),
            slice_host,
            slice_e2e,
        };
        if rank == 0 {
            println!(
                "row {bytes} {} {} {} {} {} {}",
                row.bare_host,
                row.ours_host,
                row.bare_e2e,
                row.ours_e2e,
                row.slice_host,
                row.slice_e2e
            );
        }
    }
}

/// Where the PyTorch side's script is (from the crate, or from the repository root).
fn torch_script() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_overhead.py");
    if std::path::Path::new(script).exists() {
        return script.into();
    }
    "crates/c10d-nccl/benches/torch_overhead.py".into()
}

fn torch_python() -> String {
    std::env::var("C10D_TORCH_PYTHON").unwrap_or_else(|_| {
        let venv = "/opt/torch/.venv/bin/python";
        if std::path::Path::new(venv).exists() {
            venv.into()
        } else {
            "python3".into()
        }
    })
}

/// Runs `world` ranks of `program` (the Rust side, or PyTorch's) against one store; returns
/// rank 0's stdout.
fn run_ranks(world: usize, program: &[String]) -> Result<String, String> {
    let server = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..ServerOptions::default()
    })
    .map_err(|e| e.to_string())?;
    let gpus = c10d_nccl::cuda_device_count().max(1);
    let kids: Vec<_> = (0..world)
        .map(|r| {
            let mut cmd = Command::new(&program[0]);
            cmd.args(&program[1..])
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", server.port().to_string())
                .env("C10D_BENCH_DEVICE", (r % gpus).to_string())
                .stdout(if r == 0 {
                    Stdio::piped()
                } else {
                    Stdio::null()
                });
            if gpus < world {
                cmd.env("NCCL_HOSTID", format!("c10d-bench-{r}"))
                    .env("NCCL_SOCKET_IFNAME", "lo");
            }
            cmd.spawn().map_err(|e| format!("{}: {e}", program[0]))
        })
        .collect::<Result<_, _>>()?;
    // Every rank is ended after the time limit (`C10D_BENCH_LIMIT_S`, default 600 s), or at
    // once when another failed.
    let limit = std::env::var("C10D_BENCH_LIMIT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let pids: Vec<u32> = kids.iter().map(|k| k.id()).collect();
    let kill_all = move || {
        for p in &pids {
            let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
        }
    };
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let killer = {
        let kill_all = kill_all.clone();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(Duration::from_secs(limit))
            {
                kill_all();
            }
        })
    };
    let mut out = String::new();
    let mut failure = None;
    for (r, k) in kids.into_iter().enumerate() {
        let o = k.wait_with_output().map_err(|e| e.to_string())?;
        if r == 0 {
            out = String::from_utf8_lossy(&o.stdout).into_owned();
        }
        if !o.status.success() && failure.is_none() {
            failure = Some(format!(
                "rank {r} of {} exited with {}",
                program[0], o.status
            ));
            kill_all();
        }
    }
    drop(tx);
    let _ = killer.join();
    match failure {
        Some(f) => Err(f),
        None => Ok(out),
    }
}

/// Lines `<tag> <bytes> <figures...>` of `out` as (bytes, figures).
fn parse(out: &str, tag: &str) -> Vec<(usize, Vec<f64>)> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&tag)).then_some(())?;
            let nums = f[2..]
                .iter()
                .map(|x| x.parse().ok())
                .collect::<Option<Vec<f64>>>()?;
            Some((f.get(1)?.parse().ok()?, nums))
        })
        .collect()
}

fn report(world: usize, ours: &[(usize, Vec<f64>)], torch: &[(usize, Vec<f64>)]) {
    println!(
        "world size {world}: µs per all_reduce, rank 0 (host = call + wait, no sync; e2e = with a device sync after each op)"
    );
    println!(
        "{:>9} | {:>9} {:>9} {:>10} {:>9} | {:>9} {:>9} {:>9} | {:>10} {:>9}",
        "bytes",
        "bare host",
        "ours host",
        "torch host",
        "ours-bare",
        "bare e2e",
        "ours e2e",
        "torch e2e",
        "slice host",
        "slice e2e"
    );
    let mut worst: f64 = f64::MIN;
    for (bytes, v) in ours {
        let (th, te) = torch
            .iter()
            .find(|r| r.0 == *bytes)
            .map_or((f64::NAN, f64::NAN), |r| (r.1[0], r.1[1]));
        worst = worst.max(v[1] - v[0]);
        println!(
            "{bytes:>9} | {:>9.2} {:>9.2} {th:>10.2} {:>9.2} | {:>9.2} {:>9.2} {te:>9.2} | {:>10.2} {:>9.2}",
            v[0],
            v[1],
            v[1] - v[0],
            v[2],
            v[3],
            v[4],
            v[5]
        );
    }
    if let Some((bytes, v)) = ours.last() {
        println!(
            "world size {world}: {bytes} bytes, e2e: CudaSlice (caller memory) / c10d_nccl::memory tensor = {:.3}",
            v[5] / v[3]
        );
    }
    println!(
        "world size {world}: largest ours-bare host difference {worst:.2} µs ({} the 2 µs target)",
        if worst <= 2.0 { "within" } else { "OVER" }
    );
}

fn main() {
    let iters: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    if std::env::var_os("RANK").is_some() {
        rank_main(iters);
        return;
    }
    if c10d_nccl::cuda_device_count() == 0 {
        println!("skipped: no GPU");
        return;
    }
    let gpus = c10d_nccl::cuda_device_count();
    println!(
        "NCCL {} ({}), {gpus} GPU(s), {iters} iterations per size",
        c10d_nccl::nccl_version().unwrap(),
        c10d_nccl::nccl_library().unwrap().location()
    );
    let sizes: Vec<usize> = std::env::var("C10D_BENCH_WORLD_SIZES")
        .unwrap_or_else(|_| "1,2,4".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let exe = std::env::current_exe()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let size_args: Vec<String> = SIZES.iter().map(usize::to_string).collect();
    for world in sizes {
        let ours = match run_ranks(world, &[exe.clone(), iters.to_string()]) {
            Ok(out) => parse(&out, "row"),
            Err(e) => {
                println!("world size {world}: FAILED: {e}");
                continue;
            }
        };
        let mut py = vec![torch_python(), torch_script(), iters.to_string()];
        py.extend(size_args.iter().cloned());
        let torch = match run_ranks(world, &py) {
            Ok(out) => {
                out.lines()
                    .filter(|l| l.starts_with("torch-version"))
                    .for_each(|l| println!("{l}"));
                parse(&out, "torch")
            }
            Err(e) => {
                println!("world size {world}: PyTorch baseline not run: {e}");
                Vec::new()
            }
        };
        report(world, &ours, &torch);
    }
}

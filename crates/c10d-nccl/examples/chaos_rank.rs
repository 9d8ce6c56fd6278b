//! One rank of `cargo xtask chaos`'s `gpu` layer (on c10d-gpusim, the simulated CUDA and
//! NCCL): a 2-rank group (TCP store on 127.0.0.1:`MASTER_PORT`, rank 0 its master) with the
//! `TORCH_NCCL_ASYNC_ERROR_HANDLING` mode of the environment and a 2 s op timeout, bound to
//! device `RANK` (eager communicator init), runs `CHAOS_FAULT_OP - 1` all_reduces that must
//! work, then the faulted one (the simulator's `C10D_SIM_FAULTS` names it, or this rank aborts
//! the group from another thread `CHAOS_ABORT_MS` after launching it; `CHAOS_AFTER_ABORT=1`:
//! the peer of an aborting rank launches its op only once that rank's abort is done).
//!
//! Prints machine-readable lines, each on its own:
//! - `ready` once bound, `ok N` after each good all_reduce;
//! - `outcome: failed after MS ms: ERROR` or `outcome: completed` (the faulted op, or `bind`
//!   when the init is what fails);
//! - `memory: held` / `memory: released` right after the failure (the faulted op's tensor,
//!   dropped by this program at launch: only the backend keeps it; the simulator poisons
//!   freed memory, read here as non-finite values);
//! - `aborted: true|false` (a new op is refused as aborted);
//! - `memory: released MS ms after abort` (mode 0: after this program's own abort) or
//!   `memory: never released`;
//! - `not torn down` when the process is still running 10 s after a failure in a mode that
//!   must end it (then exit 0: the harness flags it).
//!
//! Exit status 0 when it went on to the end; 2 when an op before the fault failed.

use c10d_core::*;
use c10d_nccl::{memory, NcclEnv, NcclOptions, ProcessGroupNccl};
use c10d_store::{Store, TcpStore, TcpStoreOptions};
use cudarc::driver::sys as cusys;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn num(name: &str, default: u64) -> u64 {
    var(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn first_line(e: &DistError) -> String {
    e.message().lines().next().unwrap_or("").to_string()
}

/// Elements of the faulted op's tensor.
const N: usize = 1024;

/// Whether `[ptr, ptr + N floats)` still holds the op's data (1.0 before, 2.0 after the sum):
/// false when it reads as freed (the simulator's poison, or no live allocation there). Read on
/// a fresh non-blocking stream, so the stuck NCCL stream cannot hold the read.
fn live(dev: Device, ptr: u64) -> bool {
    let Ok(ctx) = c10d_nccl::device::context(dev) else {
        return false;
    };
    let _ = ctx.bind_to_thread();
    let Ok(s) = ctx.new_stream() else {
        return false;
    };
    let mut host = vec![0f32; N];
    // SAFETY: `host` has room for N floats and outlives the synchronised copy; a bad device
    // address is answered with an error code.
    let rc =
        unsafe { cusys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), ptr, N * 4, s.cu_stream()) };
    rc == cusys::CUresult::CUDA_SUCCESS
        && s.synchronize().is_ok()
        && host.iter().all(|v| *v == 1.0 || *v == 2.0)
}

/// Polls [`live`] until it reads freed or `limit` passed: the time it took, if freed.
fn released_within(dev: Device, ptr: u64, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !live(dev, ptr) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn main() {
    let rank = num("RANK", 0) as usize;
    let port = num("MASTER_PORT", 29500) as u16;
    let fault_op = num("CHAOS_FAULT_OP", 3).max(1);
    let abort_ms = var("CHAOS_ABORT_MS").and_then(|v| v.parse::<u64>().ok());
    let after_abort = var("CHAOS_AFTER_ABORT").is_some();
    let dev = Device::Cuda(rank as u32);
    let store = TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            is_master: rank == 0,
            world_size: Some(2),
            wait_for_workers: true,
            timeout: Duration::from_secs(60),
            ..TcpStoreOptions::default()
        },
    )
    .expect("store");
    let store: Arc<dyn Store> = Arc::new(store);
    let env = NcclEnv::from_process_env().expect("env");
    let mode = env.async_error_handling;
    let opts = NcclOptions {
        timeout: Duration::from_secs(2),
        ..NcclOptions::default()
    };
    let pg =
        Arc::new(ProcessGroupNccl::with_env(store.clone(), rank, 2, opts, env).expect("group"));
    let start = Instant::now();
    if let Err(e) = pg.bind(dev) {
        println!(
            "outcome: failed after {} ms: {}",
            start.elapsed().as_millis(),
            first_line(&e)
        );
        pg.abort();
        println!("exit: 0");
        std::process::exit(0);
    }
    println!("ready");
    let host: Vec<f32> = vec![1.0; N];
    for i in 1..fault_op {
        let t = memory::from_cpu(&Tensor::from_vec(host.clone()), dev).expect("tensor");
        let r = pg
            .all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
            .and_then(|w| w.wait_timeout(Duration::from_secs(30)))
            .and_then(|()| t.to_cpu())
            .and_then(|c| c.to_vec::<f32>());
        match r {
            Ok(v) if v.iter().all(|x| *x == 2.0) => println!("ok {i}"),
            other => {
                println!("op {i} before the fault went wrong: {other:?}");
                std::process::exit(2);
            }
        }
    }
    // Made before the faulted op, so that the pool cannot hand it the faulted op's block.
    let fresh = memory::from_cpu(&Tensor::from_vec(host.clone()), dev).expect("tensor");
    let t = memory::from_cpu(&Tensor::from_vec(host), dev).expect("tensor");
    let ptr = t.device_ptr().expect("a device tensor");
    if after_abort {
        let _ = store.wait_timeout(&["chaos/aborted"], Duration::from_secs(30));
    }
    let start = Instant::now();
    let w = pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default());
    drop(t);
    let aborter = abort_ms.map(|ms| {
        let (g, s) = (pg.clone(), store.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            g.abort();
            let _ = s.set("chaos/aborted", b"1");
        })
    });
    let r = w.and_then(|w| w.wait_timeout(Duration::from_secs(30)));
    let took = start.elapsed().as_millis();
    match &r {
        Ok(()) => println!("outcome: completed"),
        Err(e) => println!("outcome: failed after {took} ms: {}", first_line(e)),
    }
    println!(
        "memory: {}",
        if live(dev, ptr) { "held" } else { "released" }
    );
    if let Some(a) = aborter {
        let _ = a.join();
    }
    if r.is_err() && mode.should_tear_down() && abort_ms.is_none() {
        std::thread::sleep(Duration::from_secs(10));
        println!("not torn down");
        std::process::exit(0);
    }
    let probe = pg.all_reduce(std::slice::from_ref(&fresh), &AllreduceOptions::default());
    let aborted = matches!(&probe, Err(e) if e.message().contains("aborted"));
    println!("aborted: {aborted}");
    if !aborted {
        pg.abort();
    }
    match released_within(dev, ptr, Duration::from_secs(10)) {
        Some(d) => println!("memory: released {} ms after abort", d.as_millis()),
        None => println!("memory: never released"),
    }
    println!("exit: 0");
    std::process::exit(0);
}

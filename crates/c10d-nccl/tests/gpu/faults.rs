//! Failure cases: `TORCH_NCCL_BLOCKING_WAIT`, abort from another thread (during an op, during
//! an abort, during a coalesced block), the watchdog's timeout in each
//! `TORCH_NCCL_ASYNC_ERROR_HANDLING` mode (with their children, and the [`Stuck`] stream they
//! use), shutdown after a stuck peer, a dead peer, and the simulator's injected faults.

#![allow(unused_imports)]
use super::cases::*;
use super::values::*;
use c10d_core::*;
use c10d_nccl::{memory, stream, NcclEnv, NcclOptions, ProcessGroupNccl};
use c10d_store::{PrefixStore, Store, TcpStore, TcpStoreOptions};
use cudarc::driver::sys as cusys;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn blocking_wait(c: &Ctx) -> R {
    let env = NcclEnv {
        blocking_wait: true,
        ..NcclEnv::default()
    };
    let g = c.group(Duration::from_secs(60), env)?;
    let t = c.cuda(DType::F32, &vec![1.0; 1 << 20])?;
    let w = g
        .all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
        .map_err(e2s)?;
    w.wait().map_err(e2s)?;
    if !w.is_completed() {
        return Err("blocking wait returned before completion".into());
    }
    check(
        "blocking all_reduce",
        &read(&t)[..1],
        &[c.world as f64],
        DType::F32,
    )
}

pub fn abort_from_thread(c: &Ctx) -> R {
    let g = Arc::new(c.group(Duration::from_secs(600), NcclEnv::default())?);
    g.bind(dev()).map_err(e2s)?;
    let t = c.cuda(DType::F32, &[1.0])?;
    let stuck = Stuck::new()?;
    let w = g
        .all_reduce(&[t], &AllreduceOptions::default())
        .map_err(e2s)?;
    let g2 = g.clone();
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        g2.abort();
    });
    let start = Instant::now();
    let r = w.wait_timeout(Duration::from_secs(30));
    stuck.release()?;
    aborter.join().unwrap();
    match r {
        Err(e) if e.message().contains("aborted") && start.elapsed() < Duration::from_secs(10) => {}
        other => {
            return Err(format!(
                "expected an abort error within 10 s, got {other:?} after {:?}",
                start.elapsed()
            ))
        }
    }
    let t = c.cuda(DType::F32, &[1.0])?;
    match g.all_reduce(&[t], &AllreduceOptions::default()) {
        Err(e) if e.message().contains("aborted") => Ok(()),
        other => Err(format!("an aborted group accepted an op: {other:?}")),
    }
}

pub fn watchdog_timeout(c: &Ctx) -> R {
    let g = c.cleanup_group(Duration::from_secs(60))?;
    let t = c.cuda(DType::F32, &[1.0; 8])?;
    let stuck = Stuck::new()?;
    let o = AllreduceOptions {
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let w = g.all_reduce(&[t], &o).map_err(e2s)?;
    let start = Instant::now();
    let r = w.wait_timeout(Duration::from_secs(30));
    stuck.release()?;
    let msg = match r {
        Err(e) => e.message().to_string(),
        Ok(()) => return Err("a stuck all_reduce completed".into()),
    };
    let ok = msg.contains("Watchdog caught collective operation timeout")
        && msg.contains("OpType=ALLREDUCE")
        && msg.contains("NumelIn=8")
        && msg.contains("milliseconds before timing out");
    if !ok || start.elapsed() > Duration::from_secs(5) {
        return Err(format!("after {:?}: {msg}", start.elapsed()));
    }
    println!("rank {}: {msg}", c.rank);
    let t = c.cuda(DType::F32, &[1.0])?;
    match g.all_reduce(&[t], &AllreduceOptions::default()) {
        Err(e) if e.message().contains("aborted") => Ok(()),
        other => Err(format!("the timed-out group accepted an op: {other:?}")),
    }
}

/// The last rank leaves before an all_reduce: the others' op fails, with NCCL's error (at launch,
/// or through the watchdog's "caught an NCCL error") or by the op's 10 s timeout where NCCL does
/// not notice the peer (P2P/SHM on one node), and the group is aborted.
pub fn dead_peer(c: &Ctx) -> R {
    if c.world < 2 {
        return Ok(());
    }
    let g = c.cleanup_group(Duration::from_secs(600))?;
    let t = c.cuda(DType::F32, &[1.0; 1024])?;
    wait(g.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
    g.barrier(&BarrierOptions::default())
        .map_err(e2s)?
        .wait()
        .map_err(e2s)?;
    if c.rank == c.world - 1 {
        println!("case dead_peer_fails_the_survivors ok (leaving)");
        std::process::exit(0);
    }
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    // NCCL may already know the peer is gone when the op is enqueued (the launch fails), or
    // find out while it runs (the watchdog fails the work): either way an NCCL error, at once.
    // Over sockets (ranks sharing GPUs) NCCL sees the peer's connection close; over P2P/SHM
    // on one node it may not notice, and the kernel spins until the watchdog's timeout.
    let o = AllreduceOptions {
        timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    let r = g
        .all_reduce(&[t], &o)
        .and_then(|w| w.wait_timeout(Duration::from_secs(60)));
    let first = match r {
        Err(e)
            if e.message().contains("NCCL error")
                || e.message()
                    .contains("Watchdog caught collective operation timeout") =>
        {
            e.message().lines().next().unwrap_or("").to_string()
        }
        other => return Err(format!("after {:?}: {other:?}", start.elapsed())),
    };
    println!("rank {}: after {:?}: {first}", c.rank, start.elapsed());
    // Aborted by the watchdog, or failing its launch until then: never accepted.
    let t = c.cuda(DType::F32, &[1.0])?;
    match g.all_reduce(&[t], &AllreduceOptions::default()) {
        Err(e) if e.message().contains("aborted") || e.message().contains("NCCL error") => Ok(()),
        other => Err(format!("the failed group accepted another op: {other:?}")),
    }
}

/// `abort()` from another thread while this thread's coalesced block holds the NCCL group
/// open: the block's `end_coalescing` fails with the abort, closes this thread's NCCL group
/// (so another group's ops run on this thread afterwards) and the abort is then done.
pub fn abort_from_another_thread_during_a_block(c: &Ctx) -> R {
    let g = c.cleanup_group(Duration::from_secs(60))?;
    let t = c.cuda(DType::F32, &[1.0; 256])?;
    wait(g.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
    read(&t); // done on every rank before any aborts
    g.start_coalescing().map_err(e2s)?;
    let queued = g.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default());
    // Every rank has its op in the block before any rank aborts (an abort closes this rank's
    // side of the communicator, which a peer's later enqueue would see as a lost rank).
    c.agree("block queued", true)?;
    std::thread::scope(|s| s.spawn(|| g.abort()).join())
        .map_err(|_| "the aborting thread panicked".to_string())?;
    let ended = g.end_coalescing();
    if c10d_nccl::result::open_groups() != 0 {
        return Err(format!(
            "the block's NCCL group is still open on this thread after end_coalescing: {:?}",
            ended.map(|_| ())
        ));
    }
    match (queued, ended) {
        (_, Err(e)) if e.message().contains("during a coalesced block") => {}
        (q, e) => {
            return Err(format!(
                "end_coalescing after abort(): {:?} (op in the block: {:?})",
                e.map(|_| ()),
                q.map(|_| ())
            ))
        }
    }
    // The main group's ops still run on this thread.
    let u = c.cuda(DType::F32, &[c.rank as f64; 4])?;
    wait(c.pg.all_reduce(std::slice::from_ref(&u), &AllreduceOptions::default()))?;
    let want = (0..c.world).sum::<usize>() as f64;
    check(
        "all_reduce after the aborted block",
        &read(&u),
        &[want; 4],
        DType::F32,
    )
}

/// A peer that never joins an op, with `TORCH_NCCL_ASYNC_ERROR_HANDLING=0` (the work fails at
/// its timeout, nothing is aborted): `shutdown()` must not wait for the stuck kernels until
/// the group's 10-minute timeout; it aborts at once.
pub fn shutdown_after_a_stuck_peer_is_prompt(c: &Ctx) -> R {
    if c.world < 2 {
        return Ok(());
    }
    let env = NcclEnv {
        async_error_handling: c10d_nccl::ErrorHandlingMode::NoHandling,
        ..NcclEnv::default()
    };
    let g = c.group(Duration::from_secs(600), env)?;
    g.bind(dev()).map_err(e2s)?;
    let t = c.cuda(DType::F32, &[1.0; 1024])?;
    if c.rank != c.world - 1 {
        let o = AllreduceOptions {
            timeout: Some(Duration::from_secs(1)),
            ..Default::default()
        };
        let r = g
            .all_reduce(std::slice::from_ref(&t), &o)
            .and_then(|w| w.wait_timeout(Duration::from_secs(30)));
        if r.is_ok() {
            return Err("an all_reduce a peer never joined completed".into());
        }
    }
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let g = Arc::new(g);
    let h = g.clone();
    std::thread::spawn(move || {
        h.shutdown();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(()) => Ok(()),
        Err(_) => Err(format!(
            "shutdown() still waiting after {:?} (the group's timeout is 600 s)",
            start.elapsed()
        )),
    }
}

/// While `ncclCommAbort` runs on another thread (it holds the communicator for its whole run,
/// and the aborted kernels' end events may fire meanwhile), the watchdog's questions must not
/// read as "no error": the async error is the abort, and the state is not vouched for, so no
/// op of the communicator completes as a success.
pub fn async_error_during_an_abort_is_the_abort(_c: &Ctx) -> R {
    use c10d_nccl::comm::Communicator;
    let lib = c10d_nccl::nccl_library().map_err(e2s)?;
    let id = c10d_nccl::result::get_unique_id(lib).map_err(|e| e.to_string())?;
    c10d_nccl::device::context(dev()).map_err(e2s)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let comm = Arc::new(
        Communicator::init(lib, id, 1, 0, dev(), &Default::default(), deadline).map_err(e2s)?,
    );
    if comm.async_error().is_some() || !comm.state_known() {
        return Err("a fresh communicator reports an error or an unknown state".into());
    }
    let aborter = comm.clone();
    let t = std::thread::spawn(move || aborter.abort());
    // Ask while the abort runs (the simulator's takes 100 ms), once it has begun, and after it.
    let begun = Instant::now();
    while comm.state_known() && begun.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (during, known) = (comm.async_error(), comm.state_known());
    t.join()
        .map_err(|_| "the aborting thread panicked".to_string())?;
    let after = comm.async_error();
    match (during, known, after) {
        (Some(d), false, Some(a)) if d.contains("aborted") && a.contains("aborted") => Ok(()),
        other => Err(format!(
            "during/after an abort: (async error, state known, async error after) = {other:?}"
        )),
    }
}

/// The child of the simulator's fault cases (`C10D_GPU_SIMFAULT=KIND`, with `C10D_SIM_FAULTS`
/// naming the fault at its second NCCL op or its first init): a one-rank group under
/// `TORCH_NCCL_ASYNC_ERROR_HANDLING=2` (2 s timeouts) binds, runs one all_reduce that works
/// and one that meets the fault. Prints `failed: …` (exit 0) when the faulty op or init failed
/// with an error, `completed` (exit 1) when it passed as a success.
pub fn simulated_fault_child() -> ! {
    let store: Arc<dyn Store> = Arc::new(c10d_store::HashStore::new());
    let env = NcclEnv {
        async_error_handling: c10d_nccl::ErrorHandlingMode::CleanUpOnly,
        ..NcclEnv::default()
    };
    let opts = NcclOptions {
        timeout: Duration::from_secs(2),
        ..NcclOptions::default()
    };
    let pg = ProcessGroupNccl::with_env(store, 0, 1, opts, env).expect("group");
    let report = |r: c10d_core::Result<()>| -> ! {
        match r {
            Err(e) => {
                println!("failed: {}", e.message().lines().next().unwrap_or(""));
                std::process::exit(0)
            }
            Ok(()) => {
                println!("completed");
                std::process::exit(1)
            }
        }
    };
    if let Err(e) = pg.bind(dev()) {
        report(Err(e));
    }
    let t = memory::zeros(DType::F32, &[4], dev()).expect("tensor");
    let ok = pg
        .all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
        .and_then(|w| w.wait_timeout(Duration::from_secs(20)));
    if let Err(e) = ok {
        println!("the op before the fault failed: {e}");
        std::process::exit(2);
    }
    let r = pg
        .all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
        .and_then(|w| w.wait_timeout(Duration::from_secs(20)))
        .and_then(|()| t.to_vec::<f32>().map(|_| ()));
    report(r)
}

/// A user stream held by `cuStreamWaitValue32` on a flag nobody sets: ops queued after it can
/// never finish until [`Stuck::release`].
pub struct Stuck {
    flag: Tensor,
    stream: Arc<cudarc::driver::CudaStream>,
    released: bool,
}

impl Stuck {
    pub fn new() -> Result<Stuck, String> {
        let ctx = c10d_nccl::device::context(dev()).map_err(e2s)?;
        let flag = memory::zeros(DType::I32, &[1], dev()).map_err(e2s)?;
        let stream = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
        // SAFETY: the flag is live device memory of this context; the stream is ours.
        let rc = unsafe {
            cusys::cuStreamWaitValue32_v2(
                stream.cu_stream(),
                flag.device_ptr().unwrap(),
                1,
                cusys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32,
            )
        };
        if rc != cusys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuStreamWaitValue32: {rc:?}"));
        }
        stream::set_current_stream(dev(), Some(stream.clone())).map_err(e2s)?;
        Ok(Stuck {
            flag,
            stream,
            released: false,
        })
    }

    /// Writes the flag (first: whatever else fails, the stream goes on), then forgets the
    /// stream as the thread's current one and waits for it. Once.
    fn unstick(&mut self) -> R {
        if std::mem::replace(&mut self.released, true) {
            return Ok(());
        }
        let ctx = c10d_nccl::device::context(dev()).map_err(e2s)?;
        let s = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
        // SAFETY: as in `new`; writing the flag releases the waiting stream.
        let rc = unsafe {
            cusys::cuStreamWriteValue32_v2(s.cu_stream(), self.flag.device_ptr().unwrap(), 1, 0)
        };
        let reset = stream::set_current_stream(dev(), None).map_err(e2s);
        if rc != cusys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuStreamWriteValue32: {rc:?}"));
        }
        reset?;
        self.stream.synchronize().map_err(|e| format!("{e:?}"))
    }

    pub fn release(mut self) -> R {
        self.unstick()
    }
}

impl Drop for Stuck {
    /// An early return or a panic between `new` and `release` must not leave the rank's
    /// current stream stuck (every later op of the rank would hang, and the others with it).
    fn drop(&mut self) {
        let _ = self.unstick();
    }
}

/// The child of the parent's watchdog-timeout checks: a one-rank group with the
/// `TORCH_NCCL_ASYNC_ERROR_HANDLING` mode of its environment, an op stuck behind a stream that
/// never runs, a 1 s timeout. Modes 1 and 3 must end the process (returning from the wait is
/// then a failure); modes 0 and 2 must fail the work and keep the process, mode 2 aborting the
/// communicator and mode 0 leaving it alone. Prints what happened and how long it took.
pub fn teardown_child() -> ! {
    let store: Arc<dyn Store> = Arc::new(c10d_store::HashStore::new());
    let env = NcclEnv::from_process_env().expect("env");
    let mode = env.async_error_handling;
    let opts = NcclOptions {
        timeout: Duration::from_secs(60),
        ..NcclOptions::default()
    };
    let pg = ProcessGroupNccl::with_env(store, 0, 1, opts, env).expect("group");
    pg.bind(dev()).expect("bind");
    let t = memory::zeros(DType::F32, &[4], dev()).expect("tensor");
    // Made before the stream is stuck: its upload runs on the thread's current stream.
    let fresh = memory::zeros(DType::F32, &[4], dev()).expect("tensor");
    let stuck = Stuck::new().expect("stuck stream");
    let start = Instant::now();
    let one_second = AllreduceOptions {
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let w = pg
        .all_reduce(std::slice::from_ref(&t), &one_second)
        .expect("all_reduce");
    let r = w.wait_timeout(Duration::from_secs(20));
    let took = start.elapsed();
    if mode.should_tear_down() {
        println!("the process was not torn down after {took:?}: {r:?}");
        std::process::exit(3);
    }
    // A fresh tensor: the timed-out op keeps its own until its end event fires.
    let after = pg.all_reduce(std::slice::from_ref(&fresh), &one_second);
    let aborted = matches!(&after, Err(e) if e.message().contains("aborted"));
    stuck.release().expect("release");
    match r {
        Err(e)
            if e.message()
                .contains("Watchdog caught collective operation timeout") =>
        {
            println!(
                "timed out after {} ms; communicator aborted: {aborted}",
                took.as_millis()
            );
            let want_abort = mode.should_clean_up();
            std::process::exit(if aborted == want_abort { 0 } else { 4 });
        }
        other => {
            println!("expected a timeout, got {other:?} after {took:?}");
            std::process::exit(5);
        }
    }
}
